/*
 * Unit tests of the CPU reduction backend (backends/reduce/cpu).
 *
 * Every result is compared bit for bit with a reference written here
 * independently of the kernels: narrow float formats are decoded with ldexp
 * and rounded by searching a table of all their values (ties to the even
 * code), float32 arithmetic is done in double and float64 in __float128
 * (wide enough that rounding twice equals rounding once), and the NaN rules
 * of reduce.h are spelled out explicitly.  Each test runs on every ISA the
 * CPU supports; the others are skipped.
 */
#include <check.h>
#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dshim.h"
#include "reduce/reduce.h"

/* Check records the location of every passing ck_assert (a write to its
 * pipe), far too slow for per-element checks: loops use this instead. */
#define EXPECT(cond, ...)                                                      \
    do {                                                                       \
        if (!(cond)) {                                                         \
            ck_abort_msg(__VA_ARGS__);                                         \
        }                                                                      \
    } while (0)

static const char *const isa_names[] = {"scalar", "avx2", "avx512"};
#define N_ISA 3

/* The ops for `isa`, or NULL when this CPU cannot run it (then skipped). */
static const dshim_reduce_ops_t *ops_for(const char *isa)
{
    const dshim_reduce_ops_t *ops = dshim_reduce_cpu_ops(isa);
    ck_assert_ptr_nonnull(ops);
    return strcmp(ops->isa(), isa) == 0 ? ops : NULL;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint64_t d2u(double d)
{
    uint64_t u;
    memcpy(&u, &d, 8);
    return u;
}
static double u2d(uint64_t u)
{
    double d;
    memcpy(&d, &u, 8);
    return d;
}

/* ---- narrow float formats, decoded and rounded independently ------------ */

typedef struct fmt {
    int ebits, mbits, bias, nbits;
    int fn;          /* e4m3fn: no infinity, all-ones magnitude is the NaN */
    double *values;  /* values[code] for codes 0..top (positive) */
    unsigned top;    /* largest finite code, or the infinity code (non-fn) */
} fmt_t;

static fmt_t fmt_f16 = {5, 10, 15, 16, 0, NULL, 0};
static fmt_t fmt_bf16 = {8, 7, 127, 16, 0, NULL, 0};
static fmt_t fmt_e4m3 = {4, 3, 7, 8, 1, NULL, 0};
static fmt_t fmt_e5m2 = {5, 2, 15, 8, 0, NULL, 0};

static unsigned fmt_mag_mask(const fmt_t *f)
{
    return (1u << (f->nbits - 1)) - 1;
}

static int fmt_isnan(const fmt_t *f, unsigned code)
{
    unsigned mag = code & fmt_mag_mask(f);
    unsigned emax = (1u << f->ebits) - 1;
    if (f->fn) {
        return mag == fmt_mag_mask(f);
    }
    return (mag >> f->mbits) == emax && (mag & ((1u << f->mbits) - 1)) != 0;
}

static double fmt_decode(const fmt_t *f, unsigned code)
{
    unsigned mag = code & fmt_mag_mask(f);
    unsigned e = mag >> f->mbits;
    unsigned m = mag & ((1u << f->mbits) - 1);
    double sign = (code >> (f->nbits - 1)) ? -1.0 : 1.0;
    if (!f->fn && e == (1u << f->ebits) - 1) {
        return m ? NAN : sign * INFINITY;
    }
    if (e == 0) {
        return sign * ldexp((double)m, 1 - f->bias - f->mbits);
    }
    return sign * ldexp((double)((1u << f->mbits) + m), (int)e - f->bias - f->mbits);
}

static void fmt_init(fmt_t *f)
{
    if (f->values) {
        return;
    }
    unsigned emax = (1u << f->ebits) - 1;
    f->top = f->fn ? fmt_mag_mask(f) - 1 : (emax << f->mbits);
    f->values = malloc((f->top + 1) * sizeof(double));
    ck_assert_ptr_nonnull(f->values);
    for (unsigned c = 0; c <= f->top; c++) {
        f->values[c] = fmt_decode(f, c);
    }
    if (!f->fn) {
        /* the infinity code stands for the next power of two: values rounding
         * to it (ties included: its code is even) overflow */
        f->values[f->top] = ldexp(1.0, (int)emax - f->bias);
    }
}

/* Round a non-NaN double to the format: nearest, ties to the even code;
 * overflow gives infinity, or saturates for e4m3fn. */
static unsigned fmt_round(fmt_t *f, double v)
{
    fmt_init(f);
    unsigned sign = signbit(v) ? 1u << (f->nbits - 1) : 0;
    double a = fabs(v);
    if (a >= f->values[f->top]) {
        return sign | f->top;
    }
    unsigned lo = 0, hi = f->top; /* values[lo] <= a < values[hi] */
    while (hi - lo > 1) {
        unsigned mid = (lo + hi) / 2;
        if (f->values[mid] <= a) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    double dlo = a - f->values[lo], dhi = f->values[hi] - a;
    unsigned code = dlo < dhi ? lo : dhi < dlo ? hi : ((lo & 1) ? hi : lo);
    return sign | code;
}

static unsigned fmt_quiet(const fmt_t *f, unsigned code)
{
    return f->fn ? fmt_mag_mask(f) : code | (1u << (f->mbits - 1));
}

/* x86's default NaN (0xffc00000) narrowed */
static unsigned fmt_default_nan(const fmt_t *f)
{
    if (f->fn) {
        return fmt_mag_mask(f);
    }
    unsigned emax = (1u << f->ebits) - 1;
    return (1u << (f->nbits - 1)) | (emax << f->mbits) | (1u << (f->mbits - 1));
}

/* float32 result of the spec's widened arithmetic, then rounded once more */
static unsigned fmt_from_f32(fmt_t *f, float r)
{
    if (isnan(r)) {
        return fmt_default_nan(f);
    }
    if (isinf(r) && f->fn) {
        return (signbit(r) ? 0x80u : 0) | (fmt_mag_mask(f) - 1);
    }
    return fmt_round(f, (double)r);
}

static fmt_t *fmt_of(dshim_dtype_t dt)
{
    switch (dt) {
    case DSHIM_FLOAT16: return &fmt_f16;
    case DSHIM_BFLOAT16: return &fmt_bf16;
    case DSHIM_FLOAT8_E4M3: return &fmt_e4m3;
    case DSHIM_FLOAT8_E5M2: return &fmt_e5m2;
    default: return NULL;
    }
}

/* ---- hardware float16 conversion, the reference the kernels must match -- */

__attribute__((target("f16c"))) static unsigned short hw_f2h(float f)
{
    return (unsigned short)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
}

__attribute__((target("f16c"))) static float hw_h2f(unsigned short h)
{
    return _cvtsh_ss(h);
}

static int have_f16c(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("f16c");
}

/* ---- the reference reduction -------------------------------------------- */

static uint64_t load_elem(const void *buf, size_t i, size_t size)
{
    uint64_t v = 0;
    memcpy(&v, (const char *)buf + i * size, size);
    return v;
}

static void store_elem(void *buf, size_t i, size_t size, uint64_t v)
{
    memcpy((char *)buf + i * size, &v, size);
}

static int64_t sext(uint64_t v, size_t size)
{
    int shift = 64 - 8 * (int)size;
    return (int64_t)(v << shift) >> shift;
}

static uint64_t ref_int(dshim_dtype_t dt, dshim_redop_t op, uint64_t a, uint64_t b)
{
    size_t size = dshim_dtype_size(dt);
    int is_signed = dt == DSHIM_INT8 || dt == DSHIM_INT32 || dt == DSHIM_INT64;
    uint64_t mask = size == 8 ? ~0ull : (1ull << (8 * size)) - 1;
    int b_less, b_greater;
    if (is_signed) {
        b_less = sext(b, size) < sext(a, size);
        b_greater = sext(b, size) > sext(a, size);
    } else {
        b_less = b < a;
        b_greater = b > a;
    }
    switch (op) {
    case DSHIM_SUM:
    case DSHIM_AVG: return (a + b) & mask;
    case DSHIM_PROD: return (a * b) & mask;
    case DSHIM_MIN: return b_less ? b : a;
    default: return b_greater ? b : a;
    }
}

static uint64_t ref_f32(dshim_redop_t op, uint32_t ua, uint32_t ub)
{
    float a = u2f(ua), b = u2f(ub);
    if (op == DSHIM_MIN || op == DSHIM_MAX) {
        if (isnan(a)) {
            return ua;
        }
        if (isnan(b)) {
            return ub;
        }
        return (op == DSHIM_MIN ? b < a : b > a) ? ub : ua;
    }
    if (isnan(a)) {
        return ua | 0x400000u;
    }
    if (isnan(b)) {
        return ub | 0x400000u;
    }
    double r = op == DSHIM_PROD ? (double)a * (double)b : (double)a + (double)b;
    if (isnan(r)) {
        return 0xffc00000u;
    }
    return f2u((float)r);
}

static uint64_t ref_f64(dshim_redop_t op, uint64_t ua, uint64_t ub)
{
    double a = u2d(ua), b = u2d(ub);
    const uint64_t quiet = 1ull << 51;
    if (op == DSHIM_MIN || op == DSHIM_MAX) {
        if (isnan(a)) {
            return ua;
        }
        if (isnan(b)) {
            return ub;
        }
        return (op == DSHIM_MIN ? b < a : b > a) ? ub : ua;
    }
    if (isnan(a)) {
        return ua | quiet;
    }
    if (isnan(b)) {
        return ub | quiet;
    }
    /* exact (prod) or rounded once more harmlessly (113 >= 2 * 53 + 2 bits) */
    __float128 r = op == DSHIM_PROD ? (__float128)a * (__float128)b : (__float128)a + (__float128)b;
    if (r != r) {
        return 0xfff8000000000000ull; /* inf - inf, 0 * inf: x86's default NaN */
    }
    return d2u((double)r);
}

static uint64_t ref_narrow(fmt_t *f, dshim_redop_t op, unsigned a, unsigned b)
{
    double da = fmt_decode(f, a), db = fmt_decode(f, b);
    int nan_a = fmt_isnan(f, a), nan_b = fmt_isnan(f, b);
    if (op == DSHIM_MIN || op == DSHIM_MAX) {
        if (nan_a) {
            return a;
        }
        if (nan_b) {
            return b;
        }
        return (op == DSHIM_MIN ? db < da : db > da) ? b : a;
    }
    if (nan_a) {
        return fmt_quiet(f, a);
    }
    if (nan_b) {
        return fmt_quiet(f, b);
    }
    /* exact or (for bf16 sums) innocuously double-rounded in double */
    float r = (float)(op == DSHIM_PROD ? da * db : da + db);
    return fmt_from_f32(f, r);
}

static uint64_t ref_elem(dshim_dtype_t dt, dshim_redop_t op, uint64_t a, uint64_t b)
{
    switch (dt) {
    case DSHIM_FLOAT32: return ref_f32(op, (uint32_t)a, (uint32_t)b);
    case DSHIM_FLOAT64: return ref_f64(op, a, b);
    case DSHIM_FLOAT16:
    case DSHIM_BFLOAT16:
    case DSHIM_FLOAT8_E4M3:
    case DSHIM_FLOAT8_E5M2: return ref_narrow(fmt_of(dt), op, (unsigned)a, (unsigned)b);
    default: return ref_int(dt, op, a, b);
    }
}

static uint64_t ref_scale(dshim_dtype_t dt, uint64_t x, int n)
{
    size_t size = dshim_dtype_size(dt);
    uint64_t mask = size == 8 ? ~0ull : (1ull << (8 * size)) - 1;
    fmt_t *f = fmt_of(dt);
    if (n == 1) {
        return x;
    }
    switch (dt) {
    case DSHIM_INT8:
    case DSHIM_INT32:
    case DSHIM_INT64: return (uint64_t)(sext(x, size) / n) & mask;
    case DSHIM_UINT8:
    case DSHIM_UINT32:
    case DSHIM_UINT64: return x / (uint64_t)n;
    case DSHIM_FLOAT32: {
        float v = u2f((uint32_t)x);
        return isnan(v) ? (x | 0x400000u) : f2u((float)((double)v / (double)(float)n));
    }
    case DSHIM_FLOAT64: {
        double v = u2d(x);
        return isnan(v) ? (x | (1ull << 51)) : d2u((double)((__float128)v / (__float128)(double)n));
    }
    default: {
        if (fmt_isnan(f, (unsigned)x)) {
            return fmt_quiet(f, (unsigned)x);
        }
        return fmt_from_f32(f, (float)(fmt_decode(f, (unsigned)x) / (double)(float)n));
    }
    }
}

/* ---- test data ------------------------------------------------------------ */

static const uint32_t f32_specials[] = {
    0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u,
    0x7f800001u, 0x7fa5a5a5u, 0xffc12345u, 0x7f7fffffu, 0x00000001u, 0x807fffffu,
    0x3f800000u, 0xbf800000u, 0x00800000u, 0x3f800001u,
};

static const uint64_t f64_specials[] = {
    0x0ull, 0x8000000000000000ull, 0x7ff0000000000000ull, 0xfff0000000000000ull,
    0x7ff8000000000000ull, 0x7ff0000000000001ull, 0xfff8dead00000000ull, 0x7fefffffffffffffull,
    0x0000000000000001ull, 0x3ff0000000000000ull, 0xbff0000000000001ull,
};

/* Random elements: uniform bits for the narrow types and integers (every
 * code, NaNs and subnormals included); for float32/64 a mix of special
 * values, uniform bits, and moderate values whose sums really round. */
static uint64_t random_elem(dshim_dtype_t dt)
{
    uint64_t r = rng();
    unsigned pick = (unsigned)(r >> 60);
    switch (dt) {
    case DSHIM_FLOAT32:
        if (pick == 0) {
            return f32_specials[(r >> 8) % (sizeof(f32_specials) / sizeof(f32_specials[0]))];
        }
        if (pick < 4) {
            return r & 0xffffffffu;
        }
        return f2u(ldexpf((float)(int32_t)(r & 0xffffff) - 0x800000, (int)((r >> 24) % 40) - 40));
    case DSHIM_FLOAT64:
        if (pick == 0) {
            return f64_specials[(r >> 8) % (sizeof(f64_specials) / sizeof(f64_specials[0]))];
        }
        if (pick < 4) {
            return rng();
        }
        return d2u(ldexp((double)(int64_t)(r & 0xfffffffffffffull) - 0x8000000000000ll,
                         (int)((r >> 52) % 80) - 80));
    default:
        return r & (dshim_dtype_size(dt) == 8 ? ~0ull : (1ull << (8 * dshim_dtype_size(dt))) - 1);
    }
}

static void fill_random(void *buf, size_t n, dshim_dtype_t dt)
{
    for (size_t i = 0; i < n; i++) {
        store_elem(buf, i, dshim_dtype_size(dt), random_elem(dt));
    }
}

/* Compares dst against the reference of (a, b), naming the first mismatch. */
static void expect_reduced(const void *dst, const void *a, const void *b, size_t n,
                           dshim_dtype_t dt, dshim_redop_t op, const char *isa, const char *what)
{
    size_t size = dshim_dtype_size(dt);
    for (size_t i = 0; i < n; i++) {
        uint64_t ea = load_elem(a, i, size), eb = load_elem(b, i, size);
        uint64_t want = ref_elem(dt, op, ea, eb);
        uint64_t got = load_elem(dst, i, size);
        EXPECT(got == want,
                      "%s %s %s (%s) count %zu: element %zu: op(0x%llx, 0x%llx) gave 0x%llx, "
                      "want 0x%llx", isa, dshim_dtype_name(dt), dshim_redop_name(op), what, n, i,
                      (unsigned long long)ea, (unsigned long long)eb, (unsigned long long)got,
                      (unsigned long long)want);
    }
}

/* ---- conversions ------------------------------------------------------------ */

START_TEST(test_half_exhaustive)
{
    int hw = have_f16c();
    for (unsigned h = 0; h < 65536; h++) {
        float f = dshim_half_to_float((unsigned short)h);
        double want = fmt_decode(&fmt_f16, h);
        if (fmt_isnan(&fmt_f16, h)) {
            /* quiet NaN with the payload kept, as vcvtph2ps gives */
            uint32_t nan = ((h & 0x8000u) << 16) | 0x7fc00000u | ((h & 0x3ffu) << 13);
            EXPECT(f2u(f) == nan, "half 0x%04x -> 0x%08x, want 0x%08x", h, f2u(f), nan);
            EXPECT(dshim_float_to_half(f) == (h | 0x200u), "half NaN 0x%04x not kept quiet", h);
        } else {
            EXPECT((double)f == want && !signbit(f) == !signbit(want),
                          "half 0x%04x -> %a, want %a", h, (double)f, want);
            EXPECT(dshim_float_to_half(f) == h, "half 0x%04x does not round trip", h);
        }
        if (hw) {
            EXPECT(f2u(f) == f2u(hw_h2f((unsigned short)h)), "half 0x%04x: 0x%08x, f16c 0x%08x",
                          h, f2u(f), f2u(hw_h2f((unsigned short)h)));
        }
    }
}
END_TEST

/* float32 values around every rounding boundary of a format: each code's
 * value, the midpoints to the next code (exact ties) and one float ulp
 * either side of them. */
static void check_boundaries(fmt_t *f, unsigned (*conv)(float), unsigned (*hw)(float))
{
    fmt_init(f);
    for (unsigned c = 0; c < f->top; c++) {
        double mid = (f->values[c] + f->values[c + 1]) / 2;
        float probes[] = {(float)f->values[c], (float)mid, nextafterf((float)mid, 0.0f),
                          nextafterf((float)mid, INFINITY)};
        for (int p = 0; p < 4; p++) {
            for (int s = 0; s < 2; s++) {
                float x = s ? -probes[p] : probes[p];
                unsigned want = fmt_round(f, (double)x);
                unsigned got = conv(x);
                EXPECT(got == want, "%a -> 0x%x, want 0x%x", (double)x, got, want);
                if (hw) {
                    EXPECT(got == hw(x), "%a -> 0x%x, f16c 0x%x", (double)x, got, hw(x));
                }
            }
        }
    }
}

static void check_random_floats(fmt_t *f, unsigned (*conv)(float), unsigned (*hw)(float), int n)
{
    for (int i = 0; i < n; i++) {
        float x = u2f((uint32_t)rng());
        unsigned got = conv(x);
        if (hw) {
            EXPECT(got == hw(x), "0x%08x -> 0x%x, hardware 0x%x", f2u(x), got, hw(x));
        }
        if (isnan(x)) {
            continue;
        }
        unsigned want = isinf(x) && f->fn ? (signbit(x) ? 0x80u : 0) | 0x7eu : fmt_round(f, (double)x);
        EXPECT(got == want, "0x%08x (%a) -> 0x%x, want 0x%x", f2u(x), (double)x, got, want);
    }
}

static unsigned conv_f2h(float x) { return dshim_float_to_half(x); }
static unsigned conv_f2bf(float x) { return dshim_float_to_bf16(x); }
static unsigned conv_f2e4m3(float x) { return dshim_float_to_fp8e4m3(x); }
static unsigned conv_f2e5m2(float x) { return dshim_float_to_fp8e5m2(x); }
static unsigned conv_hw_f2h(float x) { return hw_f2h(x); }

START_TEST(test_half_rounding)
{
    unsigned (*hw)(float) = have_f16c() ? conv_hw_f2h : NULL;
    check_boundaries(&fmt_f16, conv_f2h, hw);
    check_random_floats(&fmt_f16, conv_f2h, hw, 300000);
    /* named cases: ties to even, overflow threshold, NaN */
    ck_assert_uint_eq(dshim_float_to_half(65504.0f), 0x7bffu);
    ck_assert_uint_eq(dshim_float_to_half(65519.996f), 0x7bffu);
    ck_assert_uint_eq(dshim_float_to_half(65520.0f), 0x7c00u);
    ck_assert_uint_eq(dshim_float_to_half(1.0f + 0x1p-11f), 0x3c00u);          /* tie -> even */
    ck_assert_uint_eq(dshim_float_to_half(1.0f + 3 * 0x1p-11f), 0x3c02u);      /* tie -> even */
    ck_assert_uint_eq(dshim_float_to_half(0x1p-25f), 0x0000u);                 /* tie -> 0 */
    ck_assert_uint_eq(dshim_float_to_half(-0x1.8p-24f), 0x8002u);              /* tie -> even */
    ck_assert_uint_eq(dshim_float_to_half(u2f(0xff800001u)), 0xfe00u);         /* sNaN quietened */
}
END_TEST

START_TEST(test_bf16)
{
    for (unsigned b = 0; b < 65536; b++) {
        float f = dshim_bf16_to_float((unsigned short)b);
        EXPECT(f2u(f) == b << 16, "bf16 0x%04x widened to 0x%08x", b, f2u(f));
        unsigned back = dshim_float_to_bf16(f);
        EXPECT(back == (fmt_isnan(&fmt_bf16, b) ? (b | 0x40u) : b), "bf16 0x%04x came back 0x%04x", b, back);
    }
    check_boundaries(&fmt_bf16, conv_f2bf, NULL);
    check_random_floats(&fmt_bf16, conv_f2bf, NULL, 300000);
    ck_assert_uint_eq(dshim_float_to_bf16(u2f(0x3f808000u)), 0x3f80u); /* tie -> even */
    ck_assert_uint_eq(dshim_float_to_bf16(u2f(0x3f818000u)), 0x3f82u); /* tie -> even */
    ck_assert_uint_eq(dshim_float_to_bf16(u2f(0x7f7fffffu)), 0x7f80u); /* overflow */
    ck_assert_uint_eq(dshim_float_to_bf16(u2f(0x7f800001u)), 0x7fc0u); /* NaN kept quiet */
    ck_assert_uint_eq(dshim_float_to_bf16(u2f(0xffffffffu)), 0xffffu);
}
END_TEST

START_TEST(test_fp8)
{
    for (unsigned v = 0; v < 256; v++) {
        float f = dshim_fp8e4m3_to_float((unsigned char)v);
        if (fmt_isnan(&fmt_e4m3, v)) {
            ck_assert(isnan(f));
            ck_assert_uint_eq(dshim_float_to_fp8e4m3(f), 0x7fu);
        } else {
            double want = fmt_decode(&fmt_e4m3, v);
            EXPECT((double)f == want && !signbit(f) == !signbit(want), "e4m3 0x%02x", v);
            ck_assert_uint_eq(dshim_float_to_fp8e4m3(f), v);
        }
        f = dshim_fp8e5m2_to_float((unsigned char)v);
        if (fmt_isnan(&fmt_e5m2, v)) {
            ck_assert(isnan(f));
            ck_assert_uint_eq(dshim_float_to_fp8e5m2(f), v | 0x02u);
        } else {
            double want = fmt_decode(&fmt_e5m2, v);
            EXPECT((double)f == want && !signbit(f) == !signbit(want), "e5m2 0x%02x", v);
            ck_assert_uint_eq(dshim_float_to_fp8e5m2(f), v);
        }
    }
    check_boundaries(&fmt_e4m3, conv_f2e4m3, NULL);
    check_random_floats(&fmt_e4m3, conv_f2e4m3, NULL, 200000);
    check_boundaries(&fmt_e5m2, conv_f2e5m2, NULL);
    check_random_floats(&fmt_e5m2, conv_f2e5m2, NULL, 200000);
    ck_assert_uint_eq(dshim_float_to_fp8e4m3(448.0f), 0x7eu);
    ck_assert_uint_eq(dshim_float_to_fp8e4m3(1000.0f), 0x7eu);     /* saturates */
    ck_assert_uint_eq(dshim_float_to_fp8e4m3(-INFINITY), 0xfeu);
    ck_assert_uint_eq(dshim_float_to_fp8e4m3(-NAN), 0x7fu);
    ck_assert_uint_eq(dshim_float_to_fp8e5m2(57344.0f), 0x7bu);
    ck_assert_uint_eq(dshim_float_to_fp8e5m2(61440.0f), 0x7cu);    /* tie -> even = inf */
    ck_assert_uint_eq(dshim_float_to_fp8e5m2(-1e30f), 0xfcu);
}
END_TEST

/* ---- kernels ------------------------------------------------------------------ */

static const size_t counts[] = {0, 1, 7, 33, 1001, 4099};
#define N_COUNTS (sizeof(counts) / sizeof(counts[0]))

/* Out of place, dst == a, dst == b and a == b, for one dtype on every ISA. */
static void check_dtype_all_ops(dshim_dtype_t dt)
{
    size_t size = dshim_dtype_size(dt);
    size_t max = counts[N_COUNTS - 1];
    char *a = malloc(max * size), *b = malloc(max * size), *d = malloc(max * size);
    char *a0 = malloc(max * size), *b0 = malloc(max * size);
    ck_assert(a && b && d && a0 && b0);
    for (int isa = 0; isa < N_ISA; isa++) {
        const dshim_reduce_ops_t *ops = ops_for(isa_names[isa]);
        if (!ops) {
            continue;
        }
        for (int op = 0; op < DSHIM_REDOP_COUNT; op++) {
            for (size_t c = 0; c < N_COUNTS; c++) {
                size_t n = counts[c];
                fill_random(a0, max, dt);
                fill_random(b0, max, dt);
                memcpy(a, a0, max * size);
                memcpy(b, b0, max * size);
                memset(d, 0x5a, max * size);
                ck_assert_int_eq(ops->reduce(d, a, b, n, dt, op, NULL), DSHIM_OK);
                expect_reduced(d, a0, b0, n, dt, op, isa_names[isa], "dst separate");
                EXPECT(memcmp(a, a0, max * size) == 0 && memcmp(b, b0, max * size) == 0,
                              "operands modified");
                /* nothing past count is touched */
                for (size_t i = n * size; i < max * size; i++) {
                    EXPECT((unsigned char)d[i] == 0x5au, "byte %zu past count %zu written", i, n);
                }
                ck_assert_int_eq(ops->reduce(a, a, b, n, dt, op, NULL), DSHIM_OK);
                expect_reduced(a, a0, b0, n, dt, op, isa_names[isa], "dst == a");
                memcpy(a, a0, max * size);
                ck_assert_int_eq(ops->reduce(b, a, b, n, dt, op, NULL), DSHIM_OK);
                expect_reduced(b, a0, b0, n, dt, op, isa_names[isa], "dst == b");
                memcpy(b, b0, max * size);
                ck_assert_int_eq(ops->reduce(d, a, a, n, dt, op, NULL), DSHIM_OK);
                expect_reduced(d, a0, a0, n, dt, op, isa_names[isa], "a == b");
                ck_assert_int_eq(ops->reduce(a, a, a, n, dt, op, NULL), DSHIM_OK);
                expect_reduced(a, a0, a0, n, dt, op, isa_names[isa], "dst == a == b");
            }
        }
    }
    free(a);
    free(b);
    free(d);
    free(a0);
    free(b0);
}

START_TEST(test_kernels_vs_reference)
{
    check_dtype_all_ops((dshim_dtype_t)_i);
}
END_TEST

/* Named float cases through every ISA, in the middle of a long vector so
 * that the vector body (not just the tail) sees them. */
static void check_pairs_f32(dshim_redop_t op, const uint32_t (*pairs)[3], size_t npairs)
{
    enum { N = 257 };
    float a[N], b[N], d[N];
    for (int isa = 0; isa < N_ISA; isa++) {
        const dshim_reduce_ops_t *ops = ops_for(isa_names[isa]);
        if (!ops) {
            continue;
        }
        for (size_t p = 0; p < npairs; p++) {
            for (int i = 0; i < N; i++) {
                a[i] = u2f(pairs[p][0]);
                b[i] = u2f(pairs[p][1]);
            }
            ck_assert_int_eq(ops->reduce(d, a, b, N, DSHIM_FLOAT32, op, NULL), DSHIM_OK);
            for (int i = 0; i < N; i++) {
                EXPECT(f2u(d[i]) == pairs[p][2], "%s %s(0x%08x, 0x%08x) = 0x%08x, want 0x%08x",
                              isa_names[isa], dshim_redop_name(op), pairs[p][0], pairs[p][1],
                              f2u(d[i]), pairs[p][2]);
            }
        }
    }
}

START_TEST(test_float_specials)
{
    static const uint32_t min_pairs[][3] = {
        {0x00000000u, 0x80000000u, 0x00000000u}, /* +0, -0: first wins */
        {0x80000000u, 0x00000000u, 0x80000000u},
        {0x7fc00001u, 0x7fc00002u, 0x7fc00001u}, /* two NaNs: the first's bits */
        {0x3f800000u, 0xffc00002u, 0xffc00002u}, /* one NaN: its bits */
        {0x7f800001u, 0x3f800000u, 0x7f800001u}, /* signalling NaN kept as is */
        {0xff800000u, 0x7f800000u, 0xff800000u},
        {0x3f800000u, 0xbf800000u, 0xbf800000u},
    };
    static const uint32_t max_pairs[][3] = {
        {0x00000000u, 0x80000000u, 0x00000000u},
        {0x80000000u, 0x00000000u, 0x80000000u},
        {0x7fc00001u, 0x7fc00002u, 0x7fc00001u},
        {0x3f800000u, 0x7fc00002u, 0x7fc00002u},
        {0xff800000u, 0x7f800000u, 0x7f800000u},
    };
    static const uint32_t sum_pairs[][3] = {
        {0x7f800000u, 0xff800000u, 0xffc00000u}, /* inf - inf: default NaN */
        {0x7fc00001u, 0x7fc00002u, 0x7fc00001u}, /* first NaN */
        {0x3f800000u, 0x7f800001u, 0x7fc00001u}, /* sNaN quietened */
        {0x7f800001u, 0xffc00003u, 0x7fc00001u},
        {0x80000000u, 0x80000000u, 0x80000000u}, /* -0 + -0 = -0 */
        {0x00000000u, 0x80000000u, 0x00000000u},
        {0x7f7fffffu, 0x7f7fffffu, 0x7f800000u}, /* overflow */
        {0x00000001u, 0x80000001u, 0x00000000u}, /* subnormals, no flush */
        {0x3f800000u, 0x33800000u, 0x3f800000u}, /* 1 + 2^-24: tie to even */
        {0x3f800001u, 0x33800000u, 0x3f800002u},
    };
    static const uint32_t prod_pairs[][3] = {
        {0x00000000u, 0x7f800000u, 0xffc00000u}, /* 0 * inf */
        {0x7fc00001u, 0x7fc00002u, 0x7fc00001u},
        {0x80000000u, 0x3f800000u, 0x80000000u},
        {0x00800000u, 0x3f000000u, 0x00400000u}, /* into subnormals, no flush */
    };
    check_pairs_f32(DSHIM_MIN, min_pairs, sizeof(min_pairs) / sizeof(min_pairs[0]));
    check_pairs_f32(DSHIM_MAX, max_pairs, sizeof(max_pairs) / sizeof(max_pairs[0]));
    check_pairs_f32(DSHIM_SUM, sum_pairs, sizeof(sum_pairs) / sizeof(sum_pairs[0]));
    check_pairs_f32(DSHIM_AVG, sum_pairs, sizeof(sum_pairs) / sizeof(sum_pairs[0]));
    check_pairs_f32(DSHIM_PROD, prod_pairs, sizeof(prod_pairs) / sizeof(prod_pairs[0]));

    /* the same rules for float16, on raw bits */
    static const uint16_t h[][4] = {
        /* a, b, min, max */
        {0x0000u, 0x8000u, 0x0000u, 0x0000u},
        {0x8000u, 0x0000u, 0x8000u, 0x8000u},
        {0x7e01u, 0x7e02u, 0x7e01u, 0x7e01u},
        {0x3c00u, 0x7d01u, 0x7d01u, 0x7d01u}, /* signalling NaN bits returned as is */
        {0xfc00u, 0x7c00u, 0xfc00u, 0x7c00u},
    };
    for (int isa = 0; isa < N_ISA; isa++) {
        const dshim_reduce_ops_t *ops = ops_for(isa_names[isa]);
        if (!ops) {
            continue;
        }
        for (size_t p = 0; p < sizeof(h) / sizeof(h[0]); p++) {
            uint16_t a[40], b[40], d[40];
            for (int i = 0; i < 40; i++) {
                a[i] = h[p][0];
                b[i] = h[p][1];
            }
            ck_assert_int_eq(ops->reduce(d, a, b, 40, DSHIM_FLOAT16, DSHIM_MIN, NULL), DSHIM_OK);
            ck_assert_uint_eq(d[39], h[p][2]);
            ck_assert_uint_eq(d[0], h[p][2]);
            ck_assert_int_eq(ops->reduce(d, a, b, 40, DSHIM_FLOAT16, DSHIM_MAX, NULL), DSHIM_OK);
            ck_assert_uint_eq(d[39], h[p][3]);
            ck_assert_uint_eq(d[0], h[p][3]);
        }
        uint16_t inf[33], ninf[33], d[33];
        for (int i = 0; i < 33; i++) {
            inf[i] = 0x7c00u;
            ninf[i] = 0xfc00u;
        }
        ck_assert_int_eq(ops->reduce(d, inf, ninf, 33, DSHIM_FLOAT16, DSHIM_SUM, NULL), DSHIM_OK);
        ck_assert_uint_eq(d[0], 0xfe00u);
        ck_assert_uint_eq(d[32], 0xfe00u);
    }
}
END_TEST

START_TEST(test_integer_wrap)
{
    for (int isa = 0; isa < N_ISA; isa++) {
        const dshim_reduce_ops_t *ops = ops_for(isa_names[isa]);
        if (!ops) {
            continue;
        }
        int8_t a8[64], b8[64], d8[64];
        int32_t a32[64], b32[64], d32[64];
        uint64_t a64[64], b64[64], d64[64];
        int64_t s64a[64], s64b[64], s64d[64];
        for (int i = 0; i < 64; i++) {
            a8[i] = 127;
            b8[i] = (int8_t)(i % 2 ? 1 : -128);
            a32[i] = INT32_MAX;
            b32[i] = 1;
            a64[i] = UINT64_MAX;
            b64[i] = 2;
            s64a[i] = INT64_MIN;
            s64b[i] = -1;
        }
        ck_assert_int_eq(ops->reduce(d8, a8, b8, 64, DSHIM_INT8, DSHIM_SUM, NULL), DSHIM_OK);
        ck_assert_int_eq(d8[1], -128);
        ck_assert_int_eq(d8[0], -1);
        ck_assert_int_eq(ops->reduce(d8, a8, b8, 64, DSHIM_INT8, DSHIM_PROD, NULL), DSHIM_OK);
        ck_assert_int_eq(d8[0], -128); /* 127 * -128 = -16256 = 0xc080 -> 0x80 */
        ck_assert_int_eq(d8[1], 127);
        ck_assert_int_eq(ops->reduce(d8, a8, b8, 64, DSHIM_INT8, DSHIM_MIN, NULL), DSHIM_OK);
        ck_assert_int_eq(d8[0], -128);
        ck_assert_int_eq(ops->reduce(d8, a8, b8, 64, DSHIM_UINT8, DSHIM_MAX, NULL), DSHIM_OK);
        ck_assert_int_eq((uint8_t)d8[0], 128);
        ck_assert_int_eq(ops->reduce(d32, a32, b32, 64, DSHIM_INT32, DSHIM_SUM, NULL), DSHIM_OK);
        ck_assert_int_eq(d32[63], INT32_MIN);
        ck_assert_int_eq(ops->reduce(d32, a32, a32, 64, DSHIM_INT32, DSHIM_PROD, NULL), DSHIM_OK);
        ck_assert_int_eq(d32[63], 1); /* (2^31-1)^2 mod 2^32 */
        ck_assert_int_eq(ops->reduce(d64, a64, b64, 64, DSHIM_UINT64, DSHIM_SUM, NULL), DSHIM_OK);
        ck_assert_uint_eq(d64[5], 1);
        ck_assert_int_eq(ops->reduce(d64, a64, b64, 64, DSHIM_UINT64, DSHIM_PROD, NULL), DSHIM_OK);
        ck_assert_uint_eq(d64[5], UINT64_MAX - 1);
        ck_assert_int_eq(ops->reduce(s64d, s64a, s64b, 64, DSHIM_INT64, DSHIM_PROD, NULL), DSHIM_OK);
        ck_assert(s64d[7] == INT64_MIN); /* -INT64_MIN wraps to itself */
        ck_assert_int_eq(ops->reduce(s64d, s64a, s64b, 64, DSHIM_INT64, DSHIM_SUM, NULL), DSHIM_OK);
        ck_assert(s64d[7] == INT64_MAX);
        ck_assert_int_eq(ops->reduce(s64d, s64a, s64b, 64, DSHIM_INT64, DSHIM_MAX, NULL), DSHIM_OK);
        ck_assert(s64d[7] == -1);
    }
}
END_TEST

START_TEST(test_scale_div)
{
    dshim_dtype_t dt = (dshim_dtype_t)_i;
    size_t size = dshim_dtype_size(dt);
    static const int divisors[] = {1, 2, 3, 7, 1000, 16777217};
    size_t max = counts[N_COUNTS - 1];
    char *buf = malloc(max * size), *orig = malloc(max * size);
    ck_assert(buf && orig);
    for (int isa = 0; isa < N_ISA; isa++) {
        const dshim_reduce_ops_t *ops = ops_for(isa_names[isa]);
        if (!ops) {
            continue;
        }
        for (size_t dv = 0; dv < sizeof(divisors) / sizeof(divisors[0]); dv++) {
            for (size_t c = 0; c < N_COUNTS; c++) {
                size_t n = counts[c];
                fill_random(orig, max, dt);
                memcpy(buf, orig, max * size);
                ck_assert_int_eq(ops->scale_div(buf, n, dt, divisors[dv], NULL), DSHIM_OK);
                for (size_t i = 0; i < max; i++) {
                    uint64_t x = load_elem(orig, i, size);
                    uint64_t want = i < n ? ref_scale(dt, x, divisors[dv]) : x;
                    uint64_t got = load_elem(buf, i, size);
                    EXPECT(got == want, "%s %s / %d count %zu: element %zu: 0x%llx -> 0x%llx, "
                                  "want 0x%llx", isa_names[isa], dshim_dtype_name(dt), divisors[dv],
                                  n, i, (unsigned long long)x, (unsigned long long)got,
                                  (unsigned long long)want);
                }
            }
        }
        /* truncating integer division, float true division */
        int32_t iv[9] = {-7, 7, -1, INT32_MIN, INT32_MAX, 0, 5, -5, 6};
        ck_assert_int_eq(ops->scale_div(iv, 9, DSHIM_INT32, 2, NULL), DSHIM_OK);
        ck_assert_int_eq(iv[0], -3);
        ck_assert_int_eq(iv[1], 3);
        ck_assert_int_eq(iv[2], 0);
        ck_assert_int_eq(iv[3], INT32_MIN / 2);
        float fv[3] = {1.0f, 3.0f, -0.0f};
        ck_assert_int_eq(ops->scale_div(fv, 3, DSHIM_FLOAT32, 3, NULL), DSHIM_OK);
        ck_assert(fv[0] == 1.0f / 3.0f && fv[1] == 1.0f && f2u(fv[2]) == 0x80000000u);
    }
    free(buf);
    free(orig);
}
END_TEST

/* Random data, many lengths and misaligned starts: every ISA the CPU runs
 * gives the scalar kernels' bits. */
START_TEST(test_isas_agree)
{
    const dshim_reduce_ops_t *ref = ops_for("scalar");
    ck_assert_ptr_nonnull(ref);
    enum { N = 20000 };
    for (int dt = 0; dt < DSHIM_DTYPE_COUNT; dt++) {
        size_t size = dshim_dtype_size(dt);
        char *a = malloc((N + 8) * size), *b = malloc((N + 8) * size);
        char *want = malloc((N + 8) * size), *got = malloc((N + 8) * size);
        ck_assert(a && b && want && got);
        fill_random(a, N + 8, dt);
        fill_random(b, N + 8, dt);
        for (int op = 0; op < DSHIM_REDOP_COUNT; op++) {
            for (int shift = 0; shift < 3; shift++) {
                size_t n = N - (size_t)shift * 37;
                char *pa = a + shift * size, *pb = b + (2 - shift) * size;
                ck_assert_int_eq(ref->reduce(want, pa, pb, n, dt, op, NULL), DSHIM_OK);
                for (int isa = 1; isa < N_ISA; isa++) {
                    const dshim_reduce_ops_t *ops = ops_for(isa_names[isa]);
                    if (!ops) {
                        continue;
                    }
                    char *pd = got + shift * size;
                    ck_assert_int_eq(ops->reduce(pd, pa, pb, n, dt, op, NULL), DSHIM_OK);
                    EXPECT(memcmp(pd, want, n * size) == 0, "%s differs from scalar: %s %s",
                                  isa_names[isa], dshim_dtype_name(dt), dshim_redop_name(op));
                }
            }
        }
        memcpy(want, a, N * size);
        ck_assert_int_eq(ref->scale_div(want, N, dt, 3, NULL), DSHIM_OK);
        for (int isa = 1; isa < N_ISA; isa++) {
            const dshim_reduce_ops_t *ops = ops_for(isa_names[isa]);
            if (!ops) {
                continue;
            }
            memcpy(got, a, N * size);
            ck_assert_int_eq(ops->scale_div(got, N, dt, 3, NULL), DSHIM_OK);
            EXPECT(memcmp(got, want, N * size) == 0, "%s scale_div differs from scalar: %s",
                          isa_names[isa], dshim_dtype_name(dt));
        }
        free(a);
        free(b);
        free(want);
        free(got);
    }
}
END_TEST

/* Operands at byte offsets that are not element-aligned (a transport ring
 * may hand those over) give the same bits as aligned ones. */
START_TEST(test_misaligned)
{
    enum { N = 3000 };
    for (int isa = 0; isa < N_ISA; isa++) {
        const dshim_reduce_ops_t *ops = ops_for(isa_names[isa]);
        if (!ops) {
            continue;
        }
        for (int dt = 0; dt < DSHIM_DTYPE_COUNT; dt++) {
            size_t size = dshim_dtype_size(dt);
            if (size == 1) {
                continue;
            }
            char *a0 = malloc(N * size), *b0 = malloc(N * size);
            char *ra = malloc(N * size + 8), *rb = malloc(N * size + 8), *rd = malloc(N * size + 8);
            ck_assert(a0 && b0 && ra && rb && rd);
            fill_random(a0, N, dt);
            fill_random(b0, N, dt);
            for (int op = 0; op < DSHIM_REDOP_COUNT; op++) {
                char *pa = ra + 1, *pb = rb + 3, *pd = rd + 1;
                memcpy(pa, a0, N * size);
                memcpy(pb, b0, N * size);
                ck_assert_int_eq(ops->reduce(pd, pa, pb, N, dt, op, NULL), DSHIM_OK);
                expect_reduced(pd, a0, b0, N, dt, op, isa_names[isa], "misaligned");
                ck_assert_int_eq(ops->reduce(pa, pa, pb, N, dt, op, NULL), DSHIM_OK);
                expect_reduced(pa, a0, b0, N, dt, op, isa_names[isa], "misaligned, dst == a");
            }
            char *pa = ra + 1;
            memcpy(pa, a0, N * size);
            ck_assert_int_eq(ops->scale_div(pa, N, dt, 3, NULL), DSHIM_OK);
            for (size_t i = 0; i < N; i++) {
                uint64_t x = load_elem(a0, i, size), got = load_elem(pa, i, size);
                EXPECT(got == ref_scale(dt, x, 3), "%s %s misaligned scale_div element %zu",
                       isa_names[isa], dshim_dtype_name(dt), i);
            }
            free(a0);
            free(b0);
            free(ra);
            free(rb);
            free(rd);
        }
    }
}
END_TEST

/* A caller's flush-to-zero / rounding mode must not change the bits, and
 * the caller's MXCSR is restored. */
START_TEST(test_fp_environment)
{
    enum { N = 100 };
    float a[N], d[N];
    for (int i = 0; i < N; i++) {
        a[i] = u2f(0x00000003u + (uint32_t)i); /* subnormals */
    }
    unsigned int saved = _mm_getcsr();
    unsigned int odd = (saved & ~0x6000u) | 0x8040u | 0x4000u; /* FTZ, DAZ, round up */
    _mm_setcsr(odd);
    unsigned int took = _mm_getcsr();
    _mm_setcsr(saved);
    if ((took & ~0x3fu) != (odd & ~0x3fu)) {
        return; /* an emulator (valgrind) that keeps MXCSR at its default */
    }
    for (int isa = 0; isa < N_ISA; isa++) {
        const dshim_reduce_ops_t *ops = ops_for(isa_names[isa]);
        if (!ops) {
            continue;
        }
        _mm_setcsr(odd);
        dshim_status_t st = ops->reduce(d, a, a, N, DSHIM_FLOAT32, DSHIM_SUM, NULL);
        unsigned int after = _mm_getcsr();
        _mm_setcsr(saved);
        ck_assert_int_eq(st, DSHIM_OK);
        ck_assert_uint_eq(after & ~0x3fu, odd & ~0x3fu);
        for (int i = 0; i < N; i++) {
            EXPECT(f2u(d[i]) == 2 * (0x00000003u + (uint32_t)i), "%s: subnormal sum flushed",
                   isa_names[isa]);
        }
        uint16_t h[N], hd[N];
        for (int i = 0; i < N; i++) {
            h[i] = (uint16_t)(0x3c00u + i);
        }
        _mm_setcsr(odd);
        st = ops->scale_div(memcpy(hd, h, sizeof(h)), N, DSHIM_FLOAT16, 3, NULL);
        _mm_setcsr(saved);
        ck_assert_int_eq(st, DSHIM_OK);
        for (int i = 0; i < N; i++) {
            EXPECT(hd[i] == ref_scale(DSHIM_FLOAT16, h[i], 3), "%s: half 0x%04x / 3 = 0x%04x",
                   isa_names[isa], h[i], hd[i]);
        }
    }
}
END_TEST

START_TEST(test_arguments)
{
    const dshim_reduce_ops_t *ops = dshim_reduce_cpu_ops("auto");
    ck_assert_ptr_nonnull(ops);
    ck_assert_str_eq(ops->name, "cpu");
    ck_assert_ptr_nonnull(dshim_reduce_cpu_ops(NULL));
    ck_assert_ptr_nonnull(dshim_reduce_cpu_ops("no-such-isa"));
    ck_assert_str_eq(dshim_reduce_cpu_ops("SCALAR")->isa(), "scalar");
    /* auto picks the best the CPU runs */
    const char *best = ops_for("avx512") ? "avx512" : ops_for("avx2") ? "avx2" : "scalar";
    ck_assert_str_eq(ops->isa(), best);

    ck_assert(ops->supports(DSHIM_MEM_HOST, DSHIM_FLOAT16, DSHIM_AVG));
    ck_assert(!ops->supports(DSHIM_MEM_CUDA, DSHIM_FLOAT32, DSHIM_SUM));
    ck_assert(!ops->supports(DSHIM_MEM_HOST, DSHIM_DTYPE_COUNT, DSHIM_SUM));
    ck_assert(!ops->supports(DSHIM_MEM_HOST, DSHIM_FLOAT32, DSHIM_REDOP_COUNT));

    float buf[16] = {0};
    int stream;
    ck_assert_int_eq(ops->reduce(NULL, NULL, NULL, 0, DSHIM_FLOAT32, DSHIM_SUM, NULL), DSHIM_OK);
    ck_assert_int_eq(ops->reduce(buf, buf, buf, 4, (dshim_dtype_t)99, DSHIM_SUM, NULL), DSHIM_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(dshim_last_error(), "dtype"));
    ck_assert_int_eq(ops->reduce(buf, buf, buf, 4, DSHIM_FLOAT32, (dshim_redop_t)-1, NULL), DSHIM_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(dshim_last_error(), "op"));
    ck_assert_int_eq(ops->reduce(buf, buf, buf, 4, DSHIM_FLOAT32, DSHIM_SUM, &stream), DSHIM_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(dshim_last_error(), "stream"));
    ck_assert_int_eq(ops->reduce(buf, NULL, buf, 4, DSHIM_FLOAT32, DSHIM_SUM, NULL), DSHIM_ERR_INVALID);
    ck_assert_int_eq(ops->reduce(buf, buf, buf, SIZE_MAX / 2, DSHIM_FLOAT32, DSHIM_SUM, NULL), DSHIM_ERR_INVALID);
    ck_assert_int_eq(ops->reduce(buf + 1, buf, buf + 8, 4, DSHIM_FLOAT32, DSHIM_SUM, NULL), DSHIM_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(dshim_last_error(), "overlap"));
    ck_assert_int_eq(ops->reduce(buf + 8, buf, buf + 4, 4, DSHIM_FLOAT32, DSHIM_SUM, NULL), DSHIM_OK);

    ck_assert_int_eq(ops->scale_div(buf, 4, DSHIM_FLOAT32, 0, NULL), DSHIM_ERR_INVALID);
    ck_assert_int_eq(ops->scale_div(buf, 4, DSHIM_FLOAT32, -2, NULL), DSHIM_ERR_INVALID);
    ck_assert_int_eq(ops->scale_div(buf, 4, (dshim_dtype_t)-1, 2, NULL), DSHIM_ERR_INVALID);
    ck_assert_int_eq(ops->scale_div(buf, 4, DSHIM_FLOAT32, 2, &stream), DSHIM_ERR_UNSUPPORTED);
    ck_assert_int_eq(ops->scale_div(NULL, 4, DSHIM_FLOAT32, 2, NULL), DSHIM_ERR_INVALID);
    ck_assert_int_eq(ops->scale_div(NULL, 0, DSHIM_FLOAT32, 2, NULL), DSHIM_OK);
    /* dividing by 1 leaves the bits alone, signalling NaNs included */
    uint32_t snan[3] = {0x7f800001u, 0xff800123u, 0x3f800001u};
    ck_assert_int_eq(ops->scale_div(snan, 3, DSHIM_FLOAT32, 1, NULL), DSHIM_OK);
    ck_assert_uint_eq(snan[0], 0x7f800001u);
    ck_assert_uint_eq(snan[1], 0xff800123u);
}
END_TEST

static Suite *reduce_suite(void)
{
    Suite *s = suite_create("reduce");
    TCase *tc = tcase_create("conversions");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_half_exhaustive);
    tcase_add_test(tc, test_half_rounding);
    tcase_add_test(tc, test_bf16);
    tcase_add_test(tc, test_fp8);
    suite_add_tcase(s, tc);

    tc = tcase_create("kernels");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_kernels_vs_reference, 0, DSHIM_DTYPE_COUNT);
    tcase_add_test(tc, test_float_specials);
    tcase_add_test(tc, test_integer_wrap);
    tcase_add_loop_test(tc, test_scale_div, 0, DSHIM_DTYPE_COUNT);
    tcase_add_test(tc, test_isas_agree);
    tcase_add_test(tc, test_misaligned);
    tcase_add_test(tc, test_fp_environment);
    tcase_add_test(tc, test_arguments);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    for (int i = 0; i < N_ISA; i++) {
        const dshim_reduce_ops_t *ops = dshim_reduce_cpu_ops(isa_names[i]);
        printf("check_reduce: isa %s %s\n", isa_names[i],
               strcmp(ops->isa(), isa_names[i]) == 0 ? "tested" : "skipped (cpu lacks it)");
    }
    SRunner *sr = srunner_create(reduce_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

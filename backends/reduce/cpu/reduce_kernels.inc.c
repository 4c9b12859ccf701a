/*
 * The CPU reduction kernels, written once and compiled once per ISA: each
 * reduce_kernels_<isa>.c defines DSHIM_RK_ISA and includes this file, and the
 * build gives it that ISA's -m flags.  The loops are plain C the compiler
 * vectorises; intrinsics appear only for float16 conversion (F16C/AVX-512),
 * which has a single instruction there and none in baseline x86-64.
 *
 * Every element is computed on its own with exact integer operations or
 * single IEEE operations in the default rounding mode, and nothing is
 * reassociated or contracted (the build uses -ffp-contract=off and the code
 * has no a*b+c), so any vector width gives the same bits as the scalar loop.
 */
#ifndef DSHIM_RK_ISA
#error "define DSHIM_RK_ISA (scalar, avx2 or avx512) before including reduce_kernels.inc.c"
#endif

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "reduce_kernels.h"

#if defined(__AVX512F__) || defined(__F16C__)
#include <immintrin.h>
#endif

#define RK_CAT2(a, b) a##b
#define RK_CAT(a, b) RK_CAT2(a, b)
#define RK_STR2(x) #x
#define RK_STR(x) RK_STR2(x)
#define RK_TABLE RK_CAT(dshim_reduce_kernels_, DSHIM_RK_ISA)

/* ---- element operations ------------------------------------------------ */

/*
 * Float sum/prod.  With one NaN operand x86 returns that NaN, quietened,
 * whatever the operand order; with two it returns the first operand's, and
 * the compiler may swap the operands of a commutative operation, differently
 * in differently vectorised copies of a loop.  Returning a's NaN explicitly
 * pins the result: a's NaN, else b's NaN, else a op b, all quiet.  The choice
 * is made with integer masks: a ternary would let the compiler move `a op b`
 * into a branch, and under -ftrapping-math a loop with a conditional float
 * operation is not vectorised.
 */
static inline float rk_pick_nan_f32(float r, float a)
{
    return dshim_rk_u2f(dshim_rk_sel(a != a, dshim_rk_f2u(a) | 0x400000u, dshim_rk_f2u(r)));
}

static inline uint64_t rk_d2u(double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof(u));
    return u;
}

static inline double rk_pick_nan_f64(double r, double a)
{
    uint64_t m = (uint64_t)0 - (uint64_t)(a != a);
    uint64_t ur = rk_d2u(r);
    ur ^= (ur ^ (rk_d2u(a) | ((uint64_t)1 << 51))) & m; /* xor form: see dshim_rk_sel */
    memcpy(&r, &ur, sizeof(r));
    return r;
}

#define RK_FLOAT_ARITH(sfx, T)                                                 \
    static inline T rk_sum_##sfx(T a, T b)                                     \
    {                                                                          \
        return rk_pick_nan_##sfx(a + b, a);                                 \
    }                                                                          \
    static inline T rk_prod_##sfx(T a, T b)                                    \
    {                                                                          \
        return rk_pick_nan_##sfx(a * b, a);                                 \
    }                                                                          \
    /* NaN-propagating; b replaces a only when strictly better or when b is   \
     * the only NaN, so ties (+0 vs -0) and double NaNs keep a's bits. */     \
    static inline T rk_min_##sfx(T a, T b)                                     \
    {                                                                          \
        return (b < a || (b != b && a == a)) ? b : a;                          \
    }                                                                          \
    static inline T rk_max_##sfx(T a, T b)                                     \
    {                                                                          \
        return (b > a || (b != b && a == a)) ? b : a;                          \
    }
RK_FLOAT_ARITH(f32, float)
RK_FLOAT_ARITH(f64, double)

/*
 * Min/max of the narrow float types straight on their bits: magnitude with
 * the sign applied is an integer that orders like the value (+0 and -0 both
 * map to 0), so the original operand, NaN payload included, is returned
 * without a round trip through float32.  NaN iff magnitude > nan_above.
 */
#define RK_NARROW_MINMAX(sfx, T, ST, mag_mask, nan_above)                      \
    static inline ST rk_key_##sfx(T v)                                         \
    {                                                                          \
        ST m = (ST)(v & (mag_mask));                                           \
        return (v & ~(mag_mask)) ? (ST)-m : m;                                 \
    }                                                                          \
    static inline T rk_min_##sfx(T a, T b)                                     \
    {                                                                          \
        int nan_a = (a & (mag_mask)) > (nan_above);                            \
        int nan_b = (b & (mag_mask)) > (nan_above);                            \
        return (!nan_a && (nan_b || rk_key_##sfx(b) < rk_key_##sfx(a))) ? b : a; \
    }                                                                          \
    static inline T rk_max_##sfx(T a, T b)                                     \
    {                                                                          \
        int nan_a = (a & (mag_mask)) > (nan_above);                            \
        int nan_b = (b & (mag_mask)) > (nan_above);                            \
        return (!nan_a && (nan_b || rk_key_##sfx(b) > rk_key_##sfx(a))) ? b : a; \
    }
RK_NARROW_MINMAX(f16, uint16_t, int16_t, 0x7fffu, 0x7c00u)
RK_NARROW_MINMAX(bf16, uint16_t, int16_t, 0x7fffu, 0x7f80u)
RK_NARROW_MINMAX(e4m3, uint8_t, int8_t, 0x7fu, 0x7eu)
RK_NARROW_MINMAX(e5m2, uint8_t, int8_t, 0x7fu, 0x7cu)

/* Integers: sum and product wrap in the unsigned type (the low bits of a
 * two's complement sum/product do not depend on signedness, so signed types
 * share these kernels); min/max compare in the element's own type. */
#define RK_UINT_ARITH(sfx, UT)                                                 \
    static inline UT rk_sum_##sfx(UT a, UT b)                                  \
    {                                                                          \
        return (UT)((UT)a + (UT)b);                                            \
    }                                                                          \
    static inline UT rk_prod_##sfx(UT a, UT b)                                 \
    {                                                                          \
        return (UT)((UT)a * (UT)b);                                            \
    }
RK_UINT_ARITH(u8, uint8_t)
RK_UINT_ARITH(u32, uint32_t)
RK_UINT_ARITH(u64, uint64_t)

#define RK_INT_MINMAX(sfx, T)                                                  \
    static inline T rk_min_##sfx(T a, T b)                                     \
    {                                                                          \
        return b < a ? b : a;                                                  \
    }                                                                          \
    static inline T rk_max_##sfx(T a, T b)                                     \
    {                                                                          \
        return b > a ? b : a;                                                  \
    }
RK_INT_MINMAX(i8, int8_t)
RK_INT_MINMAX(u8, uint8_t)
RK_INT_MINMAX(i32, int32_t)
RK_INT_MINMAX(u32, uint32_t)
RK_INT_MINMAX(i64, int64_t)
RK_INT_MINMAX(u64, uint64_t)

/* ---- element-wise loops ------------------------------------------------ */

/*
 * dst may be exactly a or b: element i is read before it is written and no
 * element depends on another, so there is no loop-carried dependence; ivdep
 * tells the vectoriser so instead of making it test for overlap at run time.
 */
#define RK_BINARY(fname, T, elem)                                              \
    static void fname(void *dst_, const void *a_, const void *b_, size_t n)    \
    {                                                                          \
        T *dst = dst_;                                                         \
        const T *a = a_;                                                       \
        const T *b = b_;                                                       \
        _Pragma("GCC ivdep") for (size_t i = 0; i < n; i++)                    \
        {                                                                      \
            dst[i] = elem(a[i], b[i]);                                         \
        }                                                                      \
    }

RK_BINARY(rk_u8_sum, uint8_t, rk_sum_u8)
RK_BINARY(rk_u8_prod, uint8_t, rk_prod_u8)
RK_BINARY(rk_i8_min, int8_t, rk_min_i8)
RK_BINARY(rk_i8_max, int8_t, rk_max_i8)
RK_BINARY(rk_u8_min, uint8_t, rk_min_u8)
RK_BINARY(rk_u8_max, uint8_t, rk_max_u8)
RK_BINARY(rk_u32_sum, uint32_t, rk_sum_u32)
RK_BINARY(rk_u32_prod, uint32_t, rk_prod_u32)
RK_BINARY(rk_i32_min, int32_t, rk_min_i32)
RK_BINARY(rk_i32_max, int32_t, rk_max_i32)
RK_BINARY(rk_u32_min, uint32_t, rk_min_u32)
RK_BINARY(rk_u32_max, uint32_t, rk_max_u32)
RK_BINARY(rk_u64_sum, uint64_t, rk_sum_u64)
RK_BINARY(rk_u64_prod, uint64_t, rk_prod_u64)
RK_BINARY(rk_i64_min, int64_t, rk_min_i64)
RK_BINARY(rk_i64_max, int64_t, rk_max_i64)
RK_BINARY(rk_u64_min, uint64_t, rk_min_u64)
RK_BINARY(rk_u64_max, uint64_t, rk_max_u64)
RK_BINARY(rk_f32_sum, float, rk_sum_f32)
RK_BINARY(rk_f32_prod, float, rk_prod_f32)
RK_BINARY(rk_f32_min, float, rk_min_f32)
RK_BINARY(rk_f32_max, float, rk_max_f32)
RK_BINARY(rk_f64_sum, double, rk_sum_f64)
RK_BINARY(rk_f64_prod, double, rk_prod_f64)
RK_BINARY(rk_f64_min, double, rk_min_f64)
RK_BINARY(rk_f64_max, double, rk_max_f64)
RK_BINARY(rk_f16_min, uint16_t, rk_min_f16)
RK_BINARY(rk_f16_max, uint16_t, rk_max_f16)
RK_BINARY(rk_bf16_min, uint16_t, rk_min_bf16)
RK_BINARY(rk_bf16_max, uint16_t, rk_max_bf16)
RK_BINARY(rk_e4m3_min, uint8_t, rk_min_e4m3)
RK_BINARY(rk_e4m3_max, uint8_t, rk_max_e4m3)
RK_BINARY(rk_e5m2_min, uint8_t, rk_min_e5m2)
RK_BINARY(rk_e5m2_max, uint8_t, rk_max_e5m2)

/* ---- narrow float types: widen, combine in float32, round once ---------- */

/* One pass per element; the conversions are inline integer code (plus exact
 * or correctly rounded float32 steps) that the loop vectoriser handles. */
#define RK_FUSED(fname, T, widen, narrow, elem)                                \
    static void fname(void *dst_, const void *a_, const void *b_, size_t n)    \
    {                                                                          \
        T *dst = dst_;                                                         \
        const T *a = a_;                                                       \
        const T *b = b_;                                                       \
        _Pragma("GCC ivdep") for (size_t i = 0; i < n; i++)                    \
        {                                                                      \
            dst[i] = narrow(elem(widen(a[i]), widen(b[i])));                   \
        }                                                                      \
    }

/* True division by the divisor converted to the arithmetic type (float32 for
 * every narrow float type): correctly rounded, so width independent. */
#define RK_FUSED_SCALE(fname, T, widen, narrow)                                \
    static void fname(void *buf_, size_t n, int divisor)                       \
    {                                                                          \
        T *buf = buf_;                                                         \
        const float d = (float)divisor;                                        \
        for (size_t i = 0; i < n; i++) {                                       \
            buf[i] = narrow(widen(buf[i]) / d);                                \
        }                                                                      \
    }

/*
 * bfloat16 results are rounded without the NaN test of dshim_rk_float_to_bf16:
 * a NaN here came from bfloat16 operands (or is x86's default NaN), so its
 * low 16 bits are zero, rounding cannot carry out of it, and its quiet bit
 * is already set (by the hardware or by rk_pick_nan) -- the same bits the
 * full conversion gives, for a quarter fewer instructions per element.
 */
static inline uint16_t rk_bf16_round(float f)
{
    uint32_t x = dshim_rk_f2u(f);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

RK_FUSED(rk_bf16_sum, uint16_t, dshim_rk_bf16_to_float, rk_bf16_round, rk_sum_f32)
RK_FUSED(rk_bf16_prod, uint16_t, dshim_rk_bf16_to_float, rk_bf16_round, rk_prod_f32)
RK_FUSED(rk_e4m3_sum, uint8_t, dshim_rk_e4m3_to_float, dshim_rk_float_to_e4m3, rk_sum_f32)
RK_FUSED(rk_e4m3_prod, uint8_t, dshim_rk_e4m3_to_float, dshim_rk_float_to_e4m3, rk_prod_f32)
RK_FUSED(rk_e5m2_sum, uint8_t, dshim_rk_e5m2_to_float, dshim_rk_float_to_e5m2, rk_sum_f32)
RK_FUSED(rk_e5m2_prod, uint8_t, dshim_rk_e5m2_to_float, dshim_rk_float_to_e5m2, rk_prod_f32)
RK_FUSED_SCALE(rk_bf16_scale, uint16_t, dshim_rk_bf16_to_float, rk_bf16_round)
RK_FUSED_SCALE(rk_e4m3_scale, uint8_t, dshim_rk_e4m3_to_float, dshim_rk_float_to_e4m3)
RK_FUSED_SCALE(rk_e5m2_scale, uint8_t, dshim_rk_e5m2_to_float, dshim_rk_float_to_e5m2)

#if defined(__AVX512F__) || defined(__F16C__)
/*
 * float16 where the ISA converts in hardware (vcvtph2ps/vcvtps2ph, about four
 * times cheaper than the integer code).  Each step converts one register of
 * lanes into small float arrays that the compiler keeps in registers, so the
 * element operation is still the plain C one.  The tail is padded to a full
 * step so every element goes through the same instructions; the unit test
 * checks the inline converters of the scalar build against them bit for bit.
 */
#if defined(__AVX512F__)
#define RK_F16_LANES 16
#else
#define RK_F16_LANES 8
#endif

static inline void rk_f16_load(float *out, const uint16_t *in)
{
#if defined(__AVX512F__)
    _mm512_storeu_ps(out, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)in)));
#else
    _mm256_storeu_ps(out, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)in)));
#endif
}

/* rounding from the immediate (nearest even), not from MXCSR */
static inline void rk_f16_store(uint16_t *out, const float *in)
{
#if defined(__AVX512F__)
    __m256i h = _mm512_cvtps_ph(_mm512_loadu_ps(in), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_storeu_si256((__m256i *)(void *)out, h);
#else
    __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128((__m128i *)(void *)out, h);
#endif
}

#define RK_F16_HW(fname, elem)                                                 \
    static inline void fname##_step(uint16_t *r, const uint16_t *a, const uint16_t *b) \
    {                                                                          \
        float fa[RK_F16_LANES], fb[RK_F16_LANES], fr[RK_F16_LANES];            \
        rk_f16_load(fa, a);                                                    \
        rk_f16_load(fb, b);                                                    \
        for (int j = 0; j < RK_F16_LANES; j++) {                               \
            fr[j] = elem(fa[j], fb[j]);                                        \
        }                                                                      \
        rk_f16_store(r, fr);                                                   \
    }                                                                          \
    static void fname(void *dst_, const void *a_, const void *b_, size_t n)    \
    {                                                                          \
        uint16_t *dst = dst_;                                                  \
        const uint16_t *a = a_;                                                \
        const uint16_t *b = b_;                                                \
        size_t i = 0;                                                          \
        for (; i + RK_F16_LANES <= n; i += RK_F16_LANES) {                     \
            fname##_step(dst + i, a + i, b + i);                               \
        }                                                                      \
        if (i < n) {                                                           \
            uint16_t ta[RK_F16_LANES] = {0}, tb[RK_F16_LANES] = {0}, tr[RK_F16_LANES]; \
            memcpy(ta, a + i, (n - i) * sizeof(uint16_t));                     \
            memcpy(tb, b + i, (n - i) * sizeof(uint16_t));                     \
            fname##_step(tr, ta, tb);                                          \
            memcpy(dst + i, tr, (n - i) * sizeof(uint16_t));                   \
        }                                                                      \
    }

RK_F16_HW(rk_f16_sum, rk_sum_f32)
RK_F16_HW(rk_f16_prod, rk_prod_f32)

static inline void rk_f16_scale_step(uint16_t *buf, float d)
{
    float f[RK_F16_LANES];
    rk_f16_load(f, buf);
    for (int j = 0; j < RK_F16_LANES; j++) {
        f[j] = f[j] / d;
    }
    rk_f16_store(buf, f);
}

static void rk_f16_scale(void *buf_, size_t n, int divisor)
{
    uint16_t *buf = buf_;
    const float d = (float)divisor;
    size_t i = 0;
    for (; i + RK_F16_LANES <= n; i += RK_F16_LANES) {
        rk_f16_scale_step(buf + i, d);
    }
    if (i < n) {
        uint16_t t[RK_F16_LANES] = {0};
        memcpy(t, buf + i, (n - i) * sizeof(uint16_t));
        rk_f16_scale_step(t, d);
        memcpy(buf + i, t, (n - i) * sizeof(uint16_t));
    }
}
#else
RK_FUSED(rk_f16_sum, uint16_t, dshim_rk_half_to_float, dshim_rk_float_to_half, rk_sum_f32)
RK_FUSED(rk_f16_prod, uint16_t, dshim_rk_half_to_float, dshim_rk_float_to_half, rk_prod_f32)
RK_FUSED_SCALE(rk_f16_scale, uint16_t, dshim_rk_half_to_float, dshim_rk_float_to_half)
#endif

/* ---- scale_div (AVG) of the wide types --------------------------------- */

static void rk_f32_scale(void *buf_, size_t n, int divisor)
{
    float *buf = buf_;
    const float d = (float)divisor;
    for (size_t i = 0; i < n; i++) {
        buf[i] = buf[i] / d;
    }
}

static void rk_f64_scale(void *buf_, size_t n, int divisor)
{
    double *buf = buf_;
    const double d = (double)divisor;
    for (size_t i = 0; i < n; i++) {
        buf[i] = buf[i] / d;
    }
}

/* Integers: C division truncates toward zero; divisor >= 1 rules out the
 * INT_MIN / -1 overflow.  DT is the type the division happens in. */
#define RK_INT_SCALE(fname, T, DT)                                             \
    static void fname(void *buf_, size_t n, int divisor)                       \
    {                                                                          \
        T *buf = buf_;                                                         \
        const DT d = (DT)divisor;                                              \
        for (size_t i = 0; i < n; i++) {                                       \
            buf[i] = (T)((DT)buf[i] / d);                                      \
        }                                                                      \
    }
RK_INT_SCALE(rk_i8_scale, int8_t, int32_t)
RK_INT_SCALE(rk_u8_scale, uint8_t, uint32_t)
RK_INT_SCALE(rk_i32_scale, int32_t, int32_t)
RK_INT_SCALE(rk_u32_scale, uint32_t, uint32_t)
RK_INT_SCALE(rk_i64_scale, int64_t, int64_t)
RK_INT_SCALE(rk_u64_scale, uint64_t, uint64_t)

/* ---- the table ------------------------------------------------------------- */

/* AVG reduces as SUM; the collective calls scale_div once at the end. */
#define RK_ROW(sum, prod, min, max)                                            \
    {                                                                          \
        [DSHIM_SUM] = sum, [DSHIM_PROD] = prod, [DSHIM_MIN] = min,             \
        [DSHIM_MAX] = max, [DSHIM_AVG] = sum                                   \
    }

const dshim_reduce_kernels_t RK_TABLE = {
    .isa = RK_STR(DSHIM_RK_ISA),
    .reduce = {
        [DSHIM_INT8] = RK_ROW(rk_u8_sum, rk_u8_prod, rk_i8_min, rk_i8_max),
        [DSHIM_UINT8] = RK_ROW(rk_u8_sum, rk_u8_prod, rk_u8_min, rk_u8_max),
        [DSHIM_INT32] = RK_ROW(rk_u32_sum, rk_u32_prod, rk_i32_min, rk_i32_max),
        [DSHIM_UINT32] = RK_ROW(rk_u32_sum, rk_u32_prod, rk_u32_min, rk_u32_max),
        [DSHIM_INT64] = RK_ROW(rk_u64_sum, rk_u64_prod, rk_i64_min, rk_i64_max),
        [DSHIM_UINT64] = RK_ROW(rk_u64_sum, rk_u64_prod, rk_u64_min, rk_u64_max),
        [DSHIM_FLOAT16] = RK_ROW(rk_f16_sum, rk_f16_prod, rk_f16_min, rk_f16_max),
        [DSHIM_BFLOAT16] = RK_ROW(rk_bf16_sum, rk_bf16_prod, rk_bf16_min, rk_bf16_max),
        [DSHIM_FLOAT32] = RK_ROW(rk_f32_sum, rk_f32_prod, rk_f32_min, rk_f32_max),
        [DSHIM_FLOAT64] = RK_ROW(rk_f64_sum, rk_f64_prod, rk_f64_min, rk_f64_max),
        [DSHIM_FLOAT8_E4M3] = RK_ROW(rk_e4m3_sum, rk_e4m3_prod, rk_e4m3_min, rk_e4m3_max),
        [DSHIM_FLOAT8_E5M2] = RK_ROW(rk_e5m2_sum, rk_e5m2_prod, rk_e5m2_min, rk_e5m2_max),
    },
    .scale_div = {
        [DSHIM_INT8] = rk_i8_scale,
        [DSHIM_UINT8] = rk_u8_scale,
        [DSHIM_INT32] = rk_i32_scale,
        [DSHIM_UINT32] = rk_u32_scale,
        [DSHIM_INT64] = rk_i64_scale,
        [DSHIM_UINT64] = rk_u64_scale,
        [DSHIM_FLOAT16] = rk_f16_scale,
        [DSHIM_BFLOAT16] = rk_bf16_scale,
        [DSHIM_FLOAT32] = rk_f32_scale,
        [DSHIM_FLOAT64] = rk_f64_scale,
        [DSHIM_FLOAT8_E4M3] = rk_e4m3_scale,
        [DSHIM_FLOAT8_E5M2] = rk_e5m2_scale,
    },
};

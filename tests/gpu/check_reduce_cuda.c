/*
 * The CUDA reduction backend (backends/reduce/cuda) against the cpu backend's
 * scalar kernels, bit for bit: every dtype x op x count, with dst aliasing an
 * operand, operands aliasing each other, and unaligned buffers; scale_div;
 * argument errors.
 *
 * This program builds on machines without CUDA: it includes no CUDA header
 * and links no CUDA library.  The backend comes from
 * dshim_reduce_cuda_load(), and device memory is reached through the
 * dshim_cuda_test_alloc/free/copy helpers that libdshim-cuda.so exports for
 * this purpose (looked up with dshim_reduce_cuda_symbol).  Where the loader
 * finds no library, runtime or device, the program exits with 77, which
 * ctest reports as skipped (SKIP_RETURN_CODE in tests/gpu/CMakeLists.txt).
 *
 * Check runs in CK_NOFORK mode: a CUDA context does not survive fork(), and
 * the loader has initialised the driver before the suite starts.
 */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dshim.h"
#include "reduce/cuda/reduce_cuda.h"
#include "cuda_loader.h"
#include "reduce/reduce.h"

#define SKIP_CODE 77
#define BIG_COUNT 1000003u
/* test_huge_counts: enough elements that every thread of a full grid (one
 * wave of resident blocks: ~170k-270k threads on an H100) runs the kernels'
 * unrolled loop several times, then the one-vector loop and the tail */
#define HUGE_BYTES ((size_t)64 << 20)
/* room for HUGE_BYTES (and BIG_COUNT float64) plus the offsets of the unaligned cases */
#define BUF_BYTES (HUGE_BYTES + 64u)

/* Check records every passing ck_assert (a pipe write): too slow per element. */
#define EXPECT(cond, ...)                                                      \
    do {                                                                       \
        if (!(cond)) {                                                         \
            ck_abort_msg(__VA_ARGS__);                                         \
        }                                                                      \
    } while (0)

static const dshim_reduce_ops_t *gpu;
static const dshim_reduce_ops_t *cpu;
static dshim_cuda_test_alloc_fn dev_alloc;
static dshim_cuda_test_free_fn dev_free;
static dshim_cuda_test_copy_fn dev_copy;

static const size_t counts[] = {0, 1, 7, BIG_COUNT};
#define N_COUNTS (sizeof(counts) / sizeof(counts[0]))

/* host buffers: operands, cpu result, gpu result; device buffers */
static unsigned char *h_a, *h_b, *h_want, *h_got;
static unsigned char *d_x, *d_y, *d_z;

static uint64_t rng_state = 0x2545f4914f6cdd1dull;
static uint64_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static int is_float(dshim_dtype_t dt)
{
    return dt == DSHIM_FLOAT32 || dt == DSHIM_FLOAT64;
}

/*
 * Random operands.  Narrow types take random bits (every class of value
 * turns up: NaNs, infinities, subnormals).  float32/float64 random bits
 * would rarely round (exponents far apart), so most values get an exponent
 * near 1.0, and a few are special: NaNs with payloads (quiet and
 * signalling), infinities, zeros of both signs, subnormals.
 */
static void fill(unsigned char *buf, size_t count, dshim_dtype_t dt)
{
    size_t size = dshim_dtype_size(dt);
    for (size_t i = 0; i < count * size; i += 8) {
        uint64_t r = rng();
        memcpy(buf + i, &r, count * size - i < 8 ? count * size - i : 8);
    }
    if (!is_float(dt)) {
        return;
    }
    for (size_t i = 0; i < count; i++) {
        uint64_t r = rng();
        unsigned kind = (unsigned)(r & 31u);
        uint64_t sign = (r >> 5) & 1u;
        uint64_t mant = r >> 12;
        if (dt == DSHIM_FLOAT32) {
            uint32_t v;
            static const uint32_t special[] = {0x7fc00000u, 0xffc12345u, 0x7f800001u, 0x7fa00000u,
                                               0x7f800000u, 0xff800000u, 0x00000000u, 0x80000000u,
                                               0x00000001u, 0x807fffffu, 0x7f7fffffu, 0x00800000u};
            if (kind < 12) {
                v = special[kind];
            } else if (kind < 28) {
                v = (uint32_t)(sign << 31) | ((uint32_t)(124 + (r >> 6) % 8) << 23) |
                    (uint32_t)(mant & 0x7fffffu);
            } else {
                continue; /* random bits */
            }
            memcpy(buf + i * 4, &v, 4);
        } else {
            uint64_t v;
            static const uint64_t special[] = {
                0x7ff8000000000000ull, 0xfff8000000abcdefull, 0x7ff0000000000001ull,
                0x7ff4000000000000ull, 0x7ff0000000000000ull, 0xfff0000000000000ull, 0, 1ull << 63,
                1, 0x800fffffffffffffull, 0x7fefffffffffffffull, 0x0010000000000000ull};
            if (kind < 12) {
                v = special[kind];
            } else if (kind < 28) {
                v = (sign << 63) | ((1020 + (r >> 6) % 8) << 52) | (mant & 0xfffffffffffffull);
            } else {
                continue;
            }
            memcpy(buf + i * 8, &v, 8);
        }
    }
}

static void to_dev(void *dst, const void *src, size_t bytes)
{
    dshim_status_t st = dev_copy(dst, src, bytes);
    ck_assert_msg(st == DSHIM_OK, "copy to device: %s", dshim_last_error());
}

static void from_dev(void *dst, const void *src, size_t bytes)
{
    dshim_status_t st = dev_copy(dst, src, bytes);
    ck_assert_msg(st == DSHIM_OK, "copy from device: %s", dshim_last_error());
}

static void expect_same(const unsigned char *want, const unsigned char *got, size_t count,
                        dshim_dtype_t dt, const char *what)
{
    size_t size = dshim_dtype_size(dt);
    if (memcmp(want, got, count * size) == 0) {
        return;
    }
    for (size_t i = 0; i < count; i++) {
        uint64_t w = 0, g = 0, a = 0, b = 0;
        memcpy(&w, want + i * size, size);
        memcpy(&g, got + i * size, size);
        if (w != g) {
            memcpy(&a, h_a + i * size, size);
            memcpy(&b, h_b + i * size, size);
            ck_abort_msg("%s %s count %zu: element %zu is 0x%llx on the gpu, 0x%llx on the cpu "
                         "(a 0x%llx, b 0x%llx)", what, dshim_dtype_name(dt), count, i,
                         (unsigned long long)g, (unsigned long long)w, (unsigned long long)a,
                         (unsigned long long)b);
        }
    }
}

/* How the device operands are placed for one run. */
enum layout {
    L_DISJOINT,  /* dst, a, b separate, 256-byte aligned (vector loads) */
    L_DST_IS_A,  /* dst == a */
    L_DST_IS_B,  /* dst == b */
    L_A_IS_B,    /* a == b (so the cpu reference is op(a, a)) */
    L_ELEM,      /* element aligned but not 16-byte aligned (element loads) */
    L_BYTES,     /* one byte off element alignment (byte loads) */
    L_COUNT
};
static const char *const layout_names[L_COUNT] = {"disjoint", "dst==a", "dst==b", "a==b",
                                                  "element-aligned", "unaligned"};

static void run_reduce(dshim_dtype_t dt, dshim_redop_t op, size_t count, int layout)
{
    size_t size = dshim_dtype_size(dt);
    size_t bytes = count * size;
    size_t off = layout == L_ELEM ? size : layout == L_BYTES ? 1 : 0;
    const unsigned char *cb = layout == L_A_IS_B ? h_a : h_b;
    dshim_status_t st = cpu->reduce(h_want, h_a, cb, count, dt, op, NULL);
    ck_assert_msg(st == DSHIM_OK, "cpu reduce: %s", dshim_last_error());

    unsigned char *x = d_x + off, *y = d_y + off, *z = d_z + off;
    if (count > 0) {
        to_dev(x, h_a, bytes);
        to_dev(y, h_b, bytes);
    }
    void *dst = z;
    const void *a = x;
    const void *b = y;
    switch (layout) {
    case L_DST_IS_A: dst = x; break;
    case L_DST_IS_B: dst = y; break;
    case L_A_IS_B: b = x; break;
    default: break;
    }
    st = gpu->reduce(dst, a, b, count, dt, op, NULL);
    EXPECT(st == DSHIM_OK, "cuda reduce %s %s count %zu %s: %s", dshim_dtype_name(dt),
           dshim_redop_name(op), count, layout_names[layout], dshim_last_error());
    if (count > 0) {
        from_dev(h_got, dst, bytes);
    }
    char what[64];
    snprintf(what, sizeof(what), "reduce %s %s", dshim_redop_name(op), layout_names[layout]);
    expect_same(h_want, h_got, count, dt, what);
}

/* _i: the dtype; every op, count and layout on fresh random data */
START_TEST(test_reduce_matches_cpu)
{
    dshim_dtype_t dt = (dshim_dtype_t)_i;
    for (size_t c = 0; c < N_COUNTS; c++) {
        fill(h_a, counts[c], dt);
        fill(h_b, counts[c], dt);
        for (int op = 0; op < DSHIM_REDOP_COUNT; op++) {
            for (int l = 0; l < L_COUNT; l++) {
                run_reduce(dt, (dshim_redop_t)op, counts[c], l);
            }
        }
    }
}
END_TEST

/* _i: the dtype; scale_div by several divisors, aligned and not */
START_TEST(test_scale_div_matches_cpu)
{
    static const int divisors[] = {1, 2, 3, 7, 8, 255, 1000};
    dshim_dtype_t dt = (dshim_dtype_t)_i;
    size_t size = dshim_dtype_size(dt);
    for (size_t c = 0; c < N_COUNTS; c++) {
        size_t count = counts[c];
        fill(h_a, count, dt);
        for (size_t k = 0; k < sizeof(divisors) / sizeof(divisors[0]); k++) {
            for (size_t off = 0; off <= 1; off++) {
                memcpy(h_want, h_a, count * size);
                dshim_status_t st = cpu->scale_div(h_want, count, dt, divisors[k], NULL);
                ck_assert_msg(st == DSHIM_OK, "cpu scale_div: %s", dshim_last_error());
                if (count > 0) {
                    to_dev(d_x + off, h_a, count * size);
                }
                st = gpu->scale_div(d_x + off, count, dt, divisors[k], NULL);
                EXPECT(st == DSHIM_OK, "cuda scale_div %s by %d: %s", dshim_dtype_name(dt),
                       divisors[k], dshim_last_error());
                if (count > 0) {
                    from_dev(h_got, d_x + off, count * size);
                }
                char what[64];
                snprintf(what, sizeof(what), "scale_div by %d%s", divisors[k],
                         off ? " unaligned" : "");
                expect_same(h_want, h_got, count, dt, what);
            }
        }
    }
}
END_TEST

/* Counts in the tens of millions (the unrolled path of the kernels; the
 * counts above fit in one vector per thread): a few dtype x op pairs, out of
 * place and in place, and scale_div; odd counts, so the tail runs too. */
START_TEST(test_huge_counts)
{
    static const struct {
        dshim_dtype_t dt;
        dshim_redop_t op;
    } cases[] = {{DSHIM_FLOAT32, DSHIM_SUM},  {DSHIM_FLOAT32, DSHIM_MAX},
                 {DSHIM_BFLOAT16, DSHIM_SUM}, {DSHIM_FLOAT16, DSHIM_SUM},
                 {DSHIM_FLOAT64, DSHIM_PROD}, {DSHIM_INT8, DSHIM_MIN}};
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        dshim_dtype_t dt = cases[k].dt;
        size_t count = HUGE_BYTES / dshim_dtype_size(dt) - 3;
        fill(h_a, count, dt);
        fill(h_b, count, dt);
        run_reduce(dt, cases[k].op, count, L_DISJOINT);
        run_reduce(dt, cases[k].op, count, L_DST_IS_B);
    }
    size_t count = HUGE_BYTES / 4 - 1;
    fill(h_a, count, DSHIM_FLOAT32);
    memcpy(h_want, h_a, count * 4);
    ck_assert_int_eq(cpu->scale_div(h_want, count, DSHIM_FLOAT32, 7, NULL), DSHIM_OK);
    to_dev(d_x, h_a, count * 4);
    dshim_status_t st = gpu->scale_div(d_x, count, DSHIM_FLOAT32, 7, NULL);
    EXPECT(st == DSHIM_OK, "cuda scale_div huge: %s", dshim_last_error());
    from_dev(h_got, d_x, count * 4);
    expect_same(h_want, h_got, count, DSHIM_FLOAT32, "scale_div by 7, huge count");
}
END_TEST

/* AVG as the collectives do it: reduce with DSHIM_AVG, then scale_div. */
START_TEST(test_avg_then_scale)
{
    for (int d = 0; d < DSHIM_DTYPE_COUNT; d++) {
        dshim_dtype_t dt = (dshim_dtype_t)d;
        size_t count = 4099;
        size_t bytes = count * dshim_dtype_size(dt);
        fill(h_a, count, dt);
        fill(h_b, count, dt);
        ck_assert_int_eq(cpu->reduce(h_want, h_a, h_b, count, dt, DSHIM_AVG, NULL), DSHIM_OK);
        ck_assert_int_eq(cpu->scale_div(h_want, count, dt, 2, NULL), DSHIM_OK);
        to_dev(d_x, h_a, bytes);
        to_dev(d_y, h_b, bytes);
        ck_assert_int_eq(gpu->reduce(d_x, d_x, d_y, count, dt, DSHIM_AVG, NULL), DSHIM_OK);
        ck_assert_int_eq(gpu->scale_div(d_x, count, dt, 2, NULL), DSHIM_OK);
        from_dev(h_got, d_x, bytes);
        expect_same(h_want, h_got, count, dt, "avg");
    }
}
END_TEST

/* A non-NULL stream: cudaStreamPerThread's handle value (0x2), which needs no
 * header to name; the copy helper's cudaMemcpy waits for it. */
START_TEST(test_stream_argument)
{
    void *per_thread = (void *)(uintptr_t)0x2;
    size_t count = 100000;
    fill(h_a, count, DSHIM_FLOAT32);
    fill(h_b, count, DSHIM_FLOAT32);
    ck_assert_int_eq(cpu->reduce(h_want, h_a, h_b, count, DSHIM_FLOAT32, DSHIM_SUM, NULL), DSHIM_OK);
    to_dev(d_x, h_a, count * 4);
    to_dev(d_y, h_b, count * 4);
    ck_assert_int_eq(gpu->reduce(d_z, d_x, d_y, count, DSHIM_FLOAT32, DSHIM_SUM, per_thread),
                     DSHIM_OK);
    from_dev(h_got, d_z, count * 4);
    expect_same(h_want, h_got, count, DSHIM_FLOAT32, "reduce on a stream");
}
END_TEST

START_TEST(test_identity_and_errors)
{
    ck_assert_str_eq(gpu->name, "cuda");
    ck_assert_str_eq(gpu->isa(), "cuda");
    ck_assert(gpu->supports(DSHIM_MEM_CUDA, DSHIM_BFLOAT16, DSHIM_AVG));
    ck_assert(!gpu->supports(DSHIM_MEM_HOST, DSHIM_FLOAT32, DSHIM_SUM));
    ck_assert(!gpu->supports(DSHIM_MEM_CUDA, DSHIM_DTYPE_COUNT, DSHIM_SUM));
    ck_assert(!gpu->supports(DSHIM_MEM_CUDA, DSHIM_FLOAT32, DSHIM_REDOP_COUNT));

    ck_assert_int_eq(gpu->reduce(d_z, d_x, d_y, 4, DSHIM_DTYPE_COUNT, DSHIM_SUM, NULL),
                     DSHIM_ERR_INVALID);
    /* the message reached this core's dshim_last_error through the bind */
    ck_assert_ptr_nonnull(strstr(dshim_last_error(), "invalid dtype"));
    ck_assert_int_eq(gpu->reduce(d_z, d_x, d_y, 4, DSHIM_FLOAT32, DSHIM_REDOP_COUNT, NULL),
                     DSHIM_ERR_INVALID);
    ck_assert_int_eq(gpu->reduce(NULL, d_x, d_y, 4, DSHIM_FLOAT32, DSHIM_SUM, NULL),
                     DSHIM_ERR_INVALID);
    ck_assert_int_eq(gpu->reduce(d_z, d_x, NULL, 4, DSHIM_FLOAT32, DSHIM_SUM, NULL),
                     DSHIM_ERR_INVALID);
    ck_assert_int_eq(gpu->reduce(NULL, NULL, NULL, 0, DSHIM_FLOAT32, DSHIM_SUM, NULL), DSHIM_OK);
    ck_assert_int_eq(gpu->reduce(d_x + 4, d_x, d_y, 4, DSHIM_FLOAT32, DSHIM_SUM, NULL),
                     DSHIM_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(dshim_last_error(), "partially overlaps"));
    ck_assert_int_eq(gpu->reduce(d_z, d_x, d_y, SIZE_MAX / 2, DSHIM_FLOAT32, DSHIM_SUM, NULL),
                     DSHIM_ERR_INVALID);
    ck_assert_int_eq(gpu->scale_div(d_x, 4, DSHIM_FLOAT32, 0, NULL), DSHIM_ERR_INVALID);
    ck_assert_int_eq(gpu->scale_div(NULL, 4, DSHIM_FLOAT32, 2, NULL), DSHIM_ERR_INVALID);
    ck_assert_int_eq(gpu->scale_div(d_x, 4, DSHIM_DTYPE_COUNT, 2, NULL), DSHIM_ERR_INVALID);
    ck_assert_int_eq(gpu->scale_div(NULL, 0, DSHIM_FLOAT32, 2, NULL), DSHIM_OK);
}
END_TEST

static Suite *reduce_cuda_suite(void)
{
    Suite *s = suite_create("reduce_cuda");
    TCase *tc = tcase_create("vs_cpu");
    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, test_identity_and_errors);
    tcase_add_loop_test(tc, test_reduce_matches_cpu, 0, DSHIM_DTYPE_COUNT);
    tcase_add_loop_test(tc, test_scale_div_matches_cpu, 0, DSHIM_DTYPE_COUNT);
    tcase_add_test(tc, test_avg_then_scale);
    tcase_add_test(tc, test_huge_counts);
    tcase_add_test(tc, test_stream_argument);
    suite_add_tcase(s, tc);
    return s;
}

static int setup(void)
{
    dev_alloc = (dshim_cuda_test_alloc_fn)dshim_reduce_cuda_symbol("dshim_cuda_test_alloc");
    dev_free = (dshim_cuda_test_free_fn)dshim_reduce_cuda_symbol("dshim_cuda_test_free");
    dev_copy = (dshim_cuda_test_copy_fn)dshim_reduce_cuda_symbol("dshim_cuda_test_copy");
    if (dev_alloc == NULL || dev_free == NULL || dev_copy == NULL) {
        fprintf(stderr, "libdshim-cuda.so lacks the dshim_cuda_test_* helpers\n");
        return -1;
    }
    h_a = malloc(BUF_BYTES);
    h_b = malloc(BUF_BYTES);
    h_want = malloc(BUF_BYTES);
    h_got = malloc(BUF_BYTES);
    if (h_a == NULL || h_b == NULL || h_want == NULL || h_got == NULL) {
        fprintf(stderr, "out of host memory\n");
        return -1;
    }
    if (dev_alloc((void **)&d_x, BUF_BYTES) != DSHIM_OK ||
        dev_alloc((void **)&d_y, BUF_BYTES) != DSHIM_OK ||
        dev_alloc((void **)&d_z, BUF_BYTES) != DSHIM_OK) {
        fprintf(stderr, "device allocation failed: %s\n", dshim_last_error());
        return -1;
    }
    return 0;
}

static void teardown(void)
{
    unsigned char *dev[] = {d_x, d_y, d_z};
    for (size_t i = 0; i < 3; i++) {
        if (dev[i] != NULL && dev_free != NULL) {
            dev_free(dev[i]);
        }
    }
    free(h_a);
    free(h_b);
    free(h_want);
    free(h_got);
}

int main(void)
{
    gpu = dshim_reduce_cuda_load();
    if (gpu == NULL) {
        printf("SKIP: no CUDA device\n");
        return SKIP_CODE;
    }
    cpu = dshim_reduce_cpu_ops("scalar");
    if (setup() != 0) {
        teardown();
        return 1;
    }
    SRunner *sr = srunner_create(reduce_cuda_suite());
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    teardown();
    return failed == 0 ? 0 : 1;
}

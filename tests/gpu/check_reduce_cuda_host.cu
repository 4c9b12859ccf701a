/*
 * The CUDA backend's element operations (reduce_cuda_elem.cuh), run on the
 * host, against the cpu backend's scalar kernels, bit for bit.  Needs nvcc
 * but no GPU, so it runs wherever libdshim-cuda.so is built and catches a
 * mistake in the conversions or NaN rules without device time.
 *
 * What it cannot see is the device's own arithmetic; that is
 * check_reduce_cuda.c's job on a GPU.  The element operations are written
 * so the two agree: every NaN result is decided from the operands, never
 * taken from the hardware (see reduce_cuda_elem.cuh).
 *
 * Coverage: every pair of 8-bit values; every 16-bit value against a set of
 * partners plus random pairs; float32/float64 random and special values;
 * scale_div of every 8/16-bit value and random wide values.
 */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "reduce/reduce.h"
}
#include "reduce/cuda/reduce_cuda_elem.cuh"

typedef void (*host_reduce_fn)(void *, const void *, const void *, size_t);
typedef void (*host_scale_fn)(void *, size_t, int);

template <typename T, typename Op>
void host_reduce(void *dst, const void *a, const void *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        T x, y;
        memcpy(&x, (const char *)a + i * sizeof(T), sizeof(T));
        memcpy(&y, (const char *)b + i * sizeof(T), sizeof(T));
        T r = Op::apply(x, y);
        memcpy((char *)dst + i * sizeof(T), &r, sizeof(T));
    }
}

template <typename S> void host_scale(void *buf, size_t n, int divisor)
{
    typedef typename S::TT T;
    for (size_t i = 0; i < n; i++) {
        T x;
        memcpy(&x, (char *)buf + i * sizeof(T), sizeof(T));
        x = S::apply(x, divisor, rc_recip(divisor));
        memcpy((char *)buf + i * sizeof(T), &x, sizeof(T));
    }
}

static const host_reduce_fn reduce_table[DSHIM_DTYPE_COUNT][4] = RC_REDUCE_TABLE(host_reduce);
static const host_scale_fn scale_table[DSHIM_DTYPE_COUNT] = RC_SCALE_TABLE(host_scale);

#define MAX_N (1u << 20)
static unsigned char *buf_a, *buf_b, *buf_want, *buf_got;
static const dshim_reduce_ops_t *cpu;

static uint64_t rng_state = 0x5851f42d4c957f2dull;
static uint64_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static void put(unsigned char *buf, size_t i, size_t size, uint64_t v)
{
    memcpy(buf + i * size, &v, size); /* little endian: the low bytes */
}

static uint64_t get(const unsigned char *buf, size_t i, size_t size)
{
    uint64_t v = 0;
    memcpy(&v, buf + i * size, size);
    return v;
}

/* A float32/float64 value: near 1.0 mostly (sums round), else special or raw bits. */
static uint64_t wide_value(size_t size)
{
    static const uint32_t s32[] = {0x7fc00000u, 0xffc12345u, 0x7f800001u, 0x7fa00000u,
                                   0x7f800000u, 0xff800000u, 0u,          0x80000000u,
                                   1u,          0x807fffffu, 0x7f7fffffu, 0x00800000u};
    static const uint64_t s64[] = {0x7ff8000000000000ull, 0xfff8000000abcdefull,
                                   0x7ff0000000000001ull, 0x7ff4000000000000ull,
                                   0x7ff0000000000000ull, 0xfff0000000000000ull, 0, 1ull << 63, 1,
                                   0x800fffffffffffffull, 0x7fefffffffffffffull,
                                   0x0010000000000000ull};
    uint64_t r = rng();
    unsigned kind = (unsigned)(r & 31u);
    uint64_t sign = (r >> 5) & 1u;
    if (size == 4) {
        if (kind < 12) {
            return s32[kind];
        }
        if (kind < 28) {
            return (sign << 31) | ((124 + (r >> 6) % 8) << 23) | ((r >> 12) & 0x7fffffu);
        }
        return r & 0xffffffffu;
    }
    if (kind < 12) {
        return s64[kind];
    }
    if (kind < 28) {
        return (sign << 63) | ((1020 + (r >> 6) % 8) << 52) | ((r >> 12) & 0xfffffffffffffull);
    }
    return r;
}

/* Operand pairs for dtype _i into buf_a/buf_b; returns how many. */
static size_t make_pairs(dshim_dtype_t dt)
{
    size_t size = dshim_dtype_size(dt);
    size_t n = 0;
    if (size == 1) {
        for (uint32_t x = 0; x < 256; x++) {
            for (uint32_t y = 0; y < 256; y++, n++) {
                put(buf_a, n, 1, x);
                put(buf_b, n, 1, y);
            }
        }
    } else if (size == 2) {
        /* each value with a few fixed partners (zeros, infinities, NaNs, one,
         * itself), then random pairs */
        static const uint64_t partners[] = {0x0000, 0x8000, 0x7c00, 0xfc00, 0x7f80, 0xff80,
                                            0x7e01, 0x7fc1, 0x3c00, 0x3f80, 0x0001, 0x8001};
        for (uint32_t x = 0; x < 65536; x++) {
            for (size_t k = 0; k < sizeof(partners) / sizeof(partners[0]); k++, n++) {
                put(buf_a, n, 2, x);
                put(buf_b, n, 2, partners[k]);
            }
            put(buf_a, n, 2, x);
            put(buf_b, n, 2, x);
            n++;
        }
        for (; n < MAX_N; n++) {
            put(buf_a, n, 2, rng());
            put(buf_b, n, 2, rng());
        }
    } else if (dt == DSHIM_FLOAT32 || dt == DSHIM_FLOAT64) {
        for (; n < MAX_N / 2; n++) {
            put(buf_a, n, size, wide_value(size));
            put(buf_b, n, size, wide_value(size));
        }
    } else {
        for (; n < MAX_N / 2; n++) {
            put(buf_a, n, size, rng());
            put(buf_b, n, size, rng() >> (rng() & 63)); /* small values too */
        }
    }
    return n;
}

static void expect_same(dshim_dtype_t dt, size_t n, const char *what)
{
    size_t size = dshim_dtype_size(dt);
    if (memcmp(buf_want, buf_got, n * size) == 0) {
        return;
    }
    for (size_t i = 0; i < n; i++) {
        if (get(buf_want, i, size) != get(buf_got, i, size)) {
            ck_abort_msg("%s %s: element %zu: cuda elem 0x%llx, cpu 0x%llx (a 0x%llx, b 0x%llx)",
                         what, dshim_dtype_name(dt), i,
                         (unsigned long long)get(buf_got, i, size),
                         (unsigned long long)get(buf_want, i, size),
                         (unsigned long long)get(buf_a, i, size),
                         (unsigned long long)get(buf_b, i, size));
        }
    }
}

START_TEST(test_reduce_elems)
{
    dshim_dtype_t dt = (dshim_dtype_t)_i;
    size_t n = make_pairs(dt);
    for (int op = 0; op < DSHIM_REDOP_COUNT; op++) {
        ck_assert_int_eq(cpu->reduce(buf_want, buf_a, buf_b, n, dt, (dshim_redop_t)op, NULL),
                         DSHIM_OK);
        reduce_table[dt][op == DSHIM_AVG ? DSHIM_SUM : op](buf_got, buf_a, buf_b, n);
        expect_same(dt, n, dshim_redop_name((dshim_redop_t)op));
    }
}
END_TEST

START_TEST(test_scale_elems)
{
    /* 2..64 (every rank count of a host, and more) plus odd large ones: the
     * half types divide by multiplying (rc_div_by_int), which must equal the
     * CPU's true division for every value */
    int divisors[64 + 6];
    int nd = 0;
    for (int d = 2; d <= 64; d++) {
        divisors[nd++] = d;
    }
    static const int more[] = {255, 1000, 1023, 4097, 65537, 1 << 20};
    for (size_t k = 0; k < sizeof(more) / sizeof(more[0]); k++) {
        divisors[nd++] = more[k];
    }
    dshim_dtype_t dt = (dshim_dtype_t)_i;
    size_t n = make_pairs(dt);
    size_t size = dshim_dtype_size(dt);
    for (int k = 0; k < nd; k++) {
        memcpy(buf_want, buf_a, n * size);
        memcpy(buf_got, buf_a, n * size);
        ck_assert_int_eq(cpu->scale_div(buf_want, n, dt, divisors[k], NULL), DSHIM_OK);
        scale_table[dt](buf_got, n, divisors[k]);
        char what[32];
        snprintf(what, sizeof(what), "scale_div by %d", divisors[k]);
        expect_same(dt, n, what);
    }
}
END_TEST

/* The public scalar converters (cpu backend) and the cuda ones, all inputs
 * of the narrow types and random float32 inputs. */
START_TEST(test_conversions)
{
    for (uint32_t v = 0; v < 65536; v++) {
        uint32_t w = rc_f2u(rc_half_to_float((uint16_t)v));
        uint32_t c = rc_f2u(dshim_half_to_float((unsigned short)v));
        ck_assert_msg(w == c, "half 0x%04x widens to 0x%08x, cpu 0x%08x", v, w, c);
    }
    for (uint32_t v = 0; v < 256; v++) {
        ck_assert_uint_eq(rc_f2u(rc_e4m3_to_float((uint8_t)v)),
                          rc_f2u(dshim_fp8e4m3_to_float((unsigned char)v)));
        ck_assert_uint_eq(rc_f2u(rc_e5m2_to_float((uint8_t)v)),
                          rc_f2u(dshim_fp8e5m2_to_float((unsigned char)v)));
    }
    for (uint64_t i = 0; i < (1u << 24); i++) {
        /* all exponents, a stride of mantissas, and random bits */
        uint32_t x = (i & 1) ? (uint32_t)rng() : (uint32_t)(i * 0x1001u + (i >> 12));
        float f = rc_u2f(x);
        if (rc_float_to_half(f) != dshim_float_to_half(f) ||
            rc_float_to_e4m3(f) != dshim_float_to_fp8e4m3(f) ||
            rc_float_to_e5m2(f) != dshim_float_to_fp8e5m2(f) ||
            (f == f && rc_bf16_round(f) != dshim_float_to_bf16(f))) {
            ck_abort_msg("float 0x%08x narrows to half 0x%04x/0x%04x e4m3 0x%02x/0x%02x e5m2 "
                         "0x%02x/0x%02x bf16 0x%04x/0x%04x (cuda/cpu)", x, rc_float_to_half(f),
                         dshim_float_to_half(f), rc_float_to_e4m3(f), dshim_float_to_fp8e4m3(f),
                         rc_float_to_e5m2(f), dshim_float_to_fp8e5m2(f), rc_bf16_round(f),
                         dshim_float_to_bf16(f));
        }
    }
}
END_TEST

int main(void)
{
    cpu = dshim_reduce_cpu_ops("scalar");
    buf_a = (unsigned char *)malloc(MAX_N * 8);
    buf_b = (unsigned char *)malloc(MAX_N * 8);
    buf_want = (unsigned char *)malloc(MAX_N * 8);
    buf_got = (unsigned char *)malloc(MAX_N * 8);
    if (cpu == NULL || !buf_a || !buf_b || !buf_want || !buf_got) {
        fprintf(stderr, "setup failed\n");
        return 1;
    }
    Suite *s = suite_create("reduce_cuda_host");
    TCase *tc = tcase_create("elems");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_conversions);
    tcase_add_loop_test(tc, test_reduce_elems, 0, DSHIM_DTYPE_COUNT);
    tcase_add_loop_test(tc, test_scale_elems, 0, DSHIM_DTYPE_COUNT);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    free(buf_a);
    free(buf_b);
    free(buf_want);
    free(buf_got);
    return failed == 0 ? 0 : 1;
}

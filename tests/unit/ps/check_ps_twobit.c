/*
 * Unit tests of MXNet's 2-bit gradient compression codec (shim/ps/ps_twobit.{h,c}) and its
 * parameters (shim/ps/ps_twobit_params.c).
 *
 * Hand-computed cases pin the bit layout, the thresholds' edges, tails, residual
 * carry-over and NaN/inf; random data is compared with a byte-wise reference written
 * here the way MXNet 1.9.1's gradient_compression-inl.h describes the format (a char
 * pointer into the float-sized block, masks 0xc0/0x30/0x0c/0x03 for +threshold and
 * 0x80/0x20/0x08/0x02 for -threshold).  tests/mxnet/test_twobit_exact.py compares with
 * the real MXNet.
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dshim.h"
#include "ps_twobit.h"

/* per-element checks without Check's per-assert cost */
#define EXPECT(cond, ...)                                                      \
    do {                                                                       \
        if (!(cond)) {                                                         \
            ck_abort_msg(__VA_ARGS__);                                         \
        }                                                                      \
    } while (0)

static uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static uint64_t rng_state = 0x2545f4914f6cdd1dull;
static uint64_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* ---- the byte-wise reference ------------------------------------------- */

static void ref_quantize(const float *grad, float *residual, size_t n, float t, uint8_t *out)
{
    static const uint8_t posbits[] = {0xc0, 0x30, 0x0c, 0x03};
    static const uint8_t negbits[] = {0x80, 0x20, 0x08, 0x02};
    memset(out, 0, 4 * dshim_twobit_words(n));
    for (size_t i = 0; i < n; i++) {
        residual[i] += grad[i];
        if (residual[i] >= t) {
            out[i / 4] |= posbits[i % 4];
            residual[i] -= t;
        } else if (residual[i] <= -t) {
            out[i / 4] |= negbits[i % 4];
            residual[i] -= -t;
        }
    }
}

static void ref_dequantize(const uint8_t *in, size_t n, float t, float *out)
{
    static const uint8_t posbits[] = {0xc0, 0x30, 0x0c, 0x03};
    static const uint8_t negbits[] = {0x80, 0x20, 0x08, 0x02};
    for (size_t i = 0; i < n; i++) {
        uint8_t masked = in[i / 4] & posbits[i % 4];
        out[i] = masked == posbits[i % 4] ? t : (masked == negbits[i % 4] ? -t : 0.0f);
    }
}

/* Value k's 2-bit code in a block: byte k/4 of the words' memory, top bits first. */
static unsigned code_at(const uint32_t *words, size_t i)
{
    const uint8_t *bytes = (const uint8_t *)words;
    return (bytes[i / 4] >> (6 - 2 * (i % 4))) & 3u;
}

/* ---- codec: hand-computed cases ----------------------------------------- */

START_TEST(test_words)
{
    ck_assert_uint_eq(dshim_twobit_words(0), 0);
    ck_assert_uint_eq(dshim_twobit_words(1), 1);
    ck_assert_uint_eq(dshim_twobit_words(15), 1);
    ck_assert_uint_eq(dshim_twobit_words(16), 1);
    ck_assert_uint_eq(dshim_twobit_words(17), 2);
    ck_assert_uint_eq(dshim_twobit_words(32), 2);
    ck_assert_uint_eq(dshim_twobit_words(33), 3);
    ck_assert_uint_eq(dshim_twobit_words((size_t)1 << 40), (size_t)1 << 36);
}
END_TEST

/* The example from a real MXNet 1.9.1 run (GradientCompression::Quantize, threshold 0.5):
 * words 0xfffff0e2 and 0x000000c0. */
START_TEST(test_layout_from_mxnet)
{
    float grad[17] = {0.5f, -0.5f, 0.49f, -0.51f, 1.0f, 2.0f, 0.0f, 0.3f};
    for (int i = 8; i < 17; i++) {
        grad[i] = 0.6f;
    }
    float residual[17] = {0};
    uint32_t out[3] = {0xdeadbeef, 0xdeadbeef, 0xdeadbeef};
    dshim_twobit_quantize(grad, residual, 17, 0.5f, out);
    ck_assert_uint_eq(out[0], 0xfffff0e2u);
    ck_assert_uint_eq(out[1], 0x000000c0u);
    ck_assert_uint_eq(out[2], 0xdeadbeefu);  /* nothing past words(17) */
    float want[17] = {0.0f, 0.0f, 0.49f, -0.51f + 0.5f, 0.5f, 1.5f, 0.0f, 0.3f};
    for (int i = 8; i < 17; i++) {
        want[i] = 0.6f - 0.5f;
    }
    for (int i = 0; i < 17; i++) {
        EXPECT(f2u(residual[i]) == f2u(want[i]), "residual[%d] %a, want %a", i, residual[i],
               want[i]);
    }
}
END_TEST

/* Every position of a block with each code: the bit pair moves through the bytes. */
START_TEST(test_layout_each_position)
{
    for (int k = 0; k < 16; k++) {
        for (int sign = -1; sign <= 1; sign += 2) {
            float grad[16] = {0}, residual[16] = {0};
            uint32_t out = 0;
            grad[k] = 2.0f * (float)sign;
            dshim_twobit_quantize(grad, residual, 16, 1.0f, &out);
            uint8_t bytes[4] = {0};
            bytes[k / 4] = (uint8_t)((sign > 0 ? 3u : 2u) << (6 - 2 * (k % 4)));
            uint32_t want;
            memcpy(&want, bytes, 4);
            EXPECT(out == want, "k=%d sign=%d: 0x%08x, want 0x%08x", k, sign, out, want);
            EXPECT(residual[k] == (float)sign, "k=%d: residual %g", k, residual[k]);
        }
    }
}
END_TEST

/* The compares are >= and <=: exactly +-threshold emits; one ulp inside does not. */
START_TEST(test_threshold_edges)
{
    const float t = 0.3f;
    float grad[10] = {
        t, -t,
        nextafterf(t, 0.0f), nextafterf(-t, 0.0f),    /* just inside: 0 */
        nextafterf(t, 1.0f), nextafterf(-t, -1.0f),   /* just outside: emit */
        0.0f, -0.0f, 3 * t, -3 * t,
    };
    float residual[10] = {0};
    uint32_t out[1];
    dshim_twobit_quantize(grad, residual, 10, t, out);
    const unsigned want_code[10] = {3, 2, 0, 0, 3, 2, 0, 0, 3, 2};
    for (size_t i = 0; i < 10; i++) {
        EXPECT(code_at(out, i) == want_code[i], "value %zu: code %u, want %u", i,
               code_at(out, i), want_code[i]);
    }
    ck_assert_uint_eq(f2u(residual[0]), f2u(0.0f));
    ck_assert_uint_eq(f2u(residual[1]), f2u(0.0f));  /* -t - (-t) = +0 */
    ck_assert_uint_eq(f2u(residual[2]), f2u(grad[2]));
    ck_assert_uint_eq(f2u(residual[3]), f2u(grad[3]));
    ck_assert_uint_eq(f2u(residual[4]), f2u(grad[4] - t));
    ck_assert_uint_eq(f2u(residual[5]), f2u(grad[5] + t));
    ck_assert_uint_eq(f2u(residual[6]), f2u(0.0f));
    ck_assert_uint_eq(f2u(residual[7]), f2u(0.0f));  /* +0 + -0 = +0 */
    ck_assert_uint_eq(f2u(residual[8]), f2u(3 * t - t));  /* one threshold per call */
    ck_assert_uint_eq(f2u(residual[9]), f2u(-3 * t + t));
    for (size_t i = 10; i < 16; i++) {
        EXPECT(code_at(out, i) == 0, "missing value %zu has code %u", i, code_at(out, i));
    }
}
END_TEST

/* A -0.0 residual stays -0.0 (no code emitted, nothing subtracted). */
START_TEST(test_negative_zero_kept)
{
    float grad[1] = {-0.0f}, residual[1] = {-0.0f};
    uint32_t out[1];
    dshim_twobit_quantize(grad, residual, 1, 0.5f, out);
    ck_assert_uint_eq(out[0], 0);
    ck_assert_uint_eq(f2u(residual[0]), f2u(-0.0f));
}
END_TEST

/* Lengths around the block size: the last word holds only the real values. */
START_TEST(test_tails)
{
    const size_t sizes[] = {1, 2, 3, 4, 5, 15, 16, 17, 31, 33, 47, 100};
    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
        size_t n = sizes[s], w = dshim_twobit_words(n);
        float grad[100], residual[100] = {0};
        for (size_t i = 0; i < n; i++) {
            grad[i] = (i % 3 == 0) ? 1.0f : (i % 3 == 1 ? -1.0f : 0.25f);
        }
        uint32_t out[8];
        for (int i = 0; i < 8; i++) {
            out[i] = 0xa5a5a5a5u;
        }
        dshim_twobit_quantize(grad, residual, n, 0.5f, out);
        for (size_t i = 0; i < 16 * w; i++) {
            unsigned want = i >= n ? 0u : (i % 3 == 0 ? 3u : (i % 3 == 1 ? 2u : 0u));
            EXPECT(code_at(out, i) == want, "n=%zu value %zu: code %u, want %u", n, i,
                   code_at(out, i), want);
        }
        EXPECT(out[w] == 0xa5a5a5a5u, "n=%zu: word %zu written", n, w);
        float deq[101];
        deq[n] = 42.0f;
        dshim_twobit_dequantize(out, n, 0.5f, deq);
        for (size_t i = 0; i < n; i++) {
            float want = i % 3 == 0 ? 0.5f : (i % 3 == 1 ? -0.5f : 0.0f);
            EXPECT(f2u(deq[i]) == f2u(want), "n=%zu deq[%zu] %g, want %g", n, i, deq[i], want);
        }
        EXPECT(deq[n] == 42.0f, "n=%zu: dequantize wrote past n", n);
    }
}
END_TEST

START_TEST(test_empty)
{
    uint32_t out[1] = {0x12345678u};
    float residual[1] = {7.0f}, deq[1] = {9.0f};
    dshim_twobit_quantize(NULL, residual, 0, 0.5f, out);
    ck_assert_uint_eq(out[0], 0x12345678u);
    ck_assert(residual[0] == 7.0f);
    dshim_twobit_dequantize(out, 0, 0.5f, deq);
    ck_assert(deq[0] == 9.0f);
}
END_TEST

/* Error feedback: 0.4 per call against threshold 1 emits on the 3rd call (1.2 -> 0.2),
 * then again when the residual next reaches 1. */
START_TEST(test_residual_carry)
{
    const float t = 1.0f;
    float grad[2] = {0.4f, -0.4f}, residual[2] = {0}, r = 0.0f, rn = 0.0f;
    for (int call = 1; call <= 10; call++) {
        uint32_t out[1];
        dshim_twobit_quantize(grad, residual, 2, t, out);
        r += 0.4f;
        rn += -0.4f;
        unsigned want = 0;
        if (r >= t) {
            r -= t;
            rn -= -t;  /* mirrors r, except that it reaches +0 where r does too */
            want = 3;
        }
        EXPECT(code_at(out, 0) == want, "call %d: code %u, want %u", call, code_at(out, 0), want);
        EXPECT(code_at(out, 1) == (want ? 2u : 0u), "call %d: negative code %u", call,
               code_at(out, 1));
        EXPECT(f2u(residual[0]) == f2u(r), "call %d: residual %a, want %a", call, residual[0], r);
        EXPECT(f2u(residual[1]) == f2u(rn), "call %d: residual %a, want %a", call, residual[1],
               rn);
    }
    /* calls 3, 5, 8, 10 emitted: 10 * 0.4 = 4 thresholds, residual back near 0 */
    ck_assert(fabsf(residual[0]) < 1e-5f);
}
END_TEST

/* MXNet's compares: NaN matches neither (code 0, the residual stays NaN for good);
 * +inf emits +threshold and stays inf (inf - t), -inf likewise. */
START_TEST(test_nan_inf)
{
    float grad[4] = {NAN, INFINITY, -INFINITY, 1.0f};
    float residual[4] = {0.0f, 0.0f, 0.0f, INFINITY};
    uint32_t out[1];
    dshim_twobit_quantize(grad, residual, 4, 0.5f, out);
    ck_assert_uint_eq(code_at(out, 0), 0);
    ck_assert_uint_eq(code_at(out, 1), 3);
    ck_assert_uint_eq(code_at(out, 2), 2);
    ck_assert_uint_eq(code_at(out, 3), 3);
    ck_assert(isnan(residual[0]));
    ck_assert(isinf(residual[1]) && residual[1] > 0);
    ck_assert(isinf(residual[2]) && residual[2] < 0);
    ck_assert(isinf(residual[3]) && residual[3] > 0);
    /* next call with zero gradient: the same codes again; inf + -inf = NaN -> 0 */
    float zero[4] = {0.0f, 0.0f, 0.0f, -INFINITY};
    dshim_twobit_quantize(zero, residual, 4, 0.5f, out);
    ck_assert_uint_eq(code_at(out, 0), 0);
    ck_assert_uint_eq(code_at(out, 1), 3);
    ck_assert_uint_eq(code_at(out, 2), 2);
    ck_assert_uint_eq(code_at(out, 3), 0);
    ck_assert(isnan(residual[0]) && isnan(residual[3]));
    /* an infinite threshold: only +-inf emit */
    float big[3] = {3e38f, INFINITY, -INFINITY}, res3[3] = {0};
    dshim_twobit_quantize(big, res3, 3, INFINITY, out);
    ck_assert_uint_eq(code_at(out, 0), 0);
    ck_assert_uint_eq(code_at(out, 1), 3);
    ck_assert_uint_eq(code_at(out, 2), 2);
    ck_assert(isnan(res3[1]) && isnan(res3[2]));  /* inf - inf */
}
END_TEST

/* A threshold of 0 (MXNet's parser forbids it, the kernel does not): 0 >= 0 emits +0,
 * but only for real values, not for a partial block's missing ones. */
START_TEST(test_zero_threshold)
{
    float grad[3] = {0.0f, -1.0f, 2.0f}, residual[3] = {0};
    uint32_t out[1];
    dshim_twobit_quantize(grad, residual, 3, 0.0f, out);
    ck_assert_uint_eq(code_at(out, 0), 3);
    ck_assert_uint_eq(code_at(out, 1), 2);
    ck_assert_uint_eq(code_at(out, 2), 3);
    for (size_t i = 3; i < 16; i++) {
        EXPECT(code_at(out, i) == 0, "missing value %zu has code %u", i, code_at(out, i));
    }
}
END_TEST

/* Dequantize reads all four codes: 11 +t, 10 -t, 01 and 00 give +0.0f. */
START_TEST(test_dequantize_codes)
{
    uint8_t bytes[8] = {0xe4, 0x1b, 0x00, 0xff, 0xaa, 0x55, 0xc3, 0x3c};  /* 11 10 01 00 ... */
    uint32_t in[2];
    memcpy(in, bytes, 8);
    float out[32], ref[32];
    dshim_twobit_dequantize(in, 32, 0.75f, out);
    ref_dequantize(bytes, 32, 0.75f, ref);
    const float t = 0.75f;
    const float want_first[8] = {t, -t, 0.0f, 0.0f, 0.0f, 0.0f, -t, t};
    for (int i = 0; i < 8; i++) {
        EXPECT(f2u(out[i]) == f2u(want_first[i]), "out[%d] %g, want %g", i, out[i],
               want_first[i]);
    }
    for (int i = 0; i < 32; i++) {
        EXPECT(f2u(out[i]) == f2u(ref[i]), "out[%d] %g, reference %g", i, out[i], ref[i]);
    }
}
END_TEST

/* ---- codec: random data against the reference -------------------------- */

static float random_value(float t)
{
    uint64_t r = rng();
    switch (r % 16) {
    case 0: return t;
    case 1: return -t;
    case 2: return nextafterf(t, 0.0f);
    case 3: return nextafterf(-t, 0.0f);
    case 4: return 0.0f;
    case 5: return -0.0f;
    case 6: return 1e-40f;  /* subnormal */
    case 7: return (r >> 8) % 64 == 0 ? NAN : 2.5f * t;
    default: return ((float)((r >> 11) % 2000001) / 1000000.0f - 1.0f) * 2.0f * t;
    }
}

START_TEST(test_random_vs_reference)
{
    const size_t sizes[] = {1, 7, 16, 31, 64, 1000, 4099};
    const float thresholds[] = {0.5f, 1e-3f, 3.0f, 0.1f};
    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
        size_t n = sizes[s], w = dshim_twobit_words(n);
        float *grad = malloc(n * sizeof(float));
        float *res = calloc(n, sizeof(float)), *res_ref = calloc(n, sizeof(float));
        uint32_t *out = malloc(w * 4);
        uint8_t *out_ref = malloc(w * 4);
        float *deq = malloc(n * sizeof(float)), *deq_ref = malloc(n * sizeof(float));
        ck_assert(grad && res && res_ref && out && out_ref && deq && deq_ref);
        for (size_t ti = 0; ti < 4; ti++) {
            float t = thresholds[ti];
            for (int call = 0; call < 5; call++) {  /* residuals carried across calls */
                for (size_t i = 0; i < n; i++) {
                    grad[i] = random_value(t);
                }
                dshim_twobit_quantize(grad, res, n, t, out);
                ref_quantize(grad, res_ref, n, t, out_ref);
                EXPECT(memcmp(out, out_ref, w * 4) == 0, "n=%zu t=%g call %d: codes differ", n,
                       t, call);
                EXPECT(memcmp(res, res_ref, n * 4) == 0, "n=%zu t=%g call %d: residuals differ",
                       n, t, call);
                dshim_twobit_dequantize(out, n, t, deq);
                ref_dequantize(out_ref, n, t, deq_ref);
                EXPECT(memcmp(deq, deq_ref, n * 4) == 0, "n=%zu t=%g: dequantized differ", n, t);
            }
        }
        free(grad);
        free(res);
        free(res_ref);
        free(out);
        free(out_ref);
        free(deq);
        free(deq_ref);
    }
}
END_TEST

/* ---- parameters ---------------------------------------------------------- */

static int parse2(const char *k1, const char *v1, const char *k2, const char *v2, float *t)
{
    const char *keys[2] = {k1, k2}, *vals[2] = {v1, v2};
    int enabled = -1;
    *t = -1.0f;
    int st = dshim_twobit_parse(k2 ? 2 : 1, keys, vals, t, &enabled);
    if (st == DSHIM_OK) {
        ck_assert_int_eq(enabled, 1);
    }
    return st;
}

START_TEST(test_parse_valid)
{
    float t;
    ck_assert_int_eq(parse2("type", "2bit", NULL, NULL, &t), DSHIM_OK);
    ck_assert(t == 0.5f);  /* MXNet's default */
    ck_assert_int_eq(parse2("type", "2bit", "threshold", "1", &t), DSHIM_OK);
    ck_assert(t == 1.0f);
    ck_assert_int_eq(parse2("threshold", "0.25", "type", "2bit", &t), DSHIM_OK);
    ck_assert(t == 0.25f);
    ck_assert_int_eq(parse2("type", "2bit", "threshold", " \t+2.5f", &t), DSHIM_OK);
    ck_assert(t == 2.5f);
    ck_assert_int_eq(parse2("type", "2bit", "threshold", "1e-3", &t), DSHIM_OK);
    ck_assert(t == 1.0f / 1000.0f);
    ck_assert_int_eq(parse2("type", "2bit", "threshold", "5E+2", &t), DSHIM_OK);
    ck_assert(t == 500.0f);
    ck_assert_int_eq(parse2("type", "2bit", "threshold", "Infinity", &t), DSHIM_OK);
    ck_assert(isinf(t) && t > 0);
    ck_assert_int_eq(parse2("type", "2bit", "threshold", ".5", &t), DSHIM_OK);
    ck_assert(t == 0.5f);
    /* dmlc's float steps, not strtof: 1.5e-12 = 1.5f / (1e8f * 10 * 10 * 10 * 10) */
    ck_assert_int_eq(parse2("type", "2bit", "threshold", "1.5e-12", &t), DSHIM_OK);
    float scale = 1e8f;
    for (int i = 0; i < 4; i++) {
        scale *= 10.0f;
    }
    ck_assert_uint_eq(f2u(t), f2u(1.5f / scale));
    /* unknown keys are ignored, a repeated key counts last */
    const char *keys[4] = {"type", "threshold", "compress_bits", "threshold"};
    const char *vals[4] = {"2bit", "7", "whatever", "0.125"};
    int enabled = 0;
    ck_assert_int_eq(dshim_twobit_parse(4, keys, vals, &t, &enabled), DSHIM_OK);
    ck_assert(t == 0.125f && enabled == 1);
}
END_TEST

static void expect_parse_error(const char *k1, const char *v1, const char *k2, const char *v2,
                               const char *needle)
{
    float t;
    ck_assert_int_eq(parse2(k1, v1, k2, v2, &t), DSHIM_ERR_INVALID);
    ck_assert(t == -1.0f);  /* outputs untouched */
    ck_assert_msg(strstr(dshim_last_error(), needle) != NULL, "%s=%s %s=%s: '%s' lacks '%s'",
                  k1, v1, k2 ? k2 : "", v2 ? v2 : "", dshim_last_error(), needle);
    ck_assert_ptr_null(strchr(dshim_last_error(), '\n'));
}

START_TEST(test_parse_errors)
{
    expect_parse_error("threshold", "0.5", NULL, NULL, "no 'type'");
    expect_parse_error("type", "none", NULL, NULL, "unknown type 'none'");
    expect_parse_error("type", "1bit", "threshold", "0.5", "unknown type '1bit'");
    expect_parse_error("type", "2BIT", NULL, NULL, "unknown type");
    expect_parse_error("type", "2bit", "threshold", "0", "greater than 0");
    expect_parse_error("type", "2bit", "threshold", "-0.5", "greater than 0");
    expect_parse_error("type", "2bit", "threshold", "-0", "greater than 0");
    expect_parse_error("type", "2bit", "threshold", "nan", "greater than 0");
    /* dmlc reads 19 decimals only: this is 0 */
    expect_parse_error("type", "2bit", "threshold", "0.00000000000000000001", "greater than 0");
    expect_parse_error("type", "2bit", "threshold", "1e-50", "out of float's range");
    expect_parse_error("type", "2bit", "threshold", "", "not a float");
    expect_parse_error("type", "2bit", "threshold", "abc", "not a float");
    expect_parse_error("type", "2bit", "threshold", "nan(x", "not a float");
    expect_parse_error("type", "2bit", "threshold", "0.5 ", "trailing characters ' '");
    expect_parse_error("type", "2bit", "threshold", "0,5", "trailing characters ',5'");
    expect_parse_error("type", "2bit", "threshold", "  abc", "trailing characters 'abc'");
    expect_parse_error("type", "2bit", "threshold", "1e39", "out of float's range");
    expect_parse_error("type", "2bit", "threshold", "4e38", "out of float's range");
    /* the threshold check comes before the type check, as in MXNet */
    expect_parse_error("type", "none", "threshold", "-1", "greater than 0");
    expect_parse_error("type", NULL, NULL, NULL, "NULL key or value");
    float t;
    int enabled;
    ck_assert_int_eq(dshim_twobit_parse(1, NULL, NULL, &t, &enabled), DSHIM_ERR_INVALID);
    ck_assert_int_eq(dshim_twobit_parse(0, NULL, NULL, &t, &enabled), DSHIM_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(dshim_last_error(), "no 'type'"));
}
END_TEST

START_TEST(test_encode_decode)
{
    char buf[DSHIM_TWOBIT_PARAMS_MAX];
    ck_assert_int_eq(dshim_twobit_encode_params(1, 0.5f, buf, sizeof(buf)), 10);
    ck_assert_str_eq(buf, "1,0.500000");
    ck_assert_int_eq(dshim_twobit_encode_params(0, 0.5f, buf, sizeof(buf)), 1);
    ck_assert_str_eq(buf, "0");
    ck_assert_int_eq(dshim_twobit_encode_params(1, 0.1f, buf, sizeof(buf)), 10);
    ck_assert_str_eq(buf, "1,0.100000");
    ck_assert_int_eq(dshim_twobit_encode_params(1, 3.4028235e38f, buf, sizeof(buf)), 48);
    ck_assert_int_eq(dshim_twobit_encode_params(1, 0.5f, buf, 10), DSHIM_ERR_INVALID);

    float t = 9.0f;
    int enabled = -1;
    ck_assert_int_eq(dshim_twobit_decode_params("1,0.500000", &t, &enabled), DSHIM_OK);
    ck_assert(t == 0.5f && enabled == 1);
    t = 9.0f;
    ck_assert_int_eq(dshim_twobit_decode_params("0", &t, &enabled), DSHIM_OK);
    ck_assert(t == 9.0f && enabled == 0);  /* no threshold: the previous one stays */
    ck_assert_int_eq(dshim_twobit_decode_params("1,", &t, &enabled), DSHIM_OK);
    ck_assert(t == 9.0f && enabled == 1);
    ck_assert_int_eq(dshim_twobit_decode_params("1,,0.3", &t, &enabled), DSHIM_OK);
    ck_assert(t == 9.0f);
    ck_assert_int_eq(dshim_twobit_decode_params(" 1x,0.25junk", &t, &enabled), DSHIM_OK);
    ck_assert(t == 0.25f && enabled == 1);  /* stoi/stof ignore what follows the number */

    const char *bad[] = {"", "x", ",0.5", "2,0.5", "-1", "1,abc", "1,1e39", "99999999999"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        t = 9.0f;
        enabled = -1;
        EXPECT(dshim_twobit_decode_params(bad[i], &t, &enabled) == DSHIM_ERR_INVALID,
               "'%s' accepted", bad[i]);
        EXPECT(t == 9.0f && enabled == -1, "'%s': outputs changed", bad[i]);
    }
    ck_assert_int_eq(dshim_twobit_decode_params(NULL, &t, &enabled), DSHIM_ERR_INVALID);
}
END_TEST

/* What a MXNet 'dist' server dequantizes with: "%f" of the worker's threshold, re-read. */
START_TEST(test_server_threshold)
{
    ck_assert(dshim_twobit_server_threshold(0.5f) == 0.5f);
    ck_assert(dshim_twobit_server_threshold(0.1f) == 0.1f);
    ck_assert(dshim_twobit_server_threshold(1e-7f) == 0.0f);
    ck_assert(dshim_twobit_server_threshold(0.123456789f) == 0.123457f);
    ck_assert(dshim_twobit_server_threshold(2e-6f) == 0.000002f);
    ck_assert(isinf(dshim_twobit_server_threshold(INFINITY)));
}
END_TEST

static Suite *twobit_suite(void)
{
    Suite *su = suite_create("ps_twobit");
    TCase *tc = tcase_create("codec");
    tcase_add_test(tc, test_words);
    tcase_add_test(tc, test_layout_from_mxnet);
    tcase_add_test(tc, test_layout_each_position);
    tcase_add_test(tc, test_threshold_edges);
    tcase_add_test(tc, test_negative_zero_kept);
    tcase_add_test(tc, test_tails);
    tcase_add_test(tc, test_empty);
    tcase_add_test(tc, test_residual_carry);
    tcase_add_test(tc, test_nan_inf);
    tcase_add_test(tc, test_zero_threshold);
    tcase_add_test(tc, test_dequantize_codes);
    tcase_add_test(tc, test_random_vs_reference);
    suite_add_tcase(su, tc);
    TCase *tp = tcase_create("params");
    tcase_add_test(tp, test_parse_valid);
    tcase_add_test(tp, test_parse_errors);
    tcase_add_test(tp, test_encode_decode);
    tcase_add_test(tp, test_server_threshold);
    suite_add_tcase(su, tp);
    return su;
}

int main(void)
{
    SRunner *sr = srunner_create(twobit_suite());
    srunner_run_all(sr, CK_ENV);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

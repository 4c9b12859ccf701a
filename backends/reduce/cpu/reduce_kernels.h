/*
 * Internal to the CPU reduction backend: the per-ISA kernel table, and the
 * element conversions shared by the kernels and convert.c.
 *
 * The conversions live here as static inline functions (not in convert.c)
 * because the kernels must inline them to vectorise; convert.c wraps the very
 * same code, so the public scalar conversions and every kernel agree bit for
 * bit.  They use only integer operations and IEEE float32 operations whose
 * results are exact or correctly rounded in the default rounding mode, so the
 * compiler may vectorise them at any width without changing a bit.
 */
#ifndef DSHIM_REDUCE_KERNELS_H
#define DSHIM_REDUCE_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "dshim.h"

/* dst[i] = op(a[i], b[i]); dst may equal a or b. */
typedef void (*dshim_reduce_kernel_fn)(void *dst, const void *a, const void *b, size_t count);
/* buf[i] = buf[i] / divisor, divisor >= 1. */
typedef void (*dshim_scale_kernel_fn)(void *buf, size_t count, int divisor);

typedef struct dshim_reduce_kernels {
    const char *isa;
    dshim_reduce_kernel_fn reduce[DSHIM_DTYPE_COUNT][DSHIM_REDOP_COUNT];
    dshim_scale_kernel_fn scale_div[DSHIM_DTYPE_COUNT];
} dshim_reduce_kernels_t;

/* One table per compilation of reduce_kernels.inc.c. */
extern const dshim_reduce_kernels_t dshim_reduce_kernels_scalar;
extern const dshim_reduce_kernels_t dshim_reduce_kernels_avx2;
extern const dshim_reduce_kernels_t dshim_reduce_kernels_avx512;

static inline uint32_t dshim_rk_f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

static inline float dshim_rk_u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/*
 * cond ? a : b (cond is 0 or 1) as mask arithmetic.  A ternary would let the
 * compiler move the float operation feeding one arm into a branch, and with
 * -ftrapping-math it then refuses to vectorise a loop whose float operation
 * is conditional; masks keep every operation unconditional.  The xor form
 * (rather than (a & m) | (b & ~m)) uses b twice, which keeps AVX-512 code
 * from folding b's computation, loads included, into a zero-masked
 * instruction: zero-masked loads stream from DRAM at a third of the speed on
 * the Zen 5 this was measured on.
 */
static inline uint32_t dshim_rk_sel(uint32_t cond, uint32_t a, uint32_t b)
{
    uint32_t m = 0u - cond;
    return b ^ ((b ^ a) & m);
}

/*
 * float16 -> float32, exact.  A NaN gets its quiet bit set, as F16C's
 * vcvtph2ps does, so the scalar and the F16C kernels widen identically.
 */
static inline float dshim_rk_half_to_float(uint16_t h)
{
    uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
    uint32_t ah = (uint32_t)h & 0x7fffu;
    uint32_t normal = (ah << 13) + 0x38000000u; /* rebias exponent 15 -> 127 */
    uint32_t special = 0x7f800000u | ((ah & 0x3ffu) << 13) | (ah > 0x7c00u ? 0x400000u : 0u);
    /* subnormal: mantissa * 2^-24, exact in float32 */
    uint32_t sub = dshim_rk_f2u((float)(int32_t)ah * 0x1p-24f);
    uint32_t r = dshim_rk_sel(ah >= 0x7c00u, special, dshim_rk_sel(ah >= 0x400u, normal, sub));
    return dshim_rk_u2f(sign | r);
}

/*
 * float32 -> float16, round to nearest even; overflow -> inf; NaN -> quiet NaN
 * keeping the top payload bits (what vcvtps2ph does).  Subnormal results come
 * from adding 0.5f: the float32 ulp at 0.5 is 2^-24, the float16 subnormal
 * step, so the hardware's own RNE rounds the mantissa for us.
 */
static inline uint16_t dshim_rk_float_to_half(float f)
{
    uint32_t x = dshim_rk_f2u(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    uint32_t normal = (ax + 0xfffu + ((ax >> 13) & 1u) - 0x38000000u) >> 13;
    uint32_t sub = dshim_rk_f2u(dshim_rk_u2f(ax) + 0.5f) - 0x3f000000u;
    uint32_t nan = 0x7e00u | ((ax >> 13) & 0x3ffu);
    uint32_t r = dshim_rk_sel(ax >= 0x38800000u, normal, sub); /* >= 2^-14 */
    r = dshim_rk_sel(ax >= 0x477ff000u, 0x7c00u, r);             /* >= 65520 rounds past 65504 */
    r = dshim_rk_sel(ax > 0x7f800000u, nan, r);
    return (uint16_t)(sign | r);
}

/* bfloat16 -> float32 is a shift; signalling NaNs stay as they are. */
static inline float dshim_rk_bf16_to_float(uint16_t b)
{
    return dshim_rk_u2f((uint32_t)b << 16);
}

/* float32 -> bfloat16, round to nearest even; NaN -> quiet NaN, top payload kept. */
static inline uint16_t dshim_rk_float_to_bf16(float f)
{
    uint32_t x = dshim_rk_f2u(f);
    uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    uint32_t nan = (x >> 16) | 0x40u;
    return (uint16_t)((x & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

/* fp8 e4m3fn -> float32, exact; the NaN (S.1111.111) becomes a quiet NaN. */
static inline float dshim_rk_e4m3_to_float(uint8_t v)
{
    uint32_t sign = ((uint32_t)v & 0x80u) << 24;
    uint32_t m = (uint32_t)v & 0x7fu;
    uint32_t normal = (m << 20) + 0x3c000000u; /* rebias exponent 7 -> 127 */
    uint32_t sub = dshim_rk_f2u((float)(int32_t)m * 0x1p-9f);
    uint32_t r = dshim_rk_sel(m == 0x7fu, 0x7ff00000u, dshim_rk_sel(m >= 8u, normal, sub));
    return dshim_rk_u2f(sign | r);
}

/*
 * float32 -> fp8 e4m3fn: RNE; e4m3fn has no infinity, so anything at or above
 * 448 in magnitude (inf included) saturates to +-448; NaN -> 0x7f.  Subnormals
 * via adding 2^14, whose float32 ulp is 2^-9, the e4m3 subnormal step.
 */
static inline uint8_t dshim_rk_float_to_e4m3(float f)
{
    uint32_t x = dshim_rk_f2u(f);
    uint32_t sign = (x >> 24) & 0x80u;
    uint32_t ax = x & 0x7fffffffu;
    uint32_t normal = (ax + 0x7ffffu + ((ax >> 20) & 1u) - 0x3c000000u) >> 20;
    uint32_t sub = dshim_rk_f2u(dshim_rk_u2f(ax) + 16384.0f) - 0x46800000u;
    uint32_t r = dshim_rk_sel(ax >= 0x3c800000u, normal, sub); /* >= 2^-6 */
    r = dshim_rk_sel(ax >= 0x43e00000u, 0x7eu, r);               /* >= 448 */
    return (uint8_t)dshim_rk_sel(ax > 0x7f800000u, 0x7fu, sign | r);
}

/* fp8 e5m2 is the top byte of a float16. */
static inline float dshim_rk_e5m2_to_float(uint8_t v)
{
    return dshim_rk_half_to_float((uint16_t)((uint32_t)v << 8));
}

/* float32 -> fp8 e5m2: RNE, overflow -> inf, NaN -> quiet NaN.  Subnormals
 * via adding 128.0f, whose float32 ulp is 2^-16, the e5m2 subnormal step. */
static inline uint8_t dshim_rk_float_to_e5m2(float f)
{
    uint32_t x = dshim_rk_f2u(f);
    uint32_t sign = (x >> 24) & 0x80u;
    uint32_t ax = x & 0x7fffffffu;
    uint32_t normal = (ax + 0xfffffu + ((ax >> 21) & 1u) - 0x38000000u) >> 21;
    uint32_t sub = dshim_rk_f2u(dshim_rk_u2f(ax) + 128.0f) - 0x43000000u;
    uint32_t nan = 0x7eu | ((ax >> 21) & 0x3u);
    uint32_t r = dshim_rk_sel(ax >= 0x38800000u, normal, sub); /* >= 2^-14 */
    r = dshim_rk_sel(ax >= 0x47700000u, 0x7cu, r);               /* >= 61440 rounds past 57344 */
    r = dshim_rk_sel(ax > 0x7f800000u, nan, r);
    return (uint8_t)(sign | r);
}

#endif

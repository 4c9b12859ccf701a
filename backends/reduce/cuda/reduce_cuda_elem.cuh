/*
 * Element operations of the CUDA reduction backend, __host__ __device__ so
 * that the same code can be checked on the host against the CPU backend.
 *
 * They must give the bits of backends/reduce/cpu (reduce_kernels.h and
 * reduce_kernels.inc.c), which are x86's bits.  Non-NaN arithmetic agrees by
 * itself: single IEEE float32/float64 operations in round-to-nearest-even
 * with subnormals (built with -fmad=false -ftz=false -prec-div=true, so no
 * contraction, no flushing, correctly rounded division).  NaNs do not: a GPU
 * returns one canonical NaN (0x7fffffff) from any operation, where x86
 * returns the first NaN operand quietened, or its "default NaN" (sign set,
 * 0xffc00000) when the operation itself creates one (inf - inf, 0 * inf).
 * rc_nan_f32/f64 put x86's answer back, deciding from the operands only, so
 * the result never depends on what the hardware did with the NaN.
 *
 * The fp8 and bfloat16 conversions repeat the integer code of
 * reduce_kernels.h (which is plain C, not callable from device code): fp8
 * has no hardware conversion with these saturation and NaN rules, and the
 * bfloat16 rounding is four integer operations.  float16 uses the hardware
 * conversion (one instruction each way), exact or correctly rounded like the
 * CPU's, with the NaN cases rewritten to the CPU's bits.
 */
#ifndef DSHIM_REDUCE_CUDA_ELEM_CUH
#define DSHIM_REDUCE_CUDA_ELEM_CUH

#include <cuda_fp16.h>
#include <stdint.h>
#include <string.h>

#define RC_HD __host__ __device__ __forceinline__

RC_HD uint32_t rc_f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

RC_HD float rc_u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

RC_HD uint64_t rc_d2u(double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof(u));
    return u;
}

RC_HD double rc_u2d(uint64_t u)
{
    double d;
    memcpy(&d, &u, sizeof(d));
    return d;
}

/* ---- NaN rules of x86 (see the top of this file) ------------------------- */

RC_HD float rc_nan_f32(float r, float a, float b)
{
    if (a != a) {
        return rc_u2f(rc_f2u(a) | 0x400000u);
    }
    if (b != b) {
        return rc_u2f(rc_f2u(b) | 0x400000u);
    }
    return r != r ? rc_u2f(0xffc00000u) : r;
}

RC_HD double rc_nan_f64(double r, double a, double b)
{
    const uint64_t quiet = (uint64_t)1 << 51;
    if (a != a) {
        return rc_u2d(rc_d2u(a) | quiet);
    }
    if (b != b) {
        return rc_u2d(rc_d2u(b) | quiet);
    }
    return r != r ? rc_u2d(0xfff8000000000000ull) : r;
}

/* ---- narrow float conversions ------------------------------------------- */

/* float16 -> float32: exact; a NaN keeps its payload and gets the quiet bit. */
RC_HD float rc_half_to_float(uint16_t h)
{
    uint32_t ah = (uint32_t)h & 0x7fffu;
    if (ah > 0x7c00u) {
        return rc_u2f((((uint32_t)h & 0x8000u) << 16) | 0x7fc00000u | ((ah & 0x3ffu) << 13));
    }
    __half_raw raw;
    raw.x = h;
    return __half2float(__half(raw));
}

/* float32 -> float16: RNE, overflow -> inf; NaN -> quiet NaN keeping the
 * sign and the top ten payload bits. */
RC_HD uint16_t rc_float_to_half(float f)
{
    uint32_t x = rc_f2u(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) {
        return (uint16_t)(((x >> 16) & 0x8000u) | 0x7e00u | ((x >> 13) & 0x3ffu));
    }
    __half_raw raw = __half_raw(__float2half_rn(f));
    return raw.x;
}

RC_HD float rc_bf16_to_float(uint16_t b)
{
    return rc_u2f((uint32_t)b << 16);
}

/* float32 -> bfloat16, RNE.  Only results of rc_nan_f32 and of arithmetic
 * reach it, so a NaN has its quiet bit set and zero low 16 bits (bfloat16
 * operands, or the default NaN): plain rounding leaves it as it is. */
RC_HD uint16_t rc_bf16_round(float f)
{
    uint32_t x = rc_f2u(f);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/* fp8 e4m3fn -> float32, exact; the NaN (S.1111.111) becomes a quiet NaN. */
RC_HD float rc_e4m3_to_float(uint8_t v)
{
    uint32_t sign = ((uint32_t)v & 0x80u) << 24;
    uint32_t m = (uint32_t)v & 0x7fu;
    uint32_t r;
    if (m == 0x7fu) {
        r = 0x7ff00000u;
    } else if (m >= 8u) {
        r = (m << 20) + 0x3c000000u; /* rebias exponent 7 -> 127 */
    } else {
        r = rc_f2u((float)(int32_t)m * 0x1p-9f); /* subnormal, exact */
    }
    return rc_u2f(sign | r);
}

/* float32 -> fp8 e4m3fn: RNE, |x| >= 448 (inf too) saturates to +-448, NaN ->
 * 0x7f.  Subnormals by adding 2^14, whose float32 ulp is the e4m3 step 2^-9. */
RC_HD uint8_t rc_float_to_e4m3(float f)
{
    uint32_t x = rc_f2u(f);
    uint32_t sign = (x >> 24) & 0x80u;
    uint32_t ax = x & 0x7fffffffu;
    uint32_t r;
    if (ax > 0x7f800000u) {
        return 0x7fu;
    }
    if (ax >= 0x43e00000u) {
        r = 0x7eu;
    } else if (ax >= 0x3c800000u) {
        r = (ax + 0x7ffffu + ((ax >> 20) & 1u) - 0x3c000000u) >> 20;
    } else {
        r = rc_f2u(rc_u2f(ax) + 16384.0f) - 0x46800000u;
    }
    return (uint8_t)(sign | r);
}

/* fp8 e5m2 is the top byte of a float16. */
RC_HD float rc_e5m2_to_float(uint8_t v)
{
    return rc_half_to_float((uint16_t)((uint32_t)v << 8));
}

/* float32 -> fp8 e5m2: RNE, overflow -> inf, NaN -> quiet NaN.  Subnormals
 * by adding 128, whose float32 ulp is the e5m2 step 2^-16. */
RC_HD uint8_t rc_float_to_e5m2(float f)
{
    uint32_t x = rc_f2u(f);
    uint32_t sign = (x >> 24) & 0x80u;
    uint32_t ax = x & 0x7fffffffu;
    uint32_t r;
    if (ax > 0x7f800000u) {
        r = 0x7eu | ((ax >> 21) & 0x3u);
    } else if (ax >= 0x47700000u) {
        r = 0x7cu;
    } else if (ax >= 0x38800000u) {
        r = (ax + 0xfffffu + ((ax >> 21) & 1u) - 0x38000000u) >> 21;
    } else {
        r = rc_f2u(rc_u2f(ax) + 128.0f) - 0x43000000u;
    }
    return (uint8_t)(sign | r);
}

/* ---- element operations: one struct per (type class, op) ----------------- */

/* Integers wrap in the unsigned type; signed types share these (the low bits
 * of a two's complement sum or product do not depend on signedness). */
template <typename T> struct rc_isum {
    static RC_HD T apply(T a, T b) { return (T)(a + b); }
};
template <typename T> struct rc_iprod {
    static RC_HD T apply(T a, T b) { return (T)(a * b); }
};
/* min/max compare in the element's own type; ties keep a */
template <typename T> struct rc_imin {
    static RC_HD T apply(T a, T b) { return b < a ? b : a; }
};
template <typename T> struct rc_imax {
    static RC_HD T apply(T a, T b) { return b > a ? b : a; }
};

/* float32/float64 */
template <typename T> struct rc_fsum;
template <> struct rc_fsum<float> {
    static RC_HD float apply(float a, float b) { return rc_nan_f32(a + b, a, b); }
};
template <> struct rc_fsum<double> {
    static RC_HD double apply(double a, double b) { return rc_nan_f64(a + b, a, b); }
};
template <typename T> struct rc_fprod;
template <> struct rc_fprod<float> {
    static RC_HD float apply(float a, float b) { return rc_nan_f32(a * b, a, b); }
};
template <> struct rc_fprod<double> {
    static RC_HD double apply(double a, double b) { return rc_nan_f64(a * b, a, b); }
};
/* NaN-propagating, bits kept as they are (a selection, no arithmetic): b
 * replaces a only when strictly better or when b is the only NaN. */
template <typename T> struct rc_fmin {
    static RC_HD T apply(T a, T b) { return (b < a || (b != b && a == a)) ? b : a; }
};
template <typename T> struct rc_fmax {
    static RC_HD T apply(T a, T b) { return (b > a || (b != b && a == a)) ? b : a; }
};

/* Narrow float min/max on the bits: sign-applied magnitude orders like the
 * value (+0 and -0 both 0); NaN iff magnitude > NAN_ABOVE. */
template <typename T, typename ST, uint32_t MAG, uint32_t NAN_ABOVE> struct rc_nkey {
    static RC_HD int nan(T v) { return ((uint32_t)v & MAG) > NAN_ABOVE; }
    static RC_HD ST key(T v)
    {
        ST m = (ST)((uint32_t)v & MAG);
        return ((uint32_t)v & ~MAG & 0xffffu) ? (ST)-m : m;
    }
};
template <typename T, typename K> struct rc_nmin {
    static RC_HD T apply(T a, T b)
    {
        return (!K::nan(a) && (K::nan(b) || K::key(b) < K::key(a))) ? b : a;
    }
};
template <typename T, typename K> struct rc_nmax {
    static RC_HD T apply(T a, T b)
    {
        return (!K::nan(a) && (K::nan(b) || K::key(b) > K::key(a))) ? b : a;
    }
};
typedef rc_nkey<uint16_t, int16_t, 0x7fffu, 0x7c00u> rc_key_f16;
typedef rc_nkey<uint16_t, int16_t, 0x7fffu, 0x7f80u> rc_key_bf16;
typedef rc_nkey<uint8_t, int8_t, 0x7fu, 0x7eu> rc_key_e4m3;
typedef rc_nkey<uint8_t, int8_t, 0x7fu, 0x7cu> rc_key_e5m2;

/* Narrow float sum/prod: widen both, combine in float32, round once. */
struct rc_cvt_f16 {
    typedef uint16_t T;
    static RC_HD float widen(T v) { return rc_half_to_float(v); }
    static RC_HD T narrow(float f) { return rc_float_to_half(f); }
};
struct rc_cvt_bf16 {
    typedef uint16_t T;
    static RC_HD float widen(T v) { return rc_bf16_to_float(v); }
    static RC_HD T narrow(float f) { return rc_bf16_round(f); }
};
struct rc_cvt_e4m3 {
    typedef uint8_t T;
    static RC_HD float widen(T v) { return rc_e4m3_to_float(v); }
    static RC_HD T narrow(float f) { return rc_float_to_e4m3(f); }
};
struct rc_cvt_e5m2 {
    typedef uint8_t T;
    static RC_HD float widen(T v) { return rc_e5m2_to_float(v); }
    static RC_HD T narrow(float f) { return rc_float_to_e5m2(f); }
};
template <typename C, typename F> struct rc_nfused {
    typedef typename C::T T;
    static RC_HD T apply(T a, T b) { return C::narrow(F::apply(C::widen(a), C::widen(b))); }
};

/* ---- scale_div (AVG): x / divisor, divisor >= 2 --------------------------- */

/* Integers truncate toward zero, in the type the CPU divides in (DT). */
/* The r every scale apply() takes: RN(1 / d), one IEEE division per thread. */
RC_HD float rc_recip(int d)
{
    return 1.0f / (float)d;
}

template <typename T, typename DT> struct rc_iscale {
    typedef T TT;
    static RC_HD T apply(T x, int d, float) { return (T)((DT)x / (DT)d); }
};
template <typename T> struct rc_fscale {
    typedef T TT;
    static RC_HD T apply(T x, int d, float);
};
template <> RC_HD float rc_fscale<float>::apply(float x, int d, float)
{
    float fd = (float)d;
    return rc_nan_f32(x / fd, x, fd);
}
template <> RC_HD double rc_fscale<double>::apply(double x, int d, float)
{
    double fd = (double)d;
    return rc_nan_f64(x / fd, x, fd);
}
/*
 * x / d in float32, correctly rounded, without the division: q = x * r with
 * r = RN(1/d), then one correction q + r * (x - q * d) with the exact FMA
 * remainder (Markstein: r within half an ulp of 1/d and q within an ulp of
 * x/d give the correctly rounded quotient).  The IEEE division is a
 * subroutine of a dozen instructions with a slow path; the half types'
 * scale_div did one per 2 bytes and ran at half the copy bandwidth.  Only
 * where the theorem's assumptions surely hold (finite x far from the
 * subnormal and overflow ranges); elsewhere, and for NaN's bits, the plain
 * division.  The host test compares every float16 and bfloat16 value
 * divided by 2..64 and more with the CPU's x / d.  r = RN(1 / d) comes from
 * the caller (rc_recip), once per kernel: computed here it was a division per
 * element again (the first version gained nothing on the H100).
 */
RC_HD float rc_div_by_int(float x, int d, float r)
{
    const float fd = (float)d;
    const float ax = fabsf(x);
    if (!(ax >= 0x1p-100f && ax <= 0x1p100f)) {
        return rc_fscale<float>::apply(x, d, r);
    }
    const float q = x * r;
    const float rem = fmaf(-q, fd, x);
    return fmaf(rem, r, q);
}
template <typename C> struct rc_nscale {
    typedef typename C::T TT;
    static RC_HD TT apply(TT x, int d, float r) { return C::narrow(rc_div_by_int(C::widen(x), d, r)); }
};

/* ---- which operation each dtype uses ------------------------------------- */

/*
 * Tables indexed [dtype][op] (op columns sum, prod, min, max; AVG reduces as
 * SUM) and [dtype], of L<T, Op> and L<S> for a function template L: the
 * kernel launchers in reduce_cuda.cu, and host loops in the host-side test,
 * so both see the same mapping.
 */
#define RC_INT_ROW(L, T, UT)                                                   \
    {                                                                          \
        L<UT, rc_isum<UT> >, L<UT, rc_iprod<UT> >, L<T, rc_imin<T> >, L<T, rc_imax<T> > \
    }
#define RC_FLOAT_ROW(L, T)                                                     \
    {                                                                          \
        L<T, rc_fsum<T> >, L<T, rc_fprod<T> >, L<T, rc_fmin<T> >, L<T, rc_fmax<T> > \
    }
#define RC_NARROW_ROW(L, C, K)                                                 \
    {                                                                          \
        L<C::T, rc_nfused<C, rc_fsum<float> > >, L<C::T, rc_nfused<C, rc_fprod<float> > >, \
            L<C::T, rc_nmin<C::T, K> >, L<C::T, rc_nmax<C::T, K> >             \
    }
#define RC_REDUCE_TABLE(L)                                                     \
    {                                                                          \
        /* DSHIM_INT8 */ RC_INT_ROW(L, int8_t, uint8_t),                       \
        /* DSHIM_UINT8 */ RC_INT_ROW(L, uint8_t, uint8_t),                     \
        /* DSHIM_INT32 */ RC_INT_ROW(L, int32_t, uint32_t),                    \
        /* DSHIM_UINT32 */ RC_INT_ROW(L, uint32_t, uint32_t),                  \
        /* DSHIM_INT64 */ RC_INT_ROW(L, int64_t, uint64_t),                    \
        /* DSHIM_UINT64 */ RC_INT_ROW(L, uint64_t, uint64_t),                  \
        /* DSHIM_FLOAT16 */ RC_NARROW_ROW(L, rc_cvt_f16, rc_key_f16),          \
        /* DSHIM_BFLOAT16 */ RC_NARROW_ROW(L, rc_cvt_bf16, rc_key_bf16),       \
        /* DSHIM_FLOAT32 */ RC_FLOAT_ROW(L, float),                            \
        /* DSHIM_FLOAT64 */ RC_FLOAT_ROW(L, double),                           \
        /* DSHIM_FLOAT8_E4M3 */ RC_NARROW_ROW(L, rc_cvt_e4m3, rc_key_e4m3),    \
        /* DSHIM_FLOAT8_E5M2 */ RC_NARROW_ROW(L, rc_cvt_e5m2, rc_key_e5m2),    \
    }
#define RC_SCALE_TABLE(L)                                                      \
    {                                                                          \
        /* DSHIM_INT8 */ L<rc_iscale<int8_t, int32_t> >,                       \
        /* DSHIM_UINT8 */ L<rc_iscale<uint8_t, uint32_t> >,                    \
        /* DSHIM_INT32 */ L<rc_iscale<int32_t, int32_t> >,                     \
        /* DSHIM_UINT32 */ L<rc_iscale<uint32_t, uint32_t> >,                  \
        /* DSHIM_INT64 */ L<rc_iscale<int64_t, int64_t> >,                     \
        /* DSHIM_UINT64 */ L<rc_iscale<uint64_t, uint64_t> >,                  \
        /* DSHIM_FLOAT16 */ L<rc_nscale<rc_cvt_f16> >,                         \
        /* DSHIM_BFLOAT16 */ L<rc_nscale<rc_cvt_bf16> >,                       \
        /* DSHIM_FLOAT32 */ L<rc_fscale<float> >,                              \
        /* DSHIM_FLOAT64 */ L<rc_fscale<double> >,                             \
        /* DSHIM_FLOAT8_E4M3 */ L<rc_nscale<rc_cvt_e4m3> >,                    \
        /* DSHIM_FLOAT8_E5M2 */ L<rc_nscale<rc_cvt_e5m2> >,                    \
    }

#endif

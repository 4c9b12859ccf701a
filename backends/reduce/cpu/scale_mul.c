/*
 * scale_mul: dst[i] = src[i] * scalar, the local half of a pre-multiplied sum
 * (NCCL's ncclRedOpCreatePreMulSum, torch's _make_nccl_premul_sum).  One
 * scalar loop for every ISA: the operation runs once per call on one rank's
 * input, never in a collective's inner loop, and must give the same bits
 * everywhere.
 */
#include <stdint.h>
#include <string.h>

#include "reduce/reduce.h"

void dshim_reduce_cpu_scale_mul(void *dst, const void *src, size_t count, dshim_dtype_t t, const void *scalar)
{
    /* integers wrap like the sum that follows; narrow floats are widened to
     * float, multiplied, rounded back (one rounding per element) */
#define SCALE_INT(T)                                                                   \
    do {                                                                               \
        T s_;                                                                          \
        memcpy(&s_, scalar, sizeof(T));                                                \
        const T *in_ = src;                                                            \
        T *out_ = dst;                                                                 \
        for (size_t i = 0; i < count; i++) {                                           \
            out_[i] = (T)((uint64_t)in_[i] * (uint64_t)s_);                            \
        }                                                                              \
    } while (0)
#define SCALE_NARROW(T, TO_F, FROM_F)                                                  \
    do {                                                                               \
        T s_;                                                                          \
        memcpy(&s_, scalar, sizeof(T));                                                \
        float f_ = TO_F(s_);                                                           \
        const T *in_ = src;                                                            \
        T *out_ = dst;                                                                 \
        for (size_t i = 0; i < count; i++) {                                           \
            out_[i] = FROM_F(TO_F(in_[i]) * f_);                                       \
        }                                                                              \
    } while (0)
    switch (t) {
    case DSHIM_INT8: SCALE_INT(int8_t); break;
    case DSHIM_UINT8: SCALE_INT(uint8_t); break;
    case DSHIM_INT32: SCALE_INT(int32_t); break;
    case DSHIM_UINT32: SCALE_INT(uint32_t); break;
    case DSHIM_INT64: SCALE_INT(int64_t); break;
    case DSHIM_UINT64: SCALE_INT(uint64_t); break;
    case DSHIM_FLOAT16: SCALE_NARROW(unsigned short, dshim_half_to_float, dshim_float_to_half); break;
    case DSHIM_BFLOAT16: SCALE_NARROW(unsigned short, dshim_bf16_to_float, dshim_float_to_bf16); break;
    case DSHIM_FLOAT8_E4M3: SCALE_NARROW(unsigned char, dshim_fp8e4m3_to_float, dshim_float_to_fp8e4m3); break;
    case DSHIM_FLOAT8_E5M2: SCALE_NARROW(unsigned char, dshim_fp8e5m2_to_float, dshim_float_to_fp8e5m2); break;
    case DSHIM_FLOAT32: {
        float s, *out = dst;
        const float *in = src;
        memcpy(&s, scalar, sizeof(s));
        for (size_t i = 0; i < count; i++) {
            out[i] = in[i] * s;
        }
        break;
    }
    case DSHIM_FLOAT64: {
        double s, *out = dst;
        const double *in = src;
        memcpy(&s, scalar, sizeof(s));
        for (size_t i = 0; i < count; i++) {
            out[i] = in[i] * s;
        }
        break;
    }
    case DSHIM_DTYPE_COUNT: break;
    }
#undef SCALE_INT
#undef SCALE_NARROW
}

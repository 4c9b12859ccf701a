/* Parameter server: MXNet's dtype codes -- their sizes, the sums of pushes
 * (through the reduce backend's CPU kernels, so the servers and the workers'
 * local merges get AVX2/AVX-512 and the half types like the collectives), and
 * the float32 master copies of multi-precision. */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "config.h"
#include "ps.h"
#include "ps_trace.h"
#include "status.h"
#include "reduce/reduce.h"

size_t dshim_ps_dtype_size(int dtype)
{
    switch (dtype) {
    case 0: return 4;  /* float32 */
    case 1: return 8;  /* float64 */
    case 2: return 2;  /* float16 */
    case 3: return 1;  /* uint8 */
    case 4: return 4;  /* int32 */
    case 5: return 1;  /* int8 */
    case 6: return 8;  /* int64 */
    case 7: return 1;  /* bool */
    case 12: return 2; /* bfloat16 */
    default: return 0;
    }
}

/* The MXNet dtypes the servers sum, as dshim's; 0 for the others (bool:
 * MXNet's server has no sum for it either). */
static int summable_as(int dtype, dshim_dtype_t *out)
{
    switch (dtype) {
    case 0: *out = DSHIM_FLOAT32; return 1;
    case 1: *out = DSHIM_FLOAT64; return 1;
    case 2: *out = DSHIM_FLOAT16; return 1;
    case 3: *out = DSHIM_UINT8; return 1;
    case 4: *out = DSHIM_INT32; return 1;
    case 5: *out = DSHIM_INT8; return 1;
    case 6: *out = DSHIM_INT64; return 1;
    case 12: *out = DSHIM_BFLOAT16; return 1;
    default: return 0;
    }
}

int dshim_ps_dtype_to_dshim(int dtype)
{
    dshim_dtype_t dt;
    return summable_as(dtype, &dt) ? (int)dt : -1;
}

/* The CPU kernels of DSHIM_REDUCE_ISA, chosen once per process as the
 * communicator chooses them (a fallback is logged once). */
static const dshim_reduce_ops_t *sum_ops;
static pthread_once_t sum_ops_once = PTHREAD_ONCE_INIT;

static void choose_sum_ops(void)
{
    sum_ops = dshim_reduce_cpu_ops(dshim_config()->reduce_isa);
}

dshim_status_t dshim_ps_add(void *dst, const void *src, size_t n, int dtype)
{
    dshim_dtype_t dt;
    if (!summable_as(dtype, &dt)) {
        return dshim_error(DSHIM_ERR_UNSUPPORTED, "parameter server: cannot sum arrays of MXNet dtype %d "
                           "(supported: float32/64/16, bfloat16, uint8, int8, int32, int64)", dtype);
    }
    pthread_once(&sum_ops_once, choose_sum_ops);
    /* dst as the first operand: MXNet's `merged += recved` is merged + recved,
     * and the backend keeps the first operand's NaN, as x86's addition does.
     * Integers wrap and half types round once to nearest even, as before. */
    return sum_ops->reduce(dst, dst, src, n, dt, DSHIM_SUM, NULL);
}

#define DSHIM_PS_WIDEN(T)                                                      \
    do {                                                                       \
        const T *s_ = src;                                                     \
        for (size_t i_ = 0; i_ < n; i_++) {                                    \
            dst[i_] = (float)s_[i_];                                           \
        }                                                                      \
    } while (0)

#define DSHIM_PS_NARROW(T)                                                     \
    do {                                                                       \
        T *d_ = dst;                                                           \
        for (size_t i_ = 0; i_ < n; i_++) {                                    \
            d_[i_] = (T)src[i_];                                               \
        }                                                                      \
    } while (0)

dshim_status_t dshim_ps_to_float32(float *dst, const void *src, size_t n, int dtype)
{
    switch (dtype) {
    case 0: memcpy(dst, src, n * sizeof(float)); break;
    case 1: DSHIM_PS_WIDEN(double); break;
    case 3: DSHIM_PS_WIDEN(uint8_t); break;
    case 4: DSHIM_PS_WIDEN(int32_t); break;
    case 5: DSHIM_PS_WIDEN(int8_t); break;
    case 6: DSHIM_PS_WIDEN(int64_t); break;
    case 2: {
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++) {
            dst[i] = dshim_half_to_float(s[i]);
        }
        break;
    }
    case 12: {
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++) {
            dst[i] = dshim_bf16_to_float(s[i]);
        }
        break;
    }
    default:
        return dshim_error(DSHIM_ERR_UNSUPPORTED, "parameter server: no float32 master copy for MXNet dtype %d",
                           dtype);
    }
    return DSHIM_OK;
}

dshim_status_t dshim_ps_from_float32(void *dst, const float *src, size_t n, int dtype)
{
    switch (dtype) {
    case 0: memcpy(dst, src, n * sizeof(float)); break;
    case 1: DSHIM_PS_NARROW(double); break;
    case 3: DSHIM_PS_NARROW(uint8_t); break;
    case 4: DSHIM_PS_NARROW(int32_t); break;
    case 5: DSHIM_PS_NARROW(int8_t); break;
    case 6: DSHIM_PS_NARROW(int64_t); break;
    case 2: {
        uint16_t *d = dst;
        for (size_t i = 0; i < n; i++) {
            d[i] = dshim_float_to_half(src[i]);
        }
        break;
    }
    case 12: {
        uint16_t *d = dst;
        for (size_t i = 0; i < n; i++) {
            d[i] = dshim_float_to_bf16(src[i]);
        }
        break;
    }
    default:
        return dshim_error(DSHIM_ERR_UNSUPPORTED, "parameter server: no float32 master copy for MXNet dtype %d",
                           dtype);
    }
    return DSHIM_OK;
}

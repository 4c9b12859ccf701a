/*
 * Reduction backend interface.  The collective algorithms call only these
 * ops; they never see how a kernel is written.  Backends never include
 * transport headers.
 *
 * Contract for every backend:
 *  - dst[i] = op(a[i], b[i]) for i < count, element by element, in this
 *    argument order (a is "the lower rank's data" where order matters: the
 *    algorithms always pass operands in a canonical order so that every rank
 *    computes bit-identical results).  dst may alias a or b (exactly, not
 *    partially); a and b may alias each other.
 *  - float16/bfloat16/fp8 are widened to float32, combined, rounded back to
 *    nearest-even: one rounding per call.
 *  - Integers wrap (two's complement) on overflow; no UB.
 *  - MIN/MAX propagate NaN: if either operand is NaN the result is NaN (the
 *    first NaN operand's bits).  -0.0 and +0.0 compare equal; the first
 *    operand wins ties, so the result depends only on the operand order.
 *  - DSHIM_AVG reduces as DSHIM_SUM; the algorithm calls `scale_div` once at
 *    the end on the final sum.
 *  - Results must not depend on the vector width used (avx512 vs avx2 vs
 *    scalar give identical bits), so ranks on different CPUs agree.
 */
#ifndef DSHIM_REDUCE_H
#define DSHIM_REDUCE_H

#include <stddef.h>
#include "dshim.h"

typedef enum { DSHIM_MEM_HOST = 0, DSHIM_MEM_CUDA = 1 } dshim_memtype_t;

typedef struct dshim_reduce_ops {
    const char *name;  /* "cpu", later "cuda" */
    /* which instruction set the kernels use, e.g. "avx512", "avx2", "scalar" */
    const char *(*isa)(void);
    int (*supports)(dshim_memtype_t mem, dshim_dtype_t dtype, dshim_redop_t op);
    dshim_status_t (*reduce)(void *dst, const void *a, const void *b, size_t count,
                             dshim_dtype_t dtype, dshim_redop_t op, void *stream);
    /* buf[i] = buf[i] / divisor (AVG).  Integers: truncating division. */
    dshim_status_t (*scale_div)(void *buf, size_t count, dshim_dtype_t dtype, int divisor,
                                void *stream);
    /* dst[i] = src[i] * *scalar (a value of dtype).  Integers wrap; narrow
     * floats are widened to float, multiplied, rounded back once.  dst may
     * alias src exactly. */
    void (*scale_mul)(void *dst, const void *src, size_t count, dshim_dtype_t dtype, const void *scalar);
} dshim_reduce_ops_t;

/* The CPU backend.  `isa` is "auto", "avx512", "avx2" or "scalar"; a request
 * the CPU cannot run falls back to the best it can (logged at INFO). */
const dshim_reduce_ops_t *dshim_reduce_cpu_ops(const char *isa);
/* The CPU backend's scale_mul (backends/reduce/cpu/scale_mul.c). */
void dshim_reduce_cpu_scale_mul(void *dst, const void *src, size_t count, dshim_dtype_t dtype, const void *scalar);

/* Scalar conversions shared by kernels, tests and hooks. */
float dshim_half_to_float(unsigned short h);
unsigned short dshim_float_to_half(float f);     /* round to nearest even */
float dshim_bf16_to_float(unsigned short b);
unsigned short dshim_float_to_bf16(float f);      /* round to nearest even, NaN kept quiet */
float dshim_fp8e4m3_to_float(unsigned char v);
unsigned char dshim_float_to_fp8e4m3(float f);   /* RNE, saturate to +-448, NaN -> 0x7f */
float dshim_fp8e5m2_to_float(unsigned char v);
unsigned char dshim_float_to_fp8e5m2(float f);   /* RNE, overflow -> inf */

#endif

/*
 * Reductions on device memory with dshim's CUDA kernels (libdshim-cuda.so,
 * loaded on first use by cuda_loader.c).  Users see only these functions,
 * not the reduce backend's ops table; the kernels follow the backend
 * contract of backends/reduce/reduce.h (bit-identical to the CPU kernels).
 */
#ifndef DSHIM_GPU_REDUCE_H
#define DSHIM_GPU_REDUCE_H

#include <stddef.h>

#include "dshim.h"

/* 1 when the kernels are loaded (libdshim-cuda.so, the CUDA runtime and a
 * device are there; the first call loads them and logs at INFO why not). */
int dshim_gpu_kernels_loaded(void);

/* 1 when the kernels are loaded and reduce dtype with op on device memory
 * (DSHIM_AVG: asks for SUM, as an AVG is a SUM and then scale_div). */
int dshim_gpu_supports(dshim_dtype_t dtype, dshim_redop_t op);

/* dst[i] = op(a[i], b[i]) for i < count, queued on `stream` (a cudaStream_t;
 * NULL: the legacy default stream).  DSHIM_ERR_UNSUPPORTED without kernels. */
dshim_status_t dshim_gpu_reduce(void *dst, const void *a, const void *b, size_t count, dshim_dtype_t dtype,
                                dshim_redop_t op, void *stream);

/* buf[i] /= divisor (the end of an AVG), queued on `stream`. */
dshim_status_t dshim_gpu_scale_div(void *buf, size_t count, dshim_dtype_t dtype, int divisor, void *stream);

/* A symbol of the loaded libdshim-cuda.so, NULL when it is not loaded: how
 * tools and tests reach its dshim_cuda_test_* helpers without CUDA headers. */
void *dshim_gpu_kernels_symbol(const char *name);

#endif

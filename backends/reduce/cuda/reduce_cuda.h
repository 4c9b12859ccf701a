/*
 * The seam between the dshim core and libdshim-cuda.so, the CUDA reduction
 * backend.  The backend lives in its own shared library so that libdshim.so
 * loads on hosts without CUDA; the core dlopens it on demand
 * (shim/gpu/cuda_loader.c).  This header needs no CUDA headers: the
 * core includes it on every machine.
 *
 * libdshim-cuda.so links no dshim code: the core's symbols are hidden in
 * libdshim.so (and a test links its own static copy), so the library could not
 * resolve dshim_error by name, and a private copy of the core would keep its
 * own thread-local last-error message that dshim_last_error() never sees.  The
 * loader therefore hands the library the core's error reporter at bind time.
 */
#ifndef DSHIM_REDUCE_CUDA_H
#define DSHIM_REDUCE_CUDA_H

#include <stddef.h>

#include "dshim.h"
#include "reduce/reduce.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What the backend borrows from the core that loaded it. */
typedef struct dshim_cuda_host {
    size_t size; /* sizeof(dshim_cuda_host_t): lets the table grow compatibly */
    /* dshim_error: records this thread's last error, logs it, returns status */
    dshim_status_t (*error)(dshim_status_t status, const char *fmt, ...)
        __attribute__((format(printf, 2, 3)));
} dshim_cuda_host_t;

/* ---- exported by libdshim-cuda.so (looked up with dlsym) ---------------- */

#define DSHIM_CUDA_LIB_NAME "libdshim-cuda.so"

/* Called once by the loader before anything else; host must stay valid. */
DSHIM_EXPORT void dshim_cuda_bind(const dshim_cuda_host_t *host);
typedef void (*dshim_cuda_bind_fn)(const dshim_cuda_host_t *host);

/* Number of CUDA devices; 0 with *why set to the CUDA error text when the
 * driver is missing or finds none. */
DSHIM_EXPORT int dshim_cuda_device_count(const char **why);
typedef int (*dshim_cuda_device_count_fn)(const char **why);

/* The backend: name "cuda", device memory only, kernels on the given stream. */
DSHIM_EXPORT const dshim_reduce_ops_t *dshim_reduce_cuda_ops(void);
typedef const dshim_reduce_ops_t *(*dshim_reduce_cuda_ops_fn)(void);

/*
 * For tests only: a test program must build without CUDA headers, so it
 * reaches device memory through these (found with dshim_reduce_cuda_symbol).
 * copy is cudaMemcpy with cudaMemcpyDefault: either side may be host or
 * device memory, and it waits for work queued on the default stream.
 */
DSHIM_EXPORT dshim_status_t dshim_cuda_test_alloc(void **ptr_p, size_t bytes);
DSHIM_EXPORT dshim_status_t dshim_cuda_test_free(void *ptr);
DSHIM_EXPORT dshim_status_t dshim_cuda_test_copy(void *dst, const void *src, size_t bytes);
typedef dshim_status_t (*dshim_cuda_test_alloc_fn)(void **ptr_p, size_t bytes);
typedef dshim_status_t (*dshim_cuda_test_free_fn)(void *ptr);
typedef dshim_status_t (*dshim_cuda_test_copy_fn)(void *dst, const void *src, size_t bytes);

/* For tools/dshim_cuda_bench.c (which, like the tests, builds without CUDA
 * headers): sync is cudaDeviceSynchronize -- a device-to-device copy does not
 * wait, so timing needs it; describe writes the current device's name,
 * compute capability, SM count and the runtime/driver versions. */
DSHIM_EXPORT dshim_status_t dshim_cuda_test_sync(void);
DSHIM_EXPORT dshim_status_t dshim_cuda_test_describe(char *buf, size_t len);
typedef dshim_status_t (*dshim_cuda_test_sync_fn)(void);
typedef dshim_status_t (*dshim_cuda_test_describe_fn)(char *buf, size_t len);

/* ---- internal to libdshim-cuda.so: reduce_cuda.cu, called by reduce_cuda_api.c */

/* Queue the kernel on `stream` (a cudaStream_t; NULL = default stream) and
 * return the cudaError_t of the launch as an int (0 = cudaSuccess).  The
 * arguments are already checked: valid dtype/op, count >= 1, non-null,
 * dst equal to or disjoint from each operand, divisor >= 2. */
int dshim_rc_launch_reduce(void *dst, const void *a, const void *b, size_t count,
                           dshim_dtype_t dtype, dshim_redop_t op, void *stream);
int dshim_rc_launch_scale_div(void *buf, size_t count, dshim_dtype_t dtype, int divisor,
                              void *stream);

#ifdef __cplusplus
}
#endif

#endif

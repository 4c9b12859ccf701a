/*
 * The "cuda" reduction backend's entry points (libdshim-cuda.so): argument
 * checks matching the cpu backend's, CUDA errors turned into
 * DSHIM_ERR_SYSTEM, and the exported symbols the loader and tests look up.
 * The kernels are in reduce_cuda.cu.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#include <cuda_runtime_api.h>

#include "reduce/cuda/reduce_cuda.h"

/*
 * The core's dshim_error, given by the loader (see reduce_cuda.h).  Before
 * binding (someone dlopened the library by hand) errors still return their
 * status, with the message on stderr so it is not lost.
 */
static const dshim_cuda_host_t *host;

DSHIM_EXPORT void dshim_cuda_bind(const dshim_cuda_host_t *h)
{
    if (h != NULL && h->size >= sizeof(dshim_cuda_host_t)) {
        host = h;
    }
}

static dshim_status_t rc_error(dshim_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static dshim_status_t rc_error(dshim_status_t status, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (host != NULL && host->error != NULL) {
        return host->error(status, "%s", msg);
    }
    fprintf(stderr, "dshim-cuda: %s\n", msg);
    return status;
}

static dshim_status_t rc_cuda_failed(const char *what, cudaError_t err)
{
    return rc_error(DSHIM_ERR_SYSTEM, "cuda %s failed: %s (%s); check that the buffers are device "
                    "memory of the current device and the stream belongs to it", what,
                    cudaGetErrorString(err), cudaGetErrorName(err));
}

DSHIM_EXPORT int dshim_cuda_device_count(const char **why)
{
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        if (why != NULL) {
            *why = cudaGetErrorString(err);
        }
        return 0;
    }
    if (n == 0 && why != NULL) {
        *why = "the driver reports no device";
    }
    return n;
}

static const char *rc_isa(void)
{
    return "cuda";
}

static int rc_supports(dshim_memtype_t mem, dshim_dtype_t dtype, dshim_redop_t op)
{
    return mem == DSHIM_MEM_CUDA && (unsigned)dtype < DSHIM_DTYPE_COUNT &&
           (unsigned)op < DSHIM_REDOP_COUNT;
}

static dshim_status_t check_dtype(const char *call, dshim_dtype_t dtype)
{
    if ((unsigned)dtype >= DSHIM_DTYPE_COUNT) {
        return rc_error(DSHIM_ERR_INVALID, "cuda %s: invalid dtype %d; use a dshim_dtype_t value "
                        "below %d", call, (int)dtype, (int)DSHIM_DTYPE_COUNT);
    }
    return DSHIM_OK;
}

/* Element sizes, indexed by dtype: the library links nothing of the core,
 * so it cannot call dshim_dtype_size (see reduce_cuda.h). */
static const unsigned char elem_size[DSHIM_DTYPE_COUNT] = {
    [DSHIM_INT8] = 1, [DSHIM_UINT8] = 1, [DSHIM_INT32] = 4, [DSHIM_UINT32] = 4,
    [DSHIM_INT64] = 8, [DSHIM_UINT64] = 8, [DSHIM_FLOAT16] = 2, [DSHIM_BFLOAT16] = 2,
    [DSHIM_FLOAT32] = 4, [DSHIM_FLOAT64] = 8, [DSHIM_FLOAT8_E4M3] = 1, [DSHIM_FLOAT8_E5M2] = 1,
};

/* Same rules as the cpu backend: non-null, count in elements that fits. */
static dshim_status_t check_buffer(const char *call, const char *name, const void *buf,
                                   size_t count, dshim_dtype_t dtype, size_t *bytes_p)
{
    size_t size = elem_size[dtype];
    if (buf == NULL) {
        return rc_error(DSHIM_ERR_INVALID, "cuda %s: %s is null with count %zu; pass a device "
                        "buffer of count elements", call, name, count);
    }
    if (count > SIZE_MAX / size) {
        return rc_error(DSHIM_ERR_INVALID, "cuda %s: count %zu of %zu-byte elements overflows "
                        "the address space; pass a count in elements, not bytes", call, count,
                        size);
    }
    *bytes_p = count * size;
    return DSHIM_OK;
}

/* dst may equal an operand or be disjoint from it; a partial overlap would
 * make the result depend on the order the threads run in. */
static int overlaps_partially(const void *x, const void *y, size_t bytes)
{
    uintptr_t px = (uintptr_t)x;
    uintptr_t py = (uintptr_t)y;
    return px != py && px < py + bytes && py < px + bytes;
}

static dshim_status_t rc_reduce(void *dst, const void *a, const void *b, size_t count,
                                dshim_dtype_t dtype, dshim_redop_t op, void *stream)
{
    size_t bytes = 0;
    dshim_status_t st = check_dtype("reduce", dtype);
    if (st != DSHIM_OK) {
        return st;
    }
    if ((unsigned)op >= DSHIM_REDOP_COUNT) {
        return rc_error(DSHIM_ERR_INVALID, "cuda reduce: invalid reduction op %d; use a "
                        "dshim_redop_t value below %d", (int)op, (int)DSHIM_REDOP_COUNT);
    }
    if (count == 0) {
        return DSHIM_OK;
    }
    if ((st = check_buffer("reduce", "dst", dst, count, dtype, &bytes)) != DSHIM_OK ||
        (st = check_buffer("reduce", "a", a, count, dtype, &bytes)) != DSHIM_OK ||
        (st = check_buffer("reduce", "b", b, count, dtype, &bytes)) != DSHIM_OK) {
        return st;
    }
    if (overlaps_partially(dst, a, bytes) || overlaps_partially(dst, b, bytes)) {
        return rc_error(DSHIM_ERR_INVALID, "cuda reduce: dst %p partially overlaps an operand "
                        "(a %p, b %p, %zu bytes); dst must equal the operand or not overlap it",
                        dst, a, b, bytes);
    }
    cudaError_t err = (cudaError_t)dshim_rc_launch_reduce(dst, a, b, count, dtype, op, stream);
    if (err != cudaSuccess) {
        return rc_cuda_failed("reduce kernel launch", err);
    }
    return DSHIM_OK;
}

static dshim_status_t rc_scale_div(void *buf, size_t count, dshim_dtype_t dtype, int divisor,
                                   void *stream)
{
    size_t bytes = 0;
    dshim_status_t st = check_dtype("scale_div", dtype);
    if (st != DSHIM_OK) {
        return st;
    }
    if (divisor < 1) {
        return rc_error(DSHIM_ERR_INVALID, "cuda scale_div: divisor %d must be at least 1 (it "
                        "is the number of contributions averaged)", divisor);
    }
    /* x / 1 is x; skipping it also leaves signalling NaNs untouched, as the
     * cpu backend does */
    if (count == 0 || divisor == 1) {
        return DSHIM_OK;
    }
    if ((st = check_buffer("scale_div", "buf", buf, count, dtype, &bytes)) != DSHIM_OK) {
        return st;
    }
    cudaError_t err = (cudaError_t)dshim_rc_launch_scale_div(buf, count, dtype, divisor, stream);
    if (err != cudaSuccess) {
        return rc_cuda_failed("scale_div kernel launch", err);
    }
    return DSHIM_OK;
}

static const dshim_reduce_ops_t rc_ops = {
    .name = "cuda",
    .isa = rc_isa,
    .supports = rc_supports,
    .reduce = rc_reduce,
    .scale_div = rc_scale_div,
};

DSHIM_EXPORT const dshim_reduce_ops_t *dshim_reduce_cuda_ops(void)
{
    return &rc_ops;
}

/* ---- test helpers (see reduce_cuda.h) ------------------------------------ */

DSHIM_EXPORT dshim_status_t dshim_cuda_test_alloc(void **ptr_p, size_t bytes)
{
    cudaError_t err = cudaMalloc(ptr_p, bytes > 0 ? bytes : 1);
    return err == cudaSuccess ? DSHIM_OK : rc_cuda_failed("malloc", err);
}

DSHIM_EXPORT dshim_status_t dshim_cuda_test_free(void *ptr)
{
    cudaError_t err = cudaFree(ptr);
    return err == cudaSuccess ? DSHIM_OK : rc_cuda_failed("free", err);
}

DSHIM_EXPORT dshim_status_t dshim_cuda_test_copy(void *dst, const void *src, size_t bytes)
{
    cudaError_t err = cudaMemcpy(dst, src, bytes, cudaMemcpyDefault);
    return err == cudaSuccess ? DSHIM_OK : rc_cuda_failed("memcpy", err);
}

DSHIM_EXPORT dshim_status_t dshim_cuda_test_sync(void)
{
    cudaError_t err = cudaDeviceSynchronize();
    return err == cudaSuccess ? DSHIM_OK : rc_cuda_failed("device synchronize", err);
}

DSHIM_EXPORT dshim_status_t dshim_cuda_test_describe(char *buf, size_t len)
{
    int dev = 0;
    int runtime = 0;
    int driver = 0;
    struct cudaDeviceProp prop;
    cudaError_t err = cudaGetDevice(&dev);
    if (err == cudaSuccess) {
        err = cudaGetDeviceProperties(&prop, dev);
    }
    if (err != cudaSuccess) {
        return rc_cuda_failed("device query", err);
    }
    cudaRuntimeGetVersion(&runtime);
    cudaDriverGetVersion(&driver);
    snprintf(buf, len, "device %d: %s, sm_%d%d, %d SMs, %.1f GiB; CUDA runtime %d.%d, driver %d.%d",
             dev, prop.name, prop.major, prop.minor, prop.multiProcessorCount,
             (double)prop.totalGlobalMem / (1u << 30), runtime / 1000, runtime % 1000 / 10,
             driver / 1000, driver % 1000 / 10);
    return DSHIM_OK;
}

/*
 * CUDA reduction kernels: one grid-stride kernel template, instantiated once
 * per (type class, op) from reduce_cuda_elem.cuh, plus the launch dispatch
 * that reduce_cuda_api.c calls.  Argument checks and error reporting live in
 * reduce_cuda_api.c; this file only queues work on the caller's stream and
 * never waits for it.
 *
 * Each element is computed on its own (no reassociation), so the launch
 * shape never changes a bit.  Aliasing is allowed (dst == a or dst == b):
 * every thread reads its elements before writing them and no element depends
 * on another, hence no __restrict__.
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include "reduce/cuda/reduce_cuda.h"
#include "reduce_cuda_elem.cuh"

namespace {

const int kThreads = 256;

/*
 * How the kernel may load: 16 bytes at a time when every pointer is 16-byte
 * aligned (cudaMalloc memory is), one element at a time when they are element
 * aligned, and byte by byte otherwise (a caller may hand over a buffer at any
 * byte offset, as the CPU backend allows).
 */
enum rc_mode { RC_VEC16 = 0, RC_ELEM = 1, RC_BYTES = 2 };

template <typename T> union rc_vec {
    uint4 v;
    T e[16 / sizeof(T)];
};

template <typename T> __device__ __forceinline__ T rc_load_bytes(const void *p, size_t i)
{
    T v;
    memcpy(&v, (const unsigned char *)p + i * sizeof(T), sizeof(T));
    return v;
}

template <typename T> __device__ __forceinline__ void rc_store_bytes(void *p, size_t i, T v)
{
    memcpy((unsigned char *)p + i * sizeof(T), &v, sizeof(T));
}

/* dst[i] = Op::apply(a[i], b[i]) for i < n */
template <typename T, typename Op>
__global__ void __launch_bounds__(kThreads)
rc_reduce_kernel(void *dst, const void *a, const void *b, size_t n, int mode)
{
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (mode == RC_BYTES) {
        for (; i < n; i += stride) {
            rc_store_bytes<T>(dst, i, Op::apply(rc_load_bytes<T>(a, i), rc_load_bytes<T>(b, i)));
        }
        return;
    }
    T *d = (T *)dst;
    const T *x = (const T *)a;
    const T *y = (const T *)b;
    size_t done = 0;
    if (mode == RC_VEC16) {
        const int per = 16 / sizeof(T);
        const size_t nvec = n / per;
        for (size_t v = i; v < nvec; v += stride) {
            rc_vec<T> va, vb, vr;
            va.v = ((const uint4 *)x)[v];
            vb.v = ((const uint4 *)y)[v];
#pragma unroll
            for (int j = 0; j < per; j++) {
                vr.e[j] = Op::apply(va.e[j], vb.e[j]);
            }
            ((uint4 *)d)[v] = vr.v;
        }
        done = nvec * per;
    }
    for (i += done; i < n; i += stride) {
        d[i] = Op::apply(x[i], y[i]);
    }
}

/* buf[i] = S::apply(buf[i], divisor) for i < n */
template <typename S>
__global__ void __launch_bounds__(kThreads)
rc_scale_kernel(void *buf, size_t n, int divisor, int mode)
{
    typedef typename S::TT T;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (mode == RC_BYTES) {
        for (; i < n; i += stride) {
            rc_store_bytes<T>(buf, i, S::apply(rc_load_bytes<T>(buf, i), divisor));
        }
        return;
    }
    T *p = (T *)buf;
    size_t done = 0;
    if (mode == RC_VEC16) {
        const int per = 16 / sizeof(T);
        const size_t nvec = n / per;
        for (size_t v = i; v < nvec; v += stride) {
            rc_vec<T> vb;
            vb.v = ((const uint4 *)p)[v];
#pragma unroll
            for (int j = 0; j < per; j++) {
                vb.e[j] = S::apply(vb.e[j], divisor);
            }
            ((uint4 *)p)[v] = vb.v;
        }
        done = nvec * per;
    }
    for (i += done; i < n; i += stride) {
        p[i] = S::apply(p[i], divisor);
    }
}

int rc_mode_of(size_t size, const void *p0, const void *p1, const void *p2)
{
    uintptr_t all = (uintptr_t)p0 | (uintptr_t)p1 | (uintptr_t)p2;
    if (all % 16 == 0) {
        return RC_VEC16;
    }
    return all % size == 0 ? RC_ELEM : RC_BYTES;
}

/*
 * Enough blocks to cover the work, capped at a few per multiprocessor: the
 * grid-stride loop does the rest, and a bounded grid keeps launches cheap
 * for huge counts.  The attribute query is a host-side table lookup.
 */
cudaError_t rc_grid(size_t items, unsigned int *blocks_p)
{
    int dev = 0;
    int sms = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err == cudaSuccess) {
        err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    }
    if (err != cudaSuccess) {
        return err;
    }
    size_t want = (items + kThreads - 1) / kThreads;
    size_t cap = (size_t)(sms > 0 ? sms : 1) * 8;
    *blocks_p = (unsigned int)(want < cap ? (want > 0 ? want : 1) : cap);
    return cudaSuccess;
}

/*
 * Launched with cudaLaunchKernel rather than <<<>>>: it returns this launch's
 * own error, where cudaGetLastError could report (and clear) an earlier,
 * unrelated error of the application sharing the runtime.
 */
typedef int (*rc_reduce_launch_fn)(void *, const void *, const void *, size_t, cudaStream_t);
typedef int (*rc_scale_launch_fn)(void *, size_t, int, cudaStream_t);

template <typename T, typename Op>
int rc_launch_reduce(void *dst, const void *a, const void *b, size_t n, cudaStream_t stream)
{
    int mode = rc_mode_of(sizeof(T), dst, a, b);
    size_t items = mode == RC_VEC16 ? (n + 16 / sizeof(T) - 1) / (16 / sizeof(T)) : n;
    unsigned int blocks = 1;
    cudaError_t err = rc_grid(items, &blocks);
    if (err != cudaSuccess) {
        return (int)err;
    }
    void *args[] = {&dst, (void *)&a, (void *)&b, &n, &mode};
    return (int)cudaLaunchKernel((const void *)rc_reduce_kernel<T, Op>, dim3(blocks),
                                 dim3(kThreads), args, 0, stream);
}

template <typename S>
int rc_launch_scale(void *buf, size_t n, int divisor, cudaStream_t stream)
{
    typedef typename S::TT T;
    int mode = rc_mode_of(sizeof(T), buf, buf, buf);
    size_t items = mode == RC_VEC16 ? (n + 16 / sizeof(T) - 1) / (16 / sizeof(T)) : n;
    unsigned int blocks = 1;
    cudaError_t err = rc_grid(items, &blocks);
    if (err != cudaSuccess) {
        return (int)err;
    }
    void *args[] = {&buf, &n, &divisor, &mode};
    return (int)cudaLaunchKernel((const void *)rc_scale_kernel<S>, dim3(blocks), dim3(kThreads),
                                 args, 0, stream);
}

const rc_reduce_launch_fn rc_reduce_table[DSHIM_DTYPE_COUNT][4] = RC_REDUCE_TABLE(rc_launch_reduce);
const rc_scale_launch_fn rc_scale_table[DSHIM_DTYPE_COUNT] = RC_SCALE_TABLE(rc_launch_scale);

} // namespace

extern "C" int dshim_rc_launch_reduce(void *dst, const void *a, const void *b, size_t count,
                                      dshim_dtype_t dtype, dshim_redop_t op, void *stream)
{
    int col = op == DSHIM_AVG ? (int)DSHIM_SUM : (int)op;
    return rc_reduce_table[dtype][col](dst, a, b, count, (cudaStream_t)stream);
}

extern "C" int dshim_rc_launch_scale_div(void *buf, size_t count, dshim_dtype_t dtype,
                                         int divisor, void *stream)
{
    return rc_scale_table[dtype](buf, count, divisor, (cudaStream_t)stream);
}

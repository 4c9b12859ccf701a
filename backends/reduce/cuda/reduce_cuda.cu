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
 *
 * Speed: the kernels are memory-bound (issue 5 asks for 80% of the device's
 * copy bandwidth at 256 MiB).  Three things get them there: 16-byte loads
 * and stores, kUnroll independent vectors in flight per thread (the loads of
 * all of them are issued before the first result is computed, so each
 * thread keeps several memory requests outstanding), and exactly one wave of
 * resident blocks, sized by the occupancy calculator for each kernel (a
 * fixed blocks-per-SM guess leaves a half-empty second wave behind whenever
 * a kernel needs more registers than the guess allows).
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include "reduce/cuda/reduce_cuda.h"
#include "reduce_cuda_elem.cuh"

namespace {

const int kThreads = 256;
/* vectors per thread per loop iteration in the 16-byte path: 4 x 2 x 16 B
 * of loads outstanding per thread covers HBM latency with room to spare at
 * the occupancy the resulting 40-56 registers allow (4-6 blocks of 256 per
 * SM on sm_80/sm_90, per ptxas -v) */
const int kUnroll = 4;

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
        const uint4 *xv = (const uint4 *)x;
        const uint4 *yv = (const uint4 *)y;
        uint4 *dv = (uint4 *)d;
        size_t v = i;
        /* kUnroll vectors, stride apart (each warp still reads whole lines):
         * every load first, then every result */
        for (; v + (kUnroll - 1) * stride < nvec; v += kUnroll * stride) {
            rc_vec<T> va[kUnroll], vb[kUnroll];
#pragma unroll
            for (int u = 0; u < kUnroll; u++) {
                va[u].v = xv[v + u * stride];
                vb[u].v = yv[v + u * stride];
            }
#pragma unroll
            for (int u = 0; u < kUnroll; u++) {
#pragma unroll
                for (int j = 0; j < per; j++) {
                    va[u].e[j] = Op::apply(va[u].e[j], vb[u].e[j]);
                }
                dv[v + u * stride] = va[u].v;
            }
        }
        for (; v < nvec; v += stride) {
            rc_vec<T> va, vb;
            va.v = xv[v];
            vb.v = yv[v];
#pragma unroll
            for (int j = 0; j < per; j++) {
                va.e[j] = Op::apply(va.e[j], vb.e[j]);
            }
            dv[v] = va.v;
        }
        done = nvec * per;
    }
    for (i += done; i < n; i += stride) {
        d[i] = Op::apply(x[i], y[i]);
    }
}

/* buf[i] = S::apply(buf[i], divisor, 1 / divisor) for i < n */
template <typename S>
__global__ void __launch_bounds__(kThreads)
rc_scale_kernel(void *buf, size_t n, int divisor, int mode)
{
    typedef typename S::TT T;
    const float r = rc_recip(divisor);
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (mode == RC_BYTES) {
        for (; i < n; i += stride) {
            rc_store_bytes<T>(buf, i, S::apply(rc_load_bytes<T>(buf, i), divisor, r));
        }
        return;
    }
    T *p = (T *)buf;
    size_t done = 0;
    if (mode == RC_VEC16) {
        const int per = 16 / sizeof(T);
        const size_t nvec = n / per;
        uint4 *pv = (uint4 *)p;
        size_t v = i;
        for (; v + (kUnroll - 1) * stride < nvec; v += kUnroll * stride) {
            rc_vec<T> vb[kUnroll];
#pragma unroll
            for (int u = 0; u < kUnroll; u++) {
                vb[u].v = pv[v + u * stride];
            }
#pragma unroll
            for (int u = 0; u < kUnroll; u++) {
#pragma unroll
                for (int j = 0; j < per; j++) {
                    vb[u].e[j] = S::apply(vb[u].e[j], divisor, r);
                }
                pv[v + u * stride] = vb[u].v;
            }
        }
        for (; v < nvec; v += stride) {
            rc_vec<T> vb;
            vb.v = pv[v];
#pragma unroll
            for (int j = 0; j < per; j++) {
                vb.e[j] = S::apply(vb.e[j], divisor, r);
            }
            pv[v] = vb.v;
        }
        done = nvec * per;
    }
    for (i += done; i < n; i += stride) {
        p[i] = S::apply(p[i], divisor, r);
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
 * Blocks a kernel can keep resident per multiprocessor (the occupancy
 * calculator: registers, threads), looked up once per kernel and cached in
 * *cache; 0 there means "not yet".  Racing first calls compute the same
 * value, so a relaxed store suffices.  The value is per kernel, not per
 * device: the GPUs of one process are alike in practice, and a value from
 * another device costs speed (a partial or second wave), never correctness.
 */
cudaError_t rc_resident_blocks(const void *kernel, int *cache, int *blocks_p)
{
    int per_sm = __atomic_load_n(cache, __ATOMIC_RELAXED);
    if (per_sm == 0) {
        cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0);
        if (err != cudaSuccess) {
            return err;
        }
        per_sm = per_sm > 0 ? per_sm : 1;
        __atomic_store_n(cache, per_sm, __ATOMIC_RELAXED);
    }
    *blocks_p = per_sm;
    return cudaSuccess;
}

/*
 * Enough blocks to cover the work, capped at one wave of resident blocks:
 * the grid-stride loop does the rest, every block does the same amount of
 * work, and no block waits for a slot.  The SM count is a host-side table
 * lookup of the runtime.
 */
cudaError_t rc_grid(const void *kernel, int *cache, size_t items, unsigned int *blocks_p)
{
    int dev = 0;
    int sms = 0;
    int per_sm = 1;
    cudaError_t err = cudaGetDevice(&dev);
    if (err == cudaSuccess) {
        err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    }
    if (err == cudaSuccess) {
        err = rc_resident_blocks(kernel, cache, &per_sm);
    }
    if (err != cudaSuccess) {
        return err;
    }
    size_t want = (items + kThreads - 1) / kThreads;
    size_t cap = (size_t)(sms > 0 ? sms : 1) * (size_t)per_sm;
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
    static int resident; /* per kernel: see rc_resident_blocks */
    const void *kernel = (const void *)rc_reduce_kernel<T, Op>;
    int mode = rc_mode_of(sizeof(T), dst, a, b);
    size_t items = mode == RC_VEC16 ? (n + 16 / sizeof(T) - 1) / (16 / sizeof(T)) : n;
    unsigned int blocks = 1;
    cudaError_t err = rc_grid(kernel, &resident, items, &blocks);
    if (err != cudaSuccess) {
        return (int)err;
    }
    void *args[] = {&dst, (void *)&a, (void *)&b, &n, &mode};
    return (int)cudaLaunchKernel(kernel, dim3(blocks), dim3(kThreads), args, 0, stream);
}

template <typename S>
int rc_launch_scale(void *buf, size_t n, int divisor, cudaStream_t stream)
{
    typedef typename S::TT T;
    static int resident; /* per kernel: see rc_resident_blocks */
    const void *kernel = (const void *)rc_scale_kernel<S>;
    int mode = rc_mode_of(sizeof(T), buf, buf, buf);
    size_t items = mode == RC_VEC16 ? (n + 16 / sizeof(T) - 1) / (16 / sizeof(T)) : n;
    unsigned int blocks = 1;
    cudaError_t err = rc_grid(kernel, &resident, items, &blocks);
    if (err != cudaSuccess) {
        return (int)err;
    }
    void *args[] = {&buf, &n, &divisor, &mode};
    return (int)cudaLaunchKernel(kernel, dim3(blocks), dim3(kThreads), args, 0, stream);
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

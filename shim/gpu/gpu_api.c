/*
 * The public C API's GPU functions (include/dshim.h, "device buffers of a
 * CUDA program"): one process-wide pinned staging pool and stream-ordered
 * copies through the runtime table, for bindings that stage device tensors
 * (python/dshim/_staging.py).  The NCCL hook has its own pool per
 * communicator (hooks/nccl/nccl_exec_cuda.c).
 */
#include <pthread.h>

#include "dshim.h"
#include "gpu_runtime.h"
#include "gpu_staging.h"
#include "log.h"
#include "status.h"

/* free pinned blocks kept for reuse, as the NCCL hook keeps per communicator */
#define PROCESS_POOL_MAX_FREE ((size_t)1 << 30)

static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static dshim_gpu_pool_t *process_pool;  /* never freed: pinned memory may not be freed at exit */

static dshim_gpu_pool_t *pool_get(const dshim_gpu_runtime_t *rt)
{
    pthread_mutex_lock(&pool_lock);
    if (!process_pool) {
        process_pool = dshim_gpu_pool_create(rt, PROCESS_POOL_MAX_FREE, dshim_log_get_rank());
    }
    dshim_gpu_pool_t *pool = process_pool;
    pthread_mutex_unlock(&pool_lock);
    return pool;
}

DSHIM_EXPORT int dshim_gpu_available(void)
{
    return dshim_gpu_present();
}

DSHIM_EXPORT void *dshim_gpu_stage_get(size_t bytes, void **host_p)
{
    if (!host_p) {
        dshim_error(DSHIM_ERR_INVALID, "dshim_gpu_stage_get: host_p is NULL");
        return NULL;
    }
    *host_p = NULL;
    const dshim_gpu_runtime_t *rt = dshim_gpu_runtime();
    if (!rt) {
        dshim_error(DSHIM_ERR_UNSUPPORTED, "staging device buffers: no CUDA runtime in this process");
        return NULL;
    }
    dshim_gpu_pool_t *pool = pool_get(rt);
    dshim_gpu_block_t *b = pool ? dshim_gpu_pool_get(pool, bytes) : NULL;
    if (!b) {
        dshim_error(DSHIM_ERR_NOMEM, "staging device buffers: no pinned host memory for %zu bytes", bytes);
        return NULL;
    }
    *host_p = b->ptr;
    return b;
}

DSHIM_EXPORT void dshim_gpu_stage_put(void *block)
{
    if (block) {
        /* a block exists only where the pool does */
        dshim_gpu_pool_put(process_pool, block);
    }
}

/* Runs on `device`: the runtime's current device is per thread, and a
 * stream must be used on its own device. */
typedef struct device_scope {
    int saved;
    int switched;
} device_scope_t;

static dshim_gpu_err_t scope_enter(const dshim_gpu_runtime_t *rt, int device, device_scope_t *sc)
{
    sc->switched = 0;
    dshim_gpu_err_t e = rt->GetDevice(&sc->saved);
    if (e == DSHIM_GPU_SUCCESS && sc->saved != device) {
        e = rt->SetDevice(device);
        sc->switched = e == DSHIM_GPU_SUCCESS;
    }
    return e;
}

static void scope_leave(const dshim_gpu_runtime_t *rt, const device_scope_t *sc)
{
    if (sc->switched && rt->SetDevice(sc->saved) != DSHIM_GPU_SUCCESS) {
        rt->GetLastError();
    }
}

DSHIM_EXPORT dshim_status_t dshim_gpu_copy_async(void *dst, const void *src, size_t bytes, int device,
                                                 void *stream)
{
    /* before the runtime: a NULL is the caller's error on any machine */
    if (bytes && (!dst || !src)) {
        return dshim_error(DSHIM_ERR_INVALID, "dshim_gpu_copy_async: %s is NULL with %zu bytes", !dst ? "dst" : "src",
                           bytes);
    }
    const dshim_gpu_runtime_t *rt = dshim_gpu_runtime();
    if (!rt) {
        return dshim_error(DSHIM_ERR_UNSUPPORTED, "copying a device buffer: no CUDA runtime in this process");
    }
    if (bytes == 0) {
        return DSHIM_OK;
    }
    device_scope_t sc;
    dshim_gpu_err_t e = scope_enter(rt, device, &sc);
    if (e == DSHIM_GPU_SUCCESS) {
        e = rt->MemcpyAsync(dst, src, bytes, DSHIM_GPU_COPY_DEFAULT, stream);
    }
    if (e != DSHIM_GPU_SUCCESS) {
        dshim_status_t st = dshim_error(DSHIM_ERR_SYSTEM, "cudaMemcpyAsync of %zu bytes on device %d failed: %s",
                                        bytes, device, dshim_gpu_error_text(rt, e));
        scope_leave(rt, &sc);
        return st;
    }
    scope_leave(rt, &sc);
    return DSHIM_OK;
}

DSHIM_EXPORT dshim_status_t dshim_gpu_stream_sync(int device, void *stream)
{
    const dshim_gpu_runtime_t *rt = dshim_gpu_runtime();
    if (!rt) {
        return dshim_error(DSHIM_ERR_UNSUPPORTED, "waiting for a CUDA stream: no CUDA runtime in this process");
    }
    device_scope_t sc;
    dshim_gpu_err_t e = scope_enter(rt, device, &sc);
    if (e == DSHIM_GPU_SUCCESS) {
        e = rt->StreamSynchronize(stream);
    }
    if (e != DSHIM_GPU_SUCCESS) {
        dshim_status_t st = dshim_error(DSHIM_ERR_SYSTEM, "cudaStreamSynchronize on device %d failed: %s", device,
                                        dshim_gpu_error_text(rt, e));
        scope_leave(rt, &sc);
        return st;
    }
    scope_leave(rt, &sc);
    return DSHIM_OK;
}

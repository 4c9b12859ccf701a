/* The pinned staging pool (see gpu_staging.h). */
#include <pthread.h>
#include <stdlib.h>

#include "gpu_staging.h"
#include "log.h"
#include "net.h"

#define MIN_BLOCK ((size_t)64 << 10)

struct dshim_gpu_pool {
    const dshim_gpu_runtime_t *rt;
    size_t max_free_bytes;
    int rank;
    pthread_mutex_t lock;
    dshim_gpu_block_t *free_blocks;
    size_t free_bytes;
};

dshim_gpu_pool_t *dshim_gpu_pool_create(const dshim_gpu_runtime_t *rt, size_t max_free_bytes, int rank)
{
    dshim_gpu_pool_t *pool = calloc(1, sizeof(*pool));
    if (!pool) {
        return NULL;
    }
    pool->rt = rt;
    pool->max_free_bytes = max_free_bytes;
    pool->rank = rank;
    pthread_mutex_init(&pool->lock, NULL);
    return pool;
}

static void free_list(const dshim_gpu_runtime_t *rt, dshim_gpu_block_t *list)
{
    while (list) {
        dshim_gpu_block_t *b = list;
        list = b->next;
        rt->FreeHost(b->ptr);
        free(b);
    }
}

static dshim_gpu_block_t *pin_new(dshim_gpu_pool_t *pool, size_t size)
{
    dshim_gpu_block_t *b = malloc(sizeof(*b));
    if (!b) {
        return NULL;
    }
    double t0 = dshim_now();
    if (pool->rt->HostAlloc(&b->ptr, size, DSHIM_GPU_HOST_ALLOC_PORTABLE) != DSHIM_GPU_SUCCESS) {
        pool->rt->GetLastError();
        free(b);
        return NULL;
    }
    /* pinning can be slow (page by page under a sandboxing kernel): say so */
    double ms = (dshim_now() - t0) * 1e3;
    if (ms > 100) {
        DSHIM_INFO("rank %d: pinning %zu bytes of staging took %.0f ms", pool->rank, size, ms);
    } else {
        DSHIM_TRACE("rank %d: %zu bytes of pinned staging allocated in %.1f ms", pool->rank, size, ms);
    }
    b->size = size;
    b->next = NULL;
    return b;
}

dshim_gpu_block_t *dshim_gpu_pool_get(dshim_gpu_pool_t *pool, size_t size)
{
    size_t want = MIN_BLOCK;
    while (want < size) {
        want *= 2;
    }
    dshim_gpu_block_t *best = NULL, **best_pp = NULL, *trim = NULL;
    pthread_mutex_lock(&pool->lock);
    for (dshim_gpu_block_t **pp = &pool->free_blocks; *pp; pp = &(*pp)->next) {
        if ((*pp)->size >= size && (!best || (*pp)->size < best->size)) {
            best = *pp;  /* the smallest that fits: large blocks stay for large ops */
            best_pp = pp;
        }
    }
    if (best) {
        *best_pp = best->next;
        pool->free_bytes -= best->size;
    } else {
        /* a new block: first give back what the cap has no room for */
        while (pool->free_blocks && pool->free_bytes + want > pool->max_free_bytes) {
            dshim_gpu_block_t *b = pool->free_blocks;
            pool->free_blocks = b->next;
            pool->free_bytes -= b->size;
            b->next = trim;
            trim = b;
        }
    }
    pthread_mutex_unlock(&pool->lock);
    free_list(pool->rt, trim);  /* outside the lock: cudaFreeHost waits for the device */
    return best ? best : pin_new(pool, want);
}

void dshim_gpu_pool_put(dshim_gpu_pool_t *pool, dshim_gpu_block_t *b)
{
    pthread_mutex_lock(&pool->lock);
    b->next = pool->free_blocks;
    pool->free_blocks = b;
    pool->free_bytes += b->size;
    pthread_mutex_unlock(&pool->lock);
}

void dshim_gpu_pool_destroy(dshim_gpu_pool_t *pool)
{
    if (!pool) {
        return;
    }
    free_list(pool->rt, pool->free_blocks);
    pthread_mutex_destroy(&pool->lock);
    free(pool);
}

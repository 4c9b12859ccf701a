/*
 * A pool of pinned (page-locked) host blocks for staging device buffers
 * through host memory: copies between device and pinned memory run
 * asynchronously on a stream, and pinning is slow, so blocks are kept for
 * reuse.  Sizes are powers of two from 64 KiB; a request gets the smallest
 * free block that fits, so large blocks stay for large requests.
 *
 * Freeing pinned memory (cudaFreeHost) waits for the device.  So only
 * dshim_gpu_pool_get and dshim_gpu_pool_destroy free, never
 * dshim_gpu_pool_put: a thread that the device may be waiting for (a proxy
 * that releases streams) must only put.
 */
#ifndef DSHIM_GPU_STAGING_H
#define DSHIM_GPU_STAGING_H

#include <stddef.h>

#include "gpu_runtime.h"

typedef struct dshim_gpu_block {
    void *ptr;
    size_t size;
    struct dshim_gpu_block *next;  /* the pool's free list */
} dshim_gpu_block_t;

typedef struct dshim_gpu_pool dshim_gpu_pool_t;

/* A pool over rt that keeps at most max_free_bytes of free blocks; rank
 * (or -1) names the owner in its log lines.  NULL when out of memory. */
dshim_gpu_pool_t *dshim_gpu_pool_create(const dshim_gpu_runtime_t *rt, size_t max_free_bytes, int rank);

/* A block of at least size bytes, or NULL when pinning failed.  Before
 * pinning a new block it frees free blocks the cap has no room for. */
dshim_gpu_block_t *dshim_gpu_pool_get(dshim_gpu_pool_t *pool, size_t size);

/* Gives b back once nothing (no queued copy either) uses it.  Any thread;
 * never frees. */
void dshim_gpu_pool_put(dshim_gpu_pool_t *pool, dshim_gpu_block_t *b);

/* Frees every free block and the pool (every block must have been put). */
void dshim_gpu_pool_destroy(dshim_gpu_pool_t *pool);

#endif

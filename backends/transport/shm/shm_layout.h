/*
 * Internal to backends/transport/shm: the segment layout and the two ends of
 * a single-producer/single-consumer ring.  Only shm_ring.c and shm_conn.c
 * include this file.
 *
 * Segment file (all offsets from the start of the mapping):
 *
 *   line 0            header: magic, version, nrings, ring_size
 *   line 1            doorbell (u32) + sleepers (u32)
 *   host area         dshim_host_area_bytes(nrings), rounded up to lines,
 *                     in rank 0's inbox only (transport.h host_area; pages
 *                     nobody touches cost nothing); 0 bytes in the others
 *   per ring i:       head line (producer position, u64)
 *                     tail line (consumer position, u64)
 *                     data (ring_size bytes)
 *
 * "line" is DSHIM_SHM_LINE = 128 bytes: two 64-byte cache lines, so that the
 * adjacent-line prefetcher of x86 cores does not make the producer's and the
 * consumer's positions share fate either.
 *
 * head and tail are monotonically increasing byte counters (they never wrap
 * in practice: 2^64 bytes); the position in the data area is counter & mask.
 * head - tail is the number of bytes in the ring, always <= ring_size.
 */
#ifndef DSHIM_SHM_LAYOUT_H
#define DSHIM_SHM_LAYOUT_H

#include <stddef.h>
#include <stdint.h>
#include "transport/shm/shm_ring.h"

#define DSHIM_SHM_LINE      128
#define DSHIM_SHM_MAGIC     0x314d48534d494844ULL /* "DHIMSHM1" little-endian */
#define DSHIM_SHM_VERSION   3u /* 2: the host area; 3: its data blocks of 1 MiB */
#define DSHIM_SHM_MIN_RING  4096u
#define DSHIM_SHM_MAX_RING  ((size_t)1 << 30)
#define DSHIM_SHM_MAX_RINGS 65536

/* Process-local view of one ring inside a mapped segment. */
typedef struct dshim_shm_ring {
    uint64_t *head;       /* shared: written by the producer only */
    uint64_t *tail;       /* shared: written by the consumer only */
    unsigned char *data;  /* shared: ring_size bytes */
    size_t size;
    size_t mask;
} dshim_shm_ring_t;

/* Producer end: `head` is the authoritative position (only we write it);
 * `cached_tail` is a possibly stale copy of the consumer's position, which is
 * always safe to use because the real tail only grows (we under-estimate the
 * free space, never over-estimate it). */
typedef struct dshim_shm_producer {
    dshim_shm_ring_t ring;
    uint64_t head;
    uint64_t cached_tail;
} dshim_shm_producer_t;

/* Consumer end: symmetric (`cached_head` under-estimates the data present). */
typedef struct dshim_shm_consumer {
    dshim_shm_ring_t ring;
    uint64_t tail;
    uint64_t cached_head;
} dshim_shm_consumer_t;

/* Ring number `index` of a mapped segment; DSHIM_ERR_INVALID when out of range. */
dshim_status_t dshim_shm_seg_ring(dshim_shm_seg_t *seg, int index, dshim_shm_ring_t *ring_p);
size_t dshim_shm_seg_ring_size(const dshim_shm_seg_t *seg);

void dshim_shm_producer_init(dshim_shm_producer_t *p, const dshim_shm_ring_t *ring);
/* Copies up to len bytes in; returns the number taken (0 when full). */
size_t dshim_shm_producer_write(dshim_shm_producer_t *p, const void *buf, size_t len);

void dshim_shm_consumer_init(dshim_shm_consumer_t *c, const dshim_shm_ring_t *ring);
/* Contiguous readable bytes at *ptr_p (up to the wrap); 0 when empty. */
size_t dshim_shm_consumer_peek(dshim_shm_consumer_t *c, const void **ptr_p);
/* Bytes known to be readable without looking at shared memory. */
static inline size_t dshim_shm_consumer_cached(const dshim_shm_consumer_t *c)
{
    return (size_t)(c->cached_head - c->tail);
}
/* Releases n bytes (n <= dshim_shm_consumer_cached()). */
void dshim_shm_consumer_release(dshim_shm_consumer_t *c, size_t n);
/* Copies up to len bytes out and releases them; returns the number given. */
size_t dshim_shm_consumer_read(dshim_shm_consumer_t *c, void *buf, size_t len);

/* Wakes the segment's owner if it announced that it sleeps (shm_ring.c). */
void dshim_shm_doorbell_ring(dshim_shm_seg_t *seg);

#endif

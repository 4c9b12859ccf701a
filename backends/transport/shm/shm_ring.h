/*
 * Shared-memory transport between ranks of one host.
 *
 * Each rank owns one "inbox" segment (a file in DSHIM_SHM_DIR, mmapped
 * MAP_SHARED) holding one single-producer/single-consumer ring per possible
 * sender plus one 32-bit doorbell.  A sender writes into the receiver's inbox
 * ring for (sender -> receiver); the receiver reads from its own inbox.
 *
 * Doorbell: whenever a rank makes progress that another rank may be waiting
 * for (data written into the peer's ring, or space freed in a ring the peer
 * writes to), it rings that peer's doorbell: if the peer announced that it
 * is about to sleep, the bell is incremented and the peer futex-woken;
 * otherwise nothing is written.  A waiter announces itself (arm, which also
 * reads the bell), re-checks its conditions, sleeps on the value it read,
 * then withdraws (disarm): no lost wake-ups, and neither a system call nor
 * a write to a shared line on the hot path while nobody sleeps.
 */
#ifndef DSHIM_SHM_RING_H
#define DSHIM_SHM_RING_H

#include <stddef.h>
#include <stdint.h>
#include "dshim.h"
#include "transport/transport.h"

typedef struct dshim_shm_seg dshim_shm_seg_t;

/* Owner side: creates (O_EXCL) and maps DIR/NAME with `nrings` rings of
 * ring_size bytes (a power of two >= 4096), and a host area of
 * dshim_host_area_bytes(nrings) when host_area is set (only the segment of
 * the rank that holds the area has one). */
dshim_status_t dshim_shm_seg_create(const char *dir, const char *name, int nrings, size_t ring_size, int host_area,
                                    dshim_shm_seg_t **seg_p);
/* Peer side: maps an existing segment; checks its header (magic, nrings,
 * ring_size, size: host_area must be the creator's) and fails with
 * DSHIM_ERR_PROTOCOL on a mismatch. */
dshim_status_t dshim_shm_seg_attach(const char *dir, const char *name, int nrings, size_t ring_size, int host_area,
                                    dshim_shm_seg_t **seg_p);
/* Peer side, for a segment whose file the owner (process `pid`) already
 * removed: maps it through the owner's descriptor fd (/proc/PID/fd/FD, which
 * a process of the same user may open), with the checks of attach. */
dshim_status_t dshim_shm_seg_attach_fd(int pid, int fd, int nrings, size_t ring_size, int host_area,
                                       dshim_shm_seg_t **seg_p);
/* The owner's descriptor of a segment it created (open until detach). */
int dshim_shm_seg_fd(const dshim_shm_seg_t *seg);
/* Removes the file (mappings stay valid, and so does the owner's descriptor). */
void dshim_shm_seg_unlink(dshim_shm_seg_t *seg);
void dshim_shm_seg_detach(dshim_shm_seg_t *seg);
/* The segment's host area (transport.h host_area): dshim_host_area_bytes(nrings)
 * bytes; NULL when it was made without one. */
void *dshim_shm_seg_host_area(dshim_shm_seg_t *seg);

/* Reserves the pages of ring `index` (posix_fallocate through the owner's
 * descriptor), so that touching it can never raise SIGBUS on a full tmpfs.
 * Idempotent.  On failure a quiet one-line error naming `what`, the size,
 * dir (the shm directory, for the message) and the ways out. */
dshim_status_t dshim_shm_seg_reserve_ring(dshim_shm_seg_t *seg, int index, const char *dir, const char *what);

/* Connection my_rank <-> peer_rank (process peer_pid, for single-copy
 * reads).  Sends go to peer_inbox's ring number my_rank; receives come from
 * my_inbox's ring number peer_rank.  The connection takes ownership of
 * control_fd (closes it on destroy) but not of the segments. */
dshim_status_t dshim_shm_conn_create(dshim_shm_seg_t *my_inbox, dshim_shm_seg_t *peer_inbox,
                                     int my_rank, int peer_rank, int peer_pid, int control_fd,
                                     dshim_conn_t **conn_p);

/* Doorbell of a segment (use them on my_inbox).  arm announces a sleeper
 * and returns the bell's value; the caller then re-checks its conditions and
 * either waits with that value or not, and disarms in both cases.  A ring
 * after arm is never lost; one before it is seen by the re-check. */
uint32_t dshim_shm_doorbell_arm(dshim_shm_seg_t *seg);
void dshim_shm_doorbell_disarm(dshim_shm_seg_t *seg);
/* Sleeps while the doorbell still equals `seen`, at most timeout_us.
 * Returns DSHIM_OK on wake/timeout alike (callers re-check their state). */
dshim_status_t dshim_shm_doorbell_wait(dshim_shm_seg_t *seg, uint32_t seen, long timeout_us);

#endif

/*
 * Dead peers for ncclCommGetAsyncError.
 *
 * An operation in flight already fails when a peer dies (dshim's engine sees
 * the connection close).  A watchdog polling an idle communicator must learn
 * it too, so every poll (at most every 50 ms) looks, without reading, for a
 * hang-up on each peer's socket (and, where ranks of one host meet in
 * shared memory without connections, whether one of them exited).  A peer that left cleanly (destroy, abort,
 * normal exit) first said so (dshim_hook_announce_leave): its hang-up is
 * not an error.  Any other hang-up fails the communicator, which also makes
 * the other ranks notice at once.  The test itself is the core's
 * (dshim_hook_probe_peers); this file only decides when to run it.
 */
#include "net.h"
#include "nccl/nccl_internal.h"

#define PROBE_INTERVAL_S 0.05

void dshim_nccl_probe(struct ncclComm *comm)
{
    dshim_comm_t *dc = comm->dc;
    if (!dc || dshim_hook_failed(dc) || !dshim_hook_owned_here(dc)) {
        return;
    }
    if (pthread_mutex_trylock(&comm->lock) != 0) {
        return;  /* another thread is probing */
    }
    double now = dshim_now();
    if (now - comm->last_probe >= PROBE_INTERVAL_S) {
        comm->last_probe = now;
        (void)dshim_hook_probe_peers(dc, comm->peer_left);  /* fails dc, which the caller reads */
    }
    pthread_mutex_unlock(&comm->lock);
}

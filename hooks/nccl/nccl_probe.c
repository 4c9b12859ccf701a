/*
 * Dead peers for ncclCommGetAsyncError.
 *
 * An operation in flight already fails when a peer dies (dshim's engine sees
 * the connection close).  A watchdog polling an idle communicator must learn
 * it too, so every poll (at most every 50 ms) looks, without reading, for a
 * hang-up on each peer's socket.  A peer that left cleanly (destroy, abort,
 * normal exit) first wrote "<prefix>nccl-left/<rank>" in the store: its
 * hang-up is not an error.  Any other hang-up fails the communicator, which
 * also makes the other ranks notice at once.
 */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>

#include "engine.h"
#include "net.h"
#include "nccl/nccl_internal.h"
#include "status.h"
#include "store.h"

#define PROBE_INTERVAL_S 0.05

/* 1: the peer announced it left; 0: it did not; -1: cannot tell (the store
 * is gone, typically with the process that hosted it) */
static int peer_announced_leave(dshim_comm_t *dc, int peer)
{
    if (!dc->store || !dc->store->store) {
        return -1;
    }
    char key[160];
    snprintf(key, sizeof(key), "%snccl-left/%d", dc->prefix, peer);
    void *val = NULL;
    size_t len = 0;
    dshim_status_t st = dshim_store_try_get(dc->store->store, key, &val, &len);
    if (st == DSHIM_OK) {
        free(val);
        return 1;
    }
    return st == DSHIM_INPROGRESS ? 0 : -1;
}

void dshim_nccl_probe(struct ncclComm *comm)
{
    dshim_comm_t *dc = comm->dc;
    if (!dc || __atomic_load_n(&dc->error, __ATOMIC_ACQUIRE) != DSHIM_OK ||
        dc->owner_pid != dshim_self_pid()) {
        return;
    }
    if (pthread_mutex_trylock(&comm->lock) != 0) {
        return;  /* another thread is probing */
    }
    double now = dshim_now();
    if (now - comm->last_probe < PROBE_INTERVAL_S) {
        pthread_mutex_unlock(&comm->lock);
        return;
    }
    comm->last_probe = now;
    int dead = -1, unknown = 0;
    for (int r = 0; r < dc->size && dead < 0; r++) {
        dshim_conn_t *conn = dc->conns[r];
        if (!conn || conn->fd < 0 || comm->peer_left[r]) {
            continue;
        }
        struct pollfd p = {.fd = conn->fd, .events = POLLRDHUP};
        if (poll(&p, 1, 0) <= 0 || !(p.revents & (POLLRDHUP | POLLHUP | POLLERR))) {
            continue;
        }
        int left = peer_announced_leave(dc, r);
        if (left == 1) {
            comm->peer_left[r] = 1;
            continue;
        }
        dead = r;
        unknown = left < 0;
    }
    pthread_mutex_unlock(&comm->lock);
    if (dead >= 0) {
        char who[160], msg[768];
        dshim_comm_describe_peer(dc, dead, who, sizeof(who));
        /* the hang-up may only be the echo of a failure another rank saw
         * first (it closes its connections then): name that one */
        char key[160];
        void *first = NULL;
        size_t len = 0;
        snprintf(key, sizeof(key), "%sabort", dc->prefix);
        if (!unknown && dshim_store_try_get(dc->store->store, key, &first, &len) == DSHIM_OK) {
            snprintf(msg, sizeof(msg), "rank %d: the communicator failed at another rank: %.*s", dc->rank, (int)len,
                     (char *)first);
            free(first);
            dshim_comm_fail(dc, DSHIM_ERR_ABORTED, msg);
            dshim_engine_wake(dc);
            return;
        }
        if (unknown) {
            snprintf(msg, sizeof(msg),
                     "rank %d: %s closed its connection, and the rendezvous store is gone too (its host exited): "
                     "the communicator cannot be used any more",
                     dc->rank, who);
        } else {
            snprintf(msg, sizeof(msg),
                     "rank %d: %s closed its connection without leaving the communicator (it crashed, was killed "
                     "or its host went away)",
                     dc->rank, who);
        }
        dshim_comm_fail(dc, DSHIM_ERR_PEER, msg);
        dshim_engine_wake(dc);
    }
}

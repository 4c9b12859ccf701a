/* The hook-facing API (dshim_hook.h) over the communicator's
 * internals, so that no hook depends on how a communicator is laid out. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "dshim_hook.h"
#include "engine.h"
#include "host_gate.h"
#include "status.h"
#include "store.h"

int dshim_hook_failed(const dshim_comm_t *comm)
{
    return __atomic_load_n(&comm->error, __ATOMIC_ACQUIRE) != DSHIM_OK;
}

int dshim_hook_owned_here(const dshim_comm_t *comm)
{
    return comm->owner_pid == dshim_self_pid();
}

dshim_status_t dshim_hook_check_owner(const dshim_comm_t *comm, const char *what)
{
    return dshim_comm_check_owner(comm, what);
}

int dshim_hook_local_size(const dshim_comm_t *comm)
{
    return comm->nlocal;
}

void dshim_hook_shares_cores(dshim_comm_t *comm)
{
    dshim_engine_spin_rule(comm, 2);
}

double dshim_hook_timeout(const dshim_comm_t *comm)
{
    return comm->timeout_s >= 1e9 ? 0 : comm->timeout_s; /* 1e9 stands for "no limit" (dshim_engine_init) */
}

int dshim_hook_is_world(const dshim_comm_t *comm)
{
    return strcmp(comm->prefix, "c0/") == 0;
}

void dshim_hook_describe_peer(const dshim_comm_t *comm, int peer, char *out, size_t len)
{
    dshim_comm_describe_peer(comm, peer, out, len);
}

static dshim_store_t *store_of(const dshim_comm_t *comm)
{
    return comm->store ? comm->store->store : NULL;
}

static void full_key(const dshim_comm_t *comm, const char *key, char *out, size_t len)
{
    snprintf(out, len, "%s%s", comm->prefix, key);
}

dshim_status_t dshim_hook_store_set(dshim_comm_t *comm, const char *key, const void *val, size_t len)
{
    dshim_store_t *s = store_of(comm);
    if (!s) {
        return dshim_error(DSHIM_ERR_ABORTED, "rank %d: the communicator's store is closed", comm->rank);
    }
    char k[256];
    full_key(comm, key, k, sizeof(k));
    return dshim_store_set(s, k, val, len);
}

dshim_status_t dshim_hook_store_try_get(dshim_comm_t *comm, const char *key, void **val, size_t *len)
{
    dshim_store_t *s = store_of(comm);
    if (!s) {
        return dshim_error(DSHIM_ERR_ABORTED, "rank %d: the communicator's store is closed", comm->rank);
    }
    char k[256];
    full_key(comm, key, k, sizeof(k));
    return dshim_store_try_get(s, k, val, len);
}

int64_t dshim_hook_goodbyes(dshim_comm_t *comm)
{
    dshim_store_t *s = store_of(comm);
    int64_t v = 0;
    /* the goodbye counter is the job's, not one communicator's: no prefix (comm.c) */
    if (!s || dshim_store_add(s, "bye", 0, &v) != DSHIM_OK) {
        return -1;
    }
    return v;
}

dshim_status_t dshim_hook_fail(dshim_comm_t *comm, dshim_status_t st, const char *msg)
{
    dshim_status_t r = dshim_comm_fail(comm, st, msg);
    dshim_engine_wake(comm);
    return r;
}

void dshim_hook_announce_leave(dshim_comm_t *comm)
{
    char key[64];
    snprintf(key, sizeof(key), "left/%d", comm->rank);
    (void)dshim_hook_store_set(comm, key, "1", 1);
}

/* 1: the peer announced it left; 0: it did not; -1: cannot tell (the store
 * is gone, typically with the process that hosted it) */
static int peer_announced_leave(dshim_comm_t *comm, int peer)
{
    if (!store_of(comm)) {
        return -1;
    }
    char key[64];
    snprintf(key, sizeof(key), "left/%d", peer);
    void *val = NULL;
    size_t len = 0;
    dshim_status_t st = dshim_hook_store_try_get(comm, key, &val, &len);
    if (st == DSHIM_OK) {
        free(val);
        return 1;
    }
    return st == DSHIM_INPROGRESS ? 0 : -1;
}

dshim_status_t dshim_hook_probe_peers(dshim_comm_t *comm, unsigned char *left)
{
    if (dshim_hook_failed(comm) || !dshim_hook_owned_here(comm)) {
        return DSHIM_OK;  /* a failed communicator reports its own error */
    }
    int dead = -1, unknown = 0;
    for (int r = 0; r < comm->size && dead < 0; r++) {
        /* only connected peers: a peer never connected to has no socket to
         * hang up; its death reaches this rank through the peers that were
         * connected to it (they fail, and shut their connections, ours
         * among them), or as a refused connection on first use */
        dshim_conn_t *conn = dshim_comm_conn(comm, r);
        if (!conn || left[r] || !conn->ops->hung_up(conn)) {
            continue;
        }
        int announced = peer_announced_leave(comm, r);
        if (announced == 1) {
            left[r] = 1;
            continue;
        }
        dead = r;
        unknown = announced < 0;
    }
    int exited = 0;
    if (dead < 0 && comm->gate_transport >= 0 && comm->size > 1) {
        /* ranks that meet in the host gate never connect: one of them per
         * probe is looked up in /proc (every rank within size probes) */
        int r = (int)((unsigned)__atomic_fetch_add(&comm->gate_probe_next, 1, __ATOMIC_RELAXED) % (unsigned)comm->size);
        if (!left[r] && !dshim_comm_conn(comm, r) && dshim_host_gate_rank_exited(comm, r)) {
            int announced = peer_announced_leave(comm, r);
            if (announced == 1) {
                left[r] = 1;
            } else {
                dead = r;
                exited = 1;
                unknown = announced < 0;
            }
        }
    }
    if (dead < 0) {
        return DSHIM_OK;
    }
    char who[160], msg[768];
    dshim_comm_describe_peer(comm, dead, who, sizeof(who));
    /* the hang-up may only be the echo of a failure another rank saw first
     * (it closes its connections then): name that one */
    void *first = NULL;
    size_t len = 0;
    if (!unknown && dshim_hook_store_try_get(comm, "abort", &first, &len) == DSHIM_OK) {
        snprintf(msg, sizeof(msg), "rank %d: the communicator failed at another rank: %.*s", comm->rank, (int)len,
                 (char *)first);
        free(first);
        return dshim_hook_fail(comm, DSHIM_ERR_ABORTED, msg);
    }
    const char *how = exited ? "exited" : "closed its connection";
    if (unknown) {
        snprintf(msg, sizeof(msg),
                 "rank %d: %s %s, and the rendezvous store is gone too (its host exited): the communicator "
                 "cannot be used any more",
                 comm->rank, who, how);
    } else {
        snprintf(msg, sizeof(msg),
                 "rank %d: %s %s without leaving the communicator (it crashed, was killed or its host went away)",
                 comm->rank, who, how);
    }
    return dshim_hook_fail(comm, DSHIM_ERR_PEER, msg);
}

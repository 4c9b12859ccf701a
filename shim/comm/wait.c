/* The wait rule (see wait.h): the arrival marks, the timeout, the stall
 * warnings and the recorder's waiting marks of every waiting operation, and
 * the words of their messages. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "config.h"
#include "log.h"
#include "status.h"
#include "store.h"
#include "wait.h"
#include "xfer.h"

/* A collective marks its arrival once it has waited this long: most
 * collectives never wait that long, so most never write the store. */
#define ANNOUNCE_AFTER_S 1.0

/* Store calls made while a collective waits are bookkeeping: they give up
 * after this long (at most a quarter of the timeout) so that a stopped or
 * cut-off store host (rank 0, or the launcher) cannot stretch the wait past
 * the communicator's timeout or hold back its stall warnings. */
static double store_peek_s(const dshim_comm_t *comm)
{
    double q = comm->timeout_s / 4;
    return q < 0.5 ? q : 0.5;
}

/* One key per rank, `<prefix>at/<rank>` = the latest collective it waited
 * in (not one per collective), so a rank that already finished `seq` and
 * waits in a later one still counts as arrived.  Best effort: an unanswered
 * store only leaves the mark unset (the lists then say the store is
 * silent). */
void dshim_wait_announce(dshim_comm_t *comm, uint64_t seq, int *store_silent)
{
    char key[160], val[24];
    snprintf(key, sizeof(key), "%sat/%d", comm->prefix, comm->rank);
    int n = snprintf(val, sizeof(val), "%" PRIu64, seq);
    double patience = dshim_store_patience(store_peek_s(comm));
    if (dshim_store_set(comm->store->store, key, val, (size_t)n) != DSHIM_OK) {
        *store_silent = 1;
    }
    dshim_store_patience(patience);
}

int dshim_wait_marks_missing(dshim_comm_t *comm, uint64_t seq, int *out, int *store_silent)
{
    int n = 0;
    double patience = dshim_store_patience(store_peek_s(comm));
    for (int r = 0; r < comm->size && !*store_silent; r++) {
        if (r == comm->rank) {
            continue;
        }
        char key[160];
        void *val = NULL;
        size_t vl = 0;
        snprintf(key, sizeof(key), "%sat/%d", comm->prefix, r);
        dshim_status_t st = dshim_store_try_get(comm->store->store, key, &val, &vl);
        if (st == DSHIM_OK) {
            uint64_t at = strtoull(val, NULL, 10);
            free(val);
            if (at >= seq) {
                continue;
            }
        } else if (st != DSHIM_INPROGRESS) {
            *store_silent = 1;
            break;
        }
        out[n++] = r;
    }
    dshim_store_patience(patience);
    return *store_silent ? -1 : n;
}

void dshim_wait_list(const dshim_comm_t *comm, const int *missing, int n, char *out, size_t len)
{
    if (n < 0) {
        /* no ';' in it: the list ends at the next one */
        snprintf(out, len, "unknown (the rendezvous store at %s:%d did not answer: its host, rank 0 or the "
                 "launcher, may be stopped, cut off or gone)", comm->store->addr, comm->store->port);
        return;
    }
    if (n == 0) {
        snprintf(out, len, "none known (check the other ranks' logs)");
        return;
    }
    size_t o = 0;
    out[0] = 0;
    for (int i = 0; i < n && o + 32 < len; i++) {
        dshim_comm_list_rank(comm, missing[i], out, len, &o);
    }
}

/* The ranks that have not arrived (comm->wait_ranks), their count (-1:
 * unknown); 0 for point-to-point, whose messages have no arrival. */
static int missing_now(dshim_comm_t *comm, dshim_wait_t *w)
{
    if (w->sig->coll == DSHIM_COLL_P2P) {
        return 0;
    }
    const dshim_wait_source_t *src = w->src;
    return src->missing ? src->missing(comm, src->ctx, w->sig->seq, comm->wait_ranks, &w->store_silent)
                        : dshim_wait_marks_missing(comm, w->sig->seq, comm->wait_ranks, &w->store_silent);
}

/* Nothing moved for the communicator's timeout: fails the operation,
 * naming what it waited for and (collectives) the ranks that never
 * arrived, which the failure keeps as its verdict. */
static dshim_status_t fail_timeout(dshim_comm_t *comm, dshim_wait_t *w)
{
    char doing[768], list[384];
    w->src->doing(comm, w->src->ctx, doing, sizeof(doing));
    if (w->sig->coll == DSHIM_COLL_P2P) {
        /* `doing` names the peers that did not send */
        dshim_error_quiet(DSHIM_ERR_TIMEOUT, "did not complete within %g s " DSHIM_TIMEOUT_WHY " while %s",
                          comm->timeout_s, doing);
        return dshim_xfer_fail(comm, w->sig, DSHIM_ERR_TIMEOUT);
    }
    int n = missing_now(comm, w);
    dshim_wait_list(comm, comm->wait_ranks, n, list, sizeof(list));
    dshim_error_quiet(DSHIM_ERR_TIMEOUT,
                      "did not complete within %g s " DSHIM_TIMEOUT_WHY " while %s; ranks that did not arrive "
                      "at this collective: %s",
                      comm->timeout_s, doing, list);
    return dshim_xfer_fail_missing(comm, w->sig, DSHIM_ERR_TIMEOUT, comm->wait_ranks, n);
}

/* Nothing moved for `waited` seconds, less than the timeout: a warning
 * naming the operation and whom it waits for, so that a long timeout
 * (torch's 30 min) is never a silent hang.  Not an error: it goes on
 * waiting. */
static void warn_stall(dshim_comm_t *comm, dshim_wait_t *w, double waited)
{
    char doing[768], list[384] = "";
    w->src->doing(comm, w->src->ctx, doing, sizeof(doing));
    int n = missing_now(comm, w);
    if (n != 0) {
        dshim_wait_list(comm, comm->wait_ranks, n, list, sizeof(list));
    }
    DSHIM_WARN("rank %d (host %s): %s #%" PRIu64 " has made no progress for %.0f s while %s%s%s; it fails after "
               "%g s without progress (the communicator's timeout; DSHIM_STALL_WARN sets how often this is said)",
               comm->rank, comm->peers[comm->rank].hostname, dshim_coll_name(w->sig->coll), w->sig->seq, waited,
               doing, list[0] ? "; ranks that have not arrived at it: " : "", list, comm->timeout_s);
}

dshim_status_t dshim_wait_look(dshim_comm_t *comm, dshim_wait_t *w, double now, int max_ms, int *sleep_ms)
{
    double waited = now - w->since;
    if (!w->announced && now - w->start > ANNOUNCE_AFTER_S) {
        dshim_wait_announce(comm, w->sig->seq, &w->store_silent);
        w->announced = 1;
    }
    if (waited > comm->timeout_s) {
        return fail_timeout(comm, w);
    }
    if (w->stall_s > 0 && waited >= w->warn_after) {
        warn_stall(comm, w, waited);
        w->warn_after += w->stall_s;
    }
    if (comm->trace && (!w->traced || w->remark)) {
        if (w->src->trace_waiting) {
            w->src->trace_waiting(comm, w->src->ctx);
        } else {
            dshim_trace_waiting(comm->trace, comm->trace_op, NULL, 0);
        }
        w->traced = 1;
        w->remark = 0;
    }
    double left_ms = (comm->timeout_s - waited) * 1000;
    *sleep_ms = left_ms < max_ms ? (int)left_ms + 1 : max_ms;
    return DSHIM_OK;
}

void dshim_wait_moved(dshim_comm_t *comm, dshim_wait_t *w)
{
    if (w->src->trace_moving) {
        w->src->trace_moving(comm, w->src->ctx);
    } else {
        dshim_trace_moving(comm->trace, comm->trace_op);
    }
    w->traced = 0;
    w->remark = 0;
}

dshim_status_t dshim_wait_fail_gone(dshim_comm_t *comm, const dshim_wait_t *w, int gone, const int *missing, int n)
{
    char who[160], list[384];
    dshim_comm_describe_peer(comm, gone, who, sizeof(who));
    dshim_wait_list(comm, missing, n, list, sizeof(list));
    dshim_error_quiet(DSHIM_ERR_PEER, "%s exited before it arrived at the collective (ranks that did not arrive at "
                      "this collective: %s)", who, list);
    return dshim_xfer_fail_missing(comm, w->sig, DSHIM_ERR_PEER, missing, n);
}

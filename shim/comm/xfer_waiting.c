/* The flight recorder's view of a sleeping step: whom it waits for (a part
 * of the data engine, xfer_impl.h). */
#include <stdio.h>
#include <string.h>

#include "comm.h"
#include "engine.h"
#include "status.h"
#include "xfer_impl.h"

static void add_rank(int *ranks, int *n, int r)
{
    for (int i = 0; i < *n; i++) {
        if (ranks[i] == r) {
            return;
        }
    }
    if (*n < DSHIM_TRACE_WAIT_MAX) {
        ranks[(*n)++] = r;
    }
}

/* The ranks ops[a] waits for: its peer, or for a receive from any source
 * not bound yet, the candidates that have sent it nothing (silent_ranks). */
static void op_waits_for(dshim_comm_t *comm, const dshim_xfer_op_t *ops, int a, int *ranks, int *n)
{
    if (!unbound(&ops[a])) {
        add_rank(ranks, n, ops[a].peer);
        return;
    }
    for (int p = 0; p < comm->size && *n < DSHIM_TRACE_WAIT_MAX; p++) {
        int front = FRONT_EMPTY;
        if (!dshim_xfer_may_send(comm, ops, a, p) ||
            (dshim_xfer_candidate(comm, ops, a, p) && dshim_xfer_stream_front(comm, p, &front) == DSHIM_OK && front == FRONT_P2P)) {
            continue;
        }
        add_rank(ranks, n, p);
    }
}

/* Nothing moved and the step goes to sleep: its entries become "waiting",
 * naming the ranks.  A collective: one entry (comm->trace_op), the peers of
 * the ops that could move but do not (not those held back by their own
 * dependency).  A point-to-point batch: an entry per request, its peer. */
void dshim_xfer_trace_wait(dshim_comm_t *comm, int p2p, dshim_xfer_op_t *ops, int n)
{
    int ranks[DSHIM_TRACE_WAIT_MAX];
    int k = 0;
    if (!p2p) {
        for (int i = 0; i < n; i++) {
            dshim_xfer_op_t *op = &ops[i];
            if (op_active(op) && op->phase == PH_BODY && op->done < op->len && op->done >= limit_of(op)) {
                continue;
            }
            if (next_to_bind(op) || op_active(op) || (op->connecting && op->phase != PH_DONE)) {
                op_waits_for(comm, ops, i, ranks, &k);
            }
        }
        dshim_trace_waiting(comm->trace, comm->trace_op, ranks, k);
        return;
    }
    for (int i = 0; i < n; i++) {
        /* a reported request may be freed already by its owner */
        if (ops[i].phase == PH_DONE || ops[i].reported || !ops[i].user) {
            continue;
        }
        k = 0;
        op_waits_for(comm, ops, i, ranks, &k);
        dshim_trace_waiting(comm->trace, ((dshim_request_t *)ops[i].user)->trace_id, ranks, k);
    }
}

/* Data moves again after trace_wait. */
void dshim_xfer_trace_moving(dshim_comm_t *comm, int p2p, dshim_xfer_op_t *ops, int n)
{
    if (!p2p) {
        dshim_trace_moving(comm->trace, comm->trace_op);
        return;
    }
    for (int i = 0; i < n; i++) {
        if (!ops[i].reported && ops[i].user) {
            dshim_trace_moving(comm->trace, ((dshim_request_t *)ops[i].user)->trace_id);
        }
    }
}

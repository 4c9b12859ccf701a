/*
 * Hierarchical collectives: when ranks span several hosts and some host has
 * several (shim/comm/topo.c), a collective runs as steps on the private
 * sub-communicators of the host's ranks (comm->local: shared memory) and of
 * the hosts' first ranks (comm->leaders: the network), so that the network
 * carries one rank per host.
 */
#include <string.h>

#include "coll.h"
#include "status.h"

/* One step of a hierarchical collective, run directly on a private
 * sub-communicator from the parent's executor.  A failure there fails the
 * parent too, with the sub-step's message. */
static dshim_status_t sub_step(dshim_comm_t *parent, dshim_comm_t *sub, dshim_exec_fn_t fn, dshim_coll_kind_t kind,
                               const void *sbuf, void *rbuf, size_t count, dshim_dtype_t dt, dshim_redop_t op)
{
    dshim_request_t r;
    memset(&r, 0, sizeof(r));
    r.sbuf = sbuf;
    r.rbuf = rbuf;
    r.count = count;
    r.dtype = dt;
    r.op = op;
    r.root = 0;
    r.sig.coll = (uint8_t)kind;
    r.sig.dtype = (uint8_t)dt;
    r.sig.redop = (uint8_t)op;
    r.sig.root = kind == DSHIM_COLL_ALLREDUCE || kind == DSHIM_COLL_BARRIER ? -1 : 0; /* as the API sets it */
    r.sig.count = count;
    r.sig.seq = sub->next_seq++;
    if (sub->trace) {
        /* the sub-communicator's own ring: its dump shows which host step
         * (reduce inside the host, allreduce between hosts, broadcast) waits */
        r.comm = sub;
        dshim_trace_op_t top;
        dshim_engine_trace_op(&r, &top);
        r.trace_id = dshim_trace_queued(sub->trace, &top);
        sub->trace_op = r.trace_id;
        dshim_trace_started(sub->trace, r.trace_id, r.sig.seq, dshim_algo_name(sub, &r), sub->transport_desc);
    }
    dshim_status_t st = fn(sub, &r);
    dshim_trace_done(sub->trace, r.trace_id, st == DSHIM_OK);
    if (st != DSHIM_OK) {
        char msg[768];
        snprintf(msg, sizeof(msg), "%s", dshim_last_error());
        return dshim_comm_fail(parent, st, msg);
    }
    return DSHIM_OK;
}

dshim_status_t dshim_allreduce_hier(dshim_comm_t *comm, dshim_request_t *req)
{
    dshim_redop_t op = req->op == DSHIM_AVG ? DSHIM_SUM : req->op;
    DSHIM_CHECK(sub_step(comm, comm->local, dshim_coll_reduce, DSHIM_COLL_REDUCE, req->sbuf, req->rbuf, req->count,
                         req->dtype, op));
    if (comm->leaders) {
        DSHIM_CHECK(sub_step(comm, comm->leaders, dshim_coll_allreduce, DSHIM_COLL_ALLREDUCE, req->rbuf, req->rbuf,
                             req->count, req->dtype, op));
        if (req->op == DSHIM_AVG) {
            DSHIM_CHECK(comm->reduce->scale_div(req->rbuf, req->count, req->dtype, comm->size, NULL));
        }
    }
    return sub_step(comm, comm->local, dshim_coll_broadcast, DSHIM_COLL_BROADCAST, req->rbuf, req->rbuf, req->count,
                    req->dtype, DSHIM_SUM);
}

dshim_status_t dshim_barrier_hier(dshim_comm_t *comm, dshim_request_t *req)
{
    DSHIM_CHECK(sub_step(comm, comm->local, dshim_coll_barrier, DSHIM_COLL_BARRIER, NULL, NULL, 0, req->dtype,
                         req->op));
    if (comm->leaders) {
        DSHIM_CHECK(sub_step(comm, comm->leaders, dshim_coll_barrier, DSHIM_COLL_BARRIER, NULL, NULL, 0, req->dtype,
                             req->op));
    }
    return sub_step(comm, comm->local, dshim_coll_barrier, DSHIM_COLL_BARRIER, NULL, NULL, 0, req->dtype, req->op);
}

/*
 * Request engine: every operation of a communicator is a request executed
 * one at a time in issue order.  A blocking call executes its own request in
 * the caller's thread when the queue is idle (no thread hand-off on the
 * latency path); non-blocking requests are executed by a progress thread
 * (started on first use) or by whichever thread waits on them first.
 */
#ifndef DSHIM_ENGINE_H
#define DSHIM_ENGINE_H

#include "comm.h"

typedef dshim_status_t (*dshim_exec_fn_t)(dshim_comm_t *comm, dshim_request_t *req);

struct dshim_request {
    dshim_comm_t *comm;
    dshim_exec_fn_t fn;
    dshim_coll_sig_t sig;
    const void *sbuf;
    void *rbuf;
    size_t count;
    dshim_dtype_t dtype;
    dshim_redop_t op;
    int root;    /* root, or peer for send/recv */
    int sending; /* send/recv: 1 = send (a zero-byte send may have a NULL buffer) */
    int source;     /* recv: the sender's rank once matched (root may be DSHIM_ANY_SOURCE) */
    int *source_p;  /* recv: where the caller wants it (may be NULL) */
    /* v-variants: arrays copied into `owned` so the caller may free theirs */
    const size_t *counts, *displs;           /* allgatherv */
    const size_t *scounts, *sdispls, *rcounts, *rdispls; /* alltoallv */
    size_t *owned;
    int heap;
    uint64_t trace_id; /* its flight-recorder entry (comm->trace) */
    int trace_begin;   /* recorded when it runs (dshim_trace_begin): submitted to an idle engine, blocking */
    int done;
    dshim_status_t status;
    dshim_request_t *next;
};

void dshim_engine_init(dshim_comm_t *comm);
/* How comm's waits spin (comm->spin_us, spin_yields) for `threads` busy
 * threads per rank on this host: yielding on every poll once they outnumber
 * the cores.  The collectives' algorithm choices read spin_yields, so every
 * rank of comm must give the same count, before comm's first collective. */
void dshim_engine_spin_rule(dshim_comm_t *comm, int threads);
/* Queues req (seq assigned now).  blocking: waits and returns the status;
 * otherwise returns DSHIM_OK at once. */
dshim_status_t dshim_engine_submit(dshim_comm_t *comm, dshim_request_t *req, int blocking);
/* Drains the queue and stops the progress thread. */
void dshim_engine_shutdown(dshim_comm_t *comm);
void dshim_engine_wake(dshim_comm_t *comm);
/* What the flight recorder keeps of a request (its op, dtype, count, ...). */
void dshim_engine_trace_op(const dshim_request_t *req, dshim_trace_op_t *op);

#endif

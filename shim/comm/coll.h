/* Collective algorithms: each runs inside the engine's executor, written
 * against dshim_xfer() only (never against a transport). */
#ifndef DSHIM_COLL_H
#define DSHIM_COLL_H

#include "engine.h"
#include "xfer.h"

dshim_status_t dshim_algo_allreduce(dshim_comm_t *comm, dshim_request_t *req);
dshim_status_t dshim_algo_broadcast(dshim_comm_t *comm, dshim_request_t *req);
dshim_status_t dshim_algo_reduce(dshim_comm_t *comm, dshim_request_t *req);
dshim_status_t dshim_algo_allgatherv(dshim_comm_t *comm, dshim_request_t *req);
dshim_status_t dshim_algo_reduce_scatter(dshim_comm_t *comm, dshim_request_t *req);
dshim_status_t dshim_algo_alltoallv(dshim_comm_t *comm, dshim_request_t *req);
dshim_status_t dshim_algo_gather(dshim_comm_t *comm, dshim_request_t *req);
dshim_status_t dshim_algo_scatter(dshim_comm_t *comm, dshim_request_t *req);
dshim_status_t dshim_algo_barrier(dshim_comm_t *comm, dshim_request_t *req);

/* Recursive-doubling allreduce of buf in place (latency-optimal; any size,
 * non-powers of two fold the extra ranks in first). */
dshim_status_t dshim_allreduce_rd(dshim_comm_t *comm, const dshim_coll_sig_t *sig, void *buf, size_t count);
/* Direct reduce-scatter then allgather: rank p reduces part p, received
 * from every rank at once, and sends it to every rank (two rounds instead of
 * the ring's 2(N-1) steps, the same bytes; every rank talks to every other). */
dshim_status_t dshim_allreduce_direct(dshim_comm_t *comm, const dshim_coll_sig_t *sig, const void *sbuf, void *rbuf,
                                      size_t count);
/* Pipelined ring: reduce-scatter then allgather, one xfer for all steps. */
dshim_status_t dshim_allreduce_ring(dshim_comm_t *comm, const dshim_coll_sig_t *sig, const void *sbuf, void *rbuf,
                                    size_t count);

/* Which allreduce algorithm runs a request: decided here once, for
 * dshim_algo_allreduce and for the flight recorder's entry. */
typedef enum { DSHIM_AR_NONE = 0, DSHIM_AR_HIER, DSHIM_AR_RD, DSHIM_AR_RING, DSHIM_AR_DIRECT } dshim_ar_choice_t;
static inline dshim_ar_choice_t dshim_allreduce_choice(const dshim_comm_t *comm, const dshim_request_t *req)
{
    size_t bytes = req->count * dshim_dtype_size(req->dtype);
    if (req->count == 0 || comm->size == 1) {
        return DSHIM_AR_NONE;
    }
    if (comm->local &&
        (comm->algo == DSHIM_ALGO_HIER || (comm->algo == DSHIM_ALGO_AUTO && bytes > comm->small_msg_bytes))) {
        return DSHIM_AR_HIER;
    }
    if (comm->algo == DSHIM_ALGO_DIRECT) {
        return DSHIM_AR_DIRECT;
    }
    if (comm->algo == DSHIM_ALGO_RD ||
        (comm->algo == DSHIM_ALGO_AUTO && (bytes <= comm->small_msg_bytes || req->count < (size_t)comm->size))) {
        return DSHIM_AR_RD;
    }
    return DSHIM_AR_RING;
}

/* Broadcast: a binomial tree for small messages, else a pipelined chain. */
static inline int dshim_bcast_uses_tree(const dshim_comm_t *comm, size_t bytes)
{
    return bytes <= comm->small_msg_bytes;
}

/* The algorithm's name for the flight recorder (static; NULL for
 * point-to-point and internal requests). */
const char *dshim_algo_name(const dshim_comm_t *comm, const dshim_request_t *req);

/* Balanced partition of count elements into n parts: part i. */
static inline void dshim_part(size_t count, int n, int i, size_t *off, size_t *len)
{
    size_t base = count / (size_t)n, extra = count % (size_t)n;
    *off = (size_t)i * base + ((size_t)i < extra ? (size_t)i : extra);
    *len = base + ((size_t)i < extra ? 1 : 0);
}

#endif

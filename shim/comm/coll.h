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
/* Pipelined ring: reduce-scatter then allgather, one xfer for all steps. */
dshim_status_t dshim_allreduce_ring(dshim_comm_t *comm, const dshim_coll_sig_t *sig, const void *sbuf, void *rbuf,
                                    size_t count);

/* Balanced partition of count elements into n parts: part i. */
static inline void dshim_part(size_t count, int n, int i, size_t *off, size_t *len)
{
    size_t base = count / (size_t)n, extra = count % (size_t)n;
    *off = (size_t)i * base + ((size_t)i < extra ? (size_t)i : extra);
    *len = base + ((size_t)i < extra ? 1 : 0);
}

#endif

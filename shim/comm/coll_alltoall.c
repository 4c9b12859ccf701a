/* Allgather(v), reduce-scatter, alltoall(v), barrier, send/recv. */
#include <stdlib.h>
#include <string.h>

#include "coll.h"
#include "status.h"

static int mod(int a, int n)
{
    return ((a % n) + n) % n;
}

static dshim_status_t alloc_ops(size_t n, dshim_xfer_op_t **ops_p)
{
    *ops_p = calloc(n ? n : 1, sizeof(dshim_xfer_op_t));
    if (!*ops_p) {
        return dshim_error(DSHIM_ERR_NOMEM, "out of memory for %zu transfers", n);
    }
    return DSHIM_OK;
}

/* Ring allgather over uneven blocks: block b is counts[b] elements at displs[b].
 * Each step forwards the block received in the previous one (pipelined). */
dshim_status_t dshim_coll_allgatherv(dshim_comm_t *comm, dshim_request_t *req)
{
    int n = comm->size, r = comm->rank;
    size_t es = dshim_dtype_size(req->dtype);
    char *out = req->rbuf;
    const size_t *cnt = req->counts, *dsp = req->displs;
    if (dshim_allgather_gate_fits(comm, req->count * es)) {
        return dshim_allgatherv_gate(comm, req);
    }
    if (out + dsp[r] * es != req->sbuf && cnt[r]) {
        memmove(out + dsp[r] * es, req->sbuf, cnt[r] * es);
    }
    if (n == 1) {
        return DSHIM_OK;
    }
    dshim_xfer_op_t *ops;
    DSHIM_CHECK(alloc_ops((size_t)2 * (size_t)(n - 1), &ops));
    int k = 0, right = mod(r + 1, n), left = mod(r - 1, n);
    dshim_xfer_op_t *prev = NULL;
    for (int s = 0; s < n - 1; s++) {
        int sb = mod(r - s, n), rb = mod(r - s - 1, n);
        ops[k] = dshim_xf_send(right, out + dsp[sb] * es, cnt[sb] * es);
        ops[k].dep = prev;
        ops[k + 1] = dshim_xf_recv(left, out + dsp[rb] * es, cnt[rb] * es);
        prev = &ops[k + 1];
        k += 2;
    }
    dshim_status_t st = dshim_xfer(comm, &req->sig, ops, k);
    free(ops);
    return st;
}

/* Byte offset and length of block b of a reduce-scatter: even (count
 * elements each) or, for reduce_scatterv, counts[b] elements at displs[b]. */
static size_t rs_block_off(const dshim_request_t *req, int b, size_t es)
{
    return (req->counts ? req->displs[b] : (size_t)b * req->count) * es;
}

static size_t rs_block_len(const dshim_request_t *req, int b, size_t es)
{
    return (req->counts ? req->counts[b] : req->count) * es;
}

/* Ring reduce-scatter: the partial of block b travels the ring collecting
 * every rank's contribution and ends complete at rank b.  Blocks are even
 * (count each) or, for reduce_scatterv, counts[b] elements at displs[b]. */
dshim_status_t dshim_coll_reduce_scatter(dshim_comm_t *comm, dshim_request_t *req)
{
    int n = comm->size, r = comm->rank;
    size_t es = dshim_dtype_size(req->dtype);
    const size_t total = req->counts ? req->count : req->count * (size_t)n;
    const char *in = req->sbuf;
    if (total == 0) {
        return DSHIM_OK;
    }
    if (n == 1) {
        if (req->rbuf != req->sbuf) {
            memmove(req->rbuf, req->sbuf, total * es);
        }
        return DSHIM_OK;
    }
    char *acc;
    DSHIM_CHECK(dshim_comm_scratch(comm, total * es, (void **)&acc));
    dshim_xfer_op_t *ops;
    DSHIM_CHECK(alloc_ops((size_t)2 * (size_t)(n - 1), &ops));
    int k = 0, right = mod(r + 1, n), left = mod(r - 1, n);
    dshim_xfer_op_t *prev = NULL;
    for (int s = 0; s < n - 1; s++) {
        int sb = mod(r - s - 1, n), rb = mod(r - s - 2, n);
        ops[k] = dshim_xf_send(right, (s == 0 ? in : acc) + rs_block_off(req, sb, es), rs_block_len(req, sb, es));
        ops[k].dep = prev;
        int last = s == n - 2;
        ops[k + 1] = dshim_xf_recv_reduce(left, last ? (char *)req->rbuf : acc + rs_block_off(req, rb, es),
                                          in + rs_block_off(req, rb, es), rs_block_len(req, rb, es), 1);
        ops[k + 1].avg_div = last && req->op == DSHIM_AVG;
        prev = &ops[k + 1];
        k += 2;
    }
    dshim_status_t st = dshim_xfer(comm, &req->sig, ops, k);
    free(ops);
    return st;
}

/* Alltoall(v): every pair exchanges directly, all at once. */
dshim_status_t dshim_coll_alltoallv(dshim_comm_t *comm, dshim_request_t *req)
{
    int n = comm->size, r = comm->rank;
    size_t es = dshim_dtype_size(req->dtype);
    const char *in = req->sbuf;
    char *out = req->rbuf;
    if (req->rcounts[r] != req->scounts[r]) {
        return dshim_error(DSHIM_ERR_INVALID, "alltoallv: rank %d sends itself %zu elements but expects %zu", r,
                           req->scounts[r], req->rcounts[r]);
    }
    if (req->scounts[r]) {
        memmove(out + req->rdispls[r] * es, in + req->sdispls[r] * es, req->scounts[r] * es);
    }
    if (n == 1) {
        return DSHIM_OK;
    }
    dshim_xfer_op_t *ops;
    DSHIM_CHECK(alloc_ops((size_t)2 * (size_t)(n - 1), &ops));
    int k = 0;
    for (int s = 1; s < n; s++) {
        /* stagger the peers so that not everybody sends to rank 0 first */
        int to = mod(r + s, n), from = mod(r - s, n);
        ops[k++] = dshim_xf_send(to, in + req->sdispls[to] * es, req->scounts[to] * es);
        ops[k++] = dshim_xf_recv(from, out + req->rdispls[from] * es, req->rcounts[from] * es);
    }
    dshim_status_t st = dshim_xfer(comm, &req->sig, ops, k);
    free(ops);
    return st;
}

/* Dissemination barrier (Hensgen, Finkel and Manber): in round k every rank
 * sends a header-only message to r + 2^k and waits for the one from r - 2^k;
 * after ceil(log2 N) rounds every rank has heard, through some chain, from
 * every other.  Unlike a recursive-doubling exchange a rank needs no reply
 * from the rank it sent to, so it moves on as soon as its left partner has
 * arrived: with ranks sharing cores that is half the time (N = 4 on 2 cores:
 * docs/benchmarks.md), and any N takes ceil(log2 N) rounds without folding.
 * Every rank on one host meets at the host gate instead; ranks on several
 * hosts whose hosts have gates, through the hierarchy (coll_hier.c). */
dshim_status_t dshim_coll_barrier(dshim_comm_t *comm, dshim_request_t *req)
{
    if (comm->gate_transport >= 0) {
        return dshim_barrier_gate(comm, &req->sig); /* every rank on this host: one shared counter */
    }
    if (comm->barrier_hier) {
        return dshim_barrier_hier(comm, req);
    }
    int n = comm->size, r = comm->rank;
    for (int k = 1; k < n; k <<= 1) {
        /* r + k and r - k around the ring: k < n, so a compare each, not
         * mod()'s two divisions (2-rank barrier 0.98x, paired runs) */
        int to = r + k >= n ? r + k - n : r + k;
        int from = r - k < 0 ? r - k + n : r - k;
        dshim_xfer_op_t ops[2];
        ops[0] = dshim_xf_send(to, NULL, 0);
        ops[1] = dshim_xf_recv(from, NULL, 0);
        DSHIM_CHECK(dshim_xfer(comm, &req->sig, ops, 2));
    }
    return DSHIM_OK;
}

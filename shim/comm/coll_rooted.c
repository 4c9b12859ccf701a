/* Rooted collectives: broadcast, reduce, gather, scatter. */
#include <stdlib.h>
#include <string.h>

#include "coll.h"
#include "status.h"

static int vrank_of(int r, int root, int n)
{
    return (r - root + n) % n;
}

static int real_rank(int v, int root, int n)
{
    return (v + root) % n;
}

/* Binomial tree: latency log2(n) hops, for small messages. */
static dshim_status_t bcast_tree(dshim_comm_t *comm, const dshim_coll_sig_t *sig, void *buf, size_t bytes, int root)
{
    int n = comm->size, v = vrank_of(comm->rank, root, n);
    dshim_xfer_op_t ops[32];
    int mask = 1;
    while (mask < n) {
        if (v & mask) {
            ops[0] = dshim_xf_recv(real_rank(v - mask, root, n), buf, bytes);
            DSHIM_CHECK(dshim_xfer(comm, sig, ops, 1));
            break;
        }
        mask <<= 1;
    }
    int k = 0;
    for (mask >>= 1; mask > 0; mask >>= 1) {
        if (v + mask < n) {
            ops[k++] = dshim_xf_send(real_rank(v + mask, root, n), buf, bytes);
        }
    }
    return k ? dshim_xfer(comm, sig, ops, k) : DSHIM_OK;
}

/* Pipelined chain root -> root+1 -> ...: each rank forwards a chunk as soon
 * as it has it, so large messages move at link speed regardless of n. */
static dshim_status_t bcast_chain(dshim_comm_t *comm, const dshim_coll_sig_t *sig, void *buf, size_t bytes, int root)
{
    int n = comm->size, v = vrank_of(comm->rank, root, n);
    dshim_xfer_op_t ops[2];
    int k = 0;
    if (v > 0) {
        ops[k++] = dshim_xf_recv(real_rank(v - 1, root, n), buf, bytes);
    }
    if (v < n - 1) {
        ops[k] = dshim_xf_send(real_rank(v + 1, root, n), buf, bytes);
        ops[k].dep = v > 0 ? &ops[0] : NULL;
        k++;
    }
    return dshim_xfer(comm, sig, ops, k);
}

dshim_status_t dshim_coll_broadcast(dshim_comm_t *comm, dshim_request_t *req)
{
    size_t bytes = req->count * dshim_dtype_size(req->dtype);
    if (comm->size == 1 || bytes == 0) {
        return DSHIM_OK;
    }
    if (dshim_bcast_uses_tree(comm, bytes)) {
        return bcast_tree(comm, &req->sig, req->rbuf, bytes, req->root);
    }
    return bcast_chain(comm, &req->sig, req->rbuf, bytes, req->root);
}

/* Reduce: a chain towards the root, pipelined like the broadcast chain.
 * Rank with vrank n-1 starts; every rank adds its own data as the partial
 * result streams through it. */
dshim_status_t dshim_coll_reduce(dshim_comm_t *comm, dshim_request_t *req)
{
    int n = comm->size, v = vrank_of(comm->rank, req->root, n);
    size_t bytes = req->count * dshim_dtype_size(req->dtype);
    if (bytes == 0) {
        return DSHIM_OK;
    }
    if (n == 1) {
        if (req->rbuf != req->sbuf) {
            memcpy(req->rbuf, req->sbuf, bytes);
        }
        return DSHIM_OK;
    }
    void *acc = req->rbuf;
    if (v != 0) {
        DSHIM_CHECK(dshim_comm_scratch(comm, bytes, &acc));
    }
    dshim_xfer_op_t ops[2];
    int k = 0;
    if (v < n - 1) {
        /* the partial from higher vranks comes first: a fixed order */
        ops[k] = dshim_xf_recv_reduce(real_rank(v + 1, req->root, n), acc, req->sbuf, bytes, 1);
        ops[k].avg_div = v == 0 && req->op == DSHIM_AVG;
        k++;
    }
    if (v > 0) {
        const void *src = v < n - 1 ? acc : req->sbuf;
        ops[k] = dshim_xf_send(real_rank(v - 1, req->root, n), src, bytes);
        ops[k].dep = v < n - 1 ? &ops[0] : NULL;
        k++;
    }
    return dshim_xfer(comm, &req->sig, ops, k);
}

/* Gather and scatter: the root exchanges one block with every other rank
 * directly (all at once); the others make a single transfer. */
static dshim_status_t rooted_blocks(dshim_comm_t *comm, dshim_request_t *req, int gathering)
{
    int n = comm->size;
    size_t bytes = req->count * dshim_dtype_size(req->dtype);
    if (bytes == 0) {
        return DSHIM_OK;
    }
    if (comm->rank != req->root) {
        dshim_xfer_op_t op = gathering ? dshim_xf_send(req->root, req->sbuf, bytes)
                                       : dshim_xf_recv(req->root, req->rbuf, bytes);
        return dshim_xfer(comm, &req->sig, &op, 1);
    }
    /* the root's own block moves locally */
    char *blocks = gathering ? (char *)req->rbuf : (char *)req->sbuf;
    char *own = blocks + (size_t)comm->rank * bytes;
    if (gathering && own != req->sbuf) {
        memmove(own, req->sbuf, bytes);
    } else if (!gathering && own != req->rbuf) {
        memmove(req->rbuf, own, bytes);
    }
    dshim_xfer_op_t *ops = calloc((size_t)n, sizeof(*ops));
    if (!ops) {
        return dshim_error(DSHIM_ERR_NOMEM, "out of memory");
    }
    int k = 0;
    for (int r = 0; r < n; r++) {
        if (r != comm->rank) {
            char *blk = blocks + (size_t)r * bytes;
            ops[k++] = gathering ? dshim_xf_recv(r, blk, bytes) : dshim_xf_send(r, blk, bytes);
        }
    }
    dshim_status_t st = dshim_xfer(comm, &req->sig, ops, k);
    free(ops);
    return st;
}

dshim_status_t dshim_coll_gather(dshim_comm_t *comm, dshim_request_t *req)
{
    return rooted_blocks(comm, req, 1);
}

dshim_status_t dshim_coll_scatter(dshim_comm_t *comm, dshim_request_t *req)
{
    return rooted_blocks(comm, req, 0);
}

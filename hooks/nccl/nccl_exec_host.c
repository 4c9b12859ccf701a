/*
 * The host executor: ops on ordinary host memory (no CUDA in the process, or
 * buffers CUDA does not know).  There is no stream to order against, so the
 * call returns once the data is in place, as after a cudaStreamSynchronize;
 * a group's ops are all posted before any is waited for.
 */
#include <stdlib.h>
#include <string.h>

#include "nccl/nccl_internal.h"

typedef struct host_batch {
    int n;
    dshim_nccl_posted_t posted[];
} host_batch_t;

/* Send/recv to oneself never touches the network: each receive from self
 * takes the earliest unmatched send to self of the same group. */
static ncclResult_t self_copies(struct ncclComm *comm, dshim_nccl_op_t *ops, int n, unsigned char *handled)
{
    for (int i = 0; i < n; i++) {
        if (ops[i].kind != DSHIM_NCCL_RECV || ops[i].root != comm->rank) {
            continue;
        }
        int j;
        for (j = 0; j < n; j++) {
            if (!handled[j] && ops[j].kind == DSHIM_NCCL_SEND && ops[j].root == comm->rank) {
                break;
            }
        }
        if (j == n) {
            return dshim_nccl_fail(ncclInvalidUsage, "ncclRecv",
                                   "rank %d: a receive from itself needs a matching ncclSend to itself in the same "
                                   "group (ncclGroupStart/ncclGroupEnd)",
                                   comm->rank);
        }
        if (ops[j].send_bytes != ops[i].recv_bytes) {
            return dshim_nccl_fail(ncclInvalidArgument, "ncclRecv",
                                   "rank %d: send to itself of %zu bytes, receive of %zu bytes", comm->rank,
                                   ops[j].send_bytes, ops[i].recv_bytes);
        }
        if (ops[i].recv_bytes && ops[i].rbuf != ops[j].sbuf) {
            memmove(ops[i].rbuf, ops[j].sbuf, ops[i].recv_bytes);
        }
        handled[i] = handled[j] = 1;
    }
    for (int j = 0; j < n; j++) {
        if (!handled[j] && ops[j].kind == DSHIM_NCCL_SEND && ops[j].root == comm->rank) {
            return dshim_nccl_fail(ncclInvalidUsage, "ncclSend",
                                   "rank %d: a send to itself needs a matching ncclRecv from itself in the same "
                                   "group",
                                   comm->rank);
        }
    }
    return ncclSuccess;
}

static ncclResult_t host_start(struct ncclComm *comm, dshim_nccl_op_t *ops, int n, int lone, void **batch_p)
{
    /* host-memory ops after device ones on the same communicator: dshim
     * needs every rank to issue in call order, so the queued device work
     * goes first (the proxy thread itself runs its batches through here) */
    if (comm->cuda && !dshim_nccl_exec_cuda_is_proxy(comm)) {
        dshim_nccl_exec_cuda.drain(comm);
    }
    host_batch_t *b = calloc(1, sizeof(*b) + (size_t)n * sizeof(b->posted[0]));
    unsigned char *handled = calloc((size_t)n, 1);
    *batch_p = b;
    if (!b || !handled) {
        free(handled);
        return dshim_nccl_fail(ncclSystemError, "NCCL collective", "out of memory");
    }
    b->n = n;
    ncclResult_t res = self_copies(comm, ops, n, handled);
    for (int i = 0; i < n && res == ncclSuccess; i++) {
        if (handled[i]) {
            continue;
        }
        const dshim_nccl_op_t *o = &ops[i];
        const void *scalar = o->premul && o->residence == ncclScalarDevice ? o->scalar_ptr : NULL;
        /* a lone op runs in this thread; a batch is posted whole, then waited for */
        res = dshim_nccl_post(o, o->sbuf, o->rbuf, scalar, lone && n == 1, &b->posted[i]);
    }
    free(handled);
    return res;
}

static ncclResult_t host_finish(struct ncclComm *comm, void *batch)
{
    host_batch_t *b = batch;
    if (!b) {
        return ncclSystemError;
    }
    ncclResult_t res = ncclSuccess;
    for (int i = 0; i < b->n; i++) {
        ncclResult_t r = dshim_nccl_complete(comm, &b->posted[i]);
        if (r != ncclSuccess && res == ncclSuccess) {
            res = r;
        }
    }
    free(b);
    return res;
}

static ncclResult_t host_drain(struct ncclComm *comm)
{
    (void)comm;
    return ncclSuccess;  /* nothing outlives the call that issued it */
}

static void host_noop(struct ncclComm *comm)
{
    (void)comm;
}

const dshim_nccl_executor_t dshim_nccl_exec_host = {
    .name = "host",
    .start = host_start,
    .finish = host_finish,
    .drain = host_drain,
    .abort = host_noop,
    .destroy = host_noop,
};

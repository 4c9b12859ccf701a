/*
 * One NCCL op on host-addressable memory, posted on dshim without waiting
 * (both executors end here: the host one with the caller's buffers, the CUDA
 * one with pinned staging).  Every post is labelled for the flight recorder
 * with the NCCL call behind it, in the thread that posts it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nccl/nccl_internal.h"
#include "status.h"

void dshim_nccl_label(const char *call, const char *what)
{
    char label[64];
    snprintf(label, sizeof(label), "%s (%s)", call ? call : "NCCL", what);
    dshim_trace_label(label);
}

ncclResult_t dshim_nccl_post(const dshim_nccl_op_t *op, const void *sbuf, void *rbuf, const void *scalar,
                             int blocking, dshim_nccl_posted_t *out)
{
    dshim_comm_t *dc = op->comm->dc;
    dshim_request_t **req = &out->req;
    out->req = NULL;
    out->temp = NULL;
    if (op->premul) {
        /* PreMulSum = sum of the inputs scaled locally: scale into a copy */
        out->temp = malloc(op->send_bytes ? op->send_bytes : 1);
        if (!out->temp) {
            return dshim_nccl_fail(ncclSystemError, "PreMulSum", "out of memory for %zu bytes", op->send_bytes);
        }
        size_t n = op->send_bytes / dshim_dtype_size(op->dtype);
        (void)dshim_scale_mul(dc, out->temp, sbuf, n, op->dtype, scalar ? scalar : op->scalar); /* checked args */
        sbuf = out->temp;
    }
    /* the label is this thread's and taken by the dshim call below */
    dshim_trace_label(op->call);
    dshim_status_t st;
    switch (op->kind) {
    case DSHIM_NCCL_ALLREDUCE:
        st = blocking ? dshim_allreduce(dc, sbuf, rbuf, op->count, op->dtype, op->op)
                      : dshim_iallreduce(dc, sbuf, rbuf, op->count, op->dtype, op->op, req);
        break;
    case DSHIM_NCCL_BROADCAST:
        /* dshim broadcasts in place: the root's input goes to its output first */
        if (dshim_comm_rank(dc) == op->root && sbuf != rbuf && op->send_bytes) {
            memmove(rbuf, sbuf, op->send_bytes);
        }
        st = blocking ? dshim_broadcast(dc, rbuf, op->count, op->dtype, op->root)
                      : dshim_ibroadcast(dc, rbuf, op->count, op->dtype, op->root, req);
        break;
    case DSHIM_NCCL_REDUCE:
        st = blocking ? dshim_reduce(dc, sbuf, rbuf, op->count, op->dtype, op->op, op->root)
                      : dshim_ireduce(dc, sbuf, rbuf, op->count, op->dtype, op->op, op->root, req);
        break;
    case DSHIM_NCCL_ALLGATHER:
        st = blocking ? dshim_allgather(dc, sbuf, rbuf, op->count, op->dtype)
                      : dshim_iallgather(dc, sbuf, rbuf, op->count, op->dtype, req);
        break;
    case DSHIM_NCCL_REDUCE_SCATTER:
        st = blocking ? dshim_reduce_scatter(dc, sbuf, rbuf, op->count, op->dtype, op->op)
                      : dshim_ireduce_scatter(dc, sbuf, rbuf, op->count, op->dtype, op->op, req);
        break;
    case DSHIM_NCCL_ALLTOALL:
        st = blocking ? dshim_alltoall(dc, sbuf, rbuf, op->count, op->dtype)
                      : dshim_ialltoall(dc, sbuf, rbuf, op->count, op->dtype, req);
        break;
    case DSHIM_NCCL_GATHER:
        st = blocking ? dshim_gather(dc, sbuf, rbuf, op->count, op->dtype, op->root)
                      : dshim_igather(dc, sbuf, rbuf, op->count, op->dtype, op->root, req);
        break;
    case DSHIM_NCCL_SCATTER:
        st = blocking ? dshim_scatter(dc, sbuf, rbuf, op->count, op->dtype, op->root)
                      : dshim_iscatter(dc, sbuf, rbuf, op->count, op->dtype, op->root, req);
        break;
    case DSHIM_NCCL_SEND:
        st = blocking ? dshim_send(dc, sbuf, op->count, op->dtype, op->root)
                      : dshim_isend(dc, sbuf, op->count, op->dtype, op->root, req);
        break;
    case DSHIM_NCCL_RECV:
        st = blocking ? dshim_recv(dc, rbuf, op->count, op->dtype, op->root)
                      : dshim_irecv(dc, rbuf, op->count, op->dtype, op->root, req);
        break;
    default:
        st = dshim_error(DSHIM_ERR_INTERNAL, "unknown NCCL op kind %d", (int)op->kind);
        break;
    }
    if (st != DSHIM_OK) {
        dshim_trace_label(NULL);  /* refused before it was recorded: not for a later op */
        free(out->temp);
        out->temp = NULL;
        out->req = NULL;
        return dshim_nccl_from_dshim(st, "NCCL collective");
    }
    return ncclSuccess;
}

ncclResult_t dshim_nccl_complete(struct ncclComm *comm, dshim_nccl_posted_t *p)
{
    (void)comm;
    dshim_status_t st = DSHIM_OK;
    if (p->req) {
        st = dshim_wait(p->req);
        dshim_request_free(p->req);
        p->req = NULL;
    }
    free(p->temp);
    p->temp = NULL;
    return st == DSHIM_OK ? ncclSuccess : dshim_nccl_from_dshim(st, "NCCL collective");
}

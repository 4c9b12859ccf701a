/*
 * Collectives and point-to-point calls: arguments are checked here, in the
 * caller's thread (so ncclInvalidArgument comes back at once, inside a group
 * too), then the op runs now or at ncclGroupEnd (nccl_group.c).
 */
#include <string.h>

#include "nccl/nccl_internal.h"

typedef struct extent {
    size_t send, recv;  /* elements of sbuf / rbuf this rank touches */
} extent_t;

static extent_t extent_of(dshim_nccl_kind_t kind, size_t count, int n, int is_root)
{
    size_t all = count * (size_t)n;
    switch (kind) {
    case DSHIM_NCCL_ALLREDUCE: return (extent_t){count, count};
    case DSHIM_NCCL_BROADCAST: return (extent_t){is_root ? count : 0, count};
    case DSHIM_NCCL_REDUCE: return (extent_t){count, is_root ? count : 0};
    case DSHIM_NCCL_ALLGATHER: return (extent_t){count, all};
    case DSHIM_NCCL_REDUCE_SCATTER: return (extent_t){all, count};
    case DSHIM_NCCL_ALLTOALL: return (extent_t){all, all};
    case DSHIM_NCCL_GATHER: return (extent_t){count, is_root ? all : 0};
    case DSHIM_NCCL_SCATTER: return (extent_t){is_root ? all : 0, count};
    case DSHIM_NCCL_SEND: return (extent_t){count, 0};
    case DSHIM_NCCL_RECV: return (extent_t){0, count};
    default: return (extent_t){0, 0};
    }
}

static int rooted(dshim_nccl_kind_t k)
{
    return k == DSHIM_NCCL_BROADCAST || k == DSHIM_NCCL_REDUCE || k == DSHIM_NCCL_GATHER || k == DSHIM_NCCL_SCATTER;
}

static int reducing(dshim_nccl_kind_t k)
{
    return k == DSHIM_NCCL_ALLREDUCE || k == DSHIM_NCCL_REDUCE || k == DSHIM_NCCL_REDUCE_SCATTER;
}

/* Validates a call and runs or defers it. */
static ncclResult_t submit(dshim_nccl_kind_t kind, const void *sbuf, void *rbuf, size_t count, ncclDataType_t t,
                           ncclRedOp_t redop, int root, ncclComm_t comm, cudaStream_t stream, const char *call)
{
    ncclResult_t res = dshim_nccl_comm_ready(comm, call);
    if (res != ncclSuccess) {
        return res;
    }
    if (comm->finalized) {
        return dshim_nccl_fail(ncclInvalidUsage, call, "rank %d: the communicator was finalized", comm->rank);
    }
    dshim_nccl_op_t o;
    memset(&o, 0, sizeof(o));
    o.kind = kind;
    o.call = call;
    o.comm = comm;
    o.sbuf = sbuf;
    o.rbuf = rbuf;
    o.count = count;
    o.nccl_dtype = t;
    o.root = root;
    o.stream = stream;
    o.op = DSHIM_SUM;
    if (dshim_nccl_dtype(t, &o.dtype) != 0) {
        return dshim_nccl_fail(ncclInvalidArgument, call, "rank %d: invalid datatype %d", comm->rank, (int)t);
    }
    if (reducing(kind)) {
        res = dshim_nccl_redop_resolve(comm, redop, t, &o, call);
        if (res != ncclSuccess) {
            return res;
        }
    }
    int n = comm->nranks;
    if ((rooted(kind) || kind == DSHIM_NCCL_SEND || kind == DSHIM_NCCL_RECV) && (root < 0 || root >= n)) {
        return dshim_nccl_fail(ncclInvalidArgument, call, "rank %d: %s %d is outside 0..%d", comm->rank,
                               rooted(kind) ? "root" : "peer", root, n - 1);
    }
    size_t es = dshim_dtype_size(o.dtype);
    if (count > ((size_t)1 << 56) / es / (size_t)n) {
        return dshim_nccl_fail(ncclInvalidArgument, call, "rank %d: count %zu is too large", comm->rank, count);
    }
    extent_t e = extent_of(kind, count, n, comm->rank == root);
    o.send_bytes = e.send * es;
    o.recv_bytes = e.recv * es;
    if ((o.send_bytes && !sbuf) || (o.recv_bytes && !rbuf)) {
        return dshim_nccl_fail(ncclInvalidArgument, call, "rank %d: %s is NULL with count %zu", comm->rank,
                               o.send_bytes && !sbuf ? "sendbuff" : "recvbuff", count);
    }
    return dshim_nccl_enqueue(&o);
}

DSHIM_NCCL_EXPORT ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                                             ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                             cudaStream_t stream)
{
    return submit(DSHIM_NCCL_ALLREDUCE, sendbuff, recvbuff, count, datatype, op, -1, comm, stream, "ncclAllReduce");
}
DSHIM_NCCL_ALIAS(ncclAllReduce);

DSHIM_NCCL_EXPORT ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                                             ncclDataType_t datatype, int root, ncclComm_t comm,
                                             cudaStream_t stream)
{
    return submit(DSHIM_NCCL_BROADCAST, sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream,
                  "ncclBroadcast");
}
DSHIM_NCCL_ALIAS(ncclBroadcast);

DSHIM_NCCL_EXPORT ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root,
                                         ncclComm_t comm, cudaStream_t stream)
{
    return submit(DSHIM_NCCL_BROADCAST, buff, buff, count, datatype, ncclSum, root, comm, stream, "ncclBcast");
}
DSHIM_NCCL_ALIAS(ncclBcast);

DSHIM_NCCL_EXPORT ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count,
                                          ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                                          cudaStream_t stream)
{
    return submit(DSHIM_NCCL_REDUCE, sendbuff, recvbuff, count, datatype, op, root, comm, stream, "ncclReduce");
}
DSHIM_NCCL_ALIAS(ncclReduce);

DSHIM_NCCL_EXPORT ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                                             ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    return submit(DSHIM_NCCL_ALLGATHER, sendbuff, recvbuff, sendcount, datatype, ncclSum, -1, comm, stream,
                  "ncclAllGather");
}
DSHIM_NCCL_ALIAS(ncclAllGather);

DSHIM_NCCL_EXPORT ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                                                 ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                                 cudaStream_t stream)
{
    return submit(DSHIM_NCCL_REDUCE_SCATTER, sendbuff, recvbuff, recvcount, datatype, op, -1, comm, stream,
                  "ncclReduceScatter");
}
DSHIM_NCCL_ALIAS(ncclReduceScatter);

DSHIM_NCCL_EXPORT ncclResult_t ncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count,
                                            ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    return submit(DSHIM_NCCL_ALLTOALL, sendbuff, recvbuff, count, datatype, ncclSum, -1, comm, stream,
                  "ncclAlltoAll");
}
DSHIM_NCCL_ALIAS(ncclAlltoAll);

DSHIM_NCCL_EXPORT ncclResult_t ncclGather(const void *sendbuff, void *recvbuff, size_t count,
                                          ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)
{
    return submit(DSHIM_NCCL_GATHER, sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream,
                  "ncclGather");
}
DSHIM_NCCL_ALIAS(ncclGather);

DSHIM_NCCL_EXPORT ncclResult_t ncclScatter(const void *sendbuff, void *recvbuff, size_t count,
                                           ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)
{
    return submit(DSHIM_NCCL_SCATTER, sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream,
                  "ncclScatter");
}
DSHIM_NCCL_ALIAS(ncclScatter);

DSHIM_NCCL_EXPORT ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                                        ncclComm_t comm, cudaStream_t stream)
{
    return submit(DSHIM_NCCL_SEND, sendbuff, NULL, count, datatype, ncclSum, peer, comm, stream, "ncclSend");
}
DSHIM_NCCL_ALIAS(ncclSend);

DSHIM_NCCL_EXPORT ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                                        ncclComm_t comm, cudaStream_t stream)
{
    return submit(DSHIM_NCCL_RECV, NULL, recvbuff, count, datatype, ncclSum, peer, comm, stream, "ncclRecv");
}
DSHIM_NCCL_ALIAS(ncclRecv);

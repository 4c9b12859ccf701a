/* PreMulSum operators (ncclRedOpCreatePreMulSum / ncclRedOpDestroy) and the
 * resolution of an ncclRedOp_t for a collective. */
#include <stdlib.h>
#include <string.h>

#include "nccl/nccl_internal.h"

DSHIM_NCCL_EXPORT ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
                                                        ncclScalarResidence_t residence, ncclComm_t comm)
{
    const char *call = "ncclRedOpCreatePreMulSum";
    ncclResult_t res = dshim_nccl_comm_ready(comm, call);
    if (res != ncclSuccess) {
        return res;
    }
    dshim_dtype_t d;
    if (!op || !scalar) {
        return dshim_nccl_fail(ncclInvalidArgument, call, "%s is NULL", op ? "scalar" : "op");
    }
    if (dshim_nccl_dtype(datatype, &d) != 0) {
        return dshim_nccl_fail(ncclInvalidArgument, call, "invalid datatype %d", (int)datatype);
    }
    if (residence != ncclScalarDevice && residence != ncclScalarHostImmediate) {
        return dshim_nccl_fail(ncclInvalidArgument, call, "invalid scalar residence %d", (int)residence);
    }
    pthread_mutex_lock(&comm->lock);
    int slot = -1;
    for (int i = 0; i < comm->nredops; i++) {
        if (!comm->redops[i].in_use) {
            slot = i;
            break;
        }
    }
    if (slot < 0) {
        if (comm->nredops >= DSHIM_NCCL_MAX_REDOPS) {
            pthread_mutex_unlock(&comm->lock);
            return dshim_nccl_fail(ncclInvalidUsage, call, "more than %d PreMulSum operators alive on one "
                                   "communicator: destroy them with ncclRedOpDestroy", DSHIM_NCCL_MAX_REDOPS);
        }
        int n = comm->nredops ? comm->nredops * 2 : 8;
        dshim_nccl_redop_t *grown = realloc(comm->redops, (size_t)n * sizeof(*grown));
        if (!grown) {
            pthread_mutex_unlock(&comm->lock);
            return dshim_nccl_fail(ncclSystemError, call, "out of memory");
        }
        memset(grown + comm->nredops, 0, (size_t)(n - comm->nredops) * sizeof(*grown));
        slot = comm->nredops;
        comm->redops = grown;
        comm->nredops = n;
    }
    dshim_nccl_redop_t *r = &comm->redops[slot];
    memset(r, 0, sizeof(*r));
    r->in_use = 1;
    r->dtype = datatype;
    r->residence = residence;
    if (residence == ncclScalarHostImmediate) {
        /* the datatype's size, as NCCL copies: PyTorch passes a float32
         * scalar for bfloat16 tensors, of which NCCL (and so dshim) takes the
         * first two bytes (tests/gpu/nccl_ddp.py checks against libnccl) */
        memcpy(r->value, scalar, dshim_dtype_size(d));
    } else {
        r->ptr = scalar;
    }
    pthread_mutex_unlock(&comm->lock);
    *op = (ncclRedOp_t)(ncclNumOps + slot);
    return ncclSuccess;
}
DSHIM_NCCL_ALIAS(ncclRedOpCreatePreMulSum);

DSHIM_NCCL_EXPORT ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm)
{
    const char *call = "ncclRedOpDestroy";
    ncclResult_t res = dshim_nccl_comm_ready(comm, call);
    if (res != ncclSuccess) {
        return res;
    }
    if ((int)op < (int)ncclNumOps) {
        return dshim_nccl_fail(ncclInvalidArgument, call, "op %d is a built-in operator", (int)op);
    }
    int slot = (int)op - (int)ncclNumOps;
    pthread_mutex_lock(&comm->lock);
    if (slot >= comm->nredops || !comm->redops[slot].in_use) {
        pthread_mutex_unlock(&comm->lock);
        return dshim_nccl_fail(ncclInvalidArgument, call, "op %d was not created on this communicator", (int)op);
    }
    comm->redops[slot].in_use = 0;
    pthread_mutex_unlock(&comm->lock);
    return ncclSuccess;
}
DSHIM_NCCL_ALIAS(ncclRedOpDestroy);

ncclResult_t dshim_nccl_redop_resolve(struct ncclComm *comm, ncclRedOp_t op, ncclDataType_t t, dshim_nccl_op_t *o,
                                      const char *call)
{
    /* NCCL: sum, prod, max, min, avg; dshim: sum, prod, min, max, avg */
    static const dshim_redop_t builtin[ncclNumOps] = {
        [ncclSum] = DSHIM_SUM, [ncclProd] = DSHIM_PROD, [ncclMax] = DSHIM_MAX,
        [ncclMin] = DSHIM_MIN, [ncclAvg] = DSHIM_AVG,
    };
    if ((int)op >= 0 && (int)op < (int)ncclNumOps) {
        o->op = builtin[op];
        return ncclSuccess;
    }
    int slot = (int)op - (int)ncclNumOps;
    pthread_mutex_lock(&comm->lock);
    if ((int)op < 0 || slot >= comm->nredops || !comm->redops[slot].in_use) {
        pthread_mutex_unlock(&comm->lock);
        return dshim_nccl_fail(ncclInvalidArgument, call, "rank %d: invalid reduction operator %d", comm->rank,
                               (int)op);
    }
    dshim_nccl_redop_t r = comm->redops[slot];
    pthread_mutex_unlock(&comm->lock);
    if (r.dtype != t) {
        return dshim_nccl_fail(ncclInvalidArgument, call,
                               "rank %d: PreMulSum operator %d was created for datatype %d, used with %d", comm->rank,
                               (int)op, (int)r.dtype, (int)t);
    }
    o->op = DSHIM_SUM;
    o->premul = 1;
    o->residence = r.residence;
    memcpy(o->scalar, r.value, sizeof(o->scalar));
    o->scalar_ptr = r.ptr;
    return ncclSuccess;
}

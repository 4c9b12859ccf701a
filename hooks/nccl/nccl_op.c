/*
 * One NCCL op on host-addressable memory, posted on dshim without waiting
 * (both executors end here: the host one with the caller's buffers, the CUDA
 * one with pinned staging).
 */
#include <stdlib.h>
#include <string.h>

#include "nccl/nccl_internal.h"
#include "reduce/reduce.h"
#include "status.h"

void dshim_nccl_scale(void *dst, const void *src, size_t count, ncclDataType_t t, const void *scalar)
{
    /* integers wrap like the sum that follows; narrow floats are widened to
     * float, multiplied, rounded back (one rounding per element) */
#define SCALE_INT(T)                                                                   \
    do {                                                                               \
        T s_;                                                                          \
        memcpy(&s_, scalar, sizeof(T));                                                \
        const T *in_ = src;                                                            \
        T *out_ = dst;                                                                 \
        for (size_t i = 0; i < count; i++) {                                           \
            out_[i] = (T)((uint64_t)in_[i] * (uint64_t)s_);                            \
        }                                                                              \
    } while (0)
#define SCALE_NARROW(T, TO_F, FROM_F)                                                  \
    do {                                                                               \
        T s_;                                                                          \
        memcpy(&s_, scalar, sizeof(T));                                                \
        float f_ = TO_F(s_);                                                           \
        const T *in_ = src;                                                            \
        T *out_ = dst;                                                                 \
        for (size_t i = 0; i < count; i++) {                                           \
            out_[i] = FROM_F(TO_F(in_[i]) * f_);                                       \
        }                                                                              \
    } while (0)
    switch (t) {
    case ncclInt8: SCALE_INT(int8_t); break;
    case ncclUint8: SCALE_INT(uint8_t); break;
    case ncclInt32: SCALE_INT(int32_t); break;
    case ncclUint32: SCALE_INT(uint32_t); break;
    case ncclInt64: SCALE_INT(int64_t); break;
    case ncclUint64: SCALE_INT(uint64_t); break;
    case ncclFloat16: SCALE_NARROW(unsigned short, dshim_half_to_float, dshim_float_to_half); break;
    case ncclBfloat16: SCALE_NARROW(unsigned short, dshim_bf16_to_float, dshim_float_to_bf16); break;
    case ncclFloat8e4m3: SCALE_NARROW(unsigned char, dshim_fp8e4m3_to_float, dshim_float_to_fp8e4m3); break;
    case ncclFloat8e5m2: SCALE_NARROW(unsigned char, dshim_fp8e5m2_to_float, dshim_float_to_fp8e5m2); break;
    case ncclFloat32: {
        float s, *out = dst;
        const float *in = src;
        memcpy(&s, scalar, sizeof(s));
        for (size_t i = 0; i < count; i++) {
            out[i] = in[i] * s;
        }
        break;
    }
    case ncclFloat64: {
        double s, *out = dst;
        const double *in = src;
        memcpy(&s, scalar, sizeof(s));
        for (size_t i = 0; i < count; i++) {
            out[i] = in[i] * s;
        }
        break;
    }
    default: break;
    }
#undef SCALE_INT
#undef SCALE_NARROW
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
        dshim_nccl_scale(out->temp, sbuf, n, op->nccl_dtype, scalar ? scalar : op->scalar);
        sbuf = out->temp;
    }
    dshim_status_t st;
    switch (op->kind) {
    case DSHIM_NCCL_ALLREDUCE:
        st = blocking ? dshim_allreduce(dc, sbuf, rbuf, op->count, op->dtype, op->op)
                      : dshim_iallreduce(dc, sbuf, rbuf, op->count, op->dtype, op->op, req);
        break;
    case DSHIM_NCCL_BROADCAST:
        /* dshim broadcasts in place: the root's input goes to its output first */
        if (dc->rank == op->root && sbuf != rbuf && op->send_bytes) {
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

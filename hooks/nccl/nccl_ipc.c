/*
 * Allreduce on device buffers among the ranks of one host, through CUDA IPC:
 * no staging through host memory, the reduction in dshim's CUDA kernels
 * (libdshim-cuda.so).
 *
 * Every rank owns a device scratch buffer of DSHIM_NCCL_IPC_CHUNK bytes and
 * maps every peer's (cudaIpcOpenMemHandle; ranks of one process use the
 * pointer itself).  The message goes chunk by chunk:
 *
 *     copy my input chunk into my scratch          (caller's stream, synchronised)
 *     barrier                                      all scratches are filled
 *     out = s[0] op s[1] op ... op s[n-1]          (the kernels, reading the peers'
 *                                                   scratches in place)
 *     barrier                                      nobody reads a scratch any more
 *
 * Every rank computes the whole chunk in the same rank order, so every rank
 * gets the same bits without a second exchange.  That costs n reads per rank
 * where a reduce-scatter would cost 2, which is the right trade for the
 * handful of ranks one host holds (and one GPU: several ranks on one device
 * share its memory bandwidth anyway).  The barriers go over the
 * communicator's own transport (shm between ranks of a host), so a rank that
 * dies fails the collective with dshim's usual error naming it.
 *
 * It runs on the application's thread, on the caller's stream, and returns
 * once the result is in place: the host waits, as it does for gloo.  Run on
 * the proxy thread, on a stream of its own, behind a cuStreamWaitValue32 on
 * the caller's stream (what the staging path does), the first allreduce never
 * completed on the H100 machine: GPU work queued while the caller's stream is
 * parked on the flag did not run.  The batches before it are drained first, so messages on the
 * communicator keep the same order on every rank.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "comm.h"
#include "log.h"
#include "nccl/nccl_cuda.h"
#include "nccl/nccl_internal.h"
#include "reduce/cuda_loader.h"
#include "status.h"

struct dshim_nccl_ipc {
    const dshim_nccl_cuda_api_t *api;
    const dshim_reduce_ops_t *red;
    int rank, nranks;
    size_t chunk;          /* bytes, the smallest any rank offers */
    void *scratch;         /* mine */
    void **src;            /* [nranks]: every rank's scratch as this process sees it */
    unsigned char *opened; /* [nranks]: src[p] came from cudaIpcOpenMemHandle */
};

/* What each rank tells the others at set-up. */
typedef struct ipc_record {
    int32_t ok;
    int32_t device;
    uint64_t pid;
    uint64_t chunk;
    uint64_t ptr;          /* usable as is by ranks of the same process */
    cudaIpcMemHandle_t handle;
} ipc_record_t;

static const char *cuda_err(const dshim_nccl_cuda_api_t *a, cudaError_t e)
{
    a->GetLastError();  /* not sticky for the application */
    return a->GetErrorString(e);
}

int dshim_nccl_ipc_eligible(const struct ncclComm *comm, const dshim_nccl_op_t *ops, int n)
{
    const dshim_nccl_op_t *o = &ops[0];
    if (!dshim_config()->nccl_ipc || n != 1 || o->kind != DSHIM_NCCL_ALLREDUCE || o->premul || o->count == 0 ||
        comm->nranks < 2 || !comm->dc || comm->dc->nlocal != comm->dc->size) {
        return 0;
    }
    /* the same count on every rank, so the same answer: below the threshold
     * the staged path's latency is lower (docs/benchmarks.md, "GPU") */
    if (o->count * dshim_dtype_size(o->dtype) < dshim_config()->nccl_ipc_min) {
        return 0;
    }
    if (dshim_nccl_cuda_memtype(o->sbuf) != cudaMemoryTypeDevice ||
        dshim_nccl_cuda_memtype(o->rbuf) != cudaMemoryTypeDevice) {
        return 0;
    }
    const dshim_reduce_ops_t *red = dshim_reduce_cuda_load();
    dshim_redop_t op = o->op == DSHIM_AVG ? DSHIM_SUM : o->op;
    return red && red->supports(DSHIM_MEM_CUDA, o->dtype, op);
}

void dshim_nccl_ipc_free(dshim_nccl_ipc_t *ipc)
{
    if (!ipc) {
        return;
    }
    const dshim_nccl_cuda_api_t *a = ipc->api;
    for (int p = 0; ipc->src && p < ipc->nranks; p++) {
        if (ipc->opened && ipc->opened[p] && a->IpcCloseMemHandle(ipc->src[p]) != cudaSuccess) {
            a->GetLastError();
        }
    }
    if (ipc->scratch && a->Free(ipc->scratch) != cudaSuccess) {
        a->GetLastError();
    }
    free(ipc->src);
    free(ipc->opened);
    free(ipc);
}

/* My part of the set-up; a failure is a reason (logged by the caller), not
 * an error: the other ranks must still be told. */
static const char *setup_local(dshim_nccl_ipc_t *ipc, ipc_record_t *me)
{
    const dshim_nccl_cuda_api_t *a = ipc->api;
    cudaError_t e;
    int dev = 0;
    if ((e = a->GetDevice(&dev)) != cudaSuccess) {
        return cuda_err(a, e);
    }
    me->device = dev;
    me->pid = (uint64_t)getpid();
    me->chunk = ipc->chunk;
    if ((e = a->Malloc(&ipc->scratch, ipc->chunk)) != cudaSuccess) {
        ipc->scratch = NULL;
        return cuda_err(a, e);
    }
    me->ptr = (uint64_t)(uintptr_t)ipc->scratch;
    if ((e = a->IpcGetMemHandle(&me->handle, ipc->scratch)) != cudaSuccess) {
        return cuda_err(a, e);
    }
    me->ok = 1;
    return NULL;
}

/* Maps the peers' scratches; NULL or the first failure. */
static const char *open_peers(dshim_nccl_ipc_t *ipc, const ipc_record_t *recs, char *why, size_t len)
{
    const dshim_nccl_cuda_api_t *a = ipc->api;
    for (int p = 0; p < ipc->nranks; p++) {
        if (p == ipc->rank) {
            ipc->src[p] = ipc->scratch;
        } else if (recs[p].pid == (uint64_t)getpid()) {
            ipc->src[p] = (void *)(uintptr_t)recs[p].ptr;  /* a rank of this process */
        } else {
            cudaError_t e = a->IpcOpenMemHandle(&ipc->src[p], recs[p].handle, cudaIpcMemLazyEnablePeerAccess);
            if (e != cudaSuccess) {
                snprintf(why, len, "opening rank %d's buffer (device %d, from device %d): %s", p, recs[p].device,
                         recs[ipc->rank].device, cuda_err(a, e));
                return why;
            }
            ipc->opened[p] = 1;
        }
    }
    return NULL;
}

/*
 * A collective of the communicator's ranks, called by every rank at the same
 * batch (the first eligible one), on the application's thread, with no other
 * batch in flight.  *ipc_p is set when every rank can take the IPC path;
 * otherwise NULL with the reason logged once: the batches stage instead.
 * Errors of the exchange itself (a dead peer) are returned.
 */
ncclResult_t dshim_nccl_ipc_setup(struct ncclComm *comm, const dshim_nccl_cuda_api_t *api, dshim_nccl_ipc_t **ipc_p)
{
    *ipc_p = NULL;
    dshim_comm_t *dc = comm->dc;
    dshim_nccl_ipc_t *ipc = calloc(1, sizeof(*ipc));
    ipc_record_t *recs = calloc((size_t)comm->nranks, sizeof(*recs));
    ipc_record_t me;
    memset(&me, 0, sizeof(me));
    char why[256] = "";
    const char *fail = NULL;
    if (!ipc || !recs || !(ipc->src = calloc((size_t)comm->nranks, sizeof(void *))) ||
        !(ipc->opened = calloc((size_t)comm->nranks, 1))) {
        free(recs);
        dshim_nccl_ipc_free(ipc);
        return dshim_nccl_fail(ncclSystemError, "NCCL collective", "rank %d: out of memory setting up CUDA IPC",
                               comm->rank);
    }
    ipc->api = api;
    ipc->red = dshim_reduce_cuda_load();
    ipc->rank = comm->rank;
    ipc->nranks = comm->nranks;
    ipc->chunk = dshim_config()->nccl_ipc_chunk;
    if (ipc->chunk < 4096) {
        ipc->chunk = 4096;
    }
    fail = setup_local(ipc, &me);
    dshim_status_t st = dshim_allgather(dc, &me, recs, sizeof(me), DSHIM_UINT8);
    if (st != DSHIM_OK) {
        free(recs);
        dshim_nccl_ipc_free(ipc);
        return dshim_nccl_from_dshim(st, "NCCL collective (CUDA IPC set-up)");
    }
    int first_bad = -1;
    for (int p = 0; p < comm->nranks; p++) {
        if (!recs[p].ok && first_bad < 0) {
            first_bad = p;
        }
        if (recs[p].ok && recs[p].chunk < ipc->chunk) {
            ipc->chunk = recs[p].chunk;  /* every rank steps through the same chunks */
        }
    }
    if (!fail && first_bad >= 0) {
        snprintf(why, sizeof(why), "rank %d cannot share device memory", first_bad);
        fail = why;
    }
    if (!fail) {
        fail = open_peers(ipc, recs, why, sizeof(why));
    }
    int32_t agree = fail ? 0 : 1;
    st = dshim_allreduce(dc, &agree, &agree, 1, DSHIM_INT32, DSHIM_MIN);
    free(recs);
    if (st != DSHIM_OK) {
        dshim_nccl_ipc_free(ipc);
        return dshim_nccl_from_dshim(st, "NCCL collective (CUDA IPC set-up)");
    }
    if (!agree) {
        DSHIM_INFO("rank %d: device buffers are staged through host memory: CUDA IPC unavailable (%s)", comm->rank,
                   fail ? fail : "another rank failed to map the buffers");
        dshim_nccl_ipc_free(ipc);
        return ncclSuccess;
    }
    if (comm->rank == 0) {
        DSHIM_INFO("allreduce on device buffers through CUDA IPC among the %d ranks of this host "
                   "(GPU kernels, %zu KiB chunks)", comm->nranks, ipc->chunk >> 10);
    }
    *ipc_p = ipc;
    return ncclSuccess;
}

static ncclResult_t ipc_fail_cuda(const dshim_nccl_ipc_t *ipc, cudaError_t e, const char *what)
{
    return dshim_nccl_fail(ncclUnhandledCudaError, "NCCL collective", "rank %d: %s (CUDA IPC allreduce) failed: %s",
                           ipc->rank, what, cuda_err(ipc->api, e));
}

ncclResult_t dshim_nccl_ipc_allreduce(dshim_nccl_ipc_t *ipc, struct ncclComm *comm, const dshim_nccl_op_t *o,
                                      cudaStream_t stream)
{
    const dshim_nccl_cuda_api_t *a = ipc->api;
    const size_t esz = dshim_dtype_size(o->dtype);
    const size_t per = ipc->chunk / esz;
    const dshim_redop_t op = o->op == DSHIM_AVG ? DSHIM_SUM : o->op;
    cudaError_t e;
    dshim_status_t st;
    for (size_t off = 0; off < o->count; off += per) {
        const size_t cnt = o->count - off < per ? o->count - off : per;
        const char *in = (const char *)o->sbuf + off * esz;
        char *out = (char *)o->rbuf + off * esz;
        if ((e = a->MemcpyAsync(ipc->scratch, in, cnt * esz, cudaMemcpyDeviceToDevice, stream)) != cudaSuccess) {
            return ipc_fail_cuda(ipc, e, "cudaMemcpyAsync");
        }
        if ((e = a->StreamSynchronize(stream)) != cudaSuccess) {
            return ipc_fail_cuda(ipc, e, "cudaStreamSynchronize");
        }
        DSHIM_TRACE("ipc allreduce: %zu of %zu elements copied into my scratch", off + cnt, o->count);
        if ((st = dshim_barrier(comm->dc)) != DSHIM_OK) {
            return dshim_nccl_from_dshim(st, "NCCL allreduce");
        }
        DSHIM_TRACE("ipc allreduce: every scratch filled");
        st = ipc->red->reduce(out, ipc->src[0], ipc->src[1], cnt, o->dtype, op, stream);
        for (int p = 2; p < ipc->nranks && st == DSHIM_OK; p++) {
            st = ipc->red->reduce(out, out, ipc->src[p], cnt, o->dtype, op, stream);
        }
        if (st == DSHIM_OK && o->op == DSHIM_AVG) {
            st = ipc->red->scale_div(out, cnt, o->dtype, ipc->nranks, stream);
        }
        if (st != DSHIM_OK) {
            return dshim_nccl_from_dshim(st, "NCCL allreduce");
        }
        if ((e = a->StreamSynchronize(stream)) != cudaSuccess) {
            return ipc_fail_cuda(ipc, e, "cudaStreamSynchronize");
        }
        DSHIM_TRACE("ipc allreduce: reduced");
        if ((st = dshim_barrier(comm->dc)) != DSHIM_OK) {
            return dshim_nccl_from_dshim(st, "NCCL allreduce");
        }
    }
    return ncclSuccess;
}

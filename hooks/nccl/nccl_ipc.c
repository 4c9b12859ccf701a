/*
 * Collectives on device buffers among the ranks of one host, through CUDA
 * IPC: no staging through host memory, reductions in dshim's CUDA kernels
 * (libdshim-cuda.so, through shim/gpu's gpu_reduce.h).
 *
 * Every rank owns a device scratch of two slots of DSHIM_NCCL_IPC_CHUNK bytes
 * and maps every peer's (cudaIpcOpenMemHandle; ranks of one process use the
 * pointer itself).  The message goes chunk by chunk, the slots alternating:
 *
 *     fill: copy my part of the chunk into my slot
 *     stream barrier                     every rank's slot is filled
 *     use:  read the peers' slots in place (reduce with the kernels in rank
 *           order, or copy out)
 *
 * and one stream barrier after the last chunk.  Everything is queued on the
 * caller's stream and the call returns at once, as NCCL's do: a stream
 * barrier (nccl_exec_cuda.c) is an event the communicator's proxy thread
 * waits for, a barrier over dshim's transport there, and a
 * cuStreamWaitValue32 on a flag the proxy writes.  No GPU work is queued
 * anywhere but on the caller's stream, so nothing depends on how the driver
 * orders other streams behind a parked one (the first version ran the copies
 * on the proxy's own stream and hung on the H100 machine).
 *
 * Two slots make one barrier per chunk enough: a rank fills slot k%2 for
 * chunk k after passing barrier k-1, which every rank reached after its use
 * of chunk k-2 (stream order), so nobody still reads that slot.  The final
 * barrier lets the next collective start from either slot.
 *
 * Every rank reduces in the same rank order, so all get the same bits
 * without a second exchange.  That costs n reads per rank where a
 * reduce-scatter would cost 2, the right trade for the handful of ranks one
 * host holds (and one GPU: ranks on one device share its bandwidth anyway).
 * A rank that dies fails the next barrier with dshim's usual error naming
 * it, reported by ncclCommGetAsyncError.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "config.h"
#include "gpu_reduce.h"
#include "gpu_runtime.h"
#include "log.h"
#include "nccl/nccl_internal.h"
#include "nccl/nccl_ipc.h"
#include "status.h"

struct dshim_nccl_ipc {
    const dshim_gpu_runtime_t *api;
    int rank, nranks;
    size_t chunk;          /* bytes per slot, the smallest any rank offers */
    void *scratch;         /* mine: two slots */
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
    dshim_gpu_ipc_handle_t handle;
} ipc_record_t;

static const char *cuda_err(const dshim_gpu_runtime_t *a, dshim_gpu_err_t e)
{
    return dshim_gpu_error_text(a, e);  /* not sticky for the application */
}

/* Elements of the op's message: what the threshold is measured on. */
static size_t message_elems(const dshim_nccl_op_t *o, int nranks)
{
    if (o->kind == DSHIM_NCCL_ALLGATHER || o->kind == DSHIM_NCCL_REDUCE_SCATTER) {
        return o->count * (size_t)nranks;
    }
    return o->count;
}

static int on_device(const void *p, size_t bytes)
{
    return bytes == 0 || dshim_gpu_memtype(p) == DSHIM_GPU_MEM_DEVICE;
}

static const char *const kind_names[] = {
    [DSHIM_NCCL_ALLREDUCE] = "allreduce", [DSHIM_NCCL_REDUCE] = "reduce", [DSHIM_NCCL_BROADCAST] = "broadcast",
    [DSHIM_NCCL_ALLGATHER] = "allgather", [DSHIM_NCCL_REDUCE_SCATTER] = "reduce_scatter",
};

/* Is `name` an item of the comma-separated `list` (or is the list "all")? */
static int listed(const char *list, const char *name)
{
    if (strcasecmp(list, "all") == 0) {
        return 1;
    }
    size_t len = strlen(name);
    for (const char *p = list; *p;) {
        const char *end = strchr(p, ',');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        if (n == len && strncasecmp(p, name, len) == 0) {  /* any case, as params.def's check */
            return 1;
        }
        p += n + (end ? 1 : 0);
    }
    return 0;
}

const char *dshim_nccl_ipc_check_colls(const char *list)
{
    if (strcasecmp(list, "all") == 0) {
        return NULL;
    }
    static _Thread_local char bad[64];
    for (const char *p = list; *p;) {
        const char *end = strchr(p, ',');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        int known = 0;
        for (size_t k = 0; k < sizeof(kind_names) / sizeof(kind_names[0]); k++) {
            known |= kind_names[k] && strlen(kind_names[k]) == n && strncasecmp(p, kind_names[k], n) == 0;
        }
        if (!known) {
            snprintf(bad, sizeof(bad), "%.*s", (int)(n < 40 ? n : 40), p);
            return bad;
        }
        p += n + (end ? 1 : 0);
    }
    return NULL;
}

int dshim_nccl_ipc_eligible(const struct ncclComm *comm, const dshim_nccl_op_t *ops, int n)
{
    const dshim_nccl_op_t *o = &ops[0];
    if (!dshim_config()->nccl_ipc || n != 1 || o->premul || o->count == 0 || comm->nranks < 2 || !comm->dc ||
        dshim_hook_local_size(comm->dc) != dshim_comm_size(comm->dc)) {
        return 0;
    }
    switch (o->kind) {
    case DSHIM_NCCL_ALLREDUCE:
    case DSHIM_NCCL_REDUCE:
    case DSHIM_NCCL_BROADCAST:
    case DSHIM_NCCL_ALLGATHER:
    case DSHIM_NCCL_REDUCE_SCATTER:
        break;
    default:
        return 0;
    }
    if (!listed(dshim_config()->nccl_ipc_colls, kind_names[o->kind])) {
        return 0;
    }
    /* the same count on every rank, so the same answer: below the threshold
     * the staged path's latency is lower (docs/benchmarks.md, "GPU") */
    if (message_elems(o, comm->nranks) * dshim_dtype_size(o->dtype) < dshim_config()->nccl_ipc_min) {
        return 0;
    }
    /* only the buffers this rank touches (a broadcast's non-root sendbuff
     * is not one) */
    if (!on_device(o->sbuf, o->send_bytes) || !on_device(o->rbuf, o->recv_bytes)) {
        return 0;
    }
    if (o->kind == DSHIM_NCCL_BROADCAST || o->kind == DSHIM_NCCL_ALLGATHER) {
        return 1;  /* copies only */
    }
    return dshim_gpu_supports(o->dtype, o->op);
}

void dshim_nccl_ipc_free(dshim_nccl_ipc_t *ipc)
{
    if (!ipc) {
        return;
    }
    const dshim_gpu_runtime_t *a = ipc->api;
    for (int p = 0; ipc->src && p < ipc->nranks; p++) {
        if (ipc->opened && ipc->opened[p] && a->IpcCloseMemHandle(ipc->src[p]) != DSHIM_GPU_SUCCESS) {
            a->GetLastError();
        }
    }
    if (ipc->scratch && a->Free(ipc->scratch) != DSHIM_GPU_SUCCESS) {
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
    const dshim_gpu_runtime_t *a = ipc->api;
    dshim_gpu_err_t e;
    int dev = 0;
    if ((e = a->GetDevice(&dev)) != DSHIM_GPU_SUCCESS) {
        return cuda_err(a, e);
    }
    me->device = dev;
    me->pid = (uint64_t)getpid();
    me->chunk = ipc->chunk;
    if ((e = a->Malloc(&ipc->scratch, 2 * ipc->chunk)) != DSHIM_GPU_SUCCESS) {
        ipc->scratch = NULL;
        return cuda_err(a, e);
    }
    me->ptr = (uint64_t)(uintptr_t)ipc->scratch;
    if ((e = a->IpcGetMemHandle(&me->handle, ipc->scratch)) != DSHIM_GPU_SUCCESS) {
        return cuda_err(a, e);
    }
    me->ok = 1;
    return NULL;
}

/* Maps the peers' scratches; NULL or the first failure. */
static const char *open_peers(dshim_nccl_ipc_t *ipc, const ipc_record_t *recs, char *why, size_t len)
{
    const dshim_gpu_runtime_t *a = ipc->api;
    for (int p = 0; p < ipc->nranks; p++) {
        if (p == ipc->rank) {
            ipc->src[p] = ipc->scratch;
        } else if (recs[p].pid == (uint64_t)getpid()) {
            ipc->src[p] = (void *)(uintptr_t)recs[p].ptr;  /* a rank of this process */
        } else {
            dshim_gpu_err_t e = a->IpcOpenMemHandle(&ipc->src[p], recs[p].handle, DSHIM_GPU_IPC_LAZY_PEER_ACCESS);
            if (e != DSHIM_GPU_SUCCESS) {
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
ncclResult_t dshim_nccl_ipc_setup(struct ncclComm *comm, const dshim_gpu_runtime_t *api, dshim_nccl_ipc_t **ipc_p,
                                  const char *call)
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
    ipc->rank = comm->rank;
    ipc->nranks = comm->nranks;
    ipc->chunk = dshim_config()->nccl_ipc_chunk;
    if (ipc->chunk < 4096) {
        ipc->chunk = 4096;
    }
    fail = setup_local(ipc, &me);
    dshim_nccl_label(call, "CUDA IPC set-up");
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
    dshim_nccl_label(call, "CUDA IPC set-up");
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
        DSHIM_INFO("collectives on device buffers through CUDA IPC among the %d ranks of this host "
                   "(GPU kernels, %zu KiB chunks)", comm->nranks, ipc->chunk >> 10);
    }
    *ipc_p = ipc;
    return ncclSuccess;
}

/* One collective being queued. */
typedef struct ipc_run {
    dshim_nccl_ipc_t *ipc;
    struct ncclComm *comm;
    const dshim_nccl_op_t *o;
    cudaStream_t stream;
    size_t esz;
    int host_waits;        /* barriers on this thread (see barrier()) */
    int queued;            /* stream work queued since the last barrier */
} ipc_run_t;

static ncclResult_t ipc_fail_cuda(const dshim_nccl_ipc_t *ipc, dshim_gpu_err_t e, const char *what)
{
    return dshim_nccl_fail(ncclUnhandledCudaError, "NCCL collective", "rank %d: %s (CUDA IPC) failed: %s", ipc->rank,
                           what, cuda_err(ipc->api, e));
}

/* Rank p's slot as this process addresses it. */
static char *slot_of(const dshim_nccl_ipc_t *ipc, int p, int slot)
{
    return (char *)ipc->src[p] + (size_t)slot * ipc->chunk;
}

static ncclResult_t copy(ipc_run_t *r, void *dst, const void *src, size_t bytes)
{
    if (dst == src || bytes == 0) {
        return ncclSuccess;
    }
    r->queued = 1;
    dshim_gpu_err_t e = r->ipc->api->MemcpyAsync(dst, src, bytes, DSHIM_GPU_COPY_D2D, r->stream);
    return e == DSHIM_GPU_SUCCESS ? ncclSuccess : ipc_fail_cuda(r->ipc, e, "cudaMemcpyAsync");
}

/* out = slot_0[at] op slot_1[at] op ... (then / n for AVG), cnt elements. */
static ncclResult_t reduce_slots(ipc_run_t *r, void *out, int slot, size_t at, size_t cnt)
{
    r->queued = 1;
    const dshim_nccl_ipc_t *ipc = r->ipc;
    const dshim_redop_t op = r->o->op == DSHIM_AVG ? DSHIM_SUM : r->o->op;
    dshim_status_t st = dshim_gpu_reduce(out, slot_of(ipc, 0, slot) + at, slot_of(ipc, 1, slot) + at, cnt,
                                         r->o->dtype, op, r->stream);
    for (int p = 2; p < ipc->nranks && st == DSHIM_OK; p++) {
        st = dshim_gpu_reduce(out, out, slot_of(ipc, p, slot) + at, cnt, r->o->dtype, op, r->stream);
    }
    if (st == DSHIM_OK && r->o->op == DSHIM_AVG) {
        st = dshim_gpu_scale_div(out, cnt, r->o->dtype, ipc->nranks, r->stream);
    }
    return st == DSHIM_OK ? ncclSuccess : dshim_nccl_from_dshim(st, "NCCL collective (CUDA IPC)");
}

/* My part of chunk [off, off+cnt) into my slot. */
static ncclResult_t fill(ipc_run_t *r, int slot, size_t off, size_t cnt)
{
    const dshim_nccl_op_t *o = r->o;
    const dshim_nccl_ipc_t *ipc = r->ipc;
    const char *in = o->sbuf;
    char *mine = slot_of(ipc, ipc->rank, slot);
    switch (o->kind) {
    case DSHIM_NCCL_BROADCAST:
        return ipc->rank == o->root ? copy(r, mine, in + off * r->esz, cnt * r->esz) : ncclSuccess;
    case DSHIM_NCCL_REDUCE_SCATTER: {
        /* the chunk of every rank's block, block q at q * cnt */
        ncclResult_t res = ncclSuccess;
        for (int q = 0; q < ipc->nranks && res == ncclSuccess; q++) {
            res = copy(r, mine + (size_t)q * cnt * r->esz, in + ((size_t)q * o->count + off) * r->esz,
                       cnt * r->esz);
        }
        return res;
    }
    default:
        return copy(r, mine, in + off * r->esz, cnt * r->esz);
    }
}

/* What this rank makes of chunk [off, off+cnt) once every slot is filled. */
static ncclResult_t use(ipc_run_t *r, int slot, size_t off, size_t cnt)
{
    const dshim_nccl_op_t *o = r->o;
    const dshim_nccl_ipc_t *ipc = r->ipc;
    char *out = (char *)o->rbuf;
    switch (o->kind) {
    case DSHIM_NCCL_ALLREDUCE:
        return reduce_slots(r, out + off * r->esz, slot, 0, cnt);
    case DSHIM_NCCL_REDUCE:
        return ipc->rank == o->root ? reduce_slots(r, out + off * r->esz, slot, 0, cnt) : ncclSuccess;
    case DSHIM_NCCL_REDUCE_SCATTER:
        return reduce_slots(r, out + off * r->esz, slot, (size_t)ipc->rank * cnt * r->esz, cnt);
    case DSHIM_NCCL_BROADCAST:
        if (ipc->rank == o->root) {
            return copy(r, out + off * r->esz, (const char *)o->sbuf + off * r->esz, cnt * r->esz);
        }
        return copy(r, out + off * r->esz, slot_of(ipc, o->root, slot), cnt * r->esz);
    case DSHIM_NCCL_ALLGATHER: {
        ncclResult_t res = ncclSuccess;
        for (int p = 0; p < ipc->nranks && res == ncclSuccess; p++) {
            char *dst = out + ((size_t)p * o->count + off) * r->esz;
            /* in place: my block already holds my part */
            const void *src = p == ipc->rank ? (const char *)o->sbuf + off * r->esz : slot_of(ipc, p, slot);
            res = copy(r, dst, src, cnt * r->esz);
        }
        return res;
    }
    default:
        return dshim_nccl_fail(ncclInternalError, "NCCL collective", "rank %d: op kind %d has no CUDA IPC path",
                               ipc->rank, (int)o->kind);
    }
}

/* Every rank's work queued on its stream so far is done before any rank's
 * work queued after this starts. */
static ncclResult_t barrier(ipc_run_t *r)
{
    if (!r->host_waits) {
        int new_work = r->queued;
        r->queued = 0;
        return dshim_nccl_cuda_stream_barrier(r->comm, r->stream, new_work, r->o->call);
    }
    dshim_gpu_err_t e = r->ipc->api->StreamSynchronize(r->stream);
    if (e != DSHIM_GPU_SUCCESS) {
        return ipc_fail_cuda(r->ipc, e, "cudaStreamSynchronize");
    }
    dshim_nccl_label(r->o->call, "CUDA IPC barrier");
    dshim_status_t st = dshim_barrier(r->comm->dc);
    return st == DSHIM_OK ? ncclSuccess : dshim_nccl_from_dshim(st, "NCCL collective (CUDA IPC)");
}

ncclResult_t dshim_nccl_ipc_enqueue(dshim_nccl_ipc_t *ipc, struct ncclComm *comm, const dshim_nccl_op_t *o,
                                    cudaStream_t stream, int host_waits)
{
    /* queued = 1: the caller's earlier work on the stream comes first too */
    ipc_run_t r = {ipc, comm, o, stream, dshim_dtype_size(o->dtype), host_waits, 1};
    /* elements per chunk: a reduce-scatter's slot holds every rank's block */
    size_t per = ipc->chunk / r.esz;
    if (o->kind == DSHIM_NCCL_REDUCE_SCATTER) {
        per /= (size_t)ipc->nranks;
    }
    if (per == 0) {
        return dshim_nccl_fail(ncclInvalidUsage, "NCCL collective", "rank %d: DSHIM_NCCL_IPC_CHUNK (%zu bytes) "
                               "is too small for %d ranks; raise it or set DSHIM_NCCL_IPC=0", ipc->rank,
                               ipc->chunk, ipc->nranks);
    }
    /* begin and end: a caller blocked inside a CUDA call while queueing
     * shows as a begin without its end (the stream-ordered hang, nccl.md) */
    DSHIM_TRACE("ipc %s: %zu elements in chunks of %zu, stream %p", o->call, o->count, per, (void *)stream);
    ncclResult_t res = ncclSuccess;
    int slot = 0;
    for (size_t off = 0; off < o->count && res == ncclSuccess; off += per, slot ^= 1) {
        const size_t cnt = o->count - off < per ? o->count - off : per;
        res = fill(&r, slot, off, cnt);
        if (res == ncclSuccess) {
            res = barrier(&r);
        }
        if (res == ncclSuccess) {
            res = use(&r, slot, off, cnt);
        }
    }
    if (res == ncclSuccess) {
        res = barrier(&r);  /* nobody reads a slot any more */
    }
    DSHIM_TRACE("ipc %s: queued (%d)", o->call, (int)res);
    return res;
}

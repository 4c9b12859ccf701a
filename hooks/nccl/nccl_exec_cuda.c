/*
 * The CUDA executor: ops on device (or managed, or pinned) memory, ordered
 * on the caller's stream without blocking the caller.
 *
 * For a batch (one call, or one communicator's share of a group) on stream S
 * the caller's thread enqueues, in S's order:
 *   1. device -> pinned staging copies of the inputs (and of a PreMulSum
 *      scalar that lives on the device);
 *   2. the batch's mark: the stream writes its sequence number into the
 *      communicator's `reached` word (pinned, device-mapped) once the copies
 *      are done: cuStreamWriteValue32, or a host function that stores it;
 *   3. a wait until the communicator's flag (pinned, device-mapped) reaches
 *      the batch's sequence number: cuStreamWaitValue32, or a host function
 *      that waits for the flag;
 *   4. staging -> device copies of the outputs; event `done`.
 * and hands the batch to the communicator's proxy thread, which waits until
 * `reached` says the stream got to the mark, runs the ops on the staging
 * buffers with the host executor (dshim's engine, CPU reduction), then
 * writes the flag: the stream moves on.  Batches run in call order on every
 * rank, as dshim requires.  Abort writes every pending flag, so no stream
 * waits forever on a dead peer; the failure is reported by
 * ncclCommGetAsyncError.
 *
 * The proxy makes no CUDA call at all: it reads and writes pinned memory.
 * A CUDA call there can wait for a driver lock that the application's thread
 * holds while it blocks in a synchronous copy -- a copy queued behind this
 * stream's wait for the flag, which only the proxy writes.  That was the
 * stream-ordered IPC hang seen in DDP's constructor (on an H200: after
 * `_verify_param_shape_across_processes`'s broadcast, torch's blocking
 * `control.copy_()` on the main thread, the proxy asleep inside CUDA, the
 * next barrier never taken).  So events are queried, destroyed and staging
 * given back (reap) on the application's thread, at its next call.
 *
 * Other streams of the same batch are joined to S with events at both ends.
 * Staging blocks come from a pinned pool of shim/gpu (gpu_staging.h), one
 * per communicator, and go back to it once `done` has fired.
 *
 * A collective on device buffers whose ranks are all on this host skips the
 * staging: its copies and GPU kernels go on the caller's stream through CUDA
 * IPC (nccl_ipc.c), and only its barriers go through the proxy, as tasks
 * without ops (dshim_nccl_cuda_stream_barrier).  Still staged: alltoall,
 * gather/scatter, send/recv, PreMulSum, and every op between hosts; with
 * DSHIM_NCCL_STAGE_CHUNK a large staged allreduce/broadcast/reduce runs as a
 * row of chunk-sized batches whose copies overlap the proxy's network work
 * (staged_in_chunks).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "config.h"
#include "gpu_runtime.h"
#include "gpu_staging.h"
#include "log.h"
#include "net.h"
#include "nccl/nccl_internal.h"
#include "nccl/nccl_ipc.h"
#include "status.h"

#define MAX_FREE_BYTES ((size_t)1 << 30) /* pinned staging kept for reuse, per communicator */

typedef struct cuda_task {
    struct cuda_task *next;
    int n;
    dshim_nccl_op_t *ops;       /* the batch, buffers replaced by host-addressable ones */
    dshim_gpu_block_t **blocks; /* staging to give back once `done` fired */
    int nblocks;
    dshim_gpu_event_t done;
    uint32_t seq;
    int marked;                 /* the proxy waits for the stream's mark (0: a barrier after no new work) */
    int enqueued;               /* the caller queued all its stream work (`done` recorded) */
    int barrier;                /* no ops: a barrier of the ranks, for nccl_ipc.c */
    const char *call;           /* a barrier's NCCL call (static), for its flight-recorder label */
} cuda_task_t;

typedef struct dshim_nccl_cuda_state {
    const dshim_gpu_runtime_t *api;
    struct ncclComm *comm;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    cuda_task_t *head, *tail;   /* waiting for the proxy */
    cuda_task_t *retired;       /* ran; staging busy until `done` */
    int stop, aborting;
    pthread_t proxy;
    int proxy_started;
    volatile uint32_t *flag;    /* pinned, mapped: written by the proxy, waited for by streams */
    void *flag_dev;
    volatile uint32_t *reached; /* the same allocation: written by streams (marks), read by the proxy */
    void *reached_dev;
    uint32_t next_seq, completed;
    int memops;                 /* streams wait and mark with memory ops, else host functions */
    cudaStream_t mark_stream;   /* the stream of the last mark (valid once marked_any) */
    int marked_any;
    dshim_gpu_event_t mark_join; /* orders marks across streams (created at the first switch) */
    /* Taken by the application's thread (stage_op) only, given back by any:
     * the pool frees blocks above its cap only in get, never in put.
     * cudaFreeHost waits for the device, and the device may be waiting, in
     * cuStreamWaitValue32, for a flag that only the proxy writes -- freeing
     * there deadlocked a 256 MiB sweep.  On the application's thread the
     * wait only stalls: queued work finishes without it. */
    dshim_gpu_pool_t *staging;
    dshim_nccl_ipc_t *ipc;      /* CUDA IPC among the ranks of this host */
    int ipc_state;              /* 0 not tried yet, 1 ready, -1 unavailable (every rank agrees) */
} cuda_state_t;

static void sleep_us(long us)
{
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

static ncclResult_t cuda_fail(const cuda_state_t *s, dshim_gpu_err_t e, const char *what)
{
    return dshim_nccl_fail(ncclUnhandledCudaError, "NCCL collective", "rank %d: %s failed: %s", s->comm->rank, what,
                           dshim_gpu_error_text(s->api, e));
}

static ncclResult_t cuda_drain(struct ncclComm *comm);

/* --- tasks ---------------------------------------------------------------- */

static void task_free(cuda_state_t *s, cuda_task_t *t)
{
    for (int i = 0; i < t->nblocks; i++) {
        dshim_gpu_pool_put(s->staging, t->blocks[i]);
    }
    if (t->done) {
        s->api->EventDestroy(t->done);
    }
    free(t->blocks);
    free(t->ops);
    free(t);
}

/* Frees retired tasks whose output copies finished (all when wait_all). */
static void reap(cuda_state_t *s, int wait_all)
{
    pthread_mutex_lock(&s->lock);
    cuda_task_t *list = s->retired;
    s->retired = NULL;
    pthread_mutex_unlock(&s->lock);
    cuda_task_t *keep = NULL;
    while (list) {
        cuda_task_t *t = list;
        list = t->next;
        dshim_gpu_err_t e = DSHIM_GPU_NOT_READY;
        /* the proxy may finish a task before its caller has queued the output
         * copies and recorded `done` (an event never recorded reads as
         * complete).  Reaping runs on the caller's thread between its calls,
         * where every task is through; one that is not stays */
        const int through = __atomic_load_n(&t->enqueued, __ATOMIC_ACQUIRE);
        if (through && !t->done) {
            e = DSHIM_GPU_SUCCESS;  /* a barrier: no staging to wait for */
        } else if (through) {
            while ((e = s->api->EventQuery(t->done)) == DSHIM_GPU_NOT_READY && wait_all) {
                sleep_us(100);
            }
        }
        if (e == DSHIM_GPU_NOT_READY) {
            t->next = keep;
            keep = t;
        } else {
            if (e != DSHIM_GPU_SUCCESS) {
                s->api->GetLastError();
            }
            task_free(s, t);
        }
    }
    pthread_mutex_lock(&s->lock);
    while (keep) {
        cuda_task_t *t = keep;
        keep = t->next;
        t->next = s->retired;
        s->retired = t;
    }
    pthread_mutex_unlock(&s->lock);
}

/* --- the proxy thread -------------------------------------------------- */

int dshim_nccl_exec_cuda_is_proxy(const struct ncclComm *comm)
{
    const cuda_state_t *s = comm->cuda;
    return s && s->proxy_started && pthread_equal(pthread_self(), s->proxy);
}

static void release_stream(cuda_state_t *s, uint32_t seq)
{
    pthread_mutex_lock(&s->lock);
    if (s->aborting) {
        pthread_mutex_unlock(&s->lock);
        return;  /* abort already released every wait (the flag never goes back) */
    }
    __atomic_store_n(s->flag, seq, __ATOMIC_RELEASE);
    s->completed = seq;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
}

static void run_task(cuda_state_t *s, cuda_task_t *t)
{
    long backoff = 1;
    double t0 = dshim_now(), said = t0;
    DSHIM_TRACE("proxy: task %u (%s): waiting for its stream%s", t->seq, t->barrier ? "barrier" : "staged batch",
                t->marked ? "" : " (no mark: nothing queued since the last one)");
    /* plain memory, no CUDA call (see the top of this file) */
    while (t->marked && (int32_t)(__atomic_load_n(s->reached, __ATOMIC_ACQUIRE) - t->seq) < 0) {
        if (__atomic_load_n(&s->aborting, __ATOMIC_ACQUIRE)) {
            return;
        }
        sleep_us(backoff);  /* polled: an abort must stop the wait */
        backoff = backoff < 100 ? backoff * 2 : 100;
        /* a stream that never gets here is a hang in the making (or a
         * context a CUDA error ended: the application's own CUDA calls fail) */
        if (dshim_now() - said > 30) {
            said = dshim_now();
            DSHIM_WARN("rank %d: task %u (%s): its stream has not reached it after %.0f s", s->comm->rank, t->seq,
                       t->barrier ? "CUDA IPC stream barrier" : "staged batch", said - t0);
        }
    }
    dshim_comm_t *dc = s->comm->dc;
    if (__atomic_load_n(&s->aborting, __ATOMIC_ACQUIRE)) {
        return;
    }
    if (t->barrier) {
        DSHIM_TRACE("proxy: stream barrier %u: its work is done here, waiting for the other ranks", t->seq);
        dshim_nccl_label(t->call, "CUDA IPC barrier");
        dshim_status_t st = dshim_barrier(dc);
        if (st != DSHIM_OK && !dshim_hook_failed(dc)) {
            dshim_hook_fail(dc, st, dshim_last_error());
        }
        return;
    }
    void *batch = NULL;
    /* one proxy per communicator: its batch may run to completion here */
    ncclResult_t res = dshim_nccl_exec_host.start(s->comm, t->ops, t->n, 1, &batch);
    ncclResult_t fin = dshim_nccl_exec_host.finish(s->comm, batch);
    if ((res != ncclSuccess || fin != ncclSuccess) && !dshim_hook_failed(dc)) {
        /* nobody waits for this call's result: make it the communicator's
         * asynchronous error */
        dshim_hook_fail(dc, DSHIM_ERR_INTERNAL, dshim_last_error());
    }
}

static void *proxy_main(void *arg)
{
    cuda_state_t *s = arg;
    dshim_log_set_rank(s->comm->rank);  /* no cudaSetDevice: this thread makes no CUDA call */
    pthread_mutex_lock(&s->lock);
    while (1) {
        while (!s->head && !s->stop) {
            pthread_cond_wait(&s->cond, &s->lock);
        }
        if (!s->head) {
            break;  /* stopping, nothing left */
        }
        cuda_task_t *t = s->head;
        s->head = t->next;
        if (!s->head) {
            s->tail = NULL;
        }
        pthread_mutex_unlock(&s->lock);
        run_task(s, t);
        release_stream(s, t->seq);
        DSHIM_TRACE("proxy: task %u done, stream released", t->seq);
        pthread_mutex_lock(&s->lock);
        t->next = s->retired;  /* reaped by the application's thread */
        s->retired = t;
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

/* Fallbacks of the stream memory operations, host functions given a task's
 * number: the wait blocks the stream until the proxy wrote the flag (it
 * occupies CUDA's callback thread meanwhile), the mark stores the number. */
typedef struct host_wait {
    cuda_state_t *s;
    uint32_t seq;
} host_wait_t;

static void host_mark_fn(void *arg)
{
    host_wait_t *w = arg;
    __atomic_store_n(w->s->reached, w->seq, __ATOMIC_RELEASE);
    free(w);
}

static void host_wait_fn(void *arg)
{
    host_wait_t *w = arg;
    long backoff = 1;
    while ((int32_t)(__atomic_load_n(w->s->flag, __ATOMIC_ACQUIRE) - w->seq) < 0 &&
           !__atomic_load_n(&w->s->aborting, __ATOMIC_ACQUIRE)) {
        sleep_us(backoff);
        backoff = backoff < 200 ? backoff * 2 : 200;
    }
    free(w);
}

/* --- setup ------------------------------------------------------------- */

static ncclResult_t state_get(struct ncclComm *comm, cuda_state_t **s_p)
{
    if (comm->cuda) {
        *s_p = comm->cuda;
        return ncclSuccess;
    }
    const char *how = dshim_config()->nccl_stream_wait;  /* checked at init */
    const dshim_gpu_runtime_t *api = dshim_gpu_runtime();
    cuda_state_t *s = calloc(1, sizeof(*s));
    if (!api || !s || !(s->staging = dshim_gpu_pool_create(api, MAX_FREE_BYTES, comm->rank))) {
        free(s);
        return dshim_nccl_fail(ncclSystemError, "NCCL collective", "rank %d: no CUDA runtime or no memory",
                               comm->rank);
    }
    s->api = api;
    s->comm = comm;
    s->memops = api->StreamWaitValue32 && api->StreamWriteValue32 && strcasecmp(how, "hostfn") != 0;
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->cond, NULL);
    void *flag = NULL;
    dshim_gpu_err_t e = api->HostAlloc(&flag, 64, DSHIM_GPU_HOST_ALLOC_MAPPED | DSHIM_GPU_HOST_ALLOC_PORTABLE);
    if (e == DSHIM_GPU_SUCCESS) {
        e = api->HostGetDevicePointer(&s->flag_dev, flag, 0);
    }
    if (e != DSHIM_GPU_SUCCESS) {
        ncclResult_t r = cuda_fail(s, e, "allocating the stream flag");
        if (flag) {
            api->FreeHost(flag);
        }
        dshim_gpu_pool_destroy(s->staging);
        free(s);
        return r;
    }
    s->flag = flag;
    *s->flag = 0;
    s->reached = (volatile uint32_t *)((char *)flag + 32);
    s->reached_dev = (char *)s->flag_dev + 32;
    *s->reached = 0;
    if (pthread_create(&s->proxy, NULL, proxy_main, s) != 0) {
        api->FreeHost(flag);
        dshim_gpu_pool_destroy(s->staging);
        free(s);
        return dshim_nccl_fail(ncclSystemError, "NCCL collective", "rank %d: cannot start the CUDA proxy thread",
                               comm->rank);
    }
    s->proxy_started = 1;
    comm->cuda = s;
    *s_p = s;
    return ncclSuccess;
}

static int is_staged(dshim_gpu_memtype_t memtype)
{
    return memtype == DSHIM_GPU_MEM_DEVICE || memtype == DSHIM_GPU_MEM_MANAGED;
}

static int within(const void *p, const void *base, size_t len)
{
    return (const char *)p >= (const char *)base && (const char *)p < (const char *)base + len;
}

/* Stages one op: host-addressable buffers in t->ops[i], input copies on s. */
static ncclResult_t stage_op(cuda_state_t *s, cuda_task_t *t, int i, cudaStream_t stream)
{
    const dshim_gpu_runtime_t *a = s->api;
    dshim_nccl_op_t *o = &t->ops[i];
    dshim_gpu_memtype_t smt = o->send_bytes ? dshim_gpu_memtype(o->sbuf) : DSHIM_GPU_MEM_UNREGISTERED;
    dshim_gpu_memtype_t rmt = o->recv_bytes ? dshim_gpu_memtype(o->rbuf) : DSHIM_GPU_MEM_UNREGISTERED;
    const void *dev_s = o->sbuf;
    void *rstage = o->rbuf;
    const void *sstage = o->sbuf;
    if (is_staged(rmt)) {
        dshim_gpu_block_t *b = dshim_gpu_pool_get(s->staging, o->recv_bytes);
        if (!b) {
            return dshim_nccl_fail(ncclSystemError, "NCCL collective", "no pinned memory for %zu bytes",
                                   o->recv_bytes);
        }
        t->blocks[t->nblocks++] = b;
        rstage = b->ptr;
    }
    if (is_staged(smt)) {
        if (is_staged(rmt) && within(o->sbuf, o->rbuf, o->recv_bytes)) {
            sstage = (char *)rstage + ((const char *)o->sbuf - (const char *)o->rbuf);  /* in place */
        } else {
            dshim_gpu_block_t *b = dshim_gpu_pool_get(s->staging, o->send_bytes);
            if (!b) {
                return dshim_nccl_fail(ncclSystemError, "NCCL collective", "no pinned memory for %zu bytes",
                                       o->send_bytes);
            }
            t->blocks[t->nblocks++] = b;
            sstage = b->ptr;
            if (is_staged(rmt) && within(o->rbuf, o->sbuf, o->send_bytes)) {
                rstage = (char *)b->ptr + ((const char *)o->rbuf - (const char *)o->sbuf);
            }
        }
        dshim_gpu_err_t e = a->MemcpyAsync((void *)sstage, dev_s, o->send_bytes, DSHIM_GPU_COPY_D2H, stream);
        if (e != DSHIM_GPU_SUCCESS) {
            return cuda_fail(s, e, "cudaMemcpyAsync (input to staging)");
        }
    }
    if (o->premul && o->residence == ncclScalarDevice && is_staged(dshim_gpu_memtype(o->scalar_ptr))) {
        /* read when the op runs, as NCCL does: copied in stream order */
        dshim_gpu_block_t *b = dshim_gpu_pool_get(s->staging, 8);
        if (!b) {
            return dshim_nccl_fail(ncclSystemError, "NCCL collective", "no pinned memory for a scalar");
        }
        t->blocks[t->nblocks++] = b;
        dshim_gpu_err_t e = a->MemcpyAsync(b->ptr, o->scalar_ptr, dshim_dtype_size(o->dtype), DSHIM_GPU_COPY_D2H,
                                           stream);
        if (e != DSHIM_GPU_SUCCESS) {
            return cuda_fail(s, e, "cudaMemcpyAsync (PreMulSum scalar)");
        }
        o->scalar_ptr = b->ptr;
    }
    o->sbuf = sstage;
    o->rbuf = rstage;
    return ncclSuccess;
}

/* Queues on `stream`, for task `seq`, the wait for the flag (write = 0) or
 * the mark in `reached` (write = 1): a stream memory operation, or its host
 * function. */
static ncclResult_t stream_value_op(cuda_state_t *s, cudaStream_t stream, int write, uint32_t seq)
{
    const dshim_gpu_runtime_t *a = s->api;
    if (s->memops) {
        int r = write ? a->StreamWriteValue32((void *)stream, (unsigned long long)(uintptr_t)s->reached_dev, seq,
                                              0 /* CU_STREAM_WRITE_VALUE_DEFAULT: after a fence */)
                      : a->StreamWaitValue32((void *)stream, (unsigned long long)(uintptr_t)s->flag_dev, seq,
                                             0 /* CU_STREAM_WAIT_VALUE_GEQ, cyclic */);
        if (r != 0) {
            return dshim_nccl_fail(ncclUnhandledCudaError, "NCCL collective", "rank %d: cuStream%sValue32 "
                                   "failed (CUresult %d)", s->comm->rank, write ? "Write" : "Wait", r);
        }
        return ncclSuccess;
    }
    host_wait_t *w = malloc(sizeof(*w));
    if (!w) {
        return dshim_nccl_fail(ncclSystemError, "NCCL collective", "out of memory");
    }
    w->s = s;
    w->seq = seq;
    dshim_gpu_err_t e = a->LaunchHostFunc(stream, write ? host_mark_fn : host_wait_fn, w);
    if (e != DSHIM_GPU_SUCCESS) {
        free(w);
        return cuda_fail(s, e, "cudaLaunchHostFunc");
    }
    return ncclSuccess;
}

/* Parks `stream` until the proxy has finished task `seq`. */
static ncclResult_t stream_wait_flag(cuda_state_t *s, cudaStream_t stream, uint32_t seq)
{
    return stream_value_op(s, stream, 0, seq);
}

/* Queues on `stream` the mark of the task about to be handed over (it gets
 * the next sequence number): once the work queued before it is done, the
 * stream itself writes that number into `reached`, where the proxy reads it.
 * Marks reach `reached` in sequence order: a mark on another stream than the
 * previous one first waits for that stream's work so far (a group's or an
 * application's second stream; one stream per communicator is the rule). */
static ncclResult_t stream_mark(cuda_state_t *s, cudaStream_t stream)
{
    const dshim_gpu_runtime_t *a = s->api;
    const uint32_t seq = s->next_seq + 1;  /* queue_task's: only this thread hands tasks over */
    dshim_gpu_err_t e = DSHIM_GPU_SUCCESS;
    if (s->marked_any && stream != s->mark_stream) {
        if (!s->mark_join) {
            e = a->EventCreateWithFlags(&s->mark_join, DSHIM_GPU_EVENT_DISABLE_TIMING);
        }
        if (e == DSHIM_GPU_SUCCESS) {
            e = a->EventRecord(s->mark_join, s->mark_stream);
        }
        if (e == DSHIM_GPU_SUCCESS) {
            e = a->StreamWaitEvent(stream, s->mark_join, 0);
        }
        if (e != DSHIM_GPU_SUCCESS) {
            return cuda_fail(s, e, "ordering the stream marks of two streams");
        }
    }
    ncclResult_t res = stream_value_op(s, stream, 1, seq);
    if (res != ncclSuccess) {
        return res;
    }
    s->mark_stream = stream;
    s->marked_any = 1;
    return ncclSuccess;
}

/* The stream's part after the proxy: wait for the batch's flag, copy the
 * outputs out of staging, record `done`, let the group's other streams go on. */
static ncclResult_t enqueue_after_proxy(cuda_state_t *s, cuda_task_t *t, const dshim_nccl_op_t *ops, int n,
                                        uint32_t seq)
{
    const dshim_gpu_runtime_t *a = s->api;
    cudaStream_t stream = ops[0].stream;
    dshim_gpu_err_t e;
    ncclResult_t res = stream_wait_flag(s, stream, seq);
    if (res != ncclSuccess) {
        return res;
    }
    for (int i = 0; i < n; i++) {
        const dshim_nccl_op_t *o = &ops[i];
        if (o->recv_bytes && t->ops[i].rbuf != o->rbuf &&
            (e = a->MemcpyAsync(o->rbuf, t->ops[i].rbuf, o->recv_bytes, DSHIM_GPU_COPY_H2D, stream)) !=
                DSHIM_GPU_SUCCESS) {
            return cuda_fail(s, e, "cudaMemcpyAsync (staging to output)");
        }
    }
    if ((e = a->EventRecord(t->done, stream)) != DSHIM_GPU_SUCCESS) {
        return cuda_fail(s, e, "cudaEventRecord");
    }
    for (int i = 1; i < n; i++) {
        if (ops[i].stream != stream && (e = a->StreamWaitEvent(ops[i].stream, t->done, 0)) != DSHIM_GPU_SUCCESS) {
            return cuda_fail(s, e, "joining the group's streams");
        }
    }
    return ncclSuccess;
}

/* The CUDA executor's settings, checked when a communicator is made (also
 * on hosts without CUDA, so that a typo shows before the first GPU op). */
ncclResult_t dshim_nccl_cuda_check_config(int rank, const char *call)
{
    /* every value against params.def, as dshim_comm_init_env does: a bad one
     * would otherwise run on its default, which the user did not ask for */
    if (dshim_config_check() != DSHIM_OK) {
        return dshim_nccl_fail(ncclInvalidUsage, call, "rank %d: %s", rank, dshim_last_error());
    }
    const char *how = dshim_config()->nccl_stream_wait;
    /* any case, as params.def's check (dshim-run) accepts */
    if (strcasecmp(how, "auto") != 0 && strcasecmp(how, "memop") != 0 && strcasecmp(how, "hostfn") != 0) {
        return dshim_nccl_fail(ncclInvalidUsage, call, "rank %d: DSHIM_NCCL_STREAM_WAIT='%s' is not one of auto, "
                               "memop, hostfn; fix or unset it", rank, how);
    }
    const char *bad = dshim_nccl_ipc_check_colls(dshim_config()->nccl_ipc_colls);
    if (bad) {
        return dshim_nccl_fail(ncclInvalidUsage, call, "rank %d: DSHIM_NCCL_IPC_COLLS names '%s', not one of "
                               "allreduce, reduce, broadcast, allgather, reduce_scatter, all; fix or unset it", rank,
                               bad);
    }
    return ncclSuccess;
}

/* Hands a task to the proxy, in call order with the batches. */
static uint32_t queue_task(cuda_state_t *s, cuda_task_t *t)
{
    pthread_mutex_lock(&s->lock);
    t->seq = ++s->next_seq;
    uint32_t seq = t->seq;
    if (s->tail) {
        s->tail->next = t;
    } else {
        s->head = t;
    }
    s->tail = t;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
    return seq;
}

/*
 * A barrier of the communicator's ranks in `stream`'s order, for nccl_ipc.c:
 * the work queued on the stream so far completes on every rank before the
 * work queued after this call starts on any.  The proxy waits for an event
 * recorded here, runs the barrier over dshim's transport (a dead peer fails
 * it: the communicator's asynchronous error) and releases the stream.
 * Nothing waits on the host.
 */
ncclResult_t dshim_nccl_cuda_stream_barrier(struct ncclComm *comm, cudaStream_t stream, int new_work,
                                           const char *call)
{
    cuda_state_t *s = comm->cuda;
    cuda_task_t *t = calloc(1, sizeof(*t));
    if (!t) {
        return dshim_nccl_fail(ncclSystemError, "NCCL collective", "out of memory");
    }
    t->barrier = 1;
    t->call = call;
    /* without new work the proxy has nothing to wait for here: the previous
     * barrier's mark covered it */
    t->marked = new_work;
    ncclResult_t res = new_work ? stream_mark(s, stream) : ncclSuccess;
    if (res != ncclSuccess) {
        free(t);
        return res;
    }
    uint32_t seq = queue_task(s, t);
    DSHIM_TRACE("stream barrier %u queued on stream %p", seq, (void *)stream);
    res = stream_wait_flag(s, stream, seq);
    __atomic_store_n(&t->enqueued, 1, __ATOMIC_RELEASE);
    return res;
}

/* A staged batch, first half: copies of the inputs into pinned staging,
 * the mark, and the hand-over to the proxy (*t_p, *seq_p).  The caller then
 * queues the second half, enqueue_after_proxy(), and sets t->enqueued.  On
 * an error nothing was handed over. */
static ncclResult_t staged_begin(cuda_state_t *s, const dshim_nccl_op_t *ops, int n, cuda_task_t **t_p,
                                 uint32_t *seq_p)
{
    const dshim_gpu_runtime_t *a = s->api;
    cudaStream_t stream = ops[0].stream;
    ncclResult_t res = ncclSuccess;
    cuda_task_t *t = calloc(1, sizeof(*t));
    if (!t || !(t->ops = malloc((size_t)n * sizeof(*t->ops))) ||
        !(t->blocks = calloc((size_t)n * 3, sizeof(*t->blocks)))) {
        if (t) {
            free(t->ops);
            free(t);
        }
        return dshim_nccl_fail(ncclSystemError, "NCCL collective", "out of memory");
    }
    memcpy(t->ops, ops, (size_t)n * sizeof(*ops));
    t->n = n;
    t->marked = 1;
    dshim_gpu_err_t e = a->EventCreateWithFlags(&t->done, DSHIM_GPU_EVENT_DISABLE_TIMING);
    if (e != DSHIM_GPU_SUCCESS) {
        res = cuda_fail(s, e, "cudaEventCreate");
        task_free(s, t);
        return res;
    }
    /* the batch starts after the work already queued on its other streams */
    for (int i = 1; i < n; i++) {
        if (ops[i].stream != stream) {
            if ((e = a->EventRecord(t->done, ops[i].stream)) != DSHIM_GPU_SUCCESS ||
                (e = a->StreamWaitEvent(stream, t->done, 0)) != DSHIM_GPU_SUCCESS) {
                res = cuda_fail(s, e, "joining the group's streams");
                task_free(s, t);
                return res;
            }
        }
    }
    for (int i = 0; i < n && res == ncclSuccess; i++) {
        res = stage_op(s, t, i, stream);
    }
    if (res == ncclSuccess) {
        res = stream_mark(s, stream);
    }
    if (res != ncclSuccess) {
        /* nothing was handed to the proxy: copies already queued only fill
         * staging, which is released once they are done */
        a->EventRecord(t->done, stream);
        t->enqueued = 1;
        pthread_mutex_lock(&s->lock);
        t->next = s->retired;
        s->retired = t;
        pthread_mutex_unlock(&s->lock);
        return res;
    }
    /* the proxy runs t from here on; the caller still reads t->ops and
     * records t->done, so t is reaped only once `enqueued` is set */
    *seq_p = queue_task(s, t);
    *t_p = t;
    return ncclSuccess;
}


/* Ops whose elements are independent (element i of the output depends only
 * on element i of the inputs) can run as a row of smaller ops. */
static int chunkable(const dshim_nccl_op_t *o, size_t chunk)
{
    const size_t es = dshim_dtype_size(o->dtype);
    return (o->kind == DSHIM_NCCL_ALLREDUCE || o->kind == DSHIM_NCCL_BROADCAST || o->kind == DSHIM_NCCL_REDUCE) &&
           es > 0 && o->count * es > 2 * chunk;
}

/*
 * A large staged op as a row of chunk-sized ops, queued so that the copies
 * overlap the network: all input copies and hand-overs first, then, chunk by
 * chunk, the wait for the proxy and the output copy.  The stream copies
 * chunk c+1 to the host while the proxy runs chunk c's collective, and
 * copies chunk c back while it runs chunk c+1.  Every rank cuts the op the
 * same way (DSHIM_NCCL_STAGE_CHUNK must be equal everywhere: dshim's
 * collective checks report a mismatch).
 */
static ncclResult_t staged_in_chunks(cuda_state_t *s, const dshim_nccl_op_t *o, size_t chunk)
{
    const size_t es = dshim_dtype_size(o->dtype);
    const size_t per = chunk / es ? chunk / es : 1;
    const size_t k = (o->count + per - 1) / per;
    dshim_nccl_op_t *sub = calloc(k, sizeof(*sub));
    cuda_task_t **tasks = calloc(k, sizeof(*tasks));
    uint32_t *seqs = calloc(k, sizeof(*seqs));
    if (!sub || !tasks || !seqs) {
        free(sub);
        free(tasks);
        free(seqs);
        return dshim_nccl_fail(ncclSystemError, "NCCL collective", "out of memory");
    }
    ncclResult_t res = ncclSuccess;
    size_t started = 0;
    for (size_t c = 0; c < k && res == ncclSuccess; c++) {
        const size_t off = c * per, cnt = o->count - off < per ? o->count - off : per;
        sub[c] = *o;
        sub[c].count = cnt;
        if (o->send_bytes) {
            sub[c].sbuf = (const char *)o->sbuf + off * es;
            sub[c].send_bytes = cnt * es;
        }
        if (o->recv_bytes) {
            sub[c].rbuf = (char *)o->rbuf + off * es;
            sub[c].recv_bytes = cnt * es;
        }
        res = staged_begin(s, &sub[c], 1, &tasks[c], &seqs[c]);
        started += res == ncclSuccess;
    }
    /* every chunk handed over gets its second half, even after an error:
     * its staging is given back only once its `done` fired */
    for (size_t c = 0; c < started; c++) {
        ncclResult_t r = enqueue_after_proxy(s, tasks[c], &sub[c], 1, seqs[c]);
        __atomic_store_n(&tasks[c]->enqueued, 1, __ATOMIC_RELEASE);
        res = res == ncclSuccess ? r : res;
    }
    DSHIM_TRACE("staged op of %zu elements in %zu chunks of up to %zu", o->count, k, per);
    free(sub);
    free(tasks);
    free(seqs);
    return res;
}

static ncclResult_t cuda_start(struct ncclComm *comm, dshim_nccl_op_t *ops, int n, int lone, void **batch_p)
{
    (void)lone;  /* never waits: the stream does */
    *batch_p = NULL;
    cuda_state_t *s = NULL;
    ncclResult_t res = state_get(comm, &s);
    if (res != ncclSuccess) {
        return res;
    }
    reap(s, 0);  /* on this thread, never the proxy's (see the top of this file) */
    const dshim_gpu_runtime_t *a = s->api;
    cudaStream_t stream = ops[0].stream;
    if (s->ipc_state == 0 && dshim_nccl_ipc_eligible(comm, ops, n)) {
        /* the first batch that could use CUDA IPC sets it up, on every rank
         * (the same call everywhere), once the batches before it are done:
         * the set-up exchanges messages on the communicator too */
        cuda_drain(comm);
        res = dshim_nccl_ipc_setup(comm, a, &s->ipc, ops[0].call);
        if (res != ncclSuccess) {
            return res;
        }
        s->ipc_state = s->ipc ? 1 : -1;
    }
    DSHIM_TRACE("cuda batch: %d op(s), first kind %d, %zu elements of dtype %d, root %d, stream %p", n,
                (int)ops[0].kind, ops[0].count, (int)ops[0].dtype, ops[0].root, (void *)stream);
    if (s->ipc_state == 1 && dshim_nccl_ipc_eligible(comm, ops, n)) {
        if (dshim_config()->nccl_ipc_async) {
            /* queued on the caller's stream; its barriers go through the
             * proxy in order with the staged batches */
            return dshim_nccl_ipc_enqueue(s->ipc, comm, &ops[0], stream, 0);
        }
        /* on this thread, after the batches before it (nccl_ipc.c) */
        cuda_drain(comm);
        return dshim_nccl_ipc_enqueue(s->ipc, comm, &ops[0], stream, 1);
    }
    const size_t chunk = dshim_config()->nccl_stage_chunk;
    if (n == 1 && chunk > 0 && chunkable(&ops[0], chunk)) {
        return staged_in_chunks(s, &ops[0], chunk);
    }
    cuda_task_t *t = NULL;
    uint32_t seq = 0;
    res = staged_begin(s, ops, n, &t, &seq);
    if (res != ncclSuccess) {
        return res;
    }
    res = enqueue_after_proxy(s, t, ops, n, seq);
    __atomic_store_n(&t->enqueued, 1, __ATOMIC_RELEASE);
    return res;
}

static ncclResult_t cuda_finish(struct ncclComm *comm, void *batch)
{
    (void)comm, (void)batch;
    return ncclSuccess;  /* the stream waits, not the caller */
}

static ncclResult_t cuda_drain(struct ncclComm *comm)
{
    cuda_state_t *s = comm->cuda;
    if (!s) {
        return ncclSuccess;
    }
    pthread_mutex_lock(&s->lock);
    while ((int32_t)(s->completed - s->next_seq) < 0 && !s->aborting) {
        pthread_cond_wait(&s->cond, &s->lock);
    }
    pthread_mutex_unlock(&s->lock);
    reap(s, 1);
    return ncclSuccess;
}

static void cuda_abort(struct ncclComm *comm)
{
    cuda_state_t *s = comm->cuda;
    if (!s) {
        return;
    }
    pthread_mutex_lock(&s->lock);
    s->aborting = 1;
    /* every stream waiting on this communicator moves on */
    __atomic_store_n(s->flag, s->next_seq, __ATOMIC_RELEASE);
    s->completed = s->next_seq;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
}

static void cuda_destroy(struct ncclComm *comm)
{
    cuda_state_t *s = comm->cuda;
    if (!s) {
        return;
    }
    pthread_mutex_lock(&s->lock);
    s->stop = 1;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
    if (s->proxy_started) {
        pthread_join(s->proxy, NULL);
    }
    reap(s, 1);
    if (s->mark_join) {
        s->api->EventDestroy(s->mark_join);
    }
    dshim_nccl_ipc_free(s->ipc);
    dshim_gpu_pool_destroy(s->staging);
    s->api->FreeHost((void *)s->flag);
    pthread_cond_destroy(&s->cond);
    pthread_mutex_destroy(&s->lock);
    free(s);
    comm->cuda = NULL;
}

const dshim_nccl_executor_t dshim_nccl_exec_cuda = {
    .name = "cuda",
    .start = cuda_start,
    .finish = cuda_finish,
    .drain = cuda_drain,
    .abort = cuda_abort,
    .destroy = cuda_destroy,
};

/*
 * The NCCL C API over dshim: shared definitions of hooks/nccl.
 *
 * Files: nccl_id.c (unique ids = dshim rendezvous), nccl_comm.c (init,
 * split, finalize, destroy, abort, queries), nccl_probe.c (async errors:
 * dead peers), nccl_coll.c (collectives and send/recv -> ops), nccl_group.c
 * (group calls), nccl_op.c (one op on host memory over dshim), nccl_redop.c
 * (PreMulSum), nccl_mem.c (MemAlloc, registration), nccl_misc.c (version,
 * error strings), nccl_device_api.c (the host half of nccl_device.h),
 * nccl_exec_host.c and nccl_exec_cuda.c (the executors: where an op runs),
 * nccl_ipc.c (collectives through CUDA IPC on one host), nccl_gpu_abi.c
 * (shim/gpu's CUDA declarations checked against CUDA's headers).  The CUDA
 * runtime, pinned staging and the reduction kernels come from shim/gpu
 * (gpu_runtime.h, gpu_staging.h, gpu_reduce.h), which looks the runtime up
 * only when the process already uses CUDA.  docs/nccl.md describes the whole.
 *
 * nccl.h is the installed one, so the compiler checks every prototype.
 */
#ifndef DSHIM_NCCL_INTERNAL_H
#define DSHIM_NCCL_INTERNAL_H

#include <nccl.h>
#include <pthread.h>
#include <stdint.h>

#include "dshim.h"
#include "dshim_hook.h"

#define DSHIM_NCCL_EXPORT __attribute__((visibility("default")))
/* The profiling aliases (pnccl*) are the same functions under a second name. */
#define DSHIM_NCCL_ALIAS(name) \
    __typeof__(name) p##name __attribute__((alias(#name), visibility("default")))

#define DSHIM_NCCL_COMM_MAGIC 0x6473686e43434c31ull /* "dshnCCL1" */
#define DSHIM_NCCL_MAX_REDOPS 1024

/* What an op does; counts follow NCCL's conventions per kind. */
typedef enum dshim_nccl_kind {
    DSHIM_NCCL_ALLREDUCE = 0,
    DSHIM_NCCL_BROADCAST,
    DSHIM_NCCL_REDUCE,
    DSHIM_NCCL_ALLGATHER,
    DSHIM_NCCL_REDUCE_SCATTER,
    DSHIM_NCCL_ALLTOALL,
    DSHIM_NCCL_GATHER,
    DSHIM_NCCL_SCATTER,
    DSHIM_NCCL_SEND,
    DSHIM_NCCL_RECV,
    DSHIM_NCCL_KIND_COUNT
} dshim_nccl_kind_t;

/* A PreMulSum operator (ncclRedOpCreatePreMulSum). */
typedef struct dshim_nccl_redop {
    int in_use;
    ncclDataType_t dtype;
    ncclScalarResidence_t residence;
    unsigned char value[8];   /* ncclScalarHostImmediate: the scalar, read at creation */
    const void *ptr;          /* ncclScalarDevice: read when the collective runs */
} dshim_nccl_redop_t;

/* One NCCL call, validated, waiting to be executed. */
typedef struct dshim_nccl_op {
    dshim_nccl_kind_t kind;
    /* the NCCL function called ("ncclAllReduce", static): the flight
     * recorder's label, set by whichever thread posts the op on dshim (the
     * caller, or the CUDA executor's proxy thread) */
    const char *call;
    struct ncclComm *comm;
    const void *sbuf;
    void *rbuf;
    size_t count;
    ncclDataType_t nccl_dtype;
    dshim_dtype_t dtype;
    dshim_redop_t op;         /* SUM for PreMulSum */
    int root;                 /* root, or the peer of send/recv */
    cudaStream_t stream;
    int premul;               /* PreMulSum: scale the input by `scalar` first */
    ncclScalarResidence_t residence;
    unsigned char scalar[8];  /* host-immediate scalar (or staged device scalar) */
    const void *scalar_ptr;   /* device-residence scalar */
    size_t send_bytes, recv_bytes;  /* extent of sbuf / rbuf the op touches on this rank */
} dshim_nccl_op_t;

/* An op posted on dshim: its request and what it owns until completion. */
typedef struct dshim_nccl_posted {
    dshim_request_t *req;
    void *temp;               /* scaled input of a PreMulSum */
} dshim_nccl_posted_t;

/*
 * Executors: where ops of one communicator run.  start() issues ops[0..n)
 * (all on one stream) without waiting for peers; finish() completes what
 * start() issued (the host executor waits there; the CUDA executor has
 * nothing to wait for: the stream does).  Group ends call start() for every
 * communicator first, then finish() for each, so a thread driving several
 * communicators of one clique does not deadlock.
 */
typedef struct dshim_nccl_executor {
    const char *name;
    /* lone: these are the only ops of the call (not a share of a group over
     * several communicators), so they may run to completion right here */
    ncclResult_t (*start)(struct ncclComm *comm, dshim_nccl_op_t *ops, int n, int lone, void **batch_p);
    ncclResult_t (*finish)(struct ncclComm *comm, void *batch);
    /* waits until every op submitted so far completed (finalize, destroy) */
    ncclResult_t (*drain)(struct ncclComm *comm);
    /* releases streams waiting on work that will never run (abort) */
    void (*abort)(struct ncclComm *comm);
    void (*destroy)(struct ncclComm *comm);
} dshim_nccl_executor_t;

extern const dshim_nccl_executor_t dshim_nccl_exec_host;
extern const dshim_nccl_executor_t dshim_nccl_exec_cuda;
/* 1 in comm's CUDA proxy thread */
int dshim_nccl_exec_cuda_is_proxy(const struct ncclComm *comm);

struct dshim_nccl_cuda_state;

struct ncclComm {
    uint64_t magic;
    dshim_comm_t *dc;          /* NULL until init completes */
    int rank, nranks;
    int cuda_dev;
    int blocking;
    int finalized;
    int active;                /* threads inside a call on it (abort waits for them) */
    /* ncclInProgress while a non-blocking init/split runs, then its result */
    ncclResult_t init_state;
    pthread_t init_thread;
    int init_thread_joinable;
    pthread_mutex_t lock;
    /* PreMulSum operators: op value ncclNumOps + i */
    dshim_nccl_redop_t *redops;
    int nredops;
    /* async error probing (nccl_probe.c) */
    double last_probe;
    unsigned char *peer_left;  /* [nranks]: closed after announcing it */
    /* the CUDA executor's state, created on the first device op */
    struct dshim_nccl_cuda_state *cuda;
    struct ncclComm *next_live;  /* the list of live communicators (exit, tests) */
    /* the store server behind the id, when this process created it */
    struct dshim_nccl_hosted *hosted;
};

/* --- results and types ---------------------------------------------------- */
ncclResult_t dshim_nccl_result(dshim_status_t st);
/* Logs "NCCL <call>: <message>" at WARN, records it as the last error and
 * returns `res`. */
ncclResult_t dshim_nccl_fail(ncclResult_t res, const char *call, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Records dshim's last error (after a failed dshim call) under the call's name. */
ncclResult_t dshim_nccl_from_dshim(dshim_status_t st, const char *call);
int dshim_nccl_dtype(ncclDataType_t t, dshim_dtype_t *out);
size_t dshim_nccl_dtype_size(ncclDataType_t t);

/* --- communicators ---------------------------------------------------------- */
/* NULL (and the error recorded) unless comm is a live communicator built by
 * this library; waits for a non-blocking init still running. */
ncclResult_t dshim_nccl_comm_ready(struct ncclComm *comm, const char *call);
int dshim_nccl_comm_valid(const struct ncclComm *comm);
/* Announces in the store that this rank leaves comm cleanly (destroy, exit):
 * peers that see its connections close then know it was not a crash. */
void dshim_nccl_announce_leave(struct ncclComm *comm);
void dshim_nccl_live_add(struct ncclComm *comm);
void dshim_nccl_live_remove(struct ncclComm *comm);
/* Polls the peers' connections for a hang-up (rate-limited, thread-safe). */
void dshim_nccl_probe(struct ncclComm *comm);

/* --- unique ids (nccl_id.c) ---------------------------------------------------- */
typedef struct dshim_nccl_rdv {
    char addr[64];
    int port;
    char token[80];
    uint32_t creator_pid;
    uint64_t nonce;
} dshim_nccl_rdv_t;
ncclResult_t dshim_nccl_id_decode(const ncclUniqueId *id, dshim_nccl_rdv_t *rdv);
/* A fresh id whose store this process hosts (also used by ncclCommInitAll). */
ncclResult_t dshim_nccl_id_create(ncclUniqueId *id, const char *call);
/* The store server behind an id this process created, counted as used by
 * one more communicator (NULL: the id was made elsewhere). */
struct dshim_nccl_hosted *dshim_nccl_id_acquire(const dshim_nccl_rdv_t *rdv, int nranks);
/* One more user (a split of a communicator on it). */
void dshim_nccl_id_ref(struct dshim_nccl_hosted *h);
/* One communicator less (keep: serve until exit anyway); returns how many remain. */
int dshim_nccl_id_unref(struct dshim_nccl_hosted *h, int keep);
/* Waits (30 s at most, 3 s after a failure) until every other rank said
 * goodbye (dc: the last local communicator on the store, about to go). */
void dshim_nccl_id_wait_byes(struct dshim_nccl_hosted *h, dshim_comm_t *dc);
/* Stops the server when no communicator uses it and no abort asked to keep it. */
void dshim_nccl_id_stop_if_unused(struct dshim_nccl_hosted *h);

/* --- ops (nccl_op.c, nccl_redop.c) -------------------------------------------- */
/* Posts op on dshim with sbuf/rbuf replacing the op's own buffers (staging)
 * and scalar the PreMulSum factor's bytes: non-blocking, or (blocking) run
 * to completion in this thread, which saves the hand-off to dshim's
 * progress thread for a lone op (1-float allreduce, 2 ranks, quiet machine:
 * 10.5 us posted + waited, 1.5 us run here; dshim_allreduce: 1.2 us). */
ncclResult_t dshim_nccl_post(const dshim_nccl_op_t *op, const void *sbuf, void *rbuf, const void *scalar,
                             int blocking, dshim_nccl_posted_t *out);
/* Labels this thread's next dshim submission for the flight recorder:
 * "<call> (<what>)", e.g. "ncclAllReduce (CUDA IPC barrier)" for the dshim
 * operations an NCCL call needs besides its own (call may be NULL). */
void dshim_nccl_label(const char *call, const char *what);
/* Waits for a posted op and releases what it owned. */
ncclResult_t dshim_nccl_complete(struct ncclComm *comm, dshim_nccl_posted_t *p);
/* Resolves op (built-in or PreMulSum) for an op being built. */
ncclResult_t dshim_nccl_redop_resolve(struct ncclComm *comm, ncclRedOp_t op, ncclDataType_t t, dshim_nccl_op_t *o,
                                      const char *call);

/* --- groups (nccl_group.c) ------------------------------------------------------ */
/* Runs op now, or keeps it for ncclGroupEnd when a group is open. */
ncclResult_t dshim_nccl_enqueue(const dshim_nccl_op_t *op);
int dshim_nccl_in_group(void);
/* A non-blocking-style init started inside a group: joined by ncclGroupEnd. */
void dshim_nccl_group_add_init(struct ncclComm *comm);
/* Joins a pending init thread of comm (idempotent). */
void dshim_nccl_init_join(struct ncclComm *comm);
/* The executor for a batch of ops of one communicator. */
const dshim_nccl_executor_t *dshim_nccl_pick_executor(struct ncclComm *comm, const dshim_nccl_op_t *ops, int n);

/* --- CUDA ---------------------------------------------------------------------- */
/* nccl_exec_cuda.c: DSHIM_NCCL_STREAM_WAIT and DSHIM_NCCL_IPC_COLLS are valid
 * (else the error), checked at communicator init on every host. */
ncclResult_t dshim_nccl_cuda_check_config(int rank, const char *call);

#endif

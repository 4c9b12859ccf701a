/*
 * NCCL communicators over dshim communicators: init (rank, config, all,
 * scalable), split, finalize, destroy, abort and the queries.
 *
 * A non-blocking init (config.blocking = 0, or an init inside a group) runs
 * in a thread; the communicator reports ncclInProgress until it is done, and
 * any other use of it waits for the init first.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gpu_runtime.h"
#include "nccl/nccl_internal.h"
#include "status.h"

static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ncclComm *live_head;
static pthread_once_t exit_once = PTHREAD_ONCE_INIT;

/* At a normal exit (a program that never destroys its communicators, as
 * many do) peers must not mistake our closed connections for a crash. */
static void announce_all_at_exit(void)
{
    pthread_mutex_lock(&live_lock);
    for (struct ncclComm *c = live_head; c; c = c->next_live) {
        /* a failed communicator has told its peers already */
        if (c->dc && dshim_hook_owned_here(c->dc) && !dshim_hook_failed(c->dc)) {
            dshim_nccl_announce_leave(c);
        }
    }
    pthread_mutex_unlock(&live_lock);
}

static void register_exit(void)
{
    atexit(announce_all_at_exit);
}

void dshim_nccl_live_add(struct ncclComm *comm)
{
    pthread_once(&exit_once, register_exit);
    pthread_mutex_lock(&live_lock);
    comm->next_live = live_head;
    live_head = comm;
    pthread_mutex_unlock(&live_lock);
}

void dshim_nccl_live_remove(struct ncclComm *comm)
{
    pthread_mutex_lock(&live_lock);
    for (struct ncclComm **pp = &live_head; *pp; pp = &(*pp)->next_live) {
        if (*pp == comm) {
            *pp = comm->next_live;
            break;
        }
    }
    pthread_mutex_unlock(&live_lock);
}

int dshim_nccl_comm_valid(const struct ncclComm *comm)
{
    return comm && comm->magic == DSHIM_NCCL_COMM_MAGIC;
}

void dshim_nccl_announce_leave(struct ncclComm *comm)
{
    if (comm->dc) {
        dshim_hook_announce_leave(comm->dc);
    }
}

void dshim_nccl_init_join(struct ncclComm *comm)
{
    pthread_mutex_lock(&comm->lock);
    if (comm->init_thread_joinable) {
        pthread_join(comm->init_thread, NULL);
        comm->init_thread_joinable = 0;
    }
    pthread_mutex_unlock(&comm->lock);
}

ncclResult_t dshim_nccl_comm_ready(struct ncclComm *comm, const char *call)
{
    if (!comm) {
        return dshim_nccl_fail(ncclInvalidArgument, call, "comm is NULL");
    }
    if (!dshim_nccl_comm_valid(comm)) {
        return dshim_nccl_fail(ncclInvalidArgument, call,
                               "comm %p is not a live dshim communicator (destroyed, or made by another NCCL)",
                               (void *)comm);
    }
    if (__atomic_load_n(&comm->init_state, __ATOMIC_ACQUIRE) == ncclInProgress) {
        dshim_nccl_init_join(comm);
    }
    ncclResult_t st = __atomic_load_n(&comm->init_state, __ATOMIC_ACQUIRE);
    if (st != ncclSuccess || !comm->dc) {
        return dshim_nccl_fail(st != ncclSuccess ? st : ncclInternalError, call,
                               "rank %d: the communicator's initialization failed", comm->rank);
    }
    return ncclSuccess;
}

static struct ncclComm *comm_alloc(int rank, int nranks, int blocking, int dev)
{
    struct ncclComm *c = calloc(1, sizeof(*c));
    if (!c) {
        return NULL;
    }
    c->peer_left = calloc((size_t)nranks, 1);
    if (!c->peer_left) {
        free(c);
        return NULL;
    }
    c->magic = DSHIM_NCCL_COMM_MAGIC;
    c->rank = rank;
    c->nranks = nranks;
    c->blocking = blocking;
    c->cuda_dev = dev;
    c->init_state = ncclInProgress;
    pthread_mutex_init(&c->lock, NULL);
    return c;
}

static void comm_free(struct ncclComm *c)
{
    c->magic = 0;
    pthread_mutex_destroy(&c->lock);
    free(c->redops);
    free(c->peer_left);
    free(c);
}

/* Parses a config defensively: it grows with every NCCL version, and only
 * `blocking` matters here. */
static ncclResult_t parse_config(const ncclConfig_t *cfg, int inherit, int *blocking, const char *call)
{
    *blocking = inherit;
    if (!cfg) {
        return ncclSuccess;
    }
    if (cfg->magic != 0xcafebeef || cfg->size < offsetof(ncclConfig_t, blocking) + sizeof(int)) {
        return dshim_nccl_fail(ncclInvalidArgument, call,
                               "config was not initialized with NCCL_CONFIG_INITIALIZER (magic %#x, size %zu)",
                               cfg->magic, cfg->size);
    }
    if (cfg->blocking != NCCL_CONFIG_UNDEF_INT) {
        if (cfg->blocking != 0 && cfg->blocking != 1) {
            return dshim_nccl_fail(ncclInvalidArgument, call, "config.blocking is %d, not 0 or 1", cfg->blocking);
        }
        *blocking = cfg->blocking;
    }
    return ncclSuccess;
}

typedef struct init_job {
    struct ncclComm *comm;
    dshim_nccl_rdv_t rdv;
} init_job_t;

/* Joins the store of the id; the creator's process counts the communicator
 * as a user of the store server it hosts. */
static ncclResult_t do_init(struct ncclComm *c, const dshim_nccl_rdv_t *rdv)
{
    dshim_comm_args_t a = {
        .rank = c->rank,
        .size = c->nranks,
        .store_addr = rdv->addr,
        .store_port = rdv->port,
        .token = rdv->token,
        .store_external = 1,
    };
    struct dshim_nccl_hosted *hosted = dshim_nccl_id_acquire(rdv, c->nranks);
    dshim_comm_t *dc = NULL;
    dshim_status_t st = dshim_comm_init(&a, &dc);
    if (st != DSHIM_OK) {
        if (hosted) {
            dshim_nccl_id_unref(hosted, 1);  /* the other ranks may still be on it */
        }
        return dshim_nccl_from_dshim(st, "ncclCommInitRank");
    }
    c->hosted = hosted;
    c->dc = dc;
    return ncclSuccess;
}

static void *init_main(void *arg)
{
    init_job_t *job = arg;
    ncclResult_t res = do_init(job->comm, &job->rdv);
    __atomic_store_n(&job->comm->init_state, res, __ATOMIC_RELEASE);
    free(job);
    return NULL;
}

static ncclResult_t start_init_thread(struct ncclComm *c, const dshim_nccl_rdv_t *rdv, const char *call)
{
    init_job_t *job = malloc(sizeof(*job));
    if (!job) {
        return dshim_nccl_fail(ncclSystemError, call, "out of memory");
    }
    job->comm = c;
    job->rdv = *rdv;
    if (pthread_create(&c->init_thread, NULL, init_main, job) != 0) {
        free(job);
        return dshim_nccl_fail(ncclSystemError, call, "cannot start the init thread");
    }
    c->init_thread_joinable = 1;
    return ncclSuccess;
}

static ncclResult_t init_rank(ncclComm_t *newcomm, int nranks, const ncclUniqueId *id, int rank,
                              const ncclConfig_t *config, const char *call)
{
    if (!newcomm) {
        return dshim_nccl_fail(ncclInvalidArgument, call, "newcomm is NULL");
    }
    *newcomm = NULL;
    if (nranks < 1 || rank < 0 || rank >= nranks) {
        return dshim_nccl_fail(ncclInvalidArgument, call, "rank %d / nranks %d: need 0 <= rank < nranks", rank,
                               nranks);
    }
    int blocking;
    ncclResult_t res = parse_config(config, 1, &blocking, call);
    if (res == ncclSuccess) {
        res = dshim_nccl_cuda_check_config(rank, call);
    }
    if (res != ncclSuccess) {
        return res;
    }
    dshim_nccl_rdv_t rdv;
    res = dshim_nccl_id_decode(id, &rdv);
    if (res != ncclSuccess) {
        return res;
    }
    struct ncclComm *c = comm_alloc(rank, nranks, blocking, dshim_gpu_current_device());
    if (!c) {
        return dshim_nccl_fail(ncclSystemError, call, "out of memory");
    }
    if (dshim_nccl_in_group() || !blocking) {
        /* inside a group several ranks of one thread may be joining: every
         * init runs in its own thread, and ncclGroupEnd waits for them */
        res = start_init_thread(c, &rdv, call);
        if (res != ncclSuccess) {
            comm_free(c);
            return res;
        }
        dshim_nccl_live_add(c);
        *newcomm = c;
        if (dshim_nccl_in_group()) {
            dshim_nccl_group_add_init(c);
            return ncclSuccess;
        }
        return ncclInProgress;
    }
    res = do_init(c, &rdv);
    if (res != ncclSuccess) {
        comm_free(c);
        return res;
    }
    c->init_state = ncclSuccess;
    dshim_nccl_live_add(c);
    *newcomm = c;
    return ncclSuccess;
}

DSHIM_NCCL_EXPORT ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
    return init_rank(comm, nranks, &commId, rank, NULL, "ncclCommInitRank");
}
DSHIM_NCCL_ALIAS(ncclCommInitRank);

DSHIM_NCCL_EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                                      ncclConfig_t *config)
{
    return init_rank(comm, nranks, &commId, rank, config, "ncclCommInitRankConfig");
}
DSHIM_NCCL_ALIAS(ncclCommInitRankConfig);

DSHIM_NCCL_EXPORT ncclResult_t ncclCommInitRankScalable(ncclComm_t *newcomm, int nranks, int myrank, int nId,
                                                        ncclUniqueId *commIds, ncclConfig_t *config)
{
    /* several ids only spread NCCL's bootstrap load; one store is enough */
    if (nId < 1 || !commIds) {
        return dshim_nccl_fail(ncclInvalidArgument, "ncclCommInitRankScalable", "nId is %d / commIds is %s", nId,
                               commIds ? "set" : "NULL");
    }
    return init_rank(newcomm, nranks, &commIds[0], myrank, config, "ncclCommInitRankScalable");
}
DSHIM_NCCL_ALIAS(ncclCommInitRankScalable);

DSHIM_NCCL_EXPORT ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist)
{
    const char *call = "ncclCommInitAll";
    if (!comms || ndev < 1) {
        return dshim_nccl_fail(ncclInvalidArgument, call, "comms is %s, ndev %d", comms ? "set" : "NULL", ndev);
    }
    ncclUniqueId id;
    ncclResult_t res = dshim_nccl_id_create(&id, call);
    if (res != ncclSuccess) {
        return res;
    }
    dshim_nccl_rdv_t rdv;
    dshim_nccl_id_decode(&id, &rdv);
    int started = 0;
    for (int i = 0; i < ndev; i++) {
        comms[i] = comm_alloc(i, ndev, 1, devlist ? devlist[i] : i);
        if (!comms[i] || (res = start_init_thread(comms[i], &rdv, call)) != ncclSuccess) {
            res = comms[i] ? res : dshim_nccl_fail(ncclSystemError, call, "out of memory");
            break;
        }
        started++;
    }
    for (int i = 0; i < started; i++) {
        dshim_nccl_init_join(comms[i]);
        if (comms[i]->init_state != ncclSuccess && res == ncclSuccess) {
            res = comms[i]->init_state;
        }
    }
    if (res != ncclSuccess) {
        /* ranks that made it would wait for the others forever: abort them */
        for (int i = 0; i < ndev && i <= started; i++) {
            if (comms[i]) {
                if (comms[i]->dc) {
                    dshim_comm_abort(comms[i]->dc, "ncclCommInitAll failed");
                    dshim_comm_destroy(comms[i]->dc);
                }
                comm_free(comms[i]);
                comms[i] = NULL;
            }
        }
        return res;
    }
    for (int i = 0; i < ndev; i++) {
        dshim_nccl_live_add(comms[i]);
    }
    return ncclSuccess;
}
DSHIM_NCCL_ALIAS(ncclCommInitAll);

DSHIM_NCCL_EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                                             ncclConfig_t *config)
{
    const char *call = "ncclCommSplit";
    ncclResult_t res = dshim_nccl_comm_ready(comm, call);
    if (res != ncclSuccess) {
        return res;
    }
    if (!newcomm) {
        return dshim_nccl_fail(ncclInvalidArgument, call, "newcomm is NULL");
    }
    *newcomm = NULL;
    if (color < 0 && color != NCCL_SPLIT_NOCOLOR) {
        return dshim_nccl_fail(ncclInvalidArgument, call, "color %d is negative and not NCCL_SPLIT_NOCOLOR", color);
    }
    int blocking;
    res = parse_config(config, comm->blocking, &blocking, call);
    if (res != ncclSuccess) {
        return res;
    }
    /* done at once even for a non-blocking communicator (allowed): the
     * split's allgather must keep its place among the parent's operations */
    dshim_comm_t *dc = NULL;
    dshim_status_t st = dshim_comm_split(comm->dc, color, key, &dc);
    if (st != DSHIM_OK) {
        return dshim_nccl_from_dshim(st, call);
    }
    if (!dc) {
        return ncclSuccess;  /* NCCL_SPLIT_NOCOLOR */
    }
    struct ncclComm *c = comm_alloc(dshim_comm_rank(dc), dshim_comm_size(dc), blocking, comm->cuda_dev);
    if (!c) {
        dshim_comm_destroy(dc);
        return dshim_nccl_fail(ncclSystemError, call, "out of memory");
    }
    c->dc = dc;
    c->init_state = ncclSuccess;
    if (comm->hosted) {
        /* it lives on the parent's store: keep the server up for it too */
        dshim_nccl_id_ref(comm->hosted);
        c->hosted = comm->hosted;
    }
    dshim_nccl_live_add(c);
    *newcomm = c;
    return ncclSuccess;
}
DSHIM_NCCL_ALIAS(ncclCommSplit);

DSHIM_NCCL_EXPORT ncclResult_t ncclCommShrink(ncclComm_t comm, int *excludeRanksList, int excludeRanksCount,
                                              ncclComm_t *newcomm, ncclConfig_t *config, int shrinkFlags)
{
    (void)comm, (void)excludeRanksList, (void)excludeRanksCount, (void)config, (void)shrinkFlags;
    if (newcomm) {
        *newcomm = NULL;
    }
    return dshim_nccl_fail(ncclInvalidUsage, "ncclCommShrink",
                           "not supported by dshim (a communicator cannot lose ranks); abort it and create a new one "
                           "from a fresh ncclUniqueId");
}
DSHIM_NCCL_ALIAS(ncclCommShrink);

DSHIM_NCCL_EXPORT ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags)
{
    (void)comm, (void)revokeFlags;
    return dshim_nccl_fail(ncclInvalidUsage, "ncclCommRevoke",
                           "not supported by dshim; use ncclCommAbort to stop a communicator's work");
}
DSHIM_NCCL_ALIAS(ncclCommRevoke);

static void drain_device_work(struct ncclComm *c)
{
    if (c->cuda) {
        dshim_nccl_exec_cuda.drain(c);
    }
}

DSHIM_NCCL_EXPORT ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
    ncclResult_t res = dshim_nccl_comm_ready(comm, "ncclCommFinalize");
    if (res != ncclSuccess) {
        return res;
    }
    /* flushes what was issued; done at once, which NCCL allows for
     * non-blocking communicators too */
    drain_device_work(comm);
    comm->finalized = 1;
    return ncclSuccess;
}
DSHIM_NCCL_ALIAS(ncclCommFinalize);

static ncclResult_t release(ncclComm_t comm, int aborting, const char *call)
{
    if (!comm) {
        return ncclSuccess;  /* as NCCL */
    }
    if (!dshim_nccl_comm_valid(comm)) {
        return dshim_nccl_fail(ncclInvalidArgument, call, "comm %p is not a live dshim communicator",
                               (void *)comm);
    }
    /* an init still running is bounded by DSHIM_CONNECT_TIMEOUT */
    dshim_nccl_init_join(comm);
    dshim_nccl_live_remove(comm);
    dshim_comm_t *dc = comm->dc;
    if (dc && dshim_hook_check_owner(dc, call) != DSHIM_OK) {
        /* a forked child: the sockets are the parent's; forget the object */
        comm_free(comm);
        return ncclSuccess;
    }
    if (dc) {
        dshim_nccl_announce_leave(comm);
        if (aborting) {
            /* fails whatever is queued or running, here and at the peers
             * that wait on us, and releases streams waiting on it */
            dshim_comm_abort(dc, "ncclCommAbort");
            if (comm->cuda) {
                dshim_nccl_exec_cuda.abort(comm);
            }
        }
        /* calls of other threads on comm (stuck until the abort) return first */
        while (__atomic_load_n(&comm->active, __ATOMIC_ACQUIRE) > 0) {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
        drain_device_work(comm);
        if (comm->cuda) {
            dshim_nccl_exec_cuda.destroy(comm);
        }
        /* the store this process hosts: the last local communicator on it
         * waits for the other ranks' goodbyes before it goes; after an abort
         * it stays up until exit instead, so the abort returns at once */
        int last = comm->hosted && dshim_nccl_id_unref(comm->hosted, aborting) == 0;
        if (last && !aborting) {
            dshim_nccl_id_wait_byes(comm->hosted, dc);
        }
        dshim_comm_destroy(dc);
        if (last) {
            dshim_nccl_id_stop_if_unused(comm->hosted);
        }
    }
    comm_free(comm);
    return ncclSuccess;
}

DSHIM_NCCL_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    return release(comm, 0, "ncclCommDestroy");
}
DSHIM_NCCL_ALIAS(ncclCommDestroy);

DSHIM_NCCL_EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    return release(comm, 1, "ncclCommAbort");
}
DSHIM_NCCL_ALIAS(ncclCommAbort);

DSHIM_NCCL_EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
{
    const char *call = "ncclCommGetAsyncError";
    if (!asyncError) {
        return dshim_nccl_fail(ncclInvalidArgument, call, "asyncError is NULL");
    }
    if (!dshim_nccl_comm_valid(comm)) {
        return dshim_nccl_fail(ncclInvalidArgument, call, "comm %p is not a live dshim communicator",
                               (void *)comm);
    }
    /* called by watchdog threads while others issue work: no waiting here */
    ncclResult_t init = __atomic_load_n(&comm->init_state, __ATOMIC_ACQUIRE);
    if (init != ncclSuccess) {
        *asyncError = init;
        if (init != ncclInProgress) {
            dshim_nccl_init_join(comm);
        }
        return ncclSuccess;
    }
    dshim_nccl_probe(comm);
    char msg[768];
    dshim_status_t st = dshim_comm_get_error(comm->dc, msg, sizeof(msg));
    *asyncError = dshim_nccl_result(st);
    if (st != DSHIM_OK) {
        dshim_error_set_raw(msg);
    }
    return ncclSuccess;
}
DSHIM_NCCL_ALIAS(ncclCommGetAsyncError);

static ncclResult_t query(const struct ncclComm *comm, const void *out, const char *call)
{
    if (!dshim_nccl_comm_valid(comm)) {
        return dshim_nccl_fail(ncclInvalidArgument, call, "comm %p is not a live dshim communicator",
                               (const void *)comm);
    }
    if (!out) {
        return dshim_nccl_fail(ncclInvalidArgument, call, "output pointer is NULL");
    }
    return ncclSuccess;
}

DSHIM_NCCL_EXPORT ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
    ncclResult_t res = query(comm, count, "ncclCommCount");
    if (res == ncclSuccess) {
        *count = comm->nranks;
    }
    return res;
}
DSHIM_NCCL_ALIAS(ncclCommCount);

DSHIM_NCCL_EXPORT ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device)
{
    ncclResult_t res = query(comm, device, "ncclCommCuDevice");
    if (res == ncclSuccess) {
        *device = comm->cuda_dev;
    }
    return res;
}
DSHIM_NCCL_ALIAS(ncclCommCuDevice);

DSHIM_NCCL_EXPORT ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    ncclResult_t res = query(comm, rank, "ncclCommUserRank");
    if (res == ncclSuccess) {
        *rank = comm->rank;
    }
    return res;
}
DSHIM_NCCL_ALIAS(ncclCommUserRank);

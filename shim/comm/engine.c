/* Request engine (see engine.h). */
#include <sched.h>
#include <time.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "coll.h"
#include "config.h"
#include "engine.h"
#include "net.h"
#include "status.h"
#include "xfer.h"

/* The spin rule of comm's waits, for `threads` busy threads per rank on
 * this host (1: the rank's own; a communicator a background engine drives
 * while the application computes: 2). */
void dshim_engine_spin_rule(dshim_comm_t *comm, int threads)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    long busy = (long)comm->nlocal * (threads > 1 ? threads : 1);
    comm->spin_us = dshim_config()->spin_us;
    /* More ranks than cores here: the peer a rank waits for is then often
     * runnable but not running.  A rank that slept on the doorbell at once
     * paid a futex wake-up and a trip through the scheduler per step (a 4 KiB
     * allreduce at N=4 on 2 cores took 2-3x its time that way); one that
     * pause-spins holds the core its peer needs.  So it spins, but yields the
     * core on every poll: the peer runs at once, and the spin costs nothing
     * while the peer has work (docs/benchmarks.md, "Ranks outnumber cores"). */
    comm->spin_yields = cpus > 0 && busy > cpus;
    if (comm->spin_yields) {
        /* A round of an algorithm then takes about nlocal/cpus turns on
         * each core; a spin shorter than that ends in a sleep and a futex
         * wake-up per round (N = 16 on 2 cores: 256 KiB allreduce 1348 ->
         * 1143 us, N = 32: 4958 -> 3744 us).  Yielding, the longer spin
         * only takes cores nobody else wants.  The ranks' turns, not the
         * threads': a background engine's application thread is not in
         * the round, and a longer spin only delays the sleep that lets it
         * compute. */
        long per_core = (comm->nlocal + cpus - 1) / cpus;
        comm->spin_us = comm->spin_us > 1000000 / per_core ? 1000000 : comm->spin_us * per_core;
    }
}

void dshim_engine_init(dshim_comm_t *comm)
{
    const dshim_config_t *cfg = dshim_config();
    comm->chunk_bytes = cfg->chunk_bytes < 4096 ? 4096 : cfg->chunk_bytes;
    comm->small_msg_bytes = cfg->small_msg_bytes;
    comm->timeout_s = cfg->timeout_s > 0 ? cfg->timeout_s : 1e9;
    dshim_engine_spin_rule(comm, 1);
    comm->check_sig = cfg->check_collectives;
    comm->reduce = dshim_reduce_cpu_ops(cfg->reduce_isa);
    const char *a = cfg->algo;
    comm->algo = !strcasecmp(a, "ring") ? DSHIM_ALGO_RING
               : !strcasecmp(a, "rd")   ? DSHIM_ALGO_RD
               : !strcasecmp(a, "hier") ? DSHIM_ALGO_HIER
               : !strcasecmp(a, "direct") ? DSHIM_ALGO_DIRECT
               : !strcasecmp(a, "rabenseifner") ? DSHIM_ALGO_RABENSEIFNER
               : !strcasecmp(a, "gate") ? DSHIM_ALGO_GATE
               : !strcasecmp(a, "gate-split") ? DSHIM_ALGO_GATE_SPLIT
               : !strcasecmp(a, "cma") ? DSHIM_ALGO_CMA
                                        : DSHIM_ALGO_AUTO;
    if (strcasecmp(a, "auto") && comm->algo == DSHIM_ALGO_AUTO) {
        DSHIM_WARN("DSHIM_ALGO=%s is not one of auto, ring, rd, hier, direct, rabenseifner, gate, gate-split, cma; using auto", a);
    }
}

void dshim_engine_trace_op(const dshim_request_t *req, dshim_trace_op_t *op)
{
    int coll = req->sig.coll;
    size_t esize = dshim_dtype_size(req->dtype);
    op->op = coll != DSHIM_COLL_P2P ? dshim_coll_name(coll) : req->sending ? "send" : "recv";
    op->dtype = (int)req->dtype;
    op->redop = coll == DSHIM_COLL_ALLREDUCE || coll == DSHIM_COLL_REDUCE || coll == DSHIM_COLL_REDUCE_SCATTER ||
                        coll == DSHIM_COLL_REDUCE_SCATTERV
                    ? (int)req->op
                    : -1;
    op->count = req->count;
    op->bytes = (uint64_t)req->count * esize;
    op->root = coll == DSHIM_COLL_BROADCAST || coll == DSHIM_COLL_REDUCE || coll == DSHIM_COLL_GATHER ||
                       coll == DSHIM_COLL_SCATTER
                   ? req->root
                   : -1;
    op->peer = coll == DSHIM_COLL_P2P ? req->root : -1;
    if (coll == DSHIM_COLL_ALLTOALLV && req->scounts && req->comm) {
        /* count 0 in its signature: what this rank sends */
        uint64_t total = 0;
        for (int r = 0; r < req->comm->size; r++) {
            total += req->scounts[r];
        }
        op->count = total;
        op->bytes = total * esize;
    } else if (coll == DSHIM_COLL_BARRIER) {
        op->dtype = -1;
        op->redop = -1;
        op->count = 0;
        op->bytes = 0;
    }
}

/* `busy` and `q_head` are also read without the lock, by a blocking call that
 * runs at once (run_now): every write of them is atomic, busy is taken only
 * by compare-and-swap, and every read of busy is atomic.  The lock still
 * orders everything else (the queue's links, q_tail, stop's readers). */
static inline dshim_request_t *head_of(const dshim_comm_t *comm)
{
    return __atomic_load_n(&comm->q_head, __ATOMIC_SEQ_CST);
}

static inline void set_head(dshim_comm_t *comm, dshim_request_t *req)
{
    __atomic_store_n(&comm->q_head, req, __ATOMIC_SEQ_CST);
}

static inline int is_busy(const dshim_comm_t *comm)
{
    return __atomic_load_n(&comm->busy, __ATOMIC_SEQ_CST);
}

/* Takes the engine: 1 when this thread is now the one executing. */
static inline int claim(dshim_comm_t *comm)
{
    int idle = 0;
    return __atomic_compare_exchange_n(&comm->busy, &idle, 1, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}

/* Lets the engine go, from run_now (without the lock).  A thread that queued
 * a request while this one executed saw busy and sleeps on cond: wake it.
 * The store of busy then the load of q_head here, against a queuer's store
 * of q_head then load of busy (both sequentially consistent): one of the two
 * sees the other, so no queued request is left asleep. */
static void release_unlocked(dshim_comm_t *comm)
{
    __atomic_store_n(&comm->busy, 0, __ATOMIC_SEQ_CST);
    if (head_of(comm)) {
        pthread_mutex_lock(&comm->lock);
        pthread_cond_broadcast(&comm->cond);
        pthread_mutex_unlock(&comm->lock);
    }
}

#define P2P_BATCH_CAP 256

typedef struct p2p_batch {
    dshim_request_t *reqs[P2P_BATCH_CAP];
} p2p_batch_t;

/* Turns the point-to-point request at the queue head into an op.  Lock held. */
static int take_p2p(dshim_comm_t *comm, dshim_xfer_op_t *ops, int *n_p, int cap)
{
    int added = 0;
    while (*n_p < cap && comm->q_head && comm->q_head->sig.coll == DSHIM_COLL_P2P) {
        dshim_request_t *req = comm->q_head;
        set_head(comm, req->next);
        if (!comm->q_head) {
            comm->q_tail = NULL;
        }
        size_t bytes = req->count * dshim_dtype_size(req->dtype);
        dshim_xfer_op_t *op = &ops[*n_p];
        if (req->sending) {
            req->sig.seq = comm->p2p_tx[req->root]++;
            *op = dshim_xf_send(req->root, req->sbuf, bytes);
        } else {
            /* numbered when it starts (p2p_start): a receive from any source
             * learns its peer only then */
            *op = dshim_xf_recv(req->root, req->rbuf, bytes);
        }
        if (comm->trace) {
            dshim_trace_started(comm->trace, req->trace_id, req->sending ? req->sig.seq : UINT64_MAX, NULL,
                                comm->transport_desc);
        }
        op->sig = &req->sig;
        op->user = req;
        (*n_p)++;
        added++;
    }
    return added;
}

static int absorb_p2p(dshim_comm_t *comm, dshim_xfer_op_t *ops, int *n_p, int cap, void *ctx)
{
    (void)ctx;
    pthread_mutex_lock(&comm->lock);
    int added = take_p2p(comm, ops, n_p, cap);
    pthread_mutex_unlock(&comm->lock);
    return added;
}

static void finish_req(dshim_comm_t *comm, dshim_request_t *req, dshim_status_t st)
{
    /* before `done`: the owner may free the request from then on */
    dshim_trace_done(comm->trace, req->trace_id, st == DSHIM_OK);
    req->status = st;
    __atomic_store_n(&req->done, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&comm->cond);
}

/* A receive begins its message: its peer is known now, and receives from one
 * peer start in the order of that peer's messages, so they are numbered here
 * (the sender numbers its sends in issue order; the header check compares). */
static void p2p_start(dshim_comm_t *comm, dshim_xfer_op_t *op, void *ctx)
{
    (void)ctx;
    dshim_request_t *req = op->user;
    req->sig.seq = comm->p2p_rx[op->peer]++;
    req->source = op->peer;
    dshim_trace_started(comm->trace, req->trace_id, req->sig.seq, NULL, NULL);
    if (req->source_p) {
        *req->source_p = op->peer;
    }
}

static void p2p_done(dshim_comm_t *comm, dshim_xfer_op_t *op, void *ctx)
{
    (void)ctx;
    pthread_mutex_lock(&comm->lock);
    finish_req(comm, op->user, DSHIM_OK);
    pthread_mutex_unlock(&comm->lock);
}

/* Consecutive sends and receives run together as one batch, and requests
 * queued while it runs join it: an exchange written as isend + irecv on both
 * sides must not deadlock on a send that waits for the peer's receive.
 * Called with the lock held and the head being point-to-point. */
static void run_p2p_batch(dshim_comm_t *comm)
{
    dshim_xfer_op_t *ops = calloc(P2P_BATCH_CAP, sizeof(*ops));
    int n = 0;
    if (!ops) {
        dshim_request_t *req = comm->q_head;
        set_head(comm, req->next);
        if (!comm->q_head) {
            comm->q_tail = NULL;
        }
        finish_req(comm, req, dshim_error(DSHIM_ERR_NOMEM, "out of memory for a send/recv batch"));
        return;
    }
    if (!claim(comm)) {
        free(ops); /* a blocking call runs at once meanwhile (run_now): it wakes us */
        return;
    }
    take_p2p(comm, ops, &n, P2P_BATCH_CAP);
    pthread_mutex_unlock(&comm->lock);
    dshim_xfer_hooks_t hooks = {
        .absorb = absorb_p2p, .start = p2p_start, .done = p2p_done, .ctx = NULL, .cap = P2P_BATCH_CAP};
    dshim_status_t st;
    if (__atomic_load_n(&comm->error, __ATOMIC_ACQUIRE) != DSHIM_OK) {
        st = comm->error;
    } else {
        st = dshim_xfer_ex(comm, ops[0].sig, ops, n, &hooks);
    }
    pthread_mutex_lock(&comm->lock);
    /* the batch may have grown: n is only known through the ops' owners */
    for (int i = 0; i < P2P_BATCH_CAP && ops[i].user; i++) {
        /* a reported request may already be freed by its owner: only touch
         * the ones the batch did not complete */
        if (!ops[i].reported) {
            finish_req(comm, ops[i].user, st);
        }
    }
    __atomic_add_fetch(&comm->stats.collectives, 1, __ATOMIC_RELAXED);
    __atomic_store_n(&comm->busy, 0, __ATOMIC_SEQ_CST);
    pthread_cond_broadcast(&comm->cond);
    free(ops);
}

/* Runs a collective request in this thread, which holds the engine (busy)
 * but not the lock: numbers it and records it. */
static dshim_status_t execute(dshim_comm_t *comm, dshim_request_t *req)
{
    dshim_status_t st;
    if (__atomic_load_n(&comm->error, __ATOMIC_ACQUIRE) != DSHIM_OK) {
        st = comm->error;
        if (req->trace_begin) {
            dshim_trace_op_t top;
            dshim_engine_trace_op(req, &top);
            req->trace_id = dshim_trace_begin(comm->trace, &top, UINT64_MAX, NULL, comm->transport_desc);
        }
    } else {
        /* collectives are numbered in execution (= issue) order; point-to-point
         * messages are numbered per peer, because ranks not involved in them
         * do not count them */
        req->sig.seq = comm->next_seq++;
        if (comm->trace) {
            const char *algo = dshim_algo_name(comm, req);
            if (req->trace_begin) {
                /* its submitter runs it now: one record for both */
                dshim_trace_op_t top;
                dshim_engine_trace_op(req, &top);
                req->trace_id = dshim_trace_begin(comm->trace, &top, req->sig.seq, algo, comm->transport_desc);
            } else {
                dshim_trace_started(comm->trace, req->trace_id, req->sig.seq, algo, comm->transport_desc);
            }
            comm->trace_op = req->trace_id;
        }
        st = req->fn(comm, req);
        __atomic_add_fetch(&comm->stats.collectives, 1, __ATOMIC_RELAXED);
    }
    return st;
}

/* Executes the head of the queue.  Called with comm->lock held and !busy;
 * returns with the lock held (without executing anything when a blocking
 * call took the engine meanwhile, run_now: the caller then sees busy). */
static void run_head(dshim_comm_t *comm)
{
    if (comm->q_head->sig.coll == DSHIM_COLL_P2P) {
        run_p2p_batch(comm);
        return;
    }
    if (!claim(comm)) {
        return;
    }
    dshim_request_t *req = comm->q_head;
    set_head(comm, req->next);
    if (!comm->q_head) {
        comm->q_tail = NULL;
    }
    pthread_mutex_unlock(&comm->lock);
    dshim_status_t st = execute(comm, req);
    pthread_mutex_lock(&comm->lock);
    finish_req(comm, req, st);
    __atomic_store_n(&comm->busy, 0, __ATOMIC_SEQ_CST);
    pthread_cond_broadcast(&comm->cond);
}

/* A blocking collective submitted while nothing is queued and nobody
 * executes runs at once in its caller's thread, without the lock: the
 * engine is taken and let go by one compare-and-swap and one store (was: two
 * lock/unlock pairs, the queue's links and a wait loop).  Barrier 0.94 of its
 * time at N = 2, 0.96 at N = 4; 4 KiB allreduce 1.00 (docs/benchmarks.md,
 * "The per-op path").
 * 0: not run (the caller queues it as before). */
static int run_now(dshim_comm_t *comm, dshim_request_t *req)
{
    if (__atomic_load_n(&comm->stop, __ATOMIC_ACQUIRE) || !claim(comm)) {
        return 0;
    }
    if (head_of(comm)) {
        /* queued before this one (another thread): it goes first */
        release_unlocked(comm);
        return 0;
    }
    req->trace_begin = comm->trace != NULL; /* queued and started in one record */
    dshim_status_t st = execute(comm, req);
    dshim_trace_done(comm->trace, req->trace_id, st == DSHIM_OK);
    req->status = st;
    __atomic_store_n(&req->done, 1, __ATOMIC_RELEASE);
    release_unlocked(comm);
    if (st < 0) {
        dshim_error_set_raw(comm->errmsg[0] ? comm->errmsg : dshim_status_string(st));
    }
    return 1;
}

static void *progress_main(void *arg)
{
    dshim_comm_t *comm = arg;
    dshim_log_set_rank(comm->rank);
    pthread_mutex_lock(&comm->lock);
    while (!comm->stop) {
        if (!is_busy(comm) && comm->q_head) {
            run_head(comm);
        } else {
            pthread_cond_wait(&comm->cond, &comm->lock);
        }
    }
    pthread_mutex_unlock(&comm->lock);
    return NULL;
}

/* Whether a waiter should busy-poll before sleeping on the condition
 * variable.  Only for small requests: they finish within the spin window,
 * and a futex wake-up would double their latency.  A large one takes
 * milliseconds, and a waiter that spins (sched_yield is a context switch
 * whenever anything else is runnable) only takes the CPU from the thread
 * that executes it or from the application (profiled under PyTorch's DDP on
 * two cores: those context switches were most of its completion thread's CPU). */
static int worth_spinning(const dshim_comm_t *comm, const dshim_request_t *req)
{
    /* (with more ranks than cores, the thread this one waits for is the one
     * the core should go to: no spin at all) */
    return comm->spin_us > 0 && !comm->spin_yields &&
           req->count * dshim_dtype_size(req->dtype) <= comm->small_msg_bytes;
}

static dshim_status_t wait_locked(dshim_comm_t *comm, dshim_request_t *req)
{
    int spin = worth_spinning(comm, req);
    while (!req->done) {
        if (!is_busy(comm) && comm->q_head) {
            run_head(comm);
            continue;
        }
        /* someone else runs our request or an earlier one: brief spin
         * (small requests only), then sleep */
        pthread_mutex_unlock(&comm->lock);
        if (spin) {
            double until = dshim_now() + (double)comm->spin_us * 1e-6;
            while (!__atomic_load_n(&req->done, __ATOMIC_ACQUIRE) && dshim_now() < until) {
                sched_yield();
            }
        }
        pthread_mutex_lock(&comm->lock);
        if (!req->done && (is_busy(comm) || !comm->q_head)) {
            pthread_cond_wait(&comm->cond, &comm->lock);
        }
    }
    if (req->status < 0) {
        dshim_error_set_raw(comm->errmsg[0] ? comm->errmsg : dshim_status_string(req->status));
    }
    return req->status;
}

dshim_status_t dshim_engine_submit(dshim_comm_t *comm, dshim_request_t *req, int blocking)
{
    req->comm = comm;
    req->done = 0;
    req->next = NULL;
    req->trace_begin = 0;
    if (blocking && req->sig.coll != DSHIM_COLL_P2P && run_now(comm, req)) {
        return req->status;
    }
    pthread_mutex_lock(&comm->lock);
    if (comm->stop) {
        pthread_mutex_unlock(&comm->lock);
        return dshim_error(DSHIM_ERR_INVALID, "communicator is being destroyed");
    }
    if (comm->trace) {
        if (blocking && !is_busy(comm) && !comm->q_head && req->sig.coll != DSHIM_COLL_P2P) {
            /* wait_locked runs it at once in this thread (the lock is not
             * let go before; unless another thread's blocking call takes the
             * engine first, run_now): recorded when it runs, queued and
             * started together */
            req->trace_begin = 1;
        } else {
            /* under the lock: entries are numbered in issue order */
            dshim_trace_op_t top;
            dshim_engine_trace_op(req, &top);
            req->trace_id = dshim_trace_queued(comm->trace, &top);
        }
    }
    if (comm->q_tail) {
        comm->q_tail->next = req;
    } else {
        set_head(comm, req);
    }
    comm->q_tail = req;
    if (blocking) {
        dshim_status_t st = wait_locked(comm, req);
        pthread_mutex_unlock(&comm->lock);
        return st;
    }
    if (!comm->thread_started) {
        if (pthread_create(&comm->thread, NULL, progress_main, comm) == 0) {
            comm->thread_started = 1;
        } else {
            DSHIM_WARN("rank %d: cannot start the progress thread; requests progress in wait/test only", comm->rank);
        }
    }
    pthread_cond_broadcast(&comm->cond);
    pthread_mutex_unlock(&comm->lock);
    return DSHIM_OK;
}

void dshim_engine_wake(dshim_comm_t *comm)
{
    pthread_mutex_lock(&comm->lock);
    pthread_cond_broadcast(&comm->cond);
    pthread_mutex_unlock(&comm->lock);
}

void dshim_engine_shutdown(dshim_comm_t *comm)
{
    pthread_mutex_lock(&comm->lock);
    while (is_busy(comm) || comm->q_head) {
        if (!is_busy(comm)) {
            run_head(comm);
        } else if (comm->q_head) {
            pthread_cond_wait(&comm->cond, &comm->lock);
        } else {
            /* another thread's blocking call runs at once (run_now), which
             * wakes only threads with a queued request: look again shortly */
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_nsec += 1000000;
            if (until.tv_nsec >= 1000000000) {
                until.tv_sec++;
                until.tv_nsec -= 1000000000;
            }
            pthread_cond_timedwait(&comm->cond, &comm->lock, &until);
        }
    }
    __atomic_store_n(&comm->stop, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&comm->cond);
    int started = comm->thread_started;
    pthread_mutex_unlock(&comm->lock);
    if (started) {
        pthread_join(comm->thread, NULL);
    }
}

DSHIM_EXPORT dshim_status_t dshim_test(dshim_request_t *req, int *done_p)
{
    if (!req || !done_p) {
        return dshim_error(DSHIM_ERR_INVALID, "dshim_test: NULL argument");
    }
    dshim_comm_t *comm = req->comm;
    pthread_mutex_lock(&comm->lock);
    if (!req->done && !is_busy(comm) && comm->q_head == req && !comm->thread_started) {
        run_head(comm);
    }
    *done_p = req->done;
    dshim_status_t st = req->done ? req->status : DSHIM_INPROGRESS;
    if (st < 0) {
        dshim_error_set_raw(comm->errmsg);
    }
    pthread_mutex_unlock(&comm->lock);
    return st;
}

DSHIM_EXPORT dshim_status_t dshim_wait(dshim_request_t *req)
{
    if (!req) {
        return dshim_error(DSHIM_ERR_INVALID, "dshim_wait: NULL request");
    }
    dshim_comm_t *comm = req->comm;
    DSHIM_CHECK(dshim_comm_check_owner(comm, "dshim_wait"));
    pthread_mutex_lock(&comm->lock);
    dshim_status_t st = wait_locked(comm, req);
    pthread_mutex_unlock(&comm->lock);
    return st;
}

DSHIM_EXPORT dshim_status_t dshim_request_source(const dshim_request_t *req, int *source_p)
{
    if (!req || !source_p) {
        return dshim_error(DSHIM_ERR_INVALID, "dshim_request_source: NULL argument");
    }
    if (req->sig.coll != DSHIM_COLL_P2P || req->sending) {
        return dshim_error(DSHIM_ERR_INVALID, "dshim_request_source: the request is not a receive (only "
                                              "dshim_irecv/dshim_irecv_any requests have a source)");
    }
    if (!__atomic_load_n(&req->done, __ATOMIC_ACQUIRE)) {
        return dshim_error(DSHIM_ERR_INVALID, "dshim_request_source: the receive has not completed; call "
                                              "dshim_wait (or dshim_test until done) first");
    }
    if (req->source < 0) {
        return dshim_error(DSHIM_ERR_INVALID, "dshim_request_source: the receive failed before a message was "
                                              "matched to it (see dshim_wait's error)");
    }
    *source_p = req->source;
    return DSHIM_OK;
}

DSHIM_EXPORT void dshim_request_free(dshim_request_t *req)
{
    if (!req) {
        return;
    }
    if (!__atomic_load_n(&req->done, __ATOMIC_ACQUIRE)) {
        dshim_wait(req);
    }
    free(req->owned);
    if (req->heap) {
        free(req);
    }
}

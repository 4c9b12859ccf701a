/* Request engine (see engine.h). */
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config.h"
#include "engine.h"
#include "net.h"
#include "status.h"

void dshim_engine_init(dshim_comm_t *comm)
{
    const dshim_config_t *cfg = dshim_config();
    comm->chunk_bytes = cfg->chunk_bytes < 4096 ? 4096 : cfg->chunk_bytes;
    comm->small_msg_bytes = cfg->small_msg_bytes;
    comm->timeout_s = cfg->timeout_s > 0 ? cfg->timeout_s : 1e9;
    comm->spin_us = cfg->spin_us;
    comm->check_sig = cfg->check_collectives;
    comm->reduce = dshim_reduce_cpu_ops(cfg->reduce_isa);
    const char *a = cfg->algo;
    comm->algo = !strcasecmp(a, "ring") ? DSHIM_ALGO_RING
               : !strcasecmp(a, "rd")   ? DSHIM_ALGO_RD
               : !strcasecmp(a, "hier") ? DSHIM_ALGO_HIER
                                        : DSHIM_ALGO_AUTO;
    if (strcasecmp(a, "auto") && comm->algo == DSHIM_ALGO_AUTO) {
        DSHIM_WARN("DSHIM_ALGO=%s is not one of auto, ring, rd, hier; using auto", a);
    }
}

/* Executes the head of the queue.  Called with comm->lock held and !busy;
 * returns with the lock held. */
static void run_head(dshim_comm_t *comm)
{
    dshim_request_t *req = comm->q_head;
    comm->q_head = req->next;
    if (!comm->q_head) {
        comm->q_tail = NULL;
    }
    comm->busy = 1;
    pthread_mutex_unlock(&comm->lock);
    dshim_status_t st;
    if (__atomic_load_n(&comm->error, __ATOMIC_ACQUIRE) != DSHIM_OK) {
        st = comm->error;
    } else {
        /* collectives are numbered in execution (= issue) order; point-to-point
         * messages are numbered per peer by the send/recv code, because ranks
         * not involved in them do not count them */
        if (req->sig.coll != DSHIM_COLL_P2P) {
            req->sig.seq = comm->next_seq++;
        }
        st = req->fn(comm, req);
        __atomic_add_fetch(&comm->stats.collectives, 1, __ATOMIC_RELAXED);
    }
    pthread_mutex_lock(&comm->lock);
    req->status = st;
    __atomic_store_n(&req->done, 1, __ATOMIC_RELEASE);
    comm->busy = 0;
    pthread_cond_broadcast(&comm->cond);
}

static void *progress_main(void *arg)
{
    dshim_comm_t *comm = arg;
    dshim_log_set_rank(comm->rank);
    pthread_mutex_lock(&comm->lock);
    while (!comm->stop) {
        if (!comm->busy && comm->q_head) {
            run_head(comm);
        } else {
            pthread_cond_wait(&comm->cond, &comm->lock);
        }
    }
    pthread_mutex_unlock(&comm->lock);
    return NULL;
}

static dshim_status_t wait_locked(dshim_comm_t *comm, dshim_request_t *req)
{
    while (!req->done) {
        if (!comm->busy && comm->q_head) {
            run_head(comm);
            continue;
        }
        /* someone else runs our request or an earlier one: brief spin, then sleep */
        pthread_mutex_unlock(&comm->lock);
        double until = dshim_now() + (double)comm->spin_us * 1e-6;
        while (!__atomic_load_n(&req->done, __ATOMIC_ACQUIRE) && dshim_now() < until) {
            sched_yield();
        }
        pthread_mutex_lock(&comm->lock);
        if (!req->done && (comm->busy || !comm->q_head)) {
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
    pthread_mutex_lock(&comm->lock);
    if (comm->stop) {
        pthread_mutex_unlock(&comm->lock);
        return dshim_error(DSHIM_ERR_INVALID, "communicator is being destroyed");
    }
    if (comm->q_tail) {
        comm->q_tail->next = req;
    } else {
        comm->q_head = req;
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
    while (comm->busy || comm->q_head) {
        if (!comm->busy) {
            run_head(comm);
        } else {
            pthread_cond_wait(&comm->cond, &comm->lock);
        }
    }
    comm->stop = 1;
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
    if (!req->done && !comm->busy && comm->q_head == req && !comm->thread_started) {
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
    pthread_mutex_lock(&comm->lock);
    dshim_status_t st = wait_locked(comm, req);
    pthread_mutex_unlock(&comm->lock);
    return st;
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

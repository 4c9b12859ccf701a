/* The engine's background thread: rounds, paced.
 *
 * A round starts at once after a round that brought requests (from any
 * rank) or executed something, and whenever this rank has submissions
 * waiting; otherwise the thread waits for a submission, at most
 * HOROVOD_CYCLE_TIME, and runs a round anyway: a rank whose application
 * submits nothing still takes part, so the others never wait on it for
 * longer than a cycle, and an idle job costs one small collective per
 * cycle per rank.
 *
 * The thread stops when a round carries a shutdown (any rank's), when rank
 * 0's stall verdict shuts Horovod down, or when a collective of the
 * private communicator fails (a peer died, the timeout): every operation it
 * holds, and every later submission, fails with that message. */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "named.h"
#include "net.h"
#include "status.h"

static void wait_idle(dshim_named_t *eng)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    long ns = (long)(eng->cycle_s * 1e9);
    ts.tv_sec += ns / 1000000000L;
    ts.tv_nsec += ns % 1000000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&eng->wake, &eng->lock, &ts);
}

/* Stops the engine: later submissions fail with msg; the operations not
 * yet in the table (from `left` on, and the queue) fail here, those in the
 * table with it. */
static void set_stopped(dshim_named_t *eng, dshim_status_t st, const char *msg)
{
    pthread_mutex_lock(&eng->lock);
    if (!eng->stopped) {
        eng->stopped = 1;
        eng->stop_status = st;
        eng->stop_msg = strdup(msg);
    }
    pthread_mutex_unlock(&eng->lock);
}

static void stop(dshim_named_t *eng, dshim_status_t st, const char *msg, dshim_named_op_t *left)
{
    set_stopped(eng, st, msg);
    pthread_mutex_lock(&eng->lock);
    dshim_named_op_t *queued = eng->qhead;
    eng->qhead = eng->qtail = NULL;
    pthread_mutex_unlock(&eng->lock);
    dshim_named_table_fail_all(eng, st, msg);
    for (dshim_named_op_t *lists[2] = {left, queued}, **l = lists; l < lists + 2; l++) {
        dshim_named_op_t *op = *l;
        while (op) {
            dshim_named_op_t *next = op->qnext;
            dshim_named_complete(eng, op, st, msg);
            op = next;
        }
    }
}

/* A failure that is not a shutdown: the peers must stop too, at once. */
static void fail_engine(dshim_named_t *eng, dshim_status_t st, dshim_named_op_t *left)
{
    char msg[1024];
    snprintf(msg, sizeof(msg), "%s", dshim_last_error());
    if (!msg[0]) {
        snprintf(msg, sizeof(msg), "rank %d: named operations: %s", eng->rank, dshim_status_string(st));
    }
    dshim_comm_abort(eng->comm, msg);
    stop(eng, st, msg, left);
}

/* Serialises the batch; the ops stay linked through qnext. */
static dshim_status_t write_batch(dshim_named_t *eng, dshim_named_op_t *batch, int shut, const char *reason)
{
    dshim_named_out_reset(eng);
    for (dshim_named_op_t *op = batch; op; op = op->qnext) {
        if (op->kind == DSHIM_NAMED_JOIN) {
            DSHIM_CHECK(dshim_named_out_join(eng));
        } else {
            DSHIM_CHECK(dshim_named_out_req(eng, op));
        }
    }
    if (shut) {
        DSHIM_CHECK(dshim_named_out_shutdown(eng, reason ? reason : "no reason given"));
    }
    dshim_named_stall_check(eng);
    return DSHIM_OK;
}

static void stall_text(char *msg, size_t len)
{
    snprintf(msg, len, "%s (a stall longer than HOROVOD_STALL_SHUTDOWN_TIME_SECONDS)", dshim_named_shutdown_text());
}

typedef struct round_out {
    int any;          /* some rank sent something */
    int shutdown_by;  /* -1: nobody */
    char reason[256];
    int stall_stop;
} round_out_t;

/* Reads every rank's records into the table; *left advances over this
 * rank's ops as they are taken in. */
static dshim_status_t read_round(dshim_named_t *eng, dshim_named_op_t **left, round_out_t *ro)
{
    int joins_before = eng->njoined;
    int have_verdict[3] = {0, 0, 0};
    uint64_t cutoff[3] = {0, 0, 0};
    for (int r = 0; r < eng->size; r++) {
        dshim_named_reader_t rd;
        dshim_named_rec_t rec;
        dshim_named_reader_init(eng, r, &rd);
        int got;
        while ((got = dshim_named_reader_next(&rd, &rec)) == 1) {
            ro->any = 1;
            dshim_named_op_t *mine = r == eng->rank ? *left : NULL;
            switch (rec.type) {
            case DSHIM_NAMED_REC_REQ:
                if (r == eng->rank && !mine) {
                    return dshim_error(DSHIM_ERR_INTERNAL, "rank %d: named operations: a request of its own that it "
                                       "did not send ('%s')", eng->rank, rec.text);
                }
                DSHIM_CHECK(dshim_named_table_add(eng, r, &rec.req, rec.text, rec.text_len, mine));
                break;
            case DSHIM_NAMED_REC_JOIN:
                if (!eng->joined[r]) {
                    eng->joined[r] = 1;
                    eng->njoined++;
                }
                eng->last_joined = r;
                if (mine) {
                    eng->join_op = mine;
                }
                break;
            case DSHIM_NAMED_REC_SHUTDOWN:
                if (ro->shutdown_by < 0) {
                    ro->shutdown_by = r;
                    snprintf(ro->reason, sizeof(ro->reason), "%s", rec.text);
                }
                break;
            case DSHIM_NAMED_REC_VERDICT:
                if (rec.cause == DSHIM_NAMED_VERDICT_TIMEOUT || rec.cause == DSHIM_NAMED_VERDICT_STALL) {
                    have_verdict[rec.cause] = 1;
                    cutoff[rec.cause] = rec.cutoff;
                }
                break;
            }
            if (mine && (rec.type == DSHIM_NAMED_REC_REQ || rec.type == DSHIM_NAMED_REC_JOIN)) {
                *left = mine->qnext;
            }
        }
        if (got < 0) {
            return dshim_error(DSHIM_ERR_PROTOCOL, "rank %d: named operations: unreadable round %llu from rank %d",
                               eng->rank, (unsigned long long)eng->round, r);
        }
    }
    if (eng->njoined != joins_before) {
        dshim_named_table_rescan(eng);
    }
    if (have_verdict[DSHIM_NAMED_VERDICT_TIMEOUT]) {
        dshim_named_table_verdict(eng, DSHIM_NAMED_VERDICT_TIMEOUT, cutoff[DSHIM_NAMED_VERDICT_TIMEOUT]);
    }
    if (have_verdict[DSHIM_NAMED_VERDICT_STALL]) {
        /* Horovod shuts down: no submission may slip in once the stalled
         * names' waiters wake up */
        char msg[1024];
        stall_text(msg, sizeof(msg));
        set_stopped(eng, DSHIM_ERR_ABORTED, msg);
        dshim_named_table_verdict(eng, DSHIM_NAMED_VERDICT_STALL, cutoff[DSHIM_NAMED_VERDICT_STALL]);
        ro->stall_stop = 1;
    }
    return DSHIM_OK;
}

static void finish_join(dshim_named_t *eng)
{
    if (eng->join_op) {
        eng->join_op->join_rank = eng->last_joined;
        dshim_named_complete(eng, eng->join_op, DSHIM_OK, NULL);
        eng->join_op = NULL;
    }
    memset(eng->joined, 0, (size_t)eng->size);
    eng->njoined = 0;
    eng->last_joined = -1;
}

void *dshim_named_thread(void *arg)
{
    dshim_named_t *eng = arg;
    int busy = 1;
    for (;;) {
        if (busy && eng->spin_s > 0 && !__atomic_load_n(&eng->qhead_hint, __ATOMIC_ACQUIRE)) {
            /* after work the application's next submission usually follows
             * at once (a training step's next tensor, the next of a loop of
             * small ones): waiting for it a little, polling and yielding the
             * core, lets the next round carry it, instead of a round with
             * nothing and another after it */
            unsigned seen = __atomic_load_n(&eng->kicks, __ATOMIC_ACQUIRE);
            double end = dshim_now() + eng->spin_s;
            unsigned loop = 0;
            while (__atomic_load_n(&eng->kicks, __ATOMIC_ACQUIRE) == seen && dshim_now() < end) {
                dshim_named_spin_once(eng->spin_yields, &loop);
            }
        }
        pthread_mutex_lock(&eng->lock);
        if (!busy && !eng->qhead && !eng->shutdown_asked) {
            wait_idle(eng);
        }
        dshim_named_op_t *batch = eng->qhead;
        eng->qhead = eng->qtail = NULL;
        __atomic_store_n(&eng->qhead_hint, 0, __ATOMIC_RELEASE);
        int shut = eng->shutdown_asked;
        char reason[256] = "";
        if (shut && eng->shutdown_reason) {
            snprintf(reason, sizeof(reason), "%s", eng->shutdown_reason);
        }
        pthread_mutex_unlock(&eng->lock);

        eng->round++;
        dshim_named_tl_cycle(eng);
        dshim_named_op_t *left = batch;
        dshim_status_t st = write_batch(eng, batch, shut, reason);
        if (st == DSHIM_OK) {
            st = dshim_named_exchange(eng);
        }
        round_out_t ro = {.shutdown_by = -1};
        if (st == DSHIM_OK) {
            st = read_round(eng, &left, &ro);
        }
        if (st != DSHIM_OK) {
            fail_engine(eng, st, left);
            break;
        }
        if (ro.shutdown_by >= 0 || ro.stall_stop) {
            char msg[1024];
            if (ro.shutdown_by >= 0) {
                snprintf(msg, sizeof(msg), "%s (rank %d of the engine shut it down: %s)", dshim_named_shutdown_text(),
                         ro.shutdown_by, ro.reason);
            } else {
                stall_text(msg, sizeof(msg));
            }
            stop(eng, DSHIM_ERR_ABORTED, msg, left);
            break;
        }
        int executed = 0;
        st = dshim_named_execute(eng, &executed);
        if (st != DSHIM_OK) {
            fail_engine(eng, st, NULL);
            break;
        }
        if (eng->njoined == eng->size) {
            finish_join(eng);
            executed = 1;
        }
        busy = ro.any || executed;
    }
    return NULL;
}

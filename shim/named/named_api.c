/* The public functions of the named-operation engine (dshim.h): creation,
 * submission with its argument checks (Horovod's enqueue-time refusals),
 * completion and results, shutdown and destruction. */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "dshim_hook.h"
#include "named.h"
#include "reduce/reduce.h"
#include "net.h"
#include "status.h"

/* Horovod's texts (common.h), word for word: scripts and tests match them */
static const char SHUT_DOWN_TEXT[] =
    "Horovod has been shut down. This was caused by an exception on one of the ranks or an attempt to "
    "allreduce, allgather or broadcast a tensor after one of the ranks finished execution. If the shutdown "
    "was caused by an exception, you should see the exception in the log before the first shutdown message.";
static const char DUPLICATE_TEXT[] =
    "Requested to allreduce, allgather, or broadcast a tensor with the same name as another tensor that is "
    "currently being processed.  If you want to request another tensor, use a different tensor name.";

const char *dshim_named_kind_name(dshim_named_kind_t kind)
{
    static const char *names[] = {"allreduce", "allgather", "broadcast", "alltoall",
                                  "reducescatter", "barrier", "join"};
    return (unsigned)kind < DSHIM_NAMED_KIND_COUNT ? names[kind] : "?";
}

const char *dshim_named_kind_upper(dshim_named_kind_t kind)
{
    static const char *names[] = {"ALLREDUCE", "ALLGATHER", "BROADCAST", "ALLTOALL",
                                  "REDUCESCATTER", "BARRIER", "JOIN"};
    return (unsigned)kind < DSHIM_NAMED_KIND_COUNT ? names[kind] : "<unknown>";
}

int64_t dshim_named_elems(int ndim, const int64_t *shape, int from)
{
    int64_t n = 1;
    for (int i = from; i < ndim; i++) {
        n *= shape[i];
    }
    return n;
}

const char *dshim_named_shutdown_text(void)
{
    return SHUT_DOWN_TEXT;
}

/* ---------------------------------------------------------------- creation */

DSHIM_EXPORT dshim_status_t dshim_named_create(dshim_comm_t *comm, dshim_named_t **eng_p)
{
    if (!comm || !eng_p) {
        return dshim_error(DSHIM_ERR_INVALID, "named_create: %s is NULL", comm ? "eng_p" : "comm");
    }
    *eng_p = NULL;
    const dshim_config_t *cfg = dshim_config();
    dshim_named_t *eng = calloc(1, sizeof(*eng));
    if (!eng) {
        return dshim_error(DSHIM_ERR_NOMEM, "named_create: out of memory");
    }
    /* a communicator of its own, so that the engine's rounds never meet the
     * caller's collectives on comm (collective: every rank splits) */
    dshim_status_t st = dshim_comm_split(comm, 0, dshim_comm_rank(comm), &eng->comm);
    if (st != DSHIM_OK) {
        free(eng);
        return st;
    }
    eng->timeout_s = dshim_hook_timeout(comm);
    dshim_comm_set_timeout(eng->comm, eng->timeout_s);
    dshim_comm_set_desc(eng->comm, "named operations (Horovod)");
    /* the engine's thread waits in its collectives while the application's
     * thread computes (a backward pass submitting gradients, a caller
     * polling for its result): counted as one thread per rank, 2 ranks on 2
     * cores pause-spun on the cores their applications needed, and the
     * rounds' small allgathers took the ring instead of the host gate (the
     * 1-float allreduce through the engine, 2 ranks on 2 cores, interleaved
     * with dshim_allreduce: 2.1-2.2x its time before, 1.5-1.7x after) */
    dshim_hook_shares_cores(eng->comm);
    eng->rank = dshim_comm_rank(eng->comm);
    eng->size = dshim_comm_size(eng->comm);
    dshim_named_read_settings(eng);
    eng->spin_s = cfg->spin_us > 0 ? (double)cfg->spin_us * 1e-6 : 0;
    eng->reduce_ops = dshim_reduce_cpu_ops(cfg->reduce_isa);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    eng->spin_yields = cpus < 2L * dshim_hook_local_size(eng->comm);
    eng->last_joined = -1;
    eng->joined = calloc((size_t)eng->size, 1);
    eng->slots = malloc((size_t)eng->size * DSHIM_NAMED_SLOT);
    if (!eng->joined || !eng->slots) {
        st = dshim_error(DSHIM_ERR_NOMEM, "named_create: out of memory");
        goto fail;
    }
    pthread_mutex_init(&eng->lock, NULL);
    /* the timeline starts when the caller asks (dshim_named_timeline): it
     * knows which of its engines (process sets) writes HOROVOD_TIMELINE */
    pthread_mutex_init(&eng->tl.mu, NULL);
    /* the idle wait between rounds is timed on the monotonic clock */
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&eng->wake, &ca);
    pthread_condattr_destroy(&ca);
    int rc = pthread_create(&eng->thread, NULL, dshim_named_thread, eng);
    if (rc != 0) {
        dshim_named_tl_open(eng, NULL, 0);
        pthread_mutex_destroy(&eng->tl.mu);
        pthread_mutex_destroy(&eng->lock);
        pthread_cond_destroy(&eng->wake);
        st = dshim_error(DSHIM_ERR_SYSTEM, "rank %d: named_create: pthread_create: %s", eng->rank, strerror(rc));
        goto fail;
    }
    eng->thread_started = 1;
    *eng_p = eng;
    return DSHIM_OK;
fail:
    dshim_comm_destroy(eng->comm);
    free(eng->joined);
    free(eng->slots);
    free(eng);
    return st;
}

/* ---------------------------------------------------------------- submission */

static dshim_status_t check_desc(const dshim_named_t *eng, const dshim_named_desc_t *d, const char *name)
{
    const char *kind = dshim_named_kind_name(d->kind);
    int r = eng->rank;
    if (d->kind == DSHIM_NAMED_BARRIER || d->kind == DSHIM_NAMED_JOIN) {
        return DSHIM_OK;
    }
    if ((unsigned)d->dtype >= DSHIM_DTYPE_COUNT) {
        return dshim_error(DSHIM_ERR_INVALID, "rank %d: %s '%s': unknown dtype %d", r, kind, name, (int)d->dtype);
    }
    if (d->ndim < 0 || d->ndim > DSHIM_NAMED_MAX_DIMS || (d->ndim > 0 && !d->shape)) {
        return dshim_error(DSHIM_ERR_INVALID, "rank %d: %s '%s': ndim %d (0..%d, shape not NULL)", r, kind, name,
                           d->ndim, DSHIM_NAMED_MAX_DIMS);
    }
    for (int i = 0; i < d->ndim; i++) {
        if (d->shape[i] < 0) {
            return dshim_error(DSHIM_ERR_INVALID, "rank %d: %s '%s': dimension %d is %lld", r, kind, name, i,
                               (long long)d->shape[i]);
        }
    }
    int64_t count = dshim_named_elems(d->ndim, d->shape, 0);
    if (count > 0 && d->kind != DSHIM_NAMED_BROADCAST && !d->sendbuf) {
        return dshim_error(DSHIM_ERR_INVALID, "rank %d: %s '%s': sendbuf is NULL", r, kind, name);
    }
    if (count > 0 && (d->kind == DSHIM_NAMED_ALLREDUCE || d->kind == DSHIM_NAMED_BROADCAST) && !d->recvbuf) {
        return dshim_error(DSHIM_ERR_INVALID, "rank %d: %s '%s': recvbuf is NULL", r, kind, name);
    }
    if ((d->kind == DSHIM_NAMED_ALLREDUCE || d->kind == DSHIM_NAMED_REDUCESCATTER) &&
        ((unsigned)d->op >= DSHIM_REDOP_COUNT || d->prescale != d->prescale || d->postscale != d->postscale)) {
        return dshim_error(DSHIM_ERR_INVALID, "rank %d: %s '%s': unknown reduction op %d or NaN scale factor", r,
                           kind, name, (int)d->op);
    }
    if (d->kind == DSHIM_NAMED_REDUCESCATTER && d->op != DSHIM_SUM && d->op != DSHIM_AVG) {
        /* Horovod's Status::Aborted (a RuntimeError in Python), not an invalid argument */
        return dshim_error(DSHIM_ERR_UNSUPPORTED, "rank %d: %s '%s': Reducescatter currently only supports AVERAGE and "
                           "SUM.", r, kind, name);
    }
    if (d->kind == DSHIM_NAMED_BROADCAST && (d->root < 0 || d->root >= eng->size)) {
        return dshim_error(DSHIM_ERR_INVALID, "rank %d: %s '%s': broadcast received invalid root rank %d for provided "
                           "process set", r, kind, name, d->root);
    }
    if (d->kind == DSHIM_NAMED_ALLTOALL) {
        int64_t dim0 = d->ndim > 0 ? d->shape[0] : 1;
        if (d->splits) {
            int64_t sum = 0;
            for (int i = 0; i < eng->size; i++) {
                if (d->splits[i] < 0) {
                    return dshim_error(DSHIM_ERR_INVALID, "rank %d: %s '%s': splits[%d] is %lld", r, kind, name, i,
                                       (long long)d->splits[i]);
                }
                sum += d->splits[i];
            }
            if (sum > dim0) {
                return dshim_error(DSHIM_ERR_INVALID, "rank %d: %s '%s': Sum of splits entries is greater than the "
                                   "first dimension of tensor.", r, kind, name);
            }
        } else if (dim0 % eng->size != 0) {
            return dshim_error(DSHIM_ERR_INVALID, "rank %d: %s '%s': splits not provided, but first dimension of "
                               "tensor is not an even multiple of the number of workers.", r, kind, name);
        }
    }
    return DSHIM_OK;
}

static dshim_named_op_t *op_new(const dshim_named_t *eng, const dshim_named_desc_t *d, const char *name)
{
    dshim_named_op_t *op = calloc(1, sizeof(*op));
    if (!op) {
        return NULL;
    }
    op->name = strdup(name);
    if (!op->name) {
        free(op);
        return NULL;
    }
    op->kind = d->kind;
    op->join_rank = -1;
    op->spin_s = eng->spin_s;
    op->spin_yields = eng->spin_yields;
    op->refs = 2;
    pthread_mutex_init(&op->mu, NULL);
    pthread_cond_init(&op->cv, NULL);
    op->device = -1;
    if (d->kind == DSHIM_NAMED_BARRIER || d->kind == DSHIM_NAMED_JOIN) {
        return op;
    }
    op->dtype = d->dtype;
    op->ndim = d->ndim;
    for (int i = 0; i < d->ndim; i++) {
        op->shape[i] = d->shape[i];
    }
    op->sendbuf = d->sendbuf;
    op->recvbuf = d->recvbuf;
    op->op = d->op;
    op->prescale = d->prescale;
    op->postscale = d->postscale;
    if (d->kind == DSHIM_NAMED_REDUCESCATTER && d->op == DSHIM_AVG) {
        /* Horovod averages a reducescatter through its postscale factor at
         * enqueue, so that is the factor the ranks compare */
        op->postscale /= eng->size;
        op->op = DSHIM_SUM;
    }
    op->root = d->root;
    op->device = d->device < 0 ? -1 : d->device;
    if (d->kind == DSHIM_NAMED_ALLTOALL) {
        op->splits = malloc(sizeof(int64_t) * (size_t)eng->size);
        if (!op->splits) {
            free(op->name);
            free(op);
            return NULL;
        }
        int64_t dim0 = d->ndim > 0 ? d->shape[0] : 1;
        for (int i = 0; i < eng->size; i++) {
            op->splits[i] = d->splits ? d->splits[i] : dim0 / eng->size;
        }
    }
    return op;
}

static void op_destroy(dshim_named_op_t *op)
{
    pthread_mutex_destroy(&op->mu);
    pthread_cond_destroy(&op->cv);
    free(op->name);
    free(op->error);
    free(op->splits);
    free(op->result);
    free(op->recv_splits);
    free(op);
}

void dshim_named_op_unref(dshim_named_op_t *op)
{
    if (__atomic_sub_fetch(&op->refs, 1, __ATOMIC_ACQ_REL) == 0) {
        op_destroy(op);
    }
}

DSHIM_EXPORT dshim_status_t dshim_named_submit(dshim_named_t *eng, const dshim_named_desc_t *desc,
                                               dshim_named_op_t **op_p)
{
    if (!eng || !desc || !op_p) {
        return dshim_error(DSHIM_ERR_INVALID, "named_submit: %s is NULL", !eng ? "eng" : !desc ? "desc" : "op_p");
    }
    *op_p = NULL;
    if ((unsigned)desc->kind >= DSHIM_NAMED_KIND_COUNT) {
        return dshim_error(DSHIM_ERR_INVALID, "rank %d: named_submit: unknown kind %d", eng->rank, (int)desc->kind);
    }
    const char *name = desc->kind == DSHIM_NAMED_BARRIER ? DSHIM_NAMED_BARRIER_NAME
                       : desc->kind == DSHIM_NAMED_JOIN  ? DSHIM_NAMED_JOIN_NAME
                                                         : desc->name;
    if (!name) {
        return dshim_error(DSHIM_ERR_INVALID, "rank %d: %s: the name is NULL", eng->rank,
                           dshim_named_kind_name(desc->kind));
    }
    DSHIM_CHECK(check_desc(eng, desc, name));
    dshim_named_op_t *op = op_new(eng, desc, name);
    if (!op) {
        return dshim_error(DSHIM_ERR_NOMEM, "rank %d: %s '%s': out of memory", eng->rank,
                           dshim_named_kind_name(desc->kind), name);
    }
    pthread_mutex_lock(&eng->lock);
    dshim_status_t st = DSHIM_OK;
    if (eng->stopped) {
        st = dshim_error_quiet(eng->stop_status, "%s", eng->stop_msg ? eng->stop_msg : SHUT_DOWN_TEXT);
    } else if (eng->shutdown_asked) {
        st = dshim_error_quiet(DSHIM_ERR_ABORTED, "%s", SHUT_DOWN_TEXT);
    } else if (dshim_named_map_get(&eng->pending, op->name)) {
        st = dshim_error_quiet(DSHIM_ERR_INVALID, "rank %d: %s '%s': %s", eng->rank, dshim_named_kind_name(op->kind),
                               op->name, DUPLICATE_TEXT);
    } else {
        st = dshim_named_map_put(&eng->pending, &op->pnode, op->name, op);
    }
    if (st != DSHIM_OK) {
        pthread_mutex_unlock(&eng->lock);
        op_destroy(op);
        return st;
    }
    if (eng->qtail) {
        eng->qtail->qnext = op;
    } else {
        eng->qhead = op;
    }
    eng->qtail = op;
    __atomic_store_n(&eng->qhead_hint, 1, __ATOMIC_RELEASE);
    __atomic_add_fetch(&eng->kicks, 1, __ATOMIC_RELEASE);
    pthread_cond_signal(&eng->wake);
    pthread_mutex_unlock(&eng->lock);
    *op_p = op;
    return DSHIM_OK;
}

void dshim_named_complete(dshim_named_t *eng, dshim_named_op_t *op, dshim_status_t st, const char *msg)
{
    pthread_mutex_lock(&eng->lock);
    if (dshim_named_map_get(&eng->pending, op->name) == op) {
        dshim_named_map_del(&eng->pending, op->name);
    }
    pthread_mutex_unlock(&eng->lock);
    pthread_mutex_lock(&op->mu);
    op->status = st;
    if (st != DSHIM_OK) {
        op->error = strdup(msg && *msg ? msg : dshim_status_string(st));
    }
    __atomic_store_n(&op->done, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&op->cv);
    pthread_mutex_unlock(&op->mu);
    dshim_named_op_unref(op);
}

/* ---------------------------------------------------------------- completion */

DSHIM_EXPORT int dshim_named_poll(dshim_named_op_t *op)
{
    return op ? __atomic_load_n(&op->done, __ATOMIC_ACQUIRE) : -1;
}

DSHIM_EXPORT dshim_status_t dshim_named_wait(dshim_named_op_t *op)
{
    if (!op) {
        return dshim_error(DSHIM_ERR_INVALID, "named_wait: op is NULL");
    }
    /* the engine often completes an operation within microseconds of the
     * wait (a loop of small allreduces): polling a little, yielding the
     * core, spares a sleep and a wake-up, as the communicator's waits do */
    if (op->spin_s > 0 && !__atomic_load_n(&op->done, __ATOMIC_ACQUIRE)) {
        double end = dshim_now() + op->spin_s;
        unsigned loop = 0;
        while (!__atomic_load_n(&op->done, __ATOMIC_ACQUIRE) && dshim_now() < end) {
            dshim_named_spin_once(op->spin_yields, &loop);
        }
    }
    dshim_status_t st;
    if (__atomic_load_n(&op->done, __ATOMIC_ACQUIRE)) {
        /* status and message were written before done (release): no lock,
         * which the completing thread may still hold for its broadcast */
        st = op->status;
    } else {
        pthread_mutex_lock(&op->mu);
        while (!op->done) {
            pthread_cond_wait(&op->cv, &op->mu);
        }
        st = op->status;
        pthread_mutex_unlock(&op->mu);
    }
    if (st != DSHIM_OK) {
        dshim_error_set_raw(op->error ? op->error : dshim_status_string(st));
    }
    return st;
}

DSHIM_EXPORT const char *dshim_named_error(const dshim_named_op_t *op)
{
    if (!op || !__atomic_load_n(&op->done, __ATOMIC_ACQUIRE) || !op->error) {
        return "";
    }
    return op->error;
}

DSHIM_EXPORT dshim_status_t dshim_named_result(const dshim_named_op_t *op, void **data, size_t *bytes,
                                               int64_t *dim0, int64_t *recv_splits, int cap)
{
    if (!op) {
        return dshim_error(DSHIM_ERR_INVALID, "named_result: op is NULL");
    }
    if (!__atomic_load_n(&op->done, __ATOMIC_ACQUIRE)) {
        return dshim_error(DSHIM_ERR_INVALID, "named_result: %s '%s' has not completed",
                           dshim_named_kind_name(op->kind), op->name);
    }
    if (op->status != DSHIM_OK) {
        return dshim_error_quiet(op->status, "%s", op->error ? op->error : dshim_status_string(op->status));
    }
    if (op->kind != DSHIM_NAMED_ALLGATHER && op->kind != DSHIM_NAMED_ALLTOALL &&
        op->kind != DSHIM_NAMED_REDUCESCATTER) {
        return dshim_error(DSHIM_ERR_INVALID, "named_result: %s '%s' has no engine-owned result",
                           dshim_named_kind_name(op->kind), op->name);
    }
    if (data) {
        *data = op->result;
    }
    if (bytes) {
        *bytes = op->result_bytes;
    }
    if (dim0) {
        *dim0 = op->result_dim0;
    }
    if (recv_splits) {
        for (int i = 0; i < cap && i < op->nsplits; i++) {
            recv_splits[i] = op->recv_splits[i];
        }
    }
    return DSHIM_OK;
}

DSHIM_EXPORT int dshim_named_join_rank(const dshim_named_op_t *op)
{
    if (!op || op->kind != DSHIM_NAMED_JOIN || !__atomic_load_n(&op->done, __ATOMIC_ACQUIRE)) {
        return -1;
    }
    return op->join_rank;
}

DSHIM_EXPORT void dshim_named_op_free(dshim_named_op_t *op)
{
    if (!op) {
        return;
    }
    dshim_named_wait(op);
    dshim_named_op_unref(op);
}

/* ---------------------------------------------------------------- shutdown */

DSHIM_EXPORT dshim_status_t dshim_named_shutdown(dshim_named_t *eng, const char *reason)
{
    if (!eng) {
        return dshim_error(DSHIM_ERR_INVALID, "named_shutdown: eng is NULL");
    }
    pthread_mutex_lock(&eng->lock);
    if (!eng->shutdown_asked) {
        eng->shutdown_asked = 1;
        eng->shutdown_reason = strdup(reason ? reason : "no reason given");
    }
    __atomic_store_n(&eng->qhead_hint, 1, __ATOMIC_RELEASE);
    __atomic_add_fetch(&eng->kicks, 1, __ATOMIC_RELEASE);
    pthread_cond_signal(&eng->wake);
    pthread_mutex_unlock(&eng->lock);
    return DSHIM_OK;
}

DSHIM_EXPORT dshim_status_t dshim_named_destroy(dshim_named_t *eng)
{
    if (!eng) {
        return DSHIM_OK;
    }
    dshim_named_shutdown(eng, "the engine was destroyed");
    if (eng->thread_started) {
        pthread_join(eng->thread, NULL);
    }
    /* the thread failed everything it held and left stopped set: nothing
     * can enter the queue any more */
    dshim_status_t st = dshim_comm_destroy(eng->comm);
    dshim_named_tl_open(eng, NULL, 0);
    pthread_mutex_destroy(&eng->tl.mu);
    dshim_named_table_free(eng);
    dshim_named_map_free(&eng->pending);
    free(eng->fusion);
    free(eng->out);
    free(eng->extra);
    free(eng->extra_counts);
    free(eng->text);
    free(eng->data);
    pthread_mutex_destroy(&eng->lock);
    pthread_cond_destroy(&eng->wake);
    free(eng->shutdown_reason);
    free(eng->stop_msg);
    free(eng->joined);
    free(eng->slots);
    free(eng);
    return st;
}

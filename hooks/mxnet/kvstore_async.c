/* pushpull inside MXNet's engine: as ps-lite's KVStoreDist does, the call
 * returns at once after queueing an engine operation that reads the pushed
 * arrays and writes the outputs; the engine keeps readers of the outputs
 * waiting until dshim's receiver thread has the servers' answer.  The round
 * trips of successive keys overlap each other and the Python thread.
 *
 * A failed operation completes with an error for MXNet's engine, which marks
 * every output with it: the first read of an output (wait_to_read, asnumpy,
 * an operator using it) raises MXNetError with dshim's message, as for a
 * failing MXNet operator; the output is never handed out unwritten.
 *
 * Only for CPU arrays (the operation reads and writes their memory directly)
 * and without gradient compression (MXNet refuses compression with pushpull);
 * anything else takes the synchronous path. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "mxnet/kvstore.h"
#include "status.h"

#define MX() dshim_mx_api()

/* MXNet's engine::CallbackOnComplete: three pointers, copied by value */
typedef struct engine_cb {
    void (*fn)(void *engine, void *param, const void *error);
    void *engine;
    void *param;
} engine_cb_t;

typedef struct async_op {
    dshim_mxkv_t *kv;
    int key;
    int dtype;
    size_t n;
    int nvals, nouts;
    NDArrayHandle *vals; /* our own handles (shallow copies): Python may free its own */
    NDArrayHandle *outs;
    int parts_left;
    int failed;
    engine_cb_t cb;
    char *buf;           /* the sum sent and the answer, unless direct */
    int direct;          /* one array in, one out: sent from and answered into their own memory */
    char error[512];     /* why it failed (the first reason; under kv->async_mu) */
} async_op_t;

/* MXNet's CallbackOnComplete passes a const dmlc::Error*, and the threaded
 * engine's OnCompleteStatic copies it (std::make_exception_ptr(*error)) into
 * the operation's exception.  dmlc::Error is std::runtime_error with nothing
 * added, and the copy is MXNet's own dmlc::Error built by its copy
 * constructor, so a std::runtime_error constructed by the libstdc++ libmxnet
 * uses is one.  Room for it: libstdc++'s is a vtable pointer and a string. */
typedef union cxx_error {
    void *align;
    char bytes[64];
} cxx_error_t;

static int is_cpu(NDArrayHandle h)
{
    int dev_type = 0, dev_id = 0, stype = 0;
    if (MX()->MXNDArrayGetContext(h, &dev_type, &dev_id) != 0 || MX()->MXNDArrayGetStorageType(h, &stype) != 0) {
        return 0;
    }
    return stype == 0 && (dev_type == 1 || dev_type == 3 || dev_type == 5); /* cpu, cpu_pinned, cpu_shared */
}

static void op_free(async_op_t *op)
{
    for (int i = 0; i < op->nvals; i++) {
        MX()->MXNDArrayFree(op->vals[i]);
    }
    for (int i = 0; i < op->nouts; i++) {
        MX()->MXNDArrayFree(op->outs[i]);
    }
    free(op->vals);
    free(op->outs);
    free(op->buf);
    free(op);
}

/* op failed (op may be NULL): the first reason is the operation's, and the
 * kvstore's (the next call raises it too) */
static void set_error(dshim_mxkv_t *kv, async_op_t *op, const char *msg)
{
    pthread_mutex_lock(&kv->async_mu);
    if (op != NULL && op->error[0] == '\0') {
        snprintf(op->error, sizeof(op->error), "%s", msg);
    }
    if (kv->async_error[0] == '\0') {
        snprintf(kv->async_error, sizeof(kv->async_error), "%s", msg);
    }
    pthread_mutex_unlock(&kv->async_mu);
}

/* every part answered (receiver thread) or failed: write the outputs, tell the engine */
static void finish(async_op_t *op)
{
    dshim_mxkv_t *kv = op->kv;
    size_t bytes = op->n * dshim_ps_dtype_size(op->dtype);
    int failed = __atomic_load_n(&op->failed, __ATOMIC_ACQUIRE);
    for (int i = 0; i < op->nouts && !failed && !op->direct; i++) {
        void *p = NULL;
        if (MX()->MXNDArrayGetData(op->outs[i], &p) != 0 || p == NULL) {
            set_error(kv, op, "dist kvstore: cannot write a pushpull's output inside MXNet's engine");
            failed = 1;
            break;
        }
        memcpy(p, op->buf, bytes);
    }
    engine_cb_t cb = op->cb;
    if (failed) {
        pthread_mutex_lock(&kv->async_mu);
        if (op->error[0] == '\0') {
            /* a part ended without a reason (its request was dropped) */
            snprintf(op->error, sizeof(op->error), "dist kvstore: the pushpull of key %d failed without an "
                     "answer from its servers", op->key);
        }
        if (kv->async_error[0] == '\0') {
            snprintf(kv->async_error, sizeof(kv->async_error), "%s", op->error);
        }
        pthread_mutex_unlock(&kv->async_mu);
        cxx_error_t e;
        MX()->runtime_error_ctor(&e, op->error);
        cb.fn(cb.engine, cb.param, &e);
        MX()->runtime_error_dtor(&e);
    } else {
        cb.fn(cb.engine, cb.param, NULL);
    }
    op_free(op);
    pthread_mutex_lock(&kv->async_mu);
    kv->async_inflight--;
    pthread_cond_broadcast(&kv->async_cond);
    pthread_mutex_unlock(&kv->async_mu);
}

static void part_done(void *arg, int ok)
{
    async_op_t *op = arg;
    if (!ok) {
        __atomic_store_n(&op->failed, 1, __ATOMIC_RELEASE);
        /* the job's failure names the peer; without one the part failed on
         * the sending thread, which sets the reason from its own error */
        const char *f = op->kv->node ? dshim_ps_failure(op->kv->node) : NULL;
        if (f != NULL) {
            set_error(op->kv, op, f);
        }
    }
    if (__atomic_sub_fetch(&op->parts_left, 1, __ATOMIC_ACQ_REL) == 0) {
        finish(op);
    }
}

static void *data_of(NDArrayHandle h)
{
    void *p = NULL;
    return MX()->MXNDArrayGetData(h, &p) == 0 ? p : NULL;
}

/* runs on an engine thread once the pushed arrays are ready */
static void engine_fn(void *rctx, void *on_complete, void *param)
{
    (void)rctx;
    async_op_t *op = param;
    dshim_mxkv_t *kv = op->kv;
    op->cb = *(engine_cb_t *)on_complete;
    size_t es = dshim_ps_dtype_size(op->dtype);
    int ok = 1;
    char *send = op->buf, *recv = op->buf;
    if (op->direct) {
        /* no copies (Gluon's Trainer: one gradient, one weight per call):
         * the engine keeps the gradient unwritten and the weight unread
         * until this operation completes, and a server answers a key (or a
         * piece of it) only after all of it arrived, so the memory may be
         * the same */
        send = data_of(op->vals[0]);
        recv = data_of(op->outs[0]);
        ok = send != NULL && recv != NULL;
    }
    for (int i = 0; i < op->nvals && ok && !op->direct; i++) {
        void *p = NULL;
        ok = MX()->MXNDArrayGetData(op->vals[i], &p) == 0 && p != NULL;
        if (ok && i == 0) {
            memcpy(op->buf, p, op->n * es);
        } else if (ok) {
            ok = dshim_ps_add(op->buf, p, op->n, op->dtype) == DSHIM_OK;
        }
    }
    int ns = kv->env.num_servers;
    dshim_ps_part_t parts[ns];
    int np = dshim_ps_layout(op->key, op->n, ns, kv->env.bigarray_bound, 0, parts);
    if (!ok) {
        op->failed = 1;
        set_error(kv, op, "dist kvstore: cannot read a pushed array inside MXNet's engine");
        np = 0;
    }
    op->parts_left = np + 1; /* +1: this function's own reference */
    /* a sum of float32 values on a server of another host (sync mode, no
     * optimizer there) goes in pieces: the answer to a large key streams back
     * while the rest of it is still going out (on a slow link that halves its
     * round trip; on this host the extra messages only cost) */
    const size_t piece = kv->env.piece_bytes;
    const int pieces = piece > 0 && !kv->is_async && !kv->compression && !kv->server_optimizer && op->dtype == 0;
    for (int i = 0; i < np; i++) {
        const size_t at = parts[i].offset * es;
        if (pieces && parts[i].count * es > piece &&
            (kv->env.piece_local || !dshim_ps_worker_server_is_local(kv->node, parts[i].server))) {
            /* part_done runs once in every case, also on an error */
            if (dshim_ps_worker_pushpull_pieces(kv->node, parts[i].server, op->key, op->dtype, send + at,
                                                parts[i].count * es, recv + at, piece, part_done, op) != DSHIM_OK) {
                set_error(kv, op, dshim_last_error());
            }
            continue;
        }
        if (dshim_ps_worker_push_cb(kv->node, parts[i].server, op->key, op->dtype, send + at, parts[i].count * es, 1,
                                    recv + at, parts[i].count * es, part_done, op) != DSHIM_OK) {
            set_error(kv, op, dshim_last_error()); /* part_done ran (with ok = 0) */
        }
    }
    part_done(op, 1);
}

int dshim_mxkv_async_drain(dshim_mxkv_t *kv)
{
    pthread_mutex_lock(&kv->async_mu);
    while (kv->async_inflight > 0) {
        pthread_cond_wait(&kv->async_cond, &kv->async_mu);
    }
    int failed = kv->async_error[0] != '\0';
    if (failed) {
        dshim_error_quiet(DSHIM_ERR_PEER, "%s", kv->async_error);
    }
    pthread_mutex_unlock(&kv->async_mu);
    return failed ? -1 : 0;
}

typedef struct slot {
    int key;
    int index;
} slot_t;

static int slot_cmp(const void *a, const void *b)
{
    const slot_t *x = a, *y = b;
    return x->key != y->key ? (x->key < y->key ? -1 : 1) : x->index - y->index;
}

/* one engine operation for one key: vals summed, answer into every out */
static int submit(dshim_mxkv_t *kv, int key, NDArrayHandle *vals, int nv, NDArrayHandle *outs, int no, int priority)
{
    int ndim = 0, dtype = 0;
    const int *shape = NULL;
    if (MX()->MXNDArrayGetShapeEx(vals[0], &ndim, &shape) != 0 || MX()->MXNDArrayGetDType(vals[0], &dtype) != 0) {
        dshim_error_set_raw(MX()->MXGetLastError());
        return -1;
    }
    size_t n = 1;
    for (int i = 0; i < ndim; i++) {
        n *= (size_t)(shape[i] > 0 ? shape[i] : 0);
    }
    if (dshim_mxkv_key(kv, key, n, dtype) == NULL) {
        return -1;
    }
    async_op_t *op = calloc(1, sizeof(*op));
    NDArrayHandle deps_c[nv], deps_m[no];
    void *ptr_m[no];
    int nc = 0, nm = 0;
    int out_dtype = -1;
    const int direct = nv == 1 && no == 1 && MX()->MXNDArrayGetDType(outs[0], &out_dtype) == 0 && out_dtype == dtype;
    if (op == NULL || (op->vals = calloc((size_t)nv, sizeof(NDArrayHandle))) == NULL ||
        (op->outs = calloc((size_t)no, sizeof(NDArrayHandle))) == NULL ||
        (!direct && (op->buf = malloc(n * dshim_ps_dtype_size(dtype) + 1)) == NULL)) {
        if (op != NULL) {
            free(op->vals);
            free(op->outs);
            free(op);
        }
        dshim_error(DSHIM_ERR_NOMEM, "dist kvstore: out of memory");
        return -1;
    }
    op->kv = kv;
    op->direct = direct;
    op->key = key;
    op->dtype = dtype;
    op->n = n;
    for (int i = 0; i < no; i++) {
        if (MX()->MXShallowCopyNDArray(outs[i], &op->outs[op->nouts]) != 0) {
            goto fail;
        }
        op->nouts++;
        /* the engine refuses a variable listed twice: outputs sharing memory count once */
        void *p = data_of(outs[i]);
        int dup = 0;
        for (int j = 0; j < nm; j++) {
            dup |= ptr_m[j] == p;
        }
        if (!dup) {
            ptr_m[nm] = p;
            deps_m[nm++] = op->outs[op->nouts - 1];
        }
    }
    for (int i = 0; i < nv; i++) {
        if (MX()->MXShallowCopyNDArray(vals[i], &op->vals[op->nvals]) != 0) {
            goto fail;
        }
        op->nvals++;
        void *p = data_of(vals[i]);
        int dup = 0;
        for (int j = 0; j < nm; j++) {
            dup |= ptr_m[j] == p;
        }
        for (int j = 0; j < nc; j++) {
            dup |= data_of(deps_c[j]) == p;
        }
        if (!dup) {
            deps_c[nc++] = op->vals[op->nvals - 1];
        }
    }
    static const int cpu_ctx[2] = {1, 0}; /* mxnet::Context{kCPU, 0} */
    pthread_mutex_lock(&kv->async_mu);
    kv->async_inflight++;
    pthread_mutex_unlock(&kv->async_mu);
    if (MX()->engine_push_async_nd(engine_fn, op, NULL, (void *)cpu_ctx, deps_c, nc, deps_m, nm, NULL, priority,
                                   "DshimPushPull", false) != 0) {
        pthread_mutex_lock(&kv->async_mu);
        kv->async_inflight--;
        pthread_mutex_unlock(&kv->async_mu);
        goto fail;
    }
    return 0;
fail:
    dshim_error_set_raw(MX()->MXGetLastError());
    op_free(op);
    return -1;
}

int dshim_mxkv_pushpull_async(dshim_mxkv_t *kv, uint32_t vnum, const int *vkeys, uint32_t onum, const int *okeys,
                              NDArrayHandle *vals, NDArrayHandle *outs, int priority)
{
    if (!dshim_config()->mxnet_async || MX()->engine_push_async_nd == NULL || MX()->runtime_error_ctor == NULL ||
        MX()->runtime_error_dtor == NULL || kv->compression) {
        return 1;
    }
    for (uint32_t i = 0; i < vnum; i++) {
        if (!is_cpu(vals[i])) {
            return 1;
        }
    }
    for (uint32_t i = 0; i < onum; i++) {
        if (!is_cpu(outs[i])) {
            return 1;
        }
    }
    if (kv->async_error[0] != '\0') {
        dshim_error_quiet(DSHIM_ERR_PEER, "%s", kv->async_error);
        return -1;
    }
    slot_t vs[vnum ? vnum : 1], os[onum ? onum : 1];
    for (uint32_t i = 0; i < vnum; i++) {
        vs[i].key = vkeys[i];
        vs[i].index = (int)i;
    }
    for (uint32_t i = 0; i < onum; i++) {
        os[i].key = okeys[i];
        os[i].index = (int)i;
    }
    qsort(vs, vnum, sizeof(slot_t), slot_cmp);
    qsort(os, onum, sizeof(slot_t), slot_cmp);
    uint32_t i = 0, j = 0;
    while (i < vnum) {
        uint32_t ie = i, je = j;
        while (ie < vnum && vs[ie].key == vs[i].key) {
            ie++;
        }
        while (je < onum && os[je].key == vs[i].key) {
            je++;
        }
        if (je == j) {
            dshim_error(DSHIM_ERR_INVALID, "pushpull: the push keys and the pull keys differ (key %d)", vs[i].key);
            return -1;
        }
        NDArrayHandle v[ie - i], o[je - j];
        for (uint32_t k = i; k < ie; k++) {
            v[k - i] = vals[vs[k].index];
        }
        for (uint32_t k = j; k < je; k++) {
            o[k - j] = outs[os[k].index];
        }
        if (submit(kv, vs[i].key, v, (int)(ie - i), o, (int)(je - j), priority) != 0) {
            return -1;
        }
        i = ie;
        j = je;
    }
    if (j != onum) {
        dshim_error(DSHIM_ERR_INVALID, "pushpull: the pull keys name keys that are not pushed");
        return -1;
    }
    return 0;
}

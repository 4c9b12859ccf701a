/* MXKVStoreRunServer for dshim's kvstores: a server keeps each key in an
 * NDArray that the Python optimizer (sent pickled by a worker, installed by
 * MXNet's controller through SetUpdaterEx) updates in place; the scheduler
 * runs dshim's scheduler.  Both return when the job ends, and MXNet's
 * kvstore_server.py then calls sys.exit(), as with ps-lite. */
#include <stdio.h>
#include <string.h>

#include "mxnet/kvstore.h"
#include "mxnet/profiler.h"
#include "status.h"

#define MX() dshim_mx_api()

static void *nd_alloc(void *ctx, size_t n, int dtype, void **cookie)
{
    (void)ctx;
    uint32_t shape[1] = {(uint32_t)(n ? n : 1)};
    NDArrayHandle h = NULL;
    void *data = NULL;
    if (MX()->MXNDArrayCreateEx(shape, 1, 1 /* cpu */, 0, 0, dtype, &h) != 0 || MX()->MXNDArrayGetData(h, &data) != 0) {
        dshim_error(DSHIM_ERR_NOMEM, "server: MXNet could not allocate %zu elements: %s", n, MX()->MXGetLastError());
        return NULL;
    }
    *cookie = h;
    return data;
}

static void nd_release(void *ctx, void *cookie)
{
    (void)ctx;
    MX()->MXNDArrayFree(cookie);
}

static void nd_wait(void *ctx, void *cookie, int write)
{
    (void)ctx;
    if (write) {
        MX()->MXNDArrayWaitToWrite(cookie);
    } else {
        MX()->MXNDArrayWaitToRead(cookie);
    }
}

static int nd_has_updater(void *ctx)
{
    return ((dshim_mxkv_t *)ctx)->updater != NULL;
}

/* A handle of its own for each array: MXNet's updater wrapper frees the
 * handles it is given (as MXNet passes `new NDArray` copies). */
static NDArrayHandle fresh_handle(NDArrayHandle h)
{
    int ndim = 0;
    const int *shape = NULL;
    NDArrayHandle out = NULL;
    if (MX()->MXNDArrayGetShapeEx(h, &ndim, &shape) != 0 || ndim != 1 ||
        MX()->MXNDArraySlice(h, 0, (uint32_t)shape[0], &out) != 0) {
        return NULL;
    }
    return out;
}

static int nd_update(void *ctx, int key, void *recv, void *stored)
{
    dshim_mxkv_t *kv = ctx;
    NDArrayHandle r = fresh_handle(recv), s = fresh_handle(stored);
    if (r == NULL || s == NULL) {
        return -1;
    }
    kv->updater(key, r, s, kv->updater_handle);
    return 0;
}

/* The updater with a row_sparse gradient (as ps-lite's server passes its
 * merged rows): the part's values seen as rows x unit, updated in place. */
static int nd_update_rows(void *ctx, int key, const int64_t *ids, size_t nrows, const void *vals, size_t rows,
                          size_t unit, int dtype, void *stored)
{
    dshim_mxkv_t *kv = ctx;
    uint32_t shape[2] = {(uint32_t)rows, (uint32_t)unit};
    int64_t dims[2] = {(int64_t)rows, (int64_t)unit};
    NDArrayHandle grad = dshim_mxkv_rows_array(ids, nrows, vals, 2, shape, dtype);
    NDArrayHandle weight = NULL;
    if (grad == NULL || MX()->MXNDArrayReshape64(stored, 2, dims, false, &weight) != 0) {
        fprintf(stderr, "[dshim-ps server %d] key %d: cannot build the row_sparse update: %s\n", kv->rank, key,
                grad == NULL ? dshim_last_error() : MX()->MXGetLastError());
        if (grad != NULL) {
            MX()->MXNDArrayFree(grad);
        }
        return -1;
    }
    kv->updater(key, grad, weight, kv->updater_handle); /* MXNet's wrapper frees both handles */
    return 0;
}

static int nd_controller(void *ctx, int head, const char *body)
{
    dshim_mxkv_t *kv = ctx;
    if (kv->controller == NULL) {
        return -1;
    }
    kv->controller(head, body, kv->controller_handle);
    return 0;
}

int dshim_MXKVStoreRunServer(KVStoreHandle h, MXKVStoreServerController *controller, void *controller_handle)
{
    if (!dshim_mxkv_is_ours(h)) {
        return MX()->MXKVStoreRunServer(h, controller, controller_handle);
    }
    dshim_mxkv_t *kv = h;
    if (kv->env.role == DSHIM_PS_WORKER) {
        dshim_error(DSHIM_ERR_INVALID, "MXKVStoreRunServer called on a worker (DMLC_ROLE is unset or worker)");
        return dshim_mxkv_fail();
    }
    kv->controller = controller;
    kv->controller_handle = controller_handle;
    if (kv->env.role == DSHIM_PS_SCHEDULER) {
        return dshim_ps_scheduler_run(&kv->env) == DSHIM_OK ? 0 : dshim_mxkv_fail();
    }
    if (dshim_ps_node_start(&kv->env, &kv->node) != DSHIM_OK) {
        return dshim_mxkv_fail();
    }
    kv->rank = dshim_ps_node_rank(kv->node);
    dshim_ps_server_ops_t ops = {
        .ctx = kv,
        .alloc = nd_alloc,
        .release = nd_release,
        .wait = nd_wait,
        .has_updater = nd_has_updater,
        .update = nd_update,
        .update_rows = nd_update_rows,
        .controller = nd_controller,
        .profiler = dshim_mxkv_server_profiler,
    };
    dshim_status_t st = dshim_ps_barrier(kv->node, DSHIM_PS_GROUP_ALL);
    if (st == DSHIM_OK) {
        st = dshim_ps_server_run(kv->node, &ops);
    }
    char msg[1024];
    snprintf(msg, sizeof(msg), "%s", dshim_last_error());
    /* no final barrier when the workers left without one (SetBarrierBeforeExit(0)) */
    dshim_ps_node_finish(kv->node, st != DSHIM_OK || dshim_ps_stop_requested(kv->node));
    kv->node = NULL;
    kv->finished = 1;
    if (st != DSHIM_OK) {
        dshim_error_set_raw(msg);
        return dshim_mxkv_fail();
    }
    return 0;
}

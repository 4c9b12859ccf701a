/* MXNet's KVStore C API (include/mxnet/c_api.h of 1.9.1) for 'dist' types:
 * the calls dshim's dlsym hands to MXNet's Python.  A handle that is not
 * dshim's (local, device, nccl, or DSHIM_MXNET=0) goes to MXNet's own. */
#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "mxnet/kvstore.h"
#include "ps_twobit.h"
#include "status.h"

#define MX() dshim_mx_api()

/* --- registry of dshim's handles ---------------------------------------- */
static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static dshim_mxkv_t *registry[16];
static int atexit_registered;

int dshim_mxkv_is_ours(KVStoreHandle h)
{
    int found = 0;
    pthread_mutex_lock(&reg_mu);
    for (size_t i = 0; i < sizeof(registry) / sizeof(registry[0]); i++) {
        found |= h != NULL && registry[i] == h;
    }
    pthread_mutex_unlock(&reg_mu);
    return found;
}

static int reg_add(dshim_mxkv_t *kv)
{
    int ok = -1;
    pthread_mutex_lock(&reg_mu);
    for (size_t i = 0; i < sizeof(registry) / sizeof(registry[0]) && ok != 0; i++) {
        if (registry[i] == NULL) {
            registry[i] = kv;
            ok = 0;
        }
    }
    pthread_mutex_unlock(&reg_mu);
    return ok;
}

static void reg_remove(dshim_mxkv_t *kv)
{
    pthread_mutex_lock(&reg_mu);
    for (size_t i = 0; i < sizeof(registry) / sizeof(registry[0]); i++) {
        if (registry[i] == kv) {
            registry[i] = NULL;
        }
    }
    pthread_mutex_unlock(&reg_mu);
}

int dshim_mxkv_fail(void)
{
    const dshim_mx_api_t *mx = MX();
    if (mx != NULL) {
        mx->set_last_error(dshim_last_error());
    }
    return -1;
}

/* --- keys --------------------------------------------------------------- */
int dshim_mxkv_str_key(dshim_mxkv_t *kv, const char *s, int create, int *key_p)
{
    for (size_t i = 0; i < kv->nstr; i++) {
        if (strcmp(kv->str_keys[i], s) == 0) {
            if (create) {
                dshim_error(DSHIM_ERR_INVALID, "duplicate init of key %s", s);
                return -1;
            }
            *key_p = (int)i;
            return 0;
        }
    }
    if (!create) {
        dshim_error(DSHIM_ERR_INVALID, "key %s doesn't exist. Did you init?", s);
        return -1;
    }
    if (kv->nstr == kv->cap_str) {
        size_t cap = kv->cap_str ? kv->cap_str * 2 : 64;
        char **p = realloc(kv->str_keys, cap * sizeof(char *));
        if (p == NULL) {
            dshim_error(DSHIM_ERR_NOMEM, "dist kvstore: out of memory");
            return -1;
        }
        kv->str_keys = p;
        kv->cap_str = cap;
    }
    kv->str_keys[kv->nstr] = strdup(s);
    *key_p = (int)kv->nstr++;
    return 0;
}

dshim_mxkv_key_t *dshim_mxkv_key(dshim_mxkv_t *kv, int key, size_t n, int dtype)
{
    for (size_t i = 0; i < kv->nkeys; i++) {
        if (kv->keys[i].key == key) {
            if (kv->keys[i].n != n || kv->keys[i].dtype != dtype) {
                dshim_error(DSHIM_ERR_INVALID, "The value size cannot be changed: key %d holds %zu elements of dtype "
                            "%d, this call has %zu of dtype %d", key, kv->keys[i].n, kv->keys[i].dtype, n, dtype);
                return NULL;
            }
            return &kv->keys[i];
        }
    }
    if (kv->nkeys == kv->cap_keys) {
        size_t cap = kv->cap_keys ? kv->cap_keys * 2 : 64;
        dshim_mxkv_key_t *p = realloc(kv->keys, cap * sizeof(*p));
        if (p == NULL) {
            dshim_error(DSHIM_ERR_NOMEM, "dist kvstore: out of memory");
            return NULL;
        }
        kv->keys = p;
        kv->cap_keys = cap;
    }
    dshim_mxkv_key_t *k = &kv->keys[kv->nkeys++];
    memset(k, 0, sizeof(*k));
    k->key = key;
    k->n = n;
    k->dtype = dtype;
    return k;
}

/* string keys -> int keys (create: init/broadcast assign new ones) */
static int *map_keys(dshim_mxkv_t *kv, uint32_t num, const char **skeys, int create)
{
    int *keys = malloc(sizeof(int) * (num ? num : 1));
    if (keys == NULL) {
        dshim_error(DSHIM_ERR_NOMEM, "dist kvstore: out of memory");
        return NULL;
    }
    for (uint32_t i = 0; i < num; i++) {
        if (dshim_mxkv_str_key(kv, skeys[i], create, &keys[i]) != 0) {
            free(keys);
            return NULL;
        }
    }
    return keys;
}

static int worker_only(dshim_mxkv_t *kv, const char *what)
{
    if (kv->node == NULL || kv->env.role != DSHIM_PS_WORKER) {
        dshim_error(DSHIM_ERR_INVALID, "%s is a worker call; this process is the %s", what,
                    dshim_ps_role_name(kv->env.role));
        return -1;
    }
    if (kv->finished) {
        dshim_error(DSHIM_ERR_INVALID, "%s on a kvstore that was already freed", what);
        return -1;
    }
    return 0;
}

/* --- create / free ------------------------------------------------------ */
static void worker_teardown(dshim_mxkv_t *kv)
{
    if (kv->finished || kv->node == NULL) {
        return;
    }
    kv->finished = 1;
    int failed = dshim_ps_failure(kv->node) != NULL;
    char own[600] = ""; /* this teardown's own error: a final barrier that timed out is a failed job */
    if (dshim_mxkv_async_drain(kv) != 0) {
        failed = 1;
    }
    if (!failed && dshim_ps_worker_wait_all(kv->node) != DSHIM_OK) {
        failed = 1;
        snprintf(own, sizeof(own), "%s", dshim_last_error());
    }
    /* from here on a server closing its side (after rank 0's kStopServer) is expected */
    dshim_ps_worker_quiesce(kv->node);
    if (!failed && kv->barrier_before_exit) {
        /* MXNet's ~KVStoreDist: barrier, rank 0 stops the servers, finalize */
        if (dshim_ps_barrier(kv->node, DSHIM_PS_GROUP_WORKERS) != DSHIM_OK ||
            (kv->rank == 0 && dshim_ps_worker_command(kv->node, DSHIM_PS_CMD_STOP_SERVER, "") != DSHIM_OK)) {
            failed = 1;
            snprintf(own, sizeof(own), "%s", dshim_last_error());
        }
    }
    if (!failed) {
        dshim_ps_worker_goodbye(kv->node);
    }
    const char *why = dshim_ps_failure(kv->node);
    char msg[600];
    snprintf(msg, sizeof(msg), "%s", why ? why : kv->async_error[0] ? kv->async_error : own);
    if (msg[0] != '\0') {
        dshim_ps_node_tell_failure(kv->node, msg); /* unless the scheduler told it */
    }
    dshim_ps_node_finish(kv->node, failed || !kv->barrier_before_exit);
    kv->node = NULL;
    if (msg[0] != '\0') {
        /* the job failed: this process must not end as if it had succeeded (a failed
         * pushpull whose outputs were never read, a final barrier that timed out) */
        fprintf(stderr, "[dshim-ps worker %d] ending with an error: %s\n", kv->rank, msg);
        fflush(stderr);
        _exit(1);
    }
}

static void teardown_at_exit(void)
{
    pthread_mutex_lock(&reg_mu);
    dshim_mxkv_t *live[16];
    memcpy(live, registry, sizeof(live));
    pthread_mutex_unlock(&reg_mu);
    for (size_t i = 0; i < 16; i++) {
        if (live[i] != NULL && live[i]->env.role == DSHIM_PS_WORKER) {
            worker_teardown(live[i]);
        }
    }
}

static int create_dist(const char *type, KVStoreHandle *out)
{
    dshim_mxkv_t *kv = calloc(1, sizeof(*kv));
    if (kv == NULL) {
        dshim_error(DSHIM_ERR_NOMEM, "dist kvstore: out of memory");
        return -1;
    }
    for (size_t i = 0; type[i] && i < sizeof(kv->type) - 1; i++) {
        kv->type[i] = (char)tolower((unsigned char)type[i]);
    }
    kv->is_async = strstr(kv->type, "_async") != NULL;
    kv->barrier_before_exit = 1;
    kv->threshold = DSHIM_TWOBIT_DEFAULT_THRESHOLD;
    pthread_mutex_init(&kv->async_mu, NULL);
    pthread_cond_init(&kv->async_cond, NULL);
    if (dshim_ps_env_load(&kv->env) != DSHIM_OK) {
        free(kv);
        return -1;
    }
    if (kv->env.role == DSHIM_PS_WORKER) {
        pthread_mutex_lock(&reg_mu);
        int busy = 0;
        for (size_t i = 0; i < 16; i++) {
            busy |= registry[i] != NULL && registry[i]->env.role == DSHIM_PS_WORKER && !registry[i]->finished;
        }
        pthread_mutex_unlock(&reg_mu);
        if (busy) {
            dshim_error(DSHIM_ERR_UNSUPPORTED, "dshim's parameter server carries one dist kvstore per worker process; "
                        "free the first (del kv) before creating another");
            free(kv);
            return -1;
        }
        /* MXNet: StartAsync, then a barrier over every node */
        if (dshim_ps_node_start(&kv->env, &kv->node) != DSHIM_OK) {
            free(kv);
            return -1;
        }
        kv->rank = dshim_ps_node_rank(kv->node);
        if (dshim_ps_worker_connect(kv->node) != DSHIM_OK ||
            dshim_ps_barrier(kv->node, DSHIM_PS_GROUP_ALL) != DSHIM_OK ||
            (!kv->is_async && kv->rank == 0 &&
             dshim_ps_worker_command(kv->node, DSHIM_PS_CMD_SYNC_MODE, "") != DSHIM_OK)) {
            char msg[1024];
            snprintf(msg, sizeof(msg), "%s", dshim_last_error());
            dshim_ps_node_finish(kv->node, 1);
            free(kv);
            dshim_error_set_raw(msg);
            return -1;
        }
    }
    if (reg_add(kv) != 0) {
        dshim_error(DSHIM_ERR_UNSUPPORTED, "too many dist kvstores in one process");
        if (kv->node != NULL) {
            dshim_ps_node_finish(kv->node, 1);
        }
        free(kv);
        return -1;
    }
    pthread_mutex_lock(&reg_mu);
    if (!atexit_registered && kv->env.role == DSHIM_PS_WORKER) {
        /* a worker whose kvstore Python never freed still ends cleanly */
        atexit(teardown_at_exit);
        atexit_registered = 1;
    }
    pthread_mutex_unlock(&reg_mu);
    *out = kv;
    return 0;
}

int dshim_MXKVStoreCreate(const char *type, KVStoreHandle *out)
{
    if (type == NULL || strstr(type, "dist") == NULL || !dshim_config()->mxnet_takeover) {
        return MX()->MXKVStoreCreate(type, out);
    }
    return create_dist(type, out) == 0 ? 0 : dshim_mxkv_fail();
}

int dshim_MXKVStoreFree(KVStoreHandle h)
{
    if (!dshim_mxkv_is_ours(h)) {
        return MX()->MXKVStoreFree(h);
    }
    dshim_mxkv_t *kv = h;
    if (kv->env.role == DSHIM_PS_WORKER) {
        worker_teardown(kv);
    }
    reg_remove(kv);
    for (size_t i = 0; i < kv->nstr; i++) {
        free(kv->str_keys[i]);
    }
    for (size_t i = 0; i < kv->nkeys; i++) {
        free(kv->keys[i].residual);
    }
    free(kv->str_keys);
    free(kv->keys);
    pthread_mutex_destroy(&kv->async_mu);
    pthread_cond_destroy(&kv->async_cond);
    free(kv);
    return 0;
}

/* --- data calls --------------------------------------------------------- */
int dshim_MXKVStoreInit(KVStoreHandle h, uint32_t num, const int *keys, NDArrayHandle *vals)
{
    if (!dshim_mxkv_is_ours(h)) {
        return MX()->MXKVStoreInit(h, num, keys, vals);
    }
    if (worker_only(h, "init") != 0 || dshim_mxkv_init(h, num, keys, vals) != 0) {
        return dshim_mxkv_fail();
    }
    return 0;
}

int dshim_MXKVStoreInitEx(KVStoreHandle h, uint32_t num, const char **skeys, NDArrayHandle *vals)
{
    if (!dshim_mxkv_is_ours(h)) {
        return MX()->MXKVStoreInitEx(h, num, skeys, vals);
    }
    if (worker_only(h, "init") != 0) {
        return dshim_mxkv_fail();
    }
    int *keys = map_keys(h, num, skeys, 1);
    int rc = keys != NULL ? dshim_mxkv_init(h, num, keys, vals) : -1;
    free(keys);
    return rc == 0 ? 0 : dshim_mxkv_fail();
}

int dshim_MXKVStorePush(KVStoreHandle h, uint32_t num, const int *keys, NDArrayHandle *vals, int priority)
{
    if (!dshim_mxkv_is_ours(h)) {
        return MX()->MXKVStorePush(h, num, keys, vals, priority);
    }
    if (worker_only(h, "push") != 0 || dshim_mxkv_push(h, num, keys, vals) != 0) {
        return dshim_mxkv_fail();
    }
    return 0;
}

int dshim_MXKVStorePushEx(KVStoreHandle h, uint32_t num, const char **skeys, NDArrayHandle *vals, int priority)
{
    if (!dshim_mxkv_is_ours(h)) {
        return MX()->MXKVStorePushEx(h, num, skeys, vals, priority);
    }
    if (worker_only(h, "push") != 0) {
        return dshim_mxkv_fail();
    }
    int *keys = map_keys(h, num, skeys, 0);
    int rc = keys != NULL ? dshim_mxkv_push(h, num, keys, vals) : -1;
    free(keys);
    return rc == 0 ? 0 : dshim_mxkv_fail();
}

int dshim_MXKVStorePullWithSparse(KVStoreHandle h, uint32_t num, const int *keys, NDArrayHandle *vals, int priority,
                                  bool ignore_sparse)
{
    if (!dshim_mxkv_is_ours(h)) {
        return MX()->MXKVStorePullWithSparse(h, num, keys, vals, priority, ignore_sparse);
    }
    if (worker_only(h, "pull") != 0 || dshim_mxkv_pull(h, num, keys, vals, ignore_sparse) != 0) {
        return dshim_mxkv_fail();
    }
    return 0;
}

int dshim_MXKVStorePullWithSparseEx(KVStoreHandle h, uint32_t num, const char **skeys, NDArrayHandle *vals,
                                    int priority, bool ignore_sparse)
{
    if (!dshim_mxkv_is_ours(h)) {
        return MX()->MXKVStorePullWithSparseEx(h, num, skeys, vals, priority, ignore_sparse);
    }
    if (worker_only(h, "pull") != 0) {
        return dshim_mxkv_fail();
    }
    int *keys = map_keys(h, num, skeys, 0);
    int rc = keys != NULL ? dshim_mxkv_pull(h, num, keys, vals, ignore_sparse) : -1;
    free(keys);
    return rc == 0 ? 0 : dshim_mxkv_fail();
}

int dshim_MXKVStorePull(KVStoreHandle h, uint32_t num, const int *keys, NDArrayHandle *vals, int priority)
{
    if (!dshim_mxkv_is_ours(h)) {
        return MX()->MXKVStorePull(h, num, keys, vals, priority);
    }
    return dshim_MXKVStorePullWithSparse(h, num, keys, vals, priority, true);
}

int dshim_MXKVStorePullEx(KVStoreHandle h, uint32_t num, const char **keys, NDArrayHandle *vals, int priority)
{
    if (!dshim_mxkv_is_ours(h)) {
        return MX()->MXKVStorePullEx(h, num, keys, vals, priority);
    }
    return dshim_MXKVStorePullWithSparseEx(h, num, keys, vals, priority, true);
}

int dshim_MXKVStorePullRowSparse(KVStoreHandle h, uint32_t num, const int *keys, NDArrayHandle *vals,
                                 const NDArrayHandle *row_ids, int priority)
{
    if (!dshim_mxkv_is_ours(h)) {
        return MX()->MXKVStorePullRowSparse(h, num, keys, vals, row_ids, priority);
    }
    if (worker_only(h, "row_sparse_pull") != 0 || dshim_mxkv_row_sparse_pull(h, num, keys, vals, row_ids) != 0) {
        return dshim_mxkv_fail();
    }
    return 0;
}

int dshim_MXKVStorePullRowSparseEx(KVStoreHandle h, uint32_t num, const char **keys, NDArrayHandle *vals,
                                   const NDArrayHandle *row_ids, int priority)
{
    if (!dshim_mxkv_is_ours(h)) {
        return MX()->MXKVStorePullRowSparseEx(h, num, keys, vals, row_ids, priority);
    }
    if (worker_only(h, "row_sparse_pull") != 0) {
        return dshim_mxkv_fail();
    }
    int *ikeys = map_keys(h, num, keys, 0);
    int rc = ikeys != NULL ? dshim_mxkv_row_sparse_pull(h, num, ikeys, vals, row_ids) : -1;
    free(ikeys);
    return rc == 0 ? 0 : dshim_mxkv_fail();
}

int dshim_MXKVStoreBroadcast(KVStoreHandle h, uint32_t vnum, const int *vkeys, uint32_t onum, const int *okeys,
                             NDArrayHandle *vals, NDArrayHandle *outs, int priority)
{
    if (!dshim_mxkv_is_ours(h)) {
        return MX()->MXKVStoreBroadcast(h, vnum, vkeys, onum, okeys, vals, outs, priority);
    }
    /* MXNet: Init, then Pull */
    if (worker_only(h, "broadcast") != 0 || dshim_mxkv_init(h, vnum, vkeys, vals) != 0 ||
        dshim_mxkv_pull(h, onum, okeys, outs, 1) != 0) {
        return dshim_mxkv_fail();
    }
    return 0;
}

int dshim_MXKVStoreBroadcastEx(KVStoreHandle h, uint32_t vnum, const char **svkeys, uint32_t onum,
                               const char **sokeys, NDArrayHandle *vals, NDArrayHandle *outs, int priority)
{
    if (!dshim_mxkv_is_ours(h)) {
        return MX()->MXKVStoreBroadcastEx(h, vnum, svkeys, onum, sokeys, vals, outs, priority);
    }
    if (worker_only(h, "broadcast") != 0) {
        return dshim_mxkv_fail();
    }
    int *vkeys = map_keys(h, vnum, svkeys, 1);
    int *okeys = vkeys != NULL ? map_keys(h, onum, sokeys, 0) : NULL;
    int rc = okeys != NULL && dshim_mxkv_init(h, vnum, vkeys, vals) == 0 &&
                     dshim_mxkv_pull(h, onum, okeys, outs, 1) == 0
                 ? 0
                 : -1;
    free(vkeys);
    free(okeys);
    return rc == 0 ? 0 : dshim_mxkv_fail();
}

int dshim_MXKVStorePushPull(KVStoreHandle h, uint32_t vnum, const int *vkeys, uint32_t onum, const int *okeys,
                            NDArrayHandle *vals, NDArrayHandle *outs, int priority)
{
    if (!dshim_mxkv_is_ours(h)) {
        return MX()->MXKVStorePushPull(h, vnum, vkeys, onum, okeys, vals, outs, priority);
    }
    if (worker_only(h, "pushpull") != 0 || dshim_mxkv_pushpull(h, vnum, vkeys, onum, okeys, vals, outs, priority) != 0) {
        return dshim_mxkv_fail();
    }
    return 0;
}

int dshim_MXKVStorePushPullEx(KVStoreHandle h, uint32_t vnum, const char **svkeys, uint32_t onum,
                              const char **sokeys, NDArrayHandle *vals, NDArrayHandle *outs, int priority)
{
    if (!dshim_mxkv_is_ours(h)) {
        return MX()->MXKVStorePushPullEx(h, vnum, svkeys, onum, sokeys, vals, outs, priority);
    }
    if (worker_only(h, "pushpull") != 0) {
        return dshim_mxkv_fail();
    }
    int *vkeys = map_keys(h, vnum, svkeys, 0);
    int *okeys = vkeys != NULL ? map_keys(h, onum, sokeys, 0) : NULL;
    int rc = okeys != NULL ? dshim_mxkv_pushpull(h, vnum, vkeys, onum, okeys, vals, outs, priority) : -1;
    free(vkeys);
    free(okeys);
    return rc == 0 ? 0 : dshim_mxkv_fail();
}

/* --- configuration and commands ----------------------------------------- */
int dshim_MXKVStoreSetGradientCompression(KVStoreHandle h, uint32_t num, const char **keys, const char **vals)
{
    if (!dshim_mxkv_is_ours(h)) {
        return MX()->MXKVStoreSetGradientCompression(h, num, keys, vals);
    }
    dshim_mxkv_t *kv = h;
    float threshold;
    int enabled;
    if (dshim_twobit_parse(num, (const char *const *)keys, (const char *const *)vals, &threshold, &enabled) != 0) {
        return dshim_mxkv_fail();
    }
    kv->compression = enabled;
    kv->threshold = threshold;
    if (kv->env.role == DSHIM_PS_WORKER && kv->rank == 0 && kv->node != NULL) {
        /* worker -> server only: the servers learn the threshold to dequantize */
        char body[DSHIM_TWOBIT_PARAMS_MAX];
        if (dshim_twobit_encode_params(enabled, threshold, body, sizeof(body)) < 0 ||
            dshim_ps_worker_command(kv->node, DSHIM_PS_CMD_GRADIENT_COMPRESSION, body) != DSHIM_OK) {
            return dshim_mxkv_fail();
        }
    }
    return 0;
}

int dshim_MXKVStoreSetUpdater(KVStoreHandle h, MXKVStoreUpdater *updater, void *handle)
{
    if (!dshim_mxkv_is_ours(h)) {
        return MX()->MXKVStoreSetUpdater(h, updater, handle);
    }
    dshim_mxkv_t *kv = h;
    kv->updater = updater;
    kv->updater_handle = handle;
    return 0;
}

int dshim_MXKVStoreSetUpdaterEx(KVStoreHandle h, MXKVStoreUpdater *updater, MXKVStoreStrUpdater *str_updater,
                                void *handle)
{
    if (!dshim_mxkv_is_ours(h)) {
        return MX()->MXKVStoreSetUpdaterEx(h, updater, str_updater, handle);
    }
    dshim_mxkv_t *kv = h;
    kv->updater = updater;
    kv->str_updater = str_updater;
    kv->updater_handle = handle;
    return 0;
}

int dshim_MXKVStoreGetType(KVStoreHandle h, const char **type)
{
    if (!dshim_mxkv_is_ours(h)) {
        return MX()->MXKVStoreGetType(h, type);
    }
    *type = ((dshim_mxkv_t *)h)->type;
    return 0;
}

int dshim_MXKVStoreGetRank(KVStoreHandle h, int *ret)
{
    if (!dshim_mxkv_is_ours(h)) {
        return MX()->MXKVStoreGetRank(h, ret);
    }
    *ret = ((dshim_mxkv_t *)h)->rank;
    return 0;
}

int dshim_MXKVStoreGetGroupSize(KVStoreHandle h, int *ret)
{
    if (!dshim_mxkv_is_ours(h)) {
        return MX()->MXKVStoreGetGroupSize(h, ret);
    }
    *ret = ((dshim_mxkv_t *)h)->env.num_workers; /* ps::NumWorkers() on every role */
    return 0;
}

int dshim_MXKVStoreBarrier(KVStoreHandle h)
{
    if (!dshim_mxkv_is_ours(h)) {
        return MX()->MXKVStoreBarrier(h);
    }
    dshim_mxkv_t *kv = h;
    if (worker_only(kv, "barrier") != 0 || dshim_mxkv_async_drain(kv) != 0 ||
        dshim_ps_worker_wait_all(kv->node) != DSHIM_OK ||
        dshim_ps_barrier(kv->node, DSHIM_PS_GROUP_WORKERS) != DSHIM_OK) {
        return dshim_mxkv_fail();
    }
    return 0;
}

int dshim_MXKVStoreSetBarrierBeforeExit(KVStoreHandle h, const int barrier_before_exit)
{
    if (!dshim_mxkv_is_ours(h)) {
        return MX()->MXKVStoreSetBarrierBeforeExit(h, barrier_before_exit);
    }
    ((dshim_mxkv_t *)h)->barrier_before_exit = barrier_before_exit;
    return 0;
}

int dshim_MXKVStoreSendCommmandToServers(KVStoreHandle h, int cmd_id, const char *cmd_body)
{
    if (!dshim_mxkv_is_ours(h)) {
        return MX()->MXKVStoreSendCommmandToServers(h, cmd_id, cmd_body);
    }
    dshim_mxkv_t *kv = h;
    if (worker_only(kv, "send_command_to_servers") != 0 || dshim_mxkv_async_drain(kv) != 0 ||
        dshim_ps_worker_command(kv->node, cmd_id, cmd_body) != DSHIM_OK) {
        return dshim_mxkv_fail();
    }
    if (cmd_id == DSHIM_PS_CMD_CONTROLLER) {
        kv->server_optimizer = 1; /* pushes in pieces would gain nothing: the update needs the whole key */
    }
    return 0;
}

int dshim_MXKVStoreGetNumDeadNode(KVStoreHandle h, const int node_id, int *number, const int timeout_sec)
{
    if (!dshim_mxkv_is_ours(h)) {
        return MX()->MXKVStoreGetNumDeadNode(h, node_id, number, timeout_sec);
    }
    dshim_mxkv_t *kv = h;
    /* deaths are announced at once, so the timeout has nothing to wait for */
    int group = node_id < 8 ? (node_id & DSHIM_PS_GROUP_ALL)
                            : (node_id % 2 == 0 ? DSHIM_PS_GROUP_SERVERS : DSHIM_PS_GROUP_WORKERS);
    (void)timeout_sec;
    *number = kv->node != NULL ? dshim_ps_num_dead(kv->node, group) : 0;
    return 0;
}

/* The data calls of a dist kvstore on a worker: init, push, pull, pushpull,
 * as MXNet 1.9.1's KVStoreDist does them (group by key, sum a key's values
 * from several devices, place / shard over servers, 2-bit compression). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mxnet/kvstore.h"
#include "ps_twobit.h"
#include "status.h"

typedef struct slot {
    int key;
    int index; /* position in the caller's arrays */
} slot_t;

static int slot_cmp(const void *a, const void *b)
{
    const slot_t *x = a, *y = b;
    if (x->key != y->key) {
        return x->key < y->key ? -1 : 1;
    }
    return x->index - y->index;
}

static slot_t *sorted_slots(uint32_t num, const int *keys)
{
    slot_t *s = malloc(sizeof(*s) * (num ? num : 1));
    if (s == NULL) {
        return NULL;
    }
    for (uint32_t i = 0; i < num; i++) {
        s[i].key = keys[i];
        s[i].index = (int)i;
    }
    qsort(s, num, sizeof(*s), slot_cmp);
    return s;
}

static int array_info(NDArrayHandle h, size_t *n_p, int *dtype_p)
{
    const dshim_mx_api_t *mx = dshim_mx_api();
    int stype = 0, ndim = 0, dtype = 0;
    const int *shape = NULL;
    if (mx->MXNDArrayGetStorageType(h, &stype) != 0 || mx->MXNDArrayGetShapeEx(h, &ndim, &shape) != 0 ||
        mx->MXNDArrayGetDType(h, &dtype) != 0) {
        dshim_error_set_raw(mx->MXGetLastError());
        return -1;
    }
    if (stype != 0) {
        dshim_error(DSHIM_ERR_UNSUPPORTED, "a %s array reached a dense call of a dist kvstore (pushpull, or a pull "
                    "into it): as in MXNet's, sparse arrays go through kv.push and kv.row_sparse_pull",
                    stype == DSHIM_MX_STYPE_CSR ? "csr" : "row_sparse");
        return -1;
    }
    size_t n = 1;
    for (int i = 0; i < ndim; i++) {
        n *= shape[i] < 0 ? 0 : (size_t)shape[i];
    }
    if (ndim < 0) {
        n = 0;
    }
    if (dshim_ps_dtype_size(dtype) == 0) {
        dshim_error(DSHIM_ERR_UNSUPPORTED, "MXNet dtype %d is not supported by dshim's parameter server", dtype);
        return -1;
    }
    *n_p = n;
    *dtype_p = dtype;
    return 0;
}

/* The values of one key: the sum of its arrays (several devices), on the CPU. */
static void *read_sum(const slot_t *s, int count, NDArrayHandle *vals, int merge, size_t *n_p, int *dtype_p)
{
    const dshim_mx_api_t *mx = dshim_mx_api();
    size_t n;
    int dtype;
    if (array_info(vals[s[0].index], &n, &dtype) != 0) {
        return NULL;
    }
    size_t es = dshim_ps_dtype_size(dtype);
    char *sum = malloc(n * es + 1);
    char *tmp = NULL;
    if (sum == NULL) {
        dshim_error(DSHIM_ERR_NOMEM, "dist kvstore: out of memory for %zu elements", n);
        return NULL;
    }
    if (mx->MXNDArraySyncCopyToCPU(vals[s[0].index], sum, n) != 0) {
        dshim_error_set_raw(mx->MXGetLastError());
        free(sum);
        return NULL;
    }
    for (int i = 1; merge && i < count; i++) {
        size_t n2;
        int dt2;
        if (array_info(vals[s[i].index], &n2, &dt2) != 0) {
            goto fail;
        }
        if (n2 != n || dt2 != dtype) {
            dshim_error(DSHIM_ERR_INVALID, "key %d: the arrays of one key differ in size or dtype", s[0].key);
            goto fail;
        }
        if (tmp == NULL && (tmp = malloc(n * es + 1)) == NULL) {
            dshim_error(DSHIM_ERR_NOMEM, "dist kvstore: out of memory");
            goto fail;
        }
        if (mx->MXNDArraySyncCopyToCPU(vals[s[i].index], tmp, n) != 0) {
            dshim_error_set_raw(mx->MXGetLastError());
            goto fail;
        }
        if (dshim_ps_add(sum, tmp, n, dtype) != DSHIM_OK) {
            goto fail;
        }
    }
    free(tmp);
    *n_p = n;
    *dtype_p = dtype;
    return sum;
fail:
    free(tmp);
    free(sum);
    return NULL;
}

static int count_same(const slot_t *s, uint32_t i, uint32_t num)
{
    uint32_t j = i;
    while (j < num && s[j].key == s[i].key) {
        j++;
    }
    return (int)(j - i);
}

/* Sends one key's value to its servers.  active: a real push (2-bit applies);
 * not active: the init push (plain values, in the compressed layout when
 * compression is on, as MXNet).  result: with want_pull, where the answer goes. */
static int push_key(dshim_mxkv_t *kv, int key, const void *buf, size_t n, int dtype, int active, void *result)
{
    dshim_mxkv_key_t *k = dshim_mxkv_key(kv, key, n, dtype);
    if (k == NULL) {
        return -1;
    }
    size_t es = dshim_ps_dtype_size(dtype);
    int ns = kv->env.num_servers;
    dshim_ps_part_t parts[ns];
    int np = dshim_ps_layout(key, n, ns, kv->env.bigarray_bound, kv->compression, parts);
    uint32_t *words = NULL;
    if (kv->compression && active) {
        if (dtype != 0) {
            dshim_error(DSHIM_ERR_UNSUPPORTED, "Gradient compression is only supported for float32 type of "
                        "parameters (key %d has MXNet dtype %d)", key, dtype);
            return -1;
        }
        if (k->residual == NULL && (k->residual = calloc(n ? n : 1, sizeof(float))) == NULL) {
            dshim_error(DSHIM_ERR_NOMEM, "dist kvstore: out of memory");
            return -1;
        }
        words = malloc(dshim_twobit_words(n) * 4 + 4);
        if (words == NULL) {
            dshim_error(DSHIM_ERR_NOMEM, "dist kvstore: out of memory");
            return -1;
        }
        dshim_twobit_quantize(buf, k->residual, n, kv->threshold, words);
    }
    int rc = 0;
    for (int i = 0; i < np && rc == 0; i++) {
        const dshim_ps_part_t *p = &parts[i];
        dshim_status_t st;
        if (words != NULL) {
            st = dshim_ps_worker_push(kv->node, p->server, key, dtype, words + p->woffset, p->wcount * 4, p->count, 1,
                                      0, NULL, 0, NULL);
        } else {
            st = dshim_ps_worker_push(kv->node, p->server, key, dtype, (const char *)buf + p->offset * es,
                                      p->count * es, p->count, 0, result != NULL,
                                      result ? (char *)result + p->offset * es : NULL, p->count * es, NULL);
        }
        rc = st == DSHIM_OK ? 0 : -1;
    }
    free(words);
    return rc;
}

static int pull_key(dshim_mxkv_t *kv, int key, void *out, size_t n, int dtype)
{
    size_t es = dshim_ps_dtype_size(dtype);
    int ns = kv->env.num_servers;
    dshim_ps_part_t parts[ns];
    dshim_mxkv_key_t *k = dshim_mxkv_key(kv, key, n, dtype);
    if (k == NULL) {
        return -1;
    }
    int np = dshim_mxkv_parts(kv, k, parts); /* a row_sparse key is placed by rows */
    for (int i = 0; i < np; i++) {
        if (dshim_ps_worker_pull(kv->node, parts[i].server, key, dtype, (char *)out + parts[i].offset * es,
                                 parts[i].count * es, NULL) != DSHIM_OK) {
            return -1;
        }
    }
    return 0;
}

static int write_all(const slot_t *s, int count, NDArrayHandle *outs, const void *buf, size_t n, int dtype)
{
    const dshim_mx_api_t *mx = dshim_mx_api();
    for (int i = 0; i < count; i++) {
        size_t n2;
        int dt2;
        if (array_info(outs[s[i].index], &n2, &dt2) != 0) {
            return -1;
        }
        if (n2 != n || dt2 != dtype) {
            dshim_error(DSHIM_ERR_INVALID, "key %d: output array of %zu elements (dtype %d) for a value of %zu "
                        "elements (dtype %d)", s[i].key, n2, dt2, n, dtype);
            return -1;
        }
        if (mx->MXNDArraySyncCopyFromCPU(outs[s[i].index], buf, n) != 0) {
            dshim_error_set_raw(mx->MXGetLastError());
            return -1;
        }
    }
    return 0;
}

/* MXNet's CheckUnique: no key twice in a row of an init */
static int check_unique(uint32_t num, const int *keys)
{
    for (uint32_t i = 1; i < num; i++) {
        if (keys[i] == keys[i - 1]) {
            dshim_error(DSHIM_ERR_INVALID, "kvstore init: key %d appears twice in one call", keys[i]);
            return -1;
        }
    }
    return 0;
}

static int pushes(dshim_mxkv_t *kv, uint32_t num, const int *keys, NDArrayHandle *vals, int active)
{
    slot_t *s = sorted_slots(num, keys);
    if (s == NULL) {
        dshim_error(DSHIM_ERR_NOMEM, "dist kvstore: out of memory");
        return -1;
    }
    int rc = 0;
    for (uint32_t i = 0; i < num && rc == 0;) {
        int c = count_same(s, i, num);
        int stype = dshim_mxkv_stype(vals[s[i].index]);
        if (stype == DSHIM_MX_STYPE_ROW_SPARSE) {
            NDArrayHandle arrs[c];
            for (int j = 0; j < c; j++) {
                arrs[j] = vals[s[i + (uint32_t)j].index];
            }
            rc = dshim_mxkv_push_rows(kv, s[i].key, arrs, c, !active);
        } else if (stype == DSHIM_MX_STYPE_CSR) {
            rc = dshim_mxkv_refuse_csr(active ? "kv.push" : "kv.init", s[i].key);
        } else if (stype < 0) {
            rc = -1;
        } else {
            size_t n;
            int dtype;
            void *buf = read_sum(&s[i], c, vals, active, &n, &dtype);
            rc = buf != NULL ? push_key(kv, s[i].key, buf, n, dtype, active, NULL) : -1;
            free(buf);
        }
        i += (uint32_t)c;
    }
    free(s);
    return rc;
}

int dshim_mxkv_init(dshim_mxkv_t *kv, uint32_t num, const int *keys, NDArrayHandle *vals)
{
    if (dshim_mxkv_async_drain(kv) != 0 || check_unique(num, keys) != 0) {
        return -1;
    }
    if (kv->rank == 0) {
        /* only rank 0 pushes the initial values (no merge), then all wait */
        dshim_ps_worker_mark_init(1); /* the flight recorder: "MXNet init key K", no round */
        int rc = pushes(kv, num, keys, vals, 0);
        dshim_ps_worker_mark_init(0);
        if (rc != 0 || dshim_ps_worker_wait_all(kv->node) != DSHIM_OK) {
            return -1;
        }
    } else {
        for (uint32_t i = 0; i < num; i++) {
            size_t n;
            int dtype;
            int stype = dshim_mxkv_stype(vals[i]);
            if (stype == DSHIM_MX_STYPE_ROW_SPARSE) {
                if (dshim_mxkv_note_rows(kv, keys[i], vals[i]) != 0) {
                    return -1;
                }
            } else if (stype == DSHIM_MX_STYPE_CSR) {
                return dshim_mxkv_refuse_csr("kv.init", keys[i]);
            } else if (stype < 0 || array_info(vals[i], &n, &dtype) != 0 ||
                       dshim_mxkv_key(kv, keys[i], n, dtype) == NULL) {
                return -1;
            }
        }
    }
    return dshim_ps_barrier(kv->node, DSHIM_PS_GROUP_WORKERS) == DSHIM_OK ? 0 : -1;
}

int dshim_mxkv_push(dshim_mxkv_t *kv, uint32_t num, const int *keys, NDArrayHandle *vals)
{
    if (dshim_mxkv_async_drain(kv) != 0) {
        return -1;
    }
    return pushes(kv, num, keys, vals, 1);
}

/* MXNet's GroupKVPairsPull with ignore_sparse: a row_sparse output is left as
 * it is, with MXNet's note once per key (here once per process). */
static int skip_sparse(dshim_mxkv_t *kv, NDArrayHandle out, int key, int *rc)
{
    static int noted;
    int stype = dshim_mxkv_stype(out);
    if (stype < 0) {
        *rc = -1;
        return 0;
    }
    if (stype == DSHIM_MX_STYPE_DEFAULT) {
        return 0;
    }
    if (!noted) {
        noted = 1;
        fprintf(stderr, "[dshim-ps worker %d] Warning: non-default weights detected during kvstore pull (key %d). "
                "This call has been ignored. Please make sure to use kv.row_sparse_pull() or module.prepare() with "
                "row_ids.\n", kv->rank, key);
    }
    return 1;
}

int dshim_mxkv_pull(dshim_mxkv_t *kv, uint32_t num, const int *keys, NDArrayHandle *vals, int ignore_sparse)
{
    if (!ignore_sparse) {
        dshim_error(DSHIM_ERR_UNSUPPORTED, "dist kvstore pull doesn't support ignore_sparse=False");
        return -1;
    }
    /* a pull sees this worker's earlier pushes applied: their answers first */
    if (dshim_mxkv_async_drain(kv) != 0 || dshim_ps_worker_wait_all(kv->node) != DSHIM_OK) {
        return -1;
    }
    slot_t *s = sorted_slots(num, keys);
    void **bufs = calloc(num ? num : 1, sizeof(void *));
    if (s == NULL || bufs == NULL) {
        free(s);
        free(bufs);
        dshim_error(DSHIM_ERR_NOMEM, "dist kvstore: out of memory");
        return -1;
    }
    int rc = 0;
    for (uint32_t i = 0; i < num && rc == 0;) {
        int c = count_same(s, i, num);
        size_t n;
        int dtype;
        if (skip_sparse(kv, vals[s[i].index], s[i].key, &rc)) {
            i += (uint32_t)c; /* MXNet ignores it (ignore_sparse) */
            continue;
        }
        rc = array_info(vals[s[i].index], &n, &dtype);
        if (rc == 0) {
            bufs[i] = malloc(n * dshim_ps_dtype_size(dtype) + 1);
            rc = bufs[i] != NULL ? pull_key(kv, s[i].key, bufs[i], n, dtype) : -1;
        }
        i += (uint32_t)c;
    }
    if (rc == 0) {
        rc = dshim_ps_worker_wait_all(kv->node) == DSHIM_OK ? 0 : -1;
    }
    for (uint32_t i = 0; i < num && rc == 0;) {
        int c = count_same(s, i, num);
        size_t n;
        int dtype;
        if (bufs[i] != NULL) {
            rc = array_info(vals[s[i].index], &n, &dtype);
            if (rc == 0) {
                rc = write_all(&s[i], c, vals, bufs[i], n, dtype);
            }
        }
        i += (uint32_t)c;
    }
    if (rc != 0) {
        dshim_ps_worker_drop(kv->node);
    }
    for (uint32_t i = 0; i < num; i++) {
        free(bufs[i]);
    }
    free(bufs);
    free(s);
    return rc;
}

int dshim_mxkv_pushpull(dshim_mxkv_t *kv, uint32_t vnum, const int *vkeys, uint32_t onum, const int *okeys,
                        NDArrayHandle *vals, NDArrayHandle *outs, int priority)
{
    if (kv->compression) {
        dshim_error(DSHIM_ERR_UNSUPPORTED, "Compression not supported with PushPull (as in MXNet 1.9.1): use "
                    "kv.push and kv.pull");
        return -1;
    }
    int queued = dshim_mxkv_pushpull_async(kv, vnum, vkeys, onum, okeys, vals, outs, priority);
    if (queued <= 0) {
        return queued; /* 0: running inside MXNet's engine; -1: error */
    }
    if (dshim_mxkv_async_drain(kv) != 0) {
        return -1;
    }
    slot_t *vs = sorted_slots(vnum, vkeys);
    slot_t *os = sorted_slots(onum, okeys);
    void **bufs = calloc(vnum ? vnum : 1, sizeof(void *));
    size_t *ns = calloc(vnum ? vnum : 1, sizeof(size_t));
    int *dts = calloc(vnum ? vnum : 1, sizeof(int));
    int rc = 0;
    if (vs == NULL || os == NULL || bufs == NULL || ns == NULL || dts == NULL) {
        dshim_error(DSHIM_ERR_NOMEM, "dist kvstore: out of memory");
        rc = -1;
    }
    /* send every key's push-and-pull first, then collect: the servers work on
     * all keys at once */
    uint32_t i = 0, j = 0;
    while (rc == 0 && i < vnum) {
        int c = count_same(vs, i, vnum);
        int co = j < onum ? count_same(os, j, onum) : 0;
        if (co == 0 || os[j].key != vs[i].key) {
            dshim_error(DSHIM_ERR_INVALID, "pushpull: the push keys and the pull keys differ (key %d)", vs[i].key);
            rc = -1;
            break;
        }
        bufs[i] = read_sum(&vs[i], c, vals, 1, &ns[i], &dts[i]);
        rc = bufs[i] != NULL ? push_key(kv, vs[i].key, bufs[i], ns[i], dts[i], 1, bufs[i]) : -1;
        i += (uint32_t)c;
        j += (uint32_t)co;
    }
    if (rc == 0 && j != onum) {
        dshim_error(DSHIM_ERR_INVALID, "pushpull: the pull keys name keys that are not pushed");
        rc = -1;
    }
    if (rc == 0) {
        rc = dshim_ps_worker_wait_all(kv->node) == DSHIM_OK ? 0 : -1;
    }
    for (i = 0, j = 0; rc == 0 && i < vnum;) {
        int c = count_same(vs, i, vnum);
        int co = count_same(os, j, onum);
        rc = write_all(&os[j], co, outs, bufs[i], ns[i], dts[i]);
        i += (uint32_t)c;
        j += (uint32_t)co;
    }
    if (rc != 0) {
        dshim_ps_worker_drop(kv->node);
    }
    if (vs != NULL && bufs != NULL) {
        for (i = 0; i < vnum; i++) {
            free(bufs[i]);
        }
    }
    free(bufs);
    free(ns);
    free(dts);
    free(vs);
    free(os);
    return rc;
}

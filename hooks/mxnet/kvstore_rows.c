/* row_sparse arrays on a dist kvstore, as MXNet 1.9.1's KVStoreDist does them
 * (PushRowSparse, PullRowSparse_, EncodeRowSparseKey): a key's rows are placed
 * whole (on one server, or sliced by rows over all of them when the key has at
 * least MXNET_KVSTORE_BIGARRAY_BOUND elements); a push sends only the rows the
 * gradient has; row_sparse_pull asks for the unique row ids and writes a
 * row_sparse array of those rows into the output.  csr arrays are refused, as
 * MXNet's own dist kvstore refuses them ("unknown storage type"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mxnet/kvstore.h"
#include "status.h"

#define MX() dshim_mx_api()
#define INT64_DTYPE 6

typedef struct rowset {
    int64_t *ids; /* ascending, unique */
    char *vals;   /* nnz rows of `unit` values */
    size_t nnz, rows, unit;
    int dtype;
    int ndim;
    uint32_t shape[8];
} rowset_t;

static void rowset_free(rowset_t *r)
{
    free(r->ids);
    free(r->vals);
    r->ids = NULL;
    r->vals = NULL;
}

static int mx_failed(void)
{
    dshim_error_set_raw(dshim_mx_api()->MXGetLastError());
    return -1;
}

int dshim_mxkv_stype(NDArrayHandle h)
{
    int stype = 0;
    if (MX()->MXNDArrayGetStorageType(h, &stype) != 0) {
        return mx_failed();
    }
    return stype;
}

/* dtype, rows = shape[0], unit = the product of the other dimensions */
static int array_shape(NDArrayHandle h, rowset_t *r)
{
    int ndim = 0;
    const int *shape = NULL;
    if (MX()->MXNDArrayGetShapeEx(h, &ndim, &shape) != 0 || MX()->MXNDArrayGetDType(h, &r->dtype) != 0) {
        return mx_failed();
    }
    if (ndim < 1 || ndim > 8) {
        dshim_error(DSHIM_ERR_UNSUPPORTED, "a row_sparse array of %d dimensions: dshim's parameter server carries "
                    "1 to 8", ndim);
        return -1;
    }
    if (dshim_ps_dtype_size(r->dtype) == 0) {
        dshim_error(DSHIM_ERR_UNSUPPORTED, "MXNet dtype %d is not supported by dshim's parameter server", r->dtype);
        return -1;
    }
    r->ndim = ndim;
    r->unit = 1;
    for (int i = 0; i < ndim; i++) {
        r->shape[i] = shape[i] < 0 ? 0 : (uint32_t)shape[i];
        if (i > 0) {
            r->unit *= r->shape[i];
        }
    }
    r->rows = r->shape[0];
    return 0;
}

/* n values of any MXNet dtype as int64 (MXNet casts row ids to int64 too) */
static int to_int64(const void *src, int dtype, size_t n, int64_t *dst)
{
    for (size_t i = 0; i < n; i++) {
        switch (dtype) {
        case 1: dst[i] = (int64_t)((const double *)src)[i]; break;
        case 3: dst[i] = ((const uint8_t *)src)[i]; break;
        case 4: dst[i] = ((const int32_t *)src)[i]; break;
        case 5: dst[i] = ((const int8_t *)src)[i]; break;
        case 6: dst[i] = ((const int64_t *)src)[i]; break;
        default: {
            float f;
            if (dshim_ps_to_float32(&f, (const char *)src + i * dshim_ps_dtype_size(dtype), 1, dtype) != DSHIM_OK) {
                return -1;
            }
            dst[i] = (int64_t)f;
        }
        }
    }
    return 0;
}

/* A dense array's n values as int64 (row ids in any dtype). */
static int read_ids(NDArrayHandle h, size_t n, int64_t *ids)
{
    int dtype = 0;
    if (MX()->MXNDArrayGetDType(h, &dtype) != 0) {
        return mx_failed();
    }
    size_t es = dshim_ps_dtype_size(dtype);
    void *raw = malloc(n * (es ? es : 1) + 1);
    if (raw == NULL) {
        dshim_error(DSHIM_ERR_NOMEM, "dist kvstore: out of memory for %zu row ids", n);
        return -1;
    }
    int rc = n == 0 ? 0 : MX()->MXNDArraySyncCopyToCPU(h, raw, n) != 0 ? mx_failed() : to_int64(raw, dtype, n, ids);
    free(raw);
    return rc;
}

static size_t array_size(NDArrayHandle h)
{
    int ndim = 0;
    const int *shape = NULL;
    if (MX()->MXNDArrayGetShapeEx(h, &ndim, &shape) != 0) {
        return (size_t)-1;
    }
    size_t n = 1;
    for (int i = 0; i < ndim; i++) {
        n *= shape[i] < 0 ? 0 : (size_t)shape[i];
    }
    return ndim < 1 ? 0 : n;
}

/* The rows a row_sparse array holds (its indices and data). */
static int read_rows(NDArrayHandle h, const char *call, int key, rowset_t *r)
{
    memset(r, 0, sizeof(*r));
    if (array_shape(h, r) != 0) {
        return -1;
    }
    NDArrayHandle idx = NULL, data = NULL;
    if (MX()->MXNDArrayGetAuxNDArray(h, 0, &idx) != 0) {
        return mx_failed();
    }
    size_t nnz = array_size(idx);
    size_t es = dshim_ps_dtype_size(r->dtype);
    r->ids = malloc((nnz ? nnz : 1) * sizeof(int64_t));
    r->vals = malloc(nnz * r->unit * es + 1);
    int rc = r->ids != NULL && r->vals != NULL && nnz != (size_t)-1 ? 0 : -1;
    if (rc != 0) {
        dshim_error(DSHIM_ERR_NOMEM, "dist kvstore: out of memory for the rows of key %d", key);
    }
    if (rc == 0) {
        rc = read_ids(idx, nnz, r->ids);
    }
    if (rc == 0 && nnz > 0) {
        rc = MX()->MXNDArrayGetDataNDArray(h, &data) != 0 || MX()->MXNDArraySyncCopyToCPU(data, r->vals,
                                                                                      nnz * r->unit) != 0
                 ? mx_failed()
                 : 0;
    }
    MX()->MXNDArrayFree(idx);
    if (data != NULL) {
        MX()->MXNDArrayFree(data);
    }
    for (size_t i = 0; rc == 0 && i < nnz; i++) {
        if (r->ids[i] < 0 || (size_t)r->ids[i] >= r->rows || (i > 0 && r->ids[i] <= r->ids[i - 1])) {
            dshim_error(DSHIM_ERR_INVALID, "%s: the row_sparse array of key %d has row ids that are not ascending "
                        "and within its %zu rows (row %lld at %zu): check it with .check_format()", call, key,
                        r->rows, (long long)r->ids[i], i);
            rc = -1;
        }
    }
    r->nnz = nnz;
    if (rc != 0) {
        rowset_free(r);
    }
    return rc;
}

/* a += b (same shape and dtype): the union of their rows, summed where both
 * have one (MXNet's row_sparse elemwise_add). */
static int add_rows(rowset_t *a, const rowset_t *b)
{
    size_t es = dshim_ps_dtype_size(a->dtype), row = a->unit * es;
    size_t cap = a->nnz + b->nnz;
    int64_t *ids = malloc((cap ? cap : 1) * sizeof(int64_t));
    char *vals = malloc(cap * row + 1);
    if (ids == NULL || vals == NULL) {
        free(ids);
        free(vals);
        dshim_error(DSHIM_ERR_NOMEM, "dist kvstore: out of memory");
        return -1;
    }
    size_t i = 0, j = 0, n = 0;
    while (i < a->nnz || j < b->nnz) {
        int from_a = j >= b->nnz || (i < a->nnz && a->ids[i] <= b->ids[j]);
        int both = i < a->nnz && j < b->nnz && a->ids[i] == b->ids[j];
        ids[n] = from_a ? a->ids[i] : b->ids[j];
        memcpy(vals + n * row, from_a ? a->vals + i * row : b->vals + j * row, row);
        if (both && dshim_ps_add(vals + n * row, b->vals + j * row, a->unit, a->dtype) != DSHIM_OK) {
            free(ids);
            free(vals);
            return -1;
        }
        i += from_a;
        j += !from_a || both;
        n++;
    }
    rowset_free(a);
    a->ids = ids;
    a->vals = vals;
    a->nnz = n;
    return 0;
}

static dshim_mxkv_key_t *rows_key(dshim_mxkv_t *kv, int key, const rowset_t *r, int init)
{
    dshim_mxkv_key_t *k = dshim_mxkv_key(kv, key, r->rows * r->unit, r->dtype);
    if (k != NULL && init) {
        k->rows = r->rows;
        k->unit = r->unit;
    }
    return k;
}

/* The placement of a key's rows: a key initialised dense is placed by
 * elements, which must then cut it at the same rows. */
static int row_parts(dshim_mxkv_t *kv, const dshim_mxkv_key_t *k, size_t rows, size_t unit, const char *call,
                     dshim_ps_part_t *parts)
{
    int ns = kv->env.num_servers;
    int np = dshim_ps_row_layout(k->key, rows, unit, ns, kv->env.bigarray_bound, parts);
    if (k->unit == 0 && np > 1) {
        dshim_ps_part_t dense[ns];
        dshim_ps_layout(k->key, k->n, ns, kv->env.bigarray_bound, kv->compression, dense);
        for (int i = 0; i < np; i++) {
            if (dense[i].offset != parts[i].offset * unit || dense[i].count != parts[i].count * unit) {
                dshim_error(DSHIM_ERR_UNSUPPORTED, "%s: key %d was initialised with a dense array of %zu elements, "
                            "which the servers split by elements, not by its %zu rows: initialise it with a "
                            "row_sparse array (kv.init(key, value.tostype('row_sparse')))", call, k->key, k->n, rows);
                return -1;
            }
        }
    }
    return np;
}

int dshim_mxkv_parts(dshim_mxkv_t *kv, const dshim_mxkv_key_t *k, dshim_ps_part_t *parts)
{
    int ns = kv->env.num_servers;
    if (k->unit == 0) {
        return dshim_ps_layout(k->key, k->n, ns, kv->env.bigarray_bound, kv->compression, parts);
    }
    int np = dshim_ps_row_layout(k->key, k->rows, k->unit, ns, kv->env.bigarray_bound, parts);
    for (int i = 0; i < np; i++) {
        parts[i].offset *= k->unit;
        parts[i].count *= k->unit;
    }
    return np;
}

/* MXNet 1.9.1 refuses row_sparse pushes (the init's too) once 2-bit is on */
static int rows_allowed(const dshim_mxkv_t *kv, const char *call, int key)
{
    if (kv->compression) {
        dshim_error(DSHIM_ERR_UNSUPPORTED, "%s: key %d is row_sparse: Gradient compression for row sparse storage "
                    "type is not supported (as in MXNet 1.9.1): push it dense or turn compression off", call, key);
        return -1;
    }
    return 0;
}

int dshim_mxkv_note_rows(dshim_mxkv_t *kv, int key, NDArrayHandle h)
{
    if (rows_allowed(kv, "kv.init", key) != 0) {
        return -1; /* on every worker, as on rank 0: none of them waits in the init's barrier */
    }
    rowset_t r;
    memset(&r, 0, sizeof(r));
    return array_shape(h, &r) == 0 && rows_key(kv, key, &r, 1) != NULL ? 0 : -1;
}

int dshim_mxkv_refuse_csr(const char *call, int key)
{
    dshim_error(DSHIM_ERR_UNSUPPORTED, "%s: key %d is a csr array, which a dist kvstore does not carry (MXNet's own "
                "refuses it too: \"unknown storage type\"): push it as row_sparse or dense", call, key);
    return -1;
}

int dshim_mxkv_push_rows(dshim_mxkv_t *kv, int key, NDArrayHandle *arrs, int count, int init)
{
    const char *call = init ? "kv.init" : "kv.push";
    if (rows_allowed(kv, call, key) != 0) {
        return -1;
    }
    rowset_t sum;
    if (read_rows(arrs[0], call, key, &sum) != 0) {
        return -1;
    }
    int rc = 0;
    for (int i = 1; !init && i < count && rc == 0; i++) {
        rowset_t more;
        int st = dshim_mxkv_stype(arrs[i]);
        if (st != DSHIM_MX_STYPE_ROW_SPARSE) {
            dshim_error(DSHIM_ERR_INVALID, "%s: the arrays of key %d mix row_sparse and other storage types", call,
                        key);
            rc = -1;
        } else if ((rc = read_rows(arrs[i], call, key, &more)) == 0) {
            if (more.rows != sum.rows || more.unit != sum.unit || more.dtype != sum.dtype) {
                dshim_error(DSHIM_ERR_INVALID, "key %d: the arrays of one key differ in shape or dtype", key);
                rc = -1;
            } else {
                rc = add_rows(&sum, &more);
            }
            rowset_free(&more);
        }
    }
    dshim_mxkv_key_t *k = rc == 0 ? rows_key(kv, key, &sum, init) : NULL;
    int ns = kv->env.num_servers;
    dshim_ps_part_t parts[ns];
    int np = k != NULL ? row_parts(kv, k, sum.rows, sum.unit, call, parts) : -1;
    const size_t row = sum.unit * dshim_ps_dtype_size(sum.dtype);
    size_t at = 0; /* the first row of the next part (ids ascend) */
    for (int i = 0; i < np && rc == 0; i++) {
        const dshim_ps_part_t *p = &parts[i];
        size_t end = at;
        while (end < sum.nnz && (size_t)sum.ids[end] < p->offset + p->count) {
            end++;
        }
        size_t nr = end - at, len = nr * (sizeof(int64_t) + row);
        char *msg = malloc(len + 1);
        if (msg == NULL) {
            dshim_error(DSHIM_ERR_NOMEM, "dist kvstore: out of memory");
            rc = -1;
            break;
        }
        for (size_t j = 0; j < nr; j++) {
            ((int64_t *)msg)[j] = sum.ids[at + j] - (int64_t)p->offset;
        }
        memcpy(msg + nr * sizeof(int64_t), sum.vals + at * row, nr * row);
        /* every part gets a push, also without rows: in sync mode each server
         * counts every worker's push */
        rc = dshim_ps_worker_push_rows(kv->node, p->server, key, sum.dtype, msg, len, p->count, sum.unit) == DSHIM_OK
                 ? 0
                 : -1;
        free(msg);
        at = end;
    }
    if (np < 0) {
        rc = -1;
    }
    rowset_free(&sum);
    return rc;
}

NDArrayHandle dshim_mxkv_rows_array(const int64_t *ids, size_t nnz, const void *vals, int ndim,
                                    const uint32_t *shape, int dtype)
{
    const dshim_mx_api_t *mx = MX();
    int aux_type = INT64_DTYPE;
    uint32_t aux_ndim = 1, aux_shape = (uint32_t)nnz;
    uint32_t dshape[8];
    NDArrayHandle out = NULL, data = NULL, idx = NULL;
    memcpy(dshape, shape, sizeof(uint32_t) * (size_t)ndim);
    dshape[0] = (uint32_t)nnz;
    uint32_t ishape[1] = {(uint32_t)nnz};
    /* as Python's row_sparse_array((data, indices)): allocated, then the data
     * and the indices copied in */
    int rc = mx->MXNDArrayCreateSparseEx(DSHIM_MX_STYPE_ROW_SPARSE, shape, (uint32_t)ndim, 1, 0, nnz == 0, dtype, 1,
                                         &aux_type, &aux_ndim, &aux_shape, &out);
    if (rc == 0 && nnz > 0) {
        rc = mx->MXNDArrayCreateEx(dshape, (uint32_t)ndim, 1, 0, 0, dtype, &data) != 0 ||
             mx->MXNDArraySyncCopyFromCPU(data, vals, array_size(data)) != 0 ||
             mx->MXNDArrayCreateEx(ishape, 1, 1, 0, 0, INT64_DTYPE, &idx) != 0 ||
             mx->MXNDArraySyncCopyFromCPU(idx, ids, nnz) != 0 || mx->MXNDArraySyncCopyFromNDArray(out, data, -1) != 0 ||
             mx->MXNDArraySyncCopyFromNDArray(out, idx, 0) != 0;
    }
    if (rc != 0) {
        mx_failed();
    }
    if (data != NULL) {
        mx->MXNDArrayFree(data);
    }
    if (idx != NULL) {
        mx->MXNDArrayFree(idx);
    }
    if (rc != 0 && out != NULL) {
        mx->MXNDArrayFree(out);
        out = NULL;
    }
    return out;
}

/* out <- src with MXNet's own copy (_copyto: a row_sparse output takes the
 * source's rows, as PullRowSparse's Broadcast does), never recorded by
 * autograd: a pull inside autograd.record() is no operation of the graph
 * (MXNet's own pull writes through its engine, unrecorded). */
static int copy_into(NDArrayHandle src, NDArrayHandle out)
{
    static void *copyto;
    if (copyto == NULL && MX()->NNGetOpHandle("_copyto", &copyto) != 0) {
        return mx_failed();
    }
    int nout = 1;
    NDArrayHandle outs[1] = {out};
    NDArrayHandle *outp = outs;
    NDArrayHandle ins[1] = {src};
    int recording = 0;
    if (MX()->MXAutogradSetIsRecording(0, &recording) != 0) {
        return mx_failed();
    }
    int rc = MX()->MXImperativeInvoke(copyto, 1, ins, &nout, &outp, 0, NULL, NULL) != 0 ? mx_failed() : 0;
    int ignored = 0;
    MX()->MXAutogradSetIsRecording(recording, &ignored);
    return rc;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* One (output, row ids) pair of a row_sparse_pull. */
static int pull_one(dshim_mxkv_t *kv, int key, NDArrayHandle out, NDArrayHandle row_ids)
{
    const char *call = "kv.row_sparse_pull";
    rowset_t r;
    memset(&r, 0, sizeof(r));
    int st = dshim_mxkv_stype(out);
    if (st < 0 || array_shape(out, &r) != 0) {
        return -1;
    }
    if (st != DSHIM_MX_STYPE_ROW_SPARSE) {
        dshim_error(DSHIM_ERR_INVALID, "%s: the output for key %d must be a row_sparse array (MXNet: expected "
                    "kRowSparseStorage, got storage type %d); use kv.pull for dense outputs", call, key, st);
        return -1;
    }
    /* the rows come in the key's dtype and MXNet's copy casts them into the
     * output's (ps-lite pulls into its buffer of the key's dtype, then copies) */
    for (size_t i = 0; i < kv->nkeys; i++) {
        if (kv->keys[i].key == key) {
            r.dtype = kv->keys[i].dtype;
        }
    }
    dshim_mxkv_key_t *k = dshim_mxkv_key(kv, key, r.rows * r.unit, r.dtype);
    if (k == NULL) {
        return -1;
    }
    size_t n = array_size(row_ids);
    if (n == (size_t)-1) {
        return mx_failed();
    }
    size_t es = dshim_ps_dtype_size(r.dtype), row = r.unit * es;
    r.ids = malloc((n ? n : 1) * sizeof(int64_t));
    if (r.ids == NULL || read_ids(row_ids, n, r.ids) != 0) {
        if (r.ids == NULL) {
            dshim_error(DSHIM_ERR_NOMEM, "dist kvstore: out of memory for %zu row ids", n);
        }
        rowset_free(&r);
        return -1;
    }
    /* MXNet's Unique: sorted, without duplicates */
    qsort(r.ids, n, sizeof(int64_t), cmp_i64);
    for (size_t i = 0; i < n; i++) {
        if (r.nnz == 0 || r.ids[i] != r.ids[r.nnz - 1]) {
            r.ids[r.nnz++] = r.ids[i];
        }
    }
    int rc = 0;
    if (r.nnz > 0 && (r.ids[0] < 0 || (size_t)r.ids[r.nnz - 1] >= r.rows)) {
        dshim_error(DSHIM_ERR_INVALID, "%s: row id %lld of key %d is outside its %zu rows", call,
                    (long long)(r.ids[0] < 0 ? r.ids[0] : r.ids[r.nnz - 1]), key, r.rows);
        rc = -1;
    }
    r.vals = rc == 0 ? malloc(r.nnz * row + 1) : NULL;
    if (rc == 0 && r.vals == NULL) {
        dshim_error(DSHIM_ERR_NOMEM, "dist kvstore: out of memory for %zu rows", r.nnz);
        rc = -1;
    }
    int ns = kv->env.num_servers;
    dshim_ps_part_t parts[ns];
    int np = rc == 0 ? row_parts(kv, k, r.rows, r.unit, call, parts) : -1;
    int64_t *rel = np > 0 ? malloc((r.nnz ? r.nnz : 1) * sizeof(int64_t)) : NULL;
    if (np < 0 || rel == NULL) {
        rc = -1;
    }
    size_t at = 0;
    for (int i = 0; rc == 0 && i < np; i++) {
        const dshim_ps_part_t *p = &parts[i];
        size_t end = at;
        while (end < r.nnz && (size_t)r.ids[end] < p->offset + p->count) {
            rel[end] = r.ids[end] - (int64_t)p->offset;
            end++;
        }
        if (end > at &&
            dshim_ps_worker_pull_rows(kv->node, p->server, key, r.dtype, rel + at, end - at, p->count, r.unit,
                                      r.vals + at * row, (end - at) * row) != DSHIM_OK) {
            rc = -1;
        }
        at = end;
    }
    if (rc == 0 && dshim_ps_worker_wait_all(kv->node) != DSHIM_OK) {
        rc = -1;
    }
    if (rc != 0) {
        dshim_ps_worker_drop(kv->node); /* r.vals is freed below */
    }
    NDArrayHandle got = rc == 0 ? dshim_mxkv_rows_array(r.ids, r.nnz, r.vals, r.ndim, r.shape, r.dtype) : NULL;
    if (rc == 0) {
        rc = got != NULL ? copy_into(got, out) : -1;
    }
    if (got != NULL) {
        MX()->MXNDArrayFree(got); /* the copy, queued in MXNet's engine, holds its own reference */
    }
    free(rel);
    rowset_free(&r);
    return rc;
}

int dshim_mxkv_row_sparse_pull(dshim_mxkv_t *kv, uint32_t num, const int *keys, NDArrayHandle *outs,
                               const NDArrayHandle *row_ids)
{
    /* a pull sees this worker's earlier pushes applied: their answers first */
    if (dshim_mxkv_async_drain(kv) != 0 || dshim_ps_worker_wait_all(kv->node) != DSHIM_OK) {
        return -1;
    }
    /* each (output, row ids) pair on its own: MXNet 1.9.1's dist kvstore
     * refuses several pairs of one key ("RowSparsePull with multiple values is
     * not supported yet"); local kvstores take them, and so does dshim */
    for (uint32_t i = 0; i < num; i++) {
        if (pull_one(kv, keys[i], outs[i], row_ids[i]) != 0) {
            return -1;
        }
    }
    return 0;
}

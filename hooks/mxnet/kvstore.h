/* dshim's MXNet kvstore object (a KVStoreHandle dshim hands to MXNet's Python
 * for a 'dist' type) and helpers shared by hooks/mxnet/kvstore*.c. */
#ifndef DSHIM_MX_KVSTORE_H
#define DSHIM_MX_KVSTORE_H

#include <pthread.h>
#include <stddef.h>

#include "mxnet/mx_api.h"
#include "ps.h"

typedef struct dshim_mxkv_key {
    int key;
    size_t n;
    int dtype;
    float *residual; /* 2-bit error feedback, n floats */
    size_t rows, unit; /* initialised as row_sparse: rows x unit, placed by rows (unit 0: dense) */
} dshim_mxkv_key_t;

typedef struct dshim_mxkv {
    char type[64];
    int is_async;
    dshim_ps_env_t env;
    dshim_ps_node_t *node; /* workers and servers */
    int rank;
    int barrier_before_exit;
    int finished;
    int compression;
    int server_optimizer; /* an optimizer was sent to the servers (kController) */
    float threshold;
    char **str_keys; /* string key i is int key i (MXNet: init order) */
    size_t nstr, cap_str;
    dshim_mxkv_key_t *keys;
    size_t nkeys, cap_keys;
    MXKVStoreUpdater *updater;
    MXKVStoreStrUpdater *str_updater;
    void *updater_handle;
    MXKVStoreServerController *controller;
    void *controller_handle;
    /* pushpulls running inside MXNet's engine (kvstore_async.c) */
    pthread_mutex_t async_mu;
    pthread_cond_t async_cond;
    int async_inflight;
    char async_error[512];
} dshim_mxkv_t;

/* 1 when h is one of dshim's kvstores (else it is MXNet's own) */
int dshim_mxkv_is_ours(KVStoreHandle h);
/* Sets MXNet's last error from dshim_last_error() and returns -1. */
int dshim_mxkv_fail(void);
/* The int key of a string key: existing (create=0) or a new one (create=1). */
int dshim_mxkv_str_key(dshim_mxkv_t *kv, const char *s, int create, int *key_p);
/* The key's state, created on first use; error when its size changes. */
dshim_mxkv_key_t *dshim_mxkv_key(dshim_mxkv_t *kv, int key, size_t n, int dtype);

/* Data calls with int keys (kvstore_data.c). */
int dshim_mxkv_init(dshim_mxkv_t *kv, uint32_t num, const int *keys, NDArrayHandle *vals);
int dshim_mxkv_push(dshim_mxkv_t *kv, uint32_t num, const int *keys, NDArrayHandle *vals);
int dshim_mxkv_pull(dshim_mxkv_t *kv, uint32_t num, const int *keys, NDArrayHandle *vals, int ignore_sparse);
int dshim_mxkv_pushpull(dshim_mxkv_t *kv, uint32_t vnum, const int *vkeys, uint32_t onum, const int *okeys,
                        NDArrayHandle *vals, NDArrayHandle *outs, int priority);

/* kvstore_rows.c: row_sparse arrays (MXNet's storage type 1; csr is 2). */
#define DSHIM_MX_STYPE_DEFAULT 0
#define DSHIM_MX_STYPE_ROW_SPARSE 1
#define DSHIM_MX_STYPE_CSR 2
/* The storage type of h, or -1 (MXNet's error set). */
int dshim_mxkv_stype(NDArrayHandle h);
/* Refuses a csr array in `call` (one line naming it); returns -1. */
int dshim_mxkv_refuse_csr(const char *call, int key);
/* Pushes the sum of count row_sparse arrays of one key (init: the first value). */
int dshim_mxkv_push_rows(dshim_mxkv_t *kv, int key, NDArrayHandle *arrs, int count, int init);
/* A worker that does not push the init value still learns the key's row shape. */
int dshim_mxkv_note_rows(dshim_mxkv_t *kv, int key, NDArrayHandle h);
/* The placement of key k for a dense pull: whole rows for a row_sparse key. */
int dshim_mxkv_parts(dshim_mxkv_t *kv, const dshim_mxkv_key_t *k, dshim_ps_part_t *parts);
int dshim_mxkv_row_sparse_pull(dshim_mxkv_t *kv, uint32_t num, const int *keys, NDArrayHandle *outs,
                               const NDArrayHandle *row_ids);
/* A new row_sparse array of `shape` holding nnz rows (ascending ids, values
 * contiguous), for a server's updater or a pull's output; NULL on error. */
NDArrayHandle dshim_mxkv_rows_array(const int64_t *ids, size_t nnz, const void *vals, int ndim,
                                    const uint32_t *shape, int dtype);

/* kvstore_async.c: pushpull of CPU arrays as an operation of MXNet's engine.
 * Returns 0 when submitted, 1 when not eligible (the caller does it synchronously),
 * -1 on error. */
int dshim_mxkv_pushpull_async(dshim_mxkv_t *kv, uint32_t vnum, const int *vkeys, uint32_t onum, const int *okeys,
                              NDArrayHandle *vals, NDArrayHandle *outs, int priority);
/* Waits until every submitted engine pushpull finished; -1 if one failed. */
int dshim_mxkv_async_drain(dshim_mxkv_t *kv);

#endif

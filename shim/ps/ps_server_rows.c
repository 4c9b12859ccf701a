/* Parameter server: row_sparse keys (DSHIM_PS_F_ROWS; MXNet's DataHandleRowSparse).
 * A row_sparse key's part is kept dense, every row: ps-lite keeps a row_sparse
 * array with every row present, the same values.  A round's pushes are summed
 * row by row into `merged` (present[] marks the rows that got a value), and the
 * updater gets the sum as a row_sparse gradient of those rows only, as MXNet's
 * optimizers expect (lazy updates touch only them). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_log.h"
#include "ps_proto.h"
#include "ps_server_impl.h"
#include "status.h"

/* The row ids of a rows message are in range; *nrows_p = how many. */
static int rows_message(server_t *s, int worker, const dshim_ps_hdr_t *h, int push, size_t *nrows_p, char *msg,
                        size_t cap)
{
    const size_t es = dshim_ps_dtype_size(h->dtype);
    /* a part whose size in bytes does not fit a size_t is garbage: the
     * products below would wrap (a row of 2^64 - 8 bytes made `per` 0, a
     * division by zero; found by tests/fuzz/fuzz_ps) */
    size_t row_bytes = 0, part_bytes = 0;
    const int shape_ok = es != 0 && h->off != 0 && !__builtin_mul_overflow((size_t)h->off, es, &row_bytes) &&
                         !__builtin_mul_overflow(row_bytes, (size_t)h->nelem, &part_bytes) &&
                         row_bytes <= SIZE_MAX - sizeof(int64_t);
    const size_t per = sizeof(int64_t) + (push ? row_bytes : 0);
    if (!shape_ok || h->len % per != 0) {
        snprintf(msg, cap, "key %d: a malformed row_sparse %s from worker %d (%llu bytes for rows of %llu elements "
                 "of dtype %d): are the workers running another dshim version?", h->key, push ? "push" : "pull",
                 worker, (unsigned long long)h->len, (unsigned long long)h->off, h->dtype);
        return -1;
    }
    const size_t nrows = h->len / per;
    const int64_t *ids = (const int64_t *)s->buf;
    for (size_t i = 0; i < nrows; i++) {
        if (ids[i] < 0 || (uint64_t)ids[i] >= h->nelem) {
            snprintf(msg, cap, "key %d: worker %d sent row id %lld outside this server's %llu rows", h->key, worker,
                     (long long)ids[i], (unsigned long long)h->nelem);
            return -1;
        }
    }
    *nrows_p = nrows;
    return 0;
}

/* The message's rows fit key k's part (a key initialised dense learns its row
 * shape here); -1 with msg when not. */
static int rows_fit(key_state_t *k, int worker, const dshim_ps_hdr_t *h, char *msg, size_t cap)
{
    if (h->dtype != k->dtype || h->nelem * h->off != k->n || (k->unit != 0 && k->unit != h->off)) {
        snprintf(msg, cap, "key %d: worker %d sent rows of %llu x %llu elements of dtype %d, but this server holds "
                 "%zu elements of dtype %d of it: every worker must use the key with the same shape and dtype",
                 h->key, worker, (unsigned long long)h->nelem, (unsigned long long)h->off, h->dtype, k->n, k->dtype);
        return -1;
    }
    k->rows = h->nelem;
    k->unit = h->off;
    return 0;
}

/* The first push of a row_sparse key: its rows are the value, every other row
 * 0 (ps-lite refuses an init without rows; here it is a key of zeros). */
static dshim_status_t rows_init(server_t *s, int worker, const dshim_ps_hdr_t *h, key_state_t *k, size_t nrows)
{
    const size_t es = dshim_ps_dtype_size(h->dtype), row = (size_t)h->off * es;
    k->rows = h->nelem;
    k->unit = h->off;
    k->n = k->rows * k->unit;
    k->dtype = h->dtype;
    k->stored = s->ops->alloc(s->ops->ctx, k->n, h->dtype, &k->stored_cookie);
    k->merged = s->ops->alloc(s->ops->ctx, k->n, h->dtype, &k->merged_cookie);
    if (k->stored == NULL || k->merged == NULL) {
        return dshim_error(DSHIM_ERR_NOMEM, "server %d: cannot allocate key %d (%zu elements)", s->node->rank,
                           h->key, k->n);
    }
    s->ops->wait(s->ops->ctx, k->stored_cookie, 1);
    memset(k->stored, 0, k->n * es);
    const int64_t *ids = (const int64_t *)s->buf;
    const char *vals = s->buf + nrows * sizeof(int64_t);
    for (size_t i = 0; i < nrows; i++) {
        memcpy((char *)k->stored + (size_t)ids[i] * row, vals + i * row, row);
    }
    if (s->multi_precision && k->dtype != 0) {
        DSHIM_CHECK(dshim_ps_srv_make_master(s, k));
    }
    DSHIM_PS_TRACE(&s->node->env, s->node->rank, "row_sparse key %d initialised by worker %d (%zu of %zu rows)",
                   h->key, worker, nrows, k->rows);
    return dshim_ps_srv_reply(s, worker, h->seq, DSHIM_PS_MSG_REPLY, NULL, 0);
}

/* Every worker pushed its rows (sync) or one did (async): update, answer. */
static dshim_status_t rows_apply(server_t *s, key_state_t *k)
{
    const int tdtype = k->master ? 0 : k->dtype;
    const size_t tes = dshim_ps_dtype_size(tdtype), row = k->unit * tes;
    void *target = k->master ? k->master : k->stored;
    void *target_cookie = k->master ? k->master_cookie : k->stored_cookie;
    size_t cnt = 0;
    for (size_t r = 0; r < k->rows; r++) {
        cnt += k->present[r];
    }
    int64_t *ids = malloc((cnt ? cnt : 1) * sizeof(int64_t));
    char *vals = malloc(cnt * row + 1);
    if (ids == NULL || vals == NULL) {
        free(ids);
        free(vals);
        return dshim_error(DSHIM_ERR_NOMEM, "server %d: out of memory for %zu rows of key %d", s->node->rank, cnt,
                           k->key);
    }
    s->ops->wait(s->ops->ctx, k->merged_cookie, 0);
    for (size_t r = 0, j = 0; r < k->rows; r++) {
        if (k->present[r]) {
            ids[j] = (int64_t)r;
            memcpy(vals + j * row, (const char *)k->merged + r * row, row);
            j++;
        }
    }
    dshim_status_t st = DSHIM_OK;
    if (s->ops->has_updater(s->ops->ctx)) {
        if (s->ops->update_rows == NULL ||
            s->ops->update_rows(s->ops->ctx, k->key, ids, cnt, vals, k->rows, k->unit, tdtype, target_cookie) != 0) {
            st = dshim_error(DSHIM_ERR_INTERNAL, "server %d: the updater failed for row_sparse key %d",
                             s->node->rank, k->key);
        }
    } else {
        /* MXNet stores the sum as it is: a row_sparse array of the pushed
         * rows, every other row 0 */
        s->ops->wait(s->ops->ctx, target_cookie, 1);
        memset(target, 0, k->n * tes);
        for (size_t j = 0; j < cnt; j++) {
            memcpy((char *)target + (size_t)ids[j] * row, vals + j * row, row);
        }
    }
    free(ids);
    free(vals);
    DSHIM_CHECK(st);
    if (k->master) {
        s->ops->wait(s->ops->ctx, k->master_cookie, 0);
        s->ops->wait(s->ops->ctx, k->stored_cookie, 1);
        DSHIM_CHECK(dshim_ps_from_float32(k->stored, k->master, k->n, k->dtype));
    }
    k->round_rows = 0;
    return dshim_ps_srv_answer_whole_waiters(s, k);
}

dshim_status_t dshim_ps_srv_rows_push(server_t *s, int worker, const dshim_ps_hdr_t *h)
{
    char msg[400];
    size_t nrows = 0;
    if (rows_message(s, worker, h, 1, &nrows, msg, sizeof(msg)) != 0) {
        return dshim_ps_srv_reply_error(s, worker, h->seq, msg);
    }
    key_state_t *k = dshim_ps_srv_find_key(s, h->key, 1);
    if (k == NULL) {
        return dshim_error(DSHIM_ERR_NOMEM, "server: out of memory");
    }
    if (k->stored == NULL) {
        dshim_status_t st = rows_init(s, worker, h, k, nrows);
        if (k->stored != NULL) {
            dshim_ps_srv_note_init(s, k, worker);
        }
        return st;
    }
    if (rows_fit(k, worker, h, msg, sizeof(msg)) != 0) {
        return dshim_ps_srv_reply_error(s, worker, h->seq, msg);
    }
    if (!s->sync_mode && !s->ops->has_updater(s->ops->ctx)) {
        snprintf(msg, sizeof(msg), "key %d: an async kvstore needs an optimizer on the servers (MXNet: \"Updater "
                 "needs to be set for async mode\"): call kv.set_optimizer first", h->key);
        return dshim_ps_srv_reply_error(s, worker, h->seq, msg);
    }
    if (k->npieces > 0 || k->pieces_done > 0 || (k->nwaiters > 0 && !k->round_rows)) {
        snprintf(msg, sizeof(msg), "key %d: worker %d pushed row_sparse values in a round where others pushed dense "
                 "ones: every worker must push the key with the same storage type", h->key, worker);
        return dshim_ps_srv_reply_error(s, worker, h->seq, msg);
    }
    if (!s->sync_mode && nrows == 0) {
        return dshim_ps_srv_reply(s, worker, h->seq, DSHIM_PS_MSG_REPLY, NULL, 0); /* MXNet: nothing to update */
    }
    if (k->present == NULL && (k->present = calloc(k->rows ? k->rows : 1, 1)) == NULL) {
        return dshim_error(DSHIM_ERR_NOMEM, "server: out of memory");
    }
    dshim_ps_srv_note_push(s, k, worker);
    if (k->nwaiters == 0 || !s->sync_mode) {
        memset(k->present, 0, k->rows); /* a new round: merged = the first push */
    }
    const size_t es = dshim_ps_dtype_size(k->dtype), row = k->unit * es;
    const size_t trow = k->unit * (k->master ? sizeof(float) : es);
    const int64_t *ids = (const int64_t *)s->buf;
    const char *vals = s->buf + nrows * sizeof(int64_t);
    s->ops->wait(s->ops->ctx, k->merged_cookie, 1);
    for (size_t i = 0; i < nrows; i++) {
        char *dst = (char *)k->merged + (size_t)ids[i] * trow;
        const char *src = vals + i * row;
        const int first = !k->present[ids[i]];
        if (k->master) {
            /* MXNet: the push cast to float32, then merged (float32) = or += it */
            DSHIM_CHECK(dshim_ps_to_float32(first ? (float *)dst : k->wide, src, k->unit, k->dtype));
            if (!first) {
                DSHIM_CHECK(dshim_ps_add(dst, k->wide, k->unit, 0));
            }
        } else if (first) {
            memcpy(dst, src, row);
        } else {
            DSHIM_CHECK(dshim_ps_add(dst, src, k->unit, k->dtype));
        }
        k->present[ids[i]] = 1;
    }
    k->round_rows = 1;
    waiter_t *w = &k->waiters[k->nwaiters++];
    *w = (waiter_t){.worker = worker, .seq = h->seq, .want_pull = 0};
    if (!s->sync_mode || k->nwaiters == s->node->env.num_workers) {
        return rows_apply(s, k);
    }
    return DSHIM_OK;
}

/* row_sparse_pull: the asked rows of the stored value, in the order asked. */
dshim_status_t dshim_ps_srv_rows_pull(server_t *s, int worker, const dshim_ps_hdr_t *h)
{
    char msg[400];
    size_t nrows = 0;
    if (rows_message(s, worker, h, 0, &nrows, msg, sizeof(msg)) != 0) {
        return dshim_ps_srv_reply_error(s, worker, h->seq, msg);
    }
    key_state_t *k = dshim_ps_srv_find_key(s, h->key, 0);
    if (k == NULL || k->stored == NULL) {
        snprintf(msg, sizeof(msg), "key %d was pulled before it was initialised: call kv.init first", h->key);
        return dshim_ps_srv_reply_error(s, worker, h->seq, msg);
    }
    if (rows_fit(k, worker, h, msg, sizeof(msg)) != 0) {
        return dshim_ps_srv_reply_error(s, worker, h->seq, msg);
    }
    const size_t row = k->unit * dshim_ps_dtype_size(k->dtype);
    char *out = malloc(nrows * row + 1);
    if (out == NULL) {
        return dshim_error(DSHIM_ERR_NOMEM, "server %d: out of memory for %zu rows of key %d", s->node->rank, nrows,
                           k->key);
    }
    const int64_t *ids = (const int64_t *)s->buf;
    s->ops->wait(s->ops->ctx, k->stored_cookie, 0);
    for (size_t i = 0; i < nrows; i++) {
        memcpy(out + i * row, (const char *)k->stored + (size_t)ids[i] * row, row);
    }
    dshim_status_t st = dshim_ps_srv_reply(s, worker, h->seq, DSHIM_PS_MSG_REPLY, out, nrows * row);
    free(out);
    return st;
}

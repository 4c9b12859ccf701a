/* Parameter server: a server's event loop with MXNet's KVStoreDistServer
 * semantics — first push of a key initialises it; in sync mode pushes are
 * summed until every worker pushed, then the updater runs (or the sum is
 * stored) and only then are the pushes answered; async mode applies each push
 * at once.  Runs on the calling (Python main) thread, as MXNet runs its
 * updater and controller there. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/socket.h>
#include <netinet/tcp.h>

#include "config.h"
#include "net.h"
#include "ps_log.h"
#include "ps_proto.h"
#include "ps_twobit.h"
#include "status.h"

typedef struct waiter {
    int worker;
    uint32_t seq;
    int want_pull;
} waiter_t;

/* A piece [off, off + cnt) of a key being pushed in pieces
 * (DSHIM_PS_F_PIECE): summed over the workers and answered on its own. */
typedef struct piece {
    size_t off, cnt;
    int npushed;
    int done;          /* every worker's values summed (kept until the updater ran) */
    waiter_t *waiters; /* num_workers */
} piece_t;

typedef struct key_state {
    int key;
    int dtype;
    size_t n;
    void *stored;
    void *stored_cookie;
    void *merged;
    void *merged_cookie;
    void *decomp; /* 2-bit: one push dequantized */
    /* multi-precision (MXNet's store_realt_): a float32 master copy of a key
     * of another dtype; `merged` is float32 then, and `wide` holds one push
     * widened to float32 */
    void *master;
    void *master_cookie;
    float *wide;
    waiter_t *waiters;
    int nwaiters;
    /* pieces of this round; a worker pushing whole (its server is on its
     * host) is in `waiters` and counts toward every piece */
    piece_t *pieces;
    size_t npieces, cap_pieces;
    size_t pieces_done; /* elements of this round's complete pieces */
    /* row_sparse pushes (DSHIM_PS_F_ROWS): the part's shape once known, and
     * which rows of `merged` hold a value in this round */
    size_t rows, unit;
    unsigned char *present;
    int round_rows; /* this round's pushes are rows */
} key_state_t;

typedef struct server {
    dshim_ps_node_t *node;
    const dshim_ps_server_ops_t *ops;
    int *worker_fds; /* by worker rank */
    int nconnected;
    int departed; /* workers that said goodbye */
    int all_left; /* every worker left without kStopServer */
    int sync_mode;
    int stop;
    float threshold;
    int compression;
    /* float32 master copies of non-float32 keys: after kSetMultiPrecision,
     * or from the start (DSHIM_PS_FLOAT32_MASTER, the default): MXNet
     * 1.9.1's KVStoreDistServer never initialises its multi_precision_ flag,
     * and its servers behave as if it were set (ps-lite's float16 results
     * equal the master-copy ones, with or without the command) */
    int multi_precision;
    key_state_t *keys;
    size_t nkeys, cap;
    char *buf; /* receive buffer */
    size_t buf_cap;
} server_t;

static void *plain_alloc(void *ctx, size_t n, int dtype, void **cookie)
{
    (void)ctx;
    void *p = calloc(n ? n : 1, dshim_ps_dtype_size(dtype));
    *cookie = p;
    return p;
}

static void plain_release(void *ctx, void *cookie)
{
    (void)ctx;
    free(cookie);
}

static void plain_wait(void *ctx, void *cookie, int write)
{
    (void)ctx;
    (void)cookie;
    (void)write;
}

static int plain_has_updater(void *ctx)
{
    (void)ctx;
    return 0;
}

static key_state_t *find_key(server_t *s, int key, int create)
{
    for (size_t i = 0; i < s->nkeys; i++) {
        if (s->keys[i].key == key) {
            return &s->keys[i];
        }
    }
    if (!create) {
        return NULL;
    }
    if (s->nkeys == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        key_state_t *k = realloc(s->keys, cap * sizeof(*k));
        if (k == NULL) {
            return NULL;
        }
        s->keys = k;
        s->cap = cap;
    }
    key_state_t *k = &s->keys[s->nkeys++];
    memset(k, 0, sizeof(*k));
    k->key = key;
    k->waiters = calloc((size_t)s->node->env.num_workers * 2 + 2, sizeof(waiter_t));
    return k;
}

static dshim_status_t reply(server_t *s, int worker, uint32_t seq, int type, const void *payload, size_t len)
{
    dshim_ps_hdr_t h;
    dshim_ps_hdr_init(&h, type, 0, len);
    h.seq = seq;
    DSHIM_PS_TRACE(&s->node->env, s->node->rank, "%s seq %u (%zu bytes) -> worker %d", dshim_ps_msg_name(type),
                   seq, len, worker);
    s->node->bytes_out += len;
    dshim_status_t st = dshim_ps_send(s->worker_fds[worker], &h, payload, dshim_now() + s->node->env.timeout_s);
    if (st != DSHIM_OK) {
        const char *f = dshim_ps_wait_failure(s->node, 2.0);
        if (f != NULL) {
            return dshim_error(DSHIM_ERR_PEER, "%s", f);
        }
        return dshim_error(DSHIM_ERR_PEER, "server %d: cannot answer worker %d: its connection closed (it died)",
                           s->node->rank, worker);
    }
    return DSHIM_OK;
}

static dshim_status_t reply_error(server_t *s, int worker, uint32_t seq, const char *text)
{
    fprintf(stderr, "[dshim-ps server %d] %s\n", s->node->rank, text);
    return reply(s, worker, seq, DSHIM_PS_MSG_ERROR, text, strlen(text));
}

static dshim_status_t answer_stored(server_t *s, key_state_t *k, int worker, uint32_t seq)
{
    s->ops->wait(s->ops->ctx, k->stored_cookie, 0);
    return reply(s, worker, seq, DSHIM_PS_MSG_REPLY, k->stored, k->n * dshim_ps_dtype_size(k->dtype));
}

/* The merged pushes become the key's value: through the updater, or as they are. */
static dshim_status_t update_value(server_t *s, key_state_t *k)
{
    /* with a master copy the update runs on it, in float32 (MXNet's
     * store_realt_), and the key's own dtype gets the result cast back */
    void *target = k->master ? k->master : k->stored;
    void *target_cookie = k->master ? k->master_cookie : k->stored_cookie;
    int target_dtype = k->master ? 0 : k->dtype;
    if (s->ops->has_updater(s->ops->ctx)) {
        if (s->ops->update(s->ops->ctx, k->key, k->merged_cookie, target_cookie) != 0) {
            return dshim_error(DSHIM_ERR_INTERNAL, "server %d: the updater failed for key %d", s->node->rank, k->key);
        }
    } else {
        s->ops->wait(s->ops->ctx, target_cookie, 1);
        memcpy(target, k->merged, k->n * dshim_ps_dtype_size(target_dtype));
    }
    if (k->master) {
        s->ops->wait(s->ops->ctx, k->master_cookie, 0);
        s->ops->wait(s->ops->ctx, k->stored_cookie, 1);
        DSHIM_CHECK(dshim_ps_from_float32(k->stored, k->master, k->n, k->dtype));
    }
    return DSHIM_OK;
}

static dshim_status_t answer_whole_waiters(server_t *s, key_state_t *k)
{
    for (int i = 0; i < k->nwaiters; i++) {
        waiter_t *w = &k->waiters[i];
        DSHIM_CHECK(w->want_pull ? answer_stored(s, k, w->worker, w->seq)
                                 : reply(s, w->worker, w->seq, DSHIM_PS_MSG_REPLY, NULL, 0));
    }
    k->nwaiters = 0;
    s->ops->wait(s->ops->ctx, k->stored_cookie, 0);
    return DSHIM_OK;
}

/* Every worker pushed (sync) or one did (async): update, then answer. */
static dshim_status_t apply_updates(server_t *s, key_state_t *k)
{
    DSHIM_CHECK(update_value(s, k));
    return answer_whole_waiters(s, k);
}

/* Gives key k (not float32) its float32 master copy, from its stored value;
 * `merged` becomes float32 too.  At initialisation, or when
 * kSetMultiPrecision comes after keys exist (MXNet's
 * CreateMultiPrecisionCopies). */
static dshim_status_t make_master(server_t *s, key_state_t *k)
{
    k->master = s->ops->alloc(s->ops->ctx, k->n, 0, &k->master_cookie);
    k->wide = malloc((k->n ? k->n : 1) * sizeof(float));
    void *merged_cookie = NULL;
    void *merged = s->ops->alloc(s->ops->ctx, k->n, 0, &merged_cookie);
    if (k->master == NULL || k->wide == NULL || merged == NULL) {
        if (merged != NULL) {
            s->ops->release(s->ops->ctx, merged_cookie);
        }
        return dshim_error(DSHIM_ERR_NOMEM, "server %d: cannot allocate the float32 master copy of key %d (%zu "
                           "elements)", s->node->rank, k->key, k->n);
    }
    s->ops->release(s->ops->ctx, k->merged_cookie);
    k->merged = merged;
    k->merged_cookie = merged_cookie;
    s->ops->wait(s->ops->ctx, k->stored_cookie, 0);
    s->ops->wait(s->ops->ctx, k->master_cookie, 1);
    DSHIM_CHECK(dshim_ps_to_float32(k->master, k->stored, k->n, k->dtype));
    /* MXNet stores the key's value as the cast of the master copy */
    s->ops->wait(s->ops->ctx, k->stored_cookie, 1);
    return dshim_ps_from_float32(k->stored, k->master, k->n, k->dtype);
}

/* Writes the pushed values (dequantized when compressed) into dst. */
static void take_values(server_t *s, key_state_t *k, const dshim_ps_hdr_t *h, void *dst)
{
    if (h->flags & DSHIM_PS_F_COMPRESSED) {
        dshim_twobit_dequantize((const uint32_t *)s->buf, k->n, s->threshold, dst);
    } else {
        memcpy(dst, s->buf, h->len);
    }
}

static piece_t *find_piece(server_t *s, key_state_t *k, size_t off)
{
    for (size_t i = 0; i < k->npieces; i++) {
        if (k->pieces[i].off == off) {
            return &k->pieces[i];
        }
    }
    if (k->npieces == k->cap_pieces) {
        size_t cap = k->cap_pieces ? k->cap_pieces * 2 : 16;
        piece_t *p = realloc(k->pieces, cap * sizeof(*p));
        if (p == NULL) {
            return NULL;
        }
        memset(p + k->cap_pieces, 0, (cap - k->cap_pieces) * sizeof(*p));
        k->pieces = p;
        k->cap_pieces = cap;
    }
    piece_t *p = &k->pieces[k->npieces];
    if (p->waiters == NULL && (p->waiters = calloc((size_t)s->node->env.num_workers, sizeof(waiter_t))) == NULL) {
        return NULL;
    }
    k->npieces++;
    p->off = off;
    p->cnt = 0;
    p->npushed = 0;
    p->done = 0;
    return p;
}

/* Drops piece p of k (its waiter array stays with the slot for reuse). */
static void drop_piece(key_state_t *k, piece_t *p)
{
    piece_t *last = &k->pieces[k->npieces - 1];
    if (p != last) {
        piece_t t = *p;
        *p = *last;
        *last = t;
    }
    k->npieces--;
}

static dshim_status_t answer_piece(server_t *s, key_state_t *k, const piece_t *p)
{
    const size_t es = dshim_ps_dtype_size(k->dtype);
    s->ops->wait(s->ops->ctx, k->stored_cookie, 0);
    for (int i = 0; i < p->npushed; i++) {
        DSHIM_CHECK(reply(s, p->waiters[i].worker, p->waiters[i].seq, DSHIM_PS_MSG_REPLY,
                          (const char *)k->stored + p->off * es, p->cnt * es));
    }
    return DSHIM_OK;
}

/* Piece i of k has every worker's values.  Without an updater it is the
 * value there and then: stored and answered (and dropped from the table).
 * Once the whole key is done, the updater (if any) runs and everybody still
 * waiting is answered. */
static dshim_status_t piece_complete(server_t *s, key_state_t *k, size_t i)
{
    piece_t *p = &k->pieces[i];
    p->done = 1;
    k->pieces_done += p->cnt;
    const int updater = s->ops->has_updater(s->ops->ctx);
    if (!updater) {
        /* MXNet: stored = merged, here piece by piece */
        const size_t es = dshim_ps_dtype_size(k->dtype);
        s->ops->wait(s->ops->ctx, k->merged_cookie, 0);
        s->ops->wait(s->ops->ctx, k->stored_cookie, 1);
        memcpy((char *)k->stored + p->off * es, (const char *)k->merged + p->off * es, p->cnt * es);
        DSHIM_CHECK(answer_piece(s, k, p));
        drop_piece(k, p);
    }
    if (k->pieces_done < k->n) {
        return DSHIM_OK;
    }
    k->pieces_done = 0;
    if (updater) {
        DSHIM_CHECK(update_value(s, k));
        for (size_t j = 0; j < k->npieces; j++) {
            DSHIM_CHECK(answer_piece(s, k, &k->pieces[j]));
        }
    }
    k->npieces = 0;
    return answer_whole_waiters(s, k);
}

/* Completes every piece that has all workers' values: its own pushers plus
 * the whole pushes. */
static dshim_status_t complete_pieces(server_t *s, key_state_t *k)
{
    const int nw = s->node->env.num_workers;
    size_t i = 0;
    while (i < k->npieces) {
        piece_t *p = &k->pieces[i];
        if (p->done || p->npushed + k->nwaiters < nw) {
            i++;
            continue;
        }
        const size_t before = k->npieces;
        DSHIM_CHECK(piece_complete(s, k, i));
        if (k->npieces == before) {
            i++; /* kept (updater); a dropped one's slot now holds another piece */
        }
    }
    return DSHIM_OK;
}

static int by_offset(const void *a, const void *b)
{
    const piece_t *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off;
}

/* A whole push of a key that others push in pieces: added where pieces
 * arrived already, copied where nothing did (as MXNet's merged = first push,
 * merged += next), then every piece it completes is completed. */
static dshim_status_t whole_into_pieces(server_t *s, int worker, const dshim_ps_hdr_t *h, key_state_t *k)
{
    char msg[256];
    const int nw = s->node->env.num_workers;
    const size_t es = dshim_ps_dtype_size(k->dtype);
    /* a complete piece had every whole push already */
    int extra = k->pieces_done > 0;
    for (size_t i = 0; i < k->npieces; i++) {
        extra |= k->pieces[i].done || k->pieces[i].npushed + k->nwaiters + 1 > nw;
    }
    if (extra) {
        snprintf(msg, sizeof(msg), "key %d: worker %d pushed it once more than the %d workers there are in this "
                 "round", h->key, worker, nw);
        return reply_error(s, worker, h->seq, msg);
    }
    if ((h->flags & DSHIM_PS_F_COMPRESSED) || k->master != NULL) {
        snprintf(msg, sizeof(msg), "key %d: a compressed or non-float32 whole push cannot join a round pushed in "
                 "pieces: set DSHIM_PS_PIECE=0", h->key);
        return reply_error(s, worker, h->seq, msg);
    }
    s->ops->wait(s->ops->ctx, k->merged_cookie, 1);
    char *merged = k->merged;
    if (k->nwaiters > 0) {
        DSHIM_CHECK(dshim_ps_add(merged, s->buf, k->n, k->dtype)); /* every element has a value already */
    } else {
        /* the pieces never overlap (handle_piece checks): walk them in order */
        qsort(k->pieces, k->npieces, sizeof(piece_t), by_offset);
        size_t at = 0;
        for (size_t i = 0; i <= k->npieces; i++) {
            const size_t off = i < k->npieces ? k->pieces[i].off : k->n;
            memcpy(merged + at * es, s->buf + at * es, (off - at) * es);
            if (i < k->npieces) {
                const piece_t *p = &k->pieces[i];
                DSHIM_CHECK(dshim_ps_add(merged + p->off * es, s->buf + p->off * es, p->cnt, k->dtype));
                at = p->off + p->cnt;
            }
        }
    }
    waiter_t *w = &k->waiters[k->nwaiters++];
    w->worker = worker;
    w->seq = h->seq;
    w->want_pull = (h->flags & DSHIM_PS_F_PULL) != 0;
    return complete_pieces(s, k);
}

/* A piece of a sync-mode push (DSHIM_PS_F_PIECE), summed into `merged`. */
static dshim_status_t handle_piece(server_t *s, int worker, const dshim_ps_hdr_t *h)
{
    char msg[320];
    const int nw = s->node->env.num_workers;
    const size_t es = dshim_ps_dtype_size(h->dtype);
    key_state_t *k = find_key(s, h->key, 0);
    if (k == NULL || k->stored == NULL) {
        snprintf(msg, sizeof(msg), "key %d: worker %d pushed a piece of it before it was initialised: call kv.init "
                 "first", h->key, worker);
        return reply_error(s, worker, h->seq, msg);
    }
    const size_t cnt = es ? h->len / es : 0;
    if (!s->sync_mode || (h->flags & DSHIM_PS_F_COMPRESSED) || k->master != NULL || es == 0 || h->len % es != 0 ||
        h->dtype != k->dtype || h->nelem != k->n || cnt == 0 || h->off > k->n || cnt > k->n - h->off) {
        snprintf(msg, sizeof(msg), "key %d: worker %d pushed a piece of %zu elements at %llu of a %llu-element key "
                 "(dtype %d), which this server (%s mode, the key: %zu elements of dtype %d%s) cannot take: are the "
                 "workers running another dshim version? Set DSHIM_PS_PIECE=0 to push whole keys", h->key, worker,
                 cnt, (unsigned long long)h->off, (unsigned long long)h->nelem, h->dtype,
                 s->sync_mode ? "sync" : "async", k->n, k->dtype, k->master ? ", float32 master copy" : "");
        return reply_error(s, worker, h->seq, msg);
    }
    for (size_t i = 0; i < k->npieces; i++) {
        const piece_t *q = &k->pieces[i];
        if ((q->off == h->off && q->cnt != cnt) || (q->off != h->off && h->off < q->off + q->cnt &&
                                                    q->off < h->off + cnt)) {
            snprintf(msg, sizeof(msg), "key %d: the workers cut it into different pieces ([%zu, +%zu) and [%llu, "
                     "+%zu)): set the same DSHIM_PS_PIECE for every worker", h->key, q->off, q->cnt,
                     (unsigned long long)h->off, cnt);
            return reply_error(s, worker, h->seq, msg);
        }
    }
    piece_t *p = find_piece(s, k, h->off);
    if (p == NULL) {
        return dshim_error(DSHIM_ERR_NOMEM, "server %d: out of memory", s->node->rank);
    }
    if (p->done || p->npushed + k->nwaiters >= nw) {
        snprintf(msg, sizeof(msg), "key %d: worker %d pushed the piece at %zu once more than the %d workers there "
                 "are in this round", h->key, worker, p->off, nw);
        return reply_error(s, worker, h->seq, msg);
    }
    s->ops->wait(s->ops->ctx, k->merged_cookie, 1);
    char *merged = (char *)k->merged + h->off * es;
    if (p->npushed == 0 && k->nwaiters == 0) {
        memcpy(merged, s->buf, h->len); /* the first values of this range */
    } else {
        DSHIM_CHECK(dshim_ps_add(merged, s->buf, cnt, k->dtype));
    }
    p->cnt = cnt;
    p->waiters[p->npushed++] = (waiter_t){.worker = worker, .seq = h->seq, .want_pull = 1};
    return p->npushed + k->nwaiters == nw ? complete_pieces(s, k) : DSHIM_OK;
}

/* --- row_sparse keys (DSHIM_PS_F_ROWS; MXNet's DataHandleRowSparse) --------
 * A row_sparse key's part is kept dense, every row: ps-lite keeps a row_sparse
 * array with every row present, the same values.  A round's pushes are summed
 * row by row into `merged` (present[] marks the rows that got a value), and the
 * updater gets the sum as a row_sparse gradient of those rows only, as MXNet's
 * optimizers expect (lazy updates touch only them). */

/* The row ids of a rows message are in range; *nrows_p = how many. */
static int rows_message(server_t *s, int worker, const dshim_ps_hdr_t *h, int push, size_t *nrows_p, char *msg,
                        size_t cap)
{
    const size_t es = dshim_ps_dtype_size(h->dtype);
    const size_t per = sizeof(int64_t) + (push ? (size_t)h->off * es : 0);
    if (es == 0 || h->off == 0 || h->len % per != 0) {
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
        DSHIM_CHECK(make_master(s, k));
    }
    DSHIM_PS_TRACE(&s->node->env, s->node->rank, "row_sparse key %d initialised by worker %d (%zu of %zu rows)",
                   h->key, worker, nrows, k->rows);
    return reply(s, worker, h->seq, DSHIM_PS_MSG_REPLY, NULL, 0);
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
    return answer_whole_waiters(s, k);
}

static dshim_status_t rows_push(server_t *s, int worker, const dshim_ps_hdr_t *h)
{
    char msg[400];
    size_t nrows = 0;
    if (rows_message(s, worker, h, 1, &nrows, msg, sizeof(msg)) != 0) {
        return reply_error(s, worker, h->seq, msg);
    }
    key_state_t *k = find_key(s, h->key, 1);
    if (k == NULL) {
        return dshim_error(DSHIM_ERR_NOMEM, "server: out of memory");
    }
    if (k->stored == NULL) {
        return rows_init(s, worker, h, k, nrows);
    }
    if (rows_fit(k, worker, h, msg, sizeof(msg)) != 0) {
        return reply_error(s, worker, h->seq, msg);
    }
    if (!s->sync_mode && !s->ops->has_updater(s->ops->ctx)) {
        snprintf(msg, sizeof(msg), "key %d: an async kvstore needs an optimizer on the servers (MXNet: \"Updater "
                 "needs to be set for async mode\"): call kv.set_optimizer first", h->key);
        return reply_error(s, worker, h->seq, msg);
    }
    if (k->npieces > 0 || k->pieces_done > 0 || (k->nwaiters > 0 && !k->round_rows)) {
        snprintf(msg, sizeof(msg), "key %d: worker %d pushed row_sparse values in a round where others pushed dense "
                 "ones: every worker must push the key with the same storage type", h->key, worker);
        return reply_error(s, worker, h->seq, msg);
    }
    if (!s->sync_mode && nrows == 0) {
        return reply(s, worker, h->seq, DSHIM_PS_MSG_REPLY, NULL, 0); /* MXNet: nothing to update */
    }
    if (k->present == NULL && (k->present = calloc(k->rows ? k->rows : 1, 1)) == NULL) {
        return dshim_error(DSHIM_ERR_NOMEM, "server: out of memory");
    }
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
static dshim_status_t rows_pull(server_t *s, int worker, const dshim_ps_hdr_t *h)
{
    char msg[400];
    size_t nrows = 0;
    if (rows_message(s, worker, h, 0, &nrows, msg, sizeof(msg)) != 0) {
        return reply_error(s, worker, h->seq, msg);
    }
    key_state_t *k = find_key(s, h->key, 0);
    if (k == NULL || k->stored == NULL) {
        snprintf(msg, sizeof(msg), "key %d was pulled before it was initialised: call kv.init first", h->key);
        return reply_error(s, worker, h->seq, msg);
    }
    if (rows_fit(k, worker, h, msg, sizeof(msg)) != 0) {
        return reply_error(s, worker, h->seq, msg);
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
    dshim_status_t st = reply(s, worker, h->seq, DSHIM_PS_MSG_REPLY, out, nrows * row);
    free(out);
    return st;
}

static dshim_status_t handle_push(server_t *s, int worker, const dshim_ps_hdr_t *h)
{
    if (h->flags & DSHIM_PS_F_ROWS) {
        return rows_push(s, worker, h);
    }
    if (h->flags & DSHIM_PS_F_PIECE) {
        return handle_piece(s, worker, h);
    }
    int compressed = (h->flags & DSHIM_PS_F_COMPRESSED) != 0;
    size_t esize = dshim_ps_dtype_size(h->dtype);
    char msg[256];
    if (esize == 0) {
        snprintf(msg, sizeof(msg), "key %d: unsupported MXNet dtype %d", h->key, h->dtype);
        return reply_error(s, worker, h->seq, msg);
    }
    if (compressed && (h->dtype != 0 || h->len != dshim_twobit_words(h->nelem) * 4)) {
        snprintf(msg, sizeof(msg), "key %d: a 2-bit push must carry float32 values (MXNet: gradient compression is "
                 "only supported for float32)", h->key);
        return reply_error(s, worker, h->seq, msg);
    }
    size_t n = compressed ? h->nelem : h->len / esize;
    key_state_t *k = find_key(s, h->key, 1);
    if (k == NULL) {
        return dshim_error(DSHIM_ERR_NOMEM, "server: out of memory");
    }
    if (k->stored == NULL) {
        /* the first push of a key is its initial value (rank 0's init) */
        k->n = n;
        k->dtype = h->dtype;
        k->stored = s->ops->alloc(s->ops->ctx, n, h->dtype, &k->stored_cookie);
        k->merged = s->ops->alloc(s->ops->ctx, n, h->dtype, &k->merged_cookie);
        if (k->stored == NULL || k->merged == NULL) {
            return dshim_error(DSHIM_ERR_NOMEM, "server %d: cannot allocate key %d (%zu elements)", s->node->rank,
                               h->key, n);
        }
        take_values(s, k, h, k->stored);
        if (s->multi_precision && k->dtype != 0) {
            DSHIM_CHECK(make_master(s, k));
        }
        DSHIM_PS_TRACE(&s->node->env, s->node->rank, "key %d initialised by worker %d (%zu elements)", h->key,
                       worker, n);
        return (h->flags & DSHIM_PS_F_PULL) ? answer_stored(s, k, worker, h->seq)
                                            : reply(s, worker, h->seq, DSHIM_PS_MSG_REPLY, NULL, 0);
    }
    if (n != k->n || h->dtype != k->dtype) {
        snprintf(msg, sizeof(msg), "key %d: worker %d pushed %zu elements of dtype %d but the key holds %zu of dtype "
                 "%d (the value size cannot change)", h->key, worker, n, h->dtype, k->n, k->dtype);
        return reply_error(s, worker, h->seq, msg);
    }
    if (k->nwaiters > 0 && k->round_rows) {
        snprintf(msg, sizeof(msg), "key %d: worker %d pushed dense values in a round where others pushed row_sparse "
                 "ones: every worker must push the key with the same storage type", h->key, worker);
        return reply_error(s, worker, h->seq, msg);
    }
    if (!s->sync_mode && !s->ops->has_updater(s->ops->ctx)) {
        snprintf(msg, sizeof(msg), "key %d: an async kvstore needs an optimizer on the servers (MXNet: \"Updater needs "
                 "to be set for async mode\"): call kv.set_optimizer first", h->key);
        return reply_error(s, worker, h->seq, msg);
    }
    if (s->sync_mode && (k->npieces > 0 || k->pieces_done > 0)) {
        return whole_into_pieces(s, worker, h, k); /* others push this round's values in pieces */
    }
    s->ops->wait(s->ops->ctx, k->merged_cookie, 1);
    if (k->master) {
        /* MXNet: the push cast to float32, then merged (float32) = or += it */
        DSHIM_CHECK(dshim_ps_to_float32(k->nwaiters == 0 || !s->sync_mode ? k->merged : k->wide, s->buf, n,
                                        k->dtype));
        if (k->nwaiters > 0 && s->sync_mode) {
            DSHIM_CHECK(dshim_ps_add(k->merged, k->wide, n, 0));
        }
    } else if (k->nwaiters == 0 || !s->sync_mode) {
        take_values(s, k, h, k->merged);
    } else {
        if (compressed) {
            if (k->decomp == NULL) {
                k->decomp = malloc(n * sizeof(float));
                if (k->decomp == NULL) {
                    return dshim_error(DSHIM_ERR_NOMEM, "server: out of memory");
                }
            }
            take_values(s, k, h, k->decomp);
            DSHIM_CHECK(dshim_ps_add(k->merged, k->decomp, n, k->dtype));
        } else {
            DSHIM_CHECK(dshim_ps_add(k->merged, s->buf, n, k->dtype));
        }
    }
    waiter_t *w = &k->waiters[k->nwaiters++];
    w->worker = worker;
    w->seq = h->seq;
    w->want_pull = (h->flags & DSHIM_PS_F_PULL) != 0;
    if (!s->sync_mode || k->nwaiters == s->node->env.num_workers) {
        return apply_updates(s, k);
    }
    return DSHIM_OK;
}

static dshim_status_t handle_command(server_t *s, int worker, const dshim_ps_hdr_t *h)
{
    const char *body = s->buf;
    switch (h->key) {
    case DSHIM_PS_CMD_STOP_SERVER:
        s->stop = 1;
        break;
    case DSHIM_PS_CMD_SYNC_MODE:
        s->sync_mode = 1;
        break;
    case DSHIM_PS_CMD_GRADIENT_COMPRESSION: {
        int enabled = 0;
        if (dshim_twobit_decode_params(body, &s->threshold, &enabled) != 0) {
            return reply_error(s, worker, h->seq, "bad gradient compression parameters");
        }
        s->compression = enabled;
        break;
    }
    case DSHIM_PS_CMD_MULTI_PRECISION:
        if (!s->multi_precision) {
            s->multi_precision = 1;
            for (size_t i = 0; i < s->nkeys; i++) {
                key_state_t *k = &s->keys[i];
                if (k->stored == NULL || k->dtype == 0 || k->master != NULL) {
                    continue;
                }
                if (k->nwaiters > 0) {
                    char msg[200];
                    snprintf(msg, sizeof(msg), "multi-precision cannot be set while pushes of key %d are under way: "
                             "set the optimizer before pushing (MXNet refuses this too)", k->key);
                    return reply_error(s, worker, h->seq, msg);
                }
                DSHIM_CHECK(make_master(s, k));
            }
        }
        break;
    case DSHIM_PS_CMD_PROFILER: {
        /* MXNet's profiler of this server process, configured/started/dumped as asked */
        char err[600] = "this server has no profiler to command (a server without MXNet)";
        if (s->ops->profiler == NULL || s->ops->profiler(s->ops->ctx, body, err, sizeof(err)) != 0) {
            return reply_error(s, worker, h->seq, err);
        }
        break;
    }
    default:
        if (s->ops->controller != NULL && s->ops->controller(s->ops->ctx, h->key, body) != 0) {
            return reply_error(s, worker, h->seq, "the server's controller failed (see its output)");
        }
        break;
    }
    DSHIM_PS_INFO(&s->node->env, s->node->rank, "command %d from worker %d", h->key, worker);
    return reply(s, worker, h->seq, DSHIM_PS_MSG_REPLY, NULL, 0);
}

static dshim_status_t handle_message(server_t *s, int worker)
{
    int fd = s->worker_fds[worker];
    double deadline = dshim_now() + s->node->env.timeout_s;
    dshim_ps_hdr_t h;
    dshim_status_t st = dshim_ps_recv_hdr(fd, &h, deadline);
    if (st == DSHIM_OK && h.len + 1 > s->buf_cap) {
        char *b = realloc(s->buf, h.len + 1);
        if (b == NULL) {
            return dshim_error(DSHIM_ERR_NOMEM, "server: cannot hold a %llu-byte message",
                               (unsigned long long)h.len);
        }
        s->buf = b;
        s->buf_cap = h.len + 1;
    }
    if (st == DSHIM_OK) {
        st = dshim_ps_recv_body(fd, s->buf, h.len, deadline);
    }
    if (st != DSHIM_OK) {
        /* the scheduler's notice names the dead process best: give it a moment */
        const char *f = dshim_ps_wait_failure(s->node, 2.0);
        if (f != NULL) {
            return dshim_error(DSHIM_ERR_PEER, "%s", f);
        }
        return dshim_error(DSHIM_ERR_PEER, "server %d: worker %d closed its connection: it died", s->node->rank, worker);
    }
    s->buf[h.len] = '\0';
    s->node->bytes_in += h.len;
    DSHIM_PS_TRACE(&s->node->env, s->node->rank, "%s key %d (%llu bytes, seq %u) <- worker %d",
                   dshim_ps_msg_name(h.type), h.key, (unsigned long long)h.len, h.seq, worker);
    switch (h.type) {
    case DSHIM_PS_MSG_PUSH:
        s->node->n_push++;
        return handle_push(s, worker, &h);
    case DSHIM_PS_MSG_PULL: {
        s->node->n_pull++;
        if (h.flags & DSHIM_PS_F_ROWS) {
            return rows_pull(s, worker, &h);
        }
        key_state_t *k = find_key(s, h.key, 0);
        if (k == NULL || k->stored == NULL) {
            char msg[160];
            snprintf(msg, sizeof(msg), "key %d was pulled before it was initialised: call kv.init first", h.key);
            return reply_error(s, worker, h.seq, msg);
        }
        return answer_stored(s, k, worker, h.seq);
    }
    case DSHIM_PS_MSG_CMD:
        s->node->n_cmd++;
        return handle_command(s, worker, &h);
    case DSHIM_PS_MSG_BYE:
        /* the worker leaves on purpose: the end of its connection is no death */
        close(s->worker_fds[worker]);
        s->worker_fds[worker] = -1;
        s->departed++;
        DSHIM_PS_INFO(&s->node->env, s->node->rank, "worker %d left", worker);
        if (s->departed == s->node->env.num_workers) {
            s->stop = 1; /* every worker left without kStopServer (SetBarrierBeforeExit(0)) */
            s->all_left = 1;
        }
        return DSHIM_OK;
    default:
        return dshim_error(DSHIM_ERR_PROTOCOL, "server %d: unexpected %s from worker %d", s->node->rank,
                           dshim_ps_msg_name(h.type), worker);
    }
}

static void accept_worker(server_t *s)
{
    int fd = accept4(s->node->listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) {
        return;
    }
    dshim_ps_hdr_t h;
    char token[sizeof(s->node->env.token)];
    if (dshim_ps_recv_hdr(fd, &h, dshim_now() + 10) != DSHIM_OK || h.type != DSHIM_PS_MSG_WHELLO || h.key < 0 ||
        h.key >= s->node->env.num_workers || s->worker_fds[h.key] >= 0 || h.len != sizeof(token) ||
        dshim_ps_recv_body(fd, token, sizeof(token), dshim_now() + 10) != DSHIM_OK ||
        memcmp(token, s->node->env.token, sizeof(token)) != 0) {
        fprintf(stderr, "[dshim-ps server %d] refused a data connection that is not a worker of this job\n",
                s->node->rank);
        close(fd);
        return;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    dshim_net_tune(fd, 4u << 20);
    s->worker_fds[h.key] = fd;
    s->nconnected++;
    DSHIM_PS_INFO(&s->node->env, s->node->rank, "worker %d connected", h.key);
}

dshim_status_t dshim_ps_server_run(dshim_ps_node_t *node, const dshim_ps_server_ops_t *ops_in)
{
    static const dshim_ps_server_ops_t plain = {0};
    dshim_ps_server_ops_t ops = ops_in ? *ops_in : plain;
    if (ops.alloc == NULL) {
        ops.alloc = plain_alloc;
        ops.release = plain_release;
    }
    if (ops.wait == NULL) {
        ops.wait = plain_wait;
    }
    if (ops.has_updater == NULL) {
        ops.has_updater = plain_has_updater;
    }
    server_t s;
    memset(&s, 0, sizeof(s));
    s.node = node;
    s.multi_precision = dshim_config()->ps_float32_master;
    s.ops = &ops;
    s.threshold = DSHIM_TWOBIT_DEFAULT_THRESHOLD;
    int nw = node->env.num_workers;
    s.worker_fds = malloc(sizeof(int) * (size_t)nw);
    struct pollfd *pfds = calloc((size_t)nw + 2, sizeof(*pfds));
    if (s.worker_fds == NULL || pfds == NULL) {
        free(s.worker_fds);
        free(pfds);
        return dshim_error(DSHIM_ERR_NOMEM, "server: out of memory");
    }
    for (int i = 0; i < nw; i++) {
        s.worker_fds[i] = -1;
    }
    dshim_status_t st = DSHIM_OK;
    while (!s.stop && st == DSHIM_OK) {
        for (int i = 0; i < nw; i++) {
            pfds[i].fd = s.worker_fds[i];
            pfds[i].events = POLLIN;
            pfds[i].revents = 0;
        }
        pfds[nw].fd = s.nconnected < nw ? node->listen_fd : -1;
        pfds[nw].events = POLLIN;
        pfds[nw].revents = 0;
        pfds[nw + 1].fd = node->wake_pipe[0];
        pfds[nw + 1].events = POLLIN;
        pfds[nw + 1].revents = 0;
        int r = poll(pfds, (nfds_t)nw + 2, 1000);
        if (r < 0 && errno != EINTR) {
            st = dshim_error(DSHIM_ERR_SYSTEM, "server: poll: %s", strerror(errno));
            break;
        }
        if (dshim_ps_failure(node) != NULL) {
            st = dshim_error(DSHIM_ERR_PEER, "%s", dshim_ps_failure(node));
            break;
        }
        if (dshim_ps_stop_requested(node)) {
            break; /* every worker is gone without kStopServer */
        }
        if (pfds[nw].revents & POLLIN) {
            accept_worker(&s);
        }
        for (int i = 0; i < nw && st == DSHIM_OK && !s.stop; i++) {
            if (dshim_ps_conn_ready(&pfds[i])) {
                st = handle_message(&s, i);
            }
        }
    }
    for (size_t i = 0; i < s.nkeys; i++) {
        key_state_t *k = &s.keys[i];
        if (k->stored_cookie) {
            ops.release(ops.ctx, k->stored_cookie);
        }
        if (k->merged_cookie) {
            ops.release(ops.ctx, k->merged_cookie);
        }
        if (k->master_cookie) {
            ops.release(ops.ctx, k->master_cookie);
        }
        free(k->wide);
        free(k->decomp);
        free(k->present);
        free(k->waiters);
        for (size_t j = 0; j < k->cap_pieces; j++) {
            free(k->pieces[j].waiters);
        }
        free(k->pieces);
    }
    free(s.keys);
    free(s.buf);
    for (int i = 0; i < nw; i++) {
        if (s.worker_fds[i] >= 0) {
            close(s.worker_fds[i]);
        }
    }
    free(s.worker_fds);
    free(pfds);
    if (st == DSHIM_OK && s.all_left) {
        pthread_mutex_lock(&node->mu);
        node->stop_requested = 1; /* no final barrier: the workers did not do one */
        pthread_mutex_unlock(&node->mu);
    }
    return st;
}

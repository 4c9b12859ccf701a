/* Parameter server: keys pushed in pieces (DSHIM_PS_F_PIECE, sync mode only).
 * A worker whose server is on another host cuts a key into pieces; each piece
 * [off, off + cnt) is summed over the workers.  Without an updater a complete
 * piece is the value at once, stored and answered on its own, so the first
 * pieces travel back while later ones still arrive; with one, the updater runs
 * once the whole key is complete, then every piece is answered.  A worker
 * pushing the key whole (its server on its host) counts toward every piece of
 * the round. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_proto.h"
#include "ps_server_impl.h"
#include "status.h"

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
        DSHIM_CHECK(dshim_ps_srv_reply(s, p->waiters[i].worker, p->waiters[i].seq, DSHIM_PS_MSG_REPLY,
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
        DSHIM_CHECK(dshim_ps_srv_update_value(s, k));
        for (size_t j = 0; j < k->npieces; j++) {
            DSHIM_CHECK(answer_piece(s, k, &k->pieces[j]));
        }
    }
    k->npieces = 0;
    return dshim_ps_srv_answer_whole_waiters(s, k);
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
dshim_status_t dshim_ps_srv_whole_into_pieces(server_t *s, int worker, const dshim_ps_hdr_t *h, key_state_t *k)
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
        return dshim_ps_srv_reply_error(s, worker, h->seq, msg);
    }
    if ((h->flags & DSHIM_PS_F_COMPRESSED) || k->master != NULL) {
        snprintf(msg, sizeof(msg), "key %d: a compressed or non-float32 whole push cannot join a round pushed in "
                 "pieces: set DSHIM_PS_PIECE=0", h->key);
        return dshim_ps_srv_reply_error(s, worker, h->seq, msg);
    }
    dshim_ps_srv_note_push(s, k, worker);
    s->ops->wait(s->ops->ctx, k->merged_cookie, 1);
    char *merged = k->merged;
    if (k->nwaiters > 0) {
        DSHIM_CHECK(dshim_ps_add(merged, s->buf, k->n, k->dtype)); /* every element has a value already */
    } else {
        /* the pieces never overlap (dshim_ps_srv_handle_piece checks): walk them in order */
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
dshim_status_t dshim_ps_srv_handle_piece(server_t *s, int worker, const dshim_ps_hdr_t *h)
{
    char msg[320];
    const int nw = s->node->env.num_workers;
    const size_t es = dshim_ps_dtype_size(h->dtype);
    key_state_t *k = dshim_ps_srv_find_key(s, h->key, 0);
    if (k == NULL || k->stored == NULL) {
        snprintf(msg, sizeof(msg), "key %d: worker %d pushed a piece of it before it was initialised: call kv.init "
                 "first", h->key, worker);
        return dshim_ps_srv_reply_error(s, worker, h->seq, msg);
    }
    const size_t cnt = es ? h->len / es : 0;
    if (!s->sync_mode || (h->flags & DSHIM_PS_F_COMPRESSED) || k->master != NULL || es == 0 || h->len % es != 0 ||
        h->dtype != k->dtype || h->nelem != k->n || cnt == 0 || h->off > k->n || cnt > k->n - h->off) {
        snprintf(msg, sizeof(msg), "key %d: worker %d pushed a piece of %zu elements at %llu of a %llu-element key "
                 "(dtype %d), which this server (%s mode, the key: %zu elements of dtype %d%s) cannot take: are the "
                 "workers running another dshim version? Set DSHIM_PS_PIECE=0 to push whole keys", h->key, worker,
                 cnt, (unsigned long long)h->off, (unsigned long long)h->nelem, h->dtype,
                 s->sync_mode ? "sync" : "async", k->n, k->dtype, k->master ? ", float32 master copy" : "");
        return dshim_ps_srv_reply_error(s, worker, h->seq, msg);
    }
    for (size_t i = 0; i < k->npieces; i++) {
        const piece_t *q = &k->pieces[i];
        if ((q->off == h->off && q->cnt != cnt) || (q->off != h->off && h->off < q->off + q->cnt &&
                                                    q->off < h->off + cnt)) {
            snprintf(msg, sizeof(msg), "key %d: the workers cut it into different pieces ([%zu, +%zu) and [%llu, "
                     "+%zu)): set the same DSHIM_PS_PIECE for every worker", h->key, q->off, q->cnt,
                     (unsigned long long)h->off, cnt);
            return dshim_ps_srv_reply_error(s, worker, h->seq, msg);
        }
    }
    piece_t *p = find_piece(s, k, h->off);
    if (p == NULL) {
        return dshim_error(DSHIM_ERR_NOMEM, "server %d: out of memory", s->node->rank);
    }
    if (p->done || p->npushed + k->nwaiters >= nw) {
        snprintf(msg, sizeof(msg), "key %d: worker %d pushed the piece at %zu once more than the %d workers there "
                 "are in this round", h->key, worker, p->off, nw);
        return dshim_ps_srv_reply_error(s, worker, h->seq, msg);
    }
    dshim_ps_srv_note_push(s, k, worker);
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

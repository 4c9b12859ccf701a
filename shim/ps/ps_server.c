/* Parameter server: a server's event loop with MXNet's KVStoreDistServer
 * semantics — first push of a key initialises it; in sync mode pushes are
 * summed until every worker pushed, then the updater runs (or the sum is
 * stored) and only then are the pushes answered; async mode applies each push
 * at once.  Runs on the calling (Python main) thread, as MXNet runs its
 * updater and controller there.  The loop never waits inside one message:
 * it reads and writes each worker's connection as far as the socket allows
 * (conn_t in ps_server_impl.h says why).  This file: the loop (accept, dispatch), the
 * keys, whole pushes and pulls, commands; keys pushed in pieces are in
 * ps_server_pieces.c, row_sparse keys in ps_server_rows.c. */
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
#include "ps_server_impl.h"
#include "ps_twobit.h"
#include "status.h"

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

key_state_t *dshim_ps_srv_find_key(server_t *s, int key, int create)
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

/* The error for an answer that cannot be written: the scheduler's notice
 * names the dead worker best. */
static dshim_status_t answer_failed(server_t *s, int worker)
{
    const char *f = dshim_ps_wait_failure(s->node, DSHIM_PS_NOTICE_S);
    if (f != NULL) {
        return dshim_error(DSHIM_ERR_PEER, "%s", f);
    }
    return dshim_error(DSHIM_ERR_PEER, "server %d: cannot answer worker %d: its connection closed (it died)",
                       s->node->rank, worker);
}

/* Writes what the socket takes now: the bytes written, or -1 when the
 * connection is gone. */
static ssize_t write_some(int fd, const struct iovec *iov, int n)
{
    struct msghdr m;
    memset(&m, 0, sizeof(m));
    m.msg_iov = (struct iovec *)iov;
    m.msg_iovlen = (size_t)n;
    ssize_t r = sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r < 0) {
        return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
    }
    return r;
}

/* Writes what is queued for worker as far as the socket takes it; -1 when
 * the connection is gone. */
static int conn_flush_some(server_t *s, int worker)
{
    conn_t *c = &s->conns[worker];
    if (c->out_off == c->out_len) {
        return 0;
    }
    struct iovec iov = {.iov_base = c->out + c->out_off, .iov_len = c->out_len - c->out_off};
    ssize_t r = write_some(s->worker_fds[worker], &iov, 1);
    if (r < 0) {
        return -1;
    }
    c->out_off += (size_t)r;
    if (c->out_off == c->out_len) {
        c->out_off = c->out_len = 0;
    }
    return 0;
}

dshim_status_t dshim_ps_srv_flush(server_t *s, int worker, double deadline)
{
    conn_t *c = &s->conns[worker];
    while (c->out_off < c->out_len) {
        if (conn_flush_some(s, worker) != 0) {
            return DSHIM_ERR_PEER;
        }
        if (c->out_off < c->out_len) {
            struct pollfd p = {.fd = s->worker_fds[worker], .events = POLLOUT};
            if (deadline > 0 && dshim_now() > deadline) { /* 0: none (dshim_ps_deadline) */
                return DSHIM_ERR_TIMEOUT;
            }
            poll(&p, 1, 100);
        }
    }
    return DSHIM_OK;
}

/* Keeps bytes [from, len) of header + payload for the loop to write. */
static dshim_status_t conn_queue(server_t *s, int worker, const dshim_ps_hdr_t *h, const void *payload, size_t from)
{
    conn_t *c = &s->conns[worker];
    size_t total = sizeof(*h) + h->len;
    size_t need = c->out_len + (total - from);
    if (c->out_off > 0 && c->out_off == c->out_len) {
        c->out_off = c->out_len = 0;
        need = total - from;
    }
    if (need > c->out_cap) {
        size_t cap = c->out_cap ? c->out_cap : 65536;
        while (cap < need) {
            cap *= 2;
        }
        char *o = realloc(c->out, cap);
        if (o == NULL) {
            return dshim_error(DSHIM_ERR_NOMEM, "server %d: cannot hold a %zu-byte answer to worker %d",
                               s->node->rank, total, worker);
        }
        c->out = o;
        c->out_cap = cap;
    }
    if (from < sizeof(*h)) {
        memcpy(c->out + c->out_len, (const char *)h + from, sizeof(*h) - from);
        c->out_len += sizeof(*h) - from;
        from = sizeof(*h);
    }
    if (total > from) {
        memcpy(c->out + c->out_len, (const char *)payload + (from - sizeof(*h)), total - from);
        c->out_len += total - from;
    }
    return DSHIM_OK;
}

dshim_status_t dshim_ps_srv_reply(server_t *s, int worker, uint32_t seq, int type, const void *payload, size_t len)
{
    dshim_ps_hdr_t h;
    dshim_ps_hdr_init(&h, type, 0, len);
    h.seq = seq;
    DSHIM_PS_TRACE(&s->node->env, s->node->rank, "%s seq %u (%zu bytes) -> worker %d", dshim_ps_msg_name(type),
                   seq, len, worker);
    s->node->bytes_out += len;
    conn_t *c = &s->conns[worker];
    if (s->worker_fds[worker] < 0 || conn_flush_some(s, worker) != 0) {
        return answer_failed(s, worker);
    }
    ssize_t done = 0;
    if (c->out_off == c->out_len) {
        /* nothing queued before it: as much as the socket takes goes now */
        struct iovec iov[2] = {{.iov_base = &h, .iov_len = sizeof(h)}, {.iov_base = (void *)payload, .iov_len = len}};
        done = write_some(s->worker_fds[worker], iov, len > 0 ? 2 : 1);
        if (done < 0) {
            return answer_failed(s, worker);
        }
    }
    if ((size_t)done == sizeof(h) + len) {
        return DSHIM_OK;
    }
    return conn_queue(s, worker, &h, payload, (size_t)done);
}

void dshim_ps_srv_say_waiting(server_t *s, int worker)
{
    conn_t *c = &s->conns[worker];
    if (s->worker_fds[worker] < 0 || conn_flush_some(s, worker) != 0) {
        return;
    }
    dshim_ps_hdr_t h;
    dshim_ps_hdr_init(&h, DSHIM_PS_MSG_WAITING, 0, 0);
    ssize_t done = 0;
    if (c->out_off == c->out_len) {
        struct iovec iov = {.iov_base = &h, .iov_len = sizeof(h)};
        done = write_some(s->worker_fds[worker], &iov, 1);
        if (done < 0 || (size_t)done == sizeof(h)) {
            return;
        }
    }
    conn_queue(s, worker, &h, NULL, (size_t)done);
}

dshim_status_t dshim_ps_srv_reply_error(server_t *s, int worker, uint32_t seq, const char *text)
{
    fprintf(stderr, "[dshim-ps server %d] %s\n", s->node->rank, text);
    return dshim_ps_srv_reply(s, worker, seq, DSHIM_PS_MSG_ERROR, text, strlen(text));
}

static dshim_status_t answer_stored(server_t *s, key_state_t *k, int worker, uint32_t seq)
{
    s->ops->wait(s->ops->ctx, k->stored_cookie, 0);
    return dshim_ps_srv_reply(s, worker, seq, DSHIM_PS_MSG_REPLY, k->stored, k->n * dshim_ps_dtype_size(k->dtype));
}

/* The merged pushes become the key's value: through the updater, or as they are. */
dshim_status_t dshim_ps_srv_update_value(server_t *s, key_state_t *k)
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

dshim_status_t dshim_ps_srv_answer_whole_waiters(server_t *s, key_state_t *k)
{
    dshim_ps_srv_note_answered(s, k);
    for (int i = 0; i < k->nwaiters; i++) {
        waiter_t *w = &k->waiters[i];
        DSHIM_CHECK(w->want_pull ? answer_stored(s, k, w->worker, w->seq)
                                 : dshim_ps_srv_reply(s, w->worker, w->seq, DSHIM_PS_MSG_REPLY, NULL, 0));
    }
    k->nwaiters = 0;
    s->ops->wait(s->ops->ctx, k->stored_cookie, 0);
    return DSHIM_OK;
}

/* Every worker pushed (sync) or one did (async): update, then answer. */
static dshim_status_t apply_updates(server_t *s, key_state_t *k)
{
    DSHIM_CHECK(dshim_ps_srv_update_value(s, k));
    return dshim_ps_srv_answer_whole_waiters(s, k);
}

/* Gives key k (not float32) its float32 master copy, from its stored value;
 * `merged` becomes float32 too.  At initialisation, or when
 * kSetMultiPrecision comes after keys exist (MXNet's
 * CreateMultiPrecisionCopies). */
dshim_status_t dshim_ps_srv_make_master(server_t *s, key_state_t *k)
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

static dshim_status_t handle_push(server_t *s, int worker, const dshim_ps_hdr_t *h)
{
    if (h->flags & DSHIM_PS_F_ROWS) {
        return dshim_ps_srv_rows_push(s, worker, h);
    }
    if (h->flags & DSHIM_PS_F_PIECE) {
        return dshim_ps_srv_handle_piece(s, worker, h);
    }
    int compressed = (h->flags & DSHIM_PS_F_COMPRESSED) != 0;
    size_t esize = dshim_ps_dtype_size(h->dtype);
    char msg[256];
    if (esize == 0) {
        snprintf(msg, sizeof(msg), "key %d: unsupported MXNet dtype %d", h->key, h->dtype);
        return dshim_ps_srv_reply_error(s, worker, h->seq, msg);
    }
    if (compressed && (h->dtype != 0 || h->len != dshim_twobit_words(h->nelem) * 4)) {
        snprintf(msg, sizeof(msg), "key %d: a 2-bit push must carry float32 values (MXNet: gradient compression is "
                 "only supported for float32)", h->key);
        return dshim_ps_srv_reply_error(s, worker, h->seq, msg);
    }
    if (!compressed && h->len % esize != 0) {
        /* the values are copied by h->len into a key sized by whole elements:
         * a ragged length would overrun it (found by tests/fuzz/fuzz_ps) */
        snprintf(msg, sizeof(msg), "key %d: a push of %llu bytes is not a whole number of %zu-byte values of dtype "
                 "%d: are the workers running another dshim version?", h->key, (unsigned long long)h->len, esize,
                 h->dtype);
        return dshim_ps_srv_reply_error(s, worker, h->seq, msg);
    }
    size_t n = compressed ? h->nelem : h->len / esize;
    key_state_t *k = dshim_ps_srv_find_key(s, h->key, 1);
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
            DSHIM_CHECK(dshim_ps_srv_make_master(s, k));
        }
        dshim_ps_srv_note_init(s, k, worker);
        DSHIM_PS_TRACE(&s->node->env, s->node->rank, "key %d initialised by worker %d (%zu elements)", h->key,
                       worker, n);
        return (h->flags & DSHIM_PS_F_PULL) ? answer_stored(s, k, worker, h->seq)
                                            : dshim_ps_srv_reply(s, worker, h->seq, DSHIM_PS_MSG_REPLY, NULL, 0);
    }
    if (n != k->n || h->dtype != k->dtype) {
        snprintf(msg, sizeof(msg), "key %d: worker %d pushed %zu elements of dtype %d but the key holds %zu of dtype "
                 "%d (the value size cannot change)", h->key, worker, n, h->dtype, k->n, k->dtype);
        return dshim_ps_srv_reply_error(s, worker, h->seq, msg);
    }
    if (k->nwaiters > 0 && k->round_rows) {
        snprintf(msg, sizeof(msg), "key %d: worker %d pushed dense values in a round where others pushed row_sparse "
                 "ones: every worker must push the key with the same storage type", h->key, worker);
        return dshim_ps_srv_reply_error(s, worker, h->seq, msg);
    }
    if (!s->sync_mode && !s->ops->has_updater(s->ops->ctx)) {
        snprintf(msg, sizeof(msg), "key %d: an async kvstore needs an optimizer on the servers (MXNet: \"Updater needs "
                 "to be set for async mode\"): call kv.set_optimizer first", h->key);
        return dshim_ps_srv_reply_error(s, worker, h->seq, msg);
    }
    if (s->sync_mode && (k->npieces > 0 || k->pieces_done > 0)) {
        return dshim_ps_srv_whole_into_pieces(s, worker, h, k); /* others push this round's values in pieces */
    }
    dshim_ps_srv_note_push(s, k, worker);
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
            return dshim_ps_srv_reply_error(s, worker, h->seq, "bad gradient compression parameters");
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
                    return dshim_ps_srv_reply_error(s, worker, h->seq, msg);
                }
                DSHIM_CHECK(dshim_ps_srv_make_master(s, k));
            }
        }
        break;
    case DSHIM_PS_CMD_PROFILER: {
        /* MXNet's profiler of this server process, configured/started/dumped as asked */
        char err[600] = "this server has no profiler to command (a server without MXNet)";
        if (s->ops->profiler == NULL || s->ops->profiler(s->ops->ctx, body, err, sizeof(err)) != 0) {
            return dshim_ps_srv_reply_error(s, worker, h->seq, err);
        }
        break;
    }
    default:
        if (s->ops->controller != NULL && s->ops->controller(s->ops->ctx, h->key, body) != 0) {
            return dshim_ps_srv_reply_error(s, worker, h->seq, "the server's controller failed (see its output)");
        }
        break;
    }
    DSHIM_PS_INFO(&s->node->env, s->node->rank, "command %d from worker %d", h->key, worker);
    return dshim_ps_srv_reply(s, worker, h->seq, DSHIM_PS_MSG_REPLY, NULL, 0);
}

/* Reads a payload of len bytes into s->buf, with room for a NUL after it.
 * The buffer grows with the bytes that arrive (at least 1 MiB at a time,
 * doubling), not with the length the header claims: a garbled or hostile
 * length costs no more memory than the bytes really sent, and a length of
 * 2^64 - 1 cannot wrap the size to allocate (found by tests/fuzz/fuzz_ps). */
static dshim_status_t recv_payload(server_t *s, int fd, uint64_t len, double deadline)
{
    if (len >= SIZE_MAX) {
        return DSHIM_ERR_PROTOCOL;
    }
    size_t done = 0;
    for (;;) {
        if ((size_t)len + 1 > s->buf_cap) {
            size_t grow = s->buf_cap < ((size_t)1 << 20) ? ((size_t)1 << 20) : s->buf_cap * 2;
            grow = grow < (size_t)len + 1 ? grow : (size_t)len + 1;
            char *b = realloc(s->buf, grow);
            if (b == NULL) {
                return dshim_error(DSHIM_ERR_NOMEM, "server: cannot hold a %llu-byte message",
                                   (unsigned long long)len);
            }
            s->buf = b;
            s->buf_cap = grow;
        }
        size_t upto = s->buf_cap - 1 < (size_t)len ? s->buf_cap - 1 : (size_t)len;
        DSHIM_CHECK(dshim_ps_recv_body(fd, s->buf + done, upto - done, deadline));
        done = upto;
        if (done == len) {
            return DSHIM_OK;
        }
    }
}

/* The error for a connection that ended or broke inside a message. */
static dshim_status_t worker_gone(server_t *s, int worker)
{
    /* the scheduler's notice names the dead process best: give it a moment */
    const char *f = dshim_ps_wait_failure(s->node, DSHIM_PS_NOTICE_S);
    if (f != NULL) {
        return dshim_error(DSHIM_ERR_PEER, "%s", f);
    }
    return dshim_error(DSHIM_ERR_PEER, "server %d: worker %d closed its connection: it died", s->node->rank, worker);
}

static dshim_status_t dispatch(server_t *s, int worker, dshim_ps_hdr_t h);

/* One whole message from worker, waiting for it (tests/fuzz/fuzz_ps.c). */
__attribute__((unused)) static dshim_status_t handle_message(server_t *s, int worker)
{
    int fd = s->worker_fds[worker];
    double deadline = dshim_ps_deadline(&s->node->env, dshim_now());
    dshim_ps_hdr_t h;
    dshim_status_t st = dshim_ps_recv_hdr(fd, &h, deadline);
    if (st == DSHIM_OK) {
        st = recv_payload(s, fd, h.len, deadline);
        if (st == DSHIM_ERR_NOMEM) {
            return st;
        }
    }
    if (st != DSHIM_OK) {
        return worker_gone(s, worker);
    }
    return dispatch(s, worker, h);
}

/* Reads what worker's connection has (the loop's way): at most one message
 * is handled per call, so every connection gets its turn; a message still
 * arriving is kept in the connection's state. */
static dshim_status_t conn_read(server_t *s, int worker)
{
    conn_t *c = &s->conns[worker];
    int fd = s->worker_fds[worker];
    for (;;) {
        char *dst;
        size_t want;
        if (c->hgot < sizeof(c->h)) {
            dst = (char *)&c->h + c->hgot;
            want = sizeof(c->h) - c->hgot;
        } else {
            /* grown with the bytes that really come, not with the length the
             * header claims (as recv_payload: found by tests/fuzz/fuzz_ps) */
            if (c->got + 1 >= c->cap && c->cap < (size_t)c->h.len + 1) {
                size_t grow = c->cap < ((size_t)1 << 20) ? ((size_t)1 << 20) : c->cap * 2;
                grow = grow < (size_t)c->h.len + 1 ? grow : (size_t)c->h.len + 1;
                char *b = realloc(c->buf, grow);
                if (b == NULL) {
                    return dshim_error(DSHIM_ERR_NOMEM, "server: cannot hold a %llu-byte message",
                                       (unsigned long long)c->h.len);
                }
                c->buf = b;
                c->cap = grow;
            }
            dst = c->buf + c->got;
            size_t upto = c->cap - 1 < (size_t)c->h.len ? c->cap - 1 : (size_t)c->h.len;
            want = upto - c->got;
        }
        if (want > 0) {
            ssize_t r = recv(fd, dst, want, MSG_DONTWAIT);
            if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
                return DSHIM_OK; /* the rest comes later */
            }
            if (r <= 0) {
                return worker_gone(s, worker);
            }
            if (c->hgot < sizeof(c->h)) {
                c->hgot += (size_t)r;
                if (c->hgot < sizeof(c->h)) {
                    continue;
                }
                if (c->h.magic != DSHIM_PS_MAGIC || c->h.len >= SIZE_MAX) {
                    return worker_gone(s, worker);
                }
                c->got = 0;
            } else {
                c->got += (size_t)r;
            }
        }
        if (c->hgot < sizeof(c->h) || c->got < (size_t)c->h.len) {
            continue;
        }
        if (c->buf == NULL && (c->buf = malloc(1)) != NULL) {
            c->cap = 1;
        }
        if (c->buf == NULL) {
            return dshim_error(DSHIM_ERR_NOMEM, "server: out of memory");
        }
        /* the handlers read the payload from s->buf */
        char *keep = s->buf;
        size_t keep_cap = s->buf_cap;
        s->buf = c->buf;
        s->buf_cap = c->cap;
        dshim_ps_hdr_t h = c->h;
        c->hgot = c->got = 0;
        dshim_status_t st = dispatch(s, worker, h);
        s->buf = keep;
        s->buf_cap = keep_cap;
        return st;
    }
}

static dshim_status_t dispatch(server_t *s, int worker, dshim_ps_hdr_t h)
{
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
            return dshim_ps_srv_rows_pull(s, worker, &h);
        }
        key_state_t *k = dshim_ps_srv_find_key(s, h.key, 0);
        if (k == NULL || k->stored == NULL) {
            char msg[160];
            snprintf(msg, sizeof(msg), "key %d was pulled before it was initialised: call kv.init first", h.key);
            return dshim_ps_srv_reply_error(s, worker, h.seq, msg);
        }
        return answer_stored(s, k, worker, h.seq);
    }
    case DSHIM_PS_MSG_CMD:
        s->node->n_cmd++;
        return handle_command(s, worker, &h);
    case DSHIM_PS_MSG_BYE:
        /* the worker leaves on purpose: the end of its connection is no death;
         * it waited for its answers, so nothing it wants is still queued */
        s->conns[worker].out_off = s->conns[worker].out_len = 0;
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

/* DSHIM_OK also when a stranger was refused; an error only when no
 * descriptor is left (EMFILE/ENFILE): the worker knocking could never
 * connect, and the listener would stay readable and spin the loop. */
static dshim_status_t accept_worker(server_t *s)
{
    int fd = accept4(s->node->listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) {
        char who[96];
        snprintf(who, sizeof(who), "parameter server %d cannot accept a connection", s->node->rank);
        if (dshim_net_out_of_fds(errno, who)) {
            return dshim_error(DSHIM_ERR_SYSTEM, "%s", dshim_last_error());
        }
        return DSHIM_OK;
    }
    dshim_ps_hdr_t h;
    char token[sizeof(s->node->env.token)];
    const double hello_by = dshim_now() + DSHIM_PS_CONTROL_S;
    if (dshim_ps_recv_hdr(fd, &h, hello_by) != DSHIM_OK || h.type != DSHIM_PS_MSG_WHELLO || h.key < 0 ||
        h.key >= s->node->env.num_workers || s->worker_fds[h.key] >= 0 || h.len != sizeof(token) ||
        dshim_ps_recv_body(fd, token, sizeof(token), hello_by) != DSHIM_OK ||
        memcmp(token, s->node->env.token, sizeof(token)) != 0) {
        fprintf(stderr, "[dshim-ps server %d] refused a data connection that is not a worker of this job\n",
                s->node->rank);
        close(fd);
        return DSHIM_OK;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    dshim_net_tune(fd, 4u << 20);
    s->worker_fds[h.key] = fd;
    s->nconnected++;
    DSHIM_PS_INFO(&s->node->env, s->node->rank, "worker %d connected", h.key);
    return DSHIM_OK;
}

/* The server's state, released when it stops (also by tests/fuzz/fuzz_ps.c after each input). */
static void server_free(server_t *s)
{
    for (size_t i = 0; i < s->nkeys; i++) {
        key_state_t *k = &s->keys[i];
        if (k->stored_cookie) {
            s->ops->release(s->ops->ctx, k->stored_cookie);
        }
        if (k->merged_cookie) {
            s->ops->release(s->ops->ctx, k->merged_cookie);
        }
        if (k->master_cookie) {
            s->ops->release(s->ops->ctx, k->master_cookie);
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
    free(s->keys);
    free(s->buf);
    for (int i = 0; s->conns != NULL && i < s->node->env.num_workers; i++) {
        free(s->conns[i].buf);
        free(s->conns[i].out);
    }
    free(s->conns);
    free(s->last);
    for (int i = 0; i < s->node->env.num_workers; i++) {
        if (s->worker_fds[i] >= 0) {
            close(s->worker_fds[i]);
        }
    }
    free(s->worker_fds);
}

/* The server's state before its first worker (also by tests/fuzz/fuzz_ps.c for each input);
 * server_free releases it.  -1 when the worker table cannot be allocated. */
static int server_init(server_t *s, dshim_ps_node_t *node, const dshim_ps_server_ops_t *ops)
{
    memset(s, 0, sizeof(*s));
    s->node = node;
    s->multi_precision = dshim_config()->ps_float32_master;
    s->ops = ops;
    s->threshold = DSHIM_TWOBIT_DEFAULT_THRESHOLD;
    int nw = node->env.num_workers;
    s->worker_fds = malloc(sizeof(int) * (size_t)nw);
    s->last = calloc((size_t)nw, sizeof(*s->last));
    s->conns = calloc((size_t)nw, sizeof(*s->conns));
    if (s->worker_fds == NULL || s->last == NULL || s->conns == NULL) {
        free(s->last);
        s->last = NULL;
        free(s->conns);
        s->conns = NULL;
        return -1;
    }
    for (int i = 0; i < nw; i++) {
        s->worker_fds[i] = -1;
    }
    return 0;
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
    int nw = node->env.num_workers;
    int init = server_init(&s, node, &ops);
    struct pollfd *pfds = calloc((size_t)nw + 2, sizeof(*pfds));
    if (init != 0 || pfds == NULL) {
        free(s.worker_fds);
        free(pfds);
        return dshim_error(DSHIM_ERR_NOMEM, "server: out of memory");
    }
    dshim_status_t st = DSHIM_OK;
    while (!s.stop && st == DSHIM_OK) {
        for (int i = 0; i < nw; i++) {
            pfds[i].fd = s.worker_fds[i];
            pfds[i].events = (short)(POLLIN | (s.conns[i].out_off < s.conns[i].out_len ? POLLOUT : 0));
            pfds[i].revents = 0;
        }
        pfds[nw].fd = s.nconnected < nw ? node->listen_fd : -1;
        pfds[nw].events = POLLIN;
        pfds[nw].revents = 0;
        pfds[nw + 1].fd = node->wake_pipe[0];
        pfds[nw + 1].events = POLLIN;
        pfds[nw + 1].revents = 0;
        /* woken at least as often as a waiting round's WAITING is due */
        int r = poll(pfds, (nfds_t)nw + 2, (int)(dshim_ps_alive_every(&node->env) * 1000));
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
        if ((pfds[nw].revents & POLLIN) && (st = accept_worker(&s)) != DSHIM_OK) {
            break;
        }
        for (int i = 0; i < nw && st == DSHIM_OK && !s.stop; i++) {
            if (pfds[i].fd >= 0 && (pfds[i].revents & POLLOUT) && conn_flush_some(&s, i) != 0) {
                st = answer_failed(&s, i);
            } else if (dshim_ps_conn_ready(&pfds[i])) {
                st = conn_read(&s, i);
            }
        }
        if (st == DSHIM_OK && !s.stop) {
            st = dshim_ps_srv_check_stalls(&s); /* a round no worker pushed for long: warn, or end the job */
        }
    }
    /* the last answers (kStopServer's among them) still go out */
    for (int i = 0; i < nw && st == DSHIM_OK; i++) {
        if (s.worker_fds[i] >= 0 && dshim_ps_srv_flush(&s, i, dshim_ps_deadline(&node->env, dshim_now())) != DSHIM_OK) {
            st = answer_failed(&s, i);
        }
    }
    server_free(&s);
    free(pfds);
    if (st == DSHIM_OK && s.all_left) {
        pthread_mutex_lock(&node->mu);
        node->stop_requested = 1; /* no final barrier: the workers did not do one */
        pthread_mutex_unlock(&node->mu);
    }
    return st;
}

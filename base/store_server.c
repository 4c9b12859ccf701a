/*
 * Rendezvous store server: one background thread runs a poll() loop over an
 * eventfd (stop), the listening socket and every client socket.
 *
 * Every client socket is non-blocking with its own input and output buffer,
 * and the loop only ever reads the bytes of the message in progress, so a
 * client that sends half a message, never reads its replies, or sends
 * nothing at all costs one slot and never delays anybody else.  A GET for a
 * missing key parks its connection (no polling): setting the key answers it.
 * The wire format is in store_proto.h.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "net.h"
#include "status.h"
#include "store.h"
#include "store_proto.h"
#include "store_server_impl.h"

/* ---- connections ---- */

static void conn_close(conn_t *c)
{
    if (c->fd >= 0) {
        close(c->fd);
        c->fd = -1;
    }
    c->dead = 1;
}

void dshim_store_conn_free(conn_t *c)
{
    if (c->fd >= 0) {
        close(c->fd);
    }
    free(c->in);
    free(c->out);
    free(c->park_key);
    free(c);
}

static void conn_reject(dshim_store_server_t *srv, conn_t *c, const char *reason)
{
    DSHIM_WARN("store: rejected connection from %s: %s", c->peer, reason);
    __atomic_add_fetch(&srv->rejected, 1, __ATOMIC_RELAXED);
    conn_close(c);
}

static int buf_reserve(uint8_t **buf, size_t *cap, size_t need)
{
    if (*cap >= need) {
        return 0;
    }
    uint8_t *p = realloc(*buf, need);
    if (!p) {
        return -1;
    }
    *buf = p;
    *cap = need;
    return 0;
}

static void conn_flush(conn_t *c)
{
    while (c->out_off < c->out_len) {
        ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
        if (n > 0) {
            c->out_off += (size_t)n;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            return;  /* POLLOUT will bring us back */
        } else {
            DSHIM_TRACE("store: client %s went away while we answered: %s", c->peer,
                        n < 0 ? strerror(errno) : "short write");
            conn_close(c);
            return;
        }
    }
    c->out_len = c->out_off = 0;
    if (c->out_cap > KEEP_BUF_MAX) {
        free(c->out);
        c->out = NULL;
        c->out_cap = 0;
    }
}

static void conn_reply(conn_t *c, uint32_t status, const void *val, size_t vlen)
{
    if (buf_reserve(&c->out, &c->out_cap, DSHIM_STORE_REPLY_HDR + vlen) < 0) {
        DSHIM_WARN("store: out of memory for a %zu-byte reply to %s; closing that connection", vlen, c->peer);
        conn_close(c);
        return;
    }
    dshim_store_put_u32(c->out, status);
    dshim_store_put_u32(c->out + 4, c->seq);
    dshim_store_put_u64(c->out + 8, vlen);
    if (vlen) {
        memcpy(c->out + DSHIM_STORE_REPLY_HDR, val, vlen);
    }
    c->out_len = DSHIM_STORE_REPLY_HDR + vlen;
    c->out_off = 0;
    conn_flush(c);
}

static void conn_unpark(conn_t *c)
{
    free(c->park_key);
    c->park_key = NULL;
    c->state = CONN_READY;
    c->deadline = INFINITY;
}

/* A key just got a value: answer every GET parked on it. */
static void wake_waiters(dshim_store_server_t *srv, const kv_entry_t *e)
{
    for (size_t i = 0; i < srv->nconns; i++) {
        conn_t *c = srv->conns[i];
        if (!c->dead && c->state == CONN_PARKED && c->park_hash == e->hash && c->park_klen == e->klen &&
            memcmp(c->park_key, e->key, e->klen) == 0) {
            conn_unpark(c);
            conn_reply(c, DSHIM_STORE_ST_OK, e->val, e->vlen);
        }
    }
}

/* If key is `<prefix>failed` (or `failed`), the length of <prefix>; else -1. */
static long failed_prefix_len(const uint8_t *key, uint32_t klen)
{
    size_t n = strlen(DSHIM_STORE_FAILED_LEAF);
    if (klen < n || memcmp(key + klen - n, DSHIM_STORE_FAILED_LEAF, n) != 0) {
        return -1;
    }
    if (klen > n && key[klen - n - 1] != '/') {
        return -1;
    }
    return (long)(klen - n);
}

/* A failure was reported at e (`<prefix>failed`): answer every GET parked on
 * a key under <prefix> with it (they would otherwise wait for a key that
 * the failed rank will never set). */
static void fail_waiters(dshim_store_server_t *srv, const kv_entry_t *e, size_t plen)
{
    for (size_t i = 0; i < srv->nconns; i++) {
        conn_t *c = srv->conns[i];
        if (!c->dead && c->state == CONN_PARKED && c->park_klen >= plen && memcmp(c->park_key, e->key, plen) == 0) {
            conn_unpark(c);
            conn_reply(c, DSHIM_STORE_ST_FAILED, e->val, e->vlen);
        }
    }
}

/* The failure reported under a prefix of key (ending at a '/'), if any. */
static const kv_entry_t *failure_for(dshim_store_server_t *srv, const uint8_t *key, uint32_t klen)
{
    static const size_t leaf = sizeof(DSHIM_STORE_FAILED_LEAF) - 1;
    uint8_t probe[DSHIM_STORE_KEY_MAX + sizeof(DSHIM_STORE_FAILED_LEAF)];
    for (uint32_t p = 0; p < klen; p++) {
        if (p > 0 && key[p - 1] != '/') {
            continue;
        }
        memcpy(probe, key, p);
        memcpy(probe + p, DSHIM_STORE_FAILED_LEAF, leaf);
        uint32_t plen = p + (uint32_t)leaf;
        const kv_entry_t *f = *dshim_store_kv_slot(srv, probe, plen, dshim_store_key_hash(probe, plen));
        if (f) {
            return f;
        }
    }
    return NULL;
}

/* Counters are decimal text; anything else is not a counter. */
static int parse_counter(const uint8_t *val, size_t vlen, int64_t *out)
{
    char buf[24];
    if (vlen == 0 || vlen >= sizeof(buf)) {
        return -1;
    }
    memcpy(buf, val, vlen);
    buf[vlen] = '\0';
    for (size_t i = (buf[0] == '-') ? 1 : 0; i < vlen; i++) {
        if (buf[i] < '0' || buf[i] > '9') {
            return -1;
        }
    }
    char *end;
    errno = 0;
    long long v = strtoll(buf, &end, 10);
    if (errno || *end != '\0' || end == buf) {
        return -1;
    }
    *out = v;
    return 0;
}

static void handle_add(dshim_store_server_t *srv, conn_t *c, const uint8_t *key, uint32_t klen,
                       uint64_t hash, const uint8_t *val)
{
    int64_t delta = (int64_t)dshim_store_get_u64(val);
    int64_t cur = 0, sum;
    kv_entry_t *e = *dshim_store_kv_slot(srv, key, klen, hash);
    if (e && parse_counter(e->val, e->vlen, &cur) < 0) {
        conn_reply(c, DSHIM_STORE_ST_BAD_VALUE, NULL, 0);
        return;
    }
    if (__builtin_add_overflow(cur, delta, &sum)) {
        conn_reply(c, DSHIM_STORE_ST_BAD_VALUE, NULL, 0);
        return;
    }
    char text[24];
    int n = snprintf(text, sizeof(text), "%lld", (long long)sum);
    uint8_t *copy = malloc((size_t)n);
    if (copy) {
        memcpy(copy, text, (size_t)n);
        e = dshim_store_kv_put(srv, key, klen, hash, copy, (size_t)n);
    }
    if (!copy || !e) {
        DSHIM_WARN("store: out of memory storing a counter for %s; closing that connection", c->peer);
        conn_close(c);
        return;
    }
    uint8_t res[8];
    dshim_store_put_u64(res, (uint64_t)sum);
    conn_reply(c, DSHIM_STORE_ST_OK, res, sizeof(res));
    wake_waiters(srv, e);
}

static void handle_store(dshim_store_server_t *srv, conn_t *c, uint32_t kind, const uint8_t *key,
                         uint32_t klen, uint64_t hash, const uint8_t *val, size_t vlen)
{
    kv_entry_t *e = *dshim_store_kv_slot(srv, key, klen, hash);
    if (kind == DSHIM_STORE_REQ_SET_IF_ABSENT && e) {
        conn_reply(c, DSHIM_STORE_ST_EXISTS, NULL, 0);
        return;
    }
    /* malloc(0) may return NULL; one spare byte keeps NULL meaning failure */
    uint8_t *copy = malloc(vlen ? vlen : 1);
    if (copy) {
        memcpy(copy, val, vlen);
        e = dshim_store_kv_put(srv, key, klen, hash, copy, vlen);
    }
    if (!copy || !e) {
        DSHIM_WARN("store: out of memory storing a %zu-byte value for %s; closing that connection", vlen,
                   c->peer);
        conn_close(c);
        return;
    }
    conn_reply(c, DSHIM_STORE_ST_OK, NULL, 0);
    wake_waiters(srv, e);
    long plen = failed_prefix_len(key, klen);
    if (plen >= 0) {
        fail_waiters(srv, e, (size_t)plen);
    }
}

static void handle_get(dshim_store_server_t *srv, conn_t *c, uint32_t kind, const uint8_t *key,
                       uint32_t klen, uint64_t hash, uint32_t wait_ms)
{
    kv_entry_t *e = *dshim_store_kv_slot(srv, key, klen, hash);
    const kv_entry_t *f;
    if (e) {
        conn_reply(c, DSHIM_STORE_ST_OK, e->val, e->vlen);
    } else if (kind == DSHIM_STORE_REQ_TRY_GET) {
        conn_reply(c, DSHIM_STORE_ST_NOT_FOUND, NULL, 0);
    } else if ((f = failure_for(srv, key, klen)) != NULL) {
        conn_reply(c, DSHIM_STORE_ST_FAILED, f->val, f->vlen);
    } else if (wait_ms == 0) {
        conn_reply(c, DSHIM_STORE_ST_TIMEOUT, NULL, 0);
    } else {
        c->park_key = malloc(klen);
        if (!c->park_key) {
            DSHIM_WARN("store: out of memory parking a get from %s; closing that connection", c->peer);
            conn_close(c);
            return;
        }
        memcpy(c->park_key, key, klen);
        c->park_klen = klen;
        c->park_hash = hash;
        c->state = CONN_PARKED;
        c->deadline = (wait_ms == DSHIM_STORE_WAIT_FOREVER) ? INFINITY
                                                            : dshim_store_now() + wait_ms / 1000.0;
    }
}

static void handle_request(dshim_store_server_t *srv, conn_t *c)
{
    const uint8_t *h = c->in;
    uint32_t kind = dshim_store_get_u32(h);
    uint32_t klen = dshim_store_get_u32(h + 8);
    uint32_t arg = dshim_store_get_u32(h + 12);
    size_t vlen = (size_t)dshim_store_get_u64(h + 16);
    const uint8_t *key = h + DSHIM_STORE_REQ_HDR;
    const uint8_t *val = key + klen;
    uint64_t hash = dshim_store_key_hash(key, klen);

    switch (kind) {
    case DSHIM_STORE_REQ_SET:
    case DSHIM_STORE_REQ_SET_IF_ABSENT:
        handle_store(srv, c, kind, key, klen, hash, val, vlen);
        break;
    case DSHIM_STORE_REQ_GET:
    case DSHIM_STORE_REQ_TRY_GET:
        handle_get(srv, c, kind, key, klen, hash, arg);
        break;
    case DSHIM_STORE_REQ_ADD:
        handle_add(srv, c, key, klen, hash, val);
        break;
    case DSHIM_STORE_REQ_DELETE: {
        kv_entry_t **pp = dshim_store_kv_slot(srv, key, klen, hash);
        kv_entry_t *e = *pp;
        if (e) {
            *pp = e->next;
            free(e->val);
            free(e);
            srv->nkeys--;
        }
        conn_reply(c, e ? DSHIM_STORE_ST_OK : DSHIM_STORE_ST_NOT_FOUND, NULL, 0);
        break;
    }
    default:
        break;  /* kinds were validated with the header */
    }
}

/* Validates a request header; returns the reason it is malformed or NULL. */
static const char *check_request_header(const uint8_t *h, char *why, size_t why_len)
{
    uint32_t kind = dshim_store_get_u32(h);
    uint32_t klen = dshim_store_get_u32(h + 8);
    uint64_t vlen = dshim_store_get_u64(h + 16);
    if (kind == 0 || kind > DSHIM_STORE_REQ_LAST) {
        snprintf(why, why_len, "unknown message kind %u", kind);
    } else if (klen == 0 || klen > DSHIM_STORE_KEY_MAX) {
        snprintf(why, why_len, "key of %u bytes (allowed: 1 to %u)", klen, DSHIM_STORE_KEY_MAX);
    } else if (vlen > DSHIM_STORE_VALUE_MAX) {
        snprintf(why, why_len, "value of %llu bytes exceeds the %llu-byte limit", (unsigned long long)vlen,
                 DSHIM_STORE_VALUE_MAX);
    } else if ((kind == DSHIM_STORE_REQ_GET || kind == DSHIM_STORE_REQ_TRY_GET ||
                kind == DSHIM_STORE_REQ_DELETE) && vlen != 0) {
        snprintf(why, why_len, "message kind %u carries a value", kind);
    } else if (kind == DSHIM_STORE_REQ_ADD && vlen != 8) {
        snprintf(why, why_len, "add with a %llu-byte delta (must be 8)", (unsigned long long)vlen);
    } else {
        return NULL;
    }
    return why;
}

/* Equal-time comparison so a network peer cannot guess the token byte by
 * byte from response times; only the expected length shapes the loop. */
static int token_matches(const dshim_store_server_t *srv, const uint8_t *got, size_t got_len)
{
    volatile uint8_t diff = (uint8_t)(got_len != srv->token_len);
    for (size_t i = 0; i < srv->token_len; i++) {
        uint8_t g = (i < got_len) ? got[i] : 0;
        diff |= (uint8_t)(g ^ srv->token[i]);
    }
    return diff == 0;
}

/* Best effort: the ack tells an honest client why, then we close anyway. */
static void send_ack_now(conn_t *c, uint16_t status)
{
    uint8_t ack[DSHIM_STORE_ACK_LEN];
    dshim_store_put_u32(ack, DSHIM_STORE_MAGIC);
    dshim_store_put_u16(ack + 4, DSHIM_STORE_VERSION);
    dshim_store_put_u16(ack + 6, status);
    ssize_t n = send(c->fd, ack, sizeof(ack), MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)n;
}

/* The header of the current message is complete: validate it and size the
 * body.  Returns 0 to go on, -1 if the connection was rejected. */
static int on_header(dshim_store_server_t *srv, conn_t *c)
{
    char why[160];
    size_t body;
    if (c->state == CONN_HELLO) {
        uint32_t magic = dshim_store_get_u32(c->in);
        uint16_t version = dshim_store_get_u16(c->in + 4);
        uint32_t tlen = dshim_store_get_u32(c->in + 8);
        if (magic != DSHIM_STORE_MAGIC) {
            conn_reject(srv, c, "bad magic (not a dshim store client)");
            return -1;
        }
        if (version != DSHIM_STORE_VERSION) {
            send_ack_now(c, DSHIM_STORE_HELLO_BAD_VERSION);
            snprintf(why, sizeof(why), "protocol version %u, this store speaks %u", version, DSHIM_STORE_VERSION);
            conn_reject(srv, c, why);
            return -1;
        }
        if (tlen > DSHIM_STORE_TOKEN_MAX) {
            snprintf(why, sizeof(why), "token of %u bytes exceeds the %u-byte limit", tlen, DSHIM_STORE_TOKEN_MAX);
            conn_reject(srv, c, why);
            return -1;
        }
        body = tlen;
    } else {
        if (check_request_header(c->in, why, sizeof(why))) {
            conn_reject(srv, c, why);
            return -1;
        }
        c->seq = dshim_store_get_u32(c->in + 4);
        body = dshim_store_get_u32(c->in + 8) + (size_t)dshim_store_get_u64(c->in + 16);
    }
    c->in_need += body;
    c->in_body = 1;
    if (buf_reserve(&c->in, &c->in_cap, c->in_need) < 0) {
        DSHIM_WARN("store: out of memory for a %zu-byte message from %s; closing that connection", c->in_need,
                   c->peer);
        conn_close(c);
        return -1;
    }
    return 0;
}

static void on_hello(dshim_store_server_t *srv, conn_t *c)
{
    uint32_t tlen = dshim_store_get_u32(c->in + 8);
    if (!token_matches(srv, c->in + DSHIM_STORE_HELLO_HDR, tlen)) {
        send_ack_now(c, DSHIM_STORE_HELLO_BAD_TOKEN);
        conn_reject(srv, c, "bad job token");
        return;
    }
    c->state = CONN_READY;
    c->deadline = INFINITY;
    if (buf_reserve(&c->out, &c->out_cap, DSHIM_STORE_ACK_LEN) < 0) {
        conn_close(c);
        return;
    }
    dshim_store_put_u32(c->out, DSHIM_STORE_MAGIC);
    dshim_store_put_u16(c->out + 4, DSHIM_STORE_VERSION);
    dshim_store_put_u16(c->out + 6, DSHIM_STORE_HELLO_OK);
    c->out_len = DSHIM_STORE_ACK_LEN;
    c->out_off = 0;
    DSHIM_TRACE("store: accepted client %s", c->peer);
    conn_flush(c);
}

static void message_reset(conn_t *c)
{
    c->in_have = 0;
    c->in_body = 0;
    c->in_need = (c->state == CONN_HELLO) ? DSHIM_STORE_HELLO_HDR : DSHIM_STORE_REQ_HDR;
    if (c->in_cap > KEEP_BUF_MAX) {
        free(c->in);
        c->in = NULL;
        c->in_cap = 0;
    }
}

static void on_eof(dshim_store_server_t *srv, conn_t *c, int err)
{
    char why[160];
    if (c->state == CONN_HELLO) {
        snprintf(why, sizeof(why), "%s before completing the hello",
                 err ? strerror(err) : "closed the connection");
        conn_reject(srv, c, why);
    } else if (c->in_have > 0) {
        DSHIM_INFO("store: client %s disconnected in the middle of a request", c->peer);
        conn_close(c);
    } else {
        DSHIM_TRACE("store: client %s disconnected", c->peer);
        conn_close(c);
    }
}

/* Reads and handles messages while the connection can take one. */
static void conn_on_readable(dshim_store_server_t *srv, conn_t *c)
{
    size_t budget = READ_BUDGET;
    while (!c->dead && c->state != CONN_PARKED && c->out_len == 0 && budget > 0) {
        if (buf_reserve(&c->in, &c->in_cap, c->in_need) < 0) {
            conn_close(c);
            return;
        }
        size_t want = c->in_need - c->in_have;
        if (want > budget) {
            want = budget;
        }
        ssize_t n = recv(c->fd, c->in + c->in_have, want, 0);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            return;
        }
        if (n <= 0) {
            on_eof(srv, c, n < 0 ? errno : 0);
            return;
        }
        c->in_have += (size_t)n;
        budget -= (size_t)n;
        if (c->in_have < c->in_need) {
            continue;
        }
        if (!c->in_body) {
            if (on_header(srv, c) < 0) {
                return;
            }
            if (c->in_have < c->in_need) {
                continue;
            }
        }
        if (c->state == CONN_HELLO) {
            on_hello(srv, c);
        } else {
            handle_request(srv, c);
        }
        message_reset(c);
    }
}

static void conn_on_events(dshim_store_server_t *srv, conn_t *c, short re)
{
    if (re & POLLNVAL) {
        conn_close(c);
        return;
    }
    if (c->out_len > c->out_off && (re & (POLLOUT | POLLERR | POLLHUP))) {
        conn_flush(c);
    }
    if (c->dead) {
        return;
    }
    if (c->state == CONN_PARKED || c->out_len > 0) {
        /* not reading now; only notice that the client left */
        if (re & (POLLRDHUP | POLLHUP | POLLERR)) {
            DSHIM_TRACE("store: client %s left while %s", c->peer,
                        c->state == CONN_PARKED ? "waiting for a key" : "being answered");
            conn_close(c);
        }
        return;
    }
    if (re & (POLLIN | POLLRDHUP | POLLHUP | POLLERR)) {
        conn_on_readable(srv, c);
    }
}

/* Out of descriptors (EMFILE/ENFILE): the rank that knocks can never join,
 * and the job would wait DSHIM_CONNECT_TIMEOUT to blame it ("rank 1 did not
 * join").  The store fails the job instead, at once and once: the reason
 * goes to the key `failed` (store.h: a failure under the empty prefix
 * answers every GET of an absent key, parked or later), so the process
 * hosting the store, waiting for its peers' records, fails with that line
 * naming EMFILE and the limit, and so does every rank connected already. */
static void fail_out_of_fds(dshim_store_server_t *srv)
{
    char msg[512];
    snprintf(msg, sizeof(msg), "%s", dshim_last_error());
    DSHIM_WARN("%s", msg);
    srv->out_of_fds = 1;
    const uint8_t *key = (const uint8_t *)DSHIM_STORE_FAILED_LEAF;
    uint32_t klen = (uint32_t)strlen(DSHIM_STORE_FAILED_LEAF);
    uint64_t hash = dshim_store_key_hash(key, klen);
    if (*dshim_store_kv_slot(srv, key, klen, hash) != NULL) {
        return; /* a failure was reported already: it stays the first */
    }
    size_t len = strlen(msg);
    uint8_t *val = malloc(len);
    if (!val) {
        return;
    }
    memcpy(val, msg, len);
    kv_entry_t *e = dshim_store_kv_put(srv, key, klen, hash, val, len); /* takes val */
    if (e) {
        fail_waiters(srv, e, 0);
    }
}

/* A failed accept: back off instead of spinning on a listener that stays
 * readable, and say so at most once per 10 s (a line per 100 ms pause made
 * 1200 lines in a 120 s start-up). */
static void accept_failed(dshim_store_server_t *srv, int err)
{
    double now = dshim_store_now();
    srv->accept_pause_until = now + (err == EMFILE || err == ENFILE ? 1.0 : 0.1);
    char who[160];
    snprintf(who, sizeof(who), "the rendezvous store (host %s, pid %d) cannot accept a connection",
             dshim_log_hostname(), (int)getpid());
    if (dshim_net_out_of_fds(err, who)) {
        if (!srv->out_of_fds) {
            fail_out_of_fds(srv);
        }
        return;
    }
    srv->accept_failures++;
    if (now - srv->accept_warned_at >= 10.0) {
        DSHIM_WARN("store: accept failed: %s (%lu times since the last such line); pausing new connections for "
                   "100 ms each time", strerror(err), srv->accept_failures);
        srv->accept_warned_at = now;
        srv->accept_failures = 0;
    }
}

static void accept_all(dshim_store_server_t *srv)
{
    for (int k = 0; k < 64; k++) {
        struct sockaddr_in sa;
        socklen_t sl = sizeof(sa);
        int fd = accept4(srv->listen_fd, (struct sockaddr *)&sa, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) {
                continue;
            }
            if (errno != EAGAIN && errno != EWOULDBLOCK) {
                accept_failed(srv, errno);
            }
            return;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        conn_t *c = calloc(1, sizeof(*c));
        if (c && srv->nconns == srv->cap_conns) {
            size_t ncap = srv->cap_conns ? srv->cap_conns * 2 : 16;
            conn_t **p = realloc(srv->conns, ncap * sizeof(*p));
            if (p) {
                srv->conns = p;
                srv->cap_conns = ncap;
            }
        }
        if (!c || srv->nconns == srv->cap_conns) {
            DSHIM_WARN("store: out of memory accepting a connection; closing it");
            free(c);
            close(fd);
            return;
        }
        char ip[INET_ADDRSTRLEN] = "?";
        inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof(ip));
        snprintf(c->peer, sizeof(c->peer), "%s:%u", ip, (unsigned)ntohs(sa.sin_port));
        c->fd = fd;
        c->state = CONN_HELLO;
        c->deadline = dshim_store_now() + DSHIM_STORE_HELLO_TIMEOUT_S;
        message_reset(c);
        srv->conns[srv->nconns++] = c;
    }
}

/* Drops connections whose hello is late and answers GETs whose wait ran
 * out; returns the nearest remaining deadline. */
static double expire(dshim_store_server_t *srv, double now)
{
    double next = INFINITY;
    for (size_t i = 0; i < srv->nconns; i++) {
        conn_t *c = srv->conns[i];
        if (c->dead || c->deadline == INFINITY) {
            continue;
        }
        if (now >= c->deadline) {
            if (c->state == CONN_HELLO) {
                char why[64];
                snprintf(why, sizeof(why), "no hello within %.0f s", DSHIM_STORE_HELLO_TIMEOUT_S);
                conn_reject(srv, c, why);
            } else if (c->state == CONN_PARKED) {
                conn_unpark(c);
                conn_reply(c, DSHIM_STORE_ST_TIMEOUT, NULL, 0);
            }
        } else if (c->deadline < next) {
            next = c->deadline;
        }
    }
    return next;
}

static void sweep(dshim_store_server_t *srv)
{
    size_t j = 0;
    for (size_t i = 0; i < srv->nconns; i++) {
        if (srv->conns[i]->dead) {
            dshim_store_conn_free(srv->conns[i]);
        } else {
            srv->conns[j++] = srv->conns[i];
        }
    }
    srv->nconns = j;
}

static short conn_events(const conn_t *c)
{
    if (c->out_len > 0) {
        return POLLOUT | POLLRDHUP;
    }
    if (c->state == CONN_PARKED) {
        return POLLRDHUP;
    }
    return POLLIN | POLLRDHUP;
}

void *dshim_store_server_main(void *arg)
{
    dshim_store_server_t *srv = arg;
    for (;;) {
        double now = dshim_store_now();
        double next = expire(srv, now);
        sweep(srv);
        size_t n = 2 + srv->nconns;
        if (n > srv->cap_pfds) {
            struct pollfd *p = realloc(srv->pfds, n * sizeof(*p));
            if (!p) {
                DSHIM_WARN("store: out of memory for the poll set; retrying");
                usleep(10000);
                continue;
            }
            srv->pfds = p;
            srv->cap_pfds = n;
        }
        struct pollfd *pf = srv->pfds;
        pf[0] = (struct pollfd){.fd = srv->wake_fd, .events = POLLIN};
        int paused = now < srv->accept_pause_until;
        pf[1] = (struct pollfd){.fd = paused ? -1 : srv->listen_fd, .events = POLLIN};
        if (paused && srv->accept_pause_until < next) {
            next = srv->accept_pause_until;
        }
        for (size_t i = 0; i < srv->nconns; i++) {
            pf[2 + i] = (struct pollfd){.fd = srv->conns[i]->fd, .events = conn_events(srv->conns[i])};
        }
        int rc = poll(pf, n, dshim_store_poll_ms(next, now));
        if (rc < 0) {
            if (errno != EINTR) {
                DSHIM_WARN("store: poll failed: %s; retrying", strerror(errno));
                usleep(10000);
            }
            continue;
        }
        if (pf[0].revents) {
            break;  /* dshim_store_server_stop */
        }
        /* only the connections that were polled; accept_all appends after */
        size_t polled = n - 2;
        for (size_t i = 0; i < polled; i++) {
            conn_t *c = srv->conns[i];
            if (pf[2 + i].revents && !c->dead) {
                conn_on_events(srv, c, pf[2 + i].revents);
            }
        }
        if (pf[1].revents & POLLIN) {
            accept_all(srv);
        }
    }
    return NULL;
}

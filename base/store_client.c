/*
 * Rendezvous store client: one TCP connection, one request in flight at a
 * time, guarded by a mutex so any thread may call.  Every wait is a poll()
 * against a monotonic deadline (no SO_RCVTIMEO), so a dead or silent store
 * turns into an error naming it instead of a hang.  Wire format: store_proto.h.
 */
#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "status.h"
#include "store.h"
#include "store_proto.h"

/* How much longer than the server-side GET limit we wait for its TIMEOUT
 * reply before deciding the store itself is unresponsive. */
#define GET_GRACE_S 5.0
/* The hello ack gets at least this long even when the connect budget is
 * nearly spent: the TCP connection is already up. */
#define HELLO_MIN_S 10.0
/* A patient call's bound while replies to earlier patient calls are still
 * owed (see store_call). */
#define OWED_PATIENCE_S 0.05
/* Log the "still waiting for the store" line this often. */
#define RETRY_LOG_EVERY_S 10.0

struct dshim_store {
    pthread_mutex_t mu;
    int fd;
    int broken;            /* a reply was lost or the store left: no more calls */
    uint32_t seq;
    /* replies still owed to bounded calls that gave up before the store
     * answered (dshim_store_set_within): the next call reads and drops
     * them first, so the stream stays in step and the connection usable */
    uint32_t owed;
    double op_timeout_s;   /* DSHIM_TIMEOUT, for everything except get */
    char where[300];       /* "host:port" for messages */
    char broken_why[200];
};

typedef enum { IO_OK, IO_TIMEOUT, IO_EOF, IO_ERROR } io_result_t;

static io_result_t io_wait(int fd, short events, double deadline, int *err)
{
    for (;;) {
        double now = dshim_store_now();
        if (now >= deadline) {
            return IO_TIMEOUT;
        }
        struct pollfd pfd = {.fd = fd, .events = events};
        int rc = poll(&pfd, 1, dshim_store_poll_ms(deadline, now));
        if (rc > 0) {
            return IO_OK;  /* errors surface in the following send/recv */
        }
        if (rc < 0 && errno != EINTR) {
            *err = errno;
            return IO_ERROR;
        }
    }
}

static io_result_t io_send(int fd, const void *buf, size_t len, int flags, double deadline, int *err)
{
    const uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = send(fd, p, len, flags | MSG_NOSIGNAL);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            io_result_t r = io_wait(fd, POLLOUT, deadline, err);
            if (r != IO_OK) {
                return r;
            }
            continue;
        }
        *err = (n < 0) ? errno : EPIPE;
        return (*err == EPIPE || *err == ECONNRESET) ? IO_EOF : IO_ERROR;
    }
    return IO_OK;
}

static io_result_t io_recv(int fd, void *buf, size_t len, double deadline, int *err)
{
    uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = recv(fd, p, len, 0);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n == 0) {
            *err = 0;
            return IO_EOF;
        }
        if (errno == EINTR) {
            continue;
        }
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            io_result_t r = io_wait(fd, POLLIN, deadline, err);
            if (r != IO_OK) {
                return r;
            }
            continue;
        }
        *err = errno;
        return errno == ECONNRESET ? IO_EOF : IO_ERROR;
    }
    return IO_OK;
}

static const char *kind_name(uint32_t kind)
{
    switch (kind) {
    case DSHIM_STORE_REQ_SET: return "set";
    case DSHIM_STORE_REQ_GET: return "get";
    case DSHIM_STORE_REQ_TRY_GET: return "try_get";
    case DSHIM_STORE_REQ_ADD: return "add";
    case DSHIM_STORE_REQ_SET_IF_ABSENT: return "set_if_absent";
    case DSHIM_STORE_REQ_DELETE: return "delete";
    default: return "request";
    }
}

/* Any failure mid-request leaves the stream out of step (a late reply could
 * be read as the answer to the next call), so the connection is retired. */
static dshim_status_t io_failed(dshim_store_t *s, io_result_t r, int err, uint32_t kind, const char *key,
                                double waited_s)
{
    s->broken = 1;
    if (r == IO_TIMEOUT) {
        snprintf(s->broken_why, sizeof(s->broken_why), "no answer within %.0f s", waited_s);
        return dshim_error(DSHIM_ERR_TIMEOUT,
                           "the rendezvous store at %s did not answer %s of key '%.200s' within %.0f s; "
                           "the process hosting it (rank 0 or the launcher) may be stuck (DSHIM_TIMEOUT sets "
                           "the limit)", s->where, kind_name(kind), key, waited_s);
    }
    snprintf(s->broken_why, sizeof(s->broken_why), "%s", err ? strerror(err) : "closed by the store");
    return dshim_error(DSHIM_ERR_PEER,
                       "lost the connection to the rendezvous store at %s (%s) during %s of key '%.200s'; "
                       "the process hosting it (rank 0 or the launcher) probably exited",
                       s->where, s->broken_why, kind_name(kind), key);
}

static __thread double thread_patience_s;

double dshim_store_patience(double within_s)
{
    double prev = thread_patience_s;
    thread_patience_s = within_s > 0 ? within_s : 0;
    return prev;
}

/* Reads and drops the replies owed to earlier bounded calls, up to the one
 * numbered `seq`, whose header is left in rep.  Replies come in request
 * order, so anything else means the stream is out of step. */
static io_result_t read_own_reply(dshim_store_t *s, uint32_t seq, uint8_t *rep, double deadline, int *err,
                                  int *garbled)
{
    for (;;) {
        io_result_t r = io_recv(s->fd, rep, DSHIM_STORE_REPLY_HDR, deadline, err);
        if (r != IO_OK) {
            return r;
        }
        uint32_t got = dshim_store_get_u32(rep + 4);
        if (got == seq) {
            return IO_OK;
        }
        uint64_t rlen = dshim_store_get_u64(rep + 8);
        if (s->owed == 0 || got != seq - s->owed || rlen > DSHIM_STORE_VALUE_MAX) {
            *garbled = 1;
            return IO_OK;
        }
        uint8_t sink[512];
        while (rlen > 0 && r == IO_OK) {
            size_t n = rlen < sizeof(sink) ? (size_t)rlen : sizeof(sink);
            r = io_recv(s->fd, sink, n, deadline, err);
            rlen -= n;
        }
        if (r != IO_OK) {
            return r;
        }
        s->owed--;
    }
}

/* One request/response exchange.  *val_p (if given) receives a malloc'ed
 * reply value with a NUL after it, so text values work as C strings.
 * This thread's patience (dshim_store_patience; never for a waiting GET,
 * whose answer comes when the key does) bounds the wait for the first byte
 * of the reply: when the store has not begun to answer by then, the call
 * fails with DSHIM_ERR_TIMEOUT but the connection stays usable (the reply is
 * owed and dropped by a later call); wait_s still bounds the rest. */
static dshim_status_t store_call(dshim_store_t *s, uint32_t kind, const char *key, uint32_t arg,
                                 const void *val, size_t vlen, double wait_s, uint32_t *status_p, void **val_p,
                                 size_t *len_p)
{
    double soft_s = kind == DSHIM_STORE_REQ_GET ? 0 : thread_patience_s;
    size_t klen = strlen(key);
    if (klen == 0 || klen > DSHIM_STORE_KEY_MAX) {
        return dshim_error(DSHIM_ERR_INVALID, "store key of %zu bytes: keys must be 1 to %u bytes", klen,
                           DSHIM_STORE_KEY_MAX);
    }
    if (vlen > DSHIM_STORE_VALUE_MAX) {
        return dshim_error(DSHIM_ERR_INVALID, "store value of %zu bytes for key '%.200s' exceeds the %llu-byte "
                           "limit", vlen, key, DSHIM_STORE_VALUE_MAX);
    }
    uint8_t hdr[DSHIM_STORE_REQ_HDR];
    uint8_t rep[DSHIM_STORE_REPLY_HDR];
    dshim_status_t st = DSHIM_OK;
    int err = 0;
    io_result_t r;

    pthread_mutex_lock(&s->mu);
    if (s->broken) {
        st = dshim_error(DSHIM_ERR_PEER,
                         "the connection to the rendezvous store at %s is unusable after an earlier failure (%s); "
                         "cannot %s key '%.200s'", s->where, s->broken_why, kind_name(kind), key);
        goto out;
    }
    if (soft_s > OWED_PATIENCE_S && s->owed > 0) {
        /* the store has not even answered an earlier call: a silent host
         * (stopped, cut off) is not given the full patience again */
        soft_s = OWED_PATIENCE_S;
    }
    uint32_t seq = ++s->seq;
    dshim_store_put_u32(hdr, kind);
    dshim_store_put_u32(hdr + 4, seq);
    dshim_store_put_u32(hdr + 8, (uint32_t)klen);
    dshim_store_put_u32(hdr + 12, arg);
    dshim_store_put_u64(hdr + 16, vlen);
    double deadline = (wait_s == INFINITY) ? INFINITY : dshim_store_now() + wait_s;
    /* MSG_MORE lets the kernel put header, key and value in one segment
     * despite TCP_NODELAY */
    r = io_send(s->fd, hdr, sizeof(hdr), MSG_MORE, deadline, &err);
    if (r == IO_OK) {
        r = io_send(s->fd, key, klen, vlen ? MSG_MORE : 0, deadline, &err);
    }
    if (r == IO_OK && vlen) {
        r = io_send(s->fd, val, vlen, 0, deadline, &err);
    }
    if (r == IO_OK && soft_s > 0) {
        /* nothing of the reply read yet: giving up here keeps the stream in step */
        double soft_deadline = dshim_store_now() + soft_s;
        r = io_wait(s->fd, POLLIN, soft_deadline < deadline ? soft_deadline : deadline, &err);
        if (r == IO_TIMEOUT) {
            s->owed++;
            /* quiet: the caller chose to give up early and says what it means */
            st = dshim_error_quiet(DSHIM_ERR_TIMEOUT, "the rendezvous store at %s did not answer %s of key '%.200s' "
                             "within %.1f s; the process hosting it (rank 0 or the launcher) may be stopped or "
                             "overloaded", s->where, kind_name(kind), key, soft_s);
            goto out;
        }
    }
    int garbled = 0;
    if (r == IO_OK) {
        r = read_own_reply(s, seq, rep, deadline, &err, &garbled);
    }
    if (r != IO_OK) {
        st = io_failed(s, r, err, kind, key, wait_s);
        goto out;
    }
    uint32_t status = dshim_store_get_u32(rep);
    uint64_t rlen = dshim_store_get_u64(rep + 8);
    if (garbled || dshim_store_get_u32(rep + 4) != seq || rlen > DSHIM_STORE_VALUE_MAX) {
        s->broken = 1;
        snprintf(s->broken_why, sizeof(s->broken_why), "garbled reply");
        st = dshim_error(DSHIM_ERR_PROTOCOL,
                         "garbled reply from the rendezvous store at %s to %s of key '%.200s'; is another "
                         "program listening on that port?", s->where, kind_name(kind), key);
        goto out;
    }
    uint8_t *buf = malloc((size_t)rlen + 1);
    if (!buf) {
        s->broken = 1;
        snprintf(s->broken_why, sizeof(s->broken_why), "out of memory reading a reply");
        st = dshim_error(DSHIM_ERR_NOMEM, "out of memory for a %llu-byte value of key '%.200s'",
                         (unsigned long long)rlen, key);
        goto out;
    }
    r = io_recv(s->fd, buf, (size_t)rlen, deadline, &err);
    if (r != IO_OK) {
        free(buf);
        st = io_failed(s, r, err, kind, key, wait_s);
        goto out;
    }
    buf[rlen] = 0;
    s->owed = 0; /* every earlier reply came before this one */
    *status_p = status;
    if (val_p) {
        *val_p = buf;
        *len_p = (size_t)rlen;
    } else {
        free(buf);
    }
out:
    pthread_mutex_unlock(&s->mu);
    return st;
}

int dshim_store_usable(dshim_store_t *s)
{
    if (!s) {
        return 0;
    }
    pthread_mutex_lock(&s->mu);
    int ok = s->fd >= 0 && !s->broken;
    pthread_mutex_unlock(&s->mu);
    return ok;
}

static double op_wait(const dshim_store_t *s)
{
    return s->op_timeout_s > 0 ? s->op_timeout_s : INFINITY;
}

dshim_status_t dshim_store_set(dshim_store_t *s, const char *key, const void *val, size_t len)
{
    if (!s || !key || (!val && len)) {
        return dshim_error(DSHIM_ERR_INVALID, "dshim_store_set: store, key and value must not be NULL");
    }
    uint32_t status;
    DSHIM_CHECK(store_call(s, DSHIM_STORE_REQ_SET, key, 0, val, len, op_wait(s), &status, NULL, NULL));
    return DSHIM_OK;
}

dshim_status_t dshim_store_get(dshim_store_t *s, const char *key, double timeout_s, void **val_p,
                               size_t *len_p)
{
    if (!s || !key || !val_p || !len_p) {
        return dshim_error(DSHIM_ERR_INVALID, "dshim_store_get: store, key and outputs must not be NULL");
    }
    *val_p = NULL;
    *len_p = 0;
    /* the server enforces the limit and answers TIMEOUT; we only wait a
     * little longer so that a dead store is noticed too */
    uint32_t arg = DSHIM_STORE_WAIT_FOREVER;
    double wait = INFINITY;
    if (timeout_s >= 0 && timeout_s * 1000.0 < (double)DSHIM_STORE_WAIT_FOREVER) {
        arg = (uint32_t)(timeout_s * 1000.0);
        wait = timeout_s + GET_GRACE_S;
    }
    uint32_t status;
    void *val = NULL;
    size_t len = 0;
    DSHIM_CHECK(store_call(s, DSHIM_STORE_REQ_GET, key, arg, NULL, 0, wait, &status, &val, &len));
    if (status == DSHIM_STORE_ST_OK) {
        *val_p = val;
        *len_p = len;
        return DSHIM_OK;
    }
    if (status == DSHIM_STORE_ST_FAILED) {
        /* another rank reported its failure (`<prefix>failed`): its own
         * one-line reason says who and why, better than any guess here */
        dshim_status_t st = dshim_error(DSHIM_ERR_PEER, "%.*s", (int)len, (char *)val);
        free(val);
        return st;
    }
    free(val);
    if (status == DSHIM_STORE_ST_TIMEOUT) {
        return dshim_error(DSHIM_ERR_TIMEOUT,
                           "timed out after %.1f s waiting for key '%.200s' in the rendezvous store at %s; the "
                           "rank that should set it may have failed or not started",
                           timeout_s, key, s->where);
    }
    return dshim_error(DSHIM_ERR_PROTOCOL, "unexpected status %u from the rendezvous store at %s to get of "
                       "key '%.200s'", status, s->where, key);
}

dshim_status_t dshim_store_try_get(dshim_store_t *s, const char *key, void **val_p, size_t *len_p)
{
    if (!s || !key || !val_p || !len_p) {
        return dshim_error(DSHIM_ERR_INVALID, "dshim_store_try_get: store, key and outputs must not be NULL");
    }
    *val_p = NULL;
    *len_p = 0;
    uint32_t status;
    void *val = NULL;
    size_t len = 0;
    DSHIM_CHECK(store_call(s, DSHIM_STORE_REQ_TRY_GET, key, 0, NULL, 0, op_wait(s), &status, &val, &len));
    if (status == DSHIM_STORE_ST_OK) {
        *val_p = val;
        *len_p = len;
        return DSHIM_OK;
    }
    free(val);
    if (status == DSHIM_STORE_ST_NOT_FOUND) {
        return DSHIM_INPROGRESS;
    }
    return dshim_error(DSHIM_ERR_PROTOCOL, "unexpected status %u from the rendezvous store at %s to try_get "
                       "of key '%.200s'", status, s->where, key);
}

dshim_status_t dshim_store_add(dshim_store_t *s, const char *key, int64_t delta, int64_t *result_p)
{
    if (!s || !key) {
        return dshim_error(DSHIM_ERR_INVALID, "dshim_store_add: store and key must not be NULL");
    }
    uint8_t d[8];
    dshim_store_put_u64(d, (uint64_t)delta);
    uint32_t status;
    void *val = NULL;
    size_t len = 0;
    DSHIM_CHECK(store_call(s, DSHIM_STORE_REQ_ADD, key, 0, d, sizeof(d), op_wait(s), &status, &val, &len));
    if (status == DSHIM_STORE_ST_OK && len == 8) {
        if (result_p) {
            *result_p = (int64_t)dshim_store_get_u64(val);
        }
        free(val);
        return DSHIM_OK;
    }
    free(val);
    if (status == DSHIM_STORE_ST_BAD_VALUE) {
        return dshim_error(DSHIM_ERR_INVALID,
                           "cannot add %lld to key '%.200s' in the rendezvous store at %s: it holds a value "
                           "that is not an integer counter, or the sum overflows int64",
                           (long long)delta, key, s->where);
    }
    return dshim_error(DSHIM_ERR_PROTOCOL, "unexpected reply (status %u, %zu bytes) from the rendezvous store "
                       "at %s to add on key '%.200s'", status, len, s->where, key);
}

dshim_status_t dshim_store_set_if_absent(dshim_store_t *s, const char *key, const void *val, size_t len,
                                         int *won_p)
{
    if (!s || !key || (!val && len)) {
        return dshim_error(DSHIM_ERR_INVALID, "dshim_store_set_if_absent: store, key and value must not be NULL");
    }
    uint32_t status;
    DSHIM_CHECK(store_call(s, DSHIM_STORE_REQ_SET_IF_ABSENT, key, 0, val, len, op_wait(s), &status, NULL,
                           NULL));
    if (status != DSHIM_STORE_ST_OK && status != DSHIM_STORE_ST_EXISTS) {
        return dshim_error(DSHIM_ERR_PROTOCOL, "unexpected status %u from the rendezvous store at %s to "
                           "set_if_absent of key '%.200s'", status, s->where, key);
    }
    if (won_p) {
        *won_p = (status == DSHIM_STORE_ST_OK);
    }
    return DSHIM_OK;
}

/* Deleting an absent key is not an error: deletes are clean-up. */
dshim_status_t dshim_store_delete(dshim_store_t *s, const char *key)
{
    if (!s || !key) {
        return dshim_error(DSHIM_ERR_INVALID, "dshim_store_delete: store and key must not be NULL");
    }
    uint32_t status;
    DSHIM_CHECK(store_call(s, DSHIM_STORE_REQ_DELETE, key, 0, NULL, 0, op_wait(s), &status, NULL, NULL));
    return DSHIM_OK;
}

/* ---- connecting ---- */

/* One attempt at a TCP connection to every IPv4 address of host.  Returns
 * the socket, or -1 with the reason in why. */
static int connect_once(const char *host, int port, double deadline, char *why, size_t why_len)
{
    char service[16];
    snprintf(service, sizeof(service), "%d", port);
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    int rc = getaddrinfo(host, service, &hints, &res);
    if (rc != 0) {
        snprintf(why, why_len, "cannot resolve '%s': %s", host, gai_strerror(rc));
        return -1;
    }
    int fd = -1;
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            snprintf(why, why_len, "socket: %s", strerror(errno));
            break;
        }
        int err = 0;
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
            err = errno;
            if (err == EINPROGRESS || err == EINTR) {
                io_result_t r = io_wait(fd, POLLOUT, deadline, &err);
                socklen_t sl = sizeof(err);
                if (r == IO_TIMEOUT) {
                    err = ETIMEDOUT;
                } else if (r == IO_OK && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &sl) < 0) {
                    err = errno;
                }
            }
        }
        if (err != 0) {
            snprintf(why, why_len, "%s", strerror(err));
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd >= 0) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
    return fd;
}

static dshim_status_t hello(dshim_store_t *s, const char *token, double deadline)
{
    size_t tlen = token ? strlen(token) : 0;
    uint8_t hdr[DSHIM_STORE_HELLO_HDR];
    uint8_t ack[DSHIM_STORE_ACK_LEN];
    dshim_store_put_u32(hdr, DSHIM_STORE_MAGIC);
    dshim_store_put_u16(hdr + 4, DSHIM_STORE_VERSION);
    dshim_store_put_u16(hdr + 6, 0);
    dshim_store_put_u32(hdr + 8, (uint32_t)tlen);
    int err = 0;
    io_result_t r = io_send(s->fd, hdr, sizeof(hdr), tlen ? MSG_MORE : 0, deadline, &err);
    if (r == IO_OK && tlen) {
        r = io_send(s->fd, token, tlen, 0, deadline, &err);
    }
    if (r == IO_OK) {
        r = io_recv(s->fd, ack, sizeof(ack), deadline, &err);
    }
    if (r == IO_TIMEOUT) {
        return dshim_error(DSHIM_ERR_TIMEOUT, "the rendezvous store at %s accepted the connection but did not "
                           "answer the hello; is another program listening on that port?", s->where);
    }
    if (r != IO_OK) {
        /* a token the store refuses is answered BAD_TOKEN before it closes,
         * so a bare close means the store went away: its host (rank 0 or
         * the launcher) exited, typically after failing itself */
        return dshim_error(DSHIM_ERR_PEER, "the rendezvous store at %s closed the connection during the hello "
                           "(%s): the process hosting it (rank 0, or the launcher) has probably exited; its own "
                           "output says why (or another program listens on that port)",
                           s->where, err ? strerror(err) : "end of stream");
    }
    if (dshim_store_get_u32(ack) != DSHIM_STORE_MAGIC) {
        return dshim_error(DSHIM_ERR_PROTOCOL, "something other than a dshim rendezvous store answers at %s; "
                           "check MASTER_PORT or DSHIM_STORE_PORT", s->where);
    }
    uint16_t status = dshim_store_get_u16(ack + 6);
    if (status == DSHIM_STORE_HELLO_BAD_TOKEN) {
        return dshim_error(DSHIM_ERR_PROTOCOL, "the rendezvous store at %s rejected this process's job token; "
                           "every rank of a job must use the same DSHIM_JOB_TOKEN", s->where);
    }
    if (status != DSHIM_STORE_HELLO_OK) {
        return dshim_error(DSHIM_ERR_PROTOCOL, "the rendezvous store at %s speaks dshim protocol version %u, "
                           "this library speaks %u; use the same dshim build on every host", s->where,
                           (unsigned)dshim_store_get_u16(ack + 4), DSHIM_STORE_VERSION);
    }
    return DSHIM_OK;
}

static void sleep_s(double s)
{
    struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
    }
}

/* addr NULL or "" means this host (the counterpart of a server on all
 * interfaces).  timeout_s <= 0 makes a single attempt. */
dshim_status_t dshim_store_connect(const char *addr, int port, const char *token, double timeout_s,
                                   dshim_store_t **store_p)
{
    if (!store_p || port <= 0 || port > 65535) {
        return dshim_error(DSHIM_ERR_INVALID, "rendezvous store port %d is out of range; set MASTER_PORT or "
                           "DSHIM_STORE_PORT to 1..65535", port);
    }
    *store_p = NULL;
    if (token && strlen(token) > DSHIM_STORE_TOKEN_MAX) {
        return dshim_error(DSHIM_ERR_INVALID, "job token of %zu bytes is longer than %u; use a shorter "
                           "DSHIM_JOB_TOKEN", strlen(token), DSHIM_STORE_TOKEN_MAX);
    }
    dshim_log_init();  /* so the INFO retry lines honour DSHIM_DEBUG */
    const char *host = (addr && addr[0]) ? addr : "127.0.0.1";
    dshim_store_t *s = calloc(1, sizeof(*s));
    if (!s) {
        return dshim_error(DSHIM_ERR_NOMEM, "out of memory connecting to the rendezvous store");
    }
    pthread_mutex_init(&s->mu, NULL);
    s->fd = -1;
    s->op_timeout_s = dshim_config()->timeout_s;
    snprintf(s->where, sizeof(s->where), "%.256s:%d", host, port);

    double start = dshim_store_now();
    double deadline = start + (timeout_s > 0 ? timeout_s : 0);
    double next_log = start;
    double backoff = 0.02;
    char why[256] = "not tried";
    for (;;) {
        /* a connect in flight gets at least a second, even on the last try */
        s->fd = connect_once(host, port, fmax(deadline, dshim_store_now() + 1.0), why, sizeof(why));
        if (s->fd >= 0) {
            break;
        }
        double now = dshim_store_now();
        if (now >= deadline) {
            dshim_store_close(s);
            return dshim_error(DSHIM_ERR_TIMEOUT,
                               "cannot reach the rendezvous store at %.256s:%d within %.1f s (%s); check "
                               "MASTER_ADDR/MASTER_PORT (or DSHIM_STORE_ADDR/DSHIM_STORE_PORT) and that rank 0 "
                               "or the launcher is running", host, port, timeout_s, why);
        }
        if (now >= next_log) {
            DSHIM_INFO("store: waiting for the rendezvous store at %s (%s); retrying for up to %.1f s more",
                       s->where, why, deadline - now);
            next_log = now + RETRY_LOG_EVERY_S;
        }
        sleep_s(fmin(backoff, deadline - now));
        backoff = fmin(backoff * 2, 1.0);
    }
    double hello_deadline = fmax(deadline, dshim_store_now() + HELLO_MIN_S);
    dshim_status_t st = hello(s, token, hello_deadline);
    if (st != DSHIM_OK) {
        dshim_store_close(s);
        return st;
    }
    DSHIM_TRACE("store: connected to %s", s->where);
    *store_p = s;
    return DSHIM_OK;
}

void dshim_store_close(dshim_store_t *s)
{
    if (!s) {
        return;
    }
    if (s->fd >= 0) {
        close(s->fd);
    }
    pthread_mutex_destroy(&s->mu);
    free(s);
}

/*
 * TCP transport: one non-blocking socket per peer, the very socket the
 * bootstrap handshook with it.  It reaches every peer and needs no
 * per-communicator state, which makes it the registry's fallback.
 *
 * recv() goes straight into the caller's buffer when nothing is staged, so
 * copy-only transfers cost one kernel copy.  peek() reads into a small
 * staging buffer (kept cache-sized on purpose: the reduction reads it right
 * after the kernel wrote it) so reductions can combine incoming bytes
 * without a second user-space copy.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "config.h"
#include "net.h"
#include "status.h"
#include "transport/transport.h"

/* Bytes of the staging buffer peek() reads into: large enough that one
 * system call brings a good piece of a message, small enough to stay in L2
 * for the reduction that reads it next. */
#define TCP_STAGING_BYTES (256 * 1024)

typedef struct tcp_conn {
    dshim_conn_t base;
    char *stage;
    size_t stage_cap;
    size_t stage_off;  /* first unconsumed byte */
    size_t stage_len;  /* end of valid bytes */
} tcp_conn_t;

extern const dshim_transport_t dshim_transport_tcp; /* defined at the end: its ops come first */

static dshim_status_t peer_error(tcp_conn_t *c, int err)
{
    char who[64];
    dshim_conn_peer_name(&c->base, who, sizeof(who));
    if (err == 0) {
        return dshim_error_quiet(DSHIM_ERR_PEER, "%s closed the connection (it exited, crashed or was killed)", who);
    }
    return dshim_error_quiet(DSHIM_ERR_PEER, "connection to %s failed: %s", who, strerror(err));
}

/* The outcome of one non-blocking socket call that returned n: *moved_p
 * bytes moved (0 when the socket is not ready yet), or the peer's error. */
static dshim_status_t io_outcome(tcp_conn_t *c, ssize_t n, size_t *moved_p)
{
    *moved_p = n > 0 ? (size_t)n : 0;
    if (n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))) {
        return DSHIM_OK;
    }
    return peer_error(c, n == 0 ? 0 : errno);
}

static dshim_status_t tcp_send(dshim_conn_t *conn, const void *buf, size_t len, size_t *n_p)
{
    tcp_conn_t *c = (tcp_conn_t *)conn;
    *n_p = 0;
    if (len == 0) {
        return DSHIM_OK;
    }
    ssize_t n = send(c->base.fd, buf, len, MSG_DONTWAIT | MSG_NOSIGNAL);
    DSHIM_CHECK(io_outcome(c, n, n_p));
    c->base.bytes_sent += *n_p;
    return DSHIM_OK;
}

/* Header and payload start in one sendmsg: one system call and, with
 * TCP_NODELAY, one segment rather than a 48-byte segment of its own. */
static dshim_status_t tcp_send2(dshim_conn_t *conn, const void *a, size_t alen, const void *b, size_t blen,
                                size_t *n_p)
{
    tcp_conn_t *c = (tcp_conn_t *)conn;
    *n_p = 0;
    struct iovec iov[2] = {{(void *)a, alen}, {(void *)b, blen}};
    struct msghdr m;
    memset(&m, 0, sizeof(m));
    m.msg_iov = iov;
    m.msg_iovlen = blen ? 2 : 1;
    ssize_t n = sendmsg(c->base.fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
    DSHIM_CHECK(io_outcome(c, n, n_p));
    c->base.bytes_sent += *n_p;
    return DSHIM_OK;
}

static dshim_status_t fill_stage(tcp_conn_t *c)
{
    if (c->stage_off == c->stage_len) {
        c->stage_off = c->stage_len = 0;
    } else if (c->stage_off > 0 && c->stage_len == c->stage_cap) {
        /* only a partial element is left at the end: move it to the front */
        memmove(c->stage, c->stage + c->stage_off, c->stage_len - c->stage_off);
        c->stage_len -= c->stage_off;
        c->stage_off = 0;
    }
    if (c->stage_len == c->stage_cap) {
        return DSHIM_OK;
    }
    ssize_t n = recv(c->base.fd, c->stage + c->stage_len, c->stage_cap - c->stage_len, MSG_DONTWAIT);
    size_t moved;
    DSHIM_CHECK(io_outcome(c, n, &moved));
    c->stage_len += moved;
    c->base.bytes_received += moved;
    return DSHIM_OK;
}

static dshim_status_t tcp_recv(dshim_conn_t *conn, void *buf, size_t len, size_t *n_p)
{
    tcp_conn_t *c = (tcp_conn_t *)conn;
    *n_p = 0;
    if (len == 0) {
        return DSHIM_OK;
    }
    if (c->stage_off < c->stage_len) {
        size_t n = c->stage_len - c->stage_off;
        if (n > len) {
            n = len;
        }
        memcpy(buf, c->stage + c->stage_off, n);
        c->stage_off += n;
        *n_p = n;
        return DSHIM_OK;
    }
    ssize_t n = recv(c->base.fd, buf, len, MSG_DONTWAIT);
    DSHIM_CHECK(io_outcome(c, n, n_p));
    c->base.bytes_received += *n_p;
    return DSHIM_OK;
}

/* Header and payload start in one recvmsg, the payload going straight into
 * the caller's buffer.  Bytes already staged are served first (only into a,
 * which is enough: the caller comes back for the rest). */
static dshim_status_t tcp_recv2(dshim_conn_t *conn, void *a, size_t alen, void *b, size_t blen, size_t *n_p)
{
    tcp_conn_t *c = (tcp_conn_t *)conn;
    if (c->stage_off < c->stage_len || blen == 0) {
        return tcp_recv(conn, a, alen, n_p);
    }
    *n_p = 0;
    struct iovec iov[2] = {{a, alen}, {b, blen}};
    struct msghdr m;
    memset(&m, 0, sizeof(m));
    m.msg_iov = iov;
    m.msg_iovlen = 2;
    ssize_t n = recvmsg(c->base.fd, &m, MSG_DONTWAIT);
    DSHIM_CHECK(io_outcome(c, n, n_p));
    c->base.bytes_received += *n_p;
    return DSHIM_OK;
}

static dshim_status_t tcp_peek(dshim_conn_t *conn, const void **ptr_p, size_t *avail_p)
{
    tcp_conn_t *c = (tcp_conn_t *)conn;
    /* refill when less than one element's worth (8 bytes) is staged */
    if (c->stage_len - c->stage_off < 8) {
        DSHIM_CHECK(fill_stage(c));
    }
    *ptr_p = c->stage + c->stage_off;
    *avail_p = c->stage_len - c->stage_off;
    return DSHIM_OK;
}

static dshim_status_t tcp_consume(dshim_conn_t *conn, size_t n)
{
    tcp_conn_t *c = (tcp_conn_t *)conn;
    if (n > c->stage_len - c->stage_off) {
        return dshim_error(DSHIM_ERR_INTERNAL, "tcp consume(%zu) beyond %zu staged bytes", n,
                           c->stage_len - c->stage_off);
    }
    c->stage_off += n;
    return DSHIM_OK;
}

/* A header the engine follows with peek (RECV_REDUCE): fill the staging
 * buffer first, so the header and the payload after it arrive in one
 * system call. */
static dshim_status_t tcp_recv_ahead(dshim_conn_t *conn, void *buf, size_t len, size_t *n_p)
{
    const void *ptr;
    size_t avail;
    DSHIM_CHECK(tcp_peek(conn, &ptr, &avail));
    return tcp_recv(conn, buf, len, n_p);
}

static int tcp_hung_up(dshim_conn_t *conn)
{
    return dshim_net_hung_up(conn->fd);
}

static void tcp_destroy(dshim_conn_t *conn)
{
    tcp_conn_t *c = (tcp_conn_t *)conn;
    if (c->base.fd >= 0) {
        close(c->base.fd);
    }
    free(c->stage);
    free(c);
}

/* Takes ownership of a connected, handshaken socket (on success only). */
static dshim_status_t tcp_conn_create(int fd, int peer, size_t staging_bytes, dshim_conn_t **conn_p)
{
    tcp_conn_t *c = calloc(1, sizeof(*c));
    if (!c) {
        return dshim_error(DSHIM_ERR_NOMEM, "out of memory for a tcp connection");
    }
    c->stage_cap = staging_bytes < 4096 ? 4096 : staging_bytes;
    c->stage = malloc(c->stage_cap);
    if (!c->stage) {
        free(c);
        return dshim_error(DSHIM_ERR_NOMEM, "out of memory for tcp staging (%zu bytes)", staging_bytes);
    }
    c->base.ops = &dshim_transport_tcp;
    c->base.peer = peer;
    c->base.peer_job = peer;
    c->base.fd = fd;
    *conn_p = &c->base;
    return DSHIM_OK;
}

static dshim_status_t tcp_connect(void *state, const dshim_transport_peer_t *peer, int fd, dshim_conn_t **conn_p)
{
    (void)state;
    const dshim_config_t *cfg = dshim_config();
    dshim_net_tune(fd, cfg->socket_bufsize);
    /* on this host even when host ids differ (DSHIM_HOST_ID) */
    int local = peer->same_host || peer->ip == peer->my_ip || (ntohl(peer->ip) >> 24) == 127;
    dshim_net_set_cc(fd, local);
    return tcp_conn_create(fd, peer->rank, TCP_STAGING_BYTES, conn_p);
}

const dshim_transport_t dshim_transport_tcp = {
    .name       = "tcp",
    .connect    = tcp_connect,
    .send       = tcp_send,
    .recv       = tcp_recv,
    .peek       = tcp_peek,
    .consume    = tcp_consume,
    .send2      = tcp_send2,
    .recv2      = tcp_recv2,
    .recv_ahead = tcp_recv_ahead,
    .hung_up    = tcp_hung_up,
    .destroy    = tcp_destroy,
};

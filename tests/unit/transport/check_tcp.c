/*
 * Unit tests of the TCP transport (backends/transport/tcp/) through its ops
 * (transport/transport.h), on real loopback sockets: connect over a
 * connected socket, send/recv of 0, 1, odd and several MiB (the send taking
 * part of the bytes and never blocking), recv with nothing there,
 * peek/consume through the staging buffer (a consumer that leaves part of
 * an element at its end), send2/recv2 and recv_ahead, and a peer that
 * closes or exits: the bytes it sent still arrive, then DSHIM_ERR_PEER
 * naming the peer (its job rank on a sub-communicator), hung_up, and a send
 * into a closed peer failing without SIGPIPE.
 *
 * Bytes that do not make sense are not the transport's business: it is a
 * byte stream; the engine's framing rejects them (tests/failure's strangers).
 */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ck_free_port.h"
#include "status.h"
#include "transport/transport.h"

#define MIB ((size_t)1 << 20)
#define DEADLINE_S 10.0

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const dshim_transport_t *tcp(void)
{
    int i = dshim_transport_index("tcp");
    ck_assert_int_ge(i, 0);
    return dshim_transport_at(i);
}

/* A listener on 127.0.0.1 at a test port. */
static int listen_loopback(int *port_p)
{
    int port = ck_free_port();
    int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(l, 0);
    int one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    ck_assert_msg(bind(l, (struct sockaddr *)&a, sizeof(a)) == 0 && listen(l, 4) == 0, "listen on %d: %s", port,
                  strerror(errno));
    *port_p = port;
    return l;
}

static int connect_loopback(int port)
{
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof(a)) != 0) {
        return -1;
    }
    fcntl(s, F_SETFL, fcntl(s, F_GETFL) | O_NONBLOCK); /* as the bootstrap hands it over */
    return s;
}

/* The transport's connection over a socket, as the bootstrap makes it:
 * `rank` is the peer's rank. */
static dshim_conn_t *wrap(int fd, int rank)
{
    dshim_transport_peer_t peer = {.rank = rank, .same_host = 1, .ip = htonl(INADDR_LOOPBACK),
                                   .my_ip = htonl(INADDR_LOOPBACK), .addr = ""};
    dshim_conn_t *c = NULL;
    ck_assert_msg(tcp()->connect(NULL, &peer, fd, &c) == DSHIM_OK, "connect: %s", dshim_last_error());
    return c;
}

/* Two connected ends in this process: *a talks to rank 1, *b to rank 0. */
static void pair(dshim_conn_t **a, dshim_conn_t **b)
{
    int port;
    int l = listen_loopback(&port);
    int s = connect_loopback(port);
    ck_assert_int_ge(s, 0);
    int t = accept4(l, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    ck_assert_int_ge(t, 0);
    close(l);
    *a = wrap(s, 1);
    *b = wrap(t, 0);
}

static void fill(unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++) {
        p[i] = (unsigned char)(i * 131 + seed + (i >> 12));
    }
}

START_TEST(test_connect_takes_the_socket)
{
    dshim_conn_t *a, *b;
    pair(&a, &b);
    ck_assert_ptr_eq(a->ops, tcp());
    ck_assert_str_eq(a->ops->name, "tcp");
    ck_assert_int_eq(a->peer, 1);
    ck_assert_int_eq(a->peer_job, 1);
    ck_assert_int_eq(b->peer, 0);
    ck_assert_int_ge(a->fd, 0);
    ck_assert(a->bytes_sent == 0 && a->bytes_received == 0);
    /* a polled transport: no wake-up of its own, no host-local extras */
    ck_assert(!a->ops->host_local && !a->ops->wait_arm && !a->ops->peer_read);
    ck_assert_int_eq(a->ops->hung_up(a), 0);
    a->ops->destroy(a);
    b->ops->destroy(b);
}
END_TEST

/* Moves len bytes from a to b in one thread, both sides non-blocking;
 * counts the sends that took part of what was offered. */
static void move(dshim_conn_t *a, dshim_conn_t *b, size_t len, size_t *partial_p)
{
    unsigned char *src = malloc(len + 1), *dst = malloc(len + 1);
    ck_assert(src && dst);
    fill(src, len, (unsigned)len);
    memset(dst, 0, len + 1);
    size_t sent = 0, got = 0, partial = 0;
    double end = now_s() + DEADLINE_S;
    while (got < len || sent < len) {
        size_t n;
        ck_assert_msg(now_s() < end, "%zu bytes: sent %zu, got %zu in %.0f s", len, sent, got, DEADLINE_S);
        if (sent < len) {
            ck_assert_int_eq(a->ops->send(a, src + sent, len - sent, &n), DSHIM_OK);
            partial += n > 0 && n < len - sent;
            sent += n;
        }
        ck_assert_int_eq(b->ops->recv(b, dst + got, len - got, &n), DSHIM_OK);
        got += n;
    }
    ck_assert_msg(memcmp(src, dst, len) == 0, "%zu bytes arrived changed", len);
    size_t n = 1;
    ck_assert_int_eq(a->ops->send(a, src, 0, &n), DSHIM_OK);
    ck_assert_uint_eq(n, 0);
    free(src);
    free(dst);
    if (partial_p) {
        *partial_p = partial;
    }
}

START_TEST(test_sizes)
{
    static const size_t sizes[] = {0, 1, 7, 4099, 3 * MIB + 5};
    dshim_conn_t *a, *b;
    pair(&a, &b);
    uint64_t total = 0;
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        move(a, b, sizes[i], NULL);
        move(b, a, sizes[i], NULL); /* and back */
        total += sizes[i];
    }
    ck_assert_uint_eq(a->bytes_sent, total);
    ck_assert_uint_eq(b->bytes_received, total);
    ck_assert_uint_eq(b->bytes_sent, total);
    ck_assert_uint_eq(a->bytes_received, total);
    a->ops->destroy(a);
    b->ops->destroy(b);
}
END_TEST

/* Several MiB through socket buffers far smaller: send takes what fits and
 * returns at once (the single thread here would hang otherwise). */
START_TEST(test_large_partial_sends)
{
    dshim_conn_t *a, *b;
    pair(&a, &b);
    size_t partial;
    move(a, b, 24 * MIB + 3, &partial);
    ck_assert_msg(partial > 0, "24 MiB went in one send: no partial write was seen");
    a->ops->destroy(a);
    b->ops->destroy(b);
}
END_TEST

START_TEST(test_nothing_there)
{
    dshim_conn_t *a, *b;
    pair(&a, &b);
    char buf[64];
    size_t n = 99;
    double t0 = now_s();
    ck_assert_int_eq(b->ops->recv(b, buf, sizeof(buf), &n), DSHIM_OK);
    ck_assert_uint_eq(n, 0);
    const void *p;
    size_t avail = 99;
    ck_assert_int_eq(b->ops->peek(b, &p, &avail), DSHIM_OK);
    ck_assert_uint_eq(avail, 0);
    ck_assert_msg(now_s() - t0 < 1.0, "recv and peek with nothing there must not wait");
    ck_assert_int_eq(b->ops->consume(b, 1), DSHIM_ERR_INTERNAL);
    a->ops->destroy(a);
    b->ops->destroy(b);
}
END_TEST

/* Peeks until at least `want` bytes are staged (or the deadline). */
static size_t peek_at_least(dshim_conn_t *c, const unsigned char **p, size_t want)
{
    size_t avail = 0;
    double end = now_s() + DEADLINE_S;
    do {
        const void *q;
        ck_assert_int_eq(c->ops->peek(c, &q, &avail), DSHIM_OK);
        *p = q;
    } while (avail < want && now_s() < end);
    ck_assert_uint_ge(avail, want);
    return avail;
}

START_TEST(test_peek_consume_recv_mix)
{
    dshim_conn_t *a, *b;
    pair(&a, &b);
    unsigned char src[1000], dst[1000];
    fill(src, sizeof(src), 5);
    size_t n;
    ck_assert_int_eq(a->ops->send(a, src, sizeof(src), &n), DSHIM_OK);
    ck_assert_uint_eq(n, sizeof(src));
    const unsigned char *p;
    size_t avail = peek_at_least(b, &p, sizeof(src));
    ck_assert_uint_eq(avail, sizeof(src));
    ck_assert(memcmp(p, src, avail) == 0);
    ck_assert_int_eq(b->ops->consume(b, 100), DSHIM_OK);
    /* recv after a peek returns the bytes not consumed yet */
    ck_assert_int_eq(b->ops->recv(b, dst, 50, &n), DSHIM_OK);
    ck_assert_uint_eq(n, 50);
    ck_assert(memcmp(dst, src + 100, 50) == 0);
    avail = peek_at_least(b, &p, 850);
    ck_assert(memcmp(p, src + 150, 850) == 0);
    ck_assert_int_eq(b->ops->consume(b, 851), DSHIM_ERR_INTERNAL); /* beyond what is staged */
    ck_assert_int_eq(b->ops->consume(b, 850), DSHIM_OK);
    ck_assert_int_eq(b->ops->recv(b, dst, sizeof(dst), &n), DSHIM_OK);
    ck_assert_uint_eq(n, 0);
    a->ops->destroy(a);
    b->ops->destroy(b);
}
END_TEST

/* 2 MiB through the staging buffer as the engine reads a reduction's
 * payload: whole 8-byte elements out of what peek shows, after a 3-byte
 * prefix, so that part of an element is left at the staging buffer's end
 * (moved to its front before the next fill): every byte once, in order. */
START_TEST(test_peek_consume_stream)
{
    dshim_conn_t *a, *b;
    pair(&a, &b);
    size_t len = 3 + 2 * MIB + 5;
    unsigned char *src = malloc(len), *dst = malloc(len);
    ck_assert(src && dst);
    fill(src, len, 9);
    size_t sent = 0, got = 0;
    double end = now_s() + DEADLINE_S;
    while (got < len) {
        ck_assert_msg(now_s() < end, "stream: sent %zu, got %zu", sent, got);
        size_t n;
        if (sent < len) {
            ck_assert_int_eq(a->ops->send(a, src + sent, len - sent, &n), DSHIM_OK);
            sent += n;
        }
        const void *p;
        size_t avail;
        ck_assert_int_eq(b->ops->peek(b, &p, &avail), DSHIM_OK);
        size_t take = avail < len - got ? avail : len - got;
        if (got == 0) {
            take = take < 3 ? 0 : 3; /* the prefix */
        } else if (take < len - got) {
            take -= take % 8; /* whole elements only */
        }
        if (take > 0) {
            memcpy(dst + got, p, take);
            ck_assert_int_eq(b->ops->consume(b, take), DSHIM_OK);
            got += take;
        }
    }
    ck_assert_msg(memcmp(src, dst, len) == 0, "the stream arrived changed");
    ck_assert_uint_eq(b->bytes_received, len);
    free(src);
    free(dst);
    a->ops->destroy(a);
    b->ops->destroy(b);
}
END_TEST

/* A header and a payload in one call each way; recv_ahead stages what
 * follows the header for the peek after it. */
START_TEST(test_send2_recv2_recv_ahead)
{
    dshim_conn_t *a, *b;
    pair(&a, &b);
    unsigned char hdr[48], body[10007], h2[48], b2[10007];
    fill(hdr, sizeof(hdr), 1);
    fill(body, sizeof(body), 2);
    size_t n, sent = 0, got = 0, total = sizeof(hdr) + sizeof(body);
    ck_assert_int_eq(a->ops->send2(a, hdr, sizeof(hdr), body, sizeof(body), &n), DSHIM_OK);
    sent = n;
    ck_assert_uint_ge(sent, sizeof(hdr)); /* loopback takes 10 KiB at once */
    double end = now_s() + DEADLINE_S;
    while (got < total) {
        ck_assert(now_s() < end);
        if (sent < total) {
            ck_assert_int_eq(a->ops->send(a, body + (sent - sizeof(hdr)), total - sent, &n), DSHIM_OK);
            sent += n;
        }
        if (got < sizeof(hdr)) {
            ck_assert_int_eq(b->ops->recv2(b, h2 + got, sizeof(hdr) - got, b2, sizeof(b2), &n), DSHIM_OK);
        } else {
            ck_assert_int_eq(b->ops->recv(b, b2 + (got - sizeof(hdr)), total - got, &n), DSHIM_OK);
        }
        got += n;
    }
    ck_assert(memcmp(hdr, h2, sizeof(hdr)) == 0 && memcmp(body, b2, sizeof(body)) == 0);

    /* send2 with an empty second buffer, then recv_ahead of the header:
     * the payload behind it is staged for peek */
    ck_assert_int_eq(a->ops->send2(a, hdr, sizeof(hdr), NULL, 0, &n), DSHIM_OK);
    ck_assert_uint_eq(n, sizeof(hdr));
    ck_assert_int_eq(a->ops->send(a, body, 4096, &n), DSHIM_OK);
    ck_assert_uint_eq(n, 4096);
    got = 0;
    while (got < sizeof(hdr)) {
        ck_assert(now_s() < end);
        ck_assert_int_eq(b->ops->recv_ahead(b, h2 + got, sizeof(hdr) - got, &n), DSHIM_OK);
        got += n;
    }
    ck_assert(memcmp(hdr, h2, sizeof(hdr)) == 0);
    const unsigned char *p;
    peek_at_least(b, &p, 4096);
    ck_assert(memcmp(p, body, 4096) == 0);
    a->ops->destroy(a);
    b->ops->destroy(b);
}
END_TEST

/* Receives until the connection fails; returns the bytes that came first. */
static size_t recv_until_error(dshim_conn_t *c, dshim_status_t *st_p)
{
    char buf[4096];
    size_t total = 0, n = 0;
    double end = now_s() + DEADLINE_S;
    dshim_status_t st;
    while ((st = c->ops->recv(c, buf, sizeof(buf), &n)) == DSHIM_OK) {
        ck_assert_msg(now_s() < end, "no error %.0f s after the peer closed", DEADLINE_S);
        total += n;
    }
    *st_p = st;
    return total;
}

START_TEST(test_peer_closes)
{
    dshim_conn_t *a, *b;
    pair(&a, &b);
    a->peer_job = 3; /* as on a sub-communicator */
    size_t n;
    ck_assert_int_eq(b->ops->send(b, "goodbye", 7, &n), DSHIM_OK);
    ck_assert_uint_eq(n, 7);
    b->ops->destroy(b);
    dshim_status_t st;
    ck_assert_uint_eq(recv_until_error(a, &st), 7); /* what it sent arrives first */
    ck_assert_int_eq(st, DSHIM_ERR_PEER);
    ck_assert_msg(strstr(dshim_last_error(), "rank 1 (job rank 3) closed the connection"), "message: %s",
                  dshim_last_error());
    ck_assert_int_ne(a->ops->hung_up(a), 0);
    /* peek fails alike */
    const void *p;
    size_t avail;
    ck_assert_int_eq(a->ops->peek(a, &p, &avail), DSHIM_ERR_PEER);
    /* a send into the closed peer fails with an error, not SIGPIPE (this
     * process would die of it); the first may still be taken by the kernel */
    static char big[64 << 10];
    double end = now_s() + DEADLINE_S;
    while ((st = a->ops->send(a, big, sizeof(big), &n)) == DSHIM_OK) {
        ck_assert_msg(now_s() < end, "sends into a closed peer kept succeeding");
    }
    ck_assert_int_eq(st, DSHIM_ERR_PEER);
    ck_assert_msg(strstr(dshim_last_error(), "connection to rank 1 (job rank 3) failed"), "message: %s",
                  dshim_last_error());
    a->ops->destroy(a);
}
END_TEST

/* A peer in another process sends 3 MiB through its own connection and
 * exits; this side receives all of it, then the error naming rank 1. */
START_TEST(test_two_processes_peer_exits)
{
    int port;
    int l = listen_loopback(&port);
    size_t len = 3 * MIB + 1;
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(l);
        int s = connect_loopback(port);
        dshim_transport_peer_t peer = {.rank = 0, .same_host = 1, .ip = htonl(INADDR_LOOPBACK),
                                       .my_ip = htonl(INADDR_LOOPBACK), .addr = ""};
        dshim_conn_t *c;
        unsigned char *src = malloc(len);
        if (s < 0 || !src || tcp()->connect(NULL, &peer, s, &c) != DSHIM_OK) {
            _exit(2);
        }
        fill(src, len, 77);
        size_t sent = 0, n;
        while (sent < len) {
            if (c->ops->send(c, src + sent, len - sent, &n) != DSHIM_OK) {
                _exit(3);
            }
            sent += n;
            if (n == 0) {
                struct pollfd pfd = {.fd = c->fd, .events = POLLOUT};
                poll(&pfd, 1, 100);
            }
        }
        _exit(0); /* the kernel closes the socket */
    }
    int t = accept4(l, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    close(l);
    ck_assert_int_ge(t, 0);
    dshim_conn_t *c = wrap(t, 1);
    unsigned char *want = malloc(len), *dst = malloc(len);
    ck_assert(want && dst);
    fill(want, len, 77);
    size_t got = 0, n;
    dshim_status_t st = DSHIM_OK;
    double end = now_s() + DEADLINE_S;
    while (got < len && now_s() < end) {
        st = c->ops->recv(c, dst + got, len - got, &n);
        if (st != DSHIM_OK) {
            break;
        }
        got += n;
        if (n == 0) {
            struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
            poll(&pfd, 1, 100);
        }
    }
    int status = 0;
    if (got < len) {
        kill(pid, SIGKILL);
    }
    waitpid(pid, &status, 0);
    ck_assert_msg(got == len && st == DSHIM_OK, "got %zu of %zu bytes (%s)", got, len,
                  st ? dshim_last_error() : "in time");
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the sending process failed (status %d)",
                  status);
    ck_assert(memcmp(want, dst, len) == 0);
    ck_assert_uint_eq(recv_until_error(c, &st), 0);
    ck_assert_int_eq(st, DSHIM_ERR_PEER);
    ck_assert_msg(strstr(dshim_last_error(), "rank 1 closed the connection"), "message: %s", dshim_last_error());
    c->ops->destroy(c);
    free(want);
    free(dst);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("tcp");
    TCase *tc = tcase_create("tcp");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_connect_takes_the_socket);
    tcase_add_test(tc, test_sizes);
    tcase_add_test(tc, test_large_partial_sends);
    tcase_add_test(tc, test_nothing_there);
    tcase_add_test(tc, test_peek_consume_recv_mix);
    tcase_add_test(tc, test_peek_consume_stream);
    tcase_add_test(tc, test_send2_recv2_recv_ahead);
    tcase_add_test(tc, test_peer_closes);
    tcase_add_test(tc, test_two_processes_peer_exits);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

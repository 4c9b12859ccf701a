/* Unit tests of the rendezvous key-value store (shim/store_*.c): the API,
 * concurrency, and a server that keeps serving while hostile or broken
 * clients misbehave.  Every server binds 127.0.0.1 on an ephemeral port. */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ck_free_port.h"
#include "status.h"
#include "store.h"
#include "store_proto.h"

#define TOKEN "job-secret-123"

static char log_path[64];

static double now_s(void)
{
    return dshim_store_now();
}

static void sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
    }
}

static dshim_store_server_t *start_server(int *port)
{
    dshim_store_server_t *srv = NULL;
    ck_assert_int_eq(dshim_store_server_start("127.0.0.1", 0, TOKEN, &srv, port), DSHIM_OK);
    ck_assert_ptr_nonnull(srv);
    ck_assert_int_gt(*port, 0);
    return srv;
}

static dshim_store_t *connect_ok(int port)
{
    dshim_store_t *s = NULL;
    dshim_status_t st = dshim_store_connect("127.0.0.1", port, TOKEN, 5.0, &s);
    ck_assert_msg(st == DSHIM_OK, "connect: %s", dshim_last_error());
    return s;
}

static void expect_value(dshim_store_t *s, const char *key, const char *want)
{
    void *v = NULL;
    size_t n = 0;
    dshim_status_t st = dshim_store_get(s, key, 5.0, &v, &n);
    ck_assert_msg(st == DSHIM_OK, "get %s: %s", key, dshim_last_error());
    ck_assert_uint_eq(n, strlen(want));
    ck_assert_mem_eq(v, want, n);
    ck_assert_int_eq(((char *)v)[n], 0);
    free(v);
}

/* The good client still gets quick, correct answers. */
static void good_client_works(dshim_store_t *s, const char *tag)
{
    char key[64], val[64];
    snprintf(key, sizeof(key), "good/%s", tag);
    snprintf(val, sizeof(val), "value-%s", tag);
    double t0 = now_s();
    ck_assert_int_eq(dshim_store_set(s, key, val, strlen(val)), DSHIM_OK);
    expect_value(s, key, val);
    int64_t r = 0;
    ck_assert_int_eq(dshim_store_add(s, "good/counter", 1, &r), DSHIM_OK);
    ck_assert_msg(now_s() - t0 < 2.0, "good client was delayed %.2f s", now_s() - t0);
}

/* ---- raw sockets playing a broken or hostile client ---- */

static int raw_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    return fd;
}

static void raw_send(int fd, const void *buf, size_t len)
{
    ck_assert_int_eq(send(fd, buf, len, MSG_NOSIGNAL), (ssize_t)len);
}

static void raw_hello(int fd, const char *token, uint16_t version)
{
    uint8_t h[DSHIM_STORE_HELLO_HDR];
    dshim_store_put_u32(h, DSHIM_STORE_MAGIC);
    dshim_store_put_u16(h + 4, version);
    dshim_store_put_u16(h + 6, 0);
    dshim_store_put_u32(h + 8, (uint32_t)strlen(token));
    raw_send(fd, h, sizeof(h));
    raw_send(fd, token, strlen(token));
}

/* Reads the 8-byte hello ack; returns its status, or -1 if none came. */
static int raw_ack(int fd)
{
    uint8_t ack[DSHIM_STORE_ACK_LEN];
    size_t have = 0;
    while (have < sizeof(ack)) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 5000) != 1) {
            return -1;
        }
        ssize_t n = recv(fd, ack + have, sizeof(ack) - have, 0);
        if (n <= 0) {
            return -1;
        }
        have += (size_t)n;
    }
    ck_assert_uint_eq(dshim_store_get_u32(ack), DSHIM_STORE_MAGIC);
    return dshim_store_get_u16(ack + 6);
}

static void raw_request_header(int fd, uint32_t kind, uint32_t klen, uint64_t vlen)
{
    uint8_t h[DSHIM_STORE_REQ_HDR];
    dshim_store_put_u32(h, kind);
    dshim_store_put_u32(h + 4, 1);
    dshim_store_put_u32(h + 8, klen);
    dshim_store_put_u32(h + 12, 0);
    dshim_store_put_u64(h + 16, vlen);
    raw_send(fd, h, sizeof(h));
}

/* 1 if the server closed fd within timeout_s (EOF or reset). */
static int raw_closed(int fd, double timeout_s)
{
    double end = now_s() + timeout_s;
    char buf[256];
    for (;;) {
        int ms = (int)((end - now_s()) * 1000);
        if (ms <= 0) {
            return 0;
        }
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, ms) != 1) {
            continue;
        }
        ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno == ECONNRESET)) {
            return 1;
        }
    }
}

static int wait_rejected(dshim_store_server_t *srv, uint64_t want, double timeout_s)
{
    double end = now_s() + timeout_s;
    while (dshim_store_server_rejected(srv) < want) {
        if (now_s() > end) {
            return 0;
        }
        sleep_ms(10);
    }
    return dshim_store_server_rejected(srv) == want;
}

/* ---- API ---- */

START_TEST(test_basic_ops)
{
    int port;
    dshim_store_server_t *srv = start_server(&port);
    dshim_store_t *s = connect_ok(port);
    void *v = NULL;
    size_t n = 99;

    ck_assert_int_eq(dshim_store_set(s, "a", "hello", 5), DSHIM_OK);
    expect_value(s, "a", "hello");
    ck_assert_int_eq(dshim_store_set(s, "a", "world!", 6), DSHIM_OK);
    expect_value(s, "a", "world!");

    uint8_t bin[1000];
    for (size_t i = 0; i < sizeof(bin); i++) {
        bin[i] = (uint8_t)(i * 7);  /* includes zero bytes */
    }
    ck_assert_int_eq(dshim_store_set(s, "bin", bin, sizeof(bin)), DSHIM_OK);
    ck_assert_int_eq(dshim_store_get(s, "bin", 1.0, &v, &n), DSHIM_OK);
    ck_assert_uint_eq(n, sizeof(bin));
    ck_assert_mem_eq(v, bin, sizeof(bin));
    free(v);

    ck_assert_int_eq(dshim_store_set(s, "empty", NULL, 0), DSHIM_OK);
    ck_assert_int_eq(dshim_store_get(s, "empty", 1.0, &v, &n), DSHIM_OK);
    ck_assert_ptr_nonnull(v);
    ck_assert_uint_eq(n, 0);
    free(v);

    ck_assert_int_eq(dshim_store_try_get(s, "absent", &v, &n), DSHIM_INPROGRESS);
    ck_assert_ptr_null(v);
    ck_assert_uint_eq(n, 0);
    ck_assert_int_eq(dshim_store_try_get(s, "a", &v, &n), DSHIM_OK);
    ck_assert_uint_eq(n, 6);
    free(v);

    int64_t r = 0;
    ck_assert_int_eq(dshim_store_add(s, "cnt", 5, &r), DSHIM_OK);
    ck_assert_int_eq(r, 5);
    ck_assert_int_eq(dshim_store_add(s, "cnt", -7, &r), DSHIM_OK);
    ck_assert_int_eq(r, -2);
    expect_value(s, "cnt", "-2");
    ck_assert_int_eq(dshim_store_add(s, "a", 1, &r), DSHIM_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(dshim_last_error(), "not an integer counter"));
    ck_assert_int_eq(dshim_store_set(s, "max", "9223372036854775807", 19), DSHIM_OK);
    ck_assert_int_eq(dshim_store_add(s, "max", 1, &r), DSHIM_ERR_INVALID);
    ck_assert_int_eq(dshim_store_add(s, "max", -7, &r), DSHIM_OK);
    ck_assert_int_eq(r, INT64_MAX - 7);

    int won = -1;
    ck_assert_int_eq(dshim_store_set_if_absent(s, "once", "x", 1, &won), DSHIM_OK);
    ck_assert_int_eq(won, 1);
    ck_assert_int_eq(dshim_store_set_if_absent(s, "once", "y", 1, &won), DSHIM_OK);
    ck_assert_int_eq(won, 0);
    expect_value(s, "once", "x");

    ck_assert_int_eq(dshim_store_delete(s, "once"), DSHIM_OK);
    ck_assert_int_eq(dshim_store_try_get(s, "once", &v, &n), DSHIM_INPROGRESS);
    ck_assert_int_eq(dshim_store_delete(s, "once"), DSHIM_OK);
    ck_assert_int_eq(dshim_store_set_if_absent(s, "once", "z", 1, &won), DSHIM_OK);
    ck_assert_int_eq(won, 1);

    /* limits are checked before anything is sent; the connection stays fine */
    char longkey[DSHIM_STORE_KEY_MAX + 2];
    memset(longkey, 'k', sizeof(longkey) - 1);
    longkey[sizeof(longkey) - 1] = 0;
    ck_assert_int_eq(dshim_store_set(s, longkey, "v", 1), DSHIM_ERR_INVALID);
    longkey[DSHIM_STORE_KEY_MAX] = 0;
    ck_assert_int_eq(dshim_store_set(s, longkey, "v", 1), DSHIM_OK);
    expect_value(s, longkey, "v");
    ck_assert_int_eq(dshim_store_set(s, "", "v", 1), DSHIM_ERR_INVALID);
    ck_assert_int_eq(dshim_store_set(s, "toolarge", "v", DSHIM_STORE_VALUE_MAX + 1), DSHIM_ERR_INVALID);

    size_t big_len = 8u << 20;
    uint8_t *big = malloc(big_len);
    for (size_t i = 0; i < big_len; i++) {
        big[i] = (uint8_t)(i ^ (i >> 9));
    }
    ck_assert_int_eq(dshim_store_set(s, "big", big, big_len), DSHIM_OK);
    ck_assert_int_eq(dshim_store_get(s, "big", 5.0, &v, &n), DSHIM_OK);
    ck_assert_uint_eq(n, big_len);
    ck_assert_int_eq(memcmp(v, big, big_len), 0);
    free(v);
    free(big);

    expect_value(s, "a", "world!");
    dshim_store_close(s);
    ck_assert_uint_eq(dshim_store_server_rejected(srv), 0);
    dshim_store_server_stop(srv);
}
END_TEST

typedef struct setter_arg {
    int port;
    int delay_ms;
    const char *key;
    const char *val;
    dshim_status_t st;
} setter_arg_t;

static void *late_setter(void *p)
{
    setter_arg_t *a = p;
    dshim_store_t *s = NULL;
    a->st = dshim_store_connect("127.0.0.1", a->port, TOKEN, 5.0, &s);
    if (a->st == DSHIM_OK) {
        sleep_ms(a->delay_ms);
        a->st = dshim_store_set(s, a->key, a->val, strlen(a->val));
        dshim_store_close(s);
    }
    return NULL;
}

typedef struct getter_arg {
    int port;
    const char *key;
    double timeout_s;
    dshim_store_t *store;  /* NULL: open its own */
    dshim_status_t st;
    char val[64];
    double elapsed;
} getter_arg_t;

static void *getter(void *p)
{
    getter_arg_t *a = p;
    dshim_store_t *s = a->store;
    if (!s && dshim_store_connect("127.0.0.1", a->port, TOKEN, 5.0, &s) != DSHIM_OK) {
        a->st = DSHIM_ERR_INTERNAL;
        return NULL;
    }
    void *v = NULL;
    size_t n = 0;
    double t0 = now_s();
    a->st = dshim_store_get(s, a->key, a->timeout_s, &v, &n);
    a->elapsed = now_s() - t0;
    if (a->st == DSHIM_OK) {
        snprintf(a->val, sizeof(a->val), "%.*s", (int)n, (char *)v);
        free(v);
    } else {
        snprintf(a->val, sizeof(a->val), "%.63s", dshim_last_error());
    }
    if (!a->store) {
        dshim_store_close(s);
    }
    return NULL;
}

START_TEST(test_get_waits_for_later_set)
{
    int port;
    dshim_store_server_t *srv = start_server(&port);
    enum { WAITERS = 4 };
    getter_arg_t g[WAITERS];
    pthread_t gt[WAITERS];
    for (int i = 0; i < WAITERS; i++) {
        g[i] = (getter_arg_t){.port = port, .key = "late", .timeout_s = 10.0};
        ck_assert_int_eq(pthread_create(&gt[i], NULL, getter, &g[i]), 0);
    }
    setter_arg_t sa = {.port = port, .delay_ms = 300, .key = "late", .val = "arrived"};
    pthread_t st;
    ck_assert_int_eq(pthread_create(&st, NULL, late_setter, &sa), 0);

    dshim_store_t *s = connect_ok(port);
    void *v = NULL;
    size_t n = 0;
    double t0 = now_s();
    ck_assert_int_eq(dshim_store_get(s, "late", 10.0, &v, &n), DSHIM_OK);
    double waited = now_s() - t0;
    ck_assert_uint_eq(n, 7);
    ck_assert_mem_eq(v, "arrived", 7);
    free(v);
    ck_assert_msg(waited > 0.15 && waited < 5.0, "get returned after %.2f s", waited);

    pthread_join(st, NULL);
    ck_assert_int_eq(sa.st, DSHIM_OK);
    for (int i = 0; i < WAITERS; i++) {
        pthread_join(gt[i], NULL);
        ck_assert_msg(g[i].st == DSHIM_OK, "waiter %d: %s", i, g[i].val);
        ck_assert_str_eq(g[i].val, "arrived");
    }
    /* a key that exists answers at once, even with a zero wait */
    ck_assert_int_eq(dshim_store_get(s, "late", 0.0, &v, &n), DSHIM_OK);
    free(v);
    dshim_store_close(s);
    dshim_store_server_stop(srv);
}
END_TEST

START_TEST(test_get_timeout)
{
    int port;
    dshim_store_server_t *srv = start_server(&port);
    dshim_store_t *s = connect_ok(port);
    void *v = (void *)1;
    size_t n = 1;
    double t0 = now_s();
    ck_assert_int_eq(dshim_store_get(s, "never/set", 0.3, &v, &n), DSHIM_ERR_TIMEOUT);
    double waited = now_s() - t0;
    ck_assert_msg(waited >= 0.25 && waited < 3.0, "timed out after %.2f s", waited);
    ck_assert_ptr_null(v);
    ck_assert_ptr_nonnull(strstr(dshim_last_error(), "never/set"));
    ck_assert_int_eq(dshim_store_get(s, "never/set", 0.0, &v, &n), DSHIM_ERR_TIMEOUT);
    /* the connection is still in step after a timeout */
    good_client_works(s, "after-timeout");
    dshim_store_close(s);
    dshim_store_server_stop(srv);
}
END_TEST

/* ---- concurrency ---- */

enum { ADD_THREADS = 16, ADDS_PER_THREAD = 200, TOTAL_ADDS = ADD_THREADS * ADDS_PER_THREAD };

typedef struct adder_arg {
    int port;
    dshim_store_t *shared;  /* NULL: own connection */
    const char *key;
    unsigned char *seen;    /* seen[result] marks each returned count */
    int errors;
} adder_arg_t;

static void *adder(void *p)
{
    adder_arg_t *a = p;
    dshim_store_t *s = a->shared;
    if (!s && dshim_store_connect("127.0.0.1", a->port, TOKEN, 5.0, &s) != DSHIM_OK) {
        a->errors++;
        return NULL;
    }
    for (int i = 0; i < ADDS_PER_THREAD; i++) {
        int64_t r = 0;
        if (dshim_store_add(s, a->key, 1, &r) != DSHIM_OK || r < 1 || r > TOTAL_ADDS) {
            a->errors++;
            continue;
        }
        if (__atomic_exchange_n(&a->seen[r], 1, __ATOMIC_RELAXED)) {
            a->errors++;  /* two adds saw the same count */
        }
    }
    if (!a->shared) {
        dshim_store_close(s);
    }
    return NULL;
}

static void run_adders(int port, dshim_store_t *shared, const char *key)
{
    unsigned char *seen = calloc(TOTAL_ADDS + 1, 1);
    adder_arg_t args[ADD_THREADS];
    pthread_t th[ADD_THREADS];
    for (int i = 0; i < ADD_THREADS; i++) {
        args[i] = (adder_arg_t){.port = port, .shared = shared, .key = key, .seen = seen};
        ck_assert_int_eq(pthread_create(&th[i], NULL, adder, &args[i]), 0);
    }
    for (int i = 0; i < ADD_THREADS; i++) {
        pthread_join(th[i], NULL);
        ck_assert_int_eq(args[i].errors, 0);
    }
    for (int i = 1; i <= TOTAL_ADDS; i++) {
        ck_assert_int_eq(seen[i], 1);
    }
    free(seen);
}

START_TEST(test_many_clients_add)
{
    int port;
    dshim_store_server_t *srv = start_server(&port);
    run_adders(port, NULL, "hammer");
    dshim_store_t *s = connect_ok(port);
    int64_t r = 0;
    ck_assert_int_eq(dshim_store_add(s, "hammer", 0, &r), DSHIM_OK);
    ck_assert_int_eq(r, TOTAL_ADDS);
    /* and one connection shared by every thread (the client's mutex) */
    run_adders(port, s, "shared");
    ck_assert_int_eq(dshim_store_add(s, "shared", 0, &r), DSHIM_OK);
    ck_assert_int_eq(r, TOTAL_ADDS);
    dshim_store_close(s);
    dshim_store_server_stop(srv);
}
END_TEST

/* ---- hostile and broken clients ---- */

static int log_contains(const char *a, const char *b)
{
    FILE *f = fopen(log_path, "r");
    if (!f) {
        return 0;
    }
    char line[4096];
    int found = 0;
    while (!found && fgets(line, sizeof(line), f)) {
        found = strstr(line, a) && strstr(line, b);
    }
    fclose(f);
    return found;
}

START_TEST(test_wrong_token_rejected)
{
    int port;
    dshim_store_server_t *srv = start_server(&port);
    dshim_store_t *good = connect_ok(port);
    good_client_works(good, "before");

    dshim_store_t *bad = NULL;
    ck_assert_int_eq(dshim_store_connect("127.0.0.1", port, "wrong-token", 5.0, &bad), DSHIM_ERR_PROTOCOL);
    ck_assert_ptr_null(bad);
    ck_assert_ptr_nonnull(strstr(dshim_last_error(), "job token"));
    ck_assert(wait_rejected(srv, 1, 5.0));
    /* a token that is a prefix of the right one is wrong too */
    ck_assert_int_eq(dshim_store_connect("127.0.0.1", port, "job-secret", 5.0, &bad), DSHIM_ERR_PROTOCOL);
    ck_assert(wait_rejected(srv, 2, 5.0));
    ck_assert_msg(log_contains("store: rejected connection from 127.0.0.1:", ": bad job token"),
                  "no WARN line naming the remote address and the reason in %s", log_path);

    good_client_works(good, "after");
    dshim_store_close(good);
    dshim_store_server_stop(srv);
}
END_TEST

START_TEST(test_garbage_rejected)
{
    int port;
    dshim_store_server_t *srv = start_server(&port);
    dshim_store_t *good = connect_ok(port);
    uint64_t rej = 0;

    /* random bytes */
    int fd = raw_connect(port);
    uint8_t junk[512];
    unsigned seed = 12345;
    for (size_t i = 0; i < sizeof(junk); i++) {
        junk[i] = (uint8_t)(rand_r(&seed) >> 7);
    }
    junk[0] = 0xff;  /* never the magic */
    raw_send(fd, junk, sizeof(junk));
    ck_assert(raw_closed(fd, 5.0));
    close(fd);
    ck_assert(wait_rejected(srv, ++rej, 5.0));
    good_client_works(good, "junk");

    /* a hello declaring a 4 GiB token */
    fd = raw_connect(port);
    uint8_t h[DSHIM_STORE_HELLO_HDR];
    dshim_store_put_u32(h, DSHIM_STORE_MAGIC);
    dshim_store_put_u16(h + 4, DSHIM_STORE_VERSION);
    dshim_store_put_u16(h + 6, 0);
    dshim_store_put_u32(h + 8, 0xffffffffu);
    raw_send(fd, h, sizeof(h));
    ck_assert(raw_closed(fd, 5.0));
    close(fd);
    ck_assert(wait_rejected(srv, ++rej, 5.0));

    /* a wrong protocol version gets told so */
    fd = raw_connect(port);
    raw_hello(fd, TOKEN, DSHIM_STORE_VERSION + 1);
    ck_assert_int_eq(raw_ack(fd), DSHIM_STORE_HELLO_BAD_VERSION);
    ck_assert(raw_closed(fd, 5.0));
    close(fd);
    ck_assert(wait_rejected(srv, ++rej, 5.0));

    /* authenticated, then a huge declared value length */
    fd = raw_connect(port);
    raw_hello(fd, TOKEN, DSHIM_STORE_VERSION);
    ck_assert_int_eq(raw_ack(fd), DSHIM_STORE_HELLO_OK);
    raw_request_header(fd, DSHIM_STORE_REQ_SET, 3, 1ull << 40);
    ck_assert(raw_closed(fd, 5.0));
    close(fd);
    ck_assert(wait_rejected(srv, ++rej, 5.0));
    good_client_works(good, "huge-value");

    /* a key over the limit */
    fd = raw_connect(port);
    raw_hello(fd, TOKEN, DSHIM_STORE_VERSION);
    ck_assert_int_eq(raw_ack(fd), DSHIM_STORE_HELLO_OK);
    raw_request_header(fd, DSHIM_STORE_REQ_GET, DSHIM_STORE_KEY_MAX + 1, 0);
    ck_assert(raw_closed(fd, 5.0));
    close(fd);
    ck_assert(wait_rejected(srv, ++rej, 5.0));

    /* an unknown message kind */
    fd = raw_connect(port);
    raw_hello(fd, TOKEN, DSHIM_STORE_VERSION);
    ck_assert_int_eq(raw_ack(fd), DSHIM_STORE_HELLO_OK);
    raw_request_header(fd, 99, 1, 0);
    raw_send(fd, "k", 1);
    ck_assert(raw_closed(fd, 5.0));
    close(fd);
    ck_assert(wait_rejected(srv, ++rej, 5.0));
    ck_assert(log_contains("store: rejected connection from 127.0.0.1:", "unknown message kind 99"));

    good_client_works(good, "after-all");
    dshim_store_close(good);
    dshim_store_server_stop(srv);
}
END_TEST

START_TEST(test_connect_then_close)
{
    int port;
    dshim_store_server_t *srv = start_server(&port);
    dshim_store_t *good = connect_ok(port);
    for (int i = 0; i < 3; i++) {
        close(raw_connect(port));
    }
    ck_assert(wait_rejected(srv, 3, 5.0));
    good_client_works(good, "after-close");
    dshim_store_close(good);
    dshim_store_server_stop(srv);
}
END_TEST

/* Half a request, half a hello, and nothing at all: none of them may delay
 * the good client; the two without a hello are dropped after ~10 s. */
START_TEST(test_partial_then_silence)
{
    int port;
    dshim_store_server_t *srv = start_server(&port);
    dshim_store_t *good = connect_ok(port);

    int half_req = raw_connect(port);
    raw_hello(half_req, TOKEN, DSHIM_STORE_VERSION);
    ck_assert_int_eq(raw_ack(half_req), DSHIM_STORE_HELLO_OK);
    raw_request_header(half_req, DSHIM_STORE_REQ_SET, 100, 100);
    raw_send(half_req, "partial-key", 11);

    int half_hello = raw_connect(port);
    raw_send(half_hello, "DSK", 3);
    int silent = raw_connect(port);
    double t0 = now_s();

    for (int i = 0; i < 20; i++) {
        char tag[16];
        snprintf(tag, sizeof(tag), "p%d", i);
        good_client_works(good, tag);
    }
    setter_arg_t sa = {.port = port, .delay_ms = 100, .key = "during-silence", .val = "ok"};
    pthread_t st;
    ck_assert_int_eq(pthread_create(&st, NULL, late_setter, &sa), 0);
    expect_value(good, "during-silence", "ok");
    pthread_join(st, NULL);
    ck_assert_int_eq(dshim_store_server_rejected(srv), 0);

    ck_assert(raw_closed(half_hello, 15.0));
    ck_assert(raw_closed(silent, 5.0));
    double dropped_after = now_s() - t0;
    ck_assert_msg(dropped_after > 8.0 && dropped_after < 14.0, "dropped after %.1f s", dropped_after);
    ck_assert(wait_rejected(srv, 2, 5.0));
    /* an authenticated client may take its time: still connected */
    ck_assert(!raw_closed(half_req, 0.2));

    good_client_works(good, "after-silence");
    close(half_hello);
    close(silent);
    close(half_req);
    dshim_store_close(good);
    dshim_store_server_stop(srv);
}
END_TEST

/* A client that asks for a big value again and again and never reads. */
START_TEST(test_client_that_never_reads)
{
    int port;
    dshim_store_server_t *srv = start_server(&port);
    dshim_store_t *good = connect_ok(port);
    size_t big_len = 4u << 20;
    uint8_t *big = calloc(1, big_len);
    ck_assert_int_eq(dshim_store_set(good, "big", big, big_len), DSHIM_OK);
    free(big);

    int fd = raw_connect(port);
    raw_hello(fd, TOKEN, DSHIM_STORE_VERSION);
    ck_assert_int_eq(raw_ack(fd), DSHIM_STORE_HELLO_OK);
    for (int i = 0; i < 8; i++) {
        raw_request_header(fd, DSHIM_STORE_REQ_GET, 3, 0);
        raw_send(fd, "big", 3);
    }
    sleep_ms(200);
    for (int i = 0; i < 10; i++) {
        char tag[16];
        snprintf(tag, sizeof(tag), "nr%d", i);
        good_client_works(good, tag);
    }
    close(fd);
    good_client_works(good, "reader-gone");
    dshim_store_close(good);
    dshim_store_server_stop(srv);
}
END_TEST

/* ---- start-up and shut-down ---- */

START_TEST(test_port_in_use)
{
    dshim_store_server_t *a = NULL, *b = NULL;
    int port = 0;
    ck_assert_int_eq(dshim_store_server_start("0.0.0.0", 0, TOKEN, &a, &port), DSHIM_OK);
    ck_assert_int_eq(dshim_store_server_start("0.0.0.0", port, TOKEN, &b, NULL), DSHIM_ERR_SYSTEM);
    ck_assert_ptr_null(b);
    char want[512];
    snprintf(want, sizeof(want),
             "cannot listen on 0.0.0.0:%d for the rendezvous store: Address already in use; choose another "
             "port with MASTER_PORT or DSHIM_STORE_PORT, or stop the process that holds it", port);
    ck_assert_str_eq(dshim_last_error(), want);
    /* "" means every interface as well */
    ck_assert_int_eq(dshim_store_server_start("", port, TOKEN, &b, NULL), DSHIM_ERR_SYSTEM);
    dshim_store_server_stop(a);
}
END_TEST

typedef struct late_server_arg {
    int port;
    dshim_store_server_t *srv;
    dshim_status_t st;
} late_server_arg_t;

static void *late_server(void *p)
{
    late_server_arg_t *a = p;
    sleep_ms(500);
    a->st = dshim_store_server_start("localhost", a->port, TOKEN, &a->srv, NULL);
    return NULL;
}

START_TEST(test_connect_retry)
{
    late_server_arg_t a = {.port = ck_free_port()};
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, late_server, &a), 0);
    dshim_store_t *s = NULL;
    double t0 = now_s();
    dshim_status_t st = dshim_store_connect("localhost", a.port, TOKEN, 10.0, &s);
    double waited = now_s() - t0;
    pthread_join(th, NULL);
    ck_assert_msg(a.st == DSHIM_OK, "late server did not start: %s", dshim_last_error());
    ck_assert_msg(st == DSHIM_OK, "connect: %s", dshim_last_error());
    ck_assert_msg(waited > 0.4 && waited < 5.0, "connected after %.2f s", waited);
    good_client_works(s, "retry");
    dshim_store_close(s);
    dshim_store_server_stop(a.srv);
}
END_TEST

START_TEST(test_connect_timeout)
{
    int port = ck_free_port();
    dshim_store_t *s = NULL;
    double t0 = now_s();
    ck_assert_int_eq(dshim_store_connect("127.0.0.1", port, TOKEN, 0.5, &s), DSHIM_ERR_TIMEOUT);
    double waited = now_s() - t0;
    ck_assert_msg(waited >= 0.45 && waited < 3.0, "gave up after %.2f s", waited);
    ck_assert_ptr_null(s);
    char where[64];
    snprintf(where, sizeof(where), "rendezvous store at 127.0.0.1:%d", port);
    ck_assert_ptr_nonnull(strstr(dshim_last_error(), where));
    ck_assert_int_eq(dshim_store_connect("no-such-host.invalid", port, TOKEN, 0.2, &s), DSHIM_ERR_TIMEOUT);
}
END_TEST

START_TEST(test_stop_while_waiting)
{
    int port;
    dshim_store_server_t *srv = start_server(&port);
    dshim_store_t *s = connect_ok(port);
    getter_arg_t g = {.port = port, .key = "never", .timeout_s = 30.0, .store = s};
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, getter, &g), 0);
    sleep_ms(300);
    dshim_store_server_stop(srv);
    pthread_join(th, NULL);
    ck_assert_int_eq(g.st, DSHIM_ERR_PEER);
    ck_assert_msg(g.elapsed < 5.0, "get returned %.2f s after the store stopped", g.elapsed);
    char where[64];
    snprintf(where, sizeof(where), "127.0.0.1:%d", port);
    ck_assert_msg(strstr(g.val, "lost the connection to the rendezvous store"), "%s", g.val);
    /* later calls fail fast and name the store too */
    ck_assert_int_eq(dshim_store_set(s, "k", "v", 1), DSHIM_ERR_PEER);
    ck_assert_ptr_nonnull(strstr(dshim_last_error(), where));
    dshim_store_close(s);
}
END_TEST

/* A failure reported at `<prefix>failed` answers every GET waiting under
 * <prefix> with its text (parked or later), and nothing else. */
START_TEST(test_failure_answers_waiters)
{
    int port;
    dshim_store_server_t *srv = start_server(&port);
    getter_arg_t parked = {.port = port, .key = "c0/peer/0", .timeout_s = 30.0};
    getter_arg_t other = {.port = port, .key = "c1/peer/0", .timeout_s = 1.0};
    pthread_t t1, t2;
    ck_assert_int_eq(pthread_create(&t1, NULL, getter, &parked), 0);
    ck_assert_int_eq(pthread_create(&t2, NULL, getter, &other), 0);
    sleep_ms(300);
    dshim_store_t *s = connect_ok(port);
    /* a key that merely ends in "failed" is no report */
    ck_assert_int_eq(dshim_store_set(s, "c0/notfailed", "x", 1), DSHIM_OK);
    ck_assert_int_eq(dshim_store_set(s, "c0/failed", "rank 0 failed: boom", 19), DSHIM_OK);
    pthread_join(t1, NULL);
    ck_assert_int_eq(parked.st, DSHIM_ERR_PEER);
    ck_assert_str_eq(parked.val, "rank 0 failed: boom");
    ck_assert_msg(parked.elapsed < 5.0, "parked get answered after %.2f s", parked.elapsed);
    /* another prefix keeps waiting and times out as usual */
    pthread_join(t2, NULL);
    ck_assert_int_eq(other.st, DSHIM_ERR_TIMEOUT);
    /* a later get of an absent key under the prefix is answered at once */
    void *v = NULL;
    size_t n = 0;
    double t0 = now_s();
    ck_assert_int_eq(dshim_store_get(s, "c0/s0c1/peer/1", 10.0, &v, &n), DSHIM_ERR_PEER);
    ck_assert_msg(now_s() - t0 < 2.0, "took %.2f s", now_s() - t0);
    ck_assert_str_eq(dshim_last_error(), "rank 0 failed: boom");
    /* keys that exist, and the report itself, are still served */
    ck_assert_int_eq(dshim_store_set(s, "c0/peer/1", "p1", 2), DSHIM_OK);
    ck_assert_int_eq(dshim_store_get(s, "c0/peer/1", 1.0, &v, &n), DSHIM_OK);
    free(v);
    ck_assert_int_eq(dshim_store_get(s, "c0/failed", 1.0, &v, &n), DSHIM_OK);
    ck_assert_uint_eq(n, 19);
    free(v);
    dshim_store_close(s);
    dshim_store_server_stop(srv);
}
END_TEST

/* Patience (dshim_store_patience): with the store's host stopped, a call
 * gives up after the bound with DSHIM_ERR_TIMEOUT instead of the store's
 * full timeout, and once the host runs again the same connection still
 * works: the late reply is dropped, the next answers are the right ones. */
START_TEST(test_patience_with_stopped_host)
{
    int port = ck_free_port();
    int ready[2];
    ck_assert_int_eq(pipe(ready), 0);
    pid_t host = fork();
    ck_assert_int_ge(host, 0);
    if (host == 0) {
        dshim_store_server_t *srv = NULL;
        char ok = dshim_store_server_start("127.0.0.1", port, TOKEN, &srv, NULL) == DSHIM_OK ? 'y' : 'n';
        (void)!write(ready[1], &ok, 1);
        for (;;) {
            pause();
        }
    }
    char ok = 0;
    ck_assert_int_eq(read(ready[0], &ok, 1), 1);
    ck_assert_int_eq(ok, 'y');
    dshim_store_t *s = connect_ok(port);
    ck_assert_int_eq(dshim_store_set(s, "before", "1", 1), DSHIM_OK);
    kill(host, SIGSTOP);
    int wst = 0;
    /* stopped for sure (the signal takes effect when the host is next scheduled) */
    ck_assert_int_eq(waitpid(host, &wst, WUNTRACED), host);
    ck_assert(WIFSTOPPED(wst));
    double prev = dshim_store_patience(1.0);
    double t0 = now_s();
    dshim_status_t st = dshim_store_set(s, "during", "2", 1);
    double waited = now_s() - t0;
    ck_assert_int_eq(st, DSHIM_ERR_TIMEOUT);
    ck_assert_msg(waited >= 0.95 && waited < 5.0, "gave up after %.2f s", waited);
    ck_assert_msg(strstr(dshim_last_error(), "did not answer set of key 'during' within 1.0 s"), "%s",
                  dshim_last_error());
    void *v = NULL;
    size_t n = 0;
    /* a store that has not answered the last patient call is not given the whole patience again
     * (0.05 s; the bound leaves room for a loaded machine) */
    t0 = now_s();
    ck_assert_int_eq(dshim_store_try_get(s, "before", &v, &n), DSHIM_ERR_TIMEOUT);
    ck_assert_msg(now_s() - t0 < 0.7, "second call gave up after %.2f s", now_s() - t0);
    ck_assert_int_eq(dshim_store_usable(s), 1);
    kill(host, SIGCONT);
    dshim_store_patience(prev);
    /* the two late replies are dropped; these answers are their own */
    ck_assert_int_eq(dshim_store_try_get(s, "during", &v, &n), DSHIM_OK);
    ck_assert_uint_eq(n, 1);
    ck_assert_int_eq(((char *)v)[0], '2');
    free(v);
    expect_value(s, "before", "1");
    int64_t sum = 0;
    ck_assert_int_eq(dshim_store_add(s, "counter", 5, &sum), DSHIM_OK);
    ck_assert_int_eq((int)sum, 5);
    ck_assert_int_eq(dshim_store_patience(0), 0);
    dshim_store_close(s);
    kill(host, SIGKILL);
    waitpid(host, NULL, 0);
}
END_TEST

static Suite *store_suite(void)
{
    Suite *su = suite_create("store");
    struct {
        const char *name;
        const TTest *test;
        int timeout_s;
    } cases[] = {
        {"basic", test_basic_ops, 20},
        {"get_waits", test_get_waits_for_later_set, 20},
        {"get_timeout", test_get_timeout, 20},
        {"many_clients", test_many_clients_add, 60},
        {"wrong_token", test_wrong_token_rejected, 20},
        {"garbage", test_garbage_rejected, 30},
        {"connect_close", test_connect_then_close, 20},
        {"partial_silence", test_partial_then_silence, 40},
        {"never_reads", test_client_that_never_reads, 30},
        {"port_in_use", test_port_in_use, 10},
        {"connect_retry", test_connect_retry, 20},
        {"connect_timeout", test_connect_timeout, 20},
        {"stop_while_waiting", test_stop_while_waiting, 20},
        {"failure_answers_waiters", test_failure_answers_waiters, 20},
        {"patience_with_stopped_host", test_patience_with_stopped_host, 20},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        TCase *tc = tcase_create(cases[i].name);
        tcase_set_timeout(tc, cases[i].timeout_s);
        tcase_add_test(tc, cases[i].test);
        suite_add_tcase(su, tc);
    }
    return su;
}

int main(void)
{
    /* The log goes to a file so tests can check the rejection lines. */
    snprintf(log_path, sizeof(log_path), "/tmp/check_store_log.XXXXXX");
    int lfd = mkstemp(log_path);
    if (lfd < 0) {
        perror("mkstemp");
        return 1;
    }
    close(lfd);
    setenv("DSHIM_DEBUG_FILE", log_path, 1);

    SRunner *sr = srunner_create(store_suite());
    srunner_run_all(sr, CK_ENV);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    if (failed) {
        fprintf(stderr, "--- dshim log (%s) ---\n", log_path);
        FILE *f = fopen(log_path, "r");
        char line[4096];
        while (f && fgets(line, sizeof(line), f)) {
            fputs(line, stderr);
        }
        if (f) {
            fclose(f);
        }
    }
    unlink(log_path);
    return failed ? 1 : 0;
}

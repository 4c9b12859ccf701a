/*
 * Unit tests of the shared-memory transport (backends/transport/shm/).
 *
 * Two-process tests fork: the parent creates both inbox segments in a
 * temporary directory, the child attaches to them by name, and the two talk
 * through dshim_conn objects with a socketpair as the control socket.  The
 * parent bounds its own loops and the child's lifetime (SIGKILL by PID).
 *
 * `check_shm --bench` instead prints throughput and latency figures.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "status.h"
#include "transport/shm/shm_cma.h"
#include "transport/shm/shm_copy.h"
#include "transport/shm/shm_layout.h"
#include "transport/shm/shm_ring.h"

#define MIB ((size_t)1 << 20)
#define STREAM_BYTES (64 * MIB)
#define BIDIR_BYTES (16 * MIB)
#define MAX_PIECE (3 * MIB)
#define WAIT_US 200000L
#define LOOP_DEADLINE_S 30.0
#define CHILD_GRACE_S 15.0
/* Waits that ran into WAIT_US although the peer kept working: a few happen
 * on a loaded machine, a lost wake-up makes thousands. */
#define MAX_TIMEOUTS 20

static char g_dir[64];

/* ---- helpers --------------------------------------------------------- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_s(double s)
{
    struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* The stream's 64-bit word number w (the bytes at offset 8w..8w+7). */
static uint64_t pattern_word(uint64_t w, uint64_t seed)
{
    uint64_t z = w + seed * 0x9e3779b97f4a7c15ULL + 1;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static void pattern_fill(void *buf, uint64_t offset, size_t len, uint64_t seed)
{
    uint64_t *w = buf;
    for (size_t i = 0; i < len / 8; i++) {
        w[i] = pattern_word(offset / 8 + i, seed);
    }
}

/* Returns the index of the first bad word, or SIZE_MAX when all match. */
static size_t pattern_check(const void *buf, uint64_t offset, size_t len, uint64_t seed)
{
    const uint64_t *w = buf;
    for (size_t i = 0; i < len / 8; i++) {
        if (w[i] != pattern_word(offset / 8 + i, seed)) {
            return i;
        }
    }
    return SIZE_MAX;
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *s = x;
    return x;
}

/* A multiple of 8 between 8 bytes and `max`, log-uniform so that small and
 * large pieces are both frequent. */
static size_t random_piece(uint64_t *s, size_t max)
{
    unsigned shift = (unsigned)(rng_next(s) % 20);
    size_t words = 1 + (size_t)(rng_next(s) % ((uint64_t)1 << shift));
    size_t len = words * 8;
    return len > max ? max : len;
}

/* Every test names its files among these, so that clean-up does not depend
 * on the test having got to its end. */
static const char *const g_names[] = {"in0", "in1", "seg", "garbage", "short", NULL};

static void remove_in_dir(const char *name)
{
    char path[128];
    snprintf(path, sizeof(path), "%s/%s", g_dir, name);
    unlink(path);
}

static void remove_known_files(void)
{
    for (int i = 0; g_names[i] != NULL; i++) {
        remove_in_dir(g_names[i]);
    }
}

/* Unchecked fixture: runs in the runner's own process, so the directory is
 * removed even when a test process failed an assertion or was killed. */
static int dir_make(void)
{
    snprintf(g_dir, sizeof(g_dir), "/dev/shm/dshim-check-shm-XXXXXX");
    if (mkdtemp(g_dir) == NULL) {
        snprintf(g_dir, sizeof(g_dir), "/tmp/dshim-check-shm-XXXXXX");
        if (mkdtemp(g_dir) == NULL) {
            fprintf(stderr, "check_shm: mkdtemp: %s\n", strerror(errno));
            return 1;
        }
    }
    return 0;
}

static void dir_setup(void)
{
    if (dir_make() != 0) {
        abort();
    }
}

static void dir_teardown(void)
{
    remove_known_files();
    if (rmdir(g_dir) != 0) {
        fprintf(stderr, "check_shm: cannot remove %s: %s\n", g_dir, strerror(errno));
    }
}

static int file_exists(const char *name)
{
    char path[128];
    struct stat sb;
    snprintf(path, sizeof(path), "%s/%s", g_dir, name);
    return stat(path, &sb) == 0;
}

/* ---- two-process harness ------------------------------------------------ */

typedef struct pair_ctx {
    size_t ring_size;
    int rank;                 /* 0 = parent, 1 = child */
    dshim_shm_seg_t *my_inbox;
    dshim_shm_seg_t *peer_inbox;
    dshim_conn_t *conn;
    char err[256];
} pair_ctx_t;

typedef int (*pair_fn)(pair_ctx_t *ctx);

#define FAIL_IF(cond, ...)                                                     \
    do {                                                                       \
        if (cond) {                                                            \
            snprintf(ctx->err, sizeof(ctx->err), __VA_ARGS__);                 \
            return 1;                                                          \
        }                                                                      \
    } while (0)

static int wait_child(pid_t pid, double timeout_s)
{
    int status = 0;
    double deadline = now_s() + timeout_s;
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) {
            return status;
        }
        if (r < 0 && errno != EINTR) {
            return -1;
        }
        if (now_s() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            return -2;
        }
        sleep_s(0.001);
    }
}

static void child_main(pair_fn fn, size_t ring_size, int fd)
{
    pair_ctx_t c = {.ring_size = ring_size, .rank = 1};
    pair_ctx_t *ctx = &c;
    int rc = 1;
    if (dshim_shm_seg_attach(g_dir, "in1", 2, ring_size, 0, &c.my_inbox) != DSHIM_OK ||
        dshim_shm_seg_attach(g_dir, "in0", 2, ring_size, 0, &c.peer_inbox) != DSHIM_OK ||
        dshim_shm_conn_create(c.my_inbox, c.peer_inbox, 1, 0, getppid(), fd, &c.conn) != DSHIM_OK) {
        snprintf(c.err, sizeof(c.err), "child set-up: %s", dshim_last_error());
    } else {
        rc = fn(ctx);
    }
    if (rc != 0) {
        fprintf(stderr, "check_shm child: %s\n", c.err);
    }
    if (c.conn != NULL) {
        c.conn->ops->destroy(c.conn);
    }
    dshim_shm_seg_detach(c.my_inbox);
    dshim_shm_seg_detach(c.peer_inbox);
    _exit(rc);
}

/* Runs child_fn in a child process and parent_fn here.  Returns 0 when both
 * returned 0 (and the child exited in time), else 1 with a message in err. */
static int run_pair_status(size_t ring_size, pair_fn parent_fn, pair_fn child_fn, char *err, size_t err_len)
{
    pair_ctx_t c = {.ring_size = ring_size, .rank = 0};
    int sv[2];

    if (dshim_shm_seg_create(g_dir, "in0", 2, ring_size, 0, &c.my_inbox) != DSHIM_OK ||
        dshim_shm_seg_create(g_dir, "in1", 2, ring_size, 0, &c.peer_inbox) != DSHIM_OK ||
        socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        snprintf(err, err_len, "set-up: %s", dshim_last_error());
        dshim_shm_seg_detach(c.my_inbox);
        dshim_shm_seg_detach(c.peer_inbox);
        return 1;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(sv[0]);
        child_main(child_fn, ring_size, sv[1]);
    }
    close(sv[1]);
    int rc = 1;
    if (pid < 0) {
        snprintf(c.err, sizeof(c.err), "fork: %s", strerror(errno));
        close(sv[0]);
    } else if (dshim_shm_conn_create(c.my_inbox, c.peer_inbox, 0, 1, pid, sv[0], &c.conn) != DSHIM_OK) {
        snprintf(c.err, sizeof(c.err), "parent set-up: %s", dshim_last_error());
        close(sv[0]);
    } else {
        rc = parent_fn(&c);
    }
    int status = 0;
    if (pid > 0) {
        if (rc != 0) {
            kill(pid, SIGKILL);
        }
        status = wait_child(pid, CHILD_GRACE_S);
    }
    if (c.conn != NULL) {
        c.conn->ops->destroy(c.conn);
    }
    dshim_shm_seg_detach(c.my_inbox);
    dshim_shm_seg_detach(c.peer_inbox);
    if (rc != 0) {
        snprintf(err, err_len, "parent: %s", c.err);
        return 1;
    }
    if (status < 0) {
        snprintf(err, err_len, "child did not finish in %.0f s (killed)", CHILD_GRACE_S);
        return 1;
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        snprintf(err, err_len, "child failed (wait status %#x; its message is on stderr)", (unsigned)status);
        return 1;
    }
    return 0;
}

static void run_pair(size_t ring_size, pair_fn parent_fn, pair_fn child_fn)
{
    char err[512] = "";
    int rc = run_pair_status(ring_size, parent_fn, child_fn, err, sizeof(err));
    ck_assert_msg(rc == 0, "%s", err);
}

/* One round of "nothing moved": sleep on our doorbell, bounded.  The loops
 * below arm before each round (as the engine does before its last one) and
 * disarm after it. */
static int idle_wait(pair_ctx_t *ctx, uint32_t seen, double deadline, int *timeouts)
{
    double t0 = now_s();
    FAIL_IF(dshim_shm_doorbell_wait(ctx->my_inbox, seen, WAIT_US) != DSHIM_OK, "wait: %s", dshim_last_error());
    if (now_s() - t0 >= WAIT_US * 1e-6) {
        (*timeouts)++;
    }
    FAIL_IF(*timeouts > MAX_TIMEOUTS, "rank %d: %d doorbell waits timed out: lost wake-ups?", ctx->rank,
            *timeouts);
    FAIL_IF(now_s() > deadline, "rank %d: no progress before the deadline", ctx->rank);
    return 0;
}

/* ---- streaming ------------------------------------------------------------ */

static int stream_send(pair_ctx_t *ctx, size_t total, uint64_t seed)
{
    dshim_conn_t *conn = ctx->conn;
    unsigned char *buf = malloc(MAX_PIECE);
    uint64_t rng = seed * 7 + 3;
    size_t sent = 0, piece = 0, piece_off = 0;
    double deadline = now_s() + LOOP_DEADLINE_S;
    int timeouts = 0;
    FAIL_IF(buf == NULL, "out of memory");
    while (sent < total) {
        if (piece_off == piece) {
            piece = random_piece(&rng, total - sent < MAX_PIECE ? total - sent : MAX_PIECE);
            piece_off = 0;
            pattern_fill(buf, sent, piece, seed);
        }
        uint32_t seen = dshim_shm_doorbell_arm(ctx->my_inbox);
        size_t n = 0;
        if (conn->ops->send(conn, buf + piece_off, piece - piece_off, &n) != DSHIM_OK) {
            free(buf);
            FAIL_IF(1, "send: %s", dshim_last_error());
        }
        sent += n;
        piece_off += n;
        if (n == 0 && idle_wait(ctx, seen, deadline, &timeouts) != 0) {
            free(buf);
            return 1;
        }
        dshim_shm_doorbell_disarm(ctx->my_inbox);
    }
    free(buf);
    FAIL_IF(conn->bytes_sent != total, "bytes_sent %llu != %zu", (unsigned long long)conn->bytes_sent, total);
    return 0;
}

static int stream_recv(pair_ctx_t *ctx, size_t total, uint64_t seed)
{
    dshim_conn_t *conn = ctx->conn;
    unsigned char *buf = malloc(MAX_PIECE);
    uint64_t rng = seed * 11 + 5;
    size_t got = 0;
    double deadline = now_s() + LOOP_DEADLINE_S;
    int timeouts = 0;
    FAIL_IF(buf == NULL, "out of memory");
    while (got < total) {
        size_t want = random_piece(&rng, total - got < MAX_PIECE ? total - got : MAX_PIECE);
        uint32_t seen = dshim_shm_doorbell_arm(ctx->my_inbox);
        size_t n = 0;
        dshim_status_t st = conn->ops->recv(conn, buf, want, &n);
        size_t bad = n % 8 == 0 ? pattern_check(buf, got, n, seed) : 0;
        if (st != DSHIM_OK || n > want || bad != SIZE_MAX) {
            free(buf);
            FAIL_IF(1, "recv at %zu: status %d, %zu bytes of %zu, bad word %zu", got, (int)st, n, want, bad);
        }
        got += n;
        if (n == 0 && idle_wait(ctx, seen, deadline, &timeouts) != 0) {
            free(buf);
            return 1;
        }
        dshim_shm_doorbell_disarm(ctx->my_inbox);
    }
    free(buf);
    FAIL_IF(conn->bytes_received != total, "bytes_received %llu != %zu",
            (unsigned long long)conn->bytes_received, total);
    return 0;
}

/* Zero-copy reading: verify in place, consume a random part, and now and
 * then mix in a recv (which must return the same unconsumed bytes). */
static int stream_peek(pair_ctx_t *ctx, size_t total, uint64_t seed)
{
    dshim_conn_t *conn = ctx->conn;
    uint64_t rng = seed * 13 + 1;
    uint64_t tmp[4];
    size_t got = 0;
    double deadline = now_s() + LOOP_DEADLINE_S;
    int timeouts = 0;
    while (got < total) {
        uint32_t seen = dshim_shm_doorbell_arm(ctx->my_inbox);
        const void *p = NULL, *p2 = NULL;
        size_t avail = 0, avail2 = 0, n = 0;
        FAIL_IF(conn->ops->peek(conn, &p, &avail) != DSHIM_OK, "peek: %s", dshim_last_error());
        if (avail == 0) {
            if (idle_wait(ctx, seen, deadline, &timeouts) != 0) {
                return 1;
            }
            dshim_shm_doorbell_disarm(ctx->my_inbox);
            continue;
        }
        dshim_shm_doorbell_disarm(ctx->my_inbox);
        FAIL_IF(avail % 8 != 0 || avail > ctx->ring_size, "peek gave %zu bytes", avail);
        FAIL_IF(pattern_check(p, got, avail, seed) != SIZE_MAX, "peeked bytes at %zu are wrong", got);
        FAIL_IF(conn->ops->peek(conn, &p2, &avail2) != DSHIM_OK || p2 != p || avail2 < avail,
                "second peek moved or shrank");
        switch (rng_next(&rng) % 4) {
        case 0: /* recv a little after the peek: same bytes */
            FAIL_IF(conn->ops->recv(conn, tmp, sizeof(tmp), &n) != DSHIM_OK || n == 0 || n % 8 != 0,
                    "recv after peek gave %zu", n);
            FAIL_IF(pattern_check(tmp, got, n, seed) != SIZE_MAX, "recv after peek: wrong bytes at %zu", got);
            break;
        case 1: /* all of it */
            n = avail;
            FAIL_IF(conn->ops->consume(conn, n) != DSHIM_OK, "consume: %s", dshim_last_error());
            break;
        default: /* a random part */
            n = 8 * (1 + (size_t)(rng_next(&rng) % (avail / 8)));
            FAIL_IF(conn->ops->consume(conn, n) != DSHIM_OK, "consume: %s", dshim_last_error());
            break;
        }
        got += n;
    }
    FAIL_IF(got != total, "got %zu of %zu", got, total);
    FAIL_IF(conn->bytes_received != total, "bytes_received %llu", (unsigned long long)conn->bytes_received);
    return 0;
}

static int child_send_stream(pair_ctx_t *ctx)
{
    return stream_send(ctx, STREAM_BYTES, 42);
}

static int parent_recv_stream(pair_ctx_t *ctx)
{
    return stream_recv(ctx, STREAM_BYTES, 42);
}

static int parent_peek_stream(pair_ctx_t *ctx)
{
    return stream_peek(ctx, STREAM_BYTES, 42);
}

START_TEST(test_stream_send_recv)
{
    run_pair(64 * 1024, parent_recv_stream, child_send_stream);
}
END_TEST

START_TEST(test_stream_peek_consume)
{
    run_pair(64 * 1024, parent_peek_stream, child_send_stream);
}
END_TEST

/* Both directions at once through two rings; each side waits on its one
 * doorbell for "data arrived" and "space freed" alike. */
static int bidir(pair_ctx_t *ctx)
{
    dshim_conn_t *conn = ctx->conn;
    uint64_t tx_seed = 100 + (uint64_t)ctx->rank, rx_seed = 101 - (uint64_t)ctx->rank;
    uint64_t rng = 77 + (uint64_t)ctx->rank;
    unsigned char *tx = malloc(MAX_PIECE), *rx = malloc(MAX_PIECE);
    size_t sent = 0, got = 0, piece = 0, piece_off = 0;
    double deadline = now_s() + LOOP_DEADLINE_S;
    int timeouts = 0, rc = 0;
    if (tx == NULL || rx == NULL) {
        snprintf(ctx->err, sizeof(ctx->err), "out of memory");
        rc = 1;
    }
    while (rc == 0 && (sent < BIDIR_BYTES || got < BIDIR_BYTES)) {
        uint32_t seen = dshim_shm_doorbell_arm(ctx->my_inbox);
        size_t n = 0, m = 0;
        if (sent < BIDIR_BYTES) {
            if (piece_off == piece) {
                piece = random_piece(&rng, BIDIR_BYTES - sent < MAX_PIECE ? BIDIR_BYTES - sent : MAX_PIECE);
                piece_off = 0;
                pattern_fill(tx, sent, piece, tx_seed);
            }
            if (conn->ops->send(conn, tx + piece_off, piece - piece_off, &n) != DSHIM_OK) {
                snprintf(ctx->err, sizeof(ctx->err), "send: %s", dshim_last_error());
                rc = 1;
                break;
            }
            sent += n;
            piece_off += n;
        }
        if (got < BIDIR_BYTES) {
            size_t want = random_piece(&rng, BIDIR_BYTES - got < MAX_PIECE ? BIDIR_BYTES - got : MAX_PIECE);
            if (conn->ops->recv(conn, rx, want, &m) != DSHIM_OK || pattern_check(rx, got, m, rx_seed) != SIZE_MAX) {
                snprintf(ctx->err, sizeof(ctx->err), "recv at %zu: bad status or bytes", got);
                rc = 1;
                break;
            }
            got += m;
        }
        if (n == 0 && m == 0) {
            rc = idle_wait(ctx, seen, deadline, &timeouts);
        }
        dshim_shm_doorbell_disarm(ctx->my_inbox);
    }
    free(tx);
    free(rx);
    return rc;
}

START_TEST(test_bidirectional)
{
    run_pair(64 * 1024, bidir, bidir);
}
END_TEST

/* ---- doorbell ------------------------------------------------------------ */

#define WAKE_TIMEOUT_US 5000000L

static int child_send_timestamp(pair_ctx_t *ctx)
{
    sleep_s(0.2);  /* let the parent fall asleep first */
    double ts = now_s();
    size_t n = 0;
    FAIL_IF(ctx->conn->ops->send(ctx->conn, &ts, sizeof(ts), &n) != DSHIM_OK || n != sizeof(ts), "send ts");
    return 0;
}

static int parent_wait_timestamp(pair_ctx_t *ctx)
{
    uint32_t seen = dshim_shm_doorbell_arm(ctx->my_inbox);
    double t0 = now_s();
    FAIL_IF(dshim_shm_doorbell_wait(ctx->my_inbox, seen, WAKE_TIMEOUT_US) != DSHIM_OK, "wait failed");
    double t1 = now_s();
    dshim_shm_doorbell_disarm(ctx->my_inbox);
    double ts = 0;
    size_t n = 0;
    FAIL_IF(ctx->conn->ops->recv(ctx->conn, &ts, sizeof(ts), &n) != DSHIM_OK || n != sizeof(ts),
            "woken after %.3f s without the message", t1 - t0);
    /* The child's send is well under a second after our wait began even
     * under valgrind; a lost wake-up would cost the full 5 s timeout. */
    FAIL_IF(t1 - t0 > 2.0, "wait took %.3f s of a %.1f s timeout", t1 - t0, WAKE_TIMEOUT_US * 1e-6);
    FAIL_IF(t1 - ts > 0.5, "woken %.3f s after the send", t1 - ts);
    fprintf(stderr, "check_shm: doorbell wake-up %.1f us after the send (waited %.3f s)\n", (t1 - ts) * 1e6,
            t1 - t0);
    return 0;
}

START_TEST(test_doorbell_wake)
{
    run_pair(4096, parent_wait_timestamp, child_send_timestamp);
}
END_TEST

START_TEST(test_doorbell_timeout)
{
    dshim_shm_seg_t *seg = NULL;
    ck_assert_int_eq(dshim_shm_seg_create(g_dir, "seg", 1, 4096, 0, &seg), DSHIM_OK);
    uint32_t seen = dshim_shm_doorbell_arm(seg);

    double t0 = now_s();
    ck_assert_int_eq(dshim_shm_doorbell_wait(seg, seen, 50000), DSHIM_OK);
    double dt = now_s() - t0;
    ck_assert_msg(dt >= 0.045 && dt < 2.0, "50 ms wait took %.3f s", dt);

    /* a bell that already changed: no sleep at all */
    t0 = now_s();
    ck_assert_int_eq(dshim_shm_doorbell_wait(seg, seen + 1, WAKE_TIMEOUT_US), DSHIM_OK);
    ck_assert_double_lt(now_s() - t0, 1.0);
    /* zero timeout: no sleep */
    t0 = now_s();
    ck_assert_int_eq(dshim_shm_doorbell_wait(seg, seen, 0), DSHIM_OK);
    ck_assert_double_lt(now_s() - t0, 1.0);
    dshim_shm_doorbell_disarm(seg);
    dshim_shm_seg_detach(seg);
    ck_assert(!file_exists("seg"));
}
END_TEST

/* ---- peer death ------------------------------------------------------------ */

static int child_send_then_exit(pair_ctx_t *ctx)
{
    uint64_t msg[2] = {pattern_word(0, 9), pattern_word(1, 9)};
    size_t n = 0;
    FAIL_IF(ctx->conn->ops->send(ctx->conn, msg, sizeof(msg), &n) != DSHIM_OK || n != sizeof(msg), "send");
    return 0;  /* exiting closes the control socket */
}

static int parent_see_death(pair_ctx_t *ctx)
{
    uint64_t buf[2];
    size_t got = 0;
    double deadline = now_s() + 20.0;
    dshim_status_t st = DSHIM_OK;
    while (st == DSHIM_OK) {
        uint32_t seen = dshim_shm_doorbell_arm(ctx->my_inbox);
        size_t n = 0;
        st = ctx->conn->ops->recv(ctx->conn, (unsigned char *)buf + got, sizeof(buf) - got, &n);
        got += n;
        if (got == sizeof(buf)) {
            got = 0;  /* keep reading: the next recv finds the peer gone */
        }
        if (st == DSHIM_OK && n == 0) {
            FAIL_IF(dshim_shm_doorbell_wait(ctx->my_inbox, seen, 5000) != DSHIM_OK, "wait");
            FAIL_IF(now_s() > deadline, "peer death not noticed by recv");
        }
        dshim_shm_doorbell_disarm(ctx->my_inbox);
    }
    FAIL_IF(st != DSHIM_ERR_PEER, "recv returned %d instead of DSHIM_ERR_PEER", (int)st);
    FAIL_IF(ctx->conn->bytes_received != sizeof(buf), "the 16 bytes sent before death were not delivered");
    FAIL_IF(buf[0] != pattern_word(0, 9) || buf[1] != pattern_word(1, 9), "wrong bytes");
    FAIL_IF(strstr(dshim_last_error(), "peer rank 1") == NULL, "message does not name the peer: %s",
            dshim_last_error());

    /* send to the dead peer: fills the ring, then reports it */
    static unsigned char junk[4096];
    st = DSHIM_OK;
    deadline = now_s() + 20.0;
    while (st == DSHIM_OK) {
        size_t n = 0;
        st = ctx->conn->ops->send(ctx->conn, junk, sizeof(junk), &n);
        FAIL_IF(now_s() > deadline, "peer death not noticed by send");
    }
    FAIL_IF(st != DSHIM_ERR_PEER, "send returned %d instead of DSHIM_ERR_PEER", (int)st);
    return 0;
}

START_TEST(test_peer_death)
{
    run_pair(4096, parent_see_death, child_send_then_exit);
}
END_TEST

/* ---- segments ------------------------------------------------------------ */

static void write_file(const char *name, const void *data, size_t len)
{
    char path[128];
    snprintf(path, sizeof(path), "%s/%s", g_dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, data, len), (ssize_t)len);
    close(fd);
}

START_TEST(test_segment_lifecycle)
{
    dshim_shm_seg_t *own = NULL, *peer = NULL, *bad = NULL;

    ck_assert_int_eq(dshim_shm_seg_create(g_dir, "seg", 4, 8192, 0, &own), DSHIM_OK);
    ck_assert(file_exists("seg"));
    char path[128];
    struct stat sb;
    snprintf(path, sizeof(path), "%s/seg", g_dir);
    ck_assert_int_eq(stat(path, &sb), 0);
    ck_assert_int_eq(sb.st_mode & 0777, 0600);

    /* the attached mapping sees the owner's doorbell */
    ck_assert_int_eq(dshim_shm_seg_attach(g_dir, "seg", 4, 8192, 0, &peer), DSHIM_OK);
    ck_assert_uint_eq(dshim_shm_doorbell_arm(peer), dshim_shm_doorbell_arm(own));
    dshim_shm_doorbell_disarm(peer);
    dshim_shm_doorbell_disarm(own);

    /* mismatches */
    ck_assert_int_eq(dshim_shm_seg_attach(g_dir, "seg", 3, 8192, 0, &bad), DSHIM_ERR_PROTOCOL);
    ck_assert_ptr_null(bad);
    ck_assert_int_eq(dshim_shm_seg_attach(g_dir, "seg", 4, 4096, 0, &bad), DSHIM_ERR_PROTOCOL);
    ck_assert_int_eq(dshim_shm_seg_attach(g_dir, "seg", 4, 16384, 0, &bad), DSHIM_ERR_PROTOCOL);

    /* create twice */
    ck_assert_int_eq(dshim_shm_seg_create(g_dir, "seg", 4, 8192, 0, &bad), DSHIM_ERR_SYSTEM);
    ck_assert_ptr_null(bad);
    ck_assert(file_exists("seg"));

    /* unlink removes the file, mappings stay usable */
    dshim_shm_seg_unlink(own);
    ck_assert(!file_exists("seg"));
    ck_assert_int_eq(dshim_shm_doorbell_wait(peer, dshim_shm_doorbell_arm(peer) + 1, 1000), DSHIM_OK);
    dshim_shm_doorbell_disarm(peer);
    ck_assert_int_ne(dshim_shm_seg_attach(g_dir, "seg", 4, 8192, 0, &bad), DSHIM_OK);
    dshim_shm_seg_detach(peer);
    dshim_shm_seg_detach(own);

    /* an owner that never unlinked removes the file when it detaches;
     * a peer's detach does not */
    ck_assert_int_eq(dshim_shm_seg_create(g_dir, "seg", 1, 4096, 0, &own), DSHIM_OK);
    ck_assert_int_eq(dshim_shm_seg_attach(g_dir, "seg", 1, 4096, 0, &peer), DSHIM_OK);
    dshim_shm_seg_detach(peer);
    ck_assert(file_exists("seg"));
    dshim_shm_seg_detach(own);
    ck_assert(!file_exists("seg"));
}
END_TEST

/* The host area: zero-filled, the same memory through every mapping,
 * apart from the rings (filling it disturbs no ring), and only in the
 * segment made with one. */
START_TEST(test_segment_host_area)
{
    dshim_shm_seg_t *own = NULL, *peer = NULL;
    const int nrings = 3;
    ck_assert_int_eq(dshim_shm_seg_create(g_dir, "seg", nrings, 4096, 1, &own), DSHIM_OK);
    ck_assert_int_eq(dshim_shm_seg_attach(g_dir, "seg", nrings, 4096, 1, &peer), DSHIM_OK);
    unsigned char *a = dshim_shm_seg_host_area(own), *b = dshim_shm_seg_host_area(peer);
    size_t len = dshim_host_area_bytes(nrings);
    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_ne(a, b);
    ck_assert_int_eq((uintptr_t)a % DSHIM_HOST_AREA_LINE, 0);
    unsigned char *want = calloc(1, len); /* memcmp: the area is megabytes */
    ck_assert_ptr_nonnull(want);
    ck_assert_int_eq(memcmp(b, want, len), 0);
    /* a message in ring 0 (0 -> 1) and ring 2, then the whole area written */
    dshim_shm_ring_t r0, r2;
    ck_assert_int_eq(dshim_shm_seg_ring(own, 0, &r0), DSHIM_OK);
    ck_assert_int_eq(dshim_shm_seg_ring(own, nrings - 1, &r2), DSHIM_OK);
    dshim_shm_producer_t p0, p2;
    dshim_shm_producer_init(&p0, &r0);
    dshim_shm_producer_init(&p2, &r2);
    ck_assert_uint_eq(dshim_shm_producer_write(&p0, "ring zero", 10), 10);
    ck_assert_uint_eq(dshim_shm_producer_write(&p2, "ring two", 9), 9);
    memset(a, 0xA5, len);
    memset(want, 0xA5, len);
    ck_assert_int_eq(memcmp(b, want, len), 0);
    free(want);
    ck_assert((unsigned char *)r0.head >= a + len);
    dshim_shm_ring_t q0, q2;
    ck_assert_int_eq(dshim_shm_seg_ring(peer, 0, &q0), DSHIM_OK);
    ck_assert_int_eq(dshim_shm_seg_ring(peer, nrings - 1, &q2), DSHIM_OK);
    dshim_shm_consumer_t c0, c2;
    dshim_shm_consumer_init(&c0, &q0);
    dshim_shm_consumer_init(&c2, &q2);
    char got[16];
    ck_assert_uint_eq(dshim_shm_consumer_read(&c0, got, sizeof(got)), 10);
    ck_assert_str_eq(got, "ring zero");
    ck_assert_uint_eq(dshim_shm_consumer_read(&c2, got, sizeof(got)), 9);
    ck_assert_str_eq(got, "ring two");
    /* attaching it as a segment without an area: a size mismatch */
    dshim_shm_seg_t *bad = NULL;
    ck_assert_int_eq(dshim_shm_seg_attach(g_dir, "seg", nrings, 4096, 0, &bad), DSHIM_ERR_PROTOCOL);
    dshim_shm_seg_detach(peer);
    dshim_shm_seg_detach(own);
    /* only the segment that holds the area has one (rank 0's inbox) */
    ck_assert_int_eq(dshim_shm_seg_create(g_dir, "seg", nrings, 4096, 0, &own), DSHIM_OK);
    ck_assert_ptr_null(dshim_shm_seg_host_area(own));
    ck_assert_int_eq(dshim_shm_seg_attach(g_dir, "seg", nrings, 4096, 1, &bad), DSHIM_ERR_PROTOCOL);
    dshim_shm_seg_detach(own);
}
END_TEST

START_TEST(test_segment_garbage)
{
    dshim_shm_seg_t *bad = NULL, *own = NULL;
    /* the size a 2 x 4096 segment has (header and doorbell lines, the host
     * area, two rings), but random contents */
    size_t len = 256 + dshim_host_area_bytes(2) + 2 * (256 + 4096);
    unsigned char *junk = malloc(len);
    uint64_t rng = 12345;
    ck_assert_ptr_nonnull(junk);
    for (size_t i = 0; i < len; i++) {
        junk[i] = (unsigned char)rng_next(&rng);
    }
    write_file("garbage", junk, len);
    /* check the size is right, so that the header check is what fails */
    ck_assert_int_eq(dshim_shm_seg_create(g_dir, "seg", 2, 4096, 1, &own), DSHIM_OK);
    char path[128];
    struct stat sb;
    snprintf(path, sizeof(path), "%s/seg", g_dir);
    ck_assert_int_eq(stat(path, &sb), 0);
    ck_assert_int_eq((size_t)sb.st_size, len);
    dshim_shm_seg_detach(own);

    ck_assert_int_eq(dshim_shm_seg_attach(g_dir, "garbage", 2, 4096, 1, &bad), DSHIM_ERR_PROTOCOL);
    ck_assert_ptr_null(bad);
    /* a zeroed file of the right size (a creator that had not finished) */
    memset(junk, 0, len);
    write_file("garbage", junk, len);
    ck_assert_int_eq(dshim_shm_seg_attach(g_dir, "garbage", 2, 4096, 1, &bad), DSHIM_ERR_PROTOCOL);
    /* truncated */
    write_file("short", junk, 100);
    ck_assert_int_eq(dshim_shm_seg_attach(g_dir, "short", 2, 4096, 1, &bad), DSHIM_ERR_PROTOCOL);
    ck_assert_ptr_null(bad);
    free(junk);
    /* absent */
    ck_assert_int_eq(dshim_shm_seg_attach(g_dir, "seg", 2, 4096, 0, &bad), DSHIM_ERR_SYSTEM);
    remove_in_dir("garbage");
    remove_in_dir("short");
}
END_TEST

START_TEST(test_segment_invalid)
{
    static const size_t bad_sizes[] = {0, 8, 2048, 4095, 4097, 5000, 12288, (size_t)1 << 31};
    dshim_shm_seg_t *seg = NULL;
    for (size_t i = 0; i < sizeof(bad_sizes) / sizeof(bad_sizes[0]); i++) {
        ck_assert_int_eq(dshim_shm_seg_create(g_dir, "seg", 1, bad_sizes[i], 0, &seg), DSHIM_ERR_INVALID);
        ck_assert_int_eq(dshim_shm_seg_attach(g_dir, "seg", 1, bad_sizes[i], 0, &seg), DSHIM_ERR_INVALID);
        ck_assert_ptr_null(seg);
    }
    ck_assert_int_eq(dshim_shm_seg_create(g_dir, "seg", 0, 4096, 0, &seg), DSHIM_ERR_INVALID);
    ck_assert_int_eq(dshim_shm_seg_create(g_dir, "a/b", 1, 4096, 0, &seg), DSHIM_ERR_INVALID);
    ck_assert_int_eq(dshim_shm_seg_create(g_dir, "", 1, 4096, 0, &seg), DSHIM_ERR_INVALID);
    ck_assert(!file_exists("seg"));
    /* a conn to a rank the segment has no ring for */
    ck_assert_int_eq(dshim_shm_seg_create(g_dir, "seg", 2, 4096, 0, &seg), DSHIM_OK);
    dshim_conn_t *conn = NULL;
    ck_assert_int_eq(dshim_shm_conn_create(seg, seg, 0, 2, getpid(), -1, &conn), DSHIM_ERR_INVALID);
    ck_assert_ptr_null(conn);
    dshim_shm_seg_detach(seg);
}
END_TEST

/* ---- one-process connection semantics (a rank talking to itself) ----- */

START_TEST(test_loopback_semantics)
{
    dshim_shm_seg_t *seg = NULL;
    dshim_conn_t *conn = NULL;
    int sv[2];
    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    ck_assert_int_eq(dshim_shm_seg_create(g_dir, "seg", 1, 4096, 0, &seg), DSHIM_OK);
    ck_assert_int_eq(dshim_shm_conn_create(seg, seg, 0, 0, getpid(), sv[0], &conn), DSHIM_OK);
    ck_assert_str_eq(conn->ops->name, "shm");
    ck_assert_ptr_nonnull(conn->ops->wait_arm); /* waits on the doorbell, not on the socket */
    ck_assert_int_eq(conn->fd, sv[0]);
    ck_assert_int_eq(conn->peer, 0);

    static uint64_t src[1024], dst[1024];
    pattern_fill(src, 0, sizeof(src), 5);
    size_t n = 0;
    const void *p = NULL;
    size_t avail = 0;

    /* empty */
    ck_assert_int_eq(conn->ops->peek(conn, &p, &avail), DSHIM_OK);
    ck_assert_uint_eq(avail, 0);
    ck_assert_int_eq(conn->ops->recv(conn, dst, 64, &n), DSHIM_OK);
    ck_assert_uint_eq(n, 0);

    /* fill to the brim: 4096 fits, the rest is refused */
    ck_assert_int_eq(conn->ops->send(conn, src, 3000, &n), DSHIM_OK);
    ck_assert_uint_eq(n, 3000);
    ck_assert_int_eq(conn->ops->send(conn, (unsigned char *)src + 3000, 2000, &n), DSHIM_OK);
    ck_assert_uint_eq(n, 1096);
    ck_assert_int_eq(conn->ops->send(conn, src, 8, &n), DSHIM_OK);
    ck_assert_uint_eq(n, 0);
    ck_assert_uint_eq(conn->bytes_sent, 4096);

    /* consume more than peeked: refused */
    ck_assert_int_eq(conn->ops->peek(conn, &p, &avail), DSHIM_OK);
    ck_assert_uint_eq(avail, 4096);
    ck_assert_int_eq(conn->ops->consume(conn, 4104), DSHIM_ERR_INVALID);
    ck_assert_int_eq(memcmp(p, src, 4096), 0);
    ck_assert_int_eq(conn->ops->consume(conn, 1000), DSHIM_OK);
    ck_assert_int_eq(conn->ops->recv(conn, dst, 96, &n), DSHIM_OK);
    ck_assert_uint_eq(n, 96);
    ck_assert_int_eq(memcmp(dst, (unsigned char *)src + 1000, 96), 0);
    ck_assert_uint_eq(conn->bytes_received, 1096);

    /* wrap: 1096 bytes free at the start; peek stops at the wrap */
    ck_assert_int_eq(conn->ops->send(conn, (unsigned char *)src + 200, 1096, &n), DSHIM_OK);
    ck_assert_uint_eq(n, 1096);
    ck_assert_int_eq(conn->ops->peek(conn, &p, &avail), DSHIM_OK);
    ck_assert_uint_eq(avail, 3000);
    ck_assert_int_eq(conn->ops->consume(conn, 3000), DSHIM_OK);
    ck_assert_int_eq(conn->ops->peek(conn, &p, &avail), DSHIM_OK);
    ck_assert_uint_eq(avail, 1096);
    ck_assert_int_eq(memcmp(p, (unsigned char *)src + 200, 1096), 0);
    /* a recv across nothing special, then empty again */
    ck_assert_int_eq(conn->ops->recv(conn, dst, sizeof(dst), &n), DSHIM_OK);
    ck_assert_uint_eq(n, 1096);
    ck_assert_int_eq(conn->ops->recv(conn, dst, sizeof(dst), &n), DSHIM_OK);
    ck_assert_uint_eq(n, 0);

    /* a send that wraps, read back with one recv */
    ck_assert_int_eq(conn->ops->send(conn, src, 4000, &n), DSHIM_OK);
    ck_assert_uint_eq(n, 4000);
    ck_assert_int_eq(conn->ops->recv(conn, dst, 4000, &n), DSHIM_OK);
    ck_assert_uint_eq(n, 4000);
    ck_assert_int_eq(memcmp(dst, src, 4000), 0);
    ck_assert_uint_eq(conn->bytes_sent, 4096 + 1096 + 4000);
    ck_assert_uint_eq(conn->bytes_received, 4096 + 1096 + 4000);

    /* a move rings an armed waiter's bell, and writes nothing to the bell
     * of one that is not about to sleep */
    uint32_t bell = dshim_shm_doorbell_arm(seg);
    ck_assert_int_eq(conn->ops->send(conn, src, 8, &n), DSHIM_OK);
    dshim_shm_doorbell_disarm(seg);
    ck_assert_uint_eq(dshim_shm_doorbell_arm(seg), bell + 1);
    dshim_shm_doorbell_disarm(seg);
    ck_assert_int_eq(conn->ops->recv(conn, dst, 8, &n), DSHIM_OK);
    ck_assert_uint_eq(n, 8);
    ck_assert_int_eq(conn->ops->send(conn, src, 8, &n), DSHIM_OK);
    ck_assert_uint_eq(dshim_shm_doorbell_arm(seg), bell + 1);
    dshim_shm_doorbell_disarm(seg);

    /* destroy closes the control socket */
    conn->ops->destroy(conn);
    ck_assert_int_eq(fcntl(sv[0], F_GETFD), -1);
    close(sv[1]);
    dshim_shm_seg_detach(seg);
}
END_TEST

/* ---- benchmark (`check_shm --bench`) -------------------------------------- */

#define BENCH_MSG MIB
#define BENCH_BYTES ((size_t)4096 * MIB)
#define PINGPONG_ITERS 200000
#define PINGPONG_WARMUP 10000

static double g_bench_gbps, g_bench_peek_gbps, g_bench_lat_us;

static int bench_send(pair_ctx_t *ctx)
{
    unsigned char *buf = malloc(BENCH_MSG);
    FAIL_IF(buf == NULL, "oom");
    memset(buf, 0x5a, BENCH_MSG);
    for (int round = 0; round < 2; round++) {
        for (size_t sent = 0; sent < BENCH_BYTES;) {
            size_t off = 0;
            while (off < BENCH_MSG) {
                size_t n = 0;
                FAIL_IF(ctx->conn->ops->send(ctx->conn, buf + off, BENCH_MSG - off, &n) != DSHIM_OK, "send");
                off += n;
            }
            sent += BENCH_MSG;
        }
    }
    free(buf);
    return 0;
}

static int bench_recv(pair_ctx_t *ctx)
{
    unsigned char *buf = malloc(BENCH_MSG);
    FAIL_IF(buf == NULL, "oom");
    /* round 0: recv (a copy out), round 1: peek/consume (no copy) */
    for (int round = 0; round < 2; round++) {
        double t0 = 0;
        for (size_t got = 0; got < BENCH_BYTES;) {
            size_t n = 0;
            if (round == 0) {
                FAIL_IF(ctx->conn->ops->recv(ctx->conn, buf, BENCH_MSG, &n) != DSHIM_OK, "recv");
            } else {
                const void *p;
                FAIL_IF(ctx->conn->ops->peek(ctx->conn, &p, &n) != DSHIM_OK, "peek");
                if (n > 0) {
                    FAIL_IF(((const unsigned char *)p)[n - 1] != 0x5a, "bad byte");
                    FAIL_IF(ctx->conn->ops->consume(ctx->conn, n) != DSHIM_OK, "consume");
                }
            }
            if (n > 0 && got == 0) {
                t0 = now_s();
            }
            got += n;
        }
        double gbps = (double)(BENCH_BYTES - BENCH_MSG) / (now_s() - t0) / 1e9;
        if (round == 0) {
            g_bench_gbps = gbps;
        } else {
            g_bench_peek_gbps = gbps;
        }
    }
    free(buf);
    return 0;
}

static int pingpong(pair_ctx_t *ctx)
{
    uint64_t msg[8] = {0};
    double t0 = 0;
    for (int i = 0; i < PINGPONG_WARMUP + PINGPONG_ITERS; i++) {
        if (i == PINGPONG_WARMUP) {
            t0 = now_s();
        }
        size_t n = 0;
        if (ctx->rank == 0) {
            msg[0] = (uint64_t)i;
            FAIL_IF(ctx->conn->ops->send(ctx->conn, msg, sizeof(msg), &n) != DSHIM_OK || n != sizeof(msg), "send");
        }
        size_t got = 0;
        while (got < sizeof(msg)) {
            FAIL_IF(ctx->conn->ops->recv(ctx->conn, (unsigned char *)msg + got, sizeof(msg) - got, &n) != DSHIM_OK,
                    "recv");
            got += n;
        }
        FAIL_IF(msg[0] != (uint64_t)i, "out of order");
        if (ctx->rank == 1) {
            FAIL_IF(ctx->conn->ops->send(ctx->conn, msg, sizeof(msg), &n) != DSHIM_OK || n != sizeof(msg), "send");
        }
    }
    g_bench_lat_us = (now_s() - t0) / PINGPONG_ITERS / 2 * 1e6;
    return 0;
}

static int run_bench(void)
{
    char err[512] = "";
    if (dir_make() != 0) {
        return 1;
    }
    int rc = run_pair_status(4 * MIB, bench_recv, bench_send, err, sizeof(err));
    if (rc == 0) {
        rc = run_pair_status(4 * MIB, pingpong, pingpong, err, sizeof(err));
    }
    dir_teardown();
    if (rc != 0) {
        fprintf(stderr, "check_shm --bench: %s\n", err);
        return 1;
    }
    printf("shm one-way, 1 MiB messages, 4 MiB ring: recv %.2f GB/s, peek/consume %.2f GB/s\n", g_bench_gbps,
           g_bench_peek_gbps);
    printf("shm ping-pong, 64-byte messages, busy-polling: %.2f us one-way (half round trip)\n", g_bench_lat_us);
    return 0;
}

/* ---- single-copy reads and writes -------------------------------------- */

/* The peer of the single-copy tests: a child whose buffer (its copy of buf,
 * len bytes) holds the pattern byte i = i * 7 + 3 before it says "ready"
 * (fill), or must hold it when we say "done" (otherwise): its exit status
 * says so.  It frees its copies first: valgrind's leak check (run_tests.sh)
 * would make the status 9. */
typedef struct cma_child {
    pid_t pid;
    int ready[2], done[2];
} cma_child_t;

static unsigned char cma_pattern(size_t i)
{
    return (unsigned char)(i * 7 + 3);
}

static void cma_child_start(cma_child_t *ch, unsigned char *buf, size_t len, int fill, void *also_free)
{
    ck_assert_int_eq(pipe(ch->ready), 0);
    ck_assert_int_eq(pipe(ch->done), 0);
    ch->pid = fork();
    ck_assert_int_ge(ch->pid, 0);
    if (ch->pid == 0) {
        for (size_t i = 0; i < len && fill; i++) {
            buf[i] = cma_pattern(i);
        }
        char c = 1;
        int code = write(ch->ready[1], &c, 1) != 1 || read(ch->done[0], &c, 1) != 1;
        for (size_t i = 0; i < len && !fill && !code; i++) {
            code = buf[i] != cma_pattern(i) ? 2 : 0;
        }
        free(buf);
        free(also_free);
        _exit(code);
    }
    char c;
    ck_assert_int_eq(read(ch->ready[0], &c, 1), 1);
}

/* Says "done", waits for the child's end: its wait status. */
static int cma_child_end(cma_child_t *ch)
{
    char c = 1;
    int status;
    ck_assert_int_eq(write(ch->done[1], &c, 1), 1);
    ck_assert_int_eq(waitpid(ch->pid, &status, 0), ch->pid);
    close(ch->ready[0]);
    close(ch->ready[1]);
    close(ch->done[0]);
    close(ch->done[1]);
    return status;
}

/* Single-copy reads: a child's memory into ours in one call (its copy of
 * a buffer it filled after fork), and the errors that name the peer: a
 * process that is gone, an address not mapped there. */
START_TEST(test_cma_read)
{
    size_t len = (size_t)3 << 20;
    unsigned char *buf = malloc(len), *got = calloc(len, 1);
    ck_assert_ptr_nonnull(buf);
    ck_assert_ptr_nonnull(got);
    cma_child_t ch;
    cma_child_start(&ch, buf, len, 1, got);
    ck_assert_int_eq(dshim_shm_cma_read(ch.pid, "rank 1", got, buf, len), DSHIM_OK);
    for (size_t i = 0; i < len; i++) {
        if (got[i] != cma_pattern(i)) {
            ck_abort_msg("byte %zu is %u", i, got[i]);
        }
    }
    ck_assert_int_eq(dshim_shm_cma_read(ch.pid, "rank 1", got, (void *)(uintptr_t)4096, 64), DSHIM_ERR_PROTOCOL);
    ck_assert_ptr_nonnull(strstr(dshim_last_error(), "reading 64 bytes"));
    ck_assert_int_eq(cma_child_end(&ch), 0);
    ck_assert_int_eq(dshim_shm_cma_read(ch.pid, "rank 1", got, buf, 64), DSHIM_ERR_PEER);
    ck_assert_ptr_nonnull(strstr(dshim_last_error(), "rank 1 (pid"));
    ck_assert_ptr_nonnull(strstr(dshim_last_error(), "exited while this rank read"));
    free(buf);
    free(got);
}
END_TEST

/* Single-copy writes: ours into a child's buffer in one call (the child
 * checks the bytes after we said "done"), and the same errors. */
START_TEST(test_cma_write)
{
    size_t len = (size_t)3 << 20;
    unsigned char *buf = calloc(len, 1), *mine = malloc(len);
    ck_assert_ptr_nonnull(buf);
    ck_assert_ptr_nonnull(mine);
    for (size_t i = 0; i < len; i++) {
        mine[i] = cma_pattern(i);
    }
    cma_child_t ch;
    cma_child_start(&ch, buf, len, 0, mine);
    ck_assert_int_eq(dshim_shm_cma_write(ch.pid, "rank 1", mine, buf, len), DSHIM_OK);
    ck_assert_int_eq(dshim_shm_cma_write(ch.pid, "rank 1", mine, (void *)(uintptr_t)4096, 64), DSHIM_ERR_PROTOCOL);
    ck_assert_ptr_nonnull(strstr(dshim_last_error(), "writing 64 bytes"));
    int status = cma_child_end(&ch);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child found other bytes (status %d)", status);
    ck_assert_int_eq(dshim_shm_cma_write(ch.pid, "rank 1", mine, buf, 64), DSHIM_ERR_PEER);
    ck_assert_ptr_nonnull(strstr(dshim_last_error(), "exited while this rank wrote"));
    free(buf);
    free(mine);
}
END_TEST

/* ---- streaming copy ---------------------------------------------------- */

/* Every length up to a few vector blocks, at every alignment of source and
 * destination: the bytes equal memcpy's and nothing around them changes. */
START_TEST(test_copy_streaming)
{
    enum { MAXLEN = 300, GUARD = 64 };
    unsigned char src[MAXLEN + 32], dst[GUARD + MAXLEN + 32 + GUARD], fresh[sizeof(dst)];
    for (size_t i = 0; i < sizeof(src); i++) {
        src[i] = (unsigned char)(i * 37 + 11);
    }
    memset(fresh, 0xA5, sizeof(fresh));
    /* plain ifs, one ck_abort on failure: a Check assertion per case costs a
     * pipe write, and ~87k cases would take minutes under valgrind */
    for (size_t len = 0; len <= MAXLEN; len++) {
        for (size_t so = 0; so < 17; so++) {
            for (size_t d_off = 0; d_off < 17; d_off++) {
                memcpy(dst, fresh, sizeof(dst));
                unsigned char *d = dst + GUARD + d_off;
                dshim_copy_streaming(d, src + so, len);
                if (memcmp(d, src + so, len) != 0) {
                    ck_abort_msg("len %zu src+%zu dst+%zu: bytes differ", len, so, d_off);
                }
                size_t before = (size_t)(d - dst), after = sizeof(dst) - before - len;
                if (memcmp(dst, fresh, before) != 0 || memcmp(d + len, fresh, after) != 0) {
                    ck_abort_msg("len %zu src+%zu dst+%zu: a byte outside the copy changed", len, so, d_off);
                }
            }
        }
    }
}
END_TEST

/* ---- suite ------------------------------------------------------------ */

static Suite *shm_suite(void)
{
    Suite *s = suite_create("shm");
    TCase *tc = tcase_create("segment");
    tcase_add_unchecked_fixture(tc, dir_setup, dir_teardown);
    tcase_add_checked_fixture(tc, remove_known_files, NULL);
    tcase_add_test(tc, test_segment_lifecycle);
    tcase_add_test(tc, test_segment_garbage);
    tcase_add_test(tc, test_segment_host_area);
    tcase_add_test(tc, test_segment_invalid);
    tcase_add_test(tc, test_loopback_semantics);
    tcase_add_test(tc, test_doorbell_timeout);
    tcase_add_test(tc, test_copy_streaming);
    tcase_add_test(tc, test_cma_read);
    tcase_add_test(tc, test_cma_write);
    suite_add_tcase(s, tc);

    tc = tcase_create("two_processes");
    tcase_add_unchecked_fixture(tc, dir_setup, dir_teardown);
    tcase_add_checked_fixture(tc, remove_known_files, NULL);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_doorbell_wake);
    tcase_add_test(tc, test_peer_death);
    tcase_add_test(tc, test_stream_send_recv);
    tcase_add_test(tc, test_stream_peek_consume);
    tcase_add_test(tc, test_bidirectional);
    suite_add_tcase(s, tc);
    return s;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--bench") == 0) {
        return run_bench();
    }
    SRunner *sr = srunner_create(shm_suite());
    srunner_run_all(sr, CK_ENV);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}

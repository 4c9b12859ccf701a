/*
 * Receives from any source (DSHIM_ANY_SOURCE, dshim_recv_any/irecv_any,
 * dshim_request_source), end to end with real processes over shm, TCP and
 * both at once (ranks pretending to live on two hosts).
 *
 * The matching rules checked (include/dshim.h, docs/architecture.md):
 *  - every message is received exactly once, by a receive that names its
 *    sender or any source, and the reported source is the sender;
 *  - messages of one sender are matched to receives in posting order (the
 *    k-th message a sender sent goes to an earlier-posted receive than its
 *    k+1-th): no overtaking, and a receive from a specific rank posted
 *    earlier is never robbed by a later one from any source;
 *  - only point-to-point messages match: a collective's data waiting on a
 *    stream is left for the collective;
 *  - failures stay loud: a message larger than the buffer, silence (the
 *    timeout names the ranks that sent nothing), a peer that died, garbage
 *    on a connection.
 */
#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm.h"
#include "config.h"
#include "dshim.h"
#include "ranks.h"

#define MSGS_PER_SENDER 6 /* interleaved case: 2 specific receives per sender, the rest any */

typedef struct setup {
    const char *transport; /* "shm", "tcp" or "mixed" (two pretend hosts: shm inside, TCP between) */
    int np;
    size_t count; /* int32 elements per message */
} setup_t;

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

static void dump(const test_rank_result_t *res, int n)
{
    for (int r = 0; r < n; r++) {
        fprintf(stderr, "--- rank %d: %s %d after %.1f s\n%s", r, res[r].exited ? "exit" : "signal", res[r].code,
                res[r].seconds, res[r].err);
    }
}

static int init(int rank, int size, int port, const setup_t *su, dshim_comm_t **comm_p)
{
    if (!strcmp(su->transport, "mixed")) {
        char host[64];
        snprintf(host, sizeof(host), "fake-host-%d", rank % 2);
        setenv("DSHIM_HOST_ID", host, 1);
        dshim_config_reload();
    }
    return test_comm_init(rank, size, port, comm_p);
}

/* Message k of sender s: every element says who and which. */
static int32_t tag_of(int sender, int k)
{
    return (int32_t)(sender * 1000 + k);
}

static void fill_msg(int32_t *buf, size_t count, int sender, int k)
{
    for (size_t i = 0; i < count; i++) {
        buf[i] = tag_of(sender, k);
    }
}

/* The message a receive got: -1 when its elements disagree. */
static int32_t read_msg(const int32_t *buf, size_t count)
{
    for (size_t i = 1; i < count; i++) {
        if (buf[i] != buf[0]) {
            return -1;
        }
    }
    return buf[0];
}

/* Each sender sends `msgs` messages to rank 0 (non-blocking, then waits). */
static dshim_status_t send_all(dshim_comm_t *comm, int rank, int msgs, size_t count)
{
    int32_t *bufs = malloc((size_t)msgs * count * sizeof(int32_t));
    dshim_request_t **reqs = calloc((size_t)msgs, sizeof(*reqs));
    dshim_status_t st = DSHIM_OK;
    int posted = 0;
    for (int k = 0; k < msgs && st == DSHIM_OK; k++) {
        fill_msg(bufs + (size_t)k * count, count, rank, k);
        st = dshim_isend(comm, bufs + (size_t)k * count, count, DSHIM_INT32, 0, &reqs[k]);
        posted += st == DSHIM_OK;
    }
    for (int k = 0; k < posted; k++) {
        dshim_status_t w = dshim_wait(reqs[k]);
        st = st == DSHIM_OK ? w : st;
        dshim_request_free(reqs[k]);
    }
    free(reqs);
    free(bufs);
    return st;
}

/* The receiver's record: receive i (posting order) named `want` (-1 = any)
 * and got message `got` from `source`.  Checks the rules of the header. */
static int check_matching(int size, int msgs, int nrecv, const int *want, const int *source, const int32_t *got)
{
    int bad = 0;
    int *seen = calloc((size_t)size * (size_t)msgs, sizeof(int));
    int *last_k = malloc((size_t)size * sizeof(int));
    for (int s = 0; s < size; s++) {
        last_k[s] = -1;
    }
    for (int i = 0; i < nrecv; i++) {
        int s = got[i] < 0 ? -1 : got[i] / 1000, k = got[i] < 0 ? -1 : got[i] % 1000;
        if (s < 1 || s >= size || k < 0 || k >= msgs) {
            fprintf(stderr, "FAIL: receive %d got garbage %d\n", i, (int)got[i]);
            bad++;
            continue;
        }
        if (source[i] != s) {
            fprintf(stderr, "FAIL: receive %d reports source %d but holds rank %d's message %d\n", i, source[i], s, k);
            bad++;
        }
        if (want[i] >= 0 && want[i] != s) {
            fprintf(stderr, "FAIL: receive %d named rank %d but got rank %d's message %d\n", i, want[i], s, k);
            bad++;
        }
        if (seen[s * msgs + k]++) {
            fprintf(stderr, "FAIL: rank %d's message %d was delivered twice\n", s, k);
            bad++;
        }
        if (k <= last_k[s]) {
            fprintf(stderr, "FAIL: rank %d's message %d went to receive %d, after its message %d (overtaken)\n", s,
                    k, i, last_k[s]);
            bad++;
        }
        last_k[s] = k;
    }
    for (int s = 1; s < size; s++) {
        for (int k = 0; k < msgs; k++) {
            if (!seen[s * msgs + k]) {
                fprintf(stderr, "FAIL: rank %d's message %d was never received\n", s, k);
                bad++;
            }
        }
    }
    free(seen);
    free(last_k);
    return bad;
}

/* ---- fan-in: every other rank sends to rank 0, which receives from any
 * source, alternately blocking (dshim_recv_any) and non-blocking
 * (dshim_irecv_any + dshim_request_source), as torch's
 * test_send_recv_any_source does ------------------------------------------ */

static int body_fan_in(int rank, int size, int port, void *arg)
{
    const setup_t *su = arg;
    dshim_comm_t *comm;
    if (init(rank, size, port, su, &comm)) {
        return 2;
    }
    const int msgs = 4;
    int bad = 0;
    dshim_status_t st = DSHIM_OK;
    if (rank != 0) {
        st = send_all(comm, rank, msgs, su->count);
    } else {
        int nrecv = (size - 1) * msgs;
        int *want = malloc((size_t)nrecv * sizeof(int)), *source = malloc((size_t)nrecv * sizeof(int));
        int32_t *got = malloc((size_t)nrecv * sizeof(int32_t));
        int32_t *buf = malloc(su->count * sizeof(int32_t));
        for (int i = 0; i < nrecv && st == DSHIM_OK; i++) {
            want[i] = -1;
            source[i] = -2;
            memset(buf, 0xff, su->count * sizeof(int32_t));
            if (i % 2 == 0) {
                st = dshim_recv_any(comm, buf, su->count, DSHIM_INT32, &source[i]);
            } else {
                dshim_request_t *req;
                st = dshim_irecv(comm, buf, su->count, DSHIM_INT32, DSHIM_ANY_SOURCE, &req);
                if (st == DSHIM_OK) {
                    st = dshim_wait(req);
                    if (st == DSHIM_OK) {
                        st = dshim_request_source(req, &source[i]);
                    }
                    dshim_request_free(req);
                }
            }
            got[i] = read_msg(buf, su->count);
        }
        if (st == DSHIM_OK) {
            bad = check_matching(size, msgs, nrecv, want, source, got);
        }
        free(want);
        free(source);
        free(got);
        free(buf);
    }
    if (st == DSHIM_OK) {
        st = dshim_barrier(comm);
    }
    if (st != DSHIM_OK) {
        fprintf(stderr, "ERROR: %s\n", dshim_last_error());
    }
    dshim_comm_destroy(comm);
    return st != DSHIM_OK ? 3 : bad ? 4 : 0;
}

/* ---- interleaved: rank 0 posts, all at once, receives from specific ranks
 * and from any source in an order where MPI's greedy matching cannot get
 * stuck: per sender, 2 specific receives, and before its last one only
 * size-1 receives from any source (2 + 3 <= MSGS_PER_SENDER up to 4 ranks) */

static int body_interleaved(int rank, int size, int port, void *arg)
{
    const setup_t *su = arg;
    dshim_comm_t *comm;
    if (init(rank, size, port, su, &comm)) {
        return 2;
    }
    const int msgs = MSGS_PER_SENDER;
    int bad = 0;
    dshim_status_t st = DSHIM_OK;
    if (rank != 0) {
        st = send_all(comm, rank, msgs, su->count);
    } else {
        int nrecv = (size - 1) * msgs, n = 0;
        int *want = malloc((size_t)nrecv * sizeof(int)), *source = malloc((size_t)nrecv * sizeof(int));
        int32_t *got = malloc((size_t)nrecv * sizeof(int32_t));
        int32_t *bufs = malloc((size_t)nrecv * su->count * sizeof(int32_t));
        dshim_request_t **reqs = calloc((size_t)nrecv, sizeof(*reqs));
        for (int s = 1; s < size; s++) {
            want[n++] = s;
        }
        for (int s = 1; s < size; s++) {
            want[n++] = -1;
        }
        for (int s = 1; s < size; s++) {
            want[n++] = s;
        }
        while (n < nrecv) {
            want[n++] = -1;
        }
        int posted = 0;
        for (int i = 0; i < nrecv && st == DSHIM_OK; i++) {
            int32_t *b = bufs + (size_t)i * su->count;
            source[i] = -2;
            st = want[i] < 0 ? dshim_irecv_any(comm, b, su->count, DSHIM_INT32, &source[i], &reqs[i])
                             : dshim_irecv(comm, b, su->count, DSHIM_INT32, want[i], &reqs[i]);
            posted += st == DSHIM_OK;
        }
        for (int i = 0; i < posted; i++) {
            dshim_status_t w = dshim_wait(reqs[i]);
            st = st == DSHIM_OK ? w : st;
            if (w == DSHIM_OK && want[i] >= 0 && dshim_request_source(reqs[i], &source[i]) != DSHIM_OK) {
                st = DSHIM_ERR_INTERNAL;
            }
            dshim_request_free(reqs[i]);
            got[i] = read_msg(bufs + (size_t)i * su->count, su->count);
        }
        if (st == DSHIM_OK) {
            bad = check_matching(size, msgs, nrecv, want, source, got);
        }
        free(want);
        free(source);
        free(got);
        free(bufs);
        free(reqs);
    }
    if (st == DSHIM_OK) {
        st = dshim_barrier(comm);
    }
    if (st != DSHIM_OK) {
        fprintf(stderr, "ERROR: %s\n", dshim_last_error());
    }
    dshim_comm_destroy(comm);
    return st != DSHIM_OK ? 3 : bad ? 4 : 0;
}

/* ---- with collectives on the same communicator: each round every other
 * rank sends to rank 0 and goes straight on to an allreduce, so its
 * allreduce data waits on rank 0's stream while rank 0 still receives from
 * any source (it must skip that stream, not take the data as a message);
 * rank 0 names one sender per round specifically, first -------------------- */

static int body_with_collectives(int rank, int size, int port, void *arg)
{
    const setup_t *su = arg;
    dshim_comm_t *comm;
    if (init(rank, size, port, su, &comm)) {
        return 2;
    }
    const int rounds = 20;
    int bad = 0;
    dshim_status_t st = DSHIM_OK;
    int32_t *buf = malloc(su->count * sizeof(int32_t));
    for (int r = 0; r < rounds && st == DSHIM_OK; r++) {
        if (rank != 0) {
            fill_msg(buf, su->count, rank, r);
            dshim_request_t *req;
            st = dshim_isend(comm, buf, su->count, DSHIM_INT32, 0, &req);
            int32_t one = 1;
            if (st == DSHIM_OK) {
                dshim_status_t a = dshim_allreduce(comm, &one, &one, 1, DSHIM_INT32, DSHIM_SUM);
                st = dshim_wait(req);
                st = st == DSHIM_OK ? a : st;
                dshim_request_free(req);
                bad += st == DSHIM_OK && one != size;
            }
            continue;
        }
        int named = 1 + r % (size - 1);
        int *from = calloc((size_t)size, sizeof(int));
        for (int i = 0; i < size - 1 && st == DSHIM_OK; i++) {
            int src = -1;
            st = i == 0 ? dshim_recv(comm, buf, su->count, DSHIM_INT32, named)
                        : dshim_recv_any(comm, buf, su->count, DSHIM_INT32, &src);
            src = i == 0 ? named : src;
            if (st == DSHIM_OK && (src < 1 || src >= size || read_msg(buf, su->count) != tag_of(src, r) ||
                                   from[src]++)) {
                fprintf(stderr, "FAIL: round %d receive %d: source %d, message %d\n", r, i, src,
                        (int)read_msg(buf, su->count));
                bad++;
            }
        }
        free(from);
        int32_t one = 1;
        if (st == DSHIM_OK) {
            st = dshim_allreduce(comm, &one, &one, 1, DSHIM_INT32, DSHIM_SUM);
            bad += st == DSHIM_OK && one != size;
        }
    }
    free(buf);
    if (st != DSHIM_OK) {
        fprintf(stderr, "ERROR: %s\n", dshim_last_error());
    }
    dshim_comm_destroy(comm);
    return st != DSHIM_OK ? 3 : bad ? 4 : 0;
}

/* The loops: transport x ranks x message size. */
static const setup_t setups[] = {
    {"shm", 2, 1},   {"shm", 3, 3000},  {"shm", 4, 1},   {"shm", 4, 40000},
    {"tcp", 2, 3000}, {"tcp", 3, 1},    {"tcp", 4, 3000}, {"tcp", 3, 40000},
    {"mixed", 3, 3000}, {"mixed", 4, 1}, {"mixed", 4, 40000},
};
#define N_SETUPS ((int)(sizeof(setups) / sizeof(setups[0])))

static void run_setup(test_rank_body_t body, int i, const char *what)
{
    const setup_t *su = &setups[i];
    char transport[64];
    snprintf(transport, sizeof(transport), "DSHIM_TRANSPORT=%s", strcmp(su->transport, "tcp") ? "auto" : "tcp");
    /* small chunks and rings: messages of 12 KB and 160 KB cross chunk
     * boundaries and ring wraps */
    const char *env[] = {transport, "DSHIM_CHUNK_SIZE=4096", "DSHIM_SHM_RING_SIZE=65536", "DSHIM_TIMEOUT=60", NULL};
    if (!strcmp(su->transport, "shm")) {
        env[0] = "DSHIM_TRANSPORT=shm";
    }
    test_rank_result_t res[TEST_MAX_RANKS];
    int rc = test_run_ranks(su->np, body, (void *)su, env, 90.0, res);
    int ok = rc == 0;
    for (int r = 0; r < su->np; r++) {
        ok &= res[r].exited && res[r].code == 0;
    }
    if (!ok) {
        fprintf(stderr, "%s over %s, %d ranks, %zu x int32:\n", what, su->transport, su->np, su->count);
        dump(res, su->np);
    }
    ck_assert_msg(ok, "%s over %s, %d ranks, %zu x int32 failed", what, su->transport, su->np, su->count);
}

START_TEST(test_fan_in)
{
    run_setup(body_fan_in, _i, "fan-in");
}
END_TEST

START_TEST(test_interleaved)
{
    run_setup(body_interleaved, _i, "interleaved");
}
END_TEST

START_TEST(test_with_collectives)
{
    run_setup(body_with_collectives, _i, "with collectives");
}
END_TEST

/* ---- failures ------------------------------------------------------------- */

static const char *env_shm[] = {"DSHIM_TRANSPORT=shm", "DSHIM_TIMEOUT=60", NULL};
static const char *env_tcp[] = {"DSHIM_TRANSPORT=tcp", "DSHIM_TIMEOUT=60", NULL};
static const char *const *envs[] = {env_shm, env_tcp};

/* rank 1 sends 8 elements, rank 0 receives 4 from any source */
static int body_too_big(int rank, int size, int port, void *arg)
{
    (void)arg;
    dshim_comm_t *comm;
    if (test_comm_init(rank, size, port, &comm)) {
        return 2;
    }
    int32_t buf[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    dshim_status_t st;
    if (rank == 1) {
        st = dshim_send(comm, buf, 8, DSHIM_INT32, 0);
        if (st == DSHIM_OK) {
            st = dshim_barrier(comm); /* fails once rank 0 gave up */
        }
    } else {
        int32_t small[4];
        int src = -2;
        st = dshim_recv_any(comm, small, 4, DSHIM_INT32, &src);
        if (st == DSHIM_OK) {
            fprintf(stderr, "WRONG: a message of 8 elements fit a buffer of 4\n");
        }
    }
    if (st != DSHIM_OK) {
        fprintf(stderr, "ERROR: %s\n", dshim_last_error());
    }
    dshim_comm_destroy(comm);
    return st == DSHIM_OK ? 0 : 3;
}

START_TEST(test_too_big)
{
    test_rank_result_t res[2];
    int rc = test_run_ranks(2, body_too_big, NULL, envs[_i], 30.0, res);
    ck_assert_int_eq(rc, 0);
    int ok = res[0].exited && res[0].code == 3 && strstr(res[0].err, "mismatched sizes") &&
             strstr(res[0].err, "rank 1 (host") &&
             strstr(res[0].err, "sent 8 x int32 (32 bytes) where this rank's receive expects 4 x int32 (16 bytes)");
    if (!ok) {
        dump(res, 2);
    }
    ck_assert_msg(ok, "rank 0 must fail naming both sizes");
}
END_TEST

/* nobody sends: the timeout names the ranks that sent nothing */
static int body_silent(int rank, int size, int port, void *arg)
{
    (void)arg;
    dshim_comm_t *comm;
    if (test_comm_init(rank, size, port, &comm)) {
        return 2;
    }
    dshim_status_t st = DSHIM_OK;
    double took = 0;
    if (rank == 0) {
        int32_t v;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        st = dshim_recv_any(comm, &v, 1, DSHIM_INT32, NULL);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        took = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
        fprintf(stderr, "ERROR after %.1f s: %s\n", took,
                st == DSHIM_OK ? "received a message nobody sent" : dshim_last_error());
    } else {
        sleep_s(5.0); /* alive, connected, silent past rank 0's timeout */
    }
    dshim_comm_destroy(comm);
    return rank == 0 ? (st == DSHIM_OK ? 0 : took > 4.0 ? 5 : 3) : 0;
}

START_TEST(test_timeout_names_silent)
{
    const char *shm[] = {"DSHIM_TRANSPORT=shm", "DSHIM_TIMEOUT=2", NULL};
    const char *tcp[] = {"DSHIM_TRANSPORT=tcp", "DSHIM_TIMEOUT=2", NULL};
    test_rank_result_t res[3];
    int rc = test_run_ranks(3, body_silent, NULL, _i ? tcp : shm, 30.0, res);
    ck_assert_int_eq(rc, 0);
    int ok = res[0].exited && res[0].code == 3 &&
             strstr(res[0].err, "receiving from any source (no message from ranks 1, 2)") &&
             strstr(res[0].err, "DSHIM_TIMEOUT");
    if (!ok) {
        dump(res, 3);
    }
    ck_assert_msg(ok, "rank 0 must time out after ~2 s naming ranks 1 and 2");
}
END_TEST

/* rank 2 dies while rank 0 receives from any source */
static int body_dead(int rank, int size, int port, void *arg)
{
    (void)arg;
    dshim_comm_t *comm;
    if (test_comm_init(rank, size, port, &comm)) {
        return 2;
    }
    dshim_status_t st = DSHIM_OK;
    double took = 0;
    if (rank == 2) {
        sleep_s(0.5);
        kill(getpid(), SIGKILL);
    } else if (rank == 0) {
        int32_t v;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        st = dshim_recv_any(comm, &v, 1, DSHIM_INT32, NULL);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        took = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
        fprintf(stderr, "ERROR after %.1f s: %s\n", took,
                st == DSHIM_OK ? "received a message nobody sent" : dshim_last_error());
    } else {
        sleep_s(8.0);
    }
    dshim_comm_destroy(comm);
    /* DSHIM_TIMEOUT is 60 s: the death must be noticed long before */
    return rank == 0 ? (st == DSHIM_OK ? 0 : took > 5.0 ? 5 : 3) : 0;
}

START_TEST(test_dead_peer)
{
    test_rank_result_t res[3];
    int rc = test_run_ranks(3, body_dead, NULL, envs[_i], 30.0, res);
    ck_assert_int_eq(rc, 0);
    int ok = res[0].exited && res[0].code == 3 && strstr(res[0].err, "rank 2 (host ") && strstr(res[0].err, ") closed");
    if (!ok) {
        dump(res, 3);
    }
    ck_assert_msg(ok, "rank 0 must fail at once naming rank 2 (DSHIM_TIMEOUT is 60 s)");
}
END_TEST

/* rank 1 writes bytes that are no dshim message into its TCP connection to
 * rank 0, which receives from any source: they are not skipped as another
 * kind of message but reported */
static int body_garbage(int rank, int size, int port, void *arg)
{
    (void)arg;
    dshim_comm_t *comm;
    if (test_comm_init(rank, size, port, &comm)) {
        return 2;
    }
    dshim_status_t st = DSHIM_OK;
    if (rank == 1) {
        /* connections are made on first use: rank 0's receive from any
         * source makes the one to rank 1 */
        for (int i = 0; i < 1000 && !dshim_comm_conn(comm, 0); i++) {
            sleep_s(0.01);
        }
        char junk[64];
        memset(junk, 0x5A, sizeof(junk));
        ssize_t w = write(dshim_comm_conn(comm, 0)->fd, junk, sizeof(junk));
        (void)w;
        sleep_s(1.0);
    } else {
        int32_t v;
        st = dshim_recv_any(comm, &v, 1, DSHIM_INT32, NULL);
        fprintf(stderr, "ERROR: %s\n", st == DSHIM_OK ? "took garbage for a message" : dshim_last_error());
    }
    dshim_comm_destroy(comm);
    return rank == 0 ? (st == DSHIM_OK ? 0 : 3) : 0;
}

START_TEST(test_garbage)
{
    test_rank_result_t res[2];
    int rc = test_run_ranks(2, body_garbage, NULL, env_tcp, 30.0, res);
    ck_assert_int_eq(rc, 0);
    int ok = res[0].exited && res[0].code == 3 && strstr(res[0].err, "not a dshim message") &&
             strstr(res[0].err, "rank 1");
    if (!ok) {
        dump(res, 2);
    }
    ck_assert_msg(ok, "rank 0 must report rank 1's garbage");
}
END_TEST

/* misuse: the source of a send, of an unfinished receive; any source alone */
static int body_misuse(int rank, int size, int port, void *arg)
{
    (void)arg;
    dshim_comm_t *comm;
    if (test_comm_init(rank, size, port, &comm)) {
        return 2;
    }
    int bad = 0, src = -2;
    int32_t v = 5, w = 0;
    dshim_request_t *req;
    if (size == 1) {
        bad += dshim_recv_any(comm, &w, 1, DSHIM_INT32, &src) != DSHIM_ERR_INVALID ||
               !strstr(dshim_last_error(), "no other rank could ever send");
        dshim_comm_destroy(comm);
        return bad ? 4 : 0;
    }
    bad += dshim_irecv_any(comm, &w, 1, DSHIM_INT32, &src, NULL) != DSHIM_ERR_INVALID;
    bad += dshim_request_source(NULL, &src) != DSHIM_ERR_INVALID;
    if (rank == 0) {
        /* the receive cannot complete before rank 1 sends, which it does
         * only after it got rank 0's message, sent after the first check */
        bad += dshim_irecv_any(comm, &w, 1, DSHIM_INT32, &src, &req) != DSHIM_OK;
        bad += src != -1;
        bad += dshim_request_source(req, &src) != DSHIM_ERR_INVALID || !strstr(dshim_last_error(), "not completed");
        dshim_request_t *sreq;
        bad += dshim_isend(comm, &v, 1, DSHIM_INT32, 1, &sreq) != DSHIM_OK;
        bad += dshim_wait(sreq) != DSHIM_OK;
        bad += dshim_request_source(sreq, &src) != DSHIM_ERR_INVALID || !strstr(dshim_last_error(), "not a receive");
        dshim_request_free(sreq);
        bad += dshim_wait(req) != DSHIM_OK;
        int asked = -2;
        bad += dshim_request_source(req, &asked) != DSHIM_OK || asked != 1 || src != 1 || w != 6;
        dshim_request_free(req);
    } else {
        bad += dshim_recv(comm, &w, 1, DSHIM_INT32, 0) != DSHIM_OK || w != 5;
        v = 6;
        bad += dshim_send(comm, &v, 1, DSHIM_INT32, 0) != DSHIM_OK;
    }
    bad += dshim_barrier(comm) != DSHIM_OK;
    if (bad) {
        fprintf(stderr, "FAIL: rank %d: %d checks failed; last error: %s\n", rank, bad, dshim_last_error());
    }
    dshim_comm_destroy(comm);
    return bad ? 4 : 0;
}

START_TEST(test_misuse)
{
    for (int np = 1; np <= 2; np++) {
        test_rank_result_t res[2];
        int rc = test_run_ranks(np, body_misuse, NULL, env_shm, 30.0, res);
        int ok = rc == 0;
        for (int r = 0; r < np; r++) {
            ok &= res[r].exited && res[r].code == 0;
        }
        if (!ok) {
            dump(res, np);
        }
        ck_assert_msg(ok, "misuse checks on %d rank(s) failed", np);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("anysource");
    TCase *tc = tcase_create("matching");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_fan_in, 0, N_SETUPS);
    tcase_add_loop_test(tc, test_interleaved, 0, N_SETUPS);
    tcase_add_loop_test(tc, test_with_collectives, 0, N_SETUPS);
    suite_add_tcase(s, tc);
    TCase *tf = tcase_create("failures");
    tcase_set_timeout(tf, 120);
    tcase_add_loop_test(tf, test_too_big, 0, 2);
    tcase_add_loop_test(tf, test_timeout_names_silent, 0, 2);
    tcase_add_loop_test(tf, test_dead_peer, 0, 2);
    tcase_add_test(tf, test_garbage);
    tcase_add_test(tf, test_misuse);
    suite_add_tcase(s, tf);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

/*
 * Unit tests of the data engine (shim/comm/xfer.c): steps of sends and
 * receives built here by hand, as an algorithm builds them, and run with
 * dshim_xfer between real ranks (tests/common/ranks.c) over shared memory
 * and over TCP.
 *
 *  - exchange: every rank sends to and receives from every other rank in
 *    one step, seven steps in a row, sizes from 0 bytes (NULL buffers) to
 *    3 MiB (across DSHIM_CHUNK_SIZE, the shm ring and the socket buffers)
 *    and odd sizes (the padding to 8 bytes), a different size per pair in
 *    each step; every byte is checked, and nothing past a buffer written;
 *  - dep and reducing receives: a chain that forwards what it receives
 *    (a send with `dep` on the receive into the same buffer, as the
 *    broadcast chain), then a chain back that adds its own data to what
 *    arrives (RECV_REDUCE) and divides at the end (avg_div);
 *  - arrival order: a rank posts its receive from a late rank before the
 *    receive from a rank whose 16 MiB cannot finish until it is read; the
 *    late rank sends only after that one's send completed.  Served in
 *    posting order, the step would hang;
 *  - a rank that never posts: the others' step fails after DSHIM_TIMEOUT
 *    naming it, and the verdict (dshim_comm_get_missing) holds it as data;
 *  - a peer that exits in the middle of a message (its header sent, its
 *    payload held back by a `dep` that never moves): the error names it,
 *    within seconds, over shm and TCP;
 *  - a step naming a peer that does not exist, or this rank: refused.
 * Killed ranks inside allreduces, mismatched collectives and garbage on a
 * connection are tests/failure/check_failure.c's.
 */
#include <check.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm.h"
#include "config.h"
#include "dshim.h"
#include "net.h"
#include "ranks.h"
#include "xfer.h"

#define MAX_N 4
#define GUARD 64
/* the step numbers here: far above the collectives a test communicator
 * runs itself, so that no arrival mark of those counts for them */
#define SEQ0 1000

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

#define FAIL(...)                                                                                                  \
    do {                                                                                                           \
        fprintf(stderr, "ERROR: rank %d: ", rank);                                                                 \
        fprintf(stderr, __VA_ARGS__);                                                                              \
        fprintf(stderr, "\n");                                                                                     \
        rc = 3;                                                                                                    \
        goto out;                                                                                                  \
    } while (0)

/* A step's signature: the same on every rank (the receiver checks it). */
static dshim_coll_sig_t sig_of(uint64_t seq, dshim_dtype_t dt, dshim_redop_t op, size_t count)
{
    dshim_coll_sig_t s = {.coll = DSHIM_COLL_ALLREDUCE, .dtype = (uint8_t)dt, .redop = (uint8_t)op, .root = -1,
                          .count = count, .seq = seq};
    return s;
}

/* ---- exchange: every pair both ways, several steps ---------------------- */

static const size_t sizes[] = {0, 1, 13, 4099, ((size_t)512 << 10) + 1, ((size_t)1 << 20) + 24,
                               ((size_t)3 << 20) + 5};
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))

/* The bytes rank s sends to rank d in step k: size and pattern. */
static size_t pair_bytes(int k, int s, int d)
{
    return sizes[((size_t)k + (size_t)s + 2 * (size_t)d) % NSIZES];
}

static unsigned char pattern(int k, int s, int d, size_t i)
{
    return (unsigned char)(s * 31 + d * 7 + k * 13 + (int)(i * 3) + (int)(i >> 9));
}

static int body_exchange(int rank, int size, int port, void *arg)
{
    (void)arg;
    dshim_comm_t *comm;
    if (test_comm_init(rank, size, port, &comm)) {
        return 2;
    }
    int rc = 0;
    unsigned char *sbuf[MAX_N] = {0}, *rbuf[MAX_N] = {0};
    size_t big = sizes[NSIZES - 1] + GUARD;
    for (int p = 0; p < size; p++) {
        sbuf[p] = malloc(big);
        rbuf[p] = malloc(big);
        if (!sbuf[p] || !rbuf[p]) {
            FAIL("out of memory");
        }
    }
    for (int k = 0; k < (int)NSIZES; k++) {
        dshim_xfer_op_t ops[2 * MAX_N];
        int n = 0;
        /* posted from the next rank on: every rank in its own order */
        for (int j = 1; j < size; j++) {
            int p = (rank + j) % size;
            size_t out = pair_bytes(k, rank, p), in = pair_bytes(k, p, rank);
            for (size_t i = 0; i < out; i++) {
                sbuf[p][i] = pattern(k, rank, p, i);
            }
            memset(rbuf[p], 0xa5, in + GUARD);
            ops[n++] = dshim_xf_send(p, out ? sbuf[p] : NULL, out);
            ops[n++] = dshim_xf_recv(p, in ? rbuf[p] : NULL, in);
        }
        dshim_coll_sig_t sig = sig_of(SEQ0 + (uint64_t)k, DSHIM_UINT8, DSHIM_SUM, (size_t)k);
        if (dshim_xfer(comm, &sig, ops, n) != DSHIM_OK) {
            FAIL("step %d: %s", k, dshim_last_error());
        }
        for (int p = 0; p < size; p++) {
            if (p == rank) {
                continue;
            }
            size_t in = pair_bytes(k, p, rank);
            for (size_t i = 0; i < in; i++) {
                if (rbuf[p][i] != pattern(k, p, rank, i)) {
                    FAIL("step %d: byte %zu of %zu from rank %d is 0x%02x, not 0x%02x", k, i, in, p, rbuf[p][i],
                         pattern(k, p, rank, i));
                }
            }
            for (size_t i = in; i < in + GUARD; i++) {
                if (rbuf[p][i] != 0xa5) {
                    FAIL("step %d: byte %zu past the %zu received from rank %d was written", k, i, in, p);
                }
            }
        }
    }
out:
    for (int p = 0; p < size; p++) {
        free(sbuf[p]);
        free(rbuf[p]);
    }
    if (dshim_comm_destroy(comm) != DSHIM_OK && rc == 0) {
        fprintf(stderr, "ERROR: rank %d: destroy: %s\n", rank, dshim_last_error());
        rc = 4;
    }
    return rc;
}

/* Runs body on n ranks and wants every rank to exit 0. */
static void run_all_ok(int n, test_rank_body_t body, void *arg, const char *transport)
{
    char t[64];
    snprintf(t, sizeof(t), "DSHIM_TRANSPORT=%s", transport);
    const char *env[] = {t, "DSHIM_TIMEOUT=20", NULL};
    test_rank_result_t res[MAX_N];
    int rc = test_run_ranks(n, body, arg, env, 30.0, res);
    int ok = rc == 0;
    for (int r = 0; r < n; r++) {
        ok = ok && res[r].exited && res[r].code == 0;
    }
    if (!ok) {
        dump(res, n);
    }
    ck_assert_msg(ok, "%d ranks over %s: every rank must exit 0 (stderr above)", n, transport);
}

START_TEST(test_exchange_shm)
{
    for (int n = 2; n <= 4; n++) {
        run_all_ok(n, body_exchange, NULL, "shm");
    }
}
END_TEST

START_TEST(test_exchange_tcp)
{
    run_all_ok(2, body_exchange, NULL, "tcp");
    run_all_ok(4, body_exchange, NULL, "tcp");
}
END_TEST

/* ---- dep: forwarding in a chain; reducing receives ---------------------- */

#define CHAIN_COUNT ((((size_t)3 << 20) + 12) / 4) /* int32/float32 elements: across chunks and rings */

static int body_chain(int rank, int size, int port, void *arg)
{
    (void)arg;
    dshim_comm_t *comm;
    if (test_comm_init(rank, size, port, &comm)) {
        return 2;
    }
    int rc = 0;
    size_t bytes = CHAIN_COUNT * 4;
    int32_t *buf = malloc(bytes);
    float *mine = malloc(bytes), *acc = malloc(bytes);
    if (!buf || !mine || !acc) {
        FAIL("out of memory");
    }
    /* forward: rank 0's data down the chain, each rank sending on what it
     * has received so far (dep), from the same buffer */
    for (size_t i = 0; i < CHAIN_COUNT; i++) {
        buf[i] = rank == 0 ? (int32_t)(i * 2654435761u) : -1;
    }
    dshim_xfer_op_t ops[2];
    int n = 0;
    if (rank > 0) {
        ops[n++] = dshim_xf_recv(rank - 1, buf, bytes);
    }
    if (rank < size - 1) {
        ops[n] = dshim_xf_send(rank + 1, buf, bytes);
        ops[n].dep = rank > 0 ? &ops[0] : NULL;
        n++;
    }
    dshim_coll_sig_t fwd = sig_of(SEQ0, DSHIM_INT32, DSHIM_SUM, CHAIN_COUNT);
    if (dshim_xfer(comm, &fwd, ops, n) != DSHIM_OK) {
        FAIL("forward: %s", dshim_last_error());
    }
    for (size_t i = 0; i < CHAIN_COUNT; i++) {
        if (buf[i] != (int32_t)(i * 2654435761u)) {
            FAIL("forward: element %zu is %d, not %d", i, buf[i], (int32_t)(i * 2654435761u));
        }
    }
    /* back: the last rank sends its data; each other rank adds its own to
     * what arrives and sends the sum on as it grows (dep on the reducing
     * receive); rank 0 divides by the size (avg_div).  Values are n times
     * small integers: every sum and the average are exact in float32. */
    for (size_t i = 0; i < CHAIN_COUNT; i++) {
        mine[i] = (float)(size * (int)((i + (size_t)rank * 5) % 11));
    }
    n = 0;
    if (rank == size - 1) {
        ops[n++] = dshim_xf_send(rank - 1, mine, bytes);
    } else {
        ops[n] = dshim_xf_recv_reduce(rank + 1, acc, mine, bytes, 0);
        ops[n].avg_div = rank == 0;
        n++;
        if (rank > 0) {
            ops[n] = dshim_xf_send(rank - 1, acc, bytes);
            ops[n].dep = &ops[0];
            n++;
        }
    }
    dshim_coll_sig_t back = sig_of(SEQ0 + 1, DSHIM_FLOAT32, DSHIM_AVG, CHAIN_COUNT);
    if (dshim_xfer(comm, &back, ops, n) != DSHIM_OK) {
        FAIL("back: %s", dshim_last_error());
    }
    for (size_t i = 0; i < CHAIN_COUNT && rank == 0; i++) {
        float sum = 0;
        for (int r = 0; r < size; r++) {
            sum += (float)(size * (int)((i + (size_t)r * 5) % 11));
        }
        if (acc[i] != sum / (float)size) {
            FAIL("back: element %zu is %g, not %g", i, (double)acc[i], (double)(sum / (float)size));
        }
    }
out:
    free(buf);
    free(mine);
    free(acc);
    if (dshim_comm_destroy(comm) != DSHIM_OK && rc == 0) {
        rc = 4;
    }
    return rc;
}

START_TEST(test_chain_dep_and_reduce)
{
    run_all_ok(2, body_chain, NULL, "shm");
    run_all_ok(4, body_chain, NULL, "shm");
    run_all_ok(3, body_chain, NULL, "tcp");
}
END_TEST

/* ---- messages arriving in another order than posted --------------------- */

#define ORDER_BIG ((size_t)16 << 20) /* more than a ring or a socket's buffers hold */

static int body_order(int rank, int size, int port, void *arg)
{
    (void)arg;
    (void)size;
    dshim_comm_t *comm;
    if (test_comm_init(rank, size, port, &comm)) {
        return 2;
    }
    int rc = 0;
    unsigned char *big = malloc(ORDER_BIG);
    uint64_t token = 0;
    if (!big) {
        FAIL("out of memory");
    }
    dshim_coll_sig_t sig = sig_of(SEQ0, DSHIM_UINT8, DSHIM_SUM, 0);
    dshim_xfer_op_t ops[2];
    if (rank == 0) {
        /* the late rank's receive first */
        memset(big, 0, ORDER_BIG);
        ops[0] = dshim_xf_recv(2, &token, sizeof(token));
        ops[1] = dshim_xf_recv(1, big, ORDER_BIG);
        if (dshim_xfer(comm, &sig, ops, 2) != DSHIM_OK) {
            FAIL("%s", dshim_last_error());
        }
        if (token != 0x5eed || big[0] != 1 || big[ORDER_BIG - 1] != 1) {
            FAIL("wrong data: token 0x%llx, big %d..%d", (unsigned long long)token, big[0], big[ORDER_BIG - 1]);
        }
    } else if (rank == 1) {
        memset(big, 1, ORDER_BIG);
        ops[0] = dshim_xf_send(0, big, ORDER_BIG);
        if (dshim_xfer(comm, &sig, ops, 1) != DSHIM_OK) {
            FAIL("send to 0: %s", dshim_last_error());
        }
        /* only now may rank 2 send to rank 0 */
        ops[0] = dshim_xf_send(2, &token, sizeof(token));
        if (dshim_xfer(comm, &sig, ops, 1) != DSHIM_OK) {
            FAIL("send to 2: %s", dshim_last_error());
        }
    } else {
        ops[0] = dshim_xf_recv(1, &token, sizeof(token));
        if (dshim_xfer(comm, &sig, ops, 1) != DSHIM_OK) {
            FAIL("recv from 1: %s", dshim_last_error());
        }
        token = 0x5eed;
        ops[0] = dshim_xf_send(0, &token, sizeof(token));
        if (dshim_xfer(comm, &sig, ops, 1) != DSHIM_OK) {
            FAIL("send to 0: %s", dshim_last_error());
        }
    }
out:
    free(big);
    if (dshim_comm_destroy(comm) != DSHIM_OK && rc == 0) {
        rc = 4;
    }
    return rc;
}

START_TEST(test_arrival_order)
{
    run_all_ok(3, body_order, NULL, "shm");
    run_all_ok(3, body_order, NULL, "tcp");
}
END_TEST

/* ---- a rank that never posts: the timeout and its verdict --------------- */

#define SILENT_SEQ (SEQ0 + 7)
#define SILENT_TIMEOUT_S 2.0

static int body_silent(int rank, int size, int port, void *arg)
{
    (void)arg;
    dshim_comm_t *comm;
    if (test_comm_init(rank, size, port, &comm)) {
        return 2;
    }
    if (rank == size - 1) {
        /* never posts the step; stays until the others gave up */
        sleep_s(SILENT_TIMEOUT_S + 2.5);
        dshim_comm_destroy(comm);
        return 0;
    }
    int rc = 0;
    uint64_t out = (uint64_t)rank, in[MAX_N] = {0};
    dshim_xfer_op_t ops[2 * MAX_N];
    int n = 0;
    for (int p = 0; p < size; p++) {
        if (p != rank) {
            ops[n++] = dshim_xf_send(p, &out, sizeof(out));
            ops[n++] = dshim_xf_recv(p, &in[p], sizeof(in[p]));
        }
    }
    dshim_coll_sig_t sig = sig_of(SILENT_SEQ, DSHIM_UINT8, DSHIM_SUM, 8);
    double t0 = dshim_now();
    dshim_status_t st = dshim_xfer(comm, &sig, ops, n);
    double took = dshim_now() - t0;
    fprintf(stderr, "step: status %d after %.2f s: %s\n", (int)st, took, dshim_last_error());
    uint64_t seq = 0;
    int missing[MAX_N] = {-1, -1, -1, -1}, nmissing = -2;
    dshim_status_t verdict = dshim_comm_get_missing(comm, &seq, missing, MAX_N, &nmissing);
    if (st != DSHIM_ERR_TIMEOUT) {
        FAIL("the step returned %d, not DSHIM_ERR_TIMEOUT", (int)st);
    }
    /* never before the timeout; the upper bound tells "bounded" from "hung"
     * on a loaded machine (make test, the sanitizers), not fast from slow */
    if (took < SILENT_TIMEOUT_S - 0.1 || took > SILENT_TIMEOUT_S + 3.0) {
        FAIL("gave up after %.2f s with DSHIM_TIMEOUT=%g", took, SILENT_TIMEOUT_S);
    }
    char want[64];
    snprintf(want, sizeof(want), "did not arrive at this collective: %d", size - 1);
    if (!strstr(dshim_last_error(), want)) {
        FAIL("the error does not say '%s'", want);
    }
    if (verdict != DSHIM_ERR_TIMEOUT || seq != SILENT_SEQ || nmissing != 1 || missing[0] != size - 1) {
        FAIL("verdict: status %d, seq %llu, %d missing (first %d); wanted timeout, %d, 1, %d", (int)verdict,
             (unsigned long long)seq, nmissing, missing[0], SILENT_SEQ, size - 1);
    }
out:
    dshim_comm_destroy(comm);
    return rc;
}

START_TEST(test_silent_rank_times_out)
{
    const char *env[] = {"DSHIM_TIMEOUT=2", NULL};
    test_rank_result_t res[3];
    int rc = test_run_ranks(3, body_silent, NULL, env, 30.0, res);
    int ok = rc == 0;
    for (int r = 0; r < 3; r++) {
        ok = ok && res[r].exited && res[r].code == 0;
    }
    if (!ok) {
        dump(res, 3);
    }
    ck_assert_msg(ok, "ranks 0 and 1 must time out naming rank 2, as text and as data (stderr above)");
}
END_TEST

/* ---- a peer that exits in the middle of a message ----------------------- */

#define EXIT_BYTES ((size_t)4 << 20)
#define EXIT_AFTER_S 0.3

static void *exit_soon(void *arg)
{
    (void)arg;
    sleep_s(EXIT_AFTER_S);
    _exit(0); /* no goodbye, no destroy: as a program that just ends */
    return NULL;
}

/* Rank 1 posts a receive from rank 0 (which never sends) and a send to
 * rank 0 that may move only what that receive got (dep): its header goes
 * out, its payload never.  Rank 0 receives: past the header, it waits for
 * the payload until rank 1 exits. */
static int body_exit(int rank, int size, int port, void *arg)
{
    (void)arg;
    dshim_comm_t *comm;
    if (test_comm_init(rank, size, port, &comm)) {
        return 2;
    }
    int rc = 0;
    unsigned char *buf = calloc(1, EXIT_BYTES);
    dshim_coll_sig_t sig = sig_of(SEQ0, DSHIM_UINT8, DSHIM_SUM, EXIT_BYTES);
    dshim_xfer_op_t ops[2];
    if (!buf) {
        FAIL("out of memory");
    }
    if (rank == 1) {
        pthread_t t;
        ops[0] = dshim_xf_recv(0, buf, EXIT_BYTES);
        ops[1] = dshim_xf_send(0, buf, EXIT_BYTES);
        ops[1].dep = &ops[0];
        pthread_create(&t, NULL, exit_soon, NULL);
        dshim_status_t st = dshim_xfer(comm, &sig, ops, 2);
        FAIL("the step returned %d before this rank exited: %s", (int)st, dshim_last_error());
    }
    ops[0] = dshim_xf_recv(1, buf, EXIT_BYTES);
    double t0 = dshim_now();
    dshim_status_t st = dshim_xfer(comm, &sig, ops, 1);
    double took = dshim_now() - t0;
    fprintf(stderr, "step: status %d after %.2f s: %s\n", (int)st, took, dshim_last_error());
    if (st == DSHIM_OK) {
        FAIL("the step succeeded without rank 1's payload");
    }
    if (ops[0].phase == 0 || ops[0].done != 0) {
        /* phase 0: still in the header; the payload never left rank 1 */
        FAIL("the receive was not waiting for the payload (phase %d, %zu bytes)", ops[0].phase, ops[0].done);
    }
    if (!strstr(dshim_last_error(), "rank 1")) {
        FAIL("the error does not name rank 1");
    }
    if (took > EXIT_AFTER_S + 5.0) {
        FAIL("took %.2f s to see rank 1 exit", took);
    }
out:
    free(buf);
    dshim_comm_destroy(comm);
    return rc;
}

static void run_exit(const char *transport)
{
    char t[64];
    snprintf(t, sizeof(t), "DSHIM_TRANSPORT=%s", transport);
    const char *env[] = {t, "DSHIM_TIMEOUT=60", NULL};
    test_rank_result_t res[2];
    int rc = test_run_ranks(2, body_exit, NULL, env, 30.0, res);
    int ok = rc == 0 && res[0].exited && res[0].code == 0 && res[1].exited && res[1].code == 0;
    if (!ok) {
        dump(res, 2);
    }
    ck_assert_msg(ok, "over %s: rank 0 must fail naming rank 1 within seconds of its exit (stderr above)",
                  transport);
}

START_TEST(test_peer_exits_mid_message_shm)
{
    run_exit("shm");
}
END_TEST

START_TEST(test_peer_exits_mid_message_tcp)
{
    run_exit("tcp");
}
END_TEST

/* ---- a peer that does not exist ----------------------------------------- */

static int body_bad_peer(int rank, int size, int port, void *arg)
{
    (void)arg;
    dshim_comm_t *comm;
    if (test_comm_init(rank, size, port, &comm)) {
        return 2;
    }
    int rc = 0;
    /* rank 0 names rank `size`, rank 1 itself */
    int peer = rank == 0 ? size : rank;
    char want[64];
    snprintf(want, sizeof(want), "invalid peer %d", peer);
    uint64_t v = 0;
    dshim_xfer_op_t op = dshim_xf_send(peer, &v, sizeof(v));
    dshim_coll_sig_t sig = sig_of(SEQ0, DSHIM_UINT8, DSHIM_SUM, 8);
    dshim_status_t st = dshim_xfer(comm, &sig, &op, 1);
    if (st != DSHIM_ERR_INTERNAL || !strstr(dshim_last_error(), want)) {
        FAIL("status %d, '%s'; wanted DSHIM_ERR_INTERNAL saying '%s'", (int)st, dshim_last_error(), want);
    }
    if (dshim_comm_get_error(comm, NULL, 0) != DSHIM_ERR_INTERNAL) {
        FAIL("the communicator was not failed");
    }
out:
    dshim_comm_destroy(comm);
    return rc;
}

START_TEST(test_invalid_peer)
{
    run_all_ok(2, body_bad_peer, NULL, "auto");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("xfer");
    TCase *tc = tcase_create("steps");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_exchange_shm);
    tcase_add_test(tc, test_exchange_tcp);
    tcase_add_test(tc, test_chain_dep_and_reduce);
    tcase_add_test(tc, test_arrival_order);
    tcase_add_test(tc, test_silent_rank_times_out);
    tcase_add_test(tc, test_peer_exits_mid_message_shm);
    tcase_add_test(tc, test_peer_exits_mid_message_tcp);
    tcase_add_test(tc, test_invalid_peer);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

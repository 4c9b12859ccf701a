/*
 * Unit tests of the single-copy allreduce (shim/comm/coll_single_copy.c):
 * ranks of one host reading their share of every peer's sbuf and writing
 * the result into every peer's rbuf (process_vm_readv/writev through the
 * shm transport's peer_read/peer_write), forced with DSHIM_ALGO=cma.
 *
 *  - results: 2, 3 and 4 ranks, four dtypes, sum, max and (floats) avg, in
 *    place and out of place, at counts around what the code cuts by: fewer
 *    elements than ranks (empty shares), odd counts (uneven shares), one
 *    piece of a share (SINGLE_COPY_PIECE, 256 KiB) and one element either
 *    side of it, and shares of several pieces; every rank checks every
 *    element, that its sbuf was not written, and that nothing was written
 *    past its rbuf; the first call's probe must have said yes;
 *  - the plan (dshim_single_copy_plan) refusing single copies where they
 *    cannot serve: DSHIM_SHM_CMA=0 on every rank, sockets only, ranks on
 *    pretended hosts.  DSHIM_ALGO=cma then runs another algorithm, right,
 *    with no probe and no warning.
 * What happens when a rank dies mid-copy, when the kernel refuses the reads
 * or writes on one rank, or when one rank alone turns them off, is
 * tests/failure/check_failure.c's (test_cma_*).
 */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "config.h"
#include "dshim.h"
#include "ranks.h"

#define PIECE_BYTES ((size_t)256 << 10) /* SINGLE_COPY_PIECE */
#define GUARD 64                        /* bytes after rbuf that must stay untouched */
#define WARNING "no single-copy transfers between the ranks of this host"

/* Element i of rank r's input: a small integer times n, so that sums stay
 * exact in every dtype (int8 too: at most 4 ranks × 24) and avg (sum / n) too. */
static long input_of(size_t i, int r, int n)
{
    return (long)n * (long)((i * 7 + (size_t)r * 3) % 7);
}

static void put(void *buf, dshim_dtype_t dt, size_t i, double v)
{
    switch (dt) {
    case DSHIM_INT8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case DSHIM_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case DSHIM_FLOAT32: ((float *)buf)[i] = (float)v; break;
    default: ((double *)buf)[i] = v; break;
    }
}

static double get(const void *buf, dshim_dtype_t dt, size_t i)
{
    switch (dt) {
    case DSHIM_INT8: return ((const int8_t *)buf)[i];
    case DSHIM_INT32: return ((const int32_t *)buf)[i];
    case DSHIM_FLOAT32: return ((const float *)buf)[i];
    default: return ((const double *)buf)[i];
    }
}

static double expected(size_t i, int n, dshim_redop_t op)
{
    double sum = 0, max = 0;
    for (int r = 0; r < n; r++) {
        double v = (double)input_of(i, r, n);
        sum += v;
        max = v > max ? v : max;
    }
    return op == DSHIM_MAX ? max : op == DSHIM_AVG ? sum / n : sum;
}

/* One allreduce and its checks on this rank; 0 when right. */
static int one_call(dshim_comm_t *comm, dshim_dtype_t dt, dshim_redop_t op, size_t count, int in_place)
{
    int n = comm->size, r = comm->rank;
    size_t es = dshim_dtype_size(dt), bytes = count * es;
    char *sbuf = malloc(bytes + GUARD), *rbuf = in_place ? sbuf : malloc(bytes + GUARD);
    if (!sbuf || !rbuf) {
        fprintf(stderr, "ERROR: rank %d: out of memory\n", r);
        return 1;
    }
    for (size_t i = 0; i < count; i++) {
        put(sbuf, dt, i, (double)input_of(i, r, n));
    }
    memset(sbuf + bytes, 0xa5, GUARD);
    if (!in_place) {
        memset(rbuf, 0x5a, bytes);
        memset(rbuf + bytes, 0xa5, GUARD);
    }
    int bad = 0;
    if (dshim_allreduce(comm, in_place ? rbuf : sbuf, rbuf, count, dt, op) != DSHIM_OK) {
        fprintf(stderr, "ERROR: rank %d: allreduce: %s\n", r, dshim_last_error());
        bad = 1;
    }
    for (size_t i = 0; i < count && !bad; i++) {
        double want = expected(i, n, op);
        if (get(rbuf, dt, i) != want) {
            fprintf(stderr, "ERROR: rank %d: element %zu is %g, not %g\n", r, i, get(rbuf, dt, i), want);
            bad = 1;
        }
        if (!in_place && get(sbuf, dt, i) != (double)input_of(i, r, n)) {
            fprintf(stderr, "ERROR: rank %d: sbuf element %zu was written\n", r, i);
            bad = 1;
        }
    }
    for (size_t k = 0; k < GUARD && !bad; k++) {
        if ((unsigned char)rbuf[bytes + k] != 0xa5 || (unsigned char)sbuf[bytes + k] != 0xa5) {
            fprintf(stderr, "ERROR: rank %d: byte %zu past the buffer's end was written\n", r, k);
            bad = 1;
        }
    }
    if (bad) {
        fprintf(stderr, "  (dtype %d, op %d, count %zu, %s)\n", (int)dt, (int)op, count,
                in_place ? "in place" : "out of place");
    }
    if (!in_place) {
        free(rbuf);
    }
    free(sbuf);
    return bad;
}

static int body_results(int rank, int size, int port, void *arg)
{
    (void)arg;
    dshim_comm_t *comm;
    if (test_comm_init(rank, size, port, &comm)) {
        return 2;
    }
    if (comm->single_copy_transport < 0) {
        fprintf(stderr, "ERROR: rank %d: no transport for single copies on one host with shm\n", rank);
        return 3;
    }
    static const dshim_dtype_t dts[] = {DSHIM_FLOAT32, DSHIM_FLOAT64, DSHIM_INT32, DSHIM_INT8};
    int bad = 0;
    for (size_t d = 0; d < sizeof(dts) / sizeof(dts[0]) && !bad; d++) {
        dshim_dtype_t dt = dts[d];
        size_t per = PIECE_BYTES / dshim_dtype_size(dt);
        size_t counts[] = {1, (size_t)size - 1, 1001, per - 1, per, per + 1, (size_t)size * (2 * per + 3) + 1};
        for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]) && !bad; c++) {
            for (int in_place = 0; in_place < 2 && !bad; in_place++) {
                bad = bad || one_call(comm, dt, DSHIM_SUM, counts[c], in_place);
                bad = bad || one_call(comm, dt, DSHIM_MAX, counts[c], in_place);
                if (dt == DSHIM_FLOAT32 || dt == DSHIM_FLOAT64) {
                    bad = bad || one_call(comm, dt, DSHIM_AVG, counts[c], in_place);
                }
            }
        }
    }
    if (!bad && comm->single_copy != DSHIM_SINGLE_COPY_YES) {
        fprintf(stderr, "ERROR: rank %d: the probe did not allow single copies (state %d)\n", rank,
                comm->single_copy);
        bad = 1;
    }
    dshim_comm_destroy(comm);
    return bad ? 4 : 0;
}

static void run_ranks(int n, test_rank_body_t body, void *arg, const char *const *env)
{
    test_rank_result_t res[4];
    int rc = test_run_ranks(n, body, arg, env, 90.0, res);
    int ok = rc == 0;
    for (int r = 0; r < n; r++) {
        ok = ok && res[r].exited && res[r].code == 0 && !strstr(res[r].err, WARNING);
    }
    if (!ok) {
        for (int r = 0; r < n; r++) {
            fprintf(stderr, "--- rank %d (exited %d, code %d):\n%s\n", r, res[r].exited, res[r].code, res[r].err);
        }
    }
    ck_assert_msg(ok, "%d ranks: every rank right, no warning (stderr above)", n);
}

static const char *const cma_env[] = {"DSHIM_TRANSPORT=shm", "DSHIM_ALGO=cma", "DSHIM_TIMEOUT=60", NULL};

START_TEST(test_results)
{
    run_ranks(_i, body_results, NULL, cma_env);
}
END_TEST

/* Where single copies cannot serve, the plan says so on every rank, no
 * probe runs, and DSHIM_ALGO=cma gives right results by messages. */
enum { OFF_EVERYWHERE, SOCKETS_ONLY, TWO_HOSTS };

static int body_refused(int rank, int size, int port, void *arg)
{
    int mode = *(const int *)arg;
    if (mode == TWO_HOSTS) {
        setenv("DSHIM_HOST_ID", rank == 0 ? "a" : "b", 1);
        dshim_config_reload();
    }
    dshim_comm_t *comm;
    if (test_comm_init(rank, size, port, &comm)) {
        return 2;
    }
    int bad = 0;
    if (comm->single_copy_transport != -1) {
        fprintf(stderr, "ERROR: rank %d: single copies planned over transport %d\n", rank,
                comm->single_copy_transport);
        bad = 1;
    }
    size_t per = PIECE_BYTES / sizeof(float);
    bad = bad || one_call(comm, DSHIM_FLOAT32, DSHIM_SUM, 3 * per + 1, 1);
    bad = bad || one_call(comm, DSHIM_FLOAT32, DSHIM_SUM, 1001, 0);
    if (!bad && comm->single_copy != DSHIM_SINGLE_COPY_UNKNOWN) {
        fprintf(stderr, "ERROR: rank %d: a probe ran (state %d)\n", rank, comm->single_copy);
        bad = 1;
    }
    dshim_comm_destroy(comm);
    return bad ? 4 : 0;
}

START_TEST(test_off_on_every_rank)
{
    int mode = OFF_EVERYWHERE;
    const char *env[] = {"DSHIM_TRANSPORT=shm", "DSHIM_ALGO=cma", "DSHIM_SHM_CMA=0", "DSHIM_TIMEOUT=60", NULL};
    run_ranks(3, body_refused, &mode, env);
}
END_TEST

START_TEST(test_sockets_only)
{
    int mode = SOCKETS_ONLY;
    const char *env[] = {"DSHIM_TRANSPORT=tcp", "DSHIM_ALGO=cma", "DSHIM_TIMEOUT=60", NULL};
    run_ranks(2, body_refused, &mode, env);
}
END_TEST

START_TEST(test_two_hosts)
{
    int mode = TWO_HOSTS;
    run_ranks(3, body_refused, &mode, cma_env + 1); /* auto transport: shm where it reaches */
}
END_TEST

int main(void)
{
    Suite *s = suite_create("single_copy");
    TCase *tc = tcase_create("single_copy");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_results, 2, 5); /* 2, 3 and 4 ranks */
    tcase_add_test(tc, test_off_on_every_rank);
    tcase_add_test(tc, test_sockets_only);
    tcase_add_test(tc, test_two_hosts);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

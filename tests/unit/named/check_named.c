/*
 * Unit tests of the engine of operations matched by name (shim/named,
 * dshim.h "operations matched by name"), between real ranks over shared
 * memory (tests/common/ranks.c):
 *
 *  - allreduce of names submitted in a different order on every rank, from
 *    two threads of each rank;
 *  - fusion of many small tensors: results bit for bit those of a direct
 *    dshim_allreduce of the same data in the same layout, fewer collectives
 *    than names; no fusion with HOROVOD_FUSION_THRESHOLD=0;
 *  - AVG, prescale and postscale as Horovod computes them: integers
 *    (factor as a double, product truncated), float16 (factor as a float);
 *  - allgather with different first dimensions; alltoall with and without
 *    splits; reducescatter of an uneven first dimension (SUM and AVG);
 *    broadcast from each root; barrier;
 *  - join: a joined rank's zeros, the last rank to join, the refusal of an
 *    allgather while a rank has joined, and all ranks usable after it;
 *  - join as Horovod's test_horovod_join_{allreduce,allgather,broadcast} use
 *    it, at 2, 3 and 4 ranks: each rank joining first, int32 AVG divided by
 *    the whole size, the refusals, the same last joined rank everywhere;
 *  - duplicate name (Horovod's text), then the name free again;
 *  - each mismatch (dtype, kind, shape, factors, op, root, device, allgather
 *    dimensions): every rank fails with Horovod's text, the values of each
 *    rank and the tensor's name, and the next operation succeeds;
 *  - shutdown from one rank: the others' pending operations and later
 *    submissions fail with Horovod's shutdown text; destroy returns;
 *  - a rank that never submits a name: rank 0's stall warning in Horovod's
 *    words, then the timeout naming the rank and the tensor;
 *  - a rank killed mid-step: the others fail naming it, no hang;
 *  - the latency of a loop of tiny allreduces against dshim_allreduce
 *    (printed, not asserted).
 */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dshim.h"
#include "named.h"
#include "net.h"
#include "ranks.h"
#include "reduce/reduce.h"

#define MAX_N 4

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

/* Runs body on n ranks; returns whether every rank exited 0 (the stderr of
 * each printed if not), and the results. */
static int run_all(int n, test_rank_body_t body, void *arg, const char *extra1, const char *extra2,
                   test_rank_result_t *res)
{
    const char *env[] = {"DSHIM_TRANSPORT=shm", "DSHIM_TIMEOUT=30", extra1, extra2, NULL};
    int rc = test_run_ranks(n, body, arg, env, 60.0, res);
    int ok = rc == 0;
    for (int r = 0; r < n; r++) {
        ok = ok && res[r].exited && res[r].code == 0;
    }
    if (!ok) {
        dump(res, n);
    }
    return ok;
}

/* Runs body on n ranks and wants every rank to exit 0; returns the results. */
static void run_ok(int n, test_rank_body_t body, void *arg, const char *extra1, const char *extra2,
                   test_rank_result_t *res)
{
    ck_assert_msg(run_all(n, body, arg, extra1, extra2, res), "%d ranks: every rank must exit 0 (stderr above)", n);
}

/* The common start of a body: a communicator and an engine over it. */
static int start(int rank, int size, int port, dshim_comm_t **comm, dshim_named_t **eng)
{
    if (test_comm_init(rank, size, port, comm)) {
        return -1;
    }
    if (dshim_named_create(*comm, eng) != DSHIM_OK) {
        fprintf(stderr, "rank %d: dshim_named_create: %s\n", rank, dshim_last_error());
        dshim_comm_destroy(*comm);
        return -1;
    }
    return 0;
}

static dshim_named_desc_t desc_ar(const char *name, dshim_dtype_t dt, const void *send, void *recv, const int64_t *shape,
                                  int ndim, dshim_redop_t op)
{
    dshim_named_desc_t d = {.kind = DSHIM_NAMED_ALLREDUCE, .name = name, .dtype = dt, .ndim = ndim, .shape = shape,
                            .sendbuf = send, .recvbuf = recv, .op = op, .prescale = 1.0, .postscale = 1.0,
                            .device = -1};
    return d;
}

/* Submits and waits; the status, the message in err (may be NULL). */
static dshim_status_t run_one(dshim_named_t *eng, const dshim_named_desc_t *d, char *err, size_t len)
{
    dshim_named_op_t *op;
    dshim_status_t st = dshim_named_submit(eng, d, &op);
    if (st != DSHIM_OK) {
        if (err) {
            snprintf(err, len, "%s", dshim_last_error());
        }
        return st;
    }
    st = dshim_named_wait(op);
    if (err) {
        snprintf(err, len, "%s", dshim_named_error(op));
    }
    dshim_named_op_free(op);
    return st;
}

/* ---- allreduce: any order, two threads ------------------------------------ */

#define ORDER_NAMES 24
#define ORDER_LEN 37

typedef struct order_thread {
    dshim_named_t *eng;
    int rank, size, parity;
    float *in, *out; /* ORDER_NAMES * ORDER_LEN */
    int bad;
} order_thread_t;

static void *order_submitter(void *arg)
{
    order_thread_t *t = arg;
    dshim_named_op_t *ops[ORDER_NAMES] = {0};
    int64_t shape[1] = {ORDER_LEN};
    /* a rank-dependent permutation of this thread's names */
    for (int k = 0; k < ORDER_NAMES; k++) {
        int i = (k * 7 + t->rank * 5) % ORDER_NAMES;
        if (i % 2 != t->parity) {
            continue;
        }
        char name[32];
        snprintf(name, sizeof(name), "grad.%d", i);
        /* even names in place, odd ones into another buffer */
        float *src = i % 2 ? t->in + i * ORDER_LEN : t->out + i * ORDER_LEN;
        if (i % 2 == 0) {
            memcpy(src, t->in + i * ORDER_LEN, sizeof(float) * ORDER_LEN);
        }
        dshim_named_desc_t d = desc_ar(name, DSHIM_FLOAT32, src, t->out + i * ORDER_LEN, shape, 1, DSHIM_SUM);
        if (dshim_named_submit(t->eng, &d, &ops[i]) != DSHIM_OK) {
            fprintf(stderr, "submit %s: %s\n", name, dshim_last_error());
            t->bad = 1;
            return NULL;
        }
    }
    for (int i = 0; i < ORDER_NAMES; i++) {
        if (ops[i] && dshim_named_wait(ops[i]) != DSHIM_OK) {
            fprintf(stderr, "grad.%d: %s\n", i, dshim_named_error(ops[i]));
            t->bad = 1;
        }
        dshim_named_op_free(ops[i]);
    }
    return NULL;
}

static int body_orders(int rank, int size, int port, void *arg)
{
    (void)arg;
    dshim_comm_t *comm;
    dshim_named_t *eng;
    if (start(rank, size, port, &comm, &eng)) {
        return 2;
    }
    int rc = 0;
    float *in = malloc(sizeof(float) * ORDER_NAMES * ORDER_LEN);
    float *out = malloc(sizeof(float) * ORDER_NAMES * ORDER_LEN);
    for (int i = 0; i < ORDER_NAMES * ORDER_LEN; i++) {
        in[i] = (float)((i % 11) + rank * 100);
    }
    order_thread_t t[2];
    pthread_t th[2];
    for (int k = 0; k < 2; k++) {
        t[k] = (order_thread_t){eng, rank, size, k, in, out, 0};
        pthread_create(&th[k], NULL, order_submitter, &t[k]);
    }
    for (int k = 0; k < 2; k++) {
        pthread_join(th[k], NULL);
        if (t[k].bad) {
            FAIL("thread %d failed", k);
        }
    }
    for (int i = 0; i < ORDER_NAMES * ORDER_LEN; i++) {
        float want = (float)(size * (i % 11) + 100 * size * (size - 1) / 2);
        if (out[i] != want) {
            FAIL("element %d is %g, wanted %g", i, (double)out[i], (double)want);
        }
    }
out:
    free(in);
    free(out);
    dshim_named_destroy(eng);
    dshim_comm_destroy(comm);
    return rc;
}

START_TEST(test_allreduce_any_order)
{
    test_rank_result_t res[MAX_N];
    run_ok(3, body_orders, NULL, NULL, NULL, res);
}
END_TEST

/* ---- fusion ---------------------------------------------------------------- */

#define FUSE_NAMES 160

/* more than DSHIM_NAMED_INLINE bytes each: these go through collectives */
static size_t fuse_len(int i)
{
    return (size_t)(DSHIM_NAMED_INLINE / 4 + 1 + (i * 13) % 29);
}

/* integers of up to 2^20 as floats: any order of addition gives the same
 * sum, so every element must match the direct allreduce bit for bit and a
 * misplaced copy shows */
static float fuse_val(size_t k, int r)
{
    return (float)((k * 2654435761u + (size_t)r * 40503u) % 1048576u);
}

static int body_fusion(int rank, int size, int port, void *arg)
{
    const int *expect_fused = arg;
    dshim_comm_t *comm;
    dshim_named_t *eng;
    if (start(rank, size, port, &comm, &eng)) {
        return 2;
    }
    int rc = 0;
    size_t total = 0;
    for (int i = 0; i < FUSE_NAMES; i++) {
        total += fuse_len(i);
    }
    float *in = malloc(total * sizeof(float)), *out = malloc(total * sizeof(float));
    float *direct = malloc(total * sizeof(float));
    dshim_named_op_t *ops[FUSE_NAMES];
    for (size_t k = 0; k < total; k++) {
        in[k] = fuse_val(k, rank);
    }
    /* every rank has its data before any submits, so that the names are
     * ready together and fuse */
    dshim_barrier(comm);
    uint64_t before = __atomic_load_n(&eng->ncolls, __ATOMIC_RELAXED);
    size_t at = 0;
    for (int i = 0; i < FUSE_NAMES; i++) {
        char name[32];
        int64_t shape[1] = {(int64_t)fuse_len(i)};
        snprintf(name, sizeof(name), "fuse.%d", i);
        dshim_named_desc_t d = desc_ar(name, DSHIM_FLOAT32, in + at, out + at, shape, 1, DSHIM_SUM);
        if (dshim_named_submit(eng, &d, &ops[i]) != DSHIM_OK) {
            FAIL("submit %s: %s", name, dshim_last_error());
        }
        at += fuse_len(i);
    }
    for (int i = 0; i < FUSE_NAMES; i++) {
        if (dshim_named_wait(ops[i]) != DSHIM_OK) {
            FAIL("fuse.%d: %s", i, dshim_named_error(ops[i]));
        }
        dshim_named_op_free(ops[i]);
    }
    uint64_t colls = __atomic_load_n(&eng->ncolls, __ATOMIC_RELAXED) - before;
    /* the reference: the same buffer in one direct allreduce (what fusion
     * does), and each tensor alone close to it */
    if (dshim_allreduce(comm, in, direct, total, DSHIM_FLOAT32, DSHIM_SUM) != DSHIM_OK) {
        FAIL("direct allreduce: %s", dshim_last_error());
    }
    if (memcmp(direct, out, total * sizeof(float)) != 0) {
        FAIL("results differ from a direct dshim_allreduce of the same data");
    }
    if (*expect_fused) {
        if (colls >= FUSE_NAMES) {
            FAIL("%llu collectives for %d names: no fusion", (unsigned long long)colls, FUSE_NAMES);
        }
    } else if (colls != FUSE_NAMES) {
        FAIL("%llu collectives for %d names with fusion off", (unsigned long long)colls, FUSE_NAMES);
    }
    fprintf(stderr, "fusion: %d names in %llu collectives\n", FUSE_NAMES,
            (unsigned long long)colls);
out:
    free(in);
    free(out);
    free(direct);
    dshim_named_destroy(eng);
    dshim_comm_destroy(comm);
    return rc;
}

START_TEST(test_fusion)
{
    test_rank_result_t res[MAX_N];
    int fused = 1, unfused = 0;
    run_ok(4, body_fusion, &fused, NULL, NULL, res);
    run_ok(2, body_fusion, &unfused, "HOROVOD_FUSION_THRESHOLD=0", NULL, res);
}
END_TEST

/* ---- AVG, prescale, postscale ---------------------------------------------- */

/* n elements, the pattern of 4 repeated: 4 travel in the round (each rank
 * reduces the inputs itself), 100 through a collective */
static int body_scaling(int rank, int size, int port, void *arg)
{
    const int n = *(const int *)arg;
    dshim_comm_t *comm;
    dshim_named_t *eng;
    if (start(rank, size, port, &comm, &eng)) {
        return 2;
    }
    int rc = 0;
    char err[1024];
    int64_t shape[1] = {n};
    int32_t iv[100], io[100];
    float fv[100], fo[100];
    unsigned short hv[100], ho[100];
    int8_t bv[100], bo[100];
    /* int32 AVG over 2 ranks: sums 5, -5, 7, 1 -> 2, -2, 3, 0 (truncated) */
    const int32_t ipat[2][4] = {{2, -2, 3, 0}, {3, -3, 4, 1}}, iw[4] = {2, -2, 3, 0};
    for (int i = 0; i < n; i++) {
        iv[i] = ipat[rank][i % 4];
    }
    dshim_named_desc_t d = desc_ar("int.avg", DSHIM_INT32, iv, io, shape, 1, DSHIM_AVG);
    if (run_one(eng, &d, err, sizeof(err)) != DSHIM_OK) {
        FAIL("int.avg: %s", err);
    }
    for (int i = 0; i < n; i++) {
        if (io[i] != iw[i % 4]) {
            FAIL("int.avg[%d]: %d, wanted %d", i, io[i], iw[i % 4]);
        }
    }
    /* int32 prescale 0.5 (inputs truncated first: 3 -> 1, -3 -> -1), postscale 3 */
    const int32_t ppat[4] = {3, -3, 5, 10}, pw[4] = {6, -6, 12, 30};
    for (int i = 0; i < n; i++) {
        iv[i] = ppat[i % 4];
    }
    d = desc_ar("int.scale", DSHIM_INT32, iv, io, shape, 1, DSHIM_SUM);
    d.prescale = 0.5;
    d.postscale = 3.0;
    if (run_one(eng, &d, err, sizeof(err)) != DSHIM_OK) {
        FAIL("int.scale: %s", err);
    }
    for (int i = 0; i < n; i++) {
        if (io[i] != pw[i % 4]) {
            FAIL("int.scale[%d]: %d, wanted %d", i, io[i], pw[i % 4]);
        }
    }
    /* float32 AVG with postscale: (float)(post / size) times the sum */
    const float fpat[4] = {1.0f + rank, 0.1f, -3.0f, 1e-3f * (rank + 1)};
    const float fsum[4] = {1.0f + 2.0f, 0.1f + 0.1f, -6.0f, 1e-3f + 2e-3f};
    for (int i = 0; i < n; i++) {
        fv[i] = fpat[i % 4];
    }
    d = desc_ar("f32.avg", DSHIM_FLOAT32, fv, fo, shape, 1, DSHIM_AVG);
    d.postscale = 0.3;
    if (run_one(eng, &d, err, sizeof(err)) != DSHIM_OK) {
        FAIL("f32.avg: %s", err);
    }
    for (int i = 0; i < n; i++) {
        float want = (float)(0.3 / size) * fsum[i % 4];
        if (fo[i] != want) {
            FAIL("f32.avg[%d]: %.9g, wanted %.9g", i, (double)fo[i], (double)want);
        }
    }
    /* float16 with prescale and AVG: each step in float, rounded to half */
    const float hpat[4] = {1.5f, -2.25f, 1000.0f, 0.0999755859375f};
    for (int i = 0; i < n; i++) {
        hv[i] = dshim_float_to_half(hpat[i % 4]);
    }
    d = desc_ar("f16.avg", DSHIM_FLOAT16, hv, ho, shape, 1, DSHIM_AVG);
    d.prescale = 1.1;
    if (run_one(eng, &d, err, sizeof(err)) != DSHIM_OK) {
        FAIL("f16.avg: %s", err);
    }
    for (int i = 0; i < n; i++) {
        unsigned short pre = dshim_float_to_half((float)1.1 * dshim_half_to_float(hv[i]));
        unsigned short sum = dshim_float_to_half(dshim_half_to_float(pre) * 2.0f);
        unsigned short want = dshim_float_to_half((float)(1.0 / size) * dshim_half_to_float(sum));
        if (ho[i] != want) {
            FAIL("f16.avg[%d]: 0x%04x, wanted 0x%04x", i, ho[i], want);
        }
    }
    /* int8 max with postscale 2 (the factor applies to every op) */
    const int8_t bpat[4] = {(int8_t)(rank * 10), -5, 60, 1}, bw[4] = {20, -10, 120, 2};
    for (int i = 0; i < n; i++) {
        bv[i] = bpat[i % 4];
    }
    d = desc_ar("i8.max", DSHIM_INT8, bv, bo, shape, 1, DSHIM_MAX);
    d.postscale = 2.0;
    if (run_one(eng, &d, err, sizeof(err)) != DSHIM_OK) {
        FAIL("i8.max: %s", err);
    }
    for (int i = 0; i < n; i++) {
        if (bo[i] != bw[i % 4]) {
            FAIL("i8.max[%d]: %d, wanted %d", i, bo[i], bw[i % 4]);
        }
    }
out:
    dshim_named_destroy(eng);
    dshim_comm_destroy(comm);
    return rc;
}

START_TEST(test_scaling)
{
    test_rank_result_t res[MAX_N];
    int carried = 4, collective = 100;
    run_ok(2, body_scaling, &carried, NULL, NULL, res);
    run_ok(2, body_scaling, &collective, NULL, NULL, res);
}
END_TEST

/* ---- allgather, alltoall, reducescatter, broadcast, barrier ----------------- */

static int body_kinds(int rank, int size, int port, void *arg)
{
    (void)arg;
    dshim_comm_t *comm;
    dshim_named_t *eng;
    if (start(rank, size, port, &comm, &eng)) {
        return 2;
    }
    int rc = 0;
    char err[1024];
    dshim_named_op_t *op = NULL;
    void *data;
    size_t bytes;
    int64_t dim0, rs[MAX_N];

    /* allgather: rank r sends r+1 rows of 3 */
    int32_t ag[MAX_N * 3];
    int64_t ags[2] = {rank + 1, 3};
    for (int i = 0; i < (rank + 1) * 3; i++) {
        ag[i] = rank * 100 + i;
    }
    dshim_named_desc_t d = {.kind = DSHIM_NAMED_ALLGATHER, .name = "ag", .dtype = DSHIM_INT32, .ndim = 2,
                            .shape = ags, .sendbuf = ag, .device = -1};
    if (dshim_named_submit(eng, &d, &op) != DSHIM_OK || dshim_named_wait(op) != DSHIM_OK) {
        FAIL("allgather: %s", op ? dshim_named_error(op) : dshim_last_error());
    }
    dshim_named_result(op, &data, &bytes, &dim0, NULL, 0);
    if (dim0 != size * (size + 1) / 2 || bytes != (size_t)dim0 * 3 * 4) {
        FAIL("allgather: dim0 %lld, %zu bytes", (long long)dim0, bytes);
    }
    for (int r = 0, k = 0; r < size; r++) {
        for (int i = 0; i < (r + 1) * 3; i++, k++) {
            if (((int32_t *)data)[k] != r * 100 + i) {
                FAIL("allgather: element %d is %d", k, ((int32_t *)data)[k]);
            }
        }
    }
    dshim_named_op_free(op);
    op = NULL;

    /* alltoall, even: 2 rows of 2 to each rank */
    int64_t a2s[2] = {2 * size, 2};
    float a2[MAX_N * 4];
    for (int i = 0; i < size * 4; i++) {
        a2[i] = (float)(rank * 1000 + i);
    }
    d = (dshim_named_desc_t){.kind = DSHIM_NAMED_ALLTOALL, .name = "a2a", .dtype = DSHIM_FLOAT32, .ndim = 2,
                             .shape = a2s, .sendbuf = a2, .device = -1};
    if (dshim_named_submit(eng, &d, &op) != DSHIM_OK || dshim_named_wait(op) != DSHIM_OK) {
        FAIL("alltoall: %s", op ? dshim_named_error(op) : dshim_last_error());
    }
    dshim_named_result(op, &data, &bytes, &dim0, rs, MAX_N);
    if (dim0 != 2 * size) {
        FAIL("alltoall: dim0 %lld", (long long)dim0);
    }
    for (int r = 0; r < size; r++) {
        if (rs[r] != 2) {
            FAIL("alltoall: %lld rows from rank %d", (long long)rs[r], r);
        }
        for (int i = 0; i < 4; i++) {
            if (((float *)data)[r * 4 + i] != (float)(r * 1000 + rank * 4 + i)) {
                FAIL("alltoall: from rank %d element %d is %g", r, i, (double)((float *)data)[r * 4 + i]);
            }
        }
    }
    dshim_named_op_free(op);
    op = NULL;

    /* alltoall with splits: rank r sends (j + r) % 3 rows of 1 to rank j */
    int64_t sp[MAX_N], total = 0;
    for (int j = 0; j < size; j++) {
        sp[j] = (j + rank) % 3;
        total += sp[j];
    }
    int64_t a3s[1] = {total + 1}; /* one row more than the splits: allowed, not sent */
    int64_t a3[16];
    for (int64_t i = 0, k = 0; i < size; i++) {
        for (int64_t x = 0; x < sp[i]; x++, k++) {
            a3[k] = rank * 100 + i * 10 + x;
        }
    }
    d = (dshim_named_desc_t){.kind = DSHIM_NAMED_ALLTOALL, .name = "a2av", .dtype = DSHIM_INT64, .ndim = 1,
                             .shape = a3s, .sendbuf = a3, .splits = sp, .device = -1};
    if (dshim_named_submit(eng, &d, &op) != DSHIM_OK || dshim_named_wait(op) != DSHIM_OK) {
        FAIL("alltoallv: %s", op ? dshim_named_error(op) : dshim_last_error());
    }
    dshim_named_result(op, &data, &bytes, &dim0, rs, MAX_N);
    for (int r = 0, k = 0; r < size; r++) {
        if (rs[r] != (rank + r) % 3) {
            FAIL("alltoallv: %lld rows from rank %d", (long long)rs[r], r);
        }
        for (int x = 0; x < rs[r]; x++, k++) {
            if (((int64_t *)data)[k] != r * 100 + rank * 10 + x) {
                FAIL("alltoallv: element %d is %lld", k, (long long)((int64_t *)data)[k]);
            }
        }
    }
    dshim_named_op_free(op);
    op = NULL;

    /* reducescatter of 7 rows of 2 (3 ranks: 3, 2, 2 rows), SUM then AVG */
    int64_t rss[2] = {7, 2};
    float rsv[14];
    for (int i = 0; i < 14; i++) {
        rsv[i] = (float)(i + rank);
    }
    for (int avg = 0; avg < 2; avg++) {
        d = (dshim_named_desc_t){.kind = DSHIM_NAMED_REDUCESCATTER, .name = avg ? "rs.avg" : "rs.sum",
                                 .dtype = DSHIM_FLOAT32, .ndim = 2, .shape = rss, .sendbuf = rsv,
                                 .op = avg ? DSHIM_AVG : DSHIM_SUM, .prescale = 1.0, .postscale = 1.0, .device = -1};
        if (dshim_named_submit(eng, &d, &op) != DSHIM_OK || dshim_named_wait(op) != DSHIM_OK) {
            FAIL("reducescatter: %s", op ? dshim_named_error(op) : dshim_last_error());
        }
        dshim_named_result(op, &data, &bytes, &dim0, NULL, 0);
        int64_t rows = 7 / size + (rank < 7 % size), first = 0;
        for (int r = 0; r < rank; r++) {
            first += 7 / size + (r < 7 % size);
        }
        if (dim0 != rows || bytes != (size_t)rows * 2 * 4) {
            FAIL("reducescatter: dim0 %lld (wanted %lld), %zu bytes", (long long)dim0, (long long)rows, bytes);
        }
        for (int i = 0; i < rows * 2; i++) {
            float sum = (float)(size * (first * 2 + i) + size * (size - 1) / 2);
            float want = avg ? (float)(1.0 / size) * sum : sum;
            if (((float *)data)[i] != want) {
                FAIL("reducescatter: element %d is %g, wanted %g", i, (double)((float *)data)[i], (double)want);
            }
        }
        dshim_named_op_free(op);
        op = NULL;
    }

    /* broadcast from each root */
    for (int root = 0; root < size; root++) {
        int64_t bs[1] = {5};
        double bv[5];
        for (int i = 0; i < 5; i++) {
            bv[i] = rank == root ? root * 10.0 + i : -1;
        }
        char name[16];
        snprintf(name, sizeof(name), "bc.%d", root);
        d = (dshim_named_desc_t){.kind = DSHIM_NAMED_BROADCAST, .name = name, .dtype = DSHIM_FLOAT64, .ndim = 1,
                                 .shape = bs, .recvbuf = bv, .root = root, .device = -1};
        if (run_one(eng, &d, err, sizeof(err)) != DSHIM_OK) {
            FAIL("broadcast from %d: %s", root, err);
        }
        for (int i = 0; i < 5; i++) {
            if (bv[i] != root * 10.0 + i) {
                FAIL("broadcast from %d: element %d is %g", root, i, bv[i]);
            }
        }
    }

    /* barrier: nobody leaves before the last rank arrives */
    double t0 = dshim_now();
    if (rank == size - 1) {
        sleep_s(0.4);
    }
    d = (dshim_named_desc_t){.kind = DSHIM_NAMED_BARRIER};
    if (run_one(eng, &d, err, sizeof(err)) != DSHIM_OK) {
        FAIL("barrier: %s", err);
    }
    if (dshim_now() - t0 < 0.35) {
        FAIL("left the barrier after %.3f s, before the last rank arrived", dshim_now() - t0);
    }
out:
    dshim_named_op_free(op);
    dshim_named_destroy(eng);
    dshim_comm_destroy(comm);
    return rc;
}

START_TEST(test_kinds)
{
    test_rank_result_t res[MAX_N];
    run_ok(3, body_kinds, NULL, NULL, NULL, res);
    run_ok(2, body_kinds, NULL, NULL, NULL, res);
}
END_TEST

/* ---- join -------------------------------------------------------------------- */

static int body_join(int rank, int size, int port, void *arg)
{
    (void)arg;
    dshim_comm_t *comm;
    dshim_named_t *eng;
    if (start(rank, size, port, &comm, &eng)) {
        return 2;
    }
    int rc = 0;
    char err[1024];
    dshim_named_op_t *join = NULL;
    dshim_named_desc_t jd = {.kind = DSHIM_NAMED_JOIN};
    int64_t shape[1] = {3};
    if (rank == size - 1) {
        /* joins at once: counts as having submitted every allreduce */
        if (dshim_named_submit(eng, &jd, &join) != DSHIM_OK) {
            FAIL("join: %s", dshim_last_error());
        }
    } else {
        float v[3] = {1.0f + rank, 2.0f, 3.0f}, o[3];
        dshim_named_desc_t d = desc_ar("j.x", DSHIM_FLOAT32, v, o, shape, 1, DSHIM_SUM);
        /* make sure the join arrived first */
        sleep_s(0.2);
        if (run_one(eng, &d, err, sizeof(err)) != DSHIM_OK) {
            FAIL("allreduce with a joined rank: %s", err);
        }
        float sum0 = 0;
        for (int r = 0; r < size - 1; r++) {
            sum0 += 1.0f + r;
        }
        if (o[0] != sum0 || o[1] != 2.0f * (size - 1) || o[2] != 3.0f * (size - 1)) {
            FAIL("allreduce with a joined rank: %g %g %g", (double)o[0], (double)o[1], (double)o[2]);
        }
        /* and one through a collective, the joined rank's zeros sent */
        float big[1000], bo[1000];
        int64_t bs[1] = {1000};
        for (int i = 0; i < 1000; i++) {
            big[i] = (float)(i + rank);
        }
        d = desc_ar("j.big", DSHIM_FLOAT32, big, bo, bs, 1, DSHIM_AVG);
        if (run_one(eng, &d, err, sizeof(err)) != DSHIM_OK) {
            FAIL("large allreduce with a joined rank: %s", err);
        }
        for (int i = 0; i < 1000; i++) {
            float want = (float)(1.0 / size) * (float)((size - 1) * i + (size - 1) * (size - 2) / 2);
            if (bo[i] != want) {
                FAIL("large allreduce with a joined rank: element %d is %g, wanted %g", i, (double)bo[i],
                     (double)want);
            }
        }
        /* an allgather is refused while a rank has joined (Horovod's text) */
        int64_t gs[1] = {1};
        dshim_named_desc_t g = {.kind = DSHIM_NAMED_ALLGATHER, .name = "j.ag", .dtype = DSHIM_FLOAT32, .ndim = 1,
                                .shape = gs, .sendbuf = v, .device = -1};
        dshim_named_op_t *op;
        if (dshim_named_submit(eng, &g, &op) != DSHIM_OK) {
            FAIL("allgather submit: %s", dshim_last_error());
        }
        dshim_named_wait(op);
        if (!strstr(dshim_named_error(op), "Allgather is not supported with Join at this time.")) {
            FAIL("allgather with a joined rank: '%s'", dshim_named_error(op));
        }
        dshim_named_op_free(op);
        /* rank size-2 joins last */
        if (rank == size - 2) {
            sleep_s(0.3);
        }
        if (dshim_named_submit(eng, &jd, &join) != DSHIM_OK) {
            FAIL("join: %s", dshim_last_error());
        }
    }
    if (dshim_named_wait(join) != DSHIM_OK) {
        FAIL("join: %s", dshim_named_error(join));
    }
    if (dshim_named_join_rank(join) != size - 2) {
        FAIL("join: last joined rank %d, wanted %d", dshim_named_join_rank(join), size - 2);
    }
    /* after the join every rank takes part again */
    float v[3] = {1, 1, 1}, o[3];
    dshim_named_desc_t d = desc_ar("j.after", DSHIM_FLOAT32, v, o, shape, 1, DSHIM_SUM);
    if (run_one(eng, &d, err, sizeof(err)) != DSHIM_OK || o[0] != (float)size) {
        FAIL("allreduce after the join: %s (%g)", err, (double)o[0]);
    }
out:
    dshim_named_op_free(join);
    dshim_named_destroy(eng);
    dshim_comm_destroy(comm);
    return rc;
}

START_TEST(test_join)
{
    test_rank_result_t res[MAX_N];
    run_ok(3, body_join, NULL, NULL, NULL, res);
}
END_TEST

/* ---- join as Horovod's own tests use it ------------------------------------------ */

/* Every rank's v gathered under one name (allgather_object's role): 0 when
 * every rank sent this rank's v. */
static int gather_same(dshim_named_t *eng, const char *name, int32_t v, int size, char *err, size_t len)
{
    int64_t s[1] = {1};
    dshim_named_desc_t g = {.kind = DSHIM_NAMED_ALLGATHER, .name = name, .dtype = DSHIM_INT32, .ndim = 1,
                            .shape = s, .sendbuf = &v, .device = -1};
    dshim_named_op_t *op;
    if (dshim_named_submit(eng, &g, &op) != DSHIM_OK) {
        snprintf(err, len, "submit: %s", dshim_last_error());
        return -1;
    }
    int bad = 0;
    void *data = NULL;
    size_t bytes = 0;
    if (dshim_named_wait(op) != DSHIM_OK ||
        dshim_named_result(op, &data, &bytes, NULL, NULL, 0) != DSHIM_OK || bytes != sizeof(int32_t) * (size_t)size) {
        snprintf(err, len, "%s", dshim_named_error(op));
        bad = -1;
    } else {
        for (int r = 0; r < size; r++) {
            if (((int32_t *)data)[r] != v) {
                snprintf(err, len, "rank %d has %d, this rank %d", r, ((int32_t *)data)[r], v);
                bad = -1;
            }
        }
    }
    dshim_named_op_free(op);
    return bad;
}

/* Horovod's int32 AVG: the sum times (double)(1/size), truncated */
static int32_t hvd_avg_i32(int64_t sum, int size)
{
    return (int32_t)((1.0 / size) * (double)sum);
}

#define JA 5         /* tensor_a: carried by the round (20 bytes) */
#define JB (17 * 17) /* tensor_b: through a collective (1156 bytes) */

/* test_horovod_join_allreduce, test_horovod_join_allgather and
 * test_horovod_join_broadcast as the upstream file runs them: for each first
 * rank to join (and for the allreduce with and without a first round where
 * everyone submits the names), the others submit and then join; every rank
 * gets the same last joined rank, never the first one, and gathers it. */
static int body_join_upstream(int rank, int size, int port, void *arg)
{
    (void)arg;
    dshim_comm_t *comm;
    dshim_named_t *eng;
    if (start(rank, size, port, &comm, &eng)) {
        return 2;
    }
    int rc = 0;
    char err[1024];
    int32_t a[JA], b[JB], ra[JA], rb[JB];
    int64_t as[1] = {JA}, bs[2] = {17, 17};
    for (int i = 0; i < JA; i++) {
        a[i] = (i * 37) % 200 - 100; /* as torch's random_(-100, 100), the same on every rank */
    }
    for (int i = 0; i < JB; i++) {
        b[i] = (i * 53) % 200 - 100;
    }
    dshim_named_desc_t da = desc_ar("allreduce.tensor_a", DSHIM_INT32, a, ra, as, 1, DSHIM_AVG);
    dshim_named_desc_t db = desc_ar("allreduce.tensor_b", DSHIM_INT32, b, rb, bs, 2, DSHIM_AVG);
    dshim_named_desc_t jd = {.kind = DSHIM_NAMED_JOIN};
    for (int kind = 0; kind < 3; kind++) { /* allreduce, allgather, broadcast */
        for (int fj = 0; fj < size; fj++) {
            for (int caching = 0; caching < (kind == 0 ? 2 : 1); caching++) {
                dshim_named_op_t *oa = NULL, *ob = NULL, *join = NULL;
                /* vary who arrives first: the join before, with or after the others' requests */
                double delay = 0.002 * (double)((rank + fj + caching) % 3);
                if (caching) {
                    if (dshim_named_submit(eng, &da, &oa) != DSHIM_OK || dshim_named_submit(eng, &db, &ob) != DSHIM_OK ||
                        dshim_named_wait(oa) != DSHIM_OK || dshim_named_wait(ob) != DSHIM_OK) {
                        FAIL("fj %d: allreduce before the join: %s", fj, oa ? dshim_named_error(oa) : "");
                    }
                    dshim_named_op_free(oa);
                    dshim_named_op_free(ob);
                    oa = ob = NULL;
                    for (int i = 0; i < JA; i++) {
                        if (ra[i] != hvd_avg_i32((int64_t)size * a[i], size)) {
                            FAIL("fj %d: allreduce before the join: element %d is %d", fj, i, ra[i]);
                        }
                    }
                }
                sleep_s(delay);
                if (rank != fj && kind == 0) {
                    if (dshim_named_submit(eng, &da, &oa) != DSHIM_OK || dshim_named_submit(eng, &db, &ob) != DSHIM_OK) {
                        FAIL("fj %d: submit: %s", fj, dshim_last_error());
                    }
                    int sa = dshim_named_wait(oa), sb = dshim_named_wait(ob);
                    if (sa != DSHIM_OK || sb != DSHIM_OK) {
                        FAIL("fj %d caching %d: allreduce with a joined rank: %s %s", fj, caching, dshim_named_error(oa),
                             dshim_named_error(ob));
                    }
                    dshim_named_op_free(oa);
                    dshim_named_op_free(ob);
                    oa = ob = NULL;
                    /* AVG divides by the whole size, the joined rank's zeros included */
                    for (int i = 0; i < JA; i++) {
                        if (ra[i] != hvd_avg_i32((int64_t)(size - 1) * a[i], size)) {
                            FAIL("fj %d caching %d: tensor_a element %d is %d, wanted %d", fj, caching, i, ra[i],
                                 hvd_avg_i32((int64_t)(size - 1) * a[i], size));
                        }
                    }
                    for (int i = 0; i < JB; i++) {
                        if (rb[i] != hvd_avg_i32((int64_t)(size - 1) * b[i], size)) {
                            FAIL("fj %d caching %d: tensor_b element %d is %d, wanted %d", fj, caching, i, rb[i],
                                 hvd_avg_i32((int64_t)(size - 1) * b[i], size));
                        }
                    }
                } else if (rank != fj) {
                    /* refused while a rank has joined, on every rank that asked, in Horovod's words */
                    int64_t gs[3] = {17, 17, 17};
                    float t[17 * 17 * 17] = {0};
                    dshim_named_desc_t d = {.kind = kind == 1 ? DSHIM_NAMED_ALLGATHER : DSHIM_NAMED_BROADCAST,
                                            .name = kind == 1 ? "allgather.noname.1" : "broadcast.test_horovod_join_broadcast",
                                            .dtype = DSHIM_FLOAT32, .ndim = 3, .shape = gs, .sendbuf = t,
                                            .recvbuf = kind == 1 ? NULL : t, .root = rank, .device = -1};
                    const char *want = kind == 1 ? "Allgather is not supported with Join at this time."
                                                 : "Broadcast is not supported with Join at this time.";
                    if (run_one(eng, &d, err, sizeof(err)) == DSHIM_OK || !strstr(err, want)) {
                        FAIL("fj %d: %s with a joined rank: '%s'", fj, kind == 1 ? "allgather" : "broadcast", err);
                    }
                }
                if (dshim_named_submit(eng, &jd, &join) != DSHIM_OK || dshim_named_wait(join) != DSHIM_OK) {
                    FAIL("fj %d: join: %s", fj, join ? dshim_named_error(join) : dshim_last_error());
                }
                int ret = dshim_named_join_rank(join);
                dshim_named_op_free(join);
                if (ret == fj || ret < 0 || ret >= size) {
                    FAIL("fj %d kind %d: join returned %d", fj, kind, ret);
                }
                if (gather_same(eng, "allgather.int.sz", ret, size, err, sizeof(err))) {
                    FAIL("fj %d kind %d: join's rank differs between ranks: %s", fj, kind, err);
                }
            }
        }
    }
out:
    dshim_named_destroy(eng);
    dshim_comm_destroy(comm);
    return rc;
}

START_TEST(test_join_upstream)
{
    test_rank_result_t res[MAX_N];
    run_ok(3, body_join_upstream, NULL, NULL, NULL, res);
    run_ok(2, body_join_upstream, NULL, NULL, NULL, res);
    run_ok(4, body_join_upstream, NULL, NULL, NULL, res);
}
END_TEST

/* ---- duplicate name -------------------------------------------------------------- */

static int body_duplicate(int rank, int size, int port, void *arg)
{
    (void)arg;
    dshim_comm_t *comm;
    dshim_named_t *eng;
    if (start(rank, size, port, &comm, &eng)) {
        return 2;
    }
    int rc = 0;
    float v[2] = {1, 2}, o[2], o2[2];
    int64_t shape[1] = {2};
    dshim_named_op_t *a = NULL, *b = NULL;
    dshim_named_desc_t d = desc_ar("dup", DSHIM_FLOAT32, v, o, shape, 1, DSHIM_SUM);
    if (rank == 0) {
        sleep_s(0.2); /* "dup" stays pending on rank 1 meanwhile */
    }
    if (dshim_named_submit(eng, &d, &a) != DSHIM_OK) {
        FAIL("first submit: %s", dshim_last_error());
    }
    if (rank == 1) {
        d.recvbuf = o2;
        dshim_status_t st = dshim_named_submit(eng, &d, &b);
        if (st != DSHIM_ERR_INVALID || b ||
            !strstr(dshim_last_error(), "Requested to allreduce, allgather, or broadcast a tensor with the same name "
                                        "as another tensor that is currently being processed.  If you want to "
                                        "request another tensor, use a different tensor name.") ||
            !strstr(dshim_last_error(), "'dup'")) {
            FAIL("second submit: status %d, '%s'", (int)st, dshim_last_error());
        }
        /* barrier and join names are fixed: two barriers are duplicates too */
        dshim_named_desc_t bd = {.kind = DSHIM_NAMED_BARRIER};
        dshim_named_op_t *b1 = NULL, *b2 = NULL;
        if (dshim_named_submit(eng, &bd, &b1) != DSHIM_OK) {
            FAIL("barrier: %s", dshim_last_error());
        }
        st = dshim_named_submit(eng, &bd, &b2);
        if (st != DSHIM_ERR_INVALID || !strstr(dshim_last_error(), "same name")) {
            FAIL("second barrier: status %d, '%s'", (int)st, dshim_last_error());
        }
        b = b1;
    } else {
        dshim_named_desc_t bd = {.kind = DSHIM_NAMED_BARRIER};
        if (dshim_named_submit(eng, &bd, &b) != DSHIM_OK) {
            FAIL("barrier: %s", dshim_last_error());
        }
    }
    if (dshim_named_wait(a) != DSHIM_OK || o[0] != 2 || dshim_named_wait(b) != DSHIM_OK) {
        FAIL("first op: %s", dshim_named_error(a));
    }
    /* completed: the name is free again */
    char err[512];
    d.recvbuf = o;
    if (run_one(eng, &d, err, sizeof(err)) != DSHIM_OK) {
        FAIL("the name again: %s", err);
    }
out:
    dshim_named_op_free(a);
    dshim_named_op_free(b);
    dshim_named_destroy(eng);
    dshim_comm_destroy(comm);
    return rc;
}

START_TEST(test_duplicate_name)
{
    test_rank_result_t res[MAX_N];
    run_ok(2, body_duplicate, NULL, NULL, NULL, res);
}
END_TEST

/* ---- mismatches ------------------------------------------------------------------- */

typedef struct mismatch {
    const char *what;
    const char *text;   /* Horovod's sentence */
    const char *values; /* what the message lists per rank */
} mismatch_t;

static const mismatch_t MISMATCHES[] = {
    {"dtype", "Mismatched data types: One rank had type float32, but another rank had type int32.",
     "(tensor 'mm.dtype': rank 0 float32, rank 1 int32"},
    {"kind", "Mismatched operations: One rank did an ALLREDUCE, but another rank did an BROADCAST.",
     "(tensor 'mm.kind': rank 0 ALLREDUCE, rank 1 BROADCAST"},
    {"shape", "Mismatched ALLREDUCE tensor shapes: One rank sent a tensor of shape [17], but another rank sent a "
              "tensor of shape [18].", "(tensor 'mm.shape': rank 0 [17], rank 1 [18]"},
    {"scale", "Mismatched prescale and/or postscale factors: One rank sent factors (1, 0.5), but another rank sent "
              "factors (2, 0.5).", "(tensor 'mm.scale': rank 0 (1, 0.5), rank 1 (2, 0.5)"},
    {"op", "Mismatched reduction operation: One rank sent reduction op 1, but another rank sent reduction op 4.",
     "(tensor 'mm.op': rank 0 sum, rank 1 max"},
    {"root", "Mismatched BROADCAST root ranks: One rank specified root rank 0, but another rank specified root rank "
             "1.", "(tensor 'mm.root': rank 0 root 0, rank 1 root 1"},
    {"device", "Mismatched ALLREDUCE CPU/GPU device selection: One rank specified device CPU, but another rank "
               "specified device GPU.", "(tensor 'mm.device': rank 0 CPU, rank 1 GPU 0"},
    {"agdim", "Mismatched ALLGATHER tensor shapes: One rank sent a tensor with dimension 1 equal to 17, but another "
              "rank sent a tensor with dimension 1 equal to 18.", "(tensor 'mm.agdim': rank 0 [2, 17], rank 1 [1, 18]"},
};

static int body_mismatch(int rank, int size, int port, void *arg)
{
    (void)arg;
    dshim_comm_t *comm;
    dshim_named_t *eng;
    if (start(rank, size, port, &comm, &eng)) {
        return 2;
    }
    int rc = 0;
    char err[2048];
    float buf[64] = {0};
    for (size_t m = 0; m < sizeof(MISMATCHES) / sizeof(MISMATCHES[0]); m++) {
        const mismatch_t *mm = &MISMATCHES[m];
        char name[32];
        snprintf(name, sizeof(name), "mm.%s", mm->what);
        int64_t shape[2] = {17, 1};
        dshim_named_desc_t d = desc_ar(name, DSHIM_FLOAT32, buf, buf, shape, 1, DSHIM_SUM);
        if (rank == 1) {
            if (!strcmp(mm->what, "dtype")) {
                d.dtype = DSHIM_INT32;
            } else if (!strcmp(mm->what, "kind")) {
                d.kind = DSHIM_NAMED_BROADCAST;
            } else if (!strcmp(mm->what, "shape")) {
                shape[0] = 18;
            } else if (!strcmp(mm->what, "scale")) {
                d.prescale = 2.0;
            } else if (!strcmp(mm->what, "op")) {
                d.op = DSHIM_MAX;
            } else if (!strcmp(mm->what, "root")) {
                d.root = 1;
            } else if (!strcmp(mm->what, "device")) {
                d.device = 0;
            }
        }
        if (!strcmp(mm->what, "scale")) {
            d.postscale = 0.5;
        }
        if (!strcmp(mm->what, "root")) {
            d.kind = DSHIM_NAMED_BROADCAST;
        }
        if (!strcmp(mm->what, "agdim")) {
            d.kind = DSHIM_NAMED_ALLGATHER;
            d.recvbuf = NULL;
            d.ndim = 2;
            shape[0] = rank == 0 ? 2 : 1;
            shape[1] = rank == 0 ? 17 : 18;
        }
        dshim_status_t st = run_one(eng, &d, err, sizeof(err));
        if (st != DSHIM_ERR_MISMATCH || !strstr(err, mm->text) || !strstr(err, mm->values)) {
            FAIL("%s: status %d, '%s'; wanted '%s' and '%s'", mm->what, (int)st, err, mm->text, mm->values);
        }
        /* the engine goes on */
        float one = 1, sum;
        int64_t s1[1] = {1};
        dshim_named_desc_t ok = desc_ar("mm.next", DSHIM_FLOAT32, &one, &sum, s1, 1, DSHIM_SUM);
        if (run_one(eng, &ok, err, sizeof(err)) != DSHIM_OK || sum != (float)size) {
            FAIL("after the %s mismatch: %s", mm->what, err);
        }
    }
out:
    dshim_named_destroy(eng);
    dshim_comm_destroy(comm);
    return rc;
}

START_TEST(test_mismatches)
{
    test_rank_result_t res[MAX_N];
    run_ok(2, body_mismatch, NULL, NULL, NULL, res);
}
END_TEST

/* ---- refusals at submission (Horovod's enqueue-time texts) and at negotiation ---------- */

static int want_status(dshim_named_t *eng, const dshim_named_desc_t *d, dshim_named_op_t **opp, dshim_status_t want,
                       const char *text)
{
    *opp = NULL;
    dshim_status_t st = dshim_named_submit(eng, d, opp);
    if (st != want || *opp || (text && !strstr(dshim_last_error(), text))) {
        fprintf(stderr, "ERROR: status %d, '%s': wanted %d and '%s'\n", (int)st, dshim_last_error(), (int)want,
                text ? text : "");
        return -1;
    }
    return 0;
}

static int want_refusal(dshim_named_t *eng, const dshim_named_desc_t *d, dshim_named_op_t **opp, const char *text)
{
    return want_status(eng, d, opp, DSHIM_ERR_INVALID, text);
}

static int body_arguments(int rank, int size, int port, void *arg)
{
    (void)arg;
    dshim_comm_t *comm;
    dshim_named_t *eng;
    if (start(rank, size, port, &comm, &eng)) {
        return 2;
    }
    int rc = 0;
    char err[1024];
    float v[8] = {0}, o[8];
    int64_t shape[1] = {3}, splits[2] = {2, 2};
    dshim_named_op_t *op = NULL;
    dshim_named_desc_t d = desc_ar("arg", DSHIM_FLOAT32, v, o, shape, 1, DSHIM_SUM);
    if (dshim_named_submit(eng, NULL, &op) != DSHIM_ERR_INVALID || dshim_named_submit(eng, &d, NULL) != DSHIM_ERR_INVALID) {
        FAIL("a NULL desc or op_p must give DSHIM_ERR_INVALID");
    }
    d.kind = DSHIM_NAMED_KIND_COUNT;
    if (want_refusal(eng, &d, &op, "unknown kind")) {
        FAIL("kind");
    }
    d = desc_ar(NULL, DSHIM_FLOAT32, v, o, shape, 1, DSHIM_SUM);
    if (want_refusal(eng, &d, &op, "the name is NULL")) {
        FAIL("name");
    }
    d = (dshim_named_desc_t){.kind = DSHIM_NAMED_ALLTOALL, .name = "a2a", .dtype = DSHIM_FLOAT32, .ndim = 1,
                             .shape = shape, .sendbuf = v, .device = -1};
    if (want_refusal(eng, &d, &op, "splits not provided, but first dimension of tensor is not an even multiple of "
                                   "the number of workers.")) {
        FAIL("alltoall even split");
    }
    d.splits = splits;
    if (want_refusal(eng, &d, &op, "Sum of splits entries is greater than the first dimension of tensor.")) {
        FAIL("alltoall splits");
    }
    d = desc_ar("rs", DSHIM_FLOAT32, v, NULL, shape, 1, DSHIM_MAX);
    d.kind = DSHIM_NAMED_REDUCESCATTER;
    if (want_status(eng, &d, &op, DSHIM_ERR_UNSUPPORTED, "Reducescatter currently only supports AVERAGE and SUM.")) {
        FAIL("reducescatter op");
    }
    d = (dshim_named_desc_t){.kind = DSHIM_NAMED_BROADCAST, .name = "bc", .dtype = DSHIM_FLOAT32, .ndim = 1,
                             .shape = shape, .recvbuf = v, .root = 5, .device = -1};
    if (want_refusal(eng, &d, &op, "broadcast received invalid root rank 5 for provided process set")) {
        FAIL("broadcast root");
    }
    /* refused at negotiation, on every rank */
    d = (dshim_named_desc_t){.kind = DSHIM_NAMED_ALLGATHER, .name = "ag0", .dtype = DSHIM_FLOAT32, .ndim = 0,
                             .sendbuf = v, .device = -1};
    if (run_one(eng, &d, err, sizeof(err)) != DSHIM_ERR_INVALID ||
        !strstr(err, "Process-set rank zero tried to ALLGATHER a rank-zero tensor.")) {
        FAIL("allgather of a scalar: '%s'", err);
    }
    /* an allreduce has no engine-owned result */
    d = desc_ar("arg", DSHIM_FLOAT32, v, o, shape, 1, DSHIM_SUM);
    if (dshim_named_submit(eng, &d, &op) != DSHIM_OK || dshim_named_wait(op) != DSHIM_OK) {
        FAIL("allreduce: %s", dshim_last_error());
    }
    if (dshim_named_result(op, NULL, NULL, NULL, NULL, 0) != DSHIM_ERR_INVALID || dshim_named_join_rank(op) != -1) {
        FAIL("an allreduce's result must be refused");
    }
out:
    dshim_named_op_free(op);
    dshim_named_destroy(eng);
    dshim_comm_destroy(comm);
    return rc;
}

START_TEST(test_arguments)
{
    test_rank_result_t res[MAX_N];
    run_ok(2, body_arguments, NULL, NULL, NULL, res);
}
END_TEST

/* ---- Horovod's timeline ------------------------------------------------------------------ */

static int occurrences(const char *text, const char *what)
{
    int n = 0;
    for (const char *at = strstr(text, what); at; at = strstr(at + 1, what)) {
        n++;
    }
    return n;
}

/* Two allreduces, each with its NEGOTIATE span, both ranks' instants and
 * its execution in rank 0's file.  The first is rank 1's before rank 0 has
 * opened the file (as when rank 1 submits while rank 0 is still in
 * hvd.init opening HOROVOD_TIMELINE: the span begins when rank 0's engine
 * next sees the name, with rank 1's instant); rank 1 waits for it, so its
 * second comes after the open (the span from its first request). */
static int body_timeline(int rank, int size, int port, void *arg)
{
    const char *path = arg;
    dshim_comm_t *comm;
    dshim_named_t *eng;
    if (start(rank, size, port, &comm, &eng)) {
        return 2;
    }
    int rc = 0;
    char err[512], *text = NULL;
    float v[100] = {0}, o[100];
    int64_t shape[1] = {100};
    if (rank == 0) {
        sleep_s(0.3); /* rank 1's request is in rank 0's table by then (a round every few ms) */
    }
    if (dshim_named_timeline(eng, path, 1) != DSHIM_OK) {
        FAIL("start: %s", dshim_last_error());
    }
    const char *names[] = {"allreduce.test \"tl\"", "tl.second"};
    for (int k = 0; k < 2; k++) {
        dshim_named_desc_t d = desc_ar(names[k], DSHIM_FLOAT32, v, o, shape, 1, DSHIM_SUM);
        if (run_one(eng, &d, err, sizeof(err)) != DSHIM_OK) {
            FAIL("allreduce %d: %s", k, err);
        }
    }
    if (dshim_named_timeline(eng, NULL, 0) != DSHIM_OK) {
        FAIL("stop: %s", dshim_last_error());
    }
    if (rank == 0) {
        FILE *f = fopen(path, "r");
        text = calloc(1, 1 << 20);
        size_t n = f ? fread(text, 1, (1 << 20) - 1, f) : 0;
        if (f) {
            fclose(f);
        }
        const char *want[] = {"\"start_time_since_epoch_in_micros\":", "\"args\": {\"name\": \"allreduce.test \\\"tl\\\"\"}",
                              "\"args\": {\"name\": \"tl.second\"}", "\"dtype\": \"float32\", \"shape\": \"[100]\"",
                              "\"name\": \"CYCLE_START\""};
        if (n < 2 || text[0] != '[' || text[n - 1] != ']') {
            FAIL("the file is not a JSON array: '%s'", text);
        }
        for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
            if (!strstr(text, want[i])) {
                FAIL("the timeline lacks %s:\n%s", want[i], text);
            }
        }
        /* per allreduce: its span begun and ended, both ranks' instants, its execution */
        const char *twice[] = {"\"ph\": \"B\", \"name\": \"NEGOTIATE_ALLREDUCE\"", "\"ph\": \"X\", \"name\": \"0\"",
                               "\"ph\": \"X\", \"name\": \"1\"", "\"ph\": \"B\", \"name\": \"ALLREDUCE\""};
        for (size_t i = 0; i < sizeof(twice) / sizeof(twice[0]); i++) {
            if (occurrences(text, twice[i]) != 2) {
                FAIL("the timeline has %s %d times, not 2:\n%s", twice[i], occurrences(text, twice[i]), text);
            }
        }
        if (occurrences(text, "\"ph\": \"E\"") != 4) {
            FAIL("the timeline has %d span ends, not 4:\n%s", occurrences(text, "\"ph\": \"E\""), text);
        }
    }
out:
    free(text);
    dshim_named_destroy(eng);
    dshim_comm_destroy(comm);
    return rc;
}

START_TEST(test_timeline)
{
    test_rank_result_t res[MAX_N];
    char dir[] = "/tmp/check_named.XXXXXX", path[64];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/timeline.json", dir);
    int ok = run_all(2, body_timeline, path, NULL, NULL, res);
    unlink(path); /* before the verdict: a failed assertion ends this process */
    rmdir(dir);
    ck_assert_msg(ok, "2 ranks: every rank must exit 0 (stderr above)");
}
END_TEST

/* ---- shutdown ------------------------------------------------------------------------ */

static int body_shutdown(int rank, int size, int port, void *arg)
{
    (void)arg;
    dshim_comm_t *comm;
    dshim_named_t *eng;
    if (start(rank, size, port, &comm, &eng)) {
        return 2;
    }
    int rc = 0;
    float v = 1, o;
    int64_t shape[1] = {1};
    dshim_named_op_t *op = NULL;
    const char *text = "Horovod has been shut down. This was caused by an exception on one of the ranks or an attempt "
                       "to allreduce, allgather or broadcast a tensor after one of the ranks finished execution.";
    if (rank == 1) {
        sleep_s(0.3);
        dshim_named_shutdown(eng, "the test's rank 1 stopped");
    } else {
        /* pending: rank 1 never submits it */
        dshim_named_desc_t d = desc_ar("sd.pending", DSHIM_FLOAT32, &v, &o, shape, 1, DSHIM_SUM);
        if (dshim_named_submit(eng, &d, &op) != DSHIM_OK) {
            FAIL("submit: %s", dshim_last_error());
        }
        dshim_status_t st = dshim_named_wait(op);
        if (st != DSHIM_ERR_ABORTED || !strstr(dshim_named_error(op), text) ||
            !strstr(dshim_named_error(op), "rank 1")) {
            FAIL("pending op: status %d, '%s'", (int)st, dshim_named_error(op));
        }
    }
    /* later submissions fail at once, on every rank */
    sleep_s(0.2);
    dshim_named_desc_t d = desc_ar("sd.later", DSHIM_FLOAT32, &v, &o, shape, 1, DSHIM_SUM);
    dshim_named_op_t *later = NULL;
    dshim_status_t st = dshim_named_submit(eng, &d, &later);
    if (st != DSHIM_ERR_ABORTED || later || !strstr(dshim_last_error(), text)) {
        FAIL("a later submission: status %d, '%s'", (int)st, dshim_last_error());
    }
out:
    dshim_named_op_free(op);
    double t0 = dshim_now();
    dshim_named_destroy(eng);
    if (dshim_now() - t0 > 5) {
        fprintf(stderr, "ERROR: rank %d: destroy took %.1f s\n", rank, dshim_now() - t0);
        rc = 3;
    }
    dshim_comm_destroy(comm);
    return rc;
}

START_TEST(test_shutdown)
{
    test_rank_result_t res[MAX_N];
    run_ok(3, body_shutdown, NULL, NULL, NULL, res);
}
END_TEST

/* ---- a rank that never submits: stall warning, then the timeout ----------------------- */

static int body_stall(int rank, int size, int port, void *arg)
{
    (void)arg;
    dshim_comm_t *comm;
    dshim_named_t *eng;
    if (start(rank, size, port, &comm, &eng)) {
        return 2;
    }
    int rc = 0;
    float v = 1, o;
    int64_t shape[1] = {1};
    dshim_named_op_t *op = NULL;
    if (rank != 1) {
        dshim_named_desc_t d = desc_ar("stalled.x", DSHIM_FLOAT32, &v, &o, shape, 1, DSHIM_SUM);
        double t0 = dshim_now();
        if (dshim_named_submit(eng, &d, &op) != DSHIM_OK) {
            FAIL("submit: %s", dshim_last_error());
        }
        dshim_status_t st = dshim_named_wait(op);
        double took = dshim_now() - t0;
        const char *e = dshim_named_error(op);
        if (st != DSHIM_ERR_TIMEOUT || !strstr(e, "'stalled.x'") || !strstr(e, "rank 1 did not submit it")) {
            FAIL("status %d, '%s'", (int)st, e);
        }
        if (took < 2.9 || took > 10) {
            FAIL("failed after %.2f s, wanted the timeout (3 s)", took);
        }
        fprintf(stderr, "timeout: %s\n", e);
    } else {
        sleep_s(4.5);
    }
    /* the engine goes on */
    char err[512];
    dshim_named_desc_t d = desc_ar("stall.after", DSHIM_FLOAT32, &v, &o, shape, 1, DSHIM_SUM);
    if (run_one(eng, &d, err, sizeof(err)) != DSHIM_OK || o != (float)size) {
        FAIL("after the timeout: %s", err);
    }
out:
    dshim_named_op_free(op);
    dshim_named_destroy(eng);
    dshim_comm_destroy(comm);
    return rc;
}

START_TEST(test_stall_then_timeout)
{
    test_rank_result_t res[MAX_N];
    const char *env[] = {"DSHIM_TRANSPORT=shm", "DSHIM_TIMEOUT=3", "HOROVOD_STALL_CHECK_TIME_SECONDS=1", NULL};
    int rc = test_run_ranks(3, body_stall, NULL, env, 60.0, res);
    int ok = rc == 0;
    for (int r = 0; r < 3; r++) {
        ok = ok && res[r].exited && res[r].code == 0;
    }
    /* rank 0 warned, in Horovod's words, naming rank 1 and the tensor */
    ok = ok && strstr(res[0].err, "One or more tensors were submitted to be reduced, gathered or broadcasted by "
                                  "subset of ranks and are waiting for remainder of ranks for more than 1 seconds.") &&
         strstr(res[0].err, "Missing ranks:\n1: [stalled.x]");
    if (!ok) {
        dump(res, 3);
    }
    ck_assert_msg(ok, "stall warning then timeout naming rank 1 and 'stalled.x' (stderr above)");
}
END_TEST

/* ---- HOROVOD_STALL_SHUTDOWN_TIME_SECONDS: the stalled name fails, the engine shuts down ------ */

static int body_stall_shutdown(int rank, int size, int port, void *arg)
{
    (void)arg;
    dshim_comm_t *comm;
    dshim_named_t *eng;
    if (start(rank, size, port, &comm, &eng)) {
        return 2;
    }
    int rc = 0;
    float v = 1, o;
    int64_t shape[1] = {1};
    dshim_named_op_t *op = NULL;
    const char *text = "Horovod has been shut down.";
    if (rank != 1) {
        dshim_named_desc_t d = desc_ar("st.x", DSHIM_FLOAT32, &v, &o, shape, 1, DSHIM_SUM);
        if (dshim_named_submit(eng, &d, &op) != DSHIM_OK) {
            FAIL("submit: %s", dshim_last_error());
        }
        dshim_status_t st = dshim_named_wait(op);
        const char *e = dshim_named_error(op);
        if (st != DSHIM_ERR_ABORTED || !strstr(e, "'st.x'") || !strstr(e, "rank 1 did not submit it") ||
            !strstr(e, "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS")) {
            FAIL("status %d, '%s'", (int)st, e);
        }
    } else {
        sleep_s(4.0);
    }
    /* every rank's engine is shut down */
    dshim_named_desc_t d = desc_ar("st.after", DSHIM_FLOAT32, &v, &o, shape, 1, DSHIM_SUM);
    dshim_named_op_t *later = NULL;
    dshim_status_t st = dshim_named_submit(eng, &d, &later);
    if (st != DSHIM_ERR_ABORTED || !strstr(dshim_last_error(), text)) {
        FAIL("a later submission: status %d, '%s'", (int)st, dshim_last_error());
    }
out:
    dshim_named_op_free(op);
    dshim_named_destroy(eng);
    dshim_comm_destroy(comm);
    return rc;
}

START_TEST(test_stall_shutdown)
{
    test_rank_result_t res[MAX_N];
    const char *env[] = {"DSHIM_TRANSPORT=shm", "DSHIM_TIMEOUT=30", "HOROVOD_STALL_CHECK_TIME_SECONDS=1",
                         "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=2", NULL};
    int rc = test_run_ranks(3, body_stall_shutdown, NULL, env, 60.0, res);
    int ok = rc == 0;
    for (int r = 0; r < 3; r++) {
        ok = ok && res[r].exited && res[r].code == 0;
    }
    ok = ok && strstr(res[0].err, "\n1!: [st.x]") &&
         strstr(res[0].err, "One or more rank (marked by \"!\") is stalled for longer than 2 seconds. Will shutdown.");
    if (!ok) {
        dump(res, 3);
    }
    ck_assert_msg(ok, "the stalled name fails naming rank 1, the engines shut down (stderr above)");
}
END_TEST

/* ---- Horovod's refusal of a prescaled reducescatter larger than the fusion buffer ----------- */

static int body_rs_prescale(int rank, int size, int port, void *arg)
{
    (void)arg;
    dshim_comm_t *comm;
    dshim_named_t *eng;
    if (start(rank, size, port, &comm, &eng)) {
        return 2;
    }
    int rc = 0;
    char err[1024];
    float v[100] = {0};
    int64_t shape[1] = {100};
    dshim_named_desc_t d = desc_ar("rs.pre", DSHIM_FLOAT32, v, NULL, shape, 1, DSHIM_SUM);
    d.kind = DSHIM_NAMED_REDUCESCATTER;
    d.prescale = 2.0;
    if (run_one(eng, &d, err, sizeof(err)) != DSHIM_ERR_INVALID ||
        !strstr(err, "Reducescatter with prescale_factor == 2 != 1.0: The fusion buffer is not large enough to hold "
                     "the input tensor (400 bytes); increase HOROVOD_FUSION_THRESHOLD.")) {
        FAIL("'%s'", err);
    }
out:
    dshim_named_destroy(eng);
    dshim_comm_destroy(comm);
    return rc;
}

START_TEST(test_reducescatter_prescale_refused)
{
    test_rank_result_t res[MAX_N];
    run_ok(2, body_rs_prescale, NULL, "HOROVOD_FUSION_THRESHOLD=256", NULL, res);
}
END_TEST

/* ---- a rank killed mid-step ------------------------------------------------------------- */

static int body_killed(int rank, int size, int port, void *arg)
{
    (void)arg;
    dshim_comm_t *comm;
    dshim_named_t *eng;
    if (start(rank, size, port, &comm, &eng)) {
        return 2;
    }
    int rc = 0;
    float v[1000], o[1000];
    int64_t shape[1] = {1000};
    char err[1024];
    for (int step = 0; step < 50; step++) {
        if (rank == 2 && step == 20) {
            raise(SIGKILL);
        }
        char name[32];
        snprintf(name, sizeof(name), "k.%d", step);
        dshim_named_desc_t d = desc_ar(name, DSHIM_FLOAT32, v, o, shape, 1, DSHIM_SUM);
        double t0 = dshim_now();
        dshim_status_t st = run_one(eng, &d, err, sizeof(err));
        if (step < 20 && st != DSHIM_OK) {
            FAIL("step %d: %s", step, err);
        }
        if (step >= 20) {
            if (st == DSHIM_OK) {
                FAIL("step %d succeeded without rank 2", step);
            }
            if (!strstr(err, "rank 2") || dshim_now() - t0 > 10) {
                FAIL("step %d: after %.1f s: '%s' does not name rank 2", step, dshim_now() - t0, err);
            }
            fprintf(stderr, "killed: %s\n", err);
            break;
        }
    }
out:;
    double t0 = dshim_now();
    dshim_named_destroy(eng);
    if (dshim_now() - t0 > 10) {
        fprintf(stderr, "ERROR: rank %d: destroy took %.1f s\n", rank, dshim_now() - t0);
        rc = 3;
    }
    dshim_comm_destroy(comm);
    return rc;
}

START_TEST(test_killed_rank)
{
    test_rank_result_t res[MAX_N];
    const char *env[] = {"DSHIM_TRANSPORT=shm", "DSHIM_TIMEOUT=30", NULL};
    int rc = test_run_ranks(3, body_killed, NULL, env, 60.0, res);
    int ok = rc == 0 && res[0].exited && res[0].code == 0 && res[1].exited && res[1].code == 0 && !res[2].exited;
    if (!ok) {
        dump(res, 3);
    }
    ck_assert_msg(ok, "ranks 0 and 1 must fail naming rank 2 and exit 0 (stderr above)");
}
END_TEST

/* ---- latency of tiny allreduces (printed) ------------------------------------------------- */

#define LAT_ITERS 2000

static int body_latency(int rank, int size, int port, void *arg)
{
    (void)arg;
    dshim_comm_t *comm;
    dshim_named_t *eng;
    if (start(rank, size, port, &comm, &eng)) {
        return 2;
    }
    int rc = 0;
    float v = 1, o;
    int64_t shape[1] = {1};
    char err[512];
    double best_named = 1e9, best_raw = 1e9;
    for (int rep = 0; rep < 3; rep++) {
        dshim_barrier(comm);
        double t0 = dshim_now();
        for (int i = 0; i < LAT_ITERS; i++) {
            if (dshim_allreduce(comm, &v, &o, 1, DSHIM_FLOAT32, DSHIM_SUM) != DSHIM_OK) {
                FAIL("raw: %s", dshim_last_error());
            }
        }
        double raw = (dshim_now() - t0) / LAT_ITERS;
        dshim_barrier(comm);
        t0 = dshim_now();
        for (int i = 0; i < LAT_ITERS; i++) {
            dshim_named_desc_t d = desc_ar("lat", DSHIM_FLOAT32, &v, &o, shape, 1, DSHIM_SUM);
            if (run_one(eng, &d, err, sizeof(err)) != DSHIM_OK) {
                FAIL("named: %s", err);
            }
        }
        double named = (dshim_now() - t0) / LAT_ITERS;
        best_raw = raw < best_raw ? raw : best_raw;
        best_named = named < best_named ? named : best_named;
    }
    if (rank == 0) {
        fprintf(stderr, "latency: 1-float allreduce, %d ranks: dshim_allreduce %.2f us, named engine %.2f us (%.2fx)\n",
                size, best_raw * 1e6, best_named * 1e6, best_named / best_raw);
    }
out:
    dshim_named_destroy(eng);
    dshim_comm_destroy(comm);
    return rc;
}

START_TEST(test_latency_print)
{
    test_rank_result_t res[MAX_N];
    run_ok(2, body_latency, NULL, NULL, NULL, res);
    const char *l = strstr(res[0].err, "latency:");
    printf("%s", l ? l : "no latency line\n");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("named");
    TCase *tc = tcase_create("named");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_allreduce_any_order);
    tcase_add_test(tc, test_fusion);
    tcase_add_test(tc, test_scaling);
    tcase_add_test(tc, test_kinds);
    tcase_add_test(tc, test_join);
    tcase_add_test(tc, test_join_upstream);
    tcase_add_test(tc, test_duplicate_name);
    tcase_add_test(tc, test_mismatches);
    tcase_add_test(tc, test_arguments);
    tcase_add_test(tc, test_timeline);
    tcase_add_test(tc, test_shutdown);
    tcase_add_test(tc, test_stall_then_timeout);
    tcase_add_test(tc, test_stall_shutdown);
    tcase_add_test(tc, test_reducescatter_prescale_refused);
    tcase_add_test(tc, test_killed_rank);
    tcase_add_test(tc, test_latency_print);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

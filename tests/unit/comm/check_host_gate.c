/*
 * Unit tests of the host gate (shim/comm/host_gate.h: the mechanism, and the
 * barrier and allreduces that run through it): the ranks of one host
 * meeting in shared memory for the barrier and allreduces (every rank
 * arrives, the last one reduces in rank order and opens the door; the split
 * form has every rank reduce its share, piece by piece), between real ranks
 * (tests/common/ranks.c).
 *
 *  - results: 2 to 5 ranks through the one-round gate (DSHIM_ALGO=gate) and
 *    the split gate (gate-split), at counts around what they cut by: fewer
 *    elements than ranks, odd counts, a whole data block (1 MiB), several
 *    pieces of the split form; float32 sums whose bits depend on the order
 *    of the additions must equal the sums in rank order on every rank; max,
 *    min and avg; in place; no connection is made (nothing but the gate
 *    carried the calls);
 *  - many episodes in a row, each result checked (an episode opened early
 *    or late shows as a wrong sum or a hang), and the episodes around the
 *    32-bit wrap of the door's word (the gate set up to stand just before
 *    it: its counter and door words are those of host_gate.h's layout);
 *  - a rank that exits before arriving: the others fail within seconds,
 *    naming it, and the verdict (dshim_comm_get_missing) holds it;
 *  - a rank that never arrives: the others time out after DSHIM_TIMEOUT
 *    naming it, as text and as data;
 *  - which settings send calls through the gate: DSHIM_ALGO=gate up to a
 *    data block, gate-split at any size, never with DSHIM_SHM_GATE=0 or
 *    over sockets; the barrier whenever there is a gate;
 *  - the allgather(v) through the gate (auto's choice, up to 64 KiB, with
 *    polls that yield: the ranks set up as oversubscribed): uneven blocks,
 *    a rank with none, displacements with gaps, in place, 2 to 4 ranks;
 *    the ring past 64 KiB, with a core per thread, another DSHIM_ALGO or no
 *    gate; a rank that exits before arriving, one that never arrives,
 *    mismatched totals and mismatched block counts with the same total,
 *    each failing every other rank naming a rank and the op.
 * Killed ranks at every step of the split gate, the gate's owner killed,
 * an abort reaching the waiters and mismatched allreduces through the gate
 * are tests/failure/check_failure.c's.
 */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "coll.h"
#include "comm.h"
#include "config.h"
#include "dshim.h"
#include "engine.h"
#include "host_gate.h"
#include "net.h"
#include "ranks.h"

#define MAX_N 5
#define GUARD 64

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

/* Runs body on n ranks with env (plus shm and a timeout) and wants every
 * rank to exit 0. */
static void run_all_ok(int n, test_rank_body_t body, void *arg, const char *algo, const char *extra)
{
    char a[64];
    snprintf(a, sizeof(a), "DSHIM_ALGO=%s", algo);
    const char *env[] = {"DSHIM_TRANSPORT=shm", "DSHIM_TIMEOUT=20", a, extra, NULL};
    test_rank_result_t res[MAX_N];
    int rc = test_run_ranks(n, body, arg, env, 40.0, res);
    int ok = rc == 0;
    for (int r = 0; r < n; r++) {
        ok = ok && res[r].exited && res[r].code == 0;
    }
    if (!ok) {
        dump(res, n);
    }
    ck_assert_msg(ok, "%d ranks, DSHIM_ALGO=%s%s%s: every rank must exit 0 (stderr above)", n, algo,
                  extra ? ", " : "", extra ? extra : "");
}

/* The number of peers this rank has a connection to. */
static int connections(dshim_comm_t *comm)
{
    int k = 0;
    for (int r = 0; r < comm->size; r++) {
        k += r != comm->rank && dshim_comm_conn(comm, r) != NULL;
    }
    return k;
}

/* ---- results ------------------------------------------------------------- */

/* Rank r's element i: float32 values of very different sizes, so that the
 * sum's bits depend on the order of the additions; ints; float64 values n
 * times small integers (their average is exact). */
static float f32_in(size_t i, int r)
{
    float small = (float)((i * 7 + (size_t)r * 13) % 17) * 0.37f;
    return (i + (size_t)r) % 3 == 0 ? small + 3.0e7f : small;
}

static int32_t i32_in(size_t i, int r)
{
    return (int32_t)((i * 2654435761u + (size_t)r * 40503u) % 100003u) - 50000;
}

static double f64_in(size_t i, int r, int n)
{
    return (double)n * (double)((i * 5 + (size_t)r * 3) % 23);
}

typedef struct call {
    dshim_dtype_t dt;
    dshim_redop_t op;
    size_t count;
    int in_place;
} call_t;

static void fill(const call_t *c, void *buf, int r, int n)
{
    for (size_t i = 0; i < c->count; i++) {
        if (c->dt == DSHIM_FLOAT32) {
            ((float *)buf)[i] = f32_in(i, r);
        } else if (c->dt == DSHIM_INT32) {
            ((int32_t *)buf)[i] = i32_in(i, r);
        } else {
            ((double *)buf)[i] = f64_in(i, r, n);
        }
    }
}

/* Whether element i of the result is the ranks' inputs reduced in rank
 * order (the float32 sum bit for bit). */
static int right(const call_t *c, const void *buf, size_t i, int n)
{
    if (c->dt == DSHIM_FLOAT32) {
        float acc = f32_in(i, 0);
        for (int r = 1; r < n; r++) {
            acc = acc + f32_in(i, r);
        }
        return memcmp(&acc, (const float *)buf + i, sizeof(acc)) == 0;
    }
    if (c->dt == DSHIM_INT32) {
        int32_t acc = i32_in(i, 0);
        for (int r = 1; r < n; r++) {
            int32_t v = i32_in(i, r);
            acc = c->op == DSHIM_MAX ? (v > acc ? v : acc) : (v < acc ? v : acc);
        }
        return ((const int32_t *)buf)[i] == acc;
    }
    double sum = 0;
    for (int r = 0; r < n; r++) {
        sum += f64_in(i, r, n);
    }
    return ((const double *)buf)[i] == sum / n;
}

/* float32 counts around what the gates cut by: fewer than ranks, odd, a
 * whole data block (DSHIM_HOST_AREA_DATA), one element past it (the split
 * form only: the one-round gate does not take it); the split form's pieces
 * (at least 128 KiB, at most 512 KiB) several times over */
#define BLOCK_F32 (DSHIM_HOST_AREA_DATA / 4)
static const call_t gate_calls[] = {
    {DSHIM_FLOAT32, DSHIM_SUM, 1, 0},         {DSHIM_FLOAT32, DSHIM_SUM, 3, 0},
    {DSHIM_FLOAT32, DSHIM_SUM, 1001, 1},      {DSHIM_INT32, DSHIM_MAX, 4099, 0},
    {DSHIM_INT32, DSHIM_MIN, 77, 1},          {DSHIM_FLOAT64, DSHIM_AVG, 999, 0},
    {DSHIM_FLOAT32, DSHIM_SUM, BLOCK_F32, 0},
};
static const call_t split_calls[] = {
    {DSHIM_FLOAT32, DSHIM_SUM, 3, 0},
    {DSHIM_FLOAT32, DSHIM_SUM, 1001, 0},
    {DSHIM_INT32, DSHIM_MAX, BLOCK_F32 + 1, 1},
    {DSHIM_FLOAT64, DSHIM_AVG, 33333, 0},
    {DSHIM_FLOAT32, DSHIM_SUM, 5 * BLOCK_F32 + 3, 0},
};

typedef struct calls {
    const call_t *c;
    int n;
} calls_t;

static int body_results(int rank, int size, int port, void *arg)
{
    const calls_t *cs = arg;
    dshim_comm_t *comm;
    if (test_comm_init(rank, size, port, &comm)) {
        return 2;
    }
    int rc = 0;
    unsigned char *sbuf = NULL, *rbuf = NULL;
    if (comm->gate_transport < 0) {
        FAIL("no host gate on one host over shm");
    }
    for (int k = 0; k < cs->n; k++) {
        const call_t *c = &cs->c[k];
        size_t bytes = c->count * dshim_dtype_size(c->dt);
        sbuf = malloc(bytes + GUARD);
        rbuf = c->in_place ? sbuf : malloc(bytes + GUARD);
        if (!sbuf || !rbuf) {
            FAIL("out of memory");
        }
        fill(c, sbuf, rank, size);
        memset(sbuf + bytes, 0xa5, GUARD);
        if (!c->in_place) {
            memset(rbuf, 0x5a, bytes + GUARD);
            memset(rbuf + bytes, 0xa5, GUARD);
        }
        if (dshim_allreduce(comm, sbuf, rbuf, c->count, c->dt, c->op) != DSHIM_OK) {
            FAIL("call %d: %s", k, dshim_last_error());
        }
        for (size_t i = 0; i < c->count; i++) {
            if (!right(c, rbuf, i, size)) {
                FAIL("call %d (%zu x %s, %s): element %zu wrong", k, c->count, dshim_dtype_name(c->dt),
                     dshim_redop_name(c->op), i);
            }
        }
        for (size_t i = 0; i < GUARD; i++) {
            if (rbuf[bytes + i] != 0xa5 || sbuf[bytes + i] != 0xa5) {
                FAIL("call %d: byte %zu past the buffer's end was written", k, i);
            }
        }
        if (!c->in_place) {
            free(rbuf);
        }
        free(sbuf);
        sbuf = rbuf = NULL;
        if (dshim_barrier(comm) != DSHIM_OK) {
            FAIL("barrier after call %d: %s", k, dshim_last_error());
        }
    }
    if (connections(comm) != 0) {
        FAIL("%d connections: calls went around the gate", connections(comm));
    }
out:
    if (rbuf != sbuf) {
        free(rbuf);
    }
    free(sbuf);
    if (dshim_comm_destroy(comm) != DSHIM_OK && rc == 0) {
        rc = 4;
    }
    return rc;
}

START_TEST(test_gate_results)
{
    calls_t cs = {gate_calls, (int)(sizeof(gate_calls) / sizeof(gate_calls[0]))};
    for (int n = 2; n <= 5; n++) {
        run_all_ok(n, body_results, &cs, "gate", NULL);
    }
}
END_TEST

START_TEST(test_split_results)
{
    calls_t cs = {split_calls, (int)(sizeof(split_calls) / sizeof(split_calls[0]))};
    for (int n = 2; n <= 5; n++) {
        run_all_ok(n, body_results, &cs, "gate-split", NULL);
    }
}
END_TEST

/* ---- many episodes; the 32-bit wrap ------------------------------------- */

#define EPISODES 20000
#define WRAP_EPISODES 200

/* One episode: an allreduce of a value that changes every call (a call
 * that took an earlier or later episode's result shows), and a barrier
 * between pairs of them. */
static int episodes(dshim_comm_t *comm, int rank, int size, int count)
{
    for (int e = 0; e < count; e++) {
        int64_t v = (int64_t)e * 1000 + rank, sum = 0;
        int64_t want = (int64_t)e * 1000 * size + (int64_t)size * (size - 1) / 2;
        if ((e & 1) && dshim_barrier(comm) != DSHIM_OK) {
            fprintf(stderr, "ERROR: rank %d: barrier %d: %s\n", rank, e, dshim_last_error());
            return 3;
        }
        if (dshim_allreduce(comm, &v, &sum, 1, DSHIM_INT64, DSHIM_SUM) != DSHIM_OK) {
            fprintf(stderr, "ERROR: rank %d: allreduce %d: %s\n", rank, e, dshim_last_error());
            return 3;
        }
        if (sum != want) {
            fprintf(stderr, "ERROR: rank %d: allreduce %d gave %lld, not %lld\n", rank, e, (long long)sum,
                    (long long)want);
            return 3;
        }
    }
    return 0;
}

static int body_many(int rank, int size, int port, void *arg)
{
    (void)arg;
    dshim_comm_t *comm;
    if (test_comm_init(rank, size, port, &comm)) {
        return 2;
    }
    double t0 = dshim_now();
    int rc = episodes(comm, rank, size, EPISODES);
    fprintf(stderr, "rank %d: %d episodes in %.2f s\n", rank, EPISODES, dshim_now() - t0);
    if (rc == 0 && connections(comm) != 0) {
        fprintf(stderr, "ERROR: rank %d: calls went around the gate\n", rank);
        rc = 3;
    }
    dshim_comm_destroy(comm);
    return rc;
}

START_TEST(test_many_episodes)
{
    run_all_ok(3, body_many, NULL, "gate", NULL);
}
END_TEST

/* The gate's first lines (host_gate.h; docs/wire-protocol.md section 4):
 * line 0 the arrivals counter, line 1 the door, whose first word is the
 * last episode opened, 32 bits. */
static uint64_t *gate_arrivals(void *area)
{
    return (uint64_t *)area;
}

static uint32_t *gate_open(void *area)
{
    return (uint32_t *)((unsigned char *)area + DSHIM_HOST_AREA_LINE);
}

/* The gate as if WRAP_EPISODES / 2 episodes before the door's word wraps
 * had run: rank 0 sets the counter and the door (no rank has arrived yet),
 * then tells the others by a broadcast (messages, not the gate); each rank
 * starts its episodes from there. */
static int body_wrap(int rank, int size, int port, void *arg)
{
    (void)arg;
    dshim_comm_t *comm;
    if (test_comm_init(rank, size, port, &comm)) {
        return 2;
    }
    int rc = 0;
    const uint64_t first = ((uint64_t)1 << 32) - WRAP_EPISODES / 2;
    if (rank == 0) {
        dshim_coll_sig_t theirs;
        /* maps the gate (nobody has arrived: no rank is named) */
        if (comm->gate_transport < 0 || dshim_host_gate_at(comm, 0, &theirs) != -1 || !comm->gate) {
            FAIL("no gate to set up");
        }
        __atomic_store_n(gate_arrivals(comm->gate), first * (uint64_t)size, __ATOMIC_RELEASE);
        __atomic_store_n(gate_open(comm->gate), (uint32_t)first, __ATOMIC_RELEASE);
    }
    int32_t ready = 1;
    if (dshim_broadcast(comm, &ready, 1, DSHIM_INT32, 0) != DSHIM_OK) {
        FAIL("broadcast: %s", dshim_last_error());
    }
    comm->gate_episode = first;
    if ((rc = episodes(comm, rank, size, WRAP_EPISODES)) != 0) {
        goto out;
    }
    /* at least an episode per allreduce (the split form takes two), and
     * the door opened the last one, past the wrap */
    uint64_t last = comm->gate_episode;
    uint32_t door = __atomic_load_n(gate_open(comm->gate), __ATOMIC_ACQUIRE);
    if (last < first + WRAP_EPISODES || door != (uint32_t)last || door >= (uint32_t)first) {
        FAIL("after the wrap: episode %llu, door at %u", (unsigned long long)last, door);
    }
out:
    dshim_comm_destroy(comm);
    return rc;
}

START_TEST(test_episode_wrap)
{
    run_all_ok(3, body_wrap, NULL, "gate", NULL);
    run_all_ok(2, body_wrap, NULL, "gate-split", NULL);
}
END_TEST

/* ---- the allgather through the gate ---------------------------------------- */

/* The allgather takes the gate only under DSHIM_ALGO=auto with spin_yields
 * (dshim_allgather_gate_fits): every rank applies the engine's spin rule as
 * if each had as many busy threads as this host has cores (2 ranks already
 * outnumber the cores), which is how the Horovod engine's comm comes to it
 * (dshim_hook_shares_cores) on a host with few cores.  Same on every rank,
 * before the first collective, as the rule requires. */
static void gather_oversubscribed(dshim_comm_t *comm)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    dshim_engine_spin_rule(comm, cpus > 1 ? (int)cpus : 2);
}

/* The algorithm the recorder names for an allgatherv of `total` int32
 * elements on comm (dshim_algo_name: what the engine gives the recorder). */
static const char *gather_algo(dshim_comm_t *comm, size_t total)
{
    dshim_request_t req;
    memset(&req, 0, sizeof(req));
    req.sig.coll = DSHIM_COLL_ALLGATHERV;
    req.dtype = DSHIM_INT32;
    req.count = total;
    return dshim_algo_name(comm, &req);
}

/* Uneven blocks: rank r gives parts[r] int32 elements (some none), placed
 * in the output with a gap of GAP elements after each block (the gate
 * packs the blocks in rank order; the caller's displacements place them). */
#define GAP 3

static int32_t gather_in(size_t i, int r)
{
    return (int32_t)(r * 1000003 + (int)i * 7 + 1);
}

typedef struct gather {
    size_t base;   /* parts[r] = base * (r + 1) + r % 2, but rank 1 gives none when base is 0 */
    int via_gate;  /* expected: through the gate (no connection, "shm-gate") */
    int oversub;   /* apply gather_oversubscribed */
} gather_t;

static size_t gather_part(const gather_t *g, int r)
{
    return g->base == 0 ? (size_t)(r == 1 ? 0 : r + 2) : g->base * (size_t)(r + 1) + (size_t)(r % 2);
}

/* One allgatherv of g's blocks, its result checked element by element and
 * the gaps and the bytes past the end left as they were. */
static int gather_once(dshim_comm_t *comm, int rank, int size, const gather_t *g, int in_place)
{
    size_t counts[MAX_N] = {0}, displs[MAX_N] = {0}, end = 0, total = 0;
    for (int r = 0; r < size; r++) {
        counts[r] = gather_part(g, r);
        displs[r] = end;
        end += counts[r] + GAP;
        total += counts[r];
    }
    int32_t *out = malloc((end + GUARD) * sizeof(int32_t)), *in = malloc((counts[rank] + 1) * sizeof(int32_t));
    int rc = 0;
    if (!out || !in) {
        FAIL("out of memory");
    }
    for (size_t i = 0; i < end + GUARD; i++) {
        out[i] = -7;
    }
    int32_t *src = in_place ? out + displs[rank] : in;
    for (size_t i = 0; i < counts[rank]; i++) {
        src[i] = gather_in(i, rank);
    }
    const char *algo = gather_algo(comm, total);
    if (strcmp(algo, g->via_gate ? "shm-gate" : "ring") != 0) {
        FAIL("%zu x int32 at %d ranks: the recorder would say %s", total, size, algo);
    }
    if (dshim_allgatherv(comm, src, out, counts, displs, DSHIM_INT32) != DSHIM_OK) {
        FAIL("allgatherv of %zu: %s", total, dshim_last_error());
    }
    for (int r = 0; r < size; r++) {
        for (size_t i = 0; i < counts[r] + GAP; i++) {
            int32_t want = i < counts[r] ? gather_in(i, r) : -7;
            if (out[displs[r] + i] != want) {
                FAIL("allgatherv of %zu: rank %d's element %zu is %d, not %d", total, r, i, out[displs[r] + i], want);
            }
        }
    }
    for (size_t i = end; i < end + GUARD; i++) {
        if (out[i] != -7) {
            FAIL("allgatherv of %zu: element %zu past the end was written", total, i);
        }
    }
out:
    free(out);
    free(in);
    return rc;
}

static int body_gather(int rank, int size, int port, void *arg)
{
    const gather_t *g = arg;
    dshim_comm_t *comm;
    if (test_comm_init(rank, size, port, &comm)) {
        return 2;
    }
    int rc = 0;
    if (g->oversub) {
        gather_oversubscribed(comm);
    }
    /* several episodes, each checked: a result block overwritten by the
     * next episode's before a rank copied it out shows as a wrong value */
    for (int k = 0; k < 6 && rc == 0; k++) {
        rc = gather_once(comm, rank, size, g, k % 2);
    }
    if (rc == 0 && (connections(comm) == 0) != g->via_gate) {
        fprintf(stderr, "ERROR: rank %d: %d connections: wanted the allgathers %s the gate\n", rank,
                connections(comm), g->via_gate ? "through" : "around");
        rc = 3;
    }
    dshim_comm_destroy(comm);
    return rc;
}

START_TEST(test_gather_results)
{
    /* uneven blocks, one rank giving none, at 2, 3 and 4 ranks; and 64 KiB
     * in all, the most the gate takes (4 ranks: 1638 * 10 + 2 elements) */
    const gather_t uneven = {5, 1, 1}, one_empty = {0, 1, 1}, at_most = {1638, 1, 1};
    for (int n = 2; n <= 4; n++) {
        run_all_ok(n, body_gather, (void *)&uneven, "auto", NULL);
        run_all_ok(n, body_gather, (void *)&one_empty, "auto", NULL);
    }
    run_all_ok(4, body_gather, (void *)&at_most, "auto", NULL);
}
END_TEST

START_TEST(test_gather_choice)
{
    /* just past 64 KiB (16392 x int32), a core per thread, another algorithm asked for,
     * or no gate: the ring (its messages connect the ranks) */
    const gather_t over = {1639, 0, 1}, idle = {5, 0, 0}, gate = {5, 1, 1}, around = {5, 0, 1};
    run_all_ok(4, body_gather, (void *)&over, "auto", NULL);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (cpus >= 3) {
        run_all_ok(3, body_gather, (void *)&idle, "auto", NULL); /* 3 ranks on 2 cores would yield anyway */
    }
    run_all_ok(3, body_gather, (void *)&gate, "auto", NULL);
    run_all_ok(3, body_gather, (void *)&around, "ring", NULL);
    run_all_ok(3, body_gather, (void *)&around, "auto", "DSHIM_SHM_GATE=0");
}
END_TEST

/* ---- a rank that exits before arriving; one that never arrives ---------- */

typedef struct absent {
    int victim;
    int exits;    /* 1: exits before its call; 0: arrives after the others timed out */
    double after; /* seconds before it exits, or before it arrives */
    int gather;   /* the calls are allgatherv through the gate (else allreduces, DSHIM_ALGO=gate) */
} absent_t;

#define ABSENT_CALL 3 /* the victim's 4th call: collective #3 */
#define ABSENT_TIMEOUT_S 2.0

/* One call of body_absent's: a 1-int allreduce, or an allgatherv of
 * uneven blocks (1 or 2 ints a rank). */
static dshim_status_t absent_call(dshim_comm_t *comm, const absent_t *a, int rank, int size)
{
    int32_t v = rank, sum = 0;
    if (!a->gather) {
        return dshim_allreduce(comm, &v, &sum, 1, DSHIM_INT32, DSHIM_SUM);
    }
    int32_t in[2] = {rank, rank}, out[2 * MAX_N];
    size_t counts[MAX_N] = {0}, displs[MAX_N] = {0}, at = 0;
    for (int r = 0; r < size; r++) {
        counts[r] = 1 + (size_t)(r % 2);
        displs[r] = at;
        at += counts[r];
    }
    return dshim_allgatherv(comm, in, out, counts, displs, DSHIM_INT32);
}

static int body_absent(int rank, int size, int port, void *arg)
{
    const absent_t *a = arg;
    dshim_comm_t *comm;
    if (test_comm_init(rank, size, port, &comm)) {
        return 2;
    }
    int rc = 0;
    if (a->gather) {
        gather_oversubscribed(comm);
    }
    for (int k = 0; k < ABSENT_CALL; k++) {
        if (absent_call(comm, a, rank, size) != DSHIM_OK) {
            FAIL("call %d: %s", k, dshim_last_error());
        }
    }
    if (rank == a->victim) {
        /* the others are in the gate by then */
        sleep_s(a->after);
        if (a->exits) {
            _exit(0); /* no goodbye, no destroy */
        }
        dshim_status_t st = absent_call(comm, a, rank, size);
        fprintf(stderr, "late call: status %d: %s\n", (int)st, dshim_last_error());
        goto out;
    }
    double t0 = dshim_now();
    dshim_status_t st = absent_call(comm, a, rank, size);
    double took = dshim_now() - t0;
    fprintf(stderr, "call: status %d after %.2f s: %s\n", (int)st, took, dshim_last_error());
    /* the victim named: as exited, or as missing at the timeout */
    char who[64];
    snprintf(who, sizeof(who), a->exits ? "rank %d (host" : "did not arrive at this collective: %d", a->victim);
    const char *why = a->exits ? "exited before it arrived" : "did not complete within";
    if (!strstr(dshim_last_error(), who) || !strstr(dshim_last_error(), why)) {
        FAIL("the error does not say '%s' and '%s'", who, why);
    }
    /* the op named, and (allgatherv) that it waited in the gate: the ring
     * would have connected to its neighbours, and would say it waited for
     * a message */
    char op[64];
    snprintf(op, sizeof(op), "in %s #%d", a->gather ? "allgatherv" : "allreduce", ABSENT_CALL);
    if (!strstr(dshim_last_error(), op)) {
        FAIL("the error does not name the call ('%s')", op);
    }
    if (a->gather && (connections(comm) != 0 ||
                      (!a->exits && !strstr(dshim_last_error(), "waiting in shared memory")))) {
        FAIL("the allgatherv did not wait in the gate (%d connections)", connections(comm));
    }
    /* bounded: a death is seen at the next look (every 50 ms); a timeout
     * after DSHIM_TIMEOUT, never before it.  The upper bounds leave room for
     * a loaded machine (make test runs this beside other tests, and under
     * the sanitizers): they tell "bounded" from "hung", not fast from slow */
    double lo = a->exits ? a->after - 0.5 : ABSENT_TIMEOUT_S - 0.1;
    double hi = a->exits ? a->after + 5.0 : ABSENT_TIMEOUT_S + 3.0;
    if (took < lo || took > hi) {
        FAIL("gave up after %.2f s, wanted %.1f..%.1f", took, lo, hi);
    }
    uint64_t seq = 0;
    int missing[MAX_N] = {-1, -1, -1, -1, -1}, nmissing = -2;
    dshim_status_t verdict = dshim_comm_get_missing(comm, &seq, missing, MAX_N, &nmissing);
    dshim_status_t want = a->exits ? DSHIM_ERR_PEER : DSHIM_ERR_TIMEOUT;
    if (st == DSHIM_ERR_PEER && strstr(dshim_last_error(), "failed the communicator while this rank waited")) {
        /* another waiter's verdict came first, through the gate's door
         * (its message quotes it, checked above); this rank has none of
         * its own: exit code 10 tells the harness */
        rc = verdict == DSHIM_OK ? 10 : 3;
        if (rc == 3) {
            FAIL("no verdict of its own expected, got status %d", (int)verdict);
        }
        goto out;
    }
    if (st != want || verdict != want || seq != ABSENT_CALL || nmissing != 1 || missing[0] != a->victim) {
        FAIL("status %d, verdict: status %d, collective %llu, %d missing (first %d); wanted %d, %d, 1, %d",
             (int)st, (int)verdict, (unsigned long long)seq, nmissing, missing[0], (int)want, ABSENT_CALL,
             a->victim);
    }
out:
    dshim_comm_destroy(comm);
    return rc;
}

static void run_absent(int n, const absent_t *a)
{
    /* the allreduce through the gate when asked for; the allgather only by
     * auto's choice (gather_oversubscribed) */
    const char *env[] = {"DSHIM_TRANSPORT=shm", a->gather ? "DSHIM_ALGO=auto" : "DSHIM_ALGO=gate",
                         a->exits ? "DSHIM_TIMEOUT=60" : "DSHIM_TIMEOUT=2", NULL};
    test_rank_result_t res[MAX_N];
    int rc = test_run_ranks(n, body_absent, (void *)a, env, 30.0, res);
    /* every other rank fails naming the victim; at least one with the
     * verdict of its own (exit 0), the others may have it from that one
     * (exit 10) */
    int ok = rc == 0, verdicts = 0;
    for (int r = 0; r < n; r++) {
        ok = ok && res[r].exited && (r == a->victim || res[r].code == 0 || res[r].code == 10);
        verdicts += r != a->victim && res[r].code == 0;
    }
    ok = ok && verdicts > 0;
    if (!ok) {
        dump(res, n);
    }
    ck_assert_msg(ok, "the others must fail naming rank %d as %s, in text and as data (stderr above)", a->victim,
                  a->exits ? "exited" : "missing");
}

START_TEST(test_rank_exits_before_arriving)
{
    const absent_t a = {.victim = 1, .exits = 1, .after = 0.5};
    run_absent(3, &a);
}
END_TEST

START_TEST(test_rank_never_arrives)
{
    const absent_t a = {.victim = 2, .exits = 0, .after = ABSENT_TIMEOUT_S + 2.5};
    run_absent(4, &a);
}
END_TEST

START_TEST(test_gather_rank_exits_before_arriving)
{
    const absent_t a = {.victim = 1, .exits = 1, .after = 0.5, .gather = 1};
    run_absent(3, &a);
}
END_TEST

START_TEST(test_gather_rank_never_arrives)
{
    const absent_t a = {.victim = 2, .exits = 0, .after = ABSENT_TIMEOUT_S + 2.5, .gather = 1};
    run_absent(4, &a);
}
END_TEST

/* Mismatched allgathers through the gate.  Counts (arg NULL): rank 1
 * gives 2 elements where the others give 1 (its total differs: the gate
 * compares the calls' counts).  Blocks (arg non-NULL): the same total, but
 * rank 1's allgatherv counts say [2, 1, 1] where the others' say [1, 2, 1]
 * (the ring would see a message of the wrong size; the gate compares the
 * counts' hash).  Every rank fails at once with the mismatch, naming the
 * call and a rank whose call differs from its own (rank 1 for the others,
 * rank 0 for rank 1), and no rank connected to another. */
static int body_gather_mismatch(int rank, int size, int port, void *arg)
{
    const int blocks = arg != NULL;
    dshim_comm_t *comm;
    if (test_comm_init(rank, size, port, &comm)) {
        return 2;
    }
    gather_oversubscribed(comm);
    int rc = 0;
    int32_t in[2] = {rank, rank}, out[4 * MAX_N];
    for (int k = 0; k < 2; k++) {
        if (dshim_allgather(comm, in, out, 1, DSHIM_INT32) != DSHIM_OK) {
            FAIL("allgather %d: %s", k, dshim_last_error());
        }
    }
    size_t counts[3] = {1, 2, 1}, displs[3] = {0, 2, 4};
    if (rank == 1) {
        counts[0] = 2;
        counts[1] = 1;
    }
    double t0 = dshim_now();
    dshim_status_t st = blocks ? dshim_allgatherv(comm, in, out, counts, displs, DSHIM_INT32)
                               : dshim_allgather(comm, in, out, rank == 1 ? 2 : 1, DSHIM_INT32);
    double took = dshim_now() - t0;
    const char *err = dshim_last_error();
    fprintf(stderr, "call: status %d after %.2f s: %s\n", (int)st, took, err);
    char who[64], mine[64];
    snprintf(who, sizeof(who), "%s rank %d (host", blocks ? "mismatched block counts:" : "but", rank == 1 ? 0 : 1);
    snprintf(mine, sizeof(mine), "rank %d (host", rank);
    const char *call = blocks ? "in allgatherv #2" : "in allgather #2";
    if (st != DSHIM_ERR_MISMATCH || strncmp(err, mine, strlen(mine)) != 0 || !strstr(err, call) ||
        !strstr(err, "mismatched") || !strstr(err, who)) {
        FAIL("wanted status %d, '%s... %s' and '%s'", (int)DSHIM_ERR_MISMATCH, mine, call, who);
    }
    if (took > 10.0 || connections(comm) != 0) {
        FAIL("the mismatch took %.2f s, %d connections: not seen in the gate", took, connections(comm));
    }
out:
    dshim_comm_destroy(comm);
    return rc;
}

START_TEST(test_gather_mismatch)
{
    static int blocks = 1;
    run_all_ok(3, body_gather_mismatch, NULL, "auto", NULL);
    run_all_ok(3, body_gather_mismatch, &blocks, "auto", NULL);
}
END_TEST

/* ---- which settings use the gate ------------------------------------------ */

typedef struct choice {
    size_t count;   /* float32 elements of the allreduce */
    int gate;       /* the communicator has a gate */
    int via_gate;   /* the allreduce goes through it (no connection made) */
} choice_t;

static int body_choice(int rank, int size, int port, void *arg)
{
    const choice_t *c = arg;
    dshim_comm_t *comm;
    if (test_comm_init(rank, size, port, &comm)) {
        return 2;
    }
    int rc = 0;
    float *buf = malloc(c->count * sizeof(float));
    if (!buf) {
        FAIL("out of memory");
    }
    if ((comm->gate_transport >= 0) != c->gate) {
        FAIL("gate_transport %d: wanted %s", comm->gate_transport, c->gate ? "a gate" : "none");
    }
    /* the barrier: through the gate whenever there is one */
    if (dshim_barrier(comm) != DSHIM_OK) {
        FAIL("barrier: %s", dshim_last_error());
    }
    if (c->gate && connections(comm) != 0) {
        FAIL("the barrier made %d connections", connections(comm));
    }
    /* every rank has looked before any begins the allreduce (which may
     * connect to it) */
    if (dshim_barrier(comm) != DSHIM_OK) {
        FAIL("barrier: %s", dshim_last_error());
    }
    for (size_t i = 0; i < c->count; i++) {
        buf[i] = (float)(rank + 1);
    }
    if (dshim_allreduce(comm, buf, buf, c->count, DSHIM_FLOAT32, DSHIM_SUM) != DSHIM_OK) {
        FAIL("allreduce: %s", dshim_last_error());
    }
    for (size_t i = 0; i < c->count; i++) {
        if (buf[i] != (float)(size * (size + 1) / 2)) {
            FAIL("element %zu is %g", i, (double)buf[i]);
        }
    }
    if ((connections(comm) == 0) != c->via_gate) {
        FAIL("%d connections after the allreduce: wanted it %s the gate", connections(comm),
             c->via_gate ? "through" : "around");
    }
out:
    free(buf);
    dshim_comm_destroy(comm);
    return rc;
}

START_TEST(test_settings_choose_gate)
{
    choice_t small_gate = {1024, 1, 1}, block_gate = {BLOCK_F32, 1, 1}, over_block = {BLOCK_F32 + 1, 1, 0};
    choice_t split_big = {BLOCK_F32 * 3, 1, 1}, no_gate = {1024, 0, 0}, ring = {1024, 1, 0};
    run_all_ok(3, body_choice, &small_gate, "gate", NULL);
    run_all_ok(3, body_choice, &block_gate, "gate", NULL);
    /* past a data block the one-round gate cannot serve: messages */
    run_all_ok(3, body_choice, &over_block, "gate", NULL);
    run_all_ok(3, body_choice, &split_big, "gate-split", NULL);
    run_all_ok(3, body_choice, &no_gate, "gate", "DSHIM_SHM_GATE=0");
    run_all_ok(3, body_choice, &no_gate, "gate-split", "DSHIM_TRANSPORT=tcp");
    /* another algorithm asked for: the allreduce by messages, the barrier
     * still through the gate */
    run_all_ok(3, body_choice, &ring, "ring", NULL);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("host_gate");
    TCase *tc = tcase_create("gate");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_gate_results);
    tcase_add_test(tc, test_split_results);
    tcase_add_test(tc, test_many_episodes);
    tcase_add_test(tc, test_episode_wrap);
    tcase_add_test(tc, test_rank_exits_before_arriving);
    tcase_add_test(tc, test_rank_never_arrives);
    tcase_add_test(tc, test_settings_choose_gate);
    tcase_add_test(tc, test_gather_results);
    tcase_add_test(tc, test_gather_choice);
    tcase_add_test(tc, test_gather_rank_exits_before_arriving);
    tcase_add_test(tc, test_gather_rank_never_arrives);
    tcase_add_test(tc, test_gather_mismatch);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

/*
 * Conformance suite: every collective x dtype x op x size (0, 1, odd, pipeline
 * chunk and small-message boundaries +-1, optionally 64 MiB) on N ranks,
 * checked against a reference computed on one process, and allreduce results
 * compared bit for bit across ranks.
 *
 *   conformance NPROCS [--big]      (DSHIM_TRANSPORT picks shm or tcp)
 *
 * Values are small integers so every order of reduction is exact and the
 * reference is unambiguous for every dtype (fp8 included).
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "dshim.h"
#include "ranks.h"
#include "reduce/reduce.h"

#define CHUNK 4096      /* DSHIM_CHUNK_SIZE set for the ranks */
#define SMALL 2048      /* DSHIM_SMALL_MSG_SIZE set for the ranks */

typedef struct options {
    int big;
    int hosts; /* > 0: pretend the ranks live on this many hosts (rank % hosts) */
    char mark_dir[64]; /* made and removed by main: the ranks' arrival marks */
} options_t;

typedef struct suite {
    int big;
    int passed, failed;
    int rank, size;
    const char *mark_dir;
    dshim_comm_t *comm;
    const dshim_reduce_ops_t *ref;
} suite_t;

static int is_unsigned(dshim_dtype_t d)
{
    return d == DSHIM_UINT8 || d == DSHIM_UINT32 || d == DSHIM_UINT64;
}

static int value_of(dshim_dtype_t d, dshim_redop_t op, int rank, size_t i, int seed)
{
    unsigned h = (unsigned)(rank * 7 + (int)(i % 100003) * 13 + seed);
    switch (op) {
    case DSHIM_SUM:
    case DSHIM_AVG:
        return is_unsigned(d) ? (int)(h % 3) : (int)(h % 3) - 1;
    case DSHIM_PROD:
        if (is_unsigned(d)) {
            return (rank == 0 && i % 5 == 0) ? 2 : 1;
        }
        return (h % 2) ? 1 : -1;
    default:
        return is_unsigned(d) ? (int)((h * 31u) % 11u) : (int)((h * 31u) % 11u) - 5;
    }
}

static void store_value(void *buf, size_t i, dshim_dtype_t d, int v)
{
    switch (d) {
    case DSHIM_INT8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case DSHIM_UINT8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case DSHIM_INT32: ((int32_t *)buf)[i] = v; break;
    case DSHIM_UINT32: ((uint32_t *)buf)[i] = (uint32_t)v; break;
    case DSHIM_INT64: ((int64_t *)buf)[i] = v; break;
    case DSHIM_UINT64: ((uint64_t *)buf)[i] = (uint64_t)v; break;
    case DSHIM_FLOAT16: ((uint16_t *)buf)[i] = dshim_float_to_half((float)v); break;
    case DSHIM_BFLOAT16: ((uint16_t *)buf)[i] = dshim_float_to_bf16((float)v); break;
    case DSHIM_FLOAT32: ((float *)buf)[i] = (float)v; break;
    case DSHIM_FLOAT64: ((double *)buf)[i] = v; break;
    case DSHIM_FLOAT8_E4M3: ((uint8_t *)buf)[i] = dshim_float_to_fp8e4m3((float)v); break;
    case DSHIM_FLOAT8_E5M2: ((uint8_t *)buf)[i] = dshim_float_to_fp8e5m2((float)v); break;
    default: break;
    }
}

static void fill(void *buf, size_t count, dshim_dtype_t d, dshim_redop_t op, int rank, int seed)
{
    for (size_t i = 0; i < count; i++) {
        store_value(buf, i, d, value_of(d, op, rank, i, seed));
    }
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "conformance: out of memory (%zu bytes)\n", n);
        exit(3);
    }
    return p;
}

/* Reference of a reduction over all ranks' data, computed locally. */
static void *reference(suite_t *s, size_t count, dshim_dtype_t d, dshim_redop_t op, int seed)
{
    size_t es = dshim_dtype_size(d);
    void *acc = xmalloc(count * es), *tmp = xmalloc(count * es);
    fill(acc, count, d, op, 0, seed);
    dshim_redop_t base = op == DSHIM_AVG ? DSHIM_SUM : op;
    for (int r = 1; r < s->size; r++) {
        fill(tmp, count, d, op, r, seed);
        s->ref->reduce(acc, acc, tmp, count, d, base, NULL);
    }
    if (op == DSHIM_AVG) {
        s->ref->scale_div(acc, count, d, s->size, NULL);
    }
    free(tmp);
    return acc;
}

static void report(suite_t *s, int ok, const char *what, dshim_dtype_t d, dshim_redop_t op, size_t count,
                   dshim_status_t st)
{
    if (ok) {
        s->passed++;
        return;
    }
    s->failed++;
    if (s->failed <= 20) {
        fprintf(stderr, "FAIL rank %d/%d: %s %s %s count %zu: %s\n", s->rank, s->size, what, dshim_dtype_name(d),
                dshim_redop_name(op), count, st == DSHIM_OK ? "wrong result" : dshim_last_error());
    }
}

static uint64_t hash_bytes(const void *p, size_t n)
{
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) {
        h = (h ^ ((const unsigned char *)p)[i]) * 1099511628211ULL;
    }
    return h;
}

static void test_reductions(suite_t *s, dshim_dtype_t d, dshim_redop_t op, size_t count, int seed)
{
    size_t es = dshim_dtype_size(d);
    int n = s->size;
    void *ref = reference(s, count, d, op, seed);
    void *in = xmalloc(count * es), *out = xmalloc(count * es);
    dshim_status_t st;

    /* allreduce, out of place */
    fill(in, count, d, op, s->rank, seed);
    memset(out, 0xAB, count * es);
    st = dshim_allreduce(s->comm, in, out, count, d, op);
    int ok = st == DSHIM_OK && memcmp(out, ref, count * es) == 0;
    /* bit-identical across ranks */
    uint64_t h = hash_bytes(out, count * es), *hs = xmalloc(sizeof(uint64_t) * (size_t)n);
    if (dshim_allgather(s->comm, &h, hs, 1, DSHIM_UINT64) == DSHIM_OK) {
        for (int r = 0; r < n; r++) {
            ok &= hs[r] == h;
        }
    } else {
        ok = 0;
    }
    free(hs);
    report(s, ok, "allreduce", d, op, count, st);

    /* allreduce, in place, non-blocking */
    fill(out, count, d, op, s->rank, seed);
    dshim_request_t *req = NULL;
    st = dshim_iallreduce(s->comm, out, out, count, d, op, &req);
    if (st == DSHIM_OK) {
        st = dshim_wait(req);
        dshim_request_free(req);
    }
    report(s, st == DSHIM_OK && memcmp(out, ref, count * es) == 0, "iallreduce(in place)", d, op, count, st);

    /* reduce to a root that moves with the seed */
    int root = seed % n;
    memset(out, 0xAB, count * es);
    fill(in, count, d, op, s->rank, seed);
    st = dshim_reduce(s->comm, in, out, count, d, op, root);
    report(s, st == DSHIM_OK && (s->rank != root || memcmp(out, ref, count * es) == 0), "reduce", d, op, count, st);

    /* reduce_scatter: block b of the input is the reference's block b */
    size_t blk = count / (size_t)n;
    if (blk > 0) {
        void *big = xmalloc(blk * (size_t)n * es);
        void *bigref = reference(s, blk * (size_t)n, d, op, seed + 1);
        fill(big, blk * (size_t)n, d, op, s->rank, seed + 1);
        memset(out, 0xAB, blk * es);
        st = dshim_reduce_scatter(s->comm, big, out, blk, d, op);
        report(s, st == DSHIM_OK && memcmp(out, (char *)bigref + (size_t)s->rank * blk * es, blk * es) == 0,
               "reduce_scatter", d, op, blk, st);
        free(big);
        free(bigref);
    }

    /* reduce_scatterv: block r has (count + 3r) % (count + 2) elements (some
     * empty, some longer than count), non-blocking */
    {
        size_t *rc = xmalloc(sizeof(size_t) * (size_t)n), tot = 0, mine_at = 0;
        for (int r = 0; r < n; r++) {
            rc[r] = (count + 3 * (size_t)r) % (count + 2);
            mine_at += r < s->rank ? rc[r] : 0;
            tot += rc[r];
        }
        void *vin = xmalloc(tot * es), *vref = reference(s, tot, d, op, seed + 2);
        void *vout = xmalloc(rc[s->rank] * es + 1);
        fill(vin, tot, d, op, s->rank, seed + 2);
        memset(vout, 0xAB, rc[s->rank] * es + 1);
        dshim_request_t *vreq = NULL;
        st = dshim_ireduce_scatterv(s->comm, vin, vout, rc, d, op, &vreq);
        free(rc); /* the call keeps its own copy */
        if (st == DSHIM_OK) {
            st = dshim_wait(vreq);
            dshim_request_free(vreq);
        }
        size_t mine = (count + 3 * (size_t)s->rank) % (count + 2);
        report(s, st == DSHIM_OK && memcmp(vout, (char *)vref + mine_at * es, mine * es) == 0 &&
                      ((unsigned char *)vout)[mine * es] == 0xAB,
               "ireduce_scatterv", d, op, mine, st);
        free(vin);
        free(vref);
        free(vout);
    }
    free(in);
    free(out);
    free(ref);
}

static void test_data_movement(suite_t *s, dshim_dtype_t d, size_t count, int seed)
{
    size_t es = dshim_dtype_size(d);
    int n = s->size, me = s->rank;
    size_t total = count * (size_t)n;
    char *all = xmalloc(total * es), *out = xmalloc(total * es), *mine = xmalloc(count * es);
    for (int r = 0; r < n; r++) {
        fill(all + (size_t)r * count * es, count, d, DSHIM_MIN, r, seed);
    }
    memcpy(mine, all + (size_t)me * count * es, count * es);
    dshim_status_t st;
    int root = (seed + 1) % n;

    /* broadcast */
    memcpy(out, me == root ? all + (size_t)root * count * es : mine, count * es);
    if (me != root) {
        memset(out, 0xCD, count * es);
    }
    st = dshim_broadcast(s->comm, out, count, d, root);
    report(s, st == DSHIM_OK && memcmp(out, all + (size_t)root * count * es, count * es) == 0, "broadcast", d,
           DSHIM_SUM, count, st);

    /* allgather */
    memset(out, 0xCD, total * es);
    st = dshim_allgather(s->comm, mine, out, count, d);
    report(s, st == DSHIM_OK && memcmp(out, all, total * es) == 0, "allgather", d, DSHIM_SUM, count, st);

    /* gather / scatter */
    memset(out, 0xCD, total * es);
    st = dshim_gather(s->comm, mine, out, count, d, root);
    report(s, st == DSHIM_OK && (me != root || memcmp(out, all, total * es) == 0), "gather", d, DSHIM_SUM, count, st);
    memset(out, 0xCD, count * es);
    st = dshim_scatter(s->comm, all, out, count, d, root);
    report(s, st == DSHIM_OK && memcmp(out, mine, count * es) == 0, "scatter", d, DSHIM_SUM, count, st);

    /* alltoall: block j of rank i's input goes to rank j's block i.  Rank i's
     * input block j is generated from (i * n + j). */
    char *a_in = xmalloc(total * es), *a_out = xmalloc(total * es), *a_ref = xmalloc(total * es);
    for (int j = 0; j < n; j++) {
        fill(a_in + (size_t)j * count * es, count, d, DSHIM_MIN, me * n + j, seed);
        fill(a_ref + (size_t)j * count * es, count, d, DSHIM_MIN, j * n + me, seed);
    }
    memset(a_out, 0xCD, total * es);
    st = dshim_alltoall(s->comm, a_in, a_out, count, d);
    report(s, st == DSHIM_OK && memcmp(a_out, a_ref, total * es) == 0, "alltoall", d, DSHIM_SUM, count, st);

    /* uneven: rank r contributes count + r elements (allgatherv), and sends
     * (count + i + j) % (count + 2) elements from i to j (alltoallv) */
    size_t *cnt = xmalloc(sizeof(size_t) * (size_t)n * 4), *dsp = cnt + n, *rc = cnt + 2 * n, *rd = cnt + 3 * n;
    size_t tot = 0;
    for (int r = 0; r < n; r++) {
        cnt[r] = count + (size_t)r;
        dsp[r] = tot;
        tot += cnt[r];
    }
    char *v_ref = xmalloc(tot * es), *v_out = xmalloc(tot * es), *v_mine = xmalloc(cnt[me] * es);
    for (int r = 0; r < n; r++) {
        fill(v_ref + dsp[r] * es, cnt[r], d, DSHIM_MAX, r, seed);
    }
    memcpy(v_mine, v_ref + dsp[me] * es, cnt[me] * es);
    memset(v_out, 0xCD, tot * es);
    st = dshim_allgatherv(s->comm, v_mine, v_out, cnt, dsp, d);
    report(s, st == DSHIM_OK && memcmp(v_out, v_ref, tot * es) == 0, "allgatherv", d, DSHIM_SUM, count, st);

    size_t *sc = xmalloc(sizeof(size_t) * (size_t)n * 2), *sd = sc + n;
    size_t stot = 0, rtot = 0;
    for (int j = 0; j < n; j++) {
        sc[j] = (count + (size_t)me + (size_t)j) % (count + 2);
        sd[j] = stot;
        stot += sc[j];
        rc[j] = (count + (size_t)j + (size_t)me) % (count + 2);
        rd[j] = rtot;
        rtot += rc[j];
    }
    char *w_in = xmalloc(stot * es), *w_out = xmalloc(rtot * es), *w_ref = xmalloc(rtot * es);
    for (int j = 0; j < n; j++) {
        fill(w_in + sd[j] * es, sc[j], d, DSHIM_MIN, 1000 + me * n + j, seed);
        fill(w_ref + rd[j] * es, rc[j], d, DSHIM_MIN, 1000 + j * n + me, seed);
    }
    memset(w_out, 0xCD, rtot * es);
    st = dshim_alltoallv(s->comm, w_in, sc, sd, w_out, rc, rd, d);
    report(s, st == DSHIM_OK && memcmp(w_out, w_ref, rtot * es) == 0, "alltoallv", d, DSHIM_SUM, count, st);

    /* send/recv around a ring, non-blocking both ways */
    if (n > 1) {
        int right = (me + 1) % n, left = (me + n - 1) % n;
        char *rx = xmalloc(count * es);
        char *lref = all + (size_t)left * count * es;
        dshim_request_t *rs = NULL, *rr = NULL;
        memset(rx, 0xCD, count * es);
        st = dshim_isend(s->comm, mine, count, d, right, &rs);
        if (st == DSHIM_OK) {
            st = dshim_irecv(s->comm, rx, count, d, left, &rr);
        }
        dshim_status_t st2 = rs ? dshim_wait(rs) : st;
        dshim_status_t st3 = rr ? dshim_wait(rr) : st;
        dshim_request_free(rs);
        dshim_request_free(rr);
        if (st == DSHIM_OK) {
            st = st2 != DSHIM_OK ? st2 : st3;
        }
        report(s, st == DSHIM_OK && memcmp(rx, lref, count * es) == 0, "send/recv", d, DSHIM_SUM, count, st);
        free(rx);
    }
    free(w_in);
    free(w_out);
    free(w_ref);
    free(sc);
    free(v_ref);
    free(v_out);
    free(v_mine);
    free(cnt);
    free(a_in);
    free(a_out);
    free(a_ref);
    free(all);
    free(out);
    free(mine);
}

/* A barrier lets no rank out before every rank is in: each rank leaves a
 * mark in the job's directory before it (the last rank 0.1 s late), and
 * after it every mark must be there. */
static void test_barrier_waits(suite_t *s)
{
    const char *dir = s->mark_dir;
    char path[128];
    if (s->rank == s->size - 1) {
        usleep(100000);
    }
    snprintf(path, sizeof(path), "%s/%d", dir, s->rank);
    FILE *f = fopen(path, "w");
    int ok = f != NULL;
    if (f) {
        fclose(f);
    }
    dshim_status_t st = dshim_barrier(s->comm);
    ok &= st == DSHIM_OK;
    int missing = -1;
    for (int r = 0; r < s->size && missing < 0; r++) {
        snprintf(path, sizeof(path), "%s/%d", dir, r);
        if (access(path, F_OK) != 0) {
            missing = r;
        }
    }
    if (missing >= 0) {
        fprintf(stderr, "FAIL rank %d: left the barrier before rank %d arrived\n", s->rank, missing);
        ok = 0;
    }
    report(s, ok, "barrier waits for every rank", DSHIM_UINT64, DSHIM_MAX, 1, st);
}

/* A request waited for by another thread while this one goes on issuing:
 * the helper's dshim_wait may run the queue's head itself, the progress
 * thread may, and this thread's blocking calls take the engine at once when
 * it is idle (engine.c run_now).  Every rank issues the same calls in the
 * same order; only who runs them differs. */
typedef struct waiter_box {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    dshim_request_t *req; /* handed to the helper; NULL once it waited */
    dshim_status_t st;
    int quit;
} waiter_box_t;

static void *waiter_main(void *arg)
{
    waiter_box_t *b = arg;
    pthread_mutex_lock(&b->lock);
    while (!b->quit) {
        if (!b->req) {
            pthread_cond_wait(&b->cond, &b->lock);
            continue;
        }
        dshim_request_t *req = b->req;
        pthread_mutex_unlock(&b->lock);
        dshim_status_t st = dshim_wait(req);
        dshim_request_free(req);
        pthread_mutex_lock(&b->lock);
        b->st = st;
        b->req = NULL;
        pthread_cond_broadcast(&b->cond);
    }
    pthread_mutex_unlock(&b->lock);
    return NULL;
}

static void test_waiter_thread(suite_t *s)
{
    waiter_box_t b = {.st = DSHIM_OK};
    pthread_mutex_init(&b.lock, NULL);
    pthread_cond_init(&b.cond, NULL);
    pthread_t helper;
    int started = pthread_create(&helper, NULL, waiter_main, &b) == 0;
    int ok = started;
    dshim_status_t st = DSHIM_OK;
    int32_t want_x = 0, want_y = 0;
    for (int r = 0; r < s->size; r++) {
        want_x += r + 1;
        want_y += 2 * r;
    }
    for (int i = 0; ok && i < 300; i++) {
        int32_t x = s->rank + 1, xs = 0, y = 2 * s->rank, ys = 0;
        dshim_request_t *req = NULL;
        st = dshim_iallreduce(s->comm, &x, &xs, 1, DSHIM_INT32, DSHIM_SUM, &req);
        ok &= st == DSHIM_OK;
        if (!ok) {
            break;
        }
        pthread_mutex_lock(&b.lock);
        b.req = req;
        pthread_cond_broadcast(&b.cond);
        pthread_mutex_unlock(&b.lock);
        st = dshim_allreduce(s->comm, &y, &ys, 1, DSHIM_INT32, DSHIM_SUM);
        ok &= st == DSHIM_OK && ys == want_y;
        if (i % 3 == 0) {
            st = dshim_barrier(s->comm);
            ok &= st == DSHIM_OK;
        }
        pthread_mutex_lock(&b.lock);
        while (b.req) {
            pthread_cond_wait(&b.cond, &b.lock);
        }
        ok &= b.st == DSHIM_OK && xs == want_x;
        pthread_mutex_unlock(&b.lock);
    }
    if (started) {
        /* (a request handed over is always waited for: dshim_wait returns,
         * with the communicator's error if it failed) */
        pthread_mutex_lock(&b.lock);
        while (b.req) {
            pthread_cond_wait(&b.cond, &b.lock);
        }
        b.quit = 1;
        pthread_cond_broadcast(&b.cond);
        pthread_mutex_unlock(&b.lock);
        pthread_join(helper, NULL);
    }
    pthread_cond_destroy(&b.cond);
    pthread_mutex_destroy(&b.lock);
    report(s, ok, "blocking calls while another thread waits", DSHIM_INT32, DSHIM_SUM, 1, st);
}

static void test_split_and_barrier(suite_t *s)
{
    dshim_status_t st = dshim_barrier(s->comm);
    report(s, st == DSHIM_OK, "barrier", DSHIM_UINT64, DSHIM_MAX, 1, st);
    /* even and odd ranks, reverse order inside each half */
    dshim_comm_t *half = NULL;
    st = dshim_comm_split(s->comm, s->rank % 2, -s->rank, &half);
    int ok = st == DSHIM_OK && half != NULL;
    if (ok) {
        int hn = dshim_comm_size(half), hr = dshim_comm_rank(half);
        int expect_n = (s->size + (s->rank % 2 ? 0 : 1)) / 2;
        ok &= hn == expect_n && hr == (expect_n - 1 - s->rank / 2);
        int32_t v = s->rank, sum = 0, want = 0;
        for (int r = s->rank % 2; r < s->size; r += 2) {
            want += r;
        }
        st = dshim_allreduce(half, &v, &sum, 1, DSHIM_INT32, DSHIM_SUM);
        ok &= st == DSHIM_OK && sum == want;
        dshim_comm_destroy(half);
    }
    report(s, ok, "split", DSHIM_INT32, DSHIM_SUM, 1, st);
    /* color < 0 opts out */
    st = dshim_comm_split(s->comm, s->rank == 0 ? -1 : 1, 0, &half);
    ok = st == DSHIM_OK && ((s->rank == 0) == (half == NULL));
    if (half) {
        st = dshim_barrier(half);
        ok &= st == DSHIM_OK;
        dshim_comm_destroy(half);
    }
    report(s, ok, "split(opt out)", DSHIM_INT32, DSHIM_SUM, 1, st);
}

static int body(int rank, int size, int port, void *arg)
{
    suite_t s = {0};
    const options_t *opt = arg;
    s.big = opt->big;
    if (opt->hosts > 0) {
        char host[64];
        snprintf(host, sizeof(host), "fake-host-%d", rank % opt->hosts);
        setenv("DSHIM_HOST_ID", host, 1);
        dshim_config_reload();
    }
    s.rank = rank;
    s.size = size;
    s.mark_dir = opt->mark_dir;
    s.ref = dshim_reduce_cpu_ops("scalar");
    if (test_comm_init(rank, size, port, &s.comm) != 0) {
        return 2;
    }
    for (int d = 0; d < DSHIM_DTYPE_COUNT; d++) {
        size_t es = dshim_dtype_size((dshim_dtype_t)d);
        size_t sizes[] = {0, 1, 7, 1001, CHUNK / es - 1, CHUNK / es, CHUNK / es + 1, SMALL / es - 1, SMALL / es + 1,
                          (size_t)size * CHUNK / es + 3};
        int seed = 0;
        for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
            for (int op = 0; op < DSHIM_REDOP_COUNT; op++) {
                test_reductions(&s, (dshim_dtype_t)d, (dshim_redop_t)op, sizes[k], seed++);
            }
            test_data_movement(&s, (dshim_dtype_t)d, sizes[k], seed++);
        }
    }
    /* messages of several pieces of the split host gate (128-512 KiB each)
     * with ragged ends, through whatever auto or DSHIM_ALGO picks */
    test_reductions(&s, DSHIM_FLOAT64, DSHIM_SUM, ((size_t)1 << 20) / 8 + 1027, 7);
    test_reductions(&s, DSHIM_INT8, DSHIM_MAX, ((size_t)3 << 20) + 5, 8);
    if (s.big) {
        size_t count = (64u << 20) / sizeof(float);
        test_reductions(&s, DSHIM_FLOAT32, DSHIM_SUM, count, 5);
        test_data_movement(&s, DSHIM_FLOAT32, (16u << 20) / sizeof(float) / (size_t)size, 6);
    }
    test_split_and_barrier(&s);
    test_barrier_waits(&s);
    test_waiter_thread(&s);
    dshim_stats_t stats;
    dshim_comm_stats(s.comm, &stats);
    if (size > 1 && stats.bytes_sent == 0) {
        fprintf(stderr, "FAIL rank %d: no bytes went through dshim\n", rank);
        s.failed++;
    }
    char transport[16];
    snprintf(transport, sizeof(transport), "%s", dshim_comm_transport(s.comm));
    dshim_status_t st = dshim_comm_destroy(s.comm);
    if (st != DSHIM_OK) {
        fprintf(stderr, "FAIL rank %d: destroy: %s\n", rank, dshim_last_error());
        s.failed++;
    }
    if (rank == 0) {
        /* the plain summary line the CI reads */
        fprintf(stderr, "conformance np=%d %s: %d passed, %d failed\n", size, transport, s.passed,
                s.failed);
    }
    return s.failed ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: conformance NPROCS [--big] [--hosts K]\n");
        return 2;
    }
    int n = atoi(argv[1]);
    options_t opt = {0, 0, "/tmp/dshim-conformance.XXXXXX"};
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--big")) {
            opt.big = 1;
        } else if (!strcmp(argv[i], "--hosts") && i + 1 < argc) {
            opt.hosts = atoi(argv[++i]);
        } else {
            fprintf(stderr, "conformance: unknown argument %s\n", argv[i]);
            return 2;
        }
    }
    if (n < 1 || n > TEST_MAX_RANKS) {
        fprintf(stderr, "conformance: NPROCS must be 1..%d\n", TEST_MAX_RANKS);
        return 2;
    }
    char chunk[64], small[64];
    snprintf(chunk, sizeof(chunk), "DSHIM_CHUNK_SIZE=%d", CHUNK);
    snprintf(small, sizeof(small), "DSHIM_SMALL_MSG_SIZE=%d", SMALL);
    const char *env[] = {chunk, small, "DSHIM_SHM_RING_SIZE=65536", NULL};
    if (mkdtemp(opt.mark_dir) == NULL) {
        perror("conformance: mkdtemp");
        return 2;
    }
    test_rank_result_t *res = calloc((size_t)n, sizeof(*res));
    int rc = test_run_ranks(n, body, &opt, env, 1200.0, res);
    for (int r = 0; r < n; r++) {
        char mark[128];
        snprintf(mark, sizeof(mark), "%s/%d", opt.mark_dir, r);
        unlink(mark);
    }
    rmdir(opt.mark_dir);
    int failed = rc != 0;
    for (int r = 0; r < n; r++) {
        if (res[r].err[0]) {
            fprintf(stderr, "--- rank %d stderr ---\n%s", r, res[r].err);
        }
        if (!res[r].exited || res[r].code != 0) {
            fprintf(stderr, "rank %d %s %d after %.1f s\n", r, res[r].exited ? "exited with" : "killed by signal",
                    res[r].code, res[r].seconds);
            failed = 1;
        }
    }
    if (rc != 0) {
        fprintf(stderr, "conformance: timed out; remaining ranks were killed\n");
    }
    free(res);
    printf("conformance np=%d: %s\n", n, failed ? "FAILED" : "ok");
    return failed;
}

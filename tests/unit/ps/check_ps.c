/*
 * dshim's parameter server (shim/ps) without MXNet, in forked processes:
 * a scheduler, servers with the plain memory store, and workers.  Sync mode
 * sums every worker's push before answering, the first push initialises a key,
 * async mode without an updater is refused with a message, sharded keys,
 * pushpulls in pieces (DSHIM_PS_PIECE), pieces and whole pushes of one key in
 * one round, workers that cut a key differently (an error, not a wrong sum),
 * a command the servers refuse (that call fails, the job goes on),
 * and a killed worker ends every other process with an error naming it, a
 * worker that never pushes ends the job at the server's timeout with the story
 * naming it, the key, the round and the server; the
 * sums of every MXNet dtype (merged + recved, through the reduce backend) and
 * PS_VERBOSE's lines in dshim's log.  (The real MXNet runs in tests/mxnet;
 * this covers the protocol in the sanitizer builds.)
 */
#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>

#include "dshim.h"
#include "ck_free_port.h"
#include "net.h"
#include "ps.h"
#include "ps_log.h"
#include "reduce/reduce.h"

static int sleeper_pipe[2] = {-1, -1}; /* the parked worker (or server) writes its pid here */
/* 1: the server parks after the start-up barrier (the test kills it) and the
 * worker keeps sending requests to it: run_dead_server_worker; 2: the same
 * server, and one request that it never answers: run_silent_server_worker */
static int server_sleeps;
/* how the workers push after init, over several rounds: 0 whole parts; 1
 * pieces of piece_bytes; 2 rank 1 in pieces, the others whole (as when only
 * rank 1's server is on another host); 3 rank 1 in pieces of another size
 * (an error) */
static int piece_mode;
/* 1: the servers run an updater, stored += 0.5 * merged (keys of test_n
 * floats on one server), instead of storing the sum */
static int server_updater;
/* 1: worker 0 first sends a profiler command, which these servers (no MXNet)
 * refuse: that call fails with their reason and the job goes on */
static int refused_command;
static size_t test_n;
/* DSHIM_TIMEOUT of every process of a job (make_env) */
static double job_timeout_s = 30;
/* not NULL: a worker whose call fails must have this in its failure (exit 21), not any error (10) */
static const char *expect_failure;

static int half_sum_has_updater(void *ctx)
{
    (void)ctx;
    return 1;
}

static int half_sum_update(void *ctx, int key, void *recv_cookie, void *stored_cookie)
{
    (void)ctx, (void)key;
    const float *recv = recv_cookie; /* the plain store: a cookie is the data */
    float *stored = stored_cookie;
    for (size_t i = 0; i < test_n; i++) {
        stored[i] += 0.5f * recv[i];
    }
    return 0;
}
static const size_t piece_bytes = 3 * sizeof(float); /* 7 pieces of a 19-element part, the last short */

static void count_done(void *arg, int ok)
{
    int *left = arg;
    if (!ok) {
        __atomic_store_n(&left[1], 0, __ATOMIC_RELAXED);
    }
    __atomic_sub_fetch(&left[0], 1, __ATOMIC_ACQ_REL);
}

/* every part of key 3 as a pushpull in pieces; waits for their callbacks */
static dshim_status_t pushpull_in_pieces(dshim_ps_node_t *node, const dshim_ps_part_t *parts, int np,
                                         const float *v, float *out, size_t piece)
{
    int left[2] = {np, 1}; /* callbacks to come, all ok */
    for (int p = 0; p < np; p++) {
        dshim_ps_worker_pushpull_pieces(node, parts[p].server, 3, 0, v + parts[p].offset, parts[p].count * 4,
                                        out + parts[p].offset, piece, count_done, left);
    }
    double deadline = dshim_now() + 20;
    while (__atomic_load_n(&left[0], __ATOMIC_ACQUIRE) > 0 && dshim_now() < deadline) {
        usleep(1000);
    }
    if (__atomic_load_n(&left[0], __ATOMIC_ACQUIRE) > 0 || !__atomic_load_n(&left[1], __ATOMIC_RELAXED)) {
        fprintf(stderr, "a pushpull in pieces failed or did not end\n");
        return DSHIM_ERR_PEER;
    }
    return DSHIM_OK;
}

static dshim_ps_env_t make_env(dshim_ps_role_t role, int port, int nw, int ns)
{
    dshim_ps_env_t e;
    memset(&e, 0, sizeof(e));
    e.role = role;
    e.num_workers = nw;
    e.num_servers = ns;
    snprintf(e.root_uri, sizeof(e.root_uri), "127.0.0.1");
    e.root_port = port;
    e.resend_timeout_ms = 1000;
    e.bigarray_bound = 8;
    e.timeout_s = job_timeout_s;
    e.connect_timeout_s = 20;
    e.task_id = -1;
    return e;
}

static int run_scheduler(int port, int nw, int ns)
{
    dshim_ps_env_t e = make_env(DSHIM_PS_SCHEDULER, port, nw, ns);
    return dshim_ps_scheduler_run(&e) == DSHIM_OK ? 0 : 3;
}

static int run_server(int port, int nw, int ns)
{
    dshim_ps_env_t e = make_env(DSHIM_PS_SERVER, port, nw, ns);
    dshim_ps_node_t *node;
    if (dshim_ps_node_start(&e, &node) != DSHIM_OK) {
        return 4;
    }
    dshim_status_t st = dshim_ps_barrier(node, DSHIM_PS_GROUP_ALL);
    if (st == DSHIM_OK && server_sleeps) {
        pid_t me = getpid();
        ssize_t w = write(sleeper_pipe[1], &me, sizeof(me));
        (void)w;
        for (;;) {
            pause(); /* never reads a request; the test kills it */
        }
    }
    if (st == DSHIM_OK) {
        const dshim_ps_server_ops_t updater = {.has_updater = half_sum_has_updater, .update = half_sum_update};
        st = dshim_ps_server_run(node, server_updater ? &updater : NULL);
    }
    dshim_ps_node_finish(node, st != DSHIM_OK);
    return st == DSHIM_OK ? 0 : 5;
}

/* every worker pushes (rank + 1) * i for key 3 (n floats), sync mode: the
 * answer is the sum; then async without an updater must be an error */
static int run_worker(int port, int nw, int ns, size_t n, int sleep_forever_rank)
{
    dshim_ps_env_t e = make_env(DSHIM_PS_WORKER, port, nw, ns);
    dshim_ps_node_t *node;
    if (dshim_ps_node_start(&e, &node) != DSHIM_OK || dshim_ps_worker_connect(node) != DSHIM_OK ||
        dshim_ps_barrier(node, DSHIM_PS_GROUP_ALL) != DSHIM_OK) {
        return 6;
    }
    int rank = dshim_ps_node_rank(node);
    if (rank == 0 && dshim_ps_worker_command(node, DSHIM_PS_CMD_SYNC_MODE, "") != DSHIM_OK) {
        return 7;
    }
    if (rank == 0 && refused_command) {
        dshim_status_t st = dshim_ps_worker_command(node, DSHIM_PS_CMD_PROFILER, "11");
        if (st == DSHIM_OK || strstr(dshim_last_error(), "no profiler") == NULL ||
            strncmp(dshim_last_error(), "server ", 7) != 0) { /* names the server that said it first */
            fprintf(stderr, "worker 0: a profiler command to a server without one: %d, '%s'\n", st,
                    dshim_last_error());
            return 17;
        }
    }
    float *v = calloc(n, sizeof(float)), *out = calloc(n, sizeof(float));
    dshim_ps_part_t parts[8];
    int np = dshim_ps_layout(3, n, ns, e.bigarray_bound, 0, parts);
    if (rank == 0) {
        for (int p = 0; p < np; p++) { /* init: zeros */
            dshim_ps_worker_push(node, parts[p].server, 3, 0, v + parts[p].offset, parts[p].count * 4,
                                 parts[p].count, 0, 0, NULL, 0, NULL);
        }
        if (dshim_ps_worker_wait_all(node) != DSHIM_OK) {
            return 8;
        }
    }
    if (dshim_ps_barrier(node, DSHIM_PS_GROUP_WORKERS) != DSHIM_OK) {
        return 9;
    }
    if (rank == sleep_forever_rank) {
        pid_t me = getpid();
        ssize_t w = write(sleeper_pipe[1], &me, sizeof(me));
        (void)w;
        for (;;) {
            pause(); /* the test kills this one */
        }
    }
    const int rounds = piece_mode ? 3 : 1;
    float acc = 0; /* with the updater: what it added up to so far */
    for (int round = 0; round < rounds; round++) {
        for (size_t i = 0; i < n; i++) {
            v[i] = (float)((rank + 1 + round) * (int)i);
        }
        dshim_status_t st;
        if (piece_mode == 1 || (piece_mode >= 2 && rank == 1)) {
            st = pushpull_in_pieces(node, parts, np, v, out, piece_mode == 3 ? piece_bytes + 4 : piece_bytes);
        } else if (piece_mode == 3) {
            st = pushpull_in_pieces(node, parts, np, v, out, piece_bytes);
        } else {
            for (int p = 0; p < np; p++) {
                dshim_ps_worker_push(node, parts[p].server, 3, 0, v + parts[p].offset, parts[p].count * 4,
                                     parts[p].count, 0, 1, out + parts[p].offset, parts[p].count * 4, NULL);
            }
            st = dshim_ps_worker_wait_all(node);
        }
        if (st != DSHIM_OK && expect_failure != NULL) {
            const char *f = dshim_ps_failure(node);
            int found = f != NULL && strstr(f, expect_failure) != NULL;
            if (!found) {
                fprintf(stderr, "worker %d: expected '%s' in its failure, got '%s' (%s)\n", rank, expect_failure,
                        f ? f : "none", dshim_last_error());
            }
            dshim_ps_node_finish(node, 1);
            free(v);
            free(out);
            return found ? 21 : 10;
        }
        if (st != DSHIM_OK) {
            fprintf(stderr, "worker %d: %s\n", rank, dshim_last_error()[0] ? dshim_last_error() : "(the error above)");
            dshim_ps_node_finish(node, 1);
            free(v);
            free(out);
            return 10;
        }
        /* no optimizer on the servers: the value is the sum of this round's pushes */
        float factor = (float)(nw * (nw + 1) / 2 + nw * round);
        if (server_updater) {
            acc += 0.5f * factor;
            factor = acc;
        }
        for (size_t i = 0; i < n; i++) {
            if (out[i] != factor * (float)i) {
                fprintf(stderr, "worker %d: element %zu is %g, expected %g\n", rank, i, out[i], factor * (float)i);
                return 11;
            }
        }
    }
    free(v);
    free(out);
    /* before the barrier, as the MXNet hook does: rank 0 may stop the
     * servers before the others return from it */
    dshim_ps_worker_quiesce(node);
    if (dshim_ps_barrier(node, DSHIM_PS_GROUP_WORKERS) != DSHIM_OK) {
        return 12;
    }
    if (rank == 0 && dshim_ps_worker_command(node, DSHIM_PS_CMD_STOP_SERVER, "") != DSHIM_OK) {
        return 13;
    }
    return dshim_ps_node_finish(node, 0) == DSHIM_OK ? 0 : 14;
}

/* row_sparse rows (DSHIM_PS_F_ROWS): key 5 of ROWS x UNIT floats, sliced by
 * rows over the servers; rank 0 inits every row to 1, worker r pushes rows r
 * and 7 with r + 1 (no updater: the key becomes the sum, other rows 0), then
 * every worker pulls every row.  rows_mode 2: rank 1 also pushes a row id
 * outside a server's part, which that server must refuse. */
#define ROWS 10
#define UNIT 3
static int rows_mode;

static dshim_status_t push_rows_of(dshim_ps_node_t *node, const dshim_ps_part_t *parts, int np, const int64_t *ids,
                                   size_t k, float value)
{
    for (int p = 0; p < np; p++) {
        char buf[ROWS * (8 + UNIT * 4) + 8];
        size_t nr = 0;
        for (size_t i = 0; i < k; i++) {
            if ((size_t)ids[i] >= parts[p].offset && (size_t)ids[i] < parts[p].offset + parts[p].count) {
                ((int64_t *)buf)[nr++] = ids[i] - (int64_t)parts[p].offset;
            }
        }
        if (rows_mode == 2 && value == 2.0f) {
            ((int64_t *)buf)[nr++] = (int64_t)parts[p].count; /* one past the part */
        }
        for (size_t j = 0; j < nr * UNIT; j++) {
            ((float *)(buf + nr * 8))[j] = value;
        }
        dshim_status_t st = dshim_ps_worker_push_rows(node, parts[p].server, 5, 0, buf, nr * (8 + UNIT * 4),
                                                      parts[p].count, UNIT);
        if (st != DSHIM_OK) {
            return st;
        }
    }
    return dshim_ps_worker_wait_all(node);
}

static int run_rows_worker(int port, int nw, int ns)
{
    dshim_ps_env_t e = make_env(DSHIM_PS_WORKER, port, nw, ns);
    dshim_ps_node_t *node;
    if (dshim_ps_node_start(&e, &node) != DSHIM_OK || dshim_ps_worker_connect(node) != DSHIM_OK ||
        dshim_ps_barrier(node, DSHIM_PS_GROUP_ALL) != DSHIM_OK) {
        return 6;
    }
    int rank = dshim_ps_node_rank(node);
    if (rank == 0 && dshim_ps_worker_command(node, DSHIM_PS_CMD_SYNC_MODE, "") != DSHIM_OK) {
        return 7;
    }
    dshim_ps_part_t parts[8];
    int np = dshim_ps_row_layout(5, ROWS, UNIT, ns, e.bigarray_bound, parts);
    int64_t all[ROWS];
    for (int i = 0; i < ROWS; i++) {
        all[i] = i;
    }
    if (rank == 0 && push_rows_of(node, parts, np, all, ROWS, 1.0f) != DSHIM_OK) {
        return 8;
    }
    if (dshim_ps_barrier(node, DSHIM_PS_GROUP_WORKERS) != DSHIM_OK) {
        return 9;
    }
    const int64_t mine[2] = {rank, 7};
    float got[ROWS * UNIT];
    dshim_status_t st = push_rows_of(node, parts, np, mine, 2, (float)(rank + 1));
    for (int p = 0; p < np && st == DSHIM_OK; p++) {
        int64_t rel[ROWS];
        for (size_t i = 0; i < parts[p].count; i++) {
            rel[i] = (int64_t)i;
        }
        st = dshim_ps_worker_pull_rows(node, parts[p].server, 5, 0, rel, parts[p].count, parts[p].count, UNIT,
                                       got + parts[p].offset * UNIT, parts[p].count * UNIT * 4);
    }
    if (st == DSHIM_OK) {
        st = dshim_ps_worker_wait_all(node);
    }
    if (st != DSHIM_OK) {
        fprintf(stderr, "worker %d: %s\n", rank, dshim_last_error());
        int refused = strstr(dshim_last_error(), "outside this server's") != NULL;
        dshim_ps_node_finish(node, 1);
        return refused ? 20 : 10;
    }
    for (int r = 0; r < ROWS; r++) {
        float want = r == 7 ? (float)(nw * (nw + 1) / 2) : r < nw ? (float)(r + 1) : 0.0f;
        for (int j = 0; j < UNIT; j++) {
            if (got[r * UNIT + j] != want) {
                fprintf(stderr, "worker %d: row %d is %g, expected %g\n", rank, r, got[r * UNIT + j], want);
                return 11;
            }
        }
    }
    dshim_ps_worker_quiesce(node);
    if (dshim_ps_barrier(node, DSHIM_PS_GROUP_WORKERS) != DSHIM_OK) {
        return 12;
    }
    if (rank == 0 && dshim_ps_worker_command(node, DSHIM_PS_CMD_STOP_SERVER, "") != DSHIM_OK) {
        return 13;
    }
    return dshim_ps_node_finish(node, 0) == DSHIM_OK ? 0 : 14;
}

/* Counts how often each request's callback ran. */
static int end_counts[4096];

static void count_end(void *arg, int ok)
{
    (void)ok;
    __atomic_add_fetch((int *)arg, 1, __ATOMIC_ACQ_REL);
}

/* Sends requests (pushpulls in pieces and whole) to a server that the test
 * kills meanwhile, until the job's failure shows, then checks that every
 * request's callback ran exactly once: whether a send failed first or the
 * receiver thread failed the request first (both happen), never twice (a
 * double free of a piece group) nor never (a hang in MXNet's engine). */
static int run_dead_server_worker(int port)
{
    dshim_ps_env_t e = make_env(DSHIM_PS_WORKER, port, 1, 1);
    dshim_ps_node_t *node;
    if (dshim_ps_node_start(&e, &node) != DSHIM_OK || dshim_ps_worker_connect(node) != DSHIM_OK ||
        dshim_ps_barrier(node, DSHIM_PS_GROUP_ALL) != DSHIM_OK) {
        return 6;
    }
    static float v[16], out[16];
    const int max = (int)(sizeof(end_counts) / sizeof(end_counts[0]));
    int issued = 0, errors = 0;
    double stop_at = dshim_now() + 8;
    while (issued < max && errors < 50 && dshim_now() < stop_at) {
        dshim_status_t st =
            issued % 2 ? dshim_ps_worker_pushpull_pieces(node, 0, 3, 0, v, sizeof(v), out, 4 * sizeof(float),
                                                         count_end, &end_counts[issued])
                       : dshim_ps_worker_push_cb(node, 0, 3, 0, v, sizeof(v), 1, out, sizeof(out), count_end,
                                                 &end_counts[issued]);
        issued++;
        errors += st != DSHIM_OK;
        usleep(2000);
    }
    /* within the 3 s after which a failed job's process is ended (exit 1) */
    double deadline = dshim_now() + 2;
    for (int i = 0; i < issued; i++) {
        while (__atomic_load_n(&end_counts[i], __ATOMIC_ACQUIRE) == 0 && dshim_now() < deadline) {
            usleep(1000);
        }
    }
    usleep(100 * 1000); /* a second call would come now */
    int rc = errors ? 0 : 15; /* the server's death must show as errors */
    for (int i = 0; i < issued; i++) {
        int c = __atomic_load_n(&end_counts[i], __ATOMIC_ACQUIRE);
        if (c != 1) {
            fprintf(stderr, "request %d of %d: its callback ran %d times\n", i, issued, c);
            rc = 16;
        }
    }
    dshim_ps_node_finish(node, 1);
    return rc;
}

static int run_silent_server_worker(int port);

typedef struct job {
    pid_t pids[16];
    int n;
} job_t;

static void start(job_t *job, int port, int nw, int ns, size_t n, int sleeper)
{
    job->n = 0;
    for (int r = 0; r < 1 + ns + nw; r++) {
        pid_t pid = fork();
        if (pid == 0) {
            alarm(60);
            int rc = r == 0 ? run_scheduler(port, nw, ns)
                   : r <= ns ? run_server(port, nw, ns)
                   : server_sleeps == 2 ? run_silent_server_worker(port)
                   : server_sleeps ? run_dead_server_worker(port)
                   : rows_mode ? run_rows_worker(port, nw, ns)
                                   : run_worker(port, nw, ns, n, sleeper);
            _exit(rc);
        }
        job->pids[job->n++] = pid;
    }
}

static int wait_code(pid_t pid)
{
    int status;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void sync_sum_case(int nw, int ns, size_t n)
{
    job_t job;
    start(&job, ck_free_port(), nw, ns, n, -1);
    for (int i = 0; i < job.n; i++) {
        int rc = wait_code(job.pids[i]);
        ck_assert_msg(rc == 0, "process %d exited with %d", i, rc);
    }
}

START_TEST(sync_sum_one_server)
{
    sync_sum_case(2, 1, 5);
}
END_TEST

START_TEST(sync_sum_sharded_three_workers)
{
    sync_sum_case(3, 2, 37); /* 37 >= bound 8: split over both servers */
}
END_TEST

START_TEST(sync_sum_in_pieces)
{
    piece_mode = 1;
    sync_sum_case(3, 2, 37); /* parts of 18 and 19 elements, in pieces of 3 */
    sync_sum_case(2, 1, 5);  /* 2 pieces, the last of 2 elements */
    piece_mode = 0;
}
END_TEST

START_TEST(pieces_and_whole_pushes_mixed)
{
    piece_mode = 2;
    sync_sum_case(3, 2, 37); /* ranks 0 and 2 whole, rank 1 in pieces: the same sums */
    sync_sum_case(2, 1, 5);
    piece_mode = 0;
}
END_TEST

START_TEST(pieces_with_an_updater_on_the_server)
{
    /* every piece summed, one update of the whole key, then every answer */
    server_updater = 1;
    test_n = 37;
    piece_mode = 1;
    sync_sum_case(3, 1, 37);
    piece_mode = 2; /* and with a worker pushing whole */
    sync_sum_case(3, 1, 37);
    piece_mode = 0;
    server_updater = 0;
}
END_TEST

START_TEST(pieces_of_different_sizes_are_an_error)
{
    piece_mode = 3;
    job_t job;
    start(&job, ck_free_port(), 2, 1, 37, -1);
    double t0 = dshim_now();
    for (int i = 1 + 1; i < job.n; i++) { /* the workers: an error, not a wrong sum (11) nor success */
        int rc = wait_code(job.pids[i]);
        ck_assert_msg(rc == 10, "worker %d exited with %d, expected 10 (the error)", i - 2, rc);
    }
    for (int i = 0; i < 2; i++) {
        wait_code(job.pids[i]);
    }
    ck_assert_msg(dshim_now() - t0 < 15, "the job took %.1f s to end", dshim_now() - t0);
    piece_mode = 0;
}
END_TEST

START_TEST(row_sparse_rows_summed_and_pulled)
{
    rows_mode = 1;
    sync_sum_case(3, 2, 0); /* 30 values >= bound 8: rows 0-4 on one server, 5-9 on the other */
    sync_sum_case(2, 1, 0);
    rows_mode = 0;
}
END_TEST

START_TEST(row_sparse_row_outside_a_part_is_refused)
{
    rows_mode = 2;
    job_t job;
    start(&job, ck_free_port(), 2, 2, 0, -1);
    int refused = 0;
    for (int i = 1 + 2; i < job.n; i++) { /* the workers: none succeeds, one names the refusal */
        int rc = wait_code(job.pids[i]);
        ck_assert_msg(rc != 0 && rc != 11, "worker %d exited with %d", i - 3, rc);
        refused |= rc == 20;
    }
    for (int i = 0; i < 3; i++) {
        wait_code(job.pids[i]);
    }
    ck_assert_msg(refused, "no worker reported the server's refusal of the row id");
    rows_mode = 0;
}
END_TEST

START_TEST(a_refused_command_fails_that_call_only)
{
    refused_command = 1; /* forked processes see it; this test's own process ends after */
    sync_sum_case(2, 2, 5);
    refused_command = 0;
}
END_TEST

START_TEST(killed_worker_ends_everyone)
{
    job_t job;
    ck_assert_int_eq(pipe(sleeper_pipe), 0);
    start(&job, ck_free_port(), 2, 1, 5, 1);
    pid_t sleeper = 0;
    ck_assert_int_eq(read(sleeper_pipe[0], &sleeper, sizeof(sleeper)), (int)sizeof(sleeper));
    usleep(300 * 1000); /* rank 0 is waiting for the sleeper's push */
    int victim = -1;
    for (int i = 0; i < job.n; i++) {
        victim = job.pids[i] == sleeper ? i : victim;
    }
    ck_assert_int_ge(victim, 0);
    kill(sleeper, SIGKILL);
    double t0 = dshim_now();
    for (int i = 0; i < job.n; i++) {
        int rc = wait_code(job.pids[i]);
        if (i != victim) {
            ck_assert_msg(rc != 0, "process %d exited with 0 after a worker was killed", i);
        }
    }
    ck_assert_msg(dshim_now() - t0 < 10, "the job took %.1f s to end", dshim_now() - t0);
}
END_TEST

/* Worker 1 never pushes key 3 after its init: the server's round waits for
 * DSHIM_TIMEOUT, then the server ends the job with the one-line story, which
 * every worker gets as its failure; whole pushes and pushes in pieces. */
static void unpushed_round_case(int mode, const char *story)
{
    piece_mode = mode;
    job_timeout_s = 1.5;
    expect_failure = story;
    ck_assert_int_eq(pipe(sleeper_pipe), 0);
    job_t job;
    start(&job, ck_free_port(), 2, 1, 5, 1);
    pid_t sleeper = 0;
    ck_assert_int_eq(read(sleeper_pipe[0], &sleeper, sizeof(sleeper)), (int)sizeof(sleeper));
    double t0 = dshim_now();
    int checked = 0;
    for (int i = 2; i < job.n; i++) { /* the worker that pushed (rank 0: the sleeper is rank 1) */
        if (job.pids[i] != sleeper) {
            int rc = wait_code(job.pids[i]);
            ck_assert_msg(rc == 21, "worker (process %d) exited with %d, expected 21 (the story)", i, rc);
            checked = 1;
        }
    }
    ck_assert(checked);
    ck_assert_msg(wait_code(job.pids[1]) == 5, "the server did not end with an error");
    ck_assert_msg(dshim_now() - t0 < 15, "the job took %.1f s to end", dshim_now() - t0);
    kill(sleeper, SIGKILL); /* it would end by itself 3 s after the scheduler's notice */
    wait_code(sleeper);
    wait_code(job.pids[0]); /* the scheduler: ends once the server is gone */
    close(sleeper_pipe[0]);
    close(sleeper_pipe[1]);
    piece_mode = 0;
    job_timeout_s = 30;
    expect_failure = NULL;
}

START_TEST(a_worker_that_never_pushes_is_named_by_the_server)
{
    unpushed_round_case(0, "waits for key 3 round 1 from worker 1 (pushed by worker 0); worker 1 has pushed nothing "
                           "to it; no push of key 3 for ");
    unpushed_round_case(1, "waits for key 3 round 1 from worker 1 (pushed by worker 0, in pieces); worker 1 has "
                           "pushed nothing to it; no push of key 3 for ");
}
END_TEST

/* The server parks without reading (as a SIGSTOPped one): a pushpull with a
 * callback (MXNet's engine path, where no call waits with a timeout) fails on
 * the worker's own after DSHIM_TIMEOUT (+ the grace that lets a server's
 * timeout come first), naming the server and the request.  Exit 22 when so. */
static void silent_done(void *arg, int ok)
{
    __atomic_store_n((int *)arg, ok ? 1 : 2, __ATOMIC_RELEASE);
}

static int run_silent_server_worker(int port)
{
    dshim_ps_env_t e = make_env(DSHIM_PS_WORKER, port, 1, 1);
    dshim_ps_node_t *node;
    if (dshim_ps_node_start(&e, &node) != DSHIM_OK || dshim_ps_worker_connect(node) != DSHIM_OK ||
        dshim_ps_barrier(node, DSHIM_PS_GROUP_ALL) != DSHIM_OK) {
        return 6;
    }
    static float v[4], out[4];
    static int done;
    double t0 = dshim_now();
    if (dshim_ps_worker_push_cb(node, 0, 3, 0, v, sizeof(v), 1, out, sizeof(out), silent_done, &done) != DSHIM_OK) {
        return 7;
    }
    while (__atomic_load_n(&done, __ATOMIC_ACQUIRE) == 0 && dshim_now() - t0 < 20) {
        usleep(10 * 1000);
    }
    double took = dshim_now() - t0;
    const char *f = dshim_ps_failure(node);
    int rc = done == 2 && took >= e.timeout_s && f != NULL && strstr(f, "server 0 (pid") != NULL &&
                     strstr(f, "did not answer within") != NULL &&
                     strstr(f, "to its pushpull of key 3 (round 1)") != NULL &&
                     strstr(f, "the server is stopped or stuck") != NULL ? 22 : 8;
    if (rc != 22) {
        fprintf(stderr, "worker: callback %d after %.1f s, failure '%s'\n", done, took, f ? f : "none");
    }
    dshim_ps_node_finish(node, 1);
    return rc;
}

START_TEST(a_silent_server_times_out_on_the_worker)
{
    server_sleeps = 2;
    job_timeout_s = 1;
    job_t job;
    ck_assert_int_eq(pipe(sleeper_pipe), 0);
    start(&job, ck_free_port(), 1, 1, 4, -1);
    pid_t server = 0;
    ck_assert_int_eq(read(sleeper_pipe[0], &server, sizeof(server)), (int)sizeof(server));
    int worker_rc = wait_code(job.pids[2]);
    kill(server, SIGKILL);
    for (int i = 0; i < 2; i++) {
        wait_code(job.pids[i]);
    }
    close(sleeper_pipe[0]);
    close(sleeper_pipe[1]);
    server_sleeps = 0;
    job_timeout_s = 30;
    ck_assert_msg(worker_rc == 22, "the worker exited with %d, expected 22 (its own timeout naming the server)",
                  worker_rc);
}
END_TEST

START_TEST(requests_to_a_dead_server_end_once)
{
    server_sleeps = 1;
    job_t job;
    ck_assert_int_eq(pipe(sleeper_pipe), 0);
    start(&job, ck_free_port(), 1, 1, 16, -1);
    pid_t server = 0;
    ck_assert_int_eq(read(sleeper_pipe[0], &server, sizeof(server)), (int)sizeof(server));
    usleep(200 * 1000); /* the worker's first requests wait in the server's socket */
    kill(server, SIGKILL);
    int worker_rc = wait_code(job.pids[2]);
    for (int i = 0; i < 2; i++) {
        wait_code(job.pids[i]);
    }
    close(sleeper_pipe[0]);
    close(sleeper_pipe[1]);
    server_sleeps = 0;
    ck_assert_msg(worker_rc == 0, "the worker exited with %d (15: no request failed; 16: a callback ran 0 or 2 "
                  "times; 1: ended by the failed job's timer, waiting for a callback)", worker_rc);
}
END_TEST

/* merged + recved element by element, in MXNet's dtype, the way MXNet's
 * server computes it (half types widened, summed in float, rounded once) */
static void reference_sum(void *merged, const void *recved, size_t n, int dtype)
{
    for (size_t i = 0; i < n; i++) {
        switch (dtype) {
        case 0: ((float *)merged)[i] += ((const float *)recved)[i]; break;
        case 1: ((double *)merged)[i] += ((const double *)recved)[i]; break;
        case 2: {
            uint16_t *m = merged;
            m[i] = dshim_float_to_half(dshim_half_to_float(m[i]) + dshim_half_to_float(((const uint16_t *)recved)[i]));
            break;
        }
        case 3: ((uint8_t *)merged)[i] = (uint8_t)(((uint8_t *)merged)[i] + ((const uint8_t *)recved)[i]); break;
        case 4: ((uint32_t *)merged)[i] += ((const uint32_t *)recved)[i]; break; /* wraps */
        case 5: ((uint8_t *)merged)[i] = (uint8_t)(((uint8_t *)merged)[i] + ((const uint8_t *)recved)[i]); break;
        case 6: ((uint64_t *)merged)[i] += ((const uint64_t *)recved)[i]; break;
        case 12: {
            uint16_t *m = merged;
            m[i] = dshim_float_to_bf16(dshim_bf16_to_float(m[i]) + dshim_bf16_to_float(((const uint16_t *)recved)[i]));
            break;
        }
        }
    }
}

/* a value of dtype that is no NaN (whose payload x86 picks by operand order) */
static void fill_values(unsigned char *p, size_t n, int dtype, unsigned seed)
{
    size_t es = dshim_ps_dtype_size(dtype);
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        double v = (double)((int)(seed >> 8) % 200001 - 100000) / 64.0;
        switch (dtype) {
        case 0: ((float *)p)[i] = (float)v; break;
        case 1: ((double *)p)[i] = v * 1e-3; break;
        case 2: ((uint16_t *)p)[i] = dshim_float_to_half((float)v / 64.0f); break;
        case 12: ((uint16_t *)p)[i] = dshim_float_to_bf16((float)v); break;
        default: { /* any bits: sums wrap */
            uint64_t bits = (uint64_t)seed * 0x9e3779b97f4a7c15ull;
            memcpy(p + i * es, &bits, es);
            break;
        }
        }
    }
}

START_TEST(every_mxnet_dtype_sums_as_merged_plus_recved)
{
    static const int dtypes[] = {0, 1, 2, 3, 4, 5, 6, 12};
    const size_t n = 1000; /* odd tails for every vector width */
    for (size_t d = 0; d < sizeof(dtypes) / sizeof(dtypes[0]); d++) {
        int dtype = dtypes[d];
        size_t bytes = n * dshim_ps_dtype_size(dtype);
        unsigned char *merged = malloc(bytes), *recved = malloc(bytes), *want = malloc(bytes);
        ck_assert(merged && recved && want);
        fill_values(merged, n, dtype, 7u + (unsigned)d);
        fill_values(recved, n, dtype, 1000u + (unsigned)d);
        memcpy(want, merged, bytes);
        reference_sum(want, recved, n, dtype);
        ck_assert_int_eq(dshim_ps_add(merged, recved, n, dtype), DSHIM_OK);
        ck_assert_msg(memcmp(merged, want, bytes) == 0, "MXNet dtype %d: the sum differs from merged + recved", dtype);
        free(merged);
        free(recved);
        free(want);
    }
    float x = 1, y = 2;
    ck_assert_int_eq(dshim_ps_add(&x, &y, 1, 7), DSHIM_ERR_UNSUPPORTED); /* bool: MXNet has no sum either */
    ck_assert_ptr_nonnull(strstr(dshim_last_error(), "cannot sum arrays of MXNet dtype 7"));
}
END_TEST

/* PS_VERBOSE keeps ps-lite's meaning (1: INFO lines, 2: also TRACE) on top of
 * DSHIM_DEBUG, and the lines are dshim's (level, then the role and rank). */
/* The scheduler listens where the nodes reach it (DMLC_PS_ROOT_URI =
 * 127.0.0.1 here), not on every interface. */
START_TEST(scheduler_binds_the_root_uri)
{
    int port = ck_free_port();
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        _exit(run_scheduler(port, 1, 0));
    }
    char addr[32] = "";
    for (int i = 0; i < 250 && test_listen_addr(port, addr, sizeof(addr)) != 0; i++) {
        usleep(20000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    ck_assert_str_eq(addr, "127.0.0.1");
}
END_TEST

START_TEST(ps_verbose_lines_go_through_dshims_log)
{
    dshim_ps_env_t e = make_env(DSHIM_PS_WORKER, 1, 1, 1);
    dshim_log_init();
    dshim_log_level_current = DSHIM_LOG_WARN; /* DSHIM_DEBUG's default, whatever the caller's environment */
    ck_assert(!dshim_ps_log_on(&e, DSHIM_LOG_INFO));
    e.verbose = 1;
    ck_assert(dshim_ps_log_on(&e, DSHIM_LOG_INFO) && !dshim_ps_log_on(&e, DSHIM_LOG_TRACE));
    e.verbose = 2;
    ck_assert(dshim_ps_log_on(&e, DSHIM_LOG_TRACE));
    int p[2];
    ck_assert_int_eq(pipe(p), 0);
    int saved = dup(2);
    dup2(p[1], 2);
    DSHIM_PS_INFO(&e, 3, "registered: rank %d", 3);
    e.role = DSHIM_PS_SCHEDULER;
    e.verbose = 0;
    DSHIM_PS_INFO(&e, -1, "not shown at PS_VERBOSE=0");
    e.verbose = 1;
    DSHIM_PS_INFO(&e, -1, "all %d workers registered", 2);
    dup2(saved, 2);
    close(saved);
    close(p[1]);
    char out[2048] = "";
    ssize_t got = read(p[0], out, sizeof(out) - 1);
    close(p[0]);
    ck_assert(got > 0);
    ck_assert_msg(strstr(out, "DSHIM INFO [dshim-ps worker 3] registered: rank 3\n") != NULL, "%s", out);
    ck_assert_msg(strstr(out, "DSHIM INFO [dshim-ps scheduler] all 2 workers registered\n") != NULL, "%s", out);
    ck_assert_msg(strstr(out, "not shown") == NULL, "%s", out);
}
END_TEST

int main(void)
{
    Suite *su = suite_create("ps");
    TCase *tc = tcase_create("ps");
    tcase_set_timeout(tc, 90);
    tcase_add_test(tc, sync_sum_one_server);
    tcase_add_test(tc, sync_sum_sharded_three_workers);
    tcase_add_test(tc, sync_sum_in_pieces);
    tcase_add_test(tc, pieces_and_whole_pushes_mixed);
    tcase_add_test(tc, pieces_with_an_updater_on_the_server);
    tcase_add_test(tc, pieces_of_different_sizes_are_an_error);
    tcase_add_test(tc, a_refused_command_fails_that_call_only);
    tcase_add_test(tc, row_sparse_rows_summed_and_pulled);
    tcase_add_test(tc, row_sparse_row_outside_a_part_is_refused);
    tcase_add_test(tc, killed_worker_ends_everyone);
    tcase_add_test(tc, a_worker_that_never_pushes_is_named_by_the_server);
    tcase_add_test(tc, a_silent_server_times_out_on_the_worker);
    tcase_add_test(tc, requests_to_a_dead_server_end_once);
    tcase_add_test(tc, every_mxnet_dtype_sums_as_merged_plus_recved);
    tcase_add_test(tc, ps_verbose_lines_go_through_dshims_log);
    tcase_add_test(tc, scheduler_binds_the_root_uri);
    suite_add_tcase(su, tc);
    SRunner *sr = srunner_create(su);
    srunner_run_all(sr, CK_ENV);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

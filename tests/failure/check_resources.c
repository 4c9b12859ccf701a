/*
 * Failure behaviour when a resource of the machine runs out:
 *  - shm_full: the shared-memory directory (DSHIM_SHM_DIR) is a small tmpfs,
 *    as Docker's default 64 MiB /dev/shm is for enough ranks.  At every fill
 *    level (not rank 0's segment, no pair's rings, some pairs', all) each run must
 *    either succeed with right results (over shm, TCP or both) or fail with
 *    the one-line error; never a signal (tmpfs raises SIGBUS on a page it
 *    cannot give).  Needs root to mount the tmpfs: without it the case is
 *    skipped (exit 77 when it is the case asked for).
 *  - fd_limit: rank 0 (which hosts the rendezvous store) runs with
 *    RLIMIT_NOFILE lowered; the job must fail at once with an error naming
 *    EMFILE and the limit, on rank 0, instead of waiting out the connect
 *    timeout and blaming another rank, and without a flood of lines.
 * Each run is bounded by the ranks harness (tests/common/ranks.c).
 */
#include <check.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "dshim.h"
#include "ranks.h"

static void dump(const test_rank_result_t *res, int n)
{
    for (int r = 0; r < n; r++) {
        fprintf(stderr, "--- rank %d: %s %d after %.1f s\n%s", r, res[r].exited ? "exit" : "signal", res[r].code,
                res[r].seconds, res[r].err);
    }
}

static int count_of(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)) != NULL; p += strlen(needle)) {
        n++;
    }
    return n;
}

/* ---- shm_full ---------------------------------------------------------- */

#define MIB ((size_t)1 << 20)

/* Allreduces that fill the rings (4 MiB through 1 MiB rings), small ones
 * (the host gate, which lives in rank 0's segment), barriers and an
 * alltoall of 1 MiB per pair (every ring touched), each checked element by
 * element. */
static int body_shm(int rank, int size, int port, void *arg)
{
    (void)arg;
    dshim_comm_t *comm;
    if (test_comm_init(rank, size, port, &comm)) {
        fprintf(stderr, "ERROR: %s\n", dshim_last_error());
        return 3;
    }
    fprintf(stderr, "TRANSPORT %s\n", dshim_comm_transport(comm));
    static const size_t counts[] = {1024, 64 * 1024, 1024 * 1024};
    for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
        size_t n = counts[k];
        float *buf = malloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++) {
            buf[i] = (float)(rank + 1 + (int)(i % 7));
        }
        if (dshim_allreduce(comm, buf, buf, n, DSHIM_FLOAT32, DSHIM_SUM) != DSHIM_OK ||
            dshim_barrier(comm) != DSHIM_OK) {
            fprintf(stderr, "ERROR: %s\n", dshim_last_error());
            free(buf);
            dshim_comm_destroy(comm);
            return 3;
        }
        for (size_t i = 0; i < n; i++) {
            float want = (float)(size * (size + 1) / 2 + size * (int)(i % 7));
            if (buf[i] != want) {
                fprintf(stderr, "WRONG: element %zu of %zu is %g, expected %g\n", i, n, buf[i], want);
                free(buf);
                dshim_comm_destroy(comm);
                return 4;
            }
        }
        free(buf);
    }
    /* 1 MiB to every peer: every ring of every inbox full once */
    size_t block = 256 * 1024, total = block * (size_t)size;
    float *sb = malloc(total * sizeof(float)), *rb = malloc(total * sizeof(float));
    for (size_t i = 0; i < total; i++) {
        sb[i] = (float)(rank * 1000 + (int)(i / block)); /* block j goes to rank j */
    }
    int rc = 0;
    if (dshim_alltoall(comm, sb, rb, block, DSHIM_FLOAT32) != DSHIM_OK) {
        fprintf(stderr, "ERROR: %s\n", dshim_last_error());
        rc = 3;
    }
    for (size_t i = 0; rc == 0 && i < total; i++) {
        float want = (float)((int)(i / block) * 1000 + rank); /* from rank i / block */
        if (rb[i] != want) {
            fprintf(stderr, "WRONG: alltoall element %zu is %g, expected %g\n", i, rb[i], want);
            rc = 4;
        }
    }
    /* freed on every path: the ASan build's leak check would turn the exit code into 1 */
    free(sb);
    free(rb);
    if (dshim_comm_destroy(comm) != DSHIM_OK && rc == 0) {
        rc = 5;
    }
    return rc;
}

/* Mounts a tmpfs of `mib` MiB on a new directory; 0 or -1. */
static int mount_small(char *dir, size_t dir_len, size_t mib)
{
    snprintf(dir, dir_len, "/tmp/dshim-shmfull.XXXXXX");
    if (!mkdtemp(dir)) {
        return -1;
    }
    char opts[64];
    snprintf(opts, sizeof(opts), "size=%zuk,mode=0700", mib * 1024);
    if (mount("tmpfs", dir, "tmpfs", MS_NOSUID | MS_NODEV, opts) != 0) {
        rmdir(dir);
        return -1;
    }
    return 0;
}

static void unmount_small(const char *dir)
{
    if (umount2(dir, MNT_DETACH) != 0) {
        fprintf(stderr, "warning: cannot unmount %s\n", dir);
    }
    rmdir(dir);
}

typedef enum { FIT_NONE, FIT_FEW, FIT_SOME, FIT_ALL } fit_t;

/* tmpfs sizes in MiB.  What a rank reserves: at init its segment's header
 * (a few KiB) and, on rank 0, the host gate's area (n + 1 blocks of 1 MiB);
 * at each connection the pair's two rings (1 MiB each, DSHIM_SHM_RING_SIZE's
 * default).  The alltoall of body_shm connects every pair. */
static size_t tmpfs_mib(int n, fit_t fit)
{
    size_t rank0 = (size_t)n + 2, pairs = (size_t)n * (size_t)(n - 1) / 2;
    switch (fit) {
    case FIT_NONE: return 1;                       /* not rank 0's area, no pair's rings */
    case FIT_FEW: return rank0;                    /* rank 0's area, no pair's rings */
    case FIT_SOME: return rank0 + 2 * 2 + 1;       /* rank 0's area and two pairs */
    case FIT_ALL: return rank0 + pairs * 2 + 2;    /* everything, with room */
    }
    return 0;
}

/* A fallback's line: one per kind and rank, naming where, how much and the fixes. */
static int fallback_line_ok(const char *err, const char *needle, const char *dir)
{
    const char *line = strstr(err, needle);
    if (line == NULL) {
        return 1;
    }
    if (count_of(err, needle) > 1) {
        return 0;
    }
    while (line > err && line[-1] != '\n') {
        line--;
    }
    const char *end = strchr(line, '\n');
    char one[2048];
    size_t len = end ? (size_t)(end - line) : strlen(line);
    snprintf(one, sizeof(one), "%.*s", (int)(len < sizeof(one) - 1 ? len : sizeof(one) - 1), line);
    return strstr(one, "cannot reserve") && strstr(one, dir) && strstr(one, "MiB") && strstr(one, "--shm-size") &&
           strstr(one, "DSHIM_SHM_RING_SIZE");
}

/* One run: n ranks on a tmpfs sized for `fit`, DSHIM_TRANSPORT `transport`.
 * The mount is undone before any assertion (a failed one ends the test). */
static void run_shm(int n, fit_t fit, const char *transport)
{
    char dir[64];
    size_t mib = tmpfs_mib(n, fit);
    ck_assert_msg(mount_small(dir, sizeof(dir), mib) == 0, "cannot mount a %zu MiB tmpfs", mib);
    char dir_env[96], tr_env[64];
    snprintf(dir_env, sizeof(dir_env), "DSHIM_SHM_DIR=%s", dir);
    snprintf(tr_env, sizeof(tr_env), "DSHIM_TRANSPORT=%s", transport);
    const char *env[] = {dir_env, tr_env, "DSHIM_TIMEOUT=30", "DSHIM_CONNECT_TIMEOUT=30", NULL};
    test_rank_result_t res[4];
    int rc = test_run_ranks(n, body_shm, NULL, env, 60.0, res);
    unmount_small(dir);

    int signalled = 0, ok = 0, warned = 0, failed = 0, named = 0;
    for (int r = 0; r < n; r++) {
        signalled += !res[r].exited;
    }
    /* first, the crash this is about */
    if (rc != 0 || signalled) {
        dump(res, n);
    }
    ck_assert_msg(rc == 0, "n=%d %zu MiB: the run did not end in time", n, mib);
    ck_assert_msg(signalled == 0, "n=%d %zu MiB (%s): a rank died of a signal (SIGBUS: an overcommitted tmpfs)", n,
                  mib, transport);
    for (int r = 0; r < n; r++) {
        ok += res[r].exited && res[r].code == 0;
        failed += res[r].exited && res[r].code == 3;
        named += strstr(res[r].err, "cannot reserve") && strstr(res[r].err, dir) && strstr(res[r].err, "--shm-size");
        /* the two fallbacks: a rank whose segment did not fit (it talks TCP with its host), and a pair
         * whose rings did not (the accepting rank's line) */
        warned += strstr(res[r].err, "shared memory unavailable") || strstr(res[r].err, " instead (and so does");
        if (!fallback_line_ok(res[r].err, "shared memory unavailable", dir) ||
            !fallback_line_ok(res[r].err, " instead (and so does", dir)) {
            dump(res, n);
            ck_abort_msg("n=%d %zu MiB: rank %d's fallback must be one line naming the directory, the size "
                         "and the fixes", n, mib, r);
        }
    }
    if (strcmp(transport, "shm") == 0 && fit != FIT_ALL) {
        /* no quiet TCP: the job fails, the rank that could not reserve says what, where and how to fix */
        if (failed != n || named == 0) {
            dump(res, n);
        }
        ck_assert_msg(failed == n, "n=%d %zu MiB, DSHIM_TRANSPORT=shm: %d of %d ranks failed cleanly", n, mib,
                      failed, n);
        ck_assert_msg(named >= 1, "n=%d %zu MiB, DSHIM_TRANSPORT=shm: no rank named the directory and the size",
                      n, mib);
        return;
    }
    if (ok != n || (fit != FIT_SOME && (fit == FIT_ALL) != (warned == 0))) {
        dump(res, n);
    }
    ck_assert_msg(ok == n, "n=%d %zu MiB: %d of %d ranks succeeded with right results", n, mib, ok, n);
    if (fit == FIT_ALL) {
        ck_assert_msg(warned == 0 && count_of(res[0].err, "TRANSPORT shm\n") == 1,
                      "n=%d %zu MiB: all fit, yet %d ranks warned", n, mib, warned);
    } else if (fit != FIT_SOME) {
        ck_assert_msg(warned >= 1, "n=%d %zu MiB: nothing fits, yet no rank warned", n, mib);
    }
}

START_TEST(test_shm_full_2)
{
    run_shm(2, FIT_NONE, "auto");
    run_shm(2, FIT_SOME, "auto");
    run_shm(2, FIT_ALL, "auto");
}
END_TEST

START_TEST(test_shm_full_3)
{
    run_shm(3, FIT_FEW, "auto");
    run_shm(3, FIT_SOME, "auto");
    run_shm(3, FIT_ALL, "auto");
}
END_TEST

START_TEST(test_shm_full_4)
{
    run_shm(4, FIT_FEW, "auto"); /* SIGBUS when the pages were taken at first touch */
    run_shm(4, FIT_NONE, "auto");
    run_shm(4, FIT_SOME, "auto");
    run_shm(4, FIT_ALL, "auto");
}
END_TEST

/* DSHIM_TRANSPORT=shm: no quiet TCP; the job fails with the line, whether
 * rank 0's segment (NONE) or a pair's rings (FEW) did not fit */
START_TEST(test_shm_full_transport_shm)
{
    run_shm(3, FIT_NONE, "shm");
    run_shm(3, FIT_FEW, "shm");
}
END_TEST

/* ---- fd_limit ---------------------------------------------------------- */

#define FD_RANKS 12
#define FD_LIMIT 16

/* The limit rank 0 had: given back before it exits, so that what runs at
 * exit (LeakSanitizer reads /proc/self/maps in the ASan build) can open
 * files. */
static struct rlimit saved_nofile;

static int body_fd_limit(int rank, int size, int port, void *arg)
{
    (void)arg;
    if (rank == 0) {
        struct rlimit rl;
        getrlimit(RLIMIT_NOFILE, &rl);
        saved_nofile = rl;
        rl.rlim_cur = FD_LIMIT;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
            fprintf(stderr, "cannot lower RLIMIT_NOFILE\n");
            return 9;
        }
    }
    dshim_comm_t *comm;
    if (test_comm_init(rank, size, port, &comm)) {
        if (rank == 0) {
            setrlimit(RLIMIT_NOFILE, &saved_nofile);
        }
        return 3;
    }
    /* when every peer joined before the store ran out, rank 0 joins too
     * and meets the failure here: the peers are gone */
    if (dshim_barrier(comm) != DSHIM_OK) {
        fprintf(stderr, "ERROR: %s\n", dshim_last_error());
        if (rank == 0) {
            setrlimit(RLIMIT_NOFILE, &saved_nofile);
        }
        dshim_comm_destroy(comm);
        return 3;
    }
    dshim_comm_destroy(comm);
    return 0;
}

START_TEST(test_fd_limit_fails_fast_naming_emfile)
{
    /* a connect timeout far above the bound below: waiting it out fails */
    const char *env[] = {"DSHIM_CONNECT_TIMEOUT=60", "DSHIM_TIMEOUT=60", NULL};
    test_rank_result_t res[FD_RANKS];
    int rc = test_run_ranks(FD_RANKS, body_fd_limit, NULL, env, 45.0, res);
    const char *e0 = res[0].err;
    int ok = rc == 0 && res[0].exited && res[0].code == 3 && strstr(e0, "EMFILE") &&
             strstr(e0, "raise ulimit -n (now 16)") && res[0].seconds < 10.0 &&
             count_of(e0, "accept failed") == 0 && count_of(e0, "cannot accept a connection") <= 5;
    if (!ok) {
        dump(res, FD_RANKS);
    }
    ck_assert_msg(rc == 0, "the job did not end within 45 s (it waited for the connect timeout)");
    ck_assert_msg(res[0].exited && res[0].code == 3, "rank 0 must fail its init or first barrier (%s %d)",
                  res[0].exited ? "exit" : "signal", res[0].code);
    ck_assert_msg(strstr(e0, "EMFILE") && strstr(e0, "raise ulimit -n (now 16)"),
                  "rank 0's error must name EMFILE and the limit");
    ck_assert_msg(res[0].seconds < 10.0, "rank 0 failed after %.1f s, not at once", res[0].seconds);
    ck_assert_msg(count_of(e0, "accept failed") == 0 && count_of(e0, "cannot accept a connection") <= 5,
                  "rank 0 repeated its warning");
    for (int r = 1; r < FD_RANKS; r++) {
        ck_assert_msg(res[r].exited, "rank %d died of signal %d", r, res[r].code);
        ck_assert_msg(res[r].seconds < 20.0, "rank %d ended after %.1f s", r, res[r].seconds);
    }
}
END_TEST

/* The data listener: rank 0 joins with descriptors to spare, then has none
 * left (the limit at what it holds) before rank 1 connects to it on first
 * use; its acceptor's EMFILE must fail rank 0's communicator at once with
 * the line, and spin no core (before: `continue`, a busy loop). */
static int body_listener_fds(int rank, int size, int port, void *arg)
{
    (void)arg;
    dshim_comm_t *comm;
    if (test_comm_init(rank, size, port, &comm)) {
        return 2;
    }
    int v = 1;
    dshim_status_t st;
    if (rank == 0) {
        /* no descriptor left: the highest one open is below the limit */
        struct rlimit rl;
        getrlimit(RLIMIT_NOFILE, &rl);
        saved_nofile = rl;
        int highest = -1;
        DIR *d = opendir("/proc/self/fd");
        struct dirent *e;
        while (d && (e = readdir(d)) != NULL) {
            int fd = atoi(e->d_name);
            if (e->d_name[0] != '.' && fd > highest && fd != dirfd(d)) {
                highest = fd;
            }
        }
        if (d) {
            closedir(d);
        }
        rl.rlim_cur = (rlim_t)highest + 1;
        setrlimit(RLIMIT_NOFILE, &rl);
        while (open("/dev/null", O_RDONLY) >= 0) {
            /* the free slots below the limit: taken too */
        }
        struct timespec ts = {1, 0}; /* rank 1's connect arrives at the acceptor first */
        nanosleep(&ts, NULL);
        st = dshim_recv(comm, &v, 1, DSHIM_INT32, 1);
        setrlimit(RLIMIT_NOFILE, &saved_nofile); /* for what runs at exit */
    } else {
        struct timespec ts = {0, 300000000}; /* after rank 0 lowered its limit */
        nanosleep(&ts, NULL);
        st = dshim_send(comm, &v, 1, DSHIM_INT32, 0);
    }
    if (st != DSHIM_OK) {
        fprintf(stderr, "ERROR: %s\n", dshim_last_error());
        dshim_comm_destroy(comm);
        return 3;
    }
    dshim_comm_destroy(comm);
    return 0;
}

START_TEST(test_data_listener_out_of_fds)
{
    const char *env[] = {"DSHIM_TRANSPORT=tcp", "DSHIM_TIMEOUT=30", NULL};
    test_rank_result_t res[2];
    int rc = test_run_ranks(2, body_listener_fds, NULL, env, 40.0, res);
    const char *e0 = res[0].err;
    int ok = rc == 0 && res[0].exited && res[0].code == 3 && strstr(e0, "ERROR: ") && strstr(e0, "EMFILE") &&
             strstr(e0, "data listener") && res[0].seconds < 10.0 && res[1].exited && res[1].seconds < 20.0;
    if (!ok) {
        dump(res, 2);
    }
    ck_assert_msg(rc == 0, "the run did not end in time");
    ck_assert_msg(res[0].exited && res[0].code == 3, "rank 0's receive must fail");
    ck_assert_msg(strstr(e0, "ERROR: ") && strstr(e0, "EMFILE") && strstr(e0, "data listener"),
                  "rank 0's error must name its data listener and EMFILE");
    ck_assert_msg(res[0].seconds < 10.0, "rank 0 failed after %.1f s", res[0].seconds);
    ck_assert_msg(res[1].exited && res[1].seconds < 20.0, "rank 1 ended after %.1f s", res[1].seconds);
}
END_TEST

static Suite *resources_suite(int with_shm)
{
    Suite *s = suite_create("resources");
    if (with_shm) {
        TCase *tc = tcase_create("shm_full");
        tcase_set_timeout(tc, 300);
        tcase_add_test(tc, test_shm_full_2);
        tcase_add_test(tc, test_shm_full_3);
        tcase_add_test(tc, test_shm_full_4);
        tcase_add_test(tc, test_shm_full_transport_shm);
        suite_add_tcase(s, tc);
    }
    TCase *fd = tcase_create("fd_limit");
    tcase_set_timeout(fd, 120);
    tcase_add_test(fd, test_fd_limit_fails_fast_naming_emfile);
    tcase_add_test(fd, test_data_listener_out_of_fds);
    suite_add_tcase(s, fd);
    return s;
}

int main(void)
{
    /* mounting a tmpfs needs root (CAP_SYS_ADMIN) */
    const char *only = getenv("CK_RUN_CASE");
    int root = geteuid() == 0;
    if (!root) {
        if (only && !strcmp(only, "shm_full")) {
            fprintf(stderr, "SKIP: shm_full mounts a small tmpfs and needs root\n");
            return 77;
        }
        fprintf(stderr, "note: shm_full skipped: it mounts a small tmpfs and needs root\n");
    }
    SRunner *sr = srunner_create(resources_suite(root));
    srunner_set_fork_status(sr, CK_FORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

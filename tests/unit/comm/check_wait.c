/*
 * Unit tests of the wait rule (shim/comm/wait.h), the one place that decides
 * when a waiting operation marks its arrival, warns of a stall, times out
 * and what its failure says and keeps: driven here with made-up clocks and
 * a made-up source of missing ranks on a real one-rank communicator (its
 * store answers the arrival marks; its failure path is the real one).
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ck_free_port.h"
#include "comm.h"
#include "dshim.h"
#include "wait.h"

/* what a test's source reports, and how often the rule asked it */
typedef struct fake {
    int missing[8];
    int nmissing;
    int doing_calls, waiting_calls, moving_calls;
} fake_t;

static void fake_doing(dshim_comm_t *comm, void *ctx, char *out, size_t len)
{
    (void)comm;
    ((fake_t *)ctx)->doing_calls++;
    snprintf(out, len, "waiting for the test");
}

static int fake_missing(dshim_comm_t *comm, void *ctx, uint64_t seq, int *out, int *store_silent)
{
    (void)comm;
    (void)seq;
    (void)store_silent;
    fake_t *f = ctx;
    for (int i = 0; i < f->nmissing; i++) {
        out[i] = f->missing[i];
    }
    return f->nmissing;
}

static void fake_waiting(dshim_comm_t *comm, void *ctx)
{
    (void)comm;
    ((fake_t *)ctx)->waiting_calls++;
}

static void fake_moving(dshim_comm_t *comm, void *ctx)
{
    (void)comm;
    ((fake_t *)ctx)->moving_calls++;
}

static int port;

/* A one-rank communicator with the given timeout; its wait rule's list has
 * room for 8 ranks (the sources below name ranks it does not have). */
static dshim_comm_t *make_comm(double timeout_s)
{
    port = ck_free_port();
    dshim_comm_args_t a = {.rank = 0, .size = 1, .store_addr = "127.0.0.1", .store_port = port, .token = "t"};
    dshim_comm_t *c = NULL;
    ck_assert_msg(dshim_comm_init(&a, &c) == DSHIM_OK, "one-rank communicator: %s", dshim_last_error());
    ck_assert_int_eq(dshim_comm_set_timeout(c, timeout_s), DSHIM_OK);
    free(c->wait_ranks);
    c->wait_ranks = calloc(8, sizeof(int));
    return c;
}

static const dshim_coll_sig_t allreduce7 = {.coll = DSHIM_COLL_ALLREDUCE, .root = -1, .count = 4, .seq = 7};

START_TEST(test_list_words)
{
    dshim_comm_t *c = make_comm(3);
    char out[384];
    int two[] = {2, 5};
    dshim_wait_list(c, two, 2, out, sizeof(out));
    ck_assert_str_eq(out, "2, 5");
    dshim_wait_list(c, two, 0, out, sizeof(out));
    ck_assert_str_eq(out, "none known (check the other ranks' logs)");
    dshim_wait_list(c, NULL, -1, out, sizeof(out));
    char want[64];
    snprintf(want, sizeof(want), "unknown (the rendezvous store at 127.0.0.1:%d did not answer", port);
    ck_assert_msg(strncmp(out, want, strlen(want)) == 0, "%s", out);
    ck_assert_ptr_null(strchr(out, ';')); /* a list ends at the next ';' */
    /* a sub-communicator names each rank's job rank too */
    int job[] = {0, 3, 4, 6, 7, 9};
    c->job_rank = job;
    int one[] = {1};
    dshim_wait_list(c, one, 1, out, sizeof(out));
    ck_assert_str_eq(out, "1 (job rank 3)");
    c->job_rank = NULL;
    dshim_comm_destroy(c);
}
END_TEST

START_TEST(test_sleep_bounded_by_timeout)
{
    dshim_comm_t *c = make_comm(3);
    fake_t f = {.nmissing = 1, .missing = {2}};
    dshim_wait_source_t src = {fake_doing, fake_missing, fake_waiting, fake_moving, &f};
    dshim_wait_t w;
    dshim_wait_init(&w, &allreduce7, &src);
    w.stall_s = w.warn_after = 0; /* no warnings */
    w.announced = 1;              /* no store */
    dshim_wait_idle(&w, 100.0);
    int ms = -1;
    ck_assert_int_eq(dshim_wait_look(c, &w, 100.5, 100, &ms), DSHIM_OK);
    ck_assert_int_eq(ms, 100);
    ck_assert_int_eq(dshim_wait_look(c, &w, 102.95, 100, &ms), DSHIM_OK);
    ck_assert_msg(ms >= 49 && ms <= 51, "sleeps %d ms with 50 ms left", ms);
    ck_assert_int_eq(dshim_wait_look(c, &w, 103.0, 100, &ms), DSHIM_OK); /* at the timeout: not past it */
    ck_assert_int_eq(f.doing_calls, 0);
    dshim_comm_destroy(c);
}
END_TEST

START_TEST(test_stall_warnings)
{
    dshim_comm_t *c = make_comm(10);
    fake_t f = {.nmissing = 1, .missing = {2}};
    dshim_wait_source_t src = {fake_doing, fake_missing, fake_waiting, fake_moving, &f};
    dshim_wait_t w;
    dshim_wait_init(&w, &allreduce7, &src);
    w.stall_s = w.warn_after = 1.0;
    w.announced = 1;
    int ms;
    dshim_wait_idle(&w, 100.0);
    const double at[] = {100.5, 101.0, 101.5, 102.0};
    const int warned[] = {0, 1, 1, 2};
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(dshim_wait_look(c, &w, at[i], 100, &ms), DSHIM_OK);
        ck_assert_msg(f.doing_calls == warned[i], "at +%.1f s: %d warnings, want %d", at[i] - 100, f.doing_calls,
                      warned[i]);
    }
    /* data moved: the next idle spell counts again from its start */
    dshim_wait_idle(&w, 102.2);
    ck_assert_int_eq(dshim_wait_look(c, &w, 102.7, 100, &ms), DSHIM_OK);
    ck_assert_int_eq(f.doing_calls, 2);
    ck_assert_int_eq(dshim_wait_look(c, &w, 103.2, 100, &ms), DSHIM_OK);
    ck_assert_int_eq(f.doing_calls, 3);
    dshim_comm_destroy(c);
}
END_TEST

/* This rank's arrival mark in the store: its value, or -1 when unset. */
static long long arrival_mark(dshim_comm_t *c)
{
    char key[160];
    snprintf(key, sizeof(key), "%sat/0", c->prefix);
    void *val = NULL;
    size_t len = 0;
    if (dshim_store_try_get(c->store->store, key, &val, &len) != DSHIM_OK) {
        return -1;
    }
    long long v = strtoll(val, NULL, 10);
    free(val);
    return v;
}

START_TEST(test_arrival_mark_after_a_second)
{
    dshim_comm_t *c = make_comm(10);
    fake_t f = {0};
    dshim_wait_source_t src = {fake_doing, fake_missing, fake_waiting, fake_moving, &f};
    dshim_wait_t w;
    dshim_wait_init(&w, &allreduce7, &src);
    w.stall_s = w.warn_after = 0;
    int ms;
    dshim_wait_idle(&w, 100.0);
    ck_assert_int_eq(dshim_wait_look(c, &w, 100.9, 100, &ms), DSHIM_OK);
    ck_assert_int_eq(arrival_mark(c), -1);
    /* a new idle spell does not restart the arrival's clock */
    dshim_wait_idle(&w, 100.95);
    ck_assert_int_eq(dshim_wait_look(c, &w, 101.1, 100, &ms), DSHIM_OK);
    ck_assert_int_eq(arrival_mark(c), 7);
    /* point-to-point numbers are per peer: they never mark */
    dshim_coll_sig_t p2p = {.coll = DSHIM_COLL_P2P, .root = -1, .seq = 9};
    dshim_wait_init(&w, &p2p, &src);
    w.stall_s = w.warn_after = 0;
    dshim_wait_idle(&w, 100.0);
    ck_assert_int_eq(dshim_wait_look(c, &w, 105.0, 100, &ms), DSHIM_OK);
    ck_assert_int_eq(arrival_mark(c), 7);
    dshim_comm_destroy(c);
}
END_TEST

START_TEST(test_recorder_marks)
{
    dshim_comm_t *c = make_comm(10);
    if (!c->trace) {
        dshim_comm_destroy(c);
        return; /* the recorder is off (DSHIM_TRACE_BUFFER=0): nothing to mark */
    }
    fake_t f = {0};
    dshim_wait_source_t src = {fake_doing, fake_missing, fake_waiting, fake_moving, &f};
    dshim_wait_t w;
    dshim_wait_init(&w, &allreduce7, &src);
    w.stall_s = w.warn_after = 0;
    w.announced = 1;
    int ms;
    dshim_wait_moving(c, &w); /* never said waiting: nothing to undo */
    ck_assert_int_eq(f.moving_calls, 0);
    dshim_wait_idle(&w, 100.0);
    ck_assert_int_eq(dshim_wait_look(c, &w, 100.1, 100, &ms), DSHIM_OK);
    ck_assert_int_eq(dshim_wait_look(c, &w, 100.2, 100, &ms), DSHIM_OK);
    ck_assert_int_eq(f.waiting_calls, 1); /* once per idle spell */
    dshim_wait_remark(&w);                /* the operation grew: say it again */
    ck_assert_int_eq(dshim_wait_look(c, &w, 100.3, 100, &ms), DSHIM_OK);
    ck_assert_int_eq(f.waiting_calls, 2);
    dshim_wait_moving(c, &w);
    dshim_wait_moving(c, &w);
    ck_assert_int_eq(f.moving_calls, 1);
    ck_assert_int_eq(dshim_wait_look(c, &w, 100.4, 100, &ms), DSHIM_OK);
    ck_assert_int_eq(f.waiting_calls, 3);
    dshim_comm_destroy(c);
}
END_TEST

START_TEST(test_timeout_verdict)
{
    dshim_comm_t *c = make_comm(3);
    fake_t f = {.nmissing = 2, .missing = {2, 5}};
    dshim_wait_source_t src = {fake_doing, fake_missing, fake_waiting, fake_moving, &f};
    dshim_wait_t w;
    dshim_wait_init(&w, &allreduce7, &src);
    w.stall_s = w.warn_after = 0;
    w.announced = 1;
    int ms;
    dshim_wait_idle(&w, 100.0);
    ck_assert_int_eq(dshim_wait_look(c, &w, 103.1, 100, &ms), DSHIM_ERR_TIMEOUT);
    const char *err = dshim_last_error();
    ck_assert_msg(strstr(err, "did not complete within 3 s (no progress for that long") != NULL, "%s", err);
    ck_assert_msg(strstr(err, " while waiting for the test; ranks that did not arrive at this collective: 2, 5"),
                  "%s", err);
    ck_assert_msg(strstr(err, "allreduce #7") != NULL, "%s", err);
    /* the verdict as data, beside the text */
    uint64_t seq = 0;
    int ranks[4] = {-1, -1, -1, -1}, n = -2;
    ck_assert_int_eq(dshim_comm_get_missing(c, &seq, ranks, 4, &n), DSHIM_ERR_TIMEOUT);
    ck_assert_int_eq((int)seq, 7);
    ck_assert_int_eq(n, 2);
    ck_assert_int_eq(ranks[0], 2);
    ck_assert_int_eq(ranks[1], 5);
    ck_assert_int_eq(ranks[2], -1);
    int first = -1;
    ck_assert_int_eq(dshim_comm_get_missing(c, &seq, &first, 1, &n), DSHIM_ERR_TIMEOUT);
    ck_assert_int_eq(first, 2);
    ck_assert_int_eq(n, 2); /* how many, not how many fitted */
    /* a later failure keeps the first one's verdict, as the sticky error */
    dshim_coll_sig_t later = allreduce7;
    later.seq = 8;
    f.nmissing = 1;
    dshim_wait_init(&w, &later, &src);
    w.announced = 1;
    dshim_wait_idle(&w, 100.0);
    ck_assert_int_eq(dshim_wait_look(c, &w, 104.0, 100, &ms), DSHIM_ERR_TIMEOUT);
    ck_assert_int_eq(dshim_comm_get_missing(c, &seq, ranks, 4, &n), DSHIM_ERR_TIMEOUT);
    ck_assert_int_eq((int)seq, 7);
    ck_assert_int_eq(n, 2);
    dshim_comm_destroy(c);
}
END_TEST

START_TEST(test_timeout_none_known_and_unknown)
{
    dshim_comm_t *c = make_comm(3);
    fake_t f = {.nmissing = 0};
    dshim_wait_source_t src = {fake_doing, fake_missing, fake_waiting, fake_moving, &f};
    dshim_wait_t w;
    dshim_wait_init(&w, &allreduce7, &src);
    w.stall_s = w.warn_after = 0;
    w.announced = 1;
    int ms;
    dshim_wait_idle(&w, 100.0);
    ck_assert_int_eq(dshim_wait_look(c, &w, 103.5, 100, &ms), DSHIM_ERR_TIMEOUT);
    ck_assert_msg(strstr(dshim_last_error(), "did not arrive at this collective: none known (check the other"),
                  "%s", dshim_last_error());
    uint64_t seq;
    int n = -2;
    ck_assert_int_eq(dshim_comm_get_missing(c, &seq, NULL, 0, &n), DSHIM_ERR_TIMEOUT);
    ck_assert_int_eq(n, 0);
    dshim_comm_destroy(c);
    /* who did not arrive is unknown: -1 (the store did not answer) */
    c = make_comm(3);
    f.nmissing = -1;
    dshim_wait_init(&w, &allreduce7, &src);
    w.stall_s = w.warn_after = 0;
    w.announced = 1;
    dshim_wait_idle(&w, 100.0);
    ck_assert_int_eq(dshim_wait_look(c, &w, 103.5, 100, &ms), DSHIM_ERR_TIMEOUT);
    ck_assert_msg(strstr(dshim_last_error(), "did not arrive at this collective: unknown (the rendezvous store"),
                  "%s", dshim_last_error());
    ck_assert_int_eq(dshim_comm_get_missing(c, &seq, NULL, 0, &n), DSHIM_ERR_TIMEOUT);
    ck_assert_int_eq(n, -1);
    dshim_comm_destroy(c);
}
END_TEST

START_TEST(test_p2p_timeout_names_no_ranks)
{
    dshim_comm_t *c = make_comm(2);
    fake_t f = {.nmissing = 1, .missing = {3}};
    dshim_wait_source_t src = {fake_doing, fake_missing, fake_waiting, fake_moving, &f};
    dshim_coll_sig_t p2p = {.coll = DSHIM_COLL_P2P, .root = -1, .seq = 4};
    dshim_wait_t w;
    dshim_wait_init(&w, &p2p, &src);
    w.stall_s = w.warn_after = 0;
    int ms;
    dshim_wait_idle(&w, 100.0);
    ck_assert_int_eq(dshim_wait_look(c, &w, 102.5, 100, &ms), DSHIM_ERR_TIMEOUT);
    ck_assert_msg(strstr(dshim_last_error(), "did not complete within 2 s") != NULL, "%s", dshim_last_error());
    ck_assert_ptr_null(strstr(dshim_last_error(), "did not arrive"));
    uint64_t seq;
    int n;
    ck_assert_int_eq(dshim_comm_get_missing(c, &seq, NULL, 0, &n), DSHIM_OK);
    /* the error itself is there */
    ck_assert_int_eq(dshim_comm_get_error(c, NULL, 0), DSHIM_ERR_TIMEOUT);
    dshim_comm_destroy(c);
}
END_TEST

START_TEST(test_gone_verdict)
{
    dshim_comm_t *c = make_comm(3);
    fake_t f = {0};
    dshim_wait_source_t src = {fake_doing, fake_missing, fake_waiting, fake_moving, &f};
    dshim_wait_t w;
    dshim_wait_init(&w, &allreduce7, &src);
    int missing[] = {0};
    ck_assert_int_eq(dshim_wait_fail_gone(c, &w, 0, missing, 1), DSHIM_ERR_PEER);
    ck_assert_msg(strstr(dshim_last_error(), "exited before it arrived at the collective (ranks that did not arrive "
                                             "at this collective: 0)"),
                  "%s", dshim_last_error());
    uint64_t seq;
    int ranks[2], n;
    ck_assert_int_eq(dshim_comm_get_missing(c, &seq, ranks, 2, &n), DSHIM_ERR_PEER);
    ck_assert_int_eq(n, 1);
    ck_assert_int_eq(ranks[0], 0);
    dshim_comm_destroy(c);
}
END_TEST

START_TEST(test_no_verdict_before_failure)
{
    dshim_comm_t *c = make_comm(3);
    uint64_t seq = 99;
    int n = 99;
    ck_assert_int_eq(dshim_comm_get_missing(c, &seq, NULL, 0, &n), DSHIM_OK);
    ck_assert_int_eq(n, 0);
    /* an abort is a failure without missing ranks */
    ck_assert_int_eq(dshim_comm_abort(c, "test"), DSHIM_OK);
    ck_assert_int_eq(dshim_comm_get_missing(c, &seq, NULL, 0, &n), DSHIM_OK);
    dshim_comm_destroy(c);
}
END_TEST

static Suite *wait_suite(void)
{
    Suite *s = suite_create("wait");
    TCase *tc = tcase_create("rule");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_list_words);
    tcase_add_test(tc, test_sleep_bounded_by_timeout);
    tcase_add_test(tc, test_stall_warnings);
    tcase_add_test(tc, test_arrival_mark_after_a_second);
    tcase_add_test(tc, test_recorder_marks);
    tcase_add_test(tc, test_timeout_verdict);
    tcase_add_test(tc, test_timeout_none_known_and_unknown);
    tcase_add_test(tc, test_p2p_timeout_names_no_ranks);
    tcase_add_test(tc, test_gone_verdict);
    tcase_add_test(tc, test_no_verdict_before_failure);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    /* failures dump the recorder's rings: into a directory of this test's */
    char dir[] = "/tmp/check_wait_XXXXXX";
    int made = mkdtemp(dir) != NULL;
    if (made) {
        setenv("DSHIM_TRACE_DIR", dir, 1);
    }
    SRunner *sr = srunner_create(wait_suite());
    srunner_set_fork_status(sr, CK_FORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    if (made) {
        char cmd[64];
        snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
        if (system(cmd) != 0) {
            fprintf(stderr, "check_wait: could not remove %s\n", dir);
        }
    }
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

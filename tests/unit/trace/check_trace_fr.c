/* torch's flight-recorder format (shim/trace/trace_fr.c): the file
 * name torch's analyser parses the rank from, the temporary name that never
 * lingers, DSHIM_TRACE_FR=0, a pickle that starts and ends as protocol 2,
 * bytes that are not UTF-8, and the errors (no rank, no directory).
 *
 * Also a generator for tests/torch/test_fr_trace.py, which feeds the files to
 * torch's own loader and analyser:
 *   check_trace_fr write DIR SCENARIO   (SCENARIO: ok, hang, mismatch, wrapped)
 * writes every rank's file of a 3-rank job built from hand-made snapshots
 * (hang: rank 1 never calls allreduce #1 that ranks 0 and 2 time out in;
 * mismatch: rank 2 calls broadcast #1 where the others call allreduce #1;
 * wrapped: the world ring of rank 0 has dropped more of its oldest entries
 * than the others'). */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "dshim.h"
#include "status.h"
#include "trace_impl.h"

#define WORLD 3

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static dshim_trace_entry_t entry(uint64_t id, uint64_t seq, const char *op, int dtype, uint64_t count,
                                 dshim_trace_state_t state, const char *label, uint64_t t0)
{
    dshim_trace_entry_t e;
    memset(&e, 0, sizeof(e));
    e.id = id;
    e.seq = seq;
    e.op.op = op;
    e.op.dtype = dtype;
    e.op.redop = dtype < 0 ? -1 : DSHIM_SUM;
    e.op.count = count;
    e.op.bytes = dtype < 0 ? 0 : count * dshim_dtype_size((dshim_dtype_t)dtype);
    e.op.root = -1;
    e.op.peer = -1;
    snprintf(e.label, sizeof(e.label), "%s", label);
    e.state = state;
    e.t_queued_ns = t0;
    if (state != DSHIM_TRACE_QUEUED) {
        e.t_started_ns = t0 + 1000;
    }
    if (state == DSHIM_TRACE_DONE) {
        e.t_done_ns = t0 + 50000;
    }
    e.algo = "ring";
    e.transport = "shm";
    return e;
}

static void ring(dshim_trace_snapshot_t *s, const char *name, const char *desc, int rank, int size, int world_rank,
                 dshim_trace_entry_t *entries, size_t n)
{
    memset(s, 0, sizeof(*s));
    snprintf(s->name, sizeof(s->name), "%s", name);
    snprintf(s->desc, sizeof(s->desc), "%s", desc);
    s->rank = rank;
    s->size = size;
    s->world_rank = world_rank;
    s->capacity = 2000;
    s->recorded = n;
    s->n = n;
    s->entries = entries;
}

/* One rank's rings for a scenario: the world group "c0" (what the analyser
 * reads), a sub-group of 2 (members unknown: left out), a group of one, and
 * a parameter-server ring (left out). */
static size_t scenario(const char *name, int r, dshim_trace_snapshot_t snaps[4], dshim_trace_entry_t world[8],
                       dshim_trace_entry_t sub[1], dshim_trace_entry_t one[1], dshim_trace_entry_t ps[1])
{
    uint64_t t = mono_ns() - 10000000000u;
    size_t n = 0;
    world[n++] = entry(0, 0, "allreduce", DSHIM_FLOAT32, 1024, DSHIM_TRACE_DONE, "torch all_reduce", t);
    if (!strcmp(name, "hang")) {
        if (r != 1) {
            dshim_trace_entry_t e = entry(1, 1, "allreduce", DSHIM_FLOAT32, 1024, DSHIM_TRACE_FAILED,
                                          "torch all_reduce", t + 1000000);
            e.waiting_for[0] = 1;
            e.nwaiting = 1;
            world[n++] = e;
            /* queued behind it, then refused by the failed communicator */
            world[n] = entry(2, UINT64_MAX, "broadcast", DSHIM_UINT8, 64, DSHIM_TRACE_FAILED, "torch broadcast",
                             t + 2000000);
            world[n++].t_started_ns = 0;
        }
    } else if (!strcmp(name, "mismatch")) {
        if (r == 2) {
            dshim_trace_entry_t e = entry(1, 1, "broadcast", DSHIM_UINT8, 4096, DSHIM_TRACE_FAILED,
                                          "torch broadcast", t + 1000000);
            e.op.root = 0;
            world[n++] = e;
        } else {
            world[n++] = entry(1, 1, "allreduce", DSHIM_FLOAT32, 1024, DSHIM_TRACE_FAILED, "torch all_reduce",
                               t + 1000000);
        }
    } else if (!strcmp(name, "wrapped")) {
        /* ids/numbers 0..7 recorded; rank 0 kept 5..7, the others 3..7 */
        n = 0;
        for (uint64_t i = r == 0 ? 5 : 3; i < 8; i++) {
            world[n++] = entry(i, i, "allreduce", DSHIM_FLOAT32, 8, DSHIM_TRACE_DONE, "torch all_reduce",
                               t + 1000000 * i);
        }
    } else {
        world[n++] = entry(1, 1, "allgather", DSHIM_FLOAT32, 48, DSHIM_TRACE_DONE, "torch all_gather", t + 1000000);
        world[n++] = entry(2, 2, "reduce_scatter", DSHIM_FLOAT64, 8, DSHIM_TRACE_DONE, "", t + 2000000);
        world[n++] = entry(3, 3, "barrier", -1, 0, DSHIM_TRACE_STARTED, "torch barrier", t + 3000000);
    }
    ring(&snaps[0], "c0", "torch group 0 (default_pg)", r, WORLD, r, world, n);
    if (!strcmp(name, "wrapped")) {
        snaps[0].recorded = 8;
        snaps[0].dropped = 8 - n;
    }
    sub[0] = entry(0, 0, "allreduce", DSHIM_FLOAT32, 8, DSHIM_TRACE_DONE, "torch all_reduce", t + 500000);
    ring(&snaps[1], "subgroup-c1", "torch group 1", r == 2 ? 1 : 0, 2, r, sub, 1);
    /* before every retained world entry: written first unless the primary goes first */
    one[0] = entry(0, 0, "allreduce", DSHIM_INT64, 2, DSHIM_TRACE_DONE, "torch all_reduce", t - 600000);
    ring(&snaps[2], "c2.solo", "torch group 2", 0, 1, r, one, 1);
    ps[0] = entry(0, 0, "push", DSHIM_FLOAT32, 100, DSHIM_TRACE_STARTED, "MXNet push key 3", t + 700000);
    ring(&snaps[3], "ps/worker.0", "MXNet worker", 0, WORLD, r, ps, 1);
    return 4;
}

static dshim_status_t write_scenario(const char *dir, const char *name, int r)
{
    dshim_trace_snapshot_t snaps[4];
    dshim_trace_entry_t world[8], sub[1], one[1], ps[1];
    size_t n = scenario(name, r, snaps, world, sub, one, ps);
    return dshim_trace_write_fr(dir, r, snaps, n, "timeout", "allreduce #1 timed out");
}

static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    size_t got = fread(buf, 1, (size_t)n, f);
    fclose(f);
    buf[got] = 0;
    *len = got;
    return buf;
}

static int count_files(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *de;
    while (d && (de = readdir(d))) {
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
            n++;
        }
    }
    if (d) {
        closedir(d);
    }
    return n;
}

static void rm_dir(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    char p[4200];
    while (d && (de = readdir(d))) {
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
            snprintf(p, sizeof(p), "%s/%s", dir, de->d_name);
            unlink(p);
        }
    }
    if (d) {
        closedir(d);
    }
    rmdir(dir);
}

static char tmpdir[256];

static void setup(void)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/check_trace_fr.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
    unsetenv("DSHIM_TRACE_FR");
    unsetenv("DSHIM_WORLD_SIZE");
    setenv("WORLD_SIZE", "3", 1);
    dshim_config_reload();
}

static void teardown(void)
{
    rm_dir(tmpdir);
    unsetenv("DSHIM_TRACE_FR");
    unsetenv("WORLD_SIZE");
    dshim_config_reload();
}

START_TEST(test_file_name_and_pickle)
{
    ck_assert_int_eq(write_scenario(tmpdir, "ok", 2), DSHIM_OK);
    char path[512];
    snprintf(path, sizeof(path), "%s/dshim_fr_rank_2", tmpdir);
    size_t len = 0;
    char *buf = read_all(path, &len);
    ck_assert_msg(buf != NULL, "no %s", path);
    ck_assert_int_eq(count_files(tmpdir), 1); /* the temporary name is gone */
    ck_assert_uint_gt(len, 100);
    ck_assert_int_eq((unsigned char)buf[0], 0x80);
    ck_assert_int_eq((unsigned char)buf[1], 2);
    ck_assert_int_eq(buf[len - 1], '.');
    /* what the analyser reads, as BINUNICODE bodies */
    const char *want[] = {"2.10", "pg_config", "[0, 1, 2]", "default_pg", "nccl:all_reduce", "nccl:all_gather",
                          "nccl:reduce_scatter", "nccl:all_reduce_barrier", "Float", "Double", "completed",
                          "started", "torch all_gather", "c2.solo", "Long"};
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        ck_assert_msg(memmem(buf, len, want[i], strlen(want[i])) != NULL, "no '%s' in the pickle", want[i]);
    }
    /* left out: the sub-group of unknown members, the parameter server's ring */
    ck_assert_ptr_null(memmem(buf, len, "subgroup-c1", 11));
    ck_assert_ptr_null(memmem(buf, len, "ps/worker", 9));
    ck_assert_ptr_null(memmem(buf, len, "MXNet push", 10));
    free(buf);
    /* a re-dump replaces the file */
    ck_assert_int_eq(write_scenario(tmpdir, "hang", 2), DSHIM_OK);
    ck_assert_int_eq(count_files(tmpdir), 1);
}
END_TEST

START_TEST(test_refused_op_left_out)
{
    ck_assert_int_eq(write_scenario(tmpdir, "hang", 0), DSHIM_OK);
    char path[512];
    snprintf(path, sizeof(path), "%s/dshim_fr_rank_0", tmpdir);
    size_t len = 0;
    char *buf = read_all(path, &len);
    ck_assert_ptr_nonnull(buf);
    /* the failed, started allreduce is there; the broadcast refused before it was numbered is not */
    ck_assert_ptr_nonnull(memmem(buf, len, "nccl:all_reduce", 15));
    ck_assert_ptr_null(memmem(buf, len, "nccl:broadcast", 14));
    free(buf);
}
END_TEST

START_TEST(test_off)
{
    setenv("DSHIM_TRACE_FR", "0", 1);
    dshim_config_reload();
    ck_assert_int_eq(write_scenario(tmpdir, "ok", 0), DSHIM_OK);
    ck_assert_int_eq(count_files(tmpdir), 0);
}
END_TEST

START_TEST(test_not_utf8)
{
    uint64_t t = mono_ns();
    dshim_trace_entry_t e = entry(0, 0, "allreduce", DSHIM_FLOAT32, 4, DSHIM_TRACE_DONE, "", t);
    memcpy(e.label, "bad \xff\xfe label \xc3", 15);
    e.label[15] = 0;
    dshim_trace_snapshot_t s;
    ring(&s, "c0", "desc \xe2\x82", 0, WORLD, 0, &e, 1);
    ck_assert_int_eq(dshim_trace_write_fr(tmpdir, 0, &s, 1, "request", ""), DSHIM_OK);
    char path[512];
    snprintf(path, sizeof(path), "%s/dshim_fr_rank_0", tmpdir);
    size_t len = 0;
    char *buf = read_all(path, &len);
    ck_assert_ptr_nonnull(buf);
    ck_assert_ptr_nonnull(memmem(buf, len, "bad ?? label ?", 14));
    ck_assert_ptr_nonnull(memmem(buf, len, "desc ??", 7));
    /* the raw bytes are gone (not any 0xff: the pickle's binary integers,
     * time stamps among them, may hold that byte) */
    ck_assert_ptr_null(memmem(buf, len, "bad \xff", 5));
    ck_assert_ptr_null(memmem(buf, len, "desc \xe2", 6));
    free(buf);
}
END_TEST

/* p2p entries only in groups of two, where torch's analyser pairs them exactly */
START_TEST(test_p2p)
{
    uint64_t t = mono_ns();
    dshim_trace_entry_t e[3];
    e[0] = entry(0, 0, "allreduce", DSHIM_FLOAT32, 4, DSHIM_TRACE_DONE, "", t);
    e[1] = entry(1, 0, "send", DSHIM_UINT8, 40, DSHIM_TRACE_STARTED, "torch send", t + 1000);
    e[1].op.peer = 1;
    e[2] = entry(2, 0, "recv", DSHIM_UINT8, 40, DSHIM_TRACE_STARTED, "torch recv", t + 2000);
    dshim_trace_snapshot_t s;
    ring(&s, "c0", "", 0, WORLD, 0, e, 3);
    ck_assert_int_eq(dshim_trace_write_fr(tmpdir, 0, &s, 1, "request", ""), DSHIM_OK);
    char path[512];
    snprintf(path, sizeof(path), "%s/dshim_fr_rank_0", tmpdir);
    size_t len = 0;
    char *buf = read_all(path, &len);
    ck_assert_ptr_nonnull(buf);
    ck_assert_ptr_nonnull(memmem(buf, len, "nccl:all_reduce", 15));
    ck_assert_ptr_null(memmem(buf, len, "nccl:send", 9));
    free(buf);
    setenv("WORLD_SIZE", "2", 1);
    dshim_config_reload();
    ring(&s, "c0", "", 0, 2, 0, e, 3);
    ck_assert_int_eq(dshim_trace_write_fr(tmpdir, 0, &s, 1, "request", ""), DSHIM_OK);
    buf = read_all(path, &len);
    ck_assert_ptr_nonnull(buf);
    ck_assert_ptr_nonnull(memmem(buf, len, "nccl:send 0->1", 14));
    ck_assert_ptr_nonnull(memmem(buf, len, "nccl:recv 0<-1", 14)); /* from any source: the other rank */
    ck_assert_ptr_nonnull(memmem(buf, len, "[0, 1]", 6));
    free(buf);
}
END_TEST

START_TEST(test_errors)
{
    dshim_trace_snapshot_t snaps[4];
    dshim_trace_entry_t world[8], sub[1], one[1], ps[1];
    size_t n = scenario("ok", 0, snaps, world, sub, one, ps);
    ck_assert_int_eq(dshim_trace_write_fr(tmpdir, -1, snaps, n, "request", ""), DSHIM_ERR_INVALID);
    ck_assert_msg(strstr(dshim_last_error(), "world rank"), "%s", dshim_last_error());
    char missing[512];
    snprintf(missing, sizeof(missing), "%s/no/such/dir", tmpdir);
    ck_assert_int_eq(dshim_trace_write_fr(missing, 0, snaps, n, "request", ""), DSHIM_ERR_SYSTEM);
    ck_assert_msg(strstr(dshim_last_error(), "cannot create") && strstr(dshim_last_error(), missing), "%s",
                  dshim_last_error());
    ck_assert_int_eq(count_files(tmpdir), 0);
    /* a process without rings still writes its (empty) file: the analyser wants every member's */
    ck_assert_int_eq(dshim_trace_write_fr(tmpdir, 1, NULL, 0, "signal", ""), DSHIM_OK);
    ck_assert_int_eq(count_files(tmpdir), 1);
}
END_TEST

static Suite *fr_suite(void)
{
    Suite *s = suite_create("trace_fr");
    TCase *tc = tcase_create("fr");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_file_name_and_pickle);
    tcase_add_test(tc, test_refused_op_left_out);
    tcase_add_test(tc, test_off);
    tcase_add_test(tc, test_not_utf8);
    tcase_add_test(tc, test_p2p);
    tcase_add_test(tc, test_errors);
    suite_add_tcase(s, tc);
    return s;
}

int main(int argc, char **argv)
{
    if (argc == 4 && !strcmp(argv[1], "write")) {
        setenv("WORLD_SIZE", "3", 1);
        dshim_config_reload();
        for (int r = 0; r < WORLD; r++) {
            if (write_scenario(argv[2], argv[3], r) != DSHIM_OK) {
                fprintf(stderr, "check_trace_fr: %s\n", dshim_last_error());
                return 1;
            }
        }
        return 0;
    }
    SRunner *sr = srunner_create(fr_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

/* The timeline and the summary: the JSON string escaper,
 * the per-process writer fed with synthetic finished operations (labels
 * with quotes, newlines, control characters, cut UTF-8), the summary's
 * table, and dshim-run's merge: clock alignment from pings (offset,
 * drift between pings, realtime fallback), pid rewriting, lines of a killed
 * process.  Files are read back with Python's json module (python3 on PATH;
 * the case skips when there is none). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "config.h"
#include "frame.h"
#include "json_str.h"
#include "timeline.h"
#include "trace_impl.h"

static char *esc(const char *s, size_t cap)
{
    static char out[1024];
    dshim_json_escape(out, cap, s);
    return out;
}

START_TEST(json_escape)
{
    ck_assert_str_eq(esc("plain DDP bucket 2", 1024), "plain DDP bucket 2");
    ck_assert_str_eq(esc("a\"b\\c", 1024), "a\\\"b\\\\c");
    ck_assert_str_eq(esc("l1\nl2\tx\r\x01\x1f", 1024), "l1\\nl2\\tx\\r\\u0001\\u001f");
    ck_assert_str_eq(esc("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", 1024), "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
    /* not UTF-8: a character cut by the 63-byte label limit, Latin-1, a lone
     * continuation byte, an overlong form, a surrogate */
    ck_assert_str_eq(esc("cut \xe2\x82", 1024), "cut \\ufffd\\ufffd");
    ck_assert_str_eq(esc("latin\xe9", 1024), "latin\\ufffd");
    ck_assert_str_eq(esc("\x80", 1024), "\\ufffd");
    ck_assert_str_eq(esc("\xc0\xaf", 1024), "\\ufffd\\ufffd");
    ck_assert_str_eq(esc("\xed\xa0\x80", 1024), "\\ufffd\\ufffd\\ufffd");
    /* a small buffer: never half an escape or half a character */
    ck_assert_str_eq(esc("ab\"c", 4), "ab");
    ck_assert_str_eq(esc("a\xc3\xa9", 3), "a");
    ck_assert_str_eq(esc("x", 1), "");
    ck_assert_str_eq(esc(NULL, 16), "");
    /* the stream writer follows the same rule, whole */
    const char *samples[] = {"a\"b\\c", "l1\nl2\tx\r\x01\x7f", "caf\xc3\xa9 \xe2\x82", "latin\xe9 \xed\xa0\x80", ""};
    for (size_t i = 0; i < sizeof(samples) / sizeof(samples[0]); i++) {
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        ck_assert_ptr_nonnull(f);
        dshim_json_write(f, samples[i]);
        fclose(f);
        ck_assert_str_eq(buf, esc(samples[i], 1024));
        free(buf);
    }
}
END_TEST

/* python3 with a script; returns its stdout (malloc'ed), NULL when python3 is missing */
static char *python(const char *script, const char *arg)
{
    char cmd[8192];
    snprintf(cmd, sizeof(cmd), "python3 -c '%s' '%s' 2>&1", script, arg);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    char *out = calloc(1, 65536);
    size_t n = fread(out, 1, 65535, p);
    out[n] = '\0';
    int rc = pclose(p);
    if (rc != 0 && strstr(out, "not found")) {
        free(out);
        return NULL;
    }
    ck_assert_msg(rc == 0, "python3 failed: %s", out);
    return out;
}

static dshim_trace_entry_t entry(uint64_t seq, const char *op, const char *label, uint64_t t0, uint64_t dur)
{
    dshim_trace_entry_t e;
    memset(&e, 0, sizeof(e));
    e.seq = seq;
    e.op = (dshim_trace_op_t){.op = op, .dtype = DSHIM_FLOAT32, .redop = DSHIM_SUM, .count = 256, .bytes = 1024,
                              .root = -1, .peer = -1};
    snprintf(e.label, sizeof(e.label), "%s", label);
    e.state = DSHIM_TRACE_DONE;
    e.algo = "ring";
    e.transport = "shm";
    e.t_queued_ns = t0 - 1000;
    e.t_started_ns = t0;
    e.t_done_ns = t0 + dur;
    e.wait_ns = dur / 2;
    return e;
}

static const char *const read_back =
    "import json, sys\n"
    "d = json.load(open(sys.argv[1], encoding=\"utf-8\"))\n"
    "h = d[\"otherData\"][\"dshim\"]\n"
    "print(h[\"format\"], h[\"version\"], h[\"rank\"])\n"
    "for e in d[\"traceEvents\"]:\n"
    "    if e[\"ph\"] == \"X\":\n"
    "        a = e[\"args\"]\n"
    "        print(e[\"pid\"], e[\"tid\"], json.dumps(e[\"name\"]), e[\"cat\"], a[\"seq\"], a[\"bytes\"], a[\"wait_ms\"],\n"
    "              a.get(\"root\", \"-\"), a.get(\"failed\", 0), e[\"dur\"])\n"
    "    elif e[\"name\"] == \"thread_name\":\n"
    "        print(\"track\", e[\"tid\"], json.dumps(e[\"args\"][\"name\"]))\n"
    "print(\"end\", d[\"dshim_end\"][\"events\"])\n";

START_TEST(writer_and_summary)
{
    char dir[64], pattern[128];
    snprintf(dir, sizeof(dir), "/tmp/check_timeline.%d", (int)getpid());
    snprintf(pattern, sizeof(pattern), "%s/sub/t.%%r.%%p.json", dir); /* sub/: created by the writer */
    setenv("DSHIM_TIMELINE", pattern, 1);
    setenv("DSHIM_SUMMARY", "1", 1);
    setenv("DSHIM_RANK", "3", 1);
    ck_assert_int_eq(dshim_config_reload(), DSHIM_OK);
    ck_assert_int_eq(dshim_trace_timeline_wanted(), 1);

    dshim_trace_ring_info_t world = {.name = "c0/", .desc = "torch \"default_pg\"", .rank = 3, .size = 4};
    dshim_trace_ring_info_t sub = {.name = "c0/s1/", .desc = "", .rank = 1, .size = 2};
    dshim_trace_timeline_open(&world);
    dshim_trace_timeline_open(&sub);
    uint64_t t0 = dshim_trace_now_ns();
    dshim_trace_entry_t e1 = entry(0, "allreduce", "DDP bucket 2", t0, 2000000);
    dshim_trace_entry_t e2 = entry(1, "allreduce", "q\"uote\\ new\nline \x01 cut\xe2\x82", t0 + 3000000, 1000000);
    dshim_trace_entry_t e3 = entry(0, "broadcast", "", t0 + 1000000, 500000);
    e3.op.root = 0;
    e3.op.bytes = 100;
    dshim_trace_entry_t e4 = entry(2, "allreduce", "", t0 + 5000000, 0);
    e4.state = DSHIM_TRACE_FAILED;
    dshim_trace_timeline_done(&world, &e1);
    dshim_trace_timeline_done(&world, &e2);
    dshim_trace_timeline_done(&sub, &e3);
    dshim_trace_timeline_close(&sub);
    dshim_trace_timeline_done(&world, &e4);

    char table[4096];
    size_t n = dshim_trace_summary_format(table, sizeof(table), -1, t0 + 10000000);
    ck_assert_uint_gt(n, 0);
    ck_assert_msg(strstr(table, "dshim summary rank 3: "), "%s", table);
    /* per kind: count, bytes, comm ms, wait ms, failed (3 allreduces, one failed) */
    unsigned long long count, failed;
    double bytes, comm, wait;
    char unit[8];
    const char *row = strstr(table, "   allreduce ");
    ck_assert_msg(row && sscanf(row, " allreduce %llu %lf %7s %lf %lf %llu", &count, &bytes, unit, &comm, &wait,
                                &failed) == 6, "%s", table);
    ck_assert_msg(count == 3 && bytes == 3.1 && !strcmp(unit, "kB") && comm == 3.0 && wait == 1.5 && failed == 1,
                  "%s", table);
    row = strstr(table, "   broadcast ");
    ck_assert_msg(row && sscanf(row, " broadcast %llu %lf %7s %lf %lf %llu", &count, &bytes, unit, &comm, &wait,
                                &failed) == 6, "%s", table);
    ck_assert_msg(count == 1 && bytes == 100 && !strcmp(unit, "B") && comm == 0.5 && wait == 0.25 && failed == 0,
                  "%s", table);
    /* busy: [0,2] + [1,1.5] + [3,4] + [5,5] ms = 3 ms once, of 10 ms since the first open at most */
    ck_assert_msg(strstr(table, "0.003 s in communication"), "%s", table);
    ck_assert_msg(strstr(table, "0.002 s waiting for others"), "%s", table);

    /* a forked child neither writes the parent's buffer nor prints its summary at exit */
    fflush(stdout);
    fflush(stderr);
    pid_t child = fork();
    ck_assert_int_ge(child, 0);
    if (child == 0) {
        char none[64];
        _exit(dshim_trace_summary_format(none, sizeof(none), -1, t0) == 0 ? 0 : 3); /* atexit not run by _exit */
    }
    int status = 0;
    ck_assert_int_eq(waitpid(child, &status, 0), child);
    ck_assert_int_eq(WEXITSTATUS(status), 0);
    child = fork();
    ck_assert_int_ge(child, 0);
    if (child == 0) {
        exit(0); /* runs the atexit handler: must do nothing here */
    }
    ck_assert_int_eq(waitpid(child, &status, 0), child);
    dshim_trace_timeline_finish();
    char path[256];
    snprintf(path, sizeof(path), "%s/sub/t.3.%d.json", dir, (int)getpid());
    char *out = python(read_back, path);
    if (!out) {
        return; /* no python3 */
    }
    const char *want[] = {
        "dshim-timeline 1 3\n",
        "track 1 \"torch \\\"default_pg\\\" | c0/ rank 3 of 4\"\n",
        "3 1 \"DDP bucket 2\" allreduce 0 1024 1.0 - 0 2000.0\n",
        "3 1 \"q\\\"uote\\\\ new\\nline \\u0001 cut\\ufffd\\ufffd\" allreduce 1 1024 0.5 - 0 1000.0\n",
        "track 2 \"c0/s1/ rank 1 of 2\"\n",
        "3 2 \"broadcast\" broadcast 0 100 0.25 0 0 500.0\n",
        "3 1 \"allreduce\" allreduce 2 1024 0.0 - 1 0.0\n",
        "end 4\n",
    };
    const char *p = out;
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        const char *at = strstr(p, want[i]);
        ck_assert_msg(at, "'%s' not in (after what matched before):\n%s", want[i], out);
        p = at + strlen(want[i]);
    }
    free(out);
    unlink(path);
    snprintf(path, sizeof(path), "%s/sub", dir);
    rmdir(path);
    rmdir(dir);
}
END_TEST

START_TEST(frames_of_the_timeline)
{
    run_frame_t f;
    const char t[] = "\x1eT 3 ,{\"ph\":\"X\",\"pid\":3}";
    ck_assert_int_eq(run_frame_parse(t, strlen(t), &f), 0);
    ck_assert_int_eq(f.kind, 'T');
    ck_assert_int_eq(f.idx, 3);
    ck_assert_int_eq((int)f.textlen, (int)strlen(",{\"ph\":\"X\",\"pid\":3}"));
    const char q[] = "\x1eQ -1 7 123456789 1700000000000000000";
    ck_assert_int_eq(run_frame_parse(q, strlen(q), &f), 0);
    ck_assert_int_eq(f.kind, 'Q');
    ck_assert_int_eq(f.idx, -1);
    ck_assert(f.textlen == strlen("7 123456789 1700000000000000000") && memcmp(f.text, "7 ", 2) == 0);
}
END_TEST

static void add(run_timeline_t *t, int agent, int idx, const char *line)
{
    run_timeline_add_line(t, agent, idx, line, strlen(line));
}

static const char *const read_merged =
    "import json, sys\n"
    "d = json.load(open(sys.argv[1], encoding=\"utf-8\"))\n"
    "h = d[\"otherData\"][\"dshim\"]\n"
    "print(h[\"format\"], h[\"processes\"], h[\"hosts\"], round(h[\"clock_skew_bound_us\"], 3))\n"
    "for e in d[\"traceEvents\"]:\n"
    "    if e[\"ph\"] == \"X\":\n"
    "        print(\"X\", e[\"pid\"], e[\"tid\"], \"%.3f\" % e[\"ts\"], e[\"name\"])\n"
    "    else:\n"
    "        print(\"M\", e[\"pid\"], e[\"name\"], e[\"args\"].get(\"name\", e[\"args\"].get(\"sort_index\")))\n";

START_TEST(merge_aligns_clocks)
{
    const uint64_t S = 1000000000ull;
    char path[128];
    snprintf(path, sizeof(path), "/tmp/check_timeline_merged.%d.json", (int)getpid());
    ck_assert_ptr_null(run_timeline_new(NULL, 2)); /* no --timeline */
    run_timeline_t *t = run_timeline_new(path, 2);
    ck_assert_ptr_nonnull(t);
    /* controller: monotonic 1000 s at realtime R; agent 0's monotonic clock
     * is the controller's + 5 ms at the start and + 5.2 ms 20 s later (drift);
     * agent 1 answers no ping (mpirun): realtime placement */
    const uint64_t R = 1700000000ull * S;
    run_timeline_set_origin(t, 1000 * S, R);
    /* sent at 1000 s, answered 20 us later: seen at 1000 s + 10 us exactly */
    run_timeline_add_sample(t, 0, 1000 * S, 1000 * S + 20000, 1000 * S + 10000 + 5000000, R + 7 * S, R);
    /* a slow answer: left out (far worse round trip than the best) */
    run_timeline_add_sample(t, 0, 1005 * S, 1005 * S + 9000000, 1005 * S + 4000000, R + 7 * S, R);
    run_timeline_add_sample(t, 0, 1020 * S, 1020 * S + 40000, 1020 * S + 20000 + 5200000, R + 7 * S, R);
    ck_assert(run_timeline_bound_ns(t, 0) > 19999 && run_timeline_bound_ns(t, 0) < 20001);
    ck_assert(run_timeline_bound_ns(t, 1) < 0);

    /* rank 0 on agent 0: its realtime axis is its monotonic + 500 s */
    char line[512];
    snprintf(line, sizeof(line), "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"dshim\":{\"format\":\"dshim-timeline\",\"version\":1,\"rank\":0,\"host\":\"a\","
             "\"pid\":11,\"realtime_ns\":%llu,\"monotonic_ns\":%llu}},\"traceEvents\":[",
             (unsigned long long)(R + 500 * S), (unsigned long long)(1000 * S));
    add(t, 0, 0, line);
    add(t, 0, 0, "{\"ph\":\"M\",\"pid\":0,\"tid\":0,\"name\":\"process_name\",\"args\":{\"name\":\"rank 0\"}}");
    add(t, 0, 0, ",{\"ph\":\"M\",\"pid\":0,\"tid\":1,\"name\":\"thread_name\",\"args\":{\"name\":\"c0/\"}}");
    /* at agent monotonic 1010.0051 s: offset there 5.1 ms -> controller 1010 s */
    snprintf(line, sizeof(line), ",{\"ph\":\"X\",\"pid\":0,\"tid\":1,\"ts\":%llu.000,\"dur\":1.5,\"name\":\"mid\","
             "\"cat\":\"allreduce\",\"args\":{}}", (unsigned long long)((R + 500 * S + 10 * S + 5100000) / 1000));
    add(t, 0, 0, line);
    /* before the first ping: the first offset */
    snprintf(line, sizeof(line), ",{\"ph\":\"X\",\"pid\":0,\"tid\":1,\"ts\":%llu.250,\"dur\":1.5,\"name\":\"early\","
             "\"cat\":\"allreduce\",\"args\":{}}", (unsigned long long)((R + 500 * S - S + 5000000) / 1000));
    add(t, 0, 0, line);
    add(t, 0, 0, "],\"dshim_end\":{\"realtime_ns\":1,\"monotonic_ns\":1,\"events\":2}}");
    /* rank 1 on agent 1, killed: no end line, its last line cut */
    snprintf(line, sizeof(line), "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"dshim\":{\"format\":\"dshim-timeline\",\"version\":1,\"rank\":1,\"host\":\"b\","
             "\"pid\":12,\"realtime_ns\":%llu,\"monotonic_ns\":%llu}},\"traceEvents\":[",
             (unsigned long long)(R + 3 * S), (unsigned long long)(77 * S));
    add(t, 1, 1, line);
    snprintf(line, sizeof(line), ",{\"ph\":\"X\",\"pid\":1,\"tid\":1,\"ts\":%llu.000,\"dur\":2,\"name\":\"b1\","
             "\"cat\":\"allreduce\",\"args\":{}}", (unsigned long long)((R + 2 * S) / 1000));
    add(t, 1, 1, line);
    add(t, 1, 1, ",{\"ph\":\"X\",\"pid\":1,\"tid\":1,\"ts\":12");
    /* a line before any header is dropped */
    add(t, 0, 2, ",{\"ph\":\"X\",\"pid\":2,\"tid\":1,\"ts\":1.000,\"dur\":2,\"name\":\"orphan\",\"args\":{}}");

    run_plan_t plan = {0};
    run_proc_t procs[2] = {0};
    snprintf(procs[0].name, sizeof(procs[0].name), "rank 0");
    snprintf(procs[1].name, sizeof(procs[1].name), "rank 1");
    plan.procs = procs;
    plan.nprocs = 2;
    ck_assert_int_eq(run_timeline_write(t, &plan), 0);
    run_timeline_free(t);
    char *out = python(read_merged, path);
    if (!out) {
        unlink(path);
        return;
    }
    const char *want[] = {
        "dshim-timeline-merged 2 2 20.0\n",
        "M 0 process_name rank 0 on a\n",
        "M 0 process_sort_index 0\n",
        "M 0 thread_name c0/\n",
        "X 0 1 10000000.000 mid\n",
        "X 0 1 -999999.750 early\n",
        "M 1 process_name rank 1 on b\n",
        /* realtime R + 2 s = controller monotonic 1002 s */
        "X 1 1 2000000.000 b1\n",
    };
    const char *p = out;
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        const char *at = strstr(p, want[i]);
        ck_assert_msg(at, "'%s' not in (after what matched before):\n%s", want[i], out);
        p = at + strlen(want[i]);
    }
    ck_assert_msg(!strstr(out, "orphan") && !strstr(out, "process_name rank 0\n"), "%s", out);
    free(out);
    unlink(path);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("timeline");
    TCase *tc = tcase_create("timeline");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, json_escape);
    tcase_add_test(tc, writer_and_summary);
    tcase_add_test(tc, frames_of_the_timeline);
    tcase_add_test(tc, merge_aligns_clocks);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

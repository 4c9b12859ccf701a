/* Unit tests of the flight-recorder dump reader and what is made of dumps
 * (analyser/trace_read.h): the parser on good and on garbage input, a
 * directory of dumps, launcher.jsonl, and the diagnosis and status texts for
 * hand-written dumps of every case dshim-run meets: a rank that skipped a
 * collective, an idle rank, a killed rank, a stopped rank, mismatched
 * arguments, a sub-communicator's rank mapping, stragglers; and the MXNet
 * parameter server's rings (a stalled key, a skipped key or barrier, a killed
 * worker, a silent server). */
#include <check.h>
#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "trace_read.h"

#define SEC 1000000000ull
/* every hand-written dump says it was written at wall 1000 s, monotonic 500 s */
#define WALL (1000 * SEC)
#define MONO (500 * SEC)

typedef struct {
    char *buf;
    size_t len, cap;
} sb_t;

static void sb_add(sb_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_add(sb_t *b, const char *fmt, ...)
{
    char tmp[2048];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    ck_assert_int_lt(n, (int)sizeof(tmp));
    if (b->len + (size_t)n + 1 > b->cap) {
        b->cap = (b->len + (size_t)n + 1) * 2;
        b->buf = realloc(b->buf, b->cap);
    }
    memcpy(b->buf + b->len, tmp, (size_t)n + 1);
    b->len += (size_t)n;
}

static void head(sb_t *b, int rank, int size, const char *host, long pid, const char *reason, const char *why)
{
    sb_add(b, "{\"format\":\"dshim-trace\",\"version\":1,\"rank\":%d,\"size\":%d,\"host\":\"%s\",\"pid\":%ld,"
           "\"reason\":\"%s\",\"why\":\"%s\",\"realtime_ns\":%llu,\"monotonic_ns\":%llu}\n", rank, size, host, pid,
           reason, why, (unsigned long long)WALL, (unsigned long long)MONO);
}

static void ring(sb_t *b, const char *name, int rank, int size, int world_rank)
{
    sb_add(b, "{\"ring\":\"%s\",\"desc\":\"\",\"rank\":%d,\"size\":%d,\"world_rank\":%d,\"capacity\":2000,"
           "\"recorded\":9,\"dropped\":0}\n", name, rank, size, world_rank);
}

/* t_*: seconds before the dump (0 = not reached) */
static void entry(sb_t *b, const char *name, int id, long seq, const char *op, unsigned long long count,
                  const char *label, const char *state, const char *waiting, double tq, double td)
{
    unsigned long long q = tq > 0 ? MONO - (unsigned long long)(tq * 1e9) : 0;
    unsigned long long d = td > 0 ? MONO - (unsigned long long)(td * 1e9) : 0;
    sb_add(b, "{\"ring\":\"%s\",\"id\":%d,\"seq\":%ld,\"op\":\"%s\",\"dtype\":\"float32\",\"count\":%llu,"
           "\"bytes\":%llu,\"root\":%d,\"peer\":-1,\"redop\":\"sum\",\"label\":\"%s\",\"state\":\"%s\","
           "\"waiting_for\":[%s],\"algo\":\"ring\",\"transport\":\"shm\",\"t_queued_ns\":%llu,"
           "\"t_started_ns\":%llu,\"t_done_ns\":%llu,\"wait_ns\":0}\n", name, id, seq, op, count, count * 4,
           strcmp(op, "broadcast") == 0 ? 0 : -1, label, state, waiting, q, q, d);
}

static void add_dump(dshim_trace_set_t *set, sb_t *b)
{
    dshim_trace_dump_t d;
    ck_assert_int_eq(dshim_trace_parse(b->buf, b->len, &d), 0);
    ck_assert_int_eq((int)d.bad_lines, 0);
    dshim_trace_set_add(set, &d);
    free(b->buf);
    memset(b, 0, sizeof(*b));
}

static void add_proc(dshim_trace_set_t *set, int rank, const char *host, long pid, dshim_trace_proc_state_t st,
                     int code, int sig, char pstate, int asked, int answered)
{
    set->procs = realloc(set->procs, (set->nprocs + 1) * sizeof(*set->procs));
    dshim_trace_proc_t *p = &set->procs[set->nprocs++];
    memset(p, 0, sizeof(*p));
    p->rank = rank;
    snprintf(p->name, sizeof(p->name), "rank %d", rank);
    snprintf(p->host, sizeof(p->host), "%s", host);
    p->pid = pid;
    p->state = st;
    p->code = code;
    p->sig = sig;
    p->pstate = pstate;
    p->asked = asked;
    p->answered = answered;
}

static char *diag(const dshim_trace_set_t *set)
{
    char *t = dshim_trace_diagnose(set, 10, 0);
    fprintf(stderr, "---- diagnosis\n%s", t);
    return t;
}

#define HAS(text, needle) ck_assert_msg(strstr((text), (needle)) != NULL, "missing \"%s\" in:\n%s", (needle), (text))
#define HASNT(text, needle) ck_assert_msg(strstr((text), (needle)) == NULL, "unexpected \"%s\" in:\n%s", (needle), (text))

static int count_lines(const char *t)
{
    int n = 0;
    for (; *t; t++) {
        n += *t == '\n';
    }
    return n;
}

START_TEST(parse_good_dump)
{
    sb_t b = {0};
    head(&b, 3, 4, "node\\u00e9b", 812, "timeout", "rank 3: \\\"allreduce\\\" timed out\\n(3 s)");
    ring(&b, "c0", 3, 4, 3);
    entry(&b, "c0", 7, 41, "allreduce", 25165824, "DDP bucket 2", "done", "", 2, 1.5);
    sb_add(&b, "{\"ring\":\"c0\",\"id\":8,\"seq\":18446744073709551615,\"op\":\"allreduce\",\"state\":\"queued\","
           "\"future_key\":{\"nested\":[1,{\"a\":null}],\"x\":true},\"f\":1.5e3,\"waiting_for\":[2,3]}\n");
    dshim_trace_dump_t d;
    ck_assert_int_eq(dshim_trace_parse(b.buf, b.len, &d), 0);
    ck_assert_int_eq(d.rank, 3);
    ck_assert_int_eq(d.size, 4);
    ck_assert_str_eq(d.host, "node\xc3\xa9" "b");
    ck_assert_int_eq(d.pid, 812);
    ck_assert_str_eq(d.reason, "timeout");
    ck_assert_str_eq(d.why, "rank 3: \"allreduce\" timed out\n(3 s)");
    ck_assert_uint_eq(d.realtime_ns, WALL);
    ck_assert_uint_eq(d.monotonic_ns, MONO);
    ck_assert_int_eq((int)d.nrings, 1);
    ck_assert_int_eq((int)d.bad_lines, 0);
    dshim_trace_dring_t *r = &d.rings[0];
    ck_assert_str_eq(r->name, "c0");
    ck_assert_int_eq(r->world_rank, 3);
    ck_assert_int_eq((int)r->n, 2);
    ck_assert_uint_eq(r->recs[0].seq, 41);
    ck_assert_uint_eq(r->recs[0].count, 25165824);
    ck_assert_str_eq(r->recs[0].label, "DDP bucket 2");
    ck_assert_int_eq(r->recs[0].state, 3);
    ck_assert_uint_eq(r->recs[1].seq, DSHIM_TRACE_SEQ_NONE);
    ck_assert_int_eq(r->recs[1].state, 0);
    ck_assert_int_eq(r->recs[1].nwaiting, 2);
    ck_assert_int_eq(r->recs[1].waiting_for[1], 3);
    ck_assert_int_eq(r->recs[1].root, -1);
    dshim_trace_dump_free(&d);
    free(b.buf);
}
END_TEST

START_TEST(parse_rejects_and_skips_garbage)
{
    dshim_trace_dump_t d;
    const char *bad_heads[] = {"", "\n\n", "garbage", "{}", "{\"format\":\"dshim-trace\",\"version\":2}",
                               "{\"format\":\"other\",\"version\":1}", "{\"format\":\"dshim-trace\",\"version\":1",
                               "[1,2,3]", "{\"format\":\"dshim-trace\" \"version\":1}",
                               "{\"format\":\"dshim-t\\u0000race\",\"version\":1}"};
    for (size_t i = 0; i < sizeof(bad_heads) / sizeof(bad_heads[0]); i++) {
        ck_assert_int_eq(dshim_trace_parse(bad_heads[i], strlen(bad_heads[i]), &d), -1);
        ck_assert_int_eq((int)d.nrings, 0);
        dshim_trace_dump_free(&d);
    }
    ck_assert_int_eq(dshim_trace_parse(NULL, 5, &d), -1);
    /* a good header, then lines of every kind of wrong */
    const char *text =
        "{\"format\":\"dshim-trace\",\"version\":1,\"rank\":99999999999999999999,\"pid\":-5,\"host\":\"h\"}\n"
        "not json\n"
        "{\"ring\":\"c0\",\"id\":1,\"op\":\"allreduce\",\"state\":\"done\"\n"  /* unterminated */
        "{\"ring\":\"c0\",\"id\":1,\"op\":\"allre\\q\"}\n"                      /* bad escape */
        "{\"ring\":\"c0\",\"id\":1,\"op\":\"x\",\"waiting_for\":[1,2,3,4,5,6,7,8,9,10,11,-1]}\n"
        "{\"ring\":\"c0\",\"id\":2,\"op\":\"\\ud800\\u0041\"}\n"                 /* lone surrogate */
        "{\"ring\":\"c0\",\"id\":3,\"op\":\"tab\there\"}\n"                    /* raw control char */
        "{\"id\":4,\"op\":\"no ring\"}\n"
        "{\"ring\":\"c0\",\"id\":5,\"count\":-3,\"seq\":1.5}\n"
        "{\"ring\":\"c0\",\"deep\":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}\n"
        "{\"ring\":\"c0\",\"id\":6} trailing\n"
        "\r\n";
    ck_assert_int_eq(dshim_trace_parse(text, strlen(text), &d), 0);
    ck_assert_int_eq(d.rank, -1);  /* out of range: not taken */
    ck_assert_int_eq((int)d.nrings, 1);
    ck_assert_int_eq((int)d.rings[0].n, 3); /* ids 1, 2, 5 */
    ck_assert_int_eq(d.rings[0].recs[0].nwaiting, 8);
    ck_assert_str_eq(d.rings[0].recs[1].op, "\xef\xbf\xbd" "A");
    ck_assert_uint_eq(d.rings[0].recs[2].count, 0);
    ck_assert_uint_eq(d.rings[0].recs[2].seq, DSHIM_TRACE_SEQ_NONE);
    ck_assert_int_eq((int)d.bad_lines, 7);
    dshim_trace_dump_free(&d);
    /* an overlong string is cut, never overflows, and never splits a UTF-8 character */
    sb_t b = {0};
    head(&b, 0, 1, "h", 1, "signal", "");
    sb_add(&b, "{\"ring\":\"c0\",\"id\":1,\"label\":\"");
    for (int i = 0; i < 300; i++) {
        sb_add(&b, "\xc3\xa9");
    }
    sb_add(&b, "\"}\n");
    ck_assert_int_eq(dshim_trace_parse(b.buf, b.len, &d), 0);
    size_t n = strlen(d.rings[0].recs[0].label);
    ck_assert_uint_le(n, 63);
    ck_assert_int_eq((int)(n % 2), 0);
    dshim_trace_dump_free(&d);
    free(b.buf);
}
END_TEST

/* Random damage to a real-looking dump: the parser and both texts must
 * survive it (and ASan/valgrind runs of this test check the memory). */
START_TEST(survives_random_damage)
{
    sb_t b = {0};
    head(&b, 1, 2, "h", 11, "timeout", "why");
    ring(&b, "c0", 1, 2, 1);
    for (int i = 0; i < 12; i++) {
        entry(&b, "c0", i, i, i % 3 ? "allreduce" : "broadcast", 100, "lbl", i == 11 ? "waiting" : "done", "0",
              20 - i, 19.5 - i);
    }
    unsigned seed = 12345;
    char *copy = malloc(b.len + 1);
    for (int iter = 0; iter < 3000; iter++) {
        memcpy(copy, b.buf, b.len);
        size_t len = b.len;
        int edits = 1 + (int)(rand_r(&seed) % 8);
        for (int k = 0; k < edits; k++) {
            size_t pos = rand_r(&seed) % len;
            switch (rand_r(&seed) % 4) {
            case 0: copy[pos] = (char)(rand_r(&seed) & 0xff); break;
            case 1: len = pos + 1; break;
            case 2: copy[pos] = "{}[]\",:\\-0123456789\n"[rand_r(&seed) % 21]; break;
            default: copy[pos] ^= (char)(1 << (rand_r(&seed) % 8)); break;
            }
        }
        dshim_trace_set_t set = {0};
        dshim_trace_dump_t d;
        if (dshim_trace_parse(copy, len, &d) == 0) {
            dshim_trace_set_add(&set, &d);
        } else {
            dshim_trace_dump_free(&d);
        }
        /* a second, intact member so that the diagnosis compares ranks */
        sb_t o = {0};
        head(&o, 0, 2, "h", 10, "timeout", "");
        ring(&o, "c0", 0, 2, 0);
        entry(&o, "c0", 0, 11, "allreduce", 100, "", "waiting", "1", 3, 0);
        dshim_trace_dump_t od;
        ck_assert_int_eq(dshim_trace_parse(o.buf, o.len, &od), 0);
        dshim_trace_set_add(&set, &od);
        free(o.buf);
        char *t1 = dshim_trace_diagnose(&set, 10, 0);
        char *t2 = dshim_trace_status(&set, 20, 0);
        ck_assert_ptr_nonnull(t1);
        ck_assert_ptr_nonnull(t2);
        free(t1);
        free(t2);
        dshim_trace_set_free(&set);
    }
    free(copy);
    free(b.buf);
}
END_TEST

START_TEST(ranges)
{
    char out[64];
    int a[] = {8, 0, 1, 2, 3, 4, 5, 6};
    dshim_trace_ranges(a, 8, out, sizeof(out));
    ck_assert_str_eq(out, "0-6,8");
    int b2[] = {3, 1};
    dshim_trace_ranges(b2, 2, out, sizeof(out));
    ck_assert_str_eq(out, "1,3");
    int c[] = {0, 1, 1, 5, 6};
    dshim_trace_ranges(c, 5, out, sizeof(out));
    ck_assert_str_eq(out, "0,1,5,6");
    dshim_trace_ranges(NULL, 0, out, sizeof(out));
    ck_assert_str_eq(out, "");
    int many[40];
    for (int i = 0; i < 40; i++) {
        many[i] = i * 3;
    }
    char small[16];
    dshim_trace_ranges(many, 40, small, sizeof(small));
    ck_assert_uint_lt(strlen(small), sizeof(small));
    HAS(small, "...");
}
END_TEST

/* The example: ranks 0,1,3 in allreduce #1043, rank 2 in broadcast #1043. */
START_TEST(diagnose_skipped_collective)
{
    dshim_trace_set_t set = {0};
    for (int r = 0; r < 4; r++) {
        sb_t b = {0};
        head(&b, r, 4, r == 2 ? "b" : "a", 800 + r * 4, r == 2 ? "signal" : "timeout",
             r == 2 ? "" : "dshim: allreduce timed out waiting for rank 2");
        ring(&b, "c0", r, 4, r);
        entry(&b, "c0", 0, 1042, "allreduce", 25165824, "DDP bucket 1", "done", "", 40, 39);
        if (r == 2) {
            entry(&b, "c0", 1, 1043, "broadcast", 100, "torch broadcast", "waiting", "0", 38, 0);
        } else {
            entry(&b, "c0", 1, 1043, "allreduce", 25165824, "DDP bucket 2", "failed", "2", 38, 0);
        }
        add_dump(&set, &b);
    }
    for (int r = 0; r < 4; r++) {
        add_proc(&set, r, r == 2 ? "b" : "a", 800 + r * 4, r == 0 ? DSHIM_TRACE_PROC_EXITED : DSHIM_TRACE_PROC_RUNNING,
                 r == 0 ? 1 : 0, 0, 'S', 1, 1);
    }
    char *t = diag(&set);
    HAS(t, "ranks 0,1,3 wait in allreduce #1043 (float32 \xc3\x97 25,165,824, from DDP bucket 2) for rank 2");
    HAS(t, "rank 2 (host b, pid 808) last completed allreduce #1042 and is now in broadcast #1043");
    HAS(t, "from torch broadcast");
    HAS(t, "first error: rank 0");
    ck_assert_int_le(count_lines(t), 10);
    free(t);
    dshim_trace_set_free(&set);
}
END_TEST

START_TEST(diagnose_idle_rank)
{
    dshim_trace_set_t set = {0};
    for (int r = 0; r < 8; r++) {
        sb_t b = {0};
        head(&b, r, 8, r == 5 ? "b" : "a", 100 + r, "signal", "");
        ring(&b, "c0", r, 8, r);
        entry(&b, "c0", 0, 88, "allreduce", 4, "", "done", "", 313, 312);
        if (r != 5) {
            entry(&b, "c0", 1, 89, "allreduce", 4, "torch all_reduce", "waiting", "5", 311, 0);
        }
        add_dump(&set, &b);
    }
    char *t = diag(&set);
    HAS(t, "ranks 0-4,6,7 wait in allreduce #89 (float32 \xc3\x97 4, from torch all_reduce) for rank 5 (for 311 s)");
    HAS(t, "rank 5 (host b, pid 105) has not called any collective for 312 s (last: allreduce #88 done)");
    free(t);
    dshim_trace_set_free(&set);
}
END_TEST

START_TEST(diagnose_killed_and_stopped)
{
    for (int stopped = 0; stopped < 2; stopped++) {
        dshim_trace_set_t set = {0};
        for (int r = 0; r < 3; r++) {
            if (r == 2) {
                continue;
            }
            sb_t b = {0};
            head(&b, r, 3, "a", 900 + r, stopped ? "signal" : "peer", stopped ? "" : "rank 2 closed the connection");
            ring(&b, "c0", r, 3, r);
            entry(&b, "c0", 0, 11, "allreduce", 8, "", "done", "", 5, 4);
            entry(&b, "c0", 1, 12, "allreduce", 8, "", stopped ? "waiting" : "failed", "2", 4, 0);
            add_dump(&set, &b);
        }
        for (int r = 0; r < 3; r++) {
            if (r == 2 && !stopped) {
                add_proc(&set, r, "a", 900 + r, DSHIM_TRACE_PROC_KILLED, 0, 9, 0, 0, 0);
            } else {
                add_proc(&set, r, "a", 900 + r, DSHIM_TRACE_PROC_RUNNING, 0, 0, r == 2 ? 'T' : 'S', 1, r != 2);
            }
        }
        char *t = diag(&set);
        HAS(t, "ranks 0,1 wait in allreduce #12 (float32 \xc3\x97 8) for rank 2");
        if (stopped) {
            HAS(t, "rank 2 (host a, pid 902) is alive but stopped (SIGSTOP or a debugger), so it wrote no dump");
        } else {
            HAS(t, "rank 2 (host a, pid 902) left no dump (it died: the launcher saw it killed by signal 9, SIGKILL)");
            HAS(t, "the others wait for it in allreduce #12");
            HAS(t, "first error: rank 0 (host a, peer): rank 2 closed the connection");
        }
        free(t);
        /* the status says the same about the missing rank */
        t = dshim_trace_status(&set, 20, 0);
        fprintf(stderr, "---- status\n%s", t);
        HAS(t, stopped ? "rank 2 (host a, pid 902): no dump: it is stopped" : "rank 2 (host a, pid 902): no dump: it was killed");
        free(t);
        /* a rank that does not answer, not stopped */
        set.procs[2].state = DSHIM_TRACE_PROC_RUNNING;
        set.procs[2].pstate = 'D';
        set.procs[2].asked = 1;
        set.wait_s = 1.0;
        t = diag(&set);
        HAS(t, "rank 2 (host a, pid 902) is alive but did not answer the dump signal within 1.0 s");
        free(t);
        dshim_trace_set_free(&set);
    }
}
END_TEST

START_TEST(diagnose_mismatched_counts)
{
    dshim_trace_set_t set = {0};
    for (int r = 0; r < 2; r++) {
        sb_t b = {0};
        head(&b, r, 2, "h", 50 + r, "mismatch", "allreduce #5 does not match");
        ring(&b, "c0", r, 2, r);
        entry(&b, "c0", 0, 5, "allreduce", r ? 200 : 100, "", "failed", "", 1, 0);
        add_dump(&set, &b);
    }
    char *t = diag(&set);
    HAS(t, "rank 0 waits in allreduce #5 (float32 \xc3\x97 100) for rank 1");
    HAS(t, "rank 1 (host h, pid 51) is in allreduce #5 too but with float32 \xc3\x97 200 where the others have "
           "float32 \xc3\x97 100: the calls do not match");
    free(t);
    dshim_trace_set_free(&set);
}
END_TEST

/* A sub-communicator of world ranks 1 and 3: ring ranks are mapped. */
START_TEST(diagnose_maps_ring_ranks)
{
    dshim_trace_set_t set = {0};
    for (int w = 0; w < 4; w++) {
        sb_t b = {0};
        head(&b, w, 4, "h", 70 + w, "signal", "");
        ring(&b, "c0", w, 4, w);
        entry(&b, "c0", 0, 3, "allreduce", 1, "", "done", "", 9, 8);
        if (w == 1 || w == 3) {
            ring(&b, "c0.s1", w == 1 ? 0 : 1, 2, w);
            if (w == 1) {
                entry(&b, "c0.s1", 0, 0, "allgather", 16, "", "waiting", "1", 7, 0);
            }
        }
        add_dump(&set, &b);
    }
    char *t = diag(&set);
    HAS(t, "rank 1 waits in allgather #0 (float32 \xc3\x97 16) for rank 3");
    HAS(t, "rank 3 (host h, pid 73) has not called any operation in c0.s1");
    free(t);
    dshim_trace_set_free(&set);
}
END_TEST

START_TEST(diagnose_many_ranks_fits_a_screen)
{
    dshim_trace_set_t set = {0};
    for (int r = 0; r < 64; r++) {
        if (r == 17 || r == 40) {
            continue;  /* two ranks died */
        }
        sb_t b = {0};
        head(&b, r, 64, "h", 1000 + r, "signal", "");
        ring(&b, "c0", r, 64, r);
        entry(&b, "c0", 0, 1, "allreduce", 1, "", "done", "", 9, 8);
        if (r % 7 != 3) {
            entry(&b, "c0", 1, 2, "allreduce", 1, "", "waiting", "17", 7, 0);
        }
        add_dump(&set, &b);
    }
    add_proc(&set, 17, "h", 1017, DSHIM_TRACE_PROC_KILLED, 0, 9, 0, 0, 0);
    add_proc(&set, 40, "h", 1040, DSHIM_TRACE_PROC_KILLED, 0, 9, 0, 0, 0);
    char *t = diag(&set);
    ck_assert_int_le(count_lines(t), 10);
    HAS(t, "ranks 17,40 left no dump (they died: the launcher saw it killed by signal 9, SIGKILL)");
    HAS(t, "ranks 3,10,24,31,38,45,52,59 have not called any collective for 8.0 s (last: allreduce #1 done)");
    free(t);
    dshim_trace_set_free(&set);
}
END_TEST

START_TEST(diagnose_nothing)
{
    dshim_trace_set_t set = {0};
    char *t = diag(&set);
    HAS(t, "no flight-recorder dump");
    free(t);
    add_proc(&set, 0, "h", 1, DSHIM_TRACE_PROC_EXITED, 1, 0, 0, 0, 0);
    t = diag(&set);
    HAS(t, "no flight-recorder dump arrived from the 1 process(es)");
    free(t);
    /* all idle: where everyone is */
    sb_t b = {0};
    head(&b, 0, 1, "h", 5, "request", "");
    ring(&b, "c0", 0, 1, 0);
    entry(&b, "c0", 0, 7, "barrier", 0, "", "done", "", 3, 2);
    add_dump(&set, &b);
    t = diag(&set);
    HAS(t, "all 1 rank(s) idle, nobody waits; the last operation, barrier #7, ended 2.0 s ago");
    free(t);
    dshim_trace_set_free(&set);
}
END_TEST

/* ---- MXNet: dshim's parameter server's rings (shim/ps/ps_trace.h) ---------- */

static void ps_ring(sb_t *b, const char *name, const char *desc, int rank, int size)
{
    sb_add(b, "{\"ring\":\"%s\",\"desc\":\"%s\",\"rank\":%d,\"size\":%d,\"world_rank\":%d,\"capacity\":2000,"
           "\"recorded\":9,\"dropped\":0}\n", name, desc, rank, size, rank);
}

/* op "push" (pushpull, push, init), "pull" or "barrier"; peer = the server
 * (worker rings) or -1; t_*: seconds before the dump */
static void ps_entry(sb_t *b, const char *name, int id, long seq, const char *op, const char *label, int peer,
                     const char *state, const char *waiting, double tq, double td)
{
    unsigned long long q = tq > 0 ? MONO - (unsigned long long)(tq * 1e9) : 0;
    unsigned long long d = td > 0 ? MONO - (unsigned long long)(td * 1e9) : 0;
    int data = strcmp(op, "barrier") != 0;
    sb_add(b, "{\"ring\":\"%s\",\"id\":%d,\"seq\":%ld,\"op\":\"%s\",\"dtype\":\"%s\",\"count\":%d,\"bytes\":%d,"
           "\"root\":-1,\"peer\":%d,\"redop\":\"%s\",\"label\":\"%s\",\"state\":\"%s\",\"waiting_for\":[%s],"
           "\"algo\":\"\",\"transport\":\"tcp\",\"t_queued_ns\":%llu,\"t_started_ns\":%llu,\"t_done_ns\":%llu,"
           "\"wait_ns\":0,\"t_waiting_ns\":0}\n", name, id, seq, op, data ? "float32" : "", data ? 12 : 0,
           data ? 48 : 0, peer, data ? "sum" : "", label, state, waiting, q, q, d);
}

static void ps_proc(dshim_trace_set_t *set, const char *name, const char *host, long pid,
                    dshim_trace_proc_state_t st, int code, int sig, char pstate)
{
    add_proc(set, -1, host, pid, st, code, sig, pstate, 0, st == DSHIM_TRACE_PROC_RUNNING);
    snprintf(set->procs[set->nprocs - 1].name, sizeof(set->procs[0].name), "%s", name);
}

#define SRV_DESC(s) "MXNet server " #s " of 2 (2 workers): an entry per key and round; waiting_for = worker ranks"
#define WRK_DESC(w) "MXNet worker " #w " of 2 (2 servers): pushes, pulls, barriers; peer and waiting_for = server ranks"
#define SCH_DESC "MXNet scheduler (2 workers, 2 servers): an entry per barrier; waiting_for = the missing workers' " \
                 "ranks, else the missing servers'"

/* The job of tests/mxnet/scripts/stall_push.py: 2 servers, 2 workers; keys
 * 0,2,4 on server 0 and 1,3,5 on server 1.  Every worker pushed rounds 1-3 of
 * every key and round 4 of keys 0-2; worker 0 also pushed key 3 round 4, and
 * waits for its answer.  Worker 1 (w1_mode): 0 sits idle, 1 is in a barrier
 * (it skipped key 3), 2 is killed (no dump). */
static void ps_stalled_job(dshim_trace_set_t *set, int w1_mode)
{
    sb_t b = {0};
    head(&b, 0, 1, "a", 10, "signal", "");
    ps_ring(&b, "ps/scheduler", SCH_DESC, 0, 1);
    for (int i = 0; i < 4; i++) {
        ps_entry(&b, "ps/scheduler", i, i + 1, "barrier", "MXNet barrier (workers)", -1, "done", "", 30 - i,
                 29.5 - i);
    }
    if (w1_mode == 1) {
        ps_entry(&b, "ps/scheduler", 4, 5, "barrier", "MXNet barrier (workers)", -1, "waiting", "0", 4.0, 0);
    }
    add_dump(set, &b);
    for (int s = 0; s < 2; s++) {
        char name[32], label[48];
        snprintf(name, sizeof(name), "ps/server.%d", s);
        head(&b, s, 2, "b", 11 + s, s == 1 ? "timeout" : "signal",
             s == 1 ? "server 1 (host b) waits for key 3 round 4 from worker 1 (pushed by worker 0); worker 1 last "
                      "pushed key 1 round 4 to it 6.5 s ago; no push of key 3 for 6.0 s (DSHIM_TIMEOUT=6 s): the "
                      "job ends" : "");
        ps_ring(&b, name, s ? SRV_DESC(1) : SRV_DESC(0), s, 2);
        int id = 0;
        for (int k = s; k < 6; k += 2) {
            snprintf(label, sizeof(label), "MXNet init key %d", k);
            ps_entry(&b, name, id++, 0, "push", label, 0, "done", "", 25, 25);
        }
        for (int round = 1; round <= 4; round++) {
            for (int k = s; k < 6; k += 2) {
                double t = 20 - round * 3 - k * 0.5;
                snprintf(label, sizeof(label), "MXNet push key %d", k);
                if (round == 4 && k == 3) {
                    ps_entry(&b, name, id++, round, "push", label, -1, "waiting", "1", 6.0, 0);
                } else if (round < 4 || k < 3) {
                    ps_entry(&b, name, id++, round, "push", label, -1, "done", "", t, t - 0.1);
                }
            }
        }
        add_dump(set, &b);
    }
    for (int w = 0; w < 2; w++) {
        if (w == 1 && w1_mode == 2) {
            continue;
        }
        char name[32], label[48];
        snprintf(name, sizeof(name), "ps/worker.%d", w);
        head(&b, w, 2, "c", 20 + w, "timeout", "server 1 (host b) waits for key 3 round 4 from worker 1");
        ps_ring(&b, name, w ? WRK_DESC(1) : WRK_DESC(0), w, 2);
        int id = 0;
        for (int round = 1; round <= 4; round++) {
            for (int k = 0; k < 6; k++) {
                double t = 20.2 - round * 3 - k * 0.5;
                snprintf(label, sizeof(label), "MXNet pushpull key %d", k);
                if (round == 4 && k == 3 && w == 0) {
                    ps_entry(&b, name, id++, round, "push", label, 1, "waiting", "1", 6.2, 0);
                } else if (round < 4 || k < 3) {
                    ps_entry(&b, name, id++, round, "push", label, k % 2, "done", "", t, t - 0.2);
                }
            }
        }
        if (w == 1 && w1_mode == 1) {
            ps_entry(&b, name, id++, 6, "barrier", "MXNet barrier (workers)", -1, "started", "", 4.0, 0);
        }
        add_dump(set, &b);
    }
    ps_proc(set, "scheduler", "a", 10, DSHIM_TRACE_PROC_RUNNING, 0, 0, 'S');
    ps_proc(set, "server 0", "b", 11, DSHIM_TRACE_PROC_RUNNING, 0, 0, 'S');
    ps_proc(set, "server 1", "b", 12, DSHIM_TRACE_PROC_RUNNING, 0, 0, 'S');
    ps_proc(set, "worker 0", "c", 20, DSHIM_TRACE_PROC_EXITED, 1, 0, 0);
    if (w1_mode == 2) {
        ps_proc(set, "worker 1", "c", 21, DSHIM_TRACE_PROC_KILLED, 0, 9, 0);
    } else {
        ps_proc(set, "worker 1", "c", 21, DSHIM_TRACE_PROC_RUNNING, 0, 0, 'S');
    }
}

/* Worker 1 stopped pushing before key 3 (the real job's shape): the server
 * that waits, for what from whom, and what worker 1 did last; no ring is
 * read as a communicator. */
START_TEST(diagnose_ps_stalled_key)
{
    dshim_trace_set_t set = {0};
    ps_stalled_job(&set, 0);
    char *t = diag(&set);
    HAS(t, "first error: server 1 (host b, timeout): no push of key 3 for 6.0 s (DSHIM_TIMEOUT=6 s): the job ends\n");
    HAS(t, "\nserver 1 (host b, pid 12) waits for key 3 round 4 from worker 1 (pushed by worker 0) for 6.0 s\n");
    HAS(t, "\nworker 1 (host c, pid 21) last pushed key 1 round 4 to server 1 7.7 s ago; it has made no request "
           "since its pushpull key 2 round 4 to server 0, which ended 7.0 s ago\n");
    HASNT(t, "left no dump");
    HASNT(t, "rank ");
    HASNT(t, "[MXNet");
    HASNT(t, "server 0 (");
    ck_assert_int_eq(count_lines(t), 3);
    free(t);
    /* the status: roles, and whom each waits for */
    t = dshim_trace_status(&set, 20, 0);
    fprintf(stderr, "---- status\n%s", t);
    HAS(t, "wkr0   c                20       pushpull key 3 round 4 to server 1");
    HAS(t, "server 1");
    HAS(t, "srv1   b                12       push key 3 round 4");
    HAS(t, "worker 1");
    HAS(t, "sched ");
    free(t);
    dshim_trace_set_free(&set);
}
END_TEST

/* Worker 1 skipped key 3 and went on to a barrier, where the scheduler waits
 * for worker 0 (which waits for key 3's answer): every wait named. */
START_TEST(diagnose_ps_skipped_key_in_barrier)
{
    dshim_trace_set_t set = {0};
    ps_stalled_job(&set, 1);
    char *t = diag(&set);
    HAS(t, "\nserver 1 (host b, pid 12) waits for key 3 round 4 from worker 1 (pushed by worker 0) for 6.0 s\n");
    HAS(t, "\nworker 1 (host c, pid 21) last pushed key 1 round 4 to server 1 7.7 s ago; it is now in barrier "
           "(workers) #6 for 4.0 s: it skipped key 3\n");
    HAS(t, "\nthe scheduler's barrier #5 (workers) waits for worker 0 (arrived: worker 1) for 4.0 s\n");
    HAS(t, "\nworker 0 (host c, pid 20) is now in pushpull key 3 round 4 to server 1, unanswered for 6.2 s\n");
    ck_assert_int_le(count_lines(t), 10);
    free(t);
    dshim_trace_set_free(&set);
}
END_TEST

/* A worker that never reaches a barrier (stall_push.py --mode barrier): the
 * scheduler waits for it, the servers for nobody. */
START_TEST(diagnose_ps_skipped_barrier)
{
    dshim_trace_set_t set = {0};
    sb_t b = {0};
    head(&b, 0, 1, "a", 10, "request", "");
    ps_ring(&b, "ps/scheduler", SCH_DESC, 0, 1);
    ps_entry(&b, "ps/scheduler", 0, 1, "barrier", "MXNet barrier (all)", -1, "done", "", 30, 29);
    ps_entry(&b, "ps/scheduler", 1, 7, "barrier", "MXNet barrier (workers)", -1, "waiting", "1", 3.0, 0);
    add_dump(&set, &b);
    for (int s = 0; s < 2; s++) {
        char name[32];
        snprintf(name, sizeof(name), "ps/server.%d", s);
        head(&b, s, 2, "b", 11 + s, "request", "");
        ps_ring(&b, name, s ? SRV_DESC(1) : SRV_DESC(0), s, 2);
        ps_entry(&b, name, 0, 3, "push", s ? "MXNet push key 5" : "MXNet push key 4", -1, "done", "", 4.0, 3.9);
        add_dump(&set, &b);
    }
    for (int w = 0; w < 2; w++) {
        char name[32];
        snprintf(name, sizeof(name), "ps/worker.%d", w);
        head(&b, w, 2, "c", 20 + w, "request", "");
        ps_ring(&b, name, w ? WRK_DESC(1) : WRK_DESC(0), w, 2);
        ps_entry(&b, name, 0, 3, "push", "MXNet pushpull key 5", 1, "done", "", 4.0, 3.5);
        if (w == 0) {
            ps_entry(&b, name, 1, 9, "barrier", "MXNet barrier (workers)", -1, "started", "", 3.0, 0);
        }
        add_dump(&set, &b);
    }
    char *t = diag(&set);
    HAS(t, "the scheduler's barrier #7 (workers) waits for worker 1 (arrived: worker 0) for 3.0 s\n");
    HAS(t, "\nworker 1 (host c, pid 21) has made no request since its pushpull key 5 round 3 to server 1, which "
           "ended 3.5 s ago\n");
    HASNT(t, "first error");
    HASNT(t, "waits for key");
    ck_assert_int_eq(count_lines(t), 2);
    free(t);
    dshim_trace_set_free(&set);
}
END_TEST

/* Worker 1 was killed: no dump; the launcher's facts say how it ended. */
START_TEST(diagnose_ps_killed_worker)
{
    dshim_trace_set_t set = {0};
    ps_stalled_job(&set, 2);
    char *t = diag(&set);
    HAS(t, "\nserver 1 (host b, pid 12) waits for key 3 round 4 from worker 1 (pushed by worker 0) for 6.0 s\n");
    HAS(t, "\nworker 1 (host c, pid 21) left no dump (it died: the launcher saw it killed by signal 9, SIGKILL) "
           "\xe2\x80\x94 server 1 waits for its push of key 3 round 4\n");
    ck_assert_int_le(count_lines(t), 10);
    free(t);
    dshim_trace_set_free(&set);
}
END_TEST

/* Workers wait for a server that waits for nobody: stopped (no dump), or
 * with no open round of the key; then nobody waits at all. */
START_TEST(diagnose_ps_silent_server)
{
    for (int stopped = 0; stopped < 3; stopped++) {
        dshim_trace_set_t set = {0};
        sb_t b = {0};
        if (stopped != 1) {
            head(&b, 1, 2, "b", 12, "request", "");
            ps_ring(&b, "ps/server.1", SRV_DESC(1), 1, 2);
            ps_entry(&b, "ps/server.1", 0, 3, "push", "MXNet push key 3", -1, "done", "", 9.0, 8.0);
            add_dump(&set, &b);
        }
        for (int w = 0; w < 2; w++) {
            char name[32];
            snprintf(name, sizeof(name), "ps/worker.%d", w);
            head(&b, w, 2, "c", 20 + w, stopped ? "timeout" : "request",
                 stopped ? "worker 0: no answer from server 1 (pid 12 on host b) for 11 s" : "");
            ps_ring(&b, name, w ? WRK_DESC(1) : WRK_DESC(0), w, 2);
            ps_entry(&b, name, 0, 3, "push", "MXNet pushpull key 3", 1, "done", "", 9.5, 8.0);
            if (stopped < 2) {
                ps_entry(&b, name, 1, 4, "push", "MXNet pushpull key 3", 1, stopped ? "failed" : "waiting", "1",
                         7.0 - w, 0);
            }
            add_dump(&set, &b);
        }
        ps_proc(&set, "server 1", "b", 12, DSHIM_TRACE_PROC_RUNNING, 0, 0, stopped == 1 ? 'T' : 'S');
        char *t = diag(&set);
        if (stopped == 1) {
            HAS(t, "workers 0,1 wait for server 1 (pushpull key 3 round 4, for 7.0 s); server 1 (host b, pid 12) is "
                   "alive but stopped (SIGSTOP or a debugger), so it wrote no dump\n");
            HAS(t, "first error: worker 0 (host c, timeout): worker 0: no answer from server 1");
        } else if (stopped == 0) {
            HAS(t, "workers 0,1 wait for server 1 (pushpull key 3 round 4, for 7.0 s), which has no open round: its "
                   "last round of key 3, round 3, ended 8.0 s ago\n");
        } else {
            HAS(t, "MXNet parameter server: nobody waits (3 of its 5 processes dumped); the last round, key 3 "
                   "round 3 on server 1, ended 8.0 s ago\n");
        }
        ck_assert_int_le(count_lines(t), 10);
        free(t);
        dshim_trace_set_free(&set);
    }
}
END_TEST

START_TEST(status_and_stragglers)
{
    dshim_trace_set_t set = {0};
    for (int r = 0; r < 3; r++) {
        sb_t b = {0};
        head(&b, r, 3, "h", 60 + r, "request", "");
        ring(&b, "c0", r, 3, r);
        for (int i = 0; i < 30; i++) {
            /* rank 1 calls every collective 200 ms after the others */
            double t0 = 31.0 - i + (r == 1 ? -0.2 : 0.0);
            entry(&b, "c0", i, i, "allreduce", 1024, "", "done", "", t0, 30.0 - i);
        }
        entry(&b, "c0", 30, 30, "allreduce", 1024, "", r == 1 ? "started" : "waiting", r == 1 ? "" : "1", 0.5, 0);
        add_dump(&set, &b);
    }
    char *t = dshim_trace_status(&set, 20, 0);
    fprintf(stderr, "---- status\n%s", t);
    HAS(t, "allreduce #30 (float32 \xc3\x97 1,024)");
    HAS(t, "rank 1");
    HAS(t, "120.0 KiB in 30 ops");
    HAS(t, "slowest over the last 20 collective(s) of c0: rank 1 arrives 200 ms after the first on average "
           "(last in 20 of 20)");
    free(t);
    dshim_trace_set_free(&set);
}
END_TEST

START_TEST(load_dir_and_procs_file)
{
    char dir[] = "/tmp/check_trace_read.XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char path[512];
    /* the same process twice: an older and a newer dump; the newer wins */
    for (int k = 0; k < 2; k++) {
        sb_t b = {0};
        b.len = 0;
        sb_add(&b, "{\"format\":\"dshim-trace\",\"version\":1,\"rank\":0,\"size\":1,\"host\":\"h\",\"pid\":7,"
               "\"reason\":\"%s\",\"why\":\"\",\"realtime_ns\":%d,\"monotonic_ns\":1}\n", k ? "signal" : "timeout",
               k ? 200 : 100);
        snprintf(path, sizeof(path), "%s/dshim-trace.0.7%s.jsonl", dir, k ? "" : ".old");
        FILE *f = fopen(path, "w");
        fwrite(b.buf, 1, b.len, f);
        fclose(f);
        free(b.buf);
    }
    snprintf(path, sizeof(path), "%s/dshim-trace.1.8.jsonl", dir);
    FILE *f = fopen(path, "w");
    fputs("garbage\n", f);
    fclose(f);
    snprintf(path, sizeof(path), "%s/unrelated.txt", dir);
    f = fopen(path, "w");
    fputs("{\"format\":\"dshim-trace\",\"version\":1}\n", f);
    fclose(f);
    dshim_trace_proc_t procs[2] = {{.rank = 0, .name = "rank 0", .host = "h\"q", .pid = 7,
                                    .state = DSHIM_TRACE_PROC_KILLED, .sig = 9, .pstate = 'T', .asked = 1},
                                   {.rank = 1, .name = "rank 1", .host = "h", .pid = 8,
                                    .state = DSHIM_TRACE_PROC_EXITED, .code = 3, .first_failure = 1}};
    snprintf(path, sizeof(path), "%s/launcher.jsonl", dir);
    ck_assert_int_eq(dshim_trace_write_procs(path, procs, 2, 1.25), 0);
    dshim_trace_set_t set;
    char err[256];
    ck_assert_int_eq(dshim_trace_load_dir(dir, &set, err, sizeof(err)), 0);
    ck_assert_int_eq((int)set.n, 1);
    ck_assert_str_eq(set.dumps[0].reason, "signal");
    ck_assert_int_eq((int)set.nprocs, 2);
    ck_assert_str_eq(set.procs[0].host, "h\"q");
    ck_assert_int_eq(set.procs[0].state, DSHIM_TRACE_PROC_KILLED);
    ck_assert_int_eq(set.procs[0].sig, 9);
    ck_assert_int_eq(set.procs[0].pstate, 'T');
    ck_assert_int_eq(set.procs[1].code, 3);
    ck_assert_int_eq(set.procs[1].first_failure, 1);
    ck_assert(set.wait_s > 1.24 && set.wait_s < 1.26);
    dshim_trace_set_free(&set);
    ck_assert_int_eq(dshim_trace_load_dir("/nonexistent/dir", &set, err, sizeof(err)), -1);
    HAS(err, "/nonexistent/dir");
    /* clean up */
    DIR *dp = opendir(dir);
    struct dirent *de;
    while ((de = readdir(dp)) != NULL) {
        if (de->d_name[0] != '.') {
            snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
            unlink(path);
        }
    }
    closedir(dp);
    rmdir(dir);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("trace_read");
    TCase *tc = tcase_create("reader");
    tcase_add_test(tc, parse_good_dump);
    tcase_add_test(tc, parse_rejects_and_skips_garbage);
    tcase_add_test(tc, survives_random_damage);
    tcase_add_test(tc, ranges);
    tcase_add_test(tc, diagnose_skipped_collective);
    tcase_add_test(tc, diagnose_idle_rank);
    tcase_add_test(tc, diagnose_killed_and_stopped);
    tcase_add_test(tc, diagnose_mismatched_counts);
    tcase_add_test(tc, diagnose_maps_ring_ranks);
    tcase_add_test(tc, diagnose_many_ranks_fits_a_screen);
    tcase_add_test(tc, diagnose_nothing);
    tcase_add_test(tc, diagnose_ps_stalled_key);
    tcase_add_test(tc, diagnose_ps_skipped_key_in_barrier);
    tcase_add_test(tc, diagnose_ps_skipped_barrier);
    tcase_add_test(tc, diagnose_ps_killed_worker);
    tcase_add_test(tc, diagnose_ps_silent_server);
    tcase_add_test(tc, status_and_stragglers);
    tcase_add_test(tc, load_dir_and_procs_file);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

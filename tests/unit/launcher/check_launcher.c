/* Unit tests of dshim-run's pure parts: the job description encoding, the
 * agent->controller frames, shell quoting, word splitting, the hostfile
 * parser (whose errors exit 2; Check's exit tests cover those), and the parts
 * of the controller's and agents' loops: pipes cut into lines, exit codes,
 * the stop deadline. */
#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "child.h"
#include "frame.h"
#include "pump.h"
#include "run.h"
#include "spec.h"
#include "stop.h"

static char *write_tmp(const char *text)
{
    static char path[64];
    snprintf(path, sizeof(path), "/tmp/check_launcher.%d.XXXXXX", (int)getpid());
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    return path;
}

START_TEST(spec_roundtrip)
{
    run_plan_t plan = {0};
    run_strv_t env = {0};
    run_strv_add(&env, "A=1");
    run_strv_add(&env, "WEIRD=sp ace,'q\"$(x)`y`;\n");
    plan.env = run_strv_terminated(&env);
    plan.nenv = env.n;
    plan.cwd = "/tmp/some dir";
    plan.grace_s = 2.5;
    run_proc_t procs[3] = {0};
    for (int i = 0; i < 3; i++) {
        run_strv_t e = {0}, a = {0};
        run_strv_addf(&e, "RANK=%d", i);
        run_strv_add(&a, "python3");
        run_strv_add(&a, "train.py");
        run_strv_addf(&a, "arg with %d spaces", i);
        run_strv_add(&a, "");  /* empty arguments survive */
        snprintf(procs[i].name, sizeof(procs[i].name), "rank %d", i);
        procs[i].env = run_strv_terminated(&e);
        procs[i].nenv = e.n;
        procs[i].argv = run_strv_terminated(&a);
        procs[i].nargv = a.n;
    }
    plan.procs = procs;
    plan.nprocs = 3;
    char *b64 = run_spec_encode(&plan, 1, 2);
    ck_assert_ptr_null(strpbrk(b64, " '\"\\$`;\n"));  /* shell- and line-safe */
    run_spec_t spec;
    char err[256];
    ck_assert_int_eq(run_spec_decode(b64, &spec, err, sizeof(err)), 0);
    ck_assert_str_eq(spec.cwd, "/tmp/some dir");
    ck_assert(spec.grace_s > 2.49 && spec.grace_s < 2.51);
    ck_assert_int_eq(spec.env.n, 2);
    ck_assert_str_eq(spec.env.v[1], "WEIRD=sp ace,'q\"$(x)`y`;\n");
    ck_assert_int_eq(spec.nprocs, 2);
    ck_assert_int_eq(spec.procs[0].index, 1);
    ck_assert_str_eq(spec.procs[1].name, "rank 2");
    ck_assert_str_eq(spec.procs[1].env.v[0], "RANK=2");
    ck_assert_int_eq(spec.procs[1].argv.n, 4);
    ck_assert_str_eq(spec.procs[1].argv.v[2], "arg with 2 spaces");
    ck_assert_str_eq(spec.procs[1].argv.v[3], "");
    ck_assert_str_eq(spec.trace_dir, "");  /* no flight recorder: nothing for the agent to collect */
    free(b64);
    run_spec_free(&spec);
    /* the per-job flight-recorder directory reaches the agent (collect.h) */
    plan.trace_dir = "/tmp/dshim-run-7/trace_0";
    plan.trace_owned = true;
    b64 = run_spec_encode(&plan, 0, 1);
    ck_assert_int_eq(run_spec_decode(b64, &spec, err, sizeof(err)), 0);
    ck_assert_str_eq(spec.trace_dir, "/tmp/dshim-run-7/trace_0");
    ck_assert(spec.trace_owned);
    free(b64);
    run_spec_free(&spec);
    run_strv_free(&env);
    for (int i = 0; i < 3; i++) {
        run_strv_t e = {procs[i].env, procs[i].nenv, procs[i].nenv + 1};
        run_strv_t a = {procs[i].argv, procs[i].nargv, procs[i].nargv + 1};
        run_strv_free(&e);
        run_strv_free(&a);
    }
}
END_TEST

START_TEST(spec_rejects_garbage)
{
    run_spec_t spec;
    char err[256];
    ck_assert_int_eq(run_spec_decode("not base64!", &spec, err, sizeof(err)), -1);
    ck_assert_int_eq(run_spec_decode("aGVsbG8=", &spec, err, sizeof(err)), -1);  /* "hello" */
    ck_assert(strstr(err, "format") != NULL);
    /* a valid description cut short */
    run_plan_t plan = {0};
    run_proc_t p = {0};
    run_strv_t a = {0};
    run_strv_add(&a, "x");
    p.argv = run_strv_terminated(&a);
    p.nargv = 1;
    plan.procs = &p;
    plan.nprocs = 1;
    plan.cwd = "/";
    char *b64 = run_spec_encode(&plan, 0, 1);
    b64[strlen(b64) / 2 / 4 * 4] = '\0';
    ck_assert_int_eq(run_spec_decode(b64, &spec, err, sizeof(err)), -1);
    free(b64);
    run_strv_free(&a);
}
END_TEST

typedef struct {
    char lines[8][128];
    int n;
} lines_t;

static void collect(void *ctx, const char *line, size_t len)
{
    lines_t *l = ctx;
    if (l->n < 8) {
        snprintf(l->lines[l->n++], 128, "%.*s", (int)len, line);
    }
}

START_TEST(frames_roundtrip)
{
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    run_frame_write(fds[1], 'H', 0, 42, 0, "node-1", 6);
    run_frame_write(fds[1], 'S', 3, 1234, 0, "node-1", 6);
    run_frame_write(fds[1], 'O', 3, 0, 0, "hello world", 11);
    run_frame_write(fds[1], 'E', 3, 0, 0, "", 0);
    run_frame_write(fds[1], 'X', 3, -1, 9, NULL, 0);
    run_frame_write(fds[1], 'F', -1, 0, 0, "cannot run", 10);
    close(fds[1]);
    char buf[4096];
    ssize_t n = read(fds[0], buf, sizeof(buf));
    close(fds[0]);
    ck_assert_int_gt(n, 0);
    lines_t l = {0};
    run_linebuf_t lb = {0};
    run_linebuf_feed(&lb, buf, (size_t)n, collect, &l);
    run_linebuf_free(&lb);
    ck_assert_int_eq(l.n, 6);
    run_frame_t f;
    ck_assert_int_eq(run_frame_parse(l.lines[0], strlen(l.lines[0]), &f), 0);
    ck_assert(f.kind == 'H' && f.a == 42 && f.textlen == 6);
    ck_assert_int_eq(run_frame_parse(l.lines[1], strlen(l.lines[1]), &f), 0);
    ck_assert(f.kind == 'S' && f.idx == 3 && f.a == 1234 && strncmp(f.text, "node-1", f.textlen) == 0);
    ck_assert_int_eq(run_frame_parse(l.lines[2], strlen(l.lines[2]), &f), 0);
    ck_assert(f.kind == 'O' && f.textlen == 11 && strncmp(f.text, "hello world", 11) == 0);
    ck_assert_int_eq(run_frame_parse(l.lines[3], strlen(l.lines[3]), &f), 0);
    ck_assert(f.kind == 'E' && f.textlen == 0);
    ck_assert_int_eq(run_frame_parse(l.lines[4], strlen(l.lines[4]), &f), 0);
    ck_assert(f.kind == 'X' && f.a == -1 && f.b == 9);
    ck_assert_int_eq(run_frame_parse(l.lines[5], strlen(l.lines[5]), &f), 0);
    ck_assert(f.kind == 'F' && f.idx == -1);
    /* plain text (ssh, mpirun) is not a frame */
    ck_assert_int_eq(run_frame_parse("ssh: connect refused", 20, &f), -1);
    ck_assert_int_eq(run_frame_parse("\x1eX 1", 4, &f), -1);
    ck_assert_int_eq(run_frame_parse("\x1eJ 1 x", 6, &f), -1);
    /* flight-recorder dumps (collect.h): "<kind> <idx> <text>" */
    ck_assert_int_eq(run_frame_parse("\x1e" "D -1 dshim-trace.0.7.jsonl", 27, &f), 0);
    ck_assert(f.kind == 'D' && f.idx == -1 && f.textlen == 21);
    ck_assert_int_eq(run_frame_parse("\x1eY 3 T 0 0", 10, &f), 0);
    ck_assert(f.kind == 'Y' && f.idx == 3 && strncmp(f.text, "T 0 0", f.textlen) == 0);
    ck_assert_int_eq(run_frame_parse("\x1eZ -1 4 2", 9, &f), 0);
    ck_assert(f.kind == 'Z' && f.textlen == 3);
    /* the acknowledgement: a frame, not a line of output (it was printed as one) */
    ck_assert_int_eq(run_frame_parse("\x1e" "A -1 4", 6, &f), 0);
    ck_assert(f.kind == 'A' && f.idx == -1 && strncmp(f.text, "4", f.textlen) == 0);
}
END_TEST

START_TEST(linebuf_cuts_long_lines_and_flushes_tail)
{
    lines_t l = {0};
    run_linebuf_t lb = {0};
    char *big = malloc(RUN_LINE_MAX + 10);
    memset(big, 'a', RUN_LINE_MAX + 10);
    run_linebuf_feed(&lb, big, RUN_LINE_MAX + 10, collect, &l);
    ck_assert_int_eq(l.n, 1);  /* the first RUN_LINE_MAX bytes came out as a line */
    run_linebuf_feed(&lb, "\npartial", 8, collect, &l);
    ck_assert_int_eq(l.n, 2);
    run_linebuf_flush(&lb, collect, &l);
    ck_assert_int_eq(l.n, 3);
    ck_assert_str_eq(l.lines[2], "partial");
    run_linebuf_free(&lb);
    free(big);
}
END_TEST

START_TEST(shell_quote_survives_the_shell)
{
    const char *nasty[] = {"plain", "with space", "it's", "\"dq\"", "$(touch /tmp/x)", "`id`", "a;b|c&d", "", "'",
                           "\\n", NULL};
    for (int i = 0; nasty[i]; i++) {
        char *q = run_shell_quote(nasty[i]);
        char *cmd = NULL;
        ck_assert_int_ge(asprintf(&cmd, "printf %%s %s", q), 0);
        FILE *p = popen(cmd, "r");
        char out[256] = "";
        size_t n = fread(out, 1, sizeof(out) - 1, p);
        out[n] = '\0';
        ck_assert_int_eq(pclose(p), 0);
        ck_assert_str_eq(out, nasty[i]);
        free(cmd);
        free(q);
    }
}
END_TEST

START_TEST(split_words)
{
    run_strv_t v = {0};
    run_split_words("  ssh   -F /x/cfg\t-o A=b ", &v);
    ck_assert_int_eq(v.n, 5);
    ck_assert_str_eq(v.v[0], "ssh");
    ck_assert_str_eq(v.v[2], "/x/cfg");
    ck_assert_str_eq(v.v[4], "A=b");
    run_strv_free(&v);
}
END_TEST

START_TEST(env_vector_replaces_by_key)
{
    run_strv_t v = {0};
    run_strv_setenv(&v, "A", "%d", 1);
    run_strv_setenv(&v, "AB", "x");
    run_strv_setenv(&v, "A", "%d", 2);
    ck_assert_int_eq(v.n, 2);
    ck_assert_str_eq(run_strv_getenv(&v, "A"), "2");
    ck_assert_str_eq(run_strv_getenv(&v, "AB"), "x");
    ck_assert_ptr_null(run_strv_getenv(&v, "B"));
    run_strv_free(&v);
}
END_TEST

START_TEST(hostfile_good)
{
    char *path = write_tmp("# cluster\nnode1\nuser@node-2:2222   slots=4\n10.0.0.3 # rack 2\n\n\n");
    run_host_t *hosts = NULL;
    int n = 0;
    run_read_hostfile(path, &hosts, &n);
    unlink(path);
    ck_assert_int_eq(n, 3);
    ck_assert_str_eq(hosts[0].name, "node1");
    ck_assert_int_eq(hosts[0].port, 0);
    ck_assert_str_eq(hosts[1].name, "user@node-2");
    ck_assert_int_eq(hosts[1].port, 2222);
    ck_assert_str_eq(hosts[2].name, "10.0.0.3");
    /* slots=N is kept (--horovod-env places that many ranks there); -1 where not given */
    ck_assert_int_eq(hosts[0].slots, -1);
    ck_assert_int_eq(hosts[1].slots, 4);
    ck_assert_int_eq(hosts[2].slots, -1);
    for (int i = 0; i < n; i++) {
        free(hosts[i].name);
    }
    free(hosts);
}
END_TEST

static void read_bad(const char *text)
{
    char *path = write_tmp(text);
    run_host_t *hosts = NULL;
    int n = 0;
    /* exits 2 in the forked test process; unlink first so nothing is left */
    char copy[64];
    snprintf(copy, sizeof(copy), "%s", path);
    FILE *f = fopen(copy, "r");
    unlink(copy);
    (void)f;
    char fdpath[64];
    snprintf(fdpath, sizeof(fdpath), "/proc/self/fd/%d", fileno(f));
    run_read_hostfile(fdpath, &hosts, &n);
}

START_TEST(hostfile_blank_line_between_hosts) { read_bad("a\n\nb\n"); }
END_TEST
START_TEST(hostfile_bad_port) { read_bad("a:99999\n"); }
END_TEST
START_TEST(hostfile_port_not_number) { read_bad("a:ssh\n"); }
END_TEST
START_TEST(hostfile_shell_chars) { read_bad("a;rm -rf x\n"); }
END_TEST
START_TEST(hostfile_leading_dash) { read_bad("-oProxyCommand=x\n"); }
END_TEST
START_TEST(hostfile_empty) { read_bad("# only a comment\n\n"); }
END_TEST
START_TEST(hostfile_junk_after_host) { read_bad("a b\n"); }
END_TEST
START_TEST(hostfile_missing)
{
    run_host_t *hosts = NULL;
    int n = 0;
    run_read_hostfile("/nonexistent/hostfile", &hosts, &n);
}
END_TEST

START_TEST(host_names)
{
    ck_assert(run_host_name_ok("node1.example.com"));
    ck_assert(run_host_name_ok("u_ser@10.1.2.3"));
    ck_assert(!run_host_name_ok("-x"));
    ck_assert(!run_host_name_ok("a@-x"));
    ck_assert(!run_host_name_ok("a b"));
    ck_assert(!run_host_name_ok("a$(b)"));
    ck_assert(!run_host_name_ok("a@b@c"));
    ck_assert(!run_host_name_ok(""));
}
END_TEST

typedef struct {
    char seen[8][32];
    int n;
} lines_seen_t;

static void note_line(void *owner, bool err, const char *line, size_t len)
{
    lines_seen_t *ls = owner;
    ck_assert_int_lt(ls->n, 8);
    snprintf(ls->seen[ls->n++], sizeof(ls->seen[0]), "%s:%.*s", err ? "err" : "out", (int)len, line);
}

START_TEST(pipes_cut_lines_and_drain_the_rest)
{
    int out[2], err[2];
    ck_assert_int_eq(pipe(out), 0);
    ck_assert_int_eq(pipe(err), 0);
    lines_seen_t ls = {.n = 0};
    run_pipes_t p;
    run_pipes_attach(&p, out[0], err[0], note_line, &ls);
    ck_assert_int_eq(write(out[1], "a\nb", 3), 3);
    ck_assert_int_eq(write(err[1], "e\n", 2), 2);
    int mine[2];  /* the caller's own descriptor: reported ready, never read by the set */
    ck_assert_int_eq(pipe(mine), 0);
    ck_assert_int_eq(write(mine[1], "x", 1), 1);
    run_pollset_t ps = {0};
    int own = run_pollset_add_fd(&ps, mine[0]);
    run_pollset_add_pipes(&ps, &p);
    ck_assert_int_eq(ps.n, 3);
    ck_assert_int_eq(run_pollset_wait(&ps, 1000), 3);
    ck_assert(run_pollset_ready(&ps, own));
    ck_assert(!run_pollset_ready(&ps, -1));
    run_pollset_read_pipes(&ps);
    char x;
    ck_assert_int_eq(read(mine[0], &x, 1), 1);
    ck_assert_int_eq(ls.n, 2);
    ck_assert_str_eq(ls.seen[0], "out:a");
    ck_assert_str_eq(ls.seen[1], "err:e");
    /* the child ended: the unfinished "b" still comes, and nothing is waited for
     * although a grandchild might keep err open */
    close(out[1]);
    run_pipes_drain(&p);
    ck_assert_int_eq(ls.n, 3);
    ck_assert_str_eq(ls.seen[2], "out:b");
    ck_assert(!run_pipes_open(&p));
    run_pipes_free(&p);
    run_pipes_free(&p);  /* twice is fine */
    run_pollset_free(&ps);
    close(err[1]);
    close(mine[0]);
    close(mine[1]);
}
END_TEST

static int status_of(int how)
{
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        if (how < 0) {
            raise(-how);
        }
        _exit(how);
    }
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    return status;
}

START_TEST(exit_codes_as_a_shell_reports_them)
{
    run_exit_t e = run_exit_of(status_of(3));
    ck_assert_int_eq(e.code, 3);
    ck_assert_int_eq(e.sig, 0);
    ck_assert_int_eq(run_exit_code(e), 3);
    e = run_exit_of(status_of(-SIGKILL));
    ck_assert_int_eq(e.code, -1);
    ck_assert_int_eq(e.sig, SIGKILL);
    ck_assert_int_eq(run_exit_code(e), 128 + SIGKILL);
    ck_assert_int_eq(run_exit_code(run_exit_of(status_of(0))), 0);
}
END_TEST

START_TEST(stop_deadline)
{
    run_stop_t s = {0};
    ck_assert_int_eq(run_stop_wait_ms(&s, 500, 200), 500);
    ck_assert(!run_stop_kill_due(&s));
    ck_assert(run_stop_begin(&s, 60.0));
    ck_assert(!run_stop_begin(&s, 0.0));  /* only the first asks to stop */
    ck_assert(!run_stop_kill_due(&s));
    ck_assert_int_eq(run_stop_wait_ms(&s, 500, 200), 200);
    run_stop_hurry(&s);
    ck_assert_int_eq(run_stop_wait_ms(&s, 500, 200), 0);
    ck_assert(run_stop_kill_due(&s));
    ck_assert(!run_stop_kill_due(&s));  /* killed once */
    ck_assert_int_eq(run_stop_wait_ms(&s, 500, 200), 200);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("launcher");
    TCase *tc = tcase_create("pure");
    tcase_add_test(tc, spec_roundtrip);
    tcase_add_test(tc, spec_rejects_garbage);
    tcase_add_test(tc, frames_roundtrip);
    tcase_add_test(tc, linebuf_cuts_long_lines_and_flushes_tail);
    tcase_add_test(tc, shell_quote_survives_the_shell);
    tcase_add_test(tc, split_words);
    tcase_add_test(tc, env_vector_replaces_by_key);
    tcase_add_test(tc, hostfile_good);
    tcase_add_test(tc, host_names);
    tcase_add_test(tc, pipes_cut_lines_and_drain_the_rest);
    tcase_add_test(tc, exit_codes_as_a_shell_reports_them);
    tcase_add_test(tc, stop_deadline);
    /* exit tests need Check's fork mode (valgrind runs use CK_FORK=no) */
    const char *fork_mode = getenv("CK_FORK");
    if (fork_mode && strcmp(fork_mode, "no") == 0) {
        goto run;
    }
    tcase_add_exit_test(tc, hostfile_blank_line_between_hosts, RUN_EXIT_USAGE);
    tcase_add_exit_test(tc, hostfile_bad_port, RUN_EXIT_USAGE);
    tcase_add_exit_test(tc, hostfile_port_not_number, RUN_EXIT_USAGE);
    tcase_add_exit_test(tc, hostfile_shell_chars, RUN_EXIT_USAGE);
    tcase_add_exit_test(tc, hostfile_leading_dash, RUN_EXIT_USAGE);
    tcase_add_exit_test(tc, hostfile_empty, RUN_EXIT_USAGE);
    tcase_add_exit_test(tc, hostfile_junk_after_host, RUN_EXIT_USAGE);
    tcase_add_exit_test(tc, hostfile_missing, RUN_EXIT_USAGE);
run:
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

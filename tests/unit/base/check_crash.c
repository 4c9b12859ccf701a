/* Tests for base/crash.c: each test forks a child that installs the crash
 * handler and crashes; the parent reads the child's stderr through a pipe and
 * checks the report and that the child died of the original signal. */
#include <check.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include "crash.h"
#include "log.h"

/* Sanitizers read their options once at start-up, before any test code
 * runs, so a setenv in the forked child would come too late; these hooks set
 * the binary's defaults instead.  They leave the crash signals to the handler
 * under test: a sanitizer handler installed first would be chained to, report
 * the crash itself and _exit(1) instead of dying of the signal. */
#define CRASH_SAN_OPTIONS "handle_segv=0:handle_sigbus=0:handle_sigfpe=0:handle_abort=0"
#ifdef __SANITIZE_ADDRESS__
__attribute__((visibility("default"))) const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
    return CRASH_SAN_OPTIONS;
}
#endif
#ifdef __SANITIZE_THREAD__
/* report_signal_unsafe=0: unw_get_proc_name mallocs inside the handler (a
 * known libunwind gap that crash.c's watchdog covers); TSan would flag it. */
__attribute__((visibility("default"))) const char *__tsan_default_options(void);
const char *__tsan_default_options(void)
{
    return CRASH_SAN_OPTIONS ":report_signal_unsafe=0";
}
#endif

#define CHILD_DEADLINE_S 20.0

typedef struct {
    char out[32768];
    size_t len;
    int status;
} child_result_t;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Forks a child running fn with stderr on a pipe; collects its output and
 * exit status, killing it (by PID) if it outlives the deadline. */
static void run_child(void (*fn)(void), child_result_t *r)
{
    int fds[2];
    memset(r, 0, sizeof(*r));
    ck_assert_int_eq(pipe(fds), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], STDERR_FILENO);
        close(fds[1]);
        /* leave no core files behind: RLIMIT_CORE for plain files, and not
         * dumpable for core_pattern pipes (apport, systemd-coredump) */
        struct rlimit no_core = {0, 0};
        setrlimit(RLIMIT_CORE, &no_core);
        prctl(PR_SET_DUMPABLE, 0);
        /* the user's environment must not decide the outcome; fn may
         * override this before its first dshim_config() call */
        setenv("DSHIM_BACKTRACE", "1", 1);
        fn();
        _exit(99); /* fn was meant to kill the process */
    }
    close(fds[1]);
    double deadline = now_s() + CHILD_DEADLINE_S;
    int timed_out = 0;
    for (;;) {
        if (now_s() > deadline) {
            timed_out = 1;
            break;
        }
        struct pollfd pfd = {.fd = fds[0], .events = POLLIN};
        int pr = poll(&pfd, 1, 100);
        if (pr < 0 && errno != EINTR) {
            break;
        }
        if (pr <= 0) {
            continue;
        }
        char chunk[4096];
        ssize_t n = read(fds[0], chunk, sizeof(chunk));
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            break;
        }
        /* keep the head, drain the rest so the child never blocks on us */
        size_t keep = sizeof(r->out) - 1 - r->len;
        keep = (size_t)n < keep ? (size_t)n : keep;
        memcpy(r->out + r->len, chunk, keep);
        r->len += keep;
    }
    close(fds[0]);
    r->out[r->len] = 0;
    while (!timed_out && waitpid(pid, &r->status, WNOHANG) == 0) {
        if (now_s() > deadline) {
            timed_out = 1;
            break;
        }
        usleep(10 * 1000);
    }
    if (timed_out) {
        kill(pid, SIGKILL);
        waitpid(pid, &r->status, 0);
        ck_abort_msg("crash child did not die within %.0f s; its stderr:\n%.1500s", CHILD_DEADLINE_S, r->out);
    }
}

static void assert_died_of(const child_result_t *r, int sig)
{
    ck_assert_msg(WIFSIGNALED(r->status) && WTERMSIG(r->status) == sig,
                  "child should die of signal %d, status 0x%x; stderr:\n%.1500s", sig, r->status, r->out);
}

static void assert_report(const child_result_t *r, const char *signame, const char *func)
{
    char caught[64];
    snprintf(caught, sizeof(caught), "caught %s", signame);
    ck_assert_msg(strstr(r->out, caught), "no '%s' in stderr:\n%.1500s", caught, r->out);
    ck_assert_msg(strstr(r->out, "dshim: rank "), "no rank in stderr:\n%.1500s", r->out);
    ck_assert_msg(strstr(r->out, "dshim:   #0 0x"), "no frame #0 in stderr:\n%.1500s", r->out);
    ck_assert_msg(strstr(r->out, func), "no frame naming %s in stderr:\n%.1500s", func, r->out);
    /* exactly one report, even when several threads are involved */
    ck_assert_ptr_null(strstr(strstr(r->out, "caught ") + 1, "caught "));
}

/* The test's own frames, which the backtrace must name.  Not inlined, and
 * the NULL store is hidden from the compiler and from UBSan, which would
 * otherwise turn it into a trap instruction or its own report. */
__attribute__((noinline, no_sanitize_address, no_sanitize_undefined)) static void crash_test_deref_null(void)
{
    volatile int *volatile p = NULL;
    /* cppcheck-suppress nullPointer */
    *p = 42; /* the crash under test */
}

__attribute__((noinline)) static void crash_test_call_abort(void)
{
    abort();
}

__attribute__((noinline, no_sanitize_address, no_sanitize_undefined)) static int crash_test_recurse(int depth)
{
    volatile char pad[512];
    if (depth < 0) {
        return 0;
    }
    pad[0] = (char)depth;
    int below = crash_test_recurse(depth + 1);
    __asm__ volatile("" ::: "memory"); /* no tail-recursion elimination */
    return below + pad[0];
}

static void child_segv(void)
{
    dshim_log_set_rank(3);
    dshim_crash_install();
    dshim_crash_install(); /* idempotent */
    crash_test_deref_null();
}

START_TEST(test_segv_report)
{
    child_result_t r;
    run_child(child_segv, &r);
    assert_report(&r, "SIGSEGV", "crash_test_deref_null");
    ck_assert_msg(strstr(r.out, "dshim: rank 3 on host "), "rank 3 not named:\n%.1500s", r.out);
    ck_assert_msg(strstr(r.out, "(address 0x0)"), "fault address not shown:\n%.1500s", r.out);
    assert_died_of(&r, SIGSEGV);
}
END_TEST

static void child_abort(void)
{
    dshim_crash_install();
    crash_test_call_abort();
}

START_TEST(test_abort_report)
{
    child_result_t r;
    run_child(child_abort, &r);
    assert_report(&r, "SIGABRT", "crash_test_call_abort");
    ck_assert_msg(strstr(r.out, "dshim: rank ? on host "), "unknown rank not shown as '?':\n%.1500s", r.out);
    assert_died_of(&r, SIGABRT);
}
END_TEST

static void child_disabled(void)
{
    /* before the child's first dshim_config() call, which parses once */
    setenv("DSHIM_BACKTRACE", "0", 1);
    dshim_crash_install();
    crash_test_deref_null();
}

START_TEST(test_disabled)
{
    child_result_t r;
    run_child(child_disabled, &r);
    ck_assert_msg(strstr(r.out, "dshim:") == NULL, "report printed although disabled:\n%.1500s", r.out);
    assert_died_of(&r, SIGSEGV);
}
END_TEST

static void own_handler(int sig, siginfo_t *info, void *uctx)
{
    static const char msg[] = "own handler saw SIGSEGV at NULL\n";
    (void)uctx;
    if (sig == SIGSEGV && info && info->si_addr == NULL) {
        ssize_t w = write(STDERR_FILENO, msg, sizeof(msg) - 1);
        (void)w;
    }
}

static void child_chain(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = own_handler;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, NULL);
    dshim_crash_install();
    crash_test_deref_null();
}

START_TEST(test_chains_previous_handler)
{
    child_result_t r;
    run_child(child_chain, &r);
    assert_report(&r, "SIGSEGV", "crash_test_deref_null");
    const char *own = strstr(r.out, "own handler saw SIGSEGV at NULL");
    ck_assert_msg(own, "previous handler not called:\n%.1500s", r.out);
    ck_assert_msg(own > strstr(r.out, "caught SIGSEGV"), "previous handler ran before the report:\n%.1500s", r.out);
    assert_died_of(&r, SIGSEGV);
}
END_TEST

static void *install_thread(void *arg)
{
    (void)arg;
    dshim_crash_install();
    return NULL;
}

static void *crash_thread(void *arg)
{
    (void)arg;
    crash_test_deref_null();
    return NULL;
}

static void child_threads(void)
{
    pthread_t t[4];
    for (int i = 0; i < 4; i++) {
        pthread_create(&t[i], NULL, install_thread, NULL);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
    }
    /* a thread that never installed: the handler runs on its normal stack */
    pthread_t c;
    pthread_create(&c, NULL, crash_thread, NULL);
    pthread_join(c, NULL);
}

START_TEST(test_other_thread)
{
    child_result_t r;
    run_child(child_threads, &r);
    assert_report(&r, "SIGSEGV", "crash_test_deref_null");
    assert_died_of(&r, SIGSEGV);
}
END_TEST

static void child_overflow(void)
{
    dshim_crash_install();
    crash_test_recurse(0);
}

START_TEST(test_stack_overflow)
{
    child_result_t r;
    run_child(child_overflow, &r);
    /* only the alternate stack lets the handler run at all here */
    assert_report(&r, "SIGSEGV", "crash_test_recurse");
    assert_died_of(&r, SIGSEGV);
}
END_TEST

static void *idle_thread(void *arg)
{
    return arg;
}

static void child_heap_corruption(void)
{
    /* once a second thread has existed glibc locks its arenas, and it
     * detects this double free with the arena lock held: the report's own
     * malloc (in unw_get_proc_name) then deadlocks and the watchdog must end
     * the process with SIGABRT */
    pthread_t t;
    pthread_create(&t, NULL, idle_thread, NULL);
    pthread_join(t, NULL);
    dshim_crash_install();
    /* empty the thread cache of small blocks, so that the report's malloc
     * must take the arena lock (leaked on purpose: the child dies) */
    for (size_t size = 8; size <= 1024; size += 16) {
        for (int i = 0; i < 8; i++) {
            void *volatile hold = malloc(size);
            (void)hold;
        }
    }
    char *volatile p = malloc(10000);
    free(p);
    free(p);
    abort(); /* an allocator that did not notice (valgrind's) */
}

START_TEST(test_crash_inside_malloc)
{
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    (void)child_heap_corruption;
    printf("test_crash_inside_malloc: skipped, the sanitizer's allocator reports the double free itself\n");
#else
    child_result_t r;
    run_child(child_heap_corruption, &r);
    ck_assert_msg(strstr(r.out, "caught SIGABRT"), "no report in stderr:\n%.1500s", r.out);
    /* without the watchdog the child would hang until run_child kills it */
    assert_died_of(&r, SIGABRT);
#endif
}
END_TEST

static Suite *crash_suite(void)
{
    Suite *s = suite_create("crash");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_segv_report);
    tcase_add_test(tc, test_abort_report);
    tcase_add_test(tc, test_disabled);
    tcase_add_test(tc, test_chains_previous_handler);
    tcase_add_test(tc, test_other_thread);
    tcase_add_test(tc, test_stack_overflow);
    tcase_add_test(tc, test_crash_inside_malloc);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(crash_suite());
    srunner_set_fork_status(sr, CK_FORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

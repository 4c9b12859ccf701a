/* Crash reports with a libunwind backtrace.
 *
 * The handler uses only async-signal-safe calls: no stdio, no malloc;
 * numbers are formatted by hand into a stack buffer and written
 * with write(2).  libunwind's local unwinder (UNW_LOCAL_ONLY) is signal-safe
 * enough for this purpose: unw_step allocates nothing and guards its caches
 * by blocking signals.  Two known gaps: dl_iterate_phdr takes the loader
 * lock, and unw_get_proc_name (libunwind 1.6) mallocs a few bytes per call.
 * A crash while the thread holds one of those locks (heap corruption detected
 * inside free() is the common case) would hang the report, so a watchdog
 * alarm ends the process with the original signal if the report stalls.
 */
#define UNW_LOCAL_ONLY
#include <libunwind.h>

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/syscall.h>

#include "config.h"
#include "crash.h"
#include "log.h"

#define CRASH_NSIG 5
#define CRASH_MAX_FRAMES 64
/* libunwind and unw_get_proc_name (which walks ELF symbol tables) need far
 * more than MINSIGSTKSZ; the mapping costs only the pages actually touched. */
#define CRASH_ALTSTACK_BYTES (256 * 1024)
/* a report takes milliseconds; symbol lookups in huge libraries (libtorch)
 * can take seconds, a deadlock takes forever */
#define CRASH_REPORT_TIMEOUT_S 10

static const int crash_signals[CRASH_NSIG] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
static const char *const crash_names[CRASH_NSIG] = {"SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "SIGABRT"};
static struct sigaction crash_prev[CRASH_NSIG];
/* copied at install time: gethostname and the log's lazy init are not
 * async-signal-safe */
static char crash_host[64];
static int crash_enabled;
/* kernel tid of the thread writing a report, 0 while none is */
static int crash_owner_tid;
/* the signal being reported, for the watchdog */
static volatile sig_atomic_t crash_current_sig;
static pthread_once_t crash_once = PTHREAD_ONCE_INIT;
static pthread_key_t crash_stack_key;
static int crash_key_ok;
static void (*crash_dump_hook)(int sig);
/* the hook ran (or runs): a crash inside it must not call it again */
static int crash_hook_ran;

void dshim_crash_set_dump_hook(void (*fn)(int sig))
{
    __atomic_store_n(&crash_dump_hook, fn, __ATOMIC_RELEASE);
}

typedef struct {
    char text[512];
    size_t len;
} crash_line_t;

static void line_str(crash_line_t *l, const char *s)
{
    while (*s && l->len < sizeof(l->text) - 1) {
        l->text[l->len++] = *s++;
    }
}

static void line_num(crash_line_t *l, unsigned long v, unsigned base, int min_digits)
{
    char tmp[24];
    int n = 0;
    do {
        tmp[n++] = "0123456789abcdef"[v % base];
        v /= base;
    } while ((v || n < min_digits) && n < (int)sizeof(tmp));
    while (n > 0 && l->len < sizeof(l->text) - 1) {
        l->text[l->len++] = tmp[--n];
    }
}

/* One write per line, so concurrent log lines never split a report line. */
static void line_flush(crash_line_t *l)
{
    l->text[l->len++] = '\n'; /* line_str/line_num always leave one byte */
    size_t off = 0;
    while (off < l->len) {
        ssize_t w = write(STDERR_FILENO, l->text + off, l->len - off);
        if (w < 0 && errno == EINTR) {
            continue;
        }
        if (w <= 0) {
            break;
        }
        off += (size_t)w;
    }
    l->len = 0;
}

static void crash_say(const char *text)
{
    crash_line_t l = {.len = 0};
    line_str(&l, text);
    line_flush(&l);
}

static void report_header(int idx, const siginfo_t *info)
{
    crash_line_t l = {.len = 0};
    int rank = dshim_log_get_rank();
    line_str(&l, "dshim: rank ");
    if (rank >= 0) {
        line_num(&l, (unsigned long)rank, 10, 1);
    } else {
        line_str(&l, "?");
    }
    line_str(&l, " on host ");
    line_str(&l, crash_host[0] ? crash_host : "?");
    line_str(&l, " (pid ");
    line_num(&l, (unsigned long)getpid(), 10, 1);
    line_str(&l, ") caught ");
    line_str(&l, crash_names[idx]);
    if (info && info->si_code > 0) {
        /* kernel-generated fault: si_addr is meaningful */
        line_str(&l, " (address 0x");
        line_num(&l, (unsigned long)(uintptr_t)info->si_addr, 16, 1);
        line_str(&l, ")");
    } else if (info && info->si_pid != getpid()) {
        line_str(&l, " (sent by pid ");
        line_num(&l, (unsigned long)info->si_pid, 10, 1);
        line_str(&l, ")");
    }
    line_str(&l, " \xe2\x80\x94 backtrace:");
    line_flush(&l);
}

static void report_frame(unw_cursor_t *cur, int n)
{
    crash_line_t l = {.len = 0};
    unw_word_t ip = 0;
    unw_word_t off = 0;
    char name[256];
    unw_get_reg(cur, UNW_REG_IP, &ip);
    line_str(&l, "dshim:   #");
    line_num(&l, (unsigned long)n, 10, 1);
    line_str(&l, " 0x");
    line_num(&l, (unsigned long)ip, 16, 16);
    line_str(&l, " ");
    name[0] = 0;
    int rc = unw_get_proc_name(cur, name, sizeof(name), &off);
    name[sizeof(name) - 1] = 0;
    if ((rc == 0 || rc == -UNW_ENOMEM) && name[0]) {
        line_str(&l, name);
        line_str(&l, "+0x");
        line_num(&l, (unsigned long)off, 16, 1);
    } else {
        line_str(&l, "??");
    }
    line_flush(&l);
}

/* The interrupted instruction's address, from the handler's ucontext. */
static unw_word_t crash_pc(const void *uctx)
{
    const ucontext_t *uc = uctx;
    if (!uc) {
        return 0;
    }
#if defined(__x86_64__)
    return (unw_word_t)uc->uc_mcontext.gregs[REG_RIP];
#elif defined(__aarch64__)
    return (unw_word_t)uc->uc_mcontext.pc;
#else
    return 0;
#endif
}

static void report_backtrace(const void *uctx)
{
    unw_context_t ctx;
    unw_cursor_t cur;
    if (unw_getcontext(&ctx) != 0 || unw_init_local(&cur, &ctx) != 0) {
        crash_say("dshim:   (libunwind could not start unwinding)");
        return;
    }
    /* The innermost frames are this handler's own and the kernel's signal
     * trampoline: skip to the frame whose IP is the interrupted instruction,
     * so #0 is the function that crashed.  (unw_is_signal_frame would also
     * do, but which frame it flags differs between libunwind versions.)  If
     * no frame matches, print them all. */
    unw_word_t pc = crash_pc(uctx);
    int found = 0;
    for (int n = 0; pc && n < CRASH_MAX_FRAMES; n++) {
        unw_word_t ip = 0;
        unw_get_reg(&cur, UNW_REG_IP, &ip);
        if (ip == pc) {
            found = 1;
            break;
        }
        if (unw_step(&cur) <= 0) {
            break;
        }
    }
    if (!found) {
        unw_init_local(&cur, &ctx);
    }
    for (int n = 0;; n++) {
        if (n == CRASH_MAX_FRAMES) {
            crash_say("dshim:   ... (more frames not shown)");
            break;
        }
        report_frame(&cur, n);
        if (unw_step(&cur) <= 0) {
            break;
        }
    }
}

/* Resets `sig` to its default action and sends it to this thread.  The
 * signal is blocked while a handler for it runs, so it stays pending and is
 * delivered when the handler returns, after the kernel has restored the
 * interrupted registers: the process dies of `sig` and a core dump shows the
 * faulting instruction, exactly as without dshim. */
static void crash_die(int sig)
{
    struct sigaction dfl;
    memset(&dfl, 0, sizeof(dfl));
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, NULL);
    syscall(SYS_tgkill, (long)getpid(), (long)syscall(SYS_gettid), (long)sig);
}

/* SIGALRM handler armed while a report is written: the report hung, so
 * die now of the original signal from whichever thread took the alarm. */
static void crash_watchdog(int alrm)
{
    int sig = (int)crash_current_sig;
    (void)alrm;
    crash_say("dshim:   ... (backtrace stalled, probably a crash inside malloc or the loader)");
    crash_die(sig);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, sig);
    sigprocmask(SIG_UNBLOCK, &set, NULL); /* the pending signal kills us here */
}

static void crash_handler(int sig, siginfo_t *info, void *uctx)
{
    int saved_errno = errno;
    int idx = -1;
    for (int i = 0; i < CRASH_NSIG; i++) {
        if (crash_signals[i] == sig) {
            idx = i;
        }
    }
    int tid = (int)syscall(SYS_gettid);
    int expected = 0;
    if (idx < 0 || !__atomic_compare_exchange_n(&crash_owner_tid, &expected, tid, 0, __ATOMIC_ACQ_REL,
                                                __ATOMIC_ACQUIRE)) {
        if (idx >= 0 && expected != tid) {
            /* Another thread is writing its report and will end the process;
             * wait instead of cutting it short, for 1.5 times its watchdog. */
            struct timespec pause_ts = {0, 100 * 1000 * 1000};
            for (int i = 0; i < CRASH_REPORT_TIMEOUT_S * 15; i++) {
                nanosleep(&pause_ts, NULL);
            }
        }
        /* expected == tid: a crash inside this handler or a chained one */
        crash_die(sig);
        errno = saved_errno;
        return;
    }
    struct sigaction watchdog;
    struct sigaction prev_alrm;
    memset(&watchdog, 0, sizeof(watchdog));
    watchdog.sa_handler = crash_watchdog;
    watchdog.sa_flags = SA_ONSTACK;
    sigemptyset(&watchdog.sa_mask);
    crash_current_sig = sig;
    int armed = sigaction(SIGALRM, &watchdog, &prev_alrm) == 0;
    if (armed) {
        alarm(CRASH_REPORT_TIMEOUT_S);
    }
    report_header(idx, info);
    report_backtrace(uctx);
    void (*hook)(int) = __atomic_load_n(&crash_dump_hook, __ATOMIC_ACQUIRE);
    if (hook && !__atomic_exchange_n(&crash_hook_ran, 1, __ATOMIC_ACQ_REL)) {
        /* under the same watchdog as the backtrace: a dump that hangs on a
         * lock the crashed thread held ends in the original signal */
        hook(sig);
    }
    if (armed) {
        alarm(0);
        sigaction(SIGALRM, &prev_alrm, NULL);
    }

    /* Put the previous handler back first, so that a chained handler which
     * re-raises (Python's faulthandler does) reaches its own predecessor. */
    struct sigaction prev = crash_prev[idx];
    sigaction(sig, &prev, NULL);
    if (prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN) {
        errno = saved_errno;
        if (prev.sa_flags & SA_SIGINFO) {
            prev.sa_sigaction(sig, info, uctx);
        } else {
            prev.sa_handler(sig);
        }
    }
    /* a chained handler that returned does not get the fault again */
    crash_die(sig);
    errno = saved_errno;
}

/* Thread-exit destructor: releases the thread's alternate stack, but only
 * while it is still the active one (another library may have replaced it,
 * or disabled and unmapped it already, as ASan does at thread exit). */
static void crash_stack_release(void *mem)
{
    stack_t cur;
    if (sigaltstack(NULL, &cur) == 0 && cur.ss_sp == mem && !(cur.ss_flags & SS_ONSTACK)) {
        stack_t off = {.ss_sp = NULL, .ss_flags = SS_DISABLE, .ss_size = 0};
        if (sigaltstack(&off, NULL) == 0) {
            munmap(mem, CRASH_ALTSTACK_BYTES);
        }
    }
}

/* Gives the calling thread an alternate signal stack so that a stack
 * overflow in it is still reported.  Signal stacks are per thread: threads
 * that never call dshim_crash_install run the handler on their own stack,
 * which works for every crash except an overflow of that stack. */
static void crash_thread_stack(void)
{
    if (!crash_key_ok || pthread_getspecific(crash_stack_key)) {
        return;
    }
    stack_t cur;
    if (sigaltstack(NULL, &cur) == 0 && !(cur.ss_flags & SS_DISABLE) && cur.ss_size >= CRASH_ALTSTACK_BYTES) {
        return; /* someone else's, and big enough */
    }
    void *mem = mmap(NULL, CRASH_ALTSTACK_BYTES, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (mem == MAP_FAILED) {
        DSHIM_WARN("crash reports: cannot map a signal stack (%s); stack overflows will not be reported",
                   strerror(errno));
        return;
    }
    stack_t ss = {.ss_sp = mem, .ss_flags = 0, .ss_size = CRASH_ALTSTACK_BYTES};
    if (sigaltstack(&ss, NULL) != 0) {
        DSHIM_WARN("crash reports: sigaltstack failed (%s); stack overflows will not be reported",
                   strerror(errno));
        munmap(mem, CRASH_ALTSTACK_BYTES);
        return;
    }
    pthread_setspecific(crash_stack_key, mem);
}

static void crash_install_once(void)
{
    if (!dshim_config()->backtrace) {
        return;
    }
    strncpy(crash_host, dshim_log_hostname(), sizeof(crash_host) - 1);
    crash_key_ok = pthread_key_create(&crash_stack_key, crash_stack_release) == 0;

    /* libunwind initialises itself on the first unw_init_local; do that
     * here rather than inside a signal handler.  (No unw_step: it probes
     * memory with write(2), which valgrind would report in every process.) */
    unw_context_t ctx;
    unw_cursor_t cur;
    if (unw_getcontext(&ctx) == 0) {
        unw_init_local(&cur, &ctx);
    }

    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = crash_handler;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    /* block the other crash signals too: a second fault inside the handler
     * is then turned by the kernel into a plain default-action death */
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < CRASH_NSIG; i++) {
        sigaddset(&sa.sa_mask, crash_signals[i]);
    }
    for (int i = 0; i < CRASH_NSIG; i++) {
        if (sigaction(crash_signals[i], &sa, &crash_prev[i]) != 0) {
            DSHIM_WARN("crash reports: sigaction(%s) failed (%s); that signal will not be reported",
                       crash_names[i], strerror(errno));
            memset(&crash_prev[i], 0, sizeof(crash_prev[i]));
            crash_prev[i].sa_handler = SIG_DFL;
        } else if (crash_prev[i].sa_sigaction == crash_handler) {
            crash_prev[i].sa_handler = SIG_DFL; /* never chain to ourselves */
        }
    }
    crash_enabled = 1;
}

void dshim_crash_install(void)
{
    pthread_once(&crash_once, crash_install_once);
    if (crash_enabled) {
        crash_thread_stack();
    }
}

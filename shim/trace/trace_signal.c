/* Dumps on request by signal (DSHIM_TRACE_SIGNAL, SIGUSR2 by default: what
 * dshim-run sends to every live rank when a job fails or `--status` asks)
 * and at a fatal signal (the crash hook of base/crash.c).
 *
 * A dump takes locks, allocates and writes files: none of that may run in
 * a signal handler.  The handler only writes a byte to a pipe; a recorder
 * thread, started with the first ring, reads it and dumps.  The thread
 * blocks every signal (it never takes the application's), and exit() stops
 * and joins it: it must not keep the process alive, nor count as a running
 * thread when the process ends (TSan then sleeps a second at every exit).
 *
 * Fork: the child has no recorder thread, and the pipe is shared with the
 * parent (a byte written by the child's handler would make the parent
 * dump).  The child closes its copies at fork, and its first ring starts a
 * thread and pipe of its own; until then the handler does nothing. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "crash.h"
#include "log.h"
#include "trace_impl.h"

static pthread_mutex_t sig_lock = PTHREAD_MUTEX_INITIALIZER;
static int sig_checked;     /* the disposition was looked at (once per process) */
static int sig_num;         /* the signal we handle, 0 none */
static int recorder_running; /* in this process (reset in a forked child) */
static pthread_t recorder_thread;
static int pipe_rd = -1;
static int pipe_wr = -1;      /* read by the handler (atomically) */

static const char *signal_word(int sig)
{
    switch (sig) {
    case SIGUSR1:
        return "SIGUSR1";
    case SIGUSR2:
        return "SIGUSR2";
    case SIGSEGV:
        return "SIGSEGV";
    case SIGBUS:
        return "SIGBUS";
    case SIGILL:
        return "SIGILL";
    case SIGFPE:
        return "SIGFPE";
    case SIGABRT:
        return "SIGABRT";
    }
    return "a signal";
}

static void on_dump_signal(int sig)
{
    (void)sig;
    int saved = errno;
    int fd = __atomic_load_n(&pipe_wr, __ATOMIC_ACQUIRE);
    if (fd >= 0) {
        char b = 'd';
        /* non-blocking: a full pipe means a dump is pending already */
        ssize_t w = write(fd, &b, 1);
        (void)w;
    }
    errno = saved;
}

static void *recorder_main(void *arg)
{
    int fd = (int)(intptr_t)arg;
    char buf[64];
    for (;;) {
        ssize_t k = read(fd, buf, sizeof(buf));
        if (k > 0) {
            /* signals that came together make one dump */
            dshim_trace_timeline_flush();
            dshim_trace_dump_ex("request", signal_word(sig_num), 0);
            continue;
        }
        if (k < 0 && errno == EINTR) {
            continue;
        }
        return NULL;
    }
}

/* Best effort at a fatal signal: the process is dying, a dump may be
 * the only record of what it was doing. */
static void crash_dump(int sig)
{
    dshim_trace_dump_ex("crash", signal_word(sig), 1);
}

static void fork_prepare(void)
{
    pthread_mutex_lock(&sig_lock);
}

static void fork_parent(void)
{
    pthread_mutex_unlock(&sig_lock);
}

static void fork_child(void)
{
    int wr = __atomic_exchange_n(&pipe_wr, -1, __ATOMIC_ACQ_REL);
    if (wr >= 0) {
        close(wr);
    }
    if (pipe_rd >= 0) {
        close(pipe_rd);
        pipe_rd = -1;
    }
    recorder_running = 0;
    pthread_mutex_unlock(&sig_lock);
}

/* At exit: closing the pipe's write end ends the recorder's read; a dump
 * under way is let finish (bounded). */
static void stop_recorder(void)
{
    pthread_mutex_lock(&sig_lock);
    if (!recorder_running || pthread_equal(recorder_thread, pthread_self())) {
        pthread_mutex_unlock(&sig_lock);
        return;
    }
    int wr = __atomic_exchange_n(&pipe_wr, -1, __ATOMIC_ACQ_REL);
    if (wr >= 0) {
        close(wr);
    }
    pthread_t t = recorder_thread;
    recorder_running = 0;
    pthread_mutex_unlock(&sig_lock);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 5;
    if (pthread_timedjoin_np(t, NULL, &until) == 0) {
        close(pipe_rd);
        pipe_rd = -1;
    }
}

static void setup_once(void)
{
    pthread_atfork(fork_prepare, fork_parent, fork_child);
    atexit(stop_recorder);
    dshim_crash_set_dump_hook(crash_dump);
}

static pthread_once_t setup_once_ctl = PTHREAD_ONCE_INIT;

/* The handler goes only where the application left the signal alone: one
 * that handles SIGUSR2 itself keeps it (its dumps then come from failures,
 * crashes and dshim_trace_dump).  sig_lock held. */
static void install_handler(void)
{
    sig_checked = 1;
    const char *want = dshim_config()->trace_signal;
    int sig = !strcasecmp(want, "USR1") ? SIGUSR1 : !strcasecmp(want, "USR2") ? SIGUSR2 : 0;
    if (!sig) {
        return;
    }
    struct sigaction old;
    if (sigaction(sig, NULL, &old) != 0) {
        return;
    }
    if ((old.sa_flags & SA_SIGINFO) || old.sa_handler != SIG_DFL) {
        DSHIM_INFO("flight recorder: %s already has a handler; DSHIM_TRACE_SIGNAL dumps are off (use "
                   "DSHIM_TRACE_SIGNAL=USR1/USR2 for a free one)", signal_word(sig));
        return;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_dump_signal;
    sa.sa_flags = SA_RESTART; /* the application's blocking calls go on */
    sigemptyset(&sa.sa_mask);
    if (sigaction(sig, &sa, NULL) == 0) {
        sig_num = sig;
    }
}

/* sig_lock held. */
static void start_recorder(void)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) {
        DSHIM_WARN("flight recorder: pipe: %s; no dumps on %s", strerror(errno), signal_word(sig_num));
        return;
    }
    fcntl(p[1], F_SETFL, fcntl(p[1], F_GETFL) | O_NONBLOCK);
    /* the new thread inherits this mask: it must never run a handler */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&recorder_thread, NULL, recorder_main, (void *)(intptr_t)p[0]);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        DSHIM_WARN("flight recorder: cannot start its thread (%s); no dumps on %s", strerror(rc),
                   signal_word(sig_num));
        close(p[0]);
        close(p[1]);
        return;
    }
    pipe_rd = p[0];
    __atomic_store_n(&pipe_wr, p[1], __ATOMIC_RELEASE);
    recorder_running = 1;
}

void dshim_trace_signal_setup(void)
{
    pthread_once(&setup_once_ctl, setup_once);
    pthread_mutex_lock(&sig_lock);
    if (!sig_checked) {
        install_handler();
    }
    if (sig_num && !recorder_running) {
        start_recorder();
    }
    pthread_mutex_unlock(&sig_lock);
}

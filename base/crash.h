/* Crash reports: on SIGSEGV/SIGBUS/SIGILL/SIGFPE/SIGABRT print the rank, host
 * and a backtrace to stderr, then die of the same signal (after chaining to
 * any handler installed before ours), so exit status and core dumps are as
 * without dshim. */
#ifndef DSHIM_CRASH_H
#define DSHIM_CRASH_H

/* Installs the handlers once per process (thread-safe, idempotent); does
 * nothing when DSHIM_BACKTRACE=0.  Each thread that calls it also gets a
 * generously sized alternate signal stack, so a stack overflow in that thread
 * can still be reported; other threads run the handler on their own stack. */
void dshim_crash_install(void);

/* A function the handler calls after the backtrace, before the process dies
 * (the flight recorder's dump: shim/trace registers it, base cannot call
 * up).  Best effort: it runs in the signal handler of a crashed process, may
 * use stdio and malloc, and is bounded by the report's watchdog; it is
 * called at most once per process.  NULL removes it. */
void dshim_crash_set_dump_hook(void (*fn)(int sig));

#endif

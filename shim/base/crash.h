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

#endif

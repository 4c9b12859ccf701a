/*
 * The signals the controller and the agents act on, turned into bytes on a
 * pipe so that their poll() loops wake for them and act outside the handler.
 */
#ifndef DSHIM_RUN_SIGNALS_H
#define DSHIM_RUN_SIGNALS_H

/* Catches SIGCHLD, SIGINT, SIGTERM and SIGHUP and ignores SIGPIPE (a reader
 * that went away is seen as a write error).  0, or -1 with errno when the
 * pipe cannot be made.  Again in the same process: the same pipe. */
int run_signals_catch(void);
/* Also catches sig the same way (the controller: SIGUSR1 asks for the
 * job's status, docs/launcher.md).  After run_signals_catch. */
void run_signals_catch_also(int sig);
/* The pipe's read end, for poll(). */
int run_signals_fd(void);
/* Takes what arrived and fills sigs with the signals other than SIGCHLD (it
 * only wakes the loop, which reaps anyway); returns how many. */
int run_signals_take(int *sigs, int cap);

#endif

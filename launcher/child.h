/* Starting processes with piped output, reaping them and telling how they
 * ended, and finding every descendant to kill. */
#ifndef DSHIM_RUN_CHILD_H
#define DSHIM_RUN_CHILD_H

#include <stdbool.h>
#include <sys/types.h>

typedef struct {
    char *const *argv;
    char *const *envp;  /* NULL = this process's environment */
    const char *cwd;    /* NULL = here */
    bool stdin_pipe;    /* else stdin is /dev/null */
    bool own_pgrp;      /* setpgid(0, 0): terminal signals go to us only, kill(-pid) reaches its tree */
    int pdeathsig;      /* signal when the spawning thread dies; 0 = none */
} run_spawn_t;

typedef struct {
    pid_t pid;
    int in_fd;   /* -1 without stdin_pipe */
    int out_fd;
    int err_fd;
} run_child_t;

/* 0, or -1 with "what failed: why" in err (chdir and exec failures of the
 * child are reported here, through a close-on-exec pipe). */
int run_child_spawn(const run_spawn_t *s, run_child_t *c, char *err, size_t errlen);
/* How a child ended, as an agent's "X" frame carries it. */
typedef struct {
    long code;  /* exit code; -1 when a signal killed it */
    long sig;   /* 0 when it exited */
} run_exit_t;

run_exit_t run_exit_of(int status);
/* The job's exit code for it, as a shell reports one: the code, or 128 + the signal (0 = success). */
int run_exit_code(run_exit_t e);
/* Reaps every child that has ended (without waiting) and passes each to
 * on_exit, also orphans this subreaper inherited: on_exit ignores pids it
 * does not know. */
void run_reap_each(void (*on_exit)(void *ctx, pid_t pid, int status), void *ctx);
/* After a kill: SIGKILLs every descendant of this process and reaps them,
 * giving them up to a second to go (they vanish only once reaped). */
void run_sweep_descendants(void);
/* Sends sig to every live descendant of root (not root), found through /proc. Returns how many. */
int run_signal_descendants(pid_t root, int sig);
/* Searches PATH for a program; returns malloc'ed absolute path or NULL. */
char *run_which(const char *prog);

#endif

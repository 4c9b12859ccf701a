/*
 * Reading children's output without blocking: a child's stdout and stderr
 * cut into lines (run_pipes_t), and a poll() set over such pipes and the
 * caller's own descriptors (run_pollset_t).  The one copy of these rules for
 * the controller (its agents' pipes), the agents (their processes' pipes)
 * and --sync-dst-dir (rsync's pipes).
 */
#ifndef DSHIM_RUN_PUMP_H
#define DSHIM_RUN_PUMP_H

#include <poll.h>
#include <stdbool.h>
#include <stddef.h>

#include "frame.h"

enum { RUN_PIPE_OUT = 0, RUN_PIPE_ERR = 1 };

/* Called for every complete line (without its '\n'); err: it came on stderr. */
typedef void (*run_pipe_line_cb)(void *owner, bool err, const char *line, size_t len);

typedef struct {
    int fd[2];                 /* RUN_PIPE_OUT, RUN_PIPE_ERR; -1 once closed (or never opened) */
    run_linebuf_t lines[2];
    run_pipe_line_cb on_line;
    void *owner;
} run_pipes_t;

/* Nothing open: what a child that never started has. */
void run_pipes_init(run_pipes_t *p);
/* Takes over a started child's two read ends (made non-blocking). */
void run_pipes_attach(run_pipes_t *p, int out_fd, int err_fd, run_pipe_line_cb on_line, void *owner);
/* Either stream still open. */
bool run_pipes_open(const run_pipes_t *p);
/* One read of a stream poll() found readable; at its end (or on an error)
 * the last unfinished line is passed on and the stream closed. */
void run_pipes_read(run_pipes_t *p, int which);
/* After the child ended: reads what is there now, then closes both streams
 * (a grandchild may hold a pipe open forever, so nothing is waited for). */
void run_pipes_drain(run_pipes_t *p);
/* Closes what is still open (an unfinished line is dropped) and frees the buffers; may be called twice. */
void run_pipes_free(run_pipes_t *p);

typedef struct {
    struct pollfd *pfd;
    run_pipes_t **pipes;  /* per entry: whose stream it is; NULL for the caller's own descriptors */
    int *which;
    int n, cap;
} run_pollset_t;

/* Empties the set for the next round (keeps its memory); a zeroed set is empty. */
void run_pollset_clear(run_pollset_t *ps);
/* Adds one of the caller's descriptors; returns its entry for run_pollset_ready. */
int run_pollset_add_fd(run_pollset_t *ps, int fd);
/* Adds the streams of p that are still open. */
void run_pollset_add_pipes(run_pollset_t *ps, run_pipes_t *p);
/* poll(); returns how many entries are ready, 0 on a timeout or an
 * interrupting signal, -1 on any other error (errno set). */
int run_pollset_wait(run_pollset_t *ps, int timeout_ms);
/* Entry (from run_pollset_add_fd; -1 = none) is readable or hung up. */
bool run_pollset_ready(const run_pollset_t *ps, int entry);
/* One read of every pipe stream that is ready. */
void run_pollset_read_pipes(run_pollset_t *ps);
void run_pollset_free(run_pollset_t *ps);

#endif

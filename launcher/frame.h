/*
 * What agents tell the controller: one frame per line on the agent's stdout,
 * "\x1e<kind> <fields...>\n".  Line-based so that it survives mpirun's and
 * srun's output forwarding, which may merge the streams of many agents but
 * never splits a short line written with one write().  Lines without the
 * mark (ssh or mpirun talking) are shown as they are.
 *
 *   H <host> <agent-pid>        agent is up
 *   S <idx> <pid> <host>        process idx started
 *   O <idx> <text>              a line the process wrote to stdout
 *   E <idx> <text>              ... to stderr
 *   X <idx> <code> <signal>     process ended (code -1 when killed by signal)
 *   F <idx> <text>              the agent could not start/handle idx (-1: whole agent)
 *   R <idx> <text>              why idx failed, from torch's error file (before its X)
 *   T <idx> <text>              a line of idx's timeline file (--timeline, timeline.h)
 *   Q -1 <n> <mono> <real>      the answer to the controller's clock ping n (timeline.h)
 *   D -1 <name>                 a flight-recorder dump file begins (collect.h)
 *   B -1 <base64>               its bytes
 *   Y <idx> <state> <asked> <answered>  process idx when the dumps were asked for
 *   Z -1 <n> <files>            the agent's answer to collection n is complete
 *   A -1 <n>                    the agent got the request for collection n (sent at once)
 */
#ifndef DSHIM_RUN_FRAME_H
#define DSHIM_RUN_FRAME_H

#include <stddef.h>

#define RUN_FRAME_MARK '\x1e'
/* Longer output lines are cut into pieces of this size. */
#define RUN_LINE_MAX 16384

typedef struct {
    char *buf;
    size_t len, cap;
} run_linebuf_t;

typedef void (*run_line_cb)(void *ctx, const char *line, size_t len);

/* Appends data and calls cb for every complete line (without its '\n'). */
void run_linebuf_feed(run_linebuf_t *lb, const char *data, size_t n, run_line_cb cb, void *ctx);
/* Emits what is left as a last line (process ended without a newline). */
void run_linebuf_flush(run_linebuf_t *lb, run_line_cb cb, void *ctx);
void run_linebuf_free(run_linebuf_t *lb);

typedef struct {
    char kind;
    int idx;
    long a, b;         /* S: pid; X: code, signal; H: pid */
    const char *text;  /* O/E/F/H: rest of the line (not NUL-terminated: textlen) */
    size_t textlen;
} run_frame_t;

/* 0 and *f filled, or -1 if the line is not a frame. */
int run_frame_parse(const char *line, size_t len, run_frame_t *f);
/* Writes one frame to fd with a single write (blocking); text may be NULL. */
void run_frame_write(int fd, char kind, int idx, long a, long b, const char *text, size_t textlen);

#endif

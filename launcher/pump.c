/* Children's output pipes cut into lines, and the poll set over them (pump.h). */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include "pump.h"
#include "run.h"

typedef struct {
    run_pipes_t *p;
    bool err;
} stream_ctx_t;

static void emit_line(void *vctx, const char *line, size_t len)
{
    stream_ctx_t *ctx = vctx;
    ctx->p->on_line(ctx->p->owner, ctx->err, line, len);
}

void run_pipes_init(run_pipes_t *p)
{
    *p = (run_pipes_t){.fd = {-1, -1}};
}

void run_pipes_attach(run_pipes_t *p, int out_fd, int err_fd, run_pipe_line_cb on_line, void *owner)
{
    run_pipes_init(p);
    p->fd[RUN_PIPE_OUT] = out_fd;
    p->fd[RUN_PIPE_ERR] = err_fd;
    p->on_line = on_line;
    p->owner = owner;
    for (int w = 0; w < 2; w++) {
        fcntl(p->fd[w], F_SETFL, fcntl(p->fd[w], F_GETFL) | O_NONBLOCK);
    }
}

bool run_pipes_open(const run_pipes_t *p)
{
    return p->fd[RUN_PIPE_OUT] >= 0 || p->fd[RUN_PIPE_ERR] >= 0;
}

/* One read (drain = false), or reads until nothing more is there now (drain = true). */
static void pump(run_pipes_t *p, int which, bool drain)
{
    stream_ctx_t ctx = {p, which == RUN_PIPE_ERR};
    char buf[65536];
    for (;;) {
        ssize_t r = read(p->fd[which], buf, sizeof(buf));
        if (r > 0) {
            run_linebuf_feed(&p->lines[which], buf, (size_t)r, emit_line, &ctx);
            if (!drain) {
                return;
            }
            continue;
        }
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r < 0 && errno == EAGAIN && !drain) {
            return;
        }
        /* EOF, an error, or (when draining after the exit) nothing more right now */
        run_linebuf_flush(&p->lines[which], emit_line, &ctx);
        close(p->fd[which]);
        p->fd[which] = -1;
        return;
    }
}

void run_pipes_read(run_pipes_t *p, int which)
{
    if (p->fd[which] >= 0) {
        pump(p, which, false);
    }
}

void run_pipes_drain(run_pipes_t *p)
{
    for (int w = 0; w < 2; w++) {
        if (p->fd[w] >= 0) {
            pump(p, w, true);
        }
    }
}

void run_pipes_free(run_pipes_t *p)
{
    for (int w = 0; w < 2; w++) {
        if (p->fd[w] >= 0) {
            close(p->fd[w]);
            p->fd[w] = -1;
        }
        run_linebuf_free(&p->lines[w]);
    }
}

void run_pollset_clear(run_pollset_t *ps)
{
    ps->n = 0;
}

static int add_entry(run_pollset_t *ps, int fd, run_pipes_t *p, int which)
{
    if (ps->n == ps->cap) {
        int cap = ps->cap ? 2 * ps->cap : 16;
        struct pollfd *pfd = realloc(ps->pfd, (size_t)cap * sizeof(*pfd));
        run_pipes_t **pipes = realloc(ps->pipes, (size_t)cap * sizeof(*pipes));
        int *w = realloc(ps->which, (size_t)cap * sizeof(*w));
        if (pfd) {
            ps->pfd = pfd;
        }
        if (pipes) {
            ps->pipes = pipes;
        }
        if (w) {
            ps->which = w;
        }
        if (pfd == NULL || pipes == NULL || w == NULL) {
            run_say("out of memory");
            exit(1);
        }
        ps->cap = cap;
    }
    ps->pfd[ps->n] = (struct pollfd){.fd = fd, .events = POLLIN};
    ps->pipes[ps->n] = p;
    ps->which[ps->n] = which;
    return ps->n++;
}

int run_pollset_add_fd(run_pollset_t *ps, int fd)
{
    return add_entry(ps, fd, NULL, 0);
}

void run_pollset_add_pipes(run_pollset_t *ps, run_pipes_t *p)
{
    for (int w = 0; w < 2; w++) {
        if (p->fd[w] >= 0) {
            add_entry(ps, p->fd[w], p, w);
        }
    }
}

int run_pollset_wait(run_pollset_t *ps, int timeout_ms)
{
    int r = poll(ps->pfd, (nfds_t)ps->n, timeout_ms);
    if (r < 0 && errno == EINTR) {
        /* a signal: its byte on the signal pipe is seen on the next round */
        for (int i = 0; i < ps->n; i++) {
            ps->pfd[i].revents = 0;
        }
        return 0;
    }
    return r;
}

bool run_pollset_ready(const run_pollset_t *ps, int entry)
{
    return entry >= 0 && entry < ps->n && ps->pfd[entry].revents != 0;
}

void run_pollset_read_pipes(run_pollset_t *ps)
{
    for (int i = 0; i < ps->n; i++) {
        if (ps->pipes[i] && ps->pfd[i].revents) {
            run_pipes_read(ps->pipes[i], ps->which[i]);
        }
    }
}

void run_pollset_free(run_pollset_t *ps)
{
    free(ps->pfd);
    free(ps->pipes);
    free(ps->which);
    *ps = (run_pollset_t){0};
}

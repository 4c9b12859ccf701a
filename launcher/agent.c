/*
 * The agent: `dshim-run --agent` (one per host; job description on stdin,
 * stdin kept open as the controller's lifeline) and `dshim-run --agent-rank`
 * (one per rank under mpirun/srun; description in DSHIM_RUN_SPEC, rank from
 * OMPI_COMM_WORLD_RANK / SLURM_PROCID / PMI_RANK).
 *
 * It starts its processes, each in its own process group, relays their
 * output as frames (frame.h) and their exits.  It stops them all — SIGTERM,
 * then SIGKILL after the grace period, including anything they forked
 * (the agent is a child subreaper) — when the controller says "K", when its
 * stdin closes (controller or ssh connection gone), or on SIGTERM/SIGINT/
 * SIGHUP.  It exits once every process and descendant is gone, so nothing
 * of the job outlives it.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "child.h"
#include "errfile.h"
#include "config.h"
#include "frame.h"
#include "log.h"
#include "net.h"
#include "spec.h"

extern char **environ;

typedef struct {
    run_spec_proc_t *sp;
    run_child_t ch;
    bool running;
    bool out_open, err_open;
    run_linebuf_t out, err;
} aproc_t;

typedef struct {
    int idx;
    char kind;
} line_ctx_t;

static int sig_pipe[2] = {-1, -1};

static void on_signal(int sig)
{
    int saved = errno;
    unsigned char b = (unsigned char)sig;
    if (write(sig_pipe[1], &b, 1) < 0) {
        /* pipe full: a wakeup is already pending */
    }
    errno = saved;
}

static void emit_line(void *vctx, const char *line, size_t len)
{
    line_ctx_t *ctx = vctx;
    run_frame_write(1, ctx->kind, ctx->idx, 0, 0, line, len);
}

static void fail_agent(const char *msg)
{
    run_frame_write(1, 'F', -1, 0, 0, msg, strlen(msg));
}

/* Reads from a process's pipe; closes it at EOF. */
static void pump(aproc_t *p, bool err_stream, bool drain)
{
    int *fd = err_stream ? &p->ch.err_fd : &p->ch.out_fd;
    bool *open_ = err_stream ? &p->err_open : &p->out_open;
    line_ctx_t ctx = {p->sp->index, err_stream ? 'E' : 'O'};
    char buf[65536];
    for (;;) {
        ssize_t r = read(*fd, buf, sizeof(buf));
        if (r > 0) {
            run_linebuf_feed(err_stream ? &p->err : &p->out, buf, (size_t)r, emit_line, &ctx);
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
        /* EOF, error, or (when draining after exit) nothing more right now:
         * a grandchild may hold the pipe open forever, so stop reading it. */
        run_linebuf_flush(err_stream ? &p->err : &p->out, emit_line, &ctx);
        close(*fd);
        *fd = -1;
        *open_ = false;
        return;
    }
}

/* Under srun several "nodes" may share a hostname; Slurm's node name is what users know. */
static const char *agent_host_name(void)
{
    const char *n = dshim_config()->slurmd_nodename;
    return (n && n[0]) ? n : dshim_log_hostname();
}

static int spawn_all(run_spec_t *spec, aproc_t *procs, int n)
{
    /* The common environment applies to this agent too, so that PATH lookups
     * of the program see the controller's PATH. */
    for (int i = 0; i < spec->env.n; i++) {
        const char *kv = spec->env.v[i];
        const char *eq = strchr(kv, '=');
        if (eq) {
            char *key = strndup(kv, (size_t)(eq - kv));
            setenv(key, eq + 1, 1);
            free(key);
        }
    }
    int failures = 0;
    for (int i = 0; i < n; i++) {
        aproc_t *p = &procs[i];
        run_strv_t env = {0};
        for (char **e = environ; *e; e++) {
            run_strv_add(&env, *e);
        }
        for (int k = 0; k < p->sp->env.n; k++) {
            const char *kv = p->sp->env.v[k];
            const char *eq = strchr(kv, '=');
            if (eq) {
                char *key = strndup(kv, (size_t)(eq - kv));
                run_strv_setenv(&env, key, "%s", eq + 1);
                free(key);
            }
        }
        run_errfile_prepare(run_errfile_path(&p->sp->env));
        run_spawn_t s = {.argv = run_strv_terminated(&p->sp->argv), .envp = run_strv_terminated(&env),
                         .cwd = spec->cwd, .stdin_pipe = false, .own_pgrp = true, .pdeathsig = SIGKILL};
        char err[512];
        int rc = run_child_spawn(&s, &p->ch, err, sizeof(err));
        run_strv_free(&env);
        if (p->ch.pid > 0) {
            p->running = true;
            p->out_open = p->err_open = true;
            fcntl(p->ch.out_fd, F_SETFL, O_NONBLOCK);
            fcntl(p->ch.err_fd, F_SETFL, O_NONBLOCK);
        }
        if (rc != 0) {
            char msg[700];
            snprintf(msg, sizeof(msg), "%s (on host %s)", err, agent_host_name());
            run_frame_write(1, 'F', p->sp->index, 0, 0, msg, strlen(msg));
            failures++;
            continue;
        }
        const char *host = agent_host_name();
        run_frame_write(1, 'S', p->sp->index, p->ch.pid, 0, host, strlen(host));
    }
    return failures;
}

static void signal_all(aproc_t *procs, int n, int sig)
{
    for (int i = 0; i < n; i++) {
        if (procs[i].running) {
            kill(-procs[i].ch.pid, sig);
        }
    }
    run_signal_descendants(getpid(), sig);
}

static int reap(aproc_t *procs, int n, int *first_bad)
{
    int live = 0;
    for (;;) {
        int status = 0;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid <= 0) {
            break;
        }
        for (int i = 0; i < n; i++) {
            aproc_t *p = &procs[i];
            if (!p->running || p->ch.pid != pid) {
                continue;
            }
            p->running = false;
            if (p->out_open) {
                pump(p, false, true);
            }
            if (p->err_open) {
                pump(p, true, true);
            }
            long code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
            long sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
            char *why = run_errfile_take(run_errfile_path(&p->sp->env));
            if (why && (code != 0 || sig != 0)) {
                run_frame_write(1, 'R', p->sp->index, 0, 0, why, strlen(why));
            }
            free(why);
            run_frame_write(1, 'X', p->sp->index, code, sig, NULL, 0);
            if ((code != 0 || sig != 0) && *first_bad == 0) {
                *first_bad = sig ? 128 + (int)sig : (int)code;
            }
        }
        /* other pids: orphans this subreaper inherited; reaped, nothing to say */
    }
    for (int i = 0; i < n; i++) {
        live += procs[i].running;
    }
    return live;
}

static char *read_spec_line(char *leftover, size_t *leftover_len)
{
    size_t cap = 65536, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (len + 1 >= cap) {
            cap *= 2;
            buf = realloc(buf, cap);
        }
        ssize_t r = read(0, buf + len, cap - len - 1);
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r <= 0) {
            free(buf);
            return NULL;
        }
        len += (size_t)r;
        char *nl = memchr(buf, '\n', len);
        if (nl) {
            size_t rest = len - (size_t)(nl + 1 - buf);
            *leftover_len = rest < 64 ? rest : 64;
            memcpy(leftover, nl + 1, *leftover_len);
            *nl = '\0';
            return buf;
        }
    }
}

static int pick_rank_proc(run_spec_t *spec)
{
    const dshim_config_t *c = dshim_config();
    long rank = c->ompi_rank >= 0 ? c->ompi_rank : c->slurm_procid >= 0 ? c->slurm_procid : c->pmi_rank;
    long local = c->ompi_rank >= 0 ? c->ompi_local_rank : c->slurm_procid >= 0 ? c->slurm_localid : -1;
    char msg[512];
    if (rank < 0) {
        fail_agent("dshim-run --agent-rank found no rank (OMPI_COMM_WORLD_RANK, SLURM_PROCID, PMI_RANK); it is "
                   "started by dshim-run under mpirun or srun, not by hand");
        return -1;
    }
    if (rank >= spec->nprocs) {
        snprintf(msg, sizeof(msg), "rank %ld is beyond the %d processes planned: mpirun/srun started more "
                 "processes than dshim-run asked for (check DSHIM_RUN_MPIRUN/DSHIM_RUN_SRUN options)", rank,
                 spec->nprocs);
        fail_agent(msg);
        return -1;
    }
    const char *want = NULL;
    for (int i = 0; i < spec->procs[rank].env.n; i++) {
        if (strncmp(spec->procs[rank].env.v[i], "LOCAL_RANK=", 11) == 0) {
            want = spec->procs[rank].env.v[i] + 11;
        }
    }
    if (want && local >= 0 && atol(want) != local) {
        snprintf(msg, sizeof(msg), "%s was placed as local rank %ld on %s but dshim-run planned local rank %s: "
                 "mpirun/srun did not place processes in blocks per node (check the hostfile slots or the "
                 "allocation)", spec->procs[rank].name, local, agent_host_name(), want);
        fail_agent(msg);
        return -1;
    }
    return (int)rank;
}

int run_agent_main(bool rank_mode)
{
    signal(SIGPIPE, SIG_IGN);
    if (pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
        return 1;
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGCHLD, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    if (rank_mode) {
        prctl(PR_SET_PDEATHSIG, SIGTERM);  /* orted / slurmstepd gone: stop */
    }

    char leftover[64];
    size_t leftover_len = 0;
    char *text = NULL;
    if (rank_mode) {
        text = run_xstrdup(dshim_config()->run_spec);
    } else {
        text = read_spec_line(leftover, &leftover_len);
        if (text == NULL) {
            return 1;  /* controller gone before it said anything */
        }
    }
    char hostbuf[256];
    snprintf(hostbuf, sizeof(hostbuf), "%s", dshim_log_hostname());
    run_frame_write(1, 'H', 0, getpid(), 0, hostbuf, strlen(hostbuf));
    run_spec_t spec;
    char err[256];
    if (run_spec_decode(text, &spec, err, sizeof(err)) != 0) {
        fail_agent(err);
        free(text);
        return RUN_EXIT_USAGE;
    }
    free(text);
    int first = 0, n = spec.nprocs;
    if (rank_mode) {
        first = pick_rank_proc(&spec);
        if (first < 0) {
            run_spec_free(&spec);
            return RUN_EXIT_USAGE;
        }
        n = 1;
    }
    aproc_t *procs = run_xmalloc((size_t)n * sizeof(*procs));
    for (int i = 0; i < n; i++) {
        procs[i].sp = &spec.procs[first + i];
        procs[i].ch.out_fd = procs[i].ch.err_fd = -1;
    }
    int first_bad = spawn_all(&spec, procs, n) ? 127 : 0;

    bool watch_stdin = !rank_mode;
    bool stopping = false;
    double kill_at = 0;
    if (leftover_len && memchr(leftover, 'K', leftover_len)) {
        stopping = true;
    }
    if (stopping || first_bad) {
        stopping = true;
        signal_all(procs, n, SIGTERM);
        kill_at = dshim_now() + spec.grace_s;
    }
    int live = reap(procs, n, &first_bad);
    bool killed = false;
    while (live > 0 || run_signal_descendants(getpid(), 0) > 0) {
        if (live == 0 && !stopping) {
            /* Every process ended; what remains are things they forked. */
            stopping = true;
            signal_all(procs, n, SIGTERM);
            kill_at = dshim_now() + spec.grace_s;
        }
        struct pollfd pfd[2 + 2 * 64];
        aproc_t *owner[2 + 2 * 64];
        bool is_err[2 + 2 * 64];
        int np = 0;
        pfd[np++] = (struct pollfd){.fd = sig_pipe[0], .events = POLLIN};
        if (watch_stdin) {
            pfd[np++] = (struct pollfd){.fd = 0, .events = POLLIN};
        }
        int base = np;
        for (int i = 0; i < n && np + 2 <= (int)(sizeof(pfd) / sizeof(pfd[0])); i++) {
            if (procs[i].out_open) {
                owner[np] = &procs[i];
                is_err[np] = false;
                pfd[np++] = (struct pollfd){.fd = procs[i].ch.out_fd, .events = POLLIN};
            }
            if (procs[i].err_open) {
                owner[np] = &procs[i];
                is_err[np] = true;
                pfd[np++] = (struct pollfd){.fd = procs[i].ch.err_fd, .events = POLLIN};
            }
        }
        int timeout = 500;
        if (stopping) {
            double left = kill_at - dshim_now();
            timeout = left <= 0 ? 0 : (int)(left * 1000) + 1;
            if (timeout > 200) {
                timeout = 200;  /* descendants are found by polling /proc */
            }
        }
        int r = poll(pfd, (nfds_t)np, timeout);
        if (r < 0 && errno != EINTR) {
            break;
        }
        if (r > 0) {
            if (pfd[0].revents) {
                unsigned char b[64];
                ssize_t got = read(sig_pipe[0], b, sizeof(b));
                for (ssize_t k = 0; k < got; k++) {
                    if (b[k] != SIGCHLD && !stopping) {
                        stopping = true;
                        signal_all(procs, n, SIGTERM);
                        kill_at = dshim_now() + spec.grace_s;
                    }
                }
            }
            if (watch_stdin && pfd[1].revents) {
                char b[64];
                ssize_t got = read(0, b, sizeof(b));
                if (got <= 0 || memchr(b, 'K', (size_t)got)) {
                    /* "K", or the controller / ssh connection is gone */
                    watch_stdin = false;
                    if (!stopping) {
                        stopping = true;
                        signal_all(procs, n, SIGTERM);
                        kill_at = dshim_now() + spec.grace_s;
                    }
                }
            }
            for (int k = base; k < np; k++) {
                if (pfd[k].revents) {
                    pump(owner[k], is_err[k], false);
                }
            }
        }
        live = reap(procs, n, &first_bad);
        if (stopping && !killed && dshim_now() >= kill_at) {
            killed = true;
            signal_all(procs, n, SIGKILL);
        }
        if (killed && live == 0) {
            /* SIGKILL'ed descendants vanish once reaped; give them a moment */
            for (int k = 0; k < 50 && run_signal_descendants(getpid(), SIGKILL) > 0; k++) {
                usleep(20000);
                reap(procs, n, &first_bad);
            }
            break;
        }
    }
    for (int i = 0; i < n; i++) {
        run_linebuf_free(&procs[i].out);
        run_linebuf_free(&procs[i].err);
    }
    free(procs);
    run_spec_free(&spec);
    return first_bad;
}

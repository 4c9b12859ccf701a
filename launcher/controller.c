/*
 * The controller: starts one agent per host (directly or over ssh) or one
 * mpirun/srun whose agents each run one rank, relays their frames to the
 * output, and stops the whole job — every host — when a process fails, a
 * host is lost, or the user interrupts.  One attempt per call; restarts are
 * main's business.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ftw.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "child.h"
#include "config.h"
#include "frame.h"
#include "log.h"
#include "net.h"
#include "output.h"
#include "spec.h"
#include "store.h"

extern char **environ;

typedef struct {
    const run_group_t *g;
    run_child_t ch;
    char desc[200];   /* "ssh to node2", "mpirun", "agent on this host" */
    char host[128];   /* host named in messages */
    bool reaped;
    int status;
    bool hello;
    bool out_open, err_open;
    run_linebuf_t out, err;
    char last_err[400];
} agent_t;

typedef struct {
    bool started, ended;
    long code, sig;
    long pid;
    char host[128];
    char *reason;  /* the exception torch recorded, if any */
} pstate_t;

typedef struct {
    const run_opts_t *o;
    run_plan_t *plan;
    agent_t *agents;
    int nagents;
    pstate_t *ps;
    run_output_t *out;
    bool stopping;
    double kill_at;
    bool killed;
    bool have_reason;
    int exit_code;
    bool failed;
    char reason[1024];        /* the first failure, as reported */
    char *mpi_hostfile;
    dshim_store_t *peers;     /* per-node mode: the store shared with the other nodes' dshim-run */
    double peers_next;
    bool peers_told;
} ctl_t;

typedef struct {
    ctl_t *c;
    agent_t *a;
    bool err;
} agent_line_ctx_t;

static int sig_pipe[2] = {-1, -1};

static void on_signal(int sig)
{
    int saved = errno;
    unsigned char b = (unsigned char)sig;
    if (write(sig_pipe[1], &b, 1) < 0) {
        /* full: a wakeup is pending anyway */
    }
    errno = saved;
}

static const char *signame(long sig)
{
    const char *s = sigabbrev_np((int)sig);
    return s ? s : "?";
}

static int live_procs(const ctl_t *c)
{
    int n = 0;
    for (int i = 0; i < c->plan->nprocs; i++) {
        n += c->ps[i].started && !c->ps[i].ended;
    }
    return n;
}

/* origin: the agent whose process failed, or NULL.  mpirun and srun (with
 * --kill-on-bad-exit) abort their own job when one of their ranks fails;
 * signalling them during that abort only makes mpirun crash, so the origin
 * is left alone until the kill deadline. */
static void begin_stop(ctl_t *c, const agent_t *origin)
{
    if (c->stopping) {
        return;
    }
    c->stopping = true;
    /* agents get the grace period for SIGTERM -> SIGKILL, we add a margin
     * before killing the agents (and so, through their lifelines, everything) */
    c->kill_at = dshim_now() + c->plan->grace_s + 2.0;
    for (int i = 0; i < c->nagents; i++) {
        agent_t *a = &c->agents[i];
        if (a->reaped) {
            continue;
        }
        if (a->ch.in_fd >= 0) {
            if (write(a->ch.in_fd, "K\n", 2) < 0) {
                /* agent already gone: it will be reaped */
            }
            close(a->ch.in_fd);
            a->ch.in_fd = -1;
        } else if (a != origin) {
            kill(a->ch.pid, SIGTERM);  /* mpirun/srun forward it to their ranks */
        }
    }
}

/* The first failure decides the exit code and the message. */
static void fail(ctl_t *c, const agent_t *origin, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void fail(ctl_t *c, const agent_t *origin, int code, const char *fmt, ...)
{
    if (c->have_reason || c->stopping) {
        return;
    }
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    c->have_reason = true;
    c->exit_code = code;
    c->failed = true;
    snprintf(c->reason, sizeof(c->reason), "%s", msg);
    int live = live_procs(c);
    run_say("%s; stopping the job (%d other process%s running)", msg, live, live == 1 ? "" : "es");
    begin_stop(c, origin);
}

static bool idx_ok(const agent_t *a, int idx)
{
    return idx >= a->g->first && idx < a->g->first + a->g->count;
}

static void on_agent_line(void *vctx, const char *line, size_t len)
{
    agent_line_ctx_t *ctx = vctx;
    ctl_t *c = ctx->c;
    agent_t *a = ctx->a;
    run_frame_t f;
    if (ctx->err || run_frame_parse(line, len, &f) != 0 || (f.kind != 'H' && f.idx != -1 && !idx_ok(a, f.idx))) {
        /* ssh, mpirun or srun speaking (or an agent's own diagnostics) */
        if (ctx->err) {
            snprintf(a->last_err, sizeof(a->last_err), "%.*s", (int)len, line);
        }
        if (c->stopping && a->ch.in_fd < 0 && a->g->kind >= RUN_AGENT_MPI) {
            return;  /* mpirun's / srun's account of the abort we already reported */
        }
        if (ctx->err && !a->hello && a->g->kind == RUN_AGENT_SSH) {
            return;  /* ssh's complaint; the "cannot reach host" line quotes it */
        }
        fprintf(ctx->err ? stderr : stdout, "[%s] %.*s\n", a->desc, (int)len, line);
        fflush(ctx->err ? stderr : stdout);
        return;
    }
    pstate_t *p = f.idx >= 0 ? &c->ps[f.idx] : NULL;
    switch (f.kind) {
    case 'H':
        a->hello = true;
        break;
    case 'S':
        p->started = true;
        p->pid = f.a;
        if (a->g->kind == RUN_AGENT_SSH) {
            snprintf(p->host, sizeof(p->host), "%s", a->host);
        } else {
            snprintf(p->host, sizeof(p->host), "%.*s", (int)f.textlen, f.text);
        }
        break;
    case 'R':
        free(p->reason);
        p->reason = strndup(f.text, f.textlen);
        break;
    case 'O':
    case 'E':
        run_output_line(c->out, f.idx, f.kind == 'E', f.text, f.textlen);
        break;
    case 'F':
        if (p) {
            p->ended = true;
        }
        fail(c, a, RUN_EXIT_USAGE, "%s: %.*s", p ? c->plan->procs[f.idx].name : a->desc, (int)f.textlen, f.text);
        break;
    case 'X': {
        p->ended = true;
        p->started = true;
        p->code = f.a;
        p->sig = f.b;
        const char *name = c->plan->procs[f.idx].name;
        if (f.b != 0 || f.a != 0) {
            if (!c->stopping) {
                run_output_show_tail(c->out, f.idx);  /* the failure, not the ones we stop */
            }
            const char *sep = p->reason ? ": " : "";
            const char *why = p->reason ? p->reason : "";
            if (f.b != 0) {
                fail(c, a, 128 + (int)f.b, "%s on host %s (pid %ld) was killed by signal %ld (SIG%s)%s%s", name,
                     p->host, p->pid, f.b, signame(f.b), sep, why);
            } else {
                fail(c, a, (int)f.a, "%s on host %s (pid %ld) exited with code %ld%s%s", name, p->host, p->pid, f.a,
                     sep, why);
            }
        }
        break;
    }
    default:
        break;
    }
}

static void pump_agent(ctl_t *c, agent_t *a, bool err, bool drain)
{
    int *fd = err ? &a->ch.err_fd : &a->ch.out_fd;
    bool *open_ = err ? &a->err_open : &a->out_open;
    agent_line_ctx_t ctx = {c, a, err};
    char buf[65536];
    for (;;) {
        ssize_t r = read(*fd, buf, sizeof(buf));
        if (r > 0) {
            run_linebuf_feed(err ? &a->err : &a->out, buf, (size_t)r, on_agent_line, &ctx);
            if (drain) {
                continue;
            }
            return;
        }
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r < 0 && errno == EAGAIN && !drain) {
            return;
        }
        run_linebuf_flush(err ? &a->err : &a->out, on_agent_line, &ctx);
        close(*fd);
        *fd = -1;
        *open_ = false;
        return;
    }
}

static void agent_gone(ctl_t *c, agent_t *a)
{
    if (a->out_open) {
        pump_agent(c, a, false, true);
    }
    if (a->err_open) {
        pump_agent(c, a, true, true);
    }
    int code = WIFEXITED(a->status) ? WEXITSTATUS(a->status) : 128 + WTERMSIG(a->status);
    int unfinished = 0;
    for (int i = a->g->first; i < a->g->first + a->g->count; i++) {
        if (!c->ps[i].ended) {
            unfinished++;
            c->ps[i].ended = true;
        }
    }
    if (c->stopping) {
        return;
    }
    const char *why = a->last_err[0] ? a->last_err : "no message";
    if (!a->hello) {
        if (a->g->kind == RUN_AGENT_SSH) {
            fail(c, a, RUN_EXIT_USAGE, "cannot reach host %s over ssh (exit code %d: %s); check the hostfile entry and "
                 "that '%s %s true' works (DSHIM_RUN_SSH sets the ssh command)", a->host, code, why,
                 dshim_config()->run_ssh, a->host);
        } else {
            fail(c, a, RUN_EXIT_USAGE, "%s exited with code %d before starting any process (%s)", a->desc, code, why);
        }
    } else if (unfinished > 0) {
        fail(c, a, code ? code : 1, "lost %s (exit code %d: %s) with %d process(es) unaccounted for", a->desc, code,
             why, unfinished);
    }
}

static void reap_agents(ctl_t *c)
{
    for (;;) {
        int status = 0;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid <= 0) {
            return;
        }
        for (int i = 0; i < c->nagents; i++) {
            agent_t *a = &c->agents[i];
            if (!a->reaped && a->ch.pid == pid) {
                a->reaped = true;
                a->status = status;
                if (a->ch.in_fd >= 0) {
                    close(a->ch.in_fd);
                    a->ch.in_fd = -1;
                }
                agent_gone(c, a);
            }
        }
    }
}

static char *write_mpi_hostfile(const run_opts_t *o, const run_group_t *g)
{
    char *path = NULL;
    if (asprintf(&path, "/tmp/dshim-run-%d-mpi-hosts", (int)getpid()) < 0) {
        return NULL;
    }
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        run_usage_error("cannot write %s for mpirun: %s", path, strerror(errno));
    }
    int slots = g->per_node > 0 ? g->per_node : (g->count + o->nhosts - 1) / o->nhosts;
    for (int i = 0; i < o->nhosts; i++) {
        const char *at = strchr(o->hosts[i].name, '@');
        fprintf(f, "%s slots=%d\n", at ? at + 1 : o->hosts[i].name, slots);
    }
    fclose(f);
    return path;
}

static void build_agent_argv(ctl_t *c, agent_t *a, run_strv_t *argv)
{
    const run_group_t *g = a->g;
    const dshim_config_t *cfg = dshim_config();
    switch (g->kind) {
    case RUN_AGENT_LOCAL:
        run_strv_add(argv, c->plan->self_exe);
        run_strv_add(argv, "--agent");
        break;
    case RUN_AGENT_SSH: {
        const run_host_t *h = &c->o->hosts[g->host];
        run_split_words(cfg->run_ssh, argv);
        /* the user's options come first: ssh keeps the first value of each */
        run_strv_add(argv, "-T");
        run_strv_add(argv, "-o");
        run_strv_add(argv, "BatchMode=yes");
        run_strv_add(argv, "-o");
        run_strv_add(argv, "ConnectTimeout=15");
        if (h->port) {
            run_strv_add(argv, "-p");
            run_strv_addf(argv, "%d", h->port);
        }
        run_strv_add(argv, h->name);
        /* The only text the remote shell parses: a quoted path. */
        char *q = run_shell_quote(c->plan->self_exe);
        run_strv_addf(argv, "exec %s --agent", q);
        free(q);
        break;
    }
    case RUN_AGENT_MPI:
        run_split_words(cfg->run_mpirun, argv);
        if (geteuid() == 0) {
            run_strv_add(argv, "--allow-run-as-root");
        }
        run_strv_add(argv, "-np");
        run_strv_addf(argv, "%d", g->count);
        if (c->o->hostfile) {
            c->mpi_hostfile = write_mpi_hostfile(c->o, g);
            run_strv_add(argv, "--hostfile");
            run_strv_add(argv, c->mpi_hostfile);
        } else {
            run_strv_add(argv, "--oversubscribe");  /* one machine: as many ranks as asked */
        }
        if (g->per_node > 0) {
            run_strv_add(argv, "--map-by");
            run_strv_addf(argv, "ppr:%d:node%s", g->per_node, c->o->hostfile ? "" : ":oversubscribe");
        }
        run_strv_add(argv, "--bind-to");
        run_strv_add(argv, "none");
        run_strv_add(argv, "-x");
        run_strv_add(argv, "DSHIM_RUN_SPEC");
        run_strv_add(argv, c->plan->self_exe);
        run_strv_add(argv, "--agent-rank");
        break;
    case RUN_AGENT_SLURM:
        run_split_words(cfg->run_srun, argv);
        run_strv_add(argv, "--kill-on-bad-exit=1");
        run_strv_addf(argv, "--ntasks=%d", g->count);
        if (g->per_node > 0) {
            run_strv_addf(argv, "--nodes=%d", g->nnodes);
            run_strv_addf(argv, "--ntasks-per-node=%d", g->per_node);
        }
        run_strv_add(argv, "--distribution=block");
        run_strv_add(argv, "--export=ALL");
        run_strv_add(argv, c->plan->self_exe);
        run_strv_add(argv, "--agent-rank");
        break;
    }
}

static int start_agent(ctl_t *c, agent_t *a)
{
    const run_group_t *g = a->g;
    switch (g->kind) {
    case RUN_AGENT_LOCAL:
        snprintf(a->desc, sizeof(a->desc), "agent on this host");
        snprintf(a->host, sizeof(a->host), "%s", dshim_log_hostname());
        break;
    case RUN_AGENT_SSH:
        snprintf(a->desc, sizeof(a->desc), "ssh %s", c->o->hosts[g->host].name);
        snprintf(a->host, sizeof(a->host), "%s", c->o->hosts[g->host].name);
        break;
    case RUN_AGENT_MPI:
        snprintf(a->desc, sizeof(a->desc), "mpirun");
        snprintf(a->host, sizeof(a->host), "(mpirun)");
        break;
    case RUN_AGENT_SLURM:
        snprintf(a->desc, sizeof(a->desc), "srun");
        snprintf(a->host, sizeof(a->host), "(srun)");
        break;
    }
    run_strv_t argv = {0};
    build_agent_argv(c, a, &argv);
    char *spec = run_spec_encode(c->plan, g->first, g->count);
    bool by_env = g->kind == RUN_AGENT_MPI || g->kind == RUN_AGENT_SLURM;
    run_strv_t env = {0};
    if (by_env) {
        for (char **e = environ; *e; e++) {
            run_strv_add(&env, *e);
        }
        run_strv_setenv(&env, "DSHIM_RUN_SPEC", "%s", spec);
    }
    run_spawn_t s = {.argv = run_strv_terminated(&argv), .envp = by_env ? run_strv_terminated(&env) : NULL,
                     .cwd = NULL, .stdin_pipe = !by_env, .own_pgrp = true, .pdeathsig = SIGTERM};
    char err[600];
    int rc = run_child_spawn(&s, &a->ch, err, sizeof(err));
    run_strv_free(&argv);
    run_strv_free(&env);
    if (a->ch.pid > 0) {
        a->out_open = a->err_open = true;
        fcntl(a->ch.out_fd, F_SETFL, O_NONBLOCK);
        fcntl(a->ch.err_fd, F_SETFL, O_NONBLOCK);
    } else {
        a->reaped = true;
    }
    if (rc != 0) {
        free(spec);
        fail(c, a, RUN_EXIT_USAGE, "cannot start %s: %s", a->desc, err);
        return -1;
    }
    if (!by_env) {
        /* the description, then the lifeline stays open */
        size_t len = strlen(spec);
        spec[len] = '\n';
        (void)run_write_all(a->ch.in_fd, spec, len + 1);
    }
    free(spec);
    return 0;
}

#define PEER_ABORT_KEY "dshim-run/abort"

/* torchrun-style multi-node (one dshim-run per node): the launchers share
 * node 0's store, so that a failure on any node stops every node, as the
 * single-controller launchers do, instead of leaving the others to hang. */
static void poll_peer_launchers(ctl_t *c)
{
    if (!c->plan->per_node || dshim_now() < c->peers_next) {
        return;
    }
    c->peers_next = dshim_now() + 0.5;
    if (c->peers == NULL &&
        dshim_store_connect(c->plan->store_addr, c->plan->store_port, c->plan->token, 0.2, &c->peers) != DSHIM_OK) {
        c->peers = NULL;
        return;  /* node 0's launcher not up yet (or gone): try again later */
    }
    if (c->failed && !c->peers_told) {
        char msg[1200];
        int n = snprintf(msg, sizeof(msg), "%d|node %d: %s", c->exit_code, c->plan->node_rank, c->reason);
        dshim_store_set(c->peers, PEER_ABORT_KEY, msg, (size_t)n);
        c->peers_told = true;
        return;
    }
    if (c->stopping) {
        return;
    }
    void *val = NULL;
    size_t len = 0;
    dshim_status_t st = dshim_store_try_get(c->peers, PEER_ABORT_KEY, &val, &len);
    if (st == DSHIM_OK) {
        char *text = strndup(val, len);
        free(val);
        char *bar = strchr(text, '|');
        int code = atoi(text);
        c->peers_told = true;  /* no need to echo it back */
        fail(c, NULL, code ? code : 1, "the job failed on another node (%s)", bar ? bar + 1 : text);
        free(text);
    } else if (st != DSHIM_INPROGRESS) {
        dshim_store_close(c->peers);  /* node 0's launcher gone: its ranks fail through dshim */
        c->peers = NULL;
    }
}

static int run_loop(ctl_t *c)
{
    for (;;) {
        reap_agents(c);
        poll_peer_launchers(c);
        int open_fds = 0;
        bool all_reaped = true;
        for (int i = 0; i < c->nagents; i++) {
            all_reaped &= c->agents[i].reaped;
            open_fds += c->agents[i].out_open + c->agents[i].err_open;
        }
        if (all_reaped) {
            break;
        }
        if (c->stopping && !c->killed && dshim_now() >= c->kill_at) {
            c->killed = true;
            for (int i = 0; i < c->nagents; i++) {
                if (!c->agents[i].reaped) {
                    kill(-c->agents[i].ch.pid, SIGKILL);
                }
            }
        }
        struct pollfd pfd[1 + 2 * 4096];
        agent_t *owner[1 + 2 * 4096];
        bool is_err[1 + 2 * 4096];
        int np = 0;
        pfd[np++] = (struct pollfd){.fd = sig_pipe[0], .events = POLLIN};
        for (int i = 0; i < c->nagents && np + 2 < (int)(sizeof(pfd) / sizeof(pfd[0])); i++) {
            agent_t *a = &c->agents[i];
            if (a->out_open) {
                owner[np] = a;
                is_err[np] = false;
                pfd[np++] = (struct pollfd){.fd = a->ch.out_fd, .events = POLLIN};
            }
            if (a->err_open) {
                owner[np] = a;
                is_err[np] = true;
                pfd[np++] = (struct pollfd){.fd = a->ch.err_fd, .events = POLLIN};
            }
        }
        int timeout = (c->stopping || c->plan->per_node) ? 100 : 1000;
        int r = poll(pfd, (nfds_t)np, timeout);
        if (r < 0 && errno != EINTR) {
            break;
        }
        if (r <= 0) {
            continue;
        }
        if (pfd[0].revents) {
            unsigned char b[64];
            ssize_t got = read(sig_pipe[0], b, sizeof(b));
            for (ssize_t k = 0; k < got; k++) {
                if (b[k] == SIGCHLD) {
                    continue;
                }
                if (!c->stopping) {
                    c->have_reason = true;
                    c->exit_code = 128 + b[k];
                    c->failed = false;
                    int live = live_procs(c);
                    run_say("received SIG%s; stopping the job (%d process%s running)", signame(b[k]), live,
                            live == 1 ? "" : "es");
                    begin_stop(c, NULL);
                } else if (!c->killed) {
                    run_say("received SIG%s again; killing the job now", signame(b[k]));
                    c->kill_at = 0;
                }
            }
        }
        for (int k = 1; k < np; k++) {
            if (pfd[k].revents) {
                pump_agent(c, owner[k], is_err[k], false);
            }
        }
        (void)open_fds;
    }
    return 0;
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

/* Whatever outlived its agent here (mpirun's ranks after a forced kill) is
 * our descendant — we are a subreaper — and goes now; and the per-rank
 * torch error directories of this attempt go with it. */
static void sweep_local_leftovers(void)
{
    for (int i = 0; i < 50 && run_signal_descendants(getpid(), SIGKILL) > 0; i++) {
        usleep(20000);
        while (waitpid(-1, NULL, WNOHANG) > 0) {
        }
    }
    char dir[64];
    snprintf(dir, sizeof(dir), "/tmp/dshim-run-%d", (int)getpid());
    nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

int run_controller(const run_opts_t *o, run_plan_t *plan, bool *failed)
{
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    ctl_t c = {.o = o, .plan = plan};
    c.ps = run_xmalloc((size_t)plan->nprocs * sizeof(*c.ps));
    c.agents = run_xmalloc((size_t)plan->ngroups * sizeof(*c.agents));
    c.nagents = plan->ngroups;
    for (int i = 0; i < plan->nprocs; i++) {
        snprintf(c.ps[i].host, sizeof(c.ps[i].host), "?");
    }
    if (sig_pipe[0] < 0 && pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
        run_usage_error("pipe: %s", strerror(errno));
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGCHLD, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    dshim_store_server_t *store = NULL;
    if (plan->host_store) {
        int port = 0;
        if (dshim_store_server_start(plan->store_bind, plan->store_port, plan->token, &store, &port) != DSHIM_OK) {
            run_usage_error("cannot host the rendezvous store on port %d: %s", plan->store_port, dshim_last_error());
        }
    }
    c.out = run_output_open(o, plan, plan->attempt);
    for (int i = 0; i < c.nagents; i++) {
        c.agents[i].g = &plan->groups[i];
        c.agents[i].ch.in_fd = c.agents[i].ch.out_fd = c.agents[i].ch.err_fd = -1;
    }
    for (int i = 0; i < c.nagents && !c.stopping; i++) {
        start_agent(&c, &c.agents[i]);
    }
    run_loop(&c);
    sweep_local_leftovers();
    if (c.peers) {
        c.peers_next = 0;
        poll_peer_launchers(&c);  /* a failure found at the very end still reaches the others */
        dshim_store_close(c.peers);
    }
    run_output_close(c.out);
    if (store && plan->per_node && c.failed) {
        usleep(1200 * 1000);  /* the other nodes poll every 0.5 s: let them read why before the store goes */
    }
    if (store) {
        dshim_store_server_stop(store);
    }
    if (c.mpi_hostfile) {
        unlink(c.mpi_hostfile);
        free(c.mpi_hostfile);
    }
    if (!c.have_reason) {
        /* every process ended well; an agent that failed on its own is still a failure */
        for (int i = 0; i < c.nagents; i++) {
            agent_t *a = &c.agents[i];
            int code = WIFEXITED(a->status) ? WEXITSTATUS(a->status) : 128 + WTERMSIG(a->status);
            if (code != 0 && !c.have_reason) {
                c.have_reason = true;
                c.exit_code = code;
                c.failed = true;
                run_say("%s exited with code %d (%s)", a->desc, code, a->last_err[0] ? a->last_err : "no message");
            }
        }
    } else if (c.failed) {
        run_say("job failed with exit code %d", c.exit_code);
    }
    for (int i = 0; i < c.nagents; i++) {
        run_linebuf_free(&c.agents[i].out);
        run_linebuf_free(&c.agents[i].err);
    }
    free(c.agents);
    for (int i = 0; i < plan->nprocs; i++) {
        free(c.ps[i].reason);
    }
    free(c.ps);
    *failed = c.failed;
    return c.exit_code;
}

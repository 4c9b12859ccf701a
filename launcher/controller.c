/*
 * The controller: starts one agent per host (directly or over ssh) or one
 * mpirun/srun whose agents each run one rank, relays their frames to the
 * output, and stops the whole job — every host — when a process fails, a
 * host is lost, or the user interrupts.  One attempt per call; restarts are
 * main's business.
 */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ftw.h>
#include <limits.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "child.h"
#include "collect.h"
#include "config.h"
#include "frame.h"
#include "log.h"
#include "net.h"
#include "output.h"
#include "private_fs.h"
#include "pump.h"
#include "signals.h"
#include "spec.h"
#include "stop.h"
#include "store.h"
#include "timeline.h"

extern char **environ;

typedef struct ctl ctl_t;

typedef struct {
    ctl_t *c;
    const run_group_t *g;
    run_child_t ch;   /* its pid, and in_fd: the lifeline (local, ssh) */
    run_pipes_t pipes;
    char desc[200];   /* "ssh to node2", "mpirun", "agent on this host" */
    char host[128];   /* host named in messages */
    bool reaped;
    int status;
    bool hello;
    char last_err[400];
} agent_t;

typedef struct {
    bool started, ended;
    long code, sig;
    long pid;
    char host[128];
    char *reason;  /* the exception torch recorded, if any */
} pstate_t;

struct ctl {
    const run_opts_t *o;
    run_plan_t *plan;
    agent_t *agents;
    int nagents;
    pstate_t *ps;
    run_output_t *out;
    run_stop_t stop;
    bool have_reason;
    int exit_code;
    bool failed;
    char reason[1024];        /* the first failure, as reported */
    char *mpi_hostfile;
    dshim_store_t *peers;     /* per-node mode: the store shared with the other nodes' dshim-run */
    double peers_next;
    bool peers_told;
    run_timeline_t *tl;       /* --timeline */
    /* flight-recorder dumps (collect.h): after the first failure the stop
     * waits for them (bounded); --status and SIGUSR1 ask for them too */
    run_collect_t *col;
    bool stop_deferred;       /* begin_stop(stop_origin) once the dumps are in */
    const agent_t *stop_origin;
    int first_fail_idx;       /* the process whose failure stops the job; -1 none */
    int status_fd;            /* listening socket of --status; -1 none */
    int *clients;             /* --status connections awaiting the answer */
    int nclients;
    bool status_to_stderr;    /* SIGUSR1 asked: the answer goes to our stderr */
};

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
    /* agents get the grace period for SIGTERM -> SIGKILL, we add a margin
     * before killing the agents (and so, through their lifelines, everything) */
    if (!run_stop_begin(&c->stop, c->plan->grace_s + 2.0)) {
        return;
    }
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

static void answer_clients(ctl_t *c, const char *text)
{
    for (int i = 0; i < c->nclients; i++) {
        (void)run_write_all(c->clients[i], text, strlen(text));
        close(c->clients[i]);
    }
    c->nclients = 0;
}

/* Asks every agent with a lifeline for its processes' dumps (collect.h).
 * A failure replaces a --status request in progress. */
static bool collect(ctl_t *c, int mode)
{
    if (!run_collect_enabled(c->col) || c->stop.stopping) {
        return false;
    }
    if (run_collect_active(c->col) && run_collect_mode(c->col) == RUN_COLLECT_REQUEST) {
        answer_clients(c, "dshim-run: the job failed while its status was being collected; see its output\n");
        c->status_to_stderr = false;
    }
    int *fds = run_xmalloc((size_t)c->nagents * sizeof(int));
    for (int i = 0; i < c->nagents; i++) {
        const agent_t *a = &c->agents[i];
        fds[i] = a->hello && !a->reaped ? a->ch.in_fd : -1;
    }
    bool started = run_collect_start(c->col, mode, fds);
    free(fds);
    return started;
}

/* What the launcher knows of each process, for the diagnosis. */
static dshim_trace_proc_t *procs_for_trace(const ctl_t *c)
{
    dshim_trace_proc_t *tp = run_xmalloc((size_t)(c->plan->nprocs > 0 ? c->plan->nprocs : 1) * sizeof(*tp));
    for (int i = 0; i < c->plan->nprocs; i++) {
        const pstate_t *p = &c->ps[i];
        dshim_trace_proc_t *t = &tp[i];
        int r = -1;
        t->rank = sscanf(c->plan->procs[i].name, "rank %d", &r) == 1 ? r : -1;
        snprintf(t->name, sizeof(t->name), "%s", c->plan->procs[i].name);
        snprintf(t->host, sizeof(t->host), "%.63s", p->host);
        t->pid = p->started ? p->pid : 0;
        t->state = !p->started ? DSHIM_TRACE_PROC_UNKNOWN : !p->ended ? DSHIM_TRACE_PROC_RUNNING :
                   p->sig ? DSHIM_TRACE_PROC_KILLED : DSHIM_TRACE_PROC_EXITED;
        t->code = (int)p->code;
        t->sig = (int)p->sig;
        t->first_failure = i == c->first_fail_idx;
    }
    return tp;
}

/* The dumps are in (or the wait is over): the diagnosis, or the status. */
static void finish_collection(ctl_t *c)
{
    int mode = run_collect_mode(c->col);
    dshim_trace_proc_t *tp = procs_for_trace(c);
    const char *dir = NULL;
    char *text = run_collect_finish(c->col, tp, c->plan->nprocs, &dir);
    free(tp);
    if (mode == RUN_COLLECT_FAILURE) {
        if (text && text[0]) {
            run_say("diagnosis from the flight recorder (dumps in %s; dshim-run --diagnose DIR shows more):", dir);
            for (char *line = text, *nl; *line; line = nl + 1) {
                nl = strchr(line, '\n');
                if (nl == NULL) {
                    run_say("  %s", line);
                    break;
                }
                *nl = '\0';
                run_say("  %s", line);
            }
        }
        free(text);
        if (c->stop_deferred) {
            c->stop_deferred = false;
            begin_stop(c, c->stop_origin);
        }
        return;
    }
    char head[PATH_MAX + 200];
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    char when[32];
    strftime(when, sizeof(when), "%H:%M:%S", &tm);
    snprintf(head, sizeof(head), "dshim-run %d at %s: %d process(es), %d running; dumps in %s\n", (int)getpid(),
             when, c->plan->nprocs, live_procs(c), dir);
    if (c->status_to_stderr) {
        run_say("status at %s (dumps in %s):", when, dir);
        for (char *line = text, *nl; text && *line; line = nl + 1) {
            nl = strchr(line, '\n');
            if (nl) {
                *nl = '\0';
            }
            run_say("  %s", line);
            if (nl == NULL) {
                break;
            }
        }
        c->status_to_stderr = false;
    }
    for (int i = 0; i < c->nclients; i++) {
        (void)run_write_all(c->clients[i], head, strlen(head));
    }
    answer_clients(c, text ? text : "");
    free(text);
}

/* --status connected, or SIGUSR1: a collection of reason "request". */
static void status_request(ctl_t *c, int client)
{
    const char *refusal = NULL;
    if (c->stop.stopping || (run_collect_active(c->col) && run_collect_mode(c->col) == RUN_COLLECT_FAILURE)) {
        refusal = "dshim-run: the job is stopping after a failure; see its output\n";
    } else if (!run_collect_enabled(c->col)) {
        refusal = "dshim-run: this job has no flight recorder to ask (--no-preload, or DSHIM_TRACE_BUFFER=0)\n";
    } else if (!run_collect_active(c->col) && !collect(c, RUN_COLLECT_REQUEST)) {
        refusal = "dshim-run: no agent of this job can be asked (not started yet, or started by mpirun/srun)\n";
    }
    if (refusal) {
        if (client >= 0) {
            (void)run_write_all(client, refusal, strlen(refusal));
            close(client);
        } else {
            fputs(refusal, stderr);
        }
        return;
    }
    if (client < 0) {
        c->status_to_stderr = true;
        return;
    }
    int *cl = realloc(c->clients, (size_t)(c->nclients + 1) * sizeof(int));
    if (cl == NULL) {
        close(client);
        return;
    }
    c->clients = cl;
    c->clients[c->nclients++] = client;
}

static void accept_status(ctl_t *c)
{
    int fd = accept4(c->status_fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) {
        return;
    }
    /* the answer is written with blocking writes (a client reads until we
     * close); one that does not read must not hold the job's controller */
    struct timeval tv = {.tv_sec = 2};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    /* only "status" asks (`--status` writes it at once); a connection that
     * says nothing is `--status` checking that we are alive */
    struct timeval rtv = {.tv_usec = 200000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &rtv, sizeof(rtv));
    char req[16];
    ssize_t n = read(fd, req, sizeof(req));
    if (n < 6 || memcmp(req, "status", 6) != 0) {
        close(fd);
        return;
    }
    status_request(c, fd);
}

/* The first failure decides the exit code and the message. */
static void fail(ctl_t *c, const agent_t *origin, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void fail(ctl_t *c, const agent_t *origin, int code, const char *fmt, ...)
{
    if (c->have_reason || c->stop.stopping) {
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
    if (live > 0 && collect(c, RUN_COLLECT_FAILURE)) {
        /* the others' flight-recorder dumps first: they say where each rank
         * is, and stopping would change it (bounded: RUN_COLLECT_WAIT_S) */
        c->stop_deferred = true;
        c->stop_origin = origin;
        return;
    }
    begin_stop(c, origin);
}

static bool idx_ok(const agent_t *a, int idx)
{
    return idx >= a->g->first && idx < a->g->first + a->g->count;
}

/* A line that is not a frame of this agent: ssh, mpirun or srun speaking (or an agent's own diagnostics). */
static void on_foreign_line(ctl_t *c, agent_t *a, bool err, const char *line, size_t len)
{
    if (err) {
        snprintf(a->last_err, sizeof(a->last_err), "%.*s", (int)len, line);
    }
    if (c->stop.stopping && a->ch.in_fd < 0 && a->g->kind >= RUN_AGENT_MPI) {
        return;  /* mpirun's / srun's account of the abort we already reported */
    }
    if (err && !a->hello && a->g->kind == RUN_AGENT_SSH) {
        return;  /* ssh's complaint; the "cannot reach host" line quotes it */
    }
    fprintf(err ? stderr : stdout, "[%s] %.*s\n", a->desc, (int)len, line);
    fflush(err ? stderr : stdout);
}

/* "X": a failed process fails the job, with torch's account of why when there is one. */
static void on_proc_exit(ctl_t *c, agent_t *a, const run_frame_t *f)
{
    pstate_t *p = &c->ps[f->idx];
    p->ended = true;
    p->started = true;
    p->code = f->a;
    p->sig = f->b;
    run_exit_t e = {.code = f->a, .sig = f->b};
    if (run_exit_code(e) == 0) {
        return;
    }
    if (!c->stop.stopping && !c->have_reason) {
        run_output_show_tail(c->out, f->idx);  /* the failure, not the ones we stop */
        c->first_fail_idx = f->idx;
    }
    const char *name = c->plan->procs[f->idx].name;
    const char *sep = p->reason ? ": " : "";
    const char *why = p->reason ? p->reason : "";
    if (e.sig != 0) {
        fail(c, a, run_exit_code(e), "%s on host %s (pid %ld) was killed by signal %ld (SIG%s)%s%s", name, p->host,
             p->pid, e.sig, signame(e.sig), sep, why);
    } else {
        fail(c, a, run_exit_code(e), "%s on host %s (pid %ld) exited with code %ld%s%s", name, p->host, p->pid,
             e.code, sep, why);
    }
}

static void on_agent_line(void *owner, bool err, const char *line, size_t len)
{
    agent_t *a = owner;
    ctl_t *c = a->c;
    run_frame_t f;
    if (err || run_frame_parse(line, len, &f) != 0 || (f.kind != 'H' && f.idx != -1 && !idx_ok(a, f.idx))) {
        on_foreign_line(c, a, err, line, len);
        return;
    }
    if (run_timeline_frame(c->tl, (int)(a - c->agents), &f)) {
        return;
    }
    if (run_collect_frame(c->col, (int)(a - c->agents), &f)) {
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
    case 'X':
        on_proc_exit(c, a, &f);
        break;
    default:
        break;
    }
}

static void agent_gone(ctl_t *c, agent_t *a)
{
    run_pipes_drain(&a->pipes);
    int code = run_exit_code(run_exit_of(a->status));
    int unfinished = 0;
    for (int i = a->g->first; i < a->g->first + a->g->count; i++) {
        if (!c->ps[i].ended) {
            unfinished++;
            c->ps[i].ended = true;
        }
    }
    if (c->stop.stopping) {
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

static void on_exit_status(void *ctx, pid_t pid, int status)
{
    ctl_t *c = ctx;
    for (int i = 0; i < c->nagents; i++) {
        agent_t *a = &c->agents[i];
        if (!a->reaped && a->ch.pid == pid) {
            a->reaped = true;
            a->status = status;
            run_collect_agent_gone(c->col, i);
            if (a->ch.in_fd >= 0) {
                close(a->ch.in_fd);
                a->ch.in_fd = -1;
            }
            agent_gone(c, a);
        }
    }
}

static char *write_mpi_hostfile(const run_opts_t *o, const run_plan_t *plan, const run_group_t *g)
{
    char *path = NULL;
    /* in the private job directory (jobdir.h), never at a name in /tmp
     * that another user could have made first */
    if (asprintf(&path, "%s/mpi-hosts", plan->jobdir) < 0) {
        return NULL;
    }
    int fd = dshim_private_open(path, DSHIM_OPEN_TRUNC);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (f == NULL) {
        run_usage_error("cannot write %s for mpirun: %s", path, dshim_private_why(errno));
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
            c->mpi_hostfile = write_mpi_hostfile(c->o, c->plan, g);
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
        run_pipes_attach(&a->pipes, a->ch.out_fd, a->ch.err_fd, on_agent_line, a);
        a->ch.out_fd = a->ch.err_fd = -1;  /* the pipes' now */
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
    if (c->peers == NULL) {
        dshim_status_t st = dshim_store_connect(c->plan->store_addr, c->plan->store_port, c->plan->token, 0.2,
                                                &c->peers);
        if (st == DSHIM_ERR_PROTOCOL) {
            /* node 0's store answered and refused us (another job token): this
             * node's ranks would be refused alike; say so instead of hanging */
            c->peers = NULL;
            fail(c, NULL, RUN_EXIT_USAGE, "%s (every node's dshim-run must have the same DSHIM_JOB_TOKEN or "
                 "DSHIM_JOB_TOKEN_FILE secret)", dshim_last_error());
            return;
        }
        if (st != DSHIM_OK) {
            c->peers = NULL;
            return;  /* node 0's launcher not up yet (or gone): try again later */
        }
    }
    if (c->failed && !c->peers_told) {
        char msg[1200];
        int n = snprintf(msg, sizeof(msg), "%d|node %d: %s", c->exit_code, c->plan->node_rank, c->reason);
        dshim_store_set(c->peers, PEER_ABORT_KEY, msg, (size_t)n);
        c->peers_told = true;
        return;
    }
    if (c->stop.stopping) {
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

/* SIGINT, SIGTERM, SIGHUP: stop the job; the same again while stopping: kill it now. */
static void on_signals(ctl_t *c)
{
    int sigs[64];
    int n = run_signals_take(sigs, 64);
    for (int k = 0; k < n; k++) {
        if (sigs[k] == SIGUSR1) {
            status_request(c, -1);  /* the status on our stderr; the job goes on */
            continue;
        }
        if (c->stop_deferred) {
            /* interrupted while the dumps of a failure come in: stop now, with what came */
            finish_collection(c);
            continue;
        }
        if (!c->stop.stopping) {
            c->have_reason = true;
            c->exit_code = 128 + sigs[k];
            c->failed = false;
            int live = live_procs(c);
            run_say("received SIG%s; stopping the job (%d process%s running)", signame(sigs[k]), live,
                    live == 1 ? "" : "es");
            begin_stop(c, NULL);
        } else if (!c->stop.killed) {
            run_say("received SIG%s again; killing the job now", signame(sigs[k]));
            run_stop_hurry(&c->stop);
        }
    }
}

static bool all_agents_reaped(const ctl_t *c)
{
    for (int i = 0; i < c->nagents; i++) {
        if (!c->agents[i].reaped) {
            return false;
        }
    }
    return true;
}

/* The agents' process groups; what the agents leave behind dies with their lifelines. */
static void kill_agents(ctl_t *c)
{
    for (int i = 0; i < c->nagents; i++) {
        if (!c->agents[i].reaped) {
            kill(-c->agents[i].ch.pid, SIGKILL);
        }
    }
}

/* Relays the agents' frames until every agent has ended. */
static void run_loop(ctl_t *c)
{
    run_pollset_t ps = {0};
    for (;;) {
        run_reap_each(on_exit_status, c);
        poll_peer_launchers(c);
        if (all_agents_reaped(c)) {
            break;
        }
        if (run_stop_kill_due(&c->stop)) {
            kill_agents(c);
        }
        run_pollset_clear(&ps);
        int sig_entry = run_pollset_add_fd(&ps, run_signals_fd());
        for (int i = 0; i < c->nagents; i++) {
            run_pollset_add_pipes(&ps, &c->agents[i].pipes);
            agent_t *a = &c->agents[i];
            run_timeline_poll(c->tl, i, a->hello && !a->reaped && !c->stop.stopping ? a->ch.in_fd : -1, a->host);
        }
        int status_entry = c->status_fd >= 0 ? run_pollset_add_fd(&ps, c->status_fd) : -1;
        /* per-node mode also looks at the other nodes' launchers (poll_peer_launchers) */
        int idle_ms = run_collect_wait_ms(c->col, c->plan->per_node ? 100 : 1000);
        if (run_pollset_wait(&ps, run_stop_wait_ms(&c->stop, idle_ms, 100)) < 0) {
            break;
        }
        if (run_pollset_ready(&ps, sig_entry)) {
            on_signals(c);
        }
        run_pollset_read_pipes(&ps);
        if (run_pollset_ready(&ps, status_entry)) {
            accept_status(c);
        }
        if (run_collect_complete(c->col)) {
            finish_collection(c);
        } else if (run_collect_overdue(c->col)) {
            if (c->stop_deferred) {
                /* the stop waits no longer; late dumps still make the diagnosis */
                c->stop_deferred = false;
                begin_stop(c, c->stop_origin);
            } else if (run_collect_mode(c->col) == RUN_COLLECT_REQUEST) {
                finish_collection(c);
            }
        }
    }
    run_pollset_free(&ps);
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
static void sweep_local_leftovers(const run_plan_t *plan)
{
    run_sweep_descendants();
    if (plan->jobdir) {
        nftw(plan->jobdir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    }
}

/* Every process ended well; an agent that failed on its own is still a failure. */
static void judge_agents(ctl_t *c)
{
    for (int i = 0; i < c->nagents && !c->have_reason; i++) {
        agent_t *a = &c->agents[i];
        int code = run_exit_code(run_exit_of(a->status));
        if (code != 0) {
            c->have_reason = true;
            c->exit_code = code;
            c->failed = true;
            run_say("%s exited with code %d (%s)", a->desc, code, a->last_err[0] ? a->last_err : "no message");
        }
    }
}

static void ctl_free(ctl_t *c)
{
    for (int i = 0; i < c->nagents; i++) {
        run_pipes_free(&c->agents[i].pipes);
    }
    free(c->agents);
    for (int i = 0; i < c->plan->nprocs; i++) {
        free(c->ps[i].reason);
    }
    free(c->ps);
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
    if (run_signals_catch() != 0) {
        run_usage_error("pipe: %s", strerror(errno));
    }

    /* per-node runs: node 0's store is already up (the nodes' rendezvous, node_rdzv.c) */
    dshim_store_server_t *store = plan->store_server;
    plan->store_server = NULL;
    if (plan->host_store && store == NULL) {
        int port = 0;
        if (dshim_store_server_start(plan->store_bind, plan->store_port, plan->token, &store, &port) != DSHIM_OK) {
            run_usage_error("cannot host the rendezvous store on port %d: %s", plan->store_port, dshim_last_error());
        }
    }
    c.out = run_output_open(o, plan, plan->attempt);
    c.tl = run_timeline_new(o->timeline, c.nagents);
    c.col = run_collect_new(o, plan, c.nagents);
    c.first_fail_idx = -1;
    c.status_fd = run_collect_enabled(c.col) ? run_status_listen() : -1;
    run_signals_catch_also(SIGUSR1);
    for (int i = 0; i < c.nagents; i++) {
        c.agents[i].c = &c;
        c.agents[i].g = &plan->groups[i];
        c.agents[i].ch.in_fd = c.agents[i].ch.out_fd = c.agents[i].ch.err_fd = -1;
        run_pipes_init(&c.agents[i].pipes);
    }
    for (int i = 0; i < c.nagents && !c.stop.stopping; i++) {
        start_agent(&c, &c.agents[i]);
    }
    run_loop(&c);
    if (run_collect_active(c.col)) {
        finish_collection(&c);  /* every agent ended before the wait did */
    }
    answer_clients(&c, "dshim-run: the job ended\n");
    free(c.clients);
    run_status_unlisten(c.status_fd);
    run_collect_free(c.col);
    run_timeline_fetch(c.tl, plan);
    run_timeline_write(c.tl, plan);
    run_timeline_free(c.tl);
    sweep_local_leftovers(plan);
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
        judge_agents(&c);
    } else if (c.failed) {
        run_say("job failed with exit code %d", c.exit_code);
    }
    ctl_free(&c);
    *failed = c.failed;
    return c.exit_code;
}

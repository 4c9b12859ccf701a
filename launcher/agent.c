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
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "child.h"
#include "collect.h"
#include "errfile.h"
#include "jobdir.h"
#include "config.h"
#include "frame.h"
#include "log.h"
#include "net.h"
#include "pump.h"
#include "signals.h"
#include "spec.h"
#include "stop.h"
#include "timeline.h"

extern char **environ;

typedef struct {
    run_spec_proc_t *sp;
    pid_t pid;
    bool running;
    run_pipes_t pipes;
} aproc_t;

typedef struct {
    run_spec_t spec;
    aproc_t *procs;
    int n;
    bool watch_stdin;  /* the lifeline (--agent): "K" or its end stops everything */
    run_stop_t stop;
    int first_bad;     /* exit code of the first process that failed; the agent's own */
} agent_t;

static void fail_agent(const char *msg)
{
    run_frame_write(1, 'F', -1, 0, 0, msg, strlen(msg));
}

static void on_proc_line(void *owner, bool err, const char *line, size_t len)
{
    aproc_t *p = owner;
    run_frame_write(1, err ? 'E' : 'O', p->sp->index, 0, 0, line, len);
}

/* Under srun several "nodes" may share a hostname; Slurm's node name is what users know. */
static const char *agent_host_name(void)
{
    const char *n = dshim_config()->slurmd_nodename;
    return (n && n[0]) ? n : dshim_log_hostname();
}

/* The common environment applies to this agent too, so that PATH lookups
 * of the program see the controller's PATH. */
static void adopt_common_env(const run_spec_t *spec)
{
    for (int i = 0; i < spec->env.n; i++) {
        const char *kv = spec->env.v[i];
        const char *eq = strchr(kv, '=');
        if (eq) {
            char *key = strndup(kv, (size_t)(eq - kv));
            setenv(key, eq + 1, 1);
            free(key);
        }
    }
}

/* Starts one process; 0, or -1 after telling the controller why not. */
static int spawn_one(const run_spec_t *spec, aproc_t *p)
{
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
    run_child_t ch = {.pid = -1, .in_fd = -1, .out_fd = -1, .err_fd = -1};
    char err[512];
    int rc = run_child_spawn(&s, &ch, err, sizeof(err));
    run_strv_free(&env);
    if (ch.pid > 0) {
        /* also when exec failed: the child exits 127 and is reaped like any other */
        p->pid = ch.pid;
        p->running = true;
        run_pipes_attach(&p->pipes, ch.out_fd, ch.err_fd, on_proc_line, p);
    }
    if (rc != 0) {
        char msg[700];
        snprintf(msg, sizeof(msg), "%s (on host %s)", err, agent_host_name());
        run_frame_write(1, 'F', p->sp->index, 0, 0, msg, strlen(msg));
        return -1;
    }
    const char *host = agent_host_name();
    run_frame_write(1, 'S', p->sp->index, p->pid, 0, host, strlen(host));
    return 0;
}

/* Returns how many could not be started. */
static int spawn_all(agent_t *ag)
{
    adopt_common_env(&ag->spec);
    int failures = 0;
    for (int i = 0; i < ag->n; i++) {
        failures += spawn_one(&ag->spec, &ag->procs[i]) != 0;
    }
    return failures;
}

static void signal_all(agent_t *ag, int sig)
{
    for (int i = 0; i < ag->n; i++) {
        if (ag->procs[i].running) {
            kill(-ag->procs[i].pid, sig);
        }
    }
    run_signal_descendants(getpid(), sig);
}

static void begin_stop(agent_t *ag)
{
    if (run_stop_begin(&ag->stop, ag->spec.grace_s)) {
        signal_all(ag, SIGTERM);
        /* a stopped process (SIGSTOP, a debugger's ^Z) acts on SIGTERM only once
         * continued; without this it waited the whole grace period for SIGKILL */
        signal_all(ag, SIGCONT);
    }
}

/* One process ended: its last output, why (torch's error file), then its "X". */
static void on_exit_status(void *ctx, pid_t pid, int status)
{
    agent_t *ag = ctx;
    for (int i = 0; i < ag->n; i++) {
        aproc_t *p = &ag->procs[i];
        if (!p->running || p->pid != pid) {
            continue;
        }
        p->running = false;
        run_pipes_drain(&p->pipes);
        run_exit_t e = run_exit_of(status);
        char *why = run_errfile_take(run_errfile_path(&p->sp->env));
        if (why && run_exit_code(e) != 0) {
            run_frame_write(1, 'R', p->sp->index, 0, 0, why, strlen(why));
        }
        free(why);
        run_timeline_agent_send(p->sp->index, &p->sp->env, &ag->spec.env);  /* --timeline: its file, before its X */
        run_frame_write(1, 'X', p->sp->index, e.code, e.sig, NULL, 0);
        if (run_exit_code(e) != 0 && ag->first_bad == 0) {
            ag->first_bad = run_exit_code(e);
        }
    }
    /* other pids: orphans this subreaper inherited; reaped, nothing to say */
}

/* Reaps what ended; returns how many processes still run. */
static int reap(agent_t *ag)
{
    run_reap_each(on_exit_status, ag);
    int live = 0;
    for (int i = 0; i < ag->n; i++) {
        live += ag->procs[i].running;
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

/* The job description: from stdin (the lifeline, whose first bytes after it
 * may already say "K") or DSHIM_RUN_SPEC.  0, 1 (controller gone before it
 * said anything) or RUN_EXIT_USAGE (told the controller why). */
static int receive_spec(agent_t *ag, bool rank_mode, bool *told_to_stop)
{
    char leftover[64];
    size_t leftover_len = 0;
    char *text = NULL;
    if (rank_mode) {
        text = run_xstrdup(dshim_config()->run_spec);
    } else {
        text = read_spec_line(leftover, &leftover_len);
        if (text == NULL) {
            return 1;
        }
    }
    *told_to_stop = leftover_len && memchr(leftover, 'K', leftover_len);
    char hostbuf[256];
    snprintf(hostbuf, sizeof(hostbuf), "%s", dshim_log_hostname());
    run_frame_write(1, 'H', 0, getpid(), 0, hostbuf, strlen(hostbuf));
    char err[256];
    int rc = run_spec_decode(text, &ag->spec, err, sizeof(err));
    free(text);
    if (rc == 0 && run_jobdir_claim(&ag->spec, err, sizeof(err)) != 0) {
        run_spec_free(&ag->spec);
        rc = -1;
    }
    if (rc != 0) {
        fail_agent(err);
        return RUN_EXIT_USAGE;
    }
    int first = 0;
    ag->n = ag->spec.nprocs;
    if (rank_mode) {
        first = pick_rank_proc(&ag->spec);
        if (first < 0) {
            run_spec_free(&ag->spec);
            return RUN_EXIT_USAGE;
        }
        ag->n = 1;
    }
    ag->procs = run_xmalloc((size_t)ag->n * sizeof(*ag->procs));
    for (int i = 0; i < ag->n; i++) {
        ag->procs[i].sp = &ag->spec.procs[first + i];
        run_pipes_init(&ag->procs[i].pipes);
    }
    return 0;
}

/* The controller's lifeline became readable: "K", or the controller / ssh connection is gone. */
static void read_lifeline(agent_t *ag)
{
    char b[64];
    ssize_t got = read(0, b, sizeof(b));
    if (got <= 0 || memchr(b, 'K', (size_t)got)) {
        ag->watch_stdin = false;
        begin_stop(ag);
    } else {
        run_timeline_agent_input(b, (size_t)got);  /* clock pings of --timeline */
        run_collect_agent_input(b, (size_t)got);   /* requests for flight-recorder dumps (collect.h) */
    }
}

/* A collection of flight-recorder dumps (collect.h) in progress: its next step. */
static int poll_collection(agent_t *ag)
{
    run_collect_proc_t *view = run_xmalloc((size_t)(ag->n > 0 ? ag->n : 1) * sizeof(*view));
    for (int i = 0; i < ag->n; i++) {
        const char *rank = run_strv_getenv(&ag->procs[i].sp->env, "RANK");
        view[i] = (run_collect_proc_t){.idx = ag->procs[i].sp->index, .pid = ag->procs[i].pid,
                                       .rank = rank ? atoi(rank) : -1, .running = ag->procs[i].running};
    }
    int ms = run_collect_agent_poll(view, ag->n);
    free(view);
    return ms;
}

/* Relays output and exits until every process and everything they forked is gone. */
static void supervise(agent_t *ag)
{
    run_pollset_t ps = {0};
    int live = reap(ag);
    while (live > 0 || run_signal_descendants(getpid(), 0) > 0) {
        if (live == 0) {
            begin_stop(ag);  /* every process ended; what remains are things they forked */
        }
        run_pollset_clear(&ps);
        int sig_entry = run_pollset_add_fd(&ps, run_signals_fd());
        int stdin_entry = ag->watch_stdin ? run_pollset_add_fd(&ps, 0) : -1;
        for (int i = 0; i < ag->n; i++) {
            run_pollset_add_pipes(&ps, &ag->procs[i].pipes);
        }
        /* while stopping, descendants are found by polling /proc */
        int wait_ms = run_stop_wait_ms(&ag->stop, 500, 200);
        int collect_ms = poll_collection(ag);
        if (collect_ms >= 0 && collect_ms < wait_ms) {
            wait_ms = collect_ms;  /* a dump collection watches the dump files */
        }
        if (run_pollset_wait(&ps, wait_ms) < 0) {
            break;
        }
        int sigs[64];
        if (run_pollset_ready(&ps, sig_entry) && run_signals_take(sigs, 64) > 0) {
            begin_stop(ag);
        }
        if (run_pollset_ready(&ps, stdin_entry)) {
            read_lifeline(ag);
        }
        run_pollset_read_pipes(&ps);
        live = reap(ag);
        if (run_stop_kill_due(&ag->stop)) {
            signal_all(ag, SIGKILL);
        }
        if (ag->stop.killed && live == 0) {
            run_sweep_descendants();
            break;
        }
    }
    run_pollset_free(&ps);
}

/* Every process ended and one failed: the controller's request for their
 * dumps (collect.h) is on its way, or just passed the last reap.  Answers it
 * before this agent goes; a "K", the lifeline's end or RUN_COLLECT_LINGER_S
 * ends the wait. */
static void linger_for_request(agent_t *ag)
{
    double deadline = dshim_now() + RUN_COLLECT_LINGER_S;
    run_pollset_t ps = {0};
    while (ag->watch_stdin && run_collect_agent_awaits_request()) {
        int ms = poll_collection(ag);  /* a request that came: its answer (the processes ended: at once) */
        double left = deadline - dshim_now();
        if (!run_collect_agent_awaits_request() || left <= 0) {
            break;
        }
        int wait_ms = (int)(left * 1000) + 1;
        run_pollset_clear(&ps);
        int stdin_entry = run_pollset_add_fd(&ps, 0);
        if (run_pollset_wait(&ps, ms >= 0 && ms < wait_ms ? ms : wait_ms) < 0) {
            break;
        }
        if (run_pollset_ready(&ps, stdin_entry)) {
            read_lifeline(ag);
        }
    }
    run_pollset_free(&ps);
}

int run_agent_main(bool rank_mode)
{
    if (run_signals_catch() != 0) {
        return 1;
    }
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    if (rank_mode) {
        prctl(PR_SET_PDEATHSIG, SIGTERM);  /* orted / slurmstepd gone: stop */
    }
    agent_t ag = {.watch_stdin = !rank_mode};
    bool told_to_stop = false;
    int rc = receive_spec(&ag, rank_mode, &told_to_stop);
    if (rc != 0) {
        return rc;
    }
    run_collect_agent_init(ag.spec.trace_dir, ag.spec.trace_owned);
    ag.first_bad = spawn_all(&ag) ? 127 : 0;
    if (told_to_stop || ag.first_bad) {
        begin_stop(&ag);
    }
    supervise(&ag);
    if (ag.first_bad) {
        linger_for_request(&ag);
    }
    /* a request for dumps that came as the last processes ended is answered still */
    poll_collection(&ag);
    run_collect_agent_end();
    for (int i = 0; i < ag.n; i++) {
        run_pipes_free(&ag.procs[i].pipes);
    }
    free(ag.procs);
    run_spec_free(&ag.spec);
    return ag.first_bad;
}

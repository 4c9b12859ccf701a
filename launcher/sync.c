/*
 * --sync-dst-dir: copy the working directory to DIR on every host of the
 * hostfile before the job starts, with rsync, in parallel, and refuse to
 * start if any copy fails (the dmlc tracker ignores rsync's exit code, so a
 * job then runs stale code or none).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "child.h"
#include "config.h"
#include "net.h"
#include "pump.h"
#include "run.h"

#define SYNC_TIMEOUT_S 600.0

typedef struct {
    pid_t pid;
    run_pipes_t pipes;  /* stdout and stderr: rsync has been seen to exit 11 with nothing on stderr */
    const char *host;
    bool done;
    int status;
    char last_err[400];
    bool have_reason;
} sync_job_t;

/* rsync ends with a summary ("rsync error: error in file IO (code 11)...");
 * the line that says what went wrong comes first ("rsync: [Receiver] mkdir
 * ... failed: Not a directory"), so keep the first such line. */
static void keep_reason(void *owner, bool err, const char *line, size_t len)
{
    (void)err;
    sync_job_t *j = owner;
    bool summary = len >= 12 && strncmp(line, "rsync error:", 12) == 0;
    if (j->have_reason || (summary && j->last_err[0])) {
        return;
    }
    snprintf(j->last_err, sizeof(j->last_err), "%.*s", (int)len, line);
    j->have_reason = !summary;
}

/* What rsync's exit code means (rsync(1), EXIT VALUES), for a copy that
 * failed without saying why. */
static const char *rsync_code_meaning(int code)
{
    switch (code) {
    case 1: return "syntax or usage error";
    case 2: return "protocol incompatibility";
    case 3: return "errors selecting input/output files or dirs";
    case 5: return "error starting the client-server protocol";
    case 10: return "error in socket I/O";
    case 11: return "error in file I/O: the destination could not be created or written";
    case 12: return "error in the rsync protocol data stream";
    case 23: return "partial transfer due to error";
    case 30: return "timeout in data send/receive";
    case 35: return "timeout waiting for daemon connection";
    case 255: return "ssh failed: the host cannot be reached or refused the login";
    default: return "no message";
    }
}

/* The rsync command that copies src/ to dst/ on host h. */
static void rsync_argv(const run_host_t *h, const char *src, const char *dst, run_strv_t *argv)
{
    const dshim_config_t *cfg = dshim_config();
    run_split_words(cfg->run_rsync, argv);
    run_strv_add(argv, "-az");
    run_strv_add(argv, "--mkpath");
    if (!h->local) {
        /* ssh command and its options as one -e word; rsync splits it itself */
        char *e = NULL;
        if (h->port) {
            if (asprintf(&e, "%s -p %d", cfg->run_ssh, h->port) < 0) {
                exit(1);
            }
        } else {
            e = run_xstrdup(cfg->run_ssh);
        }
        run_strv_add(argv, "-e");
        run_strv_add(argv, e);
        free(e);
    }
    run_strv_addf(argv, "%s/", src);
    if (h->local) {
        run_strv_addf(argv, "%s/", dst);
    } else {
        /* "--" is not needed: host names were checked not to start with '-' */
        run_strv_addf(argv, "%s:%s/", h->name, dst);
    }
}

/* One rsync per distinct host, all at once; exits 2 when one cannot be started. */
static int start_all(const run_opts_t *o, const char *src, const char *dst, sync_job_t *jobs)
{
    int n = 0;
    for (int i = 0; i < o->nhosts; i++) {
        bool dup = false;
        for (int k = 0; k < i; k++) {
            dup |= strcmp(o->hosts[k].name, o->hosts[i].name) == 0 && o->hosts[k].port == o->hosts[i].port;
        }
        if (dup) {
            continue;
        }
        run_strv_t argv = {0};
        rsync_argv(&o->hosts[i], src, dst, &argv);
        run_spawn_t s = {.argv = run_strv_terminated(&argv), .own_pgrp = true, .pdeathsig = SIGKILL};
        run_child_t ch = {.pid = -1, .in_fd = -1, .out_fd = -1, .err_fd = -1};
        char err[512];
        jobs[n].host = o->hosts[i].name;
        run_pipes_init(&jobs[n].pipes);
        if (run_child_spawn(&s, &ch, err, sizeof(err)) != 0) {
            run_say("--sync-dst-dir: cannot run rsync for host %s: %s (install rsync or set DSHIM_RUN_RSYNC)",
                    o->hosts[i].name, err);
            jobs[n].pid = ch.pid;
            for (int k = 0; k <= n; k++) {
                if (jobs[k].pid > 0) {
                    kill(-jobs[k].pid, SIGKILL);
                    waitpid(jobs[k].pid, NULL, 0);
                }
            }
            exit(RUN_EXIT_USAGE);
        }
        jobs[n].pid = ch.pid;
        run_pipes_attach(&jobs[n].pipes, ch.out_fd, ch.err_fd, keep_reason, &jobs[n]);
        run_strv_free(&argv);
        n++;
    }
    return n;
}

/* The copies still running after SYNC_TIMEOUT_S fail. */
static void time_out(sync_job_t *jobs, int n)
{
    for (int k = 0; k < n; k++) {
        if (!jobs[k].done) {
            kill(-jobs[k].pid, SIGKILL);
            waitpid(jobs[k].pid, &jobs[k].status, 0);
            run_pipes_free(&jobs[k].pipes);
            snprintf(jobs[k].last_err, sizeof(jobs[k].last_err), "timed out after %.0f s", SYNC_TIMEOUT_S);
            jobs[k].done = true;
        }
    }
}

/* Collects every copy's output and exit, at most SYNC_TIMEOUT_S. */
static void wait_all(sync_job_t *jobs, int n)
{
    double deadline = dshim_now() + SYNC_TIMEOUT_S;
    run_pollset_t ps = {0};
    int left = n;
    while (left > 0) {
        run_pollset_clear(&ps);
        for (int k = 0; k < n; k++) {
            run_pollset_add_pipes(&ps, &jobs[k].pipes);
        }
        if (ps.n > 0) {
            run_pollset_wait(&ps, 200);
            run_pollset_read_pipes(&ps);
        } else {
            usleep(50000);
        }
        for (int k = 0; k < n; k++) {
            if (!jobs[k].done && !run_pipes_open(&jobs[k].pipes) &&
                waitpid(jobs[k].pid, &jobs[k].status, WNOHANG) > 0) {
                jobs[k].done = true;
                left--;
            }
        }
        if (left > 0 && dshim_now() > deadline) {
            time_out(jobs, n);
            left = 0;
        }
    }
    run_pollset_free(&ps);
}

int run_sync_dirs(const run_opts_t *o, const char *src, const char *dst)
{
    sync_job_t *jobs = run_xmalloc((size_t)o->nhosts * sizeof(*jobs));
    int n = start_all(o, src, dst, jobs);
    wait_all(jobs, n);
    int bad = 0;
    for (int k = 0; k < n; k++) {
        int st = jobs[k].status;
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            run_say("error: --sync-dst-dir: rsync of %s/ to %s:%s failed (%s %d: %s); check that the host is "
                    "reachable and %s is writable there", src, jobs[k].host, dst,
                    WIFEXITED(st) ? "exit code" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st),
                    jobs[k].last_err[0] ? jobs[k].last_err
                                        : WIFEXITED(st) ? rsync_code_meaning(WEXITSTATUS(st)) : "no message",
                    dst);
            bad++;
        }
        run_pipes_free(&jobs[k].pipes);
    }
    free(jobs);
    return bad ? -1 : 0;
}

/*
 * --sync-dst-dir: copy the working directory to DIR on every host of the
 * hostfile before the job starts, with rsync, in parallel, and refuse to
 * start if any copy fails (the dmlc tracker ignores rsync's exit code, so a
 * job then runs stale code or none).
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "child.h"
#include "config.h"
#include "frame.h"
#include "net.h"
#include "run.h"

#define SYNC_TIMEOUT_S 600.0

typedef struct {
    run_child_t ch;
    const char *host;
    bool done;
    int status;
    char last_err[400];
    bool have_reason;
    run_linebuf_t lb[2]; /* stdout, stderr: rsync has been seen to exit 11 with nothing on stderr */
} sync_job_t;

/* rsync ends with a summary ("rsync error: error in file IO (code 11)...");
 * the line that says what went wrong comes first ("rsync: [Receiver] mkdir
 * ... failed: Not a directory"), so keep the first such line. */
static void keep_reason(void *ctx, const char *line, size_t len)
{
    sync_job_t *j = ctx;
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

/* Reads what is there on one of a job's pipes; closes it at its end. */
static void drain(sync_job_t *j, int which)
{
    int *fd = which ? &j->ch.err_fd : &j->ch.out_fd;
    char buf[4096];
    ssize_t r = read(*fd, buf, sizeof(buf));
    if (r > 0) {
        run_linebuf_feed(&j->lb[which], buf, (size_t)r, keep_reason, j);
    } else if (r == 0 || errno != EINTR) {
        run_linebuf_flush(&j->lb[which], keep_reason, j);
        close(*fd);
        *fd = -1;
    }
}

int run_sync_dirs(const run_opts_t *o, const char *src, const char *dst)
{
    const dshim_config_t *cfg = dshim_config();
    sync_job_t *jobs = run_xmalloc((size_t)o->nhosts * sizeof(*jobs));
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
        run_split_words(cfg->run_rsync, &argv);
        run_strv_add(&argv, "-az");
        run_strv_add(&argv, "--mkpath");
        if (!o->hosts[i].local) {
            /* ssh command and its options as one -e word; rsync splits it itself */
            char *e = NULL;
            if (o->hosts[i].port) {
                if (asprintf(&e, "%s -p %d", cfg->run_ssh, o->hosts[i].port) < 0) {
                    exit(1);
                }
            } else {
                e = run_xstrdup(cfg->run_ssh);
            }
            run_strv_add(&argv, "-e");
            run_strv_add(&argv, e);
            free(e);
        }
        run_strv_addf(&argv, "%s/", src);
        if (o->hosts[i].local) {
            run_strv_addf(&argv, "%s/", dst);
        } else {
            /* "--" is not needed: host names were checked not to start with '-' */
            run_strv_addf(&argv, "%s:%s/", o->hosts[i].name, dst);
        }
        run_spawn_t s = {.argv = run_strv_terminated(&argv), .own_pgrp = true, .pdeathsig = SIGKILL};
        char err[512];
        jobs[n].host = o->hosts[i].name;
        if (run_child_spawn(&s, &jobs[n].ch, err, sizeof(err)) != 0) {
            run_say("--sync-dst-dir: cannot run rsync for host %s: %s (install rsync or set DSHIM_RUN_RSYNC)",
                    o->hosts[i].name, err);
            for (int k = 0; k <= n; k++) {
                if (jobs[k].ch.pid > 0) {
                    kill(-jobs[k].ch.pid, SIGKILL);
                    waitpid(jobs[k].ch.pid, NULL, 0);
                }
            }
            exit(RUN_EXIT_USAGE);
        }
        run_strv_free(&argv);
        n++;
    }
    double deadline = dshim_now() + SYNC_TIMEOUT_S;
    int left = n;
    while (left > 0) {
        struct pollfd pfd[2 * n];
        int np = 0;
        int map[2 * n];
        for (int k = 0; k < n; k++) {
            int fds[2] = {jobs[k].ch.out_fd, jobs[k].ch.err_fd};
            for (int w = 0; w < 2; w++) {
                if (fds[w] >= 0) {
                    map[np] = 2 * k + w;
                    pfd[np++] = (struct pollfd){.fd = fds[w], .events = POLLIN};
                }
            }
        }
        if (np > 0) {
            poll(pfd, (nfds_t)np, 200);
            for (int p = 0; p < np; p++) {
                if (pfd[p].revents) {
                    drain(&jobs[map[p] / 2], map[p] % 2);
                }
            }
        } else {
            usleep(50000);
        }
        for (int k = 0; k < n; k++) {
            if (!jobs[k].done && jobs[k].ch.err_fd < 0 && jobs[k].ch.out_fd < 0 && waitpid(jobs[k].ch.pid, &jobs[k].status, WNOHANG) > 0) {
                jobs[k].done = true;
                left--;
            }
        }
        if (left > 0 && dshim_now() > deadline) {
            for (int k = 0; k < n; k++) {
                if (!jobs[k].done) {
                    kill(-jobs[k].ch.pid, SIGKILL);
                    waitpid(jobs[k].ch.pid, &jobs[k].status, 0);
                    for (int w = 0; w < 2; w++) {
                        int *fd = w ? &jobs[k].ch.err_fd : &jobs[k].ch.out_fd;
                        if (*fd >= 0) {
                            close(*fd);
                            *fd = -1;
                        }
                    }
                    snprintf(jobs[k].last_err, sizeof(jobs[k].last_err), "timed out after %.0f s", SYNC_TIMEOUT_S);
                    jobs[k].done = true;
                }
            }
            left = 0;
        }
    }
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
        run_linebuf_free(&jobs[k].lb[0]);
        run_linebuf_free(&jobs[k].lb[1]);
    }
    free(jobs);
    return bad ? -1 : 0;
}

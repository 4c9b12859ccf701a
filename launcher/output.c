/* Output routing for the controller (output.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <unistd.h>

#include "logspec.h"
#include "output.h"
#include "private_fs.h"

#define TAIL_LINES 20

typedef struct {
    FILE *log;
    bool log_failed;
    FILE *std[2];      /* --tee/--redirects: attempt_N/<local rank>/stdout.log, stderr.log */
    bool std_failed[2];
    char *tail[TAIL_LINES];
    int tail_next;
    int tail_count;
} proc_out_t;

struct run_output {
    const run_opts_t *opts;
    const run_plan_t *plan;
    int attempt;
    proc_out_t *procs;
};

run_output_t *run_output_open(const run_opts_t *o, const run_plan_t *plan, int attempt)
{
    run_output_t *out = run_xmalloc(sizeof(*out));
    out->opts = o;
    out->plan = plan;
    out->attempt = attempt;
    out->procs = run_xmalloc((size_t)plan->nprocs * sizeof(*out->procs));
    if (o->log_dir) {
        /* the real cause (a read-only directory is EACCES or EROFS, not the
         * ENOENT a stat after a failed mkdir would report) */
        if (dshim_make_dirs(o->log_dir) != 0) {
            if (errno == EACCES || errno == EROFS || errno == EPERM) {
                run_usage_error("--log-dir: cannot write to %s: %s", o->log_dir, strerror(errno));
            }
            run_usage_error("--log-dir %s: cannot create the directory: %s", o->log_dir, strerror(errno));
        }
        if (access(o->log_dir, W_OK | X_OK) != 0) {
            run_usage_error("--log-dir: cannot write to %s: %s", o->log_dir, strerror(errno));
        }
    }
    return out;
}

static void open_log(run_output_t *out, int idx)
{
    proc_out_t *po = &out->procs[idx];
    /* with --tee/--redirects the logs are torchrun's files (std_file) instead */
    if (po->log || po->log_failed || out->opts->log_dir == NULL || out->opts->tee || out->opts->redirects) {
        return;
    }
    char *path = NULL;
    if (asprintf(&path, "%s/%s.log", out->opts->log_dir, out->plan->procs[idx].file) < 0) {
        po->log_failed = true;
        return;
    }
    /* append across restarts, with a separator, so an earlier failure stays readable */
    /* no link followed, no other user's file written into (private_fs.h) */
    int fd = dshim_private_open(path, out->attempt > 0 ? DSHIM_OPEN_APPEND : DSHIM_OPEN_TRUNC);
    int open_errno = errno;
    po->log = fd >= 0 ? fdopen(fd, out->attempt > 0 ? "a" : "w") : NULL;
    if (po->log == NULL) {
        if (fd >= 0) {
            close(fd);
        }
        run_say("cannot write log file %s: %s (output continues on the terminal)", path,
                dshim_private_why(open_errno));
        po->log_failed = true;
    } else if (out->attempt > 0) {
        fprintf(po->log, "==== dshim-run: restart %d ====\n", out->attempt);
    }
    free(path);
}

/* torchrun's layout: <root>/attempt_N/<local rank>/{stdout,stderr}.log (several nodes under one
 * controller: the rank's file stem instead of the local rank, as local ranks repeat there). */
static FILE *std_file(run_output_t *out, int idx, bool err)
{
    proc_out_t *po = &out->procs[idx];
    const run_proc_t *p = &out->plan->procs[idx];
    int s = err ? 1 : 0;
    if (po->std[s] || po->std_failed[s]) {
        return po->std[s];
    }
    po->std_failed[s] = true;
    bool one_node = out->plan->per_node || out->opts->nnodes <= 1;
    char *dir = NULL, *path = NULL;
    int made = one_node ? asprintf(&dir, "%s/attempt_%d/%d", run_std_log_root(out->opts), out->attempt, p->local_rank)
                        : asprintf(&dir, "%s/attempt_%d/%s", run_std_log_root(out->opts), out->attempt, p->file);
    if (made < 0 || dshim_make_dirs(dir) != 0 ||
        asprintf(&path, "%s/%s.log", dir, err ? "stderr" : "stdout") < 0) {
        run_say("cannot make log directory %s: %s (output continues on the terminal)", dir ? dir : "?",
                strerror(errno));
        free(dir);
        return NULL;
    }
    int fd = dshim_private_open(path, DSHIM_OPEN_TRUNC);
    int open_errno = errno;
    po->std[s] = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (po->std[s] == NULL) {
        if (fd >= 0) {
            close(fd);
        }
        run_say("cannot write log file %s: %s", path, dshim_private_why(open_errno));
    } else {
        po->std_failed[s] = false;
    }
    free(dir);
    free(path);
    return po->std[s];
}

void run_output_line(run_output_t *out, int idx, bool err, const char *text, size_t len)
{
    if (idx < 0 || idx >= out->plan->nprocs) {
        return;
    }
    const run_proc_t *p = &out->plan->procs[idx];
    proc_out_t *po = &out->procs[idx];
    int stream = err ? RUN_STD_ERR : RUN_STD_OUT;
    int to_file = (run_std_for(out->opts->tee, p->local_rank) | run_std_for(out->opts->redirects, p->local_rank));
    if (to_file & stream) {
        FILE *f = std_file(out, idx, err);
        if (f) {
            fprintf(f, "%.*s\n", (int)len, text);
            fflush(f);
        }
    }
    /* torchrun: a redirected stream leaves the console (tee keeps it there); the filter is the console's only */
    bool redirected = (run_std_for(out->opts->redirects, p->local_rank) & ~run_std_for(out->opts->tee,
                                                                                       p->local_rank)) & stream;
    bool filtered = p->local_rank >= 0 && !run_ranks_filter_shows(out->opts->local_ranks_filter, p->local_rank);
    if ((redirected && std_file(out, idx, err)) || filtered) {
        /* not on the console */
    } else if (!out->opts->quiet_others || p->shown) {
        FILE *f = err ? stderr : stdout;
        fprintf(f, "[%s] %.*s\n", p->name, (int)len, text);
        fflush(f);
    } else {
        free(po->tail[po->tail_next]);
        po->tail[po->tail_next] = strndup(text, len);
        po->tail_next = (po->tail_next + 1) % TAIL_LINES;
        if (po->tail_count < TAIL_LINES) {
            po->tail_count++;
        }
    }
    open_log(out, idx);
    if (po->log) {
        fprintf(po->log, "%.*s\n", (int)len, text);
        fflush(po->log);
    }
}

void run_output_show_tail(run_output_t *out, int idx)
{
    if (idx < 0 || idx >= out->plan->nprocs) {
        return;
    }
    proc_out_t *po = &out->procs[idx];
    if (po->tail_count == 0) {
        return;
    }
    const char *name = out->plan->procs[idx].name;
    fprintf(stderr, "dshim-run: last %d line(s) of %s (hidden by --quiet-others):\n", po->tail_count, name);
    int start = (po->tail_next - po->tail_count + TAIL_LINES) % TAIL_LINES;
    for (int i = 0; i < po->tail_count; i++) {
        fprintf(stderr, "[%s] %s\n", name, po->tail[(start + i) % TAIL_LINES]);
    }
    fflush(stderr);
    po->tail_count = 0;
}

void run_output_close(run_output_t *out)
{
    for (int i = 0; i < out->plan->nprocs; i++) {
        if (out->procs[i].log) {
            fclose(out->procs[i].log);
        }
        for (int s = 0; s < 2; s++) {
            if (out->procs[i].std[s]) {
                fclose(out->procs[i].std[s]);
            }
        }
        for (int k = 0; k < TAIL_LINES; k++) {
            free(out->procs[i].tail[k]);
        }
    }
    free(out->procs);
    free(out);
}

/* Output routing for the controller (output.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <unistd.h>

#include "output.h"
#include "private_fs.h"

#define TAIL_LINES 20

typedef struct {
    FILE *log;
    bool log_failed;
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
    if (po->log || po->log_failed || out->opts->log_dir == NULL) {
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

void run_output_line(run_output_t *out, int idx, bool err, const char *text, size_t len)
{
    if (idx < 0 || idx >= out->plan->nprocs) {
        return;
    }
    const run_proc_t *p = &out->plan->procs[idx];
    proc_out_t *po = &out->procs[idx];
    if (!out->opts->quiet_others || p->shown) {
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
        for (int k = 0; k < TAIL_LINES; k++) {
            free(out->procs[i].tail[k]);
        }
    }
    free(out->procs);
    free(out);
}

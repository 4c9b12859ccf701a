/*
 * torchrun's log specs (torch/distributed/elastic/multiprocessing/api.py
 * Std.from_str, DefaultLogsSpecs): --tee/--redirects take "N" (0 none,
 * 1 stdout, 2 stderr, 3 both) for every local rank or "LR:N,LR:N" per local
 * rank; --local-ranks-filter "0,1" keeps the console to those local ranks.
 * The files go where torchrun puts them: LOG_DIR/<rdzv-id>_XXXXXX/
 * attempt_N/<local rank>/{stdout,stderr}.log (output.c writes them).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "logspec.h"
#include "private_fs.h"

static bool digits(const char *s, size_t n)
{
    if (n == 0) {
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') {
            return false;
        }
    }
    return true;
}

const char *run_std_spec_error(const char *spec)
{
    static const char *const why = "expected 0 (none), 1 (stdout), 2 (stderr), 3 (both), or LOCAL_RANK:N,... "
                                   "as torchrun (e.g. 3 or 0:1,1:2)";
    if (strlen(spec) == 1) {
        return spec[0] >= '0' && spec[0] <= '3' ? NULL : why;
    }
    const char *p = spec;
    while (*p) {
        const char *comma = strchr(p, ',');
        size_t n = comma ? (size_t)(comma - p) : strlen(p);
        const char *colon = memchr(p, ':', n);
        if (colon == NULL || !digits(p, (size_t)(colon - p)) || n - (size_t)(colon - p) != 2 || colon[1] < '0' ||
            colon[1] > '3') {
            return why;
        }
        p += n + (comma ? 1 : 0);
        if (comma && *p == '\0') {
            return why;
        }
    }
    return NULL;
}

int run_std_for(const char *spec, int local_rank)
{
    if (spec == NULL || local_rank < 0) {
        return 0;
    }
    if (strlen(spec) == 1) {
        return spec[0] - '0';
    }
    for (const char *p = spec; *p;) {
        int lr = atoi(p);
        const char *colon = strchr(p, ':');
        if (colon == NULL) {
            return 0;
        }
        if (lr == local_rank) {
            return colon[1] - '0';
        }
        const char *comma = strchr(colon, ',');
        if (comma == NULL) {
            break;
        }
        p = comma + 1;
    }
    return 0;
}

const char *run_ranks_filter_error(const char *filter)
{
    const char *p = filter;
    do {
        const char *comma = strchr(p, ',');
        size_t n = comma ? (size_t)(comma - p) : strlen(p);
        if (!digits(p, n)) {
            return "must be a comma-separated list of integers e.g. --local-ranks-filter=0,1,2 (torchrun's rule)";
        }
        p = comma ? comma + 1 : p + n;
    } while (*p);
    return NULL;
}

bool run_ranks_filter_shows(const char *filter, int local_rank)
{
    if (filter == NULL) {
        return true;
    }
    for (const char *p = filter; *p;) {
        if (atoi(p) == local_rank) {
            return true;
        }
        const char *comma = strchr(p, ',');
        if (comma == NULL) {
            break;
        }
        p = comma + 1;
    }
    return false;
}

const char *run_std_log_root(const run_opts_t *o)
{
    static char *root;  /* one per dshim-run: the restarts' attempt_N directories share it, as torchrun's */
    if (root) {
        return root;
    }
    const char *base = o->log_dir;
    char tmp[4096];
    if (base == NULL) {
        /* torchrun without --log-dir: a fresh directory under the temporary one */
        if (dshim_private_mkdtemp("torchelastic", tmp, sizeof(tmp)) != 0) {
            run_usage_error("--tee/--redirects: cannot make a log directory in %s: %s", dshim_tmpdir(),
                            strerror(errno));
        }
        base = tmp;
    } else if (dshim_make_dirs(base) != 0) {
        run_usage_error("--log-dir %s: cannot create the directory: %s", base, strerror(errno));
    }
    char *path = NULL;
    if (asprintf(&path, "%s/%s_XXXXXX", base, o->rdzv_id ? o->rdzv_id : "none") < 0 || mkdtemp(path) == NULL) {
        run_usage_error("--log-dir %s: cannot make the job's log directory: %s", base, strerror(errno));
    }
    root = path;
    if (o->log_dir == NULL) {
        run_say("--tee/--redirects without --log-dir: the logs go to %s (as torchrun, a temporary directory)", root);
    }
    return root;
}

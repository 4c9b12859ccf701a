/* The per-job directory (jobdir.h). */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "jobdir.h"
#include "private_fs.h"

#define JOBDIR_STEM "dshim-run"

static char made[PATH_MAX];

static void remove_if_empty(void)
{
    if (made[0]) {
        rmdir(made);  /* only when empty: what a job left is swept by the controller */
    }
}

char *run_jobdir_make(bool dry_run)
{
    char dir[PATH_MAX];
    if (dry_run) {
        snprintf(dir, sizeof(dir), "%s/" JOBDIR_STEM ".XXXXXX", dshim_tmpdir());
        return run_xstrdup(dir);
    }
    if (dshim_private_mkdtemp(JOBDIR_STEM, dir, sizeof(dir)) != 0) {
        run_usage_error("cannot make a private job directory in %s: %s; set TMPDIR to a writable directory",
                        dshim_tmpdir(), strerror(errno));
    }
    static bool registered;
    if (!registered) {
        registered = true;
        atexit(remove_if_empty);
    }
    snprintf(made, sizeof(made), "%s", dir);
    return run_xstrdup(dir);
}

bool run_path_under(const char *path, const char *dir)
{
    size_t n = strlen(dir);
    return n > 0 && strncmp(path, dir, n) == 0 && path[n] == '/';
}

static char here[PATH_MAX];

const char *run_jobdir_here(void)
{
    return here[0] ? here : NULL;
}

/* "K=<from>/rest" -> "K=<to>/rest" (and a bare "<from>/rest" alike). */
static void rewrite(char **s, const char *from, const char *to)
{
    char *eq = strchr(*s, '=');
    char *val = eq ? eq + 1 : *s;
    if (!run_path_under(val, from)) {
        return;
    }
    char *out = NULL;
    if (asprintf(&out, "%.*s%s%s", (int)(val - *s), *s, to, val + strlen(from)) < 0) {
        run_usage_error("out of memory");
    }
    free(*s);
    *s = out;
}

int run_jobdir_claim(run_spec_t *spec, char *err, size_t errlen)
{
    const char *want = spec->jobdir;
    if (want == NULL || want[0] != '/') {
        return 0;  /* an older controller's description, or nothing to keep */
    }
    /* Ours already (the controller's host, or a sibling per-rank agent made
     * it): a directory of this user, no link, nobody else inside.  Else make
     * it; mkdir fails on anything there, so nothing planted is ever used. */
    if (dshim_private_dir(want, 0) == 0 || (mkdir(want, 0700) == 0 && dshim_private_dir(want, 0) == 0) ||
        (errno == EEXIST && dshim_private_dir(want, 0) == 0)) {
        snprintf(here, sizeof(here), "%s", want);
        return 0;
    }
    /* taken by someone else here, or no such parent on this host: a fresh one */
    char fresh[PATH_MAX];
    if (dshim_private_mkdtemp(JOBDIR_STEM, fresh, sizeof(fresh)) != 0) {
        snprintf(err, errlen, "cannot make a private job directory in %s: %s; set TMPDIR to a writable directory",
                 dshim_tmpdir(), strerror(errno));
        return -1;
    }
    for (int i = 0; i < spec->env.n; i++) {
        rewrite(&spec->env.v[i], want, fresh);
    }
    for (int p = 0; p < spec->nprocs; p++) {
        for (int i = 0; i < spec->procs[p].env.n; i++) {
            rewrite(&spec->procs[p].env.v[i], want, fresh);
        }
    }
    if (spec->trace_dir) {
        rewrite(&spec->trace_dir, want, fresh);
    }
    free(spec->jobdir);
    spec->jobdir = run_xstrdup(fresh);
    snprintf(here, sizeof(here), "%s", fresh);
    return 0;
}

/*
 * The job description an agent receives: where to start, the common
 * environment and, per process, its global index, display name, extra
 * environment and argv.  Encoded as netstrings ("<len>:<bytes>,") in base64,
 * so it travels as one line on an agent's stdin (local, ssh) or in the
 * DSHIM_RUN_SPEC variable (mpirun, srun) without any shell quoting.
 */
#ifndef DSHIM_RUN_SPEC_H
#define DSHIM_RUN_SPEC_H

#include "run.h"

typedef struct {
    int index;      /* into the controller's plan.procs */
    char *name;
    run_strv_t env;
    run_strv_t argv;
} run_spec_proc_t;

typedef struct {
    char *cwd;
    double grace_s;
    run_strv_t env;
    run_spec_proc_t *procs;
    int nprocs;
    char *trace_dir;   /* the ranks' flight-recorder directory, "" = none (collect.h) */
    bool trace_owned;  /* made by dshim-run for this job */
    char *jobdir;      /* the per-job directory (jobdir.h), "" = none */
} run_spec_t;

/* Encodes plan procs [first, first+count) for one agent; returns a malloc'ed base64 string. */
char *run_spec_encode(const run_plan_t *plan, int first, int count);
/* Decodes; returns 0, or -1 with a message in err. */
int run_spec_decode(const char *b64, run_spec_t *spec, char *err, size_t errlen);
void run_spec_free(run_spec_t *spec);

#endif

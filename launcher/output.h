/* Where the job's output goes: the terminal with "[role rank] " prefixes
 * (only rank 0 under --quiet-others), and DIR/<role><rank>.log with --log-dir. */
#ifndef DSHIM_RUN_OUTPUT_H
#define DSHIM_RUN_OUTPUT_H

#include <stdbool.h>
#include <stddef.h>

#include "run.h"

typedef struct run_output run_output_t;

run_output_t *run_output_open(const run_opts_t *o, const run_plan_t *plan, int attempt);
void run_output_line(run_output_t *out, int idx, bool err, const char *text, size_t len);
/* Under --quiet-others, shows the last lines of a hidden process that failed. */
void run_output_show_tail(run_output_t *out, int idx);
void run_output_close(run_output_t *out);

#endif

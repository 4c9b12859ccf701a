/* THE table of dshim-run's flags (flags.c) and the application of torchrun's and launch.py's
 * flags that options.c does not handle itself (flags_apply.c). */
#ifndef DSHIM_RUN_FLAGS_H
#define DSHIM_RUN_FLAGS_H

#include <stdbool.h>
#include <stdio.h>

#include "run.h"

bool run_flag_takes_value(const char *name);
/* "-t" -> "--tee"; NULL when no flag has that letter. */
const char *run_flag_short(char c);
/* The known flag nearest to an unknown one, NULL when none is near. */
const char *run_flag_closest(const char *name);
/* The table as --help shows it: flag, where it comes from, what dshim-run does. */
void run_flags_print_table(FILE *f);
/* Applies one of the flags handled in flags_apply.c; false when name is not one of them.
 * *torch_only is set for torchrun-only ones (options.c refuses mixing them with launch.py's). */
bool run_apply_more(run_opts_t *o, const char *name, const char *val, bool *torch_only, bool *mxnet_only);
/* After parsing: checks that need the whole command line (exit 2, one line). */
void run_validate_more(const run_opts_t *o);

#endif

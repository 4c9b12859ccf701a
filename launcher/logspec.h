/* torchrun's --tee/--redirects specs and --local-ranks-filter (logspec.c). */
#ifndef DSHIM_RUN_LOGSPEC_H
#define DSHIM_RUN_LOGSPEC_H

#include <stdbool.h>

#include "run.h"

#define RUN_STD_OUT 1
#define RUN_STD_ERR 2

/* NULL when spec is valid ("0".."3", or "LOCAL_RANK:N,..."), else why not. */
const char *run_std_spec_error(const char *spec);
/* The streams (RUN_STD_OUT|RUN_STD_ERR) spec names for a local rank; 0 for NULL. */
int run_std_for(const char *spec, int local_rank);
/* NULL when "0,1,2" is valid. */
const char *run_ranks_filter_error(const char *filter);
/* Whether --local-ranks-filter lets a local rank's lines reach the console (no filter: all). */
bool run_ranks_filter_shows(const char *filter, int local_rank);
/* torchrun's job log directory: LOG_DIR/<rdzv-id>_XXXXXX (made once per dshim-run; the attempts'
 * attempt_N/<local rank>/ go under it); exits 2 naming the cause when it cannot be made. */
const char *run_std_log_root(const run_opts_t *o);

#endif

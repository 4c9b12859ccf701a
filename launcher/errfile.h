/* torch's per-rank error file (TORCHELASTIC_ERROR_FILE); see errfile.c. */
#ifndef DSHIM_RUN_ERRFILE_H
#define DSHIM_RUN_ERRFILE_H

#include "run.h"

/* The absolute path in a process's environment, or NULL. */
const char *run_errfile_path(const run_strv_t *env);
/* Creates its directory and removes a stale file. */
void run_errfile_prepare(const char *path);
/* The recorded exception's first line (malloc'ed) or NULL; removes the file and empty directories. */
char *run_errfile_take(const char *path);

#endif

/* Private to analyser/: what its reading files share. */
#ifndef DSHIM_TRACE_READ_IMPL_H
#define DSHIM_TRACE_READ_IMPL_H

#include <stddef.h>

#include "trace_read.h"

/* dshim_trace_parse_procs, also giving the launcher's wait for dumps from
 * the header (wait_s may be NULL). */
int dshim_trace_parse_procs_wait(const char *buf, size_t len, dshim_trace_proc_t **procs, size_t *np,
                                 double *wait_s);

#endif

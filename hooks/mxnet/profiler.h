/* MXNet's server profiling (profile_process='server') over dshim's parameter
 * server: the worker side is the process profiler's C API (profiler.c, reached
 * through dlsym); this is the server side. */
#ifndef DSHIM_MX_PROFILER_H
#define DSHIM_MX_PROFILER_H

#include <stddef.h>

/* Applies one kSetProfilerParams body (as KVStoreDist sends it: the parameters,
 * then the command's digit) to MXNet's profiler of this server process, as
 * KVStoreDistServer::ProcessServerProfilerCommands does.  ctx is the server's
 * dshim_mxkv_t.  0, or -1 with one line in err. */
int dshim_mxkv_server_profiler(void *ctx, const char *body, char *err, size_t err_len);

#endif

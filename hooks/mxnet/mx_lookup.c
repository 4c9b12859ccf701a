/* How MXNet's Python reaches dshim's kvstore: it opens libmxnet with
 * ctypes.CDLL(RTLD_LOCAL) and finds every C function with dlsym(handle, name),
 * so this hook registers with the process's dlsym interposer (shim/interpose)
 * the functions that take a KVStoreHandle (MXKVStore*, and the process
 * profiler's four): looked up in a library that defines them (libmxnet), the
 * answer is dshim's implementation; everything else is glibc's answer. */
#include <stddef.h>

#include "config.h"
#include "interpose.h"
#include "mxnet/mx_api.h"

/* The functions of libmxnet that take a KVStoreHandle: every MXKVStore* one,
 * and the process profiler's four (they cast the handle to MXNet's KVStore
 * when asked to profile the servers: dshim's handle must never reach them). */
static const char *const kvstore_handle_names[] = {
    "MXKVStore*",
    "MXSetProcessProfilerConfig",
    "MXSetProcessProfilerState",
    "MXDumpProcessProfile",
    "MXProcessProfilePause",
    NULL,
};

/* A name taking a KVStoreHandle: dshim's implementation when handle is MXNet's library. */
static void *mx_lookup(void *handle, const char *name)
{
    void *ours = dshim_mx_kvstore_lookup(name);
    if (ours == NULL || !dshim_config()->mxnet_takeover) {
        return NULL;
    }
    /* only inside a library that really is MXNet */
    if (dshim_real_dlsym(handle, name) == NULL || dshim_mx_api_bind(handle) != 0) {
        return NULL;
    }
    return ours;
}

static const dshim_dlsym_client_t mx_client = {.names = kvstore_handle_names, .answer = mx_lookup};

/* At load, before Python can open libmxnet.  A failure is logged at WARN by
 * dshim_error (MXNet then runs on its own ps-lite). */
__attribute__((constructor)) static void register_mx_lookup(void)
{
    (void)dshim_dlsym_register(&mx_client);
}

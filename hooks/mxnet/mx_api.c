/* Resolves MXNet's C API from the libmxnet handle, and names dshim's
 * implementations of the functions taking a KVStoreHandle for the dlsym hook. */
#include <pthread.h>
#include <string.h>

#include "interpose.h"
#include "mxnet/mx_api.h"
#include "status.h"

static dshim_mx_api_t api;
static void *bound_handle;
static int bound_ok = -1;
static pthread_mutex_t bind_mu = PTHREAD_MUTEX_INITIALIZER;

const dshim_mx_api_t *dshim_mx_api(void)
{
    return __atomic_load_n(&bound_ok, __ATOMIC_ACQUIRE) == 0 ? &api : NULL;
}

int dshim_mx_api_bind(void *handle)
{
    pthread_mutex_lock(&bind_mu);
    if (bound_ok == 0 && bound_handle != NULL) {
        pthread_mutex_unlock(&bind_mu);
        return 0; /* one libmxnet per process: the first handle wins */
    }
    dshim_mx_api_t a;
    memset(&a, 0, sizeof(a));
    int ok = 0;
#define DSHIM_MX_RESOLVE(name, ret, args)                                      \
    a.name = (ret(*) args)dshim_real_dlsym(handle, #name);                  \
    if (a.name == NULL) {                                                      \
        ok = -1;                                                               \
    }
    DSHIM_MX_NDARRAY_FUNCS(DSHIM_MX_RESOLVE)
    DSHIM_MX_KVSTORE_FUNCS(DSHIM_MX_RESOLVE)
    DSHIM_MX_SPARSE_FUNCS(DSHIM_MX_RESOLVE)
    DSHIM_MX_PROFILER_CALLS(DSHIM_MX_RESOLVE)
    DSHIM_MX_PROFILER_FUNCS(DSHIM_MX_RESOLVE)
#undef DSHIM_MX_RESOLVE
    /* MXAPISetLastError is C++ in 1.9; NNAPISetLastError is what it calls */
    a.set_last_error = (void (*)(const char *))dshim_real_dlsym(handle, "NNAPISetLastError");
    if (a.set_last_error == NULL) {
        a.set_last_error = (void (*)(const char *))dshim_real_dlsym(handle, "_Z17MXAPISetLastErrorPKc");
    }
    if (a.set_last_error == NULL) {
        ok = -1;
    }
    a.engine_push_async_nd = (int (*)(void (*)(void *, void *, void *), void *, void (*)(void *), void *,
                                      NDArrayHandle *, int, NDArrayHandle *, int, const void *, int, const char *,
                                      bool))dshim_real_dlsym(handle, "MXEnginePushAsyncND");
    /* the Itanium C++ ABI's complete-object constructor and destructor; a
     * handle's look-up also searches its dependencies (libstdc++) */
    a.runtime_error_ctor = (void (*)(void *, const char *))dshim_real_dlsym(handle, "_ZNSt13runtime_errorC1EPKc");
    a.runtime_error_dtor = (void (*)(void *))dshim_real_dlsym(handle, "_ZNSt13runtime_errorD1Ev");
    if (ok == 0) {
        api = a;
        bound_handle = handle;
    }
    __atomic_store_n(&bound_ok, ok, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&bind_mu);
    return ok;
}

void *dshim_mx_kvstore_lookup(const char *name)
{
#define DSHIM_MX_MATCH(fn, ret, args)                                          \
    if (strcmp(name, #fn) == 0) {                                              \
        return (void *)dshim_##fn;                                             \
    }
    DSHIM_MX_KVSTORE_FUNCS(DSHIM_MX_MATCH)
    DSHIM_MX_PROFILER_FUNCS(DSHIM_MX_MATCH)
#undef DSHIM_MX_MATCH
    return NULL;
}

/* MXNet's C API as dshim uses it: the NDArray calls (resolved from the
 * libmxnet handle that Python's ctypes opened) and MXNet's own KVStore
 * functions, for the kvstore types dshim passes through. */
#ifndef DSHIM_MX_API_H
#define DSHIM_MX_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef void *NDArrayHandle;
typedef void *KVStoreHandle;
typedef void(MXKVStoreUpdater)(int key, NDArrayHandle recv, NDArrayHandle local, void *handle);
typedef void(MXKVStoreStrUpdater)(const char *key, NDArrayHandle recv, NDArrayHandle local, void *handle);
typedef void(MXKVStoreServerController)(int head, const char *body, void *controller_handle);

/* X(name, return, arguments) for every function dshim calls or passes through */
#define DSHIM_MX_NDARRAY_FUNCS(X)                                                                   \
    X(MXNDArrayWaitToRead, int, (NDArrayHandle))                                                    \
    X(MXNDArrayWaitToWrite, int, (NDArrayHandle))                                                   \
    X(MXNDArrayGetShapeEx, int, (NDArrayHandle, int *, const int **))                               \
    X(MXNDArrayGetDType, int, (NDArrayHandle, int *))                                               \
    X(MXNDArrayGetStorageType, int, (NDArrayHandle, int *))                                         \
    X(MXNDArraySyncCopyToCPU, int, (NDArrayHandle, void *, size_t))                                 \
    X(MXNDArraySyncCopyFromCPU, int, (NDArrayHandle, const void *, size_t))                         \
    X(MXNDArrayCreateEx, int, (const uint32_t *, uint32_t, int, int, int, int, NDArrayHandle *))    \
    X(MXNDArrayFree, int, (NDArrayHandle))                                                          \
    X(MXNDArraySlice, int, (NDArrayHandle, uint32_t, uint32_t, NDArrayHandle *))                    \
    X(MXNDArrayGetData, int, (NDArrayHandle, void **))                                              \
    X(MXNDArrayGetContext, int, (NDArrayHandle, int *, int *))                                      \
    X(MXShallowCopyNDArray, int, (NDArrayHandle, NDArrayHandle *))                                  \
    X(MXGetLastError, const char *, (void))

/* The profiler of this process (a server applies its workers' commands with them) */
#define DSHIM_MX_PROFILER_CALLS(X)                                                                  \
    X(MXSetProfilerConfig, int, (int, const char *const *, const char *const *))                    \
    X(MXSetProfilerState, int, (int))                                                               \
    X(MXProfilePause, int, (int))                                                                   \
    X(MXDumpProfile, int, (int))

/* The other functions of libmxnet 1.9.1 that take a KVStoreHandle (src/c_api/c_api_profile.cc):
 * with profile_process = 1 ("server") MXNet casts it to its own KVStore, so dshim carries them
 * for its handles (hooks/mxnet/profiler.c); tests/mxnet/test_kvstore_handle_audit.py keeps the list */
#define DSHIM_MX_PROFILER_FUNCS(X)                                                                  \
    X(MXSetProcessProfilerConfig, int, (int, const char *const *, const char *const *, KVStoreHandle)) \
    X(MXSetProcessProfilerState, int, (int, int, KVStoreHandle))                                    \
    X(MXDumpProcessProfile, int, (int, int, KVStoreHandle))                                         \
    X(MXProcessProfilePause, int, (int, int, KVStoreHandle))

/* row_sparse arrays (hooks/mxnet/kvstore_rows.c): read a gradient's rows, build
 * the arrays a server's updater and a row_sparse_pull's output get */
#define DSHIM_MX_SPARSE_FUNCS(X)                                                                    \
    X(MXNDArrayCreateSparseEx, int, (int, const uint32_t *, uint32_t, int, int, int, int, uint32_t, int *, \
                                     uint32_t *, const uint32_t *, NDArrayHandle *))               \
    X(MXNDArraySyncCopyFromNDArray, int, (NDArrayHandle, const NDArrayHandle, const int))           \
    X(MXNDArrayGetAuxType, int, (NDArrayHandle, uint32_t, int *))                                   \
    X(MXNDArrayGetAuxNDArray, int, (NDArrayHandle, uint32_t, NDArrayHandle *))                      \
    X(MXNDArrayGetDataNDArray, int, (NDArrayHandle, NDArrayHandle *))                               \
    X(MXNDArrayReshape64, int, (NDArrayHandle, int, int64_t *, bool, NDArrayHandle *))              \
    X(NNGetOpHandle, int, (const char *, void **))                                                  \
    X(MXAutogradSetIsRecording, int, (int, int *))                                                  \
    X(MXImperativeInvoke, int, (void *, int, NDArrayHandle *, int *, NDArrayHandle **, int, const char **, \
                                const char **))

#define DSHIM_MX_KVSTORE_FUNCS(X)                                                                   \
    X(MXKVStoreCreate, int, (const char *, KVStoreHandle *))                                        \
    X(MXKVStoreSetGradientCompression, int, (KVStoreHandle, uint32_t, const char **, const char **)) \
    X(MXKVStoreFree, int, (KVStoreHandle))                                                          \
    X(MXKVStoreInit, int, (KVStoreHandle, uint32_t, const int *, NDArrayHandle *))                  \
    X(MXKVStoreInitEx, int, (KVStoreHandle, uint32_t, const char **, NDArrayHandle *))              \
    X(MXKVStorePush, int, (KVStoreHandle, uint32_t, const int *, NDArrayHandle *, int))             \
    X(MXKVStorePushEx, int, (KVStoreHandle, uint32_t, const char **, NDArrayHandle *, int))         \
    X(MXKVStorePull, int, (KVStoreHandle, uint32_t, const int *, NDArrayHandle *, int))             \
    X(MXKVStorePullEx, int, (KVStoreHandle, uint32_t, const char **, NDArrayHandle *, int))         \
    X(MXKVStorePullWithSparse, int, (KVStoreHandle, uint32_t, const int *, NDArrayHandle *, int, bool)) \
    X(MXKVStorePullWithSparseEx, int, (KVStoreHandle, uint32_t, const char **, NDArrayHandle *, int, bool)) \
    X(MXKVStorePullRowSparse, int, (KVStoreHandle, uint32_t, const int *, NDArrayHandle *, const NDArrayHandle *, int)) \
    X(MXKVStorePullRowSparseEx, int, (KVStoreHandle, uint32_t, const char **, NDArrayHandle *, const NDArrayHandle *, int)) \
    X(MXKVStoreBroadcast, int, (KVStoreHandle, uint32_t, const int *, uint32_t, const int *, NDArrayHandle *, NDArrayHandle *, int)) \
    X(MXKVStoreBroadcastEx, int, (KVStoreHandle, uint32_t, const char **, uint32_t, const char **, NDArrayHandle *, NDArrayHandle *, int)) \
    X(MXKVStorePushPull, int, (KVStoreHandle, uint32_t, const int *, uint32_t, const int *, NDArrayHandle *, NDArrayHandle *, int)) \
    X(MXKVStorePushPullEx, int, (KVStoreHandle, uint32_t, const char **, uint32_t, const char **, NDArrayHandle *, NDArrayHandle *, int)) \
    X(MXKVStoreSetUpdater, int, (KVStoreHandle, MXKVStoreUpdater *, void *))                        \
    X(MXKVStoreSetUpdaterEx, int, (KVStoreHandle, MXKVStoreUpdater *, MXKVStoreStrUpdater *, void *)) \
    X(MXKVStoreGetType, int, (KVStoreHandle, const char **))                                        \
    X(MXKVStoreGetRank, int, (KVStoreHandle, int *))                                                \
    X(MXKVStoreGetGroupSize, int, (KVStoreHandle, int *))                                           \
    X(MXKVStoreBarrier, int, (KVStoreHandle))                                                       \
    X(MXKVStoreSetBarrierBeforeExit, int, (KVStoreHandle, const int))                               \
    X(MXKVStoreRunServer, int, (KVStoreHandle, MXKVStoreServerController *, void *))                \
    X(MXKVStoreSendCommmandToServers, int, (KVStoreHandle, int, const char *))                      \
    X(MXKVStoreGetNumDeadNode, int, (KVStoreHandle, const int, int *, const int))

typedef struct dshim_mx_api {
#define DSHIM_MX_FIELD(name, ret, args) ret(*name) args;
    DSHIM_MX_NDARRAY_FUNCS(DSHIM_MX_FIELD)
    DSHIM_MX_KVSTORE_FUNCS(DSHIM_MX_FIELD)
    DSHIM_MX_SPARSE_FUNCS(DSHIM_MX_FIELD)
    DSHIM_MX_PROFILER_CALLS(DSHIM_MX_FIELD)
    DSHIM_MX_PROFILER_FUNCS(DSHIM_MX_FIELD)
#undef DSHIM_MX_FIELD
    void (*set_last_error)(const char *msg);
    /* MXEnginePushAsyncND (NULL if absent): lets pushpull run inside MXNet's engine */
    int (*engine_push_async_nd)(void (*fn)(void *rctx, void *on_complete, void *param), void *param,
                                void (*deleter)(void *), void *ctx, NDArrayHandle *const_nds, int num_const,
                                NDArrayHandle *mutable_nds, int num_mutable, const void *prop, int priority,
                                const char *name, bool wait);
    /* std::runtime_error's constructor from a C string and its destructor, from
     * the libstdc++ libmxnet uses (NULL if absent): an engine operation's error
     * (kvstore_async.c) */
    void (*runtime_error_ctor)(void *self, const char *what);
    void (*runtime_error_dtor)(void *self);
} dshim_mx_api_t;

/* The API of the libmxnet handle first seen by dlsym (NULL before). */
const dshim_mx_api_t *dshim_mx_api(void);
/* Binds to a libmxnet handle (idempotent); 0, or -1 when a function is missing. */
int dshim_mx_api_bind(void *handle);
/* dshim's implementation of a function taking a KVStoreHandle (MXKVStore*, the
 * process profiler's), or NULL. */
void *dshim_mx_kvstore_lookup(const char *name);

/* dshim's implementations (hooks/mxnet/kvstore*.c, profiler.c) */
#define DSHIM_MX_DECL(name, ret, args) ret dshim_##name args;
DSHIM_MX_KVSTORE_FUNCS(DSHIM_MX_DECL)
DSHIM_MX_PROFILER_FUNCS(DSHIM_MX_DECL)
#undef DSHIM_MX_DECL

#endif

/* Finding the process's CUDA runtime at run time (see gpu_runtime.h). */
#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

#include "gpu_runtime.h"
#include "log.h"
#include "net.h"
#include "status.h"

static pthread_mutex_t runtime_lock = PTHREAD_MUTEX_INITIALIZER;
static dshim_gpu_runtime_t table;
static const dshim_gpu_runtime_t *table_ptr;  /* set once found */
static double last_probe = -1e9;

#define PROBE_EVERY_S 1.0

static void *runtime_handle(void)
{
    static const char *const names[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        void *h = dlopen(names[i], RTLD_LAZY | RTLD_NOLOAD);
        if (h) {
            return h;  /* the runtime the application uses */
        }
    }
    /* the driver alone is loaded (a runtime linked statically, or the driver
     * API): bring a runtime of our own, which shares the primary context */
    void *drv = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (!drv) {
        return NULL;  /* no CUDA in this process: no device memory either */
    }
    dlclose(drv);
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (h) {
            return h;
        }
    }
    return NULL;
}

static int load(void *h)
{
#define SYM(field, name)                                                       \
    do {                                                                       \
        *(void **)&table.field = dlsym(h, name);                               \
        if (!table.field) {                                                    \
            DSHIM_WARN("CUDA runtime found but %s is missing: device buffers unsupported", name); \
            return -1;                                                         \
        }                                                                      \
    } while (0)
    SYM(PointerGetAttributes, "cudaPointerGetAttributes");
    SYM(GetLastError, "cudaGetLastError");
    SYM(GetErrorString, "cudaGetErrorString");
    SYM(GetDevice, "cudaGetDevice");
    SYM(SetDevice, "cudaSetDevice");
    SYM(Malloc, "cudaMalloc");
    SYM(Free, "cudaFree");
    SYM(HostAlloc, "cudaHostAlloc");
    SYM(FreeHost, "cudaFreeHost");
    SYM(HostGetDevicePointer, "cudaHostGetDevicePointer");
    SYM(MemcpyAsync, "cudaMemcpyAsync");
    SYM(EventCreateWithFlags, "cudaEventCreateWithFlags");
    SYM(EventRecord, "cudaEventRecord");
    SYM(EventQuery, "cudaEventQuery");
    SYM(EventDestroy, "cudaEventDestroy");
    SYM(StreamWaitEvent, "cudaStreamWaitEvent");
    SYM(LaunchHostFunc, "cudaLaunchHostFunc");
    SYM(StreamSynchronize, "cudaStreamSynchronize");
    SYM(IpcGetMemHandle, "cudaIpcGetMemHandle");
    SYM(IpcOpenMemHandle, "cudaIpcOpenMemHandle");
    SYM(IpcCloseMemHandle, "cudaIpcCloseMemHandle");
#undef SYM
    void *drv = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (drv) {
        *(void **)&table.StreamWaitValue32 = dlsym(drv, "cuStreamWaitValue32_v2");
        if (!table.StreamWaitValue32) {
            *(void **)&table.StreamWaitValue32 = dlsym(drv, "cuStreamWaitValue32");
        }
        *(void **)&table.StreamWriteValue32 = dlsym(drv, "cuStreamWriteValue32_v2");
        if (!table.StreamWriteValue32) {
            *(void **)&table.StreamWriteValue32 = dlsym(drv, "cuStreamWriteValue32");
        }
    }
    return 0;
}

const dshim_gpu_runtime_t *dshim_gpu_runtime(void)
{
    const dshim_gpu_runtime_t *p = __atomic_load_n(&table_ptr, __ATOMIC_ACQUIRE);
    if (p) {
        return p;
    }
    pthread_mutex_lock(&runtime_lock);
    double now = dshim_now();
    if (!table_ptr && now - last_probe >= PROBE_EVERY_S) {
        last_probe = now;
        void *h = runtime_handle();
        if (h && load(h) == 0) {
            DSHIM_INFO("using the process's CUDA runtime for device buffers (stream waits: %s)",
                       table.StreamWaitValue32 && table.StreamWriteValue32 ? "cuStreamWaitValue32" : "host function");
            __atomic_store_n(&table_ptr, &table, __ATOMIC_RELEASE);
        }
    }
    p = table_ptr;
    pthread_mutex_unlock(&runtime_lock);
    return p;
}

int dshim_gpu_present(void)
{
    return dshim_gpu_runtime() != NULL;
}

const char *dshim_gpu_error_text(const dshim_gpu_runtime_t *rt, dshim_gpu_err_t e)
{
    rt->GetLastError();
    return rt->GetErrorString(e);
}

dshim_gpu_memtype_t dshim_gpu_memtype(const void *ptr)
{
    const dshim_gpu_runtime_t *rt = dshim_gpu_runtime();
    if (!rt || !ptr) {
        return DSHIM_GPU_MEM_UNREGISTERED;
    }
    dshim_gpu_pointer_attr_t attr;
    memset(&attr, 0, sizeof(attr));
    if (rt->PointerGetAttributes(&attr, ptr) != DSHIM_GPU_SUCCESS) {
        /* old runtimes fail on unregistered host memory: clear the error,
         * or the application's next cudaGetLastError() would report it */
        rt->GetLastError();
        return DSHIM_GPU_MEM_UNREGISTERED;
    }
    return (dshim_gpu_memtype_t)attr.type;
}

int dshim_gpu_is_cuda_ptr(const void *ptr)
{
    /* device, managed, and pinned host memory (whose users expect stream
     * order) are reached through CUDA */
    return dshim_gpu_memtype(ptr) != DSHIM_GPU_MEM_UNREGISTERED;
}

int dshim_gpu_current_device(void)
{
    const dshim_gpu_runtime_t *rt = dshim_gpu_runtime();
    int dev = 0;
    if (rt && rt->GetDevice(&dev) != DSHIM_GPU_SUCCESS) {
        rt->GetLastError();
        dev = 0;
    }
    return dev;
}

dshim_status_t dshim_gpu_malloc(void **ptr, size_t size)
{
    const dshim_gpu_runtime_t *rt = dshim_gpu_runtime();
    if (!rt) {
        return dshim_error(DSHIM_ERR_UNSUPPORTED, "no CUDA runtime in this process");
    }
    dshim_gpu_err_t e = rt->Malloc(ptr, size);
    if (e != DSHIM_GPU_SUCCESS) {
        return dshim_error(DSHIM_ERR_NOMEM, "cudaMalloc of %zu bytes failed: %s", size, dshim_gpu_error_text(rt, e));
    }
    return DSHIM_OK;
}

dshim_status_t dshim_gpu_free(void *ptr)
{
    const dshim_gpu_runtime_t *rt = dshim_gpu_runtime();
    if (!rt) {
        return dshim_error(DSHIM_ERR_UNSUPPORTED, "no CUDA runtime in this process");
    }
    dshim_gpu_err_t e = rt->Free(ptr);
    if (e != DSHIM_GPU_SUCCESS) {
        return dshim_error(DSHIM_ERR_INVALID, "cudaFree(%p) failed: %s", ptr, dshim_gpu_error_text(rt, e));
    }
    return DSHIM_OK;
}

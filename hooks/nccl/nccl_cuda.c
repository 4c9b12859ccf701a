/* Finding the process's CUDA runtime at run time (see nccl_cuda.h). */
#include <dlfcn.h>
#include <string.h>

#include "net.h"
#include "nccl/nccl_cuda.h"
#include "nccl/nccl_internal.h"
#include "status.h"

static pthread_mutex_t cuda_lock = PTHREAD_MUTEX_INITIALIZER;
static dshim_nccl_cuda_api_t api;
static const dshim_nccl_cuda_api_t *api_ptr;  /* set once found */
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
        *(void **)&api.field = dlsym(h, name);                                 \
        if (!api.field) {                                                      \
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
        *(void **)&api.StreamWaitValue32 = dlsym(drv, "cuStreamWaitValue32_v2");
        if (!api.StreamWaitValue32) {
            *(void **)&api.StreamWaitValue32 = dlsym(drv, "cuStreamWaitValue32");
        }
    }
    return 0;
}

const dshim_nccl_cuda_api_t *dshim_nccl_cuda_api(void)
{
    const dshim_nccl_cuda_api_t *p = __atomic_load_n(&api_ptr, __ATOMIC_ACQUIRE);
    if (p) {
        return p;
    }
    pthread_mutex_lock(&cuda_lock);
    double now = dshim_now();
    if (!api_ptr && now - last_probe >= PROBE_EVERY_S) {
        last_probe = now;
        void *h = runtime_handle();
        if (h && load(h) == 0) {
            DSHIM_INFO("NCCL API: using the process's CUDA runtime for device buffers (stream waits: %s)",
                       api.StreamWaitValue32 ? "cuStreamWaitValue32" : "host function");
            __atomic_store_n(&api_ptr, &api, __ATOMIC_RELEASE);
        }
    }
    p = api_ptr;
    pthread_mutex_unlock(&cuda_lock);
    return p;
}

int dshim_nccl_cuda_present(void)
{
    return dshim_nccl_cuda_api() != NULL;
}

int dshim_nccl_cuda_memtype(const void *ptr)
{
    const dshim_nccl_cuda_api_t *a = dshim_nccl_cuda_api();
    if (!a || !ptr) {
        return 0;
    }
    /* room for a runtime newer than the header that grew the struct */
    union {
        struct cudaPointerAttributes attr;
        char pad[256];
    } u;
    memset(&u, 0, sizeof(u));
    if (a->PointerGetAttributes(&u.attr, ptr) != cudaSuccess) {
        /* old runtimes fail on unregistered host memory: clear the error,
         * or the application's next cudaGetLastError() would report it */
        a->GetLastError();
        return 0;
    }
    return (int)u.attr.type;
}

int dshim_nccl_cuda_is_device_ptr(const void *ptr)
{
    /* device, managed, and pinned host memory (whose users expect stream
     * order) go through the CUDA executor */
    return dshim_nccl_cuda_memtype(ptr) != cudaMemoryTypeUnregistered;
}

int dshim_nccl_cuda_current_device(void)
{
    const dshim_nccl_cuda_api_t *a = dshim_nccl_cuda_api();
    int dev = 0;
    if (a && a->GetDevice(&dev) != cudaSuccess) {
        a->GetLastError();
        dev = 0;
    }
    return dev;
}

dshim_status_t dshim_nccl_cuda_malloc(void **ptr, size_t size)
{
    const dshim_nccl_cuda_api_t *a = dshim_nccl_cuda_api();
    if (!a) {
        return dshim_error(DSHIM_ERR_UNSUPPORTED, "no CUDA runtime in this process");
    }
    cudaError_t e = a->Malloc(ptr, size);
    if (e != cudaSuccess) {
        a->GetLastError();
        return dshim_error(DSHIM_ERR_NOMEM, "cudaMalloc of %zu bytes failed: %s", size, a->GetErrorString(e));
    }
    return DSHIM_OK;
}

dshim_status_t dshim_nccl_cuda_free(void *ptr)
{
    const dshim_nccl_cuda_api_t *a = dshim_nccl_cuda_api();
    if (!a) {
        return dshim_error(DSHIM_ERR_UNSUPPORTED, "no CUDA runtime in this process");
    }
    cudaError_t e = a->Free(ptr);
    if (e != cudaSuccess) {
        a->GetLastError();
        return dshim_error(DSHIM_ERR_INVALID, "cudaFree(%p) failed: %s", ptr, a->GetErrorString(e));
    }
    return DSHIM_OK;
}

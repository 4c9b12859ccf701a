/*
 * The CUDA runtime as dshim uses it: a table of functions looked up in the
 * libcudart the process already loaded (dlopen RTLD_NOLOAD), so dshim and the
 * application share one runtime, and a CPU-only program never loads CUDA.
 * libdshim.so does not link libcudart.
 *
 * This header needs no CUDA headers (shim/gpu builds on every machine): it
 * declares the few CUDA types and values dshim passes, with CUDA's binary
 * layout and numbers.  hooks/nccl/nccl_gpu_abi.c, compiled against CUDA's
 * own headers, checks at build time that they agree.
 */
#ifndef DSHIM_GPU_RUNTIME_H
#define DSHIM_GPU_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#include "dshim.h"

typedef int dshim_gpu_err_t;         /* cudaError_t */
typedef void *dshim_gpu_stream_t;    /* cudaStream_t (NULL: the legacy default stream) */
typedef void *dshim_gpu_event_t;     /* cudaEvent_t */
typedef void (*dshim_gpu_host_fn_t)(void *data);  /* cudaHostFn_t */

/* cudaIpcMemHandle_t: opaque bytes, passed by value */
typedef struct dshim_gpu_ipc_handle {
    char reserved[64];
} dshim_gpu_ipc_handle_t;

/* cudaPointerAttributes as every runtime dshim looks for (11.0 and later)
 * lays it out, with room for a runtime that grew the struct */
typedef struct dshim_gpu_pointer_attr {
    int type;                /* dshim_gpu_memtype_t */
    int device;
    void *device_pointer;
    void *host_pointer;
    char room[256];
} dshim_gpu_pointer_attr_t;

enum {
    DSHIM_GPU_SUCCESS = 0,       /* cudaSuccess */
    DSHIM_GPU_NOT_READY = 600,   /* cudaErrorNotReady */
};

/* cudaMemoryType */
typedef enum dshim_gpu_memtype {
    DSHIM_GPU_MEM_UNREGISTERED = 0,  /* ordinary host memory */
    DSHIM_GPU_MEM_HOST = 1,          /* pinned host memory */
    DSHIM_GPU_MEM_DEVICE = 2,
    DSHIM_GPU_MEM_MANAGED = 3,
} dshim_gpu_memtype_t;

/* cudaMemcpyKind */
enum {
    DSHIM_GPU_COPY_H2D = 1,
    DSHIM_GPU_COPY_D2H = 2,
    DSHIM_GPU_COPY_D2D = 3,
    DSHIM_GPU_COPY_DEFAULT = 4,  /* direction from the pointers (unified addressing) */
};

#define DSHIM_GPU_HOST_ALLOC_PORTABLE 0x01u      /* cudaHostAllocPortable */
#define DSHIM_GPU_HOST_ALLOC_MAPPED 0x02u        /* cudaHostAllocMapped */
#define DSHIM_GPU_EVENT_DISABLE_TIMING 0x02u     /* cudaEventDisableTiming */
#define DSHIM_GPU_IPC_LAZY_PEER_ACCESS 0x01u     /* cudaIpcMemLazyEnablePeerAccess */

typedef struct dshim_gpu_runtime {
    dshim_gpu_err_t (*PointerGetAttributes)(dshim_gpu_pointer_attr_t *attr, const void *ptr);
    dshim_gpu_err_t (*GetLastError)(void);
    const char *(*GetErrorString)(dshim_gpu_err_t err);
    dshim_gpu_err_t (*GetDevice)(int *dev);
    dshim_gpu_err_t (*SetDevice)(int dev);
    dshim_gpu_err_t (*Malloc)(void **ptr, size_t size);
    dshim_gpu_err_t (*Free)(void *ptr);
    dshim_gpu_err_t (*HostAlloc)(void **ptr, size_t size, unsigned int flags);
    dshim_gpu_err_t (*FreeHost)(void *ptr);
    dshim_gpu_err_t (*HostGetDevicePointer)(void **dptr, void *hptr, unsigned int flags);
    dshim_gpu_err_t (*MemcpyAsync)(void *dst, const void *src, size_t n, int kind, dshim_gpu_stream_t s);
    dshim_gpu_err_t (*EventCreateWithFlags)(dshim_gpu_event_t *ev, unsigned int flags);
    dshim_gpu_err_t (*EventRecord)(dshim_gpu_event_t ev, dshim_gpu_stream_t s);
    dshim_gpu_err_t (*EventQuery)(dshim_gpu_event_t ev);
    dshim_gpu_err_t (*EventDestroy)(dshim_gpu_event_t ev);
    dshim_gpu_err_t (*StreamWaitEvent)(dshim_gpu_stream_t s, dshim_gpu_event_t ev, unsigned int flags);
    dshim_gpu_err_t (*LaunchHostFunc)(dshim_gpu_stream_t s, dshim_gpu_host_fn_t fn, void *data);
    dshim_gpu_err_t (*StreamSynchronize)(dshim_gpu_stream_t s);
    /* CUDA IPC between the ranks of one host */
    dshim_gpu_err_t (*IpcGetMemHandle)(dshim_gpu_ipc_handle_t *handle, void *ptr);
    dshim_gpu_err_t (*IpcOpenMemHandle)(void **ptr, dshim_gpu_ipc_handle_t handle, unsigned int flags);
    dshim_gpu_err_t (*IpcCloseMemHandle)(void *ptr);
    /* driver: stream waits until *addr >= value (CU_STREAM_WAIT_VALUE_GEQ);
     * NULL when the driver lacks it (callers fall back to a host function) */
    int (*StreamWaitValue32)(void *stream, unsigned long long addr, uint32_t value, unsigned int flags);
    /* driver: the stream writes value to *addr once its earlier work is done
     * (CU_STREAM_WRITE_VALUE_DEFAULT: after a system-wide fence); NULL
     * when the driver lacks it */
    int (*StreamWriteValue32)(void *stream, unsigned long long addr, uint32_t value, unsigned int flags);
} dshim_gpu_runtime_t;

/* The table, or NULL when the process has no CUDA runtime loaded (looked
 * for again at most once a second: a program may load CUDA late). */
const dshim_gpu_runtime_t *dshim_gpu_runtime(void);

/* 1 when the process has the CUDA runtime loaded (it is then used, never
 * loaded by dshim for a CPU-only program). */
int dshim_gpu_present(void);

/* ptr's memory type as the runtime sees it; DSHIM_GPU_MEM_UNREGISTERED for
 * ordinary host memory, NULL, or without CUDA. */
dshim_gpu_memtype_t dshim_gpu_memtype(const void *ptr);

/* 1 when ptr must be reached through CUDA (device, managed or pinned memory
 * of a CUDA program, whose users expect stream order); 0 for ordinary host
 * memory or without CUDA. */
int dshim_gpu_is_cuda_ptr(const void *ptr);

/* The calling thread's current device (0 without CUDA). */
int dshim_gpu_current_device(void);

/* Device memory; DSHIM_ERR_UNSUPPORTED without CUDA. */
dshim_status_t dshim_gpu_malloc(void **ptr, size_t size);
dshim_status_t dshim_gpu_free(void *ptr);

/* The runtime's text for e, after clearing the thread's last CUDA error (a
 * failure dshim handled must not show up in the application's next
 * cudaGetLastError()). */
const char *dshim_gpu_error_text(const dshim_gpu_runtime_t *rt, dshim_gpu_err_t e);

#endif

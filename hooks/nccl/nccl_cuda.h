/*
 * The CUDA runtime as dshim uses it: a table of functions looked up in the
 * libcudart the process already loaded (dlopen RTLD_NOLOAD), so dshim and the
 * application share one runtime, and a CPU-only program never loads CUDA.
 * libdshim.so does not link libcudart; only CUDA's headers are used.
 */
#ifndef DSHIM_NCCL_CUDA_H
#define DSHIM_NCCL_CUDA_H

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdint.h>

typedef struct dshim_nccl_cuda_api {
    cudaError_t (*PointerGetAttributes)(struct cudaPointerAttributes *attr, const void *ptr);
    cudaError_t (*GetLastError)(void);
    const char *(*GetErrorString)(cudaError_t err);
    cudaError_t (*GetDevice)(int *dev);
    cudaError_t (*SetDevice)(int dev);
    cudaError_t (*Malloc)(void **ptr, size_t size);
    cudaError_t (*Free)(void *ptr);
    cudaError_t (*HostAlloc)(void **ptr, size_t size, unsigned int flags);
    cudaError_t (*FreeHost)(void *ptr);
    cudaError_t (*HostGetDevicePointer)(void **dptr, void *hptr, unsigned int flags);
    cudaError_t (*MemcpyAsync)(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t s);
    cudaError_t (*EventCreateWithFlags)(cudaEvent_t *ev, unsigned int flags);
    cudaError_t (*EventRecord)(cudaEvent_t ev, cudaStream_t s);
    cudaError_t (*EventQuery)(cudaEvent_t ev);
    cudaError_t (*EventDestroy)(cudaEvent_t ev);
    cudaError_t (*StreamWaitEvent)(cudaStream_t s, cudaEvent_t ev, unsigned int flags);
    cudaError_t (*LaunchHostFunc)(cudaStream_t s, cudaHostFn_t fn, void *data);
    /* CUDA IPC between the ranks of one host (nccl_ipc.c) */
    cudaError_t (*StreamSynchronize)(cudaStream_t s);
    cudaError_t (*IpcGetMemHandle)(cudaIpcMemHandle_t *handle, void *ptr);
    cudaError_t (*IpcOpenMemHandle)(void **ptr, cudaIpcMemHandle_t handle, unsigned int flags);
    cudaError_t (*IpcCloseMemHandle)(void *ptr);
    /* driver: stream waits until *addr >= value (CU_STREAM_WAIT_VALUE_GEQ);
     * NULL when the driver lacks it (the host-function fallback is used) */
    int (*StreamWaitValue32)(void *stream, unsigned long long addr, uint32_t value, unsigned int flags);
} dshim_nccl_cuda_api_t;

/* The table, or NULL when the process has no CUDA runtime loaded. */
const dshim_nccl_cuda_api_t *dshim_nccl_cuda_api(void);

/* cudaMemoryType of ptr as the runtime sees it (0 = unregistered host). */
int dshim_nccl_cuda_memtype(const void *ptr);

/* --- collectives through CUDA IPC among the ranks of one host (nccl_ipc.c) --- */
struct ncclComm;
struct dshim_nccl_op;
typedef struct dshim_nccl_ipc dshim_nccl_ipc_t;
/* The batch may take the IPC path: one allreduce, reduce, broadcast,
 * allgather or reduce-scatter (no PreMulSum) of at least DSHIM_NCCL_IPC_MIN
 * bytes on device buffers, every rank on this host, DSHIM_NCCL_IPC on,
 * kernels for the dtype.  The same answer on every rank for the same call. */
int dshim_nccl_ipc_eligible(const struct ncclComm *comm, const struct dshim_nccl_op *ops, int n);
/* NULL when DSHIM_NCCL_IPC_COLLS's value `list` names only known
 * collectives, else the first unknown item. */
const char *dshim_nccl_ipc_check_colls(const char *list);

/* Collective, on the application's thread with no batch in flight: *ipc_p
 * set when every rank mapped every scratch, else NULL (reason logged). */
ncclResult_t dshim_nccl_ipc_setup(struct ncclComm *comm, const dshim_nccl_cuda_api_t *api, dshim_nccl_ipc_t **ipc_p);
/* The collective, chunk by chunk, on `stream`.  host_waits = 0: queued with
 * stream barriers between chunks, returns at once (DSHIM_NCCL_IPC_ASYNC=1);
 * 1: the calling thread synchronises the stream and runs the barriers,
 * returning when the result is in place (no batch may be in flight). */
ncclResult_t dshim_nccl_ipc_enqueue(dshim_nccl_ipc_t *ipc, struct ncclComm *comm, const struct dshim_nccl_op *op,
                                    cudaStream_t stream, int host_waits);
/* From nccl_exec_cuda.c: a barrier of the ranks in `stream`'s order (work
 * queued before it completes on every rank before work queued after it
 * starts on any), without blocking the host.  new_work = 0: nothing was
 * queued on the stream since this caller's previous stream barrier. */
ncclResult_t dshim_nccl_cuda_stream_barrier(struct ncclComm *comm, cudaStream_t stream, int new_work);
void dshim_nccl_ipc_free(dshim_nccl_ipc_t *ipc);

#endif

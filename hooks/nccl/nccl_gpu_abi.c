/*
 * shim/gpu declares the CUDA types and values it passes itself, so that it
 * builds without CUDA's headers (gpu_runtime.h).  This hook is compiled
 * against CUDA's headers anyway (nccl.h includes them): here the build checks
 * that the two agree, so a CUDA that changed one of them fails to compile
 * instead of passing wrong values at run time.  No code.
 */
#include <cuda_runtime_api.h>
#include <stddef.h>

#include "gpu_runtime.h"

#define SAME(ours, cudas) _Static_assert((int)(ours) == (int)(cudas), #ours " is not " #cudas)

SAME(DSHIM_GPU_SUCCESS, cudaSuccess);
SAME(DSHIM_GPU_NOT_READY, cudaErrorNotReady);
SAME(DSHIM_GPU_MEM_UNREGISTERED, cudaMemoryTypeUnregistered);
SAME(DSHIM_GPU_MEM_HOST, cudaMemoryTypeHost);
SAME(DSHIM_GPU_MEM_DEVICE, cudaMemoryTypeDevice);
SAME(DSHIM_GPU_MEM_MANAGED, cudaMemoryTypeManaged);
SAME(DSHIM_GPU_COPY_H2D, cudaMemcpyHostToDevice);
SAME(DSHIM_GPU_COPY_D2H, cudaMemcpyDeviceToHost);
SAME(DSHIM_GPU_COPY_D2D, cudaMemcpyDeviceToDevice);
SAME(DSHIM_GPU_COPY_DEFAULT, cudaMemcpyDefault);
SAME(DSHIM_GPU_HOST_ALLOC_PORTABLE, cudaHostAllocPortable);
SAME(DSHIM_GPU_HOST_ALLOC_MAPPED, cudaHostAllocMapped);
SAME(DSHIM_GPU_EVENT_DISABLE_TIMING, cudaEventDisableTiming);
SAME(DSHIM_GPU_IPC_LAZY_PEER_ACCESS, cudaIpcMemLazyEnablePeerAccess);

_Static_assert(sizeof(dshim_gpu_err_t) == sizeof(cudaError_t), "cudaError_t is not an int");
_Static_assert(sizeof(dshim_gpu_ipc_handle_t) == sizeof(cudaIpcMemHandle_t), "cudaIpcMemHandle_t changed size");
_Static_assert(sizeof(dshim_gpu_stream_t) == sizeof(cudaStream_t), "cudaStream_t is not a pointer");
_Static_assert(sizeof(dshim_gpu_event_t) == sizeof(cudaEvent_t), "cudaEvent_t is not a pointer");
_Static_assert(offsetof(dshim_gpu_pointer_attr_t, type) == offsetof(struct cudaPointerAttributes, type),
               "cudaPointerAttributes.type moved");
_Static_assert(offsetof(dshim_gpu_pointer_attr_t, device) == offsetof(struct cudaPointerAttributes, device),
               "cudaPointerAttributes.device moved");
_Static_assert(sizeof(dshim_gpu_pointer_attr_t) >= sizeof(struct cudaPointerAttributes),
               "cudaPointerAttributes outgrew dshim's room for it");

/*
 * Collectives on device buffers through CUDA IPC among the ranks of one
 * host (nccl_ipc.c), and the stream-ordered barrier of the CUDA executor
 * (nccl_exec_cuda.c) they are built on.  Device memory, the runtime table
 * and the reduction kernels come from shim/gpu.
 */
#ifndef DSHIM_NCCL_IPC_H
#define DSHIM_NCCL_IPC_H

#include <nccl.h>

#include "gpu_runtime.h"

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
ncclResult_t dshim_nccl_ipc_setup(struct ncclComm *comm, const dshim_gpu_runtime_t *api, dshim_nccl_ipc_t **ipc_p,
                                  const char *call);
/* The collective, chunk by chunk, on `stream`.  host_waits = 0: queued with
 * stream barriers between chunks, returns at once (DSHIM_NCCL_IPC_ASYNC=1, the default);
 * 1: the calling thread synchronises the stream and runs the barriers,
 * returning when the result is in place (no batch may be in flight). */
ncclResult_t dshim_nccl_ipc_enqueue(dshim_nccl_ipc_t *ipc, struct ncclComm *comm, const struct dshim_nccl_op *op,
                                    cudaStream_t stream, int host_waits);
/* From nccl_exec_cuda.c: a barrier of the ranks in `stream`'s order (work
 * queued before it completes on every rank before work queued after it
 * starts on any), without blocking the host.  new_work = 0: nothing was
 * queued on the stream since this caller's previous stream barrier. */
ncclResult_t dshim_nccl_cuda_stream_barrier(struct ncclComm *comm, cudaStream_t stream, int new_work,
                                           const char *call);
void dshim_nccl_ipc_free(dshim_nccl_ipc_t *ipc);

#endif

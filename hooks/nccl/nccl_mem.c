/*
 * ncclMemAlloc/Free and buffer registration.  In a CUDA program memory comes
 * from cudaMalloc (through the dlopen'ed runtime); without CUDA it is page-
 * aligned host memory, so CPU-only programs and tests can use the same calls.
 * Registration is only an optimization hint for NCCL: dshim accepts it and
 * hands back a handle it checks on deregistration.  Symmetric windows need
 * NCCL's device-side API, which dshim does not provide.
 */
#include <stdlib.h>

#include "gpu_runtime.h"
#include "nccl/nccl_internal.h"

#define REG_MAGIC 0x64736872u /* "dshr" */

typedef struct host_block {
    void *ptr;
    struct host_block *next;
} host_block_t;

static pthread_mutex_t mem_lock = PTHREAD_MUTEX_INITIALIZER;
static host_block_t *host_blocks;  /* host allocations, to tell them from cudaMalloc'ed ones */

typedef struct reg_handle {
    unsigned magic;
    struct ncclComm *comm;
    void *buff;
    size_t size;
} reg_handle_t;

DSHIM_NCCL_EXPORT ncclResult_t ncclMemAlloc(void **ptr, size_t size)
{
    const char *call = "ncclMemAlloc";
    if (!ptr) {
        return dshim_nccl_fail(ncclInvalidArgument, call, "ptr is NULL");
    }
    *ptr = NULL;
    if (size == 0) {
        return ncclSuccess;
    }
    if (dshim_gpu_present()) {
        dshim_status_t st = dshim_gpu_malloc(ptr, size);
        return st == DSHIM_OK ? ncclSuccess : dshim_nccl_from_dshim(st, call);
    }
    host_block_t *b = malloc(sizeof(*b));
    if (!b || posix_memalign(&b->ptr, 4096, size) != 0) {
        free(b);
        return dshim_nccl_fail(ncclSystemError, call, "out of memory for %zu bytes", size);
    }
    pthread_mutex_lock(&mem_lock);
    b->next = host_blocks;
    host_blocks = b;
    pthread_mutex_unlock(&mem_lock);
    *ptr = b->ptr;
    return ncclSuccess;
}
DSHIM_NCCL_ALIAS(ncclMemAlloc);

DSHIM_NCCL_EXPORT ncclResult_t ncclMemFree(void *ptr)
{
    if (!ptr) {
        return ncclSuccess;
    }
    pthread_mutex_lock(&mem_lock);
    for (host_block_t **pp = &host_blocks; *pp; pp = &(*pp)->next) {
        if ((*pp)->ptr == ptr) {
            host_block_t *b = *pp;
            *pp = b->next;
            pthread_mutex_unlock(&mem_lock);
            free(b->ptr);
            free(b);
            return ncclSuccess;
        }
    }
    pthread_mutex_unlock(&mem_lock);
    if (dshim_gpu_present()) {
        dshim_status_t st = dshim_gpu_free(ptr);
        return st == DSHIM_OK ? ncclSuccess : dshim_nccl_from_dshim(st, "ncclMemFree");
    }
    return dshim_nccl_fail(ncclInvalidArgument, "ncclMemFree", "%p was not allocated by ncclMemAlloc", ptr);
}
DSHIM_NCCL_ALIAS(ncclMemFree);

DSHIM_NCCL_EXPORT ncclResult_t ncclCommRegister(const ncclComm_t comm, void *buff, size_t size, void **handle)
{
    const char *call = "ncclCommRegister";
    ncclResult_t res = dshim_nccl_comm_ready(comm, call);
    if (res != ncclSuccess) {
        return res;
    }
    if (!handle || (!buff && size)) {
        return dshim_nccl_fail(ncclInvalidArgument, call, "%s is NULL", handle ? "buff" : "handle");
    }
    reg_handle_t *h = malloc(sizeof(*h));
    if (!h) {
        return dshim_nccl_fail(ncclSystemError, call, "out of memory");
    }
    *h = (reg_handle_t){.magic = REG_MAGIC, .comm = comm, .buff = buff, .size = size};
    *handle = h;
    return ncclSuccess;
}
DSHIM_NCCL_ALIAS(ncclCommRegister);

DSHIM_NCCL_EXPORT ncclResult_t ncclCommDeregister(const ncclComm_t comm, void *handle)
{
    const char *call = "ncclCommDeregister";
    ncclResult_t res = dshim_nccl_comm_ready(comm, call);
    if (res != ncclSuccess) {
        return res;
    }
    reg_handle_t *h = handle;
    if (!h || h->magic != REG_MAGIC || h->comm != comm) {
        return dshim_nccl_fail(ncclInvalidArgument, call, "handle %p was not registered on this communicator",
                               handle);
    }
    h->magic = 0;
    free(h);
    return ncclSuccess;
}
DSHIM_NCCL_ALIAS(ncclCommDeregister);

DSHIM_NCCL_EXPORT ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win,
                                                      int winFlags)
{
    (void)comm, (void)buff, (void)size, (void)winFlags;
    if (win) {
        *win = NULL;
    }
    return dshim_nccl_fail(ncclInvalidUsage, "ncclCommWindowRegister",
                           "symmetric memory windows (NCCL's device API) are not supported by dshim; use ordinary "
                           "buffers (PyTorch: leave NCCL symmetric memory off)");
}
DSHIM_NCCL_ALIAS(ncclCommWindowRegister);

DSHIM_NCCL_EXPORT ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win)
{
    (void)comm, (void)win;
    return dshim_nccl_fail(ncclInvalidUsage, "ncclCommWindowDeregister",
                           "symmetric memory windows are not supported by dshim");
}
DSHIM_NCCL_ALIAS(ncclCommWindowDeregister);

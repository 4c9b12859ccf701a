/*
 * Internal to backends/transport/shm: single-copy reads and writes of a
 * peer's memory (Linux cross-memory attach, process_vm_readv/writev), the
 * shm transport's peer_read and peer_write (transport.h).
 */
#ifndef DSHIM_SHM_CMA_H
#define DSHIM_SHM_CMA_H

#include <sys/types.h>

#include "transport/transport.h"

/* Lets the ranks of this host read and write this process's memory where Yama's
 * ptrace_scope 1 would allow only its ancestors (as OpenMPI's shared-memory
 * transport does): once per process, when DSHIM_SHM_CMA allows single-copy
 * reads.  Failure is not an error: the first collective's probe finds out. */
void dshim_shm_cma_allow(void);
/* Copies len bytes at `remote` in process pid into buf; `who` names the peer
 * for messages ("rank 1 (job rank 3)").  DSHIM_ERR_PEER when the process is
 * gone, DSHIM_ERR_UNSUPPORTED when the kernel refuses the read (ptrace
 * rules, seccomp, no such system call), DSHIM_ERR_PROTOCOL when the address
 * is not mapped there. */
dshim_status_t dshim_shm_cma_read(pid_t pid, const char *who, void *buf, const void *remote, size_t len);
/* The other direction: len bytes of buf to `remote` in process pid; the
 * same errors (the kernel applies the same rules to both). */
dshim_status_t dshim_shm_cma_write(pid_t pid, const char *who, const void *buf, void *remote, size_t len);

#endif

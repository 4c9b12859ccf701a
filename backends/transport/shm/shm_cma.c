/*
 * Single-copy reads between the ranks of a host: process_vm_readv copies
 * straight from the peer's buffer into ours, where a message through a
 * shared-memory ring is copied twice (into the ring, out of it).  The
 * kernel allows it to a process that may ptrace the peer (same user, and
 * Yama's scope permitting); a container's seccomp profile may refuse it
 * altogether.  Collectives probe it before relying on it
 * (shim/comm/coll_single_copy.c).
 */
#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/uio.h>

#include "status.h"
#include "transport/shm/shm_cma.h"

static void allow_any_reader(void)
{
#ifdef PR_SET_PTRACER
    /* EINVAL without Yama: nothing to allow then */
    (void)prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
#endif
}

void dshim_shm_cma_allow(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, allow_any_reader);
}

dshim_status_t dshim_shm_cma_read(pid_t pid, const char *who, void *buf, const void *remote, size_t len)
{
    char *dst = buf;
    const char *src = remote;
    while (len > 0) {
        struct iovec local = {dst, len}, peer = {(void *)src, len};
        ssize_t n = process_vm_readv(pid, &local, 1, &peer, 1, 0);
        if (n > 0) {
            dst += n;
            src += n;
            len -= (size_t)n;
            continue;
        }
        int e = n == 0 ? EFAULT : errno;
        if (e == EINTR) {
            continue;
        }
        if (e == ESRCH) {
            return dshim_error(DSHIM_ERR_PEER, "shm: peer %s (pid %d) exited while this rank read its buffer",
                               who, (int)pid);
        }
        if (e == EPERM || e == ENOSYS || e == EACCES) {
            return dshim_error(DSHIM_ERR_UNSUPPORTED,
                               "shm: the kernel refused to let this rank read peer %s's memory (process_vm_readv: "
                               "%s): ptrace rules (kernel.yama.ptrace_scope >= 2, another user) or a seccomp "
                               "profile; DSHIM_SHM_CMA=0 turns single-copy reads off",
                               who, strerror(e));
        }
        return dshim_error(DSHIM_ERR_PROTOCOL,
                           "shm: reading %zu bytes at %p in peer %s (pid %d) failed: %s (the peer's buffer is "
                           "not mapped there: did it leave the collective early?)",
                           len, remote, who, (int)pid, strerror(e));
    }
    return DSHIM_OK;
}

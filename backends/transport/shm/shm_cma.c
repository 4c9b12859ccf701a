/*
 * Single-copy transfers between the ranks of a host: process_vm_readv
 * copies straight from the peer's buffer into ours (process_vm_writev from
 * ours into the peer's), where a message through a shared-memory ring is
 * copied twice (into the ring, out of it).  The
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

/* One direction of a single copy: process_vm_readv (into buf from the
 * peer) or process_vm_writev (from buf into the peer), until len bytes moved. */
static dshim_status_t cma_copy(int writing, pid_t pid, const char *who, void *buf, const void *remote, size_t len)
{
    char *mine = buf;
    const char *theirs = remote;
    const char *verb = writing ? "wrote" : "read";
    while (len > 0) {
        struct iovec local = {mine, len}, peer = {(void *)theirs, len};
        ssize_t n = writing ? process_vm_writev(pid, &local, 1, &peer, 1, 0)
                            : process_vm_readv(pid, &local, 1, &peer, 1, 0);
        if (n > 0) {
            mine += n;
            theirs += n;
            len -= (size_t)n;
            continue;
        }
        int e = n == 0 ? EFAULT : errno;
        if (e == EINTR) {
            continue;
        }
        if (e == ESRCH) {
            return dshim_error(DSHIM_ERR_PEER, "shm: peer %s (pid %d) exited while this rank %s its buffer", who,
                               (int)pid, verb);
        }
        if (e == EPERM || e == ENOSYS || e == EACCES) {
            return dshim_error(DSHIM_ERR_UNSUPPORTED,
                               "shm: the kernel refused to let this rank %s peer %s's memory (%s: %s): ptrace "
                               "rules (kernel.yama.ptrace_scope >= 2, another user) or a seccomp profile; "
                               "DSHIM_SHM_CMA=0 turns single-copy transfers off",
                               writing ? "write" : "read", who, writing ? "process_vm_writev" : "process_vm_readv",
                               strerror(e));
        }
        return dshim_error(DSHIM_ERR_PROTOCOL,
                           "shm: %s %zu bytes at %p in peer %s (pid %d) failed: %s (the peer's buffer is not "
                           "mapped there: did it leave the collective early?)",
                           writing ? "writing" : "reading", len, remote, who, (int)pid, strerror(e));
    }
    return DSHIM_OK;
}

dshim_status_t dshim_shm_cma_read(pid_t pid, const char *who, void *buf, const void *remote, size_t len)
{
    return cma_copy(0, pid, who, buf, remote, len);
}

dshim_status_t dshim_shm_cma_write(pid_t pid, const char *who, const void *buf, void *remote, size_t len)
{
    return cma_copy(1, pid, who, (void *)buf, remote, len);
}

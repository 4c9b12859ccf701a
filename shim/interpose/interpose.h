/* Process-wide interposition of dlsym, for any hook whose framework finds its
 * C functions with dlsym(handle, name) (MXNet's ctypes.CDLL(RTLD_LOCAL) does:
 * an LD_PRELOAD definition never shadows such a look-up).  libdshim.so exports
 * dlsym; a hook registers the names it answers for and a function that gives
 * its implementation.  Every other look-up goes to glibc's dlsym unchanged,
 * with the caller's return address kept (RTLD_NEXT stays relative to the
 * caller).  Nothing here knows a framework. */
#ifndef DSHIM_INTERPOSE_H
#define DSHIM_INTERPOSE_H

#include "dshim.h"

/* How many hooks may register (each registers once, at load). */
#define DSHIM_DLSYM_MAX_CLIENTS 4

typedef struct dshim_dlsym_client {
    /* The names this hook answers for, NULL-terminated: "Foo*" is every name
     * that starts with "Foo", any other entry one exact name.  Matched for
     * every dlsym of the process, also while a sanitizer runtime initialises,
     * so the matching is done here, uninstrumented; the strings must live
     * as long as the process. */
    const char *const *names;
    /* Called for dlsym(handle, name) with a matching name and a real handle
     * (RTLD_DEFAULT and RTLD_NEXT look-ups always go to glibc): the hook's
     * function, or NULL to let glibc's dlsym answer. */
    void *(*answer)(void *handle, const char *name);
} dshim_dlsym_client_t;

/* Registers a client (it must outlive the process: a static).  Call it from a
 * constructor, before the framework looks anything up. */
dshim_status_t dshim_dlsym_register(const dshim_dlsym_client_t *client);

/* glibc's dlsym, for look-ups that must not come back to a client. */
void *dshim_real_dlsym(void *handle, const char *name);

#endif

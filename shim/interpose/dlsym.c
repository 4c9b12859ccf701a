/* The exported dlsym: asks the registered clients (interpose.h) about the
 * look-up and otherwise forwards to glibc's dlsym.
 *
 * The forwarding must keep the caller's return address: glibc's dlsym uses it
 * to resolve RTLD_NEXT relative to the calling object (sanitizers, CUDA and
 * other interposers rely on that).  On x86-64 the entry is a few lines of
 * assembly that ask the clients and then jump (not call) to the real dlsym;
 * elsewhere a C tail call does the same at -O2. */
#include <dlfcn.h>
#include <pthread.h>

#include "interpose.h"
#include "status.h"

typedef void *(*dlsym_fn_t)(void *, const char *);

__attribute__((visibility("hidden"))) dlsym_fn_t dshim_interpose_real_dlsym_ptr;
__attribute__((visibility("hidden"))) void *dshim_interpose_dlsym_hook(void *handle, const char *name);

/* The sanitizers' runtimes call dlsym while they initialise, before their
 * shadow memory and thread state exist; code instrumented by them would crash
 * there (sanitizer builds of dshim's own tests).  So everything a look-up
 * of an uninteresting name runs is uninstrumented and calls nothing but
 * dlvsym, which no sanitizer intercepts, and no lock. */
#define DSHIM_UNINSTRUMENTED __attribute__((no_sanitize("address", "thread", "undefined")))

/* Written once each, before the count that publishes them (release); read
 * without a lock on every look-up (acquire). */
static const dshim_dlsym_client_t *clients[DSHIM_DLSYM_MAX_CLIENTS];
static int nclients;
static pthread_mutex_t register_mu = PTHREAD_MUTEX_INITIALIZER;

/* glibc's dlsym; resolving it twice in a race is harmless (same answer) */
static DSHIM_UNINSTRUMENTED dlsym_fn_t real_dlsym(void)
{
    dlsym_fn_t fn = __atomic_load_n(&dshim_interpose_real_dlsym_ptr, __ATOMIC_ACQUIRE);
    if (fn != NULL) {
        return fn;
    }
    /* the version names glibc's dlsym (2.34 moved it from libdl into libc) */
    void *p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (p == NULL) {
        p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    }
    if (p == NULL) {
        p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.17"); /* aarch64 */
    }
    fn = (dlsym_fn_t)p;
    __atomic_store_n(&dshim_interpose_real_dlsym_ptr, fn, __ATOMIC_RELEASE);
    return fn;
}

void *dshim_real_dlsym(void *handle, const char *name)
{
    return real_dlsym()(handle, name);
}

dshim_status_t dshim_dlsym_register(const dshim_dlsym_client_t *client)
{
    pthread_mutex_lock(&register_mu);
    int n = __atomic_load_n(&nclients, __ATOMIC_RELAXED);
    if (n == DSHIM_DLSYM_MAX_CLIENTS) {
        pthread_mutex_unlock(&register_mu);
        return dshim_error(DSHIM_ERR_INTERNAL, "dlsym interposer: more than %d hooks registered; raise "
                           "DSHIM_DLSYM_MAX_CLIENTS in shim/interpose/interpose.h", DSHIM_DLSYM_MAX_CLIENTS);
    }
    clients[n] = client;
    __atomic_store_n(&nclients, n + 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&register_mu);
    return DSHIM_OK;
}

/* 1 when name matches pattern ("X*": starts with X), by hand: no libc call here */
static DSHIM_UNINSTRUMENTED int name_matches(const char *name, const char *pattern)
{
    unsigned i = 0;
    for (; pattern[i] != '\0'; i++) {
        if (pattern[i] == '*' && pattern[i + 1] == '\0') {
            return 1;
        }
        if (name[i] != pattern[i]) {
            return 0;
        }
    }
    return name[i] == '\0';
}

/* The first client that claims the name, or NULL. */
static DSHIM_UNINSTRUMENTED const dshim_dlsym_client_t *client_for(const char *name)
{
    int n = __atomic_load_n(&nclients, __ATOMIC_ACQUIRE);
    for (int c = 0; c < n; c++) {
        for (const char *const *p = clients[c]->names; *p != NULL; p++) {
            if (name_matches(name, *p)) {
                return clients[c];
            }
        }
    }
    return NULL;
}

/* NULL: let the real dlsym answer (the caller's own lookup, unchanged). */
DSHIM_UNINSTRUMENTED void *dshim_interpose_dlsym_hook(void *handle, const char *name)
{
    real_dlsym(); /* the entry below jumps through the pointer */
    if (name == NULL || handle == RTLD_NEXT || handle == RTLD_DEFAULT) {
        return NULL;
    }
    const dshim_dlsym_client_t *client = client_for(name);
    return client != NULL ? client->answer(handle, name) : NULL;
}

#if defined(__x86_64__)
__asm__(".text\n"
        ".globl dlsym\n"
        ".type dlsym, @function\n"
        "dlsym:\n"
        "    endbr64\n" /* a landing pad under CET/IBT; a no-op elsewhere */
        "    pushq %rdi\n"
        "    pushq %rsi\n"
        "    subq $8, %rsp\n"
        "    call dshim_interpose_dlsym_hook\n"
        "    addq $8, %rsp\n"
        "    popq %rsi\n"
        "    popq %rdi\n"
        "    testq %rax, %rax\n"
        "    jz 1f\n"
        "    ret\n"
        "1:\n"
        "    jmp *dshim_interpose_real_dlsym_ptr(%rip)\n"
        ".size dlsym, .-dlsym\n");
#else
__attribute__((visibility("default"))) void *dlsym(void *handle, const char *name)
{
    void *ours = dshim_interpose_dlsym_hook(handle, name);
    if (ours != NULL) {
        return ours;
    }
    return real_dlsym()(handle, name); /* a tail call at -O2 */
}
#endif

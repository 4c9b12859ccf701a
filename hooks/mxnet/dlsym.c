/* dlsym interposition: MXNet's Python opens libmxnet with
 * ctypes.CDLL(RTLD_LOCAL) and finds every C function with dlsym(handle, name),
 * which an LD_PRELOAD definition of MXKVStorePush would never shadow.  So
 * libdshim.so exports dlsym itself: for the name of a function taking a
 * KVStoreHandle (MXKVStore*, and the process profiler's four) looked up in a
 * library that defines it (libmxnet), it returns dshim's implementation;
 * everything else goes to glibc's dlsym untouched.
 *
 * The forwarding must keep the caller's return address: glibc's dlsym uses it
 * to resolve RTLD_NEXT relative to the calling object (sanitizers, CUDA and
 * other interposers rely on that).  On x86-64 the entry is a few lines of
 * assembly that ask the hook and then jump (not call) to the real dlsym;
 * elsewhere a C tail call does the same at -O2. */
#include <dlfcn.h>
#include <string.h>

#include "config.h"
#include "mxnet/mx_api.h"

typedef void *(*dlsym_fn_t)(void *, const char *);

__attribute__((visibility("hidden"))) dlsym_fn_t dshim_real_dlsym_ptr;
__attribute__((visibility("hidden"))) void *dshim_mx_dlsym_hook(void *handle, const char *name);

/* The sanitizers' runtimes call dlsym while they initialise, before their
 * shadow memory and thread state exist; code instrumented by them would crash
 * there (sanitizer builds of dshim's own tests).  So everything a look-up
 * of an uninteresting name runs is uninstrumented and calls nothing but
 * dlvsym, which no sanitizer intercepts, and no lock. */
#define DSHIM_UNINSTRUMENTED __attribute__((no_sanitize("address", "thread", "undefined")))

/* glibc's dlsym; resolving it twice in a race is harmless (same answer) */
static DSHIM_UNINSTRUMENTED dlsym_fn_t real_dlsym(void)
{
    dlsym_fn_t fn = __atomic_load_n(&dshim_real_dlsym_ptr, __ATOMIC_ACQUIRE);
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
    __atomic_store_n(&dshim_real_dlsym_ptr, fn, __ATOMIC_RELEASE);
    return fn;
}

void *dshim_mx_real_dlsym(void *handle, const char *name)
{
    return real_dlsym()(handle, name);
}

/* 1 when name starts with prefix (whole: exact), by hand: no libc call here */
static DSHIM_UNINSTRUMENTED int name_is(const char *name, const char *prefix, int whole)
{
    unsigned i = 0;
    for (; prefix[i] != '\0'; i++) {
        if (name[i] != prefix[i]) {
            return 0;
        }
    }
    return !whole || name[i] == '\0';
}

/* The functions of libmxnet that take a KVStoreHandle: every MXKVStore* one,
 * and the process profiler's four (they cast the handle to MXNet's KVStore
 * when asked to profile the servers: dshim's handle must never reach them). */
static DSHIM_UNINSTRUMENTED int interesting(const char *name)
{
    if (name == NULL || name[0] != 'M' || name[1] != 'X') {
        return 0;
    }
    return name_is(name, "MXKVStore", 0) || name_is(name, "MXSetProcessProfilerConfig", 1) ||
           name_is(name, "MXSetProcessProfilerState", 1) || name_is(name, "MXDumpProcessProfile", 1) ||
           name_is(name, "MXProcessProfilePause", 1);
}

static void *mx_lookup(void *handle, const char *name);

/* NULL: let the real dlsym answer (the caller's own lookup, unchanged). */
DSHIM_UNINSTRUMENTED void *dshim_mx_dlsym_hook(void *handle, const char *name)
{
    real_dlsym(); /* the entry below jumps through the pointer */
    if (!interesting(name) || handle == RTLD_NEXT || handle == RTLD_DEFAULT) {
        return NULL;
    }
    return mx_lookup(handle, name);
}

/* A name taking a KVStoreHandle: dshim's implementation when handle is MXNet's library. */
static void *mx_lookup(void *handle, const char *name)
{
    void *ours = dshim_mx_kvstore_lookup(name);
    if (ours == NULL || !dshim_config()->mxnet_takeover) {
        return NULL;
    }
    /* only inside a library that really is MXNet */
    if (real_dlsym()(handle, name) == NULL || dshim_mx_api_bind(handle) != 0) {
        return NULL;
    }
    return ours;
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
        "    call dshim_mx_dlsym_hook\n"
        "    addq $8, %rsp\n"
        "    popq %rsi\n"
        "    popq %rdi\n"
        "    testq %rax, %rax\n"
        "    jz 1f\n"
        "    ret\n"
        "1:\n"
        "    jmp *dshim_real_dlsym_ptr(%rip)\n"
        ".size dlsym, .-dlsym\n");
#else
__attribute__((visibility("default"))) void *dlsym(void *handle, const char *name)
{
    void *ours = dshim_mx_dlsym_hook(handle, name);
    if (ours != NULL) {
        return ours;
    }
    return real_dlsym()(handle, name); /* a tail call at -O2 */
}
#endif

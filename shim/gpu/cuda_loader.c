/*
 * Loads the CUDA reduction backend, libdshim-cuda.so, on first use.  It is a
 * separate library so that libdshim.so itself never depends on the CUDA
 * runtime: hosts without CUDA load dshim as usual and just get no "cuda" ops.
 *
 * Where it is looked for, in order: the directory of the object holding this
 * code (libdshim.so, or a test executable linking the core statically), that
 * directory's ../lib (a build or install tree keeps executables in bin/ and
 * libraries in lib/), then the plain name through the dynamic loader's search
 * path (LD_LIBRARY_PATH, the executable's RPATH, ld.so.cache).
 */
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "reduce/cuda/reduce_cuda.h"
#include "cuda_loader.h"
#include "status.h"

/*
 * A library that was opened stays open, even when it is not used: by then
 * the CUDA runtime (and, in sanitizer builds, instrumented code) may have
 * registered exit handlers inside it, and dlclose would leave those pointing
 * at unmapped code -- ThreadSanitizer builds crash at exit that way.  The
 * cost is the mappings, once per process, only where something asked for
 * the CUDA backend.
 */
static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static void *lib_handle; /* set only when the backend is usable */
static const dshim_reduce_ops_t *cuda_ops;

/* What the library borrows from this core (see reduce_cuda.h). */
static const dshim_cuda_host_t host_table = {
    .size = sizeof(dshim_cuda_host_t),
    .error = dshim_error,
};

/* The directory of the object this function was linked into, or "" . */
static void own_dir(char *dir, size_t len)
{
    Dl_info info;
    char path[PATH_MAX];
    dir[0] = '\0';
    if (dladdr((void *)own_dir, &info) == 0 || info.dli_fname == NULL) {
        return;
    }
    /* the main program may be reported by its bare argv[0] */
    if (strchr(info.dli_fname, '/') != NULL) {
        if (realpath(info.dli_fname, path) == NULL) {
            return;
        }
    } else {
        ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
        if (n <= 0) {
            return;
        }
        path[n] = '\0';
    }
    char *slash = strrchr(path, '/');
    if (slash == NULL) {
        return;
    }
    *slash = '\0';
    snprintf(dir, len, "%s", path);
}

/* dlopen the library from the candidates above; on failure *why names the
 * last dlerror (the plain-name attempt: the one a user can act on). */
static void *open_library(char *why, size_t why_len)
{
    char dir[PATH_MAX];
    char path[PATH_MAX + 64];
    own_dir(dir, sizeof(dir));
    if (dir[0] != '\0') {
        static const char *const subdirs[] = {"", "/../lib"};
        for (size_t i = 0; i < sizeof(subdirs) / sizeof(subdirs[0]); i++) {
            snprintf(path, sizeof(path), "%s%s/%s", dir, subdirs[i], DSHIM_CUDA_LIB_NAME);
            if (access(path, F_OK) != 0) {
                continue;
            }
            void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
            if (h != NULL) {
                DSHIM_TRACE("cuda reduce: loaded %s", path);
                return h;
            }
            /* present but unloadable (e.g. libcudart missing): say so */
            snprintf(why, why_len, "%s", dlerror());
            return NULL;
        }
    }
    void *h = dlopen(DSHIM_CUDA_LIB_NAME, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        snprintf(why, why_len, "%s", dlerror());
    }
    return h;
}

static void load(void)
{
    char why[512] = "";
    dshim_log_init(); /* so the INFO lines below honour DSHIM_DEBUG */
    void *h = open_library(why, sizeof(why));
    if (h == NULL) {
        DSHIM_INFO("cuda reduction backend not available (%s); device buffers cannot be "
                   "reduced: build dshim with nvcc to get %s", why, DSHIM_CUDA_LIB_NAME);
        return;
    }
    dshim_cuda_bind_fn bind = (dshim_cuda_bind_fn)dlsym(h, "dshim_cuda_bind");
    dshim_cuda_device_count_fn count =
        (dshim_cuda_device_count_fn)dlsym(h, "dshim_cuda_device_count");
    dshim_reduce_cuda_ops_fn ops = (dshim_reduce_cuda_ops_fn)dlsym(h, "dshim_reduce_cuda_ops");
    if (bind == NULL || count == NULL || ops == NULL) {
        DSHIM_INFO("cuda reduction backend not available: %s lacks its entry points (%s); "
                   "rebuild it with this version of dshim", DSHIM_CUDA_LIB_NAME, dlerror());
        return;
    }
    const char *no_dev = "";
    int ndev = count(&no_dev);
    if (ndev <= 0) {
        DSHIM_INFO("cuda reduction backend not used: no cuda device (%s)", no_dev);
        return;
    }
    bind(&host_table);
    lib_handle = h;
    cuda_ops = ops();
    DSHIM_INFO("cuda reduction backend loaded: %d device(s)", ndev);
}

const dshim_reduce_ops_t *dshim_reduce_cuda_load(void)
{
    pthread_once(&load_once, load);
    return cuda_ops;
}

void *dshim_reduce_cuda_symbol(const char *name)
{
    pthread_once(&load_once, load);
    return lib_handle != NULL ? dlsym(lib_handle, name) : NULL;
}

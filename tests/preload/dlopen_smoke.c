/* Loads libdshim.so with dlopen(RTLD_NOW) the way a framework hook or a
 * ctypes user would, resolves the API by name and runs a 1-rank allreduce. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "dshim.h"

typedef dshim_status_t (*init_fn)(const dshim_comm_args_t *, dshim_comm_t **);
typedef dshim_status_t (*allreduce_fn)(dshim_comm_t *, const void *, void *, size_t, dshim_dtype_t, dshim_redop_t);
typedef dshim_status_t (*destroy_fn)(dshim_comm_t *);

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: dlopen_smoke path/to/libdshim.so\n");
        return 2;
    }
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "dlopen failed: %s\n", dlerror());
        return 1;
    }
    init_fn init = (init_fn)dlsym(h, "dshim_comm_init");
    allreduce_fn allreduce = (allreduce_fn)dlsym(h, "dshim_allreduce");
    destroy_fn destroy = (destroy_fn)dlsym(h, "dshim_comm_destroy");
    if (!init || !allreduce || !destroy) {
        fprintf(stderr, "missing exported symbol: %s\n", dlerror());
        return 1;
    }
    if (dlsym(h, "dshim_xfer") || dlsym(h, "dshim_config")) {
        fprintf(stderr, "internal symbols are exported\n");
        return 1;
    }
    dshim_comm_args_t a = {.rank = 0, .size = 1, .store_addr = "127.0.0.1", .store_port = 0, .token = "x"};
    dshim_comm_t *comm;
    if (init(&a, &comm) != DSHIM_OK) {
        return 1;
    }
    float v[3] = {1, 2, 3}, out[3];
    if (allreduce(comm, v, out, 3, DSHIM_FLOAT32, DSHIM_SUM) != DSHIM_OK || memcmp(v, out, sizeof(v))) {
        return 1;
    }
    destroy(comm);
    dlclose(h);
    printf("dlopen smoke: 1 passed, 0 failed\n");
    return 0;
}

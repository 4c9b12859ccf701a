/*
 * A C program on dshim's public API (dshim.h), built against an installed dshim:
 *
 *   cc allreduce.c $(pkg-config --cflags --libs dshim) -o allreduce     # or CMakeLists.txt here
 *   dshim-run --nproc-per-node 2 ./allreduce
 *
 * dshim-run sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, which
 * dshim_comm_init_env reads.  Each rank sums 1M floats holding rank+1 and checks
 * the result; it prints where its libdshim.so was loaded from.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include <dshim.h>

#define COUNT (1u << 20)

int main(void)
{
    if (dshim_abi_version() < DSHIM_VERSION_MAJOR * 10000 + DSHIM_VERSION_MINOR * 100 + DSHIM_VERSION_PATCH) {
        fprintf(stderr, "allreduce: libdshim.so is older than the dshim.h this program was built with\n");
        return 1;
    }
    dshim_comm_t *comm = NULL;
    if (dshim_comm_init_env(&comm) != DSHIM_OK) {
        fprintf(stderr, "allreduce: %s\n", dshim_last_error());
        return 1;
    }
    int rank = dshim_comm_rank(comm), size = dshim_comm_size(comm);
    float *buf = malloc(COUNT * sizeof(float));
    if (buf == NULL) {
        return 1;
    }
    for (unsigned i = 0; i < COUNT; i++) {
        buf[i] = (float)(rank + 1);
    }
    dshim_status_t st = dshim_allreduce(comm, buf, buf, COUNT, DSHIM_FLOAT32, DSHIM_SUM);
    if (st != DSHIM_OK) {
        fprintf(stderr, "allreduce: rank %d: %s\n", rank, dshim_last_error());
        return 1;
    }
    const float want = (float)size * (size + 1) / 2;
    unsigned bad = 0;
    for (unsigned i = 0; i < COUNT; i++) {
        bad += buf[i] != want;
    }
    Dl_info where = {0};
    dladdr((void *)dshim_comm_init_env, &where);
    printf("rank %d/%d: allreduce of %u floats %s (each %g) over %s; libdshim %s\n", rank, size, COUNT,
           bad ? "WRONG" : "correct", (double)want, dshim_comm_transport(comm),
           where.dli_fname ? where.dli_fname : "?");
    free(buf);
    dshim_comm_destroy(comm);
    return bad ? 1 : 0;
}

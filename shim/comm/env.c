/* Which rank am I, how many are we, where is the store: from the variables
 * of whatever launched us (dshim-run, torchrun, mpirun, srun). */
#include <stdio.h>
#include <string.h>

#include "bootstrap.h"
#include "config.h"
#include "status.h"

#define DEFAULT_STORE_PORT 29500

static char derived_token[128];

dshim_status_t dshim_args_from_env(dshim_comm_args_t *args)
{
    const dshim_config_t *cfg = dshim_config();
    const char *rank_src = NULL, *size_src = NULL;
    long rank = -1, size = -1;
    struct {
        long v;
        const char *name;
    } ranks[] = {{cfg->rank, "DSHIM_RANK"},
                 {cfg->env_rank, "RANK"},
                 {cfg->ompi_rank, "OMPI_COMM_WORLD_RANK"},
                 {cfg->pmi_rank, "PMI_RANK"},
                 {cfg->slurm_procid, "SLURM_PROCID"}},
      sizes[] = {{cfg->world_size, "DSHIM_WORLD_SIZE"},
                 {cfg->env_world_size, "WORLD_SIZE"},
                 {cfg->ompi_size, "OMPI_COMM_WORLD_SIZE"},
                 {cfg->pmi_size, "PMI_SIZE"},
                 {cfg->slurm_ntasks, "SLURM_NTASKS"}};
    for (size_t i = 0; i < sizeof(ranks) / sizeof(ranks[0]); i++) {
        if (rank < 0 && ranks[i].v >= 0) {
            rank = ranks[i].v;
            rank_src = ranks[i].name;
        }
        if (size < 0 && sizes[i].v >= 0) {
            size = sizes[i].v;
            size_src = sizes[i].name;
        }
    }
    if (rank < 0 || size < 0) {
        return dshim_error(DSHIM_ERR_INVALID,
                           "cannot tell this process's rank and world size: set RANK and WORLD_SIZE (or DSHIM_RANK/"
                           "DSHIM_WORLD_SIZE), or start the job with dshim-run, torchrun, mpirun or srun");
    }
    if (size < 1 || rank >= size) {
        return dshim_error(DSHIM_ERR_INVALID, "rank %ld (from %s) is not below the world size %ld (from %s)", rank,
                           rank_src, size, size_src);
    }
    const char *addr = cfg->store_addr[0] ? cfg->store_addr : cfg->master_addr;
    if (!addr[0]) {
        if (size == 1) {
            addr = "127.0.0.1";
        } else {
            return dshim_error(DSHIM_ERR_INVALID,
                               "no rendezvous address: set MASTER_ADDR (and MASTER_PORT) to rank 0's host, or "
                               "DSHIM_STORE_ADDR; dshim-run sets them for you");
        }
    }
    long port = cfg->store_port >= 0 ? cfg->store_port : cfg->master_port;
    if (port < 0) {
        port = DEFAULT_STORE_PORT;
    }
    if (port == 0 && size > 1) {
        return dshim_error(DSHIM_ERR_INVALID, "store port 0 only works for a single rank; set MASTER_PORT");
    }
    if (port > 65535) {
        return dshim_error(DSHIM_ERR_INVALID, "store port %ld is not a TCP port (1-65535); fix MASTER_PORT or "
                           "DSHIM_STORE_PORT", port);
    }
    memset(args, 0, sizeof(*args));
    args->rank = (int)rank;
    args->size = (int)size;
    args->store_addr = addr;
    args->store_port = (int)port;
    args->store_external = cfg->store_external;
    if (cfg->job_token[0]) {
        args->token = cfg->job_token;
    } else {
        /* Without a launcher-provided secret, a token derived from public
         * facts still keeps other jobs' stray connections out. */
        snprintf(derived_token, sizeof(derived_token), "dshim-derived:%s:%ld:%ld", addr, port, size);
        args->token = derived_token;
    }
    return DSHIM_OK;
}

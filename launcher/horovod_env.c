/*
 * --horovod-env: the variables horovodrun's gloo launcher gives every rank
 * (horovod/runner/gloo_run.py create_slot_env_vars and create_run_env_vars),
 * so that Horovod scripts and dshim's Horovod layer see the identity Horovod
 * would give them.  The placement is Horovod's (runner/common/util/hosts.py
 * get_host_assignments): ranks fill the hosts in order, a host's local ranks
 * in order; the cross rank of (host, local rank L) is the number of earlier
 * hosts that also have a local rank L, the cross size the number of hosts
 * that have one.  horovodrun writes each host's share as its slots=N, so the
 * counts here are final.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "run.h"

int run_node_procs(const run_opts_t *o, int node)
{
    if (o->node_nprocs) {
        return o->node_nprocs[node];  /* per-node runs: what that node's dshim-run said at the rendezvous */
    }
    if (o->horovod_env && o->hostfile && node < o->nhosts && o->hosts[node].slots > 0) {
        return o->hosts[node].slots;
    }
    return o->nproc_per_node;
}

void run_horovod_common_env(run_strv_t *common)
{
    /* dshim negotiates and carries the operations itself; Horovod's own values for its gloo mode */
    run_strv_setenv(common, "HOROVOD_CONTROLLER", "gloo");
    run_strv_setenv(common, "HOROVOD_CPU_OPERATIONS", "gloo");
    /* as gloo_run.py: output is not held back in the ranks' buffers */
    run_strv_setenv(common, "PYTHONUNBUFFERED", "1");
    /* a real Horovod's ranks would wait for horovodrun's HTTP rendezvous, which dshim-run does not
     * run: the ranks import dshim's Horovod layer unless the user chose otherwise */
    if (!dshim_config_is_set("DSHIM_HOROVOD")) {
        run_strv_setenv(common, "DSHIM_HOROVOD", "1");
    }
}

static const char *host_name(const run_opts_t *o, int node, char *buf, size_t len)
{
    if (o->hostfile && node < o->nhosts) {
        const char *at = strchr(o->hosts[node].name, '@');
        return at ? at + 1 : o->hosts[node].name;
    }
    if (o->hostfile || o->launcher == RUN_LAUNCHER_SLURM) {
        return NULL;  /* placed by mpirun/srun: not known here */
    }
    /* one node, or every node's own dshim-run (per-node mode): this host */
    if (gethostname(buf, len) != 0) {
        return NULL;
    }
    buf[len - 1] = '\0';
    return buf;
}

void run_horovod_rank_env(const run_opts_t *o, int node, int local_rank, int rank, int world, run_strv_t *env)
{
    int cross_rank = 0, cross_size = 0;
    for (int n = 0; n < o->nnodes; n++) {
        if (run_node_procs(o, n) > local_rank) {
            cross_size++;
            cross_rank += n < node;
        }
    }
    char buf[256];
    const char *host = host_name(o, node, buf, sizeof(buf));
    if (host) {
        run_strv_setenv(env, "HOROVOD_HOSTNAME", "%s", host);
    }
    run_strv_setenv(env, "HOROVOD_RANK", "%d", rank);
    run_strv_setenv(env, "HOROVOD_SIZE", "%d", world);
    run_strv_setenv(env, "HOROVOD_LOCAL_RANK", "%d", local_rank);
    run_strv_setenv(env, "HOROVOD_LOCAL_SIZE", "%d", run_node_procs(o, node));
    run_strv_setenv(env, "HOROVOD_CROSS_RANK", "%d", cross_rank);
    run_strv_setenv(env, "HOROVOD_CROSS_SIZE", "%d", cross_size);
}

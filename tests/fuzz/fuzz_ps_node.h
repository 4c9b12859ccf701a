/*
 * A parameter-server node (shim/ps/ps_proto.h) as the fuzz targets need it:
 * the fields a server's loop or a worker's receiver reads, without the
 * scheduler connection and threads dshim_ps_node_start would make.
 */
#ifndef DSHIM_FUZZ_PS_NODE_H
#define DSHIM_FUZZ_PS_NODE_H

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_proto.h"

#define FUZZ_TOKEN "fuzz-token"

static inline dshim_ps_node_t *fuzz_ps_node_new(dshim_ps_role_t role, int num_workers, int num_servers)
{
    dshim_ps_node_t *node = calloc(1, sizeof(*node));
    node->env.role = role;
    node->env.num_workers = num_workers;
    node->env.num_servers = num_servers;
    node->env.timeout_s = 2.0;
    node->env.connect_timeout_s = 2.0;
    node->env.task_id = -1;
    snprintf(node->env.token, sizeof(node->env.token), "%s", FUZZ_TOKEN);
    node->sched_fd = node->listen_fd = -1;
    node->wake_pipe[0] = node->wake_pipe[1] = -1;
    node->recv_pipe[0] = node->recv_pipe[1] = -1;
    pthread_mutex_init(&node->send_mu, NULL);
    pthread_mutex_init(&node->mu, NULL);
    pthread_cond_init(&node->cond, NULL);
    pthread_mutex_init(&node->pend_mu, NULL);
    pthread_cond_init(&node->pend_cond, NULL);
    /* Its connection's end is the only way a fuzzed stream stops.  The
     * server then waits up to 2 s for the scheduler to name the dead peer
     * (dshim_ps_wait_failure); a failure already on record ends that wait
     * at once. */
    snprintf(node->failure, sizeof(node->failure), "fuzz: the stream ended");
    return node;
}

static inline void fuzz_ps_node_free(dshim_ps_node_t *node)
{
    pthread_mutex_destroy(&node->send_mu);
    pthread_mutex_destroy(&node->mu);
    pthread_cond_destroy(&node->cond);
    pthread_mutex_destroy(&node->pend_mu);
    pthread_cond_destroy(&node->pend_cond);
    free(node->servers);
    free(node->server_fds);
    free(node->server_local);
    free(node->pending);
    free(node);
}

#endif

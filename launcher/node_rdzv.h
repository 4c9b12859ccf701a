/* The rendezvous of the nodes' launchers when every node runs its own dshim-run (node_rdzv.c). */
#ifndef DSHIM_RUN_NODE_RDZV_H
#define DSHIM_RUN_NODE_RDZV_H

#include "run.h"

/* Node 0 starts the job's store (kept in plan->store_server for the controller); every node
 * posts its record, waits for every node's (a progress line every few seconds, exit 2 past
 * DSHIM_CONNECT_TIMEOUT or on a disagreement, the same line on every node) and sets
 * o->node_nprocs.  host: this node's address as the others are told it. */
void run_node_rendezvous(run_opts_t *o, run_plan_t *plan, int attempt, const char *host);

#endif

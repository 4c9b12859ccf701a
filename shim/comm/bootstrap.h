/* Joining a communicator: store, peer table, connection mesh, transports. */
#ifndef DSHIM_BOOTSTRAP_H
#define DSHIM_BOOTSTRAP_H

#include "comm.h"

/* Resolves rank, size, store address/port and token from the environment
 * (see params.def for the order of precedence). Strings point into static
 * storage or the config. */
dshim_status_t dshim_args_from_env(dshim_comm_args_t *args);

/* Builds a communicator whose store is already connected: publishes this
 * rank and connects to every peer through the transports. */
dshim_status_t dshim_bootstrap(dshim_store_ref_t *store, const char *prefix, int rank, int size,
                               const char *token, dshim_comm_t **comm_p);
/* Frees everything dshim_bootstrap built (connections, transports' state, tables). */
void dshim_comm_release(dshim_comm_t *comm);
/* Barrier through the store (bootstrap and teardown only). */
dshim_status_t dshim_store_barrier(dshim_store_t *store, const char *prefix, const char *name, int size,
                                   double timeout_s);
uint64_t dshim_token_hash(const char *token, const char *prefix);

#endif

/* Joining a communicator: store, peer table, transports; connections on first use. */
#ifndef DSHIM_BOOTSTRAP_H
#define DSHIM_BOOTSTRAP_H

#include "comm.h"

/* Resolves rank, size, store address/port and token from the environment
 * (see params.def for the order of precedence). Strings point into static
 * storage or the config. */
dshim_status_t dshim_args_from_env(dshim_comm_args_t *args);

/* Builds a communicator whose store is already connected: publishes this
 * rank, reads every peer's record and starts the acceptor; connections to
 * peers are made on first use (comm.h, dshim_comm_connect_start).
 * job_rank (NULL for a top-level communicator) becomes comm->job_rank and is
 * freed with it, also on failure: it is in place before the acceptor thread
 * starts, which reads it when it publishes a connection. */
dshim_status_t dshim_bootstrap(dshim_store_ref_t *store, const char *prefix, int rank, int size,
                               int *job_rank, const char *token, dshim_comm_t **comm_p);
/* Frees everything dshim_bootstrap built (connections, transports' state, tables). */
void dshim_comm_release(dshim_comm_t *comm);
uint64_t dshim_token_hash(const char *token, const char *prefix);

#endif

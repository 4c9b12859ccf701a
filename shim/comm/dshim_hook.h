/*
 * What a framework hook (hooks/<framework>) may ask of a communicator beyond
 * the public API in include/dshim.h: the communicator module's public face.
 * Hooks include this header, never the communicator's private ones (comm.h,
 * engine.h, xfer.h): cmake/layers.txt lists it as comm's only public header,
 * and scripts/check_layers.py fails the build on any other include of comm
 * from outside.  shim/comm/hook_api.c implements it.
 *
 * Store keys passed here are relative to the communicator: the core puts them
 * under the communicator's own key prefix, so the ranks of one communicator
 * see each other's keys and no other communicator's.
 */
#ifndef DSHIM_HOOK_H
#define DSHIM_HOOK_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "dshim.h"

/* 1 once the communicator has failed (its error is sticky), else 0; any thread. */
int dshim_hook_failed(const dshim_comm_t *comm);
/* 1 when this process created comm (a forked child holds a copy it must not use). */
int dshim_hook_owned_here(const dshim_comm_t *comm);
/* DSHIM_OK in the process that created comm; otherwise an error naming `what`. */
dshim_status_t dshim_hook_check_owner(const dshim_comm_t *comm, const char *what);
/* The number of ranks of comm on this host, this one included. */
int dshim_hook_local_size(const dshim_comm_t *comm);
/* comm is driven by a background thread while the application's thread
 * computes: its waits count two busy threads per rank when they decide
 * whether this host's cores are oversubscribed (then every poll yields the
 * core, instead of pause-spinning on the core the application needs).
 * Every rank of comm calls it alike, before comm's first collective: the
 * algorithm choices depend on it. */
void dshim_hook_shares_cores(dshim_comm_t *comm);
/* The communicator's limit on an operation without progress, in seconds
 * (DSHIM_TIMEOUT or dshim_comm_set_timeout; 0 = none): what an engine that
 * splits a private communicator from it gives that one too. */
double dshim_hook_timeout(const dshim_comm_t *comm);
/* 1 for a communicator made by dshim_comm_init (not by a split). */
int dshim_hook_is_world(const dshim_comm_t *comm);
/* "rank 3 (host h, pid p)", for messages. */
void dshim_hook_describe_peer(const dshim_comm_t *comm, int peer, char *out, size_t len);

/* The communicator's part of the rendezvous store (see above).  try_get:
 * DSHIM_OK and a malloc'ed copy, DSHIM_INPROGRESS when the key is not set
 * (yet), another error when the store cannot be reached. */
dshim_status_t dshim_hook_store_set(dshim_comm_t *comm, const char *key, const void *val, size_t len);
dshim_status_t dshim_hook_store_try_get(dshim_comm_t *comm, const char *key, void **val, size_t *len);
/* How many ranks of the job have destroyed their world communicator so far
 * (the store host waits for all of them before it stops); -1 if the store is gone. */
int64_t dshim_hook_goodbyes(dshim_comm_t *comm);

/* Fails comm with st and msg (the first failure wins and is what every later
 * call reports), tells its peers and wakes every thread waiting on it. */
dshim_status_t dshim_hook_fail(dshim_comm_t *comm, dshim_status_t st, const char *msg);
/* Tells the peers that this rank leaves comm on purpose, so that the
 * connections it is about to close are not mistaken for a crash. */
void dshim_hook_announce_leave(dshim_comm_t *comm);
/* Looks, without waiting, for a peer that hung up without announcing that it
 * left (it crashed, was killed, or its host went away), or, on a
 * communicator whose ranks meet in shared memory (no connection to hang
 * up), one rank per call whose process exited.  Finding one fails
 * comm with a message naming it (or naming the rank that failed first) and
 * returns that error; DSHIM_OK otherwise.  left[size] (kept by the caller
 * between calls, zeroed at first) remembers peers that left on purpose. */
dshim_status_t dshim_hook_probe_peers(dshim_comm_t *comm, unsigned char *left);

#endif

/*
 * The host gate: the barrier of a communicator whose ranks all share one
 * host, run through a counter in shared memory instead of messages.
 *
 * A dissemination barrier takes ceil(log2 N) rounds of messages, and with
 * more ranks than cores every round waits for each rank to be scheduled
 * again.  Here every rank adds one to a shared counter and the last to
 * arrive opens the gate: one round whatever N, no message (a 2-rank
 * barrier, 2 cores: ~0.05 us in a plain loop against 0.2 for OpenMPI's; 64
 * ranks: 83 us against 580; docs/benchmarks.md, "The host gate").
 *
 * The memory is a host-local transport's host area (transport.h), the
 * lowest rank's; the words in it:
 *   line 0      arrivals: every rank adds 1 per barrier (episode e is
 *               complete when it reaches e * N)
 *   line 1      open: the last episode opened (a futex word), sleepers,
 *               failed: 1 + the rank that failed the communicator
 *   line 2 + r  rank r's episode and the collective sequence number of its
 *               barrier, written before it arrives: who has not arrived,
 *               and which collective a rank is in (the signature check)
 */
#ifndef DSHIM_HOST_GATE_H
#define DSHIM_HOST_GATE_H

#include "comm.h"

/* Decided once from the peer records (bootstrap), the same on every rank:
 * comm->gate_transport = the host-local transport whose host area holds
 * the gate when every rank is on this host, published that transport's
 * resources and DSHIM_SHM_BARRIER allows it; else -1. */
void dshim_host_gate_plan(dshim_comm_t *comm);
/* The barrier through the gate (comm->gate_transport >= 0), with the
 * communicator's waiting policy, timeout and stall warnings, and an error
 * naming the rank when one that has not arrived exits or fails. */
dshim_status_t dshim_host_gate_barrier(dshim_comm_t *comm, const dshim_coll_sig_t *sig);
/* For the signature check against ranks that send no message: a rank
 * other than this one that arrived at the gate's barrier of collective
 * number seq, or -1 (dshim_xfer asks before it sleeps in another
 * collective of that number). */
int dshim_host_gate_in_barrier(dshim_comm_t *comm, uint64_t seq);
/* Tells the ranks waiting in the gate that this rank failed the
 * communicator (dshim_comm_fail); best effort. */
void dshim_host_gate_fail(dshim_comm_t *comm);

#endif

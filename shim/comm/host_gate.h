/*
 * The host gate: the barrier and (with more ranks than cores) the
 * allreduces of a communicator whose ranks all share one host, run through
 * a counter in shared memory instead of messages.
 *
 * Messages take ceil(log2 N) rounds (a dissemination barrier, recursive
 * doubling), and with more ranks than cores every round waits for each rank
 * to be scheduled again.  Here every rank writes its call (and an
 * allreduce's data) into its slot and adds one to a shared counter; the
 * last to arrive checks that the calls agree, reduces the data in rank order
 * into a result, and opens the gate; the others copy the result out.  One
 * round whatever N (docs/benchmarks.md, "The host gate").  Larger
 * allreduces split the reduction: each rank reduces its 1/N, one more
 * round per piece ("The split gate").
 *
 * This file's functions are the mechanism (host_gate.c); the barrier and
 * allreduces that run through it are algorithms like the others, in
 * coll_gate.c and declared in coll.h.
 *
 * The memory is a host-local transport's host area (transport.h), rank 0's;
 * in it (docs/wire-protocol.md section 4 has the offsets):
 *   line 0      arrivals: every rank adds 1 per call (episode e, a rank's
 *               e-th call through the gate, is complete at e * N)
 *   line 1      open: the last episode opened (a futex word), sleepers,
 *               failed: 1 + the rank that failed the communicator,
 *               differs: 1 + a rank whose call differs from rank 0's
 *   line 2 + r  rank r's last episode and call (collective number, kind,
 *               count, an allgatherv's block counts as a hash, dtype, op):
 *               who has not arrived, and the check of the calls, here and
 *               against the ranks that send messages
 *   data        a block per rank and one for the result
 *               (DSHIM_HOST_AREA_DATA bytes each; the split allreduce
 *               uses them as two halves, a piece in each)
 */
#ifndef DSHIM_HOST_GATE_H
#define DSHIM_HOST_GATE_H

#include "comm.h"

/* Decided once from the peer records (bootstrap), the same on every rank:
 * comm->gate_transport = the host-local transport whose host area holds
 * the gate when every rank is on this host, published that transport's
 * resources and DSHIM_SHM_GATE allows it; else -1. */
void dshim_host_gate_plan(dshim_comm_t *comm);
/* The rule behind it, for the ranks r with include[r] (NULL: every rank):
 * the registry entry of the first host-local transport with a host area
 * that all of them published, when DSHIM_SHM_GATE allows a gate; else -1.
 * Also what decides the hierarchy's barrier (topo.c), host by host. */
int dshim_host_gate_transport(const dshim_comm_t *comm, const unsigned char *include);
/* The gate's mechanism, for the algorithms that run through it
 * (coll_gate.c: dshim_barrier_gate, dshim_allreduce_gate,
 * dshim_allreduce_gate_split, dshim_allgatherv_gate).  One call through the gate is an episode:
 * every rank arrives (dshim_host_gate_arrive), the last one to arrive
 * (*last set) does the episode's shared work and opens it
 * (dshim_host_gate_open), the others wait for the open
 * (dshim_host_gate_wait_open); then every rank checks the calls
 * (dshim_host_gate_check_calls).
 *
 * The gate's memory (comm->gate_transport >= 0): rank 0's host area,
 * mapped on first use; a failure fails the collective. */
dshim_status_t dshim_host_gate_area(dshim_comm_t *comm, const dshim_coll_sig_t *sig, void **area_p);
/* Rank r's data block (r < size), or the result's (r = size):
 * DSHIM_HOST_AREA_DATA bytes each, after the lines. */
static inline unsigned char *dshim_host_gate_data(void *area, int size, int r)
{
    return (unsigned char *)area + (size_t)(2 + size) * DSHIM_HOST_AREA_LINE + (size_t)r * DSHIM_HOST_AREA_DATA;
}
/* This rank's call into its slot, then its arrival at the next episode
 * (its data, if any, already in its block): returns the episode, *last set
 * when this arrival completed it. */
uint64_t dshim_host_gate_arrive(dshim_comm_t *comm, void *area, const dshim_coll_sig_t *sig, int *last);
/* The same with the call's block counts as a hash (parts, not 0: an
 * allgatherv's, whose calls agree only when every rank passed the same
 * counts; the total alone is in the call): the last arrival's check and
 * dshim_host_gate_check_calls compare them too. */
uint64_t dshim_host_gate_arrive_parts(dshim_comm_t *comm, void *area, const dshim_coll_sig_t *sig, uint64_t parts,
                                      int *last);
/* The same for a further episode of the same call (its slot already holds
 * the call): the split allreduce's later pieces. */
uint64_t dshim_host_gate_arrive_again(dshim_comm_t *comm, void *area, int *last);
/* The last arrival's check of the calls: 1 + a rank whose call differs
 * from rank 0's, or 0. */
int32_t dshim_host_gate_first_differing(dshim_comm_t *comm, void *area);
/* Opens the episode (the last arrival, after its work), recording
 * `differs` (dshim_host_gate_first_differing) for the others' check. */
void dshim_host_gate_open(void *area, uint64_t episode, int32_t differs);
/* Waits until the episode opens, with the communicator's waiting policy,
 * timeout and stall warnings (wait.h), and an error naming the rank when
 * one that has not arrived exits or fails the communicator. */
dshim_status_t dshim_host_gate_wait_open(dshim_comm_t *comm, const dshim_coll_sig_t *sig, void *area,
                                         uint64_t episode);
/* After the open: when the last arrival found calls that differ, the
 * mismatch error (this rank's call against one that differs from it, or
 * its block counts against another's). */
dshim_status_t dshim_host_gate_check_calls(dshim_comm_t *comm, const dshim_coll_sig_t *sig, void *area);
/* For the signature check against ranks that send no message: a rank other
 * than this one that arrived at the gate with collective number seq (its
 * call in *theirs), or -1.  dshim_xfer asks before it sleeps in a
 * collective of that number. */
int dshim_host_gate_at(dshim_comm_t *comm, uint64_t seq, dshim_coll_sig_t *theirs);
/* For the probes of an idle communicator (dshim_hook_probe_peers): whether
 * the communicator runs collectives through the gate and rank r's process
 * has exited.  Ranks that meet only in the gate never connect, so no socket
 * hangs up when one dies. */
int dshim_host_gate_rank_exited(dshim_comm_t *comm, int r);
/* Tells the ranks waiting in the gate that this rank failed the
 * communicator (dshim_comm_fail); best effort. */
void dshim_host_gate_fail(dshim_comm_t *comm);

#endif

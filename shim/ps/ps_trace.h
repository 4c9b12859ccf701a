/* The parameter server's flight recorder and stall reports (private to
 * shim/ps): which worker has not pushed which key to which server.
 *
 * Rings (shim/trace/trace.h), one per node, named for the launcher's
 * diagnosis (docs/observability.md):
 *   "ps/server.<r>"  an entry per key and round: op "push", label "MXNet push
 *                    key K" (round 0: "MXNet init key K"), seq = the round,
 *                    count = the server's part of the key; waiting_for =
 *                    the WORKER ranks that have not pushed this round yet
 *   "ps/worker.<r>"  an entry per request: label "MXNet push|pushpull|init|
 *                    pull key K" (row_sparse: "... (rows)"), "MXNet command
 *                    C", "MXNet barrier (workers|servers|all)"; peer = the
 *                    SERVER rank it went to, seq = the key's round as this
 *                    worker counts it (its pushes of the key to that server,
 *                    init not counted); waiting_for = that server's rank
 *   "ps/scheduler"   an entry per barrier (ps_sched.c, which keeps it):
 *                    "MXNet barrier (workers|servers|all)", seq = that
 *                    group's barrier number; waiting_for = the missing
 *                    workers' ranks, else the missing servers'
 * A server also reports a round that waits (DSHIM_STALL_WARN) and ends the
 * job when one waits DSHIM_TIMEOUT, with the one-line story ("server 1
 * (host h) waits for key 7 round 12 from worker 3 (pushed by workers 0,1,2);
 * worker 3 last pushed key 6 round 12 to it ..."), sent to every worker as
 * its error, and dumps the rings (reason "timeout").
 *
 * This header does not include trace.h: the fuzz targets compile the
 * server's and the worker's files without the trace module's include root. */
#ifndef DSHIM_PS_TRACE_H
#define DSHIM_PS_TRACE_H

#include <stdint.h>

#include "ps_proto.h"

#define DSHIM_PS_NO_TRACE UINT64_MAX

/* After registration (the rank is known): the node's ring and, for a worker,
 * its request bookkeeping.  Nothing to undo on failure. */
void dshim_ps_trace_node_open(dshim_ps_node_t *node);
/* At dshim_ps_node_finish: closes the ring, frees the bookkeeping. */
void dshim_ps_trace_node_close(dshim_ps_node_t *node);
/* The node failed (first failure): its rings are dumped, if it has any. */
void dshim_ps_trace_node_failed(dshim_ps_node_t *node, const char *msg);

/* A barrier of this node: the entry's id (DSHIM_PS_NO_TRACE when none). */
uint64_t dshim_ps_trace_barrier_begin(dshim_ps_node_t *node, int group, unsigned long number);
void dshim_ps_trace_barrier_end(dshim_ps_node_t *node, uint64_t id, int ok);

/* --- worker ---------------------------------------------------------------- */
/* A request p (server, key, what set) is registered; caller holds pend_mu.
 * Counts the key's round, records the entry (queued and started: it is sent
 * next), sets p->round and p->trace_id. */
void dshim_ps_wtrace_request(dshim_ps_node_t *node, dshim_ps_pending_t *p, int dtype, uint64_t count,
                             uint64_t bytes);
/* The pieces of one pushpull part: one entry for all of them (what =
 * DSHIM_PS_REQ_PIECES); returns its id, *round_p gets the round. */
uint64_t dshim_ps_wtrace_group(dshim_ps_node_t *node, int server, int key, int dtype, uint64_t count,
                               uint64_t bytes, uint64_t *round_p);
/* An entry ends (answered: ok = 1; failed or dropped: 0). */
void dshim_ps_wtrace_end(dshim_ps_node_t *node, uint64_t trace_id, int ok);
/* Server `server` answered something (the receiver thread). */
void dshim_ps_wtrace_heard(dshim_ps_node_t *node, int server);
/* The receiver thread, every pass: stall warnings for requests unanswered for
 * DSHIM_STALL_WARN, entries marked waiting, and DSHIM_OK or
 * DSHIM_ERR_TIMEOUT (message set) when a server has been silent for
 * DSHIM_TIMEOUT with a request unanswered longer than that: the worker's one
 * deadline (a live server whose round waits says WAITING meanwhile, and
 * times the round out itself; ps.h). */
dshim_status_t dshim_ps_wtrace_check(dshim_ps_node_t *node);
/* "pushpull of key 3 (round 5)" for the oldest request to server (all
 * servers: -1); "" when none.  Caller holds pend_mu. */
void dshim_ps_wtrace_oldest(dshim_ps_node_t *node, int server, char *out, size_t len);

/* dshim_dtype_t of an MXNet dtype code, -1 when none (ps_dtype.c) */
int dshim_ps_dtype_to_dshim(int dtype);

#endif

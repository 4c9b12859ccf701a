/*
 * Flight recorder: per communicator, a fixed-size ring of the last
 * operations, dumped on trouble or on demand, and the source of the timeline
 * and the end-of-job summary.
 *
 * Module `trace` (cmake/layers.txt): uses api and base only, so that the
 * communicator (comm) and dshim's parameter server (ps) can use it.  What
 * reads the dumps back (the diagnosis, the live status) is the module
 * `analyser` (analyser/), linked into dshim-run and the tests, never into
 * libdshim.so: the two share trace_format.h and trace_fields.def, the
 * format's one description in code.  The recorder knows nothing of
 * communicators: callers describe what they run with plain values (op names
 * are static strings they own).
 *
 * Cost: off (DSHIM_TRACE_BUFFER=0) every call is one predictable branch on a
 * NULL ring.  On, an op is three short critical sections on the ring's own
 * mutex (queued, started, done; two for a blocking call that runs at once:
 * begin, done), a counter read each (trace.c: the TSC where the kernel keeps
 * time with it), and no allocation.
 *
 * Threads: any thread may call queued (the submitter) and the executor calls
 * started/waiting/done; the dumper takes a snapshot under the same mutex.
 *
 * THE DUMP FORMAT ("dshim-trace" version 1, JSON Lines, one file per process:
 * <DSHIM_TRACE_DIR>/dshim-trace.<world rank>.<pid>.jsonl, written to a
 * temporary name and renamed, so a reader never sees half a file):
 *   line 1, the process:
 *     {"format":"dshim-trace","version":1,"rank":R,"size":N,"host":"h","pid":P,
 *      "reason":"timeout|peer|mismatch|abort|failed|signal|request|exit|crash",
 *      "why":"one line (the error) or \"\"",
 *      "realtime_ns":T,"monotonic_ns":M}      (the two clocks read together:
 *                                              timestamps below are monotonic)
 *     after a failure dump, later dumps (a request) also carry
 *     "failed_reason" and "failed_why": the failure's, which their file replaced
 *   then per ring one line:
 *     {"ring":"<name>","desc":"<what it is>","rank":r,"size":n,"world_rank":R,
 *      "capacity":C,"recorded":K,"dropped":D}
 *   then per entry of that ring, oldest first:
 *     {"ring":"<name>","id":I,"seq":S,"op":"allreduce","dtype":"float32",
 *      "count":C,"bytes":B,"root":-1,"peer":-1,"redop":"sum","label":"torch all_reduce",
 *      "state":"queued|started|waiting|done|failed","waiting_for":[2,3],
 *      "algo":"ring","transport":"shm+tcp",
 *      "t_queued_ns":..,"t_started_ns":..,"t_done_ns":..,"wait_ns":..,
 *      "t_waiting_ns":..}
 *   (the entry's fields and their order: trace_fields.def)
 *   Every value is a string, an integer, or an array of integers; unknown
 *   keys must be ignored by readers (later versions add keys).  "root" and
 *   "peer" are -1 when not applicable, "seq" -1 until known (a receive
 *   learns its number when its message begins), "dtype"/"redop"/"algo"/
 *   "transport" "" when none; t_*_ns are 0 until reached; "t_waiting_ns" is
 *   when the current wait began (state "waiting"; 0 otherwise: how long a
 *   rank has been blocked = monotonic_ns - t_waiting_ns), "wait_ns" the
 *   waits that ended.  A communicator's ring is named by its store prefix
 *   and its store's address ("c0/@10.0.0.1:29500"): equal on every member,
 *   different for every communicator of the process (torch makes one
 *   "c0/" per group, each with its own store).
 * Beside it, the same rings in the format of torch's flight recorder
 * (trace_fr.c; `python -m torch.distributed.flight_recorder.fr_trace`).
 */
#ifndef DSHIM_TRACE_H
#define DSHIM_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "dshim.h"
#include "trace_format.h" /* the states, the sizes, the format's names */

/* What the caller knows when it submits an operation. */
typedef struct dshim_trace_op {
    const char *op;    /* static: "allreduce", "send", "push" */
    int dtype;         /* dshim_dtype_t, or -1 */
    int redop;         /* dshim_redop_t, or -1 */
    uint64_t count;
    uint64_t bytes;
    int root;          /* -1 when none */
    int peer;          /* -1 when none (or any source) */
} dshim_trace_op_t;

typedef struct dshim_trace_entry {
    uint64_t id;       /* record number in its ring, from 0 */
    uint64_t seq;      /* the communicator's number for the op (UINT64_MAX until known) */
    dshim_trace_op_t op;
    char label[DSHIM_TRACE_LABEL_LEN]; /* the framework call ("torch all_reduce"), "" if none */
    dshim_trace_state_t state;
    int waiting_for[DSHIM_TRACE_WAIT_MAX];
    int nwaiting;
    const char *algo;      /* static, NULL when none */
    const char *transport; /* static or owned by the ring's caller for its lifetime */
    uint64_t t_queued_ns, t_started_ns, t_done_ns; /* CLOCK_MONOTONIC */
    uint64_t wait_ns;      /* time spent blocked (nothing moved) while executing, waits that ended */
    uint64_t t_waiting_ns; /* when the current wait began; 0 when not waiting */
} dshim_trace_entry_t;

typedef struct dshim_trace_ring dshim_trace_ring_t;

/* Identity of a ring (copied). */
typedef struct dshim_trace_ring_info {
    const char *name;  /* unique in the process: the communicator's store prefix */
    const char *desc;  /* for people: "torch group 0 (default_pg)", "ncclComm 0x..", "" */
    int rank, size;    /* in this communicator */
} dshim_trace_ring_info_t;

/* A copy of a ring for writers (dump, fr format, status). */
typedef struct dshim_trace_snapshot {
    char name[96];
    char desc[128];
    int rank, size, world_rank;
    size_t capacity;
    uint64_t recorded, dropped;
    size_t n;
    dshim_trace_entry_t *entries; /* n, oldest first; malloc'ed */
} dshim_trace_snapshot_t;

/* NULL when the recorder is off (DSHIM_TRACE_BUFFER=0) or out of memory;
 * every other call accepts a NULL ring and does nothing. */
dshim_trace_ring_t *dshim_trace_open(const dshim_trace_ring_info_t *info);
void dshim_trace_close(dshim_trace_ring_t *ring);
/* Replaces the desc (a creator that names its communicator after creating
 * it: "torch group 1 (pg_name)"). */
void dshim_trace_set_desc(dshim_trace_ring_t *ring, const char *desc);

/* Records a submitted op; takes (and clears) this thread's label
 * (dshim_trace_label in dshim.h).  Returns its id for the calls below. */
uint64_t dshim_trace_queued(dshim_trace_ring_t *ring, const dshim_trace_op_t *op);
/* queued and started at once (one critical section, one time stamp): an op
 * its submitter executes right away, as a blocking call on an idle
 * communicator is.  Takes this thread's label as queued does. */
uint64_t dshim_trace_begin(dshim_trace_ring_t *ring, const dshim_trace_op_t *op, uint64_t seq, const char *algo,
                           const char *transport);
/* seq UINT64_MAX, algo or transport NULL = not known yet; a second call
 * fills in what the first did not know and keeps t_started_ns. */
void dshim_trace_started(dshim_trace_ring_t *ring, uint64_t id, uint64_t seq, const char *algo,
                         const char *transport);
/* Nothing moves: blocked on these ranks (n may be 0 = unknown; at most
 * DSHIM_TRACE_WAIT_MAX kept).  Again while waiting: the ranks are replaced,
 * the wait goes on. */
void dshim_trace_waiting(dshim_trace_ring_t *ring, uint64_t id, const int *ranks, int n);
/* Data moved again after a wait: back to started, the wait added to wait_ns. */
void dshim_trace_moving(dshim_trace_ring_t *ring, uint64_t id);
void dshim_trace_done(dshim_trace_ring_t *ring, uint64_t id, int ok);

dshim_status_t dshim_trace_snapshot(dshim_trace_ring_t *ring, dshim_trace_snapshot_t *snap);
void dshim_trace_snapshot_free(dshim_trace_snapshot_t *snap);

/* Writes every open ring of this process (the format above, and torch's)
 * and logs the file's name (INFO; WARN for a failure).  Failure reasons
 * (timeout, peer, mismatch, abort, failed) write at most one dump per
 * second: one failure cascades over every communicator of the process.
 * `why` may be NULL.  Nothing when the recorder is off (DSHIM_TRACE_BUFFER=0);
 * a process without an open ring writes the header line alone. */
void dshim_trace_dump_all(const char *reason, const char *why);

#endif

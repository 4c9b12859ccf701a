/* Private to shim/trace: what its files share. */
#ifndef DSHIM_TRACE_IMPL_H
#define DSHIM_TRACE_IMPL_H

#include <stddef.h>
#include <stdio.h>

#include "trace.h"

/* Copies this thread's label (dshim_trace_label) into out and clears it;
 * out = "" when none was set. */
void dshim_trace_take_label(char out[DSHIM_TRACE_LABEL_LEN]);

/* Writes the same rings in torch's flight-recorder format beside the
 * dshim-trace dump (trace_fr.c; `python -m torch.distributed.flight_recorder.fr_trace`).
 * dir: the dump directory (exists, ours); world_rank: this process's (-1
 * unknown); snaps[0..n): every open ring of this process, entries oldest
 * first; reason/why: as in the dshim-trace header (why may be ""); the
 * caller holds no ring lock.  Write to a temporary name and rename, as
 * trace.h's format does.  Returns DSHIM_OK, or an error with a one-line
 * message in dshim_last_error() (the caller logs it; the dshim-trace dump is
 * written either way).  Called by dshim_trace_dump_all (trace_dump.c) after
 * its own file, and from the crash handler too (best effort: may use stdio
 * and malloc, must not take locks of its own). */
dshim_status_t dshim_trace_write_fr(const char *dir, int world_rank, const dshim_trace_snapshot_t *snaps, size_t n,
                                    const char *reason, const char *why);

/* ---- shared by trace.c, trace_dump.c, trace_signal.c ----------------------- */

/* CLOCK_MONOTONIC in ns (vDSO: no system call). */
uint64_t dshim_trace_now_ns(void);

/* This process's world rank and size for file names and the dump header
 * (-1 unknown): the first ring whose size is the world size of the
 * environment (DSHIM_WORLD_SIZE, WORLD_SIZE, ...), else the first ring
 * opened, else the environment's rank. */
void dshim_trace_world(int *rank_p, int *size_p);
/* The same with the registry held (dshim_trace_registry_lock). */
void dshim_trace_world_locked(int *rank_p, int *size_p);

/* Snapshots of every ring of this process (forked children skip their
 * parent's), *snaps_p malloc'ed; crash = 1: locks are only tried (a crash
 * may have happened while this thread held one), rings that stay locked are
 * left out.  Returns how many; free with dshim_trace_snapshots_free.  The
 * transport strings of the entries stay valid until the registry is
 * released (dshim_trace_registry_unlock): rings are closed only under it. */
size_t dshim_trace_snapshot_all(dshim_trace_snapshot_t **snaps_p, int crash);
void dshim_trace_snapshots_free(dshim_trace_snapshot_t *snaps, size_t n);
/* The registry of open rings; held across snapshot + write, so that a
 * communicator cannot free its transport name in between.  crash = 1:
 * trylock for a short while; 0 if it could not be taken. */
int dshim_trace_registry_lock(int crash);
void dshim_trace_registry_unlock(void);

/* The signal side (trace_signal.c): called at every dshim_trace_open;
 * installs the DSHIM_TRACE_SIGNAL handler (once per process, only over
 * SIG_DFL) and starts the recorder thread (once per process and per fork),
 * and registers the crash hook. */
void dshim_trace_signal_setup(void);

/* The dump itself (trace_dump.c): dshim_trace_dump_all with crash mode and
 * a status (DSHIM_OK also when skipped: recorder off, failure dumps within
 * a second). */
dshim_status_t dshim_trace_dump_ex(const char *reason, const char *why, int crash);

/* ---- timeline and summary (trace_timeline.c, trace_summary.c) ---- */

/* 1 when DSHIM_TIMELINE or DSHIM_SUMMARY asks for the finished operations
 * (then the recorder should keep a ring even with DSHIM_TRACE_BUFFER=0). */
int dshim_trace_timeline_wanted(void);
/* The hooks trace.c calls.  open: at the end of dshim_trace_open, no lock
 * held (takes the registry lock: learns the world rank, creates the file).
 * done: in dshim_trace_done, once per op when it becomes DONE or FAILED,
 * with the ring's lock held and its entry (must not take the registry or a
 * ring lock).  close: in dshim_trace_close, before the ring is freed (the
 * timeline's buffer is written out).  All are a flag test when both are off. */
void dshim_trace_timeline_open(const dshim_trace_ring_info_t *ring);
void dshim_trace_timeline_done(const dshim_trace_ring_info_t *ring, const dshim_trace_entry_t *e);
void dshim_trace_timeline_close(const dshim_trace_ring_info_t *ring);
/* Writes the timeline's buffer out now (no lock of the recorder held; not
 * from a signal handler): for the dump path, so that a rank that is stuck
 * and then killed leaves its last spans in the file. */
void dshim_trace_timeline_flush(void);
/* What the atexit handler does (tests): the file's last line, the summary. */
void dshim_trace_timeline_finish(void);

/* trace_summary.c, fed by the hooks above */
void dshim_trace_summary_open(uint64_t now_ns, int world_rank);
void dshim_trace_summary_add(const dshim_trace_entry_t *e);
/* The table (empty when this process opened no communicator); rank -1: the
 * one learnt at open.  Returns the length written to out. */
size_t dshim_trace_summary_format(char *out, size_t cap, int rank, uint64_t now_ns);
/* Prints it to stderr, once per process. */
void dshim_trace_summary_print(int rank);
/* A forked child starts empty. */
void dshim_trace_summary_forked(void);

#endif

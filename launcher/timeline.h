/*
 * dshim-run --timeline FILE: every rank writes its own timeline
 * (DSHIM_TIMELINE, shim/trace/trace_timeline.c) to a per-process file on its
 * host; its agent sends the file's lines to the controller when the process
 * ends ("T" frames), and the controller merges them into FILE with the
 * hosts' clocks aligned to its own.
 *
 * Clocks: while the job runs the controller pings every agent that has a
 * lifeline (local, ssh) on it ("P <n>\n"); the agent answers at once with its
 * CLOCK_MONOTONIC and CLOCK_REALTIME ("Q" frame).  A ping sent at controller
 * time s and answered by the time r brackets the agent's reading: the offset
 * between the two monotonic clocks is known to within (r - s) / 2.  Eight
 * pings at the start, then one a second; per ten seconds the ping
 * with the shortest round trip is kept, and the offset is interpolated
 * between those (clocks drift).  Agents under mpirun/srun have no lifeline:
 * their ranks are placed by their hosts' realtime clocks (not measured), and
 * their files travel through the job's store instead of frames.
 */
#ifndef DSHIM_RUN_TIMELINE_H
#define DSHIM_RUN_TIMELINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "frame.h"
#include "run.h"

/* Frame kinds (frame.h): "T <idx> <line>" one line of process idx's
 * timeline file; "Q -1 <n> <monotonic_ns> <realtime_ns>" the answer to ping n. */
#define RUN_FRAME_TIMELINE 'T'
#define RUN_FRAME_PONG 'Q'

/* --timeline: gives every process of the plan its own DSHIM_TIMELINE, a
 * file in this attempt's directory on its host. */
void run_timeline_plan(const run_opts_t *o, run_plan_t *plan);

/* ---- controller ---- */
typedef struct run_timeline run_timeline_t;

/* NULL when path is NULL (no --timeline). */
run_timeline_t *run_timeline_new(const char *path, int nagents);
void run_timeline_free(run_timeline_t *t);
/* Every round of the controller's loop, per agent: sends a ping when one is
 * due.  fd: the agent's lifeline, -1 when it has none or must not be
 * written (stopping, not yet up); host: for the report. */
void run_timeline_poll(run_timeline_t *t, int agent, int fd, const char *host);
/* A T or Q frame from agent; false for other kinds. */
bool run_timeline_frame(run_timeline_t *t, int agent, const run_frame_t *f);
/* Merges what arrived into the file named at new, prints the one line
 * ("timeline: N ranks on H hosts, clock skew <= X us, written to FILE");
 * 0, or -1 after saying why. */
int run_timeline_write(run_timeline_t *t, const run_plan_t *plan);

/* For tests: a ping's times (controller monotonic at send and answer, the
 * agent's monotonic and realtime, the controller's realtime at send) and a
 * line as a T frame brings it. */
void run_timeline_add_sample(run_timeline_t *t, int agent, uint64_t send_ns, uint64_t recv_ns, uint64_t agent_mono_ns,
                             uint64_t agent_real_ns, uint64_t ctl_real_send_ns);
void run_timeline_add_line(run_timeline_t *t, int agent, int idx, const char *line, size_t len);
/* The controller's clock pair the output's times count from (tests set it). */
void run_timeline_set_origin(run_timeline_t *t, uint64_t mono_ns, uint64_t real_ns);
/* The bound of the alignment of agent's clock (ns), -1 when not measured. */
double run_timeline_bound_ns(run_timeline_t *t, int agent);

/* ---- agent ---- */
/* Bytes that came on the lifeline: answers the pings among them. */
void run_timeline_agent_input(const char *buf, size_t n);
/* Process idx ended: sends its timeline file(s), if its environment names
 * one that dshim-run chose, as T frames on stdout (under mpirun/srun, which
 * may cut lines of bursts of output: into the job's store, whose address is
 * in common), then removes them. */
void run_timeline_agent_send(int idx, const run_strv_t *env, const run_strv_t *common);
/* Controller, after the agents ended and before its store stops: takes what
 * per-rank agents (mpirun, srun) put in the store. */
void run_timeline_fetch(run_timeline_t *t, const run_plan_t *plan);

#endif

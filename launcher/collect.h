/*
 * Flight-recorder dumps across the job (docs/launcher.md
 * "Diagnosis and live status").
 *
 * Every rank gets DSHIM_TRACE_DIR = a per-job directory on its host
 * (/tmp/dshim-run-<controller pid>/trace_<attempt>, made by the agent, mode
 * 0700), unless the user set one.  On the first failure of the job — before
 * anything is stopped — and on `dshim-run --status`, the controller asks
 * every agent with a lifeline (local, ssh) for the dumps:
 *
 *   controller -> agent (lifeline):  "C <mode> <signal number>\n"
 *                                    (mode 0 = failure, 1 = request)
 *   agent: sends the signal to each of its live processes that catches it
 *   (/proc/<pid>/status SigCgt: a process that does not would die of it),
 *   except stopped ones (they cannot answer) and, after a failure, ones that
 *   dumped in the last 3 s on their own; waits until each asked process's
 *   dump file is new, or it ended, or 1 s passed; then ships every file of
 *   the directory and what it saw:
 *   agent -> controller (frames):    "D -1 <file name>"   a file begins
 *                                    "B -1 <base64>"      its bytes
 *                                    "Y <idx> <state letter> <asked> <answered>"
 *                                    "Z -1 <files>"       this agent is done
 *   (and, as soon as the request arrives: "A -1 <no>", the acknowledgement
 *   without which the controller stops waiting for it after RUN_COLLECT_ACK_S)
 *   The controller waits for every agent's Z, at most 1.5 s (then it stops the
 *   job anyway and takes what still comes until the agents end), stores the files
 *   in a directory of its own (after a failure: ./dshim-trace-<pid>, or under
 *   --log-dir; for --status: /tmp/dshim-run-user<uid>/status-<pid>), writes
 *   launcher.jsonl there (what it knows of each process) and prints the
 *   diagnosis (analyser/trace_read.h).
 *
 * The lifeline command has no 'K' (the agent's stop word) and no 'P' (the
 * timeline's pings).  Agents under mpirun/srun have no lifeline: their
 * ranks' dumps stay on their hosts.
 */
#ifndef DSHIM_RUN_COLLECT_H
#define DSHIM_RUN_COLLECT_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "frame.h"
#include "run.h"
#include "trace_read.h"

#define RUN_FRAME_DUMP 'D'
#define RUN_FRAME_BYTES 'B'
#define RUN_FRAME_PSTATE 'Y'
#define RUN_FRAME_COLLECTED 'Z'
#define RUN_FRAME_COLLECT_ACK 'A' /* "<no>": the agent got the request (sent at once) */

/* Bounds of the waits (seconds): the agent's for its processes' dumps, the
 * controller's for all agents.  The job's processes end this much later
 * after a failure, at most (tests/soak allows 2 s of slack in all). */
#define RUN_COLLECT_AGENT_WAIT_S 1.0
#define RUN_COLLECT_WAIT_S 1.5
/* An agent that has not even acknowledged the request by then is taken as
 * unreachable (its host cut off: ssh keeps the link open for minutes) and
 * not waited for: stopping the others must not wait on a host that cannot
 * answer. */
#define RUN_COLLECT_ACK_S 0.3

enum { RUN_COLLECT_FAILURE = 0, RUN_COLLECT_REQUEST = 1 };

/* ---- plan (controller, before the agents start) ---- */
/* Sets plan->trace_dir/trace_owned and DSHIM_TRACE_DIR in common: nothing
 * when the recorder is off (DSHIM_TRACE_BUFFER=0) or --no-preload. */
void run_collect_plan(const run_opts_t *o, run_plan_t *plan, run_strv_t *common);

/* ---- agent ---- */
typedef struct {
    int idx;
    pid_t pid;
    int rank;      /* its RANK (torch's flight-recorder file is named by it), -1 none */
    bool running;
} run_collect_proc_t;

/* dir: the spec's trace directory ("" = none); owned: made by dshim-run for
 * this job (created here, emptied and removed at the end). */
void run_collect_agent_init(const char *dir, bool owned);
/* Bytes that came on the lifeline (every byte, whatever else they hold). */
void run_collect_agent_input(const char *buf, size_t n);
/* Every round of the agent's loop: starts, watches and ends a collection.
 * Returns the longest the loop may sleep (ms), -1 when nothing is going on. */
int run_collect_agent_poll(const run_collect_proc_t *procs, int n);
/* Whether a request for dumps may still come that this agent has not
 * answered: it has a dump directory and has not yet shipped after a failure.
 * An agent whose processes all ended, one of them failing, waits for it (at
 * most RUN_COLLECT_LINGER_S): the controller sends it on the first failure,
 * which is often this agent's own report, and an agent gone before the
 * request arrived took its processes' dumps with it. */
bool run_collect_agent_awaits_request(void);
#define RUN_COLLECT_LINGER_S 1.0
/* At the agent's end: its directory goes when dshim-run made it and the
 * controller has copies (or it is empty). */
void run_collect_agent_end(void);

/* ---- controller ---- */
typedef struct run_collect run_collect_t;

run_collect_t *run_collect_new(const run_opts_t *o, const run_plan_t *plan, int nagents);
void run_collect_free(run_collect_t *c);
/* Whether there is anything to ask (recorder on, dshim preloaded). */
bool run_collect_enabled(const run_collect_t *c);
/* Starts a collection; fds[i]: agent i's lifeline (-1: none, or not up).
 * false when no agent can be asked (nothing started). */
bool run_collect_start(run_collect_t *c, int mode, const int *fds);
bool run_collect_active(const run_collect_t *c);
int run_collect_mode(const run_collect_t *c);
/* A D/B/Y/Z frame of agent i (true), or another kind (false). */
bool run_collect_frame(run_collect_t *c, int agent, const run_frame_t *f);
/* Agent i will send nothing more (reaped). */
void run_collect_agent_gone(run_collect_t *c, int agent);
/* Every agent asked has answered (Z, or gone). */
bool run_collect_complete(const run_collect_t *c);
/* The wait (RUN_COLLECT_WAIT_S) is over.  After a failure the stop then
 * begins anyway, and what still comes (a loaded host's agent) is taken
 * until every agent answered or ended. */
bool run_collect_overdue(const run_collect_t *c);
/* poll() timeout while waiting (ms): until the deadline. */
int run_collect_wait_ms(const run_collect_t *c, int idle_ms);
/* Ends the collection: files closed, launcher.jsonl written from procs (the
 * Y frames' states filled in here).  Returns the text to show (diagnosis or
 * status, malloc'ed; NULL when no dump arrived and nothing is worth saying)
 * and the directory the files are in (*dir, valid until the next call). */
char *run_collect_finish(run_collect_t *c, dshim_trace_proc_t *procs, int nprocs, const char **dir);

/* ---- dshim-run --diagnose DIR, --status [PID] (inspect.c) ---- */
int run_diagnose_main(const char *dir);
int run_status_main(const char *pid_or_null);
/* The controller's socket for --status: /tmp/dshim-run-user<uid>/<pid>.sock;
 * -1 when it cannot be made (a warning says why). */
int run_status_listen(void);
void run_status_unlisten(int fd);
/* "status-<pid>" directory of this controller (malloc'ed). */
char *run_status_dir(void);

#endif

/*
 * Reading flight-recorder dumps ("dshim-trace" v1, trace.h) and what is made
 * of them: the one-screen diagnosis of a failed or hung job and the live
 * status of a running one (docs/observability.md).  Used by dshim-run (on a
 * failure, `--status`, `--diagnose DIR`) and by tests; pure functions of the
 * parsed dumps plus what the launcher knows of each process, so that every
 * case can be checked with hand-written dump files.
 *
 * The parser takes any bytes (dumps travel over the launcher's frames and sit
 * in directories anyone may have edited): it never reads past the buffer,
 * never crashes, skips what it does not understand, and bounds what it
 * allocates by the input's size.
 */
#ifndef DSHIM_TRACE_READ_H
#define DSHIM_TRACE_READ_H

#include <stddef.h>
#include <stdint.h>

#define DSHIM_TRACE_SEQ_NONE UINT64_MAX /* an entry whose seq was not known yet */

/* One entry of a ring, as read back (trace.h's fields; strings copied). */
typedef struct dshim_trace_rec {
    uint64_t id, seq;
    char op[32], dtype[24], redop[16], label[64], algo[32], transport[32];
    uint64_t count, bytes;
    int root, peer;         /* -1 when none */
    int state;              /* dshim_trace_state_t (trace.h); -1 = unknown word */
    int waiting_for[8];     /* ring ranks */
    int nwaiting;
    uint64_t t_queued_ns, t_started_ns, t_done_ns, wait_ns; /* the process's CLOCK_MONOTONIC */
} dshim_trace_rec_t;

/* One ring (communicator) of one dump. */
typedef struct dshim_trace_dring {
    char name[96], desc[128];
    int rank, size, world_rank; /* world_rank of this process; -1 unknown */
    uint64_t capacity, recorded, dropped;
    dshim_trace_rec_t *recs;    /* oldest first, as in the file */
    size_t n, cap;
} dshim_trace_dring_t;

/* One dump file: one process at one moment. */
typedef struct dshim_trace_dump {
    char file[256];             /* base name when loaded from a directory */
    int rank, size;             /* world rank and size; -1 unknown */
    char host[64];
    long pid;
    char reason[16];            /* timeout|peer|mismatch|abort|failed|signal|request|exit|crash */
    char why[512];
    uint64_t realtime_ns, monotonic_ns; /* read together: monotonic -> wall clock */
    dshim_trace_dring_t *rings;
    size_t nrings;
    size_t bad_lines;           /* lines that were not what the format says (skipped) */
} dshim_trace_dump_t;

/* What the launcher knows of a process of the job (dshim-run writes these to
 * <dir>/launcher.jsonl beside the dumps, so --diagnose DIR says the same
 * offline). */
typedef enum {
    DSHIM_TRACE_PROC_UNKNOWN = 0,
    DSHIM_TRACE_PROC_RUNNING,   /* alive when the dumps were collected */
    DSHIM_TRACE_PROC_EXITED,    /* code */
    DSHIM_TRACE_PROC_KILLED,    /* sig */
} dshim_trace_proc_state_t;

typedef struct dshim_trace_proc {
    int rank;            /* world rank (RANK), -1 when the process is not a rank (MXNet roles) */
    char name[48];       /* "rank 3", "worker 1" */
    char host[64];
    long pid;            /* 0 when it never started */
    dshim_trace_proc_state_t state;
    int code, sig;
    char pstate;         /* /proc state letter when the dump signal was sent (T = stopped); 0 unknown */
    int asked;           /* the dump signal was sent to it */
    int answered;        /* a fresh dump of it arrived */
    int first_failure;   /* the failure that stopped the job */
} dshim_trace_proc_t;

typedef struct dshim_trace_set {
    dshim_trace_dump_t *dumps;
    size_t n;
    dshim_trace_proc_t *procs; /* may be NULL (offline without launcher.jsonl) */
    size_t nprocs;
    double wait_s;       /* how long the launcher waited for dumps (for messages) */
} dshim_trace_set_t;

/* Parses one dump.  0 when the first line is a "dshim-trace" version 1
 * header (bad later lines are skipped and counted); -1 otherwise (*out is
 * then empty).  Free with dshim_trace_dump_free either way. */
int dshim_trace_parse(const char *buf, size_t len, dshim_trace_dump_t *out);
void dshim_trace_dump_free(dshim_trace_dump_t *d);

/* launcher.jsonl: a "dshim-run-procs" v1 header line, then one object per
 * process.  Parse: 0 (with *procs malloc'ed, n of them) or -1. */
int dshim_trace_parse_procs(const char *buf, size_t len, dshim_trace_proc_t **procs, size_t *n);
int dshim_trace_write_procs(const char *path, const dshim_trace_proc_t *procs, size_t n, double wait_s);

/* Every "dshim-trace.*.jsonl" of dir (and launcher.jsonl when present).
 * Several dumps of one process: the newest is kept.  0, or -1 with a
 * message in err (dir unreadable; no dump at all is 0 with set->n = 0). */
int dshim_trace_load_dir(const char *dir, dshim_trace_set_t *set, char *err, size_t errlen);
/* Adds one parsed dump (taken over: *d is emptied), keeping one per process. */
void dshim_trace_set_add(dshim_trace_set_t *set, dshim_trace_dump_t *d);
void dshim_trace_set_free(dshim_trace_set_t *set);

/* The diagnosis: at most max_lines lines ("\n"-terminated, no prefix) saying
 * who waits for whom in which operation, which rank is missing and why,
 * mismatched calls.  now_realtime_ns: "now" for ages (0 = the newest dump's
 * time).  Returns malloc'ed text, never NULL (may be a single line saying
 * there was nothing to read). */
char *dshim_trace_diagnose(const dshim_trace_set_t *set, int max_lines, uint64_t now_realtime_ns);

/* The live status: per rank its current operation, seq, how long it has been
 * waiting and for whom, bytes moved; then the ranks that arrived last over
 * the last `last_n` collectives of each communicator (clocks put on one
 * wall clock with each dump's realtime/monotonic pair).  Malloc'ed text. */
char *dshim_trace_status(const dshim_trace_set_t *set, int last_n, uint64_t now_realtime_ns);

/* "0-6,8,10-11": ranks (any order, duplicates allowed) as ranges; writes at
 * most cap bytes (cut with "..."). */
void dshim_trace_ranges(const int *ranks, size_t n, char *out, size_t cap);

#endif

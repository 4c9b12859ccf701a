/*
 * The analyser (module `analyser`, linked into dshim-run and the tests, not
 * into libdshim.so): reading flight-recorder dumps ("dshim-trace" v1,
 * shim/trace/trace.h and trace_format.h) and what is made of them: the
 * one-screen diagnosis of a failed or hung job and the live status of a
 * running one (docs/observability.md).  Used by dshim-run (on a
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

#include "trace_format.h" /* the writer's side of the format (shim/trace) */

#define DSHIM_TRACE_SEQ_NONE UINT64_MAX /* an entry whose seq was not known yet */

/* One entry of a ring, as read back: a member per field of trace_fields.def
 * (strings copied and cut to their buffer; "root"/"peer" -1 when none,
 * "seq" DSHIM_TRACE_SEQ_NONE until known, "state" a dshim_trace_state_t or
 * -1 for an unknown word; the times on the process's CLOCK_MONOTONIC). */
typedef struct dshim_trace_rec {
#define DSHIM_TRACE_U64(key, ident, value) uint64_t key;
#define DSHIM_TRACE_SEQ(key, ident, value) uint64_t key;
#define DSHIM_TRACE_INT(key, ident, value) int key;
#define DSHIM_TRACE_STR(key, cap, ident, value) char key[cap];
#define DSHIM_TRACE_STATE(key, ident, value) int key;
#define DSHIM_TRACE_RANKS(key, nkey, cap, ident, value, n) \
    int key[cap];                                          \
    int nkey;
#include "trace_fields.def"
#undef DSHIM_TRACE_U64
#undef DSHIM_TRACE_SEQ
#undef DSHIM_TRACE_INT
#undef DSHIM_TRACE_STR
#undef DSHIM_TRACE_STATE
#undef DSHIM_TRACE_RANKS
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

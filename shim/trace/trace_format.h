/*
 * The flight recorder's on-disk format, shared by its writer (trace_dump.c,
 * inside every rank) and its reader (analyser/, inside dshim-run and the
 * tests only): the name and version of the format, the dump files' names,
 * the states an entry can be in, and (trace_fields.def) the fields of an
 * entry.  trace.h describes the whole format in words.  A change here is a
 * change of the format: old dumps must still parse (tests/fuzz/corpus/
 * trace_read and tests/unit/analyser/check_trace_read.c hold real ones).
 */
#ifndef DSHIM_TRACE_FORMAT_H
#define DSHIM_TRACE_FORMAT_H

#define DSHIM_TRACE_FORMAT "dshim-trace" /* the header line's "format" */
#define DSHIM_TRACE_FORMAT_VERSION 1     /* its "version": readers refuse another */

/* <dir>/dshim-trace.<world rank>.<pid>.jsonl */
#define DSHIM_TRACE_FILE_PREFIX "dshim-trace."
#define DSHIM_TRACE_FILE_SUFFIX ".jsonl"

typedef enum dshim_trace_state {
    DSHIM_TRACE_QUEUED = 0, /* submitted, not yet executing */
    DSHIM_TRACE_STARTED,    /* executing, data moving */
    DSHIM_TRACE_WAITING,    /* executing, nothing moved for a while: blocked on waiting_for */
    DSHIM_TRACE_DONE,
    DSHIM_TRACE_FAILED,
} dshim_trace_state_t;

#define DSHIM_TRACE_NSTATES 5

/* The word an entry's "state" is written as; NULL for a value out of range. */
static inline const char *dshim_trace_state_name(int s)
{
    static const char *const names[DSHIM_TRACE_NSTATES] = {"queued", "started", "waiting", "done", "failed"};
    return s >= 0 && s < DSHIM_TRACE_NSTATES ? names[s] : (const char *)0;
}

#define DSHIM_TRACE_LABEL_LEN 64
#define DSHIM_TRACE_WAIT_MAX 8 /* ranks named in waiting_for */

#endif

/*
 * libFuzzer target: the flight-recorder dump reader and the texts made of
 * dumps (analyser/: trace_read.c, diagnose*.c).  Dumps travel from every
 * host to dshim-run in frames and sit in directories anyone may edit, so the
 * reader takes any bytes.  Input: up to four dumps separated by a 0xff byte
 * (one dump alone exercises the parser; several, the cross-rank analysis of
 * the diagnosis and the status).  Every parsed dump goes into one set, then
 * both texts are made.
 */
#include <stdlib.h>
#include <string.h>

#include "trace_read.h"

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    dshim_trace_set_t set;
    memset(&set, 0, sizeof(set));
    const char *p = (const char *)data, *end = p + size;
    for (int k = 0; k < 4 && p <= end; k++) {
        const char *sep = memchr(p, 0xff, (size_t)(end - p));
        size_t len = sep ? (size_t)(sep - p) : (size_t)(end - p);
        dshim_trace_dump_t d;
        if (dshim_trace_parse(p, len, &d) == 0) {
            dshim_trace_set_add(&set, &d);
        } else {
            dshim_trace_dump_free(&d);
        }
        if (sep == NULL) {
            break;
        }
        p = sep + 1;
    }
    /* the launcher's account of the processes, also from the input */
    dshim_trace_proc_t *procs = NULL;
    size_t nprocs = 0;
    if (dshim_trace_parse_procs((const char *)data, size, &procs, &nprocs) == 0) {
        set.procs = procs;
        set.nprocs = nprocs;
    } else {
        free(procs);
    }
    free(dshim_trace_diagnose(&set, 10, 0));
    free(dshim_trace_status(&set, 20, 0));
    dshim_trace_set_free(&set);
    return 0;
}

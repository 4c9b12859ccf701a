/*
 * The size argument of the stand-alone benchmark programs (bench/mpi_bench.c,
 * bench/tcp_wire.c): "4K", "1M", "64m", "4096" (K/M/G = 2^10/2^20/2^30), as
 * run_bench.py's parse_size reads them.  Header-only: each program is one
 * file compiled on its own (mpicc, cc).
 */
#ifndef DSHIM_BENCH_SIZE_H
#define DSHIM_BENCH_SIZE_H

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>

/* The size in bytes; 0 for a malformed string. */
static inline size_t bench_parse_size(const char *s)
{
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || end == s) {
        return 0;
    }
    if (*end == 'k' || *end == 'K') {
        v <<= 10, end++;
    } else if (*end == 'm' || *end == 'M') {
        v <<= 20, end++;
    } else if (*end == 'g' || *end == 'G') {
        v <<= 30, end++;
    }
    return *end == '\0' ? (size_t)v : 0;
}

#endif

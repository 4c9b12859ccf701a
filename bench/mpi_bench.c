/*
 * mpi_bench: MPI_Allreduce (float32, SUM, in place) size sweep, the OpenMPI
 * reference for bench/run_bench.py.  It follows the same method as
 * dshim-bench and bench/gloo_bench.py so the three can share one table:
 *
 *   per size: one correctness check (rank+1 values), warm-up of at least
 *   5 iterations and 0.2 s, then iters = max(5, ceil(min_time / t_warm))
 *   capped at 10000 (decided on rank 0 and broadcast so every rank runs the
 *   same count); per-iteration time = max over ranks; reported time = median
 *   over iterations; algbw = bytes / time; busbw = algbw * 2(n-1)/n.
 *
 * Usage (under mpirun):
 *   mpi_bench -T shm|tcp -j OUT.jsonl [-s 4K,64K,1M] [-b 4K -e 256M -f 4]
 *             [-t MIN_SECONDS] [-B]
 * -T only labels the output: the transport itself is chosen by the mpirun
 * --mca flags, which run_bench.py passes.  One JSON object per size is
 * appended to OUT.jsonl by rank 0; a human-readable table goes to stdout.
 * -B: before the sizes, time MPI_Barrier the same way (one JSON object with
 * op "barrier", bytes 0).  Every object carries init_us (MPI_Init's duration,
 * max over ranks), init_span_us (first rank's call to last rank's return,
 * CLOCK_MONOTONIC: one clock for every process of a host) and init_min_us (min
 * over ranks), as dshim-bench does.
 *
 * Build: mpicc -std=gnu11 -O2 -Wall -Wextra -Werror -D_GNU_SOURCE \
 *        -o build/bench/mpi_bench bench/mpi_bench.c
 */
#include <errno.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_size.h"

#define MAX_SIZES 64
#define MAX_ITERS 10000
#define MIN_ITERS 5
#define WARM_MIN_S 0.2

struct bench_args {
    size_t sizes[MAX_SIZES];
    int nsizes;
    double min_time_s;
    const char *json_path;
    const char *transport;
    int barrier;
    double init_us, init_span_us, init_min_us;
};

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a;
    double y = *(const double *)b;
    return (x > y) - (x < y);
}

static void usage_exit(int rank, const char *why)
{
    if (rank == 0) {
        fprintf(stderr, "mpi_bench: %s\n"
                "usage: mpi_bench -T shm|tcp -j OUT.jsonl [-s 4K,64K,...] "
                "[-b 4K -e 256M -f 4] [-t MIN_SECONDS] [-B]\n", why);
    }
    MPI_Finalize();
    exit(2);
}

static int add_size(struct bench_args *a, size_t bytes)
{
    if (bytes < sizeof(float) || bytes % sizeof(float) != 0 || a->nsizes >= MAX_SIZES) {
        return -1;
    }
    /* MPI counts are int: 256 MiB of float32 is far below INT_MAX elements. */
    if (bytes / sizeof(float) > (size_t)0x7fffffff) {
        return -1;
    }
    a->sizes[a->nsizes++] = bytes;
    return 0;
}

static void parse_args(int argc, char **argv, int rank, struct bench_args *a)
{
    const char *list = NULL;
    size_t begin = 4096;
    size_t end = 256u << 20;
    unsigned long factor = 4;
    int opt;

    memset(a, 0, sizeof(*a));
    a->min_time_s = 1.0;
    a->transport = "unknown";
    while ((opt = getopt(argc, argv, "s:b:e:f:t:j:T:B")) != -1) {
        switch (opt) {
        case 'B':
            a->barrier = 1;
            break;
        case 's':
            list = optarg;
            break;
        case 'b':
            begin = bench_parse_size(optarg);
            break;
        case 'e':
            end = bench_parse_size(optarg);
            break;
        case 'f':
            factor = strtoul(optarg, NULL, 10);
            break;
        case 't':
            a->min_time_s = atof(optarg);
            break;
        case 'j':
            a->json_path = optarg;
            break;
        case 'T':
            a->transport = optarg;
            break;
        default:
            usage_exit(rank, "unknown option");
        }
    }
    if (a->min_time_s <= 0.0) {
        usage_exit(rank, "-t must be a positive number of seconds");
    }
    if (list != NULL) {
        char *copy = strdup(list);
        char *save = NULL;
        for (char *tok = strtok_r(copy, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
            if (add_size(a, bench_parse_size(tok)) != 0) {
                free(copy);
                usage_exit(rank, "bad -s entry: sizes must be multiples of 4 bytes, at most 64 of them");
            }
        }
        free(copy);
        return;
    }
    if (begin == 0 || end < begin || factor < 2) {
        usage_exit(rank, "need -b <= -e, both non-zero, and -f >= 2");
    }
    for (size_t s = begin; s <= end; s *= factor) {
        if (add_size(a, s) != 0) {
            usage_exit(rank, "bad -b/-e/-f: sizes must be multiples of 4 bytes, at most 64 of them");
        }
        if (s > end / factor) {
            break; /* the next multiply would pass end (or overflow) */
        }
    }
}

static double mono_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* count 0 means MPI_Barrier (the -B measurement) */
static void allreduce(float *buf, size_t count)
{
    if (count == 0) {
        MPI_Barrier(MPI_COMM_WORLD);
        return;
    }
    MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
}

/* A wrong sum means the comparison is meaningless, so stop the whole job. */
static void check_result(float *buf, size_t count, int rank, int n)
{
    for (size_t i = 0; i < count; i++) {
        buf[i] = (float)(rank + 1);
    }
    allreduce(buf, count);
    const float want = (float)n * (float)(n + 1) / 2.0f;
    for (size_t i = 0; i < count; i++) {
        if (buf[i] != want) {
            fprintf(stderr, "mpi_bench: rank %d: wrong allreduce result at element %zu: %g, want %g\n",
                    rank, i, (double)buf[i], (double)want);
            MPI_Abort(MPI_COMM_WORLD, 3);
        }
    }
    /* Zeros during timing: repeated SUM can neither overflow nor hit denormals. */
    memset(buf, 0, count * sizeof(float));
}

/* Warm-up, then rank 0 picks the iteration count for about min_time_s. */
static int choose_iters(float *buf, size_t count, double min_time_s)
{
    int warm = 0;
    int done = 0;
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    while (!done) {
        allreduce(buf, count);
        warm++;
        /* Only rank 0's clock decides, so every rank leaves the loop together. */
        done = warm >= MIN_ITERS && MPI_Wtime() - t0 >= WARM_MIN_S;
        MPI_Bcast(&done, 1, MPI_INT, 0, MPI_COMM_WORLD);
    }
    const double t_warm = (MPI_Wtime() - t0) / warm;
    double want = ceil(min_time_s / t_warm);
    int iters = want > MAX_ITERS ? MAX_ITERS : (int)want;
    if (iters < MIN_ITERS) {
        iters = MIN_ITERS;
    }
    MPI_Bcast(&iters, 1, MPI_INT, 0, MPI_COMM_WORLD);
    return iters;
}

static void append_json(const struct bench_args *a, int n, size_t bytes, int iters,
                        double med_s, double min_s, double algbw, double busbw)
{
    FILE *f = fopen(a->json_path, "a");
    if (f == NULL) {
        fprintf(stderr, "mpi_bench: cannot open %s for appending: %s; check the -j path\n",
                a->json_path, strerror(errno));
        MPI_Abort(MPI_COMM_WORLD, 4);
    }
    fprintf(f, "{\"impl\":\"openmpi\",\"transport\":\"%s\",\"np\":%d,\"op\":\"%s\","
            "\"dtype\":\"float32\",\"bytes\":%zu,\"iters\":%d,\"time_us\":%.3f,"
            "\"min_us\":%.3f,\"algbw\":%.6g,\"busbw\":%.6g,\"init_us\":%.1f,\"init_span_us\":%.1f,"
            "\"init_min_us\":%.1f}\n",
            a->transport, n, bytes ? "allreduce" : "barrier", bytes, iters, med_s * 1e6, min_s * 1e6, algbw,
            busbw, a->init_us, a->init_span_us, a->init_min_us);
    if (fclose(f) != 0) {
        fprintf(stderr, "mpi_bench: writing %s failed: %s\n", a->json_path, strerror(errno));
        MPI_Abort(MPI_COMM_WORLD, 4);
    }
}

static void bench_size(const struct bench_args *a, int rank, int n, size_t bytes)
{
    const size_t count = bytes / sizeof(float);
    float *buf = malloc(bytes ? bytes : sizeof(float));
    if (buf == NULL) {
        fprintf(stderr, "mpi_bench: rank %d: out of memory for %zu bytes\n", rank, bytes);
        MPI_Abort(MPI_COMM_WORLD, 5);
    }
    if (count > 0) {
        check_result(buf, count, rank, n);
    }
    const int iters = choose_iters(buf, count, a->min_time_s);
    double *times = calloc((size_t)iters, sizeof(double));
    if (times == NULL) {
        fprintf(stderr, "mpi_bench: rank %d: out of memory for the time vector\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 5);
    }

    MPI_Barrier(MPI_COMM_WORLD);
    for (int i = 0; i < iters; i++) {
        const double s = MPI_Wtime();
        allreduce(buf, count);
        times[i] = MPI_Wtime() - s;
    }
    /* An iteration is only done when its slowest rank is done. */
    MPI_Allreduce(MPI_IN_PLACE, times, iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);

    if (rank == 0) {
        qsort(times, (size_t)iters, sizeof(double), cmp_double);
        const double med = (iters % 2) ? times[iters / 2]
                                       : 0.5 * (times[iters / 2 - 1] + times[iters / 2]);
        const double algbw = (double)bytes / med / 1e9;
        const double busbw = algbw * 2.0 * (n - 1) / n;
        printf("%12zu %6d %12.1f %12.1f %10.3f %10.3f\n", bytes, iters, med * 1e6,
               times[0] * 1e6, algbw, busbw);
        fflush(stdout);
        if (a->json_path != NULL) {
            append_json(a, n, bytes, iters, med, times[0], algbw, busbw);
        }
    }
    free(times);
    free(buf);
}

int main(int argc, char **argv)
{
    int rank = 0;
    int n = 0;
    struct bench_args args;

    const double init_t0 = mono_now();
    MPI_Init(&argc, &argv);
    const double init_t1 = mono_now();
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    parse_args(argc, argv, rank, &args);
    /* start-up cost, measured as dshim-bench measures dshim_comm_init_env */
    double init_in[4] = {init_t1 - init_t0, -init_t0, init_t1, -(init_t1 - init_t0)}, init_out[4];
    MPI_Allreduce(init_in, init_out, 4, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    args.init_us = init_out[0] * 1e6;
    args.init_span_us = (init_out[2] + init_out[1]) * 1e6;
    args.init_min_us = -init_out[3] * 1e6;
    /* Fail before minutes of measuring, not after the first size. */
    if (rank == 0 && args.json_path != NULL) {
        FILE *f = fopen(args.json_path, "a");
        if (f == NULL) {
            fprintf(stderr, "mpi_bench: cannot open %s for appending: %s; check the -j path\n",
                    args.json_path, strerror(errno));
            MPI_Abort(MPI_COMM_WORLD, 4);
        }
        fclose(f);
    }
    if (rank == 0) {
        char ver[MPI_MAX_LIBRARY_VERSION_STRING];
        int len = 0;
        MPI_Get_library_version(ver, &len);
        char *nl = strchr(ver, '\n');
        if (nl != NULL) {
            *nl = '\0';
        }
        printf("# openmpi allreduce float32 sum, np=%d, transport=%s (%s)\n", n, args.transport, ver);
        printf("# init: MPI_Init %.1f us (max over ranks), first call to last return %.1f us, "
               "min over ranks %.1f us\n", args.init_us, args.init_span_us, args.init_min_us);
        printf("%12s %6s %12s %12s %10s %10s\n", "bytes", "iters", "time_us", "min_us",
               "algbw", "busbw");
        fflush(stdout);
    }
    if (args.barrier) {
        bench_size(&args, rank, n, 0);
    }
    for (int i = 0; i < args.nsizes; i++) {
        bench_size(&args, rank, n, args.sizes[i]);
    }
    MPI_Finalize();
    return 0;
}

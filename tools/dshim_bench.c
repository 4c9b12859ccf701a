/*
 * dshim-bench: nccl-tests-style collective benchmark.
 *
 *   dshim-bench -n 2 -o allreduce -d float32 -r sum -b 4K -e 256M -f 4
 *
 * With -n N it forks N local ranks itself (rank 0 hosts the store on a free
 * port); without -n it joins a job from the environment (RANK, WORLD_SIZE,
 * MASTER_ADDR, MASTER_PORT, as set by dshim-run, torchrun, mpirun, srun).
 * Method: per-iteration time = max over ranks, reported time = median over
 * iterations; algbw = bytes/time; busbw as nccl-tests defines it.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dshim.h"

typedef struct opts {
    int nprocs;
    size_t min_bytes, max_bytes;
    double factor;
    const char *op;
    dshim_dtype_t dtype;
    dshim_redop_t redop;
    int warmup;
    int iters;
    double seconds;
    int check;
    int barrier;
    int in_place; /* allreduce with sbuf == rbuf, as the frameworks call it (mpi_bench: MPI_IN_PLACE) */
    const char *json;
} opts_t;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int parse_size(const char *s, size_t *out)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || v < 0) {
        return -1;
    }
    switch (*end) {
    case 'k': case 'K': v *= 1024; end++; break;
    case 'm': case 'M': v *= 1024 * 1024; end++; break;
    case 'g': case 'G': v *= 1024.0 * 1024 * 1024; end++; break;
    default: break;
    }
    if (*end) {
        return -1;
    }
    *out = (size_t)v;
    return 0;
}

static int parse_dtype(const char *s, dshim_dtype_t *out)
{
    for (int d = 0; d < DSHIM_DTYPE_COUNT; d++) {
        if (!strcasecmp(s, dshim_dtype_name((dshim_dtype_t)d))) {
            *out = (dshim_dtype_t)d;
            return 0;
        }
    }
    return -1;
}

static int parse_redop(const char *s, dshim_redop_t *out)
{
    for (int o = 0; o < DSHIM_REDOP_COUNT; o++) {
        if (!strcasecmp(s, dshim_redop_name((dshim_redop_t)o))) {
            *out = (dshim_redop_t)o;
            return 0;
        }
    }
    return -1;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: dshim-bench [-n NPROCS] [-o OP] [-d DTYPE] [-r REDOP] [-b MIN] [-e MAX] [-f FACTOR]\n"
            "                   [-w WARMUP] [-i ITERS | -t SECONDS] [-c 0|1] [-j OUT.jsonl] [--barrier] [--no-bind]\n"
            "                   [--hosts H] [--in-place]\n"
            "                   [--print-config]\n"
            "  OP: allreduce broadcast reduce allgather reduce_scatter alltoall (default allreduce)\n"
            "  sizes accept K/M/G suffixes; defaults -b 4K -e 64M -f 4, float32, sum, -t 1\n"
            "  with -n N <= cores each rank is bound to one core (as mpirun does); --no-bind turns that off\n"
            "  --hosts H (with -n): the ranks pretend to live on H hosts (DSHIM_HOST_ID), in blocks\n"
            "  --in-place: allreduce from and into one buffer, as DDP, Horovod and mpi_bench (MPI_IN_PLACE) call it\n"
            "  --barrier: before the sweep, time dshim_barrier the same way (one row/JSON line, op barrier, 0 bytes)\n"
            "  every JSON line carries init_us (dshim_comm_init_env's duration, max over ranks) and\n"
            "  init_span_us (first rank's call to last rank's return, one host's monotonic clock) and\n"
            "  init_min_us (min over ranks: the last rank to arrive waits for nobody)\n");
}

/* bus bandwidth factor, as nccl-tests defines it */
static double bus_factor(const char *op, int n)
{
    if (!strcmp(op, "allreduce")) {
        return 2.0 * (n - 1) / n;
    }
    if (!strcmp(op, "allgather") || !strcmp(op, "reduce_scatter") || !strcmp(op, "alltoall")) {
        return (double)(n - 1) / n;
    }
    return 1.0;
}

static dshim_status_t run_op(dshim_comm_t *comm, const opts_t *o, const char *op, void *sbuf, void *rbuf,
                             size_t count)
{
    int n = dshim_comm_size(comm);
    if (!strcmp(op, "barrier")) {
        return dshim_barrier(comm);
    }
    if (!strcmp(op, "allreduce")) {
        return dshim_allreduce(comm, sbuf, rbuf, count, o->dtype, o->redop);
    }
    if (!strcmp(op, "broadcast")) {
        return dshim_broadcast(comm, rbuf, count, o->dtype, 0);
    }
    if (!strcmp(op, "reduce")) {
        return dshim_reduce(comm, sbuf, rbuf, count, o->dtype, o->redop, 0);
    }
    if (!strcmp(op, "allgather")) {
        return dshim_allgather(comm, sbuf, rbuf, count / (size_t)n, o->dtype);
    }
    if (!strcmp(op, "reduce_scatter")) {
        return dshim_reduce_scatter(comm, sbuf, rbuf, count / (size_t)n, o->dtype, o->redop);
    }
    if (!strcmp(op, "alltoall")) {
        return dshim_alltoall(comm, sbuf, rbuf, count / (size_t)n, o->dtype);
    }
    return DSHIM_ERR_INVALID;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#define CHECK_OR_DIE(call)                                                                   \
    do {                                                                                     \
        dshim_status_t st_ = (call);                                                         \
        if (st_ != DSHIM_OK) {                                                               \
            fprintf(stderr, "dshim-bench: %s failed: %s\n", #call, dshim_last_error());     \
            return 1;                                                                        \
        }                                                                                    \
    } while (0)

#define BENCH_TRY(call)                                                                      \
    do {                                                                                     \
        dshim_status_t st_ = (call);                                                         \
        if (st_ != DSHIM_OK) {                                                               \
            return st_;                                                                      \
        }                                                                                    \
    } while (0)

/* Warm-up, then the timed loop of one operation at one size: o->warmup
 * iterations, then more up to 0.2 s; rank 0 decides the counts so that every
 * rank runs the same number.  *med_p = median over iterations of the
 * per-iteration time, max over ranks. */
static dshim_status_t time_op(dshim_comm_t *comm, const opts_t *o, const char *op, void *sbuf, void *rbuf,
                              size_t count, int *iters_p, double *med_p)
{
    double t0 = now();
    for (int w = 0; w < o->warmup; w++) {
        BENCH_TRY(run_op(comm, o, op, sbuf, rbuf, count));
    }
    double t_iter = (now() - t0) / (o->warmup > 0 ? o->warmup : 1);
    int plan[2];
    plan[0] = t_iter > 0 ? (int)((0.2 - (now() - t0)) / t_iter) : 0;
    plan[0] = plan[0] < 0 ? 0 : plan[0] > 10000 ? 10000 : plan[0];
    plan[1] = o->iters > 0 ? o->iters : (int)ceil(o->seconds / (t_iter > 0 ? t_iter : 1e-6));
    plan[1] = plan[1] < 5 ? 5 : plan[1] > 10000 ? 10000 : plan[1];
    BENCH_TRY(dshim_broadcast(comm, plan, 2, DSHIM_INT32, 0));
    for (int w = 0; w < plan[0]; w++) {
        BENCH_TRY(run_op(comm, o, op, sbuf, rbuf, count));
    }
    int iters = plan[1];
    double *times = malloc(sizeof(double) * (size_t)iters);
    double *tmax = malloc(sizeof(double) * (size_t)iters);
    dshim_status_t st = DSHIM_OK;
    if (!times || !tmax) {
        fprintf(stderr, "dshim-bench: out of memory\n");
        st = DSHIM_ERR_NOMEM;
        goto out;
    }
    st = dshim_barrier(comm);
    for (int i = 0; i < iters && st == DSHIM_OK; i++) {
        double a = now();
        st = run_op(comm, o, op, sbuf, rbuf, count);
        times[i] = now() - a;
    }
    if (st == DSHIM_OK) {
        st = dshim_allreduce(comm, times, tmax, (size_t)iters, DSHIM_FLOAT64, DSHIM_MAX);
    }
    if (st == DSHIM_OK) {
        qsort(tmax, (size_t)iters, sizeof(double), cmp_double);
        *med_p = tmax[iters / 2];
        *iters_p = iters;
    }
out:
    free(times);
    free(tmax);
    return st;
}

static int rank_main(const opts_t *o)
{
    dshim_comm_t *comm;
    /* start-up cost: each rank times its own dshim_comm_init_env (it waits
     * for the ranks that come later, so the max is the job's start-up);
     * CLOCK_MONOTONIC is one clock for every process of a host, so
     * max(end) - min(start) is the span from the first call to the last return */
    double init_t0 = now();
    CHECK_OR_DIE(dshim_comm_init_env(&comm));
    double init_t1 = now();
    double init_in[4] = {init_t1 - init_t0, -init_t0, init_t1, -(init_t1 - init_t0)}, init_out[4];
    CHECK_OR_DIE(dshim_allreduce(comm, init_in, init_out, 4, DSHIM_FLOAT64, DSHIM_MAX));
    double init_us = init_out[0] * 1e6, init_span_us = (init_out[2] + init_out[1]) * 1e6,
           init_min_us = -init_out[3] * 1e6;
    int rank = dshim_comm_rank(comm), n = dshim_comm_size(comm);
    size_t es = dshim_dtype_size(o->dtype);
    size_t max_alloc = o->max_bytes + (size_t)n * es;
    float *sbuf = NULL, *rbuf = NULL;
    if (posix_memalign((void **)&sbuf, 64, max_alloc) ||
        (!o->in_place && posix_memalign((void **)&rbuf, 64, max_alloc))) {
        fprintf(stderr, "dshim-bench: out of memory\n");
        return 1;
    }
    if (o->in_place) {
        rbuf = sbuf;
    }
    memset(sbuf, 0, max_alloc);
    memset(rbuf, 0, max_alloc);
    const char *transport = dshim_comm_transport(comm);
    FILE *json = NULL;
    if (rank == 0) {
        if (o->json) {
            json = fopen(o->json, "a");
            if (!json) {
                fprintf(stderr, "dshim-bench: cannot open %s: %s\n", o->json, strerror(errno));
                return 1;
            }
        }
        printf("# dshim-bench %s %s %s, %d ranks, transport %s\n", o->op, dshim_dtype_name(o->dtype),
               dshim_redop_name(o->redop), n, transport);
        printf("# init: dshim_comm_init_env %.1f us (max over ranks), first call to last return %.1f us, "
               "min over ranks %.1f us\n",
               init_us, init_span_us, init_min_us);
        printf("# %12s %12s %8s %12s %10s %10s %6s\n", "size(B)", "count", "iters", "time(us)", "algbw(GB/s)",
               "busbw(GB/s)", "check");
    }
    if (o->barrier) {
        int iters = 0;
        double med = 0;
        CHECK_OR_DIE(time_op(comm, o, "barrier", NULL, NULL, 0, &iters, &med));
        if (rank == 0) {
            printf("  %12s %12d %8d %12.2f %10s %10s %6s\n", "barrier", 0, iters, med * 1e6, "-", "-", "-");
            fflush(stdout);
            if (json) {
                fprintf(json,
                        "{\"impl\":\"dshim\",\"transport\":\"%s\",\"np\":%d,\"op\":\"barrier\",\"bytes\":0,"
                        "\"iters\":%d,\"time_us\":%.3f,\"init_us\":%.1f,\"init_span_us\":%.1f,\"init_min_us\":%.1f}\n",
                        transport, n, iters, med * 1e6, init_us, init_span_us, init_min_us);
                fflush(json);
            }
        }
    }
    for (size_t bytes = o->min_bytes; bytes <= o->max_bytes; bytes = (size_t)ceil((double)bytes * o->factor)) {
        size_t count = bytes / es;
        if (strcmp(o->op, "allreduce") && strcmp(o->op, "broadcast") && strcmp(o->op, "reduce")) {
            count -= count % (size_t)n;
        }
        /* correctness first: ranks contribute rank+1, small integers so every
         * order of summation is exact */
        const char *chk = "-";
        if (o->check && o->dtype == DSHIM_FLOAT32 && !strcmp(o->op, "allreduce") && o->redop == DSHIM_SUM) {
            for (size_t i = 0; i < count; i++) {
                sbuf[i] = (float)(rank + 1);
            }
            CHECK_OR_DIE(run_op(comm, o, o->op, sbuf, rbuf, count));
            float want = (float)n * (float)(n + 1) / 2.0f;
            int bad = 0;
            for (size_t i = 0; i < count; i++) {
                bad |= rbuf[i] != want;
            }
            int allbad = bad;
            CHECK_OR_DIE(dshim_allreduce(comm, &bad, &allbad, 1, DSHIM_INT32, DSHIM_MAX));
            chk = allbad ? "FAIL" : "ok";
            memset(sbuf, 0, bytes);
        }
        int iters = 0;
        double med = 0;
        CHECK_OR_DIE(time_op(comm, o, o->op, sbuf, rbuf, count, &iters, &med));
        double moved = (double)(count * es);
        double algbw = moved / med / 1e9, busbw = algbw * bus_factor(o->op, n);
        if (rank == 0) {
            printf("  %12zu %12zu %8d %12.2f %10.3f %10.3f %6s\n", (size_t)(count * es), count, iters, med * 1e6,
                   algbw, busbw, chk);
            fflush(stdout);
            if (json) {
                fprintf(json,
                        "{\"impl\":\"dshim\",\"transport\":\"%s\",\"np\":%d,\"op\":\"%s\",\"dtype\":\"%s\","
                        "\"bytes\":%zu,\"iters\":%d,\"time_us\":%.3f,\"algbw\":%.4f,\"busbw\":%.4f,\"check\":\"%s\","
                        "\"init_us\":%.1f,\"init_span_us\":%.1f,\"init_min_us\":%.1f}\n",
                        transport, n, o->op, dshim_dtype_name(o->dtype), (size_t)(count * es), iters, med * 1e6,
                        algbw, busbw, chk, init_us, init_span_us, init_min_us);
                fflush(json);
            }
        }
        if (!strcmp(chk, "FAIL")) {
            fprintf(stderr, "dshim-bench: rank %d: wrong result at %zu bytes\n", rank, bytes);
            return 1;
        }
        if (o->factor <= 1.0) {
            break;
        }
    }
    if (json) {
        fclose(json);
    }
    free(sbuf);
    if (rbuf != sbuf) {
        free(rbuf);
    }
    CHECK_OR_DIE(dshim_comm_destroy(comm));
    return 0;
}

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sa);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) || getsockname(fd, (struct sockaddr *)&sa, &len)) {
        return 29500;
    }
    close(fd);
    return ntohs(sa.sin_port);
}

/* Local launcher: fork n ranks, end them all if one fails. */
static int launch_local(int n, int bind, int hosts, char **argv)
{
    int port = free_port();
    pid_t *pids = calloc((size_t)n, sizeof(pid_t));
    char token[64];
    snprintf(token, sizeof(token), "bench-%d-%ld", (int)getpid(), (long)time(NULL));
    for (int r = 0; r < n; r++) {
        pid_t p = fork();
        if (p < 0) {
            perror("fork");
            return 1;
        }
        if (p == 0) {
            char buf[32];
            snprintf(buf, sizeof(buf), "%d", r);
            setenv("RANK", buf, 1);
            setenv("LOCAL_RANK", buf, 1);
            snprintf(buf, sizeof(buf), "%d", n);
            setenv("WORLD_SIZE", buf, 1);
            setenv("MASTER_ADDR", "127.0.0.1", 1);
            snprintf(buf, sizeof(buf), "%d", port);
            setenv("MASTER_PORT", buf, 1);
            setenv("DSHIM_JOB_TOKEN", token, 1);
            if (hosts > 1) {
                /* ranks in blocks, one block per pretended host: shared
                 * memory inside a block, TCP between blocks */
                snprintf(buf, sizeof(buf), "bench-host-%d", (int)((long)r * hosts / n));
                setenv("DSHIM_HOST_ID", buf, 1);
            }
            long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
            if (bind && ncpu > 0 && n <= ncpu) {
                /* like mpirun's default: one core per rank when they fit */
                cpu_set_t set;
                CPU_ZERO(&set);
                CPU_SET(r % (int)ncpu, &set);
                sched_setaffinity(0, sizeof(set), &set);
            }
            execv("/proc/self/exe", argv);
            perror("execv");
            _exit(127);
        }
        pids[r] = p;
    }
    int rc = 0, left = n;
    while (left > 0) {
        int status;
        pid_t p = wait(&status);
        if (p < 0) {
            break;
        }
        left--;
        int bad = !WIFEXITED(status) || WEXITSTATUS(status) != 0;
        if (bad && rc == 0) {
            int r = 0;
            while (r < n && pids[r] != p) {
                r++;
            }
            if (WIFSIGNALED(status)) {
                fprintf(stderr, "dshim-bench: rank %d (pid %d) died of signal %d; stopping the others\n", r, (int)p,
                        WTERMSIG(status));
                rc = 128 + WTERMSIG(status);
            } else {
                fprintf(stderr, "dshim-bench: rank %d (pid %d) exited with %d; stopping the others\n", r, (int)p,
                        WEXITSTATUS(status));
                rc = WEXITSTATUS(status);
            }
            for (int i = 0; i < n; i++) {
                if (pids[i] != p) {
                    kill(pids[i], SIGTERM);
                }
            }
        }
        for (int i = 0; i < n; i++) {
            if (pids[i] == p) {
                pids[i] = -1;
            }
        }
    }
    free(pids);
    return rc;
}

int main(int argc, char **argv)
{
    opts_t o = {.nprocs = 0, .min_bytes = 4096, .max_bytes = 64u << 20, .factor = 4, .op = "allreduce",
                .dtype = DSHIM_FLOAT32, .redop = DSHIM_SUM, .warmup = 5, .iters = 0, .seconds = 1.0, .check = 1,
                .barrier = 0, .json = NULL};
    int bind = 1, hosts = 0;
    static struct option longopts[] = {{"print-config", no_argument, NULL, 'P'}, {"help", no_argument, NULL, 'h'},
                                       {"no-bind", no_argument, NULL, 'B'},
                                       {"barrier", no_argument, NULL, 'R'},
                                       {"hosts", required_argument, NULL, 'H'},
                                       {"in-place", no_argument, NULL, 'I'},
                                       {NULL, 0, NULL, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "+n:b:e:f:o:d:r:w:i:t:c:j:h", longopts, NULL)) != -1) {
        switch (c) {
        case 'n': o.nprocs = atoi(optarg); break;
        case 'b':
            if (parse_size(optarg, &o.min_bytes)) {
                fprintf(stderr, "dshim-bench: bad size '%s' for -b\n", optarg);
                return 2;
            }
            break;
        case 'e':
            if (parse_size(optarg, &o.max_bytes)) {
                fprintf(stderr, "dshim-bench: bad size '%s' for -e\n", optarg);
                return 2;
            }
            break;
        case 'f': o.factor = atof(optarg); break;
        case 'o': o.op = optarg; break;
        case 'd':
            if (parse_dtype(optarg, &o.dtype)) {
                fprintf(stderr, "dshim-bench: unknown dtype '%s'\n", optarg);
                return 2;
            }
            break;
        case 'r':
            if (parse_redop(optarg, &o.redop)) {
                fprintf(stderr, "dshim-bench: unknown op '%s'\n", optarg);
                return 2;
            }
            break;
        case 'w': o.warmup = atoi(optarg); break;
        case 'i': o.iters = atoi(optarg); break;
        case 't': o.seconds = atof(optarg); break;
        case 'c': o.check = atoi(optarg); break;
        case 'j': o.json = optarg; break;
        case 'P': dshim_print_config(stdout); return 0;
        case 'B': bind = 0; break;
        case 'R': o.barrier = 1; break;
        case 'H': hosts = atoi(optarg); break;
        case 'I': o.in_place = 1; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    const char *ops[] = {"allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "alltoall"};
    int known = 0;
    for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
        known |= !strcmp(o.op, ops[i]);
    }
    if (!known || o.min_bytes > o.max_bytes || o.factor < 1.0 || (o.in_place && strcmp(o.op, "allreduce"))) {
        usage(stderr);
        return 2;
    }
    /* the ranks re-exec this program with the same options minus -n ("+"
     * in the option string keeps getopt from reordering argv) */
    char **argv_copy = calloc((size_t)argc + 1, sizeof(char *));
    int ac = 0;
    for (int i = 0; i < argc; i++) {
        if (i > 0 && !strcmp(argv[i], "-n")) {
            i++;
            continue;
        }
        if (i > 0 && !strncmp(argv[i], "-n", 2) && argv[i][2]) {
            continue;
        }
        argv_copy[ac++] = argv[i];
    }
    int rc;
    if (o.nprocs > 0) {
        rc = launch_local(o.nprocs, bind, hosts, argv_copy);
    } else {
        rc = rank_main(&o);
    }
    free(argv_copy);
    return rc;
}

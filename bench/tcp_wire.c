/*
 * tcp_wire: what the kernel's loopback TCP alone costs for the bytes a ring
 * allreduce moves: the bound for bench/run_bench.py's TCP columns.
 *
 * An allreduce of B bytes over N ranks must send, from every rank, at least
 * 2(N-1)/N * B bytes (reduce-scatter then allgather: B bytes each way at
 * N = 2) and receive as many.  This program moves exactly that through TCP
 * over loopback between N processes in a ring (rank r sends to r+1 and hears
 * from r-1; at N = 2 one connection carries both directions, as in dshim),
 * with no reduction, no library and no framing: every byte goes out of a
 * B-byte send buffer and into a B-byte receive buffer (cyclically), so the
 * memory the kernel copies from and to is as large, and as cold, as an
 * allreduce's.  Sockets are set up as dshim sets up its own between ranks of
 * one host (TCP_NODELAY, SO_SNDBUF/SO_RCVBUF 4 MiB, congestion control reno);
 * -B and -C change that.  No implementation of the allreduce can take less
 * time than this on the same machine, short of moving fewer bytes.
 *
 * Method as dshim-bench, mpi_bench and gloo_bench.py: per size, warm-up of at
 * least 5 iterations and 0.2 s (a token goes around the ring before each),
 * then iters = max(5, ceil(min_time / t_warm)) capped at 10000 (decided by
 * rank 0, passed around the ring with the token that starts the timed loop),
 * run back to back; per-iteration time = max over ranks of each rank's own
 * time; reported time = median over iterations.
 * The check: after the timed loop every rank compares what it received with
 * its left neighbour's pattern.
 *
 * Usage: tcp_wire -n N -s 4K,64K,1M -j OUT.jsonl [-t MIN_SECONDS] [-B BYTES]
 *                 [-C NAME|default]
 * One JSON object per size is appended to OUT.jsonl (impl "wire", transport
 * "tcp"); a table goes to stdout.  A rank whose peer goes away exits with an
 * error, and every rank dies with its parent (PR_SET_PDEATHSIG).
 *
 * Build: cc -std=gnu11 -O2 -Wall -Wextra -Werror -D_GNU_SOURCE \
 *        -o build/bench/tcp_wire bench/tcp_wire.c -lm
 */
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_size.h"

#define MAX_SIZES 64
#define MAX_ITERS 10000
#define MIN_ITERS 5
#define WARM_MIN_S 0.2
#define CHUNK ((size_t)512 << 10) /* dshim's DSHIM_CHUNK_SIZE default */

struct args {
    int n;
    size_t sizes[MAX_SIZES];
    int nsizes;
    double min_time_s;
    const char *json_path;
    int sockbuf;
    const char *cc;
};

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void die(int rank, const char *what)
{
    fprintf(stderr, "tcp_wire: rank %d: %s: %s\n", rank, what, errno ? strerror(errno) : "peer closed");
    exit(1);
}

static void usage(void)
{
    fprintf(stderr, "usage: tcp_wire -n N -s 4K,64K,1M -j OUT.jsonl [-t MIN_SECONDS] [-B BYTES] [-C NAME|default]\n");
    exit(2);
}

static void parse_args(int argc, char **argv, struct args *a)
{
    memset(a, 0, sizeof(*a));
    a->n = 2;
    a->min_time_s = 1.0;
    a->sockbuf = 4 << 20;
    a->cc = "reno";
    int opt;
    while ((opt = getopt(argc, argv, "n:s:j:t:B:C:")) != -1) {
        switch (opt) {
        case 'n':
            a->n = atoi(optarg);
            break;
        case 's': {
            char *copy = strdup(optarg), *save = NULL;
            for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
                size_t v = bench_parse_size(tok);
                if (!v || a->nsizes == MAX_SIZES) {
                    fprintf(stderr, "tcp_wire: bad size list '%s' (at most %d sizes > 0, K/M/G suffixes)\n", optarg,
                            MAX_SIZES);
                    exit(2);
                }
                a->sizes[a->nsizes++] = v;
            }
            free(copy);
            break;
        }
        case 'j':
            a->json_path = optarg;
            break;
        case 't':
            a->min_time_s = atof(optarg);
            break;
        case 'B':
            a->sockbuf = (int)bench_parse_size(optarg);
            break;
        case 'C':
            a->cc = optarg;
            break;
        default:
            usage();
        }
    }
    if (a->n < 2 || a->n > 1024 || a->nsizes == 0 || !(a->min_time_s >= 0)) {
        usage();
    }
}

/* ------------------------------------------------------------ one rank */

struct rank {
    int r, n;
    int right, left; /* equal at n = 2 */
    const struct args *a;
};

static void tune(const struct args *a, int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (a->sockbuf > 0) {
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &a->sockbuf, sizeof(a->sockbuf));
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &a->sockbuf, sizeof(a->sockbuf));
    }
    if (strcmp(a->cc, "default") != 0) {
        setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, a->cc, (socklen_t)strlen(a->cc));
    }
}

/* Blocking whole-buffer send/receive, for the token. */
static void send_all(struct rank *k, int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len) {
        ssize_t m = send(fd, p, len, MSG_NOSIGNAL);
        if (m <= 0) {
            if (m < 0 && errno == EINTR) {
                continue;
            }
            die(k->r, "send");
        }
        p += m, len -= (size_t)m;
    }
}

/* Polls rather than sleeps, as the libraries' barriers do: a sleeping rank
 * would start its next iteration a wake-up (tens of us here) late. */
static void recv_all(struct rank *k, int fd, void *buf, size_t len)
{
    char *p = buf;
    while (len) {
        ssize_t m = recv(fd, p, len, MSG_DONTWAIT);
        if (m <= 0) {
            if (m < 0 && (errno == EINTR || errno == EAGAIN)) {
                sched_yield();
                continue;
            }
            if (m == 0) {
                errno = 0;
            }
            die(k->r, "recv");
        }
        p += m, len -= (size_t)m;
    }
}

/* The token: rank 0 starts it with the number of iterations still to run,
 * everyone passes it on; returns that number. */
static int64_t token(struct rank *k, int64_t left_to_run)
{
    int64_t v = left_to_run;
    if (k->r == 0) {
        send_all(k, k->right, &v, sizeof(v));
        recv_all(k, k->left, &v, sizeof(v));
    } else {
        recv_all(k, k->left, &v, sizeof(v));
        send_all(k, k->right, &v, sizeof(v));
    }
    return v;
}

/* Moves `wire` bytes to the right and as many from the left, at once, out of
 * sbuf and into rbuf (both `span` bytes, used cyclically); returns seconds. */
static double move(struct rank *k, const char *sbuf, char *rbuf, size_t span, size_t wire)
{
    double t0 = now_s();
    size_t sent = 0, got = 0;
    while (sent < wire || got < wire) {
        int progressed = 0;
        if (sent < wire) {
            size_t off = sent % span, len = span - off;
            len = len < CHUNK ? len : CHUNK;
            len = len < wire - sent ? len : wire - sent;
            ssize_t m = send(k->right, sbuf + off, len, MSG_DONTWAIT | MSG_NOSIGNAL);
            if (m > 0) {
                sent += (size_t)m, progressed = 1;
            } else if (m < 0 && errno != EAGAIN && errno != EINTR) {
                die(k->r, "send");
            }
        }
        if (got < wire) {
            size_t off = got % span, len = span - off;
            len = len < CHUNK ? len : CHUNK;
            len = len < wire - got ? len : wire - got;
            ssize_t m = recv(k->left, rbuf + off, len, MSG_DONTWAIT);
            if (m > 0) {
                got += (size_t)m, progressed = 1;
            } else if (m == 0) {
                errno = 0;
                die(k->r, "recv");
            } else if (errno != EAGAIN && errno != EINTR) {
                die(k->r, "recv");
            }
        }
        if (!progressed) {
            /* as the libraries do when ranks share a core: let the peer run */
            sched_yield();
        }
    }
    return now_s() - t0;
}

static unsigned char pattern(int rank, size_t i)
{
    return (unsigned char)((size_t)rank * 131u + i * 7u + (i >> 12));
}

/* Runs every size; writes, per size, the iteration count, the per-iteration
 * times and the check's verdict to fd `out` (the parent's pipe). */
static void run_rank(struct rank *k, int out)
{
    const struct args *a = k->a;
    for (int si = 0; si < a->nsizes; si++) {
        size_t span = a->sizes[si];
        size_t wire = span / (size_t)k->n * 2 * (size_t)(k->n - 1);
        char *sbuf = aligned_alloc(4096, (span + 4095) / 4096 * 4096);
        char *rbuf = aligned_alloc(4096, (span + 4095) / 4096 * 4096);
        double *times = calloc(MAX_ITERS, sizeof(double));
        if (!sbuf || !rbuf || !times) {
            die(k->r, "out of memory");
        }
        for (size_t i = 0; i < span; i++) {
            sbuf[i] = (char)pattern(k->r, i);
        }
        memset(rbuf, 0, span);
        /* warm-up: rank 0 counts time, the token says whether to go on */
        double w0 = now_s();
        int warm = 0;
        for (;;) {
            int64_t go = 1;
            if (k->r == 0) {
                go = warm < MIN_ITERS || now_s() - w0 < WARM_MIN_S;
            }
            if (!token(k, go)) {
                break;
            }
            move(k, sbuf, rbuf, span, wire);
            warm++;
        }
        int64_t iters = 0;
        if (k->r == 0) {
            double per = (now_s() - w0) / (warm ? warm : 1);
            double want = per > 0 ? ceil(a->min_time_s / per) : MAX_ITERS;
            iters = want < MIN_ITERS ? MIN_ITERS : want > MAX_ITERS ? MAX_ITERS : (int64_t)want;
        }
        iters = token(k, iters);
        for (int64_t it = 0; it < iters; it++) {
            times[it] = move(k, sbuf, rbuf, span, wire);
        }
        int left_rank = (k->r + k->n - 1) % k->n;
        int ok = 1;
        size_t written = wire < span ? wire : span;
        for (size_t i = 0; i < written && ok; i++) {
            ok = (unsigned char)rbuf[i] == pattern(left_rank, i);
        }
        int32_t head[2] = {(int32_t)iters, ok};
        if (write(out, head, sizeof(head)) != (ssize_t)sizeof(head) ||
            write(out, times, (size_t)iters * sizeof(double)) != (ssize_t)((size_t)iters * sizeof(double))) {
            die(k->r, "write to the parent");
        }
        free(sbuf);
        free(rbuf);
        free(times);
    }
}

static void connect_ring(struct rank *k, const int *listeners, const struct sockaddr_in *addrs)
{
    int n = k->n, r = k->r;
    if (n == 2) {
        /* one connection for both directions: rank 0 dials, rank 1 answers */
        int fd;
        if (r == 0) {
            fd = socket(AF_INET, SOCK_STREAM, 0);
            tune(k->a, fd);
            if (connect(fd, (const struct sockaddr *)&addrs[1], sizeof(addrs[1])) != 0) {
                die(r, "connect");
            }
        } else {
            fd = accept(listeners[1], NULL, NULL);
            if (fd < 0) {
                die(r, "accept");
            }
            tune(k->a, fd);
        }
        k->right = k->left = fd;
        return;
    }
    k->right = socket(AF_INET, SOCK_STREAM, 0);
    tune(k->a, k->right);
    if (connect(k->right, (const struct sockaddr *)&addrs[(r + 1) % n], sizeof(addrs[0])) != 0) {
        die(r, "connect");
    }
    k->left = accept(listeners[r], NULL, NULL);
    if (k->left < 0) {
        die(r, "accept");
    }
    tune(k->a, k->left);
}

/* ------------------------------------------------------------ the parent */

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

int main(int argc, char **argv)
{
    struct args a;
    parse_args(argc, argv, &a);
    int n = a.n;
    int *listeners = calloc((size_t)n, sizeof(int));
    struct sockaddr_in *addrs = calloc((size_t)n, sizeof(*addrs));
    int(*pipes)[2] = calloc((size_t)n, sizeof(*pipes));
    pid_t *pids = calloc((size_t)n, sizeof(pid_t));
    if (!listeners || !addrs || !pipes || !pids) {
        fprintf(stderr, "tcp_wire: out of memory\n");
        return 1;
    }
    for (int r = 0; r < n; r++) {
        listeners[r] = socket(AF_INET, SOCK_STREAM, 0);
        addrs[r].sin_family = AF_INET;
        addrs[r].sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t len = sizeof(addrs[r]);
        if (listeners[r] < 0 || bind(listeners[r], (struct sockaddr *)&addrs[r], sizeof(addrs[r])) != 0 ||
            listen(listeners[r], 4) != 0 || getsockname(listeners[r], (struct sockaddr *)&addrs[r], &len) != 0 ||
            pipe(pipes[r]) != 0) {
            perror("tcp_wire: listener");
            return 1;
        }
    }
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    pid_t parent = getpid();
    for (int r = 0; r < n; r++) {
        pids[r] = fork();
        if (pids[r] < 0) {
            perror("tcp_wire: fork");
            return 1;
        }
        if (pids[r] == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent) {
                _exit(1);
            }
            if (cpus > 0 && n <= cpus) {
                /* one core per rank, as dshim-bench and mpirun bind them */
                cpu_set_t set;
                CPU_ZERO(&set);
                CPU_SET(r, &set);
                sched_setaffinity(0, sizeof(set), &set);
            }
            for (int i = 0; i < n; i++) {
                close(pipes[i][0]);
                if (i != r) {
                    close(pipes[i][1]);
                }
            }
            struct rank k = {.r = r, .n = n, .a = &a};
            connect_ring(&k, listeners, addrs);
            run_rank(&k, pipes[r][1]);
            _exit(0);
        }
        close(pipes[r][1]);
    }
    FILE *json = a.json_path ? fopen(a.json_path, "a") : NULL;
    if (a.json_path && !json) {
        perror(a.json_path);
    }
    printf("# tcp_wire: N=%d, ring over loopback TCP, 2(N-1)/N*B bytes each way per rank, no reduction\n", n);
    printf("#%13s %8s %12s %11s %11s  check\n", "size(B)", "iters", "time(us)", "algbw(GB/s)", "busbw(GB/s)");
    double *all = NULL;
    int status = 0;
    for (int si = 0; si < a.nsizes && !status; si++) {
        int32_t iters = 0, ok = 1;
        for (int r = 0; r < n; r++) {
            int32_t head[2];
            if (read(pipes[r][0], head, sizeof(head)) != (ssize_t)sizeof(head) || head[0] <= 0 ||
                head[0] > MAX_ITERS || (iters && head[0] != iters)) {
                fprintf(stderr, "tcp_wire: rank %d sent no result for %zu bytes\n", r, a.sizes[si]);
                status = 1;
                break;
            }
            iters = head[0];
            ok = ok && head[1];
            if (!all) {
                all = calloc((size_t)n * MAX_ITERS, sizeof(double));
            }
            size_t want = (size_t)iters * sizeof(double), have = 0;
            while (have < want) {
                ssize_t m = read(pipes[r][0], (char *)(all + (size_t)r * MAX_ITERS) + have, want - have);
                if (m <= 0) {
                    break;
                }
                have += (size_t)m;
            }
            if (have < want) {
                fprintf(stderr, "tcp_wire: rank %d's times for %zu bytes are short\n", r, a.sizes[si]);
                status = 1;
                break;
            }
        }
        if (status) {
            break;
        }
        /* per iteration the slowest rank, then the median over iterations */
        double *worst = calloc((size_t)iters, sizeof(double));
        for (int it = 0; it < iters; it++) {
            for (int r = 0; r < n; r++) {
                double t = all[(size_t)r * MAX_ITERS + (size_t)it];
                worst[it] = t > worst[it] ? t : worst[it];
            }
        }
        qsort(worst, (size_t)iters, sizeof(double), cmp_double);
        double med = iters % 2 ? worst[iters / 2] : 0.5 * (worst[iters / 2 - 1] + worst[iters / 2]);
        double us = med * 1e6, algbw = (double)a.sizes[si] / med / 1e9;
        double busbw = algbw * 2.0 * (n - 1) / n;
        printf("%14zu %8d %12.2f %11.3f %11.3f  %s\n", a.sizes[si], iters, us, algbw, busbw, ok ? "ok" : "FAIL");
        if (json) {
            fprintf(json,
                    "{\"impl\": \"wire\", \"transport\": \"tcp\", \"np\": %d, \"bytes\": %zu, \"time_us\": %.3f, "
                    "\"iters\": %d, \"algbw_gbps\": %.4f, \"busbw_gbps\": %.4f, \"check\": \"%s\", "
                    "\"wire_bytes_per_rank\": %zu, \"sockbuf\": %d, \"cc\": \"%s\"}\n",
                    n, a.sizes[si], us, iters, algbw, busbw, ok ? "ok" : "FAIL",
                    a.sizes[si] / (size_t)n * 2 * (size_t)(n - 1), a.sockbuf, a.cc);
            fflush(json);
        }
        status = ok ? 0 : 1;
        free(worst);
    }
    if (json) {
        fclose(json);
    }
    for (int r = 0; r < n; r++) {
        int st = 0;
        if (status) {
            kill(pids[r], SIGKILL);
        }
        waitpid(pids[r], &st, 0);
        if (!status && !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
            status = 1;
        }
    }
    for (int r = 0; r < n; r++) {
        close(listeners[r]);
        close(pipes[r][0]);
    }
    free(all);
    free(listeners);
    free(addrs);
    free(pipes);
    free(pids);
    return status;
}

/*
 * The NCCL C API of libdshim.so on host buffers, with real processes.
 *
 *   nccl_api SCENARIO NPROCS
 *
 * Scenarios: collectives, groups, split, nonblocking, initall, abort, killed,
 * exit_clean, errors, labels.  Ranks are forked by tests/common/ranks.c; the
 * ncclUniqueId made by rank 0 reaches the others through a file, as a
 * launcher or torch's store would carry it.  Links libdshim.so only (the
 * symbols a program linked against libnccl would find).
 */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <nccl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dshim.h"
#include "ranks.h"

static int g_rank = -1, g_fail = 0;
static char g_dir[256];

#define CHECK(cond, ...)                                                              \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "FAIL rank %d line %d: ", g_rank, __LINE__);              \
            fprintf(stderr, __VA_ARGS__);                                             \
            fputc('\n', stderr);                                                      \
            g_fail++;                                                                 \
        }                                                                             \
    } while (0)

#define NCCLOK(call)                                                                  \
    do {                                                                              \
        ncclResult_t r_ = (call);                                                     \
        if (r_ != ncclSuccess) {                                                      \
            fprintf(stderr, "FAIL rank %d line %d: %s -> %d (%s): %s\n", g_rank, __LINE__, #call, (int)r_, \
                    ncclGetErrorString(r_), ncclGetLastError(NULL));                  \
            return 1;                                                                 \
        }                                                                             \
    } while (0)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* --- the id, carried through a file ------------------------------------- */

static int share_id(int rank, const char *name, ncclUniqueId *id)
{
    char path[512], tmp[520];
    snprintf(path, sizeof(path), "%s/%s", g_dir, name);
    if (rank == 0) {
        if (ncclGetUniqueId(id) != ncclSuccess) {
            fprintf(stderr, "FAIL ncclGetUniqueId: %s\n", ncclGetLastError(NULL));
            return -1;
        }
        snprintf(tmp, sizeof(tmp), "%s.tmp", path);
        FILE *f = fopen(tmp, "wb");
        if (!f || fwrite(id, sizeof(*id), 1, f) != 1 || fclose(f) != 0 || rename(tmp, path) != 0) {
            fprintf(stderr, "FAIL writing %s: %s\n", path, strerror(errno));
            return -1;
        }
        return 0;
    }
    double deadline = now_s() + 30;
    while (now_s() < deadline) {
        FILE *f = fopen(path, "rb");
        if (f) {
            size_t got = fread(id, sizeof(*id), 1, f);
            fclose(f);
            if (got == 1) {
                return 0;
            }
        }
        sleep_s(0.005);
    }
    fprintf(stderr, "FAIL rank %d: no id in %s after 30 s\n", rank, path);
    return -1;
}

static int init_comm(int rank, int size, const char *name, ncclComm_t *comm)
{
    ncclUniqueId id;
    if (share_id(rank, name, &id) != 0) {
        return -1;
    }
    ncclResult_t r = ncclCommInitRank(comm, size, id, rank);
    if (r != ncclSuccess) {
        fprintf(stderr, "FAIL rank %d: ncclCommInitRank -> %d: %s\n", rank, (int)r, ncclGetLastError(NULL));
        return -1;
    }
    return 0;
}

/* Creates NAME.<rank>, then waits (bounded) until NAME.<r> exists for every
 * rank r in [first, last]: a barrier outside the communicator under test. */
static void file_barrier(const char *name, int rank, int first, int last)
{
    char path[600];
    snprintf(path, sizeof(path), "%s/%s.%d", g_dir, name, rank);
    FILE *f = fopen(path, "w");
    if (f) {
        fclose(f);
    }
    double deadline = now_s() + 20;
    for (int r = first; r <= last; r++) {
        snprintf(path, sizeof(path), "%s/%s.%d", g_dir, name, r);
        while (access(path, F_OK) != 0 && now_s() < deadline) {
            sleep_s(0.005);
        }
    }
}

/* --- typed values --------------------------------------------------------- */

static const ncclDataType_t all_types[] = {ncclInt8,    ncclUint8,   ncclInt32,   ncclUint32,
                                           ncclInt64,   ncclUint64,  ncclFloat16, ncclFloat32,
                                           ncclFloat64, ncclBfloat16};
#define NTYPES (sizeof(all_types) / sizeof(all_types[0]))

static size_t tsize(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
    }
}

static int is_float(ncclDataType_t t)
{
    return t == ncclFloat16 || t == ncclFloat32 || t == ncclFloat64 || t == ncclBfloat16;
}

static unsigned short to_bf16(float f)
{
    unsigned u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}

static float from_bf16(unsigned short b)
{
    unsigned u = (unsigned)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void put(void *buf, size_t i, ncclDataType_t t, double v)
{
    switch (t) {
    case ncclInt8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case ncclUint8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case ncclInt32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case ncclUint32: ((uint32_t *)buf)[i] = (uint32_t)v; break;
    case ncclInt64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case ncclUint64: ((uint64_t *)buf)[i] = (uint64_t)v; break;
    case ncclFloat16: ((_Float16 *)buf)[i] = (_Float16)v; break;
    case ncclFloat32: ((float *)buf)[i] = (float)v; break;
    case ncclFloat64: ((double *)buf)[i] = v; break;
    case ncclBfloat16: ((unsigned short *)buf)[i] = to_bf16((float)v); break;
    default: break;
    }
}

static double get(const void *buf, size_t i, ncclDataType_t t)
{
    switch (t) {
    case ncclInt8: return ((const int8_t *)buf)[i];
    case ncclUint8: return ((const uint8_t *)buf)[i];
    case ncclInt32: return ((const int32_t *)buf)[i];
    case ncclUint32: return ((const uint32_t *)buf)[i];
    case ncclInt64: return (double)((const int64_t *)buf)[i];
    case ncclUint64: return (double)((const uint64_t *)buf)[i];
    case ncclFloat16: return (double)((const _Float16 *)buf)[i];
    case ncclFloat32: return ((const float *)buf)[i];
    case ncclFloat64: return ((const double *)buf)[i];
    case ncclBfloat16: return from_bf16(((const unsigned short *)buf)[i]);
    default: return NAN;
    }
}

/* Small integers: every reduction order is exact in every type. */
static double val(ncclRedOp_t op, int r, size_t i)
{
    switch ((int)op) {
    case ncclProd: return 1 + (double)((r + i) % 2);
    case ncclMax:
    case ncclMin: return (double)((r * 3 + i * 7) % 11);
    default: return 1 + (double)((r + i) % 4);
    }
}

static double expect_reduced(ncclRedOp_t op, ncclDataType_t t, int n, size_t i)
{
    double acc = val(op, 0, i);
    for (int r = 1; r < n; r++) {
        double v = val(op, r, i);
        switch ((int)op) {
        case ncclProd: acc *= v; break;
        case ncclMax: acc = v > acc ? v : acc; break;
        case ncclMin: acc = v < acc ? v : acc; break;
        default: acc += v; break;
        }
    }
    if (op == ncclAvg) {
        acc = is_float(t) ? acc / n : floor(acc / n);
    }
    return acc;
}

static int close_enough(double got, double want, ncclDataType_t t)
{
    double tol = (t == ncclFloat16 || t == ncclBfloat16) ? 1e-2 : 1e-6;
    return fabs(got - want) <= tol * (fabs(want) > 1 ? fabs(want) : 1);
}

static const char *op_name(ncclRedOp_t op)
{
    static const char *names[] = {"sum", "prod", "max", "min", "avg"};
    return (int)op < 5 ? names[op] : "premulsum";
}

/* --- scenario: collectives ---------------------------------------------- */

static int check_allreduce(ncclComm_t comm, int rank, int n, ncclDataType_t t, ncclRedOp_t op, size_t count,
                           int in_place)
{
    size_t es = tsize(t);
    char *s = malloc(count * es + 1), *r = malloc(count * es + 1);
    for (size_t i = 0; i < count; i++) {
        put(s, i, t, val(op, rank, i));
    }
    NCCLOK(ncclAllReduce(s, in_place ? s : r, count, t, op, comm, NULL));
    const char *out = in_place ? s : r;
    int bad = 0;
    for (size_t i = 0; i < count && bad < 3; i++) {
        double want = expect_reduced(op, t, n, i);
        if (!close_enough(get(out, i, t), want, t)) {
            CHECK(0, "allreduce type %d op %s%s i %zu: got %g want %g", (int)t, op_name(op),
                  in_place ? " in place" : "", i, get(out, i, t), want);
            bad++;
        }
    }
    free(s);
    free(r);
    return 0;
}

static int check_rooted_and_gathers(ncclComm_t comm, int rank, int n, ncclDataType_t t)
{
    const size_t count = 37;
    size_t es = tsize(t);
    char *s = calloc(count * (size_t)n, es), *r = calloc(count * (size_t)n, es);
    /* broadcast from the last rank, out of place; ncclBcast from rank 0 */
    for (size_t i = 0; i < count; i++) {
        put(s, i, t, val(ncclSum, rank, i));
    }
    NCCLOK(ncclBroadcast(s, r, count, t, n - 1, comm, NULL));
    for (size_t i = 0; i < count; i++) {
        CHECK(get(r, i, t) == val(ncclSum, n - 1, i), "broadcast type %d i %zu", (int)t, i);
    }
    NCCLOK(ncclBcast(s, count, t, 0, comm, NULL));
    for (size_t i = 0; i < count; i++) {
        CHECK(get(s, i, t) == val(ncclSum, 0, i), "bcast type %d i %zu", (int)t, i);
    }
    /* reduce (max) to rank 1 % n */
    int root = 1 % n;
    for (size_t i = 0; i < count; i++) {
        put(s, i, t, val(ncclMax, rank, i));
    }
    NCCLOK(ncclReduce(s, rank == root ? r : NULL, count, t, ncclMax, root, comm, NULL));
    if (rank == root) {
        for (size_t i = 0; i < count; i++) {
            CHECK(get(r, i, t) == expect_reduced(ncclMax, t, n, i), "reduce type %d i %zu", (int)t, i);
        }
    }
    /* allgather, out of place and in place (sendbuff = recvbuff + rank*count) */
    for (int inplace = 0; inplace < 2; inplace++) {
        memset(r, 0, count * (size_t)n * es);
        char *src = inplace ? r + (size_t)rank * count * es : s;
        for (size_t i = 0; i < count; i++) {
            put(src, i, t, val(ncclSum, rank, i));
        }
        NCCLOK(ncclAllGather(src, r, count, t, comm, NULL));
        for (int p = 0; p < n; p++) {
            for (size_t i = 0; i < count; i++) {
                CHECK(get(r, (size_t)p * count + i, t) == val(ncclSum, p, i), "allgather%s type %d p %d i %zu",
                      inplace ? " in place" : "", (int)t, p, i);
            }
        }
    }
    /* reduce-scatter (sum, avg), out of place and in place */
    ncclRedOp_t rs_ops[] = {ncclSum, ncclAvg};
    for (int k = 0; k < 2; k++) {
        for (int inplace = 0; inplace < 2; inplace++) {
            for (size_t i = 0; i < count * (size_t)n; i++) {
                put(s, i, t, val(rs_ops[k], rank, i));
            }
            char *dst = inplace ? s + (size_t)rank * count * es : r;
            NCCLOK(ncclReduceScatter(s, dst, count, t, rs_ops[k], comm, NULL));
            for (size_t i = 0; i < count; i++) {
                double want = expect_reduced(rs_ops[k], t, n, (size_t)rank * count + i);
                CHECK(close_enough(get(dst, i, t), want, t), "reducescatter %s%s type %d i %zu: got %g want %g",
                      op_name(rs_ops[k]), inplace ? " in place" : "", (int)t, i, get(dst, i, t), want);
            }
        }
    }
    /* alltoall: block j of rank p holds p*100 + j */
    for (int j = 0; j < n; j++) {
        for (size_t i = 0; i < count; i++) {
            put(s, (size_t)j * count + i, t, (double)((rank * 10 + j + (int)i) % 100));
        }
    }
    NCCLOK(ncclAlltoAll(s, r, count, t, comm, NULL));
    for (int p = 0; p < n; p++) {
        for (size_t i = 0; i < count; i++) {
            CHECK(get(r, (size_t)p * count + i, t) == (double)((p * 10 + rank + (int)i) % 100),
                  "alltoall type %d from %d i %zu", (int)t, p, i);
        }
    }
    /* gather to 0, scatter from n-1 */
    for (size_t i = 0; i < count; i++) {
        put(s, i, t, val(ncclSum, rank, i));
    }
    NCCLOK(ncclGather(s, r, count, t, 0, comm, NULL));
    if (rank == 0) {
        for (int p = 0; p < n; p++) {
            for (size_t i = 0; i < count; i++) {
                CHECK(get(r, (size_t)p * count + i, t) == val(ncclSum, p, i), "gather type %d p %d", (int)t, p);
            }
        }
    }
    for (int p = 0; p < n; p++) {
        for (size_t i = 0; i < count; i++) {
            put(s, (size_t)p * count + i, t, (double)((p + (int)i) % 7));
        }
    }
    NCCLOK(ncclScatter(s, r, count, t, n - 1, comm, NULL));
    for (size_t i = 0; i < count; i++) {
        CHECK(get(r, i, t) == (double)((rank + (int)i) % 7), "scatter type %d i %zu", (int)t, i);
    }
    free(s);
    free(r);
    return 0;
}

static int check_premulsum(ncclComm_t comm, int rank, int n)
{
    const ncclDataType_t types[] = {ncclFloat32, ncclFloat64, ncclFloat16, ncclBfloat16, ncclInt32};
    const size_t count = 29;
    for (size_t k = 0; k < sizeof(types) / sizeof(types[0]); k++) {
        ncclDataType_t t = types[k];
        size_t es = tsize(t);
        unsigned char scalar[8];
        double factor = is_float(t) ? 0.5 : 3;
        put(scalar, 0, t, factor);
        char *s = malloc(count * es * (size_t)n), *r = malloc(count * es * (size_t)n);
        for (int residence = 0; residence < 2; residence++) {
            ncclRedOp_t op;
            NCCLOK(ncclRedOpCreatePreMulSum(&op, scalar, t,
                                            residence ? ncclScalarDevice : ncclScalarHostImmediate, comm));
            CHECK((int)op >= (int)ncclNumOps, "a PreMulSum op is a dynamic op (got %d)", (int)op);
            /* host-immediate: read now; device-residence: read when the op
             * runs, so a change made after creation counts */
            double used = factor;
            if (residence) {
                used = is_float(t) ? 2.0 : 5;
            }
            put(scalar, 0, t, is_float(t) ? 2.0 : 5);
            for (size_t i = 0; i < count * (size_t)n; i++) {
                put(s, i, t, val(ncclSum, rank, i));
            }
            NCCLOK(ncclAllReduce(s, r, count, t, op, comm, NULL));
            for (size_t i = 0; i < count; i++) {
                double want = expect_reduced(ncclSum, t, n, i) * used;
                CHECK(close_enough(get(r, i, t), want, t), "premulsum allreduce type %d residence %d i %zu: got %g "
                      "want %g", (int)t, residence, i, get(r, i, t), want);
            }
            NCCLOK(ncclReduceScatter(s, r, count, t, op, comm, NULL));
            for (size_t i = 0; i < count; i++) {
                double want = expect_reduced(ncclSum, t, n, (size_t)rank * count + i) * used;
                CHECK(close_enough(get(r, i, t), want, t), "premulsum reducescatter type %d i %zu", (int)t, i);
            }
            NCCLOK(ncclReduce(s, r, count, t, op, 0, comm, NULL));
            if (rank == 0) {
                for (size_t i = 0; i < count; i++) {
                    CHECK(close_enough(get(r, i, t), expect_reduced(ncclSum, t, n, i) * used, t),
                          "premulsum reduce type %d i %zu", (int)t, i);
                }
            }
            NCCLOK(ncclRedOpDestroy(op, comm));
            put(scalar, 0, t, factor);
            /* a destroyed op is refused */
            CHECK(ncclAllReduce(s, r, count, t, op, comm, NULL) == ncclInvalidArgument,
                  "a destroyed PreMulSum op must be refused");
        }
        /* an op made for one type is refused for another */
        ncclRedOp_t op;
        NCCLOK(ncclRedOpCreatePreMulSum(&op, scalar, t, ncclScalarHostImmediate, comm));
        ncclDataType_t other = t == ncclFloat64 ? ncclFloat32 : ncclFloat64;
        CHECK(ncclAllReduce(s, r, count, other, op, comm, NULL) == ncclInvalidArgument,
              "PreMulSum op used with another datatype must be refused");
        NCCLOK(ncclRedOpDestroy(op, comm));
        free(s);
        free(r);
    }
    return 0;
}

static int body_collectives(int rank, int n, int port, void *arg)
{
    (void)port, (void)arg;
    g_rank = rank;
    ncclComm_t comm;
    if (init_comm(rank, n, "coll", &comm) != 0) {
        return 2;
    }
    int count, me, dev;
    NCCLOK(ncclCommCount(comm, &count));
    NCCLOK(ncclCommUserRank(comm, &me));
    NCCLOK(ncclCommCuDevice(comm, &dev));
    CHECK(count == n && me == rank && dev == 0, "count %d rank %d device %d", count, me, dev);
    const ncclRedOp_t ops[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};
    for (size_t k = 0; k < NTYPES; k++) {
        for (size_t o = 0; o < 5; o++) {
            if (check_allreduce(comm, rank, n, all_types[k], ops[o], 37, (int)(o % 2))) {
                return 1;
            }
        }
        if (check_rooted_and_gathers(comm, rank, n, all_types[k])) {
            return 1;
        }
    }
    /* beyond one pipeline chunk, and empty */
    if (check_allreduce(comm, rank, n, ncclFloat32, ncclSum, (size_t)1 << 20, 0) ||
        check_allreduce(comm, rank, n, ncclFloat32, ncclSum, 0, 0)) {
        return 1;
    }
    /* fp8: the enum must map to the right format (sum of ones = n) */
    unsigned char ones[4] = {0x38, 0x38, 0x38, 0x38}, out[4];
    const unsigned char e4m3[5] = {0, 0x38, 0x40, 0x44, 0x48};
    NCCLOK(ncclAllReduce(ones, out, 4, ncclFloat8e4m3, ncclSum, comm, NULL));
    CHECK(out[0] == e4m3[n] && out[3] == e4m3[n], "fp8 e4m3 sum of %d ones: %#x", n, out[0]);
    const unsigned char e5m2[5] = {0, 0x3c, 0x40, 0x42, 0x44};
    memset(ones, 0x3c, sizeof(ones));
    NCCLOK(ncclAllReduce(ones, out, 4, ncclFloat8e5m2, ncclSum, comm, NULL));
    CHECK(out[0] == e5m2[n], "fp8 e5m2 sum of %d ones: %#x", n, out[0]);
    if (check_premulsum(comm, rank, n)) {
        return 1;
    }
    ncclResult_t async;
    NCCLOK(ncclCommGetAsyncError(comm, &async));
    CHECK(async == ncclSuccess, "async error %d on a healthy communicator", (int)async);
    NCCLOK(ncclCommFinalize(comm));
    NCCLOK(ncclCommDestroy(comm));
    return g_fail ? 1 : 0;
}

/* --- scenario: groups ----------------------------------------------------- */

static int body_groups(int rank, int n, int port, void *arg)
{
    (void)port, (void)arg;
    g_rank = rank;
    ncclComm_t comm;
    if (init_comm(rank, n, "groups", &comm) != 0) {
        return 2;
    }
    /* fused allreduces of different types, in a nested group */
    const size_t count = 1000;
    float *a = malloc(count * sizeof(float));
    double *b = malloc(count * sizeof(double));
    int32_t *c = malloc(count * sizeof(int32_t));
    for (size_t i = 0; i < count; i++) {
        a[i] = (float)val(ncclSum, rank, i);
        b[i] = val(ncclSum, rank, i);
        c[i] = (int32_t)val(ncclMax, rank, i);
    }
    NCCLOK(ncclGroupStart());
    NCCLOK(ncclAllReduce(a, a, count, ncclFloat32, ncclSum, comm, NULL));
    NCCLOK(ncclGroupStart());
    NCCLOK(ncclAllReduce(b, b, count, ncclFloat64, ncclAvg, comm, NULL));
    NCCLOK(ncclGroupEnd());
    NCCLOK(ncclAllReduce(c, c, count, ncclInt32, ncclMax, comm, NULL));
    NCCLOK(ncclGroupEnd());
    for (size_t i = 0; i < count; i++) {
        CHECK(a[i] == (float)expect_reduced(ncclSum, ncclFloat32, n, i), "grouped sum i %zu", i);
        CHECK(close_enough(b[i], expect_reduced(ncclAvg, ncclFloat64, n, i), ncclFloat64), "grouped avg i %zu", i);
        CHECK(c[i] == (int32_t)expect_reduced(ncclMax, ncclInt32, n, i), "grouped max i %zu", i);
    }
    /* a ring of sends and receives, large enough that a send cannot finish
     * before its receive is posted, plus a send/recv to self */
    const size_t big = (size_t)4 << 20; /* floats: 16 MiB, beyond the shm ring */
    float *sb = malloc(big * sizeof(float)), *rb = malloc(big * sizeof(float));
    float self_s[5] = {1, 2, 3, 4, (float)rank}, self_r[5] = {0};
    for (size_t i = 0; i < big; i++) {
        sb[i] = (float)(rank * 1000 + (int)(i % 997));
    }
    int right = (rank + 1) % n, left = (rank + n - 1) % n;
    NCCLOK(ncclGroupStart());
    NCCLOK(ncclSend(sb, big, ncclFloat32, right, comm, NULL));
    NCCLOK(ncclRecv(self_r, 5, ncclFloat32, rank, comm, NULL));
    NCCLOK(ncclRecv(rb, big, ncclFloat32, left, comm, NULL));
    NCCLOK(ncclSend(self_s, 5, ncclFloat32, rank, comm, NULL));
    NCCLOK(ncclGroupEnd());
    for (size_t i = 0; i < big; i += 4099) {
        CHECK(rb[i] == (float)(left * 1000 + (int)(i % 997)), "ring recv i %zu: %g", i, rb[i]);
    }
    CHECK(self_r[4] == (float)rank && self_r[0] == 1, "self send/recv");
    /* alltoall as PyTorch writes it: sends and receives to every rank, self included */
    const size_t blk = 300;
    int64_t *as = malloc((size_t)n * blk * 8), *ar = malloc((size_t)n * blk * 8);
    for (int p = 0; p < n; p++) {
        for (size_t i = 0; i < blk; i++) {
            as[(size_t)p * blk + i] = rank * 100000 + p * 1000 + (int64_t)i;
        }
    }
    NCCLOK(ncclGroupStart());
    for (int p = 0; p < n; p++) {
        NCCLOK(ncclSend(as + (size_t)p * blk, blk, ncclInt64, p, comm, NULL));
        NCCLOK(ncclRecv(ar + (size_t)p * blk, blk, ncclInt64, p, comm, NULL));
    }
    NCCLOK(ncclGroupEnd());
    for (int p = 0; p < n; p++) {
        CHECK(ar[(size_t)p * blk + 7] == p * 100000 + rank * 1000 + 7, "p2p alltoall from %d", p);
    }
    /* a collective and point-to-point in one group */
    float x = (float)rank, y = -1;
    NCCLOK(ncclGroupStart());
    NCCLOK(ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, comm, NULL));
    float z = (float)rank;
    NCCLOK(ncclSend(&z, 1, ncclFloat32, right, comm, NULL));
    NCCLOK(ncclRecv(&y, 1, ncclFloat32, left, comm, NULL));
    NCCLOK(ncclGroupEnd());
    CHECK(x == (float)(n * (n - 1) / 2), "allreduce in a mixed group: %g", x);
    CHECK(y == (float)left, "recv in a mixed group: %g", y);
    /* misuse */
    CHECK(ncclGroupEnd() == ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart must be ncclInvalidUsage");
    CHECK(ncclSend(self_s, 5, ncclFloat32, rank, comm, NULL) == ncclInvalidUsage,
          "a send to self outside a group must be ncclInvalidUsage");
    NCCLOK(ncclGroupStart());
    NCCLOK(ncclRecv(self_r, 5, ncclFloat32, rank, comm, NULL));
    CHECK(ncclGroupEnd() == ncclInvalidUsage, "a receive from self without a send to self");
    NCCLOK(ncclGroupStart());
    NCCLOK(ncclSend(self_s, 4, ncclFloat32, rank, comm, NULL));
    NCCLOK(ncclRecv(self_r, 5, ncclFloat32, rank, comm, NULL));
    CHECK(ncclGroupEnd() == ncclInvalidArgument, "send/recv to self of different sizes");
    ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER, badsim = NCCL_SIM_INFO_INITIALIZER;
    badsim.magic = 1;
    CHECK(ncclGroupSimulateEnd(&sim) == ncclInvalidUsage, "simulate-end without a group");
    NCCLOK(ncclGroupStart());
    CHECK(ncclGroupSimulateEnd(&badsim) == ncclInvalidArgument, "simulate-end with a bad simInfo");
    NCCLOK(ncclGroupEnd());
    NCCLOK(ncclGroupStart());
    NCCLOK(ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, comm, NULL));
    NCCLOK(ncclGroupSimulateEnd(&sim));
    CHECK(sim.estimatedTime == 0.0f, "simulated time");
    NCCLOK(ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, comm, NULL)); /* the simulated one never ran */
    CHECK(x == (float)(n * (n - 1) / 2 * n), "after a simulated group: %g", x);
    NCCLOK(ncclCommDestroy(comm));
    free(a), free(b), free(c), free(sb), free(rb), free(as), free(ar);
    return g_fail ? 1 : 0;
}

/* --- scenario: split ------------------------------------------------------ */

static int body_split(int rank, int n, int port, void *arg)
{
    (void)port, (void)arg;
    g_rank = rank;
    ncclComm_t comm, half, most;
    if (init_comm(rank, n, "split", &comm) != 0) {
        return 2;
    }
    /* by parity, in reverse rank order */
    NCCLOK(ncclCommSplit(comm, rank % 2, -rank, &half, NULL));
    int hc, hr;
    NCCLOK(ncclCommCount(half, &hc));
    NCCLOK(ncclCommUserRank(half, &hr));
    int members = (n - rank % 2 + 1) / 2, above = 0;
    for (int r = rank + 2; r < n; r += 2) {
        above++;
    }
    CHECK(hc == members && hr == above, "split: size %d (want %d), rank %d (want %d)", hc, members, hr, above);
    int v = rank, want = 0;
    for (int r = rank % 2; r < n; r += 2) {
        want += r;
    }
    NCCLOK(ncclAllReduce(&v, &v, 1, ncclInt32, ncclSum, half, NULL));
    CHECK(v == want, "sum over the parity class: %d want %d", v, want);
    /* the last rank stays out */
    NCCLOK(ncclCommSplit(comm, rank == n - 1 ? NCCL_SPLIT_NOCOLOR : 7, rank, &most, NULL));
    if (rank == n - 1) {
        CHECK(most == NULL, "NCCL_SPLIT_NOCOLOR must give a NULL communicator");
    } else {
        int mc;
        NCCLOK(ncclCommCount(most, &mc));
        CHECK(mc == n - 1, "split without the last rank: size %d", mc);
        double d = 1;
        NCCLOK(ncclAllReduce(&d, &d, 1, ncclFloat64, ncclSum, most, NULL));
        CHECK(d == n - 1, "allreduce on the split: %g", d);
        NCCLOK(ncclCommDestroy(most));
    }
    /* argument errors come back at once, before any exchange */
    CHECK(ncclCommSplit(comm, -5, 0, &most, NULL) == ncclInvalidArgument, "negative color");
    CHECK(ncclCommSplit(comm, 0, 0, NULL, NULL) == ncclInvalidArgument, "NULL newcomm");
    /* the parent still works after a child went; a child outlives its parent */
    NCCLOK(ncclAllReduce(&v, &v, 1, ncclInt32, ncclMax, comm, NULL));
    double t0 = now_s();
    NCCLOK(ncclCommDestroy(comm));
    int w = 1;
    NCCLOK(ncclAllReduce(&w, &w, 1, ncclInt32, ncclSum, half, NULL));
    CHECK(w == members, "allreduce on a split after its parent's destroy: %d", w);
    NCCLOK(ncclCommDestroy(half));
    CHECK(now_s() - t0 < 10, "destroying took %.1f s", now_s() - t0);
    return g_fail ? 1 : 0;
}

/* --- scenario: non-blocking communicators ---------------------------------- */

static int wait_ready(ncclComm_t comm)
{
    ncclResult_t st = ncclInProgress;
    double deadline = now_s() + 30;
    while (now_s() < deadline) {
        NCCLOK(ncclCommGetAsyncError(comm, &st));
        if (st != ncclInProgress) {
            break;
        }
        sleep_s(0.001);
    }
    CHECK(st == ncclSuccess, "non-blocking init ended with %d", (int)st);
    return st == ncclSuccess ? 0 : 1;
}

static int body_nonblocking(int rank, int n, int port, void *arg)
{
    (void)port, (void)arg;
    g_rank = rank;
    ncclUniqueId id;
    if (share_id(rank, "nb", &id) != 0) {
        return 2;
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm;
    ncclResult_t r = ncclCommInitRankConfig(&comm, n, id, rank, &config);
    CHECK(r == ncclInProgress || r == ncclSuccess, "non-blocking init returned %d", (int)r);
    if (wait_ready(comm)) {
        return 1;
    }
    float x = 1;
    NCCLOK(ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, comm, NULL));
    CHECK(x == n, "allreduce on a non-blocking communicator: %g", x);
    ncclComm_t sub;
    r = ncclCommSplit(comm, 0, rank, &sub, &config);
    CHECK(r == ncclSuccess || r == ncclInProgress, "non-blocking split returned %d", (int)r);
    if (wait_ready(sub)) {
        return 1;
    }
    NCCLOK(ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, sub, NULL));
    CHECK(x == n * n, "allreduce on the split: %g", x);
    NCCLOK(ncclCommFinalize(sub));
    NCCLOK(ncclCommDestroy(sub));
    /* a bad config is refused */
    ncclConfig_t bad = NCCL_CONFIG_INITIALIZER;
    bad.magic = 0;
    ncclComm_t none;
    CHECK(ncclCommSplit(comm, 0, 0, &none, &bad) == ncclInvalidArgument, "config without the magic");
    ncclConfig_t two = NCCL_CONFIG_INITIALIZER;
    two.blocking = 2;
    CHECK(ncclCommSplit(comm, 0, 0, &none, &two) == ncclInvalidArgument, "config.blocking 2");
    NCCLOK(ncclCommFinalize(comm));
    NCCLOK(ncclCommDestroy(comm));
    return g_fail ? 1 : 0;
}

/* --- scenario: ncclCommInitAll (one process, several ranks) ---------------- */

static int body_initall(int rank, int n, int port, void *arg)
{
    (void)port, (void)arg, (void)n;
    g_rank = rank;
    enum { K = 3 };
    ncclComm_t comms[K];
    int devs[K] = {0, 0, 0};
    NCCLOK(ncclCommInitAll(comms, K, devs));
    float v[K][64];
    for (int k = 0; k < K; k++) {
        for (int i = 0; i < 64; i++) {
            v[k][i] = (float)(k + i);
        }
    }
    /* one thread drives every rank: only a group can do it */
    NCCLOK(ncclGroupStart());
    for (int k = 0; k < K; k++) {
        NCCLOK(ncclAllReduce(v[k], v[k], 64, ncclFloat32, ncclSum, comms[k], NULL));
    }
    NCCLOK(ncclGroupEnd());
    for (int k = 0; k < K; k++) {
        CHECK(v[k][5] == (float)(3 * 5 + 3), "initall allreduce rank %d: %g", k, v[k][5]);
        int c, u, d;
        NCCLOK(ncclCommCount(comms[k], &c));
        NCCLOK(ncclCommUserRank(comms[k], &u));
        NCCLOK(ncclCommCuDevice(comms[k], &d));
        CHECK(c == K && u == k && d == 0, "initall comm %d: count %d rank %d device %d", k, c, u, d);
    }
    int s[K], r[K];
    NCCLOK(ncclGroupStart());
    for (int k = 0; k < K; k++) {
        s[k] = 10 + k;
        NCCLOK(ncclSend(&s[k], 1, ncclInt32, (k + 1) % K, comms[k], NULL));
        NCCLOK(ncclRecv(&r[k], 1, ncclInt32, (k + K - 1) % K, comms[k], NULL));
    }
    NCCLOK(ncclGroupEnd());
    for (int k = 0; k < K; k++) {
        CHECK(r[k] == 10 + (k + K - 1) % K, "initall ring rank %d got %d", k, r[k]);
    }
    double t0 = now_s();
    for (int k = 0; k < K; k++) {
        NCCLOK(ncclCommDestroy(comms[k]));
    }
    CHECK(now_s() - t0 < 10, "destroying InitAll's communicators took %.1f s", now_s() - t0);
    /* the same by hand: every rank's init in one group, as NCCL's docs show */
    ncclUniqueId id;
    NCCLOK(ncclGetUniqueId(&id));
    NCCLOK(ncclGroupStart());
    for (int k = 0; k < K; k++) {
        NCCLOK(ncclCommInitRank(&comms[k], K, id, k));
    }
    NCCLOK(ncclGroupEnd());
    NCCLOK(ncclGroupStart());
    for (int k = 0; k < K; k++) {
        v[k][0] = 1;
        NCCLOK(ncclAllReduce(v[k], v[k], 1, ncclFloat32, ncclSum, comms[k], NULL));
    }
    NCCLOK(ncclGroupEnd());
    CHECK(v[2][0] == K, "group-initialized ranks: %g", v[2][0]);
    t0 = now_s();
    for (int k = 0; k < K; k++) {
        NCCLOK(ncclCommDestroy(comms[k]));
    }
    CHECK(now_s() - t0 < 10, "destroying group-initialized communicators took %.1f s", now_s() - t0);
    return g_fail ? 1 : 0;
}

/* --- scenario: abort unblocks stuck work --------------------------------- */

typedef struct stuck {
    ncclComm_t comm;
    ncclResult_t res;
    double seconds;
} stuck_t;

static void *stuck_recv(void *arg)
{
    stuck_t *s = arg;
    float x = 1;
    double t0 = now_s();
    s->res = ncclRecv(&x, 1, ncclFloat32, 1, s->comm, NULL);  /* rank 1 never sends */
    s->seconds = now_s() - t0;
    return NULL;
}

static int body_abort(int rank, int n, int port, void *arg)
{
    (void)port, (void)arg;
    g_rank = rank;
    ncclComm_t comm;
    if (init_comm(rank, n, "abort", &comm) != 0) {
        return 2;
    }
    float x = 1;
    NCCLOK(ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, comm, NULL));
    if (rank == 0) {
        /* rank 0 is stuck in a receive its peer never sends */
        stuck_t s = {.comm = comm};
        pthread_t th;
        pthread_create(&th, NULL, stuck_recv, &s);
        sleep_s(0.5);
        double t0 = now_s();
        NCCLOK(ncclCommAbort(comm));
        double took = now_s() - t0;
        pthread_join(th, NULL);
        CHECK(s.res != ncclSuccess, "the stuck receive must fail after the abort");
        CHECK(took < 5, "ncclCommAbort took %.1f s", took);
        fprintf(stderr, "rank 0: stuck receive -> %d after %.2f s, abort took %.2f s\n", (int)s.res, s.seconds,
                took);
        file_barrier("aborted", 0, 0, 0);
        file_barrier("checked", 0, 1, n - 1);  /* keep the store up while the others look */
        return g_fail ? 1 : 0;
    }
    /* the others, once rank 0 aborted: their next collective fails fast */
    file_barrier("aborted", rank, 0, 0);
    double t0 = now_s();
    ncclResult_t r = ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, comm, NULL);
    CHECK(r == ncclRemoteError, "allreduce after a peer aborted: %d, want ncclRemoteError", (int)r);
    CHECK(now_s() - t0 < 5, "the failure took %.1f s", now_s() - t0);
    CHECK(strstr(ncclGetLastError(comm), "abort") != NULL, "the error names the abort: %s", ncclGetLastError(comm));
    NCCLOK(ncclCommAbort(comm));
    file_barrier("checked", rank, 1, n - 1);
    return g_fail ? 1 : 0;
}

/* --- scenario: a peer killed: the async error comes within seconds ---------- */

static int body_killed(int rank, int n, int port, void *arg)
{
    (void)port, (void)arg;
    g_rank = rank;
    ncclComm_t comm;
    if (init_comm(rank, n, "killed", &comm) != 0) {
        return 2;
    }
    float x = 1;
    NCCLOK(ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, comm, NULL));
    if (rank == n - 1) {
        fflush(stderr);
        kill(getpid(), SIGKILL);
    }
    /* a watchdog polling an idle communicator */
    double t0 = now_s();
    ncclResult_t async = ncclSuccess;
    while (now_s() - t0 < 15) {
        NCCLOK(ncclCommGetAsyncError(comm, &async));
        if (async != ncclSuccess) {
            break;
        }
        sleep_s(0.01);
    }
    double took = now_s() - t0;
    CHECK(async == ncclRemoteError, "async error %d, want ncclRemoteError", (int)async);
    char want[32];
    snprintf(want, sizeof(want), "rank %d", n - 1);
    CHECK(strstr(ncclGetLastError(comm), want) != NULL, "the error names the dead %s: %s", want,
          ncclGetLastError(comm));
    fprintf(stderr, "rank %d: async error %d after %.2f s: %s\n", rank, (int)async, took, ncclGetLastError(comm));
    /* and later work fails at once instead of hanging */
    double t1 = now_s();
    CHECK(ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, comm, NULL) == ncclRemoteError, "collective after death");
    CHECK(now_s() - t1 < 2, "collective after death took %.1f s", now_s() - t1);
    file_barrier("detected", rank, 0, n - 2);  /* nobody leaves before all saw the death */
    NCCLOK(ncclCommAbort(comm));
    return g_fail ? 1 : 0;
}

/* --- scenario: a peer exiting normally is no error ------------------------ */

static int body_exit_clean(int rank, int n, int port, void *arg)
{
    (void)port, (void)arg;
    g_rank = rank;
    ncclComm_t comm;
    if (init_comm(rank, n, "exit", &comm) != 0) {
        return 2;
    }
    float x = 1;
    NCCLOK(ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, comm, NULL));
    if (rank != 0) {
        return 0;  /* exits without destroying: not a failure */
    }
    double t0 = now_s();
    ncclResult_t async = ncclSuccess;
    while (now_s() - t0 < 2 && async == ncclSuccess) {
        NCCLOK(ncclCommGetAsyncError(comm, &async));
        sleep_s(0.02);
    }
    CHECK(async == ncclSuccess, "a peer's normal exit was reported as error %d: %s", (int)async,
          ncclGetLastError(comm));
    NCCLOK(ncclCommAbort(comm));
    return g_fail ? 1 : 0;
}

/* --- scenario: the store behind an id is gone -------------------------------- */

static int body_init_fail(int rank, int n, int port, void *arg)
{
    (void)port, (void)arg, (void)n;
    g_rank = rank;
    ncclUniqueId id;
    if (share_id(rank, "gone", &id) != 0) {
        return 2;
    }
    if (rank == 0) {
        return 0;  /* its store goes with it */
    }
    sleep_s(0.3);  /* rank 0 is gone by now (or goes during the init: a failure too) */
    ncclComm_t comm = NULL;
    double t0 = now_s();
    ncclResult_t r = ncclCommInitRank(&comm, 2, id, 1);
    double took = now_s() - t0;
    CHECK(r != ncclSuccess && r != ncclInProgress && comm == NULL, "init on a vanished store returned %d", (int)r);
    CHECK(strstr(ncclGetLastError(NULL), "store") != NULL, "the error names the store: %s", ncclGetLastError(NULL));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    r = ncclCommInitRankConfig(&comm, 2, id, 1, &config);
    CHECK(r == ncclInProgress, "non-blocking init returned %d", (int)r);
    ncclResult_t async = ncclInProgress;
    while (async == ncclInProgress && now_s() - t0 < 30) {
        NCCLOK(ncclCommGetAsyncError(comm, &async));
        sleep_s(0.01);
    }
    CHECK(async != ncclSuccess && async != ncclInProgress, "non-blocking init on a vanished store: %d", (int)async);
    float x = 1;
    CHECK(ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, comm, NULL) != ncclSuccess, "use of a failed comm");
    NCCLOK(ncclCommDestroy(comm));
    fprintf(stderr, "rank 1: init on a vanished store failed after %.2f s\n", took);
    return g_fail ? 1 : 0;
}

/* --- scenario: a bad DSHIM_NCCL_* value (set by ctest) fails the init ------ */

static int body_bad_env(int rank, int n, int port, void *arg)
{
    (void)port, (void)arg, (void)n;
    g_rank = rank;
    ncclUniqueId id;
    NCCLOK(ncclGetUniqueId(&id));
    ncclComm_t comm = NULL;
    ncclResult_t r = ncclCommInitRank(&comm, 1, id, 0);
    const char *msg = ncclGetLastError(NULL);
    CHECK(r == ncclInvalidUsage && comm == NULL, "init with a bad setting returned %d", (int)r);
    CHECK(strstr(msg, "DSHIM_NCCL_") && strstr(msg, "fix or unset it"), "the error names the variable: %s", msg);
    fprintf(stderr, "rank %d: init refused as expected: %s\n", rank, msg);
    return g_fail ? 1 : 0;
}

/* --- scenario: flight-recorder labels --------------------------------------- */

/* The string value of "key" in one JSON line of a dump (dshim writes labels
 * and op names without escapes); "" when absent. */
static void json_str(const char *line, const char *key, char *out, size_t size)
{
    char pat[64];
    snprintf(pat, sizeof(pat), "\"%s\":\"", key);
    const char *p = strstr(line, pat);
    out[0] = 0;
    if (!p) {
        return;
    }
    p += strlen(pat);
    const char *q = strchr(p, '"');
    size_t n = q ? (size_t)(q - p) : 0;
    if (n >= size) {
        n = size - 1;
    }
    memcpy(out, p, n);
    out[n] = 0;
}

/* Every NCCL call labels the dshim operation it submits with its own name,
 * alone and in groups, on this rank's flight-recorder dump (dshim_trace_dump,
 * DSHIM_TRACE_DIR set by main); a call refused by its checks labels nothing. */
static int body_labels(int rank, int n, int port, void *arg)
{
    (void)port, (void)arg;
    g_rank = rank;
    ncclComm_t comm;
    if (init_comm(rank, n, "labels", &comm) != 0) {
        return 2;
    }
    enum { C = 8 };
    float a[C * TEST_MAX_RANKS], b[C * TEST_MAX_RANKS];
    for (int i = 0; i < C * TEST_MAX_RANKS; i++) {
        a[i] = 1.0f;
    }
    int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    NCCLOK(ncclAllReduce(a, b, C, ncclFloat32, ncclSum, comm, NULL));
    NCCLOK(ncclBroadcast(a, b, C, ncclFloat32, 0, comm, NULL));
    NCCLOK(ncclBcast(b, C, ncclFloat32, 0, comm, NULL));
    NCCLOK(ncclReduce(a, b, C, ncclFloat32, ncclSum, 0, comm, NULL));
    NCCLOK(ncclAllGather(a, b, C, ncclFloat32, comm, NULL));
    NCCLOK(ncclReduceScatter(a, b, C, ncclFloat32, ncclSum, comm, NULL));
    NCCLOK(ncclAlltoAll(a, b, C, ncclFloat32, comm, NULL));
    NCCLOK(ncclGather(a, b, C, ncclFloat32, 0, comm, NULL));
    NCCLOK(ncclScatter(a, b, C, ncclFloat32, 0, comm, NULL));
    /* refused before anything is submitted: no entry, and no label left over */
    CHECK(ncclAllReduce(a, b, C, (ncclDataType_t)1000, ncclSum, comm, NULL) == ncclInvalidArgument,
          "a bad datatype was accepted");
    NCCLOK(ncclGroupStart());
    NCCLOK(ncclSend(a, C, ncclFloat32, next, comm, NULL));
    NCCLOK(ncclRecv(b, C, ncclFloat32, prev, comm, NULL));
    NCCLOK(ncclGroupEnd());
    NCCLOK(ncclGroupStart());
    NCCLOK(ncclAllReduce(a, b, C, ncclFloat32, ncclMax, comm, NULL));
    NCCLOK(ncclBroadcast(a, b, C, ncclFloat32, n - 1, comm, NULL));
    NCCLOK(ncclGroupEnd());
    float scale = 0.5f;
    ncclRedOp_t premul;
    NCCLOK(ncclRedOpCreatePreMulSum(&premul, &scale, ncclFloat32, ncclScalarHostImmediate, comm));
    NCCLOK(ncclAllReduce(a, b, C, ncclFloat32, premul, comm, NULL));
    NCCLOK(ncclRedOpDestroy(premul, comm));
    CHECK(dshim_trace_dump() == DSHIM_OK, "dshim_trace_dump: %s", dshim_last_error());

    static const char *const all[] = {"ncclAllReduce", "ncclBroadcast", "ncclBcast",         "ncclReduce",
                                      "ncclAllGather", "ncclReduceScatter", "ncclAlltoAll",   "ncclGather",
                                      "ncclScatter",   "ncclSend",      "ncclRecv",          "ncclAllReduce",
                                      "ncclBroadcast", "ncclAllReduce"};
    const char *want[sizeof(all) / sizeof(all[0])];
    int nwant = 0;
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
        if (n > 1 || (strcmp(all[i], "ncclSend") && strcmp(all[i], "ncclRecv"))) {
            want[nwant++] = all[i];  /* alone, a rank's send to itself is a local copy: no entry */
        }
    }
    char dir[300], path[600], suffix[64];
    snprintf(dir, sizeof(dir), "%s/trace", g_dir);
    snprintf(suffix, sizeof(suffix), ".%d.jsonl", (int)getpid());
    path[0] = 0;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        size_t len = strlen(e->d_name), sl = strlen(suffix);
        if (strncmp(e->d_name, "dshim-trace.", 12) == 0 && len > sl && strcmp(e->d_name + len - sl, suffix) == 0) {
            snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        }
    }
    if (d) {
        closedir(d);
    }
    FILE *f = path[0] ? fopen(path, "r") : NULL;
    CHECK(f != NULL, "no dump dshim-trace.*%s in %s", suffix, dir);
    int k = 0;
    char line[4096], label[80], op[32], ring[128] = "", name[128], size_key[32];
    snprintf(size_key, sizeof(size_key), "\"size\":%d,", n);
    while (f && fgets(line, sizeof(line), f)) {
        json_str(line, "ring", name, sizeof(name));
        if (!strstr(line, "\"id\":")) {
            if (name[0] && strstr(line, size_key) && !ring[0]) {
                snprintf(ring, sizeof(ring), "%s", name);  /* the ring of this communicator */
            }
            continue;
        }
        if (strcmp(name, ring) != 0) {
            continue;
        }
        json_str(line, "label", label, sizeof(label));
        json_str(line, "op", op, sizeof(op));
        CHECK(k < nwant && strcmp(label, want[k]) == 0, "entry %d (op %s): label \"%s\", expected \"%s\"", k, op,
              label, k < nwant ? want[k] : "(no more entries)");
        k++;
    }
    if (f) {
        fclose(f);
    }
    CHECK(k == nwant, "%d entries in the dump, expected %d", k, nwant);
    NCCLOK(ncclCommFinalize(comm));
    NCCLOK(ncclCommDestroy(comm));
    if (!g_fail) {
        fprintf(stderr, "rank %d: %d entries labelled with their NCCL calls\n", rank, k);
    }
    return g_fail ? 1 : 0;
}

/* --- scenario: error paths (one rank) ------------------------------------- */

/* host functions of nccl_device.h (a C++ header): prototypes by ABI */
typedef struct team {
    int nRanks, rank, stride;
} team_t;
extern team_t ncclTeamWorld(ncclComm_t comm);
extern team_t ncclTeamLsa(ncclComm_t comm);
extern int ncclTeamRankToWorld(ncclComm_t comm, team_t team, int rank);
extern ncclResult_t ncclDevCommCreate(ncclComm_t comm, const void *reqs, void *out);

static int body_errors(int rank, int n, int port, void *arg)
{
    (void)port, (void)arg, (void)n;
    g_rank = rank;
    int version = 0;
    NCCLOK(ncclGetVersion(&version));
    CHECK(version == NCCL_VERSION_CODE, "version %d, header %d", version, NCCL_VERSION_CODE);
    CHECK(strcmp(ncclGetErrorString(ncclSuccess), "no error") == 0, "error string of success");
    for (int r = 0; r < ncclNumResults; r++) {
        CHECK(ncclGetErrorString((ncclResult_t)r)[0] != 0, "error string of %d", r);
    }
    CHECK(pncclGetErrorString == ncclGetErrorString || pncclGetErrorString(ncclRemoteError) ==
          ncclGetErrorString(ncclRemoteError), "pnccl aliases");
    ncclComm_t comm;
    if (init_comm(0, 1, "errors", &comm) != 0) {
        return 2;
    }
    float a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, b[8];
    /* every collective on one rank */
    NCCLOK(ncclAllReduce(a, b, 8, ncclFloat32, ncclSum, comm, NULL));
    CHECK(b[7] == 8, "one-rank allreduce");
    NCCLOK(ncclReduceScatter(a, b, 8, ncclFloat32, ncclMin, comm, NULL));
    NCCLOK(ncclAllGather(a, b, 8, ncclFloat32, comm, NULL));
    NCCLOK(ncclAlltoAll(a, b, 8, ncclFloat32, comm, NULL));
    NCCLOK(ncclGather(a, b, 8, ncclFloat32, 0, comm, NULL));
    NCCLOK(ncclScatter(a, b, 8, ncclFloat32, 0, comm, NULL));
    NCCLOK(ncclBroadcast(a, b, 8, ncclFloat32, 0, comm, NULL));
    NCCLOK(ncclReduce(a, b, 8, ncclFloat32, ncclProd, 0, comm, NULL));
    CHECK(b[2] == 3, "one-rank reduce");
    /* invalid arguments */
    CHECK(ncclAllReduce(a, b, 8, ncclFloat32, ncclSum, NULL, NULL) == ncclInvalidArgument, "NULL comm");
    CHECK(ncclAllReduce(a, b, 8, (ncclDataType_t)42, ncclSum, comm, NULL) == ncclInvalidArgument, "bad dtype");
    CHECK(ncclAllReduce(a, b, 8, ncclFloat32, (ncclRedOp_t)17, comm, NULL) == ncclInvalidArgument, "bad op");
    CHECK(ncclAllReduce(NULL, b, 8, ncclFloat32, ncclSum, comm, NULL) == ncclInvalidArgument, "NULL sendbuff");
    CHECK(ncclAllReduce(a, NULL, 8, ncclFloat32, ncclSum, comm, NULL) == ncclInvalidArgument, "NULL recvbuff");
    CHECK(ncclBroadcast(a, b, 8, ncclFloat32, 1, comm, NULL) == ncclInvalidArgument, "root out of range");
    CHECK(ncclReduce(a, b, 8, ncclFloat32, ncclSum, -1, comm, NULL) == ncclInvalidArgument, "negative root");
    CHECK(ncclSend(a, 8, ncclFloat32, 3, comm, NULL) == ncclInvalidArgument, "peer out of range");
    CHECK(strstr(ncclGetLastError(NULL), "peer 3") != NULL, "last error names the peer: %s",
          ncclGetLastError(NULL));
    CHECK(ncclRedOpDestroy(ncclSum, comm) == ncclInvalidArgument, "destroying a built-in op");
    CHECK(ncclRedOpDestroy((ncclRedOp_t)(ncclNumOps + 3), comm) == ncclInvalidArgument, "destroying an unknown op");
    ncclRedOp_t pm;
    CHECK(ncclRedOpCreatePreMulSum(&pm, a, (ncclDataType_t)77, ncclScalarHostImmediate, comm) ==
          ncclInvalidArgument, "PreMulSum of an invalid datatype");
    CHECK(ncclRedOpCreatePreMulSum(&pm, a, ncclFloat32, (ncclScalarResidence_t)9, comm) == ncclInvalidArgument,
          "PreMulSum with an invalid residence");
    CHECK(ncclRedOpCreatePreMulSum(NULL, a, ncclFloat32, ncclScalarHostImmediate, comm) == ncclInvalidArgument,
          "NULL op");
    int cnt;
    CHECK(ncclCommCount(comm, NULL) == ncclInvalidArgument, "NULL count");
    CHECK(ncclCommCount((ncclComm_t)a, &cnt) == ncclInvalidArgument, "not a communicator");
    ncclComm_t other;
    ncclUniqueId junk;
    memset(&junk, 0x5a, sizeof(junk));
    CHECK(ncclCommInitRank(&other, 2, junk, 0) == ncclInvalidArgument, "an id not made by dshim");
    ncclUniqueId id;
    NCCLOK(ncclGetUniqueId(&id));
    CHECK(ncclCommInitRank(&other, 2, id, 2) == ncclInvalidArgument, "rank >= nranks");
    CHECK(ncclCommInitRank(&other, 0, id, 0) == ncclInvalidArgument, "nranks 0");
    CHECK(ncclGetUniqueId(NULL) == ncclInvalidArgument, "NULL id");
    /* what dshim does not do: ncclInvalidUsage and a log line, never a crash */
    CHECK(ncclCommShrink(comm, NULL, 0, &other, NULL, 0) == ncclInvalidUsage, "shrink");
    CHECK(ncclCommRevoke(comm, 0) == ncclInvalidUsage, "revoke");
    team_t world = ncclTeamWorld(comm), lsa = ncclTeamLsa(comm);
    CHECK(world.nRanks == 1 && world.rank == 0 && world.stride == 1 && lsa.nRanks == 1, "teams");
    CHECK(ncclTeamRankToWorld(comm, world, 0) == 0, "team rank to world");
    char devcomm[256];
    CHECK(ncclDevCommCreate(comm, NULL, devcomm) == ncclInvalidUsage, "device communicators");
    ncclWindow_t win;
    CHECK(ncclCommWindowRegister(comm, a, sizeof(a), &win, NCCL_WIN_COLL_SYMMETRIC) == ncclInvalidUsage, "window");
    CHECK(ncclCommWindowDeregister(comm, win) == ncclInvalidUsage, "window deregister");
    /* memory and registration */
    void *mem = NULL, *handle = NULL;
    NCCLOK(ncclMemAlloc(&mem, 1 << 20));
    CHECK(mem != NULL && ((uintptr_t)mem & 4095) == 0, "ncclMemAlloc gives aligned memory");
    NCCLOK(ncclCommRegister(comm, mem, 1 << 20, &handle));
    NCCLOK(ncclAllReduce(mem, mem, 1000, ncclFloat32, ncclSum, comm, NULL));
    CHECK(ncclCommRegister(comm, mem, 16, NULL) == ncclInvalidArgument, "register without a handle");
    CHECK(ncclCommDeregister(comm, a) == ncclInvalidArgument, "deregister of a foreign handle");
    NCCLOK(ncclCommDeregister(comm, handle));
    NCCLOK(ncclMemFree(mem));
    CHECK(ncclMemFree(a) == ncclInvalidArgument, "freeing memory ncclMemAlloc did not give");
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    ncclResetDebugInit();
#pragma GCC diagnostic pop
    /* finalized: no more work */
    NCCLOK(ncclCommFinalize(comm));
    CHECK(ncclAllReduce(a, b, 8, ncclFloat32, ncclSum, comm, NULL) == ncclInvalidUsage, "work after finalize");
    NCCLOK(ncclCommDestroy(comm));
    NCCLOK(ncclCommDestroy(NULL));
    NCCLOK(ncclCommAbort(NULL));
    return g_fail ? 1 : 0;
}

/* --- driver ------------------------------------------------------------- */

typedef struct scenario {
    const char *name;
    test_rank_body_t body;
    int expect_killed; /* the last rank dies by SIGKILL */
} scenario_t;

static const scenario_t scenarios[] = {
    {"collectives", body_collectives, 0}, {"groups", body_groups, 0},   {"split", body_split, 0},
    {"nonblocking", body_nonblocking, 0}, {"initall", body_initall, 0}, {"abort", body_abort, 0},
    {"killed", body_killed, 1},           {"init_fail", body_init_fail, 0},           {"exit_clean", body_exit_clean, 0}, {"errors", body_errors, 0},
    {"bad_env", body_bad_env, 0},         {"labels", body_labels, 0},
};

static void cleanup_tree(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char path[600];
    while (d && (e = readdir(d))) {
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
            if (unlink(path) != 0 && errno == EISDIR) {
                cleanup_tree(path);  /* the labels scenario's trace directory */
            }
        }
    }
    if (d) {
        closedir(d);
    }
    rmdir(dir);
}

static void cleanup_dir(void)
{
    cleanup_tree(g_dir);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s SCENARIO NPROCS\n", argv[0]);
        return 2;
    }
    const scenario_t *sc = NULL;
    for (size_t i = 0; i < sizeof(scenarios) / sizeof(scenarios[0]); i++) {
        if (strcmp(scenarios[i].name, argv[1]) == 0) {
            sc = &scenarios[i];
        }
    }
    int n = atoi(argv[2]);
    if (!sc || n < 1 || n > TEST_MAX_RANKS) {
        fprintf(stderr, "unknown scenario %s or bad NPROCS %s\n", argv[1], argv[2]);
        return 2;
    }
    snprintf(g_dir, sizeof(g_dir), "/tmp/dshim-nccl-test-XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 2;
    }
    test_rank_result_t *res = calloc((size_t)n, sizeof(*res));
    double t0 = now_s();
    /* a store that vanished is noticed after DSHIM_CONNECT_TIMEOUT */
    const char *const short_connect[] = {"DSHIM_CONNECT_TIMEOUT=4", NULL};
    static char trace_dir[300];
    snprintf(trace_dir, sizeof(trace_dir), "DSHIM_TRACE_DIR=%s/trace", g_dir);
    const char *const trace_env[] = {trace_dir, "DSHIM_TRACE_FR=0", "DSHIM_TRACE_BUFFER=2000", NULL};
    const char *const *env = sc->body == body_init_fail ? short_connect : sc->body == body_labels ? trace_env : NULL;
    int rc = test_run_ranks(n, sc->body, NULL, env, 120.0, res);
    double took = now_s() - t0;
    cleanup_dir();
    int failed = rc != 0;
    for (int r = 0; r < n; r++) {
        int killed = sc->expect_killed && r == n - 1;
        int ok = killed ? (!res[r].exited && res[r].code == SIGKILL) : (res[r].exited && res[r].code == 0);
        if (!ok || strstr(res[r].err, "FAIL")) {
            failed = 1;
            fprintf(stderr, "---- rank %d (%s %d) stderr:\n%s\n", r, res[r].exited ? "exit" : "signal",
                    res[r].code, res[r].err);
        } else if (res[r].err[0] && getenv("NCCL_TEST_VERBOSE")) {
            fprintf(stderr, "---- rank %d stderr:\n%s\n", r, res[r].err);
        }
    }
    for (int r = 0; r < n && !failed; r++) {
        /* the figures the scenarios print (abort and async-error latencies) */
        for (const char *line = res[r].err; line && *line;) {
            const char *eol = strchr(line, '\n');
            size_t len = eol ? (size_t)(eol - line) : strlen(line);
            if (strncmp(line, "rank ", 5) == 0) {
                printf("%.*s\n", (int)len, line);
            }
            line = eol ? eol + 1 : NULL;
        }
    }
    free(res);
    printf("nccl_api %s np%d: %s in %.2f s\n", sc->name, n, failed ? "FAILED" : "passed", took);
    printf("%d passed, %d failed\n", failed ? 0 : 1, failed ? 1 : 0);
    return failed ? 1 : 0;
}

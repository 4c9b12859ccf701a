/*
 * dshim-cuda-bench: bandwidth of the CUDA reduction kernels
 * (backends/reduce/cuda) against the same GPU's device-to-device cudaMemcpy,
 * measured in the same run -- the target: every float32 op and the
 * float16/bfloat16 sum reach >= 80% of the copy bandwidth at 256 MiB.
 *
 * Bytes are counted as NCCL counts its reduce kernels: a reduce of n
 * elements of s bytes reads two operands and writes one result, 3*n*s bytes;
 * scale_div (AVG's final division) reads and writes the buffer, 2*n*s; a
 * copy of n*s bytes reads and writes them, 2*n*s.  "size" is the bytes of
 * one operand.
 *
 * Like the GPU tests it builds without CUDA headers: the kernels are reached
 * through shim/gpu (gpu_reduce.h) and device memory through the
 * dshim_cuda_test_* helpers of libdshim-cuda.so.  Exit codes: 0 every checked kernel met the
 * target, 1 one did not (or a CUDA call failed), 2 bad usage, 77 no
 * libdshim-cuda.so, CUDA runtime or device here (skipped).
 *
 *     dshim-cuda-bench [-m MAX_MIB] [-t TARGET] [-q] [-a]
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dshim.h"
#include "log.h"
#include "gpu_reduce.h"
#include "reduce/cuda/reduce_cuda.h"

#define SKIP_CODE 77
#define MIB ((size_t)1 << 20)

static dshim_cuda_test_alloc_fn dev_alloc;
static dshim_cuda_test_free_fn dev_free;
static dshim_cuda_test_copy_fn dev_copy;
static dshim_cuda_test_sync_fn dev_sync;
static dshim_cuda_test_describe_fn dev_describe;

static void *d_a, *d_b, *d_dst;
static unsigned char *h_fill;

/* What one timed call does. */
typedef enum { W_COPY, W_REDUCE, W_SCALE } work_kind_t;
typedef struct work {
    work_kind_t kind;
    dshim_dtype_t dtype;
    dshim_redop_t op;
    size_t bytes; /* of one operand */
} work_t;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static dshim_status_t run_once(const work_t *w)
{
    size_t count = w->kind == W_COPY ? w->bytes : w->bytes / dshim_dtype_size(w->dtype);
    switch (w->kind) {
    case W_COPY:
        return dev_copy(d_dst, d_a, w->bytes);
    case W_REDUCE:
        return dshim_gpu_reduce(d_dst, d_a, d_b, count, w->dtype, w->op, NULL);
    case W_SCALE:
        return dshim_gpu_scale_div(d_dst, count, w->dtype, 3, NULL);
    }
    return DSHIM_ERR_INVALID;
}

/* reps calls queued back to back, then one device synchronisation: the
 * host clock then sees the device time plus one sync (microseconds, against
 * runs of tens of milliseconds). */
static dshim_status_t run_reps(const work_t *w, int reps, double *seconds_p)
{
    double t0 = now_s();
    for (int r = 0; r < reps; r++) {
        dshim_status_t st = run_once(w);
        if (st != DSHIM_OK) {
            return st;
        }
    }
    dshim_status_t st = dev_sync();
    *seconds_p = now_s() - t0;
    return st;
}

/* Seconds per call: warm-up, a calibration run, then the best of three
 * runs of about `budget` seconds each. */
static dshim_status_t time_per_call(const work_t *w, double budget, double *per_call_p)
{
    double t = 0;
    dshim_status_t st = run_reps(w, 2, &t);
    if (st == DSHIM_OK) {
        st = run_reps(w, 3, &t);
    }
    if (st != DSHIM_OK) {
        return st;
    }
    double one = t / 3 > 1e-7 ? t / 3 : 1e-7;
    int reps = (int)(budget / one);
    reps = reps < 3 ? 3 : (reps > 20000 ? 20000 : reps);
    double best = 0;
    for (int trial = 0; trial < 3; trial++) {
        if ((st = run_reps(w, reps, &t)) != DSHIM_OK) {
            return st;
        }
        if (trial == 0 || t < best) {
            best = t;
        }
    }
    *per_call_p = best / reps;
    return DSHIM_OK;
}

/* Operands with ordinary values (no NaN or infinity paths): small numbers
 * in the element type, the same pattern in a and b. */
static void fill_pattern(unsigned char *buf, size_t bytes, dshim_dtype_t dt)
{
    size_t size = dshim_dtype_size(dt);
    size_t n = bytes / size;
    for (size_t i = 0; i < n; i++) {
        float f = 0.25f + (float)(i % 1013) * 0.001f;
        unsigned char *p = buf + i * size;
        switch (dt) {
        case DSHIM_FLOAT32:
            memcpy(p, &f, 4);
            break;
        case DSHIM_FLOAT64: {
            double d = f;
            memcpy(p, &d, 8);
            break;
        }
        case DSHIM_FLOAT16: {
            unsigned short h = dshim_float_to_half(f);
            memcpy(p, &h, 2);
            break;
        }
        case DSHIM_BFLOAT16: {
            unsigned short h = dshim_float_to_bf16(f);
            memcpy(p, &h, 2);
            break;
        }
        case DSHIM_FLOAT8_E4M3:
            *p = dshim_float_to_fp8e4m3(f);
            break;
        case DSHIM_FLOAT8_E5M2:
            *p = dshim_float_to_fp8e5m2(f);
            break;
        default: {
            unsigned long long v = 1 + i % 97; /* integers: small and non-zero */
            memcpy(p, &v, size);
            break;
        }
        }
    }
}

static dshim_status_t load_operands(dshim_dtype_t dt, size_t bytes)
{
    fill_pattern(h_fill, bytes, dt);
    dshim_status_t st = dev_copy(d_a, h_fill, bytes);
    if (st == DSHIM_OK) {
        st = dev_copy(d_b, h_fill, bytes);
    }
    if (st == DSHIM_OK) {
        st = dev_copy(d_dst, h_fill, bytes);
    }
    return st == DSHIM_OK ? dev_sync() : st;
}

typedef struct row {
    const char *dtype_name;
    const char *what; /* op name, "scale_div" or "d2d" */
    dshim_dtype_t dtype;
    work_kind_t kind;
    dshim_redop_t op;
    int checked; /* in the judged set: held to the target */
} row_t;

static int add_row(row_t *rows, int n, dshim_dtype_t dt, work_kind_t kind, dshim_redop_t op,
                   int checked)
{
    rows[n].dtype = dt;
    rows[n].kind = kind;
    rows[n].op = op;
    rows[n].checked = checked;
    rows[n].dtype_name = dshim_dtype_name(dt);
    rows[n].what = kind == W_SCALE ? "scale_div" : dshim_redop_name(op);
    return n + 1;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: dshim-cuda-bench [-m MAX_MIB] [-t TARGET] [-q] [-a]\n"
            "  -m MAX_MIB  largest operand size in MiB (default 256); sizes go up by 4x from 1 MiB\n"
            "  -t TARGET   pass mark: kernel bandwidth / device-to-device copy bandwidth at the\n"
            "              largest size, for every float32 op and the float16/bfloat16 sum (0.80)\n"
            "  -q          quick: shorter timing runs (less stable figures)\n"
            "  -a          also every other dtype x op (shown, not judged; shorter runs)\n"
            "exit: 0 target met, 1 missed or a CUDA error, 2 usage, 77 no CUDA backend/device\n");
}

/* The command line's choices. */
typedef struct options {
    size_t max_mib;
    double target;
    double budget; /* seconds per timing run */
    int all;
} options_t;

/* Fills *o from the command line: -1 to go on, else the exit code (0 after
 * -h, 2 on bad usage). */
static int parse_args(int argc, char **argv, options_t *o)
{
    o->max_mib = 256;
    o->target = 0.80;
    o->budget = 0.08;
    o->all = 0;
    int c;
    while ((c = getopt(argc, argv, "m:t:qah")) != -1) {
        switch (c) {
        case 'm':
            o->max_mib = strtoul(optarg, NULL, 10);
            break;
        case 't':
            o->target = strtod(optarg, NULL);
            break;
        case 'q':
            o->budget = 0.02;
            break;
        case 'a':
            o->all = 1;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind != argc || o->max_mib < 1 || o->max_mib > 16384 ||
        !(o->target > 0 && o->target < 10)) {
        usage(stderr);
        return 2;
    }
    return -1;
}

/* Loads libdshim-cuda.so and its dshim_cuda_test_* helpers and describes the
 * device into desc: -1 to go on, else the exit code (SKIP_CODE or 1). */
static int open_backend(char *desc, size_t cap)
{
    /* the loader says at INFO why it found no backend: show that line */
    dshim_log_init();
    int saved_level = dshim_log_level_current;
    if (dshim_log_level_current < DSHIM_LOG_INFO) {
        dshim_log_level_current = DSHIM_LOG_INFO;
    }
    int loaded = dshim_gpu_kernels_loaded();
    dshim_log_level_current = saved_level;
    if (!loaded) {
        printf("dshim-cuda-bench: SKIP: no CUDA reduction backend here (%s, the CUDA runtime or a "
               "CUDA device is missing; the loader's reason is the line above)\n",
               DSHIM_CUDA_LIB_NAME);
        return SKIP_CODE;
    }
    dev_alloc = (dshim_cuda_test_alloc_fn)dshim_gpu_kernels_symbol("dshim_cuda_test_alloc");
    dev_free = (dshim_cuda_test_free_fn)dshim_gpu_kernels_symbol("dshim_cuda_test_free");
    dev_copy = (dshim_cuda_test_copy_fn)dshim_gpu_kernels_symbol("dshim_cuda_test_copy");
    dev_sync = (dshim_cuda_test_sync_fn)dshim_gpu_kernels_symbol("dshim_cuda_test_sync");
    dev_describe =
        (dshim_cuda_test_describe_fn)dshim_gpu_kernels_symbol("dshim_cuda_test_describe");
    if (!dev_alloc || !dev_free || !dev_copy || !dev_sync || !dev_describe) {
        printf("dshim-cuda-bench: FAIL: %s lacks the dshim_cuda_test_* helpers; rebuild it with "
               "this version of dshim\n", DSHIM_CUDA_LIB_NAME);
        return 1;
    }
    if (dev_describe(desc, cap) != DSHIM_OK) {
        printf("dshim-cuda-bench: FAIL: %s\n", dshim_last_error());
        return 1;
    }
    return -1;
}

/* The three device operands and the host fill buffer, max_mib each: 0, or 1
 * (the exit code) when memory is short. */
static int prepare_buffers(size_t max_mib)
{
    size_t max_bytes = max_mib * MIB;
    h_fill = malloc(max_bytes);
    if (h_fill == NULL || dev_alloc(&d_a, max_bytes) != DSHIM_OK ||
        dev_alloc(&d_b, max_bytes) != DSHIM_OK || dev_alloc(&d_dst, max_bytes) != DSHIM_OK) {
        printf("dshim-cuda-bench: FAIL: cannot allocate 3 x %zu MiB of device memory (or %zu MiB "
               "of host memory): %s; try a smaller -m\n", max_mib, max_mib, dshim_last_error());
        return 1;
    }
    return 0;
}

static void release_buffers(void)
{
    dev_free(d_a);
    dev_free(d_b);
    dev_free(d_dst);
    free(h_fill);
}

/* The kernels to time: the judged set, then with -a every other
 * dtype x op (shown only).  Returns how many rows. */
static int plan_rows(row_t *rows, int all)
{
    int nrows = 0;
    for (int op = 0; op < DSHIM_REDOP_COUNT; op++) {
        nrows = add_row(rows, nrows, DSHIM_FLOAT32, W_REDUCE, (dshim_redop_t)op, 1);
    }
    nrows = add_row(rows, nrows, DSHIM_FLOAT32, W_SCALE, DSHIM_AVG, 1);
    nrows = add_row(rows, nrows, DSHIM_FLOAT16, W_REDUCE, DSHIM_SUM, 1);
    nrows = add_row(rows, nrows, DSHIM_BFLOAT16, W_REDUCE, DSHIM_SUM, 1);
    if (all) {
        for (int dt = 0; dt < DSHIM_DTYPE_COUNT; dt++) {
            for (int op = 0; op <= DSHIM_REDOP_COUNT; op++) {
                int is_scale = op == DSHIM_REDOP_COUNT;
                int required = dt == DSHIM_FLOAT32 ||
                               ((dt == DSHIM_FLOAT16 || dt == DSHIM_BFLOAT16) && op == DSHIM_SUM);
                if (!required) {
                    nrows = add_row(rows, nrows, (dshim_dtype_t)dt, is_scale ? W_SCALE : W_REDUCE,
                                    is_scale ? DSHIM_AVG : (dshim_redop_t)op, 0);
                }
            }
        }
    }
    return nrows;
}

static void print_header(const char *desc)
{
    printf("dshim-cuda-bench: %s\n", desc);
    printf("bytes counted as NCCL counts them: reduce 3 x size (2 reads + 1 write), scale_div and "
           "the d2d copy 2 x size; ratio = kernel GB/s / d2d cudaMemcpy GB/s at the same size\n");
    printf("%9s  %-12s %-10s %11s %10s %10s %7s\n", "size", "dtype", "kernel", "time_us",
           "GB/s", "copy_GB/s", "ratio");
}

/* The judged kernels at the largest size, against the target. */
typedef struct verdict {
    int fails;
    int judged;
    double worst;
    const char *worst_name;
    const char *worst_dtype;
} verdict_t;

/* One size: the device copy, then every row, each line printed as it is
 * timed; at the largest size (`last`) the judged rows go into *v.  0, or 1
 * (the exit code) when a CUDA call failed. */
static int time_size(size_t bytes, int last, const row_t *rows, int nrows, const options_t *o,
                     verdict_t *v)
{
    double copy_s = 0;
    work_t copy = {W_COPY, DSHIM_UINT8, DSHIM_SUM, bytes};
    if (load_operands(DSHIM_FLOAT32, bytes) != DSHIM_OK ||
        time_per_call(&copy, o->budget, &copy_s) != DSHIM_OK) {
        printf("dshim-cuda-bench: FAIL: device copy: %s\n", dshim_last_error());
        return 1;
    }
    double copy_gbs = 2.0 * (double)bytes / copy_s / 1e9;
    printf("%5zu MiB  %-12s %-10s %11.1f %10.1f %10.1f %7s\n", bytes / MIB, "-", "d2d-copy",
           copy_s * 1e6, copy_gbs, copy_gbs, "1.00");
    dshim_dtype_t loaded = DSHIM_FLOAT32;
    for (int i = 0; i < nrows; i++) {
        const row_t *r = &rows[i];
        if (r->dtype != loaded) {
            if (load_operands(r->dtype, bytes) != DSHIM_OK) {
                printf("dshim-cuda-bench: FAIL: loading operands: %s\n", dshim_last_error());
                return 1;
            }
            loaded = r->dtype;
        }
        work_t w = {r->kind, r->dtype, r->op, bytes};
        double s = 0;
        /* the rows -a adds are shown, not judged: shorter runs keep -a cheap */
        if (time_per_call(&w, r->checked ? o->budget : o->budget / 4, &s) != DSHIM_OK) {
            printf("dshim-cuda-bench: FAIL: %s %s: %s\n", r->dtype_name, r->what,
                   dshim_last_error());
            return 1;
        }
        double moved = (r->kind == W_REDUCE ? 3.0 : 2.0) * (double)bytes;
        double gbs = moved / s / 1e9;
        double ratio = gbs / copy_gbs;
        const char *mark = "";
        if (last && r->checked) {
            v->judged++;
            if (ratio < v->worst) {
                v->worst = ratio;
                v->worst_name = r->what;
                v->worst_dtype = r->dtype_name;
            }
            if (ratio < o->target) {
                v->fails++;
                mark = "  < target";
            }
        }
        printf("%5zu MiB  %-12s %-10s %11.1f %10.1f %10.1f %7.2f%s\n", bytes / MIB,
               r->dtype_name, r->what, s * 1e6, gbs, copy_gbs, ratio, mark);
    }
    fflush(stdout);
    return 0;
}

static void report(const verdict_t *v, size_t top, double target)
{
    printf("RESULT: %s: %d of %d kernels (every float32 op, scale_div, float16/bfloat16 sum) at "
           "%zu MiB reach >= %.0f%% of the device-to-device copy bandwidth; lowest %.2f (%s %s)\n",
           v->fails == 0 ? "PASS" : "FAIL", v->judged - v->fails, v->judged, top / MIB,
           target * 100, v->worst, v->worst_dtype, v->worst_name);
}

int main(int argc, char **argv)
{
    options_t o;
    int code = parse_args(argc, argv, &o);
    if (code >= 0) {
        return code;
    }
    char desc[512];
    if ((code = open_backend(desc, sizeof(desc))) >= 0) {
        return code;
    }
    if (prepare_buffers(o.max_mib) != 0) {
        return 1;
    }
    row_t rows[DSHIM_DTYPE_COUNT * (DSHIM_REDOP_COUNT + 1)];
    int nrows = plan_rows(rows, o.all);
    print_header(desc);

    size_t top = MIB; /* the largest size run: the one judged */
    while (top * 4 <= o.max_mib * MIB) {
        top *= 4;
    }
    verdict_t v = {0, 0, 1e9, "", ""};
    for (size_t bytes = MIB; bytes <= top; bytes *= 4) {
        if (time_size(bytes, bytes == top, rows, nrows, &o, &v) != 0) {
            return 1;
        }
    }
    release_buffers();
    report(&v, top, o.target);
    return v.fails == 0 ? 0 : 1;
}

/*
 * The end-of-job summary (DSHIM_SUMMARY=1): at exit every process
 * that opened a communicator prints one short table to stderr, fed by the
 * same finished operations as the timeline (trace_timeline.c):
 *
 *   dshim summary rank 0: 5.210 s since the first communicator: 1.032 s in communication (19.8 %), 0.214 s waiting for others, 4.178 s outside dshim
 *   dshim summary rank 0:   op                  count         bytes   comm ms   wait ms
 *   dshim summary rank 0:   allreduce             104      84.1 MB    1012.3     210.5
 *   dshim summary rank 0:   broadcast               3     245.8 kB      19.9       3.6
 *
 * Per kind: operations finished (failed ones too: "failed" column appears
 * when there are any), bytes (each op's own count), time in communication
 * (sum of start-to-finish times) and time blocked waiting for other ranks
 * (the recorder's wait_ns: nothing moved).  The first line's "in
 * communication" counts time during which at least one operation ran (ops
 * that overlap count once); "outside dshim" is the wall time since the first
 * communicator opened minus that.  The whole table is one write(), so the
 * tables of ranks that share a terminal do not interleave.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "trace_impl.h"

#define SUM_KINDS 32
#define SUM_SPANS 64 /* disjoint busy intervals kept before the oldest is counted for good */

typedef struct {
    const char *op; /* static, owned by the caller (trace.h) */
    uint64_t count, failed, bytes, busy_ns, wait_ns;
} sum_kind_t;

typedef struct {
    uint64_t start, end;
} sum_span_t;

static pthread_mutex_t sum_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    uint64_t first_open_ns;
    int rank;
    int printed;
    sum_kind_t kinds[SUM_KINDS];
    int nkinds;
    uint64_t other_count; /* kinds beyond SUM_KINDS */
    /* the union of [started, done] of every op: `spans` sorted by start and
     * disjoint; when full, the earliest-ending one is added to busy_done */
    sum_span_t spans[SUM_SPANS];
    int nspans;
    uint64_t busy_done;
    uint64_t wait_total;
    uint64_t first_ns; /* earliest op start (when no communicator open was seen) */
} sum = {.rank = -1};

void dshim_trace_summary_forked(void)
{
    /* the only thread of a new child: the lock may have been held by a thread that no longer exists */
    pthread_mutex_init(&sum_lock, NULL);
    memset(&sum, 0, sizeof(sum));
    sum.rank = -1;
}

void dshim_trace_summary_open(uint64_t now_ns, int world_rank)
{
    pthread_mutex_lock(&sum_lock);
    if (!sum.first_open_ns) {
        sum.first_open_ns = now_ns;
    }
    if (world_rank >= 0) {
        sum.rank = world_rank;
    }
    pthread_mutex_unlock(&sum_lock);
}

static uint64_t span_len(const sum_span_t *s)
{
    return s->end > s->start ? s->end - s->start : 0;
}

/* Adds [start, end] to the union.  sum_lock held. */
static void add_span(uint64_t start, uint64_t end)
{
    /* merge every kept span that overlaps [start, end] into it */
    int w = 0;
    for (int i = 0; i < sum.nspans; i++) {
        sum_span_t *s = &sum.spans[i];
        if (s->end >= start && s->start <= end) {
            start = s->start < start ? s->start : start;
            end = s->end > end ? s->end : end;
        } else {
            sum.spans[w++] = *s;
        }
    }
    sum.nspans = w;
    if (sum.nspans == SUM_SPANS) {
        /* full: the span that ended first is counted for good (an op that
         * overlaps it after this would count twice: ops finish roughly in
         * order, and 64 spans are far more than run at once) */
        int oldest = 0;
        for (int i = 1; i < sum.nspans; i++) {
            if (sum.spans[i].end < sum.spans[oldest].end) {
                oldest = i;
            }
        }
        sum.busy_done += span_len(&sum.spans[oldest]);
        sum.spans[oldest] = sum.spans[--sum.nspans];
    }
    sum.spans[sum.nspans].start = start;
    sum.spans[sum.nspans].end = end;
    sum.nspans++;
}

void dshim_trace_summary_add(const dshim_trace_entry_t *e)
{
    const char *op = e->op.op ? e->op.op : "?";
    uint64_t start = e->t_started_ns ? e->t_started_ns : e->t_queued_ns;
    uint64_t end = e->t_done_ns > start ? e->t_done_ns : start;
    pthread_mutex_lock(&sum_lock);
    sum_kind_t *k = NULL;
    for (int i = 0; i < sum.nkinds; i++) {
        if (sum.kinds[i].op == op || strcmp(sum.kinds[i].op, op) == 0) {
            k = &sum.kinds[i];
            break;
        }
    }
    if (!k && sum.nkinds < SUM_KINDS) {
        k = &sum.kinds[sum.nkinds++];
        memset(k, 0, sizeof(*k));
        k->op = op;
    }
    if (k) {
        k->count++;
        k->failed += e->state == DSHIM_TRACE_FAILED;
        k->bytes += e->op.bytes;
        k->busy_ns += end - start;
        k->wait_ns += e->wait_ns;
    } else {
        sum.other_count++;
    }
    sum.wait_total += e->wait_ns;
    if (!sum.first_ns || start < sum.first_ns) {
        sum.first_ns = start;
    }
    add_span(start, end);
    pthread_mutex_unlock(&sum_lock);
}

static void fmt_bytes(char *out, size_t cap, uint64_t b)
{
    if (b < 1000) {
        snprintf(out, cap, "%llu B", (unsigned long long)b);
    } else if (b < 1000000) {
        snprintf(out, cap, "%.1f kB", (double)b / 1e3);
    } else if (b < 1000000000) {
        snprintf(out, cap, "%.1f MB", (double)b / 1e6);
    } else {
        snprintf(out, cap, "%.2f GB", (double)b / 1e9);
    }
}

size_t dshim_trace_summary_format(char *out, size_t cap, int rank, uint64_t now_ns)
{
    pthread_mutex_lock(&sum_lock);
    if (rank < 0) {
        rank = sum.rank;
    }
    uint64_t busy = sum.busy_done;
    for (int i = 0; i < sum.nspans; i++) {
        busy += span_len(&sum.spans[i]);
    }
    uint64_t t0 = sum.first_open_ns ? sum.first_open_ns : sum.first_ns;
    if (sum.first_ns && sum.first_ns < t0) {
        t0 = sum.first_ns;
    }
    uint64_t wall = now_ns > t0 ? now_ns - t0 : 0;
    if (busy > wall) {
        wall = busy;
    }
    int failed_col = 0;
    for (int i = 0; i < sum.nkinds; i++) {
        failed_col |= sum.kinds[i].failed != 0;
    }
    char pre[48];
    snprintf(pre, sizeof(pre), "dshim summary rank %d:", rank);
    size_t o = 0;
#define SUM_OUT(...)                                                                                  \
    do {                                                                                              \
        if (o < cap) {                                                                                \
            int n_ = snprintf(out + o, cap - o, __VA_ARGS__);                                         \
            o += n_ > 0 ? (size_t)n_ : 0;                                                             \
        }                                                                                             \
    } while (0)
    SUM_OUT("%s %.3f s since the first communicator: %.3f s in communication (%.1f %%), %.3f s waiting for "
            "others, %.3f s outside dshim\n",
            pre, (double)wall / 1e9, (double)busy / 1e9, wall ? 100.0 * (double)busy / (double)wall : 0.0,
            (double)sum.wait_total / 1e9, (double)(wall - busy) / 1e9);
    SUM_OUT("%s   %-18s %9s %13s %11s %11s%s\n", pre, "op", "count", "bytes", "comm ms", "wait ms",
            failed_col ? "    failed" : "");
    for (int i = 0; i < sum.nkinds; i++) {
        const sum_kind_t *k = &sum.kinds[i];
        char b[32];
        fmt_bytes(b, sizeof(b), k->bytes);
        SUM_OUT("%s   %-18s %9llu %13s %11.3f %11.3f", pre, k->op, (unsigned long long)k->count, b,
                (double)k->busy_ns / 1e6, (double)k->wait_ns / 1e6);
        if (failed_col) {
            SUM_OUT(" %9llu", (unsigned long long)k->failed);
        }
        SUM_OUT("\n");
    }
    if (sum.other_count) {
        SUM_OUT("%s   (%llu more operations of other kinds)\n", pre, (unsigned long long)sum.other_count);
    }
#undef SUM_OUT
    int any = sum.nkinds > 0 || sum.first_open_ns;
    pthread_mutex_unlock(&sum_lock);
    if (o >= cap) {
        o = cap ? cap - 1 : 0;
    }
    return any ? o : 0;
}

void dshim_trace_summary_print(int rank)
{
    pthread_mutex_lock(&sum_lock);
    int printed = sum.printed;
    sum.printed = 1;
    pthread_mutex_unlock(&sum_lock);
    if (printed) {
        return;
    }
    char buf[8192];
    size_t n = dshim_trace_summary_format(buf, sizeof(buf), rank, dshim_trace_now_ns());
    size_t off = 0;
    while (off < n) {
        ssize_t w = write(2, buf + off, n - off);
        if (w <= 0) {
            break;
        }
        off += (size_t)w;
    }
}

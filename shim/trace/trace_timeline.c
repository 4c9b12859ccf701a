/*
 * The timeline (DSHIM_TIMELINE=FILE): every finished operation of
 * this process as one Chrome trace-event "complete" event, in a file that
 * chrome://tracing, Perfetto (ui.perfetto.dev) and `dshim-run --timeline`
 * read.  Fed by the flight recorder (trace.c calls the three hooks below),
 * which also feeds the end-of-job summary (trace_summary.c).
 *
 * THE FILE ("dshim-timeline" version 1): one JSON object, one item a line,
 * so that a reader can also take it line by line (dshim-run's merge does):
 *   {"displayTimeUnit":"ms","otherData":{"dshim":{"format":"dshim-timeline","version":1,
 *     "rank":R,"host":"h","pid":P,"realtime_ns":T,"monotonic_ns":M}},"traceEvents":[
 *   {"ph":"M","pid":R,"tid":0,"name":"process_name","args":{"name":"rank R"}}
 *   ,{"ph":"M","pid":R,"tid":K,"name":"thread_name","args":{"name":"<communicator>"}}
 *   ,{"ph":"X","pid":R,"tid":K,"ts":<us>,"dur":<us>,"name":"<label or op>","cat":"<op>",
 *     "args":{"op":..,"seq":..,"dtype":..,"count":..,"bytes":..,"algo":..,"transport":..,
 *             "wait_ms":..,"queue_ms":..,"label":..[,"root":..][,"peer":..][,"redop":..][,"failed":1]}}
 *   ...
 *   ],"dshim_end":{"realtime_ns":T2,"monotonic_ns":M2,"events":N}}
 * The header's keys are the ones Perfetto's JSON reader knows (it stops at
 * an unknown key before traceEvents); "dshim_end" comes after the events.
 * pid = the world rank, tid = one track per communicator (in the order they
 * opened), ts/dur in microseconds.  ts = realtime_ns + (t_started -
 * monotonic_ns) of the header's pair: the process's monotonic clock put on
 * the realtime axis once, so spans never jump with the wall clock, ranks of
 * one host line up exactly and hosts as well as their clocks agree;
 * dshim-run --timeline recovers the monotonic times from the pair and aligns
 * hosts with clock offsets it measures.  Every event line starts with
 * `{"ph":"<c>","pid":N,"tid":N,` (X events then `"ts":`), after an optional
 * leading comma: the merge rewrites pid and ts there.  A process that is
 * killed leaves a file without its last line(s): readers take the complete
 * event lines.
 *
 * Cost: off, nothing (trace.c calls the hooks only when DSHIM_TIMELINE or
 * DSHIM_SUMMARY is set).  On, one formatted line (~300 bytes, ~1 us) into a
 * 64 KiB buffer per op under one process-wide mutex; the buffer is written
 * when full, when an op finishes more than a second after the last write,
 * when a communicator closes, at exit, and by dshim_trace_timeline_flush (a
 * flight-recorder dump).  A process killed while operations keep finishing
 * loses about its last second; one that blocks, then is killed, what it
 * finished since the last write unless a dump flushed it.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "private_fs.h"
#include "config.h"
#include "log.h"
#include "json_str.h"
#include "trace_impl.h"

#define TL_BUF_SIZE (64 * 1024)
#define TL_LINE_MAX 4096
#define TL_FLUSH_NS 1000000000ull

typedef struct {
    char name[96];
    int tid;
    int announced; /* thread_name written */
} tl_track_t;

enum { TL_UNKNOWN = 0, TL_OFF, TL_ON, TL_CLOSED };

static pthread_once_t tl_once = PTHREAD_ONCE_INIT;
static int tl_timeline_on; /* DSHIM_TIMELINE set */
static int tl_summary_on;  /* DSHIM_SUMMARY=1 */

static pthread_mutex_t tl_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    int state;         /* TL_*: the file's */
    int fd;
    pid_t pid;         /* the process that owns fd and the buffer */
    char *buf;
    size_t len;
    int world_rank;    /* as the last open hook learnt it (-1 unknown) */
    int file_pid;      /* "pid" of the events: the world rank when the file was created */
    uint64_t real0, mono0;
    uint64_t last_flush_ns;
    uint64_t events;
    tl_track_t *tracks;
    int ntracks, captracks;
    int exit_registered;
} tl = {.fd = -1, .world_rank = -1};

static void tl_atexit(void);

static void tl_reset_child(void)
{
    /* a forked child: the parent's file and buffer are not ours (a child that
     * opens communicators of its own starts its own file: use %p).  No
     * prepare handler takes tl_lock around fork() (it would order it against
     * the recorder's registry lock), so the lock may have been held by a
     * thread of the parent: then the state may be half-changed and its
     * memory is left alone; else the child reuses it. */
    int consistent = pthread_mutex_trylock(&tl_lock) == 0;
    pthread_mutex_init(&tl_lock, NULL);
    if (tl.fd >= 0) {
        close(tl.fd);
    }
    char *buf = consistent ? tl.buf : NULL;
    tl_track_t *tracks = consistent ? tl.tracks : NULL;
    int cap = consistent ? tl.captracks : 0;
    int reg = tl.exit_registered;
    int wr = tl.world_rank;
    memset(&tl, 0, sizeof(tl));
    tl.fd = -1;
    tl.buf = buf;
    tl.tracks = tracks;
    tl.captracks = cap;
    tl.world_rank = wr;
    tl.exit_registered = reg;
    dshim_trace_summary_forked();
}

static void tl_init_once(void)
{
    const dshim_config_t *cfg = dshim_config();
    tl_timeline_on = cfg->timeline && cfg->timeline[0];
    tl_summary_on = cfg->summary != 0;
    if (tl_timeline_on || tl_summary_on) {
        pthread_atfork(NULL, NULL, tl_reset_child);
    }
}

int dshim_trace_timeline_wanted(void)
{
    pthread_once(&tl_once, tl_init_once);
    return tl_timeline_on || tl_summary_on;
}

/* ---- the file ----------------------------------------------------------- */

static uint64_t realtime_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}


/* The file's missing directories, mode 0700 (private_fs.h). */
static void mkdir_parents(const char *path)
{
    char d[4096];
    snprintf(d, sizeof(d), "%s", path);
    char *slash = strrchr(d, '/');
    if (!slash || slash == d) {
        return;
    }
    *slash = '\0';
    dshim_make_dirs(d);
}

/* Writes the buffer out.  tl_lock held. */
static void tl_flush_locked(void)
{
    size_t off = 0;
    while (off < tl.len && tl.fd >= 0) {
        ssize_t w = write(tl.fd, tl.buf + off, tl.len - off);
        if (w < 0 && errno == EINTR) {
            continue;
        }
        if (w <= 0) {
            DSHIM_WARN("timeline: cannot write the timeline file (%s); the timeline stops here",
                       w < 0 ? strerror(errno) : "short write");
            close(tl.fd);
            tl.fd = -1;
            tl.state = TL_OFF;
            break;
        }
        off += (size_t)w;
    }
    tl.len = 0;
}

/* Appends one line; writes the buffer out first when it would not fit.  tl_lock held. */
static void tl_append(const char *line, size_t n)
{
    if (tl.state != TL_ON) {
        return;
    }
    if (tl.len + n > TL_BUF_SIZE) {
        tl_flush_locked();
        if (tl.state != TL_ON) {
            return;
        }
    }
    memcpy(tl.buf + tl.len, line, n);
    tl.len += n;
}

/* Creates the file (first open or first event).  tl_lock held. */
static void tl_create_locked(void)
{
    if (tl.state != TL_UNKNOWN) {
        return;
    }
    tl.state = TL_OFF;
    const char *pattern = dshim_config()->timeline;
    /* from the open hook; the done hook may not take the registry lock */
    int rank = tl.world_rank;
    if (rank < 0) {
        rank = dshim_log_get_rank();
    }
    if (rank < 0) {
        const dshim_config_t *cfg = dshim_config();
        rank = (int)(cfg->rank >= 0 ? cfg->rank : cfg->env_rank);
    }
    char path[4096];
    dshim_expand_name(pattern, rank, dshim_log_hostname(), path, sizeof(path));
    mkdir_parents(path);
    /* a path the user named, maybe in a directory others can write: no link
     * followed, no file of another user's written into, mode 0600 */
    int fd = dshim_private_open(path, DSHIM_OPEN_TRUNC);
    int open_errno = errno;
    if (!tl.buf) {
        tl.buf = malloc(TL_BUF_SIZE); /* kept by a forked child */
    }
    if (fd < 0 || !tl.buf) {
        DSHIM_WARN("timeline: cannot create %s (DSHIM_TIMELINE=%s): %s; no timeline for this process", path, pattern,
                   fd < 0 ? dshim_private_why(open_errno) : "out of memory");
        if (fd >= 0) {
            close(fd);
        }
        free(tl.buf);
        tl.buf = NULL;
        return;
    }
    tl.fd = fd;
    tl.pid = getpid();
    tl.state = TL_ON;
    tl.file_pid = rank >= 0 ? rank : (int)tl.pid;
    /* the two clocks, read back to back */
    tl.real0 = realtime_ns();
    tl.mono0 = dshim_trace_now_ns();
    tl.last_flush_ns = tl.mono0;
    char host[256], line[TL_LINE_MAX];
    dshim_json_escape(host, sizeof(host), dshim_log_hostname());
    int n = snprintf(line, sizeof(line),
                     "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"dshim\":{\"format\":\"dshim-timeline\",\"version\":1,"
                     "\"rank\":%d,\"host\":\"%s\",\"pid\":%d,\"realtime_ns\":%llu,\"monotonic_ns\":%llu}},\"traceEvents\":[\n"
                     "{\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"name\":\"process_name\",\"args\":{\"name\":\"%s %d\"}}\n"
                     ",{\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"name\":\"process_sort_index\",\"args\":{\"sort_index\":%d}}\n",
                     rank, host, (int)tl.pid, (unsigned long long)tl.real0, (unsigned long long)tl.mono0, tl.file_pid,
                     rank >= 0 ? "rank" : "pid", tl.file_pid, tl.file_pid, tl.file_pid);
    tl_append(line, (size_t)n);
    /* written at once: a file that exists but is empty would say nothing */
    tl_flush_locked();
}

/* The track of communicator `name`, added when new.  tl_lock held. */
static tl_track_t *tl_track(const char *name)
{
    for (int i = 0; i < tl.ntracks; i++) {
        if (strcmp(tl.tracks[i].name, name) == 0) {
            return &tl.tracks[i];
        }
    }
    if (tl.ntracks == tl.captracks) {
        int cap = tl.captracks ? 2 * tl.captracks : 16;
        tl_track_t *t = realloc(tl.tracks, (size_t)cap * sizeof(*t));
        if (!t) {
            return NULL;
        }
        tl.tracks = t;
        tl.captracks = cap;
    }
    tl_track_t *t = &tl.tracks[tl.ntracks++];
    memset(t, 0, sizeof(*t));
    snprintf(t->name, sizeof(t->name), "%s", name);
    t->tid = tl.ntracks; /* 1, 2, ... in the order communicators open */
    return t;
}

static void tl_register_exit(void)
{
    if (!tl.exit_registered) {
        tl.exit_registered = 1;
        atexit(tl_atexit);
    }
}

/* ---- the hooks (trace.c) ------------------------------------------------ */

void dshim_trace_timeline_open(const dshim_trace_ring_info_t *ring)
{
    if (!dshim_trace_timeline_wanted() || !ring) {
        return;
    }
    int rank, size;
    dshim_trace_world(&rank, &size);
    uint64_t now = dshim_trace_now_ns();
    pthread_mutex_lock(&tl_lock);
    tl.world_rank = rank;
    tl_register_exit();
    if (tl_timeline_on) {
        tl_create_locked();
        if (tl.state == TL_ON) {
            tl_track(ring->name ? ring->name : "");
        }
    }
    pthread_mutex_unlock(&tl_lock);
    if (tl_summary_on) {
        dshim_trace_summary_open(now, rank);
    }
}

/* "x.yyy" microseconds of ns */
static int fmt_us(char *out, size_t cap, uint64_t ns)
{
    return snprintf(out, cap, "%llu.%03u", (unsigned long long)(ns / 1000), (unsigned)(ns % 1000));
}

/* One event line of e into line (cap TL_LINE_MAX); returns its length. */
static size_t tl_format(char *line, const tl_track_t *t,
                        const dshim_trace_entry_t *e)
{
    uint64_t start = e->t_started_ns ? e->t_started_ns : e->t_queued_ns;
    uint64_t end = e->t_done_ns > start ? e->t_done_ns : start;
    uint64_t ts = tl.real0 + (start >= tl.mono0 ? start - tl.mono0 : 0);
    if (start < tl.mono0) {
        ts -= tl.mono0 - start; /* queued before the file was created */
    }
    char tsbuf[32], durbuf[32];
    fmt_us(tsbuf, sizeof(tsbuf), ts);
    fmt_us(durbuf, sizeof(durbuf), end - start);
    const char *op = e->op.op ? e->op.op : "?";
    char label[DSHIM_TRACE_LABEL_LEN * 6 + 1], opq[128], algo[128], transport[256];
    dshim_json_escape(label, sizeof(label), e->label);
    dshim_json_escape(opq, sizeof(opq), op);
    dshim_json_escape(algo, sizeof(algo), e->algo ? e->algo : "");
    dshim_json_escape(transport, sizeof(transport), e->transport ? e->transport : "");
    const char *dtype = e->op.dtype >= 0 ? dshim_dtype_name((dshim_dtype_t)e->op.dtype) : "";
    /* milliseconds with 6 decimals, from integers: %f costs more than the rest of the line */
    uint64_t queue_ns = e->t_started_ns > e->t_queued_ns ? e->t_started_ns - e->t_queued_ns : 0;
    long long seq = e->seq == UINT64_MAX ? -1 : (long long)e->seq;
    int n = snprintf(line, TL_LINE_MAX,
                     ",{\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%s,\"dur\":%s,\"name\":\"%s\",\"cat\":\"%s\","
                     "\"args\":{\"op\":\"%s\",\"seq\":%lld,\"dtype\":\"%s\",\"count\":%llu,\"bytes\":%llu,"
                     "\"algo\":\"%s\",\"transport\":\"%s\",\"wait_ms\":%llu.%06u,\"queue_ms\":%llu.%06u,\"label\":\"%s\"",
                     tl.file_pid, t->tid, tsbuf, durbuf, label[0] ? label : opq, opq, opq, seq, dtype ? dtype : "",
                     (unsigned long long)e->op.count, (unsigned long long)e->op.bytes, algo, transport,
                     (unsigned long long)(e->wait_ns / 1000000), (unsigned)(e->wait_ns % 1000000),
                     (unsigned long long)(queue_ns / 1000000), (unsigned)(queue_ns % 1000000), label);
    if (e->op.root >= 0) {
        n += snprintf(line + n, (size_t)(TL_LINE_MAX - n), ",\"root\":%d", e->op.root);
    }
    if (e->op.peer >= 0) {
        n += snprintf(line + n, (size_t)(TL_LINE_MAX - n), ",\"peer\":%d", e->op.peer);
    }
    if (e->op.redop >= 0) {
        const char *r = dshim_redop_name((dshim_redop_t)e->op.redop);
        n += snprintf(line + n, (size_t)(TL_LINE_MAX - n), ",\"redop\":\"%s\"", r ? r : "");
    }
    if (e->state == DSHIM_TRACE_FAILED) {
        n += snprintf(line + n, (size_t)(TL_LINE_MAX - n), ",\"failed\":1");
    }
    n += snprintf(line + n, (size_t)(TL_LINE_MAX - n), "}}\n");
    return (size_t)n;
}

/* thread_name of track t, from the ring's identity as it is now (its
 * description may be set after it opened).  tl_lock held. */
static void tl_announce(tl_track_t *t, const dshim_trace_ring_info_t *ring)
{
    char name[300], esc[sizeof(name) * 6];
    const char *desc = ring->desc ? ring->desc : "";
    if (desc[0]) {
        snprintf(name, sizeof(name), "%s | %s rank %d of %d", desc, t->name, ring->rank, ring->size);
    } else {
        snprintf(name, sizeof(name), "%s rank %d of %d", t->name[0] ? t->name : "communicator", ring->rank,
                 ring->size);
    }
    dshim_json_escape(esc, sizeof(esc), name);
    char line[TL_LINE_MAX];
    int n = snprintf(line, sizeof(line),
                     ",{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":\"thread_name\",\"args\":{\"name\":\"%s\"}}\n"
                     ",{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":\"thread_sort_index\",\"args\":{\"sort_index\":%d}}\n",
                     tl.file_pid, t->tid, esc, tl.file_pid, t->tid, t->tid);
    if (n > 0 && (size_t)n < sizeof(line)) {
        tl_append(line, (size_t)n);
    }
    t->announced = 1;
}

void dshim_trace_timeline_done(const dshim_trace_ring_info_t *ring, const dshim_trace_entry_t *e)
{
    if (!dshim_trace_timeline_wanted() || !ring || !e) {
        return;
    }
    if (tl_summary_on) {
        dshim_trace_summary_add(e);
    }
    if (!tl_timeline_on) {
        return;
    }
    pthread_mutex_lock(&tl_lock);
    tl_register_exit();
    if (tl.state == TL_UNKNOWN) {
        tl_create_locked();
    }
    if (tl.state == TL_ON && tl.pid == getpid()) {
        tl_track_t *t = tl_track(ring->name ? ring->name : "");
        if (t) {
            if (!t->announced) {
                tl_announce(t, ring);
            }
            char line[TL_LINE_MAX];
            size_t n = tl_format(line, t, e);
            tl_append(line, n);
            tl.events++;
            if (e->t_done_ns > tl.last_flush_ns + TL_FLUSH_NS) {
                tl_flush_locked();
                tl.last_flush_ns = e->t_done_ns;
            }
        }
    }
    pthread_mutex_unlock(&tl_lock);
}

/* The track of the framework's own spans (not communication): its name in
 * tl_track's table cannot clash with a ring's (rings are "<prefix>@addr"). */
#define TL_FRAMEWORK_TRACK "(framework)"

/* A span the framework saw (torch's optimizer step) on its own track of
 * this rank, from CLOCK_MONOTONIC ns (the clock of the ops' spans when the
 * timeline is on).  Nothing when the timeline is off. */
DSHIM_EXPORT void dshim_trace_span(const char *name, uint64_t begin_ns, uint64_t end_ns)
{
    if (!tl_timeline_on || !name || !dshim_trace_timeline_wanted()) {
        return;
    }
    pthread_mutex_lock(&tl_lock);
    if (tl.state == TL_ON && tl.pid == getpid()) {
        tl_track_t *t = tl_track(TL_FRAMEWORK_TRACK);
        if (t) {
            char line[TL_LINE_MAX], esc[DSHIM_TRACE_LABEL_LEN * 6 + 1];
            if (!t->announced) {
                int n = snprintf(line, sizeof(line),
                                 ",{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":\"thread_name\",\"args\":{\"name\":"
                                 "\"framework (seen by dshim)\"}}\n",
                                 tl.file_pid, t->tid);
                if (n > 0 && (size_t)n < sizeof(line)) {
                    tl_append(line, (size_t)n);
                }
                t->announced = 1;
            }
            char cut[DSHIM_TRACE_LABEL_LEN];
            snprintf(cut, sizeof(cut), "%s", name);
            dshim_json_escape(esc, sizeof(esc), cut);
            uint64_t start = begin_ns, end = end_ns > begin_ns ? end_ns : begin_ns;
            uint64_t ts = start >= tl.mono0 ? tl.real0 + (start - tl.mono0) : tl.real0 - (tl.mono0 - start);
            char tsbuf[32], durbuf[32];
            fmt_us(tsbuf, sizeof(tsbuf), ts);
            fmt_us(durbuf, sizeof(durbuf), end - start);
            int n = snprintf(line, sizeof(line),
                             ",{\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%s,\"dur\":%s,\"name\":\"%s\","
                             "\"cat\":\"framework\",\"args\":{\"label\":\"%s\"}}\n",
                             tl.file_pid, t->tid, tsbuf, durbuf, esc, esc);
            if (n > 0 && (size_t)n < sizeof(line)) {
                tl_append(line, (size_t)n);
            }
        }
    }
    pthread_mutex_unlock(&tl_lock);
}

void dshim_trace_timeline_flush(void)
{
    if (!dshim_trace_timeline_wanted() || !tl_timeline_on) {
        return;
    }
    pthread_mutex_lock(&tl_lock);
    if (tl.state == TL_ON && tl.pid == getpid()) {
        tl_flush_locked();
        tl.last_flush_ns = dshim_trace_now_ns();
    }
    pthread_mutex_unlock(&tl_lock);
}

void dshim_trace_timeline_close(const dshim_trace_ring_info_t *ring)
{
    (void)ring;
    dshim_trace_timeline_flush(); /* a communicator that closes may be the last one */
}

/* At exit: the file's last line, then the summary. */
static void tl_atexit(void)
{
    pthread_mutex_lock(&tl_lock);
    if (tl.state == TL_ON && tl.pid == getpid()) {
        char line[256];
        uint64_t real = realtime_ns(), mono = dshim_trace_now_ns();
        int n = snprintf(line, sizeof(line),
                         "],\"dshim_end\":{\"realtime_ns\":%llu,\"monotonic_ns\":%llu,\"events\":%llu}}\n",
                         (unsigned long long)real, (unsigned long long)mono, (unsigned long long)tl.events);
        tl_append(line, (size_t)n);
        tl_flush_locked();
        close(tl.fd);
        tl.fd = -1;
        tl.state = TL_CLOSED;
    }
    int rank = tl.world_rank;
    pthread_mutex_unlock(&tl_lock);
    if (tl_summary_on) {
        dshim_trace_summary_print(rank);
    }
}

void dshim_trace_timeline_finish(void)
{
    tl_atexit();
}

/*
 * dshim-run --timeline FILE (timeline.h): the per-process DSHIM_TIMELINE
 * files, the agents' side (answer clock pings, send the files), and the
 * controller's (ping, collect, align, merge).  The file format is described
 * in shim/trace/trace_timeline.c; the merged file has the same shape with
 * "format":"dshim-timeline-merged", ts counted from the controller's start,
 * one pid per process and the clock measurements in its otherData.dshim.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "jobdir.h"
#include "json_str.h"
#include "private_fs.h"
#include "store.h"
#include "timeline.h"

#define TL_ENV "DSHIM_TIMELINE"
#define TL_STEM "timeline."
#define TL_BURST 8
#define TL_PERIOD_NS 1000000000ull
#define TL_WINDOW_NS 10000000000ull
#define TL_LOST_NS 5000000000ull
#define TL_MAX_SAMPLES 65536
#define TL_SEND_LINE_MAX 8192 /* longer lines are not ours: frames cut lines at RUN_LINE_MAX */
#define TL_STORE_KEY "dshim-run/timeline/"
#define TL_STORE_MAX (64u << 20) /* the store's largest value (store_proto.h) */

static uint64_t clock_ns(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- plan ---------------------------------------------------------------- */

void run_timeline_plan(const run_opts_t *o, run_plan_t *plan)
{
    if (!o->timeline) {
        return;
    }
    for (int i = 0; i < plan->nprocs; i++) {
        run_proc_t *p = &plan->procs[i];
        /* the directory of torch's error file (errfile.c): the agent makes it */
        char *kv = NULL;
        if (asprintf(&kv, "%s=%s/attempt_%d/%d/" TL_STEM "%%p.json", TL_ENV, plan->jobdir, plan->attempt, i) < 0) {
            run_usage_error("out of memory");
        }
        char **env = realloc(p->env, (size_t)(p->nenv + 2) * sizeof(*env));
        if (!env) {
            run_usage_error("out of memory");
        }
        env[p->nenv++] = kv;
        env[p->nenv] = NULL;
        p->env = env;
    }
}

/* ---- agent --------------------------------------------------------------- */

void run_timeline_agent_input(const char *buf, size_t n)
{
    static char line[64];
    static size_t len;
    for (size_t i = 0; i < n; i++) {
        char c = buf[i];
        if (c != '\n') {
            if (len + 1 < sizeof(line)) {
                line[len++] = c;
            }
            continue;
        }
        line[len] = '\0';
        len = 0;
        if (line[0] != 'P' || line[1] != ' ') {
            continue;
        }
        /* read the clocks first: the answer says when the ping was seen */
        uint64_t mono = clock_ns(CLOCK_MONOTONIC), real = clock_ns(CLOCK_REALTIME);
        char text[96];
        int t = snprintf(text, sizeof(text), "%lld %" PRIu64 " %" PRIu64, atoll(line + 2), mono, real);
        run_frame_write(1, RUN_FRAME_PONG, -1, 0, 0, text, (size_t)t);
    }
}

/* mpirun/srun merge their ranks' output streams and may cut long bursts of
 * lines anywhere: a per-rank agent hands its process's file to the job's
 * store (hosted by the controller) instead, under
 * dshim-run/timeline/<idx>/<k>, k = 1.. counted at dshim-run/timeline/<idx>/n. */
static void store_file(int idx, const char *path, const run_strv_t *common)
{
    const char *addr = run_strv_getenv(common, "DSHIM_STORE_ADDR");
    const char *port = run_strv_getenv(common, "DSHIM_STORE_PORT");
    const char *token = run_strv_getenv(common, "DSHIM_JOB_TOKEN");
    FILE *f = fopen(path, "r");
    if (!f || !addr || !port || !token) {
        if (f) {
            fclose(f);
        }
        return;
    }
    char *data = malloc(TL_STORE_MAX);
    size_t len = data ? fread(data, 1, TL_STORE_MAX, f) : 0;
    fclose(f);
    while (len > 0 && data[len - 1] != '\n') {
        len--; /* an unfinished last line (killed while writing, or cut at the store's limit) */
    }
    dshim_store_t *s = NULL;
    int64_t k = 0;
    char key[96];
    snprintf(key, sizeof(key), TL_STORE_KEY "%d/n", idx);
    if (len > 0 && dshim_store_connect(addr, atoi(port), token, 5.0, &s) == DSHIM_OK &&
        dshim_store_add(s, key, 1, &k) == DSHIM_OK) {
        snprintf(key, sizeof(key), TL_STORE_KEY "%d/%lld", idx, (long long)k);
        if (dshim_store_set(s, key, data, len) != DSHIM_OK) {
            fprintf(stderr, "dshim-run: timeline of process %d not sent: %s\n", idx, dshim_last_error());
        }
    }
    if (s) {
        dshim_store_close(s);
    }
    free(data);
}

static void send_file(int idx, const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        return;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, f)) > 0) {
        if (line[n - 1] != '\n') {
            break; /* the process was killed while writing: an unfinished line */
        }
        n--;
        if (n > 0 && n <= TL_SEND_LINE_MAX) {
            run_frame_write(1, RUN_FRAME_TIMELINE, idx, 0, 0, line, (size_t)n);
        }
    }
    free(line);
    fclose(f);
}

void run_timeline_agent_send(int idx, const run_strv_t *env, const run_strv_t *common)
{
    const char *spec = dshim_config()->run_spec;
    bool rank_mode = spec && spec[0]; /* under mpirun/srun: no lifeline, a shared output stream */
    const char *pattern = run_strv_getenv(env, TL_ENV);
    const char *jobdir = run_jobdir_here();
    if (!pattern || !jobdir || !run_path_under(pattern, jobdir)) {
        return; /* not dshim-run's (a user's own DSHIM_TIMELINE stays where it is) */
    }
    const char *slash = strrchr(pattern, '/');
    char dir[512];
    snprintf(dir, sizeof(dir), "%.*s", (int)(slash - pattern), pattern);
    DIR *d = opendir(dir);
    if (!d) {
        return; /* the process never opened a communicator */
    }
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        size_t len = strlen(de->d_name);
        if (strncmp(de->d_name, TL_STEM, strlen(TL_STEM)) != 0 || len < 5 ||
            strcmp(de->d_name + len - 5, ".json") != 0) {
            continue;
        }
        char path[1024];
        snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
        if (rank_mode) {
            store_file(idx, path, common);
        } else {
            send_file(idx, path);
        }
        unlink(path);
    }
    closedir(d);
    rmdir(dir); /* when empty; torch's error file directory is the same one */
}

/* ---- controller ---------------------------------------------------------- */

typedef struct {
    uint64_t send, recv, agent_mono, agent_real, ctl_real;
} tl_sample_t;

typedef struct {
    double at;     /* agent monotonic ns */
    double offset; /* agent monotonic - controller monotonic, ns */
    double bound;  /* half the round trip, ns */
} tl_point_t;

typedef struct {
    char host[128];
    bool seen;
    /* pings */
    long next_seq;
    long outstanding;  /* seq, or -1 */
    uint64_t sent_ns, sent_real_ns, due_ns;
    int burst_left;
    tl_sample_t *samples;
    int nsamples, capsamples;
    /* the model, built at write */
    tl_point_t *pts;
    int npts;
    double max_bound, realtime_offset;
} tl_agent_t;

typedef struct {
    int agent, idx;
    char *data;
    size_t len, cap;
    /* from the header line */
    long rank, pid;
    char host[128];
    uint64_t real0, mono0;
    bool header;
} tl_file_t;

struct run_timeline {
    char *path;
    uint64_t mono0, real0; /* the controller's origin */
    tl_agent_t *agents;
    int nagents;
    tl_file_t *files;
    int nfiles, capfiles;
};

run_timeline_t *run_timeline_new(const char *path, int nagents)
{
    if (!path) {
        return NULL;
    }
    run_timeline_t *t = run_xmalloc(sizeof(*t));
    memset(t, 0, sizeof(*t));
    t->path = run_xstrdup(path);
    t->nagents = nagents;
    t->agents = run_xmalloc((size_t)(nagents > 0 ? nagents : 1) * sizeof(*t->agents));
    memset(t->agents, 0, (size_t)(nagents > 0 ? nagents : 1) * sizeof(*t->agents));
    for (int i = 0; i < nagents; i++) {
        t->agents[i].outstanding = -1;
    }
    t->real0 = clock_ns(CLOCK_REALTIME);
    t->mono0 = clock_ns(CLOCK_MONOTONIC);
    return t;
}

void run_timeline_set_origin(run_timeline_t *t, uint64_t mono_ns, uint64_t real_ns)
{
    t->mono0 = mono_ns;
    t->real0 = real_ns;
}

void run_timeline_free(run_timeline_t *t)
{
    if (!t) {
        return;
    }
    for (int i = 0; i < t->nagents; i++) {
        free(t->agents[i].samples);
        free(t->agents[i].pts);
    }
    for (int i = 0; i < t->nfiles; i++) {
        free(t->files[i].data);
    }
    free(t->agents);
    free(t->files);
    free(t->path);
    free(t);
}

void run_timeline_poll(run_timeline_t *t, int agent, int fd, const char *host)
{
    if (!t || agent < 0 || agent >= t->nagents) {
        return;
    }
    tl_agent_t *a = &t->agents[agent];
    if (fd < 0) {
        return;
    }
    uint64_t now = clock_ns(CLOCK_MONOTONIC);
    if (!a->seen) {
        a->seen = true;
        a->burst_left = TL_BURST;
        a->due_ns = now;
        snprintf(a->host, sizeof(a->host), "%s", host ? host : "?");
    }
    if (a->outstanding >= 0) {
        if (now - a->sent_ns < TL_LOST_NS) {
            return;
        }
        a->outstanding = -1; /* no answer (agent busy or gone): try again */
    }
    if (now < a->due_ns || a->nsamples >= TL_MAX_SAMPLES) {
        return;
    }
    char msg[32];
    int n = snprintf(msg, sizeof(msg), "P %ld\n", a->next_seq);
    a->outstanding = a->next_seq++;
    a->sent_real_ns = clock_ns(CLOCK_REALTIME);
    a->sent_ns = clock_ns(CLOCK_MONOTONIC);
    if (run_write_all(fd, msg, (size_t)n) != 0) {
        a->outstanding = -1;
        a->due_ns = now + TL_PERIOD_NS;
    }
}

void run_timeline_add_sample(run_timeline_t *t, int agent, uint64_t send_ns, uint64_t recv_ns, uint64_t agent_mono_ns,
                             uint64_t agent_real_ns, uint64_t ctl_real_send_ns)
{
    tl_agent_t *a = &t->agents[agent];
    if (a->nsamples == a->capsamples) {
        int cap = a->capsamples ? 2 * a->capsamples : 64;
        tl_sample_t *s = realloc(a->samples, (size_t)cap * sizeof(*s));
        if (!s) {
            return;
        }
        a->samples = s;
        a->capsamples = cap;
    }
    a->samples[a->nsamples++] = (tl_sample_t){send_ns, recv_ns, agent_mono_ns, agent_real_ns, ctl_real_send_ns};
}

static void on_pong(run_timeline_t *t, int agent, const run_frame_t *f)
{
    uint64_t now = clock_ns(CLOCK_MONOTONIC);
    tl_agent_t *a = &t->agents[agent];
    char text[128];
    snprintf(text, sizeof(text), "%.*s", (int)(f->textlen < sizeof(text) - 1 ? f->textlen : sizeof(text) - 1),
             f->text);
    long long seq = -1;
    unsigned long long mono = 0, real = 0;
    if (sscanf(text, "%lld %llu %llu", &seq, &mono, &real) != 3 || seq != a->outstanding) {
        return; /* an answer to a ping given up on */
    }
    a->outstanding = -1;
    run_timeline_add_sample(t, agent, a->sent_ns, now, mono, real, a->sent_real_ns);
    if (a->burst_left > 0) {
        a->burst_left--;
    }
    a->due_ns = a->burst_left > 0 ? now : now + TL_PERIOD_NS;
}

void run_timeline_add_line(run_timeline_t *t, int agent, int idx, const char *line, size_t len)
{
    /* {"displayTimeUnit":"ms","otherData":{"dshim":{"format":"dshim-timeline",...}},"traceEvents":[ */
    bool header = len > 2 && line[0] == '{' && line[len - 1] == '[' && memmem(line, len, "\"dshim-timeline\"", 16);
    tl_file_t *f = NULL;
    if (!header) {
        /* the latest file of this process */
        for (int i = t->nfiles - 1; i >= 0; i--) {
            if (t->files[i].idx == idx && t->files[i].agent == agent) {
                f = &t->files[i];
                break;
            }
        }
        if (!f) {
            return; /* no header: not a file we can place */
        }
    } else {
        if (t->nfiles == t->capfiles) {
            int cap = t->capfiles ? 2 * t->capfiles : 16;
            tl_file_t *nf = realloc(t->files, (size_t)cap * sizeof(*nf));
            if (!nf) {
                return;
            }
            t->files = nf;
            t->capfiles = cap;
        }
        f = &t->files[t->nfiles++];
        memset(f, 0, sizeof(*f));
        f->agent = agent;
        f->idx = idx;
        f->rank = -1;
    }
    if (f->len + len + 2 > f->cap) {
        size_t cap = f->cap ? f->cap : 4096;
        while (cap < f->len + len + 2) {
            cap *= 2;
        }
        char *d = realloc(f->data, cap);
        if (!d) {
            return;
        }
        f->data = d;
        f->cap = cap;
    }
    memcpy(f->data + f->len, line, len);
    f->len += len;
    f->data[f->len++] = '\n';
    f->data[f->len] = '\0';
}

bool run_timeline_frame(run_timeline_t *t, int agent, const run_frame_t *f)
{
    if (f->kind != RUN_FRAME_TIMELINE && f->kind != RUN_FRAME_PONG) {
        return false;
    }
    if (!t || agent < 0 || agent >= t->nagents) {
        return true;
    }
    if (f->kind == RUN_FRAME_PONG) {
        on_pong(t, agent, f);
    } else {
        run_timeline_add_line(t, agent, f->idx, f->text, f->textlen);
    }
    return true;
}

/* ---- alignment ----------------------------------------------------------- */

static int cmp_point(const void *a, const void *b)
{
    const tl_point_t *x = a, *y = b;
    return x->at < y->at ? -1 : x->at > y->at;
}

/* Per window of TL_WINDOW_NS the ping with the shortest round trip; those
 * whose round trip is far worse than the best one are left out. */
static void build_model(run_timeline_t *t, tl_agent_t *a)
{
    free(a->pts);
    a->pts = NULL;
    a->npts = 0;
    a->max_bound = -1;
    if (a->nsamples == 0) {
        return;
    }
    double best = -1;
    const tl_sample_t *best_s = NULL;
    for (int i = 0; i < a->nsamples; i++) {
        double b = (double)(a->samples[i].recv - a->samples[i].send) / 2;
        if (best < 0 || b < best) {
            best = b;
            best_s = &a->samples[i];
        }
    }
    double keep = best * 4 > best + 100000 ? best * 4 : best + 100000;
    a->pts = run_xmalloc((size_t)a->nsamples * sizeof(*a->pts));
    uint64_t window = UINT64_MAX;
    for (int i = 0; i < a->nsamples; i++) {
        const tl_sample_t *s = &a->samples[i];
        double b = (double)(s->recv - s->send) / 2;
        if (b > keep) {
            continue;
        }
        double mid = (double)s->send + b;
        tl_point_t p = {(double)s->agent_mono, (double)s->agent_mono - mid, b};
        uint64_t w = (s->send >= t->mono0 ? s->send - t->mono0 : 0) / TL_WINDOW_NS;
        if (a->npts > 0 && w == window) {
            if (b < a->pts[a->npts - 1].bound) {
                a->pts[a->npts - 1] = p;
            }
        } else {
            a->pts[a->npts++] = p;
            window = w;
        }
    }
    qsort(a->pts, (size_t)a->npts, sizeof(*a->pts), cmp_point);
    for (int i = 0; i < a->npts; i++) {
        if (a->pts[i].bound > a->max_bound) {
            a->max_bound = a->pts[i].bound;
        }
    }
    /* how far the host's wall clock is from ours (for the report only) */
    double b = (double)(best_s->recv - best_s->send) / 2;
    a->realtime_offset = (double)((int64_t)best_s->agent_real - (int64_t)best_s->ctl_real) - b;
}

double run_timeline_bound_ns(run_timeline_t *t, int agent)
{
    tl_agent_t *a = &t->agents[agent];
    build_model(t, a);
    return a->npts ? a->max_bound : -1;
}

/* agent monotonic - controller monotonic at agent monotonic time m */
static double model_offset(const tl_agent_t *a, double m)
{
    if (m <= a->pts[0].at || a->npts == 1) {
        return a->pts[0].offset;
    }
    for (int i = 0; i + 1 < a->npts; i++) {
        const tl_point_t *p = &a->pts[i], *q = &a->pts[i + 1];
        if (m <= q->at) {
            double span = q->at - p->at;
            return span > 0 ? p->offset + (q->offset - p->offset) * (m - p->at) / span : q->offset;
        }
    }
    return a->pts[a->npts - 1].offset;
}

/* ---- merge --------------------------------------------------------------- */

static bool parse_u64(const char **pp, const char *end, uint64_t *v)
{
    const char *p = *pp;
    if (p >= end || *p < '0' || *p > '9') {
        return false;
    }
    uint64_t x = 0;
    while (p < end && *p >= '0' && *p <= '9') {
        x = x * 10 + (uint64_t)(*p - '0');
        p++;
    }
    *v = x;
    *pp = p;
    return true;
}

static bool parse_long(const char **pp, const char *end, long *v)
{
    bool neg = *pp < end && **pp == '-';
    if (neg) {
        (*pp)++;
    }
    uint64_t x;
    if (!parse_u64(pp, end, &x)) {
        return false;
    }
    *v = neg ? -(long)x : (long)x;
    return true;
}

static bool lit(const char **pp, const char *end, const char *s)
{
    size_t n = strlen(s);
    if ((size_t)(end - *pp) < n || memcmp(*pp, s, n) != 0) {
        return false;
    }
    *pp += n;
    return true;
}

/* "x.yyy" microseconds -> ns */
static bool parse_us(const char **pp, const char *end, uint64_t *ns)
{
    uint64_t whole, frac = 0;
    if (!parse_u64(pp, end, &whole)) {
        return false;
    }
    int digits = 0;
    if (*pp < end && **pp == '.') {
        (*pp)++;
        while (*pp < end && **pp >= '0' && **pp <= '9') {
            if (digits < 3) {
                frac = frac * 10 + (uint64_t)(**pp - '0');
                digits++;
            }
            (*pp)++;
        }
    }
    while (digits++ < 3) {
        frac *= 10;
    }
    *ns = whole * 1000 + frac;
    return true;
}

/* The value of "key": (an integer) somewhere in the header line. */
static bool header_u64(const char *line, const char *key, uint64_t *v)
{
    const char *p = strstr(line, key);
    if (!p) {
        return false;
    }
    p += strlen(key);
    return parse_u64(&p, p + 24, v);
}

static void parse_header(tl_file_t *f)
{
    const char *nl = strchr(f->data, '\n');
    size_t n = nl ? (size_t)(nl - f->data) : f->len;
    char *line = strndup(f->data, n);
    uint64_t v;
    if (header_u64(line, "\"realtime_ns\":", &f->real0) && header_u64(line, "\"monotonic_ns\":", &f->mono0)) {
        f->header = true;
    }
    const char *r = strstr(line, "\"rank\":");
    if (r) {
        r += 7;
        parse_long(&r, r + 24, &f->rank);
    }
    if (header_u64(line, "\"pid\":", &v)) {
        f->pid = (long)v;
    }
    const char *h = strstr(line, "\"host\":\"");
    if (h) {
        h += 8;
        const char *q = strchr(h, '"');
        if (q) {
            snprintf(f->host, sizeof(f->host), "%.*s", (int)(q - h), h);
        }
    }
    free(line);
}

typedef struct {
    FILE *out;
    bool first;
} tl_out_t;

static void emit(tl_out_t *o, const char *line, size_t len)
{
    fputs(o->first ? "" : ",", o->out);
    fwrite(line, 1, len, o->out);
    fputc('\n', o->out);
    o->first = false;
}

static void fmt_signed_us(char *out, size_t cap, int64_t ns)
{
    uint64_t a = ns < 0 ? (uint64_t)(-ns) : (uint64_t)ns;
    snprintf(out, cap, "%s%" PRIu64 ".%03u", ns < 0 ? "-" : "", a / 1000, (unsigned)(a % 1000));
}

/* One line of file f, pid rewritten, ts aligned; metadata of the process itself left out. */
static void merge_line(run_timeline_t *t, const tl_file_t *f, long pid, const char *line, size_t len, tl_out_t *o)
{
    const char *p = line, *end = line + len;
    if (p < end && *p == ',') {
        p++;
    }
    char ph;
    long fpid, tid;
    if (!lit(&p, end, "{\"ph\":\"") || p >= end) {
        return; /* the header, the end line, or a cut line */
    }
    ph = *p++;
    if (!lit(&p, end, "\",\"pid\":") || !parse_long(&p, end, &fpid) || !lit(&p, end, ",\"tid\":") ||
        !parse_long(&p, end, &tid) || !lit(&p, end, ",") || end[-1] != '}') {
        return;
    }
    if (ph == 'M' && (lit(&(const char *){p}, end, "\"name\":\"process_name\"") ||
                      lit(&(const char *){p}, end, "\"name\":\"process_sort_index\""))) {
        return;
    }
    char head[160];
    int n;
    if (lit(&p, end, "\"ts\":")) {
        uint64_t ts;
        if (!parse_us(&p, end, &ts) || !lit(&p, end, ",")) {
            return;
        }
        /* integers: realtime nanoseconds are beyond a double's precision */
        int64_t mono = (int64_t)ts - ((int64_t)f->real0 - (int64_t)f->mono0); /* the process's monotonic clock */
        const tl_agent_t *a = &t->agents[f->agent];
        int64_t ctl;
        if (a->npts > 0) {
            double off = model_offset(a, (double)mono);
            ctl = mono - (int64_t)(off < 0 ? off - 0.5 : off + 0.5);
        } else {
            ctl = (int64_t)ts - ((int64_t)t->real0 - (int64_t)t->mono0); /* by the realtime clocks */
        }
        char us[40];
        fmt_signed_us(us, sizeof(us), ctl - (int64_t)t->mono0);
        n = snprintf(head, sizeof(head), "{\"ph\":\"%c\",\"pid\":%ld,\"tid\":%ld,\"ts\":%s,", ph, pid, tid, us);
    } else {
        n = snprintf(head, sizeof(head), "{\"ph\":\"%c\",\"pid\":%ld,\"tid\":%ld,", ph, pid, tid);
    }
    fputs(o->first ? "" : ",", o->out);
    fwrite(head, 1, (size_t)n, o->out);
    fwrite(p, 1, (size_t)(end - p), o->out);
    fputc('\n', o->out);
    o->first = false;
}

/* Whether every file that has a header has its own world rank (the merged
 * file's pid is then the rank, else the file's number). */
static bool ranks_unique(const run_timeline_t *t)
{
    for (int i = 0; i < t->nfiles; i++) {
        const tl_file_t *f = &t->files[i];
        if (!f->header) {
            continue;
        }
        if (f->rank < 0) {
            return false;
        }
        for (int k = 0; k < i; k++) {
            if (t->files[k].header && t->files[k].rank == f->rank) {
                return false;
            }
        }
    }
    return true;
}

/* The clock models of the agents; returns the largest skew bound (ns) of
 * the agents that sent files, -1 when none was measured; *unmeasured: some
 * file came from an agent without a model. */
static double clock_bound(run_timeline_t *t, bool *unmeasured)
{
    double bound = -1;
    *unmeasured = false;
    for (int i = 0; i < t->nagents; i++) {
        build_model(t, &t->agents[i]);
    }
    for (int i = 0; i < t->nfiles; i++) {
        const tl_agent_t *a = &t->agents[t->files[i].agent];
        if (!t->files[i].header) {
            continue;
        }
        if (a->npts == 0) {
            *unmeasured = true;
        } else if (a->max_bound > bound) {
            bound = a->max_bound;
        }
    }
    return bound;
}

/* Hosts: an agent with a lifeline is one host (fake hosts may share a
 * hostname); under mpirun/srun the names the processes saw. */
static int count_hosts(const run_timeline_t *t)
{
    int nhosts = 0;
    for (int i = 0; i < t->nfiles; i++) {
        const tl_file_t *f = &t->files[i];
        bool dup = !f->header;
        for (int k = 0; k < i && !dup; k++) {
            const tl_file_t *g = &t->files[k];
            dup = g->header && (t->agents[f->agent].seen ? g->agent == f->agent
                                                          : !t->agents[g->agent].seen && !strcmp(g->host, f->host));
        }
        nhosts += !dup;
    }
    return nhosts;
}

/* The merged file's header: what was merged, and each agent's clock model. */
static void write_header(FILE *out, const run_timeline_t *t, int nfiles, int nhosts, double bound)
{
    fprintf(out, "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"dshim\":{\"format\":\"dshim-timeline-merged\","
                 "\"version\":1,\"processes\":%d,\"hosts\":%d,"
                 "\"controller_realtime_ns\":%" PRIu64 ",\"clock_skew_bound_us\":%.3f,\"agents\":[",
            nfiles, nhosts, t->real0, bound < 0 ? -1.0 : bound / 1e3);
    bool firsta = true;
    for (int i = 0; i < t->nagents; i++) {
        const tl_agent_t *a = &t->agents[i];
        if (!a->seen && a->nsamples == 0) {
            continue;
        }
        fprintf(out, "%s{\"host\":\"", firsta ? "" : ",");
        dshim_json_write(out, a->host);
        fprintf(out, "\",\"pings\":%d,\"points\":%d,\"bound_us\":%.3f,\"offset_us\":%.3f,\"realtime_offset_us\":%.3f}",
                a->nsamples, a->npts, a->npts ? a->max_bound / 1e3 : -1.0,
                a->npts ? model_offset(a, a->pts[0].at) / 1e3 : 0.0, a->npts ? a->realtime_offset / 1e3 : 0.0);
        firsta = false;
    }
    fprintf(out, "]}},\"traceEvents\":[\n");
}

/* One process's track: its name and place, then its events moved onto the
 * controller's clock. */
static void write_process(run_timeline_t *t, const run_plan_t *plan, const tl_file_t *f, long pid, tl_out_t *o)
{
    const char *name = (plan && f->idx >= 0 && f->idx < plan->nprocs) ? plan->procs[f->idx].name : "process";
    int per_proc = 0;
    for (int k = 0; k < t->nfiles; k++) {
        per_proc += t->files[k].header && t->files[k].idx == f->idx && t->files[k].agent == f->agent;
    }
    char meta[600], pname[300], esc[300];
    const char *host = t->agents[f->agent].seen ? t->agents[f->agent].host : f->host; /* as the hostfile says */
    if (per_proc > 1) {
        snprintf(pname, sizeof(pname), "%s pid %ld on %s", name, f->pid, host);
    } else {
        snprintf(pname, sizeof(pname), "%s on %s", name, host);
    }
    dshim_json_escape(esc, sizeof(esc), pname);
    int n = snprintf(meta, sizeof(meta), "{\"ph\":\"M\",\"pid\":%ld,\"tid\":0,\"name\":\"process_name\",\"args\":"
                     "{\"name\":\"%s\"}}", pid, esc);
    emit(o, meta, (size_t)n);
    n = snprintf(meta, sizeof(meta), "{\"ph\":\"M\",\"pid\":%ld,\"tid\":0,\"name\":\"process_sort_index\","
                 "\"args\":{\"sort_index\":%ld}}", pid, pid);
    emit(o, meta, (size_t)n);
    const char *p = f->data, *end = f->data + f->len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t len = nl ? (size_t)(nl - p) : (size_t)(end - p);
        merge_line(t, f, pid, p, len, o);
        p += len + 1;
    }
}

/* dshim-run's one line on the merged file. */
static void say_written(const run_timeline_t *t, int nfiles, int nhosts, double bound, bool unmeasured)
{
    char skew[200];
    long bound_us = (long)(bound / 1e3); /* rounded up: a bound */
    if ((double)bound_us * 1e3 < bound || bound_us < 1) {
        bound_us++;
    }
    if (bound >= 0 && !unmeasured) {
        snprintf(skew, sizeof(skew), "clock skew \u2264 %ld \u00b5s", bound_us);
    } else if (bound >= 0) {
        snprintf(skew, sizeof(skew), "clock skew \u2264 %ld \u00b5s where measured (ranks started by mpirun/srun "
                 "placed by their hosts' realtime clocks)", bound_us);
    } else {
        snprintf(skew, sizeof(skew), "clock skew not measured (ranks started by mpirun/srun: placed by their "
                 "hosts' realtime clocks)");
    }
    run_say("timeline: %d rank%s on %d host%s, %s, written to %s", nfiles, nfiles == 1 ? "" : "s", nhosts,
            nhosts == 1 ? "" : "s", skew, t->path);
}

int run_timeline_write(run_timeline_t *t, const run_plan_t *plan)
{
    if (!t) {
        return 0;
    }
    int nfiles = 0;
    for (int i = 0; i < t->nfiles; i++) {
        parse_header(&t->files[i]);
        nfiles += t->files[i].header;
    }
    if (nfiles == 0) {
        run_say("timeline: no process wrote a timeline (none opened a dshim communicator?); %s not written", t->path);
        return -1;
    }
    bool ranks_ok = ranks_unique(t), unmeasured;
    double bound = clock_bound(t, &unmeasured);
    char tmp[4200];
    snprintf(tmp, sizeof(tmp), "%s.tmp%d", t->path, (int)getpid());
    /* beside the user's file, maybe in a directory others can write: no
     * link followed, no file of someone else's written into (private_fs.h);
     * the rename then replaces whatever name was there, never its target */
    int ofd = dshim_private_open(tmp, DSHIM_OPEN_TRUNC);
    FILE *out = ofd >= 0 ? fdopen(ofd, "w") : NULL;
    if (!out) {
        run_say("timeline: cannot write %s: %s", tmp, dshim_private_why(errno));
        if (ofd >= 0) {
            close(ofd);
        }
        return -1;
    }
    int nhosts = count_hosts(t);
    write_header(out, t, nfiles, nhosts, bound);
    tl_out_t o = {out, true};
    int ord = 0;
    for (int i = 0; i < t->nfiles; i++) {
        if (t->files[i].header) {
            write_process(t, plan, &t->files[i], ranks_ok ? t->files[i].rank : ord, &o);
            ord++;
        }
    }
    fprintf(out, "]}\n");
    bool ok = fflush(out) == 0 && !ferror(out);
    ok = (fclose(out) == 0) && ok;
    if (!ok || rename(tmp, t->path) != 0) {
        run_say("timeline: cannot write %s: %s", t->path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    say_written(t, nfiles, nhosts, bound, unmeasured);
    return 0;
}

void run_timeline_fetch(run_timeline_t *t, const run_plan_t *plan)
{
    if (!t || !plan->host_store) {
        return;
    }
    dshim_store_t *s = NULL;
    for (int g = 0; g < plan->ngroups && g < t->nagents; g++) {
        const run_group_t *grp = &plan->groups[g];
        if (grp->kind != RUN_AGENT_MPI && grp->kind != RUN_AGENT_SLURM) {
            continue;
        }
        if (!s && dshim_store_connect(plan->store_addr, plan->store_port, plan->token, 2.0, &s) != DSHIM_OK) {
            run_say("timeline: cannot read the ranks' timelines from the store: %s", dshim_last_error());
            return;
        }
        for (int idx = grp->first; idx < grp->first + grp->count; idx++) {
            char key[96];
            int64_t n = 0;
            snprintf(key, sizeof(key), TL_STORE_KEY "%d/n", idx);
            if (dshim_store_add(s, key, 0, &n) != DSHIM_OK) {
                continue;
            }
            for (int64_t k = 1; k <= n; k++) {
                void *val = NULL;
                size_t len = 0;
                snprintf(key, sizeof(key), TL_STORE_KEY "%d/%lld", idx, (long long)k);
                if (dshim_store_try_get(s, key, &val, &len) != DSHIM_OK) {
                    continue;
                }
                const char *p = val, *end = p + len;
                while (p < end) {
                    const char *nl = memchr(p, '\n', (size_t)(end - p));
                    size_t l = nl ? (size_t)(nl - p) : (size_t)(end - p);
                    run_timeline_add_line(t, g, idx, p, l);
                    p += l + 1;
                }
                free(val);
                dshim_store_delete(s, key);
            }
        }
    }
    if (s) {
        dshim_store_close(s);
    }
}

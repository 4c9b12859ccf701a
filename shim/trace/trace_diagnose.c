/*
 * What the dumps of all ranks say, for people (trace_read.h): the
 * one-screen diagnosis of a failed or hung job, and the live status of a
 * running one.  Pure functions of the parsed dumps and of what the launcher
 * knows of each process (exit status, /proc state when asked to dump), so
 * that tests check every case with hand-written dumps.
 *
 * The diagnosis, per communicator (ring name; the same name on every rank):
 * each rank's "pending" operation is its oldest entry that is not done (where
 * it is stuck: later ones queue behind it, failed ones follow it).  The
 * ranks in the same pending collective form groups; the largest group is
 * "who waits", and every other rank is described relative to it: in another
 * collective at that seq (a mismatch, or a skipped call), in the same one
 * with other arguments, idle since its last completed op, or without a dump
 * (dead, stopped, not answering).  Ranks are world ranks (ring ranks mapped
 * with each ring line's world_rank), printed as ranges.
 *
 * MXNet jobs (dshim's parameter server, shim/ps/ps_trace.h) have no
 * communicators: each process keeps its own ring ("ps/server.S",
 * "ps/worker.W", "ps/scheduler"), read apart (ps_* below): the servers'
 * rounds in state waiting (key, round, the workers that have not pushed),
 * each of those workers from its own ring (its last push to that server,
 * what it is in now) or from the launcher's account of it, the scheduler's
 * waiting barriers, workers left unanswered by a server that waits for no
 * one, and the job's other processes without a dump.  Processes are named
 * by role ("server 1", "worker 0": launcher.jsonl's names, or the ring's).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trace.h"
#include "trace_read.h"

/* ---- text buffer ---------------------------------------------------------- */

typedef struct {
    char *buf;
    size_t len, cap;
    int lines;
} text_t;

static void tx_vadd(text_t *t, const char *fmt, va_list ap)
{
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    if (n < 0) {
        return;
    }
    if (t->len + (size_t)n + 1 > t->cap) {
        size_t cap = t->cap ? t->cap : 1024;
        while (cap < t->len + (size_t)n + 1) {
            cap *= 2;
        }
        char *b = realloc(t->buf, cap);
        if (b == NULL) {
            return;
        }
        t->buf = b;
        t->cap = cap;
    }
    vsnprintf(t->buf + t->len, (size_t)n + 1, fmt, ap);
    t->len += (size_t)n;
}

static void tx_add(text_t *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void tx_add(text_t *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    tx_vadd(t, fmt, ap);
    va_end(ap);
}

static char *tx_take(text_t *t)
{
    if (t->buf == NULL) {
        return strdup("");
    }
    return t->buf;
}

/* ---- formatting helpers --------------------------------------------------- */

/* 25165824 -> "25,165,824" */
static void fmt_count(uint64_t v, char *out, size_t cap)
{
    char digits[32];
    int n = snprintf(digits, sizeof(digits), "%llu", (unsigned long long)v);
    size_t o = 0;
    for (int i = 0; i < n && o + 2 < cap; i++) {
        if (i > 0 && (n - i) % 3 == 0) {
            out[o++] = ',';
        }
        out[o++] = digits[i];
    }
    out[o] = '\0';
}

static void fmt_bytes(uint64_t b, char *out, size_t cap)
{
    const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)b;
    int u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        u++;
    }
    if (u == 0) {
        snprintf(out, cap, "%llu B", (unsigned long long)b);
    } else {
        snprintf(out, cap, "%.1f %s", v, units[u]);
    }
}

static void fmt_secs(double s, char *out, size_t cap)
{
    if (s < 0) {
        s = 0;
    }
    if (s < 1.0) {
        snprintf(out, cap, "%.0f ms", s * 1000.0);
    } else if (s < 100.0) {
        snprintf(out, cap, "%.1f s", s);
    } else {
        snprintf(out, cap, "%.0f s", s);
    }
}

static const char *sig_name(int sig)
{
    switch (sig) {
    case 1: return "SIGHUP";
    case 2: return "SIGINT";
    case 3: return "SIGQUIT";
    case 4: return "SIGILL";
    case 6: return "SIGABRT";
    case 7: return "SIGBUS";
    case 8: return "SIGFPE";
    case 9: return "SIGKILL";
    case 10: return "SIGUSR1";
    case 11: return "SIGSEGV";
    case 12: return "SIGUSR2";
    case 13: return "SIGPIPE";
    case 14: return "SIGALRM";
    case 15: return "SIGTERM";
    default: return NULL;
    }
}

static int is_p2p(const char *op)
{
    return strcmp(op, "send") == 0 || strcmp(op, "recv") == 0 || strcmp(op, "isend") == 0 ||
           strcmp(op, "irecv") == 0 || strcmp(op, "sendrecv") == 0 || strcmp(op, "push") == 0 ||
           strcmp(op, "pull") == 0 || strcmp(op, "pushpull") == 0;
}

/* Counts may differ between ranks in the "v" collectives by design. */
static int counts_vary(const char *op)
{
    size_t n = strlen(op);
    return n > 1 && op[n - 1] == 'v';
}

/* "allreduce #1043" */
static void fmt_opseq(const dshim_trace_rec_t *e, char *out, size_t cap)
{
    if (e->seq == DSHIM_TRACE_SEQ_NONE) {
        snprintf(out, cap, "%s (not started)", e->op[0] ? e->op : "an operation");
    } else {
        snprintf(out, cap, "%s #%llu", e->op[0] ? e->op : "an operation", (unsigned long long)e->seq);
    }
}

/* "(float32 × 25,165,824, root 0, from DDP bucket 2)" or "" */
static void fmt_args(const dshim_trace_rec_t *e, int with_label, char *out, size_t cap)
{
    char parts[256] = "";
    size_t len = 0;
    char cnt[40];
    if (e->dtype[0] && e->count > 0) {
        fmt_count(e->count, cnt, sizeof(cnt));
        len += (size_t)snprintf(parts + len, sizeof(parts) - len, "%s \xc3\x97 %s", e->dtype, cnt);
    } else if (e->bytes > 0) {
        fmt_bytes(e->bytes, cnt, sizeof(cnt));
        len += (size_t)snprintf(parts + len, sizeof(parts) - len, "%s", cnt);
    }
    if (e->root >= 0 && len < sizeof(parts)) {
        len += (size_t)snprintf(parts + len, sizeof(parts) - len, "%sroot %d", len ? ", " : "", e->root);
    }
    if (e->peer >= 0 && len < sizeof(parts)) {
        len += (size_t)snprintf(parts + len, sizeof(parts) - len, "%s%s %d", len ? ", " : "",
                                strstr(e->op, "recv") ? "from rank" : "to rank", e->peer);
    }
    if (with_label && e->label[0] && len < sizeof(parts)) {
        len += (size_t)snprintf(parts + len, sizeof(parts) - len, "%sfrom %s", len ? ", " : "", e->label);
    }
    if (len == 0) {
        out[0] = '\0';
    } else {
        snprintf(out, cap, " (%s)", parts);
    }
}

/* " (float32 × 4)" -> "float32 × 4" (in place) */
static const char *unparen(char *s)
{
    size_t n = strlen(s);
    if (n >= 3 && s[0] == ' ' && s[1] == '(' && s[n - 1] == ')') {
        s[n - 1] = '\0';
        return s + 2;
    }
    return n ? s : "no arguments";
}

/* ---- the model: communicators and their members --------------------------- */

typedef struct {
    const dshim_trace_dump_t *dump;  /* NULL: no dump has this member */
    const dshim_trace_dring_t *ring;
    int world;                       /* world rank; -1 unknown */
    const dshim_trace_rec_t *pending;   /* oldest entry not done */
    const dshim_trace_rec_t *last_done; /* newest done */
    const dshim_trace_rec_t *last;      /* newest entry */
    int group;                       /* index of its pending group; -1 none */
} member_t;

typedef struct {
    const char *name, *desc;
    int size;         /* members[] entries (ring size, bounded) */
    member_t *members;
    int ndumped;
    int world_sized;
} comm_t;

typedef struct {
    const dshim_trace_set_t *set;
    comm_t *comms;
    int ncomms;
    int world_size;
    uint64_t now;     /* wall clock, ns */
} model_t;

static uint64_t to_wall(const dshim_trace_dump_t *d, uint64_t mono)
{
    if (mono == 0) {
        return 0;
    }
    return mono - d->monotonic_ns + d->realtime_ns;  /* wraps back for mono < monotonic_ns: fine in uint64 */
}

static double age_s(const model_t *m, const dshim_trace_dump_t *d, uint64_t mono)
{
    uint64_t w = to_wall(d, mono);
    if (w == 0 || m->now < w) {
        return 0;
    }
    return (double)(m->now - w) / 1e9;
}

static const dshim_trace_proc_t *proc_of_rank(const dshim_trace_set_t *s, int world)
{
    for (size_t i = 0; world >= 0 && i < s->nprocs; i++) {
        if (s->procs[i].rank == world) {
            return &s->procs[i];
        }
    }
    return NULL;
}

static const dshim_trace_proc_t *proc_of_dump(const dshim_trace_set_t *s, const dshim_trace_dump_t *d)
{
    for (size_t i = 0; i < s->nprocs; i++) {
        if (s->procs[i].pid == d->pid && d->pid > 0) {
            return &s->procs[i];
        }
    }
    return proc_of_rank(s, d->rank);
}

static void classify(member_t *mb)
{
    const dshim_trace_dring_t *r = mb->ring;
    for (size_t i = 0; i < r->n; i++) {
        const dshim_trace_rec_t *e = &r->recs[i];
        if (e->state < 0) {
            continue;
        }
        mb->last = e;
        if (e->state == DSHIM_TRACE_DONE) {
            mb->last_done = e;
        } else if (mb->pending == NULL) {
            mb->pending = e;
        }
    }
}

/* dshim's parameter server (MXNet) names its rings "ps/server.S",
 * "ps/worker.W" and "ps/scheduler" (shim/ps/ps_trace.h): one per process,
 * each ring its own; they are read apart from the communicators. */
static int is_ps_ring(const char *name)
{
    return strncmp(name, "ps/", 3) == 0;
}

static void model_free(model_t *m)
{
    for (int i = 0; i < m->ncomms; i++) {
        free(m->comms[i].members);
    }
    free(m->comms);
}

/* Builds communicators from the dumps' rings. */
static void model_build(model_t *m, const dshim_trace_set_t *set, uint64_t now)
{
    memset(m, 0, sizeof(*m));
    m->set = set;
    m->world_size = -1;
    for (size_t i = 0; i < set->n; i++) {
        if (set->dumps[i].size > m->world_size) {
            m->world_size = set->dumps[i].size;
        }
        if (set->dumps[i].realtime_ns > m->now) {
            m->now = set->dumps[i].realtime_ns;
        }
    }
    int ranks_known = 0;
    for (size_t i = 0; i < set->nprocs; i++) {
        ranks_known += set->procs[i].rank >= 0;
    }
    if (m->world_size < ranks_known) {
        m->world_size = ranks_known;
    }
    if (now) {
        m->now = now;
    }
    /* a bound on members per communicator that garbage cannot inflate: a
     * header's world size counts only when the input is of its order (a
     * "size":200000000 asked for 11 GB once, found by tests/fuzz) */
    int bound = 4096;
    if ((size_t)bound < 2 * set->n) {
        bound = (int)(2 * set->n);
    }
    if (bound < m->world_size && (size_t)m->world_size <= 16 * (set->n + set->nprocs)) {
        bound = m->world_size;
    }
    for (size_t i = 0; i < set->n; i++) {
        const dshim_trace_dump_t *d = &set->dumps[i];
        for (size_t k = 0; k < d->nrings; k++) {
            const dshim_trace_dring_t *r = &d->rings[k];
            if (r->rank < 0 || r->rank >= bound || is_ps_ring(r->name)) {
                continue;  /* the parameter server's rings are no communicators (ps_* below) */
            }
            comm_t *c = NULL;
            for (int j = 0; j < m->ncomms; j++) {
                if (strcmp(m->comms[j].name, r->name) == 0) {
                    c = &m->comms[j];
                }
            }
            if (c == NULL) {
                comm_t *cs = realloc(m->comms, (size_t)(m->ncomms + 1) * sizeof(*cs));
                if (cs == NULL) {
                    continue;
                }
                m->comms = cs;
                c = &cs[m->ncomms++];
                memset(c, 0, sizeof(*c));
                c->name = r->name;
                c->desc = r->desc;
            }
            int size = r->size > r->rank ? r->size : r->rank + 1;
            if (size > bound) {
                size = bound;
            }
            if (size > c->size) {
                member_t *ms = realloc(c->members, (size_t)size * sizeof(*ms));
                if (ms == NULL) {
                    continue;
                }
                for (int j = c->size; j < size; j++) {
                    memset(&ms[j], 0, sizeof(ms[j]));
                    ms[j].world = -1;
                    ms[j].group = -1;
                }
                c->members = ms;
                c->size = size;
            }
            member_t *mb = &c->members[r->rank];
            if (mb->dump != NULL) {
                continue;  /* two processes claim one ring rank: keep the first */
            }
            mb->dump = d;
            mb->ring = r;
            mb->world = r->world_rank >= 0 ? r->world_rank : d->rank;
            if (!c->desc[0] && r->desc[0]) {
                c->desc = r->desc;
            }
            classify(mb);
            c->ndumped++;
        }
    }
    /* members without a dump: their world rank is their ring rank when the
     * communicator spans the world and every dumped member says so */
    for (int j = 0; j < m->ncomms; j++) {
        comm_t *c = &m->comms[j];
        int identity = c->size == m->world_size;
        for (int r = 0; r < c->size && identity; r++) {
            identity = c->members[r].dump == NULL || c->members[r].world == r;
        }
        c->world_sized = identity;
        for (int r = 0; r < c->size && identity; r++) {
            if (c->members[r].dump == NULL) {
                c->members[r].world = r;
            }
        }
    }
}

static const char *comm_label(const comm_t *c)
{
    return c->desc && c->desc[0] ? c->desc : c->name;
}

/* "rank 2 (host b, pid 812)", host and pid from the dump or the launcher */
static void who(const model_t *m, const comm_t *c, int ring_rank, char *out, size_t cap)
{
    const member_t *mb = &c->members[ring_rank];
    const dshim_trace_proc_t *p = mb->dump ? proc_of_dump(m->set, mb->dump) : proc_of_rank(m->set, mb->world);
    const char *host = mb->dump && mb->dump->host[0] ? mb->dump->host : p && p->host[0] ? p->host : NULL;
    long pid = mb->dump ? mb->dump->pid : p ? p->pid : 0;
    char rank[64];
    if (mb->world >= 0) {
        snprintf(rank, sizeof(rank), "rank %d", mb->world);
    } else {
        snprintf(rank, sizeof(rank), "ring rank %d of %s", ring_rank, comm_label(c));
    }
    if (host && pid > 0) {
        snprintf(out, cap, "%s (host %s, pid %ld)", rank, host, pid);
    } else if (host) {
        snprintf(out, cap, "%s (host %s)", rank, host);
    } else if (pid > 0) {
        snprintf(out, cap, "%s (pid %ld)", rank, pid);
    } else {
        snprintf(out, cap, "%s", rank);
    }
}

/* "rank 3" / "ranks 0-2,5" for a list of ring ranks, by world rank */
static void name_ranks(const comm_t *c, const int *ring_ranks, int n, char *out, size_t cap)
{
    int *w = calloc((size_t)(n > 0 ? n : 1), sizeof(*w));
    if (w == NULL) {
        snprintf(out, cap, "?");
        return;
    }
    int nw = 0, unknown = 0;
    for (int i = 0; i < n; i++) {
        int rr = ring_ranks[i];
        int wr = rr >= 0 && rr < c->size ? c->members[rr].world : -1;
        if (wr >= 0) {
            w[nw++] = wr;
        } else {
            unknown++;
        }
    }
    char list[200];
    dshim_trace_ranges(w, (size_t)nw, list, sizeof(list));
    if (nw > 0 && unknown > 0) {
        snprintf(out, cap, "ranks %s and %d rank(s) of unknown world rank", list, unknown);
    } else if (nw > 0) {
        snprintf(out, cap, "%s %s", nw == 1 ? "rank" : "ranks", list);
    } else if (unknown == 1 && n == 1) {
        snprintf(out, cap, "ring rank %d of %s", ring_ranks[0], comm_label(c));
    } else {
        snprintf(out, cap, "%d rank(s) of unknown world rank", unknown);
    }
    free(w);
}

/* ---- the diagnosis -------------------------------------------------------- */

typedef struct {
    const dshim_trace_rec_t *e;  /* a representative pending entry */
    int *members;                /* ring ranks */
    int n;
} group_t;

static int same_call(const dshim_trace_rec_t *a, const dshim_trace_rec_t *b)
{
    return a->seq == b->seq && strcmp(a->op, b->op) == 0 && strcmp(a->dtype, b->dtype) == 0 &&
           (a->count == b->count || counts_vary(a->op)) && a->root == b->root;
}

static int group_members(comm_t *c, group_t **groups_p)
{
    group_t *g = NULL;
    int ng = 0;
    for (int r = 0; r < c->size; r++) {
        member_t *mb = &c->members[r];
        if (mb->pending == NULL || is_p2p(mb->pending->op)) {
            continue;
        }
        int k = 0;
        for (; k < ng; k++) {
            if (same_call(g[k].e, mb->pending)) {
                break;
            }
        }
        if (k == ng) {
            group_t *gs = realloc(g, (size_t)(ng + 1) * sizeof(*gs));
            if (gs == NULL) {
                continue;
            }
            g = gs;
            g[ng].e = mb->pending;
            g[ng].members = calloc((size_t)c->size, sizeof(int));
            g[ng].n = 0;
            if (g[ng].members == NULL) {
                continue;
            }
            ng++;
        }
        g[k].members[g[k].n++] = r;
        mb->group = k;
    }
    *groups_p = g;
    return ng;
}

static void free_groups(group_t *g, int ng)
{
    for (int i = 0; i < ng; i++) {
        free(g[i].members);
    }
    free(g);
}

/* Describes one member relative to the waiting group's call `w` (NULL when
 * nobody waits); the description is what groups members into one line. */
static double idle_s(const model_t *m, const member_t *mb)
{
    const dshim_trace_rec_t *l = mb->last;
    if (l == NULL) {
        return 0;
    }
    return age_s(m, mb->dump, l->t_done_ns ? l->t_done_ns : l->t_queued_ns);
}

/* A process without a dump, from what the launcher knows of it (p may be
 * NULL); `seen` is appended ("" or " \xe2\x80\x94 the others wait ..."). */
static void describe_missing(const model_t *m, const dshim_trace_proc_t *p, const char *seen, char *out, size_t cap)
{
    if (p == NULL || p->state == DSHIM_TRACE_PROC_UNKNOWN) {
        snprintf(out, cap, "left no dump%s", seen);
    } else if (p->state == DSHIM_TRACE_PROC_KILLED) {
        const char *sn = sig_name(p->sig);
        snprintf(out, cap, "left no dump (it died: the launcher saw it killed by signal %d%s%s)%s", p->sig,
                 sn ? ", " : "", sn ? sn : "", seen);
    } else if (p->state == DSHIM_TRACE_PROC_EXITED) {
        snprintf(out, cap, "left no dump (it exited with code %d before it could write one)%s", p->code, seen);
    } else if (p->pstate == 'T' || p->pstate == 't') {
        snprintf(out, cap, "is alive but stopped (SIGSTOP or a debugger), so it wrote no dump%s", seen);
    } else if (p->asked) {
        char ws[32];
        fmt_secs(m->set->wait_s, ws, sizeof(ws));
        snprintf(out, cap, "is alive but did not answer the dump signal within %s (stopped, or stuck in a "
                 "system call)%s", ws, seen);
    } else {
        snprintf(out, cap, "is alive but was not asked for a dump (it does not catch the dump signal: "
                 "recorder off or dshim not loaded)%s", seen);
    }
}

/* with_time: the idle time is named (a line about one rank); without it the
 * text is the key that puts ranks on one line. */
static void describe(const model_t *m, const comm_t *c, int r, const dshim_trace_rec_t *w, int with_time, char *out,
                     size_t cap)
{
    const member_t *mb = &c->members[r];
    char a[64], b[320], args[320];
    if (mb->dump == NULL) {
        char seen[160] = "";
        if (w) {
            fmt_opseq(w, a, sizeof(a));
            snprintf(seen, sizeof(seen), " \xe2\x80\x94 the others wait for it in %s", a);
        }
        describe_missing(m, proc_of_rank(m->set, mb->world), seen, out, cap);
        return;
    }
    const dshim_trace_rec_t *pe = mb->pending;
    char last[128] = "";
    if (mb->last_done) {
        fmt_opseq(mb->last_done, a, sizeof(a));
        snprintf(last, sizeof(last), "last completed %s and ", a);
    }
    if (pe == NULL) {
        if (mb->last) {
            const dshim_trace_rec_t *l = mb->last;
            fmt_opseq(l, a, sizeof(a));
            if (with_time) {
                fmt_secs(idle_s(m, mb), b, sizeof(b));
                snprintf(out, cap, "has not called any collective for %s (last: %s %s)", b, a,
                         l->state == DSHIM_TRACE_DONE ? "done" : "failed");
            } else {
                snprintf(out, cap, "has not called any collective (last: %s %s)", a,
                         l->state == DSHIM_TRACE_DONE ? "done" : "failed");
            }
        } else {
            snprintf(out, cap, "has not called any operation in %s", comm_label(c));
        }
        return;
    }
    fmt_opseq(pe, a, sizeof(a));
    fmt_args(pe, 1, args, sizeof(args));
    char waitfor[200] = "";
    if (pe->nwaiting > 0 && (pe->state == DSHIM_TRACE_WAITING || pe->state == DSHIM_TRACE_FAILED)) {
        char names[160];
        name_ranks(c, pe->waiting_for, pe->nwaiting, names, sizeof(names));
        snprintf(waitfor, sizeof(waitfor), ", waiting for %s", names);
    }
    if (w && !is_p2p(pe->op) && pe->seq == w->seq && strcmp(pe->op, w->op) != 0) {
        snprintf(out, cap, "%sis now in %s%s: not the collective the others called", last, a, args);
    } else if (w && !is_p2p(pe->op) && pe->seq == w->seq) {
        /* the framework calls too, when they differ: they usually tell the bug
         * ("from DDP bucket 0" where the others have "from torch all_reduce") */
        char wargs[320];
        int labels = strcmp(pe->label, w->label) != 0;
        fmt_args(w, labels, wargs, sizeof(wargs));
        fmt_args(pe, labels, b, sizeof(b));
        /* (each call's arguments cut at 160 bytes: the line stays one line) */
        snprintf(out, cap, "is in %s too but with %.160s where the others have %.160s: the calls do not match", a,
                 unparen(b), unparen(wargs));
    } else {
        snprintf(out, cap, "%sis now in %s%s%s", last, a, args, waitfor);
    }
}

/* The key text of several ranks, in the plural, with the idle times as a range. */
static void plural(const model_t *m, const comm_t *c, const int *same, int n, const char *key, char *out, size_t cap)
{
    if (strncmp(key, "has not called any collective ", 30) == 0) {
        double lo = 0, hi = 0;
        for (int i = 0; i < n; i++) {
            double s = idle_s(m, &c->members[same[i]]);
            if (i == 0 || s < lo) {
                lo = s;
            }
            if (i == 0 || s > hi) {
                hi = s;
            }
        }
        char a[32], b[32];
        fmt_secs(lo, a, sizeof(a));
        fmt_secs(hi, b, sizeof(b));
        if (strcmp(a, b) == 0) {
            snprintf(out, cap, "have not called any collective for %s %s", a, key + 30);
        } else {
            snprintf(out, cap, "have not called any collective for %s to %s %s", a, b, key + 30);
        }
        return;
    }
    const char *and_is = strstr(key, " and is now in ");
    const char *it = strstr(key, "(it ");
    if (it) {
        snprintf(out, cap, "%.*s(they %s", (int)(it - key), key, it + 4);
    } else if (and_is) {
        snprintf(out, cap, "%.*s and are now in %s", (int)(and_is - key), key, and_is + 15);
    } else if (strncmp(key, "is ", 3) == 0) {
        snprintf(out, cap, "are %s", key + 3);
    } else if (strncmp(key, "has ", 4) == 0) {
        snprintf(out, cap, "have %s", key + 4);
    } else {
        snprintf(out, cap, "%s", key);
    }
}

static int is_failure_reason(const char *r);

/* One communicator's lines.  Returns 1 when it said something. */
static int diagnose_comm(const model_t *m, comm_t *c, const char *prefix, text_t *t)
{
    group_t *g = NULL;
    int ng = group_members(c, &g);
    int missing = 0, p2p = 0;
    for (int r = 0; r < c->size; r++) {
        missing += c->members[r].dump == NULL;
        p2p += c->members[r].pending != NULL && is_p2p(c->members[r].pending->op);
    }
    if (ng == 0 && missing == 0 && p2p == 0) {
        free_groups(g, ng);
        return 0;  /* every rank idle: nothing stuck here */
    }
    /* who waits: the largest group; ties to the lower seq, then the lower rank */
    int main = -1;
    for (int k = 0; k < ng; k++) {
        if (main < 0 || g[k].n > g[main].n || (g[k].n == g[main].n && g[k].e->seq < g[main].e->seq)) {
            main = k;
        }
    }
    const dshim_trace_rec_t *w = main >= 0 ? g[main].e : NULL;
    char *culprit = calloc((size_t)c->size, 1);
    if (culprit == NULL) {
        free_groups(g, ng);
        return 0;
    }
    if (main >= 0) {
        group_t *mg = &g[main];
        /* for whom: what their entries name, else everyone not with them */
        int *forr = calloc((size_t)c->size, sizeof(int));
        int nfor = 0;
        uint64_t since = 0;
        const dshim_trace_dump_t *since_d = NULL;
        int failed = 0;
        uint64_t gave_up = 0;
        for (int i = 0; forr && i < mg->n; i++) {
            const member_t *mb = &c->members[mg->members[i]];
            for (int k = 0; k < mb->pending->nwaiting; k++) {
                int wr = mb->pending->waiting_for[k];
                if (wr >= 0 && wr < c->size && c->members[wr].group != main && !culprit[wr]) {
                    culprit[wr] = 1;
                    forr[nfor++] = wr;
                }
            }
            uint64_t st = mb->pending->t_started_ns ? mb->pending->t_started_ns : mb->pending->t_queued_ns;
            uint64_t stw = to_wall(mb->dump, st);
            if (st && (since == 0 || stw < since)) {
                since = stw;
                since_d = mb->dump;
            }
            /* a rank that dumped because its op failed gave up at its dump */
            if (mb->pending->state == DSHIM_TRACE_FAILED || is_failure_reason(mb->dump->reason)) {
                failed++;
                if (mb->dump->realtime_ns > gave_up) {
                    gave_up = mb->dump->realtime_ns;
                }
            }
        }
        /* nobody named: they wait for everyone not with them */
        int named = nfor;
        for (int r = 0; forr && r < c->size; r++) {
            if (c->members[r].group != main && !culprit[r]) {
                culprit[r] = 2;
                if (named == 0) {
                    forr[nfor++] = r;
                }
            }
        }
        int all = mg->n == c->size;
        if (all && forr) {
            /* they are all in it together: whom their entries wait for */
            for (int i = 0; i < mg->n; i++) {
                const dshim_trace_rec_t *pe = c->members[mg->members[i]].pending;
                for (int k = 0; k < pe->nwaiting && nfor < c->size; k++) {
                    int wr = pe->waiting_for[k];
                    int dup = 0;
                    for (int q = 0; q < nfor; q++) {
                        dup |= forr[q] == wr;
                    }
                    if (!dup) {
                        forr[nfor++] = wr;
                    }
                }
            }
        }
        char a[64], args[320], names[256], fornames[256] = "", sincebuf[64] = "";
        fmt_opseq(w, a, sizeof(a));
        fmt_args(w, 1, args, sizeof(args));
        name_ranks(c, mg->members, mg->n, names, sizeof(names));
        if (forr && nfor > 0) {
            name_ranks(c, forr, nfor, fornames, sizeof(fornames));
        }
        if (since_d) {
            char s[32];
            uint64_t end = failed == mg->n ? gave_up : m->now;
            fmt_secs(end > since ? (double)(end - since) / 1e9 : 0, s, sizeof(s));
            snprintf(sincebuf, sizeof(sincebuf), " (%s %s)", failed == mg->n ? "gave up after" : "for", s);
        }
        if (all) {
            tx_add(t, "%s%s %s in %s%s%s%s%s\n", prefix, names, mg->n == 1 ? "is" : "are all", a, args, sincebuf,
                   fornames[0] ? ", waiting for " : "", fornames);
        } else {
            tx_add(t, "%s%s %s in %s%s for %s%s\n", prefix, names, mg->n == 1 ? "waits" : "wait", a, args,
                   fornames[0] ? fornames : "the others", sincebuf);
        }
        t->lines++;
        free(forr);
    } else {
        for (int r = 0; r < c->size; r++) {
            culprit[r] = 2;
        }
    }
    /* everyone else; those with the same description on one line */
    enum { DL = 640 };
    char *descs = malloc((size_t)c->size * DL);
    char *done = calloc((size_t)c->size, 1);
    int *same = calloc((size_t)c->size, sizeof(int));
    for (int r = 0; descs && r < c->size; r++) {
        if (culprit[r]) {
            describe(m, c, r, w, 0, descs + (size_t)r * DL, DL);
        }
    }
    for (int r = 0; descs && done && same && r < c->size; r++) {
        if (!culprit[r] || done[r]) {
            continue;
        }
        const char *key = descs + (size_t)r * DL;
        int n = 0;
        for (int q = r; q < c->size; q++) {
            if (culprit[q] && !done[q] && strcmp(key, descs + (size_t)q * DL) == 0) {
                same[n++] = q;
                done[q] = 1;
            }
        }
        if (main < 0 && c->members[r].pending == NULL && c->members[r].dump != NULL && missing == 0) {
            continue;  /* no one waits: an idle rank is no news */
        }
        char names[512], text[DL + 64];
        if (n == 1) {
            who(m, c, r, names, sizeof(names));
            describe(m, c, r, w, 1, text, sizeof(text));
        } else {
            name_ranks(c, same, n, names, sizeof(names));
            plural(m, c, same, n, key, text, sizeof(text));
        }
        tx_add(t, "%s%s %s\n", prefix, names, text);
        t->lines++;
    }
    free(descs);
    free(done);
    free(same);
    free(culprit);
    free_groups(g, ng);
    return 1;
}

static int is_failure_reason(const char *r)
{
    return strcmp(r, "timeout") == 0 || strcmp(r, "peer") == 0 || strcmp(r, "mismatch") == 0 ||
           strcmp(r, "abort") == 0 || strcmp(r, "failed") == 0 || strcmp(r, "crash") == 0;
}

/* Most important first: the communicators where someone waits, larger first. */
static int comm_weight(const comm_t *c)
{
    int pending = 0, missing = 0;
    for (int r = 0; r < c->size; r++) {
        pending += c->members[r].pending != NULL;
        missing += c->members[r].dump == NULL;
    }
    return (pending > 0 ? 1 << 24 : 0) + (c->world_sized ? 1 << 23 : 0) + c->size * 2 + (missing > 0);
}

/* ---- MXNet: dshim's parameter server ("ps/" rings) ------------------------ */

/* A scheduler, server or worker of an MXNet job: its dump and ring (NULL when
 * no dump has it) and what the launcher knows of it ("server 1", "worker 0",
 * "scheduler" in launcher.jsonl; NULL when unknown). */
typedef struct {
    const dshim_trace_dump_t *dump;
    const dshim_trace_dring_t *ring;
    const dshim_trace_proc_t *proc;
    int said;  /* already named on a line */
} ps_node_t;

typedef struct {
    ps_node_t *servers, *workers, sched;
    int ns, nw;
    int any;   /* some dump has a "ps/" ring */
} ps_model_t;

/* "ps/server.12" with prefix "ps/server." -> 12; -1 unless a number below bound follows */
static int ps_index(const char *name, const char *prefix, int bound)
{
    size_t n = strlen(prefix);
    if (strncmp(name, prefix, n) != 0 || name[n] < '0' || name[n] > '9') {
        return -1;
    }
    long v = 0;
    const char *q = name + n;
    for (; *q >= '0' && *q <= '9'; q++) {
        v = v * 10 + (*q - '0');
        if (v >= bound) {
            return -1;
        }
    }
    return *q == '\0' ? (int)v : -1;
}

/* The number before `word` in a ring's desc ("MXNet server 1 of 2 (3 workers)"
 * and " workers)" -> 3); -1 when absent. */
static int desc_count(const char *desc, const char *word)
{
    const char *w = strstr(desc, word);
    if (w == NULL) {
        return -1;
    }
    const char *q = w;
    while (q > desc && q[-1] >= '0' && q[-1] <= '9' && w - q < 9) {
        q--;
    }
    return q == w ? -1 : atoi(q);
}

/* The key of a label "MXNet pushpull key -3 (rows)"; 0 when it names none. */
static int label_key(const char *label, int *key)
{
    const char *k = strstr(label, "key ");
    if (k == NULL) {
        return 0;
    }
    k += 4;
    int neg = *k == '-';
    k += neg;
    if (*k < '0' || *k > '9') {
        return 0;
    }
    long v = 0;
    for (; *k >= '0' && *k <= '9' && v < 1000000000L; k++) {
        v = v * 10 + (*k - '0');
    }
    *key = (int)(neg ? -v : v);
    return 1;
}

static int ps_push_entry(const dshim_trace_rec_t *e)
{
    return strcmp(e->op, "push") == 0 && strstr(e->label, "MXNet init ") == NULL;
}

static const dshim_trace_proc_t *ps_proc_named(const dshim_trace_set_t *s, const char *name)
{
    for (size_t i = 0; i < s->nprocs; i++) {
        if (s->procs[i].rank < 0 && strcmp(s->procs[i].name, name) == 0) {
            return &s->procs[i];
        }
    }
    return NULL;
}

static const dshim_trace_proc_t *ps_proc_of_dump(const dshim_trace_set_t *s, const dshim_trace_dump_t *d)
{
    for (size_t i = 0; d->pid > 0 && i < s->nprocs; i++) {
        if (s->procs[i].pid == d->pid && (!s->procs[i].host[0] || !d->host[0] || strcmp(s->procs[i].host, d->host) == 0)) {
            return &s->procs[i];
        }
    }
    return NULL;
}

static void ps_free(ps_model_t *p)
{
    free(p->servers);
    free(p->workers);
    memset(p, 0, sizeof(*p));
}

static int imax(int a, int b)
{
    return a > b ? a : b;
}

/* The nodes: from the rings' names, their sizes and descs, the entries'
 * ranks and the launcher's process names, each count bounded as the
 * communicators' members are. */
static void ps_build(const model_t *m, ps_model_t *p)
{
    const dshim_trace_set_t *set = m->set;
    memset(p, 0, sizeof(*p));
    int bound = 4096;
    if ((size_t)bound < 2 * set->n + set->nprocs) {
        bound = (int)(2 * set->n + set->nprocs);
    }
    int ns = 0, nw = 0;
    for (size_t i = 0; i < set->n; i++) {
        const dshim_trace_dump_t *d = &set->dumps[i];
        for (size_t k = 0; k < d->nrings; k++) {
            const dshim_trace_dring_t *r = &d->rings[k];
            if (!is_ps_ring(r->name)) {
                continue;
            }
            p->any = 1;
            int s = ps_index(r->name, "ps/server.", bound), w = ps_index(r->name, "ps/worker.", bound);
            if (s >= 0) {
                ns = imax(ns, imax(s + 1, r->size));
                nw = imax(nw, desc_count(r->desc, " workers)"));
                for (size_t j = 0; j < r->n; j++) {
                    for (int q = 0; q < r->recs[j].nwaiting; q++) {
                        int x = r->recs[j].waiting_for[q];
                        nw = x >= 0 && x < bound ? imax(nw, x + 1) : nw;
                    }
                }
            } else if (w >= 0) {
                nw = imax(nw, imax(w + 1, r->size));
                ns = imax(ns, desc_count(r->desc, " servers)"));
                for (size_t j = 0; j < r->n; j++) {
                    int x = r->recs[j].peer;
                    ns = x >= 0 && x < bound ? imax(ns, x + 1) : ns;
                }
            } else if (strcmp(r->name, "ps/scheduler") == 0) {
                nw = imax(nw, desc_count(r->desc, " workers,"));
                ns = imax(ns, desc_count(r->desc, " servers)"));
            }
        }
    }
    if (!p->any) {
        return;
    }
    for (size_t i = 0; i < set->nprocs; i++) {
        if (set->procs[i].rank < 0) {
            ns = imax(ns, ps_index(set->procs[i].name, "server ", bound) + 1);
            nw = imax(nw, ps_index(set->procs[i].name, "worker ", bound) + 1);
        }
    }
    ns = ns < bound ? ns : bound;
    nw = nw < bound ? nw : bound;
    p->servers = calloc((size_t)(ns > 0 ? ns : 1), sizeof(ps_node_t));
    p->workers = calloc((size_t)(nw > 0 ? nw : 1), sizeof(ps_node_t));
    if (p->servers == NULL || p->workers == NULL) {
        ps_free(p);
        return;
    }
    p->ns = ns;
    p->nw = nw;
    p->any = 1;
    for (size_t i = 0; i < set->n; i++) {
        const dshim_trace_dump_t *d = &set->dumps[i];
        for (size_t k = 0; k < d->nrings; k++) {
            const dshim_trace_dring_t *r = &d->rings[k];
            int s = ps_index(r->name, "ps/server.", ns), w = ps_index(r->name, "ps/worker.", nw);
            ps_node_t *n = s >= 0 ? &p->servers[s] : w >= 0 ? &p->workers[w] :
                           strcmp(r->name, "ps/scheduler") == 0 ? &p->sched : NULL;
            if (n != NULL && n->ring == NULL) {  /* two processes claim one node: keep the first */
                n->dump = d;
                n->ring = r;
                n->proc = ps_proc_of_dump(set, d);
            }
        }
    }
    /* the launcher's processes: a node without a ring is found by its name,
     * and its dump (one without that ring) by its pid */
    char name[48];
    for (int i = 0; i < ns + nw + 1; i++) {
        ps_node_t *n = i < ns ? &p->servers[i] : i < ns + nw ? &p->workers[i - ns] : &p->sched;
        if (n->proc != NULL) {
            continue;
        }
        if (i < ns + nw) {
            snprintf(name, sizeof(name), "%s %d", i < ns ? "server" : "worker", i < ns ? i : i - ns);
        } else {
            snprintf(name, sizeof(name), "scheduler");
        }
        n->proc = ps_proc_named(set, name);
        for (size_t j = 0; n->dump == NULL && n->proc != NULL && n->proc->pid > 0 && j < set->n; j++) {
            if (set->dumps[j].pid == n->proc->pid) {
                n->dump = &set->dumps[j];
            }
        }
    }
}

/* "server 1 (host b, pid 812)" */
static void ps_who(const ps_node_t *n, const char *role, int idx, char *out, size_t cap)
{
    const char *host = n->dump && n->dump->host[0] ? n->dump->host : n->proc && n->proc->host[0] ? n->proc->host : NULL;
    long pid = n->dump ? n->dump->pid : n->proc ? n->proc->pid : 0;
    char name[48];
    if (idx >= 0) {
        snprintf(name, sizeof(name), "%s %d", role, idx);
    } else {
        snprintf(name, sizeof(name), "%s", role);
    }
    if (host && pid > 0) {
        snprintf(out, cap, "%s (host %s, pid %ld)", name, host, pid);
    } else if (host) {
        snprintf(out, cap, "%s (host %s)", name, host);
    } else if (pid > 0) {
        snprintf(out, cap, "%s (pid %ld)", name, pid);
    } else {
        snprintf(out, cap, "%s", name);
    }
}

/* "worker 1" / "workers 0,2-5" */
static void ps_list(const char *role, const int *v, int n, char *out, size_t cap)
{
    char l[128];
    dshim_trace_ranges(v, (size_t)n, l, sizeof(l));
    snprintf(out, cap, "%s%s %s", role, n == 1 ? "" : "s", l);
}

/* A worker's request: "pushpull key 2 round 4 to server 0", "pull key 1
 * after round 3 from server 1", "barrier (workers) #7", "command 3" */
static void ps_req(const dshim_trace_rec_t *e, int with_peer, char *out, size_t cap)
{
    const char *l = e->label[0] ? e->label : e->op;
    if (strncmp(l, "MXNet ", 6) == 0) {
        l += 6;
    }
    char seq[48] = "", peer[48] = "";
    int pull = strcmp(e->op, "pull") == 0;
    if (e->seq != DSHIM_TRACE_SEQ_NONE) {
        if (strcmp(e->op, "barrier") == 0) {
            snprintf(seq, sizeof(seq), " #%llu", (unsigned long long)e->seq);
        } else if (pull) {
            snprintf(seq, sizeof(seq), " after round %llu", (unsigned long long)e->seq);
        } else if (ps_push_entry(e)) {
            snprintf(seq, sizeof(seq), " round %llu", (unsigned long long)e->seq);
        }
    }
    if (with_peer && e->peer >= 0) {
        snprintf(peer, sizeof(peer), " %s server %d", pull ? "from" : "to", e->peer);
    }
    snprintf(out, cap, "%s%s%s", l, seq, peer);
}

static int ps_open(const dshim_trace_rec_t *e)
{
    return e->state == DSHIM_TRACE_QUEUED || e->state == DSHIM_TRACE_STARTED || e->state == DSHIM_TRACE_WAITING;
}

/* One line about worker w: what it last pushed to `server` (when >= 0) and
 * what it does now; `key`/`has_key`: the key a server waits for from it
 * (a worker in a barrier skipped it); `context`: why it is named, said
 * when it left no dump. */
static void ps_worker_line(const model_t *m, ps_model_t *p, int w, int server, int key, int has_key,
                           const char *context, text_t *t)
{
    ps_node_t *n = &p->workers[w];
    n->said = 1;
    char who_s[200], text[900];
    ps_who(n, "worker", w, who_s, sizeof(who_s));
    if (n->ring == NULL) {
        char seen[300];
        snprintf(seen, sizeof(seen), " \xe2\x80\x94 %s", context);
        if (n->dump == NULL) {
            describe_missing(m, n->proc, seen, text, sizeof(text));
        } else {
            snprintf(text, sizeof(text), "has no ring ps/worker.%d in its dump%s", w, seen);
        }
        tx_add(t, "%s %s\n", who_s, text);
        t->lines++;
        return;
    }
    const dshim_trace_dring_t *r = n->ring;
    const dshim_trace_rec_t *pushed = NULL, *pending = NULL, *last = NULL;
    int npending = 0;
    for (size_t i = 0; i < r->n; i++) {
        const dshim_trace_rec_t *e = &r->recs[i];
        if (e->state < 0) {
            continue;
        }
        last = e;
        if (server >= 0 && e->state == DSHIM_TRACE_DONE && ps_push_entry(e) && e->peer == server) {
            pushed = e;
        }
        if (ps_open(e)) {
            pending = pending ? pending : e;
            npending++;
        }
    }
    size_t len = 0;
    char s[32], rq[160];
    text[0] = '\0';
    if (server >= 0) {
        int k = 0;
        if (pushed && label_key(pushed->label, &k)) {
            fmt_secs(age_s(m, n->dump, pushed->t_started_ns ? pushed->t_started_ns : pushed->t_queued_ns), s,
                     sizeof(s));
            len += (size_t)snprintf(text + len, sizeof(text) - len, "last pushed key %d round %llu to server %d %s ago",
                                    k, (unsigned long long)pushed->seq, server, s);
        } else {
            len += (size_t)snprintf(text + len, sizeof(text) - len, "has pushed nothing to server %d", server);
        }
    }
    const char *lead = server >= 0 ? "; it " : "";
    if (pending && len < sizeof(text)) {
        ps_req(pending, 1, rq, sizeof(rq));
        fmt_secs(age_s(m, n->dump, pending->t_started_ns ? pending->t_started_ns : pending->t_queued_ns), s,
                 sizeof(s));
        int barrier = strcmp(pending->op, "barrier") == 0;
        len += (size_t)snprintf(text + len, sizeof(text) - len, "%sis now in %s%s%s", lead, rq,
                                pending->state == DSHIM_TRACE_WAITING && pending->peer >= 0 ? ", unanswered" : "",
                                barrier || pending->state == DSHIM_TRACE_WAITING ? " for " : "");
        if (barrier || pending->state == DSHIM_TRACE_WAITING) {
            len += (size_t)snprintf(text + len, sizeof(text) - len, "%s", s);
        }
        if (barrier && has_key && len < sizeof(text)) {
            len += (size_t)snprintf(text + len, sizeof(text) - len, ": it skipped key %d", key);
        }
        if (npending > 1 && len < sizeof(text)) {
            len += (size_t)snprintf(text + len, sizeof(text) - len, " (%d more requests outstanding)", npending - 1);
        }
    } else if (last && last == pushed && len < sizeof(text)) {
        len += (size_t)snprintf(text + len, sizeof(text) - len, ", and no request since");
    } else if (last && len < sizeof(text)) {
        ps_req(last, 1, rq, sizeof(rq));
        uint64_t te = last->t_done_ns ? last->t_done_ns : last->t_queued_ns;
        fmt_secs(age_s(m, n->dump, te), s, sizeof(s));
        len += (size_t)snprintf(text + len, sizeof(text) - len, "%shas made no request since its %s, which %s %s ago",
                                lead, rq, last->state == DSHIM_TRACE_FAILED ? "failed" : "ended", s);
    } else if (len < sizeof(text)) {
        len += (size_t)snprintf(text + len, sizeof(text) - len, "%shas recorded no request", lead);
    }
    tx_add(t, "%s %s\n", who_s, text);
    t->lines++;
}

/* The scheduler's barriers that wait: "the scheduler's barrier #5
 * (workers) waits for worker 1 (arrived: worker 0) for 2.0 s" and the
 * missing workers. */
static void ps_scheduler(const model_t *m, ps_model_t *p, text_t *t)
{
    const ps_node_t *sc = &p->sched;
    if (sc->ring == NULL) {
        return;
    }
    for (size_t i = 0; i < sc->ring->n; i++) {
        const dshim_trace_rec_t *e = &sc->ring->recs[i];
        if (e->state != DSHIM_TRACE_WAITING || strcmp(e->op, "barrier") != 0) {
            continue;
        }
        /* the ranks are the missing workers', else (no worker missing) the servers' */
        int servers = strstr(e->label, "(servers)") != NULL;
        if (!servers && strstr(e->label, "(all)") != NULL && e->nwaiting > 0) {
            /* every listed worker is in a barrier of all: they are servers */
            servers = 1;
            for (int k = 0; k < e->nwaiting && servers; k++) {
                int w = e->waiting_for[k];
                const ps_node_t *wn = w >= 0 && w < p->nw ? &p->workers[w] : NULL;
                int in = 0;
                for (size_t j = 0; wn && wn->ring && j < wn->ring->n; j++) {
                    const dshim_trace_rec_t *x = &wn->ring->recs[j];
                    in |= ps_open(x) && strcmp(x->op, "barrier") == 0 && strstr(x->label, "(all)") != NULL;
                }
                servers = in;
            }
        }
        const char *role = servers ? "server" : "worker";
        int total = servers ? p->ns : p->nw;
        char missing[256], arrived[256] = "", s[32], group[48] = "";
        ps_list(role, e->waiting_for, e->nwaiting, missing, sizeof(missing));
        if (e->nwaiting > 0 && e->nwaiting < DSHIM_TRACE_WAIT_MAX && total > 0 && total < 4096) {
            int *a = calloc((size_t)total, sizeof(int));
            int na = 0;
            for (int r = 0; a && r < total; r++) {
                int in = 0;
                for (int k = 0; k < e->nwaiting; k++) {
                    in |= e->waiting_for[k] == r;
                }
                if (!in) {
                    a[na++] = r;
                }
            }
            char l[200] = "";
            if (na > 0) {
                ps_list(role, a, na, l, sizeof(l));
            }
            snprintf(arrived, sizeof(arrived), " (arrived: %s)", na > 0 ? l : "none");
            free(a);
        }
        const char *g = strchr(e->label, '(');
        if (g) {
            snprintf(group, sizeof(group), " %.40s", g);
        }
        fmt_secs(age_s(m, sc->dump, e->t_started_ns ? e->t_started_ns : e->t_queued_ns), s, sizeof(s));
        tx_add(t, "the scheduler's barrier #%llu%s waits for %s%s for %s\n", (unsigned long long)e->seq, group,
               e->nwaiting > 0 ? missing : "someone", arrived, s);
        t->lines++;
        char ctx[160];
        snprintf(ctx, sizeof(ctx), "the scheduler's barrier #%llu waits for it", (unsigned long long)e->seq);
        for (int k = 0; k < e->nwaiting; k++) {
            int x = e->waiting_for[k];
            if (!servers && x >= 0 && x < p->nw && !p->workers[x].said) {
                ps_worker_line(m, p, x, -1, 0, 0, ctx, t);
            } else if (servers && x >= 0 && x < p->ns && !p->servers[x].said && p->servers[x].dump == NULL) {
                char who_s[200], d[600], seen[200];
                p->servers[x].said = 1;
                ps_who(&p->servers[x], "server", x, who_s, sizeof(who_s));
                snprintf(seen, sizeof(seen), " \xe2\x80\x94 %s", ctx);
                describe_missing(m, p->servers[x].proc, seen, d, sizeof(d));
                tx_add(t, "%s %s\n", who_s, d);
                t->lines++;
            }
        }
    }
}

/* Workers whose requests to a server go unanswered while that server waits
 * for no worker: the server is the one that is stuck (or gone). */
static void ps_unanswered(const model_t *m, ps_model_t *p, text_t *t)
{
    int *ws = calloc((size_t)(p->nw > 0 ? p->nw : 1), sizeof(int));
    for (int s = 0; ws && s < p->ns; s++) {
        ps_node_t *sv = &p->servers[s];
        int srv_waits = 0;
        for (size_t i = 0; sv->ring && i < sv->ring->n; i++) {
            srv_waits |= sv->ring->recs[i].state == DSHIM_TRACE_WAITING;
        }
        if (srv_waits) {
            continue;  /* its own line says for whom */
        }
        const dshim_trace_rec_t *oldest = NULL;
        const dshim_trace_dump_t *od = NULL;
        int nws = 0;
        for (int w = 0; w < p->nw; w++) {
            const ps_node_t *wn = &p->workers[w];
            const dshim_trace_rec_t *mine = NULL;
            for (size_t i = 0; wn->ring && i < wn->ring->n && mine == NULL; i++) {
                const dshim_trace_rec_t *e = &wn->ring->recs[i];
                int waits = e->state == DSHIM_TRACE_WAITING || (e->state == DSHIM_TRACE_FAILED && e->nwaiting > 0);
                if (waits && e->peer == s) {
                    mine = e;
                }
            }
            if (mine) {
                ws[nws++] = w;
                if (oldest == NULL || to_wall(wn->dump, mine->t_queued_ns) < to_wall(od, oldest->t_queued_ns)) {
                    oldest = mine;
                    od = wn->dump;
                }
            }
        }
        if (nws == 0) {
            continue;
        }
        int key = 0, has_key = label_key(oldest->label, &key);
        char names[256], rq[160], what[900], s1[32];
        ps_list("worker", ws, nws, names, sizeof(names));
        ps_req(oldest, 0, rq, sizeof(rq));
        if (sv->ring == NULL) {
            char who_s[200], d[600];
            sv->said = 1;
            ps_who(sv, "server", s, who_s, sizeof(who_s));
            if (sv->dump == NULL) {
                describe_missing(m, sv->proc, "", d, sizeof(d));
            } else {
                snprintf(d, sizeof(d), "has no ring ps/server.%d in its dump", s);
            }
            snprintf(what, sizeof(what), "; %s %s", who_s, d);
        } else {
            /* an open round of that key (not yet long enough to be "waiting"): nothing to say */
            const dshim_trace_rec_t *lastk = NULL;
            int open = 0;
            for (size_t i = 0; has_key && i < sv->ring->n; i++) {
                const dshim_trace_rec_t *e = &sv->ring->recs[i];
                int k2 = 0;
                if (strcmp(e->op, "push") == 0 && label_key(e->label, &k2) && k2 == key) {
                    open |= ps_open(e);
                    if (e->state == DSHIM_TRACE_DONE) {
                        lastk = e;
                    }
                }
            }
            if (open) {
                continue;
            }
            if (lastk) {
                fmt_secs(age_s(m, sv->dump, lastk->t_done_ns), s1, sizeof(s1));
                snprintf(what, sizeof(what), ", which has no open round: its last round of key %d, round %llu, "
                         "ended %s ago", key, (unsigned long long)lastk->seq, s1);
            } else if (has_key) {
                snprintf(what, sizeof(what), ", which has no open round: it has no round of key %d in its ring", key);
            } else {
                snprintf(what, sizeof(what), ", which has no open round and waits for no worker");
            }
        }
        fmt_secs(age_s(m, od, oldest->t_started_ns ? oldest->t_started_ns : oldest->t_queued_ns), s1, sizeof(s1));
        tx_add(t, "%s %s for server %d (%s, for %s)%s\n", names, nws == 1 ? "waits" : "wait", s, rq, s1, what);
        t->lines++;
    }
    free(ws);
}

/* The MXNet lines: servers that wait for a push and the workers that have
 * not pushed, the scheduler's waiting barriers, workers waiting for a server
 * that waits for nobody, then the job's other processes that left no dump.
 * Returns the number of lines. */
static int ps_diagnose(const model_t *m, ps_model_t *p, text_t *t)
{
    if (!p->any) {
        return 0;
    }
    int before = t->lines;
    /* who a server waits for, to be described after the servers */
    typedef struct {
        int worker, server, key, has_key;
        unsigned long long round;
    } owed_t;
    owed_t *owed = calloc((size_t)(p->nw > 0 ? p->nw : 1), sizeof(*owed));
    int nowed = 0;
    for (int s = 0; s < p->ns; s++) {
        ps_node_t *sv = &p->servers[s];
        const dshim_trace_rec_t *e = NULL;
        int nwait = 0;
        for (size_t i = 0; sv->ring && i < sv->ring->n; i++) {
            const dshim_trace_rec_t *x = &sv->ring->recs[i];
            if (x->state == DSHIM_TRACE_WAITING && strcmp(x->op, "push") == 0) {
                nwait++;
                if (e == NULL || x->t_started_ns < e->t_started_ns) {
                    e = x;
                }
            }
        }
        if (e == NULL) {
            continue;
        }
        sv->said = 1;
        int key = 0, has_key = label_key(e->label, &key);
        char who_s[200], what[96], from[300], by[300] = "", more[64] = "", s1[32];
        ps_who(sv, "server", s, who_s, sizeof(who_s));
        if (has_key) {
            snprintf(what, sizeof(what), "key %d round %llu", key, (unsigned long long)e->seq);
        } else {
            snprintf(what, sizeof(what), "%s round %llu", e->label, (unsigned long long)e->seq);
        }
        if (e->nwaiting > 0) {
            char l[240];
            ps_list("worker", e->waiting_for, e->nwaiting, l, sizeof(l));
            snprintf(from, sizeof(from), " from %s%s", l,
                     e->nwaiting == DSHIM_TRACE_WAIT_MAX && p->nw > DSHIM_TRACE_WAIT_MAX ? " and maybe more" : "");
        } else {
            snprintf(from, sizeof(from), " from a worker (the dump does not say which)");
        }
        if (e->nwaiting > 0 && (e->nwaiting < DSHIM_TRACE_WAIT_MAX || p->nw <= DSHIM_TRACE_WAIT_MAX)) {
            int *pb = calloc((size_t)(p->nw > 0 ? p->nw : 1), sizeof(int));
            int npb = 0;
            for (int w = 0; pb && w < p->nw; w++) {
                int in = 0;
                for (int k = 0; k < e->nwaiting; k++) {
                    in |= e->waiting_for[k] == w;
                }
                if (!in) {
                    pb[npb++] = w;
                }
            }
            char l[240] = "no worker";
            if (npb > 0) {
                ps_list("worker", pb, npb, l, sizeof(l));
            }
            snprintf(by, sizeof(by), " (pushed by %s)", l);
            free(pb);
        }
        if (nwait > 1) {
            snprintf(more, sizeof(more), "; %d more key%s wait%s too", nwait - 1, nwait > 2 ? "s" : "",
                     nwait > 2 ? "" : "s");
        }
        fmt_secs(age_s(m, sv->dump, e->t_started_ns ? e->t_started_ns : e->t_queued_ns), s1, sizeof(s1));
        tx_add(t, "%s waits for %s%s%s for %s%s\n", who_s, what, from, by, s1, more);
        t->lines++;
        for (int k = 0; owed && k < e->nwaiting; k++) {
            int w = e->waiting_for[k], dup = 0;
            for (int j = 0; j < nowed; j++) {
                dup |= owed[j].worker == w;
            }
            if (w >= 0 && w < p->nw && !dup && nowed < p->nw) {
                owed[nowed++] = (owed_t){w, s, key, has_key, (unsigned long long)e->seq};
            }
        }
    }
    for (int i = 0; owed && i < nowed; i++) {
        char ctx[160], what[64];
        if (owed[i].has_key) {
            snprintf(what, sizeof(what), "key %d round %llu", owed[i].key, owed[i].round);
        } else {
            snprintf(what, sizeof(what), "round %llu", owed[i].round);
        }
        snprintf(ctx, sizeof(ctx), "server %d waits for its push of %s", owed[i].server, what);
        ps_worker_line(m, p, owed[i].worker, owed[i].server, owed[i].key, owed[i].has_key, ctx, t);
    }
    free(owed);
    ps_scheduler(m, p, t);
    ps_unanswered(m, p, t);
    /* the job's other MXNet processes without a dump */
    for (int i = 0; i < p->ns + p->nw + 1; i++) {
        ps_node_t *n = i < p->ns ? &p->servers[i] : i < p->ns + p->nw ? &p->workers[i - p->ns] : &p->sched;
        if (n->said || n->dump != NULL || n->proc == NULL) {
            continue;
        }
        char who_s[200], d[600];
        n->said = 1;
        ps_who(n, i < p->ns ? "server" : i < p->ns + p->nw ? "worker" : "scheduler",
               i < p->ns ? i : i < p->ns + p->nw ? i - p->ns : -1, who_s, sizeof(who_s));
        describe_missing(m, n->proc, "", d, sizeof(d));
        tx_add(t, "%s %s\n", who_s, d);
        t->lines++;
    }
    return t->lines - before;
}

/* When nobody waits: the newest completed round of any server. */
static void ps_idle(const model_t *m, const ps_model_t *p, text_t *t)
{
    const dshim_trace_rec_t *newest = NULL;
    const dshim_trace_dump_t *nd = NULL;
    int srv = -1, dumped = 0;
    for (int i = 0; i < p->ns + p->nw + 1; i++) {
        const ps_node_t *n = i < p->ns ? &p->servers[i] : i < p->ns + p->nw ? &p->workers[i - p->ns] : &p->sched;
        dumped += n->ring != NULL;
    }
    for (int s = 0; s < p->ns; s++) {
        const ps_node_t *sv = &p->servers[s];
        for (size_t i = 0; sv->ring && i < sv->ring->n; i++) {
            const dshim_trace_rec_t *e = &sv->ring->recs[i];
            if (e->state == DSHIM_TRACE_DONE && ps_push_entry(e) &&
                (newest == NULL || to_wall(sv->dump, e->t_done_ns) > to_wall(nd, newest->t_done_ns))) {
                newest = e;
                nd = sv->dump;
                srv = s;
            }
        }
    }
    tx_add(t, "MXNet parameter server: nobody waits (%d of its %d processes dumped)", dumped, p->ns + p->nw + 1);
    int key = 0;
    if (newest && label_key(newest->label, &key)) {
        char s[32];
        fmt_secs(age_s(m, nd, newest->t_done_ns), s, sizeof(s));
        tx_add(t, "; the last round, key %d round %llu on server %d, ended %s ago", key,
               (unsigned long long)newest->seq, srv, s);
    }
    tx_add(t, "\n");
    t->lines++;
}

/* "server 1", "worker 0", "the scheduler" for a dump of an MXNet process,
 * else "rank 3" */
static void dump_who(const dshim_trace_set_t *set, const dshim_trace_dump_t *d, char *out, size_t cap)
{
    for (size_t k = 0; k < d->nrings; k++) {
        const char *n = d->rings[k].name;
        if (strncmp(n, "ps/server.", 10) == 0) {
            snprintf(out, cap, "server %.12s", n + 10);
            return;
        }
        if (strncmp(n, "ps/worker.", 10) == 0) {
            snprintf(out, cap, "worker %.12s", n + 10);
            return;
        }
        if (strcmp(n, "ps/scheduler") == 0) {
            snprintf(out, cap, "the scheduler");
            return;
        }
    }
    const dshim_trace_proc_t *p = ps_proc_of_dump(set, d);
    if (p && p->rank < 0 && p->name[0]) {
        snprintf(out, cap, "%.40s", p->name);
    } else {
        snprintf(out, cap, "rank %d", d->rank);
    }
}

char *dshim_trace_diagnose(const dshim_trace_set_t *set, int max_lines, uint64_t now_realtime_ns)
{
    text_t t = {0};
    model_t m;
    model_build(&m, set, now_realtime_ns);
    if (set->n == 0) {
        if (set->nprocs > 0) {
            tx_add(&t, "no flight-recorder dump arrived from the %zu process(es): the recorder is off "
                   "(DSHIM_TRACE_BUFFER=0), dshim is not loaded, or no communicator was made yet\n", set->nprocs);
        } else {
            tx_add(&t, "no flight-recorder dump to read\n");
        }
        model_free(&m);
        return tx_take(&t);
    }
    /* the first error any rank reported, in its own words */
    const dshim_trace_dump_t *first = NULL;
    for (size_t i = 0; i < set->n; i++) {
        const dshim_trace_dump_t *d = &set->dumps[i];
        if (is_failure_reason(d->reason) && d->why[0] && (first == NULL || d->realtime_ns < first->realtime_ns)) {
            first = d;
        }
    }
    text_t body = {0};
    /* order communicators by weight (selection sort: there are few) */
    int *order = malloc((size_t)(m.ncomms > 0 ? m.ncomms : 1) * sizeof(int));
    int nsaid = 0;
    for (int i = 0; order && i < m.ncomms; i++) {
        order[i] = i;
    }
    for (int i = 0; order && i < m.ncomms; i++) {
        for (int j = i + 1; j < m.ncomms; j++) {
            if (comm_weight(&m.comms[order[j]]) > comm_weight(&m.comms[order[i]])) {
                int x = order[i];
                order[i] = order[j];
                order[j] = x;
            }
        }
    }
    /* a prefix names the communicator when several have something to say */
    int talking = 0;
    for (int i = 0; order && i < m.ncomms; i++) {
        text_t probe = {0};
        talking += diagnose_comm(&m, &m.comms[i], "", &probe);
        free(probe.buf);
    }
    for (int i = 0; order && i < m.ncomms; i++) {
        comm_t *c = &m.comms[order[i]];
        char prefix[160] = "";
        if (talking > 1) {
            snprintf(prefix, sizeof(prefix), "[%s] ", comm_label(c));
        }
        nsaid += diagnose_comm(&m, c, prefix, &body);
    }
    free(order);
    /* MXNet jobs: the parameter server's rings */
    ps_model_t ps;
    ps_build(&m, &ps);
    nsaid += ps_diagnose(&m, &ps, &body);
    if (first) {
        /* dshim's messages begin "rank R (host H) in allreduce #5 (...): ", which
         * the line's head and the lines below say already: the rest is the news */
        const char *why = first->why;
        const char *cut = strstr(why, "): ");
        if (strncmp(why, "rank ", 5) == 0 && cut && cut - why < 160 && cut[3]) {
            why = cut + 3;
        }
        /* a server's timeout: "server 1 (host h) waits for key 3 round 4 from worker 1 (...); ...; no push
         * of key 3 for 6.0 s (DSHIM_TIMEOUT=6 s): the job ends", whose story the lines below tell */
        const char *tail = strstr(why, "; no push of key ");
        if (ps.any && strncmp(why, "server ", 7) == 0 && strstr(why, " waits for key ") && tail) {
            why = tail + 2;
        }
        char w[260], name[64];
        snprintf(w, sizeof(w), "%.200s%s", why, strlen(why) > 200 ? "..." : "");
        dump_who(set, first, name, sizeof(name));
        tx_add(&t, "first error: %s (host %s, %s): %s\n", name, first->host[0] ? first->host : "?",
               first->reason, w);
        t.lines++;
    }
    if (nsaid == 0) {
        /* nobody waits anywhere: say where everyone is */
        for (int i = 0; i < m.ncomms && i < 3; i++) {
            comm_t *c = &m.comms[i];
            const dshim_trace_rec_t *newest = NULL;
            const dshim_trace_dump_t *nd = NULL;
            for (int r = 0; r < c->size; r++) {
                const member_t *mb = &c->members[r];
                if (mb->last && (newest == NULL || mb->last->id > newest->id)) {
                    newest = mb->last;
                    nd = mb->dump;
                }
            }
            if (newest) {
                char a[64], s[32];
                fmt_opseq(newest, a, sizeof(a));
                uint64_t tt = newest->t_done_ns ? newest->t_done_ns : newest->t_queued_ns;
                fmt_secs(age_s(&m, nd, tt), s, sizeof(s));
                tx_add(&t, "%s%s: all %d rank(s) idle, nobody waits; the last operation, %s, ended %s ago\n",
                       m.ncomms > 1 ? "" : "", comm_label(c), c->ndumped, a, s);
                t.lines++;
            }
        }
        if (ps.any) {
            ps_idle(&m, &ps, &t);
        }
    }
    ps_free(&ps);
    /* the body, cut to the screen's budget */
    if (body.buf) {
        int total = 0;
        for (const char *q = body.buf; *q; q++) {
            total += *q == '\n';
        }
        int budget = max_lines - t.lines;
        if (budget < 2) {
            budget = 2;
        }
        if (max_lines <= 0 || total <= budget) {
            tx_add(&t, "%s", body.buf);
        } else {
            const char *p = body.buf;
            for (int i = 0; i < budget - 1; i++) {
                const char *nl = strchr(p, '\n');
                tx_add(&t, "%.*s", (int)(nl - p) + 1, p);
                p = nl + 1;
            }
            tx_add(&t, "... and %d more line(s)\n", total - (budget - 1));
        }
        free(body.buf);
    }
    model_free(&m);
    return tx_take(&t);
}

/* ---- the live status ------------------------------------------------------ */

/* Rows by world rank; an MXNet job's: the scheduler, the servers, the workers. */
static long long row_order(const dshim_trace_dump_t *d)
{
    for (size_t k = 0; k < d->nrings; k++) {
        const char *n = d->rings[k].name;
        int s = ps_index(n, "ps/server.", 1 << 20), w = ps_index(n, "ps/worker.", 1 << 20);
        if (strcmp(n, "ps/scheduler") == 0) {
            return 1ll << 32;
        }
        if (s >= 0 || w >= 0) {
            return (2ll << 32) + (w >= 0 ? 1ll << 24 : 0) + (s >= 0 ? s : w);
        }
    }
    return d->rank;
}

/* One row per rank: the communicator where it is busy (else its newest activity). */
static void status_rows(const model_t *m, text_t *t)
{
    const dshim_trace_set_t *s = m->set;
    /* order dumps by world rank */
    size_t *idx = malloc((s->n ? s->n : 1) * sizeof(*idx));
    if (idx == NULL) {
        return;
    }
    for (size_t i = 0; i < s->n; i++) {
        idx[i] = i;
    }
    for (size_t i = 0; i < s->n; i++) {
        for (size_t j = i + 1; j < s->n; j++) {
            if (row_order(&s->dumps[idx[j]]) < row_order(&s->dumps[idx[i]])) {
                size_t x = idx[i];
                idx[i] = idx[j];
                idx[j] = x;
            }
        }
    }
    tx_add(t, "%-6s %-16s %-8s %-44s %-9s %-12s %s\n", "rank", "host", "pid", "now", "for", "waiting for",
           "moved (recorded ops)");
    for (size_t i = 0; i < s->n; i++) {
        const dshim_trace_dump_t *d = &s->dumps[idx[i]];
        const dshim_trace_dring_t *best = NULL;
        const dshim_trace_rec_t *bp = NULL, *blast = NULL;
        uint64_t moved = 0, nops = 0;
        for (size_t k = 0; k < d->nrings; k++) {
            const dshim_trace_dring_t *r = &d->rings[k];
            const dshim_trace_rec_t *pend = NULL, *last = NULL;
            for (size_t j = 0; j < r->n; j++) {
                const dshim_trace_rec_t *e = &r->recs[j];
                if (e->state == DSHIM_TRACE_DONE) {
                    moved += e->bytes;
                    nops++;
                }
                if (e->state >= 0) {
                    last = e;
                }
                if (e->state >= 0 && e->state != DSHIM_TRACE_DONE && pend == NULL) {
                    pend = e;
                }
            }
            if (pend && (bp == NULL || pend->t_queued_ns < bp->t_queued_ns)) {
                best = r;
                bp = pend;
            }
            if (!bp && last && (blast == NULL || last->t_queued_ns > blast->t_queued_ns)) {
                best = r;
                blast = last;
            }
        }
        char now[400] = "idle", forb[32] = "-", waitb[64] = "-", movedb[64];
        char a[64], args[320];
        int ps = best && is_ps_ring(best->name);
        if (bp) {
            fmt_opseq(bp, a, sizeof(a));
            fmt_args(bp, 0, args, sizeof(args));
            if (ps) {
                /* MXNet: "pushpull key 3 round 4 to server 1" */
                ps_req(bp, 1, a, sizeof(a));
                args[0] = '\0';
            }
            const char *st = bp->state == DSHIM_TRACE_QUEUED ? "queued: " : bp->state == DSHIM_TRACE_FAILED ?
                             "failed: " : "";
            snprintf(now, sizeof(now), "%s%s%s", st, a, args);
            uint64_t t0 = bp->t_started_ns ? bp->t_started_ns : bp->t_queued_ns;
            fmt_secs(age_s(m, d, t0), forb, sizeof(forb));
            if (bp->nwaiting > 0 && best && is_ps_ring(best->name)) {
                /* a worker waits for a server, a server or the scheduler for workers */
                char list[48];
                dshim_trace_ranges(bp->waiting_for, (size_t)bp->nwaiting, list, sizeof(list));
                snprintf(waitb, sizeof(waitb), "%s%s %s", strncmp(best->name, "ps/worker.", 10) == 0 ? "server" :
                         "worker", bp->nwaiting == 1 ? "" : "s", list);
            } else if (bp->nwaiting > 0) {
                /* ring ranks -> world ranks through the model's communicator */
                int w[8];
                int nw = 0;
                for (int c = 0; c < m->ncomms; c++) {
                    if (best && strcmp(m->comms[c].name, best->name) == 0) {
                        for (int k = 0; k < bp->nwaiting && nw < 8; k++) {
                            int rr = bp->waiting_for[k];
                            w[nw++] = rr < m->comms[c].size && m->comms[c].members[rr].world >= 0 ?
                                      m->comms[c].members[rr].world : rr;
                        }
                    }
                }
                char list[48];
                dshim_trace_ranges(w, (size_t)nw, list, sizeof(list));
                snprintf(waitb, sizeof(waitb), "%s %s", nw == 1 ? "rank" : "ranks", list);
            } else if (bp->state == DSHIM_TRACE_STARTED) {
                snprintf(waitb, sizeof(waitb), "(moving)");
            }
        } else if (blast) {
            fmt_opseq(blast, a, sizeof(a));
            if (ps) {
                ps_req(blast, 1, a, sizeof(a));
            }
            snprintf(now, sizeof(now), "idle (last: %s %s)", a, blast->state == DSHIM_TRACE_DONE ? "done" : "failed");
            uint64_t t0 = blast->t_done_ns ? blast->t_done_ns : blast->t_queued_ns;
            fmt_secs(age_s(m, d, t0), forb, sizeof(forb));
        }
        fmt_bytes(moved, movedb, sizeof(movedb));
        char rank[16], pid[16];
        snprintf(rank, sizeof(rank), "%d", d->rank);
        for (size_t k = 0; k < d->nrings; k++) {
            /* an MXNet process: its role (srv1, wkr0, sched) */
            const char *n = d->rings[k].name;
            int sv = strncmp(n, "ps/server.", 10) == 0, wk = strncmp(n, "ps/worker.", 10) == 0;
            if (sv || wk) {
                snprintf(rank, sizeof(rank), "%s%.8s", sv ? "srv" : "wkr", n + 10);
            } else if (strcmp(n, "ps/scheduler") == 0) {
                snprintf(rank, sizeof(rank), "sched");
            }
        }
        snprintf(pid, sizeof(pid), "%ld", d->pid);
        tx_add(t, "%-6s %-16.16s %-8s %-44s %-9s %-12s %s in %llu ops\n", rank, d->host, pid, now, forb, waitb,
               movedb, (unsigned long long)nops);
    }
    free(idx);
}

/* Ranks the launcher knows that sent no dump. */
static void status_missing(const model_t *m, text_t *t)
{
    const dshim_trace_set_t *s = m->set;
    for (size_t i = 0; i < s->nprocs; i++) {
        const dshim_trace_proc_t *p = &s->procs[i];
        int found = 0;
        for (size_t j = 0; j < s->n && !found; j++) {
            found = s->dumps[j].pid == p->pid && p->pid > 0;
        }
        if (found) {
            continue;
        }
        const char *why = p->state == DSHIM_TRACE_PROC_KILLED ? "it was killed" :
                          p->state == DSHIM_TRACE_PROC_EXITED ? "it has exited" :
                          (p->pstate == 'T' || p->pstate == 't') ? "it is stopped (SIGSTOP or a debugger)" :
                          p->asked ? "it did not answer the dump signal (stopped, or stuck in a system call)" :
                          "it does not catch the dump signal (recorder off, dshim not loaded, or no communicator yet)";
        tx_add(t, "%s (host %s, pid %ld): no dump: %s\n", p->name[0] ? p->name : "?", p->host[0] ? p->host : "?",
               p->pid, why);
    }
}

typedef struct {
    int ring_rank;
    double late_sum;   /* seconds after the first arrival, summed */
    int last_count;    /* how often it arrived last */
    int n;
} late_t;

/* Per communicator: over the last `last_n` collectives every dumped member
 * completed, when each member called it (its t_queued on one wall clock),
 * relative to the first caller.  The rank that is always last is the one the
 * others wait for. */
static void status_stragglers(const model_t *m, int last_n, text_t *t)
{
    for (int ci = 0; ci < m->ncomms; ci++) {
        const comm_t *c = &m->comms[ci];
        if (c->ndumped < 2) {
            continue;
        }
        /* the newest seq every dumped member has done */
        uint64_t top = DSHIM_TRACE_SEQ_NONE;
        for (int r = 0; r < c->size; r++) {
            const member_t *mb = &c->members[r];
            if (mb->dump == NULL) {
                continue;
            }
            uint64_t best = 0;
            int any = 0;
            for (size_t j = 0; j < mb->ring->n; j++) {
                const dshim_trace_rec_t *e = &mb->ring->recs[j];
                if (e->state == DSHIM_TRACE_DONE && e->seq != DSHIM_TRACE_SEQ_NONE && !is_p2p(e->op) &&
                    (!any || e->seq > best)) {
                    best = e->seq;
                    any = 1;
                }
            }
            if (!any) {
                top = DSHIM_TRACE_SEQ_NONE;
                break;
            }
            if (top == DSHIM_TRACE_SEQ_NONE || best < top) {
                top = best;
            }
        }
        if (top == DSHIM_TRACE_SEQ_NONE) {
            continue;
        }
        late_t *lt = calloc((size_t)c->size, sizeof(*lt));
        uint64_t *arr = calloc((size_t)c->size, sizeof(*arr));
        if (lt == NULL || arr == NULL) {
            free(lt);
            free(arr);
            continue;
        }
        int used = 0;
        double spread_max = 0;
        for (uint64_t seq = top + 1; seq-- > 0 && used < last_n;) {
            /* everyone's arrival at seq */
            int have = 0;
            uint64_t first = 0, lastt = 0;
            int lastr = -1;
            for (int r = 0; r < c->size; r++) {
                const member_t *mb = &c->members[r];
                arr[r] = 0;
                if (mb->dump == NULL) {
                    continue;
                }
                for (size_t j = mb->ring->n; j-- > 0;) {
                    const dshim_trace_rec_t *e = &mb->ring->recs[j];
                    if (e->seq == seq && e->state == DSHIM_TRACE_DONE && !is_p2p(e->op)) {
                        arr[r] = to_wall(mb->dump, e->t_queued_ns);
                        break;
                    }
                    if (e->seq != DSHIM_TRACE_SEQ_NONE && e->seq < seq) {
                        break;
                    }
                }
                if (arr[r] == 0) {
                    continue;
                }
                have++;
                if (first == 0 || arr[r] < first) {
                    first = arr[r];
                }
                if (arr[r] > lastt) {
                    lastt = arr[r];
                    lastr = r;
                }
            }
            if (have != c->ndumped) {
                if (seq == 0 || top - seq > (uint64_t)last_n * 4) {
                    break;  /* the rings no longer reach back this far */
                }
                continue;
            }
            used++;
            double spread = (double)(lastt - first) / 1e9;
            if (spread > spread_max) {
                spread_max = spread;
            }
            for (int r = 0; r < c->size; r++) {
                if (arr[r]) {
                    lt[r].late_sum += (double)(arr[r] - first) / 1e9;
                    lt[r].n++;
                }
            }
            if (lastr >= 0) {
                lt[lastr].last_count++;
            }
            if (seq == 0) {
                break;
            }
        }
        if (used > 0) {
            /* the three latest on average */
            char line[768];
            size_t len = 0;
            int named = 0;
            int *taken = calloc((size_t)c->size, sizeof(int));
            for (int k = 0; taken && k < 3; k++) {
                int bestr = -1;
                double bestv = 0;
                for (int r = 0; r < c->size; r++) {
                    if (!taken[r] && lt[r].n > 0 && lt[r].late_sum / lt[r].n > bestv) {
                        bestv = lt[r].late_sum / lt[r].n;
                        bestr = r;
                    }
                }
                if (bestr < 0 || bestv < 0.001) {
                    break;  /* a millisecond is noise at this scale */
                }
                taken[bestr] = 1;
                char s[32], nm[64];
                fmt_secs(bestv, s, sizeof(s));
                int wr = c->members[bestr].world;
                if (wr >= 0) {
                    snprintf(nm, sizeof(nm), "rank %d", wr);
                } else {
                    snprintf(nm, sizeof(nm), "ring rank %d", bestr);
                }
                len += (size_t)snprintf(line + len, sizeof(line) - len, "%s%s arrives %s after the first on "
                                        "average (last in %d of %d)", named ? "; " : "", nm, s,
                                        lt[bestr].last_count, used);
                named++;
                if (len >= sizeof(line)) {
                    break;
                }
            }
            free(taken);
            if (named) {
                tx_add(t, "slowest over the last %d collective(s) of %s: %s\n", used, comm_label(c), line);
            } else {
                char s[32];
                fmt_secs(spread_max, s, sizeof(s));
                tx_add(t, "no straggler over the last %d collective(s) of %s: every rank arrives within %s of "
                       "the first\n", used, comm_label(c), s);
            }
        }
        free(lt);
        free(arr);
    }
}

char *dshim_trace_status(const dshim_trace_set_t *set, int last_n, uint64_t now_realtime_ns)
{
    text_t t = {0};
    model_t m;
    model_build(&m, set, now_realtime_ns);
    if (last_n <= 0) {
        last_n = 20;
    }
    if (set->n == 0) {
        tx_add(&t, "no flight-recorder dump arrived (recorder off with DSHIM_TRACE_BUFFER=0, dshim not loaded, "
               "or no communicator yet)\n");
    } else {
        status_rows(&m, &t);
    }
    status_missing(&m, &t);
    status_stragglers(&m, last_n, &t);
    model_free(&m);
    return tx_take(&t);
}

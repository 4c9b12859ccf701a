/* One communicator's lines of the diagnosis (diagnose.c says how ranks are
 * grouped and described). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "diagnose_impl.h"

/* Counts may differ between ranks in the "v" collectives by design. */
static int counts_vary(const char *op)
{
    size_t n = strlen(op);
    return n > 1 && op[n - 1] == 'v';
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

/* How long a member has been idle: since its newest entry. */
static double idle_s(const model_t *m, const member_t *mb)
{
    const dshim_trace_rec_t *l = mb->last;
    if (l == NULL) {
        return 0;
    }
    return age_s(m, mb->dump, l->t_done_ns ? l->t_done_ns : l->t_queued_ns);
}

/* Describes one member relative to the waiting group's call `w` (NULL when
 * nobody waits); the description is what groups members into one line.
 * with_time: the idle time is named (a line about one rank); without it the
 * text is the key that puts ranks on one line. */
static void describe(const model_t *m, const comm_t *c, int r, const dshim_trace_rec_t *w, int with_time, char *out,
                     size_t cap)
{
    const member_t *mb = &c->members[r];
    char a[64], b[320], args[320];
    if (mb->dump == NULL) {
        char seen[160] = "";
        if (w) {
            dshim_diag_fmt_opseq(w, a, sizeof(a));
            snprintf(seen, sizeof(seen), " \xe2\x80\x94 the others wait for it in %s", a);
        }
        dshim_diag_describe_missing(m, dshim_diag_proc_of_rank(m->set, mb->world), seen, out, cap);
        return;
    }
    const dshim_trace_rec_t *pe = mb->pending;
    char last[128] = "";
    if (mb->last_done) {
        dshim_diag_fmt_opseq(mb->last_done, a, sizeof(a));
        snprintf(last, sizeof(last), "last completed %s and ", a);
    }
    if (pe == NULL) {
        if (mb->last) {
            const dshim_trace_rec_t *l = mb->last;
            dshim_diag_fmt_opseq(l, a, sizeof(a));
            if (with_time) {
                dshim_diag_fmt_secs(idle_s(m, mb), b, sizeof(b));
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
    dshim_diag_fmt_opseq(pe, a, sizeof(a));
    dshim_diag_fmt_args(pe, 1, args, sizeof(args));
    char waitfor[200] = "";
    if (pe->nwaiting > 0 && (pe->state == DSHIM_TRACE_WAITING || pe->state == DSHIM_TRACE_FAILED)) {
        char names[160];
        dshim_diag_name_ranks(c, pe->waiting_for, pe->nwaiting, names, sizeof(names));
        snprintf(waitfor, sizeof(waitfor), ", waiting for %s", names);
    }
    if (w && !is_p2p(pe->op) && pe->seq == w->seq && strcmp(pe->op, w->op) != 0) {
        snprintf(out, cap, "%sis now in %s%s: not the collective the others called", last, a, args);
    } else if (w && !is_p2p(pe->op) && pe->seq == w->seq) {
        /* the framework calls too, when they differ: they usually tell the bug
         * ("from DDP bucket 0" where the others have "from torch all_reduce") */
        char wargs[320];
        int labels = strcmp(pe->label, w->label) != 0;
        dshim_diag_fmt_args(w, labels, wargs, sizeof(wargs));
        dshim_diag_fmt_args(pe, labels, b, sizeof(b));
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
        dshim_diag_fmt_secs(lo, a, sizeof(a));
        dshim_diag_fmt_secs(hi, b, sizeof(b));
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

/* The waiting group's line ("ranks 0-2 wait in allreduce #5 (...) for rank 3
 * (for 2.0 s)"); marks in culprit the ranks they wait for (1: named by their
 * entries, 2: everyone else not with them). */
static void waiters_line(const model_t *m, const comm_t *c, const group_t *mg, int main, char *culprit,
                         const char *prefix, text_t *t)
{
    const dshim_trace_rec_t *w = mg->e;
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
        if (mb->pending->state == DSHIM_TRACE_FAILED || dshim_diag_is_failure_reason(mb->dump->reason)) {
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
    dshim_diag_fmt_opseq(w, a, sizeof(a));
    dshim_diag_fmt_args(w, 1, args, sizeof(args));
    dshim_diag_name_ranks(c, mg->members, mg->n, names, sizeof(names));
    if (forr && nfor > 0) {
        dshim_diag_name_ranks(c, forr, nfor, fornames, sizeof(fornames));
    }
    if (since_d) {
        char s[32];
        uint64_t end = failed == mg->n ? gave_up : m->now;
        dshim_diag_fmt_secs(end > since ? (double)(end - since) / 1e9 : 0, s, sizeof(s));
        snprintf(sincebuf, sizeof(sincebuf), " (%s %s)", failed == mg->n ? "gave up after" : "for", s);
    }
    if (all) {
        dshim_text_add(t, "%s%s %s in %s%s%s%s%s\n", prefix, names, mg->n == 1 ? "is" : "are all", a, args, sincebuf,
                       fornames[0] ? ", waiting for " : "", fornames);
    } else {
        dshim_text_add(t, "%s%s %s in %s%s for %s%s\n", prefix, names, mg->n == 1 ? "waits" : "wait", a, args,
                       fornames[0] ? fornames : "the others", sincebuf);
    }
    t->lines++;
    free(forr);
}

/* Everyone else, relative to the waiting group's call w (NULL when nobody
 * waits); those with the same description on one line. */
static void others_lines(const model_t *m, const comm_t *c, const char *culprit, const dshim_trace_rec_t *w,
                         int main, int missing, const char *prefix, text_t *t)
{
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
            dshim_diag_who(m, c, r, names, sizeof(names));
            describe(m, c, r, w, 1, text, sizeof(text));
        } else {
            dshim_diag_name_ranks(c, same, n, names, sizeof(names));
            plural(m, c, same, n, key, text, sizeof(text));
        }
        dshim_text_add(t, "%s%s %s\n", prefix, names, text);
        t->lines++;
    }
    free(descs);
    free(done);
    free(same);
}

/* One communicator's lines.  Returns 1 when it said something. */
int dshim_diag_comm(const model_t *m, comm_t *c, const char *prefix, text_t *t)
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
        waiters_line(m, c, &g[main], main, culprit, prefix, t);
    } else {
        for (int r = 0; r < c->size; r++) {
            culprit[r] = 2;
        }
    }
    others_lines(m, c, culprit, w, main, missing, prefix, t);
    free(culprit);
    free_groups(g, ng);
    return 1;
}

int dshim_diag_is_failure_reason(const char *r)
{
    return strcmp(r, "timeout") == 0 || strcmp(r, "peer") == 0 || strcmp(r, "mismatch") == 0 ||
           strcmp(r, "abort") == 0 || strcmp(r, "failed") == 0 || strcmp(r, "crash") == 0;
}

/* Most important first: the communicators where someone waits, larger first. */
int dshim_diag_comm_weight(const comm_t *c)
{
    int pending = 0, missing = 0;
    for (int r = 0; r < c->size; r++) {
        pending += c->members[r].pending != NULL;
        missing += c->members[r].dump == NULL;
    }
    return (pending > 0 ? 1 << 24 : 0) + (c->world_sized ? 1 << 23 : 0) + c->size * 2 + (missing > 0);
}

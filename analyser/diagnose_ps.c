/* The diagnosis's lines about an MXNet job: servers that wait for a push
 * and the workers that have not pushed, the scheduler's waiting barriers,
 * workers waiting for a server that waits for nobody, the processes that
 * left no dump. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "diagnose_impl.h"

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
    dshim_diag_ps_who(n, "worker", w, who_s, sizeof(who_s));
    if (n->ring == NULL) {
        char seen[300];
        snprintf(seen, sizeof(seen), " \xe2\x80\x94 %s", context);
        if (n->dump == NULL) {
            dshim_diag_describe_missing(m, n->proc, seen, text, sizeof(text));
        } else {
            snprintf(text, sizeof(text), "has no ring ps/worker.%d in its dump%s", w, seen);
        }
        dshim_text_add(t, "%s %s\n", who_s, text);
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
        if (pushed && dshim_diag_label_key(pushed->label, &k)) {
            dshim_diag_fmt_secs(age_s(m, n->dump, pushed->t_started_ns ? pushed->t_started_ns : pushed->t_queued_ns), s,
                                sizeof(s));
            len += (size_t)snprintf(text + len, sizeof(text) - len, "last pushed key %d round %llu to server %d %s ago",
                                    k, (unsigned long long)pushed->seq, server, s);
        } else {
            len += (size_t)snprintf(text + len, sizeof(text) - len, "has pushed nothing to server %d", server);
        }
    }
    const char *lead = server >= 0 ? "; it " : "";
    if (pending && len < sizeof(text)) {
        dshim_diag_ps_req(pending, 1, rq, sizeof(rq));
        dshim_diag_fmt_secs(age_s(m, n->dump, pending->t_started_ns ? pending->t_started_ns : pending->t_queued_ns), s,
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
        dshim_diag_ps_req(last, 1, rq, sizeof(rq));
        uint64_t te = last->t_done_ns ? last->t_done_ns : last->t_queued_ns;
        dshim_diag_fmt_secs(age_s(m, n->dump, te), s, sizeof(s));
        len += (size_t)snprintf(text + len, sizeof(text) - len, "%shas made no request since its %s, which %s %s ago",
                                lead, rq, last->state == DSHIM_TRACE_FAILED ? "failed" : "ended", s);
    } else if (len < sizeof(text)) {
        len += (size_t)snprintf(text + len, sizeof(text) - len, "%shas recorded no request", lead);
    }
    dshim_text_add(t, "%s %s\n", who_s, text);
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
        dshim_diag_ps_list(role, e->waiting_for, e->nwaiting, missing, sizeof(missing));
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
                dshim_diag_ps_list(role, a, na, l, sizeof(l));
            }
            snprintf(arrived, sizeof(arrived), " (arrived: %s)", na > 0 ? l : "none");
            free(a);
        }
        const char *g = strchr(e->label, '(');
        if (g) {
            snprintf(group, sizeof(group), " %.40s", g);
        }
        dshim_diag_fmt_secs(age_s(m, sc->dump, e->t_started_ns ? e->t_started_ns : e->t_queued_ns), s, sizeof(s));
        dshim_text_add(t, "the scheduler's barrier #%llu%s waits for %s%s for %s\n", (unsigned long long)e->seq, group,
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
                dshim_diag_ps_who(&p->servers[x], "server", x, who_s, sizeof(who_s));
                snprintf(seen, sizeof(seen), " \xe2\x80\x94 %s", ctx);
                dshim_diag_describe_missing(m, p->servers[x].proc, seen, d, sizeof(d));
                dshim_text_add(t, "%s %s\n", who_s, d);
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
        int key = 0, has_key = dshim_diag_label_key(oldest->label, &key);
        char names[256], rq[160], what[900], s1[32];
        dshim_diag_ps_list("worker", ws, nws, names, sizeof(names));
        dshim_diag_ps_req(oldest, 0, rq, sizeof(rq));
        if (sv->ring == NULL) {
            char who_s[200], d[600];
            sv->said = 1;
            dshim_diag_ps_who(sv, "server", s, who_s, sizeof(who_s));
            if (sv->dump == NULL) {
                dshim_diag_describe_missing(m, sv->proc, "", d, sizeof(d));
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
                if (strcmp(e->op, "push") == 0 && dshim_diag_label_key(e->label, &k2) && k2 == key) {
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
                dshim_diag_fmt_secs(age_s(m, sv->dump, lastk->t_done_ns), s1, sizeof(s1));
                snprintf(what, sizeof(what), ", which has no open round: its last round of key %d, round %llu, "
                         "ended %s ago", key, (unsigned long long)lastk->seq, s1);
            } else if (has_key) {
                snprintf(what, sizeof(what), ", which has no open round: it has no round of key %d in its ring", key);
            } else {
                snprintf(what, sizeof(what), ", which has no open round and waits for no worker");
            }
        }
        dshim_diag_fmt_secs(age_s(m, od, oldest->t_started_ns ? oldest->t_started_ns : oldest->t_queued_ns), s1,
                            sizeof(s1));
        dshim_text_add(t, "%s %s for server %d (%s, for %s)%s\n", names, nws == 1 ? "waits" : "wait", s, rq, s1, what);
        t->lines++;
    }
    free(ws);
}

/* The MXNet lines: servers that wait for a push and the workers that have
 * not pushed, the scheduler's waiting barriers, workers waiting for a server
 * that waits for nobody, then the job's other processes that left no dump.
 * Returns the number of lines. */
int dshim_diag_ps(const model_t *m, ps_model_t *p, text_t *t)
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
        int key = 0, has_key = dshim_diag_label_key(e->label, &key);
        char who_s[200], what[96], from[300], by[300] = "", more[64] = "", s1[32];
        dshim_diag_ps_who(sv, "server", s, who_s, sizeof(who_s));
        if (has_key) {
            snprintf(what, sizeof(what), "key %d round %llu", key, (unsigned long long)e->seq);
        } else {
            snprintf(what, sizeof(what), "%s round %llu", e->label, (unsigned long long)e->seq);
        }
        if (e->nwaiting > 0) {
            char l[240];
            dshim_diag_ps_list("worker", e->waiting_for, e->nwaiting, l, sizeof(l));
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
                dshim_diag_ps_list("worker", pb, npb, l, sizeof(l));
            }
            snprintf(by, sizeof(by), " (pushed by %s)", l);
            free(pb);
        }
        if (nwait > 1) {
            snprintf(more, sizeof(more), "; %d more key%s wait%s too", nwait - 1, nwait > 2 ? "s" : "",
                     nwait > 2 ? "" : "s");
        }
        dshim_diag_fmt_secs(age_s(m, sv->dump, e->t_started_ns ? e->t_started_ns : e->t_queued_ns), s1, sizeof(s1));
        dshim_text_add(t, "%s waits for %s%s%s for %s%s\n", who_s, what, from, by, s1, more);
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
        dshim_diag_ps_who(n, i < p->ns ? "server" : i < p->ns + p->nw ? "worker" : "scheduler",
                          i < p->ns ? i : i < p->ns + p->nw ? i - p->ns : -1, who_s, sizeof(who_s));
        dshim_diag_describe_missing(m, n->proc, "", d, sizeof(d));
        dshim_text_add(t, "%s %s\n", who_s, d);
        t->lines++;
    }
    return t->lines - before;
}

/* When nobody waits: the newest completed round of any server. */
void dshim_diag_ps_idle(const model_t *m, const ps_model_t *p, text_t *t)
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
    dshim_text_add(t, "MXNet parameter server: nobody waits (%d of its %d processes dumped)", dumped,
                   p->ns + p->nw + 1);
    int key = 0;
    if (newest && dshim_diag_label_key(newest->label, &key)) {
        char s[32];
        dshim_diag_fmt_secs(age_s(m, nd, newest->t_done_ns), s, sizeof(s));
        dshim_text_add(t, "; the last round, key %d round %llu on server %d, ended %s ago", key,
                       (unsigned long long)newest->seq, srv, s);
    }
    dshim_text_add(t, "\n");
    t->lines++;
}

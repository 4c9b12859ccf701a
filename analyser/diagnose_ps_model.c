/* The nodes of an MXNet job (dshim's parameter server, shim/ps/ps_trace.h)
 * from their "ps/" rings and the launcher's processes, and how they and
 * their requests are named. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "diagnose_impl.h"

/* "ps/server.12" with prefix "ps/server." -> 12; -1 unless a number below bound follows */
int dshim_diag_ps_index(const char *name, const char *prefix, int bound)
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
int dshim_diag_label_key(const char *label, int *key)
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

static const dshim_trace_proc_t *ps_proc_named(const dshim_trace_set_t *s, const char *name)
{
    for (size_t i = 0; i < s->nprocs; i++) {
        if (s->procs[i].rank < 0 && strcmp(s->procs[i].name, name) == 0) {
            return &s->procs[i];
        }
    }
    return NULL;
}

const dshim_trace_proc_t *dshim_diag_ps_proc_of_dump(const dshim_trace_set_t *s, const dshim_trace_dump_t *d)
{
    for (size_t i = 0; d->pid > 0 && i < s->nprocs; i++) {
        if (s->procs[i].pid == d->pid &&
            (!s->procs[i].host[0] || !d->host[0] || strcmp(s->procs[i].host, d->host) == 0)) {
            return &s->procs[i];
        }
    }
    return NULL;
}

void dshim_diag_ps_free(ps_model_t *p)
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
void dshim_diag_ps_build(const model_t *m, ps_model_t *p)
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
            int s = dshim_diag_ps_index(r->name, "ps/server.", bound);
            int w = dshim_diag_ps_index(r->name, "ps/worker.", bound);
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
            ns = imax(ns, dshim_diag_ps_index(set->procs[i].name, "server ", bound) + 1);
            nw = imax(nw, dshim_diag_ps_index(set->procs[i].name, "worker ", bound) + 1);
        }
    }
    ns = ns < bound ? ns : bound;
    nw = nw < bound ? nw : bound;
    p->servers = calloc((size_t)(ns > 0 ? ns : 1), sizeof(ps_node_t));
    p->workers = calloc((size_t)(nw > 0 ? nw : 1), sizeof(ps_node_t));
    if (p->servers == NULL || p->workers == NULL) {
        dshim_diag_ps_free(p);
        return;
    }
    p->ns = ns;
    p->nw = nw;
    p->any = 1;
    for (size_t i = 0; i < set->n; i++) {
        const dshim_trace_dump_t *d = &set->dumps[i];
        for (size_t k = 0; k < d->nrings; k++) {
            const dshim_trace_dring_t *r = &d->rings[k];
            int s = dshim_diag_ps_index(r->name, "ps/server.", ns), w = dshim_diag_ps_index(r->name, "ps/worker.", nw);
            ps_node_t *n = s >= 0 ? &p->servers[s] : w >= 0 ? &p->workers[w] :
                           strcmp(r->name, "ps/scheduler") == 0 ? &p->sched : NULL;
            if (n != NULL && n->ring == NULL) {  /* two processes claim one node: keep the first */
                n->dump = d;
                n->ring = r;
                n->proc = dshim_diag_ps_proc_of_dump(set, d);
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
void dshim_diag_ps_who(const ps_node_t *n, const char *role, int idx, char *out, size_t cap)
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
void dshim_diag_ps_list(const char *role, const int *v, int n, char *out, size_t cap)
{
    char l[128];
    dshim_trace_ranges(v, (size_t)n, l, sizeof(l));
    snprintf(out, cap, "%s%s %s", role, n == 1 ? "" : "s", l);
}

/* A worker's request: "pushpull key 2 round 4 to server 0", "pull key 1
 * after round 3 from server 1", "barrier (workers) #7", "command 3" */
void dshim_diag_ps_req(const dshim_trace_rec_t *e, int with_peer, char *out, size_t cap)
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

/* The model of the diagnosis and the status (diagnose_impl.h):
 * communicators made of the dumps' rings, each member's pending and last
 * entries, and how members and processes are named. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "diagnose_impl.h"

const dshim_trace_proc_t *dshim_diag_proc_of_rank(const dshim_trace_set_t *s, int world)
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
    return dshim_diag_proc_of_rank(s, d->rank);
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

void dshim_diag_model_free(model_t *m)
{
    for (int i = 0; i < m->ncomms; i++) {
        free(m->comms[i].members);
    }
    free(m->comms);
}

/* Builds communicators from the dumps' rings. */
void dshim_diag_model_build(model_t *m, const dshim_trace_set_t *set, uint64_t now)
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

/* "rank 2 (host b, pid 812)", host and pid from the dump or the launcher */
void dshim_diag_who(const model_t *m, const comm_t *c, int ring_rank, char *out, size_t cap)
{
    const member_t *mb = &c->members[ring_rank];
    const dshim_trace_proc_t *p =
        mb->dump ? proc_of_dump(m->set, mb->dump) : dshim_diag_proc_of_rank(m->set, mb->world);
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
void dshim_diag_name_ranks(const comm_t *c, const int *ring_ranks, int n, char *out, size_t cap)
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

/* A process without a dump, from what the launcher knows of it (p may be
 * NULL); `seen` is appended ("" or " \xe2\x80\x94 the others wait ..."). */
void dshim_diag_describe_missing(const model_t *m, const dshim_trace_proc_t *p, const char *seen, char *out, size_t cap)
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
        dshim_diag_fmt_secs(m->set->wait_s, ws, sizeof(ws));
        snprintf(out, cap, "is alive but did not answer the dump signal within %s (stopped, or stuck in a "
                 "system call)%s", ws, seen);
    } else {
        snprintf(out, cap, "is alive but was not asked for a dump (it does not catch the dump signal: "
                 "recorder off or dshim not loaded)%s", seen);
    }
}

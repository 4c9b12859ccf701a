/* The live status (dshim-run --status, SIGUSR1 to dshim-run): one row per
 * process, the processes without a dump, the ranks that arrive last
 * (trace_read.h). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "diagnose_impl.h"

/* Rows by world rank; an MXNet job's: the scheduler, the servers, the workers. */
static long long row_order(const dshim_trace_dump_t *d)
{
    for (size_t k = 0; k < d->nrings; k++) {
        const char *n = d->rings[k].name;
        int s = dshim_diag_ps_index(n, "ps/server.", 1 << 20), w = dshim_diag_ps_index(n, "ps/worker.", 1 << 20);
        if (strcmp(n, "ps/scheduler") == 0) {
            return 1ll << 32;
        }
        if (s >= 0 || w >= 0) {
            return (2ll << 32) + (w >= 0 ? 1ll << 24 : 0) + (s >= 0 ? s : w);
        }
    }
    return d->rank;
}

/* One process's row: the communicator where it is busy (else its newest activity). */
static void status_row(const model_t *m, const dshim_trace_dump_t *d, text_t *t)
{
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
        dshim_diag_fmt_opseq(bp, a, sizeof(a));
        dshim_diag_fmt_args(bp, 0, args, sizeof(args));
        if (ps) {
            /* MXNet: "pushpull key 3 round 4 to server 1" */
            dshim_diag_ps_req(bp, 1, a, sizeof(a));
            args[0] = '\0';
        }
        const char *st = bp->state == DSHIM_TRACE_QUEUED ? "queued: " : bp->state == DSHIM_TRACE_FAILED ?
                         "failed: " : "";
        snprintf(now, sizeof(now), "%s%s%s", st, a, args);
        uint64_t t0 = bp->t_started_ns ? bp->t_started_ns : bp->t_queued_ns;
        dshim_diag_fmt_secs(age_s(m, d, t0), forb, sizeof(forb));
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
        dshim_diag_fmt_opseq(blast, a, sizeof(a));
        if (ps) {
            dshim_diag_ps_req(blast, 1, a, sizeof(a));
        }
        snprintf(now, sizeof(now), "idle (last: %s %s)", a, blast->state == DSHIM_TRACE_DONE ? "done" : "failed");
        uint64_t t0 = blast->t_done_ns ? blast->t_done_ns : blast->t_queued_ns;
        dshim_diag_fmt_secs(age_s(m, d, t0), forb, sizeof(forb));
    }
    dshim_diag_fmt_bytes(moved, movedb, sizeof(movedb));
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
    dshim_text_add(t, "%-6s %-16.16s %-8s %-44s %-9s %-12s %s in %llu ops\n", rank, d->host, pid, now, forb, waitb,
                   movedb, (unsigned long long)nops);
}

/* One row per process, by world rank (an MXNet job's by role). */
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
    dshim_text_add(t, "%-6s %-16s %-8s %-44s %-9s %-12s %s\n", "rank", "host", "pid", "now", "for", "waiting for",
                   "moved (recorded ops)");
    for (size_t i = 0; i < s->n; i++) {
        status_row(m, &s->dumps[idx[i]], t);
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
        dshim_text_add(t, "%s (host %s, pid %ld): no dump: %s\n", p->name[0] ? p->name : "?",
                       p->host[0] ? p->host : "?", p->pid, why);
    }
}

typedef struct {
    int ring_rank;
    double late_sum;   /* seconds after the first arrival, summed */
    int last_count;    /* how often it arrived last */
    int n;
} late_t;

/* The newest seq every dumped member of c has done; DSHIM_TRACE_SEQ_NONE when
 * some member has done none. */
static uint64_t common_top(const comm_t *c)
{
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
    return top;
}

/* Everyone's arrival (t_queued on one wall clock) at the last last_n
 * collectives up to top that every dumped member completed, added up in lt
 * (arr: scratch, c->size).  Returns how many collectives were counted. */
static int arrivals(const comm_t *c, uint64_t top, int last_n, late_t *lt, uint64_t *arr, double *spread_max)
{
    int used = 0;
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
        if (spread > *spread_max) {
            *spread_max = spread;
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
    return used;
}

/* The three latest on average, or that there is no straggler. */
static void straggler_line(const comm_t *c, const late_t *lt, int used, double spread_max, text_t *t)
{
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
        dshim_diag_fmt_secs(bestv, s, sizeof(s));
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
        dshim_text_add(t, "slowest over the last %d collective(s) of %s: %s\n", used, comm_label(c), line);
    } else {
        char s[32];
        dshim_diag_fmt_secs(spread_max, s, sizeof(s));
        dshim_text_add(t, "no straggler over the last %d collective(s) of %s: every rank arrives within %s of "
                       "the first\n", used, comm_label(c), s);
    }
}

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
        uint64_t top = common_top(c);
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
        double spread_max = 0;
        int used = arrivals(c, top, last_n, lt, arr, &spread_max);
        if (used > 0) {
            straggler_line(c, lt, used, spread_max, t);
        }
        free(lt);
        free(arr);
    }
}

char *dshim_trace_status(const dshim_trace_set_t *set, int last_n, uint64_t now_realtime_ns)
{
    text_t t = {0};
    model_t m;
    dshim_diag_model_build(&m, set, now_realtime_ns);
    if (last_n <= 0) {
        last_n = 20;
    }
    if (set->n == 0) {
        dshim_text_add(&t, "no flight-recorder dump arrived (recorder off with DSHIM_TRACE_BUFFER=0, dshim not loaded, "
                       "or no communicator yet)\n");
    } else {
        status_rows(&m, &t);
    }
    status_missing(&m, &t);
    status_stragglers(&m, last_n, &t);
    dshim_diag_model_free(&m);
    return dshim_text_take(&t);
}

/*
 * What the dumps of all ranks say, for people (trace_read.h): the
 * one-screen diagnosis of a failed or hung job (this file and the
 * diagnose_*.c it calls; the live status: live_status.c).  Pure functions
 * of the parsed dumps and of what the launcher knows of each process (exit
 * status, /proc state when asked to dump), so that tests check every case
 * with hand-written dumps.
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
 * "ps/worker.W", "ps/scheduler"), read apart (diagnose_ps_model.c,
 * diagnose_ps.c): the servers' rounds in state waiting (key, round, the workers that have not pushed),
 * each of those workers from its own ring (its last push to that server,
 * what it is in now) or from the launcher's account of it, the scheduler's
 * waiting barriers, workers left unanswered by a server that waits for no
 * one, and the job's other processes without a dump.  Processes are named
 * by role ("server 1", "worker 0": launcher.jsonl's names, or the ring's).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "diagnose_impl.h"

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
    const dshim_trace_proc_t *p = dshim_diag_ps_proc_of_dump(set, d);
    if (p && p->rank < 0 && p->name[0]) {
        snprintf(out, cap, "%.40s", p->name);
    } else {
        snprintf(out, cap, "rank %d", d->rank);
    }
}

/* Every communicator's lines into body, the most important first, prefixed
 * with its name when several have something to say.  Returns how many did. */
static int comms_lines(model_t *m, text_t *body)
{
    int nsaid = 0;
    /* order communicators by weight (selection sort: there are few) */
    int *order = malloc((size_t)(m->ncomms > 0 ? m->ncomms : 1) * sizeof(int));
    for (int i = 0; order && i < m->ncomms; i++) {
        order[i] = i;
    }
    for (int i = 0; order && i < m->ncomms; i++) {
        for (int j = i + 1; j < m->ncomms; j++) {
            if (dshim_diag_comm_weight(&m->comms[order[j]]) > dshim_diag_comm_weight(&m->comms[order[i]])) {
                int x = order[i];
                order[i] = order[j];
                order[j] = x;
            }
        }
    }
    /* a prefix names the communicator when several have something to say */
    int talking = 0;
    for (int i = 0; order && i < m->ncomms; i++) {
        text_t probe = {0};
        talking += dshim_diag_comm(m, &m->comms[i], "", &probe);
        free(probe.buf);
    }
    for (int i = 0; order && i < m->ncomms; i++) {
        comm_t *c = &m->comms[order[i]];
        char prefix[160] = "";
        if (talking > 1) {
            snprintf(prefix, sizeof(prefix), "[%s] ", comm_label(c));
        }
        nsaid += dshim_diag_comm(m, c, prefix, body);
    }
    free(order);
    return nsaid;
}

/* The first error any rank reported, in its own words. */
static void first_error_line(const dshim_trace_set_t *set, const ps_model_t *ps, text_t *t)
{
    const dshim_trace_dump_t *first = NULL;
    for (size_t i = 0; i < set->n; i++) {
        const dshim_trace_dump_t *d = &set->dumps[i];
        if (dshim_diag_is_failure_reason(d->reason) && d->why[0] &&
            (first == NULL || d->realtime_ns < first->realtime_ns)) {
            first = d;
        }
    }
    if (first == NULL) {
        return;
    }
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
    if (ps->any && strncmp(why, "server ", 7) == 0 && strstr(why, " waits for key ") && tail) {
        why = tail + 2;
    }
    char w[260], name[64];
    snprintf(w, sizeof(w), "%.200s%s", why, strlen(why) > 200 ? "..." : "");
    dump_who(set, first, name, sizeof(name));
    dshim_text_add(t, "first error: %s (host %s, %s): %s\n", name, first->host[0] ? first->host : "?",
                   first->reason, w);
    t->lines++;
}

/* Nobody waits anywhere: where everyone is. */
static void idle_lines(const model_t *m, const ps_model_t *ps, text_t *t)
{
    for (int i = 0; i < m->ncomms && i < 3; i++) {
        const comm_t *c = &m->comms[i];
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
            dshim_diag_fmt_opseq(newest, a, sizeof(a));
            uint64_t tt = newest->t_done_ns ? newest->t_done_ns : newest->t_queued_ns;
            dshim_diag_fmt_secs(age_s(m, nd, tt), s, sizeof(s));
            dshim_text_add(t, "%s%s: all %d rank(s) idle, nobody waits; the last operation, %s, ended %s ago\n",
                           m->ncomms > 1 ? "" : "", comm_label(c), c->ndumped, a, s);
            t->lines++;
        }
    }
    if (ps->any) {
        dshim_diag_ps_idle(m, ps, t);
    }
}

/* The body after t's lines, cut to max_lines in all (0: no limit). */
static void append_cut(text_t *t, text_t *body, int max_lines)
{
    if (body->buf) {
        int total = 0;
        for (const char *q = body->buf; *q; q++) {
            total += *q == '\n';
        }
        int budget = max_lines - t->lines;
        if (budget < 2) {
            budget = 2;
        }
        if (max_lines <= 0 || total <= budget) {
            dshim_text_add(t, "%s", body->buf);
        } else {
            const char *p = body->buf;
            for (int i = 0; i < budget - 1; i++) {
                const char *nl = strchr(p, '\n');
                dshim_text_add(t, "%.*s", (int)(nl - p) + 1, p);
                p = nl + 1;
            }
            dshim_text_add(t, "... and %d more line(s)\n", total - (budget - 1));
        }
        free(body->buf);
    }
}

char *dshim_trace_diagnose(const dshim_trace_set_t *set, int max_lines, uint64_t now_realtime_ns)
{
    text_t t = {0};
    model_t m;
    dshim_diag_model_build(&m, set, now_realtime_ns);
    if (set->n == 0) {
        if (set->nprocs > 0) {
            dshim_text_add(&t, "no flight-recorder dump arrived from the %zu process(es): the recorder is off "
                           "(DSHIM_TRACE_BUFFER=0), dshim is not loaded, or no communicator was made yet\n",
                           set->nprocs);
        } else {
            dshim_text_add(&t, "no flight-recorder dump to read\n");
        }
        dshim_diag_model_free(&m);
        return dshim_text_take(&t);
    }
    text_t body = {0};
    int nsaid = comms_lines(&m, &body);
    /* MXNet jobs: the parameter server's rings */
    ps_model_t ps;
    dshim_diag_ps_build(&m, &ps);
    nsaid += dshim_diag_ps(&m, &ps, &body);
    first_error_line(set, &ps, &t);
    if (nsaid == 0) {
        idle_lines(&m, &ps, &t);
    }
    dshim_diag_ps_free(&ps);
    append_cut(&t, &body, max_lines);
    dshim_diag_model_free(&m);
    return dshim_text_take(&t);
}

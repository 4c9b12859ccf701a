/* Rank 0's watch over names that some ranks submitted and others did not
 * (Horovod's stall_inspector.cc): every HOROVOD_STALL_CHECK_TIME_SECONDS a
 * warning in Horovod's words names the missing ranks and, for each, up to
 * six of the names it has not submitted; past
 * HOROVOD_STALL_SHUTDOWN_TIME_SECONDS (> 0) the stalled names fail on every
 * rank and the engine shuts down, as Horovod's does.  Independently, a name
 * that waited longer than the communicator's timeout fails on every rank,
 * naming the ranks that did not submit it.
 *
 * Only rank 0's clock counts: its verdict ("every name that arrived at or
 * before round R and is still incomplete") travels in its next round, so
 * that every rank fails the same names in the same round. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "named.h"
#include "net.h"
#include "status.h"

typedef struct missing {
    int rank;
    const char *name;
    int doomed; /* past the shutdown time */
} missing_t;

static int cmp_missing(const void *a, const void *b)
{
    const missing_t *x = a, *y = b;
    if (x->rank != y->rank) {
        return x->rank < y->rank ? -1 : 1;
    }
    return strcmp(x->name, y->name);
}

typedef struct text {
    char *s;
    size_t len, cap;
} text_t;

static void put(text_t *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(text_t *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
        return;
    }
    if (t->len + (size_t)n + 1 > t->cap) {
        size_t cap = (t->cap ? t->cap * 2 : 1024) + (size_t)n;
        char *s = realloc(t->s, cap);
        if (!s) {
            return;
        }
        t->s = s;
        t->cap = cap;
    }
    va_start(ap, fmt);
    vsnprintf(t->s + t->len, t->cap - t->len, fmt, ap);
    va_end(ap);
    t->len += (size_t)n;
}

static void warn_stalled(dshim_named_t *eng, double now, double shutdown_s)
{
    size_t n = 0, cap = 0;
    missing_t *m = NULL;
    int should_shut_down = 0;
    uint64_t cutoff = 0;
    for (dshim_named_entry_t *e = eng->head; e; e = e->next) {
        double lag = now - e->first_time;
        if (e->ready || lag <= eng->stall_s) {
            continue;
        }
        int doomed = shutdown_s > 0 && lag > shutdown_s;
        for (int r = 0; r < eng->size; r++) {
            if (e->reqs[r] || eng->joined[r]) {
                continue;
            }
            if (n == cap) {
                cap = cap ? cap * 2 : 16;
                missing_t *g = realloc(m, cap * sizeof(*m));
                if (!g) {
                    free(m);
                    return;
                }
                m = g;
            }
            m[n++] = (missing_t){r, e->name, doomed};
            if (doomed) {
                should_shut_down = 1;
                cutoff = e->first_round;
            }
        }
    }
    if (n == 0) {
        free(m);
        return;
    }
    qsort(m, n, sizeof(*m), cmp_missing);
    text_t t = {0};
    put(&t, "One or more tensors were submitted to be reduced, gathered or broadcasted by subset of ranks and are "
            "waiting for remainder of ranks for more than %g seconds. This may indicate that different ranks are "
            "trying to submit different tensors or that only subset of ranks is submitting tensors, which will "
            "cause deadlock. \nMissing ranks:", eng->stall_s);
    for (size_t i = 0; i < n;) {
        size_t j = i;
        int doomed = 0;
        while (j < n && m[j].rank == m[i].rank) {
            doomed |= m[j].doomed;
            j++;
        }
        put(&t, "\n%d%s: [%s", m[i].rank, doomed ? "!" : "", m[i].name);
        /* Horovod's loop: up to five more names, then " ..." */
        int count = 0;
        for (size_t k = i + 1; k < j; k++) {
            put(&t, ", %s", m[k].name);
            if (++count == 5) {
                put(&t, " ...");
                break;
            }
        }
        put(&t, "]");
        i = j;
    }
    if (should_shut_down) {
        put(&t, "\nOne or more rank (marked by \"!\") is stalled for longer than %g seconds. Will shutdown.",
            shutdown_s);
    }
    if (t.s) {
        DSHIM_WARN("%s", t.s);
    }
    free(t.s);
    free(m);
    if (should_shut_down) {
        dshim_named_out_verdict(eng, DSHIM_NAMED_VERDICT_STALL, cutoff);
    }
}

void dshim_named_stall_check(dshim_named_t *eng)
{
    if (eng->rank != 0 || !eng->head) {
        return;
    }
    double now = dshim_now();
    if (eng->timeout_s > 0) {
        int found = 0;
        uint64_t cutoff = 0;
        for (dshim_named_entry_t *e = eng->head; e; e = e->next) {
            if (!e->ready && now - e->first_time > eng->timeout_s) {
                found = 1;
                cutoff = e->first_round > cutoff ? e->first_round : cutoff;
            }
        }
        if (found) {
            dshim_named_out_verdict(eng, DSHIM_NAMED_VERDICT_TIMEOUT, cutoff);
        }
    }
    if (!eng->stall_on || now - eng->last_stall_check <= eng->stall_s) {
        return;
    }
    eng->last_stall_check = now;
    double shutdown_s = eng->stall_stop_s;
    if (shutdown_s > 0 && shutdown_s < eng->stall_s) {
        if (!eng->stall_warned_bad_config) {
            DSHIM_WARN("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS is less than HOROVOD_STALL_CHECK_TIME_SECONDS, will not "
                       "shutdown.");
            eng->stall_warned_bad_config = 1;
        }
        shutdown_s = 0;
    }
    warn_stalled(eng, now, shutdown_s);
}

/*
 * The wait rule: what every operation that waits for other ranks (a step of
 * dshim_xfer, the host gate) does each time it looks while nothing moves,
 * once its spin is over and before it sleeps:
 *  - after 1 s of waiting, a collective marks in the store that this rank
 *    arrived at it (the other ranks' "did not arrive" lists read the marks);
 *  - after the communicator's timeout without progress, the operation fails
 *    with the one timeout message, and the ranks that did not arrive are
 *    kept as data with the failure (dshim_comm_get_missing);
 *  - every DSHIM_STALL_WARN without progress, a warning naming what the
 *    operation waits for and the ranks that have not arrived;
 *  - the flight recorder's entry says "waiting" (once per idle spell), and
 *    "moving" again when data moves.
 * The spin before sleeping stays the caller's: it is the hot path, and the
 * rule is entered only from the first look that would sleep.  What differs
 * between waiters (what they wait for, how they know who has not arrived,
 * what the recorder's entry waits for) comes from a dshim_wait_source_t.
 */
#ifndef DSHIM_WAIT_H
#define DSHIM_WAIT_H

#include <stddef.h>
#include <stdint.h>

#include "comm.h"
#include "config.h"

typedef struct dshim_wait_source {
    /* What the operation waits for, "receiving from rank 2 (host h, pid p)":
     * the messages say "while <it>". */
    void (*doing)(dshim_comm_t *comm, void *ctx, char *out, size_t len);
    /* The ranks that have not arrived at collective seq, ascending, into
     * out (room for comm->size); returns how many, or -1 when unknown.
     * NULL: the ranks' arrival marks in the store (dshim_wait_marks_missing). */
    int (*missing)(dshim_comm_t *comm, void *ctx, uint64_t seq, int *out, int *store_silent);
    /* The recorder's entries wait (naming whom), or move again.  NULL: the
     * collective's entry (comm->trace_op), naming nobody / moving. */
    void (*trace_waiting)(dshim_comm_t *comm, void *ctx);
    void (*trace_moving)(dshim_comm_t *comm, void *ctx);
    void *ctx;
} dshim_wait_source_t;

typedef struct dshim_wait {
    const dshim_coll_sig_t *sig;
    const dshim_wait_source_t *src;
    double stall_s;    /* DSHIM_STALL_WARN (0: no warnings) */
    double start;      /* the first idle look: the arrival mark counts from it (0: none yet) */
    double since;      /* the start of this idle spell: the timeout and warnings count from it */
    double warn_after; /* the next stall warning, seconds after `since` */
    int announced;     /* the arrival mark was written (or is not wanted) */
    int store_silent;  /* the store gave up once in this wait: not asked again */
    int traced;        /* the recorder's entries say waiting */
    int remark;        /* ... but the operation grew since: say it again */
} dshim_wait_t;

/* Before the operation's first look (inline: every step begins one, and
 * most never wait). */
static inline void dshim_wait_init(dshim_wait_t *w, const dshim_coll_sig_t *sig, const dshim_wait_source_t *src)
{
    w->sig = sig;
    w->src = src;
    w->stall_s = dshim_config()->stall_warn_s;
    w->start = w->since = 0;
    w->warn_after = w->stall_s;
    /* point-to-point messages are numbered per peer: their number would
     * pass for the collective of that number, so they mark nothing */
    w->announced = sig->coll == DSHIM_COLL_P2P;
    w->store_silent = 0;
    w->traced = 0;
    w->remark = 0;
}

/* An idle spell begins at `now` (nothing moved since the caller's last
 * look): the timeout and the stall warnings count from here. */
static inline void dshim_wait_idle(dshim_wait_t *w, double now)
{
    w->since = now;
    w->warn_after = w->stall_s;
    if (w->start == 0) {
        w->start = now;
    }
}

/* The look before a sleep, at `now`: the arrival mark, the timeout, the
 * stall warning, the recorder's entry.  DSHIM_OK: sleep at most *sleep_ms
 * (max_ms, less when the timeout comes sooner); else the timeout's failure
 * (the communicator failed, message set). */
dshim_status_t dshim_wait_look(dshim_comm_t *comm, dshim_wait_t *w, double now, int max_ms, int *sleep_ms);

void dshim_wait_moved(dshim_comm_t *comm, dshim_wait_t *w);
/* Data moved: the recorder's entries move again when they said waiting
 * (inline: the data loop asks after every move). */
static inline void dshim_wait_moving(dshim_comm_t *comm, dshim_wait_t *w)
{
    if (w->traced) {
        dshim_wait_moved(comm, w);
    }
}

/* The operation grew (a point-to-point batch absorbed requests): the
 * recorder's entries are marked waiting again at the next look. */
static inline void dshim_wait_remark(dshim_wait_t *w)
{
    w->remark = w->traced;
}

/* Fails the wait because rank `gone`, which had not arrived, exited: the
 * message names it and the ranks that did not arrive (missing[0..n)),
 * which the failure keeps as its verdict (DSHIM_ERR_PEER). */
dshim_status_t dshim_wait_fail_gone(dshim_comm_t *comm, const dshim_wait_t *w, int gone, const int *missing, int n);

/* Marks in the store that this rank waits in collective `seq` (the other
 * ranks' lists of who did not arrive); *store_silent set when the store did
 * not answer (best effort, bounded). */
void dshim_wait_announce(dshim_comm_t *comm, uint64_t seq, int *store_silent);

/* The ranks whose arrival mark is below seq, ascending, into out (room for
 * comm->size); -1 when the store does not answer (now, or earlier in this
 * wait: *store_silent). */
int dshim_wait_marks_missing(dshim_comm_t *comm, uint64_t seq, int *out, int *store_silent);

/* The ranks missing[0..n) as the messages list them, "2, 5" (n = 0: "none
 * known ...", n < 0: the store did not answer). */
void dshim_wait_list(const dshim_comm_t *comm, const int *missing, int n, char *out, size_t len);

/* The one place that words a timeout's cause: the torch plugin reports it
 * as is (python/dshim/_comm.py), and torch's own tests look for " timeout ". */
#define DSHIM_TIMEOUT_WHY                                                                                            \
    "(no progress for that long: the communicator's timeout for a stalled operation, DSHIM_TIMEOUT or the one the " \
    "framework set, e.g. torch's init_process_group timeout)"

#endif

/* The table of names: every rank's requests, as every rank received them in
 * the rounds, so that every rank runs the same bookkeeping and reaches the
 * same verdicts (ready, failed) in the same order without a coordinator.
 *
 * A name is ready once every rank submitted it or has joined (Horovod: a
 * joined rank counts as having submitted every name; it contributes zeros
 * to an allreduce).  Ready names go on the round's ready list in the order
 * the requests were read (rank by rank, request by request), then, after a
 * join, in the table's arrival order. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "named.h"
#include "net.h"
#include "status.h"

static int complete(const dshim_named_t *eng, const dshim_named_entry_t *e)
{
    if (e->count + eng->njoined < eng->size) {
        return 0;
    }
    for (int r = 0; r < eng->size; r++) {
        if (!e->reqs[r] && !eng->joined[r]) {
            return 0;
        }
    }
    return 1;
}

/* Room on the ready list for one more, made before an entry changes, so
 * that putting it there cannot fail half-way. */
static dshim_status_t ready_room(dshim_named_t *eng)
{
    if (eng->nready == eng->cap_ready) {
        size_t cap = eng->cap_ready ? eng->cap_ready * 2 : 64;
        dshim_named_entry_t **r = realloc(eng->ready, cap * sizeof(*r));
        if (!r) {
            return dshim_error(DSHIM_ERR_NOMEM, "rank %d: named operations: out of memory (ready list)", eng->rank);
        }
        eng->ready = r;
        eng->cap_ready = cap;
    }
    return DSHIM_OK;
}

static void push_ready(dshim_named_t *eng, dshim_named_entry_t *e)
{
    for (int r = 0; r < eng->size; r++) {
        if (e->reqs[r]) { /* one at least: the entry came with a request */
            dshim_named_tl_negotiating(eng, e, e->reqs[r]->kind);
            break;
        }
    }
    dshim_named_tl_event(eng, e->name, 'E', "", NULL); /* negotiation over */
    e->ready = 1;
    eng->ready[eng->nready++] = e;
}

dshim_status_t dshim_named_table_add(dshim_named_t *eng, int r, const dshim_named_req_t *req, const char *name,
                                     size_t name_len, dshim_named_op_t *mine)
{
    (void)name_len;
    DSHIM_CHECK(ready_room(eng));
    dshim_named_entry_t *e = dshim_named_map_get(&eng->table, name);
    if (!e) {
        e = calloc(1, sizeof(*e));
        if (e) {
            e->name = strdup(name);
            e->reqs = calloc((size_t)eng->size, sizeof(*e->reqs));
        }
        if (!e || !e->name || !e->reqs || dshim_named_map_put(&eng->table, &e->node, e->name, e) != DSHIM_OK) {
            if (e) {
                free(e->name);
                free(e->reqs);
                free(e);
            }
            return dshim_error(DSHIM_ERR_NOMEM, "rank %d: named operations: out of memory (table)", eng->rank);
        }
        e->first_round = eng->round;
        e->first_time = dshim_now();
        e->prev = eng->tail;
        if (eng->tail) {
            eng->tail->next = e;
        } else {
            eng->head = e;
        }
        eng->tail = e;
    }
    if (e->reqs[r]) {
        /* a rank's name is pending once on that rank (the submit refuses a
         * second): a second request means its first one was already
         * judged elsewhere, which the shared bookkeeping rules out */
        return dshim_error(DSHIM_ERR_INTERNAL, "rank %d: named operations: rank %d sent '%s' twice", eng->rank, r,
                           name);
    }
    /* the span begun (or, the timeline opened since the earlier ranks'
     * requests came in, begun now with their instants) before this rank's */
    dshim_named_tl_negotiating(eng, e, req->kind);
    e->reqs[r] = malloc(sizeof(*req) + req->data_len);
    if (!e->reqs[r]) {
        return dshim_error(DSHIM_ERR_NOMEM, "rank %d: named operations: out of memory (table)", eng->rank);
    }
    if (__atomic_load_n(&eng->tl.on, __ATOMIC_RELAXED)) {
        char who[16];
        snprintf(who, sizeof(who), "%d", r);
        dshim_named_tl_event(eng, e->name, 'X', who, NULL);
    }
    *e->reqs[r] = *req;
    if (req->data_len) {
        unsigned char *copy = (unsigned char *)(e->reqs[r] + 1);
        memcpy(copy, req->data, req->data_len);
        e->reqs[r]->data = copy;
    }
    e->count++;
    if (mine) {
        e->mine = mine;
    }
    if (!e->ready && complete(eng, e)) {
        push_ready(eng, e);
    }
    return DSHIM_OK;
}

void dshim_named_table_rescan(dshim_named_t *eng)
{
    for (dshim_named_entry_t *e = eng->head; e; e = e->next) {
        if (!e->ready && complete(eng, e) && ready_room(eng) == DSHIM_OK) {
            push_ready(eng, e); /* out of memory: found at the next join or never; the timeout ends it */
        }
    }
}

void dshim_named_entry_drop(dshim_named_t *eng, dshim_named_entry_t *e)
{
    dshim_named_map_del(&eng->table, e->name);
    if (e->prev) {
        e->prev->next = e->next;
    } else {
        eng->head = e->next;
    }
    if (e->next) {
        e->next->prev = e->prev;
    } else {
        eng->tail = e->prev;
    }
    for (int r = 0; r < eng->size; r++) {
        free(e->reqs[r]);
    }
    free(e->reqs);
    free(e->name);
    free(e);
}

void dshim_named_entry_fail(dshim_named_t *eng, dshim_named_entry_t *e, dshim_status_t st, const char *msg)
{
    if (e->mine) {
        dshim_named_complete(eng, e->mine, st, msg);
        e->mine = NULL;
    }
    dshim_named_entry_drop(eng, e);
}

/* "rank 1" / "ranks 0-2, 5" */
static void ranks_text(const dshim_named_t *eng, const unsigned char *in, char *out, size_t len)
{
    size_t at = 0;
    int n = 0;
    for (int r = 0; r < eng->size; r++) {
        n += in[r];
    }
    at += (size_t)snprintf(out, len, "%s", n == 1 ? "rank " : "ranks ");
    int first = 1;
    for (int r = 0; r < eng->size && at < len; r++) {
        if (!in[r]) {
            continue;
        }
        int end = r;
        while (end + 1 < eng->size && in[end + 1]) {
            end++;
        }
        if (end > r) {
            at += (size_t)snprintf(out + at, len - at, "%s%d-%d", first ? "" : ", ", r, end);
        } else {
            at += (size_t)snprintf(out + at, len - at, "%s%d", first ? "" : ", ", r);
        }
        first = 0;
        r = end;
    }
    if (n == 0) {
        snprintf(out, len, "no rank");
    }
}

void dshim_named_entry_ranks(const dshim_named_t *eng, const dshim_named_entry_t *e, int want, char *out, size_t len)
{
    unsigned char *in = calloc((size_t)eng->size, 1);
    if (!in) {
        snprintf(out, len, "(out of memory)");
        return;
    }
    for (int r = 0; r < eng->size; r++) {
        in[r] = want ? e->reqs[r] != NULL : (!e->reqs[r] && !eng->joined[r]);
    }
    ranks_text(eng, in, out, len);
    free(in);
}

static const dshim_named_req_t *first_req(const dshim_named_t *eng, const dshim_named_entry_t *e)
{
    for (int r = 0; r < eng->size; r++) {
        if (e->reqs[r]) {
            return e->reqs[r];
        }
    }
    return NULL;
}

void dshim_named_table_verdict(dshim_named_t *eng, int cause, uint64_t cutoff)
{
    dshim_named_entry_t *e = eng->head;
    while (e) {
        dshim_named_entry_t *next = e->next;
        if (!e->ready && e->first_round <= cutoff) {
            char missing[256], have[256], msg[1024];
            dshim_named_entry_ranks(eng, e, 0, missing, sizeof(missing));
            dshim_named_entry_ranks(eng, e, 1, have, sizeof(have));
            const dshim_named_req_t *q = first_req(eng, e);
            const char *kind = dshim_named_kind_name(q ? (dshim_named_kind_t)q->kind : DSHIM_NAMED_ALLREDUCE);
            if (cause == DSHIM_NAMED_VERDICT_STALL) {
                snprintf(msg, sizeof(msg),
                         "rank %d: %s '%s': stalled for longer than HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=%g s: %s "
                         "did not submit it (%s did); Horovod shuts down",
                         eng->rank, kind, e->name, eng->stall_stop_s, missing, have);
                dshim_named_entry_fail(eng, e, DSHIM_ERR_ABORTED, msg);
            } else {
                snprintf(msg, sizeof(msg),
                         "rank %d: %s '%s': %s did not submit it within the timeout of %g s (DSHIM_TIMEOUT or the "
                         "communicator's timeout; %s did)",
                         eng->rank, kind, e->name, missing, eng->timeout_s, have);
                dshim_named_entry_fail(eng, e, DSHIM_ERR_TIMEOUT, msg);
            }
        }
        e = next;
    }
}

void dshim_named_table_fail_all(dshim_named_t *eng, dshim_status_t st, const char *msg)
{
    while (eng->head) {
        dshim_named_entry_fail(eng, eng->head, st, msg);
    }
    eng->nready = 0;
    if (eng->join_op) {
        dshim_named_complete(eng, eng->join_op, st, msg);
        eng->join_op = NULL;
    }
}

void dshim_named_table_free(dshim_named_t *eng)
{
    while (eng->head) {
        dshim_named_entry_drop(eng, eng->head);
    }
    dshim_named_map_free(&eng->table);
    free(eng->ready);
    eng->ready = NULL;
    eng->nready = eng->cap_ready = 0;
}

/*
 * Reading one "dshim-trace" v1 dump (shim/trace/trace.h, trace_format.h):
 * the header line, then ring and entry lines, an entry's fields as
 * trace_fields.def lists them.  A line it cannot read is counted and
 * skipped; a dump whose header is not this format is refused.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flat_json.h"
#include "trace_read.h"

/* The state for its word (trace_format.h); -1 for a word it does not know. */
static int state_of(const char *s)
{
    for (int i = 0; i < DSHIM_TRACE_NSTATES; i++) {
        if (strcmp(s, dshim_trace_state_name(i)) == 0) {
            return i;
        }
    }
    return -1;
}

typedef struct {
    int format_ok, version;
    dshim_trace_dump_t *d;
} head_ctx_t;

static void head_kv(void *ctx, const char *key, const jval_t *v)
{
    head_ctx_t *h = ctx;
    dshim_trace_dump_t *d = h->d;
    if (strcmp(key, "format") == 0) {
        h->format_ok = v->type == JV_STR && strcmp(v->s, DSHIM_TRACE_FORMAT) == 0;
    } else if (strcmp(key, "version") == 0) {
        set_int(&h->version, v);
    } else if (strcmp(key, "rank") == 0) {
        set_int(&d->rank, v);
    } else if (strcmp(key, "size") == 0) {
        set_int(&d->size, v);
    } else if (strcmp(key, "host") == 0) {
        set_str(d->host, sizeof(d->host), v);
    } else if (strcmp(key, "pid") == 0) {
        set_long(&d->pid, v);
    } else if (strcmp(key, "reason") == 0) {
        set_str(d->reason, sizeof(d->reason), v);
    } else if (strcmp(key, "why") == 0) {
        set_str(d->why, sizeof(d->why), v);
    } else if (strcmp(key, "realtime_ns") == 0) {
        set_u64(&d->realtime_ns, v);
    } else if (strcmp(key, "monotonic_ns") == 0) {
        set_u64(&d->monotonic_ns, v);
    }
}

/* A line after the header: a ring or an entry, told apart by their keys. */
typedef struct {
    char ring[96];
    int has_ring, is_entry, has_capacity;
    dshim_trace_dring_t r;  /* ring fields */
    dshim_trace_rec_t e;    /* entry fields */
} line_ctx_t;

/* Ranks: the non-negative ones of an array of integers, at most cap. */
static void set_ranks(int *dst, int *n, int cap, const jval_t *v)
{
    if (v->type != JV_INTS) {
        return;
    }
    *n = 0;
    for (int i = 0; i < v->nints && *n < cap; i++) {
        if (v->ints[i] >= 0 && v->ints[i] <= INT32_MAX) {
            dst[(*n)++] = (int)v->ints[i];
        }
    }
}

/* An entry's fields (trace_fields.def); a key that is no field is ignored. */
static void entry_kv(line_ctx_t *l, const char *key, const jval_t *v)
{
    dshim_trace_rec_t *e = &l->e;
#define DSHIM_TRACE_U64(key_, ident, value)                                                                      \
    if (strcmp(key, #key_) == 0) {                                                                               \
        l->is_entry |= ident;                                                                                    \
        set_u64(&e->key_, v);                                                                                    \
        return;                                                                                                  \
    }
#define DSHIM_TRACE_SEQ(key_, ident, value) DSHIM_TRACE_U64(key_, ident, value)
#define DSHIM_TRACE_INT(key_, ident, value)                                                                      \
    if (strcmp(key, #key_) == 0) {                                                                               \
        l->is_entry |= ident;                                                                                    \
        set_int(&e->key_, v);                                                                                    \
        return;                                                                                                  \
    }
#define DSHIM_TRACE_STR(key_, cap, ident, value)                                                                 \
    if (strcmp(key, #key_) == 0) {                                                                               \
        l->is_entry |= ident;                                                                                    \
        set_str(e->key_, sizeof(e->key_), v);                                                                    \
        return;                                                                                                  \
    }
#define DSHIM_TRACE_STATE(key_, ident, value)                                                                    \
    if (strcmp(key, #key_) == 0) {                                                                               \
        l->is_entry |= ident;                                                                                    \
        if (v->type == JV_STR) {                                                                                 \
            e->key_ = state_of(v->s);                                                                            \
        }                                                                                                        \
        return;                                                                                                  \
    }
#define DSHIM_TRACE_RANKS(key_, nkey, cap, ident, value, n)                                                      \
    if (strcmp(key, #key_) == 0) {                                                                               \
        l->is_entry |= ident;                                                                                    \
        set_ranks(e->key_, &e->nkey, (cap), v);                                                                  \
        return;                                                                                                  \
    }
#include "trace_fields.def"
#undef DSHIM_TRACE_U64
#undef DSHIM_TRACE_SEQ
#undef DSHIM_TRACE_INT
#undef DSHIM_TRACE_STR
#undef DSHIM_TRACE_STATE
#undef DSHIM_TRACE_RANKS
}

static void line_kv(void *ctx, const char *key, const jval_t *v)
{
    line_ctx_t *l = ctx;
    if (strcmp(key, "ring") == 0) {
        l->has_ring = v->type == JV_STR;
        set_str(l->ring, sizeof(l->ring), v);
    } else if (strcmp(key, "desc") == 0) {
        set_str(l->r.desc, sizeof(l->r.desc), v);
    } else if (strcmp(key, "rank") == 0) {
        set_int(&l->r.rank, v);
    } else if (strcmp(key, "size") == 0) {
        set_int(&l->r.size, v);
    } else if (strcmp(key, "world_rank") == 0) {
        set_int(&l->r.world_rank, v);
    } else if (strcmp(key, "capacity") == 0) {
        l->has_capacity = 1;
        set_u64(&l->r.capacity, v);
    } else if (strcmp(key, "recorded") == 0) {
        set_u64(&l->r.recorded, v);
    } else if (strcmp(key, "dropped") == 0) {
        set_u64(&l->r.dropped, v);
    } else {
        entry_kv(l, key, v);
    }
}

static dshim_trace_dring_t *find_ring(dshim_trace_dump_t *d, const char *name)
{
    for (size_t i = 0; i < d->nrings; i++) {
        if (strcmp(d->rings[i].name, name) == 0) {
            return &d->rings[i];
        }
    }
    return NULL;
}

static dshim_trace_dring_t *add_ring(dshim_trace_dump_t *d, const char *name)
{
    dshim_trace_dring_t *rs = realloc(d->rings, (d->nrings + 1) * sizeof(*rs));
    if (rs == NULL) {
        return NULL;
    }
    d->rings = rs;
    dshim_trace_dring_t *r = &rs[d->nrings++];
    memset(r, 0, sizeof(*r));
    snprintf(r->name, sizeof(r->name), "%s", name);
    r->rank = r->size = r->world_rank = -1;
    return r;
}

static void one_line(dshim_trace_dump_t *d, const char *line, size_t len, jval_t *v)
{
    line_ctx_t l;
    memset(&l, 0, sizeof(l));
    l.r.rank = l.r.size = l.r.world_rank = -1;
    l.e.seq = DSHIM_TRACE_SEQ_NONE;
    l.e.root = l.e.peer = -1;
    l.e.state = -1;
    if (dshim_flat_json_parse(line, len, line_kv, &l, v) != 0 || !l.has_ring) {
        d->bad_lines++;
        return;
    }
    dshim_trace_dring_t *r = find_ring(d, l.ring);
    if (!l.is_entry) {
        /* a ring line (again: the later one wins) */
        if (r == NULL && (r = add_ring(d, l.ring)) == NULL) {
            d->bad_lines++;
            return;
        }
        snprintf(r->desc, sizeof(r->desc), "%s", l.r.desc);
        r->rank = l.r.rank;
        r->size = l.r.size;
        r->world_rank = l.r.world_rank;
        r->capacity = l.r.capacity;
        r->recorded = l.r.recorded;
        r->dropped = l.r.dropped;
        return;
    }
    /* an entry of a ring not announced: kept in a ring of unknown shape */
    if (r == NULL && (r = add_ring(d, l.ring)) == NULL) {
        d->bad_lines++;
        return;
    }
    if (r->n == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 16;
        dshim_trace_rec_t *recs = realloc(r->recs, cap * sizeof(*recs));
        if (recs == NULL) {
            d->bad_lines++;
            return;
        }
        r->recs = recs;
        r->cap = cap;
    }
    r->recs[r->n++] = l.e;
}

void dshim_trace_dump_free(dshim_trace_dump_t *d)
{
    if (d == NULL) {
        return;
    }
    for (size_t i = 0; i < d->nrings; i++) {
        free(d->rings[i].recs);
    }
    free(d->rings);
    memset(d, 0, sizeof(*d));
    d->rank = d->size = -1;
}

int dshim_trace_parse(const char *buf, size_t len, dshim_trace_dump_t *out)
{
    memset(out, 0, sizeof(*out));
    out->rank = out->size = -1;
    if (buf == NULL) {
        return -1;
    }
    jval_t *v = malloc(sizeof(*v));  /* 1 KiB of string scratch: off the stack of small threads */
    if (v == NULL) {
        return -1;
    }
    const char *p = buf, *end = buf + len, *line = NULL;
    size_t n = 0;
    int rc = -1;
    while (dshim_next_line(&p, end, &line, &n) && dshim_blank_line(line, n)) {
    }
    head_ctx_t h = {.d = out};
    if (line != NULL && !dshim_blank_line(line, n) && dshim_flat_json_parse(line, n, head_kv, &h, v) == 0 &&
        h.format_ok && h.version == DSHIM_TRACE_FORMAT_VERSION) {
        rc = 0;
        while (dshim_next_line(&p, end, &line, &n)) {
            if (!dshim_blank_line(line, n)) {
                one_line(out, line, n, v);
            }
        }
    }
    free(v);
    if (rc != 0) {
        dshim_trace_dump_free(out);
    }
    return rc;
}

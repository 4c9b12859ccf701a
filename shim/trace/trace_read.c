/*
 * Reading "dshim-trace" v1 dumps (trace.h) and dshim-run's launcher.jsonl
 * (trace_read.h).  The format is JSON Lines of flat objects whose values
 * are strings, integers or arrays of integers, so the parser here is a small
 * one for exactly that: anything else (floats, true/false/null, nested
 * values, which later versions might add) is skipped as a whole, and a line
 * it cannot read is counted and skipped.  Every read is bounded by the
 * buffer: dumps arrive from other hosts and from files anyone may edit.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#include "private_fs.h"
#include "trace.h"
#include "trace_read.h"

/* ---- a flat-object JSON reader -------------------------------------------- */

enum { JV_NONE, JV_STR, JV_INT, JV_INTS, JV_OTHER };

#define JV_STR_MAX 1024
#define JV_INTS_MAX 8

typedef struct {
    int type;
    char s[JV_STR_MAX];   /* JV_STR: decoded, NUL-terminated, cut at JV_STR_MAX - 1 bytes */
    int neg;              /* JV_INT: sign and magnitude, so both int64 and uint64 fit */
    uint64_t mag;
    int64_t ints[JV_INTS_MAX]; /* JV_INTS: the first JV_INTS_MAX elements */
    int nints;
} jval_t;

typedef struct {
    const char *p, *end;
} cur_t;

static void skip_ws(cur_t *c)
{
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\r' || *c->p == '\n')) {
        c->p++;
    }
}

static int hexval(char ch)
{
    if (ch >= '0' && ch <= '9') {
        return ch - '0';
    }
    if (ch >= 'a' && ch <= 'f') {
        return ch - 'a' + 10;
    }
    if (ch >= 'A' && ch <= 'F') {
        return ch - 'A' + 10;
    }
    return -1;
}

static int read_hex4(cur_t *c, unsigned *out)
{
    if (c->end - c->p < 4) {
        return -1;
    }
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(c->p[i]);
        if (h < 0) {
            return -1;
        }
        v = v * 16 + (unsigned)h;
    }
    c->p += 4;
    *out = v;
    return 0;
}

/* Appends bytes while they fit; a cut never splits a UTF-8 sequence. */
static void put_bytes(char *out, size_t cap, size_t *len, const char *b, size_t n)
{
    if (*len + n + 1 > cap) {
        return;  /* stays cut: later, shorter pieces must not be appended after a gap */
    }
    memcpy(out + *len, b, n);
    *len += n;
}

static void put_utf8(char *out, size_t cap, size_t *len, unsigned cp, int *full)
{
    char b[4];
    size_t n;
    if (cp < 0x80) {
        b[0] = (char)cp;
        n = 1;
    } else if (cp < 0x800) {
        b[0] = (char)(0xc0 | (cp >> 6));
        b[1] = (char)(0x80 | (cp & 0x3f));
        n = 2;
    } else if (cp < 0x10000) {
        b[0] = (char)(0xe0 | (cp >> 12));
        b[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        b[2] = (char)(0x80 | (cp & 0x3f));
        n = 3;
    } else {
        b[0] = (char)(0xf0 | (cp >> 18));
        b[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
        b[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
        b[3] = (char)(0x80 | (cp & 0x3f));
        n = 4;
    }
    if (*full || *len + n + 1 > cap) {
        *full = 1;
        return;
    }
    put_bytes(out, cap, len, b, n);
}

/* A string at c->p (the opening quote); decoded into out (may be NULL to skip). */
static int read_string(cur_t *c, char *out, size_t cap)
{
    if (c->p >= c->end || *c->p != '"') {
        return -1;
    }
    c->p++;
    size_t len = 0;
    int full = 0;
    char scratch[8];
    if (out == NULL) {
        out = scratch;
        cap = 1;
        full = 1;
    }
    while (c->p < c->end) {
        char ch = *c->p++;
        if (ch == '"') {
            out[len] = '\0';
            return 0;
        }
        if ((unsigned char)ch < 0x20) {
            return -1;  /* a raw control character: not JSON */
        }
        if (ch != '\\') {
            if (!full && len + 2 <= cap) {
                out[len++] = ch;
            } else if (!full) {
                /* cut here, backing off to the start of a UTF-8 sequence */
                while (len > 0 && ((unsigned char)out[len - 1] & 0xc0) == 0x80) {
                    len--;
                }
                if (len > 0 && ((unsigned char)out[len - 1] & 0x80)) {
                    len--;
                }
                full = 1;
            }
            continue;
        }
        if (c->p >= c->end) {
            return -1;
        }
        char e = *c->p++;
        unsigned cp = 0;
        switch (e) {
        case '"': cp = '"'; break;
        case '\\': cp = '\\'; break;
        case '/': cp = '/'; break;
        case 'b': cp = '\b'; break;
        case 'f': cp = '\f'; break;
        case 'n': cp = '\n'; break;
        case 'r': cp = '\r'; break;
        case 't': cp = '\t'; break;
        case 'u':
            if (read_hex4(c, &cp) != 0) {
                return -1;
            }
            if (cp >= 0xd800 && cp < 0xdc00) {
                /* a high surrogate: combined with a following low one, else U+FFFD */
                unsigned lo = 0;
                cur_t save = *c;
                if (c->end - c->p >= 6 && c->p[0] == '\\' && c->p[1] == 'u') {
                    c->p += 2;
                    if (read_hex4(c, &lo) == 0 && lo >= 0xdc00 && lo < 0xe000) {
                        cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                    } else {
                        *c = save;
                        cp = 0xfffd;
                    }
                } else {
                    cp = 0xfffd;
                }
            } else if (cp >= 0xdc00 && cp < 0xe000) {
                cp = 0xfffd;
            }
            if (cp == 0) {
                cp = 0xfffd;  /* keep strings NUL-free */
            }
            break;
        default:
            return -1;
        }
        if (out != scratch) {
            put_utf8(out, cap, &len, cp, &full);
        }
    }
    return -1;  /* unterminated */
}

/* A number: integers keep their value; fractions and exponents make it JV_OTHER. */
static int read_number(cur_t *c, jval_t *v)
{
    int neg = 0;
    if (c->p < c->end && *c->p == '-') {
        neg = 1;
        c->p++;
    }
    if (c->p >= c->end || *c->p < '0' || *c->p > '9') {
        return -1;
    }
    uint64_t mag = 0;
    int overflow = 0;
    while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
        unsigned d = (unsigned)(*c->p - '0');
        if (mag > (UINT64_MAX - d) / 10) {
            overflow = 1;
        } else {
            mag = mag * 10 + d;
        }
        c->p++;
    }
    int other = overflow;
    if (c->p < c->end && *c->p == '.') {
        c->p++;
        other = 1;
        while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
            c->p++;
        }
    }
    if (c->p < c->end && (*c->p == 'e' || *c->p == 'E')) {
        c->p++;
        other = 1;
        if (c->p < c->end && (*c->p == '+' || *c->p == '-')) {
            c->p++;
        }
        while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
            c->p++;
        }
    }
    if (v) {
        v->type = other ? JV_OTHER : JV_INT;
        v->neg = neg;
        v->mag = mag;
    }
    return 0;
}

static int skip_value(cur_t *c, int depth);

static int skip_container(cur_t *c, char close, int depth)
{
    if (depth > 32) {
        return -1;  /* a deep nest is garbage here; bounded recursion */
    }
    c->p++;
    skip_ws(c);
    if (c->p < c->end && *c->p == close) {
        c->p++;
        return 0;
    }
    for (;;) {
        skip_ws(c);
        if (close == '}') {
            if (read_string(c, NULL, 0) != 0) {
                return -1;
            }
            skip_ws(c);
            if (c->p >= c->end || *c->p != ':') {
                return -1;
            }
            c->p++;
            skip_ws(c);
        }
        if (skip_value(c, depth + 1) != 0) {
            return -1;
        }
        skip_ws(c);
        if (c->p >= c->end) {
            return -1;
        }
        if (*c->p == ',') {
            c->p++;
            continue;
        }
        if (*c->p == close) {
            c->p++;
            return 0;
        }
        return -1;
    }
}

static int skip_word(cur_t *c, const char *w)
{
    size_t n = strlen(w);
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, w, n) != 0) {
        return -1;
    }
    c->p += n;
    return 0;
}

static int skip_value(cur_t *c, int depth)
{
    if (c->p >= c->end) {
        return -1;
    }
    switch (*c->p) {
    case '"': return read_string(c, NULL, 0);
    case '{': return skip_container(c, '}', depth);
    case '[': return skip_container(c, ']', depth);
    case 't': return skip_word(c, "true");
    case 'f': return skip_word(c, "false");
    case 'n': return skip_word(c, "null");
    default: return read_number(c, NULL);
    }
}

/* An array: of integers only it is JV_INTS, anything else JV_OTHER. */
static int read_array(cur_t *c, jval_t *v)
{
    cur_t start = *c;
    c->p++;
    v->type = JV_INTS;
    v->nints = 0;
    skip_ws(c);
    if (c->p < c->end && *c->p == ']') {
        c->p++;
        return 0;
    }
    for (;;) {
        skip_ws(c);
        jval_t num;
        if (c->p < c->end && (*c->p == '-' || (*c->p >= '0' && *c->p <= '9'))) {
            if (read_number(c, &num) != 0) {
                return -1;
            }
            if (num.type != JV_INT || num.mag > (uint64_t)INT64_MAX) {
                v->type = JV_OTHER;
            } else if (v->nints < JV_INTS_MAX) {
                v->ints[v->nints++] = num.neg ? -(int64_t)num.mag : (int64_t)num.mag;
            }
        } else {
            *c = start;
            v->type = JV_OTHER;
            return skip_value(c, 0);
        }
        skip_ws(c);
        if (c->p >= c->end) {
            return -1;
        }
        if (*c->p == ',') {
            c->p++;
            continue;
        }
        if (*c->p == ']') {
            c->p++;
            return 0;
        }
        return -1;
    }
}

typedef void (*kv_cb)(void *ctx, const char *key, const jval_t *v);

/* One line holding one object; cb for every key.  0, or -1 when the line is
 * not one whole object (cb may have been called for keys before the fault:
 * callers parse into a scratch record and use it only on success). */
static int parse_object(const char *line, size_t len, kv_cb cb, void *ctx, jval_t *v)
{
    cur_t c = {line, line + len};
    skip_ws(&c);
    if (c.p >= c.end || *c.p != '{') {
        return -1;
    }
    c.p++;
    skip_ws(&c);
    if (c.p < c.end && *c.p == '}') {
        c.p++;
        skip_ws(&c);
        return c.p == c.end ? 0 : -1;
    }
    for (;;) {
        char key[32];
        skip_ws(&c);
        if (read_string(&c, key, sizeof(key)) != 0) {
            return -1;
        }
        skip_ws(&c);
        if (c.p >= c.end || *c.p != ':') {
            return -1;
        }
        c.p++;
        skip_ws(&c);
        if (c.p >= c.end) {
            return -1;
        }
        v->type = JV_NONE;
        int rc;
        if (*c.p == '"') {
            v->type = JV_STR;
            rc = read_string(&c, v->s, sizeof(v->s));
        } else if (*c.p == '[') {
            rc = read_array(&c, v);
        } else if (*c.p == '-' || (*c.p >= '0' && *c.p <= '9')) {
            rc = read_number(&c, v);
        } else {
            v->type = JV_OTHER;
            rc = skip_value(&c, 0);
        }
        if (rc != 0) {
            return -1;
        }
        cb(ctx, key, v);
        skip_ws(&c);
        if (c.p >= c.end) {
            return -1;
        }
        if (*c.p == ',') {
            c.p++;
            continue;
        }
        if (*c.p == '}') {
            c.p++;
            skip_ws(&c);
            return c.p == c.end ? 0 : -1;
        }
        return -1;
    }
}

/* ---- typed fields ------------------------------------------------------- */

/* Copies src cut to cap - 1 bytes, never in the middle of a UTF-8 sequence. */
static void copy_str(char *dst, size_t cap, const char *src)
{
    size_t n = strlen(src);
    if (n >= cap) {
        n = cap - 1;
        while (n > 0 && ((unsigned char)src[n] & 0xc0) == 0x80) {
            n--;  /* src[n] would start the cut-off part: a continuation byte belongs to the char before */
        }
    }
    memcpy(dst, src, n);
    dst[n] = '\0';
}

static void set_str(char *dst, size_t cap, const jval_t *v)
{
    if (v->type == JV_STR) {
        copy_str(dst, cap, v->s);
    }
}

static void set_u64(uint64_t *dst, const jval_t *v)
{
    if (v->type == JV_INT && !v->neg) {
        *dst = v->mag;
    }
}

static void set_int(int *dst, const jval_t *v)
{
    if (v->type == JV_INT && v->mag <= (uint64_t)INT32_MAX + (v->neg ? 1 : 0)) {
        *dst = v->neg ? (int)-(int64_t)v->mag : (int)v->mag;
    }
}

static void set_long(long *dst, const jval_t *v)
{
    if (v->type == JV_INT && v->mag <= (uint64_t)INT64_MAX) {
        *dst = v->neg ? -(long)v->mag : (long)v->mag;
    }
}

static int state_of(const char *s)
{
    static const char *const names[] = {"queued", "started", "waiting", "done", "failed"};
    for (int i = 0; i < 5; i++) {
        if (strcmp(s, names[i]) == 0) {
            return i;
        }
    }
    return -1;
}

/* ---- dump files ----------------------------------------------------------- */

typedef struct {
    int format_ok, version;
    dshim_trace_dump_t *d;
} head_ctx_t;

static void head_kv(void *ctx, const char *key, const jval_t *v)
{
    head_ctx_t *h = ctx;
    dshim_trace_dump_t *d = h->d;
    if (strcmp(key, "format") == 0) {
        h->format_ok = v->type == JV_STR && strcmp(v->s, "dshim-trace") == 0;
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
    } else if (strcmp(key, "id") == 0) {
        l->is_entry = 1;
        set_u64(&l->e.id, v);
    } else if (strcmp(key, "seq") == 0) {
        l->is_entry = 1;
        set_u64(&l->e.seq, v);
    } else if (strcmp(key, "op") == 0) {
        l->is_entry = 1;
        set_str(l->e.op, sizeof(l->e.op), v);
    } else if (strcmp(key, "dtype") == 0) {
        set_str(l->e.dtype, sizeof(l->e.dtype), v);
    } else if (strcmp(key, "count") == 0) {
        set_u64(&l->e.count, v);
    } else if (strcmp(key, "bytes") == 0) {
        set_u64(&l->e.bytes, v);
    } else if (strcmp(key, "root") == 0) {
        set_int(&l->e.root, v);
    } else if (strcmp(key, "peer") == 0) {
        set_int(&l->e.peer, v);
    } else if (strcmp(key, "redop") == 0) {
        set_str(l->e.redop, sizeof(l->e.redop), v);
    } else if (strcmp(key, "label") == 0) {
        set_str(l->e.label, sizeof(l->e.label), v);
    } else if (strcmp(key, "state") == 0) {
        if (v->type == JV_STR) {
            l->e.state = state_of(v->s);
        }
    } else if (strcmp(key, "waiting_for") == 0) {
        if (v->type == JV_INTS) {
            l->e.nwaiting = 0;
            for (int i = 0; i < v->nints; i++) {
                if (v->ints[i] >= 0 && v->ints[i] <= INT32_MAX) {
                    l->e.waiting_for[l->e.nwaiting++] = (int)v->ints[i];
                }
            }
        }
    } else if (strcmp(key, "algo") == 0) {
        set_str(l->e.algo, sizeof(l->e.algo), v);
    } else if (strcmp(key, "transport") == 0) {
        set_str(l->e.transport, sizeof(l->e.transport), v);
    } else if (strcmp(key, "t_queued_ns") == 0) {
        set_u64(&l->e.t_queued_ns, v);
    } else if (strcmp(key, "t_started_ns") == 0) {
        set_u64(&l->e.t_started_ns, v);
    } else if (strcmp(key, "t_done_ns") == 0) {
        set_u64(&l->e.t_done_ns, v);
    } else if (strcmp(key, "wait_ns") == 0) {
        set_u64(&l->e.wait_ns, v);
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
    if (parse_object(line, len, line_kv, &l, v) != 0 || !l.has_ring) {
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

/* Next line of [*p, end): its start and length; advances *p past its '\n'. */
static int next_line(const char **p, const char *end, const char **line, size_t *len)
{
    if (*p >= end) {
        return 0;
    }
    const char *nl = memchr(*p, '\n', (size_t)(end - *p));
    *line = *p;
    *len = nl ? (size_t)(nl - *p) : (size_t)(end - *p);
    *p = nl ? nl + 1 : end;
    return 1;
}

static int blank(const char *line, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        if (line[i] != ' ' && line[i] != '\t' && line[i] != '\r') {
            return 0;
        }
    }
    return 1;
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
    while (next_line(&p, end, &line, &n) && blank(line, n)) {
    }
    head_ctx_t h = {.d = out};
    if (line != NULL && !blank(line, n) && parse_object(line, n, head_kv, &h, v) == 0 && h.format_ok &&
        h.version == 1) {
        rc = 0;
        while (next_line(&p, end, &line, &n)) {
            if (!blank(line, n)) {
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

/* ---- launcher.jsonl --------------------------------------------------------- */

typedef struct {
    dshim_trace_proc_t p;
    int format_ok, version;
    double wait_ms;
} proc_ctx_t;

static const char *const proc_states[] = {"unknown", "running", "exited", "killed"};

static void proc_kv(void *ctx, const char *key, const jval_t *v)
{
    proc_ctx_t *c = ctx;
    if (strcmp(key, "format") == 0) {
        c->format_ok = v->type == JV_STR && strcmp(v->s, "dshim-run-procs") == 0;
    } else if (strcmp(key, "version") == 0) {
        set_int(&c->version, v);
    } else if (strcmp(key, "wait_ms") == 0) {
        int ms = 0;
        set_int(&ms, v);
        c->wait_ms = ms;
    } else if (strcmp(key, "rank") == 0) {
        set_int(&c->p.rank, v);
    } else if (strcmp(key, "name") == 0) {
        set_str(c->p.name, sizeof(c->p.name), v);
    } else if (strcmp(key, "host") == 0) {
        set_str(c->p.host, sizeof(c->p.host), v);
    } else if (strcmp(key, "pid") == 0) {
        set_long(&c->p.pid, v);
    } else if (strcmp(key, "state") == 0 && v->type == JV_STR) {
        for (int i = 0; i < 4; i++) {
            if (strcmp(v->s, proc_states[i]) == 0) {
                c->p.state = (dshim_trace_proc_state_t)i;
            }
        }
    } else if (strcmp(key, "code") == 0) {
        set_int(&c->p.code, v);
    } else if (strcmp(key, "signal") == 0) {
        set_int(&c->p.sig, v);
    } else if (strcmp(key, "pstate") == 0 && v->type == JV_STR) {
        c->p.pstate = (v->s[0] >= 'A' && v->s[0] <= 'z') ? v->s[0] : 0;
    } else if (strcmp(key, "asked") == 0) {
        set_int(&c->p.asked, v);
    } else if (strcmp(key, "answered") == 0) {
        set_int(&c->p.answered, v);
    } else if (strcmp(key, "first_failure") == 0) {
        set_int(&c->p.first_failure, v);
    }
}

static int parse_procs_wait(const char *buf, size_t len, dshim_trace_proc_t **procs, size_t *np, double *wait_s)
{
    *procs = NULL;
    *np = 0;
    if (buf == NULL) {
        return -1;
    }
    jval_t *v = malloc(sizeof(*v));
    if (v == NULL) {
        return -1;
    }
    const char *p = buf, *end = buf + len, *line = NULL;
    size_t n = 0, cap = 0;
    int rc = -1;
    while (next_line(&p, end, &line, &n) && blank(line, n)) {
    }
    proc_ctx_t c;
    memset(&c, 0, sizeof(c));
    if (line != NULL && !blank(line, n) && parse_object(line, n, proc_kv, &c, v) == 0 && c.format_ok &&
        c.version == 1) {
        rc = 0;
        if (wait_s) {
            *wait_s = c.wait_ms / 1000.0;
        }
        while (next_line(&p, end, &line, &n)) {
            if (blank(line, n)) {
                continue;
            }
            memset(&c.p, 0, sizeof(c.p));
            c.p.rank = -1;
            if (parse_object(line, n, proc_kv, &c, v) != 0) {
                continue;
            }
            if (*np == cap) {
                size_t ncap = cap ? cap * 2 : 8;
                dshim_trace_proc_t *ps = realloc(*procs, ncap * sizeof(*ps));
                if (ps == NULL) {
                    break;
                }
                *procs = ps;
                cap = ncap;
            }
            (*procs)[(*np)++] = c.p;
        }
    }
    free(v);
    return rc;
}

int dshim_trace_parse_procs(const char *buf, size_t len, dshim_trace_proc_t **procs, size_t *n)
{
    return parse_procs_wait(buf, len, procs, n, NULL);
}

static void put_json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') {
            fprintf(f, "\\%c", *p);
        } else if (*p < 0x20) {
            fprintf(f, "\\u%04x", *p);
        } else {
            fputc(*p, f);
        }
    }
    fputc('"', f);
}

int dshim_trace_write_procs(const char *path, const dshim_trace_proc_t *procs, size_t n, double wait_s)
{
    int fd = dshim_private_open(path, DSHIM_OPEN_TRUNC);  /* in a dump directory: private_fs.h */
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (f == NULL) {
        if (fd >= 0) {
            close(fd);
        }
        return -1;
    }
    fprintf(f, "{\"format\":\"dshim-run-procs\",\"version\":1,\"wait_ms\":%d}\n", (int)(wait_s * 1000.0 + 0.5));
    for (size_t i = 0; i < n; i++) {
        const dshim_trace_proc_t *p = &procs[i];
        fprintf(f, "{\"rank\":%d,\"name\":", p->rank);
        put_json_string(f, p->name);
        fputs(",\"host\":", f);
        put_json_string(f, p->host);
        char ps[2] = {p->pstate, 0};
        fprintf(f, ",\"pid\":%ld,\"state\":\"%s\",\"code\":%d,\"signal\":%d,\"pstate\":", p->pid,
                proc_states[(unsigned)p->state < 4 ? p->state : 0], p->code, p->sig);
        put_json_string(f, ps);
        fprintf(f, ",\"asked\":%d,\"answered\":%d,\"first_failure\":%d}\n", p->asked, p->answered,
                p->first_failure);
    }
    return fclose(f) == 0 ? 0 : -1;
}

/* ---- a directory of dumps ----------------------------------------------- */

void dshim_trace_set_add(dshim_trace_set_t *set, dshim_trace_dump_t *d)
{
    for (size_t i = 0; i < set->n; i++) {
        dshim_trace_dump_t *o = &set->dumps[i];
        if (o->pid == d->pid && strcmp(o->host, d->host) == 0 && o->rank == d->rank) {
            /* the same process dumped twice (its own failure, then our signal): the newer wins */
            if (d->realtime_ns >= o->realtime_ns) {
                dshim_trace_dump_free(o);
                *o = *d;
            } else {
                dshim_trace_dump_free(d);
            }
            memset(d, 0, sizeof(*d));
            return;
        }
    }
    dshim_trace_dump_t *ds = realloc(set->dumps, (set->n + 1) * sizeof(*ds));
    if (ds == NULL) {
        dshim_trace_dump_free(d);
        return;
    }
    set->dumps = ds;
    ds[set->n++] = *d;
    memset(d, 0, sizeof(*d));
}

void dshim_trace_set_free(dshim_trace_set_t *set)
{
    for (size_t i = 0; i < set->n; i++) {
        dshim_trace_dump_free(&set->dumps[i]);
    }
    free(set->dumps);
    free(set->procs);
    memset(set, 0, sizeof(*set));
}

/* The whole file, NUL-terminated; NULL when unreadable or over 1 GiB. */
static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        return NULL;
    }
    size_t cap = 65536, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (n + 1 >= cap) {
            if (cap >= ((size_t)1 << 30)) {
                free(buf);
                buf = NULL;
                break;
            }
            char *b = realloc(buf, cap * 2);
            if (b == NULL) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = b;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        if (got == 0) {
            break;
        }
        n += got;
    }
    fclose(f);
    if (buf) {
        buf[n] = '\0';
        *len = n;
    }
    return buf;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

int dshim_trace_load_dir(const char *dir, dshim_trace_set_t *set, char *err, size_t errlen)
{
    memset(set, 0, sizeof(*set));
    DIR *dp = opendir(dir);
    if (dp == NULL) {
        snprintf(err, errlen, "cannot read %s: %s", dir, strerror(errno));
        return -1;
    }
    struct dirent *de;
    while ((de = readdir(dp)) != NULL) {
        const char *name = de->d_name;
        int is_dump = strncmp(name, "dshim-trace.", 12) == 0 && ends_with(name, ".jsonl");
        int is_procs = strcmp(name, "launcher.jsonl") == 0;
        if (!is_dump && !is_procs) {
            continue;
        }
        char path[4096];
        snprintf(path, sizeof(path), "%s/%s", dir, name);
        struct stat st;
        if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) {
            continue;
        }
        size_t len = 0;
        char *buf = read_file(path, &len);
        if (buf == NULL) {
            continue;
        }
        if (is_procs) {
            free(set->procs);
            set->procs = NULL;
            set->nprocs = 0;
            if (parse_procs_wait(buf, len, &set->procs, &set->nprocs, &set->wait_s) != 0) {
                free(set->procs);
                set->procs = NULL;
                set->nprocs = 0;
            }
        } else {
            dshim_trace_dump_t d;
            if (dshim_trace_parse(buf, len, &d) == 0) {
                snprintf(d.file, sizeof(d.file), "%s", name);
                dshim_trace_set_add(set, &d);
            }
        }
        free(buf);
    }
    closedir(dp);
    return 0;
}

/* ---- ranks as ranges ------------------------------------------------------ */

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

void dshim_trace_ranges(const int *ranks, size_t n, char *out, size_t cap)
{
    if (cap == 0) {
        return;
    }
    out[0] = '\0';
    int *s = malloc((n ? n : 1) * sizeof(*s));
    if (s == NULL) {
        return;
    }
    if (n > 0) {
        memcpy(s, ranks, n * sizeof(*s));
    }
    qsort(s, n, sizeof(*s), cmp_int);
    size_t len = 0;
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j + 1 < n && (s[j + 1] == s[j] || s[j + 1] == s[j] + 1)) {
            j++;
        }
        char piece[40];
        if (s[j] == s[i]) {
            snprintf(piece, sizeof(piece), "%s%d", len ? "," : "", s[i]);
        } else if (s[j] == s[i] + 1) {
            snprintf(piece, sizeof(piece), "%s%d,%d", len ? "," : "", s[i], s[j]);
        } else {
            snprintf(piece, sizeof(piece), "%s%d-%d", len ? "," : "", s[i], s[j]);
        }
        size_t pl = strlen(piece);
        if (len + pl + 4 > cap) {
            if (len + 4 <= cap) {
                memcpy(out + len, "...", 4);
            }
            break;
        }
        memcpy(out + len, piece, pl + 1);
        len += pl;
        i = j + 1;
    }
    free(s);
}

/* Encoding of the agent's job description (see spec.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base64.h"
#include "spec.h"

#define SPEC_MAGIC "dshim-spec/1"

typedef struct {
    char *buf;
    size_t len, cap;
} sbuf_t;

static void sb_put(sbuf_t *b, const void *p, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->len + n + 1) {
            cap *= 2;
        }
        b->buf = realloc(b->buf, cap);
        if (b->buf == NULL) {
            fprintf(stderr, "dshim-run: out of memory\n");
            exit(1);
        }
        b->cap = cap;
    }
    memcpy(b->buf + b->len, p, n);
    b->len += n;
    b->buf[b->len] = '\0';
}

static void ns_put(sbuf_t *b, const char *s)
{
    char head[32];
    size_t n = strlen(s);
    int h = snprintf(head, sizeof(head), "%zu:", n);
    sb_put(b, head, (size_t)h);
    sb_put(b, s, n);
    sb_put(b, ",", 1);
}

static void ns_put_int(sbuf_t *b, long v)
{
    char s[32];
    snprintf(s, sizeof(s), "%ld", v);
    ns_put(b, s);
}

/* The description as base64 text (malloc'ed, NUL-terminated). */
static char *b64_encode(const unsigned char *in, size_t n)
{
    char *out = run_xmalloc(4 * ((n + 2) / 3) + 1);
    out[run_b64_encode(in, n, out)] = '\0';
    return out;
}

/* A description received on stdin (a line end is not part of it). */
static unsigned char *b64_decode(const char *in, size_t *n_out)
{
    size_t n = strlen(in);
    while (n > 0 && (in[n - 1] == '\n' || in[n - 1] == '\r')) {
        n--;
    }
    unsigned char *out = run_xmalloc(n / 4 * 3 + 1);
    long got = run_b64_decode(in, n, out);
    if (got < 0) {
        free(out);
        return NULL;
    }
    *n_out = (size_t)got;
    return out;
}

char *run_spec_encode(const run_plan_t *plan, int first, int count)
{
    sbuf_t b = {0};
    ns_put(&b, SPEC_MAGIC);
    ns_put(&b, plan->cwd);
    char grace[32];
    snprintf(grace, sizeof(grace), "%.3f", plan->grace_s);
    ns_put(&b, grace);
    ns_put_int(&b, plan->nenv);
    for (int i = 0; i < plan->nenv; i++) {
        ns_put(&b, plan->env[i]);
    }
    ns_put_int(&b, count);
    for (int p = first; p < first + count; p++) {
        const run_proc_t *pr = &plan->procs[p];
        ns_put_int(&b, p);
        ns_put(&b, pr->name);
        ns_put_int(&b, pr->nenv);
        for (int i = 0; i < pr->nenv; i++) {
            ns_put(&b, pr->env[i]);
        }
        ns_put_int(&b, pr->nargv);
        for (int i = 0; i < pr->nargv; i++) {
            ns_put(&b, pr->argv[i]);
        }
    }
    /* the flight-recorder directory: "<owned 0|1>:<dir>", "" when none (collect.h) */
    char *trace = NULL;
    if (asprintf(&trace, "%s%s%s", plan->trace_dir ? (plan->trace_owned ? "1" : "0") : "",
                 plan->trace_dir ? ":" : "", plan->trace_dir ? plan->trace_dir : "") < 0) {
        run_usage_error("out of memory");
    }
    ns_put(&b, trace);
    free(trace);
    ns_put(&b, plan->jobdir ? plan->jobdir : "");
    char *out = b64_encode((unsigned char *)b.buf, b.len);
    free(b.buf);
    return out;
}

typedef struct {
    const char *p, *end;
    int bad;
} reader_t;

static char *ns_get(reader_t *r)
{
    if (r->bad) {
        return NULL;
    }
    size_t n = 0;
    const char *p = r->p;
    while (p < r->end && *p >= '0' && *p <= '9' && n < (1u << 28)) {
        n = n * 10 + (size_t)(*p++ - '0');
    }
    if (p >= r->end || *p != ':' || p == r->p || (size_t)(r->end - p - 1) < n + 1 || p[1 + n] != ',') {
        r->bad = 1;
        return NULL;
    }
    char *s = strndup(p + 1, n);
    r->p = p + 2 + n;
    return s;
}

static long ns_get_int(reader_t *r, long max)
{
    char *s = ns_get(r);
    if (s == NULL) {
        return -1;
    }
    char *end = NULL;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < 0 || v > max) {
        r->bad = 1;
        v = -1;
    }
    free(s);
    return v;
}

static void get_strv(reader_t *r, run_strv_t *sv)
{
    long n = ns_get_int(r, 1 << 20);
    for (long i = 0; i < n && !r->bad; i++) {
        char *s = ns_get(r);
        if (s) {
            run_strv_add(sv, s);
            free(s);
        }
    }
}

int run_spec_decode(const char *b64, run_spec_t *spec, char *err, size_t errlen)
{
    memset(spec, 0, sizeof(*spec));
    size_t n = 0;
    unsigned char *raw = b64_decode(b64, &n);
    if (raw == NULL) {
        snprintf(err, errlen, "job description is not base64 (is this dshim-run the same version as the "
                 "controller's?)");
        return -1;
    }
    reader_t r = {(const char *)raw, (const char *)raw + n, 0};
    char *magic = ns_get(&r);
    if (magic == NULL || strcmp(magic, SPEC_MAGIC) != 0) {
        snprintf(err, errlen, "job description has the wrong format (expected %s; install the same dshim-run "
                 "version on every host)", SPEC_MAGIC);
        free(magic);
        free(raw);
        return -1;
    }
    free(magic);
    spec->cwd = ns_get(&r);
    char *grace = ns_get(&r);
    spec->grace_s = grace ? atof(grace) : 5.0;
    free(grace);
    get_strv(&r, &spec->env);
    long np = ns_get_int(&r, 1 << 20);
    if (np > 0) {
        spec->procs = run_xmalloc((size_t)np * sizeof(*spec->procs));
    }
    for (long i = 0; i < np && !r.bad; i++) {
        run_spec_proc_t *p = &spec->procs[i];
        p->index = (int)ns_get_int(&r, 1 << 24);
        p->name = ns_get(&r);
        get_strv(&r, &p->env);
        get_strv(&r, &p->argv);
        spec->nprocs++;
    }
    char *trace = ns_get(&r);
    if (trace && (trace[0] == '0' || trace[0] == '1') && trace[1] == ':') {
        spec->trace_owned = trace[0] == '1';
        spec->trace_dir = run_xstrdup(trace + 2);
    } else {
        spec->trace_dir = run_xstrdup("");
    }
    free(trace);
    spec->jobdir = ns_get(&r);
    free(raw);
    if (r.bad || spec->cwd == NULL || spec->nprocs != np || spec->jobdir == NULL) {
        snprintf(err, errlen, "job description is truncated or corrupt");
        run_spec_free(spec);
        return -1;
    }
    for (int i = 0; i < spec->nprocs; i++) {
        if (spec->procs[i].argv.n == 0 || spec->procs[i].name == NULL) {
            snprintf(err, errlen, "job description has a process without a command");
            return -1;
        }
    }
    return 0;
}

void run_spec_free(run_spec_t *spec)
{
    for (int i = 0; i < spec->nprocs; i++) {
        free(spec->procs[i].name);
        run_strv_free(&spec->procs[i].env);
        run_strv_free(&spec->procs[i].argv);
    }
    free(spec->procs);
    free(spec->cwd);
    free(spec->trace_dir);
    free(spec->jobdir);
    run_strv_free(&spec->env);
    memset(spec, 0, sizeof(*spec));
}

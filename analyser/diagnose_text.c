/* The text the diagnosis and the status are written into, and how they
 * write numbers, times and operations (diagnose_impl.h). */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "diagnose_impl.h"

static void tx_vadd(text_t *t, const char *fmt, va_list ap)
{
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    if (n < 0) {
        return;
    }
    if (t->len + (size_t)n + 1 > t->cap) {
        size_t cap = t->cap ? t->cap : 1024;
        while (cap < t->len + (size_t)n + 1) {
            cap *= 2;
        }
        char *b = realloc(t->buf, cap);
        if (b == NULL) {
            return;
        }
        t->buf = b;
        t->cap = cap;
    }
    vsnprintf(t->buf + t->len, (size_t)n + 1, fmt, ap);
    t->len += (size_t)n;
}

void dshim_text_add(text_t *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    tx_vadd(t, fmt, ap);
    va_end(ap);
}

char *dshim_text_take(text_t *t)
{
    if (t->buf == NULL) {
        return strdup("");
    }
    return t->buf;
}

/* 25165824 -> "25,165,824" */
static void fmt_count(uint64_t v, char *out, size_t cap)
{
    char digits[32];
    int n = snprintf(digits, sizeof(digits), "%llu", (unsigned long long)v);
    size_t o = 0;
    for (int i = 0; i < n && o + 2 < cap; i++) {
        if (i > 0 && (n - i) % 3 == 0) {
            out[o++] = ',';
        }
        out[o++] = digits[i];
    }
    out[o] = '\0';
}

void dshim_diag_fmt_bytes(uint64_t b, char *out, size_t cap)
{
    const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)b;
    int u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        u++;
    }
    if (u == 0) {
        snprintf(out, cap, "%llu B", (unsigned long long)b);
    } else {
        snprintf(out, cap, "%.1f %s", v, units[u]);
    }
}

void dshim_diag_fmt_secs(double s, char *out, size_t cap)
{
    if (s < 0) {
        s = 0;
    }
    if (s < 1.0) {
        snprintf(out, cap, "%.0f ms", s * 1000.0);
    } else if (s < 100.0) {
        snprintf(out, cap, "%.1f s", s);
    } else {
        snprintf(out, cap, "%.0f s", s);
    }
}

/* "allreduce #1043" */
void dshim_diag_fmt_opseq(const dshim_trace_rec_t *e, char *out, size_t cap)
{
    if (e->seq == DSHIM_TRACE_SEQ_NONE) {
        snprintf(out, cap, "%s (not started)", e->op[0] ? e->op : "an operation");
    } else {
        snprintf(out, cap, "%s #%llu", e->op[0] ? e->op : "an operation", (unsigned long long)e->seq);
    }
}

/* "(float32 × 25,165,824, root 0, from DDP bucket 2)" or "" */
void dshim_diag_fmt_args(const dshim_trace_rec_t *e, int with_label, char *out, size_t cap)
{
    char parts[256] = "";
    size_t len = 0;
    char cnt[40];
    if (e->dtype[0] && e->count > 0) {
        fmt_count(e->count, cnt, sizeof(cnt));
        len += (size_t)snprintf(parts + len, sizeof(parts) - len, "%s \xc3\x97 %s", e->dtype, cnt);
    } else if (e->bytes > 0) {
        dshim_diag_fmt_bytes(e->bytes, cnt, sizeof(cnt));
        len += (size_t)snprintf(parts + len, sizeof(parts) - len, "%s", cnt);
    }
    if (e->root >= 0 && len < sizeof(parts)) {
        len += (size_t)snprintf(parts + len, sizeof(parts) - len, "%sroot %d", len ? ", " : "", e->root);
    }
    if (e->peer >= 0 && len < sizeof(parts)) {
        len += (size_t)snprintf(parts + len, sizeof(parts) - len, "%s%s %d", len ? ", " : "",
                                strstr(e->op, "recv") ? "from rank" : "to rank", e->peer);
    }
    if (with_label && e->label[0] && len < sizeof(parts)) {
        len += (size_t)snprintf(parts + len, sizeof(parts) - len, "%sfrom %s", len ? ", " : "", e->label);
    }
    if (len == 0) {
        out[0] = '\0';
    } else {
        snprintf(out, cap, " (%s)", parts);
    }
}

/* Agent -> controller frames and the line splitter both sides use (frame.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "frame.h"

void run_linebuf_feed(run_linebuf_t *lb, const char *data, size_t n, run_line_cb cb, void *ctx)
{
    while (n > 0) {
        const char *nl = memchr(data, '\n', n);
        size_t take = nl ? (size_t)(nl - data) : n;
        if (lb->len + take > RUN_LINE_MAX) {
            take = RUN_LINE_MAX - lb->len;  /* cut an overlong line */
            nl = NULL;
        }
        if (lb->len + take + 1 > lb->cap) {
            size_t cap = lb->cap ? lb->cap : 256;
            while (cap < lb->len + take + 1) {
                cap *= 2;
            }
            char *b = realloc(lb->buf, cap);
            if (b == NULL) {
                return;
            }
            lb->buf = b;
            lb->cap = cap;
        }
        memcpy(lb->buf + lb->len, data, take);
        lb->len += take;
        data += take;
        n -= take;
        if (nl) {
            data++;
            n--;
        }
        if (nl || lb->len >= RUN_LINE_MAX) {
            lb->buf[lb->len] = '\0';
            cb(ctx, lb->buf, lb->len);
            lb->len = 0;
        }
    }
}

void run_linebuf_flush(run_linebuf_t *lb, run_line_cb cb, void *ctx)
{
    if (lb->len > 0) {
        lb->buf[lb->len] = '\0';
        cb(ctx, lb->buf, lb->len);
        lb->len = 0;
    }
}

void run_linebuf_free(run_linebuf_t *lb)
{
    free(lb->buf);
    lb->buf = NULL;
    lb->len = lb->cap = 0;
}

static const char *field(const char *p, const char *end, long *v)
{
    char *e = NULL;
    if (p >= end) {
        return NULL;
    }
    *v = strtol(p, &e, 10);
    if (e == p || e > end) {
        return NULL;
    }
    if (e < end && *e == ' ') {
        e++;
    }
    return e;
}

int run_frame_parse(const char *line, size_t len, run_frame_t *f)
{
    if (len < 3 || line[0] != RUN_FRAME_MARK || line[2] != ' ') {
        return -1;
    }
    const char *end = line + len;
    const char *p = line + 3;
    long v = 0;
    memset(f, 0, sizeof(*f));
    f->kind = line[1];
    switch (f->kind) {
    case 'H':
        /* "H <host> <pid>" */
        f->text = p;
        {
            const char *sp = memchr(p, ' ', (size_t)(end - p));
            if (sp == NULL) {
                return -1;
            }
            f->textlen = (size_t)(sp - p);
            if (field(sp + 1, end, &f->a) == NULL) {
                return -1;
            }
        }
        return 0;
    case 'S':
    case 'X':
    case 'O':
    case 'E':
    case 'F':
    case 'R':
    case 'T':
    case 'Q':
    case 'D':  /* D, B, Y, Z, A: flight-recorder dumps (collect.h) */
    case 'B':
    case 'Y':
    case 'Z':
    case 'A':
        p = field(p, end, &v);
        if (p == NULL) {
            return -1;
        }
        f->idx = (int)v;
        if (f->kind == 'S') {
            p = field(p, end, &f->a);
            if (p == NULL) {
                return -1;
            }
            f->text = p;
            f->textlen = (size_t)(end - p);
            return 0;
        }
        if (f->kind == 'X') {
            p = field(p, end, &f->a);
            return (p && field(p, end, &f->b)) ? 0 : -1;
        }
        f->text = p;
        f->textlen = (size_t)(end - p);
        return 0;
    default:
        return -1;
    }
}

void run_frame_write(int fd, char kind, int idx, long a, long b, const char *text, size_t textlen)
{
    char head[64];
    int h;
    switch (kind) {
    case 'H': h = snprintf(head, sizeof(head), "%cH ", RUN_FRAME_MARK); break;
    case 'S': h = snprintf(head, sizeof(head), "%cS %d %ld ", RUN_FRAME_MARK, idx, a); break;
    case 'X': h = snprintf(head, sizeof(head), "%cX %d %ld %ld", RUN_FRAME_MARK, idx, a, b); break;
    default: h = snprintf(head, sizeof(head), "%c%c %d ", RUN_FRAME_MARK, kind, idx); break;
    }
    char tail[32] = "";
    int t = 0;
    if (kind == 'H') {
        t = snprintf(tail, sizeof(tail), " %ld", a);
    }
    size_t total = (size_t)h + textlen + (size_t)t + 1;
    char stackbuf[1024];
    char *buf = total <= sizeof(stackbuf) ? stackbuf : malloc(total);
    if (buf == NULL) {
        return;
    }
    memcpy(buf, head, (size_t)h);
    if (textlen) {
        memcpy(buf + h, text, textlen);
    }
    memcpy(buf + h + textlen, tail, (size_t)t);
    buf[total - 1] = '\n';
    size_t off = 0;
    while (off < total) {
        ssize_t w = write(fd, buf + off, total - off);
        if (w < 0) {
            if (errno == EINTR) {
                continue;
            }
            break;  /* controller gone: the agent notices on stdin */
        }
        off += (size_t)w;
    }
    if (buf != stackbuf) {
        free(buf);
    }
}

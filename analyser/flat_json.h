/*
 * The analyser's JSON reader (private to analyser/): one line holding one
 * flat object, the only shape the dumps and launcher.jsonl have.  Values are
 * strings, integers and arrays of integers; anything else (floats,
 * true/false/null, nested values, which later versions might add) is
 * skipped as a whole.  Every read is bounded by the line: dumps arrive from
 * other hosts and from files anyone may edit.
 */
#ifndef DSHIM_FLAT_JSON_H
#define DSHIM_FLAT_JSON_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

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

typedef void (*dshim_flat_json_cb)(void *ctx, const char *key, const jval_t *v);

/* One line holding one object; cb for every key (v: the caller's scratch,
 * 1 KiB: off the stack of small threads).  0, or -1 when the line is not one
 * whole object (cb may have been called for keys before the fault: callers
 * parse into a scratch record and use it only on success). */
int dshim_flat_json_parse(const char *line, size_t len, dshim_flat_json_cb cb, void *ctx, jval_t *v);

/* ---- typed fields: a value of the wrong type leaves the field as it was --- */

/* Copies src cut to cap - 1 bytes, never in the middle of a UTF-8 sequence. */
static inline void copy_str(char *dst, size_t cap, const char *src)
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

static inline void set_str(char *dst, size_t cap, const jval_t *v)
{
    if (v->type == JV_STR) {
        copy_str(dst, cap, v->s);
    }
}

static inline void set_u64(uint64_t *dst, const jval_t *v)
{
    if (v->type == JV_INT && !v->neg) {
        *dst = v->mag;
    }
}

static inline void set_int(int *dst, const jval_t *v)
{
    if (v->type == JV_INT && v->mag <= (uint64_t)INT32_MAX + (v->neg ? 1 : 0)) {
        *dst = v->neg ? (int)-(int64_t)v->mag : (int)v->mag;
    }
}

static inline void set_long(long *dst, const jval_t *v)
{
    if (v->type == JV_INT && v->mag <= (uint64_t)INT64_MAX) {
        *dst = v->neg ? -(long)v->mag : (long)v->mag;
    }
}

/* ---- lines ----------------------------------------------------------------- */

/* Next line of [*p, end): its start and length; advances *p past its '\n'. */
static inline int dshim_next_line(const char **p, const char *end, const char **line, size_t *len)
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

static inline int dshim_blank_line(const char *line, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        if (line[i] != ' ' && line[i] != '\t' && line[i] != '\r') {
            return 0;
        }
    }
    return 1;
}

#endif

/* Small helpers shared by the launcher: string vectors, messages, allocation. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <unistd.h>

#include "run.h"

void *run_xmalloc(size_t n)
{
    void *p = calloc(1, n ? n : 1);
    if (p == NULL) {
        fprintf(stderr, "dshim-run: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

char *run_xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = run_xmalloc(n);
    memcpy(p, s, n);
    return p;
}

void run_strv_add(run_strv_t *sv, const char *s)
{
    if (sv->n + 2 > sv->cap) {
        int cap = sv->cap ? sv->cap * 2 : 16;
        char **v = realloc(sv->v, (size_t)cap * sizeof(*v));
        if (v == NULL) {
            fprintf(stderr, "dshim-run: out of memory\n");
            exit(1);
        }
        sv->v = v;
        sv->cap = cap;
    }
    sv->v[sv->n++] = run_xstrdup(s);
    sv->v[sv->n] = NULL;
}

void run_strv_addf(run_strv_t *sv, const char *fmt, ...)
{
    char *s = NULL;
    va_list ap;
    va_start(ap, fmt);
    if (vasprintf(&s, fmt, ap) < 0) {
        fprintf(stderr, "dshim-run: out of memory\n");
        exit(1);
    }
    va_end(ap);
    run_strv_add(sv, s);
    free(s);
}

static int env_key_index(const run_strv_t *sv, const char *key)
{
    size_t klen = strlen(key);
    for (int i = 0; i < sv->n; i++) {
        if (strncmp(sv->v[i], key, klen) == 0 && sv->v[i][klen] == '=') {
            return i;
        }
    }
    return -1;
}

void run_strv_setenv(run_strv_t *sv, const char *key, const char *fmt, ...)
{
    char *val = NULL;
    va_list ap;
    va_start(ap, fmt);
    if (vasprintf(&val, fmt, ap) < 0) {
        fprintf(stderr, "dshim-run: out of memory\n");
        exit(1);
    }
    va_end(ap);
    int i = env_key_index(sv, key);
    if (i >= 0) {
        free(sv->v[i]);
        if (asprintf(&sv->v[i], "%s=%s", key, val) < 0) {
            exit(1);
        }
    } else {
        run_strv_addf(sv, "%s=%s", key, val);
    }
    free(val);
}

const char *run_strv_getenv(const run_strv_t *sv, const char *key)
{
    int i = env_key_index(sv, key);
    return i < 0 ? NULL : sv->v[i] + strlen(key) + 1;
}

void run_strv_free(run_strv_t *sv)
{
    for (int i = 0; i < sv->n; i++) {
        free(sv->v[i]);
    }
    free(sv->v);
    memset(sv, 0, sizeof(*sv));
}

char **run_strv_terminated(run_strv_t *sv)
{
    if (sv->v == NULL) {
        sv->v = run_xmalloc(sizeof(char *));
        sv->cap = 1;
    }
    return sv->v;
}

void run_usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("dshim-run: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(RUN_EXIT_USAGE);
}

void run_say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("dshim-run: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

void run_split_words(const char *s, run_strv_t *out)
{
    const char *p = s;
    while (*p) {
        while (*p == ' ' || *p == '\t') {
            p++;
        }
        if (!*p) {
            break;
        }
        const char *q = p;
        while (*q && *q != ' ' && *q != '\t') {
            q++;
        }
        char *w = strndup(p, (size_t)(q - p));
        run_strv_add(out, w);
        free(w);
        p = q;
    }
}

char *run_shell_quote(const char *s)
{
    /* '...' with every ' written as '\'' : nothing inside single quotes is special. */
    size_t n = 3;
    for (const char *p = s; *p; p++) {
        n += (*p == '\'') ? 4 : 1;
    }
    char *out = run_xmalloc(n);
    char *o = out;
    *o++ = '\'';
    for (const char *p = s; *p; p++) {
        if (*p == '\'') {
            memcpy(o, "'\\''", 4);
            o += 4;
        } else {
            *o++ = *p;
        }
    }
    *o++ = '\'';
    *o = '\0';
    return out;
}

int run_write_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len > 0) {
        ssize_t w = write(fd, p, len);
        if (w < 0 && errno == EINTR) {
            continue;
        }
        if (w <= 0) {
            return -1;
        }
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

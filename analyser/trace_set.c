/*
 * A set of dumps, one per process (the newest when a process dumped twice),
 * with the launcher's account of the processes: built from the frames the
 * launcher collects or from a directory (`dshim-run --diagnose DIR`).  And
 * ranks written as ranges, which every message of the analyser uses.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "trace_read.h"
#include "trace_read_impl.h"

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
        int is_dump = strncmp(name, DSHIM_TRACE_FILE_PREFIX, strlen(DSHIM_TRACE_FILE_PREFIX)) == 0 &&
                      ends_with(name, DSHIM_TRACE_FILE_SUFFIX);
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
            if (dshim_trace_parse_procs_wait(buf, len, &set->procs, &set->nprocs, &set->wait_s) != 0) {
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

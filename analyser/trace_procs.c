/*
 * launcher.jsonl, what dshim-run knows of each process of the job, written
 * beside the dumps so that `--diagnose DIR` says offline what it said live:
 * a "dshim-run-procs" v1 header line, then one object per process.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "flat_json.h"
#include "json_str.h"
#include "private_fs.h"
#include "trace_read.h"
#include "trace_read_impl.h"

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

int dshim_trace_parse_procs_wait(const char *buf, size_t len, dshim_trace_proc_t **procs, size_t *np, double *wait_s)
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
    while (dshim_next_line(&p, end, &line, &n) && dshim_blank_line(line, n)) {
    }
    proc_ctx_t c;
    memset(&c, 0, sizeof(c));
    if (line != NULL && !dshim_blank_line(line, n) && dshim_flat_json_parse(line, n, proc_kv, &c, v) == 0 &&
        c.format_ok && c.version == 1) {
        rc = 0;
        if (wait_s) {
            *wait_s = c.wait_ms / 1000.0;
        }
        while (dshim_next_line(&p, end, &line, &n)) {
            if (dshim_blank_line(line, n)) {
                continue;
            }
            memset(&c.p, 0, sizeof(c.p));
            c.p.rank = -1;
            if (dshim_flat_json_parse(line, n, proc_kv, &c, v) != 0) {
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
    return dshim_trace_parse_procs_wait(buf, len, procs, n, NULL);
}

static void put_json_string(FILE *f, const char *s)
{
    fputc('"', f);
    dshim_json_write(f, s);
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

/*
 * TORCHELASTIC_ERROR_FILE: torch's @record decorator (torch.distributed.
 * elastic.multiprocessing.errors) writes a failing rank's exception there as
 * JSON, but only if the directory exists.  The agent makes the directory,
 * and after a failure reads the exception's one-line message so the
 * controller can name the root cause, as torchrun does.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "errfile.h"
#include "private_fs.h"

/* The file's directories (inside the private job directory, jobdir.h), mode 0700. */
static void mkdir_parents(const char *path)
{
    char *d = run_xstrdup(path);
    char *slash = strrchr(d, '/');
    if (slash) {
        *slash = '\0';
        dshim_make_dirs(d);
    }
    free(d);
}

const char *run_errfile_path(const run_strv_t *env)
{
    const char *p = run_strv_getenv(env, "TORCHELASTIC_ERROR_FILE");
    return (p && p[0] == '/') ? p : NULL;
}

void run_errfile_prepare(const char *path)
{
    if (path) {
        mkdir_parents(path);
        unlink(path);  /* a stale file from an earlier run must not be blamed */
    }
}

/* The first JSON string value of key "message" that is a string, unescaped, first line only. */
static char *first_message(const char *json)
{
    const char *p = json;
    while ((p = strstr(p, "\"message\"")) != NULL) {
        p += 9;
        while (*p == ' ' || *p == ':') {
            p++;
        }
        if (*p != '"') {
            continue;  /* {"message": {"message": "..."}}: the outer one is an object */
        }
        p++;
        char *out = run_xmalloc(strlen(p) + 1);
        size_t o = 0;
        for (; *p && *p != '"'; p++) {
            if (*p == '\\' && p[1]) {
                p++;
                if (*p == 'n') {
                    break;  /* first line is the exception's summary */
                }
                out[o++] = (*p == 't') ? ' ' : *p;
            } else {
                out[o++] = *p;
            }
        }
        out[o] = '\0';
        return out;
    }
    return NULL;
}

char *run_errfile_take(const char *path)
{
    if (path == NULL) {
        return NULL;
    }
    FILE *f = fopen(path, "r");
    char *msg = NULL;
    if (f) {
        char buf[65536];
        size_t n = fread(buf, 1, sizeof(buf) - 1, f);
        buf[n] = '\0';
        fclose(f);
        msg = first_message(buf);
        unlink(path);
    }
    /* remove <rank>/, attempt_<k>/ and the job directory when empty */
    char *d = run_xstrdup(path);
    for (int level = 0; level < 3; level++) {
        char *slash = strrchr(d, '/');
        if (slash == NULL || slash == d) {
            break;
        }
        *slash = '\0';
        if (rmdir(d) != 0) {
            break;
        }
    }
    free(d);
    return msg;
}

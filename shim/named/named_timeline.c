/* Horovod's timeline (HOROVOD_TIMELINE, hvd.start_timeline): a Chrome
 * trace written by rank 0 of the engine, in Horovod's format (timeline.cc):
 * every tensor name is a "process" (pid, process_name, process_sort_index),
 * with a NEGOTIATE_<KIND> span from its first request to the round in which
 * it became complete (an instant per rank as its request arrives; a name
 * whose first requests came in before the file opened begins its span, with
 * those ranks' instants, at its next event: dshim_named_tl_negotiating) and a
 * <KIND> span around its execution (ended with its dtype and shape);
 * CYCLE_START markers for every round with mark_cycles.  The file is valid
 * JSON after every event (it ends in "]", overwritten by the next one), as
 * Horovod's is.
 *
 * The engine's thread writes; dshim_named_timeline (any thread) opens and
 * closes; one mutex between them, and an atomic flag so that an engine
 * without a timeline pays one load per event. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include "json_str.h"
#include "named.h"
#include "net.h"
#include "private_fs.h"
#include "status.h"

typedef struct tl_pid {
    dshim_named_map_node_t node;
    char *name;
    int pid;
} tl_pid_t;

static void pids_free(dshim_named_t *eng)
{
    for (size_t i = 0; i < eng->tl.pids.nbuckets; i++) {
        dshim_named_map_node_t *n = eng->tl.pids.buckets[i];
        while (n) {
            dshim_named_map_node_t *next = n->next;
            tl_pid_t *p = n->val;
            free(p->name);
            free(p);
            n = next;
        }
    }
    dshim_named_map_free(&eng->tl.pids);
    eng->tl.npids = 0;
}

static void tl_close(dshim_named_t *eng)
{
    __atomic_store_n(&eng->tl.on, 0, __ATOMIC_RELEASE);
    if (eng->tl.f) {
        fclose(eng->tl.f);
        eng->tl.f = NULL;
    }
    pids_free(eng);
}

/* The separator before a record: the file's start, or the "]" that ended
 * the last one turned into ",". */
static void next_record(dshim_named_t *eng)
{
    FILE *f = eng->tl.f;
    if (eng->tl.fresh) {
        struct timeval tv;
        gettimeofday(&tv, NULL);
        fprintf(f, "[\n{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 0, \"args\": "
                   "{\"start_time_since_epoch_in_micros\":%lld}},\n",
                (long long)tv.tv_sec * 1000000 + tv.tv_usec - (long long)((dshim_now() - eng->tl.t0) * 1e6));
        fprintf(f, "{\"name\": \"process_sort_index\", \"ph\": \"M\", \"pid\": 0, \"args\": {\"sort_index\": 0}},\n");
        eng->tl.fresh = 0;
    } else {
        fseek(f, -1, SEEK_CUR);
        fputc(',', f);
    }
}

static long long ts_us(const dshim_named_t *eng)
{
    return (long long)((dshim_now() - eng->tl.t0) * 1e6);
}

void dshim_named_tl_event(dshim_named_t *eng, const char *tensor, char phase, const char *op_name, const char *args)
{
    if (!__atomic_load_n(&eng->tl.on, __ATOMIC_ACQUIRE)) {
        return;
    }
    pthread_mutex_lock(&eng->tl.mu);
    FILE *f = eng->tl.f;
    if (!f) {
        pthread_mutex_unlock(&eng->tl.mu);
        return;
    }
    next_record(eng);
    tl_pid_t *p = dshim_named_map_get(&eng->tl.pids, tensor);
    if (!p) {
        p = calloc(1, sizeof(*p));
        if (p && (p->name = strdup(tensor)) != NULL && dshim_named_map_put(&eng->tl.pids, &p->node, p->name, p) == DSHIM_OK) {
            p->pid = ++eng->tl.npids;
        } else {
            if (p) {
                free(p->name);
                free(p);
            }
            fputs("{}]", f); /* keeps the file valid; the event is lost with the memory */
            pthread_mutex_unlock(&eng->tl.mu);
            return;
        }
        /* tensors are Chrome's processes: register this "pid" */
        fputs("{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": ", f);
        fprintf(f, "%d, \"args\": {\"name\": \"", p->pid);
        dshim_json_write(f, tensor);
        fprintf(f, "\"}},\n{\"name\": \"process_sort_index\", \"ph\": \"M\", \"pid\": %d, \"args\": "
                   "{\"sort_index\": %d}},\n", p->pid, p->pid);
    }
    fprintf(f, "{\"ph\": \"%c\"", phase);
    if (phase != 'E') {
        fputs(", \"name\": \"", f);
        dshim_json_write(f, op_name);
        fputc('"', f);
    }
    fprintf(f, ", \"ts\": %lld, \"pid\": %d", ts_us(eng), p->pid);
    if (phase == 'X') {
        fputs(", \"dur\": 0", f);
    }
    if (args && *args) {
        fprintf(f, ", \"args\": {%s}", args);
    }
    fputs("}]", f);
    if (ferror(f)) {
        DSHIM_WARN("rank %d: Horovod timeline: a write failed (%s); it stops", eng->rank, strerror(errno));
        tl_close(eng);
    }
    pthread_mutex_unlock(&eng->tl.mu);
}

void dshim_named_tl_cycle(dshim_named_t *eng)
{
    if (!__atomic_load_n(&eng->tl.on, __ATOMIC_ACQUIRE)) {
        return;
    }
    pthread_mutex_lock(&eng->tl.mu);
    if (eng->tl.f && eng->tl.mark) {
        next_record(eng);
        fprintf(eng->tl.f, "{\"ph\": \"i\", \"name\": \"CYCLE_START\", \"ts\": %lld, \"s\": \"g\"}]", ts_us(eng));
    }
    pthread_mutex_unlock(&eng->tl.mu);
}

void dshim_named_tl_end(dshim_named_t *eng, const char *tensor, dshim_dtype_t dtype, int ndim, const int64_t *shape)
{
    if (!__atomic_load_n(&eng->tl.on, __ATOMIC_ACQUIRE)) {
        return;
    }
    char args[512];
    size_t at = (size_t)snprintf(args, sizeof(args), "\"dtype\": \"%s\", \"shape\": \"[", dshim_dtype_name(dtype));
    for (int i = 0; i < ndim && at < sizeof(args); i++) {
        at += (size_t)snprintf(args + at, sizeof(args) - at, "%s%lld", i ? ", " : "", (long long)shape[i]);
    }
    if (at < sizeof(args)) {
        snprintf(args + at, sizeof(args) - at, "]\"");
    }
    dshim_named_tl_event(eng, tensor, 'E', "", args);
}

void dshim_named_tl_negotiating(dshim_named_t *eng, dshim_named_entry_t *e, int kind)
{
    if (!__atomic_load_n(&eng->tl.on, __ATOMIC_ACQUIRE)) {
        return;
    }
    unsigned file = __atomic_load_n(&eng->tl.files, __ATOMIC_ACQUIRE);
    if (e->tl_file == file) {
        return;
    }
    e->tl_file = file;
    char what[32], who[16];
    snprintf(what, sizeof(what), "NEGOTIATE_%s", dshim_named_kind_upper((dshim_named_kind_t)kind));
    dshim_named_tl_event(eng, e->name, 'B', what, NULL);
    for (int r = 0; r < eng->size; r++) {
        if (e->reqs[r]) {
            snprintf(who, sizeof(who), "%d", r);
            dshim_named_tl_event(eng, e->name, 'X', who, NULL);
        }
    }
}

dshim_status_t dshim_named_tl_open(dshim_named_t *eng, const char *path, int mark_cycles)
{
    pthread_mutex_lock(&eng->tl.mu);
    tl_close(eng);
    dshim_status_t st = DSHIM_OK;
    if (path && eng->rank == 0) {
        int fd = dshim_private_open(path, DSHIM_OPEN_TRUNC);
        FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
        if (!f) {
            int err = errno;
            if (fd >= 0) {
                close(fd);
            }
            st = dshim_error(DSHIM_ERR_SYSTEM, "rank %d: Horovod timeline %s: %s", eng->rank, path,
                             dshim_private_why(err));
        } else {
            eng->tl.f = f;
            eng->tl.fresh = 1;
            eng->tl.mark = mark_cycles;
            eng->tl.t0 = dshim_now();
            __atomic_add_fetch(&eng->tl.files, 1, __ATOMIC_RELEASE);
            __atomic_store_n(&eng->tl.on, 1, __ATOMIC_RELEASE);
        }
    }
    pthread_mutex_unlock(&eng->tl.mu);
    return st;
}

DSHIM_EXPORT dshim_status_t dshim_named_timeline(dshim_named_t *eng, const char *path, int mark_cycles)
{
    if (!eng) {
        return dshim_error(DSHIM_ERR_INVALID, "named_timeline: eng is NULL");
    }
    return dshim_named_tl_open(eng, path, mark_cycles);
}

/* Writing the flight recorder's dump: every open ring of the process in the
 * "dshim-trace" v1 JSON Lines format (trace.h), then torch's format
 * (trace_fr.c) beside it.  Triggers: a communicator's failure, the
 * DSHIM_TRACE_SIGNAL signal (trace_signal.c), a fatal signal (the crash
 * hook), dshim_trace_dump(). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "private_fs.h"
#include "config.h"
#include "log.h"
#include "status.h"
#include "json_str.h"
#include "trace_impl.h"

/* Torch's format is written by trace_fr.c when it is linked in; the weak
 * reference keeps this file linkable without it (NULL then). */
extern __typeof__(dshim_trace_write_fr) dshim_trace_write_fr __attribute__((weak));

static int is_failure(const char *reason)
{
    static const char *const failures[] = {"timeout", "peer", "mismatch", "abort", "failed"};
    for (size_t i = 0; i < sizeof(failures) / sizeof(failures[0]); i++) {
        if (!strcmp(reason, failures[i])) {
            return 1;
        }
    }
    return 0;
}

static void json_kv_str(FILE *f, const char *key, const char *value, int comma)
{
    fprintf(f, "%s\"%s\":\"", comma ? "," : "", key);
    dshim_json_write(f, value);
    fputc('"', f);
}

static void write_ranks(FILE *f, const char *key, const int *ranks, int n, int cap)
{
    fprintf(f, ",\"%s\":[", key);
    n = n < cap ? n : cap;
    for (int i = 0; i < n; i++) {
        fprintf(f, "%s%d", i ? "," : "", ranks[i]);
    }
    fputs("]", f);
}

static void write_seq(FILE *f, const char *key, uint64_t seq)
{
    if (seq == UINT64_MAX) {
        fprintf(f, ",\"%s\":-1", key);
    } else {
        fprintf(f, ",\"%s\":%" PRIu64, key, seq);
    }
}

/* One entry's line: "ring", then the fields of trace_fields.def in its order. */
static void write_entry(FILE *f, const dshim_trace_snapshot_t *s, const dshim_trace_entry_t *e)
{
    const char *state;
    fputs("{", f);
    json_kv_str(f, "ring", s->name, 0);
#define DSHIM_TRACE_U64(key, ident, value) fprintf(f, ",\"" #key "\":%" PRIu64, (uint64_t)(value));
#define DSHIM_TRACE_SEQ(key, ident, value) write_seq(f, #key, (value));
#define DSHIM_TRACE_INT(key, ident, value) fprintf(f, ",\"" #key "\":%d", (int)(value));
#define DSHIM_TRACE_STR(key, cap, ident, value) json_kv_str(f, #key, (value), 1);
#define DSHIM_TRACE_STATE(key, ident, value)                                                                     \
    state = dshim_trace_state_name((int)(value));                                                                \
    json_kv_str(f, #key, state ? state : "unknown", 1);
#define DSHIM_TRACE_RANKS(key, nkey, cap, ident, value, n) write_ranks(f, #key, (value), (n), (cap));
#include "trace_fields.def"
#undef DSHIM_TRACE_U64
#undef DSHIM_TRACE_SEQ
#undef DSHIM_TRACE_INT
#undef DSHIM_TRACE_STR
#undef DSHIM_TRACE_STATE
#undef DSHIM_TRACE_RANKS
    fputs("}\n", f);
}

/* The last failure this process dumped (reason, why), repeated in later
 * dumps: a request after a failure (dshim-run asks every rank once one
 * failed) replaces the file, not what it said.  Under the registry lock. */
static char failed_reason[16], failed_why[768];

static void write_dump(FILE *f, int rank, int size, const char *reason, const char *why,
                       const dshim_trace_snapshot_t *snaps, size_t n)
{
    struct timespec rt, mt;
    clock_gettime(CLOCK_REALTIME, &rt);
    clock_gettime(CLOCK_MONOTONIC, &mt);
    fprintf(f, "{\"format\":\"" DSHIM_TRACE_FORMAT "\",\"version\":%d,\"rank\":%d,\"size\":%d",
            DSHIM_TRACE_FORMAT_VERSION, rank, size);
    json_kv_str(f, "host", dshim_log_hostname(), 1);
    fprintf(f, ",\"pid\":%d", (int)getpid());
    json_kv_str(f, "reason", reason, 1);
    json_kv_str(f, "why", why ? why : "", 1);
    if (failed_reason[0] && strcmp(failed_reason, reason) != 0) {
        json_kv_str(f, "failed_reason", failed_reason, 1);
        json_kv_str(f, "failed_why", failed_why, 1);
    }
    fprintf(f, ",\"realtime_ns\":%" PRIu64 ",\"monotonic_ns\":%" PRIu64 "}\n",
            (uint64_t)rt.tv_sec * 1000000000u + (uint64_t)rt.tv_nsec,
            (uint64_t)mt.tv_sec * 1000000000u + (uint64_t)mt.tv_nsec);
    for (size_t i = 0; i < n; i++) {
        const dshim_trace_snapshot_t *s = &snaps[i];
        fputs("{", f);
        json_kv_str(f, "ring", s->name, 0);
        json_kv_str(f, "desc", s->desc, 1);
        fprintf(f,
                ",\"rank\":%d,\"size\":%d,\"world_rank\":%d,\"capacity\":%zu,\"recorded\":%" PRIu64
                ",\"dropped\":%" PRIu64 "}\n",
                s->rank, s->size, s->world_rank, s->capacity, s->recorded, s->dropped);
        for (size_t k = 0; k < s->n; k++) {
            write_entry(f, s, &s->entries[k]);
        }
    }
}

/* mkdir -p; the missing ones get mode 0700 (dumps name hosts and what the
 * job does: for the user only). */
static dshim_status_t make_dirs(const char *path)
{
    if (path[0] == '\0' || strlen(path) >= 4096) {
        return dshim_error_quiet(DSHIM_ERR_INVALID, "DSHIM_TRACE_DIR is empty or too long");
    }
    if (dshim_make_dirs(path) != 0) {
        return dshim_error_quiet(DSHIM_ERR_SYSTEM, "cannot create the directory %s: %s (set DSHIM_TRACE_DIR "
                                 "to a writable directory)", path, strerror(errno));
    }
    return DSHIM_OK;
}

/* The dump directory, created if missing.  The default lives in /tmp, where
 * anyone may have made it first: it must be ours. */
static dshim_status_t dump_dir(char *out, size_t len)
{
    const char *dir = dshim_config()->trace_dir;
    if (dir[0]) {
        snprintf(out, len, "%s", dir);
        return make_dirs(out);
    }
    snprintf(out, len, "/tmp/dshim-trace-%u", (unsigned)getuid());
    if (dshim_private_dir(out, 1) != 0) {
        return dshim_error_quiet(DSHIM_ERR_SYSTEM, "%s belongs to another user or is a link; set DSHIM_TRACE_DIR "
                                 "to a directory of yours", out);
    }
    return DSHIM_OK;
}

/* Writes the file under a temporary name and renames it: a reader (the
 * launcher collecting dumps) never sees half a file. */
static dshim_status_t write_file(const char *dir, int rank, int size, const char *reason, const char *why,
                                 const dshim_trace_snapshot_t *snaps, size_t n, char *path, size_t path_len)
{
    char tmp[4224];
    snprintf(path, path_len, "%s/" DSHIM_TRACE_FILE_PREFIX "%d.%d" DSHIM_TRACE_FILE_SUFFIX, dir, rank, (int)getpid());
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    /* mode 0600, no link followed, never another user's file (a shared DSHIM_TRACE_DIR) */
    int fd = dshim_private_open(tmp, DSHIM_OPEN_TRUNC);
    if (fd < 0) {
        return dshim_error_quiet(DSHIM_ERR_SYSTEM, "cannot create %s: %s", tmp, dshim_private_why(errno));
    }
    FILE *f = fdopen(fd, "w");
    if (!f) {
        int e = errno;
        close(fd);
        unlink(tmp);
        return dshim_error_quiet(DSHIM_ERR_SYSTEM, "cannot write %s: %s", tmp, strerror(e));
    }
    write_dump(f, rank, size, reason, why, snaps, n);
    int bad = ferror(f);
    int e = errno;
    if (fclose(f) != 0 && !bad) {
        bad = 1;
        e = errno;
    }
    if (bad) {
        unlink(tmp);
        return dshim_error_quiet(DSHIM_ERR_SYSTEM, "cannot write %s: %s", tmp, strerror(e));
    }
    if (rename(tmp, path) != 0) {
        e = errno;
        unlink(tmp);
        return dshim_error_quiet(DSHIM_ERR_SYSTEM, "cannot rename %s to %s: %s", tmp, path, strerror(e));
    }
    return DSHIM_OK;
}

/* When the last failure dump was written (monotonic ns; 0 = never). */
static uint64_t last_failure_ns;

dshim_status_t dshim_trace_dump_ex(const char *reason, const char *why, int crash)
{
    if (dshim_config()->trace_buffer <= 0) {
        return DSHIM_OK;
    }
    if (is_failure(reason)) {
        uint64_t now = dshim_trace_now_ns();
        uint64_t last = __atomic_load_n(&last_failure_ns, __ATOMIC_ACQUIRE);
        /* one failure reaches every communicator of the process within a
         * moment (peers shut their connections): its first dump tells it */
        if ((last && now - last < 1000000000u) ||
            !__atomic_compare_exchange_n(&last_failure_ns, &last, now, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            return DSHIM_OK;
        }
    }
    char dir[4096];
    dshim_status_t st = dump_dir(dir, sizeof(dir));
    int rank = -1, size = -1;
    if (st != DSHIM_OK) {
        DSHIM_WARN("flight recorder: no dump (%s): %s", reason, dshim_last_error());
        return st;
    }
    /* held until both formats are written: a communicator closing meanwhile
     * would free the transport names the snapshots point to */
    if (!dshim_trace_registry_lock(crash)) {
        return dshim_error_quiet(DSHIM_ERR_INTERNAL, "flight recorder: the registry stayed locked; no dump");
    }
    dshim_trace_snapshot_t *snaps = NULL;
    size_t n = dshim_trace_snapshot_all(&snaps, crash);
    dshim_trace_world_locked(&rank, &size);
    char path[4200];
    st = write_file(dir, rank, size, reason, why, snaps, n, path, sizeof(path));
    if (st == DSHIM_OK && is_failure(reason)) {
        snprintf(failed_reason, sizeof(failed_reason), "%s", reason);
        snprintf(failed_why, sizeof(failed_why), "%s", why ? why : "");
    }
    if (st == DSHIM_OK && dshim_trace_write_fr) {
        dshim_status_t fst = dshim_trace_write_fr(dir, rank, snaps, n, reason, why ? why : "");
        if (fst != DSHIM_OK) {
            DSHIM_WARN("flight recorder: torch's format not written: %s", dshim_last_error());
        }
    }
    dshim_trace_registry_unlock();
    dshim_trace_snapshots_free(snaps, n);
    if (st != DSHIM_OK) {
        DSHIM_WARN("flight recorder: no dump (%s): %s", reason, dshim_last_error());
        return st;
    }
    if (is_failure(reason) || crash) {
        DSHIM_WARN("rank %d: flight recorder written to %s (%s)", rank, path, reason);
    } else {
        DSHIM_INFO("rank %d: flight recorder written to %s (%s)", rank, path, reason);
    }
    return DSHIM_OK;
}

void dshim_trace_dump_all(const char *reason, const char *why)
{
    /* a rank that is asked or fails may be killed next: its buffered
     * timeline spans must be on disk first */
    dshim_trace_timeline_flush();
    dshim_trace_dump_ex(reason ? reason : "request", why, 0);
}

DSHIM_EXPORT dshim_status_t dshim_trace_dump(void)
{
    dshim_trace_timeline_flush();
    return dshim_trace_dump_ex("request", NULL, 0);
}

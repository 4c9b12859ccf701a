/* The flight recorder's core (shim/trace/trace.c, trace_dump.c,
 * trace_signal.c): rings that wrap and count what they dropped,
 * states and times, labels taken once and only by their own thread, snapshots
 * under concurrent writers (the TSan build runs this), the dump file as JSON
 * Lines with the documented keys, the recorder off, dumps on DSHIM_TRACE_SIGNAL
 * and at a crash; and with real ranks: a rank that skips a collective (both
 * dumps after the timeout say who waited for whom) and a rank blocked in a
 * collective that dumps on a signal and goes on.
 *
 * Works unforked too (the valgrind stage runs CK_FORK=no): every case sets
 * its environment, reloads the configuration and closes its rings; what is
 * once per process (the signal handler, the crash hook) is tested in a child
 * of its own. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "comm.h"
#include "config.h"
#include "crash.h"
#include "dshim.h"
#include "ranks.h"
#include "trace.h"

#ifdef __SANITIZE_THREAD__
/* the crash case dumps from the crash handler, which mallocs and uses stdio
 * there on purpose (best effort, bounded by crash.c's watchdog) */
__attribute__((visibility("default"))) const char *__tsan_default_options(void);
const char *__tsan_default_options(void)
{
    return "report_signal_unsafe=0";
}
#endif

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A fresh dump directory for one case, DSHIM_TRACE_DIR pointing to it. */
static char tdir[256];

static void use_env(const char *buffer)
{
    snprintf(tdir, sizeof(tdir), "/tmp/check_trace.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tdir));
    setenv("DSHIM_TRACE_DIR", tdir, 1);
    setenv("DSHIM_TRACE_BUFFER", buffer, 1);
    unsetenv("DSHIM_TIMELINE");
    unsetenv("DSHIM_SUMMARY");
    unsetenv("DSHIM_TRACE_SIGNAL");
    unsetenv("RANK");
    unsetenv("WORLD_SIZE");
    ck_assert_int_eq(dshim_config_reload(), DSHIM_OK);
}

static void remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) {
        return;
    }
    struct dirent *de;
    char path[600];
    while ((de = readdir(d))) {
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
            snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
            struct stat st;
            if (lstat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
                remove_dir(path);
            } else {
                unlink(path);
            }
        }
    }
    closedir(d);
    rmdir(dir);
}

/* The dump of world rank `rank` in dir ("" if none): its path into out. */
static int find_dump(const char *dir, int rank, char *out, size_t len)
{
    DIR *d = opendir(dir);
    if (!d) {
        return 0;
    }
    char prefix[64];
    snprintf(prefix, sizeof(prefix), "dshim-trace.%d.", rank);
    struct dirent *de;
    int found = 0;
    while ((de = readdir(d))) {
        size_t n = strlen(de->d_name);
        if (!strncmp(de->d_name, prefix, strlen(prefix)) && n > 6 && !strcmp(de->d_name + n - 6, ".jsonl")) {
            snprintf(out, len, "%s/%s", dir, de->d_name);
            found = 1;
        }
    }
    closedir(d);
    return found;
}

static int count_files(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) {
        return -1;
    }
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        n += de->d_name[0] != '.';
    }
    closedir(d);
    return n;
}

/* Checks a dump with Python's json module: every line parses, the header,
 * ring and entry lines have the keys trace.h documents, values have their
 * types; then `expr` (a Python expression over h = header, rings = {name:
 * ring line}, ents = {name: [entries]}) must hold.  0 when it does. */
static const char *validator =
    "import json, sys\n"
    "path, expr = sys.argv[1], sys.argv[2]\n"
    "lines = open(path, 'rb').read().decode('utf-8').splitlines()\n"
    "objs = [json.loads(l) for l in lines]\n"
    "h = objs[0]\n"
    "HK = {'format': str, 'version': int, 'rank': int, 'size': int, 'host': str, 'pid': int, 'reason': str,\n"
    "      'why': str, 'realtime_ns': int, 'monotonic_ns': int}\n"
    "RK = {'ring': str, 'desc': str, 'rank': int, 'size': int, 'world_rank': int, 'capacity': int,\n"
    "      'recorded': int, 'dropped': int}\n"
    "EK = {'ring': str, 'id': int, 'seq': int, 'op': str, 'dtype': str, 'count': int, 'bytes': int, 'root': int,\n"
    "      'peer': int, 'redop': str, 'label': str, 'state': str, 'waiting_for': list, 'algo': str,\n"
    "      'transport': str, 't_queued_ns': int, 't_started_ns': int, 't_done_ns': int, 'wait_ns': int,\n"
    "      't_waiting_ns': int}\n"
    "def check(o, keys, what):\n"
    "    for k, t in keys.items():\n"
    "        assert k in o, f'{what}: no key {k}: {o}'\n"
    "        assert isinstance(o[k], t), f'{what}: {k} is {type(o[k])}: {o}'\n"
    "check(h, HK, 'header')\n"
    "assert h['format'] == 'dshim-trace' and h['version'] == 1\n"
    "rings, ents = {}, {}\n"
    "for o in objs[1:]:\n"
    "    if 'id' in o:\n"
    "        check(o, EK, 'entry')\n"
    "        assert o['ring'] in rings, 'entry before its ring line'\n"
    "        assert o['state'] in ('queued', 'started', 'waiting', 'done', 'failed'), o\n"
    "        assert all(isinstance(r, int) for r in o['waiting_for'])\n"
    "        ents[o['ring']].append(o)\n"
    "    else:\n"
    "        check(o, RK, 'ring')\n"
    "        rings[o['ring']] = o\n"
    "        ents[o['ring']] = []\n"
    "for name, es in ents.items():\n"
    "    ids = [e['id'] for e in es]\n"
    "    assert ids == sorted(ids), 'entries oldest first'\n"
    "    assert len(es) == rings[name]['recorded'] - rings[name]['dropped']\n"
    "first = ents[next(iter(rings))] if rings else []\n"
    "ok = eval(expr)\n"
    "if not ok:\n"
    "    print('failed:', expr, '\\n', '\\n'.join(lines[:3] + lines[-3:]), file=sys.stderr)\n"
    "sys.exit(0 if ok else 1)\n";

static int validate(const char *path, const char *expr)
{
    char script[300];
    snprintf(script, sizeof(script), "%s.check.py", tdir);
    FILE *f = fopen(script, "w");
    ck_assert_ptr_nonnull(f);
    fputs(validator, f);
    fclose(f);
    pid_t pid = fork();
    if (pid == 0) {
        execlp("python3", "python3", script, path, expr, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    unlink(script);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

static dshim_trace_op_t op_allreduce(uint64_t count)
{
    dshim_trace_op_t op = {.op = "allreduce", .dtype = DSHIM_FLOAT32, .redop = DSHIM_SUM, .count = count,
                           .bytes = count * 4, .root = -1, .peer = -1};
    return op;
}

/* The rings a case opened: closed by the fixture's teardown too, so that a
 * failed case leaves none open for the next (unforked runs share them). */
static dshim_trace_ring_t *opened[8];
static int nopened;

static dshim_trace_ring_t *open_info(const dshim_trace_ring_info_t *info)
{
    dshim_trace_ring_t *ring = dshim_trace_open(info);
    if (ring && nopened < 8) {
        opened[nopened++] = ring;
    }
    return ring;
}

static dshim_trace_ring_t *open_ring(const char *name, int rank, int size)
{
    dshim_trace_ring_info_t info = {.name = name, .desc = "test ring", .rank = rank, .size = size};
    return open_info(&info);
}

static void close_all(void)
{
    while (nopened > 0) {
        dshim_trace_close(opened[--nopened]);
    }
}

/* ---- in one process ------------------------------------------------------ */

START_TEST(test_off)
{
    use_env("0");
    ck_assert_ptr_null(open_ring("c0/", 0, 1));
    /* every call takes the NULL ring */
    dshim_trace_op_t op = op_allreduce(1);
    uint64_t id = dshim_trace_queued(NULL, &op);
    dshim_trace_started(NULL, id, 0, "ring", "shm");
    dshim_trace_waiting(NULL, id, (int[]){1}, 1);
    dshim_trace_moving(NULL, id);
    dshim_trace_done(NULL, id, 1);
    dshim_trace_set_desc(NULL, "x");
    dshim_trace_close(NULL);
    dshim_trace_snapshot_t snap;
    ck_assert_int_eq(dshim_trace_snapshot(NULL, &snap), DSHIM_OK);
    ck_assert_uint_eq(snap.n, 0);
    dshim_trace_snapshot_free(&snap);
    ck_assert_int_eq(dshim_trace_dump(), DSHIM_OK);
    ck_assert_int_eq(count_files(tdir), 0);
    remove_dir(tdir);
}
END_TEST

START_TEST(test_wrap_and_dropped)
{
    use_env("4");
    dshim_trace_ring_t *ring = open_ring("c0/", 0, 2);
    ck_assert_ptr_nonnull(ring);
    dshim_trace_op_t op = op_allreduce(1);
    uint64_t ids[10];
    for (int i = 0; i < 10; i++) {
        ids[i] = dshim_trace_queued(ring, &op);
        ck_assert_uint_eq(ids[i], (uint64_t)i);
    }
    /* id 2's slot holds id 6 (or later) now: its update is dropped */
    dshim_trace_done(ring, ids[2], 1);
    dshim_trace_started(ring, ids[7], 42, "rd", "shm");
    dshim_trace_done(ring, ids[9], 0);
    dshim_trace_snapshot_t snap;
    ck_assert_int_eq(dshim_trace_snapshot(ring, &snap), DSHIM_OK);
    ck_assert_uint_eq(snap.capacity, 4);
    ck_assert_uint_eq(snap.recorded, 10);
    ck_assert_uint_eq(snap.dropped, 6);
    ck_assert_uint_eq(snap.n, 4);
    for (size_t i = 0; i < snap.n; i++) {
        ck_assert_uint_eq(snap.entries[i].id, 6 + i); /* oldest first */
    }
    ck_assert_int_eq(snap.entries[0].state, DSHIM_TRACE_QUEUED);
    ck_assert_int_eq(snap.entries[1].state, DSHIM_TRACE_STARTED);
    ck_assert_uint_eq(snap.entries[1].seq, 42);
    ck_assert_int_eq(snap.entries[3].state, DSHIM_TRACE_FAILED);
    ck_assert_str_eq(snap.name, "c0/");
    ck_assert_str_eq(snap.desc, "test ring");
    ck_assert_int_eq(snap.world_rank, 0);
    dshim_trace_snapshot_free(&snap);
    /* exactly full, then one more: the wrap point itself */
    for (int i = 0; i < 2; i++) {
        dshim_trace_queued(ring, &op);
    }
    ck_assert_int_eq(dshim_trace_snapshot(ring, &snap), DSHIM_OK);
    ck_assert_uint_eq(snap.entries[0].id, 8);
    ck_assert_uint_eq(snap.entries[3].id, 11);
    dshim_trace_snapshot_free(&snap);
    close_all();
    remove_dir(tdir);
}
END_TEST

START_TEST(test_states_and_times)
{
    use_env("16");
    dshim_trace_ring_t *ring = open_ring("c0/", 1, 4);
    dshim_trace_op_t op = op_allreduce(1000);
    op.root = -1;
    uint64_t a = dshim_trace_queued(ring, &op);
    uint64_t b = dshim_trace_queued(ring, &op);
    dshim_trace_snapshot_t snap;
    dshim_trace_snapshot(ring, &snap);
    const dshim_trace_entry_t *e = &snap.entries[0];
    ck_assert_int_eq(e->state, DSHIM_TRACE_QUEUED);
    ck_assert_uint_eq(e->seq, UINT64_MAX);
    ck_assert_uint_gt(e->t_queued_ns, 0);
    ck_assert_uint_eq(e->t_started_ns, 0);
    ck_assert_str_eq(e->op.op, "allreduce");
    ck_assert_uint_eq(e->op.bytes, 4000);
    dshim_trace_snapshot_free(&snap);

    dshim_trace_started(ring, a, 7, "ring", "shm+tcp");
    dshim_trace_started(ring, a, UINT64_MAX, NULL, NULL); /* a second call keeps what is known */
    dshim_trace_waiting(ring, a, (int[]){2, 3, 2}, 3);
    sleep_s(0.003);
    dshim_trace_snapshot(ring, &snap);
    e = &snap.entries[0];
    ck_assert_int_eq(e->state, DSHIM_TRACE_WAITING);
    ck_assert_uint_eq(e->seq, 7);
    ck_assert_str_eq(e->algo, "ring");
    ck_assert_str_eq(e->transport, "shm+tcp");
    ck_assert_int_eq(e->nwaiting, 3);
    ck_assert_int_eq(e->waiting_for[1], 3);
    ck_assert_uint_ge(e->t_started_ns, e->t_queued_ns);
    ck_assert_uint_ge(e->t_waiting_ns, e->t_started_ns);
    ck_assert_uint_eq(e->wait_ns, 0);
    uint64_t started = e->t_started_ns;
    dshim_trace_snapshot_free(&snap);

    dshim_trace_moving(ring, a);
    dshim_trace_snapshot(ring, &snap);
    e = &snap.entries[0];
    ck_assert_int_eq(e->state, DSHIM_TRACE_STARTED);
    ck_assert_uint_ge(e->wait_ns, 3000000);
    ck_assert_uint_eq(e->t_waiting_ns, 0);
    ck_assert_int_eq(e->nwaiting, 0);
    /* counter stamps are converted at each snapshot: equal within the time
     * a clock pair takes to read (microseconds under valgrind) */
    ck_assert_uint_lt(e->t_started_ns > started ? e->t_started_ns - started : started - e->t_started_ns, 100000);
    uint64_t waited = e->wait_ns;
    dshim_trace_snapshot_free(&snap);

    /* a wait that ends in failure: counted, and whom it waited for is kept */
    dshim_trace_waiting(ring, a, (int[]){3}, 1);
    sleep_s(0.002);
    dshim_trace_done(ring, a, 0);
    /* b never ran: it fails at once */
    dshim_trace_done(ring, b, 1);
    dshim_trace_done(ring, b, 0); /* a second end changes nothing */
    dshim_trace_snapshot(ring, &snap);
    e = &snap.entries[0];
    ck_assert_int_eq(e->state, DSHIM_TRACE_FAILED);
    ck_assert_int_eq(e->nwaiting, 1);
    ck_assert_int_eq(e->waiting_for[0], 3);
    ck_assert_uint_ge(e->wait_ns, waited + 2000000);
    ck_assert_uint_ge(e->t_done_ns, e->t_started_ns);
    ck_assert_int_eq(snap.entries[1].state, DSHIM_TRACE_DONE);
    ck_assert_uint_gt(snap.entries[1].t_done_ns, 0);
    dshim_trace_snapshot_free(&snap);

    /* more ranks than kept */
    uint64_t c = dshim_trace_queued(ring, &op);
    int many[12];
    for (int i = 0; i < 12; i++) {
        many[i] = i;
    }
    dshim_trace_waiting(ring, c, many, 12);
    dshim_trace_snapshot(ring, &snap);
    ck_assert_int_eq(snap.entries[2].nwaiting, DSHIM_TRACE_WAIT_MAX);
    ck_assert_int_eq(snap.entries[2].state, DSHIM_TRACE_WAITING);
    ck_assert_uint_gt(snap.entries[2].t_started_ns, 0);
    dshim_trace_snapshot_free(&snap);
    close_all();
    remove_dir(tdir);
}
END_TEST

static dshim_trace_ring_t *label_ring;
static uint64_t label_other_id;

static void *label_other_thread(void *arg)
{
    (void)arg;
    dshim_trace_op_t op = op_allreduce(1);
    label_other_id = dshim_trace_queued(label_ring, &op);
    return NULL;
}

START_TEST(test_label_once_per_thread)
{
    use_env("16");
    label_ring = open_ring("c0/", 0, 2);
    dshim_trace_op_t op = op_allreduce(1);
    dshim_trace_label("torch all_reduce (DDP bucket 2) with a name longer than sixty-three bytes, cut");
    pthread_t t;
    pthread_create(&t, NULL, label_other_thread, NULL);
    pthread_join(t, NULL);
    uint64_t mine = dshim_trace_queued(label_ring, &op);
    uint64_t next = dshim_trace_queued(label_ring, &op);
    dshim_trace_label("cleared");
    dshim_trace_label(NULL);
    uint64_t cleared = dshim_trace_queued(label_ring, &op);
    dshim_trace_snapshot_t snap;
    dshim_trace_snapshot(label_ring, &snap);
    ck_assert_str_eq(snap.entries[label_other_id].label, ""); /* another thread's label */
    ck_assert_uint_eq(strlen(snap.entries[mine].label), DSHIM_TRACE_LABEL_LEN - 1);
    ck_assert(!strncmp(snap.entries[mine].label, "torch all_reduce (DDP bucket 2)", 31));
    ck_assert_str_eq(snap.entries[next].label, ""); /* taken once */
    ck_assert_str_eq(snap.entries[cleared].label, "");
    dshim_trace_snapshot_free(&snap);
    close_all();
    remove_dir(tdir);
}
END_TEST

#define WRITERS 4
#define OPS_PER_WRITER 20000
static dshim_trace_ring_t *conc_ring;

static void *writer_thread(void *arg)
{
    long w = (long)arg;
    dshim_trace_op_t op = op_allreduce((uint64_t)w + 1);
    for (int i = 0; i < OPS_PER_WRITER; i++) {
        uint64_t id = dshim_trace_queued(conc_ring, &op);
        dshim_trace_started(conc_ring, id, (uint64_t)i, "rd", "shm");
        if (i % 7 == 0) {
            dshim_trace_waiting(conc_ring, id, (int[]){(int)w}, 1);
            dshim_trace_moving(conc_ring, id);
        }
        dshim_trace_done(conc_ring, id, 1);
    }
    return NULL;
}

START_TEST(test_snapshot_concurrent_writers)
{
    use_env("256");
    conc_ring = open_ring("c0/", 0, 2);
    pthread_t t[WRITERS];
    for (long w = 0; w < WRITERS; w++) {
        pthread_create(&t[w], NULL, writer_thread, (void *)w);
    }
    int snaps = 0;
    uint64_t last_recorded = 0;
    for (;;) {
        dshim_trace_snapshot_t snap;
        ck_assert_int_eq(dshim_trace_snapshot(conc_ring, &snap), DSHIM_OK);
        ck_assert_uint_le(snap.n, 256);
        ck_assert_uint_ge(snap.recorded, last_recorded);
        last_recorded = snap.recorded;
        ck_assert_uint_eq(snap.n + snap.dropped, snap.recorded);
        for (size_t i = 0; i < snap.n; i++) {
            const dshim_trace_entry_t *e = &snap.entries[i];
            /* a consistent copy: consecutive ids, whole entries */
            ck_assert_uint_eq(e->id, snap.dropped + i);
            ck_assert(e->state >= DSHIM_TRACE_QUEUED && e->state <= DSHIM_TRACE_DONE);
            ck_assert(e->op.count >= 1 && e->op.count <= WRITERS);
            ck_assert_uint_eq(e->op.bytes, e->op.count * 4);
            if (e->state == DSHIM_TRACE_DONE) {
                ck_assert_uint_ge(e->t_done_ns, e->t_started_ns);
                ck_assert_int_eq(e->nwaiting, 0);
            }
        }
        dshim_trace_snapshot_free(&snap);
        snaps++;
        if (last_recorded == (uint64_t)WRITERS * OPS_PER_WRITER) {
            break;
        }
    }
    for (int w = 0; w < WRITERS; w++) {
        pthread_join(t[w], NULL);
    }
    ck_assert_int_gt(snaps, 0);
    close_all();
    remove_dir(tdir);
}
END_TEST

START_TEST(test_dump_file_is_json_lines)
{
    use_env("3");
    /* a directory that does not exist yet: made, mode 0700 */
    char sub[300];
    snprintf(sub, sizeof(sub), "%s/job/dumps", tdir);
    setenv("DSHIM_TRACE_DIR", sub, 1);
    dshim_config_reload();
    dshim_trace_ring_t *world = open_ring("c0/@127.0.0.1:29500", 1, 2);
    dshim_trace_ring_info_t info = {.name = "c0/hl0/@127.0.0.1:29500", .desc = NULL, .rank = 0, .size = 1};
    dshim_trace_ring_t *sub_ring = open_info(&info);
    dshim_trace_set_desc(world, "torch \"default_pg\" \\ group\n0");
    dshim_trace_op_t op = op_allreduce(25165824);
    for (int i = 0; i < 5; i++) {
        uint64_t id = dshim_trace_queued(world, &op);
        dshim_trace_started(world, id, (uint64_t)i, "ring", "shm");
        if (i < 4) {
            dshim_trace_done(world, id, 1);
        } else {
            dshim_trace_waiting(world, id, (int[]){0}, 1);
        }
    }
    /* bytes that are not UTF-8, control characters, a valid UTF-8 name */
    dshim_trace_label("key \xff\xfe caf\xc3\xa9 \x01 \"q\"");
    dshim_trace_op_t send = {.op = "send", .dtype = DSHIM_UINT8, .redop = -1, .count = 3, .bytes = 3,
                             .root = -1, .peer = 0};
    dshim_trace_queued(sub_ring, &send);
    ck_assert_int_eq(dshim_trace_dump(), DSHIM_OK);
    char path[600];
    ck_assert(find_dump(sub, 1, path, sizeof(path)));
    struct stat st;
    ck_assert_int_eq(stat(sub, &st), 0);
    ck_assert_int_eq(st.st_mode & 0777, 0700);
    ck_assert_int_eq(count_files(sub), 1); /* no temporary left */
    ck_assert_int_eq(
        validate(path, "h['rank'] == 1 and h['size'] == 2 and h['reason'] == 'request' and h['why'] == '' and "
                       "list(rings) == ['c0/@127.0.0.1:29500', 'c0/hl0/@127.0.0.1:29500'] and "
                       "rings['c0/@127.0.0.1:29500']['desc'] == 'torch \"default_pg\" \\\\ group\\n0' and "
                       "rings['c0/@127.0.0.1:29500']['dropped'] == 2 and len(first) == 3 and "
                       "[e['seq'] for e in first] == [2, 3, 4] and first[-1]['state'] == 'waiting' and "
                       "first[-1]['waiting_for'] == [0] and first[0]['count'] == 25165824 and "
                       "first[0]['dtype'] == 'float32' and first[0]['redop'] == 'sum' and "
                       "first[0]['algo'] == 'ring' and first[0]['transport'] == 'shm' and "
                       "first[-1]['t_waiting_ns'] > 0 and first[-1]['t_done_ns'] == 0 and "
                       "ents['c0/hl0/@127.0.0.1:29500'][0]['seq'] == -1 and "
                       "ents['c0/hl0/@127.0.0.1:29500'][0]['redop'] == '' and "
                       "ents['c0/hl0/@127.0.0.1:29500'][0]['peer'] == 0 and "
                       "ents['c0/hl0/@127.0.0.1:29500'][0]['label'] == 'key \\ufffd\\ufffd caf\\u00e9 \\x01 \"q\"'"),
        0);
    close_all();
    remove_dir(tdir);
}
END_TEST

/* One failure reaches every communicator at once: the first dump tells it,
 * later failures within a second do not overwrite it; requests always do. */
START_TEST(test_failure_dumps_once)
{
    use_env("8");
    dshim_trace_ring_t *ring = open_ring("c0/", 0, 2);
    dshim_trace_op_t op = op_allreduce(1);
    dshim_trace_queued(ring, &op);
    sleep_s(1.1); /* another case's failure dump (unforked runs) is older than a second */
    dshim_trace_dump_all("timeout", "rank 0 (host h) in allreduce #0: did not complete");
    /* the echo at once: checking the first dump in between (a Python process) can take longer than
     * the second under valgrind on a loaded machine */
    dshim_trace_dump_all("peer", "an echo");
    char path[600];
    ck_assert(find_dump(tdir, 0, path, sizeof(path)));
    ck_assert_int_eq(validate(path, "h['reason'] == 'timeout' and h['why'].startswith('rank 0 (host h)')"), 0);
    ck_assert_int_eq(dshim_trace_dump(), DSHIM_OK);
    /* the request replaces the file, not what the failure said */
    ck_assert_int_eq(validate(path, "h['reason'] == 'request' and h['failed_reason'] == 'timeout' and "
                                    "h['failed_why'].startswith('rank 0 (host h)')"),
                     0);
    ck_assert_int_eq(count_files(tdir), 1);
    close_all();
    remove_dir(tdir);
}
END_TEST

START_TEST(test_dump_dir_error)
{
    use_env("8");
    setenv("DSHIM_TRACE_DIR", "/proc/self/no/such/dir", 1);
    dshim_config_reload();
    ck_assert_ptr_nonnull(open_ring("c0/", 0, 1));
    dshim_status_t st = dshim_trace_dump();
    ck_assert_int_eq(st, DSHIM_ERR_SYSTEM);
    ck_assert_msg(strstr(dshim_last_error(), "cannot create the directory /proc/self/no"), "%s",
                  dshim_last_error());
    close_all();
    remove_dir(tdir);
}
END_TEST

/* ---- signals, in children of their own (the handler is once per process) -- */

/* Runs fn in a child; returns its wait status. */
static int in_child(int (*fn)(void))
{
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        _exit(fn());
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return status;
}

static int wait_for_dump(int rank, char *path, size_t len, double seconds)
{
    double until = now_s() + seconds;
    while (now_s() < until) {
        if (find_dump(tdir, rank, path, len)) {
            return 1;
        }
        sleep_s(0.01);
    }
    return 0;
}

static int child_signal_dump(void)
{
    dshim_trace_ring_t *ring = open_ring("c0/", 0, 1);
    dshim_trace_op_t op = op_allreduce(1);
    dshim_trace_queued(ring, &op);
    kill(getpid(), SIGUSR2);
    char path[600];
    /* the process goes on: the recorder thread writes the dump */
    return wait_for_dump(0, path, sizeof(path), 10) ? 0 : 1;
}

START_TEST(test_signal_dumps_and_goes_on)
{
    use_env("8");
    int status = in_child(child_signal_dump);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status 0x%x", status);
    char path[600];
    ck_assert(find_dump(tdir, 0, path, sizeof(path)));
    ck_assert_int_eq(validate(path, "h['reason'] == 'request' and h['why'] == 'SIGUSR2' and len(first) == 1"), 0);
    remove_dir(tdir);
}
END_TEST

static volatile sig_atomic_t app_got;
static void app_handler(int sig)
{
    (void)sig;
    app_got = 1;
}

static int child_app_keeps_signal(void)
{
    signal(SIGUSR1, app_handler);
    dshim_trace_ring_t *ring = open_ring("c0/", 0, 1);
    struct sigaction now;
    sigaction(SIGUSR1, NULL, &now);
    if (now.sa_handler != app_handler) {
        return 1;
    }
    kill(getpid(), SIGUSR1);
    sleep_s(0.2);
    char path[600];
    dshim_trace_close(ring);
    return app_got && !find_dump(tdir, 0, path, sizeof(path)) ? 0 : 2;
}

static int child_signal_none(void)
{
    dshim_trace_ring_t *ring = open_ring("c0/", 0, 1);
    struct sigaction now;
    sigaction(SIGUSR2, NULL, &now);
    dshim_trace_close(ring);
    return now.sa_handler == SIG_DFL ? 0 : 1;
}

START_TEST(test_signal_only_over_default)
{
    const char *fork_mode = getenv("CK_FORK");
    if (fork_mode && !strcmp(fork_mode, "no")) {
        /* unforked (the valgrind stage), an earlier case's ring has looked at
         * the disposition already: what this case checks happens once */
        return;
    }
    use_env("8");
    setenv("DSHIM_TRACE_SIGNAL", "USR1", 1);
    dshim_config_reload();
    int status = in_child(child_app_keeps_signal);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status 0x%x", status);
    setenv("DSHIM_TRACE_SIGNAL", "NONE", 1);
    dshim_config_reload();
    status = in_child(child_signal_none);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status 0x%x", status);
    unsetenv("DSHIM_TRACE_SIGNAL");
    dshim_config_reload();
    remove_dir(tdir);
}
END_TEST

/* A forked child has no recorder thread and must not make its parent dump;
 * its own first ring gives it its own. */
static int child_forks(void)
{
    dshim_trace_ring_t *ring = open_ring("c0/", 0, 1);
    pid_t pid = fork();
    if (pid == 0) {
        kill(getpid(), SIGUSR2); /* inherited handler, no pipe: nothing */
        sleep_s(0.2);
        dshim_trace_ring_t *mine = open_ring("child/", 0, 1);
        kill(getpid(), SIGUSR2);
        char path[600];
        int ok = wait_for_dump(0, path, sizeof(path), 10);
        dshim_trace_close(mine);
        _exit(ok ? 0 : 3);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    dshim_trace_close(ring);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 4;
}

START_TEST(test_fork_child_dumps_its_own)
{
#ifdef __SANITIZE_THREAD__
    /* TSan does not support threads started in the child of a threaded
     * process (the recorder's): the dump hangs in its runtime there */
    return;
#endif
    use_env("8");
    int status = in_child(child_forks);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status 0x%x", status);
    ck_assert_int_eq(count_files(tdir), 1);
    char path[600];
    ck_assert(find_dump(tdir, 0, path, sizeof(path)));
    /* the child's file has the child's ring only */
    ck_assert_int_eq(validate(path, "list(rings) == ['child/'] and h['reason'] == 'request'"), 0);
    remove_dir(tdir);
}
END_TEST

static int child_crash(void)
{
    dshim_crash_install();
    dshim_trace_ring_t *ring = open_ring("c0/", 0, 1);
    dshim_trace_op_t op = op_allreduce(1);
    uint64_t id = dshim_trace_queued(ring, &op);
    dshim_trace_started(ring, id, 0, "rd", "shm");
    int null = open("/dev/null", O_WRONLY);
    dup2(null, 2); /* the backtrace is check_crash's business */
    abort();
}

START_TEST(test_crash_dumps)
{
    use_env("8");
    int status = in_child(child_crash);
    ck_assert_msg(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT, "status 0x%x", status);
    char path[600];
    ck_assert(find_dump(tdir, 0, path, sizeof(path)));
    ck_assert_int_eq(validate(path, "h['reason'] == 'crash' and h['why'] == 'SIGABRT' and "
                                    "first[0]['state'] == 'started'"),
                     0);
    remove_dir(tdir);
}
END_TEST

/* ---- real ranks ------------------------------------------------------------ */

#define OPS_BEFORE 3

/* Rank 1 skips allreduce #3: rank 0 times out in it and dumps (reason
 * timeout, waiting for rank 1), then asks rank 1 for its dump with the
 * signal, as dshim-run does. */
static int body_skip(int rank, int size, int port, void *arg)
{
    (void)arg;
    dshim_comm_t *comm;
    if (test_comm_init(rank, size, port, &comm)) {
        return 2;
    }
    float v[16] = {1};
    for (int i = 0; i < OPS_BEFORE; i++) {
        if (dshim_allreduce(comm, v, v, 16, DSHIM_FLOAT32, DSHIM_SUM) != DSHIM_OK) {
            return 3;
        }
    }
    char path[600];
    if (rank == 1) {
        /* not in dshim: the signal's dump must come anyway */
        return wait_for_dump(1, path, sizeof(path), 30) ? 0 : 4;
    }
    dshim_status_t st = dshim_allreduce(comm, v, v, 16, DSHIM_FLOAT32, DSHIM_SUM);
    if (st != DSHIM_ERR_TIMEOUT) {
        return 5;
    }
    if (!find_dump(tdir, 0, path, sizeof(path))) {
        return 6; /* written before the failure returned */
    }
    kill(comm->peers[1].pid, SIGUSR2);
    return 0;
}

START_TEST(test_skipped_collective_dumps)
{
    use_env("2000");
    char dir_env[300];
    snprintf(dir_env, sizeof(dir_env), "DSHIM_TRACE_DIR=%s", tdir);
    const char *env[] = {"DSHIM_TIMEOUT=1.5", "DSHIM_STALL_WARN=0", dir_env, NULL};
    test_rank_result_t res[2];
    ck_assert_int_eq(test_run_ranks(2, body_skip, NULL, env, 60.0, res), 0);
    for (int r = 0; r < 2; r++) {
        ck_assert_msg(res[r].exited && res[r].code == 0, "rank %d: %d\n%s", r, res[r].code, res[r].err);
    }
    ck_assert_msg(strstr(res[0].err, "flight recorder written to"), "%s", res[0].err);
    char p0[600], p1[600];
    ck_assert(find_dump(tdir, 0, p0, sizeof(p0)));
    ck_assert(find_dump(tdir, 1, p1, sizeof(p1)));
    ck_assert_int_eq(validate(p0, "h['reason'] == 'timeout' and 'allreduce #3' in h['why'] and h['rank'] == 0 and "
                                  "h['size'] == 2 and first[-1]['op'] == 'allreduce' and first[-1]['seq'] == 3 and "
                                  "first[-1]['state'] == 'waiting' and 1 in first[-1]['waiting_for'] and "
                                  "first[-1]['transport'] != '' and first[-1]['algo'] == 'rd' and "
                                  "all(e['state'] == 'done' for e in first[:-1]) and len(first) == 4"),
                     0);
    ck_assert_int_eq(validate(p1, "h['reason'] == 'request' and 'failed_reason' not in h and h['rank'] == 1 and "
                                  "len(first) == 3 and "
                                  "[e['seq'] for e in first] == [0, 1, 2] and "
                                  "all(e['state'] == 'done' and e['t_done_ns'] >= e['t_started_ns'] > 0 "
                                  "for e in first)"),
                     0);
    remove_dir(tdir);
}
END_TEST

/* Rank 0 waits in an allreduce that rank 1 joins late; rank 1 signals rank
 * 0 meanwhile: rank 0 dumps (the allreduce waiting for rank 1) and the
 * allreduce then completes on both. */
static int body_signal(int rank, int size, int port, void *arg)
{
    (void)arg;
    dshim_comm_t *comm;
    if (test_comm_init(rank, size, port, &comm)) {
        return 2;
    }
    double v = 1;
    if (rank == 1) {
        sleep_s(0.5);
        kill(comm->peers[0].pid, SIGUSR2);
        char path[600];
        if (!wait_for_dump(0, path, sizeof(path), 20)) {
            return 4;
        }
    }
    if (dshim_allreduce(comm, &v, &v, 1, DSHIM_FLOAT64, DSHIM_SUM) != DSHIM_OK || v != 2) {
        return 3;
    }
    return dshim_comm_destroy(comm) == DSHIM_OK ? 0 : 5;
}

START_TEST(test_signal_while_blocked)
{
    use_env("2000");
    char dir_env[300];
    snprintf(dir_env, sizeof(dir_env), "DSHIM_TRACE_DIR=%s", tdir);
    const char *env[] = {"DSHIM_TIMEOUT=60", dir_env, NULL};
    test_rank_result_t res[2];
    ck_assert_int_eq(test_run_ranks(2, body_signal, NULL, env, 60.0, res), 0);
    for (int r = 0; r < 2; r++) {
        ck_assert_msg(res[r].exited && res[r].code == 0, "rank %d: %d\n%s", r, res[r].code, res[r].err);
    }
    char p0[600];
    ck_assert(find_dump(tdir, 0, p0, sizeof(p0)));
    ck_assert_int_eq(count_files(tdir), 1);
    ck_assert_int_eq(validate(p0, "h['reason'] == 'request' and len(first) == 1 and first[0]['seq'] == 0 and "
                                  "first[0]['state'] == 'waiting' and first[0]['waiting_for'] == [1] and "
                                  "first[0]['op'] == 'allreduce' and first[0]['dtype'] == 'float64'"),
                     0);
    remove_dir(tdir);
}
END_TEST

static Suite *trace_suite(void)
{
    Suite *s = suite_create("trace");
    TCase *tc = tcase_create("ring");
    tcase_set_timeout(tc, 120);
    tcase_add_checked_fixture(tc, NULL, close_all);
    tcase_add_test(tc, test_off);
    tcase_add_test(tc, test_wrap_and_dropped);
    tcase_add_test(tc, test_states_and_times);
    tcase_add_test(tc, test_label_once_per_thread);
    tcase_add_test(tc, test_snapshot_concurrent_writers);
    tcase_add_test(tc, test_dump_file_is_json_lines);
    tcase_add_test(tc, test_failure_dumps_once);
    tcase_add_test(tc, test_dump_dir_error);
    suite_add_tcase(s, tc);
    TCase *sig = tcase_create("signals");
    tcase_set_timeout(sig, 120);
    tcase_add_test(sig, test_signal_dumps_and_goes_on);
    tcase_add_test(sig, test_signal_only_over_default);
    tcase_add_test(sig, test_fork_child_dumps_its_own);
    tcase_add_test(sig, test_crash_dumps);
    suite_add_tcase(s, sig);
    const char *fork_mode = getenv("CK_FORK");
    if (!fork_mode || strcmp(fork_mode, "no") != 0) {
        /* not unforked (the valgrind stage): every rank would be a whole
         * valgrind process, as in check_failure, which that stage skips */
        TCase *ranks = tcase_create("ranks");
        tcase_set_timeout(ranks, 120);
        tcase_add_test(ranks, test_skipped_collective_dumps);
        tcase_add_test(ranks, test_signal_while_blocked);
        suite_add_tcase(s, ranks);
    }
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(trace_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

/* The flight recorder's rings and the registry of open rings (trace.h).
 *
 * A ring is an array of at least `capacity` entries, a power of two (a
 * mask, not a division, on the hot path); entry id i lives in slot i & mask,
 * the newest `capacity` ids are what snapshots show, and an update for an
 * id whose slot was reused since (slot id differs) is dropped.  Every event
 * is one short critical section on the ring's own spin lock: the submitter
 * (queued) and the executor (started, waiting, moving, done) rarely contend,
 * and the dumper only copies under it.  No allocation after open and no
 * system call: the time stamps are the CPU's counter or the vDSO's
 * clock_gettime (below). */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "log.h"
#include "status.h"
#include "trace_impl.h"

struct dshim_trace_ring {
    int lock;                      /* ring_lock / ring_unlock */
    size_t capacity;               /* entries kept (DSHIM_TRACE_BUFFER) */
    uint64_t mask;                 /* slots - 1 (slots: capacity up to a power of two) */
    uint64_t next_id;              /* = recorded */
    dshim_trace_entry_t *entries;  /* [mask + 1] */
    pid_t owner_pid;               /* a forked child must not dump its parent's rings */
    char name[96];
    char desc[128];
    int rank, size;
    int timeline;                  /* DSHIM_TIMELINE/DSHIM_SUMMARY take its finished ops */
    struct dshim_trace_ring *prev, *next; /* registry */
};

/* A ring's lock.  Every operation takes it twice (begin, done), almost always
 * uncontended, from the thread that runs the operation: a spin lock whose
 * release is a plain store, where a mutex's unlock is a second locked
 * instruction, a full barrier behind the entry's stores.  Without either
 * unlock barrier (test build, no lock at all) a 2-rank barrier took 0.86 of
 * its time (docs/benchmarks.md, "The per-op path").  Holders are short
 * except a dump's copy of the ring and a timeline flush (rare): a waiter
 * yields its core meanwhile. */
static inline int ring_trylock(dshim_trace_ring_t *ring)
{
    return !__atomic_exchange_n(&ring->lock, 1, __ATOMIC_ACQUIRE);
}

static inline void ring_lock(dshim_trace_ring_t *ring)
{
    while (!ring_trylock(ring)) {
        while (__atomic_load_n(&ring->lock, __ATOMIC_RELAXED)) {
            sched_yield();
        }
    }
}

static inline void ring_unlock(dshim_trace_ring_t *ring)
{
    __atomic_store_n(&ring->lock, 0, __ATOMIC_RELEASE);
}

/* The registry: every open ring of the process, for dumps. */
static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t reg_atfork_once = PTHREAD_ONCE_INIT;
static void reg_atfork_install(void);
static dshim_trace_ring_t *reg_head;
/* the world communicator's rank and size once a ring of the world's size
 * opened (see dshim_trace_world); under reg_lock */
static int world_rank = -1, world_size = -1;

uint64_t dshim_trace_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- the rings' clock -----------------------------------------------------
 * Every op takes two or three time stamps: at a 4 KiB allreduce (~1.5 us
 * between two ranks of a host) clock_gettime's ~23 ns each were most of the
 * recorder's cost.  Where the CPU's counter is a usable clock (x86 TSC: the
 * kernel's own clocksource, constant and non-stop; it reads in ~10 ns) the
 * rings keep raw counter values and convert them to CLOCK_MONOTONIC ns when
 * a snapshot is taken: anchored at that moment, with the rate measured over
 * everything since the first ring opened, so recent entries are exact and
 * old ones off by the rate's error times their age (ppm).  When the
 * timeline or the summary take entries as they finish (in ns), and where
 * the counter is not usable, the stamps are clock_gettime's ns. */
enum { CLK_NS = 0, CLK_TSC = 1 };
static int clk_mode = CLK_NS;
static uint64_t clk_tick0, clk_ns0; /* the first pair read */
static pthread_once_t clk_once = PTHREAD_ONCE_INIT;

static inline uint64_t ticks(void)
{
#if defined(__x86_64__)
    if (clk_mode == CLK_TSC) {
        return __builtin_ia32_rdtsc();
    }
#endif
    return dshim_trace_now_ns();
}

/* The kernel keeps time with the TSC, and the CPU says it ticks at one
 * rate in every power state: then it is monotonic and equal on all CPUs. */
static int tsc_usable(void)
{
#if defined(__x86_64__)
    char buf[64] = "";
    FILE *f = fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "r");
    if (!f) {
        return 0;
    }
    int ok = fgets(buf, sizeof(buf), f) && !strncmp(buf, "tsc", 3) && (buf[3] == '\n' || !buf[3]);
    fclose(f);
    if (!ok) {
        return 0;
    }
    f = fopen("/proc/cpuinfo", "r");
    if (!f) {
        return 0;
    }
    char line[8192];
    int constant = 0, nonstop = 0;
    while (fgets(line, sizeof(line), f)) {
        if (!strncmp(line, "flags", 5)) {
            constant = strstr(line, " constant_tsc") != NULL;
            nonstop = strstr(line, " nonstop_tsc") != NULL;
            break; /* the first CPU's; the kernel checked the others agree */
        }
    }
    fclose(f);
    return constant && nonstop;
#else
    return 0;
#endif
}

/* A counter value and the monotonic ns of the same moment. */
static void clk_pair(uint64_t *tick_p, uint64_t *ns_p)
{
    uint64_t a = ticks();
    uint64_t ns = dshim_trace_now_ns();
    uint64_t b = ticks();
    *tick_p = a + (b - a) / 2;
    *ns_p = ns;
}

static void clk_init(void)
{
    if (!dshim_trace_timeline_wanted() && tsc_usable()) {
        clk_mode = CLK_TSC;
    }
    clk_pair(&clk_tick0, &clk_ns0);
}

/* How a snapshot turns its ring's stamps into ns. */
typedef struct clk_conv {
    uint64_t tick, ns; /* a pair read now */
    double ns_per_tick;
} clk_conv_t;

static void clk_conv_now(clk_conv_t *c)
{
    pthread_once(&clk_once, clk_init);
    clk_pair(&c->tick, &c->ns);
    c->ns_per_tick = 1.0;
    if (clk_mode == CLK_NS) {
        return;
    }
    /* at least 20 ms of history for the rate (ppm); only a dump in a
     * process's first moments waits for it */
    while (c->ns - clk_ns0 < 20000000u) {
        struct timespec ts = {0, (long)(20000000u - (c->ns - clk_ns0))};
        nanosleep(&ts, NULL);
        clk_pair(&c->tick, &c->ns);
    }
    c->ns_per_tick = (double)(c->ns - clk_ns0) / (double)(c->tick - clk_tick0);
}

static uint64_t clk_to_ns(const clk_conv_t *c, uint64_t t)
{
    if (!t || c->ns_per_tick == 1.0) {
        return t; /* 0 = not reached */
    }
    double d = ((double)(int64_t)(c->tick - t)) * c->ns_per_tick;
    return (uint64_t)((double)c->ns - d);
}

/* The world size the environment announces (-1 none), by the precedence of
 * dshim_args_from_env (shim/comm/env.c). */
static long env_world_size(const dshim_config_t *cfg)
{
    const long sizes[] = {cfg->world_size, cfg->env_world_size, cfg->ompi_size, cfg->pmi_size, cfg->slurm_ntasks};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        if (sizes[i] >= 0) {
            return sizes[i];
        }
    }
    return -1;
}

static long env_world_rank(const dshim_config_t *cfg)
{
    const long ranks[] = {cfg->rank, cfg->env_rank, cfg->ompi_rank, cfg->pmi_rank, cfg->slurm_procid};
    for (size_t i = 0; i < sizeof(ranks) / sizeof(ranks[0]); i++) {
        if (ranks[i] >= 0) {
            return ranks[i];
        }
    }
    return -1;
}

/* A new ring may tell who this process is: the first one of the world's
 * size (the environment's) is the world communicator.  reg_lock held. */
static void learn_world(const dshim_trace_ring_t *ring)
{
    if (world_rank >= 0) {
        return;
    }
    long ws = env_world_size(dshim_config());
    /* parameter-server rings (MXNet) number each role on its own: never the world */
    if (ws > 0 && ring->size == ws && strncmp(ring->name, "ps/", 3) != 0) {
        world_rank = ring->rank;
        world_size = ring->size;
    }
}

void dshim_trace_world_locked(int *rank_p, int *size_p)
{
    int r = world_rank, s = world_size;
    if (r < 0) {
        /* no world size in the environment (an explicit dshim_comm_init):
         * the oldest communicator still open is the job's, as in every
         * program we carry; the list is newest first */
        const dshim_trace_ring_t *oldest = NULL;
        pid_t me = getpid();
        for (const dshim_trace_ring_t *q = reg_head; q; q = q->next) {
            if (q->owner_pid == me) {
                oldest = q;
            }
        }
        const dshim_config_t *cfg = dshim_config();
        if (oldest && env_world_size(cfg) <= 0) {
            r = oldest->rank;
            s = oldest->size;
        } else {
            r = (int)env_world_rank(cfg);
            s = (int)env_world_size(cfg);
        }
    }
    *rank_p = r;
    *size_p = s;
}

void dshim_trace_world(int *rank_p, int *size_p)
{
    pthread_mutex_lock(&reg_lock);
    dshim_trace_world_locked(rank_p, size_p);
    pthread_mutex_unlock(&reg_lock);
}

/* What the timeline's hooks are told of a ring (pointers into it). */
static dshim_trace_ring_info_t info_of(const dshim_trace_ring_t *ring)
{
    dshim_trace_ring_info_t info = {.name = ring->name, .desc = ring->desc, .rank = ring->rank, .size = ring->size};
    return info;
}

/* Entries kept when the recorder is off but the timeline or the summary
 * wants the finished operations: enough for the operations in flight. */
#define TIMELINE_ONLY_CAPACITY 1024

dshim_trace_ring_t *dshim_trace_open(const dshim_trace_ring_info_t *info)
{
    long cap = dshim_config()->trace_buffer;
    int timeline = dshim_trace_timeline_wanted();
    if (cap <= 0 && timeline) {
        cap = TIMELINE_ONLY_CAPACITY;
    }
    if (cap <= 0 || !info) {
        return NULL;
    }
    dshim_trace_ring_t *ring = calloc(1, sizeof(*ring));
    size_t slots = 1;
    while (slots < (size_t)cap) {
        slots <<= 1;
    }
    /* calloc: untouched pages cost no memory until the ring fills them */
    dshim_trace_entry_t *entries = calloc(slots, sizeof(*entries));
    if (!ring || !entries) {
        free(ring);
        free(entries);
        DSHIM_WARN("flight recorder: out of memory for %ld entries; communicator %s is not recorded", cap,
                   info->name ? info->name : "?");
        return NULL;
    }
    ring->capacity = (size_t)cap;
    ring->mask = slots - 1;
    ring->entries = entries;
    ring->owner_pid = getpid();
    snprintf(ring->name, sizeof(ring->name), "%s", info->name ? info->name : "");
    snprintf(ring->desc, sizeof(ring->desc), "%s", info->desc ? info->desc : "");
    ring->rank = info->rank;
    ring->size = info->size;
    ring->timeline = timeline;
    pthread_once(&clk_once, clk_init);
    pthread_once(&reg_atfork_once, reg_atfork_install);
    pthread_mutex_lock(&reg_lock);
    ring->next = reg_head;
    if (reg_head) {
        reg_head->prev = ring;
    }
    reg_head = ring;
    learn_world(ring);
    pthread_mutex_unlock(&reg_lock);
    if (dshim_config()->trace_buffer > 0) {
        dshim_trace_signal_setup(); /* dumps: only with the recorder on */
    }
    if (timeline) {
        dshim_trace_ring_info_t ri = info_of(ring);
        dshim_trace_timeline_open(&ri);
    }
    return ring;
}

void dshim_trace_close(dshim_trace_ring_t *ring)
{
    if (!ring) {
        return;
    }
    pthread_mutex_lock(&reg_lock);
    if (ring->prev) {
        ring->prev->next = ring->next;
    } else if (reg_head == ring) {
        reg_head = ring->next;
    }
    if (ring->next) {
        ring->next->prev = ring->prev;
    }
    pthread_mutex_unlock(&reg_lock);
    if (ring->timeline) {
        dshim_trace_ring_info_t ri = info_of(ring);
        dshim_trace_timeline_close(&ri);
    }
    free(ring->entries);
    free(ring);
}

void dshim_trace_set_desc(dshim_trace_ring_t *ring, const char *desc)
{
    if (!ring) {
        return;
    }
    ring_lock(ring);
    snprintf(ring->desc, sizeof(ring->desc), "%s", desc ? desc : "");
    ring_unlock(ring);
}

/* The live entry of id, or NULL when its slot was reused since.  Lock held. */
static dshim_trace_entry_t *entry_of(dshim_trace_ring_t *ring, uint64_t id)
{
    dshim_trace_entry_t *e = &ring->entries[id & ring->mask];
    return e->id == id && id < ring->next_id ? e : NULL;
}

/* A new entry for op, queued at `now`.  Lock held. */
static dshim_trace_entry_t *new_entry(dshim_trace_ring_t *ring, const dshim_trace_op_t *op, uint64_t now)
{
    uint64_t id = ring->next_id++;
    dshim_trace_entry_t *e = &ring->entries[id & ring->mask];
    e->id = id;
    e->seq = UINT64_MAX;
    e->op = *op;
    dshim_trace_take_label(e->label); /* the calling thread's */
    e->state = DSHIM_TRACE_QUEUED;
    e->nwaiting = 0;
    e->algo = NULL;
    e->transport = NULL;
    e->t_queued_ns = now;
    e->t_started_ns = 0;
    e->t_done_ns = 0;
    e->t_waiting_ns = 0;
    e->wait_ns = 0;
    return e;
}

uint64_t dshim_trace_queued(dshim_trace_ring_t *ring, const dshim_trace_op_t *op)
{
    if (!ring) {
        return 0;
    }
    uint64_t now = ticks();
    ring_lock(ring);
    uint64_t id = new_entry(ring, op, now)->id;
    ring_unlock(ring);
    return id;
}

uint64_t dshim_trace_begin(dshim_trace_ring_t *ring, const dshim_trace_op_t *op, uint64_t seq, const char *algo,
                           const char *transport)
{
    if (!ring) {
        return 0;
    }
    uint64_t now = ticks();
    ring_lock(ring);
    dshim_trace_entry_t *e = new_entry(ring, op, now);
    e->seq = seq;
    e->algo = algo;
    e->transport = transport;
    e->state = DSHIM_TRACE_STARTED;
    e->t_started_ns = now;
    uint64_t id = e->id;
    ring_unlock(ring);
    return id;
}

void dshim_trace_started(dshim_trace_ring_t *ring, uint64_t id, uint64_t seq, const char *algo,
                         const char *transport)
{
    if (!ring) {
        return;
    }
    uint64_t now = ticks();
    ring_lock(ring);
    dshim_trace_entry_t *e = entry_of(ring, id);
    if (e) {
        if (seq != UINT64_MAX) {
            e->seq = seq;
        }
        if (algo) {
            e->algo = algo;
        }
        if (transport) {
            e->transport = transport;
        }
        /* a second call only completes what the first did not know (a
         * receive learns its number when its message begins) */
        if (e->state == DSHIM_TRACE_QUEUED) {
            e->state = DSHIM_TRACE_STARTED;
            e->t_started_ns = now;
        }
    }
    ring_unlock(ring);
}

/* Ends a wait in progress: its time goes to wait_ns.  Lock held. */
static void end_wait(dshim_trace_entry_t *e, uint64_t now)
{
    if (e->t_waiting_ns) {
        e->wait_ns += now > e->t_waiting_ns ? now - e->t_waiting_ns : 0;
        e->t_waiting_ns = 0;
    }
}

void dshim_trace_waiting(dshim_trace_ring_t *ring, uint64_t id, const int *ranks, int n)
{
    if (!ring) {
        return;
    }
    uint64_t now = ticks();
    if (n < 0) {
        n = 0;
    }
    if (n > DSHIM_TRACE_WAIT_MAX) {
        n = DSHIM_TRACE_WAIT_MAX;
    }
    ring_lock(ring);
    dshim_trace_entry_t *e = entry_of(ring, id);
    if (e && (e->state == DSHIM_TRACE_STARTED || e->state == DSHIM_TRACE_WAITING ||
              e->state == DSHIM_TRACE_QUEUED)) {
        if (e->state == DSHIM_TRACE_QUEUED) {
            e->t_started_ns = now;
        }
        /* a second wait in a row (the ranks changed) keeps its start */
        if (!e->t_waiting_ns) {
            e->t_waiting_ns = now;
        }
        e->state = DSHIM_TRACE_WAITING;
        for (int i = 0; i < n; i++) {
            e->waiting_for[i] = ranks[i];
        }
        e->nwaiting = n;
    }
    ring_unlock(ring);
}

void dshim_trace_moving(dshim_trace_ring_t *ring, uint64_t id)
{
    if (!ring) {
        return;
    }
    uint64_t now = ticks();
    ring_lock(ring);
    dshim_trace_entry_t *e = entry_of(ring, id);
    if (e && e->state == DSHIM_TRACE_WAITING) {
        end_wait(e, now);
        e->state = DSHIM_TRACE_STARTED;
        e->nwaiting = 0;
    }
    ring_unlock(ring);
}

void dshim_trace_done(dshim_trace_ring_t *ring, uint64_t id, int ok)
{
    if (!ring) {
        return;
    }
    uint64_t now = ticks();
    ring_lock(ring);
    dshim_trace_entry_t *e = entry_of(ring, id);
    if (e && e->state != DSHIM_TRACE_DONE && e->state != DSHIM_TRACE_FAILED) {
        end_wait(e, now);
        if (!e->t_started_ns) {
            e->t_started_ns = now; /* failed before it ran: it never waited */
        }
        e->t_done_ns = now;
        e->state = ok ? DSHIM_TRACE_DONE : DSHIM_TRACE_FAILED;
        if (ok) {
            e->nwaiting = 0; /* a failure keeps whom it waited for: the diagnosis */
        }
        if (ring->timeline) {
            dshim_trace_ring_info_t ri = info_of(ring);
            dshim_trace_timeline_done(&ri, e);
        }
    }
    ring_unlock(ring);
}

/* Fills snap from ring, whose lock is held; entries must hold capacity.
 * Stamps become ns by conv (convert_times, after the lock). */
static void copy_ring(dshim_trace_ring_t *ring, dshim_trace_snapshot_t *snap, dshim_trace_entry_t *entries)
{
    memset(snap, 0, sizeof(*snap));
    snprintf(snap->name, sizeof(snap->name), "%s", ring->name);
    snprintf(snap->desc, sizeof(snap->desc), "%s", ring->desc);
    snap->rank = ring->rank;
    snap->size = ring->size;
    snap->world_rank = -1;
    snap->capacity = ring->capacity;
    snap->recorded = ring->next_id;
    snap->dropped = ring->next_id > ring->capacity ? ring->next_id - ring->capacity : 0;
    size_t n = ring->next_id < ring->capacity ? (size_t)ring->next_id : ring->capacity;
    uint64_t first = ring->next_id - n;
    /* oldest first: at most two runs of the array */
    size_t slots = (size_t)ring->mask + 1;
    size_t start = (size_t)(first & ring->mask);
    size_t run = slots - start < n ? slots - start : n;
    memcpy(entries, ring->entries + start, run * sizeof(*entries));
    memcpy(entries + run, ring->entries, (n - run) * sizeof(*entries));
    snap->n = n;
    snap->entries = entries;
}

static void convert_times(dshim_trace_snapshot_t *snap, const clk_conv_t *c)
{
    if (c->ns_per_tick == 1.0) {
        return;
    }
    for (size_t i = 0; i < snap->n; i++) {
        dshim_trace_entry_t *e = &snap->entries[i];
        e->t_queued_ns = clk_to_ns(c, e->t_queued_ns);
        e->t_started_ns = clk_to_ns(c, e->t_started_ns);
        e->t_done_ns = clk_to_ns(c, e->t_done_ns);
        e->t_waiting_ns = clk_to_ns(c, e->t_waiting_ns);
        e->wait_ns = (uint64_t)((double)e->wait_ns * c->ns_per_tick); /* a duration */
    }
}

dshim_status_t dshim_trace_snapshot(dshim_trace_ring_t *ring, dshim_trace_snapshot_t *snap)
{
    if (!snap) {
        return dshim_error(DSHIM_ERR_INVALID, "dshim_trace_snapshot: snap is NULL");
    }
    memset(snap, 0, sizeof(*snap));
    if (!ring) {
        return DSHIM_OK;
    }
    /* allocated outside the lock: capacity never changes */
    dshim_trace_entry_t *entries = malloc(ring->capacity * sizeof(*entries));
    if (!entries) {
        return dshim_error(DSHIM_ERR_NOMEM, "flight recorder: out of memory for a snapshot of %zu entries",
                           ring->capacity);
    }
    clk_conv_t conv;
    clk_conv_now(&conv);
    ring_lock(ring);
    copy_ring(ring, snap, entries);
    ring_unlock(ring);
    convert_times(snap, &conv);
    int ws;
    dshim_trace_world(&snap->world_rank, &ws);
    return DSHIM_OK;
}

void dshim_trace_snapshot_free(dshim_trace_snapshot_t *snap)
{
    if (snap) {
        free(snap->entries);
        snap->entries = NULL;
        snap->n = 0;
    }
}

/* ---- the registry, for dumps ------------------------------------------- */

/* Sets by pthread_atfork: a fork while another thread holds reg_lock would
 * leave it locked forever in the child; taking it around fork() means the
 * child starts with it free and the list consistent. */
static void reg_prepare(void)
{
    pthread_mutex_lock(&reg_lock);
}

static void reg_parent(void)
{
    pthread_mutex_unlock(&reg_lock);
}

static void reg_atfork_install(void)
{
    pthread_atfork(reg_prepare, reg_parent, reg_parent);
}

int dshim_trace_registry_lock(int crash)
{
    if (!crash) {
        pthread_mutex_lock(&reg_lock);
        return 1;
    }
    /* the crashed thread may hold it (then it never frees): 200 ms */
    for (int i = 0; i < 200; i++) {
        if (pthread_mutex_trylock(&reg_lock) == 0) {
            return 1;
        }
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    return 0;
}

void dshim_trace_registry_unlock(void)
{
    pthread_mutex_unlock(&reg_lock);
}

static int lock_ring(dshim_trace_ring_t *ring, int crash)
{
    if (!crash) {
        ring_lock(ring);
        return 1;
    }
    for (int i = 0; i < 50; i++) {
        if (ring_trylock(ring)) {
            return 1;
        }
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    return 0;
}

size_t dshim_trace_snapshot_all(dshim_trace_snapshot_t **snaps_p, int crash)
{
    *snaps_p = NULL;
    pid_t me = getpid();
    size_t count = 0;
    for (dshim_trace_ring_t *r = reg_head; r; r = r->next) {
        count += r->owner_pid == me;
    }
    if (!count) {
        return 0;
    }
    dshim_trace_snapshot_t *snaps = calloc(count, sizeof(*snaps));
    if (!snaps) {
        return 0;
    }
    int wr, ws;
    dshim_trace_world_locked(&wr, &ws);
    clk_conv_t conv;
    clk_conv_now(&conv);
    size_t n = 0;
    for (dshim_trace_ring_t *r = reg_head; r && n < count; r = r->next) {
        if (r->owner_pid != me) {
            continue;
        }
        dshim_trace_entry_t *entries = malloc(r->capacity * sizeof(*entries));
        if (!entries) {
            continue;
        }
        if (!lock_ring(r, crash)) {
            free(entries);
            continue;
        }
        copy_ring(r, &snaps[n], entries);
        ring_unlock(r);
        convert_times(&snaps[n], &conv);
        snaps[n].world_rank = wr;
        n++;
    }
    if (!n) {
        free(snaps);
        return 0;
    }
    /* oldest ring first (the list is newest first): the world communicator
     * leads the file */
    for (size_t i = 0; i < n / 2; i++) {
        dshim_trace_snapshot_t t = snaps[i];
        snaps[i] = snaps[n - 1 - i];
        snaps[n - 1 - i] = t;
    }
    *snaps_p = snaps;
    return n;
}

void dshim_trace_snapshots_free(dshim_trace_snapshot_t *snaps, size_t n)
{
    for (size_t i = 0; snaps && i < n; i++) {
        free(snaps[i].entries);
    }
    free(snaps);
}

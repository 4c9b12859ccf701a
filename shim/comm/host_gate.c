/* The host gate's mechanism (see host_gate.h): its shared area, the
 * arrivals, the door and its futex, the check of the calls and the waiting;
 * the algorithms that run through it are in coll_gate.c. */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "coll.h"
#include "config.h"
#include "host_gate.h"
#include "log.h"
#include "net.h"
#include "status.h"
#include "wait.h"
#include "xfer.h"

typedef struct gate_counter {
    uint64_t arrivals;
} gate_counter_t;

typedef struct gate_door {
    uint32_t open;     /* the last episode opened (its low 32 bits): the futex word */
    uint32_t sleepers; /* ranks in (or about to enter) a futex wait on `open` */
    int32_t failed;    /* 1 + the rank that failed the communicator; 0 */
    int32_t differs;   /* 1 + a rank whose call differed from rank 0's (the last arrival saw it); 0 */
} gate_door_t;

/* What a rank called, written before it arrives (the check of the calls,
 * who has not arrived, and the mismatch message). */
typedef struct gate_slot {
    uint64_t episode;  /* the last episode this rank arrived at */
    uint64_t seq;      /* the collective number of that call */
    uint64_t count;
    uint8_t coll, dtype, redop;
    uint64_t parts;    /* an allgatherv's block counts as a hash (dshim_host_gate_arrive_parts); else 0.
                        * Last: the fields before it keep the offsets they had before it */
} gate_slot_t;

_Static_assert(offsetof(gate_slot_t, parts) == 32, "docs/wire-protocol.md section 4 gives the slot's offsets");
_Static_assert(sizeof(gate_counter_t) <= DSHIM_HOST_AREA_LINE && sizeof(gate_door_t) <= DSHIM_HOST_AREA_LINE &&
                   sizeof(gate_slot_t) <= DSHIM_HOST_AREA_LINE,
               "each part of the gate must fit its line of the host area");

static gate_counter_t *gate_counter(void *area)
{
    return (gate_counter_t *)area;
}

static gate_door_t *gate_door(void *area)
{
    return (gate_door_t *)((unsigned char *)area + DSHIM_HOST_AREA_LINE);
}

static gate_slot_t *gate_slot(void *area, int r)
{
    return (gate_slot_t *)((unsigned char *)area + (size_t)(2 + r) * DSHIM_HOST_AREA_LINE);
}

int dshim_host_gate_transport(const dshim_comm_t *comm, const unsigned char *include)
{
    if (!dshim_config()->shm_gate) {
        return -1;
    }
    for (int i = 0; i < dshim_transport_count(); i++) {
        const dshim_transport_t *t = dshim_transport_at(i);
        if (!t->host_local || !t->host_area) {
            continue;
        }
        int all = 1;
        for (int r = 0; r < comm->size && all; r++) {
            all = (include && !include[r]) || comm->peers[r].transport_addr[i][0] != 0;
        }
        if (all) {
            return i;
        }
    }
    return -1;
}

void dshim_host_gate_plan(dshim_comm_t *comm)
{
    comm->gate_transport = comm->size >= 2 && dshim_comm_one_host(comm) ? dshim_host_gate_transport(comm, NULL) : -1;
}

/* The gate's memory: rank 0's host area, mapped on first use. */
static dshim_status_t gate_area(dshim_comm_t *comm, void **area_p)
{
    void *area = __atomic_load_n(&comm->gate, __ATOMIC_ACQUIRE);
    if (area) {
        *area_p = area;
        return DSHIM_OK;
    }
    int i = comm->gate_transport;
    const dshim_peer_info_t *me = &comm->peers[comm->rank];
    dshim_transport_peer_t owner = {.rank = 0, .same_host = 1, .ip = comm->peers[0].ip, .my_ip = me->ip,
                                    .addr = comm->peers[0].transport_addr[i]};
    DSHIM_CHECK(dshim_transport_at(i)->host_area(comm->transport_state[i], &owner, &area));
    __atomic_store_n(&comm->gate, area, __ATOMIC_RELEASE);
    *area_p = area;
    return DSHIM_OK;
}

dshim_status_t dshim_host_gate_area(dshim_comm_t *comm, const dshim_coll_sig_t *sig, void **area_p)
{
    dshim_status_t st = gate_area(comm, area_p);
    return st == DSHIM_OK ? DSHIM_OK : dshim_xfer_fail(comm, sig, st);
}

static long futex_call(uint32_t *word, int op, uint32_t val, const struct timespec *ts)
{
    /* not FUTEX_PRIVATE: the word is shared between processes */
    return syscall(SYS_futex, word, op, val, ts, NULL, 0);
}

/* Whether the episode is open: `open` has reached it (32-bit wrap-around). */
static int is_open(gate_door_t *door, uint64_t episode)
{
    return (int32_t)(__atomic_load_n(&door->open, __ATOMIC_ACQUIRE) - (uint32_t)episode) >= 0;
}

/* Whether process pid has exited (a zombie included: its parent may not
 * have reaped it yet).  Ranks of one gate share the host and /proc. */
static int process_gone(pid_t pid)
{
    char path[64], buf[256];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "re");
    if (!f) {
        if (errno == EMFILE || errno == ENFILE) {
            /* no descriptor to read /proc with (ulimit -n): ask the kernel
             * without one (a zombie then counts as alive until reaped) */
            return kill(pid, 0) != 0 && errno == ESRCH;
        }
        return errno == ENOENT || errno == ESRCH;
    }
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *paren = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
    return paren && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X');
}

/* The ranks that have not arrived at the episode, ascending, into out
 * (room for comm->size); returns how many.  *first_gone = one of them whose
 * process has exited (-1: none; looked for only when first_gone is given). */
static int missing_ranks(dshim_comm_t *comm, void *area, uint64_t episode, int *out, int *first_gone)
{
    int n = 0;
    if (first_gone) {
        *first_gone = -1;
    }
    for (int r = 0; r < comm->size; r++) {
        if (__atomic_load_n(&gate_slot(area, r)->episode, __ATOMIC_ACQUIRE) >= episode) {
            continue;
        }
        if (first_gone && *first_gone < 0 && process_gone(comm->peers[r].pid)) {
            *first_gone = r;
        }
        out[n++] = r;
    }
    return n;
}

/* A rank other than this one whose process has exited, or -1. */
static int any_rank_gone(dshim_comm_t *comm)
{
    for (int r = 0; r < comm->size; r++) {
        if (r != comm->rank && process_gone(comm->peers[r].pid)) {
            return r;
        }
    }
    return -1;
}

/* The gate as the wait rule sees it (wait.h): the area and the episode
 * this rank waits for. */
typedef struct gate_wait {
    void *area;
    uint64_t episode;
} gate_wait_t;

static void gate_doing(dshim_comm_t *comm, void *ctx, char *out, size_t len)
{
    (void)comm;
    (void)ctx;
    snprintf(out, len, "waiting in shared memory for every rank to arrive");
}

static int gate_missing(dshim_comm_t *comm, void *ctx, uint64_t seq, int *out, int *store_silent)
{
    (void)seq;
    (void)store_silent;
    gate_wait_t *gw = ctx;
    return missing_ranks(comm, gw->area, gw->episode, out, NULL);
}

/* The recorder's entry of the collective waits for the ranks not arrived. */
static void gate_trace_waiting(dshim_comm_t *comm, void *ctx)
{
    gate_wait_t *gw = ctx;
    int ranks[DSHIM_TRACE_WAIT_MAX], k = 0;
    for (int r = 0; r < comm->size && k < DSHIM_TRACE_WAIT_MAX; r++) {
        if (__atomic_load_n(&gate_slot(gw->area, r)->episode, __ATOMIC_ACQUIRE) < gw->episode) {
            ranks[k++] = r;
        }
    }
    dshim_trace_waiting(comm->trace, comm->trace_op, ranks, k);
}

/* Opens the episode: every rank has arrived. */
static void open_gate(gate_door_t *door, uint64_t episode)
{
    /* seq_cst store then seq_cst load, against a sleeper's seq_cst add to
     * `sleepers` then load of `open`: one of the two sees the other (no
     * lost wake-up), and while nobody sleeps opening costs no system call */
    __atomic_store_n(&door->open, (uint32_t)episode, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&door->sleepers, __ATOMIC_SEQ_CST) != 0) {
        futex_call(&door->open, FUTEX_WAKE, INT_MAX, NULL);
    }
}

/* Sleeps until the episode opens, the gate is failed, or timeout_ms. */
static void sleep_on_gate(gate_door_t *door, uint64_t episode, int timeout_ms)
{
    __atomic_add_fetch(&door->sleepers, 1, __ATOMIC_SEQ_CST);
    uint32_t seen = __atomic_load_n(&door->open, __ATOMIC_SEQ_CST);
    if ((int32_t)(seen - (uint32_t)episode) < 0 && __atomic_load_n(&door->failed, __ATOMIC_SEQ_CST) == 0) {
        struct timespec ts = {timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000L};
        futex_call(&door->open, FUTEX_WAIT, seen, &ts); /* woken, timed out or EAGAIN: the caller looks again */
    }
    __atomic_sub_fetch(&door->sleepers, 1, __ATOMIC_SEQ_CST);
}

/* How often a sleeping rank looks at the ranks that have not arrived (did
 * one exit?): the death of a rank that sends no message is seen this late
 * at most (a peer's socket tells the message-based algorithms at once). */
#define GATE_LOOK_MS 50

/* The gate is not open after the spin: sleep, looking every GATE_LOOK_MS
 * for a failed communicator and a rank that exited, with the wait rule's
 * timeout and stall warnings (wait.h) counted from `start`. */
static dshim_status_t wait_slow(dshim_comm_t *comm, const dshim_coll_sig_t *sig, void *area, uint64_t episode,
                                double start)
{
    gate_door_t *door = gate_door(area);
    gate_wait_t gw = {area, episode};
    const dshim_wait_source_t src = {gate_doing, gate_missing, gate_trace_waiting, NULL, &gw};
    dshim_wait_t w;
    dshim_wait_init(&w, sig, &src);
    dshim_wait_idle(&w, start);
    while (!is_open(door, episode)) {
        if (__atomic_load_n(&comm->error, __ATOMIC_ACQUIRE) != DSHIM_OK) {
            dshim_error_set_raw(comm->errmsg);
            return comm->error;
        }
        /* a rank that exited first: when its death made another rank fail
         * the communicator, the death is the news; but a rank that failed
         * the gate itself (an abort, its own error) and then exited is
         * news as the failure it reported, whichever this rank sees first */
        int gone = -1;
        int n = missing_ranks(comm, area, episode, comm->wait_ranks, &gone);
        int failed = __atomic_load_n(&door->failed, __ATOMIC_ACQUIRE);
        if (gone >= 0 && failed - 1 != gone) {
            return dshim_wait_fail_gone(comm, &w, gone, comm->wait_ranks, n);
        }
        if (n == 0 && (gone = any_rank_gone(comm)) >= 0) {
            /* every rank arrived but the gate stays shut: the last arrival
             * died between its arrival and the open (while it reduced) */
            char who[160];
            dshim_comm_describe_peer(comm, gone, who, sizeof(who));
            dshim_error_quiet(DSHIM_ERR_PEER, "%s exited in the collective, after it arrived and before it "
                              "completed it for the others", who);
            return dshim_xfer_fail(comm, sig, DSHIM_ERR_PEER);
        }
        if (failed > 0 && failed - 1 != comm->rank) {
            char who[160];
            dshim_comm_describe_peer(comm, failed - 1, who, sizeof(who));
            dshim_error_quiet(DSHIM_ERR_PEER, "%s failed the communicator while this rank waited for it in shared "
                              "memory (its error is in its log)", who);
            return dshim_xfer_fail(comm, sig, DSHIM_ERR_PEER);
        }
        /* the arrival mark is for ranks in a collective of messages that
         * wait for this one (their "did not arrive" list: a rank here has
         * arrived) */
        int sleep_ms;
        DSHIM_CHECK(dshim_wait_look(comm, &w, dshim_now(), GATE_LOOK_MS, &sleep_ms));
        sleep_on_gate(door, episode, sleep_ms);
    }
    dshim_wait_moving(comm, &w);
    return DSHIM_OK;
}

uint64_t dshim_host_gate_arrive_again(dshim_comm_t *comm, void *area, int *last)
{
    uint64_t episode = ++comm->gate_episode;
    __atomic_store_n(&gate_slot(area, comm->rank)->episode, episode, __ATOMIC_RELEASE);
    /* acq_rel: the last arrival sees every rank's slot and data (their
     * release by this add), and publishes its own work with the open */
    uint64_t before = __atomic_fetch_add(&gate_counter(area)->arrivals, 1, __ATOMIC_ACQ_REL);
    *last = before + 1 == episode * (uint64_t)comm->size;
    return episode;
}

uint64_t dshim_host_gate_arrive_parts(dshim_comm_t *comm, void *area, const dshim_coll_sig_t *sig, uint64_t parts,
                                      int *last)
{
    gate_slot_t *mine = gate_slot(area, comm->rank);
    mine->seq = sig->seq;
    mine->count = sig->count;
    mine->parts = parts;
    mine->coll = sig->coll;
    mine->dtype = sig->dtype;
    mine->redop = sig->redop;
    return dshim_host_gate_arrive_again(comm, area, last);
}

uint64_t dshim_host_gate_arrive(dshim_comm_t *comm, void *area, const dshim_coll_sig_t *sig, int *last)
{
    return dshim_host_gate_arrive_parts(comm, area, sig, 0, last);
}

/* A slot's call as a signature (root -1: no call through the gate has one).
 * Relaxed loads: read after the counter or the open ordered the writes, or
 * (dshim_host_gate_at) only to compare. */
static dshim_coll_sig_t slot_call(const gate_slot_t *slot)
{
    dshim_coll_sig_t call = {.coll = __atomic_load_n(&slot->coll, __ATOMIC_RELAXED),
                             .dtype = __atomic_load_n(&slot->dtype, __ATOMIC_RELAXED),
                             .redop = __atomic_load_n(&slot->redop, __ATOMIC_RELAXED),
                             .root = -1,
                             .count = __atomic_load_n(&slot->count, __ATOMIC_RELAXED),
                             .seq = __atomic_load_n(&slot->seq, __ATOMIC_RELAXED)};
    return call;
}

/* Whether two calls differ: in number, kind and count always, in dtype and
 * op while DSHIM_CHECK_COLLECTIVES=1 (a barrier must never take an
 * allreduce's place, whatever the setting). */
static int calls_differ(const dshim_comm_t *comm, const dshim_coll_sig_t *a, const dshim_coll_sig_t *b)
{
    int differs = a->seq != b->seq || a->coll != b->coll || a->count != b->count;
    if (comm->check_sig) {
        differs |= a->dtype != b->dtype || a->redop != b->redop;
    }
    return differs;
}

/* Whether two ranks' slots hold different block counts (relaxed: as slot_call). */
static int parts_differ(void *area, int a, int b)
{
    return __atomic_load_n(&gate_slot(area, a)->parts, __ATOMIC_RELAXED) !=
           __atomic_load_n(&gate_slot(area, b)->parts, __ATOMIC_RELAXED);
}

int32_t dshim_host_gate_first_differing(dshim_comm_t *comm, void *area)
{
    dshim_coll_sig_t first = slot_call(gate_slot(area, 0));
    for (int r = 1; r < comm->size; r++) {
        dshim_coll_sig_t call = slot_call(gate_slot(area, r));
        if (calls_differ(comm, &call, &first) || parts_differ(area, r, 0)) {
            return r + 1;
        }
    }
    return 0;
}

/* The spin is as long as dshim_xfer's, yielding on every look when ranks
 * outnumber cores (the ranks that are late need this core), else a pause
 * per look and the clock read every 8th; then wait_slow. */
dshim_status_t dshim_host_gate_wait_open(dshim_comm_t *comm, const dshim_coll_sig_t *sig, void *area,
                                         uint64_t episode)
{
    gate_door_t *door = gate_door(area);
    const double spin_s = (double)comm->spin_us * 1e-6;
    double start = dshim_now();
    for (unsigned loop = 0;; loop++) {
        if (is_open(door, episode)) {
            return DSHIM_OK;
        }
        if ((loop & 7) == 7 || comm->spin_yields) {
            if (dshim_now() - start >= spin_s) {
                break;
            }
        }
        if (comm->spin_yields || (loop & 63) == 63) {
            sched_yield();
        } else {
            __builtin_ia32_pause();
        }
    }
    return wait_slow(comm, sig, area, episode, start);
}

dshim_status_t dshim_host_gate_check_calls(dshim_comm_t *comm, const dshim_coll_sig_t *sig, void *area)
{
    if (__atomic_load_n(&gate_door(area)->differs, __ATOMIC_ACQUIRE) == 0) {
        return DSHIM_OK;
    }
    for (int r = 0; r < comm->size; r++) {
        dshim_coll_sig_t theirs = slot_call(gate_slot(area, r));
        if (r != comm->rank && calls_differ(comm, sig, &theirs)) {
            return dshim_xfer_fail_mismatch(comm, sig, r, &theirs);
        }
    }
    for (int r = 0; r < comm->size; r++) {
        if (r != comm->rank && parts_differ(area, r, comm->rank)) {
            /* the same call and total, other blocks: the ring would see a
             * message of another size; here it is the counts themselves */
            char who[160];
            dshim_comm_describe_peer(comm, r, who, sizeof(who));
            dshim_error_quiet(DSHIM_ERR_MISMATCH, "mismatched block counts: %s passed other counts than this rank "
                              "(the same total); every rank must pass the same counts to an allgatherv", who);
            return dshim_xfer_fail(comm, sig, DSHIM_ERR_MISMATCH);
        }
    }
    dshim_error_quiet(DSHIM_ERR_INTERNAL, "host gate: the calls differ, but this rank's matches every other");
    return dshim_xfer_fail(comm, sig, DSHIM_ERR_INTERNAL);
}

void dshim_host_gate_open(void *area, uint64_t episode, int32_t differs)
{
    if (differs) {
        __atomic_store_n(&gate_door(area)->differs, differs, __ATOMIC_RELEASE);
    }
    open_gate(gate_door(area), episode);
}

int dshim_host_gate_at(dshim_comm_t *comm, uint64_t seq, dshim_coll_sig_t *theirs)
{
    if (comm->gate_transport < 0) {
        return -1;
    }
    void *area = __atomic_load_n(&comm->gate, __ATOMIC_ACQUIRE);
    if (!area && gate_area(comm, &area) != DSHIM_OK) {
        return -1;
    }
    for (int r = 0; r < comm->size; r++) {
        gate_slot_t *slot = gate_slot(area, r);
        if (r == comm->rank || __atomic_load_n(&slot->episode, __ATOMIC_ACQUIRE) == 0) {
            continue;
        }
        *theirs = slot_call(slot);
        if (theirs->seq == seq) {
            return r;
        }
    }
    return -1;
}

int dshim_host_gate_rank_exited(dshim_comm_t *comm, int r)
{
    return comm->gate_transport >= 0 && r != comm->rank && process_gone(comm->peers[r].pid);
}

void dshim_host_gate_fail(dshim_comm_t *comm)
{
    if (comm->gate_transport < 0) {
        return;
    }
    void *area = __atomic_load_n(&comm->gate, __ATOMIC_ACQUIRE);
    if (!area && gate_area(comm, &area) != DSHIM_OK) {
        return; /* the waiters will see this rank exit, or time out */
    }
    gate_door_t *door = gate_door(area);
    int32_t none = 0;
    if (__atomic_compare_exchange_n(&door->failed, &none, comm->rank + 1, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
        futex_call(&door->open, FUTEX_WAKE, INT_MAX, NULL);
    }
}

/* The host gate (see host_gate.h). */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
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
} gate_slot_t;

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

/* Rank r's data (r < size), or the result (r = size): DSHIM_HOST_AREA_DATA
 * bytes each, after the lines. */
static unsigned char *gate_data(void *area, int size, int r)
{
    return (unsigned char *)area + (size_t)(2 + size) * DSHIM_HOST_AREA_LINE + (size_t)r * DSHIM_HOST_AREA_DATA;
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

/* The gate's memory for a collective; a failure fails the collective. */
static dshim_status_t gate_area_for(dshim_comm_t *comm, const dshim_coll_sig_t *sig, void **area_p)
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
         * the communicator, the death is the news */
        int gone = -1;
        int n = missing_ranks(comm, area, episode, comm->wait_ranks, &gone);
        if (gone >= 0) {
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
        int failed = __atomic_load_n(&door->failed, __ATOMIC_ACQUIRE);
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

/* This rank's arrival at the next episode (its call is in its slot):
 * returns the episode, *last set when it completed it. */
static uint64_t count_arrival(dshim_comm_t *comm, void *area, int *last)
{
    uint64_t episode = ++comm->gate_episode;
    __atomic_store_n(&gate_slot(area, comm->rank)->episode, episode, __ATOMIC_RELEASE);
    /* acq_rel: the last arrival sees every rank's slot and data (their
     * release by this add), and publishes its own work with the open */
    uint64_t before = __atomic_fetch_add(&gate_counter(area)->arrivals, 1, __ATOMIC_ACQ_REL);
    *last = before + 1 == episode * (uint64_t)comm->size;
    return episode;
}

/* This rank's data into its block at byte offset base (the half of a
 * split allreduce's piece), but for bytes [skip, skip + skip_len), which
 * nobody else reads. */
static void copy_in(dshim_comm_t *comm, void *area, size_t base, const void *data, size_t bytes, size_t skip,
                    size_t skip_len)
{
    unsigned char *block = gate_data(area, comm->size, comm->rank) + base;
    if (skip) {
        memcpy(block, data, skip);
    }
    if (skip + skip_len < bytes) {
        memcpy(block + skip + skip_len, (const unsigned char *)data + skip + skip_len, bytes - skip - skip_len);
    }
}

/* This rank's call into its slot, then its arrival; returns the episode,
 * *last set when it completed it. */
static uint64_t arrive(dshim_comm_t *comm, void *area, const dshim_coll_sig_t *sig, int *last)
{
    gate_slot_t *mine = gate_slot(area, comm->rank);
    mine->seq = sig->seq;
    mine->count = sig->count;
    mine->coll = sig->coll;
    mine->dtype = sig->dtype;
    mine->redop = sig->redop;
    return count_arrival(comm, area, last);
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

/* The last arrival's check of the calls: 1 + a rank whose call differs from
 * rank 0's, or 0. */
static int32_t first_differing(dshim_comm_t *comm, void *area)
{
    dshim_coll_sig_t first = slot_call(gate_slot(area, 0));
    for (int r = 1; r < comm->size; r++) {
        dshim_coll_sig_t call = slot_call(gate_slot(area, r));
        if (calls_differ(comm, &call, &first)) {
            return r + 1;
        }
    }
    return 0;
}

/* Waits until the episode opens: the spin as long as dshim_xfer's,
 * yielding on every look when ranks outnumber cores (the ranks that are
 * late need this core), else a pause per look and the clock read every
 * 8th; then wait_slow. */
static dshim_status_t wait_open(dshim_comm_t *comm, const dshim_coll_sig_t *sig, void *area, uint64_t episode)
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

/* After the open: when the last arrival found calls that differ, the
 * mismatch error (this rank's call against one that differs from it: one
 * differs from rank 0's, so from this rank's or rank 0's does). */
static dshim_status_t check_calls(dshim_comm_t *comm, const dshim_coll_sig_t *sig, void *area)
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
    dshim_error_quiet(DSHIM_ERR_INTERNAL, "host gate: the calls differ, but this rank's matches every other");
    return dshim_xfer_fail(comm, sig, DSHIM_ERR_INTERNAL);
}

/* Opens the episode, after the check of the calls. */
static void complete(void *area, uint64_t episode, int32_t differs)
{
    if (differs) {
        __atomic_store_n(&gate_door(area)->differs, differs, __ATOMIC_RELEASE);
    }
    open_gate(gate_door(area), episode);
}

dshim_status_t dshim_host_gate_barrier(dshim_comm_t *comm, const dshim_coll_sig_t *sig)
{
    void *area;
    DSHIM_CHECK(gate_area_for(comm, sig, &area));
    int last;
    uint64_t episode = arrive(comm, area, sig, &last);
    if (last) {
        complete(area, episode, first_differing(comm, area));
    } else {
        DSHIM_CHECK(wait_open(comm, sig, area, episode));
    }
    return check_calls(comm, sig, area);
}

/* Rank r's data from byte offset base of its block, or for this rank
 * `own` when given (the caller's buffer, which it did not copy in). */
static const unsigned char *input(dshim_comm_t *comm, void *area, size_t base, const void *own, int r)
{
    return r == comm->rank && own ? (const unsigned char *)own : gate_data(area, comm->size, r) + base;
}

/* Elements [off, off + len) of the result (from byte offset base of the
 * blocks): the ranks' data reduced in rank order (every rank gets these
 * bits, whoever computes them), AVG divided once.  GATE_REDUCE_PIECE at a
 * time, all N inputs into it while it sits in the L1 cache (one pass over
 * the inputs, not N - 1 over the result). */
#define GATE_REDUCE_PIECE ((size_t)8 << 10)

static dshim_status_t reduce_blocks(dshim_comm_t *comm, void *area, const dshim_coll_sig_t *sig, size_t base,
                                    size_t off, size_t len, const void *own)
{
    dshim_dtype_t dt = (dshim_dtype_t)sig->dtype;
    dshim_redop_t op = (dshim_redop_t)sig->redop;
    size_t es = dshim_dtype_size(dt), piece = GATE_REDUCE_PIECE / es;
    dshim_status_t st = DSHIM_OK;
    for (size_t done = 0; done < len && st == DSHIM_OK; done += piece) {
        size_t n = len - done < piece ? len - done : piece, at = (off + done) * es;
        unsigned char *result = gate_data(area, comm->size, comm->size) + base + at;
        st = comm->reduce->reduce(result, input(comm, area, base, own, 0) + at, input(comm, area, base, own, 1) + at,
                                  n, dt, op, NULL);
        for (int r = 2; r < comm->size && st == DSHIM_OK; r++) {
            st = comm->reduce->reduce(result, result, input(comm, area, base, own, r) + at, n, dt, op, NULL);
        }
        if (st == DSHIM_OK && op == DSHIM_AVG) {
            st = comm->reduce->scale_div(result, n, dt, comm->size, NULL);
        }
    }
    if (st != DSHIM_OK) {
        /* checked at the call (check_op): cannot happen; never open a wrong result */
        dshim_host_gate_fail(comm);
        return dshim_xfer_fail(comm, sig, st);
    }
    return DSHIM_OK;
}

dshim_status_t dshim_host_gate_allreduce(dshim_comm_t *comm, const dshim_coll_sig_t *sig, const void *sbuf,
                                         void *rbuf, size_t count)
{
    void *area;
    DSHIM_CHECK(gate_area_for(comm, sig, &area));
    size_t bytes = count * dshim_dtype_size((dshim_dtype_t)sig->dtype);
    int last;
    copy_in(comm, area, 0, sbuf, bytes, 0, 0);
    uint64_t episode = arrive(comm, area, sig, &last);
    if (last) {
        /* the whole reduction by the rank that arrived last: the others
         * wait for it anyway, and with ranks sharing cores one pass over N
         * small inputs beats another round of arrivals */
        int32_t differs = first_differing(comm, area);
        if (!differs) {
            DSHIM_CHECK(reduce_blocks(comm, area, sig, 0, 0, count, NULL));
        }
        complete(area, episode, differs);
    } else {
        DSHIM_CHECK(wait_open(comm, sig, area, episode));
    }
    DSHIM_CHECK(check_calls(comm, sig, area));
    /* the result stays until every rank has copied it: the next episode's
     * reduction writes it only once every rank arrived there */
    memcpy(rbuf, gate_data(area, comm->size, comm->size), bytes);
    dshim_comm_count_moved(comm, bytes, bytes);
    return DSHIM_OK;
}

/* The split allreduce goes a piece at a time, each in one half of the data
 * blocks (and of the result), so that two are in flight: in one round a
 * rank reduces its share of piece j - 1 and copies piece j into the other
 * half, then arrives once for both; after the open it copies piece j - 1's
 * result out.  One arrival per piece and one more, where a piece at a time
 * would take two.
 *
 * A piece is half a block (512 KiB), or with few ranks an eighth of the
 * message, at least 128 KiB: smaller pieces keep what a round touches in
 * the caches, more of them cost more rounds, and a round costs more the
 * more ranks must run.  Measured on 2 cores (paired, time over 512 KiB
 * pieces'): N = 4 1 MiB 0.74 with 128 KiB pieces, 4 MiB 0.90, 16 MiB
 * 1.23; N = 8 0.86 / 0.95 / 1.20; N = 16 0.94 / 1.11 / 1.13; N = 32
 * 1.22 / 1.16 / 1.26 (docs/benchmarks.md, "The split gate"). */
#define GATE_SPLIT_PIECE_MAX (DSHIM_HOST_AREA_DATA / 2)
#define GATE_SPLIT_PIECE_MIN ((size_t)128 << 10)
#define GATE_SPLIT_SMALL_PIECES_MAX_RANKS 8

static size_t split_piece_bytes(const dshim_comm_t *comm, size_t bytes)
{
    if (comm->size > GATE_SPLIT_SMALL_PIECES_MAX_RANKS) {
        return GATE_SPLIT_PIECE_MAX;
    }
    size_t piece = bytes / 8 / 4096 * 4096;
    return piece < GATE_SPLIT_PIECE_MIN ? GATE_SPLIT_PIECE_MIN
           : piece > GATE_SPLIT_PIECE_MAX ? GATE_SPLIT_PIECE_MAX
                                          : piece;
}

/* Piece j of a split allreduce: its first element, its count, the byte
 * offset of its half in the blocks, and this rank's share of its elements
 * (from `off`, `len` of them: the part only this rank reduces, and reads
 * from its own buffer, so it never copies it in). */
typedef struct split_piece {
    size_t first, count, base, off, len;
} split_piece_t;

static split_piece_t piece_at(const dshim_comm_t *comm, size_t count, size_t piece, size_t j)
{
    split_piece_t p = {.first = j * piece, .count = count - j * piece < piece ? count - j * piece : piece,
                       .base = (j & 1) * GATE_SPLIT_PIECE_MAX};
    dshim_part(p.count, comm->size, comm->rank, &p.off, &p.len);
    return p;
}

dshim_status_t dshim_host_gate_allreduce_split(dshim_comm_t *comm, const dshim_coll_sig_t *sig, const void *sbuf,
                                               void *rbuf, size_t count)
{
    void *area;
    DSHIM_CHECK(gate_area_for(comm, sig, &area));
    size_t es = dshim_dtype_size((dshim_dtype_t)sig->dtype), piece = split_piece_bytes(comm, count * es) / es;
    size_t pieces = (count + piece - 1) / piece;
    const unsigned char *sb = sbuf;
    unsigned char *rb = rbuf;
    for (size_t j = 0; j <= pieces; j++) {
        split_piece_t prev = j > 0 ? piece_at(comm, count, piece, j - 1) : (split_piece_t){0};
        if (prev.len) {
            DSHIM_CHECK(reduce_blocks(comm, area, sig, prev.base, prev.off, prev.len, sb + prev.first * es));
        }
        if (j < pieces) {
            split_piece_t p = piece_at(comm, count, piece, j);
            copy_in(comm, area, p.base, sb + p.first * es, p.count * es, p.off * es, p.len * es);
        }
        int last;
        uint64_t episode = j == 0 ? arrive(comm, area, sig, &last) : count_arrival(comm, area, &last);
        if (last) {
            complete(area, episode, j == 0 ? first_differing(comm, area) : 0);
        } else {
            DSHIM_CHECK(wait_open(comm, sig, area, episode));
        }
        if (j == 0) {
            DSHIM_CHECK(check_calls(comm, sig, area));
        } else {
            /* every share of piece j - 1 is reduced; its half of the result
             * is written again only after every rank arrived once more */
            memcpy(rb + prev.first * es, gate_data(area, comm->size, comm->size) + prev.base, prev.count * es);
        }
    }
    dshim_comm_count_moved(comm, count * es, count * es);
    return DSHIM_OK;
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

/*
 * The single-copy allreduce: ranks of one host that each have a core read
 * and write each other's buffers directly (a transport's peer_read and
 * peer_write: shm through process_vm_readv/writev), where a message through
 * a shared-memory ring is copied into the ring and out of it again.
 * OpenMPI's shared-memory transport moves large messages the same way
 * (vader's CMA single copy); with 2 ranks at 4-16 MiB it beat dshim's ring
 * by a quarter (docs/benchmarks.md, "N = 2, 2-64 MiB: single-copy reads");
 * writing the result as well halved it again in place (below).
 *
 * One call, every rank:
 *  1. sends every peer where its buffers are (sbuf, rbuf) and receives
 *     theirs: one small message each way, which is also where the engine
 *     checks that the calls agree;
 *     the first call of a communicator then probes: reads a known word of
 *     every peer and writes it back, and tells every peer whether that
 *     worked; if one rank could not, every rank falls back to messages, now
 *     and from then on;
 *  2. reduces its share (dshim_part) in pieces: a piece of every peer's
 *     sbuf is read into a scratch buffer that stays in cache, and folded
 *     into its rbuf in the order r, r+1, ... (only this rank computes these
 *     elements); the finished piece, still in cache, is written into every
 *     peer's rbuf at the same place;
 *  3. tells every peer that it is done with their buffers (an empty
 *     message), and returns once every peer said so: no rank lets its caller
 *     change or read its buffers while a peer may still read or write them.
 * Writing the result while it is in cache is what a second round of reads
 * (every rank copying the other shares from their owners' rbufs after a
 * round of messages) cost more for: those rbufs had left the cache, and the
 * round of messages waited for the slowest rank (docs/benchmarks.md,
 * "Single copy: writing the result").
 * In place (sbuf == rbuf) works as is: a rank's share of any rank's buffer
 * is read and then written by that rank alone, piece by piece, and nobody
 * else touches it.
 *
 * A rank that fails (a third rank died, the call timed out, an abort)
 * leaves before its peers' "done", while they may still write into its
 * rbuf, which its caller may then free or reuse.  So writes go through
 * gates (single_copy_gate_t, below): before its first write into a peer a
 * rank marks, in its own gate, that it writes into that peer, and then
 * reads whether the peer's gate is still open for this call; it clears the
 * mark after its last write.  A rank leaving early closes its gate and
 * waits until no peer's mark on it is set (or that peer is gone).  Either
 * the writer sees the gate closed and writes nothing, or the owner sees the
 * mark and waits (a store, a full fence and a load on each side; the
 * writer's load is the only system call this adds to a call).
 */
#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "barrier.h"
#include "coll.h"
#include "log.h"
#include "net.h"
#include "status.h"

/* Bytes of every peer's sbuf read per piece of a share: a few of them stay
 * in a core's L2 with the piece of the result they fold into. */
#define SINGLE_COPY_PIECE ((size_t)256 << 10)

#define SINGLE_COPY_MAGIC 0x796c6e6f2d646165ull /* what the probe expects to read */

/* A rank's gate (above), in its own memory, which its peers read (and the
 * first call's probe writes) through the kernel.  One per communicator,
 * never freed: a rank that learnt a peer's address may be descheduled for
 * a long while before it reads the peer's `open`, even past that peer's
 * return and the end of its communicator, and must then read a gate that
 * tells it to write nothing. */
typedef struct dshim_single_copy_gate {
    uint64_t magic;     /* SINGLE_COPY_MAGIC: the first call's probe reads it and writes it back */
    uint64_t open;      /* the call's tag while peers may write into this rank's rbuf, else 0 */
    int peers_known;    /* peer[] holds every rank's gate (from the first whole exchange) */
    uint64_t *peer;     /* [size]: where each rank's gate is, in its memory */
    uint64_t marks[];   /* [q]: the call's tag while this rank may write into q's rbuf, else 0 */
} single_copy_gate_t;

static pthread_mutex_t gates_lock = PTHREAD_MUTEX_INITIALIZER;
static void **gates; /* every gate made, so that leak checkers see them kept on purpose */
static size_t ngates;

static single_copy_gate_t *gate_of(dshim_comm_t *comm)
{
    if (comm->single_copy_gate) {
        return comm->single_copy_gate;
    }
    size_t n = (size_t)comm->size;
    single_copy_gate_t *g = calloc(1, sizeof(*g) + sizeof(uint64_t) * n);
    uint64_t *peer = calloc(n, sizeof(*peer));
    pthread_mutex_lock(&gates_lock);
    void **more = g && peer ? realloc(gates, sizeof(*gates) * (ngates + 1)) : NULL;
    if (more) {
        gates = more;
        gates[ngates++] = g;
    }
    pthread_mutex_unlock(&gates_lock);
    if (!more) {
        free(g);
        free(peer);
        return NULL;
    }
    g->magic = SINGLE_COPY_MAGIC;
    g->peer = peer;
    comm->single_copy_gate = g;
    return g;
}

/* What each rank tells the others in step 1. */
typedef struct where {
    uint64_t magic;
    uint64_t sbuf, rbuf;
    uint64_t gate; /* where its single_copy_gate_t is */
} where_t;

#define GATE_FIELD(base, field) ((base) + offsetof(single_copy_gate_t, field))

void dshim_single_copy_plan(dshim_comm_t *comm)
{
    comm->single_copy_transport = -1;
    comm->single_copy = DSHIM_SINGLE_COPY_UNKNOWN;
    if (comm->size < 2 || !dshim_comm_one_host(comm)) {
        return;
    }
    const dshim_peer_info_t *me = &comm->peers[comm->rank];
    for (int i = 0; i < dshim_transport_count(); i++) {
        const dshim_transport_t *t = dshim_transport_at(i);
        if (!t->host_local || !t->peer_read || !t->peer_write || !t->peer_reads || !comm->transport_state[i]) {
            continue;
        }
        int all = 1;
        for (int r = 0; r < comm->size && all; r++) {
            dshim_transport_peer_t pv = {.rank = r, .same_host = 1, .ip = comm->peers[r].ip, .my_ip = me->ip,
                                         .addr = comm->peers[r].transport_addr[i]};
            all = t->peer_reads(comm->transport_state[i], &pv);
        }
        if (all) {
            comm->single_copy_transport = i;
            return;
        }
    }
}

/* One round of messages with every peer: `out` (len bytes) to each, each
 * one's into in[q] (in[r] untouched); len 0: a round of empty messages. */
static dshim_status_t all_to_all(dshim_comm_t *comm, const dshim_coll_sig_t *sig, const void *out, void *in,
                                 size_t len)
{
    int n = comm->size, r = comm->rank;
    dshim_xfer_op_t stack[2 * 16];
    dshim_xfer_op_t *ops = n <= 16 ? stack : calloc((size_t)2 * (size_t)n, sizeof(*ops));
    if (!ops) {
        return dshim_error(DSHIM_ERR_NOMEM, "out of memory for a round of messages with %d ranks", n);
    }
    int k = 0;
    for (int i = 1; i < n; i++) {
        int to = (r + i) % n, from = (r - i + n) % n;
        ops[k++] = dshim_xf_send(to, out, len);
        ops[k++] = dshim_xf_recv(from, len ? (char *)in + (size_t)from * len : NULL, len);
    }
    dshim_status_t st = dshim_xfer(comm, sig, ops, k);
    if (ops != stack) {
        free(ops);
    }
    return st;
}

/* The first call's probe (step 1): whether this rank can read and write
 * every peer, then whether every rank can.  DSHIM_ERR_UNSUPPORTED when one cannot (the
 * communicator falls back to messages); a peer that is gone fails it. */
static dshim_status_t probe(dshim_comm_t *comm, const dshim_coll_sig_t *sig, const where_t *theirs)
{
    int n = comm->size, r = comm->rank;
    uint64_t ok = 1;
    char why[512] = "";
    for (int q = 0; q < n && ok; q++) {
        uint64_t got = 0;
        if (q == r) {
            continue;
        }
        dshim_status_t st = dshim_xfer_read_peer(comm, q, &got, GATE_FIELD(theirs[q].gate, magic), sizeof(got));
        if (st == DSHIM_OK && got == SINGLE_COPY_MAGIC) {
            /* the same word back: writing is allowed where reading is, unless
             * a seccomp profile tells them apart */
            st = dshim_xfer_write_peer(comm, q, &got, GATE_FIELD(theirs[q].gate, magic), sizeof(got));
        }
        if (st == DSHIM_ERR_PEER || st == DSHIM_ERR_NOMEM || st == DSHIM_ERR_INTERNAL) {
            return dshim_xfer_fail(comm, sig, st);
        }
        if (st != DSHIM_OK) {
            ok = 0;
            snprintf(why, sizeof(why), "%s", dshim_last_error());
        } else if (got != SINGLE_COPY_MAGIC) {
            /* its pid names another process here: another PID namespace */
            char who[160];
            dshim_comm_describe_peer(comm, q, who, sizeof(who));
            ok = 0;
            snprintf(why, sizeof(why), "reading %s's memory gave other bytes than it holds: is it in another PID "
                     "namespace?", who);
        }
    }
    uint64_t *oks = calloc((unsigned)n, sizeof(*oks));
    if (!oks) {
        return dshim_error(DSHIM_ERR_NOMEM, "out of memory for %d ranks' probe results", n);
    }
    oks[r] = ok;
    dshim_status_t st = all_to_all(comm, sig, &ok, oks, sizeof(ok));
    int all = 1;
    for (int q = 0; q < n; q++) {
        all &= oks[q] == 1;
    }
    free(oks);
    DSHIM_CHECK(st);
    comm->single_copy = all ? DSHIM_SINGLE_COPY_YES : DSHIM_SINGLE_COPY_NO;
    if (!ok) {
        DSHIM_WARN("rank %d: no single-copy transfers between the ranks of this host (%s); large allreduces go "
                   "through shared-memory messages",
                   r, why);
    }
    return all ? DSHIM_OK : dshim_error(DSHIM_ERR_UNSUPPORTED, "single-copy transfers refused");
}

/* Stores v into *word, then a full barrier: the store is seen before any
 * later load of this thread, including the kernel's on its behalf (the
 * gate's store->load order, on each side). */
static inline void store_then_barrier(uint64_t *word, uint64_t v)
{
    __atomic_store_n(word, v, __ATOMIC_SEQ_CST);
    DSHIM_STORE_LOAD_BARRIER(word);
}

/* Marks this rank as writing into peer q for the call `tag` and reads
 * whether q is still open for it (*open_p).  q left (closed) when it
 * failed: nothing may be written into it then. */
static dshim_status_t mark_writing(dshim_comm_t *comm, single_copy_gate_t *g, int q, uint64_t tag, int *open_p)
{
    uint64_t open = 0;
    /* the mark before the look at `open`; the owner closes before it looks
     * at the marks (close_gate) */
    store_then_barrier(&g->marks[q], tag);
    DSHIM_CHECK(dshim_xfer_read_peer(comm, q, &open, GATE_FIELD(g->peer[q], open), sizeof(open)));
    *open_p = open == tag;
    return DSHIM_OK;
}

/* This rank leaves the call `tag` before its peers said "done": closes its
 * gate, then waits while a peer's mark says it may still write into this
 * rank's rbuf, until that peer clears it (a peer that fails clears its
 * marks on its way out) or its process is gone.  Bounded by the
 * communicator's timeout, after which the peer is named in a warning.
 * Peers write only after the first call's probe round agreed, which this
 * rank joins only once it knows every gate: before that, or when the
 * probe refused (every rank learnt it), nobody to wait for. */
static void close_gate(dshim_comm_t *comm, single_copy_gate_t *g, uint64_t tag)
{
    store_then_barrier(&g->open, 0);
    if (!g->peers_known || comm->single_copy == DSHIM_SINGLE_COPY_NO) {
        return;
    }
    double deadline = dshim_now() + comm->timeout_s;
    uint64_t mark_at = offsetof(single_copy_gate_t, marks) + sizeof(uint64_t) * (uint64_t)comm->rank;
    for (int p = 0; p < comm->size; p++) {
        uint64_t mark;
        /* a failed read: the peer is gone (a zombie has no memory either) */
        while (p != comm->rank &&
               dshim_xfer_read_peer(comm, p, &mark, g->peer[p] + mark_at, sizeof(mark)) == DSHIM_OK && mark == tag) {
            if (dshim_now() > deadline) {
                char who[160];
                dshim_comm_describe_peer(comm, p, who, sizeof(who));
                DSHIM_WARN("rank %d: leaving a failed single-copy allreduce while %s has not finished writing "
                           "its share into this rank's buffer (it stopped for over %.0f s); it may still write "
                           "there if it resumes",
                           comm->rank, who, comm->timeout_s);
                break;
            }
            sched_yield();
        }
    }
}

/* Step 2: this rank's share, folded from every rank's sbuf into rbuf and
 * written into every open peer's rbuf (g->marks[q] set: this rank may
 * write into q; the caller clears the marks). */
static dshim_status_t reduce_share(dshim_comm_t *comm, single_copy_gate_t *g, const dshim_coll_sig_t *sig,
                                   const where_t *theirs, const char *sb, char *rb, size_t count)
{
    int n = comm->size, r = comm->rank;
    dshim_dtype_t dt = (dshim_dtype_t)sig->dtype;
    dshim_redop_t op = sig->redop == DSHIM_AVG ? DSHIM_SUM : (dshim_redop_t)sig->redop;
    size_t es = dshim_dtype_size(dt);
    uint64_t tag = sig->seq + 1;
    size_t mo, ml;
    dshim_part(count, n, r, &mo, &ml);
    size_t per = SINGLE_COPY_PIECE / es ? SINGLE_COPY_PIECE / es : 1;
    void *tmp;
    DSHIM_CHECK(dshim_comm_scratch(comm, per * es, &tmp));
    for (size_t o = mo; o < mo + ml; o += per) {
        size_t cnt = mo + ml - o < per ? mo + ml - o : per;
        for (int i = 1; i < n; i++) {
            int q = (r + i) % n;
            dshim_status_t st = dshim_xfer_read_peer(comm, q, tmp, theirs[q].sbuf + o * es, cnt * es);
            if (st != DSHIM_OK) {
                return dshim_xfer_fail(comm, sig, st);
            }
            /* the first fold takes this rank's own operand from sbuf */
            DSHIM_CHECK(comm->reduce->reduce(rb + o * es, i == 1 ? sb + o * es : rb + o * es, tmp, cnt, dt, op,
                                             NULL));
        }
        if (sig->redop == DSHIM_AVG) {
            DSHIM_CHECK(comm->reduce->scale_div(rb + o * es, cnt, dt, n, NULL));
        }
        for (int i = 1; i < n; i++) {
            int q = (r + i) % n;
            dshim_status_t st = DSHIM_OK;
            int open = 1;
            if (g->marks[q] != tag) {
                st = mark_writing(comm, g, q, tag, &open);
            }
            if (st == DSHIM_OK && !open) {
                /* q failed and left: this call fails at its last round of
                 * messages; nothing more goes into q */
                return DSHIM_OK;
            }
            if (st == DSHIM_OK) {
                st = dshim_xfer_write_peer(comm, q, rb + o * es, theirs[q].rbuf + o * es, cnt * es);
            }
            if (st != DSHIM_OK) {
                return dshim_xfer_fail(comm, sig, st);
            }
        }
    }
    return DSHIM_OK;
}

dshim_status_t dshim_allreduce_single_copy(dshim_comm_t *comm, const dshim_coll_sig_t *sig, const void *sbuf,
                                           void *rbuf, size_t count)
{
    int n = comm->size, r = comm->rank;
    size_t es = dshim_dtype_size((dshim_dtype_t)sig->dtype);
    uint64_t tag = sig->seq + 1;
    single_copy_gate_t *g = gate_of(comm);
    where_t *theirs = calloc((unsigned)n, sizeof(*theirs));
    if (!g || !theirs) {
        free(theirs);
        return dshim_error(DSHIM_ERR_NOMEM, "out of memory for %d ranks' buffer addresses", n);
    }
    /* open before any peer can learn where the buffers are */
    __atomic_store_n(&g->open, tag, __ATOMIC_SEQ_CST);
    where_t out = {.magic = SINGLE_COPY_MAGIC, .sbuf = (uintptr_t)sbuf, .rbuf = (uintptr_t)rbuf, .gate = (uintptr_t)g};
    dshim_status_t st = all_to_all(comm, sig, &out, theirs, sizeof(out));
    if (st == DSHIM_OK && !g->peers_known) {
        for (int q = 0; q < n; q++) {
            g->peer[q] = theirs[q].gate;
        }
        g->peers_known = 1;
    }
    if (st == DSHIM_OK && comm->single_copy == DSHIM_SINGLE_COPY_UNKNOWN) {
        st = probe(comm, sig, theirs);
    }
    if (st == DSHIM_OK) {
        st = reduce_share(comm, g, sig, theirs, sbuf, rbuf, count);
    }
    for (int q = 0; q < n; q++) {
        __atomic_store_n(&g->marks[q], 0, __ATOMIC_RELEASE); /* after the last write */
    }
    if (st == DSHIM_OK) {
        st = all_to_all(comm, sig, NULL, NULL, 0);
    }
    if (st == DSHIM_OK) {
        __atomic_store_n(&g->open, 0, __ATOMIC_RELEASE);
        /* what the connections did not count: the peers' reads of their
         * shares of this rank's sbuf (sent) and their writes of their shares
         * into its rbuf (received); this rank's own reads and writes count
         * on the connections */
        size_t mo, ml;
        dshim_part(count, n, r, &mo, &ml);
        dshim_comm_count_moved(comm, (count - ml) * es, (count - ml) * es);
    } else {
        close_gate(comm, g, tag);
    }
    free(theirs);
    return st;
}

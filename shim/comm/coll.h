/* Collectives and their algorithms, run inside the engine's executor.
 *
 * Names: dshim_coll_<collective> is a collective's dispatcher (the
 * engine's request function: picks the algorithm and runs it);
 * dshim_<collective>_<algorithm> is an algorithm (dshim_allreduce_ring,
 * dshim_barrier_gate); dshim_<collective>_<algorithm>_fits and
 * dshim_allreduce_choice are the rules that pick one.  Every algorithm
 * lives in a shim/comm/coll_*.c.  They are written against dshim_xfer()
 * only (never against a transport), but for the gate's, which meet in
 * shared memory through the host gate's mechanism (host_gate.h). */
#ifndef DSHIM_COLL_H
#define DSHIM_COLL_H

#include "engine.h"
#include "xfer.h"

dshim_status_t dshim_coll_allreduce(dshim_comm_t *comm, dshim_request_t *req);
dshim_status_t dshim_coll_broadcast(dshim_comm_t *comm, dshim_request_t *req);
dshim_status_t dshim_coll_reduce(dshim_comm_t *comm, dshim_request_t *req);
dshim_status_t dshim_coll_allgatherv(dshim_comm_t *comm, dshim_request_t *req);
dshim_status_t dshim_coll_reduce_scatter(dshim_comm_t *comm, dshim_request_t *req);
dshim_status_t dshim_coll_alltoallv(dshim_comm_t *comm, dshim_request_t *req);
dshim_status_t dshim_coll_gather(dshim_comm_t *comm, dshim_request_t *req);
dshim_status_t dshim_coll_scatter(dshim_comm_t *comm, dshim_request_t *req);
dshim_status_t dshim_coll_barrier(dshim_comm_t *comm, dshim_request_t *req);

/* Through the host gate (coll_gate.c; comm->gate_transport >= 0: every rank
 * on this host).  The barrier: every rank arrives, the last opens. */
dshim_status_t dshim_barrier_gate(dshim_comm_t *comm, const dshim_coll_sig_t *sig);
/* An allreduce in one round (count elements of at most DSHIM_HOST_AREA_DATA
 * bytes): every rank copies its data into its block and arrives, the last
 * one reduces the blocks in rank order into the result, and every rank
 * copies the result out. */
dshim_status_t dshim_allreduce_gate(dshim_comm_t *comm, const dshim_coll_sig_t *sig, const void *sbuf, void *rbuf,
                                    size_t count);
/* The same with the reduction split, for any count: every rank copies its
 * data in and arrives; then each reduces its 1/N of the elements over the N
 * blocks into the result and arrives again; then every rank copies the
 * result out.  In pieces, two in flight: pieces + 1 rounds, and N ranks
 * reduce at once. */
dshim_status_t dshim_allreduce_gate_split(dshim_comm_t *comm, const dshim_coll_sig_t *sig, const void *sbuf,
                                          void *rbuf, size_t count);
/* An allgatherv in one round (dshim_allgather_gate_fits): every rank copies
 * its part into its block and arrives, the last one checks the calls (their
 * totals, and their block counts as a hash) and copies the blocks into the
 * result block in rank order, and every rank copies the result out. */
dshim_status_t dshim_allgatherv_gate(dshim_comm_t *comm, dshim_request_t *req);

/* Hierarchical (coll_hier.c; comm->local set): reduce inside the host
 * (shared memory) to its first rank, allreduce between the hosts' first
 * ranks (network), broadcast inside the host. */
dshim_status_t dshim_allreduce_hier(dshim_comm_t *comm, dshim_request_t *req);
/* Hierarchical barrier: the host's ranks meet at their gate, the hosts'
 * first ranks by dissemination between hosts, the host's ranks at their
 * gate again: ceil(log2 hosts) rounds of messages over the network instead
 * of ceil(log2 N).  Where the ranks of every host that has several meet at
 * a gate (comm->barrier_hier, decided alike on every rank from the peer
 * records by topo.c): measured on 2 cores with pretended hosts
 * (dshim-bench --hosts), its time over the flat dissemination's: N = 4 on
 * 2 hosts 0.56, 8 / 2 0.72, 8 / 4 0.79 (docs/benchmarks.md, "The barrier
 * across hosts"). */
dshim_status_t dshim_barrier_hier(dshim_comm_t *comm, dshim_request_t *req);

/* Recursive-doubling allreduce of buf in place (latency-optimal; any size,
 * non-powers of two fold the extra ranks in first). */
dshim_status_t dshim_allreduce_rd(dshim_comm_t *comm, const dshim_coll_sig_t *sig, void *buf, size_t count);
/* Direct reduce-scatter then allgather: rank p reduces part p, received
 * from every rank at once, and sends it to every rank (two rounds instead of
 * the ring's 2(N-1) steps, the same bytes; every rank talks to every other). */
dshim_status_t dshim_allreduce_direct(dshim_comm_t *comm, const dshim_coll_sig_t *sig, const void *sbuf, void *rbuf,
                                      size_t count);
/* Rabenseifner's: reduce-scatter by recursive halving, then allgather by
 * recursive doubling (2 log2 N steps, the ring's bytes; ranks beyond a power
 * of two fold in and out as in recursive doubling), in place on buf, one
 * dshim_xfer per step. */
dshim_status_t dshim_allreduce_rabenseifner(dshim_comm_t *comm, const dshim_coll_sig_t *sig, void *buf, size_t count);
/* Pipelined ring: reduce-scatter then allgather, one xfer for all steps. */
dshim_status_t dshim_allreduce_ring(dshim_comm_t *comm, const dshim_coll_sig_t *sig, const void *sbuf, void *rbuf,
                                    size_t count);

/* The single-copy allreduce (coll_single_copy.c): every rank reads its
 * share of the others' sbufs and the other shares of their rbufs straight
 * from their memory.  DSHIM_ERR_UNSUPPORTED (the communicator untouched,
 * nothing reduced) when the first call's probe found that some rank cannot
 * read the others: the caller then runs another algorithm, and so does auto
 * from then on. */
dshim_status_t dshim_allreduce_single_copy(dshim_comm_t *comm, const dshim_coll_sig_t *sig, const void *sbuf,
                                           void *rbuf, size_t count);
/* Decided once from the peer records (bootstrap), the same on every rank:
 * comm->single_copy_transport = a host-local transport that can read every
 * rank's memory (every rank on this host allowed it), else -1. */
void dshim_single_copy_plan(dshim_comm_t *comm);

/* Where auto picks the single-copy allreduce: every rank on one host with a
 * core of its own (with more ranks than cores the gate runs large
 * allreduces: single copy in place was 0.8-0.9 of its time at N = 4 on 2
 * cores from 256 KiB to 8 MiB, even at N = 3, behind at N = 6), from
 * DSHIM_SINGLE_COPY_MIN_BYTES, where the ring's second copy costs more than
 * the two rounds of small messages around the copies; above
 * DSHIM_SINGLE_COPY_MAX_BYTES only in place (sbuf == rbuf, as DDP, Horovod
 * and MPI_IN_PLACE call it): writing the result into peers' separate rbufs
 * that large reads every line of them from memory first, where the ring's
 * copy-out streams.  Paired on 2 cores, N = 2, time over auto's (rd, then the
 * ring): out of place 32 KiB 0.93, 64-256 KiB 0.52-0.64, 1-16 MiB 0.69-0.82,
 * 32 MiB 1.26, 64 MiB 1.02; in place 64 KiB-64 MiB 0.47-0.73; the writers'
 * gate then added 1-2 us a call (in place 64 KiB 1.07 of recursive
 * doubling's time, 128 KiB 0.83, 256 KiB 0.65) (docs/benchmarks.md, "Single
 * copy: writing the result"). */
#define DSHIM_SINGLE_COPY_MIN_BYTES ((size_t)128 << 10)
#define DSHIM_SINGLE_COPY_MAX_BYTES ((size_t)16 << 20)

static inline int dshim_allreduce_single_copy_usable(const dshim_comm_t *comm)
{
    return comm->single_copy_transport >= 0 && comm->single_copy != DSHIM_SINGLE_COPY_NO;
}

static inline int dshim_allreduce_single_copy_fits(const dshim_comm_t *comm, size_t bytes, int in_place)
{
    return dshim_allreduce_single_copy_usable(comm) && !comm->spin_yields && bytes >= DSHIM_SINGLE_COPY_MIN_BYTES &&
           (bytes <= DSHIM_SINGLE_COPY_MAX_BYTES || in_place);
}

/* Where auto picks the direct allreduce (docs/benchmarks.md, "Ranks
 * outnumber cores"): one host with more ranks than cores — each step of a
 * ring or of recursive doubling then waits for a peer to be scheduled, and
 * two rounds beat 2(N-1) steps or log2 N full-size exchanges — from 3 to 8
 * ranks (every rank talks to every other), from past the small-message
 * range (N = 3: recursive doubling's fold costs less there; N >= 4: above a
 * quarter of it, where log2 N full copies outweigh a round) while one round
 * keeps at most DSHIM_DIRECT_MAX_ROUND_BYTES in flight: (N-1)·B, every rank
 * sending B/N to each of N-1 peers at once.  Beyond that the round's bytes
 * leave the cores' caches (measured on 2 cores with 1 MiB of L2 each: N = 4
 * direct wins at 512 KiB and loses at 1 MiB, N = 8 wins at 128 KiB and
 * loses at 256 KiB) and the ring's pipelined chunks win.  The same answer on
 * every rank: one host means one core count. */
#define DSHIM_DIRECT_MAX_RANKS 8
#define DSHIM_DIRECT_MAX_ROUND_BYTES ((size_t)3 << 19) /* 1.5 MiB */
/* Over sockets (DSHIM_TRANSPORT=tcp on one host) the round's bytes wait in
 * the kernel's socket buffers, not in the cores' caches, and direct wins at
 * every size up to 4 ranks: N = 3 on 2 cores 1 / 16 / 64 MiB 830 us / 17.3 ms
 * / 79 ms against the ring's 947 / 21.8 / 102, N = 4 4 MiB 6.7 ms against
 * 7.5 and 64 MiB 118 against 160 (5 interleaved runs each); at N = 8 it
 * loses (1 MiB 6.8 ms against 4.4).  With a power of two ranks
 * Rabenseifner's beats it there (below). */
#define DSHIM_DIRECT_SOCKETS_MAX_RANKS 4

/* Over sockets with a power of two ranks from 4 on, where direct would run,
 * Rabenseifner's allreduce runs instead: its pairwise exchanges beat all
 * ranks sending to all at once through the kernel's socket buffers (paired
 * on 2 cores, its time over direct's: N = 4 32 KiB 0.58, 64 KiB 0.74,
 * 256 KiB 0.72, 1 MiB 0.73, 4 MiB 0.91, 16 MiB 1.00, 64 MiB 0.92; N = 8
 * 32 / 64 / 128 / 192 KiB 0.37 / 0.38 / 0.90 / 0.68; docs/benchmarks.md,
 * "Over sockets: halving beats direct").  Not at N = 3: its fold in and out
 * loses to direct below 1 MiB. */
static inline int dshim_allreduce_halving_over_sockets(const dshim_comm_t *comm)
{
    int n = comm->size;
    return comm->sockets_only && n >= 4 && (n & (n - 1)) == 0;
}

/* Where the direct allreduce's single round wins over the ring (above). */
static inline int dshim_allreduce_direct_range(const dshim_comm_t *comm, size_t bytes, size_t count)
{
    int n = comm->size;
    if (comm->nhosts != 1 || !comm->spin_yields || n < 3 || n > DSHIM_DIRECT_MAX_RANKS || count < (size_t)n) {
        return 0;
    }
    if (bytes > DSHIM_DIRECT_MAX_ROUND_BYTES / (size_t)(n - 1) &&
        !(comm->sockets_only && n <= DSHIM_DIRECT_SOCKETS_MAX_RANKS)) {
        return 0;
    }
    return bytes > (n == 3 ? comm->small_msg_bytes : comm->small_msg_bytes / 4);
}

static inline int dshim_allreduce_direct_fits(const dshim_comm_t *comm, size_t bytes, size_t count)
{
    return dshim_allreduce_direct_range(comm, bytes, count) && !dshim_allreduce_halving_over_sockets(comm);
}

/* Where auto picks Rabenseifner's allreduce: one host with more ranks than
 * cores and more than DSHIM_DIRECT_MAX_RANKS of them, past the small-message
 * range up to DSHIM_RABENSEIFNER_MAX_BYTES; and over sockets with a power of
 * two ranks where direct would run (dshim_allreduce_halving_over_sockets,
 * above).  Each of the ring's 2(N-1) dependent steps waits for a peer to
 * be scheduled; 2 log2 N steps of the same bytes wait less (N = 16:
 * 64-256 KiB 1.4-1.8x faster than the ring, N = 64: 128-256 KiB 1.1-1.9x).  Beyond, the ring's pipelined chunks win
 * (N = 16, 1 MiB: 5.0 ms against the ring's 3.6), as the halving steps move
 * B/2, B/4, ... whole (docs/benchmarks.md, "Ranks outnumber cores"). */
#define DSHIM_RABENSEIFNER_MAX_BYTES ((size_t)256 << 10)

static inline int dshim_allreduce_rabenseifner_fits(const dshim_comm_t *comm, size_t bytes, size_t count)
{
    if (dshim_allreduce_halving_over_sockets(comm) && dshim_allreduce_direct_range(comm, bytes, count)) {
        return 1;
    }
    return comm->nhosts == 1 && comm->spin_yields && comm->size > DSHIM_DIRECT_MAX_RANKS &&
           count >= (size_t)comm->size && bytes > comm->small_msg_bytes && bytes <= DSHIM_RABENSEIFNER_MAX_BYTES;
}

/* Where auto runs an allreduce through the host gate (host_gate.h): every
 * rank on one host with shared memory and more ranks than cores.  The gate
 * takes one round (DSHIM_AR_GATE: the last arrival reduces) or two
 * (DSHIM_AR_GATE_SPLIT: every rank reduces its share) whatever N, where
 * messages take log2 N rounds or 2(N - 1) ring steps, each waiting for
 * ranks to be scheduled.  The one-round form's reduction is one rank's pass
 * over N inputs, which the others wait for: up to 16 KiB, 64 KiB from 8
 * ranks on; above, the split form at every size (a data block at a time).
 * Measured on 2 cores (paired, time with messages over the gate's):
 * one round N = 4 4 / 16 / 32 / 64 KiB 1.60 / 1.46 / 1.01 / 0.65, N = 8
 * 2.22 / 1.79 / 2.10 / 2.61; split N = 4 64 / 256 KiB 1.2-1.6 / 1.3-1.8,
 * 1 / 4 / 16 MiB 1.96 / 1.29 / 1.32, N = 8, 16, 32 1.4-2.2 from 1 to 16 MiB
 * (docs/benchmarks.md, "The host gate", "The split gate").  With a
 * core per rank the messages of all ranks move at once and the gate's
 * copies lose (N = 2: 4 KiB 1.2-1.6x, 1 MiB 1.3-2.2x the time): not used
 * there. */
#define DSHIM_GATE_ALLREDUCE_MAX_BYTES ((size_t)64 << 10)
#define DSHIM_GATE_ALLREDUCE_FEW_RANKS_MAX_BYTES ((size_t)16 << 10)
#define DSHIM_GATE_ALLREDUCE_MANY_RANKS 8
_Static_assert(DSHIM_GATE_ALLREDUCE_MAX_BYTES <= DSHIM_HOST_AREA_DATA, "the host gate's data blocks are too small");

/* Where auto gathers through the gate: one host with shared memory and
 * more ranks than cores (or a communicator whose background thread shares
 * the cores with the application's, dshim_hook_shares_cores), up to
 * DSHIM_GATE_ALLGATHER_MAX_BYTES in all.  The ring's N - 1 steps each wait
 * for a neighbour to be scheduled; the gate waits once.  Its first user is
 * the named operations' negotiation round (a 512-byte slot per rank,
 * shim/named/named_round.c): a 1-float allreduce through the engine, N = 4
 * on 2 cores, took 4-5x dshim_allreduce's time instead of 7-17x (a busy
 * machine, interleaved runs).  The same answer on every rank: the counts
 * are every rank's. */
#define DSHIM_GATE_ALLGATHER_MAX_BYTES ((size_t)64 << 10)
_Static_assert(DSHIM_GATE_ALLGATHER_MAX_BYTES <= DSHIM_HOST_AREA_DATA, "the host gate's data blocks are too small");

static inline int dshim_allgather_gate_fits(const dshim_comm_t *comm, size_t bytes)
{
    return comm->gate_transport >= 0 && comm->algo == DSHIM_ALGO_AUTO && comm->spin_yields && comm->size > 1 &&
           bytes > 0 && bytes <= DSHIM_GATE_ALLGATHER_MAX_BYTES;
}

/* Which allreduce algorithm runs a request: decided here once, for
 * dshim_coll_allreduce and for the flight recorder's entry. */
typedef enum {
    DSHIM_AR_NONE = 0,
    DSHIM_AR_HIER,
    DSHIM_AR_RD,
    DSHIM_AR_RING,
    DSHIM_AR_DIRECT,
    DSHIM_AR_RABENSEIFNER,
    DSHIM_AR_GATE,
    DSHIM_AR_GATE_SPLIT,
    DSHIM_AR_SINGLE_COPY
} dshim_ar_choice_t;

/* The gate's choice for an allreduce of this many bytes: DSHIM_AR_GATE,
 * DSHIM_AR_GATE_SPLIT, or DSHIM_AR_NONE when it is not the gate's.
 * DSHIM_ALGO=gate: the one-round form up to a data block
 * (DSHIM_HOST_AREA_DATA); gate-split: the split form at every size. */
static inline dshim_ar_choice_t dshim_allreduce_gate_choice(const dshim_comm_t *comm, size_t bytes)
{
    if (comm->gate_transport < 0) {
        return DSHIM_AR_NONE;
    }
    if (comm->algo == DSHIM_ALGO_GATE_SPLIT) {
        return DSHIM_AR_GATE_SPLIT;
    }
    if (comm->algo == DSHIM_ALGO_GATE) {
        return bytes <= DSHIM_HOST_AREA_DATA ? DSHIM_AR_GATE : DSHIM_AR_NONE;
    }
    if (comm->algo != DSHIM_ALGO_AUTO || !comm->spin_yields) {
        return DSHIM_AR_NONE;
    }
    return bytes <= (comm->size >= DSHIM_GATE_ALLREDUCE_MANY_RANKS ? DSHIM_GATE_ALLREDUCE_MAX_BYTES
                                                                    : DSHIM_GATE_ALLREDUCE_FEW_RANKS_MAX_BYTES)
               ? DSHIM_AR_GATE
               : DSHIM_AR_GATE_SPLIT;
}

static inline dshim_ar_choice_t dshim_allreduce_choice(const dshim_comm_t *comm, const dshim_request_t *req)
{
    size_t bytes = req->count * dshim_dtype_size(req->dtype);
    if (req->count == 0 || comm->size == 1) {
        return DSHIM_AR_NONE;
    }
    dshim_ar_choice_t gate = dshim_allreduce_gate_choice(comm, bytes);
    if (gate != DSHIM_AR_NONE) {
        return gate;
    }
    /* DSHIM_ALGO=gate or gate-split where the gate cannot serve: auto's
     * choice; cma too where single copies cannot serve (below) */
    int algo = comm->algo == DSHIM_ALGO_GATE || comm->algo == DSHIM_ALGO_GATE_SPLIT ? DSHIM_ALGO_AUTO : comm->algo;
    if (algo == DSHIM_ALGO_CMA && !dshim_allreduce_single_copy_usable(comm)) {
        algo = DSHIM_ALGO_AUTO;
    }
    if (comm->local &&
        (algo == DSHIM_ALGO_HIER || (algo == DSHIM_ALGO_AUTO && bytes > comm->small_msg_bytes))) {
        return DSHIM_AR_HIER;
    }
    if (algo == DSHIM_ALGO_CMA ||
        (algo == DSHIM_ALGO_AUTO && dshim_allreduce_single_copy_fits(comm, bytes, req->sbuf == req->rbuf))) {
        return DSHIM_AR_SINGLE_COPY;
    }
    if (algo == DSHIM_ALGO_DIRECT) {
        return DSHIM_AR_DIRECT;
    }
    if (algo == DSHIM_ALGO_RABENSEIFNER) {
        return DSHIM_AR_RABENSEIFNER;
    }
    if (algo == DSHIM_ALGO_AUTO && dshim_allreduce_direct_fits(comm, bytes, req->count)) {
        return DSHIM_AR_DIRECT;
    }
    if (algo == DSHIM_ALGO_AUTO && dshim_allreduce_rabenseifner_fits(comm, bytes, req->count)) {
        return DSHIM_AR_RABENSEIFNER;
    }
    if (algo == DSHIM_ALGO_RD ||
        (algo == DSHIM_ALGO_AUTO && (bytes <= comm->small_msg_bytes || req->count < (size_t)comm->size))) {
        return DSHIM_AR_RD;
    }
    return DSHIM_AR_RING;
}

/* Broadcast: a binomial tree for small messages, else a pipelined chain. */
static inline int dshim_bcast_uses_tree(const dshim_comm_t *comm, size_t bytes)
{
    return bytes <= comm->small_msg_bytes;
}

/* The algorithm's name for the flight recorder (static; NULL for
 * point-to-point and internal requests). */
const char *dshim_algo_name(const dshim_comm_t *comm, const dshim_request_t *req);

/* Balanced partition of count elements into n parts: part i. */
static inline void dshim_part(size_t count, int n, int i, size_t *off, size_t *len)
{
    size_t base = count / (size_t)n, extra = count % (size_t)n;
    *off = (size_t)i * base + ((size_t)i < extra ? (size_t)i : extra);
    *len = base + ((size_t)i < extra ? 1 : 0);
}

#endif

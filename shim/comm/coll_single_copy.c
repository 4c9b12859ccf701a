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
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll.h"
#include "log.h"
#include "status.h"

/* Bytes of every peer's sbuf read per piece of a share: a few of them stay
 * in a core's L2 with the piece of the result they fold into. */
#define SINGLE_COPY_PIECE ((size_t)256 << 10)

#define SINGLE_COPY_MAGIC 0x796c6e6f2d646165ull /* what the probe expects to read */

/* What each rank tells the others in step 1. */
typedef struct where {
    uint64_t magic;
    uint64_t sbuf, rbuf;
    uint64_t probe; /* the address of `magic`, which the first call's probe reads */
} where_t;

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
        dshim_status_t st = dshim_xfer_read_peer(comm, q, &got, theirs[q].probe, sizeof(got));
        if (st == DSHIM_OK && got == SINGLE_COPY_MAGIC) {
            /* the same word back: writing is allowed where reading is, unless
             * a seccomp profile tells them apart */
            st = dshim_xfer_write_peer(comm, q, &got, theirs[q].probe, sizeof(got));
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

/* Step 2: this rank's share, folded from every rank's sbuf into rbuf and
 * written into every peer's rbuf. */
static dshim_status_t reduce_share(dshim_comm_t *comm, const dshim_coll_sig_t *sig, const where_t *theirs,
                                   const char *sb, char *rb, size_t count)
{
    int n = comm->size, r = comm->rank;
    dshim_dtype_t dt = (dshim_dtype_t)sig->dtype;
    dshim_redop_t op = sig->redop == DSHIM_AVG ? DSHIM_SUM : (dshim_redop_t)sig->redop;
    size_t es = dshim_dtype_size(dt);
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
            dshim_status_t st = dshim_xfer_write_peer(comm, q, rb + o * es, theirs[q].rbuf + o * es, cnt * es);
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
    /* volatile: the peers read `magic` through the kernel, never through this code */
    volatile where_t mine = {.magic = SINGLE_COPY_MAGIC, .sbuf = (uintptr_t)sbuf, .rbuf = (uintptr_t)rbuf};
    mine.probe = (uintptr_t)&mine.magic;
    where_t *theirs = calloc((unsigned)n, sizeof(*theirs));
    if (!theirs) {
        return dshim_error(DSHIM_ERR_NOMEM, "out of memory for %d ranks' buffer addresses", n);
    }
    where_t out = mine;
    dshim_status_t st = all_to_all(comm, sig, &out, theirs, sizeof(out));
    if (st == DSHIM_OK && comm->single_copy == DSHIM_SINGLE_COPY_UNKNOWN) {
        st = probe(comm, sig, theirs);
    }
    if (st == DSHIM_OK) {
        st = reduce_share(comm, sig, theirs, sbuf, rbuf, count);
    }
    if (st == DSHIM_OK) {
        st = all_to_all(comm, sig, NULL, NULL, 0);
    }
    if (st == DSHIM_OK) {
        /* what the connections did not count: the peers' reads of their
         * shares of this rank's sbuf (sent) and their writes of their shares
         * into its rbuf (received); this rank's own reads and writes count
         * on the connections */
        size_t mo, ml;
        dshim_part(count, n, r, &mo, &ml);
        dshim_comm_count_moved(comm, (count - ml) * es, (count - ml) * es);
    }
    free(theirs);
    return st;
}

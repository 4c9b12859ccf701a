/* The algorithms that run through the host gate (host_gate.h, its
 * mechanism): the barrier, the allreduce in one round or with the
 * reduction split over the ranks, and the small allgather.  coll.h says when each runs. */
#include <string.h>

#include "coll.h"
#include "host_gate.h"
#include "status.h"

dshim_status_t dshim_barrier_gate(dshim_comm_t *comm, const dshim_coll_sig_t *sig)
{
    void *area;
    DSHIM_CHECK(dshim_host_gate_area(comm, sig, &area));
    int last;
    uint64_t episode = dshim_host_gate_arrive(comm, area, sig, &last);
    if (last) {
        dshim_host_gate_open(area, episode, dshim_host_gate_first_differing(comm, area));
    } else {
        DSHIM_CHECK(dshim_host_gate_wait_open(comm, sig, area, episode));
    }
    return dshim_host_gate_check_calls(comm, sig, area);
}


/* This rank's data into its block at byte offset base (the half of a
 * split allreduce's piece), but for bytes [skip, skip + skip_len), which
 * nobody else reads. */
static void copy_in(dshim_comm_t *comm, void *area, size_t base, const void *data, size_t bytes, size_t skip,
                    size_t skip_len)
{
    unsigned char *block = dshim_host_gate_data(area, comm->size, comm->rank) + base;
    if (skip) {
        memcpy(block, data, skip);
    }
    if (skip + skip_len < bytes) {
        memcpy(block + skip + skip_len, (const unsigned char *)data + skip + skip_len, bytes - skip - skip_len);
    }
}

/* Rank r's data from byte offset base of its block, or for this rank
 * `own` when given (the caller's buffer, which it did not copy in). */
static const unsigned char *input(dshim_comm_t *comm, void *area, size_t base, const void *own, int r)
{
    return r == comm->rank && own ? (const unsigned char *)own : dshim_host_gate_data(area, comm->size, r) + base;
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
        unsigned char *result = dshim_host_gate_data(area, comm->size, comm->size) + base + at;
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

dshim_status_t dshim_allreduce_gate(dshim_comm_t *comm, const dshim_coll_sig_t *sig, const void *sbuf, void *rbuf,
                                    size_t count)
{
    void *area;
    DSHIM_CHECK(dshim_host_gate_area(comm, sig, &area));
    size_t bytes = count * dshim_dtype_size((dshim_dtype_t)sig->dtype);
    int last;
    copy_in(comm, area, 0, sbuf, bytes, 0, 0);
    uint64_t episode = dshim_host_gate_arrive(comm, area, sig, &last);
    if (last) {
        /* the whole reduction by the rank that arrived last: the others
         * wait for it anyway, and with ranks sharing cores one pass over N
         * small inputs beats another round of arrivals */
        int32_t differs = dshim_host_gate_first_differing(comm, area);
        if (!differs) {
            DSHIM_CHECK(reduce_blocks(comm, area, sig, 0, 0, count, NULL));
        }
        dshim_host_gate_open(area, episode, differs);
    } else {
        DSHIM_CHECK(dshim_host_gate_wait_open(comm, sig, area, episode));
    }
    DSHIM_CHECK(dshim_host_gate_check_calls(comm, sig, area));
    /* the result stays until every rank has copied it: the next episode's
     * reduction writes it only once every rank arrived there */
    memcpy(rbuf, dshim_host_gate_data(area, comm->size, comm->size), bytes);
    dshim_comm_count_moved(comm, bytes, bytes);
    return DSHIM_OK;
}

/* The block counts as one word for the check of the calls (FNV-1a; never
 * 0, which stands for "no counts").  Ranks that pass different counts with
 * the same total would otherwise get each other's elements in the wrong
 * blocks, where the ring fails on a message of the wrong size. */
static uint64_t parts_hash(const size_t *counts, int n)
{
    uint64_t h = 14695981039346656037ull;
    for (int r = 0; r < n; r++) {
        uint64_t c = counts[r];
        for (int b = 0; b < 8; b++, c >>= 8) {
            h = (h ^ (c & 0xff)) * 1099511628211ull;
        }
    }
    return h | 1;
}

dshim_status_t dshim_allgatherv_gate(dshim_comm_t *comm, dshim_request_t *req)
{
    const dshim_coll_sig_t *sig = &req->sig;
    void *area;
    DSHIM_CHECK(dshim_host_gate_area(comm, sig, &area));
    size_t es = dshim_dtype_size(req->dtype), total = req->count * es;
    copy_in(comm, area, 0, req->sbuf, req->counts[comm->rank] * es, 0, 0);
    int last;
    uint64_t episode = dshim_host_gate_arrive_parts(comm, area, sig, parts_hash(req->counts, comm->size), &last);
    unsigned char *result = dshim_host_gate_data(area, comm->size, comm->size);
    if (last) {
        /* into the result block, which the next episode's last arrival
         * writes only once every rank arrived there (so copied this one
         * out): a rank's own block is written again as soon as it leaves */
        int32_t differs = dshim_host_gate_first_differing(comm, area);
        if (!differs) {
            size_t at = 0; /* packed in rank order: the caller's displacements may leave gaps */
            for (int r = 0; r < comm->size; r++) {
                memcpy(result + at, dshim_host_gate_data(area, comm->size, r), req->counts[r] * es);
                at += req->counts[r] * es;
            }
        }
        dshim_host_gate_open(area, episode, differs);
    } else {
        DSHIM_CHECK(dshim_host_gate_wait_open(comm, sig, area, episode));
    }
    DSHIM_CHECK(dshim_host_gate_check_calls(comm, sig, area));
    unsigned char *out = req->rbuf;
    size_t at = 0;
    for (int r = 0; r < comm->size; r++) {
        memcpy(out + req->displs[r] * es, result + at, req->counts[r] * es);
        at += req->counts[r] * es;
    }
    dshim_comm_count_moved(comm, req->counts[comm->rank] * es, total);
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

dshim_status_t dshim_allreduce_gate_split(dshim_comm_t *comm, const dshim_coll_sig_t *sig, const void *sbuf,
                                          void *rbuf, size_t count)
{
    void *area;
    DSHIM_CHECK(dshim_host_gate_area(comm, sig, &area));
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
        uint64_t episode =
            j == 0 ? dshim_host_gate_arrive(comm, area, sig, &last) : dshim_host_gate_arrive_again(comm, area, &last);
        if (last) {
            dshim_host_gate_open(area, episode, j == 0 ? dshim_host_gate_first_differing(comm, area) : 0);
        } else {
            DSHIM_CHECK(dshim_host_gate_wait_open(comm, sig, area, episode));
        }
        if (j == 0) {
            DSHIM_CHECK(dshim_host_gate_check_calls(comm, sig, area));
        } else {
            /* every share of piece j - 1 is reduced; its half of the result
             * is written again only after every rank arrived once more */
            memcpy(rb + prev.first * es, dshim_host_gate_data(area, comm->size, comm->size) + prev.base,
                   prev.count * es);
        }
    }
    dshim_comm_count_moved(comm, count * es, count * es);
    return DSHIM_OK;
}


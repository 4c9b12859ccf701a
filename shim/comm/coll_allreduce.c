/* Allreduce: its dispatcher (dshim_coll_allreduce: the algorithm that
 * dshim_allreduce_choice in coll.h picks; the gate's, the hierarchy's and
 * the single copy's live in coll_gate.c, coll_hier.c, coll_single_copy.c)
 * and the algorithms over messages: recursive doubling for small messages,
 * direct, Rabenseifner's, pipelined ring for large ones.
 * Every rank ends with bit-identical buffers: the ring computes each element
 * exactly once and copies it around; recursive doubling always combines
 * operands in rank order (lower rank's partial first). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll.h"
#include "status.h"

static int mod(int a, int n)
{
    return ((a % n) + n) % n;
}

/* Recursive doubling and Rabenseifner's on n ranks, n not a power of two:
 * p is the largest power of two <= n and rem = n - p.  Of ranks 0..2rem-1
 * the even ones hand their data to r+1 and get the result back at the end;
 * the odd ones reduce it in and act as vrank r/2; the others are r - rem. */
typedef struct fold {
    int p, rem;
    int vrank; /* -1: folded out, this rank already holds the result */
} fold_t;

static int fold_real_rank(const fold_t *f, int v)
{
    return v < f->rem ? 2 * v + 1 : v + f->rem;
}

static dshim_status_t fold_in(dshim_comm_t *comm, const dshim_coll_sig_t *sig, void *buf, size_t bytes, fold_t *f)
{
    int n = comm->size, r = comm->rank;
    f->p = 1;
    while (f->p * 2 <= n) {
        f->p *= 2;
    }
    f->rem = n - f->p;
    dshim_xfer_op_t op;
    if (r >= 2 * f->rem) {
        f->vrank = r - f->rem;
        return DSHIM_OK;
    }
    if (r % 2 == 0) {
        /* folded out: hand my data to r+1, get the result back at the end */
        f->vrank = -1;
        op = dshim_xf_send(r + 1, buf, bytes);
        DSHIM_CHECK(dshim_xfer(comm, sig, &op, 1));
        op = dshim_xf_recv(r + 1, buf, bytes);
        return dshim_xfer(comm, sig, &op, 1);
    }
    f->vrank = r / 2;
    op = dshim_xf_recv_reduce(r - 1, buf, buf, bytes, 1);
    return dshim_xfer(comm, sig, &op, 1);
}

/* The result back to the folded-out partner. */
static dshim_status_t fold_out(dshim_comm_t *comm, const dshim_coll_sig_t *sig, void *buf, size_t bytes,
                               const fold_t *f)
{
    if (comm->rank >= 2 * f->rem) {
        return DSHIM_OK;
    }
    dshim_xfer_op_t op = dshim_xf_send(comm->rank - 1, buf, bytes);
    return dshim_xfer(comm, sig, &op, 1);
}

dshim_status_t dshim_allreduce_rd(dshim_comm_t *comm, const dshim_coll_sig_t *sig, void *buf, size_t count)
{
    int n = comm->size, r = comm->rank;
    size_t bytes = count * dshim_dtype_size((dshim_dtype_t)sig->dtype);
    fold_t f;
    DSHIM_CHECK(fold_in(comm, sig, buf, bytes, &f));
    if (f.vrank < 0) {
        return DSHIM_OK;
    }
    dshim_xfer_op_t ops[2];
    for (int mask = 1; mask < f.p; mask <<= 1) {
        int peer = fold_real_rank(&f, f.vrank ^ mask);
        ops[0] = dshim_xf_send(peer, buf, bytes);
        /* reduce into buf only behind what was already sent from it */
        ops[1] = dshim_xf_recv_reduce(peer, buf, buf, bytes, peer < r);
        ops[1].dep = &ops[0];
        DSHIM_CHECK(dshim_xfer(comm, sig, ops, 2));
    }
    if (sig->redop == DSHIM_AVG) {
        DSHIM_CHECK(comm->reduce->scale_div(buf, count, (dshim_dtype_t)sig->dtype, n, NULL));
    }
    return fold_out(comm, sig, buf, bytes, &f);
}

/* Element offset of block b of count elements split into p blocks (b = p: the end). */
static size_t block_off(size_t count, int p, int b)
{
    size_t off, len;
    if (b >= p) {
        return count;
    }
    dshim_part(count, p, b, &off, &len);
    return off;
}

dshim_status_t dshim_allreduce_rabenseifner(dshim_comm_t *comm, const dshim_coll_sig_t *sig, void *buf, size_t count)
{
    int n = comm->size, r = comm->rank;
    size_t es = dshim_dtype_size((dshim_dtype_t)sig->dtype);
    size_t bytes = count * es;
    char *b = buf;
    fold_t f;
    DSHIM_CHECK(fold_in(comm, sig, buf, bytes, &f));
    if (f.vrank < 0) {
        return DSHIM_OK;
    }
    int p = f.p, vrank = f.vrank;
    dshim_xfer_op_t ops[2];
    /* reduce-scatter by recursive halving: [lo, hi) are the blocks still mine;
     * each step keeps the half on my side of the mask and reduces the
     * partner's copy of it into mine, while the other half goes to him */
    int lo = 0, hi = p;
    for (int mask = p / 2; mask >= 1; mask /= 2) {
        int peer = fold_real_rank(&f, vrank ^ mask);
        int mid = lo + (hi - lo) / 2;
        int keep_lo = (vrank & mask) ? mid : lo, keep_hi = (vrank & mask) ? hi : mid;
        int give_lo = (vrank & mask) ? lo : mid, give_hi = (vrank & mask) ? mid : hi;
        size_t ko = block_off(count, p, keep_lo), kl = block_off(count, p, keep_hi) - ko;
        size_t go = block_off(count, p, give_lo), gl = block_off(count, p, give_hi) - go;
        ops[0] = dshim_xf_send(peer, b + go * es, gl * es);
        ops[1] = dshim_xf_recv_reduce(peer, b + ko * es, b + ko * es, kl * es, peer < r);
        DSHIM_CHECK(dshim_xfer(comm, sig, ops, 2));
        lo = keep_lo;
        hi = keep_hi;
    }
    /* block vrank is reduced here and nowhere else: every rank gets these bits */
    if (sig->redop == DSHIM_AVG) {
        size_t mo = block_off(count, p, lo);
        DSHIM_CHECK(comm->reduce->scale_div(b + mo * es, block_off(count, p, hi) - mo, (dshim_dtype_t)sig->dtype, n,
                                            NULL));
    }
    /* allgather by recursive doubling: the blocks I hold for the partner's */
    for (int mask = 1; mask < p; mask *= 2) {
        int peer = fold_real_rank(&f, vrank ^ mask);
        int size = hi - lo;
        int plo = (vrank & mask) ? lo - size : hi, phi = plo + size;
        size_t mo = block_off(count, p, lo), ml = block_off(count, p, hi) - mo;
        size_t po = block_off(count, p, plo), pl = block_off(count, p, phi) - po;
        ops[0] = dshim_xf_send(peer, b + mo * es, ml * es);
        ops[1] = dshim_xf_recv(peer, b + po * es, pl * es);
        DSHIM_CHECK(dshim_xfer(comm, sig, ops, 2));
        lo = lo < plo ? lo : plo;
        hi = hi > phi ? hi : phi;
    }
    return fold_out(comm, sig, buf, bytes, &f);
}

/* The direct and the ring allreduce each run 4(n-1) ops in one dshim_xfer:
 * on the stack up to 16 ranks, else on the heap. */
#define AR_STACK_OPS (4 * 16)

static dshim_xfer_op_t *alloc_ops(dshim_xfer_op_t *stack, int n)
{
    size_t nops = (size_t)4 * (size_t)(n - 1);
    dshim_xfer_op_t *ops = nops <= AR_STACK_OPS ? stack : calloc(nops, sizeof(*ops));
    if (!ops) {
        dshim_error(DSHIM_ERR_NOMEM, "out of memory for the %zu transfer steps of an allreduce over %d ranks", nops,
                    n);
    }
    return ops;
}

static dshim_status_t xfer_and_free(dshim_comm_t *comm, const dshim_coll_sig_t *sig, dshim_xfer_op_t *ops, int k,
                                    const dshim_xfer_op_t *stack)
{
    dshim_status_t st = dshim_xfer(comm, sig, ops, k);
    if (ops != stack) {
        free(ops);
    }
    return st;
}

dshim_status_t dshim_allreduce_direct(dshim_comm_t *comm, const dshim_coll_sig_t *sig, const void *sbuf, void *rbuf,
                                      size_t count)
{
    int n = comm->size, r = comm->rank;
    size_t es = dshim_dtype_size((dshim_dtype_t)sig->dtype);
    dshim_xfer_op_t ops_stack[AR_STACK_OPS];
    dshim_xfer_op_t *ops = alloc_ops(ops_stack, n);
    if (!ops) {
        return DSHIM_ERR_NOMEM;
    }
    const char *sb = sbuf;
    char *rb = rbuf;
    size_t mo, ml;
    dshim_part(count, n, r, &mo, &ml);
    int k = 0;
    /* reduce-scatter: part p goes to rank p; my part gathers everyone's,
     * folded in a fixed order (r+1, r+2, ...: only this rank computes it, so
     * only the order across runs matters), chunk by chunk behind the previous
     * fold (dep) */
    dshim_xfer_op_t *fold = NULL;
    for (int i = 1; i < n; i++) {
        int to = mod(r + i, n), from = mod(r - i, n);
        size_t po, pl;
        dshim_part(count, n, to, &po, &pl);
        ops[k] = dshim_xf_send(to, sb + po * es, pl * es);
        ops[k + 1] = dshim_xf_recv_reduce(from, rb + mo * es, fold ? rb + mo * es : sb + mo * es, ml * es, 1);
        ops[k + 1].dep = fold;
        ops[k + 1].avg_div = i == n - 1 && sig->redop == DSHIM_AVG;
        fold = &ops[k + 1];
        k += 2;
    }
    /* allgather: my reduced part to everyone, as it is folded (dep); the
     * others' parts into place.  In place (sb == rb) a part p arrives only
     * after rank p folded what I sent of it, i.e. after it left my buffer. */
    for (int i = 1; i < n; i++) {
        int to = mod(r + i, n), from = mod(r - i, n);
        size_t po, pl;
        dshim_part(count, n, from, &po, &pl);
        ops[k] = dshim_xf_send(to, rb + mo * es, ml * es);
        ops[k].dep = fold;
        ops[k + 1] = dshim_xf_recv(from, rb + po * es, pl * es);
        k += 2;
    }
    return xfer_and_free(comm, sig, ops, k, ops_stack);
}

dshim_status_t dshim_allreduce_ring(dshim_comm_t *comm, const dshim_coll_sig_t *sig, const void *sbuf, void *rbuf,
                                    size_t count)
{
    int n = comm->size, r = comm->rank;
    size_t es = dshim_dtype_size((dshim_dtype_t)sig->dtype);
    int right = mod(r + 1, n), left = mod(r - 1, n);
    int steps = n - 1;
    dshim_xfer_op_t ops_stack[AR_STACK_OPS];
    dshim_xfer_op_t *ops = alloc_ops(ops_stack, n);
    if (!ops) {
        return DSHIM_ERR_NOMEM;
    }
    const char *sb = sbuf;
    char *rb = rbuf;
    /* ops layout: [send0, recv0, send1, recv1, ...] over RS then AG steps */
    int k = 0;
    dshim_xfer_op_t *prev_recv = NULL;
    for (int s = 0; s < steps; s++) {
        size_t so, sl, ro, rl;
        dshim_part(count, n, mod(r - s, n), &so, &sl);
        dshim_part(count, n, mod(r - s - 1, n), &ro, &rl);
        ops[k] = dshim_xf_send(right, (s == 0 ? sb : rb) + so * es, sl * es);
        ops[k].dep = prev_recv;
        ops[k + 1] = dshim_xf_recv_reduce(left, rb + ro * es, sb + ro * es, rl * es, 1);
        ops[k + 1].avg_div = (s == steps - 1) && sig->redop == DSHIM_AVG;
        prev_recv = &ops[k + 1];
        k += 2;
    }
    for (int s = 0; s < steps; s++) {
        size_t so, sl, ro, rl;
        dshim_part(count, n, mod(r + 1 - s, n), &so, &sl);
        dshim_part(count, n, mod(r - s, n), &ro, &rl);
        ops[k] = dshim_xf_send(right, rb + so * es, sl * es);
        ops[k].dep = prev_recv;
        ops[k + 1] = dshim_xf_recv(left, rb + ro * es, rl * es);
        prev_recv = &ops[k + 1];
        k += 2;
    }
    return xfer_and_free(comm, sig, ops, k, ops_stack);
}

dshim_status_t dshim_coll_allreduce(dshim_comm_t *comm, dshim_request_t *req)
{
    size_t es = dshim_dtype_size(req->dtype);
    size_t bytes = req->count * es;
    switch (dshim_allreduce_choice(comm, req)) {
    case DSHIM_AR_NONE:
        if (req->count && req->sbuf != req->rbuf) {
            memcpy(req->rbuf, req->sbuf, bytes);
        }
        return DSHIM_OK;
    case DSHIM_AR_HIER:
        return dshim_allreduce_hier(comm, req);
    case DSHIM_AR_RD:
        if (req->sbuf != req->rbuf) {
            memcpy(req->rbuf, req->sbuf, bytes);
        }
        return dshim_allreduce_rd(comm, &req->sig, req->rbuf, req->count);
    case DSHIM_AR_DIRECT:
        return dshim_allreduce_direct(comm, &req->sig, req->sbuf, req->rbuf, req->count);
    case DSHIM_AR_RABENSEIFNER:
        if (req->sbuf != req->rbuf) {
            memcpy(req->rbuf, req->sbuf, bytes);
        }
        return dshim_allreduce_rabenseifner(comm, &req->sig, req->rbuf, req->count);
    case DSHIM_AR_GATE:
        return dshim_allreduce_gate(comm, &req->sig, req->sbuf, req->rbuf, req->count);
    case DSHIM_AR_GATE_SPLIT:
        return dshim_allreduce_gate_split(comm, &req->sig, req->sbuf, req->rbuf, req->count);
    case DSHIM_AR_SINGLE_COPY: {
        dshim_status_t st = dshim_allreduce_single_copy(comm, &req->sig, req->sbuf, req->rbuf, req->count);
        if (st != DSHIM_ERR_UNSUPPORTED) {
            return st;
        }
        /* the probe found a rank that cannot read the others: messages */
        return dshim_coll_allreduce(comm, req);
    }
    case DSHIM_AR_RING:
        break;
    }
    return dshim_allreduce_ring(comm, &req->sig, req->sbuf, req->rbuf, req->count);
}

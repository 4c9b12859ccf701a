/* Execution of a round's ready names, in the ready list's order (the same on
 * every rank), on the engine's private communicator.
 *
 * Allreduce as Horovod's CPU path does it (gloo_operations.cc): copy into
 * the output (or the fusion buffer when several allreduces of the same
 * dtype, op and factors are ready together), multiply by the prescale
 * factor, reduce (AVG as SUM), multiply by the postscale factor (divided by
 * the size for AVG), copy out.  Scaling follows Horovod's ScaleBuffer:
 * output = factor * input with the factor a double for integers (the
 * product truncated, so an integer AVG rounds toward zero) and a float for
 * float16 and float32.  A joined rank that did not submit the name
 * contributes zeros of the negotiated shape. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "named.h"
#include "reduce/reduce.h"
#include "status.h"

/* double -> integer as x86's cvttsd2si does (what Horovod's C++ conversion
 * compiles to): truncation, and the "integer indefinite" value out of
 * range, instead of C's undefined behaviour */
static int32_t to_i32(double v)
{
    return (v > -2147483649.0 && v < 2147483648.0) ? (int32_t)v : INT32_MIN;
}

static int64_t to_i64(double v)
{
    return (v >= -9223372036854775808.0 && v < 9223372036854775808.0) ? (int64_t)v : INT64_MIN;
}

static uint64_t to_u64(double v)
{
    if (v >= 0 && v < 18446744073709551616.0) {
        return (uint64_t)v;
    }
    return (uint64_t)to_i64(v);
}

static void scale_buf(void *buf, size_t n, dshim_dtype_t dt, double factor)
{
    float f = (float)factor;
    switch (dt) {
    case DSHIM_INT8: {
        int8_t *p = buf;
        for (size_t i = 0; i < n; i++) p[i] = (int8_t)to_i32(factor * p[i]);
        break;
    }
    case DSHIM_UINT8: {
        uint8_t *p = buf;
        for (size_t i = 0; i < n; i++) p[i] = (uint8_t)to_i32(factor * p[i]);
        break;
    }
    case DSHIM_INT32: {
        int32_t *p = buf;
        for (size_t i = 0; i < n; i++) p[i] = to_i32(factor * p[i]);
        break;
    }
    case DSHIM_UINT32: {
        uint32_t *p = buf;
        for (size_t i = 0; i < n; i++) p[i] = (uint32_t)to_i64(factor * p[i]);
        break;
    }
    case DSHIM_INT64: {
        int64_t *p = buf;
        for (size_t i = 0; i < n; i++) p[i] = to_i64(factor * (double)p[i]);
        break;
    }
    case DSHIM_UINT64: {
        uint64_t *p = buf;
        for (size_t i = 0; i < n; i++) p[i] = to_u64(factor * (double)p[i]);
        break;
    }
    case DSHIM_FLOAT16: {
        unsigned short *p = buf;
        for (size_t i = 0; i < n; i++) p[i] = dshim_float_to_half(f * dshim_half_to_float(p[i]));
        break;
    }
    case DSHIM_BFLOAT16: {
        unsigned short *p = buf;
        for (size_t i = 0; i < n; i++) p[i] = dshim_float_to_bf16(f * dshim_bf16_to_float(p[i]));
        break;
    }
    case DSHIM_FLOAT32: {
        float *p = buf;
        for (size_t i = 0; i < n; i++) p[i] = f * p[i];
        break;
    }
    case DSHIM_FLOAT64: {
        double *p = buf;
        for (size_t i = 0; i < n; i++) p[i] = factor * p[i];
        break;
    }
    case DSHIM_FLOAT8_E4M3: {
        unsigned char *p = buf;
        for (size_t i = 0; i < n; i++) p[i] = dshim_float_to_fp8e4m3(f * dshim_fp8e4m3_to_float(p[i]));
        break;
    }
    case DSHIM_FLOAT8_E5M2: {
        unsigned char *p = buf;
        for (size_t i = 0; i < n; i++) p[i] = dshim_float_to_fp8e5m2(f * dshim_fp8e5m2_to_float(p[i]));
        break;
    }
    default:
        break;
    }
}

static const dshim_named_req_t *req0(const dshim_named_t *eng, const dshim_named_entry_t *e)
{
    for (int r = 0; r < eng->size; r++) {
        if (e->reqs[r]) {
            return e->reqs[r];
        }
    }
    return NULL;
}

/* Before the collective(s) of one operation (or fused group): the flight
 * recorder's label names the tensor; the count serves tests and logs. */
static void label(dshim_named_t *eng, const char *kind, const dshim_named_entry_t *e, size_t fused)
{
    __atomic_add_fetch(&eng->ncolls, 1, __ATOMIC_RELAXED);
    char l[96];
    if (fused > 1) {
        snprintf(l, sizeof(l), "hvd %s %s (+%zu fused)", kind, e->name, fused - 1);
    } else {
        snprintf(l, sizeof(l), "hvd %s %s", kind, e->name);
    }
    dshim_trace_label(l);
}

/* A local failure before a collective the other ranks are about to enter:
 * tell them at once rather than let them wait for the timeout. */
static dshim_status_t local_failure(dshim_named_t *eng, const char *what, const dshim_named_entry_t *e)
{
    char msg[512];
    snprintf(msg, sizeof(msg), "rank %d: %s '%s': out of memory", eng->rank, what, e->name);
    dshim_comm_abort(eng->comm, msg);
    return dshim_error(DSHIM_ERR_NOMEM, "%s", msg);
}

static void tl_begin(dshim_named_t *eng, dshim_named_entry_t *e)
{
    const dshim_named_req_t *q = req0(eng, e);
    dshim_named_tl_event(eng, e->name, 'B', dshim_named_kind_upper((dshim_named_kind_t)q->kind), NULL);
}

/* An entry done: drop it from the table and complete this rank's op. */
static void finish(dshim_named_t *eng, dshim_named_entry_t *e, dshim_status_t st, const char *msg)
{
    if (__atomic_load_n(&eng->tl.on, __ATOMIC_RELAXED)) {
        const dshim_named_req_t *q = req0(eng, e);
        int64_t shape[DSHIM_NAMED_MAX_DIMS];
        memcpy(shape, q->shape, sizeof(shape));
        if (e->mine && e->mine->result && q->ndim > 0) {
            shape[0] = e->mine->result_dim0; /* the output's first dimension */
        }
        dshim_named_tl_end(eng, e->name, (dshim_dtype_t)q->dtype, q->ndim, shape);
    }
    dshim_named_op_t *mine = e->mine;
    e->mine = NULL;
    dshim_named_entry_drop(eng, e);
    if (mine) {
        dshim_named_complete(eng, mine, st, msg);
    }
}

static int fusible(const dshim_named_req_t *a, const dshim_named_req_t *b)
{
    return b->kind == DSHIM_NAMED_ALLREDUCE && a->dtype == b->dtype && a->op == b->op &&
           a->prescale == b->prescale && a->postscale == b->postscale && (a->device < 0) == (b->device < 0);
}

static dshim_status_t exec_allreduce(dshim_named_t *eng, dshim_named_entry_t **es, size_t n)
{
    const dshim_named_req_t *q = req0(eng, es[0]);
    dshim_dtype_t dt = (dshim_dtype_t)q->dtype;
    size_t esz = dshim_dtype_size(dt);
    dshim_redop_t op = (dshim_redop_t)q->op;
    double post = q->postscale;
    if (op == DSHIM_AVG) {
        op = DSHIM_SUM;
        post /= eng->size; /* Horovod: averaging happens via postscale_factor */
    }
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        const dshim_named_req_t *qi = req0(eng, es[i]);
        total += (size_t)dshim_named_elems(qi->ndim, qi->shape, 0);
    }
    void *buf;
    void *owned = NULL;
    if (n == 1) {
        dshim_named_op_t *mine = es[0]->mine;
        if (mine) {
            buf = mine->recvbuf;
            if (buf != mine->sendbuf && total) {
                memcpy(buf, mine->sendbuf, total * esz);
            }
        } else {
            buf = owned = calloc(total ? total : 1, esz); /* a joined rank's zeros */
            if (!owned) {
                return local_failure(eng, "allreduce", es[0]);
            }
        }
    } else {
        if (total * esz > eng->fusion_cap || !eng->fusion) {
            free(eng->fusion);
            eng->fusion_cap = 0;
            eng->fusion = malloc(total * esz > 0 ? total * esz : 1);
            if (!eng->fusion) {
                return local_failure(eng, "allreduce", es[0]);
            }
            eng->fusion_cap = total * esz;
        }
        buf = eng->fusion;
        size_t at = 0;
        for (size_t i = 0; i < n; i++) {
            const dshim_named_req_t *qi = req0(eng, es[i]);
            size_t bytes = (size_t)dshim_named_elems(qi->ndim, qi->shape, 0) * esz;
            if (es[i]->mine) {
                if (bytes) {
                    memcpy((char *)buf + at, es[i]->mine->sendbuf, bytes);
                }
            } else if (bytes) {
                memset((char *)buf + at, 0, bytes); /* a joined rank's zeros */
            }
            at += bytes;
        }
    }
    if (q->prescale != 1.0) {
        scale_buf(buf, total, dt, q->prescale);
    }
    label(eng, "allreduce", es[0], n);
    dshim_status_t st = dshim_allreduce(eng->comm, buf, buf, total, dt, op);
    if (st != DSHIM_OK) {
        free(owned);
        return st;
    }
    if (post != 1.0) {
        scale_buf(buf, total, dt, post);
    }
    if (n > 1) {
        size_t at = 0;
        for (size_t i = 0; i < n; i++) {
            const dshim_named_req_t *qi = req0(eng, es[i]);
            size_t bytes = (size_t)dshim_named_elems(qi->ndim, qi->shape, 0) * esz;
            if (es[i]->mine && bytes) {
                memcpy(es[i]->mine->recvbuf, (char *)buf + at, bytes);
            }
            at += bytes;
        }
    }
    free(owned);
    for (size_t i = 0; i < n; i++) {
        finish(eng, es[i], DSHIM_OK, NULL);
    }
    return DSHIM_OK;
}

/* 1 when every rank's input came with its request (a small allreduce):
 * the same answer on every rank, from the same table */
static int carried(const dshim_named_t *eng, const dshim_named_entry_t *e)
{
    const dshim_named_req_t *q = req0(eng, e);
    size_t bytes = (size_t)dshim_named_elems(q->ndim, q->shape, 0) * dshim_dtype_size((dshim_dtype_t)q->dtype);
    if (q->kind != DSHIM_NAMED_ALLREDUCE || bytes == 0 || bytes > DSHIM_NAMED_INLINE) {
        return 0;
    }
    for (int r = 0; r < eng->size; r++) {
        if (e->reqs[r] && e->reqs[r]->data_len != bytes) {
            return 0;
        }
    }
    return 1;
}

/* A small allreduce whose inputs the round carried: every rank reduces them
 * itself, in rank order (the order the host gate reduces in), through the
 * CPU backend: bit-identical on every rank, no collective. */
static dshim_status_t exec_carried(dshim_named_t *eng, dshim_named_entry_t *e)
{
    const dshim_named_req_t *q = req0(eng, e);
    const dshim_reduce_ops_t *ops = eng->reduce_ops;
    dshim_dtype_t dt = (dshim_dtype_t)q->dtype;
    size_t count = (size_t)dshim_named_elems(q->ndim, q->shape, 0);
    size_t bytes = count * dshim_dtype_size(dt);
    dshim_redop_t op = (dshim_redop_t)q->op;
    double post = q->postscale;
    if (op == DSHIM_AVG) {
        op = DSHIM_SUM;
        post /= eng->size;
    }
    unsigned char acc[DSHIM_NAMED_INLINE], in[DSHIM_NAMED_INLINE];
    for (int r = 0; r < eng->size; r++) {
        if (e->reqs[r]) {
            memcpy(in, e->reqs[r]->data, bytes);
        } else {
            memset(in, 0, bytes); /* a joined rank's zeros */
        }
        if (q->prescale != 1.0) {
            scale_buf(in, count, dt, q->prescale);
        }
        if (r == 0) {
            memcpy(acc, in, bytes);
        } else {
            ops->reduce(acc, acc, in, count, dt, op, NULL);
        }
    }
    if (post != 1.0) {
        scale_buf(acc, count, dt, post);
    }
    if (e->mine) {
        memcpy(e->mine->recvbuf, acc, bytes);
    }
    finish(eng, e, DSHIM_OK, NULL);
    return DSHIM_OK;
}

static dshim_status_t exec_allgather(dshim_named_t *eng, dshim_named_entry_t *e)
{
    const dshim_named_req_t *q = req0(eng, e);
    dshim_dtype_t dt = (dshim_dtype_t)q->dtype;
    size_t esz = dshim_dtype_size(dt);
    size_t row = (size_t)dshim_named_elems(q->ndim, q->shape, 1);
    size_t *counts = malloc(sizeof(size_t) * 2 * (size_t)eng->size);
    if (!counts) {
        return local_failure(eng, "allgather", e);
    }
    size_t *displs = counts + eng->size;
    size_t total = 0;
    int64_t dim0 = 0;
    for (int r = 0; r < eng->size; r++) {
        counts[r] = (size_t)e->reqs[r]->shape[0] * row;
        displs[r] = total;
        total += counts[r];
        dim0 += e->reqs[r]->shape[0];
    }
    void *out = malloc(total ? total * esz : 1);
    if (!out) {
        free(counts);
        return local_failure(eng, "allgather", e);
    }
    label(eng, "allgather", e, 1);
    dshim_status_t st = dshim_allgatherv(eng->comm, e->mine->sendbuf, out, counts, displs, dt);
    free(counts);
    if (st != DSHIM_OK) {
        free(out);
        return st;
    }
    e->mine->result = out;
    e->mine->result_bytes = total * esz;
    e->mine->result_dim0 = dim0;
    finish(eng, e, DSHIM_OK, NULL);
    return DSHIM_OK;
}

static dshim_status_t exec_broadcast(dshim_named_t *eng, dshim_named_entry_t *e)
{
    const dshim_named_req_t *q = req0(eng, e);
    label(eng, "broadcast", e, 1);
    DSHIM_CHECK(dshim_broadcast(eng->comm, e->mine->recvbuf, (size_t)dshim_named_elems(q->ndim, q->shape, 0),
                                (dshim_dtype_t)q->dtype, q->root));
    finish(eng, e, DSHIM_OK, NULL);
    return DSHIM_OK;
}

static dshim_status_t exec_alltoall(dshim_named_t *eng, dshim_named_entry_t *e)
{
    dshim_named_op_t *mine = e->mine;
    int n = eng->size;
    dshim_dtype_t dt = mine->dtype;
    size_t esz = dshim_dtype_size(dt);
    size_t row = (size_t)dshim_named_elems(mine->ndim, mine->shape, 1);
    int64_t *rsplits = malloc(sizeof(int64_t) * (size_t)n);
    size_t *c = malloc(sizeof(size_t) * 4 * (size_t)n);
    if (!rsplits || !c) {
        free(rsplits);
        free(c);
        return local_failure(eng, "alltoall", e);
    }
    label(eng, "alltoall", e, 1);
    /* every rank learns how many rows each other rank sends it */
    dshim_status_t st = dshim_alltoall(eng->comm, mine->splits, rsplits, 1, DSHIM_INT64);
    void *out = NULL;
    if (st == DSHIM_OK) {
        size_t *sc = c, *sd = c + n, *rc = c + 2 * n, *rd = c + 3 * n;
        size_t sat = 0, rat = 0;
        int64_t dim0 = 0;
        for (int r = 0; r < n; r++) {
            sc[r] = (size_t)mine->splits[r] * row;
            sd[r] = sat;
            sat += sc[r];
            rc[r] = (size_t)rsplits[r] * row;
            rd[r] = rat;
            rat += rc[r];
            dim0 += rsplits[r];
        }
        out = malloc(rat ? rat * esz : 1);
        if (!out) {
            free(rsplits);
            free(c);
            return local_failure(eng, "alltoall", e);
        }
        st = dshim_alltoallv(eng->comm, mine->sendbuf, sc, sd, out, rc, rd, dt);
        mine->result_bytes = rat * esz;
        mine->result_dim0 = dim0;
    }
    free(c);
    if (st != DSHIM_OK) {
        free(out);
        free(rsplits);
        return st;
    }
    mine->result = out;
    mine->recv_splits = rsplits;
    mine->nsplits = n;
    finish(eng, e, DSHIM_OK, NULL);
    return DSHIM_OK;
}

static dshim_status_t exec_reducescatter(dshim_named_t *eng, dshim_named_entry_t *e)
{
    dshim_named_op_t *mine = e->mine;
    int n = eng->size;
    dshim_dtype_t dt = mine->dtype;
    size_t esz = dshim_dtype_size(dt);
    size_t row = (size_t)dshim_named_elems(mine->ndim, mine->shape, 1);
    int64_t dim0 = mine->shape[0];
    size_t count = (size_t)dim0 * row;
    size_t *rc = malloc(sizeof(size_t) * (size_t)n);
    if (!rc) {
        return local_failure(eng, "reducescatter", e);
    }
    /* Horovod's ComputeOutputShapeForRank: the first dim0 % size ranks get
     * one row more */
    for (int r = 0; r < n; r++) {
        rc[r] = (size_t)(dim0 / n + (r < dim0 % n ? 1 : 0)) * row;
    }
    size_t mine_count = rc[eng->rank];
    void *out = malloc(mine_count ? mine_count * esz : 1);
    void *in = (void *)mine->sendbuf;
    void *scaled = NULL;
    if (out && mine->prescale != 1.0) {
        in = scaled = malloc(count ? count * esz : 1);
        if (scaled && count) {
            memcpy(scaled, mine->sendbuf, count * esz);
            scale_buf(scaled, count, dt, mine->prescale);
        }
    }
    if (!out || !in) {
        free(out);
        free(rc);
        return local_failure(eng, "reducescatter", e);
    }
    label(eng, "reducescatter", e, 1);
    dshim_status_t st = dshim_reduce_scatterv(eng->comm, in, out, rc, dt, DSHIM_SUM);
    free(scaled);
    free(rc);
    if (st != DSHIM_OK) {
        free(out);
        return st;
    }
    if (mine->postscale != 1.0) {
        scale_buf(out, mine_count, dt, mine->postscale);
    }
    mine->result = out;
    mine->result_bytes = mine_count * esz;
    mine->result_dim0 = row ? (int64_t)(mine_count / row) : dim0 / n + (eng->rank < dim0 % n ? 1 : 0);
    finish(eng, e, DSHIM_OK, NULL);
    return DSHIM_OK;
}

dshim_status_t dshim_named_execute(dshim_named_t *eng, int *executed)
{
    /* first the verdicts: a name the ranks disagree on fails everywhere
     * and takes no part in fusion */
    size_t keep = 0;
    for (size_t i = 0; i < eng->nready; i++) {
        dshim_named_entry_t *e = eng->ready[i];
        char msg[2048];
        dshim_status_t st = dshim_named_check(eng, e, msg, sizeof(msg));
        if (st != DSHIM_OK) {
            dshim_named_entry_fail(eng, e, st, msg);
            *executed = 1;
        } else {
            eng->ready[keep++] = e;
        }
    }
    eng->nready = keep;
    dshim_status_t st = DSHIM_OK;
    size_t i = 0;
    while (i < eng->nready && st == DSHIM_OK) {
        dshim_named_entry_t *e = eng->ready[i];
        const dshim_named_req_t *q = req0(eng, e);
        *executed = 1;
        tl_begin(eng, e);
        switch ((dshim_named_kind_t)q->kind) {
        case DSHIM_NAMED_ALLREDUCE: {
            if (carried(eng, e)) {
                st = exec_carried(eng, e);
                break;
            }
            size_t esz = dshim_dtype_size((dshim_dtype_t)q->dtype);
            size_t bytes = (size_t)dshim_named_elems(q->ndim, q->shape, 0) * esz;
            size_t j = i + 1;
            while (eng->fusion_bytes > 0 && j < eng->nready) {
                const dshim_named_req_t *qj = req0(eng, eng->ready[j]);
                size_t bj = (size_t)dshim_named_elems(qj->ndim, qj->shape, 0) * esz;
                if (!fusible(q, qj) || bytes + bj > eng->fusion_bytes || carried(eng, eng->ready[j])) {
                    break;
                }
                bytes += bj;
                tl_begin(eng, eng->ready[j]);
                j++;
            }
            st = exec_allreduce(eng, eng->ready + i, j - i);
            i = j;
            continue;
        }
        case DSHIM_NAMED_ALLGATHER:
            st = exec_allgather(eng, e);
            break;
        case DSHIM_NAMED_BROADCAST:
            st = exec_broadcast(eng, e);
            break;
        case DSHIM_NAMED_ALLTOALL:
            st = exec_alltoall(eng, e);
            break;
        case DSHIM_NAMED_REDUCESCATTER:
            st = exec_reducescatter(eng, e);
            break;
        default: /* a barrier: the round in which every rank arrived is the barrier */
            finish(eng, e, DSHIM_OK, NULL);
            break;
        }
        i++;
    }
    /* on a failure what is left on the list is still in the table: the
     * engine's failure fails it there */
    eng->nready = 0;
    dshim_trace_label(NULL);
    return st;
}

/* Agreement of the ranks on a ready name, checked as Horovod's coordinator
 * checks it (controller.cc, ConstructResponse): the same checks in the same
 * order, the first failing one reported in Horovod's words, followed by what
 * each rank sent and the tensor's name:
 *   Mismatched ALLREDUCE tensor shapes: One rank sent a tensor of shape [17],
 *   but another rank sent a tensor of shape [18]. (tensor 'x': rank 0 [17],
 *   rank 1 [18])
 * Every rank computes the same verdict from the same table. */
#include <stdio.h>
#include <string.h>

#include "named.h"

typedef void (*fmt_fn)(const dshim_named_req_t *q, char *out, size_t len);

static void fmt_shape_from(const dshim_named_req_t *q, int from, char *out, size_t len)
{
    size_t at = (size_t)snprintf(out, len, "[");
    for (int i = from; i < q->ndim && at < len; i++) {
        at += (size_t)snprintf(out + at, len - at, "%s%lld", i > from ? ", " : "", (long long)q->shape[i]);
    }
    if (at < len) {
        snprintf(out + at, len - at, "]");
    }
}

static void fmt_shape(const dshim_named_req_t *q, char *out, size_t len)
{
    fmt_shape_from(q, 0, out, len);
}

static void fmt_dtype(const dshim_named_req_t *q, char *out, size_t len)
{
    snprintf(out, len, "%s", dshim_dtype_name((dshim_dtype_t)q->dtype));
}

static void fmt_kind(const dshim_named_req_t *q, char *out, size_t len)
{
    snprintf(out, len, "%s", dshim_named_kind_upper((dshim_named_kind_t)q->kind));
}

static void fmt_scale(const dshim_named_req_t *q, char *out, size_t len)
{
    snprintf(out, len, "(%g, %g)", q->prescale, q->postscale);
}

/* Horovod's ReduceOp numbers (message.h), as its message prints them */
static int hvd_op(int op)
{
    switch (op) {
    case DSHIM_AVG: return 0;
    case DSHIM_SUM: return 1;
    case DSHIM_MIN: return 3;
    case DSHIM_MAX: return 4;
    case DSHIM_PROD: return 5;
    default: return -1;
    }
}

static void fmt_op(const dshim_named_req_t *q, char *out, size_t len)
{
    snprintf(out, len, "%s", dshim_redop_name((dshim_redop_t)q->op));
}

static void fmt_root(const dshim_named_req_t *q, char *out, size_t len)
{
    snprintf(out, len, "root %d", (int)q->root);
}

static void fmt_device(const dshim_named_req_t *q, char *out, size_t len)
{
    if (q->device < 0) {
        snprintf(out, len, "CPU");
    } else {
        snprintf(out, len, "GPU %d", (int)q->device);
    }
}

/* " (tensor 'x': rank 0 [17], ranks 1-2 [18])": consecutive ranks that
 * sent the same value are one group */
static void append_values(const dshim_named_t *eng, const dshim_named_entry_t *e, fmt_fn fmt, char *msg, size_t len)
{
    size_t at = strlen(msg);
    at += (size_t)snprintf(msg + at, len > at ? len - at : 0, " (tensor '%s':", e->name);
    int first = 1;
    for (int r = 0; r < eng->size && at < len; r++) {
        if (!e->reqs[r]) {
            continue;
        }
        char v[160], w[160];
        fmt(e->reqs[r], v, sizeof(v));
        int end = r;
        while (end + 1 < eng->size && e->reqs[end + 1]) {
            fmt(e->reqs[end + 1], w, sizeof(w));
            if (strcmp(v, w) != 0) {
                break;
            }
            end++;
        }
        if (end > r) {
            at += (size_t)snprintf(msg + at, len - at, "%s ranks %d-%d %s", first ? "" : ",", r, end, v);
        } else {
            at += (size_t)snprintf(msg + at, len - at, "%s rank %d %s", first ? "" : ",", r, v);
        }
        first = 0;
        r = end;
    }
    if (at < len) {
        snprintf(msg + at, len - at, ")");
    }
}

static int same_shape(const dshim_named_req_t *a, const dshim_named_req_t *b)
{
    if (a->ndim != b->ndim) {
        return 0;
    }
    for (int i = 0; i < a->ndim; i++) {
        if (a->shape[i] != b->shape[i]) {
            return 0;
        }
    }
    return 1;
}

dshim_status_t dshim_named_check(const dshim_named_t *eng, const dshim_named_entry_t *e, char *msg, size_t len)
{
    const dshim_named_req_t *q0 = NULL, *q;
    msg[0] = 0;
    for (int r = 0; r < eng->size && !q0; r++) {
        q0 = e->reqs[r];
    }
    if (!q0) {
        return DSHIM_OK; /* a join's pseudo-name: nothing to compare */
    }
    dshim_named_kind_t kind = (dshim_named_kind_t)q0->kind;
    const char *K = dshim_named_kind_upper(kind);
    char a[160], b[160];
#define EACH for (int r = 0; r < eng->size; r++) if ((q = e->reqs[r]) != NULL)
#define FAIL(st, fmt_, ...)                                                                                        \
    do {                                                                                                           \
        snprintf(msg, len, fmt_, __VA_ARGS__);                                                                     \
        append_values(eng, e, fmt, msg, len);                                                                      \
        return (st);                                                                                               \
    } while (0)
    fmt_fn fmt = fmt_dtype;
    int typed = kind != DSHIM_NAMED_BARRIER && kind != DSHIM_NAMED_JOIN;
    EACH {
        if (typed && q->kind != DSHIM_NAMED_BARRIER && q->dtype != q0->dtype) {
            FAIL(DSHIM_ERR_MISMATCH, "Mismatched data types: One rank had type %s, but another rank had type %s.",
                 dshim_dtype_name((dshim_dtype_t)q0->dtype), dshim_dtype_name((dshim_dtype_t)q->dtype));
        }
    }
    fmt = fmt_kind;
    EACH {
        if (q->kind != q0->kind) {
            FAIL(DSHIM_ERR_MISMATCH, "Mismatched operations: One rank did an %s, but another rank did an %s.", K,
                 dshim_named_kind_upper((dshim_named_kind_t)q->kind));
        }
    }
    if (kind == DSHIM_NAMED_ALLREDUCE || kind == DSHIM_NAMED_BROADCAST || kind == DSHIM_NAMED_REDUCESCATTER) {
        fmt = fmt_shape;
        EACH {
            if (!same_shape(q0, q)) {
                fmt_shape(q0, a, sizeof(a));
                fmt_shape(q, b, sizeof(b));
                FAIL(DSHIM_ERR_MISMATCH, "Mismatched %s tensor shapes: One rank sent a tensor of shape %s, but another "
                     "rank sent a tensor of shape %s.", K, a, b);
            }
        }
    }
    if (kind == DSHIM_NAMED_ALLREDUCE || kind == DSHIM_NAMED_REDUCESCATTER) {
        fmt = fmt_scale;
        EACH {
            if (q->prescale != q0->prescale || q->postscale != q0->postscale) {
                FAIL(DSHIM_ERR_MISMATCH, "Mismatched prescale and/or postscale factors: One rank sent factors (%g, %g), "
                     "but another rank sent factors (%g, %g).", q0->prescale, q0->postscale, q->prescale, q->postscale);
            }
        }
    }
    if (kind == DSHIM_NAMED_ALLREDUCE) {
        fmt = fmt_op;
        EACH {
            if (q->op != q0->op) {
                FAIL(DSHIM_ERR_MISMATCH, "Mismatched reduction operation: One rank sent reduction op %d, but another "
                     "rank sent reduction op %d.", hvd_op(q0->op), hvd_op(q->op));
            }
        }
    }
    if (kind == DSHIM_NAMED_ALLGATHER || kind == DSHIM_NAMED_ALLTOALL) {
        fmt = fmt_shape;
        if (eng->njoined > 0) {
            if (kind == DSHIM_NAMED_ALLGATHER) {
                FAIL(DSHIM_ERR_UNSUPPORTED, "%s", "Allgather is not supported with Join at this time. Specify "
                     "sparse_to_dense=True if using DistributedOptimizer");
            }
            FAIL(DSHIM_ERR_UNSUPPORTED, "%s", "Alltoall is not supported with Join at this time.");
        }
        if (q0->ndim == 0) {
            FAIL(DSHIM_ERR_INVALID, "Process-set rank zero tried to %s a rank-zero tensor.", K);
        }
        EACH {
            if (q->ndim != q0->ndim) {
                FAIL(DSHIM_ERR_MISMATCH, "Mismatched %s tensor shapes: One rank sent a tensor of rank %d, but another "
                     "rank sent a tensor of rank %d.", K, q0->ndim, q->ndim);
            }
            for (int d = 1; d < q0->ndim; d++) {
                if (q->shape[d] != q0->shape[d]) {
                    FAIL(DSHIM_ERR_MISMATCH, "Mismatched %s tensor shapes: One rank sent a tensor with dimension %d "
                         "equal to %lld, but another rank sent a tensor with dimension %d equal to %lld.", K, d,
                         (long long)q0->shape[d], d, (long long)q->shape[d]);
                }
            }
        }
    }
    if (kind == DSHIM_NAMED_REDUCESCATTER) {
        fmt = fmt_shape;
        if (eng->njoined > 0) {
            FAIL(DSHIM_ERR_UNSUPPORTED, "%s", "Reducescatter is not supported with Join at this time.");
        }
        if (q0->ndim == 0) {
            FAIL(DSHIM_ERR_INVALID, "Process-set rank zero tried to %s a rank-zero tensor.", K);
        }
        /* Horovod scales a reducescatter's input inside its fusion buffer,
         * and refuses one that does not fit there */
        int64_t bytes = dshim_named_elems(q0->ndim, q0->shape, 0) * (int64_t)dshim_dtype_size((dshim_dtype_t)q0->dtype);
        if (q0->prescale != 1.0 && bytes > (int64_t)eng->fusion_bytes) {
            FAIL(DSHIM_ERR_INVALID, "Reducescatter with prescale_factor == %g != 1.0: The fusion buffer is not large "
                 "enough to hold the input tensor (%lld bytes); increase HOROVOD_FUSION_THRESHOLD.", q0->prescale,
                 (long long)bytes);
        }
    }
    if (kind == DSHIM_NAMED_BROADCAST) {
        fmt = fmt_root;
        if (eng->njoined > 0) {
            FAIL(DSHIM_ERR_UNSUPPORTED, "%s", "Broadcast is not supported with Join at this time.");
        }
        EACH {
            if (q->root != q0->root) {
                FAIL(DSHIM_ERR_MISMATCH, "Mismatched %s root ranks: One rank specified root rank %d, but another rank "
                     "specified root rank %d.", K, (int)q0->root, (int)q->root);
            }
        }
    }
    fmt = fmt_device;
    EACH {
        if ((q->device < 0) != (q0->device < 0)) {
            FAIL(DSHIM_ERR_MISMATCH, "Mismatched %s CPU/GPU device selection: One rank specified device %s, but another "
                 "rank specified device %s.", K, q0->device < 0 ? "CPU" : "GPU", q->device < 0 ? "CPU" : "GPU");
        }
    }
#undef EACH
#undef FAIL
    return DSHIM_OK;
}

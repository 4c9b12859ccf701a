/* Public collective entry points: validate arguments in the caller's thread
 * (so misuse is reported where it happens), then queue a request. */
#include <stdlib.h>
#include <string.h>

#include "coll.h"
#include "status.h"

static dshim_status_t check_common(dshim_comm_t *comm, dshim_dtype_t dtype, const char *what)
{
    if (!comm) {
        return dshim_error(DSHIM_ERR_INVALID, "%s: communicator is NULL", what);
    }
    if ((unsigned)dtype >= DSHIM_DTYPE_COUNT) {
        return dshim_error(DSHIM_ERR_INVALID, "rank %d: %s: invalid dtype %d", comm->rank, what, (int)dtype);
    }
    DSHIM_CHECK(dshim_comm_check_owner(comm, what));
    dshim_status_t st = __atomic_load_n(&comm->error, __ATOMIC_ACQUIRE);
    if (st != DSHIM_OK) {
        dshim_error_set_raw(comm->errmsg);
        return st;
    }
    return DSHIM_OK;
}

static dshim_status_t check_op(dshim_comm_t *comm, dshim_dtype_t dtype, dshim_redop_t op, const char *what)
{
    if ((unsigned)op >= DSHIM_REDOP_COUNT) {
        return dshim_error(DSHIM_ERR_INVALID, "rank %d: %s: invalid reduction op %d", comm->rank, what, (int)op);
    }
    if (!comm->reduce->supports(DSHIM_MEM_HOST, dtype, op)) {
        return dshim_error(DSHIM_ERR_UNSUPPORTED, "rank %d: %s: op %s is not supported for %s", comm->rank, what,
                           dshim_redop_name(op), dshim_dtype_name(dtype));
    }
    return DSHIM_OK;
}

static dshim_status_t check_root(dshim_comm_t *comm, int root, const char *what)
{
    if (root < 0 || root >= comm->size) {
        return dshim_error(DSHIM_ERR_INVALID, "rank %d: %s: root %d is outside 0..%d", comm->rank, what, root,
                           comm->size - 1);
    }
    return DSHIM_OK;
}

static dshim_status_t check_buf(dshim_comm_t *comm, const void *buf, size_t count, const char *name, const char *what)
{
    if (count && !buf) {
        return dshim_error(DSHIM_ERR_INVALID, "rank %d: %s: %s is NULL with count %zu", comm->rank, what, name, count);
    }
    if (count > ((size_t)1 << 56)) {
        return dshim_error(DSHIM_ERR_INVALID, "rank %d: %s: count %zu is too large", comm->rank, what, count);
    }
    return DSHIM_OK;
}

/* Runs (blocking) or queues (req_p != NULL) a request built on the stack. */
static dshim_status_t issue(dshim_comm_t *comm, dshim_request_t *tmpl, dshim_request_t **req_p)
{
    if (!req_p) {
        dshim_status_t st = dshim_engine_submit(comm, tmpl, 1);
        free(tmpl->owned);
        return st;
    }
    dshim_request_t *req = malloc(sizeof(*req));
    if (!req) {
        free(tmpl->owned);
        return dshim_error(DSHIM_ERR_NOMEM, "out of memory for a request");
    }
    *req = *tmpl;
    req->heap = 1;
    dshim_status_t st = dshim_engine_submit(comm, req, 0);
    if (st != DSHIM_OK) {
        free(req->owned);
        free(req);
        return st;
    }
    *req_p = req;
    return DSHIM_OK;
}

static void init_req(dshim_request_t *r, dshim_exec_fn_t fn, dshim_coll_kind_t coll, const void *sbuf, void *rbuf,
                     size_t count, dshim_dtype_t dtype, dshim_redop_t op, int root)
{
    memset(r, 0, sizeof(*r));
    r->fn = fn;
    r->sbuf = sbuf;
    r->rbuf = rbuf;
    r->count = count;
    r->dtype = dtype;
    r->op = op;
    r->root = root;
    r->sig.coll = (uint8_t)coll;
    r->sig.dtype = (uint8_t)dtype;
    r->sig.redop = (uint8_t)op;
    r->sig.root = root;
    r->sig.count = count;
}

static dshim_status_t allreduce_(dshim_comm_t *comm, const void *sbuf, void *rbuf, size_t count, dshim_dtype_t dt,
                                 dshim_redop_t op, dshim_request_t **req_p)
{
    DSHIM_CHECK(check_common(comm, dt, "allreduce"));
    DSHIM_CHECK(check_op(comm, dt, op, "allreduce"));
    DSHIM_CHECK(check_buf(comm, sbuf, count, "sendbuf", "allreduce"));
    DSHIM_CHECK(check_buf(comm, rbuf, count, "recvbuf", "allreduce"));
    dshim_request_t r;
    init_req(&r, dshim_coll_allreduce, DSHIM_COLL_ALLREDUCE, sbuf, rbuf, count, dt, op, -1);
    return issue(comm, &r, req_p);
}

DSHIM_EXPORT dshim_status_t dshim_allreduce(dshim_comm_t *c, const void *s, void *r, size_t n, dshim_dtype_t d,
                                            dshim_redop_t o)
{
    return allreduce_(c, s, r, n, d, o, NULL);
}

DSHIM_EXPORT dshim_status_t dshim_iallreduce(dshim_comm_t *c, const void *s, void *r, size_t n, dshim_dtype_t d,
                                             dshim_redop_t o, dshim_request_t **q)
{
    if (!q) {
        return dshim_error(DSHIM_ERR_INVALID, "iallreduce: req_p is NULL");
    }
    return allreduce_(c, s, r, n, d, o, q);
}

static dshim_status_t broadcast_(dshim_comm_t *comm, void *buf, size_t count, dshim_dtype_t dt, int root,
                                 dshim_request_t **req_p)
{
    DSHIM_CHECK(check_common(comm, dt, "broadcast"));
    DSHIM_CHECK(check_root(comm, root, "broadcast"));
    DSHIM_CHECK(check_buf(comm, buf, count, "buf", "broadcast"));
    dshim_request_t r;
    init_req(&r, dshim_coll_broadcast, DSHIM_COLL_BROADCAST, buf, buf, count, dt, DSHIM_SUM, root);
    return issue(comm, &r, req_p);
}

DSHIM_EXPORT dshim_status_t dshim_broadcast(dshim_comm_t *c, void *b, size_t n, dshim_dtype_t d, int root)
{
    return broadcast_(c, b, n, d, root, NULL);
}

DSHIM_EXPORT dshim_status_t dshim_ibroadcast(dshim_comm_t *c, void *b, size_t n, dshim_dtype_t d, int root,
                                             dshim_request_t **q)
{
    if (!q) {
        return dshim_error(DSHIM_ERR_INVALID, "ibroadcast: req_p is NULL");
    }
    return broadcast_(c, b, n, d, root, q);
}

static dshim_status_t reduce_(dshim_comm_t *comm, const void *sbuf, void *rbuf, size_t count, dshim_dtype_t dt,
                              dshim_redop_t op, int root, dshim_request_t **req_p)
{
    DSHIM_CHECK(check_common(comm, dt, "reduce"));
    DSHIM_CHECK(check_op(comm, dt, op, "reduce"));
    DSHIM_CHECK(check_root(comm, root, "reduce"));
    DSHIM_CHECK(check_buf(comm, sbuf, count, "sendbuf", "reduce"));
    if (comm->rank == root) {
        DSHIM_CHECK(check_buf(comm, rbuf, count, "recvbuf", "reduce"));
    }
    dshim_request_t r;
    init_req(&r, dshim_coll_reduce, DSHIM_COLL_REDUCE, sbuf, rbuf, count, dt, op, root);
    return issue(comm, &r, req_p);
}

DSHIM_EXPORT dshim_status_t dshim_reduce(dshim_comm_t *c, const void *s, void *r, size_t n, dshim_dtype_t d,
                                         dshim_redop_t o, int root)
{
    return reduce_(c, s, r, n, d, o, root, NULL);
}

DSHIM_EXPORT dshim_status_t dshim_ireduce(dshim_comm_t *c, const void *s, void *r, size_t n, dshim_dtype_t d,
                                          dshim_redop_t o, int root, dshim_request_t **q)
{
    if (!q) {
        return dshim_error(DSHIM_ERR_INVALID, "ireduce: req_p is NULL");
    }
    return reduce_(c, s, r, n, d, o, root, q);
}

/* The request's own copy of a v-collective's block counts and displacements
 * (the caller's arrays may go before a queued request runs), one allocation:
 * counts[i] (equal_count when counts is NULL), then displs[i] (the blocks one
 * after the other when displs is NULL).  *total_p = the sum of the counts. */
static size_t *own_counts(int n, const size_t *counts, const size_t *displs, size_t equal_count, size_t *total_p)
{
    size_t *owned = malloc(sizeof(size_t) * 2 * (size_t)n);
    if (!owned) {
        dshim_error(DSHIM_ERR_NOMEM, "out of memory");
        return NULL;
    }
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        owned[i] = counts ? counts[i] : equal_count;
        owned[n + i] = displs ? displs[i] : total;
        total += owned[i];
    }
    *total_p = total;
    return owned;
}

static dshim_status_t allgatherv_(dshim_comm_t *comm, const void *sbuf, void *rbuf, const size_t *counts,
                                  const size_t *displs, size_t equal_count, dshim_dtype_t dt, dshim_request_t **req_p)
{
    const char *what = counts ? "allgatherv" : "allgather";
    DSHIM_CHECK(check_common(comm, dt, what));
    int n = comm->size;
    size_t total = 0;
    size_t *owned = own_counts(n, counts, displs, equal_count, &total);
    if (!owned) {
        return DSHIM_ERR_NOMEM;
    }
    if ((counts && !displs) || (total && !rbuf) || (owned[comm->rank] && !sbuf)) {
        free(owned);
        return dshim_error(DSHIM_ERR_INVALID, "rank %d: %s: NULL buffer or displacement array", comm->rank, what);
    }
    dshim_request_t r;
    init_req(&r, dshim_coll_allgatherv, counts ? DSHIM_COLL_ALLGATHERV : DSHIM_COLL_ALLGATHER, sbuf, rbuf, total, dt,
             DSHIM_SUM, -1);
    r.owned = owned;
    r.counts = owned;
    r.displs = owned + n;
    return issue(comm, &r, req_p);
}

DSHIM_EXPORT dshim_status_t dshim_allgather(dshim_comm_t *c, const void *s, void *r, size_t n, dshim_dtype_t d)
{
    return allgatherv_(c, s, r, NULL, NULL, n, d, NULL);
}

DSHIM_EXPORT dshim_status_t dshim_iallgather(dshim_comm_t *c, const void *s, void *r, size_t n, dshim_dtype_t d,
                                             dshim_request_t **q)
{
    if (!q) {
        return dshim_error(DSHIM_ERR_INVALID, "iallgather: req_p is NULL");
    }
    return allgatherv_(c, s, r, NULL, NULL, n, d, q);
}

DSHIM_EXPORT dshim_status_t dshim_allgatherv(dshim_comm_t *c, const void *s, void *r, const size_t *counts,
                                             const size_t *displs, dshim_dtype_t d)
{
    if (!counts) {
        return dshim_error(DSHIM_ERR_INVALID, "allgatherv: counts is NULL");
    }
    return allgatherv_(c, s, r, counts, displs, 0, d, NULL);
}

DSHIM_EXPORT dshim_status_t dshim_iallgatherv(dshim_comm_t *c, const void *s, void *r, const size_t *counts,
                                              const size_t *displs, dshim_dtype_t d, dshim_request_t **q)
{
    if (!counts || !q) {
        return dshim_error(DSHIM_ERR_INVALID, "iallgatherv: counts or req_p is NULL");
    }
    return allgatherv_(c, s, r, counts, displs, 0, d, q);
}

static dshim_status_t reduce_scatter_(dshim_comm_t *comm, const void *sbuf, void *rbuf, size_t count,
                                      dshim_dtype_t dt, dshim_redop_t op, dshim_request_t **req_p)
{
    DSHIM_CHECK(check_common(comm, dt, "reduce_scatter"));
    DSHIM_CHECK(check_op(comm, dt, op, "reduce_scatter"));
    DSHIM_CHECK(check_buf(comm, sbuf, count, "sendbuf", "reduce_scatter"));
    DSHIM_CHECK(check_buf(comm, rbuf, count, "recvbuf", "reduce_scatter"));
    dshim_request_t r;
    init_req(&r, dshim_coll_reduce_scatter, DSHIM_COLL_REDUCE_SCATTER, sbuf, rbuf, count, dt, op, -1);
    return issue(comm, &r, req_p);
}

/* Its count is the sum of the blocks, as in the signature. */
static dshim_status_t reduce_scatterv_(dshim_comm_t *comm, const void *sbuf, void *rbuf, const size_t *counts,
                                       dshim_dtype_t dt, dshim_redop_t op, dshim_request_t **req_p)
{
    DSHIM_CHECK(check_common(comm, dt, "reduce_scatterv"));
    DSHIM_CHECK(check_op(comm, dt, op, "reduce_scatterv"));
    if (!counts) {
        return dshim_error(DSHIM_ERR_INVALID, "rank %d: reduce_scatterv: recvcounts is NULL", comm->rank);
    }
    int n = comm->size;
    size_t total = 0;
    size_t *owned = own_counts(n, counts, NULL, 0, &total);
    if (!owned) {
        return DSHIM_ERR_NOMEM;
    }
    dshim_status_t st = check_buf(comm, sbuf, total, "sendbuf", "reduce_scatterv");
    if (st == DSHIM_OK) {
        st = check_buf(comm, rbuf, counts[comm->rank], "recvbuf", "reduce_scatterv");
    }
    if (st != DSHIM_OK) {
        free(owned);
        return st;
    }
    dshim_request_t r;
    init_req(&r, dshim_coll_reduce_scatter, DSHIM_COLL_REDUCE_SCATTERV, sbuf, rbuf, total, dt, op, -1);
    r.owned = owned;
    r.counts = owned;
    r.displs = owned + n;
    return issue(comm, &r, req_p);
}

DSHIM_EXPORT dshim_status_t dshim_reduce_scatterv(dshim_comm_t *c, const void *s, void *r, const size_t *counts,
                                                  dshim_dtype_t d, dshim_redop_t o)
{
    return reduce_scatterv_(c, s, r, counts, d, o, NULL);
}

DSHIM_EXPORT dshim_status_t dshim_ireduce_scatterv(dshim_comm_t *c, const void *s, void *r, const size_t *counts,
                                                   dshim_dtype_t d, dshim_redop_t o, dshim_request_t **q)
{
    if (!q) {
        return dshim_error(DSHIM_ERR_INVALID, "ireduce_scatterv: req_p is NULL");
    }
    return reduce_scatterv_(c, s, r, counts, d, o, q);
}

DSHIM_EXPORT dshim_status_t dshim_reduce_scatter(dshim_comm_t *c, const void *s, void *r, size_t n, dshim_dtype_t d,
                                                 dshim_redop_t o)
{
    return reduce_scatter_(c, s, r, n, d, o, NULL);
}

DSHIM_EXPORT dshim_status_t dshim_ireduce_scatter(dshim_comm_t *c, const void *s, void *r, size_t n,
                                                  dshim_dtype_t d, dshim_redop_t o, dshim_request_t **q)
{
    if (!q) {
        return dshim_error(DSHIM_ERR_INVALID, "ireduce_scatter: req_p is NULL");
    }
    return reduce_scatter_(c, s, r, n, d, o, q);
}

static dshim_status_t alltoallv_(dshim_comm_t *comm, const void *sbuf, const size_t *sc, const size_t *sd, void *rbuf,
                                 const size_t *rc, const size_t *rd, size_t equal, dshim_dtype_t dt,
                                 dshim_request_t **req_p)
{
    const char *what = sc ? "alltoallv" : "alltoall";
    DSHIM_CHECK(check_common(comm, dt, what));
    int n = comm->size;
    if (sc && (!sd || !rc || !rd)) {
        return dshim_error(DSHIM_ERR_INVALID, "rank %d: %s: NULL count or displacement array", comm->rank, what);
    }
    size_t *owned = malloc(sizeof(size_t) * 4 * (size_t)n);
    if (!owned) {
        return dshim_error(DSHIM_ERR_NOMEM, "out of memory");
    }
    size_t stot = 0, rtot = 0;
    for (int i = 0; i < n; i++) {
        owned[i] = sc ? sc[i] : equal;
        owned[n + i] = sc ? sd[i] : (size_t)i * equal;
        owned[2 * n + i] = sc ? rc[i] : equal;
        owned[3 * n + i] = sc ? rd[i] : (size_t)i * equal;
        stot += owned[i];
        rtot += owned[2 * n + i];
    }
    if ((stot && !sbuf) || (rtot && !rbuf)) {
        free(owned);
        return dshim_error(DSHIM_ERR_INVALID, "rank %d: %s: NULL buffer", comm->rank, what);
    }
    dshim_request_t r;
    init_req(&r, dshim_coll_alltoallv, sc ? DSHIM_COLL_ALLTOALLV : DSHIM_COLL_ALLTOALL, sbuf, rbuf, sc ? 0 : equal,
             dt, DSHIM_SUM, -1);
    r.owned = owned;
    r.scounts = owned;
    r.sdispls = owned + n;
    r.rcounts = owned + 2 * n;
    r.rdispls = owned + 3 * n;
    return issue(comm, &r, req_p);
}

DSHIM_EXPORT dshim_status_t dshim_alltoall(dshim_comm_t *c, const void *s, void *r, size_t n, dshim_dtype_t d)
{
    return alltoallv_(c, s, NULL, NULL, r, NULL, NULL, n, d, NULL);
}

DSHIM_EXPORT dshim_status_t dshim_ialltoall(dshim_comm_t *c, const void *s, void *r, size_t n, dshim_dtype_t d,
                                            dshim_request_t **q)
{
    if (!q) {
        return dshim_error(DSHIM_ERR_INVALID, "ialltoall: req_p is NULL");
    }
    return alltoallv_(c, s, NULL, NULL, r, NULL, NULL, n, d, q);
}

DSHIM_EXPORT dshim_status_t dshim_alltoallv(dshim_comm_t *c, const void *s, const size_t *sc, const size_t *sd,
                                            void *r, const size_t *rc, const size_t *rd, dshim_dtype_t d)
{
    if (!sc) {
        return dshim_error(DSHIM_ERR_INVALID, "alltoallv: sendcounts is NULL");
    }
    return alltoallv_(c, s, sc, sd, r, rc, rd, 0, d, NULL);
}

DSHIM_EXPORT dshim_status_t dshim_ialltoallv(dshim_comm_t *c, const void *s, const size_t *sc, const size_t *sd,
                                             void *r, const size_t *rc, const size_t *rd, dshim_dtype_t d,
                                             dshim_request_t **q)
{
    if (!sc || !q) {
        return dshim_error(DSHIM_ERR_INVALID, "ialltoallv: sendcounts or req_p is NULL");
    }
    return alltoallv_(c, s, sc, sd, r, rc, rd, 0, d, q);
}

static dshim_status_t rooted_(dshim_comm_t *comm, dshim_exec_fn_t fn, dshim_coll_kind_t kind, const void *sbuf,
                              void *rbuf, size_t count, dshim_dtype_t dt, int root, dshim_request_t **req_p)
{
    const char *what = kind == DSHIM_COLL_GATHER ? "gather" : "scatter";
    DSHIM_CHECK(check_common(comm, dt, what));
    DSHIM_CHECK(check_root(comm, root, what));
    int at_root = comm->rank == root;
    size_t big = count * (size_t)comm->size;
    if (kind == DSHIM_COLL_GATHER) {
        DSHIM_CHECK(check_buf(comm, sbuf, count, "sendbuf", what));
        DSHIM_CHECK(check_buf(comm, rbuf, at_root ? big : 0, "recvbuf", what));
    } else {
        DSHIM_CHECK(check_buf(comm, sbuf, at_root ? big : 0, "sendbuf", what));
        DSHIM_CHECK(check_buf(comm, rbuf, count, "recvbuf", what));
    }
    dshim_request_t r;
    init_req(&r, fn, kind, sbuf, rbuf, count, dt, DSHIM_SUM, root);
    return issue(comm, &r, req_p);
}

DSHIM_EXPORT dshim_status_t dshim_gather(dshim_comm_t *c, const void *s, void *r, size_t n, dshim_dtype_t d, int root)
{
    return rooted_(c, dshim_coll_gather, DSHIM_COLL_GATHER, s, r, n, d, root, NULL);
}

DSHIM_EXPORT dshim_status_t dshim_igather(dshim_comm_t *c, const void *s, void *r, size_t n, dshim_dtype_t d,
                                          int root, dshim_request_t **q)
{
    if (!q) {
        return dshim_error(DSHIM_ERR_INVALID, "igather: req_p is NULL");
    }
    return rooted_(c, dshim_coll_gather, DSHIM_COLL_GATHER, s, r, n, d, root, q);
}

DSHIM_EXPORT dshim_status_t dshim_scatter(dshim_comm_t *c, const void *s, void *r, size_t n, dshim_dtype_t d,
                                          int root)
{
    return rooted_(c, dshim_coll_scatter, DSHIM_COLL_SCATTER, s, r, n, d, root, NULL);
}

DSHIM_EXPORT dshim_status_t dshim_iscatter(dshim_comm_t *c, const void *s, void *r, size_t n, dshim_dtype_t d,
                                           int root, dshim_request_t **q)
{
    if (!q) {
        return dshim_error(DSHIM_ERR_INVALID, "iscatter: req_p is NULL");
    }
    return rooted_(c, dshim_coll_scatter, DSHIM_COLL_SCATTER, s, r, n, d, root, q);
}

static dshim_status_t p2p_(dshim_comm_t *comm, int sending, const void *sbuf, void *rbuf, size_t count,
                           dshim_dtype_t dt, int peer, int *source_p, dshim_request_t **req_p)
{
    const char *what = sending ? "send" : "recv";
    DSHIM_CHECK(check_common(comm, dt, what));
    /* a receive from any source is bound to a sender while it runs (xfer.c) */
    int any_source = !sending && peer == DSHIM_ANY_SOURCE;
    if (any_source && comm->size < 2) {
        return dshim_error(DSHIM_ERR_INVALID, "rank %d: recv from any source on a communicator of 1 rank: no other "
                                              "rank could ever send", comm->rank);
    }
    if (!any_source && (peer < 0 || peer >= comm->size || peer == comm->rank)) {
        return dshim_error(DSHIM_ERR_INVALID, "rank %d: %s: peer %d must be another rank in 0..%d", comm->rank, what,
                           peer, comm->size - 1);
    }
    DSHIM_CHECK(check_buf(comm, sending ? sbuf : rbuf, count, "buf", what));
    dshim_request_t r;
    /* no exec function: the engine batches point-to-point requests itself */
    init_req(&r, NULL, DSHIM_COLL_P2P, sbuf, rbuf, count, dt, DSHIM_SUM, peer);
    r.sig.root = -1;
    r.sending = sending;
    r.source = sending ? -1 : peer;
    r.source_p = source_p;
    if (source_p) {
        *source_p = r.source;
    }
    return issue(comm, &r, req_p);
}

DSHIM_EXPORT dshim_status_t dshim_send(dshim_comm_t *c, const void *b, size_t n, dshim_dtype_t d, int peer)
{
    return p2p_(c, 1, b, NULL, n, d, peer, NULL, NULL);
}

DSHIM_EXPORT dshim_status_t dshim_isend(dshim_comm_t *c, const void *b, size_t n, dshim_dtype_t d, int peer,
                                        dshim_request_t **q)
{
    if (!q) {
        return dshim_error(DSHIM_ERR_INVALID, "isend: req_p is NULL");
    }
    return p2p_(c, 1, b, NULL, n, d, peer, NULL, q);
}

DSHIM_EXPORT dshim_status_t dshim_recv(dshim_comm_t *c, void *b, size_t n, dshim_dtype_t d, int peer)
{
    return p2p_(c, 0, NULL, b, n, d, peer, NULL, NULL);
}

DSHIM_EXPORT dshim_status_t dshim_irecv(dshim_comm_t *c, void *b, size_t n, dshim_dtype_t d, int peer,
                                        dshim_request_t **q)
{
    if (!q) {
        return dshim_error(DSHIM_ERR_INVALID, "irecv: req_p is NULL");
    }
    return p2p_(c, 0, NULL, b, n, d, peer, NULL, q);
}

DSHIM_EXPORT dshim_status_t dshim_recv_any(dshim_comm_t *c, void *b, size_t n, dshim_dtype_t d, int *source_p)
{
    return p2p_(c, 0, NULL, b, n, d, DSHIM_ANY_SOURCE, source_p, NULL);
}

DSHIM_EXPORT dshim_status_t dshim_irecv_any(dshim_comm_t *c, void *b, size_t n, dshim_dtype_t d, int *source_p,
                                            dshim_request_t **q)
{
    if (!q) {
        return dshim_error(DSHIM_ERR_INVALID, "irecv_any: req_p is NULL");
    }
    return p2p_(c, 0, NULL, b, n, d, DSHIM_ANY_SOURCE, source_p, q);
}

static dshim_status_t barrier_(dshim_comm_t *comm, dshim_request_t **req_p)
{
    DSHIM_CHECK(check_common(comm, DSHIM_UINT64, "barrier"));
    dshim_request_t r;
    init_req(&r, dshim_coll_barrier, DSHIM_COLL_BARRIER, NULL, NULL, 1, DSHIM_UINT64, DSHIM_MAX, -1);
    return issue(comm, &r, req_p);
}

DSHIM_EXPORT dshim_status_t dshim_barrier(dshim_comm_t *c)
{
    return barrier_(c, NULL);
}

DSHIM_EXPORT dshim_status_t dshim_ibarrier(dshim_comm_t *c, dshim_request_t **q)
{
    if (!q) {
        return dshim_error(DSHIM_ERR_INVALID, "ibarrier: req_p is NULL");
    }
    return barrier_(c, q);
}

const char *dshim_algo_name(const dshim_comm_t *comm, const dshim_request_t *req)
{
    size_t bytes = req->count * dshim_dtype_size(req->dtype);
    switch (req->sig.coll) {
    case DSHIM_COLL_ALLREDUCE:
        switch (dshim_allreduce_choice(comm, req)) {
        case DSHIM_AR_NONE:
            return "local";
        case DSHIM_AR_HIER:
            return "hier";
        case DSHIM_AR_RD:
            return "rd";
        case DSHIM_AR_RING:
            return "ring";
        case DSHIM_AR_DIRECT:
            return "direct";
        case DSHIM_AR_RABENSEIFNER:
            return "rabenseifner";
        case DSHIM_AR_GATE:
            return "shm-gate";
        case DSHIM_AR_GATE_SPLIT:
            return "shm-gate-split";
        case DSHIM_AR_SINGLE_COPY:
            return "cma";
        }
        return NULL;
    case DSHIM_COLL_BROADCAST:
        return dshim_bcast_uses_tree(comm, bytes) ? "tree" : "chain";
    case DSHIM_COLL_REDUCE:
        return "chain";
    case DSHIM_COLL_ALLGATHER:
    case DSHIM_COLL_ALLGATHERV:
        return dshim_allgather_gate_fits(comm, bytes) ? "shm-gate" : "ring";
    case DSHIM_COLL_REDUCE_SCATTER:
    case DSHIM_COLL_REDUCE_SCATTERV:
        return "ring";
    case DSHIM_COLL_ALLTOALL:
    case DSHIM_COLL_ALLTOALLV:
    case DSHIM_COLL_GATHER:
    case DSHIM_COLL_SCATTER:
        return "direct";
    case DSHIM_COLL_BARRIER:
        return comm->gate_transport >= 0 ? "shm-gate" : comm->barrier_hier ? "hier" : "dissemination";
    }
    return NULL;
}

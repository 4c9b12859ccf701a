/* The data engine (see xfer.h). */
#include <errno.h>
#include <inttypes.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "engine.h"
#include "host_gate.h"
#include "net.h"
#include "status.h"
#include "wait.h"
#include "xfer.h"
#include "xfer_impl.h"

static const unsigned char zeros[8];

const char *dshim_coll_name(int coll)
{
    static const char *names[] = {"?", "allreduce", "broadcast", "reduce", "allgather", "allgatherv",
                                  "reduce_scatter", "alltoall", "alltoallv", "gather", "scatter",
                                  "send/recv", "barrier", "internal", "reduce_scatterv"};
    if (coll < 0 || coll > DSHIM_COLL_REDUCE_SCATTERV) {
        return "unknown-collective";
    }
    return names[coll];
}

static void describe_call(char *out, size_t len, int coll, int dtype, int redop, int root, uint64_t count,
                          uint64_t seq)
{
    int n = snprintf(out, len, "%s #%" PRIu64 " (%" PRIu64 " x %s", dshim_coll_name(coll), seq, count,
                     dshim_dtype_name((dshim_dtype_t)dtype));
    if (coll == DSHIM_COLL_ALLREDUCE || coll == DSHIM_COLL_REDUCE || coll == DSHIM_COLL_REDUCE_SCATTER ||
        coll == DSHIM_COLL_REDUCE_SCATTERV) {
        n += snprintf(out + n, len - (size_t)n, ", %s", dshim_redop_name((dshim_redop_t)redop));
    }
    if (coll == DSHIM_COLL_BROADCAST || coll == DSHIM_COLL_REDUCE || coll == DSHIM_COLL_GATHER ||
        coll == DSHIM_COLL_SCATTER) {
        n += snprintf(out + n, len - (size_t)n, ", root %d", root);
    }
    snprintf(out + n, len - (size_t)n, ")");
}

static void fill_hdr(unsigned char *buf, const dshim_coll_sig_t *sig, size_t nbytes)
{
    wire_hdr_t h;
    memset(&h, 0, sizeof(h));
    h.magic = WIRE_MAGIC;
    h.version = WIRE_VERSION;
    h.coll = sig->coll;
    h.dtype = sig->dtype;
    h.redop = sig->redop;
    h.root = sig->root;
    h.count = sig->count;
    h.seq = sig->seq;
    h.nbytes = nbytes;
    memcpy(buf, &h, sizeof(h));
}

/* The one wording of two ranks' calls that differ. */
static dshim_status_t mismatch_error(const char *mine, const char *peer, const char *theirs)
{
    return dshim_error_quiet(DSHIM_ERR_MISMATCH,
                             "mismatched collectives: this rank called %s but %s called %s; every rank must issue "
                             "the same collectives in the same order with the same count, dtype, op and root",
                             mine, peer, theirs);
}

static dshim_status_t check_hdr(dshim_comm_t *comm, const dshim_coll_sig_t *sig, dshim_xfer_op_t *op)
{
    wire_hdr_t h;
    memcpy(&h, op->hdr, sizeof(h));
    int garbage = h.magic != WIRE_MAGIC || h.version != WIRE_VERSION;
    int p2p_size = sig->coll == DSHIM_COLL_P2P && h.coll == DSHIM_COLL_P2P && h.seq == sig->seq &&
                   (h.nbytes != op->len || (comm->check_sig && (h.dtype != sig->dtype || h.count != sig->count)));
    int differs = h.coll != sig->coll || h.seq != sig->seq;
    if (comm->check_sig) {
        differs |= h.dtype != sig->dtype || h.redop != sig->redop || h.root != sig->root || h.count != sig->count;
    }
    if (!garbage && !p2p_size && !differs && h.nbytes == op->len) {
        return DSHIM_OK; /* every message: nothing is formatted on this path */
    }
    char peer[160], mine[160], theirs[160];
    dshim_comm_describe_peer(comm, op->peer, peer, sizeof(peer));
    if (garbage) {
        return dshim_error_quiet(DSHIM_ERR_PROTOCOL,
                                 "%s sent bytes that are not a dshim message (magic 0x%08x version %u): garbage on "
                                 "the connection or two dshim versions in one job",
                                 peer, h.magic, h.version);
    }
    describe_call(mine, sizeof(mine), sig->coll, sig->dtype, sig->redop, sig->root, sig->count, sig->seq);
    describe_call(theirs, sizeof(theirs), h.coll, h.dtype, h.redop, h.root, h.count, h.seq);
    if (p2p_size) {
        return dshim_error_quiet(DSHIM_ERR_MISMATCH,
                                 "mismatched sizes in %s: %s sent %" PRIu64 " x %s (%" PRIu64 " bytes) where this "
                                 "rank's receive expects %" PRIu64 " x %s (%zu bytes); a receive must post the count "
                                 "and dtype that were sent",
                                 mine, peer, h.count, dshim_dtype_name((dshim_dtype_t)h.dtype), h.nbytes, sig->count,
                                 dshim_dtype_name((dshim_dtype_t)sig->dtype), op->len);
    }
    if (differs) {
        return mismatch_error(mine, peer, theirs);
    }
    return dshim_error_quiet(DSHIM_ERR_MISMATCH,
                             "mismatched sizes in %s: %s sent %" PRIu64 " bytes where this rank expected %zu "
                             "(different counts across ranks?)",
                             mine, peer, h.nbytes, op->len);
}

static size_t pad_of(size_t len)
{
    return (8 - (len & 7)) & 7;
}

/* The data a receive's destination belongs to, for the transport's
 * recv_stream: the message, or the collective it is a piece of (a ring step
 * carries 1/N of an allreduce's buffer), whichever is larger.  When that is
 * too large for the cache to keep, a transport may copy out with streaming
 * stores. */
static size_t receive_span(const dshim_coll_sig_t *sig, const dshim_xfer_op_t *op, size_t esize)
{
    size_t whole = sig->count <= SIZE_MAX / esize ? (size_t)sig->count * esize : SIZE_MAX;
    return op->len > whole ? op->len : whole;
}

/* PH_HDR: moves the header, and with it (transports that can) the first
 * payload bytes; checks a received header once it is whole. */
static dshim_status_t progress_header(dshim_comm_t *comm, dshim_conn_t *c, const dshim_coll_sig_t *sig,
                                      dshim_xfer_op_t *op, int *moved)
{
    size_t n = 0;
    size_t hleft = HDR_BYTES - op->hoff;
    /* the payload bytes that may move together with the header (TCP:
     * one system call and one segment instead of two of each) */
    size_t body = 0;
    if (op->kind != DSHIM_XF_RECV_REDUCE) {
        body = limit_of(op);
        body = body < comm->chunk_bytes ? body : comm->chunk_bytes;
    }
    if (op->kind == DSHIM_XF_SEND) {
        if (op->hoff == 0) {
            fill_hdr(op->hdr, sig, op->len);
        }
        if (body && c->ops->send2) {
            DSHIM_CHECK(c->ops->send2(c, op->hdr + op->hoff, hleft, op->sbuf, body, &n));
        } else {
            DSHIM_CHECK(c->ops->send(c, op->hdr + op->hoff, hleft, &n));
        }
    } else if (body && c->ops->recv2) {
        /* payload bytes land in rbuf before the header is checked: if
         * the check fails, the collective fails and rbuf is undefined
         * anyway, as after any failed call */
        DSHIM_CHECK(c->ops->recv2(c, op->hdr + op->hoff, hleft, op->rbuf, body, &n));
    } else if (op->kind == DSHIM_XF_RECV_REDUCE && c->ops->recv_ahead) {
        /* the payload will be peeked: the transport may read it ahead
         * together with the header */
        DSHIM_CHECK(c->ops->recv_ahead(c, op->hdr + op->hoff, hleft, &n));
    } else {
        DSHIM_CHECK(c->ops->recv(c, op->hdr + op->hoff, hleft, &n));
    }
    if (n > hleft) {
        op->done += n - hleft;
        n = hleft;
    }
    op->hoff += n;
    if (n) {
        *moved = 1;
    }
    if (op->hoff < HDR_BYTES) {
        return DSHIM_OK;
    }
    if (op->kind != DSHIM_XF_SEND) {
        DSHIM_CHECK(check_hdr(comm, sig, op));
    }
    op->phase = PH_BODY;
    op->hoff = 0;
    return DSHIM_OK;
}

/* A reducing receive's chunk: the peer's bytes read in place (peek), at most
 * `want` of them in whole elements, reduced with op->local into op->rbuf and
 * consumed; *n_p = how many. */
static dshim_status_t reduce_incoming(dshim_comm_t *comm, dshim_conn_t *c, const dshim_coll_sig_t *sig,
                                      dshim_xfer_op_t *op, size_t esize, size_t want, size_t *n_p)
{
    const void *ptr;
    size_t avail;
    DSHIM_CHECK(c->ops->peek(c, &ptr, &avail));
    size_t n = avail < want ? avail : want;
    n -= n % esize;
    *n_p = n;
    if (n) {
        char *dst = (char *)op->rbuf + op->done;
        const char *loc = (const char *)op->local + op->done;
        size_t cnt = n / esize;
        dshim_dtype_t dt = (dshim_dtype_t)sig->dtype;
        dshim_redop_t ro = (dshim_redop_t)sig->redop;
        if (ro == DSHIM_AVG) {
            ro = DSHIM_SUM;
        }
        dshim_status_t st = op->incoming_first ? comm->reduce->reduce(dst, ptr, loc, cnt, dt, ro, NULL)
                                               : comm->reduce->reduce(dst, loc, ptr, cnt, dt, ro, NULL);
        if (st == DSHIM_OK && op->avg_div) {
            st = comm->reduce->scale_div(dst, cnt, dt, comm->size, NULL);
        }
        DSHIM_CHECK(st);
        DSHIM_CHECK(c->ops->consume(c, n));
    }
    return DSHIM_OK;
}

/* PH_BODY: moves the payload up to what the dependencies allow. */
static dshim_status_t progress_body(dshim_comm_t *comm, dshim_conn_t *c, const dshim_coll_sig_t *sig,
                                    dshim_xfer_op_t *op, size_t esize, int *moved)
{
    size_t lim = limit_of(op);
    while (op->done < lim) {
        /* move at most one chunk per call so the peer can work on the
         * previous chunk while we produce the next (pipelining) */
        size_t piece_end = op->done + comm->chunk_bytes < lim ? op->done + comm->chunk_bytes : lim;
        size_t n = 0;
        if (op->kind == DSHIM_XF_SEND) {
            DSHIM_CHECK(c->ops->send(c, (const char *)op->sbuf + op->done, piece_end - op->done, &n));
        } else if (op->kind == DSHIM_XF_RECV && c->ops->recv_stream) {
            DSHIM_CHECK(c->ops->recv_stream(c, (char *)op->rbuf + op->done, piece_end - op->done,
                                            receive_span(sig, op, esize), &n));
        } else if (op->kind == DSHIM_XF_RECV) {
            DSHIM_CHECK(c->ops->recv(c, (char *)op->rbuf + op->done, piece_end - op->done, &n));
        } else {
            DSHIM_CHECK(reduce_incoming(comm, c, sig, op, esize, piece_end - op->done, &n));
        }
        if (n == 0) {
            break;
        }
        op->done += n;
        *moved = 1;
        if (op->done < op->len) {
            return DSHIM_OK; /* let the other ops of this step move too */
        }
    }
    if (op->done < op->len) {
        return DSHIM_OK;
    }
    op->phase = PH_PAD;
    return DSHIM_OK;
}

/* PH_PAD: the zeros that keep every message a multiple of 8 bytes. */
static dshim_status_t progress_pad(dshim_conn_t *c, dshim_xfer_op_t *op, int *moved)
{
    size_t pad = pad_of(op->len);
    while (op->hoff < pad) {
        size_t n = 0;
        if (op->kind == DSHIM_XF_SEND) {
            DSHIM_CHECK(c->ops->send(c, zeros, pad - op->hoff, &n));
        } else {
            unsigned char sink[8];
            DSHIM_CHECK(c->ops->recv(c, sink, pad - op->hoff, &n));
        }
        if (n == 0) {
            return DSHIM_OK;
        }
        op->hoff += n;
        *moved = 1;
    }
    op->phase = PH_DONE;
    return DSHIM_OK;
}

/* One step of progress on one op; *moved set when bytes moved.  Each phase
 * moves on to the next only when it finished, so one call may take an op
 * from its header to its end. */
static dshim_status_t progress_op(dshim_comm_t *comm, const dshim_coll_sig_t *sig, dshim_xfer_op_t *op,
                                  size_t esize, int *moved)
{
    dshim_conn_t *c = dshim_comm_conn(comm, op->peer);
    if (op->sig) {
        sig = op->sig;
        esize = dshim_dtype_size((dshim_dtype_t)sig->dtype);
        esize = esize ? esize : 1;
    }
    if (op->phase == PH_HDR) {
        DSHIM_CHECK(progress_header(comm, c, sig, op, moved));
    }
    if (op->phase == PH_BODY) {
        DSHIM_CHECK(progress_body(comm, c, sig, op, esize, moved));
    }
    if (op->phase == PH_PAD) {
        DSHIM_CHECK(progress_pad(c, op, moved));
    }
    return DSHIM_OK;
}

/* A step as the wait rule sees it (wait.h): its ops, and whether they are
 * a point-to-point batch (an entry per request in the recorder). */
typedef struct step_wait {
    dshim_xfer_op_t *ops;
    int n;
    int p2p;
} step_wait_t;

static void step_doing(dshim_comm_t *comm, void *ctx, char *out, size_t len)
{
    step_wait_t *sw = ctx;
    dshim_xfer_waiting_on(comm, sw->ops, sw->n, out, len);
}

static void step_trace_waiting(dshim_comm_t *comm, void *ctx)
{
    step_wait_t *sw = ctx;
    dshim_xfer_trace_wait(comm, sw->p2p, sw->ops, sw->n);
}

static void step_trace_moving(dshim_comm_t *comm, void *ctx)
{
    step_wait_t *sw = ctx;
    dshim_xfer_trace_moving(comm, sw->p2p, sw->ops, sw->n);
}

/* Sleeps until a connection we are blocked on may move (the transports'
 * waiter: a wake-up of their own, or the sockets); an error when the peer of
 * one of them is gone. */
static dshim_status_t wait_for_events(dshim_comm_t *comm, dshim_xfer_op_t *ops, int n, int timeout_ms,
                                      int *watch_event)
{
    dshim_wait_set_t ws;
    int any_source = 0, conn_event = 0;
    dshim_wait_set_init(&ws);
    for (int i = 0; i < n && !dshim_wait_set_full(&ws); i++) {
        dshim_xfer_op_t *op = &ops[i];
        if (op->connecting && op->phase != PH_DONE) {
            /* its handshake's socket, or the peer's connection that won */
            if (op->conn_fd >= 0) {
                dshim_wait_set_add_fd(&ws, op->conn_fd, op->conn_events);
            } else {
                conn_event = 1;
            }
            continue;
        }
        if (next_to_bind(op)) {
            /* a message from any of its candidates would bind it, and the
             * death of one must be noticed; not those whose stream starts
             * with another kind of message (their socket stays readable) */
            any_source = 1;
            for (int p = 0; p < comm->size && !dshim_wait_set_full(&ws); p++) {
                int front = FRONT_EMPTY;
                if (!dshim_xfer_candidate(comm, ops, i, p) || dshim_xfer_stream_front(comm, p, &front) != DSHIM_OK || front != FRONT_EMPTY) {
                    continue;
                }
                dshim_wait_set_add(&ws, &comm->waiter, dshim_comm_conn(comm, p), 0);
            }
            /* a rank not connected yet may connect and send */
            if (__atomic_load_n(&comm->nconnects, __ATOMIC_ACQUIRE) < comm->size - 1) {
                conn_event = 1;
            }
            continue;
        }
        if (!op_active(op)) {
            continue;
        }
        if (op->phase == PH_BODY && op->done < op->len && op->done >= limit_of(op)) {
            /* blocked on its dependency, not on the socket: a writable
             * socket would wake us at once and turn the wait into a spin
             * that starves the peers we wait for when ranks outnumber cores */
            continue;
        }
        dshim_wait_set_add(&ws, &comm->waiter, dshim_comm_conn(comm, op->peer), op->kind == DSHIM_XF_SEND);
    }
    if (any_source) {
        /* the handshakes its receive began with every rank */
        dshim_comm_connects_pending(comm, &ws, &conn_event);
    }
    if (conn_event && comm->conn_event >= 0 && !dshim_wait_set_full(&ws)) {
        /* drained at the top of the next round, before it looks at the
         * connections (xfer loop): a publication after that look wakes us */
        dshim_wait_set_add_fd(&ws, comm->conn_event, POLLIN);
        *watch_event = 1;
    }
    if (ws.n == 0 && timeout_ms > 1 && !any_source) {
        timeout_ms = 1; /* cannot happen (a dependency is always pending), but never sleep blind */
    }
    return dshim_waiter_sleep(&comm->waiter, &ws, timeout_ms);
}

/* Moves on the handshakes of the ops whose peer is being connected;
 * *moved set when one finished (its ops become active). */
static dshim_status_t advance_connects(dshim_comm_t *comm, dshim_xfer_op_t *ops, int n, int *pending, int *moved)
{
    int left = 0;
    for (int i = 0; i < n; i++) {
        dshim_xfer_op_t *op = &ops[i];
        if (!op->connecting) {
            continue;
        }
        int done = 0;
        DSHIM_CHECK(dshim_comm_connect_poll(comm, op->peer, &done, &op->conn_fd, &op->conn_events));
        if (!done) {
            left++;
            continue;
        }
        *moved = 1;
        for (int j = i; j < n; j++) {
            if (ops[j].connecting && ops[j].peer == op->peer) {
                ops[j].connecting = 0;
            }
        }
    }
    *pending = left;
    return DSHIM_OK;
}

/* The connection to peer that copies to or from its memory (peer_read and
 * peer_write come together), or NULL with the error set. */
static dshim_conn_t *single_copy_conn(dshim_comm_t *comm, int peer, const char *verb)
{
    dshim_conn_t *c = dshim_comm_conn(comm, peer);
    if (!c || !c->ops->peer_read || !c->ops->peer_write) {
        char who[160];
        dshim_comm_describe_peer(comm, peer, who, sizeof(who));
        dshim_error(DSHIM_ERR_INTERNAL, "no connection to %s can %s its memory (%s)", who, verb,
                    c ? c->ops->name : "none made yet");
        return NULL;
    }
    return c;
}

dshim_status_t dshim_xfer_read_peer(dshim_comm_t *comm, int peer, void *buf, uint64_t remote, size_t len)
{
    dshim_conn_t *c = single_copy_conn(comm, peer, "read");
    if (!c) {
        return DSHIM_ERR_INTERNAL;
    }
    return len ? c->ops->peer_read(c, buf, (const void *)(uintptr_t)remote, len) : DSHIM_OK;
}

dshim_status_t dshim_xfer_write_peer(dshim_comm_t *comm, int peer, const void *buf, uint64_t remote, size_t len)
{
    dshim_conn_t *c = single_copy_conn(comm, peer, "write");
    if (!c) {
        return DSHIM_ERR_INTERNAL;
    }
    return len ? c->ops->peer_write(c, buf, (void *)(uintptr_t)remote, len) : DSHIM_OK;
}

dshim_status_t dshim_xfer_fail(dshim_comm_t *comm, const dshim_coll_sig_t *sig, dshim_status_t st)
{
    return dshim_xfer_fail_missing(comm, sig, st, NULL, 0);
}

dshim_status_t dshim_xfer_fail_missing(dshim_comm_t *comm, const dshim_coll_sig_t *sig, dshim_status_t st,
                                       const int *missing, int n)
{
    char call[160], msg[1024];
    /* handshakes this step began are given up (the communicator fails) */
    for (int r = 0; r < comm->size; r++) {
        dshim_comm_connect_cancel(comm, r);
    }
    describe_call(call, sizeof(call), sig->coll, sig->dtype, sig->redop, sig->root, sig->count, sig->seq);
    char job[32] = "";
    if (comm->job_rank) {
        snprintf(job, sizeof(job), "job rank %d, ", comm->job_rank[comm->rank]);
    }
    snprintf(msg, sizeof(msg), "rank %d (%shost %s) in %s: %s", comm->rank, job, comm->peers[comm->rank].hostname,
             call, dshim_last_error());
    return missing || n ? dshim_comm_fail_missing(comm, st, msg, sig->seq, missing, n) : dshim_comm_fail(comm, st, msg);
}

void dshim_xfer_link(dshim_xfer_op_t *ops, int first, int n)
{
    for (int i = first; i < n; i++) {
        ops[i].phase = PH_HDR;
        ops[i].done = 0;
        ops[i].hoff = 0;
        ops[i].prev = NULL;
        ops[i].wild_prev = NULL;
        ops[i].started = 0;
        ops[i].reported = 0;
        ops[i].connecting = 0;
        ops[i].conn_fd = -1;
        ops[i].conn_events = 0;
        ops[i].any_source = unbound(&ops[i]);
        for (int j = i - 1; j >= 0 && !unbound(&ops[i]); j--) {
            if (ops[j].peer == ops[i].peer && is_recv(&ops[j]) == is_recv(&ops[i])) {
                ops[i].prev = &ops[j];
                break;
            }
        }
        for (int j = i - 1; j >= 0 && is_recv(&ops[i]); j--) {
            if (ops[j].any_source) {
                ops[i].wild_prev = &ops[j];
                break;
            }
        }
    }
}

/* Checks the ops' peers, and begins the connection to each peer used for
 * the first time (its ops wait, `connecting`, until it is made; *pending_p
 * counts such ops). */
static dshim_status_t check_peers(dshim_comm_t *comm, const dshim_coll_sig_t *sig, dshim_xfer_op_t *ops, int first,
                                  int n, int *pending_p)
{
    for (int i = first; i < n; i++) {
        if (ops[i].peer == DSHIM_ANY_SOURCE && ops[i].kind == DSHIM_XF_RECV && comm->size > 1) {
            /* any rank may send it its message, and the death of any must
             * end the wait: it needs every connection (begun here, without
             * waiting for them: it binds to whichever sends first) */
            for (int r = 0; r < comm->size; r++) {
                dshim_status_t st = r == comm->rank || dshim_comm_conn(comm, r) ? DSHIM_OK
                                                                                 : dshim_comm_connect_start(comm, r);
                if (st != DSHIM_OK) {
                    return dshim_xfer_fail(comm, ops[i].sig ? ops[i].sig : sig, st);
                }
            }
            continue;
        }
        if (ops[i].peer < 0 || ops[i].peer >= comm->size || ops[i].peer == comm->rank) {
            dshim_error_quiet(DSHIM_ERR_INTERNAL, "transfer to invalid peer %d", ops[i].peer);
            return dshim_xfer_fail(comm, ops[i].sig ? ops[i].sig : sig, DSHIM_ERR_INTERNAL);
        }
        if (dshim_comm_conn(comm, ops[i].peer)) {
            continue;
        }
        dshim_status_t st = dshim_comm_connect_start(comm, ops[i].peer);
        if (st != DSHIM_OK) {
            return dshim_xfer_fail(comm, ops[i].sig ? ops[i].sig : sig, st);
        }
        ops[i].connecting = 1;
        (*pending_p)++;
    }
    return DSHIM_OK;
}

/* progress_op, after telling the owner that a receive begins its message. */
static dshim_status_t step_op(dshim_comm_t *comm, const dshim_coll_sig_t *sig, dshim_xfer_op_t *op, size_t esize,
                              int *moved, const dshim_xfer_hooks_t *hooks)
{
    if (!op->started && is_recv(op)) {
        op->started = 1;
        if (hooks && hooks->start) {
            hooks->start(comm, op, hooks->ctx);
        }
    }
    return progress_op(comm, sig, op, esize, moved);
}

dshim_status_t dshim_xfer(dshim_comm_t *comm, const dshim_coll_sig_t *sig, dshim_xfer_op_t *ops, int n)
{
    return dshim_xfer_ex(comm, sig, ops, n, NULL);
}

/* One pass over the ops: every active one takes a step, the owner hears of
 * each that finished.  *remaining = the ops not finished; *moved set when
 * bytes moved.  A step's error is returned as is (the caller fails the
 * communicator with it). */
static dshim_status_t step_all(dshim_comm_t *comm, const dshim_coll_sig_t *sig, dshim_xfer_op_t *ops, int n,
                               size_t esize, const dshim_xfer_hooks_t *hooks, int *remaining, int *moved)
{
    for (int i = 0; i < n; i++) {
        dshim_xfer_op_t *op = &ops[i];
        if (op->phase == PH_DONE) {
            continue;
        }
        if (!op_active(op)) {
            (*remaining)++;
            continue;
        }
        dshim_status_t st = step_op(comm, sig, op, esize, moved, hooks);
        if (st != DSHIM_OK) {
            return st;
        }
        if (op->phase != PH_DONE) {
            (*remaining)++;
        } else if (hooks && hooks->done && !op->reported) {
            op->reported = 1;
            hooks->done(comm, op, hooks->ctx);
        }
    }
    return DSHIM_OK;
}

/* The wait failed with st (a peer is gone).  DSHIM_OK when an op could still
 * move; else the step fails with the wait's cause. */
static dshim_status_t retry_after_wait_error(dshim_comm_t *comm, const dshim_coll_sig_t *sig, dshim_xfer_op_t *ops,
                                             int n, size_t esize, const dshim_xfer_hooks_t *hooks,
                                             int *next_source, dshim_status_t st)
{
    char cause[512];
    snprintf(cause, sizeof(cause), "%s", dshim_last_error());
    /* data may have arrived just before the peer left: try once more */
    int moved2 = 0;
    if (dshim_xfer_bind_any_sources(comm, ops, n, next_source) != DSHIM_OK) {
        dshim_error_set_raw(cause);
        return dshim_xfer_fail(comm, sig, st);
    }
    for (int i = 0; i < n && !moved2; i++) {
        if (op_active(&ops[i])) {
            if (step_op(comm, sig, &ops[i], esize, &moved2, hooks) != DSHIM_OK) {
                break;
            }
        }
    }
    if (!moved2) {
        dshim_error_set_raw(cause);
        return dshim_xfer_fail(comm, sig, st);
    }
    return DSHIM_OK;
}

dshim_status_t dshim_xfer_fail_mismatch(dshim_comm_t *comm, const dshim_coll_sig_t *sig, int peer,
                                        const dshim_coll_sig_t *theirs)
{
    char who[160], mine[160], other[160];
    dshim_comm_describe_peer(comm, peer, who, sizeof(who));
    describe_call(mine, sizeof(mine), sig->coll, sig->dtype, sig->redop, sig->root, sig->count, sig->seq);
    describe_call(other, sizeof(other), theirs->coll, theirs->dtype, theirs->redop, theirs->root, theirs->count,
                  theirs->seq);
    return dshim_xfer_fail(comm, sig, mismatch_error(mine, who, other));
}

/* The signature check against the ranks that run a collective through the
 * host gate (host_gate.h), which sends no message to compare: one of them
 * there with this collective's number means the ranks called different
 * collectives. */
static dshim_status_t check_gate(dshim_comm_t *comm, const dshim_coll_sig_t *sig)
{
    dshim_coll_sig_t theirs;
    int r = dshim_host_gate_at(comm, sig->seq, &theirs);
    return r < 0 ? DSHIM_OK : dshim_xfer_fail_mismatch(comm, sig, r, &theirs);
}

/* How long a rank with a core of its own spins, at least, when it idles in
 * the middle of a message (mid_message).  Its peer is then inside the same
 * operation, copying bytes: a pause longer than DSHIM_SPIN_US there is the
 * peer's system call or reduction over a chunk (a 512 KiB send or receive
 * takes 0.1-0.3 ms on a busy host), not a peer that is late.  Sleeping
 * through each such pause cost a wake-up every time: a 64 MiB allreduce over
 * TCP at N = 2 slept ~30 times (~0.26 ms each) per call; spinning through
 * them: 0.81 of its time, 16 MiB 0.93, shared memory unchanged
 * (docs/benchmarks.md, "TCP against the wire"). */
#define MID_MESSAGE_SPIN_S 1e-3

/* Whether a message of this step has begun to move (its header is through)
 * and is not finished. */
static int mid_message(const dshim_xfer_op_t *ops, int n)
{
    for (int i = 0; i < n; i++) {
        if (ops[i].phase == PH_BODY && ops[i].done > 0) {
            return 1;
        }
    }
    return 0;
}

static dshim_status_t xfer_run(dshim_comm_t *comm, const dshim_coll_sig_t *sig, dshim_xfer_op_t *ops, int n,
                               const dshim_xfer_hooks_t *hooks)
{
    size_t esize = dshim_dtype_size((dshim_dtype_t)sig->dtype);
    if (esize == 0) {
        esize = 1;
    }
    dshim_xfer_link(ops, 0, n);
    int connecting = 0;   /* ops waiting for their peer's connection (first use) */
    int watch_event = 0;  /* the last sleep watched comm->conn_event */
    DSHIM_CHECK(check_peers(comm, sig, ops, 0, n, &connecting));
    int any_connects = dshim_comm_connects_pending(comm, NULL, NULL) > 0;
    const double spin_s = (double)comm->spin_us * 1e-6;
    double spin_now = spin_s; /* this idle spell's spin: see mid_message_spin */
    unsigned idle_loops = 0;
    int next_source = (comm->rank + 1) % comm->size;
    const int p2p = sig->coll == DSHIM_COLL_P2P;
    /* a batch's sig is its first request's, which its owner may free once
     * it is reported done: the failure and stall messages use a copy (each
     * op moves under its own op->sig) */
    dshim_coll_sig_t batch_sig;
    if (p2p) {
        batch_sig = *sig;
        sig = &batch_sig;
    }
    /* the wait rule's state: its clock starts at the first idle loop, not
     * here (most steps never wait) */
    step_wait_t sw = {ops, n, p2p};
    const dshim_wait_source_t src = {step_doing, NULL, step_trace_waiting, step_trace_moving, &sw};
    dshim_wait_t w;
    dshim_wait_init(&w, sig, &src);
    while (1) {
        int remaining = 0, moved = 0;
        if (watch_event) {
            uint64_t events;
            ssize_t got = read(comm->conn_event, &events, sizeof(events)); /* non-blocking; 0 events is fine */
            (void)got;
            watch_event = 0;
        }
        if (connecting) {
            dshim_status_t cst = advance_connects(comm, ops, n, &connecting, &moved);
            if (cst != DSHIM_OK) {
                return dshim_xfer_fail(comm, sig, cst);
            }
        }
        if (any_connects) {
            /* handshakes begun for receives from any source */
            dshim_status_t cst = dshim_comm_connect_poll_all(comm, &moved);
            if (cst != DSHIM_OK) {
                return dshim_xfer_fail(comm, sig, cst);
            }
            any_connects = dshim_comm_connects_pending(comm, NULL, NULL) > 0;
        }
        dshim_status_t bst = dshim_xfer_bind_any_sources(comm, ops, n, &next_source);
        if (bst != DSHIM_OK) {
            return dshim_xfer_fail(comm, sig, bst);
        }
        dshim_status_t sst = step_all(comm, sig, ops, n, esize, hooks, &remaining, &moved);
        if (sst != DSHIM_OK) {
            return dshim_xfer_fail(comm, sig, sst);
        }
        if (!moved && hooks && hooks->absorb) {
            int old_n = n;
            if (hooks->absorb(comm, ops, &n, hooks->cap, hooks->ctx) && n > old_n) {
                dshim_xfer_link(ops, old_n, n);
                DSHIM_CHECK(check_peers(comm, sig, ops, old_n, n, &connecting));
                any_connects = dshim_comm_connects_pending(comm, NULL, NULL) > 0;
                sw.n = n;
                dshim_wait_remark(&w);
                continue;
            }
        }
        if (!remaining) {
            if (!p2p) {
                /* the op may go on with another step: not waiting now (a
                 * batch's requests are all reported done) */
                dshim_wait_moving(comm, &w);
            }
            return DSHIM_OK;
        }
        if (moved) {
            dshim_waiter_disarm(&comm->waiter);
            idle_loops = 0;
            dshim_wait_moving(comm, &w);
            continue;
        }
        if (__atomic_load_n(&comm->error, __ATOMIC_ACQUIRE) != DSHIM_OK) {
            dshim_error_set_raw(comm->errmsg);
            return comm->error;
        }
        if (__atomic_load_n(&comm->acceptor_failed, __ATOMIC_ACQUIRE)) {
            /* the acceptor found no descriptor for a peer's connection
             * (bootstrap.c): that peer never gets through, so fail now,
             * from this thread, with the acceptor's line */
            dshim_error_set_raw(comm->acceptor_errmsg);
            return dshim_xfer_fail(comm, sig, DSHIM_ERR_SYSTEM);
        }
        /* nothing moved: spin a little (peers are usually microseconds away),
         * then sleep until a connection may move.  A rank with a core of its
         * own reads the clock every 8th loop only: a read is ~25 ns, and the
         * loop's length is how late the rank sees its peer's message (2-rank
         * barrier 8 % faster; docs/benchmarks.md).  One that yields on every
         * loop (more ranks than cores) reads it every time: next to a
         * sched_yield it costs nothing, and its spin is measured closely. */
        unsigned loop = idle_loops++;
        const int clock_due = loop == 0 || (loop & 7) == 0 || spin_s <= 0 || comm->spin_yields;
        double now = clock_due ? dshim_now() : 0;
        if (loop == 0) {
            /* nothing moves while the loop idles: decided once per spell */
            spin_now = spin_s > 0 && !comm->spin_yields && mid_message(ops, n) && spin_s < MID_MESSAGE_SPIN_S
                           ? MID_MESSAGE_SPIN_S
                           : spin_s;
            dshim_wait_idle(&w, now);
        }
        if (!clock_due || now - w.since < spin_now) {
            /* yields: with more ranks than cores on every poll (the peer
             * needs the core), else every 64th (a peer may share this core) */
            if (comm->spin_yields || (loop & 63) == 63) {
                sched_yield();
            } else {
                __builtin_ia32_pause();
            }
            continue;
        }
        if (dshim_waiter_arm(&comm->waiter)) {
            /* about to sleep: announced, now look once more, so that a
             * peer's progress after this look wakes us (transport.h) */
            continue;
        }
        if (comm->gate_transport >= 0 && comm->check_sig && !p2p) {
            DSHIM_CHECK(check_gate(comm, sig));
        }
        int tmo;
        DSHIM_CHECK(dshim_wait_look(comm, &w, now, 100, &tmo));
        dshim_status_t st = wait_for_events(comm, ops, n, tmo, &watch_event);
        if (st != DSHIM_OK) {
            DSHIM_CHECK(retry_after_wait_error(comm, sig, ops, n, esize, hooks, &next_source, st));
            idle_loops = 0;
        }
    }
}

dshim_status_t dshim_xfer_ex(dshim_comm_t *comm, const dshim_coll_sig_t *sig, dshim_xfer_op_t *ops, int n,
                             const dshim_xfer_hooks_t *hooks)
{
    dshim_status_t st = xfer_run(comm, sig, ops, n, hooks);
    /* it may return from the round after an arm: peers need not wake us */
    dshim_waiter_disarm(&comm->waiter);
    return st;
}

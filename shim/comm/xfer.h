/*
 * The data engine: drives a set of point-to-point transfers of one collective
 * step to completion, overlapping sends, receives and reductions, waiting
 * without burning the CPU when nothing moves, and turning silence, dead peers,
 * garbage and mismatched collectives into errors.
 *
 * Every message on a stream is: a 48-byte header (magic, collective
 * signature, payload length) + payload + zero padding to 8 bytes.  See
 * docs/wire-protocol.md.
 */
#ifndef DSHIM_XFER_H
#define DSHIM_XFER_H

#include "comm.h"

typedef enum { DSHIM_XF_SEND = 0, DSHIM_XF_RECV, DSHIM_XF_RECV_REDUCE } dshim_xf_kind_t;

typedef struct dshim_xfer_op dshim_xfer_op_t;
struct dshim_xfer_op {
    /* filled by the algorithm */
    int kind;
    int peer;
    const void *sbuf;      /* SEND: data */
    void *rbuf;            /* RECV: destination; RECV_REDUCE: dst */
    const void *local;     /* RECV_REDUCE: local operand (may equal rbuf) */
    size_t len;            /* payload bytes */
    int incoming_first;    /* RECV_REDUCE: dst = op(incoming, local) instead of op(local, incoming) */
    int avg_div;           /* RECV_REDUCE: divide the result by comm size (AVG, final step) */
    dshim_xfer_op_t *dep;  /* may move only up to dep->done bytes (same offsets) */
    dshim_xfer_op_t *dep2;
    const dshim_coll_sig_t *sig; /* per-op signature (point-to-point batches); NULL = the step's */
    void *user;            /* owner's cookie (the request of a point-to-point op) */
    /* RECV with peer DSHIM_ANY_SOURCE (< 0): bound to a peer while the batch
     * runs, to the first whose stream starts with an unclaimed
     * point-to-point message (xfer.c, bind_any_sources) */
    /* engine state */
    int phase;
    size_t done;
    size_t hoff;
    unsigned char hdr[48];
    dshim_xfer_op_t *prev; /* earlier op on the same peer and direction */
    dshim_xfer_op_t *wild_prev; /* receives: the last receive from any source posted before it */
    int any_source;        /* posted with peer DSHIM_ANY_SOURCE (peer may be bound since) */
    int started;           /* receives: `start` hook called */
    int connecting;        /* its peer's connection is being made (first use): not active until it is */
    int conn_fd;           /* connecting: what its handshake waits on (-1: comm->conn_event) */
    short conn_events;
    int reported;
};

/* Hooks for open-ended batches (point-to-point): `absorb` may append ops at
 * ops[*n_p..cap) while the batch runs (called when nothing moves); `start`
 * is called once per receive when it begins to read its message (its peer
 * is known then, and receives on one stream start in the stream's order);
 * `done` is called once per op as it completes. */
typedef struct dshim_xfer_hooks {
    int (*absorb)(dshim_comm_t *comm, dshim_xfer_op_t *ops, int *n_p, int cap, void *ctx);
    void (*start)(dshim_comm_t *comm, dshim_xfer_op_t *op, void *ctx);
    void (*done)(dshim_comm_t *comm, dshim_xfer_op_t *op, void *ctx);
    void *ctx;
    int cap;
} dshim_xfer_hooks_t;

dshim_status_t dshim_xfer_ex(dshim_comm_t *comm, const dshim_coll_sig_t *sig, dshim_xfer_op_t *ops, int n,
                             const dshim_xfer_hooks_t *hooks);
/* Links ops[first..n) to earlier ops on the same peer and direction (and
 * receives to the last earlier receive from any source). */
void dshim_xfer_link(dshim_xfer_op_t *ops, int first, int n);

/* Runs ops[0..n) to completion.  The signature is checked against every
 * incoming header.  dtype/redop used for RECV_REDUCE come from sig. */
dshim_status_t dshim_xfer(dshim_comm_t *comm, const dshim_coll_sig_t *sig, dshim_xfer_op_t *ops, int n);

/* Copies len bytes at `remote` in peer's memory into buf in one copy,
 * through the connection's peer_read (transport.h; made on first use like
 * any connection, so the peer must have been sent to or received from
 * first).  An error (not failing the communicator: the caller decides)
 * names the peer. */
dshim_status_t dshim_xfer_read_peer(dshim_comm_t *comm, int peer, void *buf, uint64_t remote, size_t len);
/* The other direction: len bytes of buf to `remote` in peer's memory,
 * through peer_write; the same rules. */
dshim_status_t dshim_xfer_write_peer(dshim_comm_t *comm, int peer, const void *buf, uint64_t remote, size_t len);

/* Fails the communicator with st and the current error
 * (dshim_last_error), worded as every failed step is: "rank R (host H) in
 * <the call>: <error>". */
dshim_status_t dshim_xfer_fail(dshim_comm_t *comm, const dshim_coll_sig_t *sig, dshim_status_t st);
/* dshim_xfer_fail with the ranks that did not arrive at the collective
 * (missing[0..n), n = -1: unknown), kept as the failure's verdict
 * (wait.h). */
dshim_status_t dshim_xfer_fail_missing(dshim_comm_t *comm, const dshim_coll_sig_t *sig, dshim_status_t st,
                                       const int *missing, int n);

/* Fails the communicator with the mismatch error: this rank's call (sig)
 * against peer's (theirs). */
dshim_status_t dshim_xfer_fail_mismatch(dshim_comm_t *comm, const dshim_coll_sig_t *sig, int peer,
                                        const dshim_coll_sig_t *theirs);

/* Convenience constructors. */
static inline dshim_xfer_op_t dshim_xf_send(int peer, const void *buf, size_t len)
{
    dshim_xfer_op_t op = {0};
    op.kind = DSHIM_XF_SEND;
    op.peer = peer;
    op.sbuf = buf;
    op.len = len;
    return op;
}
static inline dshim_xfer_op_t dshim_xf_recv(int peer, void *buf, size_t len)
{
    dshim_xfer_op_t op = {0};
    op.kind = DSHIM_XF_RECV;
    op.peer = peer;
    op.rbuf = buf;
    op.len = len;
    return op;
}
static inline dshim_xfer_op_t dshim_xf_recv_reduce(int peer, void *dst, const void *local, size_t len,
                                                   int incoming_first)
{
    dshim_xfer_op_t op = {0};
    op.kind = DSHIM_XF_RECV_REDUCE;
    op.peer = peer;
    op.rbuf = dst;
    op.local = local;
    op.len = len;
    op.incoming_first = incoming_first;
    return op;
}

#endif

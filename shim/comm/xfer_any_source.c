/* Receives from any source (a part of the data engine, xfer_impl.h).
 *
 * A receive from any source (peer DSHIM_ANY_SOURCE) is bound to a peer when
 * that peer's stream starts with a point-to-point message no earlier receive
 * claims; from then on it is an ordinary receive from that peer.  Matching
 * is MPI's: a message goes to the earliest-posted pending receive that names
 * its sender or any source.  Hence: receives from any source bind in posting
 * order; one binds to peer p only when every receive from p posted before it
 * is finished (p's next message is not theirs); a receive posted after an
 * unbound one from any source waits until that one is bound (op_active).
 * The front of a stream is read with peek, without consuming: the first 8
 * bytes of a header (magic, version, collective kind) never straddle a ring
 * wrap, since streams carry whole multiples of 8 bytes per message. */
#include <stdio.h>
#include <string.h>

#include "comm.h"
#include "status.h"
#include "xfer_impl.h"

/* What peer p's stream starts with.  Bytes that are no dshim header count as
 * point-to-point: the receive that binds to them reports the garbage. */
dshim_status_t dshim_xfer_stream_front(dshim_comm_t *comm, int p, int *front_p)
{
    dshim_conn_t *c = dshim_comm_conn(comm, p);
    const void *ptr;
    size_t avail = 0;
    *front_p = FRONT_EMPTY;
    DSHIM_CHECK(c->ops->peek(c, &ptr, &avail));
    if (avail < 8) {
        return DSHIM_OK;
    }
    wire_hdr_t h;
    memcpy(&h, ptr, 8);
    int ours = h.magic == WIRE_MAGIC && h.version == WIRE_VERSION;
    *front_p = !ours || h.coll == DSHIM_COLL_P2P ? FRONT_P2P : FRONT_OTHER;
    return DSHIM_OK;
}

/* Whether a receive posted before ops[a] still owns peer p's next message. */
static int claimed_before(const dshim_xfer_op_t *ops, int a, int p)
{
    for (int j = 0; j < a; j++) {
        if (is_recv(&ops[j]) && ops[j].peer == p && ops[j].phase != PH_DONE) {
            return 1;
        }
    }
    return 0;
}

/* Peers a receive from any source (ops[a]) may take a message from now:
 * every other connected rank whose next message no earlier receive claims
 * (a rank that sends to us connects first: its connection is published by
 * the acceptor, which wakes the wait through comm->conn_event). */
int dshim_xfer_candidate(const dshim_comm_t *comm, const dshim_xfer_op_t *ops, int a, int p)
{
    return p != comm->rank && dshim_comm_conn(comm, p) && !claimed_before(ops, a, p);
}

/* For messages: a rank a receive from any source (ops[a]) may yet get its
 * message from, connected or not. */
int dshim_xfer_may_send(const dshim_comm_t *comm, const dshim_xfer_op_t *ops, int a, int p)
{
    return p != comm->rank && !claimed_before(ops, a, p);
}

static void bind_to(dshim_xfer_op_t *ops, int n, int a, int p)
{
    dshim_xfer_op_t *op = &ops[a];
    op->peer = p;
    op->prev = NULL; /* every earlier receive from p is finished (candidate) */
    for (int j = a + 1; j < n; j++) {
        /* later receives from p come after it on p's stream */
        if (is_recv(&ops[j]) && ops[j].peer == p && (!ops[j].prev || ops[j].prev < op)) {
            ops[j].prev = op;
        }
    }
}

/* Binds the receives from any source that can be, in posting order.  The
 * peers are tried round robin from *next_p, so that one busy sender does not
 * starve the others. */
dshim_status_t dshim_xfer_bind_any_sources(dshim_comm_t *comm, dshim_xfer_op_t *ops, int n, int *next_p)
{
    for (int a = 0; a < n; a++) {
        if (!next_to_bind(&ops[a])) {
            continue;
        }
        int found = -1;
        for (int k = 0; k < comm->size && found < 0; k++) {
            int p = (*next_p + k) % comm->size;
            if (!dshim_xfer_candidate(comm, ops, a, p)) {
                continue;
            }
            int front;
            dshim_status_t st = dshim_xfer_stream_front(comm, p, &front);
            if (st != DSHIM_OK) {
                return st;
            }
            if (front == FRONT_P2P) {
                found = p;
            }
        }
        if (found < 0) {
            return DSHIM_OK; /* later ones would take what this one must take first */
        }
        bind_to(ops, n, a, found);
        *next_p = (found + 1) % comm->size;
    }
    return DSHIM_OK;
}

/* For messages: the ranks a receive from any source waits for (no
 * point-to-point message from them is there). */
static void silent_ranks(dshim_comm_t *comm, const dshim_xfer_op_t *ops, int a, char *out, size_t len)
{
    size_t o = 0;
    out[0] = 0;
    for (int p = 0; p < comm->size && o + 16 < len; p++) {
        int front = FRONT_EMPTY;
        if (!dshim_xfer_may_send(comm, ops, a, p) ||
            (dshim_xfer_candidate(comm, ops, a, p) && dshim_xfer_stream_front(comm, p, &front) == DSHIM_OK && front == FRONT_P2P)) {
            continue;
        }
        o += (size_t)snprintf(out + o, len - o, "%s%d", o ? ", " : "", p);
    }
}

/* Peers we are blocked on, as text, for timeout/dead-peer messages. */
void dshim_xfer_waiting_on(dshim_comm_t *comm, dshim_xfer_op_t *ops, int n, char *out, size_t len)
{
    size_t o = 0;
    out[0] = 0;
    for (int i = 0; i < n && o + 48 < len; i++) {
        if (next_to_bind(&ops[i])) {
            char silent[256];
            silent_ranks(comm, ops, i, silent, sizeof(silent));
            o += (size_t)snprintf(out + o, len - o, "%sreceiving from any source (no message from rank%s %s)",
                                  o ? ", " : "", strchr(silent, ',') ? "s" : "", silent[0] ? silent : "-");
            continue;
        }
        if (!op_active(&ops[i]) && !(ops[i].connecting && ops[i].phase != PH_DONE)) {
            continue;
        }
        char p[160];
        dshim_comm_describe_peer(comm, ops[i].peer, p, sizeof(p));
        o += (size_t)snprintf(out + o, len - o, "%s%s %s%s", o ? ", " : "",
                              ops[i].kind == DSHIM_XF_SEND ? "sending to" : "receiving from", p,
                              ops[i].connecting ? " (connecting to it: no answer to the handshake yet)" : "");
    }
}

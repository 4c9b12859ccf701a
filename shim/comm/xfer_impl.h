/* What the data engine's files share (xfer.c: the steps; xfer_any_source.c:
 * receives from any source; xfer_waiting.c: whom a sleeping step waits for,
 * for the flight recorder).  Private to module comm. */
#ifndef DSHIM_XFER_IMPL_H
#define DSHIM_XFER_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "xfer.h"

#define WIRE_MAGIC   0x4D485344u /* "DSHM" */
#define WIRE_VERSION 1
#define HDR_BYTES    48

enum { PH_HDR = 0, PH_BODY, PH_PAD, PH_DONE };

typedef struct wire_hdr {
    uint32_t magic;
    uint16_t version;
    uint8_t coll, dtype, redop;
    uint8_t pad[3];
    int32_t root;
    uint64_t count;
    uint64_t seq;
    uint64_t nbytes;
    uint64_t reserved;
} wire_hdr_t;
_Static_assert(sizeof(wire_hdr_t) == HDR_BYTES, "wire header is 48 bytes");

static inline int is_recv(const dshim_xfer_op_t *op)
{
    return op->kind != DSHIM_XF_SEND;
}

/* A receive from any source that no message is bound to yet. */
static inline int unbound(const dshim_xfer_op_t *op)
{
    return op->peer < 0;
}

/* An op can move now: not finished, bound to a peer, the op before it on the
 * same peer and direction is finished (streams are ordered), and no receive
 * from any source posted before it waits for a message (which might be the
 * one this op would take: MPI's order of posting). */
static inline int op_active(const dshim_xfer_op_t *op)
{
    return op->phase != PH_DONE && !unbound(op) && !op->connecting && !(op->prev && op->prev->phase != PH_DONE) &&
           !(op->wild_prev && unbound(op->wild_prev));
}

/* A receive from any source that would be bound next: unbound, and every
 * receive from any source posted before it is bound (they bind in order). */
static inline int next_to_bind(const dshim_xfer_op_t *op)
{
    return op->phase != PH_DONE && unbound(op) && !(op->wild_prev && unbound(op->wild_prev));
}

static inline size_t limit_of(const dshim_xfer_op_t *op)
{
    size_t lim = op->len;
    if (op->dep && op->dep->phase < PH_PAD && op->dep->done < lim) {
        lim = op->dep->done;
    }
    if (op->dep2 && op->dep2->phase < PH_PAD && op->dep2->done < lim) {
        lim = op->dep2->done;
    }
    return lim;
}

/* ---- receives from any source (xfer_any_source.c) ---- */

/* What a peer's stream starts with. */
enum { FRONT_EMPTY = 0, FRONT_P2P, FRONT_OTHER };
dshim_status_t dshim_xfer_stream_front(dshim_comm_t *comm, int p, int *front_p);
/* Peer p may give receive ops[a] (from any source) its message now: connected, not claimed. */
int dshim_xfer_candidate(const dshim_comm_t *comm, const dshim_xfer_op_t *ops, int a, int p);
/* Peer p may yet give ops[a] its message, connected or not. */
int dshim_xfer_may_send(const dshim_comm_t *comm, const dshim_xfer_op_t *ops, int a, int p);
/* Binds the receives from any source that can be, in posting order, peers
 * tried round robin from *next_p. */
dshim_status_t dshim_xfer_bind_any_sources(dshim_comm_t *comm, dshim_xfer_op_t *ops, int n, int *next_p);
/* The peers a step is blocked on, as text, for timeout and dead-peer messages. */
void dshim_xfer_waiting_on(dshim_comm_t *comm, dshim_xfer_op_t *ops, int n, char *out, size_t len);

/* ---- the flight recorder's view of a sleeping step (xfer_waiting.c) ---- */

/* Nothing moved and the step sleeps: its entries become "waiting", naming the ranks. */
void dshim_xfer_trace_wait(dshim_comm_t *comm, int p2p, dshim_xfer_op_t *ops, int n);
/* Data moves again after dshim_xfer_trace_wait. */
void dshim_xfer_trace_moving(dshim_comm_t *comm, int p2p, dshim_xfer_op_t *ops, int n);

#endif

/*
 * Transport interface: everything the core does with a way of moving bytes
 * between two ranks, from setting it up for a communicator to waiting on it.
 * The core (shim/comm) sees transports only through this header: it picks
 * one per peer from the registry, connects through it, moves bytes through
 * its connections and sleeps through the waiter, and never asks which
 * transport it holds.
 *
 * Life of a transport in one communicator:
 *  - setup (optional, only when the communicator has several ranks and
 *    DSHIM_TRANSPORT allows the transport): makes this rank's resources and
 *    writes what peers need to reach them into `addr` (published in this
 *    rank's peer record; "" when nothing).  Unavailable resources are not an
 *    error: the transport warns, returns DSHIM_OK with *state_p = NULL and
 *    then reaches nobody, so the peers it would have served fall back.
 *  - reaches (optional, NULL = every peer): whether connect can serve this
 *    peer, from its peer record.  Both ends of a pair must come to the same
 *    answer (the bootstrap picks a transport on each end independently).
 *  - connect: makes the connection to one peer over `fd`, the TCP socket the
 *    bootstrap handshook with it (non-blocking).  Takes ownership of fd on
 *    success only.  Connections are made on first use of a peer, at any time
 *    in the communicator's life (shim/comm/bootstrap.c), and connect may run
 *    in two threads at once for two different peers (the one using the
 *    communicator, and the one accepting its peers' connections): it must
 *    touch only that peer's part of the state.
 *  - prepare (optional): called just before this rank begins a handshake
 *    with a peer, to take hold of what the peer published while the peer is
 *    surely alive: once it answers, it may send, finish and exit before this
 *    side makes the connection (shm: opens its inbox, reachable only through
 *    its process).  Errors are not reported here (connect reports them), and
 *    it may run while the other thread connects the same peer.
 *  - reserve (optional): called by the accepting end of a handshake before
 *    it connects, to secure what the pair's connection will use on both
 *    ends (shm: the pages of the two rings, which a full tmpfs would answer
 *    with SIGBUS at first touch).  On failure (a quiet one-line error: what,
 *    how much, where, how to fix) the pair uses the fallback transport: the
 *    accepting end says so in its answer, and both ends connect through it.
 *  - teardown (optional): frees the state, after every connection is gone.
 *  - host_area (optional; host-local transports): memory shared by the
 *    ranks of this host in the communicator, for the collectives they run
 *    through shared words instead of messages (shim/comm/host_gate.c lays
 *    it out).  The setup of the communicator's rank 0 makes
 *    dshim_host_area_bytes(size) zero-filled bytes; the ranks of its host
 *    use them (`owner` is rank 0; another owner is an error).  The first
 *    call maps them (through the owner's
 *    process, so the owner must be alive then: the core calls it before it
 *    can need them), later calls return the same pointer, teardown unmaps.
 *  - peer_reads (with the connections' peer_read and peer_write, below):
 *    whether they may serve this peer, from its record (the peer allowed it:
 *    DSHIM_SHM_CMA); the same answer on every rank.
 *
 * Waiting.  A transport whose arrivals show on the connection's socket (tcp)
 * leaves wait_arm/wait/wait_disarm NULL: the engine polls that socket, POLLIN
 * to receive and POLLOUT to send.  A transport with a wake-up of its own
 * (shm's doorbell) gives all three; its sockets then only serve to notice
 * the peer's death.  When its spin ran out the engine arms (announces that
 * it is about to sleep), runs one more round of progress, and sleeps with
 * the armed value if that round moved nothing, so a wake-up after the arm is
 * never lost; while nobody is armed, waking costs the waker no write to a
 * shared line (see dshim_waiter_t).
 *
 * Connections.  The collective engine drives every connection of a
 * communicator from one thread at a time, so implementations need no
 * locking.  All calls are non-blocking: they move what they can and report
 * how much.
 *  - send: copies up to len bytes from buf into the stream; *n_p = bytes
 *    taken (0 when the stream is full).  Never blocks.
 *  - recv: copies up to len received bytes into buf; *n_p = bytes given
 *    (0 when none are there yet).
 *  - peek/consume: zero-copy reading.  peek sets *ptr_p and *avail_p to the
 *    received bytes that are contiguous in the transport's own memory
 *    (*avail_p = 0 when none); the bytes stay valid and in place until
 *    consume(n) releases the first n of them.  recv and peek/consume may be
 *    mixed; recv after a peek returns the same not-yet-consumed bytes.
 *  - send2/recv2 (optional, NULL when a transport gains nothing from them):
 *    send or recv over two buffers in one call, `a` first; *n_p counts bytes
 *    of both.  TCP uses them to put a message's header and the start of its
 *    payload into one system call (and one segment) instead of two.
 *  - recv_ahead (optional, NULL = recv): recv of bytes (a message header)
 *    that the engine follows with peek (to reduce the payload in place): a
 *    transport that peeks through a staging buffer fills it first, so the
 *    header and the payload's start arrive in one system call (TCP).
 *  - recv_stream (optional, NULL = recv): recv into a destination that
 *    belongs to `span` bytes of data (the message, or the collective it is a
 *    piece of); when span is too large for the cache the transport may copy
 *    with non-temporal stores (shm, from DSHIM_SHM_STREAM_MIN).
 *  - peer_read (optional; host-local transports that can read a peer's
 *    memory directly, shm through process_vm_readv): copies len bytes at
 *    `remote` in the peer's address space into buf in one copy, blocking (a
 *    memory copy: it never waits for the peer).  The peer must keep those
 *    bytes in place until it learns that the read is done
 *    (shim/comm/coll_single_copy.c).  DSHIM_ERR_PEER when the peer is gone,
 *    DSHIM_ERR_UNSUPPORTED when the kernel refuses the read, both naming it.
 *  - peer_write (with peer_read): the other direction, len bytes of buf to
 *    `remote` in the peer's address space, which the peer must not touch
 *    until it learns that the write is done; the same errors.
 *  - hung_up: non-zero when the peer is known to be gone (closed its end).
 *    Costs a system call: for slow paths only.
 *  - A dead or closed peer: DSHIM_ERR_PEER with a message naming the peer.
 *    Bytes that do not make sense are the engine's business (framing).
 *  - Streams carry only multiples of 8 bytes per message (the engine pads),
 *    so an element of <= 8 bytes never straddles a ring wrap.
 *  - Every connection has `fd`, the TCP socket to the same peer.  For "tcp"
 *    it is the data socket; for "shm" it is an idle control socket that only
 *    serves to notice the peer's death (EOF / POLLHUP) while waiting.  The
 *    core shuts it down to make the peer notice a failure at once.
 *
 * Registry: the transports in order of preference (backends/transport/
 * registry.c).  DSHIM_TRANSPORT=auto uses, for each peer, the first one that
 * reaches it; DSHIM_TRANSPORT=<name> only that one (a host-local one with a
 * peer on another host is an error), and the fallback (tcp, which reaches
 * every peer over the handshaken socket) where it cannot serve a peer.
 */
#ifndef DSHIM_TRANSPORT_H
#define DSHIM_TRANSPORT_H

#include <poll.h>
#include <stdio.h>
#include <stddef.h>
#include <stdint.h>
#include "dshim.h"

#define DSHIM_TRANSPORT_MAX      4   /* registry entries */
#define DSHIM_TRANSPORT_ADDR_LEN 64  /* bytes of the peer record each transport may publish into */

/* The host area (host_area below): two lines of words every rank of the
 * host writes, then a line per rank (128-byte lines, so that the adjacent-
 * line prefetcher does not make two ranks' lines share fate), then a data
 * block per rank and one for a result. */
#define DSHIM_HOST_AREA_LINE 128
#define DSHIM_HOST_AREA_DATA ((size_t)1 << 20)
static inline size_t dshim_host_area_bytes(int size)
{
    return ((size_t)size + 2) * DSHIM_HOST_AREA_LINE + ((size_t)size + 1) * DSHIM_HOST_AREA_DATA;
}

typedef struct dshim_conn dshim_conn_t;
typedef struct dshim_transport dshim_transport_t;

/* What a transport's setup learns about the communicator. */
typedef struct dshim_transport_comm {
    int rank, size;
    uint64_t comm_hash;  /* hash of the job token and the communicator: names its resources */
} dshim_transport_comm_t;

/* What reaches/connect learn about one peer. */
typedef struct dshim_transport_peer {
    int rank;
    int same_host;       /* same host id (host, boot and network namespace; DSHIM_HOST_ID) */
    uint32_t ip, my_ip;  /* the peer's and this rank's data addresses, network byte order */
    const char *addr;    /* what the peer's setup of this transport published ("" when nothing) */
} dshim_transport_peer_t;

struct dshim_transport {
    const char *name;  /* DSHIM_TRANSPORT value and dshim_comm_transport() word */
    int host_local;    /* reaches only ranks of this host */

    /* per communicator */
    dshim_status_t (*setup)(const dshim_transport_comm_t *comm, void **state_p, char *addr, size_t addr_len);
    int (*reaches)(void *state, const dshim_transport_peer_t *peer);
    dshim_status_t (*connect)(void *state, const dshim_transport_peer_t *peer, int fd, dshim_conn_t **conn_p);
    void (*prepare)(void *state, const dshim_transport_peer_t *peer);
    dshim_status_t (*reserve)(void *state, const dshim_transport_peer_t *peer);
    void (*teardown)(void *state);
    dshim_status_t (*host_area)(void *state, const dshim_transport_peer_t *owner, void **area_p);
    int (*peer_reads)(void *state, const dshim_transport_peer_t *peer);

    /* waiting (all three or none): arm announces a sleeper and returns the
     * value to wait with, disarm withdraws it */
    uint32_t (*wait_arm)(void *state);
    dshim_status_t (*wait)(void *state, uint32_t armed, long timeout_us); /* < 0: until woken; wake = OK */
    void (*wait_disarm)(void *state);

    /* per connection */
    dshim_status_t (*send)(dshim_conn_t *c, const void *buf, size_t len, size_t *n_p);
    dshim_status_t (*recv)(dshim_conn_t *c, void *buf, size_t len, size_t *n_p);
    dshim_status_t (*peek)(dshim_conn_t *c, const void **ptr_p, size_t *avail_p);
    dshim_status_t (*consume)(dshim_conn_t *c, size_t n);
    dshim_status_t (*send2)(dshim_conn_t *c, const void *a, size_t alen, const void *b, size_t blen, size_t *n_p);
    dshim_status_t (*recv2)(dshim_conn_t *c, void *a, size_t alen, void *b, size_t blen, size_t *n_p);
    dshim_status_t (*recv_ahead)(dshim_conn_t *c, void *buf, size_t len, size_t *n_p);
    dshim_status_t (*recv_stream)(dshim_conn_t *c, void *buf, size_t len, size_t span, size_t *n_p);
    dshim_status_t (*peer_read)(dshim_conn_t *c, void *buf, const void *remote, size_t len);
    dshim_status_t (*peer_write)(dshim_conn_t *c, const void *buf, void *remote, size_t len);
    int (*hung_up)(dshim_conn_t *c);
    void (*destroy)(dshim_conn_t *c);
};

/* Common head of every connection; implementations embed it first. */
struct dshim_conn {
    const dshim_transport_t *ops;
    int peer;       /* peer rank in the communicator */
    int peer_job;   /* the peer's rank in the job, for messages: peer, except on a
                     * sub-communicator (set by the communicator after connect) */
    const char *peer_host; /* the peer's host and pid, for messages (set with peer_job; */
    int peer_pid;          /* NULL/0 where no communicator published the connection) */
    int fd;         /* TCP socket to the peer (data for tcp, control for shm) */
    uint64_t bytes_sent, bytes_received;
};

/* The peer as messages name it: "rank 1 (host h, pid 42)", with "job rank 3, "
 * first on a sub-communicator, whose numbering is not the job's: a dead
 * peer's message must say where it ran. */
static inline void dshim_conn_peer_name(const dshim_conn_t *c, char *out, size_t len)
{
    char job[32] = "";
    if (c->peer_job != c->peer) {
        snprintf(job, sizeof(job), "job rank %d%s", c->peer_job, c->peer_host ? ", " : "");
    }
    if (c->peer_host) {
        snprintf(out, len, "rank %d (%shost %s, pid %d)", c->peer, job, c->peer_host, c->peer_pid);
    } else if (job[0]) {
        snprintf(out, len, "rank %d (%s)", c->peer, job);
    } else {
        snprintf(out, len, "rank %d", c->peer);
    }
}

/* ---- registry ----------------------------------------------------------- */

int dshim_transport_count(void);
const dshim_transport_t *dshim_transport_at(int index);
/* Registry index of `name` (any case); -1 when there is none. */
int dshim_transport_index(const char *name);
/* Registry index of the transport that reaches every peer (tcp). */
int dshim_transport_fallback(void);
/* "auto, shm, tcp": the values DSHIM_TRANSPORT accepts, for messages. */
void dshim_transport_choices(char *out, size_t len);

/* ---- waiting -----------------------------------------------------------
 * The waiter of a communicator knows the transports in use that have a
 * wake-up of their own.  The engine arms it when its spin ran out (off the
 * hot path: peers then wake it), runs one more round of progress, and when
 * that round moved nothing it lists the connections it is blocked on in a
 * wait set and sleeps on it; it disarms after the sleep, and when the round
 * moved something. */

typedef struct dshim_waiter {
    int n;
    const dshim_transport_t *transport[DSHIM_TRANSPORT_MAX];
    void *state[DSHIM_TRANSPORT_MAX];
    uint32_t armed[DSHIM_TRANSPORT_MAX];
    int is_armed;
} dshim_waiter_t;

#define DSHIM_WAIT_SET_MAX 64

typedef struct dshim_wait_set {
    struct pollfd pfd[DSHIM_WAIT_SET_MAX];
    dshim_conn_t *conn[DSHIM_WAIT_SET_MAX]; /* NULL: a plain descriptor (dshim_wait_set_add_fd) */
    int n;
    int by_socket;      /* entries whose socket itself signals data or room */
    unsigned wake_ups;  /* bit i: a connection of the waiter's transport i is waited on */
} dshim_wait_set_t;

/* Records t (with its per-communicator state) when it has a wake-up of its own. */
void dshim_waiter_add(dshim_waiter_t *w, const dshim_transport_t *t, void *state);

/* Announces this thread as about to sleep (once until disarmed); non-zero
 * when it armed now, 0 when it already was or has no wake-up to arm. */
int dshim_waiter_arm(dshim_waiter_t *w);
/* Withdraws the announcement; nothing when not armed. */
static inline void dshim_waiter_disarm(dshim_waiter_t *w)
{
    if (w->is_armed) {
        for (int i = 0; i < w->n; i++) {
            w->transport[i]->wait_disarm(w->state[i]);
        }
        w->is_armed = 0;
    }
}

void dshim_wait_set_init(dshim_wait_set_t *ws);
static inline int dshim_wait_set_full(const dshim_wait_set_t *ws)
{
    return ws->n >= DSHIM_WAIT_SET_MAX;
}
/* Adds connection c, blocked on sending (room) or on receiving (data). */
void dshim_wait_set_add(dshim_wait_set_t *ws, const dshim_waiter_t *w, dshim_conn_t *c, int sending);
/* Adds a plain descriptor (no connection: a handshake's socket, an
 * eventfd), woken by `events`. */
void dshim_wait_set_add_fd(dshim_wait_set_t *ws, int fd, short events);
/* Sleeps until something in ws may have changed or timeout_ms passed: on
 * the wake-up of a transport that has one (only 1 ms when sockets must be
 * watched too; the waiter must be armed, and a round of progress must have
 * followed the arm), then on the sockets; disarms.  DSHIM_ERR_PEER when a peer whose
 * socket only signals death closed it (or wrote to it). */
dshim_status_t dshim_waiter_sleep(dshim_waiter_t *w, dshim_wait_set_t *ws, int timeout_ms);

#endif

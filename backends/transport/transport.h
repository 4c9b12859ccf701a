/*
 * Transport interface: an ordered, reliable byte stream to one peer.
 *
 * The collective engine (shim/) drives every connection of a communicator
 * from one thread at a time, so implementations need no locking.  All calls
 * are non-blocking: they move what they can and report how much.
 *
 * Contract:
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
 *  - A dead or closed peer: DSHIM_ERR_PEER with a message naming the peer.
 *    Bytes that do not make sense are the engine's business (framing).
 *  - Streams carry only multiples of 8 bytes per message (the engine pads),
 *    so an element of <= 8 bytes never straddles a ring wrap.
 *  - Every connection has `fd`, a TCP socket to the same peer.  For "tcp" it
 *    is the data socket; for "shm" it is an idle control socket that only
 *    serves to notice the peer's death (EOF / POLLHUP) while waiting.
 */
#ifndef DSHIM_TRANSPORT_H
#define DSHIM_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>
#include "dshim.h"

typedef struct dshim_conn dshim_conn_t;

typedef struct dshim_transport_ops {
    const char *name;  /* "tcp" | "shm" */
    dshim_status_t (*send)(dshim_conn_t *c, const void *buf, size_t len, size_t *n_p);
    dshim_status_t (*recv)(dshim_conn_t *c, void *buf, size_t len, size_t *n_p);
    dshim_status_t (*peek)(dshim_conn_t *c, const void **ptr_p, size_t *avail_p);
    dshim_status_t (*consume)(dshim_conn_t *c, size_t n);
    dshim_status_t (*send2)(dshim_conn_t *c, const void *a, size_t alen, const void *b, size_t blen, size_t *n_p);
    dshim_status_t (*recv2)(dshim_conn_t *c, void *a, size_t alen, void *b, size_t blen, size_t *n_p);
    void (*destroy)(dshim_conn_t *c);
} dshim_transport_ops_t;

/* Common head of every connection; implementations embed it first. */
struct dshim_conn {
    const dshim_transport_ops_t *ops;
    int peer;       /* peer rank in the communicator */
    int fd;         /* TCP socket to the peer (data for tcp, control for shm) */
    int is_shm;     /* waiting strategy: 1 = doorbell futex, 0 = poll(fd) */
    uint64_t bytes_sent, bytes_received;
};

/* TCP: takes ownership of a connected, handshaken socket. */
dshim_status_t dshim_tcp_conn_create(int fd, int peer, size_t staging_bytes, dshim_conn_t **conn_p);

#endif

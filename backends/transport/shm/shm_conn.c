/*
 * The "shm" dshim_conn: sends go into ring `my_rank` of the peer's inbox,
 * receives come from ring `peer_rank` of our own inbox.  Every call that
 * moves bytes rings the peer's doorbell (its inbox), since the peer waits on
 * that one bell for both "data arrived" and "space freed".  Also the
 * registry's entry dshim_transport_shm: these per-connection ops plus the
 * per-communicator ones of shm_comm.c.
 */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "net.h"
#include "status.h"
#include "transport/shm/shm_cma.h"
#include "transport/shm/shm_comm.h"
#include "transport/shm/shm_copy.h"
#include "transport/shm/shm_layout.h"

/* Calls without progress between two looks at the control socket: a poll()
 * system call costs about as much as one small message, so looking on every
 * idle call would double the latency of a busy-polling waiter. */
#define SHM_DEATH_CHECK_EVERY 64u

typedef struct shm_conn {
    dshim_conn_t base;  /* first: the engine casts between the two */
    dshim_shm_seg_t *my_inbox;
    dshim_shm_seg_t *peer_inbox;
    dshim_shm_producer_t tx;
    dshim_shm_consumer_t rx;
    unsigned idle_calls;
    size_t stream_min; /* recv_stream copies with streaming stores from this span on (0 = never) */
    pid_t peer_pid;    /* for peer_read and peer_write */
} shm_conn_t;

static dshim_status_t peer_gone(shm_conn_t *sc)
{
    char who[64];
    dshim_conn_peer_name(&sc->base, who, sizeof(who));
    return dshim_error(DSHIM_ERR_PEER, "shm: peer %s closed its control socket (process exited or crashed) while "
                                       "we exchanged data with it",
                       who);
}

/* Called by an operation that moved nothing.  Returns non-zero when the
 * peer is known to be gone. */
static int idle_peer_dead(shm_conn_t *sc)
{
    sc->idle_calls++;
    if (sc->idle_calls % SHM_DEATH_CHECK_EVERY != 0) {
        return 0;
    }
    return dshim_net_hung_up(sc->base.fd);
}

static dshim_status_t shm_send(dshim_conn_t *c, const void *buf, size_t len, size_t *n_p)
{
    shm_conn_t *sc = (shm_conn_t *)c;
    size_t n = dshim_shm_producer_write(&sc->tx, buf, len);
    *n_p = n;
    if (n > 0) {
        sc->idle_calls = 0;
        c->bytes_sent += n;
        dshim_shm_doorbell_ring(sc->peer_inbox);
        return DSHIM_OK;
    }
    if (len > 0 && idle_peer_dead(sc)) {
        return peer_gone(sc);
    }
    return DSHIM_OK;
}

static void after_consume(shm_conn_t *sc, size_t n)
{
    sc->idle_calls = 0;
    sc->base.bytes_received += n;
    dshim_shm_doorbell_ring(sc->peer_inbox);
}

static dshim_status_t shm_recv(dshim_conn_t *c, void *buf, size_t len, size_t *n_p)
{
    shm_conn_t *sc = (shm_conn_t *)c;
    size_t n = dshim_shm_consumer_read(&sc->rx, buf, len);
    *n_p = n;
    if (n > 0) {
        after_consume(sc, n);
        return DSHIM_OK;
    }
    if (len > 0 && idle_peer_dead(sc)) {
        /* Bytes the peer wrote before it went away are still good: deliver
         * them first (its last write may have landed after our first look). */
        n = dshim_shm_consumer_read(&sc->rx, buf, len);
        *n_p = n;
        if (n > 0) {
            after_consume(sc, n);
            return DSHIM_OK;
        }
        return peer_gone(sc);
    }
    return DSHIM_OK;
}

static dshim_status_t shm_peek(dshim_conn_t *c, const void **ptr_p, size_t *avail_p)
{
    shm_conn_t *sc = (shm_conn_t *)c;
    *avail_p = dshim_shm_consumer_peek(&sc->rx, ptr_p);
    if (*avail_p > 0) {
        sc->idle_calls = 0;
        return DSHIM_OK;
    }
    if (idle_peer_dead(sc)) {
        *avail_p = dshim_shm_consumer_peek(&sc->rx, ptr_p);
        if (*avail_p > 0) {
            return DSHIM_OK;
        }
        return peer_gone(sc);
    }
    return DSHIM_OK;
}

static dshim_status_t shm_consume(dshim_conn_t *c, size_t n)
{
    shm_conn_t *sc = (shm_conn_t *)c;
    size_t have = dshim_shm_consumer_cached(&sc->rx);
    if (n > have) {
        return dshim_error(DSHIM_ERR_INVALID, "shm: consume of %zu bytes from peer rank %d but only %zu were "
                                              "peeked", n, c->peer, have);
    }
    if (n == 0) {
        return DSHIM_OK;
    }
    dshim_shm_consumer_release(&sc->rx, n);
    after_consume(sc, n);
    return DSHIM_OK;
}

/* Out of the ring with streaming stores when the destination is too large
 * to stay in cache (shm_copy.h says why). */
static dshim_status_t shm_recv_stream(dshim_conn_t *c, void *buf, size_t len, size_t span, size_t *n_p)
{
    shm_conn_t *sc = (shm_conn_t *)c;
    if (sc->stream_min == 0 || span < sc->stream_min) {
        return shm_recv(c, buf, len, n_p);
    }
    const void *ptr;
    size_t avail;
    DSHIM_CHECK(shm_peek(c, &ptr, &avail));
    size_t n = avail < len ? avail : len;
    *n_p = n;
    if (n) {
        dshim_copy_streaming(buf, ptr, n);
        DSHIM_CHECK(shm_consume(c, n));
    }
    return DSHIM_OK;
}

static int shm_hung_up(dshim_conn_t *c)
{
    return dshim_net_hung_up(c->fd);
}

static dshim_status_t shm_peer_read(dshim_conn_t *c, void *buf, const void *remote, size_t len)
{
    shm_conn_t *sc = (shm_conn_t *)c;
    char who[64];
    dshim_conn_peer_name(c, who, sizeof(who));
    DSHIM_CHECK(dshim_shm_cma_read(sc->peer_pid, who, buf, remote, len));
    c->bytes_received += len;
    return DSHIM_OK;
}

static dshim_status_t shm_peer_write(dshim_conn_t *c, const void *buf, void *remote, size_t len)
{
    shm_conn_t *sc = (shm_conn_t *)c;
    char who[64];
    dshim_conn_peer_name(c, who, sizeof(who));
    DSHIM_CHECK(dshim_shm_cma_write(sc->peer_pid, who, buf, remote, len));
    c->bytes_sent += len;
    return DSHIM_OK;
}

static void shm_destroy(dshim_conn_t *c)
{
    if (c == NULL) {
        return;
    }
    if (c->fd >= 0) {
        close(c->fd);
    }
    free(c);
}

const dshim_transport_t dshim_transport_shm = {
    .name        = "shm",
    .host_local  = 1,
    .setup       = dshim_shm_comm_setup,
    .reaches     = dshim_shm_comm_reaches,
    .connect     = dshim_shm_comm_connect,
    .prepare     = dshim_shm_comm_prepare,
    .reserve     = dshim_shm_comm_reserve,
    .teardown    = dshim_shm_comm_teardown,
    .host_area   = dshim_shm_comm_host_area,
    .peer_reads  = dshim_shm_comm_peer_reads,
    .wait_arm    = dshim_shm_comm_wait_arm,
    .wait        = dshim_shm_comm_wait,
    .wait_disarm = dshim_shm_comm_wait_disarm,
    .send        = shm_send,
    .recv        = shm_recv,
    .peek        = shm_peek,
    .consume     = shm_consume,
    .recv_stream = shm_recv_stream,
    .peer_read   = shm_peer_read,
    .peer_write  = shm_peer_write,
    .hung_up     = shm_hung_up,
    .destroy     = shm_destroy,
};

/* On failure control_fd stays the caller's (it is closed only by destroy). */
dshim_status_t dshim_shm_conn_create(dshim_shm_seg_t *my_inbox, dshim_shm_seg_t *peer_inbox, int my_rank,
                                     int peer_rank, int peer_pid, int control_fd, dshim_conn_t **conn_p)
{
    dshim_shm_ring_t tx_ring, rx_ring;

    *conn_p = NULL;
    if (my_inbox == NULL || peer_inbox == NULL) {
        return dshim_error(DSHIM_ERR_INVALID, "shm: connection to peer rank %d needs both inbox segments",
                           peer_rank);
    }
    if (dshim_shm_seg_ring_size(my_inbox) != dshim_shm_seg_ring_size(peer_inbox)) {
        return dshim_error(DSHIM_ERR_INVALID, "shm: inboxes of rank %d and peer rank %d have different ring "
                                              "sizes (%zu, %zu)", my_rank, peer_rank,
                           dshim_shm_seg_ring_size(my_inbox), dshim_shm_seg_ring_size(peer_inbox));
    }
    DSHIM_CHECK(dshim_shm_seg_ring(peer_inbox, my_rank, &tx_ring));
    DSHIM_CHECK(dshim_shm_seg_ring(my_inbox, peer_rank, &rx_ring));
    shm_conn_t *sc = calloc(1, sizeof(*sc));
    if (sc == NULL) {
        return dshim_error(DSHIM_ERR_NOMEM, "shm: out of memory for the connection to peer rank %d", peer_rank);
    }
    sc->base.ops = &dshim_transport_shm;
    sc->base.peer = peer_rank;
    sc->base.peer_job = peer_rank;
    sc->base.fd = control_fd;
    sc->stream_min = dshim_config()->shm_stream_min;
    sc->my_inbox = my_inbox;
    sc->peer_inbox = peer_inbox;
    sc->peer_pid = peer_pid;
    dshim_shm_producer_init(&sc->tx, &tx_ring);
    dshim_shm_consumer_init(&sc->rx, &rx_ring);
    *conn_p = &sc->base;
    return DSHIM_OK;
}

/*
 * The shm transport in one communicator: this rank's inbox segment, the
 * peers' inboxes (each mapped when the connection to that peer is made, on
 * first use: a rank maps only the inboxes of the peers it talks to) and the
 * doorbell of the inbox, on which the engine sleeps.
 *
 * Rank 0's inbox also holds the host area (transport.h host_area), which
 * the ranks of its host map with that inbox; the others have none (its
 * data blocks would take (N + 1) MiB of /dev/shm's free space from each).
 *
 * The inbox file is removed right after it is created and mapped; its
 * descriptor stays open, and peers open the file through it
 * (/proc/PID/fd/FD, published in the peer record).  Connections are made at
 * any time during the communicator's life, so no moment comes when "every
 * peer mapped it"; removing it at once still means a crash leaves nothing in
 * /dev/shm.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <stdlib.h>
#include <unistd.h>

#include "config.h"
#include "log.h"
#include "status.h"
#include "transport/shm/shm_cma.h"
#include "transport/shm/shm_comm.h"
#include "transport/shm/shm_ring.h"

/* Whether rank r's inbox holds the host area: rank 0's (the one the host
 * gate uses, when every rank is on its host). */
#define SHM_HOLDS_AREA(r) ((r) == 0)
/* The word of a peer record that allows single-copy reads and writes (shm_cma.h). */
#define SHM_CMA_WORD "cma"

typedef struct shm_comm {
    int rank, size;
    char dir[4096];
    size_t ring_size;
    dshim_shm_seg_t *inbox;
    dshim_shm_seg_t **peer_inbox; /* [size], mapped by prepare or connect */
    /* the executor's prepare and the acceptor's connect may map the same
     * peer's inbox at once (shim/comm/bootstrap.c: a simultaneous connect
     * that the other side's connection wins) */
    pthread_mutex_t inbox_lock;
} shm_comm_t;

dshim_status_t dshim_shm_comm_setup(const dshim_transport_comm_t *comm, void **state_p, char *addr,
                                    size_t addr_len)
{
    const dshim_config_t *cfg = dshim_config();
    *state_p = NULL;
    addr[0] = 0;
    shm_comm_t *sc = calloc(1, sizeof(*sc));
    dshim_shm_seg_t **peer_inbox = calloc((size_t)comm->size, sizeof(*peer_inbox));
    if (!sc || !peer_inbox) {
        free(sc);
        free(peer_inbox);
        return dshim_error(DSHIM_ERR_NOMEM, "out of memory for %d peers", comm->size);
    }
    sc->rank = comm->rank;
    sc->size = comm->size;
    snprintf(sc->dir, sizeof(sc->dir), "%s", cfg->shm_dir);
    sc->ring_size = cfg->shm_ring_size;
    sc->peer_inbox = peer_inbox;
    pthread_mutex_init(&sc->inbox_lock, NULL);
    /* pid + communicator hash: unique on this host, and a stale file of a
     * crashed job cannot be adopted (create is O_EXCL) */
    char name[64];
    snprintf(name, sizeof(name), "dshim-%d-%016" PRIx64, (int)getpid(), comm->comm_hash);
    dshim_status_t st =
        dshim_shm_seg_create(sc->dir, name, comm->size, sc->ring_size, SHM_HOLDS_AREA(comm->rank), &sc->inbox);
    if (st != DSHIM_OK) {
        pthread_mutex_destroy(&sc->inbox_lock);
        free(peer_inbox);
        free(sc);
        if (!strcasecmp(cfg->transport, "shm")) {
            /* shm was demanded: no quiet TCP; init fails with this line
             * (where, how much, how to fix) */
            return dshim_error(st, "rank %d: DSHIM_TRANSPORT=shm but %s", comm->rank, dshim_last_error());
        }
        /* The rule that keeps both ends of every pair agreed: a rank without
         * an inbox publishes none (addr ""), and reaches() is false on both
         * ends of a pair where either published none, so this rank talks TCP
         * with every rank of its host, and they with it; the host gate needs
         * every rank's inbox, so no rank of this communicator uses it.  One
         * line per rank that falls back. */
        DSHIM_WARN("rank %d: shared memory unavailable, using TCP between this rank and the others of its host "
                   "(%s)", comm->rank, dshim_last_error());
        return DSHIM_OK;
    }
    if (cfg->shm_cma) {
        dshim_shm_cma_allow();
    }
    /* peers open it through my descriptor from now on (see the top); a
     * fourth word " cma" lets them read and write my memory (peer_reads) */
    dshim_shm_seg_unlink(sc->inbox);
    snprintf(addr, addr_len, "%d %d %s%s", (int)getpid(), dshim_shm_seg_fd(sc->inbox), name,
             cfg->shm_cma ? " " SHM_CMA_WORD : "");
    *state_p = sc;
    return DSHIM_OK;
}

int dshim_shm_comm_reaches(void *state, const dshim_transport_peer_t *peer)
{
    /* a peer without an inbox (its setup found shm unavailable) is reached
     * over TCP from both ends */
    return state != NULL && peer->same_host && peer->addr[0] != 0;
}

/* Maps the peer's inbox once (through its process: /proc/PID/FD); *pid_p
 * (unless NULL): that process. */
static dshim_status_t hold_inbox(shm_comm_t *sc, const dshim_transport_peer_t *peer, int *pid_p)
{
    int pid = -1, seg_fd = -1;
    char name[64] = "";
    if (sscanf(peer->addr, "%d %d %63s", &pid, &seg_fd, name) != 3 || pid <= 0 || seg_fd < 0) {
        return dshim_error(DSHIM_ERR_PROTOCOL, "shm: peer rank %d published the inbox '%s', not 'PID FD NAME': "
                           "two dshim versions in one job?", peer->rank, peer->addr);
    }
    if (pid_p) {
        *pid_p = pid;
    }
    dshim_status_t st = DSHIM_OK;
    pthread_mutex_lock(&sc->inbox_lock);
    if (sc->peer_inbox[peer->rank] == NULL) {
        st = dshim_shm_seg_attach_fd(pid, seg_fd, sc->size, sc->ring_size, SHM_HOLDS_AREA(peer->rank),
                                     &sc->peer_inbox[peer->rank]);
    }
    pthread_mutex_unlock(&sc->inbox_lock);
    if (st != DSHIM_OK) {
        return dshim_error(st, "shm: cannot map the inbox %s of peer rank %d: %s", name, peer->rank,
                           dshim_last_error());
    }
    return DSHIM_OK;
}

int dshim_shm_comm_peer_reads(void *state, const dshim_transport_peer_t *peer)
{
    char word[16] = "";
    return dshim_shm_comm_reaches(state, peer) && sscanf(peer->addr, "%*d %*d %*s %15s", word) == 1 &&
           !strcmp(word, SHM_CMA_WORD);
}

void dshim_shm_comm_prepare(void *state, const dshim_transport_peer_t *peer)
{
    shm_comm_t *sc = state;
    if (sc && dshim_shm_comm_reaches(state, peer)) {
        (void)hold_inbox(sc, peer, NULL); /* a failure is connect's to report */
    }
}

dshim_status_t dshim_shm_comm_reserve(void *state, const dshim_transport_peer_t *peer)
{
    shm_comm_t *sc = state;
    char what[96];
    DSHIM_CHECK(hold_inbox(sc, peer, NULL));
    /* the ring rank `peer` writes into in my inbox, and the one I write into in its */
    snprintf(what, sizeof(what), "a ring between ranks %d and %d", sc->rank, peer->rank);
    DSHIM_CHECK(dshim_shm_seg_reserve_ring(sc->inbox, peer->rank, sc->dir, what));
    return dshim_shm_seg_reserve_ring(sc->peer_inbox[peer->rank], sc->rank, sc->dir, what);
}

dshim_status_t dshim_shm_comm_connect(void *state, const dshim_transport_peer_t *peer, int fd,
                                      dshim_conn_t **conn_p)
{
    shm_comm_t *sc = state;
    int pid;
    DSHIM_CHECK(hold_inbox(sc, peer, &pid));
    /* a failure keeps the mapping until teardown: the host area in it may
     * be in use by the other thread */
    return dshim_shm_conn_create(sc->inbox, sc->peer_inbox[peer->rank], sc->rank, peer->rank, pid, fd, conn_p);
}

dshim_status_t dshim_shm_comm_host_area(void *state, const dshim_transport_peer_t *owner, void **area_p)
{
    shm_comm_t *sc = state;
    *area_p = NULL;
    if (sc == NULL) {
        return dshim_error(DSHIM_ERR_INVALID, "shm: no host area: this rank has no shared memory");
    }
    if (owner->rank == sc->rank) {
        *area_p = dshim_shm_seg_host_area(sc->inbox);
    } else {
        DSHIM_CHECK(hold_inbox(sc, owner, NULL));
        *area_p = dshim_shm_seg_host_area(sc->peer_inbox[owner->rank]);
    }
    if (*area_p == NULL) {
        return dshim_error(DSHIM_ERR_INTERNAL, "shm: rank %d's inbox has no host area (only rank 0's has one)",
                           owner->rank);
    }
    return DSHIM_OK;
}

void dshim_shm_comm_teardown(void *state)
{
    shm_comm_t *sc = state;
    if (!sc) {
        return;
    }
    for (int r = 0; r < sc->size; r++) {
        dshim_shm_seg_detach(sc->peer_inbox[r]);
    }
    dshim_shm_seg_detach(sc->inbox);
    pthread_mutex_destroy(&sc->inbox_lock);
    free(sc->peer_inbox);
    free(sc);
}

uint32_t dshim_shm_comm_wait_arm(void *state)
{
    return dshim_shm_doorbell_arm(((shm_comm_t *)state)->inbox);
}

void dshim_shm_comm_wait_disarm(void *state)
{
    dshim_shm_doorbell_disarm(((shm_comm_t *)state)->inbox);
}

dshim_status_t dshim_shm_comm_wait(void *state, uint32_t armed, long timeout_us)
{
    return dshim_shm_doorbell_wait(((shm_comm_t *)state)->inbox, armed, timeout_us);
}

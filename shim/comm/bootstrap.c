/*
 * Bootstrap of a communicator over an already connected store:
 *  1. listen on the data interface, publish {ip, port, pid, host id, shm inbox}
 *  2. read every peer's record
 *  3. full mesh: connect to lower ranks, accept higher ranks; each connection
 *     starts with a HELLO carrying a hash of the job token and communicator
 *     prefix, so strays and other jobs are rejected (logged, then ignored)
 *  4. shared memory between ranks of one host (unless DSHIM_TRANSPORT=tcp)
 * The listener is closed afterwards: nothing can connect to a running job.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bootstrap.h"
#include "config.h"
#include "net.h"
#include "status.h"
#include "transport/shm/shm_ring.h"

#define HELLO_MAGIC 0x43485344u /* "DSHC" */
#define HELLO_VERSION 1

typedef struct hello {
    uint32_t magic;
    uint32_t version;
    uint64_t token_hash;
    int32_t rank;
    int32_t size;
} hello_t;

uint64_t dshim_token_hash(const char *token, const char *prefix)
{
    /* FNV-1a over token and prefix: not a MAC, but it never puts the token
     * itself on the data wire and binds each connection to one communicator */
    uint64_t h = 1469598103934665603ULL;
    for (const char *p = token; *p; p++) {
        h = (h ^ (unsigned char)*p) * 1099511628211ULL;
    }
    h = (h ^ 0xff) * 1099511628211ULL;
    for (const char *p = prefix; *p; p++) {
        h = (h ^ (unsigned char)*p) * 1099511628211ULL;
    }
    return h;
}

static uint64_t host_id(void)
{
    /* hostname + boot id + network namespace: two network namespaces of one
     * machine act as two hosts (that is how multi-host tests run here) */
    const char *forced = dshim_config()->host_id;
    if (forced[0]) {
        return dshim_token_hash(forced, "forced-host");
    }
    char buf[512] = {0};
    size_t o = 0;
    gethostname(buf, 128);
    o = strlen(buf);
    int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t n = read(fd, buf + o, 64);
        if (n > 0) {
            o += (size_t)n;
        }
        close(fd);
    }
    struct stat st;
    if (stat("/proc/self/ns/net", &st) == 0) {
        o += (size_t)snprintf(buf + o, sizeof(buf) - o, ":%lu", (unsigned long)st.st_ino);
    }
    return dshim_token_hash(buf, "host");
}

dshim_status_t dshim_store_barrier(dshim_store_t *store, const char *prefix, const char *name, int size,
                                   double timeout_s)
{
    char key[256], done[256];
    int64_t v = 0;
    snprintf(key, sizeof(key), "%sbarrier/%s", prefix, name);
    snprintf(done, sizeof(done), "%sbarrier/%s/done", prefix, name);
    DSHIM_CHECK(dshim_store_add(store, key, 1, &v));
    if (v == size) {
        DSHIM_CHECK(dshim_store_set(store, done, "1", 1));
    }
    void *val = NULL;
    size_t len = 0;
    DSHIM_CHECK(dshim_store_get(store, done, timeout_s, &val, &len));
    free(val);
    return DSHIM_OK;
}

static void describe_addr(int fd, char *out, size_t len)
{
    struct sockaddr_in sa;
    socklen_t sl = sizeof(sa);
    char ip[INET_ADDRSTRLEN] = "?";
    if (getpeername(fd, (struct sockaddr *)&sa, &sl) == 0) {
        inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof(ip));
        snprintf(out, len, "%s:%d", ip, ntohs(sa.sin_port));
    } else {
        snprintf(out, len, "?");
    }
}

/* Accepts until every higher rank is connected; rejects strays. */
static dshim_status_t accept_peers(dshim_comm_t *comm, int lfd, uint64_t th, int *fds, double deadline)
{
    int need = comm->size - 1 - comm->rank;
    while (need > 0) {
        double left = deadline - dshim_now();
        if (left <= 0) {
            char missing[256] = "";
            size_t o = 0;
            for (int r = comm->rank + 1; r < comm->size && o + 12 < sizeof(missing); r++) {
                if (fds[r] < 0) {
                    o += (size_t)snprintf(missing + o, sizeof(missing) - o, "%s%d", o ? ", " : "", r);
                }
            }
            return dshim_error(DSHIM_ERR_TIMEOUT,
                               "rank %d: ranks %s did not connect within DSHIM_CONNECT_TIMEOUT (%.0f s); are they "
                               "running, and can they reach %s?",
                               comm->rank, missing, dshim_config()->connect_timeout_s, comm->peers[comm->rank].hostname);
        }
        struct pollfd p = {.fd = lfd, .events = POLLIN};
        int rc = poll(&p, 1, (int)(left * 1000) + 1);
        if (rc <= 0) {
            continue;
        }
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) {
            continue;
        }
        char from[64];
        describe_addr(fd, from, sizeof(from));
        hello_t h;
        double hello_deadline = dshim_now() + 5.0;
        if (hello_deadline > deadline) {
            hello_deadline = deadline;
        }
        const char *why = NULL;
        if (dshim_net_read_full(fd, &h, sizeof(h), hello_deadline) != DSHIM_OK) {
            why = "no complete hello (closed or silent)";
        } else if (h.magic != HELLO_MAGIC || h.version != HELLO_VERSION) {
            why = "not a dshim hello (garbage or another program)";
        } else if (h.token_hash != th) {
            why = "wrong job token (another job, or a stray connection)";
        } else if (h.size != comm->size || h.rank <= comm->rank || h.rank >= comm->size) {
            why = "rank/size do not fit this communicator";
        } else if (fds[h.rank] >= 0) {
            why = "duplicate rank";
        }
        if (why) {
            DSHIM_WARN("rank %d: rejected connection from %s: %s", comm->rank, from, why);
            close(fd);
            continue;
        }
        hello_t reply = {HELLO_MAGIC, HELLO_VERSION, th, comm->rank, comm->size};
        if (dshim_net_write_full(fd, &reply, sizeof(reply), deadline) != DSHIM_OK) {
            DSHIM_WARN("rank %d: peer rank %d (%s) vanished during the handshake", comm->rank, h.rank, from);
            close(fd);
            continue;
        }
        fds[h.rank] = fd;
        need--;
    }
    return DSHIM_OK;
}

static dshim_status_t connect_peer(dshim_comm_t *comm, int r, uint64_t th, double deadline, int *fd_p)
{
    struct in_addr a = {.s_addr = comm->peers[r].ip};
    int fd;
    char who[160];
    dshim_comm_describe_peer(comm, r, who, sizeof(who));
    if (dshim_net_connect(a, comm->peers[r].port, deadline, &fd) != DSHIM_OK) {
        return dshim_error(DSHIM_ERR_PEER, "rank %d: cannot connect to %s: %s", comm->rank, who, dshim_last_error());
    }
    hello_t h = {HELLO_MAGIC, HELLO_VERSION, th, comm->rank, comm->size}, reply;
    if (dshim_net_write_full(fd, &h, sizeof(h), deadline) != DSHIM_OK ||
        dshim_net_read_full(fd, &reply, sizeof(reply), deadline) != DSHIM_OK) {
        close(fd);
        return dshim_error(DSHIM_ERR_PEER, "rank %d: handshake with %s failed: %s", comm->rank, who,
                           dshim_last_error());
    }
    if (reply.magic != HELLO_MAGIC || reply.version != HELLO_VERSION || reply.token_hash != th || reply.rank != r ||
        reply.size != comm->size) {
        close(fd);
        return dshim_error(DSHIM_ERR_PROTOCOL, "rank %d: %s answered with a bad handshake (another job on that port?)",
                           comm->rank, who);
    }
    *fd_p = fd;
    return DSHIM_OK;
}

static int transport_mode(void)
{
    const char *t = dshim_config()->transport;
    if (!strcasecmp(t, "tcp")) {
        return 1;
    }
    if (!strcasecmp(t, "shm")) {
        return 2;
    }
    return 0;
}

void dshim_comm_release(dshim_comm_t *comm)
{
    for (int r = 0; comm->conns && r < comm->size; r++) {
        if (comm->conns[r]) {
            comm->conns[r]->ops->destroy(comm->conns[r]);
        }
        if (comm->peer_inbox && comm->peer_inbox[r]) {
            dshim_shm_seg_detach(comm->peer_inbox[r]);
        }
    }
    if (comm->inbox) {
        dshim_shm_seg_detach(comm->inbox);
    }
    free(comm->peers);
    free(comm->conns);
    free(comm->peer_inbox);
    free(comm->p2p_tx);
    free(comm->p2p_rx);
    free(comm->scratch);
    pthread_mutex_destroy(&comm->lock);
    pthread_cond_destroy(&comm->cond);
    free(comm);
}

dshim_status_t dshim_bootstrap(dshim_store_ref_t *store, const char *prefix, int rank, int size,
                               const char *token, dshim_comm_t **comm_p)
{
    const dshim_config_t *cfg = dshim_config();
    dshim_status_t st = DSHIM_OK;
    int lfd = -1, *fds = NULL;
    const char *t = cfg->transport;
    if (strcasecmp(t, "auto") && strcasecmp(t, "tcp") && strcasecmp(t, "shm")) {
        return dshim_error(DSHIM_ERR_INVALID, "DSHIM_TRANSPORT=%s is not one of auto, shm, tcp", t);
    }
    int mode = transport_mode();
    dshim_comm_t *comm = calloc(1, sizeof(*comm));
    if (!comm) {
        return dshim_error(DSHIM_ERR_NOMEM, "out of memory for a communicator");
    }
    comm->rank = rank;
    comm->size = size;
    comm->owner_pid = dshim_self_pid();
    comm->store = store;
    snprintf(comm->prefix, sizeof(comm->prefix), "%s", prefix);
    pthread_mutex_init(&comm->lock, NULL);
    pthread_cond_init(&comm->cond, NULL);
    comm->peers = calloc((size_t)size, sizeof(*comm->peers));
    comm->conns = calloc((size_t)size, sizeof(*comm->conns));
    comm->peer_inbox = calloc((size_t)size, sizeof(*comm->peer_inbox));
    comm->p2p_tx = calloc((size_t)size, sizeof(uint64_t));
    comm->p2p_rx = calloc((size_t)size, sizeof(uint64_t));
    fds = malloc((size_t)size * sizeof(int));
    if (!comm->peers || !comm->conns || !comm->peer_inbox || !comm->p2p_tx || !comm->p2p_rx || !fds) {
        st = dshim_error(DSHIM_ERR_NOMEM, "out of memory for %d peers", size);
        goto err;
    }
    for (int r = 0; r < size; r++) {
        fds[r] = -1;
    }
    double deadline = dshim_now() + cfg->connect_timeout_s;
    uint64_t th = dshim_token_hash(token, prefix);

    /* 1. publish myself */
    dshim_peer_info_t *me = &comm->peers[rank];
    struct in_addr local;
    char why[256];
    DSHIM_CHECK_GOTO(dshim_net_pick_local_addr(store->addr, &local, why, sizeof(why)), st, err);
    if (size > 1) {
        int port;
        DSHIM_CHECK_GOTO(dshim_net_listen(local, &lfd, &port), st, err);
        me->port = (uint16_t)port;
    }
    me->ip = local.s_addr;
    me->pid = getpid();
    me->host_id = host_id();
    gethostname(me->hostname, sizeof(me->hostname) - 1);
    if (mode != 1 && size > 1) {
        snprintf(me->shm_name, sizeof(me->shm_name), "dshim-%d-%016" PRIx64, (int)getpid(), th);
        st = dshim_shm_seg_create(cfg->shm_dir, me->shm_name, size, cfg->shm_ring_size, &comm->inbox);
        if (st != DSHIM_OK) {
            DSHIM_WARN("rank %d: shared memory unavailable (%s); using TCP between local ranks", rank,
                       dshim_last_error());
            me->shm_name[0] = 0;
            comm->inbox = NULL;
            st = DSHIM_OK;
        }
    }
    char ipbuf[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &local, ipbuf, sizeof(ipbuf));
    DSHIM_INFO("rank %d: data address %s:%d (%s)", rank, ipbuf, me->port, why);
    char key[256];
    snprintf(key, sizeof(key), "%speer/%d", prefix, rank);
    DSHIM_CHECK_GOTO(dshim_store_set(store->store, key, me, sizeof(*me)), st, err);

    /* 2. everyone else */
    for (int r = 0; r < size; r++) {
        if (r == rank) {
            continue;
        }
        void *val = NULL;
        size_t len = 0;
        snprintf(key, sizeof(key), "%speer/%d", prefix, r);
        st = dshim_store_get(store->store, key, deadline - dshim_now(), &val, &len);
        if (st != DSHIM_OK) {
            st = dshim_error(st, "rank %d: rank %d did not join within DSHIM_CONNECT_TIMEOUT (%.0f s): %s", rank, r,
                             cfg->connect_timeout_s, dshim_last_error());
            goto err;
        }
        if (len != sizeof(dshim_peer_info_t)) {
            free(val);
            st = dshim_error(DSHIM_ERR_PROTOCOL, "rank %d: bad peer record for rank %d (%zu bytes): two dshim "
                             "versions in one job?", rank, r, len);
            goto err;
        }
        memcpy(&comm->peers[r], val, sizeof(dshim_peer_info_t));
        free(val);
        comm->peers[r].hostname[sizeof(me->hostname) - 1] = 0;
        comm->peers[r].shm_name[sizeof(me->shm_name) - 1] = 0;
    }

    /* 3. the mesh */
    for (int r = 0; r < rank; r++) {
        DSHIM_CHECK_GOTO(connect_peer(comm, r, th, deadline, &fds[r]), st, err);
    }
    if (size > 1) {
        DSHIM_CHECK_GOTO(accept_peers(comm, lfd, th, fds, deadline), st, err);
        close(lfd);
        lfd = -1;
    }

    /* 4. transports */
    comm->nlocal = 1;
    for (int r = 0; r < size; r++) {
        if (r == rank) {
            continue;
        }
        int same_host = comm->peers[r].host_id == me->host_id;
        comm->nlocal += same_host;
        dshim_net_tune(fds[r], cfg->socket_bufsize);
        dshim_net_set_nonblocking(fds[r], 1);
        if (mode == 2 && !same_host) {
            char who[160];
            dshim_comm_describe_peer(comm, r, who, sizeof(who));
            st = dshim_error(DSHIM_ERR_INVALID, "DSHIM_TRANSPORT=shm but %s is on another host; use auto or tcp", who);
            goto err;
        }
        if (same_host && comm->inbox && comm->peers[r].shm_name[0]) {
            st = dshim_shm_seg_attach(cfg->shm_dir, comm->peers[r].shm_name, size, cfg->shm_ring_size,
                                      &comm->peer_inbox[r]);
            if (st == DSHIM_OK) {
                st = dshim_shm_conn_create(comm->inbox, comm->peer_inbox[r], rank, r, fds[r], &comm->conns[r]);
            }
            if (st != DSHIM_OK) {
                goto err;
            }
            fds[r] = -1;
            comm->any_shm = 1;
        } else {
            /* on this host even when host ids differ (DSHIM_HOST_ID) */
            int local = same_host || comm->peers[r].ip == me->ip || (ntohl(comm->peers[r].ip) >> 24) == 127;
            dshim_net_set_cc(fds[r], local);
            DSHIM_CHECK_GOTO(dshim_tcp_conn_create(fds[r], r, 256 * 1024, &comm->conns[r]), st, err);
            fds[r] = -1;
            comm->any_tcp = 1;
        }
    }
    if (mode != 1 && size > 1) {
        /* every peer mapped my inbox: the file can go, so a crash leaves
         * nothing in /dev/shm.  Every rank joins the barrier, even one whose
         * own segment could not be created, or the others would wait. */
        DSHIM_CHECK_GOTO(dshim_store_barrier(store->store, prefix, "shm", size, deadline - dshim_now()), st, err);
        if (comm->inbox) {
            dshim_shm_seg_unlink(comm->inbox);
        }
    }
    free(fds);
    *comm_p = comm;
    return DSHIM_OK;

err:
    if (lfd >= 0) {
        close(lfd);
    }
    if (fds) {
        for (int r = 0; r < size; r++) {
            if (fds[r] >= 0) {
                close(fds[r]);
            }
        }
        free(fds);
    }
    if (comm->inbox) {
        dshim_shm_seg_unlink(comm->inbox);
    }
    dshim_comm_release(comm);
    return st;
}

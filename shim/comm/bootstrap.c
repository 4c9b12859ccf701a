/*
 * Bootstrap of a communicator over an already connected store:
 *  1. listen on the data interface, publish {ip, port, pid, host id, what each
 *     transport's setup publishes (shm: its inbox)}
 *  2. read every peer's record
 *  3. full mesh: connect to lower ranks, accept higher ranks; each connection
 *     starts with a HELLO carrying a hash of the job token and communicator
 *     prefix, so strays and other jobs are rejected (logged, then ignored)
 *  4. one connection per peer through the transport the rule picks
 *     (DSHIM_TRANSPORT; see transport.h "Registry"), over that socket
 * The listener is closed afterwards: nothing can connect to a running job.
 * Transports take part through their ops only: setup before the record is
 * published, connect per peer, a store barrier and `connected` afterwards.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
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

/* The registry entries DSHIM_TRANSPORT allows (bit i = entry i): every one
 * for "auto", else the one named; *named_p says which of the two. */
static dshim_status_t allowed_transports(unsigned *allowed_p, int *named_p)
{
    const char *t = dshim_config()->transport;
    *named_p = 0;
    if (!strcasecmp(t, "auto")) {
        *allowed_p = (1u << dshim_transport_count()) - 1;
        return DSHIM_OK;
    }
    int i = dshim_transport_index(t);
    if (i < 0) {
        char choices[128];
        dshim_transport_choices(choices, sizeof(choices));
        return dshim_error(DSHIM_ERR_INVALID, "DSHIM_TRANSPORT=%s is not one of %s", t, choices);
    }
    *allowed_p = 1u << i;
    *named_p = 1;
    return DSHIM_OK;
}

/* Step 1 for each allowed transport with a setup: its state, and what it
 * publishes in my record. */
static dshim_status_t setup_transports(dshim_comm_t *comm, unsigned allowed, uint64_t th, dshim_peer_info_t *me)
{
    dshim_transport_comm_t tc = {.rank = comm->rank, .size = comm->size, .comm_hash = th};
    for (int i = 0; i < dshim_transport_count(); i++) {
        const dshim_transport_t *t = dshim_transport_at(i);
        if ((allowed & (1u << i)) && t->setup) {
            DSHIM_CHECK(t->setup(&tc, &comm->transport_state[i], me->transport_addr[i], sizeof(me->transport_addr[i])));
        }
    }
    return DSHIM_OK;
}

/* The registry entry that carries the connection to peer pv->rank: the
 * first allowed one that reaches it, else the fallback.  A host-local
 * transport named by DSHIM_TRANSPORT with a peer elsewhere is an error. */
static dshim_status_t pick_transport(dshim_comm_t *comm, unsigned allowed, int named, dshim_transport_peer_t *pv,
                                     int *index_p)
{
    for (int i = 0; i < dshim_transport_count(); i++) {
        const dshim_transport_t *t = dshim_transport_at(i);
        if (!(allowed & (1u << i))) {
            continue;
        }
        if (t->host_local && !pv->same_host) {
            if (named) {
                char who[160];
                dshim_comm_describe_peer(comm, pv->rank, who, sizeof(who));
                return dshim_error(DSHIM_ERR_INVALID, "DSHIM_TRANSPORT=%s but %s is on another host; use auto or tcp",
                                   t->name, who);
            }
            continue;
        }
        pv->addr = comm->peers[pv->rank].transport_addr[i];
        if (!t->reaches || t->reaches(comm->transport_state[i], pv)) {
            *index_p = i;
            return DSHIM_OK;
        }
    }
    *index_p = dshim_transport_fallback();
    pv->addr = comm->peers[pv->rank].transport_addr[*index_p];
    return DSHIM_OK;
}

/* "shm+tcp": the transports that carry a connection, in registry order. */
static void describe_transports(dshim_comm_t *comm)
{
    size_t o = 0;
    comm->transport_desc[0] = 0;
    for (int i = 0; i < dshim_transport_count(); i++) {
        if (comm->transports_used & (1u << i)) {
            o += (size_t)snprintf(comm->transport_desc + o, sizeof(comm->transport_desc) - o, "%s%s", o ? "+" : "",
                                  dshim_transport_at(i)->name);
        }
    }
    if (!comm->transport_desc[0]) {
        snprintf(comm->transport_desc, sizeof(comm->transport_desc), "self");
    }
}

/* Step 4: the connection to every peer, through the transport the rule
 * picks, over the handshaken socket fds[r] (which it then owns: -1). */
static dshim_status_t connect_transports(dshim_comm_t *comm, unsigned allowed, int named, int *fds)
{
    const dshim_peer_info_t *me = &comm->peers[comm->rank];
    comm->nlocal = 1;
    for (int r = 0; r < comm->size; r++) {
        if (r == comm->rank) {
            continue;
        }
        dshim_transport_peer_t pv = {.rank = r, .same_host = comm->peers[r].host_id == me->host_id,
                                     .ip = comm->peers[r].ip, .my_ip = me->ip, .addr = ""};
        comm->nlocal += pv.same_host;
        dshim_net_set_nonblocking(fds[r], 1);
        int i = -1;
        DSHIM_CHECK(pick_transport(comm, allowed, named, &pv, &i));
        DSHIM_CHECK(dshim_transport_at(i)->connect(comm->transport_state[i], &pv, fds[r], &comm->conns[r]));
        fds[r] = -1;
        comm->transports_used |= 1u << i;
    }
    return DSHIM_OK;
}

/* After every connection: each allowed transport that asks for it learns
 * (through a store barrier) that every rank connected; then the waiter
 * learns the transports in use, and the communicator their names. */
static dshim_status_t transports_connected(dshim_comm_t *comm, unsigned allowed, double deadline)
{
    for (int i = 0; i < dshim_transport_count() && comm->size > 1; i++) {
        const dshim_transport_t *t = dshim_transport_at(i);
        if (!(allowed & (1u << i)) || !t->connected) {
            continue;
        }
        /* every rank that set the transport up joins, even one whose setup
         * found it unavailable, or the others would wait */
        DSHIM_CHECK(dshim_store_barrier(comm->store->store, comm->prefix, t->name, comm->size, deadline - dshim_now()));
        if (comm->transport_state[i]) {
            t->connected(comm->transport_state[i]);
        }
    }
    for (int i = 0; i < dshim_transport_count(); i++) {
        if (comm->transports_used & (1u << i)) {
            dshim_waiter_add(&comm->waiter, dshim_transport_at(i), comm->transport_state[i]);
        }
    }
    describe_transports(comm);
    return DSHIM_OK;
}

void dshim_comm_release(dshim_comm_t *comm)
{
    for (int r = 0; comm->conns && r < comm->size; r++) {
        if (comm->conns[r]) {
            comm->conns[r]->ops->destroy(comm->conns[r]);
        }
    }
    /* after the connections: they may point into a transport's state */
    for (int i = 0; i < dshim_transport_count(); i++) {
        const dshim_transport_t *t = dshim_transport_at(i);
        if (comm->transport_state[i] && t->teardown) {
            t->teardown(comm->transport_state[i]);
        }
    }
    free(comm->peers);
    free(comm->conns);
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
    unsigned allowed = 0;
    int named = 0;
    DSHIM_CHECK(allowed_transports(&allowed, &named));
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
    comm->p2p_tx = calloc((size_t)size, sizeof(uint64_t));
    comm->p2p_rx = calloc((size_t)size, sizeof(uint64_t));
    fds = malloc((size_t)size * sizeof(int));
    /* before the first goto err: err closes every fds[r] >= 0, and fresh
     * memory holds zeros, i.e. stdin */
    for (int r = 0; fds && r < size; r++) {
        fds[r] = -1;
    }
    if (!comm->peers || !comm->conns || !comm->p2p_tx || !comm->p2p_rx || !fds) {
        st = dshim_error(DSHIM_ERR_NOMEM, "out of memory for %d peers", size);
        goto err;
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
    if (size > 1) {
        DSHIM_CHECK_GOTO(setup_transports(comm, allowed, th, me), st, err);
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
        if (st == DSHIM_ERR_PEER) {
            /* a failure reported in the store, or the store itself gone:
             * the message names it; the timeout is beside the point */
            st = dshim_error(st, "rank %d: while waiting for rank %d to join: %s", rank, r, dshim_last_error());
            goto err;
        }
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
        for (int i = 0; i < DSHIM_TRANSPORT_MAX; i++) {
            comm->peers[r].transport_addr[i][DSHIM_TRANSPORT_ADDR_LEN - 1] = 0;
        }
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
    DSHIM_CHECK_GOTO(connect_transports(comm, allowed, named, fds), st, err);
    DSHIM_CHECK_GOTO(transports_connected(comm, allowed, deadline), st, err);
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
    dshim_comm_release(comm);
    return st;
}

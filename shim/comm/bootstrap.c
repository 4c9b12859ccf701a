/*
 * Bootstrap of a communicator over an already connected store, and its
 * connections, which are made on first use of a peer (as NCCL, gloo and UCX
 * connect lazily): ring, recursive doubling and hierarchical allreduce talk
 * to O(log N) peers, and a full mesh at init would cost every rank N-1
 * sockets and N mapped inboxes.
 *
 * At init:
 *  1. listen on the data interface, publish {ip, port, pid, host id, what each
 *     transport's setup publishes (shm: how to open its inbox)}
 *  2. read every peer's record (N-1 store requests per rank): the host ids
 *     give nlocal and the hierarchy, and each pair's transport is known
 *     without asking anyone
 *  3. start the acceptor thread; the listener stays open for the
 *     communicator's life, and nothing else is connected
 * On first use of peer r (xfer.c, through dshim_comm_connect_start/poll, in
 * the executing thread and without blocking it):
 *  - TCP connect to r's listener, HELLO {magic, version, hash of the job
 *    token and the communicator prefix, rank, size}; the acceptor of r
 *    checks it (strays and other jobs are rejected: logged, then ignored)
 *    and answers {its own HELLO, answer}
 *  - OK: both ends make the connection through the transport the rule picks
 *    (DSHIM_TRANSPORT; transport.h "Registry") over that socket; the
 *    acceptor publishes its end right after it answered (the answer is the
 *    last handshake byte on the socket: data may follow it at once).  Before
 *    it connects, the acceptor secures what the pair will use (transport.h
 *    "reserve": shm's two rings); when that fails, its answer says
 *    "fallback" and both ends connect through the fallback transport (tcp)
 * Simultaneous connects (r and q each need the other at the same moment):
 * the connection begun by the lower rank wins.  The acceptor of the lower
 * rank, finding its own handshake with that peer under way, answers LOSE;
 * the higher rank's acceptor takes the lower rank's connection as usual
 * (its own state is only CONNECTING), and the higher rank's executor, told
 * LOSE, waits for that connection to be published.  Decisions and
 * publishing happen under conn_lock, so each pair ends with one connection.
 * A communicator that failed answers FAILED: a peer connecting late learns
 * of the failure at once instead of waiting for data that never comes.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bootstrap.h"
#include "coll.h"
#include "config.h"
#include "host_gate.h"
#include "net.h"
#include "status.h"

#define HELLO_MAGIC 0x43485344u /* "DSHC" */
#define HELLO_VERSION 3           /* 3: the answer says whether the pair takes the fallback transport */

typedef struct hello {
    uint32_t magic;
    uint32_t version;
    uint64_t token_hash;
    int32_t rank;
    int32_t size;
} hello_t;

/* What the acceptor answers to a HELLO: its own HELLO and one of these. */
enum {
    ANSWER_OK = 0,     /* this socket is the connection from now on */
    ANSWER_LOSE = 1,   /* simultaneous connect: mine (the lower rank's) wins; wait for it */
    ANSWER_HAVE = 2,   /* already connected (a connection of mine was accepted): wait for it */
    ANSWER_FAILED = 3, /* my communicator failed */
    ANSWER_ERROR = 4,  /* I could not make the connection (my log says why) */
};

typedef struct hello_reply {
    hello_t hello;
    int32_t answer;
    int32_t fallback; /* with OK: 1 = the accepting end could not reserve what the picked transport
                       * needs (transport.h "reserve"), both ends connect through the fallback */
} hello_reply_t;

/* A handshake this rank began (comm->pending[r], executor only). */
enum { PC_IDLE = 0, PC_CONNECT, PC_SEND, PC_REPLY, PC_WAIT_WINNER };
typedef struct dshim_pending_conn {
    int phase;
    int fd;
    size_t off;
    hello_t hello;
    hello_reply_t reply;
} dshim_pending_conn_t;

/* Bound on reading a HELLO from a fresh connection: a silent or slow
 * stranger holds the acceptor up that long at most. */
#define HELLO_READ_S 5.0

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


/* The peer view pick_transport and connect need. */
static dshim_transport_peer_t peer_view(const dshim_comm_t *comm, int r)
{
    const dshim_peer_info_t *me = &comm->peers[comm->rank];
    dshim_transport_peer_t pv = {.rank = r, .same_host = comm->peers[r].host_id == me->host_id,
                                 .ip = comm->peers[r].ip, .my_ip = me->ip, .addr = ""};
    return pv;
}

/* The connection to peer r over the handshaken socket fd (owned by the
 * connection on success), through the transport the rule picks, or the
 * fallback when the accepting end said so; both ends pick the same one from
 * the same records and the answer. */
static dshim_status_t make_conn(dshim_comm_t *comm, int r, int fd, int fallback, dshim_conn_t **conn_p)
{
    dshim_transport_peer_t pv = peer_view(comm, r);
    int i = -1;
    DSHIM_CHECK(pick_transport(comm, comm->transports_allowed, comm->transport_named, &pv, &i));
    if (fallback) {
        i = dshim_transport_fallback();
        pv.addr = comm->peers[r].transport_addr[i];
    }
    dshim_net_set_nonblocking(fd, 1);
    return dshim_transport_at(i)->connect(comm->transport_state[i], &pv, fd, conn_p);
}

/* The accepting end, before it connects: what the pair's connection needs,
 * secured (transport.h "reserve").  *fallback_p = 1 when it could not be and
 * the fallback transport may carry the pair instead (one warning per
 * communicator); an error when DSHIM_TRANSPORT named the transport or the
 * fallback is not allowed.  conn_lock held (acceptor). */
static dshim_status_t reserve_pair(dshim_comm_t *comm, int r, int *fallback_p)
{
    dshim_transport_peer_t pv = peer_view(comm, r);
    int i = -1;
    *fallback_p = 0;
    DSHIM_CHECK(pick_transport(comm, comm->transports_allowed, comm->transport_named, &pv, &i));
    const dshim_transport_t *t = dshim_transport_at(i);
    if (!t->reserve || t->reserve(comm->transport_state[i], &pv) == DSHIM_OK) {
        return DSHIM_OK;
    }
    int fb = dshim_transport_fallback();
    char cause[768];
    snprintf(cause, sizeof(cause), "%s", dshim_last_error());
    if (comm->transport_named || !(comm->transports_allowed & (1u << fb))) {
        return dshim_error(DSHIM_ERR_SYSTEM, "rank %d: DSHIM_TRANSPORT=%s but the connection with rank %d cannot "
                           "have it: %s", comm->rank, t->name, r, cause);
    }
    if (!comm->reserve_warned) {
        comm->reserve_warned = 1;
        DSHIM_WARN("rank %d: %s; rank %d and this rank use %s instead (and so does every further pair this "
                   "rank accepts that cannot have %s; this line is not repeated)", comm->rank, cause, r,
                   dshim_transport_at(fb)->name, t->name);
    }
    *fallback_p = 1;
    return DSHIM_OK;
}

/* Publishes the connection to r.  conn_lock held. */
static void publish_conn(dshim_comm_t *comm, int r, dshim_conn_t *conn)
{
    conn->peer_job = comm->job_rank ? comm->job_rank[r] : r; /* for the transport's messages */
    conn->peer_host = comm->peers[r].hostname;
    conn->peer_pid = comm->peers[r].pid;
    __atomic_store_n(&comm->conns[r], conn, __ATOMIC_RELEASE);
    comm->conn_state[r] = DSHIM_CONN_READY;
    __atomic_add_fetch(&comm->nconnects, 1, __ATOMIC_RELEASE);
    if (comm->conn_event >= 0) {
        uint64_t one = 1;
        /* a full counter (2^64 - 2 events) cannot happen; either way the
         * reader is awake */
        ssize_t w = write(comm->conn_event, &one, sizeof(one));
        (void)w;
    }
}

static int comm_failed(const dshim_comm_t *comm)
{
    return __atomic_load_n(&comm->error, __ATOMIC_ACQUIRE) != DSHIM_OK;
}

/* One connection to the listener: the HELLO checked, then answered.
 * Takes fd. */
static void answer_hello(dshim_comm_t *comm, int fd)
{
    char from[64];
    describe_addr(fd, from, sizeof(from));
    hello_t h;
    const char *why = NULL;
    if (dshim_net_read_full(fd, &h, sizeof(h), dshim_now() + HELLO_READ_S) != DSHIM_OK) {
        why = "no complete hello (closed or silent)";
    } else if (h.magic != HELLO_MAGIC) {
        why = "not a dshim hello (garbage or another program)";
    } else if (h.token_hash != comm->hello_hash) {
        why = "wrong job token (another job, or a stray connection)";
    } else if (h.version != HELLO_VERSION) {
        why = "another dshim version (its handshake differs): one dshim build per job";
    } else if (h.size != comm->size || h.rank < 0 || h.rank >= comm->size || h.rank == comm->rank) {
        why = "rank/size do not fit this communicator";
    }
    if (why) {
        DSHIM_WARN("rank %d: rejected connection from %s: %s", comm->rank, from, why);
        close(fd);
        return;
    }
    int r = h.rank;
    hello_reply_t reply = {{HELLO_MAGIC, HELLO_VERSION, comm->hello_hash, comm->rank, comm->size}, ANSWER_OK, 0};
    dshim_conn_t *conn = NULL;
    pthread_mutex_lock(&comm->conn_lock);
    if (comm_failed(comm)) {
        reply.answer = ANSWER_FAILED;
    } else if (comm->conn_state[r] == DSHIM_CONN_READY) {
        reply.answer = ANSWER_HAVE;
    } else if (comm->conn_state[r] == DSHIM_CONN_CONNECTING && comm->rank < r) {
        /* both began: the lower rank's connection (mine) wins */
        reply.answer = ANSWER_LOSE;
    } else if (reserve_pair(comm, r, &reply.fallback) != DSHIM_OK ||
               make_conn(comm, r, fd, reply.fallback, &conn) != DSHIM_OK) {
        DSHIM_WARN("rank %d: cannot make the connection rank %d asked for: %s", comm->rank, r, dshim_last_error());
        reply.answer = ANSWER_ERROR;
    }
    /* the answer goes out before the connection is published: once it is,
     * the executor may write data behind it */
    dshim_status_t st = dshim_net_write_full(fd, &reply, sizeof(reply), dshim_now() + HELLO_READ_S);
    if (reply.answer == ANSWER_OK && st == DSHIM_OK) {
        publish_conn(comm, r, conn);
    } else if (conn) {
        conn->ops->destroy(conn); /* closes fd */
        fd = -1;
    }
    pthread_mutex_unlock(&comm->conn_lock);
    if (reply.answer == ANSWER_OK && st != DSHIM_OK) {
        DSHIM_WARN("rank %d: rank %d (%s) vanished during the handshake", comm->rank, r, from);
    }
    if (reply.answer != ANSWER_OK && fd >= 0) {
        close(fd);
    }
}

/* The acceptor: answers handshakes for the communicator's life, whatever its
 * rank does meanwhile (computing, or waiting in an operation with others). */
static void *acceptor_main(void *arg)
{
    dshim_comm_t *comm = arg;
    dshim_log_set_rank(comm->rank);
    while (1) {
        struct pollfd p[2] = {{.fd = comm->listen_fd, .events = POLLIN}, {.fd = comm->acceptor_wake, .events = POLLIN}};
        int rc = poll(p, 2, -1);
        if (rc < 0 && errno != EINTR) {
            DSHIM_WARN("rank %d: the data listener's poll failed: %s; no more peers can connect", comm->rank,
                       strerror(errno));
            return NULL;
        }
        if (rc <= 0) {
            continue;
        }
        if (p[1].revents) {
            return NULL;
        }
        if (p[0].revents & (POLLERR | POLLNVAL)) {
            return NULL;
        }
        int fd = accept4(comm->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) {
            int err = errno;
            char who[256];
            snprintf(who, sizeof(who), "rank %d (host %s, pid %d): its data listener cannot accept a connection",
                     comm->rank, comm->peers[comm->rank].hostname, (int)getpid());
            if (dshim_net_out_of_fds(err, who)) {
                /* The peer knocking can never be answered, and the listener
                 * stays readable (retrying spun a core): hand the one line
                 * naming EMFILE to this rank's executor, which fails the
                 * communicator with it at once (xfer.c: then the peers
                 * learn of it through its abort key and shut connections),
                 * and wake it (conn_event); then look again only every
                 * second, to answer whoever gets through. */
                if (!__atomic_load_n(&comm->acceptor_failed, __ATOMIC_ACQUIRE)) {
                    snprintf(comm->acceptor_errmsg, sizeof(comm->acceptor_errmsg), "%s", dshim_last_error());
                    __atomic_store_n(&comm->acceptor_failed, 1, __ATOMIC_RELEASE);
                    DSHIM_WARN("%s", comm->acceptor_errmsg);
                    uint64_t one = 1;
                    ssize_t wr = write(comm->conn_event, &one, sizeof(one));
                    (void)wr; /* an executor sleeping longer looks within 100 ms */
                }
                struct pollfd w = {.fd = comm->acceptor_wake, .events = POLLIN};
                if (poll(&w, 1, 1000) > 0) {
                    return NULL;
                }
            }
            continue; /* a connection reset before accept, ...: the peer retries or reports */
        }
        answer_hello(comm, fd);
    }
}

static void pending_reset(dshim_comm_t *comm, int r)
{
    dshim_pending_conn_t *pc = &comm->pending[r];
    if (pc->fd >= 0) {
        close(pc->fd);
    }
    if (pc->phase != PC_IDLE) {
        comm->npending--;
    }
    memset(pc, 0, sizeof(*pc));
    pc->fd = -1;
    pc->phase = PC_IDLE;
}

/* A begun handshake failed: back to "not connected" (a later operation
 * would try again; in practice the step fails the communicator). */
static dshim_status_t pending_fail(dshim_comm_t *comm, int r)
{
    pending_reset(comm, r);
    pthread_mutex_lock(&comm->conn_lock);
    if (comm->conn_state[r] == DSHIM_CONN_CONNECTING) {
        comm->conn_state[r] = DSHIM_CONN_NONE;
    }
    pthread_mutex_unlock(&comm->conn_lock);
    return DSHIM_ERR_PEER;
}

/* My handshake with r failed, but r's own connection may have been published
 * meanwhile by the acceptor: r connected too, won, sent what it had, finished
 * and exited, and its closed listener reset my attempt (a zero-byte send test
 * failed that way, 1 in ~100 runs).  That connection still carries what r
 * sent, so this failure is not one.  Taking conn_lock waits for an acceptor
 * between its answer and the publication (it holds the lock across both). */
static int peer_published_meanwhile(dshim_comm_t *comm, int r)
{
    pthread_mutex_lock(&comm->conn_lock);
    int ready = comm->conn_state[r] == DSHIM_CONN_READY;
    pthread_mutex_unlock(&comm->conn_lock);
    if (ready) {
        pending_reset(comm, r);
    }
    return ready;
}

void dshim_comm_connect_cancel(dshim_comm_t *comm, int r)
{
    if (comm->pending && comm->pending[r].phase != PC_IDLE) {
        (void)pending_fail(comm, r);
    }
}

dshim_status_t dshim_comm_connect_start(dshim_comm_t *comm, int r)
{
    if (dshim_comm_conn(comm, r) || comm->pending[r].phase != PC_IDLE) {
        return DSHIM_OK;
    }
    pthread_mutex_lock(&comm->conn_lock);
    int state = comm->conn_state[r];
    if (state == DSHIM_CONN_NONE) {
        comm->conn_state[r] = DSHIM_CONN_CONNECTING;
    }
    pthread_mutex_unlock(&comm->conn_lock);
    if (state != DSHIM_CONN_NONE) {
        return DSHIM_OK; /* published meanwhile by the acceptor */
    }
    dshim_pending_conn_t *pc = &comm->pending[r];
    char who[160];
    dshim_comm_describe_peer(comm, r, who, sizeof(who));
    /* before the handshake: once the peer answers it may send, finish and
     * exit before this side makes the connection, and what only its process
     * holds (shm: the inbox) would be gone (a torch test sends one message
     * and exits at once) */
    dshim_transport_peer_t pv = peer_view(comm, r);
    int ti = -1;
    if (pick_transport(comm, comm->transports_allowed, comm->transport_named, &pv, &ti) == DSHIM_OK &&
        dshim_transport_at(ti)->prepare) {
        dshim_transport_at(ti)->prepare(comm->transport_state[ti], &pv);
    }
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        int err = errno;
        pending_fail(comm, r);
        char what[320];
        snprintf(what, sizeof(what), "cannot connect to %s: socket", who);
        if (dshim_net_out_of_fds(err, what)) {
            return DSHIM_ERR_SYSTEM; /* the line says EMFILE and the limit */
        }
        return dshim_error_quiet(DSHIM_ERR_SYSTEM, "cannot connect to %s: socket: %s", who, strerror(err));
    }
    pc->fd = fd;
    pc->hello = (hello_t){HELLO_MAGIC, HELLO_VERSION, comm->hello_hash, comm->rank, comm->size};
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(comm->peers[r].port),
                             .sin_addr = {.s_addr = comm->peers[r].ip}};
    int rc = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
    int err = errno;
    pc->phase = rc == 0 ? PC_SEND : PC_CONNECT;
    comm->npending++;
    if (rc != 0 && err != EINPROGRESS && err != EINTR) {
        if (peer_published_meanwhile(comm, r)) {
            return DSHIM_OK;
        }
        pending_fail(comm, r);
        char ip[INET_ADDRSTRLEN];
        inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof(ip));
        /* its listener is open for its communicator's life: refused means
         * the process is gone */
        return dshim_error_quiet(DSHIM_ERR_PEER, "cannot connect to %s at %s:%d: %s%s", who, ip, comm->peers[r].port,
                                 strerror(err),
                                 err == ECONNREFUSED ? " (its process exited, crashed or was killed)" : "");
    }
    return DSHIM_OK;
}

/* Where a handshake in progress stands after one look: finished (done),
 * or waiting for fd to be ready for events, or moving on to the next phase
 * now (neither). */
typedef struct connect_look {
    int *done_p;
    int *fd_p;
    short *events_p;
} connect_look_t;

static dshim_status_t look_wait(const connect_look_t *lk, int fd, short events, int *stop)
{
    *lk->fd_p = fd;
    *lk->events_p = events;
    *stop = 1;
    return DSHIM_OK;
}

static dshim_status_t look_done(const connect_look_t *lk, int *stop)
{
    *lk->done_p = 1;
    *stop = 1;
    return DSHIM_OK;
}

/* PC_CONNECT: the non-blocking connect completes, or fails naming the peer. */
static dshim_status_t poll_connect(dshim_comm_t *comm, int r, const connect_look_t *lk, int *stop)
{
    dshim_pending_conn_t *pc = &comm->pending[r];
    struct pollfd p = {.fd = pc->fd, .events = POLLOUT};
    if (poll(&p, 1, 0) <= 0) {
        return look_wait(lk, pc->fd, POLLOUT, stop);
    }
    int err = 0;
    socklen_t el = sizeof(err);
    getsockopt(pc->fd, SOL_SOCKET, SO_ERROR, &err, &el);
    if (err && peer_published_meanwhile(comm, r)) {
        return look_done(lk, stop);
    }
    if (err) {
        char who[160], ip[INET_ADDRSTRLEN];
        dshim_comm_describe_peer(comm, r, who, sizeof(who));
        struct in_addr a = {.s_addr = comm->peers[r].ip};
        inet_ntop(AF_INET, &a, ip, sizeof(ip));
        pending_fail(comm, r);
        *stop = 1;
        return dshim_error_quiet(DSHIM_ERR_PEER, "cannot connect to %s at %s:%d: %s%s", who, ip,
                                 comm->peers[r].port, strerror(err),
                                 err == ECONNREFUSED ? " (its process exited, crashed or was killed)" : "");
    }
    pc->phase = PC_SEND;
    pc->off = 0;
    return DSHIM_OK;
}

/* PC_SEND: this rank's HELLO goes out, in as many pieces as the socket takes. */
static dshim_status_t poll_send_hello(dshim_comm_t *comm, int r, const connect_look_t *lk, int *stop)
{
    dshim_pending_conn_t *pc = &comm->pending[r];
    ssize_t n = send(pc->fd, (char *)&pc->hello + pc->off, sizeof(pc->hello) - pc->off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        int err = errno;
        if (peer_published_meanwhile(comm, r)) {
            return look_done(lk, stop);
        }
        char who[160];
        dshim_comm_describe_peer(comm, r, who, sizeof(who));
        pending_fail(comm, r);
        *stop = 1;
        return dshim_error_quiet(DSHIM_ERR_PEER, "handshake with %s failed: %s", who, strerror(err));
    }
    pc->off += n > 0 ? (size_t)n : 0;
    if (pc->off < sizeof(pc->hello)) {
        return look_wait(lk, pc->fd, POLLOUT, stop);
    }
    pc->phase = PC_REPLY;
    pc->off = 0;
    return DSHIM_OK;
}

/* A whole reply: OK makes the connection, LOSE / HAVE leave it to the
 * acceptor (the peer's own connection is, or will be, published there),
 * anything else fails naming the peer. */
static dshim_status_t take_reply(dshim_comm_t *comm, int r, const connect_look_t *lk, int *stop)
{
    dshim_pending_conn_t *pc = &comm->pending[r];
    const hello_t *h = &pc->reply.hello;
    char who[160];
    dshim_comm_describe_peer(comm, r, who, sizeof(who));
    if (h->magic != HELLO_MAGIC || h->version != HELLO_VERSION || h->token_hash != comm->hello_hash ||
        h->rank != r || h->size != comm->size) {
        pending_fail(comm, r);
        *stop = 1;
        return dshim_error_quiet(DSHIM_ERR_PROTOCOL,
                                 "%s answered with a bad handshake (another job on that port, or another "
                                 "dshim version?)", who);
    }
    int answer = pc->reply.answer;
    if (answer == ANSWER_FAILED || answer == ANSWER_ERROR) {
        pending_fail(comm, r);
        *stop = 1;
        return dshim_error_quiet(DSHIM_ERR_PEER, "%s refused the connection: %s", who,
                                 answer == ANSWER_FAILED ? "its communicator failed"
                                                         : "it could not set it up (its log says why)");
    }
    if (answer != ANSWER_OK) {
        close(pc->fd);
        pc->fd = -1;
        pc->phase = PC_WAIT_WINNER;
        return DSHIM_OK;
    }
    dshim_conn_t *conn = NULL;
    dshim_status_t st = make_conn(comm, r, pc->fd, pc->reply.fallback != 0, &conn);
    if (st != DSHIM_OK) {
        char cause[512];
        snprintf(cause, sizeof(cause), "%s", dshim_last_error());
        pending_fail(comm, r);
        *stop = 1;
        return dshim_error_quiet(st, "cannot set up the connection to %s: %s", who, cause);
    }
    pc->fd = -1; /* the connection's now */
    pthread_mutex_lock(&comm->conn_lock);
    if (comm->conn_state[r] == DSHIM_CONN_READY) {
        /* cannot happen (the peer would have answered HAVE or LOSE), but
         * never two connections to one peer */
        conn->ops->destroy(conn);
    } else {
        publish_conn(comm, r, conn);
    }
    pthread_mutex_unlock(&comm->conn_lock);
    pending_reset(comm, r);
    return look_done(lk, stop);
}

/* PC_REPLY: the peer's answer comes in, then take_reply. */
static dshim_status_t poll_reply(dshim_comm_t *comm, int r, const connect_look_t *lk, int *stop)
{
    dshim_pending_conn_t *pc = &comm->pending[r];
    ssize_t n = recv(pc->fd, (char *)&pc->reply + pc->off, sizeof(pc->reply) - pc->off, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        int err = n == 0 ? 0 : errno;
        if (peer_published_meanwhile(comm, r)) {
            return look_done(lk, stop);
        }
        char who[160];
        dshim_comm_describe_peer(comm, r, who, sizeof(who));
        pending_fail(comm, r);
        *stop = 1;
        return dshim_error_quiet(DSHIM_ERR_PEER, "%s closed the connection during the handshake%s%s%s", who,
                                 err ? " (" : " (it exited, crashed or was killed, or rejected this rank",
                                 err ? strerror(err) : "", ")");
    }
    pc->off += n > 0 ? (size_t)n : 0;
    if (pc->off < sizeof(pc->reply)) {
        return look_wait(lk, pc->fd, POLLIN, stop);
    }
    return take_reply(comm, r, lk, stop);
}

dshim_status_t dshim_comm_connect_poll(dshim_comm_t *comm, int r, int *done_p, int *fd_p, short *events_p)
{
    dshim_pending_conn_t *pc = &comm->pending[r];
    connect_look_t lk = {done_p, fd_p, events_p};
    *done_p = 0;
    *fd_p = -1;
    *events_p = 0;
    /* A handshake of mine is finished even when the acceptor published the
     * peer's connection meanwhile (it won): the peer answers it HAVE or LOSE,
     * where a dropped socket would read as a stray in its log.  Each phase
     * either stops this look or hands over to the next. */
    int stop = 0;
    dshim_status_t st = DSHIM_OK;
    if (pc->phase == PC_CONNECT) {
        st = poll_connect(comm, r, &lk, &stop);
    }
    if (!stop && pc->phase == PC_SEND) {
        st = poll_send_hello(comm, r, &lk, &stop);
    }
    if (!stop && pc->phase == PC_REPLY) {
        st = poll_reply(comm, r, &lk, &stop);
    }
    if (stop) {
        return st;
    }
    /* PC_WAIT_WINNER */
    if (dshim_comm_conn(comm, r)) {
        pending_reset(comm, r);
        *done_p = 1;
    }
    return DSHIM_OK;
}

int dshim_comm_connects_pending(dshim_comm_t *comm, dshim_wait_set_t *ws, int *conn_event_p)
{
    if (!ws || comm->npending == 0) {
        return comm->npending; /* every operation asks: no walk over N entries then */
    }
    int n = 0;
    for (int r = 0; r < comm->size; r++) {
        const dshim_pending_conn_t *pc = &comm->pending[r];
        if (pc->phase == PC_IDLE) {
            continue;
        }
        n++;
        if (!ws) {
            continue;
        }
        if (pc->phase == PC_WAIT_WINNER) {
            *conn_event_p = 1;
        } else if (!dshim_wait_set_full(ws)) {
            dshim_wait_set_add_fd(ws, pc->fd, pc->phase == PC_REPLY ? POLLIN : POLLOUT);
        }
    }
    return n;
}

dshim_status_t dshim_comm_connect_poll_all(dshim_comm_t *comm, int *moved_p)
{
    for (int r = 0; r < comm->size && comm->npending > 0; r++) {
        if (comm->pending[r].phase == PC_IDLE) {
            continue;
        }
        int done = 0, fd;
        short events;
        DSHIM_CHECK(dshim_comm_connect_poll(comm, r, &done, &fd, &events));
        *moved_p |= done;
    }
    return DSHIM_OK;
}

/* "shm+tcp" before any connection exists: the transport each pair will use
 * is known from the records alone (both ends pick alike). */
static dshim_status_t plan_transports(dshim_comm_t *comm)
{
    const dshim_peer_info_t *me = &comm->peers[comm->rank];
    comm->nlocal = 1;
    for (int r = 0; r < comm->size; r++) {
        if (r == comm->rank) {
            continue;
        }
        dshim_transport_peer_t pv = peer_view(comm, r);
        comm->nlocal += comm->peers[r].host_id == me->host_id;
        int i = -1;
        DSHIM_CHECK(pick_transport(comm, comm->transports_allowed, comm->transport_named, &pv, &i));
        comm->transports_used |= 1u << i;
    }
    /* from the records, not from transports_used: a rank whose shm failed
     * talks TCP to everyone while the others do not, and the allreduce
     * choice that depends on this must be the same on every rank */
    comm->sockets_only = 1;
    for (int r = 0; r < comm->size; r++) {
        for (int i = 0; i < dshim_transport_count(); i++) {
            if (dshim_transport_at(i)->host_local && comm->peers[r].transport_addr[i][0]) {
                comm->sockets_only = 0;
            }
        }
    }
    for (int i = 0; i < dshim_transport_count(); i++) {
        if (comm->transports_used & (1u << i)) {
            dshim_waiter_add(&comm->waiter, dshim_transport_at(i), comm->transport_state[i]);
        }
    }
    describe_transports(comm);
    dshim_host_gate_plan(comm);
    dshim_single_copy_plan(comm);
    return DSHIM_OK;
}

static void stop_acceptor(dshim_comm_t *comm)
{
    if (comm->acceptor_started) {
        uint64_t one = 1;
        ssize_t w = write(comm->acceptor_wake, &one, sizeof(one));
        (void)w;
        pthread_join(comm->acceptor, NULL);
        comm->acceptor_started = 0;
    }
}

void dshim_comm_release(dshim_comm_t *comm)
{
    /* first: the acceptor may publish connections until it stops */
    stop_acceptor(comm);
    for (int fd_i = 0; fd_i < 3; fd_i++) {
        int *fdp = fd_i == 0 ? &comm->listen_fd : fd_i == 1 ? &comm->acceptor_wake : &comm->conn_event;
        if (*fdp >= 0) {
            close(*fdp);
            *fdp = -1;
        }
    }
    for (int r = 0; comm->pending && r < comm->size; r++) {
        if (comm->pending[r].fd >= 0) {
            close(comm->pending[r].fd);
        }
    }
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
    free(comm->job_rank);
    free(comm->conns);
    free(comm->conn_state);
    free(comm->pending);
    free(comm->p2p_tx);
    free(comm->p2p_rx);
    free(comm->wait_ranks);
    free(comm->missing);
    free(comm->scratch);
    pthread_mutex_destroy(&comm->lock);
    pthread_cond_destroy(&comm->cond);
    pthread_mutex_destroy(&comm->conn_lock);
    free(comm);
}

dshim_status_t dshim_bootstrap(dshim_store_ref_t *store, const char *prefix, int rank, int size,
                               int *job_rank, const char *token, dshim_comm_t **comm_p)
{
    const dshim_config_t *cfg = dshim_config();
    dshim_status_t st = DSHIM_OK;
    dshim_comm_t *comm = calloc(1, sizeof(*comm));
    if (!comm) {
        free(job_rank);
        return dshim_error(DSHIM_ERR_NOMEM, "out of memory for a communicator");
    }
    comm->job_rank = job_rank;
    comm->rank = rank;
    comm->size = size;
    comm->owner_pid = dshim_self_pid();
    comm->store = store;
    comm->listen_fd = comm->acceptor_wake = comm->conn_event = -1;
    snprintf(comm->prefix, sizeof(comm->prefix), "%s", prefix);
    pthread_mutex_init(&comm->lock, NULL);
    pthread_cond_init(&comm->cond, NULL);
    pthread_mutex_init(&comm->conn_lock, NULL);
    comm->peers = calloc((size_t)size, sizeof(*comm->peers));
    comm->conns = calloc((size_t)size, sizeof(*comm->conns));
    comm->conn_state = calloc((size_t)size, sizeof(*comm->conn_state));
    comm->pending = calloc((size_t)size, sizeof(*comm->pending));
    comm->p2p_tx = calloc((size_t)size, sizeof(uint64_t));
    comm->p2p_rx = calloc((size_t)size, sizeof(uint64_t));
    comm->wait_ranks = calloc((size_t)size, sizeof(int));
    if (!comm->peers || !comm->conns || !comm->conn_state || !comm->pending || !comm->p2p_tx || !comm->p2p_rx ||
        !comm->wait_ranks) {
        st = dshim_error(DSHIM_ERR_NOMEM, "out of memory for %d peers", size);
        goto err;
    }
    for (int r = 0; r < size; r++) {
        comm->pending[r].fd = -1;
    }
    DSHIM_CHECK_GOTO(allowed_transports(&comm->transports_allowed, &comm->transport_named), st, err);
    double deadline = dshim_now() + cfg->connect_timeout_s;
    comm->hello_hash = dshim_token_hash(token, prefix);

    /* 1. publish myself */
    dshim_peer_info_t *me = &comm->peers[rank];
    struct in_addr local;
    char why[256];
    DSHIM_CHECK_GOTO(dshim_net_pick_local_addr(store->addr, &local, why, sizeof(why)), st, err);
    if (size > 1) {
        int port;
        DSHIM_CHECK_GOTO(dshim_net_listen(local, &comm->listen_fd, &port), st, err);
        me->port = (uint16_t)port;
    }
    me->ip = local.s_addr;
    me->pid = getpid();
    me->host_id = host_id();
    gethostname(me->hostname, sizeof(me->hostname) - 1);
    if (size > 1) {
        DSHIM_CHECK_GOTO(setup_transports(comm, comm->transports_allowed, comm->hello_hash, me), st, err);
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

    /* 3. which transport for which peer, and the acceptor */
    DSHIM_CHECK_GOTO(plan_transports(comm), st, err);
    if (size > 1) {
        comm->acceptor_wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        comm->conn_event = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (comm->acceptor_wake < 0 || comm->conn_event < 0) {
            st = dshim_error(DSHIM_ERR_SYSTEM, "rank %d: eventfd: %s", rank, strerror(errno));
            goto err;
        }
        int rc = pthread_create(&comm->acceptor, NULL, acceptor_main, comm);
        if (rc != 0) {
            st = dshim_error(DSHIM_ERR_SYSTEM, "rank %d: cannot start the acceptor thread: %s", rank, strerror(rc));
            goto err;
        }
        comm->acceptor_started = 1;
    }
    *comm_p = comm;
    return DSHIM_OK;

err:
    dshim_comm_release(comm);
    return st;
}

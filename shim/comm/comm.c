/* Communicator lifecycle: init (explicit or from the environment), split,
 * destroy, abort and the sticky error. */
#include <arpa/inet.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bootstrap.h"
#include "config.h"
#include "crash.h"
#include "engine.h"
#include "host_gate.h"
#include "net.h"
#include "status.h"

static dshim_status_t check_args(const dshim_comm_args_t *a)
{
    if (!a || a->size < 1 || a->size > DSHIM_MAX_WORLD_SIZE || a->rank < 0 || a->rank >= a->size) {
        return dshim_error(DSHIM_ERR_INVALID, "invalid rank %d / size %d: need 0 <= rank < size <= %d",
                           a ? a->rank : -1, a ? a->size : -1, DSHIM_MAX_WORLD_SIZE);
    }
    if (!a->store_addr || !a->store_addr[0]) {
        return dshim_error(DSHIM_ERR_INVALID, "no store address given");
    }
    if (a->store_port < 0 || a->store_port > 65535 || (a->store_port == 0 && a->size > 1 && a->store_external)) {
        return dshim_error(DSHIM_ERR_INVALID, "store port %d is not a usable TCP port", a->store_port);
    }
    return DSHIM_OK;
}

/* How long a failing rank waits for the store to take or give the failure's
 * report: a quarter of the timeout, at most 1 s (the store answers in
 * microseconds unless its host is stopped or cut off). */
static double failure_report_patience(const dshim_comm_t *comm)
{
    double q = comm->timeout_s / 4;
    return q < 1.0 ? q : 1.0;
}

/* The store this process hosts, if any.  When a job fails, the other ranks
 * read the first failure's description from the store; if this process
 * exits right after its own error the store would vanish with it, so at exit
 * it keeps serving briefly until every peer has read it (bounded). */
static dshim_store_ref_t *hosted_ref;
static pid_t hosted_pid; /* a forked child (a data-loader worker) must not touch the parent's store */

/* Keep serving the store until every other rank has counted itself in
 * `failseen` (they do so when they fail after reading the failure kept in
 * it), or 3 s: the reason would vanish with this process. */
static void linger_for_readers(dshim_store_ref_t *ref)
{
    double deadline = dshim_now() + 3.0;
    int64_t seen = 0;
    while (dshim_now() < deadline && dshim_store_add(ref->store, "failseen", 0, &seen) == DSHIM_OK &&
           seen < ref->size - 1) {
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
}

/* At exit, a failed communicator's store host lingers for the readers. */
static void linger_at_exit(void)
{
    dshim_store_ref_t *ref = __atomic_load_n(&hosted_ref, __ATOMIC_ACQUIRE);
    if (!ref || getpid() != hosted_pid || !__atomic_load_n(&ref->failed, __ATOMIC_ACQUIRE)) {
        return;
    }
    linger_for_readers(ref);
}

/* Start-up failed while the store was reachable.  This rank's reason goes
 * to `c0/failed` (the first report wins: a rank that failed only because it
 * read that report loses the race by construction), and the store answers
 * every rank still waiting for a key of c0 with it, so they name this
 * failure instead of guessing (a vanished store looks like a bad token or a
 * dead host).  The caller's error message is kept. */
static void report_startup_failure(dshim_store_ref_t *ref, int rank)
{
    if (!dshim_store_usable(ref->store)) {
        return;  /* nobody to tell through it, and every call would log */
    }
    char saved[1024];
    snprintf(saved, sizeof(saved), "%s", dshim_last_error());
    char msg[1200];
    int n = snprintf(msg, sizeof(msg), "rank %d (host %s, pid %d) failed during start-up: %s", rank,
                     dshim_log_hostname(), (int)getpid(), saved);
    size_t len = n < 0 ? 0 : ((size_t)n < sizeof(msg) ? (size_t)n : sizeof(msg) - 1);
    int won = 0;
    int64_t v = 0;
    dshim_store_set_if_absent(ref->store, "c0/" DSHIM_STORE_FAILED_LEAF, msg, len, &won);
    if (ref->server) {
        linger_for_readers(ref);
    } else {
        dshim_store_add(ref->store, "failseen", 1, &v);
    }
    dshim_error_set_raw(saved);
}

static void store_ref_release(dshim_store_ref_t *ref)
{
    pthread_mutex_lock(&ref->lock);
    int left = --ref->refs;
    pthread_mutex_unlock(&ref->lock);
    if (left > 0) {
        return;
    }
    if (ref->server) {
        /* the host of the store waits (bounded) until every rank said goodbye,
         * so nobody loses the store in the middle of its own teardown */
        char key[64];
        int64_t v = 0;
        /* after a failure some ranks may never say goodbye: wait briefly,
         * long enough for the others to read the failure's description */
        double deadline = dshim_now() + (__atomic_load_n(&ref->failed, __ATOMIC_ACQUIRE) ? 3.0 : 30.0);
        snprintf(key, sizeof(key), "bye");
        while (dshim_store_add(ref->store, key, 0, &v) == DSHIM_OK && v < ref->size && dshim_now() < deadline) {
            struct timespec ts = {0, 2000000};
            nanosleep(&ts, NULL);
        }
    }
    if (ref->server) {
        __atomic_store_n(&hosted_ref, NULL, __ATOMIC_RELEASE);
    }
    dshim_store_close(ref->store);
    if (ref->server) {
        dshim_store_server_stop(ref->server);
    }
    pthread_mutex_destroy(&ref->lock);
    free(ref);
}

static void register_linger(void)
{
    atexit(linger_at_exit);
}

/* Stores bound by dshim_store_prebind() and not yet adopted by a rank-0
 * dshim_comm_init (a short list: one per group being created). */
typedef struct prebound {
    struct prebound      *next;
    int                   port;
    char                  token[sizeof(((dshim_store_ref_t *)0)->token)];
    dshim_store_server_t *server;
} prebound_t;
static prebound_t *prebound_list;
static pthread_mutex_t prebound_lock = PTHREAD_MUTEX_INITIALIZER;

DSHIM_EXPORT dshim_status_t dshim_store_prebind(int port, const char *token, int *port_p)
{
    return dshim_store_prebind_at(NULL, port, token, port_p);
}

DSHIM_EXPORT dshim_status_t dshim_store_prebind_at(const char *addr, int port, const char *token, int *port_p)
{
    if (port < 0 || port > 65535 || !port_p) {
        return dshim_error(DSHIM_ERR_INVALID, "dshim_store_prebind: port %d is not a usable TCP port (0 = any)",
                           port);
    }
    dshim_log_init();
    prebound_t *pb = calloc(1, sizeof(*pb));
    if (!pb) {
        return dshim_error(DSHIM_ERR_NOMEM, "out of memory");
    }
    snprintf(pb->token, sizeof(pb->token), "%s", token ? token : "");
    char bind_addr[INET_ADDRSTRLEN] = "";
    if (addr && addr[0]) {
        dshim_net_listen_addr(addr, "rendezvous store", bind_addr, sizeof(bind_addr));
    }
    dshim_status_t st = dshim_store_server_start(bind_addr, port, pb->token, &pb->server, &pb->port);
    if (st != DSHIM_OK) {
        free(pb);
        return dshim_error(st, "host %s: cannot host the rendezvous store: %s", dshim_log_hostname(),
                           dshim_last_error());
    }
    pthread_mutex_lock(&prebound_lock);
    pb->next = prebound_list;
    prebound_list = pb;
    pthread_mutex_unlock(&prebound_lock);
    *port_p = pb->port;
    return DSHIM_OK;
}

/* The pre-bound store on `port`, removed from the list (NULL if none). */
static prebound_t *prebound_take(int port)
{
    pthread_mutex_lock(&prebound_lock);
    prebound_t **pp = &prebound_list;
    while (*pp && (*pp)->port != port) {
        pp = &(*pp)->next;
    }
    prebound_t *pb = *pp;
    if (pb) {
        *pp = pb->next;
    }
    pthread_mutex_unlock(&prebound_lock);
    return pb;
}

DSHIM_EXPORT dshim_status_t dshim_comm_init(const dshim_comm_args_t *args, dshim_comm_t **comm_p)
{
    const dshim_config_t *cfg = dshim_config();
    dshim_log_init();
    DSHIM_CHECK(check_args(args));
    if (!comm_p) {
        return dshim_error(DSHIM_ERR_INVALID, "comm_p is NULL");
    }
    dshim_log_set_rank(args->rank);
    dshim_crash_install();
    const char *token = args->token ? args->token : "";
    dshim_store_ref_t *ref = calloc(1, sizeof(*ref));
    if (!ref) {
        return dshim_error(DSHIM_ERR_NOMEM, "out of memory");
    }
    pthread_mutex_init(&ref->lock, NULL);
    ref->refs = 1;
    ref->size = args->size;
    snprintf(ref->addr, sizeof(ref->addr), "%s", args->store_addr);
    ref->port = args->store_port;
    snprintf(ref->token, sizeof(ref->token), "%s", token);
    dshim_status_t st;
    prebound_t *pb = (args->rank == 0 && !args->store_external && args->store_port > 0)
                         ? prebound_take(args->store_port) : NULL;
    if (pb) {
        if (strcmp(pb->token, ref->token) != 0) {
            dshim_store_server_stop(pb->server);
            free(pb);
            st = dshim_error(DSHIM_ERR_INVALID, "rank 0: the store pre-bound on port %d has another job token "
                             "than dshim_comm_init was given; pass the same token to both", args->store_port);
            goto err_ref;
        }
        ref->server = pb->server;
        free(pb);
    } else if (args->rank == 0 && !args->store_external) {
        /* only where the job reaches it (MASTER_ADDR's address, or the named
         * interface): a loopback job's store must not be open to the network */
        char bind_addr[INET_ADDRSTRLEN];
        dshim_net_listen_addr(args->store_addr, "rendezvous store", bind_addr, sizeof(bind_addr));
        st = dshim_store_server_start(bind_addr, args->store_port, token, &ref->server, &ref->port);
        if (st != DSHIM_OK) {
            st = dshim_error(st, "rank 0 (host %s): cannot host the rendezvous store: %s", dshim_log_hostname(),
                             dshim_last_error());
            goto err_ref;
        }
    }
    st = dshim_store_connect(ref->addr, ref->port, token, cfg->connect_timeout_s, &ref->store);
    if (st != DSHIM_OK) {
        st = dshim_error(st, "rank %d (host %s): cannot reach the rendezvous store at %s:%d: %s", args->rank,
                         dshim_log_hostname(), ref->addr, ref->port, dshim_last_error());
        goto err_server;
    }
    st = dshim_bootstrap(ref, "c0/", args->rank, args->size, NULL, token, comm_p);
    if (st != DSHIM_OK) {
        report_startup_failure(ref, args->rank);
        goto err_store;
    }
    dshim_engine_init(*comm_p);
    /* before the hierarchy: the parent's ring opens first and leads dumps */
    dshim_comm_trace_open(*comm_p, "");
    st = dshim_topo_setup(*comm_p);
    if (st != DSHIM_OK) {
        dshim_comm_destroy(*comm_p);
        *comm_p = NULL;
        return st;
    }
    if (ref->server) {
        static pthread_once_t once = PTHREAD_ONCE_INIT;
        pthread_once(&once, register_linger);
        hosted_pid = getpid();
        __atomic_store_n(&hosted_ref, ref, __ATOMIC_RELEASE);
    }
    DSHIM_INFO("rank %d of %d joined (%d on this host, transport %s)", args->rank, args->size, (*comm_p)->nlocal,
               dshim_comm_transport(*comm_p));
    return DSHIM_OK;

err_store:
    dshim_store_close(ref->store);
err_server:
    if (ref->server) {
        dshim_store_server_stop(ref->server);
    }
err_ref:
    pthread_mutex_destroy(&ref->lock);
    free(ref);
    return st;
}

DSHIM_EXPORT dshim_status_t dshim_comm_init_env(dshim_comm_t **comm_p)
{
    dshim_comm_args_t args;
    /* refuse to run on a configuration the user did not ask for; checked
     * before the reload, whose message would say "using the default" */
    if (dshim_config_check() != DSHIM_OK) {
        return dshim_error(DSHIM_ERR_INVALID, "%s", dshim_last_error());
    }
    if (dshim_config_reload() != DSHIM_OK) {
        return dshim_error(DSHIM_ERR_INVALID, "%s", dshim_last_error());
    }
    DSHIM_CHECK(dshim_args_from_env(&args));
    return dshim_comm_init(&args, comm_p);
}

static void comm_free(dshim_comm_t *comm)
{
    dshim_topo_destroy(comm);
    /* before the release: entries point to comm->transport_desc */
    dshim_trace_close(comm->trace);
    comm->trace = NULL;
    dshim_comm_release(comm);
}

void dshim_comm_trace_open(dshim_comm_t *comm, const char *desc)
{
    /* the store prefix alone repeats: torch makes every group with
     * dshim_comm_init ("c0/"), each over a store of its own; the store's
     * address is the same on every member and differs between groups */
    char name[sizeof(comm->prefix) + sizeof(comm->store->addr) + 16]; /* the ring keeps 95 bytes */
    snprintf(name, sizeof(name), "%s@%s:%d", comm->prefix, comm->store->addr, comm->store->port);
    dshim_trace_ring_info_t info = {.name = name, .desc = desc, .rank = comm->rank, .size = comm->size};
    comm->trace = dshim_trace_open(&info);
}

/* Names the communicator in flight-recorder dumps ("torch group 1
 * (pg_name)", "ncclComm 0x..."): the frameworks know what a group is for. */
DSHIM_EXPORT dshim_status_t dshim_comm_set_desc(dshim_comm_t *comm, const char *desc)
{
    if (!comm) {
        return dshim_error(DSHIM_ERR_INVALID, "dshim_comm_set_desc: comm is NULL");
    }
    dshim_trace_set_desc(comm->trace, desc);
    return DSHIM_OK;
}

/* The dump reason of a failure status (trace.h's words). */
static const char *trace_reason(dshim_status_t st)
{
    switch (st) {
    case DSHIM_ERR_TIMEOUT:
        return "timeout";
    case DSHIM_ERR_PEER:
        return "peer";
    case DSHIM_ERR_MISMATCH:
        return "mismatch";
    case DSHIM_ERR_ABORTED:
        return "abort";
    default:
        return "failed";
    }
}

/* getpid() is a system call; the hot path compares against a copy that a
 * fork handler refreshes in the child. */
static pid_t self_pid;
static pthread_once_t self_pid_once = PTHREAD_ONCE_INIT;

static void refresh_self_pid(void)
{
    __atomic_store_n(&self_pid, getpid(), __ATOMIC_RELAXED);
}

static void init_self_pid(void)
{
    refresh_self_pid();
    pthread_atfork(NULL, NULL, refresh_self_pid);
}

pid_t dshim_self_pid(void)
{
    pthread_once(&self_pid_once, init_self_pid);
    return __atomic_load_n(&self_pid, __ATOMIC_RELAXED);
}

dshim_status_t dshim_comm_check_owner(const dshim_comm_t *comm, const char *what)
{
    if (comm->owner_pid != dshim_self_pid()) {
        /* sockets, rings and the store connection are shared with the parent:
         * touching them from here would corrupt the parent's job */
        return dshim_error(DSHIM_ERR_INVALID,
                           "%s: this communicator belongs to pid %d (rank %d); a forked child (pid %d) cannot use "
                           "it: create communicators after fork, or only in the parent",
                           what, (int)comm->owner_pid, comm->rank, (int)getpid());
    }
    return DSHIM_OK;
}

DSHIM_EXPORT dshim_status_t dshim_comm_destroy(dshim_comm_t *comm)
{
    if (!comm) {
        return DSHIM_OK;
    }
    DSHIM_CHECK(dshim_comm_check_owner(comm, "dshim_comm_destroy"));
    dshim_engine_shutdown(comm);
    dshim_status_t st = comm->error;
    int is_root_comm = strcmp(comm->prefix, "c0/") == 0;
    if (is_root_comm && comm->rank == 0 && dshim_config()->summary) {
        dshim_stats_t s;
        dshim_comm_stats(comm, &s);
        /* one line per job (rank 0): what dshim carried, for demos and sanity checks */
        fprintf(stderr, "dshim: %d ranks over %s: %llu collectives, %.1f MB sent, %.1f MB received by rank 0\n",
                comm->size, dshim_comm_transport(comm), (unsigned long long)s.collectives, s.bytes_sent / 1e6,
                s.bytes_received / 1e6);
    }
    if (is_root_comm && comm->store->store) {
        /* after a failure the store's host may be the rank that stopped:
         * the goodbye is a courtesy then, not worth a timeout's wait */
        double patience = dshim_store_patience(st != DSHIM_OK ? failure_report_patience(comm) : 0);
        int64_t v;
        dshim_store_add(comm->store->store, "bye", 1, &v);
        dshim_store_patience(patience);
    }
    dshim_store_ref_t *ref = comm->store;
    comm_free(comm);
    store_ref_release(ref);
    return st < 0 ? st : DSHIM_OK;
}

/* dshim_comm_fail; `child`: a sub-communicator of the hierarchy failed
 * with its parent, which already logged, counted itself in failseen and
 * dumped the recorder's rings. */
static dshim_status_t comm_fail(dshim_comm_t *comm, dshim_status_t st, const char *msg, int child,
                                dshim_missing_t *verdict)
{
    pthread_mutex_lock(&comm->lock);
    if (comm->error != DSHIM_OK) {
        pthread_mutex_unlock(&comm->lock);
        free(verdict);
        dshim_error_set_raw(comm->errmsg);
        return comm->error;
    }
    comm->missing = verdict;
    char full[sizeof(comm->errmsg)];
    snprintf(full, sizeof(full), "%s", msg);
    if (st == DSHIM_ERR_PEER && comm->store->store) {
        /* the closed connection may only be the echo of another rank's
         * failure: if one was reported, name it as the cause */
        char key[160];
        void *val = NULL;
        size_t len = 0;
        snprintf(key, sizeof(key), "%sabort", comm->prefix);
        double patience = dshim_store_patience(failure_report_patience(comm));
        dshim_status_t got = dshim_store_try_get(comm->store->store, key, &val, &len);
        dshim_store_patience(patience);
        if (got == DSHIM_OK) {
            size_t o = strlen(full);
            snprintf(full + o, sizeof(full) - o, "; first failure in this job: %.*s", (int)len, (char *)val);
            free(val);
        }
    }
    __atomic_store_n(&comm->store->failed, 1, __ATOMIC_RELEASE);
    snprintf(comm->errmsg, sizeof(comm->errmsg), "%s", full);
    __atomic_store_n(&comm->error, st, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&comm->lock);
    if (!child) {
        DSHIM_WARN("%s", full);
    }
    if (comm->store->store) {
        /* best effort, bounded: when the store's host is the rank that
         * stopped or was cut off, waiting for it would hold back the
         * shutdowns below that tell every peer now */
        double patience = dshim_store_patience(failure_report_patience(comm));
        char key[160];
        int won = 0;
        snprintf(key, sizeof(key), "%sabort", comm->prefix);
        if (dshim_store_set_if_absent(comm->store->store, key, msg, strlen(msg), &won) == DSHIM_OK && !child) {
            int64_t seen;
            dshim_store_add(comm->store->store, "failseen", 1, &seen);
        }
        dshim_store_patience(patience);
    }
    /* and the ranks waiting in the host gate's barrier, which have no
     * connection to this rank to notice it by */
    dshim_host_gate_fail(comm);
    /* make every connected peer notice now rather than at its own timeout;
     * under conn_lock: the acceptor publishes a connection only after it
     * saw no error under that lock, so every connection is either shut
     * down here or never made (a late peer is answered FAILED) */
    pthread_mutex_lock(&comm->conn_lock);
    for (int r = 0; r < comm->size; r++) {
        dshim_conn_t *c = dshim_comm_conn(comm, r);
        if (c) {
            shutdown(c->fd, SHUT_RDWR);
        }
    }
    pthread_mutex_unlock(&comm->conn_lock);
    /* and the hierarchy's sub-communicators: the ranks of this host wait
     * on this rank's part of a hierarchical step (at their gate, or for its
     * message), the other hosts' leaders on its messages between hosts;
     * without this they would learn of the failure only when this process
     * exits or at their timeout.  Their errors then carry this one as the
     * first failure in the job. */
    if (comm->local) {
        comm_fail(comm->local, st, full, 1, NULL);
    }
    if (comm->leaders) {
        comm_fail(comm->leaders, st, full, 1, NULL);
    }
    /* after the peers were told (a dump takes milliseconds); the failed
     * operation is still "waiting" in the ring: its executor marks it
     * failed only after this returns.  The first failure of the process
     * writes the dump (every ring); later ones within a second are its
     * echoes. */
    if (comm->trace && !child) {
        dshim_trace_dump_all(trace_reason(st), full);
    }
    dshim_error_set_raw(full);
    return st;
}

dshim_status_t dshim_comm_fail(dshim_comm_t *comm, dshim_status_t st, const char *msg)
{
    return comm_fail(comm, st, msg, 0, NULL);
}

dshim_status_t dshim_comm_fail_missing(dshim_comm_t *comm, dshim_status_t st, const char *msg, uint64_t seq,
                                       const int *missing, int n)
{
    /* allocated before the lock; a failure that is not the first frees it */
    dshim_missing_t *v = malloc(sizeof(*v) + sizeof(int) * (size_t)(n > 0 ? n : 0));
    if (v) {
        v->seq = seq;
        v->n = n;
        if (n > 0) {
            memcpy(v->ranks, missing, sizeof(int) * (size_t)n);
        }
    }
    return comm_fail(comm, st, msg, 0, v);
}

DSHIM_EXPORT dshim_status_t dshim_comm_abort(dshim_comm_t *comm, const char *reason)
{
    if (!comm) {
        return dshim_error(DSHIM_ERR_INVALID, "dshim_comm_abort: comm is NULL");
    }
    DSHIM_CHECK(dshim_comm_check_owner(comm, "dshim_comm_abort"));
    char msg[512];
    snprintf(msg, sizeof(msg), "rank %d (host %s) aborted the communicator: %s", comm->rank,
             comm->peers[comm->rank].hostname, reason ? reason : "no reason given");
    dshim_comm_fail(comm, DSHIM_ERR_ABORTED, msg);
    dshim_engine_wake(comm);
    return DSHIM_OK;
}

void dshim_comm_list_rank(const dshim_comm_t *comm, int r, char *out, size_t len, size_t *o)
{
    if (*o >= len) {
        return;
    }
    int n = comm->job_rank ? snprintf(out + *o, len - *o, "%s%d (job rank %d)", *o ? ", " : "", r, comm->job_rank[r])
                           : snprintf(out + *o, len - *o, "%s%d", *o ? ", " : "", r);
    if (n > 0) {
        *o = *o + (size_t)n < len ? *o + (size_t)n : len;
    }
}

void dshim_comm_describe_peer(const dshim_comm_t *comm, int peer, char *out, size_t len)
{
    if (peer < 0 || peer >= comm->size) {
        snprintf(out, len, "rank %d (invalid)", peer);
        return;
    }
    if (comm->job_rank) {
        snprintf(out, len, "rank %d (job rank %d, host %s, pid %d)", peer, comm->job_rank[peer],
                 comm->peers[peer].hostname, comm->peers[peer].pid);
        return;
    }
    snprintf(out, len, "rank %d (host %s, pid %d)", peer, comm->peers[peer].hostname, comm->peers[peer].pid);
}

dshim_status_t dshim_comm_scratch(dshim_comm_t *comm, size_t len, void **ptr_p)
{
    if (comm->scratch_len < len) {
        free(comm->scratch);
        comm->scratch = NULL;
        comm->scratch_len = 0;
        if (posix_memalign(&comm->scratch, 64, len) != 0) {
            return dshim_error(DSHIM_ERR_NOMEM, "out of memory for %zu bytes of scratch", len);
        }
        comm->scratch_len = len;
    }
    *ptr_p = comm->scratch;
    return DSHIM_OK;
}

DSHIM_EXPORT dshim_status_t dshim_comm_set_timeout(dshim_comm_t *comm, double seconds)
{
    if (comm == NULL || seconds != seconds) {
        return dshim_error(DSHIM_ERR_INVALID, "comm_set_timeout: %s", comm ? "seconds is NaN" : "comm is NULL");
    }
    /* The one timeout rule (docs/env-vars.md, DSHIM_TIMEOUT): the user's own
     * DSHIM_TIMEOUT wins over what a framework asks for (torch passes its
     * group's timeout, 30 min by default); unset, the framework's governs. */
    if (dshim_config_is_set("DSHIM_TIMEOUT")) {
        if (seconds != dshim_config()->timeout_s) {
            DSHIM_INFO("rank %d: DSHIM_TIMEOUT=%g s governs this communicator (the framework asked for %g s)",
                       comm->rank, dshim_config()->timeout_s, seconds);
        }
        return DSHIM_OK;
    }
    /* read by the progress thread without a lock: callers set it before
     * issuing operations (documented), so a plain store is enough */
    comm->timeout_s = seconds > 0 ? seconds : 1e9;
    return DSHIM_OK;
}

DSHIM_EXPORT int dshim_comm_rank(const dshim_comm_t *comm)
{
    return comm ? comm->rank : -1;
}

DSHIM_EXPORT int dshim_comm_size(const dshim_comm_t *comm)
{
    return comm ? comm->size : -1;
}

DSHIM_EXPORT const char *dshim_comm_transport(const dshim_comm_t *comm)
{
    if (!comm) {
        return "none";
    }
    return comm->transport_desc;
}

DSHIM_EXPORT dshim_status_t dshim_comm_get_error(dshim_comm_t *comm, char *msg, size_t msg_len)
{
    if (!comm) {
        return DSHIM_ERR_INVALID;
    }
    pthread_mutex_lock(&comm->lock);
    dshim_status_t st = comm->error;
    if (msg && msg_len) {
        snprintf(msg, msg_len, "%s", comm->errmsg);
    }
    pthread_mutex_unlock(&comm->lock);
    return st;
}

DSHIM_EXPORT dshim_status_t dshim_comm_get_missing(dshim_comm_t *comm, uint64_t *seq, int *missing, int cap,
                                                   int *nmissing)
{
    if (!comm || !seq || !nmissing || (cap > 0 && !missing)) {
        return DSHIM_ERR_INVALID;
    }
    pthread_mutex_lock(&comm->lock);
    dshim_status_t st = comm->missing ? comm->error : DSHIM_OK;
    *seq = comm->missing ? comm->missing->seq : 0;
    *nmissing = comm->missing ? comm->missing->n : 0;
    for (int i = 0; i < cap && i < *nmissing; i++) {
        missing[i] = comm->missing->ranks[i];
    }
    pthread_mutex_unlock(&comm->lock);
    return st;
}

DSHIM_EXPORT void dshim_comm_stats(const dshim_comm_t *comm, dshim_stats_t *stats)
{
    if (!stats) {
        return; /* nowhere to write: nothing to do (it returns no status) */
    }
    memset(stats, 0, sizeof(*stats));
    if (!comm) {
        return;
    }
    stats->collectives = __atomic_load_n(&comm->stats.collectives, __ATOMIC_RELAXED);
    /* what moved without a connection (dshim_comm_count_moved), then the connections' */
    stats->bytes_sent = __atomic_load_n(&comm->stats.bytes_sent, __ATOMIC_RELAXED);
    stats->bytes_received = __atomic_load_n(&comm->stats.bytes_received, __ATOMIC_RELAXED);
    for (int r = 0; r < comm->size; r++) {
        const dshim_conn_t *c = dshim_comm_conn(comm, r);
        if (c) {
            stats->bytes_sent += c->bytes_sent;
            stats->bytes_received += c->bytes_received;
        }
    }
}

dshim_status_t dshim_comm_create_child(dshim_comm_t *comm, const char *suffix, int rank, int size,
                                       const int *members, dshim_comm_t **child_p)
{
    int *job_rank = malloc(sizeof(int) * (size_t)size);
    if (!job_rank) {
        return dshim_error(DSHIM_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < size; i++) {
        job_rank[i] = comm->job_rank ? comm->job_rank[members[i]] : members[i];
    }
    char prefix[sizeof(comm->prefix) + 64];
    snprintf(prefix, sizeof(prefix), "%s%s", comm->prefix, suffix);
    if (strlen(prefix) >= sizeof(comm->prefix)) {
        free(job_rank);
        return dshim_error(DSHIM_ERR_UNSUPPORTED, "communicators nested too deeply (store prefix %s too long)", prefix);
    }
    pthread_mutex_lock(&comm->store->lock);
    comm->store->refs++;
    pthread_mutex_unlock(&comm->store->lock);
    dshim_status_t st = dshim_bootstrap(comm->store, prefix, rank, size, job_rank, comm->store->token, child_p);
    if (st != DSHIM_OK) {
        store_ref_release(comm->store);
        return st;
    }
    dshim_engine_init(*child_p);
    char desc[160];
    snprintf(desc, sizeof(desc), "sub-communicator %s of %s", suffix, comm->prefix);
    dshim_comm_trace_open(*child_p, desc);
    return DSHIM_OK;
}

/* Split: every rank learns every (color, key) through an allgather on the
 * parent, then the members of each color bootstrap a fresh communicator
 * (connected on first use) under a prefix unique to this split and color. */
DSHIM_EXPORT dshim_status_t dshim_comm_split(dshim_comm_t *comm, int color, int key, dshim_comm_t **newcomm_p)
{
    if (!comm || !newcomm_p) {
        return dshim_error(DSHIM_ERR_INVALID, "dshim_comm_split: NULL argument");
    }
    *newcomm_p = NULL;
    DSHIM_CHECK(dshim_comm_check_owner(comm, "dshim_comm_split"));
    int32_t mine[2] = {color, key};
    int32_t *all = malloc((size_t)comm->size * 2 * sizeof(int32_t));
    if (!all) {
        return dshim_error(DSHIM_ERR_NOMEM, "out of memory");
    }
    dshim_status_t st = dshim_allgather(comm, mine, all, 2, DSHIM_INT32);
    if (st != DSHIM_OK) {
        free(all);
        return st;
    }
    uint64_t split_id = comm->split_seq++;
    if (color < 0) {
        free(all);
        return DSHIM_OK;
    }
    int newrank = 0, newsize = 0;
    int *members = malloc(sizeof(int) * (size_t)comm->size);
    if (!members) {
        free(all);
        return dshim_error(DSHIM_ERR_NOMEM, "out of memory");
    }
    for (int r = 0; r < comm->size; r++) {
        if (all[2 * r] != color) {
            continue;
        }
        /* ordered by (key, old rank): an insertion keeps members sorted */
        int at = newsize++;
        while (at > 0 && all[2 * members[at - 1] + 1] > all[2 * r + 1]) {
            members[at] = members[at - 1];
            at--;
        }
        members[at] = r;
    }
    while (members[newrank] != comm->rank) {
        newrank++; /* this rank has the color: it is there */
    }
    free(all);
    char suffix[48];
    snprintf(suffix, sizeof(suffix), "s%" PRIu64 "c%d/", split_id, color);
    st = dshim_comm_create_child(comm, suffix, newrank, newsize, members, newcomm_p);
    free(members);
    DSHIM_CHECK(st);
    char desc[160];
    snprintf(desc, sizeof(desc), "split of %s (color %d)", comm->prefix, color);
    dshim_trace_set_desc((*newcomm_p)->trace, desc);
    st = dshim_topo_setup(*newcomm_p);
    if (st != DSHIM_OK) {
        dshim_comm_destroy(*newcomm_p);
        *newcomm_p = NULL;
    }
    return st;
}

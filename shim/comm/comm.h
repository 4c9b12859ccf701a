/* Communicator internals shared by the bootstrap, the engine and the
 * collective algorithms. */
#ifndef DSHIM_COMM_H
#define DSHIM_COMM_H

#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

#include "dshim.h"
#include "reduce/reduce.h"
#include "store.h"
#include "trace.h"
#include "transport/transport.h"

/* What every rank publishes about itself in the store. */
typedef struct dshim_peer_info {
    uint32_t ip;         /* network byte order */
    uint16_t port;
    uint16_t pad;
    int32_t pid;
    uint64_t host_id;    /* same value <=> same host (and network namespace) */
    char hostname[64];
    /* what each transport of the registry published (transport.h setup;
     * shm: its inbox segment name), "" if nothing */
    char transport_addr[DSHIM_TRANSPORT_MAX][DSHIM_TRANSPORT_ADDR_LEN];
} dshim_peer_info_t;

/* The store (and its server, on the rank that hosts it) outlives sub-communicators. */
typedef struct dshim_store_ref {
    dshim_store_t *store;
    dshim_store_server_t *server;
    char addr[256];
    int port;
    int refs;
    int size;            /* world size: the server waits for this many goodbyes */
    char token[256];     /* job token, for the handshakes of sub-communicators */
    int failed;          /* a communicator on this store failed (see linger_at_exit) */
    pthread_mutex_t lock;
} dshim_store_ref_t;

/* The signature of a collective, carried in every message header. */
typedef struct dshim_coll_sig {
    uint8_t coll;    /* dshim_coll_kind_t */
    uint8_t dtype;
    uint8_t redop;
    int32_t root;
    uint64_t count;
    uint64_t seq;
} dshim_coll_sig_t;

typedef enum dshim_coll_kind {
    DSHIM_COLL_ALLREDUCE = 1,
    DSHIM_COLL_BROADCAST,
    DSHIM_COLL_REDUCE,
    DSHIM_COLL_ALLGATHER,
    DSHIM_COLL_ALLGATHERV,
    DSHIM_COLL_REDUCE_SCATTER,
    DSHIM_COLL_ALLTOALL,
    DSHIM_COLL_ALLTOALLV,
    DSHIM_COLL_GATHER,
    DSHIM_COLL_SCATTER,
    DSHIM_COLL_P2P,
    DSHIM_COLL_BARRIER,
    DSHIM_COLL_INTERNAL, /* split, destroy handshakes */
    DSHIM_COLL_REDUCE_SCATTERV,
} dshim_coll_kind_t;

const char *dshim_coll_name(int coll);

typedef struct dshim_request dshim_request_t;

/* The communicator.  Each section names the file that writes its fields
 * and who may read them when.  "Init" is dshim_comm_init and
 * dshim_comm_create_child (comm.c): dshim_bootstrap (bootstrap.c, and the
 * plans of host_gate.c and coll_single_copy.c it calls), dshim_engine_init
 * (engine.c), the recorder's ring and dshim_topo_setup (topo.c), all before
 * the communicator is returned: fields written at init are read-only
 * afterwards and any thread may read them.  The acceptor thread starts
 * inside dshim_bootstrap and reads only the identity, transports and
 * connections.  "The executor" is the thread that runs the requests one at
 * a time (the progress thread, or the caller's thread while it executes:
 * engine.c). */
struct dshim_comm {
    /* Identity (bootstrap.c, init; read-only after) */
    int rank, size;
    pid_t owner_pid;               /* a forked child inherits a copy it must not use */
    char prefix[96];               /* store key prefix of this communicator */
    dshim_store_ref_t *store;      /* shared with sub-communicators; its own lock guards its counts */
    dshim_peer_info_t *peers;      /* [size] */
    int *job_rank;                 /* NULL in a communicator of dshim_comm_init; in a sub-communicator
                                    * (dshim_comm_create_child: hosts, leaders, splits) each member's
                                    * rank there, so that messages name processes as the job does */
    int nlocal;                    /* ranks on this host, including me */
    uint64_t hello_hash;           /* token + prefix hash every handshake carries */

    /* Transports (bootstrap.c, init; read-only after, but for the waiter,
     * which only the executor arms and sleeps on: xfer.c) */
    /* per registry entry: its per-communicator state (NULL when not set up
     * or unavailable) */
    void *transport_state[DSHIM_TRANSPORT_MAX];
    unsigned transports_used;      /* bit i: registry entry i carries (or will carry) a connection */
    int sockets_only;              /* no rank published a host-local transport: every pair talks over
                                    * sockets (the same on every rank: from the records alone) */
    char transport_desc[48];       /* "shm+tcp", "tcp", "self": the names of transports_used */
    unsigned transports_allowed;   /* DSHIM_TRANSPORT's registry entries (bit i = entry i) */
    int transport_named;           /* DSHIM_TRANSPORT named one transport (not auto) */
    dshim_waiter_t waiter;         /* what the engine sleeps on (transports with a wake-up of their own) */

    /* Connections on first use (bootstrap.c, by the executor and the
     * acceptor thread): the data listener stays open for the communicator's
     * life and a thread of its own answers peers' handshakes, whatever the
     * rank is doing meanwhile.  conn_state and the publication of conns
     * under conn_lock; the rest as marked. */
    /* [size], NULL for self and for a peer not connected yet, published
     * once with a release store; read them with dshim_comm_conn */
    dshim_conn_t **conns;
    int listen_fd;                 /* -1 when size == 1 */
    int acceptor_wake;             /* eventfd: stops the acceptor */
    int conn_event;                /* eventfd: the acceptor published a connection */
    struct dshim_pending_conn *pending; /* [size]: handshakes this rank began (executor only) */
    int npending;                  /* how many of them are under way (executor only) */
    int acceptor_started;          /* init and destroy only */
    pthread_t acceptor;
    /* the acceptor ran out of descriptors (EMFILE): set once, with its
     * line, for the executor to fail the communicator (xfer.c's wait; the
     * acceptor does not fail it itself: init and the user's thread may still
     * be writing what a failure reads) */
    int acceptor_failed;           /* atomic */
    char acceptor_errmsg[512];     /* written before acceptor_failed (release) */
    pthread_mutex_t conn_lock;     /* conn_state, and publishing conns */
    unsigned char *conn_state;     /* [size]: DSHIM_CONN_NONE, CONNECTING or READY */
    int nconnects;                 /* connections made so far (both directions; atomic) */
    int reserve_warned;            /* a pair was sent to the fallback transport (warned once) */

    /* Configuration snapshot (engine.c dshim_engine_init, init; read-only
     * after, but timeout_s, which dshim_comm_set_timeout (comm.c) may set
     * before operations are issued) */
    size_t chunk_bytes, small_msg_bytes;
    double timeout_s;
    long spin_us;
    int spin_yields;               /* more ranks than cores on this host: every poll of a spin yields */
    int check_sig;
    int algo;                      /* DSHIM_ALGO_* */
    const dshim_reduce_ops_t *reduce;

    /* Engine (engine.c): requests run one at a time in issue order.  The
     * queue and its flags under lock; the rest by the executor only */
    pthread_mutex_t lock;          /* also guards the failure (below) */
    pthread_cond_t cond;
    dshim_request_t *q_head, *q_tail;
    int busy;                      /* someone is executing a request */
    int stop;
    int thread_started;
    pthread_t thread;
    uint64_t next_seq;             /* the next collective's number, in execution (= issue) order (also
                                    * coll_hier.c's steps on local/leaders, from the parent's executor) */
    uint64_t *p2p_tx, *p2p_rx;     /* [size] point-to-point message numbers (allocated at init) */
    uint64_t trace_op;             /* the collective being executed (also coll_hier.c's steps) */
    /* counters (atomic adds: engine.c, and dshim_comm_count_moved from the
     * gate's and the single copy's algorithms;
     * dshim_comm_stats reads them with atomic loads from any thread) */
    dshim_stats_t stats;

    /* The communicator's life (comm.c) */
    /* sticky error: once set every operation fails with it.  Written once
     * by dshim_comm_fail under lock, error last (release); any thread reads
     * error with an acquire load, and errmsg and missing after it */
    dshim_status_t error;
    char errmsg[768];
    /* the ranks that did not arrive at the collective the sticky error
     * failed (wait.h's verdict; NULL when it named none):
     * dshim_comm_get_missing */
    struct dshim_missing *missing;
    uint64_t split_seq;            /* splits so far (dshim_comm_split, the owner's thread) */
    /* flight recorder (shim/trace): this communicator's ring, NULL when
     * off; opened at init (dshim_comm_trace_open), closed by destroy; any
     * thread records into it */
    dshim_trace_ring_t *trace;

    /* Executor's scratch (executor only) */
    void *scratch;                 /* grown on demand by dshim_comm_scratch (comm.c) */
    size_t scratch_len;
    int *wait_ranks;               /* [size]: the wait rule's list of ranks not arrived (wait.h;
                                    * allocated at init) */

    /* The host gate (host_gate.c, its mechanism; host_gate.h): the barrier and small
     * allreduces of ranks that all share a host, through a counter in shared
     * memory */
    int gate_transport;            /* registry entry whose host area holds it; -1: no gate (init) */
    void *gate;                    /* that host area, mapped on first use (atomic: dshim_comm_fail reads it) */
    uint64_t gate_episode;         /* calls through it so far (executor only) */
    int gate_probe_next;           /* the next rank an idle probe looks at (atomic; written by hook_api.c) */

    /* Single copies (coll_single_copy.c: dshim_single_copy_plan at init,
     * then the executor only): every rank on this host, with a transport
     * that can read and write the others' memory */
    int single_copy_transport;     /* its registry entry; -1: none (decided at init) */
    int single_copy;               /* DSHIM_SINGLE_COPY_*: probed by the first call, the same on every rank */
    struct dshim_single_copy_gate *single_copy_gate; /* made by the first call; outlives the communicator */

    /* Hierarchy (topo.c, init; read-only after): only when ranks span
     * several hosts and some host has several, the ranks of my host, and
     * the first rank of every host */
    struct dshim_comm *local;      /* NULL when there is no hierarchy */
    struct dshim_comm *leaders;    /* non-NULL on the first rank of each host */
    int nhosts;
    int barrier_hier;              /* the barrier runs on local and leaders (coll.h dshim_barrier_hier) */
};

/* A failure's verdict: collective seq, and the n ranks that did not arrive
 * at it (n = -1: unknown, the store did not answer). */
typedef struct dshim_missing {
    uint64_t seq;
    int n;
    int ranks[];
} dshim_missing_t;

enum {
    DSHIM_ALGO_AUTO = 0,
    DSHIM_ALGO_RING,
    DSHIM_ALGO_RD,
    DSHIM_ALGO_HIER,
    DSHIM_ALGO_DIRECT,
    DSHIM_ALGO_RABENSEIFNER,
    DSHIM_ALGO_GATE,
    DSHIM_ALGO_GATE_SPLIT,
    DSHIM_ALGO_CMA
};
enum { DSHIM_SINGLE_COPY_UNKNOWN = 0, DSHIM_SINGLE_COPY_YES, DSHIM_SINGLE_COPY_NO };
enum { DSHIM_CONN_NONE = 0, DSHIM_CONN_CONNECTING, DSHIM_CONN_READY };

/* The connection to peer r, NULL when none was made yet. */
static inline dshim_conn_t *dshim_comm_conn(const dshim_comm_t *comm, int r)
{
    return __atomic_load_n(&comm->conns[r], __ATOMIC_ACQUIRE);
}
/* Connections on first use (bootstrap.c), made by the thread that executes
 * the communicator's operations (xfer.c) without blocking it, so that the
 * step's timeout, stall warnings and failure reports cover them too:
 *  - connect_start: begins the handshake with peer r (nothing to do when
 *    connected or begun).  An error names the peer (DSHIM_ERR_PEER: its
 *    listener refused, i.e. its process is gone).
 *  - connect_poll: moves it on without blocking; *done_p = 1 once the
 *    connection is published.  Meanwhile *fd_p and *events_p say what to sleep
 *    on: the handshake's socket, or (fd -1) comm->conn_event, written when
 *    the acceptor publishes a connection (this rank lost a simultaneous
 *    connect and waits for the peer's).
 *  - connect_cancel: gives a begun handshake up (the step failed). */
dshim_status_t dshim_comm_connect_start(dshim_comm_t *comm, int r);
dshim_status_t dshim_comm_connect_poll(dshim_comm_t *comm, int r, int *done_p, int *fd_p, short *events_p);
void dshim_comm_connect_cancel(dshim_comm_t *comm, int r);
/* The handshakes under way (any peer): how many; with ws, what they wait
 * on is added to it (*conn_event_p = 1 for those that wait for the
 * acceptor). */
int dshim_comm_connects_pending(dshim_comm_t *comm, dshim_wait_set_t *ws, int *conn_event_p);
/* connect_poll on every handshake under way; *moved_p set when one ended. */
dshim_status_t dshim_comm_connect_poll_all(dshim_comm_t *comm, int *moved_p);

/* This process's pid, without a system call (refreshed after fork). */
pid_t dshim_self_pid(void);
/* DSHIM_OK in the process that created comm; an error in a forked child. */
dshim_status_t dshim_comm_check_owner(const dshim_comm_t *comm, const char *what);
/* scratch of at least len bytes; valid until the next call */
dshim_status_t dshim_comm_scratch(dshim_comm_t *comm, size_t len, void **ptr_p);
/* Records the first error, tells peers (store + closing connections). */
dshim_status_t dshim_comm_fail(dshim_comm_t *comm, dshim_status_t st, const char *msg);
/* dshim_comm_fail with its verdict: the ranks that did not arrive at
 * collective seq (missing[0..n), n = -1: unknown), kept when this failure
 * is the communicator's first (dshim_comm_get_missing). */
dshim_status_t dshim_comm_fail_missing(dshim_comm_t *comm, dshim_status_t st, const char *msg, uint64_t seq,
                                       const int *missing, int n);
/* A communicator over some of comm's ranks, bootstrapped under comm's store
 * prefix + suffix (which the members must agree on) and sharing its store;
 * members[i] is the comm rank of its rank i (for its job_rank). */
dshim_status_t dshim_comm_create_child(dshim_comm_t *comm, const char *suffix, int rank, int size,
                                       const int *members, dshim_comm_t **child_p);
/* Builds comm->local / comm->leaders when ranks span hosts (shim/comm/topo.c). */
dshim_status_t dshim_topo_setup(dshim_comm_t *comm);
void dshim_topo_destroy(dshim_comm_t *comm);
/* Opens comm's flight-recorder ring (comm->trace stays NULL when the
 * recorder is off); closed by dshim_comm_destroy. */
void dshim_comm_trace_open(dshim_comm_t *comm, const char *desc);
/* Whether every rank's peer record names this rank's host. */
static inline int dshim_comm_one_host(const dshim_comm_t *comm)
{
    for (int r = 0; r < comm->size; r++) {
        if (comm->peers[r].host_id != comm->peers[comm->rank].host_id) {
            return 0;
        }
    }
    return 1;
}
/* Counts bytes that moved without a connection (dshim_comm_stats): through
 * the host gate's shared memory, or read straight from this rank's buffers
 * by its peers (single copy). */
static inline void dshim_comm_count_moved(dshim_comm_t *comm, size_t sent, size_t received)
{
    __atomic_add_fetch(&comm->stats.bytes_sent, (uint64_t)sent, __ATOMIC_RELAXED);
    __atomic_add_fetch(&comm->stats.bytes_received, (uint64_t)received, __ATOMIC_RELAXED);
}
/* "rank 3 (host h, pid p)" */
void dshim_comm_describe_peer(const dshim_comm_t *comm, int peer, char *out, size_t len);
/* Appends rank r to a list such as "ranks that did not arrive: 2, 5" at
 * out + *o: "3", or "1 (job rank 3)" on a sub-communicator, whose numbering
 * is not the job's; ", " before every entry but the first.  Stops short of
 * overflowing len. */
void dshim_comm_list_rank(const dshim_comm_t *comm, int r, char *out, size_t len, size_t *o);

#endif

/* Wire format and node internals of dshim's parameter server (shim/ps/ps.h).
 * Every message is one fixed header plus `len` payload bytes, on TCP. */
#ifndef DSHIM_PS_PROTO_H
#define DSHIM_PS_PROTO_H

#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <netinet/in.h>
#include "ps.h"

#define DSHIM_PS_MAGIC 0x53505344u /* "DSPS" */

enum {
    DSHIM_PS_MSG_HELLO = 1,     /* node -> scheduler: dshim_ps_hello_t */
    DSHIM_PS_MSG_ASSIGN,        /* scheduler -> node: rank, then the servers' addresses */
    DSHIM_PS_MSG_BARRIER,       /* node -> scheduler: key = group */
    DSHIM_PS_MSG_BARRIER_DONE,  /* scheduler -> node */
    DSHIM_PS_MSG_DEAD,          /* scheduler -> node: key = group of the dead node, payload = text */
    DSHIM_PS_MSG_BYE,           /* node -> scheduler: a clean end follows */
    DSHIM_PS_MSG_WHELLO,        /* worker -> server: key = worker rank, payload = token */
    DSHIM_PS_MSG_PUSH,          /* worker -> server: key, dtype, payload (flags) */
    DSHIM_PS_MSG_PULL,          /* worker -> server: key, dtype */
    DSHIM_PS_MSG_CMD,           /* worker -> server: key = command id, payload = body */
    DSHIM_PS_MSG_REPLY,         /* server -> worker: seq; payload = value for pulls */
    DSHIM_PS_MSG_ERROR,         /* server -> worker: seq; payload = text */
    DSHIM_PS_MSG_STOP,          /* scheduler -> server: every worker left without kStopServer */
    DSHIM_PS_MSG_FAIL,          /* node -> scheduler: it ends with this error (payload = text) */
    DSHIM_PS_MSG_WAITING,       /* server -> worker, scheduler -> node: alive, waiting for another node (ps.h) */
};

/* Fixed deadlines of single protocol steps, which are not the user's
 * DSHIM_TIMEOUT (dshim_ps_deadline): their length does not depend on the
 * job, and a peer that stopped in the middle of one must not hold a node
 * for the user's timeout (torch's and MXNet's run to 30 min). */
/* a control message to or from a peer that is reading (a connecting node's
 * hello, the scheduler's ASSIGN, BARRIER_DONE and STOP, a node's message to
 * the scheduler once its header came) */
#define DSHIM_PS_CONTROL_S 10.0
/* the rest of a scheduler's message once its header came (it writes each
 * whole), and a node's BYE before its clean end */
#define DSHIM_PS_REST_S 5.0
/* a word to a peer that may be gone or stopped (a death notice, FAIL, a
 * worker's goodbye): best effort, the sender ends anyway */
#define DSHIM_PS_FAREWELL_S 2.0
/* how long a node whose connection to a peer broke waits for the
 * scheduler's death notice, which names the process (the scheduler sees the
 * same connection close; no timer of anyone's is involved) */
#define DSHIM_PS_NOTICE_S 2.0

#define DSHIM_PS_F_PULL 1u       /* push: answer with the stored value */
#define DSHIM_PS_F_COMPRESSED 2u /* push: 2-bit words of `nelem` values */
#define DSHIM_PS_F_PIECE 4u      /* push: values [off, off + len/size) of a key of `nelem` */
/* push/pull of rows of a row_sparse key's server part (MXNet's kRowSparsePushPull):
 * nelem = rows in the part, off = elements per row; payload = `nrows` int64 row
 * ids (relative to the part, ascending), then for a push nrows x off values; the
 * answer to a pull is the nrows rows' values in the order asked */
#define DSHIM_PS_F_ROWS 8u

typedef struct dshim_ps_hdr {
    uint32_t magic;
    uint8_t type;
    uint8_t flags;
    uint16_t dtype;
    int32_t key;
    uint32_t seq;
    uint64_t nelem;
    uint64_t len;
    uint64_t off; /* DSHIM_PS_F_PIECE: first element of the piece */
} dshim_ps_hdr_t;

typedef struct dshim_ps_hello {
    int32_t role;
    int32_t port;     /* servers: data port */
    uint32_t ip;      /* servers: data address (network order) */
    int32_t pid;
    int32_t hint;     /* DMLC_TASK_ID or -1: ranks follow it within a role */
    char host[64];
    char token[64];   /* DSHIM_JOB_TOKEN ("" when none) */
} dshim_ps_hello_t;

typedef struct dshim_ps_assign {
    int32_t rank;
    int32_t num_workers;
    int32_t num_servers;
    int32_t pad;
    /* then num_servers x dshim_ps_hello_t (servers by rank) */
} dshim_ps_assign_t;

typedef struct dshim_ps_pending {
    uint32_t seq;
    int server;
    void *out;
    size_t out_len;
    dshim_ps_done_fn on_done; /* called by the receiver thread once answered (or failed) */
    void *arg;
    int refusable;            /* a command: a server's error answer fails this call only */
    /* what it is, for stall lines and the flight recorder (ps_trace.c) */
    int key;
    int what;                 /* dshim_ps_req_t */
    uint64_t round;           /* the key's round on its server as this worker counts it */
    uint64_t trace_id;        /* DSHIM_PS_NO_TRACE (ps_trace.h) when none */
    int trace_waiting;        /* its entry says waiting */
    double t_sent;            /* dshim_now() when registered */
} dshim_ps_pending_t;

/* The kinds of a worker's requests (what dshim_ps_pending_t.what says). */
typedef enum {
    DSHIM_PS_REQ_OTHER = 0,
    DSHIM_PS_REQ_PUSH,
    DSHIM_PS_REQ_PUSHPULL,
    DSHIM_PS_REQ_INIT,
    DSHIM_PS_REQ_PULL,
    DSHIM_PS_REQ_CMD,
    DSHIM_PS_REQ_PUSH_ROWS,
    DSHIM_PS_REQ_PULL_ROWS,
    DSHIM_PS_REQ_PIECES, /* a piece of a pushpull part: the part's one entry covers it */
} dshim_ps_req_t;

struct dshim_trace_ring;   /* shim/trace/trace.h: only ps_trace.c uses it */
struct dshim_ps_wtrace;    /* a worker's request bookkeeping (ps_trace.c) */

struct dshim_ps_node {
    dshim_ps_env_t env;
    int rank;
    int sched_fd;
    pthread_mutex_t send_mu;   /* writes to sched_fd */
    pthread_mutex_t mu;        /* the fields below */
    pthread_cond_t cond;
    pthread_t monitor;
    int monitor_running;
    int closing;
    int stop_requested;        /* the scheduler's STOP: every worker left without a barrier */
    unsigned long barriers_done;
    double sched_heard;        /* dshim_now() of the scheduler's last message (its silence times a barrier out) */
    int dead_groups[8];        /* dead nodes per group bit index */
    char failure[512];         /* first death / scheduler loss */
    int failure_told;          /* the scheduler knows it (its notice, or lost) */
    int wake_pipe[2];          /* written when failure is set */
    dshim_ps_hello_t *servers; /* num_servers entries */
    /* server role */
    int listen_fd;
    struct in_addr addr;
    int port;
    /* worker role: data connections; answers are read by the receiver thread */
    int *server_fds;
    unsigned char *server_local; /* the server runs on this host (same address both ends) */
    pthread_mutex_t pend_mu;   /* next_seq, pending, quiescing */
    pthread_cond_t pend_cond;  /* signalled when a request completes */
    uint32_t next_seq;
    dshim_ps_pending_t **pending;
    size_t npending, cap_pending;
    int quiescing;             /* teardown: a server closing its side is expected */
    pthread_t receiver;
    int receiver_running;
    int recv_pipe[2];          /* stops the receiver */
    char recv_error[512];      /* why the receiver stopped, "" while healthy */
    char cmd_error[512];       /* a server refused the current command (under pend_mu) */
    /* flight recorder (ps_trace.c): this node's ring ("ps/worker.R",
     * "ps/server.R"), NULL when the recorder is off; a worker's per-key
     * round counts and stall bookkeeping (under pend_mu) */
    struct dshim_trace_ring *trace;
    struct dshim_ps_wtrace *wtrace;
    /* counters */
    unsigned long n_push, n_pull, n_cmd;
    unsigned long long bytes_out, bytes_in;
};

/* I/O with a deadline (monotonic seconds; <= 0: none). */
dshim_status_t dshim_ps_send(int fd, const dshim_ps_hdr_t *h, const void *payload, double deadline);
dshim_status_t dshim_ps_recv_hdr(int fd, dshim_ps_hdr_t *h, double deadline);
dshim_status_t dshim_ps_recv_body(int fd, void *buf, size_t len, double deadline);
dshim_status_t dshim_ps_skip_body(int fd, size_t len, double deadline);
void dshim_ps_hdr_init(dshim_ps_hdr_t *h, int type, int key, uint64_t len);
/* A connection in a poll() set that the loop must read now: data came, or the
 * peer hung up or the connection failed -- then the read reports the peer's
 * death (DSHIM_ERR_PEER), so a hang-up is never left unread.  The one rule of
 * the scheduler's, the servers' and the workers' loops. */
static inline int dshim_ps_conn_ready(const struct pollfd *p)
{
    return p->fd >= 0 && (p->revents & (POLLIN | POLLHUP | POLLERR)) != 0;
}
const char *dshim_ps_msg_name(int type);
/* records the node's failure (first one wins) and wakes waiters */
void dshim_ps_node_fail(dshim_ps_node_t *node, const char *msg);

#endif

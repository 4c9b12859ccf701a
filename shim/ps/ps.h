/* dshim's parameter server: the scheduler / server / worker roles of MXNet's
 * distributed kvstore (ps-lite's job), over plain TCP connections.
 *
 * Topology: every worker and server keeps one connection to the scheduler
 * (registration, barriers, and the job's lifeline: a connection that closes
 * without a BYE is a dead node, announced to everyone); every worker connects
 * to every server for data.  Semantics follow MXNet 1.9.1's KVStoreDist and
 * KVStoreDistServer (see docs/mxnet.md).  Nothing here knows MXNet's C API:
 * hooks/mxnet adapts NDArrays and the Python callbacks. */
#ifndef DSHIM_PS_H
#define DSHIM_PS_H

#include <stddef.h>
#include <stdint.h>
#include "dshim.h"

typedef enum { DSHIM_PS_WORKER = 0, DSHIM_PS_SERVER = 1, DSHIM_PS_SCHEDULER = 2 } dshim_ps_role_t;

/* ps-lite's group ids (GetNumDeadNode, barriers) */
#define DSHIM_PS_GROUP_SCHEDULER 1
#define DSHIM_PS_GROUP_SERVERS 2
#define DSHIM_PS_GROUP_WORKERS 4
#define DSHIM_PS_GROUP_ALL 7

/* MXNet's CommandType (src/kvstore/kvstore_dist_server.h) */
enum {
    DSHIM_PS_CMD_CONTROLLER = 0,
    DSHIM_PS_CMD_MULTI_PRECISION = 1,
    DSHIM_PS_CMD_STOP_SERVER = 2,
    DSHIM_PS_CMD_SYNC_MODE = 3,
    DSHIM_PS_CMD_GRADIENT_COMPRESSION = 4,
    DSHIM_PS_CMD_PROFILER = 5,
};

typedef struct dshim_ps_env {
    dshim_ps_role_t role;
    int num_workers;
    int num_servers;
    char root_uri[256];
    int root_port;
    char node_host[256];
    int verbose;           /* PS_VERBOSE */
    int resend;            /* PS_RESEND */
    int resend_timeout_ms; /* PS_RESEND_TIMEOUT */
    size_t bigarray_bound; /* MXNET_KVSTORE_BIGARRAY_BOUND */
    double timeout_s;
    double stall_warn_s;   /* DSHIM_STALL_WARN: a stalled round or request is reported this often */
    double connect_timeout_s;
    int counters;
    size_t piece_bytes; /* DSHIM_PS_PIECE: 0 = whole keys */
    int piece_local;    /* DSHIM_PS_PIECE_LOCAL */
    int task_id;        /* DMLC_TASK_ID: rank order hint, -1 = none */
    char token[64];     /* DSHIM_JOB_TOKEN: peers must present the same */
} dshim_ps_env_t;

/* The role alone (MXNet: worker when DMLC_ROLE is unset or "worker"). */
dshim_ps_role_t dshim_ps_role(void);
/* Everything the job needs; DSHIM_ERR_INVALID naming the missing variable. */
dshim_status_t dshim_ps_env_load(dshim_ps_env_t *env);
const char *dshim_ps_role_name(dshim_ps_role_t role);

/* --- DSHIM_TIMEOUT: the one reading of the user's timeout ------------------
 * Every deadline of the parameter server that is the user's timeout comes
 * from here (the fixed deadlines of single protocol steps are ps_proto.h's
 * DSHIM_PS_*_S).  Each deadline has one owner: the process that knows why
 * it passed says so.  A round that waits for a worker's push is the
 * server's (it names the worker); a barrier is the scheduler's (it names
 * who did not reach it); a server or scheduler that does not answer at all
 * is its client's.  So that a client never takes a live peer for a silent
 * one, a server with a waiting round and the scheduler with an open barrier
 * send WAITING to the nodes that wait on them every dshim_ps_alive_every;
 * the client's own deadline counts from the last word it heard. */

/* The deadline DSHIM_TIMEOUT after `from` (dshim_now's clock), or 0 when
 * the timeout is off (DSHIM_TIMEOUT <= 0): dshim_ps_send's and
 * dshim_ps_recv_*'s "no deadline". */
double dshim_ps_deadline(const dshim_ps_env_t *env, double from);
/* Whether DSHIM_TIMEOUT has passed since `since` at `now` (never when off). */
int dshim_ps_timed_out(const dshim_ps_env_t *env, double since, double now);
/* How often a peer that others wait on says WAITING: well within the
 * timeout (a quarter of it, at most 1 s), so a live one is never silent
 * for the timeout. */
double dshim_ps_alive_every(const dshim_ps_env_t *env);

/* --- key placement (MXNet's EncodeDefaultKey / EncodeCompressedKey) ------ */
typedef struct dshim_ps_part {
    int server;
    size_t offset; /* first element */
    size_t count;  /* elements */
    size_t woffset, wcount; /* 2-bit words (compressed layout only) */
} dshim_ps_part_t;
/* Fills parts[0..num_servers) and returns how many are used (1 or num_servers).
 * compressed: the layout MXNet uses for a key once 2-bit compression is on. */
int dshim_ps_layout(int key, size_t n, int num_servers, size_t bound, int compressed,
                    dshim_ps_part_t *parts);

/* The placement of a row_sparse key of `rows` rows of `unit` elements (MXNet's
 * EncodeRowSparseKey): whole rows; offset and count are in rows. */
int dshim_ps_row_layout(int key, size_t rows, size_t unit, int num_servers, size_t bound, dshim_ps_part_t *parts);

/* --- a node (worker or server): its scheduler connection ----------------- */
typedef struct dshim_ps_node dshim_ps_node_t;

/* Registers with the scheduler; a server listens first.  Returns when the
 * scheduler has assigned this node's rank (all nodes registered). */
dshim_status_t dshim_ps_node_start(const dshim_ps_env_t *env, dshim_ps_node_t **out);
int dshim_ps_node_rank(const dshim_ps_node_t *node);
const dshim_ps_env_t *dshim_ps_node_env(const dshim_ps_node_t *node);
/* A barrier over the groups in `group` (DSHIM_PS_GROUP_* bits). */
dshim_status_t dshim_ps_barrier(dshim_ps_node_t *node, int group);
/* Nodes in `group` known dead (the scheduler announces deaths at once). */
int dshim_ps_num_dead(dshim_ps_node_t *node, int group);
/* 1 once the scheduler said every worker left without stopping the servers
 * (SetBarrierBeforeExit(0)): a server then ends without the final barrier. */
int dshim_ps_stop_requested(dshim_ps_node_t *node);
/* Non-NULL once a peer died or the scheduler went away: the message. */
const char *dshim_ps_failure(dshim_ps_node_t *node);
/* After a broken data connection: waits up to `seconds` for the scheduler's
 * death notice (it names the process, pid and host); NULL if none came. */
const char *dshim_ps_wait_failure(dshim_ps_node_t *node, double seconds);
/* This node ends with an error of its own (not one the scheduler announced):
 * the scheduler tells every other process why, instead of announcing a death
 * when its connection then closes without a goodbye. */
void dshim_ps_node_tell_failure(dshim_ps_node_t *node, const char *why);
/* Barrier over everyone (unless skip_barrier), BYE, close, free. */
dshim_status_t dshim_ps_node_finish(dshim_ps_node_t *node, int skip_barrier);

/* --- worker ---------------------------------------------------------------- */
/* Opens the data connections to every server (after dshim_ps_node_start). */
dshim_status_t dshim_ps_worker_connect(dshim_ps_node_t *node);
/* Completion of an asynchronous request: ok = 1 when answered. */
typedef void (*dshim_ps_done_fn)(void *arg, int ok);
/* dshim_ps_worker_push with a callback (run on the receiver thread) instead of
 * dshim_ps_worker_wait_all; safe from any thread.  fn runs exactly once --
 * also when this call returns an error. */
dshim_status_t dshim_ps_worker_push_cb(dshim_ps_node_t *node, int server, int key, int dtype, const void *payload,
                                       size_t len, int want_pull, void *out, size_t out_len, dshim_ps_done_fn fn,
                                       void *arg);
/* A pushpull of one server part (len bytes of `dtype`, answered into out) as
 * pieces of at most piece_bytes, each summed and answered by the server on
 * its own, so the answer streams back while the push is still going out.
 * Only for sync mode, uncompressed keys without a float32 master copy on the
 * server (float32).  fn runs exactly once, when every piece was answered (ok
 * = 1) or one failed -- also when this call returns an error. */
dshim_status_t dshim_ps_worker_pushpull_pieces(dshim_ps_node_t *node, int server, int key, int dtype,
                                               const void *payload, size_t len, void *out, size_t piece_bytes,
                                               dshim_ps_done_fn fn, void *arg);
/* 1 when the server runs on this host (its connection has the same address
 * at both ends): pieces pay off only across a network. */
int dshim_ps_worker_server_is_local(const dshim_ps_node_t *node, int server);
/* This thread's pushes until dshim_ps_worker_mark_init(0) are keys' initial
 * values (rank 0's init, no round of the servers): the flight recorder
 * labels them "MXNet init key K" and does not count them as rounds. */
void dshim_ps_worker_mark_init(int on);
/* Teardown begins: no more requests; a server closing its side is no failure. */
void dshim_ps_worker_quiesce(dshim_ps_node_t *node);
/* Tells every server this worker leaves on purpose (its connection's end is
 * then no death); after dshim_ps_worker_quiesce.  Errors are ignored. */
void dshim_ps_worker_goodbye(dshim_ps_node_t *node);
/* Sends one part of a push (payload bytes) to a server; does not wait.
 * want_pull: the server answers with the stored value after the update
 * (MXNet's ZPushPull), read by dshim_ps_worker_wait into out.  init: the
 * first push of a key.  compressed: payload is 2-bit words of `nelem` values. */
dshim_status_t dshim_ps_worker_push(dshim_ps_node_t *node, int server, int key, int dtype,
                                    const void *payload, size_t len, size_t nelem, int compressed,
                                    int want_pull, void *out, size_t out_len, uint32_t *seq_p);
/* Asks a server for its value of key (out_len bytes into out); does not wait. */
dshim_status_t dshim_ps_worker_pull(dshim_ps_node_t *node, int server, int key, int dtype,
                                    void *out, size_t out_len, uint32_t *seq_p);
/* Rows of a row_sparse key's server part (DSHIM_PS_F_ROWS): part_rows rows of
 * `unit` elements.  A push sends payload = nrows int64 row ids (relative to the
 * part, ascending) then their values; a pull sends the ids and gets the rows'
 * values into out (out_len bytes).  Neither waits (dshim_ps_worker_wait_all). */
dshim_status_t dshim_ps_worker_push_rows(dshim_ps_node_t *node, int server, int key, int dtype, const void *payload,
                                         size_t len, size_t part_rows, size_t unit);
dshim_status_t dshim_ps_worker_pull_rows(dshim_ps_node_t *node, int server, int key, int dtype, const int64_t *ids,
                                         size_t nrows, size_t part_rows, size_t unit, void *out, size_t out_len);
/* Waits for every outstanding request (pushes' acknowledgements, pulls). */
dshim_status_t dshim_ps_worker_wait_all(dshim_ps_node_t *node);
/* Forgets outstanding requests without a callback (their buffers are about to
 * be freed after an error; the job is failing anyway). */
void dshim_ps_worker_drop(dshim_ps_node_t *node);
/* Stops the receiver thread (dshim_ps_node_finish calls it). */
void dshim_ps_worker_stop(dshim_ps_node_t *node);
/* A command to every server (MXNet's SendCommandToServers); waits for all. */
dshim_status_t dshim_ps_worker_command(dshim_ps_node_t *node, int cmd, const char *body);

/* --- server ---------------------------------------------------------------- */
/* How the server stores values: the default keeps plain memory; hooks/mxnet
 * keeps NDArrays so that the Python optimizer can update them in place. */
typedef struct dshim_ps_server_ops {
    void *ctx;
    /* n elements of dtype: returns the data pointer; *cookie names the buffer */
    void *(*alloc)(void *ctx, size_t n, int dtype, void **cookie);
    void (*release)(void *ctx, void *cookie);
    /* wait until the buffer may be read (write=0) or written (write=1) */
    void (*wait)(void *ctx, void *cookie, int write);
    /* 1 when an updater (optimizer) is set */
    int (*has_updater)(void *ctx);
    /* runs the updater: stored <- update(key, recv, stored); 0 or an error */
    int (*update)(void *ctx, int key, void *recv_cookie, void *stored_cookie);
    /* runs the updater with a row_sparse gradient: `nrows` rows (ascending ids,
     * values of dtype, contiguous) of a key part of rows x unit elements;
     * stored_cookie holds the part's values, all rows, dense.  NULL: the server
     * cannot take row_sparse updates with an updater */
    int (*update_rows)(void *ctx, int key, const int64_t *ids, size_t nrows, const void *vals, size_t rows,
                       size_t unit, int dtype, void *stored_cookie);
    /* MXNet's controller for command 0 (and any command the server does not know) */
    int (*controller)(void *ctx, int head, const char *body);
    /* MXNet's kSetProfilerParams (body as KVStoreDist sends it); 0, or -1 with
     * the reason in err. NULL: the server has no profiler (an error to ask) */
    int (*profiler)(void *ctx, const char *body, char *err, size_t err_len);
} dshim_ps_server_ops_t;

/* Serves until a worker sends kStopServer (or a peer dies: an error). */
dshim_status_t dshim_ps_server_run(dshim_ps_node_t *node, const dshim_ps_server_ops_t *ops);

/* --- scheduler ------------------------------------------------------------- */
/* Registration, barriers and death notices until every node said BYE. */
dshim_status_t dshim_ps_scheduler_run(const dshim_ps_env_t *env);

/* element size of an MXNet dtype code, 0 when unknown */
size_t dshim_ps_dtype_size(int dtype);
/* dst += src for n elements of an MXNet dtype (MXNet's `merged += recved`) */
dshim_status_t dshim_ps_add(void *dst, const void *src, size_t n, int dtype);
/* Multi-precision (kSetMultiPrecision): n values of MXNet dtype to float32,
 * and back (float16/bfloat16 rounded to nearest even, integers truncated, as
 * MXNet's CopyFromTo casts). */
dshim_status_t dshim_ps_to_float32(float *dst, const void *src, size_t n, int dtype);
dshim_status_t dshim_ps_from_float32(void *dst, const float *src, size_t n, int dtype);

#endif

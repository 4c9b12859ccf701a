/*
 * dshim public C API.
 *
 * A communicator joins `size` processes (ranks) through a small TCP rendezvous
 * store, then moves data over shared memory between ranks of one host and over
 * TCP between hosts.  Every collective exists in a blocking form and in a
 * non-blocking form (prefix `i`) returning a request; requests of one
 * communicator complete in the order they were issued.
 *
 * Errors: every call returns a dshim_status_t; on failure dshim_last_error()
 * returns a one-line message (thread-local) naming the rank, the peer and the
 * cause.  A communicator that saw a communication error is poisoned: later
 * calls on it fail fast with the same message.
 *
 * NULL pointers: a function returning dshim_status_t returns
 * DSHIM_ERR_INVALID for a NULL argument unless its comment says that one may
 * be NULL; a buffer may be NULL only when its count is 0 (or where it is
 * "significant only at root", on the other ranks).  Functions of other
 * types say what they do with a NULL; none of them crashes on one
 * (tests/unit/api/check_api_null.c calls each with each pointer NULL).
 */
#ifndef DSHIM_H
#define DSHIM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define DSHIM_EXPORT __attribute__((visibility("default")))
#else
#define DSHIM_EXPORT
#endif

#define DSHIM_VERSION_MAJOR 0
#define DSHIM_VERSION_MINOR 1
#define DSHIM_VERSION_PATCH 0

/* The library's version as MAJOR*10000 + MINOR*100 + PATCH: a program built
 * against this header can check that the libdshim.so it loaded is as new. */
DSHIM_EXPORT int dshim_abi_version(void);

typedef enum dshim_status {
    DSHIM_OK              = 0,
    DSHIM_INPROGRESS      = 1,   /* non-blocking operation not finished yet */
    DSHIM_ERR_INVALID     = -1,  /* bad argument or bad configuration value */
    DSHIM_ERR_NOMEM       = -2,
    DSHIM_ERR_SYSTEM      = -3,  /* a system call failed (errno in the message) */
    DSHIM_ERR_TIMEOUT     = -4,  /* DSHIM_TIMEOUT elapsed without progress */
    DSHIM_ERR_PEER        = -5,  /* a peer died or closed its connection */
    DSHIM_ERR_MISMATCH    = -6,  /* ranks called different collectives */
    DSHIM_ERR_PROTOCOL    = -7,  /* garbage or a wrong token on the wire */
    DSHIM_ERR_ABORTED     = -8,  /* communicator aborted (locally or by a peer) */
    DSHIM_ERR_UNSUPPORTED = -9,
    DSHIM_ERR_INTERNAL    = -10,
} dshim_status_t;

typedef enum dshim_dtype {
    DSHIM_INT8 = 0,
    DSHIM_UINT8,
    DSHIM_INT32,
    DSHIM_UINT32,
    DSHIM_INT64,
    DSHIM_UINT64,
    DSHIM_FLOAT16,
    DSHIM_BFLOAT16,
    DSHIM_FLOAT32,
    DSHIM_FLOAT64,
    DSHIM_FLOAT8_E4M3,  /* OCP fp8 e4m3fn (no infinities) */
    DSHIM_FLOAT8_E5M2,  /* OCP fp8 e5m2 */
    DSHIM_DTYPE_COUNT
} dshim_dtype_t;

typedef enum dshim_redop {
    DSHIM_SUM = 0,
    DSHIM_PROD,
    DSHIM_MIN,
    DSHIM_MAX,
    DSHIM_AVG,   /* sum, then divided by the communicator size on every rank */
    DSHIM_REDOP_COUNT
} dshim_redop_t;

typedef struct dshim_comm dshim_comm_t;
typedef struct dshim_request dshim_request_t;

/* Explicit communicator creation.  Rank `0` hosts the rendezvous store at
 * store_addr:store_port unless store_external is set (launcher-hosted). */
typedef struct dshim_comm_args {
    int         rank;
    int         size;
    const char *store_addr;     /* host name or IPv4 address */
    int         store_port;
    const char *token;          /* job token; NULL = derived (see docs) */
    int         store_external; /* 1: the store is hosted by someone else */
} dshim_comm_args_t;

/* comm_p and args (and args->store_addr) must not be NULL; args->token may.
 * From the environment: DSHIM_RANK/RANK/OMPI_COMM_WORLD_RANK/PMI_RANK/
 * SLURM_PROCID, the matching size variables, MASTER_ADDR/MASTER_PORT or
 * DSHIM_STORE_ADDR/DSHIM_STORE_PORT. */
DSHIM_EXPORT dshim_status_t dshim_comm_init_env(dshim_comm_t **comm_p);
DSHIM_EXPORT dshim_status_t dshim_comm_init(const dshim_comm_args_t *args, dshim_comm_t **comm_p);
/* Rank 0, before dshim_comm_init, when the store's port must be published to
 * the other ranks first (e.g. through torch's store): binds the rendezvous
 * store now (port 0 = a free port, returned in *port_p), leaving no window in
 * which another process could take the port.  This process's next rank-0
 * dshim_comm_init with store_port = *port_p (store_external 0, same token)
 * adopts it.  token may be NULL (derived, as for dshim_comm_args_t); port_p
 * must not. */
DSHIM_EXPORT dshim_status_t dshim_store_prebind(int port, const char *token, int *port_p);
/* The same, listening only where the other ranks reach it: addr (the address
 * published to them) when it is loopback or one of this host's addresses,
 * else the interface DSHIM_SOCKET_IFNAME names, else every interface
 * (dshim_store_prebind: always every interface). */
DSHIM_EXPORT dshim_status_t dshim_store_prebind_at(const char *addr, int port, const char *token, int *port_p);
/* The IPv4 address under which the other ranks reach this host, as dotted
 * text in buf (len >= 16): the address dshim's own data connections use
 * when the job's master (rendezvous host) is `reach`: the interface
 * DSHIM_SOCKET_IFNAME & co. name, else the source address of the route to
 * reach (reach's own address when it is loopback here).  reach may be NULL
 * or "": this host's name stands for it (127.0.0.1 when that does not
 * resolve).  How a binding that hosts a rendezvous (the torch backend's
 * rank 0) chooses the address it publishes, by dshim's one rule. */
DSHIM_EXPORT dshim_status_t dshim_host_address(const char *reach, char *buf, size_t len);
/* Collective over `comm`: ranks with the same color form a new communicator,
 * ordered by (key, old rank).  color < 0: *newcomm_p = NULL. */
DSHIM_EXPORT dshim_status_t dshim_comm_split(dshim_comm_t *comm, int color, int key,
                                             dshim_comm_t **newcomm_p);
/* Waits for outstanding requests, then closes everything.  comm may be NULL
 * (DSHIM_OK, nothing to do). */
DSHIM_EXPORT dshim_status_t dshim_comm_destroy(dshim_comm_t *comm);
/* Fails outstanding and future operations at once; peers see an error too.
 * reason may be NULL ("no reason given"). */
DSHIM_EXPORT dshim_status_t dshim_comm_abort(dshim_comm_t *comm, const char *reason);
/* This communicator's limit on an operation without progress, replacing
 * DSHIM_TIMEOUT (e.g. the timeout given to torch's init_process_group);
 * <= 0 means no limit.  Call it before issuing operations on comm. */
DSHIM_EXPORT dshim_status_t dshim_comm_set_timeout(dshim_comm_t *comm, double seconds);
/* Names the communicator in flight-recorder dumps, the launcher's diagnosis
 * and the timeline ("torch group 1 (default_pg)"); copied; NULL clears it. */
DSHIM_EXPORT dshim_status_t dshim_comm_set_desc(dshim_comm_t *comm, const char *desc);
/* -1 for a NULL comm. */
DSHIM_EXPORT int dshim_comm_rank(const dshim_comm_t *comm);
DSHIM_EXPORT int dshim_comm_size(const dshim_comm_t *comm);
/* "shm", "tcp", "shm+tcp" or "self": what carries this rank's traffic
 * ("none" for a NULL comm). */
DSHIM_EXPORT const char *dshim_comm_transport(const dshim_comm_t *comm);
/* First error seen by the communicator (DSHIM_OK if none); message copied
 * into msg unless msg is NULL or msg_len 0. */
DSHIM_EXPORT dshim_status_t dshim_comm_get_error(dshim_comm_t *comm, char *msg, size_t msg_len);
/* The ranks the communicator's first error found missing, as data (its
 * message names them too): when a collective failed waiting for ranks that
 * did not arrive at it (the communicator's timeout, or a rank that exited
 * before it arrived), *seq = that collective's number (the communicator's
 * collectives counted from 0, as the messages' "allreduce #5"), *nmissing =
 * how many ranks did not arrive (-1: unknown, the store holding the ranks'
 * arrival marks did not answer; 0: none known), and the first `cap` of
 * them, in this communicator's numbering and ascending, into missing.
 * Returns that error's status (DSHIM_ERR_TIMEOUT, DSHIM_ERR_PEER), or
 * DSHIM_OK when the communicator has no such verdict (no error, or one
 * that names no missing ranks: a point-to-point timeout, a mismatch, ...);
 * DSHIM_ERR_INVALID for a NULL comm, seq or nmissing (or missing with
 * cap > 0). */
DSHIM_EXPORT dshim_status_t dshim_comm_get_missing(dshim_comm_t *comm, uint64_t *seq, int *missing, int cap,
                                                   int *nmissing);

DSHIM_EXPORT const char *dshim_last_error(void);
DSHIM_EXPORT const char *dshim_status_string(dshim_status_t status);
DSHIM_EXPORT size_t dshim_dtype_size(dshim_dtype_t dtype);
DSHIM_EXPORT const char *dshim_dtype_name(dshim_dtype_t dtype);
DSHIM_EXPORT const char *dshim_redop_name(dshim_redop_t op);

/* Requests. test: *done_p = 1 once complete (status returned is the
 * operation's).  wait: blocks until complete.  free: releases the request
 * (waits first if it is still running); NULL is ignored. */
DSHIM_EXPORT dshim_status_t dshim_test(dshim_request_t *req, int *done_p);
DSHIM_EXPORT dshim_status_t dshim_wait(dshim_request_t *req);
DSHIM_EXPORT void dshim_request_free(dshim_request_t *req);

/* Collectives.  sendbuf == recvbuf means in place.  Counts are elements. */
DSHIM_EXPORT dshim_status_t dshim_allreduce(dshim_comm_t *comm, const void *sendbuf, void *recvbuf,
                                            size_t count, dshim_dtype_t dtype, dshim_redop_t op);
DSHIM_EXPORT dshim_status_t dshim_iallreduce(dshim_comm_t *comm, const void *sendbuf, void *recvbuf,
                                             size_t count, dshim_dtype_t dtype, dshim_redop_t op,
                                             dshim_request_t **req_p);
DSHIM_EXPORT dshim_status_t dshim_broadcast(dshim_comm_t *comm, void *buf, size_t count,
                                            dshim_dtype_t dtype, int root);
DSHIM_EXPORT dshim_status_t dshim_ibroadcast(dshim_comm_t *comm, void *buf, size_t count,
                                             dshim_dtype_t dtype, int root, dshim_request_t **req_p);
/* recvbuf significant only at root. */
DSHIM_EXPORT dshim_status_t dshim_reduce(dshim_comm_t *comm, const void *sendbuf, void *recvbuf,
                                         size_t count, dshim_dtype_t dtype, dshim_redop_t op, int root);
DSHIM_EXPORT dshim_status_t dshim_ireduce(dshim_comm_t *comm, const void *sendbuf, void *recvbuf,
                                          size_t count, dshim_dtype_t dtype, dshim_redop_t op, int root,
                                          dshim_request_t **req_p);
/* recvbuf holds size*count elements, rank r's block at r*count. */
DSHIM_EXPORT dshim_status_t dshim_allgather(dshim_comm_t *comm, const void *sendbuf, void *recvbuf,
                                            size_t count, dshim_dtype_t dtype);
DSHIM_EXPORT dshim_status_t dshim_iallgather(dshim_comm_t *comm, const void *sendbuf, void *recvbuf,
                                             size_t count, dshim_dtype_t dtype, dshim_request_t **req_p);
/* Uneven: rank r contributes counts[r] elements placed at displs[r] (neither
 * array may be NULL). */
DSHIM_EXPORT dshim_status_t dshim_allgatherv(dshim_comm_t *comm, const void *sendbuf, void *recvbuf,
                                             const size_t *counts, const size_t *displs, dshim_dtype_t dtype);
DSHIM_EXPORT dshim_status_t dshim_iallgatherv(dshim_comm_t *comm, const void *sendbuf, void *recvbuf,
                                              const size_t *counts, const size_t *displs,
                                              dshim_dtype_t dtype, dshim_request_t **req_p);
/* sendbuf holds size*recvcount elements; rank r gets block r reduced. */
DSHIM_EXPORT dshim_status_t dshim_reduce_scatter(dshim_comm_t *comm, const void *sendbuf, void *recvbuf,
                                                 size_t recvcount, dshim_dtype_t dtype, dshim_redop_t op);
DSHIM_EXPORT dshim_status_t dshim_ireduce_scatter(dshim_comm_t *comm, const void *sendbuf, void *recvbuf,
                                                  size_t recvcount, dshim_dtype_t dtype, dshim_redop_t op,
                                                  dshim_request_t **req_p);
/* Uneven (MPI_Reduce_scatter): sendbuf holds the blocks one after the other,
 * block j recvcounts[j] elements; rank r gets block r reduced (recvcounts[r]
 * elements).  Every rank passes the same recvcounts (not NULL). */
DSHIM_EXPORT dshim_status_t dshim_reduce_scatterv(dshim_comm_t *comm, const void *sendbuf, void *recvbuf,
                                                  const size_t *recvcounts, dshim_dtype_t dtype, dshim_redop_t op);
DSHIM_EXPORT dshim_status_t dshim_ireduce_scatterv(dshim_comm_t *comm, const void *sendbuf, void *recvbuf,
                                                   const size_t *recvcounts, dshim_dtype_t dtype, dshim_redop_t op,
                                                   dshim_request_t **req_p);
/* Each rank sends block j (count elements) to rank j.  alltoallv: none of
 * the four arrays may be NULL. */
DSHIM_EXPORT dshim_status_t dshim_alltoall(dshim_comm_t *comm, const void *sendbuf, void *recvbuf,
                                           size_t count, dshim_dtype_t dtype);
DSHIM_EXPORT dshim_status_t dshim_ialltoall(dshim_comm_t *comm, const void *sendbuf, void *recvbuf,
                                            size_t count, dshim_dtype_t dtype, dshim_request_t **req_p);
DSHIM_EXPORT dshim_status_t dshim_alltoallv(dshim_comm_t *comm, const void *sendbuf, const size_t *sendcounts,
                                            const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                                            const size_t *rdispls, dshim_dtype_t dtype);
DSHIM_EXPORT dshim_status_t dshim_ialltoallv(dshim_comm_t *comm, const void *sendbuf, const size_t *sendcounts,
                                             const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                                             const size_t *rdispls, dshim_dtype_t dtype,
                                             dshim_request_t **req_p);
/* recvbuf (size*count) significant only at root. */
DSHIM_EXPORT dshim_status_t dshim_gather(dshim_comm_t *comm, const void *sendbuf, void *recvbuf,
                                         size_t count, dshim_dtype_t dtype, int root);
DSHIM_EXPORT dshim_status_t dshim_igather(dshim_comm_t *comm, const void *sendbuf, void *recvbuf,
                                          size_t count, dshim_dtype_t dtype, int root, dshim_request_t **req_p);
/* sendbuf (size*count) significant only at root. */
DSHIM_EXPORT dshim_status_t dshim_scatter(dshim_comm_t *comm, const void *sendbuf, void *recvbuf,
                                          size_t count, dshim_dtype_t dtype, int root);
DSHIM_EXPORT dshim_status_t dshim_iscatter(dshim_comm_t *comm, const void *sendbuf, void *recvbuf,
                                           size_t count, dshim_dtype_t dtype, int root, dshim_request_t **req_p);
/* Point to point; the receiver must post the same count and dtype (a message
 * of another size fails the receive, and the communicator, with an error).
 *
 * Receives from any source: peer DSHIM_ANY_SOURCE, or dshim_recv_any /
 * dshim_irecv_any, which also say who sent.  Matching follows MPI's rules
 * (docs/architecture.md, "Receive from any source"): messages from one sender arrive
 * in the order it sent them; a message goes to the earliest-posted pending
 * receive that names its sender or any source, so a receive from a specific
 * rank posted earlier is never robbed, and one from any source takes the
 * first message of whichever rank is ready; only point-to-point messages
 * match (never a collective's data). */
#define DSHIM_ANY_SOURCE (-1)
DSHIM_EXPORT dshim_status_t dshim_send(dshim_comm_t *comm, const void *buf, size_t count,
                                       dshim_dtype_t dtype, int peer);
DSHIM_EXPORT dshim_status_t dshim_isend(dshim_comm_t *comm, const void *buf, size_t count,
                                        dshim_dtype_t dtype, int peer, dshim_request_t **req_p);
DSHIM_EXPORT dshim_status_t dshim_recv(dshim_comm_t *comm, void *buf, size_t count,
                                       dshim_dtype_t dtype, int peer);
DSHIM_EXPORT dshim_status_t dshim_irecv(dshim_comm_t *comm, void *buf, size_t count,
                                        dshim_dtype_t dtype, int peer, dshim_request_t **req_p);
/* source_p (may be NULL) receives the sender's rank once the message is
 * matched, before the request completes. */
DSHIM_EXPORT dshim_status_t dshim_recv_any(dshim_comm_t *comm, void *buf, size_t count, dshim_dtype_t dtype,
                                           int *source_p);
DSHIM_EXPORT dshim_status_t dshim_irecv_any(dshim_comm_t *comm, void *buf, size_t count, dshim_dtype_t dtype,
                                            int *source_p, dshim_request_t **req_p);
/* The rank a completed receive request came from (any receive, also one
 * from DSHIM_ANY_SOURCE); DSHIM_ERR_INVALID for a request that is not a
 * receive or has not completed yet. */
DSHIM_EXPORT dshim_status_t dshim_request_source(const dshim_request_t *req, int *source_p);
DSHIM_EXPORT dshim_status_t dshim_barrier(dshim_comm_t *comm);
DSHIM_EXPORT dshim_status_t dshim_ibarrier(dshim_comm_t *comm, dshim_request_t **req_p);

/* Counters of what went through dshim (used by tests to prove a path ran):
 * bytes this rank handed to its peers and took from them, whether as
 * messages, through the host gate's shared memory, or by single-copy reads
 * (a rank's buffers read by its peers count as its bytes sent).  A NULL comm
 * gives zeros; a NULL stats is ignored. */
typedef struct dshim_stats {
    uint64_t collectives;
    uint64_t bytes_sent;
    uint64_t bytes_received;
} dshim_stats_t;
DSHIM_EXPORT void dshim_comm_stats(const dshim_comm_t *comm, dshim_stats_t *stats);

/* Prints every DSHIM_* variable (and the frameworks' variables dshim reads)
 * with its default, current value and help to the stream (a FILE*; NULL =
 * stdout). */
DSHIM_EXPORT void dshim_print_config(void *file);

/* The effective value of one variable of the table (e.g. "DSHIM_TAKEOVER"),
 * as text, after parsing: how the Python package and other bindings read
 * dshim's configuration without reading the environment themselves.
 * Returns 0, or -1 for a name that is not in the table or a NULL name or buf
 * (the value is truncated to len bytes, its end included). */
DSHIM_EXPORT int dshim_config_get(const char *name, char *buf, size_t len);
/* The same, read from the environment as it is now rather than as it was
 * when the table loaded (once per process, often at the first dshim call):
 * for the settings a framework reads at its own initialization, which a
 * program may set after dshim loaded (Horovod's HOROVOD_* at hvd.init()). */
DSHIM_EXPORT int dshim_config_get_current(const char *name, char *buf, size_t len);

/* ---- device buffers of a CUDA program (shim/gpu) ------------------------
 * How a framework binding (the torch backend) stages device tensors through
 * pinned host memory in stream order.  dshim uses the CUDA runtime the
 * process already loaded and never loads one into a CPU-only program. */

/* 1 when the process has a CUDA runtime loaded, else 0. */
DSHIM_EXPORT int dshim_gpu_available(void);
/* A pinned host block of at least `bytes` bytes from dshim's process-wide
 * staging pool: *host_p is its memory, the result its handle for
 * dshim_gpu_stage_put.  NULL (the error recorded) without CUDA, when
 * pinning failed, or for a NULL host_p. */
DSHIM_EXPORT void *dshim_gpu_stage_get(size_t bytes, void **host_p);
/* Gives a block back to the pool; nothing, no queued copy either, may use
 * it any more.  NULL is ignored. */
DSHIM_EXPORT void dshim_gpu_stage_put(void *block);
/* Queues a copy of `bytes` between host and device memory (the direction
 * comes from the pointers) on `stream`, a cudaStream_t of device `device`
 * (NULL: the legacy default stream): it runs after the work queued there
 * before it, and the work queued after it sees its result.  Does not wait.
 * dst and src may be NULL only with bytes 0 (DSHIM_ERR_INVALID, checked
 * before whether CUDA is there). */
DSHIM_EXPORT dshim_status_t dshim_gpu_copy_async(void *dst, const void *src, size_t bytes, int device,
                                                 void *stream);
/* Waits until the work queued on `stream` of device `device` is done. */
DSHIM_EXPORT dshim_status_t dshim_gpu_stream_sync(int device, void *stream);

/* dst[i] = src[i] * *scalar over host memory: the local half of a
 * pre-multiplied sum (torch's PREMUL_SUM, NCCL's ncclRedOpCreatePreMulSum),
 * through comm's reduction backend.  scalar points to one value of dtype.
 * Integers wrap; float16/bfloat16/fp8 are widened to float, multiplied and
 * rounded back once (torch's mul_ by that value gives the same bits).  dst
 * may alias src exactly.  Local: no communication, any thread.  dst and src
 * may be NULL only with count 0; comm and scalar never. */
DSHIM_EXPORT dshim_status_t dshim_scale_mul(dshim_comm_t *comm, void *dst, const void *src, size_t count,
                                            dshim_dtype_t dtype, const void *scalar);


/* ---- operations matched by name (Horovod's model; shim/named) -----------
 * An engine over a communicator takes operations from any thread of each
 * rank, each under a name, and runs an operation once every rank of the
 * communicator has submitted one of that name -- whatever the order in
 * which each rank submitted its names (Horovod's coordinator: gradients of
 * unused parameters come late, in a different order on every rank).  Ranks
 * must agree, per name, on kind, dtype, shape (allgather/alltoall: all but
 * the first dimension), reduction op, scale factors and root; where they do
 * not, the operation fails on every rank with one message naming the name
 * and what differs (ranks and values), and the engine goes on.  Names ready
 * in one negotiation round run in an order every rank computes alike;
 * allreduces of one dtype, op and scale that are ready together are fused
 * into one collective (up to the fusion threshold).
 *
 * The engine runs on a private communicator split from `comm` at creation
 * (the caller keeps comm for itself) and a background thread of its own.
 * A rank that submits nothing still takes part in every negotiation, so an
 * operation never waits on another rank's application thread; a name some
 * ranks submitted and others did not is reported (stall warning naming the
 * missing ranks and the names, then the timeout) as Horovod's stall
 * inspector does. */
typedef struct dshim_named dshim_named_t;
typedef struct dshim_named_op dshim_named_op_t;

typedef enum dshim_named_kind {
    DSHIM_NAMED_ALLREDUCE = 0,
    DSHIM_NAMED_ALLGATHER,      /* first dimensions may differ between ranks */
    DSHIM_NAMED_BROADCAST,
    DSHIM_NAMED_ALLTOALL,       /* rows of the first dimension, splits per destination */
    DSHIM_NAMED_REDUCESCATTER,  /* first dimension split as Horovod splits it */
    DSHIM_NAMED_BARRIER,
    DSHIM_NAMED_JOIN,           /* a joined rank counts as having submitted every allreduce (zeros) */
    DSHIM_NAMED_KIND_COUNT
} dshim_named_kind_t;

#define DSHIM_NAMED_MAX_DIMS 16

typedef struct dshim_named_desc {
    dshim_named_kind_t kind;
    const char *name;          /* not NULL; unique among this rank's pending operations of the engine */
    dshim_dtype_t dtype;       /* all kinds but barrier and join */
    int ndim;                  /* 0..DSHIM_NAMED_MAX_DIMS (0: a scalar) */
    const int64_t *shape;      /* ndim entries (may be NULL when ndim is 0) */
    const void *sendbuf;       /* the input (allreduce, allgather, alltoall, reducescatter), contiguous */
    void *recvbuf;             /* allreduce: the output (may equal sendbuf); broadcast: the tensor,
                                * sent at root and overwritten elsewhere; other kinds: NULL (the
                                * engine allocates the result: dshim_named_result) */
    dshim_redop_t op;          /* allreduce, reducescatter (DSHIM_AVG: the sum divided by the size) */
    double prescale;           /* allreduce, reducescatter: input multiplied by it first (1.0: none) */
    double postscale;          /* and the result by it (1.0: none) */
    int root;                  /* broadcast: a rank of the engine's communicator */
    const int64_t *splits;     /* alltoall: rows for each rank (size entries), NULL = even split */
    int device;                /* -1: a host tensor; else the CUDA device of a tensor the caller staged
                                * through host memory (the buffers are host memory either way); ranks
                                * must agree on CPU or GPU, as Horovod checks */
} dshim_named_desc_t;

/* Collective over comm (every rank calls it): an engine over a private copy
 * of comm.  Tuning from the table (fusion threshold, cycle time, stall
 * warning/shutdown, timeout); comm's timeout applies to its operations. */
DSHIM_EXPORT dshim_status_t dshim_named_create(dshim_comm_t *comm, dshim_named_t **eng_p);
/* Submits one operation (the engine reads *desc and the shape and splits
 * arrays now; the buffers must stay valid until the operation completes).
 * DSHIM_ERR_INVALID, with Horovod's message, for a name already pending on
 * this rank, and for bad arguments; DSHIM_ERR_ABORTED after shutdown. */
DSHIM_EXPORT dshim_status_t dshim_named_submit(dshim_named_t *eng, const dshim_named_desc_t *desc,
                                               dshim_named_op_t **op_p);
/* 1 once the operation completed (successfully or not), else 0; -1 for NULL. */
DSHIM_EXPORT int dshim_named_poll(dshim_named_op_t *op);
/* Waits for the operation; its status (DSHIM_ERR_MISMATCH for ranks that
 * disagreed, DSHIM_ERR_ABORTED after a shutdown, ...); the one-line message
 * is dshim_named_error(op). */
DSHIM_EXPORT dshim_status_t dshim_named_wait(dshim_named_op_t *op);
/* The failed operation's message ("" when it succeeded or is still running). */
DSHIM_EXPORT const char *dshim_named_error(const dshim_named_op_t *op);
/* A completed allgather, alltoall or reducescatter: its result, owned by
 * the operation (valid until dshim_named_op_free): *data and *bytes, *dim0
 * the result's first dimension (the other dimensions are the input's); for
 * alltoall the rows received from each rank into recv_splits (cap entries,
 * may be NULL).  Any of data, bytes, dim0 may be NULL. */
DSHIM_EXPORT dshim_status_t dshim_named_result(const dshim_named_op_t *op, void **data, size_t *bytes,
                                               int64_t *dim0, int64_t *recv_splits, int cap);
/* A completed join: the last rank (of the engine's communicator) to join. */
DSHIM_EXPORT int dshim_named_join_rank(const dshim_named_op_t *op);
/* Releases the operation (waits for it first); NULL is ignored. */
DSHIM_EXPORT void dshim_named_op_free(dshim_named_op_t *op);
/* Stops the engine on every rank (Horovod's shutdown): the next negotiation
 * round carries it to the other ranks; every pending and later operation of
 * every rank fails with DSHIM_ERR_ABORTED and Horovod's shutdown message.
 * Does not wait; reason may be NULL. */
DSHIM_EXPORT dshim_status_t dshim_named_shutdown(dshim_named_t *eng, const char *reason);
/* Shuts down (if not yet), waits for the background thread, frees the
 * engine and its communicator; NULL is ignored.  Operations not freed yet
 * stay valid (failed) until dshim_named_op_free. */
DSHIM_EXPORT dshim_status_t dshim_named_destroy(dshim_named_t *eng);
/* Timeline (Horovod's HOROVOD_TIMELINE format: a Chrome trace with
 * NEGOTIATE_<KIND> and <KIND> spans per name): start writing to path (rank
 * 0 of the engine writes; others record nothing), or stop (path NULL). */
DSHIM_EXPORT dshim_status_t dshim_named_timeline(dshim_named_t *eng, const char *path, int mark_cycles);


/* Flight recorder (docs/observability.md).  Names the framework call behind
 * the next operation this thread submits to any communicator ("torch
 * all_reduce", "DDP bucket 2", "MXNet push key 3", "ncclAllReduce"); shown in
 * dumps, the launcher's diagnosis and the timeline.  Copied (truncated to 63
 * bytes); NULL clears it.  Costs a thread-local copy; no-op when the
 * recorder is off. */
DSHIM_EXPORT void dshim_trace_label(const char *label);
/* Writes this process's flight-recorder dump now (reason "request"), as the
 * DSHIM_TRACE_SIGNAL signal does.  DSHIM_OK also when the recorder is off. */
DSHIM_EXPORT dshim_status_t dshim_trace_dump(void);
/* A span of the framework's own work (torch's optimizer step) for the
 * timeline (DSHIM_TIMELINE), on its own track of this rank; begin and end in
 * CLOCK_MONOTONIC ns (Python: time.monotonic_ns()).  No-op when the timeline
 * is off or name is NULL. */
DSHIM_EXPORT void dshim_trace_span(const char *name, uint64_t begin_ns, uint64_t end_ns);

#ifdef __cplusplus
}
#endif
#endif /* DSHIM_H */

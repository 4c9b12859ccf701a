/*
 * Operations matched by name (include/dshim.h, "operations matched by
 * name"): the engine's internal structures, shared by its files.
 *
 * One background thread per engine does everything after a submission:
 * it takes the operations submitted since its last round, contributes them
 * to a negotiation round (one allgather of a fixed slot per rank over the
 * engine's private communicator, plus an allgatherv when a rank's requests
 * do not fit), and then, like every other rank, runs the same bookkeeping
 * over every rank's requests: the names that became complete are checked
 * for agreement and executed in an order every rank computes alike.  No
 * coordinator and no response message: the round itself is the agreement.
 *
 *   named_api.c    public functions, argument checks, operations' lifetime
 *   named_map.c    name -> pointer hash map (pending names, the table)
 *   named_round.c  a round's records on the wire and the round collective
 *   named_table.c  the table of names: readiness, joins, verdicts, failing
 *   named_check.c  agreement checks with Horovod's messages
 *   named_exec.c   execution: fusion, scaling, the collectives
 *   named_stall.c  rank 0's stall inspector and timeout verdicts
 *   named_timeline.c  Horovod's timeline (rank 0)
 *   named_loop.c   the background thread: pacing, rounds, shutdown, errors
 */
#ifndef DSHIM_NAMED_H
#define DSHIM_NAMED_H

#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "dshim.h"

/* Horovod's fixed names (common.h): one barrier and one join pending per
 * rank at a time, as in Horovod, since a second one is a duplicate name. */
#define DSHIM_NAMED_BARRIER_NAME "barrier.noname"
#define DSHIM_NAMED_JOIN_NAME "join.noname"

/* ---- name -> pointer map (named_map.c) ---- */
/* intrusive: the node lives in the value, so that putting a name costs no
 * allocation (the pending set is updated under the submission lock) */
typedef struct dshim_named_map_node {
    struct dshim_named_map_node *next;
    const char *key; /* owned by the value */
    void *val;
} dshim_named_map_node_t;

typedef struct dshim_named_map {
    dshim_named_map_node_t **buckets;
    size_t nbuckets;
    size_t count;
} dshim_named_map_t;

void *dshim_named_map_get(const dshim_named_map_t *m, const char *key);
/* node (in the value) gets key and val; key must stay valid while mapped
 * (it is the value's own copy) */
dshim_status_t dshim_named_map_put(dshim_named_map_t *m, dshim_named_map_node_t *node, const char *key, void *val);
/* the value, or NULL; its node is unlinked */
void *dshim_named_map_del(dshim_named_map_t *m, const char *key);
/* frees the buckets only (the nodes are the values') */
void dshim_named_map_free(dshim_named_map_t *m);

/* ---- one operation, as submitted by this rank ---- */
struct dshim_named_op {
    dshim_named_map_node_t pnode; /* in the engine's pending set */
    /* what was asked (immutable after submit) */
    dshim_named_kind_t kind;
    char *name;
    dshim_dtype_t dtype;
    int ndim;
    int64_t shape[DSHIM_NAMED_MAX_DIMS];
    const void *sendbuf;
    void *recvbuf;
    dshim_redop_t op;
    double prescale, postscale; /* reducescatter AVG: postscale already divided by the size */
    int root;
    int64_t *splits; /* alltoall: size entries (the even split filled in at submit) */
    int device;

    /* completion: done is set last, under mu, and read without it by poll */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
    dshim_status_t status;
    char *error; /* NULL while OK */

    /* results (allgather, alltoall, reducescatter: engine-allocated) */
    void *result;
    size_t result_bytes;
    int64_t result_dim0;
    int64_t *recv_splits; /* alltoall: size entries */
    int nsplits;
    int join_rank;

    double spin_s; /* how long a waiter polls before it sleeps (DSHIM_SPIN_US) */
    int spin_yields; /* polls yield the core (threads outnumber cores) */
    int refs; /* the caller's and the engine's; freed at 0 */
    struct dshim_named_op *qnext; /* submission queue */
};

/* ---- one rank's request for a name, as every rank received it ---- */
typedef struct dshim_named_req {
    uint8_t kind, dtype, op, ndim;
    int32_t root, device;
    double prescale, postscale;
    int64_t shape[DSHIM_NAMED_MAX_DIMS];
    /* a small allreduce's input, carried by the round itself (in the table
     * it follows the struct in the same allocation) */
    uint32_t data_len;
    const unsigned char *data;
} dshim_named_req_t;

/* Allreduces of at most this many bytes travel in the round that carries
 * their request: once the name is complete every rank has every rank's
 * input and reduces it itself, in rank order, with no collective of its
 * own (a loop of small allreduces then costs one round each). */
#define DSHIM_NAMED_INLINE 256

/* ---- the table: a name submitted by some ranks and not yet run ---- */
typedef struct dshim_named_entry {
    dshim_named_map_node_t node; /* in the table */
    char *name;
    dshim_named_req_t **reqs; /* [size]; NULL: that rank has not submitted it */
    int count;                /* ranks that submitted it */
    uint64_t first_round;     /* the round that brought its first request */
    double first_time;        /* this rank's clock then (rank 0 judges stalls with it) */
    dshim_named_op_t *mine;   /* this rank's operation, once its request went out */
    int ready;                /* on this round's ready list */
    unsigned tl_file;         /* the timeline file that has its NEGOTIATE span begun (tl.files then); 0: none */
    struct dshim_named_entry *prev, *next; /* arrival order: every rank scans alike */
} dshim_named_entry_t;

/* ---- Horovod's timeline (named_timeline.c), written on rank 0 ---- */
typedef struct dshim_named_tl {
    pthread_mutex_t mu;
    int on;            /* atomic: a file is open */
    FILE *f;
    int fresh;         /* nothing written yet */
    int mark;          /* CYCLE_START markers */
    double t0;
    dshim_named_map_t pids; /* tensor name -> its "process" */
    int npids;
    unsigned files;    /* atomic: the files opened so far (the open one's number) */
} dshim_named_tl_t;

/* ---- the engine ---- */
struct dshim_named {
    dshim_comm_t *comm; /* private: split at creation, used only by the thread */
    int rank, size;
    double timeout_s;   /* the given communicator's (<= 0: none) */
    size_t fusion_bytes;
    double cycle_s;
    int stall_on;
    double stall_s, stall_stop_s;
    double spin_s;      /* DSHIM_SPIN_US: polling before a sleep, on both sides */
    int spin_yields;    /* with fewer cores than this host's ranks have threads (an application's
                         * and an engine's each): every poll yields the core, else a pause */

    pthread_t thread;
    int thread_started;

    /* shared with submitting threads, under lock */
    pthread_mutex_t lock;
    pthread_cond_t wake;
    dshim_named_op_t *qhead, *qtail; /* submitted, not yet in a round */
    dshim_named_map_t pending;       /* name -> op: submitted and not completed */
    unsigned kicks;                  /* bumped (atomically) by each submission and shutdown */
    int qhead_hint;                  /* 1 while the queue holds something (atomic, read unlocked) */
    int shutdown_asked;              /* dshim_named_shutdown/destroy called here */
    char *shutdown_reason;
    int stopped;                     /* no more operations: later submits fail with stop_msg */
    dshim_status_t stop_status;
    char *stop_msg;

    /* the background thread's own state */
    uint64_t round;
    dshim_named_map_t table;  /* name -> entry */
    dshim_named_entry_t *head, *tail;
    unsigned char *joined;    /* [size] */
    int njoined, last_joined;
    dshim_named_op_t *join_op; /* this rank's pending join */
    dshim_named_entry_t **ready; /* this round's complete names, in order */
    size_t nready, cap_ready;
    unsigned char *fusion;
    size_t fusion_cap;
    double last_stall_check;
    int stall_warned_bad_config;

    /* round buffers */
    unsigned char *slots; /* size * DSHIM_NAMED_SLOT */
    unsigned char *out;   /* this rank's records */
    size_t out_len, out_cap;
    unsigned char *extra; /* overflow of every rank */
    size_t extra_cap;
    size_t *extra_counts, *extra_displs; /* [size] */
    char *text;           /* a record's name or reason, NUL-terminated */
    size_t text_cap;
    unsigned char *data;  /* a record's inline data */
    size_t data_cap;
    const void *reduce_ops; /* the CPU reduction backend (reduce/reduce.h), for inline allreduces */
    dshim_named_tl_t tl;
    uint64_t ncolls;        /* operations (a fused group: one) run by collectives so far; atomic */
};

/* One poll of a bounded spin: yield the core to the thread we wait for
 * when threads outnumber cores, else a pause (the communicator's rule). */
static inline void dshim_named_spin_once(int yields, unsigned *loop)
{
    if (yields || (++*loop & 63) == 0) {
        sched_yield();
    } else {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    }
}

/* ---- operations (named_api.c) ---- */
/* Completes op with st and msg (NULL when OK): takes its name out of the
 * pending set first, so that a waiter woken by it may reuse the name; drops
 * the engine's reference. */
void dshim_named_complete(struct dshim_named *eng, dshim_named_op_t *op, dshim_status_t st, const char *msg);
void dshim_named_op_unref(dshim_named_op_t *op);
const char *dshim_named_shutdown_text(void);                      /* Horovod's SHUT_DOWN_ERROR */
const char *dshim_named_kind_name(dshim_named_kind_t kind);       /* "allreduce" */
const char *dshim_named_kind_upper(dshim_named_kind_t kind);      /* Horovod's "ALLREDUCE" */
int64_t dshim_named_elems(int ndim, const int64_t *shape, int from); /* product of shape[from..] */

/* ---- settings (named_settings.c) ---- */
/* Sets eng's fusion threshold, cycle time and stall inspector from their
 * HOROVOD_* rows as the environment has them now (at creation: hvd.init()). */
void dshim_named_read_settings(struct dshim_named *eng);

/* ---- rounds (named_round.c) ---- */
#define DSHIM_NAMED_SLOT 512
enum { DSHIM_NAMED_REC_REQ = 1, DSHIM_NAMED_REC_JOIN, DSHIM_NAMED_REC_SHUTDOWN, DSHIM_NAMED_REC_VERDICT };
enum { DSHIM_NAMED_VERDICT_TIMEOUT = 1, DSHIM_NAMED_VERDICT_STALL };
void dshim_named_out_reset(struct dshim_named *eng);
dshim_status_t dshim_named_out_req(struct dshim_named *eng, const dshim_named_op_t *op);
dshim_status_t dshim_named_out_join(struct dshim_named *eng);
dshim_status_t dshim_named_out_shutdown(struct dshim_named *eng, const char *reason);
dshim_status_t dshim_named_out_verdict(struct dshim_named *eng, int cause, uint64_t cutoff_round);
/* The round collective: afterwards dshim_named_rank_records gives each
 * rank's records. */
dshim_status_t dshim_named_exchange(struct dshim_named *eng);
typedef struct dshim_named_rec {
    int type;
    dshim_named_req_t req; /* REC_REQ */
    const char *text;      /* REC_REQ: the name; REC_SHUTDOWN: the reason (not NUL-terminated) */
    size_t text_len;
    int cause;             /* REC_VERDICT */
    uint64_t cutoff;
} dshim_named_rec_t;
typedef struct dshim_named_reader {
    struct dshim_named *eng;
    const unsigned char *a, *b; /* the slot's part, then the overflow's */
    size_t alen, blen, pos;
} dshim_named_reader_t;
void dshim_named_reader_init(struct dshim_named *eng, int rank, dshim_named_reader_t *rd);
/* 1 and *rec filled (its text in the engine's scratch, valid until the next
 * call), 0 at the end, -1 for garbage or no memory */
int dshim_named_reader_next(dshim_named_reader_t *rd, dshim_named_rec_t *rec);

/* ---- the table (named_table.c) ---- */
/* Adds rank r's request for name (mine: this rank's op when r is this rank). */
dshim_status_t dshim_named_table_add(struct dshim_named *eng, int r, const dshim_named_req_t *req, const char *name,
                                     size_t name_len, dshim_named_op_t *mine);
/* After a change of the joined ranks: names now complete go on the ready list. */
void dshim_named_table_rescan(struct dshim_named *eng);
/* Fails the entry on this rank (its op, if any) and removes it. */
void dshim_named_entry_fail(struct dshim_named *eng, dshim_named_entry_t *e, dshim_status_t st, const char *msg);
/* Removes and frees the entry (its op already completed or absent). */
void dshim_named_entry_drop(struct dshim_named *eng, dshim_named_entry_t *e);
/* "rank 1, ranks 3-5" for the ranks of e that did (want 1) or did not (0)
 * submit it, joined ranks not counted as missing */
void dshim_named_entry_ranks(const struct dshim_named *eng, const dshim_named_entry_t *e, int want, char *out,
                             size_t len);
/* The incomplete names whose first request came at or before round cutoff
 * fail (rank 0's verdict). */
void dshim_named_table_verdict(struct dshim_named *eng, int cause, uint64_t cutoff);
/* Fails every operation of this rank (table, join) with st/msg. */
void dshim_named_table_fail_all(struct dshim_named *eng, dshim_status_t st, const char *msg);
void dshim_named_table_free(struct dshim_named *eng);

/* ---- agreement (named_check.c) ---- */
/* DSHIM_OK, or the status and Horovod's message (+ ranks and values, the
 * tensor's name) in msg. */
dshim_status_t dshim_named_check(const struct dshim_named *eng, const dshim_named_entry_t *e, char *msg, size_t len);

/* ---- execution (named_exec.c) ---- */
/* Runs the ready list (checked, in order); a failed collective returns its
 * error (the communicator's; the caller stops the engine). */
dshim_status_t dshim_named_execute(struct dshim_named *eng, int *executed);

/* ---- stall inspector (named_stall.c), rank 0 of the engine ---- */
/* Warns about stalled names; adds a verdict record to this round's output
 * when names waited past the stall shutdown time or the timeout. */
void dshim_named_stall_check(struct dshim_named *eng);

/* ---- timeline (named_timeline.c) ---- */
dshim_status_t dshim_named_tl_open(struct dshim_named *eng, const char *path, int mark_cycles); /* NULL: close */
void dshim_named_tl_event(struct dshim_named *eng, const char *tensor, char phase, const char *op_name,
                          const char *args);
void dshim_named_tl_end(struct dshim_named *eng, const char *tensor, dshim_dtype_t dtype, int ndim,
                        const int64_t *shape);
void dshim_named_tl_cycle(struct dshim_named *eng);
/* Begins e's NEGOTIATE_<kind> span in the open file if that file has not
 * got it, with an instant for every rank whose request is already in:
 * requests can come in before the timeline opens (rank 1's, while rank 0
 * is still in hvd.init opening HOROVOD_TIMELINE), and the span must still
 * have its start and every rank's arrival.  The engine's thread calls it
 * before each event of e's negotiation. */
void dshim_named_tl_negotiating(struct dshim_named *eng, dshim_named_entry_t *e, int kind);

/* ---- the thread (named_loop.c) ---- */
void *dshim_named_thread(void *arg);

#endif

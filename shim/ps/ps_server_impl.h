/* What the files of a parameter server share (private to shim/ps/ps_server*.c):
 * the server's state — its keys, a key's pieces (DSHIM_PS_F_PIECE) and rows
 * (DSHIM_PS_F_ROWS), the pushes waiting for an answer — and the steps the
 * event loop (ps_server.c), the pieces (ps_server_pieces.c) and the row_sparse
 * keys (ps_server_rows.c) call across files. */
#ifndef DSHIM_PS_SERVER_IMPL_H
#define DSHIM_PS_SERVER_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "ps_proto.h"
#include "status.h"

typedef struct waiter {
    int worker;
    uint32_t seq;
    int want_pull;
} waiter_t;

/* A piece [off, off + cnt) of a key being pushed in pieces
 * (DSHIM_PS_F_PIECE): summed over the workers and answered on its own. */
typedef struct piece {
    size_t off, cnt;
    int npushed;
    int done;          /* every worker's values summed (kept until the updater ran) */
    waiter_t *waiters; /* num_workers */
} piece_t;

typedef struct key_state {
    int key;
    int dtype;
    size_t n;
    void *stored;
    void *stored_cookie;
    void *merged;
    void *merged_cookie;
    void *decomp; /* 2-bit: one push dequantized */
    /* multi-precision (MXNet's store_realt_): a float32 master copy of a key
     * of another dtype; `merged` is float32 then, and `wide` holds one push
     * widened to float32 */
    void *master;
    void *master_cookie;
    float *wide;
    waiter_t *waiters;
    int nwaiters;
    /* pieces of this round; a worker pushing whole (its server is on its
     * host) is in `waiters` and counts toward every piece */
    piece_t *pieces;
    size_t npieces, cap_pieces;
    size_t pieces_done; /* elements of this round's complete pieces */
    /* row_sparse pushes (DSHIM_PS_F_ROWS): the part's shape once known, and
     * which rows of `merged` hold a value in this round */
    size_t rows, unit;
    unsigned char *present;
    int round_rows; /* this round's pushes are rows */
    /* rounds (ps_trace.c): round 0 is the init, then one per update; a
     * round is open from its first push until it is answered */
    uint64_t round;
    int round_open;
    int trace_waiting; /* its recorder entry says waiting */
    uint64_t trace_id;
    double t_last;     /* the open round's last push (dshim_now) */
} key_state_t;

/* A worker's last push to this server (ps_trace.c): t = 0 when none yet. */
typedef struct last_push {
    int key;
    uint64_t round;
    double t;
} last_push_t;

/* A worker's data connection as the loop sees it.  The loop never waits
 * inside one message: it reads what has arrived (a push from another host
 * comes at the link's rate while its neighbour's push over loopback is
 * ready at once) and writes what the socket takes, keeping the rest of an
 * answer here (the stored value may change before the socket drains, so the
 * rest is a copy: ps-lite copies every answer).  Measured on 2 hosts with
 * 1 Gbit/s links (docs/mxnet.md): whole-message reads and writes made a
 * worker's push wait behind a remote transfer of another key for 40-80 ms. */
typedef struct conn {
    dshim_ps_hdr_t h; /* the message being read */
    size_t hgot;      /* header bytes read */
    char *buf;        /* its payload */
    size_t cap;
    size_t got;
    char *out; /* answer bytes not yet taken by the socket: [out_off, out_len) */
    size_t out_off, out_len, out_cap;
} conn_t;

typedef struct server {
    dshim_ps_node_t *node;
    const dshim_ps_server_ops_t *ops;
    int *worker_fds; /* by worker rank */
    conn_t *conns;   /* by worker rank */
    int nconnected;
    int departed; /* workers that said goodbye */
    int all_left; /* every worker left without kStopServer */
    int sync_mode;
    int stop;
    float threshold;
    int compression;
    /* float32 master copies of non-float32 keys: after kSetMultiPrecision,
     * or from the start (DSHIM_PS_FLOAT32_MASTER, the default): MXNet
     * 1.9.1's KVStoreDistServer never initialises its multi_precision_ flag,
     * and its servers behave as if it were set (ps-lite's float16 results
     * equal the master-copy ones, with or without the command) */
    int multi_precision;
    key_state_t *keys;
    size_t nkeys, cap;
    char *buf; /* receive buffer */
    size_t buf_cap;
    last_push_t *last; /* by worker rank */
    double next_check; /* of stalled rounds (dshim_ps_srv_check_stalls) */
    double t_warned;   /* the last stall warning */
    double next_alive; /* the next WAITING to the workers while a round waits (ps.h) */
} server_t;

/* ps_server.c: the key's state, created on first use when `create`; NULL when
 * absent (or out of memory). */
key_state_t *dshim_ps_srv_find_key(server_t *s, int key, int create);
/* Answers worker's request seq with a message of `type` carrying payload. */
dshim_status_t dshim_ps_srv_reply(server_t *s, int worker, uint32_t seq, int type, const void *payload, size_t len);
/* Writes what is queued for worker until done or the deadline (a message
 * written straight to its socket must not cut into a queued one). */
dshim_status_t dshim_ps_srv_flush(server_t *s, int worker, double deadline);
/* Tells worker this server lives and waits (DSHIM_PS_MSG_WAITING): queued
 * behind what it has queued; nothing when its connection is gone (the loop's
 * read of it says so). */
void dshim_ps_srv_say_waiting(server_t *s, int worker);
/* Answers with DSHIM_PS_MSG_ERROR carrying `text` (also printed on stderr). */
dshim_status_t dshim_ps_srv_reply_error(server_t *s, int worker, uint32_t seq, const char *text);
/* The round's merged pushes become key k's value (through the updater, if any). */
dshim_status_t dshim_ps_srv_update_value(server_t *s, key_state_t *k);
/* Answers every whole push of this round (with the stored value when it asked to pull). */
dshim_status_t dshim_ps_srv_answer_whole_waiters(server_t *s, key_state_t *k);
/* Gives key k (not float32) its float32 master copy (multi-precision). */
dshim_status_t dshim_ps_srv_make_master(server_t *s, key_state_t *k);

/* ps_server_pieces.c: pushes of a key in pieces (sync mode). */
dshim_status_t dshim_ps_srv_handle_piece(server_t *s, int worker, const dshim_ps_hdr_t *h);
dshim_status_t dshim_ps_srv_whole_into_pieces(server_t *s, int worker, const dshim_ps_hdr_t *h, key_state_t *k);

/* ps_trace.c: rounds, stalls and the flight recorder (ps_trace.h). */
/* The initial value of k (round 0) came from worker. */
void dshim_ps_srv_note_init(server_t *s, key_state_t *k, int worker);
/* An accepted push of k's current round (whole, piece or rows); opens the
 * round at its first push. */
void dshim_ps_srv_note_push(server_t *s, key_state_t *k, int worker);
/* k's round is complete (its answers go out now). */
void dshim_ps_srv_note_answered(server_t *s, key_state_t *k);
/* The loop, every pass: at most a few times a second, marks rounds that wait
 * as waiting (waiting_for = the workers that have not pushed), warns after
 * DSHIM_STALL_WARN, and after DSHIM_TIMEOUT tells every worker the story,
 * dumps the rings and returns DSHIM_ERR_TIMEOUT. */
dshim_status_t dshim_ps_srv_check_stalls(server_t *s);

/* ps_server_rows.c: pushes and pulls of rows of a row_sparse key. */
dshim_status_t dshim_ps_srv_rows_push(server_t *s, int worker, const dshim_ps_hdr_t *h);
dshim_status_t dshim_ps_srv_rows_pull(server_t *s, int worker, const dshim_ps_hdr_t *h);

#endif

/* The rendezvous store server's private types, shared by its three files:
 * store_server.c (the poll loop, connections and requests), store_table.c
 * (the key/value table) and store_listen.c (the listener, start and stop). */
#ifndef DSHIM_STORE_SERVER_IMPL_H
#define DSHIM_STORE_SERVER_IMPL_H

#include <poll.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "store.h"

/* Bytes read from one connection per loop turn, so one big SET cannot
 * monopolise the thread while others wait. */
#define READ_BUDGET (4u << 20)
/* Buffers larger than this are released after use instead of kept. */
#define KEEP_BUF_MAX (1u << 20)

typedef struct kv_entry {
    struct kv_entry *next;
    uint64_t hash;
    uint8_t *val;
    size_t vlen;
    uint32_t klen;
    uint8_t key[];
} kv_entry_t;

typedef enum { CONN_HELLO, CONN_READY, CONN_PARKED } conn_state_t;

typedef struct conn {
    int fd;
    int dead;              /* closed; freed by the next sweep */
    conn_state_t state;
    char peer[64];         /* "ip:port" for log lines */
    double deadline;       /* hello limit or GET limit; INFINITY = none */
    uint8_t *in;           /* the message in progress */
    size_t in_have, in_need, in_cap;
    int in_body;           /* header parsed, in_need covers the body too */
    uint32_t seq;          /* of the request being answered */
    uint8_t *out;          /* one pending reply */
    size_t out_len, out_off, out_cap;
    uint64_t park_hash;    /* key of a parked GET */
    uint8_t *park_key;
    uint32_t park_klen;
} conn_t;

struct dshim_store_server {
    int listen_fd;
    int wake_fd;
    pthread_t thread;
    uint8_t *token;
    size_t token_len;
    uint64_t rejected;     /* atomic: read by tests from other threads */
    conn_t **conns;
    size_t nconns, cap_conns;
    struct pollfd *pfds;
    size_t cap_pfds;
    kv_entry_t **buckets;
    size_t nbuckets, nkeys;
    double accept_pause_until;
    double accept_warned_at;   /* last "accept failed" line (one per 10 s) */
    unsigned long accept_failures; /* since that line */
    int out_of_fds;            /* reported (the job is failed): said once */
};

/* ---- the key/value table (store_table.c) ---- */
uint64_t dshim_store_key_hash(const uint8_t *key, size_t len);
/* Where key's entry is, or where it would be linked (*result NULL). */
kv_entry_t **dshim_store_kv_slot(dshim_store_server_t *srv, const uint8_t *key, uint32_t klen, uint64_t hash);
/* Doubles the buckets (out of memory: keeps them; longer chains, still right). */
void dshim_store_kv_grow(dshim_store_server_t *srv);
/* Stores val (ownership passes to the table); returns the entry or NULL when
 * out of memory (val is then freed). */
kv_entry_t *dshim_store_kv_put(dshim_store_server_t *srv, const uint8_t *key, uint32_t klen, uint64_t hash,
                               uint8_t *val, size_t vlen);
void dshim_store_kv_free_all(dshim_store_server_t *srv);

/* ---- the loop (store_server.c) ---- */
void dshim_store_conn_free(conn_t *c);
/* The server thread: runs until wake_fd is written. */
void *dshim_store_server_main(void *arg);

#endif

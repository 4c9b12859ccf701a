/*
 * Rendezvous key-value store over TCP.
 *
 * One server (a thread inside rank 0, or inside the launcher) and one client
 * connection per rank.  Every connection starts with a HELLO carrying the job
 * token; a connection whose first bytes are not a valid HELLO with the right
 * token is closed and logged ("rejected connection from ADDR: bad token"),
 * and the server keeps serving everyone else.  Values are binary blobs.
 *
 * All client calls are thread-safe (one mutex per client) and bounded by a
 * timeout; a lost server connection is an error naming the store address.
 */
#ifndef DSHIM_STORE_H
#define DSHIM_STORE_H

#include <stddef.h>
#include <stdint.h>
#include "dshim.h"

/* A value set at `<prefix>failed` (or at `failed`) reports a failure: every
 * GET of an absent key under `<prefix>`, parked or later, is answered with
 * DSHIM_ERR_PEER and that value as the message, so the ranks still waiting
 * learn who failed and why at once instead of waiting out their timeouts. */
#define DSHIM_STORE_FAILED_LEAF "failed"

typedef struct dshim_store_server dshim_store_server_t;
typedef struct dshim_store dshim_store_t;

/* Binds addr:port (addr NULL or "" = all interfaces; port 0 = any, the chosen
 * port is returned in *port_p) and serves from a background thread.
 * A port already in use fails with DSHIM_ERR_SYSTEM and a message naming the
 * port and how to pick another (MASTER_PORT / DSHIM_STORE_PORT). */
dshim_status_t dshim_store_server_start(const char *addr, int port, const char *token,
                                        dshim_store_server_t **server_p, int *port_p);
/* Stops the thread, closes every connection, frees. */
void dshim_store_server_stop(dshim_store_server_t *server);
/* Number of connections rejected so far (bad token / garbage); for tests. */
uint64_t dshim_store_server_rejected(const dshim_store_server_t *server);

/* Connects (retrying until timeout_s: the server may start later). */
dshim_status_t dshim_store_connect(const char *addr, int port, const char *token,
                                   double timeout_s, dshim_store_t **store_p);
void dshim_store_close(dshim_store_t *store);

dshim_status_t dshim_store_set(dshim_store_t *s, const char *key, const void *val, size_t len);
/* Waits until key exists (up to timeout_s); *val_p is malloc'ed, caller frees. */
dshim_status_t dshim_store_get(dshim_store_t *s, const char *key, double timeout_s,
                               void **val_p, size_t *len_p);
/* Non-waiting get: DSHIM_OK and value, or DSHIM_INPROGRESS if absent. */
dshim_status_t dshim_store_try_get(dshim_store_t *s, const char *key, void **val_p, size_t *len_p);
/* Atomically adds delta to the integer counter at key (absent = 0). */
dshim_status_t dshim_store_add(dshim_store_t *s, const char *key, int64_t delta, int64_t *result_p);
/* Sets key only if absent; *won_p = 1 if this call set it. */
dshim_status_t dshim_store_set_if_absent(dshim_store_t *s, const char *key, const void *val,
                                         size_t len, int *won_p);
dshim_status_t dshim_store_delete(dshim_store_t *s, const char *key);
/* Bounds how long this thread's store calls (all but a waiting get) wait for
 * the store to begin answering: past within_s (> 0; 0 = no bound) a call
 * fails with DSHIM_ERR_TIMEOUT and the connection stays usable (the late
 * reply is dropped by the next call).  For bookkeeping that must not stall
 * its caller when the store's host is stopped or cut off: arrival marks of
 * a waiting collective, a failure's report.  Returns the previous value,
 * to be restored by the caller. */
double dshim_store_patience(double within_s);
/* 1 while calls may still reach the store; 0 once the connection was
 * retired (the store left or a reply was lost), so a caller can skip
 * best-effort calls that would only add error lines. */
int dshim_store_usable(dshim_store_t *s);

#endif

/*
 * Wire format of the rendezvous store (base/store_server.c, base/store_client.c).
 *
 * Every integer is little-endian and is encoded byte by byte, so hosts of any
 * byte order agree.  One TCP connection per client; the client speaks first
 * and, after the hello, sends one request at a time and reads its reply.
 *
 * 1. HELLO, client -> server: 12-byte header, then the job token.
 *        u32 magic (DSHIM_STORE_MAGIC)   u16 version   u16 reserved (0)
 *        u32 token_len (<= DSHIM_STORE_TOKEN_MAX)      token[token_len]
 *    HELLO ACK, server -> client, 8 bytes:
 *        u32 magic   u16 version   u16 status (DSHIM_STORE_HELLO_*)
 *    A bad token or version gets a best-effort ack naming the reason, then the
 *    server closes the connection; a bad magic (not a dshim client) gets no
 *    answer at all.  A connection that has not completed its hello within
 *    DSHIM_STORE_HELLO_TIMEOUT_S is dropped, so an idle socket cannot pin a
 *    server slot.
 *
 * 2. REQUEST, client -> server: 24-byte header, then key, then value.
 *        u32 kind (DSHIM_STORE_REQ_*)   u32 seq (echoed in the reply)
 *        u32 key_len (1 .. DSHIM_STORE_KEY_MAX)   u32 arg (per kind, else 0)
 *        u64 val_len (<= DSHIM_STORE_VALUE_MAX)   key[key_len]   value[val_len]
 *
 * 3. REPLY, server -> client: 16-byte header, then value.
 *        u32 status (DSHIM_STORE_ST_*)   u32 seq   u64 val_len   value[val_len]
 *
 * Kinds (a request that breaks its kind's rule below is malformed):
 *    SET            value = the new value.                       -> OK
 *    GET            val_len 0; arg = wait limit in milliseconds
 *                   (DSHIM_STORE_WAIT_FOREVER = none).  The server parks the
 *                   request and answers when the key is set (it never polls).
 *                                                 -> OK + value, or TIMEOUT,
 *                   or FAILED + the value of `<prefix>failed` when the key
 *                   is absent and a failure was reported under a prefix of it
 *    TRY_GET        val_len 0.                    -> OK + value, or NOT_FOUND
 *    ADD            value = i64 delta (8 bytes).  Counters are stored as
 *                   decimal ASCII so GET returns readable text ("42").
 *                                   -> OK + i64 result (8 bytes), or BAD_VALUE
 *                   (the key holds something else, or the sum overflows)
 *    SET_IF_ABSENT  value = the value to store.   -> OK (stored) or EXISTS
 *    DELETE         val_len 0.                    -> OK or NOT_FOUND
 *
 * Anything over a limit, a bad magic, a bad token or an unknown kind makes the
 * server close that one connection (logged at WARN, counted as rejected).
 */
#ifndef DSHIM_STORE_PROTO_H
#define DSHIM_STORE_PROTO_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#define DSHIM_STORE_MAGIC     0x564b5344u  /* "DSKV" on the wire */
#define DSHIM_STORE_VERSION   1u

#define DSHIM_STORE_HELLO_HDR 12u
#define DSHIM_STORE_ACK_LEN   8u
#define DSHIM_STORE_REQ_HDR   24u
#define DSHIM_STORE_REPLY_HDR 16u

#define DSHIM_STORE_TOKEN_MAX 4096u
#define DSHIM_STORE_KEY_MAX   4096u
#define DSHIM_STORE_VALUE_MAX (64ull << 20)

#define DSHIM_STORE_HELLO_TIMEOUT_S 10.0
#define DSHIM_STORE_WAIT_FOREVER    0xffffffffu

enum {
    DSHIM_STORE_HELLO_OK = 0,
    DSHIM_STORE_HELLO_BAD_TOKEN = 1,
    DSHIM_STORE_HELLO_BAD_VERSION = 2,
};

enum {
    DSHIM_STORE_REQ_SET = 1,
    DSHIM_STORE_REQ_GET = 2,
    DSHIM_STORE_REQ_TRY_GET = 3,
    DSHIM_STORE_REQ_ADD = 4,
    DSHIM_STORE_REQ_SET_IF_ABSENT = 5,
    DSHIM_STORE_REQ_DELETE = 6,
    DSHIM_STORE_REQ_LAST = DSHIM_STORE_REQ_DELETE,
};

enum {
    DSHIM_STORE_ST_OK = 0,
    DSHIM_STORE_ST_NOT_FOUND = 1,
    DSHIM_STORE_ST_EXISTS = 2,
    DSHIM_STORE_ST_TIMEOUT = 3,
    DSHIM_STORE_ST_BAD_VALUE = 4,
    DSHIM_STORE_ST_FAILED = 5,
};

/* FAILED: see DSHIM_STORE_FAILED_LEAF in store.h */

static inline void dshim_store_put_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static inline void dshim_store_put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
}

static inline void dshim_store_put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
}

static inline uint16_t dshim_store_get_u16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static inline uint32_t dshim_store_get_u32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) {
        v = (v << 8) | p[i];
    }
    return v;
}

static inline uint64_t dshim_store_get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) {
        v = (v << 8) | p[i];
    }
    return v;
}

/* Monotonic seconds: deadlines must not jump with the wall clock. */
static inline double dshim_store_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Milliseconds until deadline for poll(): rounded up so we never wake a
 * hair early and spin; -1 (wait forever) for an infinite deadline. */
static inline int dshim_store_poll_ms(double deadline, double now)
{
    if (deadline == __builtin_inf()) {
        return -1;
    }
    double ms = (deadline - now) * 1000.0;
    if (ms <= 0) {
        return 0;
    }
    if (ms > 2e9) {
        return 2000000000;
    }
    return (int)ms + 1;
}

#endif

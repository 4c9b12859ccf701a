/*
 * ncclUniqueId = dshim rendezvous.  The process calling ncclGetUniqueId
 * starts a dshim store (all interfaces, ephemeral port, random token), as
 * NCCL's bootstrap root does, and the 128 bytes carry where it is and the
 * token.  Every rank, the creator included, then joins that store as an
 * external one.  The server belongs to this file, counted by the creator
 * process's communicators built on it (several with ncclCommInitAll or inits
 * in a group): the last of them waits (bounded) for every rank's goodbye
 * before stopping it, as dshim's core does for the store it hosts; an abort
 * leaves it running until the process exits.
 *
 * Layout (big-endian):   0 "DSHN" | 4 version 1 | 5 flags 0 | 6 port u16 |
 *   8 IPv4 address | 12 creator pid u32 | 16 nonce u64 | 24 token, 24 random
 *   bytes | 48.. zero.  Deterministic and identical on every rank (PyTorch
 *   hashes it into its logs).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "net.h"
#include "nccl/nccl_internal.h"
#include "status.h"
#include "store.h"

#define ID_MAGIC "DSHN"
#define ID_VERSION 1
#define TOKEN_BYTES 24

struct dshim_nccl_hosted {
    int port;
    uint64_t nonce;
    dshim_store_server_t *srv;
    int refs;       /* communicators of this process built on it (splits included) */
    int world;      /* ranks of the communicator made from the id */
    int keep;       /* an abort: serve until exit */
    struct dshim_nccl_hosted *next;
};
typedef struct dshim_nccl_hosted hosted_t;

static pthread_mutex_t hosted_lock = PTHREAD_MUTEX_INITIALIZER;
static hosted_t *hosted_list;   /* servers started by ncclGetUniqueId in this process */

static void put_be(unsigned char *p, uint64_t v, int n)
{
    for (int i = n - 1; i >= 0; i--) {
        p[i] = (unsigned char)(v & 0xff);
        v >>= 8;
    }
}

static uint64_t get_be(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++) {
        v = (v << 8) | p[i];
    }
    return v;
}

static void token_text(const unsigned char *raw, char *out, size_t len)
{
    size_t o = (size_t)snprintf(out, len, "nccl-id:");
    for (int i = 0; i < TOKEN_BYTES && o + 2 < len; i++) {
        o += (size_t)snprintf(out + o, len - o, "%02x", raw[i]);
    }
}

/* The address the other ranks reach this host by: the interface named by
 * DSHIM/NCCL/GLOO_SOCKET_IFNAME, else the one that routes to MASTER_ADDR
 * (the job's rendezvous host), else the one of the default route, else
 * loopback (a single host without a network). */
static void pick_addr(struct in_addr *addr)
{
    const dshim_config_t *cfg = dshim_config();
    char why[256];
    int named = cfg->socket_ifname[0] || cfg->nccl_ifname[0] || cfg->gloo_ifname[0] || cfg->dmlc_interface[0];
    const char *toward = cfg->store_addr[0] ? cfg->store_addr : cfg->master_addr;
    if (named || toward[0]) {
        if (dshim_net_pick_local_addr(toward[0] ? toward : "192.0.2.1", addr, why, sizeof(why)) == DSHIM_OK) {
            return;
        }
    }
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(9)};
    inet_pton(AF_INET, "192.0.2.1", &sa.sin_addr); /* TEST-NET: only asks the routing table */
    socklen_t len = sizeof(sa);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
        getsockname(fd, (struct sockaddr *)&sa, &len) == 0) {
        *addr = sa.sin_addr;
    } else {
        inet_pton(AF_INET, "127.0.0.1", addr);
    }
    if (fd >= 0) {
        close(fd);
    }
}

ncclResult_t dshim_nccl_id_create(ncclUniqueId *id, const char *call)
{
    if (!id) {
        return dshim_nccl_fail(ncclInvalidArgument, call, "uniqueId is NULL");
    }
    dshim_log_init();
    unsigned char raw[TOKEN_BYTES];
    uint64_t nonce;
    if (getrandom(raw, sizeof(raw), 0) != (ssize_t)sizeof(raw) ||
        getrandom(&nonce, sizeof(nonce), 0) != (ssize_t)sizeof(nonce)) {
        return dshim_nccl_fail(ncclSystemError, call, "getrandom failed: %s", strerror(errno));
    }
    char token[80];
    token_text(raw, token, sizeof(token));
    hosted_t *h = calloc(1, sizeof(*h));
    if (!h) {
        return dshim_nccl_fail(ncclSystemError, call, "out of memory");
    }
    /* every rank, on this host too, connects to the address in the id: the
     * store listens there only (all interfaces only if it is not ours) */
    struct in_addr addr;
    pick_addr(&addr);
    char in_id[INET_ADDRSTRLEN], bind_addr[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &addr, in_id, sizeof(in_id));
    dshim_net_listen_addr(in_id, "ncclGetUniqueId's rendezvous store", bind_addr, sizeof(bind_addr));
    dshim_status_t st = dshim_store_server_start(bind_addr, 0, token, &h->srv, &h->port);
    if (st != DSHIM_OK) {
        free(h);
        return dshim_nccl_from_dshim(st, call);
    }
    h->nonce = nonce;
    memset(id, 0, sizeof(*id));
    unsigned char *p = (unsigned char *)id->internal;
    memcpy(p, ID_MAGIC, 4);
    p[4] = ID_VERSION;
    put_be(p + 6, (uint64_t)h->port, 2);
    memcpy(p + 8, &addr.s_addr, 4);
    put_be(p + 12, (uint64_t)getpid(), 4);
    put_be(p + 16, nonce, 8);
    memcpy(p + 24, raw, TOKEN_BYTES);
    pthread_mutex_lock(&hosted_lock);
    h->next = hosted_list;
    hosted_list = h;
    pthread_mutex_unlock(&hosted_lock);
    char ip[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &addr, ip, sizeof(ip));
    DSHIM_INFO("ncclGetUniqueId: rendezvous store at %s:%d (hosted by pid %d)", ip, h->port, (int)getpid());
    return ncclSuccess;
}

ncclResult_t dshim_nccl_id_decode(const ncclUniqueId *id, dshim_nccl_rdv_t *rdv)
{
    const unsigned char *p = (const unsigned char *)id->internal;
    if (memcmp(p, ID_MAGIC, 4) != 0 || p[4] != ID_VERSION) {
        return dshim_nccl_fail(ncclInvalidArgument, "ncclCommInitRank",
                               "the ncclUniqueId was not made by dshim's ncclGetUniqueId (magic %02x%02x%02x%02x): "
                               "every rank must load libdshim.so, and the id must reach the ranks unchanged",
                               p[0], p[1], p[2], p[3]);
    }
    memset(rdv, 0, sizeof(*rdv));
    struct in_addr a;
    memcpy(&a.s_addr, p + 8, 4);
    inet_ntop(AF_INET, &a, rdv->addr, sizeof(rdv->addr));
    rdv->port = (int)get_be(p + 6, 2);
    rdv->creator_pid = (uint32_t)get_be(p + 12, 4);
    rdv->nonce = get_be(p + 16, 8);
    token_text(p + 24, rdv->token, sizeof(rdv->token));
    if (rdv->port <= 0) {
        return dshim_nccl_fail(ncclInvalidArgument, "ncclCommInitRank", "the ncclUniqueId holds no store port");
    }
    return ncclSuccess;
}

hosted_t *dshim_nccl_id_acquire(const dshim_nccl_rdv_t *rdv, int nranks)
{
    if (rdv->creator_pid != (uint32_t)getpid()) {
        return NULL;  /* made by another process (or by our parent before a fork) */
    }
    hosted_t *found = NULL;
    pthread_mutex_lock(&hosted_lock);
    for (hosted_t *h = hosted_list; h; h = h->next) {
        if (h->port == rdv->port && h->nonce == rdv->nonce && h->srv) {
            h->refs++;
            h->world = nranks;
            found = h;
            break;
        }
    }
    pthread_mutex_unlock(&hosted_lock);
    return found;
}

void dshim_nccl_id_ref(hosted_t *h)
{
    pthread_mutex_lock(&hosted_lock);
    h->refs++;
    pthread_mutex_unlock(&hosted_lock);
}

int dshim_nccl_id_unref(hosted_t *h, int keep)
{
    pthread_mutex_lock(&hosted_lock);
    int left = --h->refs;
    h->keep |= keep;
    pthread_mutex_unlock(&hosted_lock);
    return left;
}

void dshim_nccl_id_wait_byes(hosted_t *h, dshim_comm_t *dc)
{
    /* the goodbye counter of dshim's core: every rank's destroy of the
     * communicator made from the id adds one; ours comes after this wait
     * when dc is that communicator (not a split of it) */
    int own_pending = dshim_hook_is_world(dc);
    int64_t want = h->world - own_pending;
    double deadline = dshim_now() + (dshim_hook_failed(dc) ? 3.0 : 30.0);
    int64_t v = 0;
    while ((v = dshim_hook_goodbyes(dc)) >= 0 && v < want && dshim_now() < deadline) {
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
}

void dshim_nccl_id_stop_if_unused(hosted_t *h)
{
    dshim_store_server_t *srv = NULL;
    pthread_mutex_lock(&hosted_lock);
    if (h->refs == 0 && !h->keep && h->srv) {
        srv = h->srv;
        h->srv = NULL;
        for (hosted_t **pp = &hosted_list; *pp; pp = &(*pp)->next) {
            if (*pp == h) {
                *pp = h->next;
                break;
            }
        }
    }
    pthread_mutex_unlock(&hosted_lock);
    if (srv) {
        dshim_store_server_stop(srv);
        free(h);
    }
}

DSHIM_NCCL_EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId)
{
    return dshim_nccl_id_create(uniqueId, "ncclGetUniqueId");
}
DSHIM_NCCL_ALIAS(ncclGetUniqueId);

/* Parameter server: environment, key placement, message I/O. */
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "config.h"
#include "net.h"
#include "ps_proto.h"
#include "status.h"

dshim_ps_role_t dshim_ps_role(void)
{
    const char *r = dshim_config()->dmlc_role;
    if (r == NULL || r[0] == '\0' || strcmp(r, "worker") == 0) {
        return DSHIM_PS_WORKER;
    }
    if (strcmp(r, "server") == 0) {
        return DSHIM_PS_SERVER;
    }
    return DSHIM_PS_SCHEDULER; /* ps-lite: anything else is treated as the scheduler */
}

const char *dshim_ps_role_name(dshim_ps_role_t role)
{
    switch (role) {
    case DSHIM_PS_WORKER: return "worker";
    case DSHIM_PS_SERVER: return "server";
    default: return "scheduler";
    }
}

dshim_status_t dshim_ps_env_load(dshim_ps_env_t *env)
{
    const dshim_config_t *c = dshim_config();
    memset(env, 0, sizeof(*env));
    env->role = dshim_ps_role();
    const char *r = c->dmlc_role;
    if (r[0] != '\0' && strcmp(r, "worker") != 0 && strcmp(r, "server") != 0 && strcmp(r, "scheduler") != 0) {
        return dshim_error(DSHIM_ERR_INVALID, "DMLC_ROLE=%s: expected worker, server or scheduler", r);
    }
    if (c->dmlc_root_uri[0] == '\0') {
        return dshim_error(DSHIM_ERR_INVALID, "DMLC_PS_ROOT_URI is not set: a dist kvstore needs the scheduler's "
                           "address (dshim-run -n N sets it; by hand: export DMLC_PS_ROOT_URI=<scheduler host>)");
    }
    if (c->dmlc_root_port <= 0 || c->dmlc_root_port > 65535) {
        return dshim_error(DSHIM_ERR_INVALID, "DMLC_PS_ROOT_PORT is not set or not a port (%ld): export the "
                           "scheduler's TCP port", c->dmlc_root_port);
    }
    if (c->dmlc_num_worker <= 0) {
        return dshim_error(DSHIM_ERR_INVALID, "DMLC_NUM_WORKER is not set or < 1: export the number of workers");
    }
    if (c->dmlc_num_server <= 0) {
        return dshim_error(DSHIM_ERR_INVALID, "DMLC_NUM_SERVER is not set or < 1: export the number of servers");
    }
    snprintf(env->root_uri, sizeof(env->root_uri), "%s", c->dmlc_root_uri);
    snprintf(env->node_host, sizeof(env->node_host), "%s", c->dmlc_node_host);
    env->root_port = (int)c->dmlc_root_port;
    env->num_workers = (int)c->dmlc_num_worker;
    env->num_servers = (int)c->dmlc_num_server;
    env->verbose = (int)c->ps_verbose;
    env->resend = c->ps_resend;
    env->resend_timeout_ms = c->ps_resend_timeout > 0 ? (int)c->ps_resend_timeout : 1000;
    env->bigarray_bound = c->mxnet_bigarray_bound;
    env->timeout_s = c->timeout_s;
    env->stall_warn_s = c->stall_warn_s;
    env->connect_timeout_s = c->connect_timeout_s;
    env->counters = c->ps_counters;
    env->piece_bytes = c->ps_piece;
    env->piece_local = c->ps_piece_local;
    env->task_id = (int)c->dmlc_task_id;
    snprintf(env->token, sizeof(env->token), "%s", c->job_token);
    return DSHIM_OK;
}

/* MXNet: round() of double arithmetic, as in kvstore_dist.h */
static size_t part_bound(size_t n, int s, int i)
{
    return (size_t)round((double)n / s * i);
}

int dshim_ps_layout(int key, size_t n, int num_servers, size_t bound, int compressed,
                    dshim_ps_part_t *parts)
{
    memset(parts, 0, sizeof(*parts) * (size_t)num_servers);
    size_t words = (n + 15) / 16;
    if (n < bound) {
        /* int arithmetic as MXNet's (key * 9973) % num_servers */
        int server = (int)((int32_t)((uint32_t)key * 9973u) % num_servers);
        if (server < 0) {
            server += num_servers;
        }
        parts[0].server = server;
        parts[0].offset = 0;
        parts[0].count = n;
        parts[0].woffset = 0;
        parts[0].wcount = words;
        return 1;
    }
    size_t done = 0, wdone = 0;
    for (int i = 0; i < num_servers; i++) {
        parts[i].server = i;
        if (!compressed) {
            parts[i].offset = part_bound(n, num_servers, i);
            parts[i].count = part_bound(n, num_servers, i + 1) - parts[i].offset;
            continue;
        }
        size_t pc, po;
        if (i == num_servers - 1) {
            pc = words - wdone;
            po = n - done;
        } else {
            pc = part_bound(words, num_servers, i + 1) - part_bound(words, num_servers, i);
            po = pc * 16;
        }
        parts[i].woffset = wdone;
        parts[i].wcount = pc;
        parts[i].offset = done;
        parts[i].count = po;
        wdone += pc;
        done += po;
    }
    return num_servers;
}

int dshim_ps_row_layout(int key, size_t rows, size_t unit, int num_servers, size_t bound, dshim_ps_part_t *parts)
{
    /* MXNet's EncodeRowSparseKey: whole rows, split when rows * unit >= bound
     * (the same test as a dense key's), llround of double arithmetic */
    int np = dshim_ps_layout(key, rows * unit, num_servers, bound, 0, parts);
    for (int i = 0; np > 1 && i < num_servers; i++) {
        parts[i].offset = part_bound(rows, num_servers, i);
        parts[i].count = part_bound(rows, num_servers, i + 1) - parts[i].offset;
    }
    if (np == 1) {
        parts[0].count = rows;
    }
    return np;
}

void dshim_ps_hdr_init(dshim_ps_hdr_t *h, int type, int key, uint64_t len)
{
    memset(h, 0, sizeof(*h));
    h->magic = DSHIM_PS_MAGIC;
    h->type = (uint8_t)type;
    h->key = key;
    h->len = len;
}

const char *dshim_ps_msg_name(int type)
{
    static const char *names[] = {"?",    "HELLO", "ASSIGN", "BARRIER", "BARRIER_DONE", "DEAD", "BYE", "WHELLO",
                                  "PUSH", "PULL",  "CMD",    "REPLY",   "ERROR",        "STOP", "FAIL", "WAITING"};
    return (type > 0 && type <= DSHIM_PS_MSG_WAITING) ? names[type] : "?";
}

double dshim_ps_deadline(const dshim_ps_env_t *env, double from)
{
    return env->timeout_s > 0 ? from + env->timeout_s : 0;
}

int dshim_ps_timed_out(const dshim_ps_env_t *env, double since, double now)
{
    return env->timeout_s > 0 && now - since >= env->timeout_s;
}

double dshim_ps_alive_every(const dshim_ps_env_t *env)
{
    double q = env->timeout_s > 0 ? env->timeout_s / 4 : 1.0;
    return q < 0.01 ? 0.01 : q < 1.0 ? q : 1.0;
}

static dshim_status_t wait_fd(int fd, short events, double deadline)
{
    for (;;) {
        int ms = -1;
        if (deadline > 0) {
            double left = deadline - dshim_now();
            if (left <= 0) {
                return DSHIM_ERR_TIMEOUT;
            }
            ms = (int)(left * 1000) + 1;
        }
        struct pollfd p = {.fd = fd, .events = events};
        int r = poll(&p, 1, ms);
        if (r > 0) {
            return DSHIM_OK;
        }
        if (r < 0 && errno != EINTR) {
            return DSHIM_ERR_SYSTEM;
        }
    }
}

static dshim_status_t io_full(int fd, void *buf, size_t len, double deadline, int writing)
{
    char *p = buf;
    while (len > 0) {
        ssize_t r = writing ? send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT) : recv(fd, p, len, MSG_DONTWAIT);
        if (r > 0) {
            p += r;
            len -= (size_t)r;
            continue;
        }
        if (r == 0 && !writing) {
            return DSHIM_ERR_PEER;
        }
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
            dshim_status_t st = wait_fd(fd, writing ? POLLOUT : POLLIN, deadline);
            if (st != DSHIM_OK) {
                return st;
            }
            continue;
        }
        return DSHIM_ERR_PEER; /* ECONNRESET, EPIPE: the peer is gone */
    }
    return DSHIM_OK;
}

dshim_status_t dshim_ps_send(int fd, const dshim_ps_hdr_t *h, const void *payload, double deadline)
{
    /* header and payload in one sendmsg: one system call (and one segment) for small messages */
    struct iovec iov[2] = {{.iov_base = (void *)h, .iov_len = sizeof(*h)},
                           {.iov_base = (void *)payload, .iov_len = h->len}};
    struct msghdr m;
    memset(&m, 0, sizeof(m));
    m.msg_iov = iov;
    m.msg_iovlen = h->len > 0 ? 2 : 1;
    ssize_t r = sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            return DSHIM_ERR_PEER;
        }
        r = 0;
    }
    size_t done = (size_t)r;
    if (done < sizeof(*h)) {
        DSHIM_CHECK(io_full(fd, (char *)h + done, sizeof(*h) - done, deadline, 1));
        done = sizeof(*h);
    }
    size_t pdone = done - sizeof(*h);
    if (pdone < h->len) {
        return io_full(fd, (char *)payload + pdone, h->len - pdone, deadline, 1);
    }
    return DSHIM_OK;
}

dshim_status_t dshim_ps_recv_hdr(int fd, dshim_ps_hdr_t *h, double deadline)
{
    dshim_status_t st = io_full(fd, h, sizeof(*h), deadline, 0);
    if (st == DSHIM_OK && h->magic != DSHIM_PS_MAGIC) {
        return DSHIM_ERR_PROTOCOL;
    }
    return st;
}

dshim_status_t dshim_ps_recv_body(int fd, void *buf, size_t len, double deadline)
{
    return len ? io_full(fd, buf, len, deadline, 0) : DSHIM_OK;
}

dshim_status_t dshim_ps_skip_body(int fd, size_t len, double deadline)
{
    char tmp[4096];
    while (len > 0) {
        size_t k = len < sizeof(tmp) ? len : sizeof(tmp);
        DSHIM_CHECK(io_full(fd, tmp, k, deadline, 0));
        len -= k;
    }
    return DSHIM_OK;
}

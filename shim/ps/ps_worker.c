/* Parameter server: a worker's data connections to the servers — pushes,
 * pulls and commands from any thread (MXNet's engine threads included),
 * answered out of order and matched by sequence number by one receiver
 * thread, which fills the caller's buffer and runs its callback. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/socket.h>
#include <arpa/inet.h>

#include "net.h"
#include "ps_log.h"
#include "ps_proto.h"
#include "ps_trace.h"
#include "status.h"

static void *receiver_main(void *arg);

dshim_status_t dshim_ps_worker_connect(dshim_ps_node_t *node)
{
    int ns = node->env.num_servers;
    node->server_fds = malloc(sizeof(int) * (size_t)ns);
    node->server_local = calloc((size_t)ns, 1);
    if (node->server_fds == NULL || node->server_local == NULL) {
        return dshim_error(DSHIM_ERR_NOMEM, "worker: out of memory");
    }
    for (int i = 0; i < ns; i++) {
        node->server_fds[i] = -1;
    }
    pthread_mutex_init(&node->pend_mu, NULL);
    pthread_cond_init(&node->pend_cond, NULL);
    node->recv_pipe[0] = node->recv_pipe[1] = -1;
    double deadline = dshim_now() + node->env.connect_timeout_s;
    for (int i = 0; i < ns; i++) {
        struct in_addr a = {.s_addr = node->servers[i].ip};
        char ip[INET_ADDRSTRLEN];
        inet_ntop(AF_INET, &a, ip, sizeof(ip));
        dshim_status_t st = dshim_net_connect(a, node->servers[i].port, deadline, &node->server_fds[i]);
        if (st != DSHIM_OK) {
            return dshim_error(DSHIM_ERR_PEER, "worker %d: cannot connect to server %d at %s:%d (pid %d on host %s): "
                               "check DMLC_NODE_HOST / DMLC_INTERFACE and firewalls", node->rank, i, ip,
                               node->servers[i].port, node->servers[i].pid, node->servers[i].host);
        }
        dshim_net_tune(node->server_fds[i], 4u << 20);
        struct sockaddr_in me, peer;
        socklen_t ml = sizeof(me), pl = sizeof(peer);
        node->server_local[i] = getsockname(node->server_fds[i], (struct sockaddr *)&me, &ml) == 0 &&
                                getpeername(node->server_fds[i], (struct sockaddr *)&peer, &pl) == 0 &&
                                me.sin_addr.s_addr == peer.sin_addr.s_addr;
        dshim_ps_hdr_t h;
        dshim_ps_hdr_init(&h, DSHIM_PS_MSG_WHELLO, node->rank, sizeof(node->env.token));
        DSHIM_CHECK(dshim_ps_send(node->server_fds[i], &h, node->env.token, deadline));
        DSHIM_PS_INFO(&node->env, node->rank, "connected to server %d at %s:%d", i, ip, node->servers[i].port);
    }
    if (pipe2(node->recv_pipe, O_CLOEXEC | O_NONBLOCK) != 0 ||
        pthread_create(&node->receiver, NULL, receiver_main, node) != 0) {
        return dshim_error(DSHIM_ERR_SYSTEM, "worker: cannot start the receiver thread: %s", strerror(errno));
    }
    node->receiver_running = 1;
    return DSHIM_OK;
}

/* The error for a server that stopped answering; prefers the scheduler's
 * death notice, which names the process best.  sending: the server took none
 * of a request for DSHIM_TIMEOUT (its socket stayed full), which a server
 * waiting for another worker's push does not cause: it still reads.  A
 * timeout here is this worker's own verdict on a stuck server (no other
 * process times it: nothing to wait for, only a failure already known
 * wins); a broken connection waits for the scheduler's notice of it. */
static dshim_status_t server_lost(dshim_ps_node_t *node, int server, dshim_status_t st, int sending)
{
    const char *f =
        st == DSHIM_ERR_TIMEOUT ? dshim_ps_failure(node) : dshim_ps_wait_failure(node, DSHIM_PS_NOTICE_S);
    if (f != NULL) {
        return dshim_error_quiet(DSHIM_ERR_PEER, "%s", f);
    }
    if (st == DSHIM_ERR_TIMEOUT) {
        char what[160];
        pthread_mutex_lock(&node->pend_mu);
        dshim_ps_wtrace_oldest(node, server, what, sizeof(what));
        pthread_mutex_unlock(&node->pend_mu);
        if (sending) {
            return dshim_error(DSHIM_ERR_TIMEOUT, "worker %d: server %d (pid %d on host %s) did not answer within "
                               "%.0f s (DSHIM_TIMEOUT): it read nothing this worker sent for that long: the server is "
                               "stopped or stuck", node->rank, server, node->servers[server].pid,
                               node->servers[server].host, node->env.timeout_s);
        }
        return dshim_error(DSHIM_ERR_TIMEOUT, "worker %d: server %d (pid %d on host %s) did not answer within %.0f s "
                           "(DSHIM_TIMEOUT)%s%s: another worker may not have pushed the same key, or the server is "
                           "stopped or stuck", node->rank, server, node->servers[server].pid,
                           node->servers[server].host, node->env.timeout_s, what[0] ? " to its " : "", what);
    }
    return dshim_error(DSHIM_ERR_PEER, "worker %d: server %d (pid %d on host %s) closed the connection: it died",
                       node->rank, server, node->servers[server].pid, node->servers[server].host);
}

/* What a request is, for stall lines and the flight recorder. */
typedef struct req_info {
    int what; /* dshim_ps_req_t */
    int key;  /* a command: its id */
    int dtype;
    uint64_t count, bytes;
} req_info_t;

/* Registers a request before it is sent (its answer may come at once). */
static dshim_status_t add_pending_ex(dshim_ps_node_t *node, int server, void *out, size_t out_len,
                                     dshim_ps_done_fn fn, void *arg, uint32_t *seq_p, const req_info_t *info)
{
    dshim_ps_pending_t *p = malloc(sizeof(*p));
    if (p == NULL) {
        return dshim_error(DSHIM_ERR_NOMEM, "worker: out of memory");
    }
    pthread_mutex_lock(&node->pend_mu);
    if (node->npending == node->cap_pending) {
        size_t cap = node->cap_pending ? node->cap_pending * 2 : 64;
        dshim_ps_pending_t **t = realloc(node->pending, cap * sizeof(*t));
        if (t == NULL) {
            pthread_mutex_unlock(&node->pend_mu);
            free(p);
            return dshim_error(DSHIM_ERR_NOMEM, "worker: out of memory");
        }
        node->pending = t;
        node->cap_pending = cap;
    }
    p->seq = ++node->next_seq;
    p->server = server;
    p->out = out;
    p->out_len = out_len;
    p->on_done = fn;
    p->arg = arg;
    p->refusable = 0;
    p->key = info != NULL ? info->key : 0;
    p->what = info != NULL ? info->what : DSHIM_PS_REQ_OTHER;
    dshim_ps_wtrace_request(node, p, info != NULL ? info->dtype : -1, info != NULL ? info->count : 0,
                            info != NULL ? info->bytes : 0);
    node->pending[node->npending++] = p;
    *seq_p = p->seq;
    pthread_mutex_unlock(&node->pend_mu);
    return DSHIM_OK;
}

/* A request of no particular kind (tests/fuzz/fuzz_ps_worker.c registers its requests so). */
__attribute__((unused)) static dshim_status_t add_pending(dshim_ps_node_t *node, int server, void *out,
                                                          size_t out_len, dshim_ps_done_fn fn, void *arg,
                                                          uint32_t *seq_p)
{
    return add_pending_ex(node, server, out, out_len, fn, arg, seq_p, NULL);
}

/* A request ends without an answer: its callback (if asked) and its entry. */
static void end_unsent(dshim_ps_node_t *node, dshim_ps_pending_t *p, int call)
{
    if (p == NULL) {
        return;
    }
    if (call && p->on_done != NULL) {
        p->on_done(p->arg, 0);
    }
    dshim_ps_wtrace_end(node, p->trace_id, 0);
    free(p);
}

/* Removes and returns the request (server, seq); NULL if unknown. Caller holds pend_mu. */
static dshim_ps_pending_t *take_pending(dshim_ps_node_t *node, int server, uint32_t seq)
{
    for (size_t i = 0; i < node->npending; i++) {
        dshim_ps_pending_t *p = node->pending[i];
        if (p->seq == seq && p->server == server) {
            node->pending[i] = node->pending[--node->npending];
            return p;
        }
    }
    return NULL;
}

/* take_pending for a request a server may refuse (a command); NULL otherwise. Caller holds pend_mu. */
static dshim_ps_pending_t *take_refusable(dshim_ps_node_t *node, int server, uint32_t seq)
{
    for (size_t i = 0; i < node->npending; i++) {
        if (node->pending[i]->seq == seq && node->pending[i]->server == server && node->pending[i]->refusable) {
            return take_pending(node, server, seq);
        }
    }
    return NULL;
}

static dshim_ps_pending_t *find_pending(dshim_ps_node_t *node, int server, uint32_t seq)
{
    pthread_mutex_lock(&node->pend_mu);
    dshim_ps_pending_t *found = NULL;
    for (size_t i = 0; i < node->npending; i++) {
        if (node->pending[i]->seq == seq && node->pending[i]->server == server) {
            found = node->pending[i];
        }
    }
    pthread_mutex_unlock(&node->pend_mu);
    return found;
}

static void complete(dshim_ps_node_t *node, dshim_ps_pending_t *p, int ok)
{
    dshim_ps_wtrace_end(node, p->trace_id, ok);
    if (p->on_done != NULL) {
        p->on_done(p->arg, ok);
    }
    free(p);
    pthread_mutex_lock(&node->pend_mu);
    pthread_cond_broadcast(&node->pend_cond);
    pthread_mutex_unlock(&node->pend_mu);
}

/* The job failed: every outstanding request ends, callbacks told. */
static void fail_all(dshim_ps_node_t *node, const char *why)
{
    pthread_mutex_lock(&node->pend_mu);
    if (node->recv_error[0] == '\0') {
        snprintf(node->recv_error, sizeof(node->recv_error), "%s", why);
    }
    dshim_ps_pending_t **list = node->pending;
    size_t n = node->npending;
    node->pending = NULL;
    node->npending = node->cap_pending = 0;
    pthread_mutex_unlock(&node->pend_mu);
    for (size_t i = 0; i < n; i++) {
        complete(node, list[i], 0);
    }
    free(list);
    pthread_mutex_lock(&node->pend_mu);
    pthread_cond_broadcast(&node->pend_cond);
    pthread_mutex_unlock(&node->pend_mu);
}

/* Reads one answer from a server and completes its request (receiver thread). */
static dshim_status_t read_answer(dshim_ps_node_t *node, int server)
{
    int fd = node->server_fds[server];
    double deadline = dshim_ps_deadline(&node->env, dshim_now());
    dshim_ps_hdr_t h;
    dshim_status_t st = dshim_ps_recv_hdr(fd, &h, deadline);
    if (st != DSHIM_OK) {
        return st;
    }
    dshim_ps_wtrace_heard(node, server);
    if (h.type == DSHIM_PS_MSG_WAITING) {
        /* the server lives: a round of it waits for another worker */
        return dshim_ps_skip_body(fd, h.len, deadline);
    }
    if (h.type == DSHIM_PS_MSG_ERROR) {
        char text[480] = "";
        size_t k = h.len < sizeof(text) - 1 ? h.len : sizeof(text) - 1;
        dshim_ps_recv_body(fd, text, k, deadline);
        dshim_ps_skip_body(fd, h.len - k, deadline);
        char msg[512];
        if (strncmp(text, "server ", 7) == 0) {
            snprintf(msg, sizeof(msg), "%s", text); /* it names itself (a stalled round's story) */
        } else {
            snprintf(msg, sizeof(msg), "server %d (host %s): %s", server, node->servers[server].host, text);
        }
        /* a refused command fails that call only: the server goes on serving */
        pthread_mutex_lock(&node->pend_mu);
        dshim_ps_pending_t *refused = take_refusable(node, server, h.seq);
        if (refused != NULL && node->cmd_error[0] == '\0') {
            snprintf(node->cmd_error, sizeof(node->cmd_error), "%s", msg);
        }
        pthread_mutex_unlock(&node->pend_mu);
        if (refused != NULL) {
            complete(node, refused, 0);
            return DSHIM_OK;
        }
        dshim_ps_node_fail(node, msg);
        return DSHIM_ERR_INVALID;
    }
    /* the body goes straight into the caller's buffer: look the request up
     * without removing it, so that a waiter does not see it done too early */
    dshim_ps_pending_t *p = find_pending(node, server, h.seq);
    if (h.type != DSHIM_PS_MSG_REPLY || p == NULL) {
        /* a request forgotten after an error (dshim_ps_worker_drop) */
        DSHIM_PS_TRACE(&node->env, node->rank, "dropped %s seq %u from server %d", dshim_ps_msg_name(h.type),
                       h.seq, server);
        return dshim_ps_skip_body(fd, h.len, deadline);
    }
    if (p->out != NULL && h.len != p->out_len) {
        dshim_ps_skip_body(fd, h.len, deadline);
        char msg[512];
        snprintf(msg, sizeof(msg), "worker %d: server %d answered %llu bytes for a key of %zu bytes: the workers "
                 "disagree on this key's size", node->rank, server, (unsigned long long)h.len, p->out_len);
        dshim_ps_node_fail(node, msg);
        return DSHIM_ERR_INVALID;
    }
    st = p->out != NULL ? dshim_ps_recv_body(fd, p->out, h.len, deadline) : dshim_ps_skip_body(fd, h.len, deadline);
    if (st != DSHIM_OK) {
        return st;
    }
    node->bytes_in += h.len;
    DSHIM_PS_TRACE(&node->env, node->rank, "REPLY seq %u (%llu bytes) <- server %d", h.seq,
                   (unsigned long long)h.len, server);
    pthread_mutex_lock(&node->pend_mu);
    p = take_pending(node, server, h.seq);
    pthread_mutex_unlock(&node->pend_mu);
    if (p != NULL) {
        complete(node, p, 1);
    }
    return DSHIM_OK;
}

static void *receiver_main(void *arg)
{
    dshim_ps_node_t *node = arg;
    int ns = node->env.num_servers;
    struct pollfd pfds[ns + 2];
    for (;;) {
        for (int i = 0; i < ns; i++) {
            pfds[i].fd = node->server_fds[i];
            pfds[i].events = POLLIN;
            pfds[i].revents = 0;
        }
        pfds[ns].fd = node->recv_pipe[0];
        pfds[ns + 1].fd = node->wake_pipe[0];
        pfds[ns].events = pfds[ns + 1].events = POLLIN;
        pfds[ns].revents = pfds[ns + 1].revents = 0;
        if (poll(pfds, (nfds_t)ns + 2, 1000) < 0 && errno != EINTR) {
            fail_all(node, "worker: poll failed");
            return NULL;
        }
        if (pfds[ns].revents) {
            return NULL; /* dshim_ps_worker_stop */
        }
        const char *f = dshim_ps_failure(node);
        if (f != NULL) {
            fail_all(node, f);
            return NULL;
        }
        for (int i = 0; i < ns; i++) {
            if (!dshim_ps_conn_ready(&pfds[i])) {
                continue;
            }
            dshim_status_t st = read_answer(node, i);
            if (st == DSHIM_OK) {
                continue;
            }
            /* teardown: after rank 0's kStopServer a server answers and closes;
             * fine unless this worker still waits for that server */
            pthread_mutex_lock(&node->pend_mu);
            int quiet = node->quiescing;
            for (size_t k = 0; k < node->npending; k++) {
                quiet &= node->pending[k]->server != i;
            }
            pthread_mutex_unlock(&node->pend_mu);
            if (quiet && st == DSHIM_ERR_PEER) {
                close(node->server_fds[i]);
                node->server_fds[i] = -1; /* poll ignores it from now on */
                continue;
            }
            if (st != DSHIM_ERR_INVALID) {
                server_lost(node, i, st, 0);
                dshim_ps_node_fail(node, dshim_last_error());
            }
            fail_all(node, dshim_ps_failure(node) ? dshim_ps_failure(node) : dshim_last_error());
            return NULL;
        }
        /* requests unanswered for long: warnings, and a silent server's timeout */
        if (dshim_ps_wtrace_check(node) != DSHIM_OK) {
            fprintf(stderr, "[dshim-ps] %s\n", dshim_last_error()); /* "worker R: server S (...) did not answer within ..." */
            dshim_ps_node_fail(node, dshim_last_error());
            fail_all(node, dshim_ps_failure(node));
            return NULL;
        }
    }
}

void dshim_ps_worker_quiesce(dshim_ps_node_t *node)
{
    if (node->server_fds == NULL) {
        return;
    }
    pthread_mutex_lock(&node->pend_mu);
    node->quiescing = 1;
    pthread_mutex_unlock(&node->pend_mu);
}

void dshim_ps_worker_goodbye(dshim_ps_node_t *node)
{
    if (node->server_fds == NULL) {
        return;
    }
    dshim_ps_hdr_t h;
    dshim_ps_hdr_init(&h, DSHIM_PS_MSG_BYE, node->rank, 0);
    pthread_mutex_lock(&node->send_mu);
    for (int i = 0; i < node->env.num_servers; i++) {
        if (node->server_fds[i] >= 0) {
            /* a stopped server may be gone */
            dshim_ps_send(node->server_fds[i], &h, NULL, dshim_now() + DSHIM_PS_FAREWELL_S);
        }
    }
    pthread_mutex_unlock(&node->send_mu);
}

void dshim_ps_worker_stop(dshim_ps_node_t *node)
{
    if (!node->receiver_running) {
        return;
    }
    char c = 1;
    ssize_t r = write(node->recv_pipe[1], &c, 1);
    (void)r;
    pthread_join(node->receiver, NULL);
    node->receiver_running = 0;
    close(node->recv_pipe[0]);
    close(node->recv_pipe[1]);
    dshim_ps_worker_drop(node);
    pthread_mutex_destroy(&node->pend_mu);
    pthread_cond_destroy(&node->pend_cond);
}

static dshim_status_t failed_status(dshim_ps_node_t *node)
{
    const char *f = dshim_ps_failure(node);
    if (f != NULL) {
        return dshim_error_quiet(DSHIM_ERR_PEER, "%s", f);
    }
    /* the receiver thread writes recv_error (under pend_mu) when it fails */
    char why[sizeof(node->recv_error)];
    pthread_mutex_lock(&node->pend_mu);
    memcpy(why, node->recv_error, sizeof(why));
    pthread_mutex_unlock(&node->pend_mu);
    return why[0] ? dshim_error_quiet(DSHIM_ERR_PEER, "%s", why) : DSHIM_OK;
}

static dshim_status_t send_to(dshim_ps_node_t *node, int server, dshim_ps_hdr_t *h, const void *payload)
{
    DSHIM_PS_TRACE(&node->env, node->rank, "%s key %d (%llu bytes, seq %u) -> server %d", dshim_ps_msg_name(h->type),
                   h->key, (unsigned long long)h->len, h->seq, server);
    DSHIM_CHECK(failed_status(node));
    pthread_mutex_lock(&node->send_mu);
    dshim_status_t st = dshim_ps_send(node->server_fds[server], h, payload, dshim_ps_deadline(&node->env, dshim_now()));
    node->bytes_out += h->len;
    pthread_mutex_unlock(&node->send_mu);
    if (st != DSHIM_OK) {
        return server_lost(node, server, st, 1);
    }
    return DSHIM_OK;
}

static dshim_status_t push_common(dshim_ps_node_t *node, int server, int key, int dtype, const void *payload,
                                  size_t len, size_t nelem, int compressed, int want_pull, void *out,
                                  size_t out_len, dshim_ps_done_fn fn, void *arg)
{
    uint32_t seq = 0;
    req_info_t info = {.what = want_pull ? DSHIM_PS_REQ_PUSHPULL : DSHIM_PS_REQ_PUSH, .key = key, .dtype = dtype,
                       .count = nelem, .bytes = len};
    dshim_status_t st = add_pending_ex(node, server, want_pull ? out : NULL, want_pull ? out_len : 0, fn, arg, &seq,
                                       &info);
    if (st != DSHIM_OK) {
        if (fn != NULL) {
            fn(arg, 0);
        }
        return st;
    }
    dshim_ps_hdr_t h;
    dshim_ps_hdr_init(&h, DSHIM_PS_MSG_PUSH, key, len);
    h.dtype = (uint16_t)dtype;
    h.seq = seq;
    h.nelem = nelem;
    h.flags = (uint8_t)((want_pull ? DSHIM_PS_F_PULL : 0) | (compressed ? DSHIM_PS_F_COMPRESSED : 0));
    __atomic_add_fetch(&node->n_push, 1, __ATOMIC_RELAXED);
    st = send_to(node, server, &h, payload);
    if (st != DSHIM_OK) {
        /* not sent: it ends here, unless the receiver thread, seeing the job
         * fail, already ended it (then its callback ran there) */
        pthread_mutex_lock(&node->pend_mu);
        dshim_ps_pending_t *p = take_pending(node, server, seq);
        pthread_mutex_unlock(&node->pend_mu);
        end_unsent(node, p, 1);
    }
    return st;
}

dshim_status_t dshim_ps_worker_push(dshim_ps_node_t *node, int server, int key, int dtype, const void *payload,
                                    size_t len, size_t nelem, int compressed, int want_pull, void *out,
                                    size_t out_len, uint32_t *seq_p)
{
    (void)seq_p;
    return push_common(node, server, key, dtype, payload, len, nelem, compressed, want_pull, out, out_len, NULL,
                       NULL);
}

dshim_status_t dshim_ps_worker_push_cb(dshim_ps_node_t *node, int server, int key, int dtype, const void *payload,
                                       size_t len, int want_pull, void *out, size_t out_len, dshim_ps_done_fn fn,
                                       void *arg)
{
    size_t es = dshim_ps_dtype_size(dtype);
    return push_common(node, server, key, dtype, payload, len, es ? len / es : 0, 0, want_pull, out, out_len, fn,
                       arg);
}

/* The pieces of one pushpull: the caller's callback runs when the last ends. */
typedef struct piece_group {
    int left; /* pieces not yet answered, + 1 while they are being sent */
    int ok;
    dshim_ps_done_fn fn;
    void *arg;
    dshim_ps_node_t *node;
    uint64_t trace_id; /* the part's one entry */
} piece_group_t;

static void piece_done(void *arg, int ok)
{
    piece_group_t *g = arg;
    if (!ok) {
        __atomic_store_n(&g->ok, 0, __ATOMIC_RELAXED);
    }
    if (__atomic_sub_fetch(&g->left, 1, __ATOMIC_ACQ_REL) == 0) {
        const int all_ok = __atomic_load_n(&g->ok, __ATOMIC_RELAXED);
        dshim_ps_wtrace_end(g->node, g->trace_id, all_ok);
        g->fn(g->arg, all_ok);
        free(g);
    }
}

dshim_status_t dshim_ps_worker_pushpull_pieces(dshim_ps_node_t *node, int server, int key, int dtype,
                                               const void *payload, size_t len, void *out, size_t piece_bytes,
                                               dshim_ps_done_fn fn, void *arg)
{
    size_t es = dshim_ps_dtype_size(dtype);
    piece_group_t *g = malloc(sizeof(*g));
    if (g == NULL || es == 0 || len % es != 0) {
        dshim_status_t why = g == NULL ? DSHIM_ERR_NOMEM : DSHIM_ERR_INVALID;
        free(g);
        fn(arg, 0);
        return dshim_error(why, "worker %d: cannot push key %d in pieces (%zu bytes of dtype %d)", node->rank, key,
                           len, dtype);
    }
    const size_t n = len / es;
    const size_t per = piece_bytes / es ? piece_bytes / es : 1;
    const size_t npieces = n ? (n + per - 1) / per : 0;
    g->left = (int)npieces + 1;
    g->ok = 1;
    g->fn = fn;
    g->arg = arg;
    g->node = node;
    uint64_t round = 0;
    g->trace_id = dshim_ps_wtrace_group(node, server, key, dtype, n, len, &round);
    req_info_t info = {.what = DSHIM_PS_REQ_PIECES, .key = key, .dtype = dtype};
    dshim_status_t st = DSHIM_OK;
    size_t sent = 0;
    for (size_t off = 0; off < n; off += per, sent++) {
        const size_t cnt = n - off < per ? n - off : per;
        uint32_t seq = 0;
        info.count = cnt;
        info.bytes = cnt * es;
        st = add_pending_ex(node, server, (char *)out + off * es, cnt * es, piece_done, g, &seq, &info);
        if (st != DSHIM_OK) {
            break;
        }
        dshim_ps_hdr_t h;
        dshim_ps_hdr_init(&h, DSHIM_PS_MSG_PUSH, key, cnt * es);
        h.dtype = (uint16_t)dtype;
        h.seq = seq;
        h.nelem = n;
        h.off = off;
        h.flags = DSHIM_PS_F_PULL | DSHIM_PS_F_PIECE;
        __atomic_add_fetch(&node->n_push, 1, __ATOMIC_RELAXED);
        st = send_to(node, server, &h, (const char *)payload + off * es);
        if (st != DSHIM_OK) {
            /* not sent: it will not be answered; it ends below with the
             * unsent ones, unless the receiver thread, seeing the job fail,
             * already ended it (then it counts as sent) */
            pthread_mutex_lock(&node->pend_mu);
            dshim_ps_pending_t *p = take_pending(node, server, seq);
            pthread_mutex_unlock(&node->pend_mu);
            sent += p == NULL;
            end_unsent(node, p, 0);
            break;
        }
    }
    if (st != DSHIM_OK) {
        /* the pieces never sent end here, failed; those sent end on the
         * receiver thread (the lost connection fails them) */
        __atomic_store_n(&g->ok, 0, __ATOMIC_RELAXED);
        __atomic_sub_fetch(&g->left, (int)(npieces - sent), __ATOMIC_ACQ_REL);
    }
    piece_done(g, st == DSHIM_OK);
    return st;
}

int dshim_ps_worker_server_is_local(const dshim_ps_node_t *node, int server)
{
    return node->server_local != NULL && node->server_local[server];
}

dshim_status_t dshim_ps_worker_pull(dshim_ps_node_t *node, int server, int key, int dtype, void *out,
                                    size_t out_len, uint32_t *seq_p)
{
    uint32_t seq = 0;
    size_t es = dshim_ps_dtype_size(dtype);
    req_info_t info = {.what = DSHIM_PS_REQ_PULL, .key = key, .dtype = dtype, .count = es ? out_len / es : 0,
                       .bytes = out_len};
    DSHIM_CHECK(add_pending_ex(node, server, out, out_len, NULL, NULL, &seq, &info));
    dshim_ps_hdr_t h;
    dshim_ps_hdr_init(&h, DSHIM_PS_MSG_PULL, key, 0);
    h.dtype = (uint16_t)dtype;
    h.seq = seq;
    h.nelem = out_len;
    __atomic_add_fetch(&node->n_pull, 1, __ATOMIC_RELAXED);
    if (seq_p) {
        *seq_p = seq;
    }
    return send_to(node, server, &h, NULL);
}

/* The header of a rows message (wire-protocol §7): nelem = rows in the server's
 * part of the key, off = elements per row. */
static void rows_hdr(dshim_ps_hdr_t *h, int type, int key, int dtype, size_t len, uint32_t seq, size_t part_rows,
                     size_t unit)
{
    dshim_ps_hdr_init(h, type, key, len);
    h->dtype = (uint16_t)dtype;
    h->seq = seq;
    h->nelem = part_rows;
    h->off = unit;
    h->flags = DSHIM_PS_F_ROWS;
}

dshim_status_t dshim_ps_worker_push_rows(dshim_ps_node_t *node, int server, int key, int dtype, const void *payload,
                                         size_t len, size_t part_rows, size_t unit)
{
    uint32_t seq = 0;
    req_info_t info = {.what = DSHIM_PS_REQ_PUSH_ROWS, .key = key, .dtype = dtype, .count = part_rows * unit,
                       .bytes = len};
    DSHIM_CHECK(add_pending_ex(node, server, NULL, 0, NULL, NULL, &seq, &info));
    dshim_ps_hdr_t h;
    rows_hdr(&h, DSHIM_PS_MSG_PUSH, key, dtype, len, seq, part_rows, unit);
    __atomic_add_fetch(&node->n_push, 1, __ATOMIC_RELAXED);
    return send_to(node, server, &h, payload);
}

dshim_status_t dshim_ps_worker_pull_rows(dshim_ps_node_t *node, int server, int key, int dtype, const int64_t *ids,
                                         size_t nrows, size_t part_rows, size_t unit, void *out, size_t out_len)
{
    uint32_t seq = 0;
    req_info_t info = {.what = DSHIM_PS_REQ_PULL_ROWS, .key = key, .dtype = dtype, .count = nrows * unit,
                       .bytes = out_len};
    DSHIM_CHECK(add_pending_ex(node, server, out, out_len, NULL, NULL, &seq, &info));
    dshim_ps_hdr_t h;
    rows_hdr(&h, DSHIM_PS_MSG_PULL, key, dtype, nrows * sizeof(int64_t), seq, part_rows, unit);
    __atomic_add_fetch(&node->n_pull, 1, __ATOMIC_RELAXED);
    return send_to(node, server, &h, ids);
}

dshim_status_t dshim_ps_worker_wait_all(dshim_ps_node_t *node)
{
    /* no deadline of its own: a server that goes silent is timed out by the
     * receiver thread (dshim_ps_wtrace_check), a round that waits for
     * another worker by its server (ps.h); either fails the node */
    int resends = 0;
    double next_note = dshim_now() + node->env.resend_timeout_ms / 1000.0;
    pthread_mutex_lock(&node->pend_mu);
    while (node->npending > 0 && node->recv_error[0] == '\0' && dshim_ps_failure(node) == NULL) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&node->pend_cond, &node->pend_mu, &ts);
        double now = dshim_now();
        int srv = node->npending ? node->pending[0]->server : 0;
        if (node->env.resend && node->npending > 0 && now > next_note) {
            /* TCP loses nothing while the connection lives (a broken one is a
             * death, reported by the receiver); PS_RESEND bounds the silence */
            resends++;
            DSHIM_PS_INFO(&node->env, node->rank, "no answer from server %d (PS_RESEND try %d of 10)", srv,
                          resends);
            if (resends >= 10) {
                pthread_mutex_unlock(&node->pend_mu);
                return dshim_error(DSHIM_ERR_TIMEOUT, "worker %d: server %d (host %s) did not answer after 10 tries "
                                   "of PS_RESEND_TIMEOUT=%d ms", node->rank, srv, node->servers[srv].host,
                                   node->env.resend_timeout_ms);
            }
            next_note = now + node->env.resend_timeout_ms * (1 + resends) / 1000.0;
        }
    }
    pthread_mutex_unlock(&node->pend_mu);
    return failed_status(node);
}

void dshim_ps_worker_drop(dshim_ps_node_t *node)
{
    pthread_mutex_lock(&node->pend_mu);
    dshim_ps_pending_t **list = node->pending;
    size_t n = node->npending;
    size_t keep = 0;
    for (size_t i = 0; i < n; i++) {
        if (list[i]->on_done == NULL) {
            dshim_ps_wtrace_end(node, list[i]->trace_id, 0);
            free(list[i]);
        } else {
            list[keep++] = list[i]; /* asynchronous ones own their buffers */
        }
    }
    node->npending = keep;
    pthread_mutex_unlock(&node->pend_mu);
}

/* Marks a registered request as one a server may refuse without failing the job. */
static void mark_refusable(dshim_ps_node_t *node, int server, uint32_t seq)
{
    pthread_mutex_lock(&node->pend_mu);
    for (size_t i = 0; i < node->npending; i++) {
        if (node->pending[i]->seq == seq && node->pending[i]->server == server) {
            node->pending[i]->refusable = 1;
        }
    }
    pthread_mutex_unlock(&node->pend_mu);
}

dshim_status_t dshim_ps_worker_command(dshim_ps_node_t *node, int cmd, const char *body)
{
    size_t len = body ? strlen(body) : 0;
    pthread_mutex_lock(&node->pend_mu);
    node->cmd_error[0] = '\0';
    pthread_mutex_unlock(&node->pend_mu);
    for (int i = 0; i < node->env.num_servers; i++) {
        uint32_t seq = 0;
        req_info_t info = {.what = DSHIM_PS_REQ_CMD, .key = cmd, .dtype = -1, .bytes = len};
        DSHIM_CHECK(add_pending_ex(node, i, NULL, 0, NULL, NULL, &seq, &info));
        mark_refusable(node, i, seq);
        dshim_ps_hdr_t h;
        dshim_ps_hdr_init(&h, DSHIM_PS_MSG_CMD, cmd, len);
        h.seq = seq;
        DSHIM_CHECK(send_to(node, i, &h, body));
    }
    node->n_cmd++;
    DSHIM_CHECK(dshim_ps_worker_wait_all(node));
    char refused[sizeof(node->cmd_error)];
    pthread_mutex_lock(&node->pend_mu);
    memcpy(refused, node->cmd_error, sizeof(refused));
    pthread_mutex_unlock(&node->pend_mu);
    /* the servers printed it; the caller raises it */
    return refused[0] != '\0' ? dshim_error_quiet(DSHIM_ERR_INVALID, "%s", refused) : DSHIM_OK;
}

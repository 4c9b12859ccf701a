/* Parameter server: a worker's or server's link to the scheduler —
 * registration, barriers, death notices (a monitor thread reads them). */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/socket.h>
#include <arpa/inet.h>

#include "log.h"
#include "net.h"
#include "ps_log.h"
#include "ps_proto.h"
#include "ps_trace.h"
#include "status.h"

int dshim_ps_node_rank(const dshim_ps_node_t *node)
{
    return node->rank;
}

const dshim_ps_env_t *dshim_ps_node_env(const dshim_ps_node_t *node)
{
    return &node->env;
}

int dshim_ps_stop_requested(dshim_ps_node_t *node)
{
    pthread_mutex_lock(&node->mu);
    int s = node->stop_requested;
    pthread_mutex_unlock(&node->mu);
    return s;
}

const char *dshim_ps_failure(dshim_ps_node_t *node)
{
    pthread_mutex_lock(&node->mu);
    const char *f = node->failure[0] ? node->failure : NULL;
    pthread_mutex_unlock(&node->mu);
    return f;
}

const char *dshim_ps_wait_failure(dshim_ps_node_t *node, double seconds)
{
    double deadline = dshim_now() + seconds;
    pthread_mutex_lock(&node->mu);
    while (node->failure[0] == '\0' && dshim_now() < deadline) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 50 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&node->cond, &node->mu, &ts);
    }
    const char *f = node->failure[0] ? node->failure : NULL;
    pthread_mutex_unlock(&node->mu);
    return f;
}

void dshim_ps_node_fail(dshim_ps_node_t *node, const char *msg)
{
    pthread_mutex_lock(&node->mu);
    int first = node->failure[0] == '\0';
    if (first) {
        snprintf(node->failure, sizeof(node->failure), "%s", msg);
    }
    pthread_cond_broadcast(&node->cond);
    pthread_mutex_unlock(&node->mu);
    if (first && node->wake_pipe[1] >= 0) {
        char c = 1;
        ssize_t r = write(node->wake_pipe[1], &c, 1);
        (void)r;
    }
    if (first) {
        dshim_ps_trace_node_failed(node, msg); /* the flight recorder's dump */
    }
}

static int group_index(int group)
{
    return group == DSHIM_PS_GROUP_SCHEDULER ? 0 : group == DSHIM_PS_GROUP_SERVERS ? 1 : 2;
}

/* The last word when the process does not notice by itself (it is computing,
 * not inside a kvstore call): the job is over, end it with the reason. */
static void *fatal_timer(void *arg)
{
    dshim_ps_node_t *node = arg;
    sleep(3);
    fprintf(stderr, "[dshim-ps %s %d] ending this process: %s\n", dshim_ps_role_name(node->env.role), node->rank,
            node->failure);
    fflush(stderr);
    _exit(1);
    return NULL;
}

static void *monitor_main(void *arg)
{
    dshim_ps_node_t *node = arg;
    for (;;) {
        dshim_ps_hdr_t h;
        dshim_status_t st = dshim_ps_recv_hdr(node->sched_fd, &h, 0);
        pthread_mutex_lock(&node->mu);
        int closing = node->closing;
        pthread_mutex_unlock(&node->mu);
        if (closing) {
            return NULL;
        }
        if (st == DSHIM_OK) {
            pthread_mutex_lock(&node->mu);
            node->sched_heard = dshim_now();
            pthread_mutex_unlock(&node->mu);
        }
        if (st != DSHIM_OK) {
            char msg[512];
            snprintf(msg, sizeof(msg), "dshim ps: lost the scheduler at %s:%d (%s): the scheduler process died or "
                     "was stopped; this %s ends", node->env.root_uri, node->env.root_port,
                     st == DSHIM_ERR_PROTOCOL ? "garbage on the connection" : "connection closed",
                     dshim_ps_role_name(node->env.role));
            pthread_mutex_lock(&node->mu);
            node->failure_told = 1;
            pthread_mutex_unlock(&node->mu);
            dshim_ps_node_fail(node, msg);
            break;
        }
        if (h.type == DSHIM_PS_MSG_BARRIER_DONE) {
            pthread_mutex_lock(&node->mu);
            node->barriers_done++;
            pthread_cond_broadcast(&node->cond);
            pthread_mutex_unlock(&node->mu);
            DSHIM_PS_INFO(&node->env, node->rank, "barrier done");
        } else if (h.type == DSHIM_PS_MSG_STOP) {
            pthread_mutex_lock(&node->mu);
            node->stop_requested = 1;
            pthread_cond_broadcast(&node->cond);
            pthread_mutex_unlock(&node->mu);
            DSHIM_PS_INFO(&node->env, node->rank, "every worker left (without a final barrier): stopping");
        } else if (h.type == DSHIM_PS_MSG_DEAD) {
            char text[448] = "";
            size_t k = h.len < sizeof(text) - 1 ? h.len : sizeof(text) - 1;
            if (dshim_ps_recv_body(node->sched_fd, text, k, dshim_now() + DSHIM_PS_REST_S) != DSHIM_OK) {
                break;
            }
            dshim_ps_skip_body(node->sched_fd, h.len - k, dshim_now() + DSHIM_PS_REST_S);
            text[k] = '\0';
            pthread_mutex_lock(&node->mu);
            node->dead_groups[group_index(h.key)]++;
            node->failure_told = 1;
            pthread_mutex_unlock(&node->mu);
            char msg[512];
            snprintf(msg, sizeof(msg), "dshim ps: %s", text);
            fprintf(stderr, "[dshim-ps %s %d] %s\n", dshim_ps_role_name(node->env.role), node->rank, msg);
            dshim_ps_node_fail(node, msg);
            break;
        } else {
            /* WAITING: the scheduler lives, a barrier waits for another node */
            dshim_ps_skip_body(node->sched_fd, h.len, dshim_now() + DSHIM_PS_REST_S);
        }
    }
    pthread_t t;
    if (pthread_create(&t, NULL, fatal_timer, node) == 0) {
        pthread_detach(t);
    }
    return NULL;
}

static dshim_status_t server_listen(dshim_ps_node_t *node)
{
    char why[256] = "";
    if (node->env.node_host[0] != '\0') {
        DSHIM_CHECK(dshim_net_resolve(node->env.node_host, &node->addr));
    } else {
        DSHIM_CHECK(dshim_net_pick_local_addr(node->env.root_uri, &node->addr, why, sizeof(why)));
    }
    return dshim_net_listen(node->addr, &node->listen_fd, &node->port);
}

dshim_status_t dshim_ps_node_start(const dshim_ps_env_t *env, dshim_ps_node_t **out)
{
    dshim_log_init(); /* DSHIM_DEBUG's level, before the first ps_log.h line */
    dshim_ps_node_t *node = calloc(1, sizeof(*node));
    if (node == NULL) {
        return dshim_error(DSHIM_ERR_NOMEM, "parameter server: out of memory");
    }
    node->env = *env;
    node->rank = -1;
    node->sched_fd = node->listen_fd = -1;
    node->wake_pipe[0] = node->wake_pipe[1] = -1;
    pthread_mutex_init(&node->mu, NULL);
    pthread_mutex_init(&node->send_mu, NULL);
    pthread_cond_init(&node->cond, NULL);
    dshim_status_t st = DSHIM_OK;
    if (pipe2(node->wake_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
        st = dshim_error(DSHIM_ERR_SYSTEM, "parameter server: pipe: %s", strerror(errno));
        goto fail;
    }
    if (env->role == DSHIM_PS_SERVER) {
        DSHIM_CHECK_GOTO(server_listen(node), st, fail);
    }
    struct in_addr root;
    st = dshim_net_resolve(env->root_uri, &root);
    if (st != DSHIM_OK) {
        st = dshim_error(DSHIM_ERR_INVALID, "parameter server: cannot resolve DMLC_PS_ROOT_URI=%s", env->root_uri);
        goto fail;
    }
    double deadline = dshim_now() + env->connect_timeout_s;
    st = dshim_net_connect(root, env->root_port, deadline, &node->sched_fd);
    if (st != DSHIM_OK) {
        st = dshim_error(DSHIM_ERR_TIMEOUT, "%s: no scheduler at DMLC_PS_ROOT_URI=%s DMLC_PS_ROOT_PORT=%d after "
                         "%.0f s (DSHIM_CONNECT_TIMEOUT): start the scheduler (DMLC_ROLE=scheduler) or fix the "
                         "address", dshim_ps_role_name(env->role), env->root_uri, env->root_port,
                         env->connect_timeout_s);
        goto fail;
    }
    dshim_ps_hello_t hello;
    memset(&hello, 0, sizeof(hello));
    hello.role = env->role;
    hello.port = node->port;
    hello.ip = node->addr.s_addr;
    hello.pid = (int32_t)getpid();
    hello.hint = env->task_id;
    snprintf(hello.token, sizeof(hello.token), "%s", env->token);
    snprintf(hello.host, sizeof(hello.host), "%s", dshim_log_hostname());
    dshim_ps_hdr_t h;
    dshim_ps_hdr_init(&h, DSHIM_PS_MSG_HELLO, 0, sizeof(hello));
    if (dshim_ps_send(node->sched_fd, &h, &hello, deadline) != DSHIM_OK) {
        st = dshim_error(DSHIM_ERR_PEER, "%s: the scheduler at %s:%d closed the connection during registration",
                         dshim_ps_role_name(env->role), env->root_uri, env->root_port);
        goto fail;
    }
    DSHIM_PS_INFO(env, -1, "registering with the scheduler %s:%d", env->root_uri, env->root_port);
    /* everyone must register before ranks are assigned: wait as long as the
     * connect timeout allows */
    st = dshim_ps_recv_hdr(node->sched_fd, &h, deadline);
    dshim_ps_assign_t as;
    if (st == DSHIM_OK && h.type == DSHIM_PS_MSG_ASSIGN && h.len >= sizeof(as)) {
        st = dshim_ps_recv_body(node->sched_fd, &as, sizeof(as), deadline);
    } else if (st == DSHIM_OK) {
        st = DSHIM_ERR_PROTOCOL;
    }
    if (st == DSHIM_OK && (as.num_servers != env->num_servers || as.num_workers != env->num_workers ||
                           h.len != sizeof(as) + sizeof(dshim_ps_hello_t) * (size_t)as.num_servers)) {
        st = dshim_error(DSHIM_ERR_INVALID, "%s: the scheduler runs %d workers + %d servers but this process has "
                         "DMLC_NUM_WORKER=%d DMLC_NUM_SERVER=%d: give every process the same values",
                         dshim_ps_role_name(env->role), as.num_workers, as.num_servers, env->num_workers,
                         env->num_servers);
        goto fail;
    }
    if (st == DSHIM_OK) {
        node->servers = calloc((size_t)as.num_servers, sizeof(dshim_ps_hello_t));
        st = dshim_ps_recv_body(node->sched_fd, node->servers, sizeof(dshim_ps_hello_t) * (size_t)as.num_servers,
                                deadline);
    }
    if (st != DSHIM_OK) {
        st = dshim_error(st == DSHIM_ERR_TIMEOUT ? DSHIM_ERR_TIMEOUT : DSHIM_ERR_PEER,
                         "%s: registration with the scheduler %s:%d did not complete (%s): are all %d workers and "
                         "%d servers started?", dshim_ps_role_name(env->role), env->root_uri, env->root_port,
                         st == DSHIM_ERR_TIMEOUT ? "timed out" : "connection lost", env->num_workers,
                         env->num_servers);
        goto fail;
    }
    node->rank = as.rank;
    dshim_ps_trace_node_open(node);
    if (env->role == DSHIM_PS_WORKER && node->wtrace == NULL) {
        /* it holds the worker's one deadline on its servers (ps.h) */
        st = dshim_error(DSHIM_ERR_NOMEM, "parameter server: out of memory");
        goto fail;
    }
    DSHIM_PS_INFO(env, node->rank, "registered: rank %d of %d %ss (%d workers, %d servers)", node->rank,
                  env->role == DSHIM_PS_SERVER ? env->num_servers : env->num_workers, dshim_ps_role_name(env->role),
                  env->num_workers, env->num_servers);
    if (pthread_create(&node->monitor, NULL, monitor_main, node) != 0) {
        st = dshim_error(DSHIM_ERR_SYSTEM, "parameter server: cannot start the monitor thread");
        goto fail;
    }
    node->monitor_running = 1;
    *out = node;
    return DSHIM_OK;
fail:
    dshim_ps_trace_node_close(node);
    if (node->sched_fd >= 0) {
        close(node->sched_fd);
    }
    if (node->listen_fd >= 0) {
        close(node->listen_fd);
    }
    if (node->wake_pipe[0] >= 0) {
        close(node->wake_pipe[0]);
        close(node->wake_pipe[1]);
    }
    free(node->servers);
    free(node);
    return st;
}

dshim_status_t dshim_ps_barrier(dshim_ps_node_t *node, int group)
{
    pthread_mutex_lock(&node->mu);
    unsigned long target = node->barriers_done + 1;
    pthread_mutex_unlock(&node->mu);
    uint64_t trace_id = dshim_ps_trace_barrier_begin(node, group, target);
    dshim_ps_hdr_t h;
    dshim_ps_hdr_init(&h, DSHIM_PS_MSG_BARRIER, group, 0);
    pthread_mutex_lock(&node->send_mu);
    double sent = dshim_now();
    dshim_status_t st = dshim_ps_send(node->sched_fd, &h, NULL, dshim_ps_deadline(&node->env, sent));
    pthread_mutex_unlock(&node->send_mu);
    DSHIM_PS_INFO(&node->env, node->rank, "barrier (group %d)", group);
    /* the barrier's deadline is the scheduler's, which names who did not
     * reach it (DEAD to everyone); this node's own is the scheduler's
     * silence: it says WAITING while the barrier waits (ps.h) */
    const double look_s = dshim_ps_alive_every(&node->env);
    pthread_mutex_lock(&node->mu);
    while (st == DSHIM_OK && node->barriers_done < target && node->failure[0] == '\0') {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        long ns = ts.tv_nsec + (long)(look_s * 1e9);
        ts.tv_sec += ns / 1000000000L;
        ts.tv_nsec = ns % 1000000000L;
        pthread_cond_timedwait(&node->cond, &node->mu, &ts);
        double quiet_since = node->sched_heard > sent ? node->sched_heard : sent;
        if (dshim_ps_timed_out(&node->env, quiet_since, dshim_now())) {
            st = DSHIM_ERR_TIMEOUT;
        }
    }
    int done = node->barriers_done >= target;
    char failure[512];
    snprintf(failure, sizeof(failure), "%s", node->failure);
    pthread_mutex_unlock(&node->mu);
    dshim_ps_trace_barrier_end(node, trace_id, done);
    if (done) {
        return DSHIM_OK;
    }
    if (failure[0]) {
        return dshim_error(DSHIM_ERR_PEER, "%s", failure);
    }
    if (st == DSHIM_ERR_TIMEOUT) {
        return dshim_error(DSHIM_ERR_TIMEOUT, "%s %d: barrier over group %d: the scheduler at %s:%d said nothing for "
                           "%.0f s (DSHIM_TIMEOUT): it is stopped or stuck", dshim_ps_role_name(node->env.role),
                           node->rank, group, node->env.root_uri, node->env.root_port, node->env.timeout_s);
    }
    return dshim_error(DSHIM_ERR_PEER, "%s %d: barrier over group %d failed: the scheduler's connection broke",
                       dshim_ps_role_name(node->env.role), node->rank, group);
}

int dshim_ps_num_dead(dshim_ps_node_t *node, int group)
{
    int n = 0;
    pthread_mutex_lock(&node->mu);
    for (int b = 0; b < 3; b++) {
        if (group & (1 << b)) {
            n += node->dead_groups[b];
        }
    }
    pthread_mutex_unlock(&node->mu);
    return n;
}

void dshim_ps_node_tell_failure(dshim_ps_node_t *node, const char *why)
{
    pthread_mutex_lock(&node->mu);
    int told = node->failure_told || node->closing;
    node->failure_told = 1;
    pthread_mutex_unlock(&node->mu);
    if (told || why == NULL || why[0] == '\0') {
        return;
    }
    size_t len = strnlen(why, 440);
    dshim_ps_hdr_t h;
    dshim_ps_hdr_init(&h, DSHIM_PS_MSG_FAIL, 0, len);
    pthread_mutex_lock(&node->send_mu);
    dshim_ps_send(node->sched_fd, &h, why, dshim_now() + DSHIM_PS_FAREWELL_S);
    pthread_mutex_unlock(&node->send_mu);
}

dshim_status_t dshim_ps_node_finish(dshim_ps_node_t *node, int skip_barrier)
{
    dshim_status_t st = DSHIM_OK;
    if (!skip_barrier && dshim_ps_failure(node) == NULL) {
        st = dshim_ps_barrier(node, DSHIM_PS_GROUP_ALL);
    }
    /* closing first: once every BYE is in, the scheduler ends and its
     * connection closes, which must not read as a failure */
    pthread_mutex_lock(&node->mu);
    node->closing = 1;
    pthread_mutex_unlock(&node->mu);
    if (st == DSHIM_OK && dshim_ps_failure(node) == NULL) {
        dshim_ps_hdr_t h;
        dshim_ps_hdr_init(&h, DSHIM_PS_MSG_BYE, 0, 0);
        pthread_mutex_lock(&node->send_mu);
        dshim_ps_send(node->sched_fd, &h, NULL, dshim_now() + DSHIM_PS_REST_S);
        pthread_mutex_unlock(&node->send_mu);
    }
    if (node->env.counters) {
        fprintf(stderr, "[dshim-ps %s %d] carried %lu pushes, %lu pulls, %lu commands; %llu bytes out, %llu bytes "
                "in\n", dshim_ps_role_name(node->env.role), node->rank, node->n_push, node->n_pull, node->n_cmd,
                node->bytes_out, node->bytes_in);
    }
    dshim_ps_worker_stop(node);
    shutdown(node->sched_fd, SHUT_RDWR);
    if (node->monitor_running) {
        pthread_join(node->monitor, NULL);
    }
    dshim_ps_trace_node_close(node); /* no thread of this node records any more */
    close(node->sched_fd);
    if (node->server_fds != NULL) {
        for (int i = 0; i < node->env.num_servers; i++) {
            if (node->server_fds[i] >= 0) {
                close(node->server_fds[i]);
            }
        }
        free(node->server_fds);
        free(node->server_local);
    }
    if (node->listen_fd >= 0) {
        close(node->listen_fd);
    }
    close(node->wake_pipe[0]);
    close(node->wake_pipe[1]);
    free(node->pending);
    free(node->servers);
    pthread_cond_destroy(&node->cond);
    pthread_mutex_destroy(&node->mu);
    pthread_mutex_destroy(&node->send_mu);
    free(node);
    return st;
}

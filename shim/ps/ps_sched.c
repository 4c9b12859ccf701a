/* Parameter server: the scheduler — registration, rank assignment, barriers,
 * and the job's lifeline: a node whose connection closes without BYE is dead,
 * every other node is told at once (ps-lite would hang). */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/socket.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>

#include "net.h"
#include "ps_log.h"
#include "ps_proto.h"
#include "status.h"
#include "trace.h"

typedef struct sched_node {
    int fd;
    dshim_ps_hello_t hello;
    int rank;
    int bye;
    int barrier_group; /* group of the barrier it waits in, 0 = none */
} sched_node_t;

static dshim_status_t sched_listen(const dshim_ps_env_t *env, int *fd_p)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return dshim_error(DSHIM_ERR_SYSTEM, "scheduler: socket: %s", strerror(errno));
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)env->root_port);
    /* only where the nodes reach it (DMLC_PS_ROOT_URI's address, or the named
     * interface); every interface only when neither matches this host */
    char bind_addr[INET_ADDRSTRLEN];
    dshim_net_listen_addr(env->root_uri, "scheduler", bind_addr, sizeof(bind_addr));
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
    if (bind_addr[0]) {
        inet_pton(AF_INET, bind_addr, &sa.sin_addr);
    }
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(fd, 256) != 0) {
        int e = errno;
        close(fd);
        return dshim_error(DSHIM_ERR_SYSTEM, "scheduler: cannot listen on %s:%d (DMLC_PS_ROOT_URI:"
                           "DMLC_PS_ROOT_PORT): %s", bind_addr[0] ? bind_addr : "0.0.0.0", env->root_port,
                           strerror(e));
    }
    *fd_p = fd;
    return DSHIM_OK;
}

static void describe(const sched_node_t *n, char *buf, size_t len)
{
    snprintf(buf, len, "%s %d (pid %d on host %s)", dshim_ps_role_name((dshim_ps_role_t)n->hello.role), n->rank,
             n->hello.pid, n->hello.host);
}

static int group_of(const sched_node_t *n)
{
    return n->hello.role == DSHIM_PS_SERVER ? DSHIM_PS_GROUP_SERVERS : DSHIM_PS_GROUP_WORKERS;
}

/* Tell every live node that `n` ended the job and how ("died", "ended with
 * an error"), with the reason; the text goes to out too (for the
 * scheduler's own error). */
static void announce_end(const dshim_ps_env_t *env, sched_node_t *nodes, int total, sched_node_t *n, const char *how,
                         const char *why, char *out, size_t out_len)
{
    char who[160], text[448];
    describe(n, who, sizeof(who));
    snprintf(text, sizeof(text), "%s %s: %s; the job cannot go on", who, how, why);
    fprintf(stderr, "[dshim-ps scheduler] %s\n", text);
    dshim_ps_hdr_t h;
    dshim_ps_hdr_init(&h, DSHIM_PS_MSG_DEAD, group_of(n), strlen(text));
    for (int i = 0; i < total; i++) {
        if (&nodes[i] != n && nodes[i].fd >= 0 && !nodes[i].bye) {
            dshim_ps_send(nodes[i].fd, &h, text, dshim_now() + DSHIM_PS_FAREWELL_S);
        }
    }
    if (out != NULL) {
        snprintf(out, out_len, "%s", text);
    }
    (void)env;
}

static dshim_status_t registration(const dshim_ps_env_t *env, int lfd, sched_node_t *nodes, int total)
{
    double deadline = dshim_now() + env->connect_timeout_s;
    int got = 0, nserv = 0, nwork = 0;
    while (got < total) {
        struct pollfd p = {.fd = lfd, .events = POLLIN};
        double left = deadline - dshim_now();
        if (left <= 0 || poll(&p, 1, (int)(left * 1000) + 1) == 0) {
            return dshim_error(DSHIM_ERR_TIMEOUT, "scheduler: only %d of %d workers and %d of %d servers registered "
                               "within %.0f s (DSHIM_CONNECT_TIMEOUT): start the missing processes with the same "
                               "DMLC_PS_ROOT_URI/PORT", nwork, env->num_workers, nserv, env->num_servers,
                               env->connect_timeout_s);
        }
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) {
            if (dshim_net_out_of_fds(errno, "the parameter-server scheduler cannot accept a connection")) {
                /* the node knocking never registers and the listener stays
                 * readable: fail now, naming EMFILE, not at the deadline */
                return dshim_error(DSHIM_ERR_SYSTEM, "%s", dshim_last_error());
            }
            continue;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        dshim_ps_hdr_t h;
        dshim_ps_hello_t hello;
        const double hello_by = dshim_now() + DSHIM_PS_CONTROL_S;
        if (dshim_ps_recv_hdr(fd, &h, hello_by) != DSHIM_OK || h.type != DSHIM_PS_MSG_HELLO ||
            h.len != sizeof(hello) || dshim_ps_recv_body(fd, &hello, sizeof(hello), hello_by) != DSHIM_OK) {
            DSHIM_PS_INFO(env, -1, "dropped a connection that did not speak the parameter-server protocol");
            close(fd);
            continue;
        }
        hello.host[sizeof(hello.host) - 1] = '\0';
        hello.token[sizeof(hello.token) - 1] = '\0';
        if (strcmp(hello.token, env->token) != 0) {
            fprintf(stderr, "[dshim-ps scheduler] refused %s (pid %d on host %s): its DSHIM_JOB_TOKEN differs from "
                    "the scheduler's (a process of another job?)\n", dshim_ps_role_name((dshim_ps_role_t)hello.role),
                    hello.pid, hello.host);
            close(fd);
            continue;
        }
        if ((hello.role == DSHIM_PS_SERVER && nserv == env->num_servers) ||
            (hello.role == DSHIM_PS_WORKER && nwork == env->num_workers) ||
            (hello.role != DSHIM_PS_SERVER && hello.role != DSHIM_PS_WORKER)) {
            fprintf(stderr, "[dshim-ps scheduler] refused an extra %s (pid %d on host %s): the job has %d workers "
                    "and %d servers\n", dshim_ps_role_name((dshim_ps_role_t)hello.role), hello.pid, hello.host,
                    env->num_workers, env->num_servers);
            close(fd);
            continue;
        }
        sched_node_t *n = &nodes[got++];
        n->fd = fd;
        n->hello = hello;
        n->rank = hello.role == DSHIM_PS_SERVER ? nserv++ : nwork++;
        DSHIM_PS_INFO(env, -1, "registered %s %d: pid %d on host %s", dshim_ps_role_name((dshim_ps_role_t)hello.role),
                      n->rank, hello.pid, hello.host);
    }
    /* ranks within a role follow the launcher's DMLC_TASK_ID when every node has one
     * (dshim-run's [worker i] is then kv.rank i), else the order of arrival */
    for (int role = DSHIM_PS_WORKER; role <= DSHIM_PS_SERVER; role++) {
        int all_hinted = 1;
        for (int i = 0; i < total; i++) {
            all_hinted &= nodes[i].hello.role != role || nodes[i].hello.hint >= 0;
        }
        for (int i = 0; all_hinted && i < total; i++) {
            if (nodes[i].hello.role != role) {
                continue;
            }
            int r = 0;
            for (int j = 0; j < total; j++) {
                r += nodes[j].hello.role == role && (nodes[j].hello.hint < nodes[i].hello.hint ||
                                                     (nodes[j].hello.hint == nodes[i].hello.hint && j < i));
            }
            nodes[i].rank = r;
        }
    }
    /* assignment: rank + every server's address */
    size_t len = sizeof(dshim_ps_assign_t) + sizeof(dshim_ps_hello_t) * (size_t)env->num_servers;
    char *buf = calloc(1, len);
    if (buf == NULL) {
        return dshim_error(DSHIM_ERR_NOMEM, "scheduler: out of memory");
    }
    dshim_ps_assign_t *as = (dshim_ps_assign_t *)buf;
    dshim_ps_hello_t *servers = (dshim_ps_hello_t *)(buf + sizeof(*as));
    as->num_workers = env->num_workers;
    as->num_servers = env->num_servers;
    for (int i = 0; i < total; i++) {
        if (nodes[i].hello.role == DSHIM_PS_SERVER) {
            servers[nodes[i].rank] = nodes[i].hello;
        }
    }
    for (int i = 0; i < total; i++) {
        as->rank = nodes[i].rank;
        dshim_ps_hdr_t h;
        dshim_ps_hdr_init(&h, DSHIM_PS_MSG_ASSIGN, 0, len);
        dshim_ps_send(nodes[i].fd, &h, buf, dshim_now() + DSHIM_PS_CONTROL_S);
    }
    free(buf);
    DSHIM_PS_INFO(env, -1, "all %d workers and %d servers registered", env->num_workers, env->num_servers);
    return DSHIM_OK;
}

/* A barrier of one group under way (stall lines and the flight recorder's
 * "ps/scheduler" ring: an entry per barrier, waiting_for = the ranks of the
 * role that is missing, workers first). */
typedef struct sched_barrier {
    int open;
    unsigned long number; /* of this group's barriers, from 1 */
    uint64_t trace_id;
    int trace_waiting;
    double t_last; /* the last arrival */
    double t_open; /* the first arrival */
} sched_barrier_t;

typedef struct sched_watch {
    dshim_trace_ring_t *ring;
    sched_barrier_t barriers[8]; /* by group bits */
    double next_check, t_warned;
    double next_alive; /* the next WAITING to the nodes in an open barrier */
} sched_watch_t;

static const char *group_words(int group)
{
    switch (group) {
    case DSHIM_PS_GROUP_WORKERS: return "workers";
    case DSHIM_PS_GROUP_SERVERS: return "servers";
    case DSHIM_PS_GROUP_ALL: return "all";
    default: return "some";
    }
}

static void watch_arrive(sched_watch_t *w, int group)
{
    sched_barrier_t *b = &w->barriers[group & 7];
    if (!b->open) {
        b->open = 1;
        b->number++;
        b->t_open = dshim_now();
        if (w->ring != NULL) {
            char label[DSHIM_TRACE_LABEL_LEN];
            snprintf(label, sizeof(label), "MXNet barrier (%s)", group_words(group));
            dshim_trace_label(label);
            dshim_trace_op_t op = {.op = "barrier", .dtype = -1, .redop = -1, .root = -1, .peer = -1};
            b->trace_id = dshim_trace_queued(w->ring, &op);
            dshim_trace_started(w->ring, b->trace_id, b->number, NULL, "tcp");
        }
    } else if (b->trace_waiting) {
        b->trace_waiting = 0;
        dshim_trace_moving(w->ring, b->trace_id);
    }
    b->t_last = dshim_now();
}

static void watch_done(sched_watch_t *w, int group)
{
    sched_barrier_t *b = &w->barriers[group & 7];
    if (b->open) {
        b->open = 0;
        b->trace_waiting = 0;
        dshim_trace_done(w->ring, b->trace_id, 1);
    }
}

/* The members of `group` of `role` that have (arrived = 1) or have not
 * reached its barrier: "0,1" into out; returns how many (ranks too, up to max). */
static int barrier_members(const sched_node_t *nodes, int total, int group, int role, int arrived, int *ranks,
                           int max, char *out, size_t len)
{
    int n = 0;
    size_t at = 0;
    out[0] = '\0';
    for (int i = 0; i < total; i++) {
        const sched_node_t *x = &nodes[i];
        if ((int)x->hello.role != role || ((x->barrier_group == group) != arrived)) {
            continue;
        }
        if (ranks != NULL && n < max) {
            ranks[n] = x->rank;
        }
        if (at + 16 < len) {
            at += (size_t)snprintf(out + at, len - at, "%s%d", n ? "," : "", x->rank);
        }
        n++;
    }
    return n;
}

/* Every loop pass: barriers nobody reached for a while are marked waiting and
 * said after DSHIM_STALL_WARN (the nodes time out on their own). */
static void watch_check(sched_watch_t *w, const dshim_ps_env_t *env, const sched_node_t *nodes, int total)
{
    const double now = dshim_now();
    if (now < w->next_check) {
        return;
    }
    w->next_check = now + 0.25;
    for (int g = 1; g < 8; g++) {
        sched_barrier_t *b = &w->barriers[g];
        if (!b->open || now - b->t_last < 1.0) {
            continue;
        }
        /* the missing role: workers first */
        int role = (g & DSHIM_PS_GROUP_WORKERS) ? DSHIM_PS_WORKER : DSHIM_PS_SERVER;
        int ranks[DSHIM_TRACE_WAIT_MAX];
        char missing[160], arrived[160];
        int nm = barrier_members(nodes, total, g, role, 0, ranks, DSHIM_TRACE_WAIT_MAX, missing, sizeof(missing));
        if (nm == 0 && (g & DSHIM_PS_GROUP_SERVERS)) {
            role = DSHIM_PS_SERVER;
            nm = barrier_members(nodes, total, g, role, 0, ranks, DSHIM_TRACE_WAIT_MAX, missing, sizeof(missing));
        }
        int na = barrier_members(nodes, total, g, role, 1, NULL, 0, arrived, sizeof(arrived));
        if (w->ring != NULL && !b->trace_waiting) {
            dshim_trace_waiting(w->ring, b->trace_id, ranks, nm < DSHIM_TRACE_WAIT_MAX ? nm : DSHIM_TRACE_WAIT_MAX);
            b->trace_waiting = 1;
        }
        if (env->stall_warn_s > 0 && now - b->t_last >= env->stall_warn_s && now - w->t_warned >= env->stall_warn_s) {
            w->t_warned = now;
            const char *rn = dshim_ps_role_name((dshim_ps_role_t)role);
            DSHIM_PS_WARN(env, -1, "stall: barrier #%lu over %s waits for %s%s %s (arrived: %s%s%s%s) for %.1f s; "
                          "the nodes in it fail after DSHIM_TIMEOUT=%g s", b->number, group_words(g), rn,
                          nm == 1 ? "" : "s", missing, na == 0 ? "no " : "", rn, na > 1 ? "s " : na == 1 ? " " : "",
                          arrived, now - b->t_last, env->timeout_s);
        }
    }
}

/* While a barrier is open, its nodes hear WAITING every
 * dshim_ps_alive_every: a node times out only a silent scheduler, so the
 * barrier's deadline stays the scheduler's (barrier_expired), which names
 * who did not reach it (ps.h). */
static void say_waiting(sched_watch_t *w, const dshim_ps_env_t *env, const sched_node_t *nodes, int total)
{
    const double now = dshim_now();
    int open = 0;
    for (int g = 1; g < 8 && !open; g++) {
        open = w->barriers[g].open;
    }
    if (!open || now < w->next_alive) {
        return;
    }
    w->next_alive = now + dshim_ps_alive_every(env);
    dshim_ps_hdr_t h;
    dshim_ps_hdr_init(&h, DSHIM_PS_MSG_WAITING, 0, 0);
    for (int i = 0; i < total; i++) {
        if (nodes[i].barrier_group != 0 && nodes[i].fd >= 0 && !nodes[i].bye) {
            dshim_ps_send(nodes[i].fd, &h, NULL, now + DSHIM_PS_FAREWELL_S);
        }
    }
}

/* A barrier open for DSHIM_TIMEOUT: the nodes in it give up now, each with
 * "barrier timed out", and the one that leaves first would be announced as
 * dead.  The scheduler knows who is missing: it says so to everyone (a
 * stopped or stuck process, or one that ran fewer steps), which fails the
 * job with the right name.  Returns 1 with the text and the group of the
 * first missing node's role. */
static int barrier_expired(const sched_watch_t *w, const dshim_ps_env_t *env, const sched_node_t *nodes, int total,
                           char *text, size_t len, int *group_p)
{
    const double now = dshim_now();
    for (int g = 1; g < 8; g++) {
        const sched_barrier_t *b = &w->barriers[g];
        if (!b->open || !dshim_ps_timed_out(env, b->t_open, now)) {
            continue;
        }
        char who[400] = "", arrived[160];
        size_t at = 0;
        int nm = 0;
        const sched_node_t *first = NULL;
        for (int pass = 0; pass < 2; pass++) { /* workers first */
            int role = pass == 0 ? DSHIM_PS_WORKER : DSHIM_PS_SERVER;
            int bit = pass == 0 ? DSHIM_PS_GROUP_WORKERS : DSHIM_PS_GROUP_SERVERS;
            for (int i = 0; i < total && (g & bit); i++) {
                const sched_node_t *x = &nodes[i];
                if ((int)x->hello.role != role || x->barrier_group == g || x->bye) {
                    continue;
                }
                first = first != NULL ? first : x;
                if (nm < 4 && at + 8 < sizeof(who)) {
                    char one[160];
                    describe(x, one, sizeof(one));
                    at += (size_t)snprintf(who + at, sizeof(who) - at, "%s%s", nm ? ", " : "", one);
                } else if (nm == 4 && at + 8 < sizeof(who)) {
                    at += (size_t)snprintf(who + at, sizeof(who) - at, ", ...");
                }
                nm++;
            }
        }
        if (first == NULL) {
            continue;
        }
        int na = 0;
        size_t aat = 0;
        arrived[0] = '\0';
        for (int i = 0; i < total; i++) {
            if (nodes[i].barrier_group == g && aat + 24 < sizeof(arrived)) {
                aat += (size_t)snprintf(arrived + aat, sizeof(arrived) - aat, "%s%s %d", na++ ? ", " : "",
                                        dshim_ps_role_name((dshim_ps_role_t)nodes[i].hello.role), nodes[i].rank);
            }
        }
        snprintf(text, len, "%s did not reach barrier #%lu over %s within %g s (DSHIM_TIMEOUT; arrived: %s): %s "
                 "stopped or stuck, or ran fewer steps than the others; the job cannot go on", who, b->number,
                 group_words(g), env->timeout_s, na ? arrived : "none", nm == 1 ? "it is" : "they are");
        *group_p = group_of(first);
        return 1;
    }
    return 0;
}

static int group_size(const dshim_ps_env_t *env, int group)
{
    return ((group & DSHIM_PS_GROUP_SERVERS) ? env->num_servers : 0) +
           ((group & DSHIM_PS_GROUP_WORKERS) ? env->num_workers : 0);
}

static void barrier_arrive(const dshim_ps_env_t *env, sched_node_t *nodes, int total, sched_node_t *n, int group,
                           sched_watch_t *w)
{
    n->barrier_group = group;
    watch_arrive(w, group);
    int count = 0;
    for (int i = 0; i < total; i++) {
        count += nodes[i].barrier_group == group;
    }
    DSHIM_PS_TRACE(env, -1, "barrier group %d: %d of %d", group, count, group_size(env, group));
    if (count < group_size(env, group)) {
        return;
    }
    dshim_ps_hdr_t h;
    dshim_ps_hdr_init(&h, DSHIM_PS_MSG_BARRIER_DONE, group, 0);
    for (int i = 0; i < total; i++) {
        if (nodes[i].barrier_group == group) {
            nodes[i].barrier_group = 0;
            dshim_ps_send(nodes[i].fd, &h, NULL, dshim_now() + DSHIM_PS_CONTROL_S);
        }
    }
    watch_done(w, group);
    DSHIM_PS_INFO(env, -1, "barrier group %d done", group);
}

/* Every worker said goodbye: servers still serving were never sent kStopServer
 * (SetBarrierBeforeExit(0)); tell them to end instead of waiting forever. */
static void stop_servers_if_workers_left(const dshim_ps_env_t *env, sched_node_t *nodes, int total)
{
    for (int i = 0; i < total; i++) {
        if (nodes[i].hello.role == DSHIM_PS_WORKER && !nodes[i].bye) {
            return;
        }
    }
    dshim_ps_hdr_t h;
    dshim_ps_hdr_init(&h, DSHIM_PS_MSG_STOP, 0, 0);
    for (int i = 0; i < total; i++) {
        if (nodes[i].hello.role == DSHIM_PS_SERVER && !nodes[i].bye) {
            dshim_ps_send(nodes[i].fd, &h, NULL, dshim_now() + DSHIM_PS_CONTROL_S);
        }
    }
    DSHIM_PS_INFO(env, -1, "every worker left: servers told to stop");
}

/* A connection after every node registered: refused (a restarted node
 * cannot rejoin a running job).  Out of descriptors, *lfd_open = 0. */
static void refuse_latecomer(int lfd, int *lfd_open)
{
    int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0 && dshim_net_out_of_fds(errno, "the parameter-server scheduler cannot accept a connection")) {
        /* a latecomer is refused anyway (its connect fails when the
         * scheduler exits); stop polling a listener that would stay
         * readable and spin this loop */
        fprintf(stderr, "[dshim-ps scheduler] %s; no longer refusing latecomers\n", dshim_last_error());
        *lfd_open = 0;
    }
    if (fd >= 0) {
        fprintf(stderr, "[dshim-ps scheduler] refused a connection after all nodes registered (a restarted "
                "node cannot rejoin a running job)\n");
        close(fd);
    }
}

/* One message from node n: a barrier arrival, a goodbye (*byes counts
 * them), its own failure or its death, which end the job for everyone. */
static dshim_status_t on_message(const dshim_ps_env_t *env, sched_node_t *nodes, int total, sched_node_t *n,
                                 sched_watch_t *watch, int *byes)
{
    dshim_ps_hdr_t h;
    dshim_status_t r = dshim_ps_recv_hdr(n->fd, &h, dshim_now() + DSHIM_PS_CONTROL_S);
    if (r != DSHIM_OK) {
        announce_end(env, nodes, total, n, "died",
                     "its connection to the scheduler closed without a goodbye (the process crashed, was "
                     "killed or exited before the kvstore was freed)", NULL, 0);
        char who[160];
        describe(n, who, sizeof(who));
        dshim_status_t st = dshim_error(DSHIM_ERR_PEER, "dshim ps scheduler: %s died", who);
        if (watch->ring != NULL) {
            dshim_trace_dump_all("peer", dshim_last_error());
        }
        return st;
    }
    DSHIM_PS_TRACE(env, -1, "%s from %s %d", dshim_ps_msg_name(h.type),
                   dshim_ps_role_name((dshim_ps_role_t)n->hello.role), n->rank);
    if (h.type == DSHIM_PS_MSG_FAIL) {
        /* its own error ends the job: everyone hears the cause, not a death */
        char why[448] = "";
        size_t k = h.len < 440 ? h.len : 440;
        if (dshim_ps_recv_body(n->fd, why, k, dshim_now() + DSHIM_PS_CONTROL_S) != DSHIM_OK) {
            why[0] = '\0';
        }
        why[k] = '\0';
        char text[448];
        announce_end(env, nodes, total, n, "ended with an error", why, text, sizeof(text));
        dshim_status_t st = dshim_error(DSHIM_ERR_PEER, "dshim ps scheduler: %s", text);
        if (watch->ring != NULL) {
            dshim_trace_dump_all("peer", dshim_last_error());
        }
        return st;
    }
    if (h.type == DSHIM_PS_MSG_BARRIER) {
        barrier_arrive(env, nodes, total, n, h.key, watch);
    } else if (h.type == DSHIM_PS_MSG_BYE) {
        n->bye = 1;
        (*byes)++;
        stop_servers_if_workers_left(env, nodes, total);
    } else {
        dshim_ps_skip_body(n->fd, h.len, dshim_now() + DSHIM_PS_CONTROL_S);
    }
    return DSHIM_OK;
}

/* A barrier past the timeout ends the job: every node still connected (the
 * missing ones too: one that only sleeps learns why) is told the cause. */
static dshim_status_t end_expired_barrier(const dshim_ps_env_t *env, sched_node_t *nodes, int total,
                                          sched_watch_t *watch)
{
    char text[448];
    int group = 0;
    if (!barrier_expired(watch, env, nodes, total, text, sizeof(text), &group)) {
        return DSHIM_OK;
    }
    fprintf(stderr, "[dshim-ps scheduler] %s\n", text);
    dshim_ps_hdr_t h;
    dshim_ps_hdr_init(&h, DSHIM_PS_MSG_DEAD, group, strlen(text));
    for (int i = 0; i < total; i++) {
        if (nodes[i].fd >= 0 && !nodes[i].bye) {
            dshim_ps_send(nodes[i].fd, &h, text, dshim_now() + DSHIM_PS_FAREWELL_S);
        }
    }
    dshim_status_t st = dshim_error(DSHIM_ERR_TIMEOUT, "dshim ps scheduler: %s", text);
    if (watch->ring != NULL) {
        dshim_trace_dump_all("timeout", dshim_last_error());
    }
    return st;
}

dshim_status_t dshim_ps_scheduler_run(const dshim_ps_env_t *env)
{
    dshim_log_init(); /* DSHIM_DEBUG's level, before the first ps_log.h line */
    int lfd = -1;
    DSHIM_CHECK(sched_listen(env, &lfd));
    DSHIM_PS_INFO(env, -1, "listening on port %d for %d workers and %d servers", env->root_port, env->num_workers,
                  env->num_servers);
    int total = env->num_workers + env->num_servers;
    sched_node_t *nodes = calloc((size_t)total, sizeof(*nodes));
    struct pollfd *pfds = calloc((size_t)total + 1, sizeof(*pfds));
    if (nodes == NULL || pfds == NULL) {
        free(nodes);
        free(pfds);
        close(lfd);
        return dshim_error(DSHIM_ERR_NOMEM, "scheduler: out of memory");
    }
    for (int i = 0; i < total; i++) {
        nodes[i].fd = -1;
    }
    /* its ring ("ps/scheduler": the barriers) also gives it the flight
     * recorder's DSHIM_TRACE_SIGNAL handler, which dshim-run sends to every
     * process of a job it diagnoses */
    sched_watch_t watch;
    memset(&watch, 0, sizeof(watch));
    char desc[192];
    snprintf(desc, sizeof(desc), "MXNet scheduler (%d workers, %d servers): an entry per barrier; waiting_for = "
             "the missing workers' ranks, else the missing servers'", env->num_workers, env->num_servers);
    dshim_trace_ring_info_t info = {.name = "ps/scheduler", .desc = desc, .rank = 0, .size = 1};
    watch.ring = dshim_trace_open(&info);
    dshim_status_t st = registration(env, lfd, nodes, total);
    int byes = 0, lfd_open = 1;
    while (st == DSHIM_OK && byes < total) {
        for (int i = 0; i < total; i++) {
            pfds[i].fd = nodes[i].bye ? -1 : nodes[i].fd;
            pfds[i].events = POLLIN;
            pfds[i].revents = 0;
        }
        pfds[total].fd = lfd_open ? lfd : -1; /* latecomers are refused at once */
        pfds[total].events = POLLIN;
        pfds[total].revents = 0;
        /* woken at least as often as an open barrier's WAITING is due */
        if (poll(pfds, (nfds_t)total + 1, (int)(dshim_ps_alive_every(env) * 1000)) < 0 && errno != EINTR) {
            st = dshim_error(DSHIM_ERR_SYSTEM, "scheduler: poll: %s", strerror(errno));
            break;
        }
        if (pfds[total].revents & POLLIN) {
            refuse_latecomer(lfd, &lfd_open);
        }
        for (int i = 0; i < total && st == DSHIM_OK; i++) {
            if (!dshim_ps_conn_ready(&pfds[i])) {
                continue;
            }
            st = on_message(env, nodes, total, &nodes[i], &watch, &byes);
        }
        watch_check(&watch, env, nodes, total); /* barriers some node never reaches */
        say_waiting(&watch, env, nodes, total);
        if (st == DSHIM_OK) {
            st = end_expired_barrier(env, nodes, total, &watch);
        }
    }
    for (int i = 0; i < total; i++) {
        if (nodes[i].fd >= 0) {
            close(nodes[i].fd);
        }
    }
    dshim_trace_close(watch.ring);
    close(lfd);
    free(nodes);
    free(pfds);
    if (st == DSHIM_OK) {
        DSHIM_PS_INFO(env, -1, "every node finished");
    }
    return st;
}

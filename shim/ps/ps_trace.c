/* The parameter server's rounds, stalls and flight recorder (ps_trace.h):
 * a server's key rounds and who has not pushed them, a worker's requests and
 * which server has not answered them, as ring entries, stall warnings and
 * the timeout's one-line story. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dshim.h"
#include "log.h"
#include "net.h"
#include "ps_log.h"
#include "ps_proto.h"
#include "ps_server_impl.h"
#include "ps_trace.h"
#include "status.h"
#include "trace.h"

/* a round or request unanswered this long is "waiting" in its ring entry */
#define MARK_WAITING_S 1.0
/* how often the loops look for stalls */
#define CHECK_EVERY_S 0.25
/* how long the server's timeout verdict may take to reach one worker (a
 * stopped one must not hold back the others') */
#define VERDICT_SEND_S 1.0

/* a worker's pushes per (server, key): the round it contributes to */
typedef struct kc_slot {
    int server, key;
    int used;
    uint64_t pushes;
} kc_slot_t;

struct dshim_ps_wtrace {
    kc_slot_t *tab;
    size_t cap, n;
    double *heard; /* per server: when it last answered anything (receiver thread) */
    double next_check, t_warned;
};

static __thread int marking_init;

/* The bookkeeping's clock: stalls are counted in seconds, and the coarse
 * clock costs a fifth of CLOCK_MONOTONIC's on the message path (~10 ns). */
static double ps_clock(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* prefix, key in decimal, suffix: a ring entry's label (snprintf would cost
 * more than the rest of the record) */
static void label_key(char out[DSHIM_TRACE_LABEL_LEN], const char *prefix, int key, const char *suffix)
{
    char digits[12];
    int nd = 0;
    unsigned u = key < 0 ? 0u - (unsigned)key : (unsigned)key;
    do {
        digits[nd++] = (char)('0' + u % 10);
        u /= 10;
    } while (u != 0);
    size_t at = 0;
    for (const char *c = prefix; *c && at < DSHIM_TRACE_LABEL_LEN - 1; c++) {
        out[at++] = *c;
    }
    if (key < 0 && at < DSHIM_TRACE_LABEL_LEN - 1) {
        out[at++] = '-';
    }
    while (nd > 0 && at < DSHIM_TRACE_LABEL_LEN - 1) {
        out[at++] = digits[--nd];
    }
    for (const char *c = suffix; *c && at < DSHIM_TRACE_LABEL_LEN - 1; c++) {
        out[at++] = *c;
    }
    out[at] = '\0';
}

void dshim_ps_worker_mark_init(int on)
{
    marking_init = on;
}

static size_t kc_hash(int server, int key, size_t cap)
{
    uint64_t h = ((uint64_t)(uint32_t)key << 20) ^ (uint64_t)(uint32_t)server;
    h *= 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 32) & (cap - 1);
}

/* The count of (server, key); NULL when out of memory. */
static uint64_t *kc_get(struct dshim_ps_wtrace *w, int server, int key)
{
    if ((w->n + 1) * 2 > w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 256;
        kc_slot_t *t = calloc(cap, sizeof(*t));
        if (t == NULL) {
            return NULL;
        }
        for (size_t i = 0; i < w->cap; i++) {
            if (w->tab[i].used) {
                size_t j = kc_hash(w->tab[i].server, w->tab[i].key, cap);
                while (t[j].used) {
                    j = (j + 1) & (cap - 1);
                }
                t[j] = w->tab[i];
            }
        }
        free(w->tab);
        w->tab = t;
        w->cap = cap;
    }
    size_t j = kc_hash(server, key, w->cap);
    while (w->tab[j].used && (w->tab[j].server != server || w->tab[j].key != key)) {
        j = (j + 1) & (w->cap - 1);
    }
    if (!w->tab[j].used) {
        w->tab[j] = (kc_slot_t){.server = server, .key = key, .used = 1, .pushes = 0};
        w->n++;
    }
    return &w->tab[j].pushes;
}

static const char *group_name(int group)
{
    switch (group) {
    case DSHIM_PS_GROUP_WORKERS: return "workers";
    case DSHIM_PS_GROUP_SERVERS: return "servers";
    case DSHIM_PS_GROUP_ALL: return "all";
    default: return "some";
    }
}

void dshim_ps_trace_node_open(dshim_ps_node_t *node)
{
    const dshim_ps_env_t *env = &node->env;
    if (env->role == DSHIM_PS_SCHEDULER) {
        return;
    }
    if (env->role == DSHIM_PS_WORKER && node->wtrace == NULL) {
        struct dshim_ps_wtrace *w = calloc(1, sizeof(*w));
        if (w != NULL && (w->heard = calloc((size_t)env->num_servers, sizeof(double))) == NULL) {
            free(w);
            w = NULL;
        }
        if (w != NULL) {
            double now = ps_clock();
            for (int i = 0; i < env->num_servers; i++) {
                w->heard[i] = now;
            }
        }
        node->wtrace = w; /* NULL: out of memory, and dshim_ps_node_start fails */
    }
    char name[48], desc[160];
    int server = env->role == DSHIM_PS_SERVER;
    snprintf(name, sizeof(name), "ps/%s.%d", server ? "server" : "worker", node->rank);
    if (server) {
        snprintf(desc, sizeof(desc), "MXNet server %d of %d (%d workers): an entry per key and round; waiting_for = "
                 "worker ranks", node->rank, env->num_servers, env->num_workers);
    } else {
        snprintf(desc, sizeof(desc), "MXNet worker %d of %d (%d servers): pushes, pulls, barriers; peer and "
                 "waiting_for = server ranks", node->rank, env->num_workers, env->num_servers);
    }
    dshim_trace_ring_info_t info = {.name = name, .desc = desc, .rank = node->rank,
                                    .size = server ? env->num_servers : env->num_workers};
    node->trace = dshim_trace_open(&info);
}

void dshim_ps_trace_node_close(dshim_ps_node_t *node)
{
    dshim_trace_close(node->trace);
    node->trace = NULL;
    if (node->wtrace != NULL) {
        free(node->wtrace->tab);
        free(node->wtrace->heard);
        free(node->wtrace);
        node->wtrace = NULL;
    }
}

void dshim_ps_trace_node_failed(dshim_ps_node_t *node, const char *msg)
{
    if (node->trace == NULL) {
        return;
    }
    /* the scheduler's notices (a death, the scheduler lost), a server's or
     * this worker's timeout, or another refusal by a server */
    const char *reason = strstr(msg, "DSHIM_TIMEOUT") != NULL                                   ? "timeout"
                         : strstr(msg, " died") != NULL || strstr(msg, "lost the scheduler") != NULL ? "peer"
                                                                                                       : "failed";
    dshim_trace_dump_all(reason, msg);
}

uint64_t dshim_ps_trace_barrier_begin(dshim_ps_node_t *node, int group, unsigned long number)
{
    if (node->trace == NULL) {
        return DSHIM_PS_NO_TRACE;
    }
    char label[DSHIM_TRACE_LABEL_LEN];
    snprintf(label, sizeof(label), "MXNet barrier (%s)", group_name(group));
    dshim_trace_label(label);
    dshim_trace_op_t op = {.op = "barrier", .dtype = -1, .redop = -1, .root = -1, .peer = -1};
    uint64_t id = dshim_trace_queued(node->trace, &op);
    dshim_trace_started(node->trace, id, number, NULL, "tcp");
    return id;
}

void dshim_ps_trace_barrier_end(dshim_ps_node_t *node, uint64_t id, int ok)
{
    if (id != DSHIM_PS_NO_TRACE) {
        dshim_trace_done(node->trace, id, ok);
    }
}

/* --- worker ---------------------------------------------------------------- */

static const char *req_name(int what)
{
    switch (what) {
    case DSHIM_PS_REQ_PUSH: return "push";
    case DSHIM_PS_REQ_PUSHPULL: return "pushpull";
    case DSHIM_PS_REQ_INIT: return "init";
    case DSHIM_PS_REQ_PULL: return "pull";
    case DSHIM_PS_REQ_CMD: return "command";
    case DSHIM_PS_REQ_PUSH_ROWS: return "push";
    case DSHIM_PS_REQ_PULL_ROWS: return "pull";
    case DSHIM_PS_REQ_PIECES: return "pushpull";
    default: return "request";
    }
}

static int req_pushes(int what)
{
    return what == DSHIM_PS_REQ_PUSH || what == DSHIM_PS_REQ_PUSHPULL || what == DSHIM_PS_REQ_PUSH_ROWS ||
           what == DSHIM_PS_REQ_PIECES;
}

/* "pushpull of key 3 (round 5)" */
static void describe(const dshim_ps_pending_t *p, char *out, size_t len)
{
    const char *rows = p->what == DSHIM_PS_REQ_PUSH_ROWS || p->what == DSHIM_PS_REQ_PULL_ROWS ? " rows" : "";
    if (p->what == DSHIM_PS_REQ_CMD) {
        snprintf(out, len, "command %d", p->key);
    } else if (p->what == DSHIM_PS_REQ_INIT) {
        snprintf(out, len, "init of key %d", p->key);
    } else if (req_pushes(p->what)) {
        snprintf(out, len, "%s%s of key %d (round %" PRIu64 ")", req_name(p->what), rows, p->key, p->round);
    } else if (p->what == DSHIM_PS_REQ_PULL || p->what == DSHIM_PS_REQ_PULL_ROWS) {
        snprintf(out, len, "pull%s of key %d (after round %" PRIu64 ")", rows, p->key, p->round);
    } else {
        snprintf(out, len, "request");
    }
}

static void record(dshim_ps_node_t *node, int what, int server, int key, int dtype, uint64_t count, uint64_t bytes,
                   uint64_t round, uint64_t *id_p)
{
    static const char *const prefix[] = {
        [DSHIM_PS_REQ_OTHER] = "MXNet request ", [DSHIM_PS_REQ_PUSH] = "MXNet push key ",
        [DSHIM_PS_REQ_PUSHPULL] = "MXNet pushpull key ", [DSHIM_PS_REQ_INIT] = "MXNet init key ",
        [DSHIM_PS_REQ_PULL] = "MXNet pull key ", [DSHIM_PS_REQ_CMD] = "MXNet command ",
        [DSHIM_PS_REQ_PUSH_ROWS] = "MXNet push key ", [DSHIM_PS_REQ_PULL_ROWS] = "MXNet pull key ",
        [DSHIM_PS_REQ_PIECES] = "MXNet pushpull key "};
    char label[DSHIM_TRACE_LABEL_LEN];
    const char *rows = what == DSHIM_PS_REQ_PUSH_ROWS || what == DSHIM_PS_REQ_PULL_ROWS ? " (rows)" : "";
    label_key(label, what >= 0 && what <= DSHIM_PS_REQ_PIECES ? prefix[what] : prefix[0], key, rows);
    dshim_trace_label(label);
    dshim_trace_op_t op = {.op = what == DSHIM_PS_REQ_CMD ? "command" : req_pushes(what) || what == DSHIM_PS_REQ_INIT
                                                                          ? "push" : "pull",
                           .dtype = dshim_ps_dtype_to_dshim(dtype), .redop = req_pushes(what) ? DSHIM_SUM : -1,
                           .count = count, .bytes = bytes, .root = -1, .peer = server};
    *id_p = dshim_trace_queued(node->trace, &op);
    dshim_trace_started(node->trace, *id_p, round, NULL, "tcp");
}

void dshim_ps_wtrace_request(dshim_ps_node_t *node, dshim_ps_pending_t *p, int dtype, uint64_t count,
                             uint64_t bytes)
{
    p->trace_id = DSHIM_PS_NO_TRACE;
    p->trace_waiting = 0;
    p->round = 0;
    p->t_sent = ps_clock();
    struct dshim_ps_wtrace *w = node->wtrace;
    if (w == NULL) {
        return;
    }
    if (marking_init && (p->what == DSHIM_PS_REQ_PUSH || p->what == DSHIM_PS_REQ_PUSH_ROWS)) {
        p->what = DSHIM_PS_REQ_INIT;
    }
    if (p->what != DSHIM_PS_REQ_CMD && p->what != DSHIM_PS_REQ_INIT && p->what != DSHIM_PS_REQ_OTHER) {
        uint64_t *c = kc_get(w, p->server, p->key);
        if (c != NULL) {
            if (req_pushes(p->what) && p->what != DSHIM_PS_REQ_PIECES) {
                ++*c;
            }
            p->round = *c;
        }
    }
    if (node->trace != NULL && p->what != DSHIM_PS_REQ_PIECES) {
        record(node, p->what, p->server, p->key, dtype, count, bytes, p->round, &p->trace_id);
    }
}

uint64_t dshim_ps_wtrace_group(dshim_ps_node_t *node, int server, int key, int dtype, uint64_t count,
                               uint64_t bytes, uint64_t *round_p)
{
    uint64_t round = 0, id = DSHIM_PS_NO_TRACE;
    if (node->wtrace != NULL) {
        pthread_mutex_lock(&node->pend_mu);
        uint64_t *c = kc_get(node->wtrace, server, key);
        round = c != NULL ? ++*c : 0;
        pthread_mutex_unlock(&node->pend_mu);
    }
    if (node->trace != NULL) {
        record(node, DSHIM_PS_REQ_PUSHPULL, server, key, dtype, count, bytes, round, &id);
    }
    *round_p = round;
    return id;
}

void dshim_ps_wtrace_end(dshim_ps_node_t *node, uint64_t trace_id, int ok)
{
    if (trace_id != DSHIM_PS_NO_TRACE && node->trace != NULL) {
        dshim_trace_done(node->trace, trace_id, ok);
    }
}

void dshim_ps_wtrace_heard(dshim_ps_node_t *node, int server)
{
    if (node->wtrace != NULL) {
        node->wtrace->heard[server] = ps_clock();
    }
}

void dshim_ps_wtrace_oldest(dshim_ps_node_t *node, int server, char *out, size_t len)
{
    const dshim_ps_pending_t *o = NULL;
    for (size_t i = 0; i < node->npending; i++) {
        const dshim_ps_pending_t *p = node->pending[i];
        if ((server < 0 || p->server == server) && (o == NULL || p->t_sent < o->t_sent)) {
            o = p;
        }
    }
    out[0] = '\0';
    if (o != NULL) {
        describe(o, out, len);
    }
}

dshim_status_t dshim_ps_wtrace_check(dshim_ps_node_t *node)
{
    struct dshim_ps_wtrace *w = node->wtrace;
    if (w == NULL) {
        return DSHIM_OK;
    }
    const double now = ps_clock();
    if (now < w->next_check) {
        return DSHIM_OK;
    }
    w->next_check = now + CHECK_EVERY_S;
    const dshim_ps_env_t *env = &node->env;
    char what[160] = "", msg[640] = "";
    int server = -1, others = 0;
    double age = 0;
    pthread_mutex_lock(&node->pend_mu);
    const dshim_ps_pending_t *oldest = NULL, *dead = NULL;
    for (size_t i = 0; i < node->npending; i++) {
        dshim_ps_pending_t *p = node->pending[i];
        const double waited = now - p->t_sent;
        if (node->trace != NULL && p->trace_id != DSHIM_PS_NO_TRACE && !p->trace_waiting &&
            waited >= MARK_WAITING_S) {
            dshim_trace_waiting(node->trace, p->trace_id, &p->server, 1);
            p->trace_waiting = 1;
        }
        if (oldest == NULL || p->t_sent < oldest->t_sent) {
            oldest = p;
        }
        /* this worker's deadline: a server silent for the timeout.  A live
         * server whose round waits for another worker's push says WAITING
         * meanwhile, and that round's deadline is the server's (ps.h) */
        if (dshim_ps_timed_out(env, p->t_sent, now) && dshim_ps_timed_out(env, w->heard[p->server], now) &&
            (dead == NULL || p->t_sent < dead->t_sent)) {
            dead = p;
        }
    }
    const dshim_ps_pending_t *o = dead != NULL ? dead : oldest;
    if (o != NULL) {
        describe(o, what, sizeof(what));
        server = o->server;
        age = now - o->t_sent;
        others = (int)node->npending - 1;
    }
    pthread_mutex_unlock(&node->pend_mu);
    if (o == NULL) {
        return DSHIM_OK;
    }
    const dshim_ps_hello_t *srv = &node->servers[server];
    if (dead != NULL) {
        snprintf(msg, sizeof(msg), "worker %d: server %d (pid %d on host %s) did not answer within %g s "
                 "(DSHIM_TIMEOUT): no answer to its %s for %.0f s, and nothing else from it for %.0f s: the server "
                 "is stopped or stuck (a server that waits for a worker's push says so itself)", node->rank, server,
                 srv->pid, srv->host, env->timeout_s, what, age, now - w->heard[server]);
        return dshim_error_quiet(DSHIM_ERR_TIMEOUT, "%s", msg);
    }
    if (env->stall_warn_s > 0 && age >= env->stall_warn_s && now - w->t_warned >= env->stall_warn_s) {
        w->t_warned = now;
        DSHIM_PS_WARN(env, node->rank, "stall: worker %d's %s to server %d (host %s) has had no answer for %.0f s "
                      "(%d other requests outstanding): a server answers a round once every worker pushed the key, "
                      "and its own warning names who has not; this line comes every DSHIM_STALL_WARN=%g s",
                      node->rank, what, server, srv->host, age, others, env->stall_warn_s);
    }
    return DSHIM_OK;
}

/* --- server ---------------------------------------------------------------- */

void dshim_ps_srv_note_init(server_t *s, key_state_t *k, int worker)
{
    const double now = ps_clock();
    k->round = 0;
    if (s->last != NULL) {
        s->last[worker] = (last_push_t){.key = k->key, .round = 0, .t = now};
    }
    dshim_trace_ring_t *ring = s->node->trace;
    if (ring == NULL) {
        return;
    }
    char label[DSHIM_TRACE_LABEL_LEN];
    label_key(label, "MXNet init key ", k->key, "");
    dshim_trace_label(label);
    dshim_trace_op_t op = {.op = "push", .dtype = dshim_ps_dtype_to_dshim(k->dtype), .redop = -1, .count = k->n,
                           .bytes = k->n * dshim_ps_dtype_size(k->dtype), .root = -1, .peer = worker};
    uint64_t id = dshim_trace_queued(ring, &op);
    dshim_trace_started(ring, id, 0, "init", "tcp");
    dshim_trace_done(ring, id, 1);
}

void dshim_ps_srv_note_push(server_t *s, key_state_t *k, int worker)
{
    const double now = ps_clock();
    dshim_trace_ring_t *ring = s->node->trace;
    if (!k->round_open) {
        k->round_open = 1;
        k->round++;
        if (ring != NULL) {
            char label[DSHIM_TRACE_LABEL_LEN];
            label_key(label, "MXNet push key ", k->key, "");
            dshim_trace_label(label);
            dshim_trace_op_t op = {.op = "push", .dtype = dshim_ps_dtype_to_dshim(k->dtype), .redop = DSHIM_SUM,
                                   .count = k->n, .bytes = k->n * dshim_ps_dtype_size(k->dtype), .root = -1,
                                   .peer = -1};
            k->trace_id = dshim_trace_queued(ring, &op);
            dshim_trace_started(ring, k->trace_id, k->round, s->sync_mode ? "sync" : "async", "tcp");
        }
    } else if (k->trace_waiting) {
        k->trace_waiting = 0;
        dshim_trace_moving(ring, k->trace_id);
    }
    k->t_last = now;
    if (s->last != NULL) {
        s->last[worker] = (last_push_t){.key = k->key, .round = k->round, .t = now};
    }
}

void dshim_ps_srv_note_answered(server_t *s, key_state_t *k)
{
    if (!k->round_open) {
        return;
    }
    k->round_open = 0;
    k->trace_waiting = 0;
    dshim_trace_done(s->node->trace, k->trace_id, 1);
}

/* Per worker, what it pushed of k's open round: 0 nothing, 1 a part (some
 * pieces), 2 all of it. */
static void round_workers(const server_t *s, const key_state_t *k, unsigned char *state)
{
    const int nw = s->node->env.num_workers;
    memset(state, 0, (size_t)nw);
    for (int i = 0; i < k->nwaiters; i++) {
        state[k->waiters[i].worker] = 2;
    }
    if (k->npieces == 0 && k->pieces_done == 0) {
        return;
    }
    for (int w = 0; w < nw; w++) {
        if (state[w] == 2) {
            continue;
        }
        size_t covered = k->pieces_done; /* a complete piece has every worker's values */
        for (size_t j = 0; j < k->npieces; j++) {
            const piece_t *p = &k->pieces[j];
            for (int i = 0; i < p->npushed && !p->done; i++) {
                if (p->waiters[i].worker == w) {
                    covered += p->cnt;
                    break;
                }
            }
        }
        const last_push_t *l = s->last != NULL ? &s->last[w] : NULL;
        state[w] = covered >= k->n ? 2
                   : (covered > 0 || (l != NULL && l->t > 0 && l->key == k->key && l->round == k->round)) ? 1 : 0;
    }
}

/* "0,1,2" of the workers whose state is (or is not) 2; returns how many. */
static int list_workers(const unsigned char *state, int nw, int complete, char *out, size_t len)
{
    size_t at = 0;
    int n = 0;
    out[0] = '\0';
    for (int w = 0; w < nw; w++) {
        if ((state[w] == 2) != complete) {
            continue;
        }
        if (at + 16 < len) {
            at += (size_t)snprintf(out + at, len - at, "%s%d", n ? "," : "", w);
        } else if (at + 4 < len && out[at - 1] != '.') {
            at += (size_t)snprintf(out + at, len - at, ",...");
        }
        n++;
    }
    return n;
}

/* The one line: "server 1 (host h) waits for key 7 round 12 from worker 3
 * (pushed by workers 0,1,2); worker 3 last pushed key 6 round 12 to it 4.1 s
 * ago".  `more`: other keys waiting too. */
static void srv_story(const server_t *s, const key_state_t *k, double now, int more, char *out, size_t len)
{
    const int nw = s->node->env.num_workers;
    unsigned char *state = malloc((size_t)nw);
    if (state == NULL) {
        snprintf(out, len, "server %d (host %s) waits for key %d round %" PRIu64 " from a worker", s->node->rank,
                 dshim_log_hostname(), k->key, k->round);
        return;
    }
    round_workers(s, k, state);
    char missing[256], pushed[256];
    int nmissing = list_workers(state, nw, 0, missing, sizeof(missing));
    int npushed = list_workers(state, nw, 1, pushed, sizeof(pushed));
    size_t at = (size_t)snprintf(out, len, "server %d (host %s) waits for key %d round %" PRIu64 " from %s %s "
                                 "(pushed by %s%s%s)", s->node->rank, dshim_log_hostname(), k->key, k->round,
                                 nmissing == 1 ? "worker" : "workers", missing,
                                 npushed == 0 ? "no worker" : npushed == 1 ? "worker " : "workers ", pushed,
                                 k->npieces > 0 ? ", in pieces" : "");
    if (more > 0 && at < len) {
        at += (size_t)snprintf(out + at, len - at, " and for %d more key%s", more, more == 1 ? "" : "s");
    }
    int told = 0;
    for (int w = 0; w < nw && told < 4 && at < len; w++) {
        if (state[w] == 2) {
            continue;
        }
        told++;
        const last_push_t *l = s->last != NULL ? &s->last[w] : NULL;
        if (state[w] == 1) {
            at += (size_t)snprintf(out + at, len - at, "; worker %d pushed part of it, last %.1f s ago", w,
                                   l != NULL && l->t > 0 ? now - l->t : 0.0);
        } else if (l != NULL && l->t > 0) {
            at += (size_t)snprintf(out + at, len - at, "; worker %d last pushed key %d round %" PRIu64 " to it "
                                   "%.1f s ago", w, l->key, l->round, now - l->t);
        } else {
            at += (size_t)snprintf(out + at, len - at, "; worker %d has pushed nothing to it", w);
        }
    }
    free(state);
}

/* The workers that have not pushed k's round, for its ring entry. */
static void mark_waiting(server_t *s, key_state_t *k)
{
    const int nw = s->node->env.num_workers;
    unsigned char *state = malloc((size_t)nw);
    int ranks[DSHIM_TRACE_WAIT_MAX], n = 0;
    if (state != NULL) {
        round_workers(s, k, state);
        for (int w = 0; w < nw && n < DSHIM_TRACE_WAIT_MAX; w++) {
            if (state[w] != 2) {
                ranks[n++] = w;
            }
        }
        free(state);
    }
    dshim_trace_waiting(s->node->trace, k->trace_id, ranks, n);
    k->trace_waiting = 1;
}

/* While a round waits for pushes, every worker hears WAITING each
 * dshim_ps_alive_every: a worker times out a server only when it is silent
 * (dshim_ps_wtrace_check), so the round's deadline stays this server's,
 * whose verdict names the worker that did not push. */
static void say_waiting(server_t *s, double now)
{
    const dshim_ps_env_t *env = &s->node->env;
    const double every = dshim_ps_alive_every(env);
    if (now < s->next_alive) {
        return;
    }
    int waiting = 0;
    for (size_t i = 0; i < s->nkeys && !waiting; i++) {
        waiting = s->keys[i].round_open && now - s->keys[i].t_last >= every;
    }
    if (!waiting) {
        return;
    }
    s->next_alive = now + every;
    for (int w = 0; w < env->num_workers; w++) {
        dshim_ps_srv_say_waiting(s, w);
    }
}

dshim_status_t dshim_ps_srv_check_stalls(server_t *s)
{
    const double now = ps_clock();
    if (now < s->next_check) {
        return DSHIM_OK;
    }
    s->next_check = now + CHECK_EVERY_S;
    const dshim_ps_env_t *env = &s->node->env;
    double mark = MARK_WAITING_S;
    if (env->timeout_s > 0 && env->timeout_s < mark) {
        mark = env->timeout_s;
    }
    if (env->stall_warn_s > 0 && env->stall_warn_s < mark) {
        mark = env->stall_warn_s;
    }
    say_waiting(s, now);
    key_state_t *worst = NULL;
    int nwaiting = 0;
    for (size_t i = 0; i < s->nkeys; i++) {
        key_state_t *k = &s->keys[i];
        if (!k->round_open || now - k->t_last < mark) {
            continue;
        }
        nwaiting++;
        if (worst == NULL || k->t_last < worst->t_last) {
            worst = k;
        }
        if (s->node->trace != NULL && !k->trace_waiting) {
            mark_waiting(s, k);
        }
    }
    if (worst == NULL) {
        return DSHIM_OK;
    }
    const double idle = now - worst->t_last;
    const int timeout = dshim_ps_timed_out(env, worst->t_last, now);
    if (!timeout && !(env->stall_warn_s > 0 && idle >= env->stall_warn_s && now - s->t_warned >= env->stall_warn_s)) {
        return DSHIM_OK;
    }
    char story[1024];
    srv_story(s, worst, now, nwaiting - 1, story, sizeof(story));
    if (!timeout) {
        s->t_warned = now;
        DSHIM_PS_WARN(env, s->node->rank, "stall: %s; no push of key %d for %.1f s (said every DSHIM_STALL_WARN=%g "
                      "s; the job fails after DSHIM_TIMEOUT=%g s)", story, worst->key, idle, env->stall_warn_s,
                      env->timeout_s);
        return DSHIM_OK;
    }
    char text[1280];
    snprintf(text, sizeof(text), "%s; no push of key %d for %.1f s (DSHIM_TIMEOUT=%g s): the job ends", story,
             worst->key, idle, env->timeout_s);
    fprintf(stderr, "[dshim-ps server %d] timeout: %s\n", s->node->rank, text);
    fflush(stderr);
    dshim_trace_dump_all("timeout", text);
    /* every worker is told (an ERROR answer fails a worker whatever it was
     * waiting for): those waiting for the key, and the one that never pushed */
    dshim_ps_hdr_t h;
    dshim_ps_hdr_init(&h, DSHIM_PS_MSG_ERROR, 0, strlen(text));
    for (int w = 0; w < env->num_workers; w++) {
        if (s->worker_fds[w] >= 0 && dshim_ps_srv_flush(s, w, now + VERDICT_SEND_S) == DSHIM_OK) {
            dshim_ps_send(s->worker_fds[w], &h, text, now + VERDICT_SEND_S);
        }
    }
    return dshim_error_quiet(DSHIM_ERR_TIMEOUT, "%s", text);
}

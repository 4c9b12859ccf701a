/*
 * The rendezvous of the nodes' launchers in torchrun-style multi-node jobs
 * (one dshim-run per node, --node-rank R, no hostfile).  Before any rank
 * starts, every node posts what it was asked to run (its process count, its
 * --nnodes, --max-restarts, host) in node 0's store, and waits until every
 * node's record is there.  Then every node knows every node's process count,
 * so nodes with different --nproc-per-node get torchrun's world (the sum;
 * ranks by node rank, then local rank) instead of two ranks with one number.
 * What the nodes cannot reconcile is refused on every node with the same
 * line.  While waiting, a node says every few seconds who joined and who is
 * missing; past DSHIM_CONNECT_TIMEOUT (the one start-up wait) it fails.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "log.h"
#include "net.h"
#include "node_rdzv.h"
#include "status.h"
#include "store.h"

#define PROGRESS_EVERY_S 5.0

typedef struct {
    bool have;
    int nnodes, nproc, max_restarts;
    char host[128];
} node_rec_t;

static void key_of(char *key, size_t n, int attempt, const char *what)
{
    snprintf(key, n, "dshim-run/rdzv/%d/%s", attempt, what);
}

static void post_record(dshim_store_t *s, const run_opts_t *o, int attempt, const char *host)
{
    char key[96], val[256];
    char name[32];
    snprintf(name, sizeof(name), "node/%d", o->node_rank);
    key_of(key, sizeof(key), attempt, name);
    int n = snprintf(val, sizeof(val), "%d %d %d %.120s", o->nnodes, o->nproc_per_node, o->max_restarts, host);
    (void)dshim_store_set(s, key, val, (size_t)n);
}

static bool parse_record(const char *v, size_t len, node_rec_t *r)
{
    char buf[256];
    snprintf(buf, sizeof(buf), "%.*s", (int)(len < sizeof(buf) ? len : sizeof(buf) - 1), v);
    r->host[0] = '\0';
    if (sscanf(buf, "%d %d %d %127s", &r->nnodes, &r->nproc, &r->max_restarts, r->host) < 3) {
        return false;
    }
    r->have = true;
    return true;
}

/* "node 0 (host) 2, node 1 (host) 3": every known node's value of one setting. */
static void describe(char *out, size_t n, const node_rec_t *recs, int nrecs, int which)
{
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; i < nrecs && used < n; i++) {
        if (!recs[i].have) {
            continue;
        }
        int v = which == 0 ? recs[i].nnodes : recs[i].max_restarts;
        used += (size_t)snprintf(out + used, n - used, "%snode %d (%s) %d", used ? ", " : "", i, recs[i].host, v);
    }
}

/* The first disagreement among the records, as the one line every node prints; false if none. */
static bool disagreement(const node_rec_t *recs, int nrecs, char *msg, size_t n)
{
    static const char *const what[] = {"--nnodes", "--max-restarts"};
    for (int which = 0; which < 2; which++) {
        int first = -1;
        bool differ = false;
        for (int i = 0; i < nrecs; i++) {
            if (!recs[i].have) {
                continue;
            }
            int v = which == 0 ? recs[i].nnodes : recs[i].max_restarts;
            differ |= first >= 0 && v != first;
            first = first < 0 ? v : first;
        }
        if (differ) {
            char vals[1500];
            describe(vals, sizeof(vals), recs, nrecs, which);
            snprintf(msg, n, "the nodes disagree on %s: %s; start every node's dshim-run with the same %s",
                     what[which], vals, what[which]);
            return true;
        }
    }
    return false;
}

static int count_missing(const node_rec_t *recs, int nnodes, char *list, size_t n)
{
    int missing = 0;
    size_t used = 0;
    list[0] = '\0';
    for (int i = 0; i < nnodes; i++) {
        if (!recs[i].have) {
            if (used < n) {
                used += (size_t)snprintf(list + used, n - used, "%s%d", missing ? "," : "", i);
            }
            missing++;
        }
    }
    return missing;
}

static void joined_list(const node_rec_t *recs, int nnodes, char *list, size_t n)
{
    size_t used = 0;
    list[0] = '\0';
    for (int i = 0; i < nnodes && used < n; i++) {
        if (recs[i].have) {
            used += (size_t)snprintf(list + used, n - used, "%snode %d (%s, %d proc%s)", used ? ", " : "", i,
                                     recs[i].host, recs[i].nproc, recs[i].nproc == 1 ? "" : "s");
        }
    }
}

/* Refused: every node reads the same line; node 0's store stays a moment so that the others can. */
static void refuse(dshim_store_t *s, int attempt, bool node0, const char *msg)
{
    char key[96];
    key_of(key, sizeof(key), attempt, "refused");
    int won = 0;
    (void)dshim_store_set_if_absent(s, key, msg, strlen(msg), &won);
    if (node0) {
        usleep(1500 * 1000);
    }
    run_usage_error("%s", msg);
}

static bool read_refusal(dshim_store_t *s, int attempt, char *msg, size_t n)
{
    char key[96];
    key_of(key, sizeof(key), attempt, "refused");
    void *val = NULL;
    size_t len = 0;
    if (dshim_store_try_get(s, key, &val, &len) != DSHIM_OK) {
        return false;
    }
    snprintf(msg, n, "%.*s", (int)len, (char *)val);
    free(val);
    return true;
}

/* Connected to node 0's store, or NULL while it is not up yet (or another job's: exits 2). */
static dshim_store_t *try_connect(const run_plan_t *plan)
{
    dshim_store_t *s = NULL;
    dshim_status_t st = dshim_store_connect(plan->store_addr, plan->store_port, plan->token, 1.0, &s);
    if (st == DSHIM_ERR_PROTOCOL) {
        run_usage_error("node %d: node 0's rendezvous store at %s:%d refused this node (%s); every node's "
                        "dshim-run needs the same DSHIM_JOB_TOKEN or DSHIM_JOB_TOKEN_FILE secret and --rdzv-id", plan->node_rank,
                        plan->store_addr, plan->store_port, dshim_last_error());
    }
    return st == DSHIM_OK ? s : NULL;
}

void run_node_rendezvous(run_opts_t *o, run_plan_t *plan, int attempt, const char *host)
{
    bool node0 = o->node_rank == 0;
    if (node0 && plan->store_server == NULL) {
        int port = 0;
        if (dshim_store_server_start(plan->store_bind, plan->store_port, plan->token, &plan->store_server, &port) !=
            DSHIM_OK) {
            run_usage_error("node 0: cannot host the rendezvous store on port %d: %s", plan->store_port,
                            dshim_last_error());
        }
    }
    /* the one start-up wait: DSHIM_CONNECT_TIMEOUT, or torchrun's name for it, --rdzv-conf join_timeout */
    double limit = o->join_timeout_s > 0 ? o->join_timeout_s : dshim_config()->connect_timeout_s;
    const char *setting = o->join_timeout_s > 0 ? "--rdzv-conf join_timeout" : "DSHIM_CONNECT_TIMEOUT";
    double start = dshim_now(), next_say = start + PROGRESS_EVERY_S;
    int cap = o->nnodes > 65536 ? 65536 : o->nnodes;
    /* records of nodes beyond our --nnodes are read too: a node told a larger --nnodes says so */
    int nrecs = cap + 8;
    node_rec_t *recs = run_xmalloc((size_t)nrecs * sizeof(*recs));
    memset(recs, 0, (size_t)nrecs * sizeof(*recs));
    dshim_store_t *s = NULL;
    char msg[2048];
    /* node 0's store going away between attempts (--max-restarts) or not up yet is expected here and
     * handled below (connect again, the progress line, one error line): no WARN lines from the store */
    int level = dshim_log_level_current;
    dshim_log_level_current = DSHIM_LOG_NONE;
    for (;;) {
        double now = dshim_now();
        if (s == NULL && (s = try_connect(plan)) != NULL) {
            post_record(s, o, attempt, host);
        }
        char miss[512] = "";
        if (s != NULL) {
            if (read_refusal(s, attempt, msg, sizeof(msg))) {
                run_usage_error("%s", msg);
            }
            bool lost = false;
            for (int i = 0; i < nrecs && !lost; i++) {
                if (recs[i].have) {
                    continue;
                }
                char key[96], name[32];
                snprintf(name, sizeof(name), "node/%d", i);
                key_of(key, sizeof(key), attempt, name);
                void *val = NULL;
                size_t len = 0;
                dshim_status_t st = dshim_store_try_get(s, key, &val, &len);
                if (st == DSHIM_OK) {
                    parse_record(val, len, &recs[i]);
                    free(val);
                } else if (st != DSHIM_INPROGRESS) {
                    lost = true;  /* node 0's store restarted (a restart) or gone: connect again */
                }
            }
            if (lost) {
                /* the next round connects again and posts the record anew (after the wait below) */
                dshim_store_close(s);
                s = NULL;
                memset(recs, 0, (size_t)nrecs * sizeof(*recs));
            } else {
                if (disagreement(recs, nrecs, msg, sizeof(msg))) {
                    refuse(s, attempt, node0, msg);
                }
                if (count_missing(recs, cap, miss, sizeof(miss)) == 0) {
                    break;
                }
            }
        }
        if (now - start > limit) {
            if (s == NULL) {
                run_usage_error("node %d: node 0's dshim-run did not answer at %s:%d within %.0f s (%s); "
                                "start it with --node-rank 0 and this --master-addr/--master-port, or raise %s",
                                o->node_rank, plan->store_addr, plan->store_port, limit, setting, setting);
            }
            snprintf(msg, sizeof(msg), "node %d: node(s) %s did not join within %.0f s (%s); start "
                     "dshim-run on them with --nnodes %d and the same --master-addr/--master-port, or raise %s",
                     o->node_rank, miss, limit, setting, o->nnodes, setting);
            refuse(s, attempt, node0, msg);
        }
        if (now >= next_say) {
            next_say = now + PROGRESS_EVERY_S;
            if (s == NULL) {
                run_say("node %d: waiting for node 0's dshim-run at %s:%d (%.0f s of %.0f s, %s)",
                        o->node_rank, plan->store_addr, plan->store_port, now - start, limit, setting);
            } else {
                char joined[1024];
                joined_list(recs, cap, joined, sizeof(joined));
                /* a node with another job token is refused by the store: say so where it waits for it */
                uint64_t refused = plan->store_server ? dshim_store_server_rejected(plan->store_server) : 0;
                char also[160] = "";
                if (refused) {
                    snprintf(also, sizeof(also), "; %llu connection(s) refused for another job token "
                             "(DSHIM_JOB_TOKEN/DSHIM_JOB_TOKEN_FILE, --rdzv-id)", (unsigned long long)refused);
                }
                run_say("node %d: waiting for node(s) %s (%.0f s of %.0f s, %s); joined: %s%s",
                        o->node_rank, miss, now - start, limit, setting, joined, also);
            }
        }
        usleep(100 * 1000);
    }
    free(o->node_nprocs);
    o->node_nprocs = run_xmalloc((size_t)cap * sizeof(int));
    for (int i = 0; i < cap; i++) {
        o->node_nprocs[i] = recs[i].nproc;
    }
    free(recs);
    dshim_store_close(s);
    dshim_log_level_current = level;
}

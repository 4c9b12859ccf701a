/*
 * Unit tests of the topology (shim/comm/topo.c): from the peer records'
 * host ids, which ranks share a host, and the two sub-communicators a rank
 * joins when a job spans hosts and some host runs several ranks: `local`
 * (its host's ranks, the first one its leader) and `leaders` (the first
 * rank of every host, on those ranks only).  Ranks pretend to live on hosts
 * through DSHIM_HOST_ID, as the conformance matrix's --hosts runs do.
 *
 * Every case states by hand what each rank must see (the number of hosts,
 * its place in `local` and `leaders`, the job ranks the sub-communicators
 * carry, whether the barrier runs through the hierarchy), and then runs a
 * barrier and an allreduce through the hierarchy, so that sub-communicators
 * with the wrong members would also show as a hang or a wrong sum.
 */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "config.h"
#include "dshim.h"
#include "ranks.h"

#define MAX_N 4

typedef struct topo_case {
    int n;
    const char *host[MAX_N];   /* DSHIM_HOST_ID of each rank */
    const char *transport;     /* DSHIM_TRANSPORT */
    int nhosts;
    int hier;                  /* a hierarchy at all (local set on every rank) */
    int barrier_hier;
    /* per rank, when hier: local rank and size, the job ranks of local's
     * members, and its rank in leaders (-1: not a leader) */
    int local_rank[MAX_N], local_size[MAX_N];
    int local_members[MAX_N][MAX_N];
    int leader_rank[MAX_N];
    int leaders[MAX_N];        /* job ranks of the leaders, in order */
} topo_case_t;

#define FAIL(...)                                                                                                  \
    do {                                                                                                           \
        fprintf(stderr, "ERROR: rank %d: ", rank);                                                                 \
        fprintf(stderr, __VA_ARGS__);                                                                              \
        fprintf(stderr, "\n");                                                                                     \
        return 3;                                                                                                  \
    } while (0)

/* What one rank sees of its communicator against the case's table. */
static int check_shape(const topo_case_t *c, int rank, dshim_comm_t *comm)
{
    if (comm->nhosts != c->nhosts) {
        FAIL("%d hosts, not %d", comm->nhosts, c->nhosts);
    }
    if (comm->barrier_hier != c->barrier_hier) {
        FAIL("barrier_hier %d, not %d", comm->barrier_hier, c->barrier_hier);
    }
    if (!c->hier) {
        if (comm->local || comm->leaders) {
            FAIL("sub-communicators without a hierarchy (local %p, leaders %p)", (void *)comm->local,
                 (void *)comm->leaders);
        }
        return 0;
    }
    dshim_comm_t *l = comm->local;
    if (!l) {
        FAIL("no local sub-communicator");
    }
    if (l->rank != c->local_rank[rank] || l->size != c->local_size[rank]) {
        FAIL("local rank %d of %d, not %d of %d", l->rank, l->size, c->local_rank[rank], c->local_size[rank]);
    }
    for (int i = 0; i < l->size; i++) {
        if (!l->job_rank || l->job_rank[i] != c->local_members[rank][i]) {
            FAIL("local member %d is job rank %d, not %d", i, l->job_rank ? l->job_rank[i] : -1,
                 c->local_members[rank][i]);
        }
    }
    if (c->leader_rank[rank] < 0) {
        if (comm->leaders) {
            FAIL("in leaders, but not its host's first rank");
        }
        return 0;
    }
    dshim_comm_t *x = comm->leaders;
    if (!x || x->rank != c->leader_rank[rank] || x->size != c->nhosts) {
        FAIL("leaders rank %d of %d, not %d of %d", x ? x->rank : -1, x ? x->size : 0, c->leader_rank[rank],
             c->nhosts);
    }
    for (int i = 0; i < x->size; i++) {
        if (!x->job_rank || x->job_rank[i] != c->leaders[i]) {
            FAIL("leader %d is job rank %d, not %d", i, x->job_rank ? x->job_rank[i] : -1, c->leaders[i]);
        }
    }
    return 0;
}

static int body_topo(int rank, int size, int port, void *arg)
{
    const topo_case_t *c = arg;
    setenv("DSHIM_HOST_ID", c->host[rank], 1);
    dshim_config_reload();
    dshim_comm_t *comm;
    if (test_comm_init(rank, size, port, &comm)) {
        return 2;
    }
    int rc = check_shape(c, rank, comm);
    /* the hierarchy carries a barrier and an allreduce: wrong members would
     * hang (bounded by DSHIM_TIMEOUT) or sum the wrong ranks */
    int32_t v = rank + 1, sum = 0;
    if (rc == 0 && dshim_barrier(comm) != DSHIM_OK) {
        fprintf(stderr, "ERROR: rank %d: barrier: %s\n", rank, dshim_last_error());
        rc = 4;
    }
    if (rc == 0 && dshim_allreduce(comm, &v, &sum, 1, DSHIM_INT32, DSHIM_SUM) != DSHIM_OK) {
        fprintf(stderr, "ERROR: rank %d: allreduce: %s\n", rank, dshim_last_error());
        rc = 4;
    }
    if (rc == 0 && sum != size * (size + 1) / 2) {
        fprintf(stderr, "ERROR: rank %d: allreduce gave %d, not %d\n", rank, sum, size * (size + 1) / 2);
        rc = 5;
    }
    if (dshim_comm_destroy(comm) != DSHIM_OK && rc == 0) {
        fprintf(stderr, "ERROR: rank %d: destroy: %s\n", rank, dshim_last_error());
        rc = 6;
    }
    return rc;
}

static void run_case(const topo_case_t *c, const char *algo)
{
    char transport[64], algo_env[64];
    snprintf(transport, sizeof(transport), "DSHIM_TRANSPORT=%s", c->transport);
    snprintf(algo_env, sizeof(algo_env), "DSHIM_ALGO=%s", algo);
    const char *env[] = {transport, algo_env, "DSHIM_TIMEOUT=30", NULL};
    test_rank_result_t res[MAX_N];
    int rc = test_run_ranks(c->n, body_topo, (void *)c, env, 60.0, res);
    int ok = rc == 0;
    for (int r = 0; r < c->n; r++) {
        ok = ok && res[r].exited && res[r].code == 0;
    }
    if (!ok) {
        for (int r = 0; r < c->n; r++) {
            fprintf(stderr, "--- rank %d (exited %d, code %d):\n%s\n", r, res[r].exited, res[r].code, res[r].err);
        }
    }
    ck_assert_msg(ok, "every rank must see the topology of the table (stderr above)");
}

/* Two hosts, interleaved: ranks 0, 2 on a and 1, 3 on b.  Hosts are
 * numbered by their first rank, and each host's members in job order. */
START_TEST(test_two_hosts_interleaved)
{
    static const topo_case_t c = {
        .n = 4, .host = {"a", "b", "a", "b"}, .transport = "auto", .nhosts = 2, .hier = 1, .barrier_hier = 1,
        .local_rank = {0, 0, 1, 1}, .local_size = {2, 2, 2, 2},
        .local_members = {{0, 2}, {1, 3}, {0, 2}, {1, 3}},
        .leader_rank = {0, 1, -1, -1}, .leaders = {0, 1},
    };
    run_case(&c, "hier");
}
END_TEST

/* A host of one rank beside a host of two: the lone rank is its host's
 * leader in a local sub-communicator of size 1; the leaders are job ranks
 * 0 and 2, not 0 and 1. */
START_TEST(test_lone_rank_host)
{
    static const topo_case_t c = {
        .n = 3, .host = {"a", "a", "b"}, .transport = "auto", .nhosts = 2, .hier = 1, .barrier_hier = 1,
        .local_rank = {0, 1, 0}, .local_size = {2, 2, 1},
        .local_members = {{0, 1}, {0, 1}, {2}},
        .leader_rank = {0, -1, 1}, .leaders = {0, 2},
    };
    run_case(&c, "hier");
}
END_TEST

/* The same hosts over sockets only: the hierarchy is there (allreduces
 * use it), but no host gate, so the barrier stays flat. */
START_TEST(test_sockets_only_no_hier_barrier)
{
    static const topo_case_t c = {
        .n = 3, .host = {"b", "a", "b"}, .transport = "tcp", .nhosts = 2, .hier = 1, .barrier_hier = 0,
        .local_rank = {0, 0, 1}, .local_size = {2, 1, 2},
        .local_members = {{0, 2}, {1}, {0, 2}},
        .leader_rank = {0, 1, -1}, .leaders = {0, 1},
    };
    run_case(&c, "hier");
}
END_TEST

/* One host: nothing to build. */
START_TEST(test_one_host)
{
    static const topo_case_t c = {.n = 3, .host = {"a", "a", "a"}, .transport = "auto", .nhosts = 1};
    run_case(&c, "auto");
}
END_TEST

/* Every rank on a host of its own: a hierarchy would only add steps. */
START_TEST(test_every_rank_its_own_host)
{
    static const topo_case_t c = {.n = 3, .host = {"a", "b", "c"}, .transport = "auto", .nhosts = 3};
    run_case(&c, "auto");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("topo");
    TCase *tc = tcase_create("hosts");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_two_hosts_interleaved);
    tcase_add_test(tc, test_lone_rank_host);
    tcase_add_test(tc, test_sockets_only_no_hier_barrier);
    tcase_add_test(tc, test_one_host);
    tcase_add_test(tc, test_every_rank_its_own_host);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

/*
 * Unit tests of auto's allreduce choice (shim/comm/coll.h), the one place
 * that decides which algorithm runs a request: the rules that
 * docs/architecture.md's algorithm table states, on communicators made up
 * here (one host, ranks outnumbering cores unless said otherwise), so that a
 * change of a threshold shows up as a failing line rather than as a slower
 * benchmark.
 */
#include <check.h>
#include <stdlib.h>

#include "comm.h"
#include "coll.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)

/* n ranks on one host, more ranks than cores; sockets: every pair talks TCP */
static dshim_comm_t make_comm(int n, int sockets)
{
    dshim_comm_t c = {0};
    c.size = n;
    c.nhosts = 1;
    c.spin_yields = 1;
    c.sockets_only = sockets;
    c.small_msg_bytes = 64 * KIB;
    c.algo = DSHIM_ALGO_AUTO;
    c.gate_transport = -1;        /* no host gate: message algorithms only */
    c.single_copy_transport = -1; /* no single copies either */
    return c;
}

static dshim_ar_choice_t choice_of(const dshim_comm_t *c, size_t bytes, int in_place)
{
    static float a, b;
    dshim_request_t req = {0};
    req.dtype = DSHIM_FLOAT32;
    req.count = bytes / 4;
    req.sbuf = &a;
    req.rbuf = in_place ? &a : &b;
    return dshim_allreduce_choice(c, &req);
}

static dshim_ar_choice_t choice(const dshim_comm_t *c, size_t bytes)
{
    return choice_of(c, bytes, 0);
}

START_TEST(test_sockets_power_of_two_halving)
{
    /* N = 4 and 8 over sockets: Rabenseifner's wherever direct would run */
    dshim_comm_t c4 = make_comm(4, 1);
    ck_assert_int_eq(choice(&c4, 4 * KIB), DSHIM_AR_RD);
    ck_assert_int_eq(choice(&c4, 16 * KIB), DSHIM_AR_RD);
    ck_assert_int_eq(choice(&c4, 32 * KIB), DSHIM_AR_RABENSEIFNER);
    ck_assert_int_eq(choice(&c4, 1 * MIB), DSHIM_AR_RABENSEIFNER);
    ck_assert_int_eq(choice(&c4, 64 * MIB), DSHIM_AR_RABENSEIFNER);
    dshim_comm_t c8 = make_comm(8, 1);
    ck_assert_int_eq(choice(&c8, 64 * KIB), DSHIM_AR_RABENSEIFNER);
    ck_assert_int_eq(choice(&c8, 192 * KIB), DSHIM_AR_RABENSEIFNER);
    ck_assert_int_eq(choice(&c8, 1 * MIB), DSHIM_AR_RING);
}
END_TEST

START_TEST(test_sockets_three_ranks_direct)
{
    /* N = 3: the fold of a non-power of two makes halving lose; direct stays */
    dshim_comm_t c = make_comm(3, 1);
    ck_assert_int_eq(choice(&c, 64 * KIB), DSHIM_AR_RD);
    ck_assert_int_eq(choice(&c, 256 * KIB), DSHIM_AR_DIRECT);
    ck_assert_int_eq(choice(&c, 64 * MIB), DSHIM_AR_DIRECT);
}
END_TEST

START_TEST(test_shared_memory_direct)
{
    /* a host-local transport (no gate here): direct up to its round's bytes */
    dshim_comm_t c = make_comm(4, 0);
    ck_assert_int_eq(choice(&c, 64 * KIB), DSHIM_AR_DIRECT);
    ck_assert_int_eq(choice(&c, 512 * KIB), DSHIM_AR_DIRECT);
    ck_assert_int_eq(choice(&c, 1 * MIB), DSHIM_AR_RING);
    dshim_comm_t c16 = make_comm(16, 0);
    ck_assert_int_eq(choice(&c16, 128 * KIB), DSHIM_AR_RABENSEIFNER);
    ck_assert_int_eq(choice(&c16, 1 * MIB), DSHIM_AR_RING);
}
END_TEST

START_TEST(test_core_per_rank)
{
    /* ranks do not outnumber cores: recursive doubling, then the ring */
    dshim_comm_t c = make_comm(4, 1);
    c.spin_yields = 0;
    ck_assert_int_eq(choice(&c, 64 * KIB), DSHIM_AR_RD);
    ck_assert_int_eq(choice(&c, 1 * MIB), DSHIM_AR_RING);
}
END_TEST

START_TEST(test_single_copy)
{
    /* a core per rank and a transport that reads and writes peers' memory:
     * single copies from 128 KiB, above 16 MiB only in place */
    dshim_comm_t c = make_comm(2, 0);
    c.spin_yields = 0;
    c.single_copy_transport = 0;
    ck_assert_int_eq(choice(&c, 64 * KIB), DSHIM_AR_RD);
    ck_assert_int_eq(choice(&c, 128 * KIB), DSHIM_AR_SINGLE_COPY);
    ck_assert_int_eq(choice(&c, 2 * MIB), DSHIM_AR_SINGLE_COPY);
    ck_assert_int_eq(choice(&c, 16 * MIB), DSHIM_AR_SINGLE_COPY);
    ck_assert_int_eq(choice(&c, 32 * MIB), DSHIM_AR_RING);
    ck_assert_int_eq(choice_of(&c, 32 * MIB, 1), DSHIM_AR_SINGLE_COPY);
    /* the first call's probe failed somewhere: messages from then on */
    c.single_copy = DSHIM_SINGLE_COPY_NO;
    ck_assert_int_eq(choice(&c, 4 * MIB), DSHIM_AR_RING);
    /* ranks outnumber cores: not here (the gate's, or the messages') */
    dshim_comm_t o = make_comm(4, 0);
    o.single_copy_transport = 0;
    ck_assert_int_eq(choice(&o, 4 * MIB), DSHIM_AR_RING);
    /* forced: at any size where it can run, auto's choice where it cannot */
    o.algo = DSHIM_ALGO_CMA;
    ck_assert_int_eq(choice(&o, 4 * KIB), DSHIM_AR_SINGLE_COPY);
    o.single_copy_transport = -1;
    ck_assert_int_eq(choice(&o, 64 * KIB), DSHIM_AR_DIRECT);
}
END_TEST

START_TEST(test_forced_algorithm)
{
    dshim_comm_t c = make_comm(4, 1);
    c.algo = DSHIM_ALGO_DIRECT;
    ck_assert_int_eq(choice(&c, 1 * MIB), DSHIM_AR_DIRECT);
    c.algo = DSHIM_ALGO_RING;
    ck_assert_int_eq(choice(&c, 1 * MIB), DSHIM_AR_RING);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("coll_choice");
    TCase *tc = tcase_create("allreduce");
    tcase_add_test(tc, test_sockets_power_of_two_halving);
    tcase_add_test(tc, test_sockets_three_ranks_direct);
    tcase_add_test(tc, test_shared_memory_direct);
    tcase_add_test(tc, test_core_per_rank);
    tcase_add_test(tc, test_single_copy);
    tcase_add_test(tc, test_forced_algorithm);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

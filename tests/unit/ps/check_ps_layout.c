/*
 * Key placement and shard sizes of dshim's parameter server (dshim_ps_layout in
 * shim/ps/ps_common.c) against MXNet 1.9.1's KVStoreDist::EncodeDefaultKey and
 * EncodeCompressedKey (src/kvstore/kvstore_dist.h), for hand-computed cases:
 * a key below the bound lives on server (key * 9973) % S; above it, part i has
 * round(n/S*(i+1)) - round(n/S*i) elements (round half away from zero); the
 * compressed layout splits whole 16-value words the same way and gives the
 * last server the rest.
 */
#include <check.h>
#include <stdlib.h>

#include "dshim.h"
#include "ps.h"

typedef struct {
    int key;
    size_t n;
    int servers;
    int server;
} small_case_t;

START_TEST(small_keys_on_one_server)
{
    static const small_case_t cases[] = {
        {0, 10, 2, 0}, {1, 10, 2, 1}, {3, 10, 3, 0}, {5, 999999, 4, 1}, {7, 1, 3, 1},
        {2, 100, 1, 0}, {11, 7, 5, (11 * 9973) % 5}, {200000, 5, 3, (int)((200000LL * 9973) % 3)},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        dshim_ps_part_t parts[8];
        int np = dshim_ps_layout(cases[i].key, cases[i].n, cases[i].servers, 1000000, 0, parts);
        ck_assert_int_eq(np, 1);
        ck_assert_int_eq(parts[0].server, cases[i].server);
        ck_assert_uint_eq(parts[0].offset, 0);
        ck_assert_uint_eq(parts[0].count, cases[i].n);
    }
}
END_TEST

START_TEST(big_keys_split_over_all_servers)
{
    dshim_ps_part_t parts[4];
    /* 1000001 over 3: round(333333.67)=333334, round(666667.33)=666667 */
    ck_assert_int_eq(dshim_ps_layout(4, 1000001, 3, 1000000, 0, parts), 3);
    ck_assert_uint_eq(parts[0].count, 333334);
    ck_assert_uint_eq(parts[1].offset, 333334);
    ck_assert_uint_eq(parts[1].count, 333333);
    ck_assert_uint_eq(parts[2].offset, 666667);
    ck_assert_uint_eq(parts[2].count, 333334);
    /* exactly the bound is split (MXNet: num_arr_elems < bound stays whole) */
    ck_assert_int_eq(dshim_ps_layout(0, 1000000, 2, 1000000, 0, parts), 2);
    ck_assert_uint_eq(parts[0].count, 500000);
    /* 10 over 4 with bound 5: round(2.5)=3, round(5)=5, round(7.5)=8 */
    ck_assert_int_eq(dshim_ps_layout(9, 10, 4, 5, 0, parts), 4);
    ck_assert_uint_eq(parts[0].count, 3);
    ck_assert_uint_eq(parts[1].count, 2);
    ck_assert_uint_eq(parts[2].count, 3);
    ck_assert_uint_eq(parts[3].count, 2);
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(parts[i].server, i);
    }
}
END_TEST

START_TEST(compressed_layout_splits_words)
{
    dshim_ps_part_t parts[3];
    /* 100 floats = 7 words over 3: round(7/3)=2, round(14/3)=5 -> 2, 3, rest 2 words;
     * elements 32, 48, rest 20 */
    ck_assert_int_eq(dshim_ps_layout(1, 100, 3, 5, 1, parts), 3);
    ck_assert_uint_eq(parts[0].woffset, 0);
    ck_assert_uint_eq(parts[0].wcount, 2);
    ck_assert_uint_eq(parts[0].count, 32);
    ck_assert_uint_eq(parts[1].woffset, 2);
    ck_assert_uint_eq(parts[1].wcount, 3);
    ck_assert_uint_eq(parts[1].offset, 32);
    ck_assert_uint_eq(parts[1].count, 48);
    ck_assert_uint_eq(parts[2].woffset, 5);
    ck_assert_uint_eq(parts[2].wcount, 2);
    ck_assert_uint_eq(parts[2].offset, 80);
    ck_assert_uint_eq(parts[2].count, 20);
    /* below the bound: one server, every word */
    ck_assert_int_eq(dshim_ps_layout(1, 100, 3, 1000, 1, parts), 1);
    ck_assert_int_eq(parts[0].server, 9973 % 3);
    ck_assert_uint_eq(parts[0].wcount, 7);
}
END_TEST

int main(void)
{
    Suite *su = suite_create("ps_layout");
    TCase *tc = tcase_create("layout");
    tcase_add_test(tc, small_keys_on_one_server);
    tcase_add_test(tc, big_keys_split_over_all_servers);
    tcase_add_test(tc, compressed_layout_splits_words);
    suite_add_tcase(su, tc);
    SRunner *sr = srunner_create(su);
    srunner_run_all(sr, CK_ENV);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

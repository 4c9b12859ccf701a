/* The environment table's parsers and params.def's "allowed" column: every
 * integer is range-checked (no silent wrap), choices and powers of two are
 * enforced, and dshim_comm_init_env refuses a bad value naming the variable,
 * the value and what is allowed. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap.h"
#include "ck_free_port.h"
#include "config.h"
#include "dshim.h"
#include "status.h"

/* Every variable a case sets: unset again after each case (and the config
 * reloaded), because under CK_FORK=no (valgrind) the cases share a process. */
static const char *const touched[] = {
    "DSHIM_SPIN_US", "DSHIM_CHUNK_SIZE", "DSHIM_SOCKET_BUFSIZE", "DSHIM_SHM_RING_SIZE", "DSHIM_TRANSPORT",
    "DSHIM_DEBUG", "DSHIM_ALGO", "DSHIM_NCCL_IPC_COLLS", "DSHIM_TIMEOUT", "DSHIM_SOCKET_CC", "LOCAL_RANK",
    "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "DSHIM_RANK", "DSHIM_WORLD_SIZE", "PMI_SIZE",
    "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "DSHIM_STORE_PORT", "MXNET_KVSTORE_BIGARRAY_BOUND", NULL};

static void reset_env(void)
{
    for (int i = 0; touched[i]; i++) {
        unsetenv(touched[i]);
    }
    dshim_config_reload();
}

/* check one value: 0 = accepted, else the message must hold each of must[] */
static void expect_bad(const char *name, const char *value, const char *must)
{
    setenv(name, value, 1);
    dshim_status_t st = dshim_config_check();
    ck_assert_msg(st == DSHIM_ERR_INVALID, "%s=%s was accepted", name, value);
    char both[256];
    snprintf(both, sizeof(both), "%s=%s: must be ", name, value);
    ck_assert_msg(strstr(dshim_last_error(), both), "'%s' not in: %s", both, dshim_last_error());
    ck_assert_msg(strstr(dshim_last_error(), must), "'%s' not in: %s", must, dshim_last_error());
    ck_assert_msg(!strchr(dshim_last_error(), '\n'), "not one line: %s", dshim_last_error());
    unsetenv(name);
}

static void expect_ok(const char *name, const char *value)
{
    setenv(name, value, 1);
    ck_assert_msg(dshim_config_check() == DSHIM_OK, "%s=%s refused: %s", name, value, dshim_last_error());
    unsetenv(name);
}

START_TEST(test_int_parse)
{
    expect_bad("DSHIM_SPIN_US", "99999999999", "an integer from 0 to 2147483647");
    expect_bad("DSHIM_SPIN_US", "-5", "an integer from 0 to 2147483647");
    expect_bad("DSHIM_SPIN_US", "12abc", "an integer from 0 to 2147483647");
    expect_bad("DSHIM_SPIN_US", "999999999999999999999999", "an integer");
    /* a row without a rule still has to fit an int: no silent wrap */
    expect_bad("LOCAL_RANK", "99999999999", "an integer from -2147483648 to 2147483647");
    expect_ok("DSHIM_SPIN_US", "0");
    expect_ok("DSHIM_SPIN_US", "2147483647");
    /* empty = unset: the default */
    setenv("DSHIM_SPIN_US", "", 1);
    ck_assert_int_eq(dshim_config_reload(), DSHIM_OK);
    ck_assert_int_eq(dshim_config()->spin_us, 50);
}
END_TEST

START_TEST(test_size_parse)
{
    expect_bad("DSHIM_CHUNK_SIZE", "99999999999g", "a size");
    expect_bad("DSHIM_CHUNK_SIZE", "-5", "a size");
    expect_bad("DSHIM_CHUNK_SIZE", "12abc", "a size");
    /* SO_SNDBUF takes an int: 99999999999 would wrap */
    expect_bad("DSHIM_SOCKET_BUFSIZE", "99999999999", "a size from 0 to 1g");
    expect_ok("DSHIM_SOCKET_BUFSIZE", "1g");
    expect_ok("MXNET_KVSTORE_BIGARRAY_BOUND", "99999999999");
    setenv("DSHIM_CHUNK_SIZE", "", 1);
    ck_assert_int_eq(dshim_config_reload(), DSHIM_OK);
    ck_assert_uint_eq(dshim_config()->chunk_bytes, 512 * 1024);
}
END_TEST

START_TEST(test_world_size_range)
{
    expect_bad("WORLD_SIZE", "99999999999", "an integer from 1 to 1048576");
    expect_bad("WORLD_SIZE", "0", "an integer from 1 to 1048576");
    expect_bad("DSHIM_WORLD_SIZE", "-5", "an integer from 1 to 1048576");
    expect_bad("PMI_SIZE", "4294967298", "an integer from 1 to 1048576");
    expect_bad("RANK", "-2", "an integer from 0 to 1048575");
    expect_bad("MASTER_PORT", "65536", "an integer from 0 to 65535");
    expect_ok("WORLD_SIZE", "1048576");
}
END_TEST

START_TEST(test_choices)
{
    expect_bad("DSHIM_TRANSPORT", "bogus", "one of auto, shm, tcp");
    expect_bad("DSHIM_DEBUG", "LOUD", "one of NONE, WARN, INFO, TRACE");
    expect_bad("DSHIM_ALGO", "tree", "one of auto, ring, rd, hier, direct, rabenseifner, gate");
    expect_bad("DSHIM_NCCL_IPC_COLLS", "allreduce,alltoall", "a comma-separated list of allreduce");
    expect_ok("DSHIM_TRANSPORT", "TCP");  /* the readers compare in any case */
    expect_ok("DSHIM_TRANSPORT", "");     /* empty = unset */
    expect_ok("DSHIM_DEBUG", "info");
    expect_ok("DSHIM_NCCL_IPC_COLLS", "allreduce,broadcast");
    expect_ok("DSHIM_SOCKET_CC", "any-name-the-kernel-knows");
}
END_TEST

START_TEST(test_ring_size_and_timeout)
{
    expect_bad("DSHIM_SHM_RING_SIZE", "3", "a power of two from 4k to 1g");
    expect_bad("DSHIM_SHM_RING_SIZE", "96k", "a power of two from 4k to 1g");
    expect_bad("DSHIM_SHM_RING_SIZE", "2k", "a power of two from 4k to 1g");
    expect_bad("DSHIM_SHM_RING_SIZE", "2g", "a power of two from 4k to 1g");
    expect_ok("DSHIM_SHM_RING_SIZE", "4k");
    expect_ok("DSHIM_SHM_RING_SIZE", "1g");
    expect_bad("DSHIM_TIMEOUT", "-1", "a number >= 0");
    expect_bad("DSHIM_TIMEOUT", "abc", "a number >= 0");
    expect_bad("DSHIM_TIMEOUT", "nan", "a number >= 0");
    expect_bad("DSHIM_TIMEOUT", "inf", "a number >= 0");
}
END_TEST

/* dshim_comm_init_env refuses before it starts anything */
static void expect_init_env_refused(const char *name, const char *value, const char *must)
{
    char port[16];
    snprintf(port, sizeof(port), "%d", ck_free_port());
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "1", 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", port, 1);
    setenv(name, value, 1);
    dshim_comm_t *comm = NULL;
    dshim_status_t st = dshim_comm_init_env(&comm);
    if (st == DSHIM_OK) {
        dshim_comm_destroy(comm);
    }
    ck_assert_msg(st == DSHIM_ERR_INVALID, "%s=%s: status %d (%s)", name, value, st, dshim_last_error());
    ck_assert_msg(strstr(dshim_last_error(), must), "'%s' not in: %s", must, dshim_last_error());
}

START_TEST(test_init_env_bad_ring_size)
{
    expect_init_env_refused("DSHIM_SHM_RING_SIZE", "3", "DSHIM_SHM_RING_SIZE=3: must be a power of two");
}
END_TEST

START_TEST(test_init_env_bad_transport)
{
    expect_init_env_refused("DSHIM_TRANSPORT", "bogus", "DSHIM_TRANSPORT=bogus: must be one of auto, shm, tcp");
}
END_TEST

START_TEST(test_init_env_world_size_wrap)
{
    /* was: (int)99999999999 = 1215752191 peers, then a busy loop closing fd 0 */
    expect_init_env_refused("WORLD_SIZE", "99999999999", "WORLD_SIZE=99999999999: must be an integer from 1 to "
                            "1048576");
}
END_TEST

START_TEST(test_comm_init_size_bound)
{
    dshim_comm_args_t a = {.rank = 0, .size = DSHIM_MAX_WORLD_SIZE + 1, .store_addr = "127.0.0.1",
                           .store_port = ck_free_port(), .token = "t"};
    dshim_comm_t *comm = NULL;
    ck_assert_int_eq(dshim_comm_init(&a, &comm), DSHIM_ERR_INVALID);
    ck_assert_msg(strstr(dshim_last_error(), "1048576"), "got: %s", dshim_last_error());
}
END_TEST

static Suite *config_suite(void)
{
    Suite *s = suite_create("config");
    TCase *tc = tcase_create("parse");
    tcase_add_checked_fixture(tc, reset_env, reset_env);
    tcase_set_timeout(tc, 20);
    tcase_add_test(tc, test_int_parse);
    tcase_add_test(tc, test_size_parse);
    tcase_add_test(tc, test_world_size_range);
    tcase_add_test(tc, test_choices);
    tcase_add_test(tc, test_ring_size_and_timeout);
    suite_add_tcase(s, tc);
    TCase *init = tcase_create("init_env");
    tcase_add_checked_fixture(init, reset_env, reset_env);
    tcase_set_timeout(init, 20);
    tcase_add_test(init, test_init_env_bad_ring_size);
    tcase_add_test(init, test_init_env_bad_transport);
    tcase_add_test(init, test_init_env_world_size_wrap);
    tcase_add_test(init, test_comm_init_size_bound);
    suite_add_tcase(s, init);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(config_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

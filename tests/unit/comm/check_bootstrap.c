/* dshim_bootstrap's error path closes only the sockets it opened.
 * It used to jump to its clean-up after a failed allocation before
 * setting its fd table to -1; fresh memory holds zeros, so it closed fd 0
 * once per peer (a busy loop for a wrapped world size).  ASan cannot see a
 * close(0), so this checks fd 0 directly.
 *
 * Linked with -Wl,--wrap=calloc (tests/CMakeLists.txt): fail_count makes
 * the peer tables' calloc fail, as a huge world size would, without
 * allocating gigabytes. */
#include <check.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap.h"
#include "status.h"

void *__real_calloc(size_t n, size_t size);
void *__wrap_calloc(size_t n, size_t size);

static size_t fail_count;  /* calloc(n, ...) with this n fails; 0: none */

void *__wrap_calloc(size_t n, size_t size)
{
    if (fail_count != 0 && n == fail_count) {
        return NULL;
    }
    return __real_calloc(n, size);
}

/* 100003 ints = 400 KB: above malloc's mmap threshold, so the fd table
 * comes back zero-filled, i.e. full of fd 0 before the fix. */
#define PEERS 100003

START_TEST(test_alloc_failure_keeps_fd0)
{
    int saved = dup(0);  /* fd 0 may be closed under ctest: put a known file there */
    int probe = open("/dev/null", O_RDONLY);
    ck_assert(probe >= 0);
    ck_assert_int_eq(dup2(probe, 0), 0);
    struct stat before, after;
    ck_assert_int_eq(fstat(0, &before), 0);

    fail_count = PEERS;
    dshim_comm_t *comm = NULL;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    dshim_status_t st = dshim_bootstrap(NULL, "c0/", 0, PEERS, NULL, "token", &comm);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    fail_count = 0;

    int fd0_open = fstat(0, &after) == 0;
    /* put fd 0 back before any assertion can end the case */
    if (saved >= 0) {
        dup2(saved, 0);
        close(saved);
    } else {
        close(0);
    }
    close(probe);
    ck_assert_int_eq(st, DSHIM_ERR_NOMEM);
    ck_assert_msg(strstr(dshim_last_error(), "out of memory for 100003 peers"), "got: %s", dshim_last_error());
    ck_assert_msg(fd0_open, "the failed bootstrap closed fd 0, which it never opened");
    ck_assert(before.st_ino == after.st_ino && before.st_dev == after.st_dev);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    ck_assert_msg(s < 1.0, "the failed bootstrap took %.2f s", s);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("bootstrap");
    TCase *tc = tcase_create("errors");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_alloc_failure_keeps_fd0);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

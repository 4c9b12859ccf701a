/*
 * Multi-process test harness: forks N ranks that each run `body`, captures
 * every rank's stderr, bounds the whole run in time and kills (by PID) what
 * is left when it runs over.  Ranks meet through a store on a free loopback
 * port, hosted by rank 0.
 */
#ifndef DSHIM_TEST_RANKS_H
#define DSHIM_TEST_RANKS_H

#include <stddef.h>
#include <sys/types.h>

#include "free_port.h"

#define TEST_MAX_RANKS 16

typedef struct test_rank_result {
    int exited;        /* 1: exited normally */
    int code;          /* exit code, or signal number when !exited */
    double seconds;    /* time from start until this rank ended */
    char err[16384];   /* captured stderr (truncated) */
} test_rank_result_t;

/* body runs in the child after the environment pairs in `env` (NAME=VALUE,
 * NULL-terminated, may be NULL) are set and the config reloaded; its return
 * value is the exit code.  store_port is free for rank 0 to listen on. */
typedef int (*test_rank_body_t)(int rank, int size, int store_port, void *arg);

/* Returns 0 when all ranks ended before timeout_s, -1 otherwise (the rest
 * were killed).  results[r] filled for every rank. */
int test_run_ranks(int n, test_rank_body_t body, void *arg, const char *const *env, double timeout_s,
                   test_rank_result_t *results);

/* Creates a communicator for the body (explicit args, loopback store). */
struct dshim_comm;
int test_comm_init(int rank, int size, int store_port, struct dshim_comm **comm_p);

#endif

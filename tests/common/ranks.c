/* Multi-process test harness (see ranks.h). */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "dshim.h"
#include "free_port.h"
#include "ranks.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int test_comm_init(int rank, int size, int store_port, struct dshim_comm **comm_p)
{
    dshim_comm_args_t a = {.rank = rank, .size = size, .store_addr = "127.0.0.1", .store_port = store_port,
                           .token = "test-token", .store_external = 0};
    dshim_status_t st = dshim_comm_init(&a, comm_p);
    if (st != DSHIM_OK) {
        fprintf(stderr, "rank %d: dshim_comm_init failed: %s\n", rank, dshim_last_error());
        return -1;
    }
    return 0;
}

int test_run_ranks(int n, test_rank_body_t body, void *arg, const char *const *env, double timeout_s,
                   test_rank_result_t *results)
{
    pid_t pids[TEST_MAX_RANKS];
    int fds[TEST_MAX_RANKS];
    size_t got[TEST_MAX_RANKS];
    int alive = 0;
    int port = test_free_port();
    double start = now_s();
    fflush(stdout);
    fflush(stderr);
    for (int r = 0; r < n; r++) {
        int p[2];
        if (pipe2(p, O_CLOEXEC) != 0) {
            return -1;
        }
        pid_t pid = fork();
        if (pid == 0) {
            close(p[0]);
            dup2(p[1], 2);
            for (int i = 0; env && env[i]; i++) {
                char name[128];
                const char *eq = strchr(env[i], '=');
                if (eq && (size_t)(eq - env[i]) < sizeof(name)) {
                    memcpy(name, env[i], (size_t)(eq - env[i]));
                    name[eq - env[i]] = 0;
                    setenv(name, eq + 1, 1);
                }
            }
            dshim_config_reload();
            int rc = body(r, n, port, arg);
            fflush(stdout);
            fflush(stderr);
            exit(rc); /* not _exit: atexit handlers (the store linger) must run */
        }
        close(p[1]);
        pids[r] = pid;
        fds[r] = p[0];
        got[r] = 0;
        memset(&results[r], 0, sizeof(results[r]));
        alive++;
    }
    int timed_out = 0;
    while (alive > 0) {
        struct pollfd pfd[TEST_MAX_RANKS];
        int idx[TEST_MAX_RANKS], np = 0;
        for (int r = 0; r < n; r++) {
            if (fds[r] >= 0) {
                pfd[np].fd = fds[r];
                pfd[np].events = POLLIN;
                idx[np++] = r;
            }
        }
        double left = timeout_s - (now_s() - start);
        if (left <= 0) {
            timed_out = 1;
            break;
        }
        if (np > 0) {
            poll(pfd, (nfds_t)np, 50);
            for (int i = 0; i < np; i++) {
                if (!(pfd[i].revents & (POLLIN | POLLHUP))) {
                    continue;
                }
                int r = idx[i];
                char buf[4096];
                ssize_t k = read(fds[r], buf, sizeof(buf));
                if (k <= 0) {
                    close(fds[r]);
                    fds[r] = -1;
                    continue;
                }
                size_t room = sizeof(results[r].err) - 1 - got[r];
                size_t c = (size_t)k < room ? (size_t)k : room;
                memcpy(results[r].err + got[r], buf, c);
                got[r] += c;
            }
        } else {
            struct timespec ts = {0, 20000000};
            nanosleep(&ts, NULL);
        }
        int status;
        pid_t p;
        while ((p = waitpid(-1, &status, WNOHANG)) > 0) {
            for (int r = 0; r < n; r++) {
                if (pids[r] == p) {
                    results[r].exited = WIFEXITED(status);
                    results[r].code = WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status);
                    results[r].seconds = now_s() - start;
                    pids[r] = -1;
                    alive--;
                }
            }
        }
    }
    for (int r = 0; r < n; r++) {
        if (pids[r] > 0) {
            kill(pids[r], SIGKILL);
            int status;
            waitpid(pids[r], &status, 0);
            results[r].exited = 0;
            results[r].code = SIGKILL;
            results[r].seconds = now_s() - start;
        }
        if (fds[r] >= 0) {
            /* drain what is left */
            char buf[4096];
            ssize_t k;
            while ((k = read(fds[r], buf, sizeof(buf))) > 0) {
                size_t room = sizeof(results[r].err) - 1 - got[r];
                size_t c = (size_t)k < room ? (size_t)k : room;
                memcpy(results[r].err + got[r], buf, c);
                got[r] += c;
            }
            close(fds[r]);
        }
        results[r].err[got[r]] = 0;
    }
    return timed_out ? -1 : 0;
}

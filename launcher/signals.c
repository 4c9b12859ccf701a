/* Signals as bytes on a self-pipe (signals.h). */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include "signals.h"

static int sig_pipe[2] = {-1, -1};

static void on_signal(int sig)
{
    int saved = errno;
    unsigned char b = (unsigned char)sig;
    if (write(sig_pipe[1], &b, 1) < 0) {
        /* pipe full: a wakeup is already pending */
    }
    errno = saved;
}

int run_signals_catch(void)
{
    signal(SIGPIPE, SIG_IGN);
    if (sig_pipe[0] < 0 && pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
        return -1;
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGCHLD, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    return 0;
}

void run_signals_catch_also(int sig)
{
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(sig, &sa, NULL);
}

int run_signals_fd(void)
{
    return sig_pipe[0];
}

int run_signals_take(int *sigs, int cap)
{
    unsigned char b[64];
    ssize_t got = read(sig_pipe[0], b, (size_t)cap < sizeof(b) ? (size_t)cap : sizeof(b));
    int n = 0;
    for (ssize_t k = 0; k < got; k++) {
        if (b[k] != SIGCHLD) {
            sigs[n++] = b[k];
        }
    }
    return n;
}

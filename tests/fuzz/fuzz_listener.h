/*
 * A listening AF_UNIX socket (abstract name, per process) for the targets
 * whose code under test accept()s its connections itself (the data
 * connections' answer_hello, the parameter server's accept_worker), and a client that
 * connects to it and sends one fuzzed stream.
 */
#ifndef DSHIM_FUZZ_LISTENER_H
#define DSHIM_FUZZ_LISTENER_H

#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/un.h>

#include "fuzz_common.h"

static struct sockaddr_un fuzz_listen_addr;
static socklen_t fuzz_listen_len;

/* Non-blocking, so fuzz_listener_flush can empty its queue; the code under
 * test poll()s it before accept4(), as it does a TCP listener. */
static inline int fuzz_listener_open(const char *name)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    memset(&fuzz_listen_addr, 0, sizeof(fuzz_listen_addr));
    fuzz_listen_addr.sun_family = AF_UNIX;
    /* abstract namespace: no file to clean up, unique per process */
    int n = snprintf(fuzz_listen_addr.sun_path + 1, sizeof(fuzz_listen_addr.sun_path) - 1, "dshim-fuzz-%s-%d",
                     name, (int)getpid());
    fuzz_listen_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
    if (fd < 0 || bind(fd, (struct sockaddr *)&fuzz_listen_addr, fuzz_listen_len) != 0 || listen(fd, 128) != 0) {
        perror("fuzz: listener");
        abort();
    }
    return fd;
}

/* Connects, sends what the socket takes of buf (inputs are far below its
 * buffer), and ends the stream so that every read of the peer finishes. */
static inline int fuzz_connect_send(const uint8_t *buf, size_t len)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&fuzz_listen_addr, fuzz_listen_len) != 0) {
        perror("fuzz: connect");
        abort();
    }
    fcntl(fd, F_SETFL, O_NONBLOCK);
    fuzz_write_some(fd, buf, len);
    shutdown(fd, SHUT_WR);
    return fd;
}

/* Closes the connections the code under test did not accept. */
static inline void fuzz_listener_flush(int lfd)
{
    for (;;) {
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) {
            return;
        }
        close(fd);
    }
}

#endif

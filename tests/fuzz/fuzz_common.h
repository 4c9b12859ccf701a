/*
 * What the libFuzzer targets of tests/fuzz share: a quiet log, a socketpair
 * standing in for a network connection, and non-blocking writes and drains
 * of its far end.  Each target includes the .c file it fuzzes, so it can
 * drive that file's static parser on real sockets without any change to it.
 */
#ifndef DSHIM_FUZZ_COMMON_H
#define DSHIM_FUZZ_COMMON_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"

/* Every rejected input logs a WARN line: millions of them would only slow
 * the run down.  FUZZ_VERBOSE=1 keeps them, to see why an input is refused. */
static inline void fuzz_quiet_logs(void)
{
    dshim_log_init();
    const char *v = getenv("FUZZ_VERBOSE");
    if (!v || v[0] != '1') {
        dshim_log_level_current = DSHIM_LOG_NONE;
    }
}

/* A connected AF_UNIX stream pair; both ends non-blocking.  fds[0] is the
 * code under test's end, fds[1] the fuzzer's. */
static inline void fuzz_socketpair(int fds[2])
{
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds) != 0) {
        perror("fuzz: socketpair");
        abort();  /* out of descriptors: a leak in the target or the harness */
    }
}

/* Writes as much of buf as the socket takes now; returns the bytes written. */
static inline size_t fuzz_write_some(int fd, const uint8_t *buf, size_t len)
{
    size_t off = 0;
    while (off < len) {
        ssize_t n = send(fd, buf + off, len - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            off += (size_t)n;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else {
            break;  /* full (EAGAIN) or the other end closed */
        }
    }
    return off;
}

/* Reads and discards whatever the code under test sent; returns the bytes. */
static inline size_t fuzz_drain(int fd)
{
    uint8_t buf[65536];
    size_t total = 0;
    for (;;) {
        ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n > 0) {
            total += (size_t)n;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else {
            return total;
        }
    }
}

/* Little-endian reads of the fuzz input's own framing bytes. */
static inline uint16_t fuzz_u16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

#endif

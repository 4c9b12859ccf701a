/* Socket helpers for the bootstrap.  Data-path I/O lives in the tcp transport. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "net.h"
#include "status.h"

double dshim_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int dshim_net_set_nonblocking(int fd, int on)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0) {
        return -1;
    }
    return fcntl(fd, F_SETFL, on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK));
}

void dshim_net_tune(int fd, size_t bufsize)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (bufsize > 0) {
        int sz = (int)bufsize;
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz));
    }
}

/* Why reno for local peers: on loopback there is no network to share and no
 * loss, so congestion control has nothing to do, but a pacing algorithm (bbr,
 * the system default on some hosts) still spaces the segments out with
 * timers.  Measured on loopback, 2 ranks: allreduce busbw 2.8 -> 4.3 GB/s at
 * 1 MiB and 2.5 -> 3.4 GB/s at 16 MiB.  reno is built into every kernel and
 * always allowed to unprivileged processes. */
void dshim_net_set_cc(int fd, int local)
{
    const char *want = dshim_config()->socket_cc;
    if (!strcasecmp(want, "default") || want[0] == '\0' || (!strcasecmp(want, "auto") && !local)) {
        return;
    }
    int explicit_name = strcasecmp(want, "auto") != 0;
    const char *name = explicit_name ? want : "reno";
    if (setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, (socklen_t)strlen(name)) != 0) {
        if (explicit_name) {
            DSHIM_WARN("DSHIM_SOCKET_CC=%s: the kernel refused it (%s); see "
                       "/proc/sys/net/ipv4/tcp_allowed_congestion_control; keeping the system default",
                       name, strerror(errno));
        } else {
            DSHIM_TRACE("TCP_CONGESTION %s refused (%s); keeping the system default", name, strerror(errno));
        }
    }
}

dshim_status_t dshim_net_resolve(const char *host, struct in_addr *addr_p)
{
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(host, NULL, &hints, &res);
    if (rc != 0 || !res) {
        return dshim_error(DSHIM_ERR_INVALID, "cannot resolve host '%s': %s; check MASTER_ADDR / DSHIM_STORE_ADDR",
                           host, gai_strerror(rc));
    }
    *addr_p = ((struct sockaddr_in *)res->ai_addr)->sin_addr;
    freeaddrinfo(res);
    return DSHIM_OK;
}

/* Whether a is loopback or an address of this host (one we can bind). */
static int addr_is_ours(struct in_addr a)
{
    if ((ntohl(a.s_addr) >> 24) == 127) {
        return 1;
    }
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr = a};
    int ours = fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
    if (fd >= 0) {
        close(fd);
    }
    return ours;
}

static const char *ifname_setting(const char **source_p);

/* reach's IPv4 address, without logging (an unresolvable name is reported
 * by whoever connects to it). */
static int resolve_quiet(const char *reach, struct in_addr *a)
{
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res = NULL;
    if (!reach || !reach[0] || getaddrinfo(reach, NULL, &hints, &res) != 0 || !res) {
        return 0;
    }
    *a = ((struct sockaddr_in *)res->ai_addr)->sin_addr;
    freeaddrinfo(res);
    return 1;
}

/* The named interface's address (DSHIM_SOCKET_IFNAME & co.), or 0.  A list
 * that matches nothing logs its WARN here too; the caller's last error is
 * kept, since choosing a listen address never fails. */
static int named_interface_addr(const char *reach, struct in_addr *a, char *why, size_t why_len)
{
    char saved[1024];
    snprintf(saved, sizeof(saved), "%s", dshim_last_error());
    dshim_status_t st = dshim_net_pick_local_addr(reach, a, why, why_len);
    dshim_error_set_raw(saved);
    return st == DSHIM_OK;
}

void dshim_net_listen_addr(const char *reach, const char *what, char *out, size_t out_len)
{
    struct in_addr a = {0}, numeric;
    int resolved = resolve_quiet(reach, &a);
    int loopback = resolved && (ntohl(a.s_addr) >> 24) == 127;
    char why[256];
    out[0] = '\0';
    if (loopback && inet_pton(AF_INET, reach, &numeric) != 1 && strcmp(reach, "localhost") != 0) {
        /* a host name that is loopback only here (Debian's 127.0.1.1 entry
         * for the own name): the other hosts may resolve it to a real address */
        DSHIM_INFO("%s: listening on all interfaces: '%s' resolves to loopback here but may name this host's "
                   "network address elsewhere; only the job token protects it", what, reach);
        return;
    }
    if (resolved && addr_is_ours(a)) {
        inet_ntop(AF_INET, &a, out, (socklen_t)out_len);
        DSHIM_INFO("%s: listening on %s only (%s is %s)", what, out, reach,
                   loopback ? "loopback" : "an address of this host");
        return;
    }
    const char *source = NULL;
    const char *list = ifname_setting(&source);
    if (list && resolved && named_interface_addr(reach, &a, why, sizeof(why))) {
        inet_ntop(AF_INET, &a, out, (socklen_t)out_len);
        DSHIM_INFO("%s: listening on %s only (%s)", what, out, why);
        return;
    }
    DSHIM_INFO("%s: listening on all interfaces: '%s' is %s and %s; only the job token protects it", what,
               reach ? reach : "", resolved ? "not an address of this host" : "not resolvable here",
               list ? "the named interfaces match none" : "no interface was named (DSHIM_SOCKET_IFNAME)");
}

DSHIM_EXPORT dshim_status_t dshim_host_address(const char *reach, char *buf, size_t len)
{
    if (buf == NULL || len < INET_ADDRSTRLEN) {
        return dshim_error(DSHIM_ERR_INVALID, "dshim_host_address: %s; pass a buffer of at least %d bytes",
                           buf == NULL ? "buf is NULL" : "buf is too short", INET_ADDRSTRLEN);
    }
    char own[256];
    struct in_addr a;
    if (reach == NULL || reach[0] == '\0') {
        /* No master named: this host's own name stands for it, so the answer
         * is still the address the other hosts know this host by. */
        if (gethostname(own, sizeof(own)) != 0 || (own[sizeof(own) - 1] = '\0', !resolve_quiet(own, &a))) {
            snprintf(buf, len, "127.0.0.1");
            return DSHIM_OK;
        }
        reach = own;
    }
    char why[256];
    DSHIM_CHECK(dshim_net_pick_local_addr(reach, &a, why, sizeof(why)));
    inet_ntop(AF_INET, &a, buf, (socklen_t)len);
    return DSHIM_OK;
}

/* The configured interface list: the first non-empty of our variable and the
 * frameworks' fallbacks. */
static const char *ifname_setting(const char **source_p)
{
    const dshim_config_t *cfg = dshim_config();
    struct {
        const char *val, *name;
    } order[] = {{cfg->socket_ifname, "DSHIM_SOCKET_IFNAME"},
                 {cfg->nccl_ifname, "NCCL_SOCKET_IFNAME"},
                 {cfg->gloo_ifname, "GLOO_SOCKET_IFNAME"},
                 {cfg->dmlc_interface, "DMLC_INTERFACE"}};
    for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++) {
        if (order[i].val && order[i].val[0]) {
            *source_p = order[i].name;
            return order[i].val;
        }
    }
    return NULL;
}

/* Does interface `name` match the comma-separated list (prefix match, like
 * NCCL; a leading '^' turns the list into an exclusion list)? */
static int ifname_matches(const char *list, const char *name)
{
    int exclude = 0;
    if (list[0] == '^') {
        exclude = 1;
        list++;
    }
    int hit = 0;
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", list);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (tok[0] == '=' ? strcmp(tok + 1, name) == 0 : strncmp(tok, name, strlen(tok)) == 0) {
            hit = 1;
            break;
        }
    }
    return exclude ? !hit : hit;
}

dshim_status_t dshim_net_pick_local_addr(const char *store_addr, struct in_addr *addr_p, char *why,
                                         size_t why_len)
{
    struct in_addr store_ip = {0}; /* set by resolve; gcc -O3 cannot see through DSHIM_CHECK */
    DSHIM_CHECK(dshim_net_resolve(store_addr, &store_ip));
    int store_is_loopback = (ntohl(store_ip.s_addr) >> 24) == 127;
    const char *source = NULL;
    const char *list = ifname_setting(&source);
    if (list) {
        struct ifaddrs *ifs = NULL;
        if (getifaddrs(&ifs) != 0) {
            return dshim_error(DSHIM_ERR_SYSTEM, "getifaddrs failed: %s", strerror(errno));
        }
        int found = 0;
        for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
            if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP)) {
                continue;
            }
            if (!ifname_matches(list, i->ifa_name)) {
                continue;
            }
            struct in_addr a = ((struct sockaddr_in *)i->ifa_addr)->sin_addr;
            if ((i->ifa_flags & IFF_LOOPBACK) && !store_is_loopback && list[0] == '^') {
                continue;  /* an exclusion list never selects loopback for a remote job */
            }
            *addr_p = a;
            snprintf(why, why_len, "interface %s from %s=%s", i->ifa_name, source, list);
            found = 1;
            break;
        }
        freeifaddrs(ifs);
        if (!found) {
            return dshim_error(DSHIM_ERR_INVALID,
                               "%s=%s matches no IPv4 interface that is up; list interfaces with 'ip -4 addr' "
                               "and set %s to one of them",
                               source, list, source);
        }
        return DSHIM_OK;
    }
    if (store_is_loopback) {
        *addr_p = store_ip;
        snprintf(why, why_len, "loopback: the store %s is local", store_addr);
        return DSHIM_OK;
    }
    /* Ask the routing table which source address reaches the store: a
     * connect()ed UDP socket sends nothing but gets a local address. */
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return dshim_error(DSHIM_ERR_SYSTEM, "socket: %s", strerror(errno));
    }
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(9), .sin_addr = store_ip};
    socklen_t len = sizeof(sa);
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || getsockname(fd, (struct sockaddr *)&sa, &len) != 0) {
        int e = errno;
        close(fd);
        return dshim_error(DSHIM_ERR_SYSTEM,
                           "no route from this host to the store %s: %s; set DSHIM_SOCKET_IFNAME to the interface "
                           "that reaches the other hosts",
                           store_addr, strerror(e));
    }
    close(fd);
    *addr_p = sa.sin_addr;
    snprintf(why, why_len, "the address that routes to the store %s", store_addr);
    return DSHIM_OK;
}

dshim_status_t dshim_net_listen(struct in_addr addr, int *fd_p, int *port_p)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return dshim_error(DSHIM_ERR_SYSTEM, "socket: %s", strerror(errno));
    }
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0, .sin_addr = addr};
    socklen_t len = sizeof(sa);
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(fd, 128) != 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &len) != 0) {
        int e = errno;
        close(fd);
        char ip[INET_ADDRSTRLEN];
        inet_ntop(AF_INET, &addr, ip, sizeof(ip));
        return dshim_error(DSHIM_ERR_SYSTEM, "cannot listen for peers on %s: %s", ip, strerror(e));
    }
    *fd_p = fd;
    *port_p = ntohs(sa.sin_port);
    return DSHIM_OK;
}

dshim_status_t dshim_net_connect(struct in_addr addr, int port, double deadline, int *fd_p)
{
    char ip[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &addr, ip, sizeof(ip));
    int last_err = 0;
    double delay = 0.01;
    while (1) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            return dshim_error(DSHIM_ERR_SYSTEM, "socket: %s", strerror(errno));
        }
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr = addr};
        dshim_net_set_nonblocking(fd, 1);
        int rc = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
        if (rc != 0 && errno == EINPROGRESS) {
            double left = deadline - dshim_now();
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            rc = poll(&p, 1, left > 0 ? (int)(left * 1000) + 1 : 0);
            if (rc == 1) {
                int err = 0;
                socklen_t el = sizeof(err);
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
                rc = err ? -1 : 0;
                errno = err;
            } else {
                rc = -1;
                errno = ETIMEDOUT;
            }
        }
        if (rc == 0) {
            dshim_net_set_nonblocking(fd, 0);
            *fd_p = fd;
            return DSHIM_OK;
        }
        last_err = errno;
        close(fd);
        if (dshim_now() + delay > deadline) {
            break;
        }
        struct timespec ts = {0, (long)(delay * 1e9)};
        nanosleep(&ts, NULL);
        if (delay < 0.5) {
            delay *= 2;
        }
    }
    return dshim_error(DSHIM_ERR_PEER, "cannot connect to %s:%d: %s", ip, port, strerror(last_err));
}

static dshim_status_t io_full(int fd, void *buf, size_t len, double deadline, int writing)
{
    size_t off = 0;
    while (off < len) {
        double left = deadline - dshim_now();
        if (left <= 0) {
            return dshim_error_quiet(DSHIM_ERR_TIMEOUT, "timed out %s %zu bytes", writing ? "writing" : "reading",
                                     len);
        }
        struct pollfd p = {.fd = fd, .events = writing ? POLLOUT : POLLIN};
        int rc = poll(&p, 1, (int)(left * 1000) + 1);
        if (rc < 0 && errno == EINTR) {
            continue;
        }
        if (rc <= 0) {
            continue;
        }
        ssize_t n = writing ? send(fd, (char *)buf + off, len - off, MSG_NOSIGNAL | MSG_DONTWAIT)
                            : recv(fd, (char *)buf + off, len - off, MSG_DONTWAIT);
        if (n > 0) {
            off += (size_t)n;
        } else if (n == 0) {
            return dshim_error_quiet(DSHIM_ERR_PEER, "connection closed by the peer");
        } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            return dshim_error_quiet(DSHIM_ERR_PEER, "%s", strerror(errno));
        }
    }
    return DSHIM_OK;
}

dshim_status_t dshim_net_read_full(int fd, void *buf, size_t len, double deadline)
{
    return io_full(fd, buf, len, deadline, 0);
}

dshim_status_t dshim_net_write_full(int fd, const void *buf, size_t len, double deadline)
{
    return io_full(fd, (void *)buf, len, deadline, 1);
}

int dshim_net_hung_up(int fd)
{
    if (fd < 0) {
        return 0;
    }
    struct pollfd pfd = {.fd = fd, .events = POLLRDHUP, .revents = 0};
    return poll(&pfd, 1, 0) > 0 && (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

int dshim_net_out_of_fds(int err, const char *what)
{
    if (err == EMFILE) {
        struct rlimit rl;
        char now[32] = "?";
        if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
            if (rl.rlim_cur == RLIM_INFINITY) {
                snprintf(now, sizeof(now), "unlimited");
            } else {
                snprintf(now, sizeof(now), "%llu", (unsigned long long)rl.rlim_cur);
            }
        }
        /* quiet: the caller decides where the one line goes (a failed
         * communicator logs it, the store hands it to every waiting rank) */
        dshim_error_quiet(DSHIM_ERR_SYSTEM, "%s: too many open files (EMFILE): raise ulimit -n (now %s)", what, now);
        return 1;
    }
    if (err == ENFILE) {
        dshim_error_quiet(DSHIM_ERR_SYSTEM, "%s: the system's file table is full (ENFILE): close files or raise "
                          "fs.file-max", what);
        return 1;
    }
    return 0;
}

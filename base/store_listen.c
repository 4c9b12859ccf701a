/* The rendezvous store server's listener, start and stop (the loop is in
 * store_server.c). */
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "net.h"
#include "status.h"
#include "store.h"
#include "store_proto.h"
#include "store_server_impl.h"

static dshim_status_t resolve_bind_addr(const char *addr, struct in_addr *out)
{
    if (!addr || !addr[0]) {
        out->s_addr = htonl(INADDR_ANY);
        return DSHIM_OK;
    }
    if (inet_pton(AF_INET, addr, out) == 1) {
        return DSHIM_OK;
    }
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *res = NULL;
    int rc = getaddrinfo(addr, NULL, &hints, &res);
    if (rc != 0 || !res) {
        return dshim_error(DSHIM_ERR_INVALID,
                           "cannot resolve '%s' to host the rendezvous store: %s; set MASTER_ADDR or "
                           "DSHIM_STORE_ADDR to a host name or IPv4 address of this host",
                           addr, rc ? gai_strerror(rc) : "no IPv4 address");
    }
    *out = ((struct sockaddr_in *)res->ai_addr)->sin_addr;
    freeaddrinfo(res);
    return DSHIM_OK;
}

static dshim_status_t listen_error(const struct in_addr *ip, int port, int err)
{
    char ipbuf[INET_ADDRSTRLEN] = "?";
    inet_ntop(AF_INET, ip, ipbuf, sizeof(ipbuf));
    if (err == EADDRINUSE) {
        return dshim_error(DSHIM_ERR_SYSTEM,
                           "cannot listen on %s:%d for the rendezvous store: %s; choose another port with "
                           "MASTER_PORT or DSHIM_STORE_PORT, or stop the process that holds it",
                           ipbuf, port, strerror(err));
    }
    return dshim_error(DSHIM_ERR_SYSTEM,
                       "cannot listen on %s:%d for the rendezvous store: %s; check that MASTER_ADDR or "
                       "DSHIM_STORE_ADDR names an address of this host and the port is allowed",
                       ipbuf, port, strerror(err));
}

static dshim_status_t open_listener(const char *addr, int port, int *fd_p, int *bound_port)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    DSHIM_CHECK(resolve_bind_addr(addr, &sa.sin_addr));
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return dshim_error(DSHIM_ERR_SYSTEM, "cannot create the rendezvous store socket: %s", strerror(errno));
    }
    /* a restarted job must be able to reuse the port while old connections
     * of the previous run sit in TIME_WAIT */
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, SOMAXCONN) < 0) {
        int err = errno;
        close(fd);
        return listen_error(&sa.sin_addr, port, err);
    }
    socklen_t sl = sizeof(sa);
    if (getsockname(fd, (struct sockaddr *)&sa, &sl) < 0) {
        int err = errno;
        close(fd);
        return dshim_error(DSHIM_ERR_SYSTEM, "cannot read the rendezvous store's port: %s", strerror(err));
    }
    *fd_p = fd;
    *bound_port = ntohs(sa.sin_port);
    return DSHIM_OK;
}

dshim_status_t dshim_store_server_start(const char *addr, int port, const char *token,
                                        dshim_store_server_t **server_p, int *port_p)
{
    if (!server_p || port < 0 || port > 65535) {
        return dshim_error(DSHIM_ERR_INVALID,
                           "rendezvous store port %d is out of range; use 0 to 65535 (MASTER_PORT or "
                           "DSHIM_STORE_PORT)", port);
    }
    *server_p = NULL;
    dshim_log_init();  /* the level must be known before INFO/TRACE lines */
    size_t tlen = token ? strlen(token) : 0;
    if (tlen > DSHIM_STORE_TOKEN_MAX) {
        return dshim_error(DSHIM_ERR_INVALID, "job token of %zu bytes is longer than %u; use a shorter "
                           "DSHIM_JOB_TOKEN", tlen, DSHIM_STORE_TOKEN_MAX);
    }
    dshim_store_server_t *srv = calloc(1, sizeof(*srv));
    if (!srv) {
        return dshim_error(DSHIM_ERR_NOMEM, "out of memory starting the rendezvous store");
    }
    srv->listen_fd = srv->wake_fd = -1;
    srv->nbuckets = 64;
    srv->buckets = calloc(srv->nbuckets, sizeof(*srv->buckets));
    srv->token = malloc(tlen + 1);
    if (!srv->buckets || !srv->token) {
        free(srv->buckets);
        free(srv->token);
        free(srv);
        return dshim_error(DSHIM_ERR_NOMEM, "out of memory starting the rendezvous store");
    }
    memcpy(srv->token, token ? token : "", tlen);
    srv->token_len = tlen;

    int bound = 0;
    dshim_status_t st = open_listener(addr, port, &srv->listen_fd, &bound);
    if (st == DSHIM_OK) {
        srv->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (srv->wake_fd < 0) {
            st = dshim_error(DSHIM_ERR_SYSTEM, "cannot create the rendezvous store's eventfd: %s",
                             strerror(errno));
        }
    }
    if (st == DSHIM_OK) {
        /* the store thread must not take the application's asynchronous
         * signals (SIGINT, SIGTERM, ...); faults stay unblocked so a crash
         * in it still reaches the backtrace handler */
        sigset_t all, old;
        sigfillset(&all);
        sigdelset(&all, SIGSEGV);
        sigdelset(&all, SIGBUS);
        sigdelset(&all, SIGILL);
        sigdelset(&all, SIGFPE);
        sigdelset(&all, SIGABRT);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        int rc = pthread_create(&srv->thread, NULL, dshim_store_server_main, srv);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (rc != 0) {
            st = dshim_error(DSHIM_ERR_SYSTEM, "cannot start the rendezvous store thread: %s", strerror(rc));
        }
    }
    if (st != DSHIM_OK) {
        if (srv->listen_fd >= 0) {
            close(srv->listen_fd);
        }
        if (srv->wake_fd >= 0) {
            close(srv->wake_fd);
        }
        dshim_store_kv_free_all(srv);
        free(srv->token);
        free(srv);
        return st;
    }
    DSHIM_INFO("store: serving on %s:%d", (addr && addr[0]) ? addr : "0.0.0.0", bound);
    if (port_p) {
        *port_p = bound;
    }
    *server_p = srv;
    return DSHIM_OK;
}

void dshim_store_server_stop(dshim_store_server_t *srv)
{
    if (!srv) {
        return;
    }
    uint64_t one = 1;
    while (write(srv->wake_fd, &one, sizeof(one)) < 0 && errno == EINTR) {
    }
    pthread_join(srv->thread, NULL);
    for (size_t i = 0; i < srv->nconns; i++) {
        dshim_store_conn_free(srv->conns[i]);
    }
    free(srv->conns);
    free(srv->pfds);
    dshim_store_kv_free_all(srv);
    close(srv->listen_fd);
    close(srv->wake_fd);
    free(srv->token);
    free(srv);
}

uint64_t dshim_store_server_rejected(const dshim_store_server_t *srv)
{
    return srv ? __atomic_load_n(&srv->rejected, __ATOMIC_RELAXED) : 0;
}

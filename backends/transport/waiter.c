/*
 * Sleeping until a connection may move again (see transport.h "waiting").
 * Slow path: the engine gets here only after a round of progress moved
 * nothing and its spin ran out.
 */
#include <errno.h>
#include <string.h>
#include <sys/socket.h>

#include "status.h"
#include "transport/transport.h"

/* Which of the waiter's transports t is; -1 when it has no wake-up of its own. */
static int waiter_slot(const dshim_waiter_t *w, const dshim_transport_t *t)
{
    for (int i = 0; i < w->n; i++) {
        if (w->transport[i] == t) {
            return i;
        }
    }
    return -1;
}

void dshim_waiter_add(dshim_waiter_t *w, const dshim_transport_t *t, void *state)
{
    if (!t->wait_arm || !t->wait || !t->wait_disarm || waiter_slot(w, t) >= 0 || w->n >= DSHIM_TRANSPORT_MAX) {
        return;
    }
    w->transport[w->n] = t;
    w->state[w->n] = state;
    if (w->is_armed) {
        w->armed[w->n] = t->wait_arm(state);
    }
    w->n++;
}

int dshim_waiter_arm(dshim_waiter_t *w)
{
    if (w->is_armed || w->n == 0) {
        return 0;
    }
    for (int i = 0; i < w->n; i++) {
        w->armed[i] = w->transport[i]->wait_arm(w->state[i]);
    }
    w->is_armed = 1;
    return 1;
}

void dshim_wait_set_init(dshim_wait_set_t *ws)
{
    ws->n = 0;
    ws->by_socket = 0;
    ws->wake_ups = 0;
}

void dshim_wait_set_add(dshim_wait_set_t *ws, const dshim_waiter_t *w, dshim_conn_t *c, int sending)
{
    if (dshim_wait_set_full(ws)) {
        return;
    }
    struct pollfd *p = &ws->pfd[ws->n];
    if (c->ops->wait_arm) {
        int slot = waiter_slot(w, c->ops);
        if (slot >= 0) {
            ws->wake_ups |= 1u << slot;
        }
        p->events = POLLIN; /* EOF or an unexpected byte = the peer is gone */
    } else {
        p->events = sending ? POLLOUT : POLLIN;
        ws->by_socket++;
    }
    p->fd = c->fd;
    p->revents = 0;
    ws->conn[ws->n++] = c;
}

void dshim_wait_set_add_fd(dshim_wait_set_t *ws, int fd, short events)
{
    if (dshim_wait_set_full(ws)) {
        return;
    }
    ws->pfd[ws->n] = (struct pollfd){.fd = fd, .events = events, .revents = 0};
    ws->conn[ws->n++] = NULL;
    ws->by_socket++;
}

/* A socket that only signals death showed activity: is the peer gone? */
static int control_socket_closed(const dshim_conn_t *c)
{
    char b;
    ssize_t got = recv(c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return got >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

dshim_status_t dshim_waiter_sleep(dshim_waiter_t *w, dshim_wait_set_t *ws, int timeout_ms)
{
    if (ws->wake_ups && w->is_armed) {
        /* sleep on the wake-up, then look at the sockets without waiting;
         * only briefly when sockets (or a second wake-up) must be watched too */
        int slot = __builtin_ctz(ws->wake_ups);
        int others = ws->by_socket > 0 || (ws->wake_ups & (ws->wake_ups - 1)) != 0;
        /* a failed wait is a short sleep: the caller re-checks its state anyway */
        (void)w->transport[slot]->wait(w->state[slot], w->armed[slot], others ? 1000 : (long)timeout_ms * 1000);
        timeout_ms = 0;
    } else if (ws->wake_ups && timeout_ms > 1) {
        timeout_ms = 1; /* not armed: a wake-up could be missed, so never sleep long */
    }
    dshim_waiter_disarm(w);
    int rc = poll(ws->pfd, (nfds_t)ws->n, timeout_ms);
    if (rc < 0 && errno != EINTR) {
        return dshim_error_quiet(DSHIM_ERR_SYSTEM, "poll failed: %s", strerror(errno));
    }
    for (int i = 0; rc > 0 && i < ws->n; i++) {
        dshim_conn_t *c = ws->conn[i];
        if (!c || !c->ops->wait_arm || !(ws->pfd[i].revents & (POLLIN | POLLHUP | POLLERR))) {
            continue;
        }
        if (control_socket_closed(c)) {
            /* a peer that died may still have left data: only fail once the
             * caller saw no progress (it did: that is why it sleeps) */
            char who[64];
            dshim_conn_peer_name(c, who, sizeof(who));
            return dshim_error_quiet(DSHIM_ERR_PEER, "%s closed its connection (it exited, crashed or was killed)",
                                     who);
        }
    }
    return DSHIM_OK;
}

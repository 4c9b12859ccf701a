/*
 * libFuzzer target: the rendezvous store server (base/store_server.c)
 * reading what clients send: HELLO, then requests (docs/wire-protocol.md §1).
 *
 * The server's own per-connection state machine is driven, on the calling
 * thread, over socketpairs: the fuzz input is the byte stream of up to
 * FUZZ_CONNS clients, so a GET parked on one connection can be answered (or
 * failed) by a SET on another.  Input format, repeated to the end:
 *     u8 connection (mod FUZZ_CONNS)   u16 length (little-endian)   bytes
 * Each record's bytes are written to that client's socket and the server
 * reads and answers what it can; at the end every client closes, parked
 * GETs time out, and everything is freed (leaks are reported by LSan).
 * The poll loop and accept (dshim_store_server_main, accept_all) are not run: they move
 * bytes, they do not parse them.
 */
#include "store_server.c"

#include <sys/ioctl.h>

#include "fuzz_common.h"

#define FUZZ_CONNS 3
#define FUZZ_TOKEN "fuzz-token"

static dshim_store_server_t *fuzz_server_new(void)
{
    dshim_store_server_t *srv = calloc(1, sizeof(*srv));
    srv->listen_fd = srv->wake_fd = -1;
    srv->nbuckets = 64;
    srv->buckets = calloc(srv->nbuckets, sizeof(*srv->buckets));
    srv->token_len = strlen(FUZZ_TOKEN);
    srv->token = malloc(srv->token_len);
    memcpy(srv->token, FUZZ_TOKEN, srv->token_len);
    srv->cap_conns = FUZZ_CONNS;
    srv->conns = calloc(FUZZ_CONNS, sizeof(*srv->conns));
    return srv;
}

/* What dshim_store_server_stop frees, without the thread it joins. */
static void fuzz_server_free(dshim_store_server_t *srv)
{
    for (size_t i = 0; i < srv->nconns; i++) {
        dshim_store_conn_free(srv->conns[i]);
    }
    free(srv->conns);
    free(srv->pfds);
    dshim_store_kv_free_all(srv);
    free(srv->token);
    free(srv);
}

/* As accept_all sets up a connection; the server owns fds[0]. */
static conn_t *fuzz_conn_new(dshim_store_server_t *srv, int fd, int i)
{
    conn_t *c = calloc(1, sizeof(*c));
    c->fd = fd;
    c->state = CONN_HELLO;
    c->deadline = dshim_store_now() + DSHIM_STORE_HELLO_TIMEOUT_S;
    snprintf(c->peer, sizeof(c->peer), "fuzz-client-%d", i);
    message_reset(c);
    srv->conns[srv->nconns++] = c;
    return c;
}

static size_t unread(int fd)
{
    int n = 0;
    if (ioctl(fd, FIONREAD, &n) < 0) {
        return 0;
    }
    return (size_t)n;
}

/* Lets the server take every byte waiting on every connection and answer;
 * the clients read the answers.  Bounded: a server that stops making
 * progress must not hang the run (that would be the bug to find). */
static void pump(dshim_store_server_t *srv, const int *client, int eof)
{
    for (int round = 0; round < 10000; round++) {
        int busy = 0;
        for (size_t i = 0; i < srv->nconns; i++) {
            conn_t *c = srv->conns[i];
            fuzz_drain(client[i]);
            if (c->dead) {
                continue;
            }
            if (c->out_len > c->out_off) {
                conn_flush(c);
                busy = 1;
                continue;
            }
            /* what poll() would report: data, or the client's end of stream */
            if (c->state != CONN_PARKED && (unread(c->fd) > 0 || eof)) {
                conn_on_events(srv, c, POLLIN | (eof ? POLLRDHUP : 0));
                busy = 1;
            }
        }
        if (!busy) {
            return;
        }
    }
    fprintf(stderr, "fuzz_store: the server kept busy for 10000 rounds\n");
    abort();
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_quiet_logs();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    dshim_store_server_t *srv = fuzz_server_new();
    int client[FUZZ_CONNS];
    for (int i = 0; i < FUZZ_CONNS; i++) {
        int fds[2];
        fuzz_socketpair(fds);
        fuzz_conn_new(srv, fds[0], i);
        client[i] = fds[1];
    }
    size_t off = 0;
    while (off + 3 <= size) {
        int which = data[off] % FUZZ_CONNS;
        size_t len = fuzz_u16(data + off + 1);
        off += 3;
        if (len > size - off) {
            len = size - off;
        }
        /* a record larger than the socket's buffer goes in as it drains */
        size_t done = 0;
        for (int tries = 0; done < len && tries < 1000; tries++) {
            done += fuzz_write_some(client[which], data + off + done, len - done);
            pump(srv, client, 0);
            if (srv->conns[which]->dead || srv->conns[which]->state == CONN_PARKED) {
                break;
            }
        }
        off += len;
    }
    /* parked GETs with a limit run out (as expire() finds at their deadline) */
    expire(srv, dshim_store_now() + 1e7);
    pump(srv, client, 0);
    for (int i = 0; i < FUZZ_CONNS; i++) {
        shutdown(client[i], SHUT_WR);
    }
    pump(srv, client, 1);
    for (int i = 0; i < FUZZ_CONNS; i++) {
        close(client[i]);
    }
    fuzz_server_free(srv);
    return 0;
}

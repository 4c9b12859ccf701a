/*
 * libFuzzer target: the data connection's HELLO check (shim/comm/bootstrap.c,
 * answer_hello, the acceptor's handling of one connection;
 * docs/wire-protocol.md §2), the first bytes a rank reads from any
 * connection to its data listener.
 *
 * The real answer_hello runs on connections to an AF_UNIX listener.  Input
 * format:
 *     u8 size (2 + x mod 7)   u8 rank (x mod size)
 *     the rest, in 24-byte pieces (the last may be shorter): one connection
 *     each (at most FUZZ_MAX_CONNS), its first bytes, then end of stream
 * After the fuzzed connections, the harness connects a valid HELLO for every
 * other rank.  Each queued connection is answered in turn: every other rank
 * must end with exactly one published connection (a valid HELLO for a rank
 * already connected is answered HAVE, never published twice), garbage is
 * rejected, nothing fails, hangs or leaks a descriptor.
 */
#include "bootstrap.c"

#include "fuzz_listener.h"

#define FUZZ_MAX_CONNS 16
#define FUZZ_TOKEN "fuzz-token"
#define FUZZ_PREFIX "c0/"

static int lfd = -1;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_quiet_logs();
    lfd = fuzz_listener_open("bootstrap");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2) {
        return 0;
    }
    dshim_comm_t comm;
    memset(&comm, 0, sizeof(comm));
    comm.size = 2 + data[0] % 7;
    comm.rank = data[1] % comm.size;
    dshim_peer_info_t peers[9];
    dshim_conn_t *conns[9];
    unsigned char state[9];
    memset(peers, 0, sizeof(peers));
    memset(conns, 0, sizeof(conns));
    memset(state, 0, sizeof(state));
    comm.peers = peers;
    comm.conns = conns;
    comm.conn_state = state;
    comm.listen_fd = lfd;
    comm.acceptor_wake = comm.conn_event = -1;
    comm.hello_hash = dshim_token_hash(FUZZ_TOKEN, FUZZ_PREFIX);
    /* tcp only: its connect needs no per-communicator state */
    comm.transports_allowed = 1u << dshim_transport_fallback();
    comm.transport_named = 1;
    pthread_mutex_init(&comm.conn_lock, NULL);

    int clients[FUZZ_MAX_CONNS + 9];
    int nclients = 0;
    for (size_t off = 2; off < size && nclients < FUZZ_MAX_CONNS; off += sizeof(hello_t)) {
        size_t len = size - off < sizeof(hello_t) ? size - off : sizeof(hello_t);
        clients[nclients++] = fuzz_connect_send(data + off, len);
    }
    for (int r = 0; r < comm.size; r++) {
        if (r != comm.rank) {
            hello_t h = {HELLO_MAGIC, HELLO_VERSION, comm.hello_hash, r, comm.size};
            clients[nclients++] = fuzz_connect_send((const uint8_t *)&h, sizeof(h));
        }
    }
    /* every connection is queued already (connect returned): answer each */
    for (int i = 0; i < nclients; i++) {
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) {
            fprintf(stderr, "fuzz_bootstrap: connection %d of %d not queued\n", i, nclients);
            abort();
        }
        answer_hello(&comm, fd);
    }
    for (int r = 0; r < comm.size; r++) {
        int ready = state[r] == DSHIM_CONN_READY;
        if ((r != comm.rank) != ready || (conns[r] != NULL) != ready) {
            fprintf(stderr, "fuzz_bootstrap: rank %d of %d: rank %d has state %d, connection %p\n", comm.rank,
                    comm.size, r, state[r], (void *)conns[r]);
            abort();
        }
        if (conns[r]) {
            conns[r]->ops->destroy(conns[r]);
        }
    }
    fuzz_listener_flush(lfd);
    for (int i = 0; i < nclients; i++) {
        close(clients[i]);
    }
    pthread_mutex_destroy(&comm.conn_lock);
    return 0;
}

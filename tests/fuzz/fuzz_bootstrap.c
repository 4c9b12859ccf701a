/*
 * libFuzzer target: the data mesh's HELLO check (shim/comm/bootstrap.c,
 * accept_peers; docs/wire-protocol.md §2), the first bytes a rank reads from
 * any connection to its data listener.
 *
 * The real accept_peers runs on an AF_UNIX listener.  Input format:
 *     u8 size (2 + x mod 7)   u8 rank (x mod (size - 1): some rank above it)
 *     the rest, in 24-byte pieces (the last may be shorter): one connection
 *     each (at most FUZZ_MAX_CONNS), its first bytes, then end of stream
 * After the fuzzed connections, the harness connects a valid HELLO for every
 * higher rank, so accept_peers always has what it needs to finish: it must
 * return DSHIM_OK with one connection per higher rank, never fail, hang,
 * accept a duplicate, or leak a descriptor.
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
    comm.rank = data[1] % (comm.size - 1);
    dshim_peer_info_t peers[9];
    memset(peers, 0, sizeof(peers));
    comm.peers = peers;
    uint64_t th = dshim_token_hash(FUZZ_TOKEN, FUZZ_PREFIX);

    int clients[FUZZ_MAX_CONNS + 9];
    int nclients = 0;
    for (size_t off = 2; off < size && nclients < FUZZ_MAX_CONNS; off += sizeof(hello_t)) {
        size_t len = size - off < sizeof(hello_t) ? size - off : sizeof(hello_t);
        clients[nclients++] = fuzz_connect_send(data + off, len);
    }
    for (int r = comm.rank + 1; r < comm.size; r++) {
        hello_t h = {HELLO_MAGIC, HELLO_VERSION, th, r, comm.size};
        clients[nclients++] = fuzz_connect_send((const uint8_t *)&h, sizeof(h));
    }

    int fds[9];
    for (int r = 0; r < 9; r++) {
        fds[r] = -1;
    }
    dshim_status_t st = accept_peers(&comm, lfd, th, fds, dshim_now() + 3.0);
    if (st != DSHIM_OK) {
        fprintf(stderr, "fuzz_bootstrap: accept_peers failed although every rank connected: %s\n",
                dshim_last_error());
        abort();
    }
    for (int r = 0; r < comm.size; r++) {
        if ((r > comm.rank) != (fds[r] >= 0)) {
            fprintf(stderr, "fuzz_bootstrap: rank %d of %d: connection of rank %d is %d\n", comm.rank, comm.size, r,
                    fds[r]);
            abort();
        }
        if (fds[r] >= 0) {
            close(fds[r]);
        }
    }
    fuzz_listener_flush(lfd);
    for (int i = 0; i < nclients; i++) {
        close(clients[i]);
    }
    return 0;
}

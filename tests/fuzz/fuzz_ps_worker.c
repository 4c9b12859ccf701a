/*
 * libFuzzer target: a parameter-server worker reading a server's answers
 * (shim/ps/ps_worker.c read_answer; docs/wire-protocol.md §7): REPLY and
 * ERROR headers matched to outstanding requests by seq, their payloads
 * copied into the caller's buffer or skipped.
 *
 * Input format:
 *     u8 n (mod 9): outstanding requests, seq 1..n; request i expects
 *                   16·i bytes into a buffer (a pull) when i is odd, no
 *                   value (a push) when even, and request 3 is a command
 *                   the server may refuse
 *     the rest: the server's byte stream, then end of stream
 * read_answer runs until it reports an error or the stream ends; then the
 * requests left are failed as the receiver does when a server is lost.
 * A buffer is never written past its length (ASan checks every byte).
 */
#include "ps_worker.c"

#include "fuzz_common.h"
#include "fuzz_ps_node.h"

typedef struct fuzz_req {
    uint8_t *buf;
    int done;
} fuzz_req_t;

static void on_done(void *arg, int ok)
{
    (void)ok;
    fuzz_req_t *r = arg;
    if (r->done++) {
        abort();  /* a request completed twice */
    }
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
    if (size < 1) {
        return 0;
    }
    int nreq = data[0] % 9;
    dshim_ps_node_t *node = fuzz_ps_node_new(DSHIM_PS_WORKER, 1, 1);
    node->servers = calloc(1, sizeof(*node->servers));
    snprintf(node->servers[0].host, sizeof(node->servers[0].host), "fuzz-server");
    node->server_fds = malloc(sizeof(int));
    int fds[2];
    fuzz_socketpair(fds);
    node->server_fds[0] = fds[0];
    fuzz_write_some(fds[1], data + 1, size - 1);
    shutdown(fds[1], SHUT_WR);

    fuzz_req_t reqs[9];
    memset(reqs, 0, sizeof(reqs));
    for (int i = 1; i <= nreq; i++) {
        size_t len = (i % 2) ? 16u * (size_t)i : 0;
        reqs[i - 1].buf = len ? malloc(len) : NULL;
        uint32_t seq = 0;
        add_pending(node, 0, reqs[i - 1].buf, len, on_done, &reqs[i - 1], &seq);
        if (i == 3) {
            mark_refusable(node, 0, seq);
        }
    }
    for (int msgs = 0; msgs < 100000 && read_answer(node, 0) == DSHIM_OK; msgs++) {
    }
    fail_all(node, "fuzz: the server's stream ended");
    for (int i = 0; i < nreq; i++) {
        if (reqs[i].done != 1) {
            abort();  /* every request ends exactly once */
        }
        free(reqs[i].buf);
    }
    close(fds[0]);
    close(fds[1]);
    node->server_fds[0] = -1;
    fuzz_ps_node_free(node);
    return 0;
}

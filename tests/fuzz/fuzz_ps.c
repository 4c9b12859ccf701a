/*
 * libFuzzer target: a parameter server reading a worker's data connection
 * (shim/ps/ps_server*.c; docs/wire-protocol.md §7): the WHELLO that
 * accept_worker checks, then the 40-byte headers and payloads that
 * handle_message decodes (PUSH whole, in pieces, 2-bit, rows; PULL; CMD;
 * BYE) in the server's own state (keys, rounds, pieces).
 *
 * Input format:
 *     u8 flags: bit 0 sync mode (else async), bit 1 two workers (else one)
 *     the rest: the worker's byte stream, then end of stream
 * The real accept_worker takes the connection from an AF_UNIX listener and
 * handle_message runs until the stream ends, an error, or a stop; a thread
 * reads the server's answers as a worker's receiver would.  The teardown is
 * dshim_ps_server_run's.
 */
#include "ps_server.c"

#include "fuzz_listener.h"
#include "fuzz_ps_node.h"

static int lfd = -1;

/* The key allocator is the embedding's (MXNet's NDArrays through the hook's
 * ops); here it refuses keys over FUZZ_KEY_BYTES_MAX, as a real one refuses
 * what does not fit.  A row_sparse key is declared by its shape, not sent, so
 * without a cap the fuzzer would only measure this machine's memory. */
#define FUZZ_KEY_BYTES_MAX (256u << 10)

static void *fuzz_alloc(void *ctx, size_t n, int dtype, void **cookie)
{
    size_t es = dshim_ps_dtype_size(dtype);
    if (es == 0 || n > FUZZ_KEY_BYTES_MAX / es) {
        *cookie = NULL;
        return NULL;
    }
    return plain_alloc(ctx, n, dtype, cookie);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_quiet_logs();
    lfd = fuzz_listener_open("ps");
    return 0;
}

/* The worker's receiving side: reads answers until the server closes. */
static void *drain_main(void *arg)
{
    int fd = *(int *)arg;
    uint8_t buf[65536];
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 5000) <= 0) {
            return NULL;
        }
        ssize_t n = recv(fd, buf, sizeof(buf), 0);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
            return NULL;
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) {
        return 0;
    }
    int nw = (data[0] & 2) ? 2 : 1;
    dshim_ps_node_t *node = fuzz_ps_node_new(DSHIM_PS_SERVER, nw, 1);
    node->listen_fd = lfd;
    /* dshim_ps_server_run's set-up, plain ops (no MXNet) but a bounded allocator */
    dshim_ps_server_ops_t ops = {.alloc = fuzz_alloc, .release = plain_release, .wait = plain_wait,
                                 .has_updater = plain_has_updater};
    server_t s;
    if (server_init(&s, node, &ops) != 0) {
        abort();
    }
    s.sync_mode = data[0] & 1;

    int client = fuzz_connect_send(data + 1, size - 1);
    pthread_t drainer;
    pthread_create(&drainer, NULL, drain_main, &client);
    accept_worker(&s);
    int w = -1;
    for (int i = 0; i < nw; i++) {
        if (s.worker_fds[i] >= 0) {
            w = i;
        }
    }
    dshim_status_t st = DSHIM_OK;
    for (int msgs = 0; w >= 0 && s.worker_fds[w] >= 0 && !s.stop && st == DSHIM_OK && msgs < 100000; msgs++) {
        st = handle_message(&s, w);
    }
    server_free(&s);  /* closes the server's end: the drainer sees the end */
    pthread_join(drainer, NULL);
    close(client);
    fuzz_listener_flush(lfd);
    fuzz_ps_node_free(node);
    return 0;
}

/*
 * libFuzzer target: the rendezvous store client (base/store_client.c)
 * reading what a server answers: the HELLO ACK, then REPLY frames
 * (docs/wire-protocol.md §1).
 *
 * A fake server end of a socketpair holds the fuzz bytes, then closes, so
 * every read ends (data or end of stream) and nothing waits on a clock.
 * Input format:
 *     u8 n (mod 9)   n bytes: the calls the client makes, in order (mod 6:
 *                    set, get, try_get, add, set_if_absent, delete)
 *     the rest: the server's byte stream (ACK, then replies)
 * The client runs its real hello() and public calls; seq numbers count from 1
 * as in a real connection.  Every call must return (an error is fine), never
 * crash or leak, and a retired connection must refuse the calls after it.
 */
#include "store_client.c"

#include "fuzz_common.h"

#define FUZZ_TOKEN "fuzz-token"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_quiet_logs();
    return 0;
}

static void call(dshim_store_t *s, int op)
{
    void *val = NULL;
    size_t len = 0;
    int64_t sum = 0;
    int won = 0;
    dshim_status_t st = DSHIM_OK;
    switch (op % 6) {
    case 0:
        st = dshim_store_set(s, "fuzz/key", "value", 5);
        break;
    case 1:
        st = dshim_store_get(s, "fuzz/key", 1.0, &val, &len);
        break;
    case 2:
        st = dshim_store_try_get(s, "fuzz/key", &val, &len);
        break;
    case 3:
        st = dshim_store_add(s, "fuzz/counter", 7, &sum);
        break;
    case 4:
        st = dshim_store_set_if_absent(s, "fuzz/key", "v", 1, &won);
        break;
    default:
        st = dshim_store_delete(s, "fuzz/key");
        break;
    }
    if (st == DSHIM_OK && val != NULL && ((const char *)val)[len] != '\0') {
        abort();  /* values are promised NUL-terminated */
    }
    if (st != DSHIM_OK && val != NULL) {
        abort();  /* a failed call must not hand out a value */
    }
    free(val);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) {
        return 0;
    }
    size_t nops = data[0] % 9;
    if (size < 1 + nops) {
        return 0;
    }
    const uint8_t *ops = data + 1;
    const uint8_t *stream = data + 1 + nops;
    size_t stream_len = size - 1 - nops;

    int fds[2];
    fuzz_socketpair(fds);
    /* the socket buffer holds the whole stream: inputs are far below it */
    fuzz_write_some(fds[1], stream, stream_len);
    shutdown(fds[1], SHUT_WR);

    /* what dshim_store_connect sets up once its TCP connection is made */
    dshim_store_t *s = calloc(1, sizeof(*s));
    pthread_mutex_init(&s->mu, NULL);
    s->fd = fds[0];
    s->op_timeout_s = 5.0;
    snprintf(s->where, sizeof(s->where), "fuzz-server:1");
    if (hello(s, FUZZ_TOKEN, dshim_store_now() + 5.0) == DSHIM_OK) {
        for (size_t i = 0; i < nops; i++) {
            int was_broken = s->broken;
            call(s, ops[i]);
            if (was_broken && !s->broken) {
                abort();  /* a retired connection never comes back */
            }
        }
    }
    dshim_store_close(s);
    close(fds[1]);
    return 0;
}

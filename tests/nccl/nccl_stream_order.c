/*
 * The NCCL hook's CUDA executor without a GPU, over tests/nccl/fake_cuda.c:
 * two ranks in one process (ncclCommInitAll) run allreduces and broadcasts
 * on "device" buffers, staged through pinned memory by the communicators'
 * proxy threads, and the test thread then waits for each stream with
 * cudaStreamSynchronize -- which, as the real driver did on the H200, holds
 * the driver's lock while the stream waits for the proxy.  Checked: every
 * result, no hang (a CUDA call on the proxy thread would deadlock here), and
 * no CUDA call from any thread but the test's and the streams'.  Ops of one
 * communicator alternate between two streams, so their marks are ordered
 * across streams; large ones run in chunks (DSHIM_NCCL_STAGE_CHUNK).
 *
 * usage: nccl_stream_order   (DSHIM_NCCL_IPC=0; DSHIM_NCCL_STREAM_WAIT as
 * the test sets it: memory operations or host functions)
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include "fake_cuda.h"

#define K 2       /* ranks */
#define ROUNDS 8
#define FAIL(...)                                                                                                 \
    do {                                                                                                          \
        fprintf(stderr, "FAIL: " __VA_ARGS__);                                                                    \
        fputc('\n', stderr);                                                                                      \
        exit(1);                                                                                                  \
    } while (0)
#define NCCLOK(call)                                                                                              \
    do {                                                                                                          \
        ncclResult_t r_ = (call);                                                                                 \
        if (r_ != ncclSuccess) {                                                                                  \
            FAIL("%s: %s (%s)", #call, ncclGetErrorString(r_), ncclGetLastError(NULL));                           \
        }                                                                                                         \
    } while (0)
#define CUDAOK(call)                                                                                              \
    do {                                                                                                          \
        if ((call) != cudaSuccess) {                                                                              \
            FAIL("%s failed", #call);                                                                             \
        }                                                                                                         \
    } while (0)

static void on_alarm(int sig)
{
    (void)sig;
    static const char msg[] = "FAIL: no progress in 60 s: a stream waits for a proxy that waits for the driver\n";
    if (write(2, msg, sizeof(msg) - 1) < 0) {
        _exit(2);
    }
    _exit(1);
}

int main(void)
{
    signal(SIGALRM, on_alarm);
    alarm(60);
    fake_cuda_allow_thread();
    ncclComm_t comms[K];
    int devs[K] = {0, 0};
    NCCLOK(ncclCommInitAll(comms, K, devs));
    cudaStream_t streams[K][2];
    /* 1001 floats: one batch; 3 Mi floats (12 MiB): chunks of the default 4 MiB */
    const size_t counts[2] = {1001, (size_t)3 << 20};
    float *bufs[K][2];
    for (int k = 0; k < K; k++) {
        for (int j = 0; j < 2; j++) {
            CUDAOK(cudaStreamCreate(&streams[k][j]));
            CUDAOK(cudaMalloc((void **)&bufs[k][j], counts[j] * sizeof(float)));
        }
    }
    for (int round = 0; round < ROUNDS; round++) {
        /* the fake's device memory is host memory: the test writes it directly */
        for (int k = 0; k < K; k++) {
            for (int j = 0; j < 2; j++) {
                for (size_t i = 0; i < counts[j]; i++) {
                    bufs[k][j][i] = (float)(k + 1 + round) + (float)(i % 7);
                }
            }
        }
        /* both buffers of a rank, one after the other, each on its own
         * stream (no wait between): an allreduce, or a broadcast from rank 1;
         * in a group (a batch of two ops per communicator) or call by call
         * (one op per batch: the large one in chunks) -- the calls return at
         * once either way, the streams wait */
        const int grouped = round % 2 == 0;
        if (grouped) {
            NCCLOK(ncclGroupStart());
        }
        for (int k = 0; k < K; k++) {
            for (int j = 0; j < 2; j++) {
                cudaStream_t s = streams[k][(j + round) % 2];
                if (round % 3 == 2) {
                    NCCLOK(ncclBroadcast(bufs[k][j], bufs[k][j], counts[j], ncclFloat32, 1, comms[k], s));
                } else {
                    NCCLOK(ncclAllReduce(bufs[k][j], bufs[k][j], counts[j], ncclFloat32, ncclSum, comms[k], s));
                }
            }
        }
        if (grouped) {
            NCCLOK(ncclGroupEnd());
        }
        /* as torch's blocking copy of a result: waits holding the driver's lock */
        for (int k = 0; k < K; k++) {
            CUDAOK(cudaStreamSynchronize(streams[k][0]));
            CUDAOK(cudaStreamSynchronize(streams[k][1]));
        }
        for (int k = 0; k < K; k++) {
            for (int j = 0; j < 2; j++) {
                for (size_t i = 0; i < counts[j]; i++) {
                    float want = round % 3 == 2 ? (float)(2 + round) + (float)(i % 7)
                                                : (float)(3 + 2 * round) + 2.0f * (float)(i % 7);
                    if (bufs[k][j][i] != want) {
                        FAIL("round %d rank %d buffer %d element %zu: %g, want %g", round, k, j, i,
                             (double)bufs[k][j][i], (double)want);
                    }
                }
            }
        }
    }
    int foreign = fake_cuda_foreign_calls();
    if (foreign) {
        FAIL("%d CUDA call(s) from a thread of dshim's (the CUDA executor's proxy must make none)", foreign);
    }
    for (int k = 0; k < K; k++) {
        NCCLOK(ncclCommDestroy(comms[k]));
    }
    printf("nccl_stream_order: %d rounds of allreduce/broadcast on 2 streams per rank, staged, no CUDA call "
           "off the test's and the streams' threads: ok\n", ROUNDS);
    return 0;
}

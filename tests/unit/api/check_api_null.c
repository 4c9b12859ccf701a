/*
 * Every public function of include/dshim.h with each pointer argument NULL in
 * turn (dshim_comm_stats(NULL, NULL) and dshim_config_get with a NULL name or
 * buffer once crashed).  A NULL the header does not allow
 * must give the documented error (DSHIM_ERR_INVALID, -1 or NULL), never a
 * crash; a NULL it allows (the header says "may be NULL") must work.
 *
 * One table row per call (CASES below); each row runs as its own Check test
 * in a forked child (loop test), so a crash fails that row by name instead
 * of the whole binary.  Rows that need a communicator get a fresh one of one
 * rank (its store on a free loopback port).  A crash is reported as
 * "test_null_argument:N: Received signal": N is the row's place in CASES
 * (from 0).
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ck_free_port.h"
#include "dshim.h"

/* What a row needs before its call. */
enum { NONE = 0, COMM = 1, REQ = 2, ENV = 3 };

/* The row's outcome, folded into a status: the call's own status, or for
 * functions of other types DSHIM_ERR_INVALID when they gave their error
 * value and DSHIM_OK when they returned normally. */
#define VOID_OK(call) ((call), DSHIM_OK)
#define INT_ERR(call) ((call) == -1 ? DSHIM_ERR_INVALID : DSHIM_OK)
#define PTR_ERR(call) ((call) == NULL ? DSHIM_ERR_INVALID : DSHIM_OK)

#define INV DSHIM_ERR_INVALID
#define OK  DSHIM_OK
#define F32 DSHIM_FLOAT32

/* X(name, needs, expected, expression) */
#define CASES(X)                                                                                              \
    /* communicators */                                                                                        \
    X(init_env_comm_p, ENV, INV, dshim_comm_init_env(NULL))                                                    \
    X(init_args, NONE, INV, dshim_comm_init(NULL, &out))                                                       \
    X(init_comm_p, NONE, INV, dshim_comm_init(&args, NULL))                                                    \
    X(init_store_addr, NONE, INV, dshim_comm_init(&args_no_addr, &out))                                        \
    X(prebind_port_p, NONE, INV, dshim_store_prebind(0, "t", NULL))                                            \
    X(prebind_at_port_p, NONE, INV, dshim_store_prebind_at("127.0.0.1", 0, "t", NULL))                         \
    X(host_address_reach, NONE, OK, dshim_host_address(NULL, msg, sizeof(msg)))                               \
    X(host_address_buf, NONE, INV, dshim_host_address("127.0.0.1", NULL, 16))                                  \
    X(split_comm, NONE, INV, dshim_comm_split(NULL, 0, 0, &out))                                               \
    X(split_newcomm_p, COMM, INV, dshim_comm_split(c, 0, 0, NULL))                                             \
    X(destroy_comm, NONE, OK, dshim_comm_destroy(NULL))                                                        \
    X(abort_comm, NONE, INV, dshim_comm_abort(NULL, "why"))                                                    \
    X(abort_reason, COMM, OK, dshim_comm_abort(c, NULL))                                                       \
    X(set_timeout_comm, NONE, INV, dshim_comm_set_timeout(NULL, 1.0))                                          \
    X(set_desc_comm, NONE, INV, dshim_comm_set_desc(NULL, "d"))                                                \
    X(set_desc_desc, COMM, OK, dshim_comm_set_desc(c, NULL))                                                   \
    X(rank_comm, NONE, INV, INT_ERR(dshim_comm_rank(NULL)))                                                    \
    X(size_comm, NONE, INV, INT_ERR(dshim_comm_size(NULL)))                                                    \
    X(transport_comm, NONE, OK, PTR_ERR(dshim_comm_transport(NULL)))                                           \
    X(get_error_comm, NONE, INV, dshim_comm_get_error(NULL, msg, sizeof(msg)))                                 \
    X(get_error_msg, COMM, OK, dshim_comm_get_error(c, NULL, 16))                                              \
    X(get_missing_comm, NONE, INV, dshim_comm_get_missing(NULL, &(uint64_t){0}, &src, 1, &done))               \
    X(get_missing_seq, COMM, INV, dshim_comm_get_missing(c, NULL, &src, 1, &done))                             \
    X(get_missing_ranks, COMM, INV, dshim_comm_get_missing(c, &(uint64_t){0}, NULL, 1, &done))                 \
    X(get_missing_no_room, COMM, OK, dshim_comm_get_missing(c, &(uint64_t){0}, NULL, 0, &done))                \
    X(get_missing_count, COMM, INV, dshim_comm_get_missing(c, &(uint64_t){0}, &src, 1, NULL))                  \
    X(stats_both, NONE, OK, VOID_OK(dshim_comm_stats(NULL, NULL)))                                             \
    X(stats_comm, NONE, OK, VOID_OK(dshim_comm_stats(NULL, &stats)))                                           \
    X(stats_stats, COMM, OK, VOID_OK(dshim_comm_stats(c, NULL)))                                               \
    /* requests */                                                                                             \
    X(test_req, NONE, INV, dshim_test(NULL, &done))                                                            \
    X(test_done_p, REQ, INV, dshim_test(req, NULL))                                                            \
    X(wait_req, NONE, INV, dshim_wait(NULL))                                                                   \
    X(request_free_req, NONE, OK, VOID_OK(dshim_request_free(NULL)))                                           \
    X(request_source_req, NONE, INV, dshim_request_source(NULL, &src))                                         \
    X(request_source_source_p, REQ, INV, dshim_request_source(req, NULL))                                      \
    /* collectives: the communicator, each buffer (count 1), each array, req_p */                              \
    X(allreduce_comm, NONE, INV, dshim_allreduce(NULL, sb, rb, 1, F32, DSHIM_SUM))                             \
    X(allreduce_send, COMM, INV, dshim_allreduce(c, NULL, rb, 1, F32, DSHIM_SUM))                              \
    X(allreduce_recv, COMM, INV, dshim_allreduce(c, sb, NULL, 1, F32, DSHIM_SUM))                              \
    X(allreduce_count0, COMM, OK, dshim_allreduce(c, NULL, NULL, 0, F32, DSHIM_SUM))                           \
    X(iallreduce_comm, NONE, INV, dshim_iallreduce(NULL, sb, rb, 1, F32, DSHIM_SUM, &req))                     \
    X(iallreduce_send, COMM, INV, dshim_iallreduce(c, NULL, rb, 1, F32, DSHIM_SUM, &req))                      \
    X(iallreduce_recv, COMM, INV, dshim_iallreduce(c, sb, NULL, 1, F32, DSHIM_SUM, &req))                      \
    X(iallreduce_req_p, COMM, INV, dshim_iallreduce(c, sb, rb, 1, F32, DSHIM_SUM, NULL))                       \
    X(broadcast_comm, NONE, INV, dshim_broadcast(NULL, rb, 1, F32, 0))                                         \
    X(broadcast_buf, COMM, INV, dshim_broadcast(c, NULL, 1, F32, 0))                                           \
    X(ibroadcast_comm, NONE, INV, dshim_ibroadcast(NULL, rb, 1, F32, 0, &req))                                 \
    X(ibroadcast_buf, COMM, INV, dshim_ibroadcast(c, NULL, 1, F32, 0, &req))                                   \
    X(ibroadcast_req_p, COMM, INV, dshim_ibroadcast(c, rb, 1, F32, 0, NULL))                                   \
    X(reduce_comm, NONE, INV, dshim_reduce(NULL, sb, rb, 1, F32, DSHIM_SUM, 0))                                \
    X(reduce_send, COMM, INV, dshim_reduce(c, NULL, rb, 1, F32, DSHIM_SUM, 0))                                 \
    X(reduce_recv_root, COMM, INV, dshim_reduce(c, sb, NULL, 1, F32, DSHIM_SUM, 0))                            \
    X(ireduce_comm, NONE, INV, dshim_ireduce(NULL, sb, rb, 1, F32, DSHIM_SUM, 0, &req))                        \
    X(ireduce_send, COMM, INV, dshim_ireduce(c, NULL, rb, 1, F32, DSHIM_SUM, 0, &req))                         \
    X(ireduce_recv_root, COMM, INV, dshim_ireduce(c, sb, NULL, 1, F32, DSHIM_SUM, 0, &req))                    \
    X(ireduce_req_p, COMM, INV, dshim_ireduce(c, sb, rb, 1, F32, DSHIM_SUM, 0, NULL))                          \
    X(allgather_comm, NONE, INV, dshim_allgather(NULL, sb, rb, 1, F32))                                        \
    X(allgather_send, COMM, INV, dshim_allgather(c, NULL, rb, 1, F32))                                         \
    X(allgather_recv, COMM, INV, dshim_allgather(c, sb, NULL, 1, F32))                                         \
    X(iallgather_comm, NONE, INV, dshim_iallgather(NULL, sb, rb, 1, F32, &req))                                \
    X(iallgather_send, COMM, INV, dshim_iallgather(c, NULL, rb, 1, F32, &req))                                 \
    X(iallgather_recv, COMM, INV, dshim_iallgather(c, sb, NULL, 1, F32, &req))                                 \
    X(iallgather_req_p, COMM, INV, dshim_iallgather(c, sb, rb, 1, F32, NULL))                                  \
    X(allgatherv_comm, NONE, INV, dshim_allgatherv(NULL, sb, rb, counts, displs, F32))                         \
    X(allgatherv_send, COMM, INV, dshim_allgatherv(c, NULL, rb, counts, displs, F32))                          \
    X(allgatherv_recv, COMM, INV, dshim_allgatherv(c, sb, NULL, counts, displs, F32))                          \
    X(allgatherv_counts, COMM, INV, dshim_allgatherv(c, sb, rb, NULL, displs, F32))                            \
    X(allgatherv_displs, COMM, INV, dshim_allgatherv(c, sb, rb, counts, NULL, F32))                             \
    X(iallgatherv_comm, NONE, INV, dshim_iallgatherv(NULL, sb, rb, counts, displs, F32, &req))                 \
    X(iallgatherv_send, COMM, INV, dshim_iallgatherv(c, NULL, rb, counts, displs, F32, &req))                  \
    X(iallgatherv_recv, COMM, INV, dshim_iallgatherv(c, sb, NULL, counts, displs, F32, &req))                  \
    X(iallgatherv_counts, COMM, INV, dshim_iallgatherv(c, sb, rb, NULL, displs, F32, &req))                    \
    X(iallgatherv_req_p, COMM, INV, dshim_iallgatherv(c, sb, rb, counts, displs, F32, NULL))                   \
    X(reduce_scatter_comm, NONE, INV, dshim_reduce_scatter(NULL, sb, rb, 1, F32, DSHIM_SUM))                   \
    X(reduce_scatter_send, COMM, INV, dshim_reduce_scatter(c, NULL, rb, 1, F32, DSHIM_SUM))                    \
    X(reduce_scatter_recv, COMM, INV, dshim_reduce_scatter(c, sb, NULL, 1, F32, DSHIM_SUM))                    \
    X(ireduce_scatter_comm, NONE, INV, dshim_ireduce_scatter(NULL, sb, rb, 1, F32, DSHIM_SUM, &req))           \
    X(ireduce_scatter_send, COMM, INV, dshim_ireduce_scatter(c, NULL, rb, 1, F32, DSHIM_SUM, &req))            \
    X(ireduce_scatter_recv, COMM, INV, dshim_ireduce_scatter(c, sb, NULL, 1, F32, DSHIM_SUM, &req))            \
    X(ireduce_scatter_req_p, COMM, INV, dshim_ireduce_scatter(c, sb, rb, 1, F32, DSHIM_SUM, NULL))             \
    X(reduce_scatterv_comm, NONE, INV, dshim_reduce_scatterv(NULL, sb, rb, counts, F32, DSHIM_SUM))            \
    X(reduce_scatterv_send, COMM, INV, dshim_reduce_scatterv(c, NULL, rb, counts, F32, DSHIM_SUM))             \
    X(reduce_scatterv_recv, COMM, INV, dshim_reduce_scatterv(c, sb, NULL, counts, F32, DSHIM_SUM))             \
    X(reduce_scatterv_counts, COMM, INV, dshim_reduce_scatterv(c, sb, rb, NULL, F32, DSHIM_SUM))               \
    X(ireduce_scatterv_comm, NONE, INV, dshim_ireduce_scatterv(NULL, sb, rb, counts, F32, DSHIM_SUM, &req))    \
    X(ireduce_scatterv_send, COMM, INV, dshim_ireduce_scatterv(c, NULL, rb, counts, F32, DSHIM_SUM, &req))     \
    X(ireduce_scatterv_recv, COMM, INV, dshim_ireduce_scatterv(c, sb, NULL, counts, F32, DSHIM_SUM, &req))     \
    X(ireduce_scatterv_counts, COMM, INV, dshim_ireduce_scatterv(c, sb, rb, NULL, F32, DSHIM_SUM, &req))       \
    X(ireduce_scatterv_req_p, COMM, INV, dshim_ireduce_scatterv(c, sb, rb, counts, F32, DSHIM_SUM, NULL))      \
    X(alltoall_comm, NONE, INV, dshim_alltoall(NULL, sb, rb, 1, F32))                                          \
    X(alltoall_send, COMM, INV, dshim_alltoall(c, NULL, rb, 1, F32))                                           \
    X(alltoall_recv, COMM, INV, dshim_alltoall(c, sb, NULL, 1, F32))                                           \
    X(ialltoall_comm, NONE, INV, dshim_ialltoall(NULL, sb, rb, 1, F32, &req))                                  \
    X(ialltoall_send, COMM, INV, dshim_ialltoall(c, NULL, rb, 1, F32, &req))                                   \
    X(ialltoall_recv, COMM, INV, dshim_ialltoall(c, sb, NULL, 1, F32, &req))                                   \
    X(ialltoall_req_p, COMM, INV, dshim_ialltoall(c, sb, rb, 1, F32, NULL))                                    \
    X(alltoallv_comm, NONE, INV, dshim_alltoallv(NULL, sb, counts, displs, rb, counts, displs, F32))           \
    X(alltoallv_send, COMM, INV, dshim_alltoallv(c, NULL, counts, displs, rb, counts, displs, F32))            \
    X(alltoallv_sendcounts, COMM, INV, dshim_alltoallv(c, sb, NULL, displs, rb, counts, displs, F32))          \
    X(alltoallv_sdispls, COMM, INV, dshim_alltoallv(c, sb, counts, NULL, rb, counts, displs, F32))             \
    X(alltoallv_recv, COMM, INV, dshim_alltoallv(c, sb, counts, displs, NULL, counts, displs, F32))            \
    X(alltoallv_recvcounts, COMM, INV, dshim_alltoallv(c, sb, counts, displs, rb, NULL, displs, F32))          \
    X(alltoallv_rdispls, COMM, INV, dshim_alltoallv(c, sb, counts, displs, rb, counts, NULL, F32))             \
    X(ialltoallv_comm, NONE, INV, dshim_ialltoallv(NULL, sb, counts, displs, rb, counts, displs, F32, &req))   \
    X(ialltoallv_send, COMM, INV, dshim_ialltoallv(c, NULL, counts, displs, rb, counts, displs, F32, &req))    \
    X(ialltoallv_sendcounts, COMM, INV, dshim_ialltoallv(c, sb, NULL, displs, rb, counts, displs, F32, &req))  \
    X(ialltoallv_sdispls, COMM, INV, dshim_ialltoallv(c, sb, counts, NULL, rb, counts, displs, F32, &req))     \
    X(ialltoallv_recv, COMM, INV, dshim_ialltoallv(c, sb, counts, displs, NULL, counts, displs, F32, &req))    \
    X(ialltoallv_recvcounts, COMM, INV, dshim_ialltoallv(c, sb, counts, displs, rb, NULL, displs, F32, &req))  \
    X(ialltoallv_rdispls, COMM, INV, dshim_ialltoallv(c, sb, counts, displs, rb, counts, NULL, F32, &req))     \
    X(ialltoallv_req_p, COMM, INV, dshim_ialltoallv(c, sb, counts, displs, rb, counts, displs, F32, NULL))     \
    X(gather_comm, NONE, INV, dshim_gather(NULL, sb, rb, 1, F32, 0))                                           \
    X(gather_send, COMM, INV, dshim_gather(c, NULL, rb, 1, F32, 0))                                            \
    X(gather_recv_root, COMM, INV, dshim_gather(c, sb, NULL, 1, F32, 0))                                       \
    X(igather_comm, NONE, INV, dshim_igather(NULL, sb, rb, 1, F32, 0, &req))                                   \
    X(igather_send, COMM, INV, dshim_igather(c, NULL, rb, 1, F32, 0, &req))                                    \
    X(igather_recv_root, COMM, INV, dshim_igather(c, sb, NULL, 1, F32, 0, &req))                               \
    X(igather_req_p, COMM, INV, dshim_igather(c, sb, rb, 1, F32, 0, NULL))                                     \
    X(scatter_comm, NONE, INV, dshim_scatter(NULL, sb, rb, 1, F32, 0))                                         \
    X(scatter_send_root, COMM, INV, dshim_scatter(c, NULL, rb, 1, F32, 0))                                     \
    X(scatter_recv, COMM, INV, dshim_scatter(c, sb, NULL, 1, F32, 0))                                          \
    X(iscatter_comm, NONE, INV, dshim_iscatter(NULL, sb, rb, 1, F32, 0, &req))                                 \
    X(iscatter_send_root, COMM, INV, dshim_iscatter(c, NULL, rb, 1, F32, 0, &req))                             \
    X(iscatter_recv, COMM, INV, dshim_iscatter(c, sb, NULL, 1, F32, 0, &req))                                  \
    X(iscatter_req_p, COMM, INV, dshim_iscatter(c, sb, rb, 1, F32, 0, NULL))                                   \
    /* point to point (a one-rank communicator: the comm and req_p rows) */                                    \
    X(send_comm, NONE, INV, dshim_send(NULL, sb, 1, F32, 1))                                                   \
    X(isend_comm, NONE, INV, dshim_isend(NULL, sb, 1, F32, 1, &req))                                           \
    X(isend_req_p, COMM, INV, dshim_isend(c, sb, 1, F32, 1, NULL))                                             \
    X(recv_comm, NONE, INV, dshim_recv(NULL, rb, 1, F32, 1))                                                   \
    X(irecv_comm, NONE, INV, dshim_irecv(NULL, rb, 1, F32, 1, &req))                                           \
    X(irecv_req_p, COMM, INV, dshim_irecv(c, rb, 1, F32, 1, NULL))                                             \
    X(recv_any_comm, NONE, INV, dshim_recv_any(NULL, rb, 1, F32, &src))                                        \
    X(irecv_any_comm, NONE, INV, dshim_irecv_any(NULL, rb, 1, F32, &src, &req))                                \
    X(irecv_any_req_p, COMM, INV, dshim_irecv_any(c, rb, 1, F32, &src, NULL))                                  \
    X(barrier_comm, NONE, INV, dshim_barrier(NULL))                                                            \
    X(ibarrier_comm, NONE, INV, dshim_ibarrier(NULL, &req))                                                    \
    X(ibarrier_req_p, COMM, INV, dshim_ibarrier(c, NULL))                                                      \
    /* configuration */                                                                                        \
    X(print_config_file, NONE, OK, VOID_OK(dshim_print_config(NULL)))                                          \
    X(config_get_name, NONE, INV, INT_ERR(dshim_config_get(NULL, msg, sizeof(msg))))                           \
    X(config_get_buf, NONE, INV, INT_ERR(dshim_config_get("DSHIM_TIMEOUT", NULL, 16)))                         \
    X(config_get_both, NONE, INV, INT_ERR(dshim_config_get(NULL, NULL, 0)))                                    \
    X(config_cur_name, NONE, INV, INT_ERR(dshim_config_get_current(NULL, msg, sizeof(msg))))                   \
    X(config_cur_buf, NONE, INV, INT_ERR(dshim_config_get_current("DSHIM_TIMEOUT", NULL, 16)))                 \
    /* device buffers (this machine may have no CUDA: the NULL check comes first) */                           \
    X(gpu_stage_get_host_p, NONE, INV, PTR_ERR(dshim_gpu_stage_get(16, NULL)))                                 \
    X(gpu_stage_put_block, NONE, OK, VOID_OK(dshim_gpu_stage_put(NULL)))                                       \
    X(gpu_copy_async_dst, NONE, INV, dshim_gpu_copy_async(NULL, sb, 4, 0, NULL))                               \
    X(gpu_copy_async_src, NONE, INV, dshim_gpu_copy_async(rb, NULL, 4, 0, NULL))                               \
    X(scale_mul_comm, NONE, INV, dshim_scale_mul(NULL, rb, sb, 1, F32, &scalar))                               \
    X(scale_mul_dst, COMM, INV, dshim_scale_mul(c, NULL, sb, 1, F32, &scalar))                                 \
    X(scale_mul_src, COMM, INV, dshim_scale_mul(c, rb, NULL, 1, F32, &scalar))                                 \
    X(scale_mul_scalar, COMM, INV, dshim_scale_mul(c, rb, sb, 1, F32, NULL))                                   \
    /* flight recorder */                                                                                      \
    X(trace_label_label, NONE, OK, VOID_OK(dshim_trace_label(NULL)))                                           \
    X(trace_span_name, NONE, OK, VOID_OK(dshim_trace_span(NULL, 1, 2)))                                       \
    /* operations matched by name (a NULL desc or op_p with an engine: check_named's test_arguments) */        \
    X(named_create_comm, NONE, INV, dshim_named_create(NULL, &(dshim_named_t *){NULL}))                        \
    X(named_create_eng_p, COMM, INV, dshim_named_create(c, NULL))                                              \
    X(named_submit_eng, NONE, INV,                                                                             \
      dshim_named_submit(NULL, &(dshim_named_desc_t){.name = "x"}, &(dshim_named_op_t *){NULL}))               \
    X(named_poll_op, NONE, INV, INT_ERR(dshim_named_poll(NULL)))                                               \
    X(named_wait_op, NONE, INV, dshim_named_wait(NULL))                                                        \
    X(named_error_op, NONE, OK, PTR_ERR(dshim_named_error(NULL)))                                              \
    X(named_result_op, NONE, INV, dshim_named_result(NULL, NULL, NULL, NULL, NULL, 0))                         \
    X(named_join_rank_op, NONE, INV, INT_ERR(dshim_named_join_rank(NULL)))                                     \
    X(named_op_free_op, NONE, OK, VOID_OK(dshim_named_op_free(NULL)))                                          \
    X(named_shutdown_eng, NONE, INV, dshim_named_shutdown(NULL, "why"))                                        \
    X(named_destroy_eng, NONE, OK, dshim_named_destroy(NULL))                                                  \
    X(named_timeline_eng, NONE, INV, dshim_named_timeline(NULL, "t.json", 0))

enum {
#define X(name, needs, expect, expr) CASE_##name,
    CASES(X)
#undef X
    NCASES
};

static const struct {
    const char *name;
    int needs;
    dshim_status_t expect;
} rows[] = {
#define X(name, needs, expect, expr) {#name, needs, expect},
    CASES(X)
#undef X
};

static dshim_status_t run_case(int i, dshim_comm_t *c, dshim_request_t *req, int port)
{
    static float sb[4] = {1, 2, 3, 4}, rb[4];
    static size_t counts[1] = {1}, displs[1] = {0};
    static char msg[256];
    float scalar = 2.0f;
    dshim_stats_t stats;
    dshim_comm_t *out = NULL;
    int done = 0, src = -1;
    dshim_comm_args_t args = {.rank = 0, .size = 1, .store_addr = "127.0.0.1", .store_port = port, .token = "t"};
    dshim_comm_args_t args_no_addr = args;
    args_no_addr.store_addr = NULL;
    (void)req;
    switch (i) {
#define X(name, needs, expect, expr) \
    case CASE_##name:                \
        return (expr);
        CASES(X)
#undef X
    }
    (void)stats;
    (void)out;
    (void)done;
    (void)src;
    (void)scalar;
    return DSHIM_ERR_INTERNAL;
}

START_TEST(test_null_argument)
{
    int port = ck_free_port();
    dshim_comm_t *c = NULL;
    dshim_request_t *req = NULL;
    if (rows[_i].needs == ENV) {
        /* a complete environment: only the NULL may make it fail */
        char p[16];
        snprintf(p, sizeof(p), "%d", port);
        setenv("RANK", "0", 1);
        setenv("WORLD_SIZE", "1", 1);
        setenv("MASTER_ADDR", "127.0.0.1", 1);
        setenv("MASTER_PORT", p, 1);
    }
    if (rows[_i].needs == COMM || rows[_i].needs == REQ) {
        dshim_comm_args_t a = {.rank = 0, .size = 1, .store_addr = "127.0.0.1", .store_port = port, .token = "t"};
        ck_assert_msg(dshim_comm_init(&a, &c) == DSHIM_OK, "one-rank communicator: %s", dshim_last_error());
    }
    if (rows[_i].needs == REQ) {
        ck_assert_int_eq(dshim_ibarrier(c, &req), DSHIM_OK);
        ck_assert_int_eq(dshim_wait(req), DSHIM_OK);
    }
    if (_i == CASE_print_config_file) {
        /* NULL means stdout: keep the table out of the test's output */
        ck_assert_ptr_nonnull(freopen("/dev/null", "w", stdout));
    }
    dshim_status_t st = run_case(_i, c, req, port);
    ck_assert_msg(st == rows[_i].expect, "%s: returned %d (%s), expected %d; last error: %s", rows[_i].name, (int)st,
                  dshim_status_string(st), (int)rows[_i].expect, dshim_last_error());
    dshim_request_free(req);
    if (c) {
        dshim_comm_destroy(c);
    }
}
END_TEST

static Suite *api_null_suite(void)
{
    Suite *s = suite_create("api_null");
    TCase *tc = tcase_create("null");
    tcase_set_timeout(tc, 30);
    tcase_add_loop_test(tc, test_null_argument, 0, NCASES);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(api_null_suite());
    srunner_set_fork_status(sr, CK_FORK); /* a crash fails one row, by name */
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

/*
 * Group calls.  Between ncclGroupStart and the outermost ncclGroupEnd, ops
 * are kept per thread (as NCCL's group state is per thread) and run at the
 * end: grouped by communicator, each communicator's ops are started in call
 * order, and only then is anything waited for, so send/recv pairs and ranks
 * driven by one thread cannot deadlock.  Inits inside a group run in threads
 * that ncclGroupEnd joins.
 */
#include <stdlib.h>
#include <string.h>

#include "gpu_runtime.h"
#include "nccl/nccl_internal.h"

typedef struct group_state {
    int depth;
    dshim_nccl_op_t *ops;
    int nops, cap;
    struct ncclComm **inits;
    int ninits, init_cap;
} group_state_t;

static __thread group_state_t group;

int dshim_nccl_in_group(void)
{
    return group.depth > 0;
}

void dshim_nccl_group_add_init(struct ncclComm *comm)
{
    if (group.ninits == group.init_cap) {
        int n = group.init_cap ? group.init_cap * 2 : 8;
        struct ncclComm **grown = realloc(group.inits, (size_t)n * sizeof(*grown));
        if (!grown) {
            /* cannot track it: wait for it here instead */
            dshim_nccl_init_join(comm);
            return;
        }
        group.inits = grown;
        group.init_cap = n;
    }
    group.inits[group.ninits++] = comm;
}

const dshim_nccl_executor_t *dshim_nccl_pick_executor(struct ncclComm *comm, const dshim_nccl_op_t *ops, int n)
{
    (void)comm;
    if (!dshim_gpu_present()) {
        return &dshim_nccl_exec_host;  /* a CPU-only process has only host memory */
    }
    for (int i = 0; i < n; i++) {
        const dshim_nccl_op_t *o = &ops[i];
        if ((o->send_bytes && dshim_gpu_is_cuda_ptr(o->sbuf)) ||
            (o->recv_bytes && dshim_gpu_is_cuda_ptr(o->rbuf)) ||
            (o->premul && o->residence == ncclScalarDevice && dshim_gpu_is_cuda_ptr(o->scalar_ptr))) {
            return &dshim_nccl_exec_cuda;
        }
    }
    return &dshim_nccl_exec_host;
}

typedef struct comm_batch {
    struct ncclComm *comm;
    const dshim_nccl_executor_t *exec;
    dshim_nccl_op_t *ops;
    int n;
    void *state;
    int started;
} comm_batch_t;

/* Runs ops[0..n): start every communicator's share, then finish each. */
static ncclResult_t run_ops(dshim_nccl_op_t *ops, int n)
{
    if (n == 1) {
        struct ncclComm *c = ops[0].comm;
        const dshim_nccl_executor_t *ex = dshim_nccl_pick_executor(c, ops, 1);
        void *state = NULL;
        __atomic_add_fetch(&c->active, 1, __ATOMIC_ACQ_REL);
        ncclResult_t res = ex->start(c, ops, 1, 1, &state);
        ncclResult_t fin = ex->finish(c, state);
        __atomic_sub_fetch(&c->active, 1, __ATOMIC_ACQ_REL);
        return res != ncclSuccess ? res : fin;
    }
    comm_batch_t *b = calloc((size_t)n, sizeof(*b));
    dshim_nccl_op_t *sorted = malloc((size_t)n * sizeof(*sorted));
    if (!b || !sorted) {
        free(b);
        free(sorted);
        return dshim_nccl_fail(ncclSystemError, "ncclGroupEnd", "out of memory for %d grouped ops", n);
    }
    int nb = 0, k = 0;
    for (int i = 0; i < n; i++) {
        int seen = 0;
        for (int j = 0; j < nb; j++) {
            seen |= b[j].comm == ops[i].comm;
        }
        if (seen) {
            continue;
        }
        b[nb].comm = ops[i].comm;
        b[nb].ops = &sorted[k];
        for (int j = i; j < n; j++) {
            if (ops[j].comm == ops[i].comm) {
                sorted[k++] = ops[j];
                b[nb].n++;
            }
        }
        nb++;
    }
    ncclResult_t res = ncclSuccess;
    for (int j = 0; j < nb; j++) {
        __atomic_add_fetch(&b[j].comm->active, 1, __ATOMIC_ACQ_REL);
        b[j].exec = dshim_nccl_pick_executor(b[j].comm, b[j].ops, b[j].n);
        ncclResult_t r = b[j].exec->start(b[j].comm, b[j].ops, b[j].n, nb == 1, &b[j].state);
        if (r != ncclSuccess && res == ncclSuccess) {
            res = r;
        }
    }
    for (int j = 0; j < nb; j++) {
        ncclResult_t r = b[j].exec->finish(b[j].comm, b[j].state);
        __atomic_sub_fetch(&b[j].comm->active, 1, __ATOMIC_ACQ_REL);
        if (r != ncclSuccess && res == ncclSuccess) {
            res = r;
        }
    }
    free(b);
    free(sorted);
    return res;
}

ncclResult_t dshim_nccl_enqueue(const dshim_nccl_op_t *op)
{
    if (group.depth == 0) {
        dshim_nccl_op_t copy = *op;
        return run_ops(&copy, 1);
    }
    if (group.nops == group.cap) {
        int n = group.cap ? group.cap * 2 : 16;
        dshim_nccl_op_t *grown = realloc(group.ops, (size_t)n * sizeof(*grown));
        if (!grown) {
            return dshim_nccl_fail(ncclSystemError, "ncclGroupStart", "out of memory for grouped ops");
        }
        group.ops = grown;
        group.cap = n;
    }
    group.ops[group.nops++] = *op;
    return ncclSuccess;
}

DSHIM_NCCL_EXPORT ncclResult_t ncclGroupStart(void)
{
    group.depth++;
    return ncclSuccess;
}
DSHIM_NCCL_ALIAS(ncclGroupStart);

static void group_reset(void)
{
    free(group.ops);
    free(group.inits);
    memset(&group, 0, sizeof(group));
}

/* Joins the blocking inits of the group; non-blocking ones keep running and
 * make the group report ncclInProgress. */
static ncclResult_t finish_inits(void)
{
    ncclResult_t res = ncclSuccess;
    int pending = 0;
    for (int i = 0; i < group.ninits; i++) {
        struct ncclComm *c = group.inits[i];
        if (!c->blocking) {
            pending = 1;
            continue;
        }
        dshim_nccl_init_join(c);
        ncclResult_t st = __atomic_load_n(&c->init_state, __ATOMIC_ACQUIRE);
        if (st != ncclSuccess && res == ncclSuccess) {
            res = st;
        }
    }
    return res == ncclSuccess && pending ? ncclInProgress : res;
}

DSHIM_NCCL_EXPORT ncclResult_t ncclGroupEnd(void)
{
    if (group.depth == 0) {
        return dshim_nccl_fail(ncclInvalidUsage, "ncclGroupEnd", "no group is open (ncclGroupStart missing)");
    }
    if (--group.depth > 0) {
        return ncclSuccess;  /* only the outermost end acts */
    }
    ncclResult_t res = finish_inits();
    ncclResult_t ops_res = group.nops ? run_ops(group.ops, group.nops) : ncclSuccess;
    group_reset();
    return res != ncclSuccess ? res : ops_res;
}
DSHIM_NCCL_ALIAS(ncclGroupEnd);

DSHIM_NCCL_EXPORT ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t *simInfo)
{
    if (!simInfo || simInfo->magic != 0x74685283u) {
        return dshim_nccl_fail(ncclInvalidArgument, "ncclGroupSimulateEnd",
                               "simInfo is NULL or not set with NCCL_SIM_INFO_INITIALIZER");
    }
    if (group.depth == 0) {
        return dshim_nccl_fail(ncclInvalidUsage, "ncclGroupSimulateEnd", "no group is open");
    }
    /* dshim has no cost model: the group is closed without running anything
     * and the estimate is 0 */
    simInfo->estimatedTime = 0.0f;
    if (--group.depth == 0) {
        finish_inits();
        group_reset();
    }
    return ncclSuccess;
}
DSHIM_NCCL_ALIAS(ncclGroupSimulateEnd);

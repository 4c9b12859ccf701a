"""One rank of a test_transparency.py job: `transparency_worker.py BACKEND SCENARIO`.

BACKEND is what the script asks init_process_group for ("gloo", "default" for
None, "dshim"); whether dshim carries it is up to the environment
(LD_PRELOAD=libdshim.so: the takeover).  Each scenario prints what a script
observes as one line `RESULT <json>`; the test compares the lines of a gloo
run with those of a run under dshim.  Environment: RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT (env://).
"""
import ctypes
import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

# without the preload the package would load the checkout's build/lib/libdshim.so; the test's build is
# mapped here instead, after `import torch` (whose autoload installs the takeover only when it is mapped)
if os.environ.get("DSHIM_TEST_LIB") and "libdshim" not in os.environ.get("LD_PRELOAD", ""):
    ctypes.CDLL(os.environ["DSHIM_TEST_LIB"], mode=ctypes.RTLD_GLOBAL)

RANK = int(os.environ["RANK"])
N = int(os.environ["WORLD_SIZE"])
OUT = {}


def error_of(fn):
    """(exception type, first line of its message) or None."""
    try:
        fn()
    except Exception as e:   # the point: what a script sees
        return [type(e).__name__, str(e).splitlines()[0] if str(e) else ""]
    return None


def carried_by_dshim(group=None):
    pg = group if group is not None else c10d._get_default_group()
    return hasattr(pg, "dshim_stats")


def sc_names():
    g01 = dist.new_group([0, 1])
    g_gloo = dist.new_group(backend="gloo")
    subgroup, _ = dist.new_subgroups(group_size=1)
    OUT["get_backend"] = str(dist.get_backend())
    OUT["get_backend_config"] = dist.get_backend_config()
    OUT["name"] = c10d._get_default_group().name()
    OUT["_get_backend_name"] = c10d._get_default_group()._get_backend_name()
    OUT["new_group_inherits"] = str(dist.get_backend(g01)) if RANK in (0, 1) else None
    OUT["new_group_config"] = dist.get_backend_config(g01) if RANK in (0, 1) else None
    OUT["new_group_gloo"] = str(dist.get_backend(g_gloo))
    OUT["new_subgroups"] = str(dist.get_backend(subgroup))
    OUT["timeout_s"] = c10d._get_default_timeout(dist.get_backend()).total_seconds()
    OUT["not_member"] = error_of(lambda: dist.get_backend(g01)) if RANK not in (0, 1) else None
    # the groups must work, whoever carries them
    t = torch.ones(3) * (RANK + 1)
    dist.all_reduce(t)
    x = torch.ones(2)
    dist.all_reduce(x, group=g_gloo)
    OUT["sums"] = [t.tolist(), x.tolist()]
    objs = [None] * N
    dist.all_gather_object(objs, {"rank": RANK})
    OUT["objects"] = objs
    OUT["_carried"] = [carried_by_dshim(), carried_by_dshim(g_gloo), carried_by_dshim(subgroup)]


def _multidim(k, value, dtype):
    """torch's _build_multidim_tensor: k dims of size k+1, filled with value."""
    return torch.full([k + 1] * k, value, dtype=dtype) if k else torch.full([], value, dtype=dtype)


def sc_all_gather_coalesced():
    results = []
    for dtype in (torch.float32, torch.complex64, torch.int64):
        for async_op in (False, True):
            inputs = [_multidim(k, RANK + k, dtype) for k in range(1, 4)] + [torch.ones(0, dtype=dtype)]
            outputs = [[torch.full_like(t, -1) for t in inputs] for _ in range(N)]
            w = dist.all_gather_coalesced(outputs, inputs, async_op=async_op)
            if async_op:
                w.wait()
            results.append([[torch.view_as_real(o).tolist() if o.is_complex() else o.tolist() for o in outs]
                            for outs in outputs])
    OUT["outputs"] = results
    # a non-contiguous input and outputs
    inp = torch.arange(12.0).reshape(3, 4).t() + RANK
    outs = [[torch.empty(3, 4).t()] for _ in range(N)]
    dist.all_gather_coalesced(outs, [inp])
    OUT["strided"] = [o[0].tolist() for o in outs]
    # one list per input tensor (the layout dshim used to expect) is refused
    OUT["per_input_lists"] = error_of(lambda: dist.all_gather_coalesced([[torch.empty(2)] for _ in range(N + 1)],
                                                                        [torch.ones(2)]))
    t = torch.ones(1)
    dist.all_reduce(t)
    OUT["after"] = t.tolist()


def _sparse(rank, salt):
    """A 4x3 (2 sparse dims) x 2 (dense) COO tensor with duplicate indices,
    uncoalesced, values that make the summation order matter."""
    g = torch.Generator().manual_seed(17 * rank + salt)
    nnz = 0 if rank == 1 and salt == 1 else 5
    idx = torch.stack([torch.randint(0, 4, (nnz,), generator=g), torch.randint(0, 3, (nnz,), generator=g)])
    val = torch.rand(nnz, 2, generator=g, dtype=torch.float32) * 10 ** (rank % 3) + 0.1
    return torch.sparse_coo_tensor(idx, val, (4, 3, 2))


def _sparse_out(t):
    return {"coalesced": t.is_coalesced(), "indices": t._indices().tolist(),
            "values": t._values().view(torch.int32).tolist(),   # the bits: the sums must be identical
            "shape": list(t.shape)}


def sc_sparse():
    res = []
    for salt in (0, 1):
        for async_op in (False, True):
            t = _sparse(RANK, salt)
            w = dist.all_reduce(t, async_op=async_op)
            if async_op:
                w.wait()
            res.append(_sparse_out(t))
    OUT["sums"] = res
    # every rank computes the expected sum itself: it is a plain sum of sparse tensors
    want = sum(_sparse(r, 0).to_dense() for r in range(N))
    t = _sparse(RANK, 0)
    dist.all_reduce(t)
    OUT["close_to_dense_sum"] = bool(torch.allclose(t.to_dense(), want))
    OUT["max"] = error_of(lambda: dist.all_reduce(_sparse(RANK, 0), op=dist.ReduceOp.MAX))
    OUT["max_says_sum_only"] = "only works with ReduceOp.SUM" in (OUT["max"] or ["", ""])[1]
    shape = (4, 3, 2) if RANK == 0 else (5, 3, 2)
    odd = torch.sparse_coo_tensor(torch.zeros(3, 0, dtype=torch.int64), torch.zeros(0), shape)
    OUT["mismatch"] = error_of(lambda: dist.all_reduce(odd))
    d = torch.ones(2)
    dist.all_reduce(d)
    OUT["after"] = d.tolist()


def sc_profiler():
    """The events a profiler records around collectives: gloo's titles, asynchronous, the inputs' shapes
    (torch's own suite checks them whenever get_backend() is "gloo")."""
    t = torch.ones(3)
    with torch.autograd.profiler.profile(record_shapes=True) as prof:
        dist.all_reduce(t)
        dist.broadcast(t, 0, async_op=True).wait()
        dist.all_gather([torch.empty(3) for _ in range(N)], t)
        dist.all_gather_coalesced([[torch.empty(3), torch.empty(2)] for _ in range(N)], [t, torch.ones(2)])
        dist.all_to_all_single(torch.empty(2 * N), torch.ones(2 * N))
        dist.reduce(t, 0)
    OUT["events"] = sorted([e.name, e.is_async, e.count, str(e.input_shapes)] for e in prof.function_events
                           if e.name.startswith(str(dist.get_backend()) + ":"))


def sc_refusals():
    """Bad arguments are refused in one line each, on every rank, and the group stays usable."""
    pg = c10d._get_default_group()
    one = [torch.ones(2)]
    OUT["agc_empty"] = error_of(lambda: pg.allgather_coalesced([[] for _ in range(N)], []).wait())
    OUT["agc_short_list"] = error_of(lambda: pg.allgather_coalesced([[] for _ in range(N)], one).wait())
    OUT["agc_shape"] = error_of(lambda: pg.allgather_coalesced([[torch.ones(3)] for _ in range(N)], one).wait())
    OUT["agc_mixed"] = error_of(lambda: pg.allgather_coalesced(
        [[torch.ones(2), torch.ones(2, dtype=torch.int64)] for _ in range(N)],
        [torch.ones(2), torch.ones(2, dtype=torch.int64)]).wait())
    csr = torch.eye(3).to_sparse_csr()
    OUT["sparse_csr"] = error_of(lambda: dist.all_reduce(csr))
    dtype = torch.float64 if RANK == 0 else torch.float32
    mixed = torch.sparse_coo_tensor(torch.zeros(1, 1, dtype=torch.int64), torch.ones(1, dtype=dtype), (4,))
    OUT["sparse_dtype"] = error_of(lambda: dist.all_reduce(mixed))
    t = torch.ones(1)
    dist.all_reduce(t)
    OUT["after"] = t.tolist()


def sc_monitored_no_root():
    """Rank 0 never comes: the others wait for its answer up to the group's timeout."""
    if RANK != 0:
        OUT["error"] = error_of(lambda: dist.monitored_barrier(timeout=datetime.timedelta(seconds=1)))
    _finish_through_store()


def _finish_through_store():
    """Every rank waits here for the others without a collective (after a
    failed monitored_barrier, gloo's group has receives left posted).  Rank 0
    hosts the store, so it leaves last."""
    store = c10d._get_default_store()
    deadline = time.monotonic() + 60
    store.add("transparency-done", 1)
    while int(store.add("transparency-done", 0)) < N and time.monotonic() < deadline:
        time.sleep(0.05)
    store.add("transparency-left", 1)
    while RANK == 0 and int(store.add("transparency-left", 0)) < N and time.monotonic() < deadline:
        time.sleep(0.05)


def sc_monitored_ok():
    t = datetime.timedelta(seconds=20)
    for wait_all in (False, True, False):
        dist.monitored_barrier(timeout=t, wait_all_ranks=wait_all)
    sub = dist.new_group([0, 1])
    if RANK in (0, 1):
        sub.monitored_barrier(t)
    dist.monitored_barrier(sub, 20.0) if RANK == 2 else None   # not a member: returns
    x = torch.ones(1)
    dist.all_reduce(x)
    OUT["after"] = x.tolist()


def sc_monitored_first():
    """Rank 1 never comes: rank 0 names it, rank 2 (which came) is told."""
    if RANK != 1:
        OUT["error"] = error_of(lambda: dist.monitored_barrier(timeout=datetime.timedelta(seconds=1)))
    _finish_through_store()


def sc_monitored_all():
    """Ranks 1 and 2 never come: with wait_all_ranks rank 0 names both."""
    if RANK == 0:
        OUT["error"] = error_of(lambda: dist.monitored_barrier(timeout=datetime.timedelta(seconds=0.5),
                                                               wait_all_ranks=True))
    _finish_through_store()


def sc_monitored_rank0_timeout():
    """Rank 0 alone, timeout 0: it runs out of time before any rank (gloo's test)."""
    if RANK == 0:
        pg = dist.new_group(list(range(N)))
        try:
            pg.monitored_barrier(datetime.timedelta(seconds=0))
        except RuntimeError as e:
            OUT["error"] = ["RuntimeError", str(e).splitlines()[0]]
            OUT["full"] = str(e)
    else:
        dist.new_group(list(range(N)))
    _finish_through_store()


def main():
    backend, scenario = sys.argv[1], sys.argv[2]
    dist.init_process_group(None if backend == "default" else backend,
                            timeout=datetime.timedelta(seconds=float(os.environ.get("TEST_PG_TIMEOUT", "60"))))
    globals()["sc_" + scenario]()
    print("RESULT " + json.dumps(OUT, sort_keys=True), flush=True)
    if not scenario.startswith("monitored_") or scenario == "monitored_ok":
        dist.destroy_process_group()
    # after a failed monitored_barrier the groups are left to the interpreter's exit (gloo: pending receives)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()

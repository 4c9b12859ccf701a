"""One rank of a test job of test_hvd_ops.py: `hvd_ops_worker.py SCENARIO [SCENARIO...]`.

Every scenario computes what each operation must give from every rank's deterministic input and
records what differs; the process prints its failures and exits 1 if there was any.  The rank
reads its identity from horovod itself (hvd.rank()/size()), whatever started it.
"""
import faulthandler
import os
import sys
import traceback

import torch

import horovod
import horovod.torch as hvd
from horovod.torch.mpi_ops import is_homogeneous   # not exported by horovod.torch (as in Horovod)

FAILS = []
CHECKS = [0]
faulthandler.dump_traceback_later(int(os.environ.get("HVD_TEST_DUMP_AFTER", "200")), exit=True)


def fail(what, detail=""):
    FAILS.append(f"{what}: {detail}")


def check(what, cond, detail=""):
    CHECKS[0] += 1
    if not cond:
        fail(what, detail)


def same(what, got, want):
    CHECKS[0] += 1
    if not isinstance(got, torch.Tensor) or got.dtype != want.dtype or got.shape != want.shape:
        fail(what, f"got {getattr(got, 'dtype', type(got))}{tuple(getattr(got, 'shape', ()))}, "
                   f"want {want.dtype}{tuple(want.shape)}")
        return
    if not torch.equal(got, want):
        fail(what, f"got {got.reshape(-1)[:8].tolist()}..., want {want.reshape(-1)[:8].tolist()}...")


def raises(what, exc_types, fn, text=None):
    """fn() must raise one of exc_types (and its message contain text)."""
    CHECKS[0] += 1
    try:
        fn()
    except exc_types as e:
        if text is not None and text not in str(e):
            fail(what, f"raised {type(e).__name__}({e}) without {text!r}")
        return e
    except Exception as e:
        fail(what, f"raised {type(e).__name__}: {e}")
        return None
    fail(what, f"did not raise {exc_types}")
    return None


def data(r, shape, dtype, salt=0):
    """Small integers, exact in every dtype: any rank can compute any rank's input."""
    g = torch.Generator().manual_seed(7919 * r + 104729 * salt + 13)
    return torch.randint(-8, 9, shape, generator=g).to(dtype)


# ---- scenarios ---------------------------------------------------------------------------------------

def sc_basics():
    rank, n = hvd.rank(), hvd.size()
    check("__dshim__", getattr(horovod, "__dshim__", False) is True)
    check("version", horovod.__version__.startswith("0.28.1+dshim."), horovod.__version__)
    check("is_initialized", hvd.is_initialized())
    check("local", 0 <= hvd.local_rank() < hvd.local_size(), f"{hvd.local_rank()}/{hvd.local_size()}")
    check("cross", 0 <= hvd.cross_rank() < hvd.cross_size(), f"{hvd.cross_rank()}/{hvd.cross_size()}")
    want_local = os.environ.get("HVD_TEST_WANT_LOCAL")
    if want_local:
        lr, ls, cr, cs = map(int, want_local.split(","))
        check("identity", (hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size()) ==
              (lr, ls, cr, cs), f"{(hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size())}")
    want_homogeneous = os.environ.get("HVD_TEST_HOMOGENEOUS", "1") == "1"
    check("homogeneous", is_homogeneous() is want_homogeneous, f"{is_homogeneous()}")
    check("built flags", (hvd.gloo_built(), hvd.mpi_built(), hvd.nccl_built(), hvd.ddl_built(), hvd.ccl_built(),
                          hvd.rocm_built(), hvd.mpi_enabled(), hvd.gloo_enabled()) ==
          (True, False, 0, False, False, False, False, True))
    raises("mpi_threads_supported", ValueError, hvd.mpi_threads_supported, "MPI is not enabled")
    check("ops", (hvd.Average, hvd.Sum, hvd.Adasum, hvd.Min, hvd.Max, hvd.Product) == (0, 1, 2, 3, 4, 5))
    t = torch.tensor([float(rank)])
    same("allreduce works", hvd.allreduce(t, op=hvd.Sum), torch.tensor([float(sum(range(n)))]))


def sc_allreduce():
    rank, n = hvd.rank(), hvd.size()
    for dtype in (torch.int32, torch.int64, torch.float16, torch.float32, torch.float64):
        for shape in ((17,), (5, 7), (2, 3, 4), ()):
            ins = [data(r, shape, dtype) for r in range(n)]
            want_sum = sum(i.double() for i in ins)
            same(f"sum {dtype}{shape}", hvd.allreduce(ins[rank], op=hvd.Sum), want_sum.to(dtype))
            same(f"average= False {dtype}{shape}", hvd.allreduce(ins[rank], average=False), want_sum.to(dtype))
            got = hvd.allreduce(ins[rank])   # Average by default
            if dtype.is_floating_point:
                want = (want_sum / n).to(dtype)
                CHECKS[0] += 1
                if not torch.allclose(got.double(), want.double(), rtol=1e-3, atol=1e-3):
                    fail(f"average {dtype}{shape}", f"{got} != {want}")
            else:
                # Horovod's Gloo build scales the integer sum by 1/n in double and truncates
                same(f"integer average {dtype}{shape}", got, (want_sum * (1.0 / n)).trunc().to(dtype))
            same(f"min {dtype}{shape}", hvd.allreduce(ins[rank], op=hvd.Min),
                 torch.stack([i.double() for i in ins]).min(0).values.to(dtype))
            same(f"max {dtype}{shape}", hvd.allreduce(ins[rank], op=hvd.Max),
                 torch.stack([i.double() for i in ins]).max(0).values.to(dtype))
            prod = ins[0].double()
            for i in ins[1:]:
                prod = prod * i.double()
            same(f"product {dtype}{shape}", hvd.allreduce(ins[rank], op=hvd.Product), prod.to(dtype))
            check(f"input unchanged {dtype}", torch.equal(ins[rank], data(rank, shape, dtype)))
    # scale factors (floats: exact powers of two)
    x = data(rank, (33,), torch.float32)
    want = sum(data(r, (33,), torch.float32) for r in range(n))
    same("prescale", hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5), want * 0.5)
    same("postscale", hvd.allreduce(x, op=hvd.Sum, postscale_factor=4.0), want * 4.0)
    # in place, async
    y = x.clone()
    h = hvd.allreduce_async_(y, op=hvd.Sum, name="inplace")
    out = hvd.synchronize(h)
    check("allreduce_async_ returns the tensor", out is y)
    same("allreduce_async_", y, want)
    z = x.clone()
    same("allreduce_", hvd.allreduce_(z, op=hvd.Sum), want)
    h = hvd.allreduce_async(x, op=hvd.Sum)
    check("handle is an int", isinstance(h, int), repr(h))
    while not hvd.poll(h):
        pass
    same("allreduce_async", hvd.synchronize(h), want)
    check("synchronize of a finished handle", hvd.synchronize(h) is None)
    raises("poll of an unknown handle", ValueError, lambda: hvd.poll(h), "was not created or has been cleared")
    raises("average and op", ValueError, lambda: hvd.allreduce(x, average=True, op=hvd.Sum), "supersedes")
    # grouped
    xs = [data(rank, (i + 1, 3), torch.float64, salt=i) for i in range(4)]
    wants = [sum(data(r, (i + 1, 3), torch.float64, salt=i) for r in range(n)) for i in range(4)]
    for g, w in zip(hvd.grouped_allreduce(xs, op=hvd.Sum, name="grp"), wants):
        same("grouped_allreduce", g, w)
    ys = [t.clone() for t in xs]
    hvd.grouped_allreduce_(ys, op=hvd.Sum)
    for g, w in zip(ys, wants):
        same("grouped_allreduce_", g, w)
    h = hvd.grouped_allreduce_async(xs, op=hvd.Average)
    for g, w in zip(hvd.synchronize(h), wants):
        CHECKS[0] += 1
        if not torch.allclose(g, w / n, rtol=1e-12, atol=0):   # Horovod multiplies the sum by 1/n
            fail("grouped_allreduce_async average", f"{g} != {w / n}")
    # autograd: the gradient of allreduce is the allreduce of the gradient
    v = data(rank, (6,), torch.float32).requires_grad_()
    hvd.allreduce(v, op=hvd.Sum).backward(torch.ones(6))
    same("allreduce grad", v.grad, torch.full((6,), float(n)))
    v = data(rank, (6,), torch.float32).requires_grad_()
    hvd.allreduce(v).backward(torch.ones(6))
    same("allreduce grad average", v.grad, torch.ones(6))
    vs = [data(rank, (3,), torch.float32, salt=i).requires_grad_() for i in range(2)]
    torch.autograd.backward(hvd.grouped_allreduce(vs, op=hvd.Sum), [torch.ones(3), torch.ones(3)])
    for t in vs:
        same("grouped_allreduce grad", t.grad, torch.full((3,), float(n)))
    # a sparse gradient (sparse_allreduce_async)
    idx = torch.tensor([[rank, rank + 1]])
    sp = torch.sparse_coo_tensor(idx, torch.tensor([1.0, 2.0]), (n + 1,))
    dense = hvd.sparse_allreduce_async(sp, name="sparse", op=hvd.Sum)().to_dense()
    want = torch.zeros(n + 1)
    for r in range(n):
        want[r] += 1.0
        want[r + 1] += 2.0
    same("sparse_allreduce_async", dense, want)


def sc_gather_bcast():
    rank, n = hvd.rank(), hvd.size()
    for dtype in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.float32,
                  torch.float64):
        ins = [data(r, (r + 1, 3), dtype).abs() for r in range(n)]
        same(f"allgather uneven {dtype}", hvd.allgather(ins[rank]), torch.cat(ins))
        for root in range(n):
            t = data(rank, (4, 5), dtype, salt=root).abs()
            same(f"broadcast {dtype} root {root}", hvd.broadcast(t, root), data(root, (4, 5), dtype, salt=root).abs())
            check("broadcast keeps the input", torch.equal(t, data(rank, (4, 5), dtype, salt=root).abs()))
            hvd.broadcast_(t, root)
            same(f"broadcast_ {dtype} root {root}", t, data(root, (4, 5), dtype, salt=root).abs())
    h = hvd.allgather_async(torch.tensor([rank]), name="ag")
    same("allgather_async", hvd.synchronize(h), torch.arange(n))
    outs = hvd.grouped_allgather([torch.full((rank + 1,), rank), torch.tensor([[rank, rank]])])
    same("grouped_allgather 0", outs[0], torch.cat([torch.full((r + 1,), r) for r in range(n)]))
    same("grouped_allgather 1", outs[1], torch.tensor([[r, r] for r in range(n)]))
    # alltoall: even split, then rank r sends (d + 1) rows to rank d
    x = torch.arange(n * 2, dtype=torch.float32) + 100 * rank
    got = hvd.alltoall(x)
    same("alltoall even", got, torch.cat([torch.arange(2 * rank, 2 * rank + 2, dtype=torch.float32) + 100 * r
                                         for r in range(n)]))
    splits = [d + 1 for d in range(n)]
    rows = sum(splits)
    x = (torch.arange(rows * 2, dtype=torch.int64) + 1000 * rank).view(rows, 2)
    out, rsplits = hvd.alltoall(x, splits=torch.tensor(splits, dtype=torch.int32))
    start = sum(splits[:rank])
    want = torch.cat([(torch.arange(rows * 2, dtype=torch.int64) + 1000 * r).view(rows, 2)[start:start + rank + 1]
                      for r in range(n)])
    same("alltoall splits", out, want)
    same("alltoall received splits", rsplits, torch.full((n,), rank + 1, dtype=torch.int32))
    h = hvd.alltoall_async(x, splits=splits)
    out2, rs2 = hvd.synchronize(h)
    same("alltoall_async (list splits)", out2, want)
    # reducescatter, first dimension not a multiple of n: the first ranks get one row more
    rows = 2 * n + 1
    ins = [data(r, (rows, 3), torch.float32) for r in range(n)]
    total = sum(ins)
    mine = [rows // n + (1 if r < rows % n else 0) for r in range(n)]
    off = sum(mine[:rank])
    same("reducescatter sum", hvd.reducescatter(ins[rank], op=hvd.Sum), total[off:off + mine[rank]])
    got = hvd.reducescatter(ins[rank])   # Average by default
    CHECKS[0] += 1
    if not torch.allclose(got, total[off:off + mine[rank]] / n):
        fail("reducescatter average", f"{got} != {total[off:off + mine[rank]] / n}")
    outs = hvd.grouped_reducescatter([ins[rank], ins[rank] * 2], op=hvd.Sum)
    same("grouped_reducescatter 0", outs[0], total[off:off + mine[rank]])
    same("grouped_reducescatter 1", outs[1], 2 * total[off:off + mine[rank]])
    raises("reducescatter of a scalar", ValueError, lambda: hvd.reducescatter(torch.tensor(1.0)),
           "does not support scalar")
    raises("reducescatter Min", hvd.HorovodInternalError, lambda: hvd.reducescatter(ins[rank], op=hvd.Min),
           "only supports AVERAGE and SUM")
    # autograd
    v = torch.ones(rank + 1, 2, requires_grad=True)
    hvd.allgather(v).backward(torch.full((sum(r + 1 for r in range(n)), 2), 2.0))
    same("allgather grad", v.grad, torch.full((rank + 1, 2), 2.0))
    v = torch.ones(3, requires_grad=True)
    hvd.broadcast(v, 0).backward(torch.ones(3))
    same("broadcast grad", v.grad, torch.full((3,), float(n) / n if rank == 0 else 0.0))
    v = torch.ones(n * 2, requires_grad=True)
    hvd.alltoall(v).backward(torch.full((n * 2,), 3.0))
    same("alltoall grad", v.grad, torch.full((n * 2,), 3.0))
    v = torch.ones(n * 2, requires_grad=True)
    hvd.reducescatter(v, op=hvd.Sum).backward(torch.ones(2))
    same("reducescatter grad", v.grad, torch.full((n * 2,), float(n)))


def sc_refusals():
    rank, n = hvd.rank(), hvd.size()
    for dtype in (torch.bool, torch.bfloat16, torch.uint8, torch.int8, torch.int16, torch.complex64):
        raises(f"allreduce of {dtype}", ValueError, lambda: hvd.allreduce(torch.ones(3, dtype=dtype)),
               "is not supported")
    for dtype in (torch.bool, torch.bfloat16):
        raises(f"allgather of {dtype}", ValueError, lambda: hvd.allgather(torch.ones(3, dtype=dtype)),
               "is not supported")
        raises(f"broadcast of {dtype}", ValueError, lambda: hvd.broadcast(torch.ones(3, dtype=dtype), 0),
               "is not supported")
    nc = torch.ones(4, 4).t()[:, :2]
    raises("non-contiguous", ValueError, lambda: hvd.allreduce_(nc), "contiguous")
    if n > 1:
        raises("alltoall uneven without splits", ValueError, lambda: hvd.alltoall(torch.ones(n + 1)),
               "not an even multiple")
    raises("alltoall splits sum", ValueError, lambda: hvd.alltoall(torch.ones(n - 1), torch.ones(n, dtype=torch.int32)),
           "greater than")
    raises("alltoall splits dtype", ValueError,
           lambda: hvd.alltoall(torch.ones(n), torch.ones(n, dtype=torch.float32)), "32-bit integer")
    raises("alltoall splits count", ValueError,
           lambda: hvd.alltoall(torch.ones(n + 1), torch.ones(n + 1, dtype=torch.int32)), "does not equal")
    raises("broadcast root outside the job", ValueError, lambda: hvd.broadcast(torch.ones(2), n), "invalid root rank")
    # the job goes on
    same("after refusals", hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.full((2,), float(n)))


def sc_errors():
    """Ranks that disagree on one name: every rank raises, and the next operations work."""
    rank, n = hvd.rank(), hvd.size()
    e = raises("shape mismatch", hvd.HorovodInternalError, lambda: hvd.allreduce(torch.ones(17 + rank), name="shp"))
    if e is not None:
        check("message names the tensor", "shp" in str(e), str(e))
    raises("same elements, other rank", hvd.HorovodInternalError,
           lambda: hvd.allreduce(torch.ones((6, 4) if rank == 0 else (24,)), name="dims"))
    raises("dtype mismatch", hvd.HorovodInternalError,
           lambda: hvd.allreduce(torch.ones(5, dtype=torch.int32 if rank % 2 == 0 else torch.float32)))
    raises("op mismatch", hvd.HorovodInternalError,
           lambda: hvd.allreduce(torch.ones(5), op=hvd.Sum if rank == 0 else hvd.Max))
    raises("allgather dims mismatch", hvd.HorovodInternalError, lambda: hvd.allgather(torch.ones(2, 3 + rank)))
    raises("broadcast root mismatch", hvd.HorovodInternalError, lambda: hvd.broadcast(torch.ones(3), rank))
    raises("broadcast shape mismatch", hvd.HorovodInternalError, lambda: hvd.broadcast(torch.ones(3 + rank), 0))
    raises("alltoall dtype mismatch", hvd.HorovodInternalError,
           lambda: hvd.alltoall(torch.ones(n, dtype=torch.int32 if rank % 2 else torch.float32)))
    same("after mismatches", hvd.allreduce(torch.ones(3), op=hvd.Sum, name="after"), torch.full((3,), float(n)))
    # a duplicate pending name: ValueError at submission, on the rank that submits it twice
    t = torch.ones(4)
    if rank == 0:
        hvd.allreduce_async(t, name="dup")
        raises("duplicate name", ValueError, lambda: hvd.allreduce_async(t, name="dup"))
    hvd.barrier()
    if rank > 0:
        hvd.allreduce_async(t, name="dup")
        raises("duplicate name", ValueError, lambda: hvd.allreduce_async(t, name="dup"))
    hvd.barrier()
    same("after duplicates", hvd.allreduce(torch.ones(3), op=hvd.Sum), torch.full((3,), float(n)))


def sc_order():
    """Names submitted in a different order on every rank, async, then synchronized."""
    rank, n = hvd.rank(), hvd.size()
    names = [f"grad.{i}" for i in range(12)]
    order = names[rank:] + names[:rank]
    if rank % 2:
        order.reverse()
    handles = {nm: hvd.allreduce_async(torch.full((i + 1,), float(rank + i)), name=nm, op=hvd.Sum)
               for i, nm in sorted(enumerate(names), key=lambda p: order.index(p[1]))}
    for i, nm in enumerate(names):
        same(f"any order {nm}", hvd.synchronize(handles[nm]),
             torch.full((i + 1,), float(sum(r + i for r in range(n)))))
    # synchronized in reverse order of submission, mixed kinds
    hs = [hvd.allgather_async(torch.tensor([rank]), name="o.ag"), hvd.broadcast_async(torch.tensor([rank]), 0, name="o.bc"),
          hvd.allreduce_async(torch.tensor([1.0]), op=hvd.Sum, name="o.ar")]
    same("reverse sync ar", hvd.synchronize(hs[2]), torch.tensor([float(n)]))
    same("reverse sync bc", hvd.synchronize(hs[1]), torch.tensor([0]))
    same("reverse sync ag", hvd.synchronize(hs[0]), torch.arange(n))


def sc_join():
    """Rank r has r + 1 batches: joined ranks contribute zeros; join returns the last rank."""
    rank, n = hvd.rank(), hvd.size()
    for i in range(rank + 1):
        got = hvd.allreduce(torch.ones(3), op=hvd.Sum, name=f"batch.{i}")
        same(f"join batch {i}", got, torch.full((3,), float(sum(1 for r in range(n) if r >= i))))
    last = hvd.join()
    check("join returns the last rank", last == n - 1, f"{last}")
    same("after join", hvd.allreduce(torch.ones(2), op=hvd.Sum, name="after join"), torch.full((2,), float(n)))
    # the ranks allocated different numbers of handles: unnamed operations would be named apart
    # from now on (as in Horovod); a shutdown starts the count again
    hvd.shutdown()
    hvd.init()


def sc_sets():
    rank, n = hvd.rank(), hvd.size()
    evens = [r for r in range(n) if r % 2 == 0]
    odds = [r for r in range(n) if r % 2 == 1]
    if n == 1:   # the only set there is, is the global one
        raises("a set of every rank", ValueError, lambda: hvd.add_process_set([0]), "duplicate")
        return
    even_set = hvd.add_process_set(evens)
    odd_set = hvd.add_process_set(hvd.ProcessSet(odds))
    raises("duplicate set", ValueError, lambda: hvd.add_process_set(evens), "duplicate")
    mine, other = (even_set, odd_set) if rank % 2 == 0 else (odd_set, even_set)
    members = evens if rank % 2 == 0 else odds
    check("included", mine.included() and not other.included())
    check("set size", mine.size() == len(members) and other.size() == n - len(members))
    check("set rank", mine.rank() == members.index(rank))
    raises("rank in a foreign set", ValueError, other.rank, "not part of")
    got = hvd.allreduce(torch.tensor([float(rank)]), op=hvd.Sum, process_set=mine)
    same("allreduce in a set", got, torch.tensor([float(sum(members))]))
    same("allgather in a set", hvd.allgather(torch.tensor([rank]), process_set=mine), torch.tensor(members))
    root = members[-1]   # a global rank
    same("broadcast in a set (global root)", hvd.broadcast(torch.tensor([rank]), root, process_set=mine),
         torch.tensor([root]))
    raises("root outside the set", ValueError,
           lambda: hvd.broadcast(torch.tensor([rank]), [r for r in range(n) if r not in members][0],
                                 process_set=mine), "invalid root rank")
    hvd.barrier(process_set=mine)
    if other.ranks:
        raises("op on a foreign set", ValueError, lambda: hvd.allreduce(torch.ones(1), process_set=other),
               "is not a member")
    # every rank works with the global set meanwhile
    same("global after sets", hvd.allreduce(torch.ones(1), op=hvd.Sum), torch.tensor([float(n)]))
    check("remove", hvd.remove_process_set(odd_set) and hvd.remove_process_set(even_set))
    check("removed set invalid", even_set.process_set_id is None)
    raises("op on a removed set", ValueError, lambda: hvd.allreduce(torch.ones(1), process_set=even_set),
           "does not exist")
    check("global set not removed", hvd.remove_process_set(hvd.global_process_set) is False)
    check("global ranks", hvd.global_process_set.ranks == list(range(n)))


def sc_static_sets():
    """init(process_sets=[...]) registers sets without HOROVOD_DYNAMIC_PROCESS_SETS."""
    rank, n = hvd.rank(), hvd.size()
    hvd.shutdown()
    first = hvd.ProcessSet([0])
    rest = hvd.ProcessSet(list(range(1, n)))
    hvd.init(process_sets=[first, rest])
    check("ids", first.process_set_id is not None and rest.process_set_id is not None and
          first.process_set_id != rest.process_set_id)
    for ps in (first, rest):
        if ps.included():
            same(f"allreduce on {ps.ranks}", hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum, process_set=ps),
                 torch.tensor([float(len(ps.ranks))]))
    if os.environ.get("HOROVOD_DYNAMIC_PROCESS_SETS") != "1":
        raises("add without dynamic sets", ValueError, lambda: hvd.add_process_set(list(range(1, n))),
               "HOROVOD_DYNAMIC_PROCESS_SETS")
        raises("remove without dynamic sets", ValueError, lambda: hvd.remove_process_set(rest),
               "HOROVOD_DYNAMIC_PROCESS_SETS")
    hvd.shutdown()
    hvd.init()


def sc_reinit():
    rank, n = hvd.rank(), hvd.size()
    for i in range(3):
        same(f"cycle {i}", hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum), torch.tensor([float(n)]))
        h = hvd.allreduce_async(torch.ones(2), name="left pending" if rank == 0 else f"never.{rank}")
        hvd.barrier()   # every rank submitted before any shuts the engine down
        hvd.shutdown()
        check("not initialized after shutdown", not hvd.is_initialized())
        # Horovod's shutdown clears its handles: an old one is refused as unknown
        raises("handle of before the shutdown", ValueError, lambda: hvd.synchronize(h), "has been cleared")
        raises("op after shutdown", hvd.HorovodInternalError, lambda: hvd.allreduce(torch.ones(1)),
               "Horovod has not been initialized")
        raises("rank after shutdown", ValueError, hvd.rank, "Horovod has not been initialized; use hvd.init().")
        hvd.init()
        hvd.init()   # idempotent
        check("same rank", hvd.rank() == rank and hvd.size() == n)
    same("after cycles", hvd.allreduce(torch.tensor([2.0]), op=hvd.Sum), torch.tensor([2.0 * n]))


def sc_timeline():
    path = os.environ["HVD_TEST_TIMELINE"]
    hvd.start_timeline(path)
    for i in range(3):
        hvd.allreduce(torch.ones(8), name=f"tl.{i}")
    hvd.stop_timeline()
    hvd.barrier()


SCENARIOS = {f[3:]: fn for f, fn in dict(globals()).items() if f.startswith("sc_") and callable(fn)}


def main():
    names = sys.argv[1:]
    if "uninitialized" in names:
        names.remove("uninitialized")
        raises("size before init", ValueError, hvd.size, "Horovod has not been initialized; use hvd.init().")
        raises("allreduce before init", hvd.HorovodInternalError, lambda: hvd.allreduce(torch.ones(1)),
               "Horovod has not been initialized")
    if os.environ.get("HVD_TEST_LATE_TIMELINE"):
        # set after `import horovod.torch` (as Horovod's own tests do): hvd.init() still sees it
        os.environ["HOROVOD_TIMELINE"] = "DYNAMIC"
        os.environ["HVD_TEST_TIMELINE"] = os.environ["HVD_TEST_LATE_TIMELINE"]
        names.append("timeline")
    hvd.init()
    for name in names:
        try:
            SCENARIOS[name]()
        except Exception:
            fail(name, traceback.format_exc())
        if os.environ.get("HVD_TEST_VERBOSE"):
            print(f"rank {hvd.rank()}: {name} done", flush=True)
    rank = hvd.rank() if hvd.is_initialized() else -1
    for f in FAILS:
        print(f"rank {rank}: FAIL {f}", flush=True)
    print(f"rank {rank}: {CHECKS[0]} checks, {len(FAILS)} failures", flush=True)
    hvd.shutdown()
    sys.exit(1 if FAILS else 0)


if __name__ == "__main__":
    main()

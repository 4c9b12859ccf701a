"""One rank of a test job for test_backend.py: `worker.py SCENARIO [SCENARIO...]`.

Environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (torch's env://), and
optionally DSHIM_TEST_PRELOAD (a libdshim.so to load before dshim, so the
package uses that build).  Each scenario checks results against values
computed locally from every rank's (deterministic) inputs and records
failures; the process prints them and exits 1 if there was any, 0 otherwise.
"""
import ctypes
import datetime
import faulthandler
import os
import sys
import time
import traceback

if os.environ.get("DSHIM_TEST_PRELOAD"):
    ctypes.CDLL(os.environ["DSHIM_TEST_PRELOAD"], mode=ctypes.RTLD_GLOBAL)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import dshim  # noqa: E402,F401  (registers the backend even when autoload is off)

RANK = int(os.environ["RANK"])
N = int(os.environ["WORLD_SIZE"])
RO = dist.ReduceOp
FAILS = []
COUNT = [0]


def fail(what, detail=""):
    FAILS.append(f"rank {RANK}: {what}: {detail}")


def same(what, got, want, exact=True):
    COUNT[0] += 1
    try:
        if got.dtype != want.dtype or got.shape != want.shape:
            fail(what, f"dtype/shape {got.dtype}{tuple(got.shape)} != {want.dtype}{tuple(want.shape)}")
            return
        if exact:
            if got.dtype.is_floating_point and got.element_size() == 1:   # float8: compare the bits
                ok = torch.equal(got.view(torch.uint8), want.view(torch.uint8))
            else:
                ok = torch.equal(got, want)
        else:
            ok = torch.allclose(got.double(), want.double(), rtol=1e-2, atol=1e-2)
        if not ok:
            g, w = got.reshape(-1), want.reshape(-1)
            idx = (g.double() != w.double()).nonzero()
            i = int(idx[0]) if len(idx) else 0
            fail(what, f"differs at {i}: got {g[i].item()} want {w[i].item()} ({len(idx)} elements differ)")
    except Exception as e:
        fail(what, f"comparison raised {e!r}")


def run(what, fn):
    if os.environ.get("DSHIM_TEST_VERBOSE"):
        print(f"rank {RANK}: {what}", flush=True)
    try:
        fn()
    except Exception:
        fail(what, traceback.format_exc())


# --------------------------------------------------------------------------
# deterministic inputs: every rank can compute every other rank's data
# --------------------------------------------------------------------------

INT_DTYPES = (torch.int32, torch.int64, torch.uint8)
FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
DTYPES = FLOAT_DTYPES + INT_DTYPES + (torch.bool,)
SIZES = (0, 1, 7, 1000, 1 << 20)


def data(rank, n, dtype, salt=0, lo=-3, hi=4):
    """Small integers (exact in every dtype, sums and products stay exact)."""
    g = torch.Generator().manual_seed(1000003 * salt + 7919 * rank + n)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    if dtype == torch.uint8:
        lo = 0
    return torch.randint(lo, hi, (n,), generator=g).to(dtype)


def reference(inputs, op, dtype):
    """The reduction of the list `inputs` computed here, as dshim defines it."""
    if dtype == torch.bool:
        x = torch.stack([i.to(torch.uint8) for i in inputs])
        r = x.amax(0) if op in (RO.SUM, RO.MAX) else x.amin(0)
        return r.bool()
    wide = torch.float64 if dtype.is_floating_point else torch.int64
    x = torch.stack([i.to(wide) for i in inputs])
    if op == RO.SUM:
        r = x.sum(0)
    elif op == RO.PRODUCT:
        r = x.prod(0)
    elif op == RO.MIN:
        r = x.amin(0)
    elif op == RO.MAX:
        r = x.amax(0)
    elif op == RO.AVG:
        r = x.sum(0) / len(inputs) if dtype.is_floating_point else torch.div(x.sum(0), len(inputs),
                                                                            rounding_mode="trunc")
    return r.to(dtype)


def wait(work, async_op):
    if async_op:
        assert work is not None, "async_op=True returned no Work"
        work.wait()
        fut = work.get_future()
        assert fut.done(), "get_future() not done after wait()"
    else:
        assert work is None


# --------------------------------------------------------------------------
# the collective matrix
# --------------------------------------------------------------------------

def matrix(group=None, ranks=None, sizes=SIZES, dtypes=DTYPES, asyncs=(False, True)):
    """Every collective x dtype x size x async_op over `group` (members `ranks`)."""
    ranks = list(range(N)) if ranks is None else ranks
    n = len(ranks)
    me = ranks.index(RANK)
    for dtype in dtypes:
        for size in sizes:
            if size == 1 << 20 and dtype not in (torch.float32, torch.int64, torch.bfloat16):
                continue   # the large size for a few dtypes keeps the run short
            ins = [data(r, size, dtype) for r in range(n)]
            for a in asyncs:
                tag = f"{dtype} n={size} async={a}"
                ops = (RO.SUM, RO.PRODUCT, RO.MIN, RO.MAX) + (() if dtype == torch.bool else (RO.AVG,))
                for op in ops:
                    def f(op=op):
                        t = ins[me].clone()
                        wait(dist.all_reduce(t, op=op, group=group, async_op=a), a)
                        same(f"all_reduce {op} {tag}", t, reference(ins, op, dtype), exact=op != RO.AVG
                             or not dtype.is_floating_point)
                    run(f"all_reduce {op} {tag}", f)

                def bcast():
                    for root in range(n):
                        t = ins[me].clone()
                        wait(dist.broadcast(t, src=ranks[root], group=group, async_op=a), a)
                        same(f"broadcast root={root} {tag}", t, ins[root])
                run(f"broadcast {tag}", bcast)

                def reduce():
                    root = size % n
                    t = ins[me].clone()
                    wait(dist.reduce(t, dst=ranks[root], op=RO.SUM if dtype != torch.bool else RO.MAX,
                                     group=group, async_op=a), a)
                    if me == root:
                        same(f"reduce {tag}", t, reference(ins, RO.SUM, dtype))
                run(f"reduce {tag}", reduce)

                def allgather():
                    outs = [torch.full((size,), 9).to(dtype) for _ in range(n)]
                    wait(dist.all_gather(outs, ins[me], group=group, async_op=a), a)
                    for r in range(n):
                        same(f"all_gather block {r} {tag}", outs[r], ins[r])
                    out = torch.empty(n * size, dtype=dtype)
                    wait(dist.all_gather_into_tensor(out, ins[me], group=group, async_op=a), a)
                    same(f"all_gather_into_tensor {tag}", out, torch.cat(ins))
                run(f"all_gather {tag}", allgather)

                def reduce_scatter():
                    op = RO.SUM if dtype != torch.bool else RO.MAX
                    blocks = [data(r, n * size, dtype, salt=3) for r in range(n)]
                    want = reference(blocks, op, dtype)[me * size:(me + 1) * size]
                    out = torch.empty(size, dtype=dtype)
                    wait(dist.reduce_scatter_tensor(out, blocks[me], op=op, group=group, async_op=a), a)
                    same(f"reduce_scatter_tensor {tag}", out, want)
                    out = torch.empty(size, dtype=dtype)
                    wait(dist.reduce_scatter(out, list(blocks[me].chunk(n)) if size else
                                             [torch.empty(0, dtype=dtype)] * n, op=op, group=group,
                                             async_op=a), a)
                    same(f"reduce_scatter {tag}", out, want)
                run(f"reduce_scatter {tag}", reduce_scatter)

                def alltoall():
                    blocks = [data(r, n * size, dtype, salt=5) for r in range(n)]
                    want = torch.cat([blocks[r][me * size:(me + 1) * size] for r in range(n)])
                    out = torch.empty(n * size, dtype=dtype)
                    wait(dist.all_to_all_single(out, blocks[me], group=group, async_op=a), a)
                    same(f"all_to_all_single {tag}", out, want)
                    if size <= 1000:
                        outs = [torch.empty(size, dtype=dtype) for _ in range(n)]
                        ins_l = list(blocks[me].split(size)) if size else [torch.empty(0, dtype=dtype)] * n
                        wait(dist.all_to_all(outs, ins_l, group=group, async_op=a), a)
                        same(f"all_to_all {tag}", torch.cat(outs), want)
                run(f"all_to_all {tag}", alltoall)

                if size <= 1000:
                    def gather_scatter():
                        root = (size + 1) % n
                        gl = [torch.empty(size, dtype=dtype) for _ in range(n)] if me == root else None
                        wait(dist.gather(ins[me], gl, dst=ranks[root], group=group, async_op=a), a)
                        if me == root:
                            for r in range(n):
                                same(f"gather block {r} {tag}", gl[r], ins[r])
                        out = torch.empty(size, dtype=dtype)
                        sl = [ins[r] for r in range(n)] if me == root else None
                        wait(dist.scatter(out, sl, src=ranks[root], group=group, async_op=a), a)
                        same(f"scatter {tag}", out, ins[me])
                    run(f"gather/scatter {tag}", gather_scatter)
    run("barrier", lambda: (dist.barrier(group=group), wait(dist.barrier(group=group, async_op=True), True)))


def extras(group=None, ranks=None):
    """Non-contiguous tensors, coalesced ops, uneven splits, complex, premul, fp8,
    many outstanding async ops."""
    ranks = list(range(N)) if ranks is None else ranks
    n = len(ranks)
    me = ranks.index(RANK)

    def noncontig():
        base = [data(r, 6 * 5, torch.float32, salt=11).reshape(6, 5) for r in range(n)]
        t = base[me].clone().t()                      # non-contiguous (5, 6) view
        assert not t.is_contiguous()
        dist.all_reduce(t, group=group)
        same("all_reduce non-contiguous", t, reference([b.t() for b in base], RO.SUM, torch.float32))
        t = base[me].clone().t()
        dist.broadcast(t, src=ranks[n - 1], group=group)
        same("broadcast non-contiguous", t, base[n - 1].t())
        outs = [torch.zeros(3, 6).t() for _ in range(n)]
        assert not outs[0].is_contiguous()
        dist.all_gather(outs, base[me][:, ::2], group=group)  # non-contiguous input and outputs
        for r in range(n):
            same(f"all_gather non-contiguous {r}", outs[r], base[r][:, ::2])
        buf = torch.full((n * 7,), -1.0)
        dist.all_gather(list(buf.split(7)), base[me][0, :5].repeat(2)[:7], group=group)  # views of one buffer
        same("all_gather into one buffer's pieces", buf, torch.cat([b[0, :5].repeat(2)[:7] for b in base]))
        out = torch.zeros(n * 4, 3)[:, 1]                    # strided output
        dist.all_gather_into_tensor(out, base[me][0, :4], group=group)
        same("all_gather_into_tensor strided", out, torch.cat([b[0, :4] for b in base]))
        big = torch.zeros(3, n * 5)[1]                       # contiguous view with an offset
        dist.all_gather_into_tensor(big, base[me][2], group=group)
        same("all_gather_into_tensor offset view", big, torch.cat([b[2] for b in base]))
        w = dist.all_reduce(t := base[me].clone()[:, 1:4], async_op=True, group=group)
        w.wait()
        same("all_reduce non-contiguous async", t, reference([b[:, 1:4] for b in base], RO.SUM, torch.float32))
    run("non-contiguous", noncontig)

    def coalesced():
        ts = [data(me, 5 + k, torch.float32, salt=k) for k in range(4)] + [data(me, 3, torch.int64, salt=9)]
        want = [reference([data(r, 5 + k, torch.float32, salt=k) for r in range(n)], RO.SUM, torch.float32)
                for k in range(4)] + [reference([data(r, 3, torch.int64, salt=9) for r in range(n)], RO.SUM,
                                                torch.int64)]
        w = group_of(group).allreduce_coalesced(ts, dist.AllreduceCoalescedOptions())
        w.wait()
        for k, (t, ww) in enumerate(zip(ts, want)):
            same(f"allreduce_coalesced {k}", t, ww)
        # the coalescing manager (FSDP-style fast paths)
        from torch.distributed.distributed_c10d import _coalescing_manager
        ins = [data(me, 4, torch.float32, salt=20 + k) for k in range(3)]
        outs = [torch.empty(4 * n) for _ in range(3)]
        with _coalescing_manager(group=group, async_ops=True) as cm:
            for o, i in zip(outs, ins):
                dist.all_gather_into_tensor(o, i, group=group)
        cm.wait()
        for k in range(3):
            same(f"coalesced all_gather_into_tensor {k}", outs[k],
                 torch.cat([data(r, 4, torch.float32, salt=20 + k) for r in range(n)]))
        ins = [data(me, 4 * n, torch.float32, salt=30 + k) for k in range(3)]
        outs = [torch.empty(4) for _ in range(3)]
        with _coalescing_manager(group=group, async_ops=False):
            for o, i in zip(outs, ins):
                dist.reduce_scatter_tensor(o, i, group=group)
        for k in range(3):
            same(f"coalesced reduce_scatter_tensor {k}", outs[k],
                 reference([data(r, 4 * n, torch.float32, salt=30 + k) for r in range(n)], RO.SUM,
                           torch.float32)[4 * me:4 * me + 4])
        ts = [data(me, 6, torch.float32, salt=40 + k) for k in range(3)]
        with _coalescing_manager(group=group, async_ops=False):
            for t in ts:
                dist.all_reduce(t, group=group)
        for k in range(3):
            same(f"coalesced all_reduce {k}", ts[k],
                 reference([data(r, 6, torch.float32, salt=40 + k) for r in range(n)], RO.SUM, torch.float32))
        # torch's layout: one output list per rank, shaped like the input list
        outs = [[torch.empty(3), torch.empty(2, 2)] for _ in range(n)]
        ins2 = [data(me, 3, torch.float32, salt=50), data(me, 4, torch.float32, salt=51).reshape(2, 2)]
        dist.all_gather_coalesced(outs, ins2, group=group)
        for r in range(n):
            same(f"all_gather_coalesced 0/{r}", outs[r][0], data(r, 3, torch.float32, salt=50))
            same(f"all_gather_coalesced 1/{r}", outs[r][1], data(r, 4, torch.float32, salt=51).reshape(2, 2))
    run("coalesced", coalesced)

    def uneven():
        width = 3
        # rank r sends (r + j) % 3 rows to rank j (some zero)
        split = [[(r + j) % 3 for j in range(n)] for r in range(n)]
        rows = [data(r, sum(split[r]) * width, torch.float64, salt=60).reshape(-1, width) for r in range(n)]
        in_splits = split[me]
        out_splits = [split[r][me] for r in range(n)]
        out = torch.empty(sum(out_splits), width, dtype=torch.float64)
        for a in (False, True):
            out.fill_(-1)
            wait(dist.all_to_all_single(out, rows[me], out_splits, in_splits, group=group, async_op=a), a)
            want = []
            for r in range(n):
                off = sum(split[r][:me])
                want.append(rows[r][off:off + split[r][me]])
            same(f"all_to_all_single uneven async={a}", out, torch.cat(want))
        # all_gather with different sizes per rank
        sizes = [r + 1 for r in range(n)]
        outs = [torch.empty(s) for s in sizes]
        dist.all_gather(outs, data(me, sizes[me], torch.float32, salt=61), group=group)
        for r in range(n):
            same(f"all_gather uneven {r}", outs[r], data(r, sizes[r], torch.float32, salt=61))
        # reduce_scatter with different block sizes (dshim_reduce_scatterv), one of them empty,
        # sync and async, float32 and complex64 (pairs of floats to dshim)
        for dt in (torch.float32, torch.complex64):
            def block(r, k):   # small integers: every order of summation is exact
                re_ = data(r, (k + 1) % n * 2, torch.float32, salt=62 + k)
                return re_ if dt == torch.float32 else torch.complex(re_, data(r, re_.numel(), torch.float32, 72 + k))
            blocks = [[block(r, k) for k in range(n)] for r in range(n)]
            want = torch.stack([blocks[r][me] for r in range(n)]).sum(0)
            for a in (False, True):
                out = torch.full(((me + 1) % n * 2,), -1, dtype=dt)
                wait(dist.reduce_scatter(out, blocks[me], group=group, async_op=a), a)
                same(f"reduce_scatter uneven {dt} async={a}", out, want)
        # all_to_all (list) with different sizes
        ins = [data(me, me + j, torch.int32, salt=63) for j in range(n)]
        outs = [torch.empty(r + me, dtype=torch.int32) for r in range(n)]
        dist.all_to_all(outs, ins, group=group)
        for r in range(n):
            same(f"all_to_all uneven from {r}", outs[r], data(r, r + me, torch.int32, salt=63))
    run("uneven", uneven)

    def complex_premul_fp8():
        zs = [torch.complex(data(r, 9, torch.float32, salt=70), data(r, 9, torch.float32, salt=71))
              for r in range(n)]
        z = zs[me].clone()
        dist.all_reduce(z, group=group)
        same("all_reduce complex64", z, sum(zs[1:], zs[0].clone()))
        z = zs[me].clone().to(torch.complex128)
        dist.broadcast(z, src=ranks[0], group=group)
        same("broadcast complex128", z, zs[0].to(torch.complex128))
        outs = [torch.empty(9, dtype=torch.complex64) for _ in range(n)]
        dist.all_gather(outs, zs[me], group=group)
        for r in range(n):
            same(f"all_gather complex {r}", outs[r], zs[r])
        try:
            dist.all_reduce(zs[me].clone(), op=RO.MAX, group=group)
            fail("all_reduce complex MAX", "no error")
        except (ValueError, RuntimeError):
            pass
        # PREMUL_SUM: sum of factor * x (the form NCCL users and FSDP pass)
        xs = [data(r, 11, torch.float32, salt=72) for r in range(n)]
        t = xs[me].clone()
        dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5), group=group)
        same("all_reduce PREMUL_SUM(0.5)", t, reference([x * 0.5 for x in xs], RO.SUM, torch.float32))
        t = xs[me].clone()
        dist.all_reduce(t, op=dist._make_nccl_premul_sum(torch.tensor([2.0])), group=group)
        same("all_reduce PREMUL_SUM(tensor 2)", t, reference([x * 2 for x in xs], RO.SUM, torch.float32))
        big = [data(r, 4 * n, torch.float32, salt=73) for r in range(n)]
        out = torch.empty(4)
        src = big[me].clone()
        dist.reduce_scatter_tensor(out, src, op=dist._make_nccl_premul_sum(0.25), group=group)
        same("reduce_scatter_tensor PREMUL_SUM", out,
             reference([b * 0.25 for b in big], RO.SUM, torch.float32)[4 * me:4 * me + 4])
        same("reduce_scatter_tensor PREMUL_SUM leaves its input alone", src, big[me])
        for dt in (torch.float8_e4m3fn, torch.float8_e5m2):
            xs = [data(r, 17, torch.float32, salt=74, lo=0, hi=3).to(dt) for r in range(n)]
            t = xs[me].clone()
            dist.all_reduce(t, group=group)
            same(f"all_reduce {dt}", t, sum(x.float() for x in xs).to(dt))
            outs = [torch.empty(17, dtype=dt) for _ in range(n)]
            dist.all_gather(outs, xs[me], group=group)
            for r in range(n):
                same(f"all_gather {dt} {r}", outs[r], xs[r])
        for dt in (torch.int8, torch.int16, torch.float16):   # int16 only moves (no reduction in dshim)
            xs = [data(r, 5, dt, salt=75) for r in range(n)]
            t = xs[me].clone()
            dist.broadcast(t, src=ranks[n - 1], group=group)
            same(f"broadcast {dt}", t, xs[n - 1])
    run("complex/premul/fp8", complex_premul_fp8)

    def many_async():
        # 200 outstanding operations of mixed kinds, waited for in reverse order
        works, checks = [], []
        for k in range(200):
            t = data(me, 1 + k % 50, torch.float32, salt=80 + k)
            if k % 3 == 0:
                works.append(dist.all_reduce(t, group=group, async_op=True))
                checks.append((t, reference([data(r, 1 + k % 50, torch.float32, salt=80 + k) for r in range(n)],
                                            RO.SUM, torch.float32)))
            elif k % 3 == 1:
                works.append(dist.broadcast(t, src=ranks[k % n], group=group, async_op=True))
                checks.append((t, data(k % n, 1 + k % 50, torch.float32, salt=80 + k)))
            else:
                out = torch.empty(n * t.numel())
                works.append(dist.all_gather_into_tensor(out, t, group=group, async_op=True))
                checks.append((out, torch.cat([data(r, 1 + k % 50, torch.float32, salt=80 + k)
                                               for r in range(n)])))
        for w in reversed(works):
            w.wait()
        for k, (got, want) in enumerate(checks):
            same(f"async #{k}", got, want)
        # futures: then() chains run after completion with the tensors as value
        t = torch.ones(4) * (me + 1)
        fut = dist.all_reduce(t, group=group, async_op=True).get_future().then(lambda f: f.value()[0] * 2)
        same("future then()", fut.wait(), torch.full((4,), float(n * (n + 1))))
    run("many async", many_async)


def group_of(group):
    return group if group is not None else dist.group.WORLD


def objects(group=None, ranks=None):
    ranks = list(range(N)) if ranks is None else ranks
    n = len(ranks)
    me = ranks.index(RANK)

    def f():
        objs = [None] * n
        mine = {"rank": RANK, "payload": "x" * (100 * me), "t": torch.arange(me)}
        dist.all_gather_object(objs, mine, group=group)
        for r in range(n):
            assert objs[r]["rank"] == ranks[r] and len(objs[r]["payload"]) == 100 * r, objs[r]
            assert torch.equal(objs[r]["t"], torch.arange(r))
        COUNT[0] += 1
        lst = [{"from": ranks[-1], "v": list(range(7))}, "two"] if me == n - 1 else [None, None]
        dist.broadcast_object_list(lst, src=ranks[-1], group=group)
        assert lst == [{"from": ranks[-1], "v": list(range(7))}, "two"], lst
        got = [None] * n if me == 0 else None
        dist.gather_object(("g", RANK), got, dst=ranks[0], group=group)
        if me == 0:
            assert got == [("g", r) for r in ranks], got
        out = [None]
        dist.scatter_object_list(out, [("s", r) for r in ranks] if me == 0 else None, src=ranks[0], group=group)
        assert out == [("s", RANK)], out
        COUNT[0] += 3
    run("object collectives", f)


def p2p(group=None, ranks=None):
    ranks = list(range(N)) if ranks is None else ranks
    n = len(ranks)
    me = ranks.index(RANK)
    right, left = ranks[(me + 1) % n], ranks[(me - 1) % n]

    def ring():
        # blocking send/recv ring (even ranks send first) and isend/irecv both ways
        for size in (0, 1, 1000, 1 << 20):
            t = data(RANK, size, torch.float32, salt=90)
            r = torch.empty(size)
            if me % 2 == 0:
                dist.send(t, dst=right, group=group)
                dist.recv(r, src=left, group=group)
            else:
                dist.recv(r, src=left, group=group)
                dist.send(t, dst=right, group=group)
            same(f"send/recv ring {size}", r, data(left, size, torch.float32, salt=90))
            rs = torch.empty(size)
            ws = [dist.isend(t, dst=right, group=group), dist.irecv(rs, src=left, group=group)]
            for w in ws:
                w.wait()
            same(f"isend/irecv ring {size}", rs, data(left, size, torch.float32, salt=90))
        # batch_isend_irecv both directions, non-contiguous receive buffer
        t = data(RANK, 12, torch.int64, salt=91)
        r1, r2 = torch.empty(12, dtype=torch.int64), torch.zeros(12, 2, dtype=torch.int64)[:, 0]
        ops = [dist.P2POp(dist.isend, t, right, group=group), dist.P2POp(dist.irecv, r1, left, group=group),
               dist.P2POp(dist.isend, t, left, group=group), dist.P2POp(dist.irecv, r2, right, group=group)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        same("batch_isend_irecv from left", r1, data(left, 12, torch.int64, salt=91))
        same("batch_isend_irecv from right (strided)", r2, data(right, 12, torch.int64, salt=91))
    run("p2p", ring)


# --------------------------------------------------------------------------
# scenarios
# --------------------------------------------------------------------------

def init(**kw):
    dist.init_process_group("dshim", **kw)
    assert dist.get_backend() == "dshim", dist.get_backend()


def sc_collectives():
    init()
    want = os.environ.get("DSHIM_TRANSPORT", "shm")
    if N > 1 and dist.group.WORLD.transport != want:
        fail("transport", f"{dist.group.WORLD.transport}, want {want}")
    small = os.environ.get("DSHIM_TEST_SMALL") == "1"
    if small:
        matrix(sizes=(0, 7, 1000), dtypes=(torch.float32, torch.int32, torch.bfloat16, torch.bool))
    else:
        matrix()
    extras()
    objects()
    p2p()


def sc_subgroup():
    init()
    assert N == 3
    ranks = [0, 2]
    g = dist.new_group(ranks)
    if RANK in ranks:
        assert dist.get_backend(g) == "dshim"
        assert isinstance(g, dshim.process_group.DshimProcessGroup), type(g)
        assert g.size() == 2 and g.rank() == ranks.index(RANK)
        matrix(group=g, ranks=ranks, sizes=(0, 7, 1000), dtypes=(torch.float32, torch.int64, torch.bool))
        extras(group=g, ranks=ranks)
        objects(group=g, ranks=ranks)
        p2p(group=g, ranks=ranks)
    else:
        assert g == dist.GroupMember.NON_GROUP_MEMBER
    # the world group still works alongside, before and after
    t = torch.ones(3) * RANK
    dist.all_reduce(t)
    same("world after subgroup", t, torch.full((3,), float(sum(range(N)))))
    # a second sub-group over all ranks in another order, and one of one rank
    g2 = dist.new_group([2, 1, 0])
    t = torch.ones(2) * (RANK + 1)
    dist.all_reduce(t, group=g2)
    same("new_group([2,1,0])", t, torch.full((2,), float(sum(range(1, N + 1)))))
    g1 = dist.new_group([1])
    if RANK == 1:
        t = torch.ones(2) * 5
        dist.all_reduce(t, group=g1)
        same("group of one", t, torch.full((2,), 5.0))
    dist.destroy_process_group(g2)
    dist.barrier()


def _expect_group_order_error(create):
    """create() makes sub-groups in an order other ranks do not share: every rank involved must
    raise at once, naming what each rank created, and never sum with a wrong set of ranks."""
    t0 = time.monotonic()
    COUNT[0] += 1
    try:
        groups = create()
        for g in groups:   # had a wrong group formed, its sum would tell
            if g is not None and g != dist.GroupMember.NON_GROUP_MEMBER:
                t = torch.ones(1) * (RANK + 1)
                dist.all_reduce(t, group=g)
                print(f"rank {RANK}: all_reduce over a group gave {t.item()}", flush=True)
        fail("groups created in different orders", "no error")
    except RuntimeError as e:
        msg = str(e)
        if "created in a different order" not in msg or " created group " not in msg:
            fail("groups created in different orders", f"unclear message: {msg}")
        print(f"rank {RANK}: group order error after {time.monotonic() - t0:.1f} s: {msg}", flush=True)


def sc_group_order():
    """Ranks 0 and 1 create [0, 1] then [0, 1, 2]; rank 2 only [0, 1, 2] (torch names both
    groups "1" on different ranks).  gloo sums 13 where 3 and 23 are due."""
    init()
    assert N == 3
    if RANK < 2:
        _expect_group_order_error(lambda: [dist.new_group([0, 1]), dist.new_group([0, 1, 2])])
    else:
        _expect_group_order_error(lambda: [dist.new_group([0, 1, 2])])


def sc_group_order_overlap():
    """Overlapping groups created in different orders: ranks 0 and 2 make [0, 1] then [1, 2],
    rank 1 makes [1, 2] then [0, 1]."""
    init()
    assert N == 3
    order = ([1, 2], [0, 1]) if RANK == 1 else ([0, 1], [1, 2])
    _expect_group_order_error(lambda: [dist.new_group(order[0]), dist.new_group(order[1])])


def sc_reinit_own_store():
    """The script makes the TCPStore and passes it (store=...) to each of three inits: it outlives
    every destroy, so no rank waits in destroy for it to close."""
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), N, RANK == 0,
                          datetime.timedelta(seconds=60))
    for i in range(3):
        dist.init_process_group("dshim", store=store, rank=RANK, world_size=N)
        t = torch.ones(3) * (RANK + 1)
        dist.all_reduce(t)
        same(f"round {i} all_reduce", t, torch.full((3,), float(N * (N + 1) // 2)))
        t0 = time.monotonic()
        dist.destroy_process_group()
        took = time.monotonic() - t0
        if took > 5:
            fail(f"round {i} destroy_process_group", f"took {took:.1f} s with a store the script keeps")


def sc_root_logger():
    """An application's root logger at INFO (logging.basicConfig) must not show dshim's lines:
    gloo prints nothing there; DSHIM_DEBUG governs dshim's own."""
    import logging
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="ROOT %(levelname)s:%(name)s:%(message)s")
    init()
    t = torch.ones(1)
    dist.all_reduce(t)
    same("all_reduce", t, torch.full((1,), float(N)))


def sc_reinit():
    """init_process_group / destroy_process_group four times in one process (torch's own tests
    and notebooks do): each round's all_reduce right, no round meets the last round's store."""
    for i in range(4):
        init()
        t = torch.ones(3) * (RANK + 1)
        dist.all_reduce(t)
        same(f"round {i} all_reduce", t, torch.full((3,), float(N * (N + 1) // 2)))
        if i == 3:
            break   # main() destroys the last one
        dist.destroy_process_group()


def sc_errors():
    init()
    t = torch.ones(4)
    for op in (RO.BAND, RO.BOR, RO.BXOR):
        try:
            dist.all_reduce(t, op=op)
            fail(f"all_reduce {op}", "no error")
        except RuntimeError as e:
            if "not supported" not in str(e) or "SUM/PRODUCT/MIN/MAX/AVG" not in str(e):
                fail(f"all_reduce {op}", f"unclear message: {e}")
    # bool BAND/BOR are logical and/or, which dshim can do exactly
    b = torch.tensor([True, False, RANK == 0])
    dist.all_reduce(b, op=RO.BOR)
    same("bool BOR", b, torch.tensor([True, False, True]))
    try:
        dist.all_reduce(torch.ones(3, dtype=torch.int16))
        fail("int16 all_reduce", "no error")
    except RuntimeError as e:
        if "int16" not in str(e):
            fail("int16 all_reduce", f"unclear message: {e}")
    # dist.monitored_barrier reaches a "dshim" group (torch's own guard admits only gloo; _monitored.py)
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=60), wait_all_ranks=RANK % 2 == 0)
    try:
        dist.send(torch.ones(1), dst=RANK)
        fail("send to self", "no error")
    except (RuntimeError, ValueError):
        pass
    # after refused calls the group still works
    t = torch.ones(4)
    dist.all_reduce(t)
    same("all_reduce after refused calls", t, torch.full((4,), float(N)))
    # ranks that disagree on the size: an error on every rank, not a hang; async:
    # wait() raises it, the Work reports it, and its Future is failed for C++ callers too
    g = dist.new_group(list(range(N)))
    w = dist.all_reduce(torch.ones(10 + 10 * RANK), group=g, async_op=True)
    try:
        w.wait()
        fail("async mismatch", "wait() did not raise")
    except RuntimeError as e:
        if "mismatched collectives" not in str(e):
            fail("async mismatch", f"unclear message: {e}")
    if w.is_success() or w.exception() is None or not w.is_completed():
        fail("async mismatch", "the Work does not report the failure")
    try:
        w.get_future().wait()
        fail("async mismatch", "get_future().wait() did not raise")
    except RuntimeError as e:
        if "mismatched collectives" not in str(e):
            fail("async mismatch future", f"unclear message: {e}")
    COUNT[0] += 1
    t = torch.ones(10 + 10 * RANK)
    t0 = time.monotonic()
    try:
        dist.all_reduce(t)
        fail("mismatched all_reduce sizes", "no error")
    except RuntimeError as e:
        msg = str(e)
        if "all_reduce" not in msg or f"rank {RANK}" not in msg:
            fail("mismatched all_reduce sizes", f"unclear message: {msg}")
        print(f"rank {RANK}: mismatch error after {time.monotonic() - t0:.1f} s: {msg}", flush=True)
    # the communicator is poisoned now: later calls fail fast, async ones on wait()
    try:
        dist.all_reduce(torch.ones(1), async_op=True).wait()
        fail("all_reduce after a failure", "no error")
    except RuntimeError:
        pass


def sc_timeout():
    init(timeout=datetime.timedelta(seconds=3))
    # torch's own store (rank 0 hosts it), with a timeout of its own for the handshake at the end
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), N, False,
                          datetime.timedelta(seconds=60))
    t = torch.ones(4)
    dist.all_reduce(t)
    if RANK == 0:
        t0 = time.monotonic()
        try:
            dist.all_reduce(t, async_op=True).wait()
            fail("timeout", "no error")
        except RuntimeError as e:
            el = time.monotonic() - t0
            print(f"rank 0: timeout error after {el:.1f} s: {e}", flush=True)
            for want in ("all_reduce #1", "3 s", "did not arrive at it: 1"):
                if want not in str(e):
                    fail("timeout", f"message lacks {want!r}: {e}")
            if not 2.5 < el < 8:
                fail("timeout", f"raised after {el:.1f} s, want about 3 s")
        # rank 0 hosts the store that carries its verdict to rank 1: stay until rank 1 has read it
        # (exiting first would turn rank 1's error into "rank 0 closed its socket", by timing alone)
        store.wait(["timeout_peer_checked"], datetime.timedelta(seconds=60))
    else:
        time.sleep(6)   # never joins that all_reduce in time
        try:
            # the first may still complete from data rank 0 sent before it gave up
            for _ in range(3):
                dist.all_reduce(t)
            fail("timeout peer", "no error")
        except RuntimeError as e:
            print(f"rank {RANK}: peer error: {e}", flush=True)
            if "did not complete within 3 s" not in str(e):
                fail("timeout peer", f"message does not say why: {e}")
        store.set("timeout_peer_checked", "1")


def sc_timeout_rule():
    """The user's DSHIM_TIMEOUT (3 s, set by the test) governs over init_process_group's 60 s, and
    DSHIM_STALL_WARN (1 s) warns before it fails (the test reads the warnings from rank 0's output)."""
    init(timeout=datetime.timedelta(seconds=60))
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), N, False,
                          datetime.timedelta(seconds=60))
    t = torch.ones(4)
    dist.all_reduce(t)
    if RANK == 0:
        t0 = time.monotonic()
        try:
            dist.all_reduce(t)
            fail("timeout rule", "no error")
        except RuntimeError as e:
            el = time.monotonic() - t0
            print(f"rank 0: timeout error after {el:.1f} s: {e}", flush=True)
            if "did not complete within 3 s" not in str(e):
                fail("timeout rule", f"not DSHIM_TIMEOUT's 3 s: {e}")
            if not 2.5 < el < 20:
                fail("timeout rule", f"raised after {el:.1f} s, want about 3 s (not the group's 60 s)")
        store.wait(["timeout_rule_peer_done"], datetime.timedelta(seconds=60))
    else:
        time.sleep(6)   # never joins that all_reduce in time
        try:
            for _ in range(3):
                dist.all_reduce(t)
        except RuntimeError as e:
            print(f"rank {RANK}: peer error: {e}", flush=True)
        store.set("timeout_rule_peer_done", "1")


def sc_no_destroy():
    """The script ends without destroy_process_group: atexit closes the groups."""
    global DESTROY
    DESTROY = False
    init()
    g = dist.new_group([0, 1])
    for grp, n in ((None, N), (g, 2)):
        if RANK < n:
            t = torch.ones(3)
            dist.all_reduce(t, group=grp)
            same("all_reduce", t, torch.full((3,), float(n)))
    dist.all_reduce(torch.ones(1), async_op=True).wait()


def sc_rank_exits():
    """Rank 1 leaves with an operation in flight: every other rank gets an
    error naming it at once, not at a timeout."""
    global DESTROY
    DESTROY = False
    init()
    dist.all_reduce(torch.ones(2))
    if RANK == 1:
        dist.broadcast(torch.ones(2), src=0, async_op=True)   # never waited for
        print(f"rank {RANK}: leaving", flush=True)
        os._exit(0) if os.environ.get("DSHIM_TEST_HARD_EXIT") else sys.exit(3)
    time.sleep(1)
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(2))
        dist.all_reduce(torch.ones(2))
        fail("peer left", "no error")
    except RuntimeError as e:
        print(f"rank {RANK}: peer error after {time.monotonic() - t0:.1f} s: {e}", flush=True)


def sc_ddp():
    """DDP on a tiny model equals a single-process reference (same data, SGD)."""
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    init()
    torch.manual_seed(0)

    def model():
        torch.manual_seed(1234)
        return nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 32), nn.BatchNorm1d(32), nn.Tanh(),
                             nn.Linear(32, 4))

    steps, per_rank, accum = 6, 8, 2
    g = torch.Generator().manual_seed(99)
    xs = torch.randn(steps, accum, N * per_rank, 10, generator=g)
    ys = torch.randn(steps, accum, N * per_rank, 4, generator=g)
    for hook in (None, "fp16"):
        ref = model()
        ddp = DDP(model(), bucket_cap_mb=0.001)   # several buckets
        if hook == "fp16":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
            ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
        lo, hi = RANK * per_rank, (RANK + 1) * per_rank
        for s in range(steps):
            opt.zero_grad()
            ropt.zero_grad()
            for a in range(accum):
                if a < accum - 1:
                    with ddp.no_sync():
                        (nn.functional.mse_loss(ddp(xs[s, a, lo:hi]), ys[s, a, lo:hi]) / accum).backward()
                else:
                    (nn.functional.mse_loss(ddp(xs[s, a, lo:hi]), ys[s, a, lo:hi]) / accum).backward()
                # the reference sees every rank's batch: BatchNorm statistics differ from DDP's
                # per-rank ones, so it runs per rank slice and averages the gradients
                for r in range(N):
                    sl = slice(r * per_rank, (r + 1) * per_rank)
                    (nn.functional.mse_loss(ref(xs[s, a, sl]), ys[s, a, sl]) / accum / N).backward()
            opt.step()
            ropt.step()
        tol = dict(rtol=1e-6, atol=1e-7) if hook is None else dict(rtol=2e-3, atol=2e-4)
        for (name, p), q in zip(ddp.module.named_parameters(), ref.parameters()):
            COUNT[0] += 1
            if not torch.allclose(p, q, **tol):
                fail(f"DDP {hook} {name}", f"max abs diff {(p - q).abs().max().item():.3g}")
        # every rank holds the same parameters, bit for bit
        flat = torch.cat([p.detach().reshape(-1) for p in ddp.module.parameters()])
        outs = [torch.empty_like(flat) for _ in range(N)]
        dist.all_gather(outs, flat)
        for r in range(N):
            same(f"DDP {hook} rank {r} parameters equal rank 0's", outs[r], outs[0])


def sc_ddp_error():
    """A collective failing under DDP (here: rank 1 issues an extra all_reduce
    that meets rank 0's first gradient bucket) raises in every rank, no hang."""
    global DESTROY
    DESTROY = False
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    init()
    torch.manual_seed(0)
    ddp = DDP(nn.Sequential(nn.Linear(4, 64), nn.Linear(64, 3)), bucket_cap_mb=0.0001)
    ddp(torch.randn(2, 4)).sum().backward()   # one good step
    t0 = time.monotonic()
    try:
        if RANK == 1:
            dist.all_reduce(torch.ones(7))
        ddp(torch.randn(2, 4)).sum().backward()
        fail("DDP with a failing all_reduce", "no error")
    except RuntimeError as e:
        print(f"rank {RANK}: DDP error after {time.monotonic() - t0:.1f} s: {str(e)[:300]}", flush=True)
        if "dshim" not in str(e):
            fail("DDP error", f"does not come from dshim: {e}")


def sc_single():
    init()
    assert dist.get_world_size() == 1
    t = torch.arange(5.0)
    dist.all_reduce(t)
    same("single all_reduce", t, torch.arange(5.0))
    out = torch.empty(5)
    dist.all_gather_into_tensor(out, t)
    same("single all_gather", out, t)
    dist.barrier()
    objs = [None]
    dist.all_gather_object(objs, "x")
    assert objs == ["x"]


def _own_ipv4_listeners():
    """[(address, port)] of the IPv4 sockets this process listens on."""
    from dshim import _comm
    inodes = _comm._own_sockets()   # socket inodes of this process's descriptors
    found = []
    with open("/proc/self/net/tcp") as f:
        for line in f.readlines()[1:]:
            cols = line.split()
            ip_hex, port_hex = cols[1].split(":")
            if cols[3] == "0A" and cols[9] in inodes:
                ip = ".".join(str(b) for b in reversed(bytes.fromhex(ip_hex)))
                found.append((ip, int(port_hex, 16)))
    return found


def sc_listeners():
    """A loopback job: dshim's store (rank 0) listens on 127.0.0.1, not on every interface."""
    init()
    dist.barrier()
    if RANK == 0:
        torch_store = int(os.environ["MASTER_PORT"])   # torch's TCPStore: torch's choice, not dshim's
        mine = [(ip, port) for ip, port in _own_ipv4_listeners() if port != torch_store]
        COUNT[0] += 1
        if not mine or {ip for ip, _ in mine} != {"127.0.0.1"}:
            fail("dshim's store must listen on 127.0.0.1 only", f"listeners besides torch's: {mine}")
    dist.barrier()


def sc_cuda():
    init()
    dev = torch.device("cuda", RANK % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    xs = [data(r, 1000, torch.float32, salt=100) for r in range(N)]
    t = xs[RANK].to(dev)
    dist.all_reduce(t)
    same("cuda all_reduce", t.cpu(), reference(xs, RO.SUM, torch.float32))
    t = xs[RANK].to(dev)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        w = dist.all_reduce(t, async_op=True)
    w.wait()
    same("cuda all_reduce async on a side stream", t.cpu(), reference(xs, RO.SUM, torch.float32))
    out = torch.empty(N * 1000, device=dev)
    dist.all_gather_into_tensor(out, xs[RANK].to(dev))
    same("cuda all_gather_into_tensor", out.cpu(), torch.cat(xs))
    t = xs[RANK].to(dev)
    dist.broadcast(t, src=0)
    same("cuda broadcast", t.cpu(), xs[0])
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(0)
    m = DDP(nn.Linear(8, 8).to(dev), device_ids=[dev])
    m(torch.randn(4, 8, device=dev)).sum().backward()
    flat = torch.cat([p.grad.reshape(-1) for p in m.parameters()])
    outs = [torch.empty_like(flat) for _ in range(N)]
    dist.all_gather(outs, flat)
    for r in range(N):
        same(f"cuda DDP grads equal on rank {r}", outs[r], outs[0])


DESTROY = True
SCENARIOS = {k[3:]: v for k, v in globals().items() if k.startswith("sc_")}


def main():
    t0 = time.monotonic()
    if os.environ.get("DSHIM_TEST_DUMP_AFTER"):
        # a hang shows every thread's stack in the test's output
        faulthandler.dump_traceback_later(float(os.environ["DSHIM_TEST_DUMP_AFTER"]), exit=True)
    for name in sys.argv[1:]:
        run(f"scenario {name}", SCENARIOS[name])
    if dist.is_initialized() and DESTROY:
        try:
            dist.destroy_process_group()
        except Exception as e:
            if not set(sys.argv[1:]) & {"errors", "timeout"}:   # those end with a failed group
                fail("destroy_process_group", repr(e))
    for f in FAILS[:30]:
        print("FAIL", f, flush=True)
    if len(FAILS) > 30:
        print(f"FAIL ... {len(FAILS) - 30} more", flush=True)
    print(f"rank {RANK}: {COUNT[0]} checks, {len(FAILS)} failures, {time.monotonic() - t0:.1f} s", flush=True)
    sys.exit(1 if FAILS else 0)


if __name__ == "__main__":
    main()

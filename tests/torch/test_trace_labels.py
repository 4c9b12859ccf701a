"""The flight recorder's labels from the torch backend: each entry names the torch call it
came from, as torch's own flight recorder names it ("torch all_reduce", "torch _all_gather_base"), and
DDP's gradient all-reduces name their bucket ("DDP bucket K"; rules in python/dshim/process_group.py).

This file is also the ranks' program (`python test_trace_labels.py MODE`, MODE "dshim": backend
"dshim"; "takeover": backend "gloo" under LD_PRELOAD=libdshim.so).  2 ranks run, in sections separated
by marker broadcasts of 1001, 1002, ... bytes:
  ops    one of each torch.distributed call (sync and async), send/recv, and an all_reduce made by a
         custom autograd Function inside a backward pass (a torch all_reduce, not a bucket);
  ddp    DDP with the default (C++) all-reduce, 3 steps, small buckets (rule 3: counted);
  hook   the same model with a Python comm hook that all-reduces each bucket in two halves (rule 2:
         the GradBucket's index), recording the hook's (index, elements) to stdout;
  unused find_unused_parameters=True with a layer left unused: the int32 map of used parameters;
then dshim_trace_dump() (DSHIM_TRACE_DIR = the test's directory).  The test reads each rank's dump
(dshim-trace.<rank>.<pid>.jsonl) and checks every entry's label.  The ddp section's buckets (counted
from C++ calls) must equal the hook section's (the GradBucket's own index), element for element.

Env: DSHIM_BUILD_DIR selects the build (default: the checkout's build/).
"""
import json
import os
import pathlib
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
BUILD_DIR = pathlib.Path(os.environ.get("DSHIM_BUILD_DIR", str(REPO / "build")))
LIB = BUILD_DIR / "lib" / "libdshim.so"
MARKERS = {"ddp": 1001, "hook": 1002, "unused": 1003, "end": 1004}


# ---------------------------------------------------------------------------------------------------
# the ranks
# ---------------------------------------------------------------------------------------------------

def _rank_main(mode):
    import ctypes
    if mode == "dshim" and os.environ.get("DSHIM_TEST_PRELOAD"):
        ctypes.CDLL(os.environ["DSHIM_TEST_PRELOAD"], mode=ctypes.RTLD_GLOBAL)
    import torch
    import torch.distributed as dist
    import dshim  # noqa: F401  (registers the backend)
    from dshim import _lib

    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("dshim" if mode == "dshim" else "gloo")
    torch.manual_seed(0)

    def marker(section):
        dist.broadcast(torch.zeros(MARKERS[section], dtype=torch.uint8), 0)

    # -- ops ----------------------------------------------------------------------------------------
    t = torch.ones(4)
    dist.all_reduce(t)
    dist.all_reduce(t, async_op=True).wait()
    dist.broadcast(t, 0)
    dist.reduce(t, 0)
    dist.all_gather([torch.zeros(4) for _ in range(n)], t)
    dist.all_gather_into_tensor(torch.zeros(4 * n), t)
    dist.reduce_scatter(torch.zeros(4), [torch.ones(4) for _ in range(n)])
    dist.reduce_scatter_tensor(torch.zeros(4), torch.ones(4 * n))
    dist.all_to_all_single(torch.zeros(4 * n), torch.ones(4 * n))
    dist.gather(t, [torch.zeros(4) for _ in range(n)] if rank == 0 else None, dst=0)
    dist.scatter(t, [torch.ones(4) for _ in range(n)] if rank == 0 else None, src=0)
    if rank == 0:
        dist.send(t, 1)
        dist.recv(t, 1)
    else:
        dist.recv(t, 0)
        dist.send(t, 0)

    class SumGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            g = g.clone()
            dist.all_reduce(g)   # through torch.distributed inside a backward: not a DDP bucket
            return g

    SumGrad.apply(torch.ones(3, requires_grad=True)).sum().backward()
    dist.barrier()

    class Net(torch.nn.Module):
        def __init__(self, unused):
            super().__init__()
            torch.manual_seed(1)
            self.body = torch.nn.Sequential(torch.nn.Linear(20, 300), torch.nn.ReLU(), torch.nn.Linear(300, 300),
                                            torch.nn.Linear(300, 10))
            self.extra = torch.nn.Linear(5, 5) if unused else None   # never called: its gradients are "unused"

        def forward(self, x):
            return self.body(x)

    def model(unused=False):
        return Net(unused)

    def train(ddp, steps):
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
        for _ in range(steps):
            ddp(torch.randn(8, 20)).sum().backward()
            opt.step()
            opt.zero_grad()

    DDP = torch.nn.parallel.DistributedDataParallel
    # -- ddp: the reducer's C++ all-reduce ----------------------------------------------------------
    marker("ddp")
    train(DDP(model(), bucket_cap_mb=0.1), 3)

    # -- hook: a Python comm hook, two all_reduce calls per bucket ---------------------------------
    marker("hook")
    ddp = DDP(model(), bucket_cap_mb=0.1)

    def halves_hook(state, bucket):
        buf = bucket.buffer()
        print(f"HOOK bucket {bucket.index()} {buf.numel()}", flush=True)
        half = buf.numel() // 2
        dist.all_reduce(buf[:half])
        dist.all_reduce(buf[half:])
        buf.div_(n)
        fut = torch.futures.Future()
        fut.set_result(buf)
        return fut

    ddp.register_comm_hook(None, halves_hook)
    train(ddp, 3)

    # -- unused: find_unused_parameters -------------------------------------------------------------
    marker("unused")
    train(DDP(model(unused=True), find_unused_parameters=True), 1)
    marker("end")

    st = _lib.lib().dshim_trace_dump()
    print(f"dump status {st}", flush=True)
    dist.destroy_process_group()
    print("labels ok", flush=True)


if __name__ == "__main__":
    _rank_main(sys.argv[1])
    sys.exit(0)


# ---------------------------------------------------------------------------------------------------
# the test
# ---------------------------------------------------------------------------------------------------

import pytest  # noqa: E402

sys.path.insert(0, str(REPO / "tests" / "common"))
from ports import free_port  # noqa: E402

pytest.importorskip("torch")
if not LIB.exists():
    pytest.skip(f"{LIB} not built (run make)", allow_module_level=True)

_DROP_PREFIXES = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "DSHIM_", "TORCHELASTIC_", "DMLC_")
_DROP_EXACT = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
               "LD_PRELOAD", "TORCH_DISTRIBUTED_DEBUG"}

# section "ops": the labels in call order (rank 0 sends first, rank 1 receives first)
OPS = ["torch all_reduce", "torch all_reduce", "torch broadcast", "torch reduce", "torch all_gather",
       "torch _all_gather_base", "torch reduce_scatter", "torch _reduce_scatter_base", "torch all_to_all",
       "torch gather", "torch scatter", None, None, "torch all_reduce", "torch barrier"]
P2P = {0: ["torch send", "torch recv"], 1: ["torch recv", "torch send"]}


def _launch(mode, n, trace_dir, timeout=240):
    port = free_port()
    procs = []
    for r in range(n):
        env = {k: v for k, v in os.environ.items() if not k.startswith(_DROP_PREFIXES) and k not in _DROP_EXACT}
        env["PYTHONPATH"] = os.pathsep.join([str(REPO / "python")] + [p for p in [env.get("PYTHONPATH")] if p])
        env.update(RANK=str(r), WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", DSHIM_TIMEOUT="60", DSHIM_TRACE_DIR=str(trace_dir),
                   DSHIM_TRACE_FR="0")
        if mode == "takeover":
            env["LD_PRELOAD"] = str(LIB)
        else:
            env["DSHIM_TEST_PRELOAD"] = str(LIB)
        procs.append(subprocess.Popen([sys.executable, __file__, mode], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    deadline = time.monotonic() + timeout
    outs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            outs.append((p.pid, p.returncode, out))
    except subprocess.TimeoutExpired:
        pytest.fail(f"{mode}: {n} ranks did not finish in {timeout} s")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    bad = [f"--- rank {r} exited {rc}:\n{out[-4000:]}" for r, (_, rc, out) in enumerate(outs)
           if rc != 0 or "labels ok" not in out or "dump status 0" not in out]
    if bad:
        pytest.fail("\n".join(bad))
    return outs


def _entries(path, size):
    """The entries of the process's ring of `size` ranks with the most entries (the default group's)."""
    rings, entries = {}, {}
    lines = path.read_text().splitlines()
    head = json.loads(lines[0])
    assert head["format"] == "dshim-trace" and head["reason"] == "request", head
    for line in lines[1:]:
        rec = json.loads(line)
        if "id" in rec:
            entries.setdefault(rec["ring"], []).append(rec)
        else:
            rings[rec["ring"]] = rec
    name = max((r for r in rings if rings[r]["size"] == size), key=lambda r: len(entries.get(r, [])))
    assert rings[name]["dropped"] == 0, rings[name]
    return entries[name]


def _sections(entries):
    """{section: [entries]} split at the marker broadcasts."""
    by_bytes = {v: k for k, v in MARKERS.items()}
    out, cur = {"ops": []}, "ops"
    for e in entries:
        if e["op"] == "broadcast" and e["bytes"] in by_bytes:
            assert e["label"] == "torch broadcast", e
            cur = by_bytes[e["bytes"]]
            out[cur] = []
            continue
        out[cur].append(e)
    return out


def _steps(entries):
    """The gradient all-reduces of a DDP section as [[(label, count), ...] per backward]: each
    backward begins at bucket 0 (one all_reduce per bucket)."""
    steps = []
    for e in entries:
        if e["op"] != "allreduce" or e["dtype"] != "float32":
            continue
        if not steps or e["label"] == "DDP bucket 0":
            steps.append([])
        steps[-1].append((e["label"], e["count"]))
    return steps


@pytest.mark.parametrize("mode", ["dshim", "takeover"])
def test_trace_labels(mode, tmp_path):
    n = 2
    outs = _launch(mode, n, tmp_path)
    for rank, (pid, _, out) in enumerate(outs):
        path = tmp_path / f"dshim-trace.{rank}.{pid}.jsonl"
        assert path.exists(), f"rank {rank}: no dump {path.name} in {sorted(os.listdir(tmp_path))}\n{out[-3000:]}"
        entries = _entries(path, n)
        unlabelled = [e for e in entries if not e["label"]]
        assert not unlabelled, f"rank {rank}: entries without a label: {unlabelled[:3]}"
        assert all(e["state"] == "done" for e in entries), [e for e in entries if e["state"] != "done"][:3]
        sec = _sections(entries)
        assert set(sec) == {"ops", *MARKERS}, sorted(sec)

        # ops: exactly the calls made, in order (nothing else precedes the first DDP)
        p2p = iter(P2P[rank])
        want = [lab if lab is not None else next(p2p) for lab in OPS]
        got = [e["label"] for e in sec["ops"]]
        assert got == want, f"rank {rank}: ops section labels\n got  {got}\n want {want}"

        # ddp (C++ all-reduce, counted) vs hook (the GradBucket's index): same buckets, same sizes
        hooks = [tuple(map(int, line.split()[2:4])) for line in out.splitlines() if line.startswith("HOOK bucket")]
        for name in ("ddp", "hook", "unused"):
            labels = {e["label"] for e in sec[name]}
            assert labels <= {"torch broadcast", "torch all_gather", "DDP unused-parameter map"} | \
                {f"DDP bucket {k}" for k in range(64)}, f"rank {rank}: {name}: {sorted(labels)}"
        ddp_steps = _steps(sec["ddp"])
        assert len(ddp_steps) == 3, ddp_steps
        for s in ddp_steps:
            assert [lab for lab, _ in s] == [f"DDP bucket {k}" for k in range(len(s))], s
        assert max(len(s) for s in ddp_steps) >= 2, f"the model should span several buckets: {ddp_steps}"

        hook_entries = [(e["label"], e["count"]) for e in sec["hook"] if e["op"] == "allreduce"]
        # two all_reduce calls per bucket, both named after the hook's GradBucket
        want_hook = []
        for index, numel in hooks:
            want_hook += [(f"DDP bucket {index}", numel // 2), (f"DDP bucket {index}", numel - numel // 2)]
        assert hook_entries == want_hook, f"rank {rank}: hook section\n got  {hook_entries}\n want {want_hook}"
        # the counted buckets of the ddp section are the hook's real ones, element for element
        real, k = [], 0
        for step in ddp_steps:
            real.append([(f"DDP bucket {i}", numel) for i, numel in hooks[k:k + len(step)]])
            k += len(step)
        assert ddp_steps == real, f"rank {rank}: counted buckets differ from the GradBuckets\n" \
                                  f" counted {ddp_steps}\n real    {real}"
        assert k == len(hooks), (k, hooks)

        used_maps = [e for e in sec["unused"] if e["label"] == "DDP unused-parameter map"]
        assert len(used_maps) == 1 and used_maps[0]["dtype"] == "int32", sec["unused"]
        assert [lab for lab, _ in _steps(sec["unused"])[0]] == \
            [f"DDP bucket {k}" for k in range(len(_steps(sec["unused"])[0]))]
        assert sec["end"] == [], sec["end"]

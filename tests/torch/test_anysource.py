"""Receives from any source through torch.distributed (dist.recv / dist.irecv with no src,
Work._source_rank()), carried by dshim: with init_process_group("dshim") (plain torch) and with
init_process_group("gloo") under LD_PRELOAD=libdshim.so (the takeover).

This file is also the ranks' program (`python test_anysource.py MODE SCENARIO`); each rank checks
what it received and prints "anysource ok" or its failures.  Scenarios:
  fan_in        every rank in turn receives from any source, dist.recv and dist.irecv alternately,
                what all the others send it (torch's test_send_recv_any_source, plus exact counts)
  interleaved   rank 0 posts specific and any-source irecvs at once; each sender's messages must
                arrive in its order, and a specific receive posted first is not robbed
  collectives   senders send and go straight on to all_reduce; rank 0 receives from any source
                while their all_reduce data waits on its streams, then joins the all_reduce
  too_big       a message larger than the receiver's tensor fails loudly, naming both sizes
  misuse        (1 rank) refused clearly: any source with no other rank, several tensors at once

Env: DSHIM_BUILD_DIR selects the build (default: the checkout's build/).
"""
import os
import pathlib
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
BUILD_DIR = pathlib.Path(os.environ.get("DSHIM_BUILD_DIR", str(REPO / "build")))
LIB = BUILD_DIR / "lib" / "libdshim.so"


# ---------------------------------------------------------------------------------------------------
# the ranks
# ---------------------------------------------------------------------------------------------------

def _rank_main(mode, scenario):
    import ctypes
    if mode == "dshim" and os.environ.get("DSHIM_TEST_PRELOAD"):
        ctypes.CDLL(os.environ["DSHIM_TEST_PRELOAD"], mode=ctypes.RTLD_GLOBAL)
    import torch
    import torch.distributed as dist
    import dshim  # noqa: F401  (registers the backend)
    from dshim.process_group import DshimProcessGroup

    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("dshim" if mode == "dshim" else "gloo")
    fails = []
    carrier = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    if not isinstance(carrier, DshimProcessGroup):
        fails.append(f"the default group is carried by {type(carrier).__name__}, not dshim")

    def msg(sender, k, size=10):
        return torch.full((size,), float(sender * 1000 + k))

    def decode(t):
        v = int(t[0].item())
        if not bool((t == t[0]).all()):
            return None
        return divmod(v, 1000)

    if scenario == "fan_in":
        rounds = 3
        for receiver in range(n):
            if rank != receiver:
                for k in range(2 * rounds):
                    dist.send(msg(rank, k), receiver)
                continue
            last = {}
            counts = {}
            for i in range(2 * rounds * (n - 1)):
                t = torch.full((10,), -1.0)
                if i % 2 == 0:
                    src = dist.recv(t)
                else:
                    w = dist.irecv(t)
                    w.wait()
                    src = w._source_rank()
                got = decode(t)
                if got is None or got[0] != src:
                    fails.append(f"receive {i}: source {src} but the tensor holds {t.tolist()}")
                    continue
                if got[1] <= last.get(src, -1):
                    fails.append(f"rank {src}'s message {got[1]} arrived after its message {last[src]}")
                last[src] = got[1]
                counts[src] = counts.get(src, 0) + 1
            want = {s: 2 * rounds for s in range(n) if s != rank}
            if counts != want:
                fails.append(f"messages per sender {counts}, wanted {want}")
    elif scenario == "interleaved":
        msgs = 4
        if rank != 0:
            works = [dist.isend(msg(rank, k), 0) for k in range(msgs)]
            for w in works:
                w.wait()
        else:
            # per sender a specific receive, n-1 from any source, another specific one, the rest from
            # any source: MPI's greedy matching cannot strand a specific receive (2 + n-1 <= msgs)
            senders = list(range(1, n))
            plan = senders + [None] * (n - 1) + senders + [None] * ((n - 1) * (msgs - 3))
            tensors = [torch.full((10,), -1.0) for _ in plan]
            works = [dist.irecv(t, src=s) for t, s in zip(tensors, plan)]
            order = {}
            for i, (w, t, s) in enumerate(zip(works, tensors, plan)):
                w.wait()
                got = decode(t)
                src = w._source_rank()
                if got is None or got[0] != src or (s is not None and src != s):
                    fails.append(f"receive {i} (src={s}): source {src}, tensor {t[:2].tolist()}")
                    continue
                order.setdefault(src, []).append(got[1])
            for s in range(1, n):
                if order.get(s) != list(range(msgs)):
                    fails.append(f"rank {s}'s messages were received in the order {order.get(s)}")
    elif scenario == "collectives":
        for r in range(10):
            one = torch.ones(3)
            if rank != 0:
                w = dist.isend(msg(rank, r), 0)
                dist.all_reduce(one)
                w.wait()
            else:
                seen = set()
                for _ in range(n - 1):
                    t = torch.full((10,), -1.0)
                    src = dist.recv(t)
                    got = decode(t)
                    if got != (src, r) or src in seen:
                        fails.append(f"round {r}: source {src}, message {got}")
                    seen.add(src)
                dist.all_reduce(one)
            if not bool((one == n).all()):
                fails.append(f"round {r}: all_reduce gave {one.tolist()}")
        try:
            dist.isend(torch.ones(1), (rank + 1) % n)._source_rank()
            fails.append("_source_rank() of a send did not raise")
        except RuntimeError as e:
            if "only defined for the Work of a recv" not in str(e):
                fails.append(f"_source_rank() of a send: {e}")
        t = torch.zeros(1)
        if dist.recv(t, src=(rank - 1) % n) != (rank - 1) % n:
            fails.append("dist.recv(src=...) did not return src")
    elif scenario == "too_big":
        if rank == 1:
            dist.send(torch.ones(8), 0)
        elif rank == 0:
            try:
                dist.recv(torch.zeros(4))
                fails.append("a message of 8 floats fit a tensor of 4")
            except RuntimeError as e:
                if "mismatched sizes" not in str(e) or "32 bytes" not in str(e) or "16 bytes" not in str(e):
                    fails.append(f"the error does not name both sizes: {e}")
        print("anysource " + ("ok" if not fails else "FAILED:\n" + "\n".join(fails)), flush=True)
        os._exit(0 if not fails else 1)   # rank 0's group has failed: no orderly shutdown to wait for
    elif scenario == "misuse":
        for what, call, words in [
                ("recv from any source alone", lambda: dist.irecv(torch.zeros(1)), "group of 1 rank"),
                ("several tensors", lambda: carrier.recv_anysource([torch.zeros(1), torch.zeros(1)], 0),
                 "takes one tensor")]:
            try:
                call()
                fails.append(f"{what}: no error")
            except RuntimeError as e:
                if words not in str(e):
                    fails.append(f"{what}: unclear message: {e}")
    else:
        fails.append(f"unknown scenario {scenario}")
    dist.barrier()
    dist.destroy_process_group()
    print("anysource " + ("ok" if not fails else "FAILED:\n" + "\n".join(fails)), flush=True)
    return 0 if not fails else 1


if __name__ == "__main__":
    sys.exit(_rank_main(sys.argv[1], sys.argv[2]))


# ---------------------------------------------------------------------------------------------------
# the tests
# ---------------------------------------------------------------------------------------------------

import pytest  # noqa: E402

sys.path.insert(0, str(REPO / "tests" / "common"))
from ports import free_port  # noqa: E402
from jobenv import job_free_env  # noqa: E402

pytest.importorskip("torch")
if not LIB.exists():
    pytest.skip(f"{LIB} not built (run make)", allow_module_level=True)

_DROP_PREFIXES = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "DSHIM_", "TORCHELASTIC_", "DMLC_")
_DROP_EXACT = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
               "LD_PRELOAD", "TORCH_DISTRIBUTED_DEBUG"}


def _launch(mode, scenario, n, extra_env=None, timeout=120):
    port = free_port()
    procs = []
    for r in range(n):
        env = job_free_env(_DROP_PREFIXES, _DROP_EXACT)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO / "python")] + [p for p in [env.get("PYTHONPATH")] if p])
        env.update(RANK=str(r), WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", DSHIM_TIMEOUT="60")
        if mode == "takeover":
            env["LD_PRELOAD"] = str(LIB)
        else:
            env["DSHIM_TEST_PRELOAD"] = str(LIB)
        env.update(extra_env or {})
        procs.append(subprocess.Popen([sys.executable, __file__, mode, scenario], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    deadline = time.monotonic() + timeout
    outs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            outs.append((p.returncode, out))
    except subprocess.TimeoutExpired:
        pytest.fail(f"{mode} {scenario} on {n} ranks did not finish in {timeout} s")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    bad = [f"--- rank {r} exited {rc}:\n{out[-4000:]}" for r, (rc, out) in enumerate(outs)
           if rc != 0 or "anysource ok" not in out]
    if bad:
        pytest.fail("\n".join(bad))
    return outs


@pytest.mark.parametrize("mode", ["dshim", "takeover"])
@pytest.mark.parametrize("scenario,n", [("fan_in", 2), ("fan_in", 3), ("interleaved", 3), ("collectives", 3),
                                        ("too_big", 2), ("misuse", 1)])
def test_anysource(mode, scenario, n):
    outs = _launch(mode, scenario, n)
    if mode == "takeover":
        assert "dshim: carrying backend 'gloo'" in outs[0][1], outs[0][1][-2000:]


def test_anysource_tcp():
    """The same over TCP between the ranks (dshim's other transport)."""
    _launch("takeover", "interleaved", 3, {"DSHIM_TRANSPORT": "tcp"})
    _launch("dshim", "collectives", 3, {"DSHIM_TRANSPORT": "tcp"})

"""torch's own flight-recorder analyser on dshim's dumps.

dshim writes, beside its own dump, every rank's rings in the format of torch's
flight recorder (shim/trace/trace_fr.c: DSHIM_TRACE_DIR/dshim_fr_rank_<R>, a
pickle).  These tests run `python -m torch.distributed.flight_recorder.fr_trace`
of the installed torch on them:

- test_torch_hang: a real 3-rank job with backend "dshim" in which rank 1
  skips an all_reduce (rank-dependent code).  Ranks 0 and 2 fail after
  DSHIM_TIMEOUT=3 s, naming rank 1; rank 1 is asked for its dump with
  DSHIM_TRACE_SIGNAL (SIGUSR2), as dshim-run does.  torch's analyser must name
  the same culprit rank and the collective.
- test_written_*: files written by the C writer from hand-made snapshots
  (tests/unit/trace/check_trace_fr.c's "write" mode) read by torch's loader and
  analyser: a clean job (every collective matched), a hang, a mismatch.

Run as a script (`test_fr_trace.py worker`) this file is one rank of the job.
Env: DSHIM_BUILD_DIR selects the build (default: the checkout's build/).
"""
import datetime
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

if __name__ != "__main__":
    import pytest

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
BUILD_DIR = pathlib.Path(os.environ.get("DSHIM_BUILD_DIR", str(REPO / "build")))
LIB = BUILD_DIR / "lib" / "libdshim.so"
WRITER = BUILD_DIR / "bin" / "check_trace_fr"
FR_TRACE = [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace"]
N = 3
SKIPPER = 1


# ----------------------------------------------------------------------------- the rank


def worker():
    if os.environ.get("DSHIM_TEST_PRELOAD"):
        import ctypes
        ctypes.CDLL(os.environ["DSHIM_TEST_PRELOAD"], mode=ctypes.RTLD_GLOBAL)
    import torch
    import torch.distributed as dist
    import dshim  # noqa: F401  (registers the backend)

    rank = int(os.environ["RANK"])
    trace_dir = pathlib.Path(os.environ["DSHIM_TRACE_DIR"])
    # DSHIM_TIMEOUT (3 s, set by the test) governs over the group's timeout
    dist.init_process_group("dshim", timeout=datetime.timedelta(seconds=60))
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), N, False,
                          datetime.timedelta(seconds=60))
    t = torch.ones(1024)
    dist.all_reduce(t)   # every rank
    dist.all_reduce(t)
    if rank != SKIPPER:
        try:
            dist.all_reduce(t)   # rank 1 never calls it
            print(f"rank {rank}: no error", flush=True)
        except RuntimeError as e:
            print(f"rank {rank}: dshim error: {e}", flush=True)
        store.add("fr_failed", 1)
        # rank 0 hosts the store: stay until rank 1 has written its dump
        store.wait(["fr_skipper_dumped"], datetime.timedelta(seconds=60))
    else:
        deadline = time.monotonic() + 60
        while store.add("fr_failed", 0) < N - 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        # what dshim-run does to the ranks still alive when one fails
        mine = trace_dir / f"dshim_fr_rank_{rank}"
        before = mine.stat().st_mtime_ns if mine.exists() else 0
        os.kill(os.getpid(), signal.SIGUSR2)
        while time.monotonic() < deadline:
            if mine.exists() and mine.stat().st_mtime_ns != before:
                break
            time.sleep(0.1)
        print(f"rank {rank}: dump {'written' if mine.exists() else 'MISSING'}", flush=True)
        store.set("fr_skipper_dumped", "1")
    # rank 0 hosts the store and leaves last: a rank whose wait was still being
    # answered when rank 0 exited got "Connection was likely closed" (seen once)
    store.add("fr_left", 1)
    deadline = time.monotonic() + 60
    while rank == 0 and store.add("fr_left", 0) < N and time.monotonic() < deadline:
        time.sleep(0.05)
    sys.stdout.flush()
    os._exit(0)   # the group is broken: no destroy


# ----------------------------------------------------------------------------- the tests

_DROP_PREFIXES = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "DSHIM_", "TORCHELASTIC_", "DMLC_")
_DROP_EXACT = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
               "MASTER_ADDR", "MASTER_PORT", "LD_PRELOAD", "TORCH_DISTRIBUTED_DEBUG"}


def base_env():
    env = {k: v for k, v in os.environ.items() if not k.startswith(_DROP_PREFIXES) and k not in _DROP_EXACT}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "python")] + [p for p in [env.get("PYTHONPATH")] if p])
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["OMP_NUM_THREADS"] = "1"
    if BUILD_DIR.resolve() != (REPO / "build").resolve():
        env["DSHIM_TEST_PRELOAD"] = str(LIB)   # the package uses a library already loaded in the process
    return env


def fr_trace(trace_dir, *args, timeout=120):
    """torch's analyser on trace_dir: its whole output (it logs to stderr)."""
    p = subprocess.run(FR_TRACE + [str(trace_dir), *args], env=base_env(), capture_output=True, text=True,
                       timeout=timeout)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    return out


def written(tmp_path, scenario):
    if not WRITER.exists():
        pytest.skip(f"{WRITER} not built")
    subprocess.run([str(WRITER), "write", str(tmp_path), scenario], check=True, timeout=60)
    return tmp_path


if __name__ != "__main__":
    pytest.importorskip("torch")
    pytest.importorskip("torch.distributed.flight_recorder.fr_trace")

    @pytest.mark.timeout(120)
    def test_written_clean(tmp_path):
        """Every collective of a clean job is matched across the ranks by torch's own builder."""
        from torch.distributed.flight_recorder.components.builder import build_db
        from torch.distributed.flight_recorder.components.config_manager import JobConfig
        from torch.distributed.flight_recorder.components.loader import read_dir

        d = written(tmp_path, "ok")
        assert sorted(os.listdir(d)) == [f"dshim_fr_rank_{r}" for r in range(N)]
        args = JobConfig().parse_args([str(d)])
        details, version = read_dir(args)
        assert version == "2.10"
        assert {v["rank"] for v in details.values()} == set(range(N))
        db = build_db(details, args, version)
        world = [c for c in db.collectives if c.group_id == "c0"]
        assert [c.collective_name for c in world] == ["nccl:all_reduce", "nccl:all_gather", "nccl:reduce_scatter",
                                                      "nccl:all_reduce_barrier"], world
        assert all(c.pass_check for c in db.collectives), db.collectives
        gather = world[1]
        assert gather.input_sizes == [[16]] and gather.output_sizes == [[48]], gather
        # the world group and three groups of one rank; the sub-group of unknown members is left out
        assert sorted(g.size for g in db.groups) == [1, 1, 1, N], db.groups
        assert not any(g.id.startswith(("subgroup", "ps/")) for g in db.groups), db.groups
        assert "Not all ranks" not in fr_trace(d)

    @pytest.mark.timeout(120)
    def test_written_wrapped(tmp_path):
        """Rank 0's world ring dropped more old entries than the others': torch aligns the ranks on the
        world ring's record ids and matches what all kept; the group of one, whose entry is older, stays."""
        from torch.distributed.flight_recorder.components.builder import build_db
        from torch.distributed.flight_recorder.components.config_manager import JobConfig
        from torch.distributed.flight_recorder.components.loader import read_dir

        d = written(tmp_path, "wrapped")
        args = JobConfig().parse_args([str(d)])
        details, version = read_dir(args)
        db = build_db(details, args, version)
        world = [c for c in db.collectives if c.group_id == "c0"]
        assert [c.collective_seq_id for c in world] == [5, 6, 7], world
        assert all(c.pass_check for c in db.collectives), db.collectives
        assert len([c for c in db.collectives if c.group_id == "c2.solo"]) == N, db.collectives
        assert "Not all ranks" not in fr_trace(d)

    @pytest.mark.timeout(120)
    def test_written_hang(tmp_path):
        out = fr_trace(written(tmp_path, "hang"))
        assert "Not all ranks joining collective, sequence number: 1" in out, out
        assert "missing ranks: {1}" in out, out
        assert "collective: nccl:all_reduce" in out, out
        assert "torch all_reduce" in out, out   # the framework call, as the "stack trace"

    @pytest.mark.timeout(120)
    def test_written_mismatch(tmp_path):
        out = fr_trace(written(tmp_path, "mismatch"))
        assert "Collective sequence number: 1 has errors" in out, out
        assert "COLLECTIVE_TYPE_MISMATCH" in out, out
        assert "'all_reduce' does not match found collective type: 'broadcast'" in out or \
            "'broadcast' does not match found collective type: 'all_reduce'" in out, out

    @pytest.mark.timeout(200)
    def test_torch_hang(tmp_path):
        """Rank 1 skips an all_reduce: dshim's timeout names it, and so does torch's analyser on the dumps."""
        if not LIB.exists():
            pytest.skip(f"{LIB} not built (run make)")
        sys.path.insert(0, str(REPO / "tests" / "common"))
        from ports import free_port

        trace_dir = tmp_path / "dumps"
        trace_dir.mkdir()
        port = free_port()
        procs = []
        for r in range(N):
            env = base_env()
            env.update(RANK=str(r), WORLD_SIZE=str(N), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                       DSHIM_TIMEOUT="3", DSHIM_TRACE_DIR=str(trace_dir))
            procs.append(subprocess.Popen([sys.executable, __file__, "worker"], env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))
        outs = []
        deadline = time.monotonic() + 120
        try:
            for p in procs:
                try:
                    out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    p.kill()
                    out, _ = p.communicate()
                    out += "\n(killed: did not finish in time)"
                outs.append(out)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        report = "\n".join(f"--- rank {r}\n{o[-3000:]}" for r, o in enumerate(outs))
        assert all(p.returncode == 0 for p in procs), report
        # dshim's verdict: the ranks that never arrived at the collective
        m = re.search(r"did not arrive at (?:it|this collective): ([\d, ]+)", outs[0])
        assert m, report
        culprits = {int(x) for x in m.group(1).replace(",", " ").split()}
        assert culprits == {SKIPPER}, report
        files = sorted(f for f in os.listdir(trace_dir) if f.startswith("dshim_fr_rank_"))
        assert files == [f"dshim_fr_rank_{r}" for r in range(N)], (os.listdir(trace_dir), report)
        # torch's analyser over the whole directory (dshim's own .jsonl dumps are beside them)
        out = fr_trace(trace_dir)
        m = re.search(r"Not all ranks joining collective, sequence number: (\d+)", out)
        assert m, out + report
        assert f"missing ranks: {culprits}" in out, out
        assert "collective: nccl:all_reduce" in out, out
        assert "expected ranks: {0, 1, 2}" in out, out
        # and the number is dshim's own for that collective
        seq = int(m.group(1))
        assert re.search(rf"all_?reduce #{seq}\b", outs[0]), (seq, report)


if __name__ == "__main__":
    if sys.argv[1:] == ["worker"]:
        worker()
    else:
        sys.exit("usage: test_fr_trace.py worker (one rank; the tests run under pytest)")

"""horovod.torch's core on dshim (python/dshim/_horovod/horovod: basics, operations, handles,
process sets) with real torch and real processes.

Each test starts N ranks of hvd_ops_worker.py, which check every result against values
computed from every rank's deterministic input:
- as horovodrun's Gloo mode starts them (HOROVOD_RANK/SIZE/LOCAL_*/CROSS_* and
  HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT, rank 0 hosting dshim's store), 2 and 3 ranks: every
  operation and dtype, refusals, mismatches raising on every rank, names in any order, join,
  process sets, init/shutdown/init, the timeline;
- with the local/cross ranks computed from the ranks' hosts (two fake hosts by DSHIM_HOST_ID);
- under dshim-run (dshim's own launcher variables);
- alone, without any launcher (`python script.py`: one rank, as Horovod runs it).
The processes are this test's own children, killed by PID on timeout.

Env: DSHIM_BUILD_DIR selects the build (default: the checkout's build/).
Run: .venv/bin/python -m pytest -q tests/horovod/test_hvd_ops.py
"""
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "common"))
from jobenv import job_free_env  # noqa: E402  (tests/common, shared with the other suites)
from ports import free_port  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
BUILD_DIR = pathlib.Path(os.environ.get("DSHIM_BUILD_DIR", str(REPO / "build")))
LIB = BUILD_DIR / "lib" / "libdshim.so"
DSHIM_RUN = BUILD_DIR / "bin" / "dshim-run"
WORKER = HERE / "hvd_ops_worker.py"
HOROVOD_TREE = REPO / "python" / "dshim" / "_horovod"   # dshim's `horovod` package

torch = pytest.importorskip("torch")
if not LIB.exists():
    pytest.skip(f"{LIB} not built (run make)", allow_module_level=True)

_DROP_PREFIXES = ("SLURM_", "SLURMD_", "SRUN_", "OMPI_", "PMI_", "PMIX_", "DSHIM_", "TORCHELASTIC_",
                  "DMLC_", "HOROVOD_")
_DROP_EXACT = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
               "MASTER_ADDR", "MASTER_PORT", "LD_PRELOAD", "TORCH_DISTRIBUTED_DEBUG"}
ALL = ["basics", "allreduce", "gather_bcast", "refusals", "errors", "order", "join", "sets", "static_sets",
       "reinit"]


def base_env():
    env = job_free_env(_DROP_PREFIXES, _DROP_EXACT)
    env["PYTHONPATH"] = os.pathsep.join([str(HOROVOD_TREE), str(REPO / "python")] +
                                        [p for p in [env.get("PYTHONPATH")] if p])
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["OMP_NUM_THREADS"] = "1"
    env["DSHIM_TIMEOUT"] = "60"
    return env


def _collect(procs, timeout, what):
    deadline = time.monotonic() + timeout
    results = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            results.append((p.returncode, out))
    except subprocess.TimeoutExpired:
        outs = []
        for p in procs:
            if p.poll() is None:
                p.kill()
            outs.append(p.communicate()[0])
        pytest.fail(f"{what} did not finish in {timeout} s:\n" +
                    "\n".join(f"--- process {i}\n{o[-4000:]}" for i, o in enumerate(outs)))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return results


def launch(n, scenarios, timeout=240, env=None, per_rank=None):
    """n ranks as horovodrun's Gloo mode starts them; [(rc, output)] per rank."""
    port = free_port()
    procs = []
    for r in range(n):
        e = base_env()
        e.update(HOROVOD_RANK=str(r), HOROVOD_SIZE=str(n), HOROVOD_LOCAL_RANK=str(r), HOROVOD_LOCAL_SIZE=str(n),
                 HOROVOD_CROSS_RANK="0", HOROVOD_CROSS_SIZE="1", HOROVOD_GLOO_RENDEZVOUS_ADDR="127.0.0.1",
                 HOROVOD_GLOO_RENDEZVOUS_PORT=str(port), HOROVOD_DYNAMIC_PROCESS_SETS="1",
                 HVD_TEST_DUMP_AFTER=str(max(timeout - 20, 10)), HVD_TEST_WANT_LOCAL=f"{r},{n},0,1")
        e.update(env or {})
        if per_rank:
            e.update(per_rank(r))
        procs.append(subprocess.Popen([sys.executable, str(WORKER), *scenarios], env=e, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, errors="replace"))
    return _collect(procs, timeout, f"{scenarios} on {n} ranks")


def check(results):
    bad = [(r, rc, out) for r, (rc, out) in enumerate(results) if rc != 0 or " 0 failures" not in out]
    if bad:
        pytest.fail("\n".join(f"--- rank {r} exited {rc}:\n{out[-6000:]}" for r, rc, out in bad))


@pytest.mark.timeout(600)
@pytest.mark.parametrize("n", [2, 3])
def test_ops(n):
    """Every operation, dtype, refusal, mismatch, any-order names, join, process sets, reinit."""
    check(launch(n, ["uninitialized"] + ALL, timeout=500))


@pytest.mark.timeout(300)
def test_identity_from_hosts():
    """No HOROVOD_LOCAL_*/CROSS_*: local and cross ranks from the ranks' hosts (ranks 0, 1 on one
    fake host, rank 2 on another: not homogeneous); without HOROVOD_DYNAMIC_PROCESS_SETS, sets come
    only through hvd.init(process_sets=...)."""
    host = {0: "hostA", 1: "hostA", 2: "hostB"}
    want = {0: "0,2,0,2", 1: "1,2,0,1", 2: "0,1,1,2"}

    def per_rank(r):
        return {"DSHIM_HOST_ID": host[r], "HVD_TEST_WANT_LOCAL": want[r], "HVD_TEST_HOMOGENEOUS": "0"}

    def drop_local(e):
        for k in ("HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE"):
            e.pop(k, None)

    port = free_port()
    procs = []
    for r in range(3):
        e = base_env()
        e.update(HOROVOD_RANK=str(r), HOROVOD_SIZE="3", HOROVOD_GLOO_RENDEZVOUS_ADDR="127.0.0.1",
                 HOROVOD_GLOO_RENDEZVOUS_PORT=str(port), **per_rank(r))
        drop_local(e)
        procs.append(subprocess.Popen([sys.executable, str(WORKER), "basics", "static_sets"], env=e,
                                      stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, errors="replace"))
    check(_collect(procs, 200, "identity from hosts"))


@pytest.mark.timeout(300)
def test_under_dshim_run(tmp_path):
    """Started by dshim-run (its own variables, libdshim preloaded, so dshim's table is loaded at
    `import horovod.torch`): the same operations, and HOROVOD_TIMELINE set by the script after
    the import still reaches hvd.init()."""
    if not os.access(DSHIM_RUN, os.X_OK):
        pytest.skip(f"{DSHIM_RUN} not built")
    timeline = tmp_path / "late.json"
    env = base_env()
    env["HVD_TEST_LATE_TIMELINE"] = str(timeline)
    env["PATH"] = f"{pathlib.Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}"
    env["HOROVOD_DYNAMIC_PROCESS_SETS"] = "1"
    proc = subprocess.Popen([str(DSHIM_RUN), "--master-port", "0", "--nproc-per-node", "2", str(WORKER),
                             "basics", "allreduce", "errors", "order", "sets", "reinit"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"dshim-run job did not finish:\n{out[-6000:]}")
    assert proc.returncode == 0, out[-6000:]
    assert out.count(" 0 failures") == 2, out[-6000:]
    assert "NEGOTIATE_ALLREDUCE" in timeline.read_text()


@pytest.mark.timeout(200)
def test_single_without_launcher():
    """`python script.py` with no launcher variables: one rank, rank 0, every operation works."""
    e = base_env()
    e["HVD_TEST_WANT_LOCAL"] = "0,1,0,1"
    e["HOROVOD_DYNAMIC_PROCESS_SETS"] = "1"
    res = _collect([subprocess.Popen([sys.executable, str(WORKER), "uninitialized", "basics", "allreduce",
                                      "gather_bcast", "refusals", "sets", "reinit"], env=e,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")],
                   150, "single rank")
    check(res)


@pytest.mark.timeout(200)
def test_timeline(tmp_path):
    """HOROVOD_TIMELINE=DYNAMIC, hvd.start_timeline/stop_timeline: rank 0 writes a Chrome trace with
    Horovod's NEGOTIATE_ALLREDUCE / ALLREDUCE spans under the tensors' names."""
    path = tmp_path / "timeline.json"
    check(launch(2, ["timeline"], timeout=150, env={"HOROVOD_TIMELINE": "DYNAMIC", "HVD_TEST_TIMELINE": str(path)}))
    text = path.read_text()
    events = json.loads(text if text.rstrip().endswith("]") else text.rstrip().rstrip(",") + "]")
    names = {ev.get("name") for ev in events}
    assert "NEGOTIATE_ALLREDUCE" in names and "ALLREDUCE" in names, sorted(n for n in names if n)[:40]
    assert "allreduce.tl.0" in text, text[:2000]

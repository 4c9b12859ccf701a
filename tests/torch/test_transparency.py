"""Under the takeover a script observes what it would observe with gloo.

Each scenario of transparency_worker.py runs on 3 ranks twice -- with torch's
own gloo, and with the same script under LD_PRELOAD=libdshim.so (dshim
carries it) -- and what the ranks saw must be equal: backend names and
configs, all_gather_coalesced's outputs, sparse all_reduce's indices and
value bits, monitored_barrier's errors (first lines, gloo's words).  A few
scenarios also run with init_process_group("dshim"), which keeps its name.

Env: DSHIM_BUILD_DIR selects the build whose libdshim.so is preloaded.
Run: .venv/bin/python -m pytest -q tests/torch/test_transparency.py
"""
import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "common"))
from ports import free_port  # noqa: E402
from jobenv import job_free_env  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
BUILD_DIR = pathlib.Path(os.environ.get("DSHIM_BUILD_DIR", str(REPO / "build")))
LIB = BUILD_DIR / "lib" / "libdshim.so"
WORKER = HERE / "transparency_worker.py"
N = 3

torch = pytest.importorskip("torch")
if not LIB.exists():
    pytest.skip(f"{LIB} not built (run make)", allow_module_level=True)

_DROP_PREFIXES = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "DSHIM_", "TORCHELASTIC_", "DMLC_")
_DROP_EXACT = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
               "MASTER_ADDR", "MASTER_PORT", "LD_PRELOAD", "TORCH_DISTRIBUTED_DEBUG"}


# torch's own gloo (no dshim: the reference runs) connects its full mesh within the group timeout; with
# the short timeouts of the failure scenarios, ranks that start seconds apart on a loaded machine miss it
GLOO_CONNECT_TIMEOUT = "Gloo connectFullMesh failed with"


def run(backend, scenario, preload, timeout=120, pg_timeout=60):
    """Runs N ranks; returns {rank: observed dict} (fails the test on a crash or hang).  A reference
    run of torch's gloo whose mesh did not connect in time is repeated once, saying so: that is gloo's
    start-up on a loaded machine, not the behaviour under test."""
    procs, outs = _spawn(backend, scenario, preload, timeout, pg_timeout)
    if not preload and backend != "dshim" and any(GLOO_CONNECT_TIMEOUT in out for out in outs):
        print(f"{scenario}: torch's gloo did not connect its mesh within {pg_timeout} s; repeating the "
              f"reference run once")
        procs, outs = _spawn(backend, scenario, preload, timeout, pg_timeout)
    what = f"{scenario} with backend {backend}{' under the takeover' if preload else ''}"
    results = {}
    for r, (p, out) in enumerate(zip(procs, outs)):
        lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
        assert p.returncode == 0 and lines, f"{what}: rank {r} (rc {p.returncode}):\n{out[-4000:]}"
        results[r] = json.loads(lines[-1][len("RESULT "):])
    return results, outs


def _spawn(backend, scenario, preload, timeout, pg_timeout):
    """Runs N ranks of the worker to their end (killed at the timeout); returns (processes, outputs)."""
    port = free_port()
    env = job_free_env(_DROP_PREFIXES, _DROP_EXACT)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "python")] + [p for p in [env.get("PYTHONPATH")] if p])
    env.update(PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(port), WORLD_SIZE=str(N), TEST_PG_TIMEOUT=str(pg_timeout), DSHIM_TEST_LIB=str(LIB))
    if preload:
        env["LD_PRELOAD"] = str(LIB)
    procs = [subprocess.Popen([sys.executable, str(WORKER), backend, scenario], env=dict(env, RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(N)]
    deadline = time.monotonic() + timeout
    outs = []
    try:
        for p in procs:
            try:
                out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                out, _ = p.communicate()
                out += f"\n[killed after {timeout} s]"
            outs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return procs, outs


def without(results, *keys):
    return {r: {k: v for k, v in d.items() if k not in keys} for r, d in results.items()}


@pytest.mark.parametrize("backend", ["gloo", "default"])
def test_names_as_asked(backend):
    gloo, _ = run(backend, "names", preload=False)
    carried, outs = run(backend, "names", preload=True)
    assert any("dshim: carrying backend" in o for o in outs), outs[0][-2000:]
    for r in range(N):
        assert carried[r]["_carried"] == [True, True, True], carried[r]   # dshim carried every group
        assert gloo[r]["_carried"] == [False, False, False], gloo[r]
        # the group's own (C++-visible) name stays "dshim": DDP's C++ logger casts a "gloo" group to gloo's class
        assert carried[r]["name"] == carried[r]["_get_backend_name"] == "dshim", carried[r]
        assert gloo[r]["name"] == gloo[r]["_get_backend_name"] == "gloo", gloo[r]
    assert without(carried, "_carried", "name", "_get_backend_name") == without(gloo, "_carried", "name",
                                                                                "_get_backend_name")
    assert carried[0]["get_backend"] == ("gloo" if backend == "gloo" else "undefined")


def test_names_explicit_dshim():
    res, _ = run("dshim", "names", preload=False)
    for r in range(N):
        assert res[r]["get_backend"] == "dshim" and res[r]["name"] == "dshim", res[r]
        assert res[r]["_get_backend_name"] == "dshim" and res[r]["new_subgroups"] == "dshim", res[r]
        # an explicit gloo subgroup next to a dshim default group stays torch's gloo
        assert res[r]["new_group_gloo"] == "gloo" and res[r]["_carried"] == [True, False, True], res[r]
    assert res[0]["new_group_inherits"] == "dshim" and res[2]["not_member"][0] == "ValueError", res


def test_names_under_preload_explicit_dshim():
    res, _ = run("dshim", "names", preload=True)
    for r in range(N):
        assert res[r]["get_backend"] == "dshim" and res[r]["new_group_gloo"] == "gloo", res[r]
        assert res[r]["_carried"] == [True, True, True], res[r]


def test_all_gather_coalesced_as_gloo():
    gloo, _ = run("gloo", "all_gather_coalesced", preload=False)
    carried, _ = run("gloo", "all_gather_coalesced", preload=True)
    # the refused layout: both raise a RuntimeError (the words differ)
    for r in range(N):
        assert gloo[r]["per_input_lists"][0] == carried[r]["per_input_lists"][0] == "RuntimeError", \
            (gloo[r]["per_input_lists"], carried[r]["per_input_lists"])
        assert "one list per rank" in carried[r]["per_input_lists"][1], carried[r]["per_input_lists"]
    assert without(carried, "per_input_lists") == without(gloo, "per_input_lists")
    assert carried[1]["outputs"][0][2][0] == [3.0, 3.0], carried[1]["outputs"][0]   # rank 2's first input


def test_profiler_events_as_gloo():
    gloo, _ = run("gloo", "profiler", preload=False)
    carried, _ = run("gloo", "profiler", preload=True)
    assert carried == gloo
    assert ["gloo:all_reduce", True, 1, "[[3]]"] in gloo[0]["events"], gloo[0]


def test_sparse_all_reduce_as_gloo():
    gloo, _ = run("gloo", "sparse", preload=False)
    carried, _ = run("gloo", "sparse", preload=True)
    for r in range(N):
        assert gloo[r]["max_says_sum_only"] and carried[r]["max_says_sum_only"], (gloo[r]["max"], carried[r]["max"])
        for res in (gloo, carried):   # every rank raises gloo's words (dshim adds who has which sizes)
            assert res[r]["mismatch"][0] == "RuntimeError", res[r]["mismatch"]
            assert res[r]["mismatch"][1].startswith("Sparse dimensions do not match"), res[r]["mismatch"]
        assert carried[r]["close_to_dense_sum"] and carried[r]["sums"][0]["coalesced"], carried[r]
    assert without(carried, "max", "mismatch") == without(gloo, "max", "mismatch")


def test_sparse_all_reduce_explicit_dshim():
    gloo, _ = run("gloo", "sparse", preload=False)
    res, _ = run("dshim", "sparse", preload=False)
    assert without(res, "max", "mismatch") == without(gloo, "max", "mismatch")


@pytest.mark.parametrize("backend,preload", [("gloo", False), ("gloo", True), ("dshim", False)])
def test_monitored_barrier_passes(backend, preload):
    res, _ = run(backend, "monitored_ok", preload=preload)
    assert all(res[r]["after"] == [3.0] for r in range(N)), res


def test_refusals():
    res, _ = run("dshim", "refusals", preload=False)
    for r in range(N):
        got = res[r]
        assert got["after"] == [3.0], got
        assert got["agc_empty"] == ["RuntimeError", "dshim: all_gather_coalesced: the input tensor list is empty"]
        assert got["agc_short_list"][1] == "dshim: all_gather_coalesced: output list 0 has 0 tensors, the input list 1"
        assert got["agc_shape"][1].startswith("dshim: all_gather_coalesced: output 0[0] is (3,)"), got["agc_shape"]
        assert "mix dtypes" in got["agc_mixed"][1], got["agc_mixed"]
        assert "sparse COO tensors only" in got["sparse_csr"][1], got["sparse_csr"]
        assert got["sparse_dtype"][1].startswith("Sparse dimensions do not match (dshim: all_reduce of a sparse "
                                                 "tensor: rank "), got["sparse_dtype"]


@pytest.mark.parametrize("scenario", ["monitored_first", "monitored_all", "monitored_rank0_timeout",
                                      "monitored_no_root"])
def test_monitored_barrier_failures_as_gloo(scenario):
    # a short group timeout: with gloo, the ranks that came wait that long for rank 0's answer
    gloo, _ = run("gloo", scenario, preload=False, pg_timeout=5)
    carried, _ = run("gloo", scenario, preload=True, pg_timeout=5)
    assert without(carried, "full") == without(gloo, "full")
    if scenario == "monitored_first":
        assert gloo[0]["error"] == ["RuntimeError", "[Rank 0]: Rank 1 failed to pass monitoredBarrier in 1000 ms"]
        assert gloo[2]["error"][1].startswith("Rank 2 successfully reached monitoredBarrier, but received errors")
    elif scenario == "monitored_all":
        assert gloo[0]["error"] == ["RuntimeError", "[Rank 0]: Ranks 1, 2 failed to pass monitoredBarrier in 500 ms"]
    elif scenario == "monitored_no_root":
        for r in (1, 2):
            assert gloo[r]["error"][1].startswith(f"Rank {r} successfully reached monitoredBarrier"), gloo[r]
    else:   # gloo wraps its "Rank 0 timed out in monitoredBarrier after 0 ms." in rank 1's message
        assert gloo[0]["error"] == ["RuntimeError", "[Rank 0]: Rank 1 failed to pass monitoredBarrier in 0 ms"]
        assert "Rank 0 timed out in monitoredBarrier after 0 ms." in gloo[0]["full"], gloo[0]
        assert "Rank 0 timed out in monitoredBarrier after 0 ms." in carried[0]["full"], carried[0]


def test_monitored_barrier_explicit_dshim():
    """dist.monitored_barrier on a group created as "dshim": torch's guard would
    refuse it ("only implemented for GLOO backend"); dshim's group answers."""
    res, _ = run("dshim", "monitored_first", preload=False, pg_timeout=5)
    assert res[0]["error"] == ["RuntimeError", "[Rank 0]: Rank 1 failed to pass monitoredBarrier in 1000 ms"], res
    assert res[2]["error"][1].startswith("Rank 2 successfully reached monitoredBarrier"), res

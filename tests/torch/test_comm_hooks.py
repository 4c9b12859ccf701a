"""DDP's communication hooks and Work futures: dshim gives what gloo gives.

comm_hooks_worker.py runs on 2 ranks with torch's own gloo (the reference), with
init_process_group("dshim"), and with "gloo" under LD_PRELOAD=libdshim.so (the takeover):

- hooks: one DDP model per hook -- the built-in C++ hooks ALLREDUCE and FP16_COMPRESS
  (`ddp._register_builtin_comm_hook`), and torch.distributed.algorithms.ddp_comm_hooks'
  allreduce_hook, fp16_compress_hook, bf16_compress_hook and powerSGD_hook -- trained 4 steps.  Every step's gradients must equal gloo's bit for bit: with 2 ranks every
  reduction adds two values, which commutes, and each hook's compression is the same torch
  arithmetic on every backend.  DDP's logging data names the same hook.
  (Before the fix: FP16_COMPRESS failed with torch's "ProcessGroup::allreduce should return
  TensorList" -- its C++ decompression reads the future's value as a C++ TensorList, which a Python
  Future cannot hold -- and powerSGD_hook hung: their then() callbacks, run by dshim's
  completion thread, wait for an all_reduce that only that thread could complete.)
- futures: for every collective, Work.get_future()'s value has the structure of gloo's: the same
  nesting of lists, tensors of the same shapes and dtypes that are the same tensors (or the same views
  of them: gloo's all_gather_into_tensor answers the output's per-rank chunks).  Where gloo raises
  (no all_to_all; reduce_scatter and send/recv Works without a future) dshim's value is checked
  against what the operation wrote: the outputs, as NCCL's Works answer.

Env: DSHIM_BUILD_DIR selects the build whose libdshim.so is preloaded / loaded.
Run: .venv/bin/python -m pytest -q tests/torch/test_comm_hooks.py  (~40 s on 2 cores)
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
WORKER = HERE / "comm_hooks_worker.py"
N = 2
HANG_S = 45   # a rank stuck this long prints its threads' stacks and exits (the worker's faulthandler)

torch = pytest.importorskip("torch")
if not LIB.exists():
    pytest.skip(f"{LIB} not built (run make)", allow_module_level=True)

_DROP_PREFIXES = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "DSHIM_", "TORCHELASTIC_", "DMLC_")
_DROP_EXACT = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
               "MASTER_ADDR", "MASTER_PORT", "LD_PRELOAD", "TORCH_DISTRIBUTED_DEBUG"}

MODES = {   # name: (backend asked for, preload)
    "gloo": ("gloo", False),
    "dshim": ("dshim", False),
    "takeover": ("gloo", True),
}


def run(mode, scenario, out_dir, timeout=HANG_S + 40):
    """Runs N ranks of the worker; -> {rank: RESULT dict}.  A crash or hang fails the test with the output."""
    backend, preload = MODES[mode]
    env = job_free_env(_DROP_PREFIXES, _DROP_EXACT)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "python")] + [p for p in [env.get("PYTHONPATH")] if p])
    env.update(PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), WORLD_SIZE=str(N), DSHIM_TEST_LIB=str(LIB), TEST_HANG_S=str(HANG_S))
    if preload:
        env["LD_PRELOAD"] = str(LIB)
    out_dir.mkdir(parents=True, exist_ok=True)
    procs = [subprocess.Popen([sys.executable, str(WORKER), backend, scenario, str(out_dir)], env=dict(env, RANK=str(r)),
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(N)]
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
        for p in procs:   # only our own ranks
            if p.poll() is None:
                p.kill()
                p.wait()
    results = {}
    for r, (p, out) in enumerate(zip(procs, outs)):
        lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
        assert p.returncode == 0 and lines, f"{scenario} ({mode}): rank {r} exited {p.returncode}:\n{out[-6000:]}"
        results[r] = json.loads(lines[-1][len("RESULT "):])
        assert results[r]["carried"] == (mode != "gloo"), f"{mode}: rank {r}: dshim carried the group? {results[r]}"
    return results


@pytest.fixture(scope="module")
def gloo_hooks(tmp_path_factory):
    d = tmp_path_factory.mktemp("gloo_hooks")
    return run("gloo", "hooks", d), d


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["dshim", "takeover"])
def test_ddp_comm_hooks_as_gloo(mode, gloo_hooks, tmp_path):
    ref, ref_dir = gloo_hooks
    got = run(mode, "hooks", tmp_path)
    for r in range(N):
        assert got[r]["comm_hook_names"] == ref[r]["comm_hook_names"], (got[r], ref[r])
        want = torch.load(ref_dir / f"rank{r}.pt")
        have = torch.load(tmp_path / f"rank{r}.pt")
        assert list(have) == list(want)
        bad = []
        for hook, steps in want.items():
            for s, (gs, hs) in enumerate(zip(steps, have[hook])):
                for i, (g, h) in enumerate(zip(gs, hs)):
                    if g.dtype != h.dtype or g.shape != h.shape or not torch.equal(g, h):
                        d = (g.double() - h.double()).abs().max().item() if g.shape == h.shape else "shape"
                        bad.append(f"{hook} step {s} parameter {i}: max |d| {d}")
        assert not bad, f"rank {r} ({mode}): gradients differ from gloo's:\n" + "\n".join(bad[:20])


@pytest.fixture(scope="module")
def gloo_futures(tmp_path_factory):
    return run("gloo", "futures", tmp_path_factory.mktemp("gloo_futures"))


# Where gloo's Work has no future (reduce_scatter, send/recv) or gloo has no such collective (all_to_all),
# dshim answers the outputs (NCCL's Works do too): name -> {rank: the value's expected description}
def _t(shape, of, offset=0, stride=None):
    return {"shape": shape, "dtype": "torch.float32", "stride": stride or [1], "of": [of, offset]}


BEYOND_GLOO = {
    "reduce_scatter": {r: ["list", _t([2], "o")] for r in range(N)},
    "reduce_scatter_tensor": {r: ["list", _t([2], "o")] for r in range(N)},
    "all_to_all": {r: ["list"] + [_t([2], f"o{i}") for i in range(N)] for r in range(N)},
    "isend/irecv": {0: ["list", _t([2], "x")], 1: ["list", _t([2], "x")]},
}


@pytest.mark.timeout(200)
@pytest.mark.parametrize("mode", ["dshim", "takeover"])
def test_work_future_values_as_gloo(mode, gloo_futures, tmp_path):
    ref = gloo_futures
    got = run(mode, "futures", tmp_path)
    ops = [k for k in ref[0] if k != "carried"]
    assert sorted(ops) == sorted(k for k in got[0] if k != "carried")
    # the cases beyond gloo are what this test thinks they are
    for name in BEYOND_GLOO:
        assert "value" not in ref[0][name], (name, ref[0][name])
    bad = []
    for r in range(N):
        for name in ops:
            want, have = ref[r][name], got[r][name]
            if name in BEYOND_GLOO:
                if have != {"value": BEYOND_GLOO[name][r]}:
                    bad.append(f"rank {r} {name}: {have}, want {BEYOND_GLOO[name][r]} (gloo: {want})")
            elif have != want:
                bad.append(f"rank {r} {name}:\n  gloo:  {json.dumps(want)}\n  {mode}: {json.dumps(have)}")
    assert not bad, "Work.get_future() values differ from gloo's:\n" + "\n".join(bad)

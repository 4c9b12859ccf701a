"""The dshim backend under Debian's torch 1.13 (python3-torch, /usr/bin/python3): the unmodified DDP
example under gloo, backend "dshim" and the takeover installed by hand, 2 processes, equal final
parameters.  Skips when that torch is not installed (`apt-get install python3-torch`; make setup does
not install it: 220 packages for one compatibility check)."""
import os
import pathlib
import re
import subprocess

import pytest

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
BUILD_DIR = pathlib.Path(os.environ.get("DSHIM_BUILD_DIR", str(REPO / "build")))
DSHIM_RUN = BUILD_DIR / "bin" / "dshim-run"
EXAMPLE = REPO / "examples" / "ddp_train.py"
LEGACY_PY = os.environ.get("DSHIM_LEGACY_TORCH_PYTHON", "/usr/bin/python3")


def legacy_torch_version():
    try:
        out = subprocess.run([LEGACY_PY, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                             text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


VERSION = legacy_torch_version()
pytestmark = pytest.mark.skipif(not VERSION or not VERSION.startswith("1."),
                                reason=f"no torch 1.x at {LEGACY_PY} (found {VERSION}): apt-get install python3-torch")


def run_job(tmp_path, name, backend, preload, takeover=False):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DSHIM_", "RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "TORCHELASTIC_"))}
    env.update(PYTHONPATH=str(REPO / "python"), DSHIM_RUN_PYTHON=LEGACY_PY, PYTHONDONTWRITEBYTECODE="1")
    params = tmp_path / f"{name}.pt"
    cmd = [str(DSHIM_RUN), "--nproc-per-node", "2", "--master-port", "0"] + ([] if preload else ["--no-preload"])
    cmd += [str(HERE / "legacy_run.py")] + (["--takeover"] if takeover else [])
    cmd += [str(EXAMPLE), "--backend", backend, "--steps", "20", "--save-params", str(params)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, f"{name}: exit {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return params, out.stdout + out.stderr


@pytest.mark.timeout(600)
def test_ddp_example_on_torch_1_13(tmp_path):
    import torch  # .venv's, only to read the parameter files (saved by 1.13, readable by 2.x)
    ref, _ = run_job(tmp_path, "gloo", "gloo", preload=False)
    mine, out_d = run_job(tmp_path, "dshim", "dshim", preload=False)
    took, out_t = run_job(tmp_path, "takeover", "gloo", preload=True, takeover=True)
    assert "backend dshim" in out_d, out_d[-2000:]
    assert re.search(r"dshim: carrying backend 'gloo' for rank 0/2 over \S+", out_t), out_t[-2000:]
    a = torch.load(ref)
    for name, path in (("dshim", mine), ("takeover", took)):
        b = torch.load(path)
        assert a.keys() == b.keys()
        # two ranks: a + b is the same in any order, so the sums are bit-identical
        diff = max((a[k].float() - b[k].float()).abs().max().item() for k in a)
        print(f"torch {VERSION}: {name} vs gloo max |diff| = {diff}")
        assert diff == 0.0, f"{name}: parameters differ from gloo's by {diff}"

"""horovod.torch's training layer on dshim against torch's own DDP on gloo.

- The same MLP on the same data split, trained by hvd.DistributedOptimizer + broadcast_parameters
  (2 ranks under dshim-run) and by DDP on gloo (2 ranks under dshim-run --no-preload: torch's
  variables, nothing of dshim's): equal final parameters, for SGD with momentum, Adam, groups=2,
  gradient_predivide_factor=2, backward_passes_per_step=2 (DDP: no_sync) and Compression.fp16
  (DDP: fp16_compress_hook).
- broadcast_optimizer_state restores rank 0's Adam state and options on every rank.
- hvd.elastic.run: a failed collective restores the last commit and re-initializes Horovod; a
  host update heard by rank 0 interrupts every rank at the same commit.
- hvd.SyncBatchNorm: Horovod's refusal of CPU input in training; on a GPU machine, its
  synchronized statistics and gradients against BatchNorm1d over the global batch.

The ranks run hvd_train_worker.py.  Every process started here carries a unique marker in its
environment; none may outlive its job, and only those are ever killed.

Env: DSHIM_BUILD_DIR selects the build (default: the checkout's build/).
Run: .venv/bin/python -m pytest -q tests/horovod/test_hvd_training.py
"""
import os
import pathlib
import signal
import subprocess
import sys
import time
import uuid

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "common"))
from jobenv import job_free_env  # noqa: E402  (tests/common, shared with the other suites)

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
BUILD_DIR = pathlib.Path(os.environ.get("DSHIM_BUILD_DIR", str(REPO / "build")))
LIB = BUILD_DIR / "lib" / "libdshim.so"
DSHIM_RUN = BUILD_DIR / "bin" / "dshim-run"
WORKER = HERE / "hvd_train_worker.py"
PYTHON = pathlib.Path(sys.executable)
HOROVOD_TREE = REPO / "python" / "dshim" / "_horovod"   # dshim's `horovod` package

torch = pytest.importorskip("torch")
pytest.importorskip("cloudpickle")   # Horovod's object functions pickle with it, as Horovod does
if not LIB.exists() or not os.access(DSHIM_RUN, os.X_OK):
    pytest.skip(f"{LIB} or {DSHIM_RUN} not built (run make)", allow_module_level=True)

MARKER_VAR = "DSHIM_TEST_MARKER"
JOB_TIMEOUT = 120   # one 2-rank job: two interpreters importing torch on a loaded 2-core machine
# variables of an enclosing job would change what the ranks do
_DROP_PREFIXES = ("SLURM_", "SLURMD_", "SRUN_", "OMPI_", "PMI_", "PMIX_", "DSHIM_", "TORCHELASTIC_",
                  "DMLC_", "HOROVOD_")
_DROP_EXACT = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
               "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "LD_PRELOAD",
               "OMP_NUM_THREADS", "TORCH_DISTRIBUTED_DEBUG"}


def _read(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def marked_processes(marker):
    """[(pid, cmdline)] of live (non-zombie) processes whose environment has marker."""
    needle = marker.encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        if needle not in _read(f"/proc/{name}/environ"):
            continue
        stat = _read(f"/proc/{name}/stat").decode(errors="replace")
        if not stat or stat[stat.rfind(")") + 2:][:1] in ("Z", "X"):
            continue
        found.append((int(name), _read(f"/proc/{name}/cmdline").replace(b"\0", b" ").decode(errors="replace")))
    return found


@pytest.fixture
def marker():
    m = f"dshim-hvd-test-{uuid.uuid4()}"
    yield m
    for pid, _ in marked_processes(m):   # whatever the outcome, nothing of this test outlives it
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def run_ranks(marker, args, nproc=2, preload=True):
    """The worker on nproc ranks under dshim-run (preload=False: --no-preload, torch alone);
    -> its output.  Fails the test on a non-zero exit, a timeout or a process left behind."""
    env = job_free_env(_DROP_PREFIXES, _DROP_EXACT)
    env["PATH"] = f"{PYTHON.parent}:{env.get('PATH', '/usr/bin:/bin')}"
    # dshim's horovod tree first: `import horovod` finds dshim's layer
    env["PYTHONPATH"] = os.pathsep.join([str(HOROVOD_TREE), str(REPO / "python")] +
                                        [p for p in [env.get("PYTHONPATH")] if p])
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["OMP_NUM_THREADS"] = "1"
    env[MARKER_VAR] = marker
    argv = [str(DSHIM_RUN)] + ([] if preload else ["--no-preload"]) + \
        ["--master-port", "0", "--nproc-per-node", str(nproc), str(WORKER)] + [str(a) for a in args]
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True, text=True, errors="replace")
    try:
        out, _ = proc.communicate(timeout=JOB_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{args} did not finish within {JOB_TIMEOUT} s:\n{out[-6000:]}")
    print(f"{' '.join(map(str, args))} (preload={preload}): {time.monotonic() - t0:.1f} s")
    assert proc.returncode == 0, f"{args} exited {proc.returncode}:\n{out[-6000:]}"
    deadline = time.monotonic() + 3
    while marked_processes(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = marked_processes(marker)
    assert not left, f"processes outlived the job: {left}"
    return out


def worst_relative_diff(ref, got):
    """max over tensors of max|got - ref| / max|ref|, and the tensor's name."""
    worst = (0.0, "")
    assert ref.keys() == got.keys()
    for k, r in ref.items():
        g = got[k]
        assert g.shape == r.shape and g.dtype == r.dtype, k
        d = (g.double() - r.double()).abs().max().item() / (r.double().abs().max().item() or 1.0)
        worst = max(worst, (d, k))
    return worst


# With 2 ranks every reduction adds two numbers once and halves the sum (or adds two halves):
# both are exact up to one rounding, identical in any order, so Horovod-on-dshim and DDP-on-gloo
# agree bitwise (measured: 0 for every variant).  A lost or doubled contribution, a wrong
# average or a skipped accumulation differs by orders of magnitude more than this bound.
TOL = 0.0


@pytest.mark.timeout(2 * JOB_TIMEOUT + 30)
@pytest.mark.parametrize("variant", ["plain", "adam", "groups", "predivide", "accum", "fp16"])
def test_distributed_optimizer_equals_ddp(variant, marker, tmp_path):
    hvd_out, ddp_out = tmp_path / "hvd.pt", tmp_path / "ddp.pt"
    out = run_ranks(marker, ["train", "--impl", "hvd", "--variant", variant, "--out", hvd_out])
    assert out.count(f"OK train hvd {variant}") == 2, out[-3000:]
    out = run_ranks(marker, ["train", "--impl", "ddp", "--variant", variant, "--out", ddp_out], preload=False)
    assert out.count(f"OK train ddp {variant}") == 2, out[-3000:]
    ref, got = torch.load(ddp_out), torch.load(hvd_out)
    # the run did train: the parameters moved away from rank 0's initial ones
    torch.manual_seed(100)
    init = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 5)).state_dict()
    assert worst_relative_diff(init, ref)[0] > 1e-3
    diff, name = worst_relative_diff(ref, got)
    print(f"{variant}: worst relative difference to DDP {diff:.3g} ({name})")
    assert diff <= TOL, f"{variant}: {name} differs from DDP's by {diff:.3g} (relative)"


@pytest.mark.timeout(JOB_TIMEOUT + 30)
def test_broadcast_optimizer_state_restores_adam(marker):
    out = run_ranks(marker, ["optstate"])
    assert out.count("OK optstate") == 2, out[-3000:]


@pytest.mark.timeout(JOB_TIMEOUT + 30)
def test_elastic_run_resets(marker):
    out = run_ranks(marker, ["elastic"])
    assert out.count("OK elastic") == 2, out[-3000:]


@pytest.mark.timeout(JOB_TIMEOUT + 30)
def test_sync_batch_norm_refuses_cpu_training(marker):
    out = run_ranks(marker, ["syncbn", "--device", "cpu"])
    assert out.count("OK syncbn cpu") == 2, out[-3000:]


@pytest.mark.timeout(JOB_TIMEOUT + 30)
@pytest.mark.parametrize("nproc", [2, 3])
def test_sync_batch_norm_equals_global_batch_norm(marker, nproc):
    if not torch.cuda.is_available():
        pytest.skip("torch's synchronized batch-norm kernels are CUDA-only and no GPU is visible")
    out = run_ranks(marker, ["syncbn", "--device", "cuda"], nproc=nproc)
    assert out.count("OK syncbn cuda") == nproc, out[-3000:]

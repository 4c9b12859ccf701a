"""The torch.distributed backend "dshim" (python/dshim) with real torch and real processes.

Every test starts N ranks of worker.py (one process each, env:// rendezvous on
a free MASTER_PORT), each running scenarios that check results against values
computed locally.  The processes are this test's own children; on timeout they
are killed by PID.

Env: DSHIM_BUILD_DIR selects the build whose libdshim.so the ranks load
(default: the checkout's build/).  Run: .venv/bin/python -m pytest -q tests/torch
"""
import os
import pathlib
import re
import subprocess
import sys
import time

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "common"))
from ports import free_port  # noqa: E402  (tests/common, shared with the other suites)
from jobenv import job_free_env  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
BUILD_DIR = pathlib.Path(os.environ.get("DSHIM_BUILD_DIR", str(REPO / "build")))
LIB = BUILD_DIR / "lib" / "libdshim.so"
WORKER = HERE / "worker.py"

torch = pytest.importorskip("torch")
if not LIB.exists():
    pytest.skip(f"{LIB} not built (run make)", allow_module_level=True)

# variables of an enclosing job (torchrun, mpirun, srun, dshim-run) would change what the ranks do
_DROP_PREFIXES = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "DSHIM_", "TORCHELASTIC_", "DMLC_")
_DROP_EXACT = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
               "MASTER_ADDR", "MASTER_PORT", "LD_PRELOAD", "TORCH_DISTRIBUTED_DEBUG"}


def base_env():
    env = job_free_env(_DROP_PREFIXES, _DROP_EXACT)
    # this checkout's package, whether or not it is pip-installed into the venv
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "python")] + [p for p in [env.get("PYTHONPATH")] if p])
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["OMP_NUM_THREADS"] = "1"
    if BUILD_DIR.resolve() != (REPO / "build").resolve():
        env["DSHIM_TEST_PRELOAD"] = str(LIB)   # the package uses a library already loaded in the process
    return env


def launch(n, *scenarios, timeout=240, env=None):
    """Runs n ranks of worker.py; returns [(rc, output)] per rank."""
    port = free_port()
    procs = []
    for r in range(n):
        e = base_env()
        e.update(RANK=str(r), WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                 DSHIM_TEST_DUMP_AFTER=str(max(timeout - 15, 5)))
        e.update(env or {})
        procs.append(subprocess.Popen([sys.executable, str(WORKER), *scenarios], env=e, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
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
            out, _ = p.communicate()
            outs.append(out)
        pytest.fail(f"{scenarios} with {n} ranks did not finish in {timeout} s:\n" +
                    "\n".join(f"--- rank {r}\n{o[-3000:]}" for r, o in enumerate(outs)))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return results


def check(results):
    bad = [(r, rc, out) for r, (rc, out) in enumerate(results) if rc != 0]
    if bad:
        pytest.fail("\n".join(f"--- rank {r} exited {rc}:\n{out[-6000:]}" for r, rc, out in bad))
    for r, (rc, out) in enumerate(results):
        assert " 0 failures" in out, out[-2000:]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("n", [2, 3])
def test_collectives(n):
    """Every collective x dtype x size x async_op, non-contiguous, uneven, complex,
    PREMUL_SUM, fp8, coalesced, object collectives, send/recv."""
    check(launch(n, "collectives"))


@pytest.mark.timeout(300)
def test_collectives_4_ranks():
    """A smaller matrix with 4 ranks (more ranks than cores here)."""
    check(launch(4, "collectives", env={"DSHIM_TEST_SMALL": "1"}))


@pytest.mark.timeout(300)
def test_collectives_tcp():
    """The smaller matrix with dshim's TCP transport instead of shared memory."""
    check(launch(3, "collectives", env={"DSHIM_TEST_SMALL": "1", "DSHIM_TRANSPORT": "tcp"}))


@pytest.mark.timeout(200)
def test_subgroup():
    """new_group([0, 2]) of 3 ranks: collectives among its members only, rank 1
    not involved; the world group and further groups keep working."""
    check(launch(3, "subgroup"))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("scenario", ["group_order", "group_order_overlap"])
def test_group_creation_order(scenario):
    """Sub-groups created in a different order on different ranks: every rank fails within
    seconds with one message naming what each rank created; no all_reduce sums a wrong set."""
    results = launch(3, scenario, timeout=90)
    check(results)
    for r, (rc, out) in enumerate(results):
        assert "all_reduce over a group gave" not in out, out[-2000:]
        m = re.search(r"group order error after ([\d.]+) s", out)
        assert m and float(m.group(1)) < 20, out[-2000:]


@pytest.mark.timeout(120)
def test_root_logger_quiet():
    """logging.basicConfig(level=INFO) in the script: no dshim line reaches the root logger; with
    DSHIM_DEBUG=INFO dshim's own handler shows its join line, once per rank, on stderr."""
    quiet = launch(2, "root_logger", timeout=60)
    check(quiet)
    for rc, out in quiet:
        assert "ROOT INFO:dshim" not in out and "joined over" not in out, out[-2000:]
    loud = launch(2, "root_logger", timeout=60, env={"DSHIM_DEBUG": "INFO"})
    check(loud)
    for rc, out in loud:
        assert "ROOT INFO:dshim" not in out, out[-2000:]
        assert out.count("joined over") == 1, out[-2000:]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("n", [2, 3])
def test_reinit_loop(n):
    """init/destroy of the default group 4 times per process, 3 jobs in a row: none fails (a rank
    leaving destroy first used to meet rank 0's old torch store: "Broken pipe")."""
    for _ in range(3):
        check(launch(n, "reinit", timeout=60))
    # a store the script made and keeps outlives each destroy: nobody waits for it to close
    check(launch(n, "reinit_own_store", timeout=60))


@pytest.mark.timeout(120)
def test_store_listens_on_loopback():
    """MASTER_ADDR=127.0.0.1: rank 0's dshim store is bound to 127.0.0.1."""
    check(launch(2, "listeners"))


@pytest.mark.timeout(120)
def test_single_rank():
    check(launch(1, "single"))


@pytest.mark.timeout(200)
@pytest.mark.parametrize("n", [2, 3])
def test_ddp(n):
    """DDP (buckets, no_sync, BatchNorm buffers, fp16 comm hook) equals a
    single-process reference.  Tolerance rtol 1e-6: DDP sums the ranks'
    gradients in dshim's order (ring or recursive doubling), the reference
    in autograd's, so float32 results can differ in the last bit."""
    check(launch(n, "ddp"))


@pytest.mark.timeout(120)
def test_ddp_error():
    """A collective failing under DDP raises a dshim RuntimeError in every rank's
    backward (through the comm hook's Future), no hang."""
    res = launch(2, "ddp_error", timeout=100)
    check(res)
    for rc, out in res:
        assert "DDP error after" in out, out[-2000:]


@pytest.mark.timeout(120)
def test_errors():
    """Unsupported ops and dtypes raise a clear RuntimeError (no hang), the group
    keeps working after refused calls; mismatched sizes fail on every rank."""
    res = launch(2, "errors", timeout=100)
    check(res)
    for rc, out in res:
        assert "mismatch error after" in out, out[-2000:]


@pytest.mark.timeout(120)
def test_timeout():
    """init_process_group(timeout=3 s): an all_reduce a peer never joins fails
    after about 3 s naming the op, and the peer gets an error too."""
    res = launch(2, "timeout", timeout=100)
    check(res)
    assert "timeout error after" in res[0][1], res[0][1][-2000:]
    assert "peer error" in res[1][1], res[1][1][-2000:]


@pytest.mark.timeout(120)
def test_timeout_rule():
    """The one timeout rule: the user's DSHIM_TIMEOUT wins over init_process_group's
    timeout (3 s, not 60 s), and DSHIM_STALL_WARN warns, naming the op and whom it waits for,
    before the operation fails."""
    res = launch(2, "timeout_rule", timeout=100, env={"DSHIM_TIMEOUT": "3", "DSHIM_STALL_WARN": "1"})
    check(res)
    out = res[0][1]
    assert "timeout error after" in out, out[-2000:]
    warn = [line for line in out.splitlines() if "has made no progress for" in line]
    assert warn, out[-2000:]
    assert "allreduce #1 has made no progress for 1 s while" in warn[0], warn
    assert "rank 1" in warn[0] and "it fails after 3 s without progress" in warn[0], warn


@pytest.mark.timeout(120)
def test_exit_without_destroy():
    """A script that never calls destroy_process_group exits promptly on every
    rank (atexit closes the groups; the store host waits for the others' goodbye)."""
    t0 = time.monotonic()
    check(launch(3, "no_destroy", timeout=100))
    assert time.monotonic() - t0 < 25, f"exit took {time.monotonic() - t0:.1f} s"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["exception", "os._exit"])
def test_rank_exits(how):
    """A rank that leaves (an exception, or os._exit without atexit handlers)
    with an operation in flight: the others get an error at once naming it."""
    res = launch(3, "rank_exits", timeout=100, env={"DSHIM_TEST_HARD_EXIT": "1"} if how == "os._exit" else {})
    assert res[1][0] == (3 if how == "exception" else 0), res[1][1][-2000:]
    check([res[0], res[2]])
    for rc, out in (res[0], res[2]):
        assert "peer error after" in out, out[-2000:]
        if how == "exception":
            assert "rank 1 is exiting with 1 unfinished operation(s), first broadcast #1" in out, out[-2000:]


@pytest.mark.timeout(120)
def test_preloaded_library_is_used(tmp_path):
    """A libdshim.so already in the process (LD_PRELOAD, dshim-run) is the one the
    package uses, not the build tree's."""
    copy = tmp_path / "libdshim.so"
    copy.write_bytes(LIB.read_bytes())
    code = "import dshim._lib as L; print('path', L.lib().path)"
    env = base_env()
    env.pop("DSHIM_TEST_PRELOAD", None)
    env["LD_PRELOAD"] = str(copy)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=100)
    assert out.returncode == 0, out.stderr
    assert f"path {copy}" in out.stdout, out.stdout + out.stderr


@pytest.mark.timeout(200)
def test_cuda():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    check(launch(2, "cuda"))


@pytest.mark.timeout(120)
def test_import_dshim_before_torch():
    """`import dshim` before torch (the Horovod layer's finder, horovodrun, MXNet scripts) does not
    import torch where torch's own import will register the backend (the entry point); with
    TORCH_DEVICE_BACKEND_AUTOLOAD=0 it registers at once, as without the entry point."""
    code = r"""
import importlib.metadata as md, sys
import dshim
print("entry", any(e.name == "dshim" for e in md.entry_points(group="torch.backends")),
      "torch imported", "torch" in sys.modules)
import torch.distributed as dist
print("registered", "DSHIM" in dist.Backend._plugins)
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSHIM_")}
    for autoload in ("1", "0"):
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = autoload
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=100)
        assert out.returncode == 0, out.stderr
        assert "registered True" in out.stdout, out.stdout
        if "entry False" in out.stdout:
            pytest.skip("dshim is not pip-installed into this interpreter (scripts/setup.sh does it)")
        want = "torch imported False" if autoload == "1" else "torch imported True"
        assert want in out.stdout, (autoload, out.stdout)


@pytest.mark.timeout(120)
def test_registration():
    """`import torch` registers "dshim" through the torch.backends entry point
    (when the package is installed into this interpreter); `import dshim` twice
    and register() again are harmless; TORCH_DEVICE_BACKEND_AUTOLOAD=0 leaves
    it to `import dshim`."""
    code = r"""
import importlib.metadata as md, sys
import torch, torch.distributed as dist
eps = [e for e in md.entry_points(group="torch.backends") if e.name == "dshim"]
print("entry", bool(eps), "registered", "DSHIM" in dist.Backend._plugins)
print("devices", dist.Backend.backend_capability.get("dshim"))
import dshim, importlib
importlib.reload(dshim)
assert dshim.register() and dshim.register()
print("after import", "DSHIM" in dist.Backend._plugins, dist.Backend.backend_capability["dshim"])
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSHIM_")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=100)
    assert out.returncode == 0, out.stderr
    lines = out.stdout
    assert "after import True ['cpu', 'cuda']" in lines, lines
    if "entry True" in lines:
        assert "registered True" in lines, lines
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=100)
        assert out.returncode == 0, out.stderr
        assert "registered False" in out.stdout and "after import True" in out.stdout, out.stdout
    else:
        pytest.skip("dshim is not pip-installed into this interpreter (scripts/setup.sh does it); "
                    "import-time registration checked only")

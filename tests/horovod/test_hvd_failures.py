"""Issue 38's failure paths of a Horovod job, end to end: horovod.torch scripts (written into tmp_path)
under `horovodrun -np 2|3` (dshim's, .venv/bin/horovodrun over dshim-run).

- a name one rank never submits: with HOROVOD_STALL_CHECK_TIME_SECONDS=2 and
  HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=6 (rank 1 waits on a name of its own), rank 0 prints Horovod's
  stall warning naming the missing ranks and the tensors, then the stall shutdown: every rank's call
  raises HorovodInternalError naming what it waited for, the job exits non-zero;
- shapes that differ for one name: every rank raises Horovod's mismatch message, the next op works;
- a rank SIGKILLed in a DistributedOptimizer loop: horovodrun stops the job (as real horovodrun does:
  the survivors are terminated, not left to fail), exits non-zero with one line naming the rank, its
  host and the signal, and no process of the job is left (by PID and process group); started as
  horovodrun's Gloo mode starts the ranks, without a launcher that stops them, the survivors raise
  HorovodInternalError at once (not at the timeout) naming the dead rank, and exit without a second
  traceback;
- a setting made in os.environ after `import horovod.torch` and before hvd.init() (Horovod reads its
  HOROVOD_* at init): HOROVOD_STALL_CHECK_TIME_SECONDS and HOROVOD_TIMELINE take effect.
Bad horovodrun flags (one line, exit 2): test_horovodrun.py.  What real Horovod 0.28.1 does in each
case: docs/horovod.md "Failures".

Every job runs in a session of its own and is killed by its process group at its time bound.
Run: .venv/bin/python -m pytest -q tests/horovod/test_hvd_failures.py
"""
import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "common"))
from jobenv import job_free_env  # noqa: E402  (tests/common, shared with the other suites)
from ports import free_port  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
PY = REPO / ".venv" / "bin" / "python"
HOROVODRUN = PY.parent / "horovodrun"
BUILD_DIR = pathlib.Path(os.environ.get("DSHIM_BUILD_DIR", str(REPO / "build")))
HOROVOD_TREE = REPO / "python" / "dshim" / "_horovod"   # dshim's `horovod` package

if not (BUILD_DIR / "lib" / "libdshim.so").exists():
    pytest.skip(f"{BUILD_DIR}/lib/libdshim.so not built (run make)", allow_module_level=True)
if not HOROVODRUN.exists():
    pytest.skip("no .venv/bin/horovodrun: run make setup", allow_module_level=True)

_DROP_PREFIXES = ("SLURM_", "SLURMD_", "SRUN_", "OMPI_", "PMI_", "PMIX_", "DSHIM_", "TORCHELASTIC_", "DMLC_",
                  "HOROVOD_")
_DROP_EXACT = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
               "MASTER_ADDR", "MASTER_PORT", "LD_PRELOAD", "PYTHONPATH"}

# each rank reports what its call raised: "RESULT <rank> <exception class> <seconds>: <message>"
PROLOGUE = r"""
import os, signal, sys, time
import torch
import horovod.torch as hvd

def report(r, t0, e):
    name = "none" if e is None else f"{type(e).__module__}.{type(e).__name__}"
    print(f"RESULT {r} {name} {time.monotonic() - t0:.1f}: {e}", flush=True)
"""


def _env(**extra):
    env = job_free_env(_DROP_PREFIXES, _DROP_EXACT)
    env.update(PATH=f"{PY.parent}{os.pathsep}{env.get('PATH', '')}", PYTHONUNBUFFERED="1",
               PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1")
    env.update(extra)
    return env


def _run(cmd, tmp_path, bound, env):
    """Runs cmd in a session of its own; at the bound its process group is killed and the test fails."""
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace", start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=bound)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{' '.join(map(str, cmd[:4]))} ... did not end within {bound} s:\n{out[-6000:]}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)   # anything the job left in its session
        except ProcessLookupError:
            pass
    return proc.returncode, out, time.monotonic() - t0


def _horovodrun(tmp_path, np_, script, bound, **env):
    path = tmp_path / "script.py"
    path.write_text(PROLOGUE + script)
    return _run([str(HOROVODRUN), "-np", str(np_), "python", str(path)], tmp_path, bound, _env(**env))


def _results(out):
    """{rank: (exception class, seconds, message)} of the RESULT lines."""
    res = {}
    for m in re.finditer(r"RESULT (\d+) (\S+) ([\d.]+): (.*)", out):
        res[int(m.group(1))] = (m.group(2), float(m.group(3)), m.group(4))
    return res


# ---- a name one rank never submits: stall warning, then the stall shutdown ----------------------------

STALL = r"""
hvd.init()
r = hvd.rank()
t0 = time.monotonic()
try:
    # rank 1 never submits "x": it waits in a call of its own ("z", which rank 0 never submits)
    hvd.allreduce(torch.ones(2), name="x" if r == 0 else "z")
    report(r, t0, None)
except Exception as e:
    report(r, t0, e)
    sys.exit(1)
"""


@pytest.mark.timeout(200)
def test_stall_warning_names_rank_and_tensor_then_every_rank_raises(tmp_path):
    rc, out, wall = _horovodrun(tmp_path, 2, STALL, 150, HOROVOD_STALL_CHECK_TIME_SECONDS="2",
                                HOROVOD_STALL_SHUTDOWN_TIME_SECONDS="6")
    assert rc != 0, out
    # Horovod's warning (stall_inspector.cc), rank 1 and the tensor named, then the shutdown's mark "!"
    assert ("One or more tensors were submitted to be reduced, gathered or broadcasted by subset of ranks and are "
            "waiting for remainder of ranks for more than 2 seconds." in out), out
    assert "[rank 0] Missing ranks:\n[rank 0] 0: [allreduce.z]\n[rank 0] 1: [allreduce.x]\n" in out, out
    assert "[rank 0] 0!: [allreduce.z]\n[rank 0] 1!: [allreduce.x]\n" in out, out
    assert 'One or more rank (marked by "!") is stalled for longer than 6 seconds. Will shutdown.' in out, out
    res = _results(out)
    assert sorted(res) == [0, 1], out
    cls0, t_0, msg0 = res[0]
    assert cls0 == "horovod.common.exceptions.HorovodInternalError", out
    assert "'allreduce.x'" in msg0 and "rank 1 did not submit it" in msg0, out
    assert 5.5 <= t_0 <= 30, out   # the shutdown time, not the communicator's timeout
    cls1, t_1, msg1 = res[1]
    assert cls1 == "horovod.common.exceptions.HorovodInternalError", out
    assert "'allreduce.z'" in msg1 and "rank 0 did not submit it" in msg1 and 5.5 <= t_1 <= 30, out
    assert wall < 120, f"the job took {wall:.0f} s"


# ---- shapes that differ for one name ---------------------------------------------------------------------

MISMATCH = r"""
hvd.init()
r = hvd.rank()
t0 = time.monotonic()
try:
    hvd.allreduce(torch.ones(r + 1), name="m")
    report(r, t0, None)
except Exception as e:
    report(r, t0, e)
after = hvd.allreduce(torch.ones(3) * (r + 1), name="after", op=hvd.Sum)
print(f"AFTER {r} {after.tolist()}", flush=True)
"""


@pytest.mark.timeout(200)
def test_mismatched_shapes_raise_on_every_rank_and_the_next_op_works(tmp_path):
    rc, out, _ = _horovodrun(tmp_path, 3, MISMATCH, 150)
    assert rc == 0, out
    res = _results(out)
    assert sorted(res) == [0, 1, 2], out
    for r, (cls, _, msg) in res.items():
        # Horovod's text (controller.cc), then which rank sent what
        assert cls == "horovod.common.exceptions.HorovodInternalError", out
        assert msg.startswith("Mismatched ALLREDUCE tensor shapes: One rank sent a tensor of shape [1], but another "
                              "rank sent a tensor of shape [2]."), out
        assert "rank 2 [3]" in msg, out
    for r in range(3):
        assert f"AFTER {r} [6.0, 6.0, 6.0]" in out, out


# ---- a rank SIGKILLed in the middle of a training loop ---------------------------------------------------

TRAIN = r"""
hvd.init()
r, n = hvd.rank(), hvd.size()
print("JOB " + json.dumps({"rank": r, "pid": os.getpid(), "pgid": os.getpgid(0), "host": socket.gethostname()}),
      flush=True)
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
t0 = time.monotonic()
try:
    for step in range(400):
        if step == 5 and r == n - 1:
            os.kill(os.getpid(), signal.SIGKILL)
        if step == 5:
            t0 = time.monotonic()
        opt.zero_grad()
        model(torch.randn(4, 8)).pow(2).mean().backward()
        opt.step()
        time.sleep(0.02)
    report(r, t0, None)
except Exception as e:
    report(r, t0, e)
    sys.exit(1)
"""
TRAIN_PROLOGUE = "import json, socket\n"


def _jobs(out):
    return [json.loads(ln.split("JOB ", 1)[1]) for ln in out.splitlines() if "JOB {" in ln]


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _group_members(pgids):
    left = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) in pgids and fields[0] != "Z":
                left.append(int(d))
    return left


@pytest.mark.timeout(200)
def test_killed_rank_stops_the_job_and_leaves_no_process(tmp_path):
    rc, out, wall = _horovodrun(tmp_path, 3, TRAIN_PROLOGUE + TRAIN, 150, DSHIM_TIMEOUT="30")
    jobs = _jobs(out)
    assert sorted(j["rank"] for j in jobs) == [0, 1, 2], out
    dead = next(j for j in jobs if j["rank"] == 2)
    # dshim-run's exit code is the first failure's (a signal: 128 + 9), with one line naming it
    assert rc == 128 + signal.SIGKILL, out
    lines = [ln for ln in out.splitlines() if ln.startswith("dshim-run: ") and "stopping the job" in ln]
    assert len(lines) == 1, out
    assert (f"rank 2 on host {dead['host']} (pid {dead['pid']}) was killed by signal 9 (SIGKILL); stopping the "
            f"job (2 other processes running)") in lines[0], out
    assert wall < 120, f"the job took {wall:.0f} s"
    # nothing of the job is left: neither its ranks nor anything in their process groups
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (any(_alive(j["pid"]) for j in jobs) or
                                           _group_members({j["pgid"] for j in jobs})):
        time.sleep(0.2)
    assert not [j["pid"] for j in jobs if _alive(j["pid"])], out
    assert not _group_members({j["pgid"] for j in jobs}), out


@pytest.mark.timeout(200)
def test_killed_rank_survivors_raise_naming_it(tmp_path):
    """The ranks as horovodrun's Gloo mode starts them, with nothing that stops the survivors: each
    raises HorovodInternalError naming rank 2, well within the communicator's timeout."""
    path = tmp_path / "script.py"
    path.write_text(PROLOGUE + TRAIN_PROLOGUE + TRAIN)
    port = free_port()
    n = 3
    procs = []
    try:
        for r in range(n):
            env = _env(HOROVOD_RANK=str(r), HOROVOD_SIZE=str(n), HOROVOD_LOCAL_RANK=str(r),
                       HOROVOD_LOCAL_SIZE=str(n), HOROVOD_CROSS_RANK="0", HOROVOD_CROSS_SIZE="1",
                       HOROVOD_HOSTNAME="localhost", HOROVOD_GLOO_RENDEZVOUS_ADDR="127.0.0.1",
                       HOROVOD_GLOO_RENDEZVOUS_PORT=str(port), DSHIM_TIMEOUT="30",
                       PYTHONPATH=os.pathsep.join([str(HOROVOD_TREE), str(REPO / "python")]))
            procs.append(subprocess.Popen([str(PY), str(path)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True, errors="replace",
                                          start_new_session=True))
        outs = []
        deadline = time.monotonic() + 150
        for p in procs:
            try:
                outs.append(p.communicate(timeout=max(1.0, deadline - time.monotonic()))[0])
            except subprocess.TimeoutExpired:
                pytest.fail("a rank did not end within 150 s")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    out = "\n".join(f"--- rank {r} exited {p.returncode}\n{o}" for r, (p, o) in enumerate(zip(procs, outs)))
    assert procs[2].returncode == -signal.SIGKILL, out
    host = socket.gethostname()
    for r in (0, 1):
        assert procs[r].returncode == 1, out
        res = _results(outs[r])
        assert r in res, out
        cls, seconds, msg = res[r]
        assert cls == "horovod.common.exceptions.HorovodInternalError", out
        # the first failure names the reporting rank and the dead one, each with its host: the transport's
        # words when the step met the closed connection, the host gate's when rank 2 never arrived at the
        # collective in shared memory (ranks that outnumber the cores take the gate for small allgathers)
        assert re.search(rf"rank 2 \((job rank 2, )?host {re.escape(host)}, pid \d+\) (closed its connection "
                         rf"\(it exited, crashed or was killed\)|exited before it arrived at the collective)",
                         msg), out
        assert f"host {host}" in msg, out
        assert seconds < 30, out   # the connection's end, not the timeout
        assert "Traceback" not in outs[r], out   # the failure is reported once, not again at exit


# ---- HOROVOD_* set in os.environ after the import, before hvd.init() ------------------------------------

LATE = r"""
import ctypes, json
from dshim import _lib
# dshim's table is loaded now (this reads it), before the script's settings below
buf = ctypes.create_string_buffer(64)
assert _lib.lib().dshim_config_get(b"HOROVOD_STALL_CHECK_TIME_SECONDS", buf, 64) == 0
print(f"LOADED {os.environ['HOROVOD_RANK']} {buf.value.decode()}", flush=True)
os.environ["HOROVOD_STALL_CHECK_TIME_SECONDS"] = "1"
os.environ["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"] = "3"
os.environ["HOROVOD_TIMELINE"] = sys.argv[1]
hvd.init()
r = hvd.rank()
hvd.allreduce(torch.ones(2), name="first")
t0 = time.monotonic()
try:
    hvd.allreduce(torch.ones(2), name="x" if r == 0 else "z")
    report(r, t0, None)
except Exception as e:
    report(r, t0, e)
"""


@pytest.mark.timeout(200)
def test_settings_made_after_import_are_read_at_init(tmp_path):
    timeline = tmp_path / "timeline.json"
    path = tmp_path / "script.py"
    path.write_text(PROLOGUE + LATE)
    # without the late settings the stall would last until the communicator's timeout (40 s)
    rc, out, _ = _run([str(HOROVODRUN), "-np", "2", "python", str(path), str(timeline)], tmp_path, 150,
                      _env(DSHIM_TIMEOUT="40"))
    assert rc == 0, out
    assert "LOADED 0 60" in out and "LOADED 1 60" in out, out   # the table had the default when it loaded
    assert "waiting for remainder of ranks for more than 1 seconds." in out, out
    assert 'is stalled for longer than 3 seconds. Will shutdown.' in out, out
    res = _results(out)
    assert sorted(res) == [0, 1], out
    for r, (cls, seconds, msg) in res.items():
        assert cls == "horovod.common.exceptions.HorovodInternalError", out
        assert "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=3 s" in msg and 2.5 <= seconds < 20, out
    # rank 0 wrote Horovod's timeline (a Chrome trace) of the operations into the late-set file
    text = timeline.read_text()
    assert "allreduce.first" in text, text[:2000]


BAD_LATE = r"""
os.environ["HOROVOD_CYCLE_TIME"] = "fast"
try:
    hvd.init()
    print(f"INIT OK", flush=True)
except ValueError as e:
    print(f"INIT REFUSED {e}", flush=True)
"""


@pytest.mark.timeout(120)
def test_bad_setting_made_after_import_is_refused_at_init(tmp_path):
    """A bad value set after import is checked at hvd.init() as one set before the start is: refused
    with the table's message naming the variable (never a silent default)."""
    path = tmp_path / "script.py"
    path.write_text(PROLOGUE + BAD_LATE)
    rc, out, _ = _run([str(HOROVODRUN), "-np", "2", "python", str(path)], tmp_path, 90, _env())
    assert out.count("INIT REFUSED") == 2 and "INIT OK" not in out, out
    assert "HOROVOD_CYCLE_TIME=fast: must be a number >= 0" in out, out

"""dshim-run's one-screen diagnosis and live status (docs/launcher.md "Diagnosis and live
status"), on real jobs under dshim-run with dshim's flight recorder on (its default):

  - a torch job where one rank skips a collective (hung; DSHIM_TIMEOUT=3): the diagnosis names the
    rank that skipped and the op and seq the others wait in; --diagnose DIR says the same offline
  - mismatched jobs: one rank calls another collective, or the same with another count
  - a SIGSTOPped rank: named as stopped, and the job still ends promptly (no wait for its dump)
  - a killed rank (kill -9): named as killed by signal 9, with the op the others wait in
  - an NCCL-API program on host buffers (ctypes over libdshim.so's exported NCCL API)
  - --status on a running job with a straggler: every rank's row, the straggler named, the job
    unharmed; SIGUSR1 prints the same on dshim-run's stderr
  - the recorder off: no diagnosis, no directory, no wait

Run: .venv/bin/python -m pytest -q -p no:cacheprovider tests/launcher/test_diagnose.py
(DSHIM_BUILD_DIR=<build dir>; ctest runs it as launcher.diagnose).  Fixtures in conftest.py.
"""
import os
import pathlib
import re
import signal
import subprocess
import time

import pytest

from conftest import wait_for_files

pytestmark = pytest.mark.timeout(150)

TIMEOUT_ENV = {"DSHIM_TIMEOUT": "3"}

# Every rank: STEPS all_reduces of 1,000 floats, a ready file after the first; then
#   SKIP_RANK skips the last one (sleeps instead: the others hang in it),
#   ODD=op:    ODD_RANK calls broadcast where the others call all_reduce,
#   ODD=count: ODD_RANK's all_reduce has 500 elements,
#   SLEEP_RANK sleeps SLEEP before every all_reduce (a straggler), until STOP_FILE exists.
TORCH_JOB = """
import os, sys, time
import torch
import torch.distributed as dist
d = sys.argv[1]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
steps = int(os.environ.get("STEPS", "5"))
x = torch.ones(1000)
skip = int(os.environ.get("SKIP_RANK", "-1"))
odd, odd_rank = os.environ.get("ODD", ""), int(os.environ.get("ODD_RANK", "-1"))
sleep_rank, sleep = int(os.environ.get("SLEEP_RANK", "-1")), float(os.environ.get("SLEEP", "0"))
stop_file = os.environ.get("STOP_FILE", "")
step = 0
while True:
    if step == 1:
        open(os.path.join(d, "ready.%d" % rank), "w").write(str(os.getpid()))
    if stop_file:
        if os.path.exists(stop_file):
            break
    elif step == steps:
        break
    if rank == sleep_rank:
        time.sleep(sleep)
    dist.all_reduce(x)
    step += 1
if rank == skip:
    time.sleep(60)
elif rank == odd_rank and odd == "op":
    dist.broadcast(x, 0)
elif rank == odd_rank and odd == "count":
    dist.all_reduce(torch.ones(500))
else:
    dist.all_reduce(x)
print("rank %d done after %d steps" % (rank, step), flush=True)
"""

# The NCCL C API of libdshim.so (preloaded by dshim-run), called through ctypes on host buffers:
# rank 0 makes the unique id and hands it over in a file; STEPS ncclAllReduce calls, then SKIP_RANK
# skips the last one.  Exits 1 when a call fails (the others' timeout).  FAIL_TOGETHER=1: every rank
# writes its dump (dshim_trace_dump) and exits 1 right after the last call, all at once.
NCCL_JOB = """
import ctypes, os, sys, time
d = sys.argv[1]
lib = ctypes.CDLL(None)  # the preloaded libdshim.so answers for the NCCL API
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]
uid = UniqueId()
path = os.path.join(d, "nccl-id")
if rank == 0:
    assert lib.ncclGetUniqueId(ctypes.byref(uid)) == 0
    open(path + ".tmp", "wb").write(ctypes.string_at(ctypes.byref(uid), 128))
    os.rename(path + ".tmp", path)
else:
    while not os.path.exists(path):
        time.sleep(0.02)
    ctypes.memmove(ctypes.byref(uid), open(path, "rb").read(), 128)
comm = ctypes.c_void_p()
lib.ncclCommInitRank.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, UniqueId, ctypes.c_int]
assert lib.ncclCommInitRank(ctypes.byref(comm), world, uid, rank) == 0
lib.ncclAllReduce.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                              ctypes.c_void_p, ctypes.c_void_p]
lib.ncclGetErrorString.restype = ctypes.c_char_p
n = 1024
buf = (ctypes.c_float * n)(*([1.0] * n))
steps, skip = int(os.environ.get("STEPS", "4")), int(os.environ.get("SKIP_RANK", "-1"))
for step in range(steps + 1):
    if step == 1:
        open(os.path.join(d, "ready.%d" % rank), "w").write(str(os.getpid()))
    if step == steps and rank == skip:
        time.sleep(60)
    rc = lib.ncclAllReduce(buf, buf, n, 7, 0, comm, None)  # ncclFloat32, ncclSum
    if rc != 0:
        print("rank %d: ncclAllReduce: %s" % (rank, lib.ncclGetErrorString(rc).decode()), flush=True)
        sys.exit(1)
if os.environ.get("FAIL_TOGETHER"):
    assert lib.dshim_trace_dump() == 0
    os._exit(1)
print("rank %d done" % rank, flush=True)
"""


def describe(res):
    return f"rc={res.rc} elapsed={res.elapsed:.1f}s\nstdout:\n{res.out}\nstderr:\n{res.err}"


def diagnosis_lines(err):
    """The diagnosis block: the lines after 'diagnosis from the flight recorder', prefix removed."""
    lines = err.splitlines()
    for i, ln in enumerate(lines):
        if "dshim-run: diagnosis from the flight recorder" in ln:
            out = []
            for nxt in lines[i + 1:]:
                if not nxt.startswith("dshim-run:   "):
                    break
                out.append(nxt[len("dshim-run:   "):])
            return ln, out
    return None, []


def dump_dir_of(header):
    m = re.search(r"\(dumps in (\S+);", header or "")
    return pathlib.Path(m.group(1)) if m else None


class Timed:
    """A dshim-run in the background whose stderr is watched, to time its end after the failure line."""

    def __init__(self, start, args, env):
        self.job = start(args, env=env)
        self.t_fail = None

    def wait(self, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.job.proc.poll() is None:
            if self.t_fail is None and "stopping the job" in self.job.stderr():
                self.t_fail = time.monotonic()
            time.sleep(0.02)
        if self.t_fail is None and "stopping the job" in self.job.stderr():
            self.t_fail = time.monotonic()
        t_end = time.monotonic()
        res = self.job.wait(5)
        return res, (t_end - self.t_fail) if self.t_fail else None


def run_torch(run, write_script, workdir, env, nproc=3, timeout=120):
    script = write_script("job.py", TORCH_JOB)
    return run(["--nproc-per-node", nproc, "--master-port", 0, script, workdir], env={**TIMEOUT_ENV, **env},
               timeout=timeout)


def test_hung_rank_skipped_a_collective(run, write_script, workdir, no_leftovers, dshim_run):
    res = run_torch(run, write_script, workdir, {"SKIP_RANK": 1, "STEPS": 5})
    assert res.rc == 1, describe(res)
    header, lines = diagnosis_lines(res.err)
    assert header, describe(res)
    text = "\n".join(lines)
    m = re.search(r"^ranks 0,2 wait in allreduce #(\d+) \(float32 \u00d7 1,000, from torch all_reduce\) for rank 1\b",
                  text, re.M)
    assert m, describe(res)
    seq = int(m.group(1))
    assert re.search(r"^rank 1 \(host \S+, pid \d+\) has not called any collective for [\d.]+ m?s "
                     r"\(last: allreduce #%d done\)$" % (seq - 1), text, re.M), describe(res)
    assert len(lines) <= 10, describe(res)
    # the agents' frames are the launcher's business, never lines of output ("A -1 1" was printed once)
    assert not re.search(r"^\[agent on [^]]*\] [A-Z] -?\d", res.err + res.out, re.M), describe(res)
    # the dumps are kept where the header says, and --diagnose reads them offline to the same verdict
    d = dump_dir_of(header)
    assert d and d.is_dir() and d.parent == workdir, describe(res)
    dumps = sorted(p.name for p in d.glob("dshim-trace.*.jsonl"))
    assert len(dumps) == 3 and (d / "launcher.jsonl").exists(), dumps
    offline = subprocess.run([str(dshim_run), "--diagnose", str(d)], capture_output=True, text=True, timeout=30)
    assert offline.returncode == 0, offline.stderr
    assert m.group(0) in offline.stdout, offline.stdout
    assert re.search(r"^rank 1 \(host \S+, pid \d+\) has not called any collective", offline.stdout, re.M)
    # nothing of the job's private directory ($TMPDIR/dshim-run.XXXXXX, its trace_0 named in the ranks' lines) is left
    jobdirs = set(re.findall(r"(/\S*/dshim-run\.[A-Za-z0-9]{6})/trace_0/", res.err + res.out))
    assert jobdirs, describe(res)
    assert not [j for j in jobdirs if pathlib.Path(j).exists()], jobdirs
    no_leftovers()


@pytest.mark.parametrize("odd", ["op", "count"])
def test_mismatched_collectives(run, write_script, workdir, no_leftovers, odd):
    res = run_torch(run, write_script, workdir, {"ODD": odd, "ODD_RANK": 1, "STEPS": 4})
    assert res.rc != 0, describe(res)
    header, lines = diagnosis_lines(res.err)
    text = "\n".join(lines)
    assert header, describe(res)
    if odd == "op":
        m = re.search(r"^ranks 0,2 wait in allreduce #(\d+) .* for rank 1", text, re.M)
        assert m, describe(res)
        # (the torch backend broadcasts bytes: the dtype is dshim's, not the tensor's)
        assert re.search(r"^rank 1 \(host \S+, pid \d+\) last completed allreduce #%d and is now in broadcast #%s "
                         r"\([^)]*, root 0, from torch broadcast\): not the collective the others called"
                         % (int(m.group(1)) - 1, m.group(1)), text, re.M), describe(res)
    else:
        m = re.search(r"^ranks 0,2 wait in allreduce #(\d+) \(float32 \u00d7 1,000, from torch all_reduce\) for rank 1",
                      text, re.M)
        assert m, describe(res)
        assert re.search(r"^rank 1 \(host \S+, pid \d+\) is in allreduce #%s too but with float32 \u00d7 500 where the "
                         r"others have float32 \u00d7 1,000: the calls do not match" % m.group(1), text, re.M), \
            describe(res)
    no_leftovers()


def test_sigstopped_rank(start, write_script, workdir, no_leftovers):
    """Rank 1 is stopped in the middle of the job; the others time out.  The stopped rank cannot
    write a dump: it is named as stopped, and dshim-run does not wait for it (it ends within
    RUN_COLLECT_WAIT_S of the failure and the stop, well inside the soak's 2 s slack)."""
    script = write_script("job.py", TORCH_JOB)
    stop = workdir / "stop"
    timed = Timed(start, ["--nproc-per-node", 3, "--master-port", 0, script, workdir],
                  {**TIMEOUT_ENV, "STOP_FILE": stop, "SLEEP_RANK": 1, "SLEEP": "0.05"})
    ready = [workdir / f"ready.{r}" for r in range(3)]
    assert wait_for_files(ready, 90), timed.job.stderr()
    victim = int((workdir / "ready.1").read_text())
    os.kill(victim, signal.SIGSTOP)
    res, after_fail = timed.wait(60)
    assert res.rc == 1, describe(res)
    header, lines = diagnosis_lines(res.err)
    text = "\n".join(lines)
    assert re.search(r"^ranks 0,2 wait in allreduce #(\d+) .* for rank 1", text, re.M), describe(res)
    assert re.search(r"^rank 1 \(host \S+, pid %d\) is alive but stopped \(SIGSTOP or a debugger\), so it wrote no "
                     r"dump \u2014 the others wait for it in allreduce #\d+$" % victim, text, re.M), describe(res)
    assert after_fail is not None and after_fail < 2.0, f"dshim-run ended {after_fail} s after the failure\n" \
                                                         + describe(res)
    no_leftovers()


def test_killed_rank(start, write_script, workdir, no_leftovers):
    """Rank 1 is killed with SIGKILL while the others wait for it in a collective (it sleeps before
    its call): it left no dump, and the diagnosis says so with the op the others wait in."""
    script = write_script("job.py", TORCH_JOB)
    stop = workdir / "stop"
    timed = Timed(start, ["--nproc-per-node", 3, "--master-port", 0, script, workdir],
                  {"DSHIM_TIMEOUT": "30", "STOP_FILE": stop, "SLEEP_RANK": 1, "SLEEP": "1.0"})
    ready = [workdir / f"ready.{r}" for r in range(3)]
    assert wait_for_files(ready, 90), timed.job.stderr()
    time.sleep(0.5)  # rank 1 is in its sleep, the others in their all_reduce
    victim = int((workdir / "ready.1").read_text())
    os.kill(victim, signal.SIGKILL)
    res, after_fail = timed.wait(60)
    assert res.rc == 128 + 9, describe(res)
    header, lines = diagnosis_lines(res.err)
    text = "\n".join(lines)
    m = re.search(r"^ranks 0,2 wait in allreduce #(\d+) \(float32 \u00d7 1,000, from torch all_reduce\) for rank 1",
                  text, re.M)
    assert m, describe(res)
    assert re.search(r"^rank 1 \(host \S+, pid %d\) left no dump \(it died: the launcher saw it killed by signal 9, "
                     r"SIGKILL\) \u2014 the others wait for it in allreduce #%s$" % (victim, m.group(1)), text, re.M), \
        describe(res)
    assert after_fail is not None and after_fail < 2.0 + 5.0, describe(res)  # + the SIGTERM grace of the survivors
    no_leftovers()


def test_nccl_api_on_host_buffers(run, write_script, workdir, no_leftovers, libdshim):
    syms = subprocess.run(["nm", "-D", str(libdshim)], capture_output=True, text=True).stdout
    if " T ncclAllReduce" not in syms:
        pytest.skip("libdshim.so was built without the NCCL API (no nccl.h)")
    script = write_script("nccl_job.py", NCCL_JOB)
    res = run(["--nproc-per-node", 3, "--master-port", 0, script, workdir],
              env={**TIMEOUT_ENV, "SKIP_RANK": 1, "STEPS": 4}, timeout=90)
    assert res.rc == 1, describe(res)
    header, lines = diagnosis_lines(res.err)
    text = "\n".join(lines)
    m = re.search(r"^ranks 0,2 wait in allreduce #(\d+) \(float32 \u00d7 1,024(, from ncclAllReduce)?\) for rank 1",
                  text, re.M)
    assert m, describe(res)
    assert re.search(r"^rank 1 \(host \S+, pid \d+\) has not called any collective for .* \(last: allreduce #%d done\)$"
                     % (int(m.group(1)) - 1), text, re.M), describe(res)
    no_leftovers()


def test_whole_host_fails_at_once(run, write_script, workdir, no_leftovers, libdshim):
    """Every process of the (only) host writes its dump and exits 1 at the same moment: the agent
    reaps them all before the controller's request for the dumps arrives, and waits for it
    (RUN_COLLECT_LINGER_S) instead of ending with the dumps unsent (the CI failure of 2c in
    test_multihost.sh: "ranks 0,1 left no dump")."""
    syms = subprocess.run(["nm", "-D", str(libdshim)], capture_output=True, text=True).stdout
    if " T ncclAllReduce" not in syms:
        pytest.skip("libdshim.so was built without the NCCL API (no nccl.h)")
    script = write_script("nccl_job.py", NCCL_JOB)
    for attempt in range(3):
        (workdir / "nccl-id").unlink(missing_ok=True)  # rank 0 makes a new one
        res = run(["--nproc-per-node", 3, "--master-port", 0, script, workdir],
                  env={"FAIL_TOGETHER": 1, "STEPS": 2}, timeout=90)
        assert res.rc == 1, describe(res)
        header, lines = diagnosis_lines(res.err)
        assert header, describe(res)
        d = dump_dir_of(header)
        dumps = sorted(p.name for p in d.glob("dshim-trace.*.jsonl"))
        assert len(dumps) == 3, f"attempt {attempt}: {dumps}\n" + describe(res)
        assert "left no dump" not in res.err, describe(res)
    no_leftovers()


def test_status_names_the_straggler(start, write_script, workdir, no_leftovers, dshim_run, env):
    """--status PID on a running job whose rank 2 sleeps 0.2 s before every all_reduce: a row per
    rank, rank 2 named the slowest, the job goes on (and ends 0 when told to).  SIGUSR1 to dshim-run
    prints the same status on its stderr."""
    script = write_script("job.py", TORCH_JOB)
    stop = workdir / "stop"
    job = start(["--nproc-per-node", 3, "--master-port", 0, script, workdir],
                env={"STOP_FILE": stop, "SLEEP_RANK": 2, "SLEEP": "0.2"})
    ready = [workdir / f"ready.{r}" for r in range(3)]
    assert wait_for_files(ready, 90), job.stderr()
    time.sleep(3.0)  # a dozen steps for the straggler statistics
    st = subprocess.run([str(dshim_run), "--status", str(job.pid)], capture_output=True, text=True, timeout=30,
                        env=env)
    assert st.returncode == 0, f"{st.stdout}\n{st.stderr}"
    out = st.stdout
    assert re.search(r"^dshim-run %d at \S+: 3 process\(es\), 3 running; dumps in \S+" % job.pid, out, re.M), out
    for r in range(3):
        assert re.search(r"^%d\s+\S+\s+%d\s+.*allreduce #\d+" % (r, int(ready[r].read_text())), out, re.M), out
    m = re.search(r"^slowest over the last (\d+) collective\(s\) of .*: rank 2 arrives (\d+) ms after the first", out,
                  re.M)
    assert m and int(m.group(1)) >= 5 and 120 <= int(m.group(2)) <= 400, out
    # without a pid: this job, or (other jobs of this user running beside it) a list naming it
    st = subprocess.run([str(dshim_run), "--status"], capture_output=True, text=True, timeout=30, env=env)
    if st.returncode == 0:
        assert re.search(r"^dshim-run %d at " % job.pid, st.stdout, re.M), st.stdout
    else:
        assert st.returncode == 2 and f"dshim-run --status {job.pid} " in st.stderr, st.stderr
    # SIGUSR1: the same on dshim-run's stderr
    os.kill(job.pid, signal.SIGUSR1)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and "slowest over the last" not in job.stderr():
        time.sleep(0.05)
    assert re.search(r"^dshim-run:   slowest over the last \d+ collective\(s\) of .*: rank 2", job.stderr(), re.M), \
        job.stderr()
    stop.write_text("")
    res = job.wait(60)
    assert res.rc == 0, describe(res)
    assert len(re.findall(r"done after \d+ steps", res.out)) == 3, describe(res)
    # a second --status finds nothing to ask now
    st = subprocess.run([str(dshim_run), "--status", str(job.pid)], capture_output=True, text=True, timeout=30,
                        env=env)
    assert st.returncode == 2 and "cannot reach dshim-run" in st.stderr, st.stderr
    no_leftovers()


def test_recorder_off_says_nothing(run, write_script, workdir, no_leftovers):
    res = run_torch(run, write_script, workdir, {"SKIP_RANK": 1, "STEPS": 3, "DSHIM_TRACE_BUFFER": 0})
    assert res.rc == 1, describe(res)
    assert "diagnosis from the flight recorder" not in res.err, describe(res)
    assert not list(workdir.glob("dshim-trace-*")), describe(res)
    no_leftovers()


def test_diagnose_and_status_usage(run, workdir):
    res = run(["--diagnose", workdir / "nope"], timeout=20)
    assert res.rc == 2 and "cannot read" in res.err, describe(res)
    (workdir / "empty").mkdir()
    res = run(["--diagnose", workdir / "empty"], timeout=20)
    assert res.rc == 2 and "no flight-recorder dump" in res.err, describe(res)
    res = run(["--status", "999999999"], timeout=20)
    assert res.rc == 2 and "cannot reach dshim-run 999999999" in res.err, describe(res)
    res = run(["--status=x1"], timeout=20)
    assert res.rc == 2 and "expected the pid of a running dshim-run" in res.err, describe(res)

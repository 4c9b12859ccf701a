"""Fixtures for the local-launcher tests of dshim-run (test_local.py).

Every test launches real processes.  Each test gets a unique marker (a uuid)
in DSHIM_TEST_MARKER; every process of its job inherits it, so "nothing of the
job survives" is checked by scanning /proc/*/environ and /proc/*/cmdline for
the marker.  The only processes a test ever kills are the dshim-run it started
(by PID / its own session) and, when cleaning up after a failure, processes
carrying its own marker (descendants of that dshim-run, nobody else's).

DSHIM_BUILD_DIR selects the build (default: <repo>/build).
"""
import collections
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "common"))
from ports import free_port  # noqa: E402  (tests/common, shared with the other suites)

REPO = pathlib.Path(__file__).resolve().parents[2]
BUILD_DIR = pathlib.Path(os.environ.get("DSHIM_BUILD_DIR", str(REPO / "build")))
VENV_BIN = REPO / ".venv" / "bin"
if not (VENV_BIN / "python").exists():
    VENV_BIN = pathlib.Path(sys.executable).parent

MARKER_VAR = "DSHIM_TEST_MARKER"

# Variables that would change what dshim-run or the job does if the test runner
# happened to be started inside another job (torchrun, mpirun, srun) or with
# dshim settings of its own.
_DROP_PREFIXES = ("SLURM_", "SLURMD_", "SRUN_", "OMPI_", "PMI_", "PMIX_", "DSHIM_", "TORCHELASTIC_", "DMLC_")
_DROP_EXACT = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
               "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "LD_PRELOAD",
               "OMP_NUM_THREADS", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "PS_VERBOSE"}

Result = collections.namedtuple("Result", "rc out err elapsed")


def base_env(marker):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(_DROP_PREFIXES) and k not in _DROP_EXACT}
    # python3 on PATH is the venv's (torch installed): dshim-run runs .py files with it
    env["PATH"] = f"{VENV_BIN}:{env.get('PATH', '/usr/local/bin:/usr/bin:/bin')}"
    env["PYTHONUNBUFFERED"] = "1"      # lines reach the launcher before a rank is killed
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env[MARKER_VAR] = marker
    return env


def merge_env(base, overrides):
    env = dict(base)
    for k, v in (overrides or {}).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = str(v)
    return env


# ---- /proc scanning ---------------------------------------------------------

def _read(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def marked_processes(marker):
    """[(pid, state, cmdline)] of live (non-zombie) processes carrying marker."""
    needle = marker.encode()
    me = os.getpid()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        if pid == me:
            continue
        cmdline = _read(f"/proc/{pid}/cmdline")
        if needle not in cmdline and needle not in _read(f"/proc/{pid}/environ"):
            continue
        stat = _read(f"/proc/{pid}/stat").decode(errors="replace")
        state = stat[stat.rfind(")") + 2:][:1] if ")" in stat else "?"
        if state in ("Z", "X", ""):
            continue  # a zombie holds nothing; its parent reaps it
        found.append((pid, state, cmdline.replace(b"\0", b" ").decode(errors="replace").strip()))
    return found


def kill_marked(marker):
    """Cleanup after a failed test: SIGKILL what still carries this test's marker."""
    left = marked_processes(marker)
    for pid, _, _ in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return left


# ---- fixtures ---------------------------------------------------------------

@pytest.fixture(scope="session")
def dshim_run():
    exe = BUILD_DIR / "bin" / "dshim-run"
    if not os.access(exe, os.X_OK):
        pytest.fail(f"{exe} not found: build it (make), or set DSHIM_BUILD_DIR to the build directory")
    return exe


@pytest.fixture(scope="session")
def libdshim():
    return pathlib.Path(os.path.realpath(BUILD_DIR / "lib" / "libdshim.so"))


@pytest.fixture
def workdir(tmp_path):
    return tmp_path


@pytest.fixture
def marker():
    m = f"dshim-test-{uuid.uuid4()}"
    yield m
    # Whatever the test's outcome, nothing of its job may outlive it.
    left = kill_marked(m)
    if left:
        sys.stderr.write(f"\nconftest: killed leftovers of {m}: {left}\n")


@pytest.fixture
def env(marker):
    """The environment every launch of this test starts from (marker included)."""
    return base_env(marker)


@pytest.fixture
def no_leftovers(marker):
    """check(marker=None, within=2.0): asserts no process with the marker is alive
    (waiting up to `within` seconds for it to become true)."""
    def check(m=None, within=2.0):
        m = m or marker
        deadline = time.monotonic() + within
        while True:
            left = marked_processes(m)
            if not left or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        if left:
            kill_marked(m)
            listing = "; ".join(f"pid {p} ({s}) {c[:160]}" for p, s, c in left)
            pytest.fail(f"{len(left)} process(es) of the job survived {within:.1f}s after the launcher: {listing}")
    return check


def _stop_session(proc):
    """Kills the session we started the launcher in (the launcher's own group)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.wait()


@pytest.fixture
def run(dshim_run, env, workdir):
    """run(args, env=None, timeout=60, cwd=workdir, exe=dshim-run) -> Result(rc, out, err, elapsed).

    args are dshim-run's arguments; env holds overrides of the test's environment
    (None deletes a variable)."""
    def _run(args, env=None, timeout=60, cwd=None, exe=None):
        argv = [str(exe or dshim_run)] + [str(a) for a in args]
        full_env = merge_env(_env_base, env)
        t0 = time.monotonic()
        proc = subprocess.Popen(argv, env=full_env, cwd=str(cwd or workdir), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _stop_session(proc)
            out, err = proc.communicate()
            pytest.fail(f"{argv} did not finish within {timeout}s\nstdout:\n{out.decode(errors='replace')}"
                        f"\nstderr:\n{err.decode(errors='replace')}")
        return Result(proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"),
                      time.monotonic() - t0)
    _env_base = env
    return _run


class Job:
    """A launcher started in the background (signal tests)."""

    def __init__(self, argv, env, cwd):
        self.argv = argv
        self.out_path = pathlib.Path(cwd) / f".job-{uuid.uuid4().hex}.out"
        self.err_path = pathlib.Path(cwd) / f".job-{uuid.uuid4().hex}.err"
        self._out = open(self.out_path, "wb")
        self._err = open(self.err_path, "wb")
        self.t0 = time.monotonic()
        # its own session: a signal we send reaches dshim-run only, as `kill PID` would
        self.proc = subprocess.Popen(argv, env=env, cwd=str(cwd), stdin=subprocess.DEVNULL, stdout=self._out,
                                     stderr=self._err, start_new_session=True)
        self.pid = self.proc.pid

    def signal(self, sig):
        self.proc.send_signal(sig)

    def wait(self, timeout):
        """-> Result; fails the test if the launcher is still running after timeout seconds."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            pytest.fail(f"{self.argv} still running {timeout}s later\nstdout:\n{self.stdout()}"
                        f"\nstderr:\n{self.stderr()}")
        return Result(self.proc.returncode, self.stdout(), self.stderr(), time.monotonic() - self.t0)

    def stdout(self):
        return self.out_path.read_text(errors="replace")

    def stderr(self):
        return self.err_path.read_text(errors="replace")

    def stop(self):
        _stop_session(self.proc)
        self._out.close()
        self._err.close()


@pytest.fixture
def start(dshim_run, env, workdir):
    """start(args, env=None, cwd=workdir) -> Job running dshim-run in the background."""
    jobs = []

    def _start(args, env=None, cwd=None, exe=None):
        argv = [str(exe or dshim_run)] + [str(a) for a in args]
        job = Job(argv, merge_env(_env_base, env), cwd or workdir)
        jobs.append(job)
        return job
    _env_base = env
    yield _start
    for job in jobs:
        job.stop()


@pytest.fixture
def write_script(workdir):
    """write_script(name, text, mode=0o644) -> path of a dedented file in the workdir."""
    def _write(name, text, mode=0o644):
        path = workdir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"))
        path.chmod(mode)
        return path
    return _write


def wait_for_files(paths, timeout):
    """True when every path exists (polling), False after timeout seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(pathlib.Path(p).exists() for p in paths):
            return True
        time.sleep(0.02)
    return all(pathlib.Path(p).exists() for p in paths)


def pid_alive(pid):
    stat = _read(f"/proc/{pid}/stat").decode(errors="replace")
    if not stat:
        return False
    return stat[stat.rfind(")") + 2:][:1] not in ("Z", "X")

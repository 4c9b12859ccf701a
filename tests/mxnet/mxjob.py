"""Helpers for the MXNet tests: run a user script as a dist job under MXNet's own
ps-lite or under dshim, through dshim-run (launch.py style) or by hand (DMLC_*
variables, no launcher), and compare what the workers wrote."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
from ports import free_port  # noqa: E402  (tests/common, shared with the other suites)

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("DSHIM_BUILD_DIR", ROOT / "build"))
PY = ROOT / ".venv-mxnet" / "bin" / "python"
RUN = BUILD / "bin" / "dshim-run"
LIB = BUILD / "lib" / "libdshim.so"
SCRIPTS = Path(__file__).resolve().parent / "scripts"


def clean_env(extra=None):
    # DSHIM_TRACE_DIR is the test run's, not the job's configuration: the flight-recorder dumps of
    # the failure tests' killed roles go where scripts/run_tests.sh removes them, not into /tmp
    env = {k: v for k, v in os.environ.items()
           if (not k.startswith(("DMLC_", "PS_", "DSHIM_", "MXNET_")) or k == "DSHIM_TRACE_DIR") and k != "LD_PRELOAD"}
    env["OMP_NUM_THREADS"] = "1"
    env["MXNET_ENGINE_TYPE"] = env.get("MXNET_ENGINE_TYPE", "ThreadedEnginePerDevice")
    env.update(extra or {})
    return env


def launch(script, out, *args, dshim=True, nw=2, ns=2, env=None, timeout=180):
    """dshim-run -n nw -s ns [--no-preload] python script out args...; returns the output."""
    os.makedirs(out, exist_ok=True)
    # its own scheduler port: the default (first free from 9091, as launch.py) races with other jobs
    cmd = [str(RUN)] + ([] if dshim else ["--no-preload"]) + ["--master-port", str(free_port()),
                                                           "-n", str(nw), "-s", str(ns),
                                                           str(PY), str(SCRIPTS / script), str(out)]
    cmd += [str(a) for a in args]
    extra = {"DSHIM_PS_COUNTERS": "1"}
    extra.update(env or {})
    p = subprocess.run(cmd, env=clean_env(extra), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=timeout, text=True)
    assert p.returncode == 0, "job failed (%d):\n%s" % (p.returncode, p.stdout[-6000:])
    if dshim:
        # dshim's servers carried the traffic
        assert "[dshim-ps server 0] carried" in p.stdout, p.stdout[-3000:]
    else:
        assert "dshim-ps" not in p.stdout, p.stdout[-3000:]
    return p.stdout


class ByHand:
    """The seed recipe: every role started by hand with the DMLC_* variables."""

    def __init__(self, script, out, *args, dshim=True, nw=2, ns=2, env=None, task_ids=False):
        """task_ids: DMLC_TASK_ID as dshim-run sets it (servers 0..ns-1, then the workers), so that
        process "worker1" has rank 1; without, ranks follow the order of arrival."""
        os.makedirs(out, exist_ok=True)
        self.out = Path(out)
        port = free_port()
        base = {"DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": str(port),
                "DMLC_NUM_WORKER": str(nw), "DMLC_NUM_SERVER": str(ns), "DSHIM_PS_COUNTERS": "1"}
        if dshim:
            base["LD_PRELOAD"] = str(LIB)
        base.update(env or {})
        cmd = [str(PY), str(SCRIPTS / script), str(out)] + [str(a) for a in args]
        self.procs = {}
        roles = [("scheduler", 0)] + [("server", i) for i in range(ns)] + [("worker", i) for i in range(nw)]
        for role, i in roles:
            name = role if role == "scheduler" else "%s%d" % (role, i)
            log = open(self.out / ("%s.log" % name), "w")
            e = clean_env(dict(base, DMLC_ROLE=role))
            if task_ids and role != "scheduler":
                e["DMLC_TASK_ID"] = str(i if role == "server" else ns + i)
            self.procs[name] = subprocess.Popen(cmd, env=e, stdout=log, stderr=subprocess.STDOUT,
                                                start_new_session=True)
            log.close()

    def wait(self, timeout=120):
        deadline = time.time() + timeout
        codes = {}
        for name, p in self.procs.items():
            try:
                codes[name] = p.wait(max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                codes[name] = None
        return codes

    def log(self, name):
        return (self.out / ("%s.log" % name)).read_text(errors="replace")

    def logs(self):
        return "\n".join("== %s\n%s" % (n, self.log(n)[-2500:]) for n in self.procs)

    def kill_all(self):
        for p in self.procs.values():
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()


def load_params(out, nw=2):
    return [dict(np.load(os.path.join(out, "params_rank%d.npz" % r))) for r in range(nw)]


def assert_params_equal(a_dir, b_dir, nw=2, bitwise=False):
    a, b = load_params(a_dir, nw), load_params(b_dir, nw)
    for r in range(nw):
        assert sorted(a[r]) == sorted(b[r])
        for k in a[r]:
            if bitwise:
                assert np.array_equal(a[r][k], b[r][k]), (r, k, np.abs(a[r][k] - b[r][k]).max())
            else:
                # float32 rounding: a sum of two addends is exact, so this is tight
                np.testing.assert_allclose(a[r][k], b[r][k], rtol=1e-6, atol=1e-7, err_msg="rank %d %s" % (r, k))
    # every worker holds the same model
    for r in range(1, nw):
        for k in a[0]:
            assert np.array_equal(a[0][k], a[r][k]), (r, k)

"""A server stopped (SIGSTOP, alive) in the middle of a job: the step that needed it must not hand
the script a stale value.  Whatever the call (kv.pushpull inside MXNet's engine or waiting,
kv.push + kv.pull, with and without 2-bit compression, kv.row_sparse_pull) and the kvstore type,
the first read of the result (or the call itself) raises MXNetError naming the server, its host
and "did not answer within DSHIM_TIMEOUT s".  Scheduler, 2 servers and 2 workers by hand
(mxjob.ByHand, ranks fixed by DMLC_TASK_ID); every key is split over both servers
(MXNET_KVSTORE_BIGARRAY_BOUND=16); server 1 is stopped after step 1 (scripts/stale_read.py)."""
import os
import signal
import socket
import time

import pytest

from mxjob import LIB, PY, ByHand

pytestmark = pytest.mark.timeout(240)

if not PY.exists() or not LIB.exists():
    pytest.skip("needs .venv-mxnet (make setup) and a build", allow_module_level=True)

TIMEOUT = 3

CASES = [
    # (kvtype, api, extra script args, extra env)
    ("dist_sync", "pushpull", [], {}),
    ("dist_sync", "pushpull", ["--big"], {}),
    ("dist_sync", "pushpull", [], {"DSHIM_MXNET_ASYNC": "0"}),
    ("dist_sync", "push", [], {}),
    ("dist_sync", "push", ["--twobit"], {}),
    ("dist_sync", "rows", [], {}),
    ("dist_async", "pushpull", [], {}),
    ("dist_async", "push", ["--twobit"], {}),
    ("dist_async", "rows", [], {}),
]


def _wait(pred, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return pred()


@pytest.mark.parametrize("kvtype,api,args,env", CASES,
                         ids=["%s-%s%s%s" % (c[0], c[1], "".join(c[2]).replace("--", "-"),
                                              "-wait" if c[3] else "") for c in CASES])
def test_stopped_server_never_gives_a_stale_value(tmp_path, kvtype, api, args, env):
    e = {"DSHIM_TIMEOUT": str(TIMEOUT), "MXNET_KVSTORE_BIGARRAY_BOUND": "16"}
    e.update(env)
    job = ByHand("stale_read.py", tmp_path, "--kvtype", kvtype, "--api", api, *args, env=e, task_ids=True)
    server = job.procs["server1"]
    try:
        steps = [tmp_path / ("step1_rank%d" % r) for r in range(2)]
        ok = _wait(lambda: all(p.exists() for p in steps) or any(p.poll() is not None for p in job.procs.values()),
                   120)
        assert ok and all(p.exists() for p in steps), job.logs()
        for p in steps:
            assert p.read_text().startswith("value "), (p.read_text(), job.logs())
        os.kill(server.pid, signal.SIGSTOP)
        (tmp_path / "go").write_text("")
        results = [tmp_path / ("result_rank%d" % r) for r in range(2)]
        assert _wait(lambda: all(p.exists() for p in results), 60), job.logs()
        assert server.poll() is None  # stopped, never ended
        for r, p in enumerate(results):
            text = p.read_text()
            # never a value: the output was filled with -7 and the server never answered
            assert text.startswith("raised at "), ("worker %d read a stale value" % r, text, job.logs())
            assert "server 1 (pid %d on host %s)" % (server.pid, socket.gethostname()) in text, (text, job.logs())
            assert "did not answer within %d s" % TIMEOUT in text, (text, job.logs())
            assert "went away" not in text and "died" not in text, (text, job.logs())
    finally:
        if server.poll() is None:
            os.kill(server.pid, signal.SIGCONT)
        job.kill_all()


def test_stopped_worker_is_blamed_not_the_one_in_the_final_barrier(tmp_path):
    """dist_async, worker 1 stops itself (SIGSTOP) at step 3: worker 0 runs to its end and waits in
    the final barrier.  The scheduler times the barrier out and names worker 1 to everyone; worker
    0 ends with an error (not 0), and no process is told that worker 0 died."""
    job = ByHand("stall_push.py", tmp_path, "--mode", "stop", "--api", "push", "--kvtype", "dist_async",
                 env={"DSHIM_TIMEOUT": str(TIMEOUT)}, task_ids=True)
    try:
        others = ("scheduler", "server0", "server1", "worker0")
        assert _wait(lambda: all(job.procs[n].poll() is not None for n in others), 90), job.logs()
        assert job.procs["worker1"].poll() is None  # stopped, never ended
        w1 = job.procs["worker1"].pid
        assert job.procs["worker0"].returncode != 0, job.logs()
        for n in others:
            log = job.log(n)
            assert "worker 1 (pid %d on host %s) did not reach barrier" % (w1, socket.gethostname()) in log, \
                (n, job.logs())
            assert "worker 0 closed its connection" not in log and "worker 0 (pid" not in log, (n, job.logs())
    finally:
        job.kill_all()


def test_shape_mismatch_is_named_to_everyone(tmp_path):
    """Workers push key 0 with shapes (4, 3) and (5, 3): every process is told that worker 1 pushed
    15 elements where the key holds 12, not that a worker died."""
    job = ByHand("shape_mismatch.py", tmp_path, env={"DSHIM_TIMEOUT": str(TIMEOUT)}, task_ids=True)
    try:
        codes = job.wait(60)
    finally:
        job.kill_all()
    assert all(c not in (0, None) for c in codes.values()), (codes, job.logs())
    for n in job.procs:
        log = job.log(n)
        assert "worker 1 pushed 15 elements of dtype 0 but the key holds 12" in log, (n, job.logs())
        assert " died" not in log, (n, job.logs())

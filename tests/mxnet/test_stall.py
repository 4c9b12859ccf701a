"""A worker that stops pushing: the parameter server names the worker, the key, the
round and the server, in its stall warnings, in its timeout, in every worker's error, and in
the flight recorder's dumps (a "ps/server.R" ring entry waiting for that worker); a worker that
skips a barrier: the scheduler names it (its warning, its "ps/scheduler" ring).  Under dshim-run,
the launcher's one-screen diagnosis reads those rings (test_diagnosis_under_dshim_run).

Scheduler, 2 servers and 2 workers by hand (tests/mxnet/mxjob.py ByHand); worker 1 stops before
its push of key 3 at step 3 (round 4; key 3 lives on server 1, as does key 1, the last key
worker 1 pushed there).  DSHIM_TIMEOUT=6 s, DSHIM_STALL_WARN=2 s.  Without the recorder's
server-side rounds these jobs hang (the pushpull waits in MXNet's engine with no timeout)."""
import glob
import json
import os
import re
import signal
import subprocess
import time

import pytest

from mxjob import LIB, PY, RUN, SCRIPTS, ByHand, clean_env, free_port

pytestmark = pytest.mark.timeout(240)

if not PY.exists() or not LIB.exists():
    pytest.skip("needs .venv-mxnet (make setup) and a build", allow_module_level=True)

STORY = re.compile(r"server 1 \(host [^)]+\) waits for key 3 round 4 from worker 1 \(pushed by worker 0\); "
                   r"worker 1 last pushed key 1 round 4 to it [0-9.]+ s ago")


def env_for(trace_dir):
    return {"DSHIM_TIMEOUT": "6", "DSHIM_STALL_WARN": "2", "DSHIM_TRACE_DIR": str(trace_dir)}


def dumps(trace_dir):
    """{ring name: [entries]} and the processes' header lines, over every dump file."""
    rings, heads = {}, []
    for path in sorted(glob.glob(os.path.join(str(trace_dir), "dshim-trace.*.jsonl"))):
        with open(path) as f:
            lines = [json.loads(line) for line in f if line.strip()]
        heads.append(lines[0])
        for rec in lines[1:]:
            if "id" in rec:
                rings.setdefault(rec["ring"], []).append(rec)
    return rings, heads


def wait_until(pred, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(0.2)
    return pred()


def check_server_side(job, trace_dir):
    log = job.log("server1")
    # the warning before the timeout, then the timeout: the same story
    assert re.search(r"\[dshim-ps server 1\] stall: " + STORY.pattern, log), job.logs()
    assert re.search(r"\[dshim-ps server 1\] timeout: " + STORY.pattern + r"; no push of key 3 for [0-9.]+ s "
                     r"\(DSHIM_TIMEOUT=6 s\)", log), job.logs()
    rings, heads = dumps(trace_dir)
    assert "ps/server.1" in rings, (sorted(rings), job.logs())
    waiting = [e for e in rings["ps/server.1"] if e["state"] == "waiting"]
    assert len(waiting) == 1, rings["ps/server.1"][-6:]
    e = waiting[0]
    assert (e["op"], e["label"], e["seq"], e["waiting_for"]) == ("push", "MXNet push key 3", 4, [1]), e
    assert e["count"] == 12 and e["dtype"] == "float32", e
    # the rounds before it completed; the init is round 0
    done = {(x["label"], x["seq"]) for x in rings["ps/server.1"] if x["state"] == "done"}
    assert ("MXNet push key 3", 3) in done and ("MXNet push key 1", 4) in done, sorted(done)
    assert ("MXNet init key 3", 0) in done, sorted(done)
    timeout_heads = [h for h in heads if h["reason"] == "timeout" and "waits for key 3 round 4" in h["why"]]
    assert timeout_heads, heads
    return rings


def check_worker0(job, rings):
    log = job.log("worker0")
    assert "MXNetError" in log and STORY.search(log), job.logs()
    # worker 0's own ring: its request to server 1 for key 3, round 4, left waiting for server 1
    mine = [e for e in rings.get("ps/worker.0", []) if e["label"].endswith(" key 3") and e["seq"] == 4]
    assert mine, (sorted(rings), job.logs())
    assert mine[-1]["peer"] == 1 and mine[-1]["state"] in ("waiting", "failed"), mine
    if mine[-1]["state"] == "waiting":
        assert mine[-1]["waiting_for"] == [1], mine


def test_worker_stops_pushing_pushpull(tmp_path):
    """kv.pushpull (MXNet's engine, as Gluon's Trainer): worker 1 sleeps instead of pushing."""
    trace = tmp_path / "trace"
    job = ByHand("stall_push.py", tmp_path, "--mode", "sleep", "--api", "pushpull", env=env_for(trace),
                 task_ids=True)
    try:
        codes = job.wait(90)
    finally:
        job.kill_all()
    # every process ended, with an error (worker 1: the scheduler's notice of server 1's end)
    assert all(c not in (0, None) for c in codes.values()), (codes, job.logs())
    rings = check_server_side(job, trace)
    check_worker0(job, rings)
    assert rings["ps/worker.0"][-1]["label"] in ("MXNet pushpull key 3",), rings["ps/worker.0"][-3:]
    # worker 1 was told too: it is the one that did not push
    assert STORY.search(job.log("worker1")), job.logs()
    # worker 1's ring: its last push to server 1 was key 1 round 4, done; nothing for key 3 round 4
    w1 = rings.get("ps/worker.1", [])
    assert any(e["label"] == "MXNet pushpull key 1" and e["seq"] == 4 and e["peer"] == 1 and e["state"] == "done"
               for e in w1), w1[-8:]
    assert not any(e["label"] == "MXNet pushpull key 3" and e["seq"] == 4 for e in w1), w1[-8:]


def test_sigstopped_worker_push_pull(tmp_path):
    """kv.push + kv.pull (the synchronous path): worker 1 stops itself with SIGSTOP."""
    trace = tmp_path / "trace"
    job = ByHand("stall_push.py", tmp_path, "--mode", "stop", "--api", "push", env=env_for(trace),
                 task_ids=True)
    try:
        ended = wait_until(lambda: all(job.procs[n].poll() is not None for n in ("worker0", "server1")), 90)
        assert ended, ({n: p.poll() for n, p in job.procs.items()}, job.logs())
        assert job.procs["worker1"].poll() is None  # stopped, not ended
        os.kill(job.procs["worker1"].pid, signal.SIGCONT)  # let it see its error and end
        job.wait(20)
    finally:
        job.kill_all()
    rings = check_server_side(job, trace)
    check_worker0(job, rings)
    assert rings["ps/worker.0"][-1]["label"] in ("MXNet push key 3", "MXNet pull key 3"), rings["ps/worker.0"][-3:]


def test_worker_skips_a_barrier(tmp_path):
    """kv._barrier() (MXKVStoreBarrier) that worker 1 never reaches: the scheduler says who is
    missing, and dumps its "ps/scheduler" ring on DSHIM_TRACE_SIGNAL (what dshim-run sends to
    every process of a job it diagnoses) without ending."""
    trace = tmp_path / "trace"
    env = dict(env_for(trace), DSHIM_TIMEOUT="120", DSHIM_STALL_WARN="1")
    job = ByHand("stall_push.py", tmp_path, "--mode", "barrier", env=env, task_ids=True)
    story = re.compile(r"\[dshim-ps scheduler\] stall: barrier #\d+ over workers waits for worker 1 "
                       r"\(arrived: worker 0\) for [0-9.]+ s")
    try:
        assert wait_until(lambda: story.search(job.log("scheduler")), 90), job.logs()
        os.kill(job.procs["scheduler"].pid, signal.SIGUSR2)
        assert wait_until(lambda: "ps/scheduler" in dumps(trace)[0], 20), job.logs()
        time.sleep(0.5)
        assert job.procs["scheduler"].poll() is None, job.logs()  # the signal only dumped
    finally:
        job.kill_all()
    rings, heads = dumps(trace)
    sched = [h for h in heads if h["pid"] == job.procs["scheduler"].pid]
    assert sched and sched[0]["reason"] in ("signal", "request"), heads
    waiting = [e for e in rings["ps/scheduler"] if e["state"] == "waiting"]
    assert waiting and waiting[-1]["label"] == "MXNet barrier (workers)" and waiting[-1]["waiting_for"] == [1], \
        rings["ps/scheduler"][-4:]


def test_diagnosis_under_dshim_run(tmp_path):
    """dshim-run -n 2 -s 2 --launcher local python stall_push.py OUT (worker 1 sleeps before its
    push of key 3 at step 3): server 1's timeout ends the job, and dshim-run's diagnosis (docs/
    launcher.md "Diagnosis and live status") reads the "ps/" rings as the parameter server's, not
    as communicators: server 1 waits for key 3 round 4 from worker 1, and what worker 1 did last.
    `dshim-run --diagnose DIR` says the same offline."""
    out = tmp_path / "out"
    out.mkdir()
    env = clean_env({"DSHIM_TIMEOUT": "6",
                     "PATH": "%s:%s" % (PY.parent, os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"))})
    cmd = [str(RUN), "--master-port", str(free_port()), "-n", "2", "-s", "2", "--launcher", "local",
           "python", str(SCRIPTS / "stall_push.py"), str(out)]
    p = subprocess.Popen(cmd, cwd=str(tmp_path), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
    try:
        so, se = p.communicate(timeout=150)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGTERM)  # dshim-run stops its job
        try:
            so, se = p.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            so, se = p.communicate()
        raise AssertionError("dshim-run did not end:\n" + se[-6000:])
    log = "rc=%s\nstdout:\n%s\nstderr:\n%s" % (p.returncode, so[-4000:], se[-8000:])
    assert p.returncode not in (0, None), log
    err = se.splitlines()
    head = [i for i, ln in enumerate(err) if "dshim-run: diagnosis from the flight recorder" in ln]
    assert head, log
    lines = []
    for ln in err[head[0] + 1:]:
        if not ln.startswith("dshim-run:   "):
            break
        lines.append(ln[len("dshim-run:   "):])
    text = "\n".join(lines)
    assert 2 <= len(lines) <= 10, log
    w1 = int((out / "pid_worker1").read_text())
    server = re.compile(r"^server 1 \(host \S+, pid \d+\) waits for key 3 round 4 from worker 1 \(pushed by "
                        r"worker 0\) for [0-9.]+ m?s$", re.M)
    assert server.search(text), log
    assert re.search(r"^worker 1 \(host \S+, pid %d\) last pushed key 1 round 4 to server 1 [0-9.]+ m?s ago; it has "
                     r"made no request since its pushpull key 2 round 4 to server 0, which ended [0-9.]+ m?s ago$" % w1,
                     text, re.M), log
    assert re.search(r"^first error: server 1 \(host \S+, timeout\): no push of key 3 for [0-9.]+ s "
                     r"\(DSHIM_TIMEOUT=6 s\)", text, re.M), log
    # no ring read as a communicator ("rank 0 left no dump", "[MXNet server 1 of 2 ...]")
    assert "rank " not in text and "[MXNet" not in text, log
    # offline, from the directory the header names
    m = re.search(r"\(dumps in (\S+);", err[head[0]])
    assert m and os.path.isdir(m.group(1)), log
    off = subprocess.run([str(RUN), "--diagnose", m.group(1)], capture_output=True, text=True, timeout=30)
    assert off.returncode == 0 and server.search(off.stdout), off.stdout + off.stderr

"""The unmodified DDP example and FSDP over dshim, and what bad input does.

- examples/ddp_train.py --steps 50 on 2 and 4 processes, all started by dshim-run:
  (a) --backend gloo with --no-preload: torch's own gloo, the reference (dshim-run --no-preload sets
      exactly torchrun's variables and loads nothing of dshim's);
  (b) --backend dshim with --no-preload: the plugin, registered by the torch.backends entry point;
  (c) --backend gloo under dshim-run's preload: the takeover carries it over dshim.
  The final parameters of (b) and (c) equal (a)'s (tolerance below); (c) prints the takeover line and
  dshim's counters for its default group are non-zero.  DSHIM_TAKEOVER=0 leaves gloo in place.
- FSDP2 (fully_shard) and classic FullyShardedDataParallel on 2 processes over "dshim" equal a
  single-process run on the global batch.
- Bad input: WORLD_SIZE=3 with 2 processes started by hand; a rank raising mid-training under
  dshim-run; all_reduce with different shapes on different ranks.

The script is run through ddp_helper.py `script` (runpy, the file untouched), which prints the default
group's backend and dshim counters just before the script destroys it.  Every process started here
carries a unique marker in its environment; after each run no process with it may be alive (the scan of
/proc is the one tests/launcher/conftest.py uses).  Only our own processes are ever killed.

Env: DSHIM_BUILD_DIR selects the build (default: the checkout's build/).
Run: .venv/bin/python -m pytest -q tests/torch/test_ddp.py
"""
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "common"))
from ports import free_port  # noqa: E402  (tests/common, shared with the other suites)
from jobenv import job_free_env  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
BUILD_DIR = pathlib.Path(os.environ.get("DSHIM_BUILD_DIR", str(REPO / "build")))
LIB = BUILD_DIR / "lib" / "libdshim.so"
DSHIM_RUN = BUILD_DIR / "bin" / "dshim-run"
HELPER = HERE / "ddp_helper.py"
EXAMPLE = REPO / "examples" / "ddp_train.py"
PYTHON = pathlib.Path(sys.executable)

torch = pytest.importorskip("torch")
if not LIB.exists() or not os.access(DSHIM_RUN, os.X_OK):
    pytest.skip(f"{LIB} or {DSHIM_RUN} not built (run make)", allow_module_level=True)

MARKER_VAR = "DSHIM_TEST_MARKER"
# variables of an enclosing job (torchrun, mpirun, srun, dshim-run) would change what the ranks do
_DROP_PREFIXES = ("SLURM_", "SLURMD_", "SRUN_", "OMPI_", "PMI_", "PMIX_", "DSHIM_", "TORCHELASTIC_", "DMLC_")
_DROP_EXACT = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
               "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "LD_PRELOAD",
               "OMP_NUM_THREADS", "TORCH_DISTRIBUTED_DEBUG", "TORCH_NCCL_ASYNC_ERROR_HANDLING"}

TAKEOVER_LINE = re.compile(r"dshim: carrying backend 'gloo' for rank 0/(\d+) over (\S+)")
STATS_LINE = re.compile(r"DSHIM-TEST-STATS rank=(\d+) backend=(\S+) preloaded=(\d) collectives=(-?\d+) "
                        r"bytes_sent=(-?\d+) bytes_received=(-?\d+)")


# ---- processes and the no-leftovers check ----------------------------------------------------

def _read(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def marked_processes(marker):
    """[(pid, cmdline)] of live (non-zombie) processes whose environment or command line has marker."""
    needle = marker.encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        cmdline = _read(f"/proc/{name}/cmdline")
        if needle not in cmdline and needle not in _read(f"/proc/{name}/environ"):
            continue
        stat = _read(f"/proc/{name}/stat").decode(errors="replace")
        if not stat or stat[stat.rfind(")") + 2:][:1] in ("Z", "X"):
            continue
        found.append((int(name), cmdline.replace(b"\0", b" ").decode(errors="replace").strip()))
    return found


def kill_marked(marker):
    left = marked_processes(marker)
    for pid, _ in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return left


@pytest.fixture
def marker():
    m = f"dshim-test-{uuid.uuid4()}"
    yield m
    left = kill_marked(m)   # whatever the outcome, nothing of this test outlives it
    if left:
        sys.stderr.write(f"\ntest_ddp: killed leftovers of {m}: {left}\n")


def assert_no_leftovers(marker, within=3.0):
    deadline = time.monotonic() + within
    while True:
        left = marked_processes(marker)
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    if left:
        kill_marked(marker)
        pytest.fail(f"{len(left)} process(es) survived their job: " + "; ".join(f"pid {p} {c[:160]}" for p, c in left))


def base_env(marker, extra=None):
    env = job_free_env(_DROP_PREFIXES, _DROP_EXACT)
    # python3 on PATH is this interpreter's (the venv: torch and the dshim package): dshim-run runs .py with it
    env["PATH"] = f"{PYTHON.parent}:{env.get('PATH', '/usr/local/bin:/usr/bin:/bin')}"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "python")] + [p for p in [env.get("PYTHONPATH")] if p])
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env[MARKER_VAR] = marker
    if BUILD_DIR.resolve() != (REPO / "build").resolve():
        env["DSHIM_TEST_PRELOAD"] = str(LIB)   # --no-preload runs use this build's library too
    for k, v in (extra or {}).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = str(v)
    return env


def run_job(marker, argv, extra_env=None, timeout=150, cwd=None):
    """Runs argv in its own session; -> (rc, stdout+stderr, seconds).  On timeout the session is
    killed and the test fails with the output."""
    t0 = time.monotonic()
    proc = subprocess.Popen([str(a) for a in argv], env=base_env(marker, extra_env), cwd=cwd,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, text=True, errors="replace")
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stacks = stacks_of(marker)   # where it hangs, before anything is killed
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        out, _ = proc.communicate()
        kill_marked(marker)
        pytest.fail(f"{argv} did not finish within {timeout} s:\n{out[-6000:]}\n{stacks}")
    return proc.returncode, out, time.monotonic() - t0


def stacks_of(marker):
    """Native backtraces of the job's Python processes, by gdb where it is installed (a hang seen once
    in ~50 runs under load, never reproduced by hand: the next one must say where it was)."""
    gdb = shutil.which("gdb")
    if not gdb:
        return "(no gdb: no backtraces)"
    text = []
    for pid, cmd in marked_processes(marker):
        if "python" not in cmd:
            continue
        try:
            r = subprocess.run([gdb, "-p", str(pid), "-batch", "-ex", "thread apply all bt 20"],
                               capture_output=True, text=True, timeout=30)
            frames = [ln for ln in r.stdout.splitlines() if ln.startswith(("#", "Thread"))]
            text.append(f"--- pid {pid} {cmd[:120]}\n" + "\n".join(frames[:200]))
        except (OSError, subprocess.TimeoutExpired) as e:
            text.append(f"--- pid {pid}: gdb failed: {e}")
    return "\n".join(text)


def run_reference(marker, nproc, args, **kw):
    """A job with no dshim in the data path (torch's own gloo, --no-preload).  torch 2.11's gloo
    sometimes aborts at interpreter exit ("terminate called without an active exception", seen once
    under load after the job's last line): that is torch's teardown, not the result, so such a run is
    repeated once, saying so."""
    rc, out, secs = dshim_run(marker, nproc, args, preload=False, **kw)
    if rc != 0 and "terminate called without an active exception" in out and "done: " in out:
        print(f"torch's gloo aborted at exit (exit {rc}); repeating the reference run once")
        kill_marked(marker)
        rc, out, secs = dshim_run(marker, nproc, args, preload=False, **kw)
    return rc, out, secs


def dshim_run(marker, nproc, args, preload=True, extra_env=None, timeout=150, cwd=None):
    argv = [DSHIM_RUN] + ([] if preload else ["--no-preload"]) + ["--master-port", "0", "--nproc-per-node",
                                                                   nproc] + list(args)
    return run_job(marker, argv, extra_env, timeout, cwd)


def stats_of(out):
    """{rank: (backend, preloaded, collectives, bytes_sent, bytes_received)} from the helper's lines."""
    res = {}
    for m in STATS_LINE.finditer(out):
        res[int(m.group(1))] = (m.group(2), int(m.group(3)), int(m.group(4)), int(m.group(5)), int(m.group(6)))
    return res


# ---- 1. the DDP example: gloo, dshim, takeover ------------------------------------------------

def max_diffs(ref, got):
    """(worst max|d| / max|ref| over the tensors, the tensor, worst max|d|) of two state_dicts."""
    worst = (0.0, "", 0.0)
    for k, r in ref.items():
        g = got[k]
        assert g.shape == r.shape and g.dtype == r.dtype, f"{k}: {g.dtype}{tuple(g.shape)} vs {r.dtype}{tuple(r.shape)}"
        if not r.is_floating_point():
            assert torch.equal(g, r), f"{k} (BatchNorm's step counter) differs: {g} vs {r}"
            continue
        d = (g.double() - r.double()).abs().max().item()
        scale = r.double().abs().max().item() or 1.0
        if d / scale >= worst[0]:
            worst = (d / scale, k, d)
    return worst


# The tolerance, per tensor: max|b - a| <= TOL[n] * max|a|.
# With 2 ranks every reduction is one float32 addition of two values, and addition commutes: whatever
# algorithm adds them (gloo's or dshim's), the gradients are bitwise equal, so (b) and (c) must equal (a)
# exactly (measured: 0).  With 4 ranks dshim adds the four contributions in another order than gloo's
# ring, so one step differs in the last bit (measured after 1 step: 1.9e-9 abs, 6e-8 relative norm,
# i.e. 1 ulp), and 50 steps of SGD with momentum 0.9 through BatchNorm amplify that (after 10 steps
# 3e-7 relative, after 50: worst 4.8e-4 relative, in bn1.bias; 2.0e-4 abs in bn2.running_mean).  5e-3 is
# ten times that; a real error (a lost or doubled contribution, a wrong average) moves the loss itself
# and gives differences of order 1 (measured: 27 abs for a different data set).
TOL = {2: 0.0, 4: 5e-3}


# three jobs, each bounded by run_job's 150 s: the test's own bound is theirs, not a tighter guess
@pytest.mark.timeout(3 * 150 + 30)
@pytest.mark.parametrize("nproc", [2, 4])
def test_ddp_example_gloo_dshim_takeover(nproc, marker, tmp_path):
    params, outs, stats = {}, {}, {}
    for mode, backend, preload in (("a", "gloo", False), ("b", "dshim", False), ("c", "gloo", True)):
        p, ckpt = tmp_path / f"{mode}.pt", tmp_path / f"{mode}.ckpt"
        argv = [HELPER, "script", EXAMPLE, "--steps", 50, "--backend", backend, "--save-params", p,
                "--checkpoint", ckpt]
        if backend == "gloo" and not preload:
            rc, out, secs = run_reference(marker, nproc, argv)
        else:
            rc, out, secs = dshim_run(marker, nproc, argv, preload=preload)
        assert rc == 0, f"({mode}) --backend {backend} preload={preload} exited {rc}:\n{out[-6000:]}"
        assert_no_leftovers(marker)
        print(f"({mode}) {nproc} processes --backend {backend} preload={preload}: {secs:.1f} s")
        assert f"done: 50 steps on {nproc} ranks" in out, out[-3000:]
        params[mode] = torch.load(p)
        # the checkpoint of model.module (written before a barrier) is the final model too
        ck = torch.load(ckpt)
        assert all(torch.equal(ck[k], v) for k, v in params[mode].items()), f"({mode}) checkpoint differs"
        outs[mode] = out
        stats[mode] = stats_of(out)
        assert sorted(stats[mode]) == list(range(nproc)), f"({mode}) stats lines missing:\n{out[-3000:]}"

    # (a) is gloo itself; (b) and (c) are dshim, (c) with the preload and through the takeover
    for r, (backend, preloaded, colls, *_rest) in stats["a"].items():
        assert (backend, preloaded, colls) == ("gloo", 0, -1), f"(a) rank {r}: {stats['a'][r]}"
    assert not TAKEOVER_LINE.search(outs["a"]) and not TAKEOVER_LINE.search(outs["b"])
    m = TAKEOVER_LINE.search(outs["c"])
    assert m and m.group(1) == str(nproc), f"(c) no takeover line:\n{outs['c'][-3000:]}"
    assert len(TAKEOVER_LINE.findall(outs["c"])) == 1, "the takeover line is printed once per job (rank 0)"
    # (c) asked for gloo and is told "gloo" (get_backend); dshim's counters show that dshim carried it
    for mode, preload, name in (("b", 0, "dshim"), ("c", 1, "gloo")):
        for r, (backend, preloaded, colls, sent, received) in stats[mode].items():
            assert backend == name and preloaded == preload, f"({mode}) rank {r}: {stats[mode][r]}"
            assert colls > 0 and sent > 0 and received > 0, f"({mode}) rank {r}: dshim carried nothing: {stats[mode][r]}"
    # the same script makes the same collectives whichever way dshim was chosen
    assert [stats["b"][r][2] for r in range(nproc)] == [stats["c"][r][2] for r in range(nproc)], \
        (stats["b"], stats["c"])

    for mode in ("b", "c"):
        rel, name, absd = max_diffs(params["a"], params[mode])
        print(f"{nproc} processes: ({mode}) vs (a): worst max|d|/max|a| {rel:.3e} ({name}, max|d| {absd:.3e}); "
              f"tolerance {TOL[nproc]:g}")
        assert rel <= TOL[nproc], (f"({mode}) differs from gloo's run by {rel:.3e} of {name}'s magnitude "
                                   f"(max abs {absd:.3e}); tolerance {TOL[nproc]:g}")


@pytest.mark.timeout(120)
def test_takeover_off_leaves_gloo(marker):
    """DSHIM_TAKEOVER=0 under dshim-run (libdshim.so preloaded): torch's gloo carries the group."""
    rc, out, _ = dshim_run(marker, 2, [HELPER, "script", EXAMPLE, "--steps", 3, "--backend", "gloo"],
                           extra_env={"DSHIM_TAKEOVER": "0"}, timeout=75)
    assert rc == 0, out[-6000:]
    assert_no_leftovers(marker)
    assert "done: 3 steps on 2 ranks, backend gloo" in out, out[-3000:]
    assert "carrying backend" not in out, out[-3000:]
    st = stats_of(out)
    assert sorted(st) == [0, 1], out[-3000:]
    for r, s in st.items():
        assert s[:3] == ("gloo", 1, -1), f"rank {r}: want gloo with the preload in place, got {s}"


# ---- 2. FSDP ----------------------------------------------------------------------------------

@pytest.mark.timeout(150)
def test_fsdp(marker):
    """fully_shard (FSDP2, uneven shards) and FullyShardedDataParallel over "dshim" on 2 processes equal
    one process trained on the global batch (rtol 1e-5, atol 1e-6; measured 1.5e-8 abs), and their
    collectives went through dshim."""
    rc, out, secs = dshim_run(marker, 2, [HELPER, "fsdp"], preload=False)
    print(out[-2000:])
    assert rc == 0, out[-6000:]
    assert_no_leftovers(marker)
    for what in ("fully_shard", "FullyShardedDataParallel"):
        assert re.search(rf"OK {what}: max abs difference", out), out[-3000:]
    assert "rank 0: 0 failures" in out and "rank 1: 0 failures" in out, out[-3000:]


# ---- 3. bad input -----------------------------------------------------------------------------

@pytest.mark.timeout(90)
def test_wrong_world_size(marker):
    """WORLD_SIZE=3, ranks 0 and 1 started by hand, timeout 10 s: each gets an error, no hang."""
    port = free_port()
    procs = []
    t0 = time.monotonic()
    for r in range(2):
        env = base_env(marker, {"RANK": r, "WORLD_SIZE": 3, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                                "LOCAL_RANK": r})
        procs.append(subprocess.Popen([str(PYTHON), str(HELPER), "wrong_world"], env=env, stdin=subprocess.DEVNULL,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"))
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=max(1.0, 60 - (time.monotonic() - t0)))[0])
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail("init_process_group with a rank missing hung past 60 s (timeout=10 s)")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert_no_leftovers(marker)
    errors = {}
    for r, (p, out) in enumerate(zip(procs, outs)):
        m = re.search(r"init error after ([\d.]+) s: (.*)", out)
        assert p.returncode == 3 and m, f"rank {r} exited {p.returncode} without the init error:\n{out[-3000:]}"
        print(f"rank {r}: {m.group(0)[:400]}")
        assert float(m.group(1)) < 15, f"rank {r} waited {m.group(1)} s for a 10 s timeout"
        errors[r] = m.group(2)
    # rank 0 hosts torch's TCPStore, which waits for WORLD_SIZE - 1 clients before any backend runs:
    # its error is torch's own and names the count, not the rank ("2/3 clients joined")
    assert "2/3 clients joined" in errors[0], errors[0]
    # rank 1 got past the TCPStore into dshim's rendezvous, which names who never arrived:
    # rank 2 (never started) and rank 0 (stuck in torch's TCPStore, above)
    assert re.search(r"rank\(s\) 0, 2 of 3 never joined", errors[1]), errors[1]


@pytest.mark.timeout(60)
def test_rendezvous_store_gone():
    """Rank 0 (the torch store's host) exits while rank 1 waits in dshim's rendezvous: rank 1 fails at once,
    names rank 0's store as gone and still the ranks missing from its last look (not "unknown")."""
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
    host = subprocess.Popen([str(PYTHON), "-c", textwrap.dedent(f"""
        import datetime, time, torch.distributed as dist
        from dshim import _comm
        s = dist.TCPStore("127.0.0.1", {port}, 3, True, datetime.timedelta(seconds=30), wait_for_workers=False)
        print("up", flush=True)
        # exit (the store with it) once rank 1 is inside the rendezvous, however slowly it started
        s.wait([_comm._Group.of(s, 1, 3).joined_key(1)], datetime.timedelta(seconds=30))
        time.sleep(1)
        """)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert host.stdout.readline().strip() == "up"
        code = textwrap.dedent(f"""
            import datetime, time, torch.distributed as dist
            from dshim import _comm
            s = dist.TCPStore("127.0.0.1", {port}, 3, False, datetime.timedelta(seconds=30))
            t0 = time.monotonic()
            try:
                _comm._rendezvous(s, 1, 3, timeout_s=20)
            except RuntimeError as e:
                print(f"after {{time.monotonic() - t0:.1f}} s: {{e}}")
            """)
        out = subprocess.run([str(PYTHON), "-c", code], env=env, capture_output=True, text=True, timeout=40)
    finally:
        host.kill()
        host.wait()
    m = re.search(r"after ([\d.]+) s: (.*)", out.stdout)
    assert m, out.stdout + out.stderr[-3000:]
    assert float(m.group(1)) < 10, m.group(0)   # not the 20 s timeout
    assert re.search(r"rank\(s\) 0, 2 of 3 never joined", m.group(2)), m.group(2)
    assert "went away" in m.group(2), m.group(2)


@pytest.mark.timeout(120)
def test_rank_raises_mid_training(marker):
    """Rank 1 raises in its 20th optimizer step (of 50): the other ranks fail at once in their next
    collective with an error naming rank 1, dshim-run ends the job with exit 1, nothing survives.

    dshim-run names the first process that exited.  That is nearly always rank 1, but the others fail
    within about 0.1 s of it and one of them can finish exiting first (seen about once in 20 runs with
    the two cores busy): then the rank it names must itself have printed the error naming rank 1."""
    rc, out, secs = dshim_run(marker, 4, [HELPER, "script", EXAMPLE, "--steps", 50, "--backend", "gloo"],
                              extra_env={"DSHIM_TEST_RAISE_AT": "1:20"}, timeout=90)
    assert_no_leftovers(marker)
    print(f"rank 1 raised: dshim-run exited {rc} after {secs:.1f} s")
    assert rc == 1, f"dshim-run exited {rc}, want 1 (rank 1's exit code):\n{out[-6000:]}"
    assert "injected failure: rank 1 raises in optimizer step 20" in out, out[-6000:]
    m = re.search(r"dshim-run: rank (\d+) on host \S+ \(pid \d+\) exited with code 1; stopping the job", out)
    assert m, out[-6000:]
    named = int(m.group(1))
    if named != 1:
        print(f"dshim-run named rank {named}, which exited before rank 1")
        assert re.search(rf"\[rank {named}\] .*RuntimeError: dshim: rank {named} .*rank 1 \(host [^,]+, pid \d+\) closed its connection",
                         out), f"dshim-run named rank {named}, whose output does not blame rank 1:\n{out[-6000:]}"
    assert "dshim-run: job failed with exit code 1" in out, out[-3000:]
    assert "done: 50 steps" not in out, out[-3000:]
    assert secs < 60, f"the job took {secs:.1f} s to end"


@pytest.mark.timeout(90)
def test_mismatched_shapes(marker):
    """all_reduce of 10 elements on rank 0 and 12 on ranks 1 and 2: every rank gets a RuntimeError
    saying the collectives mismatch, at once (no timeout involved; the group's is 60 s)."""
    rc, out, secs = dshim_run(marker, 3, [HELPER, "mismatch"], timeout=60)
    assert_no_leftovers(marker)
    for r in range(3):
        m = re.search(rf"\[rank {r}\] mismatch error after ([\d.]+) s: RuntimeError: (.*)", out)
        assert m, f"rank {r} printed no mismatch error:\n{out[-6000:]}"
        assert float(m.group(1)) < 10, m.group(0)
        assert "mismatched collectives" in m.group(2) and ("10 x float32" in m.group(2)
                                                          and "12 x float32" in m.group(2)), m.group(0)
    assert rc == 0, f"dshim-run exited {rc}, want 0 (every rank caught its error):\n{out[-3000:]}"

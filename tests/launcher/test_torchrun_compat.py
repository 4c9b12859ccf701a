"""dshim-run as a drop-in torchrun (issue 39): uneven nodes, the flags torchrun and launch.py users
type, a fast and loud start-up.  Each behaviour is compared with torch's own torchrun (.venv) where
torchrun has it.

Run: .venv/bin/python -m pytest -q -p no:cacheprovider tests/launcher/test_torchrun_compat.py
(ctest: launcher.torchrun_compat).  Fixtures are in conftest.py.
"""
import json
import os
import pathlib
import re
import signal
import subprocess
import time

import pytest

from conftest import VENV_BIN, free_port
from test_local import ENVDUMP_SCRIPT, PROBE_SCRIPT, check_usage_error, compare_env, describe

pytestmark = pytest.mark.timeout(60)

# Prints a line on stdout and one on stderr, tagged with the rank.
PRINT_SCRIPT = """
import os, sys
r = os.environ["RANK"]
print("out from " + r, flush=True)
print("err from " + r, file=sys.stderr, flush=True)
"""

# A real allreduce over dshim's torch backend: every rank prints the sum of RANK+1 over the world.
ALLREDUCE_SCRIPT = """
import torch, torch.distributed as dist
import dshim  # noqa: F401  (the backend's registration without relying on autoload)
dist.init_process_group("dshim")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print("AR %d %d %g %s" % (dist.get_rank(), dist.get_world_size(), t.item(), dist.get_backend()), flush=True)
dist.barrier()
dist.destroy_process_group()
"""


def start_nodes(exe, nodes, script, args, env, cwd, port):
    """One launcher per (node rank, nproc, extra flags) on loopback; -> list of Popen."""
    procs = []
    for node, nproc, extra in nodes:
        argv = [str(exe), "--nnodes", str(len(nodes)), "--node-rank", str(node), "--master-addr", "127.0.0.1",
                "--master-port", str(port), "--nproc-per-node", str(nproc)] + extra + [str(script)] + args
        procs.append(subprocess.Popen(argv, env=env, cwd=str(cwd), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, start_new_session=True))
    return procs


def finish(procs, timeout):
    """-> [(rc, out, err)]; kills the sessions of whatever is still running."""
    res = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            res.append((p.returncode, out.decode(errors="replace"), err.decode(errors="replace")))
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    return res


# ---- 1. uneven nodes ---------------------------------------------------------

@pytest.mark.timeout(200)
def test_uneven_nodes_env_as_torchrun(dshim_run, env, workdir, write_script, no_leftovers):
    """Node 0 --nproc-per-node 2, node 1 --nproc-per-node 1: torchrun's world of 3, the same environment."""
    script = write_script("envdump.py", ENVDUMP_SCRIPT)
    env = dict(env, TMPDIR=str(workdir))
    results = {}
    port = free_port(consecutive=2)  # the same MASTER_PORT for both (one after the other)
    for name, exe in (("torchrun", VENV_BIN / "torchrun"), ("dshim", dshim_run)):
        d = workdir / name
        d.mkdir()
        res = finish(start_nodes(exe, [(0, 2, []), (1, 1, [])], script, [str(d)], env, workdir, port), 90)
        for rc, out, err in res:
            assert rc == 0, f"{name}: rc={rc}\n{out}\n{err}"
        results[name] = [json.loads((d / f"env.{r}.json").read_text()) for r in range(3)]
    problems = []
    for r in range(3):
        te, de = results["torchrun"][r], results["dshim"][r]
        for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                  "ROLE_RANK", "ROLE_WORLD_SIZE"):
            assert de.get(k) == te.get(k), f"rank {r}: {k} torchrun {te.get(k)} dshim-run {de.get(k)}"
        problems += compare_env(te, de, f"rank {r}")
    assert not problems, "\n".join(problems)
    assert results["dshim"][2]["WORLD_SIZE"] == "3"
    no_leftovers()


@pytest.mark.timeout(200)
def test_uneven_nodes_allreduce(dshim_run, env, workdir, write_script, no_leftovers):
    script = write_script("ar.py", ALLREDUCE_SCRIPT)
    res = finish(start_nodes(dshim_run, [(0, 2, []), (1, 1, [])], script, [], env, workdir,
                             free_port(consecutive=2)), 150)
    lines = []
    for rc, out, err in res:
        assert rc == 0, f"rc={rc}\n{out}\n{err}"
        lines += re.findall(r"AR (\d+) (\d+) (\S+) (\S+)", out)
    assert sorted(lines) == [(str(r), "3", "6", "dshim") for r in range(3)], lines
    no_leftovers()


# Rank 2 (node 1) fails in the first attempt; both nodes restart and meet again for attempt 1.
RESTART_SCRIPT = """
import os, sys, time
r, a = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
print("RS %d %d %s" % (r, a, os.environ["WORLD_SIZE"]), flush=True)
if a == 0 and r == 2:
    sys.exit(3)
time.sleep(2 if a == 0 else 0)
"""


@pytest.mark.timeout(90)
def test_uneven_nodes_restart_meet_again(dshim_run, env, workdir, write_script, no_leftovers):
    script = write_script("rs.py", RESTART_SCRIPT)
    res = finish(start_nodes(dshim_run, [(0, 2, ["--max-restarts", "1"]), (1, 1, ["--max-restarts", "1"])], script,
                             [], env, workdir, free_port(consecutive=2)), 60)
    seen = []
    for rc, out, err in res:
        assert rc == 0, f"rc={rc}\n{out}\n{err}"
        assert "WARN" not in err, err
        seen += re.findall(r"RS (\d) (\d) (\d)", out)
    # attempt 0's ranks 0 and 1 may be stopped before they print; attempt 1 runs all three, world 3
    assert ("2", "0", "3") in seen, seen
    assert sorted(s for s in seen if s[1] == "1") == [("0", "1", "3"), ("1", "1", "3"), ("2", "1", "3")], seen
    no_leftovers()


@pytest.mark.timeout(60)
def test_nodes_disagree_on_nnodes(dshim_run, env, workdir, write_script, no_leftovers):
    """--nnodes 2 on node 0, --nnodes 3 on node 1: refused on both nodes, one line naming each node's value."""
    script = write_script("probe.py", PROBE_SCRIPT)
    port = free_port(consecutive=2)
    procs = []
    for node, nnodes in ((0, 2), (1, 3)):
        argv = [str(dshim_run), "--nnodes", str(nnodes), "--node-rank", str(node), "--master-addr", "127.0.0.1",
                "--master-port", str(port), str(script)]
        procs.append(subprocess.Popen(argv, env=env, cwd=str(workdir), stdin=subprocess.DEVNULL,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True))
    for rc, out, err in finish(procs, 40):
        errs = [ln for ln in err.splitlines() if "error" in ln]
        assert rc == 2, f"rc={rc}\n{out}\n{err}"
        assert len(errs) == 1, err
        assert "disagree on --nnodes" in errs[0] and "node 0 (" in errs[0] and ") 2" in errs[0] \
            and "node 1 (" in errs[0] and ") 3" in errs[0], errs[0]
    assert not (workdir / "probe-ran").exists()
    no_leftovers()


# ---- 3. fast, loud start-up ---------------------------------------------------

@pytest.mark.timeout(60)
def test_missing_node_progress_then_one_line(run, workdir, write_script, no_leftovers):
    """Node 0 alone: a progress line every few seconds naming the missing node, then one error line
    naming the one setting of the start-up wait."""
    script = write_script("probe.py", PROBE_SCRIPT)
    port = free_port(consecutive=2)
    res = run(["--nnodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.1", "--master-port", port,
               "--nproc-per-node", "2", script], env={"DSHIM_CONNECT_TIMEOUT": "12"}, timeout=40)
    assert res.rc == 2, describe(res)
    progress = [ln for ln in res.err.splitlines() if "waiting for node(s) 1" in ln]
    assert 1 <= len(progress) <= 3, describe(res)  # every 5 s, not a storm
    assert all("joined: node 0 (" in ln and "2 procs" in ln for ln in progress), describe(res)
    errs = [ln for ln in res.err.splitlines() if ln.startswith("dshim-run: error: ")]
    assert len(errs) == 1 and "node(s) 1 did not join within 12 s (DSHIM_CONNECT_TIMEOUT)" in errs[0], describe(res)
    assert "DSHIM_TIMEOUT" not in errs[0]
    assert 11 <= res.elapsed < 25, describe(res)
    assert not (workdir / "probe-ran").exists()
    no_leftovers()


@pytest.mark.timeout(60)
def test_node_waits_for_node0_with_progress(run, workdir, write_script, no_leftovers):
    script = write_script("probe.py", PROBE_SCRIPT)
    port = free_port(consecutive=2)
    res = run(["--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1", "--master-port", port,
               "--rdzv-conf", "join_timeout=7", script], timeout=40)
    assert res.rc == 2, describe(res)
    assert re.search(r"node 1: waiting for node 0's dshim-run at 127\.0\.0\.1:\d+ \(\d+ s of 7 s, "
                     r"--rdzv-conf join_timeout\)", res.err), describe(res)
    errs = [ln for ln in res.err.splitlines() if ln.startswith("dshim-run: error: ")]
    assert len(errs) == 1 and "did not answer" in errs[0] and "--rdzv-conf join_timeout" in errs[0], describe(res)
    no_leftovers()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("args,addr,why", [
    ([], "198.51.100.7", "is not an address of this host"),
    (["--nnodes", "2", "--node-rank", "0"], "198.51.100.7", "is not an address of this host"),
    ([], "no-such-host.invalid", "does not resolve")], ids=["one-node", "node-rank-0", "unresolvable"])
def test_master_addr_not_this_host_fails_fast(run, workdir, write_script, no_leftovers, args, addr, why):
    """Rank 0 runs here but --master-addr names another host: one line at once (torch: 30 min of retries)."""
    write_script("probe.py", PROBE_SCRIPT)
    res = run(args + ["--master-addr", addr, "--nproc-per-node", "2", "probe.py"], timeout=20)
    check_usage_error(res, workdir, f"--master-addr {addr} {why}, but rank 0 runs here")
    assert res.elapsed < 5, describe(res)
    no_leftovers()


# ---- 2. the flags users type ---------------------------------------------------

def _files(root):
    """Relative paths of the files under a torchrun/dshim-run log directory, the random part dropped."""
    out = set()
    for p in pathlib.Path(root).rglob("*"):
        if p.is_file():
            rel = p.relative_to(root).parts
            out.add("/".join(("<job>",) + rel[1:]))
    return out


@pytest.mark.timeout(150)
@pytest.mark.parametrize("flags", [["--tee", "3"], ["-t", "2"], ["--redirects", "3"], ["-r", "0:1,1:2"]],
                         ids=["tee3", "t2", "redirects3", "r-per-rank"])
def test_tee_redirects_files_and_console_as_torchrun(run, workdir, write_script, no_leftovers, flags):
    script = write_script("pr.py", PRINT_SCRIPT)
    seen = {}
    for name, exe in (("torchrun", VENV_BIN / "torchrun"), ("dshim", None)):
        logs = workdir / f"logs-{name}"
        res = run(["--nproc-per-node", "2", "--master-port", free_port()] + flags + ["--log-dir", logs, script],
                  exe=exe, timeout=90, env={"TMPDIR": str(workdir)})
        assert res.rc == 0, describe(res)
        files = _files(logs)
        contents = {f: (logs / next(logs.iterdir()).name / f.split("/", 1)[1]).read_text().splitlines()
                    for f in files}
        console = {ln.split("]")[-1].lstrip(":").strip() for ln in (res.out + res.err).splitlines()
                   if " from " in ln}
        seen[name] = (files, contents, console)
    assert seen["dshim"][0] == seen["torchrun"][0], seen
    assert seen["dshim"][1] == seen["torchrun"][1], seen
    assert seen["dshim"][2] == seen["torchrun"][2], seen
    no_leftovers()


@pytest.mark.timeout(150)
def test_local_ranks_filter_console_as_torchrun(run, workdir, write_script, no_leftovers):
    script = write_script("pr.py", PRINT_SCRIPT)
    seen = {}
    for name, exe in (("torchrun", VENV_BIN / "torchrun"), ("dshim", None)):
        res = run(["--nproc-per-node", "3", "--master-port", free_port(), "--local-ranks-filter", "0,2", script],
                  exe=exe, timeout=90, env={"TMPDIR": str(workdir)})
        assert res.rc == 0, describe(res)
        seen[name] = sorted(re.findall(r"(out|err) from (\d)", res.out + res.err))
    assert seen["dshim"] == seen["torchrun"] == [("err", "0"), ("err", "2"), ("out", "0"), ("out", "2")], seen
    no_leftovers()


@pytest.mark.timeout(150)
def test_role_run_path_signals_as_torchrun(run, workdir, write_script, no_leftovers):
    """--role (ROLE_NAME), --run-path (the script runs as __main__ with its arguments), --signals-to-handle."""
    script = write_script("envdump.py", ENVDUMP_SCRIPT)
    got = {}
    for name, exe in (("torchrun", VENV_BIN / "torchrun"), ("dshim", None)):
        d = workdir / name
        d.mkdir()
        res = run(["--nproc-per-node", "2", "--master-port", free_port(), "--role", "trainer", "--run-path",
                   "--signals-to-handle", "SIGTERM,SIGUSR2", "--monitor-interval", "0.5", "--start-method", "fork",
                   "--rdzv-conf", "timeout=60,read_timeout=30", "--logs-specs", "default", str(script), str(d)],
                  exe=exe, timeout=90, env={"TMPDIR": str(workdir)})
        assert res.rc == 0, describe(res)
        got[name] = [json.loads((d / f"env.{r}.json").read_text()) for r in range(2)]
    for r in range(2):
        for k in ("ROLE_NAME", "TORCHELASTIC_SIGNALS_TO_HANDLE", "RANK", "LOCAL_RANK", "WORLD_SIZE"):
            assert got["dshim"][r].get(k) == got["torchrun"][r].get(k), (r, k)
    assert got["dshim"][0]["ROLE_NAME"] == "trainer"
    no_leftovers()


@pytest.mark.timeout(30)
def test_local_addr(run, workdir, write_script, no_leftovers):
    write_script("probe.py", PROBE_SCRIPT)
    res = run(["--local-addr", "127.0.0.1", "--nproc-per-node", "1", "probe.py"], timeout=20)
    assert res.rc == 0, describe(res)
    assert (workdir / "probe-ran").exists()
    (workdir / "probe-ran").unlink()
    res = run(["--local-addr", "198.51.100.7", "probe.py"], timeout=20)
    check_usage_error(res, workdir, "--local-addr 198.51.100.7 is not an address of this host")
    no_leftovers()


# Prints DMLC_ROLE and the variables the test sets with --env*.
MX_ENV_SCRIPT = """
import os
print("MX %s A=%s S=%s W=%s" % (os.environ["DMLC_ROLE"], os.environ.get("ENV_A"), os.environ.get("ENV_S"),
                                os.environ.get("ENV_W")), flush=True)
"""


@pytest.mark.timeout(60)
def test_launch_py_env_flags(run, workdir, write_script, no_leftovers):
    """launch.py's --env VAR:VAL (every process), --env-server and --env-worker (their role only)."""
    script = write_script("mx.py", MX_ENV_SCRIPT)
    res = run(["-n", "1", "-s", "1", "--master-port", "0", "--env", "ENV_A:1", "--env-server", "ENV_S:2",
               "--env-worker", "ENV_W:3", "--p3", "python3", script], timeout=40)
    assert res.rc == 0, describe(res)
    got = sorted(re.findall(r"MX (\w+) A=(\S+) S=(\S+) W=(\S+)", res.out))
    assert got == [("scheduler", "1", "None", "None"), ("server", "1", "2", "None"),
                   ("worker", "1", "None", "3")], describe(res)
    # --env in torchrun style too; a bare name passes this environment's value
    tscript = write_script("t.py", "import os\nprint('T', os.environ.get('ENV_A'), os.environ.get('ENV_B'))\n")
    res = run(["--nproc-per-node", "2", "--master-port", "0", "--env", "ENV_A:x:y", "--env", "ENV_B", tscript],
              env={"ENV_B": "b"}, timeout=40)
    assert res.rc == 0, describe(res)
    assert res.out.count("T x:y b") == 2, describe(res)
    no_leftovers()


BAD_FLAGS = [
    ("tee-bad", ["--tee", "5"], "--tee 5: expected 0"),
    ("redirects-bad", ["-r", "0:9"], "--redirects 0:9"),
    ("ranks-filter-bad", ["--local-ranks-filter", "a,b"], "comma-separated list of integers"),
    ("start-method-bad", ["--start-method", "thread"], "spawn, fork or forkserver"),
    ("monitor-interval-bad", ["--monitor-interval", "x"], "--monitor-interval x"),
    ("rdzv-conf-bad", ["--rdzv-conf", "nokey"], "key=value"),
    ("rdzv-conf-unknown", ["--rdzv-conf", "bogus=1"], "unknown key 'bogus'"),
    ("logs-specs-custom", ["--logs-specs", "mypkg"], "--logs-specs mypkg"),
    ("env-bad", ["-n", "1", "--env", "=x"], "--env =x: expected VARIABLE:VALUE"),
    ("env-server-torch", ["--env-server", "A:1"], "--env-server is a launch.py-style option"),
    ("tee-mxnet", ["-n", "1", "--tee", "3"], "is a torchrun-style option"),
    ("numa-binding", ["--numa-binding", "node"], "does not implement"),
    ("closest-flag", ["--nproc_per_nod", "2"], "did you mean --nproc-per-node?"),
    ("closest-flag-tee", ["--tea", "3"], "did you mean --tee?"),
    ("run-path-relative", ["--run-path"], "absolute path"),
]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("case", BAD_FLAGS, ids=[c[0] for c in BAD_FLAGS])
def test_bad_flag_values(run, workdir, write_script, no_leftovers, case):
    _, args, must_contain = case
    write_script("probe.py", PROBE_SCRIPT)
    res = run(args + ["probe.py"], timeout=20)
    check_usage_error(res, workdir, must_contain)
    no_leftovers()


@pytest.mark.timeout(60)
def test_help_lists_every_torchrun_and_launch_py_flag(run):
    """Every flag of torchrun 2.11's parser (read from torchrun --help) and of MXNet's launch.py is in
    dshim-run --help's table with a status; every flag the table lists is accepted or refused in one line."""
    th = run(["--help"], exe=VENV_BIN / "torchrun", timeout=40)
    assert th.rc == 0
    usage = th.out.split("\n\n")[0]  # the usage synopsis: every flag once, no prose
    torch_flags = {f.replace("_", "-") for f in re.findall(r"(--[a-z][a-z_-]+)", usage)} - {"--help"}
    assert "--local-ranks-filter" in torch_flags and "--nnodes" in torch_flags, usage
    launch_py = {"--num-workers", "--num-servers", "--hostfile", "--sync-dst-dir", "--launcher", "--env-server",
                 "--env-worker", "--env", "--p3"}
    dh = run(["--help"], timeout=20)
    assert dh.rc == 0
    table = dh.out.split("every torchrun 2.11 and launch.py flag")[1]
    listed = {m.group(1): m.group(2) for m in re.finditer(r"^\s+(?:-\w, )?(--[a-z0-9-]+)\s+\S+\s+(\S.*)$", table, re.M)}
    missing = sorted(f for f in torch_flags | launch_py if f not in listed)
    assert not missing, f"not in dshim-run --help's table: {missing}"
    assert all(v.startswith(("yes", "accepted", "refused")) for v in listed.values()), listed

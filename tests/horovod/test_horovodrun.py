"""horovodrun and horovod.runner on dshim (horovod/runner/launch.py, dshim-run --horovod-env).

Unit (no ranks): Horovod's placement (get_host_assignments) on hand-computed cases, -H and hostfile
parsing, flags -> the HOROVOD_* variables and dshim-run's command line, refusals; bad flags from the
command line are one line and exit code 2; dshim-run --dry-run --horovod-env gives every rank Horovod's
identity for hosts of different slots.  Jobs: `horovodrun -np 2 python -c ...` where every rank
reports hvd's identity and its HOROVOD_* variables; three ranks on two "hosts" of 2 and 1 ranks;
horovod.run() returning every rank's result in rank order.
"""
import json
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
PY = REPO / ".venv" / "bin" / "python"
HOROVODRUN = PY.parent / "horovodrun"
BUILD = pathlib.Path(os.environ.get("DSHIM_BUILD_DIR", REPO / "build"))
DSHIM_RUN = BUILD / "bin" / "dshim-run"

sys.path.insert(0, str(REPO / "python"))
import _dshim_horovod_finder  # noqa: E402

_dshim_horovod_finder.load_dshim_horovod()
from horovod.runner import launch  # noqa: E402
from horovod.runner.common.util import hosts  # noqa: E402


def _env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DSHIM_", "HOROVOD_", "OMPI_", "PMI_", "SLURM_"))
           and k not in ("PYTHONPATH", "LD_PRELOAD", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                         "MASTER_PORT")}
    env["PATH"] = f"{PY.parent}:{env.get('PATH', '')}"
    env.update(extra)
    return env


# ---- placement --------------------------------------------------------------------------------------

def _slots(host_string, np):
    return [(s.hostname, s.rank, s.local_rank, s.local_size, s.cross_rank, s.cross_size, s.size)
            for s in hosts.get_host_assignments(hosts.parse_hosts(host_string), np, np)]


def test_placement_fills_hosts_in_order():
    # a:2, b:4, c:1 with 5 ranks: a gets 2, b gets 3, c none
    assert _slots("a:2,b:4,c:1", 5) == [
        ("a", 0, 0, 2, 0, 2, 5), ("a", 1, 1, 2, 0, 2, 5),
        ("b", 2, 0, 3, 1, 2, 5), ("b", 3, 1, 3, 1, 2, 5), ("b", 4, 2, 3, 0, 1, 5)]


def test_placement_cross_ranks_count_hosts_with_that_local_rank():
    assert _slots("a:1,b:2,c:2", 5) == [
        ("a", 0, 0, 1, 0, 3, 5),
        ("b", 1, 0, 2, 1, 3, 5), ("b", 2, 1, 2, 0, 2, 5),
        ("c", 3, 0, 2, 2, 3, 5), ("c", 4, 1, 2, 1, 2, 5)]


def test_placement_refuses_more_ranks_than_slots():
    with pytest.raises(ValueError, match=r"Requested more processes \(4\) than there are available slots \(3\)"):
        hosts.get_host_assignments(hosts.parse_hosts("a:1,b:2"), 4, 4)


def test_host_strings_as_horovod_checks_them():
    assert hosts.parse_hosts_and_slots("worker-0:2,10.0.0.2:4") == (["worker-0", "10.0.0.2"],
                                                                     {"worker-0": 2, "10.0.0.2": 4})
    for bad in ("a", "a:b", "a:1,,b:1", "user@a:1", "a:1;b:1"):
        with pytest.raises(ValueError, match="Invalid host input"):
            hosts.parse_hosts_and_slots(bad)


def test_hostfile(tmp_path):
    f = tmp_path / "hosts"
    f.write_text("# the cluster\nnode1 slots=2\n\nnode-2   slots=4  # big one\n")
    assert hosts.parse_host_files(str(f)) == "node1:2,node-2:4"
    for text in ("node1\n", "node1 slots=x\n", "node1 slots=2 extra\n", "a;b slots=1\n", "# nothing\n"):
        f.write_text(text)
        with pytest.raises(ValueError, match="hostfile"):
            hosts.parse_host_files(str(f))


def test_assign_leaves_out_hosts_without_ranks():
    args = launch.parse_args(["-np", "3", "-H", "a:2,b:2,c:2", "python", "t.py"])
    assert launch.assign(args) == [("a", 2), ("b", 1)]
    args = launch.parse_args(["-np", "2", "python", "t.py"])
    assert launch.assign(args) == [("localhost", 2)]


# ---- flags ------------------------------------------------------------------------------------------

def test_flags_become_horovods_variables():
    args = launch.parse_args([
        "-np", "2", "--fusion-threshold-mb", "32", "--cycle-time-ms", "2.5", "--cache-capacity", "0",
        "--hierarchical-allreduce", "--no-hierarchical-allgather", "--timeline-filename", "/tmp/tl.json",
        "--timeline-mark-cycles", "--no-stall-check", "--stall-check-warning-time-seconds", "9",
        "--log-level", "DEBUG", "--gloo-timeout-seconds", "45", "--tcp", "--start-timeout", "77",
        "--network-interfaces", "eth0,eth1", "--network-interface", "eth2", "--gloo", "--disable-cache",
        "python", "train.py", "--lr", "1"])
    env = launch.job_env(args, {"KEEP": "1"})
    want = {"HOROVOD_FUSION_THRESHOLD": str(32 * 1024 * 1024), "HOROVOD_CYCLE_TIME": "2.5",
            "HOROVOD_CACHE_CAPACITY": "0", "HOROVOD_HIERARCHICAL_ALLREDUCE": "1",
            "HOROVOD_HIERARCHICAL_ALLGATHER": "0", "HOROVOD_TIMELINE": "/tmp/tl.json",
            "HOROVOD_TIMELINE_MARK_CYCLES": "1", "HOROVOD_STALL_CHECK_DISABLE": "1",
            "HOROVOD_STALL_CHECK_TIME_SECONDS": "9", "HOROVOD_LOG_LEVEL": "DEBUG",
            "HOROVOD_GLOO_TIMEOUT_SECONDS": "45", "NCCL_IB_DISABLE": "1", "DSHIM_CONNECT_TIMEOUT": "77",
            "DSHIM_SOCKET_IFNAME": "eth0,eth1,eth2", "HOROVOD_GLOO_IFACE": "eth0",
            "NCCL_SOCKET_IFNAME": "eth0,eth1,eth2", "KEEP": "1"}
    assert {k: env.get(k) for k in want} == want
    assert "HOROVOD_AUTOTUNE" not in env and "HOROVOD_TORUS_ALLREDUCE" not in env
    assert args.command == ["python", "train.py", "--lr", "1"]


def test_dshim_run_command_line(tmp_path):
    args = launch.parse_args(["-np", "5", "-H", "a:2,b:4", "-p", "2222", "--output-filename", "/tmp/out",
                              "python", "-u", "t.py"])
    path = launch.write_hostfile(str(tmp_path), launch.assign(args), args.ssh_port)
    assert pathlib.Path(path).read_text() == "a:2222 slots=2\nb:2222 slots=3\n"
    argv = launch.dshim_run_argv(args, path, args.command)
    assert argv[0].endswith("dshim-run")
    assert argv[1:] == ["--horovod-env", "-H", path, "--no-python", "--log-dir", "/tmp/out", "--", "python", "-u",
                        "t.py"]


# real horovodrun 0.28.1 (measured, docs/horovod.md "Failures"): its usage then the error, exit 2, for an
# unknown flag; a Python traceback and exit 1 for a malformed -H and for --min-np on one host; exit 0,
# doing nothing, for -np 0
@pytest.mark.parametrize("argv,message", [
    ([], "the following arguments are required: -np/--num-proc"),
    (["-np", "x", "true"], "invalid int value"),
    (["-np", "2"], "no command given"),
    (["-np", "2", "--bogus", "true"], "unrecognized arguments: --bogus"),
    (["-np", "2", "-H", "a:1", "--hostfile", "f", "true"], "not allowed with argument"),
    (["-np", "2", "--min-np", "1", "true"], "elastic mode"),
    (["-np", "2", "--host-discovery-script", "d.sh", "true"], "elastic mode"),
    (["-np", "3", "-H", "localhost:1", "true"], "Requested more processes (3) than there are available slots (1)"),
    (["-np", "2", "-H", "a:b", "true"], "Invalid host input"),
    (["-np", "2", "-H", "localhost:2:3", "true"], "Invalid host input"),
    (["-np", "2", "--hostfile", "/nonexistent/hosts", "true"], "cannot read hostfile"),
    (["-np", "2", "--jsrun", "true"], "--jsrun"),
    (["-np", "2", "--mpi-args=--oversubscribe", "true"], "--mpi-args"),
    (["-np", "2", "--config-file", "c.yaml", "true"], "--config-file"),
    (["-np", "0", "true"], "-np 0"),
    (["-np", "2", "--log-level", "LOUD", "true"], "invalid choice"),
])
def test_bad_flags_one_line_exit_2(tmp_path, argv, message):
    if not HOROVODRUN.exists():
        pytest.skip("no .venv/bin/horovodrun: run make setup")
    out = subprocess.run([str(HOROVODRUN)] + argv, env=_env(), capture_output=True, text=True, timeout=120,
                         cwd=tmp_path)
    assert out.returncode == 2, out
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("horovodrun: error: ") and message in lines[0], out.stderr
    assert out.stdout == ""


def test_version_and_check_build(tmp_path):
    if not HOROVODRUN.exists():
        pytest.skip("no .venv/bin/horovodrun: run make setup")
    out = subprocess.run([str(HOROVODRUN), "-v"], env=_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.startswith("0.28.1+dshim."), out
    out = subprocess.run([str(HOROVODRUN), "--check-build"], env=_env(), capture_output=True, text=True,
                         timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out
    text = out.stdout
    assert "Horovod v0.28.1+dshim." in text
    assert "[X] PyTorch" in text and "[ ] TensorFlow" in text
    assert "[ ] MPI" in text and "[X] Gloo" in text


# ---- dshim-run --horovod-env ------------------------------------------------------------------------

def _dry_run(tmp_path, hostfile_text, *extra):
    hf = tmp_path / "hosts"
    hf.write_text(hostfile_text)
    out = subprocess.run([str(DSHIM_RUN), "--dry-run", "--horovod-env", "-H", str(hf), *extra, "--no-python",
                          "/bin/true"], env=_env(), capture_output=True, text=True, timeout=60, cwd=tmp_path)
    return out


def _ranks(dry_run_stdout):
    """{rank: {variable: value}} of the [rank N] lines of dshim-run --dry-run."""
    ranks = {}
    for line in dry_run_stdout.splitlines():
        line = line.strip()
        if line.startswith("[rank "):
            name, rest = line[1:].split("]", 1)
            ranks[int(name.split()[1])] = dict(kv.split("=", 1) for kv in rest.split(" -- ")[0].split())
    return ranks


def test_dshim_run_gives_horovods_identity_for_uneven_hosts(tmp_path):
    if not DSHIM_RUN.exists():
        pytest.skip(f"no {DSHIM_RUN}: run make")
    out = _dry_run(tmp_path, "localhost slots=2\n127.0.0.1 slots=1\n")
    assert out.returncode == 0, out.stderr
    ranks = _ranks(out.stdout)
    got = {r: tuple(v.get(k) for k in ("HOROVOD_HOSTNAME", "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK",
                                          "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE",
                                          "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"))
           for r, v in ranks.items()}
    assert got == {0: ("localhost", "0", "3", "0", "2", "0", "2", "0", "0", "2"),
                   1: ("localhost", "1", "3", "1", "2", "0", "1", "1", "1", "2"),
                   2: ("127.0.0.1", "2", "3", "0", "1", "1", "2", "2", "0", "1")}
    for line in ("HOROVOD_CONTROLLER=gloo", "HOROVOD_CPU_OPERATIONS=gloo", "WORLD_SIZE=3", "DSHIM_HOROVOD=1"):
        assert f"  {line}\n" in out.stdout, out.stdout


def test_dshim_run_refuses_bad_slots(tmp_path):
    if not DSHIM_RUN.exists():
        pytest.skip(f"no {DSHIM_RUN}: run make")
    out = _dry_run(tmp_path, "localhost slots=0\n")
    assert out.returncode == 2 and "slots=0" in out.stderr and len(out.stderr.strip().splitlines()) == 1, out
    out = _dry_run(tmp_path, "localhost slots=2\n127.0.0.1 slots=1\n", "--launcher", "mpi")
    assert out.returncode == 2 and "different slots=N" in out.stderr, out
    # without --horovod-env, slots= still means nothing (the torchrun-style count stays)
    hf = tmp_path / "hosts"
    hf.write_text("localhost slots=3\n")
    out = subprocess.run([str(DSHIM_RUN), "--dry-run", "-H", str(hf), "--no-python", "/bin/true"], env=_env(),
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0 and sorted(_ranks(out.stdout)) == [0], out


# ---- jobs ---------------------------------------------------------------------------------------------

REPORT = r"""
import json, os, horovod, horovod.torch as hvd
hvd.init()
print("REPORT " + json.dumps({
    "dshim": horovod.__dshim__,
    "hvd": [hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size()],
    "env": [os.environ.get(k) for k in ("HOROVOD_HOSTNAME", "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK",
                                         "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE",
                                         "HOROVOD_CONTROLLER", "HOROVOD_CPU_OPERATIONS")],
    "sum": hvd.allreduce(__import__("torch").tensor([hvd.rank() + 1.0]), op=hvd.Sum).item()}), flush=True)
"""


def _reports(stdout):
    return sorted((json.loads(line.split("REPORT ", 1)[1]) for line in stdout.splitlines() if "REPORT " in line),
                  key=lambda r: r["hvd"][0])


def _horovodrun(tmp_path, *argv, timeout=240):
    if not HOROVODRUN.exists():
        pytest.skip("no .venv/bin/horovodrun: run make setup")
    return subprocess.run([str(HOROVODRUN), *argv], env=_env(), capture_output=True, text=True, timeout=timeout,
                          cwd=tmp_path)


def test_two_ranks(tmp_path):
    out = _horovodrun(tmp_path, "-np", "2", "python", "-c", REPORT)
    assert out.returncode == 0, out.stdout + out.stderr
    reports = _reports(out.stdout)
    assert [r["hvd"] for r in reports] == [[0, 2, 0, 2, 0, 1], [1, 2, 1, 2, 0, 1]], out.stdout
    assert [r["env"] for r in reports] == [["localhost", "0", "2", "0", "2", "0", "1", "gloo", "gloo"],
                                           ["localhost", "1", "2", "1", "2", "0", "1", "gloo", "gloo"]]
    assert all(r["dshim"] is True and r["sum"] == 3.0 for r in reports), reports


def test_three_ranks_on_hosts_of_two_and_one(tmp_path):
    out = _horovodrun(tmp_path, "-np", "3", "-H", "localhost:2,127.0.0.1:4", "python", "-c", REPORT)
    assert out.returncode == 0, out.stdout + out.stderr
    reports = _reports(out.stdout)
    assert [r["env"][:7] for r in reports] == [["localhost", "0", "3", "0", "2", "0", "2"],
                                               ["localhost", "1", "3", "1", "2", "0", "1"],
                                               ["127.0.0.1", "2", "3", "0", "1", "1", "2"]], out.stdout
    assert [r["hvd"] for r in reports] == [[0, 3, 0, 2, 0, 2], [1, 3, 1, 2, 0, 1], [2, 3, 0, 1, 1, 2]]
    assert all(r["sum"] == 6.0 for r in reports)


def test_failing_rank_gives_its_exit_code(tmp_path):
    out = _horovodrun(tmp_path, "-np", "2", "python", "-c",
                      "import os, sys; sys.exit(3 if os.environ['HOROVOD_RANK'] == '1' else 0)")
    assert out.returncode == 3, out.stdout + out.stderr


RUN_FUNC = r"""
import json, horovod

def work(base, scale=1):
    import horovod.torch as hvd
    hvd.init()
    return {"rank": hvd.rank(), "size": hvd.size(), "value": (base + hvd.rank()) * scale}

print("RESULT " + json.dumps(horovod.run(work, args=(10,), kwargs={"scale": 2}, np=2)))
"""


def test_horovod_run_returns_results_in_rank_order(tmp_path):
    if not HOROVODRUN.exists():
        pytest.skip("no .venv/bin/horovodrun: run make setup")
    out = subprocess.run([str(PY), "-c", RUN_FUNC], env=_env(), capture_output=True, text=True, timeout=240,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("RESULT "))
    assert json.loads(line[len("RESULT "):]) == [{"rank": 0, "size": 2, "value": 20},
                                                 {"rank": 1, "size": 2, "value": 22}]


def test_horovod_run_raises_when_a_rank_fails(tmp_path):
    if not HOROVODRUN.exists():
        pytest.skip("no .venv/bin/horovodrun: run make setup")
    code = ("import horovod\n"
            "def work():\n    raise KeyError('boom')\n"
            "try:\n    horovod.run(work, np=2)\nexcept RuntimeError as e:\n    print('RAISED', e)\n")
    out = subprocess.run([str(PY), "-c", code], env=_env(), capture_output=True, text=True, timeout=240,
                         cwd=tmp_path)
    assert "RAISED Horovod detected that one or more processes exited with non-zero status" in out.stdout, \
        out.stdout + out.stderr
    assert "User function raise error" in out.stdout + out.stderr

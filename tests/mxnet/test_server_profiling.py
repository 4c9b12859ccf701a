"""MXNet's server profiling (profile_process='server', MXNet 1.9.1's
kSetProfilerParams) under dshim and under ps-lite: the workers' profiler calls,
given dshim's kvstore handle, reach dshim's servers, which configure, run,
pause, stop and dump MXNet's profiler of their own process into
rank<server>_<filename> in their working directory (before this, every worker
crashed: libmxnet cast dshim's handle to its own KVStore).  What a server's
profiler refuses comes back to worker 0 as an MXNetError and the job goes on
(ps-lite's servers drop what their profiler refuses, and a malformed config
aborts them).  Parameters MXNet does not know are refused on the worker, as
MXNet does."""
import json
import os
import subprocess

import pytest

from mxjob import LIB, PY, RUN, SCRIPTS, clean_env, free_port

pytestmark = pytest.mark.timeout(300)

if not PY.exists() or not LIB.exists():
    pytest.skip("needs .venv-mxnet (make setup) and a build", allow_module_level=True)


def _run(tmp_path, dshim, *args):
    """dshim-run -n 2 -s 2 in tmp_path (the servers write their profiles there)."""
    cmd = [str(RUN)] + ([] if dshim else ["--no-preload"]) + ["--master-port", str(free_port()), "-n", "2", "-s", "2", str(PY),
                                                           str(SCRIPTS / "server_profiling.py"), str(tmp_path)]
    p = subprocess.run(cmd + list(args), cwd=tmp_path, env=clean_env({"DSHIM_PS_COUNTERS": "1"}),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=240, text=True)
    assert p.returncode == 0, "job failed (%d):\n%s" % (p.returncode, p.stdout[-6000:])
    assert ("[dshim-ps server 0] carried" in p.stdout) == dshim, p.stdout[-3000:]
    with open(tmp_path / "profiling_rank0.json") as f:
        return json.load(f), p.stdout


def _check_profiles(tmp_path, result):
    names = ["rank0_server_profile.json", "rank1_server_profile.json"]
    # there right after dump(profile_process='server') returned, complete JSON (worker 0 parsed them)
    assert result["files"] == names
    assert sorted(result["events"]) == names
    # the optimizer ran on the server holding the key, inside the profiled window
    assert any("sgd_update" in e for n in names for e in result["events"][n]), result["events"]
    # the workers' own profiles, asked with dshim's handle too, are MXNet's
    assert "MXImperativeInvokeEx" in result["worker_events"], result["worker_events"]
    for r in range(2):
        with open(tmp_path / ("rank%d_worker_profile.json" % r)) as f:
            assert json.load(f)["traceEvents"]


def test_servers_profile_on_command_and_refusals_are_errors(tmp_path):
    result, out = _run(tmp_path, True, "--errors")
    _check_profiles(tmp_path, result)
    errors = result["errors"]
    # MXNet's own check of the parameters, on the worker, as MXNet does it
    assert errors["unknown_parameter"].startswith("MXNetError: Cannot find argument 'profile_bogus'"), errors
    # what the servers refused came back as MXNetError on worker 0, naming a server and the reason
    assert "improper profiler config 'b.json'" in errors["comma_in_value"], errors
    assert "MXNet's profiler refused the dump" in errors["dump_after_finished"], errors
    assert "Profiler hasn't been run" in errors["dump_after_finished"], errors
    for what in ("comma_in_value", "dump_after_finished"):
        assert errors[what].startswith("server "), errors
    # the servers said why on their own output, and served on: every worker ended cleanly
    assert "[dshim-ps server 0] MXNet's profiler refused the dump" in out
    assert "worker 0: done" in out and "worker 1: done" in out


def test_pslite_writes_the_same_profiles(tmp_path):
    """The comparison: MXNet's own ps-lite, same script, no refused commands (a malformed
    config makes ps-lite's server CHECK-fail on its receive thread)."""
    result, _ = _run(tmp_path, False)
    _check_profiles(tmp_path, result)
    assert result["errors"] == {}

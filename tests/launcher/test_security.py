"""dshim-run against another local user (docs/reliability.md "Another local user").

- hostile: a second user (useradd here, userdel after, also on failure) plants directories and
  symbolic links at every path an older dshim-run used in /tmp (/tmp/dshim-run-<pid> for the next
  pids, /tmp/dshim-run-<pid>-mpi-hosts) and in a --log-dir it can write (the rank logs, the
  --timeline file and its temporary names); a real torch job with @record that raises runs with
  --timeline.  The symlink targets (root's files) stay as they were, the job's root cause is
  still named, and nothing the job made is readable by the other user.
- the job token from DSHIM_JOB_TOKEN_FILE for per-node jobs: the same file on both nodes runs,
  different secrets fail with a clear line, a group-readable file is refused (chmod 600).
- a --log-dir that cannot be written names the real cause (Permission denied), not ENOENT.
Root-only parts skip with the reason.
"""
import os
import pathlib
import shutil
import signal
import stat
import subprocess
import uuid

import pytest

from conftest import VENV_BIN, free_port

RAISING_SCRIPT = """
import sys
import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

@record
def main():
    dist.init_process_group("gloo")
    t = torch.ones(4)
    dist.all_reduce(t)
    if dist.get_rank() == 1:
        raise RuntimeError("boom-from-rank-1")
    dist.barrier()

main()
"""

OK_SCRIPT = """
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(2)
dist.all_reduce(t)
assert t[0].item() == dist.get_world_size()
dist.destroy_process_group()
"""

ORIGINAL = "root's file: must stay as it is\n"


@pytest.fixture
def other_user():
    """A second local user for this test only; removed afterwards, also on failure."""
    if os.geteuid() != 0:
        pytest.skip("needs root to add a second local user (useradd)")
    if shutil.which("useradd") is None or shutil.which("setpriv") is None:
        pytest.skip("needs useradd and setpriv")
    name = "dshsec" + uuid.uuid4().hex[:8]
    subprocess.run(["useradd", "-M", "-N", "-s", "/bin/sh", name], check=True, capture_output=True)
    try:
        import pwd
        pw = pwd.getpwnam(name)
        yield pw
    finally:
        subprocess.run(["userdel", name], capture_output=True)


def as_user(pw, argv, **kw):
    return subprocess.run(["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups", "--"]
                          + [str(a) for a in argv], capture_output=True, text=True, **kw)


def readable_by_others(path):
    st = os.lstat(path)
    return not stat.S_ISLNK(st.st_mode) and (st.st_mode & 0o077) != 0


def test_other_user_cannot_redirect_or_read(other_user, run, write_script, workdir, no_leftovers):
    pw = other_user
    script = write_script("raise.py", RAISING_SCRIPT)
    victim = workdir / "victim.txt"  # root's, 0644: what the planted links point at
    victim.write_text(ORIGINAL)
    victim.chmod(0o644)
    os.chmod(workdir, 0o755)  # the other user may reach the victim file's name (links to it must resolve)
    shared = pathlib.Path(f"/tmp/dshsec-shared-{uuid.uuid4().hex[:8]}")  # the other user's, writable by it
    timeline = shared / "timeline.json"
    planted = [shared]
    last = int(pathlib.Path("/proc/sys/kernel/ns_last_pid").read_text())
    pids = range(last + 1, last + 65)
    for p in pids:
        planted += [pathlib.Path(f"/tmp/dshim-run-{p}"), pathlib.Path(f"/tmp/dshim-run-{p}-mpi-hosts")]
    plant = [
        f"mkdir -m 0777 {shared} || exit 1",
        f"ln -s {victim} {shared}/rank0.log",  # a link where a rank's log goes
        f"touch {shared}/rank1.log && chmod 0666 {shared}/rank1.log",  # a file of the other user's
        f"ln -s {victim} {timeline}",
        f"for p in $(seq {pids.start} {pids.stop - 1}); do",
        f"  d=/tmp/dshim-run-$p; mkdir -m 0777 -p $d/attempt_0/0 $d/attempt_0/1 $d/trace_0",
        f"  chmod -R 0777 $d; ln -s {victim} $d/attempt_0/0/error.json; ln -s {victim} $d/attempt_0/1/error.json",
        f"  ln -s {victim} /tmp/dshim-run-$p-mpi-hosts; ln -s {victim} {timeline}.tmp$p",
        "done",
        "exit 0",
    ]
    try:
        r = as_user(pw, ["sh", "-c", "\n".join(plant)], timeout=30)
        assert r.returncode == 0, r.stderr
        res = run(["--nproc-per-node", "2", "--log-dir", shared, "--timeline", timeline,
                   VENV_BIN / "python", script], timeout=90)
        text = res.out + res.err
        assert res.rc != 0, text
        assert "boom-from-rank-1" in text, f"the root cause (torch's error file) is not named:\n{text}"
        assert victim.read_text() == ORIGINAL, f"a planted link was followed: victim overwritten\n{text}"
        # what the job made: the timeline (replacing the planted link, not its target), collected dumps
        assert timeline.exists() and not timeline.is_symlink(), text
        made = []
        for dirpath, dirs, files in os.walk(shared):
            for n in dirs + files:
                p = os.path.join(dirpath, n)
                if os.lstat(p).st_uid == 0:
                    made.append(p)
        assert made, "the job made nothing in --log-dir"
        bad = [p for p in made if readable_by_others(p)]
        assert not bad, f"readable by other users: {[(p, oct(os.lstat(p).st_mode)) for p in bad]}"
        # nothing of the job went into the planted /tmp/dshim-run-<pid> directories
        for p in pids:
            d = pathlib.Path(f"/tmp/dshim-run-{p}")
            for dirpath, dirs, files in os.walk(d):
                for n in dirs + files:
                    assert os.lstat(os.path.join(dirpath, n)).st_uid != 0, f"the job wrote into {d}: {n}"
        # that its own job directory is gone is checked where no other test shares its TMPDIR
        # (test_diagnose.py, test_multihost.sh case 9): tests running beside this one make theirs in /tmp
        no_leftovers()
    finally:
        for p in planted:
            if p.is_symlink() or p.is_file():
                p.unlink()
            elif p.exists():
                shutil.rmtree(p, ignore_errors=True)


def test_read_only_log_dir_names_the_cause(run, workdir, other_user_or_none):
    # in /tmp, so that its parents can be entered by the second user (pytest's own directory is 0700)
    ro = pathlib.Path(f"/tmp/dshsec-ro-{uuid.uuid4().hex[:8]}")
    ro.mkdir()
    try:
        ro.chmod(0o555)
        args = ["--nproc-per-node", "1", "--log-dir", ro / "logs", "--no-python", "/bin/true"]
        if other_user_or_none is None:
            res = run(args, timeout=30)
            rc, text = res.rc, res.out + res.err
        else:
            from conftest import BUILD_DIR
            r = as_user(other_user_or_none, [BUILD_DIR / "bin" / "dshim-run"] + args, timeout=30, cwd="/tmp")
            rc, text = r.returncode, r.stdout + r.stderr
    finally:
        ro.chmod(0o755)
        shutil.rmtree(ro, ignore_errors=True)
    assert rc == 2, text
    assert "cannot write to" in text and "Permission denied" in text, text
    assert "No such file" not in text, text


@pytest.fixture
def other_user_or_none():
    """As root, chmod does not keep root out: the read-only directory is tried by a second user."""
    if os.geteuid() != 0:
        yield None
        return
    if shutil.which("useradd") is None or shutil.which("setpriv") is None:
        pytest.skip("as root a read-only directory needs a second user (useradd, setpriv)")
    name = "dshsec" + uuid.uuid4().hex[:8]
    subprocess.run(["useradd", "-M", "-N", "-s", "/bin/sh", name], check=True, capture_output=True)
    try:
        import pwd
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], capture_output=True)


def per_node_job(dshim_run, env, workdir, script, token_files, timeout=60, wait_for=(0, 1)):
    port = free_port(consecutive=2)  # dshim-run's store goes on port+1 in this mode
    procs = []
    for node, tf in enumerate(token_files):
        argv = [str(dshim_run), "--nnodes", "2", "--node-rank", str(node), "--master-addr", "127.0.0.1",
                "--master-port", str(port), "--nproc-per-node", "1", str(VENV_BIN / "python"), str(script)]
        e = dict(env, DSHIM_JOB_TOKEN_FILE=str(tf))
        procs.append(subprocess.Popen(argv, env=e, cwd=str(workdir), stdin=subprocess.DEVNULL,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      start_new_session=True))
    outs = []
    try:
        for i in wait_for:
            out, _ = procs[i].communicate(timeout=timeout)
            outs.append((procs[i].returncode, out))
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    return outs


def secret(workdir, name, text, mode=0o600):
    p = workdir / name
    p.write_text(text + "\n")
    p.chmod(mode)
    return p


def test_token_file_same_secret_runs(dshim_run, env, workdir, write_script, no_leftovers):
    script = write_script("ok.py", OK_SCRIPT)
    tf = secret(workdir, "token", uuid.uuid4().hex)
    outs = per_node_job(dshim_run, env, workdir, script, [tf, tf])
    for rc, out in outs:
        assert rc == 0, out
    no_leftovers()


def test_token_file_mismatch_fails_clearly(dshim_run, env, workdir, write_script, no_leftovers):
    script = write_script("ok.py", OK_SCRIPT)
    a = secret(workdir, "token-a", uuid.uuid4().hex)
    b = secret(workdir, "token-b", uuid.uuid4().hex)
    # node 1 finds out (node 0's ranks would wait for it as torch does: the test stops node 0)
    outs = per_node_job(dshim_run, env, workdir, script, [a, b], timeout=60, wait_for=(1,))
    rc, text = outs[0]
    assert rc != 0, text
    assert "rejected this process's job token" in text and "DSHIM_JOB_TOKEN_FILE" in text, text
    no_leftovers(within=5.0)


def test_token_file_readable_by_group_is_refused(run, workdir):
    tf = secret(workdir, "token", "s3cret", mode=0o640)
    res = run(["--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1", "--master-port",
               str(free_port(consecutive=2)), "--nproc-per-node", "1", "--no-python", "/bin/true"],
              env={"DSHIM_JOB_TOKEN_FILE": str(tf)}, timeout=30)
    assert res.rc == 2, res.err
    assert "chmod 600" in res.err and str(tf) in res.err, res.err
    lines = [ln for ln in res.err.splitlines() if "DSHIM_JOB_TOKEN_FILE" in ln]
    assert len(lines) == 1, res.err

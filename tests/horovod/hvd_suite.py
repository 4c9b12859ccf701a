"""Horovod 0.28.1's own tests (tests/horovod/upstream, unmodified) on dshim's Horovod layer, run as
upstream runs them, checked against what real Horovod does.

    hvd_suite.py --np 2 test/parallel/test_torch.py        # horovodrun -np 2 -H localhost:2 pytest -v ...
    hvd_suite.py --np 3 test/parallel/test_torch.py
    hvd_suite.py --np 2 test/parallel/test_timeline.py
    hvd_suite.py --standalone test/single/test_torch_elastic.py   # one process, as upstream's single tests
    hvd_suite.py --np 2 test/parallel/test_torch.py -k allgather --keep

Upstream's CI runs a parallel file as `horovodrun -np 2 -H localhost:2 --gloo /bin/bash pytest.sh gloo
test_x.py`, every rank a whole pytest session writing its own junit XML (pytest.sh names it after
$HOROVOD_RANK); the single files run in one plain process.  So do we: `.venv/bin/horovodrun` (dshim's
launcher, dshim-run underneath) starts N ranks of `python -m pytest -v --junit-xml=WORK/junit.$HOROVOD_RANK.xml
FILE` through bash (the path is expanded per rank, nothing in the upstream files changes), in the file's own
directory as upstream's `cd test/parallel`.

A test's outcome is its ranks' together: failed if it failed on any rank, skipped if skipped on all,
passed if passed on all.  expected.txt holds what real Horovod 0.28.1 does with each test (torch 2.11,
CPU, 2 ranks); differences.txt the accepted differences under dshim, each with the text its failure
must contain.  Problems, one line each:
  - a test real Horovod passes does not pass (unless differences.txt accepts its failure);
  - a test real Horovod fails or skips does something else (an expected failure must fail with its
    text: a different failure is a different bug);
  - a test that has no line in expected.txt, or a line whose test no longer exists;
  - a rank that wrote no junit XML (crashed or hung: see the log), the run's time limit.
Prints one summary line, then every problem.  Exit 0 only without problems; 77 without .venv (make
setup: horovodrun, cloudpickle, mock) or the build.
"""
import argparse
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
UPSTREAM = HERE / "upstream"
EXPECTED = HERE / "expected.txt"
DIFFERENCES = HERE / "differences.txt"
SKIP = 77

# variables of an enclosing job or a developer's shell that would change what the ranks do
_DROP_PREFIXES = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "DSHIM_", "TORCHELASTIC_", "HOROVOD_")
_DROP_EXACT = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
               "LD_PRELOAD", "PYTHONPATH"}

# each rank: a whole pytest session of the file, its junit XML named after its rank ($HOROVOD_RANK,
# which horovodrun sets), as upstream's pytest.sh.  pytest's exit code 1 (some tests failed) becomes 0:
# the session is complete and its XML says which, while a rank exiting non-zero makes dshim-run (as
# horovodrun) stop the others, which may not have written theirs yet
RANK_CMD = ('"$0" -m pytest -v -p no:cacheprovider --timeout "$1" --junit-xml="$2/junit.$HOROVOD_RANK.xml" "${@:3}"; '
            'rc=$?; [ $rc = 1 ] && rc=0; exit $rc')


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--np", type=int, choices=range(1, 17), metavar="N", help="ranks (horovodrun -np N)")
    mode.add_argument("--standalone", action="store_true", help="one plain process, as upstream's single tests")
    p.add_argument("file", help="the upstream file, relative to tests/horovod/upstream (test/parallel/test_torch.py)")
    p.add_argument("-k", dest="keyword", help="only the tests pytest -k selects (no check of missing tests)")
    p.add_argument("--python", default=str(REPO / ".venv" / "bin" / "python"))
    p.add_argument("--build-dir", default=os.environ.get("DSHIM_BUILD_DIR", str(REPO / "build")))
    p.add_argument("--timeout", type=int, default=1200, help="seconds for the whole run")
    p.add_argument("--test-timeout", type=int, default=300, help="seconds for one test (pytest-timeout)")
    p.add_argument("--keep", action="store_true", help="keep the work directory (log, junit XML)")
    args = p.parse_args(argv)
    args.path = (UPSTREAM / args.file).resolve()
    if not args.path.is_file() or UPSTREAM not in args.path.parents:
        p.error(f"{args.file}: not a file under {UPSTREAM}")
    args.build_dir = pathlib.Path(args.build_dir).resolve()
    return args


def missing_setup(args):
    """Why this run cannot happen here (77), or None."""
    venv_bin = pathlib.Path(args.python).parent
    if not os.access(args.python, os.X_OK):
        return f"no {args.python}: run make setup"
    if not (args.build_dir / "lib" / "libdshim.so").exists() or not (args.build_dir / "bin" / "dshim-run").exists():
        return f"no {args.build_dir}/lib/libdshim.so or bin/dshim-run: run make"
    if not args.standalone and not os.access(venv_bin / "horovodrun", os.X_OK):
        return f"no {venv_bin}/horovodrun: run make setup (it installs dshim's horovodrun)"
    probe = subprocess.run([args.python, "-c", "import cloudpickle, mock, pytest_timeout"], capture_output=True)
    if probe.returncode != 0:
        return f"{args.python} lacks cloudpickle, mock or pytest-timeout: run make setup"
    return None


# ---- expected.txt / differences.txt ------------------------------------------------------------------

def read_expected():
    """{(file, test): (outcome, text its failure contains)} for every test of the upstream files."""
    rows = {}
    for line in EXPECTED.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            file, test, outcome, *text = line.split(" ", 3)
            rows[(file, test)] = (outcome, text[0] if text else "")
    return rows


def read_differences(nranks):
    """{(file, test): text its failure must contain} of the accepted differences at this many ranks."""
    rows = {}
    for line in DIFFERENCES.read_text().splitlines() if DIFFERENCES.exists() else []:
        if line.strip() and not line.startswith("#"):
            ranks, file, test, text = line.split(" ", 3)
            if ranks == "*" or int(ranks) == nranks:
                rows[(file, test)] = text
    return rows


# ---- running -----------------------------------------------------------------------------------------

def run_env(args, work):
    env = {k: v for k, v in os.environ.items() if not k.startswith(_DROP_PREFIXES) and k not in _DROP_EXACT}
    (work / "tmp").mkdir()
    (work / "trace").mkdir()
    venv_bin = str(pathlib.Path(args.python).parent)
    # `python` and `pytest` of .venv, as an activated environment; bytecode not written into the tree
    env.update(PATH=venv_bin + os.pathsep + env.get("PATH", ""), TMPDIR=str(work / "tmp"),
               DSHIM_TRACE_DIR=str(work / "trace"), PYTHONDONTWRITEBYTECODE="1", PYTHONUNBUFFERED="1")
    return env


def command(args, work):
    pytest_args = [args.path.name] + (["-k", args.keyword] if args.keyword else [])
    if args.standalone:
        return [args.python, "-m", "pytest", "-v", "-p", "no:cacheprovider", "--timeout", str(args.test_timeout),
                f"--junit-xml={work}/junit.0.xml"] + pytest_args
    horovodrun = str(pathlib.Path(args.python).parent / "horovodrun")
    return [horovodrun, "-np", str(args.np), "-H", f"localhost:{args.np}", "/bin/bash", "-c", RANK_CMD,
            args.python, str(args.test_timeout), str(work)] + pytest_args


def run(args, work):
    """Runs the ranks in their own session; kills that session's processes at the end or the time limit."""
    with open(work / "log.txt", "w") as log:
        proc = subprocess.Popen(command(args, work), env=run_env(args, work), stdout=log, stderr=subprocess.STDOUT,
                                cwd=args.path.parent, start_new_session=True)
        try:
            rc = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    return rc


def read_rank(path):
    """{test: (outcome, detail)} from one rank's junit XML."""
    results = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("name")
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        skipped = case.find("skipped")
        if failure is not None:
            results[name] = ("failed", (failure.get("message") or "") + "\n" + (failure.text or ""))
        elif skipped is not None:
            results[name] = ("skipped", skipped.get("message") or "")
        else:
            results[name] = ("passed", "")
    return results


def combine(per_rank):
    """{test: (outcome, detail)} over the ranks: failed on any, skipped on all, passed on all."""
    names = sorted(set().union(*per_rank.values())) if per_rank else []
    out = {}
    for name in names:
        got = {r: res.get(name) for r, res in per_rank.items()}
        failed = [(r, g) for r, g in sorted(got.items()) if g is None or g[0] == "failed"]
        if failed:
            r, g = failed[0]
            out[name] = ("failed", f"rank {r}: " + (g[1] if g else "no result in its junit XML"))
        elif all(g[0] == "skipped" for g in got.values()):
            out[name] = ("skipped", next(iter(got.values()))[1])
        elif all(g[0] == "passed" for g in got.values()):
            out[name] = ("passed", "")
        else:
            out[name] = ("failed", "skipped on some ranks, passed on others: " +
                         ", ".join(f"rank {r} {g[0]}" for r, g in sorted(got.items())))
    return out


def first_error_line(detail):
    lines = [ln.strip() for ln in detail.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("E ") or ln.split(":")[0].endswith(("Error", "Exception"))]
    return (errors[-1] if errors else lines[0] if lines else "(no detail)")[:300]


def check(file, results, expected, differences, complete):
    """Problems, one line each."""
    problems = []
    names = sorted(set(results) | ({t for f, t in expected if f == file} if complete else set()))
    for name in names:
        got, want = results.get(name), expected.get((file, name))
        accepted = differences.get((file, name))
        if want is None:
            problems.append(f"{name}: not in expected.txt (a test upstream's file does not have?)")
        elif got is None:
            problems.append(f"{name}: no result (the run ended before it: crash or hang; see log.txt)")
        elif accepted is not None:
            if got[0] != "failed":
                problems.append(f"{name}: {got[0]}, but differences.txt expects it to fail with {accepted!r}: "
                                f"remove that line")
            elif accepted not in got[1]:
                problems.append(f"{name}: failed other than differences.txt expects ({accepted!r}): "
                                f"{first_error_line(got[1])}")
        elif want[0] == "passed" and got[0] != "passed":
            detail = got[1] if got[0] == "skipped" else first_error_line(got[1])
            problems.append(f"{name}: passes on real Horovod, {got[0]} on dshim: {detail}")
        elif want[0] == "failed" and (got[0] != "failed" or want[1] not in got[1]):
            problems.append(f"{name}: fails on real Horovod with {want[1]!r}, on dshim {got[0]}"
                            + (f": {first_error_line(got[1])}" if got[0] == "failed" else ""))
        elif want[0] == "skipped" and got[0] != "skipped":
            problems.append(f"{name}: skips on real Horovod ({want[1]}), {got[0]} on dshim"
                            + (f": {first_error_line(got[1])}" if got[0] == "failed" else ""))
    return problems


def main(argv):
    args = parse_args(argv)
    why = missing_setup(args)
    if why:
        print(f"hvd_suite.py: {why}")
        return SKIP
    file = args.path.name
    nranks = 1 if args.standalone else args.np
    label = f"horovod {file} ({'one process' if args.standalone else f'{args.np} ranks, horovodrun'})"
    work = pathlib.Path(tempfile.mkdtemp(prefix=f"dshim-hvd-{nranks}-"))
    started = time.monotonic()
    rc = run(args, work)
    wall = time.monotonic() - started

    per_rank, problems = {}, []
    for r in range(nranks):
        xml = work / f"junit.{r}.xml"
        try:
            per_rank[r] = read_rank(xml)
        except (OSError, ET.ParseError) as e:
            problems.append(f"rank {r} wrote no readable junit XML ({e.__class__.__name__}): it crashed or hung; "
                            f"see log.txt")
    results = combine(per_rank)
    problems += check(file, results, read_expected(), read_differences(nranks), complete=not args.keyword
                      and len(per_rank) == nranks)
    if rc is None:
        problems.append(f"the run did not finish within {args.timeout} s (killed); see log.txt")
    elif rc != 0:
        problems.append(f"horovodrun exited with {rc} (a rank's pytest did not complete its session); see log.txt")
    counts = {o: sum(1 for v in results.values() if v[0] == o) for o in ("passed", "failed", "skipped")}
    known = sum(1 for n, v in results.items() if v[0] == "failed" and
                ((file, n) in read_differences(nranks) or read_expected().get((file, n), ("",))[0] == "failed"))
    print(f"{label}: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped"
          + (f" ({known} of the failures expected: expected.txt, differences.txt)" if known else "")
          + f"; {wall:.0f} s")
    for p in problems:
        print(f"  {p}")
    if problems or args.keep:
        print(f"  work directory (log.txt, junit.<rank>.xml): {work}")
    else:
        subprocess.run(["rm", "-rf", str(work)])
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

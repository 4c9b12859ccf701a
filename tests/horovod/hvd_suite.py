"""Horovod 0.28.1's own tests (tests/horovod/upstream, unmodified) on dshim's Horovod layer, run as
upstream runs them, checked against what real Horovod does.

    hvd_suite.py --np 2 test/parallel/test_torch.py        # horovodrun -np 2 -H localhost:2 pytest -v ...
    hvd_suite.py --np 3 test/parallel/test_torch.py
    hvd_suite.py --np 2 test/parallel/test_timeline.py
    hvd_suite.py --standalone test/single/test_torch_elastic.py   # one process, as upstream's single tests
    hvd_suite.py --np 2 test/parallel/test_torch.py -k allgather --keep
    hvd_suite.py --np 2 --python /tmp/hvd-real/bin/python --record test/parallel/test_torch.py  # real Horovod

Upstream's CI runs a parallel file as `horovodrun -np 2 -H localhost:2 --gloo /bin/bash pytest.sh gloo
test_x.py`, every rank a whole pytest session writing its own junit XML (pytest.sh names it after
$HOROVOD_RANK); the single files run in one plain process.  So do we: `.venv/bin/horovodrun --gloo`
(dshim's launcher, dshim-run underneath; the horovodrun beside --python) starts N ranks of
`python -m pytest -v --junit-xml=WORK/junit.$HOROVOD_RANK.xml FILE` through bash (the path is expanded per
rank, nothing in the upstream files changes), in the file's own directory as upstream's `cd test/parallel`.

A test's outcome is its ranks' together: failed if it failed on any rank, skipped if skipped on all,
passed if passed on all.  expected.txt holds what real Horovod 0.28.1 does with each test (torch 2.11,
CPU) at each number of ranks it was recorded at; differences.txt the accepted differences under dshim,
each with the text its failure must contain.  Problems, one line each:
  - a test real Horovod passes does not pass (unless differences.txt accepts its failure);
  - a test real Horovod fails or skips does something else (an expected failure must fail with its
    text: a different failure is a different bug);
  - a test that has no line in expected.txt at this number of ranks, or a line whose test no longer exists;
  - a rank that wrote no junit XML (crashed or hung: see the log), the run's time limit.
Prints one summary line, then every problem.  Exit 0 only without problems; 77 without .venv (make
setup: horovodrun, cloudpickle, mock) or the build.

--record runs the file with a real Horovod (--python of a venv where scripts/build_real_horovod.sh built
it; dshim's layer is refused) and writes each test's outcome at this number of ranks into expected.txt
(a failure with its last error line, the text dshim's failure must then contain), keeping the other
rank counts' lines and the comments; it checks nothing.  With -k it records the tests that ran and keeps
the other lines at this number of ranks (a file recorded in parts, e.g. -k X, then -k "not X").  A test
that never ends on real Horovod (seen in a run without --hangs) is named with --hangs TEST: not run,
recorded as "hangs"; dshim's runs leave such a test out too (it proves nothing, and its ranks would wait
until the timeout and leave the later tests out of step).  differences.txt's text PASSES accepts a pass
where real Horovod fails (dshim's result is the right one; the line says why).
"""
import argparse
import ast
import os
import pathlib
import re
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
    global EXPECTED
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--np", type=int, choices=range(1, 17), metavar="N", help="ranks (horovodrun -np N)")
    mode.add_argument("--standalone", action="store_true", help="one plain process, as upstream's single tests")
    p.add_argument("file", help="the upstream file, relative to tests/horovod/upstream (test/parallel/test_torch.py)")
    p.add_argument("-k", dest="keyword", help="only the tests pytest -k selects (no check of missing tests)")
    p.add_argument("--python", default=str(REPO / ".venv" / "bin" / "python"),
                   help="the ranks' python; horovodrun is the one beside it")
    p.add_argument("--record", action="store_true",
                   help="write the outcomes into expected.txt at this number of ranks (--python: a real Horovod)")
    p.add_argument("--hangs", action="append", default=[], metavar="TEST",
                   help="--record: a test that never ends on real Horovod here (seen without it): not run, "
                        "recorded as 'hangs' (any outcome under dshim is accepted for it)")
    p.add_argument("--expected", default=str(EXPECTED),
                   help="the expected outcomes' file (--record into a scratch copy, whose new lines are then "
                        "inserted into expected.txt, where others may be adding lines at the same time)")
    p.add_argument("--build-dir", default=os.environ.get("DSHIM_BUILD_DIR", str(REPO / "build")))
    p.add_argument("--timeout", type=int, default=1200, help="seconds for the whole run")
    p.add_argument("--test-timeout", type=int, default=300, help="seconds for one test (pytest-timeout)")
    p.add_argument("--keep", action="store_true", help="keep the work directory (log, junit XML)")
    args = p.parse_args(argv)
    EXPECTED = pathlib.Path(args.expected).resolve()   # every reader and --record use this file
    args.path = (UPSTREAM / args.file).resolve()
    if not args.path.is_file() or UPSTREAM not in args.path.parents:
        p.error(f"{args.file}: not a file under {UPSTREAM}")
    args.build_dir = pathlib.Path(args.build_dir).resolve()
    # absolute but not resolved: the ranks run in the file's directory, and a venv's python is a
    # symlink whose target is outside the venv
    args.python = os.path.abspath(args.python)
    if args.hangs and not args.record:
        p.error("--hangs is for --record (real Horovod); expected.txt says which tests hang there")
    if not args.record:
        # a test real Horovod never ends proves nothing and would hold every rank until the timeout (its
        # ranks then leave later tests in another order): dshim's run leaves it out as the recording did
        nranks = 1 if args.standalone else args.np
        args.hangs = sorted(t for (f, t), (o, _) in read_expected(nranks).items()
                            if f == args.path.name and o == "hangs")
    return args


def missing_setup(args):
    """Why this run cannot happen here (77), or None."""
    venv_bin = pathlib.Path(args.python).parent
    if not os.access(args.python, os.X_OK):
        return f"no {args.python}: run make setup" + (" (--record: scripts/build_real_horovod.sh)" if args.record else "")
    if args.record:
        # the reference must be Horovod itself: its package, not dshim's layer answering `import horovod`
        probe = subprocess.run([args.python, "-c", "import horovod; print(horovod.__version__, horovod.__file__, "
                                "getattr(horovod, '__dshim__', False))"],
                               capture_output=True, text=True, cwd="/", env=run_env(args, None))
        if probe.returncode != 0 or not probe.stdout.rstrip().endswith(" False"):
            return (f"--record: {args.python} has no real Horovod ({(probe.stdout + probe.stderr).strip()[-200:]}); "
                    f"build one with scripts/build_real_horovod.sh DIR")
        args.recorded_with = probe.stdout.split()[0]
    elif not (args.build_dir / "lib" / "libdshim.so").exists() or not (args.build_dir / "bin" / "dshim-run").exists():
        return f"no {args.build_dir}/lib/libdshim.so or bin/dshim-run: run make"
    if not args.standalone and not os.access(venv_bin / "horovodrun", os.X_OK):
        return f"no {venv_bin}/horovodrun: run make setup (it installs dshim's horovodrun)"
    probe = subprocess.run([args.python, "-c", "import cloudpickle, mock, pytest_timeout"], capture_output=True)
    if probe.returncode != 0:
        return f"{args.python} lacks cloudpickle, mock or pytest-timeout: run make setup"
    return None


# ---- expected.txt / differences.txt ------------------------------------------------------------------

def read_expected_lines():
    """[(rank counts, file, test, outcome, text)] of expected.txt's lines, in order."""
    rows = []
    for line in EXPECTED.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            ranks, file, test, outcome, *text = line.split(" ", 4)
            rows.append(({int(r) for r in ranks.split(",")}, file, test, outcome, text[0] if text else ""))
    return rows


def read_expected(nranks):
    """{(file, test): (outcome, text its failure contains)} at this number of ranks (1: one process)."""
    return {(f, t): (o, x) for ranks, f, t, o, x in read_expected_lines() if nranks in ranks}


def record(file, nranks, results, part=False):
    """Writes results ({test: (outcome, detail)}) into expected.txt as what happens at nranks: the
    lines of other rank counts stay; a test with the same outcome and text at several counts has one
    line ("2,3 file test outcome text"); the comments at the top stay, the order of tests too.  part:
    the results are of some of the file's tests (-k), the others' lines at nranks stay too."""
    table = {}   # (file, test) -> {nranks: (outcome, text)}, in expected.txt's order
    for ranks, f, t, o, x in read_expected_lines():
        for r in ranks:
            table.setdefault((f, t), {})[r] = (o, x)
    for key in [k for k in table if k[0] == file and (not part or k[1] in results)]:
        table[key].pop(nranks, None)
    for test, (outcome, detail) in results.items():
        text = ""
        if outcome == "failed":
            text = failure_text(detail)
        elif outcome in ("skipped", "hangs"):
            text = " ".join(detail.split())
        table.setdefault((file, test), {})[nranks] = (outcome, text)
    header = [ln for ln in EXPECTED.read_text().splitlines() if ln.startswith("#")]
    lines = []
    for (f, t), by_count in table.items():
        groups = {}
        for r in sorted(by_count):
            groups.setdefault(by_count[r], []).append(r)
        for (o, x), counts in sorted(groups.items(), key=lambda kv: kv[1]):
            lines.append(" ".join([",".join(map(str, counts)), f, t, o] + ([x] if x else [])))
    tmp = EXPECTED.with_suffix(".tmp")
    tmp.write_text("\n".join(header + lines) + "\n")
    os.replace(tmp, EXPECTED)


def failure_text(detail):
    """What another run's failure must contain: the exception line pytest marks with "E" (the last
    "XxxError: message"), without the "E" and the rank prefix; pytest's assert-rewriting lines after it
    name objects by address."""
    lines = [ln.strip() for ln in detail.splitlines()]
    raised = [ln[1:].strip() for ln in lines if re.match(r"E\s+[\w.]*(Error|Exception|Exit|Interrupt)\b", ln)]
    if raised:
        return raised[-1][:300]
    text = first_error_line(detail.split(": ", 1)[1] if detail.startswith("rank ") else detail)
    return text[1:].strip() if text.startswith("E ") else text


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
    venv_bin = str(pathlib.Path(args.python).parent)
    # `python` and `pytest` of .venv, as an activated environment; bytecode not written into the tree
    env.update(PATH=venv_bin + os.pathsep + env.get("PATH", ""), PYTHONDONTWRITEBYTECODE="1", PYTHONUNBUFFERED="1")
    if work is not None:
        (work / "tmp").mkdir()
        (work / "trace").mkdir()
        env.update(TMPDIR=str(work / "tmp"), DSHIM_TRACE_DIR=str(work / "trace"))
    return env


def test_names(path):
    """The test methods of path's classes and of the classes of the files beside it that it imports
    with `from X import *` (test_mxnet1.py's tests are base_test_mxnet.py's MXTests)."""
    tree = ast.parse(path.read_text())
    names = {f.name for c in tree.body if isinstance(c, ast.ClassDef) for f in c.body
             if isinstance(f, ast.FunctionDef) and f.name.startswith("test_")}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and any(a.name == "*" for a in node.names):
            sibling = path.parent / (node.module + ".py")
            if sibling.is_file():
                names |= test_names(sibling)
    return names


def keyword(args):
    """pytest's -k: the selection, without the tests --hangs names (an expression: --deselect's node ids
    are relative to the rootdir pytest finds, which is the checkout's, not the file's directory)."""
    names = test_names(args.path)
    missing = set(args.hangs) - names
    if missing:
        raise SystemExit(f"hvd_suite.py: --hangs {' '.join(sorted(missing))}: no such test in {args.path.name}")
    # -k matches substrings: a name that is part of another test's name would leave that one out too
    clash = {h for h in args.hangs for n in names if h != n and h in n}
    if clash:
        raise SystemExit(f"hvd_suite.py: --hangs {' '.join(sorted(clash))}: part of another test's name")
    terms = ([f"({args.keyword})"] if args.keyword else []) + [f"not {h}" for h in args.hangs]
    return " and ".join(terms) or None


def command(args, work):
    k = keyword(args)
    pytest_args = [args.path.name] + (["-k", k] if k else [])
    if args.standalone:
        return [args.python, "-m", "pytest", "-v", "-p", "no:cacheprovider", "--timeout", str(args.test_timeout),
                f"--junit-xml={work}/junit.0.xml"] + pytest_args
    horovodrun = str(pathlib.Path(args.python).parent / "horovodrun")
    return [horovodrun, "-np", str(args.np), "-H", f"localhost:{args.np}", "--gloo", "/bin/bash", "-c", RANK_CMD,
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
            # a launcher still running is asked to stop its ranks first: real Horovod's horovodrun starts
            # each rank in a session of its own, out of reach of the kill of this one
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                    proc.wait(timeout=15)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            kill_leftovers(work)
    return rc


def kill_leftovers(work):
    """Kills the ranks that outlived their launcher: real Horovod's horovodrun stops a rank's shell when
    another rank fails, and the rank's python, in a session of its own, goes on.  Every rank's command
    line names this run's work directory (its junit XML), which nothing else has."""
    mark = str(work).encode()
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if mark not in f.read():
                    continue
            os.kill(int(pid), signal.SIGKILL)
        except (OSError, ValueError):
            pass   # gone meanwhile, or not ours to read


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
            problems.append(f"{name}: not in expected.txt at this number of ranks (not recorded there (--record), "
                            f"or a test upstream's file does not have?)")
        elif got is None:
            problems.append(f"{name}: no result (the run ended before it: crash or hang; see log.txt)")
        elif accepted == "PASSES" and want[0] == "failed":
            if got[0] != "passed":
                problems.append(f"{name}: {got[0]}, but differences.txt says dshim passes it where real Horovod "
                                f"fails ({want[1]!r})" + (f": {first_error_line(got[1])}" if got[0] == "failed" else ""))
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
        elif want[0] == "hangs":
            pass   # real Horovod never ends it at this number of ranks: nothing to match, ending is enough
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
    left_out = {name: ("hangs", f"real Horovod never ends it at {nranks} ranks (not run)") for name in args.hangs}

    per_rank, problems = {}, []
    for r in range(nranks):
        xml = work / f"junit.{r}.xml"
        try:
            per_rank[r] = read_rank(xml)
        except (OSError, ET.ParseError) as e:
            problems.append(f"rank {r} wrote no readable junit XML ({e.__class__.__name__}): it crashed or hung; "
                            f"see log.txt")
    results = combine(per_rank)
    results.update(left_out)
    complete = not args.keyword and len(per_rank) == nranks
    if args.record:
        if len(per_rank) != nranks or rc != 0 or not results:
            problems.append("not recorded: the run is incomplete (a rank's XML is missing or it failed)")
        else:
            # with -k only the selected tests' lines change: a file can be recorded in parts, each a
            # session of its own, where one session of every test does not end
            record(file, nranks, results, part=bool(args.keyword))
    else:
        problems += check(file, results, read_expected(nranks), read_differences(nranks), complete)
    if rc is None:
        problems.append(f"the run did not finish within {args.timeout} s (killed); see log.txt")
    elif rc != 0:
        problems.append(f"horovodrun exited with {rc} (a rank's pytest did not complete its session); see log.txt")
    counts = {o: sum(1 for v in results.values() if v[0] == o) for o in ("passed", "failed", "skipped", "hangs")}
    known = sum(1 for n, v in results.items() if v[0] == "failed" and
                ((file, n) in read_differences(nranks) or read_expected(nranks).get((file, n), ("",))[0] == "failed"))
    if args.record:
        label = f"real Horovod {args.recorded_with} ({args.python}): " + label
    print(f"{label}: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped"
          + (f", {counts['hangs']} not run (real Horovod never ends them)" if counts["hangs"] else "")
          + (f" ({known} of the failures expected: expected.txt, differences.txt)" if known and not args.record else "")
          + (f"; recorded in {EXPECTED.name} at {nranks} rank(s)" if args.record and not problems else "")
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

"""torch's distributed_test.py for gloo, plain or under LD_PRELOAD=libdshim.so, checked against gloo.

    torch_suite.py --world-size 2|8 [--shard K/N] [--plain] [--init file|env] [--all] [TEST ...]
    torch_suite.py --world-size 2 --plain --record     # rewrite expected_gloo.txt's lines for 2 ranks

Runs tests/peer/dist_spawn.py (our equivalent of upstream's test_distributed_spawn.py) in a fresh
python, the way a user runs `LD_PRELOAD=libdshim.so python ...`: BACKEND=gloo, WORLD_SIZE, a TEMP_DIR
holding 'barrier', INIT_METHOD=file://... (or env://), ranks started with the spawn method.

What gloo itself does with each test is checked in: expected_gloo.txt, one line per world size and
test (outcome, seconds, skip reason), recorded by --plain --record with the torch of .venv.  Under
dshim the run fails when
  - a test gloo passes does not pass (failed, hung, or skipped);
  - a test gloo skips fails, or skips for another reason;
  - a test's ranks did not report that dshim carried every process group they had (the probe files
    dist_spawn.py writes under PEER_PROBE_DIR: the class carrying each live group, when the default
    group is up and when the test returns) -- a takeover that silently left gloo in place fails here;
  - a test it runs is not in expected_gloo.txt, or that file is for another torch (re-record).
With --plain the same checks run against gloo's own class (a run under a stray preload fails).

Which tests, read from the decorators in distributed_test.py: at 2 ranks every test but those that
skip inside their ranks whatever the backend -- skip_if_small_worldsize (run at 8 ranks instead) and,
on a machine without CUDA, skip_if_no_gpu / skip_if_lt_x_gpu; each of those costs a spawn of every
rank and can only skip, so they skip as "not run: <why>" before spawning (tests that a
decorator skips without spawning keep torch's reason).  At 8 ranks the tests that skip below 8: skip_if_small_worldsize and
require_world_size(n) with 2 < n <= 8 (again without the CUDA-only ones here).  --all runs them all.
--shard K/N runs the K-th of N parts, balanced by gloo's recorded seconds.

Prints one line: "torch distributed_test (gloo under dshim, 2 ranks): N passed, M failed, K skipped",
then every problem, one line each.  Exit 0 only without problems; 77 without .venv or the build.
"""
import argparse
import ast
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
RUNNER = HERE / "dist_spawn.py"
EXPECTED = HERE / "expected_gloo.txt"
DIFFERENCES = HERE / "differences.txt"
SKIP = 77

# decorators of distributed_test.py that skip inside the ranks (after spawning them)
CUDA_ONLY = re.compile(r"skip_if_no_gpu|skip_if_lt_x_gpu\(.*\)")
SMALL_WORLD = "skip_if_small_worldsize"
REQUIRE_WORLD = re.compile(r"require_world_size\((\d+)\)")

# variables of an enclosing job or a developer's shell that would change what the ranks do
_DROP_PREFIXES = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "DSHIM_", "TORCHELASTIC_", "TORCH_DISTRIBUTED_")
_DROP_EXACT = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
               "LD_PRELOAD", "BACKEND", "TEMP_DIR", "INIT_METHOD", "PEER_PROBE_DIR"}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world-size", type=int, required=True, choices=(2, 8))
    p.add_argument("--shard", default="1/1", help="K/N: the K-th of N parts (default 1/1)")
    p.add_argument("--plain", action="store_true", help="gloo itself, no preload")
    p.add_argument("--init", choices=("file", "env"), default="file")
    p.add_argument("--all", action="store_true",
                   help="also the tests that can only skip here (CUDA-only; small world size at 2 ranks)")
    p.add_argument("--record", action="store_true",
                   help="with --plain and no --shard: write this run's outcomes into expected_gloo.txt")
    p.add_argument("--python", default=str(REPO / ".venv" / "bin" / "python"))
    p.add_argument("--build-dir", default=os.environ.get("DSHIM_BUILD_DIR", str(REPO / "build")))
    p.add_argument("--timeout", type=int, default=1500, help="seconds for the whole run")
    p.add_argument("--keep", action="store_true", help="keep the work directory (log, results, probes)")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="set this in the runner's environment (e.g. DSHIM_TAKEOVER=0); repeatable")
    p.add_argument("tests", nargs="*", help="only these tests")
    args = p.parse_args(argv)
    m = re.fullmatch(r"(\d+)/(\d+)", args.shard)
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        p.error(f"--shard {args.shard}: want K/N with 1 <= K <= N, e.g. 2/3")
    args.shard = (int(m.group(1)), int(m.group(2)))
    # the runner starts in its own work directory: a relative LD_PRELOAD would not load there
    args.build_dir = str(pathlib.Path(args.build_dir).resolve())
    bad = [e for e in args.env if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", e)]
    if bad:
        p.error(f"--env {bad[0]}: want NAME=VALUE")
    if args.record and (not args.plain or args.shard != (1, 1)):
        p.error("--record needs --plain and no --shard")
    return args


# ---- expected_gloo.txt: "<world size> <test> <outcome> <seconds> [skip reason]" ----------------------

def read_expected():
    torch_version, rows = None, {}
    for line in EXPECTED.read_text().splitlines():
        if line.startswith("torch "):
            torch_version = line.split()[1]
        elif line and not line.startswith("#"):
            ws, name, outcome, seconds, *reason = line.split(" ", 4)
            rows[(int(ws), name)] = {"outcome": outcome, "seconds": float(seconds),
                                     "detail": reason[0] if reason else ""}
    return torch_version, rows


def write_expected(torch_version, world_size, results):
    """Replaces the rows of the tests in results (other rows stay)."""
    rows = read_expected()[1] if EXPECTED.exists() else {}
    for name, r in results.items():
        detail = r["detail"] if r["outcome"] == "skipped" else ""
        rows[(world_size, name)] = {"outcome": r["outcome"], "seconds": r["seconds"], "detail": detail}
    header = (f"# What gloo itself (no dshim) does with each test of torch {torch_version}'s\n"
              "# torch/testing/_internal/distributed/distributed_test.py: world size, test, outcome,\n"
              "# seconds, skip reason.  Written by tests/peer/torch_suite.py --plain --record\n"
              "# (--world-size 2, then 8); tests/peer/torch_suite.py checks dshim against it.\n"
              f"torch {torch_version}\n")
    body = "".join(f"{ws} {name} {r['outcome']} {r['seconds']:.1f}" + (f" {r['detail']}" if r["detail"] else "")
                   + "\n" for (ws, name), r in sorted(rows.items()))
    EXPECTED.write_text(header + body)


def read_differences():
    """{(world size, test): text its failure must contain} from differences.txt."""
    rows = {}
    for line in DIFFERENCES.read_text().splitlines() if DIFFERENCES.exists() else []:
        if line.strip() and not line.startswith("#"):
            ws, name, text = line.split(" ", 2)
            rows[(int(ws), name)] = text
    return rows


# ---- which tests -------------------------------------------------------------------------------------

def torch_facts(python):
    """(torch version, whether CUDA is usable, path of distributed_test.py) of that python's torch."""
    code = ("import os, torch, torch.testing._internal as t; "
            "print(torch.__version__.split('+')[0]); print(int(torch.cuda.is_available())); "
            "print(os.path.join(os.path.dirname(t.__file__), 'distributed', 'distributed_test.py'))")
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        sys.exit(f"torch_suite.py: {python} cannot import torch:\n{out.stderr[-2000:]}")
    version, cuda, path = out.stdout.split()[-3:]
    return version, cuda == "1", pathlib.Path(path)


def module_tests(path):
    """{test name: [decorator source, ...]} of the _DistTestBase tests in distributed_test.py."""
    tests = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef) and node.name == "_DistTestBase":
            for f in node.body:
                if isinstance(f, ast.FunctionDef) and f.name.startswith("test_"):
                    tests[f.name] = [ast.unparse(d) for d in f.decorator_list]
    if not tests:
        sys.exit(f"torch_suite.py: no _DistTestBase tests found in {path}")
    return tests


def needs_more_ranks(decorators, world_size):
    """Skips below world_size ranks (skip_if_small_worldsize: below 8; require_world_size(n))."""
    for d in decorators:
        m = REQUIRE_WORLD.fullmatch(d)
        if d == SMALL_WORLD and world_size >= 8 or m and 2 < int(m.group(1)) <= world_size:
            return True
    return False


def select_tests(args, tests, have_cuda):
    """(this world size's tests, {test: why it is not run}); those skip before spawning their ranks."""
    if args.world_size == 2:
        names = sorted(tests)
    else:
        names = sorted(n for n, d in tests.items() if needs_more_ranks(d, args.world_size))
    if args.tests:
        unknown = sorted(set(args.tests) - set(names))
        if unknown:
            sys.exit(f"torch_suite.py: not tests of a {args.world_size}-rank run: {' '.join(unknown)}")
        names = [n for n in names if n in set(args.tests)]
    left_out = {}
    if not args.all:
        for n in names:
            if not have_cuda and any(CUDA_ONLY.fullmatch(d) for d in tests[n]):
                left_out[n] = "needs CUDA"
            elif args.world_size == 2 and SMALL_WORLD in tests[n]:
                left_out[n] = "skips below 8 ranks"
    return names, left_out


def shard(names, expected, world_size, k, n):
    """Greedy longest-first split by gloo's recorded seconds; part k of n (1-based)."""
    parts = [[0.0, []] for _ in range(n)]
    cost = {name: (expected.get((world_size, name)) or {"seconds": 10.0})["seconds"] for name in names}
    for name in sorted(names, key=lambda x: (-cost[x], x)):
        part = min(parts, key=lambda p: p[0])
        part[0] += max(cost[name], 0.5)
        part[1].append(name)
    return sorted(parts[k - 1][1])


# ---- running dist_spawn.py --------------------------------------------------------------------------

def runner_env(args, work):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(_DROP_PREFIXES) and k not in _DROP_EXACT}
    (work / "tmp" / "barrier").mkdir(parents=True)
    (work / "probe").mkdir()
    (work / "trace").mkdir()
    # the flight-recorder dumps of the tests that time out on purpose go with the work directory
    # (removed after a clean run), not into the user's default /tmp/dshim-trace-<uid>
    # TMPDIR: the FileStore files some tests make with tempfile (and never remove) stay in it too
    env.update(BACKEND="gloo", WORLD_SIZE=str(args.world_size), TEMP_DIR=str(work / "tmp"),
               TMPDIR=str(work / "tmp"), PEER_PROBE_DIR=str(work / "probe"), DSHIM_TRACE_DIR=str(work / "trace"),
               PYTHONUNBUFFERED="1")
    if args.init == "file":
        env["INIT_METHOD"] = f"file://{work / 'tmp' / 'init'}"
    env.update(e.split("=", 1) for e in args.env)
    if not args.plain:
        env["LD_PRELOAD"] = str(pathlib.Path(args.build_dir) / "lib" / "libdshim.so")
    return env


def run_runner(args, env, work, names):
    """Runs dist_spawn.py in its own session; kills that session's processes when it ends or times out."""
    cmd = [args.python, str(RUNNER), "--results", str(work / "results.jsonl"),
           "--not-run", str(work / "not_run.json"), *names]
    with open(work / "log.txt", "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=work,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            try:  # the spawned ranks of a test still running (timeout) or left behind
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    return rc


def read_results(work):
    results = {}
    path = work / "results.jsonl"
    if path.exists():
        for line in path.read_text().splitlines():
            r = json.loads(line)
            results[r["test"]] = r
    return results


def read_probes(work, name):
    return [json.loads(p.read_text()) for p in sorted((work / "probe").glob(f"{name}.*.json"))]


# ---- checks ------------------------------------------------------------------------------------------

def carried_by(classes, plain):
    """True when every listed class is the carrier this run wants (dshim's, or gloo's when plain)."""
    if plain:
        return all(c.endswith("ProcessGroupGloo") for c in classes)
    return all(c.startswith("dshim.") for c in classes)


def check_test(name, got, want, probes, world_size, plain, difference=None):
    """Problems with one test's outcome and probes, one line each.  difference: the text of the
    failure differences.txt accepts for this test under dshim (None: none accepted)."""
    problems = []
    carrier = "gloo" if plain else "dshim"
    if got is None:
        return [f"{name}: no result (the run ended before it: hang or crash; see log.txt)"]
    if difference is not None and not plain:
        if got["outcome"] != "failed":
            problems.append(f"{name}: {got['outcome']} under dshim, but differences.txt expects it to fail "
                            f"with {difference!r}: remove that line (and its note in docs/torch.md)")
        elif difference not in got["detail"]:
            problems.append(f"{name}: failed under dshim other than differences.txt expects ({difference!r}): "
                            f"{first_error_line(got['detail'])}")
    elif want is None:
        problems.append(f"{name}: not in expected_gloo.txt for {world_size} ranks (re-record)")
    elif want["outcome"] == "passed" and got["outcome"] != "passed":
        problems.append(f"{name}: passes on gloo, {got['outcome']} under {carrier}: "
                        f"{got['detail'] if got['outcome'] == 'skipped' else first_error_line(got['detail'])}")
    elif want["outcome"] == "skipped" and got["outcome"] == "failed":
        problems.append(f"{name}: skips on gloo ({want['detail']}), failed under {carrier}: "
                        f"{first_error_line(got['detail'])}")
    elif (want["outcome"] == "skipped" and got["outcome"] == "skipped" and got["detail"] != want["detail"]
          and not got["detail"].startswith("not run:")):
        problems.append(f"{name}: skips on gloo ({want['detail']}), under {carrier} for another reason: "
                        f"{got['detail']}")
    # tests skipped by a decorator never start ranks; every other test must show its carrier
    if got["outcome"] != "skipped" or probes:
        if len(probes) != world_size:
            problems.append(f"{name}: {len(probes)} of {world_size} ranks reported their process group "
                            f"(probe files); cannot tell what carried it")
        for rank, p in enumerate(probes):
            seen = p.get("start", []) + p.get("end", [])
            if not seen or not carried_by(seen, plain):
                problems.append(f"{name}: rank {rank}'s groups were carried by {sorted(set(seen))}, "
                                f"not {carrier}")
                break
    return problems


def first_error_line(detail):
    lines = [ln.strip() for ln in detail.splitlines() if ln.strip()]
    errors = [ln for ln in lines if re.match(r"^[A-Za-z_.]*(Error|Exception)\b", ln)]
    return (errors[-1] if errors else lines[-1] if lines else "(no detail)")[:300]


def main(argv):
    args = parse_args(argv)
    if not os.access(args.python, os.X_OK):
        print(f"torch_suite.py: no {args.python}: run make setup")
        return SKIP
    if not args.plain and not (pathlib.Path(args.build_dir) / "lib" / "libdshim.so").exists():
        print(f"torch_suite.py: no {args.build_dir}/lib/libdshim.so: run make")
        return SKIP
    torch_version, have_cuda, module_path = torch_facts(args.python)
    want_version, expected = read_expected() if EXPECTED.exists() else (None, {})
    if not args.record and want_version != torch_version:
        print(f"torch_suite.py: expected_gloo.txt is for torch {want_version}, {args.python} has "
              f"{torch_version}: re-record (--plain --record, --world-size 2 then 8)")
        return 1
    names, left_out = select_tests(args, module_tests(module_path), have_cuda)
    names = shard(names, expected, args.world_size, *args.shard)
    what = "gloo" if args.plain else "gloo under dshim"
    label = (f"torch distributed_test ({what}, {args.world_size} ranks"
             + (f", shard {args.shard[0]}/{args.shard[1]}" if args.shard != (1, 1) else "")
             + (", env://" if args.init == "env" else "") + ")")

    work = pathlib.Path(tempfile.mkdtemp(prefix=f"dshim-peer-{args.world_size}-"))
    env = runner_env(args, work)
    started = time.monotonic()
    (work / "not_run.json").write_text(json.dumps({n: r for n, r in left_out.items() if n in names}))
    rc = run_runner(args, env, work, names)
    wall = time.monotonic() - started
    results = read_results(work)

    if args.record:
        write_expected(torch_version, args.world_size, results)
    differences = read_differences()
    problems = [] if args.record else \
        [p for n in names for p in check_test(n, results.get(n), expected.get((args.world_size, n)),
                                             read_probes(work, n), args.world_size, args.plain,
                                             differences.get((args.world_size, n)))]
    if rc is None:
        problems.append(f"the run did not finish within {args.timeout} s (killed); see log.txt")
    counts = {o: sum(1 for n in names if results.get(n, {}).get("outcome") == o)
              for o in ("passed", "failed", "skipped")}
    missing = sum(1 for n in names if n not in results)
    not_run = [results[n]["detail"] for n in names if results.get(n, {}).get("detail", "").startswith("not run:")]
    not_run = "; ".join(f"{not_run.count(r)} {r}" for r in sorted(set(not_run)))
    known = sum(1 for n in names if (args.world_size, n) in differences and not args.plain
                and results.get(n, {}).get("outcome") == "failed")
    print(f"{label}: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped"
          + (f", {known} of the failures known differences (differences.txt)" if known else "")
          + (f", {missing} without a result" if missing else "")
          + (f" ({not_run})" if not_run else "") + f"; {wall:.0f} s")
    for p in problems:
        print(f"  {p}")
    if problems or args.keep:
        print(f"  work directory (log.txt, results.jsonl, probe/): {work}")
    else:
        subprocess.run(["rm", "-rf", str(work)])
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

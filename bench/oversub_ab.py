#!/usr/bin/env python3
"""Where the time goes when ranks outnumber cores: dshim-bench under several
settings and OpenMPI, interleaved in one run (docs/benchmarks.md,
"Ranks outnumber cores").

    python3 bench/oversub_ab.py --build build --np 4 --transport shm \\
        --sizes 4K,64K,1M,16M --reps 5 \\
        --case "auto=" --case "no spin=DSHIM_SPIN_US=0" --case "ring=DSHIM_ALGO=ring" --mpi

    python3 bench/oversub_ab.py --build /tmp/base --np 2 --barrier --sizes 4K --reps 16 \
        --case "base=" --case "new@/tmp/new=" --case "no recorder=DSHIM_TRACE_BUFFER=0" --mpi

Each --case is "label[@BUILD]=VAR=value[,VAR=value...]" (an empty list: dshim's
defaults; BUILD: another build directory than --build, to compare code); an
item that starts with "--" is a dshim-bench option instead (--in-place: the
allreduce from and into one buffer, as mpi_bench calls MPI_Allreduce).
Every repetition runs every case once, in the order given (reversed every
other repetition), then OpenMPI (--mpi; `--mpi-args` adds MCA options, e.g.
the single-copy mechanism), so slow drifts of a shared machine hit all of
them alike.  --barrier adds dshim_barrier / MPI_Barrier as a column.
--wire adds the TCP wire (bench/tcp_wire.c, compiled into BUILD/bench when
missing: loopback TCP moving a ring allreduce's bytes with no library) as
one more paired row, the bound of every TCP case:

    python3 bench/oversub_ab.py --build /tmp/base --np 2 --transport tcp --sizes 16M,64M --reps 8 \
        --case "base=" --case "new@/tmp/new=" --wire

Prints markdown tables: per size the median time over repetitions and, in
brackets, the fastest repetition; the ratio to OpenMPI's median (> 1: dshim
faster); and each case's time over the first case's in the same repetition
(paired: this machine's two vCPUs move between host cores, and a 2-rank
latency doubles or halves with them for seconds at a time, so runs next to
each other compare better than medians of separate runs).  Standard library
only.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from run_bench import (MPI_BTL, STRIP_ENV, STRIP_ENV_PREFIXES, build_bench_c, fmt_size,  # noqa: E402
                       parse_size)


BARRIER = 0  # the barrier's column key (0 bytes)
BENCH_ARGS = "--"  # a case's key for its dshim-bench options


def parse_case(text, default_build):
    label, _, env = text.partition("=")
    label, _, build = label.partition("@")
    pairs = {}
    for kv in filter(None, env.split(",")):
        if kv.startswith("--"):
            pairs.setdefault(BENCH_ARGS, []).append(kv)
            continue
        k, _, v = kv.partition("=")
        if not k.startswith("DSHIM_"):
            raise SystemExit(f"--case {text!r}: {k!r} is not a DSHIM_ variable")
        pairs[k] = v
    return label, build or default_build, pairs


def rows_of(json_path):
    """{bytes: time_us} from a dshim-bench / mpi_bench JSON Lines file (barrier: 0 bytes)."""
    out = {}
    try:
        with open(json_path) as f:
            for line in f:
                r = json.loads(line)
                out[BARRIER if r.get("op") == "barrier" else int(r["bytes"])] = float(r["time_us"])
    except (OSError, ValueError, KeyError):
        pass
    return out


def clean_env():
    """This shell's environment without rendezvous variables (each run sets up its own job)."""
    return {k: v for k, v in os.environ.items() if k not in STRIP_ENV and not k.startswith(STRIP_ENV_PREFIXES)}


def run_dshim(a, build, env_extra, sizes):
    env = clean_env()
    env_extra = dict(env_extra)
    bench_args = env_extra.pop(BENCH_ARGS, [])
    env.update(OMP_NUM_THREADS="1", DSHIM_TRANSPORT=a.transport)
    env.update(env_extra)  # a case may set DSHIM_TRANSPORT itself (auto, with --hosts)
    if a.transport == "tcp":
        env.setdefault("DSHIM_SOCKET_IFNAME", "lo")
    got = {}
    with tempfile.TemporaryDirectory(prefix="oversub_ab.") as tmp:
        for i, s in enumerate(x for x in sizes if x != BARRIER):  # one size per call: any sweep
            path = os.path.join(tmp, f"{i}.jsonl")
            cmd = [os.path.join(build, "bin", "dshim-bench"), "-n", str(a.np), "-b", str(s), "-e", str(s),
                   "-t", str(a.min_time), "-j", path] + bench_args + (["--barrier"] if a.barrier and i == 0 else [])
            subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=a.timeout)
            got.update(rows_of(path))
    return got


def run_mpi(a, sizes):
    with tempfile.TemporaryDirectory(prefix="oversub_ab.") as tmp:
        path = os.path.join(tmp, "mpi.jsonl")
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(a.np)] + MPI_BTL[a.transport] + \
            a.mpi_args.split() + [os.path.join(a.build, "bench", "mpi_bench"), "-T", a.transport,
                                  "-s", ",".join(str(x) for x in sizes if x != BARRIER),
                                  "-t", str(a.min_time), "-j", path] + (["-B"] if a.barrier else [])
        subprocess.run(cmd, env=clean_env(), capture_output=True, text=True, timeout=a.timeout)
        return rows_of(path)


def run_wire(a, sizes):
    why = build_bench_c("tcp_wire", "cc", os.path.join(a.build, "bench"), tempfile.gettempdir())
    if why:
        raise SystemExit(f"--wire: {why}")
    exe = os.path.join(a.build, "bench", "tcp_wire")
    with tempfile.TemporaryDirectory(prefix="oversub_ab.") as tmp:
        path = os.path.join(tmp, "wire.jsonl")
        cmd = [exe, "-n", str(a.np), "-s", ",".join(str(x) for x in sizes if x != BARRIER),
               "-t", str(a.min_time), "-j", path]
        subprocess.run(cmd, env=clean_env(), capture_output=True, text=True, timeout=a.timeout)
        return rows_of(path)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--transport", choices=("shm", "tcp"), default="shm")
    ap.add_argument("--sizes", default="4K,64K,1M,16M")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--min-time", type=float, default=0.3, help="seconds per size and run")
    ap.add_argument("--case", action="append", default=[], help="label[@BUILD]=DSHIM_X=v,DSHIM_Y=w")
    ap.add_argument("--barrier", action="store_true", help="time the barrier too (a column before the sizes)")
    ap.add_argument("--mpi", action="store_true", help="OpenMPI too (the ratio column)")
    ap.add_argument("--mpi-args", default="", help="extra mpirun arguments, e.g. MCA options")
    ap.add_argument("--wire", action="store_true",
                    help="the TCP wire too (bench/tcp_wire.c: the kernel alone; a paired row)")
    ap.add_argument("--timeout", type=float, default=300)
    a = ap.parse_args(argv)
    sizes = ([BARRIER] if a.barrier else []) + [parse_size(s) for s in a.sizes.split(",") if s]
    cases = [parse_case(c, a.build) for c in a.case] or [("auto", a.build, {})]
    wire = "TCP wire"
    names = [c[0] for c in cases] + ([wire] if a.wire else []) + (["OpenMPI"] if a.mpi else [])
    res = {n: {s: [] for s in sizes} for n in names}
    # per repetition, {case: {size: time}}: the paired ratios
    reps = []
    for rep in range(a.reps):
        this = {}
        for label, build, env in (cases if rep % 2 == 0 else cases[::-1]):
            this[label] = run_dshim(a, build, env, sizes)
            for s, t in this[label].items():
                res[label][s].append(t)
        if a.wire:
            this[wire] = run_wire(a, sizes)
            for s, t in this[wire].items():
                res[wire][s].append(t)
        if a.mpi:
            for s, t in run_mpi(a, sizes).items():
                res["OpenMPI"][s].append(t)
        reps.append(this)
        print(f"repetition {rep + 1}/{a.reps} done", file=sys.stderr)

    def num(t):
        return f"{t:.3f}" if t < 10 else f"{t:.1f}"

    def col(s):
        return "barrier" if s == BARRIER else fmt_size(s)

    def med(n, s):
        v = res[n][s]
        return statistics.median(v) if v else None

    print(f"N={a.np}, {a.transport}, {a.reps} interleaved repetitions; time per call in us, median "
          f"[fastest]" + ("; ratio = OpenMPI's median / this one's (> 1: faster than OpenMPI)" if a.mpi else ""))
    print()
    head = "| setting | " + " | ".join(col(s) for s in sizes) + " |"
    if a.mpi:
        head += " " + " | ".join(f"ratio {col(s)}" for s in sizes) + " |"
    print(head)
    print("|---|" + "---:|" * (len(sizes) * (2 if a.mpi else 1)))
    for n in names:
        cells = []
        for s in sizes:
            m = med(n, s)
            cells.append("—" if m is None else f"{num(m)} [{num(min(res[n][s]))}]")
        if a.mpi:
            for s in sizes:
                m, ref = med(n, s), med("OpenMPI", s)
                cells.append("—" if not m or not ref else f"{ref / m:.2f}")
        print(f"| {n} | " + " | ".join(cells) + " |")
    if len(cases) + a.wire > 1:
        first = cases[0][0]
        print()
        print(f"Paired: time over {first}'s in the same repetition, median [min..max] (< 1: faster than {first})")
        print()
        print("| setting | " + " | ".join(col(s) for s in sizes) + " |")
        print("|---|" + "---:|" * len(sizes))
        for label in [c[0] for c in cases[1:]] + ([wire] if a.wire else []):
            cells = []
            for s in sizes:
                r = sorted(x[label][s] / x[first][s] for x in reps
                           if s in x.get(label, {}) and x.get(first, {}).get(s))
                cells.append("—" if not r else f"{statistics.median(r):.2f} [{r[0]:.2f}..{r[-1]:.2f}]")
            print(f"| {label} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

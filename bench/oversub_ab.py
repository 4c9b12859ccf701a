#!/usr/bin/env python3
"""Where the time goes when ranks outnumber cores: dshim-bench under several
settings and OpenMPI, interleaved in one run (issue 20; docs/benchmarks.md,
"Ranks outnumber cores").

    python3 bench/oversub_ab.py --build build --np 4 --transport shm \\
        --sizes 4K,64K,1M,16M --reps 5 \\
        --case "auto=" --case "no spin=DSHIM_SPIN_US=0" --case "ring=DSHIM_ALGO=ring" --mpi

Each --case is "label=VAR=value[,VAR=value...]" (an empty list: dshim's
defaults).  Every repetition runs every case once, in the order given, then
OpenMPI (--mpi; `--mpi-args` adds MCA options, e.g. the single-copy mechanism),
so slow drifts of a shared machine hit all of them alike.  Prints a markdown
table: per size the median time over repetitions and, in brackets, the
fastest repetition; the last column block is the ratio to OpenMPI's median
(> 1: dshim faster).  Standard library only.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from run_bench import MPI_BTL, STRIP_ENV, STRIP_ENV_PREFIXES, fmt_size, parse_size  # noqa: E402


def parse_case(text):
    label, _, env = text.partition("=")
    pairs = {}
    for kv in filter(None, env.split(",")):
        k, _, v = kv.partition("=")
        if not k.startswith("DSHIM_"):
            raise SystemExit(f"--case {text!r}: {k!r} is not a DSHIM_ variable")
        pairs[k] = v
    return label, pairs


def rows_of(text, time_col):
    out = {}
    for line in text.splitlines():
        f = line.split()
        if len(f) > time_col and re.fullmatch(r"\d+", f[0]):
            try:
                out[int(f[0])] = float(f[time_col])
            except ValueError:
                pass
    return out


def clean_env():
    """This shell's environment without rendezvous variables (each run sets up its own job)."""
    return {k: v for k, v in os.environ.items() if k not in STRIP_ENV and not k.startswith(STRIP_ENV_PREFIXES)}


def run_dshim(a, env_extra, sizes):
    env = clean_env()
    env.update(OMP_NUM_THREADS="1", DSHIM_TRANSPORT=a.transport, **env_extra)
    if a.transport == "tcp":
        env.setdefault("DSHIM_SOCKET_IFNAME", "lo")
    got = {}
    for s in sizes:  # one size per call: no geometric-step constraint on the sweep
        cmd = [os.path.join(a.build, "bin", "dshim-bench"), "-n", str(a.np), "-b", str(s), "-e", str(s),
               "-t", str(a.min_time)]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=a.timeout)
        got.update(rows_of(p.stdout, 3))
    return got


def run_mpi(a, sizes):
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(a.np)] + MPI_BTL[a.transport] + \
        a.mpi_args.split() + [os.path.join(a.build, "bench", "mpi_bench"), "-T", a.transport,
                              "-s", ",".join(map(str, sizes)), "-t", str(a.min_time)]
    p = subprocess.run(cmd, env=clean_env(), capture_output=True, text=True, timeout=a.timeout)
    return rows_of(p.stdout, 2)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--transport", choices=("shm", "tcp"), default="shm")
    ap.add_argument("--sizes", default="4K,64K,1M,16M")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--min-time", type=float, default=0.3, help="seconds per size and run")
    ap.add_argument("--case", action="append", default=[], help="label=DSHIM_X=v,DSHIM_Y=w")
    ap.add_argument("--mpi", action="store_true", help="OpenMPI too (the ratio column)")
    ap.add_argument("--mpi-args", default="", help="extra mpirun arguments, e.g. MCA options")
    ap.add_argument("--timeout", type=float, default=300)
    a = ap.parse_args(argv)
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    cases = [parse_case(c) for c in a.case] or [("auto", {})]
    names = [c[0] for c in cases] + (["OpenMPI"] if a.mpi else [])
    res = {n: {s: [] for s in sizes} for n in names}
    for rep in range(a.reps):
        for label, env in cases:
            for s, t in run_dshim(a, env, sizes).items():
                res[label][s].append(t)
        if a.mpi:
            for s, t in run_mpi(a, sizes).items():
                res["OpenMPI"][s].append(t)
        print(f"repetition {rep + 1}/{a.reps} done", file=sys.stderr)

    def med(n, s):
        v = res[n][s]
        return statistics.median(v) if v else None

    print(f"N={a.np}, {a.transport}, {a.reps} interleaved repetitions; time per allreduce in us, median "
          f"[fastest]" + ("; ratio = OpenMPI's median / this one's (> 1: faster than OpenMPI)" if a.mpi else ""))
    print()
    head = "| setting | " + " | ".join(fmt_size(s) for s in sizes) + " |"
    if a.mpi:
        head += " " + " | ".join(f"ratio {fmt_size(s)}" for s in sizes) + " |"
    print(head)
    print("|---|" + "---:|" * (len(sizes) * (2 if a.mpi else 1)))
    for n in names:
        cells = []
        for s in sizes:
            m = med(n, s)
            cells.append("—" if m is None else f"{m:.1f} [{min(res[n][s]):.1f}]")
        if a.mpi:
            for s in sizes:
                m, ref = med(n, s), med("OpenMPI", s)
                cells.append("—" if not m or not ref else f"{ref / m:.2f}")
        print(f"| {n} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

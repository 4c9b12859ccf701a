#!/usr/bin/env python3
"""Streaming copy-out on or off: dshim allreduce over shared memory, paired runs.

    python3 bench/shm_stream_ab.py --build build --np 2,4 --sizes 4M,16M,42M,64M --pairs 8

Each pair runs dshim-bench twice back to back, once with DSHIM_SHM_STREAM_MIN=0 (ordinary stores
everywhere) and once with the default, the order alternating from pair to pair, so the shared
machine's slow spells hit both alike.  Prints a markdown table: median time of each and the median
of the per-pair ratios (streaming / ordinary), with their range.  Standard library only.
"""
import argparse
import os
import statistics
import subprocess
import sys


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1].upper()] if text[-1].upper() in units else int(text)


def one_run(bench, np_, size, iters, stream_min):
    env = dict(os.environ, DSHIM_TRANSPORT="shm")
    env.pop("DSHIM_SHM_STREAM_MIN", None)
    if stream_min is not None:
        env["DSHIM_SHM_STREAM_MIN"] = stream_min   # else dshim's default
    out = subprocess.run([bench, "-n", str(np_), "-b", str(size), "-e", str(size), "-w", "2", "-i", str(iters),
                          "-c", "0"], env=env, capture_output=True, text=True, timeout=300)
    rows = [line.split() for line in out.stdout.splitlines() if line.strip() and line.split()[0] == str(size)]
    if out.returncode != 0 or not rows:
        sys.exit(f"shm_stream_ab: dshim-bench -n {np_} -b {size} failed ({out.returncode}):\n"
                 f"{out.stdout[-2000:]}{out.stderr[-2000:]}")
    return float(rows[-1][3])   # time per call, µs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--np", default="2,4")
    ap.add_argument("--sizes", default="4M,16M,42M,64M")
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--iters", type=int, default=15)
    a = ap.parse_args()
    bench = os.path.join(a.build, "bin", "dshim-bench")
    print("| N | size | ordinary stores | streaming copy-out | streaming / ordinary [range over pairs] |")
    print("|---:|---:|---:|---:|---|")
    for np_ in [int(x) for x in a.np.split(",")]:
        for text in a.sizes.split(","):
            size = parse_size(text)
            plain, stream, ratios = [], [], []
            for k in range(a.pairs):
                order = ("0", None) if k % 2 == 0 else (None, "0")
                t = {mode: one_run(bench, np_, size, a.iters, mode) for mode in order}
                plain.append(t["0"])
                stream.append(t[None])
                ratios.append(t[None] / t["0"])
            print(f"| {np_} | {text} | {statistics.median(plain) / 1e3:.2f} ms | "
                  f"{statistics.median(stream) / 1e3:.2f} ms | **{statistics.median(ratios):.2f}** "
                  f"[{min(ratios):.2f}..{max(ratios):.2f}] |", flush=True)


if __name__ == "__main__":
    main()

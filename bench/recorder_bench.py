#!/usr/bin/env python3
"""The flight recorder's cost: dshim-bench allreduce with the recorder on (the default,
DSHIM_TRACE_BUFFER=2000) and off (0), interleaved in one sitting: each repetition runs both, in
alternating order, and the ratio is taken per pair (drift of the machine cancels) and then the median
over the pairs.  Replaces the section "## Flight recorder cost" of --out, leaving the rest as it is.

    python3 bench/recorder_bench.py --build build --reps 7 --out docs/benchmarks.md
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SECTION = "## Flight recorder cost"
# (size, what is compared, the target: time ratio on/off for latency, busbw ratio on/off for bandwidth)
CASES = [(4096, "time", 1.02), (16 << 20, "busbw", 0.98)]


def run_once(exe, n, size, on, secs):
    env = dict(os.environ, OMP_NUM_THREADS="1", DSHIM_TRANSPORT="shm")
    env["DSHIM_TRACE_BUFFER"] = "2000" if on else "0"
    with tempfile.NamedTemporaryFile(suffix=".jsonl") as j:
        cmd = [exe, "-n", str(n), "-b", str(size), "-e", str(size), "-t", str(secs), "-j", j.name]
        subprocess.run(cmd, env=env, check=True, capture_output=True, timeout=120)
        rows = [json.loads(l) for l in open(j.name) if l.strip()]
    r = next(r for r in rows if r["bytes"] == size)
    if r.get("check") != "ok":
        sys.exit(f"recorder_bench: wrong result: {shlex.join(cmd)}")
    return r


def measure(exe, nps, reps, secs):
    out = []
    for n in nps:
        for size, metric, need in CASES:
            pairs = []
            for rep in range(reps):
                order = (False, True) if rep % 2 == 0 else (True, False)
                got = {on: run_once(exe, n, size, on, secs) for on in order}
                if metric == "time":
                    pairs.append((got[True]["time_us"], got[False]["time_us"]))
                else:
                    pairs.append((got[True]["busbw"], got[False]["busbw"]))
                print(f"recorder_bench: N={n} {size} B rep {rep}: on {pairs[-1][0]:.3f} off {pairs[-1][1]:.3f}",
                      flush=True)
            ratios = [a / b for a, b in pairs]
            ratio = statistics.median(ratios)
            ok = ratio <= need if metric == "time" else ratio >= need
            offs = [b for _, b in pairs]
            spread = (max(offs) - min(offs)) / statistics.median(offs)
            out.append(dict(n=n, size=size, metric=metric, need=need, ratio=ratio, ok=ok,
                            on=statistics.median(a for a, _ in pairs), off=statistics.median(offs),
                            spread=spread, reps=reps, lo=min(ratios), hi=max(ratios)))
    return out


def section(rows, cmd):
    def size(b):
        return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"
    lines = [SECTION, "",
             "The flight recorder (docs/observability.md) is on by default. Its cost, from `dshim-bench` "
             "allreduce over shm with `DSHIM_TRACE_BUFFER=2000` (on) and `0` (off), interleaved: each "
             "repetition runs both in alternating order; the ratio is the median of the per-pair ratios "
             "(min–max beside it); \"off spread\" is how far the off runs alone varied ((max − min) / median), "
             "the noise a difference must exceed to be measurable.", "",
             f"Command: `{cmd}`", "",
             "| N | size | compared | on | off | ratio on/off (min–max) | off spread | need | result |",
             "|---:|---:|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        unit = "µs" if r["metric"] == "time" else "GB/s"
        need = f"≤ {r['need']:g}" if r["metric"] == "time" else f"≥ {r['need']:g}"
        lines.append(f"| {r['n']} | {size(r['size'])} | {r['metric']} | {r['on']:.3f} {unit} | {r['off']:.3f} {unit} | "
                     f"{r['ratio']:.3f} ({r['lo']:.3f}–{r['hi']:.3f}) | {100 * r['spread']:.0f} % | {need} | "
                     f"**{'PASS' if r['ok'] else 'FAIL'}** |")
    lines.append("")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--np", default="2,4")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--secs", type=float, default=1.0, help="dshim-bench -t: seconds per size")
    ap.add_argument("--out", default=None, help="markdown file whose section to replace")
    a = ap.parse_args()
    exe = os.path.join(os.path.abspath(a.build), "bin", "dshim-bench")
    rows = measure(exe, [int(x) for x in a.np.split(",")], a.reps, a.secs)
    cmd = "python3 bench/recorder_bench.py " + shlex.join(sys.argv[1:])
    text = section(rows, cmd)
    print(text)
    if a.out:
        sys.path.insert(0, HERE)
        from ddp_bench import replace_section   # the one copy of "replace a section of the report"
        replace_section(a.out, text, SECTION)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

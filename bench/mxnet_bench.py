#!/usr/bin/env python3
"""MXNet dist kvstore: dshim's parameter server vs MXNet's own ps-lite, interleaved.

    .venv-mxnet/bin/python bench/mxnet_bench.py --reps 3 --out docs/benchmarks.md   # make bench-mxnet
    .venv-mxnet/bin/python bench/mxnet_bench.py --reps 1 --out /tmp/x.md             # smoke run

Driver (default): for every repetition it runs one job per implementation, alternating
which goes first, `dshim-run [--no-preload] -n 2 -s 2 python bench/mxnet_bench.py --worker`
(--no-preload: MXNet's own ps-lite; else libdshim.so is preloaded and carries the dist
kvstore), collects worker 0's JSON line and replaces (or appends) the section
"## MXNet dist kvstore: dshim vs ps-lite" of --out.

Worker (--worker): kv = mx.kv.create('dist_sync'), then
  1. pushpull: for each shape (keys x floats), after a warm-up, `iters` rounds of one
     kv.pushpull(key, grad) per key (as Gluon's Trainer calls it), between two barriers;
     throughput = bytes pushed per worker per second;
  2. trainer: Gluon MLP (784-512-512-10, 0.67 M parameters), Trainer(kvstore=kv,
     update_on_kvstore=True, SGD on the servers), batch 64 per worker: samples/s per worker.
Worker (--worker --mode trainer_big, a job of its own: a Trainer's keys are its parameter
indices, so two Trainers cannot share one kvstore): the same with a communication-bound
model, MLP 784-2048-2048-2048-10 (10.5 M parameters, 42 MB of gradients per step), batch 32.
Worker (--mode trainer_local, a job of its own): the 0.67 M Trainer with update_on_kvstore=False
(the servers sum the gradients, each worker runs SGD).
A value is worker 0's; a table cell the median over repetitions.
"""
import argparse
import datetime
import json
import os
import shlex
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddp_bench import replace_section  # noqa: E402  the one copy of "replace a section of the report"

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SECTION = "## MXNet dist kvstore: dshim vs ps-lite"
SHAPES = [(32, 1024), (4, 250000), (2, 1000000)]


def worker_push_pull(args):
    """kv.push then kv.pull of 2 keys x 10^6 float32, optionally 2-bit compressed."""
    import mxnet as mx

    kv = mx.kv.create("dist_sync")
    if args.mode == "push_pull_2bit":
        kv.set_gradient_compression({"type": "2bit", "threshold": 0.5})
    rank = kv.rank
    nkeys, n = 2, 1000000
    arrs = [mx.nd.ones((n,)) * (rank + 1) for _ in range(nkeys)]
    for k, a in enumerate(arrs):
        kv.init(k, a)

    def one_round():
        for k, a in enumerate(arrs):
            kv.push(k, a)
        for k, a in enumerate(arrs):
            kv.pull(k, out=a)
        mx.nd.waitall()

    one_round()
    kv._barrier()
    t0 = time.perf_counter()
    for _ in range(args.iters):
        one_round()
    kv._barrier()
    res = {"rank": rank, args.mode: args.iters * nkeys * n * 4 / (time.perf_counter() - t0)}
    if rank == 0:
        print("BENCH " + json.dumps(res), flush=True)


def trainer_rate(kv, rank, layers, batch, steps, on_kvstore=True):
    """Samples per second of one worker: Gluon MLP `layers` (input 784), Trainer on `kv` with the
    optimizer on the servers (on_kvstore) or on the workers (the servers sum the gradients),
    `steps` timed steps after 3."""
    import numpy as np
    import mxnet as mx
    from mxnet import autograd, gluon

    mx.random.seed(1)
    net = gluon.nn.HybridSequential()
    units = 784
    for width in layers[:-1]:
        net.add(gluon.nn.Dense(width, activation="relu", in_units=units))
        units = width
    net.add(gluon.nn.Dense(layers[-1], in_units=units))
    net.initialize(mx.init.Xavier())
    net.hybridize()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01}, kvstore=kv,
                            update_on_kvstore=on_kvstore)
    rng = np.random.RandomState(rank)
    x = mx.nd.array(rng.randn(batch, 784))
    y = mx.nd.array(rng.randint(0, layers[-1], batch))
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

    def step():
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(batch)

    for _ in range(3):
        step()
    mx.nd.waitall()
    kv._barrier()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    mx.nd.waitall()
    kv._barrier()
    return steps * batch / (time.perf_counter() - t0)


def worker(args):
    import mxnet as mx

    if args.mode in ("trainer_big", "trainer_local"):
        kv = mx.kv.create("dist_sync")
        if args.mode == "trainer_big":
            rate = trainer_rate(kv, kv.rank, [2048, 2048, 2048, 10], 32, args.steps)
        else:
            rate = trainer_rate(kv, kv.rank, [512, 512, 10], 64, args.steps, on_kvstore=False)
        res = {"rank": kv.rank, args.mode: rate}
        if kv.rank == 0:
            print("BENCH " + json.dumps(res), flush=True)
        return
    if args.mode != "default":
        worker_push_pull(args)
        return
    kv = mx.kv.create("dist_sync")
    rank = kv.rank
    res = {"rank": rank, "pushpull": {}, "trainer": None}
    key = 100  # the Trainer below uses keys 0..5
    for nkeys, n in SHAPES:
        arrs = [mx.nd.ones((n,)) * (rank + 1) for _ in range(nkeys)]
        keys = list(range(key, key + nkeys))
        key += nkeys
        for k, a in zip(keys, arrs):
            kv.init(k, a)
        for k, a in zip(keys, arrs):  # warm-up
            kv.pushpull(k, a)
        mx.nd.waitall()
        kv._barrier()
        t0 = time.perf_counter()
        for _ in range(args.iters):
            for k, a in zip(keys, arrs):
                kv.pushpull(k, a)
        mx.nd.waitall()
        kv._barrier()
        dt = time.perf_counter() - t0
        res["pushpull"]["%dx%d" % (nkeys, n)] = args.iters * nkeys * n * 4 / dt
    res["trainer"] = trainer_rate(kv, rank, [512, 512, 10], 64, args.steps)
    if rank == 0:
        print("BENCH " + json.dumps(res), flush=True)


def run_job(args, impl, mode="default"):
    cmd = shlex.split(args.wrap) + [args.run] + (["--no-preload"] if impl == "pslite" else []) + \
        shlex.split(args.launch_args) + [
        "-n", "2", "-s", "2", args.python, os.path.abspath(__file__), "--worker", "--mode", mode,
        "--iters", str(args.iters), "--steps", str(args.steps_big if mode == "trainer_big" else args.steps)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "PS_", "MXNET_"))}
    env["OMP_NUM_THREADS"] = "1"
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    for line in p.stdout.splitlines():
        if "BENCH " in line:
            return json.loads(line.split("BENCH ", 1)[1])
    raise SystemExit("%s job failed (%d):\n%s" % (impl, p.returncode, p.stdout[-4000:]))


def fmt_bw(b):
    return "%.0f MB/s" % (b / 1e6)


def report(args, runs):
    def med(impl, getter):
        return statistics.median(getter(r) for r in runs[impl])

    def ratios(getter):
        rs = [getter(d) / getter(p) for d, p in zip(runs["dshim"], runs["pslite"])]
        return statistics.median(rs), min(rs), max(rs)

    rows = []
    for nkeys, n in SHAPES:
        name = "%dx%d" % (nkeys, n)
        g = (lambda r, name=name: r["pushpull"][name])
        m, lo, hi = ratios(g)
        shard = "sharded over 2 servers" if n >= 1000000 else "one server per key"
        rows.append("| pushpull, %d keys x %d float32 (%s) | %s | %s | **%.2f** [%.2f..%.2f] |" % (
            nkeys, n, shard, fmt_bw(med("dshim", g)), fmt_bw(med("pslite", g)), m, lo, hi))
    g = (lambda r: r["trainer"])
    m, lo, hi = ratios(g)
    rows.append("| Gluon Trainer dist_sync, MLP 0.67 M params, batch 64 | %.0f samples/s | %.0f samples/s | "
                "**%.2f** [%.2f..%.2f] |" % (med("dshim", g), med("pslite", g), m, lo, hi))
    if all("trainer_local" in r for impl in runs for r in runs[impl]):
        g = (lambda r: r["trainer_local"])
        m, lo, hi = ratios(g)
        rows.append("| Gluon Trainer dist_sync, MLP 0.67 M params, batch 64, update_on_kvstore=False (servers sum, "
                    "workers update) | %.0f samples/s | %.0f samples/s | **%.2f** [%.2f..%.2f] |" % (
                        med("dshim", g), med("pslite", g), m, lo, hi))
    if all("trainer_big" in r for impl in runs for r in runs[impl]):
        g = (lambda r: r["trainer_big"])
        m, lo, hi = ratios(g)
        rows.append("| Gluon Trainer dist_sync, MLP 10.5 M params (42 MB of gradients per step), batch 32 | "
                    "%.0f samples/s | %.0f samples/s | **%.2f** [%.2f..%.2f] |" % (
                        med("dshim", g), med("pslite", g), m, lo, hi))
    try:
        commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], stdout=subprocess.PIPE,
                                text=True).stdout.strip()
    except OSError:
        commit = "?"
    section = args.section or SECTION
    text = "\n".join([
        section, "",
        "Written by `bench/mxnet_bench.py` (`make bench-mxnet`); do not edit the numbers by hand, re-run it.", "",
        "| item | value |", "|---|---|",
        "| date (UTC) | %s |" % datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M:%S"),
        "| machine | %d CPUs |" % os.cpu_count(),
        "| software | mxnet 1.9.1 (PyPI, CPU), ps-lite as built into it (`dshim-run --no-preload`); dshim commit %s "
        "+ local changes |" % commit,
        "| job | %s |" % (args.title or "`dshim-run -n 2 -s 2` on this host (loopback): scheduler, 2 servers, 2 workers, "
                                     "OMP_NUM_THREADS=1, kvstore `dist_sync`"),
        "| runs | %d repetition(s), dshim and ps-lite jobs alternating (order swapped every repetition); pushpull: "
        "%d timed rounds after a warm-up; Trainer: %d timed steps after 3 |" % (args.reps, args.iters, args.steps),
        "",
        "Method: one job per implementation and repetition. Pushpull: each round calls `kv.pushpull(key, grad)` "
        "once per key, as Gluon's Trainer does, between two `kv._barrier()`; throughput is the bytes one worker "
        "pushes per second (it pulls as many). Trainer: samples per second of one worker, optimizer on the "
        "servers unless the row says otherwise; the other Trainers run in jobs of their own (the 10.5 M one: %d "
        "timed steps after 3). Cells: "
        "worker 0's value, median over repetitions; the ratio's range over repetitions in brackets." % args.steps_big, "",
        "| metric | dshim | ps-lite | dshim/ps-lite [range] |", "|---|---:|---:|---|"] + rows + [""])
    replace_section(args.out, text, section)
    print(text)


COMPRESSION_SECTION = "## MXNet dist kvstore: 2-bit compression on a 1 Gbit/s link"
COMPRESSION_NOTE = ("Pulls are never compressed (as in MXNet), so 2-bit shrinks only the push half of a round: push + pull throughput can at most double, and the link-bound uncompressed case leaves dshim and ps-lite about equal.")


def compression_driver(args):
    modes = ["push_pull", "push_pull_2bit"]
    runs = {(impl, m): [] for impl in ("dshim", "pslite") for m in modes}
    for rep in range(args.reps):
        order = [("pslite", m) for m in modes] + [("dshim", m) for m in modes]
        if rep % 2:
            order.reverse()
        for impl, m in order:
            r = run_job(args, impl, m)
            runs[(impl, m)].append(r[m])
            print("rep %d %s %s: %s" % (rep, impl, m, fmt_bw(r[m])), file=sys.stderr, flush=True)
    med = {k: statistics.median(v) for k, v in runs.items()}
    rows = []
    for m, name in (("push_pull", "push + pull, uncompressed"), ("push_pull_2bit", "push (2-bit) + pull")):
        rows.append("| %s | %s | %s | **%.2f** |" % (name, fmt_bw(med[("dshim", m)]), fmt_bw(med[("pslite", m)]),
                                                    med[("dshim", m)] / med[("pslite", m)]))
    rows.append("| 2-bit / uncompressed | **%.2f** | **%.2f** | |" % (
        med[("dshim", "push_pull_2bit")] / med[("dshim", "push_pull")],
        med[("pslite", "push_pull_2bit")] / med[("pslite", "push_pull")]))
    text = "\n".join([
        COMPRESSION_SECTION, "",
        "Written by `bench/mxnet_netns_bench.sh` (which runs `bench/mxnet_bench.py --compression`); re-run it "
        "rather than editing.", "",
        "| item | value |", "|---|---|",
        "| date (UTC) | %s |" % datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M:%S"),
        "| job | %s |" % (args.title or "dshim-run -n 2 -s 2"),
        "| workload | each round: `kv.push` of 2 keys x 10^6 float32 (4 MB, split over both servers), then "
        "`kv.pull` of both; %d timed rounds after one; throughput = gradient bytes per worker per second "
        "(pulls are never compressed, as in MXNet) |" % args.iters,
        "| runs | %d repetition(s), all four jobs per repetition, order reversed every other; medians |" % args.reps,
        "",
        "| metric | dshim | ps-lite | dshim/ps-lite |", "|---|---:|---:|---|"] + rows + [
        "", "%s" % COMPRESSION_NOTE, ""])
    replace_section(args.out, text, COMPRESSION_SECTION)
    print(text)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--steps-big", type=int, default=15, help="timed steps of the 10.5 M-parameter Trainer")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--python", default=os.path.join(ROOT, ".venv-mxnet", "bin", "python"))
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "benchmarks.md"))
    ap.add_argument("--mode", default="default",
                    help="worker: default, trainer_local, trainer_big, push_pull, push_pull_2bit")
    ap.add_argument("--wrap", default="", help="command prefix for dshim-run (e.g. ip netns exec NS env ...)")
    ap.add_argument("--launch-args", default="", help="extra dshim-run options (e.g. -H hosts --launcher ssh)")
    ap.add_argument("--compression", action="store_true",
                    help="driver: push+pull of 2 x 4 MB keys, uncompressed and 2-bit (for a slow link)")
    ap.add_argument("--title", default="", help="text for the report's job row")
    ap.add_argument("--section", default="", help="heading of the section written (default: the loopback one)")
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    args.run = os.path.join(args.build, "bin", "dshim-run")
    if args.compression:
        compression_driver(args)
        return
    runs = {"dshim": [], "pslite": []}
    for rep in range(args.reps):
        order = ["pslite", "dshim"] if rep % 2 == 0 else ["dshim", "pslite"]
        for impl in order:
            r = run_job(args, impl)
            r.update(run_job(args, impl, "trainer_local"))
            r.update(run_job(args, impl, "trainer_big"))
            runs[impl].append(r)
            print("rep %d %s: %s" % (rep, impl, json.dumps(r)), file=sys.stderr, flush=True)
    report(args, runs)


if __name__ == "__main__":
    main()

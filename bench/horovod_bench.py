#!/usr/bin/env python3
"""Horovod training throughput and per-op cost: dshim's Horovod layer vs real Horovod 0.28.1 vs DDP on dshim.

    .venv/bin/python bench/horovod_bench.py --real /tmp/hvd-real --np 2,4 --reps 5   # make bench-horovod
    .venv/bin/python bench/horovod_bench.py --real /tmp/hvd-real --np 2 --reps 1 --iters 2 --out /tmp/x.md  # smoke
    .venv/bin/python bench/horovod_bench.py --report-only                              # rewrite the section

Driver (default): for every repetition and every process count N it runs three jobs, one after the
other (a, b, c, a, b, c, ...: interleaved, so that a slow spell of the machine hits all three):
  (a) dshim's layer: `.venv/bin/horovodrun -np N -H localhost:N python horovod_bench.py --worker --impl hvd`;
  (b) real Horovod 0.28.1 (built by scripts/build_real_horovod.sh into --real, Gloo controller and
      CPU operations): `REAL/bin/horovodrun -np N -H localhost:N --gloo REAL/bin/python ... --impl hvd`;
  (c) torch DDP over the backend "dshim": `dshim-run --no-preload --nproc-per-node N ... --impl ddp`.
Every rank of every job: OMP_NUM_THREADS=1 and torch.set_num_threads(1) (N = 4 oversubscribes 2 cores
otherwise twice over).  It appends rank 0's results to BUILD/bench/horovod_results.jsonl and replaces (or
appends) the section "## Horovod: dshim's layer vs real Horovod" of --out.

Worker (--worker): Horovod's examples/pytorch/pytorch_synthetic_benchmark.py, measured the same way --
fixed synthetic data, SGD wrapped in hvd.DistributedOptimizer(named_parameters=...) after
hvd.broadcast_parameters and hvd.broadcast_optimizer_state (for DDP: the model in DDP, whose constructor
broadcasts), --warmup batches, then --iters timings of --batches-per-iter steps (timeit), img/s per
rank = batch x batches / time on rank 0, total = N x that -- but with a model small enough that
communication matters (an MLP of a few Linear layers, ~4 M parameters, instead of resnet50).  Then the
per-op cost: blocks of synchronous 1-float32 allreduces (hvd.allreduce(t, op=hvd.Sum); DDP's job:
dist.all_reduce(t), dshim's raw all_reduce through torch.distributed), each block after a sync.
Sanity, every job: after the timing the ranks' parameters must be equal (DistributedOptimizer and DDP
both average the gradients), and jobs (a)/(b) must have the Horovod they were meant to
(horovod.__dshim__), or the job fails.
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

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SECTION = "## Horovod: dshim's layer vs real Horovod"
TARGET_VS_REAL = 1.3     # dshim's layer img/s >= 1.3 x real Horovod's
TARGET_VS_DDP = 0.95     # within 5 % of DDP on dshim
TARGET_TINY = 2.0        # a tiny hvd.allreduce <= 2 x dshim's raw all_reduce
IMPLS = ("dshim", "real", "ddp")
LABEL = {"dshim": "dshim's Horovod layer", "real": "real Horovod 0.28.1 (Gloo)", "ddp": "DDP on dshim"}


# ================================================================== worker

def build_model(width, depth, inputs, classes):
    import torch.nn as nn
    layers, d = [], inputs
    for _ in range(depth):
        layers += [nn.Linear(d, width), nn.ReLU()]
        d = width
    layers.append(nn.Linear(d, classes))
    return nn.Sequential(*layers)


def worker(a):
    import timeit
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(1)
    torch.manual_seed(1234)   # the same initial model everywhere; the broadcast makes it so anyway
    model = build_model(a.width, a.depth, a.inputs, a.classes)
    out = dict(impl=a.impl, torch=torch.__version__, omp=os.environ.get("OMP_NUM_THREADS"),
               params=sum(p.numel() for p in model.parameters()),
               model=f"MLP Linear({a.inputs},{a.width})+ReLU, {a.depth - 1}x Linear({a.width},{a.width})+ReLU, "
                     f"Linear({a.width},{a.classes})")
    if a.impl == "ddp":
        import torch.distributed as dist
        import dshim  # noqa: F401  registers the backend "dshim"
        from torch.nn.parallel import DistributedDataParallel as DDP
        dist.init_process_group("dshim")
        rank, size = dist.get_rank(), dist.get_world_size()
        model = DDP(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * size)

        def tiny(t, name=None):
            dist.all_reduce(t)

        def gather(t):
            parts = [torch.empty_like(t) for _ in range(size)]
            dist.all_gather(parts, t)
            return torch.cat(parts)

        def finish():
            dist.destroy_process_group()
    else:
        import horovod
        import horovod.torch as hvd
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        is_dshim = bool(getattr(horovod, "__dshim__", False))
        out.update(horovod=horovod.__version__, horovod_file=horovod.__file__, horovod_dshim=is_dshim)
        if is_dshim != (a.expect == "dshim"):
            sys.exit(f"horovod_bench: rank {rank}: expected {LABEL[a.expect]}, got horovod {horovod.__version__} "
                     f"from {horovod.__file__}")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * size)
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                             compression=hvd.Compression.none, op=hvd.Average)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)

        def tiny(t, name=None):
            hvd.allreduce(t, op=hvd.Sum, name=name)

        def gather(t):
            return hvd.allgather(t)

        def finish():
            hvd.shutdown()
    out["np"] = size

    gen = torch.Generator().manual_seed(1000 + rank)   # each rank its own batch, as the example's randn
    data = torch.randn(a.batch, a.inputs, generator=gen)
    target = torch.randint(0, a.classes, (a.batch,), generator=gen)

    def benchmark_step():
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()

    timeit.timeit(benchmark_step, number=a.warmup)
    img_secs = []
    for _ in range(a.iters):
        t = timeit.timeit(benchmark_step, number=a.batches_per_iter)
        img_secs.append(a.batch * a.batches_per_iter / t)
    out["img_sec_per_rank"] = img_secs

    # per-op cost: blocks of synchronous 1-float allreduces, each block after one more (a sync); unnamed
    # (Horovod names each by a counter: a new name every call) and under one name reused by every call
    # (what DistributedOptimizer's per-parameter names give: Horovod's response cache can answer)
    one = torch.zeros(1)
    for key, name in (("tiny_s", None), ("tiny_named_s", "bench.tiny")):
        for _ in range(a.tiny_calls):   # warm-up
            tiny(one, name)
        per_call = []
        for _ in range(a.tiny_rounds):
            tiny(one, name)
            t0 = time.perf_counter()
            for _ in range(a.tiny_calls):
                tiny(one, name)
            per_call.append((time.perf_counter() - t0) / a.tiny_calls)
        out[key] = per_call

    # sanity: every rank holds the same parameters after the same averaged steps
    flat = torch.cat([p.detach().reshape(-1).double() for p in model.parameters()])
    sums = gather(torch.tensor([flat.sum().item(), flat.abs().sum().item()], dtype=torch.float64)).view(size, 2)
    spread = (sums - sums[0]).abs().max().item() / max(sums[0, 1].item(), 1e-30)
    out["param_spread"] = spread
    out["params_equal"] = spread <= 1e-9
    if rank == 0:
        with open(a.json, "w") as f:
            json.dump(out, f)
    finish()
    if not out["params_equal"]:
        sys.exit(f"horovod_bench: rank {rank}: the ranks' parameters differ after training "
                 f"(relative spread {spread:.3g}): {sums.tolist()}")
    return 0


# ================================================================== driver

def med(v):
    return statistics.median(v)


def job_value(res):
    """(total img/s: N x the median over iterations of rank 0's img/s, tiny unnamed and named: median s
    per call)."""
    return res["np"] * med(res["img_sec_per_rank"]), med(res["tiny_s"]), med(res["tiny_named_s"])


def command(a, impl, n, json_path):
    worker_args = [os.path.join(HERE, "horovod_bench.py"), "--worker", "--json", json_path,
                   "--warmup", str(a.warmup), "--iters", str(a.iters), "--batches-per-iter", str(a.batches_per_iter),
                   "--batch", str(a.batch), "--width", str(a.width), "--depth", str(a.depth),
                   "--inputs", str(a.inputs), "--classes", str(a.classes),
                   "--tiny-calls", str(a.tiny_calls), "--tiny-rounds", str(a.tiny_rounds)]
    if impl == "dshim":
        return [os.path.join(a.venv, "bin", "horovodrun"), "-np", str(n), "-H", f"localhost:{n}",
                os.path.join(a.venv, "bin", "python")] + worker_args + ["--impl", "hvd", "--expect", "dshim"]
    if impl == "real":
        return [os.path.join(a.real, "bin", "horovodrun"), "-np", str(n), "-H", f"localhost:{n}", "--gloo",
                os.path.join(a.real, "bin", "python")] + worker_args + ["--impl", "hvd", "--expect", "real"]
    return [os.path.join(a.build, "bin", "dshim-run"), "--no-preload", "--nproc-per-node", str(n),
            "--master-port", "0"] + worker_args + ["--impl", "ddp"]


def run_job(a, impl, n, rep, log_dir):
    from run_bench import run_json_job
    json_path = os.path.join(log_dir, f"rep{rep}-np{n}-{impl}.json")
    log_path = os.path.join(log_dir, f"rep{rep}-np{n}-{impl}.log")
    cmd = command(a, impl, n, json_path)
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                        "LD_PRELOAD", "PYTHONPATH", "VIRTUAL_ENV")
           and not k.startswith(("DSHIM_", "HOROVOD_", "OMPI_", "PMI_", "SLURM_"))}
    venv = a.real if impl == "real" else a.venv
    # the job's venv first on PATH, as `activate` does (the real Horovod's ranks never see .venv, where
    # dshim's import finder lives)
    env["PATH"] = os.path.join(venv, "bin") + os.pathsep + env.get("PATH", "")
    env["VIRTUAL_ENV"] = venv
    env["OMP_NUM_THREADS"] = "1"
    res, wall, quiet = run_json_job(cmd, env, log_path, json_path, a.timeout, a.max_wait,
                                    f"horovod_bench: job rep {rep} np {n} {impl}")
    res.update(impl=impl, rep=rep, wall_s=round(wall, 1), quiet=quiet, log=os.path.relpath(log_path, REPO))
    return res


def fmt_ratio(r, target=None, above=True):
    """Two decimals, three where two would hide which side of the target it is on."""
    if target is not None and ((round(r, 2) >= target) != (r >= target) if above
                               else (round(r, 2) <= target) != (r <= target)):
        return f"{r:.3f}"
    return f"{r:.2f}"


def fmt_us(s):
    return f"{s * 1e6:.1f} µs" if s < 1e-3 else f"{s * 1e3:.2f} ms"


class Report:
    def __init__(self, records, meta):
        self.records, self.meta = records, meta
        self.nps = sorted({r["np"] for r in records})
        # {np: {rep: {impl: (img/s, tiny s)}}}, only repetitions where all three jobs finished
        by = {}
        for r in records:
            by.setdefault(r["np"], {}).setdefault(r["rep"], {})[r["impl"]] = job_value(r)
        self.by = {n: {rep: v for rep, v in reps.items() if set(v) == set(IMPLS)} for n, reps in by.items()}
        self.verdict = []

    def ratio(self, n, f):
        """Median and range over repetitions of f(values of one repetition)."""
        rs = [f(v) for v in self.by[n].values()]
        return med(rs), min(rs), max(rs)

    def cell(self, n, label, f, target, above):
        r, lo, hi = self.ratio(n, f)
        ok = r >= target if above else r <= target
        self.verdict.append((n, label, r, target, above, ok))
        return (f"**{fmt_ratio(r, target, above)}** [{lo:.2f}..{hi:.2f}]", f"{'≥' if above else '≤'} {target}",
                "**PASS**" if ok else "**FAIL**")

    def tables(self):
        lines = ["| N | dshim's layer | real Horovod | DDP on dshim | dshim layer / real Horovod [range] | target | "
                 "result | dshim layer / DDP on dshim [range] | target | result |",
                 "|---:|---:|---:|---:|---|---:|---|---|---:|---|"]
        for n in self.nps:
            if not self.by[n]:
                continue
            img = {i: med([v[i][0] for v in self.by[n].values()]) for i in IMPLS}
            a = self.cell(n, "img/s vs real Horovod", lambda v: v["dshim"][0] / v["real"][0], TARGET_VS_REAL, True)
            b = self.cell(n, "img/s vs DDP on dshim", lambda v: v["dshim"][0] / v["ddp"][0], TARGET_VS_DDP, True)
            lines.append(f"| {n} | {img['dshim']:.0f} img/s | {img['real']:.0f} img/s | {img['ddp']:.0f} img/s | "
                         + " | ".join(a) + " | " + " | ".join(b) + " |")
        lines += ["", "Per-op cost: one synchronous 1-element float32 allreduce, `hvd.allreduce(t, op=hvd.Sum)` "
                  "unnamed (a new name every call) or with one name reused by every call (as "
                  "DistributedOptimizer's per-parameter names: Horovod's response cache can answer); dshim's raw: "
                  "`dist.all_reduce(t)` through the torch.distributed backend \"dshim\", in the DDP job:",
                  "", "| N | hvd.allreduce | dshim's layer | real Horovod | dshim's raw all_reduce | dshim layer / raw "
                  "[range] | target | result | real Horovod / raw |", "|---:|---|---:|---:|---:|---|---:|---|---:|"]
        for n in self.nps:
            if not self.by[n]:
                continue
            for k, kind in ((1, "unnamed"), (2, "named")):
                # the raw all_reduce has no name: the same measurement on both rows
                t = {i: med([v[i][k if i != "ddp" else 1] for v in self.by[n].values()]) for i in IMPLS}
                c = self.cell(n, f"tiny allreduce ({kind}) vs raw", lambda v: v["dshim"][k] / v["ddp"][1],
                              TARGET_TINY, False)
                rr = self.ratio(n, lambda v: v["real"][k] / v["ddp"][1])[0]
                lines.append(f"| {n} | {kind} | {fmt_us(t['dshim'])} | {fmt_us(t['real'])} | {fmt_us(t['ddp'])} | "
                             + " | ".join(c) + f" | {rr:.1f} |")
        return lines

    def text(self):
        m = self.meta
        first = self.records[0]
        real = next((r for r in self.records if r["impl"] == "real"), {})
        dsh = next((r for r in self.records if r["impl"] == "dshim"), {})
        lines = [SECTION, "",
                 "Written by `bench/horovod_bench.py` (`make bench-horovod`); do not edit the numbers by hand, re-run it.",
                 "", "```bash", m["command"], "```", "",
                 "| item | value |", "|---|---|",
                 f"| date (UTC) | {m['date']} |",
                 f"| machine | {m['machine']} |",
                 f"| software | torch {first['torch']}; dshim commit {m['commit']} ({dsh.get('horovod', '?')}); real "
                 f"Horovod {real.get('horovod', '?')} built from its sdist with the C++17 fix of horovod PR #3998 by "
                 f"`scripts/build_real_horovod.sh` (Gloo controller and CPU operations, no MPI), its own venv "
                 f"`{m['real']}` |",
                 f"| model | {first['model']}: {first['params'] / 1e6:.2f} M float32 parameters; cross-entropy, SGD "
                 f"(lr 0.01 × N); synthetic data, batch {m['batch']} per rank |",
                 f"| runs | {len({r['rep'] for r in self.records})} repetition(s), jobs interleaved (a, b, c per "
                 f"repetition and N); per job {m['warmup']} warm-up batches, then {m['iters']} timings of "
                 f"{m['batches_per_iter']} batches; tiny: {m['tiny_rounds']} blocks of {m['tiny_calls']} calls |",
                 f"| processes | N = {', '.join(map(str, self.nps))} on one host with {m['nproc']} CPUs (N = 4 "
                 f"oversubscribes); OMP_NUM_THREADS=1 and torch.set_num_threads(1) in every rank |",
                 "",
                 "Method: Horovod's `examples/pytorch/pytorch_synthetic_benchmark.py` (DistributedOptimizer over "
                 "SGD with `named_parameters`, `broadcast_parameters` and `broadcast_optimizer_state` from rank 0, "
                 "fixed synthetic data, `timeit` of batches after a warm-up, img/s = batch × batches / time on "
                 "rank 0), with an MLP instead of resnet50 so that communication matters. The same script runs "
                 "(a) on dshim's Horovod layer under `.venv/bin/horovodrun`, (b) on real Horovod under its own "
                 "`horovodrun --gloo`, (c) as torch DDP over the backend \"dshim\" under `dshim-run`. A job's "
                 "img/s is N × the median over its timings; ratios are taken within a repetition (the three "
                 "jobs ran one after the other) and given as the median over repetitions [range]. Sanity, every "
                 "job: after the timings the ranks' parameters are equal, and (a)/(b) checked which Horovod "
                 "answered (`horovod.__dshim__`).",
                 ""]
        lines += self.tables()
        lines += ["", "Per job (img/s total, tiny per call unnamed / named):", ""]
        for r in self.records:
            img, t, tn = job_value(r)
            lines.append(f"* N={r['np']} rep {r['rep']} {LABEL[r['impl']]}: {img:.0f} img/s, {fmt_us(t)} / {fmt_us(tn)}; job "
                         f"{r['wall_s']} s{'' if r['quiet'] else ', machine busy at start'}")
        lines.append("")
        if m.get("notes"):
            lines += [m["notes"], ""]
        return "\n".join(lines).rstrip() + "\n"


def driver(a):
    sys.path.insert(0, HERE)
    from ddp_bench import replace_section
    from run_bench import machine_info
    a.build, a.venv, a.real = (os.path.abspath(p) for p in (a.build, a.venv, a.real))
    bench_dir = os.path.join(a.build, "bench")
    raw = os.path.join(bench_dir, "horovod_results.jsonl")
    if a.report_only:
        if not os.path.exists(raw):
            sys.exit(f"horovod_bench: no {raw}: run the benchmark first (make bench-horovod)")
        with open(raw) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        metas = [r for r in rows if r.get("kind") == "meta"]
        if not metas:
            sys.exit(f"horovod_bench: {raw} holds no run")
        meta = metas[-1]
        records = [r for r in rows if r.get("run_id") == meta["run_id"] and r.get("kind") != "meta"]
    else:
        for exe in (os.path.join(a.build, "bin", "dshim-run"), os.path.join(a.venv, "bin", "horovodrun")):
            if not os.access(exe, os.X_OK):
                sys.exit(f"horovod_bench: {exe} is missing: run `make setup build` first")
        if "real" in a.impl_list and not os.access(os.path.join(a.real, "bin", "horovodrun"), os.X_OK):
            sys.exit(f"horovod_bench: no real Horovod in {a.real}: scripts/build_real_horovod.sh {a.real}")
        run_id = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ") + f"-{os.getpid()}"
        log_dir = os.path.join(bench_dir, "logs", "horovod-" + run_id)
        os.makedirs(log_dir, exist_ok=True)
        mi = machine_info()
        try:
            commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True,
                                    text=True, timeout=30).stdout.strip() or "?"
            dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True, timeout=30).stdout.strip()
            if dirty:
                commit += " + local changes"
        except (OSError, subprocess.SubprocessError):
            commit = "?"
        py = os.path.relpath(sys.executable, REPO) if sys.executable.startswith(REPO + os.sep) else sys.executable
        meta = dict(kind="meta", run_id=run_id, commit=commit, nproc=mi["nproc"], real=a.real,
                    machine=f"{mi['nproc']} CPUs, {mi['cpu']}, {mi['memory']} RAM, kernel {mi['kernel']}",
                    date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
                    command=f"cd {REPO} && {py} bench/horovod_bench.py {shlex.join(sys.argv[1:])}",
                    warmup=a.warmup, iters=a.iters, batches_per_iter=a.batches_per_iter, batch=a.batch,
                    tiny_calls=a.tiny_calls, tiny_rounds=a.tiny_rounds, notes=a.notes)
        records = []
        with open(raw, "a") as f:
            f.write(json.dumps(meta) + "\n")
        for rep in range(1, a.reps + 1):
            for n in a.np_list:
                got = {}
                for impl in a.impl_list:
                    res = run_job(a, impl, n, rep, log_dir)
                    res["run_id"] = run_id
                    records.append(res)
                    with open(raw, "a") as f:
                        f.write(json.dumps(res) + "\n")
                    got[impl] = job_value(res)
                print(f"  np {n} rep {rep}: img/s " + ", ".join(f"{i} {v[0]:.0f}" for i, v in got.items())
                      + (f" (dshim/real {got['dshim'][0] / got['real'][0]:.2f}, dshim/ddp "
                         f"{got['dshim'][0] / got['ddp'][0]:.2f})" if len(got) == len(IMPLS) else "")
                      + "; tiny " + ", ".join(f"{i} {fmt_us(v[1])} / {fmt_us(v[2])}" for i, v in got.items()), flush=True)
    if a.notes:
        meta["notes"] = a.notes
    if not records:
        sys.exit(f"horovod_bench: the latest run in {raw} has no finished job")
    rep = Report(records, meta)
    text = rep.text()
    replace_section(a.out, text, SECTION)
    print(text)
    print(f"wrote section '{SECTION}' of {a.out}: " +
          "; ".join(f"N={n} {label}: {fmt_ratio(r, t, above)} ({'PASS' if ok else 'FAIL'} {'≥' if above else '≤'} {t})"
                    for n, label, r, t, above, ok in rep.verdict))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", action="store_true", help="run as one rank (started by the driver's launchers)")
    ap.add_argument("--impl", choices=("hvd", "ddp"), help="worker: horovod.torch or DDP on the backend dshim")
    ap.add_argument("--expect", choices=("dshim", "real"), help="worker --impl hvd: which Horovod must answer")
    ap.add_argument("--json", help="worker: rank 0 writes its results here")
    ap.add_argument("--np", default="2,4", help="driver: process counts (default 2,4)")
    ap.add_argument("--reps", type=int, default=5, help="driver: repetitions (default 5)")
    ap.add_argument("--impls", default=",".join(IMPLS),
                    help="driver: which jobs (default dshim,real,ddp; the tables need all three)")
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--venv", default=os.path.join(REPO, ".venv"))
    ap.add_argument("--real", default="/tmp/hvd-real", help="venv of real Horovod (scripts/build_real_horovod.sh)")
    ap.add_argument("--out", default=os.path.join(REPO, "docs", "benchmarks.md"))
    ap.add_argument("--report-only", action="store_true", help="rewrite the section from the latest raw run")
    ap.add_argument("--notes", default="", help="a paragraph added under the tables")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per job (default 600)")
    ap.add_argument("--max-wait", type=float, default=120.0,
                    help="seconds to wait for a quiet machine before each job (default 120)")
    ap.add_argument("--warmup", type=int, default=10, help="warm-up batches (the example's default, 10)")
    ap.add_argument("--iters", type=int, default=10, help="timings (the example's --num-iters, 10)")
    ap.add_argument("--batches-per-iter", type=int, default=10, help="batches per timing (the example's, 10)")
    ap.add_argument("--batch", type=int, default=32, help="samples per rank and batch (the example's, 32)")
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=4, help="Linear+ReLU layers before the last Linear")
    ap.add_argument("--inputs", type=int, default=1024, help="features per sample (a flattened 32x32 image)")
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--tiny-calls", type=int, default=100, help="calls per tiny block (default 100)")
    ap.add_argument("--tiny-rounds", type=int, default=10, help="tiny blocks (default 10)")
    a = ap.parse_args()
    try:
        a.np_list = [int(x) for x in a.np.split(",") if x]
    except ValueError:
        ap.error(f"--np {a.np!r}: want comma-separated integers, e.g. 2,4")
    if not a.np_list or min(a.np_list) < 2:
        ap.error("--np needs process counts >= 2")
    a.impl_list = [i for i in a.impls.split(",") if i]
    if not a.impl_list or set(a.impl_list) - set(IMPLS):
        ap.error(f"--impls {a.impls!r}: a comma-separated subset of {','.join(IMPLS)}")
    if a.worker:
        if not a.json or not a.impl or (a.impl == "hvd" and not a.expect):
            ap.error("--worker needs --json, --impl and (hvd) --expect")
        return worker(a)
    return driver(a)


if __name__ == "__main__":
    sys.exit(main())

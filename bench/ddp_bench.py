#!/usr/bin/env python3
"""PyTorch DDP step time and tiny all_reduce: the "dshim" backend vs gloo, interleaved in one job.

    .venv/bin/python bench/ddp_bench.py --np 2,4 --reps 3 --out docs/benchmarks.md   # make bench-torch
    .venv/bin/python bench/ddp_bench.py --np 2 --reps 1 --steps 6 --out /tmp/x.md     # smoke run
    .venv/bin/python bench/ddp_bench.py --report-only --out docs/benchmarks.md        # rewrite the section

Driver (default): for every repetition and every process count it starts one job
`dshim-run --no-preload --nproc-per-node N --master-port 0 bench/ddp_bench.py --worker ...`
(no preload: gloo stays torch's own gloo; dshim-run sets OMP_NUM_THREADS=1 as torchrun does),
appends rank 0's results to BUILD/bench/ddp_results.jsonl and replaces (or appends) the
section "## PyTorch DDP: dshim vs gloo" of --out, leaving the rest of the file as it is.

Worker (--worker, one per rank): the default group is gloo; two more groups over all ranks,
new_group(backend="dshim") and new_group(backend="gloo").  Every rank builds the same MLP
(fixed seed, 10.5 M float32 parameters) twice and wraps one copy in DDP over each group, with
DDP's default buckets.  Each phase alternates dshim, gloo, dshim, gloo, ... after a warm-up:
  1. tiny: blocks of 1-element float32 all_reduce (sync; async_op=True + wait()) per group;
  2. ddp@B: forward + backward + SGD step on synthetic data (B samples per rank), a barrier
     on that group before and after each step, the step timed between them; for every B; a third
     copy in DDP over a 1-rank group of each rank's own takes its turn after those two (the floor:
     DDP's own work, no data exchanged);
  3. compute@B: the same step under no_sync() (no communication);
  4. check: both models get the same parameters and run one more step; gradients compared;
  5. comm: all_reduce of flat tensors sized like DDP's buckets alone, issued back to back
     asynchronously and waited for, as DDP's reducer does;
  6. copy: one libc memcpy of the buckets' size on every rank at once (a lower bound on any
     allreduce's CPU per step).
A run's time is the max over ranks; a job's value the median over its runs.  CPU time per
thread (/proc/self/task/*/schedstat) and the machine's idle share are recorded per phase, to
tell computation from communication.  dshim's counters (dshim_stats) must grow by one
all_reduce per bucket and step, and the gradients must agree, or the job fails.
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
SECTION = "## PyTorch DDP: dshim vs gloo"
TARGET_STEP = 0.7    # DDP step time dshim <= 0.7 x gloo
TARGET_TINY = 0.5    # a no-op-sized collective dshim <= 0.5 x gloo
NAMES = ("dshim", "gloo")
WHO = ("main", "dshim threads", "dshim completion", "gloo threads", "other")


# ================================================================== worker

def _tids():
    return {int(t) for t in os.listdir("/proc/self/task")}


def _thread_cpu():
    """{tid: nanoseconds on a CPU} for this process's threads (schedstat: ns resolution)."""
    out = {}
    for t in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{t}/schedstat") as f:
                out[int(t)] = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass   # a thread that just ended
    return out


def _idle_jiffies():
    with open("/proc/stat") as f:
        v = f.readline().split()
    return int(v[4]) + int(v[5])   # idle + iowait, all CPUs


def build_model(width, depth, classes, seed):
    import torch
    import torch.nn as nn
    torch.manual_seed(seed)
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, classes))
    return nn.Sequential(*layers)


class Worker:
    def __init__(self, a):
        import torch
        import torch.distributed as dist
        self.a, self.torch, self.dist = a, torch, dist
        if os.environ.get("OMP_NUM_THREADS") != "1":
            sys.exit("ddp_bench: OMP_NUM_THREADS is not 1; start the worker through dshim-run (the driver does)")
        torch.set_num_threads(1)
        torch.set_num_interop_threads(1)
        dist.init_process_group("gloo")
        self.rank, self.n = dist.get_rank(), dist.get_world_size()
        import dshim  # noqa: F401  registers "dshim" (autoload does too; explicit here)
        # who owns which OS thread, for the CPU accounting: the threads that appear while a
        # group is created and runs its first operations are that group's
        self.label = {os.getpid(): "main"}
        self.groups = {}
        one = torch.zeros(1)
        for name in NAMES:
            before = _tids()
            g = self.groups[name] = dist.new_group(backend=name)
            dist.all_reduce(one, group=g)
            dist.all_reduce(one, group=g, async_op=True).wait()
            dist.barrier(group=g)
            for tid in _tids() - before:
                self.label[tid] = f"{name} threads"
        import threading
        for th in threading.enumerate():
            if th.name.startswith("dshim-complete"):
                self.label[th.native_id] = "dshim completion"
            elif th.name.startswith("dshim-"):
                self.label[th.native_id] = "dshim threads"
        self.kinds = {k: type(g._get_backend(torch.device("cpu"))).__name__ for k, g in self.groups.items()}
        if "Gloo" not in self.kinds["gloo"] or "Dshim" not in self.kinds["dshim"]:
            sys.exit(f"ddp_bench: wrong backends {self.kinds}: gloo must be torch's gloo (run without the preload)")
        self.dpg = self.groups["dshim"]._get_backend(torch.device("cpu"))
        self.phase = None    # the phase being timed (None during warm-up)
        self.cpu_acc = {}    # phase -> group -> thread label -> ns, this rank, timed runs only
        self.part_acc = {}   # phase -> group -> [(fwd, bwd, opt wall, fwd, bwd, opt main-thread CPU) s]
        self.idle_acc = {}   # phase -> group -> [idle jiffies of the machine, seconds timed]
        self.runs = {}       # phase -> timed runs per group

    def tmax(self, values):
        """Element-wise max over ranks (default gloo group: not part of what is measured)."""
        t = self.torch.tensor(values, dtype=self.torch.float64)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        return t.tolist()

    def interleaved(self, fn, count, warm, phase, mark=None, names=NAMES):
        """Alternates the groups: fn(name) -> parts or None, timed between barriers on that
        group.  Returns {name: [seconds per run, max over ranks]}; mark() runs after the warm-up."""
        for _ in range(warm):
            for name in names:
                self.timed(fn, name)
        if mark is not None:
            mark()
        self.phase = phase
        self.runs[phase] = count
        local = {name: [] for name in names}
        for _ in range(count):
            for name in names:
                local[name].append(self.timed(fn, name))
        self.phase = None
        return {name: self.tmax(v) for name, v in local.items()}

    def timed(self, fn, name):
        # the 1-rank copy's steps are aligned across ranks by the default group (gloo), so that
        # the dshim group's counters hold only the dshim steps' collectives
        g = self.groups[name] if name in NAMES else None
        c0 = _thread_cpu() if self.phase else None
        self.dist.barrier(group=g)
        i0 = _idle_jiffies()
        t0 = time.perf_counter()
        parts = fn(name)
        t = time.perf_counter() - t0
        i1 = _idle_jiffies()
        self.dist.barrier(group=g)
        if c0 is not None:
            c1 = _thread_cpu()
            acc = self.cpu_acc.setdefault(self.phase, {}).setdefault(name, {})
            for tid, ns in c1.items():
                who = self.label.get(tid, "other")
                acc[who] = acc.get(who, 0) + ns - c0.get(tid, 0)
            idle = self.idle_acc.setdefault(self.phase, {}).setdefault(name, [0, 0.0])
            idle[0] += i1 - i0
            idle[1] += t
            if parts is not None:
                self.part_acc.setdefault(self.phase, {}).setdefault(name, []).append(parts)
        return t

    # -- phases ---------------------------------------------------------------------

    def tiny(self, out):
        a, dist = self.a, self.dist
        t = self.torch.zeros(1, dtype=self.torch.float32)

        def block(mode):
            def fn(name):
                g = self.groups[name]
                if mode == "sync":
                    for _ in range(a.tiny_calls):
                        dist.all_reduce(t, group=g)
                else:
                    for _ in range(a.tiny_calls):
                        dist.all_reduce(t, group=g, async_op=True).wait()
            return fn

        for mode in ("sync", "async"):
            res = self.interleaved(block(mode), a.tiny_rounds, 2, f"tiny_{mode}")
            out[f"tiny_{mode}"] = {k: [x / a.tiny_calls for x in v] for k, v in res.items()}

    def models(self, out):
        import torch.nn as nn
        from torch.nn.parallel import DistributedDataParallel as DDP
        a, torch = self.a, self.torch
        base = build_model(a.width, a.depth, a.classes, seed=1234)
        self.ddp, self.opt = {}, {}
        for name in NAMES:
            m = build_model(a.width, a.depth, a.classes, seed=1234)
            m.load_state_dict(base.state_dict())
            # bucket_cap_mb None: DDP's defaults (25 MiB buckets, a 1 MiB first bucket) for both
            self.ddp[name] = DDP(m, process_group=self.groups[name], bucket_cap_mb=a.bucket_mb)
            self.opt[name] = torch.optim.SGD(self.ddp[name].parameters(), lr=a.lr, momentum=0.9)
        # a third copy in DDP over a 1-rank dshim group of its own: DDP's machinery (bucket copies,
        # hooks, fresh gradient tensors) with no data exchanged
        mine, _ = self.dist.new_subgroups(group_size=1, backend="dshim")
        m = build_model(a.width, a.depth, a.classes, seed=1234)
        m.load_state_dict(base.state_dict())
        self.ddp["self"] = DDP(m, process_group=mine, bucket_cap_mb=a.bucket_mb)
        self.opt["self"] = torch.optim.SGD(self.ddp["self"].parameters(), lr=a.lr, momentum=0.9)
        self.self_group = mine
        params = list(base.parameters())
        out["params"] = sum(p.numel() for p in params)
        out["model"] = f"MLP {a.depth}x Linear({a.width},{a.width})+ReLU, Linear({a.width},{a.classes})"
        # DDP's buckets after its first step (the rebuild): the gradients of a Sequential become
        # ready in reverse order of its parameters
        first = self.dist._DEFAULT_FIRST_BUCKET_BYTES if a.bucket_mb is None else int(a.bucket_mb * 2**20)
        cap = int((a.bucket_mb or 25) * 2**20)
        rparams = list(reversed(params))
        idx, _ = self.dist._compute_bucket_assignment_by_size(rparams, [first, cap], [False] * len(rparams))
        self.buckets = [sum(rparams[i].numel() * rparams[i].element_size() for i in b) for b in idx]
        out["bucket_bytes"] = self.buckets
        self.loss_fn = nn.CrossEntropyLoss()
        self.counter = {name: 0 for name in NAMES + ("self",)}

    def data(self, batch):
        torch = self.torch
        gen = torch.Generator().manual_seed(1000 + self.rank)   # each rank its own, same for both models
        self.batches = [(torch.randn(batch, self.a.width, generator=gen),
                         torch.randint(0, self.a.classes, (batch,), generator=gen)) for _ in range(4)]

    def step(self, name, sync=True):
        model, opt = self.ddp[name], self.opt[name]
        x, y = self.batches[self.counter[name] % len(self.batches)]
        self.counter[name] += 1
        now, cpu = time.perf_counter, time.thread_time
        t0, c0 = now(), cpu()
        opt.zero_grad()
        if sync:
            loss = self.loss_fn(model(x), y)
            t1, c1 = now(), cpu()
            loss.backward()   # returns when DDP's bucket all_reduces are done
        else:
            with model.no_sync():
                loss = self.loss_fn(model(x), y)
                t1, c1 = now(), cpu()
                loss.backward()
        t2, c2 = now(), cpu()
        opt.step()
        t3, c3 = now(), cpu()
        return (t1 - t0, t2 - t1, t3 - t2, c1 - c0, c2 - c1, c3 - c2)

    def train(self, out, batch):
        a, n = self.a, self.n
        self.data(batch)
        stats = []
        key = f"ddp@{batch}"
        # the third copy, DDP over its 1-rank group, takes its turn between them: the floor of a
        # step (DDP's own work, nothing exchanged) measured under the same conditions, step by step
        out[key] = self.interleaved(self.step, a.steps, a.warmup, key, mark=lambda: stats.append(self.dpg.dshim_stats()),
                                    names=NAMES + ("self",))
        out[f"self@{batch}"] = out[key].pop("self")
        s0, s1 = stats[0], self.dpg.dshim_stats()
        # a timed dshim step: a barrier before and after it, and one all_reduce per bucket
        per_step = (s1["collectives"] - s0["collectives"]) / a.steps
        sent = (s1["bytes_sent"] - s0["bytes_sent"]) / a.steps
        # an allreduce sends at least (n-1)/n of its data; ask for half of that
        ok = per_step >= len(self.buckets) + 2 and sent >= 0.5 * sum(self.buckets) * (n - 1) / n
        out.setdefault("dshim_per_step", {})[key] = dict(collectives=per_step, bytes_sent=sent, carried=ok)
        # no communication: both models under no_sync()
        ckey = f"compute@{batch}"
        out[ckey] = self.interleaved(lambda name: self.step(name, sync=False), a.compute_steps, 2, ckey)

    def check(self, out):
        """Same parameters in both models, one step each: the gradients must agree."""
        torch = self.torch
        with torch.no_grad():
            for pd, pg in zip(self.ddp["dshim"].parameters(), self.ddp["gloo"].parameters()):
                pd.copy_(pg)
        x, y = self.batches[0]
        for name in NAMES:
            self.ddp[name].zero_grad()
            self.loss_fn(self.ddp[name](x), y).backward()
        worst = gmax = 0.0
        for pd, pg in zip(self.ddp["dshim"].parameters(), self.ddp["gloo"].parameters()):
            worst = max(worst, (pd.grad - pg.grad).abs().max().item())
            gmax = max(gmax, pg.grad.abs().max().item())
        worst, gmax = self.tmax([worst, gmax])
        out["grad_max_abs_diff"] = worst
        out["grad_max_abs"] = gmax
        # gloo and dshim may add the ranks' values in different orders: a few float32 ulps
        out["grad_equal"] = worst <= 1e-5 * max(gmax, 1e-30)

    def comm(self, out):
        dist = self.dist
        flats = [self.torch.ones(max(b // 4, 1)) for b in self.buckets]

        def fn(name):
            g = self.groups[name]
            works = [dist.all_reduce(t, group=g, async_op=True) for t in flats]
            for w in works:
                w.wait()

        out["comm"] = self.interleaved(fn, self.a.comm_rounds, 2, "comm")

    def copy_ref(self, out):
        """One libc memcpy (ctypes.memmove) of as many bytes as DDP's buckets, every rank at once:
        what reading and writing the gradients once costs a core here.  Any allreduce must at least
        read every gradient and write every result, so its CPU per step is no less than this."""
        import ctypes
        nbytes = sum(self.buckets)
        src, dst = self.torch.ones(nbytes // 4), self.torch.zeros(nbytes // 4)

        def fn(name):
            ctypes.memmove(dst.data_ptr(), src.data_ptr(), nbytes)

        out["copy_ref"] = self.interleaved(fn, self.a.comm_rounds, 2, "copy", names=("copy",))["copy"]

    def profile(self, out):
        """CPU per timed run by thread (ms, mean over ranks), the step's parts (ms, median over
        steps, mean over ranks), the machine's idle share (rank 0's view)."""
        n = self.n
        everyone = [None] * n
        self.dist.all_gather_object(everyone, (self.cpu_acc, self.part_acc))
        cpu_ms = {}
        for phase, runs in self.runs.items():
            for name in self.cpu_acc[phase]:
                tot = {}
                for acc, _ in everyone:
                    for who, ns in acc[phase][name].items():
                        tot[who] = tot.get(who, 0) + ns / 1e6 / runs / n
                cpu_ms.setdefault(phase, {})[name] = tot
        out["cpu_ms_per_run"] = cpu_ms
        out["parts_ms"] = {
            phase: {name: [sum(statistics.median(p[i] for p in pa[phase][name]) for _, pa in everyone) / n * 1e3
                           for i in range(6)] for name in d}
            for phase, d in self.part_acc.items()}
        hz = os.sysconf("SC_CLK_TCK")
        ncpu = os.cpu_count() or 1
        # jiffies (10 ms): meaningless over less than half a second of timed runs
        out["idle_share"] = {phase: {name: v[0] / hz / v[1] / ncpu if v[1] >= 0.5 else None for name, v in d.items()}
                             for phase, d in self.idle_acc.items()}

    def run(self):
        a = self.a
        out = dict(np=self.n, kinds=self.kinds, torch=self.torch.__version__, batches=a.batch_list,
                   threads=self.torch.get_num_threads(), omp=os.environ.get("OMP_NUM_THREADS"),
                   tiny_calls=a.tiny_calls)
        self.tiny(out)
        self.models(out)
        for b in a.batch_list:
            self.train(out, b)
        self.check(out)
        self.comm(out)
        self.copy_ref(out)
        self.profile(out)
        carried = all(v["carried"] for v in out["dshim_per_step"].values())
        out["dshim_carried"] = carried
        if self.rank == 0:
            with open(a.json, "w") as f:
                json.dump(out, f)
        for g in list(self.groups.values()) + [self.self_group]:
            self.dist.destroy_process_group(g)
        self.dist.destroy_process_group()
        if not carried or not out["grad_equal"]:
            sys.exit(f"ddp_bench: rank {self.rank}: sanity check failed: dshim per step "
                     f"{out['dshim_per_step']} (need >= {len(self.buckets) + 2} collectives: the buckets and "
                     f"2 barriers); grad max diff {out['grad_max_abs_diff']:.3g} "
                     f"(max |grad| {out['grad_max_abs']:.3g})")


# ================================================================== driver

def med(v):
    return statistics.median(v)


def phases_of(res):
    return [k for k in res if isinstance(res[k], dict) and set(res[k]) == set(NAMES)
            and k not in ("cpu_ms_per_run", "parts_ms", "idle_share", "kinds")]


def summarize(res):
    """Per-job medians (seconds): {"phase.group": value}."""
    s = {f"{k}.{name}": med(res[k][name]) for k in phases_of(res) for name in NAMES}
    s.update({k: med(v) for k, v in res.items() if k.startswith("self@") or k == "copy_ref"})
    return s


def run_job(a, n, rep, log_dir):
    from run_bench import run_json_job
    json_path = os.path.join(log_dir, f"rep{rep}-np{n}.json")
    log_path = os.path.join(log_dir, f"rep{rep}-np{n}.log")
    cmd = [os.path.join(a.build, "bin", "dshim-run"), "--no-preload", "--nproc-per-node", str(n),
           "--master-port", "0", os.path.join(HERE, "ddp_bench.py"), "--worker", "--json", json_path,
           "--steps", str(a.steps), "--warmup", str(a.warmup), "--batch", a.batch,
           "--tiny-calls", str(a.tiny_calls), "--tiny-rounds", str(a.tiny_rounds),
           "--compute-steps", str(a.compute_steps), "--comm-rounds", str(a.comm_rounds),
           "--width", str(a.width), "--depth", str(a.depth), "--classes", str(a.classes), "--lr", str(a.lr)]
    if a.bucket_mb is not None:
        cmd += ["--bucket-mb", str(a.bucket_mb)]
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "LD_PRELOAD")
           and not k.startswith("DSHIM_")}
    # the venv's python through PATH, as `activate` does: DSHIM_RUN_PYTHON=<venv>/bin/python is
    # resolved through its symlink to the base interpreter, which loses the venv's site-packages
    env["PATH"] = os.path.join(a.venv, "bin") + os.pathsep + env.get("PATH", "")
    env["VIRTUAL_ENV"] = a.venv
    env["OMP_NUM_THREADS"] = "1"
    res, wall, quiet = run_json_job(cmd, env, log_path, json_path, a.timeout, a.max_wait,
                                    f"ddp_bench: job rep {rep} np {n}")
    res.update(rep=rep, wall_s=round(wall, 1), quiet=quiet, log=os.path.relpath(log_path, REPO))
    return res


def fmt_ms(s):
    return f"{s * 1e3:.1f} ms"


def fmt_ratio(r, target=None):
    """Two decimals, three where two would hide which side of the target it is on."""
    if target is not None and (round(r, 2) <= target) != (r <= target):
        return f"{r:.3f}"
    return f"{r:.2f}"


def fmt_us(s):
    return f"{s * 1e6:.1f} µs"


class Report:
    def __init__(self, records, meta):
        self.records, self.meta = records, meta
        self.nps = sorted({r["np"] for r in records})
        self.batches = records[0]["batches"]
        self.by = {n: [summarize(r) for r in records if r["np"] == n] for n in self.nps}
        self.verdict = []

    def mm(self, n, key):
        """Median over repetitions of the per-job medians."""
        return med([s[key] for s in self.by[n]])

    def row(self, n, batch, key, label, fmt, target):
        d, g = self.mm(n, f"{key}.dshim"), self.mm(n, f"{key}.gloo")
        r = d / g
        per_rep = [s[f"{key}.dshim"] / s[f"{key}.gloo"] for s in self.by[n]]
        tgt = res = ""
        if target is not None:
            tgt = f"≤ {target}"
            res = "**PASS**" if r <= target else "**FAIL**"
            self.verdict.append((n, batch, label, r, target, r <= target))
        return (f"| {n} | {batch} | {label} | {fmt(d)} | {fmt(g)} | **{fmt_ratio(r, target)}** "
                f"[{min(per_rep):.2f}..{max(per_rep):.2f}] | {tgt} | {res} |")

    def main_table(self):
        lines = ["| N | batch | metric | dshim | gloo | dshim/gloo [range over reps] | target | result |",
                 "|---:|---:|---|---:|---:|---|---:|---|"]
        for n in self.nps:
            for b in self.batches:
                lines.append(self.row(n, b, f"ddp@{b}", "DDP step (fwd + bwd + SGD)", fmt_ms, TARGET_STEP))
            lines.append(self.row(n, "–", "tiny_sync", "all_reduce 1 float32, sync", fmt_us, TARGET_TINY))
            lines.append(self.row(n, "–", "tiny_async", "all_reduce 1 float32, async_op=True + wait()", fmt_us, None))
            for b in self.batches:
                lines.append(self.row(n, b, f"compute@{b}", "the step under no_sync() (no communication)",
                                      fmt_ms, None))
            lines.append(self.row(n, "–", "comm", "all_reduce of DDP's buckets alone", fmt_ms, None))
        return lines

    def split_table(self):
        lines = ["| N | batch | compute only (no_sync) | DDP over a 1-rank group | dshim step | dshim comm part | "
                 "gloo step | gloo comm part | comm part dshim/gloo | buckets alone dshim/gloo |",
                 "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for n in self.nps:
            for b in self.batches:
                c = med([s[f"compute@{b}.{name}"] for s in self.by[n] for name in NAMES])
                d, g = self.mm(n, f"ddp@{b}.dshim"), self.mm(n, f"ddp@{b}.gloo")
                cd, cg = self.mm(n, "comm.dshim"), self.mm(n, "comm.gloo")
                pd, pg = max(d - c, 0.0), max(g - c, 0.0)
                lines.append(f"| {n} | {b} | {fmt_ms(c)} | {fmt_ms(self.mm(n, f'self@{b}'))} | {fmt_ms(d)} | "
                             f"{fmt_ms(pd)} | {fmt_ms(g)} | {fmt_ms(pg)} | "
                             f"{pd / pg if pg else float('nan'):.2f} | {cd / cg:.2f} ({fmt_ms(cd)} / {fmt_ms(cg)}) |")
        return lines

    def reading(self):
        """One line per N and batch: the ratio, its floor (no communication at all), comm-only ratios."""
        out = []
        for n in self.nps:
            for b in self.batches:
                d, g = self.mm(n, f"ddp@{b}.dshim"), self.mm(n, f"ddp@{b}.gloo")
                own = self.mm(n, f"self@{b}")
                c = med([s[f"compute@{b}.{name}"] for s in self.by[n] for name in NAMES])
                cd, cg = self.mm(n, "comm.dshim"), self.mm(n, "comm.gloo")
                floor = own / g
                copies = [s["copy_ref"] for s in self.by[n] if "copy_ref" in s]
                copy_note = (f", while one memcpy of the buckets' {sum(self.records[0]['bucket_bytes']) / 1e6:.0f} MB "
                             f"on every rank at once takes {med(copies) * 1e3:.1f} ms" if copies else "")
                verdict = (f"above {TARGET_STEP}: no backend could pass here, the step is computation plus DDP's "
                           f"own work" if floor > TARGET_STEP else f"under {TARGET_STEP}")
                out.append(f"* N={n}, batch {b}: dshim/gloo **{fmt_ratio(d / g, TARGET_STEP)}**. Floor (DDP over a 1-rank group, no "
                           f"data exchanged, ÷ gloo's step): {fmt_ratio(floor, TARGET_STEP)}, {verdict}. Step − that: dshim "
                           f"{(d - own) * 1e3:+.1f} ms, gloo {(g - own) * 1e3:+.1f} ms; what the target leaves for all "
                           f"communication ({TARGET_STEP} × gloo's step − floor): {(TARGET_STEP * g - own) * 1e3:+.1f} ms"
                           f"{copy_note}. "
                           f"Communication only, dshim/gloo: comm part {max(d - c, 0) / max(g - c, 1e-9):.2f}, "
                           f"buckets alone {cd / cg:.2f}.")
        return out

    def cpu_table(self):
        lines = ["| N | run | group | wall | " + " | ".join(WHO) + " | CPU total | idle | fwd / bwd / opt: wall (main CPU) |",
                 "|---:|---|---|---:|" + "---:|" * len(WHO) + "---:|---:|---|"]
        calls = self.records[0]["tiny_calls"]
        phases = [(f"ddp@{b}", f"DDP step, batch {b}") for b in self.batches]
        phases += [(f"compute@{b}", f"no_sync step, batch {b}") for b in self.batches]
        own = [(f"ddp@{b}", f"DDP over 1 rank, batch {b}") for b in self.batches]
        phases += own
        phases += [("comm", "buckets alone"), ("tiny_sync", f"{calls} tiny sync calls")]
        for n in self.nps:
            recs = [r for r in self.records if r["np"] == n]
            for phase, what in phases:
                for name in NAMES if (phase, what) not in own else ("self",):
                    cpu = [r["cpu_ms_per_run"][phase][name] for r in recs]
                    cells = []
                    for who in WHO:
                        v = med([c.get(who, 0.0) for c in cpu])
                        cells.append(f"{v:.1f}" if v >= 0.05 else "–")
                    total = med([sum(c.values()) for c in cpu])
                    key = f"self@{phase.split('@')[1]}" if name == "self" else f"{phase}.{name}"
                    wall = self.mm(n, key) * (calls if phase.startswith("tiny") else 1)
                    idles = [r["idle_share"][phase][name] for r in recs if r["idle_share"][phase][name] is not None]
                    idle = f"{med(idles) * 100:.0f} %" if idles else "–"
                    parts = ""
                    if phase in recs[0]["parts_ms"]:
                        pm = [med([r["parts_ms"][phase][name][i] for r in recs]) for i in range(6)]
                        parts = " / ".join(f"{pm[i]:.1f} ({pm[i + 3]:.1f})" for i in range(3))
                    lines.append(f"| {n} | {what} | {name} | {fmt_ms(wall)} | " + " | ".join(cells) +
                                 f" | {total:.1f} | {idle} | {parts} |")
        return lines

    def text(self):
        m, first = self.meta, self.records[0]
        bk = first["bucket_bytes"]
        lines = [SECTION, "",
                 "Written by `bench/ddp_bench.py` (`make bench-torch`); do not edit the numbers by hand, re-run it.", "",
                 "```bash", m["command"], "```", "",
                 "| item | value |", "|---|---|",
                 f"| date (UTC) | {m['date']} |",
                 f"| machine | {m['machine']} |",
                 f"| software | torch {first['torch']} (gloo: torch's own, dshim-run --no-preload), dshim commit "
                 f"{m['commit']} |",
                 f"| model | {first['model']}: {first['params'] / 1e6:.2f} M float32 parameters; cross-entropy, "
                 f"SGD with momentum; synthetic data, batch {' and '.join(map(str, self.batches))} per rank |",
                 f"| DDP | the same for both: default buckets (25 MiB, first 1 MiB) → {len(bk)} buckets of "
                 f"{', '.join(f'{b / 2**20:.1f}' for b in bk)} MiB; gradient_as_bucket_view off |",
                 f"| processes | N = {', '.join(map(str, self.nps))} on one host with {m['nproc']} CPUs "
                 f"(N = 4 oversubscribes); OMP_NUM_THREADS=1 and torch.set_num_threads(1) in every rank |",
                 f"| runs | {len({r['rep'] for r in self.records})} repetition(s), one job per repetition and N; "
                 f"{m['steps']} timed steps per group and batch after {m['warmup']} warm-up; tiny: "
                 f"{m['tiny_rounds']} blocks of {m['tiny_calls']} calls per group |",
                 "",
                 "Method: in one job the default group is gloo, and `new_group(backend=\"dshim\")` and "
                 "`new_group(backend=\"gloo\")` span all ranks. Every rank builds the same model twice and wraps "
                 "one copy in DDP over each group. Steps alternate dshim, gloo, dshim, …; each step is timed "
                 "between a barrier on its own group before and after it. A step's time is the max over ranks, "
                 "a job's value the median over its steps; tables give the **median over repetitions** of those "
                 "(ratio range over repetitions in brackets). Tiny: per-call time of blocks of 1-element "
                 "float32 `all_reduce`. Sanity, every job: after the timed steps both models get the same "
                 "parameters and run one more step, and the gradients must agree to 1e-5 of the largest "
                 "(dshim and gloo may sum the ranks in different orders); dshim's own counters "
                 "(`dshim_stats()`) must grow by at least one all_reduce per bucket per DDP step.",
                 ""]
        lines += self.main_table()
        lines += ["", "Sanity per job:", ""]
        for r in self.records:
            per = "; ".join(f"batch {k.split('@')[1]}: {v['collectives']:g} collectives and "
                            f"{v['bytes_sent'] / 1e6:.1f} MB sent per step"
                            for k, v in r["dshim_per_step"].items())
            lines.append(f"* N={r['np']} rep {r['rep']}: gradients max |dshim − gloo| {r['grad_max_abs_diff']:.2g} "
                         f"(max |grad| {r['grad_max_abs']:.2g}: {'equal' if r['grad_equal'] else 'DIFFER'}); "
                         f"dshim {per} ({'carried' if r['dshim_carried'] else 'NOT carried'}; the count includes "
                         f"the 2 timing barriers); job {r['wall_s']} s"
                         f"{'' if r['quiet'] else ', machine busy at start'}")
        lines += ["", "Where a DDP step's time goes: comm part = step − compute only (the same model and batch "
                  "under `no_sync()`), so it holds DDP's own work (gradients copied into and out of the buckets, "
                  "new gradient tensors after `zero_grad()`) as well as the all_reduces; \"DDP over a 1-rank "
                  "group\" is a third copy of the model in DDP over a dshim group of one rank: all of DDP's "
                  "work, no data exchanged; its steps take their turn after each dshim and gloo step, so it "
                  "is the floor of a step measured under the same conditions:", ""]
        lines += self.split_table()
        lines += ["", "Reading (computed from the tables above):", ""]
        lines += self.reading()
        lines += ["", "CPU per timed run by thread (ms, mean over ranks; \"dshim threads\" = libdshim's engine "
                  "(its progress thread), \"dshim completion\" = the plugin's completion thread, \"gloo "
                  "threads\" = the gloo group's, \"other\" = torch's store and the default group); idle = share "
                  "of the machine's CPUs idle meanwhile; CPU counts from before the barrier ahead of a run to after the "
                  "one behind it; a step's parts as wall ms (main thread's CPU ms):", ""]
        lines += self.cpu_table()
        lines.append("")
        if m.get("notes"):
            lines += [m["notes"], ""]
        return "\n".join(lines).rstrip() + "\n"


def replace_section(path, text, section=SECTION):
    """Replaces the section (up to the next '## ' heading) or appends it; the rest stays."""
    old = ""
    if os.path.exists(path):
        with open(path) as f:
            old = f.read()
    lines = old.splitlines(keepends=True)
    start = next((i for i, l in enumerate(lines) if l.rstrip() == section), None)
    if start is None:
        new = old.rstrip("\n") + ("\n\n" if old.strip() else "") + text
    else:
        end = next((j for j in range(start + 1, len(lines)) if lines[j].startswith("## ")), len(lines))
        tail = "".join(lines[end:])
        new = "".join(lines[:start]) + text + ("\n" + tail if tail else "")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(new)
    os.replace(tmp, path)


def driver(a):
    sys.path.insert(0, HERE)
    from run_bench import machine_info
    a.build = os.path.abspath(a.build)
    a.venv = os.path.abspath(a.venv)
    bench_dir = os.path.join(a.build, "bench")
    raw = os.path.join(bench_dir, "ddp_results.jsonl")
    if a.report_only:
        if not os.path.exists(raw):
            sys.exit(f"ddp_bench: no {raw}: run the benchmark first (make bench-torch)")
        with open(raw) as f:
            rows = [json.loads(l) for l in f if l.strip()]
        metas = [r for r in rows if r.get("kind") == "meta"]
        if not metas:
            sys.exit(f"ddp_bench: {raw} holds no run")
        meta = metas[-1]
        records = [r for r in rows if r.get("run_id") == meta["run_id"] and r.get("kind") != "meta"]
        if not records:
            sys.exit(f"ddp_bench: the latest run in {raw} ({meta['run_id']}) has no finished job")
    else:
        for exe in (os.path.join(a.build, "bin", "dshim-run"), os.path.join(a.venv, "bin", "python")):
            if not os.access(exe, os.X_OK):
                sys.exit(f"ddp_bench: {exe} is missing: run `make setup build` first")
        run_id = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ") + f"-{os.getpid()}"
        log_dir = os.path.join(bench_dir, "logs", "ddp-" + run_id)
        os.makedirs(log_dir, exist_ok=True)
        m = machine_info()
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
        meta = dict(kind="meta", run_id=run_id, commit=commit, nproc=m["nproc"],
                    machine=f"{m['nproc']} CPUs, {m['cpu']}, {m['memory']} RAM, kernel {m['kernel']}",
                    date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
                    command=f"cd {REPO} && {py} bench/ddp_bench.py {shlex.join(sys.argv[1:])}",
                    steps=a.steps, warmup=a.warmup, tiny_calls=a.tiny_calls, tiny_rounds=a.tiny_rounds,
                    notes=a.notes)
        records = []
        with open(raw, "a") as f:
            f.write(json.dumps(meta) + "\n")
        for rep in range(1, a.reps + 1):
            for n in a.np_list:
                res = run_job(a, n, rep, log_dir)
                res["run_id"] = run_id
                records.append(res)
                with open(raw, "a") as f:
                    f.write(json.dumps(res) + "\n")
                s = summarize(res)
                steps = ", ".join(f"batch {b} {fmt_ms(s[f'ddp@{b}.dshim'])} vs {fmt_ms(s[f'ddp@{b}.gloo'])} "
                                  f"({s[f'ddp@{b}.dshim'] / s[f'ddp@{b}.gloo']:.2f})" for b in a.batch_list)
                print(f"  np {n} rep {rep}: DDP step dshim vs gloo: {steps}; tiny {fmt_us(s['tiny_sync.dshim'])} vs "
                      f"{fmt_us(s['tiny_sync.gloo'])} ({s['tiny_sync.dshim'] / s['tiny_sync.gloo']:.2f}); "
                      f"buckets alone {fmt_ms(s['comm.dshim'])} vs {fmt_ms(s['comm.gloo'])}", flush=True)
    if a.notes:
        meta["notes"] = a.notes
    rep = Report(records, meta)
    text = rep.text()
    replace_section(a.out, text)
    print(text)
    print(f"wrote section '{SECTION}' of {a.out}: " +
          "; ".join(f"N={n} batch {b} {label}: {fmt_ratio(r, t)} ({'PASS' if ok else 'FAIL'} ≤ {t})"
                    for n, b, label, r, t, ok in rep.verdict))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", action="store_true", help="run as one rank (started by dshim-run)")
    ap.add_argument("--json", help="worker: rank 0 writes its results here")
    ap.add_argument("--np", default="2,4", help="driver: process counts (default 2,4)")
    ap.add_argument("--reps", type=int, default=3, help="driver: repetitions (default 3)")
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--venv", default=os.path.join(REPO, ".venv"))
    ap.add_argument("--out", default=os.path.join(REPO, "docs", "benchmarks.md"))
    ap.add_argument("--report-only", action="store_true", help="rewrite the section from the latest raw run")
    ap.add_argument("--notes", default="", help="a paragraph added under the tables")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per job (default 900)")
    ap.add_argument("--max-wait", type=float, default=120.0,
                    help="seconds to wait for a quiet machine before each job (default 120)")
    ap.add_argument("--steps", type=int, default=25, help="timed DDP steps per group and batch (default 25)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", default="32,8", help="samples per rank and step, comma-separated (default 32,8)")
    ap.add_argument("--tiny-calls", type=int, default=50, help="calls per tiny block (default 50)")
    ap.add_argument("--tiny-rounds", type=int, default=20, help="tiny blocks per group (default 20)")
    ap.add_argument("--compute-steps", type=int, default=10)
    ap.add_argument("--comm-rounds", type=int, default=15)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=10)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--bucket-mb", type=float, default=None,
                    help="DDP bucket_cap_mb for both (default: DDP's own, 25 MiB with a 1 MiB first bucket)")
    ap.add_argument("--lr", type=float, default=0.01)
    a = ap.parse_args()
    try:
        a.batch_list = [int(x) for x in a.batch.split(",") if x]
        a.np_list = [int(x) for x in a.np.split(",") if x]
    except ValueError:
        ap.error(f"--batch {a.batch!r} / --np {a.np!r}: want comma-separated integers, e.g. 32,8 and 2,4")
    if not a.batch_list or min(a.batch_list) < 1 or not a.np_list or min(a.np_list) < 2:
        ap.error("--batch needs sizes >= 1 and --np process counts >= 2")
    if a.worker:
        if not a.json:
            ap.error("--worker needs --json")
        return Worker(a).run()
    return driver(a)


if __name__ == "__main__":
    sys.exit(main())

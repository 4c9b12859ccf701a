#!/usr/bin/env python3
"""torch.distributed gloo allreduce benchmark, the PyTorch reference for
bench/run_bench.py.

The launcher (no --worker) starts NP copies of this script with subprocess,
one per rank, with RANK/WORLD_SIZE/MASTER_ADDR=127.0.0.1/MASTER_PORT,
GLOO_SOCKET_IFNAME=lo and OMP_NUM_THREADS=1 in their environment.  Run it with
the Python that has torch (the project's .venv):

    .venv/bin/python bench/gloo_bench.py --np 2 --sizes 4K,1M -j out.jsonl

Method, shared with dshim-bench and bench/mpi_bench.c: per size one
correctness check (rank+1 values), warm-up of at least 5 iterations and
0.2 s, then iters = max(5, ceil(min_time / t_warm)) capped at 10000 (rank 0
decides and broadcasts); per-iteration time = max over ranks (the time
vectors are all-reduced with MAX); reported time = median over iterations;
algbw = bytes / time, busbw = algbw * 2(n-1)/n.  Buffers hold zeros while
timed, so repeated SUMs neither overflow nor produce denormals.

Rank 0 appends one JSON object per size to the -j file:
  {"impl":"gloo","transport":"tcp","np":2,"op":"allreduce","dtype":"float32",
   "bytes":4096,"iters":K,"time_us":MEDIAN,"min_us":MIN,"algbw":..,"busbw":..,
   "init_us":..,"init_span_us":..,"init_min_us":..}
init_us is init_process_group's duration, max over ranks (init_min_us: min);
init_span_us the span from the first rank's call to the last rank's return
(time.monotonic is CLOCK_MONOTONIC, one clock for every process of a host), as dshim-bench and
bench/mpi_bench.c measure their own start-up.  --barrier first times
dist.barrier() the same way (one object with op "barrier", bytes 0).
"""
import argparse
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import threading
import time

MIN_ITERS = 5
MAX_ITERS = 10000
WARM_MIN_S = 0.2
UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text):
    """'4K' -> 4096; plain integers are bytes."""
    t = text.strip().upper()
    mult = UNITS.get(t[-1:], 1)
    if mult != 1:
        t = t[:-1]
    value = int(t) * mult
    if value < 4 or value % 4:
        raise ValueError(f"size {text!r} must be a positive multiple of 4 bytes (float32)")
    return value


def free_port():
    # Port 0 lets the kernel pick; the small race until rank 0 binds it is
    # acceptable on a benchmark machine, and the launcher reports a failure.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args):
    port = free_port()
    procs = []
    for rank in range(args.np):
        env = dict(os.environ)
        env.update(RANK=str(rank), WORLD_SIZE=str(args.np), LOCAL_RANK=str(rank),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
        cmd = [sys.executable, os.path.abspath(__file__), "--worker",
               "--sizes", args.sizes, "--min-time", str(args.min_time),
               "--timeout", str(args.timeout)] + (["--barrier"] if args.barrier else [])
        if args.json:
            cmd += ["-j", os.path.abspath(args.json)]
        procs.append(subprocess.Popen(cmd, env=env))
    live = {p.pid: p for p in procs}
    timed_out = threading.Event()

    def on_deadline():
        timed_out.set()
        print(f"gloo_bench: timed out after {args.timeout:.0f} s; killing the ranks",
              file=sys.stderr)
        for q in list(live.values()):
            q.kill()

    timer = threading.Timer(args.timeout, on_deadline)
    timer.daemon = True
    timer.start()
    rc = 0
    # Block in wait() instead of polling: a launcher waking up every few ms
    # would steal wake-ups from the ranks it measures.  If any rank dies the
    # others would block in a collective until gloo's own timeout, so they
    # are stopped at once.
    while live:
        pid, status = os.wait()
        if pid not in live:
            continue
        live.pop(pid).returncode = code = os.waitstatus_to_exitcode(status)
        if code != 0 and rc == 0:  # the first failure; the rest are our kills
            rc = code if code > 0 else 1
            if not timed_out.is_set():
                print(f"gloo_bench: a rank exited with status {code}; stopping the others",
                      file=sys.stderr)
            for q in live.values():
                q.kill()
    timer.cancel()
    return 124 if timed_out.is_set() else rc


def bench_size(dist, torch, size, rank, n, min_time):
    count = size // 4
    chk = torch.full((count,), float(rank + 1), dtype=torch.float32)
    dist.all_reduce(chk, op=dist.ReduceOp.SUM)
    want = n * (n + 1) / 2
    if not bool(torch.all(chk == want)):
        raise SystemExit(f"gloo_bench: rank {rank}: wrong allreduce result at {size} bytes")
    del chk
    buf = torch.zeros(count, dtype=torch.float32)
    tl = time_op(dist, torch, lambda: dist.all_reduce(buf, op=dist.ReduceOp.SUM), min_time)
    med = statistics.median(tl)
    algbw = size / med / 1e9
    return dict(impl="gloo", transport="tcp", np=n, op="allreduce", dtype="float32",
                bytes=size, iters=len(tl), time_us=round(med * 1e6, 3),
                min_us=round(min(tl) * 1e6, 3), algbw=algbw,
                busbw=algbw * 2.0 * (n - 1) / n)


def time_op(dist, torch, op, min_time):
    """Seconds per call of op(): warm-up until rank 0's clock says enough, iterations from rank 0's
    estimate, and each iteration's time as its slowest rank saw it (max over ranks)."""
    dist.barrier()
    t0 = time.perf_counter()
    warm = 0
    flag = torch.zeros(1, dtype=torch.int32)
    while True:
        op()
        warm += 1
        # rank 0's clock decides so every rank leaves the loop together
        flag[0] = 1 if (warm >= MIN_ITERS and time.perf_counter() - t0 >= WARM_MIN_S) else 0
        dist.broadcast(flag, src=0)
        if flag.item():
            break
    t_warm = (time.perf_counter() - t0) / warm
    it = torch.tensor([min(MAX_ITERS, max(MIN_ITERS, math.ceil(min_time / t_warm)))],
                      dtype=torch.int64)
    dist.broadcast(it, src=0)
    iters = int(it.item())

    times = torch.zeros(iters, dtype=torch.float64)
    dist.barrier()
    for i in range(iters):
        s = time.perf_counter()
        op()
        times[i] = time.perf_counter() - s
    # an iteration is done only when its slowest rank is done
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    return times.tolist()


def bench_barrier(dist, torch, n, min_time):
    """dist.barrier() timed like one allreduce size."""
    tl = time_op(dist, torch, dist.barrier, min_time)
    return dict(impl="gloo", transport="tcp", np=n, op="barrier", bytes=0, iters=len(tl),
                time_us=round(statistics.median(tl) * 1e6, 3), min_us=round(min(tl) * 1e6, 3))


def work(args):
    import datetime

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    n = int(os.environ["WORLD_SIZE"])
    t0 = time.monotonic()
    dist.init_process_group("gloo", rank=rank, world_size=n,
                            timeout=datetime.timedelta(seconds=args.timeout))
    t1 = time.monotonic()
    # start-up cost, measured as dshim-bench measures dshim_comm_init_env
    init = torch.tensor([t1 - t0, -t0, t1, t0 - t1], dtype=torch.float64)
    dist.all_reduce(init, op=dist.ReduceOp.MAX)
    init_rec = dict(init_us=round(float(init[0]) * 1e6, 1),
                    init_span_us=round(float(init[2] + init[1]) * 1e6, 1),
                    init_min_us=round(-float(init[3]) * 1e6, 1))
    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    if rank == 0:
        print(f"# gloo allreduce float32 sum, np={n}, torch {torch.__version__}", flush=True)
        print(f"# init: init_process_group {init_rec['init_us']:.1f} us (max over ranks), first call "
              f"to last return {init_rec['init_span_us']:.1f} us", flush=True)
        print(f"{'bytes':>12} {'iters':>6} {'time_us':>12} {'min_us':>12} {'algbw':>10} {'busbw':>10}",
              flush=True)
    if args.barrier:
        rec = bench_barrier(dist, torch, n, args.min_time)
        rec.update(init_rec)
        if rank == 0:
            print(f"{'barrier':>12} {rec['iters']:>6} {rec['time_us']:>12.1f} {rec['min_us']:>12.1f}",
                  flush=True)
            if args.json:
                with open(args.json, "a") as f:
                    f.write(json.dumps(rec) + "\n")
    for size in sizes:
        rec = bench_size(dist, torch, size, rank, n, args.min_time)
        rec.update(init_rec)
        if rank == 0:
            print(f"{size:>12} {rec['iters']:>6} {rec['time_us']:>12.1f} {rec['min_us']:>12.1f} "
                  f"{rec['algbw']:>10.3f} {rec['busbw']:>10.3f}", flush=True)
            if args.json:
                # one line per size, written at once, so a later crash keeps
                # the sizes that finished
                with open(args.json, "a") as f:
                    f.write(json.dumps(rec) + "\n")
    dist.barrier()
    dist.destroy_process_group()
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--np", type=int, default=2, help="number of ranks (processes)")
    ap.add_argument("--sizes", default="4K,64K,1M,16M,64M,256M",
                    help="comma-separated buffer sizes in bytes, K/M/G suffixes allowed")
    ap.add_argument("-j", "--json", default=None, help="append one JSON line per size here")
    ap.add_argument("-t", "--min-time", type=float, default=1.0,
                    help="timed seconds per size (iteration count is derived from it)")
    ap.add_argument("--timeout", type=float, default=600.0,
                    help="seconds before the launcher kills every rank")
    ap.add_argument("--barrier", action="store_true",
                    help="before the sizes, time dist.barrier() the same way (op barrier, bytes 0)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    for s in args.sizes.split(","):
        if s.strip():
            try:
                parse_size(s)
            except ValueError as e:
                ap.error(str(e))
    if args.np < 1:
        ap.error("--np must be at least 1")
    sys.exit(work(args) if args.worker else launch(args))


if __name__ == "__main__":
    main()

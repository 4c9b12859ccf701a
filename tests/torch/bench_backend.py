"""all_reduce through the "dshim" torch backend vs gloo, interleaved in one job.

    .venv/bin/python tests/torch/bench_backend.py [--np 2] [--rounds 10]

Every rank runs both groups (the default "dshim" group and a gloo new_group over
the same ranks) and alternates between them in blocks, so machine noise hits
both alike.  Prints the median per-call time over the rounds, from rank 0.
sync = dist.all_reduce(t); async = dist.all_reduce(t, async_op=True).wait().
"""
import argparse
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

CASES = [(1, 2000), (1 << 18, 200), (1 << 22, 20)]   # float32 elements (4 B, 1 MiB, 16 MiB), calls per block


def worker(rank, n, port, rounds):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    import dshim  # noqa: F401  (registration without relying on autoload)
    dist.init_process_group("dshim", rank=rank, world_size=n)
    groups = {"dshim": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    res = {}
    for elems, calls in CASES:
        t = torch.ones(elems)
        for g in groups.values():
            for _ in range(max(calls // 10, 3)):
                dist.all_reduce(t, group=g)
        for _ in range(rounds):
            for name, g in groups.items():
                for mode in ("sync", "async"):
                    dist.barrier(group=g)
                    t0 = time.perf_counter()
                    if mode == "sync":
                        for _ in range(calls):
                            dist.all_reduce(t, group=g)
                    else:
                        for _ in range(calls):
                            dist.all_reduce(t, group=g, async_op=True).wait()
                    res.setdefault((elems, mode, name), []).append((time.perf_counter() - t0) / calls)
    if rank == 0:
        print(f"all_reduce float32, {n} processes on one host, median of {rounds} interleaved rounds")
        print(f"{'bytes':>10} {'mode':>5} {'dshim us':>10} {'gloo us':>10} {'dshim/gloo':>10}")
        for elems, _ in CASES:
            for mode in ("sync", "async"):
                d = statistics.median(res[(elems, mode, "dshim")]) * 1e6
                g = statistics.median(res[(elems, mode, "gloo")]) * 1e6
                print(f"{elems * 4:>10} {mode:>5} {d:>10.1f} {g:>10.1f} {d / g:>10.2f}")
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=10)
    a = ap.parse_args()
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    mp.spawn(worker, args=(a.np, port, a.rounds), nprocs=a.np)


if __name__ == "__main__":
    sys.exit(main())

"""One rank of an nccl-tests-style all_reduce sweep on CUDA tensors (2 ranks on one GPU); started by scripts/gpu_checks.sh, one process per rank, all on cuda:0.

    RANK=r WORLD_SIZE=n MASTER_ADDR=... MASTER_PORT=... python3 gpu_allreduce_sweep.py \
        --backend nccl|dshim [--max-mib 256] [--out table.txt]

--backend nccl is torch's ProcessGroupNCCL: run it under LD_PRELOAD=libdshim.so with
DSHIM_TAKEOVER=0 to measure dshim's NCCL API (real NCCL refuses two ranks on one GPU).
--backend dshim is the python/dshim plugin (CUDA tensors staged through host memory).

Per size (float32 sum, in place, sizes x4 from 1 KiB): one all_reduce checked against the
expected sum, then a timed loop; time = the slowest rank's.  algbw = bytes / time, busbw = algbw *
2 (n - 1) / n (nccl-tests' definition for all_reduce).  Rank 0 prints the table (and writes --out).
"""
import argparse
import faulthandler
import os
import sys
import time

import torch
import torch.distributed as dist


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--backend", required=True, choices=["nccl", "dshim"])
    p.add_argument("--max-mib", type=int, default=256)
    p.add_argument("--out")
    args = p.parse_args()
    # a stuck size shows where it is stuck (the step's timeout would kill it silently)
    faulthandler.dump_traceback_later(60, repeat=True, file=sys.stderr)
    dev = torch.device("cuda", 0)  # every rank on the one GPU
    torch.cuda.set_device(dev)
    if args.backend == "dshim":
        import dshim  # noqa: F401  (registers the backend when the entry point is not installed)
        dist.init_process_group("dshim")
    else:
        dist.init_process_group("nccl", device_id=dev)
    rank, n = dist.get_rank(), dist.get_world_size()
    lines = [f"all_reduce sweep: backend {args.backend}, {n} ranks on one GPU "
             f"({torch.cuda.get_device_name(dev)}), float32 sum in place, torch {torch.__version__}",
             f"{'bytes':>12} {'count':>11} {'time_us':>11} {'algbw_GB/s':>11} {'busbw_GB/s':>11} {'check':>6}"]
    bad = 0
    size = 1024
    while size <= args.max_mib << 20:
        count = size // 4
        x = torch.full((count,), float(rank + 1), device=dev)
        dist.all_reduce(x)
        ok = bool(torch.all(x == n * (n + 1) / 2).item())
        bad += not ok
        x.zero_()
        iters = max(5, min(200, (256 << 20) // size))
        for _ in range(2):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        t = torch.tensor([(time.perf_counter() - t0) / iters], device=dev, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        sec = t.item()
        algbw = size / sec / 1e9
        busbw = algbw * 2 * (n - 1) / n
        lines.append(f"{size:>12} {count:>11} {sec * 1e6:>11.1f} {algbw:>11.2f} {busbw:>11.2f} "
                     f"{'ok' if ok else 'WRONG':>6}")
        if rank == 0:
            print(lines[-1] if len(lines) > 3 else "\n".join(lines), flush=True)
        size *= 4
    if rank == 0 and args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    dist.barrier()
    dist.destroy_process_group()
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()

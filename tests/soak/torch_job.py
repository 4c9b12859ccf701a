"""Soak job (torch): an all_reduce loop whose every result is checked.

Run under dshim-run (which preloads libdshim.so, so the takeover carries the gloo group):
    dshim-run --nproc-per-node 3 torch_job.py OUT --steps 40 [--sleep 0.02]
Step s: rank r contributes x = (r+1)*(s+1) + arange(n) % 7 (float32, small integers: the sum is exact
in any order); the result must be WORLD*(WORLD+1)/2*(s+1) + WORLD*(arange(n) % 7).  Rank r writes
OUT/ready_rank<r> after its first all_reduce and OUT/ok_rank<r> at the end; exits 3 on a wrong result.
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--steps", type=int, default=40)
p.add_argument("--sleep", type=float, default=0.02)
p.add_argument("--numel", type=int, default=4099)
args = p.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
pattern = (torch.arange(args.numel) % 7).to(torch.float32)
for step in range(args.steps):
    x = pattern + float((rank + 1) * (step + 1))
    dist.all_reduce(x)
    want = pattern * world + float(world * (world + 1) // 2 * (step + 1))
    if not torch.equal(x, want):
        bad = (x != want).nonzero()[0].item()
        print("rank %d step %d: WRONG all_reduce result at %d: %r, want %r"
              % (rank, step, bad, x[bad].item(), want[bad].item()), file=sys.stderr, flush=True)
        sys.exit(3)
    if step == 0:
        open(os.path.join(args.out, "ready_rank%d" % rank), "w").write(str(os.getpid()))
    if args.sleep:
        time.sleep(args.sleep)
# one more check that spans every rank: the steps each rank completed
n = torch.tensor([float(args.steps)])
dist.all_reduce(n)
if n.item() != args.steps * world:
    print("rank %d: WRONG step count %r" % (rank, n.item()), file=sys.stderr, flush=True)
    sys.exit(3)
carrier = type(dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))).__name__
open(os.path.join(args.out, "ok_rank%d" % rank), "w").write(carrier)
print("rank %d of %d: %d all_reduce steps correct (group carried by %s)" % (rank, world, args.steps, carrier),
      flush=True)
dist.destroy_process_group()

"""A training loop with rank-dependent code: the kind of bug that hangs or derails real jobs.

Rank 1's shard is shorter: it runs out of batches after step 3.  What happens next depends on what the
script does then (nothing here knows about dshim; docs/observability.md shows what dshim-run reports):

  default          rank 1 leaves the loop and starts its end-of-epoch evaluation (60 s of work with no
                   collective) while the others are in step 4's backward, waiting in DDP's gradient
                   all_reduce: a hang until the timeout.
  --mismatch       the loss is all-reduced for logging only by ranks whose batch was not empty; rank 1
                   skips it and goes on to DDP's gradient all_reduce: the ranks issue different
                   collectives at the same point.

    DSHIM_TIMEOUT=5 dshim-run --nproc-per-node 3 examples/observability/hang.py [--mismatch]
"""
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    mismatch = "--mismatch" in sys.argv
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = 4 if rank == 1 else 8                          # rank 1's shard is shorter
    for step in range(8):
        if step >= batches and not mismatch:
            break                                            # rank 1: out of data, off to evaluation
        n = 32 if step < batches else 1
        x, y = torch.randn(n, 64), torch.randint(0, 10, (n,))
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if mismatch and step < batches:                      # the bug: a collective under a rank-dependent if
            dist.all_reduce(loss.detach())
        if rank == 0:
            print(f"step {step} done", flush=True)
    time.sleep(60)                                           # "evaluation": no collective for a minute
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

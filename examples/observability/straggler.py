"""DDP training where one rank is slow (its data loading takes 0.3 s more per step), for
`dshim-run --status` and the timeline (docs/observability.md):

    dshim-run --nproc-per-node 3 --timeline /tmp/straggler.json examples/observability/straggler.py
    dshim-run --status            # from another shell while it runs
"""
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    steps = int(os.environ.get("STEPS", "40"))
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                              nn.Linear(1024, 10)), bucket_cap_mb=2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(steps):
        if rank == 2:
            time.sleep(0.3)                                  # a slow data loader on this rank
        x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    if rank == 0:
        print(f"{steps} steps done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""A training loop with a rank-dependent collective: the kind of bug that hangs real jobs.

Each rank all-reduces its loss for logging, but only when its own batch was not empty; rank 1 runs
out of data at step 4 (an uneven shard) and skips the all_reduce, while the others wait in it.
Nothing here knows about dshim (docs/observability.md walks through what dshim-run reports):

    DSHIM_TIMEOUT=5 dshim-run --nproc-per-node 3 examples/observability/hang.py
"""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(10):
        batch = 0 if (rank == 1 and step >= 4) else 32      # rank 1's shard is shorter
        x, y = torch.randn(max(batch, 1), 64), torch.randint(0, 10, (max(batch, 1),))
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if batch:                                            # the bug: a collective under a rank-dependent if
            dist.all_reduce(loss.detach())
        if rank == 0:
            print(f"step {step} done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

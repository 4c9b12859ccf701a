"""A plain PyTorch DDP training script, written the way users write them.

Nothing in it knows about dshim: run it with torchrun, with dshim-run, with
backend gloo or backend "dshim".  Small CNN on synthetic data,
DistributedSampler, BatchNorm (SyncBatchNorm on CUDA), gradient accumulation
with no_sync(), a checkpoint of model.module on rank 0 behind a barrier, and
metrics all-reduced across ranks.

    torchrun  --nproc-per-node 2 examples/ddp_train.py --steps 50
    dshim-run --nproc-per-node 2 examples/ddp_train.py --steps 50
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class SmallCNN(nn.Module):
    def __init__(self, width=16, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(2 * width)
        self.fc = nn.Linear(2 * width * 8 * 8, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return self.fc(x.flatten(1))


def synthetic_data(n=2048, seed=1234):
    # each class is a fixed random pattern under noise: learnable, so the loss visibly falls
    g = torch.Generator().manual_seed(seed)
    patterns = torch.randn(10, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    x = 0.5 * patterns[y] + torch.randn(n, 3, 32, 32, generator=g)
    return TensorDataset(x, y)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--backend", default=None, help="gloo, nccl, dshim; default: torch's choice")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--accum", type=int, default=2, help="micro-batches per optimizer step (no_sync)")
    p.add_argument("--checkpoint", default=None, help="file for model.module's state_dict (rank 0)")
    p.add_argument("--save-params", default=None, help="write the final parameters here (rank 0)")
    args = p.parse_args()

    dist.init_process_group(backend=args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    cuda = torch.cuda.is_available() and dist.get_backend() != "gloo"
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)

    torch.manual_seed(0)  # the same initial weights everywhere (DDP also broadcasts them)
    model = SmallCNN().to(device)
    if cuda:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    ddp = DDP(model, device_ids=[local_rank] if cuda else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.002, momentum=0.9)

    data = synthetic_data()
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=7)
    loader = DataLoader(data, batch_size=args.batch, sampler=sampler, drop_last=True)

    step, epoch, t0 = 0, 0, time.time()
    while step < args.steps:
        sampler.set_epoch(epoch)
        batches = iter(loader)
        for _ in range(len(loader) // args.accum):
            if step >= args.steps:
                break
            opt.zero_grad()
            loss_sum = torch.zeros((), device=device)
            for micro in range(args.accum):
                x, y = next(batches)
                x, y = x.to(device), y.to(device)
                last = micro == args.accum - 1
                ctx = ddp.no_sync() if not last else torch.enable_grad()
                with ctx:
                    loss = F.cross_entropy(ddp(x), y) / args.accum
                    loss.backward()
                loss_sum += loss.detach()
            opt.step()
            # the metric every rank reports is the mean over ranks
            metric = loss_sum.clone()
            dist.all_reduce(metric, op=dist.ReduceOp.SUM)
            metric /= world
            if rank == 0 and (step % 10 == 0 or step == args.steps - 1):
                print(f"step {step:3d} loss {metric.item():.4f}", flush=True)
            step += 1
        epoch += 1

    if args.checkpoint:
        if rank == 0:
            torch.save(ddp.module.state_dict(), args.checkpoint)
        dist.barrier()  # nobody reads or exits before the checkpoint exists
    if args.save_params and rank == 0:
        torch.save({k: v.detach().cpu() for k, v in ddp.module.state_dict().items()}, args.save_params)
    if rank == 0:
        print(f"done: {args.steps} steps on {world} ranks, backend {dist.get_backend()}, "
              f"{time.time() - t0:.1f} s", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""What test_hvd_training.py runs as each rank: `hvd_train_worker.py MODE [options]`.

train --impl hvd|ddp --variant V --out F
    The same small MLP trained on the same synthetic data, each rank on its own contiguous
    share of every global batch, by Horovod (hvd.DistributedOptimizer + broadcast_parameters,
    on dshim) or by torch DDP on gloo (the reference; rank 0's initial weights win in both).
    Variants: plain (SGD with momentum), adam, groups (groups=2), predivide
    (gradient_predivide_factor=2), accum (two backward passes per step: Horovod's
    backward_passes_per_step=2, DDP's no_sync), fp16 (Compression.fp16; DDP's
    fp16_compress_hook).  Rank 0 writes the final state_dict to F.
optstate
    broadcast_optimizer_state restores an Adam state: rank 0 loads a trained Adam's state_dict,
    every other rank starts fresh with other options; after the broadcast every rank's state
    and options equal rank 0's, and one more step keeps the parameters equal everywhere.
syncbn --device cpu|cuda
    hvd.SyncBatchNorm.  cpu: training on CPU input raises Horovod's ValueError (torch's
    synchronized batch-norm kernels are CUDA-only).  cuda: each rank normalizes its own uneven
    share of a batch; outputs, running statistics and gradients equal torch's BatchNorm1d over
    the whole batch; eval mode uses the running statistics.
elastic
    hvd.elastic.run with TorchState (model, DistributedOptimizer, ElasticSampler, a plain value):
    a simulated HorovodInternalError restores the last commit and re-initializes Horovod; a host
    update that only rank 0 receives interrupts every rank at the same commit.

Each mode prints `OK <mode> rank R` on success; any failure raises (non-zero exit).
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

STEPS = 6
PER_RANK = 8          # samples per rank per micro-batch
D_IN, HIDDEN, D_OUT = 12, 16, 5


def model_for(rank):
    # different initial weights on every rank: only the broadcast (Horovod) or DDP's
    # construction makes them rank 0's
    torch.manual_seed(100 + rank)
    return nn.Sequential(nn.Linear(D_IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, D_OUT))


def global_batches(world, micro):
    """STEPS x micro global batches of world*PER_RANK samples, the same on every rank."""
    g = torch.Generator().manual_seed(1234)
    n = world * PER_RANK
    return [[(torch.randn(n, D_IN, generator=g), torch.randn(n, D_OUT, generator=g))
             for _ in range(micro)] for _ in range(STEPS)]


def share(batch, rank):
    x, y = batch
    return x[rank * PER_RANK:(rank + 1) * PER_RANK], y[rank * PER_RANK:(rank + 1) * PER_RANK]


def make_optimizer(variant, params):
    if variant == "adam":
        return torch.optim.Adam(params, lr=0.01)
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


def train_hvd(variant):
    import horovod.torch as hvd
    hvd.init()
    rank, world = hvd.rank(), hvd.size()
    model = model_for(rank)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = make_optimizer(variant, model.parameters())
    kw = {}
    if variant == "groups":
        kw["groups"] = 2
    elif variant == "predivide":
        kw["gradient_predivide_factor"] = 2.0
    elif variant == "accum":
        kw["backward_passes_per_step"] = 2
    elif variant == "fp16":
        kw["compression"] = hvd.Compression.fp16
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), **kw)
    micro = 2 if variant == "accum" else 1
    for step in global_batches(world, micro):
        opt.zero_grad()
        for batch in step:
            x, y = share(batch, rank)
            F.mse_loss(model(x), y).backward()
        opt.step()
    return rank, model.state_dict(), hvd


def train_ddp(variant):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ddp = DDP(model_for(rank))
    if variant == "fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    opt = make_optimizer(variant, ddp.parameters())
    micro = 2 if variant == "accum" else 1
    for step in global_batches(world, micro):
        opt.zero_grad()
        for i, batch in enumerate(step):
            x, y = share(batch, rank)
            if i < micro - 1:
                with ddp.no_sync():
                    F.mse_loss(ddp(x), y).backward()
            else:
                F.mse_loss(ddp(x), y).backward()
        opt.step()
    state = ddp.module.state_dict()
    dist.barrier()
    dist.destroy_process_group()
    return rank, state


def mode_train(args):
    if args.impl == "hvd":
        rank, state, hvd = train_hvd(args.variant)
        # every rank ends with rank 0's parameters
        for name, t in state.items():
            gathered = hvd.allgather(t.unsqueeze(0), name="final." + name)
            for r in range(gathered.shape[0]):
                assert torch.equal(gathered[r], t), f"rank {r}'s {name} differs from rank {rank}'s"
    else:
        rank, state = train_ddp(args.variant)
    if rank == 0:
        torch.save(state, args.out)
    print(f"OK train {args.impl} {args.variant} rank {rank}", flush=True)


def mode_optstate(args):
    import horovod.torch as hvd
    hvd.init()
    rank = hvd.rank()
    model = model_for(rank)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

    if rank == 0:
        # rank 0 alone trains a plain Adam a few steps: the state to restore everywhere
        trained = torch.optim.Adam(model.parameters(), lr=0.02, betas=(0.8, 0.95))
        for x, y in [share(b[0], 0) for b in global_batches(1, 1)[:3]]:
            trained.zero_grad()
            F.mse_loss(model(x), y).backward()
            trained.step()
        saved = trained.state_dict()

    opt = torch.optim.Adam(model.parameters(), lr=0.5 if rank else 0.02,
                           betas=(0.5, 0.5) if rank else (0.8, 0.95))
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    if rank == 0:
        opt.load_state_dict(saved)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)

    mine = opt.state_dict()
    root = hvd.broadcast_object(mine, root_rank=0, name="root_state")
    assert len(mine["state"]) == len(root["state"]) == 4, (len(mine["state"]), len(root["state"]))
    for pid, st in root["state"].items():
        for key, value in st.items():
            got = mine["state"][pid][key]
            assert type(got) is type(value), (pid, key, type(got), type(value))
            assert torch.equal(got, value) if torch.is_tensor(value) else got == value, (pid, key)
    assert float(mine["state"][0]["step"]) == 3.0, mine["state"][0]["step"]
    for key in ("lr", "betas", "eps", "weight_decay", "amsgrad"):
        assert mine["param_groups"][0][key] == root["param_groups"][0][key], key
    assert opt.param_groups[0]["lr"] == 0.02 and opt.param_groups[0]["betas"] == (0.8, 0.95)

    x, y = share(global_batches(hvd.size(), 1)[4][0], rank)
    opt.zero_grad()
    F.mse_loss(model(x), y).backward()
    opt.step()
    for name, t in model.state_dict().items():
        gathered = hvd.allgather(t.unsqueeze(0), name="after." + name)
        assert all(torch.equal(gathered[r], t) for r in range(gathered.shape[0])), name
    print(f"OK optstate rank {rank}", flush=True)


def mode_syncbn(args):
    import horovod.torch as hvd
    hvd.init()
    rank, world = hvd.rank(), hvd.size()

    bn = hvd.SyncBatchNorm(num_features=3)
    if args.device == "cpu":
        # torch's synchronized batch-norm kernels are CUDA-only: Horovod refuses CPU training input
        try:
            bn(torch.randn(4, 3))
            raise AssertionError("SyncBatchNorm accepted a CPU tensor in training mode")
        except ValueError as e:
            assert str(e) == "SyncBatchNorm expected input tensor to be on GPU", str(e)
        print(f"OK syncbn cpu rank {rank}", flush=True)
        return

    dev = torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())
    bn = bn.to(dev)
    ref = nn.BatchNorm1d(3).to(dev)
    with torch.no_grad():
        for m in (bn, ref):
            m.weight.copy_(torch.tensor([1.5, 0.5, -1.0]))
            m.bias.copy_(torch.tensor([0.1, -0.2, 0.3]))

    # uneven shares (rank r has r + 2 samples): the counts weigh the statistics
    g = torch.Generator().manual_seed(7)
    counts = [r + 2 for r in range(world)]
    full = (torch.randn(sum(counts), 3, 4, generator=g) * 3 + 1).to(dev)
    start = sum(counts[:rank])
    mine = full[start:start + counts[rank]].clone().requires_grad_()
    everything = full.clone().requires_grad_()

    out, ref_out = bn(mine), ref(everything)
    assert torch.allclose(out, ref_out[start:start + counts[rank]], rtol=1e-5, atol=1e-5)
    assert torch.allclose(bn.running_mean, ref.running_mean, rtol=1e-5, atol=1e-6)
    assert torch.allclose(bn.running_var, ref.running_var, rtol=1e-5, atol=1e-6)

    # the loss of the global batch is the sum of the ranks' losses
    upstream = torch.randn(full.shape, generator=g).to(dev)
    (out * upstream[start:start + counts[rank]]).sum().backward()
    (ref_out * upstream).sum().backward()
    assert torch.allclose(mine.grad, everything.grad[start:start + counts[rank]], rtol=1e-4, atol=1e-5)
    w_grad = hvd.allreduce(bn.weight.grad, op=hvd.Sum, name="syncbn.weight.grad")
    b_grad = hvd.allreduce(bn.bias.grad, op=hvd.Sum, name="syncbn.bias.grad")
    assert torch.allclose(w_grad, ref.weight.grad, rtol=1e-4, atol=1e-5)
    assert torch.allclose(b_grad, ref.bias.grad, rtol=1e-4, atol=1e-5)

    bn.eval()
    assert torch.equal(bn(mine), torch.nn.functional.batch_norm(
        mine, bn.running_mean, bn.running_var, bn.weight, bn.bias, False, 0.1, bn.eps))
    print(f"OK syncbn cuda rank {rank}", flush=True)


def mode_elastic(args):
    """hvd.elastic.run over real resets: a failed collective (HorovodInternalError) restores the
    last commit and re-initializes Horovod; a host update heard by rank 0 alone interrupts every
    rank at the same commit, without a restore; each reset runs the reset callbacks and then
    synchronizes the state from rank 0."""
    import time
    import horovod.torch as hvd
    from horovod.common.elastic import notification_manager
    from horovod.runner.elastic.worker import HostUpdateResult
    hvd.init()
    rank = hvd.rank()

    model = model_for(rank)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(list(range(4 * PER_RANK * hvd.size())), shuffle=True, seed=3)
    state = hvd.elastic.TorchState(model, opt, sampler=sampler, batch=10 + rank)
    resets = []
    state.register_reset_callbacks([lambda: resets.append(hvd.size())])
    calls = []

    def same_everywhere(t, name):
        gathered = hvd.allgather(t.unsqueeze(0), name=name)
        return all(torch.equal(gathered[r], t) for r in range(gathered.shape[0]))

    @hvd.elastic.run
    def train(state):
        calls.append(len(calls) + 1)
        attempt = len(calls)
        for name, t in state.model.state_dict().items():
            assert same_everywhere(t, f"elastic.{attempt}.{name}"), (attempt, name)
        if attempt == 1:
            assert state.batch == 10, state.batch          # rank 0's, after the first sync
            x, y = share(global_batches(hvd.size(), 1)[0][0], rank)
            state.optimizer.zero_grad()
            F.mse_loss(state.model(x), y).backward()
            state.optimizer.step()
            state.sampler.record_batch(0, PER_RANK)
            state.batch = 5
            state.commit()
            state.batch = 7                                # not committed: lost at the restore
            raise hvd.HorovodInternalError("simulated failure of a collective")
        if attempt == 2:
            assert state.batch == 5 and resets == [hvd.size()], (state.batch, resets)
            assert state.sampler.processed_num == PER_RANK * hvd.size(), state.sampler.processed_num
            assert len(state.sampler) == 3 * PER_RANK, len(state.sampler)
            if rank == 0:
                notification_manager.handle_hosts_updated(time.time(), HostUpdateResult.added)
            state.batch = 6
            state.commit()                                 # raises on every rank: rank 0 heard of hosts
            raise AssertionError("commit after a host update did not interrupt")
        assert state.batch == 6 and len(resets) == 2, (state.batch, resets)
        return state.batch

    assert train(state) == 6 and calls == [1, 2, 3], calls
    print(f"OK elastic rank {rank}", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["train", "optstate", "syncbn", "elastic"])
    p.add_argument("--impl", choices=["hvd", "ddp"], default="hvd")
    p.add_argument("--variant", default="plain")
    p.add_argument("--out", default=None)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args = p.parse_args()
    {"train": mode_train, "optstate": mode_optstate, "syncbn": mode_syncbn, "elastic": mode_elastic}[args.mode](args)


if __name__ == "__main__":
    main()

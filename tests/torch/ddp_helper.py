"""What test_ddp.py runs as each rank: `ddp_helper.py MODE [args...]`.

script PATH ARGS...  runs PATH (examples/ddp_train.py) as __main__ with ARGS, unmodified; when the
                     script destroys the default group, first prints one line of what carried it:
                     `DSHIM-TEST-STATS rank=R backend=B preloaded=0|1 collectives=N bytes_sent=S
                     bytes_received=T` (the counters of dshim's communicator; -1 for a group that is
                     not dshim's).  DSHIM_TEST_RAISE_AT=R:K makes rank R raise in its K-th optimizer step.
fsdp                 FSDP2 (fully_shard) and classic FullyShardedDataParallel over backend "dshim":
                     a few SGD steps on the rank's half of each global batch; rank 0 then trains the
                     same model in-process on the whole batch and compares.
wrong_world          init_process_group("dshim", timeout=10 s) when WORLD_SIZE names more ranks than
                     were started: prints `init error after X s: TYPE: message`, exits 3.
mismatch             all_reduce of 10 elements on rank 0, 12 on the others: prints `mismatch error after
                     X s: message` and exits 0 (1 if the all_reduce succeeded): a rank that exits non-zero
                     would have the launcher stop the others, maybe before they print theirs.

DSHIM_TEST_PRELOAD: a libdshim.so to use instead of the checkout's build tree (loaded after
`import torch`, so the takeover, decided at import, still sees only a real LD_PRELOAD).
"""
import datetime
import os
import runpy
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

if os.environ.get("DSHIM_TEST_PRELOAD"):
    import ctypes
    ctypes.CDLL(os.environ["DSHIM_TEST_PRELOAD"], mode=ctypes.RTLD_GLOBAL)

import dshim  # noqa: E402,F401  (registration; harmless when the entry point did it)


def one_line(e):
    return f"{type(e).__name__}: {e}".replace("\n", " | ")


def stats_line():
    pg = c10d._get_default_group()
    stats = pg.dshim_stats() if hasattr(pg, "dshim_stats") else {}
    preloaded = int("libdshim" in os.environ.get("LD_PRELOAD", ""))
    return (f"DSHIM-TEST-STATS rank={dist.get_rank()} backend={dist.get_backend()} preloaded={preloaded} "
            f"collectives={stats.get('collectives', -1)} bytes_sent={stats.get('bytes_sent', -1)} "
            f"bytes_received={stats.get('bytes_received', -1)}")


def mode_script(path, args):
    orig_destroy = dist.destroy_process_group
    torch_own_group = [False]

    def destroy_process_group(group=None):
        if group is None and dist.is_initialized():
            # before the destroy: a closed communicator has no counters left
            print(stats_line(), flush=True)
            torch_own_group[0] = not hasattr(c10d._get_default_group(), "dshim_stats")
        return orig_destroy(group)

    dist.destroy_process_group = destroy_process_group

    raise_at = os.environ.get("DSHIM_TEST_RAISE_AT")
    if raise_at:
        bad_rank, bad_step = map(int, raise_at.split(":"))
        steps = [0]

        def pre_step(opt, args, kwargs):
            steps[0] += 1
            if dist.get_rank() == bad_rank and steps[0] == bad_step:
                raise RuntimeError(f"injected failure: rank {bad_rank} raises in optimizer step {bad_step}")

        from torch.optim.optimizer import register_optimizer_step_pre_hook
        register_optimizer_step_pre_hook(pre_step)

    sys.argv = [path] + args
    runpy.run_path(path, run_name="__main__")
    if torch_own_group[0]:
        # torch's own gloo (the reference run, DSHIM_TAKEOVER=0): its ProcessGroupGloo outlives
        # destroy_process_group and is freed during interpreter finalization, where torch 2.11 has
        # aborted ("terminate called without an active exception") and deadlocked (main thread in
        # ~ProcessGroupGloo waiting for its work mutex, one runloop thread gone; CI, 2026-11) once
        # in tens of runs.  The script has finished and said so; that teardown is torch's, not what
        # these runs check, so the process ends here.  dshim's groups take the normal exit path.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


# --------------------------------------------------------------------------
# FSDP
# --------------------------------------------------------------------------

def mlp():
    # odd widths: FSDP shards dim 0 of every parameter, 33 and 17 rows do not split evenly
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(12, 33), torch.nn.ReLU(), torch.nn.Linear(33, 17),
                               torch.nn.ReLU(), torch.nn.Linear(17, 5))


STEPS, BATCH = 6, 16


def batches():
    g = torch.Generator().manual_seed(5)
    return [(torch.randn(BATCH, 12, generator=g), torch.randn(BATCH, 5, generator=g)) for _ in range(STEPS)]


def train(model, data, rank, world):
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for x, y in data:
        # this rank's rows of the global batch; FSDP averages gradients over ranks, so the mean
        # of the per-rank mean losses equals the single process's mean over the global batch
        xs, ys = x.chunk(world)[rank], y.chunk(world)[rank]
        loss = torch.nn.functional.mse_loss(model(xs), ys)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def compare(what, got, want):
    """-> (ok, summary).  Tolerance: rtol 1e-5, atol 1e-6 (measured about 1e-7 relative: a float32
    sum of two half-batch gradients vs one full-batch reduction, over 6 SGD steps)."""
    worst = 0.0
    ok = True
    for k in want:
        g, w = got[k].detach().float(), want[k].detach().float()
        if g.shape != w.shape:
            return False, f"{what}: {k} has shape {tuple(g.shape)}, want {tuple(w.shape)}"
        worst = max(worst, (g - w).abs().max().item())
        ok = ok and torch.allclose(g, w, rtol=1e-5, atol=1e-6)
    return ok, f"{what}: max abs difference to the single-process run {worst:.3e}"


def mode_fsdp():
    dist.init_process_group("dshim")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert dist.get_backend() == "dshim", dist.get_backend()
    pg = c10d._get_default_group()
    data = batches()
    failures = 0
    results = {}

    # FSDP2: fully_shard on a 1-D CPU mesh over the default (dshim) group
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    before = pg.dshim_stats()["collectives"]
    model = mlp()
    mesh = init_device_mesh("cpu", (world,))
    for m in model:
        if isinstance(m, torch.nn.Linear):
            fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    losses = train(model, data, rank, world)
    full = {k: v.full_tensor() for k, v in model.state_dict().items()}   # an all_gather per parameter
    results["fully_shard"] = (full, pg.dshim_stats()["collectives"] - before, losses)

    # classic FSDP (FullyShardedDataParallel), one flat parameter for the whole model
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    before = pg.dshim_stats()["collectives"]
    model = FSDP(mlp(), device_id=torch.device("cpu"))
    losses = train(model, data, rank, world)
    with FSDP.summon_full_params(model):
        full = {k: v.detach().clone() for k, v in model.module.state_dict().items()}
    results["FullyShardedDataParallel"] = (full, pg.dshim_stats()["collectives"] - before, losses)

    if rank == 0:
        ref = mlp()
        ref_losses = train(ref, data, 0, 1)
        want = ref.state_dict()
        for what, (full, colls, losses) in results.items():
            ok, summary = compare(what, full, want)
            print(f"{'OK' if ok else 'FAIL'} {summary}; {colls} dshim collectives; rank 0's "
                  f"half-batch loss {losses[0]:.4f} -> {losses[-1]:.4f} (single process, whole batch {ref_losses[0]:.4f} -> "
                  f"{ref_losses[-1]:.4f})", flush=True)
            if not ok or colls <= 0:
                failures += 1
    else:
        for what, (_, colls, _) in results.items():
            print(f"{what}: {colls} dshim collectives", flush=True)
            failures += colls <= 0
    dist.destroy_process_group()
    print(f"rank {rank}: {failures} failures", flush=True)
    sys.exit(1 if failures else 0)


# --------------------------------------------------------------------------
# bad input
# --------------------------------------------------------------------------

def mode_wrong_world():
    t0 = time.monotonic()
    try:
        dist.init_process_group("dshim", timeout=datetime.timedelta(seconds=10))
    except Exception as e:
        print(f"init error after {time.monotonic() - t0:.1f} s: {one_line(e)}", flush=True)
        sys.exit(3)
    print("init_process_group succeeded with ranks missing", flush=True)
    sys.exit(0)


def mode_mismatch():
    dist.init_process_group("dshim", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    t = torch.ones(4)
    dist.all_reduce(t)   # a matching one first: the group works
    assert t.eq(dist.get_world_size()).all(), t
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(10 if rank == 0 else 12))
    except Exception as e:
        print(f"mismatch error after {time.monotonic() - t0:.1f} s: {one_line(e)}", flush=True)
        dist.destroy_process_group()
        sys.exit(0)
    print("mismatched all_reduce succeeded", flush=True)
    sys.exit(1)


def main():
    mode = sys.argv[1]
    if mode == "script":
        mode_script(sys.argv[2], sys.argv[3:])
    elif mode == "fsdp":
        mode_fsdp()
    elif mode == "wrong_world":
        mode_wrong_world()
    elif mode == "mismatch":
        mode_mismatch()
    else:
        sys.exit(f"ddp_helper.py: unknown mode {mode!r}")


if __name__ == "__main__":
    main()

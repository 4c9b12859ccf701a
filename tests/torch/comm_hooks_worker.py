"""One rank of a test_comm_hooks.py job: `comm_hooks_worker.py BACKEND SCENARIO OUT_DIR`.

BACKEND is what the script asks init_process_group for ("gloo" or "dshim"); whether dshim carries
a "gloo" group is up to the environment (LD_PRELOAD=libdshim.so: the takeover).  Scenarios:

- hooks: one small DDP model per communication hook -- the built-in C++ hooks ALLREDUCE and
  FP16_COMPRESS (ddp._register_builtin_comm_hook), and the Python hooks of
  torch.distributed.algorithms.ddp_comm_hooks (allreduce, fp16/bf16 compression, PowerSGD) -- trained for STEPS SGD steps on per-rank data; every step's gradients go to
  OUT_DIR/rank<R>.pt, the comm hook's name in DDP's logging data to the RESULT line.
- futures: every collective with async_op=True and Work.get_future().wait(): what the value is,
  as a structure of lists and tensors, each tensor described by shape, dtype and which of the
  operation's own tensors (and where in it) it is a view of; an exception's type and first line.

Environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (env://); TEST_HANG_S (default 60): after
that long the rank prints every thread's stack and exits 1 (a hang must say where it is).
"""
import ctypes
import faulthandler
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

# without the preload the package would load the checkout's build/lib/libdshim.so; the test's build is
# mapped here instead, after `import torch` (whose autoload installs the takeover only when it is mapped)
if os.environ.get("DSHIM_TEST_LIB") and "libdshim" not in os.environ.get("LD_PRELOAD", ""):
    ctypes.CDLL(os.environ["DSHIM_TEST_LIB"], mode=ctypes.RTLD_GLOBAL)

RANK = int(os.environ["RANK"])
N = int(os.environ["WORLD_SIZE"])
STEPS = 4
OUT = {}


# ---- hooks ----------------------------------------------------------------------------------

class _Mixed(nn.Module):
    """float32, complex64 and float64 parameters (DDP buckets them apart): the built-in FP16_COMPRESS
    hook compresses a complex bucket as its real view."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(12, 4)
        self.c = nn.Parameter(torch.randn(4, dtype=torch.complex64))
        self.d = nn.Parameter(torch.randn(4, dtype=torch.float64))

    def forward(self, x):
        y = self.lin(x)
        return y * (self.c * torch.complex(y, -y)).abs() + (self.d * y.double()).float()


def _model(kind):
    torch.manual_seed(1234)
    if kind == "mixed dtypes":
        return _Mixed()
    return nn.Sequential(nn.Linear(12, 24), nn.Tanh(), nn.Linear(24, 16), nn.ReLU(), nn.Linear(16, 4))


def _register(ddp, name):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    if name == "builtin ALLREDUCE":
        ddp._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)
    elif name == "builtin FP16_COMPRESS":
        ddp._register_builtin_comm_hook(dist.BuiltinCommHookType.FP16_COMPRESS)
    elif name == "allreduce_hook":
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    elif name == "fp16_compress_hook":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif name == "bf16_compress_hook":
        ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
    elif name == "powerSGD_hook":
        # compression from the 3rd step on (start_powerSGD_iter), with error feedback and warm start:
        # both all_reduces of a step run in then() callbacks that wait for an all_reduce of their own
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                            start_powerSGD_iter=2, min_compression_rate=0.5,
                                            use_error_feedback=True, warm_start=True, random_seed=7)
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    elif name != "none":
        raise ValueError(name)


HOOKS = ["none", "builtin ALLREDUCE", "builtin FP16_COMPRESS", "allreduce_hook", "fp16_compress_hook",
         "bf16_compress_hook", "powerSGD_hook", "mixed dtypes: none", "mixed dtypes: builtin ALLREDUCE",
         "mixed dtypes: builtin FP16_COMPRESS"]


def sc_hooks(out_dir):
    from torch.nn.parallel import DistributedDataParallel as DDP
    g = torch.Generator().manual_seed(99)
    xs = torch.randn(STEPS, N, 6, 12, generator=g)
    ys = torch.randn(STEPS, N, 6, 4, generator=g)
    grads = {}
    names = {}
    for hook in HOOKS:
        # several buckets, but one for PowerSGD: its then() callbacks wait for all_reduces of their own,
        # and with several buckets torch's gloo hangs (each of its 2 threads blocked in a callback)
        kind, _, name = hook.rpartition(": ")
        ddp = DDP(_model(kind), bucket_cap_mb=25 if "powerSGD" in hook else 0.001)
        _register(ddp, name)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        steps = []
        for s in range(STEPS):
            opt.zero_grad()
            nn.functional.mse_loss(ddp(xs[s, RANK]), ys[s, RANK]).backward()
            steps.append([p.grad.detach().clone() for p in ddp.parameters()])
            opt.step()
        grads[hook] = steps
        names[hook] = ddp._get_ddp_logging_data().get("comm_hook")
    torch.save(grads, os.path.join(out_dir, f"rank{RANK}.pt"))
    OUT["comm_hook_names"] = names


# ---- futures --------------------------------------------------------------------------------

def _describe(v, named):
    """v as JSON: lists as ["list", ...], tensors by shape, dtype and the operation's tensor they view."""
    if isinstance(v, torch.Tensor):
        of = None
        for k, t in named.items():
            if t.untyped_storage().data_ptr() == v.untyped_storage().data_ptr():
                of = [k, v.storage_offset() - t.storage_offset()]
                break
        return {"shape": list(v.shape), "dtype": str(v.dtype), "stride": list(v.stride()), "of": of}
    if isinstance(v, (list, tuple)):
        return [type(v).__name__] + [_describe(x, named) for x in v]
    return [type(v).__name__, repr(v)[:60]]


def _first_line(e):
    return [type(e).__name__, str(e).splitlines()[0] if str(e) else ""]


def _ops():
    """(name, fn(named) -> Work or Future): fn puts the operation's tensors into `named`."""
    n, r = N, RANK

    def t(name, named, *shape, dtype=torch.float32):
        named[name] = torch.full(shape, r + 1, dtype=dtype)
        return named[name]

    pg = dist.distributed_c10d._get_default_group()

    def sync_opts():
        o = dist.AllreduceOptions()
        o.asyncOp = False
        return o

    def p2p(named):
        x = t("x", named, 2)
        return dist.isend(x, 1) if r == 0 else dist.irecv(x, 0)

    return [
        ("all_reduce", lambda d: dist.all_reduce(t("x", d, 3), async_op=True)),
        ("all_reduce 2-d int64", lambda d: dist.all_reduce(t("x", d, 2, 3, dtype=torch.int64), async_op=True)),
        ("ProcessGroup.allreduce 2 tensors", lambda d: pg.allreduce([t("a", d, 3), t("b", d, 3)])),
        ("ProcessGroup.allreduce asyncOp=False", lambda d: pg.allreduce([t("x", d, 3)], sync_opts())),
        ("all_reduce_coalesced", lambda d: dist.all_reduce_coalesced([t("a", d, 3), t("b", d, 2)], async_op=True)),
        ("broadcast", lambda d: dist.broadcast(t("x", d, 3), 0, async_op=True)),
        ("broadcast from 1", lambda d: dist.broadcast(t("x", d, 3), 1, async_op=True)),
        ("reduce", lambda d: dist.reduce(t("x", d, 3), 0, async_op=True)),
        ("all_gather", lambda d: dist.all_gather([t(f"o{i}", d, 2) for i in range(n)], t("x", d, 2),
                                                 async_op=True)),
        ("all_gather_into_tensor", lambda d: dist.all_gather_into_tensor(t("o", d, 2 * n, 3), t("x", d, 2, 3),
                                                                         async_op=True)),
        ("all_gather_into_tensor non-contiguous", lambda d: dist.all_gather_into_tensor(
            t("o", d, 3, 2 * n).t(), t("x", d, 2, 3), async_op=True)),
        ("allgather_into_tensor_coalesced", lambda d: pg.allgather_into_tensor_coalesced(
            [t("o0", d, 2 * n), t("o1", d, n)], [t("x0", d, 2), t("x1", d, 1)])),
        ("all_gather_coalesced", lambda d: dist.all_gather_coalesced(
            [[t(f"o{i}a", d, 2), t(f"o{i}b", d, 1)] for i in range(n)], [t("xa", d, 2), t("xb", d, 1)],
            async_op=True)),
        ("gather to 0", lambda d: dist.gather(t("x", d, 2), [t(f"o{i}", d, 2) for i in range(n)] if r == 0 else None,
                                              0, async_op=True)),
        ("gather to 1", lambda d: dist.gather(t("x", d, 2), [t(f"o{i}", d, 2) for i in range(n)] if r == 1 else None,
                                              1, async_op=True)),
        ("scatter", lambda d: dist.scatter(t("o", d, 2), [t(f"x{i}", d, 2) for i in range(n)] if r == 0 else None,
                                           0, async_op=True)),
        ("reduce_scatter", lambda d: dist.reduce_scatter(t("o", d, 2), [t(f"x{i}", d, 2) for i in range(n)],
                                                         async_op=True)),
        ("reduce_scatter_tensor", lambda d: dist.reduce_scatter_tensor(t("o", d, 2), t("x", d, 2 * n),
                                                                       async_op=True)),
        ("all_to_all_single", lambda d: dist.all_to_all_single(t("o", d, 2 * n), t("x", d, 2 * n), async_op=True)),
        ("all_to_all_single with splits", lambda d: dist.all_to_all_single(
            t("o", d, 3 * n), t("x", d, 3 * n), [3] * n, [3] * n, async_op=True)),
        ("all_to_all", lambda d: dist.all_to_all([t(f"o{i}", d, 2) for i in range(n)],
                                                 [t(f"x{i}", d, 2) for i in range(n)], async_op=True)),
        ("barrier", lambda d: dist.barrier(async_op=True)),
        ("isend/irecv", p2p),
    ]


def sc_futures(out_dir):
    import warnings
    warnings.simplefilter("ignore")   # all_reduce_coalesced / all_gather_coalesced: deprecation
    for name, fn in _ops():
        named = {}
        try:
            w = fn(named)
        except Exception as e:   # gloo has no all_to_all: a script sees the error at the call
            OUT[name] = {"call": _first_line(e)}
            continue
        rec = {}
        try:
            fut = w if isinstance(w, torch._C.Future) else w.get_future()
            rec["value"] = _describe(fut.wait(), named)
        except Exception as e:
            rec["get_future"] = _first_line(e)
            if not isinstance(w, torch._C.Future):
                w.wait()
        OUT[name] = rec


def main():
    backend, scenario, out_dir = sys.argv[1], sys.argv[2], sys.argv[3]
    faulthandler.dump_traceback_later(float(os.environ.get("TEST_HANG_S", "60")), exit=True)
    dist.init_process_group(backend)
    OUT["carried"] = hasattr(dist.distributed_c10d._get_default_group(), "dshim_stats")
    globals()["sc_" + scenario](out_dir)
    dist.barrier()
    print("RESULT " + json.dumps(OUT, sort_keys=True), flush=True)
    dist.destroy_process_group()
    faulthandler.cancel_dump_traceback_later()


if __name__ == "__main__":
    main()

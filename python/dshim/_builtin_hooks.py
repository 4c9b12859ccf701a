"""DDP's built-in C++ communication hook FP16_COMPRESS on a dshim group.

`ddp._register_builtin_comm_hook(dist.BuiltinCommHookType.FP16_COMPRESS)` installs torch's C++
FP16CompressCommHook (torch/csrc/distributed/c10d/default_comm_hooks.cpp), whose decompression reads
the all_reduce Future's value as a C++ TensorList ("ProcessGroup::allreduce should return
TensorList" otherwise).  gloo's and NCCL's C++ Works complete their Futures with one; a Python
ProcessGroup cannot: torch.futures.Future.set_result() -- and then(), and everything else Python
can reach -- stores a Python object, which C++ sees as a PyObject.  (TorchScript's fork could make a
typed Future, at the price of a thread hop through torch's inter-op pool for every get_future(),
errors re-worded by the TorchScript interpreter, and a hang when that pool has one thread and a
callback waits in it; rejected.)  The built-in ALLREDUCE hook needs nothing: DDP reads its result
through parseCppCommHookResult, which takes a PyObject.

So for a dshim group (by name or carried under the takeover) DDP gets, in place of the C++ hook, a
Python hook that does what FP16CompressCommHook does, with the same torch operations in the same
order -- the gradients are the same bits as with gloo -- and the same name in DDP's logging data.
Every other hook type, and every other group, goes to torch's method unchanged.  Installed when the
first dshim group is created (idempotent).
"""
import functools

import torch
import torch.distributed as dist

_installed = False


def _fp16_compress_hook(pg, bucket):
    """torch's FP16CompressCommHook::runHook: the bucket (complex as its real view) to float16,
    divided by the group's size, all_reduced; then copied back into the bucket."""
    buffer = bucket.buffer()
    complex_ = buffer.is_complex()
    compressed = (torch.view_as_real(buffer) if complex_ else buffer).to(torch.float16)
    compressed /= pg.size()   # first, to avoid overflow (torch's words)
    fut = pg.allreduce([compressed]).get_future()

    def decompress(f):
        reduced = f.value()[0]
        if complex_:
            reduced = torch.view_as_complex(reduced.to(buffer.real.dtype))
        buffer.copy_(reduced)
        return buffer

    return fut.then(decompress)


def install():
    global _installed
    if _installed:
        return
    try:
        from torch.nn.parallel import DistributedDataParallel as DDP
        original = DDP._register_builtin_comm_hook
        fp16 = dist.BuiltinCommHookType.FP16_COMPRESS
    except (ImportError, AttributeError):   # a torch without them: nothing to stand in for
        _installed = True
        return

    from .process_group import DshimProcessGroup

    @functools.wraps(original)
    def _register_builtin_comm_hook(self, comm_hook_type):
        pg = getattr(self, "process_group", None)
        if comm_hook_type != fp16 or not isinstance(pg, DshimProcessGroup) or getattr(self, "logger", None) is None:
            return original(self, comm_hook_type)
        self.logger._set_comm_hook_name(str(comm_hook_type))
        dist._register_comm_hook(self.reducer, pg, _fp16_compress_hook)

    DDP._register_builtin_comm_hook = _register_builtin_comm_hook
    _installed = True

"""horovod.torch's operations (Horovod 0.28.1's horovod/torch/mpi_ops.py and mpi_ops_v2.cc) on
dshim's engine of operations matched by name (dshim._named).

Every operation is submitted to the engine of its process set under Horovod's name
("allreduce.<name>", or "allreduce.noname.<handle>" for an unnamed one: handles count per
process, so ranks that issue the same operations name them alike) and returns an integer
handle at once; synchronize(handle) waits and returns the result.  The engine runs a name once
every rank of the set has submitted it, in whatever order each rank did.

Errors as Horovod raises them: an argument refused locally (unsupported dtype, non-contiguous
tensor, a name already pending, bad splits, a set this rank is not in) raises ValueError at
submission; an operation that fails (ranks disagree on dtype/shape/root/op for a name, a rank
lost, a shutdown) raises HorovodInternalError from synchronize() on every rank, and the next
operations work.

CUDA tensors are staged through host memory: the input is copied to the host when the
operation is submitted, the result copied back into the device tensor by synchronize() (as
Horovod built with CUDA but without GPU operations does).
"""
import ctypes
import itertools

import torch

from dshim import _dtypes as _dt
from dshim import _named

from horovod.common.basics import HorovodBasics as _HorovodBasics, _core
from horovod.common.exceptions import HorovodInternalError
from horovod.common.process_sets import _setup as _setup_process_sets
from horovod.common.process_sets import ProcessSet, global_process_set, add_process_set, remove_process_set
from horovod.common.util import get_average_backwards_compatibility_fun, gpu_available, num_rank_is_power_2

from horovod.torch.compression import Compression

_basics = _HorovodBasics(__file__, 'mpi_lib_v2')

is_initialized = _basics.is_initialized
start_timeline = _basics.start_timeline
stop_timeline = _basics.stop_timeline
size = _basics.size
local_size = _basics.local_size
cross_size = _basics.cross_size
rank = _basics.rank
local_rank = _basics.local_rank
cross_rank = _basics.cross_rank
mpi_threads_supported = _basics.mpi_threads_supported
mpi_enabled = _basics.mpi_enabled
mpi_built = _basics.mpi_built
gloo_enabled = _basics.gloo_enabled
gloo_built = _basics.gloo_built
nccl_built = _basics.nccl_built
ddl_built = _basics.ddl_built
ccl_built = _basics.ccl_built
cuda_built = _basics.cuda_built
rocm_built = _basics.rocm_built

Average = _basics.Average
Sum = _basics.Sum
Adasum = _basics.Adasum
Min = _basics.Min
Max = _basics.Max
Product = _basics.Product

is_homogeneous = _basics.is_homogeneous

handle_average_backwards_compatibility = get_average_backwards_compatibility_fun(_basics)

_setup_process_sets(_basics)

# handle -> _Pending.  Handles are Horovod's: integers counted per process from 1, reset by
# shutdown (the unnamed operations' names come from them).
_handle_map = {}
_handles = itertools.count(1)


def _reset():
    """At shutdown, as Horovod's handle manager: the handles are cleared (synchronize and poll
    refuse them until init forgets them) and counting starts again from 1."""
    global _handles
    _reserved.clear()
    for p in _handle_map.values():
        for op_ in p.ops:
            _named.orphan(op_)   # failed by the shutdown; nothing waits for them
        p.ops = []
        p.finish = None
    _handles = itertools.count(1)


_core.reset_hooks.append(_reset)


def shutdown(*args, **kwargs):
    """Shuts Horovod down (pending operations fail on every rank); hvd.init() may follow."""
    return _basics.shutdown(*args, **kwargs)


def init(*args, **kwargs):
    """Initializes Horovod: init(comm=None, process_sets=None); see HorovodBasics.init."""
    _handle_map.clear()
    _basics.init(*args, **kwargs)
    _setup_process_sets(_basics)


# ---- dtypes, ops, names ------------------------------------------------------------------------

# what Horovod's torch layer reduces (allreduce, reducescatter) ...
_REDUCE_DTYPES = {torch.int32: _dt.INT32, torch.int64: _dt.INT64, torch.float16: _dt.FLOAT16,
                  torch.float32: _dt.FLOAT32, torch.float64: _dt.FLOAT64}
# ... and what it moves (allgather, broadcast, alltoall).  int16 travels as dshim's bfloat16 (two
# bytes nobody reduces; torch's bfloat16 is refused, so the code stands for int16 alone and a
# rank sending int16 where another sends float16 is still told apart)
_MOVE_DTYPES = dict(_REDUCE_DTYPES)
_MOVE_DTYPES.update({torch.uint8: _dt.UINT8, torch.int8: _dt.INT8, torch.int16: _dt.BFLOAT16})

_REDOPS = {Average: _dt.AVG, Sum: _dt.SUM, Min: _dt.MIN, Max: _dt.MAX, Product: _dt.PROD}


def _check_tensor(tensor, dtypes):
    """The dshim dtype of tensor, refusing as Horovod's _check_function does."""
    code = dtypes.get(tensor.dtype)
    if code is None:
        raise ValueError('Tensor type %s is not supported.' % tensor.type())
    if not tensor.is_contiguous():
        raise ValueError('Tensor is required to be contiguous.')
    return code


def _check_initialized():
    if not _core.initialized:
        raise HorovodInternalError('Horovod has not been initialized; use hvd.init().')


def _op_name(prefix, name, handle):
    if name:
        return f"{prefix}.{name}"
    return f"{prefix}.noname.{handle}"


def _group_names(prefix, name, handle, n):
    base = _op_name(prefix, name, handle)
    return [f"{base}_{i + 1}of{n}".encode() for i in range(n)]


def _device_of(tensors):
    device = tensors[0].device
    for t in tensors[1:]:
        if t.device != device:
            raise HorovodInternalError("Tensors in list must be on same device.")
    return device


def _host(t):
    """t's data in host memory: t itself on the CPU, a copy of a device tensor."""
    return t if t.device.type == "cpu" else t.detach().to("cpu")


# (engine, name) of every operation submitted and not synchronized yet.  A name is refused while
# it is here, whether or not the engine already ran it: Horovod refuses a name while it is
# queued, and its background loop (a cycle of a millisecond or more) never runs an operation
# before the next call can submit the same name again; dshim's engine can, so the rule is
# kept by the handle's lifetime rather than by the engine's speed.
_reserved = set()

_DUPLICATE = ("Requested to allreduce, allgather, or broadcast a tensor with the same name as another tensor "
              "that is currently being processed.  If you want to request another tensor, use a different "
              "tensor name.")


def _submit(engine, kind, name, **kw):
    key = (engine, name)
    if key in _reserved:
        raise ValueError(f"rank {_core.rank}: {_DUPLICATE} (tensor '{name.decode(errors='replace')}')")
    try:
        op_ = engine.submit(kind, name, **kw)
    except _named.NamedOpError as e:
        raise HorovodInternalError(str(e)) from None
    _reserved.add(key)
    op_.tag = key
    return op_


def _release(ops):
    for op_ in ops:
        _reserved.discard(op_.tag)


def _result_tensor(op, like, out_shape_tail, output):
    """The engine's result of op (allgather, alltoall, reducescatter) in output, resized."""
    ptr, nbytes, dim0, _ = op.result()
    if output.device.type == "cpu":
        output.resize_((dim0,) + tuple(out_shape_tail))
        if nbytes:
            ctypes.memmove(output.data_ptr(), ptr, nbytes)
        return output
    host = torch.empty((dim0,) + tuple(out_shape_tail), dtype=like.dtype)
    if nbytes:
        ctypes.memmove(host.data_ptr(), ptr, nbytes)
    output.resize_(host.shape)
    output.copy_(host)
    return output


class _Pending:
    """A handle's operations and how synchronize() turns them into the result."""
    __slots__ = ("ops", "finish")

    def __init__(self, ops, finish):
        self.ops = ops
        self.finish = finish


def _register(ops, finish, handle):
    _handle_map[handle] = _Pending(ops, finish)
    return handle


# ---- allreduce ----------------------------------------------------------------------------------

def _check_adasum(tensors, process_set):
    if process_set != global_process_set:
        raise NotImplementedError("Adasum does not support non-global process sets yet.")
    if tensors[0].device.type != 'cpu' and gpu_available('torch'):
        pass   # dshim stages device tensors through the host: Horovod's MPI path for them
    elif not num_rank_is_power_2(size()):
        raise NotImplementedError('Running Adasum with non-power of 2 ranks is not supported yet.')
    # Horovod runs Adasum only in MPI builds; a Gloo build has no Adasum operation
    raise HorovodInternalError("Adasum reduction is not supported by dshim's Horovod (Horovod runs it "
                               "only when built with MPI); use op=hvd.Average or hvd.Sum")


def _allreduce_async(tensor, output, name, op, prescale_factor, postscale_factor, process_set: ProcessSet):
    if op == Adasum:
        _check_adasum([tensor], process_set)
    dtype = _check_tensor(tensor, _REDUCE_DTYPES)
    redop = _REDOPS.get(op)
    if redop is None:
        raise HorovodInternalError(f"Reduction op type {op} not supported.")
    _check_initialized()
    handle = next(_handles)
    e = _core.entry(process_set, "Allreduce")
    src = _host(tensor)
    dst = output if output.device.type == "cpu" else (src if output is tensor else torch.empty_like(src))
    op_ = _submit(e.engine, _named.ALLREDUCE, _op_name("allreduce", name, handle).encode(), dtype=dtype,
                  shape=tensor.shape, sendbuf=src.data_ptr(), recvbuf=dst.data_ptr(), op=redop,
                  prescale=float(prescale_factor), postscale=float(postscale_factor), keep=(src, dst))
    if dst is output:
        return _register([op_], lambda: output, handle)

    def finish():
        output.copy_(dst)
        return output
    return _register([op_], finish, handle)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                    process_set=global_process_set):
    """Starts averaging (op=Average, the default) or reducing `tensor` over the processes of
    process_set; the input is not modified.  Operations are matched across ranks by `name`
    (an automatic one when None).  Returns a handle for poll() / synchronize()."""
    op = handle_average_backwards_compatibility(op, average)
    output = tensor.new(tensor.shape)
    return _allreduce_async(tensor, output, name, op, prescale_factor, postscale_factor, process_set)


class HorovodAllreduce(torch.autograd.Function):
    """Allreduce with a gradient: the gradient is allreduced the same way."""

    @staticmethod
    def forward(ctx, tensor, average, name, op, prescale_factor, postscale_factor, process_set):
        ctx.average = average
        ctx.op = op
        ctx.prescale_factor = prescale_factor
        ctx.postscale_factor = postscale_factor
        ctx.process_set = process_set
        handle = allreduce_async(tensor, average, name, op, prescale_factor, postscale_factor, process_set)
        return synchronize(handle)

    @staticmethod
    def backward(ctx, grad_output):
        return allreduce(grad_output, average=ctx.average, op=ctx.op, prescale_factor=ctx.prescale_factor,
                         postscale_factor=ctx.postscale_factor,
                         process_set=ctx.process_set), None, None, None, None, None, None


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=global_process_set):
    """Averages (op=Average, the default) or reduces `tensor` over the processes of process_set and
    returns the result; the input is not modified.  Differentiable."""
    tensor_compressed, ctx = compression.compress(tensor)
    summed = HorovodAllreduce.apply(tensor_compressed, average, name, op, prescale_factor, postscale_factor,
                                    process_set)
    return compression.decompress(summed, ctx)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                     process_set=global_process_set):
    """allreduce_async in place: `tensor` receives the result."""
    op = handle_average_backwards_compatibility(op, average)
    return _allreduce_async(tensor, tensor, name, op, prescale_factor, postscale_factor, process_set)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
               process_set=global_process_set):
    """allreduce in place: `tensor` receives the result, which is returned."""
    handle = allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor, process_set)
    return synchronize(handle)


def _grouped_allreduce_async(tensors, outputs, name, op, prescale_factor, postscale_factor,
                             process_set: ProcessSet):
    if op == Adasum:
        _check_adasum(tensors, process_set)
    _check_tensor(tensors[0], _REDUCE_DTYPES)
    dtypes = [_check_tensor(t, _REDUCE_DTYPES) for t in tensors]
    redop = _REDOPS.get(op)
    if redop is None:
        raise HorovodInternalError(f"Reduction op type {op} not supported.")
    _check_initialized()
    handle = next(_handles)
    _device_of(tensors)
    e = _core.entry(process_set, "Allreduce")
    names = _group_names("grouped_allreduce", name, handle, len(tensors))
    ops, back = [], []
    try:
        for t, out, dtype, nm in zip(tensors, outputs, dtypes, names):
            src = _host(t)
            dst = out if out.device.type == "cpu" else (src if out is t else torch.empty_like(src))
            if dst is not out:
                back.append((out, dst))
            ops.append(_submit(e.engine, _named.ALLREDUCE, nm, dtype=dtype, shape=t.shape,
                               sendbuf=src.data_ptr(), recvbuf=dst.data_ptr(), op=redop,
                               prescale=float(prescale_factor), postscale=float(postscale_factor),
                               keep=(src, dst)))
    except BaseException:
        _abandon(ops)
        raise

    def finish():
        for out, dst in back:
            out.copy_(dst)
        return list(outputs)
    return _register(ops, finish, handle)


def _abandon(ops):
    """Operations of a group submitted before a later one was refused: they still run when the
    other ranks submit them; nothing waits for them here."""
    _release(ops)
    for op_ in ops:
        _named.orphan(op_)


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set):
    """allreduce_async of a list of tensors, submitted together under one base name."""
    op = handle_average_backwards_compatibility(op, average)
    outputs = [t.new(t.shape) for t in tensors]
    return _grouped_allreduce_async(tensors, outputs, name, op, prescale_factor, postscale_factor, process_set)


class HorovodGroupedAllreduce(torch.autograd.Function):
    """Grouped allreduce with a gradient."""

    @staticmethod
    def forward(ctx, average, name, op, prescale_factor, postscale_factor, process_set: ProcessSet, *tensors):
        ctx.average = average
        ctx.op = op
        ctx.prescale_factor = prescale_factor
        ctx.postscale_factor = postscale_factor
        ctx.process_set = process_set
        handle = grouped_allreduce_async(list(tensors), average, name, op, prescale_factor, postscale_factor,
                                         process_set)
        return tuple(synchronize(handle))

    @staticmethod
    def backward(ctx, *grad_output):
        grad_reduced = grouped_allreduce(list(grad_output), average=ctx.average, op=ctx.op,
                                         prescale_factor=ctx.prescale_factor,
                                         postscale_factor=ctx.postscale_factor, process_set=ctx.process_set)
        return (None, None, None, None, None, None, *grad_reduced)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """allreduce of a list of tensors (one base name; results in a list).  Differentiable."""
    tensors_compressed, ctxs = zip(*[compression.compress(t) for t in tensors])
    summed = HorovodGroupedAllreduce.apply(average, name, op, prescale_factor, postscale_factor, process_set,
                                           *tensors_compressed)
    return [compression.decompress(t, ctx) for t, ctx in zip(summed, ctxs)]


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    """grouped_allreduce_async in place."""
    op = handle_average_backwards_compatibility(op, average)
    return _grouped_allreduce_async(tensors, tensors, name, op, prescale_factor, postscale_factor, process_set)


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                       process_set=global_process_set):
    """grouped_allreduce in place."""
    handle = grouped_allreduce_async_(tensors, average, name, op, prescale_factor, postscale_factor, process_set)
    return synchronize(handle)


def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    """Reduces a sparse tensor by allgathering its indices and values (Horovod's way); returns a
    callable that waits and gives the reduced sparse tensor."""
    t = tensor
    indices_handle = allgather_async(t._indices().transpose(0, 1).contiguous(), name=f'{name}.indices',
                                     process_set=process_set)
    values_handle = allgather_async(t._values(), name=f'{name}.values', process_set=process_set)

    def handle():
        values = synchronize(values_handle)
        indices = synchronize(indices_handle)
        values = (values / process_set.size()) if op == Average else values
        if indices.dim() == 0 or values.dim() == 0:
            return t.new().resize_as_(t)
        return t.new(indices.transpose(0, 1), values, t.size())

    return handle


# ---- allgather ----------------------------------------------------------------------------------

def _allgather_async(tensor, output, name, process_set: ProcessSet):
    dtype = _check_tensor(tensor, _MOVE_DTYPES)
    _check_initialized()
    handle = next(_handles)
    e = _core.entry(process_set, "Allgather")
    src = _host(tensor)
    op_ = _submit(e.engine, _named.ALLGATHER, _op_name("allgather", name, handle).encode(), dtype=dtype,
                  shape=tensor.shape, sendbuf=src.data_ptr(), keep=(src,))
    tail = tuple(tensor.shape[1:])
    return _register([op_], lambda: _result_tensor(op_, tensor, tail, output), handle)


def allgather_async(tensor, name=None, process_set=global_process_set):
    """Starts concatenating `tensor` of every process of process_set along the first dimension
    (which may differ between ranks); returns a handle."""
    output = tensor.new()
    return _allgather_async(tensor, output, name, process_set)


class HorovodAllgather(torch.autograd.Function):
    """Allgather with a gradient: the gradient's average over the ranks, this rank's rows."""

    @staticmethod
    def forward(ctx, tensor, name, process_set: ProcessSet):
        ctx.dim = tensor.shape[0]
        ctx.process_set = process_set
        handle = allgather_async(tensor, name, process_set)
        return synchronize(handle)

    @staticmethod
    def backward(ctx, grad_output):
        grad_reduced = allreduce(grad_output, average=True, process_set=ctx.process_set)
        dim_t = torch.IntTensor([ctx.dim])
        dim = allgather(dim_t, process_set=ctx.process_set).view(ctx.process_set.size())
        r = ctx.process_set.rank()
        offset = torch.sum(dim.narrow(0, 0, r)).item() if r != 0 else 0
        return grad_reduced.narrow(0, offset, ctx.dim), None, None


def allgather(tensor, name=None, process_set=global_process_set):
    """`tensor` of every process of process_set, concatenated along the first dimension.
    Differentiable."""
    return HorovodAllgather.apply(tensor, name, process_set)


def _grouped_allgather_async(tensors, outputs, name, process_set: ProcessSet):
    _check_tensor(tensors[0], _MOVE_DTYPES)
    dtypes = [_check_tensor(t, _MOVE_DTYPES) for t in tensors]
    _check_initialized()
    if len(tensors) != len(outputs):
        raise HorovodInternalError("Number of tensors and outputs must be equal")
    handle = next(_handles)
    _device_of(tensors)
    e = _core.entry(process_set, "Allgather")
    names = _group_names("grouped_allgather", name, handle, len(tensors))
    ops = []
    try:
        for t, dtype, nm in zip(tensors, dtypes, names):
            src = _host(t)
            ops.append(_submit(e.engine, _named.ALLGATHER, nm, dtype=dtype, shape=t.shape, sendbuf=src.data_ptr(),
                               keep=(src,)))
    except BaseException:
        _abandon(ops)
        raise

    def finish():
        return [_result_tensor(op_, t, tuple(t.shape[1:]), out) for op_, t, out in zip(ops, tensors, outputs)]
    return _register(ops, finish, handle)


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    """allgather_async of a list of tensors under one base name."""
    outputs = [t.new() for t in tensors]
    return _grouped_allgather_async(tensors, outputs, name, process_set)


class HorovodGroupedAllgather(torch.autograd.Function):
    """Grouped allgather with a gradient."""

    @staticmethod
    def forward(ctx, name, process_set: ProcessSet, *tensors):
        ctx.dims = [t.shape[0] for t in tensors]
        ctx.process_set = process_set
        handle = grouped_allgather_async(list(tensors), name, process_set)
        return tuple(synchronize(handle))

    @staticmethod
    def backward(ctx, *grad_output):
        grad_reduced = grouped_allreduce(list(grad_output), average=True, process_set=ctx.process_set)
        dim_ts = [torch.IntTensor([dim]) for dim in ctx.dims]
        dims = [dt.view(ctx.process_set.size()) for dt in grouped_allgather(dim_ts, process_set=ctx.process_set)]
        r = ctx.process_set.rank()
        offsets = [torch.sum(dim.narrow(0, 0, r)).item() if r != 0 else 0 for dim in dims]
        result = [gr.narrow(0, offset, dim) for gr, offset, dim in zip(grad_reduced, offsets, ctx.dims)]
        return (None, None, *result)


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """allgather of a list of tensors (one base name; results in a list).  Differentiable."""
    return HorovodGroupedAllgather.apply(name, process_set, *tensors)


# ---- broadcast ----------------------------------------------------------------------------------

def _broadcast_async(tensor, output, root_rank, name, process_set: ProcessSet):
    dtype = _check_tensor(tensor, _MOVE_DTYPES)
    _check_initialized()
    e_rank = _core.rank
    if e_rank == root_rank and output is not tensor:
        output.copy_(tensor)
    handle = next(_handles)
    e = _core.entry(process_set, "Broadcast")
    root = e.global_to_set.get(root_rank)
    if root is None:
        raise ValueError(f"broadcast received invalid root rank {root_rank} for provided process set")
    buf = output if output.device.type == "cpu" else output.detach().to("cpu")
    op_ = _submit(e.engine, _named.BROADCAST, _op_name("broadcast", name, handle).encode(), dtype=dtype,
                  shape=tensor.shape, sendbuf=buf.data_ptr(), recvbuf=buf.data_ptr(), root=root, keep=(buf,))
    if buf is output:
        return _register([op_], lambda: output, handle)

    def finish():
        output.copy_(buf)
        return output
    return _register([op_], finish, handle)


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts broadcasting `tensor` of global rank root_rank to the processes of process_set into
    a new tensor (the input is not modified); returns a handle."""
    output = tensor.new(tensor.shape)
    return _broadcast_async(tensor, output, root_rank, name, process_set)


class HorovodBroadcast(torch.autograd.Function):
    """Broadcast with a gradient: the gradient's average, kept at the root only."""

    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set: ProcessSet):
        ctx.root_rank = root_rank
        ctx.process_set = process_set
        handle = broadcast_async(tensor, root_rank, name, process_set)
        return synchronize(handle)

    @staticmethod
    def backward(ctx, grad_output):
        grad_reduced = allreduce(grad_output, average=True, process_set=ctx.process_set)
        if rank() != ctx.root_rank:
            grad_reduced *= 0
        return grad_reduced, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """`tensor` of global rank root_rank, on every process of process_set.  Differentiable."""
    return HorovodBroadcast.apply(tensor, root_rank, name, process_set)


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    """broadcast_async in place."""
    return _broadcast_async(tensor, tensor, root_rank, name, process_set)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """broadcast in place: `tensor` receives root_rank's value, and is returned."""
    handle = broadcast_async_(tensor, root_rank, name, process_set)
    return synchronize(handle)


# ---- alltoall -----------------------------------------------------------------------------------

def _alltoall_async(tensor, splits, output, output_received_splits, name, process_set: ProcessSet):
    if splits is None:
        splits = torch.tensor([], dtype=torch.int32, device='cpu')
    elif not isinstance(splits, torch.Tensor):
        splits = torch.tensor(splits, dtype=torch.int32, device='cpu')
    dtype = _check_tensor(tensor, _MOVE_DTYPES)
    _check_initialized()
    handle = next(_handles)
    e = _core.entry(process_set, "Alltoall")
    if splits.dim() > 1:
        raise ValueError("alltoall expects a 1D splits tensor")
    if splits.dtype != torch.int32:
        raise ValueError("alltoall expects splits to contain 32-bit integer elements.")
    n = len(e.ranks)
    dim0 = tensor.shape[0] if tensor.dim() > 0 else 1
    if splits.numel() == n:
        split_list = [int(s) for s in splits.cpu().tolist()]
        if sum(split_list) > dim0:
            raise ValueError("Sum of splits entries is greater than the first dimension of tensor.")
    elif splits.numel() == 0:
        if dim0 % n != 0:
            raise ValueError("splits not provided, but first dimension of tensor is not an even multiple of the "
                             "number of workers.")
        split_list = [dim0 // n] * n
    else:
        raise ValueError("Number of entries in splits does not equal number of workers.")
    src = _host(tensor)
    shape = list(tensor.shape)
    if shape:
        shape[0] = sum(split_list)   # rows past the splits' sum are not sent
    op_ = _submit(e.engine, _named.ALLTOALL, _op_name("alltoall", name, handle).encode(), dtype=dtype,
                  shape=shape, sendbuf=src.data_ptr(), splits=split_list, keep=(src,))
    tail = tuple(tensor.shape[1:])

    def finish():
        _, _, _, received = op_.result(n)
        out = _result_tensor(op_, tensor, tail, output)
        rs = torch.tensor(received, dtype=torch.int32)
        output_received_splits.resize_(rs.shape)
        output_received_splits.copy_(rs)
        return out, output_received_splits
    _handle_map[handle] = _Pending([op_], finish)
    return handle


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Starts sending rows of `tensor` to every process of process_set (splits[i] rows to the
    i-th, an even split when None) and receiving theirs; returns a handle whose synchronize()
    gives (output, received splits)."""
    output = tensor.new()
    if isinstance(splits, torch.Tensor):
        output_received_splits = splits.new()
    else:
        output_received_splits = torch.empty(size(), dtype=torch.int32, device='cpu')
    return _alltoall_async(tensor, splits, output, output_received_splits, name, process_set)


class HorovodAlltoall(torch.autograd.Function):
    """Alltoall with a gradient: the gradient sent back along the received splits."""

    @staticmethod
    def forward(ctx, tensor, splits, name, process_set: ProcessSet):
        handle = alltoall_async(tensor, splits, name, process_set)
        output, received_splits = synchronize(handle)
        ctx.process_set = process_set
        ctx.recvsplits = received_splits
        if splits is None:
            return output
        ctx.mark_non_differentiable(received_splits)
        return output, received_splits

    @staticmethod
    def backward(ctx, grad_output, *dead_gradients):
        grad_wrt_tensor, _ = alltoall(grad_output, splits=ctx.recvsplits, process_set=ctx.process_set)
        return grad_wrt_tensor, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Rows of `tensor` scattered to the processes of process_set (splits[i] rows to the i-th, an
    even split when None), theirs gathered: the output, and with splits given also the rows
    received from each.  Differentiable."""
    return HorovodAlltoall.apply(tensor, splits, name, process_set)


# ---- reducescatter ------------------------------------------------------------------------------

def _reducescatter_async(tensor, output, name, op, process_set: ProcessSet, prescale_factor, postscale_factor):
    dtype = _check_tensor(tensor, _REDUCE_DTYPES)
    _check_initialized()
    handle = next(_handles)
    if tensor.dim() == 0:
        raise ValueError("Reducescatter does not support scalar inputs")
    ps_id = process_set.process_set_id
    known = _core.sets.get(ps_id) if ps_id is not None else None
    if known is None or known.engine is None:
        raise ValueError(f"Invalid process set id for this rank: {ps_id}")
    e = _core.entry(process_set, "Reducescatter")
    if op not in (Average, Sum):
        raise HorovodInternalError("Reducescatter currently only supports AVERAGE and SUM.")
    src = _host(tensor)
    op_ = _submit(e.engine, _named.REDUCESCATTER, _op_name("reducescatter", name, handle).encode(), dtype=dtype,
                  shape=tensor.shape, sendbuf=src.data_ptr(), op=_REDOPS[op], prescale=float(prescale_factor),
                  postscale=float(postscale_factor), keep=(src,))
    tail = tuple(tensor.shape[1:])
    return _register([op_], lambda: _result_tensor(op_, tensor, tail, output), handle)


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set, prescale_factor=1.0,
                        postscale_factor=1.0):
    """Starts reducing `tensor` (op Average, the default, or Sum) over process_set and scattering the
    result's rows (the first ranks get one more where they do not divide evenly); returns a handle."""
    output = tensor.new()
    return _reducescatter_async(tensor, output, name, op, process_set, prescale_factor, postscale_factor)


class HorovodReducescatter(torch.autograd.Function):
    """Reducescatter with a gradient: the gradients allgathered (scaled as the forward was)."""

    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale_factor, postscale_factor):
        ctx.op = op
        ctx.process_set = process_set
        ctx.prescale_factor = prescale_factor
        ctx.postscale_factor = postscale_factor
        handle = reducescatter_async(tensor, name, op, process_set, prescale_factor, postscale_factor)
        return synchronize(handle)

    @staticmethod
    def backward(ctx, grad_output):
        if ctx.op == Sum:
            grad_output *= ctx.process_set.size()
        if ctx.prescale_factor != 1.0:
            grad_output *= ctx.prescale_factor
        if ctx.postscale_factor != 1.0:
            grad_output *= ctx.postscale_factor
        return allgather(grad_output, process_set=ctx.process_set), None, None, None, None, None


def reducescatter(tensor, name=None, compression=Compression.none, op=Average, process_set=global_process_set,
                  prescale_factor=1.0, postscale_factor=1.0):
    """`tensor` reduced over process_set (Average by default, or Sum), this rank's rows of the
    result.  Differentiable."""
    tensor_compressed, ctx = compression.compress(tensor)
    reduced = HorovodReducescatter.apply(tensor_compressed, name, op, process_set, prescale_factor,
                                         postscale_factor)
    return compression.decompress(reduced, ctx)


def _grouped_reducescatter_async(tensors, outputs, name, op, process_set: ProcessSet, prescale_factor,
                                 postscale_factor):
    _check_tensor(tensors[0], _REDUCE_DTYPES)
    dtypes = [_check_tensor(t, _REDUCE_DTYPES) for t in tensors]
    _check_initialized()
    if len(tensors) != len(outputs):
        raise HorovodInternalError("Number of tensors and outputs must be equal")
    handle = next(_handles)
    _device_of(tensors)
    ps_id = process_set.process_set_id
    for t in tensors:
        if t.dim() == 0:
            raise ValueError("Reducescatter does not support scalar inputs")
    known = _core.sets.get(ps_id) if ps_id is not None else None
    if known is None or known.engine is None:
        raise ValueError(f"Invalid process set id for this rank: {ps_id}")
    e = _core.entry(process_set, "Reducescatter")
    if op not in (Average, Sum):
        raise HorovodInternalError("Reducescatter currently only supports AVERAGE and SUM.")
    names = _group_names("grouped_reducescatter", name, handle, len(tensors))
    ops = []
    try:
        for t, dtype, nm in zip(tensors, dtypes, names):
            src = _host(t)
            ops.append(_submit(e.engine, _named.REDUCESCATTER, nm, dtype=dtype, shape=t.shape,
                               sendbuf=src.data_ptr(), op=_REDOPS[op], prescale=float(prescale_factor),
                               postscale=float(postscale_factor), keep=(src,)))
    except BaseException:
        _abandon(ops)
        raise

    def finish():
        return [_result_tensor(op_, t, tuple(t.shape[1:]), out) for op_, t, out in zip(ops, tensors, outputs)]
    return _register(ops, finish, handle)


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0):
    """reducescatter_async of a list of tensors under one base name."""
    outputs = [t.new() for t in tensors]
    return _grouped_reducescatter_async(tensors, outputs, name, op, process_set, prescale_factor,
                                        postscale_factor)


class HorovodGroupedReducescatter(torch.autograd.Function):
    """Grouped reducescatter with a gradient."""

    @staticmethod
    def forward(ctx, name, op, process_set, prescale_factor, postscale_factor, *tensors):
        ctx.op = op
        ctx.process_set = process_set
        ctx.prescale_factor = prescale_factor
        ctx.postscale_factor = postscale_factor
        handle = grouped_reducescatter_async(list(tensors), name, op, process_set, prescale_factor,
                                             postscale_factor)
        return tuple(synchronize(handle))

    @staticmethod
    def backward(ctx, *grad_output):
        if ctx.op == Sum:
            grad_output = [g * ctx.process_set.size() for g in grad_output]
        if ctx.prescale_factor != 1.0:
            grad_output = [ctx.prescale_factor * g for g in grad_output]
        if ctx.postscale_factor != 1.0:
            grad_output = [ctx.postscale_factor * g for g in grad_output]
        return (None, None, None, None, None, *grouped_allgather(grad_output, process_set=ctx.process_set))


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """reducescatter of a list of tensors (one base name; results in a list).  Differentiable."""
    tensors_compressed, ctxs = [], []
    for tensor in tensors:
        c, ctx = compression.compress(tensor)
        tensors_compressed.append(c)
        ctxs.append(ctx)
    reduced = HorovodGroupedReducescatter.apply(name, op, process_set, prescale_factor, postscale_factor,
                                                *tensors_compressed)
    return [compression.decompress(t, ctx) for t, ctx in zip(reduced, ctxs)]


# ---- handles, join, barrier -----------------------------------------------------------------------

def poll(handle):
    """Whether the operation of `handle` completed (synchronize() will not block)."""
    p = _handle_map.get(handle)
    if p is None or p.finish is None:
        raise ValueError(f"Handle {handle} was not created or has been cleared.")
    return all(op_.poll() for op_ in p.ops)


def synchronize(handle):
    """Waits for the operation of `handle` and returns its result (None for an unknown handle).
    A failed operation raises HorovodInternalError with its message."""
    p = _handle_map.get(handle)
    if p is None:
        return None
    if p.finish is None:
        _handle_map.pop(handle, None)
        raise ValueError(f"Handle {handle} was not created or has been cleared.")
    try:
        for op_ in p.ops:
            op_.wait()
    except _named.NamedOpError as e:
        _handle_map.pop(handle, None)
        _release(p.ops)
        for op_ in p.ops:
            op_.free()
        raise HorovodInternalError(str(e)) from None
    try:
        return p.finish()
    finally:
        _handle_map.pop(handle, None)
        _release(p.ops)
        for op_ in p.ops:
            op_.free()


def join(device=-1) -> int:
    """Tells the other ranks that this one has no more data: until every rank joined, this rank
    takes part in their allreduces with zeros.  Blocks until every rank joined; returns the rank
    that joined last."""
    _check_initialized()
    handle = next(_handles)
    e = _core.entry(global_process_set, "Join")
    op_ = _submit(e.engine, _named.JOIN, b"join.noname")
    _handle_map[handle] = _Pending([op_], lambda: op_.join_rank())
    return synchronize(handle)


def barrier(process_set=global_process_set):
    """Blocks until every process of process_set reached it."""
    _check_initialized()
    handle = next(_handles)
    e = _core.entry(process_set, "Barrier")
    op_ = _submit(e.engine, _named.BARRIER, b"barrier.noname")
    _handle_map[handle] = _Pending([op_], lambda: None)
    synchronize(handle)

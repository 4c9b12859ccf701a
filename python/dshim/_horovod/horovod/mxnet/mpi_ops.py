"""horovod.mxnet's operations (Horovod 0.28.1's horovod/mxnet/mpi_ops.py) on dshim's engine of
operations matched by name (dshim._named), shared with horovod.torch through horovod.common.

Names are Horovod's MXNet names: "horovod_allreduce.<name>", or "horovod_allreduce.noname.<n>"
for an unnamed one (n counts unnamed operations per process, never reset, as Horovod's
op_count), "<base>_<i>of<n>" for the members of a grouped operation.  The engine runs a name
once every rank of the process set has submitted it.

Horovod pushes its operations onto MXNet's engine and returns at once; a failure shows at the
first read of the output (MXNetError).  Here every operation completes before it returns: the
inputs are read once MXNet has finished writing them, the outputs written once MXNet has
finished with them (horovod.mxnet._ndarray), so the result is there at the first read as it
is with Horovod, and a failure raises at the call, on every rank of the set, as
HorovodMXNetError, which is both MXNet's MXNetError (what Horovod's users catch) and Horovod's
HorovodInternalError.  An argument refused on this rank alone raises MXNetError (Horovod's
enqueue errors come through MXNet's check_call), or ValueError where Horovod's Python raises it.
"""
import ctypes
import itertools

import mxnet as mx
import numpy as np
from mxnet.base import MXNetError

from dshim import _lib as _dlib
from dshim import _named

from horovod.common.basics import HorovodBasics as _HorovodBasics, _core
from horovod.common.exceptions import HorovodInternalError
from horovod.common.process_sets import _setup as _setup_process_sets
from horovod.common.process_sets import ProcessSet, global_process_set, add_process_set, remove_process_set
from horovod.common.util import get_average_backwards_compatibility_fun
from horovod.mxnet import _ndarray as _nd

_basics = _HorovodBasics(__file__, 'mpi_lib')

shutdown = _basics.shutdown
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
rocm_built = _basics.rocm_built
is_homogeneous = _basics.is_homogeneous


def cuda_built():
    """False: dshim's horovod.mxnet runs CPU NDArrays only (horovod.common's answer is torch's)."""
    return False


def init(*args, **kwargs):
    """Initializes Horovod: init(comm=None, process_sets=None); see HorovodBasics.init."""
    _basics.init(*args, **kwargs)
    _setup_process_sets(_basics)


Average = _basics.Average
Sum = _basics.Sum
Adasum = _basics.Adasum
Min = _basics.Min
Max = _basics.Max
Product = _basics.Product

handle_average_backwards_compatibility = get_average_backwards_compatibility_fun(_basics)

_setup_process_sets(_basics)


class HorovodMXNetError(HorovodInternalError, MXNetError):
    """A horovod.mxnet operation failed on every rank of its set (ranks disagree on its dtype,
    shape, root or op, a rank was lost, Horovod shut down)."""


# ---- dtypes, ops, names ------------------------------------------------------------------------

# what Horovod's MXNet layer takes (its tensor_util: mshadow's float32/64/16, uint8, int8, int32,
# int64), each as dshim's type of the same name, looked up in the library by name
_MX_DTYPES = ("float32", "float64", "float16", "uint8", "int8", "int32", "int64")
_codes = {}


def _lookup(fn_name, names):
    fn = _dlib.lib()[fn_name]   # a private function object: its restype is ours alone
    fn.restype = ctypes.c_char_p
    fn.argtypes = [ctypes.c_int]
    table = {}
    for code in itertools.count():
        name = fn(code).decode()
        if name.startswith("invalid"):
            break
        table[name] = code
    missing = [n for n in names if n not in table]
    if missing:
        raise RuntimeError(f"dshim: {_dlib.lib().path} has no {fn_name} for {missing}: rebuild it (make)")
    return {n: table[n] for n in names}


def _load_codes():
    if not _codes:
        _codes.update(_lookup("dshim_dtype_name", _MX_DTYPES))
        redops = _lookup("dshim_redop_name", ("sum", "avg", "min", "max", "prod"))
        _codes.update({("op", Sum): redops["sum"], ("op", Average): redops["avg"], ("op", Min): redops["min"],
                       ("op", Max): redops["max"], ("op", Product): redops["prod"]})


def _dtype(arr, what):
    _load_codes()
    name = np.dtype(arr.dtype).name
    code = _codes.get(name)
    if code is None:
        raise _refused(what, f"Unsupported tensor type {name}; Horovod takes {', '.join(_MX_DTYPES)}")
    return code


def _redop(op, what):
    _load_codes()
    code = _codes.get(("op", op))
    if code is None:
        raise _refused(what, f"Reduction op type {op} not supported.")
    return code


def _refused(what, why):
    where = f"rank {_core.rank}" if _core.rank >= 0 else "before hvd.init()"
    return MXNetError(f"horovod.mxnet {where}: {what}: {why}")


def _check_cpu(tensors, what):
    for t in tensors:
        why = _nd.refusal(t)
        if why:
            raise _refused(what, why)


_noname = itertools.count(1)


def _base_name(kind, name):
    if isinstance(name, str):
        return f"horovod_{kind}.{name}"
    if isinstance(name, bytes):
        return f"horovod_{kind}.{name.decode()}"
    return f"horovod_{kind}.noname.{next(_noname)}"


def _names(kind, name, n):
    base = _base_name(kind, name)
    if n == 1:
        return [base.encode()]
    return [f"{base}_{i + 1}of{n}".encode() for i in range(n)]


def _engine(process_set, what):
    """The set's registered entry; Horovod's refusals (not initialised, a set that is not registered
    or that this rank is not in) as MXNetError, as its enqueue's check_call raises them."""
    try:
        return _core.entry(process_set, what)
    except (ValueError, HorovodInternalError) as e:
        raise _refused(what, str(e)) from None


def _run(engine, requests):
    """Submits every request (kwargs of Engine.submit), then waits for all of them; returns the
    completed ops (free them).  A refused submission leaves the earlier ones to complete when the
    other ranks submit them; a failed operation raises HorovodMXNetError."""
    ops = []
    try:
        for req in requests:
            ops.append(engine.submit(**req))
    except _named.NamedOpError as e:
        for op_ in ops:
            _named.orphan(op_)
        raise HorovodMXNetError(str(e)) from None
    except ValueError as e:
        for op_ in ops:
            _named.orphan(op_)
        raise MXNetError(str(e)) from None
    failed = None
    for op_ in ops:
        try:
            op_.wait()
        except _named.NamedOpError as e:
            failed = failed or e
    if failed is not None:
        for op_ in ops:
            op_.free()
        raise HorovodMXNetError(str(failed))
    return ops


def _free(ops):
    for op_ in ops:
        op_.free()


# ---- allreduce ----------------------------------------------------------------------------------

def _allreduce(tensors, outputs, name, op, prescale_factor, postscale_factor, process_set):
    assert op != Adasum
    what = "allreduce"
    redop = _redop(op, what)
    _check_cpu(tensors, what)
    dtypes = [_dtype(t, what) for t in tensors]
    e = _engine(process_set, "Allreduce")
    requests = []
    for t, out, dtype, nm in zip(tensors, outputs, dtypes, _names("allreduce", name, len(tensors))):
        src = _nd.read_address(t)
        dst = _nd.write_address(out)
        requests.append(dict(kind=_named.ALLREDUCE, name=nm, dtype=dtype, shape=t.shape, sendbuf=src,
                             recvbuf=dst, op=redop, prescale=float(prescale_factor),
                             postscale=float(postscale_factor), keep=(t, out)))
    _free(_run(e.engine, requests))


def allreduce(tensor, average=None, name=None, priority=0, prescale_factor=1.0,
              postscale_factor=1.0, process_set=global_process_set, op=None):
    """Averages (op=Average, the default) or reduces `tensor` over the processes of process_set
    into a new NDArray; the input is not modified.  Matched across ranks by `name` (an automatic
    one when None).  `priority` is accepted and has no effect (the operation runs at once)."""
    op = handle_average_backwards_compatibility(op, average)
    output = mx.nd.zeros(shape=tensor.shape, ctx=tensor.context, dtype=tensor.dtype)
    _allreduce([tensor], [output], name, op, prescale_factor, postscale_factor, process_set)
    return output


def allreduce_(tensor, average=None, name=None, priority=0, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set, op=None):
    """allreduce in place: `tensor` receives the result and is returned."""
    op = handle_average_backwards_compatibility(op, average)
    _allreduce([tensor], [tensor], name, op, prescale_factor, postscale_factor, process_set)
    return tensor


def grouped_allreduce(tensors, average=None, name=None, priority=0, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=global_process_set, op=None):
    """allreduce of a list of NDArrays under one base name; a list of new NDArrays."""
    op = handle_average_backwards_compatibility(op, average)
    assert op != Adasum
    if not tensors:
        return tensors
    outputs = [mx.nd.zeros(shape=t.shape, ctx=t.context, dtype=t.dtype) for t in tensors]
    _allreduce(list(tensors), outputs, name, op, prescale_factor, postscale_factor, process_set)
    return outputs


def grouped_allreduce_(tensors, average=None, name=None, priority=0, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set, op=None):
    """grouped_allreduce in place; returns `tensors`."""
    op = handle_average_backwards_compatibility(op, average)
    assert op != Adasum
    if not tensors:
        return tensors
    _allreduce(list(tensors), list(tensors), name, op, prescale_factor, postscale_factor, process_set)
    return tensors


# ---- allgather ----------------------------------------------------------------------------------

def _allgather(tensors, name, process_set):
    what = "allgather"
    assert all(isinstance(t, mx.nd.NDArray) for t in tensors)
    _check_cpu(tensors, what)
    dtypes = [_dtype(t, what) for t in tensors]
    e = _engine(process_set, "Allgather")
    requests = [dict(kind=_named.ALLGATHER, name=nm, dtype=dtype, shape=t.shape, sendbuf=_nd.read_address(t),
                     keep=(t,))
                for t, dtype, nm in zip(tensors, dtypes, _names("allgather", name, len(tensors)))]
    ops = _run(e.engine, requests)
    try:
        outputs = []
        for t, op_ in zip(tensors, ops):
            ptr, nbytes, dim0, _ = op_.result()
            outputs.append(_nd.new_from(ptr, nbytes, (dim0,) + tuple(t.shape[1:]), t))
        return outputs
    finally:
        _free(ops)


def allgather(tensor, name=None, priority=0, process_set=global_process_set):
    """`tensor` of every process of process_set concatenated along the first dimension (which may
    differ between ranks), into a new NDArray."""
    return _allgather([tensor], name, process_set)[0]


def grouped_allgather(tensors, name=None, priority=0, process_set=global_process_set):
    """allgather of a list of NDArrays under one base name."""
    if not tensors:
        return []
    return _allgather(list(tensors), name, process_set)


# ---- broadcast ----------------------------------------------------------------------------------

def broadcast_(tensor, root_rank, name=None, priority=0, process_set=global_process_set):
    """`tensor` of global rank root_rank copied into `tensor` of every process of process_set;
    returns `tensor`."""
    what = "broadcast"
    _check_cpu([tensor], what)
    dtype = _dtype(tensor, what)
    e = _engine(process_set, "Broadcast")
    root = e.global_to_set.get(root_rank)
    if root is None:
        raise _refused(what, f"broadcast received invalid root rank {root_rank} for provided process set "
                             f"{e.ranks}")
    buf = _nd.write_address(tensor)
    _free(_run(e.engine, [dict(kind=_named.BROADCAST, name=_names("broadcast", name, 1)[0], dtype=dtype,
                               shape=tensor.shape, sendbuf=buf, recvbuf=buf, root=root, keep=(tensor,))]))
    return tensor


def broadcast(tensor, root_rank, name=None, priority=0, process_set=global_process_set):
    """`tensor` of global rank root_rank, as a new NDArray on every process of process_set; the
    input is not modified."""
    return broadcast_(tensor.copy(), root_rank, name=name, priority=priority, process_set=process_set)


# ---- alltoall -----------------------------------------------------------------------------------

def alltoall(tensor, splits=None, name=None, priority=0, process_set=global_process_set):
    """Rows of `tensor` scattered to the processes of process_set (splits[i] rows to the i-th, an
    even split when None), theirs gathered: the output, and with splits given also an int32
    NDArray of the rows received from each."""
    assert isinstance(tensor, mx.nd.NDArray)
    what = "alltoall"
    want_splits = splits is not None
    if splits is None:
        splits = mx.nd.array([], ctx=mx.cpu(), dtype='int32')
    elif not isinstance(splits, mx.nd.NDArray):
        splits = mx.nd.array(splits, ctx=mx.cpu(), dtype='int32')
    _check_cpu([tensor], what)
    dtype = _dtype(tensor, what)
    e = _engine(process_set, "Alltoall")
    if len(splits.shape) > 1:
        raise _refused(what, "alltoall expects a 1D splits tensor")
    if np.dtype(splits.dtype) != np.int32:
        raise _refused(what, f"alltoall expects splits to contain 32-bit integer elements (got "
                             f"{np.dtype(splits.dtype).name})")
    n = len(e.ranks)
    dim0 = tensor.shape[0] if tensor.shape else 1
    if splits.size == n:
        split_list = [int(s) for s in splits.asnumpy().tolist()]
        if sum(split_list) > dim0:
            raise _refused(what, f"Sum of splits entries ({sum(split_list)}) is greater than the first dimension "
                                 f"of tensor ({dim0}).")
    elif splits.size == 0:
        if dim0 % n != 0:
            raise _refused(what, f"splits not provided, but first dimension of tensor ({dim0}) is not an even "
                                 f"multiple of the number of workers ({n}).")
        split_list = [dim0 // n] * n
    else:
        raise _refused(what, f"Number of entries in splits ({splits.size}) does not equal number of workers ({n}).")
    shape = list(tensor.shape)
    if shape:
        shape[0] = sum(split_list)   # rows past the splits' sum are not sent
    ops = _run(e.engine, [dict(kind=_named.ALLTOALL, name=_names("alltoall", name, 1)[0], dtype=dtype,
                               shape=shape, sendbuf=_nd.read_address(tensor), splits=split_list, keep=(tensor,))])
    try:
        ptr, nbytes, rows, received = ops[0].result(n)
        output = _nd.new_from(ptr, nbytes, (rows,) + tuple(tensor.shape[1:]), tensor)
    finally:
        _free(ops)
    if want_splits:
        return output, mx.nd.array(received, ctx=mx.cpu(), dtype='int32')
    return output


# ---- reducescatter ------------------------------------------------------------------------------

def _reducescatter(tensors, op, name, process_set, prescale_factor, postscale_factor):
    what = "reducescatter"
    _check_cpu(tensors, what)
    dtypes = [_dtype(t, what) for t in tensors]
    redop = _redop(op, what)
    e = _engine(process_set, "Reducescatter")
    requests = [dict(kind=_named.REDUCESCATTER, name=nm, dtype=dtype, shape=t.shape, sendbuf=_nd.read_address(t),
                     op=redop, prescale=float(prescale_factor), postscale=float(postscale_factor), keep=(t,))
                for t, dtype, nm in zip(tensors, dtypes, _names("reducescatter", name, len(tensors)))]
    ops = _run(e.engine, requests)
    try:
        outputs = []
        for t, op_ in zip(tensors, ops):
            ptr, nbytes, dim0, _ = op_.result()
            outputs.append(_nd.new_from(ptr, nbytes, (dim0,) + tuple(t.shape[1:]), t))
        return outputs
    finally:
        _free(ops)


def reducescatter(tensor, op=Average, name=None, priority=0,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """`tensor` reduced (op Average or Sum) over the processes of process_set, each receiving its
    share of the first dimension (the first ranks one row more when it does not divide)."""
    assert isinstance(tensor, mx.nd.NDArray)
    assert op in [Average, Sum]
    if tensor.shape == ():
        raise ValueError("reducescatter does not support scalar inputs")
    return _reducescatter([tensor], op, name, process_set, prescale_factor, postscale_factor)[0]


def grouped_reducescatter(tensors, op=Average, name=None, priority=0,
                          process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """reducescatter of a list of NDArrays under one base name."""
    assert all(isinstance(t, mx.nd.NDArray) for t in tensors)
    assert op in [Average, Sum]
    if any(t.shape == () for t in tensors):
        raise ValueError("groued_reducescatter does not support scalar inputs")   # Horovod's own words
    if not tensors:
        return []
    return _reducescatter(list(tensors), op, name, process_set, prescale_factor, postscale_factor)

"""horovod.mxnet's object helpers (Horovod 0.28.1's horovod/mxnet/functions.py): any picklable
object broadcast or gathered as bytes (cloudpickle, as Horovod) through the NDArray operations."""
import io

import cloudpickle
import mxnet as mx

from horovod.mxnet.mpi_ops import allgather, broadcast_
from horovod.mxnet.mpi_ops import rank, size


def broadcast_object(obj, root_rank=0, name=None):
    """The object of root_rank, on every rank (name: the operations' base name, the object's
    class name by default)."""
    if name is None:
        name = type(obj).__name__
    if rank() == root_rank:
        b = io.BytesIO()
        cloudpickle.dump(obj, b)
        t = mx.nd.array(bytearray(b.getvalue()), dtype='byte')
        sz = mx.nd.array([t.size], dtype='int')
        broadcast_(sz, root_rank, name + '.sz')
    else:
        sz = mx.nd.empty(shape=[1], dtype='int')
        broadcast_(sz, root_rank, name + '.sz')
        t = mx.nd.empty(shape=[int(sz.asscalar())], dtype='byte')
    broadcast_(t, root_rank, name + '.t')
    if rank() != root_rank:
        obj = cloudpickle.load(io.BytesIO(t.asnumpy().tobytes()))
    return obj


def allgather_object(obj, name=None):
    """The list of every rank's object, in rank order."""
    if name is None:
        name = type(obj).__name__
    b = io.BytesIO()
    cloudpickle.dump(obj, b)
    t = mx.nd.array(bytearray(b.getvalue()), dtype='byte')
    sz = mx.nd.array([t.size], dtype='int')
    sizes = allgather(sz, name=name + '.sz').asnumpy()
    gathered = allgather(t, name=name + '.t').asnumpy()
    out, start = [], 0
    for n in sizes:
        out.append(cloudpickle.load(io.BytesIO(gathered[start:start + int(n)].tobytes())))
        start += int(n)
    return out

"""An NDArray's memory, as dshim's engine reads and writes it: through MXNet's own C API.

MXNet runs operations asynchronously on its engine; an NDArray's bytes are only stable once the
engine has finished every operation that writes it (MXNDArrayWaitToRead) and, before we write
into it, every operation that still reads it (MXNDArrayWaitToWrite).  After that wait nothing
else of this thread touches the array until our operation returns, because horovod.mxnet's
operations complete before they return (docs/horovod.md: "horovod.mxnet").  The address is
MXNDArrayGetData's: the array's own data, with a slice's offset, allocated if it was not yet
(a fresh mx.nd.empty).

Only dense CPU arrays are handed to the engine.  A GPU array would need a copy through the host
and its stream's synchronisation; dshim's MXNet layer does not do that and says so.
"""
import ctypes

import mxnet as mx
from mxnet.base import _LIB, check_call

_DENSE = "default"


def refusal(arr):
    """Why arr cannot be handed to the engine (Horovod's enqueue refuses it alike), or None: only
    dense CPU NDArrays can."""
    if not isinstance(arr, mx.nd.NDArray):
        return f"expected an mxnet NDArray, got {type(arr).__name__}"
    if arr.stype != _DENSE:
        return (f"a {arr.stype} NDArray is not supported; Horovod reduces dense NDArrays "
                f"(convert with .tostype('default'))")
    if arr.context.device_type != "cpu":
        return (f"the NDArray is on {arr.context}; dshim's horovod.mxnet runs on CPU NDArrays only "
                f"(copy it with .as_in_context(mx.cpu()))")
    return None


def _address(arr):
    ptr = ctypes.c_void_p()
    check_call(_LIB.MXNDArrayGetData(arr.handle, ctypes.byref(ptr)))
    return ptr.value


def read_address(arr):
    """The address of arr's data once every pending write of it has finished."""
    check_call(_LIB.MXNDArrayWaitToRead(arr.handle))
    return _address(arr)


def write_address(arr):
    """The address of arr's data once every pending read and write of it has finished."""
    check_call(_LIB.MXNDArrayWaitToWrite(arr.handle))
    return _address(arr)


def new_from(address, size_bytes, shape, like):
    """A new CPU NDArray of `shape` and like's dtype holding size_bytes copied from address."""
    out = mx.nd.empty(shape, ctx=like.context, dtype=like.dtype)
    if size_bytes:
        ctypes.memmove(write_address(out), address, size_bytes)
    return out

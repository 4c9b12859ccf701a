"""Host buffers for dshim: contiguous CPU tensors are used in place; other
tensors go through contiguous host copies, which are copied back into the
caller's tensors before the operation's Future completes.

CUDA tensors are staged through pinned host blocks of libdshim's GPU module
(shim/gpu, the one the NCCL hook uses too): dshim_gpu_stage_get hands out a
block of its pool, dshim_gpu_copy_async copies on a CUDA stream through the
CUDA runtime the process already loaded.  The order is the one torch's own
copies give: the copy in is queued on the tensor's current stream, after the
work that produced the tensor, and waited for before dshim reads the block;
the copy back is queued on the stream that was current when the operation
was issued and waited for before the Future completes, so later work on that
stream sees the result.  A block goes back to the pool when the last tensor
over it is gone.  Where libdshim finds no CUDA runtime or no pinned memory,
torch's copies (.to("cpu"), copy_) stage instead, with the same order.
"""
import ctypes

import torch

from . import _lib

_gpu_ok = False   # libdshim found the process's CUDA runtime (checked until it does)


def _plain(t):
    """True when dshim can use t's memory directly."""
    return t.device.type == "cpu" and t.is_contiguous() and not t.is_conj() and not t.is_neg()


def _nbytes(t):
    return t.numel() * t.element_size()


def _gpu_lib():
    """libdshim when it can stage CUDA tensors, else None."""
    global _gpu_ok
    lib = _lib.lib()
    if not _gpu_ok:
        _gpu_ok = bool(lib.dshim_gpu_available())
    return lib if _gpu_ok else None


class _Block:
    """A pinned block of libdshim's pool, given back when the last tensor over it dies."""
    __slots__ = ("handle",)

    def __init__(self, handle):
        self.handle = handle

    def __del__(self):
        try:
            lib = _lib._lib
        except AttributeError:   # interpreter shutdown: the process's memory goes anyway
            return
        if lib is not None and self.handle:
            lib.dshim_gpu_stage_put(self.handle)
            self.handle = None


def _pinned_empty(shape, dtype, nbytes):
    """An uninitialised contiguous CPU tensor of nbytes in a pinned block, or None."""
    lib = _gpu_lib()
    if lib is None or nbytes == 0:
        return None
    host = ctypes.c_void_p()
    handle = lib.dshim_gpu_stage_get(nbytes, ctypes.byref(host))
    if not handle:
        return None   # pinning failed: torch's copies stage instead
    mem = (ctypes.c_ubyte * nbytes).from_address(host.value)
    mem.block = _Block(handle)   # lives as long as the tensors over mem
    return torch.frombuffer(mem, dtype=torch.uint8).view(dtype).view(shape)


def _copy(dst, src, nbytes, device, stream):
    """Queues a copy between host and device on `stream` of `device`."""
    lib = _lib.lib()
    _lib.check(lib.dshim_gpu_copy_async(dst, src, nbytes, device, stream), "copying a CUDA tensor")


def _sync(device, stream):
    lib = _lib.lib()
    _lib.check(lib.dshim_gpu_stream_sync(device, stream), "waiting for a CUDA stream")


def _from_device(t):
    """A contiguous host copy of CUDA tensor t, taken in t's current stream's order."""
    src = t.detach().resolve_conj().resolve_neg().contiguous()   # on the device, on the current stream
    h = _pinned_empty(src.shape, src.dtype, _nbytes(src))
    if h is None:
        return src.to("cpu")   # waits for the current stream too
    dev = src.device.index
    stream = torch.cuda.current_stream(src.device).cuda_stream
    _copy(h.data_ptr(), src.data_ptr(), _nbytes(src), dev, stream)
    _sync(dev, stream)   # dshim reads the block as soon as it has it
    return h


def _host_copy(t):
    """A contiguous CPU copy of t (staging for non-contiguous or CUDA tensors)."""
    if t.device.type == "cpu":
        return t.resolve_conj().resolve_neg().contiguous()
    if t.device.type == "cuda":
        return _from_device(t)
    return t.detach().to("cpu").contiguous()


def _host_clone(t):
    """A contiguous CPU copy of t that never shares t's memory (it gets scaled)."""
    if t.device.type == "cuda":
        return _from_device(t)   # a block of its own
    return t.detach().to("cpu", copy=True, memory_format=torch.contiguous_format).resolve_conj().resolve_neg()


def _raw_copy_back_ok(dst, src):
    """dst <- src can be one copy of bytes (else torch's copy_ does it)."""
    return (dst.dtype == src.dtype and dst.numel() == src.numel() and dst.is_contiguous() and src.is_contiguous()
            and not dst.is_conj() and not dst.is_neg() and not src.is_conj() and not src.is_neg())


class _Staging:
    """Host buffers for one operation, and the copies back it needs."""
    __slots__ = ("keep", "back", "streams")

    def __init__(self):
        self.keep = []
        self.back = []
        self.streams = None

    def input(self, t):
        """Pointer to t's data, read-only use."""
        if _plain(t):
            self.keep.append(t)
            return t
        h = _host_copy(t)
        self.keep.append(h)
        return h

    def inout(self, t):
        """Host tensor dshim reads and writes; copied back into t at completion."""
        if _plain(t):
            self.keep.append(t)
            return t
        h = _host_copy(t)
        self.keep.append(t)
        self.keep.append(h)
        self.add_back(t, h)
        return h

    def output(self, t):
        """Host tensor dshim only writes; copied back into t at completion."""
        if _plain(t):
            self.keep.append(t)
            return t
        h = _pinned_empty(t.shape, t.dtype, _nbytes(t)) if t.device.type == "cuda" else None
        if h is None:
            h = torch.empty(t.shape, dtype=t.dtype)
        self.keep.append(t)
        self.keep.append(h)
        self.add_back(t, h)
        return h

    def add_back(self, dst, src):
        self.back.append((dst, src))
        if dst.device.type == "cuda":
            # copy back on the stream that was current when the op was issued
            if self.streams is None:
                self.streams = {}
            self.streams.setdefault(dst.device, torch.cuda.current_stream(dst.device))

    def post(self):
        if not self.back:
            return None
        return self._copy_back

    def _copy_back(self):
        if self.streams is None:
            for dst, src in self.back:
                dst.copy_(src.view(dst.shape) if src.shape != dst.shape else src)
            return
        raw = _gpu_lib() is not None
        for dst, src in self.back:
            if dst.device.type == "cuda":
                s = self.streams[dst.device]
                if raw and _raw_copy_back_ok(dst, src):
                    _copy(dst.data_ptr(), src.data_ptr(), _nbytes(src), dst.device.index, s.cuda_stream)
                    continue
                with torch.cuda.stream(s):
                    dst.copy_(src.view(dst.shape) if src.shape != dst.shape else src)
            else:
                dst.copy_(src.view(dst.shape) if src.shape != dst.shape else src)
        for dev, s in self.streams.items():
            # the Future completes only when the data is there
            if raw:
                _sync(dev.index, s.cuda_stream)
            else:
                s.synchronize()

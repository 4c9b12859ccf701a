"""Host buffers for dshim: contiguous CPU tensors are used in place; other
tensors go through contiguous host copies, which are copied back into the
caller's tensors before the operation's Future completes."""
import torch


def _plain(t):
    """True when dshim can use t's memory directly."""
    return t.device.type == "cpu" and t.is_contiguous() and not t.is_conj() and not t.is_neg()


def _host_copy(t):
    """A contiguous CPU copy of t (staging for non-contiguous or CUDA tensors)."""
    if t.device.type == "cpu":
        return t.resolve_conj().resolve_neg().contiguous()
    # TODO(issue 5): hand device buffers to dshim; .cpu() waits for the current stream
    return t.detach().to("cpu").contiguous()


def _host_clone(t):
    """A contiguous CPU copy of t that never shares t's memory (it gets scaled)."""
    return t.detach().to("cpu", copy=True, memory_format=torch.contiguous_format).resolve_conj().resolve_neg()


def _nbytes(t):
    return t.numel() * t.element_size()


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
        for dst, src in self.back:
            if dst.device.type == "cuda":
                s = self.streams[dst.device]
                with torch.cuda.stream(s):
                    dst.copy_(src.view(dst.shape) if src.shape != dst.shape else src)
            else:
                dst.copy_(src.view(dst.shape) if src.shape != dst.shape else src)
        for s in self.streams.values():
            s.synchronize()   # the Future completes only when the data is there

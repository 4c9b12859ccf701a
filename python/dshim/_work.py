"""DshimWork: the Work object every dshim operation returns."""
import collections
import datetime
import threading
import time

import torch
import torch.distributed as dist

_Future = torch.futures.Future
_now = time.monotonic

# torch < 2.0's PyWork trampoline does not own the Python object: once the
# last Python reference is gone, a C++ caller's wait() finds no override and
# blocks in the base Work forever (DDP's constructor hangs on Debian's 1.13).
# There, the most recent Works are kept alive here; 2.x keeps them itself.
_LEGACY_TRAMPOLINE = int(torch.__version__.split(".")[0]) < 2
_keep_alive = collections.deque(maxlen=4096)


def _unwrap(fut):
    return fut.value()   # re-raises the operation's error inside torch's callback machinery


_profiler_on = getattr(torch.autograd, "_profiler_enabled", lambda: False)


def profiled(title, tensors, issue):
    """issue() -> DshimWork, inside a profiler event as gloo's Work records one:
    named `title` ("gloo:send", "gloo:recvAnySource"), the tensors' shapes as
    inputs, asynchronous.

    torch's Python Work cannot carry a profiling title, so the event is a
    RecordFunction entered here with the tensors as inputs and ended through
    torch's own future callback that carries the profiler's thread-local state
    to the thread that completes the future (_call_end_callbacks_on_jit_fut, as
    RPC does; a plain end there would be lost).  The profiler calls an event
    asynchronous when it ends in another thread than it began: it ends in a
    short-lived thread of its own (only while a profiler runs), which also
    covers an operation that finished before this returns.  Costs nothing while
    no profiler runs."""
    if not _profiler_on():
        return issue()
    rf = torch._C._autograd._record_function_with_args_enter(title, *tensors)
    try:
        work = issue()
    except BaseException:
        torch.ops.profiler._record_function_exit._RecordFunction(rf)
        raise
    gate = _Future()
    work._profiled = torch.ops.profiler._call_end_callbacks_on_jit_fut._RecordFunction(rf, gate)
    threading.Thread(target=_open_when_done, args=(work._src, gate), name="dshim-profiled", daemon=True).start()
    return work


def _open_when_done(src, gate):
    """Completes gate (ending a profiler event, in this thread) once src is."""
    try:
        if src is not None:
            src.wait()
    except Exception:
        pass   # the operation's error reaches its caller through its Work
    gate.set_result(None)


class DshimWork(dist.Work):
    """The Work of one dshim operation.

    Why not torch's _create_work_from_future: in torch 2.11 the Work it makes
    returns True from wait() even when the Future failed, and a Future failed
    with set_exception() looks successful from C++ (the exception is only its
    value).  Here wait() raises the operation's RuntimeError, and get_future()
    is a Future chained with then(), which C++ callers (DDP's comm hooks) see
    as failed.  C++ callers reach wait() and get_future() through torch's
    PyWork trampoline, which keeps this object alive as long as they hold it.
    """

    def __init__(self, src, result=None):
        super().__init__()
        self._src = src          # completed by the completion thread; None: finished already
        self._result = result
        self._fut = None
        self._source = None      # receives: the sender's rank, or a ctypes int dshim fills in
        self._profiled = None    # the future that ends this operation's profiler event (profiled())
        if _LEGACY_TRAMPOLINE:
            _keep_alive.append(self)

    def wait(self, timeout=None):
        src = self._src
        if src is None:
            if self._profiled is not None:
                self._profiled.wait()   # a blocking collective's event ends in a thread of its own too
            return True
        if timeout is not None and not src.done():
            limit = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)
            if limit > 0:
                deadline = _now() + limit
                while not src.done():
                    if _now() >= deadline:
                        raise RuntimeError(f"dshim: Work.wait(timeout={limit:g} s): the operation has not "
                                           f"completed yet")
                    time.sleep(0.0005)
        src.wait()   # raises the operation's error
        if self._profiled is not None:
            self._profiled.wait()   # its profiler event is recorded once wait() returns
        return True

    def get_future(self):
        if self._fut is None:
            if self._src is None:
                f = _Future()
                f.set_result(self._result)
                self._fut = f
            else:
                self._fut = self._src.then(_unwrap)
        return self._fut

    def is_completed(self):
        return self._src is None or self._src.done()

    def is_success(self):
        return self.is_completed() and self.exception() is None

    def exception(self):
        if self._src is None or not self._src.done():
            return None
        try:
            self._src.wait()
            return None
        except Exception as e:
            return e

    def result(self):
        self.wait()
        r = self._result
        if not isinstance(r, list):
            return []
        if any(isinstance(x, list) for x in r):   # gloo's words (allgather_into_tensor_coalesced)
            raise RuntimeError("work result does not support list of lists, use .getFuture() and value()")
        return r

    def synchronize(self):
        pass   # results are on their device when the operation completes

    # -- receives ---------------------------------------------------------------

    def _set_source(self, source):
        """The sender of a receive: its rank, or (any source) the ctypes int
        dshim writes the rank into before the receive completes."""
        self._source = source

    def _source_rank(self):
        """The rank the received message came from (dist.recv(t) with no src
        returns it), after waiting for the receive."""
        if self._source is None:
            raise RuntimeError("dshim: source_rank() is only defined for the Work of a recv/irecv")
        self.wait()
        return self._source if isinstance(self._source, int) else self._source.value

    source_rank = _source_rank

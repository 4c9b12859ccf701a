"""DshimWork: the Work object every dshim operation returns."""
import collections
import datetime
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
        if _LEGACY_TRAMPOLINE:
            _keep_alive.append(self)

    def wait(self, timeout=None):
        src = self._src
        if src is None:
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
        return r if isinstance(r, list) else []

    def synchronize(self):
        pass   # results are on their device when the operation completes

"""Operations matched by name across ranks (Horovod's model): a ctypes wrapper over
dshim_named_* of include/dshim.h, shared by the Horovod layers for torch and MXNet.

An Engine runs over a dshim communicator (dshim_named_create makes a private copy of it,
collectively); submit() hands it one operation under a name and returns an Op at once.
The engine runs the operation when every rank of its communicator has submitted that name,
whatever the order of submission on each rank.

Per-op cost matters (a DistributedOptimizer submits one op per gradient, every step): the
foreign functions are looked up once, and each Engine keeps one descriptor and shape array
that submit() fills under a lock (the C side copies them before dshim_named_submit
returns) instead of building ctypes objects per call.
"""
import ctypes
import threading

from . import _lib

ALLREDUCE = _lib.NAMED_ALLREDUCE
ALLGATHER = _lib.NAMED_ALLGATHER
BROADCAST = _lib.NAMED_BROADCAST
ALLTOALL = _lib.NAMED_ALLTOALL
REDUCESCATTER = _lib.NAMED_REDUCESCATTER
BARRIER = _lib.NAMED_BARRIER
JOIN = _lib.NAMED_JOIN
MAX_DIMS = _lib.NAMED_MAX_DIMS

_c_void_p = ctypes.c_void_p
_byref = ctypes.byref


class NamedOpError(RuntimeError):
    """A named operation failed (submission refused for a reason other than a bad
    argument, or the operation failed on completion); .status is the dshim_status_t."""

    def __init__(self, message, status):
        super().__init__(message)
        self.status = status


def _message(raw, fallback):
    return raw.decode(errors="replace") if raw else fallback


class _Fns:
    """The foreign functions, looked up once per process."""
    __slots__ = ("create", "submit", "poll", "wait", "error", "result", "join_rank", "op_free", "shutdown",
                 "destroy", "timeline", "last_error")

    def __init__(self, lib):
        self.create = lib.dshim_named_create
        self.submit = lib.dshim_named_submit
        self.poll = lib.dshim_named_poll
        self.wait = lib.dshim_named_wait
        self.error = lib.dshim_named_error
        self.result = lib.dshim_named_result
        self.join_rank = lib.dshim_named_join_rank
        self.op_free = lib.dshim_named_op_free
        self.shutdown = lib.dshim_named_shutdown
        self.destroy = lib.dshim_named_destroy
        self.timeline = lib.dshim_named_timeline
        self.last_error = lib.dshim_last_error


_fns = None


def _functions():
    global _fns
    if _fns is None:
        _fns = _Fns(_lib.lib())
    return _fns


class Op:
    """One submitted operation.  poll() / wait() / result(); free() releases it (also done when
    the object is collected).  `keep` holds whatever must outlive the operation (the buffers);
    `tag` is free for the layer above."""
    __slots__ = ("_h", "_fns", "keep", "name", "tag")

    def __init__(self, handle, fns, keep, name):
        self._h = handle
        self._fns = fns
        self.keep = keep
        self.name = name
        self.tag = None   # the layer above's own mark

    def poll(self):
        """True once the operation completed (successfully or not)."""
        return self._fns.poll(self._h) == 1

    def wait(self):
        """Waits for the operation; raises NamedOpError with the operation's message when it failed."""
        st = self._fns.wait(self._h)
        if st < 0:
            raise NamedOpError(_message(self._fns.error(self._h), f"dshim: {self.name.decode(errors='replace')} "
                                        f"failed with status {st}"), st)

    def error(self):
        return _message(self._fns.error(self._h), "")

    def result(self, want_splits=0):
        """(address, bytes, first dimension, received splits or None) of a completed allgather,
        alltoall or reducescatter; the memory is the operation's (valid until free())."""
        data = ctypes.c_void_p()
        nbytes = ctypes.c_size_t()
        dim0 = ctypes.c_int64()
        splits = (ctypes.c_int64 * want_splits)() if want_splits else None
        st = self._fns.result(self._h, _byref(data), _byref(nbytes), _byref(dim0), splits, want_splits)
        if st < 0:
            raise NamedOpError(_message(self._fns.last_error(), "dshim_named_result failed"), st)
        return data.value, nbytes.value, dim0.value, (list(splits) if splits is not None else None)

    def join_rank(self):
        """The last rank to join (a completed join)."""
        return self._fns.join_rank(self._h)

    def free(self):
        """Releases the operation; waits for it first (dshim_named_op_free)."""
        h, self._h = self._h, None
        if h:
            self._fns.op_free(h)
        self.keep = None

    def __del__(self):
        try:
            orphan(self)
        except Exception:   # interpreter shutdown: the library may be gone
            pass


# Operations dropped before they completed (a handle never synchronized, a group whose later
# member was refused): freeing one would wait for it, and its buffers must outlive it, so they
# wait here with their buffers until they completed -- at the latest when their engine is
# destroyed, which fails every pending operation.
_orphans = []
_orphans_lock = threading.RLock()   # re-entered when a collection inside a sweep drops an Op


def orphan(op):
    """Lets go of op without waiting: freed now if complete, else once it is."""
    h, op._h = op._h, None
    keep, op.keep = op.keep, None
    if not h and not _orphans:
        return   # freed already (the usual end of an Op), nothing waiting
    fns = op._fns
    with _orphans_lock:
        if h and fns.poll(h) != 1:
            _orphans.append((h, keep, fns))
        elif h:
            fns.op_free(h)
        _sweep_locked()


def _sweep_locked():
    items = _orphans[:]
    del _orphans[:]
    still = []
    for h, keep, fns in items:
        if fns.poll(h) == 1:
            fns.op_free(h)
        else:
            still.append((h, keep, fns))
    _orphans.extend(still)


class Engine:
    """An engine of operations matched by name over communicator `comm` (a dshim_comm_t
    pointer as an int or c_void_p); collective over comm's ranks."""

    def __init__(self, comm):
        fns = _functions()
        h = ctypes.c_void_p()
        st = fns.create(comm, _byref(h))
        if st < 0:
            raise NamedOpError(_message(fns.last_error(), "dshim_named_create failed"), st)
        self._h = h.value
        self._fns = fns
        self._lock = threading.Lock()
        self._desc = _lib.NamedDesc()
        self._shape = (ctypes.c_int64 * MAX_DIMS)()
        self._desc.shape = ctypes.cast(self._shape, ctypes.POINTER(ctypes.c_int64))
        self._splits = None
        self._splits_len = 0
        self._oph = ctypes.c_void_p()
        self._desc_p = ctypes.pointer(self._desc)
        self._oph_p = ctypes.pointer(self._oph)

    def submit(self, kind, name, dtype=0, shape=(), sendbuf=None, recvbuf=None, op=0, prescale=1.0,
               postscale=1.0, root=0, splits=None, device=-1, keep=None):
        """Submits one operation; returns its Op.  name: bytes.  sendbuf/recvbuf: addresses (int)
        or None.  Raises ValueError for a refused argument (a name already pending, ...) and
        NamedOpError for other refusals (the engine shut down)."""
        ndim = len(shape)
        if ndim > MAX_DIMS:
            raise ValueError(f"dshim: {name.decode(errors='replace')}: a tensor of {ndim} dimensions; at most "
                             f"{MAX_DIMS} are supported")
        with self._lock:
            h = self._h
            if h is None:
                raise NamedOpError(f"dshim: {name.decode(errors='replace')}: the engine was destroyed",
                                   _lib.ERR_ABORTED)
            d = self._desc
            d.kind = kind
            d.name = name
            d.dtype = dtype
            d.ndim = ndim
            s = self._shape
            for i in range(ndim):
                s[i] = shape[i]
            d.sendbuf = sendbuf
            d.recvbuf = recvbuf
            d.op = op
            d.prescale = prescale
            d.postscale = postscale
            d.root = root
            if splits is None:
                d.splits = None
            else:
                n = len(splits)
                if n > self._splits_len:
                    self._splits = (ctypes.c_int64 * n)()
                    self._splits_len = n
                sp = self._splits
                for i in range(n):
                    sp[i] = splits[i]
                d.splits = ctypes.cast(sp, ctypes.POINTER(ctypes.c_int64))
            d.device = device
            st = self._fns.submit(h, self._desc_p, self._oph_p)
            if st < 0:
                msg = _message(self._fns.last_error(), f"dshim: submitting {name.decode(errors='replace')} failed")
                d.name = None
                if st == _lib.ERR_INVALID:
                    raise ValueError(msg)
                raise NamedOpError(msg, st)
            oph = self._oph.value
            d.name = None
        return Op(oph, self._fns, keep, name)

    def shutdown(self, reason=None):
        """Stops the engine on every rank: pending and later operations fail (ABORTED)."""
        if self._h is not None:
            self._fns.shutdown(self._h, reason.encode() if reason else None)

    def destroy(self):
        """Shuts down (if not yet), waits for the engine's thread, frees it.  Idempotent."""
        with self._lock:
            h, self._h = self._h, None
        if h is not None:
            st = self._fns.destroy(h)
            with _orphans_lock:
                _sweep_locked()
            if st < 0:
                raise NamedOpError(_message(self._fns.last_error(), "dshim_named_destroy failed"), st)

    def timeline(self, path, mark_cycles=False):
        """Starts Horovod's timeline into path (rank 0 of the engine writes), or stops it (path None)."""
        if self._h is None:
            return
        st = self._fns.timeline(self._h, path.encode() if path is not None else None, 1 if mark_cycles else 0)
        if st < 0:
            raise NamedOpError(_message(self._fns.last_error(), "dshim_named_timeline failed"), st)

    @property
    def alive(self):
        return self._h is not None

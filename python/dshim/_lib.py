"""Finds and loads libdshim.so and declares the C API (include/dshim.h) for ctypes.

Where the library comes from, in order:
1. a libdshim.so already mapped into this process (LD_PRELOAD, dshim-run, or a
   test that loaded a particular build first): the same copy must be used, or
   the process would run two dshim cores side by side;
2. the one installed with this package (pip install: dshim/lib/libdshim.so);
3. the build tree of the checkout this package lives in (make setup's editable
   install): <repo>/build/lib/libdshim.so.

ctypes releases the GIL around every foreign call (CDLL), so a thread blocked
in dshim_wait() or in a blocking collective does not stop Python.
"""
import ctypes
import os
import threading

_PACKAGE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(os.path.dirname(_PACKAGE))
INSTALLED_LIB = os.path.join(_PACKAGE, "lib", "libdshim.so")
BUILD_TREE_LIB = os.path.join(_REPO, "build", "lib", "libdshim.so")

# dshim_status_t values (include/dshim.h)
OK = 0
INPROGRESS = 1
ERR_INVALID = -1
ERR_TIMEOUT = -4
ERR_PEER = -5
ERR_MISMATCH = -6
ERR_ABORTED = -8
ERR_UNSUPPORTED = -9


class CommArgs(ctypes.Structure):
    """dshim_comm_args_t"""
    _fields_ = [
        ("rank", ctypes.c_int),
        ("size", ctypes.c_int),
        ("store_addr", ctypes.c_char_p),
        ("store_port", ctypes.c_int),
        ("token", ctypes.c_char_p),
        ("store_external", ctypes.c_int),
    ]


# dshim_named_kind_t: operations matched by name (shim/named; python/dshim/_named.py)
NAMED_ALLREDUCE, NAMED_ALLGATHER, NAMED_BROADCAST, NAMED_ALLTOALL, NAMED_REDUCESCATTER, NAMED_BARRIER, \
    NAMED_JOIN = range(7)
NAMED_MAX_DIMS = 16


class NamedDesc(ctypes.Structure):
    """dshim_named_desc_t"""
    _fields_ = [
        ("kind", ctypes.c_int),
        ("name", ctypes.c_char_p),
        ("dtype", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("sendbuf", ctypes.c_void_p),
        ("recvbuf", ctypes.c_void_p),
        ("op", ctypes.c_int),
        ("prescale", ctypes.c_double),
        ("postscale", ctypes.c_double),
        ("root", ctypes.c_int),
        ("splits", ctypes.POINTER(ctypes.c_int64)),
        ("device", ctypes.c_int),
    ]


class Stats(ctypes.Structure):
    """dshim_stats_t"""
    _fields_ = [
        ("collectives", ctypes.c_uint64),
        ("bytes_sent", ctypes.c_uint64),
        ("bytes_received", ctypes.c_uint64),
    ]


_vp = ctypes.c_void_p
_sz = ctypes.c_size_t
_int = ctypes.c_int
_szp = ctypes.POINTER(ctypes.c_size_t)
_reqp = ctypes.POINTER(ctypes.c_void_p)

# name: (restype, argtypes).  Every function this package calls is declared here.
_PROTOS = {
    "dshim_abi_version": (_int, []),
    "dshim_comm_init": (_int, [ctypes.POINTER(CommArgs), ctypes.POINTER(ctypes.c_void_p)]),
    "dshim_store_prebind": (_int, [_int, ctypes.c_char_p, ctypes.POINTER(_int)]),
    "dshim_store_prebind_at": (_int, [ctypes.c_char_p, _int, ctypes.c_char_p, ctypes.POINTER(_int)]),
    "dshim_host_address": (_int, [ctypes.c_char_p, ctypes.c_char_p, _sz]),
    "dshim_comm_destroy": (_int, [_vp]),
    "dshim_comm_abort": (_int, [_vp, ctypes.c_char_p]),
    "dshim_comm_set_timeout": (_int, [_vp, ctypes.c_double]),
    "dshim_comm_set_desc": (_int, [_vp, ctypes.c_char_p]),
    "dshim_trace_span": (None, [ctypes.c_char_p, ctypes.c_uint64, ctypes.c_uint64]),
    "dshim_config_get": (_int, [ctypes.c_char_p, ctypes.c_char_p, _sz]),
    "dshim_comm_rank": (_int, [_vp]),
    "dshim_comm_size": (_int, [_vp]),
    "dshim_comm_transport": (ctypes.c_char_p, [_vp]),
    "dshim_comm_get_error": (_int, [_vp, ctypes.c_char_p, _sz]),
    "dshim_comm_get_missing": (_int, [_vp, ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(_int), _int,
                                      ctypes.POINTER(_int)]),
    "dshim_comm_stats": (None, [_vp, ctypes.POINTER(Stats)]),
    "dshim_last_error": (ctypes.c_char_p, []),
    "dshim_status_string": (ctypes.c_char_p, [_int]),
    "dshim_wait": (_int, [_vp]),
    "dshim_test": (_int, [_vp, ctypes.POINTER(ctypes.c_int)]),
    "dshim_request_free": (None, [_vp]),
    # blocking forms (async_op=False runs them in the caller's thread)
    "dshim_allreduce": (_int, [_vp, _vp, _vp, _sz, _int, _int]),
    "dshim_broadcast": (_int, [_vp, _vp, _sz, _int, _int]),
    "dshim_reduce": (_int, [_vp, _vp, _vp, _sz, _int, _int, _int]),
    "dshim_allgather": (_int, [_vp, _vp, _vp, _sz, _int]),
    "dshim_allgatherv": (_int, [_vp, _vp, _vp, _szp, _szp, _int]),
    "dshim_reduce_scatter": (_int, [_vp, _vp, _vp, _sz, _int, _int]),
    "dshim_reduce_scatterv": (_int, [_vp, _vp, _vp, _szp, _int, _int]),
    "dshim_alltoall": (_int, [_vp, _vp, _vp, _sz, _int]),
    "dshim_alltoallv": (_int, [_vp, _vp, _szp, _szp, _vp, _szp, _szp, _int]),
    "dshim_gather": (_int, [_vp, _vp, _vp, _sz, _int, _int]),
    "dshim_scatter": (_int, [_vp, _vp, _vp, _sz, _int, _int]),
    "dshim_barrier": (_int, [_vp]),
    # non-blocking forms: same arguments plus dshim_request_t **
    "dshim_iallreduce": (_int, [_vp, _vp, _vp, _sz, _int, _int, _reqp]),
    "dshim_ibroadcast": (_int, [_vp, _vp, _sz, _int, _int, _reqp]),
    "dshim_ireduce": (_int, [_vp, _vp, _vp, _sz, _int, _int, _int, _reqp]),
    "dshim_iallgather": (_int, [_vp, _vp, _vp, _sz, _int, _reqp]),
    "dshim_iallgatherv": (_int, [_vp, _vp, _vp, _szp, _szp, _int, _reqp]),
    "dshim_ireduce_scatter": (_int, [_vp, _vp, _vp, _sz, _int, _int, _reqp]),
    "dshim_ireduce_scatterv": (_int, [_vp, _vp, _vp, _szp, _int, _int, _reqp]),
    "dshim_ialltoall": (_int, [_vp, _vp, _vp, _sz, _int, _reqp]),
    "dshim_ialltoallv": (_int, [_vp, _vp, _szp, _szp, _vp, _szp, _szp, _int, _reqp]),
    "dshim_igather": (_int, [_vp, _vp, _vp, _sz, _int, _int, _reqp]),
    "dshim_iscatter": (_int, [_vp, _vp, _vp, _sz, _int, _int, _reqp]),
    "dshim_isend": (_int, [_vp, _vp, _sz, _int, _int, _reqp]),
    "dshim_irecv": (_int, [_vp, _vp, _sz, _int, _int, _reqp]),
    # receive from any source: the sender's rank lands in the int before the request completes
    "dshim_irecv_any": (_int, [_vp, _vp, _sz, _int, ctypes.POINTER(_int), _reqp]),
    "dshim_ibarrier": (_int, [_vp, _reqp]),
    # PREMUL_SUM's local scaling through the reduction backend (dst, src, count, dtype, scalar of dtype)
    "dshim_scale_mul": (_int, [_vp, _vp, _vp, _sz, _int, _vp]),
    # CUDA tensors staged through libdshim's pinned pool, copied in stream order (_staging.py)
    "dshim_gpu_available": (_int, []),
    "dshim_gpu_stage_get": (_vp, [_sz, ctypes.POINTER(ctypes.c_void_p)]),
    "dshim_gpu_stage_put": (None, [_vp]),
    "dshim_gpu_copy_async": (_int, [_vp, _vp, _sz, _int, _vp]),
    "dshim_gpu_stream_sync": (_int, [_int, _vp]),
    # flight recorder: names the framework call behind this thread's next submission (process_group.py
    # passes pre-encoded bytes; None clears); ~0.15 us a call
    "dshim_trace_label": (None, [ctypes.c_char_p]),
    # operations matched by name (Horovod's model): python/dshim/_named.py
    "dshim_named_create": (_int, [_vp, ctypes.POINTER(ctypes.c_void_p)]),
    "dshim_named_submit": (_int, [_vp, ctypes.POINTER(NamedDesc), ctypes.POINTER(ctypes.c_void_p)]),
    "dshim_named_poll": (_int, [_vp]),
    "dshim_named_wait": (_int, [_vp]),
    "dshim_named_error": (ctypes.c_char_p, [_vp]),
    "dshim_named_result": (_int, [_vp, ctypes.POINTER(ctypes.c_void_p), _szp, ctypes.POINTER(ctypes.c_int64),
                                  ctypes.POINTER(ctypes.c_int64), _int]),
    "dshim_named_join_rank": (_int, [_vp]),
    "dshim_named_op_free": (None, [_vp]),
    "dshim_named_shutdown": (_int, [_vp, ctypes.c_char_p]),
    "dshim_named_destroy": (_int, [_vp]),
    "dshim_named_timeline": (_int, [_vp, ctypes.c_char_p, _int]),
    "dshim_comm_split": (_int, [_vp, _int, _int, ctypes.POINTER(ctypes.c_void_p)]),
    "dshim_comm_init_env": (_int, [ctypes.POINTER(ctypes.c_void_p)]),
    "dshim_config_get_current": (_int, [ctypes.c_char_p, ctypes.c_char_p, _sz]),
}

_lock = threading.Lock()
_lib = None


def _loaded_path():
    """The path of a libdshim.so already mapped into this process, or None."""
    try:
        with open("/proc/self/maps", "r") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) == 6:
                    path = parts[5].strip()
                    if os.path.basename(path).startswith("libdshim.so"):
                        return path
    except OSError:
        pass
    return None


def library_path():
    """(path, how it was found) of the libdshim.so this package uses; raises when there is none."""
    path = _loaded_path()
    if path is not None:
        return path, "already loaded in this process"
    if os.path.exists(INSTALLED_LIB):
        return INSTALLED_LIB, "installed with the package"
    if os.path.exists(BUILD_TREE_LIB):
        return BUILD_TREE_LIB, "build tree"
    raise RuntimeError(
        f"dshim: libdshim.so not found: it is not preloaded, not installed with this package ({INSTALLED_LIB}) "
        f"and not built in a checkout ({BUILD_TREE_LIB}); reinstall dshim (pip install dshim), build it with "
        f"`make`, or run under dshim-run / LD_PRELOAD=/path/to/libdshim.so")


def _open():
    path, how = library_path()
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        raise RuntimeError(f"dshim: cannot load {path} ({how}): {e}") from None
    for name, (res, args) in _PROTOS.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            raise RuntimeError(f"dshim: {path} has no symbol {name}: it is older than this Python package; "
                               f"rebuild it (make)") from None
        fn.restype = res
        fn.argtypes = args
    lib.path = path
    from ._log import apply_level
    apply_level(lib)   # the Python logger follows DSHIM_DEBUG as the C side does
    return lib


def lib():
    """The loaded library (loaded on first use, not at import: `import torch` stays cheap)."""
    global _lib
    if _lib is None:
        with _lock:
            if _lib is None:
                _lib = _open()
    return _lib


def last_error():
    msg = lib().dshim_last_error()
    return msg.decode(errors="replace") if msg else "no message"


def check(status, what):
    """Raises RuntimeError naming `what` and dshim's message when status < 0."""
    if status < 0:
        raise RuntimeError(f"dshim: {what} failed: {last_error()}")
    return status


def size_array(values):
    """A size_t[] holding `values` (ctypes copies them; dshim copies them again at issue)."""
    return (ctypes.c_size_t * len(values))(*values)

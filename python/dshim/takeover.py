"""Transparent takeover: unmodified gloo / nccl / default-backend scripts run over dshim.

When libdshim.so is mapped into the process (LD_PRELOAD, which dshim-run sets)
and DSHIM_TAKEOVER is on (the default), `init_process_group` and `new_group`
are wrapped so that backend None, "gloo", "nccl" and "cpu:gloo,cuda:nccl"
become "dshim".  Nothing changes without the preload, or with
DSHIM_TAKEOVER=0.  torch >= 2.5 runs this at `import torch` through the
"torch.backends" entry point, before the script can `from torch.distributed
import init_process_group`, so that name is wrapped too.

The setting is read through dshim's own configuration table
(`dshim_config_get`), like every other dshim variable.
"""
import ctypes
import functools
import logging

from . import _lib

log = logging.getLogger("dshim")

# what a user may name that dshim carries: torch's defaults and its CPU/GPU pair
_CARRIED = {None, "gloo", "nccl", "cpu:gloo,cuda:nccl", "cuda:nccl,cpu:gloo", "undefined"}

_installed = False


def _config(name):
    lib = _lib.lib()
    get = lib.dshim_config_get
    get.restype = ctypes.c_int
    get.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
    buf = ctypes.create_string_buffer(4096)
    if get(name.encode(), buf, len(buf)) != 0:
        return None
    return buf.value.decode()


def wanted():
    """True when libdshim.so is preloaded and DSHIM_TAKEOVER is not 0."""
    if _lib._loaded_path() is None:
        return False
    return _config("DSHIM_TAKEOVER") == "1"


def _carried(backend):
    name = backend if backend is None else str(backend).lower()
    return name in _CARRIED


def _announce(original, group):
    try:
        rank, size = group.rank(), group.size()
        transport = getattr(group, "transport", "dshim")
    except Exception:  # a group torch wrapped: the line is informative only
        return
    # one line per job, from rank 0: every rank carries the same backend
    if rank == 0:
        print(f"dshim: carrying backend '{original if original is not None else 'default'}' "
              f"for rank {rank}/{size} over {transport}", flush=True)


def install():
    """Wraps torch.distributed's init_process_group and new_group (idempotent)."""
    global _installed
    if _installed:
        return
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    orig_init = c10d.init_process_group
    orig_new_group = c10d.new_group

    @functools.wraps(orig_init)
    def init_process_group(backend=None, *args, **kwargs):
        if "backend" in kwargs:
            backend = kwargs.pop("backend")
        original = backend
        if _carried(backend):
            backend = "dshim"
        out = orig_init(backend, *args, **kwargs)
        if backend == "dshim" and original != "dshim":
            _announce(original, c10d._get_default_group())
        return out

    @functools.wraps(orig_new_group)
    def new_group(*args, **kwargs):
        # new_group(ranks=None, timeout=None, backend=None, ...): backend is the third
        if len(args) >= 3:
            args = list(args)
            if _carried(args[2]) and args[2] is not None:
                args[2] = "dshim"
        elif _carried(kwargs.get("backend")) and kwargs.get("backend") is not None:
            kwargs["backend"] = "dshim"
        # backend None means the default group's backend: dshim already
        return orig_new_group(*args, **kwargs)

    c10d.init_process_group = init_process_group
    dist.init_process_group = init_process_group
    c10d.new_group = new_group
    dist.new_group = new_group
    _installed = True


def maybe_install():
    """Called at autoload: installs the takeover when wanted; never raises."""
    try:
        if wanted():
            install()
    except Exception as e:  # never break `import torch`
        log.warning("dshim: takeover of gloo/nccl not installed: %s", e)

"""dshim for PyTorch: registers the torch.distributed backend "dshim".

    import torch.distributed as dist
    dist.init_process_group("dshim")      # after `import dshim`, or automatically:

torch >= 2.5 calls `_autoload` at the end of `import torch` (entry point group
"torch.backends"), so installed scripts need no import at all.  Registration
is cheap (libdshim.so is loaded only when a group is created), idempotent, and
never raises during `import torch`.
"""
import importlib.util
import inspect
import sys

__all__ = ["register", "BACKEND_NAME", "__version__"]


def _read_version():
    """The wheel writes _version.py from include/dshim.h; a checkout reads the header itself."""
    try:
        from ._version import __version__ as v
        return v
    except ImportError:
        pass
    import os
    import re
    header = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "include", "dshim.h")
    try:
        with open(header) as f:
            text = f.read()
        return ".".join(re.search(rf"#define DSHIM_VERSION_{part} (\d+)", text).group(1)
                        for part in ("MAJOR", "MINOR", "PATCH"))
    except (OSError, AttributeError):
        return "unknown"


__version__ = _read_version()

BACKEND_NAME = "dshim"
from ._log import log  # noqa: E402  (never propagates to the root logger)


def _create(*args):
    """torch's creator call: (options, backend_options) with the extended interface, which names
    the group and its members as job ranks; (store, rank, size, timeout) with the legacy one."""
    # imported here: the ProcessGroup module loads nothing heavy, but keeping it
    # out of `import torch` keeps autoload minimal
    from .process_group import create_process_group
    if len(args) == 2:
        o = args[0]
        return create_process_group(o.store, o.group_rank, o.group_size, o.timeout,
                                    getattr(o, "group_id", None), list(getattr(o, "global_ranks_in_group", [])))
    return create_process_group(*args)


def register():
    """Registers backend "dshim" with torch.distributed (idempotent).
    Returns True when it is registered (now or before)."""
    import torch.distributed as dist
    if not dist.is_available():
        return False
    Backend = dist.Backend
    plugins = getattr(Backend, "_plugins", None)
    if plugins is not None and BACKEND_NAME.upper() in plugins:
        return True
    if plugins is None and hasattr(Backend, BACKEND_NAME.upper()):
        return True   # torch without _plugins (1.x): the name attribute marks it
    kwargs = {}
    try:
        params = inspect.signature(Backend.register_backend).parameters
        if "extended_api" in params:
            kwargs["extended_api"] = True   # the group's name and members: _comm._Group
        if "devices" in params:
            kwargs["devices"] = ["cpu", "cuda"]   # a list: some versions iterate a string by character
    except (TypeError, ValueError):
        pass
    Backend.register_backend(BACKEND_NAME, _create, **kwargs)
    return True


def _autoload():
    """Entry point of group "torch.backends": runs at the end of `import torch`.
    An exception here would abort `import torch`, so it only logs."""
    if "torch" not in sys.modules and importlib.util.find_spec("torch") is None:
        return   # no torch here: nothing to register (libdshim, dshim-run, MXNet and NCCL need none)
    try:
        register()
    except Exception as e:   # never break `import torch`
        log.warning("dshim: could not register the torch.distributed backend 'dshim': %s", e)
        return
    # under dshim-run / LD_PRELOAD=libdshim.so: gloo/nccl/default groups go over dshim too
    from . import takeover
    takeover.maybe_install()


def _torch_will_autoload():
    """True where torch is not imported yet and its import will call _autoload: torch >= 2.5, with
    dshim's entry point installed and torch's plugin switch on.  Then `import dshim` (the Horovod
    layer's finder, horovodrun, an MXNet script) does not pay for importing torch."""
    try:
        from importlib.metadata import entry_points, version
        if not any(ep.value == "dshim:_autoload" for ep in entry_points(group="torch.backends")):
            return False
        if tuple(int(x) for x in version("torch").split(".")[:2]) < (2, 5):
            return False
        import ctypes
        from . import _lib
        buf = ctypes.create_string_buffer(16)
        if _lib.lib().dshim_config_get_current(b"TORCH_DEVICE_BACKEND_AUTOLOAD", buf, len(buf)) != 0:
            return False
        return buf.value == b"1"
    except Exception:   # no metadata, an odd version string, no library: register now, as before
        return False


# `import dshim` registers too (torch < 2.5 has no autoload), unless torch will do it at its import
if "torch" in sys.modules or not _torch_will_autoload():
    _autoload()

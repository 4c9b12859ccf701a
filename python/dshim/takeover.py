"""Transparent takeover: unmodified gloo / nccl / default-backend scripts run over dshim.

When libdshim.so is mapped into the process (LD_PRELOAD, which dshim-run sets)
and DSHIM_TAKEOVER is on (the default), torch's `_new_process_group_helper` --
the one function through which init_process_group, new_group, new_subgroups
and DeviceMesh create every group -- is wrapped so that backend None
("undefined"), "gloo", "nccl" and "cpu:gloo,cuda:nccl" are built as "dshim".
Afterwards the group is recorded under the name the script asked for
(`_world.pg_map`, `pg_backend_config`), so `get_backend()` answers "gloo"
while dshim carries it, and torch's Python checks (monitored_barrier's GLOO
guard, new_group inheriting the default backend, default timeouts) take the
path they take for the real backend.  The group's own name (getBackendName,
read by C++) stays "dshim": torch's DDP logger casts a group whose C++ name is
"gloo" to ProcessGroupGloo (docs/torch.md, "Transparency").  An explicit
"dshim" keeps its name.  Nothing changes without the preload, or with
DSHIM_TAKEOVER=0.  torch >= 2.5 runs this at `import torch` through the
"torch.backends" entry point, before the script can `from torch.distributed
import init_process_group`.

The setting is read through dshim's own configuration table
(`dshim_config_get`), like every other dshim variable.
"""
import ctypes
import functools

from . import _lib

from ._log import log  # noqa: E402  (never propagates to the root logger)

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


def _observed(backend):
    """(get_backend's answer, get_backend_config's, the backend that would
    carry CPU tensors) for what the script asked, as torch would record them."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    name = dist.Backend(backend if backend is not None else "undefined")
    config_class = getattr(c10d, "BackendConfig", None)   # torch >= 2.0
    config = config_class(name) if config_class is not None else None
    devices = config.get_device_backend_map() if config is not None else {}
    if "," in str(name) or ":" in str(name) or name == dist.Backend.UNDEFINED:
        # torch's default backend of a group with several device backends
        backend_name = "nccl" if "nccl" in devices.values() else "gloo"
    else:
        backend_name = str(name)
    return name, (str(config) if config is not None else None), backend_name


def _record_as_asked(c10d, pg, asked):
    """Files a dshim group under the backend the script asked for."""
    from .process_group import DshimProcessGroup
    if not isinstance(pg, DshimProcessGroup):
        return
    name, config, backend_name = _observed(asked)
    world = getattr(c10d, "_world", None)
    pg_map = world.pg_map if world is not None else getattr(c10d, "_pg_map", None)
    if pg_map is not None and pg in pg_map:
        pg_map[pg] = (name, pg_map[pg][1])
    configs = getattr(world, "pg_backend_config", None) if world is not None else None
    if config is not None and configs is not None and pg in configs:
        configs[pg] = config
    pg.set_observed_backend(backend_name)


def install():
    """Wraps torch's group creation and init_process_group (idempotent)."""
    global _installed
    if _installed:
        return
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    orig_helper = c10d._new_process_group_helper
    orig_init = c10d.init_process_group
    # _new_process_group_helper(group_size, group_rank, global_ranks, backend, store, ...)
    backend_pos = 3

    @functools.wraps(orig_helper)
    def _new_process_group_helper(*args, **kwargs):
        if "backend" in kwargs:
            asked = kwargs["backend"]
        elif len(args) > backend_pos:
            asked = args[backend_pos]
        else:
            return orig_helper(*args, **kwargs)
        if not _carried(asked):
            return orig_helper(*args, **kwargs)
        if "backend" in kwargs:
            kwargs["backend"] = dist.Backend("dshim")
        else:
            args = args[:backend_pos] + (dist.Backend("dshim"),) + args[backend_pos + 1:]
        out = orig_helper(*args, **kwargs)
        pg = out[0] if isinstance(out, tuple) else out
        try:
            _record_as_asked(c10d, pg, None if asked is None or str(asked).lower() == "undefined" else asked)
        except Exception as e:   # a torch whose bookkeeping differs: the group works, named "dshim"
            log.warning("dshim: group carried for backend %r keeps the name 'dshim': %s", str(asked), e)
        return out

    @functools.wraps(orig_init)
    def init_process_group(backend=None, *args, **kwargs):
        if "backend" in kwargs:
            backend = kwargs.pop("backend")
        out = orig_init(backend, *args, **kwargs)
        if _carried(backend):
            _announce(backend, c10d._get_default_group())
        return out

    c10d._new_process_group_helper = _new_process_group_helper
    c10d.init_process_group = init_process_group
    dist.init_process_group = init_process_group
    _installed = True


def maybe_install():
    """Called at autoload: installs the takeover when wanted; never raises."""
    try:
        if wanted():
            install()
    except Exception as e:  # never break `import torch`
        log.warning("dshim: takeover of gloo/nccl not installed: %s", e)

"""The "dshim" Python logger: its own handler on stderr, at DSHIM_DEBUG's level.

It never propagates to the application's root logger: a script that sets
logging.basicConfig(level=INFO) sees no dshim lines there, as with gloo, and
DSHIM_DEBUG governs the Python side exactly as it governs the C side (NONE,
WARN, INFO, TRACE).  Until the library is loaded (it is not at `import torch`)
the level is WARN, DSHIM_DEBUG's default.
"""
import logging
import sys

log = logging.getLogger("dshim")

_LEVELS = {"NONE": logging.CRITICAL + 1, "WARN": logging.WARNING, "INFO": logging.INFO, "TRACE": logging.DEBUG}


def _install():
    if getattr(log, "_dshim_handler", None) is not None:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log.addHandler(handler)
    log._dshim_handler = handler
    log.propagate = False
    log.setLevel(logging.WARNING)


def apply_level(lib):
    """Takes DSHIM_DEBUG's value from the library's configuration (base/params.def,
    already validated there)."""
    import ctypes
    buf = ctypes.create_string_buffer(16)
    if lib.dshim_config_get(b"DSHIM_DEBUG", buf, len(buf)) == 0:
        log.setLevel(_LEVELS.get(buf.value.decode(errors="replace").strip().upper(), logging.WARNING))


_install()

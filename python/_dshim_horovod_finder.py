"""Which package answers `import horovod`: a real Horovod, or dshim's Horovod layer.

dshim's layer is a real top-level package `horovod` kept in dshim/_horovod/, a
directory that is not on sys.path, so nothing shadows anything by mere presence.
The file dshim-horovod.pth (installed into site-packages by the wheel and by
`make setup`'s editable install) imports this module at interpreter start; it
only puts a finder first on sys.meta_path (it must stay cheap: every Python of
the environment runs it).  When `horovod` is first imported the finder reads
DSHIM_HOROVOD through dshim's configuration table (dshim_config_get):

    auto (default)  dshim's layer only where no other finder finds a real Horovod
    1               dshim's layer even where a real Horovod is installed
    0               never dshim's layer (without a real one: ModuleNotFoundError)

`horovod.__dshim__` is set only by dshim's layer (docs/horovod.md).

A module of its own, outside the dshim package, like _dshim_commands: importing
dshim at interpreter start would cost every Python process of the environment.
"""
import os
import sys

NAME = "horovod"
# dshim's layer, beside this module in site-packages (the wheel) or in python/ (a checkout)
LAYER_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dshim", "_horovod")


def dshim_spec():
    """The module spec of dshim's `horovod` package."""
    import importlib.util
    package = os.path.join(LAYER_DIR, NAME)
    return importlib.util.spec_from_file_location(NAME, os.path.join(package, "__init__.py"),
                                                  submodule_search_locations=[package])


def choice():
    """DSHIM_HOROVOD as dshim's configuration reads it: 'auto', '0' or '1'."""
    import ctypes
    from dshim import _lib   # without torch where torch registers dshim at its own import (dshim/__init__)
    buf = ctypes.create_string_buffer(64)
    if _lib.lib().dshim_config_get(b"DSHIM_HOROVOD", buf, len(buf)) != 0:
        raise RuntimeError(f"{_lib.lib().path} has no DSHIM_HOROVOD setting: it is older than this package; "
                           f"rebuild it (make) or reinstall dshim")
    return buf.value.decode().lower()


class HorovodFinder:
    """A meta path finder for the top-level name `horovod` only (its submodules are found through
    the package's __path__, so they come from the same package)."""

    def __init__(self):
        self._asking_others = False

    def _other_spec(self, path, target):
        """What the finders after this one find for `horovod` (a real Horovod), or None."""
        self._asking_others = True
        try:
            for finder in list(sys.meta_path):
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(NAME, path, target)
                if spec is not None:
                    return spec
            return None
        finally:
            self._asking_others = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != NAME or self._asking_others:
            return None
        try:
            wanted = choice()
        except (ImportError, OSError, RuntimeError) as e:
            # dshim's layer cannot run without its library either: a real Horovod still answers
            other = self._other_spec(path, target)
            if other is not None:
                return other
            raise ModuleNotFoundError(f"No module named 'horovod': dshim's Horovod layer cannot read "
                                      f"DSHIM_HOROVOD ({e})", name=NAME) from None
        if wanted == "0":
            return None
        if wanted != "1":
            other = self._other_spec(path, target)
            if other is not None:
                return other
        return dshim_spec()

    def invalidate_caches(self):
        pass


def install():
    """Puts the finder first on sys.meta_path (once), so that DSHIM_HOROVOD=1 wins over a real
    Horovod on sys.path."""
    if not any(isinstance(f, HorovodFinder) or type(f).__name__ == "HorovodFinder" for f in sys.meta_path):
        sys.meta_path.insert(0, HorovodFinder())


def load_dshim_horovod():
    """Imports dshim's layer as `horovod` whatever DSHIM_HOROVOD says (horovodrun runs on it: it
    launches through dshim-run).  Fails when another Horovod was imported already."""
    import importlib.util
    mod = sys.modules.get(NAME)
    if mod is not None:
        if not getattr(mod, "__dshim__", False):
            raise ImportError(f"another Horovod ({getattr(mod, '__file__', '?')}) is already imported")
        return mod
    spec = dshim_spec()
    mod = importlib.util.module_from_spec(spec)
    sys.modules[NAME] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        del sys.modules[NAME]
        raise
    return mod


def horovodrun():
    """The `horovodrun` console script: Horovod's launcher, on dshim-run (horovod/runner/launch.py)."""
    load_dshim_horovod()
    from horovod.runner.launch import run_commandline
    run_commandline()


install()

"""Horovod 0.28.1's Python API on dshim: `import horovod.torch as hvd` scripts run over dshim's
named-operation engine (libdshim.so) instead of Horovod's compiled core.

`horovod.__dshim__` is True here (a real Horovod has no such attribute), and __version__ says
which Horovod this layer follows and which dshim carries it: "0.28.1+dshim.<dshim version>".
docs/horovod.md says when this package answers `import horovod` and when a real one does.
"""


def _dshim_version():
    from dshim import __version__ as v
    return v


__dshim__ = True
__version__ = '0.28.1+dshim.' + _dshim_version()


def __getattr__(name):
    # horovod.run (horovod.runner.run), imported on first use: the runner pulls in more than
    # a training script needs
    if name == 'run':
        from horovod.runner import run
        return run
    raise AttributeError(f"module 'horovod' has no attribute {name!r}")

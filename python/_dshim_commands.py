"""The console scripts of the wheel: `dshim-run` and `dshim-bench` on PATH run the
executables installed inside the package (dshim/bin/), which find the libdshim.so
installed beside them (dshim/lib/); in a checkout's editable install, those of its
build/bin/.  An executable, not Python, does the work: the launcher starts remote
agents by its own path, the same on every host that has the same environment.

A module of its own, outside the dshim package: `import dshim` registers the torch
backend and so imports torch (seconds), which a launcher must not wait for.
"""
import importlib.util
import os
import sys


def _program(name):
    """dshim/bin/<name> (the wheel), else <checkout>/build/bin/<name> (make setup's editable install)."""
    spec = importlib.util.find_spec("dshim")  # finds the package without running it
    if spec is None or not spec.submodule_search_locations:
        sys.exit(f"{name}: the dshim package is not installed in {sys.executable}")
    package_dir = list(spec.submodule_search_locations)[0]
    candidates = [os.path.join(package_dir, "bin", name),
                  os.path.join(os.path.dirname(os.path.dirname(package_dir)), "build", "bin", name)]
    for exe in candidates:
        if os.access(exe, os.X_OK):
            return exe
    sys.exit(f"{name}: not found: neither {candidates[0]} (pip install) nor {candidates[1]} (a checkout: run "
             f"make); reinstall dshim with pip")


def _exec(name):
    exe = _program(name)
    env = os.environ
    if name == "dshim-run" and not env.get("DSHIM_RUN_PYTHON"):
        # like torchrun: scripts run on the interpreter dshim was installed into, even when the
        # environment is not activated (the venv's python path selects its site-packages)
        env = dict(env, DSHIM_RUN_PYTHON=sys.executable)
    os.execve(exe, [name] + sys.argv[1:], env)


def dshim_run():
    _exec("dshim-run")


def dshim_bench():
    _exec("dshim-bench")

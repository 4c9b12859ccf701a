"""The console scripts of the wheel: `dshim-run` and `dshim-bench` on PATH run the
executables installed inside the package (dshim/bin/), which find the libdshim.so
installed beside them (dshim/lib/).  An executable, not Python, does the work: the
launcher starts remote agents by its own path, the same on every host that has
the same environment.

A module of its own, outside the dshim package: `import dshim` registers the torch
backend and so imports torch (seconds), which a launcher must not wait for.
"""
import importlib.util
import os
import sys


def _exec(name):
    spec = importlib.util.find_spec("dshim")  # finds the package without running it
    package_dir = list(spec.submodule_search_locations)[0] if spec else "<no dshim package>"
    exe = os.path.join(package_dir, "bin", name)
    if not os.access(exe, os.X_OK):
        sys.exit(f"{name}: {exe} is missing: this dshim package has no compiled programs (a checkout's "
                 f"editable install uses build/bin/{name}); reinstall dshim with pip")
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

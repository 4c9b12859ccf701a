"""Runs a script under a torch older than 2.5, where neither the torch.backends
autoload nor the takeover at `import torch` exist: `import dshim` registers the
backend, `--takeover` installs the takeover by hand (docs/torch.md, Versions).

    python legacy_run.py [--takeover] script.py [args...]
"""
import runpy
import sys

import dshim  # noqa: F401  (registers backend "dshim")

if len(sys.argv) > 1 and sys.argv[1] == "--takeover":
    import dshim.takeover
    dshim.takeover.install()
    del sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")

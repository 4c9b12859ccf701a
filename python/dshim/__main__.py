"""python -m dshim [--lib | --version]: where this package's libdshim.so is, and its version.

    LD_PRELOAD=$(python -m dshim --lib) python train.py
"""
import argparse
import sys

from . import __version__, _lib


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m dshim", description=__doc__.splitlines()[0])
    ap.add_argument("--lib", action="store_true", help="print the path of libdshim.so (for LD_PRELOAD)")
    ap.add_argument("--version", action="store_true", help="print the package's and the library's versions")
    args = ap.parse_args(argv)
    try:
        path, how = _lib.library_path()
    except RuntimeError as e:
        print(e, file=sys.stderr)
        return 1
    if args.lib:
        print(path)
        return 0
    abi = _lib.lib().dshim_abi_version()
    lib_version = f"{abi // 10000}.{abi // 100 % 100}.{abi % 100}"
    try:
        from ._version import tested_with_torch
        tested = f"; tested with torch {tested_with_torch}"
    except ImportError:
        tested = "; a checkout"
    print(f"dshim {__version__} (libdshim.so {lib_version} at {path}, {how}{tested})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

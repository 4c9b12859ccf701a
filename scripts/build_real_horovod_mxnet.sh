#!/usr/bin/env bash
# Builds real Horovod 0.28.1 from its sdist with its MXNet frontend into a scratch venv DIR (default
# /tmp/hvd-real-mxnet): Python 3.10 (MXNet 1.9.1 has no wheels for newer ones), mxnet 1.9.1, Gloo
# controller and CPU operations, no PyTorch, TensorFlow or MPI.  The reference that the
# test_mxnet*.py lines of tests/horovod/expected.txt are recorded with (hvd_suite.py --record).
# Never part of make test.  The C++17 patch of scripts/build_real_horovod.sh is not needed: it only
# changes the PyTorch frontend's standard, and MXNet 1.9.1's headers are C++14.
#
# Idempotent: when DIR already has a horovod whose MXNet and Gloo parts load, it says so and returns.
#
#   scripts/build_real_horovod_mxnet.sh [DIR]   JOBS=2 (make -j), NICE=10 (nice -n) by default
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
DIR=$(realpath -m "${1:-/tmp/hvd-real-mxnet}")
JOBS=${JOBS:-2}
NICE=${NICE:-10}
MXNET_VERSION=1.9.1
HVD_VERSION=0.28.1
HVD_SDIST=horovod-$HVD_VERSION.tar.gz
HVD_SHA256=92a43f5a94c43907a56805bad15f19700c62ffc83b7ca483f9e104e229f67ef0

works() {
    [ -x "$DIR/bin/python" ] && [ -x "$DIR/bin/horovodrun" ] && (cd / && "$DIR/bin/python" - <<'PYEOF' 2>/dev/null)
import horovod, horovod.mxnet as hvd
assert horovod.__version__ == "0.28.1", horovod.__version__
assert hvd.gloo_built(), "no Gloo"
assert "dshim" not in (horovod.__file__ or ""), horovod.__file__
PYEOF
}

if works; then
    echo "build_real_horovod_mxnet: $DIR already has a working horovod $HVD_VERSION (mxnet, Gloo)"
    exit 0
fi

# the same Python 3.10 as .venv-mxnet (scripts/setup.sh)
PY=""
for cand in "$HOME/.pyenv/versions/3.10.13/bin/python" "$(command -v python3.10 || true)"; do
    if [ -n "$cand" ] && [ -x "$cand" ] && "$cand" -c 'import sys; assert sys.version_info[:2] == (3, 10)' 2>/dev/null; then
        PY=$cand
        break
    fi
done
[ -n "$PY" ] || { echo "build_real_horovod_mxnet: no Python 3.10 (pyenv install 3.10.13)" >&2; exit 1; }
command -v cmake >/dev/null 2>&1 || { echo "build_real_horovod_mxnet: no cmake (apt-get install cmake)" >&2; exit 1; }
command -v g++ >/dev/null 2>&1 || { echo "build_real_horovod_mxnet: no g++ (apt-get install build-essential)" >&2; exit 1; }

mkdir -p "$DIR"
if [ ! -x "$DIR/bin/python" ]; then
    echo "build_real_horovod_mxnet: creating the venv $DIR ($PY)"
    "$PY" -m venv "$DIR"
fi
PIP=("$DIR/bin/pip" install -q --disable-pip-version-check)
echo "build_real_horovod_mxnet: installing mxnet==$MXNET_VERSION and Horovod's build and test dependencies"
nice -n "$NICE" "${PIP[@]}" "mxnet==$MXNET_VERSION" "numpy<1.24" pytest pytest-timeout cloudpickle mock packaging \
    psutil pyyaml "setuptools<70" wheel

SRC=$DIR/src
mkdir -p "$SRC"
if ! echo "$HVD_SHA256  $SRC/$HVD_SDIST" | sha256sum -c --status 2>/dev/null; then
    url=$(curl -fsSL https://pypi.org/simple/horovod/ | grep -o "https://[^\"#]*/$HVD_SDIST" | head -1)
    [ -n "$url" ] || { echo "build_real_horovod_mxnet: $HVD_SDIST not in https://pypi.org/simple/horovod/" >&2; exit 1; }
    echo "build_real_horovod_mxnet: downloading $url"
    curl -fsSL -o "$SRC/$HVD_SDIST.part" "$url"
    mv "$SRC/$HVD_SDIST.part" "$SRC/$HVD_SDIST"
    echo "$HVD_SHA256  $SRC/$HVD_SDIST" | sha256sum -c --status ||
        { echo "build_real_horovod_mxnet: $SRC/$HVD_SDIST: sha256 is not $HVD_SHA256" >&2; exit 1; }
fi
rm -rf "$SRC/horovod-$HVD_VERSION"
tar -xzf "$SRC/$HVD_SDIST" -C "$SRC"

echo "build_real_horovod_mxnet: building horovod $HVD_VERSION with MXNet (make -j$JOBS, nice $NICE); log: $DIR/build.log"
export HOROVOD_WITH_MXNET=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 \
       HOROVOD_WITH_GLOO=1 HOROVOD_CPU_OPERATIONS=gloo MAKEFLAGS=-j$JOBS
unset HOROVOD_GPU_OPERATIONS HOROVOD_GPU_ALLREDUCE HOROVOD_GPU_BROADCAST HOROVOD_GPU HOROVOD_WITH_MPI \
      HOROVOD_WITH_TENSORFLOW HOROVOD_WITH_PYTORCH HOROVOD_WITHOUT_MXNET HOROVOD_WITHOUT_GLOO
if ! (cd "$SRC/horovod-$HVD_VERSION" && nice -n "$NICE" "$DIR/bin/pip" install -v --no-build-isolation \
        --no-cache-dir --disable-pip-version-check . >"$DIR/build.log" 2>&1); then
    echo "build_real_horovod_mxnet: the build failed; the end of $DIR/build.log:" >&2
    tail -n 30 "$DIR/build.log" >&2
    exit 1
fi
works || { echo "build_real_horovod_mxnet: horovod installed but does not load with MXNet and Gloo; see $DIR/build.log" >&2; exit 1; }
"$DIR/bin/horovodrun" --check-build
echo "build_real_horovod_mxnet: ok: $DIR/bin/horovodrun, $DIR/bin/python (horovod $HVD_VERSION, mxnet $MXNET_VERSION)"

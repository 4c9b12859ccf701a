#!/usr/bin/env bash
# Builds real Horovod 0.28.1 from its sdist into a scratch venv DIR (default /tmp/hvd-real), CPU only
# (Gloo controller and CPU operations, PyTorch frontend), against torch 2.11.0: the reference that
# tests/horovod/expected.txt is recorded with and that bench/horovod_bench.py compares dshim's Horovod
# layer against.  Never part of make test (about 15 minutes of compiling on 2 cores).
#
# 0.28.1 (the last release) does not build against torch >= 2.1 as released: its CMake files set C++14,
# and torch's headers need C++17.  horovod PR #3998 (merged on master, never released) fixes it; its
# change to CMakeLists.txt and horovod/torch/CMakeLists.txt is scripts/horovod-0.28.1-cxx17.patch
# (`git diff v0.28.1 3a31d933 -- CMakeLists.txt horovod/torch/CMakeLists.txt` of horovod's repository;
# master has no other change to the CMake files since 0.28.1).
#
# Idempotent: when DIR already has a horovod whose PyTorch and Gloo parts load, it says so and returns.
# The venv is separate from .venv: dshim's `import horovod` finder is not installed there.
#
#   scripts/build_real_horovod.sh [DIR]        JOBS=2 (make -j), NICE=10 (nice -n) by default
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
DIR=$(realpath -m "${1:-/tmp/hvd-real}")
JOBS=${JOBS:-2}
NICE=${NICE:-10}
TORCH_VERSION=2.11.0
HVD_VERSION=0.28.1
HVD_SDIST=horovod-$HVD_VERSION.tar.gz
HVD_SHA256=92a43f5a94c43907a56805bad15f19700c62ffc83b7ca483f9e104e229f67ef0
PATCH=$HERE/horovod-0.28.1-cxx17.patch

works() {
    [ -x "$DIR/bin/python" ] && [ -x "$DIR/bin/horovodrun" ] && (cd / && "$DIR/bin/python" - <<'EOF' 2>/dev/null)
import horovod, horovod.torch as hvd
assert horovod.__version__ == "0.28.1", horovod.__version__
assert hvd.gloo_built(), "no Gloo"
assert "dshim" not in (horovod.__file__ or ""), horovod.__file__
EOF
}

if works; then
    echo "build_real_horovod: $DIR already has a working horovod $HVD_VERSION (torch, Gloo)"
    exit 0
fi

# the interpreter dshim's .venv uses when there is one, so both sides run the same Python
PY=""
if [ -f "$HERE/../.venv/pyvenv.cfg" ]; then
    ver=$(sed -n 's/^version[_info]* *= *\([0-9]*\.[0-9]*\).*/\1/p' "$HERE/../.venv/pyvenv.cfg" | head -1)
    [ -n "$ver" ] && command -v "python$ver" >/dev/null 2>&1 && PY=$(command -v "python$ver")
fi
for cand in python3.11 python3.12 python3.10 python3; do
    [ -n "$PY" ] && break
    command -v "$cand" >/dev/null 2>&1 && PY=$(command -v "$cand")
done
[ -n "$PY" ] || { echo "build_real_horovod: no python3 found" >&2; exit 1; }
command -v cmake >/dev/null 2>&1 || { echo "build_real_horovod: no cmake (apt-get install cmake)" >&2; exit 1; }
command -v g++ >/dev/null 2>&1 || { echo "build_real_horovod: no g++ (apt-get install build-essential)" >&2; exit 1; }

mkdir -p "$DIR"
if [ ! -x "$DIR/bin/python" ]; then
    echo "build_real_horovod: creating the venv $DIR ($PY)"
    "$PY" -m venv "$DIR"
fi
PIP=("$DIR/bin/pip" install -q --disable-pip-version-check)
echo "build_real_horovod: installing torch==$TORCH_VERSION and Horovod's build and test dependencies"
nice -n "$NICE" "${PIP[@]}" "torch==$TORCH_VERSION" numpy pytest pytest-timeout cloudpickle mock packaging \
    psutil pyyaml "setuptools<70" wheel

# the sdist, from PyPI's simple index (pip download would run its setup.py), checked against its hash
SRC=$DIR/src
mkdir -p "$SRC"
if ! echo "$HVD_SHA256  $SRC/$HVD_SDIST" | sha256sum -c --status 2>/dev/null; then
    url=$(curl -fsSL https://pypi.org/simple/horovod/ | grep -o "https://[^\"#]*/$HVD_SDIST" | head -1)
    [ -n "$url" ] || { echo "build_real_horovod: $HVD_SDIST not in https://pypi.org/simple/horovod/" >&2; exit 1; }
    echo "build_real_horovod: downloading $url"
    curl -fsSL -o "$SRC/$HVD_SDIST.part" "$url"
    mv "$SRC/$HVD_SDIST.part" "$SRC/$HVD_SDIST"
    echo "$HVD_SHA256  $SRC/$HVD_SDIST" | sha256sum -c --status ||
        { echo "build_real_horovod: $SRC/$HVD_SDIST: sha256 is not $HVD_SHA256" >&2; exit 1; }
fi
rm -rf "$SRC/horovod-$HVD_VERSION"
tar -xzf "$SRC/$HVD_SDIST" -C "$SRC"
patch -s -p1 -d "$SRC/horovod-$HVD_VERSION" < "$PATCH"

echo "build_real_horovod: building horovod $HVD_VERSION (make -j$JOBS, nice $NICE; ~15 min on 2 cores); log: $DIR/build.log"
export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
       HOROVOD_WITH_GLOO=1 HOROVOD_CPU_OPERATIONS=gloo MAKEFLAGS=-j$JOBS
unset HOROVOD_GPU_OPERATIONS HOROVOD_GPU_ALLREDUCE HOROVOD_GPU_BROADCAST HOROVOD_GPU HOROVOD_WITH_MPI \
      HOROVOD_WITH_TENSORFLOW HOROVOD_WITH_MXNET HOROVOD_WITHOUT_PYTORCH HOROVOD_WITHOUT_GLOO
if ! (cd "$SRC/horovod-$HVD_VERSION" && nice -n "$NICE" "$DIR/bin/pip" install -v --no-build-isolation \
        --no-cache-dir --disable-pip-version-check . >"$DIR/build.log" 2>&1); then
    echo "build_real_horovod: the build failed; the end of $DIR/build.log:" >&2
    tail -n 30 "$DIR/build.log" >&2
    exit 1
fi
works || { echo "build_real_horovod: horovod installed but does not load with PyTorch and Gloo; see $DIR/build.log" >&2; exit 1; }
"$DIR/bin/horovodrun" --check-build
echo "build_real_horovod: ok: $DIR/bin/horovodrun, $DIR/bin/python (horovod $HVD_VERSION, torch $TORCH_VERSION)"

#!/usr/bin/env bash
# test_install.sh — dshim used as a user installs it, never from this checkout.
#
#   wheel      pip wheel . (scikit-build-core), auditwheel repair -> a manylinux wheel whose
#              libdshim.so finds libunwind inside the wheel (ldd), installed into new venvs
#   versions   dshim-run --version, dshim.__version__, dshim_abi_version(), the wheel's metadata
#   torch      from a directory outside the checkout, venv not activated:
#              dshim-run --nproc-per-node 2 train.py (a copy of examples/ddp_train.py) and
#              LD_PRELOAD=$(dshim-run --print-lib) python train.py with torch's env:// variables
#   bench      dshim-bench -n 2 from the venv
#   mxnet      a dist_sync Gluon job (2 workers, 2 servers) from a Python 3.10 venv with the wheel
#   cmake      cmake --install <build> --prefix <tmp>; a C program built with pkg-config and with
#              find_package(dshim), run by the installed dshim-run
#   two hosts  the torch job over dshim-run's ssh launcher on 2 network-namespace hosts
#
# Every job's processes report /proc/self/maps and dshim.__file__ (a few lines appended to the
# copied script); a case fails when anything was mapped or imported from this checkout.
# torch and MXNet are not reinstalled: each venv gets a .pth naming .venv's (.venv-mxnet's)
# site-packages, which is searched after the venv's own, so dshim comes from the venv.
#
# Usage: test_install.sh BUILD_DIR (a normal build, for cmake --install).  Needs make setup's
# .venv and .venv-mxnet and network access to PyPI for the wheel's build requirements (or pip's
# cache); the two-host case needs root, ip netns and sshd, and is skipped without them.
# Bounded to 900 s; each job by `timeout`.  Leaves nothing: venvs, wheels and hosts are removed.
set -uo pipefail
if [ -z "${INSTALL_TEST_BOUNDED:-}" ]; then
    export INSTALL_TEST_BOUNDED=1
    exec timeout -k 5 900 bash "$0" "$@"
fi

here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
build=$(realpath -m "${1:-$src/build}")
T=$(mktemp -d /tmp/dshim-install.XXXXXX)
passed=0
failed=0
failures=()
hosts_started=0

cleanup() {
    if [ "$hosts_started" = 1 ]; then hosts_down >/dev/null 2>&1; fi
    rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 143' TERM INT

now_ms() { date +%s%3N; }
ok() { echo "PASS $1${2:+: $2}"; passed=$((passed + 1)); }
bad() { echo "FAIL $1: $2"; failed=$((failed + 1)); failures+=("$1"); }
show() { sed 's/^/    | /' "$1" | tail -"${2:-25}"; }

# A clean environment: nothing of this checkout on PATH or PYTHONPATH, no dshim settings.
PATH_CLEAN=/usr/local/bin:/usr/bin:/bin
clean() { env -i HOME="$HOME" PATH="$PATH_CLEAN" LANG=C.UTF-8 OMP_NUM_THREADS=1 "$@"; }

for f in "$src/.venv/bin/python" "$src/.venv-mxnet/bin/python" "$build/bin/dshim-run"; do
    if [ ! -x "$f" ]; then
        echo "test_install: $f not found: run make setup and make first" >&2
        exit 1
    fi
done
version=$(sed -n 's/^#define DSHIM_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\)$/\2/p' "$src/include/dshim.h" | paste -sd.)
echo "dshim $version from $src; work dir $T"

# ---- the wheel ---------------------------------------------------------------
t0=$(now_ms)
if clean "$src/.venv/bin/pip" wheel --no-deps --disable-pip-version-check -q -w "$T/dist" "$src" \
        >"$T/wheel.log" 2>&1; then
    raw=$(ls "$T"/dist/dshim-*.whl)
    ok "wheel built" "$(basename "$raw") in $(( ($(now_ms) - t0) / 1000 )) s"
else
    bad "wheel built" "pip wheel failed"; show "$T/wheel.log" 40
    echo "install: $passed passed, $((failed + 1)) failed (no wheel: nothing else can run)"
    exit 1
fi
if clean PATH="$src/.venv/bin:$PATH_CLEAN" "$src/.venv/bin/auditwheel" repair --exclude 'libcudart.so.*' \
        -w "$T/wheelhouse" "$raw" >"$T/repair.log" 2>&1; then
    whl=$(ls "$T"/wheelhouse/dshim-*.whl)
    ok "auditwheel repair" "$(basename "$whl"), $(( $(stat -c %s "$whl") / 1024 )) KiB"
else
    bad "auditwheel repair" "failed"; show "$T/repair.log"
    whl=$raw
fi
"$src/.venv/bin/python" - "$whl" >"$T/contents.log" 2>&1 <<'EOF'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
need = ["dshim/lib/libdshim.so", "dshim/bin/dshim-run", "dshim/bin/dshim-bench", "dshim/include/dshim.h",
        "dshim/lib/pkgconfig/dshim.pc", "dshim/lib/cmake/dshim/dshimConfig.cmake", "dshim/_version.py",
        "_dshim_commands.py", "dshim/__init__.py",
        # Horovod's layer, its finder and what registers the finder at start-up (docs/horovod.md)
        "_dshim_horovod_finder.py", "dshim-horovod.pth", "dshim/_horovod/horovod/__init__.py",
        "dshim/_horovod/horovod/runner/launch.py"]
missing = [n for n in need if n not in names]
grafted = [n for n in names if n.startswith("dshim.libs/")]
print("files", len(names), "grafted", " ".join(grafted) or "none", "cuda",
      "dshim/lib/libdshim-cuda.so" in names, "missing", " ".join(missing) or "none")
sys.exit(1 if missing else 0)
EOF
if [ $? = 0 ]; then ok "wheel contents" "$(cat "$T/contents.log")"; else bad "wheel contents" "$(cat "$T/contents.log")"; fi
if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then
    grep -q "cuda True" "$T/contents.log" && ok "libdshim-cuda.so in the wheel (nvcc present)" ||
        bad "libdshim-cuda.so in the wheel" "nvcc is present but the wheel has no libdshim-cuda.so"
fi

# ---- venvs ---------------------------------------------------------------------
# make_venv DIR BASE_VENV: a new venv on BASE_VENV's interpreter with the wheel, and BASE_VENV's
# site-packages (torch / mxnet) after its own
make_venv() {
    local dir=$1 base=$2 py site t
    py=$("$base/bin/python" -c 'import sys; print(sys._base_executable)')
    site=$("$base/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    t=$(now_ms)
    clean "$py" -m venv "$dir" && clean "$dir/bin/pip" install -q --disable-pip-version-check "$whl" ||
        return 1
    echo "$site" >"$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_frameworks_from_project_venv.pth"
    echo "$(( $(now_ms) - t )) ms"
}
if took=$(make_venv "$T/venv" "$src/.venv" 2>"$T/venv.log"); then
    ok "pip install the wheel into a new venv" "$took ($("$T/venv/bin/python" -V))"
else
    bad "pip install into a new venv" "failed"; show "$T/venv.log"
fi
V=$T/venv
pkg=$("$V/bin/python" -c 'import importlib.util as u; print(list(u.find_spec("dshim").submodule_search_locations)[0])')
lib=$(clean "$V/bin/dshim-run" --print-lib 2>"$T/printlib.log")
case $lib in
    "$pkg"/lib/libdshim.so) ok "dshim-run --print-lib" "$lib" ;;
    *) bad "dshim-run --print-lib" "printed '$lib', expected $pkg/lib/libdshim.so"; show "$T/printlib.log" ;;
esac
ldd "$pkg/lib/libdshim.so" >"$T/ldd.log" 2>&1
if grep -q "not found" "$T/ldd.log" || ! grep -q "libunwind.* => $T/.*/dshim.libs/" "$T/ldd.log"; then
    bad "ldd libdshim.so" "a dependency is missing or libunwind is not the wheel's own"; show "$T/ldd.log"
else
    ok "ldd libdshim.so" "$(grep -o 'libunwind[^ ]* => [^ ]*' "$T/ldd.log" | sed "s|$T|\$T|")"
fi

# The wheel needs no -dev or runtime package of its dependencies: the system's libunwind and liblzma
# hidden (an empty file bound over each, in a mount namespace of its own), dshim-bench still runs.
sys_unwind=$(ldconfig -p | sed -n 's/^\s*libunwind.so.8 (libc6,x86-64) => //p' | head -1)
sys_lzma=$(ldconfig -p | sed -n 's/^\s*liblzma.so.5 (libc6,x86-64) => //p' | head -1)
if [ "$(id -u)" != 0 ] || ! command -v unshare >/dev/null || [ -z "$sys_unwind" ]; then
    echo "SKIP wheel without the system's libunwind: needs root, unshare and a system libunwind to hide"
elif unshare -m sh -c 'mount --bind /dev/null "$(realpath "$1")" && mount --bind /dev/null "$(realpath "$2")" &&
        ! ldd "$(realpath "$1")" >/dev/null 2>&1 && exec "$3" -n 2 -o allreduce -b 64K -e 64K -t 0.1' \
        sh "$sys_unwind" "$sys_lzma" "$V/bin/dshim-bench" >"$T/hidden.log" 2>&1 && grep -qE ' ok$' "$T/hidden.log"; then
    ok "wheel runs with the system's libunwind and liblzma hidden" "dshim-bench -n 2 correct"
else
    bad "wheel without the system's libunwind" "dshim-bench failed with $sys_unwind and $sys_lzma hidden"
    show "$T/hidden.log"
fi

# ---- versions ------------------------------------------------------------------
mkdir -p "$T/work"
cd "$T/work" || exit 1
v_run=$(clean "$V/bin/dshim-run" --version | awk '{print $NF}')
v_py=$(clean "$V/bin/python" -c 'import dshim; print(dshim.__version__)' 2>/dev/null)
v_meta=$(clean "$V/bin/python" -c 'import importlib.metadata as m; print(m.version("dshim"))')
v_abi=$(clean "$V/bin/python" -m dshim --version 2>/dev/null | sed -n 's/.*(libdshim.so \([0-9.]*\) at .*/\1/p')
if [ "$v_run" = "$version" ] && [ "$v_py" = "$version" ] && [ "$v_meta" = "$version" ] && [ "$v_abi" = "$version" ]; then
    ok "one version everywhere" "$version (dshim-run, dshim.__version__, dshim_abi_version, wheel metadata)"
else
    bad "one version everywhere" "dshim.h $version, dshim-run '$v_run', __version__ '$v_py', abi '$v_abi', metadata '$v_meta'"
fi

# ---- Horovod: the wheel's finder answers `import horovod` with its own layer, and horovodrun runs
v_hvd=$(clean "$V/bin/python" -c 'import horovod; print(horovod.__dshim__, horovod.__file__)' 2>&1)
v_hvdrun=$(clean "$V/bin/horovodrun" --version 2>&1)
case "$v_hvd|$v_hvdrun" in
    "True $pkg/_horovod/horovod/__init__.py|0.28.1+dshim.$version") ok "import horovod, horovodrun" "$v_hvdrun" ;;
    *) bad "import horovod, horovodrun" "import horovod: '$v_hvd'; horovodrun --version: '$v_hvdrun'" ;;
esac

# ---- where every process took dshim from ---------------------------------------
# probe_script SRC DST: a copy of SRC that writes, at its end, probe.<pid>: the dshim package it
# imported, its network namespace (one per host) and its memory map
probe_script() {
    cp "$1" "$2"
    cat >>"$2" <<'EOF'

# --- appended by tests/install: where this process took dshim from
import os as _os, sys as _sys
with open("probe.%d" % _os.getpid(), "w") as _f:
    _f.write("package %s\n" % getattr(_sys.modules.get("dshim"), "__file__", "not imported"))
    _f.write("netns %s\n" % _os.readlink("/proc/self/ns/net"))
    _f.write(open("/proc/self/maps").read())
EOF
}
# check_probes NAME DIR N ROOT: N probes in DIR; dshim imported and mapped from under ROOT only,
# nothing mapped from the checkout but the frameworks of its .venv and .venv-mxnet
check_probes() {
    local name=$1 dir=$2 want=$3 root=$4 n bad_lines
    n=$(find "$dir" -maxdepth 1 -name 'probe.*' | wc -l)
    if [ "$n" != "$want" ]; then
        bad "$name" "$n process probes, expected $want"; return 1
    fi
    n=$(grep -l "/libdshim.so$" "$dir"/probe.* | wc -l)
    if [ "$n" != "$want" ]; then
        bad "$name" "libdshim.so was mapped in $n of $want processes"; return 1
    fi
    # (MXNet workers map the library but import no dshim package: "package not imported")
    bad_lines=$(cat "$dir"/probe.* | grep -E "libdshim|^package /" | grep -v -e "$root" | sort -u | head -5)
    bad_lines+=$(cat "$dir"/probe.* | grep -F "$src/" | grep -v -F -e "$src/.venv/" -e "$src/.venv-mxnet/" |
        sort -u | head -5)
    if [ -n "$bad_lines" ]; then
        bad "$name" "dshim taken from outside $root:"; echo "$bad_lines" | sed 's/^/    | /'; return 1
    fi
    return 0
}

probe_script "$src/examples/ddp_train.py" "$T/work/train.py"

# torch through the installed dshim-run (console script; the venv is not activated)
mkdir -p "$T/work/run" && cd "$T/work/run" && cp ../train.py .
t=$(now_ms)
clean timeout -k 5 240 "$V/bin/dshim-run" --master-port 0 --nproc-per-node 2 train.py --steps 4 \
    >out.log 2>&1
rc=$?
if [ $rc != 0 ]; then
    bad "torch DDP under dshim-run" "exit code $rc"; show out.log
elif ! grep -q "carrying backend" out.log; then
    bad "torch DDP under dshim-run" "no 'carrying backend' line: dshim did not carry the job"; show out.log
elif check_probes "torch DDP under dshim-run" . 2 "$V/"; then
    ok "torch DDP under dshim-run" "$(grep -o 'dshim: carrying backend.*' out.log | head -1), $(( ($(now_ms) - t) / 1000 )) s"
fi

# torch with LD_PRELOAD=$(dshim-run --print-lib) and torch's own env:// variables
mkdir -p "$T/work/preload" && cd "$T/work/preload" && cp ../train.py .
free_port() { "$src/.venv/bin/python" -c "import sys; sys.path.insert(0, '$src/tests/common'); from ports import free_port; print(free_port())"; }
port=$(free_port)
pids=()
for r in 0 1; do
    clean RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" LD_PRELOAD="$lib" \
        timeout -k 5 240 "$V/bin/python" train.py --steps 4 --backend gloo >"out.$r.log" 2>&1 &
    pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
if [ $rc != 0 ]; then
    bad "torch with LD_PRELOAD=\$(dshim-run --print-lib)" "a rank exited $rc"; show out.0.log; show out.1.log
elif ! grep -q "carrying backend 'gloo'" out.0.log; then
    bad "torch with LD_PRELOAD" "no \"carrying backend 'gloo'\" line on rank 0"; show out.0.log
elif check_probes "torch with LD_PRELOAD" . 2 "$V/"; then
    ok "torch with LD_PRELOAD=\$(dshim-run --print-lib)" "$(grep -o 'dshim: carrying backend.*' out.0.log | head -1)"
fi

# dshim-bench from the venv
cd "$T/work" || exit 1
# (ldd's output is read whole: with pipefail, `ldd | grep -q` fails whenever grep's early exit
# hits ldd with SIGPIPE before its last line, as it did once in make test)
bench_ldd=$(ldd "$pkg/bin/dshim-bench" 2>&1)
if clean timeout -k 5 120 "$V/bin/dshim-bench" -n 2 -o allreduce -b 4K -e 1M -f 16 -t 0.1 >bench.log 2>&1 &&
        grep -qE '^ +[0-9]+ .* ok$' bench.log && grep -qF "libdshim.so => $pkg/bin/../lib/libdshim.so" <<<"$bench_ldd"; then
    ok "dshim-bench -n 2" "$(grep -E '^# dshim-bench' bench.log | head -1)"
else
    bad "dshim-bench -n 2" "failed or linked another libdshim.so"; show bench.log; ldd "$pkg/bin/dshim-bench" | grep dshim
fi

# ---- MXNet: a dist_sync job from a Python 3.10 venv with the same wheel --------
if took=$(make_venv "$T/venv-mx" "$src/.venv-mxnet" 2>"$T/venv-mx.log"); then
    mkdir -p "$T/work/mx/out" && cd "$T/work/mx" || exit 1
    probe_script "$src/tests/mxnet/scripts/gluon_trainer.py" trainer.py
    mxport=$(free_port)
    # as launch.py users run it: the venv activated (on PATH), the command given whole
    clean PATH="$T/venv-mx/bin:$PATH_CLEAN" VIRTUAL_ENV="$T/venv-mx" timeout -k 5 240 \
        dshim-run --master-port "$mxport" -n 2 -s 2 python trainer.py out --steps 5 >out.log 2>&1
    rc=$?
    if [ $rc != 0 ]; then
        bad "MXNet dist_sync under dshim-run (Python 3.10 venv)" "exit code $rc"; show out.log
    elif [ "$(ls out/params_rank*.npz 2>/dev/null | wc -l)" != 2 ]; then
        bad "MXNet dist_sync" "the workers did not write their parameters"; show out.log
    elif check_probes "MXNet dist_sync" . 2 "$T/venv-mx/"; then
        ok "MXNet dist_sync under dshim-run (Python 3.10 venv)" "2 workers, 2 servers, venv in $took"
    fi
else
    bad "MXNet venv" "pip install into a Python 3.10 venv failed"; show "$T/venv-mx.log"
fi

# ---- cmake --install, then a C program with pkg-config and with find_package ----
cd "$T/work" || exit 1
P=$T/prefix
if cmake --install "$build" --prefix "$P" >"$T/cmake-install.log" 2>&1; then
    ok "cmake --install" "$(cd "$P" && find . -type f | sort | tr '\n' ' ')"
else
    bad "cmake --install" "failed"; show "$T/cmake-install.log"
fi
# run_c NAME EXE: 2 ranks by the installed dshim-run, each must say correct and name the prefix's library
run_c() {
    clean timeout -k 5 60 "$P/bin/dshim-run" --master-port 0 --nproc-per-node 2 "$2" >"$1.log" 2>&1
    local rc=$? n
    n=$(grep -c "allreduce of [0-9]* floats correct .* libdshim $P/lib/libdshim.so$" "$1.log")
    if [ $rc = 0 ] && [ "$n" = 2 ]; then
        ok "$1" "$(grep -m1 -o 'rank 0/2: .*' "$1.log" | sed "s|$T|\$T|")"
    else
        bad "$1" "exit code $rc, $n of 2 ranks correct with $P's library"; show "$1.log"
    fi
}
cflags=$(clean PKG_CONFIG_PATH="$P/lib/pkgconfig" pkg-config --cflags --libs dshim 2>&1)
libdir=$(clean PKG_CONFIG_PATH="$P/lib/pkgconfig" pkg-config --variable=libdir dshim 2>&1)
# shellcheck disable=SC2086  # pkg-config's words
if cc -std=c11 -Wall -Wextra -Werror "$src/examples/c_api/allreduce.c" $cflags -Wl,-rpath,"$libdir" \
        -o allreduce_pc >"$T/cc.log" 2>&1; then
    run_c "C program via pkg-config --cflags --libs dshim" ./allreduce_pc
else
    bad "C program via pkg-config" "compile failed ($cflags)"; show "$T/cc.log"
fi
if clean cmake -S "$src/examples/c_api" -B "$T/work/cbuild" -DCMAKE_PREFIX_PATH="$P" >"$T/cm.log" 2>&1 &&
        clean cmake --build "$T/work/cbuild" >>"$T/cm.log" 2>&1; then
    run_c "C program via find_package(dshim)" "$T/work/cbuild/allreduce"
else
    bad "C program via find_package(dshim)" "configure or build failed"; show "$T/cm.log"
fi

# ---- two hosts: the wheel's dshim-run over ssh, each host on the installed copy ----
# shellcheck source=../launcher/lib/hosts.sh
source "$src/tests/launcher/lib/hosts.sh"
if ! why=$(hosts_available); then
    echo "SKIP two hosts: $why"
else
    hosts_started=1
    if hosts_up 2 >"$T/hosts.log" 2>&1; then
        mkdir -p "$T/work/hosts" && cd "$T/work/hosts" && cp ../train.py .
        hosts_write_hostfile hostfile
        hosts_exec 0 env -i HOME="$HOME" PATH="$PATH_CLEAN" LANG=C.UTF-8 OMP_NUM_THREADS=1 \
            DSHIM_RUN_SSH="$HOSTS_SSH" timeout -k 5 240 "$V/bin/dshim-run" -H hostfile --nnodes 2 \
            --nproc-per-node 1 train.py --steps 4 >out.log 2>&1
        rc=$?
        nets=$(grep -h '^netns ' probe.* 2>/dev/null | sort -u | wc -l)
        if [ $rc != 0 ]; then
            bad "two hosts over ssh from the venv" "exit code $rc"; show out.log
        elif [ "$nets" != 2 ]; then
            bad "two hosts over ssh" "the ranks ran in $nets network namespaces, expected 2"; show out.log
        elif check_probes "two hosts over ssh" . 2 "$V/"; then
            ok "two hosts over ssh from the venv" "$(grep -o 'dshim: carrying backend.*' out.log | head -1)"
        fi
    else
        bad "two hosts" "hosts_up failed"; show "$T/hosts.log"
    fi
fi

echo
if [ $failed -gt 0 ]; then echo "failed: ${failures[*]}"; fi
echo "install: $passed passed, $failed failed"
[ $failed = 0 ]

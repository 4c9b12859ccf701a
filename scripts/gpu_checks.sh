#!/usr/bin/env bash
# The GPU checks (the NCCL API on a GPU, CUDA kernels, CUDA tensors in the torch backend), as ONE command for a
# machine with a GPU, python3 + torch (CUDA) and no .venv, no compiler, no internet:
#
#     scripts/gpu_checks.sh            # run every check; summary + logs under $OUT (/tmp/gpu-out)
#     scripts/gpu_checks.sh --prepare  # HERE, after `make`: copy the runtime libraries the GPU
#                                      # machine may lack into build/gpu-deps, report build/'s size
#
# The build is done on the development machine and build/ travels with the tree (see
# docs/testing.md, "GPU checks").  Every step runs in its own process group under `timeout`,
# a failing step does not stop the others, steps that cannot run here SKIP (no GPU, no torch, no
# NCCL API in libdshim.so), and the whole run stays inside DSHIM_GPU_BUDGET seconds (540).
# Exit status: 0 when no step failed (passes and skips), 1 otherwise.
#
# Env: OUT (results folder), DSHIM_GPU_PYTHON (python with torch; python3), DSHIM_GPU_BUDGET,
#      DSHIM_BUILD_DIR (build/), DSHIM_GPU_STEPS (space-separated subset of the step names),
#      DSHIM_GPU_DRYRUN_CPU=1 (test of this script's plumbing without a GPU: the ddp-dshim-* steps
#      run on CPU tensors, reference over "dshim" with one process; they then FAIL the comparison,
#      as they should: on CPU the example keeps per-rank BatchNorm, not SyncBatchNorm).
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SELF="$ROOT/scripts/gpu_checks.sh"
BUILD=${DSHIM_BUILD_DIR:-$ROOT/build}
PY=${DSHIM_GPU_PYTHON:-python3}
OUT=${OUT:-/tmp/gpu-out}
BUDGET=${DSHIM_GPU_BUDGET:-540}
LIB="$BUILD/lib/libdshim.so"
CUDA_LIB="$BUILD/lib/libdshim-cuda.so"
DEPS="$BUILD/gpu-deps"
SKIP=77

# ---------------------------------------------------------------------------------------------
# --prepare (development machine): runtime libraries for a bare GPU machine, and the carry size
# ---------------------------------------------------------------------------------------------
prepare() {
    mkdir -p "$DEPS/cudart"
    local f lib path
    # libdshim.so needs libunwind (+ liblzma); the Check test programs need libsubunit
    for f in "$LIB" "$BUILD/bin/check_reduce_cuda" "$BUILD/bin/check_reduce_cuda_host" "$BUILD/bin/check_gpu_module"; do
        [ -e "$f" ] || continue
        for lib in libunwind.so.8 liblzma.so.5 libsubunit.so.0; do
            path=$(ldd "$f" 2>/dev/null | awk -v l="$lib" '$1 == l && $3 ~ /^\// {print $3}')
            [ -n "$path" ] && cp -L "$path" "$DEPS/$lib"
        done
    done
    # libcudart only as a last resort (torch's own copy is preferred: see cuda_libdir)
    path=$(ldd "$CUDA_LIB" 2>/dev/null | awk '$1 ~ /^libcudart\.so/ && $3 ~ /^\// {print $3}')
    [ -n "$path" ] && cp -L "$path" "$DEPS/cudart/$(basename "$path")"
    echo "gpu_checks --prepare: runtime libraries in $DEPS:"
    ls -l "$DEPS" "$DEPS/cudart" | sed 's/^/  /'
    local total
    total=$(du -sm "$BUILD" | cut -f1)
    echo "gpu_checks --prepare: $BUILD is $total MiB (the run tool carries 64 MiB)"
    if [ "$total" -lt 60 ]; then
        echo "  carry: build"
    else
        echo "  too big: carry build/lib build/bin build/gpu-deps (ctest then falls back to the test binaries)"
        du -sm "$BUILD/lib" "$BUILD/bin" "$DEPS" | sed 's/^/  /'
    fi
    [ -e "$CUDA_LIB" ] || echo "  WARNING: $CUDA_LIB was not built (no nvcc?): the GPU checks will skip"
}

# ---------------------------------------------------------------------------------------------
# helpers shared by the steps (each step is `gpu_checks.sh --step NAME` in its own process)
# ---------------------------------------------------------------------------------------------
note() { printf '%s\n' "$*" >"$OUT/notes/$STEP"; echo "NOTE: $*"; }

have_torch_cuda() {
    "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null
}

need_torch_cuda() {
    if ! "$PY" -c 'import torch' 2>/dev/null; then
        note "no torch in $PY"
        exit $SKIP
    fi
    if [ "${DSHIM_GPU_DRYRUN_CPU:-0}" = 1 ]; then
        return 0 # plumbing test on a machine without a GPU (ddp-dshim-* only: they fall back to CPU)
    fi
    if ! have_torch_cuda; then
        note "torch sees no CUDA device"
        exit $SKIP
    fi
}

# libdshim.so exports the NCCL API (hooks/nccl) -- checked by loading it, nm may be missing
lib_has_nccl() {
    "$PY" - "$LIB" <<'EOF' 2>/dev/null
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
sys.exit(0 if hasattr(lib, "ncclAllReduce") and hasattr(lib, "ncclCommInitRank") else 1)
EOF
}

free_port() {
    "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# run_ranks N LOG CMD...: N processes of CMD with torch's env:// variables; LOCAL_RANK stays
# unset, so every rank of examples/ddp_train.py uses cuda:0 (the one GPU).  Rank r's output goes to
# LOG.rank<r>.  Returns 0 when every rank exits 0.  A hang is ended by the step's timeout, which
# kills the step's process group (these ranks included).
run_ranks() {
    local n=$1 log=$2 port r rc=0 c
    shift 2
    port=$(free_port)
    local pids=()
    for ((r = 0; r < n; r++)); do
        env RANK=$r WORLD_SIZE="$n" MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" "$@" >"$log.rank$r" 2>&1 &
        pids+=($!)
    done
    for r in "${!pids[@]}"; do
        wait "${pids[$r]}"
        c=$?
        if [ $c -ne 0 ]; then
            echo "rank $r exited $c"
            rc=1
        fi
    done
    for ((r = 0; r < n; r++)); do
        echo "---- rank $r:"
        tail -n 40 "$log.rank$r"
    done
    return $rc
}

# The single-process reference for the DDP example with N ranks: one process on the global batch
# (batch 32 * N), backend nccl (real NCCL, no dshim in the process), 50 steps.  DistributedSampler
# gives that process, in each step, exactly the union of the N ranks' samples (rank r takes every
# N-th index of the same permutation), SyncBatchNorm over N ranks normalises like BatchNorm over
# the union, and DDP's gradient average equals the mean loss's gradient: the same training up to
# float32 rounding.
reference_params() {
    local n=$1 ref="$OUT/ddp-ref-np$1.pt"
    if [ ! -s "$ref" ]; then
        (
            unset PYTHONPATH LD_PRELOAD DSHIM_TEST_PRELOAD
            export DSHIM_TAKEOVER=0
            run_ranks 1 "$OUT/logs/ddp-ref-np$n" "$PY" examples/ddp_train.py --backend nccl \
                --steps 50 --batch $((32 * n)) --save-params "$ref"
        ) >"$OUT/logs/ddp-ref-np$n.log" 2>&1
    fi
    if [ ! -s "$ref" ]; then
        # real NCCL unusable here: one process over "dshim" (a group of one communicates nothing)
        echo "reference over real NCCL failed; using backend dshim with one process" >>"$OUT/logs/ddp-ref-np$n.log"
        run_ranks 1 "$OUT/logs/ddp-ref-np$n" "$PY" tests/torch/ddp_helper.py script examples/ddp_train.py \
            --backend dshim --steps 50 --batch $((32 * n)) --save-params "$ref" >>"$OUT/logs/ddp-ref-np$n.log" 2>&1
    fi
    [ -s "$ref" ] || return 1
    echo "$ref"
}

# compare_params REF GOT: how far GOT is from REF, per tensor, relative to how far training moved
# REF from the initial parameters (SmallCNN under torch.manual_seed(0), as the example builds it)
# plus 1e-3 of REF's magnitude (conv biases ahead of BatchNorm get no gradient and do not move).
# Tolerance 5e-3: float32 rounding differences (split batches, SyncBatchNorm's merged statistics,
# other cuDNN algorithms) grow over 50 SGD+momentum steps to ~5e-4 of the movement (the CPU runs
# of tests/torch/test_ddp.py: 4.8e-4 after 50 steps from a 1-ulp start); a semantic difference is
# well above it -- per-rank BatchNorm instead of SyncBatchNorm gives 1-2e-2 (measured on CPU), a
# lost or unaveraged gradient more.  The GPU run prints the figure: adjust with evidence.
compare_params() {
    "$PY" - "$1" "$2" <<'EOF'
import runpy, sys
import torch
ref, got = torch.load(sys.argv[1]), torch.load(sys.argv[2])
ns = runpy.run_path("examples/ddp_train.py", run_name="ddp_train")
torch.manual_seed(0)
init = {k: v.detach() for k, v in ns["SmallCNN"]().state_dict().items()}
TOL = 5e-3
worst, where, absd = 0.0, "", 0.0
for k, r in ref.items():
    g = got[k]
    if g.shape != r.shape or g.dtype != r.dtype:
        print(f"{k}: {g.dtype}{tuple(g.shape)} vs {r.dtype}{tuple(r.shape)}")
        sys.exit(1)
    if not r.is_floating_point():
        if not torch.equal(g, r):
            print(f"{k} differs: {g} vs {r}")
            sys.exit(1)
        continue
    d = (g.double() - r.double()).abs().max().item()
    scale = (r.double() - init[k].double()).abs().max().item() + 1e-3 * r.double().abs().max().item()
    rel = d / scale if scale > 0 else (0.0 if d == 0 else float("inf"))
    if rel >= worst:
        worst, where, absd = rel, k, d
print(f"max|got-ref| / (max|ref-init| + 1e-3 max|ref|) = {worst:.2e} in {where} (abs {absd:.2e}); "
      f"tolerance {TOL:g}")
sys.exit(0 if worst <= TOL else 1)
EOF
}

# ---------------------------------------------------------------------------------------------
# the steps
# ---------------------------------------------------------------------------------------------
STEPS_ALL="reduce-tests cuda-bench torch-backend-cuda nccl-ddp-np2 nccl-ddp-np4 nccl-ddp-np3-chunks
nccl-ddp-np2-staged-chunks ddp-dshim-np2 ddp-dshim-np4 ddp-nccl-preload-np2 ddp-nccl-preload-np4
sweep-nccl-preload-np2 sweep-nccl-staged-np2 sweep-nccl-staged-chunks-np2 sweep-dshim-np2"

# the CUDA kernels against the cpu kernels, bit for bit, and shim/gpu's staging calls on the device
# (tests/gpu): ctest -L gpu where this build's ctest files point at this tree, else the test
# programs themselves
step_reduce-tests() {
    local home rc
    home=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$BUILD/CMakeCache.txt" 2>/dev/null)
    if command -v ctest >/dev/null && [ "$home" = "$ROOT" ]; then
        echo "ctest -L gpu in $BUILD"
        (cd "$BUILD" && ctest -L gpu --output-on-failure) 2>&1 | tee "$OUT/logs/ctest-gpu.txt"
        rc=${PIPESTATUS[0]}
        if [ "$rc" -ne 0 ]; then
            note "ctest -L gpu failed: $(grep -E '^\s+[0-9]+ - ' "$OUT/logs/ctest-gpu.txt" | tr -s ' ' | tr '\n' ';')"
            exit 1
        fi
        # ctest counts a skipped test as passed: PASS only when the device test really ran
        if grep -Eq 'gpu\.(check_reduce_cuda|check_gpu_module_device) \.+\*+Skipped' "$OUT/logs/ctest-gpu.txt"; then
            note "ctest -L gpu: nothing failed, but a device test skipped (no device)"
            exit $SKIP
        fi
        note "ctest -L gpu: passed"
        exit 0
    fi
    echo "no ctest, or $BUILD was configured for '$home', not $ROOT: running the test programs"
    local host=$SKIP dev=$SKIP module=$SKIP
    if [ -x "$BUILD/bin/check_reduce_cuda_host" ]; then
        CK_DEFAULT_TIMEOUT=120 "$BUILD/bin/check_reduce_cuda_host"
        host=$?
    fi
    "$BUILD/bin/check_reduce_cuda"
    dev=$?
    if [ -x "$BUILD/bin/check_gpu_module" ]; then
        "$BUILD/bin/check_gpu_module" && "$BUILD/bin/check_gpu_module" device
        module=$?
    fi
    note "check_reduce_cuda_host exit $host, check_reduce_cuda exit $dev, check_gpu_module exit $module (77 = skipped)"
    if [ $host -ne 0 ] && [ $host -ne $SKIP ]; then exit 1; fi
    if [ $module -ne 0 ] && [ $module -ne $SKIP ]; then exit 1; fi
    exit $dev
}

# the kernels' bandwidth vs the device-to-device copy (the target: >= 80% at 256 MiB)
step_cuda-bench() {
    "$BUILD/bin/dshim-cuda-bench" -a 2>&1 | tee "$OUT/cuda-bench.txt"
    local rc=${PIPESTATUS[0]}
    if [ "$rc" -eq $SKIP ]; then
        note "no CUDA backend: $(grep -o 'cuda reduction backend.*' "$OUT/cuda-bench.txt" | head -n 1)"
    else
        note "$(grep -E '^RESULT' "$OUT/cuda-bench.txt" | tail -n 1)"
    fi
    exit $rc
}

# the dshim backend on CUDA tensors (tests/torch/worker.py's "cuda" scenario,
# what test_backend.py::test_cuda runs, without needing pytest on the GPU machine)
step_torch-backend-cuda() {
    need_torch_cuda
    run_ranks 2 "$OUT/logs/torch-backend-cuda" "$PY" tests/torch/worker.py cuda
    local rc=$?
    note "$(grep -h 'checks,' "$OUT/logs/torch-backend-cuda.rank"* | tr '\n' ' ')"
    exit $rc
}

# ProcessGroupNCCL under LD_PRELOAD, N ranks on one GPU (tests/gpu/nccl_ddp.py: a
# collective matrix on CUDA tensors + DDP vs one process)
nccl_ddp() {
    need_torch_cuda
    lib_has_nccl || { note "libdshim.so does not export the NCCL API (hooks/nccl not built)"; exit $SKIP; }
    [ -f tests/gpu/nccl_ddp.py ] || { note "no tests/gpu/nccl_ddp.py"; exit $SKIP; }
    "$PY" tests/gpu/nccl_ddp.py --np "$1" --lib "$LIB" ${2:+--chunk "$2"}
    local rc=$?
    [ $rc -eq 0 ] && note "collectives + DDP equal to the reference, $1 ranks on one GPU${2:+, $2-byte IPC chunks}"
    exit $rc
}
step_nccl-ddp-np2() { nccl_ddp 2; }
step_nccl-ddp-np4() { nccl_ddp 4; }
# the CUDA IPC path's chunking: 4 KiB slots, so the matrix's 10007-element tensors take many chunks
# (both slots in turn) and a reduce-scatter's per-rank blocks split unevenly over 3 ranks
step_nccl-ddp-np3-chunks() { nccl_ddp 3 4096; }
# the staged path (as between hosts: DSHIM_NCCL_IPC=0) with large ops cut into 16 KiB chunks
# (DSHIM_NCCL_STAGE_CHUNK): the matrix's 10007-element allreduce/broadcast/reduce take 3 chunks
step_nccl-ddp-np2-staged-chunks() { DSHIM_NCCL_IPC=0 DSHIM_NCCL_STAGE_CHUNK=16k nccl_ddp 2; }

# examples/ddp_train.py unmodified, CUDA tensors + SyncBatchNorm, backend "dshim", N ranks
# on the one GPU, against the single-process reference
ddp_dshim() {
    local n=$1 ref
    need_torch_cuda
    ref=$(reference_params "$n") || { note "the single-process reference failed (logs/ddp-ref-np$n.log)"; exit 1; }
    DSHIM_SUMMARY=1 run_ranks "$n" "$OUT/logs/$STEP" "$PY" tests/torch/ddp_helper.py script \
        examples/ddp_train.py --backend dshim --steps 50 --save-params "$OUT/$STEP.pt" || exit 1
    grep -h "DSHIM-TEST-STATS" "$OUT/logs/$STEP.rank"*
    grep -q "DSHIM-TEST-STATS rank=0 backend=dshim" "$OUT/logs/$STEP.rank0" ||
        { note "rank 0's group is not dshim's"; exit 1; }
    local cmp
    cmp=$(compare_params "$ref" "$OUT/$STEP.pt")
    local rc=$?
    note "$cmp"
    exit $rc
}
step_ddp-dshim-np2() { ddp_dshim 2; }
step_ddp-dshim-np4() { ddp_dshim 4; }

# the same example with backend "nccl" under LD_PRELOAD=libdshim.so (DSHIM_TAKEOVER=0:
# ProcessGroupNCCL itself calls the NCCL API, which resolves to dshim's), N ranks on one GPU
ddp_nccl_preload() {
    local n=$1 ref
    need_torch_cuda
    lib_has_nccl || { note "libdshim.so does not export the NCCL API (hooks/nccl not built)"; exit $SKIP; }
    ref=$(reference_params "$n") || { note "the single-process reference failed (logs/ddp-ref-np$n.log)"; exit 1; }
    LD_PRELOAD="$LIB" DSHIM_TAKEOVER=0 DSHIM_SUMMARY=1 run_ranks "$n" "$OUT/logs/$STEP" "$PY" \
        examples/ddp_train.py --backend nccl --steps 50 --save-params "$OUT/$STEP.pt" || exit 1
    # DSHIM_SUMMARY=1: dshim's communicator prints its summary when destroyed -- proof that dshim,
    # not NCCL (which refuses two ranks on one GPU), carried the job
    grep -h "^dshim: [0-9]* ranks over" "$OUT/logs/$STEP.rank"* | head -n 4
    grep -q "^dshim: $n ranks over" "$OUT/logs/$STEP.rank0" ||
        { note "no 'dshim: $n ranks over' summary line from rank 0: not carried by dshim?"; exit 1; }
    local cmp
    cmp=$(compare_params "$ref" "$OUT/$STEP.pt")
    local rc=$?
    note "$cmp"
    exit $rc
}
step_ddp-nccl-preload-np2() { ddp_nccl_preload 2; }
step_ddp-nccl-preload-np4() { ddp_nccl_preload 4; }

# nccl-tests-style all_reduce busbw, 2 ranks on one GPU
step_sweep-nccl-preload-np2() {
    need_torch_cuda
    lib_has_nccl || { note "libdshim.so does not export the NCCL API (hooks/nccl not built)"; exit $SKIP; }
    LD_PRELOAD="$LIB" DSHIM_TAKEOVER=0 run_ranks 2 "$OUT/logs/$STEP" "$PY" scripts/gpu_allreduce_sweep.py \
        --backend nccl --out "$OUT/$STEP.txt"
    local rc=$?
    [ -s "$OUT/$STEP.txt" ] && note "$(tail -n 1 "$OUT/$STEP.txt")"
    exit $rc
}
# the staged path alone (as between hosts), whole and in 4 MiB chunks: what the pipelining gains
step_sweep-nccl-staged-np2() { DSHIM_NCCL_IPC=0 DSHIM_NCCL_STAGE_CHUNK=0 step_sweep-nccl-preload-np2; }
step_sweep-nccl-staged-chunks-np2() { DSHIM_NCCL_IPC=0 DSHIM_NCCL_STAGE_CHUNK=4m step_sweep-nccl-preload-np2; }
step_sweep-dshim-np2() {
    need_torch_cuda
    run_ranks 2 "$OUT/logs/$STEP" "$PY" scripts/gpu_allreduce_sweep.py --backend dshim --out "$OUT/$STEP.txt"
    local rc=$?
    [ -s "$OUT/$STEP.txt" ] && note "$(tail -n 1 "$OUT/$STEP.txt")"
    exit $rc
}

# step timeouts (seconds); the sum of what normally runs is far below DSHIM_GPU_BUDGET
step_timeout() {
    case $1 in
        reduce-tests) echo 240 ;;
        cuda-bench) echo 180 ;;
        sweep-*) echo 150 ;;
        *) echo 120 ;;
    esac
}

# ---------------------------------------------------------------------------------------------
# the environment: what the GPU machine has, and library paths for what it lacks
# ---------------------------------------------------------------------------------------------
setup_env() {
    cd "$ROOT" || exit 1
    unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT LD_PRELOAD
    export PYTHONPATH="$ROOT/python" PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
    export DSHIM_BUILD_DIR="$BUILD"
    # the package loads <repo>/build/lib/libdshim.so; another build reaches the test helpers this way
    if [ "$BUILD" != "$ROOT/build" ]; then
        export DSHIM_TEST_PRELOAD="$LIB"
    fi
    # libunwind & co. from build/gpu-deps only where the machine lacks them
    if [ -e "$LIB" ] && ldd "$LIB" 2>/dev/null | grep -q "not found" && [ -d "$DEPS" ]; then
        export LD_LIBRARY_PATH="$DEPS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    fi
    # libcudart for libdshim-cuda.so: torch's own copy (the one a torch process has loaded anyway),
    # else the one --prepare copied
    if [ -e "$CUDA_LIB" ] && ldd "$CUDA_LIB" 2>/dev/null | grep -q "libcudart.*not found"; then
        local dir
        dir=$("$PY" - <<'EOF' 2>/dev/null
import glob, os, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()]
for r in roots:
    for p in sorted(glob.glob(os.path.join(r, "nvidia", "**", "libcudart.so.*"), recursive=True)):
        print(os.path.dirname(p)); sys.exit(0)
    for p in glob.glob(os.path.join(r, "torch", "lib", "libcudart*.so*")):
        print(os.path.dirname(p)); sys.exit(0)
EOF
)
        [ -z "$dir" ] && [ -d "$DEPS/cudart" ] && dir="$DEPS/cudart"
        [ -n "$dir" ] && export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    fi
}

describe_env() {
    echo "date: $(date -u '+%F %T UTC')   host: $(hostname)   tree: $ROOT   build: $BUILD"
    echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.memory --format=csv 2>&1
    else
        echo "nvidia-smi: not installed"
    fi
    "$PY" -c 'import sys, torch, torch.distributed as d
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
      "devices", torch.cuda.device_count() if torch.cuda.is_available() else 0,
      "nccl", d.is_nccl_available() and ".".join(map(str, torch.cuda.nccl.version())))' 2>&1 | tail -n 1
    local f
    for f in "$LIB" "$CUDA_LIB" "$BUILD/bin/check_reduce_cuda" "$BUILD/bin/dshim-cuda-bench"; do
        if [ -e "$f" ]; then
            ldd "$f" 2>&1 | grep -q "not found" && echo "MISSING for $f: $(ldd "$f" | grep 'not found' | tr -s ' \t' ' ')"
        else
            echo "MISSING: $f (build first; carry build/)"
        fi
    done
    if [ -e "$LIB" ]; then
        lib_has_nccl && echo "libdshim.so exports the NCCL API" || echo "libdshim.so has no NCCL API"
    fi
}

# ---------------------------------------------------------------------------------------------
# main: every step, bounded, independent; then the table
# ---------------------------------------------------------------------------------------------
main() {
    mkdir -p "$OUT/logs" "$OUT/notes"
    setup_env
    local t_start=$SECONDS
    describe_env 2>&1 | tee "$OUT/env.txt"
    local steps=${DSHIM_GPU_STEPS:-$STEPS_ALL}
    local rows=() fails=0 name t left rc res t0 dt
    for name in $steps; do
        if ! declare -F "step_$name" >/dev/null; then
            rows+=("$(printf '%-24s %-5s %5s  %s' "$name" FAIL 0 "no such step (have: $(echo $STEPS_ALL))")")
            fails=$((fails + 1))
            continue
        fi
        t=$(step_timeout "$name")
        left=$((BUDGET - (SECONDS - t_start)))
        if [ "$left" -lt 20 ]; then
            rows+=("$(printf '%-24s %-5s %5s  %s' "$name" SKIP 0 "out of time (DSHIM_GPU_BUDGET=$BUDGET s)")")
            continue
        fi
        [ "$t" -gt "$left" ] && t=$left
        echo "==== $name (timeout ${t}s) -> $OUT/logs/$name.log"
        rm -f "$OUT/notes/$name"
        t0=$SECONDS
        timeout -k 10 "$t" bash "$SELF" --step "$name" >"$OUT/logs/$name.log" 2>&1
        rc=$?
        dt=$((SECONDS - t0))
        case $rc in
            0) res=PASS ;;
            "$SKIP") res=SKIP ;;
            124 | 137) res=FAIL; echo "timed out after ${t}s" >"$OUT/notes/$name" ;;
            *) res=FAIL ;;
        esac
        [ "$res" = FAIL ] && fails=$((fails + 1))
        local why=""
        [ -s "$OUT/notes/$name" ] && why=$(head -c 300 "$OUT/notes/$name" | tr '\n' ' ')
        [ -z "$why" ] && [ "$res" = FAIL ] && why="exit $rc; $(tail -n 1 "$OUT/logs/$name.log" | head -c 200)"
        rows+=("$(printf '%-24s %-5s %5s  %s' "$name" "$res" "$dt" "$why")")
        echo "     $res (${dt}s) $why"
    done
    {
        echo "dshim GPU checks: $(date -u '+%F %T UTC'), $((SECONDS - t_start)) s; logs in $OUT/logs"
        sed -n '1,6p' "$OUT/env.txt"
        printf '%-24s %-5s %5s  %s\n' step result sec note
        printf '%s\n' "${rows[@]}"
    } >"$OUT/summary.txt"
    echo
    cat "$OUT/summary.txt"
    [ $fails -eq 0 ]
}

case "${1:-}" in
    --prepare) prepare ;;
    --step)
        STEP=$2
        setup_env
        "step_$STEP"
        ;;
    -h | --help) sed -n '2,19p' "$SELF" | sed 's/^# \{0,1\}//' ;;
    "") main ;;
    *) echo "usage: scripts/gpu_checks.sh [--prepare | --help]" >&2; exit 2 ;;
esac

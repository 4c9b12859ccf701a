#!/usr/bin/env bash
# Every test dshim has: the normal build (all ctest labels), an ASan+UBSan
# build, a TSan build, and valgrind over the unit tests and a small
# conformance run.  Each stage prints its runner's summary.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
JOBS=${JOBS:-2}
failed=()

# Each stage ends with its wall time and the CPU time its processes used (those the stage waited
# for): the figures to weigh before moving or sharding tests (2 cores: CPU/wall near 2 is saturated).
children_cpu() {  # sets CPU_NOW; `times` runs in this shell (in a pipe or $(...) a fresh subshell answers)
    times > "$SCRATCH/times"
    CPU_NOW=$(tail -1 "$SCRATCH/times" | awk '{t = 0; for (i = 1; i <= 2; i++) { split($i, a, "m"); sub("s", "", a[2]); t += a[1] * 60 + a[2] } printf "%d", t}')
}
stage_end() {
    [ -n "${stage_name:-}" ] || return 0
    children_cpu
    echo "[stage '$stage_name': $(( $(date +%s) - stage_t0 )) s, $(( CPU_NOW - stage_cpu0 )) s of CPU]"
}
stage() {
    stage_end
    children_cpu
    stage_name=${1%%:*}; stage_t0=$(date +%s); stage_cpu0=$CPU_NOW
    echo; echo "=================== $* ==================="
}

# Flight-recorder dumps of the tests' deliberate failures go here, not to the
# shared default (/tmp/dshim-trace-<uid>); tests that read dumps set their own.
DSHIM_TRACE_DIR=$(mktemp -d /tmp/dshim-test-trace.XXXXXX)
export DSHIM_TRACE_DIR
# valgrind's logs, and the directories its dshim-run jobs run in
SCRATCH=$(mktemp -d /tmp/dshim-test-scratch.XXXXXX)
trap 'rm -rf "$DSHIM_TRACE_DIR" "$SCRATCH"' EXIT

# Without the CUDA kernels: nvcc's device code is not instrumented, no test
# here has a GPU to run it, and its three architectures were minutes of each build.
build_variant() {  # dir, sanitizer
    cmake -S . -B "$1" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDSHIM_SANITIZE="$2" -DDSHIM_CUDA=OFF >/dev/null &&
        make --no-print-directory -C "$1" -j"$JOBS" >/dev/null
}

stage "normal build: unit, preload, conformance, failure, gpu, torch, nccl, mxnet, launcher, install"
# gpu tests skip themselves (exit code 77) on machines without a GPU.  Four slots on two cores: this
# stage's tests mostly wait (timeouts they provoke, stopped processes, the soak's fixed 3 minutes,
# sleeps in launched jobs): at two slots they kept about half a core busy (12 min of CPU in
# 22 min).  The long ones carry a COST so that they start first, and those whose jobs keep several ranks
# computing count as two slots (PROCESSORS 2): at most two of them run at once.
NORMAL_JOBS=${NORMAL_JOBS:-$((JOBS * 2))}
(cd "$BUILD" && ctest --output-on-failure -j"$NORMAL_JOBS" -LE peer --timeout 1500) || failed+=("normal")

stage "peer: the frameworks' own test suites under dshim (label peer)"
# torch's distributed_test.py for gloo under LD_PRELOAD=libdshim.so, checked against gloo's own
# outcomes (tests/peer); one summary line per suite, from ctest's log of this run
peer_start=$(date +%s)
(cd "$BUILD" && ctest --output-on-failure -j"$JOBS" -L peer --timeout 1800) || failed+=("peer")
grep -hE '^[a-zA-Z].*: [0-9]+ passed, [0-9]+ failed, [0-9]+ skipped' "$BUILD/Testing/Temporary/LastTest.log" 2>/dev/null
echo "peer: $(( $(date +%s) - peer_start )) s"

# The sanitizer stages' tests mostly wait too (at JOBS slots ASan kept one core busy, TSan 1.2):
# ASan gets the normal stage's slots, TSan (several times slower, its ranks on 1-3 per test) one more
stage "ASan+UBSan build"
if build_variant build-asan address; then
    (cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
        ctest --output-on-failure -j"$NORMAL_JOBS" -LE 'launcher|install|soak' -E 'np8|tcp.np4|hosts3' --timeout 1500) ||
        failed+=("asan")
else
    echo "ASan build failed"; failed+=("asan-build")
fi

stage "TSan build (threaded core)"
if build_variant build-tsan thread; then
    (cd build-tsan && TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
        ctest --output-on-failure -j"$((JOBS + 1))" -L 'unit|conformance|failure|tsan' -E 'np4|np5|np6|np8' --timeout 1500) ||
        failed+=("tsan")
else
    echo "TSan build failed"; failed+=("tsan-build")
fi

stage "valgrind: unit tests and a 2-rank conformance run"
# Each run is one process at a time under valgrind (single-threaded and CPU-bound): $JOBS of them at
# once.  Every run writes its own log; the tally is made when all have ended.
VG="valgrind -q --leak-check=full --errors-for-leak-kinds=definite"
vg_start=$(date +%s)
vg_n=0
vg_spawn() {  # name, wanted exit code, strict, command...: runs in the background, in its own log;
              # strict: any valgrind report fails it (the unit tests' own threads leave "possibly lost"
              # blocks that only the exit code, definite leaks, judges)
    local name=$1 want=$2 strict=$3; shift 3
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
    vg_n=$((vg_n + 1))
    local log=$SCRATCH/vg.$vg_n
    echo "$name" > "$log.name"; echo "$want" > "$log.want"; echo "$strict" > "$log.strict"
    ( "$@" > "$log" 2>&1; echo $? > "$log.rc" ) &
}
for t in "$BUILD"/bin/check_*; do
    # check_failure, check_crash, check_resources and the unit tests that start ranks of their own
    # (check_single_copy, check_xfer, check_host_gate, check_topo, check_named) run under ASan and TSan;
    # under valgrind they added minutes and found nothing those do not
    case $(basename "$t") in check_failure|check_crash|check_resources|check_single_copy|check_xfer|check_host_gate|check_topo|check_named) continue ;; esac
    vg_spawn "$(basename "$t")" 0 no env CK_FORK=no $VG --error-exitcode=9 "$t"
done
vg_spawn "conformance 2" 0 no env DSHIM_TRANSPORT=shm $VG --error-exitcode=9 "$BUILD"/bin/conformance 2
# dshim-run's controller and agents (the launched programs are not traced): a clean job, and a
# failing one with a restart (exit code 3 is the job's); each in a directory of its own (a failed
# job leaves its dshim-trace-<job> there)
vg_run() {
    local want=$1; shift
    local dir; dir=$(mktemp -d "$SCRATCH/run.XXXXXX")
    vg_spawn "dshim-run $*" "$want" yes sh -c 'cd "$1" && shift && exec "$@"' sh "$dir" \
        $VG --error-exitcode=99 --trace-children=yes --trace-children-skip='/usr/bin/*,/bin/*' \
        "$(cd "$BUILD" && pwd)"/bin/dshim-run --master-port 0 --no-python "$@"
}
vg_run 0 --nproc-per-node 3 /bin/echo hello
vg_run 3 --nproc-per-node 2 --max-restarts 1 /bin/sh -c 'exit 3'
wait
vg_fail=0
vg_pass=0
for i in $(seq 1 "$vg_n"); do
    log=$SCRATCH/vg.$i
    name=$(cat "$log.name"); want=$(cat "$log.want"); rc=$(cat "$log.rc" 2>/dev/null || echo none)
    if [ "$rc" = "$want" ] && { [ "$(cat "$log.strict")" = no ] || ! grep -q '==[0-9]*==' "$log"; }; then
        vg_pass=$((vg_pass + 1))
    elif [ "$rc" = 77 ]; then
        echo "valgrind: $name skipped ($(head -1 "$log"))"
    else
        echo "valgrind: $name failed (exit $rc, wanted $want):"; tail -30 "$log"; vg_fail=$((vg_fail + 1))
    fi
done
echo "valgrind: $vg_pass passed, $vg_fail failed ($(( $(date +%s) - vg_start )) s)"
[ $vg_fail = 0 ] || failed+=("valgrind")

stage "fuzz: libFuzzer on every parser of network bytes (clang build, label fuzz)"
# tests/fuzz: each target runs 20 s on a copy of its seed corpus (tests/fuzz/corpus) and fails
# on a crash, leak, timeout or sanitizer report; one stats line per target (cov, exec/s)
fuzz_start=$(date +%s)
if CC=clang CXX=clang++ cmake -S . -B build-fuzz -DDSHIM_FUZZ=ON -DDSHIM_CUDA=OFF -DDSHIM_WERROR=ON >/dev/null &&
        make --no-print-directory -C build-fuzz -j"$JOBS" dshim_fuzz >/dev/null; then
    (cd build-fuzz && ctest --output-on-failure -j"$JOBS" -L fuzz --timeout 300) || failed+=("fuzz")
    grep -hE '^fuzz_[a-z_]+: ' build-fuzz/Testing/Temporary/LastTest.log 2>/dev/null
else
    echo "fuzz build failed (it needs clang and libclang-rt-14-dev: make setup)"; failed+=("fuzz-build")
fi
echo "fuzz: $(( $(date +%s) - fuzz_start )) s"

stage_end
echo
if [ ${#failed[@]} -gt 0 ]; then
    echo "make test: FAILED stages: ${failed[*]}"
    exit 1
fi
echo "make test: all stages passed"

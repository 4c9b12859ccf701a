#!/usr/bin/env bash
# Every test dshim has: the normal build (all ctest labels), an ASan+UBSan
# build, a TSan build, and valgrind over the unit tests and a small
# conformance run.  Each stage prints its runner's summary.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
JOBS=${JOBS:-2}
failed=()

stage() { echo; echo "=================== $* ==================="; }

# Flight-recorder dumps of the tests' deliberate failures go here, not to the
# shared default (/tmp/dshim-trace-<uid>); tests that read dumps set their own.
DSHIM_TRACE_DIR=$(mktemp -d /tmp/dshim-test-trace.XXXXXX)
export DSHIM_TRACE_DIR
# valgrind's logs, and the directory its dshim-run jobs run in (a failed job leaves its
# dshim-trace-<job> there)
SCRATCH=$(mktemp -d /tmp/dshim-test-scratch.XXXXXX)
trap 'rm -rf "$DSHIM_TRACE_DIR" "$SCRATCH"' EXIT
VG_LOG=$SCRATCH/valgrind.log

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

stage "ASan+UBSan build"
if build_variant build-asan address; then
    (cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
        ctest --output-on-failure -j"$JOBS" -LE 'launcher|install|soak' -E 'np8|tcp.np4|hosts3' --timeout 1500) ||
        failed+=("asan")
else
    echo "ASan build failed"; failed+=("asan-build")
fi

stage "TSan build (threaded core)"
if build_variant build-tsan thread; then
    (cd build-tsan && TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
        ctest --output-on-failure -j"$JOBS" -L 'unit|conformance|failure|tsan' -E 'np4|np5|np6|np8' --timeout 1500) ||
        failed+=("tsan")
else
    echo "TSan build failed"; failed+=("tsan-build")
fi

stage "valgrind: unit tests and a 2-rank conformance run"
vg_fail=0
vg_pass=0
for t in "$BUILD"/bin/check_*; do
    # check_failure, check_crash, check_resources and the unit tests that start ranks of their own
    # (check_single_copy, check_xfer, check_host_gate, check_topo, check_named) run under ASan and TSan;
    # under valgrind they added minutes and found nothing those do not
    case $(basename "$t") in check_failure|check_crash|check_resources|check_single_copy|check_xfer|check_host_gate|check_topo|check_named) continue ;; esac
    CK_FORK=no valgrind -q --error-exitcode=9 --leak-check=full --errors-for-leak-kinds=definite \
        "$t" > "$VG_LOG" 2>&1
    rc=$?
    if [ $rc = 0 ]; then
        vg_pass=$((vg_pass + 1))
    elif [ $rc = 77 ]; then
        echo "valgrind: $(basename "$t") skipped ($(head -1 "$VG_LOG"))"
    else
        echo "valgrind: $(basename "$t") failed:"; tail -30 "$VG_LOG"; vg_fail=$((vg_fail + 1))
    fi
done
if DSHIM_TRANSPORT=shm valgrind -q --error-exitcode=9 --leak-check=full --errors-for-leak-kinds=definite \
        "$BUILD"/bin/conformance 2 > "$VG_LOG" 2>&1; then
    vg_pass=$((vg_pass + 1))
else
    echo "valgrind: conformance 2 failed:"; tail -30 "$VG_LOG"; vg_fail=$((vg_fail + 1))
fi
# dshim-run's controller and agents (the launched programs are not traced):
# a clean job, and a failing one with a restart (exit code 3 is the job's).
vg_run() {
    local want=$1; shift
    (cd "$SCRATCH" && valgrind -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite \
        --trace-children=yes --trace-children-skip='/usr/bin/*,/bin/*' \
        "$OLDPWD/$BUILD"/bin/dshim-run --master-port 0 --no-python "$@") > "$VG_LOG" 2>&1
    local rc=$?
    if [ $rc = "$want" ] && ! grep -q '==[0-9]*==' "$VG_LOG"; then
        vg_pass=$((vg_pass + 1))
    else
        echo "valgrind: dshim-run $* failed (exit $rc, wanted $want):"; tail -30 "$VG_LOG"
        vg_fail=$((vg_fail + 1))
    fi
}
vg_run 0 --nproc-per-node 3 /bin/echo hello
vg_run 3 --nproc-per-node 2 --max-restarts 1 /bin/sh -c 'exit 3'
echo "valgrind: $vg_pass passed, $vg_fail failed"
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

echo
if [ ${#failed[@]} -gt 0 ]; then
    echo "make test: FAILED stages: ${failed[*]}"
    exit 1
fi
echo "make test: all stages passed"

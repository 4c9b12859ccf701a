#!/usr/bin/env bash
# dshim-run under a resource manager: --launcher mpi (Open MPI's mpirun, on
# this machine) and --launcher slurm (a private 2-node Slurm cluster from
# lib/slurm.sh: salloc, srun, sbatch).  Checks the torchrun-style and MXNet
# launch.py-style environments, a real dshim job, failure/interrupt handling
# (exit codes, the line naming the process, timing) and that no process of a
# job survives it: every launch carries DSHIM_TEST_MARKER=<uuid of this run>
# in its environment and no_leftovers looks for it in /proc/*/environ.
# The Slurm part is skipped (with a note) when slurm_available says no; the
# whole test skips (77) when neither mpirun nor Slurm can run here.
# Bounded to 240 s; about 15 s on a 2-core machine.
# ($VARS in single quotes are meant for the job, not this shell)
# shellcheck source-path=SCRIPTDIR disable=SC2016
set -euo pipefail

if [ -z "${TEST_MPI_SLURM_BOUNDED:-}" ]; then
    export TEST_MPI_SLURM_BOUNDED=1
    exec timeout -k 5 240 bash "$0" "$@"
fi

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${DSHIM_BUILD_DIR:-$root/build}
run=$build/bin/dshim-run
bench=$build/bin/dshim-bench
# shellcheck source=lib/slurm.sh
source "$here/lib/slurm.sh"

for b in "$run" "$bench"; do
    if [ ! -x "$b" ]; then
        echo "test_mpi_slurm: $b not found; build first (make -C $root) or set DSHIM_BUILD_DIR" >&2
        exit 1
    fi
done
if ! command -v python3 >/dev/null; then
    echo "test_mpi_slurm: python3 not found on PATH (make setup)" >&2
    exit 1
fi
have_mpi=1
mpi_why=""
if ! command -v mpirun >/dev/null; then
    have_mpi=0
    mpi_why="mpirun not found (apt-get install openmpi-bin)"
fi
have_slurm=1
slurm_why=""
if ! slurm_why=$(slurm_available); then
    have_slurm=0
fi
if [ $have_mpi = 0 ] && [ $have_slurm = 0 ]; then
    echo "SKIP: $mpi_why; $slurm_why"
    exit 77
fi

MARK=$(cat /proc/sys/kernel/random/uuid)
work=$(mktemp -d /tmp/test_mpi_slurm.XXXXXX)
chmod 755 "$work"
cd "$work"

# marked_pids — PIDs of live (not zombie) processes whose environment holds
# our marker, except this shell and its ancestors.  Builtins only, so the
# scan does not find itself.
marked_pids() {
    local d p pp st
    local -a envv
    local -A skip=()
    p=$BASHPID
    while [ -n "$p" ] && [ "$p" != 0 ]; do
        skip[$p]=1
        pp=""
        while read -r k v; do
            if [ "$k" = PPid: ]; then pp=$v; break; fi
        done 2>/dev/null < "/proc/$p/status"
        p=$pp
    done
    skip[$$]=1
    for d in /proc/[0-9]*; do
        p=${d#/proc/}
        [ -n "${skip[$p]:-}" ] && continue
        mapfile -d '' -t envv 2>/dev/null < "$d/environ" || continue
        [[ " ${envv[*]} " == *" DSHIM_TEST_MARKER=$MARK "* ]] || continue
        read -r st 2>/dev/null < "$d/stat" || continue
        st=${st##*) }
        [ "${st%% *}" = Z ] && continue
        echo "$p"
    done
    return 0
}

# no_leftovers — true when no marked process is alive; otherwise lists them.
no_leftovers() {
    local -a left
    local p
    mapfile -t left < <(marked_pids)
    [ ${#left[@]} = 0 ] && return 0
    echo "  left behind (pid: cmdline):"
    for p in "${left[@]}"; do
        echo "    $p: $(tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null)"
    done
    return 1
}

cleanup() {
    local p
    # Anything of ours that survived a failed check: kill it by PID.
    for p in $(marked_pids); do
        kill -KILL "$p" 2>/dev/null || true
    done
    slurm_down
    cd /
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 143' TERM INT HUP

passed=0
failed=0
ok() {
    echo "ok: $*"
    passed=$((passed + 1))
}
bad() {
    echo "FAIL: $*"
    failed=$((failed + 1))
}
show() {  # show FILE... — a failed check's evidence
    local f
    for f in "$@"; do
        [ -e "$f" ] || continue
        echo "  ---- $f"
        sed 's/^/  | /' "$f" | head -n 40
    done
}
now() {
    echo "$EPOCHREALTIME"
}
secs() {  # secs START [END] — seconds between them, 2 decimals
    awk -v a="$1" -v b="${2:-$EPOCHREALTIME}" 'BEGIN { printf "%.2f", b - a }'
}
lt() {  # lt A B — A < B (decimals)
    awk -v a="$1" -v b="$2" 'BEGIN { exit !(a < b) }'
}
# launch CMD... — CMD with the marker in its environment, bounded.
launch() {
    DSHIM_TEST_MARKER=$MARK timeout -k 5 60 "$@"
}
# find_exe PID EXE — the first process at or below PID running EXE (the
# dshim-run under `timeout`: signals must go to it alone, as timeout forwards
# a signal to its child AND its process group, i.e. twice).
find_exe() {
    local p c exe
    local -a queue=("$1") kids
    while [ ${#queue[@]} -gt 0 ]; do
        p=${queue[0]}
        queue=("${queue[@]:1}")
        exe=$(readlink "/proc/$p/exe" 2>/dev/null) || exe=""
        if [ "$exe" = "$2" ]; then
            echo "$p"
            return 0
        fi
        kids=()
        # (no newline at the end of that file: read "fails" but fills kids)
        read -r -a kids 2>/dev/null < "/proc/$p/task/$p/children" || true
        for c in "${kids[@]}"; do
            queue+=("$c")
        done
    done
    return 0
}
# wait_lines FILE REGEX N SECS — until FILE has N lines matching REGEX.
wait_lines() {
    local i
    for ((i = 0; i < $4 * 10; i++)); do
        [ "$(grep -cE "$2" "$1" 2>/dev/null)" -ge "$3" ] && return 0
        sleep 0.1
    done
    return 1
}

# The job: prints the variables a launcher sets, and its arguments.
cat > env.py <<'EOF'
import os, sys
keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
        "SLURMD_NODENAME", "DMLC_ROLE", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT",
        "DMLC_NUM_SERVER", "DMLC_NUM_WORKER"]
print("ENV " + " ".join("%s=%s" % (k, os.environ.get(k, "-")) for k in keys), flush=True)
print("ARGS " + repr(sys.argv[1:]), flush=True)
EOF
# fail.py R: prints its pid and whether our marker reached it (else the
# leftover checks would prove nothing), rank R exits 3 after 0.5 s, every
# other rank sleeps.
cat > fail.py <<'EOF'
import os, sys, time
r = int(os.environ.get("RANK", "-1"))
with open("/proc/self/environ", "rb") as f:
    marked = b"\0DSHIM_TEST_MARKER=" in b"\0" + f.read()
print("started %d %d marker=%s" % (r, os.getpid(), "yes" if marked else "no"), flush=True)
if r == int(sys.argv[1]):
    time.sleep(0.5)
    sys.exit(3)
time.sleep(120)
EOF
export OMP_NUM_THREADS=1   # (quiets dshim-run's note about it)

# marked FILE — fail.py's ranks all started with the marker (at least one did).
marked() {
    grep -q ' started .* marker=yes$' "$1" && ! grep -q ' started .* marker=no$' "$1"
}

# val FILE PREFIX KEY — KEY's value on the ENV line of PREFIX ("[rank 2]").
val() {
    grep -F "$2 ENV " "$1" | head -n 1 | tr ' ' '\n' | sed -n "s/^$3=//p"
}

# check_torch OUT NRANKS PER_NODE ADDR [NODE...] — torchrun variables of every
# rank, one MASTER_PORT for all (not 0), only "[rank N]" lines; NODE i is the
# SLURMD_NODENAME rank i must report (none: not checked).
check_torch() {
    local out=$1 n=$2 per=$3 addr=$4 r port p why=""
    shift 4
    local -a nodes=("$@")
    port=$(val "$out" "[rank 0]" MASTER_PORT)
    [[ $port =~ ^[1-9][0-9]*$ ]] || why="$why rank 0 MASTER_PORT='$port';"
    for ((r = 0; r < n; r++)); do
        p="[rank $r]"
        [ "$(val "$out" "$p" RANK)" = "$r" ] || why="$why $p RANK;"
        [ "$(val "$out" "$p" LOCAL_RANK)" = $((r % per)) ] || why="$why $p LOCAL_RANK=$(val "$out" "$p" LOCAL_RANK);"
        [ "$(val "$out" "$p" WORLD_SIZE)" = "$n" ] || why="$why $p WORLD_SIZE;"
        [ "$(val "$out" "$p" LOCAL_WORLD_SIZE)" = "$per" ] || why="$why $p LOCAL_WORLD_SIZE;"
        [ "$(val "$out" "$p" MASTER_ADDR)" = "$addr" ] || why="$why $p MASTER_ADDR=$(val "$out" "$p" MASTER_ADDR);"
        [ "$(val "$out" "$p" MASTER_PORT)" = "$port" ] || why="$why $p MASTER_PORT differs;"
        if [ ${#nodes[@]} -gt 0 ] && [ "$(val "$out" "$p" SLURMD_NODENAME)" != "${nodes[$r]}" ]; then
            why="$why $p on $(val "$out" "$p" SLURMD_NODENAME) not ${nodes[$r]};"
        fi
    done
    [ "$(grep -c ' ENV ' "$out")" = "$n" ] || why="$why $(grep -c ' ENV ' "$out") ENV lines, not $n;"
    if grep -vqE '^\[rank [0-9]+\] ' "$out"; then
        why="$why unprefixed stdout line(s);"
    fi
    echo "$why"
}

# check_mxnet OUT NWORKERS NSERVERS — scheduler, servers and workers with the
# dmlc tracker's variables, one root URI/port for all.
check_mxnet() {
    local out=$1 nw=$2 ns=$3 uri port p role why=""
    local -a who=("[scheduler]")
    for ((p = 0; p < ns; p++)); do who+=("[server $p]"); done
    for ((p = 0; p < nw; p++)); do who+=("[worker $p]"); done
    uri=$(val "$out" "[scheduler]" DMLC_PS_ROOT_URI)
    port=$(val "$out" "[scheduler]" DMLC_PS_ROOT_PORT)
    [ -n "$uri" ] && [ "$uri" != - ] || why="$why no DMLC_PS_ROOT_URI;"
    [[ $port =~ ^[1-9][0-9]*$ ]] || why="$why DMLC_PS_ROOT_PORT='$port';"
    for p in "${who[@]}"; do
        role=${p#[}
        role=${role%]}
        role=${role% *}
        [ "$(val "$out" "$p" DMLC_ROLE)" = "$role" ] || why="$why $p DMLC_ROLE='$(val "$out" "$p" DMLC_ROLE)';"
        [ "$(val "$out" "$p" DMLC_PS_ROOT_URI)" = "$uri" ] || why="$why $p DMLC_PS_ROOT_URI differs;"
        [ "$(val "$out" "$p" DMLC_PS_ROOT_PORT)" = "$port" ] || why="$why $p DMLC_PS_ROOT_PORT differs;"
        [ "$(val "$out" "$p" DMLC_NUM_SERVER)" = "$ns" ] || why="$why $p DMLC_NUM_SERVER;"
        [ "$(val "$out" "$p" DMLC_NUM_WORKER)" = "$nw" ] || why="$why $p DMLC_NUM_WORKER;"
    done
    [ "$(grep -c ' ENV ' "$out")" = ${#who[@]} ] || why="$why $(grep -c ' ENV ' "$out") ENV lines, not ${#who[@]};"
    echo "$why"
}

# =============================================================== mpirun
if [ $have_mpi = 1 ]; then
    echo "== --launcher mpi ($(timeout 10 mpirun --version 2>/dev/null | head -n 1))"

    # 1. torchrun style: 4 ranks, environment, arguments with space and quote.
    t=$(now)
    rc=0
    launch "$run" --launcher mpi --nproc-per-node 4 --master-port 0 env.py "a b" 'c"d' >m1.out 2>m1.err || rc=$?
    el=$(secs "$t")
    why=$(check_torch m1.out 4 4 127.0.0.1)
    [ "$(grep -cFx "ARGS ['a b', 'c\"d']" <(sed 's/^\[rank [0-9]*\] //' m1.out))" = 4 ] || why="$why arguments not intact;"
    [ "$rc" = 0 ] || why="$why rc=$rc;"
    if [ -z "$why" ] && no_leftovers; then
        ok "mpi: 4 ranks, RANK/LOCAL_RANK/WORLD_SIZE/LOCAL_WORLD_SIZE/MASTER_*, args intact, [rank N] prefixes ($el s)"
    else
        bad "mpi: dshim-run --launcher mpi --nproc-per-node 4 --master-port 0 env.py 'a b' 'c\"d':$why"
        show m1.out m1.err
    fi

    # 2. A real dshim job (rendezvous, shm) under mpirun.
    t=$(now)
    rc=0
    launch "$run" --launcher mpi --nproc-per-node 3 --no-python "$bench" -b 64K -e 1M -t 0.3 >m2.out 2>m2.err || rc=$?
    el=$(secs "$t")
    if [ "$rc" = 0 ] && [ "$(grep -cE '^\[rank 0\] .* ok$' m2.out)" = 3 ] && grep -q '3 ranks' m2.out && no_leftovers; then
        ok "mpi: dshim-bench -b 64K -e 1M over 3 ranks: rc=0, 3 ok lines ($el s)"
    else
        bad "mpi: dshim-run --launcher mpi --nproc-per-node 3 --no-python dshim-bench -b 64K -e 1M -t 0.3: rc=$rc"
        show m2.out m2.err
    fi

    # 3. MXNet style: the scheduler here, server and workers under mpirun.
    t=$(now)
    rc=0
    launch "$run" --launcher mpi -n 2 -s 1 python3 env.py >m3.out 2>m3.err || rc=$?
    el=$(secs "$t")
    why=$(check_mxnet m3.out 2 1)
    [ "$rc" = 0 ] || why="$why rc=$rc;"
    if [ -z "$why" ] && no_leftovers; then
        ok "mpi: -n 2 -s 1: [scheduler] [server 0] [worker 0] [worker 1] with DMLC_* ($el s)"
    else
        bad "mpi: dshim-run --launcher mpi -n 2 -s 1 python3 env.py:$why"
        show m3.out m3.err
    fi

    # 4a. Rank 2 exits 3: the job stops, dshim-run says who and exits 3.
    t=$(now)
    rc=0
    launch "$run" --launcher mpi --nproc-per-node 4 --master-port 0 fail.py 2 >m4.out 2>m4.err || rc=$?
    el=$(secs "$t")
    if [ "$rc" = 3 ] && lt "$el" 10 && grep -qE 'rank 2 .*exited with code 3' m4.err && marked m4.out && no_leftovers; then
        ok "mpi: rank 2 exits 3 -> rc=3 after $el s: $(grep -E 'rank 2 .*code 3' m4.err | head -n 1)"
    else
        bad "mpi: dshim-run --launcher mpi --nproc-per-node 4 fail.py 2: rc=$rc (want 3) after $el s (want < 10), line naming rank 2 and code 3"
        show m4.out m4.err
    fi

    # 4b. SIGINT to dshim-run: 130, nothing left.
    launch "$run" --launcher mpi --nproc-per-node 4 --master-port 0 fail.py -1 >m5.out 2>m5.err &
    tp=$!
    rc=0
    if wait_lines m5.out '\] started ' 4 20; then
        dp=$(find_exe "$tp" "$(readlink -f "$run")")
        t=$(now)
        if [ -n "$dp" ]; then
            kill -INT "$dp" 2>/dev/null || true
        fi
        wait "$tp" || rc=$?
        el=$(secs "$t")
    else
        wait "$tp" || rc=$?
        el="(never started)"
    fi
    if [ "$rc" = 130 ] && lt "$el" 10 && grep -q 'received SIGINT' m5.err && marked m5.out && no_leftovers; then
        ok "mpi: SIGINT to dshim-run -> rc=130 after $el s, nothing left"
    else
        bad "mpi: SIGINT to dshim-run --launcher mpi --nproc-per-node 4 fail.py -1: rc=$rc (want 130) after $el s"
        show m5.out m5.err
    fi

    # 4c. SIGKILL of rank 1: 137, nothing left.
    launch "$run" --launcher mpi --nproc-per-node 4 --master-port 0 fail.py -1 >m6.out 2>m6.err &
    tp=$!
    rc=0
    if wait_lines m6.out '\] started ' 4 20; then
        rp=$(awk '$3 == "started" && $4 == 1 { print $5 }' m6.out)
        t=$(now)
        if [ -n "$rp" ]; then
            kill -KILL "$rp" 2>/dev/null || true
        fi
        wait "$tp" || rc=$?
        el=$(secs "$t")
    else
        wait "$tp" || rc=$?
        el="(never started)"
    fi
    if [ "$rc" = 137 ] && lt "$el" 10 && grep -qE 'rank 1 .*SIGKILL' m6.err && marked m6.out && no_leftovers; then
        ok "mpi: SIGKILL of rank 1 -> rc=137 after $el s: $(grep -E 'rank 1 .*SIGKILL' m6.err | head -n 1)"
    else
        bad "mpi: SIGKILL of rank 1 under dshim-run --launcher mpi --nproc-per-node 4: rc=$rc (want 137) after $el s"
        show m6.out m6.err
    fi
else
    echo "note: --launcher mpi cases skipped: $mpi_why"
fi

# =============================================================== Slurm
# 10. Outside an allocation: exit 2, one line (needs no cluster).
rc=0
env -u SLURM_JOB_ID DSHIM_TEST_MARKER="$MARK" timeout -k 5 20 \
    "$run" --launcher slurm --nproc-per-node 2 env.py >s10.out 2>s10.err || rc=$?
if [ "$rc" = 2 ] && [ ! -s s10.out ] && [ "$(wc -l < s10.err)" = 1 ] && no_leftovers; then
    ok "slurm: outside an allocation -> rc=2: $(cat s10.err)"
else
    bad "slurm: dshim-run --launcher slurm --nproc-per-node 2 env.py without SLURM_JOB_ID: rc=$rc (want 2), want one line on stderr and nothing on stdout"
    show s10.out s10.err
fi

if [ $have_slurm = 1 ]; then
    t=$(now)
    slurm_up 2 8
    echo "== --launcher slurm (private cluster: $(timeout 10 sinfo -h -o '%D nodes %N'), up in $(secs "$t") s)"

    # in_alloc.sh CMD...: what dshim-run's user types inside salloc, plus a
    # record of its exit code, its duration and the job's steps right after.
    cat > in_alloc.sh <<'EOF'
#!/bin/bash
s=$EPOCHREALTIME
rc=0
"$@" || rc=$?
e=$EPOCHREALTIME
echo "$rc $s $e" > alloc.stamp
# slurmctld drops a finished step asynchronously (it may be listed for a moment after srun
# exits): the steps still listed after up to 3 s
for _ in $(seq 30); do
    timeout 10 squeue -h -s -j "$SLURM_JOB_ID" -o '%i %j' > alloc.steps 2>&1 || true
    [ -s alloc.steps ] || break
    sleep 0.1
done
exit $rc
EOF
    chmod +x in_alloc.sh
    # stamp_rc / stamp_secs: from the last in_alloc.sh run.
    stamp_rc() { awk '{ print $1 }' alloc.stamp 2>/dev/null; }
    stamp_secs() { awk '{ printf "%.2f", $3 - $2 }' alloc.stamp 2>/dev/null; }

    # 5. Inside salloc -N2: 4 ranks, 2 per node in blocks.
    t=$(now)
    rc=0
    rm -f alloc.stamp
    launch salloc -N2 --ntasks-per-node=2 ./in_alloc.sh "$run" --launcher slurm --nnodes 2 --nproc-per-node 2 \
        --master-addr 127.0.0.1 --master-port 0 env.py >s5.out 2>s5.err || rc=$?
    el=$(secs "$t")
    why=$(check_torch s5.out 4 2 127.0.0.1 n1 n1 n2 n2)
    [ "$rc" = 0 ] || why="$why rc=$rc;"
    if [ -z "$why" ] && no_leftovers; then
        ok "slurm: salloc -N2 --ntasks-per-node=2: ranks 0,1 on n1 and 2,3 on n2, LOCAL_RANK 0,1, torchrun env (dshim-run $(stamp_secs) s, salloc $el s)"
    else
        bad "slurm: salloc -N2 --ntasks-per-node=2 dshim-run --launcher slurm --nnodes 2 --nproc-per-node 2 --master-addr 127.0.0.1 --master-port 0 env.py:$why"
        show s5.out s5.err
    fi

    # 6. A real dshim job under srun, across both nodes.
    t=$(now)
    rc=0
    launch salloc -N2 --ntasks-per-node=2 "$run" --launcher slurm --nnodes 2 --nproc-per-node 2 \
        --master-addr 127.0.0.1 --no-python "$bench" -b 64K -e 1M -t 0.3 >s6.out 2>s6.err || rc=$?
    el=$(secs "$t")
    if [ "$rc" = 0 ] && [ "$(grep -cE '^\[rank 0\] .* ok$' s6.out)" = 3 ] && grep -q '4 ranks' s6.out && no_leftovers; then
        ok "slurm: dshim-bench -b 64K -e 1M over 4 ranks on n1+n2: rc=0, 3 ok lines ($el s)"
    else
        bad "slurm: salloc -N2 --ntasks-per-node=2 dshim-run --launcher slurm --nnodes 2 --nproc-per-node 2 --master-addr 127.0.0.1 --no-python dshim-bench -b 64K -e 1M -t 0.3: rc=$rc"
        show s6.out s6.err
    fi

    # 7. Rank 1 (on n1) exits 3 under srun.
    t=$(now)
    rc=0
    rm -f alloc.stamp alloc.steps
    launch salloc -N2 --ntasks-per-node=2 ./in_alloc.sh "$run" --launcher slurm --nnodes 2 --nproc-per-node 2 \
        --master-addr 127.0.0.1 --master-port 0 fail.py 1 >s7.out 2>s7.err || rc=$?
    el=$(secs "$t")
    drc=$(stamp_rc)
    del=$(stamp_secs)
    steps=$(cat alloc.steps 2>/dev/null || echo "(no record)")
    why=""
    [ "$drc" = 3 ] || why="$why dshim-run rc=$drc (want 3);"
    [ "$rc" = 3 ] || why="$why salloc rc=$rc (want 3);"
    [ -n "$del" ] && lt "$del" 10 || why="$why took ${del:-?} s (want < 10);"
    grep -qE 'rank 1 on host n1 .*exited with code 3' s7.err || why="$why no line naming rank 1, host n1 and code 3;"
    [ -z "$steps" ] || why="$why steps still listed by squeue after dshim-run returned: $steps;"
    marked s7.out || why="$why the ranks did not get DSHIM_TEST_MARKER;"
    if [ -z "$why" ] && no_leftovers; then
        ok "slurm: rank 1 exits 3 -> rc=3 after $del s, no step left: $(grep -E 'rank 1 on host' s7.err | head -n 1)"
    else
        bad "slurm: salloc -N2 --ntasks-per-node=2 dshim-run --launcher slurm --nnodes 2 --nproc-per-node 2 --master-addr 127.0.0.1 fail.py 1:$why"
        show s7.out s7.err
    fi

    # 8. sbatch: the batch script users write (docs/launcher.md).  The nodes
    #    of this test cluster all resolve to 127.0.0.1, hence --master-addr.
    cat > job.sh <<EOF
#!/bin/bash
#SBATCH --job-name=dshim-job
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --output=job.out
# dshim-run runs in the batch step (on the first node) and starts the
# ranks with srun inside this allocation.
$run --launcher slurm --nnodes "\$SLURM_NNODES" --nproc-per-node "\$SLURM_NTASKS_PER_NODE" \\
    --master-addr 127.0.0.1 --master-port 0 env.py "a b"
EOF
    t=$(now)
    rc=0
    id=$(launch sbatch --parsable --chdir="$work" job.sh 2>s8.err) && slurm_wait_job "$id" 60 || rc=$?
    el=$(secs "$t")
    grep '^\[rank ' job.out > s8.ranks 2>/dev/null || true
    why=$(check_torch s8.ranks 4 2 127.0.0.1 n1 n1 n2 n2)
    [ "$rc" = 0 ] || why="$why job ${id:-?} rc=$rc;"
    [ "$(grep -cFx "ARGS ['a b']" <(sed 's/^\[rank [0-9]*\] //' job.out 2>/dev/null))" = 4 ] || why="$why arguments not intact;"
    if [ -z "$why" ] && no_leftovers; then
        ok "slurm: sbatch job $id (dshim-run --launcher slurm in the batch script): rc=0, job.out has [rank 0..3] ($el s)"
    else
        bad "slurm: sbatch --parsable job.sh (dshim-run --launcher slurm --nnodes \$SLURM_NNODES ...):$why"
        show job.sh s8.err job.out
    fi

    # 9. MXNet style: scheduler here, 1 server + 2 workers under srun.
    t=$(now)
    rc=0
    launch salloc -n3 "$run" --launcher slurm -n 2 -s 1 python3 env.py >s9.out 2>s9.err || rc=$?
    el=$(secs "$t")
    why=$(check_mxnet s9.out 2 1)
    [ "$rc" = 0 ] || why="$why rc=$rc;"
    if [ -z "$why" ] && no_leftovers; then
        ok "slurm: salloc -n3 dshim-run -n 2 -s 1: scheduler + server 0 + workers 0,1 with DMLC_* ($el s)"
    else
        bad "slurm: salloc -n3 dshim-run --launcher slurm -n 2 -s 1 python3 env.py:$why"
        show s9.out s9.err
    fi
else
    echo "note: Slurm cases skipped: $slurm_why"
fi

echo "test_mpi_slurm: $passed passed, $failed failed"
[ "$failed" = 0 ]

#!/usr/bin/env bash
# test_multihost.sh — dshim-run's ssh launcher on a fake 3-host cluster
# (lib/hosts.sh: network namespaces, one real sshd each; 10.x addresses that
# exist only inside them).  dshim-run always starts on host 0, whose own IP
# is then local; hosts 1 and 2 are reached over ssh.
#
# Cases: torchrun-style placement, environment and argument quoting;
# a real dshim job (dshim-bench) spanning the hosts over TCP; a hung one whose
# flight-recorder dumps come back from every host for the diagnosis; MXNet
# launch.py-style placement; a remote rank failing, SIGINT, a SIGKILLed worker
# and a SIGKILLed launcher, each leaving no process anywhere; an unreachable
# host; --sync-dst-dir with real rsync (and its failure); host:port lines and
# a host named twice; no run leaving its job directory ($TMPDIR/dshim-run.XXXXXX) behind.
#
# Every process of a case carries DSHIM_TEST_MARKER=<unique> in its
# environment (dshim-run forwards it); "nothing left on any host" means no
# live process with the marker in /proc/*/environ or cmdline, and no
# `dshim-run --agent` inside our namespaces (namespaces share the PID space).
#
# Needs root, ip netns, sshd, rsync, python3; skips (77) without the first
# three and for sanitizer builds (DSHIM_SANITIZE in the build's CMakeCache).  Env: DSHIM_BUILD_DIR (default: build/ of this checkout);
# MULTIHOST_KEEP=1 keeps every case's stdout/stderr in the temp dir.  The whole
# script is bounded to 360 s; each dshim-run call by `timeout`.
# shellcheck source-path=SCRIPTDIR disable=SC2153,SC2015  # HOSTS_* come from lib/hosts.sh; `a && b || fail` is meant
set -euo pipefail

if [ -z "${MULTIHOST_BOUNDED:-}" ]; then
    export MULTIHOST_BOUNDED=1
    exec timeout -k 5 360 bash "$0" "$@"
fi

here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib/hosts.sh"

build=${DSHIM_BUILD_DIR:-$here/../../build}
run=$(realpath -m "$build/bin/dshim-run")
bench=$(realpath -m "$build/bin/dshim-bench")

if ! why=$(hosts_available); then
    echo "SKIP: $why"
    exit 77
fi
# dshim-run preloads libdshim.so into every process; a sanitizer build's
# library cannot load into uninstrumented programs (python3, sleep, bash).
san=$(sed -n 's/^DSHIM_SANITIZE:STRING=//p' "$build/CMakeCache.txt" 2>/dev/null || true)
if [ -n "$san" ]; then
    echo "SKIP: $build is a DSHIM_SANITIZE=$san build, whose libdshim.so cannot be preloaded into python3/sleep; run against the normal build"
    exit 77
fi
for f in "$run" "$bench"; do
    if [ ! -x "$f" ]; then
        echo "test_multihost: $f not found; build first (make), or set DSHIM_BUILD_DIR" >&2
        exit 1
    fi
done
for prog in rsync python3; do
    if ! command -v "$prog" >/dev/null; then
        echo "test_multihost: $prog not found (install it: make setup)" >&2
        exit 1
    fi
done

uuid() { cat /proc/sys/kernel/random/uuid; }
now_ms() { local t=${EPOCHREALTIME/./}; echo $((t / 1000)); }

work=$(mktemp -d /tmp/test_multihost.XXXXXX)
chmod 755 "$work"
# dshim-run makes its job directory (dshim-run.XXXXXX, named by mkdtemp) in $TMPDIR and hands its
# name to every agent: here one only this test uses, so that case 9 can see what is left in it
export TMPDIR=$work/tmp
mkdir -m 700 "$TMPDIR"
extra_dirs=()   # sync destinations (outside $work, as a user's would be)
bg_tpid=""      # `timeout` wrapping a background dshim-run
bg_name=""      # its case's output name
runs=()         # "PID NAME" of every dshim-run started
marker=""       # the current case's marker

# ------------------------------------------------------------ processes
# `dshim-run --agent` processes inside our namespaces (remote agents do not
# show the marker: /proc/PID/environ is their environment at exec).
agent_pids() {
    local ns p
    local -a argv
    for ns in ${HOSTS_NS:-}; do
        for p in $(ip netns pids "$ns" 2>/dev/null); do
            mapfile -d '' argv 2>/dev/null <"/proc/$p/cmdline" || continue
            if [[ ${argv[0]:-} == *dshim-run && ${argv[1]:-} == --agent* ]]; then
                echo "$p"
            fi
        done
    done
}

# PIDs of live processes of marker $1 (environ or argv) plus any dshim-run
# agent in our namespaces.  The pattern's first letter is bracketed so grep's
# own argv does not match it.
job_pids() {
    local m=$1 p
    {
        grep -lsaE -- "[${m:0:1}]${m:1}" /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null |
            sed -E 's#^/proc/([0-9]+)/.*#\1#' || true
        agent_pids
    } | sort -un | while read -r p; do
        [ "$p" != "$$" ] && [ "$p" != "$BASHPID" ] && _hosts_alive "$p" && echo "$p"
    done
}

describe_pids() {
    local p
    for p in "$@"; do
        echo "    pid $p: $(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | cut -c1-150)"
    done
}

# wait_gone MARKER DEADLINE_MS — 0 once nothing of the job is left, else lists what is.
wait_gone() {
    local left
    while :; do
        left=$(job_pids "$1" | tr '\n' ' ')
        [ -z "$left" ] && return 0
        [ "$(now_ms)" -ge "$2" ] && break
        sleep 0.1
    done
    echo "  processes of the job still alive:"
    # shellcheck disable=SC2086
    describe_pids $left
    return 1
}

kill_marker() {
    local p
    [ -n "$1" ] || return 0
    for p in $(job_pids "$1"); do
        kill -KILL "$p" 2>/dev/null || true
    done
}

stop_bg() {
    local pid
    if [ -n "$bg_tpid" ]; then
        # dshim-run first (timeout and the subshell then end), as a case that gave up would
        pid=$(cat "$work/$bg_name.pid" 2>/dev/null || true)
        [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null
        kill -KILL "$bg_tpid" 2>/dev/null || true
        wait "$bg_tpid" 2>/dev/null || true
        bg_tpid=""
        note_run
    fi
}

cleanup() {
    local d
    stop_bg
    kill_marker "$marker"
    hosts_down
    for d in "${extra_dirs[@]}"; do
        rm -rf "$d"
    done
    if [ -n "${MULTIHOST_KEEP:-}" ]; then
        echo "test_multihost: outputs kept in $work (MULTIHOST_KEEP)"
    else
        rm -rf "$work"
    fi
}
trap cleanup EXIT
trap 'exit 143' TERM INT HUP

# ------------------------------------------------------------ launching
# start NAME DIR LIMIT_S [VAR=VAL...] -- ARGS... : dshim-run on host 0 in DIR,
# in the background, bounded by timeout; output in $work/NAME.{out,err}.
# $bg_tpid is a subshell that waits for timeout and exits with its status
# (not exec'ed, and its own stderr silenced: a job dying of SIGKILL would make
# bash print "Killed").  The
# bash under timeout writes its PID to $work/NAME.pid and execs env, which
# execs dshim-run: that is dshim-run's PID.
start() {
    local name=$1 dir=$2 limit=$3
    local -a envs=()
    shift 3
    while [ "$1" != -- ]; do envs+=("$1"); shift; done
    shift
    rm -f "$work/$name.pid"
    (
        cd "$dir" || exit 1
        # shellcheck disable=SC2016  # expanded by that bash
        ip netns exec "${HOSTS_NS%% *}" timeout -k 5 "$limit" \
            bash -c 'echo $$ >"$0"; exec "$@"' "$work/$name.pid" \
            env DSHIM_TEST_MARKER="$marker" DSHIM_RUN_SSH="$HOSTS_SSH" "${envs[@]}" "$run" "$@" \
            </dev/null >"$work/$name.out" 2>"$work/$name.err"
        status=$?
        exit $status
    ) 2>/dev/null &
    bg_tpid=$!
    bg_name=$name
}

# PID of the dshim-run that `start` started last (waits for it to be written).
bg_launcher_pid() {
    local n pid=""
    for ((n = 0; n < 50; n++)); do
        pid=$(cat "$work/$bg_name.pid" 2>/dev/null || true)
        if [ -n "$pid" ]; then
            echo "$pid"
            return 0
        fi
        sleep 0.1
    done
    return 1
}

# Remembers which dshim-run ran for which case (for the /tmp check at the end).
note_run() {
    local pid
    pid=$(cat "$work/$bg_name.pid" 2>/dev/null || true)
    [ -n "$pid" ] && runs+=("$pid $bg_name")
    return 0
}

# fg_run NAME DIR LIMIT_S [VAR=VAL...] -- ARGS... : start and wait; sets rc and took_ms.
fg_run() {
    local t0
    t0=$(now_ms)
    start "$@"
    rc=0
    wait "$bg_tpid" || rc=$?
    bg_tpid=""
    took_ms=$(($(now_ms) - t0))
    note_run
}

# bg_run NAME ARGS... : dshim-run on host 0 in $work, in the background, bounded to 60 s.
bg_run() {
    local name=$1
    shift
    start "$name" "$work" 60 -- "$@"
}

# bg_wait DEADLINE_MS — sets rc once the background dshim-run ended; 1 if it
# still runs at the deadline.
bg_wait() {
    while _hosts_alive "$bg_tpid" && [ "$(now_ms)" -lt "$1" ]; do
        sleep 0.05
    done
    if _hosts_alive "$bg_tpid"; then
        return 1
    fi
    rc=0
    wait "$bg_tpid" || rc=$?
    bg_tpid=""
    note_run
    return 0
}

# wait_files PATTERN COUNT LIMIT_S — until COUNT files match (the shared
# filesystem lets every host's processes report here).
wait_files() {
    local n deadline=$(($(now_ms) + $3 * 1000))
    while :; do
        n=$(compgen -G "$1" | wc -l)
        [ "$n" -ge "$2" ] && return 0
        [ "$(now_ms)" -ge "$deadline" ] && break
        sleep 0.05
    done
    echo "  only $n of $2 processes started within $3 s"
    return 1
}

show_output() {
    echo "  --- stdout ($1):"
    sed 's/^/    /' "$work/$1.out" | tail -n 20
    echo "  --- stderr ($1):"
    sed 's/^/    /' "$work/$1.err" | tail -n 20
}

# ------------------------------------------------------------ payloads
# show.py: one line with what a process sees (environment, host, cwd, argv).
cat >"$work/show.py" <<'EOF'
import json, os, subprocess, sys
keys = ["RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "DMLC_ROLE",
        "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "DMLC_NUM_SERVER", "DMLC_NUM_WORKER", "DMLC_NODE_HOST"]
ips = subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split()
data = open("data.txt").read().strip() if os.path.exists("data.txt") else "-"
words = ["%s=%s" % (k, os.environ.get(k, "-")) for k in keys]
words += ["IPS=," + ",".join(ips) + ",", "CWD=" + os.getcwd(), "DATA=" + data, "ARGS=" + json.dumps(sys.argv[1:])]
print("SHOW " + " ".join(words), flush=True)
EOF

# job.sh DIR MODE: reports its start in DIR, then sleeps (or fails, per MODE).
cat >"$work/job.sh" <<'EOF'
#!/bin/bash
dir=$1
echo "$$" >"$dir/started.${RANK:-x}.$$"
if [ "$2" = fail5 ]; then
    if [ "$RANK" = 5 ]; then
        # fail only once all six ranks run
        for ((n = 0; n < 200; n++)); do
            [ "$(ls "$dir" | grep -c '^started\.')" -ge 6 ] && break
            sleep 0.05
        done
        echo "${EPOCHREALTIME/./}" >"$dir/failed_at"
        exit 3
    fi
    # rank 3 (host 1) ignores SIGTERM: the remote stop must escalate to SIGKILL
    [ "$RANK" = 3 ] && trap '' TERM
fi
exec sleep 100
EOF
chmod +x "$work/job.sh"

# nccl_job.py DIR: the NCCL API of the preloaded libdshim.so through ctypes on host
# buffers (no torch on the hosts' python3); rank 0's unique id goes to the others in a
# file; STEPS ncclAllReduce calls, of which SKIP_RANK skips the last (it sleeps).
cat >"$work/nccl_job.py" <<'EOF'
import ctypes, os, sys, time
d = sys.argv[1]
lib = ctypes.CDLL(None)
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]
uid = UniqueId()
path = os.path.join(d, "nccl-id")
if rank == 0:
    assert lib.ncclGetUniqueId(ctypes.byref(uid)) == 0
    open(path + ".tmp", "wb").write(ctypes.string_at(ctypes.byref(uid), 128))
    os.rename(path + ".tmp", path)
else:
    while not os.path.exists(path):
        time.sleep(0.02)
    ctypes.memmove(ctypes.byref(uid), open(path, "rb").read(), 128)
comm = ctypes.c_void_p()
lib.ncclCommInitRank.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, UniqueId, ctypes.c_int]
assert lib.ncclCommInitRank(ctypes.byref(comm), world, uid, rank) == 0
lib.ncclAllReduce.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                              ctypes.c_void_p, ctypes.c_void_p]
buf = (ctypes.c_float * 1024)(*([1.0] * 1024))
steps, skip = int(os.environ.get("STEPS", "3")), int(os.environ.get("SKIP_RANK", "-1"))
for step in range(steps + 1):
    if step == steps and rank == skip:
        time.sleep(60)
    if lib.ncclAllReduce(buf, buf, 1024, 7, 0, comm, None) != 0:  # ncclFloat32, ncclSum
        sys.exit(1)
EOF

# field LINE KEY — value of KEY=... in a SHOW line.
field() {
    local w
    local -a words
    read -r -a words <<<"$1"   # no globbing: argv may hold a '*'
    for w in "${words[@]}"; do
        if [[ $w == "$2="* ]]; then
            echo "${w#*=}"
            return 0
        fi
    done
    echo "?"
}

pass=0
failed=0
timings=()
# check NAME FUNC — one case: fresh marker, timed, leftovers killed afterwards.
check() {
    local name=$1 t0 ms
    shift
    marker="mh$$-$(uuid)"
    t0=$(now_ms)
    if "$@"; then
        pass=$((pass + 1))
        ms=$(($(now_ms) - t0))
        echo "ok: $name ($((ms / 1000)).$(printf '%03d' $((ms % 1000))) s)"
    else
        failed=$((failed + 1))
        ms=$(($(now_ms) - t0))
        echo "FAIL: $name ($((ms / 1000)).$(printf '%03d' $((ms % 1000))) s)"
    fi
    timings+=("$(printf '%6d ms  %s' "$ms" "$name")")
    stop_bg
    kill_marker "$marker"
}

ips=()
hf="$work/hf"

# ------------------------------------------------------------ cases
# 1. torchrun style: placement, environment, arguments that must not be parsed by any shell.
t_torch() {
    local pwn want line r g ipsw n=0 seen=""
    pwn="/tmp/pwned-$(uuid)"
    local -a args=("a b" "it's" 'say "hi"' "\$(touch $pwn-dollar)" "\`touch $pwn-tick\`" "x;touch $pwn-semi"
        "*" "" "tab	here")
    want=$(python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "${args[@]}")
    fg_run torch "$work" 30 -- -H "$hf" --nproc-per-node 2 show.py "${args[@]}"
    [ "$rc" = 0 ] || { echo "  exit code $rc, expected 0"; show_output torch; return 1; }
    while read -r line; do
        [[ $line == "[rank "*"] SHOW "* ]] || continue
        n=$((n + 1))
        r=$(field "$line" RANK)
        g=$(field "$line" GROUP_RANK)
        ipsw=$(field "$line" IPS)
        [[ $line == "[rank $r] "* ]] || { echo "  prefix does not match RANK=$r: $line"; return 1; }
        [ "$g" = $((r / 2)) ] && [ "$(field "$line" LOCAL_RANK)" = $((r % 2)) ] ||
            { echo "  rank $r: GROUP_RANK/LOCAL_RANK wrong: $line"; return 1; }
        [ "$(field "$line" WORLD_SIZE)" = 6 ] || { echo "  rank $r: WORLD_SIZE wrong: $line"; return 1; }
        [[ $ipsw == *",${ips[$g]},"* ]] ||
            { echo "  rank $r (GROUP_RANK $g) ran on $ipsw, not on host $g (${ips[$g]})"; return 1; }
        [ "$(field "$line" MASTER_ADDR)" = "${ips[0]}" ] ||
            { echo "  rank $r: MASTER_ADDR=$(field "$line" MASTER_ADDR), expected host 0's ${ips[0]}"; return 1; }
        [ "${line#*ARGS=}" = "$want" ] || { echo "  rank $r: argv arrived as ${line#*ARGS=}, sent $want"; return 1; }
        seen="$seen $r"
    done <"$work/torch.out"
    [ "$n" = 6 ] || { echo "  $n SHOW lines (ranks:$seen), expected 6"; show_output torch; return 1; }
    [ "$(tr ' ' '\n' <<<"$seen" | sort -n | tr '\n' ' ')" = " 0 1 2 3 4 5 " ] ||
        { echo "  ranks seen:$seen"; return 1; }
    if compgen -G "$pwn*" >/dev/null; then
        echo "  an argument was run by a shell: $(ls "$pwn"*)"
        rm -f "$pwn"*
        return 1
    fi
}

# 2. a real dshim job across the hosts: 6 ranks of dshim-bench, rendezvous and data over TCP.
t_bench() {
    local name=$1
    shift
    fg_run "$name" "$work" 90 "$@" -- -H "$hf" --nproc-per-node 2 --no-python "$bench" -b 1M -e 1M -t 0.5
    [ "$rc" = 0 ] || { echo "  exit code $rc, expected 0"; show_output "$name"; return 1; }
    grep -qE '^\[rank 0\] +[0-9]+ .* ok$' "$work/$name.out" ||
        { echo "  no result line of rank 0 ending in 'ok'"; show_output "$name"; return 1; }
    grep -qE '^\[rank 0\] # dshim-bench .*6 ranks.*tcp' "$work/$name.out" ||
        { echo "  rank 0's header does not say 6 ranks over tcp"; show_output "$name"; return 1; }
    echo "  $(grep -E '^\[rank 0\] # dshim-bench' "$work/$name.out")"
    echo "  $(grep -E '^\[rank 0\] +[0-9]+ ' "$work/$name.out")"
}

# 2c. a hung job across the hosts (rank 3, host 1's first, skips its last ncclAllReduce;
# DSHIM_TIMEOUT=3): the flight-recorder dumps of all three hosts come back over the ssh
# lifelines, and the diagnosis names rank 3 and the allreduce the others wait in.
t_diagnose() {
    local d="$work/c2c" dir n ok=0
    mkdir -p "$d"
    fg_run hang "$work" 60 DSHIM_TIMEOUT=3 SKIP_RANK=3 STEPS=3 -- -H "$hf" --nproc-per-node 2 "$work/nccl_job.py" "$d"
    [ "$rc" = 1 ] || { echo "  exit code $rc, expected 1"; show_output hang; return 1; }
    grep -qE '^dshim-run:   ranks 0-2,4,5 wait in allreduce #3 \(float32 × 1,024(, from ncclAllReduce)?\) for rank 3\b' \
        "$work/hang.err" || { echo "  no diagnosis line: ranks 0-2,4,5 wait in allreduce #3 for rank 3"; ok=1; }
    grep -qE '^dshim-run:   rank 3 \(host [^,]+, pid [0-9]+\) has not called any collective for .* \(last: allreduce #2 done\)$' \
        "$work/hang.err" || { echo "  no diagnosis line: rank 3 has not called any collective"; ok=1; }
    dir=$(sed -n 's/^dshim-run: diagnosis from the flight recorder (dumps in \([^;]*\);.*/\1/p' "$work/hang.err")
    n=$(ls "$dir"/dshim-trace.*.jsonl 2>/dev/null | wc -l)
    [ "$n" = 6 ] || { echo "  $n dumps in '$dir', expected 6 (2 per host)"; ok=1; }
    [ "$ok" = 0 ] || show_output hang
    grep -E '^dshim-run:   ' "$work/hang.err" | sed 's/^/  /'
    return $ok
}

# 3. MXNet launch.py style: scheduler here, servers then workers round-robin over the hosts.
t_mxnet() {
    local line name role ipsw port="" want_host i n=0
    local -a expect=("server 0" "server 1" "worker 0" "worker 1")
    fg_run mxnet "$work" 30 -- -n 2 -s 2 -H "$hf" python3 show.py
    [ "$rc" = 0 ] || { echo "  exit code $rc, expected 0"; show_output mxnet; return 1; }
    line=$(grep -E '^\[scheduler\] SHOW ' "$work/mxnet.out" || true)
    [ -n "$line" ] || { echo "  no output of the scheduler"; show_output mxnet; return 1; }
    [[ $(field "$line" IPS) == *",${ips[0]},"* ]] ||
        { echo "  scheduler ran on $(field "$line" IPS), not on host 0 (${ips[0]})"; return 1; }
    [ "$(field "$line" DMLC_ROLE)" = scheduler ] || { echo "  scheduler: $line"; return 1; }
    for ((i = 0; i < 5; i++)); do
        if [ "$i" = 0 ]; then
            name=scheduler
            want_host=${ips[0]}
        else
            name=${expect[$((i - 1))]}
            want_host=${ips[$(((i - 1) % 3))]}
        fi
        line=$(grep -E "^\[$name\] SHOW " "$work/mxnet.out" || true)
        [ -n "$line" ] || { echo "  no output of $name"; show_output mxnet; return 1; }
        n=$((n + 1))
        role=${name% *}
        ipsw=$(field "$line" IPS)
        [ "$(field "$line" DMLC_ROLE)" = "$role" ] ||
            { echo "  $name: DMLC_ROLE=$(field "$line" DMLC_ROLE)"; return 1; }
        [[ $ipsw == *",$want_host,"* ]] || { echo "  $name ran on $ipsw, expected $want_host"; return 1; }
        [ "$(field "$line" DMLC_PS_ROOT_URI)" = "${ips[0]}" ] ||
            { echo "  $name: DMLC_PS_ROOT_URI=$(field "$line" DMLC_PS_ROOT_URI), expected ${ips[0]}"; return 1; }
        [ -n "$port" ] || port=$(field "$line" DMLC_PS_ROOT_PORT)
        [[ $port =~ ^[0-9]+$ ]] && [ "$(field "$line" DMLC_PS_ROOT_PORT)" = "$port" ] ||
            { echo "  $name: DMLC_PS_ROOT_PORT=$(field "$line" DMLC_PS_ROOT_PORT), others $port"; return 1; }
        [ "$(field "$line" DMLC_NUM_SERVER)" = 2 ] && [ "$(field "$line" DMLC_NUM_WORKER)" = 2 ] ||
            { echo "  $name: DMLC_NUM_SERVER/WORKER wrong: $line"; return 1; }
        if [ "$i" != 0 ]; then
            [ "$(field "$line" DMLC_NODE_HOST)" = "$want_host" ] ||
                { echo "  $name: DMLC_NODE_HOST=$(field "$line" DMLC_NODE_HOST), expected $want_host"; return 1; }
        fi
    done
    [ "$(grep -c ' SHOW ' "$work/mxnet.out")" = 5 ] ||
        { echo "  expected 5 processes"; show_output mxnet; return 1; }
}

# 4. rank 5 (host 2) exits 3 while the others sleep: job stopped everywhere within 10 s.
t_remote_fail() {
    local d="$work/c4" failed_at t_end deadline ok=0
    mkdir -p "$d"
    bg_run fail -H "$hf" --nproc-per-node 2 --no-python "$work/job.sh" "$d" fail5
    wait_files "$d/failed_at" 1 20 || { show_output fail; return 1; }
    failed_at=$(($(cat "$d/failed_at") / 1000))
    deadline=$((failed_at + 10000))
    bg_wait "$deadline" || { echo "  dshim-run still running 10 s after rank 5 failed"; show_output fail; return 1; }
    t_end=$(now_ms)
    echo "  dshim-run exited $((t_end - failed_at)) ms after rank 5 failed"
    [ "$rc" = 3 ] || { echo "  exit code $rc, expected 3"; show_output fail; ok=1; }
    grep -E "rank 5\b" "$work/fail.err" | grep -F "${ips[2]}" | grep -q "exited with code 3" ||
        { echo "  no stderr line naming rank 5, host ${ips[2]} and 'exited with code 3'"; show_output fail; ok=1; }
    wait_gone "$marker" "$deadline" || ok=1
    return $ok
}

# 5a. SIGINT to dshim-run while the job runs on 3 hosts.
t_sigint() {
    local d="$work/c5a" pid t0 n ok=0
    mkdir -p "$d"
    bg_run sigint -H "$hf" --nproc-per-node 2 --no-python "$work/job.sh" "$d" sleep
    wait_files "$d/started.*" 6 20 || { show_output sigint; return 1; }
    pid=$(bg_launcher_pid) || { echo "  cannot find dshim-run's pid"; return 1; }
    [ "$(readlink "/proc/$pid/exe")" = "$run" ] || { echo "  pid $pid is not $run"; ok=1; }
    # the scan that later says "nothing left" must see the running job: 3
    # agents, 6 ranks, 2 ssh clients, dshim-run and timeout
    n=$(agent_pids | wc -l)
    [ "$n" = 3 ] || { echo "  the scan sees $n agents, expected 3"; ok=1; }
    n=$(job_pids "$marker" | wc -l)
    [ "$n" -ge 13 ] || { echo "  the scan sees $n processes of the job, expected >= 13"; ok=1; }
    t0=$(now_ms)
    kill -INT "$pid"
    bg_wait $((t0 + 10000)) || { echo "  dshim-run still running 10 s after SIGINT"; show_output sigint; return 1; }
    echo "  dshim-run exited $(($(now_ms) - t0)) ms after SIGINT"
    [ "$rc" = 130 ] || { echo "  exit code $rc, expected 130"; show_output sigint; ok=1; }
    wait_gone "$marker" $((t0 + 10000)) || ok=1
    return $ok
}

# 5b. a worker on host 1 SIGKILLed from outside.
t_worker_sigkill() {
    local d="$work/c5b" victim p t0 ok=0
    mkdir -p "$d"
    bg_run wkill -H "$hf" --nproc-per-node 2 --no-python "$work/job.sh" "$d" sleep
    wait_files "$d/started.*" 6 20 || { show_output wkill; return 1; }
    # rank 2 = host 1's first process (job.sh exec'ed sleep: one process with RANK=2)
    victim=""
    for p in $(job_pids "$marker"); do
        if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "RANK=2"; then
            victim=$p
        fi
    done
    [ -n "$victim" ] || { echo "  no process with RANK=2 found"; return 1; }
    [ -e "$d/started.2.$victim" ] || { echo "  pid $victim is not rank 2's job.sh"; return 1; }
    t0=$(now_ms)
    kill -KILL "$victim"
    bg_wait $((t0 + 10000)) || { echo "  dshim-run still running 10 s after the kill"; show_output wkill; return 1; }
    echo "  dshim-run exited $(($(now_ms) - t0)) ms after rank 2 was killed"
    [ "$rc" = 137 ] || { echo "  exit code $rc, expected 137"; show_output wkill; ok=1; }
    grep -E "rank 2\b" "$work/wkill.err" | grep -F "${ips[1]}" | grep -q "SIGKILL" ||
        { echo "  no stderr line naming rank 2, host ${ips[1]} and SIGKILL"; show_output wkill; ok=1; }
    wait_gone "$marker" $((t0 + 10000)) || ok=1
    return $ok
}

# 5c. SIGKILL to dshim-run itself: the ssh lifelines close, the agents stop everything.
t_launcher_sigkill() {
    local d="$work/c5c" pid t0 ok=0
    mkdir -p "$d"
    bg_run lkill -H "$hf" --nproc-per-node 2 --no-python "$work/job.sh" "$d" sleep
    wait_files "$d/started.*" 6 20 || { show_output lkill; return 1; }
    pid=$(bg_launcher_pid) || { echo "  cannot find dshim-run's pid"; return 1; }
    t0=$(now_ms)
    kill -KILL "$pid"
    bg_wait $((t0 + 5000)) || { echo "  timeout(1) still waiting 5 s after dshim-run was killed"; ok=1; }
    [ "$rc" = 137 ] || { echo "  timeout(1) says $rc, expected 137 (SIGKILL)"; ok=1; }
    wait_gone "$marker" $((t0 + 10000)) || ok=1
    echo "  everything gone $(($(now_ms) - t0)) ms after SIGKILL"
    return $ok
}

# 6. a hostfile entry that no host answers: exit 2, one line naming it, nothing left.
t_unreachable() {
    local d="$work/c6" bad hf6="$work/hf6" lines ok=0
    mkdir -p "$d"
    bad="${ips[0]%.*}.99"
    cp "$hf" "$hf6"
    echo "$bad" >>"$hf6"
    fg_run unreach "$work" 40 -- -H "$hf6" --nproc-per-node 1 --no-python "$work/job.sh" "$d" sleep
    echo "  dshim-run took $took_ms ms"
    [ "$rc" = 2 ] || { echo "  exit code $rc, expected 2"; ok=1; }
    [ "$took_ms" -le 22000 ] || { echo "  took more than ~20 s"; ok=1; }
    lines=$(grep -F "$bad" "$work/unreach.err" | grep -ciE "cannot reach|cannot be reached|unreachable|not reachable" || true)
    [ "$lines" = 1 ] ||
        { echo "  $lines stderr lines name $bad and say it cannot be reached (expected 1)"; ok=1; }
    [ "$ok" = 0 ] || show_output unreach
    wait_gone "$marker" $(($(now_ms) + 2000)) || ok=1
    return $ok
}

# 7a. --sync-dst-dir: the directory reaches every host (rsync over ssh) and the job runs there.
accepted() { grep -c "Accepted publickey" "$HOSTS_DIR/h$1.log" || true; }
t_sync() {
    local src="$work/src7" base dst line r g n=0 data
    base="/tmp/mh-sync-$$-$(uuid)"
    local -a before=()
    dst="$base/dst"
    extra_dirs+=("$base")
    data="payload-$(uuid)"
    mkdir -p "$src"
    cp "$work/show.py" "$src/script.py"
    echo "$data" >"$src/data.txt"
    before=("$(accepted 1)" "$(accepted 2)")
    fg_run sync "$src" 60 -- -H "$hf" --sync-dst-dir "$dst" --nproc-per-node 1 script.py
    rm -rf "$base"
    [ "$rc" = 0 ] || { echo "  exit code $rc, expected 0"; show_output sync; return 1; }
    while read -r line; do
        [[ $line == "[rank "*"] SHOW "* ]] || continue
        n=$((n + 1))
        r=$(field "$line" RANK)
        g=$(field "$line" GROUP_RANK)
        [[ $(field "$line" IPS) == *",${ips[$g]},"* ]] ||
            { echo "  rank $r ran on $(field "$line" IPS), not host $g"; return 1; }
        [ "$(field "$line" CWD)" = "$dst" ] || { echo "  rank $r ran in $(field "$line" CWD), not $dst"; return 1; }
        [ "$(field "$line" DATA)" = "$data" ] || { echo "  rank $r read data '$(field "$line" DATA)'"; return 1; }
    done <"$work/sync.out"
    [ "$n" = 3 ] || { echo "  $n processes reported, expected 3"; show_output sync; return 1; }
    # rsync and the agent each log in to hosts 1 and 2
    [ "$(accepted 1)" -ge $((before[0] + 2)) ] && [ "$(accepted 2)" -ge $((before[1] + 2)) ] ||
        { echo "  hosts 1 and 2 did not see an rsync and an agent login each"; return 1; }
}

# 7b. a destination that cannot be created: exit 2 naming the host and rsync's error; nothing started.
t_sync_fail() {
    local src="$work/src7" base d="$work/c7b" i line ok=0
    base="/tmp/mh-sync-$$-$(uuid)"
    extra_dirs+=("$base")
    mkdir -p "$base" "$d" "$src"
    : >"$base/blocker"
    fg_run syncfail "$src" 60 -- -H "$hf" --sync-dst-dir "$base/blocker/dst" --nproc-per-node 1 \
        --no-python "$work/job.sh" "$d" sleep
    rm -rf "$base"
    echo "  dshim-run took $took_ms ms"
    [ "$rc" = 2 ] || { echo "  exit code $rc, expected 2"; ok=1; }
    for i in 1 2; do
        line=$(grep -F "${ips[$i]}" "$work/syncfail.err" | grep -i rsync | head -n 1 || true)
        [ -n "$line" ] || { echo "  no stderr line names host $i (${ips[$i]}) and rsync"; ok=1; continue; }
        # rsync's own line, or (when rsync exits 11 having printed nothing, seen once in CI) the
        # meaning of its exit code
        [[ $line =~ [Nn]ot\ a\ directory|mkdir|No\ such\ file|error\ in\ file\ I/O ]] ||
            { echo "  host $i's line does not carry rsync's error: $line"; ok=1; }
    done
    ! compgen -G "$d/started.*" >/dev/null || { echo "  job processes were started"; ok=1; }
    [ "$ok" = 0 ] || show_output syncfail
    wait_gone "$marker" $(($(now_ms) + 2000)) || ok=1
    return $ok
}

# 8a. host:22 lines.
t_ports() {
    local hfp="$work/hf_ports" line r g n=0
    hosts_write_hostfile "$hfp" 22
    fg_run ports "$work" 30 -- -H "$hfp" --nproc-per-node 1 show.py
    [ "$rc" = 0 ] || { echo "  exit code $rc, expected 0"; show_output ports; return 1; }
    while read -r line; do
        [[ $line == "[rank "*"] SHOW "* ]] || continue
        n=$((n + 1))
        r=$(field "$line" RANK)
        g=$(field "$line" GROUP_RANK)
        [ "$g" = "$r" ] && [[ $(field "$line" IPS) == *",${ips[$g]},"* ]] ||
            { echo "  rank $r (GROUP_RANK $g) ran on $(field "$line" IPS)"; return 1; }
    done <"$work/ports.out"
    [ "$n" = 3 ] || { echo "  $n processes reported, expected 3"; show_output ports; return 1; }
}

# 8b. the same host twice, --nnodes 2: two nodes on it.
t_twice() {
    local hft="$work/hf_twice" line n=0 groups=""
    printf '%s\n%s\n' "${ips[1]}" "${ips[1]}" >"$hft"
    fg_run twice "$work" 30 -- -H "$hft" --nnodes 2 --nproc-per-node 1 show.py
    [ "$rc" = 0 ] || { echo "  exit code $rc, expected 0"; show_output twice; return 1; }
    while read -r line; do
        [[ $line == "[rank "*"] SHOW "* ]] || continue
        n=$((n + 1))
        [[ $(field "$line" IPS) == *",${ips[1]},"* ]] ||
            { echo "  rank $(field "$line" RANK) ran on $(field "$line" IPS), not host 1"; return 1; }
        [ "$(field "$line" WORLD_SIZE)" = 2 ] || { echo "  WORLD_SIZE wrong: $line"; return 1; }
        groups="$groups$(field "$line" GROUP_RANK)"
    done <"$work/twice.out"
    [ "$n" = 2 ] || { echo "  $n processes reported, expected 2"; show_output twice; return 1; }
    [ "$(grep -o . <<<"$groups" | sort | tr -d '\n')" = 01 ] ||
        { echo "  GROUP_RANKs seen: $groups, expected 0 and 1"; return 1; }
}

# 8c. per-node mode across two hosts with uneven nodes (issue 39): node 0 (host 0) runs 2 ranks, node 1
# (host 1, its own dshim-run) 1 rank; the launchers meet in node 0's store, the world is 3 and a real
# dshim-bench job runs across them (rendezvous and data over the hosts' network).
t_uneven() {
    local -a nss bargs=(--no-python "$bench" -b 1M -e 1M -t 0.5)
    local rc1=0
    read -r -a nss <<<"$HOSTS_NS"
    start uneven0 "$work" 60 -- --nnodes 2 --node-rank 0 --nproc-per-node 2 --master-addr "${ips[0]}" "${bargs[@]}"
    ip netns exec "${nss[1]}" timeout -k 5 60 env DSHIM_TEST_MARKER="$marker" "$run" --nnodes 2 --node-rank 1 \
        --nproc-per-node 1 --master-addr "${ips[0]}" "${bargs[@]}" </dev/null >"$work/uneven1.out" \
        2>"$work/uneven1.err" || rc1=$?
    bg_wait $(($(now_ms) + 60000)) || { echo "  node 0's dshim-run still runs"; show_output uneven0; return 1; }
    [ "$rc" = 0 ] && [ "$rc1" = 0 ] ||
        { echo "  exit codes node 0 $rc, node 1 $rc1"; show_output uneven0; show_output uneven1; return 1; }
    grep -qE '^\[rank 0\] # dshim-bench .*3 ranks' "$work/uneven0.out" ||
        { echo "  rank 0's header does not say 3 ranks"; show_output uneven0; return 1; }
    grep -qE '^\[rank 0\] +[0-9]+ .* ok$' "$work/uneven0.out" ||
        { echo "  no result line of rank 0 ending in 'ok'"; show_output uneven0; return 1; }
    # only rank 0 of dshim-bench prints; node 1's launcher says nothing but OMP's note
    ! grep -v OMP_NUM_THREADS "$work/uneven1.err" | grep -q . || { echo "  node 1 said:"; show_output uneven1; return 1; }
    echo "  $(grep -E '^\[rank 0\] # dshim-bench' "$work/uneven0.out")"
}

# 9. no run left its job directory ($TMPDIR/dshim-run.XXXXXX: TORCHELASTIC_ERROR_FILE's, the
# ranks' dumps) behind on any host (the hosts share this filesystem); the test removes what it finds.
t_tmp_left() {
    local left ok=0
    left=$(cd "$TMPDIR" && find . -mindepth 1 -maxdepth 1 -name 'dshim-run.*' | sort | tr '\n' ' ')
    if [ -n "$left" ]; then
        echo "  job directories left in $TMPDIR after ${#runs[@]} runs: $left"
        (cd "$TMPDIR" && find . -path './dshim-run.*' | head -20 | sed 's/^/    /')
        rm -rf "$TMPDIR"/dshim-run.*
        ok=1
    fi
    [ "${#runs[@]}" = 15 ] || { echo "  ${#runs[@]} runs recorded, expected 15"; ok=1; }
    return $ok
}

# ------------------------------------------------------------ main
t_up=$(now_ms)
if ! hosts_up 3; then
    echo "test_multihost: 0 passed, 1 failed (hosts_up failed)"
    exit 1
fi
read -r -a ips <<<"$HOSTS_IPS"
hosts_write_hostfile "$hf"
echo "hosts: $HOSTS_IPS (up in $(($(now_ms) - t_up)) ms)"

check "1 torchrun style on 3 hosts: placement, env, arguments intact" t_torch
check "2a dshim-bench across 3 hosts" t_bench bench
check "2b dshim-bench across 3 hosts, DSHIM_TRANSPORT=tcp" t_bench bench_tcp DSHIM_TRANSPORT=tcp
check "2c hung job across 3 hosts: every host's dumps, the diagnosis names rank 3" t_diagnose
check "3 MXNet launch.py style over ssh" t_mxnet
check "4 rank 5 on host 2 exits 3: job stopped everywhere" t_remote_fail
check "5a SIGINT to dshim-run: exit 130, nothing left" t_sigint
check "5b worker on host 1 SIGKILLed: exit 137, nothing left" t_worker_sigkill
check "5c dshim-run SIGKILLed: remote processes gone" t_launcher_sigkill
check "6 unreachable host: exit 2, one line, nothing left" t_unreachable
check "7a --sync-dst-dir: job runs in the synced dir on every host" t_sync
check "7b --sync-dst-dir that cannot be created: exit 2, nothing started" t_sync_fail
check "8a host:22 lines" t_ports
check "8b same host twice with --nnodes 2" t_twice
check "8c per-node, uneven: 2 ranks on host 0 + 1 on host 1 (own dshim-run each), world 3" t_uneven
check "9 no run left its job directory (\$TMPDIR/dshim-run.*) behind" t_tmp_left

echo "timings:"
printf '  %s\n' "${timings[@]}"
echo "test_multihost: $pass passed, $failed failed"
[ "$failed" = 0 ]

# shellcheck shell=bash
# slurm.sh — a private, real Slurm cluster on this one machine for launcher
# tests (source it; needs root, slurm-wlm and munge from Debian 12).
#
#   slurm_available           0 if slurm_up can work here, else prints why (1 line)
#   slurm_up [NODES] [CPUS]   start munged + slurmctld + NODES slurmds (default 1
#                             node, 8 CPUs each), wait until every node is idle
#   slurm_down                stop all of it, remove SLURM_TEST_DIR; idempotent,
#                             safe in an EXIT trap even after a failed slurm_up
#   slurm_wait_job ID [SECS]  wait (default 60 s) until job ID has ended; return
#                             its exit code (128+N if killed by signal N, 124 on
#                             timeout).  Quicker than `sbatch --wait`, which
#                             polls every 2 s growing to 10 s.
#
# After slurm_up these are exported:
#   SLURM_CONF        the cluster's slurm.conf: srun/salloc/sbatch/squeue/scancel
#                     find the cluster through it (and nothing else is needed)
#   SLURM_TEST_DIR    per-run temp dir: slurm.conf, munge key+socket, state,
#                     spool, logs (log/slurmctld.log, log/slurmd.nI.log, log/*.out)
#   SLURM_TEST_NODES  node count; node names are n1..nN (all on this machine)
#   SLURM_TEST_CPUS   CPUs per node as configured (more than the hardware has)
# slurm_up also unsets every other inherited SLURM_* variable so that a test run
# inside someone else's Slurm job does not talk to that job.
#
# Typical use:
#   source tests/launcher/lib/slurm.sh
#   trap slurm_down EXIT; trap 'exit 143' TERM INT
#   slurm_up 2
#   timeout 30 salloc -N2 -n4 dshim-run --launcher slurm ...
#
# How it fits on one machine (all verified with slurm-wlm 22.05.8, munge 0.5.15):
# - Debian's build has MULTIPLE_SLURMD=Yes, so NODES slurmds run side by side as
#   `slurmd -N nI`, all NodeHostname=localhost, each with its own Port=.
# - CPUs are configured, not detected: SlurmdParameters=config_overrides keeps
#   an 8-CPU node on a 2-core machine from being drained.
# - Auth is munge: a generated key and our own munged whose socket lives in the
#   temp dir (AuthInfo=socket=...; cred/munge uses the same socket).  munged
#   needs --force as root.
# - Ports: NODES+1 consecutive free ports below the kernel's ephemeral range,
#   chosen and bound while holding an flock on the slurmctld binary, so
#   concurrent runs never pick the same ones.
# - Leftovers: slurmstepd and job tasks are not children of the daemons we
#   start; slurm_down finds them by SLURM_CONF=$SLURM_TEST_DIR/slurm.conf in
#   their environment (or the dir in their argv) and kills them by PID.  A
#   watchdog (outside the test's process tree) runs the same cleanup if the
#   shell that called slurm_up dies without calling slurm_down (e.g. SIGKILL).

_SLURM_BIN_CTLD=${_SLURM_BIN_CTLD:-/usr/sbin/slurmctld}
_SLURM_BIN_SLURMD=${_SLURM_BIN_SLURMD:-/usr/sbin/slurmd}
_SLURM_BIN_MUNGED=${_SLURM_BIN_MUNGED:-/usr/sbin/munged}
_SLURM_DIR=""           # temp dir of the cluster we started (empty: none)
_SLURM_PIDS=()          # daemon PIDs, in start order
_SLURM_LOCKFD=""        # fd holding the port-picking lock while we hold it
_SLURM_WHY=""           # why the last _slurm_wait_for failed

_slurm_err() {
    echo "$*" >&2
}

# Usage: slurm_available — 0 when root and the daemons and clients exist;
# otherwise prints one line saying why and returns 1 (tests exit 77 on that).
slurm_available() {
    local b
    if [ "$(id -u)" != 0 ]; then
        echo "need root to run private slurmctld/slurmd/munged (run the test as root)"
        return 1
    fi
    for b in "$_SLURM_BIN_CTLD" "$_SLURM_BIN_SLURMD" "$_SLURM_BIN_MUNGED"; do
        if [ ! -x "$b" ]; then
            echo "$b not found: apt-get install slurm-wlm munge"
            return 1
        fi
    done
    for b in srun salloc sbatch sinfo squeue scancel scontrol munge mungekey ss flock setsid; do
        if ! command -v "$b" >/dev/null; then
            echo "$b not found: apt-get install slurm-wlm munge iproute2 util-linux"
            return 1
        fi
    done
    return 0
}

# _slurm_alive PID — true while PID exists and is not a zombie.
_slurm_alive() {
    local st
    [ -r "/proc/$1/stat" ] || return 1
    read -r st 2>/dev/null < "/proc/$1/stat" || return 1
    st=${st##*) }
    [ "${st%% *}" != Z ]
}

# _slurm_mine PID DIR — true if PID belongs to the cluster in DIR: DIR in its
# argv, or SLURM_CONF=DIR/slurm.conf in its environment.  Builtins only (no
# fork), so scanning all of /proc stays cheap and a grep never matches itself.
_slurm_mine() {
    local a
    local -a argv=() envv=()
    mapfile -d '' -t argv 2>/dev/null < "/proc/$1/cmdline" || return 1
    for a in "${argv[@]}"; do
        [[ $a == *"$2"* ]] && return 0
    done
    mapfile -d '' -t envv 2>/dev/null < "/proc/$1/environ" || return 1
    for a in "${envv[@]}"; do
        [ "$a" = "SLURM_CONF=$2/slurm.conf" ] && return 0
    done
    return 1
}

# _slurm_strays DIR — print PIDs of processes of the cluster in DIR, except
# this shell and its ancestors (a parent may have exported SLURM_CONF).
_slurm_strays() {
    local p pp me=$BASHPID
    local -A skip=()
    p=$me
    while [ -n "$p" ] && [ "$p" != 0 ]; do
        skip[$p]=1
        pp=""
        while read -r k v; do
            if [ "$k" = PPid: ]; then pp=$v; break; fi
        done 2>/dev/null < "/proc/$p/status"
        p=$pp
    done
    for p in /proc/[0-9]*; do
        p=${p#/proc/}
        [ -n "${skip[$p]:-}" ] && continue
        _slurm_mine "$p" "$1" && echo "$p"
    done
    return 0
}

# _slurm_stop DIR PID... — SIGTERM the PIDs that are still ours, wait up to
# 10 s, then SIGKILL what is left.  Reaps them if they are our children.
_slurm_stop() {
    local dir=$1 p i left
    shift
    local -a pids=()
    for p in "$@"; do
        if _slurm_alive "$p" && _slurm_mine "$p" "$dir"; then
            pids+=("$p")
            kill -TERM "$p" 2>/dev/null || true
        fi
    done
    [ ${#pids[@]} = 0 ] && return 0
    for ((i = 0; i < 100; i++)); do
        left=0
        for p in "${pids[@]}"; do
            _slurm_alive "$p" && left=1
        done
        [ $left = 0 ] && break
        sleep 0.1
    done
    for p in "${pids[@]}"; do
        if _slurm_alive "$p"; then
            kill -KILL "$p" 2>/dev/null || true
        fi
        wait "$p" 2>/dev/null || true
    done
    return 0
}

# _slurm_cleanup DIR [PIDS...] — the whole teardown, also run by the watchdog
# (so it may use only its arguments and the helpers above).
_slurm_cleanup() {
    local dir=$1 i
    shift
    [ -n "$dir" ] && [ -d "$dir" ] || return 0
    # Jobs first, while slurmctld still runs: lets slurmstepd end its tasks.
    if [ -f "$dir/slurm.conf" ] && SLURM_CONF=$dir/slurm.conf timeout 5 scontrol ping >/dev/null 2>&1; then
        local -a jobs=()
        mapfile -t jobs < <(SLURM_CONF=$dir/slurm.conf timeout 5 squeue -h -o %A 2>/dev/null)
        if [ ${#jobs[@]} -gt 0 ]; then
            SLURM_CONF=$dir/slurm.conf timeout 5 scancel "${jobs[@]}" >/dev/null 2>&1 || true
            for ((i = 0; i < 50; i++)); do
                [ -z "$(SLURM_CONF=$dir/slurm.conf timeout 5 squeue -h -o %A 2>/dev/null)" ] && break
                sleep 0.1
            done
        fi
    fi
    # Daemons in reverse start order (slurmds, slurmctld, munged last).
    local -a rev=()
    for ((i = $#; i >= 1; i--)); do
        rev+=("${!i}")
    done
    [ ${#rev[@]} -gt 0 ] && _slurm_stop "$dir" "${rev[@]}"
    # Then whatever else still runs for this cluster (slurmstepd, tasks, srun).
    local -a strays=()
    mapfile -t strays < <(_slurm_strays "$dir")
    [ ${#strays[@]} -gt 0 ] && _slurm_stop "$dir" "${strays[@]}"
    rm -rf "$dir"
    return 0
}

# _slurm_watchdog OWNER DIR — started detached (setsid, reparented away from
# the test): when OWNER dies while DIR still exists, tear the cluster down.
_slurm_watchdog_start() {
    local owner=$1 dir=$2 script
    script="$(declare -f _slurm_alive _slurm_mine _slurm_strays _slurm_stop _slurm_cleanup)
echo \$\$ > \"\$2/watchdog.pid\"
exec </dev/null >/dev/null 2>&1
while [ -d \"\$2\" ] && kill -0 \"\$1\" 2>/dev/null; do sleep 1; done
[ -d \"\$2\" ] || exit 0
mapfile -t pids < <(cut -d' ' -f2 \"\$2/pids\" 2>/dev/null)
_slurm_cleanup \"\$2\" \"\${pids[@]}\""
    # The subshell exits at once, so the watchdog is not in our process tree
    # (a test harness that kills the tree on timeout leaves it alive).
    ( setsid bash -c "$script" dshim-slurm-watchdog "$owner" "$dir" </dev/null >/dev/null 2>&1 & )
    local i
    for ((i = 0; i < 50; i++)); do
        [ -s "$dir/watchdog.pid" ] && return 0
        sleep 0.1
    done
    _slurm_err "slurm_up: the cleanup watchdog did not start (bash/setsid broken?)"
    return 1
}

# _slurm_port_free PORT — no TCP socket of any state uses PORT locally.
_slurm_port_free() {
    ! ss -Htan "( sport = :$1 )" 2>/dev/null | grep -q .
}

# _slurm_pick_ports N — print the first of N consecutive free ports, taken
# below the ephemeral range so that no client socket grabs them meanwhile.
_slurm_pick_ports() {
    local n=$1 lo hi base try p ok
    read -r lo hi < /proc/sys/net/ipv4/ip_local_port_range
    hi=$((lo > 20000 ? lo - 1 : 65000))
    lo=$((lo > 20000 ? 10000 : hi - 20000))
    for ((try = 0; try < 200; try++)); do
        base=$((lo + (RANDOM * 32768 + RANDOM) % (hi - lo - n)))
        ok=1
        for ((p = base; p < base + n; p++)); do
            _slurm_port_free "$p" || { ok=0; break; }
        done
        if [ $ok = 1 ]; then
            echo "$base"
            return 0
        fi
    done
    return 1
}

# _slurm_listening PORT — some socket LISTENs on PORT.
_slurm_listening() {
    ss -Htln "( sport = :$1 )" 2>/dev/null | grep -q .
}

# _slurm_fail MSG — one line saying what failed, then the daemon log tails,
# then tear down what was started.
_slurm_fail() {
    local f
    _slurm_err "slurm_up: $*"
    if [ -n "$_SLURM_DIR" ] && [ -d "$_SLURM_DIR/log" ]; then
        for f in "$_SLURM_DIR"/log/*; do
            [ -s "$f" ] || continue
            # With a LogFile the daemons print the same lines to stderr too.
            [[ $f == *.out ]] && [ -s "${f%.out}.log" ] && continue
            _slurm_err "---- tail of $f"
            # (a fresh StateSaveLocation always logs these; they are noise)
            grep -v -e 'state file' -e 'Trying backup state' "$f" | tail -n 15 >&2
        done
    fi
    slurm_down
    return 1
}

# _slurm_start NAME CMD... — start a daemon in the background (stdin closed,
# output to log/NAME.out, the port lock not inherited), record its PID.
_slurm_start() {
    local name=$1
    shift
    if [ -n "${_SLURM_LOCKFD:-}" ]; then
        "$@" </dev/null >"$_SLURM_DIR/log/$name.out" 2>&1 {_SLURM_LOCKFD}<&- &
    else
        "$@" </dev/null >"$_SLURM_DIR/log/$name.out" 2>&1 &
    fi
    _SLURM_PIDS+=("$!")
    echo "$name $!" >> "$_SLURM_DIR/pids"
}

# _slurm_wait_for SECONDS DESCRIPTION CMD... — poll CMD every 0.1 s; fail if it
# never succeeds or a daemon of ours exits meanwhile (why: in _SLURM_WHY).
_slurm_wait_for() {
    local secs=$1 what=$2 i p
    shift 2
    for ((i = 0; i < secs * 10; i++)); do
        "$@" && return 0
        for p in "${_SLURM_PIDS[@]}"; do
            if ! _slurm_alive "$p"; then
                _SLURM_WHY="$(grep " $p\$" "$_SLURM_DIR/pids" | cut -d' ' -f1) (pid $p) exited while waiting for $what"
                return 1
            fi
        done
        sleep 0.1
    done
    _SLURM_WHY="timed out after ${secs} s waiting for $what"
    return 1
}

_slurm_unlock() {
    if [ -n "${_SLURM_LOCKFD:-}" ]; then
        exec {_SLURM_LOCKFD}<&-
        _SLURM_LOCKFD=""
    fi
}

_slurm_munge_ok() {
    [ -S "$_SLURM_DIR/munge.socket" ] && munge -n -S "$_SLURM_DIR/munge.socket" >/dev/null 2>&1
}

_slurm_nodes_idle() {
    local out
    out=$(timeout 5 sinfo -h -N -o '%N %T' 2>/dev/null) || return 1
    [ "$(grep -c ' idle$' <<<"$out")" = "$SLURM_TEST_NODES" ]
}

# _slurm_write_conf PORT — slurm.conf (and an empty plugstack.conf, so that
# the system's /etc/slurm/plugstack.conf.d SPANK plugins are not loaded).
_slurm_write_conf() {
    local d=$_SLURM_DIR base=$1 i n=$SLURM_TEST_NODES
    : > "$d/plugstack.conf"
    cat > "$d/slurm.conf" <<EOF
# generated by tests/launcher/lib/slurm.sh for one test run
ClusterName=$_SLURM_CLUSTER
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$base
SlurmdPort=$((base + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$d/munge.socket
StateSaveLocation=$d/state
SlurmdSpoolDir=$d/spool/%n
SlurmctldPidFile=$d/run/slurmctld.pid
SlurmdPidFile=$d/run/slurmd.%n.pid
SlurmctldLogFile=$d/log/slurmctld.log
SlurmdLogFile=$d/log/slurmd.%n.log
PlugStackConfig=$d/plugstack.conf
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
KillWait=2
SlurmctldDebug=info
SlurmdDebug=info
EOF
    for ((i = 1; i <= n; i++)); do
        echo "NodeName=n$i NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((base + i)) CPUs=$SLURM_TEST_CPUS State=UNKNOWN" >> "$d/slurm.conf"
    done
    echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES" >> "$d/slurm.conf"
}

# Usage: slurm_up [NODES] [CPUS] — see the top of this file.
slurm_up() {
    local nodes=${1:-1} cpus=${2:-8} base i v tmp
    if [ -n "$_SLURM_DIR" ] && [ -d "$_SLURM_DIR" ]; then
        _slurm_err "slurm_up: a cluster is already up in $_SLURM_DIR; call slurm_down first"
        return 1
    fi
    if ! [[ $nodes =~ ^[0-9]+$ ]] || [ "$nodes" -lt 1 ] || [ "$nodes" -gt 16 ]; then
        _slurm_err "slurm_up: NODES must be 1..16, got '$nodes'"
        return 1
    fi
    if ! [[ $cpus =~ ^[0-9]+$ ]] || [ "$cpus" -lt 1 ] || [ "$cpus" -gt 256 ]; then
        _slurm_err "slurm_up: CPUS must be 1..256, got '$cpus'"
        return 1
    fi
    if ! v=$(slurm_available); then
        _slurm_err "slurm_up: $v"
        return 1
    fi
    # Not someone else's job or cluster.
    for v in $(compgen -e SLURM_); do
        unset "$v"
    done
    # Short base path: slurmstepd's socket spool/nI/nI_JOB.STEP must fit sun_path.
    tmp=${TMPDIR:-/tmp}
    [ ${#tmp} -gt 40 ] && tmp=/tmp
    _SLURM_DIR=$(mktemp -d "$tmp/dshim-slurm.XXXXXX") || {
        _slurm_err "slurm_up: cannot create a temp dir in $tmp (disk full or not writable?)"
        _SLURM_DIR=""
        return 1
    }
    _SLURM_PIDS=()
    _SLURM_CLUSTER="dshim$$r$RANDOM"
    export SLURM_TEST_DIR=$_SLURM_DIR SLURM_TEST_NODES=$nodes SLURM_TEST_CPUS=$cpus
    export SLURM_CONF=$_SLURM_DIR/slurm.conf
    chmod 755 "$_SLURM_DIR"
    mkdir -p "$_SLURM_DIR"/{state,spool,log,run}
    for ((i = 1; i <= nodes; i++)); do
        mkdir -p "$_SLURM_DIR/spool/n$i"
    done
    : > "$_SLURM_DIR/pids"
    _slurm_watchdog_start "$$" "$_SLURM_DIR" || { _slurm_fail "no watchdog"; return 1; }

    # munge: our own key and daemon; nothing under /etc or /run is used.
    if ! mungekey -c -b 1024 -k "$_SLURM_DIR/munge.key" >/dev/null 2>&1; then
        _slurm_fail "mungekey could not create $_SLURM_DIR/munge.key"
        return 1
    fi
    chmod 600 "$_SLURM_DIR/munge.key"
    _slurm_start munged "$_SLURM_BIN_MUNGED" -F --force \
        --key-file="$_SLURM_DIR/munge.key" --socket="$_SLURM_DIR/munge.socket" \
        --pid-file="$_SLURM_DIR/run/munged.pid" --seed-file="$_SLURM_DIR/munged.seed"
    _slurm_wait_for 10 "munged to answer on $_SLURM_DIR/munge.socket" _slurm_munge_ok || {
        _slurm_fail "munged did not start: $_SLURM_WHY; its log follows"
        return 1
    }

    # Ports are picked and bound under one machine-wide lock so that runs in
    # parallel never choose the same ones.
    exec {_SLURM_LOCKFD}<"$_SLURM_BIN_CTLD"
    if ! flock -w 60 "$_SLURM_LOCKFD"; then
        _slurm_unlock
        _slurm_fail "could not lock $_SLURM_BIN_CTLD for 60 s to pick ports (another slurm_up hung?)"
        return 1
    fi
    if ! base=$(_slurm_pick_ports $((nodes + 1))); then
        _slurm_unlock
        _slurm_fail "found no $((nodes + 1)) consecutive free TCP ports"
        return 1
    fi
    _slurm_write_conf "$base"
    _slurm_start slurmctld "$_SLURM_BIN_CTLD" -D -f "$SLURM_CONF"
    if ! _slurm_wait_for 15 "slurmctld to listen on port $base" _slurm_listening "$base"; then
        _slurm_unlock
        _slurm_fail "slurmctld did not start: $_SLURM_WHY; the logs follow"
        return 1
    fi
    for ((i = 1; i <= nodes; i++)); do
        _slurm_start "slurmd.n$i" "$_SLURM_BIN_SLURMD" -D -N "n$i" -f "$SLURM_CONF"
    done
    for ((i = 1; i <= nodes; i++)); do
        if ! _slurm_wait_for 15 "slurmd n$i to listen on port $((base + i))" _slurm_listening $((base + i)); then
            _slurm_unlock
            _slurm_fail "slurmd n$i did not start: $_SLURM_WHY; the logs follow"
            return 1
        fi
    done
    _slurm_unlock

    if ! _slurm_wait_for 20 "all $nodes node(s) to be idle in sinfo" _slurm_nodes_idle; then
        _slurm_fail "nodes not idle: $_SLURM_WHY (sinfo: $(timeout 5 sinfo -h -N -o '%N=%T' 2>&1 | tr '\n' ' ')); the logs follow"
        return 1
    fi
    return 0
}

# Usage: slurm_wait_job ID [SECS] — see the top of this file.
slurm_wait_job() {
    local id=$1 secs=${2:-60} i line state code
    for ((i = 0; i < secs * 10; i++)); do
        line=$(timeout 5 scontrol -o show job "$id" 2>/dev/null) || line=""
        state=$(sed -n 's/.* JobState=\([A-Z_]*\).*/\1/p' <<<"$line")
        case $state in
            "" | PENDING | RUNNING | CONFIGURING | COMPLETING | SUSPENDED | REQUEUED | RESIZING | STAGE_OUT | SIGNALING)
                ;;
            *)
                code=$(sed -n 's/.* ExitCode=\([0-9]*:[0-9]*\).*/\1/p' <<<"$line")
                if [ -z "$code" ]; then
                    _slurm_err "slurm_wait_job: job $id ended ($state) without an ExitCode in scontrol"
                    return 1
                fi
                if [ "${code#*:}" != 0 ]; then
                    return $((128 + ${code#*:}))
                fi
                return "${code%%:*}"
                ;;
        esac
        sleep 0.1
    done
    _slurm_err "slurm_wait_job: job $id not finished after $secs s (state ${state:-unknown}); see squeue and $SLURM_TEST_DIR/log"
    return 124
}

# Usage: slurm_down — see the top of this file.
slurm_down() {
    local dir=${_SLURM_DIR:-} wd
    _slurm_unlock
    [ -n "$dir" ] || return 0
    # The watchdog first, so that it does not race us.
    if [ -s "$dir/watchdog.pid" ]; then
        read -r wd < "$dir/watchdog.pid" || wd=""
        if [ -n "$wd" ] && _slurm_alive "$wd" && _slurm_mine "$wd" "$dir"; then
            kill -TERM "$wd" 2>/dev/null || true
        fi
    fi
    _slurm_cleanup "$dir" "${_SLURM_PIDS[@]}"
    _SLURM_DIR=""
    _SLURM_PIDS=()
    [ "${SLURM_CONF:-}" = "$dir/slurm.conf" ] && unset SLURM_CONF
    unset SLURM_TEST_DIR SLURM_TEST_NODES SLURM_TEST_CPUS
    return 0
}

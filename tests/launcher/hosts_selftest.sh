#!/usr/bin/env bash
# Self-test of tests/launcher/lib/hosts.sh: a 3-host fake cluster (network
# namespaces, one real sshd each), ssh between every pair, rsync over
# $HOSTS_SSH, hostfiles, clean failure of a broken hosts_up, and a teardown
# that leaves no namespace, sshd or temp dir behind.  It also prints (as
# "observe:" lines, not assertions) what happens to a remote command when the
# ssh client is killed, for the launcher's design.
# Skips (exit 77) without root, `ip netns` or sshd.  Bounded to 100 s.
# shellcheck source-path=SCRIPTDIR disable=SC2153  # HOSTS_* come from lib/hosts.sh
set -euo pipefail

if [ -z "${HOSTS_SELFTEST_BOUNDED:-}" ]; then
    export HOSTS_SELFTEST_BOUNDED=1
    exec timeout -k 5 100 bash "$0" "$@"
fi

here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib/hosts.sh"

if ! why=$(hosts_available); then
    echo "SKIP: $why"
    exit 77
fi
if ! command -v rsync >/dev/null; then
    echo "hosts_selftest: rsync not found (install it: make setup)" >&2
    exit 1
fi

work=$(mktemp -d /tmp/hosts_selftest.XXXXXX)
clients=()     # ssh client PIDs we started
exec 7>&-      # fd 7 is the write end of the stdin fifo, later

# Marker processes (observation runs) are ours: find them by their unique
# marker argument, kill them by PID.
marker_pids() {
    local d
    local -a argv
    for d in /proc/[0-9]*; do
        mapfile -d '' argv 2>/dev/null <"$d/cmdline" || continue
        if [[ " ${argv[*]} " == *"$1"* ]]; then
            echo "${d#/proc/}"
        fi
    done
}

cleanup() {
    local p
    exec 7>&- 2>/dev/null || true
    for p in "${clients[@]}"; do
        kill -KILL "$p" 2>/dev/null || true
    done
    for p in $(marker_pids "hsmark$$-"); do
        kill -KILL "$p" 2>/dev/null || true
    done
    hosts_down
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 143' TERM INT HUP

pass=0
failed=0
check() {  # name cmd... — run one check, count it, say what failed
    local name=$1
    shift
    if "$@"; then
        pass=$((pass + 1))
        echo "ok: $name"
    else
        failed=$((failed + 1))
        echo "FAIL: $name"
    fi
}

ips=()
ip_of() { echo "${ips[$1]}"; }

# ---------------------------------------------------------------- failures
t_bad_count() {
    local err
    err=$(hosts_up 5 2>&1) && { echo "  hosts_up 5 succeeded"; return 1; }
    [[ $err == *"must be 2..4"* ]] || { echo "  unexpected message: $err"; return 1; }
}

# An sshd that passes the config test but dies at start: hosts_up must say
# so in one line and leave nothing behind.
t_midway_failure() {
    local err fake=$work/fake_sshd
    printf '#!/bin/sh\ncase " $* " in *" -t "*) exit 0;; esac\necho "fake sshd: refusing to start" >&2\nexit 1\n' >"$fake"
    chmod +x "$fake"
    err=$(_HOSTS_SSHD=$fake hosts_up 2 2>&1) && { echo "  hosts_up with a dead sshd succeeded"; return 1; }
    [[ $err == *"exited"* ]] || { echo "  unexpected message: $err"; return 1; }
    [ "$(echo "$err" | wc -l)" = 1 ] || { echo "  message is not one line: $err"; return 1; }
    if compgen -G "/run/netns/dsh$$-*" >/dev/null; then
        echo "  namespaces left:" /run/netns/dsh$$-*
        return 1
    fi
    if compgen -G "/tmp/dsh$$-*" >/dev/null; then
        echo "  temp dir left: $(ls -d /tmp/dsh$$-*)"
        return 1
    fi
    echo "  ($err)"
}

# ---------------------------------------------------------------- cluster
t_up() {
    hosts_up 3 || return 1
    read -r -a ips <<<"$HOSTS_IPS"
    [ "${#ips[@]}" = 3 ] || { echo "  HOSTS_IPS='$HOSTS_IPS'"; return 1; }
    [ -f "$HOSTS_SSH_CONFIG" ] && [ -d "$HOSTS_DIR" ] && [ -n "$HOSTS_SSH" ] || return 1
    echo "  hosts: $HOSTS_IPS in $HOSTS_NS"
}

t_ssh_from_0() {
    local i out
    for i in 0 1 2; do
        out=$(hosts_ssh "$i" hostname -I </dev/null 2>&1) || { echo "  ssh to host $i: $out"; return 1; }
        [[ " $out " == *" $(ip_of "$i") "* ]] || { echo "  host $i: hostname -I says '$out'"; return 1; }
    done
}

t_ssh_matrix() {
    local i j out
    for j in 0 1 2; do
        for i in 0 1 2; do
            # shellcheck disable=SC2086  # HOSTS_SSH is a command string
            out=$(hosts_exec "$j" timeout 15 $HOSTS_SSH -n "$(ip_of "$i")" hostname -I 2>&1) ||
                { echo "  host $j -> host $i: $out"; return 1; }
            [[ " $out " == *" $(ip_of "$i") "* ]] || { echo "  host $j -> host $i: '$out'"; return 1; }
        done
    done
}

t_remote_path() {
    local out
    # shellcheck disable=SC2016,SC2086  # expanded remotely; a command string
    out=$(hosts_exec 0 timeout 15 $HOSTS_SSH -n "$(ip_of 1)" 'echo $PATH; command -v rsync' 2>&1) || { echo "  $out"; return 1; }
    [[ $out == *"/usr/local/bin"* && $out == *"/usr/bin"* && $out == *"/rsync"* ]] ||
        { echo "  remote PATH not sane: $out"; return 1; }
}

t_rsync() {
    local before after out
    mkdir -p "$work/src/sub"
    echo "hello $$" >"$work/src/a.txt"
    head -c 100000 /dev/urandom >"$work/src/sub/blob"
    before=$(grep -c "Accepted publickey" "$HOSTS_DIR/h2.log")
    out=$(hosts_exec 0 timeout 30 rsync -az -e "$HOSTS_SSH" "$work/src/" "$(ip_of 2):$work/dst/" 2>&1) ||
        { echo "  rsync: $out"; return 1; }
    diff -r "$work/src" "$work/dst" || return 1
    after=$(grep -c "Accepted publickey" "$HOSTS_DIR/h2.log")
    [ "$after" -gt "$before" ] || { echo "  rsync did not go through host 2's sshd"; return 1; }
}

t_hostfile() {
    hosts_write_hostfile "$work/hf" || return 1
    hosts_write_hostfile "$work/hfp" 9099 || return 1
    [ "$(cat "$work/hf")" = "$(printf '%s\n' "${ips[@]}")" ] || { cat "$work/hf"; return 1; }
    [ "$(cat "$work/hfp")" = "$(printf '%s:9099\n' "${ips[@]}")" ] || { cat "$work/hfp"; return 1; }
}

# ---------------------------------------------------------------- observe
# Remote helpers live in $work: the filesystem is shared by all hosts.
cat >"$work/remote_sleep.sh" <<'EOF'
#!/bin/bash
# remote_sleep.sh MARKER LOG — record which signal ends us
log=$2
for s in HUP TERM INT PIPE; do trap "echo got-$s >>$log; exit 1" $s; done
echo "pid $$" >>"$log"
(exec -a "$1-sleep" sleep 1000) &
wait $!
echo sleep-ended >>"$log"
EOF
cat >"$work/remote_cat.sh" <<'EOF'
#!/bin/bash
# remote_cat.sh MARKER LOG — record EOF on stdin and the signal that ends us
log=$2
for s in HUP TERM INT PIPE; do trap "echo got-$s >>$log; exit 1" $s; done
echo "pid $$" >>"$log"
cat >/dev/null
echo eof-seen >>"$log"
echo eof
sleep 3    # stay around a little, to see if a signal follows
echo exited-normally >>"$log"
EOF
chmod +x "$work/remote_sleep.sh" "$work/remote_cat.sh"

# observe NAME SIGNAL TTYFLAG SCRIPT STDIN(null|fifo)
nobs=0
observe() {
    local name=$1 sig=$2 tty=$3 script=$4 input=$5
    local marker log cpid rpid n p state alive=no
    nobs=$((nobs + 1))
    marker="hsmark$$-$nobs"
    log="$work/obs$nobs.log"
    : >"$log"
    if [ "$input" = fifo ]; then
        mkfifo "$work/in$nobs"
        exec 7<>"$work/in$nobs"    # keeps the client's stdin open (never EOF)
        ip netns exec "${HOSTS_NS%% *}" ssh -F "$HOSTS_SSH_CONFIG" "$tty" "$(ip_of 1)" \
            "$work/$script" "$marker" "$log" <"$work/in$nobs" >/dev/null 2>&1 &
    else
        ip netns exec "${HOSTS_NS%% *}" ssh -F "$HOSTS_SSH_CONFIG" "$tty" "$(ip_of 1)" \
            "$work/$script" "$marker" "$log" </dev/null >/dev/null 2>&1 &
    fi
    cpid=$!
    clients+=("$cpid")
    rpid=""
    for ((n = 0; n < 50; n++)); do
        rpid=$(sed -n 's/^pid //p' "$log")
        [ -n "$rpid" ] && break
        sleep 0.1
    done
    if [ -z "$rpid" ]; then
        echo "observe: $name: remote command never started"
        kill -KILL "$cpid" 2>/dev/null || true
        wait "$cpid" 2>/dev/null || true
        clients=()
        exec 7>&-
        return 0
    fi
    kill "-$sig" "$cpid" 2>/dev/null || true
    wait "$cpid" 2>/dev/null || true
    clients=()
    exec 7>&-
    sleep 2
    state=$(sed -E 's/^.*\) (.).*$/\1/' "/proc/$rpid/stat" 2>/dev/null || true)
    if [ -n "$state" ] && [ "$state" != Z ]; then
        alive=yes
    fi
    echo "observe: $name: client killed with SIG$sig -> remote still running after 2 s: $alive;" \
        "remote saw: $(grep -v '^pid ' "$log" | tr '\n' ' ')"
    kill -KILL "$rpid" 2>/dev/null || true
    for p in $(marker_pids "$marker"); do
        kill -KILL "$p" 2>/dev/null || true
    done
}

# ---------------------------------------------------------------- teardown
t_down_clean() {
    local prefix=${HOSTS_NS%%-h0*} dir=$HOSTS_DIR pids p left
    pids="${_HOSTS_PIDS[*]} $(cat "$dir"/h*.pid 2>/dev/null | tr '\n' ' ')"
    hosts_down || return 1
    if compgen -G "/run/netns/$prefix-*" >/dev/null; then
        echo "  namespaces left:" "/run/netns/$prefix-"*
        return 1
    fi
    for p in $pids; do
        if [ -d "/proc/$p" ] && [ "$(sed -E 's/^.*\) (.).*$/\1/' "/proc/$p/stat" 2>/dev/null)" != Z ]; then
            echo "  sshd $p still running"
            return 1
        fi
    done
    left=$(marker_pids "$dir/" | tr '\n' ' ')
    [ -z "$left" ] || { echo "  processes still mention $dir: $left"; return 1; }
    [ ! -e "$dir" ] || { echo "  $dir still exists"; return 1; }
}

t_down_twice() {
    hosts_down && hosts_down
}

check "hosts_up rejects a bad host count" t_bad_count
check "hosts_up failing midway reports one line, leaves nothing" t_midway_failure
check "hosts_up 3" t_up
if [ -z "${HOSTS_IPS:-}" ]; then
    echo "hosts_selftest: $pass passed, $((failed + 1)) failed (no cluster, rest not run)"
    exit 1
fi
check "ssh from host 0 to each host, hostname -I shows its IP" t_ssh_from_0
check "every host reaches every host (itself too) by ssh" t_ssh_matrix
check "remote PATH is sane" t_remote_path
check "rsync -az -e \"\$HOSTS_SSH\" host 0 -> host 2" t_rsync
check "hosts_write_hostfile (plain and host:port)" t_hostfile

observe "ssh -T, remote sleep" TERM -T remote_sleep.sh null
observe "ssh -T, remote sleep" KILL -T remote_sleep.sh null
observe "ssh -T, remote cat (stdin open)" TERM -T remote_cat.sh fifo
observe "ssh -T, remote cat (stdin open)" KILL -T remote_cat.sh fifo
observe "ssh -tt, remote sleep" KILL -tt remote_sleep.sh null

check "hosts_down leaves no namespace, sshd, process or temp dir" t_down_clean
check "hosts_down is idempotent" t_down_twice

echo "hosts_selftest: $pass passed, $failed failed"
[ "$failed" = 0 ]

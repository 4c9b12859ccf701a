# shellcheck shell=bash
# hosts.sh — fake multi-host clusters for launcher tests (source it; needs root).
#
# Each "host" is a network namespace running its own real OpenSSH server.  The
# hosts are joined by a Linux bridge that lives in one more namespace of its
# own, so the root namespace's network is never touched.  Namespaces share the
# machine's PID namespace, filesystem and hostname (UTS): a process started
# "on host 2" is visible to ps everywhere, a path written on one host is seen
# by all, and `hostname` prints the same name on every host (`hostname -I`
# differs).  Tests identify their processes by a marker in argv or environ.
#
#   hosts_up K                 K=2..4 hosts; sets and exports the variables below
#   hosts_exec I cmd...        run cmd inside host I's namespace
#   hosts_ssh I cmd...         ssh from host 0 to host I, run cmd (ssh semantics:
#                              the words are joined by spaces and run by the
#                              remote login shell, so quote for that shell)
#   hosts_write_hostfile FILE [port]   one IP (or IP:port) per line, host order
#   hosts_down                 stop sshds, kill what still runs in our
#                              namespaces, delete them and HOSTS_DIR; idempotent
#   hosts_available            0 if hosts_up can work here, else prints why (1 line)
#
#   HOSTS_IPS         "10.x.y.1 10.x.y.2 ..."  (host i = word i)
#   HOSTS_NS          namespace names, same order
#   HOSTS_DIR         per-run temp dir (keys, configs, sshd logs hN.log)
#   HOSTS_SSH_CONFIG  ssh client config (generated key, no known_hosts, batch)
#   HOSTS_SSH         "ssh -F $HOSTS_SSH_CONFIG": an ssh replacement, also for
#                     `rsync -e "$HOSTS_SSH"`.  The IPs are only reachable
#                     from inside the namespaces: run clients via hosts_exec.
#
# Typical use:
#   source tests/launcher/lib/hosts.sh
#   trap hosts_down EXIT; trap 'exit 143' TERM INT
#   hosts_up 3
#   hosts_exec 0 dshim-run --launcher ssh ...
#
# Remote sessions get PATH from `SetEnv PATH=...` in sshd_config (sshd's
# compiled-in default lacks /usr/local/bin); root's ~/.bashrc may append to it.
# sshd needs its privilege-separation dir /run/sshd; hosts_up creates it if
# missing (a harmless, shared, empty dir that is left in place).
# The sshd listeners get a parent-death signal (setpriv --pdeathsig), so they
# die with the shell that ran hosts_up even if that shell is SIGKILLed;
# namespaces (without processes) and temp dirs left behind by such a run are
# reaped by the next hosts_up.

_HOSTS_SSHD=${_HOSTS_SSHD:-/usr/sbin/sshd}
_HOSTS_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
_HOSTS_PREFIX=""        # namespace name prefix of the current cluster
_HOSTS_CREATED=()       # namespaces we created (for hosts_down, even after a partial up)
_HOSTS_PIDS=()          # sshd listener PIDs we started
_HOSTS_MYDIR=""         # temp dir we created

_hosts_err() {
    echo "$*" >&2
}

# Usage: hosts_available — returns 0 when root, ip netns works and sshd exists;
# otherwise prints one line saying why and returns 1 (tests exit 77 on that).
hosts_available() {
    local probe
    if [ "$(id -u)" != 0 ]; then
        echo "need root to create network namespaces (run the test as root)"
        return 1
    fi
    for probe in ip timeout setpriv ssh ssh-keygen "$_HOSTS_SSHD"; do
        if ! command -v "$probe" >/dev/null 2>&1; then
            echo "$probe not found (install iproute2/coreutils/util-linux/openssh-server/openssh-client: make setup)"
            return 1
        fi
    done
    probe="dshprobe$$-$RANDOM"
    if ! ip netns add "$probe" 2>/dev/null; then
        echo "'ip netns add' is not permitted here (need CAP_SYS_ADMIN and a writable /run/netns)"
        return 1
    fi
    ip netns del "$probe" 2>/dev/null || true
    return 0
}

# Namespaces named dsh<pid>-<n>-... whose <pid> is dead and that hold no
# process are leftovers of a run that was SIGKILLed: delete them.
_hosts_reap_stale() {
    local f name pid
    for f in /run/netns/dsh*; do
        [ -e "$f" ] || continue
        name=${f##*/}
        [[ $name =~ ^dsh([0-9]+)-[0-9]+-(h[0-9]+|br)$ ]] || continue
        pid=${BASH_REMATCH[1]}
        [ -d "/proc/$pid" ] && continue
        [ -z "$(ip netns pids "$name" 2>/dev/null)" ] || continue
        ip netns del "$name" 2>/dev/null || true
    done
    # Their temp dirs too, once none of that run's namespaces is left.
    for f in /tmp/dsh*; do
        [ -d "$f" ] || continue
        name=${f##*/}
        [[ $name =~ ^dsh([0-9]+)-([0-9]+)\.[A-Za-z0-9]{6}$ ]] || continue
        pid=${BASH_REMATCH[1]}
        [ -d "/proc/$pid" ] && continue
        compgen -G "/run/netns/dsh$pid-${BASH_REMATCH[2]}-*" >/dev/null && continue
        rm -rf "$f"
    done
}

# Fail: message, tear down what was made, return 1.
_hosts_up_fail() {
    _hosts_err "hosts_up: $*"
    hosts_down
    return 1
}

# Usage: _hosts_alive PID — running and not a zombie.
_hosts_alive() {
    local state
    [ -r "/proc/$1/stat" ] || return 1
    state=$(sed -E 's/^.*\) (.).*$/\1/' "/proc/$1/stat" 2>/dev/null) || return 1
    [ -n "$state" ] && [ "$state" != Z ] && [ "$state" != X ]
}

# Usage: hosts_up K
hosts_up() {
    local k=${1:-}
    local why i ns ip seq net_x net_y dir br deadline ok
    if ! [[ $k =~ ^[2-4]$ ]]; then
        _hosts_err "hosts_up: host count must be 2..4, got '$k' (usage: hosts_up K)"
        return 1
    fi
    if [ -n "$_HOSTS_PREFIX" ]; then
        _hosts_err "hosts_up: a cluster ($_HOSTS_PREFIX) is already up; call hosts_down first"
        return 1
    fi
    if ! why=$(hosts_available); then
        _hosts_err "hosts_up: $why"
        return 1
    fi
    _hosts_reap_stale

    # Unique per run: $$ (the sourcing shell) plus a counter for reuse in one run.
    seq=0
    while compgen -G "/run/netns/dsh$$-$seq-*" >/dev/null; do
        seq=$((seq + 1))
    done
    _HOSTS_PREFIX="dsh$$-$seq"
    # 10.x.y.0/24 from the PID, away from 10.77 (tests/netns); every cluster has
    # its own bridge namespace, so equal subnets in parallel runs do not meet.
    net_x=$((100 + ($$ / 250) % 150))
    net_y=$(($$ % 250))

    _HOSTS_MYDIR=$(mktemp -d "/tmp/${_HOSTS_PREFIX}.XXXXXX") ||
        { _hosts_up_fail "cannot create a temp dir in /tmp (check space and permissions)"; return 1; }
    dir=$_HOSTS_MYDIR
    chmod 700 "$dir"

    # The bridge ("switch") namespace.
    br="${_HOSTS_PREFIX}-br"
    ip netns add "$br" 2>/dev/null ||
        { _hosts_up_fail "ip netns add $br failed (is a namespace of that name left over? ip netns del $br)"; return 1; }
    _HOSTS_CREATED+=("$br")
    { ip -n "$br" link set lo up &&
      ip -n "$br" link add br0 type bridge &&
      ip -n "$br" link set br0 up; } 2>/dev/null ||
        { _hosts_up_fail "cannot create bridge br0 in $br (is the bridge module available? modprobe bridge)"; return 1; }

    local ips=() nss=()
    for ((i = 0; i < k; i++)); do
        ns="${_HOSTS_PREFIX}-h$i"
        ip="10.$net_x.$net_y.$((i + 1))"
        ip netns add "$ns" 2>/dev/null ||
            { _hosts_up_fail "ip netns add $ns failed (left over? ip netns del $ns)"; return 1; }
        _HOSTS_CREATED+=("$ns")
        { ip -n "$br" link add "v$i" type veth peer name eth0 netns "$ns" &&
          ip -n "$br" link set "v$i" master br0 &&
          ip -n "$br" link set "v$i" up &&
          ip -n "$ns" link set lo up &&
          ip -n "$ns" addr add "$ip/24" dev eth0 &&
          ip -n "$ns" link set eth0 up; } 2>/dev/null ||
            { _hosts_up_fail "cannot wire $ns to the bridge with a veth pair (is the veth module available? modprobe veth)"; return 1; }
        ips+=("$ip")
        nss+=("$ns")
    done

    ssh-keygen -q -t ed25519 -N '' -C "hosts.sh client" -f "$dir/client_key" </dev/null >/dev/null 2>&1 ||
        { _hosts_up_fail "ssh-keygen failed to make $dir/client_key (check that openssh-client works)"; return 1; }
    cat >"$dir/ssh_config" <<EOF
Host *
    User root
    Port 22
    IdentityFile $dir/client_key
    IdentitiesOnly yes
    UserKnownHostsFile /dev/null
    GlobalKnownHostsFile /dev/null
    StrictHostKeyChecking no
    LogLevel ERROR
    BatchMode yes
    ConnectTimeout 5
    ControlMaster no
EOF

    # sshd refuses to start without its privilege-separation directory.
    [ -d /run/sshd ] || mkdir -m 0755 /run/sshd 2>/dev/null || [ -d /run/sshd ] ||
        { _hosts_up_fail "cannot create /run/sshd (sshd's privilege-separation dir); create it: mkdir -m 0755 /run/sshd"; return 1; }
    for ((i = 0; i < k; i++)); do
        ssh-keygen -q -t ed25519 -N '' -C "hosts.sh h$i" -f "$dir/h${i}_host_key" </dev/null >/dev/null 2>&1 ||
            { _hosts_up_fail "ssh-keygen failed to make a host key in $dir"; return 1; }
        cat >"$dir/h$i.sshd_config" <<EOF
ListenAddress ${ips[$i]}
Port 22
HostKey $dir/h${i}_host_key
PidFile $dir/h$i.pid
AuthorizedKeysFile $dir/client_key.pub
UsePAM no
PermitRootLogin yes
StrictModes no
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UseDNS no
PrintMotd no
PrintLastLog no
X11Forwarding no
MaxStartups 100:30:200
MaxSessions 100
LoginGraceTime 30
SetEnv PATH=$_HOSTS_PATH
Subsystem sftp internal-sftp
EOF
        "$_HOSTS_SSHD" -t -f "$dir/h$i.sshd_config" >"$dir/h$i.log" 2>&1 ||
            { _hosts_up_fail "sshd rejects $dir/h$i.sshd_config: $(tail -n 1 "$dir/h$i.log")"; return 1; }
        # ip netns exec and setpriv both exec, so $! is sshd itself.
        # shellcheck disable=SC2094  # -E and stdout append to the same log
        ip netns exec "${nss[$i]}" setpriv --pdeathsig KILL -- \
            "$_HOSTS_SSHD" -D -f "$dir/h$i.sshd_config" -E "$dir/h$i.log" \
            </dev/null >>"$dir/h$i.log" 2>&1 &
        _HOSTS_PIDS+=($!)
        # Out of the job table, so a test's bare `wait` does not wait for sshd
        # (bash still reaps it when it exits).
        disown "$!"
    done

    # Bounded wait (~10 s): every sshd takes a TCP connection from host 0.
    deadline=$((SECONDS + 10))
    for ((i = 0; i < k; i++)); do
        ok=0
        while [ $SECONDS -lt $deadline ]; do
            if ! _hosts_alive "${_HOSTS_PIDS[$i]}"; then
                _hosts_up_fail "sshd for host $i (${nss[$i]}) exited: $(tail -n 1 "$dir/h$i.log" 2>/dev/null)"
                return 1
            fi
            if ip netns exec "${nss[0]}" timeout 2 bash -c "exec 3<>/dev/tcp/${ips[$i]}/22" 2>/dev/null; then
                ok=1
                break
            fi
            sleep 0.1
        done
        if [ $ok = 0 ]; then
            _hosts_up_fail "sshd on host $i (${ips[$i]} in ${nss[$i]}) accepted no connection within 10 s; see $dir/h$i.log"
            return 1
        fi
    done

    export HOSTS_IPS="${ips[*]}"
    export HOSTS_NS="${nss[*]}"
    export HOSTS_DIR="$dir"
    export HOSTS_SSH_CONFIG="$dir/ssh_config"
    export HOSTS_SSH="ssh -F $HOSTS_SSH_CONFIG"

    # One real login per host, so a broken key or config fails here, clearly.
    for ((i = 0; i < k; i++)); do
        if ! ip netns exec "${nss[0]}" timeout 10 ssh -F "$HOSTS_SSH_CONFIG" -n "${ips[$i]}" true \
            >"$dir/probe.err" 2>&1; then
            _hosts_up_fail "ssh root@${ips[$i]} (host $i) from host 0 failed: $(tail -n 1 "$dir/probe.err") (sshd log: $dir/h$i.log)"
            return 1
        fi
    done
    rm -f "$dir/probe.err"
    return 0
}

# Usage: _hosts_ns I — prints namespace of host I, or fails with a message.
_hosts_ns() {
    local -a nss
    read -r -a nss <<<"${HOSTS_NS:-}"
    if ! [[ ${1:-} =~ ^[0-9]+$ ]] || [ "$1" -ge "${#nss[@]}" ]; then
        _hosts_err "hosts: no host '${1:-}' (cluster has ${#nss[@]} hosts; call hosts_up first)"
        return 1
    fi
    echo "${nss[$1]}"
}

# Usage: hosts_exec I cmd...
hosts_exec() {
    local ns
    ns=$(_hosts_ns "${1:-}") || return 1
    shift
    ip netns exec "$ns" "$@"
}

# Usage: hosts_ssh I cmd...   (from host 0)
hosts_ssh() {
    local ns0 ip
    local -a ips
    ns0=$(_hosts_ns 0) || return 1
    _hosts_ns "${1:-}" >/dev/null || return 1
    read -r -a ips <<<"$HOSTS_IPS"
    ip=${ips[$1]}
    shift
    ip netns exec "$ns0" ssh -F "$HOSTS_SSH_CONFIG" "$ip" "$@"
}

# Usage: hosts_write_hostfile FILE [port]
hosts_write_hostfile() {
    local file=${1:-} port=${2:-} ip
    if [ -z "$file" ] || [ -z "${HOSTS_IPS:-}" ]; then
        _hosts_err "hosts_write_hostfile: usage: hosts_write_hostfile FILE [port], after hosts_up"
        return 1
    fi
    : >"$file" || return 1
    for ip in $HOSTS_IPS; do
        if [ -n "$port" ]; then
            echo "$ip:$port" >>"$file"
        else
            echo "$ip" >>"$file"
        fi
    done
}

# Usage: _hosts_stop PID... — TERM, up to ~3 s grace, then KILL; reap our children.
_hosts_stop() {
    local pid n
    [ $# -gt 0 ] || return 0
    kill -TERM "$@" 2>/dev/null || true
    for ((n = 0; n < 30; n++)); do
        for pid in "$@"; do
            _hosts_alive "$pid" && break
            pid=""
        done
        [ -z "${pid:-}" ] && break
        sleep 0.1
    done
    for pid in "$@"; do
        _hosts_alive "$pid" && kill -KILL "$pid" 2>/dev/null
    done
    for pid in "$@"; do
        wait "$pid" 2>/dev/null || true   # reaps our own children (not disowned sshds: bash does)
    done
    return 0
}

# Usage: hosts_down — safe any time (partial hosts_up, twice, from a trap).
hosts_down() {
    local pid ns cmd
    local -a mine=() left=()
    # Our sshd listeners, by recorded PID; check argv first in case a PID was reused.
    for pid in "${_HOSTS_PIDS[@]}"; do
        cmd=$(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline") || continue
        if [ -n "$_HOSTS_MYDIR" ] && [[ $cmd == *"$_HOSTS_MYDIR/"* ]]; then
            mine+=("$pid")
        fi
    done
    _hosts_stop "${mine[@]}"
    # Whatever still runs inside our namespaces was started through them
    # (ssh sessions, remote commands, hosts_exec): stop it too.
    for ns in "${_HOSTS_CREATED[@]}"; do
        for pid in $(ip netns pids "$ns" 2>/dev/null); do
            [ "$pid" = "$$" ] || [ "$pid" = "${BASHPID:-}" ] || left+=("$pid")
        done
    done
    _hosts_stop "${left[@]}"
    for ns in "${_HOSTS_CREATED[@]}"; do
        ip netns del "$ns" 2>/dev/null || true
    done
    if [ -n "$_HOSTS_MYDIR" ] && [[ $_HOSTS_MYDIR == /tmp/dsh* ]]; then
        rm -rf "$_HOSTS_MYDIR"
    fi
    _HOSTS_PIDS=()
    _HOSTS_CREATED=()
    _HOSTS_MYDIR=""
    _HOSTS_PREFIX=""
    unset HOSTS_IPS HOSTS_NS HOSTS_DIR HOSTS_SSH_CONFIG HOSTS_SSH
    return 0
}

#!/usr/bin/env bash
# MXNet dist kvstore with 2-bit compression on a slow link: 2 fake hosts (network
# namespaces with their own sshd, tests/launcher/lib/hosts.sh), each host's link shaped
# to 1 Gbit/s with tc tbf; dshim-run -H over ssh places the scheduler on host 0, server i
# and worker i on host i, so every push and pull crosses the shaped link.  Runs
# bench/mxnet_bench.py --compression (dshim and ps-lite, uncompressed and 2-bit) and
# writes its section of docs/benchmarks.md (or --out FILE).  Needs root.
#   bench/mxnet_netns_bench.sh [--reps N] [--out FILE]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
build=${DSHIM_BUILD_DIR:-$root/build}
reps=3
out=$root/docs/benchmarks.md
while [ $# -gt 0 ]; do
    case $1 in
        --reps) reps=$2; shift 2 ;;
        --out) out=$(realpath -m "$2"); shift 2 ;;
        *) echo "usage: $0 [--reps N] [--out FILE]" >&2; exit 2 ;;
    esac
done
# shellcheck source=../tests/launcher/lib/hosts.sh
source "$root/tests/launcher/lib/hosts.sh"
if ! why=$(hosts_available); then
    echo "mxnet_netns_bench: cannot make fake hosts: $why" >&2
    exit 1
fi
work=$(mktemp -d /tmp/mxnet_netns_bench.XXXXXX)
chmod 755 "$work"
cleanup() { hosts_down; rm -rf "$work"; }
trap cleanup EXIT
trap 'exit 143' TERM INT
hosts_up 2
for i in 0 1; do
    hosts_exec "$i" tc qdisc replace dev eth0 root tbf rate 1gbit burst 256kb latency 50ms
done
hosts_write_hostfile "$work/hosts"
cd "$root"
title="2 network namespaces (hosts) joined by a bridge, each link shaped to 1 Gbit/s (tc tbf); dshim-run -n 2 -s 2 -H over ssh: scheduler on host 0, server i and worker i on host i"
hosts_exec 0 env DSHIM_RUN_SSH="$HOSTS_SSH" "$root/.venv-mxnet/bin/python" "$root/bench/mxnet_bench.py" \
    --reps "$reps" --iters 10 --steps 20 --build "$build" --out "$out" \
    --launch-args "-H $work/hosts --launcher ssh" --title "$title" \
    --section "## MXNet dist kvstore on 2 hosts with 1 Gbit/s links: dshim vs ps-lite"
hosts_exec 0 env DSHIM_RUN_SSH="$HOSTS_SSH" "$root/.venv-mxnet/bin/python" "$root/bench/mxnet_bench.py" \
    --compression --reps "$reps" --iters 10 --build "$build" --out "$out" \
    --launch-args "-H $work/hosts --launcher ssh" --title "$title"

#!/usr/bin/env bash
# Two "hosts" as network namespaces joined by a veth pair (10.77.x.1 and
# 10.77.x.2), two ranks in each: rendezvous across the link, TCP between the
# hosts (chosen by routing, never loopback), shared memory inside each, and
# the hierarchical allreduce.  dshim-bench checks every result.
# Skips (exit 77) where namespaces cannot be made (not root, no iproute2).
set -uo pipefail
bench=$1
id=$$
a=dshim-t$id-a
b=dshim-t$id-b
net=10.77.$((id % 250)).
pids=()

cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    ip netns del "$a" 2>/dev/null
    ip netns del "$b" 2>/dev/null
}
trap cleanup EXIT

if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null || ! ip netns add "$a" 2>/dev/null; then
    echo "SKIP: cannot create network namespaces here (need root and iproute2)"
    exit 77
fi
ip netns add "$b"
ip -n "$a" link add va type veth peer name vb netns "$b"
ip -n "$a" addr add "${net}1/24" dev va
ip -n "$b" addr add "${net}2/24" dev vb
for n in "$a" "$b"; do ip -n "$n" link set lo up; done
ip -n "$a" link set va up
ip -n "$b" link set vb up

port=$((20000 + id % 20000))
logdir=$(mktemp -d)
run_rank() {  # ns rank
    ip netns exec "$1" env RANK="$2" WORLD_SIZE=4 MASTER_ADDR="${net}1" MASTER_PORT=$port \
        DSHIM_JOB_TOKEN="netns-$id" DSHIM_TIMEOUT=60 DSHIM_DEBUG=INFO \
        timeout 120 "$bench" -o allreduce -b 4K -e 16M -f 16 -t 0.1 >"$logdir/r$2.out" 2>"$logdir/r$2.err" &
    pids+=($!)
}
run_rank "$a" 0
run_rank "$a" 1
run_rank "$b" 2
run_rank "$b" 3
fail=0
for i in 0 1 2 3; do
    wait "${pids[$i]}" || { echo "rank $i failed:"; cat "$logdir/r$i.err"; fail=1; }
done
pids=()
cat "$logdir/r0.out"
# correctness is checked by dshim-bench (the "check" column); the layout too:
grep -q "2 hosts; local rank" "$logdir/r0.err" || { echo "rank 0 did not see 2 hosts"; cat "$logdir/r0.err"; fail=1; }
if grep -q "data address 127\." "$logdir"/r*.err; then
    echo "a rank chose loopback for peers on another host"; fail=1
fi
grep -q FAIL "$logdir/r0.out" && fail=1
rm -rf "$logdir"
if [ $fail = 0 ]; then echo "two hosts: 1 passed, 0 failed"; else echo "two hosts: 0 passed, 1 failed"; fi
exit $fail

#!/usr/bin/env bash
# The main job, until the launcher and the PyTorch backend land: dshim's own
# benchmark across 2 processes on this host, over shared memory and then TCP,
# checking every result and printing nccl-tests-style bandwidth tables.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
echo "dshim demo: allreduce across 2 processes (shared memory)"
"$BUILD"/bin/dshim-bench -n 2 -o allreduce -d float32 -r sum -b 4K -e 64M -f 8 -t 0.3
echo
echo "dshim demo: the same over TCP (DSHIM_TRANSPORT=tcp, as between hosts)"
DSHIM_TRANSPORT=tcp "$BUILD"/bin/dshim-bench -n 2 -o allreduce -d float32 -r sum -b 4K -e 64M -f 8 -t 0.3
echo
echo "dshim demo: 4 processes, allgather and reduce_scatter"
"$BUILD"/bin/dshim-bench -n 4 -o allgather -b 64K -e 16M -f 16 -t 0.2
"$BUILD"/bin/dshim-bench -n 4 -o reduce_scatter -b 64K -e 16M -f 16 -t 0.2

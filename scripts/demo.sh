#!/usr/bin/env bash
# The main job, until the PyTorch backend lands (issue 6): dshim's own
# benchmark started by the dshim-run launcher across 2 and 4 processes on
# this host, over shared memory and then TCP, checking every result and
# printing nccl-tests-style bandwidth tables.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
RUN=("$BUILD"/bin/dshim-run --master-port 0 --no-python)
BENCH="$BUILD"/bin/dshim-bench
echo "dshim demo: dshim-run --nproc-per-node 2 dshim-bench allreduce (shared memory)"
"${RUN[@]}" --nproc-per-node 2 "$BENCH" -o allreduce -d float32 -r sum -b 4K -e 64M -f 8 -t 0.3
echo
echo "dshim demo: the same over TCP (DSHIM_TRANSPORT=tcp, as between hosts)"
DSHIM_TRANSPORT=tcp "${RUN[@]}" --nproc-per-node 2 "$BENCH" -o allreduce -d float32 -r sum -b 4K -e 64M -f 8 -t 0.3
echo
echo "dshim demo: 4 processes, allgather and reduce_scatter"
"${RUN[@]}" --nproc-per-node 4 "$BENCH" -o allgather -b 64K -e 16M -f 16 -t 0.2
"${RUN[@]}" --nproc-per-node 4 "$BENCH" -o reduce_scatter -b 64K -e 16M -f 16 -t 0.2

#!/usr/bin/env bash
# The main job: an unmodified PyTorch DDP script (examples/ddp_train.py, which
# asks for torch's default backend) started by dshim-run on 2 processes of
# this machine.  dshim-run preloads libdshim.so, so the process group is
# carried by dshim (the "dshim: carrying backend" line), the loss goes down,
# and DSHIM_SUMMARY=1 prints what dshim carried.  Then dshim's own benchmark
# across 2 processes over shared memory and TCP, checking every result.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
export PATH="$PWD/.venv/bin:$PATH"   # the project's python (torch 2.11 + the dshim backend)
RUN=("$BUILD"/bin/dshim-run --master-port 0)
echo "dshim demo: dshim-run --nproc-per-node 2 examples/ddp_train.py --steps 50"
DSHIM_SUMMARY=1 "${RUN[@]}" --nproc-per-node 2 examples/ddp_train.py --steps 50
echo
BENCH="$BUILD"/bin/dshim-bench
echo "dshim demo: dshim-run --nproc-per-node 2 dshim-bench allreduce (shared memory)"
"${RUN[@]}" --no-python --nproc-per-node 2 "$BENCH" -o allreduce -d float32 -r sum -b 4K -e 64M -f 8 -t 0.3
echo
echo "dshim demo: the same over TCP (DSHIM_TRANSPORT=tcp, as between hosts)"
DSHIM_TRANSPORT=tcp "${RUN[@]}" --no-python --nproc-per-node 2 "$BENCH" -o allreduce -d float32 -r sum -b 4K -e 64M -f 8 -t 0.3

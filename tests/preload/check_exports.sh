#!/usr/bin/env bash
# libdshim.so exports only the public API (dshim_*) and the hooks' framework
# symbols: everything else stays hidden so that preloading it never shadows a symbol of the application.
set -euo pipefail
lib=$1
# (shim/interpose exports dlsym, which forwards to glibc's: see shim/interpose/dlsym.c)
# (hooks/nccl exports the NCCL C API, nccl*/pnccl*: checked by tests/nccl/check_nccl_exports.sh)
bad=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBRVW]$/ {print $3}' | grep -v '^dshim_' | grep -vE '^p?nccl[A-Z]' | grep -vx 'dlsym' || true)
if [ -n "$bad" ]; then
    echo "unexpected exported symbols in $lib:"; echo "$bad"; exit 1
fi
n=$(nm -D --defined-only "$lib" | awk '$2 == "T"' | grep -c '^.* dshim_')
echo "exports: $n dshim_* functions, nothing else"
# every function of the public header is exported
missing=0
# nm's output read once: `nm | grep -q` dies of SIGPIPE under pipefail once the list is long
exported=$(nm -D --defined-only "$lib")
for f in $(grep -oE 'dshim_[a-z_]+\(' "$2" | tr -d '(' | sort -u); do
    if ! grep -q " $f\$" <<<"$exported"; then
        echo "declared in dshim.h but not exported: $f"; missing=1
    fi
done
[ $missing = 0 ]
echo "1 passed, 0 failed"

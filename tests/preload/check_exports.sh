#!/usr/bin/env bash
# libdshim.so exports only the public API (dshim_*): everything else stays
# hidden so that preloading it never shadows a symbol of the application.
set -euo pipefail
lib=$1
bad=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBRVW]$/ {print $3}' | grep -v '^dshim_' || true)
if [ -n "$bad" ]; then
    echo "unexpected exported symbols in $lib:"; echo "$bad"; exit 1
fi
n=$(nm -D --defined-only "$lib" | awk '$2 == "T"' | grep -c '^.* dshim_')
echo "exports: $n dshim_* functions, nothing else"
# every function of the public header is exported
missing=0
for f in $(grep -oE 'dshim_[a-z_]+\(' "$2" | tr -d '(' | sort -u); do
    if ! nm -D --defined-only "$lib" | grep -q " $f\$"; then
        echo "declared in dshim.h but not exported: $f"; missing=1
    fi
done
[ $missing = 0 ]
echo "1 passed, 0 failed"

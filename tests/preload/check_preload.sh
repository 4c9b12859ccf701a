#!/usr/bin/env bash
# LD_PRELOAD=libdshim.so must be harmless to any program that does not use
# it (no output, no change in behaviour, no crash), including Python.
set -euo pipefail
lib=$1
out=$(LD_PRELOAD="$lib" /bin/echo preload-ok)
[ "$out" = preload-ok ] || { echo "echo under LD_PRELOAD printed: $out"; exit 1; }
out=$(LD_PRELOAD="$lib" python3 -c 'print(6*7)' 2>&1)
[ "$out" = 42 ] || { echo "python under LD_PRELOAD printed: $out"; exit 1; }
# bad values in the environment do not break programs that never use dshim
out=$(DSHIM_TIMEOUT=abc LD_PRELOAD="$lib" /bin/echo still-ok 2>&1)
[ "$out" = still-ok ] || { echo "a bad DSHIM_TIMEOUT broke an unrelated program: $out"; exit 1; }
echo "3 passed, 0 failed"

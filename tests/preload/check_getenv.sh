#!/usr/bin/env bash
# One config table is the only place environment variables are read:
# getenv/secure_getenv may appear in shim/base/config.c only.
set -euo pipefail
cd "$1"
hits=$(grep -rnE '\b(secure_)?getenv\s*\(' shim backends hooks launcher tools 2>/dev/null | grep -v '^shim/base/config.c:' | grep -vE '^[^:]+:[0-9]+:\s*(/?\*|//)' || true)
if [ -n "$hits" ]; then
    echo "getenv outside shim/base/config.c:"; echo "$hits"; exit 1
fi
echo "1 passed, 0 failed"

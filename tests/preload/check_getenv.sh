#!/usr/bin/env bash
# One config table is the only place environment variables are read:
# getenv/secure_getenv may appear in base/config.c only.
set -euo pipefail
cd "$1"
hits=$(grep -rnE '\b(secure_)?getenv\s*\(' base shim backends hooks launcher analyser tools 2>/dev/null | grep -v '^base/config.c:' | grep -vE '^[^:]+:[0-9]+:\s*(/?\*|//)' || true)
if [ -n "$hits" ]; then
    echo "getenv outside base/config.c:"; echo "$hits"; exit 1
fi
echo "1 passed, 0 failed"

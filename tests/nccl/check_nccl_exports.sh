#!/usr/bin/env bash
# libdshim.so exports the whole NCCL C API: every function declared in the
# installed nccl.h (a symbol left to the real libnccl would get dshim's
# communicator and crash), as a function, plus the host functions of
# nccl_device.h; nothing else named nccl*.  With a real libnccl.so given,
# every function it exports is exported by libdshim.so too, except the
# device API's inline helpers, which callers compile in.
#   check_nccl_exports.sh LIBDSHIM NCCL_H [REAL_LIBNCCL]
set -euo pipefail
lib=$1 header=$2 real=${3:-}
inc=$(dirname "$header")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# declarations after the preprocessor (no comments, no macros); cuda_runtime.h
# is looked up next to nccl.h
gcc -E -P -I"$inc" -x c "$header" \
    | grep -oE '\bp?nccl[A-Z][A-Za-z0-9_]*[[:space:]]*\(' | tr -d '( \t' | sort -u > "$tmp/declared"
# nccl_device.h is C++: its extern "C" host functions, by name
{ cat "$inc"/nccl_device/*.h 2>/dev/null || true; } \
    | grep -E '^NCCL_EXTERN_C[[:space:]]+__host__[[:space:]]' | grep -oE '\bnccl[A-Z][A-Za-z0-9_]*[[:space:]]*\(' | tr -d '( \t' \
    | sed 'p;s/^/p/' | sort -u > "$tmp/device"
nm -D --defined-only "$lib" | awk '$2 == "T" || $2 == "W" || $2 == "i" {print $3}' \
    | grep -E '^p?nccl[A-Z]' | sort -u > "$tmp/exported"
nm -D --defined-only "$lib" | awk '$2 != "T" && $2 != "W" && $2 != "i" {print $3}' \
    | grep -E '^p?nccl[A-Z]' > "$tmp/not_functions" || true
nd=$(wc -l < "$tmp/declared")
missing=$(comm -23 "$tmp/declared" "$tmp/exported")
extra=$(comm -13 <(sort -u "$tmp/declared" "$tmp/device") "$tmp/exported")
rc=0
if [ "$nd" -lt 40 ]; then
    echo "only $nd functions found in $header: is it nccl.h?"; rc=1
fi
if [ -n "$missing" ]; then
    echo "declared in $header but not exported by $lib:"; echo "$missing"; rc=1
fi
missing_dev=$(comm -23 "$tmp/device" "$tmp/exported")
if [ -n "$missing_dev" ]; then
    echo "host functions of nccl_device.h not exported by $lib:"; echo "$missing_dev"; rc=1
fi
if [ -n "$extra" ]; then
    echo "exported by $lib but declared neither in nccl.h nor in nccl_device.h:"; echo "$extra"; rc=1
fi
if [ -s "$tmp/not_functions" ]; then
    echo "nccl symbols that are not functions:"; cat "$tmp/not_functions"; rc=1
fi
if [ -n "$real" ]; then
    nm -D --defined-only "$real" | awk '{print $3}' | sed 's/@.*//' | grep -E '^p?nccl[A-Z]' \
        | grep -vE '^ncclResetDebugInitInternal$' | sort -u > "$tmp/real"
    not_ours=$(comm -23 "$tmp/real" "$tmp/exported")
    if [ -n "$not_ours" ]; then
        echo "exported by $real but not by $lib:"; echo "$not_ours"; rc=1
    fi
    echo "$real: $(wc -l < "$tmp/real") API functions, all exported by libdshim.so: $([ -z "$not_ours" ] && echo yes || echo no)"
fi
ver=$(grep -E '^#define NCCL_VERSION_CODE' "$header" | awk '{print $3}')
echo "nccl.h $ver: $nd functions declared, $(wc -l < "$tmp/device") in nccl_device.h; $(wc -l < "$tmp/exported") exported by libdshim.so"
if [ $rc = 0 ]; then echo "1 passed, 0 failed"; else echo "0 passed, 1 failed"; fi
exit $rc

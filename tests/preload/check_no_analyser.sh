#!/bin/sh
# The flight recorder's analyser (analyser/, the static library dshim_analyser) is
# for dshim-run and the tests: none of its functions may be linked into
# libdshim.so, which every rank loads.  The list comes from the archive itself,
# so a new analyser file is covered without editing this script.
# Usage: check_no_analyser.sh LIBDSHIM_SO LIBDSHIM_ANALYSER_A
set -eu
lib=$1
archive=$2
list=$(mktemp)
trap 'rm -f "$list"' EXIT
nm -g --defined-only "$archive" | awk '$2 == "T" { print $3 }' | sort -u > "$list"
if [ ! -s "$list" ]; then
    echo "no function found in $archive"
    exit 1
fi
# the recorder's own functions must be there: a stripped library proves nothing
if ! nm "$lib" | awk '{ print $NF }' | grep -qx dshim_trace_open; then
    echo "$lib has no symbol table (stripped?): cannot check"
    exit 1
fi
found=$(nm "$lib" | awk '{ print $NF }' | grep -Fx -f "$list" || true)
if [ -n "$found" ]; then
    echo "libdshim.so contains functions of the analyser (analyser/ must stay out of it):"
    echo "$found"
    exit 1
fi
echo "$(wc -l < "$list") analyser functions, none in $lib"
echo "1 passed, 0 failed"

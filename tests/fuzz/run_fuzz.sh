#!/usr/bin/env bash
# One fuzz target for a bounded time, as ctest runs it (label fuzz):
#   run_fuzz.sh BINARY CORPUS_DIR SECONDS ARTIFACT_DIR
# libFuzzer works on a copy of the seed corpus in a temp dir (the repo's corpus is not
# modified; every seed is run first, so a regression input fails at once), stops after
# SECONDS, and fails on any crash, leak, timeout (5 s per input), memory limit or
# sanitizer report.  Prints libFuzzer's final line (cov/ft) and executions per second.
# A failing input is kept in ARTIFACT_DIR; replay it with `BINARY ARTIFACT_DIR/crash-…`.
set -uo pipefail
bin=$1 corpus=$2 secs=${3:-20} artifacts=${4:-}
name=$(basename "$bin")
work=$(mktemp -d "${TMPDIR:-/tmp}/dshim-$name.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/corpus" "$work/out"
cp "$corpus"/* "$work/corpus/" 2>/dev/null
dict=()
[ -f "$corpus.dict" ] && dict=(-dict="$corpus.dict")
# stdout/stderr of the code under test are closed (-close_fd_mask=3): its refusals would
# print one line per input; libFuzzer and the sanitizers still report on stderr
"$bin" -max_total_time="$secs" -timeout=5 -rss_limit_mb=2048 -max_len=16384 -close_fd_mask=3 \
    -print_final_stats=1 -artifact_prefix="$work/out/" "${dict[@]}" "$work/corpus" >"$work/log" 2>&1
rc=$?
final=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$work/log" | tail -1)
runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log")
rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$work/log")
seeds=$(ls "$corpus" | wc -l)
echo "$name: ${final:-no final line} | ${runs:-?} runs, ${rate:-?} exec/s, $seeds seeds"
if [ $rc != 0 ] || [ -z "$final" ]; then
    echo "$name: FAILED (exit $rc); libFuzzer's log:"
    tail -60 "$work/log"
    if [ -n "$artifacts" ] && ls "$work/out/"* >/dev/null 2>&1; then
        mkdir -p "$artifacts" && cp "$work/out/"* "$artifacts/"
        echo "$name: failing input(s) kept in $artifacts: $(ls "$work/out" | tr '\n' ' ')"
    fi
    exit 1
fi
exit 0

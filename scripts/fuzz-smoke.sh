#!/usr/bin/env bash
# Smoke-runs every libFuzzer target for SECONDS over a temporary copy of its seed corpus
# (fuzz/corpus/<name>/, with fuzz/<name>.dict and fuzz/<name>.options when present). Fails if
# any target crashes, leaks, times out on an input or exceeds the memory limit; the crashing
# input is kept in BUILD_DIR/fuzz-artifacts/ and printed as hex.
# Usage: scripts/fuzz-smoke.sh BUILD_DIR SECONDS      (BUILD_DIR from the `fuzz` preset)
set -euo pipefail
if [ $# -ne 2 ]; then
  echo "usage: $0 BUILD_DIR SECONDS" >&2
  exit 2
fi
build=$1
seconds=$2
root="$(cd "$(dirname "$0")/.." && pwd)"
artifacts="$build/fuzz-artifacts"
mkdir -p "$artifacts"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

status=0
ran=0
for corpus in "$root"/fuzz/corpus/*/; do
  name=$(basename "$corpus")
  bin="$build/fuzz/fuzz_$name"
  if [ ! -x "$bin" ]; then
    echo "fuzz-smoke: missing fuzzer $bin for corpus $corpus" >&2
    status=1
    continue
  fi
  mkdir -p "$work/$name"
  cp -r "$corpus"/. "$work/$name/"
  dict=()
  [ -f "$root/fuzz/$name.dict" ] && dict=("-dict=$root/fuzz/$name.dict")
  # fuzz/<name>.options (OSS-Fuzz style, "max_len = N") raises the input size for targets whose
  # seeds are larger (a whole model directory).
  max_len=16384
  if [ -f "$root/fuzz/$name.options" ]; then
    v=$(sed -n 's/^max_len *= *\([0-9][0-9]*\) *$/\1/p' "$root/fuzz/$name.options")
    [ -n "$v" ] && max_len=$v
  fi
  echo "== fuzz $name for ${seconds}s ($(ls "$corpus" | wc -l) seeds)"
  if "$bin" "$work/$name" "${dict[@]}" -max_total_time="$seconds" -timeout=10 \
       -rss_limit_mb=2048 -max_len="$max_len" -print_final_stats=1 \
       -artifact_prefix="$artifacts/$name-" >"$work/$name.log" 2>&1; then
    grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$work/$name.log" || true
    echo "   $name: no crash"
  else
    status=1
    echo "fuzz-smoke: fuzz_$name FAILED" >&2
    tail -n 60 "$work/$name.log" >&2
    for f in "$artifacts/$name"-*; do
      [ -f "$f" ] && { echo "-- $f"; head -c 512 "$f" | od -A d -t x1z | head -n 20; } >&2
    done
  fi
  ran=$((ran + 1))
done
if [ "$ran" -eq 0 ]; then
  echo "fuzz-smoke: no corpora under fuzz/corpus" >&2
  exit 1
fi
exit $status

#!/usr/bin/env bash
# Faults on several ranks: a rank that cannot open its shard, a bad argument only one rank sees,
# a follower that crashes (SIGSEGV) or is killed (SIGKILL) mid-run, and a killed leader. Each
# must end every rank with a non-zero status within 10 s, with a message naming the rank and
# the reason; none may hang (the CTest timeout is the backstop).
#   tp_faults.sh ATTNRES MPIEXEC FIXTURES
set -euo pipefail
CLI=$1 MPIEXEC=$2 FIXTURES=$3
source "$(dirname "$0")/common.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
good=$FIXTURES/golden/tiny-a
run_args=(run --prompt-ids 1,2,3 --max-new-tokens 2 --threads 1)

# expect NAME PATTERN... -- COMMAND: COMMAND must fail within 10 s, its output matching every
# PATTERN (extended regexps).
expect() {
  local name=$1
  shift
  local patterns=()
  while [ "$1" != -- ]; do
    patterns+=("$1")
    shift
  done
  shift
  local t0 rc=0
  t0=$(date +%s.%N)
  timeout 30 "$@" >"$work/out" 2>&1 || rc=$?
  local secs
  secs=$(echo "$(date +%s.%N) - $t0" | bc)
  [ "$rc" -ne 0 ] || { cat "$work/out"; fail "$name: every rank exited 0"; }
  [ "$rc" -ne 124 ] || { cat "$work/out"; fail "$name: still running after 30 s"; }
  (($(echo "$secs < 10" | bc))) || { cat "$work/out"; fail "$name: took $secs s (limit 10)"; }
  for p in "${patterns[@]}"; do
    grep -Eq "$p" "$work/out" || { cat "$work/out"; fail "$name: no '$p' in the output"; }
  done
  echo "ok: $name (exit $rc after ${secs} s)"
}

# 1. Rank 1's model directory lacks the safetensors file (its share cannot be opened).
mkdir "$work/broken"
cp "$good/config.json" "$work/broken/"
expect "rank 1 cannot open its shard" "rank 1 of 2: .*broken" "no model.safetensors" -- \
  "$MPIEXEC" "${mpi_flags[@]}" -np 1 "$CLI" "${run_args[@]}" --model "$good" : \
  -np 1 "$CLI" "${run_args[@]}" --model "$work/broken"

# 2. A bad flag on rank 2 only.
expect "bad argument on rank 2 only" "rank 2 of 3: --dtype is 'f16'" -- \
  "$MPIEXEC" "${mpi_flags[@]}" -np 2 "$CLI" "${run_args[@]}" --model "$good" : \
  -np 1 "$CLI" "${run_args[@]}" --model "$good" --dtype f16

# 3-5. A long decode (bench: many repetitions) while a rank is killed.
long=(bench --model "$good" --prompt-tokens 4 --gen-tokens 64 --reps 100000 --threads 1)
kill_rank() {  # kill_rank RANK SIGNAL NAME PATTERN...
  local rank=$1 sig=$2 name=$3
  shift 3
  MPIRUN 3 "$CLI" "${long[@]}" >"$work/long" 2>&1 &
  local launcher=$! pid="" t
  for t in $(seq 100); do  # wait for the ranks, then for the decode to run
    for p in $(pgrep -f "attnres bench --model $good" || true); do
      if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$rank"; then
        pid=$p
      fi
    done
    [ -n "$pid" ] && break
    sleep 0.1
  done
  [ -n "$pid" ] || fail "$name: rank $rank never started"
  sleep 3
  local t0 rc=0
  t0=$(date +%s.%N)
  kill "-$sig" "$pid"
  local waited=0
  while kill -0 "$launcher" 2>/dev/null && [ "$waited" -lt 300 ]; do
    sleep 0.1
    waited=$((waited + 1))
  done
  if kill -0 "$launcher" 2>/dev/null; then
    kill -9 "$launcher"
    cat "$work/long"
    fail "$name: mpirun still running 30 s after the kill"
  fi
  wait "$launcher" || rc=$?
  local secs
  secs=$(echo "$(date +%s.%N) - $t0" | bc)
  [ "$rc" -ne 0 ] || { cat "$work/long"; fail "$name: exit status 0"; }
  (($(echo "$secs < 10" | bc))) || fail "$name: took $secs s (limit 10)"
  for p in "$@"; do
    grep -Eq "$p" "$work/long" || { cat "$work/long"; fail "$name: no '$p' in the output"; }
  done
  if pgrep -f "attnres bench --model $good" >/dev/null; then
    fail "$name: a rank is still running after mpirun ended"
  fi
  echo "ok: $name (exit $rc after ${secs} s)"
}
kill_rank 1 SEGV "follower crashes (SIGSEGV)" "rank 1" "signal 11|Segmentation fault"
kill_rank 2 KILL "follower killed (SIGKILL)" "rank 2" "signal 9|Killed"
kill_rank 0 KILL "leader killed (SIGKILL)" "rank 0" "signal 9|Killed"
echo "5 faults: every rank ended non-zero within 10 s with the rank and reason named"

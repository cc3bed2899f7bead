#!/usr/bin/env bash
# The user-facing commands under mpirun: `generate` prints the same text on 2 ranks as in one
# process, and `serve` on 2 ranks answers a completion with the single process's text, then
# stops cleanly on the SIGTERM mpirun forwards: within 10 s the leader reports "stopped" and
# every rank is gone. (Open MPI's mpirun itself exits 1 once it was signalled, whatever its ranks
# returned; one process must exit 0.)
#   tp_frontends.sh ATTNRES MPIEXEC MODEL_DIR
set -euo pipefail
CLI=$1 MPIEXEC=$2 MODEL=$3
source "$(dirname "$0")/common.sh"
work=$(mktemp -d)
trap 'kill "${server:-}" 2>/dev/null || true; rm -rf "$work"' EXIT

gen=(generate --model "$MODEL" --prompt "And God said" --max-new-tokens 12 --threads 1)
"$CLI" "${gen[@]}" >"$work/one.txt" 2>/dev/null || fail "generate: single process failed"
MPIRUN 2 "$CLI" "${gen[@]}" >"$work/two.txt" 2>"$work/two.err" ||
  { cat "$work/two.err"; fail "generate: mpirun -np 2 failed"; }
cmp "$work/one.txt" "$work/two.txt" || fail "generate: text on 2 ranks differs from one process"

# This script's servers, told apart from any other serve on the machine by their --alias.
marker=tp-frontends-$$
# Starts serve (command prefix in "$@"), sets $port once it is ready.
start_serve() {
  "$@" serve --model "$MODEL" --port 0 --quiet --threads 1 --alias "$marker" 2>"$work/serve.err" &
  server=$!
  for _ in $(seq 300); do
    grep -q "ready" "$work/serve.err" 2>/dev/null && break
    kill -0 "$server" 2>/dev/null || { cat "$work/serve.err"; fail "serve exited early"; }
    sleep 0.1
  done
  grep -q "ready" "$work/serve.err" || { cat "$work/serve.err"; fail "serve not ready in 30 s"; }
  port=$(grep -o 'listening on http://[^ ]*' "$work/serve.err" | sed 's/.*://')
}
completion() {  # PORT -> the generated text
  python3 - "$1" <<'PY'
import json, sys, urllib.request
body = json.dumps({"model": "m", "prompt": "And God said", "max_tokens": 12,
                   "temperature": 0}).encode()
req = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}/v1/completions", body,
                             {"Content-Type": "application/json"})
print(json.load(urllib.request.urlopen(req, timeout=60))["choices"][0]["text"])
PY
}
stop_serve() {  # EXPECTED_STATUS: SIGTERM; the status must come within 10 s
  kill -TERM "$server"
  for _ in $(seq 100); do
    kill -0 "$server" 2>/dev/null || break
    sleep 0.1
  done
  kill -0 "$server" 2>/dev/null && { kill -KILL "$server"; fail "serve: still running 10 s after SIGTERM"; }
  local rc=0
  wait "$server" || rc=$?
  server=
  [ "$rc" -eq "$1" ] || { cat "$work/serve.err"; fail "serve exited $rc after SIGTERM, not $1"; }
  grep -q "attnres serve: stopped" "$work/serve.err" ||
    { cat "$work/serve.err"; fail "serve did not stop cleanly on SIGTERM"; }
  ! grep -q "error" "$work/serve.err" || { cat "$work/serve.err"; fail "serve reported an error"; }
}

start_serve "$CLI"
one=$(completion "$port") || fail "serve: the single process's completion failed"
stop_serve 0
start_serve "$MPIEXEC" "${mpi_flags[@]}" -np 2 "$CLI"
two=$(completion "$port") || { cat "$work/serve.err"; fail "serve: completion on 2 ranks failed"; }
stop_serve 1
pgrep -f -- "--alias $marker" >/dev/null && fail "serve: a rank is still running"
[ "$one" = "$two" ] || fail "serve: 2 ranks answered '$two', one process '$one'"
echo "generate and serve on 2 ranks equal one process; serve stopped cleanly on SIGTERM"

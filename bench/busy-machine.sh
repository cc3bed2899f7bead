#!/usr/bin/env bash
# Decode on a quiet machine and with one core kept busy by a second process (a shell spin
# loop), side by side in one run, at each binary's default thread settings. With a second
# binary (an older build) both run under the same conditions, so the ratios compare.
#   bench/busy-machine.sh MODEL [BASELINE_ATTNRES] [GEN_TOKENS]
# Prints one line per (binary, condition): decode tok/s, the bandwidth probe of that run, and
# busy/quiet per binary.
set -euo pipefail
model=$1
baseline=${2:-}
gen=${3:-128}
here=$(cd "$(dirname "$0")/.." && pwd)
bins=("$here/build/release/attnres")
[ -n "$baseline" ] && bins+=("$baseline")

decode() {  # BINARY -> "tok/s GB/s"
  "$1" bench --model "$model" --prompt-tokens 32 --gen-tokens "$gen" --reps 3 --json 2>/dev/null |
    python3 -c 'import json,sys; j=json.load(sys.stdin); print(j["decode_tok_s"], j["stream_gb_s"])'
}

printf '%-48s %-6s %10s %10s %8s\n' binary load decode_t/s probe_GB/s busy/quiet
for b in "${bins[@]}"; do
  read -r quiet qbw < <(decode "$b")
  spin() { while :; do :; done; }
  spin &
  spinner=$!
  trap 'kill $spinner 2>/dev/null || true' EXIT
  sleep 0.5
  read -r busy bbw < <(decode "$b")
  kill "$spinner"
  wait "$spinner" 2>/dev/null || true
  printf '%-48s %-6s %10.2f %10.1f\n' "$b" quiet "$quiet" "$qbw"
  printf '%-48s %-6s %10.2f %10.1f %8.2f\n' "$b" busy "$busy" "$bbw" \
    "$(python3 -c "print($busy / $quiet)")"
done

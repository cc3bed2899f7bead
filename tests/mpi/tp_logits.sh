#!/usr/bin/env bash
# Exactness of tensor parallelism across processes: every logit `attnres run --dump-logits`
# writes is byte-identical (cmp) at P = 1, 2, 3 and 4 ranks (mpirun) to the single process's,
# in f32 and bf16, for one-shot prefill + decode (one sequence), and for chunked prefill (chunks
# of 3) + decode of three concurrent sequences in the batched engine (--prompts-file).
#   tp_logits.sh ATTNRES MPIEXEC MODEL FIXTURES   (MODEL: tiny-a, tiny-b or tp-odd)
set -euo pipefail
CLI=$1 MPIEXEC=$2 MODEL=$3 FIXTURES=$4
source "$(dirname "$0")/common.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ "$MODEL" = tp-odd ]; then
  "$CLI" make-model --preset tp-odd --out "$work/model" >/dev/null
  dir=$work/model
else
  dir=$FIXTURES/golden/$MODEL
fi
printf '1,2,3,4,5,6,7,8,9,10,11\n40 41 42\n7,8,9,10,11,12,13,14\n' >"$work/prompts"
runs=0
for dtype in f32 bf16; do
  for mode in oneshot batched-chunked; do
    case $mode in
      oneshot) args=(--prompt-ids 3,1,4,1,5,9,2,6,5 --chunk-size 4096) ;;
      batched-chunked) args=(--prompts-file "$work/prompts" --chunk-size 3) ;;
    esac
    common=(run --model "$dir" --dtype "$dtype" --max-new-tokens 5 --ignore-eos --threads 1 "${args[@]}")
    "$CLI" "${common[@]}" --dump-logits "$work/single.st" --overwrite >/dev/null 2>&1 ||
      fail "$MODEL $dtype $mode: single process failed"
    for np in 1 2 3 4; do
      MPIRUN "$np" "$CLI" "${common[@]}" --dump-logits "$work/np$np.st" --overwrite >"$work/out" 2>&1 ||
        { cat "$work/out"; fail "$MODEL $dtype $mode: mpirun -np $np failed"; }
      cmp "$work/single.st" "$work/np$np.st" ||
        fail "$MODEL $dtype $mode: logits at $np ranks differ from one process"
      runs=$((runs + 1))
    done
  done
done
echo "$MODEL: $runs runs on 1-4 ranks, every logit dump byte-identical to one process"

#!/usr/bin/env bash
# The README's main job on a fresh Debian 12 machine: install the dependencies, build the
# release preset, then run the embedded default model (models/kjv: a small AttnRes model with
# the Kimi-K3 graph, trained on the King James Bible, see models/README.md) unless
# ATTNRES_MODEL points at another model directory in the published layout: validate it,
# generate text from a prompt, and score the held-out text.
#   scripts/quickstart.sh ["prompt text"]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake --preset release
cmake --build --preset release
bin=build/release/attnres
model=${ATTNRES_MODEL:-models/kjv}
"$bin" inspect "$model" | sed -n '1,8p'
echo
echo "== generate (sampled, temperature 0.7, seed 1)"
"$bin" generate --model "$model" --prompt "${1:-And God said unto Moses,}" --max-new-tokens 64 \
  --temperature 0.7 --top-p 0.95 --seed 1
if [ "$model" = models/kjv ]; then
  echo
  echo "== perplexity on the held-out chapters (never trained on)"
  "$bin" perplexity --model "$model" --text models/kjv-heldout.txt
fi

#!/usr/bin/env bash
# The README's main job on a fresh Debian 12 machine: install the dependencies, build the
# release preset, write the embedded default model (a small synthetic checkpoint in the published
# Kimi-K3 layout with a byte-level tokenizer, unless ATTNRES_MODEL points at a real model
# directory), validate it, and generate text from a prompt.
#   scripts/quickstart.sh ["prompt text"]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake --preset release
cmake --build --preset release
bin=build/release/attnres
model=${ATTNRES_MODEL:-build/models/tiny}
if [ ! -f "$model/config.json" ]; then
  "$bin" make-model --preset tiny --out "$model"
fi
"$bin" inspect "$model" | sed -n '1,8p'
echo
echo "== generate (random weights: the text is noise; the pipeline is real)"
"$bin" generate --model "$model" --prompt "${1:-Hello from attnres}" --max-new-tokens 32 \
  --temperature 0.8 --seed 1

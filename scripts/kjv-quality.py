#!/usr/bin/env python3
"""The README's quality table for the KJV model: held-out perplexity and greedy agreement of the
engine's numeric choices against their references.

  python3 scripts/kjv-quality.py [--bin build/release/attnres] [--json OUT.json]

Each row runs `attnres perplexity --json` over models/kjv-heldout.txt and greedy generation
(`attnres run --ignore-eos --json`, --gen-tokens new tokens) from the opening words of several
held-out chapters, and compares with its reference row: the relative change of perplexity, and
the share of generated positions whose greedy token is the same as the reference's (and where
the first difference is). Standard library only; no torch needed.
"""

import argparse
import json
import math
import subprocess
import sys

# (name, reference name, model dir, dtype, kv dtype, chunk size)
ROWS = [
    ("f32 activations, f32 cache", None, "models/kjv", "f32", "f32", 4096),
    ("bf16 activations, f32 cache", "f32 activations, f32 cache", "models/kjv", "bf16", "f32",
     4096),
    ("bf16 activations, bf16 cache (default)", "bf16 activations, f32 cache", "models/kjv",
     "bf16", "bf16", 4096),
    ("bf16 activations, fp8 cache", "bf16 activations, bf16 cache (default)", "models/kjv",
     "bf16", "fp8", 4096),
    ("bf16 experts, f32", None, "models/kjv-bf16-experts", "f32", "f32", 4096),
    ("MXFP4 experts, f32", "bf16 experts, f32", "models/kjv", "f32", "f32", 4096),
    ("bf16 experts, bf16 (default flow)", None, "models/kjv-bf16-experts", "bf16", "bf16", 4096),
    ("MXFP4 experts, bf16 (default flow)", "bf16 experts, bf16 (default flow)", "models/kjv",
     "bf16", "bf16", 4096),
    ("default flow, chunk 64", "bf16 activations, bf16 cache (default)", "models/kjv", "bf16",
     "bf16", 64),
    ("default flow, chunk 1", "bf16 activations, bf16 cache (default)", "models/kjv", "bf16",
     "bf16", 1),
    ("f32, chunk 64", "f32 activations, f32 cache", "models/kjv", "f32", "f32", 64),
    ("f32, chunk 1", "f32 activations, f32 cache", "models/kjv", "f32", "f32", 1),
]


def sh(args):
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"error: {' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")
    return r.stdout


def prompts(binary, text_path, count, words):
    """The heading and first `words` words of the first `count` held-out chapters, as ids."""
    chapters = open(text_path).read().split("\n\n")[:count]
    out = []
    for ch in chapters:
        lines = ch.split("\n")
        text = lines[0] + "\n" + " ".join(lines[1].split()[:words])
        ids = json.loads(sh([binary, "tokenize", "--tokenizer", "models/kjv/tiktoken.model",
                             "--json", "--text", text]))
        out.append((text, ids))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default="build/release/attnres")
    ap.add_argument("--text", default="models/kjv-heldout.txt")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--prompt-words", type=int, default=6)
    ap.add_argument("--gen-tokens", type=int, default=240)
    ap.add_argument("--json", help="also write the results here")
    a = ap.parse_args()
    ps = prompts(a.bin, a.text, a.prompts, a.prompt_words)
    results = {}
    for name, ref, model, dtype, kv, chunk in ROWS:
        flags = ["--model", model, "--dtype", dtype, "--kv-dtype", kv, "--chunk-size", str(chunk)]
        ppl = json.loads(sh([a.bin, "perplexity", "--text", a.text, "--json", "--quiet"] + flags))
        gens = []
        for _, ids in ps:
            out = json.loads(sh([a.bin, "run", "--prompt-ids", ",".join(map(str, ids)),
                                 "--max-new-tokens", str(a.gen_tokens), "--ignore-eos",
                                 "--json"] + flags))
            gens.append(out["generated"])
        results[name] = {"model": model, "dtype": dtype, "kv_dtype": kv, "chunk_size": chunk,
                         "perplexity": ppl["perplexity"], "mean_nll": ppl["mean_nll"],
                         "scored_tokens": ppl["scored_tokens"], "generated": gens, "ref": ref}
        print(f"{name}: perplexity {ppl['perplexity']:.4f}", file=sys.stderr, flush=True)
    print(f"held-out text {a.text}: {results[ROWS[0][0]]['scored_tokens']} scored tokens; greedy "
          f"agreement over {a.prompts} prompts x {a.gen_tokens} generated tokens\n")
    print("| configuration | reference | perplexity | change | same greedy tokens | first "
          "difference at |")
    print("|---|---|---:|---:|---:|---|")
    for name, ref, *_ in ROWS:
        r = results[name]
        if ref is None:
            print(f"| {name} | - | {r['perplexity']:.4f} | - | - | - |")
            continue
        b = results[ref]
        change = r["perplexity"] / b["perplexity"] - 1
        same = total = 0
        firsts = []
        for g, h in zip(r["generated"], b["generated"]):
            same += sum(x == y for x, y in zip(g, h))
            total += len(h)
            diff = [i for i, (x, y) in enumerate(zip(g, h)) if x != y]
            firsts.append(str(diff[0]) if diff else "-")
        r["same_greedy"] = same / total
        r["first_difference"] = firsts
        print(f"| {name} | {ref} | {r['perplexity']:.4f} | {100 * change:+.3f}% | "
              f"{100 * same / total:.1f}% | {', '.join(firsts)} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"prompts": [p for p, _ in ps], "gen_tokens": a.gen_tokens,
                       "rows": results}, f, indent=1)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_model_dir (fuzz/corpus/model_dir/) from the golden tiny models.

Each seed is a model directory in the fuzzer's input format (fuzz/fuzz_model_dir.cpp): sections
"==> NAME <==" followed by the file's bytes, a safetensors section holding only the header JSON.
The golden headers (200-280 KB) are too large for a useful seed, so each model is shrunk to two
layers that keep both attention kinds and both FFN kinds: layer 0 (KDA, dense MLP) and the first
MLA layer (an MoE layer) renumbered 1, with 2 routed experts; the config says the same, and the
header keeps those tensors with their dtypes and shapes (the router's [E, d] and bias [E] cut to
2 experts), laid out contiguously. Seeds:
  tiny_a          tiny-a shrunk, with a byte-level tokenizer (256 ranks + Kimi's 256 control ids)
  tiny_b          tiny-b shrunk, no tokenizer
  tiny_a_sharded  tiny-a shrunk in two shards and an index
  regress_sources_65   64 layers with attn_res_block_size 1: the config is refused (65 sources
                       per read, more than the kernels hold) before any tensor is bound
Usage: scripts/gen-fuzz-model-seeds.py   (stdlib only; deterministic)
"""
import base64
import json
import os
import re
import struct

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = os.path.join(ROOT, "tests", "fixtures", "golden")
OUT = os.path.join(ROOT, "fuzz", "corpus", "model_dir")
EXPERTS = 2
DTYPE_SIZE = {"F32": 4, "BF16": 2, "U8": 1, "F16": 2, "I64": 8}


def header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))


def shrink(name):
    d = os.path.join(GOLDEN, name)
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    tc = cfg["text_config"]
    mla = tc["linear_attn_config"]["full_attn_layers"][0] - 1  # 0-based
    keep = {0: 0, mla: 1}
    tc["num_hidden_layers"] = 2
    tc["linear_attn_config"]["full_attn_layers"] = [2]
    tc["linear_attn_config"]["kda_layers"] = [1]
    tc["num_experts"] = EXPERTS
    tc["num_experts_per_token"] = min(tc["num_experts_per_token"], 2)
    tensors = {}
    for key, v in header(os.path.join(d, "model.safetensors")).items():
        if key == "__metadata__":
            continue
        m = re.search(r"\.layers\.(\d+)\.", key)
        if m:
            layer = int(m.group(1))
            if layer not in keep:
                continue
            key = key.replace(".layers.%d." % layer, ".layers.%d." % keep[layer])
        e = re.search(r"\.experts\.(\d+)\.", key)
        if e and int(e.group(1)) >= EXPERTS:
            continue
        shape = list(v["shape"])
        if key.endswith("block_sparse_moe.gate.weight") or key.endswith(
                "e_score_correction_bias"):
            shape[0] = EXPERTS
        tensors[key] = {"dtype": v["dtype"], "shape": shape}
    return cfg, tensors


def layout(tensors):
    """The header JSON with contiguous offsets (largest element size first, padded with spaces
    so the data section starts on an 8-byte boundary, as writers do)."""
    out, offset = {}, 0
    for key in sorted(tensors, key=lambda k: (-DTYPE_SIZE[tensors[k]["dtype"]], k)):
        t = tensors[key]
        n = DTYPE_SIZE[t["dtype"]]
        for s in t["shape"]:
            n *= s
        out[key] = {"dtype": t["dtype"], "shape": t["shape"], "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(out, separators=(",", ":"))
    return text + " " * ((8 - (8 + len(text)) % 8) % 8)  # data section 8-byte aligned


def tokenizer(vocab):
    ranks = vocab - 256
    lines = [base64.b64encode(bytes([b])).decode() + " %d" % b for b in range(256)]
    names = {0: "[BOS]", 1: "[EOS]", 2: "<|end_of_msg|>", 3: "<|open|>", 4: "<|close|>",
             5: "<|sep|>", 254: "[UNK]", 255: "[PAD]"}
    added = {str(ranks + k): {"content": v, "special": True} for k, v in names.items()}
    return "\n".join(lines[:ranks]) + "\n", json.dumps({"added_tokens_decoder": added})


def section(name, body):
    return "==> %s <==\n%s" % (name, body)


def write(name, sections):
    text = "\n".join(section(n, b) for n, b in sections)
    with open(os.path.join(OUT, name), "w") as f:
        f.write(text)
    print("%s: %d bytes" % (name, len(text)))


def main():
    os.makedirs(OUT, exist_ok=True)
    cfg_a, t_a = shrink("tiny-a")
    ranks, tok_cfg = tokenizer(cfg_a["text_config"]["vocab_size"])
    compact = lambda c: json.dumps(c, separators=(",", ":"))
    write("tiny_a", [("config.json", compact(cfg_a)), ("model.safetensors", layout(t_a)),
                     ("tiktoken.model", ranks), ("tokenizer_config.json", tok_cfg)])
    cfg_b, t_b = shrink("tiny-b")
    write("tiny_b", [("config.json", compact(cfg_b)), ("model.safetensors", layout(t_b))])
    names = sorted(t_a)
    half = len(names) // 2
    shards = [{k: t_a[k] for k in names[:half]}, {k: t_a[k] for k in names[half:]}]
    files = ["model-%05d-of-00002.safetensors" % (i + 1) for i in range(2)]
    index = {"weight_map": {k: files[i] for i, s in enumerate(shards) for k in s}}
    write("tiny_a_sharded", [("config.json", compact(cfg_a)),
                             ("model.safetensors.index.json", compact(index)),
                             (files[0], layout(shards[0])), (files[1], layout(shards[1]))])
    big = json.loads(compact(cfg_a))
    tc = big["text_config"]
    tc["num_hidden_layers"] = 64
    tc["attn_res_block_size"] = 1
    tc["linear_attn_config"]["full_attn_layers"] = [l for l in range(1, 65) if l % 4 == 0]
    tc["linear_attn_config"]["kda_layers"] = [l for l in range(1, 65) if l % 4 != 0]
    write("regress_sources_65", [("config.json", compact(big)), ("model.safetensors", layout(t_a))])


if __name__ == "__main__":
    main()

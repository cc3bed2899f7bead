"""Exports a training run (train.py) in the published checkpoint layout, twice (routed experts in
MXFP4, the default; and in bf16, for comparison), and writes the reference logits the engine is
tested against (tests/unit/kjv/test_kjv_model.cpp).

  /usr/bin/python3 tools/train/export.py --run build/train [--engine build/release/attnres]

The reference logits come from this trainer's own forward (model.py) run in float64 on exactly
the values the engine computes with: bf16-rounded weights, F32 tensors as stored, and for the
MXFP4 model the dequantised experts. So the engine's f32 logits may differ from them only by its
own f32 arithmetic, which is what the 2e-3 bound of the test measures. With --engine, the
exported models are also run through `attnres run --dtype f32 --dump-logits` and compared here.
"""

import argparse
import json
import os
import shutil
import subprocess
import tempfile

import torch

import bpe
import checkpoint
import model as M

HELDOUT_WINDOWS = 4  # held-out windows whose trainer NLL the C++ test compares with the engine

PROMPTS = [
    "In the beginning God created",
    "And the LORD spake unto Moses, saying,",
    "The LORD is my shepherd; I shall not want.",
    "Blessed are the poor in spirit: for theirs is the kingdom of heaven. Blessed are they "
    "that mourn: for they shall be comforted. Blessed are the meek: for they shall inherit "
    "the earth.",
]


def load_run(run):
    ck = torch.load(os.path.join(run, "ckpt.pt"))
    cfg = M.Config(**ck["config"])
    model = M.Model(cfg)
    model.load_state_dict(ck["state_dict"])
    tok = bpe.Tokenizer.read(os.path.join(run, "tiktoken.model"))
    return model, tok


@torch.no_grad()
def reference_forward(cfg, values, prompts_ids):
    """Logits [T, V] per prompt from model.py in float64 with the engine's weight values; also
    the smallest router margin seen (k-th minus (k+1)-th biased score), which must stay well
    above f32 rounding for the selection to be the same in the engine."""
    ref = M.Model(cfg).double()
    state = ref.state_dict()
    for name, v in values.items():
        state[name] = v.double()
    ref.load_state_dict(state)
    for layer in ref.layers:
        if isinstance(layer.self_attn, M.KDA):
            layer.self_attn.chunked = False  # the recurrence itself, step by step
    margins = []

    def hook(moe, inp, out):
        x = inp[0].reshape(-1, inp[0].shape[-1])
        s = torch.sigmoid(x @ moe.gate.weight.t()) + moe.gate.e_score_correction_bias
        top = s.topk(cfg.num_experts_per_token + 1, dim=-1).values
        margins.append((top[:, -2] - top[:, -1]).min().item())

    for moe in ref.moe_layers():
        moe.register_forward_hook(hook)
    out = [ref(torch.tensor([ids]))[0].float() for ids in prompts_ids]
    return out, min(margins)


def fnv1a_ids(ids):
    """FNV-1a 64 over the ids as little-endian int32 (the C++ test hashes the same bytes)."""
    h = 0xcbf29ce484222325
    for b in torch.tensor(ids, dtype=torch.int32).numpy().astype("<i4").tobytes():
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


@torch.no_grad()
def window_nll(cfg, values, ids, window, count):
    """Mean NLL (float64 forward on the engine's weight values) of each of the first `count`
    windows of `window` tokens, scored as train.py's evaluation and `attnres perplexity`."""
    logits, _ = reference_forward(cfg, values, [ids[s:s + window] for s in
                                                range(0, window * count, window)])
    out = []
    for i, lg in enumerate(logits):
        w = torch.tensor(ids[i * window:(i + 1) * window])
        out.append(torch.nn.functional.cross_entropy(lg[:-1].double(), w[1:]).item())
    return out


def engine_logits(engine, model_dir, ids):
    with tempfile.TemporaryDirectory() as d:
        dump = os.path.join(d, "dump.safetensors")
        subprocess.run([engine, "run", "--model", model_dir, "--prompt-ids",
                        ",".join(map(str, ids)), "--max-new-tokens", "1", "--dtype", "f32",
                        "--dump-logits", dump], check=True, capture_output=True)
        with open(dump, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
            data = f.read()
        h = header["prefill_logits"]
        a, b = h["data_offsets"]
        return torch.frombuffer(bytearray(data[a:b]), dtype=torch.float32).reshape(h["shape"])


def write_fixture(path, prompts, ids, logits_by_variant, meta, extra):
    tensors = []
    for i, p in enumerate(ids):
        tensors.append((f"case{i}.prompt_ids", "I32", [len(p)],
                        torch.tensor(p, dtype=torch.int32).numpy().tobytes()))
        for variant, logits in logits_by_variant.items():
            tensors.append((f"case{i}.{variant}.logits", "F32", list(logits[i].shape),
                            checkpoint.tensor_bytes(logits[i], "F32")))
    size = {"F32": 4, "I32": 4}
    tensors.sort(key=lambda t: -size[t[1]])
    header, off = {}, 0
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data)
    header["__metadata__"] = meta
    text = json.dumps(header, separators=(",", ":"))
    text += " " * ((8 - (8 + len(text)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text.encode())
        for t in tensors:
            f.write(t[3])
    with open(os.path.splitext(path)[0] + ".json", "w") as f:
        json.dump({"prompts": prompts, "prompt_ids": ids, **meta, **extra}, f, indent=1)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", required=True, help="train.py output directory")
    ap.add_argument("--models", default="models", help="where the two model directories go")
    ap.add_argument("--name", default="kjv")
    ap.add_argument("--fixture", default="tests/fixtures/kjv/reference_logits.safetensors")
    ap.add_argument("--engine", help="attnres binary: also compare its f32 logits here")
    a = ap.parse_args()
    model, tok = load_run(a.run)
    cfg = model.c
    prompts_ids = [tok.encode(p) for p in PROMPTS]
    dirs = {"mxfp4": os.path.join(a.models, a.name),
            "bf16": os.path.join(a.models, a.name + "-bf16-experts")}
    logits, values_by_variant = {}, {}
    worst = 0.0
    for variant, d in dirs.items():
        values = checkpoint.export(model, tok, d, mxfp4=variant == "mxfp4",
                                   metadata={"format": "pt", "trained_by": "tools/train/train.py",
                                             "experts": variant})
        shutil.copy(os.path.join(a.run, "heldout.txt"), os.path.join(a.models, "kjv-heldout.txt"))
        values_by_variant[variant] = values
        logits[variant], margin = reference_forward(cfg, values, prompts_ids)
        size = os.path.getsize(os.path.join(d, "model.safetensors"))
        print(f"{d}: model.safetensors {size} bytes; smallest router margin {margin:.2e}")
        if a.engine:
            for ids, ref in zip(prompts_ids, logits[variant]):
                got = engine_logits(a.engine, d, ids)
                diff = (got - ref).abs().max().item()
                worst = max(worst, diff)
                print(f"  engine f32 vs trainer, {len(ids)} tokens: max |diff| {diff:.2e}")
    with open(os.path.join(a.run, "heldout.txt")) as f:
        held = tok.encode(f.read())
    window = cfg.max_position_embeddings
    held_nll = {v: window_nll(cfg, values_by_variant[v], held, window, HELDOUT_WINDOWS)
                for v in dirs}
    print(f"held-out NLL of the first {HELDOUT_WINDOWS} windows: {held_nll}")
    os.makedirs(os.path.dirname(a.fixture), exist_ok=True)
    write_fixture(a.fixture, PROMPTS, prompts_ids, logits,
                  {"model": a.name, "variants": "mxfp4 = models/" + a.name + ", bf16 = models/" +
                   a.name + "-bf16-experts", "computed_by": "tools/train/export.py (float64)"},
                  {"heldout_tokens": len(held), "heldout_ids_fnv1a": f"{fnv1a_ids(held):016x}",
                   "heldout_window": window, "heldout_window_nll": held_nll})
    print(f"wrote {a.fixture}")
    if a.engine:
        print(f"worst engine difference {worst:.2e}")
        if worst > 2e-3:
            raise SystemExit("error: the engine's f32 logits differ from the trainer's by more "
                             "than 2e-3")


if __name__ == "__main__":
    main()

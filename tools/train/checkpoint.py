"""Writing the model in the published Kimi-K3 checkpoint layout (k3-model.md §5, §6), as
src/synth/synth.cpp writes synthetic checkpoints and src/io/weights.cpp binds them:

  * config.json: top-level `kimi_k3` object with the text model in `text_config` (synth.cpp's
    k3_text_config with this model's sizes); routed experts in MXFP4 are announced by a
    `quantization_config` of format `mxfp4-pack-quantized`, bf16 experts by its absence.
  * model.safetensors: names `language_model.model.<canonical>` and
    `language_model.lm_head.weight`; F32 for the conv weights, A_log, dt_bias, o_norm and the
    router's selection bias, BF16 for everything else, U8 `weight_packed` / `weight_scale` for
    MXFP4 experts (two E2M1 codes per byte, low nibble first; one E8M0 scale per 32 along K).
  * tiktoken.model and tokenizer_config.json (bpe.py).

`engine_values()` returns the f32 values the engine computes with (bf16-rounded, MXFP4
dequantised), keyed by the trainer's parameter names, so the trainer can reproduce the
engine's weights exactly when it writes reference logits.
"""

import json
import os
import struct

import numpy as np
import torch

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
F32_SUFFIXES = ("conv1d.weight", "A_log", "dt_bias", "o_norm.weight", "e_score_correction_bias")


def mxfp4_quantize(w):
    """w [rows, K] (K % 32 == 0) -> (packed uint8 [rows, K/2], scale uint8 [rows, K/32]).
    Per block of 32 the E8M0 exponent is the smallest e with amax / 2^e <= 6 (no clipping) or
    one less (finer steps, the largest values clipped to 6), whichever gives the smaller squared
    error; elements round to the nearest E2M1 value."""
    rows, K = w.shape
    if K % 32:
        raise SystemExit(f"error: MXFP4 needs K % 32 == 0, got K = {K}")
    x = w.detach().double().reshape(rows, K // 32, 32)
    amax = x.abs().amax(-1)                                            # [rows, K/32]
    e_hi = torch.ceil(torch.log2(torch.clamp(amax, min=1e-30) / 6.0))
    best_err, best_codes, best_e = None, None, None
    for e in (e_hi, e_hi - 1):
        e = torch.clamp(e, -126, 127)
        y = (x.abs() / torch.exp2(e).unsqueeze(-1)).unsqueeze(-1)      # [rows, nb, 32, 1]
        idx = (y - E2M1.double()).abs().argmin(-1)                     # [rows, nb, 32]
        q = E2M1.double()[idx] * torch.exp2(e).unsqueeze(-1)
        err = ((q - x.abs()) ** 2).sum(-1)
        codes = idx | ((x < 0).long() << 3)
        if best_err is None:
            best_err, best_codes, best_e = err, codes, e
        else:
            better = err < best_err
            best_codes = torch.where(better.unsqueeze(-1), codes, best_codes)
            best_e = torch.where(better, e, best_e)
            best_err = torch.minimum(err, best_err)
    best_e = torch.where(amax == 0, torch.zeros_like(best_e), best_e)
    codes = best_codes.reshape(rows, K)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)
    scale = (best_e + 127).to(torch.uint8)
    return packed, scale


def mxfp4_dequantize(packed, scale):
    lo, hi = packed.long() & 15, packed.long() >> 4
    codes = torch.stack([lo, hi], -1).reshape(packed.shape[0], -1)     # [rows, K]
    sign = torch.where(codes >= 8, -1.0, 1.0).double()
    vals = sign * E2M1.double()[codes & 7]
    s = torch.exp2(scale.double() - 127).repeat_interleave(32, dim=1)
    return vals * s


def bf16_round(t):
    return t.detach().float().to(torch.bfloat16).float()


def canonical_tensors(model):
    """(canonical name, tensor, kind) for every exported weight, kind in {"f32", "bf16",
    "experts"}; expert tensors are [rows, K] matrices of experts.{e}.{w1,w2,w3}."""
    out = []
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if name.endswith("experts.w1") or name.endswith("experts.w2") or \
                name.endswith("experts.w3"):
            base, w = name.rsplit(".", 1)
            for e in range(t.shape[0]):
                out.append((f"{base}.{e}.{w}", t[e], "experts", name, e))
            continue
        canon = name
        for q in ("self_attention_res", "mlp_res", "output_attn_res"):
            canon = canon.replace(f"{q}.norm", f"{q}_norm.weight")
            canon = canon.replace(f"{q}.proj", f"{q}_proj.weight")
        kind = "f32" if canon.endswith(F32_SUFFIXES) else "bf16"
        out.append((canon, t, kind, name, None))
    return out


def published_name(canon):
    return "language_model." + canon if canon == "lm_head.weight" else \
        "language_model.model." + canon


def write_safetensors(path, tensors, metadata):
    """tensors: [(name, dtype str, shape, bytes)]. Largest elements first, so every tensor is
    aligned to its element size; header padded so the data starts on 8 bytes (as
    src/io/safetensors.cpp writes)."""
    size = {"F32": 4, "BF16": 2, "U8": 1}
    tensors = sorted(tensors, key=lambda t: -size[t[1]])
    header, off = {}, 0
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(data)]}
        off += len(data)
    header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":"))
    text += " " * ((8 - (8 + len(text)) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text.encode())
        for _, _, _, data in tensors:
            f.write(data)
    os.replace(tmp, path)


def tensor_bytes(t, dtype):
    if dtype == "F32":
        return t.detach().float().contiguous().numpy().astype("<f4").tobytes()
    if dtype == "BF16":
        return t.detach().float().to(torch.bfloat16).contiguous().view(torch.int16).numpy() \
            .astype("<i2").tobytes()
    return t.contiguous().numpy().astype(np.uint8).tobytes()


def text_config(c, mxfp4):
    L = c.num_hidden_layers
    tc = {
        "activation_situ_beta": c.situ_beta,
        "activation_situ_linear_beta": c.situ_linear_beta,
        "architectures": ["KimiLinearForCausalLM"],
        "attn_res_block_size": c.attn_res_block_size,
        "bos_token_id": c.vocab_size - 256,
        "eos_token_id": c.vocab_size - 254,
        "pad_token_id": c.vocab_size - 1,
        "dtype": "bfloat16",
        "first_k_dense_replace": 1,
        "hidden_act": "situ",
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "kv_lora_rank": c.kv_lora_rank,
        "latent_moe_use_norm": True,
        "linear_attn_config": {
            "full_attn_layers": c.full_attn_layers,
            "kda_layers": [l for l in range(1, L + 1) if l not in c.full_attn_layers],
            "gate_lower_bound": c.gate_lower_bound,
            "head_dim": c.kda_head_dim,
            "num_heads": c.kda_heads,
            "short_conv_kernel_size": c.conv_size,
            "use_full_rank_gate": True,
        },
        "max_position_embeddings": c.max_position_embeddings,
        "mla_use_nope": True,
        "mla_use_output_gate": True,
        "model_type": "kimi_linear",
        "moe_intermediate_size": c.moe_intermediate_size,
        "moe_layer_freq": 1,
        "moe_renormalize": True,
        "moe_router_activation_func": "sigmoid",
        "num_attention_heads": c.mla_heads,
        "num_expert_group": 1,
        "num_experts": c.num_experts,
        "num_experts_per_token": c.num_experts_per_token,
        "num_hidden_layers": L,
        "num_key_value_heads": c.mla_heads,
        "num_nextn_predict_layers": 0,
        "num_shared_experts": c.num_shared_experts,
        "q_lora_rank": c.q_lora_rank,
        "qk_nope_head_dim": c.qk_nope_head_dim,
        "qk_rope_head_dim": c.qk_rope_head_dim,
        "rms_norm_eps": c.rms_norm_eps,
        "routed_expert_hidden_size": c.routed_expert_hidden_size,
        "routed_scaling_factor": c.routed_scaling_factor,
        "tie_word_embeddings": False,
        "topk_group": 1,
        "topk_method": "noaux_tc",
        "use_cache": True,
        "use_grouped_topk": True,
        "v_head_dim": c.v_head_dim,
        "vocab_size": c.vocab_size,
    }
    if mxfp4:
        tc["quantization_config"] = {
            "format": "mxfp4-pack-quantized",
            "quant_method": "compressed-tensors",
            "quantization_status": "compressed",
            "config_groups": {"group_0": {
                "format": "mxfp4-pack-quantized", "targets": ["Linear"],
                "weights": {"group_size": 32, "num_bits": 4, "scale_dtype": "torch.uint8",
                            "strategy": "group", "symmetric": True, "type": "float"}}},
            "ignore": ["re:.*self_attn.*", "re:.*shared_experts.*",
                       "re:.*mlp\\.(gate|up|gate_up|down)_proj.*", "re:.*lm_head.*"],
        }
    return tc


def export(model, tokenizer, out_dir, mxfp4, metadata):
    """Writes the model directory; returns {trainer parameter name: f32 tensor the engine
    computes with} (engine_values)."""
    os.makedirs(out_dir, exist_ok=True)
    c = model.c
    files, values = [], {}
    for canon, t, kind, pname, e in canonical_tensors(model):
        pub = published_name(canon)
        if kind == "f32":
            files.append((pub, "F32", t.shape, tensor_bytes(t, "F32")))
            v = t.detach().float()
        elif kind == "bf16":
            files.append((pub, "BF16", t.shape, tensor_bytes(t, "BF16")))
            v = bf16_round(t)
        elif mxfp4:
            packed, scale = mxfp4_quantize(t)
            files.append((pub + ".weight_packed", "U8", packed.shape, tensor_bytes(packed, "U8")))
            files.append((pub + ".weight_scale", "U8", scale.shape, tensor_bytes(scale, "U8")))
            v = mxfp4_dequantize(packed, scale).float()
        else:
            files.append((pub + ".weight", "BF16", t.shape, tensor_bytes(t, "BF16")))
            v = bf16_round(t)
        if e is None:
            values[pname] = v
        else:
            values.setdefault(pname, [None] * c.num_experts)[e] = v
    values = {k: torch.stack(v) if isinstance(v, list) else v for k, v in values.items()}
    write_safetensors(os.path.join(out_dir, "model.safetensors"), files, metadata)
    root = {"architectures": ["KimiK3ForConditionalGeneration"], "model_type": "kimi_k3",
            "tie_word_embeddings": False, "bos_token_id": c.vocab_size - 256,
            "eos_token_id": c.vocab_size - 254, "pad_token_id": c.vocab_size - 1,
            "text_config": text_config(c, mxfp4)}
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        f.write(json.dumps(root, indent=2) + "\n")
    tokenizer.write(out_dir)
    return values

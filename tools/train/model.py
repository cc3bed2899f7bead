"""The Kimi-K3 text graph in PyTorch, written from ../shared/docs/k3-model.md (cited as §N) and
checked against the engine's scalar reference (src/model/forward.cpp, src/model/blocks.cpp,
src/kernels/*.cpp). Module and parameter names are the checkpoint's canonical names (§6), so
`state_dict()` keys are the exported tensor names (routed experts are stored stacked here and
split on export).

Everything runs in the dtype of the parameters (f32 for training, f64 for the reference logits
the engine is compared against); nothing is rounded to bf16 inside the graph.

One layer per section below: AttnRes read, KDA, MLA, latent MoE, dense MLP, decoder layer, model.
"""

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class Config:
    vocab_size: int = 4096
    hidden_size: int = 256
    num_hidden_layers: int = 8
    attn_res_block_size: int = 3      # B, in decoder layers (§2): ceil(8/3) = 3 bank slots
    rms_norm_eps: float = 1e-5
    # KDA (§3)
    kda_heads: int = 2
    kda_head_dim: int = 64            # d_k = d_v
    conv_size: int = 4
    gate_lower_bound: float = -5.0
    # MLA (§4)
    mla_heads: int = 4
    q_lora_rank: int = 128
    kv_lora_rank: int = 64
    qk_nope_head_dim: int = 32
    qk_rope_head_dim: int = 16        # "rope" part, used unrotated (NoPE)
    v_head_dim: int = 32
    # FFN (§5)
    intermediate_size: int = 512      # dense layer 0
    num_experts: int = 8
    num_experts_per_token: int = 2
    num_shared_experts: int = 1
    moe_intermediate_size: int = 128
    routed_expert_hidden_size: int = 128  # the latent width r
    routed_scaling_factor: float = 1.0
    situ_beta: float = 4.0
    situ_linear_beta: float = 25.0
    max_position_embeddings: int = 1024
    # 1-based MLA layers as published (§1): every 4th layer and the last one.
    full_attn_layers: list = field(default_factory=list)

    def __post_init__(self):
        if not self.full_attn_layers:
            L = self.num_hidden_layers
            self.full_attn_layers = [l for l in range(1, L + 1) if l % 4 == 0 or l == L]

    def is_mla(self, i):  # 0-based layer i
        return (i + 1) in self.full_attn_layers


MLA_LATENT_EPS = 1e-6   # q_a_layernorm / kv_a_layernorm eps of the official code (§4)
KDA_L2_EPS = 1e-6       # x / sqrt(sum(x^2) + eps) (§3)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def linear(i, o):
    return nn.Linear(i, o, bias=False)


def situ(g, u, b, bl):
    """SiTU-GLU (§5): b tanh(g/b) sigmoid(g) * bl tanh(u/bl); bounded in both inputs."""
    return b * torch.tanh(g / b) * torch.sigmoid(g) * (bl * torch.tanh(u / bl))


# ---------------------------------------------------------------------------------------------
# Block AttnRes read (§2). sources: [S, B, T, d] (bank slots then the running sum); q: [d].
# score_j = dot(v_j, q) / rms(v_j): the source's scale does not move its weight, only its
# direction does; softmax over sources, no 1/sqrt(d); the mixture is of the raw values.
# ---------------------------------------------------------------------------------------------
def attnres_read(sources, q, eps):
    v = torch.stack(sources)                                         # [S, B, T, d]
    score = (v @ q) * torch.rsqrt(v.pow(2).mean(-1) + eps)           # [S, B, T]
    p = torch.softmax(score, dim=0)
    return (p.unsqueeze(-1) * v).sum(0)                              # [B, T, d]


class ResQuery(nn.Module):
    """The pseudo-query of one read, stored as the checkpoint does: an RMSNorm gain [d] and a
    Linear(d, 1) [1, d]; the engine folds q = norm.weight * proj.weight (§2). proj starts at zero,
    so every read starts as the uniform average of its sources."""

    def __init__(self, d):
        super().__init__()
        self.norm = nn.Parameter(torch.ones(d))
        self.proj = nn.Parameter(torch.zeros(1, d))

    def q(self):
        return self.norm * self.proj[0]


# ---------------------------------------------------------------------------------------------
# KDA (§3): per-channel gated delta rule with the lower-bound gate.
#   S_t = Diag(a_t) S_{t-1};  S_t += beta_t k_t (v_t - S_t^T k_t)^T;  o_t = S_t^T q_t
# kda_recurrent() is that recurrence step by step (the definition); kda_chunked() computes the
# same in chunks of C tokens with a triangular solve per chunk (the WY form), which is what makes
# training affordable. selftest.py checks that the two agree.
# ---------------------------------------------------------------------------------------------
def kda_recurrent(q, k, v, g, beta):
    """q, k, g: [B, T, H, dk]; v: [B, T, H, dv]; beta: [B, T, H]. Returns o [B, T, H, dv]."""
    B, T, H, dk = k.shape
    S = k.new_zeros(B, H, dk, v.shape[-1])
    out = []
    for t in range(T):
        S = S * torch.exp(g[:, t]).unsqueeze(-1)
        kt = k[:, t]
        delta = (v[:, t] - torch.einsum("bhk,bhkv->bhv", kt, S)) * beta[:, t].unsqueeze(-1)
        S = S + kt.unsqueeze(-1) * delta.unsqueeze(-2)
        out.append(torch.einsum("bhk,bhkv->bhv", q[:, t], S))
    return torch.stack(out, 1)


def kda_chunked(q, k, v, g, beta, C=8):
    """The recurrence in chunks of C. With gc the cumulative log decay inside a chunk,
    Gamma_t = exp(gc_t), S0 the state at the chunk start and u_t = beta_t (v_t - S'_t^T k_t):
      (I + L) U = beta (V - (K Gamma) S0),  L[t,i] = beta_t sum_d k_t k_i exp(gc_t - gc_i), i < t
      O = (Q Gamma) S0 + Qk U,               Qk[t,i] = sum_d q_t k_i exp(gc_t - gc_i),   i <= t
      S_end = Gamma_C S0 + (K exp(gc_C - gc))^T U
    exp(gc_t - gc_i) is factored as Gamma_t / Gamma_i (two matmuls instead of a [C, C, dk]
    tensor). With the gate's lower bound -5 per token, |gc| <= 5 C = 40 for C = 8, so 1 / Gamma
    stays below e^40 and no product overflows f32 (the masked pairs t < i included)."""
    B, T, H, dk = k.shape
    dv = v.shape[-1]
    pad = (-T) % C
    if pad:  # zero keys, values, gates and betas at the end change nothing before them
        q, k, v, g = (F.pad(x, (0, 0, 0, 0, 0, pad)) for x in (q, k, v, g))
        beta = F.pad(beta, (0, 0, 0, pad))
    N = (T + pad) // C
    # [B, H, N, C, ...]
    q, k, g = (x.reshape(B, N, C, H, dk).permute(0, 3, 1, 2, 4) for x in (q, k, g))
    v = v.reshape(B, N, C, H, dv).permute(0, 3, 1, 2, 4)
    beta = beta.reshape(B, N, C, H).permute(0, 3, 1, 2).unsqueeze(-1)  # [B, H, N, C, 1]
    gc = g.cumsum(3)                                                   # [B, H, N, C, dk]
    Gam = torch.exp(gc)
    kG, kInv, qG = k * Gam, k * torch.exp(-gc), q * Gam
    strict = torch.ones(C, C, dtype=torch.bool, device=k.device).tril(-1)
    incl = torch.ones(C, C, dtype=torch.bool, device=k.device).tril()
    M = (kG @ kInv.transpose(-1, -2)).masked_fill(~strict, 0.0)        # [B, H, N, C, C]
    Qk = (qG @ kInv.transpose(-1, -2)).masked_fill(~incl, 0.0)
    A = torch.eye(C, dtype=k.dtype, device=k.device) + beta * M        # unit lower triangular
    rhs = torch.cat([beta * v, beta * kG], -1)
    sol = torch.linalg.solve_triangular(A, rhs, upper=False, unitriangular=True)
    U0, Wk = sol[..., :dv], sol[..., dv:]                              # U = U0 - Wk S0
    kEnd = k * torch.exp(gc[:, :, :, -1:] - gc)                        # decay to the chunk end
    GamEnd = Gam[:, :, :, -1].unsqueeze(-1)                            # [B, H, N, dk, 1]
    S = k.new_zeros(B, H, dk, dv)
    outs = []
    # unbind, not indexing: the backward of x[:, :, n] writes a zero tensor of x's full size
    # per chunk (quadratic in T); unbind's backward is one stack.
    per_chunk = (x.unbind(2) for x in (U0, Wk, qG, Qk, GamEnd, kEnd.transpose(-1, -2)))
    for U0n, Wkn, qGn, Qkn, Gn, kEndT in zip(*per_chunk):
        U = U0n - Wkn @ S                                              # [B, H, C, dv]
        outs.append(qGn @ S + Qkn @ U)
        S = Gn * S + kEndT @ U
    o = torch.stack(outs, 2)                                           # [B, H, N, C, dv]
    return o.permute(0, 2, 3, 1, 4).reshape(B, N * C, H, dv)[:, :T]


class KDA(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        d, H, dk = c.hidden_size, c.kda_heads, c.kda_head_dim
        P = H * dk
        self.H, self.dk, self.lb, self.eps = H, dk, c.gate_lower_bound, c.rms_norm_eps
        self.q_proj, self.k_proj, self.v_proj = linear(d, P), linear(d, P), linear(d, P)
        # Depthwise causal convolutions over the last conv_size inputs, as nn.Conv1d [P, 1, W].
        self.q_conv1d, self.k_conv1d, self.v_conv1d = (
            nn.Conv1d(P, P, c.conv_size, groups=P, bias=False) for _ in range(3))
        self.f_a_proj, self.f_b_proj = linear(d, dk), linear(dk, P)    # low-rank forget gate
        self.b_proj = linear(d, H)                                     # beta, one per head
        self.g_proj = linear(d, P)                                     # full-rank output gate
        self.A_log = nn.Parameter(torch.zeros(H))                      # per head (§3)
        self.dt_bias = nn.Parameter(torch.zeros(P))
        self.o_norm = RMSNorm(dk, c.rms_norm_eps)
        self.o_proj = linear(P, d)
        self.chunked = True

    def conv(self, conv, x):  # x [B, T, P]; y_t = SiLU(sum_j w_j x_{t-W+1+j})
        # As W shifted multiply-adds: on CPU several times faster than the depthwise
        # F.conv1d, whose backward dominated the layer.
        W, T = conv.weight.shape[-1], x.shape[1]
        xp = F.pad(x, (0, 0, W - 1, 0))                                # [B, W-1+T, P]
        w = conv.weight[:, 0]                                          # [P, W]
        y = xp[:, W - 1:] * w[:, W - 1]
        for j in range(W - 1):
            y = y + xp[:, j:j + T] * w[:, j]
        return F.silu(y)

    def forward(self, x):
        B, T, _ = x.shape
        H, dk = self.H, self.dk
        heads = lambda y: y.reshape(B, T, H, -1)
        q = heads(self.conv(self.q_conv1d, self.q_proj(x)))
        k = heads(self.conv(self.k_conv1d, self.k_proj(x)))
        v = heads(self.conv(self.v_conv1d, self.v_proj(x)))
        q = q * torch.rsqrt(q.pow(2).sum(-1, keepdim=True) + KDA_L2_EPS) / math.sqrt(dk)
        k = k * torch.rsqrt(k.pow(2).sum(-1, keepdim=True) + KDA_L2_EPS)
        # Lower-bound gate: g = lb * sigmoid(exp(A_log[h]) * (f + dt_bias)) in (lb, 0).
        f = self.f_b_proj(self.f_a_proj(x)) + self.dt_bias
        g = self.lb * torch.sigmoid(torch.exp(self.A_log)[:, None] * heads(f))
        beta = torch.sigmoid(self.b_proj(x))
        o = (kda_chunked if self.chunked else kda_recurrent)(q, k, v, g, beta)
        o = self.o_norm(o) * torch.sigmoid(heads(self.g_proj(x)))     # gated RMSNorm per head
        return self.o_proj(o.reshape(B, T, H * dk))


# ---------------------------------------------------------------------------------------------
# MLA (§4), NoPE and gated: latent queries and a 64-wide shared key part used without rotation.
# ---------------------------------------------------------------------------------------------
class MLA(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        d, H = c.hidden_size, c.mla_heads
        self.H, self.nope, self.rope, self.vd, self.r = (
            H, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim, c.kv_lora_rank)
        qw = self.nope + self.rope
        self.q_a_proj = linear(d, c.q_lora_rank)
        self.q_a_layernorm = RMSNorm(c.q_lora_rank, MLA_LATENT_EPS)
        self.q_b_proj = linear(c.q_lora_rank, H * qw)
        self.kv_a_proj_with_mqa = linear(d, self.r + self.rope)
        self.kv_a_layernorm = RMSNorm(self.r, MLA_LATENT_EPS)
        self.kv_b_proj = linear(self.r, H * (self.nope + self.vd))
        self.g_proj = linear(d, H * self.vd)
        self.o_proj = linear(H * self.vd, d)

    def forward(self, x):
        B, T, _ = x.shape
        H = self.H
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))).reshape(B, T, H, -1)
        kva = self.kv_a_proj_with_mqa(x)
        c_kv, k_rot = self.kv_a_layernorm(kva[..., :self.r]), kva[..., self.r:]  # the cache
        kv = self.kv_b_proj(c_kv).reshape(B, T, H, -1)
        k_nope, v = kv[..., :self.nope], kv[..., self.nope:]
        scale = 1.0 / math.sqrt(self.nope + self.rope)
        s = (torch.einsum("bthd,bshd->bhts", q[..., :self.nope], k_nope) +
             torch.einsum("bthd,bsd->bhts", q[..., self.nope:], k_rot)) * scale
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        p = torch.softmax(s.masked_fill(~causal, float("-inf")), -1)
        o = torch.einsum("bhts,bshd->bthd", p, v)
        o = o * torch.sigmoid(self.g_proj(x).reshape(B, T, H, self.vd))
        return self.o_proj(o.reshape(B, T, H * self.vd))


# ---------------------------------------------------------------------------------------------
# Latent MoE (§5): sigmoid router on the full-width x, top-k by score + selection bias (the bias
# picks, it never weighs), renormalised unbiased scores; routed experts run in an r-wide latent
# (down, experts, RMSNorm, up); one shared SiTU MLP at full width.
# ---------------------------------------------------------------------------------------------
class Experts(nn.Module):
    """E routed SiTU experts stacked: w1 (gate) [E, I, r], w3 (up) [E, I, r], w2 (down) [E, r, I].
    Exported as experts.{e}.{w1,w2,w3}."""

    def __init__(self, E, r, I):
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(E, I, r))
        self.w2 = nn.Parameter(torch.empty(E, r, I))
        self.w3 = nn.Parameter(torch.empty(E, I, r))


class Router(nn.Module):
    def __init__(self, d, E):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(E, d))
        # Aux-loss-free load balancing (DeepSeek-V3): a bias that only chooses, moved by the
        # trainer towards balanced loads, never by gradients.
        self.register_buffer("e_score_correction_bias", torch.zeros(E))


class SharedMLP(nn.Module):
    def __init__(self, d, I):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = linear(d, I), linear(d, I), linear(I, d)


class MoE(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        d, E, r, I = (c.hidden_size, c.num_experts, c.routed_expert_hidden_size,
                      c.moe_intermediate_size)
        self.c = c
        self.gate = Router(d, E)
        self.experts = Experts(E, r, I)
        self.shared_experts = SharedMLP(d, c.num_shared_experts * I)
        self.routed_expert_down_proj = linear(d, r)
        self.routed_expert_norm = RMSNorm(r, c.rms_norm_eps)
        self.routed_expert_up_proj = linear(r, d)
        self.last_load = None  # [E] tokens per expert in the last forward (for the bias update)

    def forward(self, x):
        c = self.c
        shape = x.shape
        x = x.reshape(-1, shape[-1])                                     # [N, d]
        s = torch.sigmoid(x @ self.gate.weight.t())                      # [N, E]
        ids = torch.topk(s + self.gate.e_score_correction_bias, c.num_experts_per_token,
                         dim=-1).indices                                  # [N, K]
        w = s.gather(-1, ids)
        w = w / (w.sum(-1, keepdim=True) + 1e-20) * c.routed_scaling_factor
        z = self.routed_expert_down_proj(x)                              # [N, r]
        y = torch.zeros_like(z)
        ex = self.experts
        for e in range(c.num_experts):
            tok, slot = (ids == e).nonzero(as_tuple=True)
            if tok.numel() == 0:
                continue
            ze = z[tok]
            h = situ(ze @ ex.w1[e].t(), ze @ ex.w3[e].t(), c.situ_beta, c.situ_linear_beta)
            y = y.index_add(0, tok, (h @ ex.w2[e].t()) * w[tok, slot].unsqueeze(-1))
        self.last_load = torch.bincount(ids.flatten(), minlength=c.num_experts).detach()
        routed = self.routed_expert_up_proj(self.routed_expert_norm(y))
        sh = self.shared_experts
        shared = sh.down_proj(situ(sh.gate_proj(x), sh.up_proj(x), c.situ_beta,
                                   c.situ_linear_beta))
        return (routed + shared).reshape(shape)


class DenseMLP(nn.Module):  # layer 0 (first_k_dense_replace = 1)
    def __init__(self, c: Config):
        super().__init__()
        self.c = c
        d, I = c.hidden_size, c.intermediate_size
        self.gate_proj, self.up_proj, self.down_proj = linear(d, I), linear(d, I), linear(I, d)

    def forward(self, x):
        return self.down_proj(situ(self.gate_proj(x), self.up_proj(x), self.c.situ_beta,
                                   self.c.situ_linear_beta))


# ---------------------------------------------------------------------------------------------
# Decoder layer and model with the Block AttnRes bank (§2), as src/model/forward.cpp:
#   h = read(q_attn, bank + [running])   (skipped at layer 0, where the bank is empty)
#   if i % B == 0: bank.append(running); running = None      (commit the raw running sum)
#   running = attn(input_layernorm(h)) (+ running)
#   h = read(q_mlp, bank + [running]);  running += mlp(post_attention_layernorm(h))
# and at the end logits = lm_head(norm(read(q_out, bank + [running]))). The last block (layers
# 6, 7 with B = 3, L = 8) is partial and never banked: only the final read sees it.
# ---------------------------------------------------------------------------------------------
class DecoderLayer(nn.Module):
    def __init__(self, c: Config, i):
        super().__init__()
        d = c.hidden_size
        self.input_layernorm = RMSNorm(d, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(d, c.rms_norm_eps)
        self.self_attention_res = ResQuery(d)  # exported as self_attention_res_{norm,proj}
        self.mlp_res = ResQuery(d)
        self.self_attn = MLA(c) if c.is_mla(i) else KDA(c)
        if i < 1:
            self.mlp = DenseMLP(c)
        else:
            self.block_sparse_moe = MoE(c)

    def ffn(self, x):
        return self.mlp(x) if hasattr(self, "mlp") else self.block_sparse_moe(x)


class Model(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.c = c
        d = c.hidden_size
        self.embed_tokens = nn.Embedding(c.vocab_size, d)
        self.layers = nn.ModuleList(DecoderLayer(c, i) for i in range(c.num_hidden_layers))
        self.output_attn_res = ResQuery(d)
        self.norm = RMSNorm(d, c.rms_norm_eps)
        self.lm_head = linear(d, c.vocab_size)

    def forward(self, tokens):
        """tokens [B, T] -> logits [B, T, V]."""
        c, eps = self.c, self.c.rms_norm_eps
        running = self.embed_tokens(tokens)
        bank = []
        for i, layer in enumerate(self.layers):
            h = attnres_read(bank + [running], layer.self_attention_res.q(), eps) if bank \
                else running
            if i % c.attn_res_block_size == 0:
                bank.append(running)
                running = None
            a = layer.self_attn(layer.input_layernorm(h))
            running = a if running is None else running + a
            h = attnres_read(bank + [running], layer.mlp_res.q(), eps)
            running = running + layer.ffn(layer.post_attention_layernorm(h))
        h = attnres_read(bank + [running], self.output_attn_res.q(), eps)
        return self.lm_head(self.norm(h))

    def moe_layers(self):
        return [l.block_sparse_moe for l in self.layers if hasattr(l, "block_sparse_moe")]


def init_weights(model: Model, seed):
    """GPT-style init (std 0.02, output projections 0.02 / sqrt(2 L)); norms 1; AttnRes queries
    0 (uniform mixtures); the KDA gate spread so channels start with decays
    exp(-5 sigmoid(z)) from ~0.975 to ~0.37 per token."""
    g = torch.Generator().manual_seed(seed)
    c = model.c
    out_std = 0.02 / math.sqrt(2 * c.num_hidden_layers)
    for name, p in model.named_parameters():
        if name.endswith("A_log") or name.endswith("dt_bias"):
            continue
        if "norm" in name.split(".")[-2] or name.endswith("layernorm.weight") or \
                name.endswith("_res.norm"):
            nn.init.ones_(p)
        elif name.endswith("_res.proj"):
            nn.init.zeros_(p)
        elif name.endswith("conv1d.weight"):
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=g) * (1.0 / math.sqrt(p.shape[-1])))
        else:
            std = out_std if (name.endswith("o_proj.weight") or name.endswith("down_proj.weight")
                              or name.endswith(".w2")) else 0.02
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=g) * std)
    for layer in model.layers:
        a = layer.self_attn
        if isinstance(a, KDA):
            with torch.no_grad():
                a.A_log.copy_(torch.log(1 + 15 * torch.rand(a.H, generator=g)))
                prob = 0.005 + 0.195 * torch.rand(a.dt_bias.shape, generator=g)
                z = torch.log(prob / (1 - prob))                        # sigmoid(z) = prob
                a.dt_bias.copy_(z / torch.exp(a.A_log).repeat_interleave(a.dk))

"""Trains the small Kimi-K3-graph model on the King James Bible (corpus.py) with a BPE tokenizer
trained on the same text (bpe.py). Seeded: the same command on the same packages gives the same
model (one thread; torch's CPU kernels are deterministic at a fixed thread count).

  /usr/bin/python3 tools/train/train.py --out build/train            # ~30 min on 2 cores
  /usr/bin/python3 tools/train/export.py --run build/train           # models/, fixture

Writes into --out: tiktoken.model + tokenizer_config.json, heldout.txt (the held-out chapters),
ckpt.pt (weights, config, selection biases), log.json (losses per step, held-out losses,
timings) and loss.png (the loss curve).
"""

import argparse
import ctypes
import json
import math
import os
import time

import torch
import torch.nn.functional as F

import bpe
import corpus
import model as M


def setup_runtime(threads):
    # Keep freed blocks instead of returning them to the kernel: without this every large
    # temporary is a fresh mmap whose pages fault in on first touch (glibc's default
    # M_MMAP_THRESHOLD / M_TRIM_THRESHOLD). Its gain was within this shared machine's noise.
    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(-3, 1 << 30)     # M_MMAP_THRESHOLD
    libc.mallopt(-1, 1 << 30)     # M_TRIM_THRESHOLD
    # KDA states decay by up to e^-5 per token: their smallest entries become subnormal, and
    # subnormal arithmetic made the state updates ~4x slower and a whole step 2.1x slower
    # (29.9 s -> 13.9 s, profiled, two threads). Flushed, they become 0 (they are < 1.2e-38).
    torch.set_flush_denormal(True)
    torch.set_num_threads(threads)


def batches(ids, T, B, gen):
    """Random windows of T + 1 tokens (input and shifted target) from the training stream."""
    n = ids.numel() - T - 1
    while True:
        starts = torch.randint(0, n, (B,), generator=gen)
        w = torch.stack([ids[s:s + T + 1] for s in starts])
        yield w[:, :-1], w[:, 1:]


def heldout_windows(ids, T):
    """Consecutive windows of at most T tokens; each scores its tokens 1.. from its own prefix
    (what `attnres perplexity --window T` does)."""
    return [ids[s:s + T] for s in range(0, ids.numel(), T) if ids[s:s + T].numel() >= 2]


@torch.no_grad()
def evaluate(model, windows, B):
    model.eval()
    total, count = 0.0, 0
    by_len = {}
    for w in windows:
        by_len.setdefault(w.numel(), []).append(w)
    for _, ws in sorted(by_len.items()):
        for i in range(0, len(ws), B):
            x = torch.stack(ws[i:i + B])
            logits = model(x[:, :-1])
            nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1),
                                  reduction="sum")
            total += nll.item()
            count += x[:, 1:].numel()
    model.train()
    return total / count, count


def update_selection_bias(model, rate):
    """Aux-loss-free balancing: raise the selection bias of under-loaded experts, lower it for
    over-loaded ones, by a fixed step (the bias never enters the weights or the gradients)."""
    for moe in model.moe_layers():
        load = moe.last_load.float()
        moe.gate.e_score_correction_bias += rate * torch.sign(load.mean() - load)


def lr_at(step, steps, peak, warmup):
    if step < warmup:
        return peak * (step + 1) / warmup
    p = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))


def plot(log, path):
    import warnings
    warnings.filterwarnings("ignore", message="The value of the smallest subnormal")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    steps = [r["step"] for r in log["train"]]
    loss = [r["loss"] for r in log["train"]]
    k = 20
    smooth = [sum(loss[max(0, i - k + 1):i + 1]) / len(loss[max(0, i - k + 1):i + 1])
              for i in range(len(loss))]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    ax.plot(steps, loss, color="#bbbbbb", lw=0.7, label="train (per step)")
    ax.plot(steps, smooth, color="#1f77b4", lw=1.5, label=f"train ({k}-step mean)")
    ev = log["eval"]
    ax.plot([r["step"] for r in ev], [r["heldout_loss"] for r in ev], "o-", color="#d62728",
            ms=3, label="held-out (subset)")
    if "final" in log:
        ax.axhline(log["final"]["heldout_loss"], color="#d62728", ls=":", lw=1,
                   label=f"held-out, all {log['final']['heldout_tokens']} tokens: "
                         f"{log['final']['heldout_loss']:.3f}")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats / token)")
    ax.set_ylim(bottom=min(smooth) - 0.3, top=min(9.0, max(loss) + 0.2))
    ax.set_title("KJV AttnRes model: training loss")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="run directory")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--bias-rate", type=float, default=5e-3,
                    help="step of the experts' selection-bias update")
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--eval-windows", type=int, default=8,
                    help="held-out windows in the periodic (subset) evaluation")
    ap.add_argument("--ranks", type=int, default=3840, help="BPE ranks (vocab = ranks + 256)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (1: on this shared 2-core machine, with other builds "
                         "running, a profiled step took 13.9 s with two threads that wait on "
                         "each other and 4.9 s with one)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    setup_runtime(a.threads)
    t0 = time.time()

    train_text, held_text = corpus.split_corpus()
    with open(os.path.join(a.out, "heldout.txt"), "w") as f:
        f.write(held_text)
    tok = bpe.Tokenizer(bpe.train(train_text, a.ranks))
    tok.write(a.out)
    train_ids = torch.tensor(tok.encode(train_text), dtype=torch.long)
    held_ids = torch.tensor(tok.encode(held_text), dtype=torch.long)
    t_tok = time.time() - t0
    print(f"tokenizer: {tok.n_ranks} ranks + 256 control ids; train {train_ids.numel()} tokens, "
          f"held-out {held_ids.numel()} tokens ({t_tok:.1f} s)", flush=True)

    torch.manual_seed(a.seed)
    cfg = M.Config(vocab_size=tok.vocab_size, max_position_embeddings=a.context)
    model = M.Model(cfg)
    M.init_weights(model, a.seed)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params} parameters, MLA layers (1-based) {cfg.full_attn_layers}",
          flush=True)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
    other = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": other, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    gen = torch.Generator().manual_seed(a.seed)
    data = batches(train_ids, a.context, a.batch, gen)
    windows = heldout_windows(held_ids, a.context)
    # The periodic evaluation uses a fixed, evenly spread subset of held-out windows.
    stride = max(1, len(windows) // a.eval_windows)
    subset = [w for w in windows[::stride] if w.numel() == a.context][:a.eval_windows]

    log = {"args": vars(a), "params": n_params, "train_tokens": train_ids.numel(),
           "heldout_tokens": held_ids.numel(), "tokenizer_seconds": t_tok,
           "train": [], "eval": []}
    t_train = time.time()
    for step in range(a.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, a.steps, a.lr, a.warmup)
        x, y = next(data)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).item()
        opt.step()
        with torch.no_grad():
            update_selection_bias(model, a.bias_rate)
        elapsed = time.time() - t_train
        log["train"].append({"step": step, "loss": loss.item(), "grad_norm": gnorm,
                             "seconds": elapsed})
        if step % 10 == 0 or step == a.steps - 1:
            loads = [m.last_load.tolist() for m in model.moe_layers()]
            print(f"step {step:4d} loss {loss.item():.4f} gnorm {gnorm:.2f} "
                  f"lr {opt.param_groups[0]['lr']:.2e} {elapsed:7.1f} s  "
                  f"load L1 {loads[0]}", flush=True)
        if (step + 1) % a.eval_every == 0 or step == a.steps - 1:
            hl, _ = evaluate(model, subset, a.batch)
            log["eval"].append({"step": step, "heldout_loss": hl})
            print(f"  held-out subset loss {hl:.4f}", flush=True)
    log["train_seconds"] = time.time() - t_train

    # Final figures: training loss = mean over the last 20 steps; held-out on every window.
    t_eval = time.time()
    hl, n = evaluate(model, windows, a.batch)
    last = [r["loss"] for r in log["train"][-20:]]
    log["final"] = {"train_loss_last20": sum(last) / len(last), "heldout_loss": hl,
                    "heldout_perplexity": math.exp(hl), "heldout_tokens": n,
                    "eval_seconds": time.time() - t_eval}
    log["total_seconds"] = time.time() - t0
    print(f"final: train loss (last 20 steps) {log['final']['train_loss_last20']:.4f}, "
          f"held-out loss {hl:.4f} (ppl {math.exp(hl):.2f}) over {n} tokens; "
          f"total {log['total_seconds']:.0f} s", flush=True)
    torch.save({"config": cfg.__dict__, "state_dict": model.state_dict(), "seed": a.seed},
               os.path.join(a.out, "ckpt.pt"))
    with open(os.path.join(a.out, "log.json"), "w") as f:
        json.dump(log, f, indent=1)
    plot(log, os.path.join(a.out, "loss.png"))


if __name__ == "__main__":
    main()

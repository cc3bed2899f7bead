"""How much the routed experts matter and how much MXFP4 changes them: the measurements behind
the README's explanation of the MXFP4 row of the quality table.

  /usr/bin/python3 tools/train/analyze_experts.py --run build/train [--windows 8]

Prints the relative error ||Q(W) - W|| / ||W|| of MXFP4 on every routed expert matrix (mean and
max), the ratio ||routed branch|| / ||shared branch|| of each MoE layer's outputs, and the
held-out loss of the first windows with the routed branch as trained and with it removed (its
output replaced by zeros), from the trainer's float32 forward.
"""

import argparse
import os

import torch
import torch.nn.functional as F

import checkpoint
import export
import train


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", required=True, help="train.py output directory")
    ap.add_argument("--windows", type=int, default=8, help="held-out windows to score")
    a = ap.parse_args()
    train.setup_runtime(1)
    model, tok = export.load_run(a.run)
    model.eval()

    errs = []
    for moe in model.moe_layers():
        for w in (moe.experts.w1, moe.experts.w2, moe.experts.w3):
            for e in range(w.shape[0]):
                q = checkpoint.mxfp4_dequantize(*checkpoint.mxfp4_quantize(w[e])).float()
                errs.append(((q - w[e]).norm() / w[e].norm()).item())
    print(f"MXFP4 relative error over {len(errs)} expert matrices: mean {sum(errs) / len(errs):.4f}"
          f", max {max(errs):.4f}")

    with open(os.path.join(a.run, "heldout.txt")) as f:
        held = torch.tensor(tok.encode(f.read()))
    W = model.c.max_position_embeddings
    x = torch.stack([held[i * W:(i + 1) * W] for i in range(a.windows)])
    norms, zero = [], [False]

    def up_hook(module, inp, out):  # the routed branch's output (routed_expert_up_proj)
        norms.append(["routed", out.norm().item()])
        return torch.zeros_like(out) if zero[0] else out

    def down_hook(module, inp, out):  # the shared expert's output
        norms[-1].append(out.norm().item())

    for moe in model.moe_layers():
        moe.routed_expert_up_proj.register_forward_hook(up_hook)
        moe.shared_experts.down_proj.register_forward_hook(down_hook)

    def nll():
        with torch.no_grad():
            lg = model(x[:, :-1])
            return F.cross_entropy(lg.reshape(-1, lg.shape[-1]), x[:, 1:].reshape(-1)).item()

    base = nll()
    print("||routed|| / ||shared|| per MoE layer:",
          ", ".join(f"{r / s:.2f}" for _, r, s in norms))
    zero[0] = True
    removed = nll()
    print(f"held-out loss, first {a.windows} windows of {W}: {base:.4f} as trained, "
          f"{removed:.4f} without the routed experts ({removed - base:+.4f} nats)")


if __name__ == "__main__":
    main()

"""PyTorch eager baseline for bench_acceptance.py --train bert: a BERT-style fine-tuning step.

Run by a Python that has torch (never a jonnx dependency), in its own process:
``/path/to/torch-venv/bin/python benchmarks/torch_bert_step.py --weights W.npz [--repeats 10]``.
``W.npz`` is written by bench_acceptance.py: the nets.bert_encoder weights
(hand_jax.torch_bert_weights), the classification head (``head.weight`` (768, classes),
``head.bias``), the batch ``x`` (N, seq, 768) and ``labels``. The step is the one
bench_acceptance.py times in jonnx: the post-LN encoder (separate Q/K/V, softmax attention, erf
GELU), logits from the first token, cross-entropy, AdamW (lr 1e-4, weight decay 0.01). Prints
``torch_loss <loss of the first step>`` and ``torch_step_ms <median>`` (or, with ``--serve``,
one step per stdin line: benchmarks/_torch_loop.py).
"""

from __future__ import annotations

import _torch_loop
import numpy as np
import torch
import torch.nn.functional as F


def main() -> None:
    args = _torch_loop.arguments(__doc__.splitlines()[0])
    data = dict(np.load(args.weights))
    heads, eps = int(data.pop("heads")), float(data.pop("eps"))
    x = torch.from_numpy(data.pop("x"))
    labels = torch.from_numpy(data.pop("labels"))
    p = {k: torch.nn.Parameter(torch.from_numpy(v)) for k, v in data.items()}
    n_layers = len({k.split(".")[0] for k in p if not k.startswith("head.")})
    n, s, h = x.shape
    d = h // heads

    def lin(v, layer, part):
        return v @ p[f"{layer}.{part}.weight"] + p[f"{layer}.{part}.bias"]

    def norm(v, layer, part):
        return F.layer_norm(v, (h,), p[f"{layer}.{part}.weight"], p[f"{layer}.{part}.bias"], eps)

    def forward(v):
        for i in range(n_layers):
            q, k, w = (lin(v, i, part).view(n, s, heads, d).transpose(1, 2) for part in ("q", "k", "v"))
            probs = torch.softmax(q @ k.transpose(-1, -2) / d**0.5, dim=-1)
            ctx = (probs @ w).transpose(1, 2).reshape(n, s, h)
            v = norm(lin(ctx, i, "o") + v, i, "ln1")
            v = norm(lin(F.gelu(lin(v, i, "ffn1")), i, "ffn2") + v, i, "ln2")
        return v[:, 0] @ p["head.weight"] + p["head.bias"]

    optimizer = torch.optim.AdamW(p.values(), lr=1e-4, weight_decay=0.01)

    def step():
        optimizer.zero_grad()
        loss = F.cross_entropy(forward(x), labels)
        loss.backward()
        optimizer.step()
        return loss.item()

    _torch_loop.run(step, args.repeats, args.serve)


if __name__ == "__main__":
    main()

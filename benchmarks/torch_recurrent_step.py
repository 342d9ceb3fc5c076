"""PyTorch eager baseline for bench_recurrent.py --train: a gradient step through stacked
``nn.LSTM``/``nn.GRU``/``nn.RNN`` layers.

Run by a Python that has torch (never a jonnx dependency), in its own process:
``/path/to/torch-venv/bin/python benchmarks/torch_recurrent_step.py --weights W.npz [--repeats 10]``.
``W.npz`` is written by bench_recurrent.py: the ``nets.recurrent`` weights as PyTorch's state
dict (hand_jax.torch_recurrent_weights), ``kind``, ``hidden``, ``bidirectional`` and the
batch ``x`` (seq, N, inputs). The step is the one bench_recurrent.py times in jonnx: the mean
square of the last layer's outputs, its gradient with respect to every weight (no optimizer).
Prints ``torch_loss <loss>`` and ``torch_step_ms <median>`` (or, with ``--serve``, one step
per stdin line: benchmarks/_torch_loop.py).
"""

from __future__ import annotations

import _torch_loop
import numpy as np
import torch


def main() -> None:
    args = _torch_loop.arguments(__doc__.splitlines()[0])
    data = dict(np.load(args.weights))
    kind, hidden, bidirectional = str(data.pop("kind")), int(data.pop("hidden")), bool(data.pop("bidirectional"))
    x = torch.from_numpy(data.pop("x"))
    layers = len({k for k in data if k.startswith("weight_ih_l") and not k.endswith("_reverse")})
    module = getattr(torch.nn, kind)(x.shape[-1], hidden, num_layers=layers, bidirectional=bidirectional)
    module.load_state_dict({k: torch.from_numpy(v) for k, v in data.items()})

    def step():
        module.zero_grad()
        loss = (module(x)[0] ** 2).mean()
        loss.backward()
        return loss.item()

    _torch_loop.run(step, args.repeats, args.serve)


if __name__ == "__main__":
    main()

"""PyTorch eager baseline for bench_acceptance.py --train: a ResNet-18 SGD-momentum step.

Run by a Python that has torch (never a jonnx dependency), in its own process:
``/path/to/torch-venv/bin/python benchmarks/torch_resnet18_step.py [--repeats 10] [--weights W.npz]``.
Same network as nets.resnet18 (64x64 inputs, 10 classes, batch 32, train mode). With
``--weights`` (written by bench_acceptance.py: hand_jax.torch_resnet_weights, the batch ``x`` and
``labels``) it starts from nets.resnet18's weights on the same batch, so its first loss equals
jonnx's; without, torch's own initialization on a seeded batch. Prints ``torch_loss <loss of
the first step>`` and ``torch_step_ms <median>`` (or, with ``--serve``, one step per
stdin line: benchmarks/_torch_loop.py).
"""

from __future__ import annotations

import _torch_loop
import numpy as np
import torch


def resnet18() -> torch.nn.Module:
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, c_in, c_out, stride):
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False),
                nn.BatchNorm2d(c_out),
                nn.ReLU(),
                nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False),
                nn.BatchNorm2d(c_out),
            )
            self.short = (
                nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))
                if stride != 1 or c_in != c_out
                else nn.Identity()
            )

        def forward(self, v):
            return torch.relu(self.body(v) + self.short(v))

    layers = [
        nn.Conv2d(3, 64, 7, 2, 3, bias=False),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.MaxPool2d(3, 2, 1),
    ]
    c_in = 64
    for stage in range(4):
        width = 64 * 2**stage
        for i in range(2):
            layers.append(Block(c_in, width, 2 if stage > 0 and i == 0 else 1))
            c_in = width
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 10)]
    return nn.Sequential(*layers).train()


def load_weights(net: torch.nn.Module, data: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Copy ``conv{i}``/``bn{i}``/``fc`` arrays into the net (its modules in definition order
    are the ONNX graph's nodes in order) and return the batch."""
    convs = [m for m in net.modules() if isinstance(m, torch.nn.Conv2d)]
    norms = [m for m in net.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    (fc,) = [m for m in net.modules() if isinstance(m, torch.nn.Linear)]
    with torch.no_grad():
        for i, (conv, bn) in enumerate(zip(convs, norms, strict=True)):
            conv.weight.copy_(torch.from_numpy(data[f"conv{i}.weight"]))
            for field in ("weight", "bias", "running_mean", "running_var"):
                getattr(bn, field).copy_(torch.from_numpy(data[f"bn{i}.{field}"]))
            bn.momentum = 0.1  # ONNX's momentum 0.9 is torch's 0.1
        fc.weight.copy_(torch.from_numpy(data["fc.weight"]))
        fc.bias.copy_(torch.from_numpy(data["fc.bias"]))
    return torch.from_numpy(data["x"]), torch.from_numpy(data["labels"])


def run_cnn_step(net: torch.nn.Module, batch: int, size: int, classes: int, description: str) -> None:
    """The command line and SGD-momentum step both CNN baselines share (see the docstring)."""
    args = _torch_loop.arguments(description, weights_required=False)  # else seeded random weights
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.standard_normal((batch, 3, size, size)).astype(np.float32))
    labels = torch.from_numpy(rng.integers(0, classes, batch))
    if args.weights:
        x, labels = load_weights(net, dict(np.load(args.weights)))
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)

    def step():
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(x), labels)
        loss.backward()
        optimizer.step()
        return loss.item()

    _torch_loop.run(step, args.repeats, args.serve)


def main() -> None:
    run_cnn_step(resnet18(), 32, 64, 10, __doc__.splitlines()[0])


if __name__ == "__main__":
    main()

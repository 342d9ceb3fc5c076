"""PyTorch eager baseline for bench_acceptance.py --train mobilenet_v2: a MobileNetV2 SGD-momentum step.

Run by a Python that has torch (never a jonnx dependency), in its own process:
``/path/to/torch-venv/bin/python benchmarks/torch_mobilenet_v2_step.py [--repeats 10] [--weights W.npz]``.
Same network as nets.mobilenet_v2 (224x224 inputs, 1000 classes, ReLU6, batch 16, train mode).
With ``--weights`` (written by bench_acceptance.py: hand_jax.torch_resnet_weights, the batch ``x``
and ``labels``) it starts from nets.mobilenet_v2's weights on the same batch, so its first loss
equals jonnx's; without, torch's own initialization on a seeded batch. Prints as
torch_resnet18_step.py does.
"""

from __future__ import annotations

import torch
from torch_resnet18_step import run_cnn_step

BATCH = 16
# (expansion t, output channels c, repeats n, first stride s), as nets.MOBILENET_V2_BLOCKS.
BLOCKS = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]


def mobilenet_v2() -> torch.nn.Module:
    nn = torch.nn

    def conv_bn(c_in, c_out, k, stride=1, group=1, act=True):
        layers = [nn.Conv2d(c_in, c_out, k, stride, k // 2, groups=group, bias=False), nn.BatchNorm2d(c_out)]
        return layers + [nn.ReLU6()] if act else layers

    class Inverted(nn.Module):
        def __init__(self, c_in, c_out, t, stride):
            super().__init__()
            hidden = c_in * t
            expand = conv_bn(c_in, hidden, 1) if t != 1 else []
            depthwise = conv_bn(hidden, hidden, 3, stride, hidden)
            self.body = nn.Sequential(*expand, *depthwise, *conv_bn(hidden, c_out, 1, act=False))
            self.residual = stride == 1 and c_in == c_out

        def forward(self, v):
            return v + self.body(v) if self.residual else self.body(v)

    layers, c_in = conv_bn(3, 32, 3, 2), 32
    for t, c, n, s in BLOCKS:
        for i in range(n):
            layers.append(Inverted(c_in, c, t, s if i == 0 else 1))
            c_in = c
    layers += [*conv_bn(c_in, 1280, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(1280, 1000)]
    return nn.Sequential(*layers).train()


def main() -> None:
    run_cnn_step(mobilenet_v2(), BATCH, 224, 1000, __doc__.splitlines()[0])


if __name__ == "__main__":
    main()

"""ConvTranspose on CPU: jonnx's phases lowering against XLA's transposed convolution.

For decoder shapes (a U-Net's 2x2 stride-2 upsampling, a DCGAN's 4x4 stride 2, a 3x3 stride 2
with output_padding) at each ``--batches`` size and in both layouts, it times the ONNX op as
jonnx runs it (``jonnx.ops.call``, jitted), with ``conv_ops.conv_transpose_lowering`` forced to each
choice: ``fwd`` the op alone, ``fwd+bwd`` a ``jax.vjp`` of it with both gradients (a training
step's share). Candidates are compiled, then called in turn for ``--repeats`` rounds, the order
reversed every other round; medians in ms, and the ratio XLA / phases.

Usage: ``python benchmarks/bench_conv_transpose.py [--batches 1 8] [--repeats 9]``
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import jax
import numpy as np

import jonnx
from jonnx.ops import conv as conv_ops
from jonnx.ops.channels_last import DOMAIN

# (label, C, M, kernel, stride, pads, output_padding, input size)
SHAPES = [
    ("U-Net 2x2/2", 128, 64, 2, 2, 0, 0, 56),
    ("U-Net 2x2/2", 512, 256, 2, 2, 0, 0, 14),
    ("DCGAN 4x4/2", 256, 128, 4, 2, 1, 0, 16),
    ("3x3/2 +1", 64, 32, 3, 2, 1, 1, 56),
]


def op(layout: str, k: int, stride: int, pad: int, out_pad: int):
    attrs = dict(strides=[stride] * 2, pads=[pad] * 4, output_padding=[out_pad] * 2, kernel_shape=[k, k])
    domain = DOMAIN if layout == "nhwc" else ""
    return lambda x, w: jonnx.ops.call("ConvTranspose", x, w, domain=domain, **attrs)


def jitted(f, mode: str):
    """``f`` (``fwd``) or its forward and both gradients (``fwd+bwd``), jitted."""
    if mode == "fwd":
        return jax.jit(f)

    def run(x, w):
        y, pullback = jax.vjp(f, x, w)
        return pullback(y)

    return jax.jit(run)


@contextlib.contextmanager
def forced(lowering: str):
    """``conv_ops.conv_transpose_lowering`` answering ``lowering`` (jonnx chooses while tracing)."""
    chooser = conv_ops.conv_transpose_lowering
    conv_ops.conv_transpose_lowering = lambda *args, **kw: lowering
    try:
        yield
    finally:
        conv_ops.conv_transpose_lowering = chooser


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(f"jax {jax.__version__}, backend {jax.default_backend()}")
    print(f"{'shape':<32} {'batch':>5} {'layout':>6} {'mode':>8} {'phases':>9} {'xla':>9} {'xla/phases':>10}")
    for label, c, m, k, stride, pad, out_pad, size in SHAPES:
        for batch in args.batches:
            for layout in ("nchw", "nhwc"):
                shape = (batch, size, size, c) if layout == "nhwc" else (batch, c, size, size)
                x = rng.standard_normal(shape).astype(np.float32)
                w = (rng.standard_normal((c, m, k, k)) / np.sqrt(c * k * k)).astype(np.float32)
                for mode in ("fwd", "fwd+bwd"):
                    fns = {}
                    for lowering in ("phases", "xla"):
                        fns[lowering] = jitted(op(layout, k, stride, pad, out_pad), mode)
                        with forced(lowering):  # the first call traces and compiles
                            jax.block_until_ready(fns[lowering](x, w))
                    times = {name: [] for name in fns}
                    for r in range(args.repeats):
                        for name in list(fns) if r % 2 == 0 else list(fns)[::-1]:
                            start = time.perf_counter()
                            jax.block_until_ready(fns[name](x, w))
                            times[name].append(time.perf_counter() - start)
                    ms = {name: 1e3 * statistics.median(v) for name, v in times.items()}
                    name = f"{label} {c}->{m} @{size}"
                    print(
                        f"{name:<32} {batch:>5} {layout:>6} {mode:>8} {ms['phases']:>9.2f} {ms['xla']:>9.2f} "
                        f"{ms['xla'] / ms['phases']:>10.2f}"
                    )


if __name__ == "__main__":
    main()

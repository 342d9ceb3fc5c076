"""Per-layer crossovers of jonnx's Conv lowerings: which wins, and what ``conv_lowering`` picks.

For each distinct Conv shape of ResNet-50, MobileNetV2 (224x224) and ResNet-18 (64x64, the
training benchmark), and with ``--grid`` a small grid over channels, kernel 1/3/5/7, stride 1/2
and dilation 2, at each ``--batches`` size, it times every lowering ops/conv_ops.py offers for that
shape, in both layouts:

- ``xla``: ``lax.conv_general_dilated`` (NCHW/OIHW, or NHWC/HWIO; ``xla-ihwo`` NHWC with the
  weights I(D)HWO, where the layout pass lays them out so: ``conv_ops.kernel_layout_for``);
- ``matmul`` (1x1 kernels), ``depthwise`` (group = channels), ``im2col`` (group 1) and, NHWC
  only, ``tap_products`` (group 1, stride 1, k > 1, I(D)HWO weights) and ``channel_taps``
  (group 1, at most 3 input channels, or ``conv_ops.TAPS_1X1_CHANNELS`` for 1x1 kernels): the private
  lowering functions of ops/conv_ops.py, called directly.

Every candidate is compiled with ``jonnx.jit``, as the models are: XLA's own convolution
emitter, dots in YNNPACK (a model whose dots are nearly all large compiles without YNNPACK,
``jonnx._jit.library_dots_for``; ``jax.jit``'s defaults would hand the convolutions to YNNPACK).
``fwd`` times the convolution alone, ``fwd+bwd`` a ``jax.vjp`` of it (the forward and the
gradients for the input and the weights: a training step's share). The weights are arguments
(as in training, and in inference once prepared weights are cached), already in the layout each
lowering reads. Candidates for one shape are compiled, then called in turn ``--repeats`` rounds;
medians. For each row it prints the times (ms), the fastest per layout, ``conv_lowering``'s pick
(for both layouts) and ``MISS`` where the pick is slower than the layout's fastest by more than
``--tolerance`` (default 15%, about the noise on a shared machine).

Usage: ``python benchmarks/bench_conv_lowering.py [--nets resnet50 mobilenet_v2 resnet18] [--grid]
[--batches 1 32] [--modes fwd bwd] [--layouts nchw nhwc] [--repeats 7] [--limit N]``
Only ratios within a row mean anything on a shared machine; rerun a row to trust a MISS.
"""

from __future__ import annotations

import argparse
import itertools
import pathlib
import statistics
import sys
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import onnx
from jax import lax

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import nets

import jonnx
from jonnx.ops import conv as conv_ops


class Shape(NamedTuple):
    c_in: int
    c_out: int
    k: int
    stride: int
    dilation: int
    group: int
    size: int  # input height = width
    where: str  # which nets use it, and how often

    def label(self) -> str:
        g = "dw" if self.group == self.c_in and self.group > 1 else (f"g{self.group}" if self.group > 1 else "")
        d = f"d{self.dilation}" if self.dilation > 1 else ""
        return f"{self.k}x{self.k}/{self.stride}{d}{g} {self.c_in}->{self.c_out} @{self.size}"


# --------------------------------------------------------------------------- shapes


def net_shapes(names: list[str]) -> list[Shape]:
    """The distinct Conv shapes of the named nets, with where each occurs."""
    builders = {
        "resnet50": nets.resnet50,
        "mobilenet_v2": nets.mobilenet_v2,
        "resnet18": lambda: nets.resnet18(size=64, classes=10),
    }
    found: dict[tuple, list[str]] = {}
    for name in names:
        proto = onnx.shape_inference.infer_shapes(builders[name]())
        dims = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in proto.graph.value_info}
        dims.update({v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in proto.graph.input})
        inits = {t.name: tuple(t.dims) for t in proto.graph.initializer}
        for node in proto.graph.node:
            if node.op_type != "Conv":
                continue
            a = {x.name: onnx.helper.get_attribute_value(x) for x in node.attribute}
            m, c_per_group, k, _ = inits[node.input[1]]
            group = a.get("group", 1)
            key = (
                c_per_group * group,
                m,
                k,
                a.get("strides", [1])[0],
                a.get("dilations", [1])[0],
                group,
                dims[node.input[0]][2],
            )
            found.setdefault(key, []).append(name)
    out = []
    for key, where in found.items():
        counts = ", ".join(f"{n} x{where.count(n)}" for n in dict.fromkeys(where))
        out.append(Shape(*key, counts))
    return out


def grid_shapes() -> list[Shape]:
    """Channels paired with the spatial size they occur at in CNNs, kernel 1/3/5/7, stride 1/2,
    dilation 2 for the 3x3s, plus depthwise 3x3 and 5x5."""
    out = []
    for c, size in [(16, 112), (64, 56), (256, 14), (512, 7)]:
        for k, stride in itertools.product((1, 3, 5, 7), (1, 2)):
            out.append(Shape(c, c, k, stride, 1, 1, size, "grid"))
        out.append(Shape(c, c, 3, 1, 2, 1, size, "grid"))
        for k in (3, 5):
            out.append(Shape(c, c, k, 1, 1, c, size, "grid"))
    return out


# --------------------------------------------------------------------------- candidates


def candidates(shape: Shape, layout: str) -> dict[str, tuple[callable, str]]:
    """Each lowering that applies to ``shape``, as ``f(x, w)`` in ``layout``, with the weight
    layout it reads (``conv_ops.KERNEL_LAYOUTS``)."""
    strides, dilations = (shape.stride,) * 2, (shape.dilation,) * 2
    pad = shape.dilation * (shape.k - 1) // 2
    lo = hi = (pad, pad)
    nhwc = layout == "nhwc"

    def xla(kernel_layout):
        dims = ("NHWC", kernel_layout, "NHWC") if nhwc else ("NCHW", "OIHW", "NCHW")
        return lambda x, w: lax.conv_general_dilated(
            x, w, strides, (lo, lo), rhs_dilation=dilations, dimension_numbers=dims, feature_group_count=shape.group
        )

    out = {"xla": (xla("HWIO"), "HWIO" if nhwc else "OIHW")}
    kinds = []
    if shape.group == 1 and shape.k == 1:
        kinds.append("matmul")
    if shape.group == shape.c_in and shape.group > 1:
        kinds.append("depthwise")
    if shape.group == 1 and shape.k > 1:
        kinds.append("im2col")
        if nhwc and shape.stride == 1:
            kinds.append("tap_products")
            out["xla-ihwo"] = (xla("IHWO"), "IHWO")
    if nhwc and shape.group == 1 and shape.c_in <= (conv_ops.TAPS_1X1_CHANNELS if shape.k == 1 else 3):
        kinds.append("channel_taps")
    for kind in kinds:
        fn = conv_ops._LOWERINGS[kind]
        reads = "IHWO" if kind == "tap_products" else "HWIO" if nhwc else "OIHW"
        out[kind] = (lambda x, w, fn=fn, reads=reads: fn(x, w, strides, dilations, lo, hi, None, nhwc, reads), reads)
    return out


def picked(shape: Shape, batch: int, layout: str) -> str:
    """What ``conv_lowering`` answers for this shape, NHWC with the weight layout the layout
    pass gives the kernel (an XLA convolution then reads it: ``xla-ihwo``)."""
    w_oihw = (shape.c_out, shape.c_in // shape.group, shape.k, shape.k)
    strides = (shape.stride,) * 2
    if layout == "nchw":
        return conv_ops.conv_lowering(
            (batch, shape.c_in, shape.size, shape.size), w_oihw, strides, shape.group, jnp.float32
        )
    kernel_layout = conv_ops.kernel_layout_for(w_oihw, shape.group, strides)
    x = (batch, shape.size, shape.size, shape.c_in)
    w = (shape.k, shape.k, shape.c_in // shape.group, shape.c_out)
    pick = conv_ops.conv_lowering(
        x, w, strides, shape.group, jnp.float32, channels_last=True, kernel_layout=kernel_layout
    )
    return "xla-ihwo" if pick == "xla" and kernel_layout == "IHWO" else pick


# --------------------------------------------------------------------------- timing


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench(shape: Shape, batch: int, layout: str, mode: str, repeats: int) -> dict[str, float]:
    """Median ms per call of each candidate for this shape, alternating."""
    rng = np.random.default_rng(0)
    nhwc = layout == "nhwc"
    x_shape = (batch, shape.size, shape.size, shape.c_in) if nhwc else (batch, shape.c_in, shape.size, shape.size)
    w_oihw = rng.standard_normal((shape.c_out, shape.c_in // shape.group, shape.k, shape.k)).astype(np.float32)
    x = jnp.asarray(rng.standard_normal(x_shape).astype(np.float32))
    fns, calls = candidates(shape, layout), {}
    ref = None
    for name, (f, reads) in fns.items():
        w = jnp.asarray(w_oihw.transpose(conv_ops.kernel_permutation(reads, 4)))
        y = jonnx.jit(f)(x, w)
        # Every candidate must compute the same convolution (this checks the NHWC copies too).
        ref = y if ref is None else ref
        err = float(jnp.max(jnp.abs(y - ref)) / (jnp.max(jnp.abs(ref)) + 1e-12))
        if err > 1e-4:
            raise AssertionError(f"{shape.label()} {layout}: {name} differs from xla by {err:.1e}")
        if mode == "fwd":
            jitted = jonnx.jit(f)
            calls[name] = lambda jitted=jitted, w=w: jitted(x, w).block_until_ready()
        else:
            g = jnp.ones_like(y)
            jitted = jonnx.jit(lambda x, w, g, f=f: jax.vjp(f, x, w)[1](g))
            calls[name] = lambda jitted=jitted, w=w, g=g: jax.block_until_ready(jitted(x, w, g))
        calls[name]()  # compile
    times = {k: [] for k in calls}
    for _ in range(repeats):
        for k, fn in calls.items():
            times[k].append(_timed(fn))
    return {k: statistics.median(v) * 1e3 for k, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nets", nargs="*", default=["resnet50", "mobilenet_v2", "resnet18"])
    parser.add_argument("--grid", action="store_true", help="add the channels x kernel x stride grid")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--modes", nargs="+", default=["fwd", "bwd"], choices=["fwd", "bwd"])
    parser.add_argument("--layouts", nargs="+", default=["nchw", "nhwc"], choices=["nchw", "nhwc"])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--tolerance", type=float, default=0.15)
    parser.add_argument("--limit", type=int, help="only the first N shapes (a quick look)")
    args = parser.parse_args()
    shapes = net_shapes(args.nets) + (grid_shapes() if args.grid else [])
    shapes = shapes[: args.limit] if args.limit else shapes
    print(
        f"jax {jax.__version__} on {jax.default_backend()}; {len(shapes)} shapes; ms per call, medians of {args.repeats}"
    )
    misses = 0
    for shape, batch, mode in itertools.product(shapes, args.batches, args.modes):
        cells, summary, overall = [], [], {}
        for layout in args.layouts:
            try:
                med = bench(shape, batch, layout, mode, args.repeats)
            except Exception as exc:  # noqa: BLE001 (one shape failing must not stop the table)
                cells.append(f"{layout}: FAILED {type(exc).__name__}: {exc}"[:160])
                continue
            best = min(med, key=med.get)
            overall.update({f"{layout} {k}": v for k, v in med.items()})
            pick = picked(shape, batch, layout)
            pick_ms = med.get(pick)
            miss = pick_ms is not None and pick_ms > med[best] * (1 + args.tolerance)
            misses += miss
            times = " ".join(f"{k} {v:.2f}" for k, v in med.items())
            cells.append(f"{layout}: {times}")
            summary.append(f"{layout} best {best} picks {pick}" + (f" MISS x{pick_ms / med[best]:.2f}" if miss else ""))
        if overall:
            summary.append(f"fastest {min(overall, key=overall.get)}")
        print(
            f"{shape.label():<26} b{batch:<3}{'fwd+bwd' if mode == 'bwd' else 'fwd':<8}| {' | '.join(cells)} || {'; '.join(summary)}  [{shape.where}]",
            flush=True,
        )
    print(f"{misses} MISS rows (the pick slower than the fastest in its layout by > {args.tolerance:.0%})")


if __name__ == "__main__":
    main()

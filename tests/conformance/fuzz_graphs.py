"""Differential fuzzing of the optimization passes: random CNN-shaped graphs, optimized and not.

A developer's tool, not a test: ``python -m tests.conformance.fuzz_graphs [--seed S]
[--cases N] [--lowering elsewhere] [--trace]`` draws graphs of up to 12 nodes that start with a convolution (so the
channels-last pass rewrites them) and go on with what CNNs are made of, each reading a random
earlier value: convolutions (grouped, depthwise, strided, dilated, transposed), pooling,
BatchNormalization and InstanceNormalization, activations, arithmetic with another value or
with a constant of any broadcasting shape ((C, 1, 1), (H, W), (1, 1, 1, W), ...), Concat,
Split, Pad, Slice, Resize, Transpose, Softmax and reductions over any axes, Dropout, and Flatten
+ Gemm heads (two heads on one value share its Flatten); in the operator forms of opsets 9 to 21
(Pad, Slice and Clip's attributes before their inputs). A quarter of the graphs are encoders
instead: (B, T, D) values through MatMuls by weights (several often reading one value, as
attention's Q, K and V, which the product fusion joins), one-head attention, LayerNormalization,
RNN, GRU and LSTM nodes, activations, arithmetic, Concat, Split, reductions and Dropout. Some
intermediate values are graph outputs too, so a pass must hand them back as the graph has them.

Each graph is run by onnxruntime (float32; a batch-major recurrent node, layout=1, which it
refuses, as the same node in layout 0 between Transposes: ``fuzz.time_major_twin``; the
ReferenceEvaluator where onnxruntime still refuses the graph) and by jonnx three ways: ``Model(*inputs)`` (the
default passes: channels-last), with ``optimize={"constant_weights": True}`` (the weights
compiled in, BatchNormalization folded into convolutions, shared-input products fused) and with
``optimize=False``; every one must match onnxruntime (or, where it departs, the
ReferenceEvaluator: counted as the references disagreeing). Then, in float64, the derivative of a
random projection of the outputs with respect to the input and every weight, through
``Model.apply`` with every pass named on and through the unoptimized graph, each compiled by
``jonnx.jit``, must equal the unoptimized graph's run op by op (eagerly: no XLA fusion); in
inference, and in training (``train=True``: BatchNormalization on batch statistics, Dropout
masks from a key), where the outputs, masks and new running statistics must agree too. Last,
per-example derivatives through both models must equal each row's own: gradients (``jax.vmap``
of ``jax.grad`` over a stack of two inputs) and forward mode under ``jax.vmap`` (directional
derivatives over the inputs and their tangents, and over a stack of weight tangents).
``--lowering elsewhere`` traces the ops as they are lowered off the CPU (XLA's convolutions and
pooling, the layouts chosen for them) and runs them here. ``--wide`` draws, at times, 16 to 64
channels (512 on maps of at most 16 cells) and maps of 28 to 32 cells a side, which the
lowerings chosen by size need, and encoders of up to 64 steps and features (``WIDE``);
without it the graphs stay small and fast. ``--half`` runs the graphs in float16 (values
only, within ``HALF_TOLERANCE``).

The single-node fuzz (``tests/conformance/fuzz.py``) checks each op against the references;
this one checks that the passes compose them without changing what the graph computes.
"""

from __future__ import annotations

import argparse
import collections
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import jonnx
from tests.conformance.fuzz import add_lowering_option, lower_as, onnxruntime_outputs

ALL_PASSES = {"channels_last": True, "fold_batchnorm": True, "fuse_matmuls": True, "dead_nodes": True}

# --wide: CNNs of the channel counts and maps that the lowerings chosen by size need
# (ops/conv.py): 1x1 products over more than 16 channels, tap products over 512 channels on
# small maps, NCHW 1x1 products batched over the images on maps of 784 cells or more, one
# image's GlobalAveragePool as a product (ops/channels_last.py). Without it the graphs keep to
# a few channels on maps of at most 8 cells a side.
WIDE = False
WIDE_CHANNELS = (16, 17, 48, 64)
# --half: the graphs in float16, values only (the derivative checks are float64 whatever the
# graph's type, so the plain run's cover them), within HALF_TOLERANCE of the largest output:
# each engine rounds every node's result to float16 (a unit is 1e-3 relative), and a dozen
# nodes and the passes' foldings compound it (2026-12-06, 80 graphs, 40 of them --wide: at
# most 1.7e-3 between any configuration and onnxruntime).
HALF = False
HALF_TOLERANCE = 5e-3
# The values' tolerance in float32 (of the largest output): summation-order differences.
FLOAT32_TOLERANCE = 2e-4


def _width(rng: np.random.Generator, low: int, high: int, *, small_map: bool = False) -> int:
    """A channel count in [low, high); under --wide, sometimes one of WIDE_CHANNELS (or 512
    on a ``small_map``). Without --wide it draws what ``rng.integers`` draws, so seeds keep
    their graphs."""
    if WIDE and rng.random() < 0.5:
        return int(_pick(rng, WIDE_CHANNELS + ((512,) if small_map else ())))
    return int(rng.integers(low, high))


class Graph:
    """A graph under construction: nodes, initializers, and every value's shape (from onnx's
    shape inference after each node), drawn from one seeded generator."""

    def __init__(self, rng: np.random.Generator, opset: int, dtype):
        self.rng, self.opset, self.dtype = rng, opset, dtype
        self.elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.elems: dict[str, int] = {}  # every value's element type
        self.inputs: list[onnx.ValueInfoProto] = []
        self.flattened: dict[str, str] = {}  # value -> its Flatten's output
        self.matmul_inputs: set[str] = set()  # values a MatMul reads

    def name(self, prefix: str) -> str:
        return f"{prefix}{len(self.nodes)}_{len(self.inits)}_{len(self.shapes)}"

    def weight(self, shape, scale: float = 1.0, positive: bool = False) -> str:
        """An initializer drawn from the generator (in float64, then cast, so float32 and
        float64 graphs of one seed hold the same values)."""
        values = self.rng.standard_normal(shape) * scale
        values = np.abs(values) + 0.5 if positive else values
        name = self.name("w")
        self.inits.append(numpy_helper.from_array(np.asarray(values).astype(self.dtype), name))
        return name

    def ints(self, values) -> str:
        name = self.name("i")
        self.inits.append(numpy_helper.from_array(np.asarray(values, np.int64), name))
        return name

    def add(self, op: str, inputs: list[str], n_outputs: int = 1, **attrs) -> list[str] | None:
        """Append a node; its outputs' names, or None (and no node) where onnx's shape
        inference refuses it or cannot give every output a static, non-empty shape."""
        outputs = [self.name(op.lower()) + f"_{k}" for k in range(n_outputs)]
        self.nodes.append(helper.make_node(op, inputs, outputs, **attrs))
        try:
            inferred = onnx.shape_inference.infer_shapes(self.model([]), strict_mode=True, data_prop=True)
        except Exception:  # noqa: BLE001 -- an invalid draw: taken back
            self.nodes.pop()
            return None
        shapes, elems = {}, {}
        for info in inferred.graph.value_info:
            tensor = info.type.tensor_type
            if info.name in outputs and tensor.HasField("shape"):
                if all(d.HasField("dim_value") for d in tensor.shape.dim):
                    shapes[info.name] = tuple(d.dim_value for d in tensor.shape.dim)
                    elems[info.name] = tensor.elem_type
        if set(shapes) != set(outputs) or any(d < 1 for s in shapes.values() for d in s):
            self.nodes.pop()
            return None
        self.shapes.update(shapes)
        self.elems.update(elems)
        return outputs

    def model(self, outputs: list[str]) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes,
            "fuzz",
            self.inputs,
            [helper.make_tensor_value_info(o, self.elems[o], None) for o in outputs],
            self.inits,
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)])
        model.ir_version = 8
        return model

    def shape_of(self, name: str) -> tuple[int, ...]:
        return self.shapes[name]


def _pick(rng, options):
    return options[int(rng.integers(len(options)))]


# ---- the steps: each reads value ``x`` (rank 3-5 unless said) and returns its outputs or None


def _conv(g: Graph, x: str) -> list[str] | None:
    shape = g.shape_of(x)
    channels, spatial = shape[1], shape[2:]
    if WIDE and len(spatial) == 2 and g.rng.random() < 0.4:
        return _stage_conv(g, x)
    groups = _pick(g.rng, [1, 1, channels, *[k for k in (2, 3) if channels % k == 0]])
    out = groups * (int(g.rng.integers(1, 4)) if groups > 1 else _width(g.rng, 1, 9, small_map=np.prod(spatial) <= 16))
    kernel = [int(g.rng.integers(1, min(3, s) + 1)) for s in spatial]
    attrs = {"kernel_shape": kernel, "group": groups}
    if g.rng.random() < 0.5:
        attrs["strides"] = [int(g.rng.integers(1, 3)) for _ in spatial]
    if g.rng.random() < 0.2:  # a dilated window longer than its input is an invalid model
        dilations = [int(g.rng.integers(1, 3)) for _ in spatial]
        attrs["dilations"] = [d if (k - 1) * d < s else 1 for d, k, s in zip(dilations, kernel, spatial)]
    if g.rng.random() < 0.15:
        attrs["auto_pad"] = _pick(g.rng, ["SAME_UPPER", "SAME_LOWER", "VALID"])
        attrs.pop("dilations", None)  # onnxruntime's SAME with dilations is not the specification's
    elif g.rng.random() < 0.6:
        attrs["pads"] = [int(g.rng.integers(0, k)) for k in kernel * 2]
    fan_in = channels // groups * int(np.prod(kernel))
    inputs = [x, g.weight((out, channels // groups, *kernel), 1 / np.sqrt(fan_in))]
    if g.rng.random() < 0.6:
        inputs.append(g.weight((out,), 0.1))
    return g.add("Conv", inputs, **attrs)


def _stage_conv(g: Graph, x: str) -> list[str] | None:
    """--wide: a 2-D convolution as ResNets stack them, 3x3 with a cell of padding or 1x1, no
    strides or groups, to 16-64 channels (or 512 on a small map): what the tap products and 1x1
    products take."""
    channels, spatial = g.shape_of(x)[1], g.shape_of(x)[2:]
    k = int(_pick(g.rng, [1, 3, 3]))
    kernel = [min(k, s) for s in spatial]
    out = int(_pick(g.rng, WIDE_CHANNELS + ((512,) if np.prod(spatial) <= 16 else ())))
    weights = g.weight((out, channels, *kernel), 1 / np.sqrt(channels * int(np.prod(kernel))))
    return g.add(
        "Conv", [x, weights, g.weight((out,), 0.1)], kernel_shape=kernel, pads=[(n - 1) // 2 for n in kernel] * 2
    )


def _conv_transpose(g: Graph, x: str) -> list[str] | None:
    shape = g.shape_of(x)
    channels, spatial = shape[1], shape[2:]
    groups = _pick(g.rng, [1, 1, channels])
    per_group = int(g.rng.integers(1, 4))
    kernel = [int(g.rng.integers(1, 4)) for _ in spatial]
    strides = [int(g.rng.integers(1, 3)) for _ in spatial]
    attrs = {"kernel_shape": kernel, "group": groups, "strides": strides}
    if g.rng.random() < 0.5:
        attrs["pads"] = [int(g.rng.integers(0, k)) for k in kernel * 2]
    if g.rng.random() < 0.3:
        attrs["output_padding"] = [int(g.rng.integers(0, s)) for s in strides]
    weights = g.weight((channels, per_group, *kernel), 1 / np.sqrt(channels // groups * int(np.prod(kernel))))
    return g.add("ConvTranspose", [x, weights], **attrs)


def _batchnorm(g: Graph, x: str) -> list[str] | None:
    c = g.shape_of(x)[1]
    stats = [g.weight((c,), 0.3, positive=True), g.weight((c,), 0.1), g.weight((c,), 0.1), g.weight((c,), 0.3, True)]
    return g.add("BatchNormalization", [x, *stats], epsilon=float(_pick(g.rng, [1e-5, 1e-3])))


def _instance_norm(g: Graph, x: str) -> list[str] | None:
    c = g.shape_of(x)[1]
    return g.add("InstanceNormalization", [x, g.weight((c,), 0.3, positive=True), g.weight((c,), 0.1)])


def _pool(g: Graph, x: str) -> list[str] | None:
    spatial = g.shape_of(x)[2:]
    op = _pick(g.rng, ["MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"])
    if op.startswith("Global"):
        return g.add(op, [x])
    kernel = [int(g.rng.integers(1, min(3, s) + 1)) for s in spatial]
    attrs = {"kernel_shape": kernel, "strides": [int(g.rng.integers(1, 3)) for _ in spatial]}
    if g.rng.random() < 0.5:
        attrs["pads"] = [int(g.rng.integers(0, k)) for k in kernel * 2]
    if g.opset >= 10 and g.rng.random() < 0.3:
        attrs["ceil_mode"] = 1
    if op == "AveragePool" and g.rng.random() < 0.5:
        attrs["count_include_pad"] = 1
    indices = op == "MaxPool" and g.rng.random() < 0.2  # the pass leaves such a node alone
    return g.add(op, [x], 2 if indices else 1, **attrs)


def _activation(g: Graph, x: str) -> list[str] | None:
    op = _pick(g.rng, ["Relu", "Sigmoid", "Tanh", "LeakyRelu", "Abs", "Neg", "Clip", "HardSwish", "Softplus"])
    if op == "HardSwish" and g.opset < 14:
        op = "HardSigmoid"
    if op == "Clip":
        if g.opset < 11:
            return g.add("Clip", [x], min=-0.5, max=0.8)
        low, high = np.array(-0.5, g.dtype), np.array(0.8, g.dtype)
        names = [g.name("lo"), g.name("hi")]
        g.inits += [numpy_helper.from_array(low, names[0]), numpy_helper.from_array(high, names[1])]
        return g.add("Clip", [x, *names])
    return g.add(op, [x])


def _broadcast_shape(g: Graph, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A constant shape that broadcasts to ``shape``: per channel, per position, scalar, ..."""
    rank, c = len(shape), shape[1]
    options = [(c,) + (1,) * (rank - 2), (1, c) + (1,) * (rank - 2), (), (1,), shape[1:], shape[2:], (shape[-1],)]
    options += [(1,) * (rank - 1) + (shape[-1],), tuple(s if g.rng.random() < 0.5 else 1 for s in shape)]
    return _pick(g.rng, options)


def _arithmetic(g: Graph, x: str, others: list[str]) -> list[str] | None:
    shape = g.shape_of(x)
    op = _pick(g.rng, ["Add", "Sub", "Mul", "Div", "Max", "Min", "Sum", "Mean", "PRelu"])
    same = [o for o in others if o != x and g.shape_of(o) == shape]
    if same and op not in ("Div", "PRelu") and g.rng.random() < 0.5:
        y = _pick(g.rng, same)
    elif op == "PRelu":
        y = g.weight(_pick(g.rng, [(shape[1],) + (1,) * (len(shape) - 2), (1,)]), 0.3)
    else:
        y = g.weight(_broadcast_shape(g, shape), 0.5, positive=op == "Div")
    operands = [y, x] if g.rng.random() < 0.3 and op not in ("PRelu", "Div") else [x, y]  # never 1 / x
    return g.add(op, operands)


def _concat(g: Graph, x: str, others: list[str]) -> list[str] | None:
    shape = g.shape_of(x)
    axis = int(g.rng.integers(-len(shape), len(shape)))
    fits = [o for o in others if len(g.shape_of(o)) == len(shape)]
    fits = [
        o for o in fits if all(a == b for i, (a, b) in enumerate(zip(g.shape_of(o), shape)) if i != axis % len(shape))
    ]
    return g.add("Concat", [x, _pick(g.rng, fits or [x])], axis=axis)


def _split(g: Graph, x: str) -> list[str] | None:
    shape = g.shape_of(x)
    axis = int(g.rng.integers(-len(shape), len(shape)))
    if shape[axis] < 2:
        return None
    first = int(g.rng.integers(1, shape[axis]))
    sizes = [first, shape[axis] - first]
    if g.opset < 13:
        return g.add("Split", [x], 2, axis=axis, split=sizes)
    return g.add("Split", [x, g.ints(sizes)], 2, axis=axis)


def _pad(g: Graph, x: str) -> list[str] | None:
    shape = g.shape_of(x)
    mode = _pick(g.rng, ["constant", "constant", "reflect", "edge"])
    high = {"constant": 3, "reflect": 2, "edge": 3}[mode]
    pads = [int(g.rng.integers(0, high)) if s > high else 0 for s in shape * 2]
    if mode == "constant" and g.rng.random() < 0.3:  # a crop
        pads = [p - 1 if s > 2 and p == 0 and g.rng.random() < 0.5 else p for p, s in zip(pads, shape * 2)]
    if g.opset < 11:
        return g.add("Pad", [x], mode=mode, pads=pads, value=0.25)
    inputs = [x, g.ints(pads)]
    if mode == "constant":
        value = g.name("v")
        g.inits.append(numpy_helper.from_array(np.array(0.25, g.dtype), value))
        inputs.append(value)
    if g.opset >= 18 and g.rng.random() < 0.5:  # only some axes, negative or not
        axes = [a for a in range(len(shape)) if g.rng.random() < 0.6] or [len(shape) - 1]
        half = len(shape)
        inputs[1] = g.ints([pads[a] for a in axes] + [pads[half + a] for a in axes])
        if len(inputs) == 2:
            inputs.append("")
        inputs.append(g.ints([a - len(shape) if g.rng.random() < 0.5 else a for a in axes]))
    return g.add("Pad", inputs, mode=mode)


def _slice(g: Graph, x: str) -> list[str] | None:
    shape = g.shape_of(x)
    axes = [a for a in range(len(shape)) if g.rng.random() < 0.5] or [len(shape) - 1]
    starts, ends, steps = [], [], []
    for a in axes:
        n = shape[a]
        step = _pick(g.rng, [1, 1, 2, -1]) if g.opset >= 10 else 1
        begin, end = sorted(int(v) for v in g.rng.integers(0, n + 1, 2))
        if end == begin:
            end = begin + 1
        if step < 0:
            begin, end = end - 1, begin - 1 if begin > 0 else -n - 1
        starts.append(begin - n if g.rng.random() < 0.3 and begin < n else begin)
        ends.append(end)
        steps.append(step)
    written = [a - len(shape) if g.rng.random() < 0.4 else a for a in axes]
    if g.opset < 10:
        return g.add("Slice", [x], starts=starts, ends=ends, axes=written)
    return g.add("Slice", [x, g.ints(starts), g.ints(ends), g.ints(written), g.ints(steps)])


def _resize(g: Graph, x: str) -> list[str] | None:
    shape = g.shape_of(x)
    mode = _pick(g.rng, ["nearest", "linear"])
    if g.opset < 11:
        scales = [1.0, 1.0] + [float(_pick(g.rng, [1, 2, 3])) for _ in shape[2:]]
        name = g.name("s")
        g.inits.append(numpy_helper.from_array(np.array(scales, np.float32), name))
        return g.add("Upsample", [x, name], mode=mode)
    transform = _pick(g.rng, ["half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel"])
    attrs = {"mode": mode, "coordinate_transformation_mode": transform}
    sizes = g.opset >= 13 and g.rng.random() < 0.4
    spatial = [float(_pick(g.rng, [0.5, 1.5, 2.0, 3.0])) for _ in shape[2:]]
    if transform == "align_corners":
        # Where n * scale is fractional, onnxruntime divides by the output's whole length, the
        # ONNX test data (and jonnx) by n * scale itself (onnx/onnx#2462: intended): not a
        # question for this fuzz.
        spatial = [s if (s * n).is_integer() else 2.0 for s, n in zip(spatial, shape[2:])]
    axes = g.opset >= 18 and g.rng.random() < 0.4
    if axes:
        attrs["axes"] = [a - len(shape) if g.rng.random() < 0.5 else a for a in range(2, len(shape))]
    if sizes:
        wanted = [max(1, int(s * n)) for s, n in zip(spatial, shape[2:])]
        values = wanted if axes else [shape[0], shape[1], *wanted]
        return g.add("Resize", [x, "", "", g.ints(values)], **attrs)
    values = spatial if axes else [1.0, 1.0, *spatial]
    name, roi = g.name("s"), ""
    g.inits.append(numpy_helper.from_array(np.array(values, np.float32), name))
    if g.opset < 13:  # roi is not optional yet
        roi = g.name("roi")
        g.inits.append(numpy_helper.from_array(np.zeros(0, np.float32), roi))
    return g.add("Resize", [x, roi, name], **attrs)


def _transpose(g: Graph, x: str) -> list[str] | None:
    rank = len(g.shape_of(x))
    return g.add("Transpose", [x], perm=[int(p) for p in g.rng.permutation(rank)])


def _reduce(g: Graph, x: str) -> list[str] | None:
    rank = len(g.shape_of(x))
    op = _pick(g.rng, ["ReduceMean", "ReduceSum", "ReduceMax", "Softmax"])
    if op == "Softmax":
        axis = int(g.rng.integers(-rank, rank))
        return g.add("Softmax", [x], axis=axis) if g.opset >= 13 or axis in (-1, rank - 1) else None
    axes = [a - rank if g.rng.random() < 0.4 else a for a in range(rank) if g.rng.random() < 0.4] or [1]
    if op == "ReduceSum" and g.opset >= 13 or g.opset >= 18:
        return g.add(op, [x, g.ints(axes)], keepdims=1)
    return g.add(op, [x], axes=axes, keepdims=1)


def _dropout(g: Graph, x: str) -> list[str] | None:
    """Dropout (any rank), its mask an output or not: the identity in inference, a mask drawn
    from the run's key in training (the gradient check's ``train=True`` run)."""
    ratio = float(_pick(g.rng, [0.1, 0.3, 0.5]))
    mask = g.opset >= 10 and g.rng.random() < 0.3
    # The mask as an output only where the specification says what it holds in inference (all
    # true, from opset 12): Dropout-10's onnxruntime gives all false, the ReferenceEvaluator true.
    outputs = 2 if mask and g.opset >= 12 else 1
    if g.opset < 12:
        return g.add("Dropout", [x], outputs, ratio=ratio)
    name = g.name("r")
    g.inits.append(numpy_helper.from_array(np.array(ratio, g.dtype), name))
    return g.add("Dropout", [x, name], outputs)


def _head(g: Graph, x: str) -> list[str] | None:
    """Flatten and a Gemm: the end of a branch (rank 2)."""
    if x not in g.flattened:
        made = g.add("Flatten", [x], axis=1)
        if made is None:
            return None
        g.flattened[x] = made[0]
    flat = g.flattened[x]
    features = g.shape_of(flat)[1]
    classes = int(g.rng.integers(1, 6))
    return g.add("Gemm", [flat, g.weight((classes, features), 1 / np.sqrt(features)), g.weight((classes,))], transB=1)


STEPS = {
    "conv": (_conv, 4),
    "conv_transpose": (_conv_transpose, 1),
    "batchnorm": (_batchnorm, 3),
    "instance_norm": (_instance_norm, 1),
    "pool": (_pool, 2),
    "activation": (_activation, 3),
    "arithmetic": (_arithmetic, 3),
    "concat": (_concat, 2),
    "split": (_split, 1),
    "pad": (_pad, 1),
    "slice": (_slice, 1),
    "resize": (_resize, 1),
    "transpose": (_transpose, 1),
    "reduce": (_reduce, 1),
    "head": (_head, 1),
    "dropout": (_dropout, 1),
}
_TAKE_OTHERS = {"arithmetic", "concat"}


# ---- encoder steps: each reads ``x`` of shape (B, T, D) (``others``: values it may pair with)


def _linear(g: Graph, x: str, others: list[str]) -> list[str] | None:
    """MatMul by a 2-D weight, often of a value another MatMul reads (attention's Q, K and V:
    the product fusion), with a bias Add or not."""
    read = [o for o in others if o in g.matmul_inputs]
    if read and g.rng.random() < 0.6:
        x = _pick(g.rng, read)
    g.matmul_inputs.add(x)
    d = g.shape_of(x)[-1]
    made = g.add("MatMul", [x, g.weight((d, _pick(g.rng, [d, 4, 6, 8])), 1 / np.sqrt(d))])
    if made is None or g.rng.random() < 0.4:
        return made
    return g.add("Add", [made[0], g.weight(g.shape_of(made[0])[-1:], 0.1)])


def _attention(g: Graph, x: str, others: list[str]) -> list[str] | None:
    """Softmax(q k^T * scale) v over three values of one shape (one head)."""
    same = [o for o in others if g.shape_of(o) == g.shape_of(x)] or [x]
    k, v = _pick(g.rng, same), _pick(g.rng, same)
    kt = g.add("Transpose", [k], perm=[0, 2, 1])
    scores = kt and g.add("MatMul", [x, kt[0]])
    scaled = scores and g.add("Mul", [scores[0], g.weight((), 0.2, positive=True)])
    weights = scaled and g.add("Softmax", [scaled[0]], axis=-1 if g.opset >= 13 else 2)
    return weights and g.add("MatMul", [weights[0], v])


def _layer_norm(g: Graph, x: str) -> list[str] | None:
    d = g.shape_of(x)[-1]
    if g.opset < 17:
        return _activation(g, x)
    return g.add("LayerNormalization", [x, g.weight((d,), 0.3, positive=True), g.weight((d,), 0.1)], axis=-1)


def _recurrent(g: Graph, x: str) -> list[str] | None:
    """An RNN, GRU or LSTM over ``x`` read as (T, B, D), or from opset 14 sometimes as (B, T, D)
    (``layout=1``), in a random direction, with or without bias, sequence lengths and initial
    state (and peepholes for an LSTM); its outputs Y and Y_h (directions and batch in the
    layout's order), the last of which goes on through the encoder."""
    op = _pick(g.rng, ["RNN", "GRU", "LSTM"])
    gates = {"RNN": 1, "GRU": 3, "LSTM": 4}[op]
    direction = _pick(g.rng, ["forward", "reverse", "bidirectional"])
    dirs = 2 if direction == "bidirectional" else 1
    layout = int(g.opset >= 14 and g.rng.random() < 0.5)
    first, second, d = g.shape_of(x)
    t, b = (second, first) if layout else (first, second)
    h = int(_pick(g.rng, [2, 3, 5]))
    state = (b, dirs, h) if layout else (dirs, b, h)
    scale = 1 / np.sqrt(max(d, h))
    inputs = [x, g.weight((dirs, gates * h, d), scale), g.weight((dirs, gates * h, h), scale)]
    if g.rng.random() < 0.7:
        lengths = ""
        if g.rng.random() < 0.4:  # some sequences shorter than T: masked steps, held states
            lengths = g.name("len")
            g.inits.append(numpy_helper.from_array(g.rng.integers(1, t + 1, b).astype(np.int32), lengths))
        inputs += [g.weight((dirs, 2 * gates * h), 0.1), lengths, g.weight(state, 0.5)]
        if op == "LSTM" and g.rng.random() < 0.5:
            inputs += [g.weight(state, 0.5), g.weight((dirs, 3 * h), 0.3)]
    attrs = {"hidden_size": h, "direction": direction}
    if layout:
        attrs["layout"] = 1
    if op == "GRU":
        attrs["linear_before_reset"] = int(g.rng.integers(2))
    made = g.add(op, inputs, 2, **attrs)
    return made and made[1:]


ENCODER_STEPS = {
    "linear": (_linear, 5),
    "recurrent": (_recurrent, 1),
    "attention": (_attention, 2),
    "layer_norm": (_layer_norm, 1),
    "activation": (_activation, 2),
    "arithmetic": (_arithmetic, 2),
    "concat": (_concat, 1),
    "split": (_split, 1),
    "reduce": (_reduce, 1),
    "dropout": (_dropout, 1),
}
_ENCODER_TAKE_OTHERS = {"linear", "attention", "arithmetic", "concat"}


def draw(seed: int, dtype=np.float32) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The graph of ``seed`` in ``dtype`` (the same graph and values for either float type)
    and its input: a CNN three times in four, else an encoder."""
    rng = np.random.default_rng(seed)
    opset = int(_pick(rng, [9, 11, 13, 16, 18, 21]))
    g = Graph(rng, opset, dtype)
    cnn = rng.random() < 0.75
    if cnn:  # (N, C, spatial...) through STEPS, starting with a Conv
        spatial = [int(rng.integers(3, 9)) for _ in range(_pick(rng, [1, 2, 2, 2, 3]))]
        if WIDE and len(spatial) == 2 and rng.random() < 0.6:  # a map of 784 cells or more
            spatial = [int(rng.integers(28, 33)) for _ in spatial]
        shape = (int(rng.integers(1, 3)), _width(rng, 1, 7), *spatial)
        steps, take_others, ranks = STEPS, _TAKE_OTHERS, (3, 5)
    else:  # (B, T, D) through ENCODER_STEPS
        shape = (int(rng.integers(1, 3)), _width(rng, 1, 6), _width(rng, 2, 9))  # --wide: longer, wider
        steps, take_others, ranks = ENCODER_STEPS, _ENCODER_TAKE_OTHERS, (3, 3)
    g.inputs.append(helper.make_tensor_value_info("x", g.elem, shape))
    g.shapes["x"], g.elems["x"] = shape, g.elem
    x = rng.standard_normal(shape).astype(dtype)
    if cnn:
        _conv(g, "x")
    names, weights = list(steps), np.array([w for _, w in steps.values()], float)
    for _ in range(int(rng.integers(2, 12))):
        usable = [v for v in g.shapes if ranks[0] <= len(g.shapes[v]) <= ranks[1] and g.elems[v] == g.elem]
        usable = [v for v in usable if v != "x"] if cnn else usable
        if not usable:
            break
        source = usable[-1] if rng.random() < 0.6 else _pick(rng, usable)
        step = names[int(rng.choice(len(names), p=weights / weights.sum()))]
        fn = steps[step][0]
        fn(g, source, usable) if step in take_others else fn(g, source)
    made = [v for v in g.shapes if v != "x"]
    if not made:
        return g.model([]), {"x": x}
    # The last float value first (not a Dropout's mask: the derivative checks project a float
    # output), then a few others.
    last = next((v for v in reversed(made) if g.elems[v] == g.elem), made[-1])
    outputs = [last, *[v for v in made if v != last and rng.random() < 0.15]]
    return g.model(outputs), {"x": x}


def _close(got, want, tolerance: float = FLOAT32_TOLERANCE) -> str | None:
    """Why ``got`` is not ``want``, or None: floats within ``tolerance`` times the larger of 1 and
    ``want``'s largest magnitude (by default float32 summation-order differences), other types
    exactly."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"{got.dtype}{list(got.shape)} against {want.dtype}{list(want.shape)}"
    if want.dtype.kind != "f":
        return None if np.array_equal(got, want) else "integers differ"
    scale = max(1.0, float(np.max(np.abs(want), initial=0.0)))
    gap = float(np.max(np.abs(got.astype(np.float64) - want), initial=0.0))
    return None if gap <= tolerance * scale else f"differs by {gap:.3g} (scale {scale:.3g})"


CONFIGS = {"default": True, "constant weights": {"constant_weights": True}, "unoptimized": False}


def check(seed: int) -> tuple[str, str | None]:
    """``(verdict, detail)`` for the graph of ``seed`` (against onnxruntime, or where it refuses
    the graph the ReferenceEvaluator): ``ok``, ``references fail``, ``reference
    disagrees`` (every configuration equals the ReferenceEvaluator, not onnxruntime, and the
    derivatives agree), ``differs`` (a configuration against the references, or a compiled
    derivative against the eager one) or ``raises``."""
    model, feeds = draw(seed, np.float16 if HALF else np.float32)
    if not model.graph.output:
        return "empty", None
    want = reference_outputs(model, feeds, onnxruntime_outputs)
    if want is None:
        return "references fail", None
    got, error = outputs_by_config(model, feeds, CONFIGS)
    if error:
        return "raises", error
    tolerance = HALF_TOLERANCE if HALF else FLOAT32_TOLERANCE
    found = _mismatches(got, want, tolerance)
    if found:
        try:
            reference = ReferenceEvaluator(model).run(None, feeds)
        except Exception:  # noqa: BLE001
            reference = None
        theirs = reference and [np.asarray(r, dtype=w.dtype) for r, w in zip(reference, want)]
        if reference is None or _mismatches(got, theirs, tolerance):
            return "differs", f"against onnxruntime: {found}"
    if HALF:
        return ("reference disagrees", None) if found else ("ok", None)
    with jax.enable_x64(True):  # float64 derivatives, whatever the caller set
        verdict = _check_gradient(seed, want)
    return ("reference disagrees", None) if found and verdict[0] == "ok" else verdict


def reference_outputs(model: onnx.ModelProto, feeds: dict, first) -> list | None:
    """``first(model, feeds)`` (onnxruntime, run as the fuzzer wants it), or where that refuses
    the graph (None) the ReferenceEvaluator's outputs; None where both refuse."""
    want = first(model, feeds)
    if want is not None:
        return want
    try:
        return [np.asarray(r) for r in ReferenceEvaluator(model).run(None, feeds)]
    except Exception:  # noqa: BLE001 -- any refusal: the graph has no reference
        return None


def outputs_by_config(model: onnx.ModelProto, feeds: dict, configs: dict) -> tuple[dict[str, list], str | None]:
    """Each configuration's outputs (``jonnx.load(model, optimize=option)(*feeds)``, as numpy
    arrays), or the first error, described for a finding."""
    got = {}
    for config, option in configs.items():
        try:
            got[config] = [np.asarray(y) for y in jonnx.load(model, optimize=option)(*feeds.values())]
        except Exception as e:  # noqa: BLE001 -- every error is a finding
            return got, f"{config}: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    return got, None


def _mismatches(got: dict[str, list], want: list, tolerance: float = FLOAT32_TOLERANCE) -> str | None:
    """Where the outputs of each configuration in ``got`` differ from ``want``, or None."""
    found = [
        f"{config} output {i}: {why}"
        for config, outputs in got.items()
        for i, (a, b) in enumerate(zip(outputs, want))
        if (why := _close(a, b, tolerance))
    ]
    return "; ".join(found) or None


def _check_gradient(seed: int, outputs: list[np.ndarray]) -> tuple[str, str | None]:
    """The float64 derivatives, compiled, through every pass and through none, against the
    unoptimized graph's run op by op; in inference and in training (BatchNormalization on batch
    statistics, Dropout masks from a key), with the outputs and new running statistics too.
    ``outputs`` (the value check's) give the loss its shapes."""
    model, feeds = draw(seed, np.float64)
    x = jnp.asarray(feeds["x"])
    plain, optimized = jonnx.load(model, optimize=False), jonnx.load(model, optimize=ALL_PASSES)
    rng = np.random.default_rng(seed + 1)
    projections = [rng.standard_normal(y.shape) if y.dtype.kind == "f" else None for y in outputs]
    key = jax.random.key(seed)

    def gradient(m: jonnx.Model, compiled: bool, train: bool):
        def loss(params, x):
            ys, state = m.apply_with_state(params, x, train=train, key=key)
            return sum(jnp.vdot(y, p) for y, p in zip(ys, projections) if p is not None), (ys, state)

        grad = jax.grad(loss, argnums=(0, 1), has_aux=True)
        return (jonnx.jit(grad) if compiled else grad)(m.params, x)

    # Only BatchNormalization and Dropout read the flag: elsewhere training is inference again.
    trains = any(n.op_type in ("BatchNormalization", "Dropout") for n in model.graph.node)
    for mode, train in (("inference", False), ("training", True))[: 1 + trains]:
        # The reference runs op by op: no XLA fusion can make it wrong too.
        want = jax.tree_util.tree_flatten_with_path(gradient(plain, compiled=False, train=train))[0]
        for config, m in (("unoptimized", plain), ("optimized", optimized)):
            try:
                got = jax.tree_util.tree_leaves(gradient(m, compiled=True, train=train))
            except Exception as e:  # noqa: BLE001
                return "raises", f"{config} {mode} gradient: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
            if len(got) != len(want):
                return "differs", f"{config} {mode}: {len(got)} results against {len(want)}"
            for (path, b), a in zip(want, got):
                if why := _close(a, b, tolerance=1e-9):  # float64 rounding
                    return "differs", f"{config} {mode} (compiled): {_leaf_name(path)} {why}"
    return _check_per_example(feeds["x"], projections, rng, plain=plain, optimized=optimized)


def _check_per_example(x: np.ndarray, projections: list, rng, **models: jonnx.Model) -> tuple[str, str | None]:
    """Per-example derivatives, as a research script takes them, through each of ``models``,
    each row against that row's own compiled derivative:

    - gradients: ``jax.vmap`` of ``jax.grad`` over a stack of two inputs (``x`` and a
      permutation of its values);
    - forward mode under ``jax.vmap``: the directional derivatives (``jax.jvp``) of those two
      inputs with their own tangents along one weight tangent, then of ``x`` along two weight
      tangents (as ``jax.jacfwd`` batches them). Only forward mode evaluates the tap-weights
      primitive of channels-first depthwise convolutions under vmap (reverse mode transposes it
      unevaluated), so only this reaches its batching rule;

    and each row's directional derivative against its gradient's (forward against reverse)."""
    rows = np.stack([x, rng.permutation(x.ravel()).reshape(x.shape)])
    x_tangents = rng.standard_normal(rows.shape)
    for config, m in models.items():
        verdict = _per_example_checks(config, m, rows, x_tangents, projections, rng)
        if verdict[0] != "ok":
            return verdict
    return "ok", None


def _per_example_checks(config, m: jonnx.Model, rows, x_tangents, projections, rng) -> tuple[str, str | None]:
    def loss(params, x):
        return sum(jnp.vdot(y, p) for y, p in zip(m.apply(params, x), projections) if p is not None)

    # (Every weight is a float: the gradient below is taken in all of them. Not all are float64:
    # a Resize's scales are float32 by the specification, so each tangent takes its weight's type.)
    def derivative(params, x, w_tangent, x_tangent):
        return jax.jvp(loss, (params, x), (w_tangent, x_tangent))[1]

    w_tangents = [{k: rng.standard_normal(v.shape).astype(v.dtype) for k, v in m.params.items()} for _ in rows]
    w_stacked = jax.tree_util.tree_map(lambda *a: np.stack(a), *w_tangents)
    checks = [  # (what, function, vmap's in_axes, batched arguments, row r's arguments)
        ("gradient", jax.grad(loss, (0, 1)), (None, 0), (m.params, rows), lambda r: (m.params, rows[r])),
        (
            "directional derivative",
            derivative,
            (None, 0, None, 0),
            (m.params, rows, w_tangents[0], x_tangents),
            lambda r: (m.params, rows[r], w_tangents[0], x_tangents[r]),
        ),
    ]
    if m.params:  # (a graph without weights has no weight tangents to batch)
        checks.append(
            (
                "directional derivative along weight tangents",
                derivative,
                (None, None, 0, None),
                (m.params, rows[0], w_stacked, x_tangents[0]),
                lambda r: (m.params, rows[0], w_tangents[r], x_tangents[0]),
            )
        )
    alone = {}
    for what, fn, in_axes, args, row_args in checks:
        one = jax.jit(fn)
        try:
            batched = jax.jit(jax.vmap(fn, in_axes=in_axes))(*args)
            alone[what] = [one(*row_args(r)) for r in range(len(rows))]
        except Exception as e:  # noqa: BLE001
            return "raises", f"{config} per-example {what}: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
        for r, want in enumerate(alone[what]):
            got = jax.tree_util.tree_map(lambda v, r=r: v[r], batched)
            for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(got)[0], jax.tree_util.tree_leaves(want)):
                if why := _close(a, b, tolerance=1e-9):
                    return "differs", f"{config} per-example {what} of row {r}: {jax.tree_util.keystr(path)} {why}"
    # Forward mode against reverse mode: each row's directional derivative is its gradient's
    # (a rule that works one way only, as a primitive evaluated forward and transposed back).
    for r, ((d_params, d_x), forward) in enumerate(zip(alone["gradient"], alone["directional derivative"])):
        terms = [d_params[k] * w_tangents[0][k] for k in m.params] + [d_x * x_tangents[r]]
        reverse = sum(float(jnp.sum(t)) for t in terms)
        if abs(float(forward) - reverse) > 1e-9 * (1 + sum(float(jnp.sum(jnp.abs(t))) for t in terms)):
            return "differs", f"{config} row {r}: forward mode gives {float(forward):.12g}, the gradient {reverse:.12g}"
    return "ok", None


def _leaf_name(path) -> str:
    """A leaf of ``((d params, d x), (outputs, new state))`` in words."""
    keys = [getattr(k, "key", getattr(k, "idx", None)) for k in path]
    part = {(0, 0): "the gradient of", (0, 1): "the input's gradient", (1, 0): "output", (1, 1): "new state"}
    return " ".join(str(k) for k in [part[keys[0], keys[1]], *keys[2:]])


def describe(seed: int) -> str:
    model, feeds = draw(seed)
    ops = [n.op_type for n in model.graph.node]
    return f"seed {seed}, opset {model.opset_import[0].version}, x {list(feeds['x'].shape)}: {' -> '.join(ops)}"


def run(seed: int, cases: int, *, trace: bool = False) -> tuple[collections.Counter, list[str]]:
    """Check the graphs of seeds ``seed * 100_000 + k``; the count of each verdict and the
    findings, printed as they come."""
    return run_seeds(seed, cases, check, describe, trace=trace)


def run_seeds(seed: int, cases: int, check, describe, *, trace: bool = False) -> tuple[collections.Counter, list[str]]:
    """:func:`run` for any graph fuzz: ``check(seed) -> (verdict, detail)`` and
    ``describe(seed) -> str`` for seeds ``seed * 100_000 + k``."""
    verdicts: collections.Counter = collections.Counter()
    findings = []
    for k in range(cases):
        case_seed = seed * 100_000 + k
        if trace:
            print(describe(case_seed), flush=True)
        verdict, detail = check(case_seed)
        verdicts[verdict] += 1
        if detail:
            findings.append(f"{verdict}: {describe(case_seed)}\n    {detail}")
            print(findings[-1], flush=True)
    return verdicts, findings


def run_cli(description: str, run, add_options, configure) -> int:
    """A graph fuzzer's command line: ``--seed``, ``--cases``, ``--trace`` and ``--lowering``,
    the fuzzer's own options (``add_options(parser)``, applied by ``configure(args)``), then
    ``run(seed, cases, trace=...)`` and the verdicts' counts."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cases", type=int, default=100)
    parser.add_argument("--trace", action="store_true", help="print each graph before running it")
    add_options(parser)
    add_lowering_option(parser)
    args = parser.parse_args()
    lower_as(args.lowering)
    configure(args)
    warnings.filterwarnings("ignore")
    ort.set_default_logger_severity(4)
    verdicts, _ = run(args.seed, args.cases, trace=args.trace)
    print(f"{sum(verdicts.values())} graphs (seed {args.seed}): {dict(verdicts)}")
    return 0


def _add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--wide", action="store_true", help="draw CNNs of 16-64 (and 512) channels and 28-32 cell maps at times"
    )
    parser.add_argument("--half", action="store_true", help="the graphs in float16 (values only)")


def _configure(args: argparse.Namespace) -> None:
    global WIDE, HALF
    WIDE, HALF = args.wide, args.half
    jax.config.update("jax_enable_x64", True)


def main() -> int:
    return run_cli(__doc__.splitlines()[0], run, _add_options, _configure)


if __name__ == "__main__":
    sys.exit(main())

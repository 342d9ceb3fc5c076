"""Differential fuzzing of quantized CNN graphs through the optimization passes.

A developer's tool, not a test: ``python -m tests.conformance.fuzz_quantized [--seed S]
[--cases N] [--wide] [--encoders] [--lowering elsewhere] [--trace]`` draws graphs of up to 12 steps in the three
forms onnxruntime's quantization tools write, each step reading a random earlier value:

- **QDQ** (``quantize_static``'s default): float operators between DequantizeLinear and
  QuantizeLinear pairs: Conv of dequantized 8-bit weights (per tensor, or per output channel
  from opset 13; grouped, depthwise, strided, dilated, padded; a float bias or a dequantized
  int32 one), Add, Mul, Concat, MaxPool, AveragePool, GlobalAveragePool, Relu, Sigmoid,
  LeakyRelu, and at times a float op straight after another, or a per-channel pair on an
  activation, which the ``quantized_convs`` pass must leave in float;
- **QOperator**: QLinearConv (uint8 or int8 weights, per tensor or per channel, int32 bias),
  MaxPool on uint8 (opset 12+) and onnxruntime's com.microsoft QLinearAdd, QLinearMul,
  QLinearSigmoid, QLinearLeakyRelu, QLinearGlobalAveragePool, QLinearAveragePool and
  QLinearConcat, and its QLinearConv with ``channels_last=1`` between two Transposes (what its
  NHWC transformer writes);
- **dynamic** (``quantize_dynamic``): DynamicQuantizeLinear, ConvInteger, Cast, the scales'
  product, a bias through a Reshape of a constant, Relu, Add.

``--encoders`` draws the same forms over (B, T, D) values, with products where the CNNs have
convolutions: MatMul of dequantized weights (per column from opset 13), QLinearMatMul, and
com.microsoft QGemm (as onnxruntime's quantize_static writes a Gemm), a Softmax (QDQ) or
QLinearSoftmax, QLinearWhere, and
DynamicQuantizeLinear + MatMulInteger as quantize_dynamic writes a transformer's projections,
or the com.microsoft DynamicQuantizeMatMul and MatMulIntegerToFloat that onnxruntime's
optimizer makes of them, and its QAttention (an optimized BERT's Attention, quantized).

Every scale is a power of two and the drawn fan-ins are small, so every dequantized value,
product and sum is an integer multiple of a power of two that float32 holds exactly, and each
engine rounds the same numbers. The outputs (the last value dequantized, and some 8-bit values
on the way) of jonnx's ``Model(*inputs)`` (the default passes: channels-last,
``quantized_convs``), with ``constant_weights``, without ``quantized_convs`` and with
``optimize=False`` must equal one another to the bit (the dynamic form's float ops within the
same ``near`` as below: XLA's fused multiply-adds follow its fusions): the passes may not move
a value. Against
onnxruntime (its graph optimizations off, ``_onnxruntime_unfused``; the ReferenceEvaluator where
it refuses the graph) they are ``ok`` when equal and ``near`` (not a finding) where a few values
differ within ``NEAR`` and ``NEAR_SHARE``, or all within ``FLOAT_NEAR``: a value on a near tie
(a sigmoid's or an average's last bit, the dynamic form's computed scales and XLA's fused
multiply-adds) rounds to the other side, and what follows from it moves by a unit of its own
scale.

Graphs of float operators are ``fuzz_graphs.py``'s; single ops against the references,
``fuzz.py``'s.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from tests.conformance.fuzz_graphs import Graph, _pick, outputs_by_config, reference_outputs, run_cli, run_seeds

MS = "com.microsoft"
FORMS = ("qdq", "qoperator", "dynamic")
OPSETS = {"qdq": (10, 13, 19, 21), "qoperator": (10, 13, 21), "dynamic": (11, 13, 21)}
CONFIGS = {
    "default": True,
    "constant weights": {"constant_weights": True},
    "no quantized_convs": {"quantized_convs": False},
    "unoptimized": False,
}
U8, F32 = onnx.TensorProto.UINT8, onnx.TensorProto.FLOAT
# --wide: at times 16-128 channels, grouped by 2, 4 or 8 as well as depthwise, so that the
# convolutions reach the lowerings chosen by size (ops/quantize.py): windows deeper than one
# exact float32 convolution holds (the 4-bit halves), products deeper than one exact bfloat16
# dot (summed in chunks). Without it the graphs keep to 1-6 channels.
WIDE = False
# --encoders: (B, T, D) values through 8-bit products (MatMul of dequantized weights,
# QLinearMatMul, MatMulInteger) instead of convolutions; --wide draws 64-128 features then.
ENCODERS = False
WIDE_CHANNELS = (16, 32, 64, 128)


@dataclasses.dataclass(frozen=True)
class Quantized:
    """An 8-bit value and its scale and zero point (initializer names; ``axis`` for a
    per-channel pair)."""

    name: str
    scale: str
    zero: str
    axis: int | None = None


class QGraph(Graph):
    """A graph under construction, with com.microsoft nodes (whose shapes onnx cannot infer:
    :meth:`add_known` takes them from the caller) and the 8-bit values drawn so far."""

    def __init__(self, rng: np.random.Generator, opset: int, form: str):
        super().__init__(rng, opset, np.float32)
        self.form = form
        self.values: list[Quantized] = []

    def model(self, outputs: list[str]) -> onnx.ModelProto:
        model = super().model(outputs)
        ours = [o for n in self.nodes if n.domain == MS for o in n.output]
        if ours:  # their shapes, for onnx's inference of what follows them
            model.opset_import.append(helper.make_opsetid(MS, 1))
            model.graph.value_info.extend(helper.make_tensor_value_info(o, self.elems[o], self.shapes[o]) for o in ours)
        return model

    def add_known(self, op: str, inputs: list[str], shape: tuple[int, ...], elem: int, **attrs) -> str:
        out = self.name(op.lower()) + "_0"
        self.nodes.append(helper.make_node(op, inputs, [out], domain=MS, **attrs))
        self.shapes[out], self.elems[out] = tuple(shape), elem
        return out

    def const(self, values, dtype) -> str:
        name = self.name("c")
        self.inits.append(numpy_helper.from_array(np.asarray(values).astype(dtype), name))
        return name

    def scale(self, shape=(), low: int = 2, high: int = 7) -> str:
        """Powers of two: every dequantized value and product is exact in float32."""
        return self.const(2.0 ** -self.rng.integers(low, high, shape), np.float32)

    def zero(self, dtype, shape=()) -> str:
        low, high = (100, 156) if dtype == np.uint8 else (-20, 21)
        return self.const(self.rng.integers(low, high, shape), dtype)

    def value(self, name: str) -> np.ndarray:
        """An initializer's value."""
        return next(numpy_helper.to_array(i) for i in self.inits if i.name == name)

    def ints8(self, shape, dtype) -> str:
        low, high = (0, 256) if dtype == np.uint8 else (-128, 128)
        return self.const(self.rng.integers(low, high, shape), dtype)


# ---- QDQ: float operators between DequantizeLinear and QuantizeLinear


def _dequantize(g: QGraph, q: Quantized) -> str:
    attrs = {} if q.axis is None else {"axis": q.axis}
    return g.add("DequantizeLinear", [q.name, q.scale, q.zero], **attrs)[0]


def _quantize(g: QGraph, x: str) -> Quantized | None:
    """A QuantizeLinear to uint8, per tensor, or (QDQ from opset 13, at times) per channel."""
    channels = g.shape_of(x)[1]
    if g.form == "qdq" and g.opset >= 13 and g.rng.random() < 0.15:
        q = Quantized("", g.scale((channels,)), g.zero(np.uint8, (channels,)), axis=1)
    else:
        q = Quantized("", g.scale(), g.zero(np.uint8))
    attrs = {} if q.axis is None else {"axis": 1}
    made = g.add("QuantizeLinear", [x, q.scale, q.zero], **attrs)
    return made and dataclasses.replace(q, name=made[0])


def _channels(rng: np.random.Generator) -> int:
    """A channel count: 1-6, or under --wide at times one of WIDE_CHANNELS."""
    if WIDE and rng.random() < 0.7:
        return int(_pick(rng, WIDE_CHANNELS))
    return int(rng.integers(1, 7))


def _conv_geometry(g: QGraph, shape) -> tuple[int, int, list[int], dict]:
    """Groups, output channels, kernel and attributes of a small convolution over ``shape``."""
    channels, spatial = shape[1], shape[2:]
    if WIDE:  # small groups of many channels: windows deeper than one exact float32 sum
        groups = _pick(g.rng, [1, 1, channels, *[k for k in (2, 2, 4, 8) if channels % k == 0]])
    else:
        groups = _pick(g.rng, [1, 1, 1, channels, *[k for k in (2, 3) if channels % k == 0]])
    out = groups * int(g.rng.integers(1, 3)) if groups > 1 else _channels(g.rng)
    kernel = [int(g.rng.integers(1, min(3, s) + 1)) for s in spatial]
    if WIDE and g.rng.random() < 0.5:  # the full 3 x 3 (x 3) windows the deep lowerings need
        kernel = [min(3, s) for s in spatial]
    attrs: dict = {"kernel_shape": kernel, "group": groups}
    if g.rng.random() < 0.4:
        attrs["strides"] = [int(g.rng.integers(1, 3)) for _ in spatial]
    if g.rng.random() < 0.2:
        attrs["dilations"] = [2 if (k - 1) * 2 < s else 1 for k, s in zip(kernel, spatial)]
    if g.rng.random() < 0.6:
        attrs["pads"] = [int(g.rng.integers(0, k)) for k in kernel * 2]
    return groups, out, kernel, attrs


def _qdq_conv(g: QGraph, q: Quantized) -> str | None:
    shape = g.shape_of(q.name)
    groups, out, kernel, attrs = _conv_geometry(g, shape)
    per_channel = g.opset >= 13 and g.rng.random() < 0.5
    w_scale = g.scale((out,) if per_channel else ())
    w_zero = g.const(np.zeros((out,) if per_channel else ()), np.int8)
    # Weights small enough that the float convolution of the unoptimized graph sums exactly too
    # (every partial sum below 2**24 units): deep --wide windows draw from a narrower range.
    fan_in = shape[1] // groups * int(np.prod(kernel))
    reach = int(min(128, (2**24 - 1) // (fan_in * 256)))
    weights = g.const(g.rng.integers(-reach, min(reach + 1, 128), (out, shape[1] // groups, *kernel)), np.int8)
    w = g.add(
        "DequantizeLinear",
        [weights, w_scale, w_zero],
        **({"axis": 0} if per_channel else {}),
    )[0]
    inputs = [_dequantize(g, q), w]
    if g.rng.random() < 0.4:  # a float bias of multiples of 1/256
        inputs.append(g.const(g.rng.integers(-64, 64, out) / 256, np.float32))
    elif g.rng.random() < 0.5 and q.axis is None:  # quantize_static's: int32, scaled by x_scale * w_scale
        b_scale = g.const(g.value(q.scale) * g.value(w_scale), np.float32)
        zeros = g.const(np.zeros(np.shape(g.value(w_scale))), np.int32)
        b = g.const(g.rng.integers(-500, 500, out), np.int32)
        inputs.append(g.add("DequantizeLinear", [b, b_scale, zeros], **({"axis": 0} if per_channel else {}))[0])
    made = g.add("Conv", inputs, **attrs)
    return made and made[0]


def _qdq_step(g: QGraph, q: Quantized) -> Quantized | None:
    step = _pick(g.rng, ["conv", "conv", "conv", "add", "mul", "concat", "pool", "activation"])
    if step == "conv":
        y = _qdq_conv(g, q)
    elif step in ("add", "mul", "concat"):
        same = [v for v in g.values if g.shape_of(v.name)[0] == g.shape_of(q.name)[0]]
        if step == "concat":
            same = [v for v in same if g.shape_of(v.name)[2:] == g.shape_of(q.name)[2:]]
        else:
            same = [v for v in same if g.shape_of(v.name) == g.shape_of(q.name)]
        other = _pick(g.rng, same or [q])
        a, b = _dequantize(g, q), _dequantize(g, other)
        made = g.add(
            {"add": "Add", "mul": "Mul", "concat": "Concat"}[step], [a, b], **({"axis": 1} if step == "concat" else {})
        )
        y = made and made[0]
    elif step == "pool":
        y = _pool(g, _dequantize(g, q))
    else:
        y = _activation(g, _dequantize(g, q))
    if y is None:
        return None
    if g.rng.random() < 0.3:  # a float op straight after another: no pair between them
        y = _activation(g, y) or y
    return _quantize(g, y)


def _pool(g: QGraph, x: str, op: str | None = None) -> str | None:
    spatial = g.shape_of(x)[2:]
    op = op or _pick(g.rng, ["MaxPool", "AveragePool", "GlobalAveragePool"])
    if op == "GlobalAveragePool":
        made = g.add(op, [x])
        return made and made[0]
    kernel = [int(g.rng.integers(1, min(3, s) + 1)) for s in spatial]
    attrs: dict = {"kernel_shape": kernel, "strides": [int(g.rng.integers(1, 3)) for _ in spatial]}
    if g.rng.random() < 0.5:
        attrs["pads"] = [int(g.rng.integers(0, k)) for k in kernel * 2]
    made = g.add(op, [x], **attrs)
    return made and made[0]


def _activation(g: QGraph, x: str) -> str | None:
    op = _pick(g.rng, ["Relu", "Relu", "Sigmoid", "LeakyRelu"])
    made = g.add(op, [x], **({"alpha": 0.125} if op == "LeakyRelu" else {}))
    return made and made[0]


# ---- QOperator: onnxruntime's quantized operators on uint8 values


def _qop_step(g: QGraph, q: Quantized) -> Quantized | None:
    shape = g.shape_of(q.name)
    step = _pick(g.rng, ["conv", "conv", "conv", "add", "mul", "concat", "pool", "maxpool", "sigmoid", "leaky"])
    y = Quantized("", g.scale(), g.zero(np.uint8))
    if step == "conv":
        groups, out, kernel, attrs = _conv_geometry(g, shape)
        per_channel = g.rng.random() < 0.5
        wtype = _pick(g.rng, [np.int8, np.int8, np.uint8])
        w = g.ints8((out, shape[1] // groups, *kernel), wtype)
        w_zero = g.zero(wtype, (out,) if per_channel and wtype == np.int8 else ())
        if wtype == np.int8:
            w_zero = g.const(np.zeros(np.shape(g.value(w_zero))), np.int8)
        inputs = [q.name, q.scale, q.zero, w, g.scale((out,) if per_channel else ()), w_zero, y.scale, y.zero]
        if g.rng.random() < 0.6:
            inputs.append(g.const(g.rng.integers(-500, 500, out), np.int32))
        if g.rng.random() < 0.25:
            return _qlinear_conv_channels_last(g, inputs, attrs, y)
        made = g.add("QLinearConv", inputs, **attrs)
        return made and dataclasses.replace(y, name=made[0])
    if step == "maxpool":
        if g.opset < 12:
            return None
        x = _pool(g, q.name, "MaxPool")
        return x and Quantized(x, q.scale, q.zero)
    if step in ("add", "mul", "sigmoid", "leaky"):
        return _qop_elementwise(g, q, y, step)
    if step == "concat":
        same = [v for v in g.values if g.shape_of(v.name)[0] == shape[0] and g.shape_of(v.name)[2:] == shape[2:]]
        others = [q, _pick(g.rng, same or [q])]
        inputs = [y.scale, y.zero] + [n for v in others for n in (v.name, v.scale, v.zero)]
        out = (shape[0], sum(g.shape_of(v.name)[1] for v in others), *shape[2:])
        return dataclasses.replace(y, name=g.add_known("QLinearConcat", inputs, out, U8, axis=1))
    if step == "pool":
        if g.rng.random() < 0.5:
            out = (*shape[:2], *(1 for _ in shape[2:]))
            name = g.add_known(
                "QLinearGlobalAveragePool", [q.name, q.scale, q.zero, y.scale, y.zero], out, U8, channels_last=0
            )
            return dataclasses.replace(y, name=name)
        spatial = shape[2:]
        kernel = [int(g.rng.integers(1, min(3, s) + 1)) for s in spatial]
        strides = [int(g.rng.integers(1, 3)) for _ in spatial]
        out = (*shape[:2], *((s - k) // t + 1 for s, k, t in zip(spatial, kernel, strides)))
        inputs = [q.name, q.scale, q.zero, y.scale, y.zero]
        name = g.add_known("QLinearAveragePool", inputs, out, U8, kernel_shape=kernel, strides=strides)
        return dataclasses.replace(y, name=name)


def _qlinear_conv_channels_last(g: QGraph, inputs: list[str], attrs: dict, y: Quantized) -> Quantized | None:
    """com.microsoft QLinearConv with ``channels_last=1`` between two Transposes, as
    onnxruntime's NHWC transformer writes it (the weights stay OI(D)HW)."""
    shape, w_shape = g.shape_of(inputs[0]), np.shape(g.value(inputs[3]))
    rank, spatial, kernel = len(shape), shape[2:], w_shape[2:]
    strides = attrs.get("strides", [1] * len(spatial))
    dilations = attrs.get("dilations", [1] * len(spatial))
    pads = attrs.get("pads", [0] * 2 * len(spatial))
    out = [
        (s + pads[i] + pads[i + len(spatial)] - d * (k - 1) - 1) // t + 1
        for i, (s, k, t, d) in enumerate(zip(spatial, kernel, strides, dilations))
    ]
    if min(out) < 1:
        return None
    x = g.add("Transpose", [inputs[0]], perm=[0, *range(2, rank), 1])[0]
    made = g.add_known("QLinearConv", [x, *inputs[1:]], (shape[0], *out, w_shape[0]), U8, channels_last=1, **attrs)
    return dataclasses.replace(y, name=g.add("Transpose", [made], perm=[0, rank - 1, *range(1, rank - 1)])[0])


# ---- dynamic: DynamicQuantizeLinear before each ConvInteger, the scales applied in float


def _float_step(g: QGraph, x: str, step: str) -> str:
    """The dynamic form's float steps: a Relu, or an Add of two values of one shape."""
    if step == "relu":
        return g.add("Relu", [x])[0]
    same = [v for v in g.shapes if g.shape_of(v) == g.shape_of(x) and g.elems[v] == F32] or [x]
    return g.add("Add", [x, _pick(g.rng, same)])[0]


def _dynamic_step(g: QGraph, x: str) -> str | None:
    """``x`` (float) through DynamicQuantizeLinear, ConvInteger, the scales and a bias; or a
    Relu, or an Add of two float values."""
    step = _pick(g.rng, ["conv", "conv", "conv", "relu", "add"])
    if step != "conv":
        return _float_step(g, x, step)
    q, q_scale, q_zero = g.add("DynamicQuantizeLinear", [x], 3)
    groups, out, kernel, attrs = _conv_geometry(g, g.shape_of(x))
    wtype = _pick(g.rng, [np.uint8, np.int8])
    w = g.ints8((out, g.shape_of(x)[1] // groups, *kernel), wtype)
    made = g.add("ConvInteger", [q, w, q_zero, g.zero(wtype)], **attrs)
    if made is None:
        return None
    y = g.add("Cast", made, to=F32)[0]
    scale = g.add("Mul", [q_scale, g.scale()])[0]
    y = g.add("Mul", [y, scale])[0]
    if g.rng.random() < 0.6:
        bias = g.const(g.rng.integers(-64, 64, out) / 256, np.float32)  # (C,) to (1, C, 1, ...)
        y = g.add("Add", [y, g.add("Reshape", [bias, g.ints([1, -1] + [1] * len(kernel))])[0]])[0]
    return y


# ---- --encoders: the same three forms over (B, T, D) values, products instead of convolutions


def _width(g: QGraph) -> int:
    return int(_pick(g.rng, (4, 8, 16) + ((64, 128) if WIDE else ())))


def _same_shape(g: QGraph, q: Quantized) -> Quantized:
    return _pick(g.rng, [v for v in g.values if g.shape_of(v.name) == g.shape_of(q.name)] or [q])


def _qdq_encoder_step(g: QGraph, q: Quantized) -> Quantized | None:
    """MatMul of dequantized 8-bit weights (per tensor, or per column from opset 13) with a
    float bias or none; Add or Mul of two values; an activation."""
    step = _pick(g.rng, ["matmul", "matmul", "matmul", "add", "mul", "activation", "softmax"])
    if step == "matmul":
        d, n = g.shape_of(q.name)[-1], _width(g)
        per_column = g.opset >= 13 and g.rng.random() < 0.5
        reach = int(min(128, (2**24 - 1) // (d * 256)))  # exact float sums in the plain graph
        weights = g.const(g.rng.integers(-reach, min(reach + 1, 128), (d, n)), np.int8)
        zeros = g.const(np.zeros((n,) if per_column else ()), np.int8)
        w = g.add(
            "DequantizeLinear",
            [weights, g.scale((n,) if per_column else ()), zeros],
            **({"axis": 1} if per_column else {}),
        )
        y = g.add("MatMul", [_dequantize(g, q), w[0]])[0]
        if g.rng.random() < 0.5:
            y = g.add("Add", [y, g.const(g.rng.integers(-64, 64, n) / 256, np.float32)])[0]
    elif step in ("add", "mul"):
        y = g.add("Add" if step == "add" else "Mul", [_dequantize(g, q), _dequantize(g, _same_shape(g, q))])[0]
    elif step == "softmax":
        y = g.add("Softmax", [_dequantize(g, q)], axis=-1)[0]
    else:
        y = _activation(g, _dequantize(g, q))
    return y and _quantize(g, y)


def _qop_encoder_step(g: QGraph, q: Quantized) -> Quantized | None:
    """QLinearMatMul (uint8 or int8 weights, per tensor or per column), com.microsoft QGemm,
    QLinearAdd, QLinearMul, QLinearSigmoid, QLinearLeakyRelu, QLinearSoftmax, QLinearWhere."""
    shape = g.shape_of(q.name)
    step = _pick(g.rng, ["matmul", "matmul", "gemm", "add", "mul", "sigmoid", "leaky", "softmax", "where"])
    y = Quantized("", g.scale(), g.zero(np.uint8))
    if step == "gemm":
        return _qgemm(g, q, y)
    if step in ("softmax", "where"):
        return _qop_softmax_or_where(g, q, y, step)
    if step == "matmul":
        n = _width(g)
        wtype = _pick(g.rng, [np.int8, np.int8, np.uint8])
        per_column = g.rng.random() < 0.5
        w_zero = g.const(np.zeros((n,) if per_column else ()), np.int8) if wtype == np.int8 else g.zero(np.uint8)
        scale = g.scale((n,) if per_column and wtype == np.int8 else ())
        inputs = [q.name, q.scale, q.zero, g.ints8((shape[-1], n), wtype), scale, w_zero, y.scale, y.zero]
        made = g.add("QLinearMatMul", inputs)
        return made and dataclasses.replace(y, name=made[0])
    return _qop_elementwise(g, q, y, step)


def _qgemm(g: QGraph, q: Quantized, y: Quantized) -> Quantized | None:
    """com.microsoft QGemm of ``q``'s rows (a Reshape to two axes and back) with 8-bit weights
    (per tensor, or per column for int8), stored transposed at times (``transB``), an int32
    bias at times, ``alpha`` 1 or 1/2; into ``y``'s scale and zero point, or (without them) to
    float and through a QuantizeLinear."""
    *lead, d = g.shape_of(q.name)
    n, rows = _width(g), int(np.prod(lead))
    wtype = _pick(g.rng, [np.int8, np.int8, np.uint8])
    columns = (n,) if wtype == np.int8 and g.rng.random() < 0.5 else ()
    transposed = g.rng.random() < 0.5
    weights = g.ints8((n, d) if transposed else (d, n), wtype)
    w_zero = g.const(np.zeros(columns), np.int8) if wtype == np.int8 else g.zero(np.uint8)
    a = g.add("Reshape", [q.name, g.ints([rows, d])])[0]
    bias = g.const(g.rng.integers(-500, 500, n), np.int32) if g.rng.random() < 0.6 else ""
    requantized = g.rng.random() < 0.7
    inputs = [a, q.scale, q.zero, weights, g.scale(columns), w_zero, bias, *((y.scale, y.zero) if requantized else ())]
    alpha = float(_pick(g.rng, [1.0, 1.0, 0.5]))
    made = g.add_known("QGemm", inputs, (rows, n), U8 if requantized else F32, transB=int(transposed), alpha=alpha)
    made = g.add("Reshape", [made, g.ints([*lead, n])])[0]
    if requantized:
        return dataclasses.replace(y, name=made)
    return _quantize(g, made)


def _qop_softmax_or_where(g: QGraph, q: Quantized, y: Quantized, step: str) -> Quantized:
    """com.microsoft QLinearSoftmax of ``q`` (over the last axis, or at times over the last
    two as the ``opset`` 1 form's coercion at ``axis=1`` reads them) into 1/256 steps from 0,
    as onnxruntime's quantizer writes it; or QLinearWhere choosing between ``q`` and a value
    of its shape by a constant condition (per feature or per element) into ``y``."""
    shape = g.shape_of(q.name)
    if step == "softmax":
        y = Quantized("", g.const(2.0**-8, np.float32), g.const(0, np.uint8))
        opset, axis = (1, 1) if g.rng.random() < 0.3 else (13, -1)
        inputs = [q.name, q.scale, q.zero, y.scale, y.zero]
        return dataclasses.replace(y, name=g.add_known("QLinearSoftmax", inputs, shape, U8, axis=axis, opset=opset))
    other = _same_shape(g, q)
    condition = g.const(g.rng.random(shape[-1:] if g.rng.random() < 0.5 else shape) < 0.5, np.bool_)
    inputs = [condition, q.name, q.scale, q.zero, other.name, other.scale, other.zero, y.scale, y.zero]
    return dataclasses.replace(y, name=g.add_known("QLinearWhere", inputs, shape, U8))


def _qop_elementwise(g: QGraph, q: Quantized, y: Quantized, step: str) -> Quantized:
    """com.microsoft QLinearAdd or QLinearMul of ``q`` and a value of its shape, or
    QLinearSigmoid or QLinearLeakyRelu of ``q``, into ``y``'s scale and zero point."""
    shape = g.shape_of(q.name)
    if step in ("add", "mul"):
        other = _same_shape(g, q)
        inputs = [q.name, q.scale, q.zero, other.name, other.scale, other.zero, y.scale, y.zero]
        op = "QLinearAdd" if step == "add" else "QLinearMul"
        return dataclasses.replace(y, name=g.add_known(op, inputs, shape, U8))
    op = "QLinearSigmoid" if step == "sigmoid" else "QLinearLeakyRelu"
    attrs = {"alpha": 0.125} if step == "leaky" else {}
    return dataclasses.replace(y, name=g.add_known(op, [q.name, q.scale, q.zero, y.scale, y.zero], shape, U8, **attrs))


def _dynamic_encoder_step(g: QGraph, x: str) -> str | None:
    """``x`` through a product of its 8-bit quantization: DynamicQuantizeLinear, MatMulInteger,
    the scales and a bias (as quantize_dynamic writes a transformer's projections), or the
    com.microsoft ops onnxruntime's optimizer fuses that into (DynamicQuantizeMatMul;
    DynamicQuantizeLinear and MatMulIntegerToFloat), those with per-column weight scales and
    zero points at times; or a Relu, or an Add."""
    step = _pick(g.rng, ["matmul", "matmul", "matmul", "attention", "relu", "add"])
    if step == "attention":
        return _qattention(g, x)
    if step != "matmul":
        return _float_step(g, x, step)
    kind = _pick(g.rng, ["MatMulInteger", "MatMulInteger", "DynamicQuantizeMatMul", "MatMulIntegerToFloat"])
    n, wtype = _width(g), _pick(g.rng, [np.int8, np.int8, np.uint8])
    columns = (n,) if kind != "MatMulInteger" and g.rng.random() < 0.5 else ()
    weights, w_scale, w_zero = g.ints8((g.shape_of(x)[-1], n), wtype), g.scale(columns), g.zero(wtype, columns)
    bias = g.const(g.rng.integers(-64, 64, n) / 256, np.float32) if g.rng.random() < 0.6 else None
    shape = (*g.shape_of(x)[:-1], n)
    if kind == "DynamicQuantizeMatMul":
        return g.add_known(kind, [x, weights, w_scale, w_zero, *([bias] if bias else [])], shape, F32)
    q, q_scale, q_zero = g.add("DynamicQuantizeLinear", [x], 3)
    if kind == "MatMulIntegerToFloat":
        inputs = [q, weights, q_scale, w_scale, q_zero, w_zero, *([bias] if bias else [])]
        return g.add_known(kind, inputs, shape, F32)
    made = g.add("MatMulInteger", [q, weights, q_zero, w_zero])
    y = g.add("Mul", [g.add("Cast", made, to=F32)[0], g.add("Mul", [q_scale, w_scale])[0]])[0]
    return g.add("Add", [y, bias])[0] if bias else y


def _qattention(g: QGraph, x: str) -> str:
    """com.microsoft QAttention of ``x``'s DynamicQuantizeLinear (as quantize_dynamic writes an
    optimized BERT's Attention): 8-bit Q, K and V weights (per column at times), a float bias,
    1-4 heads, at times causal (``unidirectional``) or with key lengths as its mask."""
    b, t, d = g.shape_of(x)
    q, q_scale, q_zero = g.add("DynamicQuantizeLinear", [x], 3)
    wtype = _pick(g.rng, [np.int8, np.int8, np.uint8])
    columns = (3 * d,) if g.rng.random() < 0.4 else ()
    bias = g.const(g.rng.integers(-64, 64, 3 * d) / 256, np.float32)
    mask = g.const(g.rng.integers(1, t + 1, b), np.int32) if g.rng.random() < 0.4 else ""
    weights, w_scale, w_zero = g.ints8((d, 3 * d), wtype), g.scale(columns, 6, 10), g.zero(wtype, columns)
    inputs = [q, weights, bias, q_scale, w_scale, mask, q_zero, w_zero]
    heads = int(_pick(g.rng, [h for h in (1, 2, 4) if d % h == 0]))
    return g.add_known("QAttention", inputs, (b, t, d), F32, num_heads=heads, unidirectional=int(g.rng.random() < 0.3))


def _draw_encoder(rng: np.random.Generator, form: str, g: QGraph) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    shape = (int(rng.integers(1, 3)), int(rng.integers(1, 9)), _width(g))
    x = _graph_input(g, shape)
    if form == "dynamic":
        value = "x"
        for _ in range(int(rng.integers(1, 8))):
            value = _dynamic_encoder_step(g, value) or value
        return _named(g.model([value]), form), {"x": x}
    g.values.append(_quantize(g, "x"))
    step = _qdq_encoder_step if form == "qdq" else _qop_encoder_step
    for _ in range(int(rng.integers(1, 10))):
        made = step(g, g.values[-1] if rng.random() < 0.6 else _pick(rng, g.values))
        if made is not None:
            g.values.append(made)
    return _named(g.model([_dequantize(g, g.values[-1])]), form), {"x": x}


def draw(seed: int) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The quantized graph of ``seed`` and its input."""
    rng = np.random.default_rng(seed)
    form = _pick(rng, FORMS)
    g = QGraph(rng, int(_pick(rng, OPSETS[form])), form)
    if ENCODERS:
        return _draw_encoder(rng, form, g)
    spatial = [int(rng.integers(3, 9)) for _ in range(_pick(rng, [1, 2, 2, 2, 3]))]
    shape = (int(rng.integers(1, 3)), _channels(rng), *spatial)
    x = _graph_input(g, shape)
    outputs = []
    if form == "dynamic":
        value = "x"
        for _ in range(int(rng.integers(1, 8))):
            floats = [v for v in g.shapes if g.elems[v] == F32 and len(g.shapes[v]) == len(shape) and v != "x"]
            value = _dynamic_step(g, value if rng.random() < 0.6 or not floats else _pick(rng, floats)) or value
        return _named(g.model([value]), form), {"x": x}
    first = _quantize(g, "x")
    g.values.append(first)
    step = _qdq_step if form == "qdq" else _qop_step
    for _ in range(int(rng.integers(1, 12))):
        source = g.values[-1] if rng.random() < 0.6 else _pick(rng, g.values)
        made = step(g, source)
        if made is not None:
            g.values.append(made)
            if rng.random() < 0.15:
                outputs.append(made.name)  # an 8-bit value on the way, as the graph has it
    last = g.values[-1]
    return _named(g.model([_dequantize(g, last), *[o for o in outputs if o != last.name]]), form), {"x": x}


def _graph_input(g: QGraph, shape: tuple[int, ...]) -> np.ndarray:
    """The float input ``x`` of ``shape``, and its value."""
    g.inputs.append(helper.make_tensor_value_info("x", F32, shape))
    g.shapes["x"], g.elems["x"] = shape, F32
    return (g.rng.standard_normal(shape) * 2).astype(np.float32)


def _named(model: onnx.ModelProto, form: str) -> onnx.ModelProto:
    model.doc_string = form
    return model


# How far a configuration may differ from the references where it does not equal them: a few
# values (at most NEAR_SHARE of an output) by at most NEAR of the output's largest magnitude.
# At a near tie an 8-bit value can round to the other side (a sigmoid's or an average's last
# bit, XLA's fused multiply-adds in the dynamic form's float ops), and what is computed from
# that value moves by a unit of its own scale.
NEAR, NEAR_SHARE = 0.1, 0.3
# Or every value within float32 rounding: the dynamic form's float values (its scales computed
# from the data) can differ by a unit in their last place everywhere after one such move.
FLOAT_NEAR = 1e-5


def _differences(got: list, want: list) -> tuple[str | None, bool]:
    """Where ``got`` differs from ``want`` at all, or None; and whether the differences are
    near (``NEAR`` and ``NEAR_SHARE``, or ``FLOAT_NEAR``)."""
    found, near = [], True
    for i, (a, b) in enumerate(zip(got, want)):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape or a.dtype != b.dtype:
            found.append(f"output {i}: {a.dtype}{list(a.shape)} against {b.dtype}{list(b.shape)}")
            near = False
        elif not np.array_equal(a, b):
            gap = np.abs(a.astype(np.float64) - b.astype(np.float64))
            found.append(f"output {i}: {int(np.sum(gap > 0))} of {a.size} values differ, by up to {gap.max():.3g}")
            scale = max(1.0, float(np.abs(b.astype(np.float64)).max()))
            few = np.sum(gap > 0) <= max(1.0, NEAR_SHARE * a.size) and gap.max() <= NEAR * scale
            near &= bool(few or gap.max() <= FLOAT_NEAR * scale)
    return "; ".join(found) or None, near


def _onnxruntime_unfused(model: onnx.ModelProto, feeds: dict) -> list | None:
    """onnxruntime's outputs with its graph optimizations off, or None where it refuses the
    graph. Optimized, it fuses QDQ pairs into its QLinear kernels (their fixed-point rounding,
    and their own refusals: per-channel activations); unfused, a QDQ graph runs as the float
    operators it holds, which is what ONNX defines."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        return session.run(None, feeds)
    except Exception:  # noqa: BLE001 -- a draw it does not implement
        return None


def check(seed: int) -> tuple[str, str | None]:
    """``(verdict, detail)``: ``ok`` (every configuration equals onnxruntime, or where it
    refuses the graph the ReferenceEvaluator), ``near`` (the configurations equal one another
    and differ from the references within ``NEAR``), ``references fail``, ``differs`` (a
    configuration against another, or against the references by more) or ``raises``."""
    model, feeds = draw(seed)
    want = reference_outputs(model, feeds, _onnxruntime_unfused)
    if want is None:
        return "references fail", None
    got, error = outputs_by_config(model, feeds, CONFIGS)
    if error:
        return "raises", error
    plain, moved = got["unoptimized"], []
    for config, outputs in got.items():  # the passes must not move a single bit
        why, near = _differences(outputs, plain)
        # (The dynamic form's float Mul and Add: whether XLA contracts them into a fused
        # multiply-add depends on what it fuses, which the passes change, and a last bit moved
        # there can move a DynamicQuantizeLinear's rounding: near, as against the references.)
        if why is not None and not (near and model.doc_string == "dynamic"):
            return "differs", f"{config} against unoptimized: {why}"
        moved += [f"{config} against unoptimized: {why}"] if why else []
    why, near = _differences(plain, want)
    if why is None and not moved:
        return "ok", None
    found = "; ".join(moved + ([why] if why else []))
    return ("near", found) if near else ("differs", f"against the references: {why}")


def describe(seed: int) -> str:
    model, feeds = draw(seed)
    ops = [n.op_type for n in model.graph.node if n.op_type not in ("QuantizeLinear", "DequantizeLinear")]
    return f"seed {seed}, {model.doc_string}, opset {model.opset_import[0].version}, x {list(feeds['x'].shape)}: {' -> '.join(ops)}"


def run(seed: int, cases: int, *, trace: bool = False) -> tuple[collections.Counter, list[str]]:
    """Check the graphs of seeds ``seed * 100_000 + k``; the count of each verdict and the
    findings, printed as they come."""
    return run_seeds(seed, cases, check, describe, trace=trace)


def _add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--wide", action="store_true", help="draw 16-128 channels, more groups and full 3x3 windows at times"
    )
    parser.add_argument("--encoders", action="store_true", help="(B, T, D) values through 8-bit products instead")


def _configure(args: argparse.Namespace) -> None:
    global WIDE, ENCODERS
    WIDE, ENCODERS = args.wide, args.encoders


def main() -> int:
    return run_cli(__doc__.splitlines()[0], run, _add_options, _configure)


if __name__ == "__main__":
    sys.exit(main())

"""Differential fuzzing: random one-node models through jonnx, onnxruntime and the ReferenceEvaluator.

A developer's tool, not a test: ``python -m tests.conformance.fuzz [--seed S] [--cases N]
[--families F ...] [--opset O]`` draws single-node models (shapes of rank 0-4 with empty
dimensions about a quarter of the time, broadcasting partners, attributes across their range,
inputs as graph inputs or as initializers), runs each through onnxruntime (or, where
onnxruntime refuses it, the ReferenceEvaluator) and through ``jonnx.load(model)(*inputs)``, and
prints every case where jonnx raises or differs. A difference from onnxruntime where jonnx
equals the ReferenceEvaluator is only counted: the two references disagree there.

Its first runs (2026-11-29) found the bugs fixed in ad7ffa0 (Gather and dilated MaxPool of empty
tensors, ArgMax over an empty axis, Resize with keep_aspect_ratio_policy) and TopK's order of
-0 and +0. What they still print is, as far as checked, where the specification leaves the
result open or onnxruntime departs from it:

- Cast of an out-of-range float to an integer type: undefined (jonnx saturates, onnxruntime
  wraps), so the fuzz draws floats in range;
- ReduceMean of an empty set: undefined (jonnx and the ReferenceEvaluator NaN, onnxruntime 0);
- NonZero of a scalar: onnxruntime reads it as 1-D ((1, n) indices, jonnx (0, n));
- ConvTranspose with auto_pad SAME and dilations: onnxruntime's output shape is not the
  specified ``input * stride``;
- Squeeze with an empty ``axes`` tensor: onnxruntime squeezes every 1 (jonnx and the
  ReferenceEvaluator squeeze nothing);
- DynamicQuantizeLinear of a constant or empty tensor: onnxruntime's scale is 1, jonnx's and
  the ReferenceEvaluator's 1/255 (the quantized values agree);
- Resize with pytorch_half_pixel to a length of 1: the ReferenceEvaluator samples at -0.5, the
  specification (jonnx, onnxruntime) at 0;
- pooling with auto_pad VALID and ceil_mode: jonnx takes the specified VALID length,
  ``ceil((input - window + 1) / stride)``, onnxruntime applies ceil_mode to its padded formula;
- Pad removing more than an empty axis holds, a pooling window larger than its input, and
  pooling whose SAME padding would be negative: jonnx refuses or clamps where onnxruntime
  accepts or refuses.

Ops newer than ``--opset`` are refused by jonnx and may still run in the ReferenceEvaluator:
those lines are expected.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import sys
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import numpy as np
import onnx
import onnxruntime as ort
from onnx.reference import ReferenceEvaluator

import jonnx
from tests.ops._harness import node_model

FLOATS = (np.float32, np.float64)
INTS = (np.int32, np.int64)


class Case(NamedTuple):
    op: str
    inputs: dict[str, Any]  # name -> array, or None for an omitted optional input
    attrs: dict[str, Any]
    n_outputs: int = 1
    constants: tuple[str, ...] = ()  # inputs that may become initializers


class Draw:
    """Random shapes, arrays and axes from one seeded generator."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    def pick(self, options):
        return options[int(self.rng.integers(len(options)))]

    def int(self, low: int, high: int) -> int:
        """An int in [low, high]."""
        return int(self.rng.integers(low, high + 1))

    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def shape(self, rank: int | None = None, empty: float = 0.25, most: int = 4) -> tuple[int, ...]:
        rank = self.int(0, 4) if rank is None else rank
        return tuple(0 if self.chance(empty) else self.int(1, most) for _ in range(rank))

    def partner(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """A shape that broadcasts against ``shape`` (a suffix, some dims 1)."""
        tail = shape[len(shape) - self.int(0, len(shape)) :]
        return tuple(1 if d and self.chance(0.3) else d for d in tail)

    def array(self, shape, dtype=np.float32) -> np.ndarray:
        dtype = np.dtype(dtype)
        if dtype.kind == "f":
            return self.rng.standard_normal(shape).astype(dtype)
        if dtype == np.bool_:
            return self.rng.random(shape) < 0.5
        low = -5 if dtype.kind == "i" else 0
        return self.rng.integers(low, 6, shape).astype(dtype)

    def axes(self, rank: int, count: int | None = None) -> list[int]:
        """Distinct axes, sorted, some written negative."""
        if rank == 0:
            return []
        count = self.int(0, rank) if count is None else count
        chosen = sorted(int(a) for a in self.rng.choice(rank, count, replace=False))
        return [a - rank if self.chance(0.3) else a for a in chosen]


# ------------------------------------------------------------------------------ families


def elementwise(d: Draw) -> Case | None:
    unary = ["Abs", "Neg", "Exp", "Log", "Sqrt", "Sigmoid", "Tanh", "Floor", "Ceil", "Sign", "Reciprocal"]
    unary += ["Softplus", "Erf", "Round", "Sin", "IsNaN", "HardSwish", "Mish", "Gelu", "Celu", "Elu", "Selu"]
    binary = ["Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Equal", "Less", "Greater", "Mod", "PRelu"]
    op = d.pick(unary + binary + ["Where", "Clip", "BitShift", "And", "Xor", "Sum", "Mean"])
    s = d.shape()
    if op in unary:
        x = d.array(s, d.pick(FLOATS))
        return Case(op, {"x": np.abs(x) if op in ("Log", "Sqrt") else x}, {})
    if op in ("And", "Xor"):
        return Case(op, {"a": d.array(s, np.bool_), "b": d.array(d.partner(s), np.bool_)}, {})
    if op == "BitShift":
        a, b = d.rng.integers(0, 100, s).astype(np.uint32), d.rng.integers(0, 4, d.partner(s)).astype(np.uint32)
        return Case(op, {"a": a, "b": b}, {"direction": d.pick(["LEFT", "RIGHT"])})
    if op == "Where":
        dtype = d.pick(FLOATS + INTS)
        return Case(
            op, {"c": d.array(d.partner(s), np.bool_), "a": d.array(s, dtype), "b": d.array(d.partner(s), dtype)}, {}
        )
    if op == "Clip":
        dtype = d.pick((np.float32, *INTS))
        bounds = {
            "lo": np.array(-2, dtype) if d.chance(0.7) else None,
            "hi": np.array(3, dtype) if d.chance(0.7) else None,
        }
        return Case(op, {"x": d.array(s, dtype), **bounds}, {}, constants=("lo", "hi"))
    if op in ("Sum", "Mean"):
        return Case(op, {f"x{i}": d.array(d.partner(s) if i else s) for i in range(d.int(1, 3))}, {})
    integer = op in ("Add", "Sub", "Mul", "Div", "Max", "Min", "Equal", "Less", "Greater", "Mod", "Pow")
    dtype = d.pick((*FLOATS, *INTS, np.int8, np.uint8)) if integer else d.pick(FLOATS)
    a, b = d.array(s, dtype), d.array(d.partner(s), dtype)
    if d.chance(0.5) and op != "PRelu":  # the broadcast partner on either side
        a, b = b, a
    attrs = {}
    if op in ("Div", "Mod") and np.dtype(dtype).kind in "iu":
        b = np.where(b == 0, 3, b).astype(dtype)  # no integer division by zero
    if op == "Mod":
        attrs["fmod"] = 1 if np.dtype(dtype).kind == "f" else d.int(0, 1)
        b = np.where(b == 0, 3, b).astype(dtype)
    if op == "Pow":
        a = (np.abs(a) + 1).astype(dtype) if np.dtype(dtype).kind == "f" else a
        b = (np.abs(b) % 3).astype(dtype)
    return Case(op, {"a": a, "b": b}, attrs)


def reduce(d: Draw) -> Case | None:
    op = d.pick(["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2"]
                + ["ReduceLogSumExp", "ReduceSumSquare", "ReduceLogSum", "ArgMax", "ArgMin", "CumSum", "Softmax"]
                + ["LogSoftmax", "Hardmax"])  # fmt: skip
    s = d.shape()
    integer_ok = op in ("ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ArgMax", "ArgMin", "CumSum")
    x = d.array(s, d.pick(FLOATS + INTS) if integer_ok else d.pick(FLOATS))
    if op.startswith("Reduce"):
        x = np.abs(x) + 0.5 if op == "ReduceLogSum" else x
        attrs = {"keepdims": d.int(0, 1)}
        if d.chance(0.2):
            attrs["noop_with_empty_axes"] = d.int(0, 1)
        axes = d.axes(len(s))
        inputs = {"x": x, "axes": np.array(axes, np.int64) if axes or d.chance(0.5) else None}
        return Case(op, inputs, attrs, constants=("axes",))
    if not s:
        return None
    axis = d.int(-len(s), len(s) - 1)
    if op in ("ArgMax", "ArgMin"):
        x = np.round(x).astype(x.dtype)  # ties, for select_last_index
        return Case(op, {"x": x}, {"axis": axis, "keepdims": d.int(0, 1), "select_last_index": d.int(0, 1)})
    if op == "CumSum":
        inputs = {"x": x, "axis": np.array(axis, np.int64)}
        return Case(op, inputs, {"exclusive": d.int(0, 1), "reverse": d.int(0, 1)}, constants=("axis",))
    return Case(op, {"x": x}, {"axis": axis})


def shape_ops(d: Draw) -> Case | None:
    op = d.pick(["Transpose", "Concat", "Flatten", "Squeeze", "Unsqueeze", "Tile", "Expand", "Reshape", "Shape"]
                + ["Size", "Split", "Pad", "Trilu", "DepthToSpace", "SpaceToDepth", "Range", "ConstantOfShape"])  # fmt: skip
    s = d.shape()
    r = len(s)
    x = d.array(s, d.pick(FLOATS + INTS))
    if op == "Transpose":
        return Case(op, {"x": x}, {"perm": [int(p) for p in d.rng.permutation(r)]}) if r else None
    if op == "Concat":
        if not r:
            return None
        axis = d.int(-r, r - 1)
        other = list(s)
        other[axis] = d.int(0, 2)
        return Case(op, {"a": x, "b": d.array(tuple(other), x.dtype)}, {"axis": axis})
    if op == "Flatten":
        return Case(op, {"x": x}, {"axis": d.int(-r, r)})
    if op == "Squeeze":
        axes = [a for a, n in enumerate(s) if n == 1 and d.chance(0.6)]
        return Case(op, {"x": x, "axes": np.array(axes, np.int64) if axes else None}, {}, constants=("axes",))
    if op == "Unsqueeze":
        k = d.int(1, 2)
        axes = d.axes(r + k, k)
        return Case(op, {"x": x, "axes": np.array(axes, np.int64)}, {}, constants=("axes",))
    if op == "Tile":
        return Case(op, {"x": x, "reps": d.rng.integers(0, 3, r).astype(np.int64)}, {}, constants=("reps",))
    if op == "Expand":
        target = [d.int(0, 2) if n == 1 else n for n in s]
        target = [d.int(1, 2) for _ in range(d.int(0, 1))] + target
        return Case(op, {"x": x, "shape": np.array(target, np.int64)}, {}, constants=("shape",))
    if op == "Reshape":
        n = int(np.prod(s))
        if n == 0:
            target, allowzero = ([0 if d.chance(0.5) else k for k in s] if d.chance(0.5) else [0]), d.int(0, 1)
        else:
            target, allowzero = ([n] if d.chance(0.5) else [-1, 1]), 0
        return Case(op, {"x": x, "shape": np.array(target, np.int64)}, {"allowzero": allowzero}, constants=("shape",))
    if op == "Shape":
        attrs = {"start": d.int(-r - 1, r + 1), "end": d.int(-r - 1, r + 1)} if d.chance(0.5) else {}
        return Case(op, {"x": x}, attrs)
    if op == "Size":
        return Case(op, {"x": x}, {})
    if op == "Split":
        if not r:
            return None
        axis = d.int(-r, r - 1)
        if d.chance(0.5):
            left = d.int(0, s[axis])
            parts = [left, s[axis] - left]
            return Case(op, {"x": x, "split": np.array(parts, np.int64)}, {"axis": axis}, 2, ("split",))
        n = d.int(1, 3)
        return Case(op, {"x": x}, {"axis": axis, "num_outputs": n}, n) if s[axis] >= n else None
    if op == "Pad":
        mode = d.pick(["constant", "reflect", "edge", "wrap"])
        if mode != "constant" and 0 in s:
            return None
        pads = d.rng.integers(0, 3, 2 * r).astype(np.int64)
        if mode == "reflect" and any(p >= n for p, n in zip(pads, s + s)):
            return None
        inputs = {"x": x, "pads": pads, "value": np.array(2, x.dtype) if mode == "constant" and d.chance(0.5) else None}
        return Case(op, inputs, {"mode": mode}, constants=("pads", "value"))
    if op == "Trilu":
        if r < 2:
            return None
        k = np.array(d.int(-4, 4), np.int64) if d.chance(0.7) else None
        return Case(op, {"x": x, "k": k}, {"upper": d.int(0, 1)}, constants=("k",))
    if op in ("DepthToSpace", "SpaceToDepth"):
        b = d.int(1, 2)
        if op == "DepthToSpace":
            image = d.array((d.int(0, 2), b * b * d.int(1, 2), d.int(0, 2), d.int(1, 2)), x.dtype)
            return Case(op, {"x": image}, {"blocksize": b, "mode": d.pick(["DCR", "CRD"])})
        return Case(op, {"x": d.array((d.int(0, 1), 2, 2 * b, 2 * b), x.dtype)}, {"blocksize": b})
    if op == "Range":
        dtype = d.pick(FLOATS + INTS)
        start, limit, delta = (np.array(v, dtype) for v in (d.int(-5, 5), d.int(-5, 5), d.pick([1, 2, -1, -3])))
        return Case(op, {"start": start, "limit": limit, "delta": delta}, {}, constants=("start", "limit", "delta"))
    return Case(op, {"shape": np.array(d.shape(), np.int64)}, {}, constants=("shape",))


def indexing(d: Draw) -> Case | None:
    op = d.pick(["Gather", "GatherElements", "GatherND", "ScatterElements", "ScatterND", "TopK", "Compress"]
                + ["NonZero", "OneHot", "ReverseSequence", "Unique"])  # fmt: skip
    s = d.shape(d.int(1, 4))
    r = len(s)
    x = d.array(s, d.pick(FLOATS + INTS))
    axis = d.int(-r, r - 1)
    n = s[axis]
    if op == "Gather":
        index_shape = d.shape(d.int(0, 2), empty=1.0 if n == 0 else 0.25)
        indices = d.rng.integers(-n, n, index_shape).astype(d.pick(INTS)) if n else np.zeros(index_shape, np.int64)
        return Case(op, {"x": x, "i": indices}, {"axis": axis}, constants=("i",))
    if op == "GatherElements":
        index_shape = list(s)
        index_shape[axis] = d.int(0, 3) if n else 0
        indices = d.rng.integers(-n, n, index_shape).astype(np.int64) if n else np.zeros(index_shape, np.int64)
        return Case(op, {"x": x, "i": indices}, {"axis": axis})
    if op == "GatherND":
        batch = d.int(0, r - 1)
        k = d.int(1, r - batch)
        if 0 in s[batch : batch + k]:
            return None
        lead = tuple(s[:batch]) + d.shape(d.int(0, 1))
        indices = np.stack([d.rng.integers(-s[batch + j], s[batch + j], lead) for j in range(k)], -1)
        return Case(op, {"x": x, "i": indices.astype(np.int64)}, {"batch_dims": batch})
    if op == "ScatterElements":
        if n == 0:
            return None
        index_shape = list(s)
        index_shape[axis] = d.int(0, n)
        reduction = d.pick(["none", "add", "mul", "max", "min"])
        if reduction == "none":  # no index twice along the axis: the result would depend on order
            along = np.arange(index_shape[axis]).reshape([-1 if a == axis % r else 1 for a in range(r)])
            indices = np.broadcast_to(along, index_shape).astype(np.int64)
        else:
            indices = d.rng.integers(-n, n, index_shape).astype(np.int64)
        updates = d.array(tuple(index_shape), x.dtype)
        return Case(op, {"x": x, "i": indices, "u": updates}, {"axis": axis, "reduction": reduction})
    if op == "ScatterND":
        if 0 in s:
            return None
        k = d.int(1, r)
        every = list(itertools.product(*(range(m) for m in s[:k])))
        chosen = [every[i] for i in d.rng.permutation(len(every))[: d.int(0, 2)]]
        indices = np.array(chosen, np.int64).reshape(len(chosen), k)
        updates = d.array((len(chosen), *s[k:]), x.dtype)
        attrs = {"reduction": d.pick(["none", "add", "mul", "max", "min"])}
        return Case(op, {"x": x, "i": indices, "u": updates}, attrs)
    if op == "TopK":
        k = np.array([d.int(0, n)], np.int64)
        return Case(op, {"x": np.round(x).astype(x.dtype), "k": k}, {"axis": axis, "largest": d.int(0, 1)}, 2, ("k",))
    if op == "Compress":
        whole = d.chance(0.3)
        length = int(np.prod(s)) if whole else n
        condition = d.array((d.int(0, length),), np.bool_)
        return Case(op, {"x": x, "c": condition}, {} if whole else {"axis": axis}, constants=("c",))
    if op == "NonZero":
        return Case(op, {"x": x}, {})
    if op == "OneHot":
        indices = d.rng.integers(-4, 4, d.shape(d.int(0, 2))).astype(np.int64)
        inputs = {"i": indices, "depth": np.array(4, np.int64), "values": np.array([0, 1], x.dtype)}
        return Case(op, inputs, {"axis": d.int(-indices.ndim - 1, indices.ndim)}, constants=("depth", "values"))
    if op == "ReverseSequence":
        if r < 2:
            return None
        batch_axis, time_axis = d.pick([(0, 1), (1, 0)])
        lengths = d.rng.integers(0, s[time_axis] + 1, s[batch_axis]).astype(np.int64)
        return Case(op, {"x": x, "lengths": lengths}, {"batch_axis": batch_axis, "time_axis": time_axis})
    if 0 in s:
        return None  # onnxruntime 1.32 aborts the process on Unique of an empty tensor with an axis
    values = d.rng.integers(0, 3, s).astype(d.pick((np.float32, np.int64)))
    return Case(op, {"x": values}, {"sorted": 1, **({"axis": axis} if d.chance(0.6) else {})}, 4)


def products(d: Draw) -> Case | None:
    dtype = d.pick(FLOATS)
    m, k, n = (d.int(0, 3) for _ in range(3))
    op = d.pick(["MatMul", "Gemm", "Einsum"])
    if op == "MatMul":
        batch = d.shape(d.int(0, 2), empty=0.2)
        a = d.array((*batch, m, k) if d.chance(0.7) else (k,), dtype)
        b = d.array((*d.partner(batch), k, n) if d.chance(0.7) else (k,), dtype)
        return Case(op, {"a": a, "b": b}, {}, constants=("b",))
    if op == "Gemm":
        ta, tb = d.int(0, 1), d.int(0, 1)
        inputs = {"a": d.array((k, m) if ta else (m, k), dtype), "b": d.array((n, k) if tb else (k, n), dtype)}
        inputs["c"] = d.array(d.partner((m, n)), dtype) if d.chance(0.7) else None
        attrs = {"transA": ta, "transB": tb, "alpha": d.pick([1.0, 0.5]), "beta": d.pick([1.0, 2.0])}
        return Case(op, inputs, attrs, constants=("b", "c"))
    equations = {
        "ij,jk->ik": [(m, k), (k, n)],
        "bij,bjk->bik": [(2, m, k), (2, k, n)],
        "ii->i": [(m, m)],
        "ij->": [(m, k)],
        "i,j->ij": [(m,), (n,)],
        "...ij,...jk->...ik": [(2, m, k), (k, n)],
        "ij,jk,kl->il": [(m, k), (k, n), (n, 2)],
        "iij->j": [(2, 2, k)],
    }
    equation = d.pick(list(equations))
    return Case(op, {f"x{i}": d.array(s, dtype) for i, s in enumerate(equations[equation])}, {"equation": equation})


def conv_pool(d: Draw) -> Case | None:
    op = d.pick(["Conv", "ConvTranspose", "MaxPool", "AveragePool", "LpPool", "GlobalAveragePool", "GlobalMaxPool"])
    c = d.int(1, 3)
    spatial = tuple(d.int(1, 6) for _ in range(d.int(1, 2)))
    x = d.array((d.int(0, 2), c, *spatial))
    kernel = [d.int(1, min(3, n)) for n in spatial]
    attrs: dict[str, Any] = {"strides": [d.int(1, 2) for _ in spatial]}
    if d.chance(0.5):
        attrs["auto_pad"] = d.pick(["SAME_UPPER", "SAME_LOWER", "VALID"])
    else:
        attrs["pads"] = [d.int(0, k - 1) for k in kernel] * 2
    if op.startswith("Global"):
        return Case(op, {"x": x}, {})
    if op in ("Conv", "ConvTranspose"):
        group = d.pick([1, c])
        m = d.int(1, 2) * group
        w_shape = (m, c // group, *kernel) if op == "Conv" else (c, m // group, *kernel)
        attrs.update(group=group, dilations=[d.int(1, 2) for _ in spatial])
        span = [(k - 1) * dil + 1 for k, dil in zip(kernel, attrs["dilations"])]
        if op == "Conv" and "pads" in attrs and any(w > n + 2 * p for w, n, p in zip(span, spatial, attrs["pads"])):
            return None  # a window larger than the padded input: an error everywhere
        inputs = {"x": x, "w": d.array(w_shape), "b": d.array((m,)) if d.chance(0.5) else None}
        return Case(op, inputs, attrs, constants=("w", "b"))
    attrs["kernel_shape"] = kernel
    if op != "LpPool" and d.chance(0.4):
        attrs["ceil_mode"] = 1
    if op == "AveragePool" and d.chance(0.5):
        attrs["count_include_pad"] = 1
    if op == "MaxPool" and d.chance(0.3):
        attrs["dilations"] = [d.int(1, 2) for _ in spatial]
    return Case(op, {"x": x}, attrs, 2 if op == "MaxPool" and d.chance(0.3) else 1)


def resize(d: Draw) -> Case | None:
    rank = d.int(3, 4)
    x = d.array((d.int(1, 2), d.int(1, 2), *(d.int(1, 5) for _ in range(rank - 2))))
    mode = d.pick(["nearest", "linear", "cubic"])
    ctm = d.pick(["half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel", "half_pixel_symmetric"])
    attrs: dict[str, Any] = {"mode": mode, "coordinate_transformation_mode": ctm}
    if mode == "nearest":
        attrs["nearest_mode"] = d.pick(["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"])
    else:
        attrs["antialias"] = int(d.chance(0.3))
    if mode == "cubic":
        attrs.update(cubic_coeff_a=d.pick([-0.75, -0.5]), exclude_outside=d.int(0, 1))
    inputs = {"x": x, "roi": None, "scales": None, "sizes": None}
    if d.chance(0.5):
        scales = [1.0, 1.0] + [d.pick([0.5, 0.6, 1.0, 1.5, 2.0, 3.0]) for _ in range(rank - 2)]
        inputs["scales"] = np.array(scales, np.float32)
    else:
        inputs["sizes"] = np.array([*x.shape[:2], *(d.int(1, 7) for _ in range(rank - 2))], np.int64)
        if d.chance(0.4):
            attrs.update(keep_aspect_ratio_policy=d.pick(["not_larger", "not_smaller"]), axes=list(range(2, rank)))
            inputs["sizes"] = inputs["sizes"][2:]
    return Case("Resize", inputs, attrs, constants=("scales", "sizes"))


def quantize(d: Draw) -> Case | None:
    op = d.pick(["QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "QLinearMatMul", "MatMulInteger"])
    s = d.shape(d.int(1, 3), empty=0.15)
    if op in ("QuantizeLinear", "DequantizeLinear"):
        qtype = d.pick([np.uint8, np.int8, np.uint16, np.int16])
        how = d.pick(["tensor", "axis", "block"])
        attrs: dict[str, Any] = {}
        scale_shape: tuple[int, ...] = ()
        if how != "tensor":
            attrs["axis"] = axis = d.int(-len(s), len(s) - 1)
            scale_shape = (s[axis],)
            if how == "block":
                attrs["block_size"] = block = d.int(1, 3)
                scale_shape = tuple(-(-n // block) if a == axis % len(s) else n for a, n in enumerate(s))
        scale = (np.abs(d.array(scale_shape)) + 0.05).astype(np.float32)
        zero_point = d.rng.integers(0, 5, scale_shape).astype(qtype) if d.chance(0.7) else None
        if op == "QuantizeLinear":
            x = d.array(s) * 50
        else:
            x = d.rng.integers(0, 100, s).astype(qtype)
        return Case(op, {"x": x, "scale": scale, "zero_point": zero_point}, attrs, constants=("scale", "zero_point"))
    if op == "DynamicQuantizeLinear":
        return Case(op, {"x": d.array(s) * d.pick([0.01, 1.0, 100.0])}, {}, 3)
    m, k, n = (d.int(1, 4) for _ in range(3))
    if op == "MatMulInteger":
        a, b = d.rng.integers(0, 100, (m, k)).astype(np.uint8), d.rng.integers(-50, 50, (k, n)).astype(np.int8)
        points = {"a_zero": np.uint8(3) if d.chance(0.5) else None, "b_zero": np.int8(-2) if d.chance(0.5) else None}
        return Case(op, {"a": a, "b": b, **points}, {}, constants=("b", "a_zero", "b_zero"))
    qtype = d.pick([np.uint8, np.int8])
    a, b = d.rng.integers(0, 100, (m, k)).astype(qtype), d.rng.integers(0, 100, (k, n)).astype(qtype)
    quant = {"a": a, "a_scale": np.float32(0.05), "a_zero": qtype(3), "b": b, "b_scale": np.float32(0.02)}
    quant.update(b_zero=qtype(5), y_scale=np.float32(0.7), y_zero=qtype(10))
    return Case(op, quant, {}, constants=tuple(name for name in quant if name != "a"))


def normalization(d: Draw) -> Case | None:
    op = d.pick(["GroupNormalization", "MeanVarianceNormalization", "LpNormalization", "LRN"]
                + ["InstanceNormalization", "LayerNormalization", "BatchNormalization"])  # fmt: skip
    c = d.pick([2, 4, 6])
    x = d.array((d.int(0, 2), c, *(d.int(1, 4) for _ in range(d.int(1, 2)))), d.pick(FLOATS))
    per_channel = {"scale": d.array((c,), x.dtype), "bias": d.array((c,), x.dtype)}
    if op == "GroupNormalization":
        return Case(op, {"x": x, **per_channel}, {"num_groups": d.pick([1, 2])}, constants=("scale", "bias"))
    if op == "MeanVarianceNormalization":
        return Case(op, {"x": x}, {"axes": sorted(d.axes(x.ndim, d.int(1, x.ndim)))})
    if op == "LpNormalization":
        return Case(op, {"x": x}, {"axis": d.int(-x.ndim, x.ndim - 1), "p": d.int(1, 2)})
    if op == "LRN":
        return Case(op, {"x": x.astype(np.float32)}, {"size": d.pick([1, 3, 5]), "alpha": 0.001, "beta": 0.75})
    if op == "InstanceNormalization":
        return Case(op, {"x": x, **per_channel}, {}, constants=("scale", "bias"))
    if op == "LayerNormalization":
        if x.size == 0:
            return None  # onnxruntime 1.32 crashes (a segmentation fault) on an empty LayerNormalization
        axis = d.int(-x.ndim, x.ndim - 1)
        normalized = x.shape[axis % x.ndim :]
        inputs = {"x": x, "scale": d.array(normalized, x.dtype), "bias": d.array(normalized, x.dtype)}
        return Case(op, inputs, {"axis": axis}, constants=("scale", "bias"))
    stats = {"mean": d.array((c,), x.dtype), "var": np.abs(d.array((c,), x.dtype))}
    return Case(op, {"x": x, **per_channel, **stats}, {}, constants=("scale", "bias", "mean", "var"))


def cast(d: Draw) -> Case | None:
    source = d.pick([np.float32, np.float64, np.int32, np.int64, np.bool_, np.float16, np.uint8, np.int8])
    x = d.array(d.shape(), source)
    to = d.pick([1, 2, 3, 5, 6, 7, 9, 10, 11])
    if np.dtype(source).kind == "f":
        # In range of every integer target (out of range is undefined): |x| < 100, >= 0 for uint8.
        x = np.clip(x * 40, 0 if to == onnx.TensorProto.UINT8 else -99, 99).astype(source)
    return Case("Cast", {"x": x}, {"to": to})


FAMILIES: dict[str, Callable[[Draw], Case | None]] = {
    "elementwise": elementwise,
    "reduce": reduce,
    "shape": shape_ops,
    "indexing": indexing,
    "products": products,
    "conv_pool": conv_pool,
    "resize": resize,
    "quantize": quantize,
    "normalization": normalization,
    "cast": cast,
}


# ------------------------------------------------------------------------------ running


def difference(got: np.ndarray, want: np.ndarray) -> str | None:
    """Why ``got`` is not ``want``, or None."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return f"shape {got.shape} against {want.shape}"
    if got.dtype != want.dtype:
        return f"dtype {got.dtype} against {want.dtype}"
    if want.dtype.kind in "fc":
        if not np.allclose(got, want, rtol=1e-4, atol=1e-5, equal_nan=True):
            return f"values differ by up to {np.nanmax(np.abs(got.astype(float) - want.astype(float))):.3g}"
    elif not np.array_equal(got, want):
        return "values differ"
    return None


def differences(got, want) -> list[str]:
    if len(got) != len(want):
        return [f"{len(got)} outputs against {len(want)}"]
    return [f"output {i}: {why}" for i, (g, w) in enumerate(zip(got, want)) if (why := difference(g, w))]


def check(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> tuple[str, str | None]:
    """``(verdict, detail)``: ``ok``, ``references fail``, ``reference disagrees`` (jonnx equals the
    ReferenceEvaluator, not onnxruntime), ``raises`` or ``differs``."""
    try:
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        want, source = session.run(None, feeds), "onnxruntime"
    except Exception:  # noqa: BLE001 -- onnxruntime refuses what it does not implement
        try:
            want, source = ReferenceEvaluator(model).run(None, feeds), "ReferenceEvaluator"
        except Exception:  # noqa: BLE001
            return "references fail", None
    try:
        got = [np.asarray(y) for y in jonnx.load(model)(*feeds.values())]
    except Exception as e:  # noqa: BLE001 -- every error is a finding
        return "raises", f"{type(e).__name__}: {str(e).splitlines()[0][:200]} ({source} runs it)"
    found = differences(got, want)
    if not found:
        return "ok", None
    if source == "onnxruntime":
        try:
            if not differences(got, ReferenceEvaluator(model).run(None, feeds)):
                return "reference disagrees", None
        except Exception:  # noqa: BLE001
            pass
    return "differs", f"{'; '.join(found)} (against {source})"


def describe(case: Case, initializers: set[str]) -> str:
    shapes = ", ".join(
        f"{name}{'=const' if name in initializers else ''} {np.asarray(v).dtype.name}{list(np.shape(v))}"
        for name, v in case.inputs.items()
        if v is not None
    )
    return f"{case.op} {case.attrs} ({shapes})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cases", type=int, default=500)
    parser.add_argument("--families", nargs="+", choices=sorted(FAMILIES), default=sorted(FAMILIES))
    parser.add_argument("--opset", type=int, default=21)
    args = parser.parse_args()
    if args.opset > onnx.defs.onnx_opset_version():
        parser.error(f"onnx {onnx.__version__} knows opsets up to {onnx.defs.onnx_opset_version()}")
    jax.config.update("jax_enable_x64", True)  # int64 and float64 exact, as ONNX defines them
    warnings.filterwarnings("ignore")
    ort.set_default_logger_severity(4)
    d = Draw(args.seed)
    verdicts: collections.Counter = collections.Counter()
    for number in range(args.cases):
        case = FAMILIES[d.pick(args.families)](d)
        if case is None:
            continue
        initializers = {name for name in case.constants if case.inputs.get(name) is not None and d.chance(0.7)}
        try:
            model = node_model(
                case.op, case.inputs, case.n_outputs, opset=args.opset, initializers=sorted(initializers), **case.attrs
            )
        except ValueError:  # an attribute onnx.helper cannot type (an empty list)
            continue
        feeds = {k: np.asarray(v) for k, v in case.inputs.items() if v is not None and k not in initializers}
        verdict, detail = check(model, feeds)
        verdicts[verdict] += 1
        if detail:
            print(f"#{number} {verdict}: {describe(case, initializers)}\n    {detail}", flush=True)
    print(f"{sum(verdicts.values())} cases (seed {args.seed}, opset {args.opset}): {dict(verdicts)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Channels-last layout: CNN chains run on N(D)HWC activations, transposed only at boundaries.

XLA's CPU convolution, and the dot lowerings jonnx uses instead of it (ops/conv.py), run 1.2-2x
faster with the channels last than in ONNX's NC(D)HW. This pass rewrites every Conv to the
internal channels-last Conv (ops/channels_last.py) and carries the layout through what follows
it, so that whole chains run channels-last:

* Conv: the input is brought to channels-last (a Transpose, unless it already is), the weights
  get a weight-only ``Transpose`` to the layout ``conv.kernel_layout_for`` picks (computed once per
  parameter set; the internal Conv's ``kernel_layout`` attribute names it), and the output is
  channels-last. Most kernels go to (D)HWIO. A big 1x1 kernel without groups (at least 2^18
  weights) stays as stored: its product reads the (M, C) weights as they are, so no relayout
  copy is kept beside them (ResNet-50: its prepared copies 94 -> 49 MB; no difference measured
  on the whole network at batch 1, although such a product alone is 10-25% slower on 7x7
  maps). On CPU a 3x3 kernel without groups or strides over 48-64 or at least 512 channels goes
  to I(D)HWO, which the tap-products lowering reads on small inputs (ResNet-50's 3x3 over 64
  channels on 56x56 and over 512 on 7x7);
* ConvTranspose: the input is brought to channels-last, the weights are read as stored, the
  output is channels-last;
* the quantized_convs pass's Conv (domain ``jonnx.dequantized``), and QLinearConv and
  ConvInteger with fixed weights: the 8-bit input is brought to channels-last, the weights
  are read as stored (an 8-bit product reads them as one matrix; the float32 convolutions of
  grouped ones, or of every one off the CPU, get them relaid out at trace time), the output
  is channels-last.
  QOperator files at batch 1: ResNet-50 45.7 -> 36.9 ms, MobileNetV2 17.3 -> 7.0 ms; a QDQ
  ResNet-50 (after quantized_convs) 52.1 -> 42.4 ms;
* onnxruntime's QLinearAdd, QLinearMul, QLinearSigmoid and QLinearLeakyRelu (the other operand
  channels-last too, or one value), QLinearConcat of channels-last values (its axis
  renumbered) and QLinearGlobalAveragePool (told ``channels_last``);
* DynamicQuantizeLinear (its scale and zero point are the whole tensor's, in any layout): with
  ConvInteger, what ``quantize_dynamic`` writes for a Conv, whose scales' products are one
  value and whose bias is a Reshape of a constant to (1, C, 1, 1); a quantize_dynamic ResNet-50
  at batch 1: 49.7 -> 42.6 ms;
* pooling (Max/Average/Global*), BatchNormalization (inference and training: running statistics
  are per-channel vectors, unchanged), InstanceNormalization: their channels-last forms; a
  Max/AveragePool whose input is a Conv that runs as a loop of multiply-adds over its taps
  (``conv.runs_as_tap_loop``), through elementwise ops and inference BatchNorms, is marked
  ``after_tap_loop`` (ops/pool.py);
* elementwise ops (unary ones, and Add/Mul/... whose other operands are channels-last too,
  constants, Reshapes of constants or computed one-value tensors): a constant operand of
  shape (C, 1, 1), (1, C, 1, 1), ... gets a weight-only Reshape/Transpose to the
  channels-last broadcast shape;
* Concat (any axis: it is renumbered), Pad, Slice and Resize with constant operands (permuted);
* QuantizeLinear and DequantizeLinear (per tensor, or per channel with ``axis`` renumbered; not
  blocked): the pairs a QDQ file (``quantize_static``) puts around every activation, which
  otherwise cut each chain at every Conv (a QDQ ResNet-50 at batch 1: 102 -> 86 ms). A Conv's
  weights dequantized from constants in the graph get the layout their shape picks, as stored
  float weights do (86 -> 70 ms);
* a Transpose of a channels-last value: composed with the layout into one Transpose.

Anything else that reads a channels-last value (Reshape, Flatten, Gemm, MatMul, a graph output,
an op this pass does not know, a subgraph) reads it back in NC(D)HW through a Transpose made
once, right before the first such reader; a value is never transposed to channels-last and
back in a row. The result equals the NC(D)HW graph's up to float summation order; MaxPool
nodes whose Indices are read and random ops are left alone, so PRNG streams and index values
never change.

The pass is in ``jonnx.optimize.CALL_ONLY``: on for ``Model(*inputs)``, where the weight
relayouts run once per model, and off in ``Model.apply`` unless named (there they would run on
every call; a ResNet-18 training step measured 1.10-1.34x slower channels-last,
docs/performance.md).
"""

from __future__ import annotations

import dataclasses
import types

import numpy as np

from jonnx._ir import Graph, Node
from jonnx._registry import lookup
from jonnx.ops import conv
from jonnx.ops.channels_last import DOMAIN, VERSION
from jonnx.ops.microsoft._common import DOMAIN as MICROSOFT
from jonnx.ops.quantize import DEQUANTIZED_DOMAIN
from jonnx.optimize._util import int64, new_node, taken_names, unique_name

__all__ = ["run"]

# Ops that compute each element from the same element of their inputs (or broadcast
# constants): they run unchanged on a channels-last tensor.
_UNARY = frozenset(
    "Abs Acos Acosh Asin Asinh Atan Atanh Cast Ceil Celu Cos Cosh Elu Erf Exp Floor Gelu HardSigmoid "
    "HardSwish Identity IsInf IsNaN LeakyRelu Log Mish Neg Not Reciprocal Relu Round Selu Sigmoid "
    "Sign Sin Sinh Softplus Softsign Sqrt Tan Tanh ThresholdedRelu Clip".split()
)
_BROADCASTING = frozenset("Add Sub Mul Div Pow Max Min Sum Mean PRelu".split())
# com.microsoft's quantized element-wise ops -> their activations' input positions.
_MICROSOFT_ELEMENTWISE = {"QLinearAdd": (0, 3), "QLinearMul": (0, 3), "QLinearSigmoid": (0,), "QLinearLeakyRelu": (0,)}
# (domain, op) of the nodes that start a channels-last chain.
_CONVOLUTIONS = frozenset(
    [("", "Conv"), ("", "ConvTranspose"), ("", "QLinearConv"), ("", "ConvInteger"), (DEQUANTIZED_DOMAIN, "Conv")]
)
# ai.onnx op -> (its channels-last form's input positions that are activations).
_SPATIAL = {
    "MaxPool": (0,),
    "AveragePool": (0,),
    "GlobalAveragePool": (0,),
    "GlobalMaxPool": (0,),
    "BatchNormalization": (0,),
    "InstanceNormalization": (0,),
}


def _to_last(rank: int) -> tuple[int, ...]:
    """The perm taking NC(D)HW to N(D)HWC."""
    return (0, *range(2, rank), 1)


def _to_first(rank: int) -> tuple[int, ...]:
    """The perm taking N(D)HWC back to NC(D)HW."""
    return (0, rank - 1, *range(1, rank - 1))


def _axis_last(axis: int, rank: int) -> int:
    """Where NC(D)HW axis ``axis`` (normalized) sits in N(D)HWC."""
    return 0 if axis == 0 else rank - 1 if axis == 1 else axis - 1


def run(graph: Graph, train: bool | None) -> Graph:
    if not any((n.domain, n.op_type) in _CONVOLUTIONS for n in graph.nodes):
        return graph
    return _Rewrite(graph).graph


class _Rewrite:
    """One sweep over the nodes in order, emitting the rewritten node list."""

    def __init__(self, graph: Graph):
        self.inits = dict(graph.initializers)
        self.taken = taken_names(graph)
        self.input_ranks = {v.name: len(v.shape) for v in graph.inputs if v.shape is not None}
        self.constants = dict(graph.initializers)  # values the graph fixes: for static operands
        # Weights a QDQ file dequantizes: the Conv's kernel layout needs only their shape and type.
        self.dequantized: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
        self.last: dict[str, str] = {}  # NC(D)HW name -> its channels-last value's name
        self.rank: dict[str, int] = {}  # channels-last value -> rank
        self.missing: set[str] = set()  # NC(D)HW names no node produces (yet)
        self.relayouts: dict[tuple[str, int | str], str] = {}  # (constant, rank) or (weight, layout)
        self.tap_loops: set[str] = set()  # channels-last values XLA computes in a Conv's tap loop
        self.scalars: set[str] = set()  # computed one-value tensors: they broadcast in any layout
        self.nodes: list[Node] = []
        for node in graph.nodes:
            if node.op_type == "Constant" and node.domain == "" and node.attrs.get("value") is not None:
                self.constants[node.outputs[0]] = np.asarray(node.attrs["value"])
            self._note_dequantized(node)
            self._note_reshaped(node)
            self._note_scalars(node)
            rewritten = self._rewrite(node)
            if rewritten is None:
                for name in node.reads:
                    self._first(name)
                self.nodes.append(node)
        for name in graph.output_names:
            self._first(name)
        self.graph = dataclasses.replace(graph, nodes=tuple(self.nodes), initializers=self.inits)

    # ------------------------------------------------------------------ emitting

    def _emit(self, op_type: str, inputs, stem: str, opset: int = 13, **attrs) -> str:
        out = unique_name(stem, self.taken)
        self.nodes.append(new_node(op_type, list(inputs), [out], unique_name(out, self.taken), opset, **attrs))
        return out

    def _first(self, name: str) -> None:
        """Make the NC(D)HW value ``name`` exist (a Transpose of its channels-last form)."""
        if name in self.missing:
            out = self.last[name]
            self.nodes.append(
                new_node(
                    "Transpose",
                    [out],
                    [name],
                    unique_name(f"{name}/to_channels_first", self.taken),
                    13,
                    perm=list(_to_first(self.rank[out])),
                )
            )
            self.missing.discard(name)

    def _last(self, name: str, rank: int) -> str:
        """The channels-last form of ``name`` (a rank-``rank`` NC(D)HW value), made if needed."""
        if name not in self.last:
            out = self._emit("Transpose", [name], f"{name}/channels_last", perm=list(_to_last(rank)))
            self.last[name], self.rank[out] = out, rank
        return self.last[name]

    def _new_output(self, name: str, rank: int) -> str:
        """A channels-last value standing for the NC(D)HW value ``name``, which no longer exists."""
        out = unique_name(f"{name}/channels_last", self.taken)
        self.last[name], self.rank[out] = out, rank
        self.missing.add(name)
        return out

    def _relayout(self, name: str, rank: int) -> str:
        """A constant operand broadcasting against a rank-``rank`` NC(D)HW value, re-laid-out to
        broadcast the same against its channels-last form (weight-only nodes, made once)."""
        value = self.constants[name]
        if value.size == 1 and value.ndim <= rank:
            return name  # broadcasts the same in any layout
        key = (name, rank)
        if key not in self.relayouts:
            shaped = name
            if value.ndim < rank:
                shape = unique_name(f"{name}/rank{rank}_shape", self.taken)
                self.inits[shape] = int64((1,) * (rank - value.ndim) + value.shape)
                shaped = self._emit("Reshape", [name, shape], f"{name}/rank{rank}")
            self.relayouts[key] = self._emit("Transpose", [shaped], f"{name}/channels_last", perm=list(_to_last(rank)))
        return self.relayouts[key]

    def _note_dequantized(self, node: Node) -> None:
        if node.op_type == "DequantizeLinear" and node.domain == "" and len(node.inputs) > 1:
            data, scale = self.constants.get(node.inputs[0]), self.constants.get(node.inputs[1])
            if data is not None and scale is not None:
                self.dequantized[node.outputs[0]] = (data.shape, scale.dtype)

    def _note_scalars(self, node: Node) -> None:
        """DynamicQuantizeLinear's scale and zero point, and element-wise results of such
        values and one-value constants (quantize_dynamic multiplies the two scales)."""
        if node.domain != "":
            return
        if node.op_type == "DynamicQuantizeLinear":
            self.scalars.update(o for o in node.outputs[1:] if o)
        elif node.op_type in _UNARY | _BROADCASTING and node.inputs and len(node.outputs) == 1:
            if all(self._is_scalar(i) for i in node.inputs if i):
                self.scalars.add(node.outputs[0])

    def _is_scalar(self, name: str) -> bool:
        value = self.constants.get(name)
        return name in self.scalars or (value is not None and value.size == 1 and value.ndim <= 1)

    def _note_reshaped(self, node: Node) -> None:
        """A Reshape of constants (quantize_dynamic writes each bias so, as (1, C, 1, 1)): its
        value, for the shape an elementwise op's relayout needs (the relayout nodes read the
        Reshape's output, never this value)."""
        if node.op_type != "Reshape" or node.domain != "" or node.opset < 5 or len(node.inputs) < 2:
            return
        data, shape = self.constants.get(node.inputs[0]), self.constants.get(node.inputs[1])
        if data is None or shape is None or node.attrs.get("allowzero") or shape.ndim != 1:
            return
        target = [data.shape[i] if d == 0 and i < data.ndim else int(d) for i, d in enumerate(shape)]
        try:
            self.constants[node.outputs[0]] = np.reshape(data, target)
        except ValueError:
            return  # the op's own error, when it runs

    def _weight_spec(self, name: str) -> tuple[tuple[int, ...], np.dtype] | None:
        """The shape and type of a Conv's weights when the graph fixes them."""
        value = self._static(name)
        return (value.shape, value.dtype) if value is not None else self.dequantized.get(name)

    def _static(self, name: str) -> np.ndarray | None:
        return self.constants.get(name) if name else None

    def _rank_of(self, name: str) -> int | None:
        if name in self.last:
            return self.rank[self.last[name]]
        if name in self.input_ranks:
            return self.input_ranks[name]
        spec = self._weight_spec(name)
        return None if spec is None else len(spec[0])

    # ------------------------------------------------------------------ rewriting

    def _rewrite(self, node: Node) -> bool | None:
        """Append ``node``'s channels-last form and return True, or None to keep it as it is."""
        if node.domain == DEQUANTIZED_DOMAIN and node.op_type == "Conv":
            return self._dequantized_conv(node)
        if node.domain == MICROSOFT:
            return self._microsoft(node)
        if node.domain != "":
            return None
        op = node.op_type
        if op == "Conv":
            return self._conv(node)
        if op in ("QLinearConv", "ConvInteger"):
            return self._integer_conv(node)
        if op == "DynamicQuantizeLinear" and node.inputs[0] in self.last:
            return self._dynamic_quantization(node)
        if op == "ConvTranspose":
            return self._conv_transpose(node)
        if op == "Transpose" and node.inputs[0] in self.last:
            return self._transpose(node)
        if op in ("Concat", *_UNARY, *_BROADCASTING) and any(i in self.last for i in node.inputs):
            return self._elementwise(node)
        if op in _SPATIAL and node.inputs[0] in self.last:
            return self._spatial(node)
        if op in ("Pad", "Slice", "Resize") and node.inputs[0] in self.last:
            return self._permuted_operands(node)
        if op in ("QuantizeLinear", "DequantizeLinear") and node.inputs[0] in self.last:
            return self._quantization(node)
        return None

    def _internal(self, node: Node, inputs, outputs, attrs=None) -> bool:
        op = lookup(DOMAIN, node.op_type, VERSION)
        given = {k: v for k, v in (node.attrs if attrs is None else attrs).items() if k in op.attributes}
        merged, _ = op.with_declared_defaults(given)
        self.nodes.append(
            dataclasses.replace(
                node,
                domain=DOMAIN,
                op=op,
                opset=VERSION,
                inputs=tuple(inputs),
                outputs=tuple(outputs),
                attrs=types.MappingProxyType(merged),
            )
        )
        return True

    def _conv(self, node: Node) -> bool | None:
        if len(node.inputs) < 2 or not node.inputs[0] or not node.inputs[1] or len(node.outputs) != 1:
            return None
        x, w = node.inputs[:2]
        rank = self._rank_of(x) or self._rank_of(w)
        kernel = node.attrs.get("kernel_shape")
        if rank is None and kernel:
            rank = len(kernel) + 2
        if rank is None or rank < 3:
            return None
        w_spec, attrs = self._weight_spec(w), dict(node.attrs)
        layout, tap_loop = "HWIO", False
        if w_spec is not None:
            (w_shape, w_dtype), strides = w_spec, attrs.get("strides") or (1,) * (rank - 2)
            layout = conv.kernel_layout_for(w_shape, attrs.get("group", 1), strides)
            tap_loop = conv.runs_as_tap_loop(w_shape, attrs.get("group", 1), w_dtype, strides, attrs.get("dilations"))
        attrs["kernel_layout"] = layout
        if layout == "OIHW":
            weights = w
        else:
            key = (w, layout)  # weights: OI(D)HW -> the layout, once per weight
            if key not in self.relayouts:
                perm = list(conv.kernel_permutation(layout, rank))
                self.relayouts[key] = self._emit("Transpose", [w], f"{w}/{layout.lower()}", perm=perm)
            weights = self.relayouts[key]
        inputs = [self._last(x, rank), weights, *node.inputs[2:3]]
        out = self._new_output(node.outputs[0], rank)
        if tap_loop:
            self.tap_loops.add(out)
        return self._internal(node, inputs, [out], attrs)

    def _dequantized_conv(self, node: Node) -> bool | None:
        """The quantized_convs pass's Conv: its 8-bit input channels-last, its weights as
        stored (the product reads them as one matrix), its output channels-last."""
        w = self._static(node.inputs[3])
        if w is None or w.ndim < 3 or len(node.outputs) != 1:
            return None
        return self._with_attrs(node, {0}, {"channels_last": 1}, w.ndim)

    def _integer_conv(self, node: Node) -> bool | None:
        """QLinearConv and ConvInteger with fixed weights: their 8-bit product, or their float32
        convolutions (grouped ones, or off the CPU), read and write channels-last. The input's
        zero point is one value (ConvInteger's may come from a DynamicQuantizeLinear)."""
        w_at = 3 if node.op_type == "QLinearConv" else 1
        w = self._static(node.inputs[w_at]) if len(node.inputs) > w_at else None
        x_zero = node.inputs[2] if len(node.inputs) > 2 and node.op_type == "QLinearConv" else ""
        if x_zero and (self._static(x_zero) is None or self._static(x_zero).size != 1):
            return None  # per channel, or unknown here
        if w is None or w.ndim < 3 or len(node.outputs) != 1:
            return None
        inputs = [self._last(node.inputs[0], w.ndim), *node.inputs[1:]]
        return self._internal(node, inputs, [self._new_output(node.outputs[0], w.ndim)])

    def _dynamic_quantization(self, node: Node) -> bool:
        """DynamicQuantizeLinear: its scale and zero point come from the whole tensor's range,
        the same in any layout; the quantized values keep the input's."""
        return self._with_attrs(node, {0}, {}, self.rank[self.last[node.inputs[0]]])

    def _microsoft(self, node: Node) -> bool | None:
        """onnxruntime's quantized element-wise ops and global average pool (its QOperator
        files' ops between QLinearConvs) on channels-last values: the same nodes, the pool
        told its layout. Their scales and zero points are per tensor."""
        activations = _MICROSOFT_ELEMENTWISE.get(node.op_type)
        if activations is not None:
            names = [node.inputs[i] for i in activations if i < len(node.inputs)]
            ranks = {self.rank[self.last[n]] for n in names if n in self.last}
            if len(ranks) != 1 or len(node.outputs) != 1:
                return None
            plain = [n for n in names if n not in self.last]
            if any(self._static(n) is None or self._static(n).size != 1 for n in plain):
                return None  # another activation, or a constant that broadcasts by axis
            return self._with_attrs(node, {i for i in activations if node.inputs[i] in self.last}, {}, ranks.pop())
        if node.op_type == "QLinearConcat" and node.attrs["axis"] is not None and len(node.outputs) == 1:
            parts = range(2, len(node.inputs), 3)
            ranks = {self.rank[self.last[node.inputs[i]]] for i in parts if node.inputs[i] in self.last}
            if len(ranks) != 1 or any(node.inputs[i] not in self.last for i in parts):
                return None
            rank = ranks.pop()
            axis = _axis_last(int(node.attrs["axis"]) % rank, rank)
            return self._with_attrs(node, set(parts), {"axis": axis}, rank)
        if node.op_type == "QLinearGlobalAveragePool" and not node.attrs["channels_last"]:
            if node.inputs[0] not in self.last or len(node.outputs) != 1:
                return None
            return self._with_attrs(node, {0}, {"channels_last": 1}, self.rank[self.last[node.inputs[0]]])
        return None

    def _with_attrs(self, node: Node, activations: set[int], attrs: dict, rank: int) -> bool:
        """``node`` reading the channels-last forms of its inputs at ``activations``, with
        ``attrs`` set, its first output channels-last (any others, one-value ones, as they are)."""
        inputs = [self._last(name, rank) if i in activations else name for i, name in enumerate(node.inputs)]
        out = self._new_output(node.outputs[0], rank)
        self.nodes.append(
            dataclasses.replace(
                node,
                inputs=tuple(inputs),
                outputs=(out, *node.outputs[1:]),
                attrs=types.MappingProxyType({**node.attrs, **attrs}),
            )
        )
        return True

    def _conv_transpose(self, node: Node) -> bool | None:
        if len(node.inputs) < 2 or not node.inputs[0] or not node.inputs[1] or len(node.outputs) != 1:
            return None
        x = node.inputs[0]
        rank = self._rank_of(x) or self._rank_of(node.inputs[1])
        if rank is None or rank < 3:
            return None
        inputs = [self._last(x, rank), *node.inputs[1:3]]  # the weights as stored
        attrs = {**node.attrs, "legacy": int(node.opset < 11)}
        return self._internal(node, inputs, [self._new_output(node.outputs[0], rank)], attrs)

    def _spatial(self, node: Node) -> bool | None:
        x = node.inputs[0]
        rank = self.rank[self.last[x]]
        op, attrs = node.op_type, dict(node.attrs)
        if op == "MaxPool" and len(node.outputs) > 1 and node.outputs[1]:
            return None  # Indices are flat NC(D)HW positions
        if op == "BatchNormalization":
            if attrs.get("spatial") not in (None, 1) or len(node.inputs) < 5:
                return None  # opset < 9's per-activation statistics
            # The mode the node's own version gives it (training_mode, is_test or its outputs).
            attrs.update(training_mode=int(node.trains(None)), legacy=int(node.opset < 14))
        tap_loop = self.last[x] in self.tap_loops
        if op in ("MaxPool", "AveragePool"):
            attrs["after_tap_loop"] = int(tap_loop)
        outputs = [self._new_output(node.outputs[0], rank), *node.outputs[1:]]
        if tap_loop and op == "BatchNormalization" and not attrs["training_mode"]:
            self.tap_loops.add(outputs[0])  # a multiply-add per element, fused into the loop
        return self._internal(node, [self.last[x], *node.inputs[1:]], outputs, attrs)

    def _elementwise(self, node: Node) -> bool | None:
        ranks = {self.rank[self.last[i]] for i in node.inputs if i in self.last}
        if len(ranks) != 1 or len(node.outputs) != 1:
            return None
        (rank,) = ranks
        plan = []  # (how, name): decided for every input before anything is emitted
        for i, name in enumerate(node.inputs):
            if not name or name in self.last or (node.op_type == "Clip" and i > 0) or name in self.scalars:
                plan.append(("as is", name))  # Clip's min and max are scalars
            elif name in self.constants and self.constants[name].ndim <= rank:
                plan.append(("constant", name))
            elif self._rank_of(name) == rank:
                plan.append(("activation", name))  # an NC(D)HW value of the same rank
            else:
                return None
        inputs = [
            self.last.get(name, name)
            if how == "as is"
            else self._relayout(name, rank)
            if how == "constant"
            else self._last(name, rank)
            for how, name in plan
        ]
        attrs = dict(node.attrs)
        if node.op_type == "Concat":
            attrs["axis"] = _axis_last(int(attrs["axis"]) % rank, rank)
        out = self._new_output(node.outputs[0], rank)
        if node.op_type != "Concat" and self.tap_loops.intersection(inputs):
            self.tap_loops.add(out)  # elementwise: XLA fuses it into the same loop
        self.nodes.append(
            dataclasses.replace(
                node,
                inputs=tuple(inputs),
                outputs=(out,),
                attrs=types.MappingProxyType(attrs),
            )
        )
        return True

    def _quantization(self, node: Node) -> bool | None:
        """QuantizeLinear and DequantizeLinear of an activation (the pairs a QDQ file puts around
        every Conv): elementwise given the scale and zero point, which are per tensor or per
        channel along ``axis`` (renumbered). Blocked quantization's scales have the input's rank:
        those nodes stay in NC(D)HW."""
        if node.attrs.get("block_size") or len(node.outputs) != 1:
            return None
        rank = self.rank[self.last[node.inputs[0]]]
        attrs = {}
        if node.opset >= 13:  # the first version with per-axis scales, and an axis attribute
            attrs["axis"] = _axis_last(int(node.attrs.get("axis", 1)) % rank, rank)
        return self._with_attrs(node, {0}, attrs, rank)

    def _transpose(self, node: Node) -> bool:
        rank = self.rank[self.last[node.inputs[0]]]
        perm = node.attrs.get("perm")
        perm = tuple(range(rank))[::-1] if perm is None or len(perm) == 0 else tuple(int(p) for p in perm)
        first = _to_first(rank)
        composed = [first[p] for p in perm]
        source = self.last[node.inputs[0]]
        if composed == list(range(rank)):
            self.nodes.append(new_node("Identity", [source], list(node.outputs), node.name, 13))
        else:
            self.nodes.append(
                dataclasses.replace(node, inputs=(source,), attrs=types.MappingProxyType({"perm": composed}))
            )
        return True

    def _permuted_operands(self, node: Node) -> bool | None:
        """Pad, Slice and Resize: their per-axis operands permuted (constants only)."""
        x = node.inputs[0]
        rank = self.rank[self.last[x]]
        perm = _to_last(rank)
        inputs, attrs = list(node.inputs), dict(node.attrs)

        def constant(name, what):
            value = self._static(name)
            if value is None:
                raise _Keep(what)
            return value

        def new_constant(stem, value):
            name = unique_name(stem, self.taken)
            self.inits[name] = value
            return name

        try:
            if node.op_type == "Pad":
                if node.opset < 11:
                    pads = list(attrs["pads"])
                    attrs["pads"] = [pads[p] for p in perm] + [pads[rank + p] for p in perm]
                elif len(inputs) > 3 and inputs[3]:  # axes
                    axes = constant(inputs[3], "axes")
                    inputs[3] = new_constant(
                        f"{inputs[3]}/channels_last", int64([_axis_last(int(a) % rank, rank) for a in axes])
                    )
                else:
                    pads = constant(inputs[1], "pads")
                    if len(pads) != 2 * rank:
                        return None
                    permuted = np.concatenate([pads[list(perm)], pads[[rank + p for p in perm]]]).astype(pads.dtype)
                    inputs[1] = new_constant(f"{inputs[1]}/channels_last", permuted)
            elif node.op_type == "Slice":
                if node.opset < 10:
                    axes = attrs.get("axes") or list(range(len(attrs["starts"])))
                    attrs["axes"] = [_axis_last(int(a) % rank, rank) for a in axes]
                else:
                    starts = constant(inputs[1], "starts")
                    if len(inputs) > 3 and inputs[3]:
                        axes = constant(inputs[3], "axes")
                    else:
                        axes = np.arange(len(starts))
                    moved = np.asarray([_axis_last(int(a) % rank, rank) for a in axes], axes.dtype)
                    inputs = inputs + [""] * (4 - len(inputs))
                    inputs[3] = new_constant(f"{node.name}/axes_channels_last", moved)
            else:  # Resize
                if node.opset < 11 or attrs.get("axes"):
                    return None
                for i in (1, 2, 3):  # roi, scales, sizes
                    if i < len(inputs) and inputs[i]:
                        value = constant(inputs[i], "roi/scales/sizes")
                        if value.size == 0:
                            continue
                        if i == 1:  # roi: starts then ends
                            moved = np.concatenate([value[list(perm)], value[[rank + p for p in perm]]])
                        else:
                            moved = value[list(perm)]
                        inputs[i] = new_constant(f"{inputs[i]}/channels_last", moved.astype(value.dtype))
        except _Keep:
            return None
        self.nodes.append(
            dataclasses.replace(
                node,
                inputs=(self.last[x], *inputs[1:]),
                outputs=(self._new_output(node.outputs[0], rank),),
                attrs=types.MappingProxyType(attrs),
            )
        )
        return True


class _Keep(Exception):
    """A per-axis operand is not a constant: the node stays in NC(D)HW."""

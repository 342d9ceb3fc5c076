"""Quantized convolutions: a QDQ file's Conv of dequantized values as one exact 8-bit product.

onnxruntime's ``quantize_static`` writes the QDQ form by default: every Conv reads the outputs
of ``DequantizeLinear`` nodes (8-bit activations with one scale, 8-bit weights with one scale
per output channel), and a ``QuantizeLinear`` follows it. As written, jonnx dequantizes and
convolves in float32. Where the CPU multiplies 8-bit values faster than float32 (bfloat16 or
int8 dot instructions: ``quantize.integer_matmul_mode``), this pass rewrites

    Conv(DequantizeLinear(x, x_scale, x_zero), DequantizeLinear(W, w_scale, w_zero), B)

with W an 8-bit initializer to the internal Conv of ops/quantize.py (domain
``jonnx.dequantized``): the exact integer sum of the 8-bit values (``integer_conv``, as
QLinearConv runs it), times ``x_scale * w_scale``, plus B. The float32 convolution of the
dequantized values gives the same up to its own rounding. The scales and B stay inputs, so
gradients reach them as before; the DequantizeLinear nodes are left for the dead-node pass.
The layout pass then runs these convolutions channels-last too (their taps and products in
(position, channel) order), with the QuantizeLinear/DequantizeLinear pairs between them.
ResNet-50 through ``quantize_static`` (QDQ), batch 1, Zen 4, one process alternating: float32
convolutions 62.5 ms, the 8-bit products 52.1 in NCHW and 42.4 channels-last (the QOperator
file, NCHW: 57-59; docs/performance.md, "Integer convolutions").

Only convolutions that ``integer_conv`` runs as one product are rewritten (ungrouped, at most
64 kernel positions, on CPU): grouped ones, and every one off the CPU, would run as two float32
convolutions of the input's 4-bit halves instead of one.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jonnx._ir import Graph, Node
from jonnx.ops import quantize
from jonnx.ops._util import lowers_for_cpu
from jonnx.optimize._util import new_node

__all__ = ["run"]

_EIGHT_BIT = (np.dtype(np.int8), np.dtype(np.uint8))


def run(graph: Graph, train: bool | None) -> Graph:
    if not lowers_for_cpu() or quantize.integer_matmul_mode() == "float32":
        return graph
    dequantized = {
        n.outputs[0]: n
        for n in graph.nodes
        if n.op_type == "DequantizeLinear" and n.domain == "" and len(n.outputs) == 1 and n.outputs[0]
    }
    if not dequantized:
        return graph
    fixed = {n: v for n, v in graph.initializers.items() if n not in graph.input_names}
    nodes = tuple(_rewrite(node, dequantized, fixed) or node for node in graph.nodes)
    if all(a is b for a, b in zip(nodes, graph.nodes)):
        return graph
    return dataclasses.replace(graph, nodes=nodes)


def _rewrite(node: Node, dequantized: dict[str, Node], fixed) -> Node | None:
    if node.op_type != "Conv" or node.domain != "" or len(node.inputs) < 2 or len(node.outputs) != 1:
        return None
    x_terms = _terms(dequantized.get(node.inputs[0]), fixed, weights=False)
    w_terms = _terms(dequantized.get(node.inputs[1]), fixed, weights=True)
    if x_terms is None or w_terms is None:
        return None
    w = fixed[w_terms[0]]
    if w.ndim < 3 or not quantize.runs_as_integer_product(w.shape, int(node.attrs["group"])):
        return None
    bias = node.inputs[2] if len(node.inputs) > 2 else ""
    attrs = {k: v for k, v in node.attrs.items() if v is not None}
    return new_node(
        "Conv",
        [*x_terms, *w_terms, bias],
        list(node.outputs),
        node.name,
        1,
        domain=quantize.DEQUANTIZED_DOMAIN,
        **attrs,
    )


def _terms(dq: Node | None, fixed, *, weights: bool) -> tuple[str, str, str] | None:
    """A DequantizeLinear's (data, scale, zero point) names where the internal Conv can read
    them: 8-bit data (an initializer for the weights), a fixed scale and zero point, one per
    tensor (or, for the weights, per output channel). None otherwise."""
    if dq is None or dq.attrs.get("block_size") or dq.attrs.get("output_dtype"):
        return None
    data, scale, zero = (*dq.inputs, "", "")[:3]
    if scale not in fixed or (zero and zero not in fixed):
        return None
    scale_value = fixed[scale]
    if weights:
        w = fixed.get(data)
        if w is None or w.dtype not in _EIGHT_BIT or w.ndim < 3:
            return None
        dtype = w.dtype
        per_channel = scale_value.ndim == 1 and scale_value.shape[0] == w.shape[0] > 1
        axis = dq.attrs.get("axis")
        if per_channel and (axis is None or int(axis) % w.ndim != 0):
            return None
        if scale_value.size != 1 and not per_channel:
            return None
    else:
        if not zero:
            return None  # the data's type is the zero point's, and without it unknown here
        dtype = fixed[zero].dtype
        if scale_value.size != 1:
            return None
    if zero and (fixed[zero].dtype != dtype or fixed[zero].shape != scale_value.shape):
        return None
    if dtype not in _EIGHT_BIT or scale_value.dtype.kind != "f":
        return None
    return data, scale, zero

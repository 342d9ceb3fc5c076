"""BatchNormalization in inference folded into the Conv or Gemm before it.

``BN(Conv(x, W, b))`` is ``Conv(x, W * s, (b - mean) * s + beta)`` with ``s = scale /
sqrt(var + eps)`` per output channel. The new weights are computed by ordinary nodes on the
old ones, so gradients reach the original parameters and running statistics as before; when
the weights are constants (``Model(*inputs)``) those nodes fold at trace time and the
BatchNormalization costs nothing. Only nodes that run in inference for the given ``train``
flag are folded; a Conv whose output something else also reads is left alone.
"""

from __future__ import annotations

import dataclasses
import types

import numpy as np

from jonnx._ir import Graph, Node
from jonnx.optimize._util import int64, new_node, readers, taken_names, unique_name

__all__ = ["run"]


def run(graph: Graph, train: bool | None) -> Graph:
    producers = graph.producers()
    reads = readers(graph)
    taken = taken_names(graph)
    inits = dict(graph.initializers)
    replaced: dict[int, list[Node]] = {}  # id(conv node) -> nodes replacing it
    dropped: set[int] = set()  # id(BatchNormalization node)
    for bn in graph.nodes:
        conv = _foldable(bn, producers, reads, train, inits)
        if conv is None or id(conv) in replaced:
            continue
        replaced[id(conv)] = _folded(conv, bn, inits, taken)
        dropped.add(id(bn))
    if not replaced:
        return graph
    nodes = []
    for node in graph.nodes:
        if id(node) in dropped:
            continue
        nodes.extend(replaced.get(id(node), [node]))
    return dataclasses.replace(graph, nodes=tuple(nodes), initializers=inits)


def _foldable(bn: Node, producers, reads, train, inits) -> Node | None:
    if bn.op_type != "BatchNormalization" or bn.domain != "" or bn.trains(train):
        return None
    if any(bn.outputs[1:]) or len(bn.inputs) < 5 or not all(bn.inputs[:5]):
        return None  # statistics outputs read: leave the node as it is
    if bn.attrs.get("spatial") not in (
        None,
        1,
    ):  # opset < 9's per-activation statistics
        return None
    conv = producers.get(bn.inputs[0])
    if conv is None or conv.domain != "" or reads[bn.inputs[0]] != 1 or conv.seed_index is None:
        return None
    if conv.op_type == "Conv" and len(conv.inputs) >= 2 and _weight_rank(conv, inits) is not None:
        return conv
    gemm = conv.op_type == "Gemm" and float(conv.attrs["alpha"]) == 1.0 and not conv.attrs["transA"]
    # C, when present, must enter unscaled: the folded bias replaces beta * C.
    if gemm and (len(conv.inputs) < 3 or not conv.inputs[2] or float(conv.attrs["beta"]) == 1.0):
        return conv
    return None


def _folded(conv: Node, bn: Node, inits: dict, taken: set[str]) -> list[Node]:
    """``conv`` with ``bn`` folded in: the nodes computing the new weights, then the new conv."""
    opset = max(bn.opset, 13)
    x, w = conv.inputs[0], conv.inputs[1]
    b = conv.inputs[2] if len(conv.inputs) > 2 and conv.inputs[2] else ""
    scale, beta, mean, var = bn.inputs[1:5]
    stem = conv.name + "/bn_folded"
    nodes: list[Node] = []

    def add(op: str, inputs: list[str], **attrs) -> str:
        out = unique_name(f"{stem}/{op}", taken)
        nodes.append(new_node(op, inputs, [out], unique_name(out, taken), opset, **attrs))
        return out

    eps = unique_name(f"{stem}/epsilon", taken)
    inits[eps] = np.asarray(float(bn.attrs["epsilon"]), inits_dtype(inits, scale))
    s = add("Div", [scale, add("Sqrt", [add("Add", [var, eps])])])
    if conv.op_type == "Conv":
        shape = unique_name(f"{stem}/shape", taken)
        inits[shape] = int64([-1] + [1] * (_weight_rank(conv, inits) - 1))  # per output channel
        w_new = add("Mul", [w, add("Reshape", [s, shape])])
    elif conv.attrs["transB"]:  # B is (N, K): scale rows
        shape = unique_name(f"{stem}/shape", taken)
        inits[shape] = int64([-1, 1])
        w_new = add("Mul", [w, add("Reshape", [s, shape])])
    else:  # B is (K, N): scale columns
        w_new = add("Mul", [w, s])
    shifted = add("Sub", [b, mean]) if b else add("Neg", [mean])
    b_new = add("Add", [add("Mul", [shifted, s]), beta])
    attrs = dict(conv.attrs)
    if conv.op_type == "Gemm":
        attrs["beta"] = 1.0
    folded = dataclasses.replace(
        conv,
        inputs=(x, w_new, b_new),
        outputs=(bn.outputs[0],),
        attrs=types.MappingProxyType(attrs),
    )
    return [*nodes, folded]


def inits_dtype(inits: dict, name: str):
    value = inits.get(name)
    return value.dtype if value is not None else np.float32


def _weight_rank(conv: Node, inits: dict) -> int | None:
    """The rank of a Conv's weights, where the graph says it before anything runs."""
    if conv.inputs[1] in inits:
        return np.ndim(inits[conv.inputs[1]])
    kernel = conv.attrs.get("kernel_shape")
    return len(kernel) + 2 if kernel else None

"""Parallel MatMuls that share their left operand (attention's Q, K and V) as one MatMul.

``MatMul(x, W1), MatMul(x, W2), ...`` with 2-D float initializers ``W_i`` of the same row count
become ``Split(MatMul(x, Concat(W1, W2, ...)))``: one larger product, which XLA's CPU dot runs
faster than three small ones (1.05-1.35x on a BERT-base layer at batch 1). The Concat reads the
original parameters, so gradients reach each of them; with constant weights it folds at trace
time.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

from jonnx._ir import Graph, Node
from jonnx.optimize._util import int64, new_node, taken_names, unique_name

__all__ = ["run"]


def run(graph: Graph, train: bool | None) -> Graph:
    inits = dict(graph.initializers)
    groups: dict[tuple, list[Node]] = defaultdict(list)
    for node in graph.nodes:
        if node.op_type != "MatMul" or node.domain != "" or len(node.inputs) != 2 or not node.inputs[0]:
            continue
        w = inits.get(node.inputs[1])
        if w is None or w.ndim != 2 or w.dtype.kind != "f" or node.inputs[1] in graph.input_names:
            continue
        groups[(node.inputs[0], w.shape[0], w.dtype.str)].append(node)
    groups = {k: v for k, v in groups.items() if len(v) > 1}
    if not groups:
        return graph
    taken = taken_names(graph)
    position = {id(n): i for i, n in enumerate(graph.nodes)}
    replaced: dict[int, list[Node]] = {}
    dropped: set[int] = set()
    for (x, _, _), members in groups.items():
        first = min(members, key=lambda n: position[id(n)])  # x is ready there; the rest read later
        opset = max(first.opset, 13)
        stem = first.name + "/fused"
        weights = unique_name(f"{stem}/weights", taken)
        product = unique_name(f"{stem}/product", taken)
        sizes = unique_name(f"{stem}/split", taken)
        inits[sizes] = int64([inits[n.inputs[1]].shape[1] for n in members])
        replaced[id(first)] = [
            new_node(
                "Concat",
                [n.inputs[1] for n in members],
                [weights],
                unique_name(weights, taken),
                opset,
                axis=1,
            ),
            new_node("MatMul", [x, weights], [product], unique_name(product, taken), opset),
            new_node(
                "Split",
                [product, sizes],
                [n.outputs[0] for n in members],
                unique_name(f"{stem}/Split", taken),
                opset,
                axis=-1,
            ),
        ]
        dropped.update(id(n) for n in members if n is not first)
    nodes = []
    for node in graph.nodes:
        if id(node) not in dropped:
            nodes.extend(replaced.get(id(node), [node]))
    return dataclasses.replace(graph, nodes=tuple(nodes), initializers=inits)

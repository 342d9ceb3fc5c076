"""Dead-node removal: nodes whose outputs nothing reads (graph outputs, nodes, subgraphs).

Stateful nodes (BatchNormalization) stay: their new running statistics leave through the
state, not through a value another node reads. Folding and fusion leave such nodes behind
(the BatchNormalization a Conv absorbed is gone, but a Reshape feeding only it is not).

A graph with a ``Gradient`` node (ai.onnx.preview.training) is left as it is: Gradient
differentiates the enclosing graph's nodes from ``xs`` to ``y``, values it names in
attributes rather than reading them as inputs.
"""

from __future__ import annotations

import dataclasses

from jonnx._ir import Graph

__all__ = ["run"]


def run(graph: Graph, train: bool | None) -> Graph:
    if any(n.op_type == "Gradient" and n.domain == "ai.onnx.preview.training" for n in graph.nodes):
        return graph
    needed = set(graph.output_names)
    kept = []
    for node in reversed(graph.nodes):
        if not node.op.state_updates and not any(o in needed for o in node.outputs if o):
            continue
        kept.append(node)
        needed |= node.reads
    if len(kept) == len(graph.nodes):
        return graph
    return dataclasses.replace(graph, nodes=tuple(reversed(kept)))

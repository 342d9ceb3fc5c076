"""Dead-node removal: nodes whose outputs nothing reads (graph outputs, nodes, subgraphs).

Stateful nodes (BatchNormalization) stay: their new running statistics leave through the
state, not through a value another node reads. Folding and fusion leave such nodes behind
(the BatchNormalization a Conv absorbed is gone, but a Reshape feeding only it is not).
"""

from __future__ import annotations

import dataclasses

from jonnx._ir import Graph

__all__ = ["run"]


def run(graph: Graph, train: bool | None) -> Graph:
    needed = set(graph.output_names)
    kept = []
    for node in reversed(graph.nodes):
        if not node.op.state_updates and not any(o in needed for o in node.outputs if o):
            continue
        kept.append(node)
        needed.update(i for i in node.inputs if i)
        for value in node.attrs.values():
            for g in value if isinstance(value, tuple) else (value,):
                if isinstance(g, Graph):
                    needed |= g.outer_names
    if len(kept) == len(graph.nodes):
        return graph
    return dataclasses.replace(graph, nodes=tuple(reversed(kept)))

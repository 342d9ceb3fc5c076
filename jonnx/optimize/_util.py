"""What the passes share: reading who uses a value, and making new bound nodes."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx.helper as oh

from jonnx._build import GraphBuilder
from jonnx._ir import Graph, Node

__all__ = ["new_node", "readers", "taken_names", "unique_name"]


def readers(graph: Graph) -> Counter:
    """Value name -> how many times it is read (node inputs, subgraphs' outer reads, outputs)."""
    count: Counter = Counter()
    for node in graph.nodes:
        count.update(i for i in node.inputs if i)
        for value in node.attrs.values():
            for g in value if isinstance(value, tuple) else (value,):
                if isinstance(g, Graph):
                    count.update(g.outer_names)
    count.update(graph.output_names)
    return count


def taken_names(graph: Graph) -> set[str]:
    """Every value and node name of ``graph`` (node outputs and names, initializers, inputs):
    the set :func:`unique_name` draws new names against."""
    taken = {o for n in graph.nodes for o in n.outputs} | {n.name for n in graph.nodes}
    return taken | set(graph.initializers) | set(graph.input_names)


def unique_name(stem: str, taken: set[str]) -> str:
    """A value or node name not in ``taken`` (which it joins)."""
    name, i = stem, 0
    while name in taken:
        i += 1
        name = f"{stem}_{i}"
    taken.add(name)
    return name


def new_node(
    op_type: str, inputs: list[str], outputs: list[str], name: str, opset: int, *, domain: str = "", **attrs
) -> Node:
    """A node of ``domain`` (ai.onnx by default) bound to its implementation at ``opset``, as
    the loader would build it."""
    builder = GraphBuilder({domain: opset}, None)
    return builder.bind(oh.make_node(op_type, inputs, outputs, name=name, domain=domain, **attrs))


def int64(values) -> np.ndarray:
    return np.asarray(values, np.int64)

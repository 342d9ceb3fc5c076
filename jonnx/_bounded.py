"""Bounded mode: data-dependent output shapes padded to a static size, all inside one XLA
computation (``jonnx.load(..., size_bounds=...)``), for TPUs and ``jax.export``.

A graph pass swaps the implementation of each chosen node for a bounded one whose output has
a static size: the valid rows first, then rows of -1. Nothing else in the graph changes, so a
Gather of the selected boxes gathers the valid ones first (and the last box for each padding
row, ONNX's meaning of index -1): compare results up to the valid count.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping

from jonnx import errors
from jonnx._ir import Graph
from jonnx.ops.detection import non_max_suppression_bounded
from jonnx.ops.indexing import non_zero_bounded

__all__ = ["BOUNDED_OPS", "bound_sizes"]

#: op type -> (bounded implementation, input positions still needed at trace time).
BOUNDED_OPS = {
    "NonMaxSuppression": (non_max_suppression_bounded, frozenset({2})),
    "NonZero": (non_zero_bounded, frozenset()),
}


def bound_sizes(graph: Graph, size_bounds: Mapping[str, int | None]) -> Graph:
    """``graph`` with the nodes ``size_bounds`` names (by node name or op type) bounded.

    Args:
        graph: the main graph.
        size_bounds: node name or op type -> the output's row count (None: the op's natural
            bound, batches x classes x ``max_output_boxes_per_class`` for NonMaxSuppression,
            the input's size for NonZero).

    Raises:
        jonnx.errors.ModelStructureError: a key names no node of a supported op, or a bound
            is not a positive int.
    """
    used = set()
    nodes = []
    for node in graph.nodes:
        key = node.name if node.name in size_bounds else node.op_type
        if key not in size_bounds:
            nodes.append(node)
            continue
        if node.op_type not in BOUNDED_OPS or node.domain:
            raise errors.ModelStructureError(
                f"size_bounds names node {node.name!r} ({node.op_type}), which has no bounded "
                f"mode; ops with one: {sorted(BOUNDED_OPS)}"
            )
        bound = size_bounds[key]
        if bound is not None and (not isinstance(bound, int) or bound < 1):
            raise errors.ModelStructureError(
                f"size_bounds[{key!r}] must be a positive int or None, not {bound!r}"
            )
        used.add(key)
        fn, static = BOUNDED_OPS[node.op_type]
        op = dataclasses.replace(
            node.op,
            fn=functools.partial(fn, max_rows=bound),
            static_inputs=static,
            host=False,
        )
        nodes.append(dataclasses.replace(node, op=op, static_inputs=static))
    unused = set(size_bounds) - used
    if unused:
        raise errors.ModelStructureError(
            f"size_bounds names {sorted(unused)}, which match no node name or op type of the graph"
        )
    return dataclasses.replace(graph, nodes=tuple(nodes))

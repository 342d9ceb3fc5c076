"""Bounded mode: data-dependent output shapes padded to a static size, all inside one XLA
computation (``jonnx.load(..., size_bounds=...)``), for TPUs and ``jax.export``.

A graph pass swaps the implementation of each chosen node for a bounded one whose output has
a static size: the valid rows first, then rows of -1. Nothing else in the graph changes, so a
Gather of the selected boxes gathers the valid ones first (and the last box for each padding
row, ONNX's meaning of index -1): compare results up to the valid count. Compress pads with
zeros, which cannot be told from data, so its node gets a second output with the valid count,
appended to the graph's outputs (``COUNTED_OPS``); so does a Loop with a data-dependent exit,
whose scan outputs get a row per step of one scan (zeros past the exit) and whose count is the
number of iterations that ran. Unique pads ``indices`` with -1 and ``counts`` with 0.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping

import numpy as np

from jonnx import errors
from jonnx._ir import Graph, ValueInfo
from jonnx.ops.control import loop_bounded
from jonnx.ops.detection import non_max_suppression_bounded
from jonnx.ops.indexing import compress_bounded, non_zero_bounded, unique_bounded

__all__ = ["BOUNDED_OPS", "COUNTED_OPS", "bound_sizes"]

#: op type -> (bounded implementation, input positions still needed at trace time).
BOUNDED_OPS = {
    "NonMaxSuppression": (non_max_suppression_bounded, frozenset({2})),
    "NonZero": (non_zero_bounded, frozenset()),
    "Compress": (compress_bounded, frozenset()),
    "Unique": (unique_bounded, frozenset()),
    "Loop": (loop_bounded, frozenset()),
}

#: ops whose bounded form has one more output, the valid count, appended to the graph's
#: outputs as ``<the node's first output>_count`` (an int64 scalar).
COUNTED_OPS = frozenset({"Compress", "Loop"})


def bound_sizes(graph: Graph, size_bounds: Mapping[str, int | None]) -> Graph:
    """``graph`` with the nodes ``size_bounds`` names (by node name or op type) bounded.

    Args:
        graph: the main graph.
        size_bounds: node name or op type -> the output's row count (None: the op's natural
            bound, batches x classes x ``max_output_boxes_per_class`` for NonMaxSuppression,
            the input's size for NonZero, the axis's size for Compress and Unique, the trip
            count for Loop).

    Raises:
        jonnx.errors.ModelStructureError: a key names no node of a supported op, or a bound
            is not a positive int.
    """
    used = set()
    nodes = []
    counts: list[ValueInfo] = []
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
            raise errors.ModelStructureError(f"size_bounds[{key!r}] must be a positive int or None, not {bound!r}")
        used.add(key)
        fn, static = BOUNDED_OPS[node.op_type]
        op = dataclasses.replace(
            node.op,
            fn=functools.partial(fn, max_rows=bound),
            static_inputs=static,
            host=False,
        )
        outputs = node.outputs
        if node.op_type in COUNTED_OPS:
            count = f"{node.outputs[0]}_count"
            outputs = (*outputs, count)
            counts.append(ValueInfo(count, np.dtype(np.int64), ()))
        nodes.append(dataclasses.replace(node, op=op, static_inputs=static, outputs=outputs))
    unused = set(size_bounds) - used
    if unused:
        raise errors.ModelStructureError(
            f"size_bounds names {sorted(unused)}, which match no node name or op type of the graph"
        )
    return dataclasses.replace(graph, nodes=tuple(nodes), outputs=(*graph.outputs, *counts))

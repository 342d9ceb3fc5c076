"""Static analysis: which values must be known at trace time.

Ops declare the inputs they need as trace-time constants (Reshape's shape, Slice's starts,
TopK's k, ...). Walking back from those inputs through their producers finds every value that
must be concrete, stopping at ops whose outputs depend only on shapes (Shape, Size). What is
left at the sources is either an initializer (kept as a numpy constant, not a trainable
parameter) or a graph input (which ``Model.__call__`` and the backend treat as static).

It also finds the initializers that are an op's settings rather than weights
(:func:`setting_values`): they are constants too.
"""

from __future__ import annotations

import onnx.defs

from jonnx._ir import Graph
from jonnx._registry import schema_for

__all__ = ["preferred_static_inputs", "setting_values", "static_values"]

_NON_DIFFERENTIABLE = onnx.defs.OpSchema.DifferentiationCategory.NonDifferentiable


def _seeds(graph: Graph, segmented: bool) -> set[str]:
    seeds: set[str] = set()
    for node in graph.nodes:
        if segmented and node.on_host:
            continue  # its inputs are data, computed before the node runs on the host
        for i in node.static_inputs:
            if i < len(node.inputs) and node.inputs[i]:
                seeds.add(node.inputs[i])
        for sub in node.subgraphs:
            # A subgraph's static needs that it reads from this scope become ours.
            seeds |= static_values(sub) & sub.outer_names
    return seeds


def static_values(graph: Graph, *, segmented: bool = False) -> frozenset[str]:
    """Names of the values in ``graph`` (and outer names its subgraphs read) that must be static.

    The result includes graph inputs, initializers and outer-scope names at the sources of
    each static chain, and every intermediate value on the way. ``segmented``: the graph runs
    in compiled segments (``jonnx._segments``), where the inputs of host ops (NonZero,
    NonMaxSuppression, ...) in ``graph`` itself are data computed by an earlier segment, so
    they do not make the weights they come from constants.
    """
    producers = graph.producers()
    need = _seeds(graph, segmented)
    # Segmented, a static value computed from data (a TopK k counted from scores) is cut
    # there: a segment computes it and hands it to the next as a static argument, so the
    # weights above it stay trainable params rather than becoming constants.
    data = _data_values(graph) if segmented else frozenset()
    stack = list(need)
    while stack:
        node = producers.get(stack.pop())
        if node is None or node.op.shape_only or any(o in data for o in node.outputs):
            continue
        for name in node.reads - need:
            need.add(name)
            stack.append(name)
    return frozenset(need)


def _data_values(graph: Graph) -> frozenset[str]:
    """Values computed from data: from float graph inputs that are not scalars (never
    shape-like; integer, bool and scalar inputs may be sizes or flags), through every op but
    the shape-only ones (Shape, Size)."""
    data = {
        v.name
        for v in graph.inputs
        if v.dtype is not None and v.dtype.kind == "f" and not (v.shape is not None and all(d == 1 for d in v.shape))
    }
    for node in graph.nodes:
        if node.op.shape_only:
            continue
        if node.reads & data:
            data.update(o for o in node.outputs if o)
    return frozenset(data)


def preferred_static_inputs(graph: Graph) -> frozenset[str]:
    """Graph inputs that feed a prefer-static slot directly (If's condition, Loop's count).

    Only direct feeds count: following a chain back would make data inputs static (an
    ``If`` on ``x.sum() > 0`` must not recompile for every ``x``).
    """
    inputs = set(graph.input_names)
    found: set[str] = set()
    for node in graph.nodes:
        for i in node.prefer_static:
            if i < len(node.inputs) and node.inputs[i] in inputs:
                found.add(node.inputs[i])
    return frozenset(found)


def setting_values(graph: Graph) -> frozenset[str]:
    """One-element initializers that every reader takes where its schema defines no
    derivative: a Clip's bounds, Pad's fill value, Dropout's ratio, a Mod's divisor, a
    comparison's threshold.

    These are the ops' settings (older opsets wrote most of them as attributes), not weights:
    trained as params they would get gradients and weight decay (a ReLU6 bound drifting away
    from 6 under AdamW), which no exporter's framework does, and computing their gradients
    cost a MobileNetV2 training step a fifth of its time. So they are constants. Only single
    values: some schemas also mark tensors non-differentiable that models do learn (an
    AffineGrid's theta, an RNN's initial state, an STFT window), and those stay params.
    Readers without an onnx schema (custom domains, functions) count as differentiable, as
    do graph outputs and what subgraphs read.
    """
    read = {name for node in graph.nodes for name in node.reads}
    differentiable = _differentiable_reads(graph)
    return frozenset(
        name
        for name, value in graph.initializers.items()
        if value.size == 1 and name in read and name not in differentiable
    )


def _differentiable_reads(graph: Graph) -> set[str]:
    names = set(graph.output_names)
    for node in graph.nodes:
        schema = schema_for(node.domain, node.op_type, node.opset)
        formal = schema.inputs if schema is not None else ()
        for i, name in enumerate(node.inputs):
            # A variadic last input's category covers every position from it on.
            settings_slot = (
                bool(formal) and formal[min(i, len(formal) - 1)].differentiation_category == _NON_DIFFERENTIABLE
            )
            if name and not settings_slot:
                names.add(name)
        for sub in node.subgraphs:
            names |= sub.outer_names
    return names

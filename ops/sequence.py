"""Sequences and optionals: Python lists of arrays and ``None``, while their structure is static.

A sequence's length and an optional's presence are known at trace time (they are Python
structure, not data), so SequenceLength and OptionalHasElement give static values, and
positions into a sequence must be static too.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from jonnx._registry import Attrs, Inputs, OpContext, Outputs, register
from jonnx.ops._util import normalize_axis, static_ints


def _position(seq, position, ctx, *, insert: bool = False) -> int:
    n = len(seq)
    p = n if position is None and insert else -1 if position is None else int(np.asarray(position).reshape(()))
    high = n if insert else n - 1
    if not -n <= p <= high:
        raise ctx.error(f"position {p} is out of range for a sequence of length {n}")
    return p + n if p < 0 else p


def _as_list(seq, ctx) -> list:
    if not isinstance(seq, list):
        raise ctx.error(f"expects a sequence, got {type(seq).__name__}")
    return seq


@register("SequenceEmpty", since=11)
def sequence_empty(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``SequenceEmpty``, opset 11."""
    return ([],)


@register("SequenceConstruct", since=11)
def sequence_construct(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``SequenceConstruct``, opset 11."""
    return (list(inputs),)


@register("SequenceAt", since=11, static_inputs=(1,))
def sequence_at(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``SequenceAt``, opset 11 (the position must be known at trace time)."""
    seq, position = inputs
    seq = _as_list(seq, ctx)
    return (seq[_position(seq, position, ctx)],)


@register("SequenceInsert", since=11, static_inputs=(2,))
def sequence_insert(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``SequenceInsert``, opset 11."""
    seq, tensor, position = (*inputs, None)[:3]
    seq = list(_as_list(seq, ctx))
    seq.insert(_position(seq, position, ctx, insert=True), tensor)
    return (seq,)


@register("SequenceErase", since=11, static_inputs=(1,))
def sequence_erase(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``SequenceErase``, opset 11."""
    seq, position = (*inputs, None)[:2]
    seq = list(_as_list(seq, ctx))
    del seq[_position(seq, position, ctx)]
    return (seq,)


@register("SequenceLength", since=11, shape_only=True)
def sequence_length(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``SequenceLength``, opset 11 (static: the length is structure)."""
    return (np.asarray(len(_as_list(inputs[0], ctx)), np.int64),)


@register("SplitToSequence", since=(11, 24), static_inputs=(1,))
def split_to_sequence(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``SplitToSequence``, opsets 11+."""
    x, split = (*inputs, None)[:2]
    axis = normalize_axis(attrs["axis"], jnp.ndim(x), ctx)
    dim = jnp.shape(x)[axis]
    if split is None:
        parts = (
            [jnp.take(x, i, axis=axis) for i in range(dim)]
            if not attrs["keepdims"]
            else (jnp.split(x, dim, axis=axis) if dim else [])
        )
        return (list(parts),)
    sizes = _split_sizes(split, dim, ctx)
    # No sizes mean no parts (an empty axis); jnp.split without bounds would give one.
    return (list(jnp.split(x, np.cumsum(sizes)[:-1], axis=axis)) if sizes else [],)


def _split_sizes(split, dim: int, ctx: OpContext) -> list[int]:
    """The part lengths: a scalar ``split`` is a chunk length, the last chunk may be shorter."""
    sizes = list(static_ints(split))
    if np.ndim(split) == 0:
        (size,) = sizes
        if size <= 0:
            raise ctx.error(f"a scalar split must be positive, got {size}")
        return [size] * (dim // size) + ([dim % size] if dim % size else [])
    if any(size < 0 for size in sizes):
        raise ctx.error(f"split sizes {sizes} must not be negative")
    if sum(sizes) != dim:
        raise ctx.error(f"split sizes {sizes} do not add up to dimension {dim}")
    return sizes


@register("ConcatFromSequence", since=11)
def concat_from_sequence(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``ConcatFromSequence``, opset 11."""
    seq = _as_list(inputs[0], ctx)
    if not seq:
        raise ctx.error("cannot concatenate an empty sequence")
    if attrs["new_axis"]:
        axis = normalize_axis(attrs["axis"], jnp.ndim(seq[0]) + 1, ctx)
        return (jnp.stack(seq, axis=axis),)
    axis = normalize_axis(attrs["axis"], jnp.ndim(seq[0]), ctx)
    return (jnp.concatenate(seq, axis=axis),)


@register("SequenceMap", since=17)
def sequence_map(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``SequenceMap``, opset 17: the body runs once per element, at trace time."""
    body = attrs["body"]
    sequences = [i for i, v in enumerate(inputs) if isinstance(v, list)]
    lengths = {len(inputs[i]) for i in sequences}
    if len(lengths) != 1:
        raise ctx.error(f"input sequences differ in length: {sorted(lengths)}")
    (n,) = lengths
    results = [[] for _ in body.outputs]
    for k in range(n):
        args = [v[k] if i in sequences else v for i, v in enumerate(inputs)]
        for acc, value in zip(results, ctx.run_graph(body, dict(zip(body.input_names, args)), iteration=k)):
            acc.append(value)
    return tuple(results)


@register("Optional", since=(15, 28))
def optional(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Optional``, opsets 15+: the value itself, or None when empty."""
    return (inputs[0] if inputs else None,)


@register("OptionalHasElement", since=(15, 18, 28), shape_only=True)
def optional_has_element(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``OptionalHasElement``, opsets 15+ (static: presence is structure)."""
    value = inputs[0] if inputs else None
    return (np.asarray(value is not None),)


@register("OptionalGetElement", since=(15, 18, 28))
def optional_get_element(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``OptionalGetElement``, opsets 15+."""
    if not inputs or inputs[0] is None:
        raise ctx.error("the optional is empty")
    return (inputs[0],)

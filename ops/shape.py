"""Tensor structure: Shape, Reshape, Constant, Identity, and the other ops that move, cut,
join or create tensors without arithmetic.

Shapes, axes and counts arrive as static (numpy) inputs, so these ops produce static shapes
under ``jit``; ``Shape`` and ``Size`` read only the input's shape and are always static.
"""

from __future__ import annotations

import numpy as np
import jax.numpy as jnp

from jonnx._registry import register
from jonnx.ops._util import index_dtype, normalize_axis, static_ints


@register("Identity", since=(1, 13, 14, 16, 19, 21, 23, 24, 25))
def identity(inputs, attrs, ctx):
    """ONNX ``Identity``, all opsets (tensors, sequences and optionals alike)."""
    return (inputs[0],)


@register("Constant", since=(1, 9, 11, 12, 13, 19, 21, 23, 24, 25))
def constant(inputs, attrs, ctx):
    """ONNX ``Constant``, all opsets: ``value`` or (opset 12+) one of the ``value_*`` forms."""
    given = {k: v for k, v in attrs.items() if v is not None}
    if len(given) != 1:
        raise ctx.error(f"needs exactly one value attribute, got {sorted(given) or 'none'}")
    (name, value), = given.items()
    if name in ("value", "sparse_value"):
        return (np.asarray(value),)
    dtypes = {"value_float": np.float32, "value_floats": np.float32, "value_int": np.int64,
              "value_ints": np.int64, "value_string": object, "value_strings": object}
    return (np.asarray(value, dtype=dtypes[name]),)


def _shape(inputs, attrs, ctx):
    """ONNX ``Shape``, all opsets (``start``/``end`` from opset 15)."""
    dims = np.asarray(jnp.shape(inputs[0]), dtype=np.int64)
    rank = dims.size
    start, end = attrs.get("start") or 0, attrs.get("end")
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = rank if end is None else min(max(end + rank if end < 0 else end, 0), rank)
    return (dims[start:end],)


register("Shape", since=(1, 13, 15, 19, 21, 23, 24, 25), shape_only=True)(_shape)


def _reshape_target(shape, data_shape, allowzero: bool, ctx):
    target = list(shape)
    if not allowzero:
        target = [data_shape[i] if d == 0 and i < len(data_shape) else d for i, d in enumerate(target)]
    if target.count(-1) > 1:
        raise ctx.error(f"shape {tuple(shape)} has more than one -1")
    if -1 in target:
        known = int(np.prod([d for d in target if d != -1]))
        total = int(np.prod(data_shape))
        if known == 0 or total % known:
            raise ctx.error(f"cannot reshape {tuple(data_shape)} into {tuple(shape)}")
        target[target.index(-1)] = total // known
    if int(np.prod(target)) != int(np.prod(data_shape)):
        raise ctx.error(f"cannot reshape {tuple(data_shape)} into {tuple(shape)}")
    return tuple(target)


@register("Reshape", since=1)
def reshape_1(inputs, attrs, ctx):
    """ONNX ``Reshape``-1: the target shape is the ``shape`` attribute."""
    (x,) = inputs[:1]
    return (jnp.reshape(x, _reshape_target(attrs["shape"] or (), jnp.shape(x), False, ctx)),)


@register("Reshape", since=(5, 13, 14, 19, 21, 23, 24, 25), static_inputs=(1,))
def reshape(inputs, attrs, ctx):
    """ONNX ``Reshape``, opsets 5+: the target shape is a static input (``allowzero`` from 14)."""
    x, shape = inputs
    target = _reshape_target(static_ints(shape), jnp.shape(x), bool(attrs.get("allowzero")), ctx)
    return (jnp.reshape(x, target),)

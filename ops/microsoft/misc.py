"""com.microsoft forms of shape and math ops: Range, ExpandDims, GatherND, Pad, Inverse.

The first four predate (or differ in small ways from) their ai.onnx versions and reuse them.
"""

from __future__ import annotations

import jax.numpy as jnp

from jonnx._registry import Attrs, Inputs, OpContext, Outputs, register
from jonnx.ops._util import compute_type, static_ints
from jonnx.ops.indexing import gather_nd_11
from jonnx.ops.microsoft._common import DOMAIN
from jonnx.ops.shape import pad, range_


@register("Range", since=1, domain=DOMAIN, static_inputs=(0, 1, 2), attributes={}, n_inputs=3)
def range_ms(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """com.microsoft ``Range``: the default domain's Range, with ``delta`` optional (default 1)."""
    start, limit, delta = inputs
    return range_((start, limit, 1 if delta is None else delta), attrs, ctx)


register("GatherND", since=1, domain=DOMAIN, attributes={}, n_inputs=2)(gather_nd_11)


@register(
    "Pad",
    since=1,
    domain=DOMAIN,
    static_inputs=(1,),
    attributes={"mode": "constant"},
    n_inputs=3,
)
def pad_ms(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """com.microsoft ``Pad``: the default domain's Pad-11 (``pads`` input, optional ``value``)."""
    data, pads, value = inputs
    return pad((data, pads, value, None), attrs, ctx)


@register("ExpandDims", since=1, domain=DOMAIN, static_inputs=(1,), attributes={}, n_inputs=2)
def expand_dims(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """com.microsoft ``ExpandDims``: insert a size-1 axis at ``axis`` (negative counts from the end)."""
    x, axis = inputs
    (axis,) = static_ints(axis)
    rank = jnp.ndim(x) + 1
    if not -rank <= axis < rank:
        raise ctx.error(f"axis {axis} is out of range for the output's rank {rank}")
    return (jnp.expand_dims(x, axis % rank),)


@register("Inverse", since=1, domain=DOMAIN, attributes={}, n_inputs=1)
def inverse(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """com.microsoft ``Inverse``: the inverse of each trailing square matrix."""
    (x,) = inputs
    dtype = jnp.result_type(x)
    wide = compute_type(dtype)
    return (jnp.linalg.inv(jnp.asarray(x).astype(wide)).astype(dtype),)

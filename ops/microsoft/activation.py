"""Gelu, BiasGelu, FastGelu, QuickGelu, BiasAdd and BiasSplitGelu.

Gelu and BiasGelu are exact (erf); FastGelu is the tanh approximation onnxruntime documents,
``0.5 x (1 + tanh(0.7978845608 (x + 0.044715 x^3)))``. Half types are computed in float32, bias
included, and rounded once, as onnxruntime does (step by step in float16, half the outputs were
a unit in the last place off).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from jonnx._registry import Attrs, Inputs, OpContext, Outputs, register
from jonnx.ops._util import dtype_of, widen_halves
from jonnx.ops.microsoft._common import DOMAIN


def _gelu(x):
    return 0.5 * x * (1 + lax.erf(x * (1 / math.sqrt(2))))


def _fast_gelu(x):
    inner = math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)
    return 0.5 * x * (1 + jnp.tanh(inner))


@register("Gelu", since=1, domain=DOMAIN, attributes={}, n_inputs=1)
def gelu(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """com.microsoft ``Gelu``: exact, ``0.5 x (1 + erf(x / sqrt 2))``."""
    (x,) = inputs
    return (_gelu(widen_halves(x)[0]).astype(dtype_of(x)),)


@register("BiasGelu", since=1, domain=DOMAIN, attributes={}, n_inputs=2)
def bias_gelu(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """com.microsoft ``BiasGelu``: exact Gelu of ``A + B`` (B broadcasts over the last axis)."""
    a, b = inputs
    wide_a, wide_b = widen_halves(a, b)
    return (_gelu(wide_a + wide_b).astype(dtype_of(a)),)


@register("FastGelu", since=1, domain=DOMAIN, attributes={}, n_inputs=2)
def fast_gelu(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """com.microsoft ``FastGelu``: the tanh approximation of Gelu of ``X (+ bias)``."""
    x, bias = inputs
    dtype = dtype_of(x)
    x, bias = widen_halves(x, bias)
    if bias is not None:
        x = x + bias
    return (_fast_gelu(x).astype(dtype),)


@register("QuickGelu", since=1, domain=DOMAIN, attributes={"alpha": 1.702}, n_inputs=1)
def quick_gelu(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """com.microsoft ``QuickGelu``: ``x * sigmoid(alpha * x)``."""
    (x,) = inputs
    dtype = dtype_of(x)
    (x,) = widen_halves(x)
    alpha = jnp.asarray(attrs["alpha"], dtype_of(x))
    return ((x * jax.nn.sigmoid(alpha * x)).astype(dtype),)


@register("BiasAdd", since=1, domain=DOMAIN, attributes={}, n_inputs=3)
def bias_add(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """com.microsoft ``BiasAdd``: ``X + bias + skip`` (X, skip: (N, S, C); bias: (C,))."""
    x, bias, skip = inputs
    wide = widen_halves(x, bias, skip)
    return ((wide[0] + wide[1] + wide[2]).astype(dtype_of(x)),)


@register("BiasSplitGelu", since=1, domain=DOMAIN, attributes={}, n_inputs=2)
def bias_split_gelu(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """com.microsoft ``BiasSplitGelu``: ``left * Gelu(right)`` of the halves of ``X + bias``."""
    x, bias = inputs
    wide_x, wide_bias = widen_halves(x, bias)
    s = wide_x + wide_bias
    half = jnp.shape(s)[-1] // 2
    if jnp.shape(s)[-1] % 2:
        raise ctx.error(f"the last dimension of X ({jnp.shape(s)[-1]}) must be even")
    return ((s[..., :half] * _gelu(s[..., half:])).astype(dtype_of(x)),)

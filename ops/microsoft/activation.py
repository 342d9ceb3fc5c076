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
from jonnx.ops._util import dtype_of, half_in_float32
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
    return (half_in_float32(_gelu)(x),)


# Each op's whole computation, bias included, for ``half_in_float32``: the first input widens
# and the others meet it in float32.
def _biased_gelu(a, b):
    return _gelu(a + b)


def _biased_fast_gelu(x, bias):
    return _fast_gelu(x if bias is None else x + bias)


def _bias_add(x, bias, skip):
    return x + bias + skip


def _split_gelu(x, bias):
    s = x + bias
    half = jnp.shape(s)[-1] // 2
    return s[..., :half] * _gelu(s[..., half:])


@register("BiasGelu", since=1, domain=DOMAIN, attributes={}, n_inputs=2)
def bias_gelu(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """com.microsoft ``BiasGelu``: exact Gelu of ``A + B`` (B broadcasts over the last axis)."""
    return (half_in_float32(_biased_gelu)(*inputs),)


@register("FastGelu", since=1, domain=DOMAIN, attributes={}, n_inputs=2)
def fast_gelu(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """com.microsoft ``FastGelu``: the tanh approximation of Gelu of ``X (+ bias)``."""
    return (half_in_float32(_biased_fast_gelu)(*inputs),)


@register("QuickGelu", since=1, domain=DOMAIN, attributes={"alpha": 1.702}, n_inputs=1)
def quick_gelu(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """com.microsoft ``QuickGelu``: ``x * sigmoid(alpha * x)``."""
    (x,) = inputs

    def quick(x):
        return x * jax.nn.sigmoid(jnp.asarray(attrs["alpha"], dtype_of(x)) * x)

    return (half_in_float32(quick)(x),)


@register("BiasAdd", since=1, domain=DOMAIN, attributes={}, n_inputs=3)
def bias_add(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """com.microsoft ``BiasAdd``: ``X + bias + skip`` (X, skip: (N, S, C); bias: (C,))."""
    return (half_in_float32(_bias_add)(*inputs),)


@register("BiasSplitGelu", since=1, domain=DOMAIN, attributes={}, n_inputs=2)
def bias_split_gelu(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """com.microsoft ``BiasSplitGelu``: ``left * Gelu(right)`` of the halves of ``X + bias``."""
    x, bias = inputs
    if jnp.shape(x)[-1] % 2:
        raise ctx.error(f"the last dimension of X ({jnp.shape(x)[-1]}) must be even")
    return (half_in_float32(_split_gelu)(x, bias),)

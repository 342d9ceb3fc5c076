"""Random ops: RandomNormal, RandomUniform, their *Like forms, Bernoulli, Multinomial.

Every draw comes from ``ctx.rng()``, the caller's key folded with the node's position, so
``Model.apply(..., key=k)`` is reproducible for a given ``k`` and different keys give
different draws; without a key these ops raise :class:`jonnx.errors.NodeError`.

The ``seed`` attribute is ignored: its meaning is tied to a runtime's own generator (the onnx
reference draws from numpy's bitstream, onnxruntime from its own), which a JAX key cannot
reproduce. jonnx takes randomness only from the caller's key, never a fixed seed, so outputs
match other runtimes in distribution, not bit for bit.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jonnx._registry import Attrs, Inputs, OpContext, Outputs, register
from jonnx.ops._util import canonical, onnx_dtype, static_ints


def _float_dtype(dtype, ctx) -> np.dtype:
    if not jnp.issubdtype(dtype, jnp.floating):
        raise ctx.error(f"output dtype must be a floating type, got {np.dtype(dtype).name}")
    return dtype


def _like_dtype(x, attrs, ctx) -> np.dtype:
    if attrs["dtype"] is not None:
        return _float_dtype(onnx_dtype(attrs["dtype"]), ctx)
    return _float_dtype(canonical(x.dtype), ctx)


def _normal(shape, dtype, attrs, ctx):
    z = jax.random.normal(ctx.rng(), shape, dtype)
    return (z * jnp.asarray(attrs["scale"], dtype) + jnp.asarray(attrs["mean"], dtype),)


def _uniform(shape, dtype, attrs, ctx):
    low, high = attrs["low"], attrs["high"]
    return (jax.random.uniform(ctx.rng(), shape, dtype, minval=low, maxval=high),)


@register("RandomNormal", since=(1, 22), random=True)
def random_normal(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``RandomNormal``, all opsets; ``seed`` is ignored (see the module docstring)."""
    dtype = _float_dtype(onnx_dtype(attrs["dtype"]), ctx)
    return _normal(static_ints(attrs["shape"]), dtype, attrs, ctx)


@register("RandomUniform", since=(1, 22), random=True)
def random_uniform(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``RandomUniform``, all opsets; ``seed`` is ignored (see the module docstring)."""
    dtype = _float_dtype(onnx_dtype(attrs["dtype"]), ctx)
    return _uniform(static_ints(attrs["shape"]), dtype, attrs, ctx)


@register("RandomNormalLike", since=(1, 22), random=True)
def random_normal_like(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``RandomNormalLike``, all opsets; ``seed`` is ignored (see the module docstring)."""
    (x,) = inputs
    return _normal(jnp.shape(x), _like_dtype(x, attrs, ctx), attrs, ctx)


@register("RandomUniformLike", since=(1, 22), random=True)
def random_uniform_like(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``RandomUniformLike``, all opsets; ``seed`` is ignored (see the module docstring)."""
    (x,) = inputs
    return _uniform(jnp.shape(x), _like_dtype(x, attrs, ctx), attrs, ctx)


@register("Bernoulli", since=(15, 22), random=True)
def bernoulli(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Bernoulli``, all opsets; ``seed`` is ignored (see the module docstring)."""
    (p,) = inputs
    dtype = canonical(p.dtype) if attrs["dtype"] is None else onnx_dtype(attrs["dtype"])
    u = jax.random.uniform(ctx.rng(), jnp.shape(p), canonical(p.dtype))
    return ((u < p).astype(dtype),)


@register("Multinomial", since=(7, 22), random=True)
def multinomial(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Multinomial``, all opsets; ``seed`` is ignored (see the module docstring).

    The input holds unnormalized log-probabilities, shape ``(batch, classes)``; the output
    holds ``sample_size`` class indices per batch row.
    """
    (logits,) = inputs
    if jnp.ndim(logits) != 2:
        raise ctx.error(f"input must have shape (batch, classes), got {jnp.shape(logits)}")
    dtype = onnx_dtype(attrs["dtype"])
    if not jnp.issubdtype(dtype, jnp.integer):
        raise ctx.error(f"dtype must be int32 or int64, got {dtype.name}")
    n = int(attrs["sample_size"])
    if n < 1:
        raise ctx.error(f"sample_size must be positive, got {n}")
    batch = jnp.shape(logits)[0]
    draws = jax.random.categorical(ctx.rng(), jnp.asarray(logits), axis=-1, shape=(n, batch))
    return (jnp.transpose(draws).astype(dtype),)

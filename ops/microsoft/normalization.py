"""LayerNormalization (before opset 17), SimplifiedLayerNormalization, SkipLayerNormalization,
SkipSimplifiedLayerNormalization and EmbedLayerNormalization.

The Skip* ops add the residual (and an optional bias) before normalising over the last axis,
and return that sum as their fourth output (``input_skip_bias_sum``), which the next block's
residual reads. Statistics are computed in float32 at least, as onnxruntime does for float16.
"""

from __future__ import annotations

import jax.numpy as jnp

from jonnx._registry import Attrs, Inputs, OpContext, Outputs, register
from jonnx.ops._util import compute_type, dtype_of, normalize_axis, widen_halves
from jonnx.ops.microsoft._common import DOMAIN
from jonnx.ops.normalization import (
    centre,
    layer_normalization,
    rsqrt_eps,
    stash_dtype,
)

# onnxruntime registers its LayerNormalization contrib op in the default domain from opset 1,
# with the semantics onnx adopted in opset 17: the same body serves both.
register(
    "LayerNormalization",
    since=1,
    attributes={"axis": -1, "epsilon": 1e-5, "stash_type": 1},
    n_inputs=3,
)(layer_normalization)


def _rms_norm(x, axis: int, epsilon: float, stash_dtype):
    """``x / sqrt(mean(x**2) + eps)`` over the axes from ``axis`` on, and the inverse RMS."""
    xs = x.astype(stash_dtype)
    axes = tuple(range(axis, jnp.ndim(x)))
    inv = rsqrt_eps(jnp.mean(xs * xs, axis=axes, keepdims=True), epsilon)
    return xs * inv, inv


def _layer_norm(x, epsilon: float, stash_dtype):
    """Normalise over the last axis; returns the normalised value, mean and inverse std."""
    xs = x.astype(stash_dtype)
    centred, mean, var = centre(xs, (jnp.ndim(x) - 1,))
    inv = rsqrt_eps(var, epsilon)
    return centred * inv, mean, inv


@register(
    "SimplifiedLayerNormalization",
    since=1,
    attributes={"axis": -1, "epsilon": 1e-5, "stash_type": 1},
    n_inputs=2,
)
def simplified_layer_normalization(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """onnxruntime ``SimplifiedLayerNormalization`` (RMS norm; default domain, as files carry it)."""
    x, scale = inputs
    axis = normalize_axis(attrs["axis"], jnp.ndim(x), ctx)
    normed, inv = _rms_norm(x, axis, attrs["epsilon"], stash_dtype(x, attrs["stash_type"]))
    return (normed * widen_halves(scale)[0]).astype(dtype_of(x)), inv


def _skip_sum(x, skip, bias, ctx):
    if jnp.ndim(x) != 3 or jnp.shape(x)[-1] != jnp.shape(skip)[-1]:
        raise ctx.error(
            f"input must be (batch, sequence, hidden) and skip must end in hidden; got {jnp.shape(x)} "
            f"and {jnp.shape(skip)}"
        )
    # Half types: summed in float32 (as onnxruntime), normalised from that sum, rounded once.
    x, skip, bias = widen_halves(x, skip, bias)
    s = x + skip
    return s if bias is None else s + bias


@register(
    "SkipLayerNormalization",
    since=1,
    domain=DOMAIN,
    attributes={"epsilon": 1e-12},
    n_inputs=5,
)
def skip_layer_normalization(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """com.microsoft ``SkipLayerNormalization``: ``LayerNorm(input + skip + bias) * gamma + beta``."""
    x, skip, gamma, beta, bias = inputs
    s = _skip_sum(x, skip, bias, ctx)
    normed, mean, inv = _layer_norm(s, attrs["epsilon"], compute_type(dtype_of(s)))
    gamma, beta = widen_halves(gamma, beta)
    y = normed * gamma
    if beta is not None:
        y = y + beta
    return y.astype(dtype_of(x)), mean, inv, s.astype(dtype_of(x))


@register(
    "SkipSimplifiedLayerNormalization",
    since=1,
    domain=DOMAIN,
    attributes={"epsilon": 1e-12},
    n_inputs=4,
)
def skip_simplified_layer_normalization(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """com.microsoft ``SkipSimplifiedLayerNormalization``: ``RMSNorm(input + skip + bias) * gamma``."""
    x, skip, gamma, bias = inputs
    s = _skip_sum(x, skip, bias, ctx)
    normed, inv = _rms_norm(s, jnp.ndim(s) - 1, attrs["epsilon"], compute_type(dtype_of(s)))
    y = normed * widen_halves(gamma)[0]
    return y.astype(dtype_of(x)), jnp.zeros_like(inv), inv, s.astype(dtype_of(x))


@register(
    "EmbedLayerNormalization",
    since=1,
    domain=DOMAIN,
    attributes={"epsilon": 1e-12, "mask_index_type": 1},
    n_inputs=9,
)
def embed_layer_normalization(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """com.microsoft ``EmbedLayerNormalization``: BERT's word + position + segment embeddings,
    layer-normalised; ``mask_index`` is each row's count of ones in ``mask`` (0 without one)."""
    ids, segment_ids, word, position, segment, gamma, beta, mask, position_ids = inputs
    if jnp.ndim(ids) != 2:
        raise ctx.error(f"input_ids must be (batch, sequence), got shape {jnp.shape(ids)}")
    batch, seq = jnp.shape(ids)
    if position_ids is None:
        position_ids = jnp.arange(seq)[None, :]
    dtype = dtype_of(word)
    # Half types: summed, normalised and scaled in float32, rounded once (as onnxruntime).
    word, position, segment, gamma, beta = widen_halves(word, position, segment, gamma, beta)
    total = jnp.take(word, ids, axis=0) + jnp.take(position, position_ids, axis=0)
    if segment is not None and segment_ids is not None:
        total = total + jnp.take(segment, segment_ids, axis=0)
    normed, _, _ = _layer_norm(total, attrs["epsilon"], compute_type(dtype_of(total)))
    y = (normed * gamma + beta).astype(dtype)
    if mask is None:
        mask_index = jnp.zeros((batch,), jnp.int32)
    else:
        mask_index = jnp.sum(jnp.asarray(mask) != 0, axis=1).astype(jnp.int32)
    return y, mask_index, total.astype(dtype)

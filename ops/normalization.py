"""Normalization: BatchNormalization, InstanceNormalization, LayerNormalization,
GroupNormalization, LpNormalization, MeanVarianceNormalization, RMSNormalization, LRN, and
Dropout.

Training behaviour follows the node (BatchNormalization's ``training_mode``, Dropout's
``training_mode`` input, the opset 1-6 ``is_test=0``) unless the run's train flag
(``ctx.train``) is set, which switches the whole model to training (True) or inference
(False), so a model exported in eval mode can be trained and one exported for training can
be evaluated:

* BatchNormalization normalises with the batch's mean and population variance and returns
  running statistics updated by ONNX's rule ``running * momentum + batch * (1 - momentum)``
  (PyTorch's ``momentum`` is ``1 -`` this one), held under ``stop_gradient``.
* Dropout draws its mask from the node's PRNG key (``ctx.rng()``) and scales kept values by
  ``1 / (1 - ratio)``. The ``seed`` attribute is ignored: randomness always comes from the
  caller's key.

Ops with ``stash_type`` compute their statistics in that type or in the input's own, whichever
is wider: float16/bfloat16 inputs are normalised in float32 as the spec says, and float64
inputs keep float64 rather than being narrowed. Every normalization of a float16 or bfloat16
input computes in float32, scale and bias included, and rounds once at the end, as onnxruntime
does (the function bodies of LayerNormalization, GroupNormalization and RMSNormalization cast
back to the input's type before the scale: a rounding more). Step by step in the half type the
results were 1-4 units in the last place off onnxruntime's in most cases the fuzzer drew.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jonnx._registry import Attrs, Inputs, OpContext, Outputs, register
from jonnx._values import is_concrete
from jonnx.ops._util import compute_type, dtype_of, normalize_axes, normalize_axis, onnx_dtype, widen_halves


def rsqrt_eps(v, eps):
    return lax.rsqrt(v + np.asarray(eps, dtype_of(v)))


def stash_dtype(x, stash_type) -> np.dtype:
    """The dtype statistics are computed in: ``stash_type``, widened to ``x``'s if wider."""
    stash = onnx_dtype(stash_type) if stash_type is not None else dtype_of(x)
    return np.dtype(jnp.promote_types(stash, dtype_of(x)))


def centre(x, axes):
    """``(x - mean, mean, var)``: ``x`` centred on its mean over ``axes``, the mean, and the
    population variance (the statistics kept as size-1 dims), summed around a pivot from each
    row. With ``p`` the row's first value (at index 0 of every reduced axis, under
    ``stop_gradient``: nothing depends on it) and ``s = mean(x - p)``, the mean is ``p + s``
    rounded, ``low = s - (mean - p)`` is what that rounding lost (exact where ``|s| <= |p|``:
    Fast2Sum), the centred values are ``(x - mean) - low``, and the variance the mean of their
    squares.

    XLA sums a row in order in float32 (onnxruntime in double), so a plain ``mean(x)`` is off
    by the sum's rounding where a row's mean dwarfs its spread: 16 equal values of 45865.05 gave
    a mean 0.0078 off, and the row normalized to about +-1 instead of 0 (eps 1e-5). Around the
    pivot the sum adds small numbers; and centring on the mean alone, rounded to ``x``'s type,
    moved rows of values near 3e6 a quarter apart by up to 0.18 (``low`` puts that back; a row
    of equal values centres to 0). Written as ``(x - p) - s`` instead, XLA recomputed a
    residual sum before a LayerNorm in each pass rather than storing it once (the BERT encoder
    at batch 32 1.06-1.13x slower); this form keeps the fusions of ``x - mean``. Against the
    mean corrected in a further pass (one complex sum of ``c + i c**2``, until 2026-12-07) a
    BERT fine-tuning step takes 0.96 of the time and the encoder at batch 32 0.98."""
    rank = jnp.ndim(x)
    axes = tuple(a % rank for a in axes)
    if all(jnp.shape(x)[a] for a in axes):
        pivot = lax.stop_gradient(x[tuple(slice(0, 1) if a in axes else slice(None) for a in range(rank))])
    else:  # an empty row has no first value (and a mean of NaN)
        pivot = jnp.zeros((), dtype_of(x))
    shift = jnp.mean(x - pivot, axis=axes, keepdims=True)
    mean = pivot + shift
    low = shift - (mean - pivot)  # what rounding the mean lost
    centred = (x - mean) - low
    return centred, mean, jnp.mean(centred * centred, axis=axes, keepdims=True)


def corrected_moments(x, axes):
    """``(mean, shift, var)`` over ``axes`` (kept): BatchNormalization's training statistics,
    over the batch and the maps, where the batch mean is ``mean + shift``, the centred values
    ``(x - mean) - shift`` and ``var`` the population variance around that mean.

    ``mean`` is a plain reduction (which YNNPACK runs: :func:`centre`'s pivot made a ResNet-18
    training step 1.03-1.06x slower, the complex sum of ``c + i c**2`` 1.05x); then one pass over
    ``c = x - mean`` sums both ``c``, giving ``shift``, what the plain mean's rounding lost, and
    ``c * c``, from which ``shift**2`` is taken. Where a channel's mean dwarfs its spread the
    plain mean alone is off by its sum's rounding: a channel of equal values of 45865.05
    normalized to 1.17 off its bias, one of values near 1e4 of unit spread 5e-4 off float64;
    with the shift both are within 5e-7. The second sum measured within noise: a ResNet-18
    training step 0.995-1.016 of the time, a MobileNetV2 step 1.003-1.069 (docs/known_issues.md)."""
    mean = jnp.mean(x, axis=axes, keepdims=True)
    centred = x - mean
    shift = jnp.mean(centred, axis=axes, keepdims=True)
    var = jnp.mean(centred * centred, axis=axes, keepdims=True) - shift * shift
    return mean, shift, jnp.maximum(var, 0)  # a channel of equal values: 0, not a rounding below


# --------------------------------------------------------------------------------------------
# BatchNormalization


# ``channels_last``: ``x`` is (N, D1, ..., C) instead of (N, C, D1, ...) (the internal
# channels-last BatchNormalization of ops/channels_last.py); per-channel vectors are the same.


def _bn_param(p, x, spatial: bool, channels_last: bool = False):
    """A per-channel parameter shaped to broadcast against ``x`` (N, C, D1, ...)."""
    rank = jnp.ndim(x)
    if channels_last:
        return jnp.reshape(p, (-1,))
    if spatial or jnp.ndim(p) == 1:
        return jnp.reshape(p, (-1,) + (1,) * (rank - 2))
    return p  # spatial=0: per-activation parameters of shape (C, D1, ..., Dn)


def _bn_axes(x, spatial: bool, channels_last: bool = False) -> tuple[int, ...]:
    rank = jnp.ndim(x)
    if channels_last:
        return tuple(range(rank - 1))
    return (0,) + tuple(range(2, rank)) if spatial else (0,)


def _bn_inference(x, scale, bias, mean, var, eps, spatial=True, channels_last=False):
    dtype = dtype_of(x)
    x, scale, bias, mean, var = widen_halves(x, scale, bias, mean, var)
    s, b, m, v = (_bn_param(p, x, spatial, channels_last) for p in (scale, bias, mean, var))
    # One gain per channel, then a subtraction and a multiply-add per element: written as
    # (x - m) * rsqrt(v + eps) * s + b, XLA's fused loop redid the per-channel work for every
    # element (ResNet-50 batch 1: 277 against 228 ms, MobileNetV2 38 against 25 ms). Centred
    # before the gain, not folded into x * a + (b - m * a): where the mean dwarfs the spread
    # the folded form cancels two large products (a channel of equal values at its running
    # mean gave 0.04 for a bias of 0.25).
    a = rsqrt_eps(v, eps) * s
    y = (x - m) * a + b
    return y.astype(dtype)


def _bn_batch_stats(x, spatial: bool, channels_last: bool = False):
    """The batch's ``(mean, shift, var)`` (:func:`corrected_moments`: the batch mean is
    ``mean + shift``), each shaped like the running statistics.

    Plain reductions. Until 2026-11-29 these were products with ones on CPU, for XLA's own
    reductions, slow where the kept axis is minor (as XLA's convolutions leave their outputs).
    With YNNPACK's reductions (which ``jonnx.jit`` picks where they are safe, as for the
    benchmarked training steps) plain ones are as fast there (ResNet-18's step 0.98-0.99 of the
    time; with XLA's own reductions 1.005), avoid the transposed copy a product made of
    activations held NCHW (MobileNetV2's step 0.92) and are more accurate (the mean of
    16 x 112 x 112 values in float32: 1.3e-7 against 1.9e-5). docs/performance.md.
    """
    stats = corrected_moments(x, _bn_axes(x, spatial, channels_last))
    shape = (-1,) if spatial else jnp.shape(stats[0])[1:]
    return tuple(jnp.reshape(s, shape) for s in stats)


def _bn_normalize(x, scale, bias, eps, spatial: bool, channels_last: bool = False):
    """``(y, batch_mean, batch_var)`` of training-mode BatchNormalization, with a derivative
    that costs two reductions.

    Differentiating the normalization op by op (mean, centring, variance, rsqrt, affine) makes
    XLA reduce over the whole activation about five times per layer in the backward pass (104
    reduction fusions in a ResNet-18 step). This ``custom_jvp`` gives the tangent in closed
    form, arranged so that its transpose (the gradient) reduces only ``sum(g)`` and
    ``sum(g * xhat)``, which the scale and bias gradients share (37 fusions); the values are
    those of the formula (:func:`corrected_moments`), not of its derivative.
    """

    def param(p):
        return _bn_param(p, x, spatial, channels_last)

    @jax.custom_jvp
    def normalize(x, scale, bias):
        mean, shift, var = _bn_batch_stats(x, spatial, channels_last)
        # As _bn_inference, with the values centred on the plain mean and then by the shift:
        # close to the mean ``x - mean`` is exact and the shift small, so the rounding of
        # ``mean + shift`` to float32 (up to 0.125 near 3e6) does not reach ``y``.
        a = rsqrt_eps(param(var), eps) * param(scale)
        y = ((x - param(mean)) - param(shift)) * a + param(bias)
        return y, mean + shift, var

    @normalize.defjvp
    def normalize_jvp(primals, tangents):
        (x, scale, bias), (tx, t_scale, t_bias) = primals, tangents
        y, batch_mean, batch_var = normalize(x, scale, bias)
        axes = _bn_axes(x, spatial, channels_last)
        inv_std = rsqrt_eps(param(batch_var), eps)
        xhat = (x - param(batch_mean)) * inv_std
        gain = param(scale) * inv_std  # per channel (per activation if not spatial)
        t_mean = jnp.mean(tx, axis=axes, keepdims=True)
        t_cov = jnp.mean(xhat * tx, axis=axes, keepdims=True)
        # d xhat = inv_std * (dx - mean(dx) - xhat * mean(xhat * dx)); the per-channel terms
        # are combined before they meet the activation, so that the transpose reduces the
        # cotangent once for the bias-like terms and once (times xhat) for the scale-like ones.
        t_y = gain * tx + xhat * (param(t_scale) - gain * t_cov) + (param(t_bias) - gain * t_mean)
        # d var = 2 mean((x - mean) dx) = 2 mean(xhat * dx) / inv_std.
        t_batch_var = 2 * t_cov / inv_std
        return (y, batch_mean, batch_var), (
            t_y.astype(dtype_of(y)),
            jnp.reshape(t_mean, jnp.shape(batch_mean)).astype(dtype_of(batch_mean)),
            jnp.reshape(t_batch_var, jnp.shape(batch_var)).astype(dtype_of(batch_var)),
        )

    return normalize(x, scale, bias)


def _bn_training(x, scale, bias, running_mean, running_var, momentum, eps, spatial=True, channels_last=False):
    """Training-mode BatchNormalization: ``(y, new_running_mean, new_running_var)``.

    ``y`` uses the batch statistics (population variance); the running statistics follow
    ONNX's momentum rule and carry no gradient. A half-precision running statistic is updated
    in float32 from the float32 batch statistic and rounded once, as onnxruntime does (in
    float16 step by step, 1-2 units in the last place off).
    """
    dtype = dtype_of(x)
    x, scale, bias = widen_halves(x, scale, bias)
    y, batch_mean, batch_var = _bn_normalize(x, scale, bias, eps, spatial, channels_last)
    y = y.astype(dtype)

    def update(running, batch):
        wide = jnp.promote_types(compute_type(dtype_of(running)), dtype_of(batch))
        new = running.astype(wide) * momentum + batch.astype(wide) * (1 - momentum)
        return lax.stop_gradient(new.astype(dtype_of(running)))

    return y, update(running_mean, batch_mean), update(running_var, batch_var)


def _bn_legacy(inputs, attrs, training: bool, spatial: bool, channels_last: bool = False):
    """Opsets 1-9: five outputs in training (Y, mean, var, saved_mean, saved_var)."""
    x, scale, bias, mean, var = inputs
    eps, momentum = attrs["epsilon"], attrs["momentum"]
    if not training:
        # Only Y is defined in test mode; the statistics pass through for graphs that list more.
        return (_bn_inference(x, scale, bias, mean, var, eps, spatial, channels_last), mean, var, mean, var)
    y, new_mean, new_var = _bn_training(x, scale, bias, mean, var, momentum, eps, spatial, channels_last)
    mean, shift, saved_var = _bn_batch_stats(widen_halves(x)[0], spatial, channels_last)
    saved_mean = mean + shift
    return y, new_mean, new_var, saved_mean.astype(dtype_of(x)), saved_var.astype(dtype_of(x))


_RUNNING_STATS = {1: 3, 2: 4}  # outputs 1 and 2 are the new running mean and variance


def lists_statistics(n_outputs: int | None) -> bool:
    """BatchNormalization-7/9's mode: training when the node lists more outputs than ``Y``.

    The spec ties the mode to the output count (five in training, ``Y`` alone in test mode),
    and onnxruntime runs a five-output node on batch statistics.
    """
    return (n_outputs or 1) > 1


@register(
    "BatchNormalization",
    since=(1, 6),
    state_updates=_RUNNING_STATS,
    trains=lambda attrs, n_outputs: not attrs["is_test"],
)
def batch_normalization_1(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``BatchNormalization``-1/6: ``is_test=0`` (the default) is training mode.

    ``saved_var`` is the batch variance; ``consumed_inputs`` is ignored.
    """
    training = ctx.training(not attrs["is_test"])
    return _bn_legacy(inputs, attrs, training, bool(attrs["spatial"]))


@register(
    "BatchNormalization",
    since=7,
    state_updates=_RUNNING_STATS,
    trains=lambda attrs, n_outputs: lists_statistics(n_outputs),
)
def batch_normalization_7(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``BatchNormalization``-7: training mode when the node lists five outputs."""
    return _bn_legacy(inputs, attrs, ctx.training(lists_statistics(ctx.n_outputs)), bool(attrs["spatial"]))


@register(
    "BatchNormalization",
    since=9,
    state_updates=_RUNNING_STATS,
    trains=lambda attrs, n_outputs: lists_statistics(n_outputs),
)
def batch_normalization_9(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``BatchNormalization``-9: per-channel statistics; training mode with five outputs."""
    return _bn_legacy(inputs, attrs, ctx.training(lists_statistics(ctx.n_outputs)), True)


@register(
    "BatchNormalization",
    since=(14, 15),
    state_updates=_RUNNING_STATS,
    trains=lambda attrs, n_outputs: bool(attrs["training_mode"]),
)
def batch_normalization(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``BatchNormalization``, opsets 14+: ``training_mode`` attribute or ``train``.

    In training mode, outputs 1 and 2 (the updated running statistics) are returned even
    when the node (exported in eval mode) does not list them. In inference mode a node
    exported in training mode (three outputs) passes its running statistics through as
    outputs 1 and 2: unchanged, as no batch updated them.
    """
    x, scale, bias, mean, var = inputs
    eps, momentum = attrs["epsilon"], attrs["momentum"]
    if ctx.training(bool(attrs["training_mode"])):
        return _bn_training(x, scale, bias, mean, var, momentum, eps)
    return (_bn_inference(x, scale, bias, mean, var, eps), mean, var)


# --------------------------------------------------------------------------------------------
# Instance, layer, group, RMS, Lp and mean-variance normalization


def instance_norm_core(x, scale, bias, eps, ctx, channels_last: bool = False):
    """InstanceNormalization of ``x`` (N, C, D1, ...), or (N, D1, ..., C) with ``channels_last``."""
    rank = jnp.ndim(x)
    if rank < 3:
        raise ctx.error(f"input must have rank >= 3 (N, C, D1, ...), got rank {rank}")
    dtype = dtype_of(x)
    x, scale, bias = widen_halves(x, scale, bias)
    centred, _, var = centre(x, tuple(range(1, rank - 1)) if channels_last else tuple(range(2, rank)))
    y = centred * rsqrt_eps(var, eps)
    shape = (-1,) if channels_last else (-1,) + (1,) * (rank - 2)
    return (y * jnp.reshape(scale, shape) + jnp.reshape(bias, shape)).astype(dtype)


@register("InstanceNormalization", since=(1, 6, 22))
def instance_normalization(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``InstanceNormalization``, all opsets (``consumed_inputs`` of opset 1 ignored)."""
    x, scale, bias = inputs
    return (instance_norm_core(x, scale, bias, attrs["epsilon"], ctx),)


@register("LayerNormalization", since=17)
def layer_normalization(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``LayerNormalization``-17, with the optional ``Mean`` and ``InvStdDev`` outputs."""
    x, scale, bias = inputs
    rank = jnp.ndim(x)
    axis = normalize_axis(attrs["axis"], rank, ctx)
    dtype = dtype_of(x)
    xs = x.astype(stash_dtype(x, attrs["stash_type"]))
    centred, mean, var = centre(xs, tuple(range(axis, rank)))
    inv_std = rsqrt_eps(var, attrs["epsilon"])
    scale, bias = widen_halves(scale, bias)
    y = centred * inv_std * scale
    if bias is not None:
        y = y + bias
    stats_dtype = onnx_dtype(attrs["stash_type"])
    return y.astype(dtype), mean.astype(stats_dtype), inv_std.astype(stats_dtype)


def _group_norm(x, scale, bias, attrs, ctx, per_channel: bool):
    num_groups = attrs["num_groups"]
    if num_groups is None:
        raise ctx.error("the num_groups attribute is required")
    shape = jnp.shape(x)
    if len(shape) < 2:
        raise ctx.error(f"input must have rank >= 2 (N, C, ...), got shape {shape}")
    n, c = shape[:2]
    if num_groups <= 0 or c % num_groups:
        raise ctx.error(f"num_groups={num_groups} does not divide the {c} channels")
    dtype = dtype_of(x)
    xs = x.astype(stash_dtype(x, attrs.get("stash_type")))
    # Spelled out, not -1: an empty batch leaves -1 nothing to divide.
    grouped = jnp.reshape(xs, (n, num_groups, math.prod(shape[1:]) // num_groups))
    centred, _, var = centre(grouped, (2,))
    normed = centred * rsqrt_eps(var, attrs["epsilon"])
    scale, bias = widen_halves(scale, bias)
    trailing = (1,) * (len(shape) - 2)
    if per_channel:
        normed = jnp.reshape(normed, shape)
        y = normed * jnp.reshape(scale, (-1,) + trailing) + jnp.reshape(bias, (-1,) + trailing)
    else:
        # Opset 18: one scale and bias per group, shared by that group's channels.
        y = normed * jnp.reshape(scale, (-1, 1)) + jnp.reshape(bias, (-1, 1))
        y = jnp.reshape(y, shape)
    return (y.astype(dtype),)


@register("GroupNormalization", since=18)
def group_normalization_18(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``GroupNormalization``-18: ``scale`` and ``bias`` have one entry per group."""
    x, scale, bias = inputs
    return _group_norm(x, scale, bias, attrs, ctx, per_channel=False)


@register("GroupNormalization", since=21)
def group_normalization_21(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``GroupNormalization``-21: per-channel ``scale``/``bias``, ``stash_type``."""
    x, scale, bias = inputs
    return _group_norm(x, scale, bias, attrs, ctx, per_channel=True)


@register("RMSNormalization", since=23)
def rms_normalization(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``RMSNormalization``-23: the output takes ``scale``'s type."""
    x, scale = inputs
    rank = jnp.ndim(x)
    axis = normalize_axis(attrs["axis"], rank, ctx)
    xs = x.astype(stash_dtype(x, attrs["stash_type"]))
    mean_square = jnp.mean(xs * xs, axis=tuple(range(axis, rank)), keepdims=True)
    normed = xs * rsqrt_eps(mean_square, attrs["epsilon"])
    return ((normed * widen_halves(scale)[0]).astype(dtype_of(scale)),)


@register("LpNormalization", since=(1, 22))
def lp_normalization(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``LpNormalization``, all opsets; an all-zero slice gives zeros (not NaN)."""
    dtype = dtype_of(inputs[0])
    (x,) = widen_halves(inputs[0])
    axis = normalize_axis(attrs["axis"], jnp.ndim(x), ctx)
    p = attrs["p"]
    if p == 1:
        norm = jnp.sum(jnp.abs(x), axis=axis, keepdims=True)
    elif p == 2:
        square = jnp.sum(x * x, axis=axis, keepdims=True)
        nonzero = square > 0
        norm = jnp.where(nonzero, jnp.sqrt(jnp.where(nonzero, square, 1)), 0)
    else:
        raise ctx.error(f"p={p} is not supported; ONNX defines only p=1 and p=2")
    nonzero = norm > 0
    return (jnp.where(nonzero, x / jnp.where(nonzero, norm, 1), 0).astype(dtype),)


@register("MeanVarianceNormalization", since=(9, 13))
def mean_variance_normalization(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``MeanVarianceNormalization``, all opsets: ``(X - E[X]) / (sqrt(Var[X]) + 1e-9)``.

    The variance is computed as ``E[(X - E[X])^2]`` rather than the function body's
    ``E[X^2] - E[X]^2``: equal in exact arithmetic, never negative in floating point.
    """
    dtype = dtype_of(inputs[0])
    (x,) = widen_halves(inputs[0])
    axes = normalize_axes(attrs["axes"], jnp.ndim(x), ctx)
    centred, _, var = centre(x, axes)
    positive = var > 0
    std = jnp.where(positive, jnp.sqrt(jnp.where(positive, var, 1)), 0)
    return ((centred / (std + jnp.asarray(1e-9, dtype_of(x)))).astype(dtype),)


@register("LRN", since=(1, 13))
def lrn(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``LRN``, all opsets: the square sum runs over a window of ``size`` channels."""
    (x,) = inputs
    size = attrs["size"]
    if size is None or size < 1:
        raise ctx.error(f"size must be a positive integer, got {size}")
    rank = jnp.ndim(x)
    if rank < 3:
        raise ctx.error(f"input must have rank >= 3 (N, C, D1, ...), got rank {rank}")
    window = (1, size) + (1,) * (rank - 2)
    padding = ((0, 0), ((size - 1) // 2, math.ceil((size - 1) / 2))) + ((0, 0),) * (rank - 2)
    dtype = dtype_of(x)
    (x,) = widen_halves(x)  # half types: squared, summed and scaled in float32, rounded once
    # A numpy zero as init_value lets JAX see a windowed sum, which it can differentiate; with
    # a jnp zero (not a known constant while tracing) it builds a generic reduce_window, which
    # it cannot (reverse mode raised "Linearization failed").
    square_sum = lax.reduce_window(x * x, np.zeros((), dtype_of(x)), lax.add, window, (1,) * rank, padding)
    alpha, beta, bias = attrs["alpha"], attrs["beta"], attrs["bias"]
    return ((x / (bias + (alpha / size) * square_sum) ** beta).astype(dtype),)


# --------------------------------------------------------------------------------------------
# Dropout


def _dropout(x, ratio, active, ctx, mask_dtype):
    """``(y, mask)``; ``active`` is a Python bool or a traced bool scalar."""
    dtype = dtype_of(x)
    ratio_known = is_concrete(ratio) or isinstance(ratio, (int, float))
    if active is False or (ratio_known and float(np.asarray(ratio)) == 0.0):
        return x, jnp.ones(jnp.shape(x), mask_dtype)
    keep = jax.random.bernoulli(ctx.rng(), 1.0 - jnp.asarray(ratio, jnp.float32), jnp.shape(x))
    scale = (1.0 / (1.0 - jnp.asarray(ratio))).astype(dtype)
    dropped = jnp.where(keep, x * scale, jnp.zeros((), dtype))
    if active is not True:  # a traced training_mode input: choose at run time
        dropped = jnp.where(active, dropped, x)
        keep = jnp.logical_or(keep, jnp.logical_not(active))
    return dropped.astype(dtype), keep.astype(mask_dtype)


@register("Dropout", since=(1, 6), random=True)
def dropout_1(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Dropout``-1/6: ``is_test=0`` (the default) is training mode; the mask is float.

    ``consumed_inputs`` is ignored.
    """
    (x,) = inputs
    active = ctx.training(not attrs["is_test"])
    return _dropout(x, attrs["ratio"], bool(active), ctx, dtype_of(x))


@register("Dropout", since=(7, 10), random=True)
def dropout_7(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Dropout``-7/10: active only when the run is in training mode.

    The mask has the input's type in opset 7 and is bool from opset 10.
    """
    (x,) = inputs
    mask_dtype = np.dtype(bool) if ctx.opset >= 10 else dtype_of(x)
    return _dropout(x, attrs["ratio"], bool(ctx.training(False)), ctx, mask_dtype)


# ratio and training_mode known at trace time decide whether a mask is drawn at all: a graph
# input feeding them directly is passed to jit as static, so ratio=0 (or training_mode=0)
# runs without a PRNG key, as onnxruntime and the node suite's callers expect.
@register("Dropout", since=(12, 13, 22), random=True, prefer_static=(1, 2))
def dropout(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Dropout``, opsets 12+: optional ``ratio`` and ``training_mode`` inputs.

    Active when ``training_mode`` is true or the run is in training mode. The ``seed``
    attribute is ignored: the mask comes from the node's PRNG key (``ctx.rng()``).
    """
    x, ratio, training = inputs
    ratio = np.float32(0.5) if ratio is None else ratio
    if ctx.train is not None:
        active = ctx.train
    elif training is None:
        active = False
    elif is_concrete(training):
        active = bool(np.asarray(training))
    else:
        active = jnp.asarray(training, bool).reshape(())
    return _dropout(x, ratio, active, ctx, np.dtype(bool))

"""Activations, the softmax family (Softmax, LogSoftmax, Hardmax) and Clip.

Formulations are chosen for sane gradients: exponentials sit behind the double-where trick
(``expm1(min(x, 0))``) so a masked branch cannot overflow into a NaN gradient, Softplus is
``logaddexp(x, 0)`` and LogSoftmax subtracts the running max. A float16 or bfloat16 input is
computed in float32 and rounded once (``half_in_float32``), as onnxruntime does: step by step in
the half type a composite was one unit in the last place off for up to 45% of inputs. Softmax
is the exception (see ``_SOFTMAX``).

Before opset 13 Softmax, LogSoftmax and Hardmax coerce the input to 2-D at ``axis`` (default
1) and normalise over the flattened trailing dims; from 13 they work along one axis (default
-1). Clip takes ``min``/``max`` attributes in opsets 1 and 6 and optional scalar inputs from
11; like ``Min(max, Max(input, min))``, ``min > max`` gives ``max`` everywhere and NaN
propagates.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jonnx._registry import Attrs, Inputs, OpContext, Outputs, register
from jonnx.ops._util import (
    dtype_of,
    half_in_float32,
    is_integer,
    lowers_for_cpu,
    lowers_for_xla_emitter,
    normalize_axis,
    rounded,
    static_sizes,
)
from jonnx.ops.reduce import max_by_halves


def _unary(fn, *, widen_halves: bool = True):
    """The op of ``fn(x, attrs)``; ``widen_halves``: computed in float32 for half-precision
    inputs (``half_in_float32``), False where the op is exact in any precision."""
    fn = half_in_float32(fn) if widen_halves else fn

    def apply(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
        return (fn(inputs[0], attrs),)

    return apply


def _neg_expm1(x):
    """``expm1(x)`` evaluated only where ``x <= 0`` (no overflow in the masked branch)."""
    return jnp.expm1(jnp.minimum(x, 0))


# ---------------------------------------------------------------------------------------------
# Pointwise activations


def relu(x):
    """``max(x, 0)``: NaN stays NaN, and the derivative at 0 is 0 (as ``jax.nn.relu``'s;
    ``jnp.maximum`` would split it 0.5/0.5).

    On CPU a select, not ``jax.nn.relu``, whose float ``max`` XLA's CPU backend emits with a
    NaN check that keeps it from fusing with the slices after it: ResNet-50 at batch 1
    compiled 55 kernels (823 kB of LLVM IR) with it and 35 (394 kB) with the select, XLA's
    compile took 0.95 against 1.24 s (medians of eight fresh processes), and it ran 0.95x the
    time (batch 32: 0.97x; docs/performance.md, "ReLU as a select"). Elsewhere ``jax.nn.relu``:
    XLA's GPU backend fuses a ``max(conv + bias, 0)`` into cuDNN's convolution and not the
    select (ResNet-50 at batch 1 on an H200 with its weights as constants: 60 kernels against
    109, 1.31 against 1.42 ms; docs/performance.md, "On a GPU").
    """
    if is_integer(x):
        return jnp.maximum(x, 0).astype(dtype_of(x))
    if not lowers_for_cpu():
        return jax.nn.relu(x)
    return jnp.where(x <= 0, np.zeros((), dtype_of(x)), x)


def _relu(x, attrs):
    return relu(x)


# Exact in any precision: in a half type, no float32 round trip around it (on a GPU XLA fuses
# a ReLU into cuDNN's convolution).
register("Relu", since=(1, 6, 13, 14))(_unary(_relu, widen_halves=False))


def _leaky_relu(x, attrs):
    return jnp.where(x < 0, attrs["alpha"] * x, x)


register("LeakyRelu", since=(1, 6, 16))(_unary(_leaky_relu))


def _elu(x, attrs):
    return jnp.where(x < 0, attrs["alpha"] * _neg_expm1(x), x)


register("Elu", since=(1, 6, 22))(_unary(_elu))


def _selu(x, attrs):
    return attrs["gamma"] * jnp.where(x <= 0, attrs["alpha"] * _neg_expm1(x), x)


register("Selu", since=(1, 6, 22))(_unary(_selu))


@half_in_float32
def _celu(x, alpha):
    # max(0, x) + min(0, alpha * expm1(x / alpha)): for either sign of alpha the second term
    # is nonzero only where x < 0, so it is evaluated there alone (double where).
    return jnp.where(x > 0, x, alpha * jnp.expm1(jnp.minimum(x, 0) / alpha))


@register("Celu", since=(12, 28))
def celu(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Celu``, opsets 12+."""
    if attrs["alpha"] == 0:
        raise ctx.error("alpha must be nonzero")
    return (_celu(inputs[0], attrs["alpha"]),)


def _sigmoid(x, attrs):
    return jax.nn.sigmoid(x)


register("Sigmoid", since=(1, 6, 13))(_unary(_sigmoid))


def _hard_sigmoid(x, alpha, beta):
    return jnp.clip(alpha * x + beta, 0, 1)


register("HardSigmoid", since=(1, 6, 22))(_unary(lambda x, attrs: _hard_sigmoid(x, attrs["alpha"], attrs["beta"])))
register("HardSwish", since=(14, 22))(_unary(lambda x, attrs: x * _hard_sigmoid(x, 1 / 6, 0.5)))


def _softplus(x, attrs):
    return jnp.logaddexp(x, jnp.zeros((), dtype_of(x)))


register("Softplus", since=(1, 22))(_unary(_softplus))


def _softsign(x, attrs):
    return x / (1 + jnp.abs(x))


register("Softsign", since=(1, 22))(_unary(_softsign))
register("Tanh", since=(1, 6, 13))(_unary(lambda x, attrs: jnp.tanh(x)))


@register("Gelu", since=20)
def gelu(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Gelu``, opset 20: exact (erf) or ``approximate="tanh"``."""
    (x,) = inputs
    approximate = attrs["approximate"]
    if approximate not in ("none", "tanh"):
        raise ctx.error(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    return (_gelu(x, approximate),)


@half_in_float32
def _gelu(x, approximate):
    if approximate == "tanh":
        inner = math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)
        return 0.5 * x * (1 + jnp.tanh(inner))
    return 0.5 * x * (1 + lax.erf(x * (1 / math.sqrt(2))))


def _thresholded_relu(x, attrs):
    return jnp.where(x > attrs["alpha"], x, jnp.zeros((), dtype_of(x)))


register("ThresholdedRelu", since=(10, 22))(_unary(_thresholded_relu))


@register("Shrink", since=9)
def shrink(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Shrink``, opset 9. Integer inputs are computed in floating point and truncated
    back to their type, as the reference implementation does."""
    (x,) = inputs
    lambd, bias = attrs["lambd"], attrs["bias"]
    dtype = dtype_of(x)
    xf = x.astype(jnp.result_type(float)) if is_integer(x) else x
    y = jnp.where(xf < -lambd, xf + bias, jnp.where(xf > lambd, xf - bias, jnp.zeros((), xf.dtype)))
    return (y.astype(dtype),)


def _mish(x, attrs):
    return x * jnp.tanh(_softplus(x, attrs))


register("Mish", since=(18, 22))(_unary(_mish))
register("Swish", since=24)(_unary(lambda x, attrs: x * jax.nn.sigmoid(attrs["alpha"] * x)))


# ---------------------------------------------------------------------------------------------
# PRelu


def _prelu(x, slope):
    if is_integer(x):
        return jnp.where(x < 0, x * slope, x).astype(dtype_of(x))
    return jnp.where(x < 0, slope * x, x)


@register("PRelu", since=(1, 6))
def prelu_legacy(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``PRelu``, opsets 1 and 6: ``slope`` is one value shared by every channel, or one
    value per channel (dim 1, as Caffe2 implemented these versions), or else a shape that
    broadcasts unidirectionally to X."""
    x, slope = inputs
    x_shape, s_shape = jnp.shape(x), jnp.shape(slope)
    size = math.prod(s_shape)
    if size == 1:
        slope = jnp.reshape(slope, ())
    elif len(x_shape) >= 2 and len(s_shape) == 1 and size == x_shape[1]:
        slope = jnp.reshape(slope, (size,) + (1,) * (len(x_shape) - 2))
    return (_prelu(x, _unidirectional_slope(x, slope, ctx)),)


def _unidirectional_slope(x, slope, ctx):
    try:
        out_shape = jnp.broadcast_shapes(jnp.shape(x), jnp.shape(slope))
    except ValueError:
        out_shape = None
    if out_shape != jnp.shape(x):
        raise ctx.error(
            f"slope of shape {jnp.shape(slope)} does not broadcast unidirectionally to X of shape {jnp.shape(x)}"
        )
    return slope


@register("PRelu", since=(7, 9, 16))
def prelu(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``PRelu``, opsets 7+: ``slope`` broadcasts unidirectionally to X."""
    x, slope = inputs
    return (_prelu(x, _unidirectional_slope(x, slope, ctx)),)


# ---------------------------------------------------------------------------------------------
# Softmax family


def _hardmax_axis(x, axis):
    n = jnp.shape(x)[axis]
    return jax.nn.one_hot(jnp.argmax(x, axis=axis), n, axis=axis, dtype=dtype_of(x))


# Softmax's row maximum as max_by_halves up to this length: XLA CPU's own reduction of a maximum
# is slow (max_by_halves), but only the compilation for XLA's emitter alone knows it gets that
# one: elsewhere YNNPACK may take the reduction, fused with the product before it (BERT at batch
# 1, where the tree is 1.03x slower). BERT at batch 32: 0.987 of the time, the same outputs.
_SOFTMAX_BY_HALVES_MAX_LENGTH = 1024


def softmax(x, axis: int):
    """``jax.nn.softmax`` along one axis, its row maximum by halves where that is faster
    (compiled for XLA's emitter alone, :func:`_softmax_by_halves`), of ``x`` rounded once
    (:func:`rounded`)."""
    x = rounded(x)
    if lowers_for_xla_emitter():
        n = jnp.shape(x)[axis]
        if static_sizes((n,)) and 2 <= n <= _SOFTMAX_BY_HALVES_MAX_LENGTH:  # not symbolic (jax.export)
            return _softmax_by_halves(x, axis)
    return jax.nn.softmax(x, axis=axis)


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def _softmax_by_halves(x, axis):
    """``jax.nn.softmax`` with the row maximum taken by :func:`max_by_halves`: the same
    operations otherwise, and the same derivative."""
    unnormalized = jnp.exp(x - max_by_halves(x, axis))
    return unnormalized / jnp.sum(unnormalized, axis, keepdims=True)


@_softmax_by_halves.defjvp
def _softmax_by_halves_jvp(axis, primals, tangents):
    (x,), (t,) = primals, tangents
    y = _softmax_by_halves(x, axis)
    return y, y * (t - jnp.sum(y * t, axis, keepdims=True))


# Softmax alone stays step by step in a half type: the node suite's float16 Attention, expanded
# into its function body, expects the reference's stepwise Softmax (in float32 and rounded once,
# test_attention_4d_causal_fp16_expanded is two units in the last place off in 2 of 192 values).
_SOFTMAX = {
    "Softmax": softmax,
    "LogSoftmax": half_in_float32(lambda x, axis: jax.nn.log_softmax(rounded(x), axis=axis)),
    "Hardmax": _hardmax_axis,
}


def softmax_2d(name):
    fn = _SOFTMAX[name]

    def apply(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
        (x,) = inputs
        shape = jnp.shape(x)
        rank = len(shape)
        axis = attrs["axis"]
        # axis == rank is allowed: the trailing block is then empty (size 1).
        if not -rank <= axis <= rank:
            raise ctx.error(f"axis {axis} is out of range for a tensor of rank {rank}")
        axis = axis if axis >= 0 else axis + rank
        rows = math.prod(shape[:axis])
        cols = math.prod(shape[axis:])
        if rows * cols == 0:
            return (jnp.asarray(x),)
        return (jnp.reshape(fn(jnp.reshape(x, (rows, cols)), 1), shape),)

    apply.__doc__ = f"ONNX ``{name}``, opsets 1 and 11: normalised over the 2-D coercion at ``axis``."
    return apply


def softmax_axis(name):
    fn = _SOFTMAX[name]

    def apply(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
        (x,) = inputs
        axis = normalize_axis(attrs["axis"], jnp.ndim(x), ctx)
        if jnp.size(x) == 0:
            return (jnp.asarray(x),)
        return (fn(x, axis),)

    apply.__doc__ = f"ONNX ``{name}``, opsets 13+: normalised along ``axis``."
    return apply


for _name in _SOFTMAX:
    register(_name, since=(1, 11))(softmax_2d(_name))
    register(_name, since=13)(softmax_axis(_name))


# ---------------------------------------------------------------------------------------------
# Clip


def _clip(x, lo, hi):
    # Min(max, Max(input, min)), exactly as ONNX words it: min > max yields max everywhere.
    # jnp.clip is that composition, so its gradient at a bound is what jnp.clip gives.
    if lo is None and hi is None:
        return x
    return jnp.clip(x, lo, hi)


@register("Clip", since=1)
def clip_1(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Clip``, opset 1: ``min``/``max`` attributes, unbounded where absent."""
    return (_clip(inputs[0], attrs["min"], attrs["max"]),)


@register("Clip", since=6)
def clip_6(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Clip``, opset 6: ``min``/``max`` attributes (defaults +-3.402823e38)."""
    return (_clip(inputs[0], attrs["min"], attrs["max"]),)


@register("Clip", since=(11, 12, 13))
def clip(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Clip``, opsets 11+: optional scalar ``min``/``max`` inputs."""
    x, lo, hi = inputs
    dtype = dtype_of(x)
    for name, bound in (("min", lo), ("max", hi)):
        if bound is not None and jnp.size(bound) != 1:
            raise ctx.error(f"{name} must be a scalar, got shape {jnp.shape(bound)}")
    lo = None if lo is None else jnp.reshape(lo, ()).astype(dtype)
    hi = None if hi is None else jnp.reshape(hi, ()).astype(dtype)
    return (_clip(x, lo, hi),)

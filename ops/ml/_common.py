"""Helpers every ai.onnx.ml family shares: inputs, string labels, post transforms."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from jonnx._values import is_concrete
from jonnx.ops._util import as_strings, index_dtype, rounded

__all__ = [
    "ML",
    "as_2d",
    "class_labels",
    "float_features",
    "is_string_tensor",
    "need_concrete",
    "post_transform",
    "post_transform_fn",
    "probit",
    "string_labels_static",
    "tensor_attr",
]

#: The domain every op of this package registers in.
ML = "ai.onnx.ml"


def is_string_tensor(x) -> bool:
    """Whether ``x`` is a host tensor of strings (numpy ``str``/``bytes``/object dtype)."""
    return isinstance(x, (np.ndarray, np.generic)) and np.asarray(x).dtype.kind in "OUS"


def float_features(x) -> jax.Array:
    """Features as float32 (float64 stays float64), as the ML ops compute."""
    dtype = jnp.result_type(x)
    return jnp.asarray(x, dtype if dtype in (np.float32, np.float64) else np.float32)


def as_2d(x, ctx) -> jax.Array:
    """``[C]`` -> ``[1, C]``; ``[N, C]`` stays; other ranks are an error."""
    if jnp.ndim(x) == 1:
        return jnp.reshape(x, (1, -1))
    if jnp.ndim(x) != 2:
        raise ctx.error(f"input must have shape [N, C] or [C], got {jnp.shape(x)}")
    return x


def tensor_attr(attrs, name, fallback=None, dtype=None):
    """``name_as_tensor`` when set (opset 3+), else the list attribute ``name``, as numpy."""
    t = attrs.get(name + "_as_tensor")
    value = t if t is not None else attrs.get(name)
    if value is None:
        value = fallback
    if value is None:
        return None
    return np.asarray(value, dtype) if dtype is not None else np.asarray(value)


def _erfinv_approx(x):
    # The closed form onnxruntime and the onnx reference use (Winitzki, a = 0.147); PROBIT
    # must reproduce it rather than the exact inverse to match their outputs. At x = +-1 the
    # inverse is +-inf, as onnxruntime returns (the onnx reference returns 0 there); the
    # ``where`` keeps log(0) out of the computed branch so gradients elsewhere stay finite.
    sgn = jnp.where(x < 0, -1.0, 1.0).astype(x.dtype)
    y = (1.0 - x) * (1.0 + x)
    zero = y == 0
    log = jnp.log(jnp.where(zero, 1.0, y))
    v = 2.0 / (math.pi * 0.147) + 0.5 * log
    v2 = log / 0.147
    v3 = -v + jnp.sqrt(v * v - v2)
    return jnp.where(zero, sgn * jnp.inf, sgn * jnp.sqrt(jnp.maximum(v3, 0.0))).astype(x.dtype)


def probit(x):
    return (1.41421356 * _erfinv_approx(x * 2 - 1)).astype(x.dtype)


def _softmax_zero(s):
    s = rounded(s)  # as the maximum reads it (ops/_util.py)
    vmax = jnp.max(s, axis=-1, keepdims=True)
    nonzero = jnp.abs(s) > 1e-7
    e = jnp.where(nonzero, jnp.exp(jnp.where(nonzero, s - vmax, 0.0)), s * jnp.exp(-vmax))
    total = jnp.sum(e, axis=-1, keepdims=True)
    empty = total == 0
    return jnp.where(empty, 0.5, e / jnp.where(empty, 1.0, total)).astype(s.dtype)


def post_transform(scores, name: str, ctx):
    """The ``post_transform`` attribute's function applied to ``scores`` ``[N, C]``."""
    return post_transform_fn(name, ctx)(scores)


def post_transform_fn(name: str, ctx):
    """The ``post_transform`` attribute's function (hashable: a jitted function can take it as a
    static argument)."""
    fn = _POST_TRANSFORMS.get(name)
    if fn is None:
        raise ctx.error(f"post_transform must be NONE, LOGISTIC, SOFTMAX, SOFTMAX_ZERO or PROBIT, got {name!r}")
    return fn


def _softmax(scores):
    return jax.nn.softmax(rounded(scores), axis=-1)


def _identity(scores):
    return scores


_POST_TRANSFORMS = {
    "NONE": _identity,
    "LOGISTIC": jax.nn.sigmoid,
    "SOFTMAX": _softmax,
    "SOFTMAX_ZERO": _softmax_zero,
    "PROBIT": probit,
}


def class_labels(index, int_labels, string_labels, ctx, x):
    """Class indices -> the label attribute's values (strings only for a concrete input)."""
    if string_labels:
        if not is_concrete(x):
            raise ctx.error(
                "string class labels are host values and need a concrete input; run the model "
                "outside jax.jit (or on numpy inputs), or export it with classlabels_int64s"
            )
        return as_strings(np.asarray(string_labels, object)[np.asarray(index)])
    table = jnp.asarray(np.asarray(int_labels, np.int64), index_dtype())
    return table[index]


def string_labels_static(attrs):
    # String labels are host values: the input must be known at trace time to produce them.
    # Declaring it static lets Model.__call__ pass it as a static argument (one compilation per
    # distinct value); a caller's own jax.jit gets a StaticValueError naming the chain.
    return (0,) if attrs.get("classlabels_strings") else ()


def need_concrete(x, ctx, what: str):
    if not is_concrete(x):
        raise ctx.host_error(f"{what} needs a concrete input (it reads or writes strings)")

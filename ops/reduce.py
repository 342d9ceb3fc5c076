"""Reductions: ReduceSum, ReduceMean, ReduceMax, ReduceMin, ReduceProd, ReduceL1, ReduceL2,
ReduceLogSum, ReduceLogSumExp, ReduceSumSquare, and ArgMax / ArgMin.

The axes are an attribute up to opset 12 (ReduceSum) or 17 (the others) and a static input
after that, where ``noop_with_empty_axes=1`` with an empty axes list reduces over no axis: the
op's elementwise part alone (the identity for ReduceSum, |x| for ReduceL1, x^2 for
ReduceSumSquare, log x for ReduceLogSum).
Reductions over an empty set give the reduction's identity, as the spec says: 0 for sums and
norms, 1 for products, -inf for ReduceMax / ReduceLogSum / ReduceLogSumExp (the dtype's
minimum for integers, False for bool), +inf for ReduceMin (the maximum, True). ReduceLogSumExp
subtracts the maximum first, and ReduceL2's gradient at an all-zero slice is 0, not NaN.
ReduceMax and ReduceMin (and GlobalMaxPool, through :func:`reduce_max`) send a slice's
derivative to its first extreme element, by index (:func:`_chosen` says why).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jonnx._registry import Attrs, Inputs, OpContext, Outputs, register
from jonnx.ops._util import half_in_float32, index_dtype, normalize_axes, normalize_axis, rounded, static_ints


def _is_float(x) -> bool:
    return jnp.issubdtype(jnp.result_type(x), jnp.inexact)


def _as_float(x):
    """Integer inputs (allowed by the older schemas) computed in floating point."""
    return x if _is_float(x) else jnp.asarray(x, jnp.result_type(float))


def _lowest(dtype):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return False
    if jnp.issubdtype(dtype, jnp.inexact):
        return -np.inf
    return jnp.iinfo(dtype).min


def _highest(dtype):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return True
    if jnp.issubdtype(dtype, jnp.inexact):
        return np.inf
    return jnp.iinfo(dtype).max


def reduce_max(x, axis, keepdims):
    """``max`` over the axes ``axis`` (-inf, or the lowest value, over none), differentiated by
    index: the tangent of each slice's first maximal element in row-major order
    (:func:`_chosen`)."""
    return _chosen(x, tuple(axis), keepdims, True) if _is_float(x) else _extreme(x, axis, keepdims, True)


def max_by_halves(x, axis: int):
    """The maximum along ``axis`` (kept, of length 1), as the maximum of its two halves, of
    theirs, and so on: elementwise maximums, which XLA CPU fuses into one loop, where its own
    row reduction of a maximum is a reduce-window four times slower than a sum's (0.58 against
    2.17 ms over BERT's 32 x 12 x 128 x 128 attention scores). Equal to ``jnp.max``, NaN
    included; every output reads the whole axis in its loop, so keep the axis short."""
    n = jnp.shape(x)[axis]
    odd = None  # the elements left over by odd lengths, folded in at the end
    while n > 1:
        if n % 2:
            last = lax.slice_in_dim(x, n - 1, n, axis=axis)
            odd = last if odd is None else jnp.maximum(odd, last)
            n -= 1
        x = jnp.maximum(lax.slice_in_dim(x, 0, n // 2, axis=axis), lax.slice_in_dim(x, n // 2, n, axis=axis))
        n //= 2
    return x if odd is None else jnp.maximum(x, odd)


def reduce_min(x, axis, keepdims):
    """``min`` over ``axis``, like :func:`reduce_max`."""
    return _chosen(x, tuple(axis), keepdims, False) if _is_float(x) else _extreme(x, axis, keepdims, False)


def _extreme(x, axis, keepdims, largest):
    if largest:
        return jnp.max(x, axis=axis, keepdims=keepdims, initial=_lowest(jnp.result_type(x)))
    return jnp.min(x, axis=axis, keepdims=keepdims, initial=_highest(jnp.result_type(x)))


@functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2, 3))
def _chosen(x, axis, keepdims, largest):
    """:func:`_extreme` of a float ``x``, whose tangent is that of the element an arg-max picks.

    JAX's own rule compares ``x`` with the result and shares the tangent among the equal
    elements. Under ``jax.jit`` on CPU that went wrong after a convolution lowered as fused
    shifted products (channels-last, few channels): GlobalMaxPool's and ReduceMax's derivatives
    were off in some elements (tests/test_gradients.py; a pure-JAX reproducer in
    docs/known_issues.md). An index picked from ``x`` and a gather of the tangent, as MaxPool
    and RoiAlign do, are right there; ties go to the first element, as in MaxPool."""
    return _extreme(x, axis, keepdims, largest)


@_chosen.defjvp
def _chosen_jvp(axis, keepdims, largest, primals, tangents):
    (x,), (t,) = primals, tangents
    y = _chosen(x, axis, keepdims, largest)
    if any(jnp.shape(x)[a] == 0 for a in axis):  # over nothing: a constant
        return y, jnp.zeros_like(y)
    kept = [a for a in range(jnp.ndim(x)) if a not in axis]

    def flat(v):  # the reduced axes last, in order (row-major), as one
        moved = jnp.transpose(v, (*kept, *sorted(axis)))
        return jnp.reshape(moved, (*jnp.shape(moved)[: len(kept)], -1))

    pick = (jnp.argmax if largest else jnp.argmin)(flat(x), axis=-1, keepdims=True)
    dy = jnp.take_along_axis(flat(t), pick, axis=-1)
    return y, jnp.reshape(dy, jnp.shape(y))


def _sum(x, axis, keepdims):
    return jnp.sum(x, axis=axis, keepdims=keepdims, dtype=jnp.result_type(x))


def _prod(x, axis, keepdims):
    return jnp.prod(x, axis=axis, keepdims=keepdims, dtype=jnp.result_type(x))


def _mean(x, axis, keepdims):
    dtype = jnp.result_type(x)
    return jnp.mean(_as_float(x), axis=axis, keepdims=keepdims).astype(dtype)


def _l1(x, axis, keepdims):
    return _sum(jnp.abs(x), axis, keepdims)


def _sum_square(x, axis, keepdims):
    return _sum(x * x, axis, keepdims)


def _l2(x, axis, keepdims):
    dtype = jnp.result_type(x)
    s = _sum_square(_as_float(x), axis, keepdims)
    # sqrt's derivative is infinite at 0: route zero slices around it (gradient 0 there).
    positive = s > 0
    root = jnp.sqrt(jnp.where(positive, s, 1))
    return jnp.where(positive, root, 0).astype(dtype)


def _log_sum(x, axis, keepdims):
    dtype = jnp.result_type(x)
    return jnp.log(_sum(_as_float(x), axis, keepdims)).astype(dtype)


def _log_sum_exp(x, axis, keepdims):
    dtype = jnp.result_type(x)
    x = rounded(_as_float(x))  # one value for the maximum and the sum (ops/_util.py)
    m = _extreme(x, axis, True, True)
    # Shift by the (finite) maximum so exp never overflows; the shift cancels in value and
    # gradient, so it is held constant.
    shift = lax.stop_gradient(jnp.where(jnp.isfinite(m), m, 0))
    out = jnp.log(jnp.sum(jnp.exp(x - shift), axis=axis, keepdims=True)) + shift
    if not keepdims:
        out = jnp.squeeze(out, axis=axis)
    return out.astype(dtype)


# Sums, products and the composites compute half types in float32 and round once, as
# onnxruntime does (a float16 ReduceSumSquare squared in float16 first was several units in the
# last place off; ReduceSum over 40 values in float16 was off in 1,385 of 2,000 rows, ReduceProd
# of 3 in 517: XLA accumulates a float16 reduction in float16).
_KINDS = {
    "ReduceSum": half_in_float32(_sum),
    "ReduceMean": half_in_float32(_mean),
    "ReduceMax": reduce_max,
    "ReduceMin": reduce_min,
    "ReduceProd": half_in_float32(_prod),
    "ReduceL1": half_in_float32(_l1),
    "ReduceL2": half_in_float32(_l2),
    "ReduceLogSum": half_in_float32(_log_sum),
    "ReduceLogSumExp": half_in_float32(_log_sum_exp),
    "ReduceSumSquare": half_in_float32(_sum_square),
}


def _reduce(fn, x, axes, keepdims, noop, ctx):
    rank = jnp.ndim(x)
    if not axes:
        # noop_with_empty_axes reduces over no axis at all: the op's elementwise part still
        # applies (|x| for ReduceL1/L2, x^2 for ReduceSumSquare, log x for ReduceLogSum), as
        # the opset-18 schemas, onnxruntime and the ReferenceEvaluator have it.
        axes = () if noop else tuple(range(rank))
    else:
        axes = normalize_axes(axes, rank, ctx)
    if any(np.shape(x)[a] == 0 for a in axes):
        # An empty reduction is the identity (a constant): its derivative is 0, where the
        # chain rule through log / max of nothing would give NaN.
        x = lax.stop_gradient(x)
    return fn(x, axes, bool(keepdims))


def _reduce_attr_axes(fn):
    def apply(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
        x = inputs[0]
        axes = attrs["axes"]
        return (_reduce(fn, x, tuple(axes) if axes is not None else (), attrs["keepdims"], False, ctx),)

    apply.__doc__ = "ONNX reduction with the ``axes`` attribute (opsets before the axes input)."
    return apply


def _reduce_input_axes(fn):
    def apply(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
        x, axes = inputs
        axes = () if axes is None else static_ints(axes)
        return (_reduce(fn, x, axes, attrs["keepdims"], attrs["noop_with_empty_axes"], ctx),)

    apply.__doc__ = (
        "ONNX reduction with a static ``axes`` input; ``noop_with_empty_axes=1`` and empty "
        "axes reduce over no axis: only the elementwise part applies (|x| for ReduceL1, ...)."
    )
    return apply


# (attribute-axes since_versions, input-axes since_versions)
_VERSIONS = {
    "ReduceSum": ((1, 11), (13,)),
    "ReduceMean": ((1, 11, 13), (18,)),
    "ReduceMax": ((1, 11, 12, 13), (18, 20)),
    "ReduceMin": ((1, 11, 12, 13), (18, 20)),
    "ReduceProd": ((1, 11, 13), (18,)),
    "ReduceL1": ((1, 11, 13), (18,)),
    "ReduceL2": ((1, 11, 13), (18,)),
    "ReduceLogSum": ((1, 11, 13), (18, 28)),
    "ReduceLogSumExp": ((1, 11, 13), (18, 28)),
    "ReduceSumSquare": ((1, 11, 13), (18,)),
}

for _name, (_attr_versions, _input_versions) in _VERSIONS.items():
    register(_name, since=_attr_versions)(_reduce_attr_axes(_KINDS[_name]))
    register(_name, since=_input_versions, static_inputs=(1,))(_reduce_input_axes(_KINDS[_name]))


def _arg(find, inputs, attrs, ctx):
    (x,) = inputs
    rank = jnp.ndim(x)
    axis = normalize_axis(attrs["axis"], rank, ctx)
    keepdims = bool(attrs["keepdims"])
    shape = jnp.shape(x)
    if shape[axis] == 0:
        # No index to give, unless the output is empty too (another axis of size 0).
        kept = [1 if d == axis else n for d, n in enumerate(shape) if keepdims or d != axis]
        if math.prod(kept) != 0:
            raise ctx.error(f"cannot take an arg-reduction over the empty axis {axis}")
        return (jnp.zeros(kept, index_dtype()),)
    if attrs.get("select_last_index"):
        idx = (shape[axis] - 1) - find(jnp.flip(x, axis), axis=axis, keepdims=keepdims)
    else:
        idx = find(x, axis=axis, keepdims=keepdims)
    return (idx.astype(index_dtype()),)


@register("ArgMax", since=(1, 11, 12, 13))
def argmax(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``ArgMax``, all opsets (negative axis from 11, ``select_last_index`` from 12)."""
    return _arg(jnp.argmax, inputs, attrs, ctx)


@register("ArgMin", since=(1, 11, 12, 13))
def argmin(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``ArgMin``, all opsets (negative axis from 11, ``select_last_index`` from 12)."""
    return _arg(jnp.argmin, inputs, attrs, ctx)

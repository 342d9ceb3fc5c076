"""The weights' term in the depthwise lowering's JVP, as a JAX primitive with its own transpose.

In the JVP of ``conv._shifted_products`` the taps' tangent ``t`` enters as
``sum_i window_i(xp) * t[i]`` (each tap's per-channel weights broadcast over the batch and
the map). Reverse mode transposes that into one reduction per tap of ``window_i * ct``, which
XLA CPU runs as separate passes over the input and the cotangent, each recomputing whatever
elementwise work it fuses into the cotangent (a BatchNorm's and ReLU6's backward). As a
primitive whose transpose is a variadic reduction (:func:`tap_sums`), every tap's sum comes
from one pass that computes each cotangent element once and reads the windows from cache.

NC(D)HW only: there the reduction keeps the channel axis outside the map. Channels-last it
would keep the minor axis, where XLA CPU reduces slowly (a 3x3 over 144 channels at 56x56,
batch 16, forward and both gradients: 1.20x slower), so ``conv`` keeps its halves' tree
there. Channels-first, that layer took 0.68 of the time (0.23-0.91 over MobileNetV2's shapes
at batch 16, 0.50-0.84 for 7x7 kernels), and MobileNetV2's training step at 224x224 0.83
(batch 4), 0.92-0.96 (16) and 0.90 (32) (docs/performance.md).

Everything else is the plain sum: evaluation and lowering, forward mode (the product is
bilinear), the input's transpose, and batching (a ``vmap`` over the batch folds into the
batch axis; one over the taps computes the plain sum). :func:`tap_sums` differentiates as
plain per-tap sums, so every order of derivative follows.
"""

from __future__ import annotations

import functools
import math
import operator

import jax
import jax.numpy as jnp
from jax import lax
from jax.core import ShapedArray
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from jonnx.ops import _window as geo


def tap_weight_term(xp, t, kernel, strides, dilations, out):
    """``sum_i window_i(xp) * t[i]`` for an NC(D)HW padded input ``xp`` and taps ``t`` of shape
    (K, 1, C, 1, ...), with static sizes (the transpose in ``t`` is :func:`tap_sums`)."""
    params = dict(kernel=tuple(kernel), strides=tuple(strides), dilations=tuple(dilations), out=tuple(map(int, out)))
    return _tap_weight_p.bind(xp, t, **params)


def _windows(xp, kernel, strides, dilations, out):
    return geo.taps(xp, kernel, strides, dilations, out, channels_last=False)


def _plain(xp, t, *, kernel, strides, dilations, out):
    return geo.tap_sum(_windows(xp, kernel, strides, dilations, out), t)


def _abstract(xp, t, *, kernel, strides, dilations, out):
    return ShapedArray(geo.with_spatial(xp.shape, out, False), jnp.result_type(xp.dtype, t.dtype))


def _input_transpose(ct, xp, t, **params):
    """The cotangent of ``xp`` (``t`` fixed): the plain sum's transpose (second derivatives)."""
    return jax.linear_transpose(lambda v: _plain(v, t, **params), jax.ShapeDtypeStruct(xp.aval.shape, xp.aval.dtype))(
        ct
    )[0]


def _taps_transpose(ct, xp, t, *, kernel, strides, dilations, out):
    """The cotangent of ``t`` (``xp`` fixed): the taps' sums in one pass."""
    return jnp.reshape(tap_sums(xp, ct, kernel, strides, dilations, out), t.aval.shape).astype(t.aval.dtype)


def _batch(args, dims, **params):
    xp, t = args
    dx, dt = dims
    if dt is None:
        # A vmap over the input alone: its axis joins the batch axis (windows cut only the map).
        xp = jnp.moveaxis(xp, dx, 0)
        lead = xp.shape[:2]
        y = _tap_weight_p.bind(jnp.reshape(xp, (-1, *xp.shape[2:])), t, **params)
        return jnp.reshape(y, (*lead, *y.shape[1:])), 0
    return jax.vmap(functools.partial(_plain, **params), in_axes=(dx, dt))(xp, t), 0


_tap_weight_p = Primitive("jonnx_tap_weight_term")
_tap_weight_p.def_impl(_plain)
_tap_weight_p.def_abstract_eval(_abstract)
mlir.register_lowering(_tap_weight_p, mlir.lower_fun(_plain, multiple_results=False))
ad.defbilinear(_tap_weight_p, _input_transpose, _taps_transpose)
batching.primitive_batchers[_tap_weight_p] = _batch


# Maps of at most this many cells are summed in one reduction (see tap_sums).
JOINT_MAX_CELLS = 3136


@functools.partial(jax.custom_jvp, nondiff_argnums=(2, 3, 4, 5))
def tap_sums(xp, ct, kernel, strides, dilations, out):
    """For each tap i, the sum of ``window_i(xp) * ct`` over all but the channel axis: (K, C).

    A variadic reduction over each image's map, then a sum over the batch. XLA accumulates a
    reduction in order, so one over the batch and the map together (16 x 112 x 112 terms) was
    up to 1.7e-4 off in float32 (relative to the largest sum), one over a 224 x 224 map 6.6e-6;
    maps of more than ``JOINT_MAX_CELLS`` (56 x 56) cells are therefore summed one axis at a
    time, last first (under 2.5e-7; the halves' tree: 1e-7). On small maps with many taps that
    is slow (a 7x7 over 384 channels at 14x14, batch 16: 1.36x the trees' time; in one
    reduction 0.55x). The JVP is the plain per-tap sums (the function is bilinear)."""
    products = [w * ct for w in _windows(xp, kernel, strides, dilations, out)]
    zeros = [jnp.zeros((), p.dtype) for p in products]
    spatial = tuple(range(2, jnp.ndim(ct)))
    joint = math.prod(jnp.shape(ct)[2:]) <= JOINT_MAX_CELLS
    for axes in [spatial] if joint else [(a,) for a in reversed(spatial)]:
        products = list(lax.reduce(products, zeros, lambda a, b: tuple(map(operator.add, a, b)), axes))
    return jnp.stack([jnp.sum(p, axis=0) for p in products])


def _plain_sums(xp, ct, kernel, strides, dilations, out):
    axes = tuple(a for a in range(jnp.ndim(ct)) if a != 1)
    return jnp.stack([jnp.sum(w * ct, axis=axes) for w in _windows(xp, kernel, strides, dilations, out)])


@tap_sums.defjvp
def _tap_sums_jvp(kernel, strides, dilations, out, primals, tangents):
    (xp, ct), (t_xp, t_ct) = primals, tangents
    geometry = (kernel, strides, dilations, out)
    tangent = _plain_sums(t_xp, ct, *geometry) + _plain_sums(xp, t_ct, *geometry)
    return tap_sums(xp, ct, *geometry), tangent

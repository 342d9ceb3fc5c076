"""Pooling: AveragePool, MaxPool, LpPool, their Global forms, and MaxUnpool.

Each pool is one ``lax.reduce_window`` (or, for small max windows on CPU, one fused loop over
the window's positions), so XLA sees whole windows, never per-position Python. The helpers
take ``channels_last`` (ops/_window.py says how the layouts and the padding rules go).

Windows that do not overlap are read as strided slices, one fused loop with whatever made the
input (a BatchNorm and ReLU after a convolution), except where the channels-last pass marks the
pool ``after_tap_loop``: its input is a loop of multiply-adds over a convolution's taps (an
image stem, a depthwise convolution: ``jonnx.ops.conv.runs_as_tap_loop``), which XLA would
take into the slices' loop and run poorly vectorized; a reduce-window reads it there instead
(an MNIST-size 1->8 5x5 stem, ReLU and 2x2 pool at batch 64: 1.15 against 0.35 ms; a 3->32
3x3 stem with BatchNorm at batch 16 on 28x28 1.10 against 0.38; docs/performance.md, "Pools
after multiply-add loops").
"""

from __future__ import annotations

import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jonnx._registry import Attrs, Inputs, OpContext, Outputs, register
from jonnx.ops import _window as geo
from jonnx.ops._util import index_dtype, lowers_for_cpu, static_ints, static_sizes, take, widen_halves
from jonnx.ops.reduce import reduce_max


def _pool_setup(x, attrs, ctx, channels_last: bool = False):
    """Kernel, strides, dilations and per-axis pads for a pooling node."""
    if jnp.ndim(x) < 3:
        raise ctx.error(f"input of shape {jnp.shape(x)} needs a batch, a channel and spatial axes")
    n = jnp.ndim(x) - 2
    if attrs.get("kernel_shape") is None or len(attrs["kernel_shape"]) != n:
        raise ctx.error(f"kernel_shape {attrs.get('kernel_shape')} must have {n} entries")
    kernel = tuple(int(k) for k in attrs["kernel_shape"])
    strides = geo.ints(attrs.get("strides"), n, 1, "strides", ctx)
    dilations = geo.ints(attrs.get("dilations"), n, 1, "dilations", ctx)
    if any(v < 1 for v in kernel + strides + dilations):
        raise ctx.error(f"kernel_shape {kernel}, strides {strides} and dilations {dilations} must be positive")
    lo, hi, extra = geo.window_pads(
        geo.spatial(jnp.shape(x), channels_last),
        kernel,
        strides,
        dilations,
        attrs,
        ctx,
        ceil_mode=bool(attrs.get("ceil_mode")),
    )
    return kernel, strides, dilations, lo, hi, extra


def _reduce_window(
    x, init, op, kernel, strides, dilations, lo, hi, extra, channels_last: bool = False, *, row_major_ties: bool = False
):
    """``op`` (max or add) over each window, padded with ``init``.

    On CPU, one reduce-window per spatial axis: a window's maximum (or sum) is that of its
    rows' maxima (sums), and XLA CPU's reduce-window is a loop that pays per window position.
    A 3x3 window then costs 3 + 3 steps instead of 9, and whatever made ``x`` (fused into the
    first pass) is computed for 1.5x the cells instead of 2.25x under a 3x3/2 window: a
    3x3/1 average over 28x28x192 0.39 -> 0.10 ms; a ResNet stem's BatchNorm, ReLU and 3x3/2
    pool (224x224) 1.90 -> 1.39 ms at batch 1, 94 -> 78 at batch 32, but 16.4 -> 20.0 at batch
    8, where the extra pass's buffer takes the call's temporaries past glibc's mmap threshold
    and every call faults in fresh pages (docs/performance.md, "Large batches"; with
    ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1`` 10.3 ms). The outer axes go first (NCHW, a
    3x3/2 pool over 64x112x112: 0.31 ms, last axis first 0.39, one pass 0.53), except with
    ``row_major_ties``: a window maximum that JAX differentiates itself (select-and-scatter per
    pass) then still credits a tie to the first position in row-major order.
    """
    if not lowers_for_cpu():
        return _reduce_window_once(x, init, op, kernel, strides, dilations, lo, hi, extra, channels_last)
    axes = range(len(kernel))
    for axis in reversed(axes) if row_major_ties else axes:

        def along(values, other, axis=axis):
            return tuple(v if i == axis else other for i, v in enumerate(values))

        if kernel[axis] > 1 or strides[axis] > 1 or lo[axis] or hi[axis] or extra[axis]:
            window = (along(kernel, 1), along(strides, 1), along(dilations, 1), along(lo, 0), along(hi, 0))
            x = _reduce_window_once(x, init, op, *window, along(extra, 0), channels_last)
    return x


def _reduce_window_once(x, init, op, kernel, strides, dilations, lo, hi, extra, channels_last: bool):
    # A numpy init value stays concrete under jit, so JAX picks its max/sum window primitives
    # (with their efficient gradients) instead of a generic reduction.
    return lax.reduce_window(
        x,
        np.asarray(init, np.dtype(jnp.result_type(x))),
        op,
        window_dimensions=geo.full(kernel, 1, channels_last),
        window_strides=geo.full(strides, 1, channels_last),
        padding=geo.full(((a, b + e) for a, b, e in zip(lo, hi, extra)), (0, 0), channels_last),
        window_dilation=geo.full(dilations, 1, channels_last),
    )


def _lowest(dtype):
    dtype = np.dtype(dtype)
    return -np.inf if jnp.issubdtype(dtype, jnp.floating) else np.iinfo(dtype).min


# Windows up to this many positions run as passes over their taps on CPU (each position is
# one unrolled step of the fused loop); larger ones keep reduce-window and select-and-scatter.
_MAX_WINDOW_TAPS = 49


def _taps_fit(x, kernel) -> bool:
    """Whether pooling ``x`` over ``kernel`` runs as fused passes over the window's taps (the
    maxima, their positions and the derivative that reads them, disjoint sums): on CPU, for a
    float input of static shape under 2^31 elements and at most ``_MAX_WINDOW_TAPS`` taps."""
    shape = jnp.shape(x)
    return (
        lowers_for_cpu()
        and jnp.issubdtype(jnp.result_type(x), jnp.floating)
        and math.prod(kernel) <= _MAX_WINDOW_TAPS
        and static_sizes(shape)
        and math.prod(shape) < 2**31
    )


def _first_max(x, kernel, strides, dilations, lo, hi, extra, channels_last: bool):
    """For each window of ``x`` (static shape, under 2^31 elements): the row-major flat index
    (int32, over the whole tensor) of its first maximal cell, and whether that cell is an input
    cell rather than padding (it is padding only in a window of -inf).

    One fused pass over the windows, the kernel positions in row-major order, a later one
    winning only when strictly greater."""
    shape = tuple(int(d) for d in jnp.shape(x))
    pads = geo.full(((a, b + e) for a, b, e in zip(lo, hi, extra)), (0, 0), channels_last)
    xp = jnp.pad(lax.stop_gradient(x), pads, constant_values=_lowest(jnp.result_type(x)))
    taps = geo.taps(
        xp, kernel, strides, dilations, geo.out_spatial(xp, kernel, strides, dilations, channels_last), channels_last
    )
    best = next(taps)
    first = jnp.zeros(jnp.shape(best), jnp.int32)
    for i, tap in enumerate(taps, 1):
        later = tap > best
        best, first = jnp.where(later, tap, best), jnp.where(later, i, first)
    spatial_axes = range(1, len(shape) - 1) if channels_last else range(2, len(shape))
    window = dict(zip(spatial_axes, range(len(kernel))))
    flat, inside = jnp.zeros_like(first), True
    for axis, extent in enumerate(shape):
        pos = lax.broadcasted_iota(jnp.int32, jnp.shape(first), axis)
        if axis in window:
            j = window[axis]
            offset = first // math.prod(kernel[j + 1 :]) % kernel[j]
            pos = pos * strides[j] + offset * dilations[j] - lo[j]
            inside = inside & (pos >= 0) & (pos < extent)
        flat = flat * extent + pos
    return flat, inside


def _argmax_window(x, kernel, strides, dilations, lo, hi, extra, channels_last: bool = False):
    """Row-major flat index (over the whole tensor) of each window's maximum."""
    shape, dtype, idx_dtype = jnp.shape(x), jnp.result_type(x), index_dtype()
    if _taps_fit(x, kernel):
        # XLA CPU runs the two-result reduce-window below as a slow scalar loop: a 3x3/2 pool's
        # indices over 64x112x112 took 3.9 ms (onnxruntime 2.1).
        flat, inside = _first_max(x, kernel, strides, dilations, lo, hi, extra, channels_last)
        return jnp.where(inside, flat.astype(idx_dtype), np.iinfo(idx_dtype).max)
    # An iota inside the computation (XLA fuses it), not a constant the size of the input.
    flat = jnp.reshape(lax.iota(idx_dtype, math.prod(shape)), shape)

    def pick(a, b):
        (va, ia), (vb, ib) = a, b
        # The largest value; the first (row-major) position among equal ones, like ONNX's loop.
        take_a = (va > vb) | ((va == vb) & (ia < ib))
        return jnp.where(take_a, va, vb), jnp.where(take_a, ia, ib)

    _, idx = lax.reduce_window(
        (lax.stop_gradient(x), flat),
        (jnp.asarray(_lowest(dtype), dtype), jnp.asarray(np.iinfo(idx_dtype).max, idx_dtype)),
        pick,
        window_dimensions=geo.full(kernel, 1, channels_last),
        window_strides=geo.full(strides, 1, channels_last),
        padding=geo.full(((a, b + e) for a, b, e in zip(lo, hi, extra)), (0, 0), channels_last),
        window_dilation=geo.full(dilations, 1, channels_last),
    )
    return idx


def _column_major(idx, shape):
    """Row-major flat indices re-expressed with column-major spatial offsets (storage_order=1)."""
    spatial = shape[2:]
    plane = math.prod(spatial)
    base, rest = idx // plane * plane, idx % plane
    coords = []
    for size in reversed(spatial):
        coords.append(rest % size)
        rest = rest // size
    col, step = jnp.zeros_like(idx), 1
    for coord, size in zip(reversed(coords), spatial):  # the first spatial axis varies fastest
        col = col + coord * step
        step *= size
    return base + col


def _max_window(x, kernel, strides, lo, hi, extra, channels_last: bool = False, slices: bool = True):
    """The window maxima (dilation 1, static shape), with a derivative XLA CPU runs fast.

    JAX differentiates ``reduce_window(max)`` through select-and-scatter, which XLA CPU expands
    into a variadic reduce-window over four full-size iotas plus a scatter: in a ResNet-18
    training step (batch 32) the stem MaxPool took ~10% of the step. Here the forward is the
    same reduce-window, or for windows that do not overlap the maximum of their taps (below),
    and the derivative (a ``custom_jvp``, so forward and reverse mode)
    finds each window's first maximal position (row-major, as select-and-scatter and the
    Indices output pick it) in one fused pass over the shifted windows, then gathers the
    tangent there from the flattened tensor; its transpose, the gradient, is one scatter-add.
    ``slices=False`` keeps the reduce-window for windows that do not overlap too (``after_tap_loop``).
    A (32, 64, 32, 32) 3x3/2 pool's forward + backward: ~5 ms against ~100 ms (isolated,
    loaded machine); the same gradients bit for bit.
    """
    ones = (1,) * len(kernel)
    lowest = _lowest(jnp.result_type(x))
    shape = tuple(int(d) for d in jnp.shape(x))

    @jax.custom_jvp
    def window_max(v):
        # XLA CPU's reduce-window is a slow loop, and what made ``v`` (a BatchNorm and ReLU)
        # fuses into it: windows that do not overlap, which read each cell once, take the
        # maximum of their taps in one loop with that producer instead (after XLA's convolution
        # 8->8 and 16->16: 1.03-1.22x faster than the reduce-window, 2026-12-06). After a stem's
        # or a depthwise convolution's multiply-adds it is the fused loop that is slow (1.1-3x:
        # module docstring), reversed since it was measured on 2026-11-29 (small_cnn's 3->8 stem
        # at batch 32: slices 0.30 against 0.56 ms then, 0.49 against 0.27 on 2026-12-06), so
        # marked pools pass ``slices=False`` (``after_tap_loop``). Overlapping windows would
        # recompute their producer per window (a 3x3 stem into a 3x3/2 pool: 3-5x slower) and
        # keep the reduce-window, one pass per axis.
        edge = None
        if slices and all(s >= k for s, k in zip(strides, kernel)):
            edge = _edge_windows(v, kernel, strides, lo, hi, extra, channels_last)
        if edge is not None:
            return functools.reduce(lax.max, edge)
        return _reduce_window(v, lowest, lax.max, kernel, strides, ones, lo, hi, extra, channels_last)

    @window_max.defjvp
    def window_max_jvp(primals, tangents):
        (v,), (t,) = primals, tangents
        flat, inside = _first_max(v, kernel, strides, ones, lo, hi, extra, channels_last)
        # A padding cell (it wins only a window of -inf) is out of range: its tangent is zero.
        t_y = take(jnp.reshape(t, (-1,)), jnp.where(inside, flat, math.prod(shape)), mode="fill", fill_value=0)
        return window_max(v), jnp.reshape(t_y, jnp.shape(flat))

    return window_max(x)


def _edge_windows(x, kernel, strides, lo, hi, extra, channels_last: bool):
    """Each kernel position's strided window of ``x`` as if padded by repeating its edges, or
    None where some window holds only padding.

    Where every window holds an input cell, its maximum is the same over edge copies as over
    -inf padding (an edge copy repeats a cell of the same window). The windows are then slices
    and repeated edge rows, which XLA fuses into the loop taking the maximum together with
    whatever made ``x``; padding with -inf would write a padded copy first (one buffer read by
    every tap: at batch 8 on 112x112x64, 2x the reduce-window's time, most of it spent
    faulting in the fresh buffer's pages).
    """
    sizes = geo.spatial(jnp.shape(x), channels_last)
    axes = range(1, len(sizes) + 1) if channels_last else range(2, len(sizes) + 2)
    out = [(n + a + b + e - k) // s + 1 for n, k, s, a, b, e in zip(sizes, kernel, strides, lo, hi, extra)]
    if any(a >= k or s * (m - 1) - a >= n for n, k, s, a, m in zip(sizes, kernel, strides, lo, out)):
        return None
    windows = []
    for offsets in itertools.product(*(range(k) for k in kernel)):
        window = x
        for axis, n, s, a, m, o in zip(axes, sizes, strides, lo, out, offsets):
            window = _clamped_rows(window, axis, n, s, o - a, m)
        windows.append(window)
    return windows


def _clamped_rows(x, axis: int, n: int, stride: int, first: int, count: int):
    """Rows ``first + stride * i`` (i < ``count``) of ``x`` along ``axis``, each clamped to
    [0, n): a strided slice with copies of the first or last row on the sides."""
    before = 0
    while before < count and first + stride * before < 0:
        before += 1
    after = 0
    while after < count - before and first + stride * (count - 1 - after) >= n:
        after += 1
    parts = []
    if before:
        parts.append(jnp.repeat(lax.slice_in_dim(x, 0, 1, axis=axis), before, axis=axis))
    if count - before - after:
        start = first + stride * before
        stop = first + stride * (count - after - 1) + 1
        parts.append(lax.slice_in_dim(x, start, stop, stride, axis=axis))
    if after:
        parts.append(jnp.repeat(lax.slice_in_dim(x, n - 1, n, axis=axis), after, axis=axis))
    return parts[0] if len(parts) == 1 else lax.concatenate(parts, axis)


def max_pool_core(x, attrs, ctx, with_indices: bool, channels_last: bool = False):
    """MaxPool's Y (and Indices); with ``channels_last`` (N(D)HWC), Y only."""
    kernel, strides, dilations, lo, hi, extra = _pool_setup(x, attrs, ctx, channels_last)
    dilated = any(d > 1 for d in dilations)
    window = (kernel, strides, dilations, lo, hi, extra)
    idx = _argmax_window(x, *window, channels_last) if with_indices or dilated else None
    if dilated:
        # JAX cannot transpose a dilated max window (no VJP for select_and_gather), so read the
        # maxima through their indices: a gather, differentiable in both modes.
        y = take(jnp.reshape(x, (-1,)), idx, mode="clip")
    elif _taps_fit(x, kernel):
        y = _max_window(x, kernel, strides, lo, hi, extra, channels_last, slices=not attrs.get("after_tap_loop"))
    else:
        # Integer inputs, a symbolic dimension (jax.export) or int64-sized tensors, large windows.
        y = _reduce_window(x, _lowest(jnp.result_type(x)), lax.max, *window, channels_last, row_major_ties=True)
    if not with_indices:
        return (y,)
    if attrs.get("storage_order"):
        idx = _column_major(idx, jnp.shape(x))
    return y, idx


@register("MaxPool", since=1)
def max_pool_1(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``MaxPool``-1 (no Indices output)."""
    return max_pool_core(inputs[0], attrs, ctx, with_indices=False)


@register("MaxPool", since=(8, 10, 11, 12, 22))
def max_pool(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``MaxPool``, opsets 8+: Y and the flattened int64 Indices (``storage_order``).

    Indices are computed only when the model reads them (XLA drops them otherwise under jit).
    """
    return max_pool_core(inputs[0], attrs, ctx, with_indices=True)


def _window_count(spatial, kernel, strides, dilations, lo, hi, extra, include_pad: bool, dtype, channels_last):
    """How many cells each window averages: a trace-time constant of shape ``(1, 1, *out)``
    (``(1, *out, 1)`` with ``channels_last``).

    Counted in numpy, axis by axis (a window's cells are the product of its valid taps along
    each axis), so that no pool shape compiles a computation of its own. A tap is valid where it
    reads the input, or with ``include_pad`` the explicit pads too, never ceil mode's ``extra``.
    """
    counts = []
    for size, k, s, d, before, after, more in zip(spatial, kernel, strides, dilations, lo, hi, extra):
        out = (size + before + after + more - (k - 1) * d - 1) // s + 1
        position = np.arange(out)[:, None] * s + np.arange(k)[None, :] * d - before
        start, stop = (-before, size + after) if include_pad else (0, size)
        counts.append(((position >= start) & (position < stop)).sum(axis=1))
    count = functools.reduce(np.multiply.outer, counts).astype(dtype)
    return count.reshape(geo.full(count.shape, 1, channels_last))


def average_pool_core(x, attrs, ctx, channels_last: bool = False):
    """AveragePool's Y, in NC(D)HW or (``channels_last``) N(D)HWC. Half types are summed and
    divided in float32 and rounded once, as onnxruntime does (a float16 sum of five taps was
    a unit in the last place off in 36 of 40 draws)."""
    dtype = jnp.result_type(x)
    (x,) = widen_halves(x)
    window = _pool_setup(x, attrs, ctx, channels_last)
    kernel, strides, dilations, lo, hi, extra = window
    if (
        _taps_fit(x, kernel)
        and not attrs.get("after_tap_loop")
        and not any(lo + hi + extra)
        and all(d == 1 for d in dilations)
        and all(s >= k for s, k in zip(strides, kernel))
    ):
        # Windows that neither overlap nor need padding: the sum of their taps (strided
        # slices), one vectorized loop (2x2/2 over 56x56x128: 0.092 -> 0.053 ms at batch 1).
        total = functools.reduce(lax.add, _edge_windows(x, kernel, strides, lo, hi, extra, channels_last))
    else:
        total = _reduce_window(x, 0, lax.add, *window, channels_last)
    count = _window_count(
        geo.spatial(jnp.shape(x), channels_last),
        *window,
        bool(attrs.get("count_include_pad")),
        jnp.result_type(x),
        channels_last,
    )
    return (total / count).astype(dtype)


@register("AveragePool", since=(1, 7, 10, 11, 19, 22))
def average_pool(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``AveragePool``, all opsets (pads excluded from the divisor before opset 7)."""
    return (average_pool_core(inputs[0], attrs, ctx),)


def _p_norm(total, p):
    """``total ** (1/p)`` with a finite gradient at 0 (where the window is all zeros)."""
    positive = total > 0
    safe = jnp.where(positive, total, jnp.ones_like(total))
    root = jnp.sqrt(safe) if p == 2 else safe ** (1.0 / p)
    return jnp.where(positive, root, jnp.zeros_like(total))


def _abs_pow(x, p):
    return x * x if p == 2 else jnp.abs(x) ** p


@register("LpPool", since=(1, 2, 11, 18, 22))
def lp_pool(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``LpPool``, all opsets (``p`` is a float in opset 1, an int after)."""
    x = inputs[0]
    p = attrs["p"]
    if p <= 0:
        raise ctx.error(f"p={p} must be positive")
    kernel, strides, dilations, lo, hi, extra = _pool_setup(x, attrs, ctx)
    (wide,) = widen_halves(x)  # half types: powers, sum and root in float32, rounded once
    total = _reduce_window(_abs_pow(wide, p), 0, lax.add, kernel, strides, dilations, lo, hi, extra)
    return (_p_norm(total, p).astype(jnp.result_type(x)),)


def spatial_axes(x, ctx, channels_last: bool = False):
    """The spatial axes of an NC(D)HW (or, ``channels_last``, N(D)HWC) activation."""
    if jnp.ndim(x) < 3:
        raise ctx.error(f"input of shape {jnp.shape(x)} needs a batch, a channel and spatial axes")
    return tuple(range(1, jnp.ndim(x) - 1)) if channels_last else tuple(range(2, jnp.ndim(x)))


@register("GlobalAveragePool", since=(1, 22))
def global_average_pool(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``GlobalAveragePool``, all opsets."""
    x = inputs[0]
    return (jnp.mean(x, axis=spatial_axes(x, ctx), keepdims=True),)


@register("GlobalMaxPool", since=(1, 22))
def global_max_pool(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``GlobalMaxPool``, all opsets."""
    x = inputs[0]
    return (reduce_max(x, spatial_axes(x, ctx), True),)


@register("GlobalLpPool", since=(1, 2, 22))
def global_lp_pool(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``GlobalLpPool``, all opsets (``p`` is a float in opset 1, an int after)."""
    x = inputs[0]
    p = attrs["p"]
    if p <= 0:
        raise ctx.error(f"p={p} must be positive")
    (wide,) = widen_halves(x)  # half types: powers, sum and root in float32, rounded once
    total = jnp.sum(_abs_pow(wide, p), axis=spatial_axes(x, ctx), keepdims=True)
    return (_p_norm(total, p).astype(jnp.result_type(x)),)


@register("MaxUnpool", since=(9, 11, 22), static_inputs=(2,))
def max_unpool(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``MaxUnpool``, all opsets: scatters X to the flat positions I of the output.

    With ``output_shape``, I indexes the flattened ``output_shape`` tensor (the MaxPool input
    it came from), as onnxruntime does; the ReferenceEvaluator instead scatters into the
    inferred shape and pads it, which only agrees when the two shapes share their last axes.
    Out-of-range indices are dropped (JAX scatter semantics).
    """
    x, idx, output_shape = (tuple(inputs) + (None, None))[:3]
    if jnp.shape(idx) != jnp.shape(x):
        raise ctx.error(f"I of shape {jnp.shape(idx)} must have X's shape {jnp.shape(x)}")
    n = jnp.ndim(x) - 2
    kernel = geo.ints(attrs["kernel_shape"], n, 0, "kernel_shape", ctx)
    strides = geo.ints(attrs["strides"], n, 1, "strides", ctx)
    lo, hi = geo.explicit_pads(attrs, n, ctx)
    if output_shape is not None:
        shape = static_ints(output_shape)
        if len(shape) != jnp.ndim(x):
            raise ctx.error(f"output_shape {shape} must have rank {jnp.ndim(x)}")
    else:
        shape = jnp.shape(x)[:2] + tuple(
            (i - 1) * s + k - a - b for i, s, k, a, b in zip(jnp.shape(x)[2:], strides, kernel, lo, hi)
        )
    flat = jnp.zeros((math.prod(shape),), jnp.result_type(x))
    flat = flat.at[jnp.reshape(idx, (-1,))].set(jnp.reshape(x, (-1,)), mode="drop")
    return (jnp.reshape(flat, shape),)

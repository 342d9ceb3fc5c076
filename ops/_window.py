"""Layouts and window geometry shared by the convolution and pooling ops (ops/conv.py,
ops/pool.py), and the windows of an array that a kernel position reads.

The helpers take ``channels_last``: False for ONNX's own NC(D)HW with OI(D)HW weights, True
for N(D)HWC activations with (D)HWIO weights, the layout the ``channels_last`` graph pass
(jonnx/optimize/layout.py) runs CNN chains in through the internal ops of
ops/channels_last.py. One implementation serves both.

Geometry follows the ONNX spec: explicit ``pads`` are ``[x1_begin, x2_begin, ..., x1_end,
...]``; ``SAME_*`` pads to ``ceil(in / stride)`` outputs with the odd cell at the end
(``SAME_UPPER``) or the beginning (``SAME_LOWER``); ``ceil_mode`` adds a last, partial window
only when it starts inside the input or its left padding, and cells of that extension are
never counted by AveragePool's divisor.
"""

from __future__ import annotations

import functools
import itertools
import operator

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jonnx.ops._util import static_sizes

# --------------------------------------------------------------------------- layout


def dimension_numbers(nd: int, channels_last: bool = False, kernel_layout: str = "HWIO") -> lax.ConvDimensionNumbers:
    """The layout XLA sees for an ``nd``-spatial convolution: ONNX's own NC(D)HW / OI(D)HW, or
    N(D)HWC activations with weights in ``kernel_layout`` (see ``conv.KERNEL_LAYOUTS``) when
    ``channels_last``."""
    spatial = "DHW"[-nd:] if nd <= 3 else "".join(chr(ord("a") + i) for i in range(nd))
    lhs = "N" + spatial + "C" if channels_last else "NC" + spatial
    rhs = kernel_layout.replace("HW", spatial) if channels_last else "OI" + spatial
    return lax.conv_dimension_numbers((1,) * (nd + 2), (1,) * (nd + 2), (lhs, rhs, lhs))


def spatial(shape, channels_last: bool) -> tuple:
    """The spatial dims of an activation's (or, for weights, the kernel's) ``shape``."""
    return tuple(shape[1:-1]) if channels_last else tuple(shape[2:])


def full(spatial, fill, channels_last: bool) -> tuple:
    """A per-axis tuple for a whole activation: ``spatial`` on the spatial axes, ``fill`` on
    the batch and channel axes."""
    spatial = tuple(spatial)
    return (fill,) + spatial + (fill,) if channels_last else (fill, fill) + spatial


def with_spatial(shape, spatial, channels_last: bool) -> tuple:
    """``shape`` with its spatial sizes replaced by ``spatial`` (batch and channels kept)."""
    return tuple(n if e is None else e for n, e in zip(shape, full(spatial, None, channels_last)))


# --------------------------------------------------------------------------- geometry


def ints(value, n: int, default: int, what: str, ctx) -> tuple[int, ...]:
    """An optional per-axis attribute as ``n`` ints (``default`` everywhere when absent)."""
    if value is None or len(value) == 0:
        return (default,) * n
    value = tuple(int(v) for v in value)
    if len(value) != n:
        raise ctx.error(f"{what} {value} must have {n} entries, one per spatial axis")
    return value


def strides_dilations(attrs, n: int, ctx) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A convolution-like node's ``strides`` and ``dilations``, each ``n`` positive ints."""
    return ints(attrs["strides"], n, 1, "strides", ctx), ints(attrs["dilations"], n, 1, "dilations", ctx)


def explicit_pads(attrs, n: int, ctx) -> tuple[tuple[int, ...], tuple[int, ...]]:
    pads = attrs.get("pads")
    if pads is None or len(pads) == 0:
        return (0,) * n, (0,) * n
    pads = tuple(int(p) for p in pads)
    if len(pads) != 2 * n:
        raise ctx.error(f"pads {pads} must have {2 * n} entries (begins, then ends)")
    if any(p < 0 for p in pads):
        raise ctx.error(f"pads {pads} must not be negative")
    return pads[:n], pads[n:]


def auto_pad(attrs) -> str:
    mode = attrs.get("auto_pad") or "NOTSET"
    return mode.decode() if isinstance(mode, bytes) else mode


def window_pads(in_shape, kernel, strides, dilations, attrs, ctx, *, ceil_mode=False):
    """Per-axis ``(lo, hi, extra)`` padding for a sliding window (Conv and the pools).

    ``lo``/``hi`` are the pads ONNX defines (explicit or from ``auto_pad``); ``extra`` is the
    additional end padding that ``ceil_mode`` needs for its last, partial window.
    """
    n = len(in_shape)
    mode = auto_pad(attrs)
    span = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    if mode in ("SAME_UPPER", "SAME_LOWER"):
        lo, hi = [], []
        for size, s, w in zip(in_shape, strides, span):
            out = -(-size // s)
            total = max(0, (out - 1) * s + w - size)
            small, big = total // 2, total - total // 2
            lo.append(small if mode == "SAME_UPPER" else big)
            hi.append(big if mode == "SAME_UPPER" else small)
        lo, hi = tuple(lo), tuple(hi)
    elif mode == "VALID":
        lo, hi = (0,) * n, (0,) * n
    elif mode == "NOTSET":
        lo, hi = explicit_pads(attrs, n, ctx)
    else:
        raise ctx.error(f"auto_pad {mode!r} is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID")
    extra = []
    for size, s, w, a, b in zip(in_shape, strides, span, lo, hi):
        if size + a + b < w:
            raise ctx.error(
                f"the window spans {w} cells but the padded input has only {size + a + b} "
                f"(input spatial shape {tuple(in_shape)})"
            )
        out = (size + a + b - w) // s + 1
        if ceil_mode and mode == "NOTSET":
            out_ceil = -(-(size + a + b - w) // s) + 1
            # The last window must start inside the input or its left padding.
            if (out_ceil - 1) * s >= size + a:
                out_ceil -= 1
            out = max(out, out_ceil)
        extra.append(max(0, (out - 1) * s + w - (size + a + b)))
    return lo, hi, tuple(extra)


def kernel_attr(attrs, w_shape, ctx) -> None:
    kernel = attrs.get("kernel_shape")
    if kernel is not None and len(kernel) and tuple(kernel) != tuple(w_shape):
        raise ctx.error(f"kernel_shape {tuple(kernel)} does not match the weights' spatial shape {tuple(w_shape)}")


def add_bias(y, b, ctx, channels_last: bool = False):
    if b is None:
        return y
    channels = jnp.shape(y)[-1 if channels_last else 1]
    if jnp.ndim(b) != 1 or jnp.shape(b)[0] != channels:
        raise ctx.error(f"bias of shape {jnp.shape(b)} does not match {channels} output channels")
    return y + (b if channels_last else jnp.reshape(b, (1, -1) + (1,) * (jnp.ndim(y) - 2)))


# --------------------------------------------------------------------------- windows


def pad_spatial(x, lo, hi, channels_last: bool = False):
    if not any(lo) and not any(hi):
        return x
    return jnp.pad(x, full(zip(lo, hi), (0, 0), channels_last))


def taps(xp, kernel, strides, dilations, out, channels_last: bool = False, parts=None, opaque: bool = False):
    """For each kernel position (row-major), the strided window of ``xp`` it multiplies (of
    ``parts[i]``, the same shape, for the ``i``-th position when ``parts`` is given).

    ``opaque``: unstrided windows of static shapes are cut at offsets XLA cannot see
    (:func:`opaque_window`)."""
    shape = jnp.shape(xp)
    opaque = opaque and static_unstrided(shape, strides)
    for i, offsets in enumerate(itertools.product(*(range(k) for k in kernel))):
        first = tuple(o * d for o, d in zip(offsets, dilations))
        start = full(first, 0, channels_last)
        limit = with_spatial(shape, (f + (n - 1) * s + 1 for f, n, s in zip(first, out, strides)), channels_last)
        source = xp if parts is None else parts[i]
        if opaque:
            yield opaque_window(source, start, tuple(int(n) for n in limit))
        else:
            yield lax.slice(source, start, limit, full(strides, 1, channels_last))


def stacked_windows(xp, kernel, strides, dilations, out, channels_last: bool, at: int):
    """Every kernel position's strided window of ``xp`` (as :func:`taps` gives them) in one
    array: each spatial axis becomes its ``out`` length, and the kernel positions become
    ``len(kernel)`` axes, row-major, from axis ``at`` of the result on. With ``xp`` N(D)HWC,
    ``at = 1 + rank`` gives (N, *out, *kernel, C); with ``xp`` NC(D)HW, ``at = 2`` gives
    (N, C, *kernel, *out).

    Built one spatial axis at a time (the last first, each new kernel axis inserted before
    those already made): k slices of the array so far per axis, 6 for a 3 x 3 kernel and 14
    for a 7 x 7, where stacking each position's window takes 9 and 49. XLA CPU compiles each
    slice as a kernel of its own: quantized ResNet-50s, whose convolutions are 8-bit products
    over their stacked windows, compile 1.1-1.3 s faster this way and run 4-8% faster. (Not
    for the float im2col lowering, which is differentiated: this form's gradient materializes
    the intermediate windows, and a ResNet-18 training step ran 3% slower with it.)
    """
    rank = len(kernel)
    first = 1 if channels_last else 2
    for done, axis in enumerate(reversed(range(rank))):
        dim = first + axis + (done if at <= first else 0)  # inserted kernel axes shift the rest
        k, s, d, o = kernel[axis], strides[axis], dilations[axis], out[axis]
        xp = jnp.stack([lax.slice_in_dim(xp, j * d, j * d + (o - 1) * s + 1, s, axis=dim) for j in range(k)], axis=at)
    return xp


def tree_sum(terms):
    """The sum of ``terms`` (at least one) as a balanced tree of pairwise adds.

    XLA keeps a float sum in the order it is written. A chain of n adds in one fused loop is a
    dependency chain n adds long per vector of outputs, and with an activation after it
    (SiLU's exp and divide) the loop waits on that latency rather than on its loads: a 16-term
    1x1 expansion with SiLU at 112x112x96 took 0.71 ms as a chain and 0.44 as a tree of depth
    4 (0.26 against 0.20 with ReLU6). The tree is also the more accurate order."""
    terms = list(terms)
    while len(terms) > 1:
        terms = [a + b for a, b in zip(terms[::2], terms[1::2])] + terms[len(terms) & ~1 :]
    return terms[0]


def tap_sum(items, taps, product=operator.mul):
    """The sum over kernel positions of ``product(item, tap)``: ``items`` one per position (the
    windows, by default multiplied by their taps), ``taps`` indexed by position."""
    return tree_sum(product(item, tap) for item, tap in zip(items, taps))


def static_unstrided(shape, strides) -> bool:
    """Whether windows of an array of ``shape`` can be cut (or placed) at opaque offsets:
    unit strides and static sizes."""
    return all(s == 1 for s in strides) and static_sizes(shape)


def opaque_offsets(start: tuple[int, ...]) -> tuple:
    """``start`` as int32 scalars behind an optimization barrier: offsets XLA cannot see."""
    return lax.optimization_barrier(tuple(np.int32(a) for a in start))


@functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2))
def opaque_window(x, start: tuple[int, ...], limit: tuple[int, ...]):
    """``lax.slice(x, start, limit)`` at offsets XLA cannot see.

    XLA rewrites the window of a padded array that covers exactly the unpadded one (a 3x3's
    centre tap) to that array, and then fuses the elementwise work that made it (a stem's 27
    multiply-adds, a BatchNorm and ReLU6) into the depthwise loop a second time, beside the
    padded copy the other taps read. Behind an optimization barrier the offsets are opaque and
    every tap reads the one padded buffer: MobileNetV2 0.93-0.94 of the time at batch 1, 0.95
    at batch 32 (docs/performance.md). Derivatives are the plain slice's: a dynamic slice's
    transposes (dynamic updates) made a depthwise gradient up to 1.2x slower.
    """
    sizes = tuple(b - a for a, b in zip(start, limit))
    return lax.dynamic_slice(x, opaque_offsets(start), sizes, allow_negative_indices=False)


@opaque_window.defjvp
def _opaque_window_jvp(start, limit, primals, tangents):
    (x,), (dx,) = primals, tangents
    return opaque_window(x, start, limit), lax.slice(dx, start, limit)


def out_spatial(xp, kernel, strides, dilations, channels_last: bool = False):
    return tuple(
        (size - (k - 1) * d - 1) // s + 1
        for size, k, s, d in zip(spatial(jnp.shape(xp), channels_last), kernel, strides, dilations)
    )


def opaque_place(t, start: tuple[int, ...], shape: tuple[int, ...]):
    """``t`` placed at ``start`` in zeros of ``shape``, at offsets XLA cannot see; its
    transpose is the window of the cotangent at those offsets, like :func:`opaque_window`."""
    zeros = jnp.zeros(shape, t.dtype)
    return lax.dynamic_update_slice(zeros, t, opaque_offsets(start), allow_negative_indices=False)

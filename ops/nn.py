"""Neural-network core ops: convolutions (Conv, ConvTranspose, DeformConv, Col2Im), pooling
(Average/Max/Lp, their Global forms, MaxUnpool) and products (Gemm, MatMul, Einsum).

Each Conv or ConvTranspose is one ``lax.conv_general_dilated`` (or a lowering of it to dots
on CPU) and each pool one ``lax.reduce_window``, so XLA sees whole convolutions and windows, never
per-position Python. The convolution and pooling helpers take ``channels_last``: False for
ONNX's own NC(D)HW with OI(D)HW weights, True for N(D)HWC activations with (D)HWIO weights,
the layout the ``channels_last`` graph pass (jonnx/optimize/layout.py) runs CNN chains in
through the internal ops of ops/channels_last.py. One implementation serves both.

Geometry follows the ONNX spec: explicit ``pads`` are ``[x1_begin, x2_begin, ..., x1_end,
...]``; ``SAME_*`` pads to ``ceil(in / stride)`` outputs with the odd cell at the end
(``SAME_UPPER``) or the beginning (``SAME_LOWER``); ``ceil_mode`` adds a last, partial window
only when it starts inside the input or its left padding, and cells of that extension are
never counted by AveragePool's divisor.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.custom_derivatives import SymbolicZero

from jonnx._registry import Attrs, Inputs, OpContext, Outputs, register
from jonnx.ops._util import index_dtype, spread_product, static_ints, static_sizes

# --------------------------------------------------------------------------- layout


def _dimension_numbers(nd: int, channels_last: bool = False, kernel_layout: str = "HWIO") -> lax.ConvDimensionNumbers:
    """The layout XLA sees for an ``nd``-spatial convolution: ONNX's own NC(D)HW / OI(D)HW, or
    N(D)HWC activations with weights in ``kernel_layout`` (see ``KERNEL_LAYOUTS``) when
    ``channels_last``."""
    spatial = "DHW"[-nd:] if nd <= 3 else "".join(chr(ord("a") + i) for i in range(nd))
    lhs = "N" + spatial + "C" if channels_last else "NC" + spatial
    rhs = kernel_layout.replace("HW", spatial) if channels_last else "OI" + spatial
    return lax.conv_dimension_numbers((1,) * (nd + 2), (1,) * (nd + 2), (lhs, rhs, lhs))


def _spatial(shape, channels_last: bool) -> tuple:
    """The spatial dims of an activation's (or, for weights, the kernel's) ``shape``."""
    return tuple(shape[1:-1]) if channels_last else tuple(shape[2:])


def _full(spatial, fill, channels_last: bool) -> tuple:
    """A per-axis tuple for a whole activation: ``spatial`` on the spatial axes, ``fill`` on
    the batch and channel axes."""
    spatial = tuple(spatial)
    return (fill,) + spatial + (fill,) if channels_last else (fill, fill) + spatial


def _with_spatial(shape, spatial, channels_last: bool) -> tuple:
    """``shape`` with its spatial sizes replaced by ``spatial`` (batch and channels kept)."""
    return tuple(n if e is None else e for n, e in zip(shape, _full(spatial, None, channels_last)))


# --------------------------------------------------------------------------- geometry


def _ints(value, n: int, default: int, what: str, ctx) -> tuple[int, ...]:
    """An optional per-axis attribute as ``n`` ints (``default`` everywhere when absent)."""
    if value is None or len(value) == 0:
        return (default,) * n
    value = tuple(int(v) for v in value)
    if len(value) != n:
        raise ctx.error(f"{what} {value} must have {n} entries, one per spatial axis")
    return value


def _strides_dilations(attrs, n: int, ctx) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A convolution-like node's ``strides`` and ``dilations``, each ``n`` positive ints."""
    return _ints(attrs["strides"], n, 1, "strides", ctx), _ints(attrs["dilations"], n, 1, "dilations", ctx)


def _explicit_pads(attrs, n: int, ctx) -> tuple[tuple[int, ...], tuple[int, ...]]:
    pads = attrs.get("pads")
    if pads is None or len(pads) == 0:
        return (0,) * n, (0,) * n
    pads = tuple(int(p) for p in pads)
    if len(pads) != 2 * n:
        raise ctx.error(f"pads {pads} must have {2 * n} entries (begins, then ends)")
    if any(p < 0 for p in pads):
        raise ctx.error(f"pads {pads} must not be negative")
    return pads[:n], pads[n:]


def _auto_pad(attrs) -> str:
    mode = attrs.get("auto_pad") or "NOTSET"
    return mode.decode() if isinstance(mode, bytes) else mode


def _window_pads(in_shape, kernel, strides, dilations, attrs, ctx, *, ceil_mode=False):
    """Per-axis ``(lo, hi, extra)`` padding for a sliding window (Conv and the pools).

    ``lo``/``hi`` are the pads ONNX defines (explicit or from ``auto_pad``); ``extra`` is the
    additional end padding that ``ceil_mode`` needs for its last, partial window.
    """
    n = len(in_shape)
    mode = _auto_pad(attrs)
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
        lo, hi = _explicit_pads(attrs, n, ctx)
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


def _kernel_attr(attrs, w_shape, ctx) -> None:
    kernel = attrs.get("kernel_shape")
    if kernel is not None and len(kernel) and tuple(kernel) != tuple(w_shape):
        raise ctx.error(f"kernel_shape {tuple(kernel)} does not match the weights' spatial shape {tuple(w_shape)}")


def _add_bias(y, b, ctx, channels_last: bool = False):
    if b is None:
        return y
    channels = jnp.shape(y)[-1 if channels_last else 1]
    if jnp.ndim(b) != 1 or jnp.shape(b)[0] != channels:
        raise ctx.error(f"bias of shape {jnp.shape(b)} does not match {channels} output channels")
    return y + (b if channels_last else jnp.reshape(b, (1, -1) + (1,) * (jnp.ndim(y) - 2)))


# --------------------------------------------------------------------------- Conv


# Weight layouts a channels-last Conv reads, "HW" standing for the spatial axes: "HWIO", what
# XLA's channels-last convolution and most lowerings read; "OIHW", ONNX's own, kept for big 1x1
# kernels, which the product reads through a reshape; "IHWO", read by the tap-products lowering
# as one (C, taps x M) matrix through a reshape. The layout pass picks one per kernel
# (``kernel_layout_for``) and prepares that copy once per parameter set.
KERNEL_LAYOUTS = ("HWIO", "OIHW", "IHWO")


def _kernel_dims(w_shape, layout: str) -> tuple:
    """``(M, C/group, kernel)`` of weights of shape ``w_shape`` in ``layout``."""
    if layout == "OIHW":
        return w_shape[0], w_shape[1], tuple(w_shape[2:])
    if layout == "HWIO":
        return w_shape[-1], w_shape[-2], tuple(w_shape[:-2])
    return w_shape[-1], w_shape[0], tuple(w_shape[1:-1])


def kernel_permutation(layout: str, rank: int) -> tuple[int, ...]:
    """The ``perm`` of a Transpose taking rank-``rank`` OI(D)HW weights to ``layout``."""
    spatial = tuple(range(2, rank))
    return {"OIHW": (0, 1, *spatial), "HWIO": (*spatial, 1, 0), "IHWO": (1, *spatial, 0)}[layout]


def _to_hwio(w, layout: str):
    """Weights in ``layout`` relaid out (D)HWIO."""
    if layout == "HWIO":
        return w
    from_oihw = kernel_permutation(layout, jnp.ndim(w))
    return jnp.transpose(w, tuple(from_oihw.index(a) for a in kernel_permutation("HWIO", jnp.ndim(w))))


def convolve(x, w, b, attrs, ctx, channels_last: bool = False, kernel_layout: str = "HWIO"):
    """A Conv node's computation (shared with ConvInteger and QLinearConv): one XLA convolution
    (or one of the lowerings below) with the node's strides, dilations, groups and pads or
    auto_pad, plus the bias.

    With ``channels_last``, ``x`` is N(D)HWC, ``w`` is in ``kernel_layout`` (one of
    ``KERNEL_LAYOUTS``) and the result is N(D)HWC; otherwise all are ONNX's own.
    """
    if jnp.ndim(x) < 3 or jnp.ndim(w) != jnp.ndim(x):
        raise ctx.error(f"X of shape {jnp.shape(x)} and W of shape {jnp.shape(w)} need the same rank, at least 3")
    if kernel_layout not in KERNEL_LAYOUTS:
        raise ctx.error(f"kernel_layout {kernel_layout!r} is not one of {', '.join(KERNEL_LAYOUTS)}")
    layout = kernel_layout if channels_last else "OIHW"
    n = jnp.ndim(x) - 2
    group = int(attrs["group"])
    c_in = jnp.shape(x)[-1] if channels_last else jnp.shape(x)[1]
    m, w_in, kernel = _kernel_dims(jnp.shape(w), layout)
    if group < 1 or c_in != w_in * group or m % group:
        raise ctx.error(
            f"X has {c_in} channels and W has shape {jnp.shape(w)}: with group={group}, W must be "
            f"(M, C/group, ...) with M divisible by group"
        )
    _kernel_attr(attrs, kernel, ctx)
    strides, dilations = _strides_dilations(attrs, n, ctx)
    lo, hi, _ = _window_pads(_spatial(jnp.shape(x), channels_last), kernel, strides, dilations, attrs, ctx)
    w_shape = (*kernel, w_in, m) if channels_last else jnp.shape(w)
    lowering = conv_lowering(
        jnp.shape(x), w_shape, strides, group, jnp.result_type(x, w), channels_last=channels_last, kernel_layout=layout
    )
    if lowering == "xla":
        y = lax.conv_general_dilated(
            x,
            w,
            window_strides=strides,
            padding=tuple(zip(lo, hi)),
            rhs_dilation=dilations,
            dimension_numbers=_dimension_numbers(n, channels_last, layout),
            feature_group_count=group,
            precision=ctx.precision,
        )
    else:
        if channels_last and layout not in _READS[lowering]:
            # The layout pass prepares the layout the lowering reads (``kernel_layout_for``); a
            # direct call of the internal op may pass another, relaid-out here on every call.
            w, layout = _to_hwio(w, layout), "HWIO"
        y = _LOWERINGS[lowering](x, w, strides, dilations, lo, hi, ctx.precision, channels_last, layout)
    return _add_bias(y, b, ctx, channels_last)


# Conv lowerings. XLA's CPU convolution is slow next to its dot (by 2-30x on ResNet/MobileNet
# layers, and worse for gradients), so on CPU a Conv is lowered by its static shapes to dots
# and fused elementwise work; elsewhere (cuDNN, TPU) XLA's convolution is the fast path. Every
# lowering computes the same sums as the convolution (only the float summation order differs)
# and is differentiable by plain JAX: the backward of a dot is dots, of a slice a pad.
# ``jonnx.ops.nn.CONV_LOWERING`` forces one choice ("xla" or "auto") for measurement and tests.
CONV_LOWERING = "auto"
# A channels-last 1x1 convolution over at most this many channels runs as "channel_taps".
TAPS_1X1_CHANNELS = 16
# A channels-last 1x1 kernel of at least this many weights is read as stored (below).
STORED_1X1_MIN = 1 << 18
# "tap_products" (below): the input channels of the kernels laid out for it (at least
# TAP_PRODUCTS_CHANNELS, or within TAP_PRODUCTS_NARROW), the most bytes its product of the input
# with every tap's weights may take, and the fewest output cells (batch x map) it needs under
# TAP_PRODUCTS_CHANNELS channels.
TAP_PRODUCTS_CHANNELS = 512
TAP_PRODUCTS_NARROW = (48, 64)
TAP_PRODUCTS_BYTES = 8 << 20
TAP_PRODUCTS_MIN_CELLS = 784
# An NC(D)HW 1x1 convolution over maps of at least this many cells is a product batched over
# the images (``_per_image_product``).
PER_IMAGE_MIN_CELLS = 784


def kernel_layout_for(w_shape, group: int, strides) -> str:
    """The layout (``KERNEL_LAYOUTS``) a channels-last Conv takes these OI(D)HW weights in,
    chosen by the layout pass without the input's size, which it may not know:

    * "OIHW", as stored: a 1x1 kernel without groups that the product lowering (or, off CPU,
      XLA's convolution) reads through a reshape, big enough for a relayout copy kept beside
      the weights to matter, over more than ``TAPS_1X1_CHANNELS`` channels (fewer run as
      ``channel_taps``, which reads (D)HWIO). The product then packs the weights transposed on
      each call: no cost measured on ResNet-50 at batch 1, where it applies to the kernels of
      at least 2^18 elements, but 3% on MobileNetV2 when every 1x1 kernel took it;
    * "IHWO": on CPU, a 2-D kernel of at most 3x3 without groups or strides over the channel
      counts where XLA's convolution is slowest (at least ``TAP_PRODUCTS_CHANNELS``, or within
      ``TAP_PRODUCTS_NARROW``), for "tap_products" on inputs small enough (``conv_lowering``).
      On bigger ones XLA's convolution reads it 0-6% slower than (D)HWIO (batch 32; batch 1
      on 28x28 and larger maps);
    * "HWIO" otherwise.
    """
    kernel = tuple(w_shape[2:])
    if len(w_shape) < 3 or group != 1:
        return "HWIO"
    if all(k == 1 for k in kernel):
        big = w_shape[1] > TAPS_1X1_CHANNELS and w_shape[0] * w_shape[1] >= STORED_1X1_MIN
        return "OIHW" if big else "HWIO"
    cpu = CONV_LOWERING == "auto" and jax.default_backend() == "cpu"
    narrow = TAP_PRODUCTS_NARROW[0] <= w_shape[1] <= TAP_PRODUCTS_NARROW[1]
    small_2d = len(kernel) == 2 and max(kernel) <= 3
    if cpu and small_2d and all(s == 1 for s in strides) and (w_shape[1] >= TAP_PRODUCTS_CHANNELS or narrow):
        return "IHWO"
    return "HWIO"


def conv_lowering(
    x_shape, w_shape, strides, group: int, dtype, *, channels_last: bool = False, kernel_layout: str = "HWIO"
) -> str:
    """How a Conv with these static shapes runs: ``"xla"``, ``"matmul"`` (1x1 kernels),
    ``"depthwise"`` (shifted multiply-adds), ``"im2col"`` (one dot over stacked shifted slices),
    ``"channel_taps"`` (channels-last over few input channels: broadcast multiply-adds) or
    ``"tap_products"`` (channels-last with I(D)HWO weights on small inputs: one dot for all
    taps, then shifted adds).

    Shapes are NC(D)HW / OI(D)HW, or N(D)HWC / (D)HWIO with ``channels_last`` whatever the
    weights' ``kernel_layout``."""
    if CONV_LOWERING != "auto" or jax.default_backend() != "cpu":
        return "xla"
    # Half precision stays with XLA, which accumulates its convolutions in float32.
    if dtype not in (jnp.float32, jnp.float64) or len(x_shape) < 3:
        return "xla"
    if channels_last:
        c_in, m, w_in, kernel = x_shape[-1], w_shape[-1], w_shape[-2], tuple(w_shape[:-2])
    else:
        c_in, m, w_in, kernel = x_shape[1], w_shape[0], w_shape[1], tuple(w_shape[2:])
    taps = math.prod(kernel)
    if group == 1 and taps == 1:
        if channels_last and c_in <= TAPS_1X1_CHANNELS:
            # A product over at most 16 channels is a poor dot; as 16 broadcast multiply-adds it
            # is one fused loop (MobileNetV2's 16->96 at 112x112 with its BatchNorm and ReLU6:
            # batch 1 0.39 against 2.43 ms, batch 32 53 against 107; 24 channels: 0.50 against
            # 0.40, the dot wins).
            return "channel_taps"
        return "matmul"
    if group == c_in and group > 1 and w_in == 1 and m == c_in:
        return "depthwise"
    # A symbolic size (jax.export) counts as large.
    spatial = x_shape[1:-1] if channels_last else x_shape[2:]
    out_cells = math.prod(
        -(-d // st) if isinstance(d, (int, np.integer)) else 1 << 30 for d, st in zip(spatial, strides)
    )
    batch = x_shape[0] if isinstance(x_shape[0], (int, np.integer)) else 1 << 30
    cells = batch * out_cells
    product_bytes = cells * taps * m * np.dtype(dtype).itemsize
    if (
        kernel_layout == "IHWO"
        and all(s == 1 for s in strides)
        and product_bytes <= TAP_PRODUCTS_BYTES
        and (c_in >= TAP_PRODUCTS_CHANNELS or cells >= TAP_PRODUCTS_MIN_CELLS)
    ):
        # XLA's 3x3 convolution runs at 80-105 GFLOP/s over 48-64 channels and over 512 on small
        # maps, where one product of the input with all taps' weights and the shifted adds run
        # at 120-150 (batch 1, 3x3 over 512 on 7x7: 1.5-1.9x faster; over 64 on 56x56 1.3x).
        # Once that product outgrows the cache it loses (64 on 56x56 at batch 4: 2.9x slower;
        # 512 on 7x7 at batch 32: 1.4x), and on few cells XLA's convolution is quick (64 on
        # 14x14: 1.45x slower). docs/performance.md has the crossovers.
        return "tap_products"
    # k x k: XLA's convolution, except where its output is tiny (at most 16 cells: a ResNet's
    # last stage at 64x64 inputs), where it is pathological on CPU (512->512 with a 2x2 output,
    # batch 32, forward and backward: 826 ms against 21 with im2col). Elsewhere it beats im2col
    # 1.2-2x at batch 32 in both layouts and ties it at batch 1 channels-last: a ResNet-18
    # training step went from 700 to 528 ms and ResNet-50 batch 32 from 4476 to 3479 ms (first
    # call 8.2 to 5.3 s) when im2col was narrowed to tiny outputs (docs/performance.md).
    batched = batch > 1
    if channels_last and c_in <= 3 and group == 1 and c_in * taps <= 75:
        # A small image stem (3x3 or 5x5 over RGB): one fused loop of broadcast multiply-adds
        # beats XLA's channels-last convolution 2-4x (MobileNetV2's 3x3/2 3->32 at 224: batch
        # 1 0.25 against 1.01 ms, batch 32 23 against 64; a 5x5/2 3->32 1.2 against 2.6 and 51
        # against 114), not a 7x7 (147 taps: 6.0 against 2.3 ms, docs/performance.md).
        return "channel_taps"
    if channels_last and c_in <= 3:
        # An image stem (RGB or grey): XLA's channels-last convolution beats im2col, whose
        # windows of 3 channels make a poor dot operand. A 7x7/2 64-channel stem: batch 32
        # 183 ms against 658 (494 for NCHW im2col), batch 1 4.4 against 15.0 ms; its
        # weight gradient (batch 32, 64x64) 59 against 131 ms (docs/performance.md).
        return "xla"
    if group == 1 and taps <= 49 and c_in * taps <= 8192:
        if out_cells <= 16:
            return "im2col"
        if not batched and not channels_last and c_in * taps <= 256:
            # A few-channel NCHW stem at batch 1 (MobileNetV2's: 3.4x onnxruntime with XLA's
            # stem against 2.2x with im2col, before channels-last).
            return "im2col"
    return "xla"


def _pad_spatial(x, lo, hi, channels_last: bool = False):
    if not any(lo) and not any(hi):
        return x
    return jnp.pad(x, _full(zip(lo, hi), (0, 0), channels_last))


def _taps(xp, kernel, strides, dilations, out, channels_last: bool = False, parts=None, opaque: bool = False):
    """For each kernel position (row-major), the strided window of ``xp`` it multiplies (of
    ``parts[i]``, the same shape, for the ``i``-th position when ``parts`` is given).

    ``opaque``: unstrided windows of static shapes are cut at offsets XLA cannot see
    (:func:`_opaque_window`)."""
    shape = jnp.shape(xp)
    opaque = opaque and _static_unstrided(shape, strides)
    for i, offsets in enumerate(itertools.product(*(range(k) for k in kernel))):
        first = tuple(o * d for o, d in zip(offsets, dilations))
        start = _full(first, 0, channels_last)
        limit = _with_spatial(shape, (f + (n - 1) * s + 1 for f, n, s in zip(first, out, strides)), channels_last)
        source = xp if parts is None else parts[i]
        if opaque:
            yield _opaque_window(source, start, tuple(int(n) for n in limit))
        else:
            yield lax.slice(source, start, limit, _full(strides, 1, channels_last))


def _static_unstrided(shape, strides) -> bool:
    """Whether windows of an array of ``shape`` can be cut (or placed) at opaque offsets:
    unit strides and static sizes."""
    return all(s == 1 for s in strides) and static_sizes(shape)


def _opaque_offsets(start: tuple[int, ...]) -> tuple:
    """``start`` as int32 scalars behind an optimization barrier: offsets XLA cannot see."""
    return lax.optimization_barrier(tuple(np.int32(a) for a in start))


def _tap_sum(items, taps, product=operator.mul):
    """The sum over kernel positions of ``product(item, tap)``: ``items`` one per position (the
    windows, by default multiplied by their taps), ``taps`` indexed by position."""
    return functools.reduce(operator.add, (product(item, tap) for item, tap in zip(items, taps)))


@functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2))
def _opaque_window(x, start: tuple[int, ...], limit: tuple[int, ...]):
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
    return lax.dynamic_slice(x, _opaque_offsets(start), sizes, allow_negative_indices=False)


@_opaque_window.defjvp
def _opaque_window_jvp(start, limit, primals, tangents):
    (x,), (dx,) = primals, tangents
    return _opaque_window(x, start, limit), lax.slice(dx, start, limit)


def _out_spatial(xp, kernel, strides, dilations, channels_last: bool = False):
    return tuple(
        (size - (k - 1) * d - 1) // s + 1
        for size, k, s, d in zip(_spatial(jnp.shape(xp), channels_last), kernel, strides, dilations)
    )


def _conv_matmul(x, w, strides, dilations, lo, hi, precision, channels_last, layout):
    """A 1x1 convolution: a product over channels of the (padded, strided) input. The weights
    are read through a reshape in any layout, never a transpose (XLA makes a slow copy of a
    transposed weight argument, not of the reshaped one)."""
    ones = (1,) * (jnp.ndim(x) - 2)
    xp = _pad_spatial(x, lo, hi, channels_last)
    (xs,) = _taps(
        xp, ones, strides, dilations, _out_spatial(xp, ones, strides, dilations, channels_last), channels_last
    )
    if layout == "OIHW":
        weights, spec = jnp.reshape(w, jnp.shape(w)[:2]), "mc"
    else:  # (1, ..., C, M) or (C, 1, ..., M)
        weights, spec = jnp.reshape(w, (-1, jnp.shape(w)[-1])), "cm"
    if not channels_last and _cells(jnp.shape(xs)[2:]) >= PER_IMAGE_MIN_CELLS:
        return _per_image_product(weights, xs, precision)
    lhs, out = ("n...c", "n...m") if channels_last else ("nc...", "nm...")
    return jnp.einsum(f"{lhs},{spec}->{out}", xs, weights, precision=precision)


def _cells(spatial) -> int:
    """The number of cells of a map of these sizes; 0 if one is symbolic (jax.export)."""
    return math.prod(spatial) if static_sizes(spatial) else 0


def _per_image_product(weights, xs, precision):
    """``weights`` (M, C) times each image of ``xs`` (N, C, D1, ...): (N, M, D1, ...), as a dot
    batched over the images, so that every operand and the result keep their NC(D)HW order.

    As one product over the channels (the einsum) XLA computes (M, N, D1, ...), and the layers
    around it read that through transposed copies, in the gradient too: a MobileNetV2 training
    step (batch 8, 224x224) spent 40% of its time in such copies. On maps of at least
    ``PER_IMAGE_MIN_CELLS`` cells this form took, by layer (batch 2-32), 0.12-0.67 of the time
    forward and backward, 0.40-1.14 forward alone; on smaller maps the per-image products are
    too thin (7x7, batch 8: forward 2.1-3.3x slower). docs/performance.md has the table. The
    weights' broadcast over the batch is what a batched dot needs.
    """
    n, c = jnp.shape(xs)[:2]
    m = jnp.shape(weights)[0]
    x3 = jnp.reshape(xs, (n, c, -1))
    per_image = jnp.broadcast_to(weights, (n, m, c))
    y = lax.dot_general(per_image, x3, (((2,), (1,)), ((0,), (0,))), precision=precision)
    return jnp.reshape(y, (n, m, *jnp.shape(xs)[2:]))


def _conv_depthwise(x, w, strides, dilations, lo, hi, precision, channels_last, layout):
    """A depthwise convolution: per-channel shifted multiply-adds, which XLA fuses into one loop."""
    kernel = _kernel_dims(jnp.shape(w), layout)[2]
    xp = _pad_spatial(x, lo, hi, channels_last)
    out = _out_spatial(xp, kernel, strides, dilations, channels_last)
    if channels_last:
        taps = jnp.reshape(w, (-1, jnp.shape(w)[-1]))  # (K, C): a tap's weights broadcast on C
    else:
        taps = jnp.transpose(jnp.reshape(w, (jnp.shape(w)[0], -1)))
        taps = jnp.reshape(taps, (len(taps), 1, -1) + (1,) * len(kernel))
    return _shifted_products(xp, taps, kernel, strides, dilations, out, channels_last)


@functools.partial(jax.custom_jvp, nondiff_argnums=(2, 3, 4, 5, 6))
def _shifted_products(xp, taps, kernel, strides, dilations, out, channels_last):
    """The sum over kernel positions ``i`` of the ``i``-th window of ``xp`` times ``taps[i]``
    (broadcast): a depthwise convolution of the padded input.

    The JVP is the plain sum's, arranged for its transpose. Differentiated op by op, each tap's
    weight gradient is one reduction of (window x cotangent) over the batch and the map, and
    XLA's CPU reductions of such fused products are slow: a 3x3 over 144 channels at 56x56,
    forward 40 ms at batch 32 channels-last, weight gradient 280 ms. In the tangent each tap's
    weight tangent meets its window through :func:`spread_product`, whose transpose adds the
    batch's halves in one fused loop and sums on as a tree of halves: 120-130 ms there; at
    batch 16 channels-first (the training layout) the forward and both gradients take 42-48 ms
    against 141. Those windows are plain slices (opaque ones get materialized for the two
    halves). The input's tangent is :func:`_input_tangent` (unstrided) or
    :func:`_strided_input_tangent`, whose transposes read the cotangent once (per phase); with
    a symbolic size, plain slices, whose transposes are pads. Plain JAX throughout, so every
    order of derivative, forward mode and vmap follow.
    """
    return _tap_sum(_taps(xp, kernel, strides, dilations, out, channels_last, opaque=True), taps)


def _shifted_products_jvp(kernel, strides, dilations, out, channels_last, primals, tangents):
    (xp, taps), (t_xp, t_taps) = primals, tangents
    y = _shifted_products(xp, taps, kernel, strides, dilations, out, channels_last)
    terms = []
    if not isinstance(t_xp, SymbolicZero):
        if _static_unstrided(jnp.shape(t_xp), strides):
            terms.append(_input_tangent(t_xp, taps, kernel, dilations, channels_last))
        elif static_sizes(jnp.shape(t_xp)):
            terms.append(_strided_input_tangent(t_xp, taps, kernel, strides, dilations, out, channels_last))
        else:
            terms.append(_tap_sum(_taps(t_xp, kernel, strides, dilations, out, channels_last), taps))
    if not isinstance(t_taps, SymbolicZero):
        windows = _taps(xp, kernel, strides, dilations, out, channels_last)
        terms.append(_tap_sum(windows, t_taps, spread_product))
    return y, functools.reduce(operator.add, terms) if terms else jnp.zeros_like(y)


_shifted_products.defjvp(_shifted_products_jvp, symbolic_zeros=True)


def _input_tangent(t_xp, taps, kernel, dilations, channels_last):
    """The unstrided depthwise sum over ``t_xp`` (the input's tangent), written so that its
    transpose is the depthwise lowering again: the cotangent padded by the kernel's span on
    each side, read through opaque windows (:func:`_opaque_window`) with the taps reversed.

    The plain sum's transpose pads each tap's (cotangent x tap) to the input's size and adds the
    nine, and XLA fuses the cotangent's producer (a BatchNorm's backward) into every pad. Here
    each term is placed by a dynamic update at offsets XLA cannot see; its transpose cuts
    windows at those offsets, so the padded cotangent is made once and every tap reads it, as
    in the forward lowering: with a tanh before and after, the input gradient of a 3x3 over 144
    channels at 56x56, batch 16, took 236-261 ms and takes 32-48 (both layouts), and
    MobileNetV2's training step went from 2446 to 2006 ms. (In forward mode this tangent places
    nine full-size terms, slower than the plain sum; only forward mode pays it.)
    """
    span = tuple((k - 1) * d for k, d in zip(kernel, dilations))
    pad = _full(span, 0, channels_last)
    full = tuple(n + p for n, p in zip(jnp.shape(t_xp), pad))  # the output plus the span each side
    # Tap i's term lands at the reversed tap's offset; cropping the span from each side then
    # leaves sum_i window_i(t_xp) * taps[i].
    starts = (
        _full(((k - 1 - o) * d for k, o, d in zip(kernel, offset, dilations)), 0, channels_last)
        for offset in itertools.product(*(range(k) for k in kernel))
    )
    total = _tap_sum(starts, taps, lambda start, tap: _opaque_place(t_xp * tap, start, full))
    limit = tuple(n - p for n, p in zip(full, pad))
    return lax.slice(total, pad, limit)


def _strided_input_tangent(t_xp, taps, kernel, strides, dilations, out, channels_last):
    """The strided depthwise sum over ``t_xp`` (the input's tangent), by phases, written so
    that its transpose reads the cotangent once per phase rather than once per tap.

    A tap whose window starts at offset f reads phase f % s of the input (every s-th cell from
    f % s: one strided slice per phase) unstrided, from block f // s; each phase's taps are
    then placed at offsets XLA cannot see, as :func:`_input_tangent` places them. The plain
    sum's transpose is nine pads with interior padding into each of which XLA fuses the
    cotangent's producer (a BatchNorm backward): MobileNetV2's 3x3/2 over 96 channels at
    112x112, batch 8, took 84 ms so; its training step took 0.84-0.88 of the time by phases.
    (Forward mode pays full-size placements here, as in :func:`_input_tangent`.)
    """
    nd = len(out)
    groups: dict[tuple, list] = {}
    for i, offsets in enumerate(itertools.product(*(range(k) for k in kernel))):
        first = [o * d for o, d in zip(offsets, dilations)]
        phase = tuple(f % s for f, s in zip(first, strides))
        groups.setdefault(phase, []).append((i, tuple(f // s for f, s in zip(first, strides))))
    total = None
    for phase, members in groups.items():
        # The phase's cells from its first to the last block a window of it reads; tap i's term
        # lands at reach - q_i in zeros of (blocks + reach) cells, and cropping reach from the
        # start leaves sum_i source[q_i : q_i + out] * tap_i.
        reach = tuple(max(q[a] for _, q in members) for a in range(nd))
        blocks = tuple(r + n for r, n in zip(reach, out))
        limit = _with_spatial(
            jnp.shape(t_xp), (p + (b - 1) * s + 1 for p, b, s in zip(phase, blocks, strides)), channels_last
        )
        source = lax.slice(t_xp, _full(phase, 0, channels_last), limit, _full(strides, 1, channels_last))
        full = tuple(n + e for n, e in zip(jnp.shape(source), _full(reach, 0, channels_last)))
        placed = _tap_sum(
            (_full((r - q_a for r, q_a in zip(reach, q)), 0, channels_last) for _, q in members),
            [taps[i] for i, _ in members],
            lambda start, tap, source=source, full=full: _opaque_place(source * tap, start, full),
        )
        start = _full(reach, 0, channels_last)
        size = _with_spatial(jnp.shape(source), out, channels_last)
        term = lax.slice(placed, start, tuple(a + n for a, n in zip(start, size)))
        total = term if total is None else total + term
    return total


def _opaque_place(t, start: tuple[int, ...], shape: tuple[int, ...]):
    """``t`` placed at ``start`` in zeros of ``shape``, at offsets XLA cannot see; its
    transpose is the window of the cotangent at those offsets, like :func:`_opaque_window`."""
    zeros = jnp.zeros(shape, t.dtype)
    return lax.dynamic_update_slice(zeros, t, _opaque_offsets(start), allow_negative_indices=False)


def _conv_im2col(x, w, strides, dilations, lo, hi, precision, channels_last, layout):
    """A k x k convolution: one product of the weights with the stacked shifted windows."""
    kernel = _kernel_dims(jnp.shape(w), layout)[2]
    xp = _pad_spatial(x, lo, hi, channels_last)
    out = _out_spatial(xp, kernel, strides, dilations, channels_last)
    windows = list(_taps(xp, kernel, strides, dilations, out, channels_last))
    if layout == "IHWO":
        cols = jnp.stack(windows, axis=-1)  # (N, *out, C, K)
        w3 = jnp.reshape(w, (jnp.shape(w)[0], -1, jnp.shape(w)[-1]))  # (C, K, M)
        return jnp.einsum("n...ck,ckm->n...m", cols, w3, precision=precision)
    if channels_last:
        cols = jnp.stack(windows, axis=-2)  # (N, *out, K, C)
        w3 = jnp.reshape(w, (-1,) + jnp.shape(w)[-2:])  # (K, C, M)
        return jnp.einsum("n...kc,kcm->n...m", cols, w3, precision=precision)
    cols = jnp.stack(windows, axis=2)  # (N, C, K, *out)
    w3 = jnp.reshape(w, jnp.shape(w)[:2] + (-1,))  # (M, C, K)
    return jnp.einsum("nck...,mck->nm...", cols, w3, precision=precision)


def _conv_tap_products(x, w, strides, dilations, lo, hi, precision, channels_last, layout):
    """A k x k convolution on an input small enough for this to stay in cache: one product of
    the input with every tap's weights at once (the I(D)HWO weights read as a (C, taps x M)
    matrix), then each tap's block of that product, shifted by the tap's offset, summed in one
    fused loop.
    The convolution's sums regrouped: padding the product pads the input, since the padding is
    zeros. ``conv_lowering`` picks it channels-last only, for stride 1 (with strides it would
    compute the product at positions no window starts from)."""
    kernel = _kernel_dims(jnp.shape(w), layout)[2]
    z = jnp.einsum("n...c,ck->n...k", x, jnp.reshape(w, (jnp.shape(w)[0], -1)), precision=precision)
    zp = _pad_spatial(z, lo, hi, True)  # (N, *padded map, K x M)
    # Split into the taps' blocks before the windows are taken: the derivative of a split is
    # one concatenation, where that of a window of one block is a pad to all K x M channels
    # summed over the taps (a 3x3 over 64 channels on 56x56, forward and backward: 63 ms
    # against 7.2 this way; XLA's convolution 5.1).
    parts = jnp.split(zp, math.prod(kernel), axis=-1)
    out = _out_spatial(zp, kernel, strides, dilations, True)
    y = None
    for window in _taps(parts[0], kernel, strides, dilations, out, True, parts=parts):
        y = window if y is None else y + window
    return y


def _conv_channel_taps(x, w, strides, dilations, lo, hi, precision, channels_last, layout):
    """A channels-last convolution over few channels (an image stem, a 1x1 over at most 16
    channels): for each kernel position and input channel, that channel's shifted window times
    the weights of every output channel, all summed in one fused loop (the depthwise lowering,
    with a sum over input channels too). ``conv_lowering`` picks it only channels-last, where
    the output channels are the minor axis that the loop vectorizes; ``channels_last`` and
    ``layout`` (always (D)HWIO here) are the lowerings' common signature."""
    kernel = _kernel_dims(jnp.shape(w), layout)[2]
    xp = _pad_spatial(x, lo, hi, True)
    out = _out_spatial(xp, kernel, strides, dilations, True)
    weights = jnp.reshape(w, (-1,) + jnp.shape(w)[-2:])  # (K, C, M)
    y = None
    for i, window in enumerate(_taps(xp, kernel, strides, dilations, out, True)):
        for c in range(jnp.shape(weights)[1]):
            term = window[..., c : c + 1] * weights[i, c]  # (N, *out, 1) * (M,)
            y = term if y is None else y + term
    return y


_LOWERINGS = {
    "matmul": _conv_matmul,
    "depthwise": _conv_depthwise,
    "im2col": _conv_im2col,
    "channel_taps": _conv_channel_taps,
    "tap_products": _conv_tap_products,
}
# The channels-last weight layouts each lowering reads (NC(D)HW ones read OI(D)HW).
_READS = {
    "matmul": KERNEL_LAYOUTS,
    "depthwise": ("HWIO",),
    "im2col": ("HWIO", "IHWO"),
    "channel_taps": ("HWIO",),
    "tap_products": ("IHWO",),
}


@register("Conv", since=(1, 11, 22))
def conv(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Conv``, all opsets (1-D, 2-D, 3-D, grouped, dilated, any auto_pad)."""
    x, w, b = (tuple(inputs) + (None,))[:3]
    return (convolve(x, w, b, attrs, ctx),)


@register("ConvTranspose", since=(1, 11, 22))
def conv_transpose(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``ConvTranspose``, all opsets (1-D, 2-D, 3-D, grouped, dilated, any auto_pad)."""
    x, w, b = (tuple(inputs) + (None,))[:3]
    return (transpose_convolve(x, w, b, attrs, ctx, legacy=ctx.opset < 11),)


def transpose_convolve(x, w, b, attrs, ctx, *, legacy: bool, channels_last: bool = False):
    """A ConvTranspose node's computation: ``y[i * stride + k * dilation - pad] += x[i] w[k]``.

    ``legacy``: ConvTranspose-1's rule for splitting an odd padding of an explicit
    ``output_shape`` (opsets 1-10). With ``channels_last``, ``x`` and the result are N(D)HWC;
    ``w`` is ONNX's (C, M/group, k...) in both layouts (both lowerings read it as stored).
    """
    if jnp.ndim(x) < 3 or jnp.ndim(w) != jnp.ndim(x):
        raise ctx.error(f"X of shape {jnp.shape(x)} and W of shape {jnp.shape(w)} need the same rank, at least 3")
    n = jnp.ndim(x) - 2
    group = int(attrs["group"])
    c_in = jnp.shape(w)[0]
    x_channels = jnp.shape(x)[-1 if channels_last else 1]
    if group < 1 or x_channels != c_in or c_in % group:
        raise ctx.error(
            f"X has {x_channels} channels and W has shape {jnp.shape(w)}: W must be "
            f"(C, M/group, ...) with C divisible by group={group}"
        )
    kernel = jnp.shape(w)[2:]
    _kernel_attr(attrs, kernel, ctx)
    in_shape = _spatial(jnp.shape(x), channels_last)
    strides, dilations = _strides_dilations(attrs, n, ctx)
    out_pad = _ints(attrs["output_padding"], n, 0, "output_padding", ctx)
    span = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    full = [s * (i - 1) + op + w_ for s, i, op, w_ in zip(strides, in_shape, out_pad, span)]
    lo, hi = _transpose_pads(attrs, in_shape, strides, full, legacy, ctx)
    out = tuple(f - a - c for f, a, c in zip(full, lo, hi))
    geometry = _TransposeGeometry(
        tuple(strides), tuple(dilations), tuple(lo), tuple(hi), tuple(out_pad), out, group, channels_last, ctx.precision
    )
    lowering = conv_transpose_lowering(jnp.shape(x), jnp.shape(w), strides, jnp.result_type(x, w), channels_last)
    if lowering == "phases":
        y = _conv_transpose_phases(x, w, geometry)
    elif lowering == "xla+phases":
        y = _conv_transpose_xla_phase_derivatives(x, w, geometry)
    else:
        y = _conv_transpose_xla(x, w, geometry)
    return _add_bias(y, b, ctx, channels_last)


class _TransposeGeometry(NamedTuple):
    """A ConvTranspose's static shape parameters (hashable: a custom JVP's static argument).
    ``lo``, ``hi``: the cut from the full output's start and end per axis (negative: zeros
    added); ``out``: the output's spatial sizes."""

    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    lo: tuple[int, ...]
    hi: tuple[int, ...]
    output_padding: tuple[int, ...]
    out: tuple[int, ...]
    group: int
    channels_last: bool
    precision: Any


def _conv_transpose_xla(x, w, g: _TransposeGeometry):
    """XLA's transposed convolution: a convolution of the stride-dilated input with the
    flipped, transposed kernel."""
    n = len(g.strides)
    c_in, c_out_g, kernel = jnp.shape(w)[0], jnp.shape(w)[1], jnp.shape(w)[2:]
    # (C, M/g, k...) -> (M, C/g, k...) per group, kernel flipped.
    kw = jnp.reshape(w, (g.group, c_in // g.group, c_out_g) + kernel)
    kw = jnp.swapaxes(kw, 1, 2).reshape((g.group * c_out_g, c_in // g.group) + kernel)
    kw = jnp.flip(kw, axis=tuple(range(2, n + 2)))
    span = [(k - 1) * d + 1 for k, d in zip(kernel, g.dilations)]
    conv_lo = [w_ - 1 - p for w_, p in zip(span, g.lo)]
    conv_hi = [w_ - 1 - p + op for w_, p, op in zip(span, g.hi, g.output_padding)]
    y = lax.conv_general_dilated(
        x,
        kw,
        window_strides=(1,) * n,
        padding=tuple((max(a, 0), max(c, 0)) for a, c in zip(conv_lo, conv_hi)),
        lhs_dilation=g.strides,
        rhs_dilation=g.dilations,
        dimension_numbers=_dimension_numbers(n, g.channels_last, "OIHW"),
        feature_group_count=g.group,
        precision=g.precision,
    )
    if any(a < 0 or c < 0 for a, c in zip(conv_lo, conv_hi)):
        # Pads larger than the kernel span crop the output; XLA wants non-negative padding.
        first = 1 if g.channels_last else 2
        index = tuple(
            slice(-min(a, 0), jnp.shape(y)[first + i] + min(c, 0)) for i, (a, c) in enumerate(zip(conv_lo, conv_hi))
        )
        y = y[(slice(None),) * first + index]
    return y


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def _conv_transpose_xla_phase_derivatives(x, w, g: _TransposeGeometry):
    """XLA's transposed convolution with the phases lowering's derivatives: channels-last,
    XLA's forward is the faster (0.6-0.95 of the phases' time) and its gradients 5-50x slower."""
    return _conv_transpose_xla(x, w, g)


def _conv_transpose_xla_jvp(g, primals, tangents):
    x, w = primals
    dx, dw = tangents
    y = _conv_transpose_xla(x, w, g)
    # Bilinear: the tangent is the op of (dx, w) plus that of (x, dw); what is not
    # differentiated is a symbolic zero and costs nothing.
    terms = [_conv_transpose_phases(dx, w, g)] if not isinstance(dx, SymbolicZero) else []
    if not isinstance(dw, SymbolicZero):
        terms.append(_conv_transpose_phases(x, dw, g))
    return y, functools.reduce(operator.add, terms) if terms else jnp.zeros_like(y)


_conv_transpose_xla_phase_derivatives.defjvp(_conv_transpose_xla_jvp, symbolic_zeros=True)


def _transpose_pads(attrs, in_shape, strides, full, legacy: bool, ctx) -> tuple[list[int], list[int]]:
    """A ConvTranspose's cut from the full output at each spatial axis's start and end (negative:
    zeros added), from its pads, auto_pad or output_shape."""
    n = len(in_shape)
    mode = _auto_pad(attrs)
    output_shape = attrs["output_shape"]
    explicit = output_shape is not None and len(output_shape) > 0
    if explicit:
        output_shape = tuple(int(v) for v in output_shape)[-n:]
        if len(output_shape) != n:
            raise ctx.error(f"output_shape {tuple(attrs['output_shape'])} must name {n} spatial sizes")
    elif mode in ("SAME_UPPER", "SAME_LOWER"):
        output_shape = tuple(i * s for i, s in zip(in_shape, strides))
    else:
        output_shape = None
    if output_shape is not None:
        # Which end gets the extra cell of an odd total: for auto_pad SAME_* every version says
        # the end for SAME_UPPER, else the start. For an explicit output_shape each version's
        # own formula decides: from opset 11 as for SAME_*, but ConvTranspose-1's text has the
        # opposite (the larger half at the end unless SAME_UPPER). onnxruntime applies the
        # opset-11 rule to every version.
        small_first = mode == "SAME_UPPER"
        if explicit and legacy:
            small_first = mode != "SAME_UPPER"
        lo, hi = [], []
        for f, o in zip(full, output_shape):
            total = f - o
            small, big = total // 2, total - total // 2
            lo.append(small if small_first else big)
            hi.append(big if small_first else small)
        return lo, hi
    if mode == "VALID":
        return [0] * n, [0] * n
    if mode == "NOTSET":
        return [list(p) for p in _explicit_pads(attrs, n, ctx)]
    raise ctx.error(f"auto_pad {mode!r} is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID")


# A strided ConvTranspose by phases while its taps' products take at most this many times the
# output's size (a 4x4 kernel at stride 2: 4x; 3x3 at stride 2: 2.25x).
TRANSPOSE_PHASES_GROWTH = 4


def conv_transpose_lowering(x_shape, w_shape, strides, dtype, channels_last: bool = False) -> str:
    """How a ConvTranspose with these static shapes runs: ``"phases"``, ``"xla"``, or
    ``"xla+phases"`` (XLA's forward, the phases' derivatives).

    XLA's CPU runs a strided transposed convolution (a convolution of the stride-dilated
    input) slowly and its gradient very slowly: a 2x2 stride-2 upsampling of 128 to 64
    channels on 56x56, NCHW, took 4.2 ms forward and 107 ms with both gradients at batch 1,
    2.4 s at batch 8, against 2.2, 5.4 and 73 ms by phases (benchmarks/bench_conv_transpose.py,
    docs/performance.md). Unstrided, it is an ordinary convolution, which XLA runs well."""
    if CONV_LOWERING != "auto" or jax.default_backend() != "cpu":
        return "xla"
    if dtype not in (jnp.float32, jnp.float64) or all(s == 1 for s in strides):
        return "xla"
    if not static_sizes(_spatial(x_shape, channels_last)):
        return "xla"
    if math.prod(w_shape[2:]) > TRANSPOSE_PHASES_GROWTH * math.prod(strides):
        return "xla"
    # Channels-last (inference, by the layout pass), XLA's forward is 5-40% faster than the
    # phases'; the derivatives are the phases' in both layouts.
    return "xla+phases" if channels_last else "phases"


def _conv_transpose_phases(x, w, g: _TransposeGeometry):
    """ConvTranspose as one product and a pixel shuffle: ``z = x @ W`` for all taps at once,
    then each tap's block shifted into the output phase it lands in.

    Tap ``k`` adds ``x[i] w[k]`` at ``i * s + k * d``: in phase ``(k * d) % s`` of the output,
    shifted by ``(k * d) // s``. Each phase sums its taps' shifted blocks; the phases are
    interleaved (a stack, transpose and reshape, one fused copy) and the result cut at ``lo``
    (or padded with zeros where ``lo`` or the end is negative). Plain JAX: its gradients are
    the product's and slices of the output's gradient.
    """
    strides, dilations, lo, out, group = g.strides, g.dilations, g.lo, g.out, g.group
    n = len(strides)
    if not g.channels_last:
        x = jnp.moveaxis(x, 1, -1)
    batch, in_shape, c_in = jnp.shape(x)[0], jnp.shape(x)[1:-1], jnp.shape(x)[-1]
    kernel, m_group = jnp.shape(w)[2:], jnp.shape(w)[1]
    m = group * m_group
    taps = list(itertools.product(*(range(k) for k in kernel)))
    weights = jnp.reshape(w, (group, c_in // group, m_group, len(taps)))
    grouped = jnp.reshape(x, (batch, *in_shape, group, c_in // group))
    z = jnp.einsum("...gc,gcmt->...tgm", grouped, weights, precision=g.precision)
    z = jnp.reshape(z, (batch, *in_shape, len(taps), m))
    # Each phase's length: enough for the full output, s * (i - 1) + (k - 1) * d + 1.
    q = [-(-(s * (i - 1) + (k - 1) * d + 1) // s) for s, i, k, d in zip(strides, in_shape, kernel, dilations)]
    zero = jnp.zeros((), z.dtype)
    phases: dict[tuple[int, ...], jax.Array] = {}
    # Split, not indexed: the gradient then gathers the taps' blocks with one concatenation; as
    # one pad per tap, summed, XLA fused that sum into both gradients' products (a 3x3 stride-2
    # upsampling of 64 channels on 56x56, both gradients: 47 against 7.5 ms).
    blocks = jnp.split(z, len(taps), axis=-2)
    for tap, block in zip(taps, blocks):
        offsets = [k * d for k, d in zip(tap, dilations)]
        phase = tuple(o % s for o, s in zip(offsets, strides))
        shifts = [o // s for o, s in zip(offsets, strides)]
        config = [(0, 0, 0), *((a, q_ - a - i, 0) for a, q_, i in zip(shifts, q, in_shape)), (0, 0, 0)]
        placed = lax.pad(block[..., 0, :], zero, config)
        phases[phase] = placed + phases[phase] if phase in phases else placed
    empty = jnp.zeros((batch, *q, m), z.dtype)  # a phase no tap reaches (kernel span < stride)
    every = itertools.product(*(range(s) for s in strides))
    y = jnp.stack([phases.get(p, empty) for p in every], axis=1).reshape((batch, *strides, *q, m))
    # (N, s1, .., sn, q1, .., qn, M) -> (N, q1, s1, .., qn, sn, M) -> (N, q1 s1, .., qn sn, M)
    y = jnp.transpose(y, (0, *(a for i in range(n) for a in (1 + n + i, 1 + i)), 1 + 2 * n))
    length = [q_ * s for q_, s in zip(q, strides)]
    y = jnp.reshape(y, (batch, *length, m))
    config = [(0, 0, 0), *((-a, o + a - size, 0) for a, o, size in zip(lo, out, length)), (0, 0, 0)]
    y = lax.pad(y, zero, config)
    return y if g.channels_last else jnp.moveaxis(y, -1, 1)


# --------------------------------------------------------------------------- pooling


def _pool_setup(x, attrs, ctx, channels_last: bool = False):
    """Kernel, strides, dilations and per-axis pads for a pooling node."""
    if jnp.ndim(x) < 3:
        raise ctx.error(f"input of shape {jnp.shape(x)} needs a batch, a channel and spatial axes")
    n = jnp.ndim(x) - 2
    if attrs.get("kernel_shape") is None or len(attrs["kernel_shape"]) != n:
        raise ctx.error(f"kernel_shape {attrs.get('kernel_shape')} must have {n} entries")
    kernel = tuple(int(k) for k in attrs["kernel_shape"])
    strides = _ints(attrs.get("strides"), n, 1, "strides", ctx)
    dilations = _ints(attrs.get("dilations"), n, 1, "dilations", ctx)
    if any(v < 1 for v in kernel + strides + dilations):
        raise ctx.error(f"kernel_shape {kernel}, strides {strides} and dilations {dilations} must be positive")
    lo, hi, extra = _window_pads(
        _spatial(jnp.shape(x), channels_last),
        kernel,
        strides,
        dilations,
        attrs,
        ctx,
        ceil_mode=bool(attrs.get("ceil_mode")),
    )
    return kernel, strides, dilations, lo, hi, extra


def _reduce_window(x, init, op, kernel, strides, dilations, lo, hi, extra, channels_last: bool = False):
    # A numpy init value stays concrete under jit, so JAX picks its max/sum window primitives
    # (with their efficient gradients) instead of a generic reduction.
    return lax.reduce_window(
        x,
        np.asarray(init, np.dtype(jnp.result_type(x))),
        op,
        window_dimensions=_full(kernel, 1, channels_last),
        window_strides=_full(strides, 1, channels_last),
        padding=_full(((a, b + e) for a, b, e in zip(lo, hi, extra)), (0, 0), channels_last),
        window_dilation=_full(dilations, 1, channels_last),
    )


def _lowest(dtype):
    dtype = np.dtype(dtype)
    return -np.inf if jnp.issubdtype(dtype, jnp.floating) else np.iinfo(dtype).min


def _argmax_window(x, kernel, strides, dilations, lo, hi, extra, channels_last: bool = False):
    """Row-major flat index (over the whole tensor) of each window's maximum."""
    shape = jnp.shape(x)
    dtype, idx_dtype = jnp.result_type(x), index_dtype()
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
        window_dimensions=_full(kernel, 1, channels_last),
        window_strides=_full(strides, 1, channels_last),
        padding=_full(((a, b + e) for a, b, e in zip(lo, hi, extra)), (0, 0), channels_last),
        window_dilation=_full(dilations, 1, channels_last),
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


# Windows up to this many positions take the gather-based derivative on CPU (each position is
# one unrolled compare in the loop that finds the maxima); larger ones keep select-and-scatter.
_MAX_WINDOW_TAPS = 49


def _max_window(x, kernel, strides, lo, hi, extra, channels_last: bool = False):
    """The window maxima (dilation 1, static shape), with a derivative XLA CPU runs fast.

    JAX differentiates ``reduce_window(max)`` through select-and-scatter, which XLA CPU expands
    into a variadic reduce-window over four full-size iotas plus a scatter: in a ResNet-18
    training step (batch 32) the stem MaxPool took ~10% of the step. Here the forward is the
    same reduce-window, and the derivative (a ``custom_jvp``, so forward and reverse mode)
    finds each window's first maximal position (row-major, as select-and-scatter and the
    Indices output pick it) in one fused pass over the shifted windows, then gathers the
    tangent there from the flattened tensor; its transpose, the gradient, is one scatter-add.
    A (32, 64, 32, 32) 3x3/2 pool's forward + backward: ~5 ms against ~100 ms (isolated,
    loaded machine); the same gradients bit for bit.
    """
    ones = (1,) * len(kernel)
    lowest = _lowest(jnp.result_type(x))
    shape = tuple(int(d) for d in jnp.shape(x))
    spatial_axes = range(1, len(shape) - 1) if channels_last else range(2, len(shape))
    window = dict(zip(spatial_axes, zip(kernel, strides, lo)))

    @jax.custom_jvp
    def window_max(v):
        return _reduce_window(v, lowest, lax.max, kernel, strides, ones, lo, hi, extra, channels_last)

    @window_max.defjvp
    def window_max_jvp(primals, tangents):
        (v,), (t,) = primals, tangents
        pads = _full(((a, b + e) for a, b, e in zip(lo, hi, extra)), (0, 0), channels_last)
        vp = jnp.pad(v, pads, constant_values=lowest)
        out = _out_spatial(vp, kernel, strides, ones, channels_last)
        taps = _taps(vp, kernel, strides, ones, out, channels_last)
        best = next(taps)
        first = jnp.zeros(jnp.shape(best), jnp.int32)
        for i, tap in enumerate(taps, 1):
            later = tap > best  # strictly greater: a tie keeps the earlier position
            best, first = jnp.where(later, tap, best), jnp.where(later, i, first)
        # The winner's row-major position in the flattened input; a padding cell (it wins only
        # a window of -inf) is out of range, so its tangent is zero.
        flat, inside = jnp.zeros_like(first), True
        for axis, extent in enumerate(shape):
            pos = lax.broadcasted_iota(jnp.int32, jnp.shape(first), axis)
            if axis in window:
                k, s, a = window[axis]
                offset = first // math.prod(kernel[list(window).index(axis) + 1 :]) % k
                pos = pos * s + offset - a
                inside = inside & (pos >= 0) & (pos < extent)
            flat = flat * extent + pos
        t_y = jnp.take(jnp.reshape(t, (-1,)), jnp.where(inside, flat, math.prod(shape)), mode="fill", fill_value=0)
        return window_max(v), jnp.reshape(t_y, jnp.shape(first))

    return window_max(x)


def _max_pool(x, attrs, ctx, with_indices: bool, channels_last: bool = False):
    """MaxPool's Y (and Indices); with ``channels_last`` (N(D)HWC), Y only."""
    kernel, strides, dilations, lo, hi, extra = _pool_setup(x, attrs, ctx, channels_last)
    dilated = any(d > 1 for d in dilations)
    window = (kernel, strides, dilations, lo, hi, extra)
    idx = _argmax_window(x, *window, channels_last) if with_indices or dilated else None
    if dilated:
        # JAX cannot transpose a dilated max window (no VJP for select_and_gather), so read the
        # maxima through their indices: a gather, differentiable in both modes.
        y = jnp.take(jnp.reshape(x, (-1,)), idx, mode="clip")
    elif (
        jax.default_backend() == "cpu"
        and jnp.issubdtype(jnp.result_type(x), jnp.floating)
        and math.prod(kernel) <= _MAX_WINDOW_TAPS
        and static_sizes(jnp.shape(x))
        and math.prod(jnp.shape(x)) < 2**31
    ):
        y = _max_window(x, kernel, strides, lo, hi, extra, channels_last)
    else:
        # Integer inputs, a symbolic dimension (jax.export) or int64-sized tensors, large windows.
        y = _reduce_window(x, _lowest(jnp.result_type(x)), lax.max, *window, channels_last)
    if not with_indices:
        return (y,)
    if attrs.get("storage_order"):
        idx = _column_major(idx, jnp.shape(x))
    return y, idx


@register("MaxPool", since=1)
def max_pool_1(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``MaxPool``-1 (no Indices output)."""
    return _max_pool(inputs[0], attrs, ctx, with_indices=False)


@register("MaxPool", since=(8, 10, 11, 12, 22))
def max_pool(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``MaxPool``, opsets 8+: Y and the flattened int64 Indices (``storage_order``).

    Indices are computed only when the model reads them (XLA drops them otherwise under jit).
    """
    return _max_pool(inputs[0], attrs, ctx, with_indices=True)


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
    return count.reshape(_full(count.shape, 1, channels_last))


def average_pool_core(x, attrs, ctx, channels_last: bool = False):
    """AveragePool's Y, in NC(D)HW or (``channels_last``) N(D)HWC."""
    window = _pool_setup(x, attrs, ctx, channels_last)
    total = _reduce_window(x, 0, lax.add, *window, channels_last)
    count = _window_count(
        _spatial(jnp.shape(x), channels_last),
        *window,
        bool(attrs.get("count_include_pad")),
        jnp.result_type(x),
        channels_last,
    )
    return total / count


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
    total = _reduce_window(_abs_pow(x, p), 0, lax.add, kernel, strides, dilations, lo, hi, extra)
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
    return (jnp.max(x, axis=spatial_axes(x, ctx), keepdims=True),)


@register("GlobalLpPool", since=(1, 2, 22))
def global_lp_pool(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``GlobalLpPool``, all opsets (``p`` is a float in opset 1, an int after)."""
    x = inputs[0]
    p = attrs["p"]
    if p <= 0:
        raise ctx.error(f"p={p} must be positive")
    total = jnp.sum(_abs_pow(x, p), axis=spatial_axes(x, ctx), keepdims=True)
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
    kernel = _ints(attrs["kernel_shape"], n, 0, "kernel_shape", ctx)
    strides = _ints(attrs["strides"], n, 1, "strides", ctx)
    lo, hi = _explicit_pads(attrs, n, ctx)
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


# --------------------------------------------------------------------------- products


def gemm_core(a, b, c, attrs, ctx):
    if jnp.ndim(a) != 2 or jnp.ndim(b) != 2:
        raise ctx.error(f"A and B must be matrices, got shapes {jnp.shape(a)} and {jnp.shape(b)}")
    if attrs["transA"]:
        a = a.T
    k_by_n = b.T if attrs["transB"] else b
    if jnp.shape(a)[1] != jnp.shape(k_by_n)[0]:
        raise ctx.error(f"inner dimensions differ: {jnp.shape(a)} @ {jnp.shape(k_by_n)} (after transA/transB)")
    dtype = jnp.result_type(a)
    alpha, beta = float(attrs["alpha"]), float(attrs["beta"])
    if attrs["transB"] and jnp.shape(a)[0] == 1:
        # One row against B stored (N, K), a classifier at batch 1: for a @ B.T, XLA CPU copies
        # B transposed on every call (ResNet-50's 1000 x 2048 classifier: 3.5 of 62 ms); B @ a.T
        # reads B as stored (0.11 against 0.69 ms alone). The same sums, in the same order.
        y = jnp.matmul(b, a.T, precision=ctx.precision).T
    else:
        y = jnp.matmul(a, k_by_n, precision=ctx.precision)
    if alpha != 1.0:
        y = (alpha * y).astype(dtype)
    if c is not None and beta != 0.0:
        out_shape = jnp.shape(y)
        try:
            # jnp's broadcast_shapes, not numpy's: it takes symbolic dims (jax.export).
            fits = tuple(jnp.broadcast_shapes(jnp.shape(c), out_shape)) == tuple(out_shape)
        except ValueError:
            fits = False
        if not fits:
            raise ctx.error(f"C of shape {jnp.shape(c)} does not broadcast to the output {out_shape}")
        y = y + (c if beta == 1.0 else (beta * c).astype(dtype))
    return y


@register("Gemm", since=(1, 6))
def gemm_1(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Gemm``-1/6: C must match (M, N) unless ``broadcast=1``."""
    a, b, c = inputs
    if not attrs["broadcast"] and c is not None:
        m = jnp.shape(a)[1 if attrs["transA"] else 0]
        nn = jnp.shape(b)[0 if attrs["transB"] else 1]
        if tuple(jnp.shape(c)) != (m, nn):
            raise ctx.error(f"C has shape {jnp.shape(c)}, not {(m, nn)}; before opset 7 this needs broadcast=1")
    return (gemm_core(a, b, c, attrs, ctx),)


@register("Gemm", since=(7, 9, 11, 13))
def gemm(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Gemm``, opsets 7+: C broadcasts unidirectionally (optional from opset 11)."""
    a, b, c = (tuple(inputs) + (None,))[:3]
    return (gemm_core(a, b, c, attrs, ctx),)


@register("MatMul", since=(1, 9, 13))
def matmul(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``MatMul``, all opsets (numpy ``matmul`` semantics, 1-D operands included)."""
    a, b = inputs
    if jnp.ndim(a) == 0 or jnp.ndim(b) == 0:
        raise ctx.error(f"MatMul operands must have rank >= 1, got shapes {jnp.shape(a)} and {jnp.shape(b)}")
    return (jnp.matmul(a, b, precision=ctx.precision),)


@register("Einsum", since=(12, 28))
def einsum(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Einsum``, all opsets (explicit and implicit output, ellipsis)."""
    equation = attrs["equation"]
    equation = (equation.decode() if isinstance(equation, bytes) else equation).replace(" ", "")
    if not equation:
        raise ctx.error("the equation attribute is empty")
    operands = [x for x in inputs if x is not None]
    named = equation.split("->")[0].count(",") + 1
    if named != len(operands):
        raise ctx.error(f"equation {equation!r} names {named} operands, got {len(operands)}")
    return (jnp.einsum(equation, *operands, precision=ctx.precision),)


# --------------------------------------------------------------------------- im2col family


@register("Col2Im", since=18, static_inputs=(1, 2))
def col2im(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Col2Im``-18: sums column blocks back into an image (the adjoint of im2col)."""
    x, image_shape, block_shape = inputs
    image, block = static_ints(image_shape), static_ints(block_shape)
    n = len(image)
    if len(block) != n or jnp.ndim(x) != 3:
        raise ctx.error(
            f"input of shape {jnp.shape(x)} must be (N, C*prod(block_shape), L); image_shape "
            f"{image} and block_shape {block} must have the same length"
        )
    strides, dilations = _strides_dilations(attrs, n, ctx)
    lo, hi = _explicit_pads(attrs, n, ctx)
    batch, cols, length = jnp.shape(x)
    if cols % math.prod(block):
        raise ctx.error(f"input dim 1 ({cols}) is not a multiple of prod(block_shape) {math.prod(block)}")
    channels = cols // math.prod(block)
    out = tuple(
        (i + a + b - ((k - 1) * d + 1)) // s + 1 for i, a, b, k, d, s in zip(image, lo, hi, block, dilations, strides)
    )
    if math.prod(out) != length:
        raise ctx.error(f"input has {length} blocks but the geometry gives {out} = {math.prod(out)}")
    dtype = jnp.result_type(x)

    def im2col(img):
        return lax.conv_general_dilated_patches(
            img,
            block,
            strides,
            tuple(zip(lo, hi)),
            rhs_dilation=dilations,
            dimension_numbers=_dimension_numbers(n),
            precision=ctx.precision,
        )

    adjoint = jax.linear_transpose(im2col, jax.ShapeDtypeStruct((batch, channels) + image, dtype))
    (y,) = adjoint(jnp.reshape(x, (batch, cols) + out))
    return (y,)


def _deform_sample(x, coords, offset_group):
    """Multilinear samples of ``x`` (N, C, *in) at ``coords`` (nd, N, G, L), zeros outside.

    Returns (N, G, L, C/G): ONNX's GridSample with ``align_corners=1`` and zero padding.
    """
    n, c = jnp.shape(x)[:2]
    spatial = jnp.shape(x)[2:]
    nd = len(spatial)
    cg = c // offset_group
    table = jnp.moveaxis(jnp.reshape(x, (n, offset_group, cg, math.prod(spatial))), 2, 3)
    lower = [jnp.floor(p) for p in coords]
    rows = jnp.arange(n)[:, None, None]
    groups = jnp.arange(offset_group)[None, :, None]
    out = 0
    for corner in range(2**nd):
        flat, weight, inside = 0, 1, True
        for d in range(nd):
            q = lower[d] + ((corner >> (nd - 1 - d)) & 1)
            weight = weight * (1 - jnp.abs(coords[d] - q))
            inside = inside & (q >= 0) & (q <= spatial[d] - 1)
            flat = flat * spatial[d] + jnp.clip(q, 0, spatial[d] - 1).astype(jnp.int32)
        weight = jnp.where(inside, weight, jnp.zeros_like(weight))
        out = out + table[rows, groups, flat] * weight[..., None]
    return out


@functools.partial(jax.jit, static_argnames=("group", "offset_group", "strides", "dilations", "lo", "precision"))
def _deform_core(x, w, offset, mask, *, group, offset_group, strides, dilations, lo, precision):
    # Jitted as a unit: eagerly, its many small gathers would each compile on their own.
    n, c = jnp.shape(x)[:2]
    oc, kernel = jnp.shape(w)[0], tuple(jnp.shape(w)[2:])
    nd, k, out = len(kernel), math.prod(kernel), tuple(jnp.shape(offset)[2:])
    dtype = jnp.result_type(x)
    offset = jnp.reshape(offset, (n, offset_group) + kernel + (nd,) + out)
    coords = []
    for d in range(nd):
        kshape, oshape = [1] * nd, [1] * nd
        kshape[d], oshape[d] = kernel[d], out[d]
        kpos = (np.arange(kernel[d]) * dilations[d]).reshape(kshape + [1] * nd)
        base = kpos + (np.arange(out[d]) * strides[d] - lo[d]).reshape([1] * nd + oshape)
        pos = offset[(slice(None), slice(None)) + (slice(None),) * nd + (d,)] + base.astype(dtype)
        coords.append(jnp.reshape(pos, (n, offset_group, k * math.prod(out))))
    cols = _deform_sample(x, coords, offset_group)  # (N, G, K*L, C/G)
    if mask is not None:
        cols = cols * jnp.reshape(mask, (n, offset_group, k * math.prod(out), 1))
    cols = jnp.reshape(cols, (n, offset_group, k, math.prod(out), c // offset_group))
    cols = jnp.transpose(cols, (0, 1, 4, 2, 3)).reshape((n, group, c // group * k, math.prod(out)))
    kw = jnp.reshape(w, (group, oc // group, c // group * k))
    y = jnp.einsum("gok,ngkl->ngol", kw, cols, precision=precision)
    return jnp.reshape(y, (n, oc) + out).astype(dtype)


@register("DeformConv", since=(19, 22))
def deform_conv(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``DeformConv``, all opsets: bilinear (multilinear in N-D) sampling at offset positions."""
    x, w, offset, b, mask = inputs
    if jnp.ndim(x) < 3 or jnp.ndim(w) != jnp.ndim(x) or jnp.ndim(offset) != jnp.ndim(x):
        raise ctx.error(
            f"X {jnp.shape(x)}, W {jnp.shape(w)} and offset {jnp.shape(offset)} need the same rank, at least 3"
        )
    nd = jnp.ndim(x) - 2
    n, c = jnp.shape(x)[:2]
    oc, kernel = jnp.shape(w)[0], tuple(jnp.shape(w)[2:])
    _kernel_attr(attrs, kernel, ctx)
    group, offset_group = int(attrs["group"]), int(attrs["offset_group"])
    if group < 1 or c != jnp.shape(w)[1] * group or oc % group:
        raise ctx.error(f"X has {c} channels and W has shape {jnp.shape(w)}: inconsistent with group={group}")
    k = math.prod(kernel)
    if offset_group < 1 or c % offset_group or jnp.shape(offset)[1] != offset_group * k * nd:
        raise ctx.error(
            f"offset of shape {jnp.shape(offset)} needs {offset_group * k * nd} channels "
            f"(offset_group * prod(kernel) * {nd}) and X's {c} channels divisible by offset_group"
        )
    strides, dilations = _strides_dilations(attrs, nd, ctx)
    lo, hi = _explicit_pads(attrs, nd, ctx)
    out = tuple(jnp.shape(offset)[2:])
    want = tuple(
        (i + a + e - (kk - 1) * d - 1) // s + 1
        for i, a, e, kk, d, s in zip(jnp.shape(x)[2:], lo, hi, kernel, dilations, strides)
    )
    if out != want:
        raise ctx.error(f"offset's spatial shape {out} differs from the output shape {want}")
    y = _deform_core(
        x,
        w,
        offset,
        mask,
        group=group,
        offset_group=offset_group,
        strides=strides,
        dilations=dilations,
        lo=lo,
        precision=ctx.precision,
    )
    return (_add_bias(y, b, ctx),)

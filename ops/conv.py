"""Convolutions: Conv, ConvTranspose, DeformConv and Col2Im.

Each Conv or ConvTranspose is one ``lax.conv_general_dilated``, or on CPU a lowering of it to
dots and fused elementwise work chosen by its static shapes (``conv_lowering``,
``conv_transpose_lowering``), so XLA sees whole convolutions, never per-position Python. The
helpers take ``channels_last`` (ops/_window.py says how the layouts and the padding rules go).
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

from jonnx._chunks import lowering_batch
from jonnx._registry import Attrs, Inputs, OpContext, Outputs, register
from jonnx.ops import _window as geo
from jonnx.ops._tap_weights import tap_weight_term
from jonnx.ops._util import lowers_for_cpu, spread_product, static_ints, static_sizes, widen_halves

# Weight layouts a channels-last Conv reads, "HW" standing for the spatial axes: "HWIO", what
# XLA's channels-last convolution and most lowerings read; "OIHW", ONNX's own, and "HWOI", the
# same bytes with the unit spatial axes first, for big 1x1 kernels, which the product reads
# through a reshape as an (M, C) matrix; "IHWO", read by the tap-products lowering as one
# (C, taps x M) matrix through a reshape. The layout pass picks one per kernel
# (``kernel_layout_for``) and prepares that copy once per parameter set (for "HWOI" a view of
# the stored weights, no copy, on the CPU).
KERNEL_LAYOUTS = ("HWIO", "OIHW", "HWOI", "IHWO")


def _kernel_dims(w_shape, layout: str) -> tuple:
    """``(M, C/group, kernel)`` of weights of shape ``w_shape`` in ``layout``."""
    if layout == "OIHW":
        return w_shape[0], w_shape[1], tuple(w_shape[2:])
    if layout == "HWIO":
        return w_shape[-1], w_shape[-2], tuple(w_shape[:-2])
    if layout == "HWOI":
        return w_shape[-2], w_shape[-1], tuple(w_shape[:-2])
    return w_shape[-1], w_shape[0], tuple(w_shape[1:-1])


def kernel_permutation(layout: str, rank: int) -> tuple[int, ...]:
    """The ``perm`` of a Transpose taking rank-``rank`` OI(D)HW weights to ``layout``."""
    spatial = tuple(range(2, rank))
    return {"OIHW": (0, 1, *spatial), "HWIO": (*spatial, 1, 0), "HWOI": (*spatial, 0, 1), "IHWO": (1, *spatial, 0)}[
        layout
    ]


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
    w_onnx = (m, w_in, *kernel)  # W's shape as the ONNX node has it, whatever the layout
    if group < 1 or c_in != w_in * group or m % group:
        raise ctx.error(
            f"X has {c_in} channels and W has shape {w_onnx}: with group={group}, W must be "
            f"(M, C/group, ...) with M divisible by group"
        )
    if min(kernel) < 1:
        raise ctx.error(f"W of shape {w_onnx} has an empty kernel window")
    geo.kernel_attr(attrs, kernel, ctx)
    strides, dilations = geo.strides_dilations(attrs, n, ctx)
    lo, hi, _ = geo.window_pads(geo.spatial(jnp.shape(x), channels_last), kernel, strides, dilations, attrs, ctx)
    w_shape = (*kernel, w_in, m) if channels_last else jnp.shape(w)
    lowering = conv_lowering(
        jnp.shape(x),
        w_shape,
        strides,
        group,
        jnp.result_type(x, w),
        channels_last=channels_last,
        kernel_layout=layout,
        dilations=dilations,
    )
    if lowering == "xla":
        x, lo = _input_gradient_clear_of_swap(x, kernel, strides, dilations, lo, channels_last)
        y = lax.conv_general_dilated(
            x,
            w,
            window_strides=strides,
            padding=tuple(zip(lo, hi)),
            rhs_dilation=dilations,
            dimension_numbers=geo.dimension_numbers(n, channels_last, layout),
            feature_group_count=group,
            precision=ctx.precision,
        )
    else:
        if channels_last and layout not in _READS[lowering]:
            # The layout pass prepares the layout the lowering reads (``kernel_layout_for``); a
            # direct call of the internal op may pass another, relaid-out here on every call.
            w, layout = _to_hwio(w, layout), "HWIO"
        y = _LOWERINGS[lowering](x, w, strides, dilations, lo, hi, ctx.precision, channels_last, layout)
    return geo.add_bias(y, b, ctx, channels_last)


# XLA's operand swap (jaxlib 0.10.2's ConvOperandSwapper) rewrites a convolution whose kernel
# outweighs its input as one of the input over the kernel, but copies an axis it reads as a
# grouping axis unchanged (no padding, no window dilation, the input dilated by the window's
# length, a stride one less), although the new kernel's length there is the old input's: the
# compiler's own check then aborts the process ("Window dimensions do not match RHS shape",
# docs/known_issues.md). Such an axis is a window of 2 over an input dilated by 2, unpadded:
# JAX's input gradient of a Conv with a kernel of 2, stride 2 and a leading pad of 1 on that
# axis, a ConvTranspose's convolution with stride 2, kernel 2 and pads 1, and Col2Im's adjoint.
# Padding those axes another way keeps every convolution jonnx builds clear of it.


def _input_gradient_clear_of_swap(x, kernel, strides, dilations, lo, channels_last):
    """``(x, lo)`` with the leading pad of each axis whose input gradient XLA's operand swap
    would take for a grouping axis (kernel 2, stride 2, a leading pad of 1) moved into ``x``."""
    moved = [a if (k, s, d, a) == (2, 2, 1, 1) else 0 for k, s, d, a in zip(kernel, strides, dilations, lo)]
    if not any(moved):
        return x, lo
    return geo.pad_spatial(x, moved, [0] * len(moved), channels_last), [a - m for a, m in zip(lo, moved)]


# Conv lowerings. XLA's CPU convolution is slow next to its dot (by 2-30x on ResNet/MobileNet
# layers, and worse for gradients), so on CPU a Conv is lowered by its static shapes to dots
# and fused elementwise work; elsewhere (cuDNN, TPU) XLA's convolution is the fast path. Every
# lowering computes the same sums as the convolution (only the float summation order differs)
# and is differentiable by plain JAX: the backward of a dot is dots, of a slice a pad.
# ``jonnx.ops.conv.CONV_LOWERING`` forces one choice ("xla" or "auto") for measurement and tests.
CONV_LOWERING = "auto"
# A channels-last 1x1 convolution over at most this many channels runs as "channel_taps".
TAPS_1X1_CHANNELS = 16
# A channels-last 1x1 kernel of at least this many weights is read as stored (below).
STORED_1X1_MIN = 1 << 18
# "tap_products" (below): the fewest input channels of the kernels laid out for it, the most
# bytes its product of the input with every tap's weights may take, and the fewest output cells
# (batch x map) it needs under TAP_PRODUCTS_CHANNELS channels (weights passed in I(D)HWO).
TAP_PRODUCTS_CHANNELS = 512
TAP_PRODUCTS_BYTES = 8 << 20
TAP_PRODUCTS_MIN_CELLS = 784
# An NC(D)HW 1x1 convolution over maps of at least this many cells is a product batched over
# the images (``_per_image_product``).
PER_IMAGE_MIN_CELLS = 784
# A patch stem (an image stem whose windows do not overlap) with at most this many output cells
# (batch x map) runs as "patches"; larger ones as XLA's convolution.
PATCH_STEM_CELLS = 1024


def kernel_layout_for(w_shape, group: int, strides) -> str:
    """The layout (``KERNEL_LAYOUTS``) a channels-last Conv takes these OI(D)HW weights in,
    chosen by the layout pass without the input's size, which it may not know:

    * "HWOI" on CPU, "OIHW" elsewhere: a 1x1 kernel without groups that the product lowering
      (or, off CPU, XLA's convolution) reads through a reshape, big enough for a relayout copy
      kept beside the weights to matter, over more than ``TAPS_1X1_CHANNELS`` channels (fewer
      run as ``channel_taps``, which reads (D)HWIO). Both are the stored bytes: "HWOI" only
      moves the unit spatial axes first, a view of the weights on the CPU (the model's host
      relayout), because XLA's CPU backend runs a YNNPACK fusion of a product with a reduction
      after it slowly when the product reads a parameter with unit minor axes
      (:mod:`jonnx._hlo`: ResNet-50's last 1x1 convolution before its global average pool),
      and such a module was compiled twice, to fall back. The product packs the weights
      transposed on each call: no cost measured on ResNet-50 at batch 1, where it applies to
      the kernels of at least 2^18 elements, but 3% on MobileNetV2 when every 1x1 kernel took
      it;
    * "IHWO": on CPU, a 2-D kernel of at most 3x3 without groups or strides over at least
      ``TAP_PRODUCTS_CHANNELS`` channels, where XLA's convolution is slowest on small maps, for
      "tap_products" on inputs small enough (``conv_lowering``). On bigger ones XLA's
      convolution reads it 0-6% slower than (D)HWIO (batch 32; batch 1 on 28x28 and larger
      maps). Over 48-64 channels, where the tap products once also ran, XLA's own convolution
      (no longer YNNPACK's) is the faster in the whole model (docs/performance.md, "Narrow tap
      products");
    * "HWIO" otherwise.
    """
    kernel = tuple(w_shape[2:])
    if len(w_shape) < 3 or group != 1:
        return "HWIO"
    if all(k == 1 for k in kernel):
        big = w_shape[1] > TAPS_1X1_CHANNELS and w_shape[0] * w_shape[1] >= STORED_1X1_MIN
        if not big:
            return "HWIO"
        return "HWOI" if lowers_for_cpu() else "OIHW"
    cpu = CONV_LOWERING == "auto" and lowers_for_cpu()
    small_2d = len(kernel) == 2 and max(kernel) <= 3
    if cpu and small_2d and all(s == 1 for s in strides) and w_shape[1] >= TAP_PRODUCTS_CHANNELS:
        return "IHWO"
    return "HWIO"


def conv_lowering(
    x_shape,
    w_shape,
    strides,
    group: int,
    dtype,
    *,
    channels_last: bool = False,
    kernel_layout: str = "HWIO",
    dilations=None,
) -> str:
    """How a Conv with these static shapes runs: ``"xla"``, ``"matmul"`` (1x1 kernels),
    ``"depthwise"`` (shifted multiply-adds), ``"im2col"`` (one dot over stacked shifted slices),
    ``"channel_taps"`` (channels-last over few input channels: broadcast multiply-adds),
    ``"tap_products"`` (channels-last with I(D)HWO weights on small inputs: one dot for all
    taps, then shifted adds) or ``"patches"`` (a small channels-last patch stem: one dot over
    the image cut into its windows). ``dilations`` default to 1.

    Shapes are NC(D)HW / OI(D)HW, or N(D)HWC / (D)HWIO with ``channels_last`` whatever the
    weights' ``kernel_layout``."""
    if not _cpu_lowerings_apply(dtype) or len(x_shape) < 3:
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
    if _is_depthwise(c_in, m, w_in, group):
        return "depthwise"
    # A symbolic size (jax.export) counts as large.
    spatial = x_shape[1:-1] if channels_last else x_shape[2:]
    out_cells = math.prod(
        -(-d // st) if isinstance(d, (int, np.integer)) else 1 << 30 for d, st in zip(spatial, strides)
    )
    # The images it will run on: a chunk's while a large batch is traced to run in chunks
    # (jonnx/_chunks.py), whose jaxpr, traced at the whole batch, runs on that many.
    batch = lowering_batch(x_shape[0]) if isinstance(x_shape[0], (int, np.integer)) else 1 << 30
    cells = batch * out_cells
    product_bytes = cells * taps * m * np.dtype(dtype).itemsize
    if (
        kernel_layout == "IHWO"
        and all(s == 1 for s in strides)
        and product_bytes <= TAP_PRODUCTS_BYTES
        and (c_in >= TAP_PRODUCTS_CHANNELS or cells >= TAP_PRODUCTS_MIN_CELLS)
    ):
        # XLA's 3x3 convolution is slow over 512 channels on small maps, where one product of
        # the input with all taps' weights and the shifted adds are faster (batch 1, 3x3 over
        # 512 on 7x7: 0.85 of the time alone; ResNet-50 at batch 1 runs 0.94 of the time with
        # them). Once that product outgrows the cache it loses (512 on 7x7 at batch 32: 1.4x
        # slower); weights passed in I(D)HWO over fewer channels need many cells, since on few
        # XLA's convolution is quick (64 on 14x14: 1.45x slower). docs/performance.md has the
        # crossovers.
        return "tap_products"
    # k x k: XLA's convolution, except where its output is tiny (at most 16 cells: a ResNet's
    # last stage at 64x64 inputs), where it is pathological on CPU (512->512 with a 2x2 output,
    # batch 32, forward and backward: 826 ms against 21 with im2col). Elsewhere it beats im2col
    # 1.2-2x at batch 32 in both layouts and ties it at batch 1 channels-last: a ResNet-18
    # training step went from 700 to 528 ms and ResNet-50 batch 32 from 4476 to 3479 ms (first
    # call 8.2 to 5.3 s) when im2col was narrowed to tiny outputs (docs/performance.md).
    batched = batch > 1
    if channels_last and _is_patch_stem(c_in, kernel, strides, dilations, group):
        # An image cut into windows that do not overlap (a ViT's or ConvNeXt's 4x4/4 stem):
        # the multiply-adds below lose to XLA's convolution there, and on few cells a product
        # over the windows beats both (2 x 16 x 16 RGB into 32 channels: 0.070 ms against
        # 0.097 and 0.152; 1 x 224 x 224 into 96: XLA 0.91, the product 0.92, the multiply-adds
        # 1.05; at batch 8 3.96, 4.20 and 5.48).
        return "patches" if cells <= PATCH_STEM_CELLS else "xla"
    if channels_last and _is_tap_stem(c_in, taps, group):
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


def _cpu_lowerings_apply(dtype) -> bool:
    """Whether :func:`conv_lowering` and :func:`conv_transpose_lowering` may choose other than
    XLA's convolution: on CPU, in float32 or float64 (half precision stays with XLA, which
    accumulates its convolutions in float32), unless ``CONV_LOWERING`` forces XLA's."""
    return CONV_LOWERING == "auto" and lowers_for_cpu() and np.dtype(dtype) in (np.float32, np.float64)


def _is_depthwise(c_in: int, m: int, w_in: int, group: int) -> bool:
    """One kernel per channel, one output per channel: "depthwise" in any layout."""
    return group == c_in and group > 1 and w_in == 1 and m == c_in


def _is_tap_stem(c_in: int, taps: int, group: int) -> bool:
    """A small image stem (RGB or grey, at most 75 weights per output channel): channels-last,
    "channel_taps"."""
    return group == 1 and 1 < taps and c_in <= 3 and c_in * taps <= 75


def _is_patch_stem(c_in: int, kernel, strides, dilations, group: int) -> bool:
    """A small image stem (:func:`_is_tap_stem`) whose windows tile the image: stride equal to
    the kernel, no dilation (None: strides or dilations of 1)."""
    tiled = strides is not None and tuple(strides) == tuple(kernel)
    unit = dilations is None or all(d == 1 for d in dilations)
    return tiled and unit and _is_tap_stem(c_in, math.prod(kernel), group)


def runs_as_tap_loop(w_shape, group: int, dtype, strides=None, dilations=None) -> bool:
    """Whether a channels-last Conv with these OI(D)HW weights runs as a loop of multiply-adds
    over its taps that XLA fuses into whatever reads it (a depthwise convolution, a small image
    stem other than a patch stem: :func:`conv_lowering` on CPU, whatever the input's size).

    A pool that reads its windows as strided slices takes that loop into its own, which XLA
    vectorizes poorly: the layout pass marks such pools (``after_tap_loop``, ops/pool.py)."""
    if not _cpu_lowerings_apply(dtype) or len(w_shape) < 3:
        return False
    m, w_in, kernel = w_shape[0], w_shape[1], tuple(w_shape[2:])
    if _is_depthwise(group * w_in, m, w_in, group):
        return True
    patches = _is_patch_stem(group * w_in, kernel, strides, dilations, group)
    return _is_tap_stem(group * w_in, math.prod(kernel), group) and not patches


def _conv_matmul(x, w, strides, dilations, lo, hi, precision, channels_last, layout):
    """A 1x1 convolution: a product over channels of the (padded, strided) input. The weights
    are read through a reshape in any layout, never a transpose (XLA makes a slow copy of a
    transposed weight argument, not of the reshaped one)."""
    ones = (1,) * (jnp.ndim(x) - 2)
    xp = geo.pad_spatial(x, lo, hi, channels_last)
    (xs,) = geo.taps(
        xp, ones, strides, dilations, geo.out_spatial(xp, ones, strides, dilations, channels_last), channels_last
    )
    if layout == "OIHW":
        weights, spec = jnp.reshape(w, jnp.shape(w)[:2]), "mc"
    elif layout == "HWOI":
        weights, spec = jnp.reshape(w, jnp.shape(w)[-2:]), "mc"
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
    xp = geo.pad_spatial(x, lo, hi, channels_last)
    out = geo.out_spatial(xp, kernel, strides, dilations, channels_last)
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
    forward 40 ms at batch 32 channels-last, weight gradient 280 ms. Channels-first (the
    training layout) with static sizes, the taps' tangents enter through a primitive whose
    transpose sums every tap in one variadic reduction (:func:`tap_weight_term`: 0.24-0.74 of
    a layer's time against the trees below, MobileNetV2's step 0.83-0.96). Channels-last, where
    that reduction would keep the minor axis, each tap's weight tangent meets its window
    through :func:`spread_product`, whose transpose adds the batch's halves in one fused loop
    and sums on as a tree of halves: 120-130 ms there. Those windows are plain slices (opaque
    ones get materialized for the two halves). The input's tangent is :func:`_input_tangent`
    (unstrided) or :func:`_strided_input_tangent`, whose transposes read the cotangent once
    (per phase); with a symbolic size, plain slices, whose transposes are pads. Plain JAX
    throughout (the primitive's derivatives are plain sums), so every order of derivative,
    forward mode and vmap follow.
    """
    return geo.tap_sum(geo.taps(xp, kernel, strides, dilations, out, channels_last, opaque=True), taps)


def _shifted_products_jvp(kernel, strides, dilations, out, channels_last, primals, tangents):
    (xp, taps), (t_xp, t_taps) = primals, tangents
    y = _shifted_products(xp, taps, kernel, strides, dilations, out, channels_last)
    terms = []
    if not isinstance(t_xp, SymbolicZero):
        if geo.static_unstrided(jnp.shape(t_xp), strides):
            terms.append(_input_tangent(t_xp, taps, kernel, dilations, channels_last))
        elif static_sizes(jnp.shape(t_xp)):
            terms.append(_strided_input_tangent(t_xp, taps, kernel, strides, dilations, out, channels_last))
        else:
            terms.append(geo.tap_sum(geo.taps(t_xp, kernel, strides, dilations, out, channels_last), taps))
    if not isinstance(t_taps, SymbolicZero):
        if not channels_last and static_sizes(jnp.shape(xp)):
            terms.append(tap_weight_term(xp, t_taps, kernel, strides, dilations, out))
        else:
            windows = geo.taps(xp, kernel, strides, dilations, out, channels_last)
            terms.append(geo.tap_sum(windows, t_taps, spread_product))
    return y, functools.reduce(operator.add, terms) if terms else jnp.zeros_like(y)


_shifted_products.defjvp(_shifted_products_jvp, symbolic_zeros=True)


def _input_tangent(t_xp, taps, kernel, dilations, channels_last):
    """The unstrided depthwise sum over ``t_xp`` (the input's tangent), written so that its
    transpose is the depthwise lowering again: the cotangent padded by the kernel's span on
    each side, read through opaque windows (:func:`jonnx.ops._window.opaque_window`) with the taps reversed.

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
    pad = geo.full(span, 0, channels_last)
    full = tuple(n + p for n, p in zip(jnp.shape(t_xp), pad))  # the output plus the span each side
    # Tap i's term lands at the reversed tap's offset; cropping the span from each side then
    # leaves sum_i window_i(t_xp) * taps[i].
    starts = (
        geo.full(((k - 1 - o) * d for k, o, d in zip(kernel, offset, dilations)), 0, channels_last)
        for offset in itertools.product(*(range(k) for k in kernel))
    )
    total = geo.tap_sum(starts, taps, lambda start, tap: geo.opaque_place(t_xp * tap, start, full))
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
        limit = geo.with_spatial(
            jnp.shape(t_xp), (p + (b - 1) * s + 1 for p, b, s in zip(phase, blocks, strides)), channels_last
        )
        source = lax.slice(t_xp, geo.full(phase, 0, channels_last), limit, geo.full(strides, 1, channels_last))
        full = tuple(n + e for n, e in zip(jnp.shape(source), geo.full(reach, 0, channels_last)))
        placed = geo.tap_sum(
            (geo.full((r - q_a for r, q_a in zip(reach, q)), 0, channels_last) for _, q in members),
            [taps[i] for i, _ in members],
            lambda start, tap, source=source, full=full: geo.opaque_place(source * tap, start, full),
        )
        start = geo.full(reach, 0, channels_last)
        size = geo.with_spatial(jnp.shape(source), out, channels_last)
        term = lax.slice(placed, start, tuple(a + n for a, n in zip(start, size)))
        total = term if total is None else total + term
    return total


def _conv_im2col(x, w, strides, dilations, lo, hi, precision, channels_last, layout):
    """A k x k convolution: one product of the weights with the stacked shifted windows."""
    kernel = _kernel_dims(jnp.shape(w), layout)[2]
    xp = geo.pad_spatial(x, lo, hi, channels_last)
    out = geo.out_spatial(xp, kernel, strides, dilations, channels_last)
    windows = list(geo.taps(xp, kernel, strides, dilations, out, channels_last))
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
    zp = geo.pad_spatial(z, lo, hi, True)  # (N, *padded map, K x M)
    # Split into the taps' blocks before the windows are taken: the derivative of a split is
    # one concatenation, where that of a window of one block is a pad to all K x M channels
    # summed over the taps (a 3x3 over 64 channels on 56x56, forward and backward: 63 ms
    # against 7.2 this way; XLA's convolution 5.1).
    parts = jnp.split(zp, math.prod(kernel), axis=-1)
    out = geo.out_spatial(zp, kernel, strides, dilations, True)
    return geo.tree_sum(geo.taps(parts[0], kernel, strides, dilations, out, True, parts=parts))


def _conv_channel_taps(x, w, strides, dilations, lo, hi, precision, channels_last, layout):
    """A channels-last convolution over few channels (an image stem, a 1x1 over at most 16
    channels): for each kernel position and input channel, that channel's shifted window times
    the weights of every output channel, all summed in one fused loop (the depthwise lowering,
    with a sum over input channels too). ``conv_lowering`` picks it only channels-last, where
    the output channels are the minor axis that the loop vectorizes; ``channels_last`` and
    ``layout`` (always (D)HWIO here) are the lowerings' common signature."""
    kernel = _kernel_dims(jnp.shape(w), layout)[2]
    xp = geo.pad_spatial(x, lo, hi, True)
    out = geo.out_spatial(xp, kernel, strides, dilations, True)
    weights = jnp.reshape(w, (-1,) + jnp.shape(w)[-2:])  # (K, C, M)
    return geo.tree_sum(
        window[..., c : c + 1] * weights[i, c]  # (N, *out, 1) * (M,)
        for i, window in enumerate(geo.taps(xp, kernel, strides, dilations, out, True))
        for c in range(jnp.shape(weights)[1])
    )


def _conv_patches(x, w, strides, dilations, lo, hi, precision, channels_last, layout):
    """A channels-last convolution whose windows tile the (padded) input, stride equal to the
    kernel: the input cut into its windows by a reshape, then one product with the HWIO
    weights. ``conv_lowering`` picks it for small patch stems only."""
    kernel = _kernel_dims(jnp.shape(w), layout)[2]
    xp = geo.pad_spatial(x, lo, hi, True)
    out = geo.out_spatial(xp, kernel, strides, dilations, True)
    xp = xp[(slice(None), *(slice(0, o * k) for o, k in zip(out, kernel)))]  # whole windows only
    n, c = jnp.shape(xp)[0], jnp.shape(xp)[-1]
    windows = jnp.reshape(xp, (n, *(d for o, k in zip(out, kernel) for d in (o, k)), c))  # (N, o1, k1, o2, k2, C)
    rank = len(kernel)
    cells = tuple(1 + 2 * i for i in range(rank))
    taps = tuple(2 + 2 * i for i in range(rank))
    windows = jnp.transpose(windows, (0, *cells, *taps, 1 + 2 * rank))  # (N, o1, o2, k1, k2, C)
    flat = jnp.reshape(windows, (n, *out, -1))
    return jnp.einsum("n...t,tm->n...m", flat, jnp.reshape(w, (-1, jnp.shape(w)[-1])), precision=precision)


_LOWERINGS = {
    "patches": _conv_patches,
    "matmul": _conv_matmul,
    "depthwise": _conv_depthwise,
    "im2col": _conv_im2col,
    "channel_taps": _conv_channel_taps,
    "tap_products": _conv_tap_products,
}
# The channels-last weight layouts each lowering reads (NC(D)HW ones read OI(D)HW).
_READS = {
    "patches": ("HWIO",),
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
    geo.kernel_attr(attrs, kernel, ctx)
    in_shape = geo.spatial(jnp.shape(x), channels_last)
    strides, dilations = geo.strides_dilations(attrs, n, ctx)
    out_pad = geo.ints(attrs["output_padding"], n, 0, "output_padding", ctx)
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
    return geo.add_bias(y, b, ctx, channels_last)


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
    # A strided axis with no padding at either end, which XLA's operand swap can take for a
    # grouping axis in this convolution or in its weight gradient (see above), gets one more
    # leading zero, cut off below.
    extra = [int(s > 1 and a <= 0 and c <= 0) for s, a, c in zip(g.strides, conv_lo, conv_hi)]
    y = lax.conv_general_dilated(
        x,
        kw,
        window_strides=(1,) * n,
        padding=tuple((max(a, 0) + e, max(c, 0)) for a, c, e in zip(conv_lo, conv_hi, extra)),
        lhs_dilation=g.strides,
        rhs_dilation=g.dilations,
        dimension_numbers=geo.dimension_numbers(n, g.channels_last, "OIHW"),
        feature_group_count=g.group,
        precision=g.precision,
    )
    if any(a < 0 or c < 0 or e for a, c, e in zip(conv_lo, conv_hi, extra)):
        # Pads larger than the kernel span crop the output; XLA wants non-negative padding.
        first = 1 if g.channels_last else 2
        index = tuple(
            slice(e - min(a, 0), jnp.shape(y)[first + i] + min(c, 0))
            for i, (a, c, e) in enumerate(zip(conv_lo, conv_hi, extra))
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
    mode = geo.auto_pad(attrs)
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
        return [list(p) for p in geo.explicit_pads(attrs, n, ctx)]
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
    if not _cpu_lowerings_apply(dtype) or all(s == 1 for s in strides):
        return "xla"
    if not static_sizes(geo.spatial(x_shape, channels_last)):
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
    strides, dilations = geo.strides_dilations(attrs, n, ctx)
    lo, hi = geo.explicit_pads(attrs, n, ctx)
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
        # Padded first, not by the patches' convolution: the adjoint of that convolution's
        # padding of 1 on a stride-2 axis of 2 would meet XLA's operand swap (see above).
        return lax.conv_general_dilated_patches(
            geo.pad_spatial(img, lo, hi),
            block,
            strides,
            ((0, 0),) * n,
            rhs_dilation=dilations,
            dimension_numbers=geo.dimension_numbers(n),
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
    geo.kernel_attr(attrs, kernel, ctx)
    group, offset_group = int(attrs["group"]), int(attrs["offset_group"])
    if group < 1 or c != jnp.shape(w)[1] * group or oc % group:
        raise ctx.error(f"X has {c} channels and W has shape {jnp.shape(w)}: inconsistent with group={group}")
    k = math.prod(kernel)
    if offset_group < 1 or c % offset_group or jnp.shape(offset)[1] != offset_group * k * nd:
        raise ctx.error(
            f"offset of shape {jnp.shape(offset)} needs {offset_group * k * nd} channels "
            f"(offset_group * prod(kernel) * {nd}) and X's {c} channels divisible by offset_group"
        )
    strides, dilations = geo.strides_dilations(attrs, nd, ctx)
    lo, hi = geo.explicit_pads(attrs, nd, ctx)
    out = tuple(jnp.shape(offset)[2:])
    want = tuple(
        (i + a + e - (kk - 1) * d - 1) // s + 1
        for i, a, e, kk, d, s in zip(jnp.shape(x)[2:], lo, hi, kernel, dilations, strides)
    )
    if out != want:
        raise ctx.error(f"offset's spatial shape {out} differs from the output shape {want}")
    dtype = jnp.result_type(x)
    # Half types: sampling positions, weights and sums in float32, rounded once (in float16 a
    # position of 5.3 is 5.3 +- 0.002, and 222 of 256 outputs were off onnxruntime's).
    x, w, offset, b, mask = widen_halves(x, w, offset, b, mask)
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
    return (geo.add_bias(y, b, ctx).astype(dtype),)

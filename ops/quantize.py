"""Linear quantization: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, and the
integer products MatMulInteger, QLinearMatMul, ConvInteger and QLinearConv.

Scales and zero points are per tensor (a scalar), per axis (1-D along ``axis``) or, from
opset 21, blocked (``block_size`` copies of each scale along ``axis``). Quantization rounds
half to even and saturates to the target type's range; float8 targets follow Cast's
``saturate`` rules. Integer products accumulate in int32, as ONNX specifies.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import onnx
from jax import lax

from jonnx import _cpu
from jonnx._attributes import schema_defaults
from jonnx._registry import Attrs, Inputs, OpContext, Outputs, register, register_pass_domain
from jonnx.ops import _window as geo
from jonnx.ops._util import (
    array_module,
    canonical,
    compute_type,
    dtype_of,
    exact_divide,
    lowers_for_cpu,
    normalize_axis,
    onnx_dtype,
)
from jonnx.ops.cast import cast_numeric
from jonnx.ops.conv import convolve  # Conv's geometry (pads, auto_pad, groups) lives there

_INT_RANGES = {
    np.dtype(np.uint8): (0, 255),
    np.dtype(np.int8): (-128, 127),
    np.dtype(np.uint16): (0, 65535),
    np.dtype(np.int16): (-32768, 32767),
    np.dtype(ml_dtypes.uint4): (0, 15),
    np.dtype(ml_dtypes.int4): (-8, 7),
    np.dtype(ml_dtypes.uint2): (0, 3),
    np.dtype(ml_dtypes.int2): (-2, 1),
}
_FLOAT_TARGETS = {
    np.dtype(t)
    for t in (
        ml_dtypes.float8_e4m3fn,
        ml_dtypes.float8_e4m3fnuz,
        ml_dtypes.float8_e5m2,
        ml_dtypes.float8_e5m2fnuz,
        ml_dtypes.float4_e2m1fn,
        ml_dtypes.float6_e2m3fn,
        ml_dtypes.float6_e3m2fn,
    )
}


def _param(p, x_shape, axis, block_size, ctx, what: str):
    """A scale or zero point shaped to broadcast against ``x`` (per tensor, axis or block); a
    numpy one (an initializer) stays numpy."""
    if p is None:
        return None
    xp = array_module(p)
    rank = len(x_shape)
    if jnp.ndim(p) == 0 or (jnp.ndim(p) == 1 and jnp.shape(p)[0] == 1):
        return xp.reshape(p, ())
    axis = normalize_axis(1 if axis is None else int(axis), rank, ctx)
    if not block_size:
        if jnp.ndim(p) != 1 or jnp.shape(p)[0] != x_shape[axis]:
            raise ctx.error(
                f"{what} of shape {jnp.shape(p)} must be a scalar or 1-D of length {x_shape[axis]} "
                f"(axis {axis} of the input of shape {tuple(x_shape)}); blocked quantization needs "
                "block_size"
            )
        return xp.reshape(p, tuple(x_shape[axis] if i == axis else 1 for i in range(rank)))
    block_size = int(block_size)
    expected = tuple(-(-d // block_size) if i == axis else d for i, d in enumerate(x_shape))
    if block_size < 0 or tuple(jnp.shape(p)) != expected:
        raise ctx.error(
            f"{what} of shape {jnp.shape(p)} does not fit blocked quantization of an input of shape "
            f"{tuple(x_shape)} with block_size={block_size} on axis {axis} (expected {expected})"
        )
    p = xp.repeat(p, block_size, axis=axis)
    return xp.take(p, xp.arange(x_shape[axis]), axis=axis)


def _saturate_round(q, zero_point, target: np.dtype, saturate: bool, ctx):
    """``saturate(round(q) + zero_point)`` into ``target`` (round half to even)."""
    if target in _INT_RANGES:
        lo, hi = _INT_RANGES[target]
        acc = compute_type(dtype_of(q))
        q = jnp.round(q).astype(acc)
        if zero_point is not None:
            q = q + jnp.asarray(zero_point).astype(acc)
        return jnp.clip(q, lo, hi).astype(target)
    if target in _FLOAT_TARGETS:
        if zero_point is not None:
            q = q + jnp.asarray(zero_point).astype(dtype_of(q))
        return cast_numeric(q, target, saturate, "up", ctx)
    raise ctx.error(f"{target} is not a quantized type (uint8/int8/uint16/int16/4-bit/2-bit/float8)")


def quantize_linear(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``QuantizeLinear``, opsets 10+: ``y = saturate(round(x / y_scale) + y_zero_point)``."""
    x, scale, zero_point = inputs
    output_dtype = attrs.get("output_dtype") or 0
    if zero_point is not None:
        target = dtype_of(zero_point)
        if output_dtype and onnx_dtype(output_dtype) != target:
            raise ctx.error(
                f"output_dtype {onnx.TensorProto.DataType.Name(output_dtype)} differs from the "
                f"zero point's type {target}"
            )
    else:
        target = onnx_dtype(output_dtype) if output_dtype else np.dtype(np.uint8)
    shape = jnp.shape(x)
    axis, block = attrs.get("axis"), attrs.get("block_size")
    scale = _param(scale, shape, axis, block, ctx, "y_scale")
    zero_point = _param(zero_point, shape, axis, block, ctx, "y_zero_point")
    precision = attrs.get("precision")
    # The division runs in the precision attribute's type, else numpy's promotion of x and
    # the scale (what ONNX's reference and onnxruntime do).
    compute = onnx_dtype(precision) if precision else jnp.promote_types(dtype_of(x), dtype_of(scale))
    q = exact_divide(jnp.asarray(x).astype(compute), jnp.asarray(scale).astype(compute))
    saturate = attrs.get("saturate")
    return (_saturate_round(q, zero_point, target, True if saturate is None else bool(saturate), ctx),)


register("QuantizeLinear", since=(10, 13, 19, 21, 23, 24, 25, 28))(quantize_linear)


def dequantize_linear(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``DequantizeLinear``, opsets 10+: ``y = (x - x_zero_point) * x_scale``."""
    x, scale, zero_point = inputs
    output_dtype = attrs.get("output_dtype") or 0
    out = onnx_dtype(output_dtype) if output_dtype else dtype_of(scale)
    shape = jnp.shape(x)
    axis, block = attrs.get("axis"), attrs.get("block_size")
    scale = _param(scale, shape, axis, block, ctx, "x_scale")
    zero_point = _param(zero_point, shape, axis, block, ctx, "x_zero_point")
    # float32 at least, as the reference computes, then the output type.
    compute = jnp.promote_types(jnp.float32, dtype_of(scale))
    # Integer weights and their zero points (initializers) convert and subtract in numpy, once
    # while tracing, where the scale is a parameter (a per-channel one): in JAX each weight's
    # shape compiled its own small computations (30 of a QDQ ResNet-50's 93 compilations).
    # One float32 operation each, so numpy's result is XLA's.
    xp = array_module(x, zero_point)
    dx = xp.asarray(x).astype(compute)
    if zero_point is not None:
        dx = dx - xp.asarray(zero_point).astype(compute)
    return ((dx * jnp.asarray(scale).astype(compute)).astype(out),)


register("DequantizeLinear", since=(10, 13, 19, 21, 23, 24, 25, 28))(dequantize_linear)


@register("DynamicQuantizeLinear", since=11)
def dynamic_quantize_linear(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``DynamicQuantizeLinear``, opset 11: uint8 with a scale and zero point from x's range."""
    (x,) = inputs
    x = jnp.asarray(x)
    hi, lo = _extremes(x)
    hi = jnp.maximum(0, hi).astype(jnp.float32)
    lo = jnp.minimum(0, lo).astype(jnp.float32)
    scale = exact_divide(jnp.where(hi == lo, jnp.float32(1), hi - lo), jnp.float32(255))
    zero_point = jnp.round(jnp.clip(exact_divide(-lo, scale), 0, 255))
    y = jnp.clip(jnp.round(exact_divide(x.astype(jnp.float32), scale)) + zero_point, 0, 255).astype(jnp.uint8)
    return y, scale.astype(x.dtype), zero_point.astype(jnp.uint8)


@jax.custom_jvp
def _extremes(x):
    """``(max(x), min(x))``: one reduction with two results along the last axis, then the
    row results' max and min. Two separate whole-array reductions each became a slow windowed
    reduction on XLA CPU, and one two-result reduction over the flattened array runs as one
    serial loop (1.4 ms of a 128 x 3072 activation, its producer fused in); by rows it is a
    tenth of that: the int8 BERT encoder (int8 dots) 26.7 -> 22.2 ms at batch 1, 717 ->
    569 ms at batch 32, alternating in one process. An empty ``x`` gives (-inf, inf), which
    DynamicQuantizeLinear clamps to 0. JAX differentiates a two-result reduction by unrolling
    it into a tree of selects; the derivative here is jnp.max's and jnp.min's."""
    last = jnp.shape(x)[-1] if jnp.ndim(x) and jnp.size(x) else 1
    rows = jnp.reshape(x, (-1, last))
    inits = (jnp.array(-jnp.inf, rows.dtype), jnp.array(jnp.inf, rows.dtype))
    hi, lo = lax.reduce((rows, rows), inits, lambda a, b: (lax.max(a[0], b[0]), lax.min(a[1], b[1])), (1,))
    return jnp.max(hi, initial=-jnp.inf), jnp.min(lo, initial=jnp.inf)


@_extremes.defjvp
def _extremes_jvp(primals, tangents):
    return jax.jvp(lambda x: (jnp.max(x), jnp.min(x)), primals, tangents)


def _centered(x, zero_point, per_row: bool):
    """``x - zero_point`` in int32; a 1-D zero point of ``A`` is per row (one per M)."""
    x = jnp.asarray(x).astype(jnp.int32)
    if zero_point is None:
        return x
    zero_point = jnp.asarray(zero_point).astype(jnp.int32)
    if per_row and jnp.ndim(zero_point) == 1 and jnp.shape(zero_point)[0] > 1:
        zero_point = zero_point[:, None]
    return x - zero_point


def _requantize(acc, multiplier, zero_point, target: np.dtype, ctx):
    """``saturate(round(acc * multiplier) + zero_point)`` for the QLinear* ops."""
    # int32 * float, as numpy (the reference) promotes it: float64 when 64-bit types are on,
    # so the int32 accumulator is exact and ties round as ONNX's expected outputs do.
    wide = canonical(np.float64)
    q = acc.astype(wide) * jnp.asarray(multiplier).astype(wide)
    return _saturate_round(q, zero_point, target, True, ctx)


def _as_int8(x) -> tuple[Any, int]:
    """8-bit integers as int8 values and the offset that restores them: ``x = x8 + offset``.

    Weights (integer initializers) are numpy here and stay numpy, so that their shift and
    sums are computed once at trace time rather than constant-folded by XLA, which is slow.
    """
    xp = array_module(x)
    if x.dtype == np.uint8:
        return (x.astype(np.int16) - 128).astype(np.int8), 128
    return xp.asarray(x).astype(np.int8), 0


def _zero_offset(offset: int, zero_point, per_row: bool) -> jax.Array:
    """``offset - zero_point`` in int32, shaped to broadcast over rows (A) or columns (B)."""
    if zero_point is None:
        return jnp.int32(offset)
    centered = offset - jnp.asarray(zero_point).astype(jnp.int32)
    if per_row and jnp.ndim(centered) == 1 and jnp.shape(centered)[0] > 1:
        return centered[:, None]
    return centered


# How the 8-bit products run (``"auto"``, or one of ``"int8"``, ``"bfloat16"``, ``"float32"``
# forced, for measurement and tests): every choice is exact (int32 results equal to the
# integer product's).
INTEGER_MATMUL = "auto"

# Float dots of 8-bit values are exact while every partial sum is an integer that float32
# holds: |a8 * b8| <= 128 * 128 = 2**14, so sums of up to 2**10 terms stay within 2**24
# whatever the summation order. Longer contractions run in chunks of this many, summed in int32
# (a BERT FFN's K = 3072 as three dots measured as fast as one, within noise).
_EXACT_CHUNK = 1024


def integer_matmul_mode() -> str:
    """The product ``integer_matmul`` runs: ``"int8"`` (int8 x int8 into int32),
    ``"bfloat16"`` or ``"float32"`` (the 8-bit values as floats, float32 sums, exact).

    On CPU the fastest depends on the instructions (docs/performance.md, "Quantized paths"):
    with AMX's int8 tiles the int8 dot is 2-3.5x faster than bfloat16; without them, where
    the CPU has bfloat16 dot instructions (AVX512-BF16), bfloat16 beats the VNNI int8 dot at
    BERT's sizes; on an x86 CPU with neither bfloat16 nor int8 dot instructions (VNNI), float32
    products beat the int8 dot on two cores (the int8 BERT on an AVX2 AMD Zen 3: 0.81-0.92 of
    the time)."""
    if INTEGER_MATMUL != "auto":
        return INTEGER_MATMUL
    if lowers_for_cpu():
        flags = _cpu.cpu_info()
        if "amx_int8" in flags:
            return "int8"
        if flags & {"avx512_bf16", "amx_bf16"}:
            return "bfloat16"
        if "sse2" in flags and not flags & {"avx512_vnni", "avx_vnni"}:  # x86 without int8 dots
            return "float32"
    return "int8"


def _exact_product(a8, b8, mode: str) -> jax.Array:
    """``a8 @ b8`` in int32 for int8 operands, by ``mode`` (see :func:`integer_matmul_mode`)."""
    k = jnp.shape(a8)[-1]
    if mode == "int8" or k == 0:
        return jnp.matmul(a8, b8, preferred_element_type=jnp.int32)
    ftype = jnp.bfloat16 if mode == "bfloat16" else jnp.float32
    total = None
    for start in range(0, k, _EXACT_CHUNK):
        rows = slice(start, min(k, start + _EXACT_CHUNK))
        part = jnp.matmul(
            _as_float(a8[..., rows], ftype),
            _as_float(b8[rows] if jnp.ndim(b8) == 1 else b8[..., rows, :], ftype),
            preferred_element_type=jnp.float32,
            precision=lax.Precision.HIGHEST,  # no TF32 on accelerators
        ).astype(jnp.int32)
        total = part if total is None else total + part
    return total


def _as_float(x, ftype):
    """8-bit integers as ``ftype`` (exact: bfloat16 holds every integer up to 256); numpy
    weights stay numpy, converted once at trace time."""
    if isinstance(x, np.ndarray):
        return x.astype(np.dtype(ftype))
    return x.astype(ftype)


def integer_matmul(a, b, a_zero, b_zero) -> jax.Array:
    """``(a - a_zero) @ (b - b_zero)`` for 8-bit ``a`` and ``b``, exactly, in int32.

    The product runs on int8 values (XLA on CPU multiplies int8 by int8 into int32 about six
    times faster than int32 by int32: a BERT-base projection 1.8 ms against 11 ms; where the
    CPU has bfloat16 dot instructions, the int8 values as bfloat16 with float32 sums are
    faster still, docs/performance.md): with ``A = a8 + ca`` (``ca = offset - a_zero``, per
    row or scalar) and ``B = b8 + cb`` (per column or scalar),
    ``A @ B = a8 @ b8 + ca * colsum(b8) + cb * rowsum(a8) + K * ca * cb``, every term exact.
    """
    if not all(dtype_of(x) in (np.int8, np.uint8) for x in (a, b)):  # float8 (opset 21)
        return jnp.matmul(_centered(a, a_zero, True), _centered(b, b_zero, False))
    a8, a_offset = _as_int8(a)
    b8, b_offset = _as_int8(b)
    ca = _zero_offset(a_offset, a_zero, per_row=True)
    cb = _zero_offset(b_offset, b_zero, per_row=False)
    product = _exact_product(a8, b8, integer_matmul_mode())
    row_sums = _int32_sum(a8, axis=-1)
    col_sums = _int32_sum(b8, axis=-2)
    k = jnp.int32(jnp.shape(a8)[-1])
    return product + ca * col_sums + cb * row_sums + k * ca * cb


def _int32_sum(x, axis: int):
    xp = array_module(x)
    return xp.sum(x, axis=axis, keepdims=True, dtype=np.int32)


@register("MatMulInteger", since=10)
def matmul_integer(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``MatMulInteger``, opset 10: ``(A - a_zero_point) @ (B - b_zero_point)`` in int32."""
    a, b, a_zero, b_zero = inputs
    return (integer_matmul(a, b, a_zero, b_zero),)


def _row_scale(scale):
    return scale[:, None] if jnp.ndim(scale) == 1 and jnp.shape(scale)[0] > 1 else scale


@register("QLinearMatMul", since=(10, 21))
def qlinear_matmul(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``QLinearMatMul``, opsets 10 and 21 (21 adds float8 and float16/bfloat16 scales)."""
    a, a_scale, a_zero, b, b_scale, b_zero, y_scale, y_zero = inputs
    acc = integer_matmul(a, b, a_zero, b_zero)
    # The scales combine in their own type first, as onnxruntime and the reference do.
    multiplier = exact_divide(_row_scale(jnp.asarray(a_scale)) * jnp.asarray(b_scale), jnp.asarray(y_scale))
    target = dtype_of(y_zero) if y_zero is not None else dtype_of(a)
    return (_requantize(acc, multiplier, y_zero, target, ctx),)


def _centered_weights(w, zero_point):
    """``w - zero_point`` (per tensor or per output channel) in int32; numpy weights stay numpy."""
    xp = array_module(w, zero_point)
    w = xp.asarray(w).astype(np.int32)
    if zero_point is None:
        return w
    zero_point = xp.asarray(zero_point).astype(np.int32)
    if zero_point.ndim == 1 and zero_point.shape[0] == w.shape[0]:
        zero_point = xp.reshape(zero_point, (-1,) + (1,) * (w.ndim - 1))
    return w - zero_point


# The most kernel positions a convolution run as an 8-bit product gathers (one slice each):
# a 7 x 7 stem has 49; deeper windows compile slowly that way (4,200 taps: 100 s).
_PRODUCT_TAPS = 64


def integer_conv(
    x, x_zero, w, w_zero, bias, attrs: Mapping[str, Any], ctx: OpContext, *, channels_last: bool = False
) -> jax.Array:
    """Conv of 8-bit ``x - x_zero`` by ``w - w_zero`` (zero points per tensor, or per output
    channel for ``w``) exactly, in int32, plus an int32 ``bias``. With ``channels_last``, ``x``
    and the result are N(D)HWC (``w`` stays OI(D)HW).

    XLA on CPU convolves int32 13-40 times slower than float32 (a 512-channel 7x7 3x3
    convolution: 314 ms against 8), and compiles some deep ones for up to a minute
    (docs/known_issues.md). So on CPU an ungrouped one of at most ``_PRODUCT_TAPS`` kernel
    positions is one exact 8-bit product over the windows' taps (:func:`integer_matmul`:
    bfloat16 dots where the CPU has them), the input padded with its zero point so that the
    padding counts as zero; otherwise (grouped, or on GPUs and TPUs, whose convolutions are
    strong) two exact float32 convolutions (:func:`_conv_in_float_halves`).
    """
    group = int(attrs["group"])
    per_tensor = x_zero is None or jnp.ndim(x_zero) == 0
    if per_tensor and _well_formed(x, w, group, channels_last) and runs_as_integer_product(jnp.shape(w), group):
        y = _conv_as_integer_product(x, x_zero, w, w_zero, attrs, ctx, channels_last)
    else:
        x = _centered(x, x_zero, False)
        y = _conv_in_float_halves(x, _centered_weights(w, w_zero), attrs, ctx, channels_last)
    bias = None if bias is None else jnp.asarray(bias).astype(jnp.int32)
    return geo.add_bias(y, bias, ctx, channels_last)


def runs_as_integer_product(w_shape, group: int) -> bool:
    """Whether :func:`integer_conv` runs a convolution by these OI(D)HW weights, its input's
    zero point per tensor, as one 8-bit product: on CPU, ungrouped, of at most
    ``_PRODUCT_TAPS`` kernel positions."""
    return group == 1 and lowers_for_cpu() and 0 < math.prod(w_shape[2:]) <= _PRODUCT_TAPS


def _conv_as_integer_product(
    x, x_zero, w, w_zero, attrs: Mapping[str, Any], ctx: OpContext, channels_last: bool = False
) -> jax.Array:
    """An ungrouped ConvInteger as ``integer_matmul`` of the weights (M, C * taps) by the
    windows' taps (N, C * taps, positions), both in (channel, kernel position) order; with
    ``channels_last``, of the taps (N, positions, taps * C) by the weights (taps * C, M), both
    in (kernel position, channel) order, which the product leaves N(D)HWC."""
    m, c, *kernel = jnp.shape(w)
    n, in_spatial = jnp.shape(x)[0], geo.spatial(jnp.shape(x), channels_last)
    geo.kernel_attr(attrs, kernel, ctx)
    strides, dilations = geo.strides_dilations(attrs, len(kernel), ctx)
    lo, hi, _ = geo.window_pads(in_spatial, kernel, strides, dilations, attrs, ctx)
    if any(lo) or any(hi):
        fill = jnp.zeros((), x.dtype) if x_zero is None else jnp.asarray(x_zero).astype(x.dtype)
        pads = geo.full([(a, b, 0) for a, b in zip(lo, hi)], (0, 0, 0), channels_last)
        x = lax.pad(jnp.asarray(x), fill, pads)
    out = geo.out_spatial(x, kernel, strides, dilations, channels_last)
    size, positions, rank = c * math.prod(kernel), math.prod(out), len(kernel)
    if channels_last:
        windows = geo.stacked_windows(x, kernel, strides, dilations, out, True, at=1 + rank)  # N, *out, *kernel, C
        weights = _kernel_for(w, True).reshape(size, m)  # numpy weights stay numpy
        y = integer_matmul(jnp.reshape(windows, (n, positions, size)), weights, x_zero, w_zero)
        return jnp.reshape(y, (n, *out, m))
    windows = geo.stacked_windows(x, kernel, strides, dilations, out, False, at=2)  # N, C, *kernel, *out
    # The weights on the left keep NCHW's order: (M, K) @ (N, K, positions), no transposes.
    y = integer_matmul(w.reshape(m, -1), jnp.reshape(windows, (n, size, positions)), w_zero, x_zero)  # numpy w stays
    return jnp.reshape(y, (n, m, *out))


# The most multiply-adds one float32 convolution of _conv_in_float_halves may sum: each product
# of a 4-bit half of x with a centered weight is at most 16 * 255 in magnitude, and every
# partial sum of fewer than 2**24 / (16 * 255) of them is an integer float32 holds exactly.
_EXACT_FAN_IN = (2**24 - 1) // (16 * 255)
# The same for products of the centered 8-bit values themselves (at most 255 * 255): windows of
# this many multiply-adds (a depthwise 3 x 3 or 5 x 5, small groups) need no halves.
_EXACT_WHOLE_FAN_IN = (2**24 - 1) // (255 * 255)


def _conv_in_float_halves(x, w, attrs: Mapping[str, Any], ctx: OpContext, channels_last: bool = False) -> jax.Array:
    """Conv of zero-point-centered 8-bit integers (each in [-255, 255]) exactly, in int32, by
    float32 convolutions. With ``channels_last``, ``x`` and the result are N(D)HWC (``w``
    stays OI(D)HW here).

    Split ``x = 16 * hi + lo`` with ``lo`` in [0, 15] and ``hi`` in [-16, 15], and the input
    channels into parts of at most ``_EXACT_FAN_IN`` multiply-adds per output: every product
    and partial sum of each float32 convolution is then an integer below 2**24, which float32
    holds exactly, whatever the summation order; the parts' rounded results add up in int32.
    A window of at most ``_EXACT_WHOLE_FAN_IN`` multiply-adds is one float32 convolution of
    ``x`` itself; only a kernel whose window alone is too deep for the halves uses the int32
    convolution.
    """
    group = int(attrs["group"])
    window = math.prod(jnp.shape(w)[2:])

    def conv(v, weights, context):
        return convolve(v, _kernel_for(weights, channels_last), None, attrs, context, channels_last)

    if window > _EXACT_FAN_IN or not _well_formed(x, w, group, channels_last):  # (convolve names what is wrong)
        return conv(x, w, ctx)
    w_in = jnp.shape(w)[1]
    exact = dataclasses.replace(ctx, precision=lax.Precision.HIGHEST)  # no TF32 on accelerators
    w = _as_float(w, jnp.float32)
    if window * w_in <= _EXACT_WHOLE_FAN_IN:
        return jnp.round(conv(x.astype(jnp.float32), w, exact)).astype(jnp.int32)
    lo = jnp.bitwise_and(x, 15)
    hi = jnp.right_shift(x - lo, 4)

    def part(v, channels: slice):
        v = _group_channels(v, group, channels, channels_last).astype(jnp.float32)
        return jnp.round(conv(v, w[:, channels], exact)).astype(jnp.int32)

    step = max(1, _EXACT_FAN_IN // max(window, 1))  # input channels of a group per part
    parts = [slice(start, min(w_in, start + step)) for start in range(0, max(w_in, 1), step)]
    return sum(part(hi, channels) * 16 + part(lo, channels) for channels in parts)


def _kernel_for(w, channels_last: bool):
    """OI(D)HW weights as ``convolve`` reads them: as they are, or (D)HWIO with the channels
    last (numpy weights relaid out in numpy, at trace time)."""
    if not channels_last:
        return w
    xp = array_module(w)
    return xp.transpose(w, (*range(2, w.ndim), 1, 0))


def _well_formed(x, w, group: int, channels_last: bool = False) -> bool:
    """Whether ``x`` and ``w`` have the shapes a convolution with ``group`` groups needs."""
    x_shape, w_shape = jnp.shape(x), jnp.shape(w)
    channels = x_shape[-1 if channels_last else 1] if x_shape else None
    return len(w_shape) == len(x_shape) >= 3 and group >= 1 and channels == w_shape[1] * group


def _group_channels(x, group: int, channels: slice, channels_last: bool = False):
    """The input channels ``channels`` of each of ``group`` groups of NC(D)HW (or, with
    ``channels_last``, N(D)HWC) ``x``, as a grouped convolution with the same ``group`` reads
    them."""
    shape = jnp.shape(x)
    c = shape[-1] if channels_last else shape[1]
    if channels == slice(0, c // group):
        return x
    if channels_last:
        grouped = jnp.reshape(x, (*shape[:-1], group, c // group))[..., channels]
        return jnp.reshape(grouped, (*shape[:-1], -1))
    n, _, *spatial = shape
    grouped = jnp.reshape(x, (n, group, c // group, *spatial))[:, :, channels]
    return jnp.reshape(grouped, (n, -1, *spatial))


@register("ConvInteger", since=10)
def conv_integer(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``ConvInteger``, opset 10: Conv of zero-point-centered integers, int32 output."""
    x, w, x_zero, w_zero = inputs
    return (integer_conv(x, x_zero, w, w_zero, None, attrs, ctx),)


def _output_channel_scale(w_scale, acc):
    """A weight scale per tensor, or per output channel shaped to broadcast against NC(D)HW."""
    w_scale = jnp.asarray(w_scale)
    if jnp.ndim(w_scale) == 1 and jnp.shape(w_scale)[0] > 1:
        return jnp.reshape(w_scale, (1, -1) + (1,) * (jnp.ndim(acc) - 2))
    return w_scale


@register("QLinearConv", since=10)
def qlinear_conv(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``QLinearConv``, opset 10: quantized Conv with an int32 bias, requantized to y's type."""
    return (qlinear_convolve(inputs, attrs, ctx),)


def qlinear_convolve(inputs: Inputs, attrs: Attrs, ctx: OpContext, channels_last: bool = False) -> jax.Array:
    """QLinearConv's result; with ``channels_last``, ``x`` and the result are N(D)HWC (the
    layout pass's form, and com.microsoft's ``channels_last=1``)."""
    x, x_scale, x_zero, w, w_scale, w_zero, y_scale, y_zero, bias = inputs
    acc = integer_conv(x, x_zero, w, w_zero, bias, attrs, ctx, channels_last=channels_last)
    w_scale = jnp.asarray(w_scale) if channels_last else _output_channel_scale(w_scale, acc)
    multiplier = exact_divide(jnp.asarray(x_scale) * w_scale, jnp.asarray(y_scale))
    target = dtype_of(y_zero) if y_zero is not None else dtype_of(x)
    return _requantize(acc, multiplier, y_zero, target, ctx)


# The private domain of the quantized_convs pass (jonnx/optimize/quantized_convs.py).
DEQUANTIZED_DOMAIN = "jonnx.dequantized"
register_pass_domain(
    DEQUANTIZED_DOMAIN,
    "a Conv of DequantizeLinear outputs, run as an exact 8-bit product by jonnx's quantized_convs pass; "
    "optimize={'quantized_convs': False} runs it as written",
)


@register(
    "Conv",
    since=1,
    domain=DEQUANTIZED_DOMAIN,
    attributes={**schema_defaults(onnx.defs.get_schema("Conv")), "channels_last": 0},
    n_inputs=7,
)
def dequantized_conv(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Conv`` of ``DequantizeLinear(x, x_scale, x_zero)`` (per tensor) by
    ``DequantizeLinear(w, w_scale, w_zero)`` (per tensor or per output channel), plus ``B``:
    the integer sum exactly (:func:`integer_conv`), then scaled once. The float32 convolution
    of the dequantized values gives the same up to its own rounding. ``channels_last`` (set by
    the layout pass): ``x`` and the result are N(D)HWC."""
    x, x_scale, x_zero, w, w_scale, w_zero, bias = inputs
    last = bool(attrs["channels_last"])
    acc = integer_conv(x, x_zero, w, w_zero, None, attrs, ctx, channels_last=last)
    w_scale = jnp.asarray(w_scale) if last else _output_channel_scale(w_scale, acc)
    scale = jnp.asarray(x_scale) * w_scale  # per output channel: the last axis broadcasts as is
    return (geo.add_bias(acc.astype(scale.dtype) * scale, bias, ctx, last),)

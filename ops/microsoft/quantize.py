"""Quantized contrib ops: MatMulNBits, GatherBlockQuantized, DynamicQuantizeMatMul,
MatMulIntegerToFloat, QLinearAdd/Mul/Sigmoid/LeakyRelu/GlobalAveragePool/Concat/AveragePool/Softmax/Where/ReduceMean,
QLinearConv (channels-last too), QGemm, QEmbedLayerNormalization, MulInteger, MatMulInteger16, ReduceSumInteger and the
com.microsoft QuantizeLinear/DequantizeLinear.

Weight-only quantized ops (MatMulNBits, GatherBlockQuantized) unpack their integer weights at
trace time (they are constants), dequantize with the float scales (parameters, so gradients
reach them) and multiply in float: ``W = (q - zero_point) * scale`` per block along K.
The QLinear* element-wise ops dequantize, compute in float32 and requantize with the default
domain's QuantizeLinear (round half to even, saturate); onnxruntime evaluates some of them
with precomputed lookup tables or fused multipliers, so an output may differ from its by one
quantization step where the float result sits on a rounding tie.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from jonnx._registry import Attrs, Inputs, OpContext, Outputs, register
from jonnx.ops._util import array_module, compute_type, dtype_of, exact_divide, normalize_axis
from jonnx.ops.activation import softmax_2d, softmax_axis
from jonnx.ops.microsoft._common import DOMAIN
from jonnx.ops.microsoft.normalization import embed_layer_normalization
from jonnx.ops.pool import average_pool as _average_pool
from jonnx.ops.quantize import (
    dequantize_linear,
    dynamic_quantize_linear,
    integer_matmul,
    qlinear_convolve,
    quantize_linear,
)
from jonnx.ops.rnn import quantized_lstm


def unpack_bits(packed, bits: int):
    """uint8 bytes -> their ``8 // bits`` fields each, low-order bits first, along the last axis."""
    xp = array_module(packed)
    packed = xp.asarray(packed).astype(np.uint8)
    if bits == 8:
        return packed.astype(np.int32)
    per = 8 // bits
    shifts = xp.arange(per, dtype=np.uint8) * np.uint8(bits)
    fields = (packed[..., None] >> shifts) & np.uint8((1 << bits) - 1)
    return xp.reshape(fields, packed.shape[:-1] + (packed.shape[-1] * per,)).astype(np.int32)


def _check_bits(bits, ctx):
    if bits not in (2, 4, 8):
        raise ctx.error(f"bits={bits} is not supported (2, 4 or 8)")


# ---------------------------------------------------------------------------------------------
# MatMulNBits


def dequantize_nbits(b, scales, zero_points, g_idx, *, n: int, k: int, bits: int, block_size: int, ctx):
    """MatMulNBits' weight as a float (N, K) matrix."""
    _check_bits(bits, ctx)
    k_blocks = -(-k // block_size)
    blob = block_size * bits // 8
    if tuple(np.shape(b)) != (n, k_blocks, blob):
        raise ctx.error(f"B has shape {tuple(np.shape(b))}, expected (N, k_blocks, blob_size) = {(n, k_blocks, blob)}")
    q = unpack_bits(b, bits).reshape(n, k_blocks * block_size)[:, :k]
    scales = jnp.reshape(scales, (n, k_blocks))
    wide = compute_type(dtype_of(scales))
    if zero_points is None:
        zp = np.full((n, k_blocks), 1 << (bits - 1), np.int32)
    elif dtype_of(zero_points) == np.uint8:
        zp = unpack_bits(array_module(zero_points).reshape(zero_points, (n, -1)), bits)[:, :k_blocks]
    else:  # unpacked, in the scales' float type
        zp = jnp.reshape(zero_points, (n, k_blocks))
    blocks = np.arange(k) // block_size if g_idx is None else g_idx
    centered = q.astype(wide) - jnp.take(jnp.asarray(zp).astype(wide), blocks, axis=1)
    return centered * jnp.take(scales.astype(wide), blocks, axis=1)


_NBITS_ATTRS = {
    "K": None,
    "N": None,
    "bits": 4,
    "block_size": None,
    "accuracy_level": 0,
    "weight_prepacked": 0,
}


@register("MatMulNBits", since=1, domain=DOMAIN, attributes=_NBITS_ATTRS, n_inputs=6)
def matmul_nbits(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """com.microsoft ``MatMulNBits``: ``A @ dequantize(B).T + bias`` with 2/4/8-bit block-wise
    quantized weights (packed low bits first), zero points packed or float, and ``g_idx``.

    ``accuracy_level`` is a speed hint to onnxruntime (4: A quantized to int8 per block); jonnx
    always multiplies in float, so level-4 results differ from onnxruntime's by that rounding.
    """
    a, b, scales, zero_points, g_idx, bias = inputs
    if attrs["weight_prepacked"]:
        raise ctx.error("weight_prepacked B (an execution provider's own layout) is not supported")
    n, k = attrs["N"], attrs["K"]
    if not n or not k or not attrs["block_size"]:
        raise ctx.error("the N, K and block_size attributes are required")
    if jnp.shape(a)[-1] != k:
        raise ctx.error(f"A's last dimension {jnp.shape(a)[-1]} differs from K={k}")
    dtype = dtype_of(a)
    if 0 in np.shape(b):  # an omitted projection: zeros (or the bias)
        y = jnp.zeros(jnp.shape(a)[:-1] + (n,), dtype)
        return ((y if bias is None else y + bias).astype(dtype),)
    w = dequantize_nbits(
        b,
        scales,
        zero_points,
        g_idx,
        n=n,
        k=k,
        bits=attrs["bits"],
        block_size=attrs["block_size"],
        ctx=ctx,
    )
    y = jnp.matmul(a, w.T.astype(dtype), precision=ctx.precision)
    if bias is not None:
        y = y + bias
    return (y.astype(dtype),)


# ---------------------------------------------------------------------------------------------
# GatherBlockQuantized


_INT4 = {np.dtype(ml_dtypes.int4), np.dtype(ml_dtypes.uint4)}


@register(
    "GatherBlockQuantized",
    since=1,
    domain=DOMAIN,
    attributes={"bits": 4, "block_size": 128, "gather_axis": 0, "quantize_axis": 1},
    n_inputs=4,
)
def gather_block_quantized(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """com.microsoft ``GatherBlockQuantized``: Gather from a block-quantized table, dequantized
    (``(q - zero_point) * scale`` per ``block_size`` along ``quantize_axis``). Out-of-range
    indices give zero rows, as onnxruntime documents."""
    data, indices, scales, zero_points = inputs
    bits, block = attrs["bits"], attrs["block_size"]
    rank = np.ndim(data)
    gather_axis = normalize_axis(attrs["gather_axis"], rank, ctx, "gather_axis")
    quantize_axis = normalize_axis(attrs["quantize_axis"], rank, ctx, "quantize_axis")
    if dtype_of(data) in _INT4:
        q = array_module(data).asarray(data).astype(np.int32)
        zp_default = 0
        zp = None if zero_points is None else array_module(zero_points).asarray(zero_points).astype(np.int32)
    elif dtype_of(data) == np.uint8:
        _check_bits(bits, ctx)
        if bits < 8 and (quantize_axis != rank - 1 or gather_axis == quantize_axis):
            raise ctx.error("packed uint8 data needs quantize_axis last and gather_axis different from it")
        q = unpack_bits(data, bits)
        zp_default = 1 << (bits - 1)
        zp = None if zero_points is None else unpack_bits(zero_points, bits)
    else:
        raise ctx.error(f"data of type {dtype_of(data)} is not supported (uint8, int4 or uint4)")
    wide = compute_type(dtype_of(scales))
    size = np.shape(q)[gather_axis]
    indices = jnp.asarray(indices)
    idx = jnp.where(indices < 0, indices + size, indices)
    in_range = (idx >= 0) & (idx < size)
    idx = jnp.clip(idx, 0, size - 1)

    def expand(p):  # one entry per block -> one per element along quantize_axis
        p = jnp.repeat(jnp.asarray(p), block, axis=quantize_axis)
        return jnp.take(p, jnp.arange(np.shape(q)[quantize_axis]), axis=quantize_axis)

    zp = jnp.full((), zp_default, jnp.int32) if zp is None else expand(zp)
    values = (jnp.asarray(q).astype(wide) - jnp.asarray(zp).astype(wide)) * expand(scales).astype(wide)
    out = jnp.take(values, idx, axis=gather_axis)
    keep = jnp.reshape(in_range, (1,) * gather_axis + jnp.shape(idx) + (1,) * (rank - gather_axis - 1))
    out = jnp.where(keep, out, jnp.zeros((), wide))
    return (out.astype(dtype_of(scales)),)


# ---------------------------------------------------------------------------------------------
# Integer matmuls with float outputs


def _scaled(acc, scale, bias, dtype):
    y = acc.astype(jnp.float32) * jnp.asarray(scale).astype(jnp.float32)
    if bias is not None:
        y = y + jnp.asarray(bias).astype(jnp.float32)
    return y.astype(dtype)


@register("DynamicQuantizeMatMul", since=1, domain=DOMAIN, attributes={}, n_inputs=5)
def dynamic_quantize_matmul(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """com.microsoft ``DynamicQuantizeMatMul``: A quantized to uint8 as DynamicQuantizeLinear
    does, multiplied by the 8-bit B in int32, scaled back to float, plus ``bias``."""
    a, b, b_scale, b_zero, bias = inputs
    a_q, a_scale, a_zero = dynamic_quantize_linear((a,), {}, ctx)
    acc = integer_matmul(a_q, b, a_zero, b_zero)
    return (_scaled(acc, a_scale * jnp.asarray(b_scale).astype(jnp.float32), bias, dtype_of(a)),)


_LSTM_ATTRS = {
    "activation_alpha": None,
    "activation_beta": None,
    "activations": None,
    "clip": None,
    "direction": "forward",
    "hidden_size": None,
    "input_forget": 0,
}


@register("DynamicQuantizeLSTM", since=1, domain=DOMAIN, attributes=_LSTM_ATTRS, n_inputs=12)
def dynamic_quantize_lstm(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """com.microsoft ``DynamicQuantizeLSTM`` (what onnxruntime's ``quantize_dynamic`` makes of
    an LSTM): ops/rnn.py ``quantized_lstm``, each product as :func:`dynamic_quantize_matmul`."""

    def matmul(a, b, b_scale, b_zero):
        return dynamic_quantize_matmul((a, b, b_scale, b_zero, None), {}, ctx)[0]

    return quantized_lstm(inputs, attrs, ctx, matmul)


@register("MatMulIntegerToFloat", since=1, domain=DOMAIN, attributes={}, n_inputs=7)
def matmul_integer_to_float(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """com.microsoft ``MatMulIntegerToFloat``: ``(A - a_zp) @ (B - b_zp) * a_scale * b_scale + bias``."""
    a, b, a_scale, b_scale, a_zero, b_zero, bias = inputs
    acc = integer_matmul(a, b, a_zero, b_zero)
    scale = jnp.asarray(a_scale).astype(jnp.float32) * jnp.asarray(b_scale).astype(jnp.float32)
    return (_scaled(acc, scale, bias, dtype_of(a_scale)),)


# ---------------------------------------------------------------------------------------------
# QLinear element-wise ops


def _dq(x, scale, zero, ctx=None):
    return dequantize_linear((x, scale, zero), {}, ctx)[0].astype(jnp.float32)


def _q(y, scale, zero, like):
    if zero is None:  # the output type follows the quantized input's
        zero = np.zeros((), dtype_of(like))
    return quantize_linear((y, jnp.asarray(scale).astype(jnp.float32), zero), {}, None)[0]


def _q_zero_first(y, scale, zero, like):
    """``saturate(round(y / scale + zero))``: onnxruntime's QLinearAdd, QLinearMul and
    QLinearAveragePool add the zero point before they round (half to even), where
    QuantizeLinear (:func:`_q`, and onnxruntime's lookup tables for QLinearLeakyRelu and
    QLinearConcat) rounds first; the two differ at ties when the zero point is odd. With
    power-of-two scales ties are common (a pair's average is one half the time): rounding
    first, 8% of QLinearAdd's and 4% of QLinearMul's values were a unit off onnxruntime's."""
    target = dtype_of(like) if zero is None else dtype_of(zero)
    shifted = exact_divide(y, jnp.asarray(scale).astype(jnp.float32))
    if zero is not None:
        shifted = shifted + jnp.asarray(zero).astype(jnp.float32)
    # QuantizeLinear of the shifted value by a unit scale and a zero zero point: it rounds and
    # saturates into the target type (the division by 1 is exact).
    return _q(shifted, np.float32(1), np.zeros((), target), like)


def _qlinear_binary(fn):
    def body(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
        a, a_scale, a_zero, b, b_scale, b_zero, c_scale, c_zero = inputs
        return (_q_zero_first(fn(_dq(a, a_scale, a_zero), _dq(b, b_scale, b_zero)), c_scale, c_zero, a),)

    return body


register("QLinearAdd", since=1, domain=DOMAIN, attributes={}, n_inputs=8)(_qlinear_binary(jnp.add))
register("QLinearMul", since=1, domain=DOMAIN, attributes={}, n_inputs=8)(_qlinear_binary(jnp.multiply))


@register("QLinearSigmoid", since=1, domain=DOMAIN, attributes={}, n_inputs=5)
def qlinear_sigmoid(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """com.microsoft ``QLinearSigmoid``: quantized sigmoid (dequantize, sigmoid, requantize)."""
    x, x_scale, x_zero, y_scale, y_zero = inputs
    return (_q(jax.nn.sigmoid(_dq(x, x_scale, x_zero)), y_scale, y_zero, x),)


@register("QLinearLeakyRelu", since=1, domain=DOMAIN, attributes={"alpha": 0.01}, n_inputs=5)
def qlinear_leaky_relu(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """com.microsoft ``QLinearLeakyRelu``: quantized LeakyRelu."""
    x, x_scale, x_zero, y_scale, y_zero = inputs
    f = _dq(x, x_scale, x_zero)
    return (_q(jnp.where(f >= 0, f, jnp.float32(attrs["alpha"]) * f), y_scale, y_zero, x),)


@register(
    "QLinearGlobalAveragePool",
    since=1,
    domain=DOMAIN,
    attributes={"channels_last": 0},
    n_inputs=5,
)
def qlinear_global_average_pool(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """com.microsoft ``QLinearGlobalAveragePool``: the mean over the spatial axes, requantized
    (NCHW..., or NHWC... with ``channels_last=1``); spatial axes are kept as size 1."""
    x, x_scale, x_zero, y_scale, y_zero = inputs
    rank = jnp.ndim(x)
    axes = tuple(range(1, rank - 1)) if attrs["channels_last"] else tuple(range(2, rank))
    mean = jnp.mean(_dq(x, x_scale, x_zero), axis=axes, keepdims=True)
    return (_q(mean, y_scale, y_zero, x),)


def _validate_concat(attrs, n_inputs, n_outputs):
    if n_inputs < 5 or (n_inputs - 2) % 3:
        return (
            f"QLinearConcat takes Y_scale, Y_zero_point and (X, X_scale, X_zero_point) triples, got {n_inputs} inputs"
        )
    return None


@register(
    "QLinearConcat",
    since=1,
    domain=DOMAIN,
    attributes={"axis": None},
    n_inputs=2,
    validate=_validate_concat,
)
def qlinear_concat(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """com.microsoft ``QLinearConcat``: each (X, scale, zero point) requantized to Y's, concatenated."""
    y_scale, y_zero, *rest = inputs
    if attrs["axis"] is None:
        raise ctx.error("the axis attribute is required")
    parts = [rest[i : i + 3] for i in range(0, len(rest), 3)]
    axis = normalize_axis(attrs["axis"], jnp.ndim(parts[0][0]), ctx)
    joined = jnp.concatenate([_dq(x, s, z) for x, s, z in parts], axis=axis)
    return (_q(joined, y_scale, y_zero, parts[0][0]),)


# The com.microsoft forms predate onnx's int16/int4 and blocked versions; same arithmetic.
register("QuantizeLinear", since=1, domain=DOMAIN, attributes={"axis": 1}, n_inputs=3)(quantize_linear)
register("DequantizeLinear", since=1, domain=DOMAIN, attributes={"axis": 1}, n_inputs=3)(dequantize_linear)


# ---------------------------------------------------------------------------------------------
# More quantized ops from quantize_static / quantize_dynamic (QOperator format)


@register(
    "QGemm",
    since=1,
    domain=DOMAIN,
    attributes={"alpha": 1.0, "transA": 0, "transB": 0},
    n_inputs=9,
)
def qgemm(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """com.microsoft ``QGemm``: ``alpha * (A - a_zp) (B - b_zp) * a_scale * b_scale + C * a_scale * b_scale``
    (C is an int32 bias at the product's scale), requantized when ``y_scale`` is given, else float."""
    a, a_scale, a_zero, b, b_scale, b_zero, c, y_scale, y_zero = inputs
    if attrs["transA"]:
        a = a.T
    if attrs["transB"]:
        b = b.T
    acc = integer_matmul(a, b, a_zero, b_zero)
    if c is not None:
        acc = acc + jnp.asarray(c).astype(jnp.int32)
    y = acc.astype(jnp.float32) * (
        jnp.float32(attrs["alpha"])
        * jnp.asarray(a_scale).astype(jnp.float32)
        * jnp.asarray(b_scale).astype(jnp.float32)
    )
    if y_scale is None:
        return (y,)
    return (_q(y, y_scale, y_zero, a),)


def _nhwc(fn, x, channels_last: bool):
    """Run ``fn`` on NCHW data, for an op whose input may be channels-last."""
    if not channels_last:
        return fn(x)
    rank = jnp.ndim(x)
    to_first = (0, rank - 1) + tuple(range(1, rank - 1))
    to_last = (0,) + tuple(range(2, rank)) + (1,)
    return jnp.transpose(fn(jnp.transpose(x, to_first)), to_last)


_QCONV_ATTRS = {
    "auto_pad": "NOTSET",
    "channels_last": 0,
    "dilations": None,
    "group": 1,
    "kernel_shape": None,
    "pads": None,
    "strides": None,
}


@register("QLinearConv", since=1, domain=DOMAIN, attributes=_QCONV_ATTRS, n_inputs=9)
def qlinear_conv_ms(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """com.microsoft ``QLinearConv``: the default domain's QLinearConv, channels-last optionally."""
    return (qlinear_convolve(inputs, attrs, ctx, channels_last=bool(attrs["channels_last"])),)


_QPOOL_ATTRS = {
    "auto_pad": "NOTSET",
    "ceil_mode": 0,
    "channels_last": 0,
    "count_include_pad": 0,
    "kernel_shape": None,
    "pads": None,
    "strides": None,
}


@register("QLinearAveragePool", since=1, domain=DOMAIN, attributes=_QPOOL_ATTRS, n_inputs=5)
def qlinear_average_pool(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """com.microsoft ``QLinearAveragePool``: AveragePool on dequantized values, requantized."""
    x, x_scale, x_zero, y_scale, y_zero = inputs
    pool_attrs = {**attrs, "dilations": None}
    mean = _nhwc(
        lambda v: _average_pool((v,), pool_attrs, ctx)[0],
        _dq(x, x_scale, x_zero, ctx),
        bool(attrs["channels_last"]),
    )
    return (_q_zero_first(mean, y_scale, y_zero, x),)


@register(
    "QLinearSoftmax",
    since=1,
    domain=DOMAIN,
    attributes={"axis": -1, "opset": None},
    n_inputs=5,
)
def qlinear_softmax(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """com.microsoft ``QLinearSoftmax``: Softmax of the dequantized input (2-D coercion at ``axis``
    when the node's ``opset`` attribute is below 13, as Softmax itself), requantized."""
    x, x_scale, x_zero, y_scale, y_zero = inputs
    f = _dq(x, x_scale, x_zero, ctx)
    body = softmax_axis("Softmax") if (attrs["opset"] or 13) >= 13 else softmax_2d("Softmax")
    return (_q(body((f,), {"axis": attrs["axis"]}, ctx)[0], y_scale, y_zero, x),)


@register("QLinearWhere", since=1, domain=DOMAIN, attributes={}, n_inputs=9)
def qlinear_where(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """com.microsoft ``QLinearWhere``: Where over dequantized X and Y, requantized to Z's scale."""
    cond, x, x_scale, x_zero, y, y_scale, y_zero, z_scale, z_zero = inputs
    chosen = jnp.where(cond, _dq(x, x_scale, x_zero, ctx), _dq(y, y_scale, y_zero, ctx))
    return (_q(chosen, z_scale, z_zero, x),)


@register(
    "QLinearReduceMean",
    since=1,
    domain=DOMAIN,
    attributes={"axes": None, "keepdims": None},
    n_inputs=5,
)
def qlinear_reduce_mean(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """com.microsoft ``QLinearReduceMean``: ReduceMean of the dequantized input, requantized."""
    x, x_scale, x_zero, y_scale, y_zero = inputs
    if attrs["axes"] is None or attrs["keepdims"] is None:
        raise ctx.error("the axes and keepdims attributes are required")
    axes = tuple(normalize_axis(a, jnp.ndim(x), ctx) for a in attrs["axes"])
    mean = jnp.mean(_dq(x, x_scale, x_zero, ctx), axis=axes, keepdims=bool(attrs["keepdims"]))
    return (_q(mean, y_scale, y_zero, x),)


@register("MulInteger", since=1, domain=DOMAIN, attributes={}, n_inputs=4)
def mul_integer(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """com.microsoft ``MulInteger``: ``(A - a_zp) * (B - b_zp)`` in int32."""
    a, a_zero, b, b_zero = inputs
    centered = [
        jnp.asarray(v).astype(jnp.int32) - (0 if z is None else jnp.asarray(z).astype(jnp.int32))
        for v, z in ((a, a_zero), (b, b_zero))
    ]
    return (centered[0] * centered[1],)


@register("MatMulInteger16", since=1, domain=DOMAIN, attributes={}, n_inputs=2)
def matmul_integer16(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """com.microsoft ``MatMulInteger16``: int16 by int16 into int32."""
    a, b = inputs
    return (jnp.matmul(jnp.asarray(a).astype(jnp.int32), jnp.asarray(b).astype(jnp.int32)),)


@register(
    "ReduceSumInteger",
    since=1,
    domain=DOMAIN,
    attributes={"axes": None, "keepdims": None},
    n_inputs=1,
)
def reduce_sum_integer(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """com.microsoft ``ReduceSumInteger``: an 8-bit tensor summed over ``axes`` into int32."""
    (x,) = inputs
    if attrs["axes"] is None or attrs["keepdims"] is None:
        raise ctx.error("the axes and keepdims attributes are required")
    axes = tuple(normalize_axis(a, jnp.ndim(x), ctx) for a in attrs["axes"])
    return (
        jnp.sum(
            jnp.asarray(x).astype(jnp.int32),
            axis=axes,
            keepdims=bool(attrs["keepdims"]),
        ),
    )


@register(
    "QEmbedLayerNormalization",
    since=1,
    domain=DOMAIN,
    attributes={"epsilon": 1e-12},
    n_inputs=18,
)
def qembed_layer_normalization(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """com.microsoft ``QEmbedLayerNormalization`` (quantize_dynamic on an optimized BERT):
    EmbedLayerNormalization whose embedding tables, gamma and beta are 8-bit with per-tensor
    scales and zero points; onnxruntime dequantizes each value and computes in float."""
    (ids, segment_ids, word, position, segment, gamma, beta, mask) = inputs[:8]
    (word_s, pos_s, seg_s, gamma_s, beta_s) = inputs[8:13]
    (word_z, pos_z, seg_z, gamma_z, beta_z) = inputs[13:18]
    if (segment is None) != (segment_ids is None) or (segment is None) != (seg_s is None):
        raise ctx.error(
            "segment_ids, segment_embedding and segment_embedding_scale must all be given or all be omitted"
        )
    tables = (
        _dq(word, word_s, word_z, ctx),
        _dq(position, pos_s, pos_z, ctx),
        None if segment is None else _dq(segment, seg_s, seg_z, ctx),
        _dq(gamma, gamma_s, gamma_z, ctx),
        _dq(beta, beta_s, beta_z, ctx),
    )
    word, position, segment, gamma, beta = tables
    y, mask_index, _ = embed_layer_normalization(
        (ids, segment_ids, word, position, segment, gamma, beta, mask, None),
        {"epsilon": attrs["epsilon"], "mask_index_type": 1},
        ctx,
    )
    return y, mask_index

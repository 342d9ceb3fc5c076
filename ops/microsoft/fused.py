"""FusedConv, FusedGemm, FusedMatMul/TransposeMatMul (onnxruntime's extended-level fusions),
GemmFastGelu, BiasSoftmax and Trilu.

The fused ops are Conv, Gemm and MatMul followed by an activation; their geometry and
products reuse the default domain's implementations (``ops/conv.py``, ``ops/products.py``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jonnx._registry import Attrs, Inputs, OpContext, Outputs, register
from jonnx.ops import activation
from jonnx.ops._util import dtype_of, normalize_axis, rounded
from jonnx.ops.conv import convolve
from jonnx.ops.microsoft._common import DOMAIN
from jonnx.ops.microsoft.activation import fast_gelu
from jonnx.ops.products import gemm_core
from jonnx.ops.shape import trilu


def _activate(y, name, params, ctx):
    """The named activation with its float parameters, as onnxruntime's fused kernels apply it."""
    dtype = dtype_of(y)

    def p(i, what):
        if len(params) <= i or params[i] is None:
            raise ctx.error(f"activation {name} needs its {what} parameter")
        return jnp.asarray(params[i], dtype)

    if name in (None, "", "Identity"):
        return y
    if name == "Relu":
        return activation.relu(y)
    if name == "Tanh":
        return jnp.tanh(y)
    if name == "Sigmoid":
        return jax.nn.sigmoid(y)
    if name == "LeakyRelu":
        return jnp.where(y >= 0, y, p(0, "alpha") * y)
    if name == "Clip":
        return jnp.clip(y, p(0, "min"), p(1, "max"))
    if name == "HardSigmoid":
        return jnp.clip(p(0, "alpha") * y + p(1, "beta"), 0, 1).astype(dtype)
    raise ctx.error(f"activation {name!r} is not supported (Relu, Tanh, Sigmoid, LeakyRelu, Clip, HardSigmoid)")


_CONV_ATTRS = {
    "activation": None,
    "activation_params": None,
    "auto_pad": "NOTSET",
    "dilations": None,
    "group": 1,
    "kernel_shape": None,
    "pads": None,
    "strides": None,
}


@register("FusedConv", since=1, domain=DOMAIN, attributes=_CONV_ATTRS, n_inputs=4)
def fused_conv(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """com.microsoft ``FusedConv``: ``activation(Conv(X, W, B) + Z)``."""
    x, w, b, z = inputs
    y = convolve(x, w, b, attrs, ctx)
    if z is not None:
        y = y + z
    return (_activate(y, attrs["activation"], tuple(attrs["activation_params"] or ()), ctx).astype(dtype_of(x)),)


_GEMM_ATTRS = {
    "alpha": 1.0,
    "beta": 1.0,
    "transA": 0,
    "transB": 0,
    "activation": None,
    "activation_alpha": None,
    "activation_beta": None,
    "activation_gamma": None,
}


@register("FusedGemm", since=1, domain=DOMAIN, attributes=_GEMM_ATTRS, n_inputs=3)
def fused_gemm(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """com.microsoft ``FusedGemm``: ``activation(Gemm(A, B, C))`` with ``activation_alpha/beta``."""
    a, b, c = inputs
    y = gemm_core(a, b, c, attrs, ctx)
    params = (
        attrs["activation_alpha"],
        attrs["activation_beta"],
        attrs["activation_gamma"],
    )
    return (_activate(y, attrs["activation"], params, ctx).astype(dtype_of(a)),)


def _batch_transpose(x, trans_batch: bool, trans: bool):
    """FusedMatMul's operand layout: ``transBatch`` moves dim 0 behind the batch dims."""
    rank = jnp.ndim(x)
    perm = list(range(rank))
    if trans_batch and rank > 2:
        perm = perm[1 : rank - 1] + [0, rank - 1]
    if trans and rank >= 2:
        perm[-2], perm[-1] = perm[-1], perm[-2]
    return jnp.transpose(x, perm) if perm != list(range(rank)) else x


@register(
    "FusedMatMul",
    since=1,
    domain=DOMAIN,
    attributes={
        "alpha": 1.0,
        "transA": 0,
        "transB": 0,
        "transBatchA": 0,
        "transBatchB": 0,
    },
    n_inputs=2,
)
def fused_matmul(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """com.microsoft ``FusedMatMul``: ``alpha * op(A) @ op(B)`` (numpy matmul broadcasting)."""
    a, b = inputs
    a = _batch_transpose(a, bool(attrs["transBatchA"]), bool(attrs["transA"]))
    b = _batch_transpose(b, bool(attrs["transBatchB"]), bool(attrs["transB"]))
    y = jnp.matmul(a, b, precision=ctx.precision)
    alpha = attrs["alpha"]
    if alpha != 1.0:
        y = y * jnp.asarray(alpha, dtype_of(y))
    return (y.astype(dtype_of(a)),)


# Older exporters wrote Trilu in com.microsoft (before onnx adopted it in opset 14).
register(
    "Trilu",
    since=1,
    domain=DOMAIN,
    static_inputs=(1,),
    attributes={"upper": 1},
    n_inputs=2,
)(trilu)


@register(
    "TransposeMatMul",
    since=1,
    domain=DOMAIN,
    attributes={"alpha": 1.0, "transA": 0, "transB": 0},
    n_inputs=2,
)
def transpose_matmul(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """com.microsoft ``TransposeMatMul``: FusedMatMul's older name (no batch transposes)."""
    return fused_matmul(inputs, {**attrs, "transBatchA": 0, "transBatchB": 0}, ctx)


@register("GemmFastGelu", since=1, domain=DOMAIN, attributes={}, n_inputs=3)
def gemm_fast_gelu(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """com.microsoft ``GemmFastGelu``: FastGelu of ``X @ W (+ bias)``."""
    x, w, bias = inputs
    return fast_gelu((jnp.matmul(x, w, precision=ctx.precision), bias), {}, ctx)


@register(
    "BiasSoftmax",
    since=1,
    domain=DOMAIN,
    attributes={"axis": 1, "is_inner_broadcast": None},
    n_inputs=2,
)
def bias_softmax(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """com.microsoft ``BiasSoftmax``: Softmax of ``data + bias`` along ``axis``; the bias
    broadcasts over the dims before ``axis`` (inner broadcast) or numpy-style from the right."""
    data, bias = inputs
    axis = normalize_axis(attrs["axis"], jnp.ndim(data), ctx)
    if attrs["is_inner_broadcast"] and jnp.ndim(bias) < jnp.ndim(data):
        bias = jnp.reshape(bias, jnp.shape(bias) + (1,) * (jnp.ndim(data) - jnp.ndim(bias)))
    return (jax.nn.softmax(rounded(data + bias), axis=tuple(range(axis, jnp.ndim(data)))).astype(dtype_of(data)),)

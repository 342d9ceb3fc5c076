"""Channels-last forms of the layout-sensitive CNN ops (internal domain ``jonnx.channels_last``).

The ``channels_last`` graph pass (jonnx/optimize/layout.py) rewrites Conv / pooling /
normalization chains to run on N(D)HWC activations, which XLA's CPU convolutions and the dot
lowerings of ops/conv.py run 1.2-2x faster than NC(D)HW. These ops are what it rewrites them
to: each is the ONNX op of the same name with the same attributes, computing exactly what
the ONNX op computes on NC(D)HW data, except that

* activations (input X and output Y) are N(D)HWC: the channel axis is last;
* Conv's weights are in the layout its extra attribute ``kernel_layout`` names
  (``jonnx.ops.conv.KERNEL_LAYOUTS``, "HW" standing for the spatial axes): "HWIO" (the default), a
  ``Transpose(W, perm=[2, 3, ..., 1, 0])`` of ONNX's OI(D)HW, a separate node on the weight so
  that it can be computed once per parameter set; for big 1x1 kernels, whose product reads
  them without a copy, "OIHW", ONNX's own, or on CPU "HWOI", the same bytes with the unit
  spatial axes first (a view); or "IHWO", for the kernels whose lowering reads them as one
  (C, taps x M) matrix (``jonnx.ops.conv.kernel_layout_for``);
* QLinearConv's and ConvInteger's weights stay ONNX's OI(D)HW: an 8-bit product reads them
  as one matrix;
* ConvTranspose's weights stay ONNX's (C, M/group, k...): both of its lowerings read them so;
  it carries ``legacy`` (1 for opsets 1-10, whose text splits an odd padding of an explicit
  ``output_shape`` the other way);
* MaxPool has no Indices output (the pass leaves MaxPool nodes whose Indices are read alone);
* MaxPool and AveragePool carry ``after_tap_loop`` (1 where their input is a multiply-add loop
  over a convolution's taps, through elementwise ops: ops/pool.py reads such windows with a
  reduce-window rather than strided slices);
* BatchNormalization carries, instead of its opset's mode attributes, ``training_mode``
  (whether it trains when the run leaves the choice to the graph) and ``legacy`` (1 for the
  five outputs of opsets 1-9).

Per-channel vectors (bias, scale, running statistics) are unchanged. The bodies are the ONNX
ops' own helpers, called with ``channels_last=True``: one implementation per op. The domain
is private: the pass makes these nodes only in the graph a ``Model`` runs, never in
``Model.proto``, so ``jonnx.save`` never writes them.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import onnx.defs

from jonnx._attributes import schema_defaults
from jonnx._registry import Attrs, Inputs, OpContext, Outputs, register, register_pass_domain
from jonnx.ops import conv as conv_ops, normalization, pool, quantize
from jonnx.ops._util import lowers_for_cpu, static_sizes
from jonnx.ops.reduce import reduce_max

__all__ = ["DOMAIN", "VERSION"]

DOMAIN = "jonnx.channels_last"
VERSION = 1
register_pass_domain(
    DOMAIN, "run channels-last by jonnx's layout pass; optimize={'channels_last': False} runs it as written"
)


def _attributes(op_type: str) -> dict:
    """The newest ai.onnx schema's attributes and defaults: the internal op takes the same."""
    return schema_defaults(onnx.defs.get_schema(op_type))


@register("Conv", since=VERSION, domain=DOMAIN, attributes={**_attributes("Conv"), "kernel_layout": "HWIO"}, n_inputs=3)
def conv(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Conv`` on N(D)HWC activations, its weights in ``kernel_layout``."""
    x, w, b = inputs
    return (conv_ops.convolve(x, w, b, attrs, ctx, channels_last=True, kernel_layout=attrs["kernel_layout"]),)


@register("ConvInteger", since=VERSION, domain=DOMAIN, attributes=_attributes("ConvInteger"), n_inputs=4)
def conv_integer(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``ConvInteger`` on N(D)HWC activations, its weights as stored (OI(D)HW)."""
    x, w, x_zero, w_zero = inputs
    return (quantize.integer_conv(x, x_zero, w, w_zero, None, attrs, ctx, channels_last=True),)


@register("QLinearConv", since=VERSION, domain=DOMAIN, attributes=_attributes("QLinearConv"), n_inputs=9)
def qlinear_conv(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``QLinearConv`` on N(D)HWC activations, its weights as stored (OI(D)HW)."""
    return (quantize.qlinear_convolve(inputs, attrs, ctx, channels_last=True),)


@register(
    "ConvTranspose",
    since=VERSION,
    domain=DOMAIN,
    attributes={**_attributes("ConvTranspose"), "legacy": 0},
    n_inputs=3,
)
def conv_transpose(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``ConvTranspose`` on N(D)HWC activations, its weights as stored (C, M/group, k...)."""
    x, w, b = inputs
    return (conv_ops.transpose_convolve(x, w, b, attrs, ctx, legacy=bool(attrs["legacy"]), channels_last=True),)


@register(
    "MaxPool", since=VERSION, domain=DOMAIN, attributes={**_attributes("MaxPool"), "after_tap_loop": 0}, n_inputs=1
)
def max_pool(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``MaxPool`` (Y only) on N(D)HWC activations."""
    return pool.max_pool_core(inputs[0], attrs, ctx, with_indices=False, channels_last=True)


@register(
    "AveragePool",
    since=VERSION,
    domain=DOMAIN,
    attributes={**_attributes("AveragePool"), "after_tap_loop": 0},
    n_inputs=1,
)
def average_pool(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``AveragePool`` on N(D)HWC activations."""
    return (pool.average_pool_core(inputs[0], attrs, ctx, channels_last=True),)


@register("GlobalAveragePool", since=VERSION, domain=DOMAIN, attributes={}, n_inputs=1)
def global_average_pool(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``GlobalAveragePool`` on N(D)HWC activations: (N, 1, ..., 1, C)."""
    x = inputs[0]
    axes = pool.spatial_axes(x, ctx, channels_last=True)
    shape = jnp.shape(x)
    cells = math.prod(shape[1:-1]) if static_sizes(shape) else 0
    if cells >= MEAN_PRODUCT_MIN_CELLS and shape[0] == 1 and x.dtype == jnp.float32 and lowers_for_cpu():
        # One image's mean as a product with a row of 1/cells: XLA's reduction keeping the minor
        # (channel) axis reads the map slowly; YNNPACK's product streams it.
        row = jnp.full((1, cells), 1.0 / cells, x.dtype)
        y = jnp.dot(row, jnp.reshape(x, (cells, shape[-1])), precision=ctx.precision)
        return (jnp.reshape(y, (1,) * (len(shape) - 1) + (shape[-1],)),)
    return (jnp.mean(x, axis=axes, keepdims=True),)


# A channels-last GlobalAveragePool of one image over at least this many cells is a product.
MEAN_PRODUCT_MIN_CELLS = 784


@register("GlobalMaxPool", since=VERSION, domain=DOMAIN, attributes={}, n_inputs=1)
def global_max_pool(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``GlobalMaxPool`` on N(D)HWC activations: (N, 1, ..., 1, C)."""
    x = inputs[0]
    return (reduce_max(x, pool.spatial_axes(x, ctx, channels_last=True), True),)


@register(
    "BatchNormalization",
    since=VERSION,
    domain=DOMAIN,
    attributes={"epsilon": 1e-5, "momentum": 0.9, "training_mode": 0, "legacy": 0},
    n_inputs=5,
    state_updates={1: 3, 2: 4},
    trains=lambda attrs, n_outputs: bool(attrs["training_mode"]),
)
def batch_normalization(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``BatchNormalization`` (per-channel statistics) on N(D)HWC activations."""
    training = ctx.training(bool(attrs["training_mode"]))
    if attrs["legacy"]:
        return normalization._bn_legacy(inputs, attrs, training, True, channels_last=True)
    x, scale, bias, mean, var = inputs
    eps, momentum = attrs["epsilon"], attrs["momentum"]
    if training:
        return normalization._bn_training(x, scale, bias, mean, var, momentum, eps, channels_last=True)
    return (normalization._bn_inference(x, scale, bias, mean, var, eps, channels_last=True), mean, var)


@register(
    "InstanceNormalization",
    since=VERSION,
    domain=DOMAIN,
    attributes=_attributes("InstanceNormalization"),
    n_inputs=3,
)
def instance_normalization(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``InstanceNormalization`` on N(D)HWC activations."""
    x, scale, bias = inputs
    return (normalization.instance_norm_core(x, scale, bias, attrs["epsilon"], ctx, channels_last=True),)

"""Custom operators: plug a third-party runtime's own ops into jonnx.

Some runtimes extend ONNX with operators of their own. One such runtime (a TensorFlow-to-ONNX
converter for an inference chip) lists five: ``Relu6``, ``Dense``, ``DepthwiseConv2d``,
``UpSampling2D`` and ``Add_``. Its operator list names them without documenting them, so the
semantics below follow the converter that emits them, which maps TensorFlow ops one to one and
keeps TensorFlow's NHWC layout and weight layouts:

* ``Relu6(X) -> Y``: ``min(max(X, 0), 6)`` (TensorFlow ``Relu6``).
* ``Dense(X, W, B?) -> Y``: ``X @ W + B`` over the last axis of ``X``, ``W`` laid out
  ``[in, out]`` (TensorFlow ``MatMul`` + ``BiasAdd``). Attribute ``activation``: ``"linear"``
  (default), ``"relu"`` or ``"relu6"``, applied after the bias.
* ``DepthwiseConv2d(X, W, B?) -> Y``: TensorFlow's ``DepthwiseConv2dNative``. ``W`` is
  ``[kh, kw, C, M]``; output channel ``c * M + m`` is input channel ``c`` convolved with
  ``W[:, :, c, m]``. Attributes: ``strides`` and ``dilations`` (``[1, 1]``), ``pads``: the
  TensorFlow padding string ``"VALID"`` (default) or ``"SAME"`` (extra padding at the end),
  ``data_format`` ``"NHWC"`` (default) or ``"NCHW"``, and the converter's redundant
  ``kernel_shape`` and ``group``, checked against ``W`` when present.
* ``UpSampling2D(X) -> Y``: nearest-neighbour upsampling by integer factors (Keras
  ``UpSampling2D``): ``Y[n, i, j, c] = X[n, i // sh, j // sw, c]``. Attributes: ``size``
  (``[2, 2]``) and ``data_format`` (``"NHWC"``, or ``"NCHW"``).
* ``Add_(A, B) -> C``: the runtime's in-place add, ``A + alpha * B`` with numpy broadcasting
  (PyTorch's ``add_``). Attribute ``alpha`` (``1.0``). JAX arrays are immutable: here it
  returns a new array, like every jonnx op.

Each op is registered with ``jonnx.register(op_type, since=1, domain=DOMAIN,
attributes=...)``, exactly as jonnx registers its own. ONNX knows no schema for a custom
domain, so ``attributes`` plays the schema's part: the op receives every declared attribute,
with its default where the node does not set it, and a node setting an undeclared attribute
is refused at load with an error naming it. The op bodies never invent defaults.

The script builds a small network with ``onnx.helper`` that mixes the five custom ops with
standard ones (Transpose, MaxPool, ReduceMean, Softmax), runs it with jonnx under ``jit``,
checks it against the same network written in numpy, and differentiates it with
``jax.grad``. Importing this module only registers the ops (once per process: registering a
key twice raises ``ValueError``).

Run: ``python examples/custom_ops.py``
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper
from jax import lax

import jonnx

DOMAIN = "com.example.custom"
VERSION = 1

#: The custom ops' attributes and their defaults (None: optional, no default).
ATTRIBUTES: dict[str, dict[str, Any]] = {
    "Relu6": {},
    "Dense": {"activation": "linear"},
    "DepthwiseConv2d": {
        "strides": (1, 1),
        "dilations": (1, 1),
        "pads": "VALID",
        "data_format": "NHWC",
        "kernel_shape": None,
        "group": None,
    },
    "UpSampling2D": {"size": (2, 2), "data_format": "NHWC"},
    "Add_": {"alpha": 1.0},
}


def _pair(value, name: str, ctx: jonnx.OpContext) -> tuple[int, int]:
    value = tuple(int(v) for v in value)
    if len(value) != 2 or min(value) < 1:
        raise ctx.error(f"{name} must be two positive integers, got {value}")
    return value


def _data_format(value: str, ctx: jonnx.OpContext) -> str:
    if value not in ("NHWC", "NCHW"):
        raise ctx.error(f"data_format must be 'NHWC' or 'NCHW', got {value!r}")
    return value


_ACTIVATIONS = {
    "linear": lambda y: y,
    "relu": lambda y: jnp.maximum(y, 0),
    "relu6": lambda y: jnp.clip(y, 0, 6),
}


# -- the custom ops ----------------------------------------------------------------------------


@jonnx.register("Relu6", since=VERSION, domain=DOMAIN, attributes=ATTRIBUTES["Relu6"])
def relu6(inputs, attrs, ctx):
    """Custom ``Relu6``: ``min(max(x, 0), 6)``."""
    (x,) = inputs
    return (jnp.clip(x, 0, 6),)


@jonnx.register("Dense", since=VERSION, domain=DOMAIN, attributes=ATTRIBUTES["Dense"])
def dense(inputs, attrs, ctx):
    """Custom ``Dense``: ``activation(x @ w + b)``, ``w`` laid out ``[in, out]``."""
    x, w, b = (tuple(inputs) + (None,))[:3]
    if attrs["activation"] not in _ACTIVATIONS:
        raise ctx.error(f"activation must be one of {sorted(_ACTIVATIONS)}, got {attrs['activation']!r}")
    if jnp.ndim(w) != 2 or jnp.ndim(x) < 1 or jnp.shape(x)[-1] != jnp.shape(w)[0]:
        raise ctx.error(f"cannot multiply X {jnp.shape(x)} by W {jnp.shape(w)} (W is [in, out])")
    y = jnp.matmul(x, w, precision=ctx.precision)
    if b is not None:
        y = y + b
    return (_ACTIVATIONS[attrs["activation"]](y),)


@jonnx.register("DepthwiseConv2d", since=VERSION, domain=DOMAIN, attributes=ATTRIBUTES["DepthwiseConv2d"])
def depthwise_conv2d(inputs, attrs, ctx):
    """Custom ``DepthwiseConv2d``: TensorFlow's depthwise convolution, ``W`` as ``[kh, kw, C, M]``."""
    x, w, b = (tuple(inputs) + (None,))[:3]
    layout = _data_format(attrs["data_format"], ctx)
    strides = _pair(attrs["strides"], "strides", ctx)
    dilations = _pair(attrs["dilations"], "dilations", ctx)
    padding = attrs["pads"]
    if padding not in ("SAME", "VALID"):
        raise ctx.error(f"pads must be 'SAME' or 'VALID', got {padding!r}")
    if jnp.ndim(x) != 4 or jnp.ndim(w) != 4:
        raise ctx.error(f"X and W must be 4-D, got {jnp.shape(x)} and {jnp.shape(w)}")
    kh, kw, channels, multiplier = jnp.shape(w)
    x_channels = jnp.shape(x)[3 if layout == "NHWC" else 1]
    if x_channels != channels:
        raise ctx.error(f"X has {x_channels} channels but W {jnp.shape(w)} expects {channels}")
    if attrs["kernel_shape"] is not None and tuple(attrs["kernel_shape"]) != (kh, kw):
        raise ctx.error(f"kernel_shape {attrs['kernel_shape']} disagrees with W {jnp.shape(w)}")
    if attrs["group"] is not None and attrs["group"] != channels:
        raise ctx.error(f"group {attrs['group']} must equal the channel count {channels}")
    # [kh, kw, C, M] -> HWIO with C groups of M outputs: output c * M + m reads input c.
    kernel = jnp.reshape(w, (kh, kw, 1, channels * multiplier))
    y = lax.conv_general_dilated(
        x,
        kernel,
        window_strides=strides,
        padding=padding,
        rhs_dilation=dilations,
        dimension_numbers=(layout, "HWIO", layout),
        feature_group_count=channels,
        precision=ctx.precision,
    )
    if b is not None:
        y = y + (b if layout == "NHWC" else jnp.reshape(b, (-1, 1, 1)))
    return (y,)


@jonnx.register("UpSampling2D", since=VERSION, domain=DOMAIN, attributes=ATTRIBUTES["UpSampling2D"])
def upsampling2d(inputs, attrs, ctx):
    """Custom ``UpSampling2D``: nearest-neighbour upsampling by integer factors ``size``."""
    (x,) = inputs
    layout = _data_format(attrs["data_format"], ctx)
    sh, sw = _pair(attrs["size"], "size", ctx)
    if jnp.ndim(x) != 4:
        raise ctx.error(f"X must be 4-D, got {jnp.shape(x)}")
    h_axis, w_axis = (1, 2) if layout == "NHWC" else (2, 3)
    return (jnp.repeat(jnp.repeat(x, sh, axis=h_axis), sw, axis=w_axis),)


@jonnx.register("Add_", since=VERSION, domain=DOMAIN, attributes=ATTRIBUTES["Add_"])
def add_(inputs, attrs, ctx):
    """Custom ``Add_``: ``a + alpha * b`` (the runtime's in-place add, functional here)."""
    a, b = inputs
    alpha = jnp.asarray(attrs["alpha"], jnp.result_type(a))
    return (a + alpha * b,)


# -- the same ops in numpy (the reference) -----------------------------------------------------


def np_relu6(x):
    return np.minimum(np.maximum(x, 0), 6)


def np_dense(x, w, b=None, activation="linear"):
    y = x @ w + (0 if b is None else b)
    return {"linear": y, "relu": np.maximum(y, 0), "relu6": np_relu6(y)}[activation]


def np_depthwise_conv2d(x, w, b=None, strides=(1, 1), dilations=(1, 1), pads="VALID", data_format="NHWC"):
    """Direct summation over kernel taps, TensorFlow's SAME/VALID padding."""
    if data_format == "NCHW":
        x = x.transpose(0, 2, 3, 1)
    n, h, wd, c = x.shape
    kh, kw, _, m = w.shape
    (sh, sw), (dh, dw) = strides, dilations
    eff_h, eff_w = (kh - 1) * dh + 1, (kw - 1) * dw + 1
    if pads == "SAME":
        out_h, out_w = -(-h // sh), -(-wd // sw)
        pad_h = max((out_h - 1) * sh + eff_h - h, 0)
        pad_w = max((out_w - 1) * sw + eff_w - wd, 0)
        x = np.pad(x, ((0, 0), (pad_h // 2, pad_h - pad_h // 2), (pad_w // 2, pad_w - pad_w // 2), (0, 0)))
    else:
        out_h, out_w = (h - eff_h) // sh + 1, (wd - eff_w) // sw + 1
    y = np.zeros((n, out_h, out_w, c, m), np.result_type(x, w))
    for i in range(kh):
        for j in range(kw):
            patch = x[:, i * dh : i * dh + (out_h - 1) * sh + 1 : sh, j * dw : j * dw + (out_w - 1) * sw + 1 : sw, :]
            y += patch[..., None] * w[i, j]
    y = y.reshape(n, out_h, out_w, c * m)
    if b is not None:
        y = y + b
    return y.transpose(0, 3, 1, 2) if data_format == "NCHW" else y


def np_upsampling2d(x, size=(2, 2), data_format="NHWC"):
    h_axis, w_axis = (1, 2) if data_format == "NHWC" else (2, 3)
    rows = np.arange(x.shape[h_axis] * size[0]) // size[0]
    cols = np.arange(x.shape[w_axis] * size[1]) // size[1]
    return np.take(np.take(x, rows, axis=h_axis), cols, axis=w_axis)


def np_add_(a, b, alpha=1.0):
    return a + alpha * b


# -- the example network -----------------------------------------------------------------------


def make_weights(seed: int = 0) -> dict[str, np.ndarray]:
    """The network's float32 weights (TensorFlow layouts), by initializer name."""
    rng = np.random.default_rng(seed)

    def normal(*shape, scale=1.0):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    return {
        "dw1_w": normal(3, 3, 3, 2, scale=0.5),  # [kh, kw, C=3, M=2]: 6 channels out
        "dw1_b": normal(6, scale=0.1),
        "dw2_w": normal(3, 3, 6, 1, scale=0.5),
        "fc_w": normal(6, 4, scale=0.5),
        "fc_b": normal(4, scale=0.1),
    }


def build_model(weights: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """Image [N, 8, 8, 3] (NHWC) -> class probabilities [N, 4], with every custom op."""
    c = DOMAIN
    nodes = [
        oh.make_node(
            "DepthwiseConv2d",
            ["image", "dw1_w", "dw1_b"],
            ["h1"],
            domain=c,
            name="dw1",
            pads="SAME",
            strides=[1, 1],
            kernel_shape=[3, 3],
            group=3,
        ),
        oh.make_node("Relu6", ["h1"], ["h2"], domain=c, name="relu6"),
        # A standard-op detour through NCHW: MaxPool, then the custom upsampling back.
        oh.make_node("Transpose", ["h2"], ["h2_nchw"], perm=[0, 3, 1, 2], name="to_nchw"),
        oh.make_node("MaxPool", ["h2_nchw"], ["pooled"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
        oh.make_node("UpSampling2D", ["pooled"], ["up"], domain=c, name="up", size=[2, 2], data_format="NCHW"),
        oh.make_node("Transpose", ["up"], ["up_nhwc"], perm=[0, 2, 3, 1], name="to_nhwc"),
        oh.make_node("Add_", ["h2", "up_nhwc"], ["residual"], domain=c, name="residual", alpha=0.5),
        oh.make_node(
            "DepthwiseConv2d",
            ["residual", "dw2_w"],
            ["h3"],
            domain=c,
            name="dw2",
            pads="VALID",
            strides=[2, 2],
            dilations=[2, 2],
        ),
        oh.make_node("ReduceMean", ["h3", "spatial_axes"], ["pooled_features"], keepdims=0, name="gap"),
        oh.make_node("Dense", ["pooled_features", "fc_w", "fc_b"], ["logits"], domain=c, name="fc"),
        oh.make_node("Softmax", ["logits"], ["probs"], axis=-1, name="softmax"),
    ]
    initializers = [onnx.numpy_helper.from_array(np.asarray(v), k) for k, v in weights.items()]
    initializers.append(onnx.numpy_helper.from_array(np.array([1, 2], np.int64), "spatial_axes"))
    graph = oh.make_graph(
        nodes,
        "custom_ops_example",
        [oh.make_tensor_value_info("image", onnx.TensorProto.FLOAT, ["N", 8, 8, 3])],
        [
            oh.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, ["N", 4]),
            oh.make_tensor_value_info("probs", onnx.TensorProto.FLOAT, ["N", 4]),
        ],
        initializer=initializers,
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 21), oh.make_opsetid(DOMAIN, VERSION)])


def reference_forward(weights: Mapping[str, np.ndarray], image: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The same network in numpy (computes in the dtype it is given): (logits, probs)."""
    w = weights
    h2 = np_relu6(np_depthwise_conv2d(image, w["dw1_w"], w["dw1_b"], pads="SAME"))
    n, h, wd, ch = h2.shape
    pooled = h2.reshape(n, h // 2, 2, wd // 2, 2, ch).max(axis=(2, 4))  # MaxPool 2x2, stride 2
    residual = np_add_(h2, np_upsampling2d(pooled, (2, 2)), alpha=0.5)
    h3 = np_depthwise_conv2d(residual, w["dw2_w"], pads="VALID", strides=(2, 2), dilations=(2, 2))
    logits = np_dense(h3.mean(axis=(1, 2)), w["fc_w"], w["fc_b"])
    shifted = logits - logits.max(axis=-1, keepdims=True)
    probs = np.exp(shifted) / np.exp(shifted).sum(axis=-1, keepdims=True)
    return logits, probs


def cross_entropy(logits, labels):
    """Mean softmax cross-entropy with integer labels (jax or numpy arrays)."""
    xp = jnp if isinstance(logits, jax.Array) else np
    log_probs = logits - logits.max(axis=-1, keepdims=True)
    log_probs = log_probs - xp.log(xp.exp(log_probs).sum(axis=-1, keepdims=True))
    return -xp.take_along_axis(log_probs, labels[:, None], axis=-1).mean()


def main() -> None:
    weights = make_weights()
    model = jonnx.load(build_model(weights))
    custom = sorted({n.op_type for n in model.graph.nodes if n.domain == DOMAIN})
    print(f"registered {len(ATTRIBUTES)} ops in domain {DOMAIN!r}: {', '.join(sorted(ATTRIBUTES))}")
    print(f"loaded a {len(model.graph.nodes)}-node model using {', '.join(custom)}: {model}")

    rng = np.random.default_rng(1)
    images = rng.uniform(-1, 1, (5, 8, 8, 3)).astype(np.float32)
    labels = rng.integers(0, 4, 5)

    # 1. jit inference: custom and standard ops compile into one XLA computation.
    start = time.perf_counter()
    logits, probs = model(images)
    probs.block_until_ready()
    first = time.perf_counter() - start
    start = time.perf_counter()
    model(images)[1].block_until_ready()
    print(
        f"jit inference: probs {probs.shape}, first call {first * 1e3:.0f} ms (trace + compile), "
        f"next call {(time.perf_counter() - start) * 1e3:.2f} ms"
    )

    # 2. The same network in numpy, in float64.
    weights64 = {k: v.astype(np.float64) for k, v in weights.items()}
    ref_logits, ref_probs = reference_forward(weights64, images.astype(np.float64))
    diff = max(
        float(np.max(np.abs(np.asarray(logits) - ref_logits))), float(np.max(np.abs(np.asarray(probs) - ref_probs)))
    )
    print(f"numpy reference agrees: max |difference| = {diff:.2e}")
    assert diff < 1e-4, "jonnx and the numpy reference disagree"

    # 3. jax.grad through the custom ops, checked against a central finite difference of the
    # numpy network along a random direction.
    def loss_fn(params, x, y):
        out_logits, _ = model.apply(params, x)
        return cross_entropy(out_logits, y)

    params = model.params
    loss, grads = jax.jit(jax.value_and_grad(loss_fn))(params, images, labels)
    direction = {k: rng.standard_normal(v.shape) for k, v in params.items()}
    analytic = sum(float(jnp.vdot(grads[k], direction[k])) for k in params)
    eps = 1e-6

    def numpy_loss(sign):
        moved = {k: v + sign * eps * direction[k] for k, v in weights64.items()}
        return cross_entropy(reference_forward(moved, images.astype(np.float64))[0], labels)

    numeric = (numpy_loss(+1) - numpy_loss(-1)) / (2 * eps)
    norms = ", ".join(f"{k} {float(jnp.linalg.norm(g)):.3f}" for k, g in sorted(grads.items()))
    print(f"jax.grad: loss {float(loss):.4f}; gradient norms {norms}")
    print(f"directional derivative: jax.grad {analytic:.6f}, numpy finite difference {numeric:.6f}")
    assert abs(analytic - numeric) <= 1e-3 * max(1.0, abs(numeric)), "gradient disagrees with numpy"


if __name__ == "__main__":
    main()

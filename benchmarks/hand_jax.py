"""The benchmark networks of nets.py written by hand in JAX: the baselines jonnx is measured against.

What a JAX user would write without jonnx: NHWC activations, HWIO kernels, every convolution one
``lax.conv_general_dilated`` (depthwise ones with ``feature_group_count``), BatchNormalization
as its formula (not folded), the BERT encoder with separate Q/K/V matmuls. The weights come from
the ONNX proto nets.py builds (found by walking its nodes and taking initializers by name,
OIHW kernels transposed to HWIO once in numpy), so each function computes the same function as
the ONNX model, which the benchmarks check against onnxruntime.

- ``inference(proto)`` -> ``f(x)``, jitted, the weights closed over as compile-time constants
  (XLA may pre-pack them and fold BatchNormalization into the kernels). ``x`` is the ONNX
  model's own input (NCHW images or (N, seq, hidden)); CNNs transpose it to NHWC once.
  The int8 encoder (``nets.quantized``) is written as the fastest JAX found for it on CPUs
  without AMX rather than the plainest: the ONNX computation exactly (DynamicQuantizeLinear,
  integer products, the scales), with the int8 weights as bfloat16 constants (exact; there
  the fastest 8-bit product XLA runs; with AMX the int8 dot is, which jonnx then picks) and Q,
  K and V as one product.
- ``resnet_train_fns(proto)`` / ``bert_train_fns(proto)``: params as arguments (training), for
  the training-step baselines in bench_acceptance.py;
- ``recurrent_params(proto)`` / ``recurrent_forward(layers, x)``: the ``nets.recurrent`` stacks
  (one ``lax.scan`` per direction) for bench_recurrent.py, and ``torch_recurrent_weights`` for
  its PyTorch baseline.

Each hand-written network consumes the proto's convolutions (or linears) in graph order and
checks each one's shape and attributes against what the architecture expects, so a change to
nets.py that the hand-written code does not follow fails loudly instead of timing another net.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import nets  # benchmarks/, which every user of this module puts on sys.path
import numpy as np
import onnx
import onnx.numpy_helper as onh
from jax import lax

__all__ = ["bert_train_fns", "inference", "resnet_train_fns"]

_NHWC = ("NHWC", "HWIO", "NHWC")


# --------------------------------------------------------------------------- reading the proto


class ConvBN(NamedTuple):
    """One Conv (no bias) and the BatchNormalization after it, by initializer name."""

    w: str
    scale: str
    bias: str
    mean: str
    var: str
    c_in: int
    c_out: int
    k: int
    stride: int
    group: int
    eps: float
    momentum: float


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _initializers(proto: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: onh.to_array(t) for t in proto.graph.initializer}


def _consumers(proto: onnx.ModelProto) -> dict[str, list[onnx.NodeProto]]:
    out: dict[str, list[onnx.NodeProto]] = {}
    for node in proto.graph.node:
        for name in node.input:
            out.setdefault(name, []).append(node)
    return out


def cnn_layers(proto: onnx.ModelProto) -> tuple[list[ConvBN], str, str]:
    """The (Conv, BatchNormalization) pairs in graph order, and the classifier Gemm's W and B."""
    inits = _initializers(proto)
    users = _consumers(proto)
    convs = []
    for node in proto.graph.node:
        if node.op_type != "Conv":
            continue
        (bn,) = users[node.output[0]]
        if bn.op_type != "BatchNormalization":
            raise ValueError(f"Conv {node.name} is followed by {bn.op_type}, not BatchNormalization")
        a, b = _attrs(node), _attrs(bn)
        w = inits[node.input[1]]
        convs.append(
            ConvBN(
                node.input[1],
                *bn.input[1:5],
                c_in=w.shape[1] * a.get("group", 1),
                c_out=w.shape[0],
                k=w.shape[2],
                stride=a.get("strides", [1, 1])[0],
                group=a.get("group", 1),
                eps=b.get("epsilon", 1e-5),
                momentum=b.get("momentum", 0.9),
            )
        )
    (gemm,) = [n for n in proto.graph.node if n.op_type == "Gemm"]
    if _attrs(gemm).get("transB") != 1:
        raise ValueError("the classifier Gemm is expected with transB=1 (torch's Linear)")
    return convs, gemm.input[1], gemm.input[2]


def cnn_params(proto: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Every initializer a hand-written CNN reads, conv kernels as HWIO and the Gemm's W as (in, out)."""
    inits = _initializers(proto)
    convs, fc_w, fc_b = cnn_layers(proto)
    params = {}
    for c in convs:
        params[c.w] = np.ascontiguousarray(inits[c.w].transpose(2, 3, 1, 0))
        for name in (c.scale, c.bias, c.mean, c.var):
            params[name] = inits[name]
    params[fc_w] = np.ascontiguousarray(inits[fc_w].T)
    params[fc_b] = inits[fc_b]
    return params


class Layer(NamedTuple):
    """One BERT layer's initializer names: each linear's (weight, bias), or a :class:`QuantLinear`
    in the encoder through ``nets.quantized``; (gamma, beta) per LayerNorm."""

    q: tuple[str, str]
    k: tuple[str, str]
    v: tuple[str, str]
    o: tuple[str, str]
    ln1: tuple[str, str]
    ffn1: tuple[str, str]
    ffn2: tuple[str, str]
    ln2: tuple[str, str]


class QuantLinear(NamedTuple):
    """One quantize_dynamic linear's initializers: int8 weight, its scale and zero point, float bias."""

    w: str
    scale: str
    zero: str
    bias: str


def bert_layers(proto: onnx.ModelProto) -> tuple[list[Layer], int, float]:
    """The encoder's layers in graph order, its number of heads and LayerNorm epsilon. A linear
    is a MatMul by an initializer then an Add of the bias, or through quantize_dynamic a
    MatMulInteger -> Cast -> Mul by the two scales' product -> Add of the bias."""
    inits = _initializers(proto)
    users = _consumers(proto)
    producer = {o: n for n in proto.graph.node for o in n.output}

    def bias_after(node: onnx.NodeProto) -> str:
        (add,) = users[node.output[0]]
        return next(n for n in add.input if n in inits)

    linears, norms, heads, eps = [], [], None, None
    for node in proto.graph.node:
        if node.op_type == "MatMul" and node.input[1] in inits:
            linears.append((node.input[1], bias_after(node)))
        elif node.op_type == "MatMulInteger":
            (cast,) = users[node.output[0]]
            (mul,) = users[cast.output[0]]
            scales = producer[next(n for n in mul.input if n != cast.output[0])]
            w_scale = next(n for n in scales.input if n in inits)
            linears.append(QuantLinear(node.input[1], w_scale, node.input[3], bias_after(mul)))
        elif node.op_type == "LayerNormalization":
            norms.append(tuple(node.input[1:3]))
            eps = _attrs(node).get("epsilon", 1e-5)
        elif node.op_type == "Reshape" and heads is None and node.input[1] in inits:
            heads = int(inits[node.input[1]][2])
    if len(linears) != 6 * (len(norms) // 2):
        raise ValueError(f"{len(linears)} linears for {len(norms)} LayerNorms: not the nets.py encoder")
    if any(isinstance(q, QuantLinear) and inits[q.zero] != 0 for q in linears):
        raise ValueError("the hand-written int8 encoder expects symmetric int8 weights (zero points 0)")
    layers = [
        Layer(*linears[6 * i : 6 * i + 4], norms[2 * i], *linears[6 * i + 4 : 6 * i + 6], norms[2 * i + 1])
        for i in range(len(norms) // 2)
    ]
    return layers, heads, eps


# --------------------------------------------------------------------------- CNNs (NHWC)


def _expect(c: ConvBN, c_in: int, c_out: int, k: int, stride: int = 1, group: int = 1) -> None:
    got = (c.c_in, c.c_out, c.k, c.stride, c.group)
    if got != (c_in, c_out, k, stride, group):
        raise ValueError(
            f"conv {c.w}: (c_in, c_out, k, stride, group) {got}, hand-written net expects {(c_in, c_out, k, stride, group)}"
        )


class _Net:
    """Runs conv+BN layers in order; ``train`` uses batch statistics and records the new running ones."""

    def __init__(self, params, convs, train: bool):
        self.p, self.convs, self.train, self.new_state = params, iter(convs), train, {}

    def conv_bn(self, x, c_in, c_out, k, stride=1, group=1, act="relu"):
        c = next(self.convs)
        _expect(c, c_in, c_out, k, stride, group)
        p = self.p
        y = lax.conv_general_dilated(
            x, p[c.w], (stride, stride), ((k // 2, k // 2),) * 2, dimension_numbers=_NHWC, feature_group_count=group
        )
        if self.train:
            mean = jnp.mean(y, axis=(0, 1, 2))
            var = jnp.mean(jnp.square(y - mean), axis=(0, 1, 2))
            m = c.momentum
            self.new_state[c.mean] = lax.stop_gradient(p[c.mean] * m + mean * (1 - m))
            self.new_state[c.var] = lax.stop_gradient(p[c.var] * m + var * (1 - m))
        else:
            mean, var = p[c.mean], p[c.var]
        y = (y - mean) * lax.rsqrt(var + c.eps) * p[c.scale] + p[c.bias]
        if act == "relu":
            y = jax.nn.relu(y)
        elif act == "relu6":
            y = jnp.clip(y, 0.0, 6.0)
        return y

    def done(self):
        left = list(self.convs)
        if left:
            raise ValueError(f"the hand-written network used all but {len(left)} of the proto's convolutions")


def _resnet(net: _Net, x, blocks: list[int], bottleneck: bool):
    x = net.conv_bn(x, 3, 64, 7, stride=2)
    x = lax.reduce_window(x, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 2, 2, 1), ((0, 0), (1, 1), (1, 1), (0, 0)))
    c_in = 64
    for stage, n in enumerate(blocks):
        width = 64 * 2**stage
        c_out = width * 4 if bottleneck else width
        for i in range(n):
            stride = 2 if stage > 0 and i == 0 else 1
            if bottleneck:
                y = net.conv_bn(x, c_in, width, 1)
                y = net.conv_bn(y, width, width, 3, stride)
                y = net.conv_bn(y, width, c_out, 1, act=None)
            else:
                y = net.conv_bn(x, c_in, width, 3, stride)
                y = net.conv_bn(y, width, c_out, 3, act=None)
            if stride != 1 or c_in != c_out:
                x = net.conv_bn(x, c_in, c_out, 1, stride, act=None)
            x = jax.nn.relu(y + x)
            c_in = c_out
    return jnp.mean(x, axis=(1, 2))


def _mobilenet_v2(net: _Net, x):
    x = net.conv_bn(x, 3, 32, 3, stride=2, act="relu6")
    c_in = 32
    for t, c, n, s in nets.MOBILENET_V2_BLOCKS:
        for i in range(n):
            stride = s if i == 0 else 1
            hidden = c_in * t
            y = net.conv_bn(x, c_in, hidden, 1, act="relu6") if t != 1 else x
            y = net.conv_bn(y, hidden, hidden, 3, stride, group=hidden, act="relu6")
            y = net.conv_bn(y, hidden, c, 1, act=None)
            x = x + y if stride == 1 and c_in == c else y
            c_in = c
    x = net.conv_bn(x, c_in, 1280, 1, act="relu6")
    return jnp.mean(x, axis=(1, 2))


def _cnn_body(proto: onnx.ModelProto):
    """The hand-written body for this proto (told apart by its convolution count)."""
    convs, fc_w, fc_b = cnn_layers(proto)
    bodies = {
        53: lambda net, x: _resnet(net, x, [3, 4, 6, 3], True),  # ResNet-50
        20: lambda net, x: _resnet(net, x, [2, 2, 2, 2], False),  # ResNet-18
        52: _mobilenet_v2,
    }
    if len(convs) not in bodies:
        raise ValueError(f"no hand-written network with {len(convs)} convolutions (ResNet-50, ResNet-18, MobileNetV2)")
    body = bodies[len(convs)]

    def forward(params, x_nchw, train=False):
        net = _Net(params, convs, train)
        x = body(net, jnp.transpose(x_nchw, (0, 2, 3, 1)))
        net.done()
        logits = x @ params[fc_w] + params[fc_b]
        return (logits, net.new_state) if train else logits

    return forward


def resnet_train_fns(proto: onnx.ModelProto):
    """``(params, state, forward)`` for training a hand-written CNN with params as arguments.

    ``params`` holds the trainable weights (kernels HWIO, the classifier's W as (in, out)),
    ``state`` the running statistics; ``forward(params, state, x_nchw) -> (logits, new_state)``
    runs BatchNormalization on batch statistics (training mode, ONNX's momentum update).
    """
    convs, _, _ = cnn_layers(proto)
    every = cnn_params(proto)
    stat_names = {n for c in convs for n in (c.mean, c.var)}
    params = {k: v for k, v in every.items() if k not in stat_names}
    state = {k: v for k, v in every.items() if k in stat_names}
    body = _cnn_body(proto)

    def forward(params, state, x):
        return body({**params, **state}, x, train=True)

    return params, state, forward


# --------------------------------------------------------------------------- BERT encoder


def _layer_norm(x, g, b, eps):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * lax.rsqrt(var + eps) * g + b


def _blocks(layers: list[Layer], qkv, project, value) -> list[tuple]:
    """What :func:`_encoder` runs per layer: ``qkv(layer)`` and ``project(linear)`` give the
    projections as functions of their input, ``value(name)`` an initializer's array."""
    return [
        (
            qkv(layer),
            project(layer.o),
            project(layer.ffn1),
            project(layer.ffn2),
            [value(g) for g in layer.ln1],
            [value(g) for g in layer.ln2],
        )
        for layer in layers
    ]


def _encoder(x, blocks, heads: int, eps: float):
    """The encoder's layers over ``x`` (N, seq, hidden). ``blocks`` (:func:`_blocks`): per layer
    ``(qkv, out, ffn1, ffn2, ln1, ln2)``, the projections functions of their input (``qkv``
    giving Q, K and V) and each LayerNorm's (gamma, beta)."""
    n, s, h = x.shape
    d = h // heads
    for qkv, out, ffn1, ffn2, ln1, ln2 in blocks:
        q, k, v = (t.reshape(n, s, heads, d) for t in qkv(x))
        scores = jnp.einsum("nqhd,nkhd->nhqk", q, k) / np.float32(np.sqrt(d))
        ctx = jnp.einsum("nhqk,nkhd->nqhd", jax.nn.softmax(scores, axis=-1), v).reshape(n, s, h)
        x = _layer_norm(out(ctx) + x, *ln1, eps)
        f = ffn1(x)
        f = f * (lax.erf(f / np.float32(np.sqrt(2.0))) + 1.0) * 0.5  # the graph's order of steps
        x = _layer_norm(ffn2(f) + x, *ln2, eps)
    return x


def _bert_body(proto: onnx.ModelProto):
    layers, heads, eps = bert_layers(proto)

    def forward(p, x):
        def lin(wb):
            return lambda v: v @ p[wb[0]] + p[wb[1]]

        def qkv(layer):  # three separate products, as a JAX user writes them
            return lambda v: [lin(wb)(v) for wb in (layer.q, layer.k, layer.v)]

        return _encoder(x, _blocks(layers, qkv, lin, p.__getitem__), heads, eps)

    return forward


def bert_params(proto: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Every initializer the hand-written float encoder reads, by name."""
    inits = _initializers(proto)
    layers, _, _ = bert_layers(proto)
    return {name: inits[name] for layer in layers for pair in layer for name in pair}


def bert_train_fns(proto: onnx.ModelProto):
    """``(params, forward)``: the encoder with params as arguments, ``forward(params, x) -> hidden``."""
    return bert_params(proto), _bert_body(proto)


# --------------------------------------------------------------------------- int8 BERT encoder


def _dynamic_quantize(x):
    """ONNX DynamicQuantizeLinear as int8 values ``q - 128`` (bfloat16, which holds them exactly),
    with the scale and the offset ``128 - zero_point`` that restores ``q - zero_point``."""
    hi = jnp.maximum(0.0, jnp.max(x))
    lo = jnp.minimum(0.0, jnp.min(x))
    scale = (hi - lo) / np.float32(255)
    zero = jnp.round(jnp.clip(-lo / scale, 0, 255))
    q = jnp.clip(jnp.round(x / scale) + zero, 0, 255)
    return (q - 128).astype(jnp.bfloat16), scale, 128 - zero.astype(jnp.int32)


_EXACT_K = 1024  # bfloat16 products of int8 values summed in float32 stay exact up to 1024 terms


def _bert_int8_body(proto: onnx.ModelProto):
    """The quantized encoder, every product as fast as XLA runs it here: int8 weights as
    bfloat16 constants (exact), Q, K and V as one product, contractions over 1024 in chunks
    summed in int32 (so the integer products are exact, as MatMulInteger's)."""
    inits = _initializers(proto)
    layers, heads, eps = bert_layers(proto)

    def linear(*qs: QuantLinear):
        w = np.concatenate([inits[q.w] for q in qs], axis=1)
        chunks = [w[k : k + _EXACT_K].astype(jnp.bfloat16) for k in range(0, w.shape[0], _EXACT_K)]
        col_sums = w.astype(np.int32).sum(axis=0)
        w_scales = np.repeat([inits[q.scale] for q in qs], [inits[q.w].shape[1] for q in qs]).astype(np.float32)
        bias = np.concatenate([inits[q.bias] for q in qs])

        def apply(x):
            a, x_scale, offset = _dynamic_quantize(x)
            acc = offset * col_sums
            for i, chunk in enumerate(chunks):
                part = jnp.matmul(a[..., i * _EXACT_K : (i + 1) * _EXACT_K], chunk, preferred_element_type=jnp.float32)
                acc = acc + part.astype(jnp.int32)
            return acc.astype(jnp.float32) * (x_scale * w_scales) + bias

        return apply

    def qkv(layer: Layer):  # one product
        fused = linear(layer.q, layer.k, layer.v)
        return lambda v: jnp.split(fused(v), 3, axis=-1)

    blocks = _blocks(layers, qkv, linear, inits.__getitem__)  # weights prepared once, here
    return lambda x: _encoder(x, blocks, heads, eps)


# --------------------------------------------------------------------------- recurrent layers


def recurrent_params(proto: onnx.ModelProto) -> list[dict[str, np.ndarray]]:
    """Per layer of a ``nets.recurrent`` proto: its W, R and B (ONNX's layouts) and kind."""
    inits = _initializers(proto)
    layers = []
    for node in proto.graph.node:
        if node.op_type in nets.RECURRENT_GATES:
            w, r, b = (inits[name] for name in node.input[1:4])
            if node.op_type == "GRU" and _attrs(node).get("linear_before_reset") != 1:
                raise ValueError(f"{node.name}: the hand-written GRU expects linear_before_reset=1 (PyTorch's)")
            layers.append({"kind": node.op_type, "w": w, "r": r, "b": b})
    return layers


def _recurrent_direction(kind, x, w, r, b):
    """One direction of one layer over ``x`` (seq, N, inputs): its outputs (seq, N, hidden)."""
    hidden = r.shape[-1]
    gates = nets.RECURRENT_GATES[kind] * hidden
    xw = x @ w.T + b[:gates]
    rb = b[gates:]

    def step(state, xw_t):
        h = state[0]
        hr = h @ r.T + rb
        if kind == "RNN":
            new = (jnp.tanh(xw_t + hr),)
        elif kind == "GRU":  # gates z, r, h; the reset gate applied after R's product
            z = jax.nn.sigmoid(xw_t[:, :hidden] + hr[:, :hidden])
            reset = jax.nn.sigmoid(xw_t[:, hidden : 2 * hidden] + hr[:, hidden : 2 * hidden])
            cand = jnp.tanh(xw_t[:, 2 * hidden :] + reset * hr[:, 2 * hidden :])
            new = ((1 - z) * cand + z * h,)
        else:  # LSTM: gates i, o, f, c
            g = xw_t + hr
            i, o, f, c = (g[:, k * hidden : (k + 1) * hidden] for k in range(4))
            c_new = jax.nn.sigmoid(f) * state[1] + jax.nn.sigmoid(i) * jnp.tanh(c)
            new = (jax.nn.sigmoid(o) * jnp.tanh(c_new), c_new)
        return new, new[0]

    zeros = jnp.zeros((x.shape[1], hidden), x.dtype)
    return jax.lax.scan(step, (zeros, zeros) if kind == "LSTM" else (zeros,), xw)[1]


def recurrent_forward(layers, x):
    """The stacked layers over ``x`` (seq, N, inputs): the last layer's outputs, directions
    concatenated along the features, as the ONNX model's Transpose and Reshape give them."""
    for layer in layers:
        w, r, b = layer["w"], layer["r"], layer["b"]
        outs = [_recurrent_direction(layer["kind"], x, w[0], r[0], b[0])]
        if w.shape[0] == 2:  # bidirectional: the second direction reads the sequence backwards
            outs.append(jnp.flip(_recurrent_direction(layer["kind"], jnp.flip(x, 0), w[1], r[1], b[1]), 0))
        x = jnp.concatenate(outs, axis=-1)
    return x


# --------------------------------------------------------------------------- inference


def _is_bert(proto: onnx.ModelProto) -> bool:
    return any(n.op_type == "LayerNormalization" for n in proto.graph.node)


def inference(proto: onnx.ModelProto):
    """The hand-written network for a nets.py proto, jitted, weights as compile-time constants."""
    if any(n.op_type == "MatMulInteger" for n in proto.graph.node):
        return jax.jit(_bert_int8_body(proto))  # its weights are bfloat16 constants already
    if any(n.op_type in nets.RECURRENT_GATES for n in proto.graph.node):
        params, body = recurrent_params(proto), recurrent_forward
    elif _is_bert(proto):
        params, body = bert_params(proto), _bert_body(proto)
    else:
        params, body = cnn_params(proto), _cnn_body(proto)
    # numpy arrays closed over are baked into the compiled program as constants.
    return jax.jit(lambda x: body(params, x))


# --------------------------------------------------------------------------- weights for torch


def torch_resnet_weights(proto: onnx.ModelProto) -> dict[str, np.ndarray]:
    """The CNN's weights for the torch baselines, in graph order: ``conv{i}.weight`` (OIHW),
    ``bn{i}.weight/bias/running_mean/running_var``, ``fc.weight`` (out, in) and ``fc.bias``."""
    inits = _initializers(proto)
    convs, fc_w, fc_b = cnn_layers(proto)
    out = {"fc.weight": inits[fc_w], "fc.bias": inits[fc_b]}
    for i, c in enumerate(convs):
        out[f"conv{i}.weight"] = inits[c.w]
        for field, name in zip(("weight", "bias", "running_mean", "running_var"), (c.scale, c.bias, c.mean, c.var)):
            out[f"bn{i}.{field}"] = inits[name]
    return out


def torch_bert_weights(proto: onnx.ModelProto) -> dict[str, np.ndarray]:
    """The encoder's weights for the torch baseline: ``{layer}.{q,k,v,o,ffn1,ffn2}.{weight,bias}``
    (weights as (in, out), as ``x @ W`` reads them), ``{layer}.{ln1,ln2}.{weight,bias}``, plus
    ``heads`` and ``eps``."""
    inits = _initializers(proto)
    layers, heads, eps = bert_layers(proto)
    out = {"heads": np.array(heads), "eps": np.array(eps)}
    for i, layer in enumerate(layers):
        for part, names in layer._asdict().items():
            out[f"{i}.{part}.weight"], out[f"{i}.{part}.bias"] = (inits[n] for n in names)
    return out


# ONNX's gate order -> PyTorch's: LSTM i, o, f, c -> i, f, g, o; GRU z, r, h -> r, z, n.
_TORCH_GATES = {"LSTM": [0, 2, 3, 1], "GRU": [1, 0, 2], "RNN": [0]}


def torch_recurrent_weights(proto: onnx.ModelProto) -> dict[str, np.ndarray]:
    """A ``nets.recurrent`` stack's weights as PyTorch's ``nn.LSTM``/``nn.GRU``/``nn.RNN``
    state dict (``weight_ih_l0``, ``bias_hh_l1_reverse``, ...: gates in PyTorch's order),
    plus ``kind``, ``hidden`` and ``bidirectional``."""
    layers = recurrent_params(proto)
    kind = layers[0]["kind"]
    order = _TORCH_GATES[kind]
    hidden = layers[0]["r"].shape[-1]

    def reorder(a):  # gate blocks along the first axis
        return np.concatenate([a[g * hidden : (g + 1) * hidden] for g in order])

    out = {"kind": np.array(kind), "hidden": np.array(hidden), "bidirectional": np.array(layers[0]["w"].shape[0] == 2)}
    for k, layer in enumerate(layers):
        gates = len(order) * hidden
        for d, suffix in enumerate(["", "_reverse"][: layer["w"].shape[0]]):
            out[f"weight_ih_l{k}{suffix}"] = reorder(layer["w"][d])
            out[f"weight_hh_l{k}{suffix}"] = reorder(layer["r"][d])
            out[f"bias_ih_l{k}{suffix}"] = reorder(layer["b"][d, :gates])
            out[f"bias_hh_l{k}{suffix}"] = reorder(layer["b"][d, gates:])
    return out

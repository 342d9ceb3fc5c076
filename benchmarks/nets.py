"""Benchmark networks built with onnx.helper, with seeded weights, in the form exporters write.

ResNet-50, MobileNetV2 and EfficientNet-B0 are NCHW with Conv (no bias) -> BatchNormalization
-> Relu/Clip/SiLU, as ``torch.onnx.export`` writes them in eval mode without constant folding
(EfficientNet-B0 is not an acceptance target: it is there for SiLU and squeeze-and-excitation,
which the others lack; ``mnist`` is the model zoo's small CNN, also not a target); the BERT-base-width
encoder is MatMul + Add projections, Reshape/Transpose heads, Softmax attention,
LayerNormalization and an Erf GELU. ``recurrent`` stacks ONNX LSTM, GRU or RNN layers as
``torch.onnx.export`` writes an ``nn.LSTM``/``nn.GRU``/``nn.RNN`` (time-major, one node per layer,
GRU with ``linear_before_reset``, the direction axis merged into the features between layers).
The batch axis is symbolic (``N``). No torch needed.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh

__all__ = ["bert_encoder", "efficientnet_b0", "mnist", "mobilenet_v2", "recurrent", "resnet18", "resnet50"]


class _Builder:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def name(self, stem: str) -> str:
        self.count += 1
        return f"{stem}_{self.count}"

    def init(self, stem: str, value: np.ndarray) -> str:
        name = self.name(stem)
        value = np.asarray(value)
        self.inits.append(onh.from_array(value.astype(np.float32) if value.dtype == np.float64 else value, name))
        return name

    def node(self, op: str, inputs: list[str], n_out: int = 1, **attrs) -> str | list[str]:
        outs = [self.name(op.lower()) for _ in range(n_out)]
        self.nodes.append(oh.make_node(op, inputs, outs, name=self.name(op), **attrs))
        return outs[0] if n_out == 1 else outs

    def conv_bn(
        self,
        x: str,
        c_in: int,
        c_out: int,
        k: int,
        stride: int = 1,
        group: int = 1,
        act: str | None = "Relu",
    ) -> str:
        fan_in = c_in // group * k * k
        w = self.init(
            "conv.weight",
            self.rng.standard_normal((c_out, c_in // group, k, k)).astype(np.float32) * np.sqrt(2.0 / fan_in),
        )
        y = self.node(
            "Conv",
            [x, w],
            kernel_shape=[k, k],
            strides=[stride, stride],
            pads=[k // 2] * 4,
            group=group,
        )
        scale = self.init("bn.weight", (1 + 0.1 * self.rng.standard_normal(c_out)).astype(np.float32))
        bias = self.init("bn.bias", (0.1 * self.rng.standard_normal(c_out)).astype(np.float32))
        mean = self.init(
            "bn.running_mean",
            (0.1 * self.rng.standard_normal(c_out)).astype(np.float32),
        )
        var = self.init("bn.running_var", (1 + 0.1 * self.rng.random(c_out)).astype(np.float32))
        y = self.node(
            "BatchNormalization",
            [y, scale, bias, mean, var],
            epsilon=1e-5,
            momentum=0.9,
        )
        if act == "Relu":
            y = self.node("Relu", [y])
        elif act == "Relu6":
            lo = self.init("clip.min", np.array(0.0, np.float32))
            hi = self.init("clip.max", np.array(6.0, np.float32))
            y = self.node("Clip", [y, lo, hi])
        elif act == "Silu":  # torch's SiLU as its exporter writes it
            y = self.node("Mul", [y, self.node("Sigmoid", [y])])
        return y

    def conv_bias(self, x: str, c_in: int, c_out: int) -> str:
        """A 1x1 Conv with a bias (a squeeze-and-excitation block's)."""
        w = self.rng.standard_normal((c_out, c_in, 1, 1)).astype(np.float32) / np.sqrt(c_in)
        bias = (0.1 * self.rng.standard_normal(c_out)).astype(np.float32)
        return self.node("Conv", [x, self.init("conv.weight", w), self.init("conv.bias", bias)], kernel_shape=[1, 1])

    def linear(self, x: str, d_in: int, d_out: int, gemm: bool = False) -> str:
        w = self.rng.standard_normal((d_in, d_out)).astype(np.float32) / np.sqrt(d_in)
        b = self.init("linear.bias", (0.01 * self.rng.standard_normal(d_out)).astype(np.float32))
        if gemm:  # torch's Linear on a matrix: Gemm with transB
            return self.node("Gemm", [x, self.init("linear.weight", w.T.copy()), b], transB=1)
        return self.node("Add", [self.node("MatMul", [x, self.init("linear.weight", w)]), b])

    def model(self, inputs, outputs, opset: int = 17) -> onnx.ModelProto:
        graph = oh.make_graph(self.nodes, "bench", inputs, outputs, self.inits)
        model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)])
        model.ir_version = 8
        return model


def _classifier_head(b: _Builder, x: str, c: int, classes: int) -> str:
    y = b.node("GlobalAveragePool", [x])
    y = b.node("Flatten", [y], axis=1)
    return b.linear(y, c, classes, gemm=True)


def _mobile_head(b: _Builder, x: str, c_in: int, act: str) -> onnx.ModelProto:
    """What MobileNetV2 and EfficientNet-B0 end with: a 1x1 Conv to 1280 channels with
    BatchNormalization and ``act``, the 1000-class head, and the model over 224x224 images."""
    x = b.conv_bn(x, c_in, 1280, 1, act=act)
    out = _classifier_head(b, x, 1280, 1000)
    return b.model(
        [oh.make_tensor_value_info("input", onnx.TensorProto.FLOAT, ["N", 3, 224, 224])],
        [oh.make_tensor_value_info(out, onnx.TensorProto.FLOAT, ["N", 1000])],
    )


def _resnet(blocks: list[int], bottleneck: bool, size: int, classes: int, seed: int) -> onnx.ModelProto:
    b = _Builder(seed)
    x = b.conv_bn("input", 3, 64, 7, stride=2)
    x = b.node("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    c_in = 64
    for stage, n in enumerate(blocks):
        width = 64 * 2**stage
        c_out = width * 4 if bottleneck else width
        for i in range(n):
            stride = 2 if stage > 0 and i == 0 else 1
            if bottleneck:
                y = b.conv_bn(x, c_in, width, 1)
                y = b.conv_bn(y, width, width, 3, stride=stride)
                y = b.conv_bn(y, width, c_out, 1, act=None)
            else:
                y = b.conv_bn(x, c_in, width, 3, stride=stride)
                y = b.conv_bn(y, width, c_out, 3, act=None)
            shortcut = b.conv_bn(x, c_in, c_out, 1, stride=stride, act=None) if (stride != 1 or c_in != c_out) else x
            x = b.node("Relu", [b.node("Add", [y, shortcut])])
            c_in = c_out
    out = _classifier_head(b, x, c_in, classes)
    return b.model(
        [oh.make_tensor_value_info("input", onnx.TensorProto.FLOAT, ["N", 3, size, size])],
        [oh.make_tensor_value_info(out, onnx.TensorProto.FLOAT, ["N", classes])],
    )


def resnet50(seed: int = 0) -> onnx.ModelProto:
    """ResNet-50 (v1.5: stride on the 3x3), 224x224, 1000 classes."""
    return _resnet([3, 4, 6, 3], True, 224, 1000, seed)


def resnet18(size: int = 64, classes: int = 10, seed: int = 0) -> onnx.ModelProto:
    """ResNet-18 at ``size`` x ``size`` with ``classes`` outputs (the training benchmark)."""
    return _resnet([2, 2, 2, 2], False, size, classes, seed)


# MobileNetV2's inverted residual stages: (expansion t, channels c, blocks n, first stride s).
MOBILENET_V2_BLOCKS = [
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
]


def mobilenet_v2(seed: int = 0) -> onnx.ModelProto:
    """MobileNetV2 (width 1.0), 224x224, 1000 classes, ReLU6 as Clip(0, 6)."""
    b = _Builder(seed)
    x = b.conv_bn("input", 3, 32, 3, stride=2, act="Relu6")
    c_in = 32
    for t, c, n, s in MOBILENET_V2_BLOCKS:
        for i in range(n):
            stride = s if i == 0 else 1
            hidden = c_in * t
            y = b.conv_bn(x, c_in, hidden, 1, act="Relu6") if t != 1 else x
            y = b.conv_bn(y, hidden, hidden, 3, stride=stride, group=hidden, act="Relu6")
            y = b.conv_bn(y, hidden, c, 1, act=None)
            x = b.node("Add", [x, y]) if stride == 1 and c_in == c else y
            c_in = c
    return _mobile_head(b, x, c_in, "Relu6")


# EfficientNet-B0's stages: (expansion, output channels, blocks, first stride, kernel).
EFFICIENTNET_B0_BLOCKS = [
    (1, 16, 1, 1, 3),
    (6, 24, 2, 2, 3),
    (6, 40, 2, 2, 5),
    (6, 80, 3, 2, 3),
    (6, 112, 3, 1, 5),
    (6, 192, 4, 2, 5),
    (6, 320, 1, 1, 3),
]


def efficientnet_b0(seed: int = 0) -> onnx.ModelProto:
    """EfficientNet-B0, 224x224, 1000 classes: SiLU as ``x * Sigmoid(x)``, depthwise 3x3 and
    5x5, squeeze-and-excitation (GlobalAveragePool, two 1x1 Convs with biases, Sigmoid, Mul)."""
    b = _Builder(seed)
    x = b.conv_bn("input", 3, 32, 3, stride=2, act="Silu")
    c_in = 32
    for t, c, n, s, k in EFFICIENTNET_B0_BLOCKS:
        for i in range(n):
            stride = s if i == 0 else 1
            hidden = c_in * t
            y = b.conv_bn(x, c_in, hidden, 1, act="Silu") if t != 1 else x
            y = b.conv_bn(y, hidden, hidden, k, stride=stride, group=hidden, act="Silu")
            squeezed = max(1, c_in // 4)
            se = b.node("GlobalAveragePool", [y])
            se = b.conv_bias(se, hidden, squeezed)
            se = b.node("Mul", [se, b.node("Sigmoid", [se])])
            se = b.node("Sigmoid", [b.conv_bias(se, squeezed, hidden)])
            y = b.conv_bn(b.node("Mul", [y, se]), hidden, c, 1, act=None)
            x = b.node("Add", [x, y]) if stride == 1 and c_in == c else y
            c_in = c
    return _mobile_head(b, x, c_in, "Silu")


def mnist(seed: int = 0) -> onnx.ModelProto:
    """The ONNX model zoo's MNIST CNN (mnist-8 and later), 28x28 grey images, 10 classes: 5x5
    Convs 1->8 and 8->16 with biases and "same" pads, each with a ReLU and a max pool (2x2, then
    3x3 of stride 3), flattened by a Reshape into a 256 -> 10 product. Not an acceptance target:
    a small stem into a pool (docs/performance.md, "Pools after multiply-add loops")."""
    b = _Builder(seed)
    x = "Input3"
    for c_in, c_out, pool in ((1, 8, 2), (8, 16, 3)):
        w = b.rng.standard_normal((c_out, c_in, 5, 5)).astype(np.float32) * np.sqrt(2.0 / (c_in * 25))
        bias = (0.01 * b.rng.standard_normal(c_out)).astype(np.float32)
        x = b.node("Conv", [x, b.init("conv.weight", w), b.init("conv.bias", bias)], kernel_shape=[5, 5], pads=[2] * 4)
        x = b.node("MaxPool", [b.node("Relu", [x])], kernel_shape=[pool, pool], strides=[pool, pool])
    x = b.node("Reshape", [x, b.init("shape", np.array([-1, 256], np.int64))])
    out = b.linear(x, 256, 10)
    return b.model(
        [oh.make_tensor_value_info("Input3", onnx.TensorProto.FLOAT, ["N", 1, 28, 28])],
        [oh.make_tensor_value_info(out, onnx.TensorProto.FLOAT, ["N", 10])],
    )


def bert_encoder(layers: int = 4, hidden: int = 768, heads: int = 12, seq: int = 128, seed: int = 0) -> onnx.ModelProto:
    """A BERT-base-width encoder: ``layers`` post-LN layers over (N, seq, hidden) float input."""
    b = _Builder(seed)
    head = hidden // heads
    split = b.init("shape.heads", np.array([0, 0, heads, head], np.int64))
    merge = b.init("shape.merge", np.array([0, 0, hidden], np.int64))
    scale = b.init("attn.scale", np.array(np.sqrt(head), np.float32))
    x = "hidden_states"

    def layer_norm(v: str) -> str:
        g = b.init("ln.weight", (1 + 0.1 * b.rng.standard_normal(hidden)).astype(np.float32))
        beta = b.init("ln.bias", (0.1 * b.rng.standard_normal(hidden)).astype(np.float32))
        return b.node("LayerNormalization", [v, g, beta], axis=-1, epsilon=1e-12)

    for _ in range(layers):
        q, k, v = (b.node("Reshape", [b.linear(x, hidden, hidden), split]) for _ in range(3))
        q = b.node("Transpose", [q], perm=[0, 2, 1, 3])
        k = b.node("Transpose", [k], perm=[0, 2, 3, 1])
        v = b.node("Transpose", [v], perm=[0, 2, 1, 3])
        scores = b.node("Div", [b.node("MatMul", [q, k]), scale])
        probs = b.node("Softmax", [scores], axis=-1)
        ctx = b.node("Transpose", [b.node("MatMul", [probs, v])], perm=[0, 2, 1, 3])
        ctx = b.node("Reshape", [ctx, merge])
        x = layer_norm(b.node("Add", [b.linear(ctx, hidden, hidden), x]))
        h = b.linear(x, hidden, 4 * hidden)
        sqrt2 = b.init("gelu.sqrt2", np.array(np.sqrt(2.0), np.float32))
        half = b.init("gelu.half", np.array(0.5, np.float32))
        one = b.init("gelu.one", np.array(1.0, np.float32))
        erf = b.node("Erf", [b.node("Div", [h, sqrt2])])
        h = b.node("Mul", [b.node("Mul", [h, b.node("Add", [erf, one])]), half])
        x = layer_norm(b.node("Add", [b.linear(h, 4 * hidden, hidden), x]))
    return b.model(
        [oh.make_tensor_value_info("hidden_states", onnx.TensorProto.FLOAT, ["N", seq, hidden])],
        [oh.make_tensor_value_info(x, onnx.TensorProto.FLOAT, ["N", seq, hidden])],
    )


def quantized(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` through onnxruntime's ``quantize_dynamic`` (int8 weights, MatMulInteger)."""
    import os
    import tempfile

    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory() as tmp:
        src, dst = os.path.join(tmp, "f32.onnx"), os.path.join(tmp, "int8.onnx")
        onnx.save(model, src)
        quantize_dynamic(src, dst, weight_type=QuantType.QInt8)
        return onnx.load(dst)


RECURRENT_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def recurrent(
    kind: str = "LSTM",
    layers: int = 2,
    inputs: int = 128,
    hidden: int = 256,
    seq: int = 100,
    bidirectional: bool = False,
    seed: int = 0,
) -> onnx.ModelProto:
    """``layers`` stacked ``kind`` layers over ``(seq, N, inputs)`` (time-major, as PyTorch's
    default), returning the last layer's ``Y`` as ``(seq, N, directions x hidden)``."""
    b = _Builder(seed)
    gates, dirs = RECURRENT_GATES[kind], 2 if bidirectional else 1
    x, size = "x", inputs
    for _ in range(layers):
        scale = 1 / np.sqrt(hidden)
        w = b.init("rnn.weight_ih", b.rng.uniform(-scale, scale, (dirs, gates * hidden, size)))
        r = b.init("rnn.weight_hh", b.rng.uniform(-scale, scale, (dirs, gates * hidden, hidden)))
        bias = b.init("rnn.bias", b.rng.uniform(-scale, scale, (dirs, 2 * gates * hidden)))
        attrs = {"hidden_size": hidden, "direction": "bidirectional" if bidirectional else "forward"}
        if kind == "GRU":
            attrs["linear_before_reset"] = 1  # PyTorch's GRU
        y = b.node(kind, [x, w, r, bias], n_out=2, **attrs)[0]
        y = b.node("Transpose", [y], perm=[0, 2, 1, 3])  # (seq, N, dirs, hidden)
        x = b.node("Reshape", [y, b.init("shape", np.array([seq, -1, dirs * hidden], np.int64))])
        size = dirs * hidden
    return b.model(
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [seq, "N", inputs])],
        [oh.make_tensor_value_info(x, onnx.TensorProto.FLOAT, [seq, "N", size])],
    )

"""The channels_last pass (jonnx/optimize/layout.py): CNN chains run N(D)HWC, results unchanged.

Each graph runs with only the layout pass on against ``optimize=False`` (outputs, running
statistics and gradients, train on and off: ``tests._on_off.compare_on_off``) and against
onnxruntime, and each test checks that the pass rewrote what it should and kept the
activation transposes to the boundaries, so none can pass vacuously.
"""

from __future__ import annotations

import pathlib

import jax
import jax.test_util
import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import onnxruntime as ort
import pytest

import jonnx
from jonnx.ops import conv as conv_ops
from jonnx.ops.channels_last import DOMAIN
from tests._on_off import compare_on_off
from tests.ops.test_conv_lowering import CASES as CONV_CASES, conv_reference
from tests.test_optimize import MODELS, _model

EXPORTS = pathlib.Path(__file__).resolve().parent / "models" / "exports"
F = onnx.TensorProto.FLOAT
# This module's own generator, reseeded per test by conftest: a generator borrowed from
# another module would make the data depend on which tests ran before in the worker.
RNG = np.random.default_rng(0)
ON = {
    "channels_last": True,
    "fold_batchnorm": False,
    "fuse_matmuls": False,
    "quantized_convs": False,
    "dead_nodes": False,
}


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _bn(prefix, c, inits, **attrs):
    inits.update(
        {
            f"{prefix}_s": rand(c),
            f"{prefix}_b": rand(c),
            f"{prefix}_m": rand(c),
            f"{prefix}_v": np.abs(rand(c)) + 0.5,
        }
    )
    return [f"{prefix}_{k}" for k in "sbmv"]


def _io(x_shape, outputs=("out",)):
    return (
        [oh.make_tensor_value_info("x", F, ["N", *x_shape[1:]])],
        [oh.make_tensor_value_info(o, F, None) for o in outputs],
    )


def resnet_block():
    """Stem, two 3x3 convs with BatchNorm, a residual Add, per-channel Mul/Add constants, a
    Flatten/Gemm head."""
    inits = {"w0": rand(8, 3, 3, 3), "w1": rand(8, 8, 3, 3), "w2": rand(8, 8, 3, 3), "fc": rand(8, 5)}
    inits |= {"gain": rand(8, 1, 1), "shift": rand(1, 8, 1, 1), "half": np.float32(0.5), "fcb": rand(5)}
    nodes = [
        oh.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1], strides=[2, 2]),
        oh.make_node("BatchNormalization", ["c0", *_bn("bn0", 8, inits)], ["b0"]),
        oh.make_node("Relu", ["b0"], ["a"]),
        oh.make_node("Conv", ["a", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        oh.make_node("BatchNormalization", ["c1", *_bn("bn1", 8, inits)], ["b1"]),
        oh.make_node("Relu", ["b1"], ["r1"]),
        oh.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
        oh.make_node("Mul", ["c2", "gain"], ["g"]),
        oh.make_node("Add", ["g", "shift"], ["h"]),
        oh.make_node("Add", ["h", "a"], ["sum"]),
        oh.make_node("Mul", ["sum", "half"], ["m"]),
        oh.make_node("Relu", ["m"], ["r"]),
        oh.make_node("GlobalAveragePool", ["r"], ["p"]),
        oh.make_node("Flatten", ["p"], ["f"]),
        oh.make_node("Gemm", ["f", "fc", "fcb"], ["out"]),
    ]
    return _model(nodes, *_io((2, 3, 12, 12)), inits), {"x": rand(2, 3, 12, 12)}


def mobilenet_block():
    """1x1 expansion, depthwise 3x3 (Clip 0..6), 1x1 projection, residual Add."""
    inits = {"we": rand(12, 4, 1, 1), "wd": rand(12, 1, 3, 3), "bd": rand(12), "wp": rand(4, 12, 1, 1)}
    inits |= {"lo": np.float32(0.0), "hi": np.float32(6.0)}
    nodes = [
        oh.make_node("Conv", ["x", "we"], ["e"]),
        oh.make_node("BatchNormalization", ["e", *_bn("bn0", 12, inits)], ["eb"]),
        oh.make_node("Clip", ["eb", "lo", "hi"], ["ec"]),
        oh.make_node("Conv", ["ec", "wd", "bd"], ["d"], group=12, pads=[1, 1, 1, 1]),
        oh.make_node("Clip", ["d", "lo", "hi"], ["dc"]),
        oh.make_node("Conv", ["dc", "wp"], ["p"]),
        oh.make_node("BatchNormalization", ["p", *_bn("bn1", 4, inits)], ["pb"]),
        oh.make_node("Add", ["pb", "x"], ["sum"]),
        oh.make_node("HardSwish", ["sum"], ["out"]),
    ]
    return _model(nodes, *_io((2, 4, 9, 9)), inits, opset=14), {"x": rand(2, 4, 9, 9)}


def inception_block():
    """Branches (1x1, 3x3, max pool) concatenated on the channel axis, then an average pool and
    a DenseNet-style Concat with the block's input."""
    inits = {"w1": rand(3, 5, 1, 1), "w3": rand(4, 5, 3, 3), "wi": rand(5, 2, 1, 1)}
    nodes = [
        oh.make_node("Conv", ["x", "wi"], ["s"]),
        oh.make_node("Conv", ["s", "w1"], ["b1"]),
        oh.make_node("Conv", ["s", "w3"], ["b3"], pads=[1, 1, 1, 1]),
        oh.make_node("MaxPool", ["s"], ["bp"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1]),
        oh.make_node("Concat", ["b1", "b3", "bp"], ["cat"], axis=1),
        oh.make_node("Concat", ["cat", "s"], ["dense"], axis=-3),
        oh.make_node(
            "AveragePool", ["dense"], ["out"], kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 1, 1], ceil_mode=1
        ),
    ]
    return _model(nodes, *_io((2, 2, 8, 8)), inits, opset=19), {"x": rand(2, 2, 8, 8)}


def pad_slice_resize():
    """Pad, Slice and Resize with constant operands inside a chain; InstanceNorm; a graph output
    in the middle of the chain (``mid``); a Transpose that cancels the layout; a Reshape head."""
    inits = {
        "w0": rand(4, 3, 3, 3),
        "w1": rand(4, 4, 1, 1),
        "pads": np.array([0, 0, 1, 2, 0, 0, 2, 1], np.int64),
        "starts": np.array([1, 0], np.int64),
        "ends": np.array([100, -1], np.int64),
        "axes": np.array([2, -1], np.int64),
        "scales": np.array([1, 1, 2, 1.5], np.float32),
        "in_s": rand(4),
        "in_b": rand(4),
        "shape": np.array([0, -1], np.int64),
    }
    nodes = [
        oh.make_node("Conv", ["x", "w0"], ["mid"]),
        oh.make_node("Pad", ["mid", "pads"], ["padded"], mode="reflect"),
        oh.make_node("Slice", ["padded", "starts", "ends", "axes"], ["sliced"]),
        oh.make_node("Resize", ["sliced", "", "scales"], ["up"], mode="linear"),
        oh.make_node("InstanceNormalization", ["up", "in_s", "in_b"], ["normed"], epsilon=1e-3),
        oh.make_node("Conv", ["normed", "w1"], ["c1"]),
        oh.make_node("Transpose", ["c1"], ["nhwc"], perm=[0, 2, 3, 1]),
        oh.make_node("Reshape", ["c1", "shape"], ["out"]),
    ]
    return _model(nodes, *_io((2, 3, 9, 8), ("out", "mid", "nhwc")), inits, opset=18), {"x": rand(2, 3, 9, 8)}


def bn_training(opset=15):
    """BatchNormalization in training mode (running statistics updated), a Dropout between."""
    inits = {"w": rand(6, 3, 3, 3), "w2": rand(6, 6, 1, 1)}
    mode = {"training_mode": 1} if opset >= 14 else {}
    stats = ["", "rm", "rv"] if opset >= 14 else ["", "rm", "rv", "sm", "sv"]  # five outputs: training
    nodes = [
        oh.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        oh.make_node("BatchNormalization", ["c", *_bn("bn", 6, inits)], ["y", *stats[1:]], **mode),
        oh.make_node("Relu", ["y"], ["r"]),
        oh.make_node("Dropout", ["r"], ["dr"]),
        oh.make_node("Conv", ["dr", "w2"], ["c2"]),
        oh.make_node("BatchNormalization", ["c2", *_bn("bn2", 6, inits)], ["out"], **mode),
    ]
    return _model(nodes, *_io((4, 3, 6, 6)), inits, opset=opset), {"x": rand(4, 3, 6, 6)}


def conv3d():
    """A 3-D chain: NDHWC."""
    inits = {"w": rand(4, 2, 3, 3, 3), "w2": rand(5, 4, 1, 1, 1)}
    nodes = [
        oh.make_node("Conv", ["x", "w"], ["c"], pads=[1] * 6),
        oh.make_node("BatchNormalization", ["c", *_bn("bn", 4, inits)], ["b"]),
        oh.make_node("MaxPool", ["b"], ["p"], kernel_shape=[2, 2, 2], strides=[2, 2, 2]),
        oh.make_node("Conv", ["p", "w2"], ["c2"]),
        oh.make_node("GlobalMaxPool", ["c2"], ["out"]),
    ]
    return _model(nodes, *_io((2, 2, 4, 6, 6)), inits), {"x": rand(2, 2, 4, 6, 6)}


def bottleneck():
    """1x1 convolutions: two with kernels big enough to be read as stored (one strided), one
    small, relaid-out (``conv_ops.kernel_layout_for``)."""
    shapes = {"wa": (512, 8, 1, 1), "wb": (512, 512, 1, 1), "wc": (256, 1024, 1, 1), "wd": (4, 256, 1, 1)}
    inits = {k: rand(*s) / np.float32(np.sqrt(s[1])) for k, s in shapes.items()} | {"bb": rand(512)}
    nodes = [
        oh.make_node("Conv", ["x", "wa"], ["a"]),
        oh.make_node("Relu", ["a"], ["ar"]),
        oh.make_node("Conv", ["ar", "wb", "bb"], ["b"]),
        oh.make_node("Concat", ["b", "ar"], ["cat"], axis=1),
        oh.make_node("Conv", ["cat", "wc"], ["c"], strides=[2, 2]),
        oh.make_node("Relu", ["c"], ["cr"]),
        oh.make_node("Conv", ["cr", "wd"], ["out"]),
    ]
    return _model(nodes, *_io((2, 8, 5, 5)), inits), {"x": rand(2, 8, 5, 5)}


def wide_3x3():
    """3x3 convolutions over 512 channels: a dilated one without strides, its weights laid out
    I(D)HWO and run as tap products on the small map, and a strided one, laid out (D)HWIO."""
    shapes = {"wa": (8, 512, 3, 3), "wb": (8, 512, 3, 3), "wc": (8, 8, 1, 1)}
    inits = {k: rand(*s) / np.float32(np.sqrt(s[1] * s[2] * s[3])) for k, s in shapes.items()} | {"ba": rand(8)}
    nodes = [
        oh.make_node("Conv", ["x", "wa", "ba"], ["a"], pads=[1, 2, 1, 2], dilations=[1, 2]),
        oh.make_node("Relu", ["a"], ["ar"]),
        oh.make_node("Conv", ["x", "wb"], ["b"], pads=[1, 1, 1, 1], strides=[2, 2]),
        oh.make_node("GlobalAveragePool", ["b"], ["gb"]),
        oh.make_node("Conv", ["ar", "wc"], ["c"]),
        oh.make_node("Add", ["c", "gb"], ["out"]),
    ]
    return _model(nodes, *_io((2, 512, 4, 5)), inits), {"x": rand(2, 512, 4, 5)}


def decoder():
    """A U-Net decoder step: a 2x2 stride-2 ConvTranspose, a skip Concat, BatchNorm, ReLU, a 3x3
    Conv, and a grouped, dilated 3x3 stride-2 ConvTranspose with output_padding and a bias."""
    inits = {"up": rand(6, 4, 2, 2), "w": rand(5, 7, 3, 3), "up2": rand(5, 2, 3, 3), "b2": rand(10)}
    nodes = [
        oh.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1]),
        oh.make_node("ConvTranspose", ["c0", "up"], ["u"], strides=[2, 2]),
        oh.make_node("Concat", ["u", "skip"], ["cat"], axis=1),
        oh.make_node("BatchNormalization", ["cat", *_bn("bn", 7, inits)], ["b"]),
        oh.make_node("Relu", ["b"], ["r"]),
        oh.make_node("Conv", ["r", "w"], ["c"], pads=[1, 1, 1, 1]),
        oh.make_node(
            "ConvTranspose",
            ["c", "up2", "b2"],
            ["out"],
            strides=[2, 2],
            dilations=[2, 1],
            pads=[1, 1, 1, 1],
            output_padding=[1, 0],
            group=5,
        ),
    ]
    inits |= {"w0": rand(6, 3, 3, 3), "skip": rand(2, 3, 10, 12)}
    return _model(nodes, *_io((2, 3, 5, 6)), inits), {"x": rand(2, 3, 5, 6)}


def small_cnn_pools():
    """Non-overlapping pools after multiply-add loops (a 3->8 stem with BatchNorm and ReLU, a
    depthwise convolution) and after XLA's convolution, LeNet/MNIST style."""
    inits = {"stem": rand(8, 3, 3, 3), "dw": rand(8, 1, 3, 3), "w": rand(8, 8, 3, 3), "b": rand(8)}
    nodes = [
        oh.make_node("Conv", ["x", "stem"], ["c0"], pads=[1, 1, 1, 1]),
        oh.make_node("BatchNormalization", ["c0", *_bn("bn", 8, inits)], ["b0"]),
        oh.make_node("Relu", ["b0"], ["r0"]),
        oh.make_node("MaxPool", ["r0"], ["p0"], kernel_shape=[2, 2], strides=[2, 2]),
        oh.make_node("Conv", ["p0", "dw"], ["d"], group=8, pads=[1, 1, 1, 1]),
        oh.make_node("AveragePool", ["d"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        oh.make_node("Conv", ["p1", "w", "b"], ["c2"], pads=[1, 1, 1, 1]),
        oh.make_node("Relu", ["c2"], ["r2"]),
        oh.make_node("MaxPool", ["r2"], ["out"], kernel_shape=[2, 2], strides=[2, 2]),
    ]
    return _model(nodes, *_io((3, 3, 16, 16)), inits), {"x": rand(3, 3, 16, 16)}


def _int8_per_channel(w):
    """Symmetric int8 weights, one scale per output channel, as ``quantize_static`` writes them."""
    scale = (np.abs(w).reshape(len(w), -1).max(axis=1) / 127).astype(np.float32)
    return np.round(w / scale.reshape(-1, *(1,) * (w.ndim - 1))).astype(np.int8), scale


def qdq_block(opset=17):
    """A block as onnxruntime's ``quantize_static`` writes it in QDQ form: a QuantizeLinear and
    DequantizeLinear pair on every activation (one per channel from opset 13), int8 weights and
    an int32 bias dequantized per channel (onnxruntime refuses a pair per channel right after a
    Conv, which it fuses into a QLinearConv: that one follows a Concat). The pairs run channels-last with the Convs around
    them, and the Conv kernels' layouts follow from the dequantized weights' shapes.

    Its data are fixed (whatever ran before): a requantization whose float input lies within
    rounding of a tie may round either way in another summation order, and one unit there
    moves the output by more than the comparisons allow; these data have none."""
    rng = np.random.default_rng(opset)

    def rand(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    (w0, s0), (w1, s1) = _int8_per_channel(rand(8, 4, 3, 3)), _int8_per_channel(rand(16, 8, 1, 1))
    x_scale = np.float32(0.03)
    inits = {"w0q": w0, "w0s": s0, "w0z": np.zeros(8, np.int8), "w1q": w1, "w1s": s1, "w1z": np.zeros(16, np.int8)}
    inits |= {"b0q": np.round(rand(8) / (x_scale * s0)).astype(np.int32), "b0s": x_scale * s0}
    inits |= {"xs": x_scale, "xz": np.uint8(128), "as": np.float32(0.05), "az": np.uint8(0)}
    inits |= {"cs": np.float32(0.08), "cz": np.uint8(128)}
    per_channel = opset >= 13
    inits |= {"ss": np.linspace(0.03, 0.09, 24 if per_channel else 1, dtype=np.float32)}
    inits |= {"sz": np.full(24 if per_channel else 1, 128, np.uint8)}
    if not per_channel:
        inits |= {"w0s": np.float32(s0.max()), "w0z": np.int8(0), "w1s": np.float32(s1.max()), "w1z": np.int8(0)}
        inits |= {"b0s": np.float32(x_scale * s0.max())}
    axis = {"axis": 1} if per_channel else {}

    def pair(x, scale, zero, out, **attrs):
        return [
            oh.make_node("QuantizeLinear", [x, scale, zero], [f"{out}_q"], **attrs),
            oh.make_node("DequantizeLinear", [f"{out}_q", scale, zero], [out], **attrs),
        ]

    weights = {"axis": 0} if per_channel else {}
    nodes = [
        *pair("x", "xs", "xz", "xd"),
        oh.make_node("DequantizeLinear", ["w0q", "w0s", "w0z"], ["w0"], **weights),
        oh.make_node("DequantizeLinear", ["b0q", "b0s"], ["b0"], **weights),
        oh.make_node("Conv", ["xd", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]),
        oh.make_node("Relu", ["c0"], ["r0"]),
        *pair("r0", "as", "az", "a"),
        oh.make_node("DequantizeLinear", ["w1q", "w1s", "w1z"], ["w1"], **weights),
        oh.make_node("Conv", ["a", "w1"], ["c1"]),
        *pair("c1", "cs", "cz", "c1d"),
        oh.make_node("Concat", ["c1d", "a"], ["cat"], axis=1),
        *pair("cat", "ss", "sz", "catd", **axis),
        oh.make_node("MaxPool", ["catd"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        oh.make_node("GlobalAveragePool", ["p"], ["g"]),
        oh.make_node("Flatten", ["g"], ["out"]),
    ]
    return _model(nodes, *_io((2, 4, 8, 8)), inits, opset), {"x": rand(2, 4, 8, 8)}


def qoperator_block(group=1):
    """A block as ``quantize_static`` writes it in QOperator form: QLinearConv (weights per
    channel, an int32 bias), onnxruntime's QLinearAdd (a residual), QLinearSigmoid and
    QLinearConcat, uint8 MaxPool, QLinearGlobalAveragePool; the second QLinearConv grouped
    with ``group=2``."""
    rng = np.random.default_rng(group)  # fixed data, as qdq_block's

    def rand(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    (w0, s0), (w1, s1) = _int8_per_channel(rand(8, 4, 3, 3)), _int8_per_channel(rand(8, 8 // group, 1, 1))
    inits = {"xs": np.float32(0.03), "xz": np.uint8(128), "as": np.float32(0.05), "az": np.uint8(10)}
    inits |= {"w0": w0, "s0": s0, "z0": np.zeros(8, np.int8), "b0": rng.integers(-500, 500, 8).astype(np.int32)}
    inits |= {"w1": w1, "s1": s1, "z1": np.zeros(8, np.int8), "cs": np.float32(0.04), "cz": np.uint8(120)}
    inits |= {"ss": np.float32(0.07), "sz": np.uint8(100), "gs": np.float32(0.02), "gz": np.uint8(90)}
    inits |= {"one": np.uint8(130), "sig_s": np.float32(1 / 255), "sig_z": np.uint8(0)}
    ms = {"domain": "com.microsoft"}
    nodes = [
        oh.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
        oh.make_node("QLinearConv", ["xq", "xs", "xz", "w0", "s0", "z0", "as", "az", "b0"], ["a"], pads=[1, 1, 1, 1]),
        oh.make_node("QLinearConv", ["a", "as", "az", "w1", "s1", "z1", "cs", "cz"], ["c"], group=group),
        oh.make_node("QLinearAdd", ["c", "cs", "cz", "a", "as", "az", "ss", "sz"], ["sum"], **ms),
        oh.make_node("QLinearAdd", ["sum", "ss", "sz", "one", "ss", "sz", "ss", "sz"], ["shifted"], **ms),
        oh.make_node("QLinearSigmoid", ["shifted", "ss", "sz", "sig_s", "sig_z"], ["gate"], **ms),
        oh.make_node(
            "QLinearConcat", ["sig_s", "sig_z", "gate", "sig_s", "sig_z", "a", "as", "az"], ["cat"], axis=1, **ms
        ),
        oh.make_node("MaxPool", ["cat"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        oh.make_node("QLinearGlobalAveragePool", ["p", "sig_s", "sig_z", "gs", "gz"], ["g"], **ms),
        oh.make_node("DequantizeLinear", ["g", "gs", "gz"], ["gd"]),
        oh.make_node("Flatten", ["gd"], ["out"]),
    ]
    proto = _model(nodes, *_io((2, 4, 8, 8)), inits)
    proto.opset_import.append(oh.make_opsetid("com.microsoft", 1))
    return proto, {"x": rand(2, 4, 8, 8)}


BUILT = {
    "resnet_block": resnet_block,
    "mobilenet_block": mobilenet_block,
    "inception_block": inception_block,
    "pad_slice_resize": pad_slice_resize,
    "bn_training": bn_training,
    "bn_training_opset9": lambda: bn_training(9),
    "conv3d": conv3d,
    "bottleneck": bottleneck,
    "wide_3x3": wide_3x3,
    "decoder": decoder,
    "small_cnn_pools": small_cnn_pools,
    "qdq_block": qdq_block,
    "qdq_block_opset10": lambda: qdq_block(10),
}
# (graph, how many activation transposes the rewritten graph may hold)
TRANSPOSES = {
    "resnet_block": 2,  # the input, and the pooled features for Flatten
    "mobilenet_block": 2,  # the input (also the residual), the output
    "inception_block": 2,
    "pad_slice_resize": 3,  # the input, mid (a graph output), c1 for the Reshape
    "bn_training": 4,  # the input, Dropout (random: left alone) in and out, the output
    "bn_training_opset9": 4,
    "conv3d": 2,
    "bottleneck": 2,
    "wide_3x3": 2,
    "decoder": 2,  # the input, the output
    "small_cnn_pools": 2,
    "qdq_block": 2,
    "qdq_block_opset10": 2,
}


def _activation_transposes(graph):
    inits = set(graph.initializers)
    weight_only = set(inits)
    count = 0
    for node in graph.nodes:
        if node.inputs and all(i in weight_only for i in node.inputs if i):
            weight_only.update(node.outputs)
        elif node.op_type == "Transpose":
            count += 1
    return count


@pytest.mark.parametrize("name", list(BUILT))
def test_layout_on_equals_off_and_onnxruntime(name, lowering):
    proto, feeds = BUILT[name]()
    on = compare_on_off(proto, feeds, ON)
    graph = on._graph_for(None)
    domains = {n.op_type for n in graph.nodes if n.domain == DOMAIN}
    assert "Conv" in domains
    assert _activation_transposes(graph) <= TRANSPOSES[name], [n.op_type for n in graph.nodes]
    if name == "bn_training":
        return  # onnxruntime refuses BatchNormalization-15 in training mode with one output
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    for got, want in zip(on(**feeds), session.run(None, feeds)):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("group", [1, 2])
def test_qoperator_chains(group, lowering):
    # QLinearConvs run channels-last (8-bit products on CPU, or float32 convolutions: a
    # grouped one, and every one elsewhere), and onnxruntime's quantized element-wise ops and
    # pools between them follow.
    proto, feeds = qoperator_block(group)
    on = compare_on_off(proto, feeds, ON)
    graph = on._graph_for(None)
    internal = [n.op_type for n in graph.nodes if n.domain == DOMAIN]
    assert internal == ["QLinearConv", "QLinearConv", "MaxPool"]
    following = {n.op_type: n for n in graph.nodes if n.domain == "com.microsoft"}
    assert following["QLinearSigmoid"].inputs[0].endswith("channels_last")
    assert following["QLinearConcat"].attrs["axis"] == 3
    assert following["QLinearGlobalAveragePool"].attrs["channels_last"] == 1
    assert _activation_transposes(graph) == 2
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    # Within one unit of the last quantization (onnxruntime's vectorized QLinearAdd may round
    # the other way: docs/performance.md, "Integer convolutions").
    np.testing.assert_allclose(np.asarray(on(**feeds)[0]), session.run(None, feeds)[0], rtol=0, atol=0.0201)


def dynamic_block(group=1):
    """A block as ``quantize_dynamic`` writes it: DynamicQuantizeLinear, ConvInteger of uint8
    weights, Cast, a Mul by the product of the two scales, an Add of the bias reshaped to
    (1, C, 1, 1); the second ConvInteger grouped with ``group=2``."""
    rng = np.random.default_rng(group)  # fixed data, as qdq_block's

    def rand(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    inits = {"w0": rng.integers(0, 256, (8, 4, 3, 3), dtype=np.uint8), "z0": np.uint8(127), "s0": np.float32(0.01)}
    inits |= {"w1": rng.integers(0, 256, (6, 8 // group, 1, 1), dtype=np.uint8), "z1": np.uint8(130)}
    inits |= {"s1": np.float32(0.02), "b0": rand(8), "shape": np.array([1, -1, 1, 1], np.int64)}
    nodes = [
        oh.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
        oh.make_node("ConvInteger", ["xq", "w0", "xz", "z0"], ["i0"], pads=[1, 1, 1, 1]),
        oh.make_node("Cast", ["i0"], ["f0"], to=onnx.TensorProto.FLOAT),
        oh.make_node("Mul", ["xs", "s0"], ["scale0"]),
        oh.make_node("Mul", ["f0", "scale0"], ["y0"]),
        oh.make_node("Reshape", ["b0", "shape"], ["bias0"]),
        oh.make_node("Add", ["y0", "bias0"], ["a0"]),
        oh.make_node("Relu", ["a0"], ["r0"]),
        oh.make_node("DynamicQuantizeLinear", ["r0"], ["rq", "rs", "rz"]),
        oh.make_node("ConvInteger", ["rq", "w1", "rz", "z1"], ["i1"], group=group),
        oh.make_node("Cast", ["i1"], ["f1"], to=onnx.TensorProto.FLOAT),
        oh.make_node("Mul", ["rs", "s1"], ["scale1"]),
        oh.make_node("Mul", ["f1", "scale1"], ["out"]),
    ]
    return _model(nodes, *_io((2, 4, 6, 6)), inits), {"x": rand(2, 4, 6, 6)}


@pytest.mark.parametrize("group", [1, 2])
def test_dynamic_quantization_chains(group, lowering):
    # ConvInteger runs channels-last, and DynamicQuantizeLinear (its range is the whole
    # tensor's in any layout), the scales' products and the reshaped bias follow it.
    proto, feeds = dynamic_block(group)
    on = compare_on_off(proto, feeds, ON)
    graph = on._graph_for(None)
    assert [n.op_type for n in graph.nodes if n.domain == DOMAIN] == ["ConvInteger", "ConvInteger"]
    assert _activation_transposes(graph) == 2  # the quantized input, the output
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(np.asarray(on(**feeds)[0]), session.run(None, feeds)[0], rtol=1e-5, atol=1e-5)


def test_kernel_layouts_the_pass_picks(lowering):
    # Big 1x1 kernels keep their stored bytes: no relayout copy is kept beside them (ResNet-50's
    # first call held 3.2x its weights' bytes with them, 2.5-2.7x without), on CPU as an 11OI
    # view of them; small ones are relaid out (D)HWIO, and k x k ones over 512 channels without
    # strides I(D)HWO, for tap products.
    expected = {
        bottleneck: {"wa/hwio": "HWIO", "wb/hwoi": "HWOI", "wc/hwoi": "HWOI", "wd/hwio": "HWIO"},
        wide_3x3: {"wa/ihwo": "IHWO", "wb/hwio": "HWIO", "wc/hwio": "HWIO"},
    }
    if lowering != "cpu":
        # The tap products are a CPU lowering, and only the CPU's relayouts can be views.
        expected[bottleneck] = {"wa/hwio": "HWIO", "wb": "OIHW", "wc": "OIHW", "wd/hwio": "HWIO"}
        expected[wide_3x3] = {"wa/hwio": "HWIO", "wb/hwio": "HWIO", "wc/hwio": "HWIO"}
    for make, layouts in expected.items():
        proto, feeds = make()
        model = jonnx.load(proto)
        session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
        np.testing.assert_allclose(np.asarray(model(**feeds)[0]), session.run(None, feeds)[0], rtol=1e-4, atol=1e-4)
        convs = {
            n.inputs[1]: n.attrs["kernel_layout"]
            for n in model._call_graph.nodes
            if n.domain == DOMAIN and n.op_type == "Conv"
        }
        assert convs == layouts
        assert sorted(model._prepared) == sorted(k for k, v in layouts.items() if v != "OIHW")
        for name, layout in layouts.items():
            if layout == "HWOI":  # the stored weights' own buffer
                stored = model.params[name.split("/")[0]]
                assert model._prepared[name].unsafe_buffer_pointer() == stored.unsafe_buffer_pointer()


def _dequantized_weights(proto):
    """``proto`` with each Conv's weights stored as int8 and dequantized per channel in the
    graph (a DequantizeLinear named as the float weights were), as a QDQ file holds them."""
    proto = onnx.ModelProto.FromString(proto.SerializeToString())
    graph, convs = proto.graph, {n.input[1] for n in proto.graph.node if n.op_type == "Conv"}
    inits, nodes = [], []
    for init in graph.initializer:
        if init.name not in convs:
            inits.append(init)
            continue
        q, scale = _int8_per_channel(onh.to_array(init))
        inits += [onh.from_array(q, f"{init.name}_q"), onh.from_array(scale, f"{init.name}_s")]
        nodes.append(oh.make_node("DequantizeLinear", [f"{init.name}_q", f"{init.name}_s"], [init.name], axis=0))
    graph.ClearField("initializer")
    graph.initializer.extend(inits)
    nodes += list(graph.node)
    graph.ClearField("node")
    graph.node.extend(nodes)
    return proto


def test_kernel_layouts_of_dequantized_weights(lowering):
    # A QDQ file's Convs read int8 weights through DequantizeLinear nodes: the pass picks the
    # same layouts from their shapes as for float weights (docs/performance.md, "QDQ files").
    for make in (bottleneck, wide_3x3):
        proto, feeds = make()
        quantized = _dequantized_weights(proto)
        layouts = []
        for graph in (proto, quantized):
            model = jonnx.load(graph)
            layouts.append(
                {n.inputs[1]: n.attrs["kernel_layout"] for n in model._call_graph.nodes if n.op_type == "Conv"}
            )
        assert layouts[0] == layouts[1]
        session = ort.InferenceSession(quantized.SerializeToString(), providers=["CPUExecutionProvider"])
        got, want = model(**feeds)[0], session.run(None, feeds)[0]
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4)


def test_kernel_relayouts_on_the_host_equal_the_compiled_ones():
    # The default call's kernel relayouts run once, by numpy on the CPU (no compilation);
    # elsewhere, or for other weight-only nodes, by the compiled graph. Same values, bit for bit.
    for make in (bottleneck, wide_3x3):
        proto, _ = make()
        model = jonnx.load(proto)
        host = model._relayouts_on_host(model.params)
        compiled = model._prepare(model.params)
        if jax.default_backend() != "cpu":
            assert host is None
            continue
        assert sorted(host) == sorted(compiled) == sorted(model._prepared_exports)
        for name, value in compiled.items():
            assert host[name].dtype == value.dtype and host[name].shape == value.shape
            np.testing.assert_array_equal(np.asarray(host[name]), np.asarray(value))


@pytest.mark.parametrize("perm", [None, [1, 0], [0, 0]])
def test_weight_transposes_of_the_graph_run_once(perm):
    # A Transpose of a weight in the graph itself (exporters write them before MatMul) is a
    # weight-only node too, done once; a perm that is not a permutation is the op's error.
    rng = np.random.default_rng(0)
    w = rng.standard_normal((3, 4)).astype(np.float32)
    attrs = {} if perm is None else {"perm": perm}
    graph = oh.make_graph(
        [oh.make_node("Transpose", ["w"], ["wt"], name="t", **attrs), oh.make_node("MatMul", ["x", "wt"], ["y"])],
        "g",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 4])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(w, "w")],
    )
    model = jonnx.load(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)]))
    assert [model._call_graph.nodes[p].name for p in model._prepared_nodes] == ["t"]
    x = rng.standard_normal((2, 4)).astype(np.float32)
    if perm == [0, 0]:
        with pytest.raises(jonnx.errors.NodeError, match="node 't'.*not a permutation"):
            model(x)
        return
    np.testing.assert_allclose(np.asarray(model(x)[0]), x @ w.T, rtol=1e-5, atol=1e-6)


def test_kernel_layout_choice():
    cpu = jax.default_backend() == "cpu"
    assert conv_ops.kernel_layout_for((512, 512, 3, 3), 1, (1, 1)) == ("IHWO" if cpu else "HWIO")
    assert conv_ops.kernel_layout_for((64, 64, 3, 3), 1, (1, 1)) == "HWIO"  # XLA's convolution is faster
    assert conv_ops.kernel_layout_for((64, 512, 3, 3, 3), 1, (1, 1, 1)) == "HWIO"  # 27 taps: not measured
    assert conv_ops.kernel_layout_for((512, 512, 5, 5), 1, (1, 1)) == "HWIO"
    assert conv_ops.kernel_layout_for((512, 512, 3, 3), 1, (2, 2)) == "HWIO"  # strided: XLA's convolution
    assert conv_ops.kernel_layout_for((512, 256, 3, 3), 1, (1, 1)) == "HWIO"  # XLA's convolution is fine there
    assert conv_ops.kernel_layout_for((128, 128, 3, 3), 1, (1, 1)) == "HWIO"
    assert conv_ops.kernel_layout_for((1024, 512, 3, 3), 2, (1, 1)) == "HWIO"
    assert conv_ops.kernel_layout_for((2048, 512, 1, 1), 1, (1, 1)) == ("HWOI" if cpu else "OIHW")
    assert conv_ops.kernel_layout_for((512, 16, 1, 1), 1, (1, 1)) == "HWIO"  # channel_taps reads (D)HWIO
    assert conv_ops.kernel_layout_for((64, 64, 1, 1), 1, (2, 2)) == "HWIO"  # too small to matter


def test_every_op_of_the_chains_runs_channels_last():
    rewritten = set()
    for make in BUILT.values():
        proto, _ = make()
        graph = jonnx.load(proto, optimize=ON)._graph_for(None)
        rewritten |= {n.op_type for n in graph.nodes if n.domain == DOMAIN}
        rewritten |= {n.op_type for n in graph.nodes if n.domain == "" and n.inputs and "channels_last" in n.inputs[0]}
    for op in (
        "Conv",
        "ConvTranspose",
        "BatchNormalization",
        "InstanceNormalization",
        "MaxPool",
        "AveragePool",
        "GlobalAveragePool",
        "GlobalMaxPool",
        "Pad",
        "Slice",
        "Resize",
        "Concat",
        "Clip",
        "Add",
        "Mul",
        "HardSwish",
    ):
        assert op in rewritten, op


def test_maxpool_indices_stay_channels_first():
    inits = {"w": rand(3, 2, 3, 3)}
    nodes = [
        oh.make_node("Conv", ["x", "w"], ["c"]),
        oh.make_node("MaxPool", ["c"], ["out", "idx"], kernel_shape=[2, 2]),
    ]
    proto = _model(nodes, *_io((1, 2, 6, 6), ("out", "idx")), inits)
    feeds = {"x": rand(1, 2, 6, 6)}
    on = compare_on_off(proto, feeds, ON)
    assert [n.op_type for n in on._graph_for(None).nodes if n.domain == DOMAIN] == ["Conv"]


def test_blocked_quantization_stays_channels_first():
    # Blocked scales have the input's own NC(D)HW shape: such a pair is read through a
    # Transpose back, while the per-tensor pair before it runs channels-last.
    inits = {"w": rand(4, 2, 3, 3), "s": np.float32(0.05), "z": np.uint8(128)}
    inits |= {"bs": np.abs(rand(1, 2, 4, 4)) / 10 + np.float32(0.01), "bz": np.full((1, 2, 4, 4), 120, np.uint8)}
    nodes = [
        oh.make_node("Conv", ["x", "w"], ["c"]),
        oh.make_node("QuantizeLinear", ["c", "s", "z"], ["q"]),
        oh.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]),
        oh.make_node("QuantizeLinear", ["d", "bs", "bz"], ["bq"], axis=1, block_size=2),
        oh.make_node("DequantizeLinear", ["bq", "bs", "bz"], ["out"], axis=1, block_size=2),
    ]
    proto = _model(nodes, *_io((1, 2, 6, 6)), inits, opset=21)
    on = compare_on_off(proto, {"x": rand(1, 2, 6, 6)}, ON)
    graph = on._graph_for(None)
    quantizers = [(n.op_type, n.inputs[0]) for n in graph.nodes if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    assert quantizers == [("QuantizeLinear", "c/channels_last"), ("DequantizeLinear", "q/channels_last")] + [
        ("QuantizeLinear", "d"),
        ("DequantizeLinear", "bq"),
    ]


@pytest.mark.parametrize(
    "path,feeds",
    [
        (MODELS / "small_cnn.onnx", {"image": rand(2, 3, 16, 16)}),
        (EXPORTS / "resnet_eval.onnx", None),
        (EXPORTS / "keras2_cnn_bn.onnx", None),
    ],
)
def test_bundled_models(path, feeds, lowering):
    proto = onnx.load(path)
    if feeds is None:
        model = jonnx.load(proto)
        feeds = {}
        for v in model.graph.inputs:
            shape = [2 if not isinstance(d, int) else d for d in v.shape]
            feeds[v.name] = rand(*shape)
    on = compare_on_off(proto, feeds, ON)
    assert any(n.domain == DOMAIN for n in on._graph_for(None).nodes)


def test_save_writes_the_original_graph(tmp_path):
    proto, feeds = resnet_block()
    model = jonnx.load(proto)
    model(**feeds)  # the run graph is made
    assert any(n.domain == DOMAIN for n in model._call_graph.nodes)
    jonnx.save(model, tmp_path / "m.onnx")
    saved = onnx.load(tmp_path / "m.onnx")
    assert [n.op_type for n in saved.graph.node] == [n.op_type for n in proto.graph.node]
    assert {o.domain for o in saved.opset_import} == {""}
    assert all(n.domain == "" for n in saved.graph.node)


# --------------------------------------------------------------------------- the internal ops


def _first(y):
    return np.moveaxis(np.asarray(y), -1, 1)


@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: f"{c[0]}-{'x'.join(map(str, c[2]))}")
def test_channels_last_conv_lowerings(case):
    lowering, xs, ws, attrs = case
    strides = tuple(attrs.get("strides", [1] * (len(xs) - 2)))
    x, w, b = rand(*xs), rand(*ws), rand(ws[0])
    x_last, w_last = np.moveaxis(x, 1, -1), np.moveaxis(w, (0, 1), (-1, -2))
    chosen = conv_ops.conv_lowering(
        x_last.shape, w_last.shape, strides, attrs.get("group", 1), np.dtype(np.float32), channels_last=True
    )
    taps = int(np.prod(ws[2:]))
    if lowering == "matmul" and xs[1] <= 16:
        lowering = "channel_taps"  # channels-last 1x1 over few channels: broadcast multiply-adds
    elif lowering != "matmul" and attrs.get("group", 1) == 1 and xs[1] <= 3:
        # Channels-last image stems: broadcast multiply-adds up to 75 taps x channels, else XLA;
        # one product over the windows where they tile the image (a small patch stem).
        patch = strides == tuple(ws[2:]) and "dilations" not in attrs
        lowering = ("patches" if patch else "channel_taps") if xs[1] * taps <= 75 else "xla"
    assert chosen == (lowering if jax.default_backend() == "cpu" else "xla")
    got = jonnx.ops.call("Conv", x_last, w_last, b, domain=DOMAIN, **attrs)
    want = conv_reference({"x": x, "w": w, "b": b}, **attrs)[0]
    np.testing.assert_allclose(_first(got), want, rtol=1e-4, atol=1e-4)

    # Finite differences in float64 (the lowering is chosen the same way): float32's are too
    # coarse for a tight check, and a loose one failed on unlucky draws.
    with jax.enable_x64(True):
        b64 = b.astype(np.float64)

        @jax.jit  # eagerly, each piece of the lowering and its derivative compiles on its own
        def conv(x_last, w_last):
            return jonnx.ops.call("Conv", x_last, w_last, b64, domain=DOMAIN, **attrs)

        args = (x_last.astype(np.float64), w_last.astype(np.float64))
        jax.test_util.check_grads(conv, args, order=1, modes=("rev",), atol=1e-6, rtol=1e-6)


def _laid_out(w, layout):
    """OI(D)HW weights in ``layout``."""
    nd = w.ndim - 2
    spatial = tuple(range(2, nd + 2))
    perm = {"OIHW": range(nd + 2), "HWIO": (*spatial, 1, 0), "HWOI": (*spatial, 0, 1), "IHWO": (1, *spatial, 0)}[layout]
    return np.ascontiguousarray(np.transpose(w, tuple(perm)))


# (kernel_layout, x shape, w shape, attrs, the lowering picked on CPU)
LAYOUT_CASES = [
    ("OIHW", (2, 20, 5, 6), (7, 20, 1, 1), {"strides": [2, 1], "pads": [1, 0, 0, 1]}, "matmul"),
    ("OIHW", (2, 6, 5, 6), (5, 6, 1, 1), {"strides": [2, 1], "pads": [1, 0, 0, 1]}, "channel_taps"),
    ("HWOI", (2, 20, 5, 6), (7, 20, 1, 1), {"strides": [2, 1], "pads": [1, 0, 0, 1]}, "matmul"),
    ("HWOI", (1, 24, 4, 3, 5), (9, 24, 1, 1, 1), {"strides": [1, 2, 1]}, "matmul"),
    ("IHWO", (2, 6, 20, 20), (5, 6, 3, 3), {"pads": [1, 1, 1, 1]}, "tap_products"),  # 800 output cells
    ("IHWO", (1, 5, 30, 31), (4, 5, 3, 2), {"pads": [2, 0, 1, 1], "dilations": [2, 3]}, "tap_products"),
    ("IHWO", (1, 3, 10, 9, 9), (2, 3, 2, 3, 2), {"auto_pad": "SAME_UPPER"}, "tap_products"),
    ("IHWO", (2, 6, 5, 6), (5, 6, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}, "im2col"),
    ("IHWO", (2, 6, 15, 14), (5, 6, 3, 3), {"pads": [1, 1, 1, 1]}, "xla"),  # 420 output cells, few channels
    ("IHWO", (1, 512, 8, 8), (4, 512, 3, 3), {"pads": [1, 1, 1, 1]}, "tap_products"),  # 64 cells, many channels
    ("HWIO", (2, 6, 3, 4), (5, 6, 3, 3), {"pads": [1, 1, 1, 1]}, "im2col"),
]


@pytest.mark.parametrize("lowering", ["auto", "xla"])
@pytest.mark.parametrize("case", LAYOUT_CASES, ids=lambda c: f"{c[0]}-{c[4]}-{'x'.join(map(str, c[2]))}")
def test_channels_last_conv_kernel_layouts(case, lowering, monkeypatch):
    # N(D)HWC activations, weights in each kernel layout: each lowering reads the layouts it
    # can as they are (the others are relaid out), XLA's convolution reads any.
    monkeypatch.setattr(conv_ops, "CONV_LOWERING", lowering)
    layout, xs, ws, attrs, expected = case
    x, w, b = rand(*xs), rand(*ws), rand(ws[0])
    x_last, w_laid = np.moveaxis(x, 1, -1), _laid_out(w, layout)
    hwio = (*ws[2:], ws[1], ws[0])
    strides = tuple(attrs.get("strides", [1] * (len(xs) - 2)))
    chosen = conv_ops.conv_lowering(
        x_last.shape, hwio, strides, 1, np.dtype(np.float32), channels_last=True, kernel_layout=layout
    )
    assert chosen == (expected if lowering == "auto" and jax.default_backend() == "cpu" else "xla")
    attrs = {**attrs, "kernel_layout": layout}
    got = jonnx.ops.call("Conv", x_last, w_laid, b, domain=DOMAIN, **attrs)
    want = conv_reference({"x": x, "w": w, "b": b}, **{k: v for k, v in attrs.items() if k != "kernel_layout"})[0]
    np.testing.assert_allclose(_first(got), want, rtol=1e-4, atol=1e-4)
    with jax.enable_x64(True):

        @jax.jit  # eagerly, each piece of the lowering and its derivative compiles on its own
        def conv(x_last, w_laid):
            return jonnx.ops.call("Conv", x_last, w_laid, b.astype(np.float64), domain=DOMAIN, **attrs)

        args = (x_last.astype(np.float64), w_laid.astype(np.float64))
        jax.test_util.check_grads(conv, args, order=1, modes=("rev",), atol=1e-6, rtol=1e-6)


def test_unknown_kernel_layout_is_an_error():
    with pytest.raises(Exception, match="kernel_layout 'OHWI' is not one of HWIO, OIHW, HWOI, IHWO"):
        jonnx.ops.call("Conv", rand(1, 4, 4, 2), rand(3, 3, 2, 2), rand(2), domain=DOMAIN, kernel_layout="OHWI")


POOLS = [
    ("MaxPool", (2, 3, 7, 8), {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 1], "ceil_mode": 1}),
    ("MaxPool", (1, 2, 9, 9), {"kernel_shape": [2, 2], "dilations": [2, 2]}),
    ("MaxPool", (1, 2, 5, 6, 4), {"kernel_shape": [2, 3, 2], "pads": [0, 1, 1, 1, 1, 0]}),
    ("AveragePool", (2, 3, 7, 8), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1}),
    ("AveragePool", (1, 2, 6, 6), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
    ("GlobalAveragePool", (2, 3, 4, 5), {}),
    ("GlobalAveragePool", (1, 5, 28, 30), {}),  # one image, 840 cells: a product on CPU
    ("GlobalAveragePool", (1, 2, 10, 10, 9), {}),
    ("GlobalMaxPool", (2, 3, 4, 5, 2), {}),
]


@pytest.mark.parametrize("case", POOLS, ids=lambda c: f"{c[0]}-{len(c[1])}d")
def test_channels_last_pools(case):
    op, xs, attrs = case
    x = rand(*xs)
    got = jonnx.ops.call(op, np.moveaxis(x, 1, -1), domain=DOMAIN, **attrs)
    # onnxruntime: the ReferenceEvaluator's 3-D pooling indexes out of bounds.
    node = oh.make_node(op, ["x"], ["y"], **attrs)
    proto = _model([node], [oh.make_tensor_value_info("x", F, xs)], [oh.make_tensor_value_info("y", F, None)], {})
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(_first(got), session.run(None, {"x": x})[0], rtol=1e-5, atol=1e-5)


def test_pools_after_tap_loops_read_whole_windows(lowering):
    # A pool reading a stem's or a depthwise convolution's multiply-add loop through strided
    # slices takes that loop into its own, which XLA CPU vectorizes poorly (MNIST-size stem at
    # batch 64: 1.15 against 0.35 ms): the pass marks it, and it keeps the reduce-window. After
    # XLA's own convolution the slices stay. (Values: test_layout_on_equals_off_and_onnxruntime.)
    proto, feeds = small_cnn_pools()
    model = jonnx.load(proto)
    pools = [n for n in model._call_graph.nodes if n.domain == DOMAIN and n.op_type.endswith("Pool")]
    after_loop = lowering == "cpu"  # elsewhere every Conv is XLA's
    assert [(n.op_type, n.attrs["after_tap_loop"]) for n in pools] == [
        ("MaxPool", int(after_loop)),
        ("AveragePool", int(after_loop)),
        ("MaxPool", 0),
    ]

    def pooled(op, after_tap_loop):
        x = np.moveaxis(rand(2, 8, 16, 16), 1, -1)
        window = {"kernel_shape": [2, 2], "strides": [2, 2], "after_tap_loop": after_tap_loop}
        return str(jax.make_jaxpr(lambda x: jonnx.ops.call(op, x, domain=DOMAIN, **window))(x))

    for op in ("MaxPool", "AveragePool"):
        assert "reduce_window" in pooled(op, 1)
        assert ("reduce_window" in pooled(op, 0)) == (lowering != "cpu")


def test_one_image_global_average_pool_is_a_product():
    """One image's mean over a large map is a product with a row of 1/cells on CPU (the
    values: test_channels_last_pools); batches and small maps stay a reduction."""

    def lowered(shape):
        x = np.moveaxis(rand(*shape), 1, -1)
        return str(jax.make_jaxpr(lambda x: jonnx.ops.call("GlobalAveragePool", x, domain=DOMAIN))(x))

    assert "dot_general" in lowered((1, 5, 28, 30))
    assert "dot_general" not in lowered((2, 5, 28, 30))
    assert "dot_general" not in lowered((1, 5, 7, 7))


def test_on_by_default_in_the_default_call_only():
    # Model(*inputs) computes the weight relayouts once; apply (a training step, the user's own
    # jit) would redo them on every call, so there the pass runs only when named.
    proto, _ = resnet_block()
    model = jonnx.load(proto)
    assert model.optimize["channels_last"] is True
    assert any(n.domain == DOMAIN for n in model._call_graph.nodes)
    for train in (None, False, True):
        assert not any(n.domain == DOMAIN for n in model._graph_for(train).nodes)
        assert any(n.domain == DOMAIN for n in jonnx.load(proto, optimize=ON)._graph_for(train).nodes)
    assert not any(n.domain == DOMAIN for n in jonnx.load(proto, optimize=False)._call_graph.nodes)


@pytest.mark.parametrize("legacy", [0, 1])
def test_channels_last_batchnorm_training_against_numpy(legacy):
    x, s, b, m = rand(4, 5, 3, 2), rand(2), rand(2), rand(2)
    v = np.abs(rand(2)) + 0.5
    got = jonnx.ops.call(
        "BatchNormalization", x, s, b, m, v, domain=DOMAIN, train=True, epsilon=1e-3, momentum=0.8, legacy=legacy
    )
    mean, var = x.mean(axis=(0, 1, 2)), x.var(axis=(0, 1, 2))
    want_y = (x - mean) / np.sqrt(var + 1e-3) * s + b
    np.testing.assert_allclose(np.asarray(got[0]), want_y, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(got[1]), m * 0.8 + mean * 0.2, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(got[2]), v * 0.8 + var * 0.2, rtol=1e-5, atol=1e-6)
    assert len(got) == (5 if legacy else 3)

"""The quantized_convs pass (jonnx/optimize/quantized_convs.py): a QDQ file's Conv of
dequantized values as one exact 8-bit product, results unchanged up to float rounding.

Each graph runs with the pass alone, with every pass, and with none (outputs and gradients with
respect to the scales and biases: ``tests._on_off.compare_on_off``), and against onnxruntime;
each test checks which convolutions the pass rewrote and which it left, so none passes
vacuously. The CPU's 8-bit product kind is forced (``INTEGER_MATMUL``), so the rewrite is
checked on every machine, whatever its instructions.
"""

from __future__ import annotations

import pathlib

import numpy as np
import onnx
import onnx.helper as oh
import onnxruntime as ort
import pytest
from onnx.reference import ReferenceEvaluator

import jonnx
import jonnx.ops
from jonnx.ops import quantize
from tests._on_off import compare_on_off
from tests.test_layout import _activation_transposes, qdq_block
from tests.test_optimize import _model

F = onnx.TensorProto.FLOAT
ONLY = {"quantized_convs": True, "channels_last": False, "dead_nodes": False}
CONTRIB = pathlib.Path(__file__).resolve().parent / "models" / "contrib"
RNG = np.random.default_rng(0)  # reseeded per test (tests/conftest.py): data independent of test order


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.fixture(params=["bfloat16", "int8"])
def product(request, monkeypatch):
    """The CPU's 8-bit product, as ``integer_matmul_mode`` would pick it on a CPU with
    bfloat16 dot instructions, or with AMX's int8 tiles."""
    monkeypatch.setattr(quantize, "INTEGER_MATMUL", request.param)
    return request.param


def _int8_per_channel(w):
    scale = (np.abs(w).reshape(len(w), -1).max(axis=1) / 127).astype(np.float32)
    return np.round(w / scale.reshape(-1, *(1,) * (w.ndim - 1))).astype(np.int8), scale


def qdq_convs():
    """Convolutions of dequantized values as quantize_static writes them, and ones the pass
    must leave: a grouped one, one of float weights, one of a per-channel activation. Their
    float outputs are the graph's, so the comparisons see no requantization's rounding."""
    (w1, s1), (w3, s3) = _int8_per_channel(rand(8, 4, 3, 3)), _int8_per_channel(rand(6, 2, 3, 3))
    (w4, s4), (w5, s5) = _int8_per_channel(rand(5, 4, 1, 1)), _int8_per_channel(rand(3, 4, 2))
    x_scale = np.float32(0.03)
    inits = {"xs": x_scale, "xz": np.uint8(128), "ks": np.float32(0.02), "kz": np.int8(-3)}
    inits |= {"w1q": w1, "w1s": s1, "w1z": np.zeros(8, np.int8), "b1": rand(8)}
    # uint8 weights with one scale and a zero point; an int32 bias dequantized as ORT writes it.
    inits |= {"w2q": np.random.default_rng(2).integers(0, 256, (4, 4, 2, 2), dtype=np.uint8)}
    inits |= {"w2s": np.float32(0.01), "w2z": np.uint8(120), "b2q": np.arange(-2, 2, dtype=np.int32) * 37}
    inits |= {"b2s": np.float32(x_scale * 0.01)}
    inits |= {"w3q": w3, "w3s": s3, "w3z": np.zeros(6, np.int8)}
    inits |= {"w4q": w4, "w4s": s4, "w4z": np.zeros(5, np.int8), "wf": rand(2, 4, 1, 1)}
    inits |= {"w5q": w5, "w5s": s5, "w5z": np.zeros(3, np.int8)}
    inits |= {"cs": np.linspace(0.02, 0.05, 4, dtype=np.float32), "cz": np.full(4, 100, np.uint8)}

    def dq(name, **attrs):
        return oh.make_node("DequantizeLinear", [f"{name}q", f"{name}s", f"{name}z"], [name], **attrs)

    nodes = [
        oh.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
        oh.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
        oh.make_node("QuantizeLinear", ["x", "ks", "kz"], ["kq"]),  # int8 activations
        oh.make_node("DequantizeLinear", ["kq", "ks", "kz"], ["kd"]),
        oh.make_node("QuantizeLinear", ["x", "cs", "cz"], ["cq"], axis=1),  # per channel
        oh.make_node("DequantizeLinear", ["cq", "cs", "cz"], ["cd"], axis=1),
        dq("w1", axis=0),
        dq("w2"),
        oh.make_node("DequantizeLinear", ["b2q", "b2s"], ["b2"]),
        dq("w3", axis=0),
        dq("w4", axis=0),
        dq("w5", axis=0),
        oh.make_node("Conv", ["xd", "w1", "b1"], ["y1"], name="padded", pads=[1, 1, 1, 1]),
        oh.make_node("Conv", ["xd", "w2", "b2"], ["y2"], name="strided", strides=[2, 2], dilations=[1, 2]),
        oh.make_node("Conv", ["xd", "w3"], ["y3"], name="grouped", group=2),
        oh.make_node("Conv", ["kd", "w4"], ["y4"], name="int8_input", auto_pad="SAME_UPPER"),
        oh.make_node("Conv", ["xd", "wf"], ["y5"], name="float_weights"),
        oh.make_node("Conv", ["cd", "w4"], ["y6"], name="per_channel_input"),
        oh.make_node("Reshape", ["kq", "rows"], ["k1q"]),
        oh.make_node("DequantizeLinear", ["k1q", "ks", "kz"], ["k1d"]),
        oh.make_node("Conv", ["k1d", "w5"], ["y7"], name="one_d", pads=[0, 1]),
    ]
    inits["rows"] = np.array([0, 4, -1], np.int64)
    outputs = [oh.make_tensor_value_info(f"y{i}", F, None) for i in range(1, 8)]
    proto = _model(nodes, [oh.make_tensor_value_info("x", F, ["N", 4, 6, 6])], outputs, inits)
    return proto, {"x": rand(2, 4, 6, 6)}


REWRITTEN = {"padded", "strided", "int8_input", "one_d"}


def _rewritten(model) -> set[str]:
    return {n.name for n in model._graph_for(None).nodes if n.domain == quantize.DEQUANTIZED_DOMAIN}


@pytest.mark.parametrize("switches", [ONLY, True], ids=["alone", "all passes"])
def test_rewritten_convolutions_equal_the_graph_and_onnxruntime(product, switches):
    proto, feeds = qdq_convs()
    # The scales' gradients sum thousands of products of both signs to a few units: the
    # integer sum and the float32 convolution round them apart by up to 3e-4 of their value.
    model = compare_on_off(proto, feeds, switches, grad_tol=1e-3)
    assert _rewritten(model) == REWRITTEN
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    for got, want in zip(model(**feeds), session.run(None, feeds)):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


def test_exact_where_float32_is_not(product):
    # Sums float32 cannot hold: 8-bit values whose products add up past 2**24. The float
    # convolution of the dequantized values rounds as it adds; the rewritten one is the integer
    # sum times the scales (one rounding), as onnxruntime's integer kernel computes it.
    rng = np.random.default_rng(5)
    w = rng.integers(100, 128, (4, 300, 3, 3), dtype=np.int8)
    x = rng.integers(200, 256, (1, 300, 5, 5), dtype=np.uint8)
    inits = {"xs": np.float32(1.0), "xz": np.uint8(0), "wq": w, "ws": np.float32(1.0), "wz": np.int8(0)}
    nodes = [
        oh.make_node("DequantizeLinear", ["x", "xs", "xz"], ["xd"]),
        oh.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"]),
        oh.make_node("Conv", ["xd", "wd"], ["y"]),
    ]
    x_info = oh.make_tensor_value_info("x", onnx.TensorProto.UINT8, [1, 300, 5, 5])
    proto = _model(nodes, [x_info], [oh.make_tensor_value_info("y", F, None)], inits)
    windows = np.lib.stride_tricks.sliding_window_view(x[0].astype(np.int64), (3, 3), axis=(1, 2))
    exact = np.einsum("chwij,mcij->mhw", windows, w.astype(np.int64))[None]
    assert exact.min() > 2**24
    np.testing.assert_array_equal(np.asarray(jonnx.load(proto)(x)[0]), exact.astype(np.float32))


def test_left_as_written_where_no_8_bit_product_pays(lowering, monkeypatch):
    # Off the CPU (XLA's convolutions there, which integer_conv would run twice), and on a CPU
    # where the product would be in float32 anyway, the graph keeps its float convolutions.
    proto, feeds = qdq_convs()
    if lowering == "cpu":
        monkeypatch.setattr(quantize, "INTEGER_MATMUL", "float32")
    model = compare_on_off(proto, feeds, ONLY, trains=(None,))
    assert not _rewritten(model)


def test_a_quantize_static_file(product):
    # tests/models/contrib/make_contrib_models.py: a residual CNN through onnxruntime's
    # quantize_static in QDQ form: every Conv is rewritten, and the outputs equal
    # onnxruntime's (test_contrib_models compares the default call too).
    proto = onnx.load(CONTRIB / "cnn_static_qdq.onnx")
    convs = {n.name for n in proto.graph.node if n.op_type == "Conv"}
    dims = [d.dim_value or 2 for d in proto.graph.input[0].type.tensor_type.shape.dim]
    x = np.random.default_rng(0).standard_normal(dims).astype(np.float32)
    on, off = jonnx.load(proto), jonnx.load(proto, optimize={"quantized_convs": False})
    assert _rewritten(on) == convs and len(convs) >= 3 and not _rewritten(off)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, {proto.graph.input[0].name: x})[0]
    np.testing.assert_allclose(np.asarray(on(x)[0]), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("group", [1, 2])
@pytest.mark.parametrize("channels_last", [0, 1])
def test_the_internal_conv(product, group, channels_last, lowering):
    # The op itself, in both layouts: the product (ungrouped, on CPU) and the float32 halves
    # (grouped, or off the CPU), against the reference evaluator's float convolution of the
    # dequantized values.
    rng = np.random.default_rng(group)
    xq = rng.integers(0, 256, (2, 4, 5, 6), dtype=np.uint8)
    wq, w_scale = _int8_per_channel(rng.standard_normal((6, 4 // group, 3, 3)).astype(np.float32))
    terms = {"xs": np.float32(0.1), "xz": np.uint8(7), "ws": w_scale, "wz": np.zeros(6, np.int8), "b": rand(6)}
    attrs = {"group": group, "pads": [1, 0, 1, 2], "strides": [1, 2]}
    nodes = [
        oh.make_node("DequantizeLinear", ["x", "xs", "xz"], ["xd"]),
        oh.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], axis=0),
        oh.make_node("Conv", ["xd", "wd", "b"], ["y"], **attrs),
    ]
    x_info = oh.make_tensor_value_info("x", onnx.TensorProto.UINT8, list(xq.shape))
    proto = _model(nodes, [x_info], [oh.make_tensor_value_info("y", F, None)], {**terms, "wq": wq}, opset=21)
    want = ReferenceEvaluator(proto).run(None, {"x": xq})[0]
    x = np.moveaxis(xq, 1, -1) if channels_last else xq
    got = jonnx.ops.call(
        "Conv",
        x,
        *(terms[k] for k in ("xs", "xz")),
        wq,
        *(terms[k] for k in ("ws", "wz", "b")),
        domain=quantize.DEQUANTIZED_DOMAIN,
        opset=1,
        channels_last=channels_last,
        **attrs,
    )
    got = np.moveaxis(np.asarray(got), -1, 1) if channels_last else np.asarray(got)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_chains_run_channels_last(product):
    # With the layout pass, the rewritten convolutions read and write N(D)HWC, as float ones
    # do, and the QuantizeLinear/DequantizeLinear pairs between them follow: the activations
    # are transposed only at the graph's input and output.
    proto, feeds = qdq_block()  # fixed data: see its docstring
    model = compare_on_off(proto, feeds, {"quantized_convs": True, "channels_last": True})
    graph = model._graph_for(None)
    convs = [n for n in graph.nodes if n.op_type == "Conv"]
    assert len(convs) == 2 and all(n.domain == quantize.DEQUANTIZED_DOMAIN and n.attrs["channels_last"] for n in convs)
    assert _activation_transposes(graph) <= 2, [n.op_type for n in graph.nodes]
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(np.asarray(model(**feeds)[0]), session.run(None, feeds)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("group", [1, 2])
@pytest.mark.parametrize("channels_last", [0, 1])
def test_the_internal_conv_over_deep_windows(group, channels_last, lowering):
    # 464 channels of 3x3 per group: the float32 halves split each group's channels in two
    # parts (channels-last too), the product contracts 4,176 values in chunks. Small values,
    # so that the float output holds the integer sums exactly; against numpy's int64 sums.
    rng = np.random.default_rng(group)
    xq = rng.integers(125, 132, (1, 464 * group, 4, 4), dtype=np.uint8)
    wq = rng.integers(-3, 4, (2 * group, 464, 3, 3), dtype=np.int8)
    windows = np.lib.stride_tricks.sliding_window_view(xq[0].astype(np.int64) - 128, (3, 3), axis=(1, 2))
    windows = windows.reshape(group, 464, 2, 2, 3, 3)
    w = wq.astype(np.int64).reshape(group, 2, 464, 3, 3)
    want = np.einsum("gchwij,gocij->gohw", windows, w).reshape(1, 2 * group, 2, 2)
    x = np.moveaxis(xq, 1, -1) if channels_last else xq
    one = np.float32(1)
    got = jonnx.ops.call(
        "Conv",
        x,
        one,
        np.uint8(128),
        wq,
        one,
        np.int8(0),
        None,
        domain=quantize.DEQUANTIZED_DOMAIN,
        opset=1,
        channels_last=channels_last,
        group=group,
    )
    got = np.moveaxis(np.asarray(got), -1, 1) if channels_last else np.asarray(got)
    np.testing.assert_array_equal(got, want.astype(np.float32))

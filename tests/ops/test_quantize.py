"""Quantization ops against the ReferenceEvaluator, over opsets, granularities and types."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP

import jonnx
from jonnx import errors
from jonnx.ops import quantize
from tests.ops._harness import assert_matches_reference, check_op_grads, node_model, run_jonnx

RNG = np.random.default_rng(0)


def _dequantize(axis=1):
    """numpy DequantizeLinear: the ReferenceEvaluator has no DequantizeLinear before opset 19."""

    def run(q, s, zp=None):
        shape = [1] * q.ndim
        if np.ndim(s) == 1:
            shape[axis] = -1
        s = np.reshape(s, shape if np.ndim(s) else ())
        zp = 0 if zp is None else np.reshape(zp, shape if np.ndim(zp) else ()).astype(np.float32)
        return [((q.astype(np.float32) - zp) * s).astype(s.dtype)]

    return run


def _x(shape=(3, 4), scale=20.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


@pytest.mark.parametrize("opset", [10, 13, 19, 21, 25])
@pytest.mark.parametrize("zp_dtype", [np.uint8, np.int8])
def test_quantize_per_tensor(opset, zp_dtype):
    x = _x()
    zp = np.array(3 if zp_dtype == np.int8 else 128, zp_dtype)
    assert_matches_reference("QuantizeLinear", {"x": x, "s": np.float32(0.25), "zp": zp}, opset=opset)
    assert_matches_reference(
        "DequantizeLinear",
        {"q": x.astype(zp_dtype), "s": np.float32(0.25), "zp": zp},
        opset=opset,
        expected=None if opset >= 19 else _dequantize(),
    )


def test_quantize_rounds_half_to_even_and_saturates():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 300.0, -300.0, 127.5], np.float32)
    want = np.clip(np.rint(x), -128, 127).astype(np.int8)
    assert_matches_reference(
        "QuantizeLinear", {"x": x, "s": np.float32(1), "zp": np.int8(0)}, opset=13, expected=[want]
    )


def test_quantize_without_zero_point_is_uint8():
    x = np.abs(_x())
    out = assert_matches_reference("QuantizeLinear", {"x": x, "s": np.float32(0.5)}, opset=13)
    assert out[0].dtype == np.uint8


@pytest.mark.parametrize("opset", [13, 21])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_per_axis(opset, axis):
    x = _x((3, 4, 5))
    n = x.shape[axis]
    s = RNG.uniform(0.1, 1.0, n).astype(np.float32)
    zp = RNG.integers(-10, 10, n).astype(np.int8)
    assert_matches_reference("QuantizeLinear", {"x": x, "s": s, "zp": zp}, opset=opset, axis=axis)
    q = RNG.integers(-128, 127, x.shape).astype(np.int8)
    assert_matches_reference(
        "DequantizeLinear",
        {"q": q, "s": s, "zp": zp},
        opset=opset,
        axis=axis,
        expected=None if opset >= 19 else _dequantize(axis),
    )


@pytest.mark.parametrize("block_size,axis", [(2, 1), (3, 1), (4, 0)])
def test_blocked(block_size, axis):
    x = _x((4, 6))
    sshape = tuple(-(-d // block_size) if i == axis else d for i, d in enumerate(x.shape))
    s = RNG.uniform(0.1, 1.0, sshape).astype(np.float32)
    zp = RNG.integers(0, 20, sshape).astype(np.uint8)
    assert_matches_reference("QuantizeLinear", {"x": x, "s": s, "zp": zp}, opset=21, axis=axis, block_size=block_size)
    q = RNG.integers(0, 255, x.shape).astype(np.uint8)
    assert_matches_reference("DequantizeLinear", {"q": q, "s": s, "zp": zp}, opset=21, axis=axis, block_size=block_size)


@pytest.mark.parametrize(
    "dtype", [np.uint16, np.int16, ml_dtypes.int4, ml_dtypes.uint4, ml_dtypes.int2, ml_dtypes.uint2]
)
def test_wide_and_narrow_integer_types(dtype):
    x = _x((2, 6), 40.0)
    zp = np.array(1, dtype)
    out = assert_matches_reference("QuantizeLinear", {"x": x, "s": np.float32(2.0), "zp": zp}, opset=25)
    assert out[0].dtype == np.dtype(dtype)
    assert_matches_reference("DequantizeLinear", {"q": out[0], "s": np.float32(2.0), "zp": zp}, opset=25)


@pytest.mark.parametrize(
    "dtype",
    [
        ml_dtypes.float8_e4m3fn,
        ml_dtypes.float8_e4m3fnuz,
        ml_dtypes.float8_e5m2,
        ml_dtypes.float8_e5m2fnuz,
        ml_dtypes.float4_e2m1fn,
    ],
)
@pytest.mark.parametrize("saturate", [0, 1])
def test_float_targets(dtype, saturate):
    x = np.array([0.3, -1.7, 1000.0, -1e6, 5e4, 0.0, 3.0], np.float32)
    zp = np.zeros((), dtype)
    out = assert_matches_reference(
        "QuantizeLinear", {"x": x, "s": np.float32(0.5), "zp": zp}, opset=21, saturate=saturate
    )
    assert out[0].dtype == np.dtype(dtype)
    q = out[0][np.isfinite(out[0].astype(np.float32))]
    assert_matches_reference("DequantizeLinear", {"q": q, "s": np.float32(0.5), "zp": zp}, opset=21)


def test_output_dtype_and_precision():
    x = _x()
    out = assert_matches_reference("QuantizeLinear", {"x": x, "s": np.float32(0.5)}, opset=21, output_dtype=TP.INT4)
    assert out[0].dtype == np.dtype(ml_dtypes.int4)
    # precision (opset 23): the division runs in float16; numpy gives the expected value.
    s = np.float32(0.37)
    want = np.clip(np.rint(x.astype(np.float16) / s.astype(np.float16)), -128, 127).astype(np.int8)
    assert_matches_reference(
        "QuantizeLinear", {"x": x, "s": s}, opset=23, output_dtype=TP.INT8, precision=TP.FLOAT16, expected=[want]
    )
    q = RNG.integers(0, 255, (3, 4)).astype(np.uint8)
    out = assert_matches_reference(
        "DequantizeLinear", {"q": q, "s": np.float32(0.5)}, opset=23, output_dtype=TP.FLOAT16
    )
    assert out[0].dtype == np.float16


def test_mismatched_output_dtype_is_an_error():
    x = _x()
    inputs = {"x": x, "s": np.float32(0.5), "zp": np.uint8(0)}
    model = node_model("QuantizeLinear", inputs, opset=21, output_dtype=TP.INT8)
    with pytest.raises(errors.NodeError, match="output_dtype"):
        run_jonnx(model, inputs)


def test_bad_blocked_scale_shape_is_an_error():
    x = _x((4, 6))
    inputs = {"x": x, "s": np.ones((4, 2), np.float32)}
    model = node_model("QuantizeLinear", inputs, opset=21, axis=1, block_size=2)
    with pytest.raises(errors.NodeError, match="blocked"):
        run_jonnx(model, inputs)


def test_dequantize_int32_and_float16_scale():
    q = RNG.integers(-(2**20), 2**20, (3, 4)).astype(np.int32)
    assert_matches_reference("DequantizeLinear", {"q": q, "s": np.float32(0.01)}, opset=13, expected=_dequantize())
    q8 = RNG.integers(0, 255, (3, 4)).astype(np.uint8)
    out = assert_matches_reference(
        "DequantizeLinear", {"q": q8, "s": np.float16(0.1), "zp": np.uint8(7)}, opset=19, rtol=1e-3
    )
    assert out[0].dtype == np.float16


def test_dequantize_differentiable_in_scale():
    q = RNG.integers(0, 255, (3, 4)).astype(np.uint8)
    s = RNG.uniform(0.1, 1.0, 4)
    check_op_grads("DequantizeLinear", {"q": q, "s": s, "zp": np.full(4, 9, np.uint8)}, opset=13, axis=1)


@pytest.mark.parametrize(
    "x",
    [
        np.array([0, 2, -3, -2.5, 1.34, 0.5], np.float32),
        np.array([-1.0, -2.1, -1.3, -2.5, -3.34, -4.0], np.float32),
        np.array([1, 2.1, 1.3, 2.5, 3.34, 4.0, 1.5, 2.6, 3.9, 4.0, 3.0, 2.345], np.float32).reshape(3, 4),
        np.zeros(4, np.float32),
        # max and min are reduced by rows, then across them: extremes in different rows
        np.random.default_rng(3).standard_normal((2, 5, 7)).astype(np.float32) * [[[1]], [[9]]],
        np.float32(-2.5),
    ],
)
def test_dynamic_quantize_linear(x):
    assert_matches_reference("DynamicQuantizeLinear", {"x": x}, 3, opset=11)


def test_dynamic_quantize_linear_scale_is_the_quotient_rounded_once():
    # The scale is (max - min) / 255 rounded once, as onnxruntime and the reference compute it.
    # XLA multiplies by a constant divisor's reciprocal instead, one unit in the last place off
    # for these ranges (and the zero point and the quantized values would follow).
    ranges = np.random.default_rng(5).uniform(0.5, 8, 400).astype(np.float32)
    ranges = ranges[ranges * np.float32(1 / 255) != ranges / np.float32(255)][:8]
    assert len(ranges) == 8  # the premise
    model = node_model("DynamicQuantizeLinear", {"x": np.zeros(2, np.float32)}, 3, opset=11)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    loaded = jonnx.load(model)
    for r in ranges:
        x = np.array([0, r], np.float32)
        scale = np.asarray(loaded(x)[1])
        assert scale == r / np.float32(255) == session.run(None, {"x": x})[1], r


def test_dynamic_quantize_linear_scale_differentiable():
    # Its max and min are one two-result reduction, whose derivative jonnx supplies.
    x = np.array([[0.3, -1.7, 2.2], [1.1, -0.4, 0.9]], np.float64)
    check_op_grads("DynamicQuantizeLinear", {"x": x}, opset=11, output=1, n_outputs=3)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_matmul_integer(dtype):
    a = RNG.integers(0, 100, (2, 4, 3)).astype(dtype)
    b = RNG.integers(0, 100, (3, 5)).astype(dtype)
    assert_matches_reference(
        "MatMulInteger", {"a": a, "b": b, "za": np.array(12, dtype), "zb": np.array(3, dtype)}, opset=10
    )
    # per-row a zero point, per-column b zero point (numpy: the reference cannot broadcast them)
    a2 = a[0]
    za, zb = np.arange(4).astype(dtype), np.arange(5).astype(dtype)
    want = (a2.astype(np.int32) - za[:, None]) @ (b.astype(np.int32) - zb)
    assert_matches_reference("MatMulInteger", {"a": a2, "b": b, "za": za, "zb": zb}, opset=10, expected=[want])


@pytest.mark.parametrize("a_dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("b_dtype", [np.uint8, np.int8])
def test_matmul_integer_is_exact_over_full_ranges(a_dtype, b_dtype):
    # jonnx multiplies int8 by int8 and corrects for the offsets: check it against exact
    # integer arithmetic at the ends of each range, batched, with per-row/per-column zero points.
    info_a, info_b = np.iinfo(a_dtype), np.iinfo(b_dtype)
    a = RNG.integers(info_a.min, info_a.max + 1, (2, 6, 1024), endpoint=False).astype(a_dtype)
    b = RNG.integers(info_b.min, info_b.max + 1, (1024, 7), endpoint=False).astype(b_dtype)
    a[0, 0], b[:, 0] = info_a.max, info_b.min
    za = np.array([info_a.min, info_a.max, 0, 1, 3, 7], a_dtype)
    zb = np.array([info_b.max, info_b.min, 0, 5, 2, 1, 9], b_dtype)
    want = (a.astype(np.int64) - za[:, None].astype(np.int64)) @ (b.astype(np.int64) - zb.astype(np.int64))
    assert_matches_reference(
        "MatMulInteger", {"a": a, "b": b, "za": za, "zb": zb}, opset=10, expected=[want.astype(np.int32)]
    )


@pytest.mark.parametrize("mode", ["int8", "bfloat16", "float32"])
@pytest.mark.parametrize("a_dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("b_kind", ["input", "weight"])
def test_integer_products_are_exact_in_every_mode(mode, a_dtype, b_kind, monkeypatch):
    # The float modes sum 8-bit products in float32, exact only below 2**24: a contraction of
    # 2100 products of -127 * 127 (odd, so no power-of-two luck) reaches 3.4e7, which an
    # unchunked float32 sum rounds. Chunks of 1024 summed in int32 keep it exact. B as a graph
    # input (traced) and as a weight (numpy, converted at trace time).
    monkeypatch.setattr(quantize, "INTEGER_MATMUL", mode)
    k = 2100
    a = RNG.integers(np.iinfo(a_dtype).min, np.iinfo(a_dtype).max + 1, (2, 3, k)).astype(a_dtype)
    a[:, 0] = 1 if a_dtype == np.uint8 else -127  # minus the uint8 offset of 128: -127
    b = RNG.integers(-128, 128, (k, 5)).astype(np.int8)
    b[:, 0] = 127
    want = a.astype(np.int64) @ b.astype(np.int64)
    assert abs(want).max() > 2**24
    assert_matches_reference(
        "MatMulInteger",
        {"a": a, "b": b, "za": np.array(0, a_dtype), "zb": np.array(0, np.int8)},
        opset=10,
        expected=[want.astype(np.int32)],
        initializers=() if b_kind == "input" else ("b",),
    )


@pytest.mark.parametrize(
    ("flags", "mode"),
    [
        ({"avx512f", "amx_bf16", "amx_int8", "avx512_bf16"}, "int8"),  # AMX: int8 tiles win
        ({"avx512f", "avx512_vnni", "avx512_bf16"}, "bfloat16"),  # bf16 beats VNNI int8
        ({"sse2", "avx512f", "avx512_vnni"}, "int8"),  # VNNI without bfloat16 dots
        ({"sse2", "avx2", "avx_vnni"}, "int8"),
        ({"sse2", "avx2", "fma"}, "float32"),  # x86 without int8 or bfloat16 dots (AMD Zen 3)
        ({"asimd", "asimddp"}, "int8"),  # not x86: as before
        (set(), "int8"),  # /proc/cpuinfo unreadable
    ],
)
def test_integer_product_mode_follows_the_cpu(flags, mode, monkeypatch):
    monkeypatch.setattr(quantize._cpu, "cpu_info", lambda: frozenset(flags))
    monkeypatch.setattr(quantize.jax, "default_backend", lambda: "cpu")
    assert quantize.integer_matmul_mode() == mode
    monkeypatch.setattr(quantize, "INTEGER_MATMUL", "float32")
    assert quantize.integer_matmul_mode() == "float32"


@pytest.mark.parametrize("opset", [10, 21])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_qlinear_matmul(opset, dtype):
    a = RNG.integers(0, 100, (2, 4, 3)).astype(dtype)
    b = RNG.integers(0, 100, (3, 5)).astype(dtype)
    inputs = {
        "a": a,
        "sa": np.float32(0.05),
        "za": np.array(10, dtype),
        "b": b,
        "sb": np.float32(0.02),
        "zb": np.array(5, dtype),
        "sy": np.float32(0.3),
        "zy": np.array(7, dtype),
    }
    assert_matches_reference("QLinearMatMul", inputs, opset=opset)


def test_conv_integer():
    x = RNG.integers(0, 255, (1, 2, 5, 5)).astype(np.uint8)
    w = RNG.integers(0, 255, (3, 2, 3, 3)).astype(np.uint8)
    assert_matches_reference(
        "ConvInteger",
        {"x": x, "w": w, "zx": np.uint8(100), "zw": np.uint8(120)},
        opset=10,
        pads=[1, 1, 1, 1],
        strides=[2, 1],
    )
    assert_matches_reference("ConvInteger", {"x": x, "w": w}, opset=10, auto_pad="SAME_UPPER")


@pytest.mark.parametrize("x_dtype,w_dtype", [(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8)])
@pytest.mark.parametrize("channels,group", [(16, 1), (16, 4), (464, 1)])  # 464*3*3: two float32 parts
def test_conv_integer_is_exact_over_full_ranges(x_dtype, w_dtype, channels, group, lowering):
    # jonnx convolves as one 8-bit product over the taps (CPU, ungrouped) or in float32 in two
    # exact halves; check either against the reference's integers.
    info_x, info_w = np.iinfo(x_dtype), np.iinfo(w_dtype)
    x = RNG.integers(info_x.min, info_x.max, (1, channels, 6, 6), endpoint=True).astype(x_dtype)
    w = RNG.integers(info_w.min, info_w.max, (8, channels // group, 3, 3), endpoint=True).astype(w_dtype)
    zx = np.array(info_x.max if x_dtype == np.uint8 else info_x.min, x_dtype)  # the widest centered range
    zw = np.array(info_w.min, w_dtype)
    assert_matches_reference(
        "ConvInteger", {"x": x, "w": w, "zx": zx, "zw": zw}, opset=10, pads=[1, 0, 1, 2], strides=[1, 2], group=group
    )


@pytest.mark.parametrize("group", [1, 2])
def test_conv_integer_is_exact_where_one_float32_sum_would_not_be(group, lowering):
    # 464 channels of 3x3: 4,176 products per output. x centered at -255 has high half -16 and
    # the weights are 255 (centered), so the high halves' convolution sums past 2**24, and one
    # x of -240 (high half -15) in each group makes that sum odd: float32 cannot hold it, so one
    # float32 convolution over all the channels would round it; jonnx splits the channels (or,
    # on CPU where ungrouped, multiplies 8-bit values in contractions of at most 1,024).
    high_sum = 255 * (-16 * 4175 - 15)
    assert abs(high_sum) > 2**24 and high_sum % 2 == 1  # the premise
    x = np.zeros((1, 464 * group, 4, 4), np.uint8)  # every 3x3 window holds (1, 1)
    x[0, ::464, 1, 1] = 15
    w = np.full((2 * group, 464, 3, 3), 127, np.int8)
    inputs = {"x": x, "w": w, "zx": np.uint8(255), "zw": np.int8(-128)}
    got = assert_matches_reference("ConvInteger", inputs, opset=10, group=group)[0]
    np.testing.assert_array_equal(got, np.full((1, 2 * group, 2, 2), 255 * (-255 * 4175 - 240), np.int32))


@pytest.mark.parametrize(
    "x_shape,w_shape,attrs",
    [
        ((2, 3, 11), (4, 3, 3), dict(dilations=[2], strides=[2], pads=[3, 1])),
        ((1, 2, 5, 4, 6), (3, 2, 2, 3, 2), dict(strides=[1, 2, 2], auto_pad="SAME_LOWER")),
        ((0, 2, 4, 5), (3, 2, 2, 2), dict(pads=[1, 0, 0, 1])),
    ],
    ids=["1d_dilated", "3d_same_lower", "empty_batch"],
)
def test_conv_integer_geometries(x_shape, w_shape, attrs, lowering):
    x = RNG.integers(0, 255, x_shape, endpoint=True).astype(np.uint8)
    w = RNG.integers(-128, 127, w_shape, endpoint=True).astype(np.int8)
    # (a zero point per output channel only in 2-D: the ReferenceEvaluator's reshapes it for 2-D)
    inputs = {"x": x, "w": w, "zx": np.uint8(131), "zw": np.int8(-7)}
    assert_matches_reference("ConvInteger", inputs, opset=10, **attrs)


@pytest.mark.parametrize("group", [1, 2])
def test_conv_integer_windows_too_deep_for_float32_are_exact(group):
    # One channel's window of 4,200 products is past what one float32 sum holds (_EXACT_FAN_IN)
    # and past what the 8-bit product gathers (_PRODUCT_TAPS): those convolve in int32. Checked against
    # numpy's int64 sums (the reference evaluator's convolution loops over the window in Python).
    x = RNG.integers(0, 255, (1, 2 * group, 4210), endpoint=True).astype(np.uint8)
    w = RNG.integers(-128, 127, (2 * group, 2, 4200), endpoint=True).astype(np.int8)
    assert 4200 > quantize._EXACT_FAN_IN

    def expected(x, w, zx, zw):
        windows = np.lib.stride_tricks.sliding_window_view(x.astype(np.int64) - int(zx), 4200, axis=2)
        windows = windows.reshape(1, group, 2, -1, 4200)  # N, groups, channels, positions, window
        w = w.reshape(group, 2, 2, 4200).astype(np.int64) - int(zw)  # groups, outputs, channels, window
        return [np.einsum("ngctk,gock->ngot", windows, w).reshape(1, 2 * group, -1).astype(np.int32)]

    inputs = {"x": x, "w": w, "zx": np.uint8(0), "zw": np.int8(-128)}
    assert_matches_reference("ConvInteger", inputs, opset=10, expected=expected, group=group)


@pytest.mark.parametrize("per_channel", [False, True])
def test_qlinear_conv(per_channel, lowering):
    x = RNG.integers(0, 255, (1, 2, 5, 5)).astype(np.uint8)
    w = RNG.integers(0, 255, (3, 2, 3, 3)).astype(np.uint8)
    ws = RNG.uniform(0.001, 0.01, 3).astype(np.float32) if per_channel else np.float32(0.005)
    wz = np.full(3, 120, np.uint8) if per_channel else np.uint8(120)
    inputs = {
        "x": x,
        "sx": np.float32(0.02),
        "zx": np.uint8(100),
        "w": w,
        "sw": ws,
        "zw": wz,
        "sy": np.float32(0.05),
        "zy": np.uint8(128),
        "b": RNG.integers(-500, 500, 3).astype(np.int32),
    }
    assert_matches_reference("QLinearConv", inputs, opset=10, pads=[1, 1, 1, 1])

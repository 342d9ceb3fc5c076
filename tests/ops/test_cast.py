"""Cast, CastLike and BitCast against the ReferenceEvaluator, ml_dtypes and numpy."""

from __future__ import annotations

import jax
import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx.reference import ReferenceEvaluator

import jonnx
from jonnx import errors
from tests.ops._harness import assert_matches_reference, check_op_grads, node_model, run_jonnx

RNG = np.random.default_rng(0)

SPECIALS = np.array(
    [
        0.47892547,
        -0.48033667,
        0.49968487,
        1e6,
        1e-7,
        np.nan,
        np.inf,
        -np.inf,
        -1e-7,
        -1e6,
        -0.0,
        0.0,
        448.0,
        464.0,
        500.0,
        57344.0,
        61440.0,
        2.5,
        -3.75,
    ],
    np.float32,
)
F8 = {
    TP.FLOAT8E4M3FN: ml_dtypes.float8_e4m3fn,
    TP.FLOAT8E4M3FNUZ: ml_dtypes.float8_e4m3fnuz,
    TP.FLOAT8E5M2: ml_dtypes.float8_e5m2,
    TP.FLOAT8E5M2FNUZ: ml_dtypes.float8_e5m2fnuz,
}


def _bits_equal(got, want):
    """float8 results compared as values, NaN matching NaN (NaN payloads may differ)."""
    g, w = np.asarray(got).astype(np.float32), np.asarray(want).astype(np.float32)
    np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
    np.testing.assert_array_equal(np.where(np.isnan(g), 0, g), np.where(np.isnan(w), 0, w))
    # NaN's sign differs between XLA and ml_dtypes (fnuz NaN is the "-0" pattern); ONNX does
    # not define it.
    np.testing.assert_array_equal(np.signbit(g) & ~np.isnan(g), np.signbit(w) & ~np.isnan(w))


CASES = [
    (src, dst, opset)
    for src in (np.float32, np.float64, np.float16, np.int8, np.int64, np.bool_)
    for dst in (TP.FLOAT, TP.DOUBLE, TP.FLOAT16, TP.INT64, TP.UINT32, TP.BOOL)
    for opset in (6, 13, 21)
    if opset == 13 or (src, dst) in {(np.float32, TP.INT64), (np.int64, TP.DOUBLE), (np.bool_, TP.FLOAT)}
]


@pytest.mark.parametrize("src,dst,opset", CASES)
def test_numeric_casts(src, dst, opset):
    # In-range values only: out-of-range float -> int is undefined in ONNX.
    x = RNG.integers(0, 100, (3, 4)).astype(src)
    if np.dtype(src).kind == "f":
        x = (x + 0.25).astype(src)
    assert_matches_reference("Cast", {"x": x}, opset=opset, to=dst)


def test_integer_narrowing_wraps():
    # ONNX: fixed point OOR discards higher bits (200 int16 -> -56 int8).
    x = np.array([200, -200, 70000, 255, 256], np.int32)
    assert_matches_reference("Cast", {"x": x}, opset=13, to=TP.INT8, expected=[x.astype(np.int8)])


def test_cast_1_string_to_attribute():
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    # Cast-1's `to` is a type name; the ReferenceEvaluator reads it as an int, so numpy is the truth.
    assert_matches_reference("Cast", {"x": x}, opset=1, to="DOUBLE", expected=[x.astype(np.float64)])
    assert_matches_reference("Cast", {"x": x * 10}, opset=1, to="int32", expected=[(x * 10).astype(np.int32)])


def test_cast_1_rejects_unknown_type_name():
    x = np.ones(2, np.float32)
    model = node_model("Cast", {"x": x}, opset=1, to="FLOATY")
    with pytest.raises(errors.NodeError, match="not an ONNX data type name"):
        run_jonnx(model, {"x": x})


@pytest.mark.parametrize("dst", [TP.FLOAT16, TP.BFLOAT16, TP.FLOAT8E5M2])
@pytest.mark.parametrize("src", [np.float32, np.float64])
def test_float_narrowing_rounds_once(src, dst):
    # Values near rounding ties of the target: a float64 -> float32 -> float16 double rounding
    # would be caught here; ml_dtypes/numpy convert directly.
    x = (RNG.standard_normal(2000) * 100).astype(src)
    want = x.astype(onnx.helper.tensor_dtype_to_np_dtype(dst))
    got = run_jonnx(node_model("Cast", {"x": x}, opset=21, to=dst, saturate=0), {"x": x})[0]
    assert got.dtype == want.dtype
    bits = f"u{want.dtype.itemsize}"
    np.testing.assert_array_equal(got.view(bits), want.view(bits))


@pytest.mark.parametrize("to", list(F8))
@pytest.mark.parametrize("src", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("saturate", [0, 1])
def test_float8(to, src, saturate):
    with np.errstate(over="ignore"):
        x = SPECIALS.astype(src)
    dtype = F8[to]
    if saturate:
        want = onnx.numpy_helper.saturate_cast(x, dtype)
    else:
        with np.errstate(over="ignore"):
            want = x.astype(dtype)
    for jit in (True, False):
        got = run_jonnx(node_model("Cast", {"x": x}, opset=19, to=to, saturate=saturate), {"x": x}, jit=jit)[0]
        assert got.dtype == np.dtype(dtype)
        _bits_equal(got, want)


@pytest.mark.parametrize("to", list(F8))
def test_float8_saturates_by_default_and_from_integers(to):
    x = np.array([-100000, -3, 0, 5, 100000], np.int32)
    got = run_jonnx(node_model("Cast", {"x": x}, opset=21, to=to), {"x": x})[0]
    limit = float(ml_dtypes.finfo(F8[to]).max)
    _bits_equal(got, np.clip(x.astype(np.float32), -limit, limit).astype(F8[to]))


@pytest.mark.parametrize("to", list(F8) + [TP.FLOAT8E8M0])
def test_from_float8_roundtrip(to):
    dtype = F8.get(to, ml_dtypes.float8_e8m0fnu)
    x = np.abs(SPECIALS[np.isfinite(SPECIALS)]).astype(dtype)
    for dst, np_dst in ((TP.FLOAT, np.float32), (TP.FLOAT16, np.float16)):
        with np.errstate(over="ignore"):
            want = x.astype(np_dst)
        got = run_jonnx(node_model("Cast", {"x": x}, opset=25, to=dst), {"x": x})[0]
        _bits_equal(got, want)


@pytest.mark.parametrize(
    "round_mode,saturate,src",
    [(mode, sat, np.float32) for mode in ("up", "down", "nearest") for sat in (0, 1)]
    + [("up", 1, np.float16), ("nearest", 0, np.float16)],
)
def test_float8e8m0_rounding(round_mode, saturate, src):
    with np.errstate(over="ignore"):
        x = np.array(
            [0.0, 0.124, 0.25, 0.5, 0.75, 1.1, 1.5, 2.0, 3.0, 4.0, 8.0, 3e38, np.inf, np.nan, 1e-39, 6e4], np.float32
        ).astype(src)
    want = onnx.numpy_helper.to_float8e8m0(x, saturate=bool(saturate), round_mode=round_mode)
    model = node_model("Cast", {"x": x}, opset=25, to=TP.FLOAT8E8M0, saturate=saturate, round_mode=round_mode)
    for jit in (True, False):
        got = run_jonnx(model, {"x": x}, jit=jit)[0]
        assert got.dtype == np.dtype(ml_dtypes.float8_e8m0fnu)
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


def test_float8e8m0_rejects_unknown_round_mode():
    x = np.ones(2, np.float32)
    model = node_model("Cast", {"x": x}, opset=25, to=TP.FLOAT8E8M0, round_mode="sideways")
    with pytest.raises(errors.NodeError, match="round_mode"):
        run_jonnx(model, {"x": x})


@pytest.mark.parametrize(
    "to,dtype",
    [
        (TP.INT4, ml_dtypes.int4),
        (TP.UINT4, ml_dtypes.uint4),
        (TP.INT2, ml_dtypes.int2),
        (TP.UINT2, ml_dtypes.uint2),
        (TP.FLOAT4E2M1, ml_dtypes.float4_e2m1fn),
    ],
)
@pytest.mark.parametrize("src", [np.float32, np.float16, np.int32])
def test_small_types(to, dtype, src):
    # Integers keep their low bits (the spec's rule for fixed point). Floats truncate, and out
    # of range become 0 (undefined in the spec; what ONNX's reference and backend tests give
    # with ml_dtypes 0.7, whose own cast is not used here so the test holds with any version).
    # float4 rounds to nearest even and saturates (ml_dtypes' cast, unchanged across versions).
    x = np.concatenate([np.arange(-9, 16), [2.7, -2.7]]).astype(src)
    if dtype == ml_dtypes.float4_e2m1fn or src == np.int32:
        with np.errstate(over="ignore", invalid="ignore"):
            want = x.astype(dtype)
    else:
        info = ml_dtypes.iinfo(dtype)
        whole = np.trunc(x.astype(np.float64))
        want = np.where((whole >= info.min) & (whole <= info.max), whole, 0).astype(dtype)
    got = run_jonnx(node_model("Cast", {"x": x}, opset=25, to=to), {"x": x})[0]
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))
    back = run_jonnx(node_model("Cast", {"x": got}, opset=25, to=TP.FLOAT), {"x": got})[0]
    np.testing.assert_array_equal(back, want.astype(np.float32))


def test_float4_specials():
    x = np.array([0.48, 0.25, 1.05, -3.5, -8, 9, 1e6, 1e-7, np.inf, -np.inf, -4, 0.01, -0.0], np.float32)
    got = run_jonnx(node_model("Cast", {"x": x}, opset=23, to=TP.FLOAT4E2M1), {"x": x})[0]
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(got.astype(np.float32), x.astype(ml_dtypes.float4_e2m1fn).astype(np.float32))


def _string_model(value: np.ndarray, opset: int = 13):
    """Constant -> Cast(to=STRING): the Cast input is known at trace time."""
    import onnx.helper as oh

    nodes = [
        oh.make_node("Constant", [], ["c"], value=onnx.numpy_helper.from_array(value)),
        oh.make_node("Cast", ["c"], ["out"], to=TP.STRING),
    ]
    graph = oh.make_graph(nodes, "g", [], [oh.make_tensor_value_info("out", TP.STRING, value.shape)])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)])


# String outputs are host values: they come back from Model.apply (eager); Model.__call__'s
# jit cannot return object arrays (a core limitation, see the family report).
@pytest.mark.parametrize(
    "value",
    [
        np.array([[0.1, -2.5, np.inf], [np.nan, 1e-5, 3.0]], np.float32),
        np.array([1, -2, 300], np.int64),
        np.array([True, False]),
    ],
)
def test_to_string_from_a_constant(value):
    model = _string_model(value)
    got = run_jonnx(model, {}, jit=False)[0]
    want = ReferenceEvaluator(model).run(None, {})[0]
    assert got.dtype == object
    np.testing.assert_array_equal(got, want.astype(object))
    if value.dtype == np.float32:
        assert got[0, 0] == "0.1" and got[1, 0] == "nan"


def test_from_string_input():
    x = np.array(["3.14", "1e-5", "+INF", "-inf", "NaN", "100.5", "1E8", "-0"], dtype=object)
    want = np.array([3.14, 1e-5, np.inf, -np.inf, np.nan, 100.5, 1e8, -0.0], np.float32)
    got = run_jonnx(node_model("Cast", {"x": x}, opset=13, to=TP.FLOAT), {"x": x})[0]
    np.testing.assert_array_equal(got, want)
    ints = np.array(["7", "-12", "100.5", "123456789012"], dtype=object)
    got = run_jonnx(node_model("Cast", {"x": ints}, opset=13, to=TP.INT64), {"x": ints})[0]
    np.testing.assert_array_equal(got, np.array([7, -12, 100, 123456789012], np.int64))
    got = run_jonnx(node_model("Cast", {"x": x[:4]}, opset=19, to=TP.FLOAT8E4M3FN), {"x": x[:4]})[0]
    _bits_equal(got, onnx.numpy_helper.saturate_cast(want[:4], ml_dtypes.float8_e4m3fn))


def test_string_to_string_is_identity():
    x = np.array(["a", "bc"], dtype=object)
    got = run_jonnx(node_model("Cast", {"x": x}, opset=13, to=TP.STRING), {"x": x}, jit=False)[0]
    np.testing.assert_array_equal(got, x)


def test_traced_input_to_string_is_an_error():
    x = np.array([1.0, 2.5, -3.0], np.float32)
    model = node_model("Cast", {"x": x}, opset=13, to=TP.STRING)
    m = jonnx.load(model)
    with pytest.raises(errors.NodeError, match="known at trace time"):
        jax.jit(lambda v: m.apply(m.params, v))(x)
    # Model.__call__ runs the Cast on the host instead.
    assert run_jonnx(model, {"x": x})[0].tolist() == ReferenceEvaluator(model).run(None, {"x": x})[0].tolist()


def test_x64_off_int64_becomes_int32_without_warnings():
    x = np.array([1.5, -2.5, 7.0], np.float32)
    m = jonnx.load(node_model("Cast", {"x": x}, opset=13, to=TP.INT64))
    assert not jax.config.jax_enable_x64
    (y,) = m(x)
    assert y.dtype == np.int32
    np.testing.assert_array_equal(np.asarray(y), [1, -2, 7])


def test_cast_is_differentiable():
    x = RNG.standard_normal((3, 4))
    check_op_grads("Cast", {"x": x}, opset=13, to=TP.DOUBLE)


@pytest.mark.parametrize("opset", [15, 19, 21, 25])
@pytest.mark.parametrize("like", [np.float16, np.float64, np.int32, np.uint8, np.bool_])
def test_castlike(opset, like):
    x = (RNG.standard_normal((2, 5)) * 20).astype(np.float32)
    if like in (np.int32, np.uint8):
        x = np.abs(x)
    assert_matches_reference("CastLike", {"x": x, "like": np.zeros(1, like)}, opset=opset)


@pytest.mark.parametrize("saturate", [0, 1])
def test_castlike_float8_saturate(saturate):
    x = SPECIALS
    like = np.zeros(1, ml_dtypes.float8_e4m3fn)
    model = node_model("CastLike", {"x": x, "like": like}, opset=19, saturate=saturate)
    got = run_jonnx(model, {"x": x, "like": like})[0]
    with np.errstate(over="ignore"):
        want = onnx.numpy_helper.saturate_cast(x, like.dtype) if saturate else x.astype(like.dtype)
    _bits_equal(got, want)


def test_castlike_to_string_of_constant():
    x = np.array([1, -2, 3], np.int32)  # an integer initializer is a constant
    like = np.array(["s"], dtype=object)
    model = node_model("CastLike", {"x": x, "like": like}, opset=15, initializers=["x"])
    out = run_jonnx(model, {"x": x, "like": like}, jit=False)
    np.testing.assert_array_equal(out[0], np.array(["1", "-2", "3"], dtype=object))


@pytest.mark.parametrize(
    "src,to",
    [
        (np.float32, TP.INT32),
        (np.int32, TP.FLOAT),
        (np.float64, TP.INT64),
        (np.int64, TP.DOUBLE),
        (np.uint32, TP.INT32),
        (np.int8, TP.UINT8),
        (np.uint16, TP.INT16),
        (np.float16, TP.UINT16),
        (np.bool_, TP.UINT8),
        (np.uint8, TP.BOOL),
    ],
)
def test_bitcast(src, to):
    x = (RNG.standard_normal((2, 3)) * 50).astype(src) if src != np.bool_ else np.array([True, False, True])
    if src == np.uint8:
        x = np.array([0, 1, 1, 0], np.uint8)
    assert_matches_reference("BitCast", {"x": x}, opset=26, to=to)


def test_bitcast_needs_equal_widths():
    x = np.ones(3, np.float32)
    model = node_model("BitCast", {"x": x}, opset=26, to=TP.INT16)
    with pytest.raises(errors.NodeError, match="same bit width"):
        run_jonnx(model, {"x": x})

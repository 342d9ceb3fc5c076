"""Comparisons, logic, Where, IsNaN/IsInf, BitShift and bitwise ops against the
ReferenceEvaluator / numpy."""

from __future__ import annotations

import numpy as np
import pytest

from jonnx import errors
from tests.ops._harness import assert_matches_reference, node_model, run_jonnx

RNG = np.random.default_rng(0)

COMPARISONS = {
    "Equal": ((7, 11, 13, 19), np.equal),
    "Less": ((7, 9, 13), np.less),
    "Greater": ((7, 9, 13), np.greater),
    "LessOrEqual": ((12, 16), np.less_equal),
    "GreaterOrEqual": ((12, 16), np.greater_equal),
}
_CMP_CASES = [(op, v) for op, (versions, _) in COMPARISONS.items() for v in versions]


def _ints(shape, dtype, lo=-3, hi=4):
    return RNG.integers(lo, hi, shape).astype(dtype)


@pytest.mark.parametrize("op,opset", _CMP_CASES, ids=[f"{o}-{v}" for o, v in _CMP_CASES])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64])
def test_comparisons_broadcast(op, opset, dtype):
    a, b = _ints((2, 3, 4), dtype), _ints((3, 1), dtype)
    got = assert_matches_reference(op, {"a": a, "b": b}, opset=opset)
    np.testing.assert_array_equal(got[0], COMPARISONS[op][1](a, b))


@pytest.mark.parametrize("op", ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"])
@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.uint8, np.int8, np.uint64])
def test_comparisons_newest_types(op, dtype):
    a, b = _ints((3, 4), dtype, 0, 4), _ints((4,), dtype, 0, 4)
    opset = COMPARISONS[op][0][-1]
    assert_matches_reference(op, {"a": a, "b": b}, opset=opset, expected=lambda a, b: [COMPARISONS[op][1](a, b)])


def test_equal_bool():
    a = np.array([True, False, True, False])
    b = np.array([True, True, False, False])
    assert_matches_reference("Equal", {"a": a, "b": b}, opset=13, expected=[a == b])


def test_equal_nan_is_false():
    a = np.array([np.nan, 1.0, np.inf], np.float32)
    assert_matches_reference("Equal", {"a": a, "b": a.copy()}, opset=13, expected=[np.array([False, True, True])])


def test_equal_strings_when_static():
    # Strings exist only as numpy object arrays, so both inputs are initializers.
    a = np.array(["a", "bc", "d"], dtype=object)
    b = np.array(["a", "b", "d"], dtype=object)
    got = assert_matches_reference(
        "Equal", {"a": a, "b": b}, opset=19, initializers=("a", "b"), expected=[np.array([True, False, True])]
    )
    assert got[0].dtype == bool


@pytest.mark.parametrize(
    "op,fn",
    [
        ("Equal", np.equal),
        ("Less", np.less),
        ("Greater", np.greater),
        ("And", np.logical_and),
        ("Or", np.logical_or),
        ("Xor", np.logical_xor),
    ],
)
def test_opset1_legacy_broadcast_axis(op, fn):
    # Opset 1: with broadcast=1 and axis=1, B of shape (3,) lines up with A's dim 1 (from the
    # changelog); numpy gives the expected value, as the ReferenceEvaluator ignores `axis`.
    if op in ("And", "Or", "Xor"):
        a, b = RNG.integers(0, 2, (2, 3, 4)).astype(bool), RNG.integers(0, 2, 3).astype(bool)
    elif op == "Equal":
        a, b = _ints((2, 3, 4), np.int32), _ints(3, np.int32)
    else:
        a, b = _ints((2, 3, 4), np.float32), _ints(3, np.float32)
    assert_matches_reference(
        op, {"a": a, "b": b}, opset=1, broadcast=1, axis=1, expected=lambda a, b: [fn(a, b[None, :, None])]
    )
    # Without axis, B matches A's trailing dims.
    b2 = a[0, 0] if op not in ("And", "Or", "Xor") else ~a[0, 0]
    assert_matches_reference(op, {"a": a, "b": b2}, opset=1, broadcast=1, expected=lambda a, b: [fn(a, b)])


def test_opset1_without_broadcast_rejects_mismatched_shapes():
    a, b = np.ones((2, 3), bool), np.ones(3, bool)
    with pytest.raises(errors.NodeError, match="broadcast=1"):
        run_jonnx(node_model("And", {"a": a, "b": b}, opset=1), {"a": a, "b": b})


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
@pytest.mark.parametrize("opset", [1, 7])
def test_logical(op, opset):
    a = RNG.integers(0, 2, (3, 4)).astype(bool)
    b = RNG.integers(0, 2, (3, 4) if opset == 1 else (4,)).astype(bool)
    assert_matches_reference(op, {"a": a, "b": b}, opset=opset)


def test_not():
    x = RNG.integers(0, 2, (3, 4)).astype(bool)
    assert_matches_reference("Not", {"x": x}, opset=1)


@pytest.mark.parametrize("opset", [9, 16])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.uint8, bool, np.float16])
def test_where(opset, dtype):
    cond = RNG.integers(0, 2, (3, 1, 4)).astype(bool)
    x, y = _ints((2, 4), dtype), _ints((1, 4), dtype)
    assert_matches_reference("Where", {"c": cond, "x": x, "y": y}, opset=opset)


def test_where_strings_when_static():
    cond = np.array([True, False, True])
    x = np.array(["a", "b", "c"], dtype=object)
    y = np.array(["x", "y", "z"], dtype=object)
    # Eager only: a jitted Model cannot return a string output (not a JAX type).
    inputs = {"c": cond, "x": x, "y": y}
    model = node_model("Where", inputs, opset=16, initializers=("c", "x", "y"))
    (got,) = run_jonnx(model, inputs, jit=False)
    np.testing.assert_array_equal(got, np.array(["a", "y", "c"], dtype=object))
    assert got.dtype == object


def test_where_gradient_flows_to_selected_branch():
    from tests.ops._harness import check_op_grads

    cond = np.array([True, False, True, False])
    x, y = RNG.standard_normal(4), RNG.standard_normal(4)
    check_op_grads("Where", {"c": cond, "x": x, "y": y}, opset=16)


_SPECIALS = np.array([np.nan, np.inf, -np.inf, 0.0, -1.5, 3.0], np.float32)


@pytest.mark.parametrize("opset", [9, 13, 20])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_isnan(opset, dtype):
    x = _SPECIALS.astype(dtype)
    assert_matches_reference("IsNaN", {"x": x}, opset=opset, expected=[np.isnan(x)])


@pytest.mark.parametrize("opset", [10, 20])
@pytest.mark.parametrize("neg,pos", [(1, 1), (0, 1), (1, 0), (0, 0)])
def test_isinf(opset, neg, pos):
    x = _SPECIALS
    want = (np.isneginf(x) & bool(neg)) | (np.isposinf(x) & bool(pos))
    assert_matches_reference("IsInf", {"x": x}, opset=opset, detect_negative=neg, detect_positive=pos, expected=[want])


def test_isnan_float8():
    import ml_dtypes

    x = np.array([np.nan, 1.0, -2.0], ml_dtypes.float8_e4m3fn)
    assert_matches_reference("IsNaN", {"x": x}, opset=20, expected=[np.array([True, False, False])])


# --- BitShift and bitwise ops -----------------------------------------------------------------


def _shift_np(x, y, direction):
    """ONNX BitShift-28 semantics, spelled out element by element in Python integers."""
    x, y = np.broadcast_arrays(x, y)
    bits = x.dtype.itemsize * 8
    signed = x.dtype.kind == "i"
    out = np.empty(x.shape, x.dtype)
    for idx in np.ndindex(x.shape):
        v, s = int(x[idx]), int(y[idx])
        if s < 0 or s >= bits:
            r = -1 if (direction == "RIGHT" and signed and v < 0) else 0
        elif direction == "LEFT":
            r = (v << s) & ((1 << bits) - 1)
            if signed and r >= 1 << (bits - 1):
                r -= 1 << bits
        else:
            r = v >> s  # Python's >> is arithmetic on negative ints
        out[idx] = r
    return out


@pytest.mark.parametrize("opset", [11, 28])
@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.uint64])
def test_bitshift_unsigned(opset, direction, dtype):
    x = np.array([1, 4, 255, 16, 7, 200], dtype)
    y = np.array([1, 2, 3, 0, 7, 4], dtype)
    assert_matches_reference("BitShift", {"x": x, "y": y}, opset=opset, direction=direction)
    assert_matches_reference(
        "BitShift",
        {"x": x, "y": y},
        opset=opset,
        direction=direction,
        expected=lambda x, y: [_shift_np(x, y, direction)],
    )


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64])
def test_bitshift_signed_and_out_of_range(direction, dtype):
    # BitShift-28's rules (arithmetic right shift, sign fill for amounts < 0 or >= width)
    # come from its schema text; the expected values are computed with Python integers.
    bits = np.dtype(dtype).itemsize * 8
    x = np.array([5, -5, -128 if bits == 8 else -(2**20), 64, -1, 3, -7, 9], dtype)
    y = np.array([1, 1, 2, 2, 0, bits, bits + 3, -1], dtype)
    assert_matches_reference(
        "BitShift", {"x": x, "y": y}, opset=28, direction=direction, expected=lambda x, y: [_shift_np(x, y, direction)]
    )


def test_bitshift_unsigned_out_of_range_is_zero():
    x = np.array([1, 255, 7], np.uint8)
    y = np.array([8, 9, 200], np.uint8)
    for direction in ("LEFT", "RIGHT"):
        assert_matches_reference(
            "BitShift", {"x": x, "y": y}, opset=11, direction=direction, expected=[np.zeros(3, np.uint8)]
        )


def test_bitshift_rejects_bad_direction():
    x = np.array([1, 2], np.uint8)
    with pytest.raises(errors.NodeError, match="direction"):
        run_jonnx(node_model("BitShift", {"x": x, "y": x}, opset=11, direction="UP"), {"x": x, "y": x})


@pytest.mark.parametrize("op", ["BitwiseAnd", "BitwiseOr", "BitwiseXor"])
@pytest.mark.parametrize("dtype", [np.int8, np.uint16, np.int32, np.uint64])
def test_bitwise_binary(op, dtype):
    info = np.iinfo(dtype)
    a = RNG.integers(info.min, info.max, (3, 4), dtype=dtype, endpoint=True)
    b = RNG.integers(info.min, info.max, (4,), dtype=dtype, endpoint=True)
    assert_matches_reference(op, {"a": a, "b": b}, opset=18)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int64, np.uint32])
def test_bitwise_not(dtype):
    info = np.iinfo(dtype)
    x = RNG.integers(info.min, info.max, (3, 4), dtype=dtype, endpoint=True)
    assert_matches_reference("BitwiseNot", {"x": x}, opset=18, expected=[np.invert(x)])

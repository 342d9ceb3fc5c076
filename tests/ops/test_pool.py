"""Pooling ops (Average/Max/Lp, their Global forms, MaxUnpool) against the ReferenceEvaluator,
onnxruntime and numpy, over opsets, geometries and dtypes, plus gradients."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import jonnx
from jonnx import errors
from tests.ops._harness import assert_matches_reference, check_op_grads, node_model, ort_expected, run_jonnx

RNG = np.random.default_rng(0)


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


# ----------------------------------------------------------------------------- pooling

POOL_CASES = [
    ((1, 2, 7), dict(kernel_shape=[3], strides=[2], pads=[1, 1])),
    ((2, 3, 6, 5), dict(kernel_shape=[2, 3])),
    ((1, 2, 7, 6), dict(kernel_shape=[3, 2], strides=[2, 2], pads=[1, 0, 1, 1])),
    ((1, 2, 7, 7), dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER")),
    ((1, 2, 6, 7), dict(kernel_shape=[2, 3], strides=[2, 2], auto_pad="SAME_LOWER")),
    ((1, 2, 7, 6), dict(kernel_shape=[3, 3], strides=[2, 1], auto_pad="VALID")),
    ((1, 1, 4, 5, 6), dict(kernel_shape=[2, 2, 3], strides=[2, 1, 2])),
]


@pytest.mark.parametrize("case", range(len(POOL_CASES)))
@pytest.mark.parametrize("include_pad", [0, 1])
def test_average_pool(case, include_pad):
    xs, attrs = POOL_CASES[case]
    opset = (7, 10, 11, 19, 22)[(case + include_pad) % 5]
    assert_matches_reference("AveragePool", {"x": rand(*xs)}, opset=opset, count_include_pad=include_pad, **attrs)


@pytest.mark.parametrize(
    "spatial,kernel,strides,dilations,lo,hi,extra",
    [
        ((7,), (3,), (2,), (1,), (1,), (1,), (0,)),
        ((5, 6), (2, 3), (2, 1), (2, 1), (1, 0), (0, 2), (1, 0)),
        ((4, 5, 3), (2, 2, 3), (1, 2, 1), (1, 1, 2), (1, 1, 1), (0, 1, 1), (0, 1, 1)),
    ],
)
@pytest.mark.parametrize("include_pad", [False, True])
@pytest.mark.parametrize("channels_last", [False, True])
def test_average_pool_window_counts(spatial, kernel, strides, dilations, lo, hi, extra, include_pad, channels_last):
    # Counted in numpy (no computation compiled per pool shape): against sliding each window
    # over an array of ones, padded with ones where the pads count and zeros elsewhere.
    from jonnx.ops import pool

    ones = np.ones(spatial)
    zeros_before = [0 if include_pad else b for b in lo]
    zeros_after = [e if include_pad else a + e for a, e in zip(hi, extra)]
    if include_pad:
        ones = np.pad(ones, list(zip(lo, hi)), constant_values=1)
    ones = np.pad(ones, list(zip(zeros_before, zeros_after)))
    reach = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    out = [(n - r) // s + 1 for n, r, s in zip(ones.shape, reach, strides)]
    expected = np.zeros(out, np.float32)
    for o in np.ndindex(*out):
        window = tuple(slice(i * s, i * s + r, d) for i, s, r, d in zip(o, strides, reach, dilations))
        expected[o] = ones[window].sum()
    got = pool._window_count(spatial, kernel, strides, dilations, lo, hi, extra, include_pad, np.float32, channels_last)
    assert isinstance(got, np.ndarray) and got.dtype == np.float32
    np.testing.assert_array_equal(got, expected[None, ..., None] if channels_last else expected[None, None])


def test_average_pool_1_excludes_pads():
    # AveragePool-1 has no count_include_pad: the changelog divides by the cells "exclude pad".
    x = rand(1, 1, 4, 4)
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    ones = np.pad(np.ones_like(x), ((0, 0), (0, 0), (1, 1), (1, 1)))
    windows = lambda a: np.stack([a[..., i : i + 3, j : j + 3].sum((-2, -1)) for i in (0, 2) for j in (0, 2)], -1)
    expected = (windows(padded) / windows(ones)).reshape(1, 1, 2, 2)
    assert_matches_reference(
        "AveragePool", {"x": x}, opset=1, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], expected=[expected]
    )


@pytest.mark.parametrize("case", range(len(POOL_CASES)))
def test_max_pool(case):
    xs, attrs = POOL_CASES[case]
    opset = (1, 8, 10, 11, 12, 22)[case % 6]
    x = rand(*xs)
    # The ReferenceEvaluator's MaxPool gets SAME_LOWER's output shape wrong ((3, 3) for a
    # 6x7 input with strides 2: ceil(7/2) is 4); onnxruntime follows the spec.
    expected = ort_expected("MaxPool", {"x": x}, opset=12, **attrs) if attrs.get("auto_pad") == "SAME_LOWER" else None
    assert_matches_reference("MaxPool", {"x": x}, opset=opset, expected=expected, **attrs)


# Windows that do not overlap (stride >= kernel) take the maximum (without pads, the sum) of
# their taps on CPU; with pads, ceil_mode and a stride past the kernel.
DISJOINT_CASES = [
    ((2, 3, 8, 8), dict(kernel_shape=[2, 2], strides=[2, 2])),
    ((1, 2, 7, 6), dict(kernel_shape=[2, 2], strides=[2, 2], pads=[1, 0, 0, 1])),
    ((1, 2, 9), dict(kernel_shape=[3], strides=[3], pads=[2, 1])),
    ((1, 2, 7, 7), dict(kernel_shape=[2, 2], strides=[3, 2], ceil_mode=1)),
    ((1, 1, 5, 6, 4), dict(kernel_shape=[2, 3, 2], strides=[2, 3, 2], pads=[1, 0, 1, 0, 2, 0])),
]


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize("case", range(len(DISJOINT_CASES)))
def test_pool_disjoint_windows(op, case):
    xs, attrs = DISJOINT_CASES[case]
    x = rand(*xs)
    expected = ort_expected(op, {"x": x}, opset=19, **attrs)
    assert_matches_reference(op, {"x": x}, opset=19, expected=expected, **attrs)
    check_op_grads(op, {"x": x}, opset=19, **attrs)


CEIL_CASES = [
    ((1, 1, 5, 5), dict(kernel_shape=[3, 3], strides=[2, 2])),
    ((1, 2, 6, 6), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ((1, 1, 5, 6), dict(kernel_shape=[2, 2], strides=[2, 2], pads=[1, 1, 1, 1])),  # drops a window
    ((1, 1, 8, 7), dict(kernel_shape=[2, 3], strides=[3, 2], dilations=[2, 1], pads=[0, 1, 1, 0])),
]


@pytest.mark.parametrize(
    "op,opset,n_outputs,extra",
    [
        ("AveragePool", 19, 1, dict(count_include_pad=0)),
        ("AveragePool", 22, 1, dict(count_include_pad=1)),
        ("MaxPool", 12, 2, dict(storage_order=0)),
        ("LpPool", 18, 1, dict(p=2)),
    ],
)
@pytest.mark.parametrize("case", range(len(CEIL_CASES)))
def test_pool_ceil_mode_and_dilations(op, opset, n_outputs, extra, case):
    # The ReferenceEvaluator splits ceil_mode's extra padding over both ends (shifting the
    # windows); onnxruntime, like PyTorch, extends only the end and never counts it.
    xs, attrs = CEIL_CASES[case]
    attrs = dict(attrs, ceil_mode=1, **extra)
    x = rand(*xs)
    assert_matches_reference(
        op,
        {"x": x},
        n_outputs,
        opset=opset,
        expected=ort_expected(op, {"x": x}, n_outputs, opset=opset, **attrs),
        **attrs,
    )


@pytest.mark.parametrize("n_outputs", [1, 2])
@pytest.mark.parametrize("dilations", [[1, 1], [2, 2]])
def test_max_pool_of_an_empty_batch(dilations, n_outputs):
    # A dilated MaxPool reads its maxima through their indices (a gather of the flattened
    # input), which for an empty input once came back as that flat (0,) array.
    # The ReferenceEvaluator returns an empty input as it is, so onnxruntime is the reference.
    inputs = {"x": np.zeros((0, 3, 4, 6), np.float32)}
    attrs = dict(kernel_shape=[2, 2], pads=[0, 1, 0, 1], dilations=dilations)
    want = ort_expected("MaxPool", inputs, n_outputs, opset=22, **attrs)
    out = assert_matches_reference("MaxPool", inputs, n_outputs, opset=22, expected=want, **attrs)
    assert out[0].shape == ((0, 3, 2, 6) if dilations[0] == 2 else (0, 3, 3, 7))


@pytest.mark.parametrize("storage_order,case", [(0, 1), (1, 2), (1, 3), (0, 4)])
def test_max_pool_indices(storage_order, case):
    xs, attrs = POOL_CASES[case]
    x = rand(*xs)
    expected = ort_expected("MaxPool", {"x": x}, 2, opset=12, storage_order=storage_order, **attrs)
    assert_matches_reference("MaxPool", {"x": x}, 2, opset=12, storage_order=storage_order, expected=expected, **attrs)


def test_max_pool_indices_1d_3d_and_ceil():
    for xs, attrs in [POOL_CASES[0], POOL_CASES[6], CEIL_CASES[3]]:
        x = rand(*xs)
        attrs = dict(attrs, ceil_mode=1) if "dilations" in attrs else attrs
        expected = ort_expected("MaxPool", {"x": x}, 2, opset=12, **attrs)
        assert_matches_reference("MaxPool", {"x": x}, 2, opset=12, expected=expected, **attrs)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.float16])
def test_max_pool_dtypes(dtype):
    # The ReferenceEvaluator pads integers with NaN (fails) and float16 with the wrong shape.
    x = (RNG.standard_normal((1, 2, 5, 5)) * 50).astype(dtype)
    attrs = dict(kernel_shape=[2, 2], pads=[1, 1, 0, 0])
    assert_matches_reference(
        "MaxPool", {"x": x}, opset=12, expected=ort_expected("MaxPool", {"x": x}, opset=12, **attrs), **attrs
    )


@pytest.mark.parametrize("opset,p", [(1, 2.0), (1, 3.0), (2, 2), (11, 3), (18, 1), (22, 2)])
def test_lp_pool(opset, p):
    x = rand(1, 2, 6, 5)
    attrs = dict(kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 1, 1], p=p)
    # Reference: sum(|x|^p)^(1/p) over each window, pads contributing zeros.
    padded = np.pad(np.abs(x).astype(np.float64) ** p, ((0, 0), (0, 0), (1, 1), (0, 1)))
    expected = np.stack(
        [np.stack([padded[..., i : i + 3, j : j + 2].sum((-2, -1)) for j in range(5)], -1) for i in range(0, 5, 2)], -2
    ) ** (1.0 / p)
    assert_matches_reference(
        "LpPool", {"x": x}, opset=opset, expected=[expected.astype(np.float32)], rtol=1e-5, atol=1e-5, **attrs
    )


@pytest.mark.parametrize(
    "op,opset,fn",
    [
        ("GlobalAveragePool", 1, np.mean),
        ("GlobalAveragePool", 22, np.mean),
        ("GlobalMaxPool", 1, np.max),
        ("GlobalMaxPool", 22, np.max),
    ],
)
@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 3, 4, 5), (1, 2, 3, 4, 2)])
def test_global_pools(op, opset, fn, shape):
    # numpy, not the ReferenceEvaluator: its GlobalMaxPool drops axes for 1-D and 3-D inputs.
    axes = tuple(range(2, len(shape)))
    assert_matches_reference(op, {"x": rand(*shape)}, opset=opset, expected=lambda x: [fn(x, axis=axes, keepdims=True)])


@pytest.mark.parametrize("opset,p", [(1, 2.0), (1, 3.0), (2, 2), (2, 3), (22, 1)])
def test_global_lp_pool(opset, p):
    x = rand(2, 3, 4, 5)
    expected = (np.abs(x.astype(np.float64)) ** p).sum((2, 3), keepdims=True) ** (1.0 / p)
    assert_matches_reference("GlobalLpPool", {"x": x}, opset=opset, p=p, expected=[expected.astype(np.float32)])


@pytest.mark.parametrize(
    "op,attrs,window_sum",
    [
        ("AveragePool", dict(kernel_shape=[3]), lambda v: (v[..., :-2] + v[..., 1:-1] + v[..., 2:]) / 3),
        (
            "LpPool",
            dict(kernel_shape=[2], p=3),
            lambda v: (np.abs(v[..., :-1]) ** 3 + np.abs(v[..., 1:]) ** 3) ** (1 / 3),
        ),
        ("GlobalLpPool", dict(p=3), lambda v: (np.abs(v) ** 3).sum(-1, keepdims=True) ** (1 / 3)),
    ],
)
def test_half_precision_pools_round_once(op, attrs, window_sum):
    # Summed, powered and divided in float32, rounded to float16 once (as onnxruntime does):
    # summed in float16, 36 of 40 such draws were a unit in the last place off.
    x = (RNG.standard_normal((4, 3, 9)) * 2).astype(np.float16)
    want = window_sum(x.astype(np.float64)).astype(np.float16)
    got = run_jonnx(node_model(op, {"x": x}, opset=22, **attrs), {"x": x})[0]
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    "op,attrs",
    [
        ("AveragePool", dict(kernel_shape=[2, 3], strides=[2, 1], pads=[1, 0, 0, 1], count_include_pad=0, ceil_mode=1)),
        ("MaxPool", dict(kernel_shape=[2, 2], strides=[1, 2], pads=[0, 1, 1, 0], dilations=[2, 1])),
        ("LpPool", dict(kernel_shape=[2, 2], strides=[2, 1], p=3)),
        ("GlobalLpPool", dict(p=2)),
        ("GlobalAveragePool", dict()),
        ("GlobalMaxPool", dict()),
    ],
)
def test_pool_grads(op, attrs):
    check_op_grads(op, {"x": rand(1, 1, 5, 4)}, opset=22, **attrs)


def test_lp_pool_grad_finite_at_zero():
    model = node_model("LpPool", {"x": np.zeros((1, 1, 2, 2), np.float32)}, opset=22, kernel_shape=[2, 2], p=2)
    m = jonnx.load(model)
    grad = jax.grad(lambda x: m.apply(m.params, x)[0].sum())(np.zeros((1, 1, 2, 2), np.float32))
    assert np.all(np.isfinite(np.asarray(grad)))


def test_pool_window_larger_than_input_is_an_error():
    inputs = {"x": rand(1, 1, 2, 2)}
    with pytest.raises(errors.NodeError, match="window spans 3"):
        run_jonnx(node_model("MaxPool", inputs, opset=22, kernel_shape=[3, 3]), inputs)


# ----------------------------------------------------------------------------- MaxUnpool


@pytest.mark.parametrize("opset", [9, 11, 22])
def test_max_unpool_inverts_max_pool(opset):
    x = rand(2, 3, 4, 6)
    attrs = dict(kernel_shape=[2, 2], strides=[2, 2])
    y, idx = ort_expected("MaxPool", {"x": x}, 2, opset=12, **attrs)
    expected = np.zeros(x.size, np.float32)
    expected[idx.reshape(-1)] = y.reshape(-1)
    assert_matches_reference(
        "MaxUnpool", {"x": y, "i": idx}, opset=opset, expected=[expected.reshape(x.shape)], **attrs
    )


def test_max_unpool_output_shape_indexes_the_output():
    # The indices address the flattened output_shape tensor (the MaxPool input they came
    # from), as in onnxruntime; the ReferenceEvaluator uses the inferred shape instead.
    x = rand(1, 2, 5, 5)
    attrs = dict(kernel_shape=[2, 2], strides=[2, 2])
    y, idx = ort_expected("MaxPool", {"x": x}, 2, opset=12, **attrs)
    inputs = {"x": y, "i": idx, "shape": np.array(x.shape, np.int64)}
    expected = ort_expected("MaxUnpool", inputs, opset=11, **attrs)
    got = assert_matches_reference("MaxUnpool", inputs, opset=11, expected=expected, initializers=["shape"], **attrs)
    assert got[0].shape == x.shape


@pytest.mark.parametrize(
    "op,inputs,attrs,match",
    [
        (
            "MaxUnpool",
            {"x": rand(1, 1, 2, 2), "i": np.zeros((1, 1, 2, 3), np.int64)},
            dict(kernel_shape=[2, 2]),
            "must have X's shape",
        ),
        ("AveragePool", {"x": rand(1, 1, 4, 4)}, dict(kernel_shape=[2]), "kernel_shape"),
    ],
)
def test_bad_inputs_are_errors(op, inputs, attrs, match):
    model = node_model(op, inputs, opset=22, **attrs)
    with pytest.raises(errors.NodeError, match=match):
        run_jonnx(model, inputs)

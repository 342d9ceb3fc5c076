"""Neural-network core ops (conv, pooling, products) against the ReferenceEvaluator,
onnxruntime and numpy, over opsets, geometries and dtypes, plus gradients."""

from __future__ import annotations

import jax
import numpy as np
import onnxruntime as ort
import pytest

import jonnx
from jonnx import errors
from tests.ops._harness import assert_matches_reference, check_op_grads, node_model, run_jonnx, run_reference

RNG = np.random.default_rng(0)


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def ort_expected(op_type, inputs, n_outputs=1, *, opset, **attrs):
    """onnxruntime's outputs for a one-node model (used where the ReferenceEvaluator errs)."""
    model = node_model(op_type, inputs, n_outputs, opset=opset, **attrs)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {k: np.asarray(v) for k, v in inputs.items() if v is not None}
    return session.run(None, feeds)


# ----------------------------------------------------------------------------- Conv

CONV_CASES = [
    # (x shape, w shape, attrs)
    ((1, 2, 7), (3, 2, 3), dict(pads=[1, 2], strides=[2])),
    ((2, 3, 6, 5), (4, 3, 3, 2), dict()),
    ((2, 3, 6, 5), (4, 3, 3, 3), dict(pads=[1, 0, 2, 1], strides=[2, 1], dilations=[1, 2])),
    ((1, 4, 7, 7), (6, 2, 3, 3), dict(group=2, auto_pad="SAME_UPPER", strides=[2, 2])),
    ((1, 4, 6, 7), (4, 1, 2, 3), dict(group=4, auto_pad="SAME_LOWER", strides=[2, 3])),
    ((1, 2, 6, 6), (2, 2, 3, 3), dict(auto_pad="VALID", strides=[2, 2], kernel_shape=[3, 3])),
    ((1, 2, 5, 4, 6), (3, 2, 2, 3, 2), dict(pads=[1, 0, 1, 0, 1, 1], strides=[1, 2, 2])),
]


OPSETS = (1, 11, 22)


@pytest.mark.parametrize("case", range(len(CONV_CASES)))
def test_conv(case):
    xs, ws, attrs = CONV_CASES[case]
    opset = OPSETS[case % 3]  # every geometry at one opset: the three versions share semantics
    inputs = {"x": rand(*xs), "w": rand(*ws), "b": rand(ws[0])}
    assert_matches_reference("Conv", inputs, opset=opset, rtol=1e-4, atol=1e-5, **attrs)


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_conv_dtypes_without_bias(dtype):
    inputs = {"x": rand(1, 2, 5, 5, dtype=dtype), "w": rand(3, 2, 3, 3, dtype=dtype)}
    tol = 2e-2 if dtype == np.float16 else 1e-10
    # float16 expected value: the float32 reference result rounded to float16.
    expected = None
    if dtype == np.float16:
        expected = [
            ort_expected("Conv", {k: v.astype(np.float32) for k, v in inputs.items()}, opset=22, pads=[1, 1, 1, 1])[
                0
            ].astype(np.float16)
        ]
    assert_matches_reference("Conv", inputs, opset=22, expected=expected, rtol=tol, atol=tol, pads=[1, 1, 1, 1])


def test_conv_is_one_xla_convolution():
    model = node_model(
        "Conv",
        {"x": rand(1, 4, 8, 8), "w": rand(8, 2, 3, 3), "b": rand(8)},
        opset=22,
        group=2,
        pads=[1, 1, 1, 1],
        initializers=["w", "b"],
    )
    m = jonnx.load(model)
    jaxpr = jax.make_jaxpr(lambda p, x: m.apply(p, x))(m.params, rand(1, 4, 8, 8))
    prims = [str(e.primitive) for e in jaxpr.jaxpr.eqns]
    assert prims.count("conv_general_dilated") == 1


def test_conv_grads():
    inputs = {"x": rand(1, 2, 4, 4), "w": rand(2, 1, 2, 3), "b": rand(2)}
    check_op_grads("Conv", inputs, opset=22, group=2, strides=[2, 1], pads=[1, 0, 0, 1], dilations=[1, 2])


@pytest.mark.parametrize(
    "attrs,match",
    [
        (dict(group=3), "group=3"),
        (dict(kernel_shape=[2, 2]), "kernel_shape"),
        (dict(auto_pad="SAME"), "auto_pad"),
        (dict(pads=[1, 1]), "pads"),
    ],
)
def test_conv_bad_attributes(attrs, match):
    inputs = {"x": rand(1, 4, 5, 5), "w": rand(2, 4, 3, 3)}
    model = node_model("Conv", inputs, opset=22, **attrs)
    with pytest.raises(errors.NodeError, match=match):
        run_jonnx(model, inputs)


# ----------------------------------------------------------------------------- ConvTranspose

CONVT_CASES = [
    ((1, 2, 5), (2, 3, 3), dict(strides=[2])),
    ((1, 2, 3, 4), (2, 3, 3, 3), dict(strides=[3, 2], pads=[1, 0, 2, 1], output_padding=[1, 1])),
    ((1, 2, 3, 3), (2, 2, 3, 3), dict(strides=[2, 2], dilations=[2, 1])),
    ((2, 4, 3, 3), (4, 1, 2, 2), dict(group=2, strides=[2, 2])),
    ((1, 2, 3, 3), (2, 3, 3, 3), dict(strides=[2, 2], output_shape=[8, 7])),
    ((1, 2, 3, 3), (2, 3, 3, 3), dict(strides=[2, 2], auto_pad="SAME_UPPER")),
    ((1, 2, 3, 3), (2, 3, 2, 2), dict(strides=[2, 2], auto_pad="SAME_LOWER")),
    ((1, 2, 6, 6), (2, 3, 3, 3), dict(pads=[3, 2, 4, 3])),  # pads wider than the kernel crop
    ((1, 1, 2, 2, 2), (1, 2, 2, 2, 2), dict(strides=[2, 1, 2])),
]


@pytest.mark.parametrize("case", range(len(CONVT_CASES)))
def test_conv_transpose(case):
    xs, ws, attrs = CONVT_CASES[case]
    opset = OPSETS[case % 3]
    inputs = {"x": rand(*xs), "w": rand(*ws), "b": rand(ws[1] * attrs.get("group", 1))}
    # The ReferenceEvaluator ignores `group` and crops pads wider than the kernel wrongly;
    # onnxruntime implements both per the spec.
    expected = ort_expected("ConvTranspose", inputs, opset=opset, **attrs) if case in (3, 7) else None
    assert_matches_reference("ConvTranspose", inputs, opset=opset, expected=expected, rtol=1e-4, atol=1e-5, **attrs)


def _spec_pads(total, small_first):
    """Begin/end pads splitting each odd ``total`` as a ConvTranspose version's text says."""
    small = [t // 2 for t in total]
    big = [t - t // 2 for t in total]
    return (small + big) if small_first else (big + small)


@pytest.mark.parametrize("opset", [1, 10, 11, 22])
@pytest.mark.parametrize("auto_pad", ["NOTSET", "SAME_UPPER", "SAME_LOWER"])
def test_conv_transpose_output_shape_splits_odd_padding_per_version(opset, auto_pad):
    # total_padding = 2 * (3 - 1) + 3 - output_shape = (1, 2, 3) per axis. ConvTranspose-1's
    # text: "If (auto_pads != SAME_UPPER): pads[start] = total/2; pads[end] = total - total/2,
    # Else the reverse"; ConvTranspose-11's: the reverse of that. onnxruntime uses the opset-11
    # rule everywhere, so the expectation is the spec's own pads, made explicit.
    inputs = {"x": rand(1, 2, 3, 3, 3), "w": rand(2, 3, 3, 3, 3)}
    output_shape, total = [6, 5, 4], [1, 2, 3]
    small_first = (auto_pad != "SAME_UPPER") if opset < 11 else (auto_pad == "SAME_UPPER")
    pads = _spec_pads(total, small_first)
    explicit = node_model("ConvTranspose", inputs, opset=opset, strides=[2, 2, 2], pads=pads)
    want = run_reference(explicit, inputs)
    assert want[0].shape == (1, 3, *output_shape)
    if opset >= 11:  # onnxruntime follows the opset-11 text: check the expectation against it
        np.testing.assert_allclose(
            want[0],
            ort_expected(
                "ConvTranspose", inputs, opset=opset, strides=[2, 2, 2], output_shape=output_shape, auto_pad=auto_pad
            )[0],
            rtol=1e-5,
            atol=1e-5,
        )
    assert_matches_reference(
        "ConvTranspose",
        inputs,
        opset=opset,
        expected=want,
        rtol=1e-5,
        atol=1e-5,
        strides=[2, 2, 2],
        output_shape=output_shape,
        auto_pad=auto_pad,
    )


def test_conv_transpose_grads():
    inputs = {"x": rand(1, 2, 2, 2), "w": rand(2, 1, 2, 3), "b": rand(1)}
    check_op_grads("ConvTranspose", inputs, opset=22, strides=[2, 2], pads=[1, 0, 0, 1], output_padding=[1, 0])


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


# ----------------------------------------------------------------------------- products


@pytest.mark.parametrize(
    "opset,trans_a,trans_b,c_shape",
    [
        (7, 0, 0, (3, 5)),
        (9, 1, 0, (5,)),
        (11, 0, 1, (1, 5)),
        (13, 1, 1, (3, 1)),
        (13, 0, 0, ()),
    ],
)
def test_gemm(opset, trans_a, trans_b, c_shape):
    a = rand(*((4, 3) if trans_a else (3, 4)))
    b = rand(*((5, 4) if trans_b else (4, 5)))
    inputs = {"a": a, "b": b, "c": rand(*c_shape)}
    assert_matches_reference(
        "Gemm", inputs, opset=opset, transA=trans_a, transB=trans_b, alpha=0.5, beta=2.0, rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("trans_a", [0, 1])
def test_gemm_one_row_against_transposed_b(trans_a):
    # A single row with transB (a classifier at batch 1) is computed as B @ a.T: same values
    # and gradients as onnxruntime's and finite differences'.
    a = rand(*((6, 1) if trans_a else (1, 6)))
    inputs = {"a": a, "b": rand(5, 6), "c": rand(5)}
    assert_matches_reference("Gemm", inputs, opset=13, transA=trans_a, transB=1, alpha=0.5, rtol=1e-5, atol=1e-5)
    check_op_grads("Gemm", inputs, opset=13, transA=trans_a, transB=1, alpha=0.5)


@pytest.mark.parametrize("opset", [11, 13])
def test_gemm_without_c(opset):
    assert_matches_reference("Gemm", {"a": rand(3, 4), "b": rand(4, 2), "c": None}, opset=opset, alpha=3.0)


@pytest.mark.parametrize("opset", [1, 6])
def test_gemm_legacy_broadcast(opset):
    # Opsets 1-6: C broadcasts only with broadcast=1 (changelog); numpy gives the value.
    a, b, c = rand(3, 4), rand(4, 5), rand(5)
    assert_matches_reference(
        "Gemm",
        {"a": a, "b": b, "c": c},
        opset=opset,
        broadcast=1,
        beta=0.5,
        expected=[a @ b + 0.5 * c],
        rtol=1e-5,
        atol=1e-5,
    )
    assert_matches_reference(
        "Gemm",
        {"a": a, "b": b, "c": rand(3, 5)},
        opset=opset,
        rtol=1e-5,
        atol=1e-5,
        expected=lambda a, b, c: [a @ b + c],
    )
    inputs = {"a": a, "b": b, "c": c}
    with pytest.raises(errors.NodeError, match="broadcast=1"):
        run_jonnx(node_model("Gemm", inputs, opset=opset), inputs)


def test_gemm_bad_c_is_an_error():
    inputs = {"a": rand(3, 4), "b": rand(4, 5), "c": rand(2, 5)}
    with pytest.raises(errors.NodeError, match="does not broadcast"):
        run_jonnx(node_model("Gemm", inputs, opset=13), inputs)


@pytest.mark.parametrize(
    "opset,dtype,shapes",
    [
        (1, np.float32, ((3, 4), (4, 5))),
        (9, np.float64, ((4,), (4, 5))),
        (13, np.int32, ((3, 4), (4,))),
        (13, np.int64, ((4,), (4,))),
        (9, np.int64, ((2, 1, 3, 4), (5, 4, 2))),
        (13, np.float32, ((2, 3, 4), (4, 2))),
    ],
)
def test_matmul(opset, shapes, dtype):
    a = (RNG.standard_normal(shapes[0]) * 5).astype(dtype)
    b = (RNG.standard_normal(shapes[1]) * 5).astype(dtype)
    assert_matches_reference("MatMul", {"a": a, "b": b}, opset=opset, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "equation,shapes",
    [
        ("ij,jk->ik", [(3, 4), (4, 5)]),
        ("bij, bjk -> bik", [(2, 3, 4), (2, 4, 5)]),
        ("ii->i", [(4, 4)]),
        ("ij", [(3, 4)]),
        ("ji", [(3, 4)]),
        ("...ij,...jk", [(2, 3, 4), (4, 5)]),
        ("i,i", [(5,), (5,)]),
        ("abc,cd,de->abe", [(2, 3, 4), (4, 5), (5, 2)]),
    ],
)
def test_einsum(equation, shapes):
    opset = 28 if "," in equation else 12
    inputs = {f"x{i}": rand(*s) for i, s in enumerate(shapes)}
    assert_matches_reference("Einsum", inputs, opset=opset, equation=equation, rtol=1e-5, atol=1e-5)


def test_einsum_operand_count_is_checked():
    inputs = {"x0": rand(3, 4)}
    with pytest.raises(errors.NodeError, match="names 2 operands"):
        run_jonnx(node_model("Einsum", inputs, opset=12, equation="ij,jk->ik"), inputs)


@pytest.mark.parametrize(
    "op,inputs,attrs",
    [
        ("Gemm", {"a": rand(4, 3), "b": rand(2, 4), "c": rand(2)}, dict(transA=1, transB=1, alpha=0.7, beta=1.3)),
        ("MatMul", {"a": rand(2, 3, 4), "b": rand(4, 2)}, {}),
        ("Einsum", {"a": rand(2, 3), "b": rand(3, 4)}, dict(equation="ij,jk->ki")),
    ],
)
def test_product_grads(op, inputs, attrs):
    check_op_grads(op, inputs, opset=13 if op != "Einsum" else 12, **attrs)


# ----------------------------------------------------------------------------- Col2Im, DeformConv


@pytest.mark.parametrize(
    "image,block,attrs",
    [
        ((5, 5), (2, 2), {}),
        ((5, 6), (2, 3), dict(strides=[2, 1], pads=[1, 0, 1, 2], dilations=[1, 2])),
        ((6,), (3,), dict(strides=[2])),
    ],
)
def test_col2im(image, block, attrs):
    n, c = 2, 3
    nd = len(image)
    strides = attrs.get("strides", [1] * nd)
    dil = attrs.get("dilations", [1] * nd)
    pads = attrs.get("pads", [0] * 2 * nd)
    out = [
        (i + pads[d] + pads[d + nd] - (k - 1) * dil[d] - 1) // strides[d] + 1
        for d, (i, k) in enumerate(zip(image, block))
    ]
    x = rand(n, c * int(np.prod(block)), int(np.prod(out)))
    inputs = {"x": x, "image": np.array(image, np.int64), "block": np.array(block, np.int64)}
    expected = None
    if nd == 1:
        # numpy: scatter-add each column entry back to its image position.
        y = np.zeros((n, c, image[0] + pads[0] + pads[1]), np.float32)
        cols = x.reshape(n, c, block[0], out[0])
        for k in range(block[0]):
            for o in range(out[0]):
                y[:, :, o * strides[0] + k * dil[0]] += cols[:, :, k, o]
        expected = [y[:, :, pads[0] : pads[0] + image[0]]]
    assert_matches_reference(
        "Col2Im", inputs, opset=18, initializers=["image", "block"], expected=expected, rtol=1e-5, atol=1e-5, **attrs
    )


@pytest.mark.parametrize(
    "opset,attrs,with_mask,with_bias",
    [
        (19, {}, False, False),
        (22, dict(pads=[1, 1, 1, 1], strides=[2, 1]), True, True),
        (22, dict(group=2, offset_group=2, dilations=[1, 2]), True, False),
    ],
)
def test_deform_conv(opset, attrs, with_mask, with_bias):
    group, offset_group = attrs.get("group", 1), attrs.get("offset_group", 1)
    # Small shapes: the ReferenceEvaluator samples each output cell in a Python loop.
    x, w = rand(1, 2, 3, 4), rand(2, 2 // group, 2, 2)
    strides, dil, pads = attrs.get("strides", [1, 1]), attrs.get("dilations", [1, 1]), attrs.get("pads", [0] * 4)
    out = [(s + pads[d] + pads[d + 2] - dil[d] - 1) // strides[d] + 1 for d, s in enumerate((3, 4))]
    inputs = {
        "x": x,
        "w": w,
        "offset": rand(1, offset_group * 8, *out),
        "b": rand(2) if with_bias else None,
        "mask": RNG.uniform(0, 1, (1, offset_group * 4, *out)).astype(np.float32) if with_mask else None,
    }
    assert_matches_reference("DeformConv", inputs, opset=opset, rtol=1e-4, atol=1e-5, **attrs)


def test_deform_conv_grads():
    inputs = {"x": rand(1, 1, 3, 3), "w": rand(1, 1, 2, 2), "offset": rand(1, 8, 2, 2) * 0.3}
    check_op_grads("DeformConv", inputs, opset=22, wrt=["x", "w"])


@pytest.mark.parametrize(
    "op,inputs,attrs,match",
    [
        ("ConvTranspose", {"x": rand(1, 3, 4, 4), "w": rand(3, 2, 3, 3)}, dict(group=2), "divisible by group=2"),
        (
            "MaxUnpool",
            {"x": rand(1, 1, 2, 2), "i": np.zeros((1, 1, 2, 3), np.int64)},
            dict(kernel_shape=[2, 2]),
            "must have X's shape",
        ),
        (
            "DeformConv",
            {"x": rand(1, 2, 4, 4), "w": rand(2, 2, 2, 2), "offset": rand(1, 8, 2, 2)},
            {},
            r"differs from the output shape \(3, 3\)",
        ),
        ("AveragePool", {"x": rand(1, 1, 4, 4)}, dict(kernel_shape=[2]), "kernel_shape"),
    ],
)
def test_bad_inputs_are_errors(op, inputs, attrs, match):
    model = node_model(op, inputs, opset=22, **attrs)
    with pytest.raises(errors.NodeError, match=match):
        run_jonnx(model, inputs)


def test_col2im_block_count_is_checked():
    inputs = {"x": rand(1, 4, 10), "image": np.array([4, 4], np.int64), "block": np.array([2, 2], np.int64)}
    model = node_model("Col2Im", inputs, opset=18, initializers=["image", "block"])
    with pytest.raises(errors.NodeError, match="10 blocks"):
        run_jonnx(model, inputs)

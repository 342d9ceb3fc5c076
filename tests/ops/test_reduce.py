"""Reductions and ArgMax/ArgMin against the ReferenceEvaluator / numpy, over opsets and dtypes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jonnx.ops
from jonnx import errors
from tests.ops._harness import (
    assert_matches_reference,
    assert_rounded_once,
    check_op_grads,
    node_model,
    ort_expected,
    run_jonnx,
)

RNG = np.random.default_rng(0)

REDUCE_OPS = [
    "ReduceSum",
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceSumSquare",
]
# The first opset at which each op takes its axes as an input rather than an attribute.
AXES_INPUT_FROM = {op: 18 for op in REDUCE_OPS} | {"ReduceSum": 13}


def _data(op, shape, dtype=np.float32):
    if op == "ReduceLogSum":  # log of a sum: keep it positive
        return RNG.uniform(0.5, 2.0, shape).astype(dtype)
    if op == "ReduceProd":
        return RNG.uniform(0.5, 1.5, shape).astype(dtype)
    return RNG.standard_normal(shape).astype(dtype)


def _check(op, x, axes, opset, keepdims=1, **kw):
    """Run ``op`` with ``axes`` as an attribute or a static input, as ``opset`` requires."""
    if opset >= AXES_INPUT_FROM[op]:
        inputs = {"x": x, "axes": None if axes is None else np.array(axes, np.int64)}
        return assert_matches_reference(op, inputs, opset=opset, keepdims=keepdims, initializers=["axes"], **kw)
    attrs = {} if axes is None else {"axes": list(axes)}
    return assert_matches_reference(op, {"x": x}, opset=opset, keepdims=keepdims, **attrs, **kw)


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize(
    "opset,axes,keepdims",
    [
        (1, (1,), 1),
        (11, (0, 2), 0),
        (13, None, 1),
        (18, (0, 2), 0),
        (20, None, 0),
    ],
)
def test_reduce_float32(op, opset, axes, keepdims):
    _check(op, _data(op, (3, 4, 5)), axes, opset, keepdims, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("opset", [11, 18])
def test_reduce_negative_axes(op, opset):
    _check(op, _data(op, (2, 3, 4)), (-1, -3), opset)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceProd", "ReduceSumSquare"])
@pytest.mark.parametrize("dtype", [np.float64, np.float16, np.int32, np.int64])
def test_reduce_dtypes(op, dtype):
    # The output keeps the input's type (T -> T). The ReferenceEvaluator follows numpy and
    # widens int32 sums and products to int64, so integer cases are checked against numpy.
    x = (RNG.integers(1, 4, (3, 4)) if np.dtype(dtype).kind == "i" else _data(op, (3, 4))).astype(dtype)
    tol = 2e-3 if dtype == np.float16 else 1e-6
    expected = None
    if np.dtype(dtype).kind == "i":
        fns = {
            "ReduceSum": np.sum,
            "ReduceMax": np.max,
            "ReduceProd": np.prod,
            "ReduceSumSquare": lambda x, **kw: np.sum(x * x, **kw),
            "ReduceMean": lambda x, **kw: np.trunc(np.mean(x, **kw)),
        }
        expected = [fns[op](x, axis=1, keepdims=True).astype(dtype)]
    _check(op, x, (1,), 18, rtol=tol, atol=tol, expected=expected)


@pytest.mark.parametrize(
    "op,expected",
    [
        ("ReduceSum", 0.0),
        ("ReduceProd", 1.0),
        ("ReduceMax", -np.inf),
        ("ReduceMin", np.inf),
        ("ReduceL1", 0.0),
        ("ReduceL2", 0.0),
        ("ReduceSumSquare", 0.0),
        ("ReduceLogSum", -np.inf),
        ("ReduceLogSumExp", -np.inf),
    ],
)
def test_reduce_empty_set_gives_identity(op, expected):
    # The spec (opset 18/20 docs) defines each empty reduction; numpy raises for max/min.
    x = np.zeros((2, 0, 4), np.float32)
    want = np.full((2, 1, 4), expected, np.float32)
    _check(op, x, (1,), 20 if op in ("ReduceMax", "ReduceMin") else 18, expected=[want])


@pytest.mark.parametrize(
    "op,dtype,expected",
    [
        ("ReduceMax", np.int32, np.iinfo(np.int32).min),
        ("ReduceMin", np.int64, np.iinfo(np.int64).max),
        ("ReduceMax", np.bool_, False),
        ("ReduceMin", np.bool_, True),
    ],
)
def test_reduce_empty_set_integer_and_bool(op, dtype, expected):
    x = np.zeros((2, 0), dtype)
    _check(op, x, (1,), 20, keepdims=0, expected=[np.full((2,), expected, dtype)])


@pytest.mark.parametrize("op,fn", [("ReduceMax", np.any), ("ReduceMin", np.all)])
def test_reduce_max_min_bool(op, fn):
    x = RNG.integers(0, 2, (3, 5)).astype(bool)
    _check(op, x, (1,), 20, expected=[fn(x, axis=1, keepdims=True)])


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_noop_with_empty_axes_applies_the_elementwise_part(op):
    # With empty axes and noop_with_empty_axes=1 nothing is reduced, but the op's elementwise
    # part still applies (|x| for ReduceL1/L2, x^2 for ReduceSumSquare, log x for
    # ReduceLogSum), as the ReferenceEvaluator and onnxruntime compute it.
    import onnxruntime as ort

    opset = AXES_INPUT_FROM[op]
    x = _data(op, (2, 3))
    for axes in ((), None):
        inputs = {"x": x, "axes": None if axes is None else np.array(axes, np.int64)}
        model = node_model(op, inputs, opset=opset, initializers=["axes"], noop_with_empty_axes=1)
        (want,) = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
        _check(op, x, axes, opset, noop_with_empty_axes=1)  # the ReferenceEvaluator
        _check(op, x, axes, opset, noop_with_empty_axes=1, expected=[want])


@pytest.mark.parametrize("op,opset", [("ReduceSum", 13), ("ReduceMean", 18)])
def test_empty_axes_without_noop_reduces_everything(op, opset):
    x = _data(op, (2, 3))
    _check(op, x, (), opset)


def test_log_sum_exp_is_stable_for_large_inputs():
    x = np.array([[1000.0, 1000.0, 999.0], [-1000.0, -1001.0, -np.inf]], np.float32)
    m = x.max(axis=1, keepdims=True)
    want = (np.log(np.exp(x - m).sum(axis=1, keepdims=True)) + m).astype(np.float32)
    assert np.all(np.isfinite(want))
    _check("ReduceLogSumExp", x, (1,), 18, expected=[want])


def test_log_sum_exp_all_minus_inf_slice():
    x = np.full((2, 3), -np.inf, np.float32)
    _check("ReduceLogSumExp", x, (1,), 18, expected=[np.full((2, 1), -np.inf, np.float32)])


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_gradients(op):
    x = _data(op, (3, 4))
    if op in ("ReduceMax", "ReduceMin", "ReduceL1"):  # away from ties and kinks
        x = (np.arange(12).reshape(3, 4) + 0.5 - 6).astype(np.float32) * RNG.permutation([1, -1] * 6).reshape(3, 4)
    check_op_grads(op, {"x": x, "axes": np.array([1], np.int64)}, opset=18, initializers=["axes"])


def test_reduce_l2_gradient_is_finite_at_zero():
    with jax.enable_x64(True):
        x = jnp.zeros((2, 3), jnp.float64).at[1].set(jnp.array([3.0, 0.0, 4.0]))
        f = lambda x: jonnx.ops.ReduceL2(x, np.array([1]), opset=18).sum()
        g = jax.grad(f)(x)
    np.testing.assert_array_equal(np.asarray(g[0]), 0.0)
    np.testing.assert_allclose(np.asarray(g[1]), [0.6, 0.0, 0.8])


def test_reduce_repeated_axes_is_an_error():
    model = node_model("ReduceSum", {"x": np.ones((2, 3), np.float32)}, opset=11, axes=[1, -1])
    with pytest.raises(errors.NodeError, match="repeat"):
        run_jonnx(model, {"x": np.ones((2, 3), np.float32)})


def test_reduce_axis_out_of_range_is_an_error():
    model = node_model("ReduceMean", {"x": np.ones((2, 3), np.float32)}, opset=13, axes=[2])
    with pytest.raises(errors.NodeError, match="out of range"):
        run_jonnx(model, {"x": np.ones((2, 3), np.float32)})


# -- ArgMax / ArgMin ---------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize(
    "opset,axis,keepdims,dtype",
    [
        (1, 0, 1, np.float32),
        (11, -1, 0, np.int32),
        (12, 1, 1, np.float16),
        (13, 2, 0, np.float64),
    ],
)
def test_arg_reductions(op, opset, axis, keepdims, dtype):
    x = RNG.permutation(24).reshape(2, 3, 4).astype(dtype)
    out = assert_matches_reference(op, {"x": x}, opset=opset, axis=axis, keepdims=keepdims)
    assert out[0].dtype == np.int64


@pytest.mark.parametrize("op,find", [("ArgMax", np.argmax), ("ArgMin", np.argmin)])
@pytest.mark.parametrize("select_last_index", [0, 1])
def test_arg_select_last_index_with_ties(op, find, select_last_index):
    x = np.array([[2, 5, 5, 1, 1], [7, 7, 0, 0, 7]], np.float32)
    if select_last_index:
        want = x.shape[1] - 1 - find(x[:, ::-1], axis=1)
    else:
        want = find(x, axis=1)
    assert_matches_reference(
        op,
        {"x": x},
        opset=13,
        axis=-1,
        keepdims=0,
        select_last_index=select_last_index,
        expected=[want.astype(np.int64)],
    )


def test_arg_without_x64_returns_the_index_dtype():
    out = jonnx.ops.ArgMax(np.array([[1.0, 3.0], [4.0, 2.0]], np.float32), axis=1, keepdims=0)
    assert out.dtype == np.dtype(jax.dtypes.canonicalize_dtype(np.int64))
    np.testing.assert_array_equal(out, [1, 0])


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_arg_over_an_empty_axis_of_an_empty_output(op, keepdims):
    # (0, 0, 3): reducing axis 0 leaves the output empty too, so there is no index to give
    # and onnxruntime returns the empty result (the ReferenceEvaluator raises, as numpy does).
    inputs = {"x": np.zeros((0, 0, 3), np.float32)}
    want = ort_expected(op, inputs, opset=13, axis=0, keepdims=keepdims)
    assert_matches_reference(op, inputs, opset=13, axis=0, keepdims=keepdims, expected=want)


def test_arg_over_an_empty_axis_with_a_nonempty_output_is_an_error():
    inputs = {"x": np.zeros((2, 0), np.float32)}
    model = node_model("ArgMax", inputs, opset=13, axis=1)
    with pytest.raises(errors.NodeError, match="empty axis 1"):
        run_jonnx(model, inputs)


def test_arg_axis_out_of_range_is_an_error():
    model = node_model("ArgMax", {"x": np.ones((2, 3), np.float32)}, opset=13, axis=2)
    with pytest.raises(errors.NodeError, match="out of range"):
        run_jonnx(model, {"x": np.ones((2, 3), np.float32)})


HALF_REDUCTIONS = {
    "ReduceSum": lambda x: x.sum(axis=1),
    "ReduceProd": lambda x: x.prod(axis=1),  # of factors near 1 (below): 30 of them stay in range
    "ReduceMean": lambda x: x.mean(axis=1),
    "ReduceL2": lambda x: np.sqrt((x * x).sum(axis=1)),
    "ReduceSumSquare": lambda x: (x * x).sum(axis=1),
    "ReduceLogSumExp": lambda x: np.log(np.exp(x).sum(axis=1)),
    "ReduceLogSum": lambda x: np.log(np.abs(x).sum(axis=1)),
}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("op", sorted(HALF_REDUCTIONS))
def test_half_precision_composite_reductions_round_once(op, dtype):
    # In float32, rounded once, as onnxruntime: squared or exponentiated in the half type first,
    # float16 ReduceSumSquare and the like were several units in the last place off, and
    # ReduceSum and ReduceProd, which XLA accumulates in the half type, most of the time.
    dtype = jnp.dtype(dtype)
    x = np.random.default_rng(2).standard_normal((40, 30, 5)).astype(dtype)
    if op == "ReduceLogSum":
        x = np.abs(x)
    if op == "ReduceProd":
        x = (x / 2 + 1).astype(dtype)
    inputs = {"x": x, "axes": np.array([1], np.int64)}
    got = run_jonnx(node_model(op, inputs, opset=18, keepdims=0, initializers=["axes"]), {"x": x})[0]
    assert_rounded_once(got, HALF_REDUCTIONS[op](x.astype(np.float64)), dtype, most_off=0.02)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize(("exclusive", "reverse"), [(0, 0), (1, 1)])
def test_half_precision_cumulative_sums_round_once(exclusive, reverse, dtype):
    # Each prefix summed in float32 and rounded once, as onnxruntime does: a float16 running
    # sum over 40 values was a unit or more off in over half of its prefixes.
    dtype = jnp.dtype(dtype)
    x = np.random.default_rng(3).standard_normal((30, 40)).astype(dtype)
    exact = np.cumsum(x.astype(np.float64)[:, ::-1] if reverse else x.astype(np.float64), axis=1)
    if exclusive:
        exact = np.pad(exact[:, :-1], ((0, 0), (1, 0)))
    exact = exact[:, ::-1] if reverse else exact
    inputs = {"x": x, "axis": np.array(1, np.int64)}
    model = node_model("CumSum", inputs, opset=14, exclusive=exclusive, reverse=reverse, initializers=["axis"])
    assert_rounded_once(run_jonnx(model, {"x": x})[0], exact, dtype, most_off=0.02)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_max_by_halves_is_the_maximum(axis):
    # Every length up to 33 (odd ones fold their leftovers in), with NaN, infinities and ties.
    from jonnx.ops.reduce import max_by_halves

    for n in range(1, 34):
        x = RNG.standard_normal((n, n + 1, 3)).astype(np.float32)
        x[0, 0, 0], x[-1, -1, -1] = np.nan, np.inf
        x[..., 1] = -np.inf
        want = np.max(x, axis=axis, keepdims=True)
        np.testing.assert_array_equal(np.asarray(jax.jit(lambda v: max_by_halves(v, axis))(x)), want)

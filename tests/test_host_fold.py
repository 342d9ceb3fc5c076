"""jonnx._host_fold: nodes on known inputs evaluated in numpy must give exactly what JAX's
eager run gives (values, dtypes, shapes), and decline what they cannot do exactly."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import pytest
from jax import lax

import jonnx
from jonnx import _host_fold

I32 = np.array([[2147483647, -7, 0], [5, -2147483648, 3]], np.int32)
I64 = np.array([-3, 0, 4, 2**40], np.int64)
F32 = np.array([[1.5, -0.0, np.inf], [np.nan, 3.25e30, -2.5]], np.float32)
ROUNDING = np.array([2.5, -2.5, 0.49999997, -0.0, 3.5, -1.7, 1e30], np.float32)
B = np.array([[True, False, True], [False, False, True]])

j = jnp.asarray  # every case computes in JAX: numpy on numpy would fold nothing

CASES = {
    "int add wraps": lambda: j(I32) + 1,
    "int sub mul neg abs": lambda: (j(I32) - I32[::-1], j(I32) * 3, -j(I32), jnp.abs(I32)),
    "int division and remainder (toward zero)": lambda: (
        lax.div(j(I32), np.int32(-3)),
        lax.rem(j(I32), np.int32(-3)),
        lax.div(j(I64), np.int64(7)),
        lax.rem(-j(I64), np.int64(7)),
        lax.div(j(np.array([-2147483648], np.int32)), np.int32(-1)),
        j(I32) // 3,
        j(I32) % 3,
    ),
    "int max min": lambda: (jnp.maximum(I32, 0), jnp.minimum(I64, 1)),
    "float add mul (nan, inf, overflow)": lambda: (j(F32) + F32, j(F32) * 0.5, j(F32) * F32),
    "float division and remainder (nan, inf, zero divisors)": lambda: (
        j(F32) / F32[::-1],
        j(F32) / np.zeros((2, 3), np.float32),
        lax.rem(j(F32), np.float32(2.5)),
        j(np.array([1.0, -7.0, 2.0**-1000])) / np.array([3.0, 3.0, 3.0]),
        jnp.true_divide(I32, I32[::-1]),  # conversions and one division in one computation
        jnp.reciprocal(F32),
    ),
    "sqrt (nan, inf, -0.0, negative)": lambda: (
        jnp.sqrt(F32),
        jnp.sqrt(j(np.array([2.0, 1e-300, 3.0]))),
        jnp.sqrt(-1.0 * F32),
    ),
    "floor, ceil, round half to even": lambda: (
        jnp.floor(F32),
        jnp.ceil(ROUNDING),
        jnp.round(ROUNDING),
        lax.round(j(ROUNDING), lax.RoundingMethod.TO_NEAREST_EVEN),
    ),
    "integer powers": lambda: (j(F32) ** 2, j(F32) ** 3, j(ROUNDING) ** 5, j(ROUNDING) ** -2, j(I32) ** 3, j(I64) ** 0),
    "float max min without nan or tied zeros": lambda: (
        jnp.maximum(ROUNDING, -1.0),
        jnp.minimum(ROUNDING, ROUNDING[::-1]),
    ),
    "is finite": lambda: jnp.isfinite(F32),
    "comparisons with nan": lambda: (j(F32) == F32, j(F32) != F32, j(F32) < 1, j(F32) <= 1, j(F32) > 1, j(F32) >= 1),
    "bool logic": lambda: (j(B) & ~j(B), j(B) | B[::-1], j(B) ^ True),
    "int bits": lambda: (j(I32) & 6, j(I32) | 1, ~j(I32)),
    "where": lambda: jnp.where(B, I32, -1),
    "select_n by int": lambda: lax.select_n(np.array([0, 1, 2], np.int32), I64[:3], I64[1:], -I64[:3]),
    "int64 to int32 wraps": lambda: j(I64, jnp.int64).astype(jnp.int32),
    "float64 to float32 rounds": lambda: j(np.array([0.1, 1e-50, 1e300]), jnp.float64).astype(jnp.float32),
    "float to int in range": lambda: j(np.array([-2.7, 2.7, 0.0], np.float32)).astype(jnp.int32),
    "float to bool (nan true)": lambda: j(F32).astype(bool),
    "int to float rounds": lambda: j(np.array([2**53 + 1, -(2**31)], np.int64)).astype(jnp.float32),
    "broadcast, reshape, squeeze, expand": lambda: (
        jnp.broadcast_to(I64[:, None], (4, 3)),
        jnp.reshape(I32, (3, 2)),
        jnp.squeeze(I32[:, None, :], 1),
        jnp.expand_dims(I32, (0, 2)),
    ),
    "transpose, concat, slices": lambda: (jnp.transpose(I32), jnp.concatenate([I32, I32], 1), j(I32)[::-1, 1::2]),
    "iota": lambda: (jnp.arange(7, dtype=jnp.int64), lax.broadcasted_iota(jnp.int32, (2, 3), 1)),
    "float max and min reductions": lambda: (
        jnp.max(ROUNDING[ROUNDING != 0]),
        jnp.min(j(ROUNDING[:3]) + 1),
        jnp.max(np.array([[-0.0, -1.0], [-2.0, -0.0]], np.float32), 1),  # zeros of one sign
        jnp.min(np.array([0.0, 1.0, 0.0], np.float32)),
    ),
    "integer reductions": lambda: (jnp.prod(I64[:3]), jnp.sum(I32, 1), jnp.max(I32), jnp.min(I32, 0)),
    "take with negative and clipped indices": lambda: (
        jnp.take(I64, np.array([[0, -1], [7, 2]]), axis=0, mode="clip"),
        jnp.take(I32, np.array([2, 0]), axis=1),
    ),
    "take of a float table": lambda: jnp.take(F32, np.array([1, 0, 1]), axis=0, mode="clip"),
    "one element per index (GatherElements)": lambda: (
        j(I32).at[np.array([[1], [0]]), np.array([[2, 0, 1], [0, 0, 2]])].get(mode="clip")
    ),
    "structure: None and lists kept": lambda: (j(I32) + 1, None, [j(I64) * 2, ~j(B)]),
    # The guard of Div, Sqrt, Exp, Reciprocal and Log against XLA's rewrites (ops._util.opaque)
    "optimization barriers pass values through": lambda: (
        lax.optimization_barrier(jnp.sqrt(F32)),
        lax.optimization_barrier((j(F32) / F32[::-1], j(I32) + 1)),
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_fold_equals_the_eager_run(name):
    fn = CASES[name]
    with jax.enable_x64(True):
        assert jax.make_jaxpr(fn)().eqns, f"{name}: JAX computes nothing here"
        folded = _host_fold.fold(fn)
        with jax.ensure_compile_time_eval():
            eager = jax.tree_util.tree_map(np.asarray, fn())
    assert folded is not None, f"{name}: not folded on the host"
    assert jax.tree_util.tree_structure(folded) == jax.tree_util.tree_structure(eager)
    for got, want in zip(jax.tree_util.tree_leaves(folded), jax.tree_util.tree_leaves(eager)):
        assert isinstance(got, np.ndarray) and got.flags.writeable
        assert got.dtype == want.dtype and got.shape == want.shape, name
        np.testing.assert_array_equal(got, want, err_msg=name)
        if got.dtype.kind == "f":  # bit for bit: signed zeros and NaNs too
            assert np.array_equal(got.view(f"u{got.itemsize}"), want.view(f"u{want.itemsize}")), name


DECLINED = {
    # Where numpy's answer is not XLA's, or not defined, the caller runs JAX instead.
    "float max (signed zeros, NaN)": lambda: jnp.maximum(F32, 0),
    "float to int of NaN": lambda: j(F32).astype(jnp.int32),
    # A subnormal cast to bool is False in XLA on CPU, True in numpy.
    "subnormal floats": lambda: j(np.array([3.25e-39, 1.0], np.float32)).astype(bool),
    "a product that underflows": lambda: j(np.array([1e-30], np.float32)) * 1e-10,
    "float sum (XLA's order)": lambda: jnp.sum(F32),
    "a float max over NaN": lambda: jnp.max(F32),
    "a float max over both signed zeros": lambda: jnp.max(np.array([-0.0, 0.0, -1.0], np.float32)),
    "bfloat16": lambda: j(F32).astype(jnp.bfloat16),
    "a quotient that underflows": lambda: j(np.array([1e-30], np.float32)) / 1e10,
    "a power through a subnormal square": lambda: j(np.array([1e-20], np.float32)) ** 4,
    "round half away from zero": lambda: lax.round(j(ROUNDING), lax.RoundingMethod.AWAY_FROM_ZERO),
    "transcendental (cos)": lambda: jnp.cos(F32),
    # A scalar divisor is a literal: jax 0.10's eager run divides by its reciprocal, 0.8's not.
    "a float division by a scalar": lambda: j(F32) / 3,
    # Several float operations in one computation: XLA's rewrites round differently.
    "(a * c1) * c2 (XLA: a * (c1 * c2))": lambda: jax.jit(lambda a: (a * 3.1) * 7.3)(ROUNDING),
    "a * b + a * c (XLA: a * (b + c))": lambda: jax.jit(lambda a: a * 3.1 + a * 7.3)(ROUNDING),
    "sqrt(a * a) (XLA: |a|)": lambda: jax.jit(lambda a: jnp.sqrt(a * a))(ROUNDING),
    "a / sqrt(b) (XLA: a * rsqrt(b))": lambda: jax.jit(lambda a: a / jnp.sqrt(a))(ROUNDING),
    "an integer division by zero": lambda: lax.div(j(I32), np.int32(0)),
    "needs a value while tracing": lambda: np.zeros(int(jnp.sum(I32 > 0))),
    "not an array": lambda: {"label": "cat"},
    "a map of Python values (ZipMap's rows)": lambda: [{3: 0.5, 7: 0.25}],
    "a Python number": lambda: (j(I32) + 1, 2.5),
    "the max of nothing (numpy refuses)": lambda: lax.reduce_max(j(I32[:0]), axes=(0,)),
}


@pytest.mark.parametrize("name", list(DECLINED))
def test_fold_declines_what_it_cannot_do_exactly(name):
    with jax.enable_x64(True):
        assert _host_fold.fold(DECLINED[name]) is None


def test_a_model_s_constant_subgraph_folds_on_the_host(monkeypatch):
    # Shape arithmetic (Shape -> Gather -> Unsqueeze -> Concat -> Reshape) and a ConstantOfShape
    # fill: folded at trace time, in numpy (the Mul by a float initializer, a param, is traced).
    calls = []
    evaluate = _host_fold.evaluate

    def recording(traced):
        calls.append(evaluate(traced))
        return calls[-1]

    monkeypatch.setattr(_host_fold, "evaluate", recording)
    h = onnx.helper
    graph = h.make_graph(
        [
            h.make_node("Shape", ["x"], ["s"]),
            h.make_node("Gather", ["s", "minus_one"], ["last"], axis=0),
            h.make_node("Concat", ["minus_one_1d", "last_1d"], ["target"], axis=0),
            h.make_node("Unsqueeze", ["last", "zero"], ["last_1d"]),
            h.make_node("Reshape", ["x", "target"], ["flat"]),
            h.make_node("ConstantOfShape", ["target_fill"], ["fill"], value=h.make_tensor("v", 1, [1], [0.5])),
            h.make_node("Mul", ["fill", "three"], ["scaled"]),
            h.make_node("Add", ["flat", "scaled"], ["y"]),
        ],
        "g",
        [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3, 4])],
        [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [6, 4])],
        [
            onnx.numpy_helper.from_array(np.array(-1, np.int64), "minus_one"),
            onnx.numpy_helper.from_array(np.array([-1], np.int64), "minus_one_1d"),
            onnx.numpy_helper.from_array(np.array([0], np.int64), "zero"),
            onnx.numpy_helper.from_array(np.array([6, 4], np.int64), "target_fill"),
            onnx.numpy_helper.from_array(np.array(3.0, np.float32), "three"),
        ],
    )
    model = jonnx.load(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]))
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    (y,) = model(x)
    np.testing.assert_array_equal(np.asarray(y), x.reshape(6, 4) + 1.5)
    assert len(calls) == 4 and all(c is not None for c in calls), calls


def test_the_trace_gives_the_output_shapes_before_anything_is_computed(monkeypatch):
    # What the interpreter checks against the model's memory limit before folding.
    def computing(*args):
        raise AssertionError("the trace computed something")

    monkeypatch.setattr(_host_fold, "_evaluate", computing)
    with jax.enable_x64(True):
        traced = _host_fold.trace(lambda: (jnp.broadcast_to(I32[:, :1], (2, 1000)), None))
    big, none = traced.shapes
    assert none is None and big.shape == (2, 1000) and big.dtype == np.int32

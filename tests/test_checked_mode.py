"""Checked mode: runtime data that ONNX calls an error fails the run, under jit too."""

from __future__ import annotations

import jax
import numpy as np
import onnx
import onnx.helper as oh
import pytest
from jax.experimental import checkify

import jonnx
from jonnx import errors

I32, I64, F32 = onnx.TensorProto.INT32, onnx.TensorProto.INT64, onnx.TensorProto.FLOAT


def _model(op, inputs, checked, **attrs):
    graph = oh.make_graph(
        [oh.make_node(op, [name for name, _ in inputs], ["y"], name="culprit", **attrs)],
        "g",
        [oh.make_tensor_value_info(name, elem, None) for name, elem in inputs],
        [oh.make_empty_tensor_value_info("y")],
    )
    return jonnx.load(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)]), checked=checked)


CASES = [
    # op, inputs (name, type), attrs, bad feed, message
    ("Div", [("a", I32), ("b", I32)], {}, [np.array([4, 6], np.int32), np.array([2, 0], np.int32)], "division by zero"),
    ("Mod", [("a", I32), ("b", I32)], {}, [np.array([4, 6], np.int32), np.array([3, 0], np.int32)], "modulo by zero"),
    (
        "Mod",
        [("a", I32), ("b", I32)],
        {"fmod": 1},
        [np.array([4, 6], np.int32), np.array([0, 4], np.int32)],
        "modulo by zero",
    ),
    (
        "Gather",
        [("x", F32), ("i", I64)],
        {"axis": 0},
        [np.arange(3, dtype=np.float32), np.array([0, 3])],
        "out of range",
    ),
    ("Gather", [("x", F32), ("i", I64)], {"axis": 0}, [np.arange(3, dtype=np.float32), np.array([-4])], "out of range"),
    (
        "GatherElements",
        [("x", F32), ("i", I64)],
        {"axis": 1},
        [np.ones((2, 2), np.float32), np.array([[0, 2], [1, 0]])],
        "out of range",
    ),
    ("GatherND", [("x", F32), ("i", I64)], {}, [np.ones((2, 2), np.float32), np.array([[0, 5]])], "coordinate 1"),
    (
        "ScatterElements",
        [("x", F32), ("i", I64), ("u", F32)],
        {"axis": 0},
        [np.zeros(3, np.float32), np.array([1, 7]), np.ones(2, np.float32)],
        "out of range",
    ),
    (
        "ScatterND",
        [("x", F32), ("i", I64), ("u", F32)],
        {},
        [np.zeros((2, 2), np.float32), np.array([[2, 0]]), np.ones(1, np.float32)],
        "coordinate 0",
    ),
]


@pytest.mark.parametrize("op,inputs,attrs,feed,message", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_checked_mode_raises_under_jit(op, inputs, attrs, feed, message):
    model = _model(op, inputs, checked=True, **attrs)
    with pytest.raises(errors.NumericCheckError, match=f"'culprit' \\({op}.*{message}"):
        model(*feed)


@pytest.mark.parametrize("op,inputs,attrs,feed,message", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_fast_default_passes_bad_data_without_error(op, inputs, attrs, feed, message):
    # The documented fast path: JAX clamps gathers, drops scatters, gives -1 for x // 0.
    outputs = _model(op, inputs, checked=False, **attrs)(*feed)
    assert all(np.all(np.isfinite(np.asarray(o, np.float64))) for o in outputs)


def test_checked_mode_passes_good_data_and_matches_fast_mode():
    x, i = np.arange(5, dtype=np.float32), np.array([4, -1, 0])
    fast = _model("Gather", [("x", F32), ("i", I64)], checked=False, axis=0)(x, i)
    checked = _model("Gather", [("x", F32), ("i", I64)], checked=True, axis=0)(x, i)
    np.testing.assert_array_equal(np.asarray(checked[0]), np.asarray(fast[0]))
    np.testing.assert_array_equal(np.asarray(checked[0]), [4.0, 4.0, 0.0])


def test_checked_apply_under_users_own_jit_with_checkify():
    model = _model("Div", [("a", I32), ("b", I32)], checked=True)
    checked_apply = jax.jit(checkify.checkify(model.apply, errors=checkify.user_checks))
    err, _ = checked_apply({}, np.array([1, 2], np.int32), np.array([1, 1], np.int32))
    assert err.get() is None
    err, _ = checked_apply({}, np.array([1, 2], np.int32), np.array([1, 0], np.int32))
    assert "integer division by zero" in err.get()


def test_checked_eager_apply_raises_immediately():
    model = _model("Div", [("a", I32), ("b", I32)], checked=True)
    with pytest.raises(errors.NumericCheckError, match="division by zero"):
        model.apply({}, np.array([1, 2], np.int32), np.array([0, 1], np.int32))


def test_constant_indices_are_checked_in_either_mode():
    graph = oh.make_graph(
        [oh.make_node("Gather", ["x", "i"], ["y"], name="const_gather", axis=0)],
        "g",
        [oh.make_tensor_value_info("x", F32, [3])],
        [oh.make_empty_tensor_value_info("y")],
        initializer=[onnx.numpy_helper.from_array(np.array([0, 9], np.int64), "i")],
    )
    model = jonnx.load(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)]))
    with pytest.raises(errors.JonnxError, match="'const_gather'.*9.*out of range"):
        model(np.ones(3, np.float32))

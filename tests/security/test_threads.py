"""A loaded Model is immutable and may be called from several threads at once."""

from __future__ import annotations

import pathlib
from concurrent.futures import ThreadPoolExecutor

import jax
import numpy as np
import onnx.helper as oh
import pytest

import jonnx
from jonnx import errors
from tests.security._models import branch, const, graph, model, vi

MODELS = pathlib.Path(__file__).resolve().parents[2] / "examples" / "models"
WORKERS = 8


def _cnn_input(i: int) -> np.ndarray:
    # Three batch sizes: threads compile and run several signatures at the same time.
    return np.random.default_rng(i).standard_normal((1 + i % 3, 3, 16, 16)).astype(np.float32)


def _transformer_input(i: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(i)
    length = 4 + i % 2
    mask = np.ones((2, length), np.int64)
    mask[1, length - 1 - i % 3 :] = 0
    return {"input_ids": rng.integers(0, 50, (2, length)), "attention_mask": mask}


def _concurrently(fn, items):
    with ThreadPoolExecutor(WORKERS) as pool:
        return list(pool.map(fn, items))


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("name,make", [("small_cnn.onnx", _cnn_input), ("tiny_transformer.onnx", _transformer_input)])
def test_concurrent_calls_match_sequential_ones(name, make):
    inputs = [make(i) for i in range(24)]
    sequential_model = jonnx.load(MODELS / name)
    call = (lambda m, x: m(**x)) if isinstance(inputs[0], dict) else (lambda m, x: m(x))
    expected = [call(sequential_model, x) for x in inputs]

    # A fresh model: the first calls race to trace and compile.
    shared = jonnx.load(MODELS / name)
    before = (shared.graph, dict(shared.params), shared.input_names, shared.output_names)
    got = _concurrently(lambda x: call(shared, x), inputs)
    for e, g in zip(expected, got):
        _same(e, g)
    # Nothing about the model changed under the threads.
    assert shared.graph is before[0]
    assert (shared.input_names, shared.output_names) == before[2:]
    for k, v in before[1].items():
        np.testing.assert_array_equal(np.asarray(shared.params[k]), np.asarray(v))


def test_concurrent_apply_and_grad():
    m = jonnx.load(MODELS / "small_cnn.onnx")
    params = m.params
    xs = [_cnn_input(i) for i in range(12)]

    def loss(p, x):
        return sum(o.sum() for o in m.apply(p, x))

    grad = jax.jit(jax.grad(loss))
    expected = [grad(params, x) for x in xs]
    got = _concurrently(lambda x: grad(params, x), xs)
    for e, g in zip(expected, got):
        for k in e:
            np.testing.assert_allclose(np.asarray(g[k]), np.asarray(e[k]), rtol=1e-6)


def test_concurrent_static_inputs_and_control_flow():
    # Each distinct static value (the If condition, Reshape's shape) is its own compilation;
    # threads asking for different ones at once must each get their own.
    then = branch([oh.make_node("Neg", ["x"], ["t"])], "t", "then")
    other = branch([oh.make_node("Abs", ["x"], ["e"])], "e", "else")
    nodes = [
        oh.make_node("If", ["flag"], ["f"], then_branch=then, else_branch=other),
        oh.make_node("Reshape", ["f", "shape"], ["y"]),
    ]
    g = graph(nodes, inputs=[vi("x", [4]), vi("flag", [], 9), vi("shape", [2], 7)], outputs=[vi("y", None)])
    m = jonnx.load(model(g))
    assert set(m.static_input_names) == {"flag", "shape"}
    cases = [
        (np.arange(4, dtype=np.float32) - i, np.array(i % 2 == 0), np.array([[2, 2], [4, 1], [1, 4]][i % 3]))
        for i in range(30)
    ]
    got = _concurrently(lambda c: m(*c)[0], cases)
    for (x, flag, shape), y in zip(cases, got):
        np.testing.assert_array_equal(np.asarray(y), (-x if flag else np.abs(x)).reshape(shape))


def test_model_state_cannot_be_changed_through_its_views():
    m = jonnx.load(MODELS / "small_cnn.onnx")
    params = m.params
    name = next(iter(params))
    params[name] = params[name] * 0  # a fresh dict: the model keeps its own
    assert not np.array_equal(np.asarray(m.params[name]), np.asarray(params[name]))
    with pytest.raises(TypeError):
        m.graph.initializers["anything"] = np.zeros(1)  # a read-only mapping
    with pytest.raises(AttributeError):
        m.graph.nodes[0].name = "renamed"  # frozen dataclass
    with pytest.raises(TypeError):
        m.graph.nodes[0].attrs["x"] = 1  # read-only attributes


def test_errors_in_one_thread_do_not_disturb_others():
    m = jonnx.load(model(graph([oh.make_node("Neg", ["x"], ["y"])])))
    good = np.arange(4, dtype=np.float32)
    bad = np.zeros(5, np.float32)

    def run(i):
        try:
            return m(bad if i % 2 else good)[0]
        except errors.InputError as e:
            return e

    for i, r in enumerate(_concurrently(run, range(40))):
        if i % 2:
            assert isinstance(r, errors.InputError) and "'x'" in str(r)
        else:
            np.testing.assert_array_equal(np.asarray(r), -good)


def test_constant_folded_model_in_threads():
    # Nodes folded at trace time (numpy) run in each tracing thread: no shared scratch state.
    nodes = [
        const("shape", np.array([2, 2], np.int64)),
        oh.make_node("Shape", ["x"], ["s"]),
        oh.make_node("Reshape", ["x", "shape"], ["r"]),
        oh.make_node("ReduceSum", ["r"], ["y"], keepdims=0),
    ]
    m = jonnx.load(model(graph(nodes, outputs=[vi("y", [])])))
    xs = [np.full(4, i, np.float32) for i in range(32)]
    for x, y in zip(xs, _concurrently(lambda x: m(x)[0], xs)):
        assert float(y) == pytest.approx(4 * x[0])

"""Random ops, tested statistically: shapes, dtypes, moments and ranges over many samples,
reproducibility per key, and the error without a key.

No reference runtime can give expected values: the ReferenceEvaluator and onnxruntime draw
from their own generators (numpy's, ORT's), which a JAX key cannot reproduce.
"""

from __future__ import annotations

import jax
import numpy as np
import onnx
import pytest

import jonnx
from jonnx import errors
from tests.ops._harness import node_model

N = 20000


def _run(model: onnx.ModelProto, inputs: dict, key, *, jit: bool = False) -> list[np.ndarray]:
    """Outputs for ``key``; with ``jit``, ``key`` is a list and one compiled function runs each."""
    with jax.enable_x64(True):
        m = jonnx.load(model)
        feeds = [np.asarray(v) for v in inputs.values()]
        if jit:
            f = jax.jit(lambda k, *a: m.apply(m.params, *a, key=k))
            return [[np.asarray(o) for o in f(k, *feeds)] for k in key]
        return [np.asarray(o) for o in m.apply(m.params, *feeds, key=key)]


def _model(op, inputs=None, *, opset, **attrs):
    return node_model(op, inputs or {}, opset=opset, **attrs)


KEY = jax.random.key(0)
FLOATS = [
    (onnx.TensorProto.FLOAT16, np.float16),
    (onnx.TensorProto.FLOAT, np.float32),
    (onnx.TensorProto.DOUBLE, np.float64),
]


@pytest.mark.parametrize("opset", [1, 22])
@pytest.mark.parametrize("elem,dtype", FLOATS)
def test_random_normal(opset, elem, dtype):
    model = _model("RandomNormal", opset=opset, shape=[N // 100, 100], mean=2.0, scale=3.0, dtype=elem)
    (y,) = _run(model, {}, KEY)
    assert y.shape == (N // 100, 100) and y.dtype == dtype
    y = y.astype(np.float64)
    assert abs(y.mean() - 2.0) < 0.1 and abs(y.std() - 3.0) < 0.1


@pytest.mark.parametrize("opset", [1, 22])
@pytest.mark.parametrize("elem,dtype", FLOATS)
def test_random_uniform(opset, elem, dtype):
    model = _model("RandomUniform", opset=opset, shape=[N], low=-1.0, high=3.0, dtype=elem)
    (y,) = _run(model, {}, KEY)
    assert y.shape == (N,) and y.dtype == dtype
    y = y.astype(np.float64)
    assert y.min() >= -1.0 and y.max() <= 3.0
    assert abs(y.mean() - 1.0) < 0.05 and abs(y.std() - 4 / np.sqrt(12)) < 0.05


def test_random_default_dtype_is_float32():
    (y,) = _run(_model("RandomNormal", opset=22, shape=[3, 2]), {}, KEY)
    assert y.dtype == np.float32 and y.shape == (3, 2)


@pytest.mark.parametrize(
    "op,attrs", [("RandomNormalLike", {"mean": -1.0, "scale": 0.5}), ("RandomUniformLike", {"low": 2.0, "high": 4.0})]
)
@pytest.mark.parametrize("opset", [1, 22])
def test_like_ops_take_shape_and_dtype_from_input(op, attrs, opset):
    x = np.zeros((N // 50, 50), np.float64)
    (y,) = _run(_model(op, {"x": x}, opset=opset, **attrs), {"x": x}, KEY)
    assert y.shape == x.shape and y.dtype == np.float64
    if op == "RandomNormalLike":
        assert abs(y.mean() + 1.0) < 0.05 and abs(y.std() - 0.5) < 0.05
    else:
        assert y.min() >= 2.0 and y.max() <= 4.0 and abs(y.mean() - 3.0) < 0.05
    # dtype attribute overrides the input's, which may then be any type
    xi = np.zeros((4, 3), np.int32)
    (y,) = _run(_model(op, {"x": xi}, opset=opset, dtype=onnx.TensorProto.FLOAT16, **attrs), {"x": xi}, KEY)
    assert y.shape == (4, 3) and y.dtype == np.float16


def test_like_with_integer_input_and_no_dtype_is_an_error():
    xi = np.zeros((4, 3), np.int32)
    with pytest.raises(errors.NodeError, match="floating"):
        _run(_model("RandomUniformLike", {"x": xi}, opset=22), {"x": xi}, KEY)


@pytest.mark.parametrize("opset", [15, 22])
@pytest.mark.parametrize(
    "dtype,elem,out",
    [
        (np.float32, None, np.float32),
        (np.float64, None, np.float64),
        (np.float32, onnx.TensorProto.BOOL, np.bool_),
        (np.float64, onnx.TensorProto.INT32, np.int32),
    ],
)
def test_bernoulli(opset, dtype, elem, out):
    p = np.tile(np.array([0.0, 0.2, 0.5, 0.9, 1.0], dtype), (N // 5, 1))
    attrs = {} if elem is None else {"dtype": elem}
    (y,) = _run(_model("Bernoulli", {"p": p}, opset=opset, **attrs), {"p": p}, KEY)
    assert y.shape == p.shape and y.dtype == out
    assert set(np.unique(y.astype(np.float64))) <= {0.0, 1.0}
    np.testing.assert_allclose(y.astype(np.float64).mean(0), p[0], atol=0.02)
    assert not y[:, 0].any() and y[:, -1].all()


@pytest.mark.parametrize("opset", [7, 22])
@pytest.mark.parametrize("elem,out", [(onnx.TensorProto.INT32, np.int32), (onnx.TensorProto.INT64, np.int64)])
def test_multinomial(opset, elem, out):
    probs = np.array([[0.1, 0.2, 0.7], [0.5, 0.5, 0.0]])
    logits = np.log(np.maximum(probs, 1e-30)).astype(np.float32)
    model = _model("Multinomial", {"x": logits}, opset=opset, sample_size=N, dtype=elem)
    (y,) = _run(model, {"x": logits}, KEY)
    assert y.shape == (2, N) and y.dtype == out
    assert y.min() >= 0 and y.max() <= 2
    for row in range(2):
        freq = np.bincount(y[row], minlength=3) / N
        np.testing.assert_allclose(freq, probs[row], atol=0.02)


def test_multinomial_default_is_one_int32_sample():
    logits = np.zeros((4, 5), np.float32)
    (y,) = _run(_model("Multinomial", {"x": logits}, opset=22), {"x": logits}, KEY)
    assert y.shape == (4, 1) and y.dtype == np.int32  # dtype attribute defaults to int32


CASES = [
    ("RandomNormal", {}, {"shape": [5, 4]}),
    ("RandomUniform", {}, {"shape": [5, 4]}),
    ("RandomNormalLike", {"x": np.zeros((5, 4), np.float32)}, {}),
    ("RandomUniformLike", {"x": np.zeros((5, 4), np.float32)}, {}),
    ("Bernoulli", {"p": np.full((5, 4), 0.5, np.float32)}, {}),
    ("Multinomial", {"x": np.zeros((5, 4), np.float32)}, {"sample_size": 8}),
]


@pytest.mark.parametrize("op,inputs,attrs", CASES, ids=[c[0] for c in CASES])
def test_keys_control_the_draws(op, inputs, attrs):
    model = _model(op, inputs, opset=22, **attrs)
    (a,), (c,) = _run(model, inputs, [jax.random.key(1), jax.random.key(2)], jit=True)
    b = _run(model, inputs, jax.random.key(1))[0]
    np.testing.assert_array_equal(a, b)  # same key, jit or eager: same values
    assert not np.array_equal(a, c)  # another key: other values


@pytest.mark.parametrize("op,inputs,attrs", CASES, ids=[c[0] for c in CASES])
def test_seed_attribute_does_not_replace_the_key(op, inputs, attrs):
    # `seed` cannot reproduce another runtime's bitstream, so jonnx ignores it.
    a = _run(_model(op, inputs, opset=22, seed=1.0, **attrs), inputs, jax.random.key(3))[0]
    b = _run(_model(op, inputs, opset=22, seed=7.0, **attrs), inputs, jax.random.key(3))[0]
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("op,inputs,attrs", CASES, ids=[c[0] for c in CASES])
def test_no_key_is_an_error(op, inputs, attrs):
    model = _model(op, inputs, opset=22, **attrs)
    with jax.enable_x64(True):
        m = jonnx.load(model)
        with pytest.raises(errors.NodeError, match="no PRNG key"):
            m.apply(m.params, *[np.asarray(v) for v in inputs.values()])


def test_two_random_nodes_draw_independently():
    import onnx.helper as oh

    nodes = [oh.make_node("RandomNormal", [], [f"y{i}"], shape=[100]) for i in range(2)]
    graph = oh.make_graph(nodes, "g", [], [oh.make_empty_tensor_value_info(f"y{i}") for i in range(2)])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 22)])
    model.ir_version = 10
    y0, y1 = _run(model, {}, KEY)
    assert not np.array_equal(y0, y1)

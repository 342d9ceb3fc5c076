"""Large batches run in chunks of rows (jonnx/_chunks.py): the proof that rows stay apart, the
chunked evaluation against the whole one, and ``Model.__call__`` choosing it, against
onnxruntime, with the size limits lowered so that small models take the chunked path."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import onnx
import onnx.helper as oh
import pytest
from jax import lax
from onnx import TensorProto, numpy_helper

import jonnx
from jonnx import _chunks
from tests._compiles import count_compiles

ort = pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(0)
W = RNG.standard_normal((16, 8)).astype(np.float32)
B = RNG.standard_normal(8).astype(np.float32)
K = RNG.standard_normal((3, 3, 3, 4)).astype(np.float32)


def _conv_pool(x):
    y = lax.conv_general_dilated(x.reshape(-1, 4, 4, 3), K, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return lax.reduce_window(jax.nn.relu(y), -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")


def _heads(x):
    q = x.reshape(x.shape[0], 4, 2, 6).transpose(0, 2, 1, 3)  # (rows, heads, tokens, width)
    return jax.nn.softmax(jnp.einsum("bhqd,bhkd->bhqk", q, q), axis=-1)


# Every row of the result from the same row of the input: computed in chunks, equal to the whole.
ROW_LOCAL = {
    "dense_softmax": lambda x: jax.nn.softmax(x[:, :16] @ W + B, axis=-1),
    "attention_heads": _heads,
    "conv_pool": _conv_pool,
    "table_lookup": lambda x: jnp.take(W, (jnp.abs(x[:, :3]) * 5).astype(jnp.int32) % 16, axis=0),
    # The batch size read at trace time is a constant of the whole batch's trace: the chunks
    # evaluate that trace, so they divide by 12 too.
    "divided_by_batch": lambda x: x / x.shape[0],
    "nested_jit": lambda x: jax.jit(lambda y: jnp.tanh(y) * 2)(x),
    "broadcast_constant": lambda x: x * jnp.broadcast_to(jnp.arange(48.0), x.shape),
    "sort_top_k": lambda x: lax.top_k(jnp.sort(x, axis=1), 3)[0],
    "cumsum_along_row": lambda x: jnp.cumsum(x, axis=1),
}

# Rows mixed (or the per-row computation depending on the row): never chunked.
MIXING = {
    "mean_over_rows": lambda x: x - x.mean(0),
    "scaled_by_total": lambda x: x * x.sum(),
    "rows_flattened": lambda x: x.reshape(-1) @ jnp.ones(x.size),
    "row_index": lambda x: x + jnp.arange(x.shape[0])[:, None],
    "cumsum_over_rows": lambda x: jnp.cumsum(x, axis=0),
    "product_over_rows": lambda x: x.T @ jnp.ones((x.shape[0], 2)),
    "random_mask": lambda x: x * jax.random.bernoulli(jax.random.key(0), 0.5, x.shape),
    "rows_regrouped": lambda x: x.reshape(6, 96).sum(1),
    # Not mixing, but XLA CPU miscompiles it inside the loop (docs/known_issues.md).
    "float8_fnuz": lambda x: x.astype(ml_dtypes.float8_e4m3fnuz),
}


def _primitives(fn, x) -> set[str]:
    return {eqn.primitive.name for eqn in jax.make_jaxpr(fn)(x).jaxpr.eqns}


@pytest.mark.parametrize("name", sorted(ROW_LOCAL))
def test_row_local_functions_run_in_chunks_as_whole(name):
    fn = ROW_LOCAL[name]
    x = RNG.standard_normal((12, 48)).astype(np.float32)
    assert _chunks.row_local(fn, x, 3)
    # 5 chunks of 3 rows, 7 of 2: the batch padded with copies of its last row.
    for chunks in (2, 3, 5, 7, 12):
        got = jax.jit(lambda x, c=chunks: _chunks.run_in_chunks(fn, x, c))(x)
        assert got.shape == fn(x).shape
        np.testing.assert_allclose(np.asarray(got), np.asarray(fn(x)), rtol=1e-5, atol=1e-6)
    assert "scan" in _primitives(lambda x: _chunks.run_in_chunks(fn, x, 3), x)


@pytest.mark.parametrize("name", sorted(MIXING))
def test_functions_mixing_rows_are_not_chunked(name):
    fn = MIXING[name]
    x = RNG.standard_normal((12, 48)).astype(np.float32)
    assert not _chunks.row_local(fn, x, 3)
    assert "scan" not in _primitives(lambda x: _chunks.run_in_chunks(fn, x, 3), x)
    got = jax.jit(lambda x: _chunks.run_in_chunks(fn, x, 3))(x)
    np.testing.assert_allclose(np.asarray(got), np.asarray(fn(x)), rtol=1e-5, atol=1e-6)


def test_padded_chunks_of_empty_rows():
    """Rows of no elements (a zero-size axis) split and join again: the chunks' results are
    reshaped by their sizes, which -1 cannot infer there."""
    x = np.ones((7, 0, 3), np.float32)
    got = jax.jit(lambda x: _chunks.run_in_chunks(lambda a: a * 2, x, 2))(x)
    assert got.shape == (7, 0, 3)


def test_chunks_need_equal_batches_of_enough_rows():
    x = np.ones((12, 4), np.float32)
    assert _chunks.row_local(lambda a: a * 2, x, 5)  # padded to 15 rows
    assert not _chunks.row_local(lambda a: a * 2, x, 13)  # more chunks than rows
    assert not _chunks.row_local(lambda d: d["a"] + d["b"].sum(), {"a": x, "b": np.ones((3, 4), np.float32)}, 3)
    assert not _chunks.row_local(lambda a: a * 2, np.ones((1, 4), np.float32), 1)
    assert _chunks.batch_of({"a": x, "b": x[:, :1]}) == 12
    assert _chunks.batch_of({"a": x, "b": np.float32(1)}) is None
    assert _chunks.batch_of(np.ones((1, 4))) is None


def test_chunk_count_brings_each_chunk_under_the_limit():
    mib = 1 << 20
    assert _chunks.chunk_count(32, 30 * mib) == 1  # under the fresh-mapping threshold
    assert _chunks.chunk_count(32, 108 * mib) == 8  # 4 chunks would hold 27 MiB each
    assert _chunks.chunk_count(6, 40 * mib) == 2
    assert _chunks.chunk_count(7, 400 * mib) == 7  # one row a chunk is all that fits
    assert _chunks.chunk_count(1, 400 * mib) == 1
    assert _chunks.chunk_count(14, 48 * mib) == 2  # 7 rows, all that fit
    # Where chunks that divide the batch would hold one row, it is padded to whole chunks: the
    # least work, counting each chunk as 0.4 of a row. 17 rows of 100 MiB, 4 fitting a chunk:
    # 6 chunks of 3 (18 rows, 20.4) before 5 of 4 (22), 9 of 2 (21.6) and 17 of 1 (23.8).
    assert _chunks.chunk_count(17, 100 * mib) == 6
    assert _chunks.chunk_rows(17, 6) == 3
    assert _chunks.chunk_count(31, 186 * mib) == 8  # 8 of 4: one row of padding
    assert _chunks.chunk_rows(31, 8) == 4
    # Dividing chunks of several rows are kept, though padded larger ones would count less
    # work (64 rows holding 7 a chunk: 16 of 4, not 13 of 5; they measured 1.14x slower).
    assert _chunks.chunk_count(64, 216 * mib) == 16
    assert _chunks.chunk_count(27, 91 * mib) == 9


@pytest.fixture
def small_limits(monkeypatch):
    """Chunking for temporaries of more than 1 KiB, 256 bytes a chunk."""
    monkeypatch.setattr(_chunks, "FRESH_BLOCK_BYTES", 1 << 10)
    monkeypatch.setattr(_chunks, "CHUNK_BYTES", 1 << 8)


def _model(nodes, inputs, outputs, inits=()):
    graph = oh.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(v, n) for n, v in inits])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])


def _encoder_block() -> onnx.ModelProto:
    """MatMul + bias, a softmax attention over tokens, LayerNorm, and the batch size as data."""
    rng = np.random.default_rng(1)
    nodes = [
        oh.make_node("MatMul", ["x", "w"], ["h"]),
        oh.make_node("Add", ["h", "b"], ["hb"]),
        oh.make_node("Transpose", ["hb"], ["ht"], perm=[0, 2, 1]),
        oh.make_node("MatMul", ["hb", "ht"], ["scores"]),
        oh.make_node("Softmax", ["scores"], ["p"], axis=-1),
        oh.make_node("MatMul", ["p", "hb"], ["ctx"]),
        oh.make_node("LayerNormalization", ["ctx", "g", "beta"], ["ln"], axis=-1),
        oh.make_node("Shape", ["x"], ["shape"]),
        oh.make_node("Gather", ["shape", "zero"], ["n"], axis=0),
        oh.make_node("Cast", ["n"], ["nf"], to=TensorProto.FLOAT),
        oh.make_node("Div", ["ln", "nf"], ["y"]),
    ]
    inits = [
        ("w", rng.standard_normal((16, 16)).astype(np.float32) * 0.3),
        ("b", rng.standard_normal(16).astype(np.float32)),
        ("g", rng.standard_normal(16).astype(np.float32)),
        ("beta", rng.standard_normal(16).astype(np.float32)),
        ("zero", np.array(0, np.int64)),
    ]
    x = oh.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 10, 16])
    y = oh.make_tensor_value_info("y", TensorProto.FLOAT, None)
    return _model(nodes, [x], [y], inits)


def _conv_net() -> onnx.ModelProto:
    rng = np.random.default_rng(2)
    nodes = [
        oh.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        oh.make_node("Relu", ["c"], ["r"]),
        oh.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        oh.make_node("Conv", ["p", "dw"], ["d"], pads=[1, 1, 1, 1], group=8),
        oh.make_node("GlobalAveragePool", ["d"], ["g"]),
        oh.make_node("Flatten", ["g"], ["y"]),
    ]
    inits = [
        ("w", rng.standard_normal((8, 3, 3, 3)).astype(np.float32)),
        ("dw", rng.standard_normal((8, 1, 3, 3)).astype(np.float32)),
    ]
    x = oh.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 12, 12])
    y = oh.make_tensor_value_info("y", TensorProto.FLOAT, None)
    return _model(nodes, [x], [y], inits)


def _batch_normalized() -> onnx.ModelProto:
    """Each row minus the mean over the batch: rows mixed."""
    nodes = [
        oh.make_node("ReduceMean", ["x"], ["m"], axes=[0], keepdims=1),
        oh.make_node("Sub", ["x", "m"], ["y"]),
    ]
    x = oh.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])
    y = oh.make_tensor_value_info("y", TensorProto.FLOAT, None)
    return _model(nodes, [x], [y])


def _reference(proto, x):
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def _chunks_run(model) -> list[int]:
    return [stage.chunks for stage in model._run_stages.values()]


@pytest.mark.parametrize(
    "build, shape", [(_encoder_block, (12, 10, 16)), (_conv_net, (6, 3, 12, 12))], ids=["encoder", "conv"]
)
def test_model_runs_a_large_batch_in_chunks(small_limits, build, shape):
    proto = build()
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    model = jonnx.load(proto)
    got = np.asarray(model(x)[0])
    assert max(_chunks_run(model)) > 1
    np.testing.assert_allclose(got, _reference(proto, x), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(model(x)[0]), got)  # the same compiled stage again
    assert len(model._run_stages) == 1
    # A batch of one is never chunked; a new batch size decides again.
    np.testing.assert_allclose(np.asarray(model(x[:1])[0]), _reference(proto, x[:1]), rtol=1e-4, atol=1e-5)
    assert sorted(_chunks_run(model))[0] == 1


@pytest.mark.parametrize(
    "build, shape", [(_encoder_block, (12, 10, 16)), (_conv_net, (12, 3, 12, 12))], ids=["encoder", "conv"]
)
def test_model_pads_a_prime_batch_to_whole_chunks(small_limits, monkeypatch, build, shape):
    """7 rows where a chunk holds 4: two chunks of 4, the last padded, not seven of one."""
    proto = build()
    x = np.random.default_rng(13).standard_normal(shape).astype(np.float32)
    model = jonnx.load(proto)
    model(x)
    ((_, temporaries),) = model._temporaries_seen.values()
    monkeypatch.setattr(_chunks, "CHUNK_BYTES", temporaries * 4 // 12 + 1)
    got = np.asarray(model(x[:7])[0])
    assert _chunks_run(model)[1] == 2
    np.testing.assert_allclose(got, _reference(proto, x[:7]), rtol=1e-4, atol=1e-5)


def test_deciding_compiles_the_whole_segment_once():
    """Reading the compiled segment's temporaries is the call's own compilation."""
    proto = _encoder_block()
    x = np.random.default_rng(7).standard_normal((4, 10, 16)).astype(np.float32)
    model = jonnx.load(proto)
    with count_compiles() as compiles:
        model(x)[0].block_until_ready()
        model(x)[0].block_until_ready()
    assert _chunks_run(model) == [1]
    assert len(compiles) == 1, compiles


def test_another_batch_estimates_its_temporaries(small_limits):
    """A batch of the shapes seen before, less rows, is chunked on the seen batch's
    temporaries scaled to its rows: compiled once, as chunks (an evaluation loop's last
    batch), with the results of the whole graph."""
    proto = _encoder_block()
    model = jonnx.load(proto)
    x = np.random.default_rng(9).standard_normal((12, 10, 16)).astype(np.float32)
    model(x)
    with count_compiles() as compiles:
        got = np.asarray(model(x[:6])[0])
    assert len(compiles) == 1, compiles
    assert _chunks_run(model) == [12, 6]
    np.testing.assert_allclose(got, _reference(proto, x[:6]), rtol=1e-4, atol=1e-5)


def test_an_estimate_under_the_threshold_is_measured(small_limits, monkeypatch):
    """Where the scaled estimate stays under the threshold, the batch's own compilation (the
    call's, run whole) decides and is seen from then on."""
    proto = _encoder_block()
    model = jonnx.load(proto)
    x = np.random.default_rng(10).standard_normal((12, 10, 16)).astype(np.float32)
    model(x)
    ((batch, temporaries),) = model._temporaries_seen.values()
    # The threshold between the batch of 2's estimate and the batch of 12's temporaries.
    monkeypatch.setattr(_chunks, "FRESH_BLOCK_BYTES", temporaries * 4 // 12)
    with count_compiles() as compiles:
        got = np.asarray(model(x[:2])[0])
    assert [b for b, _ in model._temporaries_seen.values()] == [2]
    (chunks,) = _chunks_run(model)[1:]
    assert len(compiles) == (1 if chunks == 1 else 2), compiles  # whole, then chunks if they pay
    np.testing.assert_allclose(got, _reference(proto, x[:2]), rtol=1e-4, atol=1e-5)


def test_a_segment_making_strings_runs_whole(small_limits):
    """Strings a segment makes while traced (the batch's shape as text) are outside the jaxpr
    that chunks run: such a segment runs whole, the estimated batch too."""
    w = np.random.default_rng(11).standard_normal((64, 64)).astype(np.float32) * 0.2
    nodes = [
        oh.make_node("MatMul", ["x", "w"], ["h"]),
        oh.make_node("Tanh", ["h"], ["t"]),
        oh.make_node("MatMul", ["t", "w"], ["y"]),
        oh.make_node("Shape", ["x"], ["shape"]),
        oh.make_node("Cast", ["shape"], ["s"], to=TensorProto.STRING),
    ]
    x_info = oh.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])
    outputs = [
        oh.make_tensor_value_info("y", TensorProto.FLOAT, None),
        oh.make_tensor_value_info("s", TensorProto.STRING, None),
    ]
    model = jonnx.load(_model(nodes, [x_info], outputs, [("w", w)]))
    x = np.random.default_rng(12).standard_normal((12, 64)).astype(np.float32)
    for rows in (12, 6):
        y, s = model(x[:rows])
        np.testing.assert_allclose(np.asarray(y), np.tanh(x[:rows] @ w) @ w, rtol=1e-4, atol=1e-5)
        assert s.tolist() == [str(rows), "64"]
    assert _chunks_run(model) == [1, 1]
    assert [b for b, _ in model._temporaries_seen.values()] == [12]  # the second estimated


def test_model_mixing_rows_runs_whole(small_limits):
    proto = _batch_normalized()
    x = np.random.default_rng(4).standard_normal((8, 64)).astype(np.float32)
    model = jonnx.load(proto)
    np.testing.assert_allclose(np.asarray(model(x)[0]), _reference(proto, x), rtol=1e-5, atol=1e-6)
    assert _chunks_run(model) == [1]


def test_small_temporaries_run_whole():
    proto = _encoder_block()
    x = np.random.default_rng(5).standard_normal((12, 10, 16)).astype(np.float32)
    model = jonnx.load(proto)
    np.testing.assert_allclose(np.asarray(model(x)[0]), _reference(proto, x), rtol=1e-4, atol=1e-5)
    assert _chunks_run(model) == [1]


def test_chunked_model_under_grad_and_jit(small_limits):
    """The chunked stage is the concrete call's alone: differentiating or tracing the call
    takes the whole segment, with the same values."""
    proto = _encoder_block()
    x = np.random.default_rng(6).standard_normal((12, 10, 16)).astype(np.float32)
    model = jonnx.load(proto)
    want = np.asarray(model(x)[0])
    assert max(_chunks_run(model)) > 1
    np.testing.assert_allclose(np.asarray(jax.jit(lambda x: model(x)[0])(x)), want, rtol=1e-5, atol=1e-6)
    grad = jax.grad(lambda p: model(x, params=p)[0].sum())(dict(model.params))
    plain = jonnx.load(proto)
    want_grad = jax.grad(lambda p: plain.apply(p, x)[0].sum())(dict(plain.params))
    for name in want_grad:
        np.testing.assert_allclose(np.asarray(grad[name]), np.asarray(want_grad[name]), rtol=1e-4, atol=1e-5)


def test_batch_chunks_is_an_optimize_switch(small_limits):
    assert jonnx.optimize.resolve(True)["batch_chunks"]
    assert not jonnx.optimize.resolve(False)["batch_chunks"]
    proto = _encoder_block()
    x = np.random.default_rng(8).standard_normal((12, 10, 16)).astype(np.float32)
    model = jonnx.load(proto, optimize={"batch_chunks": False})
    np.testing.assert_allclose(np.asarray(model(x)[0]), _reference(proto, x), rtol=1e-4, atol=1e-5)
    assert _chunks_run(model) == []  # never considered

"""``jax.export`` of ``Model.apply`` with symbolic dimensions: export once, run at any size.

Expected values come from onnxruntime on the same inputs.
"""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import onnx.helper as oh
import pytest
from jax import export
from onnx import TensorProto, numpy_helper

import jonnx
from jonnx import errors

ort = pytest.importorskip("onnxruntime")

MODELS = pathlib.Path(__file__).resolve().parents[1] / "examples" / "models"


def test_cnn_exports_with_a_symbolic_batch_and_runs_at_three_sizes():
    model = jonnx.load(MODELS / "small_cnn.onnx")
    spec = jax.ShapeDtypeStruct(export.symbolic_shape("b, 3, 16, 16"), jnp.float32)
    exported = export.export(jax.jit(model.apply))(model.params, spec)
    restored = export.deserialize(exported.serialize())
    session = ort.InferenceSession(str(MODELS / "small_cnn.onnx"), providers=["CPUExecutionProvider"])
    for batch in (1, 3, 8):
        image = np.random.default_rng(batch).standard_normal((batch, 3, 16, 16)).astype(np.float32)
        (got,) = restored.call(model.params, image)
        (want,) = session.run(None, {"image": image})
        assert got.shape == want.shape
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-5)


def test_a_node_needing_a_concrete_dim_names_itself():
    # Without a bound on t, Slice cannot tell whether t passes the 64-row position table.
    model = jonnx.load(MODELS / "tiny_transformer.onnx")
    spec = jax.ShapeDtypeStruct(export.symbolic_shape("b, t"), jnp.int32)
    with pytest.raises(errors.StaticValueError, match=r"node 'Slice_pos' \(Slice.*constraints"):
        export.export(jax.jit(model.apply))(model.params, spec, spec)


def _transformer_inputs(batch: int, length: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, length), np.int64)
    mask[0, length // 2 :] = 0
    return {"input_ids": rng.integers(0, 50, (batch, length)), "attention_mask": mask}


def test_transformer_exports_with_symbolic_batch_and_length():
    model = jonnx.load(MODELS / "tiny_transformer.onnx")
    # The position table has 64 rows: the bound makes Slice's clamp decidable for every t.
    b, t = export.symbolic_shape("b, t", constraints=["t <= 64"])
    spec = jax.ShapeDtypeStruct((b, t), jnp.int32)
    restored = export.deserialize(export.export(jax.jit(model.apply))(model.params, spec, spec).serialize())
    session = ort.InferenceSession(str(MODELS / "tiny_transformer.onnx"), providers=["CPUExecutionProvider"])
    for batch, length in ((1, 5), (3, 11), (4, 64)):
        feeds = _transformer_inputs(batch, length, seed=batch)
        got = restored.call(model.params, *(v.astype(np.int32) for v in feeds.values()))
        want = session.run(None, feeds)
        for g, w in zip(got, want):
            np.testing.assert_allclose(np.asarray(g), w, rtol=1e-4, atol=1e-5)


def _shape_arithmetic_model() -> onnx.ModelProto:
    """Shape -> Gather -> Concat -> Reshape, Flatten, ConstantOfShape, Expand and Range on ``N``."""
    i64 = lambda name, v: numpy_helper.from_array(np.asarray(v, np.int64), name)
    nodes = [
        oh.make_node("Shape", ["x"], ["shape"]),
        oh.make_node("Gather", ["shape", "zero"], ["n"], axis=0),
        oh.make_node("Concat", ["n", "two", "three"], ["target"], axis=0),
        oh.make_node("Reshape", ["x", "target"], ["x3"]),
        oh.make_node("Flatten", ["x3"], ["flat"], axis=1),
        oh.make_node(
            "ConstantOfShape",
            ["shape"],
            ["ones"],
            value=numpy_helper.from_array(np.ones(1, np.float32)),
        ),
        oh.make_node("Expand", ["bias", "shape"], ["bias_full"]),
        oh.make_node("Squeeze", ["n", "zero"], ["n0"]),
        oh.make_node("Range", ["start", "n0", "step"], ["rows"]),
        oh.make_node("Cast", ["rows"], ["rows_f"], to=TensorProto.FLOAT),
        oh.make_node("Unsqueeze", ["rows_f", "one"], ["rows_col"]),
        oh.make_node("Sum", ["flat", "ones", "bias_full", "rows_col"], ["y"]),
    ]
    inits = [
        i64("zero", [0]),
        i64("two", [2]),
        i64("three", [3]),
        i64("one", [1]),
        i64("start", 0),
        i64("step", 1),
        numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(1, 6), "bias"),
    ]
    graph = oh.make_graph(
        nodes,
        "shape_arithmetic",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6])],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 6])],
        inits,
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])


def test_shape_arithmetic_exports_symbolically():
    proto = _shape_arithmetic_model()
    model = jonnx.load(proto)
    spec = jax.ShapeDtypeStruct(export.symbolic_shape("n, 6"), jnp.float32)
    restored = export.deserialize(export.export(jax.jit(model.apply))(model.params, spec).serialize())
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    for n in (1, 4, 9):
        x = np.random.default_rng(n).standard_normal((n, 6)).astype(np.float32)
        (got,) = restored.call(model.params, x)
        (want,) = session.run(None, {"x": x})
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)

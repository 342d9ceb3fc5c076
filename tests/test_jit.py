"""jonnx.jit and the XLA compiler options every function jonnx compiles is built with.

The model below is the shape of the light model zoo's classifier head: a Gemm whose weight is
a ConstantOfShape fill, then Softmax. Plain ``jax.jit`` on jaxlib 0.10's CPU backend fuses
the dot (whose all-equal weight XLA holds as a broadcast) with the softmax's reductions and
returns garbage (docs/known_issues.md); everything jonnx compiles must not.
"""

from __future__ import annotations

import jax
import numpy as np
import onnx
import onnx.helper as oh
import onnxruntime as ort
import pytest

import jonnx
import jonnx.training


def _constant_weight_classifier() -> onnx.ModelProto:
    fill = oh.make_tensor("fill", onnx.TensorProto.FLOAT, [1], [0.02])
    nodes = [
        oh.make_node("Constant", [], ["w_shape"], value=oh.make_tensor("s", onnx.TensorProto.INT64, [2], [64, 100])),
        oh.make_node("ConstantOfShape", ["w_shape"], ["w"], value=fill),
        oh.make_node("Gemm", ["x", "w", "b"], ["logits"]),
        oh.make_node("Softmax", ["logits"], ["probs"], axis=1),
    ]
    graph = oh.make_graph(
        nodes,
        "constant_weight_classifier",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 64])],
        [oh.make_tensor_value_info("probs", onnx.TensorProto.FLOAT, ["n", 100])],
        initializer=[onnx.numpy_helper.from_array(np.linspace(-1, 1, 100, dtype=np.float32), "b")],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)


@pytest.fixture(scope="module")
def classifier():
    proto = _constant_weight_classifier()
    x = np.random.default_rng(0).random((100, 64), np.float32)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    (expected,) = session.run(None, {"x": x})
    return jonnx.load(proto), x, expected


def test_call_matches_onnxruntime(classifier):
    model, x, expected = classifier
    np.testing.assert_allclose(np.asarray(model(x)[0]), expected, rtol=1e-5, atol=1e-7)


def test_jonnx_jit_of_apply_matches_onnxruntime(classifier):
    model, x, expected = classifier
    (probs,) = jonnx.jit(model.apply)(model.params, x)
    np.testing.assert_allclose(np.asarray(probs), expected, rtol=1e-5, atol=1e-7)


def test_predict_matches_onnxruntime(classifier):
    model, x, expected = classifier
    (probs,) = jonnx.training.predict(model, None, x)
    np.testing.assert_allclose(np.asarray(probs), expected, rtol=1e-5, atol=1e-7)


def test_backend_matches_onnxruntime(classifier):
    model, x, expected = classifier
    (probs,) = jonnx.backend.run_model(_constant_weight_classifier(), [x])
    np.testing.assert_allclose(np.asarray(probs), expected, rtol=1e-5, atol=1e-7)


def test_jit_passes_on_the_callers_arguments():
    scaled = jonnx.jit(lambda a, n: a * n, static_argnums=(1,), compiler_options={"xla_cpu_enable_fast_math": False})
    assert float(scaled(np.float32(2), 3)) == 6.0


def test_compiler_options_are_a_fresh_dict():
    options = jonnx.compiler_options()
    known = dict(options)
    options["something"] = "else"
    assert jonnx.compiler_options() == known
    # Empty where the jaxlib lacks the option (jaxlib before YNNPACK fusions).
    if jax.default_backend() == "cpu" and known:
        assert "xla_cpu_experimental_ynn_fusion_type" in known

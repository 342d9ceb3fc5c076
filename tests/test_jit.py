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


# Which library runs the dots: YNNPACK's (the default) or XLA's own, for nearly all work on many rows.


def _jaxpr(fn, *shapes, dtype=np.float32):
    return jax.make_jaxpr(fn)(*(jax.ShapeDtypeStruct(s, dtype) for s in shapes))


def _attention(q, k, v):
    return jax.nn.softmax(q @ k, axis=-1) @ v


@pytest.mark.parametrize(
    ("fn", "shapes", "library"),
    [
        (lambda a, b: a @ b, [(4096, 768), (768, 768)], False),  # BERT's projections at batch 32
        (lambda a, b: a @ b, [(128, 768), (768, 768)], True),  # ... at batch 1
        (lambda a, b: a @ b, [(1023, 64), (64, 64)], True),
        (lambda a, b: a @ b, [(1024, 64), (64, 64)], False),
        (_attention, [(32, 12, 128, 64), (32, 12, 64, 128), (32, 12, 128, 64)], False),  # batch counts
        (lambda x: x + 1, [(4096, 4096)], True),  # no dots
        (jax.jit(lambda a, b: a @ b), [(2048, 64), (64, 64)], False),  # found inside a nested jit
    ],
)
def test_library_dots_for_rows(fn, shapes, library):
    assert jonnx._jit.library_dots_for(_jaxpr(fn, *shapes)) is library


def test_library_dots_for_weighs_the_work():
    def mixed(big, small, w):
        return (big @ w).sum() + (small @ w).sum()

    # 90% of the multiply-adds on many rows is the line.
    assert jonnx._jit.library_dots_for(_jaxpr(mixed, (9 * 1024, 64), (1000, 64), (64, 64))) is False
    assert jonnx._jit.library_dots_for(_jaxpr(mixed, (8 * 1024, 64), (1000, 64), (64, 64))) is True


@pytest.mark.parametrize("dtype", [jax.numpy.bfloat16, np.int8])
def test_library_dots_for_keeps_narrow_types_in_ynnpack(dtype):
    # XLA's own 8-bit and bfloat16 dots are far slower than YNNPACK's (the int8 BERT).
    assert jonnx._jit.library_dots_for(_jaxpr(lambda a, b: a @ b, (4096, 768), (768, 768), dtype=dtype)) is True


def test_compiler_options_for_xla_dots_leave_dots_out_of_ynnpack():
    library, xla = jonnx.compiler_options(), jonnx.compiler_options(library_dots=False)
    if not library:
        pytest.skip("this jaxlib has no YNNPACK fusion option")
    assert library != xla
    a = np.ones((2048, 64), np.float32)

    def compiled_text(options):
        return jax.jit(lambda x: x @ x.T, compiler_options=options).lower(a).compile().as_text()

    assert "ynn_fusion" in compiled_text(library)
    assert "ynn_fusion" not in compiled_text(xla)


def test_compiler_options_leave_convolutions_to_xla():
    # XLA's own convolutions were the faster on the CPU measured (docs/performance.md).
    if not jonnx.compiler_options():
        pytest.skip("this jaxlib has no YNNPACK fusion option")
    x = np.ones((1, 16, 16, 32), np.float32)
    w = np.ones((3, 3, 32, 32), np.float32)

    def conv(x, w):
        return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))

    for options in (jonnx.compiler_options(), jonnx.compiler_options(library_dots=False)):
        text = jax.jit(conv, compiler_options=options).lower(x, w).compile().as_text()
        assert "convolution(" in text and "ynn_fusion" not in text


def _choices(chooser: jonnx._jit.DotChoosingJit, rows: int) -> list[bool]:
    """The choices made for calls whose inputs held a (rows, 64) float32 array (a segment's key
    ends with its inputs' signature, predict's is that signature)."""
    array = ((rows, 64), "float32")
    return [library for key, library in chooser.library_dots.items() if array in key or array in key[-1]]


@pytest.mark.parametrize("constant_weights", [False, True])
def test_call_chooses_the_dot_library_per_input_shape(constant_weights):
    proto = _constant_weight_classifier()
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    model = jonnx.load(proto, optimize={"constant_weights": constant_weights})
    chooser = model._segments_params
    # The choice is made on the CPU where the jaxlib has the YNNPACK option.
    assert chooser.chooses == (jax.default_backend() == "cpu" and bool(jonnx.compiler_options()))
    rng = np.random.default_rng(1)
    for rows, library in [(2048, False), (100, True)]:
        x = rng.random((rows, 64), np.float32)
        (expected,) = session.run(None, {"x": x})
        np.testing.assert_allclose(np.asarray(model(x)[0]), expected, rtol=1e-5, atol=1e-7)
        if not constant_weights:  # the constant-weights chooser is the same, closed over
            assert _choices(chooser, rows) == ([library] if chooser.chooses else [])
        # A params= call (weights as arguments) goes through the same choice.
        (probs,) = model(x, params=dict(model.params))
        np.testing.assert_allclose(np.asarray(probs), expected, rtol=1e-5, atol=1e-7)
        assert _choices(chooser, rows) == ([library] if chooser.chooses else [])


def test_predict_chooses_the_dot_library_per_input_shape():
    proto = _constant_weight_classifier()
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    model = jonnx.load(proto)
    x = np.random.default_rng(2).random((2048, 64), np.float32)
    (expected,) = session.run(None, {"x": x})
    for batch_size in (None, 1024):
        (probs,) = jonnx.training.predict(model, None, x, batch_size=batch_size)
        np.testing.assert_allclose(np.asarray(probs), expected, rtol=1e-5, atol=1e-7)
    (chooser,) = jonnx.training._inference._COMPILED[model].values()
    # One choice per compiled shape: the whole set, then its chunks.
    assert _choices(chooser, 2048) == _choices(chooser, 1024) == ([False] if chooser.chooses else [])

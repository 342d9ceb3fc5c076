"""Model-local functions: inlined at load, with attribute references, defaults and nesting."""

from __future__ import annotations

import jax
import numpy as np
import onnx
import onnx.helper as oh
import onnxruntime as ort
import pytest

import jonnx
from jonnx import errors

DOMAIN = "test.functions"
X = np.array([-2.0, -0.5, 1.0, 3.0], np.float32)


def _leaky_function(default: float | None = None) -> onnx.FunctionProto:
    node = oh.make_node("LeakyRelu", ["x"], ["y"])
    ref = oh.make_attribute_ref("alpha", onnx.AttributeProto.FLOAT)
    ref.ref_attr_name = "alpha"  # onnx 1.21's helper leaves it empty: a float of value 0
    node.attribute.append(ref)
    function = oh.make_function(
        DOMAIN,
        "Leaky",
        ["x"],
        ["y"],
        [node],
        opset_imports=[oh.make_opsetid("", 18)],
        attributes=[] if default is not None else ["alpha"],
    )
    if default is not None:
        function.attribute_proto.append(oh.make_attribute("alpha", default))
    return function


def _model(nodes, functions, outputs=("y",)) -> onnx.ModelProto:
    graph = oh.make_graph(
        nodes,
        "g",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4])],
        [oh.make_tensor_value_info(o, onnx.TensorProto.FLOAT, [4]) for o in outputs],
    )
    model = oh.make_model(
        graph,
        functions=functions,
        opset_imports=[oh.make_opsetid("", 18), oh.make_opsetid(DOMAIN, 1)],
    )
    model.ir_version = 10  # onnx's default is newer than onnxruntime reads
    return model


def _run(model: onnx.ModelProto) -> list[np.ndarray]:
    return [np.asarray(v) for v in jonnx.load(model)(X)]


@pytest.mark.parametrize("alpha", [0.1, 0.7])
def test_attribute_reference_takes_the_call_value(alpha):
    model = _model([oh.make_node("Leaky", ["x"], ["y"], domain=DOMAIN, alpha=alpha)], [_leaky_function()])
    # onnxruntime as the reference (the ReferenceEvaluator cannot bind attribute references).
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(_run(model)[0], session.run(None, {"x": X})[0], rtol=1e-6)
    np.testing.assert_allclose(_run(model)[0], np.where(X > 0, X, alpha * X), rtol=1e-6)


def test_attribute_default_applies_when_the_call_omits_it():
    model = _model([oh.make_node("Leaky", ["x"], ["y"], domain=DOMAIN)], [_leaky_function(default=0.25)])
    np.testing.assert_allclose(_run(model)[0], np.where(X > 0, X, 0.25 * X), rtol=1e-6)


def test_function_defined_after_its_caller_and_nested_calls():
    outer = oh.make_function(
        DOMAIN,
        "Twice",
        ["a"],
        ["b"],
        [
            oh.make_node("Leaky", ["a"], ["t"], domain=DOMAIN, alpha=0.5),
            oh.make_node("Leaky", ["t"], ["b"], domain=DOMAIN, alpha=0.5),
        ],
        opset_imports=[oh.make_opsetid("", 18), oh.make_opsetid(DOMAIN, 1)],
    )
    # "Twice" calls "Leaky", which is listed after it.
    model = _model([oh.make_node("Twice", ["x"], ["y"], domain=DOMAIN, name="call")], [outer, _leaky_function()])
    np.testing.assert_allclose(_run(model)[0], np.where(X > 0, X, 0.25 * X), rtol=1e-6)
    names = [n.name for n in jonnx.load(model).graph.nodes]
    assert names == ["call/Leaky_0/LeakyRelu_0", "call/Leaky_1/LeakyRelu_0"]


def test_two_calls_keep_their_values_apart_and_are_differentiable():
    body = [oh.make_node("Mul", ["x", "x"], ["sq"]), oh.make_node("Add", ["sq", "x"], ["y"])]
    function = oh.make_function(DOMAIN, "SqPlus", ["x"], ["y"], body, opset_imports=[oh.make_opsetid("", 18)])
    model = _model(
        [oh.make_node("SqPlus", ["x"], ["h"], domain=DOMAIN), oh.make_node("SqPlus", ["h"], ["y"], domain=DOMAIN)],
        [function],
    )
    h = X * X + X
    np.testing.assert_allclose(_run(model)[0], h * h + h, rtol=1e-5)
    m = jonnx.load(model)
    grad = jax.grad(lambda x: m.apply({}, x)[0].sum())(X)
    np.testing.assert_allclose(np.asarray(grad), (2 * h + 1) * (2 * X + 1), rtol=1e-5)


def test_omitted_optional_input_and_unread_output():
    body = [
        oh.make_node("Clip", ["x", "lo", ""], ["y"]),
        oh.make_node("Neg", ["x"], ["unused"]),
    ]
    function = oh.make_function(
        DOMAIN, "Floor0", ["x", "lo"], ["y", "unused"], body, opset_imports=[oh.make_opsetid("", 18)]
    )
    lo = oh.make_node("Constant", [], ["lo"], value=onnx.numpy_helper.from_array(np.array(0.0, np.float32)))
    with_lo = _model([lo, oh.make_node("Floor0", ["x", "lo"], ["y"], domain=DOMAIN)], [function])
    np.testing.assert_allclose(_run(with_lo)[0], np.maximum(X, 0))
    without_lo = _model([oh.make_node("Floor0", ["x"], ["y"], domain=DOMAIN)], [function])
    np.testing.assert_allclose(_run(without_lo)[0], X)


def test_recursive_functions_are_refused():
    a = oh.make_function(
        DOMAIN,
        "A",
        ["x"],
        ["y"],
        [oh.make_node("B", ["x"], ["y"], domain=DOMAIN)],
        opset_imports=[oh.make_opsetid(DOMAIN, 1)],
    )
    b = oh.make_function(
        DOMAIN,
        "B",
        ["x"],
        ["y"],
        [oh.make_node("A", ["x"], ["y"], domain=DOMAIN)],
        opset_imports=[oh.make_opsetid(DOMAIN, 1)],
    )
    with pytest.raises(errors.ModelStructureError, match="call themselves.*A -> .*B -> .*A"):
        jonnx.load(_model([oh.make_node("A", ["x"], ["y"], domain=DOMAIN)], [a, b]))


def test_call_with_too_many_inputs_names_the_call():
    model = _model(
        [oh.make_node("Leaky", ["x", "x"], ["y"], domain=DOMAIN, name="bad", alpha=0.1)], [_leaky_function()]
    )
    with pytest.raises(errors.ModelStructureError, match="'bad'.*2 inputs.*takes 1"):
        jonnx.load(model)


def test_function_body_uses_its_own_opset():
    # The model imports opset 11, where ReduceSum takes `axes` as an attribute; the function
    # imports opset 18, where it is an input.
    axes = oh.make_node("Constant", [], ["axes"], value=onnx.numpy_helper.from_array(np.array([0], np.int64)))
    body = [axes, oh.make_node("ReduceSum", ["x", "axes"], ["s"], keepdims=1), oh.make_node("Sub", ["x", "s"], ["y"])]
    function = oh.make_function(DOMAIN, "Center", ["x"], ["y"], body, opset_imports=[oh.make_opsetid("", 18)])
    graph = oh.make_graph(
        [oh.make_node("Center", ["x"], ["y"], domain=DOMAIN)],
        "g",
        [oh.make_tensor_value_info("x", 1, [4])],
        [oh.make_tensor_value_info("y", 1, [4])],
    )
    model = oh.make_model(
        graph, functions=[function], opset_imports=[oh.make_opsetid("", 11), oh.make_opsetid(DOMAIN, 1)]
    )
    np.testing.assert_allclose(_run(model)[0], X - X.sum(), rtol=1e-6)

"""Gradients through a segmented model: ``jax.grad`` of a loss over ``model(x, params=p)``.

The host node (NonMaxSuppression, Compress's condition) only decides indices; the values
gathered by them stay differentiable. Expected gradients are central finite differences of
the loss computed by onnxruntime on the model with perturbed weights, along random directions.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import onnx.helper as oh
import pytest
from onnx import TensorProto, numpy_helper

import jonnx
from jonnx import errors
from tests.test_segments import _detector, _early_exit_network, _init

ort = pytest.importorskip("onnxruntime")


def _ort_outputs(proto: onnx.ModelProto, weights: dict, feeds: dict) -> list:
    proto = onnx.ModelProto.FromString(proto.SerializeToString())
    for tensor in proto.graph.initializer:
        if tensor.name in weights:
            tensor.CopyFrom(numpy_helper.from_array(weights[tensor.name], tensor.name))
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _check_directional_derivatives(proto, model, grads, feeds, loss, names, index_output=None):
    """grad . v against (L(w + eps v) - L(w - eps v)) / (2 eps), with L from onnxruntime."""
    weights = {n: np.asarray(model.params[n], np.float64) for n in names}
    rng = np.random.default_rng(5)
    eps = 1e-3
    checked = 0
    for _ in range(6):
        direction = {n: rng.normal(0, 1, w.shape) for n, w in weights.items()}
        side = []
        for sign in (1, -1):
            moved = {n: (w + sign * eps * direction[n]).astype(np.float32) for n, w in weights.items()}
            outputs = _ort_outputs(proto, moved, feeds)
            side.append((loss(outputs), None if index_output is None else outputs[index_output]))
        if index_output is not None and not np.array_equal(np.sort(side[0][1], axis=0), np.sort(side[1][1], axis=0)):
            # The host node's choice is piecewise constant: the difference is a derivative
            # only where both sides select the same rows (the losses ignore their order).
            continue
        want = (side[0][0] - side[1][0]) / (2 * eps)
        got = sum(float(np.sum(np.asarray(grads[n], np.float64) * direction[n])) for n in names)
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)
        checked += 1
    assert checked >= 3, "too few directions kept the host node's choice"


def test_grad_through_nms_detector_matches_finite_differences():
    proto = _detector()
    model = jonnx.load(proto)
    assert model.segment_plan.segmented
    image = np.random.default_rng(1).normal(0, 1, (1, 3, 8, 8)).astype(np.float32)

    def loss(params):
        detections, _ = model(image, params=params)
        return jnp.sum(detections**2)

    value, grads = jax.value_and_grad(loss)(model.params)
    want = _ort_outputs(proto, {}, {"image": image})
    assert len(want[1]) > 1, "the image should give several detections"
    np.testing.assert_allclose(float(value), np.sum(want[0].astype(np.float64) ** 2), rtol=1e-5)
    assert float(jnp.abs(grads["w1"]).sum()) > 0
    _check_directional_derivatives(
        proto,
        model,
        grads,
        {"image": image},
        lambda outputs: np.sum(outputs[0].astype(np.float64) ** 2),
        ["w1", "b1", "w2", "b2", "anchors"],
        index_output=1,
    )


def _compress_model() -> onnx.ModelProto:
    """x @ w -> keep the rows whose first column is positive (Compress) -> tanh."""
    rng = np.random.default_rng(2)
    nodes = [
        oh.make_node("MatMul", ["x", "w"], ["y"]),
        oh.make_node("Gather", ["y", "zero"], ["first"], axis=1),
        oh.make_node("Greater", ["first", "threshold"], ["keep"]),
        oh.make_node("Compress", ["y", "keep"], ["kept"], axis=0),
        oh.make_node("Tanh", ["kept"], ["out"]),
    ]
    graph = oh.make_graph(
        nodes,
        "compress",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, [6, 3])],
        [oh.make_tensor_value_info("out", TensorProto.FLOAT, ["n", 4])],
        [
            _init("w", rng.normal(0, 1, (3, 4)).astype(np.float32)),
            _init("zero", np.array(0, np.int64)),
            _init("threshold", np.array(0.0, np.float32)),
        ],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])


def test_grad_through_compress_matches_finite_differences():
    proto = _compress_model()
    model = jonnx.load(proto)
    assert [model.graph.nodes[p].op_type for p in model.segment_plan.host_nodes] == ["Compress"]
    x = np.random.default_rng(3).normal(0, 1, (6, 3)).astype(np.float32)
    weights = np.linspace(0.5, 2.0, 4, dtype=np.float32)

    def loss(params):
        (out,) = model(x, params=params)
        return jnp.sum(out * weights)

    grads = jax.grad(loss)(model.params)
    (want,) = _ort_outputs(proto, {}, {"x": x})
    assert 0 < len(want) < 6
    _check_directional_derivatives(
        proto,
        model,
        grads,
        {"x": x},
        lambda outputs: np.sum(outputs[0].astype(np.float64) * weights),
        ["w"],
    )


def _index_models():
    """x @ w -> y, then indices computed from y's values select entries of y."""
    f, i64 = TensorProto.FLOAT, TensorProto.INT64
    head = [oh.make_node("MatMul", ["x", "w"], ["y"])]
    inits = [
        _init("w", np.random.default_rng(4).normal(0, 1, (3, 4)).astype(np.float32)),
        _init("zero", np.array(0.0, np.float32)),
        _init("one", np.array([1], np.int64)),
    ]
    nonzero = [
        oh.make_node("Greater", ["y", "zero"], ["pos"]),
        oh.make_node("NonZero", ["pos"], ["nz"]),
        oh.make_node("Transpose", ["nz"], ["idx"], perm=[1, 0]),
        oh.make_node("GatherND", ["y", "idx"], ["out"]),
    ]
    topk = [
        oh.make_node("Greater", ["y", "zero"], ["pos"]),
        oh.make_node("Cast", ["pos"], ["posi"], to=i64),
        oh.make_node("ReduceSum", ["posi"], ["k_all"], keepdims=1),
        oh.make_node("Reshape", ["k_all", "one"], ["k"]),
        oh.make_node("Flatten", ["y"], ["flat"], axis=0),
        oh.make_node("TopK", ["flat", "k"], ["out", "idx"], axis=1),
    ]
    for name, nodes in (("NonZero", nonzero), ("TopK", topk)):
        graph = oh.make_graph(
            head + nodes,
            name,
            [oh.make_tensor_value_info("x", f, [6, 3])],
            [
                oh.make_tensor_value_info("out", f, None),
                oh.make_tensor_value_info("idx", i64, None),
            ],
            inits,
        )
        yield name, oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])


@pytest.mark.parametrize("name, proto", list(_index_models()), ids=lambda v: v if isinstance(v, str) else "")
def test_grad_through_computed_indices_matches_finite_differences(name, proto):
    model = jonnx.load(proto)
    assert model.segment_plan.segmented
    x = np.random.default_rng(3).normal(0, 1, (6, 3)).astype(np.float32)

    def loss(params):
        out, _ = model(x, params=params)
        return jnp.sum(jnp.sin(out))

    value, grads = jax.value_and_grad(loss)(model.params)
    want = _ort_outputs(proto, {}, {"x": x})
    np.testing.assert_allclose(float(value), np.sum(np.sin(want[0].astype(np.float64))), rtol=1e-5)
    _check_directional_derivatives(
        proto,
        model,
        grads,
        {"x": x},
        lambda outputs: np.sum(np.sin(outputs[0].astype(np.float64))),
        ["w"],
        index_output=1,
    )


def test_grad_wrt_inputs_and_partial_params():
    """Inputs can be differentiated too; params left out keep the model's own values."""
    proto = _compress_model()
    model = jonnx.load(proto)
    x = np.random.default_rng(3).normal(0, 1, (6, 3)).astype(np.float32)
    (out,) = model(x, params={})
    (want,) = _ort_outputs(proto, {}, {"x": x})
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-6)
    grad_x = jax.grad(lambda x: jnp.sum(model(x)[0]))(jnp.asarray(x))
    # d/dx sum(tanh(x @ w)) over the kept rows, by hand: (1 - tanh^2) @ w.T on those rows.
    w = np.asarray(model.params["w"], np.float64)
    y = x.astype(np.float64) @ w
    keep = y[:, 0] > 0
    expected = np.where(keep[:, None], (1 - np.tanh(y) ** 2) @ w.T, 0.0)
    np.testing.assert_allclose(np.asarray(grad_x), expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(errors.InputError, match="nope"):
        model(x, params={"nope": np.zeros(1, np.float32)})


def test_grad_under_jit_names_the_host_node():
    model = jonnx.load(_compress_model())
    x = np.ones((6, 3), np.float32)
    with pytest.raises(errors.StaticValueError, match="Compress"):
        jax.jit(jax.grad(lambda p: jnp.sum(model(x, params=p)[0])))(model.params)


def test_dynamic_shapes_doc_examples_run():
    import doctest
    from pathlib import Path

    path = Path(__file__).parents[1] / "docs" / "dynamic_shapes.md"
    result = doctest.testfile(
        str(path),
        module_relative=False,
        optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
    )
    assert result.attempted > 0 and result.failed == 0


def test_grad_over_apply_of_a_host_node_says_what_to_call():
    model = jonnx.load(_detector())
    image = np.zeros((1, 3, 8, 8), np.float32)
    with pytest.raises(errors.StaticValueError, match=r"params=p"):
        jax.grad(lambda p: jnp.sum(model.apply(p, image)[0]))(model.params)


def test_params_override_the_compiled_in_weights():
    """With constant_weights, Model(x) compiles the model's own weights in; params= must not."""
    proto = _compress_model()
    model = jonnx.load(proto, optimize={"constant_weights": True})
    x = np.random.default_rng(3).normal(0, 1, (6, 3)).astype(np.float32)
    w = -np.asarray(model.params["w"])
    (got,) = model(x, params={"w": w})
    (want,) = _ort_outputs(proto, {"w": w}, {"x": x})
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)
    grads = jax.grad(lambda p: jnp.sum(model(x, params=p)[0]))(model.params)
    assert float(jnp.abs(grads["w"]).sum()) > 0


@pytest.mark.parametrize("inside_if", [False, True], ids=["loop", "loop-in-if"])
def test_grad_through_a_loop_run_on_the_host_matches_finite_differences(inside_if):
    # The Loop stacks a data-dependent number of rows, so it runs on the host, unrolled on the
    # gradient's tracers: the parameters it reads from the outer scope (w, v) and the one
    # before it (w0) get their gradients through it.
    proto = _early_exit_network(inside_if=inside_if)
    model = jonnx.load(proto)
    feeds = {"x": np.float32([1.0, 2.0, 3.0]), "limit": np.array(500.0, np.float32)}
    weights = np.float32([0.3, -0.7, 1.1])

    def loss(params):
        h_last, total = model(**feeds, params=params)
        return jnp.sum(h_last * weights) + jnp.sum(total)

    names = ["w0", "w", "v"]
    grads = jax.grad(loss)({n: model.params[n] for n in names})
    assert model.segment_plan.host_nodes
    assert len(model._loop_bodies) == 1  # its body ran compiled, with its compiled pullback
    _check_directional_derivatives(
        proto, model, grads, feeds, lambda out: float(np.sum(out[0] * weights) + np.sum(out[1])), names
    )


def _lone_loop() -> onnx.ModelProto:
    """The early-exit Loop alone (h = h * w + v while sum(h^2) < limit, stacking h^2): no
    compiled segment around it, so forward mode and second derivatives reach its body."""
    proto = _early_exit_network()
    graph = proto.graph
    loop = next(n for n in graph.node if n.op_type == "Loop")
    loop.input[2] = "x"
    del graph.node[:]
    graph.node.append(loop)
    del graph.output[:]
    f = TensorProto.FLOAT
    graph.output.extend(
        [oh.make_tensor_value_info("h_last", f, [3]), oh.make_tensor_value_info("stacked", f, [None, 3])]
    )
    return proto


def test_forward_mode_and_second_derivatives_through_a_host_loop():
    # The compiled body is a custom_vjp for one reverse-mode level; jvp and grad-of-grad run
    # the body node by node. Expected values: central differences of the loop written in
    # float64 numpy (which must give onnxruntime's loss), six iterations on both sides.
    proto = _lone_loop()
    model = jonnx.load(proto)
    feeds = {"x": np.float32([1.0, 2.0, 3.0]), "limit": np.array(500.0, np.float32)}
    p = {n: np.asarray(model.params[n], np.float64) for n in ("w", "v")}

    def numpy_loss(w):
        h, total = feeds["x"].astype(np.float64), 0.0
        for _ in range(20):  # the trip count M
            h = h * w + p["v"]
            total += np.sum(h * h)
            if not np.sum(h * h) < feeds["limit"]:
                break
        return float(np.sum(h) + total)

    def loss(weights):
        h_last, stacked = model(**feeds, params={"w": weights})
        return jnp.sum(h_last) + jnp.sum(stacked)

    h_last, stacked = _ort_outputs(proto, {}, feeds)
    np.testing.assert_allclose(numpy_loss(p["w"]), np.sum(h_last) + np.sum(stacked), rtol=1e-6)
    direction, eps = np.float64([0.4, -1.0, 0.7]), 1e-4
    ahead, here, behind = (numpy_loss(p["w"] + k * eps * direction) for k in (1, 0, -1))
    w32, d32 = jnp.float32(p["w"]), jnp.float32(direction)
    _, forward = jax.jvp(loss, (w32,), (d32,))
    np.testing.assert_allclose(float(forward), (ahead - behind) / (2 * eps), rtol=1e-4)
    reverse = jax.grad(loss)(w32)
    np.testing.assert_allclose(float(jnp.dot(reverse, d32)), (ahead - behind) / (2 * eps), rtol=1e-4)
    along = jax.grad(lambda t: jnp.dot(jax.grad(loss)(w32 + t * d32), d32))(jnp.float32(0))
    np.testing.assert_allclose(float(along), (ahead - 2 * here + behind) / eps**2, rtol=1e-4)


def test_grad_through_a_bounded_loop_inside_jit_matches_finite_differences():
    # size_bounds={"Loop": None}: one scan of the trip count's length, differentiable in jit.
    proto = _early_exit_network()
    model = jonnx.load(proto, size_bounds={"Loop": None})
    feeds = {"x": np.float32([1.0, 2.0, 3.0]), "limit": np.array(500.0, np.float32)}
    weights = np.float32([0.3, -0.7, 1.1])
    names = ["w0", "w", "v"]

    @jax.jit
    def grads(params):
        def loss(params):
            h_last, total, _ = model.apply({**model.params, **params}, *feeds.values())
            return jnp.sum(h_last * weights) + jnp.sum(total)

        return jax.grad(loss)(params)

    _check_directional_derivatives(
        proto,
        model,
        grads({n: model.params[n] for n in names}),
        feeds,
        lambda out: float(np.sum(out[0] * weights) + np.sum(out[1])),
        names,
    )

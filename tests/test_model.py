"""The public Model API: params, apply, __call__, jit/grad/vmap, static values, custom ops."""

from __future__ import annotations

import gc
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import onnx.helper as oh
import onnxruntime as ort
import pytest

import jonnx
from jonnx import errors

TEST_DOMAIN = "jonnx.tests.model"
MODELS = pathlib.Path(__file__).resolve().parents[1] / "examples" / "models"


@jonnx.register("ScaleBy", since=1, domain=TEST_DOMAIN, static_inputs=(1,))
def _scale_by(inputs, attrs, ctx):
    """A custom op whose second input must be static (it is read as a Python float)."""
    x, factor = inputs
    return (x * float(np.asarray(factor).reshape(())),)


@jonnx.register("CountTraces", since=1, domain=TEST_DOMAIN)
def _count_traces(inputs, attrs, ctx):
    _TRACES.append(jnp.shape(inputs[0]))
    return (inputs[0],)


_TRACES: list = []


@jonnx.register("Fails", since=1, domain=TEST_DOMAIN)
def _fails(inputs, attrs, ctx):
    raise ValueError("the body's own failure")


def _model(nodes, inputs, outputs, inits=(), extra_opsets=()) -> onnx.ModelProto:
    graph = oh.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17), *extra_opsets])


def _flatten_by_shape() -> onnx.ModelProto:
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape, as PyTorch exports x.view(x.size(0), -1)."""
    n = oh.make_node
    nodes = [
        n("Shape", ["x"], ["s"]),
        n("Gather", ["s", "zero"], ["batch"], axis=0),
        n("Unsqueeze", ["batch", "zero1"], ["batch1"]),
        n("Concat", ["batch1", "minus1"], ["target"], axis=0),
        n("Reshape", ["x", "target"], ["flat"]),
        n("MatMul", ["flat", "w"], ["y"]),
    ]
    inits = [
        onnx.numpy_helper.from_array(np.array(0, np.int64), "zero"),
        onnx.numpy_helper.from_array(np.array([0], np.int64), "zero1"),
        onnx.numpy_helper.from_array(np.array([-1], np.int64), "minus1"),
        onnx.numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(6, 2) / 10, "w"),
    ]
    return _model(
        nodes, [oh.make_tensor_value_info("x", 1, ["N", 2, 3])], [oh.make_tensor_value_info("y", 1, ["N", 2])], inits
    )


def test_params_are_the_float_initializers():
    m = jonnx.load(_flatten_by_shape())
    assert set(m.params) == {"w"}
    assert isinstance(m.params["w"], jax.Array)
    m.params.clear()  # a fresh dict each time: the model is not changed
    assert set(m.params) == {"w"}


def test_float_initializer_feeding_a_static_input_is_a_constant():
    model = _model(
        [oh.make_node("ScaleBy", ["x", "factor"], ["y"], domain=TEST_DOMAIN)],
        [oh.make_tensor_value_info("x", 1, [2])],
        [oh.make_tensor_value_info("y", 1, [2])],
        [onnx.numpy_helper.from_array(np.array(3.0, np.float32), "factor")],
        [oh.make_opsetid(TEST_DOMAIN, 1)],
    )
    m = jonnx.load(model)
    assert m.params == {}
    np.testing.assert_allclose(np.asarray(jax.jit(m.apply)({}, np.ones(2, np.float32))[0]), [3.0, 3.0])


def _f32(name, value):
    return onnx.numpy_helper.from_array(np.asarray(value, np.float32), name)


def test_op_settings_are_constants_not_params():
    # ReLU6 as exporters write it (Clip with its bounds as initializers), Pad's fill value,
    # Dropout's ratio: ONNX defines no derivative for those inputs, so one-element
    # initializers read only there are settings. The weight beside them trains.
    n = oh.make_node
    nodes = [
        n("Mul", ["x", "w"], ["a"]),
        n("Clip", ["a", "lo", "hi"], ["b"]),
        n("Pad", ["b", "pads", "fill"], ["c"]),
        n("Dropout", ["c", "ratio"], ["y"]),
    ]
    inits = [
        _f32("w", [2.0, -1.0]),
        _f32("lo", 0.0),
        _f32("hi", 6.0),
        onnx.numpy_helper.from_array(np.array([1, 1], np.int64), "pads"),
        _f32("fill", 7.0),
        _f32("ratio", 0.5),
    ]
    m = jonnx.load(
        _model(nodes, [oh.make_tensor_value_info("x", 1, [2])], [oh.make_tensor_value_info("y", 1, [4])], inits)
    )
    assert set(m.params) == {"w"}
    x = np.array([4.0, -3.0], np.float32)
    np.testing.assert_allclose(np.asarray(m(x)[0]), [7.0, 6.0, 3.0, 7.0])
    grad = jax.grad(lambda p: m.apply(p, x)[0].sum())(m.params)
    np.testing.assert_allclose(np.asarray(grad["w"]), [0.0, -3.0])  # 8 is clipped, -(-3) = 3 is not


def test_a_setting_read_where_it_has_a_derivative_stays_a_param():
    # The same one-element value as a Clip bound and as a Mul operand is a weight; so is a
    # tensor read where its schema marks it non-differentiable (a comparison's thresholds
    # here; an RNN's learned initial state in practice), and a one-element value read by a
    # custom op (no schema to say otherwise).
    n = oh.make_node
    nodes = [
        n("Clip", ["x", "lo", "hi"], ["a"]),
        n("Mul", ["a", "hi"], ["b"]),
        n("Clip", ["b", "lo", "theta"], ["c"]),
        n("ScaleBy", ["c", "factor"], ["d"], domain=TEST_DOMAIN),
        n("CountTraces", ["d"], ["y"], domain=TEST_DOMAIN),
        n("CountTraces", ["one"], ["z"], domain=TEST_DOMAIN),
        n("Greater", ["x", "limits"], ["g"]),
    ]
    inits = [_f32("lo", 0.0), _f32("hi", 2.0), _f32("theta", 3.0), _f32("factor", 0.5), _f32("one", 1.0)]
    inits.append(_f32("limits", [0.0, 1.0]))
    model = _model(
        nodes,
        [oh.make_tensor_value_info("x", 1, [2])],
        [
            oh.make_tensor_value_info("y", 1, [2]),
            oh.make_tensor_value_info("z", 1, []),
            oh.make_tensor_value_info("g", onnx.TensorProto.BOOL, [2]),
        ],
        inits,
        [oh.make_opsetid(TEST_DOMAIN, 1)],
    )
    m = jonnx.load(model)
    # lo and theta are read only as bounds; factor must be static; one is read by a custom op.
    assert set(m.params) == {"hi", "one", "limits"}


@pytest.mark.parametrize("batch", [1, 3, 7])
def test_dynamic_batch_shape_arithmetic_stays_static_under_jit(batch):
    m = jonnx.load(_flatten_by_shape())
    x = np.random.default_rng(batch).standard_normal((batch, 2, 3)).astype(np.float32)
    want = x.reshape(batch, -1) @ (np.arange(12, dtype=np.float32).reshape(6, 2) / 10)
    np.testing.assert_allclose(np.asarray(jax.jit(m.apply)(m.params, x)[0]), want, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(m(x)[0]), want, rtol=1e-5)


def test_vmap_over_inputs_and_over_params():
    m = jonnx.load(_flatten_by_shape())
    xs = np.random.default_rng(0).standard_normal((5, 4, 2, 3)).astype(np.float32)
    batched = jax.vmap(lambda x: m.apply(m.params, x)[0])(xs)
    want = np.stack([x.reshape(4, -1) @ np.asarray(m.params["w"]) for x in xs])
    np.testing.assert_allclose(np.asarray(batched), want, rtol=1e-5)
    ws = jnp.stack([m.params["w"] * k for k in range(3)])
    ensemble = jax.vmap(lambda w: m.apply({"w": w}, xs[0])[0])(ws)
    np.testing.assert_allclose(np.asarray(ensemble[2]), 2 * want[0], rtol=1e-5)


@pytest.mark.parametrize("optimize", [True, {"fold_batchnorm": True}, {"constant_weights": True}])
def test_call_under_the_callers_jit(optimize):
    # The call's own compiled segments carry XLA compiler options, which JAX refuses on a jit
    # nested in another: under the caller's jit the call is traced into it instead. The folded
    # BatchNorm weights of the second case are first prepared during that trace.
    path = MODELS / "small_cnn.onnx"
    x = np.random.default_rng(2).standard_normal((2, 3, 16, 16)).astype(np.float32)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    want = session.run(None, {"image": x})[0]
    model = jonnx.load(path, optimize=optimize)
    np.testing.assert_allclose(np.asarray(jax.jit(lambda x: model(x))(x)[0]), want, rtol=1e-4, atol=1e-5)
    # Concrete inputs inside the caller's jit (a closure over a numpy array) too.
    np.testing.assert_allclose(np.asarray(jax.jit(lambda: model(x))()[0]), want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(model(x)[0]), want, rtol=1e-4, atol=1e-5)

    # The gradient through the traced call, against apply's (checked against finite
    # differences in test_grad_matches_finite_differences and tests/test_gradients.py).
    traced = jax.jit(jax.grad(lambda p: jnp.sum(model(x, params=p)[0] ** 2)))(model.params)
    want = jax.jit(jax.grad(lambda p: jnp.sum(model.apply(p, x)[0] ** 2)))(model.params)
    assert set(traced) == set(want)
    for name in want:
        np.testing.assert_allclose(np.asarray(traced[name]), np.asarray(want[name]), rtol=1e-4, atol=1e-5)


def _session_holding(path: pathlib.Path, values: dict) -> ort.InferenceSession:
    """onnxruntime on the model at ``path`` with these initializers' values replaced."""
    proto = onnx.load(path)
    for tensor in proto.graph.initializer:
        if tensor.name in values:
            tensor.CopyFrom(onnx.numpy_helper.from_array(np.asarray(values[tensor.name]), tensor.name))
    return ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("optimize", [True, {"fold_batchnorm": True}])
def test_call_with_given_params_and_state_against_onnxruntime(optimize):
    """``Model(x, params=, state=)`` runs the call's segments on those values. The weight-only
    nodes' results (the layout pass's kernel relayouts; BatchNorm folded into the kernels,
    which reads the running statistics too) are kept for the next call with the same arrays,
    never served to other arrays, and dropped with the arrays."""
    path = MODELS / "small_cnn.onnx"
    model = jonnx.load(path, optimize=optimize)
    assert model._prepared_exports  # the premise: relayouts prepared per set of weights
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 16, 16)).astype(np.float32)
    params = {k: v * (0.5 + rng.random(v.shape, np.float32)) for k, v in model.params.items()}
    doubled = {k: 2 * v for k, v in params.items()}
    state = {
        k: v * (0.5 + rng.random(v.shape, np.float32)) + (0.0 if "var" in k else 0.3) for k, v in model.state.items()
    }
    for given, statistics in [(params, None), (params, state), (doubled, state), (params, state), (None, state)]:
        want = _session_holding(path, {**(given or {}), **(statistics or {})}).run(None, {"image": x})[0]
        (got,) = model(x, params=given, state=statistics)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-5)
    assert model._prepared_given  # the last arrays' relayouts
    del params, doubled, state, given, statistics
    gc.collect()
    assert not model._prepared_given
    with pytest.raises(errors.InputError, match="not state values"):
        model(x, state={"block1.weight": model.params["block1.weight"]})


def _conv_bn(training_mode: int) -> onnx.ModelProto:
    """Conv -> BatchNormalization-15 with this training_mode -> Relu, NCHW."""
    rng = np.random.default_rng(4)
    inits = [
        onnx.numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
        *(onnx.numpy_helper.from_array(rng.random(4).astype(np.float32) + 0.5, n) for n in ("scale", "var")),
        *(onnx.numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), n) for n in ("bias", "mean")),
    ]
    nodes = [
        oh.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        oh.make_node(
            "BatchNormalization",
            ["c", "scale", "bias", "mean", "var"],
            ["b", "new_mean", "new_var"] if training_mode else ["b"],
            training_mode=training_mode,
        ),
        oh.make_node("Relu", ["b"], ["y"]),
    ]
    graph = oh.make_graph(
        nodes,
        "g",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 3, 8, 8])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 4, 8, 8])],
        inits,
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 15)])


@pytest.mark.parametrize("optimize", [True, {"constant_weights": True}, False])
def test_call_in_inference_mode_on_a_graph_exported_in_training_mode(optimize):
    """``Model(x, train=False)`` runs inference everywhere (BatchNormalization on its running
    statistics), ``Model(x)`` the graph's own mode (batch statistics): each against
    onnxruntime on the graph in that mode, with the passes that fold and relayout on or off."""
    model = jonnx.load(_conv_bn(training_mode=1), optimize=optimize)
    assert model.trains_by_default
    x = np.random.default_rng(5).standard_normal((4, 3, 8, 8)).astype(np.float32)
    for training_mode, train in [(0, False), (1, None), (0, False)]:
        session = ort.InferenceSession(_conv_bn(training_mode).SerializeToString(), providers=["CPUExecutionProvider"])
        (want,) = session.run(None, {"x": x})
        np.testing.assert_allclose(np.asarray(model(x, train=train)[0]), want, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="train=None .* or False"):
        model(x, train=True)


def test_grad_matches_finite_differences():
    m = jonnx.load(_flatten_by_shape())
    x = np.random.default_rng(1).standard_normal((3, 2, 3)).astype(np.float64)

    with jax.enable_x64(True):
        params = {"w": jnp.asarray(m.params["w"], jnp.float64)}

        def loss(p):
            return jnp.sum(jnp.tanh(m.apply(p, x)[0]))

        g = jax.grad(loss)(params)["w"]
        eps = 1e-6
        numeric = np.zeros(params["w"].shape)
        for idx in np.ndindex(*numeric.shape):
            d = np.zeros(numeric.shape)
            d[idx] = eps
            numeric[idx] = (loss({"w": params["w"] + d}) - loss({"w": params["w"] - d})) / (2 * eps)
        np.testing.assert_allclose(np.asarray(g), numeric, rtol=1e-6, atol=1e-8)


def test_inputs_by_keyword_and_input_errors():
    m = jonnx.load(_flatten_by_shape())
    x = np.ones((2, 2, 3), np.float32)
    np.testing.assert_array_equal(np.asarray(m(x=x)[0]), np.asarray(m(x)[0]))
    with pytest.raises(errors.InputError, match="missing"):
        m()
    with pytest.raises(errors.InputError, match="no input named 'z'"):
        m(z=x)
    with pytest.raises(errors.InputError, match="both by position and by name"):
        m(x, x=x)
    with pytest.raises(errors.InputError, match="takes 1 input"):
        m(x, x)
    with pytest.raises(errors.InputError, match="not trainable initializers"):
        m.apply({"nope": x}, x)
    assert list(m.bind(x)) == ["x"] and m.bind(x=x)["x"] is x
    with pytest.raises(errors.InputError, match="missing"):
        m.bind()


def _reshape_by_input() -> onnx.ModelProto:
    return _model(
        [oh.make_node("Reshape", ["x", "shape"], ["y"], name="the_reshape")],
        [oh.make_tensor_value_info("x", 1, [6]), oh.make_tensor_value_info("shape", 7, [2])],
        [oh.make_tensor_value_info("y", 1, None)],
    )


def test_graph_input_feeding_a_shape_is_static_in_call():
    m = jonnx.load(_reshape_by_input())
    assert m.static_input_names == ("shape",)
    x = np.arange(6, dtype=np.float32)
    assert m(x, np.array([2, 3]))[0].shape == (2, 3)
    assert m(x, np.array([3, 2]))[0].shape == (3, 2)


def test_traced_static_input_names_node_input_and_chain():
    m = jonnx.load(_reshape_by_input())
    with pytest.raises(errors.StaticValueError, match=r"'the_reshape'.*input 1 \('shape'\).*input of graph"):
        jax.jit(m.apply)({}, np.arange(6, dtype=np.float32), np.array([2, 3]))


def test_call_compiles_once_per_signature():
    model = _model(
        [oh.make_node("CountTraces", ["x"], ["y"], domain=TEST_DOMAIN)],
        [oh.make_tensor_value_info("x", 1, ["N"])],
        [oh.make_tensor_value_info("y", 1, ["N"])],
        extra_opsets=[oh.make_opsetid(TEST_DOMAIN, 1)],
    )
    m = jonnx.load(model)
    _TRACES.clear()
    for _ in range(3):
        m(np.ones(4, np.float32))
    m(np.ones(5, np.float32))
    assert _TRACES == [(4,), (5,)]


def test_custom_domain_op_runs_and_double_registration_raises():
    model = _model(
        [oh.make_node("ScaleBy", ["x", "f"], ["y"], domain=TEST_DOMAIN)],
        [oh.make_tensor_value_info("x", 1, [2])],
        [oh.make_tensor_value_info("y", 1, [2])],
        [onnx.numpy_helper.from_array(np.array(2.0, np.float32), "f")],
        [oh.make_opsetid(TEST_DOMAIN, 4)],  # newest registered version <= 4 is used
    )
    np.testing.assert_array_equal(np.asarray(jonnx.load(model)(np.ones(2, np.float32))[0]), [2.0, 2.0])
    with pytest.raises(ValueError, match="already registered"):
        jonnx.register("ScaleBy", since=1, domain=TEST_DOMAIN)(_scale_by)


def test_ops_callable_without_a_model():
    x = np.array([-1.0, 4.0], np.float32)
    np.testing.assert_array_equal(np.asarray(jonnx.ops.Sqrt(np.abs(x))), [1.0, 2.0])
    np.testing.assert_array_equal(np.asarray(jonnx.ops.call("Reshape", x, np.array([2, 1]))), [[-1.0], [4.0]])
    with pytest.raises(AttributeError):
        jonnx.ops.NoSuchOp  # noqa: B018


def test_int64_with_x64_disabled_computes_in_int32():
    # Documented behaviour: with jax_enable_x64 off (JAX's default) int64 tensors are held as
    # int32; shape arithmetic folded at trace time stays exact in int64.
    model = _model(
        [oh.make_node("Add", ["a", "b"], ["y"])],
        [oh.make_tensor_value_info("a", 7, [2]), oh.make_tensor_value_info("b", 7, [2])],
        [oh.make_tensor_value_info("y", 7, [2])],
    )
    (y,) = jonnx.load(model)(np.array([1, 2], np.int64), np.array([3, 4], np.int64))
    assert y.dtype == (jnp.int64 if jax.config.jax_enable_x64 else jnp.int32)
    np.testing.assert_array_equal(np.asarray(y), [4, 6])


def test_node_errors_name_the_node():
    model = _model(
        [oh.make_node("Reshape", ["x", "shape"], ["y"], name="bad_reshape")],
        [oh.make_tensor_value_info("x", 1, [6])],
        [oh.make_tensor_value_info("y", 1, None)],
        [onnx.numpy_helper.from_array(np.array([4, 4], np.int64), "shape")],
    )
    with pytest.raises(errors.NodeError, match="'bad_reshape'.*cannot reshape"):
        jonnx.load(model)(np.ones(6, np.float32))


def test_an_op_body_failure_names_the_node():
    # At jax 0.8 a lookup in the interpreter's except clauses turned this into AttributeError.
    proto = _model(
        [oh.make_node("Fails", ["x"], ["y"], name="bad", domain=TEST_DOMAIN)],
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])],
        extra_opsets=[oh.make_opsetid(TEST_DOMAIN, 1)],
    )
    with pytest.raises(errors.NodeError, match="node 'bad'.*ValueError: the body's own failure"):
        jonnx.load(proto)(np.zeros(2, np.float32))

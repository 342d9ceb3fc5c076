"""examples/custom_ops.py: custom-domain ops registered with ``jonnx.register``.

The example registers its five ops when imported, and registering a key twice raises, so the
module is loaded once per process (from its path, cached in ``sys.modules``) and reused.
Expected values come from the example's numpy implementations (computed in float64), from
hand-worked small cases, and for DepthwiseConv2d from onnxruntime's grouped ``Conv``; never
from jonnx itself.
"""

from __future__ import annotations

import importlib.util
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import onnx.helper as oh
import pytest
from jax.test_util import check_grads

import jonnx
from jonnx import errors
from tests._scripts import load_script

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "custom_ops.py"
MODULE_NAME = "_jonnx_example_custom_ops"


ex = load_script(EXAMPLE, MODULE_NAME)
RNG = np.random.default_rng(0)


def call(op_type, *inputs, **attrs):
    return np.asarray(jonnx.ops.call(op_type, *inputs, domain=ex.DOMAIN, **attrs))


def f32(*shape, low=-1.0, high=1.0):
    return RNG.uniform(low, high, shape).astype(np.float32)


def close(actual, expected, tol=1e-5):
    np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol)


# -- the example as a whole ----------------------------------------------------------------------


def test_main_runs_and_checks_itself(capsys):
    ex.main()  # asserts agreement with numpy and the finite-difference gradient itself
    out = capsys.readouterr().out
    assert "numpy reference agrees" in out and "directional derivative" in out
    for op in ("Add_", "Dense", "DepthwiseConv2d", "Relu6", "UpSampling2D"):
        assert op in out


@pytest.mark.parametrize("batch", [1, 3])
def test_network_matches_numpy_under_jit(batch):
    weights = ex.make_weights(seed=batch)
    model = jonnx.load(ex.build_model(weights))
    assert {n.op_type for n in model.graph.nodes if n.domain == ex.DOMAIN} == set(ex.ATTRIBUTES)
    images = f32(batch, 8, 8, 3, low=-2, high=2)
    logits, probs = jax.jit(model.apply)(model.params, images)
    ref_logits, ref_probs = ex.reference_forward(
        {k: v.astype(np.float64) for k, v in weights.items()}, images.astype(np.float64)
    )
    close(np.asarray(logits), ref_logits, 1e-4)
    close(np.asarray(probs), ref_probs, 1e-4)
    eager_logits, _ = model.apply(model.params, images)
    close(np.asarray(eager_logits), np.asarray(logits), 1e-5)


def test_custom_ops_are_registered_under_their_domain():
    keys = {(d, op, v) for (d, op, v) in jonnx._registry.registered() if d == ex.DOMAIN}
    assert keys == {(ex.DOMAIN, op, ex.VERSION) for op in ex.ATTRIBUTES}


def test_registering_the_example_twice_raises():
    spec = importlib.util.spec_from_file_location("_jonnx_example_custom_ops_again", EXAMPLE)
    with pytest.raises(ValueError, match="already registered"):
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    # The first op's registration failed, so the registry still holds the first import's ops.
    assert jonnx._registry.registered()[(ex.DOMAIN, "Relu6", ex.VERSION)].fn is ex.relu6


# -- each op, with its attributes ----------------------------------------------------------------


def test_relu6():
    x = np.array([-3.0, -0.0, 0.5, 6.0, 7.5], np.float32)
    np.testing.assert_array_equal(call("Relu6", x), [0.0, 0.0, 0.5, 6.0, 6.0])
    x = f32(2, 3, 4, low=-10, high=10)
    close(call("Relu6", x), ex.np_relu6(x.astype(np.float64)))


@pytest.mark.parametrize("activation", [None, "linear", "relu", "relu6"])
@pytest.mark.parametrize("x_shape", [(5, 3), (2, 4, 3), (3,)])
@pytest.mark.parametrize("bias", [True, False])
def test_dense(activation, x_shape, bias):
    x, w = f32(*x_shape, low=-4, high=4), f32(3, 7, low=-3, high=3)
    b = f32(7) if bias else None
    attrs = {} if activation is None else {"activation": activation}
    expected = ex.np_dense(
        x.astype(np.float64), w.astype(np.float64), None if b is None else b.astype(np.float64), activation or "linear"
    )
    close(call("Dense", x, w, b, **attrs), expected, 1e-5)


def test_dense_by_hand():
    x = np.array([[1.0, 2.0]], np.float32)
    w = np.array([[1.0, -1.0, 3.0], [2.0, -3.0, 4.0]], np.float32)  # [in=2, out=3]
    b = np.array([0.5, 0.0, -1.0], np.float32)
    np.testing.assert_array_equal(call("Dense", x, w, b), [[5.5, -7.0, 10.0]])
    np.testing.assert_array_equal(call("Dense", x, w, b, activation="relu"), [[5.5, 0.0, 10.0]])
    np.testing.assert_array_equal(call("Dense", x, w, b, activation="relu6"), [[5.5, 0.0, 6.0]])


DEPTHWISE_CASES = [
    # (H, W, C, M, kh, kw, attrs)
    (6, 7, 3, 1, 3, 3, {}),
    (6, 7, 3, 2, 3, 3, {"pads": "SAME"}),
    (7, 7, 2, 2, 3, 2, {"pads": "SAME", "strides": [2, 2]}),
    (8, 9, 4, 1, 3, 3, {"pads": "VALID", "strides": [2, 1], "dilations": [2, 2]}),
    (8, 8, 2, 3, 2, 3, {"pads": "SAME", "dilations": [2, 1], "kernel_shape": [2, 3], "group": 2}),
    (5, 6, 3, 2, 1, 1, {"pads": "SAME", "strides": [3, 2]}),
]


@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("h, w, c, m, kh, kw, attrs", DEPTHWISE_CASES)
def test_depthwise_conv2d_against_numpy(h, w, c, m, kh, kw, attrs, bias, data_format):
    x = f32(2, h, w, c)
    if data_format == "NCHW":
        x = x.transpose(0, 3, 1, 2).copy()
    kernel, b = f32(kh, kw, c, m), (f32(c * m) if bias else None)
    given = {**attrs, **({"data_format": data_format} if data_format != "NHWC" else {})}
    numpy_attrs = {k: v for k, v in given.items() if k not in ("kernel_shape", "group")}
    expected = ex.np_depthwise_conv2d(
        x.astype(np.float64), kernel.astype(np.float64), None if b is None else b.astype(np.float64), **numpy_attrs
    )
    close(call("DepthwiseConv2d", x, kernel, b, **given), expected, 1e-5)


@pytest.mark.parametrize("h, w, c, m, kh, kw, attrs", DEPTHWISE_CASES)
def test_depthwise_conv2d_against_onnxruntime_grouped_conv(h, w, c, m, kh, kw, attrs):
    """An independent check: ONNX Conv with group=C on NCHW, weights [C*M, 1, kh, kw]."""
    ort = pytest.importorskip("onnxruntime")
    x, kernel, b = f32(2, h, w, c), f32(kh, kw, c, m), f32(c * m)
    strides, dilations = list(attrs.get("strides", [1, 1])), list(attrs.get("dilations", [1, 1]))
    begin, end = [0, 0], [0, 0]
    if attrs.get("pads") == "SAME":
        # TensorFlow's SAME: output ceil(size / stride), the odd padding at the end.
        # (onnxruntime rejects auto_pad=SAME_UPPER with dilations, so the pads are explicit.)
        for i, (size, k) in enumerate([(h, kh), (w, kw)]):
            total = max((-(-size // strides[i]) - 1) * strides[i] + (k - 1) * dilations[i] + 1 - size, 0)
            begin[i], end[i] = total // 2, total - total // 2
    conv_attrs = {"group": c, "strides": strides, "dilations": dilations, "pads": begin + end}
    graph = oh.make_graph(
        [oh.make_node("Conv", ["x", "w", "b"], ["y"], **conv_attrs)],
        "g",
        [oh.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None) for n in ("x", "w", "b")],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 21)], ir_version=10)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    onnx_weights = kernel.reshape(kh, kw, c * m).transpose(2, 0, 1)[:, None]  # output c*M+m
    (expected,) = session.run(None, {"x": x.transpose(0, 3, 1, 2), "w": onnx_weights, "b": b})
    close(call("DepthwiseConv2d", x, kernel, b, **attrs), expected.transpose(0, 2, 3, 1), 1e-4)


def test_depthwise_conv2d_by_hand():
    # One channel, multiplier 2: a 2x2 box sum and a 2x2 difference, VALID on a 2x3 image.
    x = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], np.float32).reshape(1, 2, 3, 1)
    kernel = np.stack([np.ones((2, 2)), np.array([[1.0, 0.0], [0.0, -1.0]])], axis=-1)
    kernel = kernel.reshape(2, 2, 1, 2).astype(np.float32)
    y = call("DepthwiseConv2d", x, kernel, np.array([0.0, 10.0], np.float32))
    np.testing.assert_array_equal(y, [[[[12.0, 6.0], [16.0, 6.0]]]])


@pytest.mark.parametrize("size", [None, [2, 2], [3, 1], [1, 4]])
@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
def test_upsampling2d(size, data_format):
    x = f32(2, 3, 4, 5)
    attrs = {"data_format": data_format, **({} if size is None else {"size": size})}
    expected = ex.np_upsampling2d(x, tuple(size or (2, 2)), data_format)
    np.testing.assert_array_equal(call("UpSampling2D", x, **attrs), expected)


def test_upsampling2d_by_hand():
    x = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32).reshape(1, 2, 2, 1)
    y = call("UpSampling2D", x, size=[2, 3])[0, :, :, 0]
    np.testing.assert_array_equal(
        y,
        [[1, 1, 1, 2, 2, 2], [1, 1, 1, 2, 2, 2], [3, 3, 3, 4, 4, 4], [3, 3, 3, 4, 4, 4]],
    )


@pytest.mark.parametrize("alpha", [None, 1.0, 0.5, -2.0])
@pytest.mark.parametrize("shapes", [((2, 3), (2, 3)), ((2, 3, 4), (4,)), ((3, 1), (1, 5))])
def test_add_(alpha, shapes):
    a, b = f32(*shapes[0]), f32(*shapes[1])
    attrs = {} if alpha is None else {"alpha": alpha}
    expected = ex.np_add_(a.astype(np.float64), b.astype(np.float64), 1.0 if alpha is None else alpha)
    close(call("Add_", a, b, **attrs), expected)
    np.testing.assert_array_equal(
        call("Add_", np.array([1.0, 2.0], np.float32), np.array([4.0, -2.0], np.float32), alpha=0.25),
        [2.0, 1.5],
    )


def test_add_keeps_float16():
    a, b = np.ones(3, np.float16), np.full(3, 2.0, np.float16)
    y = call("Add_", a, b, alpha=0.5)
    assert y.dtype == np.float16
    np.testing.assert_array_equal(y, [2.0, 2.0, 2.0])


# -- gradients and errors ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "op_type, make_inputs, attrs",
    [
        ("Relu6", lambda: (f32(3, 4, low=0.5, high=5.5),), {}),
        ("Dense", lambda: (f32(2, 3), f32(3, 4), f32(4)), {"activation": "linear"}),
        (
            "DepthwiseConv2d",
            lambda: (f32(1, 5, 5, 2), f32(3, 3, 2, 2), f32(4)),
            {"pads": "SAME", "strides": [2, 1], "dilations": [1, 2]},
        ),
        ("UpSampling2D", lambda: (f32(1, 2, 3, 2),), {"size": [2, 3]}),
        ("Add_", lambda: (f32(2, 3), f32(3)), {"alpha": -1.5}),
    ],
)
def test_gradients(op_type, make_inputs, attrs):
    inputs = tuple(jnp.asarray(x) for x in make_inputs())
    fn = lambda *xs: jonnx.ops.call(op_type, *xs, domain=ex.DOMAIN, **attrs)  # noqa: E731
    check_grads(fn, inputs, order=1, modes=["rev"], atol=2e-2, rtol=2e-2, eps=1e-2)


@pytest.mark.parametrize(
    "op_type, inputs, attrs, match",
    [
        ("Relu6", (np.ones(2, np.float32),), {"beta": 1.0}, r"unknown attribute\(s\) \['beta'\]"),
        ("Dense", (np.ones((2, 3), np.float32), np.ones((4, 2), np.float32)), {}, "cannot multiply"),
        (
            "Dense",
            (np.ones((2, 3), np.float32), np.ones((3, 2), np.float32)),
            {"activation": "tanh"},
            "activation must be one of",
        ),
        (
            "DepthwiseConv2d",
            (np.ones((1, 4, 4, 2), np.float32), np.ones((3, 3, 2, 1), np.float32)),
            {"pads": "FULL"},
            "pads must be 'SAME' or 'VALID'",
        ),
        (
            "DepthwiseConv2d",
            (np.ones((1, 4, 4, 3), np.float32), np.ones((3, 3, 2, 1), np.float32)),
            {},
            "X has 3 channels",
        ),
        (
            "DepthwiseConv2d",
            (np.ones((1, 4, 4, 2), np.float32), np.ones((3, 3, 2, 1), np.float32)),
            {"group": 1},
            "group 1 must equal the channel count 2",
        ),
        (
            "DepthwiseConv2d",
            (np.ones((1, 4, 4, 2), np.float32), np.ones((3, 3, 2, 1), np.float32)),
            {"kernel_shape": [2, 2]},
            "kernel_shape",
        ),
        (
            "DepthwiseConv2d",
            (np.ones((1, 4, 4, 2), np.float32), np.ones((3, 3, 2, 1), np.float32)),
            {"strides": [0, 1]},
            "strides must be two positive integers",
        ),
        ("UpSampling2D", (np.ones((1, 2, 2, 1), np.float32),), {"data_format": "NCDHW"}, "data_format"),
        ("UpSampling2D", (np.ones((2, 2, 1), np.float32),), {}, "X must be 4-D"),
    ],
)
def test_bad_attributes_and_inputs_name_the_node(op_type, inputs, attrs, match):
    with pytest.raises(errors.NodeError, match=match):
        call(op_type, *inputs, **attrs)


def test_error_in_a_model_names_the_node():
    graph = oh.make_graph(
        [oh.make_node("UpSampling2D", ["x"], ["y"], domain=ex.DOMAIN, name="bad_up", size=[2, 2, 2])],
        "g",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 2, 2, 1])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 21), oh.make_opsetid(ex.DOMAIN, 1)])
    with pytest.raises(errors.NodeError, match="bad_up.*size must be two positive integers"):
        jonnx.load(model)(np.ones((1, 2, 2, 1), np.float32))


def test_undeclared_attribute_is_refused_at_load_naming_the_node():
    graph = oh.make_graph(
        [oh.make_node("Add_", ["x", "x"], ["y"], domain=ex.DOMAIN, name="scaled_add", beta=2.0)],
        "g",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 21), oh.make_opsetid(ex.DOMAIN, 1)])
    with pytest.raises(
        errors.ModelStructureError, match=r"'scaled_add'.*unknown attribute\(s\) \['beta'\].*\['alpha'\]"
    ):
        jonnx.load(model)


def test_declared_defaults_fill_in_what_a_node_leaves_out():
    graph = oh.make_graph(
        [oh.make_node("Add_", ["x", "x"], ["y"], domain=ex.DOMAIN)],
        "g",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 21), oh.make_opsetid(ex.DOMAIN, 1)])
    x = np.array([1.0, -2.0], np.float32)
    np.testing.assert_array_equal(np.asarray(jonnx.load(model)(x)[0]), x + 1.0 * x)  # alpha = 1.0

"""Tests for the ai.onnx.preview.training domain: Adagrad, Adam, Momentum and Gradient.

The optimizers are compared with numpy transcriptions of the schema's pseudo code, not with
the ReferenceEvaluator: its multi-tensor path casts every output to float32 (wrong for
float64), and for ``T > 0`` its numpy scalar arithmetic promotes float32 outputs to float64.
"""

from __future__ import annotations

import glob
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import onnx.helper as oh
import pytest
from onnx import numpy_helper

import jonnx
import jonnx.ops
from tests.ops._harness import assert_matches_reference, check_op_grads, node_model

TRAINING = "ai.onnx.preview.training"
RNG = np.random.default_rng(0)


# -- numpy references (the schema's pseudo code, in float64) --------------------------------


def ref_adagrad(r, t, x, g, h, *, norm_coefficient, decay_factor, epsilon):
    r, t, x, g, h = (np.asarray(a, np.float64) for a in (r, t, x, g, h))
    rate = r / (1 + t * decay_factor)
    g_reg = norm_coefficient * x + g
    h_new = h + g_reg * g_reg
    return x - rate * g_reg / (np.sqrt(h_new) + epsilon), h_new


def ref_adam(r, t, x, g, v, h, *, norm_coefficient, norm_coefficient_post, alpha, beta, epsilon):
    r, t, x, g, v, h = (np.asarray(a, np.float64) for a in (r, t, x, g, v, h))
    g_reg = norm_coefficient * x + g
    v_new = alpha * v + (1 - alpha) * g_reg
    h_new = beta * h + (1 - beta) * g_reg * g_reg
    rate = r * np.sqrt(1 - beta**t) / (1 - alpha**t) if t > 0 else r
    x_new = x - rate * v_new / (np.sqrt(h_new) + epsilon)
    return (1 - norm_coefficient_post) * x_new, v_new, h_new


def ref_momentum(r, t, x, g, v, *, norm_coefficient, alpha, beta, mode):
    r, t, x, g, v = (np.asarray(a, np.float64) for a in (r, t, x, g, v))
    g_reg = norm_coefficient * x + g
    v_new = alpha * v + (beta if t > 0 else 1.0) * g_reg
    step = v_new if mode == "standard" else g_reg + alpha * v_new
    return x - r * step, v_new


def f32(value: float) -> float:
    """An attribute as the model stores it (float32)."""
    return float(np.float32(value))


def optimizer_inputs(n: int, states: int, dtype, t: int, shapes=((3,), (2, 2))):
    """{R, T, X_i..., G_i..., state_j_i...} for n tensors."""
    inputs: dict[str, Any] = {"R": np.array(0.1, dtype), "T": np.array(t, np.int64)}
    roles = ["X", "G"] + [f"S{j}" for j in range(states)]
    for role in roles:
        for i in range(n):
            value = RNG.normal(size=shapes[i % len(shapes)]).astype(dtype)
            if role.startswith("S"):
                value = np.abs(value)  # accumulated squares are non-negative
            inputs[f"{role}{i}"] = value
    return inputs


def grouped_reference(ref, inputs, n: int, states: int, dtype, **attrs):
    """Apply ``ref`` per tensor and regroup its outputs as the op does (all X, then states)."""
    vals = list(inputs.values())
    r, t, rest = vals[0], vals[1], vals[2:]
    per = [ref(r, t, *(rest[k * n + i] for k in range(2 + states)), **attrs) for i in range(n)]
    return [np.asarray(per[i][k], dtype) for k in range(1 + states) for i in range(n)]


# -- optimizers -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("t", [0, 5])
def test_adagrad(dtype, n, t):
    attrs = dict(norm_coefficient=f32(0.01), decay_factor=f32(0.1), epsilon=f32(1e-5))
    inputs = optimizer_inputs(n, 1, dtype, t)
    want = grouped_reference(ref_adagrad, inputs, n, 1, dtype, **attrs)
    assert_matches_reference("Adagrad", inputs, 2 * n, opset=1, domain=TRAINING, expected=want, **attrs)


def test_adagrad_defaults():
    inputs = optimizer_inputs(1, 1, np.float32, 2)
    want = grouped_reference(
        ref_adagrad,
        inputs,
        1,
        1,
        np.float32,
        norm_coefficient=0.0,
        decay_factor=0.0,
        epsilon=f32(1e-6),
    )
    assert_matches_reference("Adagrad", inputs, 2, opset=1, domain=TRAINING, expected=want)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("t", [0, 1, 7])
def test_adam(dtype, n, t):
    attrs = dict(
        norm_coefficient=f32(0.001),
        norm_coefficient_post=f32(0.02),
        alpha=f32(0.85),
        beta=f32(0.95),
        epsilon=f32(1e-7),
    )
    inputs = optimizer_inputs(n, 2, dtype, t)
    want = grouped_reference(ref_adam, inputs, n, 2, dtype, **attrs)
    assert_matches_reference("Adam", inputs, 3 * n, opset=1, domain=TRAINING, expected=want, **attrs)


def test_adam_defaults():
    inputs = optimizer_inputs(1, 2, np.float32, 3)
    want = grouped_reference(
        ref_adam,
        inputs,
        1,
        2,
        np.float32,
        norm_coefficient=0.0,
        norm_coefficient_post=0.0,
        alpha=f32(0.9),
        beta=f32(0.999),
        epsilon=f32(1e-6),
    )
    assert_matches_reference("Adam", inputs, 3, opset=1, domain=TRAINING, expected=want, rtol=1e-4)


@pytest.mark.parametrize("mode", ["standard", "nesterov"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("t", [0, 4])
def test_momentum(mode, dtype, n, t):
    attrs = dict(norm_coefficient=f32(0.01), alpha=f32(0.9), beta=f32(0.3), mode=mode)
    inputs = optimizer_inputs(n, 1, dtype, t)
    want = grouped_reference(ref_momentum, inputs, n, 1, dtype, **attrs)
    assert_matches_reference("Momentum", inputs, 2 * n, opset=1, domain=TRAINING, expected=want, **attrs)


def test_float64_rate_keeps_float32_tensors():
    """R (type T1) may be double while the tensors (T3) are float: outputs stay float32."""
    inputs = optimizer_inputs(1, 1, np.float32, 2)
    inputs["R"] = np.array(0.1, np.float64)
    attrs = dict(norm_coefficient=0.0, alpha=f32(0.9), beta=f32(0.5), mode="standard")
    want = grouped_reference(ref_momentum, inputs, 1, 1, np.float32, **attrs)
    assert_matches_reference("Momentum", inputs, 2, opset=1, domain=TRAINING, expected=want, **attrs)


def test_step_count_is_traced_once():
    """One jitted step serves every T (T is a traced input, not a static one)."""
    inputs = optimizer_inputs(1, 2, np.float32, 0)
    attrs = dict(alpha=f32(0.9), beta=f32(0.99))
    model = node_model("Adam", inputs, 3, opset=1, domain=TRAINING, **attrs)
    m = jonnx.load(model)
    assert "T" not in m.static_input_names
    for t in (0, 1, 10):
        inputs["T"] = np.array(t, np.int64)
        with jax.enable_x64(True):
            got = m(*inputs.values())
        want = ref_adam(*inputs.values(), norm_coefficient=0.0, norm_coefficient_post=0.0, epsilon=f32(1e-6), **attrs)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("t", [0, 3])
def test_adam_grads(t):
    # T = 0 exercises the masked bias-correction branch: its gradient must stay finite.
    inputs = optimizer_inputs(2, 2, np.float64, t)
    for out in range(6):
        check_op_grads(
            "Adam",
            inputs,
            opset=1,
            domain=TRAINING,
            n_outputs=6,
            output=out,
            alpha=0.8,
            beta=0.9,
            norm_coefficient=0.01,
        )


@pytest.mark.parametrize("t", [0, 3])
def test_adagrad_grads(t):
    inputs = optimizer_inputs(1, 1, np.float64, t)
    for out in range(2):
        check_op_grads(
            "Adagrad",
            inputs,
            opset=1,
            domain=TRAINING,
            n_outputs=2,
            output=out,
            decay_factor=0.1,
            norm_coefficient=0.01,
        )


@pytest.mark.parametrize("mode", ["standard", "nesterov"])
def test_momentum_grads(mode):
    inputs = optimizer_inputs(1, 1, np.float64, 2)
    for out in range(2):
        check_op_grads(
            "Momentum",
            inputs,
            opset=1,
            domain=TRAINING,
            n_outputs=2,
            output=out,
            alpha=0.9,
            beta=0.5,
            norm_coefficient=0.01,
            mode=mode,
        )


def test_direct_call():
    x, g, h = np.array([1.0], np.float32), np.array([-1.0], np.float32), np.array([2.0], np.float32)
    x_new, h_new = jonnx.ops.call(
        "Adagrad",
        np.float32(0.1),
        np.int64(0),
        x,
        g,
        h,
        domain=TRAINING,
        norm_coefficient=0.001,
        decay_factor=0.1,
        epsilon=1e-5,
    )
    want_x, want_h = ref_adagrad(0.1, 0, x, g, h, norm_coefficient=0.001, decay_factor=0.1, epsilon=1e-5)
    np.testing.assert_allclose(x_new, want_x, rtol=1e-6)
    np.testing.assert_allclose(h_new, want_h, rtol=1e-6)


def test_errors():
    r, t = np.float32(0.1), np.int64(0)
    x = np.ones(2, np.float32)
    with pytest.raises(jonnx.errors.NodeError, match="4 inputs per optimized tensor"):
        jonnx.ops.call("Adam", r, t, x, x, x, domain=TRAINING)
    with pytest.raises(jonnx.errors.NodeError, match="mode must be"):
        jonnx.ops.call(
            "Momentum", r, t, x, x, x, domain=TRAINING, alpha=0.9, beta=0.1, norm_coefficient=0.0, mode="heavy"
        )
    with pytest.raises(jonnx.errors.NodeError, match="missing required attribute.*mode"):
        jonnx.ops.call("Momentum", r, t, x, x, x, domain=TRAINING, alpha=0.9, beta=0.1, norm_coefficient=0.0)
    with pytest.raises(jonnx.errors.NodeError, match="R and T must be scalars"):
        jonnx.ops.call("Adagrad", np.ones(2, np.float32), t, x, x, x, domain=TRAINING)
    with pytest.raises(jonnx.errors.NodeError, match="only run inside a model"):
        jonnx.ops.call("Gradient", x, domain=TRAINING, xs=["a"], y="b")


# -- Gradient -------------------------------------------------------------------------------


def gradient_model(nodes, inputs, outputs, initializers=()):
    graph = oh.make_graph(
        nodes,
        "g",
        [oh.make_tensor_value_info(n, onnx.TensorProto.DOUBLE, s) for n, s in inputs],
        [oh.make_empty_tensor_value_info(o) for o in outputs],
        initializer=[numpy_helper.from_array(v, n) for n, v in initializers],
    )
    opsets = [oh.make_opsetid("", 18), oh.make_opsetid(TRAINING, 1)]
    model = oh.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    return jonnx.load(model)


def run_both(m, *args):
    """Outputs jitted (traced inputs) and eager with numpy inputs (the Gradient node folds)."""
    with jax.enable_x64(True):
        jitted = [np.asarray(o) for o in m(*args)]
        eager = [np.asarray(o) for o in m.apply(m.params, *args)]
    return jitted, eager


SIMPLE = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "simple")


@pytest.mark.parametrize("case", ["test_gradient_of_add", "test_gradient_of_add_and_mul"])
def test_gradient_backend_models(case):
    """onnx's own Gradient model cases (in the 'simple' suite, not the node suite)."""
    folder = os.path.join(SIMPLE, case)
    model = jonnx.load(onnx.load(os.path.join(folder, "model.onnx")))

    def tensors(kind):
        files = sorted(glob.glob(os.path.join(folder, "test_data_set_0", f"{kind}_*.pb")))
        return [numpy_helper.to_array(onnx.load_tensor(f)) for f in files]

    want = tensors("output")
    for got in run_both(model, *tensors("input")):
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype
            np.testing.assert_allclose(g, w, rtol=1e-6)


def test_gradient_intermediate_zs_and_initializer():
    """xs names an intermediate value, evaluated at the node's input, not the graph's value;
    zs is held fixed; an initializer the slice reads comes from the enclosing scope."""
    w = np.array([[1.0, 2.0], [3.0, -1.0]])
    nodes = [
        oh.make_node("MatMul", ["x", "W"], ["h"]),
        oh.make_node("Mul", ["h", "z"], ["hz"]),
        oh.make_node("Mul", ["hz", "hz"], ["sq"]),
        oh.make_node("ReduceSum", ["sq"], ["y"], keepdims=0),
        oh.make_node("Gradient", ["h1", "z"], ["dy_dh", "dy_dz"], domain=TRAINING, xs=["h", "z"], y="y"),
        oh.make_node("Gradient", ["x", "z"], ["dy_dx"], domain=TRAINING, xs=["x"], zs=["z"], y="y"),
    ]
    m = gradient_model(
        nodes, [("x", [2]), ("z", [2]), ("h1", [2])], ["y", "dy_dh", "dy_dz", "dy_dx"], initializers=[("W", w)]
    )
    x, z, h1 = np.array([0.5, -1.5]), np.array([2.0, 0.25]), np.array([1.0, -3.0])
    h = x @ w
    for y, dy_dh, dy_dz, dy_dx in run_both(m, x, z, h1):
        np.testing.assert_allclose(y, np.sum((h * z) ** 2))
        np.testing.assert_allclose(dy_dh, 2 * h1 * z**2)  # at h = h1
        np.testing.assert_allclose(dy_dz, 2 * h1**2 * z)
        np.testing.assert_allclose(dy_dx, w @ (2 * h * z**2))


def test_gradient_second_order():
    """The spec's example: a Gradient of a Gradient output gives d2O/dW2."""
    nodes = [
        oh.make_node("Mul", ["w", "x"], ["p"]),
        oh.make_node("Mul", ["p", "p"], ["p2"]),
        oh.make_node("Mul", ["p2", "w"], ["o"]),  # o = w^3 x^2
        oh.make_node("Gradient", ["x", "w"], ["do_dx", "do_dw"], domain=TRAINING, xs=["x", "w"], y="o"),
        oh.make_node("Gradient", ["x", "w"], ["d2_dwdx", "d2_dw2"], domain=TRAINING, xs=["x", "w"], y="do_dw"),
    ]
    m = gradient_model(nodes, [("x", []), ("w", [])], ["do_dw", "d2_dwdx", "d2_dw2"])
    x, w = np.array(1.5), np.array(-0.5)
    for do_dw, d2_dwdx, d2_dw2 in run_both(m, x, w):
        np.testing.assert_allclose(do_dw, 3 * w**2 * x**2)
        np.testing.assert_allclose(d2_dwdx, 6 * w**2 * x)
        np.testing.assert_allclose(d2_dw2, 6 * w * x**2)


def test_gradient_is_differentiable():
    """jax.grad through a model that outputs a Gradient (a gradient penalty)."""
    nodes = [
        oh.make_node("Sin", ["x"], ["s"]),
        oh.make_node("ReduceSum", ["s"], ["y"], keepdims=0),
        oh.make_node("Gradient", ["x"], ["dy_dx"], domain=TRAINING, xs=["x"], y="y"),
    ]
    m = gradient_model(nodes, [("x", [3])], ["dy_dx"])
    x = np.array([0.1, 1.0, -2.0])
    with jax.enable_x64(True):
        grad = jax.grad(lambda v: jnp.sum(m.apply(m.params, v)[0] ** 2))(jnp.asarray(x))
    np.testing.assert_allclose(grad, -2 * np.cos(x) * np.sin(x), rtol=1e-10)


def test_gradient_errors():
    nodes = [
        oh.make_node("Mul", ["x", "x"], ["y"]),
        oh.make_node("Gradient", ["x"], ["dy_dx"], domain=TRAINING, xs=["x"], y="y"),
    ]
    m = gradient_model(nodes, [("x", [2])], ["dy_dx"])
    with pytest.raises(jonnx.errors.NodeError, match="must be a float scalar"):
        run_both(m, np.ones(2))
    nodes[1] = oh.make_node("Gradient", ["x"], ["dy_dx"], domain=TRAINING, xs=["x", "u"], y="y")
    m = gradient_model(nodes, [("x", [2])], ["dy_dx"])
    with pytest.raises(jonnx.errors.NodeError, match="1 inputs but xs and zs name 2"):
        run_both(m, np.ones(2))


def test_gradient_wrt_constant_of_traced_slice():
    nodes = [
        oh.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.array([1.0, 2.0]))),
        oh.make_node("Mul", ["c", "x"], ["p"]),
        oh.make_node("ReduceSum", ["p"], ["y"], keepdims=0),
        oh.make_node("Gradient", ["c"], ["dy_dc"], domain=TRAINING, xs=["c"], y="y"),
    ]
    m = gradient_model(nodes, [("x", [2])], ["dy_dc"])
    x = np.array([3.0, 4.0])
    for (dy_dc,) in run_both(m, x):
        np.testing.assert_allclose(dy_dc, x)


def test_optimizer_without_x64():
    """Default JAX config (x64 off): int64 T arrives as int32, float32 stays float32."""
    inputs = optimizer_inputs(2, 1, np.float32, 3)
    attrs = dict(norm_coefficient=f32(0.01), alpha=f32(0.9), beta=f32(0.3), mode="nesterov")
    m = jonnx.load(node_model("Momentum", inputs, 4, opset=1, domain=TRAINING, **attrs))
    got = m(*inputs.values())
    want = grouped_reference(ref_momentum, inputs, 2, 1, np.float32, **attrs)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == np.float32
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)

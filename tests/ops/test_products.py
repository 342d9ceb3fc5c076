"""Products (Gemm, MatMul, Einsum) against the ReferenceEvaluator and numpy, over opsets,
shapes and dtypes, plus gradients."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import jonnx
from jonnx import errors
from jonnx.ops.products import weight_product
from tests.ops._harness import assert_matches_reference, assert_rounded_once, check_op_grads, node_model, run_jonnx

RNG = np.random.default_rng(0)


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


# ----------------------------------------------------------------------------- products


@pytest.mark.parametrize(
    "opset,trans_a,trans_b,c_shape",
    [
        (7, 0, 0, (3, 5)),
        (9, 1, 0, (5,)),
        (11, 0, 1, (1, 5)),
        (13, 1, 1, (3, 1)),
        (13, 0, 0, ()),
    ],
)
def test_gemm(opset, trans_a, trans_b, c_shape):
    a = rand(*((4, 3) if trans_a else (3, 4)))
    b = rand(*((5, 4) if trans_b else (4, 5)))
    inputs = {"a": a, "b": b, "c": rand(*c_shape)}
    assert_matches_reference(
        "Gemm", inputs, opset=opset, transA=trans_a, transB=trans_b, alpha=0.5, beta=2.0, rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("trans_a", [0, 1])
def test_gemm_one_row_against_transposed_b(trans_a):
    # A single row with transB (a classifier at batch 1) is computed as B @ a.T: same values
    # and gradients as onnxruntime's and finite differences'.
    a = rand(*((6, 1) if trans_a else (1, 6)))
    inputs = {"a": a, "b": rand(5, 6), "c": rand(5)}
    assert_matches_reference("Gemm", inputs, opset=13, transA=trans_a, transB=1, alpha=0.5, rtol=1e-5, atol=1e-5)
    check_op_grads("Gemm", inputs, opset=13, transA=trans_a, transB=1, alpha=0.5)


@pytest.mark.parametrize("opset", [11, 13])
def test_gemm_without_c(opset):
    assert_matches_reference("Gemm", {"a": rand(3, 4), "b": rand(4, 2), "c": None}, opset=opset, alpha=3.0)


@pytest.mark.parametrize("opset", [1, 6])
def test_gemm_legacy_broadcast(opset):
    # Opsets 1-6: C broadcasts only with broadcast=1 (changelog); numpy gives the value.
    a, b, c = rand(3, 4), rand(4, 5), rand(5)
    assert_matches_reference(
        "Gemm",
        {"a": a, "b": b, "c": c},
        opset=opset,
        broadcast=1,
        beta=0.5,
        expected=[a @ b + 0.5 * c],
        rtol=1e-5,
        atol=1e-5,
    )
    assert_matches_reference(
        "Gemm",
        {"a": a, "b": b, "c": rand(3, 5)},
        opset=opset,
        rtol=1e-5,
        atol=1e-5,
        expected=lambda a, b, c: [a @ b + c],
    )
    # beta scales C without broadcast too (the ReferenceEvaluator's Gemm-6 leaves it out there).
    assert_matches_reference(
        "Gemm",
        {"a": a, "b": b, "c": rand(3, 5)},
        opset=opset,
        beta=2.0,
        rtol=1e-5,
        atol=1e-5,
        expected=lambda a, b, c: [a @ b + 2.0 * c],
    )
    inputs = {"a": a, "b": b, "c": c}
    with pytest.raises(errors.NodeError, match="broadcast=1"):
        run_jonnx(node_model("Gemm", inputs, opset=opset), inputs)


def test_gemm_bad_c_is_an_error():
    inputs = {"a": rand(3, 4), "b": rand(4, 5), "c": rand(2, 5)}
    with pytest.raises(errors.NodeError, match="does not broadcast"):
        run_jonnx(node_model("Gemm", inputs, opset=13), inputs)


@pytest.mark.parametrize(
    "opset,dtype,shapes",
    [
        (1, np.float32, ((3, 4), (4, 5))),
        (9, np.float64, ((4,), (4, 5))),
        (13, np.int32, ((3, 4), (4,))),
        (13, np.int64, ((4,), (4,))),
        (9, np.int64, ((2, 1, 3, 4), (5, 4, 2))),
        (13, np.float32, ((2, 3, 4), (4, 2))),
    ],
)
def test_matmul(opset, shapes, dtype):
    a = (RNG.standard_normal(shapes[0]) * 5).astype(dtype)
    b = (RNG.standard_normal(shapes[1]) * 5).astype(dtype)
    assert_matches_reference("MatMul", {"a": a, "b": b}, opset=opset, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "equation,shapes",
    [
        ("ij,jk->ik", [(3, 4), (4, 5)]),
        ("bij, bjk -> bik", [(2, 3, 4), (2, 4, 5)]),
        ("ii->i", [(4, 4)]),
        ("ij", [(3, 4)]),
        ("ji", [(3, 4)]),
        ("...ij,...jk", [(2, 3, 4), (4, 5)]),
        ("i,i", [(5,), (5,)]),
        ("abc,cd,de->abe", [(2, 3, 4), (4, 5), (5, 2)]),
    ],
)
def test_einsum(equation, shapes):
    opset = 28 if "," in equation else 12
    inputs = {f"x{i}": rand(*s) for i, s in enumerate(shapes)}
    assert_matches_reference("Einsum", inputs, opset=opset, equation=equation, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "equation,shapes",
    [
        ("ij->", [(30, 40)]),
        ("bij->b", [(4, 30, 40)]),
        ("ij,jk,kl->il", [(8, 32), (32, 32), (32, 8)]),
        ("bhqd,bhkd->bhqk", [(2, 3, 8, 16), (2, 3, 8, 16)]),
    ],
)
def test_half_precision_einsum_sums_in_float32_and_rounds_once(equation, shapes):
    # XLA summed a float16 reduction ('ij->') term by term in float16 (every output off the
    # correctly rounded sum), and a chain of contractions rounded between them; onnxruntime
    # rounds once, as jonnx now does.
    import onnxruntime as ort

    rng = np.random.default_rng(5)
    inputs = {f"x{i}": rng.standard_normal(s).astype(np.float16) for i, s in enumerate(shapes)}
    exact = np.einsum(equation, *(x.astype(np.float64) for x in inputs.values()))
    model = node_model("Einsum", inputs, opset=12, equation=equation)
    (got,) = run_jonnx(model, inputs)
    # float32 sums round a near tie now and then (1 of 384 here); step by step, 28 of 64 of
    # the chain's outputs and every reduction's were off
    assert_rounded_once(got, exact, np.float16, most_off=0.01)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert_rounded_once(session.run(None, inputs)[0], exact, np.float16, most_off=0.01)


def test_einsum_operand_count_is_checked():
    inputs = {"x0": rand(3, 4)}
    with pytest.raises(errors.NodeError, match="names 2 operands"):
        run_jonnx(node_model("Einsum", inputs, opset=12, equation="ij,jk->ik"), inputs)


@pytest.mark.parametrize(
    "op,inputs,attrs",
    [
        ("Gemm", {"a": rand(4, 3), "b": rand(2, 4), "c": rand(2)}, dict(transA=1, transB=1, alpha=0.7, beta=1.3)),
        ("MatMul", {"a": rand(2, 3, 4), "b": rand(4, 2)}, {}),
        ("Einsum", {"a": rand(2, 3), "b": rand(3, 4)}, dict(equation="ij,jk->ki")),
    ],
)
def test_product_grads(op, inputs, attrs):
    check_op_grads(op, inputs, opset=13 if op != "Einsum" else 12, **attrs)


@pytest.mark.parametrize("transposed", [False, True])
def test_weight_product_derivatives(transposed):
    # The custom JVP of activations times a weight matrix (stored (N, K) if transposed): every
    # order, both modes, and vmap, against finite differences in float64 (products only take
    # it for float32, on CPU).
    with jax.enable_x64(True):
        x, w = rand(2, 3, 4).astype(np.float64), rand(*((5, 4) if transposed else (4, 5))).astype(np.float64)

        def f(x, w):
            return jnp.tanh(weight_product(x, w, transposed, None))

        check_grads(f, (x, w), order=2, modes=("fwd", "rev"))
        per_example = jax.vmap(jax.grad(lambda w, x: jnp.sum(f(x, w))), (None, 0))
        plain = jax.grad(lambda w, x: jnp.sum(jnp.tanh(jnp.matmul(x, w.T if transposed else w))))
        want = np.stack([np.asarray(plain(w, xi)) for xi in x])
        np.testing.assert_allclose(np.asarray(per_example(w, x)), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("op,attrs", [("MatMul", {}), ("Gemm", {}), ("Gemm", {"transB": 1})])
def test_weight_gradient_of_a_product_is_a_plain_product(op, attrs):
    # float32 activations times a stored matrix: the weight gradient (and the weight tangent)
    # against numpy in float64, and on CPU the form XLA compiles it to: a plain product that
    # reads a stored transpose (a conditional), never a dot contracted over both operands' rows
    # (XLA's slow form, see ops/products.py).
    x = rand(*((6, 8) if op == "Gemm" else (2, 6, 8)))
    transposed = bool(attrs.get("transB"))
    w = rand(8, 5)
    stored = w.T.copy() if transposed else w
    model = jonnx.load(node_model(op, {"x": x, "w": stored}, opset=13, initializers=["w"], **attrs))

    def loss(params):
        (y,) = model.apply(params, x)
        return 0.5 * jnp.sum(y * y)

    x64, w64 = x.astype(np.float64).reshape(-1, 8), w.astype(np.float64)
    want = x64.T @ (x64 @ w64)
    got = np.asarray(jax.grad(loss)(model.params)["w"])
    # float32 sums: an entry near zero beside entries of ~50 carries their rounding (8e-7 on
    # an AVX2 CPU), so the absolute tolerance follows the largest entry
    np.testing.assert_allclose(got.T if transposed else got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())
    t_w = rand(8, 5)
    t_stored = jnp.asarray(t_w.T.copy() if transposed else t_w)
    _, tangent = jax.jvp(lambda w: model.apply({"w": w}, x)[0], (model.params["w"],), (t_stored,))
    np.testing.assert_allclose(np.asarray(tangent).reshape(-1, 5), x64 @ t_w, rtol=1e-5, atol=1e-6)
    if jax.default_backend() == "cpu":
        text = jax.jit(jax.grad(loss)).lower(model.params).compile().as_text()
        assert "conditional(" in text
        assert "lhs_contracting_dims={0}" not in text


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize(
    ("alpha", "beta", "trans_b", "rows"), [(1.0, 1.0, 0, 8), (0.7, 1.3, 0, 8), (0.7, 1.3, 1, 8), (0.7, 1.0, 1, 1)]
)
def test_half_precision_gemm_rounds_once(alpha, beta, trans_b, rows, dtype):
    # The product's float32 sums and the alpha/beta epilogue round once, as onnxruntime's do;
    # rounded after each step, 41% of float16 outputs were one unit in the last place off.
    dtype = jnp.dtype(dtype)
    rng = np.random.default_rng(3)
    a, b, c = (rng.standard_normal(shape).astype(dtype) for shape in ((rows, 32), (32, 24), (24,)))
    stored = b.T.copy() if trans_b else b
    inputs = {"a": a, "b": stored, "c": c}
    got = run_jonnx(node_model("Gemm", inputs, opset=13, alpha=alpha, beta=beta, transB=trans_b), inputs)[0]
    exact = alpha * (a.astype(np.float64) @ b.astype(np.float64)) + beta * c.astype(np.float64)
    assert_rounded_once(got, exact, dtype, most_off=0.02)

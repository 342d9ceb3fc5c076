"""Products: Gemm, MatMul and Einsum."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.custom_derivatives import SymbolicZero

from jonnx._registry import Attrs, Inputs, OpContext, Outputs, register
from jonnx.ops._util import is_half, lowers_for_cpu, static_sizes, stored_transpose, widen_halves


def product(a, b, precision, transposed: bool = False, preferred_element_type=None):
    """``a @ b`` (``a @ b.T`` if ``transposed``, ``b`` stored (N, K) as Gemm's ``transB`` reads
    it); on CPU, float32 activations times a matrix (a layer's weights) as
    :func:`weight_product`, whose weight gradient runs as a plain product.
    ``preferred_element_type``: the sums' type for other operands (float32 for half types)."""
    if (
        jnp.ndim(a) >= 2
        and jnp.ndim(b) == 2
        and jnp.result_type(a) == jnp.result_type(b) == jnp.float32
        and static_sizes((*jnp.shape(a), *jnp.shape(b)))
        and lowers_for_cpu()
    ):
        return weight_product(a, b, transposed, precision)
    return jnp.matmul(a, b.T if transposed else b, precision=precision, preferred_element_type=preferred_element_type)


@functools.partial(jax.custom_jvp, nondiff_argnums=(2, 3))
def weight_product(x, w, transposed: bool, precision):
    """``x @ w`` for ``x`` of shape (..., K) and a matrix ``w`` (K, N), or ``x @ w.T`` for ``w``
    stored (N, K) if ``transposed``, with the derivative in ``w`` arranged for XLA's CPU backend.

    Differentiated op by op, the weight gradient is ``dot_general(x, g)`` (or ``(g, x)``)
    contracted over both operands' rows. XLA gives that form to its own dot, not to YNNPACK,
    and runs it slowly: in a BERT-base fine-tuning step on AMD Zen 5 at 118-164 GFLOP/s against
    223-240 for the step's other products. Here the tangent in ``w`` reads a stored transposed
    copy (:func:`jonnx.ops._util.stored_transpose`): of ``x`` times ``w``'s tangent, or, with
    ``w`` transposed, of ``w``'s tangent times ``x``, so that its transpose, the weight
    gradient, is a plain product of the copy of ``x`` with the cotangent, or of the copied
    cotangent with ``x``. The BERT step took 0.86 of the time (docs/performance.md, "Weight
    gradients"). Forward mode, vmap and higher derivatives follow from plain JAX (the copy is
    a conditional JAX differentiates).
    """
    return jnp.matmul(x, w.T if transposed else w, precision=precision)


def _weight_product_jvp(transposed, precision, primals, tangents):
    (x, w), (t_x, t_w) = primals, tangents
    y = weight_product(x, w, transposed, precision)
    t_y = jnp.zeros_like(y)
    if not isinstance(t_x, SymbolicZero):
        t_y = jnp.matmul(t_x, w.T if transposed else w, precision=precision)
    if not isinstance(t_w, SymbolicZero):
        rows = jnp.reshape(x, (-1, jnp.shape(x)[-1]))  # (M, K)
        if transposed:  # (N, K) x (M, K) -> (N, M), copied to (M, N)
            term = stored_transpose(lax.dot_general(t_w, rows, (((1,), (1,)), ((), ())), precision=precision))
        else:  # (K, M) x (K, N) -> (M, N)
            term = lax.dot_general(stored_transpose(rows), t_w, (((0,), (0,)), ((), ())), precision=precision)
        t_y = t_y + jnp.reshape(term, jnp.shape(y))
    return y, t_y


weight_product.defjvp(_weight_product_jvp, symbolic_zeros=True)


def gemm_core(a, b, c, attrs, ctx):
    if jnp.ndim(a) != 2 or jnp.ndim(b) != 2:
        raise ctx.error(f"A and B must be matrices, got shapes {jnp.shape(a)} and {jnp.shape(b)}")
    if attrs["transA"]:
        a = a.T
    b_shape = tuple(jnp.shape(b))[:: -1 if attrs["transB"] else 1]  # (K, N)
    if jnp.shape(a)[1] != b_shape[0]:
        raise ctx.error(f"inner dimensions differ: {jnp.shape(a)} @ {b_shape} (after transA/transB)")
    dtype = jnp.result_type(a)
    alpha, beta = float(attrs["alpha"]), float(attrs["beta"])
    # Half types: the product's float32 sums and alpha/beta's epilogue stay in float32 and round
    # once, as onnxruntime does (rounded after each step, 41% of float16 outputs were one unit in
    # the last place off the exact value). The product still reads the half-type operands.
    wide = jnp.float32 if is_half(dtype) else None
    if attrs["transB"] and jnp.shape(a)[0] == 1:
        # One row against B stored (N, K), a classifier at batch 1: for a @ B.T, XLA CPU copies
        # B transposed on every call (ResNet-50's 1000 x 2048 classifier: 3.5 of 62 ms); B @ a.T
        # reads B as stored (0.11 against 0.69 ms alone). The same sums, in the same order.
        y = jnp.matmul(b, a.T, precision=ctx.precision, preferred_element_type=wide).T
    else:
        y = product(a, b, ctx.precision, transposed=bool(attrs["transB"]), preferred_element_type=wide)
    if alpha != 1.0:
        y = (alpha * y).astype(wide or dtype)
    if c is not None and beta != 0.0:
        out_shape = jnp.shape(y)
        try:
            # jnp's broadcast_shapes, not numpy's: it takes symbolic dims (jax.export).
            fits = tuple(jnp.broadcast_shapes(jnp.shape(c), out_shape)) == tuple(out_shape)
        except ValueError:
            fits = False
        if not fits:
            raise ctx.error(f"C of shape {jnp.shape(c)} does not broadcast to the output {out_shape}")
        (c,) = widen_halves(c)
        y = y + (c if beta == 1.0 else (beta * c).astype(wide or dtype))
    return y.astype(dtype)


@register("Gemm", since=(1, 6))
def gemm_1(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Gemm``-1/6: C must match (M, N) unless ``broadcast=1``."""
    a, b, c = inputs
    if not attrs["broadcast"] and c is not None:
        m = jnp.shape(a)[1 if attrs["transA"] else 0]
        nn = jnp.shape(b)[0 if attrs["transB"] else 1]
        if tuple(jnp.shape(c)) != (m, nn):
            raise ctx.error(f"C has shape {jnp.shape(c)}, not {(m, nn)}; before opset 7 this needs broadcast=1")
    return (gemm_core(a, b, c, attrs, ctx),)


@register("Gemm", since=(7, 9, 11, 13))
def gemm(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Gemm``, opsets 7+: C broadcasts unidirectionally (optional from opset 11)."""
    a, b, c = (tuple(inputs) + (None,))[:3]
    return (gemm_core(a, b, c, attrs, ctx),)


@register("MatMul", since=(1, 9, 13))
def matmul(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``MatMul``, all opsets (numpy ``matmul`` semantics, 1-D operands included)."""
    a, b = inputs
    if jnp.ndim(a) == 0 or jnp.ndim(b) == 0:
        raise ctx.error(f"MatMul operands must have rank >= 1, got shapes {jnp.shape(a)} and {jnp.shape(b)}")
    return (product(a, b, ctx.precision),)


@register("Einsum", since=(12, 28))
def einsum(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Einsum``, all opsets (explicit and implicit output, ellipsis)."""
    equation = attrs["equation"]
    equation = (equation.decode() if isinstance(equation, bytes) else equation).replace(" ", "")
    if not equation:
        raise ctx.error("the equation attribute is empty")
    operands = [x for x in inputs if x is not None]
    named = equation.split("->")[0].count(",") + 1
    if named != len(operands):
        raise ctx.error(f"equation {equation!r} names {named} operands, got {len(operands)}")
    dtype = jnp.result_type(*operands)
    # XLA sums a half-precision reduction (an operand's own axis summed out, 'ij->') in that
    # type, rounding after every term; its products keep float32 sums. Half types sum in
    # float32 here, and a chain of contractions rounds once, as onnxruntime does.
    wide = jnp.float32 if is_half(dtype) else None
    y = jnp.einsum(equation, *operands, precision=ctx.precision, preferred_element_type=wide)
    return (y.astype(dtype),)

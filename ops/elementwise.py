"""Elementwise arithmetic: binary (Add, Sub, Mul, Div, Pow, Mod), variadic (Sum, Mean, Max,
Min) and unary math (Abs, Exp, Sqrt, Sin, ...).

Before opset 7 the binary ops broadcast only with ``broadcast=1`` (and an optional ``axis``);
``legacy_broadcast`` implements that. Integer Div truncates toward zero as ONNX requires
(``jnp.floor_divide`` would floor), and Mod follows its ``fmod`` attribute.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
from jax import lax

from jonnx._registry import Attrs, Inputs, OpContext, Outputs, register
from jonnx.ops._util import (
    half_in_float32,
    is_half,
    is_integer,
    legacy_broadcast,
    opaque,
    opaque_constants,
    widen_halves,
)


def _div(a, b, ctx):
    if is_integer(a):
        ctx.check(b != 0, "integer division by zero")
        a, b = jnp.broadcast_arrays(a, b)
        return lax.div(a, b)  # truncates toward zero, like C and ONNX
    dtype = jnp.result_type(a, b)
    if is_half(dtype):
        # XLA divides by a broadcast value (a scalar divisor) as a product with its reciprocal,
        # which in a half type is one unit in the last place off for a fifth of the elements.
        # In float32 those roundings are far below a half unit: the quotient rounds exactly.
        return opaque(jnp.true_divide(*widen_halves(a, b)).astype(dtype))
    # The quotient opaque: XLA turns (a / b) / c into a / (b * c) and a / (b / c) into a * c / b.
    return opaque(jnp.true_divide(a, b))


def _pow(x, y):
    x_dtype = jnp.result_type(x)
    if is_integer(x) and not is_integer(y):
        return jnp.power(jnp.asarray(x, jnp.result_type(y)), y).astype(x_dtype)
    if not is_integer(x) and is_integer(y):
        return jnp.power(x, jnp.asarray(y, x_dtype))
    return jnp.power(x, jnp.asarray(y, x_dtype)).astype(x_dtype)


def _binary(fn, legacy: bool):
    def apply(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
        a, b = inputs
        if legacy:
            a, b = legacy_broadcast(a, b, attrs, ctx)
        return (fn(*opaque_constants(a, b), ctx),)

    return apply


def _plain(fn):
    """A binary function that needs no context, in the (a, b, ctx) form _binary calls."""
    return lambda a, b, ctx: fn(a, b)


for _name, _fn in (
    ("Add", _plain(jnp.add)),
    ("Sub", _plain(jnp.subtract)),
    ("Mul", _plain(jnp.multiply)),
    ("Div", _div),
):
    register(_name, since=(1, 6))(_binary(_fn, legacy=True))
    register(_name, since=(7, 13, 14))(_binary(_fn, legacy=False))
register("Pow", since=1)(_binary(_plain(_pow), legacy=True))
register("Pow", since=(7, 12, 13, 15))(_binary(_plain(_pow), legacy=False))


@register("Mod", since=(10, 13, 28))
def mod(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Mod``, opsets 10+: sign of the divisor (``fmod=0``) or of the dividend (``fmod=1``).

    Floats with ``fmod=0`` (numpy's ``mod``) are defined from opset 28 on.
    """
    a, b = inputs
    if is_integer(a):
        ctx.check(b != 0, "integer modulo by zero")
    if attrs["fmod"]:
        return (jnp.fmod(a, b),)
    if not is_integer(a) and ctx.opset < 28:
        raise ctx.error("before opset 28, fmod=0 is only defined for integer inputs; floats need fmod=1")
    return (jnp.mod(a, b),)


def _variadic(fn):
    def apply(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
        values = [x for x in inputs if x is not None]
        if not values:
            raise ctx.error("needs at least one input")
        return (fn(list(opaque_constants(*values))),)

    return apply


# Sum and Mean add half types in float32 and round once, as onnxruntime does (three float16
# inputs summed pairwise were a unit off in 23% of the outputs); the first input widens and
# the others meet it in float32.
@half_in_float32
def _sum(*xs):
    return functools.reduce(jnp.add, xs)


@half_in_float32
def _mean(*xs):
    return functools.reduce(jnp.add, xs) / len(xs)


_VARIADIC = {
    "Sum": (lambda xs: _sum(*xs), (1, 6, 8, 13)),
    "Mean": (lambda xs: _mean(*xs), (1, 6, 8, 13)),
    "Max": (lambda xs: functools.reduce(jnp.maximum, xs), (1, 6, 8, 12, 13)),
    "Min": (lambda xs: functools.reduce(jnp.minimum, xs), (1, 6, 8, 12, 13)),
}
for _name, (_fn, _since) in _VARIADIC.items():
    register(_name, since=_since)(_variadic(_fn))


def _atan(x):
    """``atan2(2x, 2)``, not XLA's atan: XLA CPU lowers atan as ``atan2(x, 1)``, whose special
    case for a constant 1 is miscompiled with 512-bit vectors, jonnx's default on AMD AVX-512
    and Intel AMX CPUs (jaxlib 0.10.2: 56 of 64 float32 values wrong, float64 too;
    docs/known_issues.md). Exact: doubling is exact and ``atan2(2x, 2) = atan(x)``; the same
    accuracy (under 1 unit in the last place in float32), about 1.7x atan's time."""
    return jnp.arctan2(x + x, jnp.full_like(x, 2))


def _round_half_even(x):
    return jnp.round(x)  # numpy/JAX round half to even, as ONNX Round requires


def _sign(x):
    return jnp.sign(x).astype(jnp.result_type(x))


def _log(x):
    # The operand opaque: XLA rewrites log(exp(x)) as x, which an Exp node that overflows to
    # inf (x = 100 in float32) and the Log after it do not give, and log(pow(x, y)) as
    # y * log(x).
    return jnp.log(opaque(x))


def _sqrt(x):
    # The operand opaque: XLA rewrites sqrt(x * x) as |x| (x * x overflows to inf first).
    return jnp.sqrt(opaque(x))


def _erf(x):
    if is_integer(x):  # the schema allows integer types: erf of an integer rounds to -1, 0 or 1
        return jnp.sign(x)
    return lax.erf(x)


# Unary math: (implementation, since_versions). Versions that only widened types share one.
_UNARY = {
    "Abs": (jnp.abs, (1, 6, 13)),
    "Neg": (jnp.negative, (1, 6, 13)),
    "Exp": (jnp.exp, (1, 6, 13)),
    "Log": (_log, (1, 6, 13)),
    "Sqrt": (_sqrt, (1, 6, 13)),
    "Reciprocal": (jnp.reciprocal, (1, 6, 13)),
    "Floor": (jnp.floor, (1, 6, 13)),
    "Ceil": (jnp.ceil, (1, 6, 13)),
    "Round": (_round_half_even, (11, 22)),
    "Sign": (_sign, (9, 13)),
    "Sin": (jnp.sin, (7, 22)),
    "Cos": (jnp.cos, (7, 22)),
    "Tan": (jnp.tan, (7, 22)),
    "Asin": (jnp.arcsin, (7, 22)),
    "Acos": (jnp.arccos, (7, 22)),
    "Atan": (_atan, (7, 22)),
    "Sinh": (jnp.sinh, (9, 22)),
    "Cosh": (jnp.cosh, (9, 22)),
    "Asinh": (jnp.arcsinh, (9, 22)),
    "Acosh": (jnp.arccosh, (9, 22)),
    "Atanh": (jnp.arctanh, (9, 22)),
    "Erf": (_erf, (9, 13)),
}


# Exact in any precision: computed in their own type, half ones too.
_EXACT = {"Abs", "Neg", "Floor", "Ceil", "Round", "Sign"}
# Results XLA's simplifier would combine with the node that reads them (``ops._util.opaque``):
# exp(a) * exp(b) as exp(a + b), pow(exp(a), b) as exp(a * b), a / sqrt(b) as a * rsqrt(b),
# 1 / (1 / x) as x.
_OPAQUE_RESULT = {"Exp", "Sqrt", "Reciprocal"}


def _unary(fn, widen_halves: bool, opaque_result: bool):
    fn = half_in_float32(fn) if widen_halves else fn

    def apply(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
        (x,) = inputs
        y = fn(x)
        return (opaque(y) if opaque_result else y,)

    return apply


for _name, (_fn, _since) in _UNARY.items():
    register(_name, since=_since)(_unary(_fn, _name not in _EXACT, _name in _OPAQUE_RESULT))

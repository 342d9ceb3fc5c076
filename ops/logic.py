"""Comparisons, boolean logic, Where, IsNaN/IsInf and the bitwise ops.

Opset 1 comparisons and And/Or/Xor broadcast only with ``broadcast=1`` (and an optional
``axis``), which ``legacy_broadcast`` implements; from opset 7 they broadcast like numpy.
String tensors (Equal, Where) exist only as numpy object arrays, so they are handled with
numpy when every input is known at trace time and are an error otherwise.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from jonnx._registry import Attrs, Inputs, OpContext, Outputs, register
from jonnx.ops._util import legacy_broadcast


def _is_string(x) -> bool:
    return isinstance(x, np.ndarray) and x.dtype == object


def _binary(fn, legacy: bool, np_fn=None):
    def apply(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
        a, b = inputs
        if legacy:
            a, b = legacy_broadcast(a, b, attrs, ctx)
        if _is_string(a) or _is_string(b):
            if np_fn is None:
                raise ctx.error("string tensors are not supported by this op")
            if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
                raise ctx.host_error("strings can only be compared with values known at trace time")
            return (np.asarray(np_fn(a, b), dtype=bool),)
        return (fn(a, b),)

    apply.__doc__ = f"ONNX binary op via ``{fn.__name__}``."
    return apply


_COMPARISONS = {
    "Equal": (jnp.equal, np.equal, (1,), (7, 11, 13, 19)),
    "Less": (jnp.less, None, (1,), (7, 9, 13)),
    "Greater": (jnp.greater, None, (1,), (7, 9, 13)),
    "LessOrEqual": (jnp.less_equal, None, (), (12, 16)),
    "GreaterOrEqual": (jnp.greater_equal, None, (), (12, 16)),
    "And": (jnp.logical_and, None, (1,), (7,)),
    "Or": (jnp.logical_or, None, (1,), (7,)),
    "Xor": (jnp.logical_xor, None, (1,), (7,)),
    "BitwiseAnd": (jnp.bitwise_and, None, (), (18,)),
    "BitwiseOr": (jnp.bitwise_or, None, (), (18,)),
    "BitwiseXor": (jnp.bitwise_xor, None, (), (18,)),
}
for _name, (_fn, _np_fn, _legacy, _modern) in _COMPARISONS.items():
    if _legacy:
        register(_name, since=_legacy)(_binary(_fn, legacy=True, np_fn=_np_fn))
    register(_name, since=_modern)(_binary(_fn, legacy=False, np_fn=_np_fn))


@register("Not", since=1)
def not_(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Not``, opset 1."""
    return (jnp.logical_not(inputs[0]),)


@register("BitwiseNot", since=18)
def bitwise_not(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``BitwiseNot``, opset 18."""
    return (jnp.bitwise_not(inputs[0]),)


@register("Where", since=(9, 16))
def where(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Where``, opsets 9+ (string tensors only when every input is static)."""
    cond, x, y = inputs
    if _is_string(x) or _is_string(y):
        if not all(isinstance(v, np.ndarray) for v in inputs):
            raise ctx.host_error("strings can only be chosen by a condition known at trace time")
        return (np.where(cond, x, y),)
    return (jnp.where(cond, x, y),)


@register("IsNaN", since=(9, 13, 20))
def isnan(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``IsNaN``, opsets 9+."""
    return (jnp.isnan(inputs[0]),)


@register("IsInf", since=(10, 20))
def isinf(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``IsInf``, opsets 10+ (``detect_negative``/``detect_positive``)."""
    (x,) = inputs
    detect_neg, detect_pos = attrs["detect_negative"], attrs["detect_positive"]
    if detect_neg and detect_pos:
        return (jnp.isinf(x),)
    if detect_pos:
        return (jnp.isposinf(x),)
    if detect_neg:
        return (jnp.isneginf(x),)
    return (jnp.zeros(jnp.shape(x), bool),)


@register("BitShift", since=(11, 28))
def bitshift(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``BitShift``, opsets 11+: right shifts of signed types are arithmetic; a shift
    amount that is negative or at least the bit width gives the sign fill (0 or -1)."""
    x, y = inputs
    direction = attrs["direction"]
    if direction not in ("LEFT", "RIGHT"):
        raise ctx.error(f"direction must be 'LEFT' or 'RIGHT', got {direction!r}")
    dtype = jnp.result_type(x)
    if not jnp.issubdtype(dtype, jnp.integer):
        raise ctx.error(f"needs integer inputs, got {dtype}")
    x, y = jnp.broadcast_arrays(x, jnp.asarray(y).astype(dtype))
    bits = dtype.itemsize * 8
    # XLA leaves out-of-range shift amounts implementation-defined enough to spell them out.
    out_of_range = (y >= bits) if jnp.issubdtype(dtype, jnp.unsignedinteger) else (y < 0) | (y >= bits)
    zero = jnp.zeros((), dtype)
    if direction == "LEFT":
        shifted = lax.shift_left(x, jnp.where(out_of_range, zero, y))
        return (jnp.where(out_of_range, zero, shifted),)
    if jnp.issubdtype(dtype, jnp.unsignedinteger):
        shifted = lax.shift_right_logical(x, jnp.where(out_of_range, zero, y))
        return (jnp.where(out_of_range, zero, shifted),)
    return (lax.shift_right_arithmetic(x, jnp.where(out_of_range, jnp.asarray(bits - 1, dtype), y)),)

"""Type conversion: Cast, CastLike and BitCast.

Numeric casts run through ``jnp``/``lax`` so they work on concrete and traced values alike.
XLA's conversions agree with ml_dtypes (and so with ONNX's reference) for the float8 and
float4 types when nothing saturates; where ONNX asks for something else this module does it
explicitly:

* float8 with ``saturate=1`` (the default): values, infinities included, are clipped to the
  type's finite range before rounding, so they never become NaN/Inf.
* float8e8m0: ONNX rounds the exponent ``up``/``down``/``nearest`` (``round_mode``) on the
  float32 bit pattern, which no dtype conversion does; done with integer bit arithmetic.
* int4/uint4/int2/uint2 from floating point: truncated to an integer; values outside the type's
  range (NaN included) become 0. ONNX leaves them undefined; 0 is what its reference and its
  backend tests give with ml_dtypes 0.7 (earlier ml_dtypes kept the low bits). XLA would
  saturate, so the cast is written out.

Strings live on the host as numpy object arrays: casting to or from STRING needs the input
known at trace time (a constant, an initializer, or a value folded from them).
"""

from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import onnx
from jax import lax

from jonnx._registry import Attrs, Inputs, OpContext, Outputs, register
from jonnx.ops._util import canonical, onnx_dtype

_SATURATING_F8 = {
    np.dtype(ml_dtypes.float8_e4m3fn),
    np.dtype(ml_dtypes.float8_e4m3fnuz),
    np.dtype(ml_dtypes.float8_e5m2),
    np.dtype(ml_dtypes.float8_e5m2fnuz),
}
_E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
_SUBBYTE_INTS = {np.dtype(t) for t in (ml_dtypes.int4, ml_dtypes.uint4, ml_dtypes.int2, ml_dtypes.uint2)}
_STRING = np.dtype(object)


def _is_float(dtype: np.dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.floating)


def _to_e8m0(x, saturate: bool, round_mode: str, ctx):
    """float -> float8e8m0 by rounding the float32 exponent, as ONNX's reference does."""
    if round_mode not in ("up", "down", "nearest"):
        raise ctx.error(f"round_mode must be 'up', 'down' or 'nearest', got {round_mode!r}")
    bits = lax.bitcast_convert_type(jnp.asarray(x).astype(jnp.float32), jnp.uint32)
    exponent = (bits >> 23) & 0xFF
    special = exponent == 0xFF  # NaN and Inf keep the all-ones exponent (NaN in e8m0)
    if round_mode == "nearest":
        guard = (bits & 0x400000) != 0
        rest = (bits & 0x3FFFFF) != 0
        round_up = guard & (rest | (exponent > 0))
    elif round_mode == "up":
        round_up = (bits & 0x7FFFFF) != 0
    else:
        round_up = jnp.zeros_like(special)
    round_up = round_up & ~special
    if saturate:
        round_up = round_up & (exponent != 0xFE)
    exponent = jnp.where(special, 0xFF, (exponent + round_up.astype(jnp.uint32)) & 0xFF)
    return lax.bitcast_convert_type(exponent.astype(jnp.uint8), _E8M0)


def _parse_string(s, target: np.dtype):
    if isinstance(s, bytes):
        s = s.decode("utf-8")
    s = str(s).strip()
    if target == np.bool_:
        low = s.lower()
        if low in ("true", "false"):
            return low == "true"
        return float(s) != 0
    if jnp.issubdtype(target, jnp.integer):
        try:
            return int(s)
        except ValueError:
            return int(float(s))  # "100.5" -> 100, as the spec allows
    return float(s)  # handles "INF", "+inf", "-INF", "NaN", "1e-5" case-insensitively


def _from_string(x: np.ndarray, target: np.dtype, saturate: bool, round_mode: str, ctx):
    if target == _STRING:
        return x
    if _is_float(target):
        parsed = np.array([_parse_string(s, target) for s in x.reshape(-1)], np.float64)
        return cast_numeric(parsed.reshape(x.shape), target, saturate, round_mode, ctx)
    parsed = [_parse_string(s, target) for s in x.reshape(-1)]
    if target == np.bool_:
        return np.array(parsed, np.bool_).reshape(x.shape)
    # Wide Python ints wrap into the target like an integer cast would.
    wide = np.array(parsed, np.uint64 if target.kind == "u" else np.int64).reshape(x.shape)
    return cast_numeric(wide, target, saturate, round_mode, ctx)


def _to_string(x) -> np.ndarray:
    # numpy's str() of each element: "0.1" for float32(0.1), "True" for bools, as the
    # reference does (x.astype(np.str_)).
    return np.asarray(x).astype(np.str_).astype(object)


def _f64_to_f32_round_to_odd(x):
    """float64 -> float32 rounding to odd, so a second rounding to a narrower float is exact.

    XLA converts float64 to float16/bfloat16/float8 through float32, rounding twice (a value
    just above a tie of the target lands on the tie, then rounds to even). Rounding to odd
    first keeps the sticky information: with float32's 13+ spare bits the final RNE is the
    correctly rounded result ml_dtypes and numpy give.
    """
    y = x.astype(jnp.float32)
    bits = lax.bitcast_convert_type(y, jnp.int32)
    inexact = (y.astype(jnp.float64) != x) & ~jnp.isnan(x)
    away = jnp.abs(x) > jnp.abs(y.astype(jnp.float64))  # sign-magnitude: +1 grows |y|
    fix = inexact & ((bits & 1) == 0)
    bits = jnp.where(fix, jnp.where(away, bits + 1, bits - 1), bits)
    return lax.bitcast_convert_type(bits, jnp.float32)


def cast_numeric(x, target: np.dtype, saturate: bool, round_mode: str, ctx):
    """``x`` as numeric ``target`` by Cast's rules: float8 ``saturate``, ``round_mode`` for
    float8e8m0, 4-/2-bit integers keeping the low bits. QuantizeLinear shares it.
    """
    source = jnp.result_type(x)
    if source == target:
        return jnp.asarray(x) if not isinstance(x, np.ndarray) else x
    if source == np.float64 and _is_float(target) and target.itemsize < 4 and target != _E8M0:
        if target in _SATURATING_F8 and saturate:
            limit = float(ml_dtypes.finfo(target).max)
            x = jnp.clip(x, -limit, limit)
        x = _f64_to_f32_round_to_odd(jnp.asarray(x))
        source = np.dtype(np.float32)
    if target == _E8M0:
        return _to_e8m0(x, saturate, round_mode, ctx)
    if target in _SATURATING_F8 and saturate:
        if not _is_float(source) or source in _SATURATING_F8 or source == _E8M0:
            x = jnp.asarray(x).astype(jnp.float32)
        limit = float(ml_dtypes.finfo(target).max)
        return jnp.clip(x, -limit, limit).astype(target)
    if target in _SUBBYTE_INTS and not jnp.issubdtype(source, jnp.integer) and source != np.bool_:
        # truncate; out of range (or NaN) gives 0 (module docstring)
        whole = jnp.trunc(jnp.asarray(x))
        info = ml_dtypes.iinfo(target)
        x = jnp.where((whole >= info.min) & (whole <= info.max), whole, 0).astype(jnp.int32)
    return jnp.asarray(x).astype(target)


def _cast(x, target: np.dtype, attrs, ctx):
    """Cast ``x`` to ``target`` with the node's ``saturate``/``round_mode`` (when it has them)."""
    saturate = attrs.get("saturate")
    saturate = True if saturate is None else bool(saturate)
    round_mode = attrs.get("round_mode") or "up"
    source = np.dtype(x.dtype) if hasattr(x, "dtype") else np.asarray(x).dtype
    if source == _STRING or target == _STRING:
        if not isinstance(x, (np.ndarray, np.generic)):
            raise ctx.error(
                f"casting {source} to {target if target != _STRING else 'STRING'} needs the input "
                "known at trace time (strings live on the host as numpy object arrays), but this "
                "input is computed inside the traced function. Feed the Cast from a constant or an "
                "integer/string initializer, or convert to strings outside the model."
            )
        x = np.asarray(x)
        if source == _STRING:
            return _from_string(x, target, saturate, round_mode, ctx)
        return _to_string(x)
    return cast_numeric(x, target, saturate, round_mode, ctx)


def _target_dtype(elem_type: int, ctx) -> np.dtype:
    if elem_type == onnx.TensorProto.STRING:
        return _STRING
    try:
        return onnx_dtype(elem_type)
    except Exception as e:  # noqa: BLE001 -- any unknown type is the node's fault
        raise ctx.error(f"`to` names an unknown data type {elem_type!r}") from e


@register("Cast", since=1, host=lambda attrs: str(attrs["to"]).upper() == "STRING")
def cast_1(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Cast``, opset 1: ``to`` is a type name such as ``"FLOAT"``."""
    name = str(attrs["to"]).upper()
    try:
        elem_type = onnx.TensorProto.DataType.Value(name)
    except ValueError as e:
        raise ctx.error(f"`to` is not an ONNX data type name: {attrs['to']!r}") from e
    return (_cast(inputs[0], _target_dtype(elem_type, ctx), attrs, ctx),)


@register("Cast", since=(6, 9, 13, 19, 21, 23, 24, 25, 28), host=lambda attrs: attrs["to"] == onnx.TensorProto.STRING)
def cast(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Cast``, opsets 6+ (``saturate`` from 19, ``round_mode`` from 24)."""
    return (_cast(inputs[0], _target_dtype(attrs["to"], ctx), attrs, ctx),)


@register("CastLike", since=(15, 19, 21, 23, 24, 25))
def cast_like(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``CastLike``, opsets 15+: casts to the dtype of the second input."""
    x, like = inputs
    target = np.dtype(like.dtype)
    return (_cast(x, target if target == _STRING else canonical(target), attrs, ctx),)


@register("BitCast", since=26)
def bit_cast(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``BitCast``, opset 26: reinterprets the bits as another type of the same width."""
    (x,) = inputs
    target = _target_dtype(attrs["to"], ctx)
    source = np.dtype(jnp.result_type(x))
    if target == _STRING or source == _STRING:
        raise ctx.error("BitCast to or from STRING is not defined")
    if source.itemsize != target.itemsize or (source in _SUBBYTE_INTS) != (target in _SUBBYTE_INTS):
        raise ctx.error(
            f"BitCast needs types of the same bit width, got {source} and {target} "
            "(with jax_enable_x64 off, 64-bit types are held as 32-bit ones)"
        )
    if source == target:
        return (x,)
    if source == np.bool_:
        x = jnp.asarray(x).astype(jnp.uint8)
        source = np.dtype(np.uint8)
    if target == np.bool_:
        return (lax.bitcast_convert_type(jnp.asarray(x), jnp.uint8) != 0,)
    return (lax.bitcast_convert_type(jnp.asarray(x), target),)

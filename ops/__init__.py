"""ONNX operators as JAX functions (installed as ``jonnx.ops``).

Importing this package registers every operator family. Each op is also callable directly
with ONNX semantics, outside any model:

>>> import numpy as np, jonnx.ops
>>> jonnx.ops.LeakyRelu(np.array([-2.0, 3.0], np.float32), alpha=0.5).tolist()
[-1.0, 3.0]
>>> jonnx.ops.call("Add", np.float32(1), np.float32(2), opset=6).item()
3.0
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import numpy as np
import onnx.defs

from jonnx import errors
from jonnx._attributes import schema_defaults
from jonnx._registry import (
    OpContext,
    arity,
    float_groups,
    lookup,
    normalize_domain,
    promote_floats,
    register,
    registered,
    schema_for,
)

# Each module registers one op family on import.
from jonnx.ops import (  # noqa: F401
    activation,
    attention,
    cast,
    channels_last,
    control,
    conv,
    detection,
    elementwise,
    image,
    indexing,
    logic,
    loss,
    microsoft,
    ml,
    normalization,
    optimizers,
    pool,
    products,
    quantize,
    random,
    reduce,
    resize,
    rnn,
    sequence,
    shape,
    signal,
    text,
)

__all__ = ["call", "register", "registered"]


def call(
    op_type: str,
    *inputs: Any,
    domain: str = "",
    opset: int | None = None,
    key: jax.Array | None = None,
    train: bool | None = None,
    n_outputs: int | None = None,
    **attrs: Any,
) -> Any:
    """Run one ONNX op on arrays, with the op's exact ONNX semantics.

    Args:
        op_type: the op, e.g. ``"Resize"``.
        *inputs: its inputs in schema order; ``None`` for an omitted optional input. Inputs
            the op needs at trace time (shapes, axes) must be numpy arrays or lists.
        domain: the op's domain (``""`` for ai.onnx).
        opset: the opset whose semantics to use (default: the newest the installed onnx
            knows for ai.onnx, or the newest registered for other domains).
        key: PRNG key, for random ops.
        train: True for training-mode semantics (Dropout, BatchNormalization), False for
            inference, None for what the op's attributes and inputs say (and, for
            BatchNormalization-7 and 9, which have no mode attribute, its output count: five
            outputs train, as a node listing them does, so ``n_outputs=5`` trains there).
        n_outputs: how many outputs the node declares, for ops whose result depends on it
            (Split's pieces, BatchNormalization-7 and 9's mode).
        **attrs: the op's attributes; the schema's defaults fill in the rest.

    Returns:
        The single output as an array, or a tuple when the op has several outputs.

    Raises:
        jonnx.errors.UnsupportedOpError: no implementation for the op at that opset.
    """
    domain = normalize_domain(domain)
    if opset is None:
        opset = (
            onnx.defs.onnx_opset_version()
            if domain == ""
            else max((v for (d, o, v) in registered() if d == domain and o == op_type), default=1)
        )
    op = lookup(domain, op_type, opset)
    if op is None:
        raise errors.UnsupportedOpError(
            f"no implementation of {op_type} (domain {domain or 'ai.onnx'!r}) at opset {opset}",
            nodes=(("<call>", op_type, domain, opset),),
        )
    ctx = OpContext(
        node="<call>",
        op_type=op_type,
        domain=domain,
        opset=opset,
        train=train,
        key=key,
        n_outputs=n_outputs,
    )
    schema = schema_for(domain, op_type, opset)
    if schema is None:
        merged, unknown = op.with_declared_defaults(attrs)
        if unknown:
            raise ctx.error(f"unknown attribute(s) {unknown}; {op_type} takes {sorted(op.attributes)}")
    else:
        merged = {**schema_defaults(schema), **attrs}
    static = op.static_positions(merged)
    for i in static:
        if i < len(inputs) and isinstance(inputs[i], jax.core.Tracer):
            raise errors.StaticValueError(
                f"{op_type} needs input {i} at trace time (a shape, axes or count), but it is "
                "traced; pass a numpy array"
            )
    inputs = inputs + (None,) * (arity(schema, op) - len(inputs))
    args = tuple(np.asarray(x) if i in static and x is not None else x for i, x in enumerate(inputs))
    args = promote_floats(args, float_groups(schema, len(args)))
    outputs = op.fn(args, merged, ctx)
    return outputs[0] if len(outputs) == 1 else tuple(outputs)


def __getattr__(name: str) -> Any:
    """``jonnx.ops.Celu(x, alpha=2.0)``: a registered op by name, in its domain.

    An ai.onnx op wins over a same-named op of another domain; an op registered only in other
    domains resolves to its one domain (``jonnx.ops.LinearRegressor`` is ai.onnx.ml's), and a
    name several other domains share must go through :func:`call` with ``domain=``.
    """
    domains = sorted({d for (d, o, _) in registered() if o == name})
    if not domains:
        raise AttributeError(f"module 'jonnx.ops' has no attribute {name!r} (no op of that name)")
    if "" not in domains and len(domains) > 1:
        raise AttributeError(
            f"{name} is registered in domains {domains}; use jonnx.ops.call({name!r}, ..., domain=...)"
        )
    domain = "" if "" in domains else domains[0]
    fn = functools.partial(call, name, domain=domain)
    functools.update_wrapper(fn, call)
    fn.__doc__ = f"ONNX ``{name}`` (domain {domain or 'ai.onnx'!r}) as a JAX function; see :func:`jonnx.ops.call`."
    return fn

"""What the interpreter and op bodies need to know about the values flowing through a run.

A value is *concrete* (numpy, known at trace time: a constant, a folded shape, a host-side
string tensor) or *dynamic* (a ``jax.Array``, usually a tracer). Ops branch on it (If with a
known condition, string labels only for concrete inputs), so the test lives here, in the core,
where both the interpreter and ``jonnx.ops`` import it without pulling in either one.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

try:  # newer jax re-exports it in jax.extend.core; jax 0.8 (the declared minimum) in jax.core
    from jax.extend.core import concrete_or_error
except ImportError:
    from jax.core import concrete_or_error

__all__ = ["carries_value", "concrete_or_error", "is_concrete", "known_value"]


def is_concrete(value: Any) -> bool:
    """True for values known at trace time: numpy arrays and scalars, None, and lists of them.

    >>> import jax.numpy as jnp, numpy as np
    >>> is_concrete(np.ones(2)), is_concrete([np.int64(3), None]), is_concrete(jnp.ones(2))
    (True, True, False)
    """
    if value is None or isinstance(value, (np.ndarray, np.generic)):
        return True
    if isinstance(value, (list, tuple)):
        return all(is_concrete(v) for v in value)
    return False


def carries_value(value: Any) -> bool:
    """Whether ``value``'s value is known now (see :func:`known_value`), without copying it."""
    if isinstance(value, jax.core.Tracer):
        try:
            concrete_or_error(None, value)
        except jax.errors.ConcretizationTypeError:
            return False
    return True


def known_value(value: Any) -> np.ndarray | None:
    """``value`` as numpy where it is known now, else None.

    Known: numpy, a computed ``jax.Array``, or a tracer that carries its value (``jax.grad``
    outside any jit or vmap); unknown: an abstract tracer (``jax.jit``, ``jax.vmap``).
    """
    if isinstance(value, jax.core.Tracer):
        try:
            return concrete_or_error(np.asarray, value)
        except jax.errors.ConcretizationTypeError:
            return None
    return np.asarray(value)

"""Graph passes run before tracing: each a pure function ``(graph, train) -> graph``.

``jonnx.load(path, optimize=...)`` switches them: True (every pass, the default), False (none)
or ``{pass name: bool}`` (the default for names left out is on). Semantics never change: each
pass is tested on and off, values and gradients. See :data:`PASSES` for the names.
"""

from jonnx.optimize._pipeline import PASSES as PASSES, optimize as optimize, resolve as resolve

__all__ = ["PASSES", "optimize", "resolve"]

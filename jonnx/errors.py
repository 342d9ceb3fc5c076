"""The exceptions jonnx raises on bad models, bad inputs and unsupported features.

Every error derives from :class:`JonnxError`, so ``except jonnx.errors.JonnxError`` catches
everything jonnx reports about a model or its inputs. Messages name the culprit (tensor,
node, op, domain, opset) and say what to do.
"""

from __future__ import annotations

__all__ = [
    "JonnxError",
    "LoadError",
    "ExternalDataError",
    "ModelStructureError",
    "UnsupportedOpError",
    "StaticValueError",
    "RuntimeShapeError",
    "HostValueError",
    "InputError",
    "NodeError",
    "NumericCheckError",
    "MemoryLimitError",
    "NarrowingWarning",
]


class JonnxError(Exception):
    """Base class of every error jonnx raises about a model or its inputs."""


class LoadError(JonnxError):
    """The model could not be read: bad bytes, bad tensors, or a bad file path."""


class ExternalDataError(LoadError):
    """An initializer's external data is unsafe (outside the model folder) or malformed."""


class ModelStructureError(LoadError):
    """The graph is malformed: missing producers, cycles, duplicate outputs, bad attributes."""


class UnsupportedOpError(LoadError):
    """The model uses operators jonnx has no implementation for.

    One error lists every unsupported node, so a user sees the whole gap at once.

    Attributes:
        nodes: tuples ``(node_name, op_type, domain, opset)`` of each unsupported node.
    """

    def __init__(self, message: str, nodes: tuple[tuple[str, str, str, int], ...] = ()):
        super().__init__(message)
        self.nodes = nodes


class StaticValueError(JonnxError):
    """A value that must be known at trace time (a shape, axes, ...) depends on runtime data.

    Attributes:
        where: ``(graph, position)`` of the node of the outermost graph being run whose
            evaluation raised it (a Loop inside an If's branch names the If), or None when
            raised outside the interpreter.
    """

    where: tuple | None = None


class NodeError(JonnxError):
    """A node failed while running: invalid attributes or inputs for its op."""


class RuntimeShapeError(StaticValueError, NodeError):
    """A node's output shape depends on runtime data inside one compiled computation.

    A Loop whose exit condition is runtime data while it has scan outputs or carries a
    sequence (how many rows it stacks is known only by running it), or an If on runtime data
    whose branches give different shapes. ``Model(*inputs)`` catches this while compiling a
    segment and runs that node on the host instead (on concrete values, differentiable under
    ``jax.grad`` with ``params=``); under ``jax.jit``, ``jax.vmap`` or ``Model.apply`` it is
    raised.
    """


class HostValueError(StaticValueError, NodeError):
    """A node meets strings (host values, which JAX cannot hold) and runtime data together
    inside one compiled computation: a string tensor indexed by computed indices (class labels
    gathered by an ArgMax), or chosen by a computed condition (``Where``). ``Model(*inputs)``
    catches this while compiling a segment and runs that node on the host instead, on concrete
    values; under ``jax.jit``, ``jax.vmap`` or ``Model.apply`` it is raised.
    """


class InputError(JonnxError):
    """The inputs given to a model do not match its graph inputs."""


class NumericCheckError(JonnxError):
    """A checked run found an out-of-range index or an integer division by zero."""


class MemoryLimitError(NodeError):
    """A node would create a tensor larger than the model's memory limit (checked before
    anything is allocated)."""


class NarrowingWarning(UserWarning):
    """A 64-bit value known at trace time does not fit the 32-bit type JAX holds it in.

    With ``jax_enable_x64`` off (JAX's default) int64 becomes int32 and float64 becomes
    float32: an int64 constant above 2**31 - 1 would wrap and a float64 above float32's range
    would become infinite. jonnx warns once per trace naming the nodes (checked mode raises
    :class:`NumericCheckError` instead); enable x64 for such models.
    """

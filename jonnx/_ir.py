"""The graph IR: frozen dataclasses that the interpreter walks and graph passes rewrite.

A pass builds a new graph with ``dataclasses.replace``; nothing mutates a graph in place,
so a loaded model is immutable and safe to share between threads.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

import numpy as np

from jonnx._registry import OpDef

__all__ = ["ValueInfo", "Node", "Graph"]


@dataclasses.dataclass(frozen=True)
class ValueInfo:
    """A graph input or output.

    Attributes:
        name: the value's name.
        dtype: numpy dtype of a tensor value, or of a map's values; None when unknown or of
            another kind.
        shape: dims (int, a symbolic name, or None when unknown), or None for unknown rank.
        kind: ``"tensor"``, ``"sequence"``, ``"optional"``, ``"map"`` or ``"unknown"``.
    """

    name: str
    dtype: np.dtype | None = None
    shape: tuple[int | str | None, ...] | None = None
    kind: str = "tensor"


@dataclasses.dataclass(frozen=True, eq=False)
class Node:
    """One node, bound at load time to its implementation.

    Attributes:
        name: the node's name (made up from its position when the model has none).
        op_type, domain: the op it runs.
        inputs, outputs: value names; ``""`` marks an omitted optional input or output.
        attrs: every attribute of the schema: the node's value, else the default, else None.
            Graph attributes (If/Loop/Scan bodies) are :class:`Graph` objects.
        op: the registered implementation for the model's opset.
        opset: the model's opset for ``domain``.
        static_inputs: input positions that must be known at trace time.
        prefer_static: input positions better known at trace time (see ``OpDef``).
        arity: how many inputs the op body receives at least: the schema's formal inputs
            (before a variadic one), so omitted optional inputs arrive as None.
        float_groups: input positions the schema binds to one float-admitting type
            variable; the interpreter casts each group's floats to their common dtype
            (``jonnx._registry.float_groups``).
        seed_index: the position a random op folds into the run's PRNG key; None: its
            position in the graph. Graph passes (jonnx.optimize) pin it, so removing or adding
            nodes never changes what a random op draws.
    """

    name: str
    op_type: str
    domain: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: Mapping[str, Any]
    op: OpDef
    opset: int
    static_inputs: frozenset[int] = frozenset()
    prefer_static: frozenset[int] = frozenset()
    arity: int = 0
    float_groups: tuple[tuple[int, ...], ...] = ()
    seed_index: int | None = None

    def trains(self, train: bool | None) -> bool:
        """Whether this node runs in training mode in a run whose flag is ``train``.

        Only ops that update state (``OpDef.state_updates``) have a mode that matters here:
        the run's flag when set, else what the node's attributes say (``OpDef.trains``).
        """
        if train is not None:
            return bool(train)
        return bool(self.op.trains is not None and self.op.trains(self.attrs, len(self.outputs)))

    def padded(self, args: tuple) -> tuple:
        """``args`` with omitted trailing optional inputs filled in as None, up to ``arity``."""
        return args + (None,) * (self.arity - len(args)) if len(args) < self.arity else args

    @functools.cached_property
    def subgraphs(self) -> tuple[Graph, ...]:
        """The graphs among the node's attributes (If's branches, Loop's and Scan's bodies).

        Kept once found: a host node asks on every call, and its attributes can be long
        tuples (an encoder's categories, a tree ensemble's nodes) that hold no graph.
        """
        return tuple(
            g
            for value in self.attrs.values()
            for g in (value if isinstance(value, tuple) and value and isinstance(value[0], Graph) else (value,))
            if isinstance(g, Graph)
        )

    @functools.cached_property
    def on_host(self) -> bool:
        """Whether the node runs on the host when its inputs are data (``OpDef.runs_on_host``;
        kept: a host node asks on every call)."""
        return self.op.runs_on_host(self.attrs)

    @property
    def reads(self) -> frozenset[str]:
        """Every value the node reads: its inputs and what its subgraphs read from outside."""
        names = {i for i in self.inputs if i}
        for g in self.subgraphs:
            names |= g.outer_names
        return frozenset(names)


@dataclasses.dataclass(frozen=True, eq=False)
class Graph:
    """A (sub)graph with its nodes in topological order.

    Attributes:
        name: the graph's name.
        nodes: nodes in an order where every value is produced before it is read.
        inputs: the values a caller provides (initializer-backed inputs excluded).
        outputs: the graph's outputs in order.
        initializers: name -> numpy value of each initializer.
        outer_names: names a subgraph reads from enclosing scopes.
    """

    name: str
    nodes: tuple[Node, ...]
    inputs: tuple[ValueInfo, ...]
    outputs: tuple[ValueInfo, ...]
    initializers: Mapping[str, np.ndarray]
    outer_names: frozenset[str] = frozenset()

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(v.name for v in self.inputs)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(v.name for v in self.outputs)

    def producers(self) -> dict[str, Node]:
        """Value name -> the node that produces it."""
        return {out: node for node in self.nodes for out in node.outputs if out}

"""Segmented execution: compile once per shape, never per input value.

Some ops decide their output's *shape* from their inputs' *values* (NonZero, Compress,
Unique, NonMaxSuppression) or make values XLA cannot hold (string labels, ZipMap's dicts);
the registry marks them ``host``. When such a node's inputs come from runtime data,
``Model.__call__`` splits the graph there: the nodes before it run as one compiled segment,
the host node runs in numpy on the (small) values that segment returns, and the nodes after
it run as the next compiled segment, which receives the host node's outputs as ordinary
traced arguments. Each segment is compiled per *shape* of what it receives (plus the few
values it needs at trace time: a TopK ``k``, a Reshape target), never per tensor value, so a
detector compiles its backbone once and its small tail once per number of detections.

The plan is made once per model, at load: each node gets a level (the segment it runs in,
or the host step before that segment), found in one pass over the nodes in topological
order. A value needed at trace time (a static input) that a segment computes from data is
fetched after that segment and handed to the next one as a static argument: that is where
a computed TopK ``k`` or Reshape shape cuts the graph.

Some nodes are found to need the host only while a segment is traced: an If or Loop whose
output shape turns out to depend on runtime data (``jonnx.errors.RuntimeShapeError``).
``Model.__call__`` then re-plans with those positions in ``forced_host``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from jonnx._ir import Graph, Node
from jonnx._static import static_values

__all__ = ["SegmentPlan", "Stage", "plan_segments", "weight_only_nodes"]


@dataclasses.dataclass(frozen=True, eq=False)
class Stage:
    """One step of a segmented run: host nodes, then one compiled segment.

    Compared and hashed by identity: ``Model`` keys its compiled segments by the stage
    itself (a static argument, hashed on every call), so a re-plan (a node moved to the host,
    ``forced_host`` below) never reuses another plan's compilation.

    Attributes:
        host_nodes: positions (in ``graph.nodes``) of the nodes run on the host, in order,
            before the segment; they read graph inputs, constants, params and the results of
            earlier stages.
        nodes: positions of the nodes compiled together as this stage's segment.
        reads: values the segment reads that come from outside it: graph inputs, host-node
            outputs and earlier segments' results (not constants, params or state, which
            every segment has).
        static: of ``reads``, those the segment needs at trace time: passed as static
            arguments (one compilation per distinct value; shapes, counts, axes). String
            values are always passed that way too.
        exports: values the segment computes that later stages or the graph outputs read.
        chunks: how many chunks of rows the segment runs its batch in (``jonnx._chunks``;
            the batch padded to whole chunks where they do not divide it); the plan's stages
            have 1, ``Model.__call__`` makes a copy for a large batch.
        train: the run's mode (``RunOptions.train``): None, each node as the graph says (the
            plan's stages), or False, inference everywhere (``Model(..., train=False)`` runs
            a copy).
    """

    host_nodes: tuple[int, ...]
    nodes: tuple[int, ...]
    reads: tuple[str, ...]
    static: frozenset[str]
    exports: tuple[str, ...]
    chunks: int = 1
    train: bool | None = None


@dataclasses.dataclass(frozen=True)
class SegmentPlan:
    """How ``Model.__call__`` runs a graph: its stages in order."""

    stages: tuple[Stage, ...]

    @property
    def host_nodes(self) -> tuple[int, ...]:
        return tuple(p for s in self.stages for p in s.host_nodes)

    @property
    def segmented(self) -> bool:
        """More than one compiled piece: something runs on the host between segments."""
        return len(self.stages) > 1 or bool(self.host_nodes)


def _reads(node: Node, known: dict) -> list[str]:
    names = [i for i in node.inputs if i]
    for sub in node.subgraphs:
        names += sorted(n for n in sub.outer_names if n in known)
    return list(dict.fromkeys(names))


def _static_reads(node: Node, graph_inputs: set[str]) -> set[str]:
    names = {node.inputs[i] for i in node.static_inputs if i < len(node.inputs) and node.inputs[i]}
    for sub in node.subgraphs:
        names |= static_values(sub) & sub.outer_names
    # A graph input that drives control flow directly (If's condition, Loop's trip count) is
    # better static: one compilation per value of a scalar, and no lax.cond over both branches.
    names |= {node.inputs[i] for i in node.prefer_static if i < len(node.inputs) and node.inputs[i] in graph_inputs}
    return names


def weight_only_nodes(graph: Graph, weights: Iterable[str], constants: Iterable[str]) -> tuple[int, ...]:
    """Positions of the nodes that compute only from weights: the "prepared weights".

    A node qualifies when every input it reads is a weight (a param or a running statistic),
    a constant or another such node's output, and at least one is not a constant (nodes over
    constants alone already fold while tracing). Transposed or BatchNorm-folded weights, fused
    Q/K/V weights: with the model's own weights these are the same on every call, so
    ``Model.__call__`` computes them once and hands the results to its segments as weights.
    Random, host, shape-only and subgraph-holding nodes never qualify.
    """
    weights, constants = set(weights), set(constants)
    derived: set[str] = set()
    positions = []
    for position, node in enumerate(graph.nodes):
        op = node.op
        if op.random or op.reads_graph or op.shape_only or node.subgraphs or node.on_host:
            continue
        reads = [i for i in node.inputs if i]
        if not reads or not all(r in weights or r in derived or r in constants for r in reads):
            continue
        if all(r in constants for r in reads):
            continue
        positions.append(position)
        derived.update(o for o in node.outputs if o)
    return tuple(positions)


def plan_segments(
    graph: Graph,
    constants: Iterable[str],
    traced: Iterable[str],
    static_inputs: Iterable[str] = (),
    prepared: Iterable[int] = (),
    forced_host: Iterable[int] = (),
    host_values: Iterable[str] = (),
) -> SegmentPlan:
    """Split ``graph`` into stages (see the module docstring).

    Args:
        graph: the main graph.
        constants: names known at trace time in every segment (constant initializers).
        traced: names every segment has as traced values (params, state).
        static_inputs: graph inputs passed to every segment that reads them as static
            arguments (shape-like inputs: sizes, axes, flags), so that what is computed
            from them stays concrete while tracing (an If's condition, a Reshape target).
        prepared: positions of nodes computed before any stage (:func:`weight_only_nodes`):
            no stage runs them, and their outputs reach every segment like ``traced`` values.
        forced_host: positions of nodes run on the host although their op is not a host op:
            those found, while compiling, to need concrete values (``Model.__call__``: a Loop
            stacking a data-dependent number of rows, an If whose branches differ in shape, a
            Gather of strings by computed indices).
        host_values: values known to hold strings (string graph inputs, and host nodes'
            results found to be strings): the nodes reading them run on the host too, as a
            segment would be compiled once per distinct string it receives.
    """
    prepared, forced_host, host_values = set(prepared), set(forced_host), set(host_values)
    graph_inputs = set(graph.input_names)
    # Per value: its level, whether it is concrete while its segment traces, and the first
    # level whose host step (or static arguments) can have it as numpy.
    level: dict[str, int] = {}
    concrete: dict[str, bool] = {}
    on_host_at: dict[str, int] = {}
    for name in graph_inputs | set(traced):
        level[name], concrete[name], on_host_at[name] = 0, False, 0
    forced = set(static_inputs) & graph_inputs
    for name in set(constants) | forced:
        level[name], concrete[name], on_host_at[name] = 0, True, 0
    producer_level: dict[str, int] = {}
    node_level: list[int] = []
    node_on_host: list[bool] = []
    static_at: dict[int, set[str]] = {}
    for name in (o for p in prepared for o in graph.nodes[p].outputs if o):
        level[name], concrete[name], on_host_at[name] = 0, False, 0
    for position, node in enumerate(graph.nodes):
        if position in prepared:
            node_level.append(-1)  # in no stage
            node_on_host.append(False)
            continue
        reads = _reads(node, level)
        host = (node.on_host or position in forced_host or any(r in host_values for r in reads)) and not all(
            concrete[r] for r in reads
        )
        if host:
            at = max((on_host_at[r] for r in reads), default=0)
            out_concrete = False
        else:
            static = _static_reads(node, graph_inputs) & set(level)
            at = max(
                [level[r] for r in reads] + [on_host_at[r] for r in static if not concrete[r]],
                default=0,
            )
            passed = static_at.setdefault(at, set())
            for r in reads:
                # Static inputs computed elsewhere, and values concrete in an earlier segment,
                # arrive as static arguments so that this segment sees them as numpy.
                if (r in static and not concrete[r]) or (
                    concrete[r] and r in producer_level and producer_level[r] != at
                ):
                    passed.add(r)
            known = {r for r in reads if concrete[r] or r in passed}
            out_concrete = (
                not node.op.random and not node.op.reads_graph and (node.op.shape_only or known == set(reads))
            )
        node_level.append(at)
        node_on_host.append(host)
        for out in node.outputs:
            if out:
                level[out], concrete[out] = at, out_concrete
                on_host_at[out] = at if host else at + 1
                producer_level[out] = at

    n_levels = max([0, *node_level]) + 1  # one stage even with no node left to run
    output_names = set(graph.output_names)
    stages = []
    for at in range(n_levels):
        host_nodes = tuple(p for p, (lv, h) in enumerate(zip(node_level, node_on_host)) if lv == at and h)
        nodes = tuple(p for p, (lv, h) in enumerate(zip(node_level, node_on_host)) if lv == at and not h)
        made = {o for p in nodes for o in graph.nodes[p].outputs if o}
        reads: dict[str, None] = {}
        for p in nodes:
            for r in _reads(graph.nodes[p], level):
                if r not in made and (r in graph_inputs or r in producer_level):
                    reads[r] = None
        later: set[str] = set(output_names)
        for p, lv in enumerate(node_level):
            if lv > at:
                later |= set(_reads(graph.nodes[p], level))
        exports = tuple(o for p in nodes for o in graph.nodes[p].outputs if o and o in later)
        stages.append(
            Stage(
                host_nodes=host_nodes,
                nodes=nodes,
                reads=tuple(reads),
                static=frozenset((static_at.get(at, set()) | forced) & set(reads)),
                exports=exports,
            )
        )
    # Levels with nothing in them (none today, but cheap to guarantee) are dropped.
    return SegmentPlan(tuple(s for s in stages if s.host_nodes or s.nodes) or (stages[0],))

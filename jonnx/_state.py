"""Training state: which values are running statistics, and where each one starts from.

A node that updates state (``OpDef.state_updates``: BatchNormalization's running mean and
variance) reads each statistic through one input. jonnx keeps the statistic as a state entry
named after the value that input reads, so the new value a training run returns can be fed
back in by name. Exporters do not always wire an initializer straight into the node:

* ``torch.onnx.export(..., do_constant_folding=False)`` deduplicates equal initializers (every
  fresh BatchNorm's running mean is zeros) and routes each node's statistics through its own
  ``Identity`` node (``bn1.running_mean = Identity(shared_zeros)``);
* a hand-made graph may feed one initializer to two nodes, or compute a statistic;
* an exporter that merges equal initializers (tf2onnx's ``merge_duplication``) can make
  a fresh layer's running variance the same tensor as its scale (both ones).

:func:`plan_state` follows value-preserving chains (``Identity``) back to an initializer. Each
statistic read by exactly one stateful input becomes a state entry starting from that
initializer's value, and the ``Identity`` that produced it is dropped from the graph, so the
node reads the state entry itself. A statistic that is shared between nodes, also read as
anything else, or computed, or one updated inside a subgraph (a Loop body runs once per
iteration), cannot be tracked: the plan records why, and a run that would train that node
raises instead of training without running statistics.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping

import numpy as np

from jonnx._ir import Graph, Node

__all__ = ["StatePlan", "StateSlot", "plan_state"]


@dataclasses.dataclass(frozen=True)
class StateSlot:
    """One running statistic kept as state.

    Attributes:
        key: the state entry's name: the value the node reads (``Model.state`` key).
        node: the name of the node that reads and updates it.
        source: the initializer it starts from (``key`` itself when the node reads an
            initializer directly).
        via: the outputs of the ``Identity`` nodes between ``source`` and ``key``, nearest
            the source first (empty for a direct read).
    """

    key: str
    node: str
    source: str
    via: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class StatePlan:
    """The running statistics of a graph, and the graph that reads them as state.

    Attributes:
        slots: one per tracked statistic.
        untracked: node name -> why its statistics cannot be kept as state.
        graph: the graph with the ``Identity`` nodes producing state keys removed.
    """

    slots: tuple[StateSlot, ...]
    untracked: Mapping[str, str]
    graph: Graph

    @property
    def keys(self) -> frozenset[str]:
        return frozenset(s.key for s in self.slots)


def _is_float(value: np.ndarray) -> bool:
    return np.issubdtype(value.dtype, np.floating) or value.dtype.name == "bfloat16"


def plan_state(graph: Graph) -> StatePlan:
    """Find the running statistics of ``graph``'s stateful nodes (see the module docstring)."""
    producers = graph.producers()
    stateful = [
        (node, node.inputs[i])
        for node in graph.nodes
        for i in sorted(node.op.state_updates.values())
        if i < len(node.inputs) and node.inputs[i]
    ]
    readers: dict[str, list[str]] = {}
    for node, name in stateful:
        readers.setdefault(name, []).append(node.name)
    uses = _uses(graph)

    slots: list[StateSlot] = []
    reasons: dict[str, list[str]] = {}
    for node in graph.nodes:
        inner = sorted({n for sub in node.subgraphs for n in _stateful_nodes(sub)})
        if inner:
            reasons.setdefault(node.name, []).append(
                f"its subgraph runs stateful node(s) {inner}, whose running statistics jonnx "
                "cannot carry out of a subgraph (a body runs once per iteration, or on one branch)"
            )
    for node, name in stateful:
        if len(readers[name]) > 1:
            others = sorted(set(readers[name]) - {node.name}) or [node.name]
            reasons.setdefault(node.name, []).append(
                f"its running statistic {name!r} is also the running statistic of node(s) "
                f"{others}, so the nodes would overwrite each other's updates; give each "
                "node its own initializer (export without deduplicating initializers)"
            )
            continue
        # The state entry replaces the value the node reads: anything else computing with that
        # value (the node's own scale, a Conv bias) would read the running statistic instead of
        # a parameter, and follow its updates. Copies of it (Identity nodes, graph outputs, as
        # in the inference form jonnx.save writes) are meant to read the statistic.
        others = [
            use for use in uses.get(name, ()) if use not in {(node.name, i) for i in node.op.state_updates.values()}
        ]
        if others:
            reasons.setdefault(node.name, []).append(
                f"its running statistic {name!r} is also read as {_describe(others)}, which would "
                "then follow the statistic's updates; give the statistic an initializer of its own "
                "(an exporter that merges equal initializers shares them)"
            )
            continue
        chain, value = _identity_chain(name, producers, graph.initializers)
        if value in graph.initializers and _is_float(graph.initializers[value]):
            slots.append(StateSlot(key=name, node=node.name, source=value, via=tuple(chain)))
            continue
        reasons.setdefault(node.name, []).append(_untracked_reason(name, value, producers, graph))

    dropped = {s.key for s in slots if s.via}
    nodes = tuple(n for n in graph.nodes if not (n.op_type == "Identity" and n.outputs[0] in dropped))
    rewritten = dataclasses.replace(graph, nodes=nodes) if dropped else graph
    untracked = {node: "; ".join(why) for node, why in reasons.items()}
    return StatePlan(tuple(slots), types.MappingProxyType(untracked), rewritten)


def _uses(graph: Graph) -> dict[str, list[tuple[str, int | str]]]:
    """Value name -> every read of it that computes with it: (node, input index), or (node,
    "subgraph") for a subgraph's read from the enclosing scope; not copies (Identity, graph
    outputs)."""
    uses: dict[str, list[tuple[str, int | str]]] = {}
    for node in graph.nodes:
        if node.op_type == "Identity" and node.domain == "":
            continue
        for i, name in enumerate(node.inputs):
            if name:
                uses.setdefault(name, []).append((node.name, i))
        for name in {n for sub in node.subgraphs for n in sub.outer_names}:
            uses.setdefault(name, []).append((node.name, "subgraph"))
    return uses


def _describe(uses: list[tuple[str, int | str]]) -> str:
    parts = []
    for node, where in uses:
        if where == "subgraph":
            parts.append(f"a value in the subgraph of node {node!r}")
        else:
            parts.append(f"input {where} of node {node!r}")
    return ", ".join(parts)


def _stateful_nodes(graph: Graph):
    """Names of the stateful nodes in ``graph`` and, recursively, its subgraphs."""
    for node in graph.nodes:
        if node.op.state_updates:
            yield node.name
        for sub in node.subgraphs:
            yield from _stateful_nodes(sub)


def _identity_chain(
    name: str, producers: Mapping[str, Node], initializers: Mapping[str, np.ndarray]
) -> tuple[list[str], str]:
    """Follow ``Identity`` nodes back from ``name``: (their outputs, source first; the source)."""
    chain: list[str] = []
    value = name
    while value not in initializers:
        producer = producers.get(value)
        if producer is None or producer.op_type != "Identity" or producer.domain != "" or value in chain:
            break
        chain.append(value)
        value = producer.inputs[0]
    chain.reverse()
    return chain, value


def _untracked_reason(name: str, source: str, producers: Mapping[str, Node], graph: Graph) -> str:
    if source in graph.initializers:
        return f"its running statistic {name!r} comes from initializer {source!r} of dtype {graph.initializers[source].dtype}, not a float"
    if source in graph.input_names:
        return (
            f"its running statistic {name!r} comes from graph input {source!r}, not an "
            "initializer; its new value is only available as the node's own outputs"
        )
    producer = producers.get(source)
    if producer is not None:
        return (
            f"its running statistic {name!r} is computed by node {producer.name!r} "
            f"({producer.op_type}), not stored in an initializer"
        )
    return f"its running statistic {name!r} comes from an enclosing graph, not an initializer"

"""Classifiers with string labels split into an integer classifier and a LabelEncoder.

A LinearClassifier, SVMClassifier or TreeEnsembleClassifier with ``classlabels_strings``
makes strings, which XLA cannot hold, so the whole node ran on the host, op by op: a small
linear model took 0.4 ms a call against onnxruntime's 0.007, and an SVM with probabilities
compiled its solver loop afresh on every call (267 ms). Rewritten, the classifier labels
class ``k`` (0-based) with the integer ``k + 1`` and compiles with the rest of the graph; a
LabelEncoder after it maps ``k + 1`` to the ``k``-th name and 0 to ``""``, so only that lookup
runs on the host. Counting from 1 keeps the ops' one-label forms exact: a linear model with one
score column, or a tree ensemble with one label, gives the label where the score passes the
threshold and 0 ("" with strings) where not, and a lone integer label must be 1.

Left alone: an SVMClassifier with one ``rho`` and other than two labels, whose label output is
0 or 1 whatever the labels say (as onnxruntime), not a lookup.
"""

from __future__ import annotations

import dataclasses
import types

from jonnx._ir import Graph, Node
from jonnx.optimize._util import new_node, taken_names, unique_name

__all__ = ["run"]

ML = "ai.onnx.ml"
# The classifiers' integer-label attribute, by op.
INT_LABELS = {
    "LinearClassifier": "classlabels_ints",
    "SVMClassifier": "classlabels_ints",
    "TreeEnsembleClassifier": "classlabels_int64s",
}


def run(graph: Graph, train: bool | None) -> Graph:
    if not any(_splittable(n) for n in graph.nodes):
        return graph
    taken = taken_names(graph)
    nodes = []
    for node in graph.nodes:
        nodes.extend(_split(node, taken) if _splittable(node) else [node])
    return dataclasses.replace(graph, nodes=tuple(nodes))


def _splittable(node: Node) -> bool:
    if node.domain != ML or node.op_type not in INT_LABELS or not node.attrs.get("classlabels_strings"):
        return False
    if node.op_type == "SVMClassifier":
        return len(node.attrs.get("rho") or (0.0,)) != 1 or len(node.attrs["classlabels_strings"]) == 2
    return True


def _split(node: Node, taken: set[str]) -> list[Node]:
    names = list(node.attrs["classlabels_strings"])
    codes = list(range(1, len(names) + 1))
    attrs = {**node.attrs, "classlabels_strings": None, INT_LABELS[node.op_type]: codes}
    label = node.outputs[0]
    code = unique_name(f"{label}/code", taken) if label else ""
    classifier = dataclasses.replace(
        node,
        outputs=(code, *node.outputs[1:]),
        attrs=types.MappingProxyType(attrs),
        static_inputs=node.op.static_positions(attrs),
        prefer_static=node.op.preferred_static_positions(attrs),
    )
    if not label:
        return [classifier]
    lookup = new_node(
        "LabelEncoder",
        [code],
        [label],
        unique_name(f"{node.name}/labels", taken),
        2,
        domain=ML,
        keys_int64s=codes,
        values_strings=names,
        default_string="",
    )
    return [classifier, lookup]

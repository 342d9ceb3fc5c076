"""Rewrite a model exported in training mode into its inference form, for ``jonnx.save``.

``jonnx.save(model, path, train=False)`` writes a graph that any runtime runs in inference
mode, whatever mode the graph was exported in (``torch.onnx.export(...,
training=TrainingMode.PRESERVE)`` writes BatchNormalization-15 with ``training_mode=1`` and
Dropout-13 with a ``training_mode`` input):

* BatchNormalization keeps only its ``Y`` output, in inference mode (``training_mode=0``;
  ``is_test=1`` before opset 7). What its other outputs fed (the updated running mean and
  variance, the saved batch statistics) now comes from ``Identity`` nodes reading the running
  statistics themselves, as the spec's inference form implies: no batch updated them.
* Dropout loses its ``training_mode`` input (opsets 12+) or gets ``is_test=1`` (opsets 1-6);
  Dropout-7 to 10 is inference already outside training.

Subgraphs (If/Loop/Scan bodies) and model-local functions are rewritten too, each under the
opset it imports.
"""

from __future__ import annotations

import onnx
import onnx.helper

from jonnx._attributes import attribute_graphs
from jonnx._registry import normalize_domain, schema_for

__all__ = ["to_inference"]

_A = onnx.AttributeProto
# BatchNormalization output -> the input whose value it takes in inference mode: the new
# running mean/variance (1, 2) and, before opset 14, the saved mean/variance (3, 4).
_BN_PASS_THROUGH = {1: 3, 2: 4, 3: 3, 4: 4}


def to_inference(model: onnx.ModelProto) -> None:
    """Rewrite ``model`` in place into its inference form (see the module docstring)."""
    opsets = {normalize_domain(o.domain): o.version for o in model.opset_import}
    names = _all_names(model.graph)
    _rewrite_graph(model.graph, opsets.get("", 1), names)
    for function in model.functions:
        f_opsets = {normalize_domain(o.domain): o.version for o in function.opset_import}
        nodes = _rewrite_nodes(list(function.node), f_opsets.get("", opsets.get("", 1)), names)
        del function.node[:]
        function.node.extend(nodes)


def _rewrite_graph(graph: onnx.GraphProto, opset: int, names: set[str]) -> None:
    nodes = _rewrite_nodes(list(graph.node), opset, names)
    del graph.node[:]
    graph.node.extend(nodes)


def _rewrite_nodes(nodes: list[onnx.NodeProto], opset: int, names: set[str]) -> list[onnx.NodeProto]:
    out: list[onnx.NodeProto] = []
    for node in nodes:
        for attr in node.attribute:
            for sub in attribute_graphs(attr):
                _rewrite_graph(sub, opset, names)
        if normalize_domain(node.domain) != "":
            out.append(node)
        elif node.op_type == "BatchNormalization":
            out.extend(_batch_norm(node, _since(node.op_type, opset), names))
        elif node.op_type == "Dropout":
            _dropout(node, _since(node.op_type, opset))
            out.append(node)
        else:
            out.append(node)
    return out


def _batch_norm(node: onnx.NodeProto, since: int, names: set[str]) -> list[onnx.NodeProto]:
    if since >= 14:
        _set_int(node, "training_mode", 0)
    elif since < 7:
        _set_int(node, "is_test", 1)
    extra = [(i, name) for i, name in enumerate(node.output) if i > 0 and name]
    del node.output[1:]
    identities = []
    for i, name in extra:
        source = node.input[_BN_PASS_THROUGH[i]] if _BN_PASS_THROUGH[i] < len(node.input) else ""
        if not source:
            raise ValueError(f"BatchNormalization {node.name!r} has no running statistic for output {i}")
        identities.append(
            onnx.helper.make_node(
                "Identity", [source], [name], name=_fresh(f"{node.name or 'bn'}/inference_{i}", names)
            )
        )
    return [node, *identities]


def _dropout(node: onnx.NodeProto, since: int) -> None:
    if since >= 12:
        del node.input[2:]  # training_mode: absent means inference
        while node.input and not node.input[-1]:
            del node.input[-1]
    elif since < 7:
        _set_int(node, "is_test", 1)


def _set_int(node: onnx.NodeProto, name: str, value: int) -> None:
    for attr in node.attribute:
        if attr.name == name:
            node.attribute.remove(attr)
            break
    node.attribute.append(onnx.helper.make_attribute(name, value))


def _since(op_type: str, opset: int) -> int:
    schema = schema_for("", op_type, opset)
    return schema.since_version if schema is not None else opset


def _all_names(graph: onnx.GraphProto) -> set[str]:
    """Node names in ``graph`` and its subgraphs, so added nodes get unused ones."""
    names = set()
    for node in graph.node:
        names.add(node.name)
        for attr in node.attribute:
            for sub in attribute_graphs(attr):
                names |= _all_names(sub)
    return names


def _fresh(base: str, names: set[str]) -> str:
    name, i = base, 1
    while name in names:
        i += 1
        name = f"{base}_{i}"
    names.add(name)
    return name

"""ONNX attributes -> Python values, and the schema defaults every op body receives.

Op bodies see attributes already decoded (floats, ints, str, numpy arrays, tuples of them,
graphs) with every attribute of the op's schema present: the node's value, else the schema's
default, else None. The loader (``jonnx._build``) and ``jonnx.ops.call`` both decode here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import onnx
import onnx.defs

from jonnx import errors
from jonnx._tensors import sparse_to_numpy, tensor_to_numpy

__all__ = ["attribute_graphs", "decode_attribute", "schema_defaults"]

_A = onnx.AttributeProto


def attribute_graphs(attr: onnx.AttributeProto) -> tuple[onnx.GraphProto, ...]:
    """The subgraphs an attribute holds (If's branches, Loop's and Scan's bodies): the one walk
    over a node's *protobuf* subgraphs (the loaded IR has :attr:`jonnx.Node.subgraphs`)."""
    if attr.type == _A.GRAPH:
        return (attr.g,)
    if attr.type == _A.GRAPHS:
        return tuple(attr.graphs)
    return ()


def decode_attribute(
    attr: onnx.AttributeProto,
    node: str,
    *,
    base_dir: str | None = None,
    memory_limit: int | None = None,
    graph: Callable[[onnx.GraphProto], Any] | None = None,
) -> Any:
    """The Python value of ``attr``: float, int, str, numpy array, tuple of them, or a graph.

    Args:
        attr: the attribute.
        node: the node's name, for error messages.
        base_dir, memory_limit: for tensor values, as in :func:`jonnx._tensors.tensor_to_numpy`.
        graph: builds a graph attribute's value (the loader's ``GraphBuilder.graph``); None
            where no graph can appear (schema defaults).

    Raises:
        jonnx.errors.ModelStructureError: the attribute has no valid type, or is a graph
            where ``graph`` is None.
    """
    kind = attr.type
    if kind == _A.FLOAT:
        return float(attr.f)
    if kind == _A.INT:
        return int(attr.i)
    if kind == _A.STRING:
        return attr.s.decode("utf-8", errors="surrogateescape")
    if kind == _A.TENSOR:
        return tensor_to_numpy(attr.t, base_dir, memory_limit=memory_limit)
    if kind == _A.SPARSE_TENSOR:
        return sparse_to_numpy(attr.sparse_tensor, base_dir, memory_limit=memory_limit)
    if kind in (_A.GRAPH, _A.GRAPHS) and graph is None:
        raise errors.ModelStructureError(f"node {node!r}: attribute {attr.name!r} cannot be a graph here")
    if kind == _A.GRAPH:
        return graph(attr.g)
    if kind == _A.FLOATS:
        return tuple(float(v) for v in attr.floats)
    if kind == _A.INTS:
        return tuple(int(v) for v in attr.ints)
    if kind == _A.STRINGS:
        return tuple(s.decode("utf-8", errors="surrogateescape") for s in attr.strings)
    if kind == _A.TENSORS:
        return tuple(tensor_to_numpy(t, base_dir, memory_limit=memory_limit) for t in attr.tensors)
    if kind == _A.GRAPHS:
        return tuple(graph(g) for g in attr.graphs)
    if kind == _A.SPARSE_TENSORS:
        return tuple(sparse_to_numpy(t, base_dir, memory_limit=memory_limit) for t in attr.sparse_tensors)
    if kind == _A.TYPE_PROTO:
        return attr.tp
    if kind == _A.TYPE_PROTOS:
        return tuple(attr.type_protos)
    raise errors.ModelStructureError(
        f"node {node!r}: attribute {attr.name!r} has no valid type (AttributeProto.type {kind})"
    )


def schema_defaults(schema: onnx.defs.OpSchema | None) -> dict[str, Any]:
    """Every attribute of ``schema`` with its decoded default (None where it has none)."""
    if schema is None:
        return {}
    return dict(_defaults(schema.domain, schema.name, schema.since_version))


@functools.cache
def _defaults(domain: str, op_type: str, since_version: int) -> Mapping[str, Any]:
    schema = onnx.defs.get_schema(op_type, since_version, domain)
    return {
        name: decode_attribute(spec.default_value, "<defaults>") if spec.default_value.type != _A.UNDEFINED else None
        for name, spec in schema.attributes.items()
    }

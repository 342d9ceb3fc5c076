"""ONNX protos -> the graph IR: decode attributes, bind ops, order nodes, check edges."""

from __future__ import annotations

import functools
import heapq
import types
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnx.helper
import onnx.numpy_helper

from jonnx import errors
from jonnx._functions import check_recursion, function_key, function_opsets, inline_call
from jonnx._ir import Graph, Node, ValueInfo
from jonnx._registry import lookup, normalize_domain, schema_for
from jonnx._tensors import np_dtype, tensor_to_numpy

__all__ = ["GraphBuilder", "schema_defaults", "value_info"]

_A = onnx.AttributeProto

#: Inlining model-local functions stops with an error past this many nodes (a function that
#: calls another twice, nested, doubles the count at each level).
MAX_INLINED_NODES = 1_000_000

#: Subgraphs (If/Loop/Scan bodies) nested deeper than this are refused: real models nest a
#: few levels, and each level costs a Python stack frame when the model is traced.
MAX_GRAPH_DEPTH = 64


def value_info(proto: onnx.ValueInfoProto) -> ValueInfo:
    """Decode a graph input/output declaration."""
    kind = proto.type.WhichOneof("value") if proto.HasField("type") else None
    if kind != "tensor_type":
        mapping = {"sequence_type": "sequence", "optional_type": "optional", "map_type": "map"}
        return ValueInfo(proto.name, kind=mapping.get(kind, "unknown"))
    tensor = proto.type.tensor_type
    dtype = np_dtype(tensor.elem_type) if tensor.elem_type else None
    shape = None
    if tensor.HasField("shape"):
        shape = tuple(
            d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor.shape.dim
        )
    return ValueInfo(proto.name, dtype=dtype, shape=shape)


class GraphBuilder:
    """Builds :class:`Graph` objects for one model, collecting every unsupported node.

    Args:
        opsets: the model's opset per domain (``""`` for the default domain).
        base_dir: the model's folder for external data, or None.
    """

    def __init__(
        self,
        opsets: Mapping[str, int],
        base_dir: str | None,
        functions: Sequence[onnx.FunctionProto] = (),
    ):
        self.opsets = dict(opsets)
        self.base_dir = base_dir
        self.functions = {function_key(f.domain, f.name, f.overload): f for f in functions}
        self.unsupported: list[tuple[str, str, str, int]] = []
        self._inlined = 0
        self._depth = 0

    def raise_if_unsupported(self) -> None:
        if not self.unsupported:
            return
        lines = "\n".join(
            f"  node {name!r}: {op} (domain {dom or 'ai.onnx'!r}, opset {opset})"
            for name, op, dom, opset in self.unsupported
        )
        raise errors.UnsupportedOpError(
            f"{len(self.unsupported)} node(s) use operators jonnx does not implement:\n{lines}\n"
            "Register your own with @jonnx.register(op_type, since=..., domain=...).",
            nodes=tuple(self.unsupported),
        )

    # -- graphs -------------------------------------------------------------------------

    def graph(self, proto: onnx.GraphProto, outer: frozenset[str] = frozenset()) -> Graph:
        """Build ``proto``; ``outer`` names the values visible from enclosing graphs."""
        if self._depth >= MAX_GRAPH_DEPTH:
            raise errors.ModelStructureError(
                f"graph {proto.name!r} is nested more than {MAX_GRAPH_DEPTH} subgraphs deep"
            )
        self._depth += 1
        try:
            return self._graph(proto, outer)
        finally:
            self._depth -= 1

    def _graph(self, proto: onnx.GraphProto, outer: frozenset[str]) -> Graph:
        initializers: dict[str, np.ndarray] = {}
        for tensor in proto.initializer:
            initializers[tensor.name] = tensor_to_numpy(tensor, self.base_dir)
        for sparse in proto.sparse_initializer:
            initializers[sparse.values.name] = self._sparse(sparse)
        inputs = tuple(value_info(v) for v in proto.input if v.name not in initializers)
        outputs = tuple(value_info(v) for v in proto.output)

        expanded = [
            item
            for index, node_proto in enumerate(proto.node)
            for item in self._expand(node_proto, node_proto.name or f"{node_proto.op_type}_{index}", self.opsets, ())
        ]
        produced = {out for n, _, _ in expanded for out in n.output if out}
        visible = frozenset(outer | produced | set(initializers) | {v.name for v in inputs})
        nodes = [
            node
            for node_proto, name, opsets in expanded
            if (node := self._node(node_proto, name, visible, opsets)) is not None
        ]
        local = frozenset(initializers) | {v.name for v in inputs}
        if self.unsupported:
            # The load fails with UnsupportedOpError once the whole model is read; skip the
            # edge checks, which the dropped nodes would trip first.
            ordered = nodes
        else:
            ordered = _topological(nodes, local, outer, proto.name)
        reads = {name for n in ordered for name in _reads(n)} | {o.name for o in outputs}
        outer_names = frozenset(n for n in reads if n not in local and n not in produced)
        for out in outputs:
            if not self.unsupported and out.name not in local | produced | outer:
                raise errors.ModelStructureError(
                    f"graph {proto.name!r}: output {out.name!r} is produced by no node, input "
                    "or initializer"
                )
        return Graph(
            name=proto.name,
            nodes=tuple(ordered),
            inputs=inputs,
            outputs=outputs,
            initializers=types.MappingProxyType(initializers),
            outer_names=outer_names,
        )

    def _sparse(self, sparse: onnx.SparseTensorProto) -> np.ndarray:
        values = tensor_to_numpy(sparse.values, self.base_dir)
        indices = tensor_to_numpy(sparse.indices, self.base_dir).astype(np.int64)
        dims = tuple(sparse.dims)
        dense = np.zeros(dims, dtype=values.dtype)
        size = int(np.prod(dims))
        if indices.size and (indices.min() < 0 or indices.max() >= max(size, 1)):
            raise errors.LoadError(f"sparse tensor {sparse.values.name!r} has out-of-range indices")
        if indices.ndim == 1:
            dense.reshape(-1)[indices] = values
        else:
            dense[tuple(indices.T)] = values
        return dense

    # -- nodes --------------------------------------------------------------------------

    def _expand(
        self, proto: onnx.NodeProto, name: str, opsets: Mapping[str, int], stack: tuple
    ) -> list[tuple[onnx.NodeProto, str, Mapping[str, int]]]:
        """``proto`` itself, or, for a call of a model-local function, its inlined body."""
        key = function_key(proto.domain, proto.op_type, proto.overload)
        function = self.functions.get(key)
        if function is None:
            return [(proto, name, opsets)]
        check_recursion(stack, key, name)
        body = inline_call(proto, function, name)
        self._inlined += len(body)
        if self._inlined > MAX_INLINED_NODES:
            raise errors.ModelStructureError(
                f"inlining model-local functions (at node {name!r}) makes more than "
                f"{MAX_INLINED_NODES} nodes"
            )
        inner = function_opsets(function, opsets)
        return [item for node in body for item in self._expand(node, node.name, inner, (*stack, key))]

    def _node(
        self, proto: onnx.NodeProto, name: str, visible: frozenset[str], opsets: Mapping[str, int]
    ) -> Node | None:
        domain = normalize_domain(proto.domain)
        if domain not in opsets:
            raise errors.ModelStructureError(
                f"node {name!r} ({proto.op_type}) uses domain {domain or 'ai.onnx'!r}, which "
                "the model's opset_import does not list"
            )
        opset = opsets[domain]
        schema = schema_for(domain, proto.op_type, opset)
        attrs = self._attributes(proto, name, schema, visible)
        op = lookup(domain, proto.op_type, opset)
        if op is None:
            self.unsupported.append((name, proto.op_type, domain, opset))
            return None
        if op.validate is not None:
            problem = op.validate(attrs, len(proto.input), len(proto.output))
            if problem:
                raise errors.ModelStructureError(f"node {name!r} ({proto.op_type}, opset {opset}): {problem}")
        return Node(
            name=name,
            op_type=proto.op_type,
            domain=domain,
            inputs=tuple(proto.input),
            outputs=tuple(proto.output),
            attrs=types.MappingProxyType(attrs),
            op=op,
            opset=opset,
            static_inputs=op.static_positions(attrs),
            prefer_static=op.preferred_static_positions(attrs),
        )

    def _attributes(
        self,
        proto: onnx.NodeProto,
        name: str,
        schema: onnx.defs.OpSchema | None,
        visible: frozenset[str],
    ) -> dict[str, Any]:
        attrs = schema_defaults(schema)
        given = set()
        for attr in proto.attribute:
            if attr.ref_attr_name:
                raise errors.ModelStructureError(
                    f"node {name!r} ({proto.op_type}): attribute {attr.name!r} refers to "
                    f"{attr.ref_attr_name!r}, which only a function body may do"
                )
            attrs[attr.name] = self._attribute(attr, name, visible)
            given.add(attr.name)
        if schema is not None:
            for attr_name, spec in schema.attributes.items():
                if spec.required and attr_name not in given:
                    raise errors.ModelStructureError(
                        f"node {name!r} ({proto.op_type}, opset {schema.since_version}) is "
                        f"missing its required attribute {attr_name!r}"
                    )
        return attrs

    def _attribute(self, attr: onnx.AttributeProto, node: str, visible: frozenset[str]) -> Any:
        kind = attr.type
        if kind == _A.FLOAT:
            return float(attr.f)
        if kind == _A.INT:
            return int(attr.i)
        if kind == _A.STRING:
            return attr.s.decode("utf-8", errors="surrogateescape")
        if kind == _A.TENSOR:
            return tensor_to_numpy(attr.t, self.base_dir)
        if kind == _A.SPARSE_TENSOR:
            return self._sparse(attr.sparse_tensor)
        if kind == _A.GRAPH:
            return self.graph(attr.g, visible)
        if kind == _A.FLOATS:
            return tuple(float(v) for v in attr.floats)
        if kind == _A.INTS:
            return tuple(int(v) for v in attr.ints)
        if kind == _A.STRINGS:
            return tuple(s.decode("utf-8", errors="surrogateescape") for s in attr.strings)
        if kind == _A.TENSORS:
            return tuple(tensor_to_numpy(t, self.base_dir) for t in attr.tensors)
        if kind == _A.GRAPHS:
            return tuple(self.graph(g, visible) for g in attr.graphs)
        if kind == _A.SPARSE_TENSORS:
            return tuple(self._sparse(t) for t in attr.sparse_tensors)
        if kind == _A.TYPE_PROTO:
            return attr.tp
        if kind == _A.TYPE_PROTOS:
            return tuple(attr.type_protos)
        raise errors.ModelStructureError(
            f"node {node!r}: attribute {attr.name!r} has no type (AttributeProto.type unset)"
        )


def schema_defaults(schema: onnx.defs.OpSchema | None) -> dict[str, Any]:
    """Every attribute of ``schema`` with its decoded default (None where it has none)."""
    if schema is None:
        return {}
    return dict(_defaults(schema.domain, schema.name, schema.since_version))


@functools.lru_cache(maxsize=None)
def _defaults(domain: str, op_type: str, since_version: int) -> Mapping[str, Any]:
    schema = onnx.defs.get_schema(op_type, since_version, domain)
    decoder = GraphBuilder({}, None)
    return {
        name: decoder._attribute(spec.default_value, "<defaults>", frozenset())
        if spec.default_value.type != _A.UNDEFINED
        else None
        for name, spec in schema.attributes.items()
    }


def _reads(node: Node) -> set[str]:
    """Every value ``node`` reads: its inputs and what its subgraphs read from outside."""
    names = {i for i in node.inputs if i}
    for value in node.attrs.values():
        graphs = value if isinstance(value, tuple) else (value,)
        for g in graphs:
            if isinstance(g, Graph):
                names |= g.outer_names
    return names


def _topological(
    nodes: list[Node], local: frozenset[str], outer: frozenset[str], graph: str
) -> list[Node]:
    """Order ``nodes`` so each value is produced before it is read (stable for sorted input)."""
    producer: dict[str, int] = {}
    for i, node in enumerate(nodes):
        for out in node.outputs:
            if not out:
                continue
            if out in producer or out in local:
                raise errors.ModelStructureError(
                    f"graph {graph!r}: value {out!r} is produced twice (node {node.name!r})"
                )
            producer[out] = i
    waiting: list[set[int]] = []
    dependents: dict[int, list[int]] = {}
    for i, node in enumerate(nodes):
        deps = set()
        for name in _reads(node):
            if name in producer:
                deps.add(producer[name])
            elif name not in local and name not in outer:
                raise errors.ModelStructureError(
                    f"graph {graph!r}: node {node.name!r} ({node.op_type}) reads {name!r}, "
                    "which no node, graph input or initializer produces"
                )
        waiting.append(deps)
        for d in deps:
            dependents.setdefault(d, []).append(i)
    # A heap keeps the file's order wherever it is already valid.
    ready = [i for i, deps in enumerate(waiting) if not deps]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for j in dependents.get(i, ()):
            waiting[j].discard(i)
            if not waiting[j]:
                heapq.heappush(ready, j)
    if len(order) != len(nodes):
        done = set(order)
        stuck = sorted(nodes[i].name for i in range(len(nodes)) if i not in done)
        raise errors.ModelStructureError(
            f"graph {graph!r} has a cycle through node(s) {stuck[:10]}"
        )
    return [nodes[i] for i in order]

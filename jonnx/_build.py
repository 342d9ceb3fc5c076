"""ONNX protos -> the graph IR: decode attributes, bind ops, order nodes, check edges."""

from __future__ import annotations

import heapq
import os
import types
import warnings
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnx.helper
import onnx.numpy_helper
from google.protobuf.message import Message

from jonnx import errors
from jonnx._attributes import decode_attribute, schema_defaults
from jonnx._functions import FunctionKey, check_recursion, function_key, function_opsets, inline_call
from jonnx._ir import Graph, Node, ValueInfo
from jonnx._progress import Progress
from jonnx._registry import arity, float_groups, lookup, normalize_domain, schema_for
from jonnx._tensors import inline_tensor_to_numpy, np_dtype, sparse_to_numpy, tensor_to_numpy
from jonnx._wire import InlineData

__all__ = ["GraphBuilder", "value_info"]

_A = onnx.AttributeProto

#: Inlining model-local functions stops with an error past this many nodes (a function that
#: calls another twice, nested, doubles the count at each level).
MAX_INLINED_NODES = 1_000_000

#: Subgraphs (If/Loop/Scan bodies) nested deeper than this are refused: real models nest a
#: few levels, and each level costs a Python stack frame when the model is traced.
MAX_GRAPH_DEPTH = 64

#: Calls of model-local functions nested deeper than this (a function calling a function...)
#: are refused, whether or not they recurse.
MAX_FUNCTION_DEPTH = 64


# onnx's schema lookups take opset versions as C ints.
_MAX_OPSET = 2**31 - 1


def default_memory_limit() -> int:
    """Half the machine's physical memory (8 GiB where it cannot be read)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def _elem_dtype(name: str, elem_type: int) -> np.dtype | None:
    try:
        return np_dtype(elem_type) if elem_type else None
    except errors.LoadError:
        raise errors.ModelStructureError(f"value {name!r} is declared with unknown element type {elem_type}") from None


def value_info(proto: onnx.ValueInfoProto) -> ValueInfo:
    """Decode a graph input/output declaration."""
    kind = proto.type.WhichOneof("value") if proto.HasField("type") else None
    if kind == "map_type":  # its values' type, where they are tensors (ai.onnx.ml's maps)
        values = proto.type.map_type.value_type
        elem = values.tensor_type.elem_type if values.WhichOneof("value") == "tensor_type" else 0
        return ValueInfo(proto.name, dtype=_elem_dtype(proto.name, elem), kind="map")
    if kind != "tensor_type":
        mapping = {"sequence_type": "sequence", "optional_type": "optional"}
        return ValueInfo(proto.name, kind=mapping.get(kind, "unknown"))
    tensor = proto.type.tensor_type
    dtype = _elem_dtype(proto.name, tensor.elem_type)
    shape = None
    if tensor.HasField("shape"):
        shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor.shape.dim)
    return ValueInfo(proto.name, dtype=dtype, shape=shape)


class GraphBuilder:
    """Builds :class:`Graph` objects for one model, collecting every unsupported node.

    Args:
        opsets: the model's opset per domain (``""`` for the default domain).
        base_dir: the model's folder for external data, or None.
        functions: the model-local functions.
        memory_limit: the largest tensor, in bytes, that loading may create (an external
            initializer, a densified sparse one); None for no limit.
        allow_unknown_attributes: a node setting an attribute its schema does not declare is
            reported with a warning, and the attribute ignored, instead of refused.
        inline: where the main graph's initializers left their ``raw_data`` in the model file
            (``jonnx._wire.read_model``), or None when the proto holds it.
    """

    def __init__(
        self,
        opsets: Mapping[str, int],
        base_dir: str | None,
        functions: Sequence[onnx.FunctionProto] = (),
        memory_limit: int | None = default_memory_limit(),
        allow_unknown_attributes: bool = False,
        inline: InlineData | None = None,
    ):
        for domain, version in opsets.items():
            if not isinstance(domain, str):
                raise errors.LoadError(f"opset_import names domain {domain!r}, which is not valid UTF-8")
            _check_opset(domain, version, "the model")
        self.opsets = dict(opsets)
        self.base_dir = base_dir
        self.memory_limit = memory_limit
        self.inline = inline
        self.functions: dict[FunctionKey, onnx.FunctionProto] = {}
        for i, f in enumerate(functions):
            check_text(f, f"functions[{i}]")
            for o in f.opset_import:
                _check_opset(o.domain, o.version, f"function {f.domain}:{f.name}")
            key = function_key(f.domain, f.name, f.overload)
            if key in self.functions:
                raise errors.ModelStructureError(f"model-local function {f.domain}:{f.name} is defined twice")
            self.functions[key] = f
        self.unsupported: list[tuple[str, str, str, int]] = []
        self.allow_unknown_attributes = allow_unknown_attributes
        # (node, op_type, domain, since_version, attribute) of each attribute no schema declares.
        self.unknown_attributes: list[tuple[str, str, str, int, str]] = []
        self._inlined = 0
        self._depth = 0
        self._sizes: dict[FunctionKey, int] = {}
        # The opsets and function-call stack of the node whose subgraphs are being built: a
        # subgraph inside a function body runs with the function's opsets, and a call in it
        # that reaches the function again is recursion.
        self._scope: tuple[Mapping[str, int], tuple[FunctionKey, ...]] = (self.opsets, ())

    def raise_if_unsupported(self) -> None:
        """Report what the whole model got wrong at once: unsupported ops, then attributes
        their schemas do not declare (an error, or a warning with ``allow_unknown_attributes``)."""
        self._report_unsupported()
        if not self.unknown_attributes:
            return
        lines = "\n".join(
            f"  node {node!r}: {op}-{version} (domain {dom or 'ai.onnx'!r}) has no attribute {attr!r}"
            for node, op, dom, version, attr in self.unknown_attributes
        )
        message = (
            f"{len(self.unknown_attributes)} attribute(s) that the nodes' operator schemas do not declare:\n{lines}\n"
        )
        if self.allow_unknown_attributes:
            warnings.warn(message + "They are ignored.", stacklevel=4)
            return
        raise errors.ModelStructureError(
            message + "onnxruntime refuses such a model too. If they are harmless leftovers of an "
            "older opset or an exporter, pass allow_unknown_attributes=True to jonnx.load to "
            "ignore them (with a warning); otherwise convert the model to the opset it was written for."
        )

    def _report_unsupported(self) -> None:
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
        if self._depth == 0:
            check_text(proto, "graph")
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
        spans = self.inline.spans if self.inline is not None and self._depth == 1 else ()
        # Decoding (and reading external data) is what takes long in a large model's load.
        desc = "reading initializers" if self._depth == 1 else f"reading initializers of {proto.name!r}"
        progress = Progress(desc, len(proto.initializer), unit="tensors")
        nbytes = 0
        try:
            for index, tensor in enumerate(proto.initializer):
                _unique(tensor.name, initializers, proto.name, "initializer")
                span = spans[index] if index < len(spans) else None
                if span is not None:
                    value = inline_tensor_to_numpy(tensor, self.inline, span)
                else:
                    value = tensor_to_numpy(tensor, self.base_dir, memory_limit=self.memory_limit)
                initializers[tensor.name] = value
                nbytes += value.nbytes
                progress.update(1, extra=f"{nbytes / 2**20:.1f} MiB")
        except BaseException:
            progress.close(failed=True)
            raise
        progress.close()
        for sparse in proto.sparse_initializer:
            _unique(sparse.values.name, initializers, proto.name, "initializer")
            initializers[sparse.values.name] = self._sparse(sparse)
        declared: set[str] = set()
        for v in proto.input:
            _unique(v.name, declared, proto.name, "input")
            declared.add(v.name)
        inputs = tuple(value_info(v) for v in proto.input if v.name not in initializers)
        outputs = tuple(value_info(v) for v in proto.output)

        opsets, stack = self._scope
        expanded = [
            item
            for index, node_proto in enumerate(proto.node)
            for item in self._expand(node_proto, node_proto.name or f"{node_proto.op_type}_{index}", opsets, stack)
        ]
        produced = {out for n, *_ in expanded for out in n.output if out}
        visible = frozenset(outer | produced | set(initializers) | {v.name for v in inputs})
        nodes = []
        for node_proto, name, node_opsets, node_stack in expanded:
            saved, self._scope = self._scope, (node_opsets, node_stack)
            try:
                node = self._node(node_proto, name, visible, node_opsets)
            finally:
                self._scope = saved
            if node is not None:
                nodes.append(node)
        local = frozenset(initializers) | {v.name for v in inputs}
        if self.unsupported:
            # The load fails with UnsupportedOpError once the whole model is read; skip the
            # edge checks, which the dropped nodes would trip first.
            ordered = nodes
        else:
            ordered = _topological(nodes, local, outer, proto.name)
        reads = {name for n in ordered for name in n.reads} | {o.name for o in outputs}
        outer_names = frozenset(n for n in reads if n not in local and n not in produced)
        for out in outputs:
            if not self.unsupported and out.name not in local | produced | outer:
                raise errors.ModelStructureError(
                    f"graph {proto.name!r}: output {out.name!r} is produced by no node, input or initializer"
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
        return sparse_to_numpy(sparse, self.base_dir, memory_limit=self.memory_limit)

    # -- nodes --------------------------------------------------------------------------

    def _expand(
        self,
        proto: onnx.NodeProto,
        name: str,
        opsets: Mapping[str, int],
        stack: tuple[FunctionKey, ...],
        top: bool = True,
    ) -> list[tuple[onnx.NodeProto, str, Mapping[str, int], tuple[FunctionKey, ...]]]:
        """``proto`` itself, or, for a call of a model-local function, its inlined body.

        Each item carries the opsets and the stack of function calls the node came from.
        ``top`` marks a node written in the graph itself (not one from an inlined body).
        """
        key = function_key(proto.domain, proto.op_type, proto.overload)
        function = self.functions.get(key)
        if function is None:
            return [(proto, name, opsets, stack)]
        check_recursion(stack, key, name)
        if len(stack) >= MAX_FUNCTION_DEPTH:
            raise errors.ModelStructureError(
                f"node {name!r}: model-local function calls are nested more than {MAX_FUNCTION_DEPTH} deep"
            )
        if top:
            # Count the nodes the whole call will inline before copying any: a function that
            # calls another twice, nested, doubles the count at each level.
            self._inlined += self._inlined_size(key, name, stack)
            if self._inlined > MAX_INLINED_NODES:
                raise errors.ModelStructureError(
                    f"inlining model-local functions (at node {name!r}) makes more than {MAX_INLINED_NODES} nodes"
                )
        body = inline_call(proto, function, name)
        inner = function_opsets(function, opsets)
        return [item for node in body for item in self._expand(node, node.name, inner, (*stack, key), top=False)]

    def _inlined_size(self, key: FunctionKey, node: str, stack: tuple[FunctionKey, ...]) -> int:
        """How many nodes a call of ``key`` inlines (its subgraphs' nodes not counted)."""
        if key in self._sizes:
            return self._sizes[key]
        check_recursion(stack, key, node)
        if len(stack) >= MAX_FUNCTION_DEPTH:
            raise errors.ModelStructureError(
                f"node {node!r}: model-local function calls are nested more than {MAX_FUNCTION_DEPTH} deep"
            )
        total = 0
        for inner in self.functions[key].node:
            callee = function_key(inner.domain, inner.op_type, inner.overload)
            if callee in self.functions:
                total += self._inlined_size(callee, node, (*stack, key))
            else:
                total += 1
            if total > MAX_INLINED_NODES:
                break  # the caller reports it; no need to count on
        self._sizes[key] = total
        return total

    def bind(self, proto: onnx.NodeProto) -> Node:
        """``proto`` bound to its implementation at this builder's opsets, attribute defaults
        included, exactly as loading binds a node: for graph passes that make new nodes.

        Raises:
            jonnx.errors.ModelStructureError: no implementation for the op at that opset.
        """
        node = self._node(proto, proto.name, frozenset(), self.opsets)
        if node is None:
            raise errors.ModelStructureError(
                f"node {proto.name!r}: no implementation of {proto.op_type} at opsets {self.opsets}"
            )
        return node

    def _node(
        self, proto: onnx.NodeProto, name: str, visible: frozenset[str], opsets: Mapping[str, int]
    ) -> Node | None:
        domain = normalize_domain(proto.domain)
        if domain == "com.microsoft" and domain not in opsets:
            # onnxruntime's transformers optimizer writes contrib nodes without importing
            # their domain, and onnxruntime runs such files; every contrib op is version 1.
            opsets = {**opsets, domain: 1}
        if domain not in opsets:
            raise errors.ModelStructureError(
                f"node {name!r} ({proto.op_type}) uses domain {domain or 'ai.onnx'!r}, which "
                "the model's opset_import does not list"
            )
        opset = opsets[domain]
        schema = schema_for(domain, proto.op_type, opset)
        if schema is not None:
            _check_counts(proto, name, schema)
        attrs = self._attributes(proto, name, schema, visible)
        op = lookup(domain, proto.op_type, opset)
        if op is None:
            self.unsupported.append((name, proto.op_type, domain, opset))
            return None
        if schema is None:
            attrs, unknown = op.with_declared_defaults(attrs)
            if unknown:
                raise errors.ModelStructureError(
                    f"node {name!r} ({proto.op_type}, domain {domain!r}) sets unknown attribute(s) "
                    f"{unknown}; {proto.op_type} takes {sorted(op.attributes)}"
                )
        if op.validate is not None:
            try:
                problem = op.validate(attrs, len(proto.input), len(proto.output))
            except Exception as e:  # noqa: BLE001 -- a validate hook tripping on odd attributes
                problem = f"invalid attributes ({type(e).__name__}: {e})"
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
            arity=arity(schema, op),
            float_groups=float_groups(schema, len(proto.input)),
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
            if attr.name in given:
                raise errors.ModelStructureError(f"node {name!r} ({proto.op_type}) sets attribute {attr.name!r} twice")
            spec = schema.attributes.get(attr.name) if schema is not None else None
            if schema is not None and spec is None:
                # Reported for the whole model at once (raise_if_unsupported); never read.
                self.unknown_attributes.append(
                    (name, proto.op_type, normalize_domain(schema.domain), schema.since_version, attr.name)
                )
                given.add(attr.name)
                continue
            if spec is not None and attr.type != spec.type and attr.type != _A.UNDEFINED:
                raise errors.ModelStructureError(
                    f"node {name!r} ({proto.op_type}, opset {schema.since_version}): attribute "
                    f"{attr.name!r} is {_A.AttributeType.Name(attr.type)} but the op takes "
                    f"{_A.AttributeType.Name(spec.type)}"
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
        return decode_attribute(
            attr,
            node,
            base_dir=self.base_dir,
            memory_limit=self.memory_limit,
            graph=lambda g: self.graph(g, visible),
        )


def _check_counts(proto: onnx.NodeProto, name: str, schema: onnx.defs.OpSchema) -> None:
    """The node's input and output counts (trailing empty names included, as ONNX counts them)
    must be within its schema's. A later version's extra input at an older opset (ReduceSum's
    ``axes``, Clip's bounds, Split's sizes, all attributes before) would otherwise be ignored:
    the model would run, reducing over every axis or splitting evenly, silently wrong."""
    for what, count, low, high in (
        ("inputs", len(proto.input), schema.min_input, schema.max_input),
        ("outputs", len(proto.output), schema.min_output, schema.max_output),
    ):
        if not low <= count <= high:
            takes = f"{low}" if low == high else f"{low} to {high}" if high < 2**31 - 1 else f"at least {low}"
            raise errors.ModelStructureError(
                f"node {name!r} ({proto.op_type}, opset {schema.since_version}) has {count} "
                f"{what[:-1] if count == 1 else what}; "
                f"{proto.op_type}-{schema.since_version} takes {takes}"
            )


def _check_opset(domain: str, version: int, where: str) -> None:
    if not 1 <= version <= _MAX_OPSET:
        raise errors.ModelStructureError(
            f"{where} imports domain {normalize_domain(domain) or 'ai.onnx'!r} at version {version}; "
            f"versions run from 1 to {_MAX_OPSET}"
        )


def check_text(message: Message, where: str) -> None:
    """Every string field of ``message``, nested ones included, must be text.

    ONNX's protos are proto2, whose parser keeps a string field that is not valid UTF-8 as
    ``bytes``; names, op types and domains must be ``str`` for everything downstream.

    Raises:
        jonnx.errors.LoadError: naming the field path, e.g. ``graph.node[3].op_type``.
    """
    stack = [(message, where)]
    while stack:
        msg, path = stack.pop()
        for field, value in msg.ListFields():
            here = f"{path}.{field.name}"
            repeated = field_is_repeated(field)
            if field.type == field.TYPE_STRING:
                for i, text in enumerate(value if repeated else (value,)):
                    if not isinstance(text, str):
                        at = f"{here}[{i}]" if repeated else here
                        raise errors.LoadError(f"{at} is not valid UTF-8 text: {bytes(text)[:60]!r}")
            elif field.type == field.TYPE_MESSAGE:
                if repeated:
                    stack.extend((m, f"{here}[{i}]") for i, m in enumerate(value))
                else:
                    stack.append((value, here))


def field_is_repeated(field: Any) -> bool:
    # protobuf >= 5 has ``is_repeated``; older releases only ``label``.
    is_repeated = getattr(field, "is_repeated", None)
    return bool(is_repeated) if is_repeated is not None else field.label == field.LABEL_REPEATED


def _unique(name: str, seen: Collection[str], graph: str, what: str) -> None:
    if name in seen:
        raise errors.ModelStructureError(f"graph {graph!r}: {what} {name!r} is listed twice")


def _topological(nodes: list[Node], local: frozenset[str], outer: frozenset[str], graph: str) -> list[Node]:
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
        for name in sorted(node.reads):
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
        raise errors.ModelStructureError(f"graph {graph!r} has a cycle through node(s) {stuck[:10]}")
    return [nodes[i] for i in order]

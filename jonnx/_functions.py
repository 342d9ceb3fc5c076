"""Model-local functions (``ModelProto.functions``), inlined at load time.

A call node is replaced by the function body: body values are renamed under the call node's
name, formal inputs and outputs become the call's actual ones, and attribute references
(``ref_attr_name``) take the call's attribute or else the function's default. Inlining keeps one
flat graph, so static analysis, folding and graph passes see through function boundaries, and
the cost is the same as if the body had been written out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import onnx

from jonnx import errors
from jonnx._attributes import attribute_graphs
from jonnx._registry import normalize_domain

__all__ = ["FunctionKey", "check_recursion", "function_key", "function_opsets", "inline_call"]

FunctionKey = tuple[str, str, str]  # (domain, name, overload)


def function_key(domain: str, name: str, overload: str = "") -> FunctionKey:
    return (normalize_domain(domain), name, overload)


def _attribute_values(call: onnx.NodeProto, function: onnx.FunctionProto) -> dict[str, onnx.AttributeProto]:
    """What each of the function's attributes is bound to for this call."""
    bound = {a.name: a for a in function.attribute_proto}  # defaults
    bound.update({a.name: a for a in call.attribute})
    return bound


def _substitute(node: onnx.NodeProto, bound: Mapping[str, onnx.AttributeProto], rename: Callable[[str], str]) -> None:
    """Resolve attribute references and rename outer names inside ``node``'s subgraphs, in place."""
    kept = []
    for attr in node.attribute:
        if attr.ref_attr_name:
            value = bound.get(attr.ref_attr_name)
            if value is None:
                continue  # an optional attribute the call did not set
            resolved = onnx.AttributeProto()
            resolved.CopyFrom(value)
            resolved.name = attr.name
            kept.append(resolved)
            continue
        for g in attribute_graphs(attr):
            _rename_graph(g, bound, rename)
        kept.append(attr)
    del node.attribute[:]
    node.attribute.extend(kept)


def _rename_graph(g: onnx.GraphProto, bound: Mapping[str, onnx.AttributeProto], rename: Callable[[str], str]) -> None:
    """Rename the names ``g`` reads from enclosing scopes (its own names stay), in place."""
    local = {v.name for v in g.input} | {t.name for t in g.initializer}
    local |= {out for n in g.node for out in n.output}

    def inner(name: str) -> str:
        return name if name in local else rename(name)

    for node in g.node:
        for i, name in enumerate(node.input):
            if name:
                node.input[i] = inner(name)
        _substitute(node, bound, inner)
    for out in g.output:
        out.name = inner(out.name)


def inline_call(call: onnx.NodeProto, function: onnx.FunctionProto, call_name: str) -> list[onnx.NodeProto]:
    """The body of ``function`` as nodes of the caller's graph, for the call node ``call``.

    Raises:
        jonnx.errors.ModelStructureError: the call passes more inputs or asks for more outputs
            than the function declares.
    """
    where = f"node {call_name!r} calls function {function.domain}:{function.name}"
    if len(call.input) > len(function.input):
        raise errors.ModelStructureError(f"{where} with {len(call.input)} inputs, but it takes {len(function.input)}")
    if len(call.output) > len(function.output):
        raise errors.ModelStructureError(f"{where} for {len(call.output)} outputs, but it gives {len(function.output)}")
    # Formal inputs the call omits are absent (""); outputs it omits keep a private name, as
    # the body may still read them.
    inputs = {formal: (call.input[i] if i < len(call.input) else "") for i, formal in enumerate(function.input)}
    outputs = {
        formal: call.output[i] for i, formal in enumerate(function.output) if i < len(call.output) and call.output[i]
    }
    prefix = f"{call_name}/"

    def rename(name: str) -> str:
        if not name:
            return name
        if name in outputs:
            return outputs[name]
        if name in inputs:
            return inputs[name]
        return prefix + name

    bound = _attribute_values(call, function)
    body: list[onnx.NodeProto] = []
    for index, node in enumerate(function.node):
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.name = prefix + (node.name or f"{node.op_type}_{index}")
        for i, name in enumerate(copy.input):
            copy.input[i] = rename(name)
        for i, name in enumerate(copy.output):
            copy.output[i] = rename(name)
        _substitute(copy, bound, rename)
        body.append(copy)
    return body


def function_opsets(function: onnx.FunctionProto, caller: Mapping[str, int]) -> dict[str, int]:
    """The opsets the body runs with: the function's own imports, else the caller's."""
    opsets = dict(caller)
    opsets.update({normalize_domain(o.domain): int(o.version) for o in function.opset_import})
    return opsets


def check_recursion(stack: Sequence[FunctionKey], key: FunctionKey, node: str) -> None:
    if key in stack:
        chain = " -> ".join(f"{d}:{n}" for d, n, _ in (*stack, key))
        raise errors.ModelStructureError(f"node {node!r}: model-local functions call themselves: {chain}")

"""Small models built with onnx.helper, shared by the security tests."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh

FLOAT = onnx.TensorProto.FLOAT
OPSET = 18
FN_DOMAIN = "test.security"


def vi(name: str, shape=(4,), elem: int = FLOAT) -> onnx.ValueInfoProto:
    return oh.make_tensor_value_info(name, elem, list(shape) if shape is not None else None)


def graph(nodes, *, inits=(), sparse=(), inputs=None, outputs=None, name="g") -> onnx.GraphProto:
    return oh.make_graph(
        list(nodes),
        name,
        [vi("x")] if inputs is None else list(inputs),
        [vi("y")] if outputs is None else list(outputs),
        initializer=list(inits),
        sparse_initializer=list(sparse),
    )


def model(g: onnx.GraphProto, *, functions=(), opsets=None) -> onnx.ModelProto:
    opsets = opsets or [oh.make_opsetid("", OPSET), oh.make_opsetid(FN_DOMAIN, 1)]
    m = oh.make_model(g, opset_imports=opsets, functions=list(functions))
    m.ir_version = 10
    return m


def add_model(w: onnx.TensorProto | None = None) -> onnx.ModelProto:
    """y = x + w, with ``w`` an initializer (4 floats unless given)."""
    w = w if w is not None else onh.from_array(np.arange(4, dtype=np.float32), "w")
    return model(graph([oh.make_node("Add", ["x", w.name], ["y"], name="add")], inits=[w]))


def const(name: str, value: np.ndarray, out: str | None = None, node: str | None = None) -> onnx.NodeProto:
    return oh.make_node(
        "Constant", [], [out or name], name=node or f"const_{name}", value=onh.from_array(np.asarray(value), name)
    )


def const_tensor_node(tensor: onnx.TensorProto, out: str, node: str) -> onnx.NodeProto:
    return oh.make_node("Constant", [], [out], name=node, value=tensor)


def external(
    name: str,
    location: str,
    *,
    offset: int | str | None = 0,
    length: int | str | None = 16,
    dims=(4,),
    elem: int = FLOAT,
    extra=(),
) -> onnx.TensorProto:
    """A tensor whose data lives in ``location`` (relative to the model's folder)."""
    t = onnx.TensorProto(name=name, data_type=elem, dims=list(dims))
    t.data_location = onnx.TensorProto.EXTERNAL
    entries = [("location", location)]
    if offset is not None:
        entries.append(("offset", str(offset)))
    if length is not None:
        entries.append(("length", str(length)))
    for k, v in (*entries, *extra):
        t.external_data.add(key=k, value=v)
    return t


def branch(nodes, out: str, name: str, inits=()) -> onnx.GraphProto:
    return oh.make_graph(list(nodes), name, [], [vi(out)], initializer=list(inits))


def if_model(
    then: onnx.GraphProto, other: onnx.GraphProto | None = None, *, outputs=("y",), node="if_node", functions=()
) -> onnx.ModelProto:
    """An If on a constant condition, with ``then`` and ``other`` as branches."""
    other = other if other is not None else branch([oh.make_node("Identity", ["x"], ["e"])], "e", "else")
    nodes = [
        const("cond", np.array(True)),
        oh.make_node("If", ["cond"], list(outputs), name=node, then_branch=then, else_branch=other),
    ]
    return model(graph(nodes, outputs=[vi(o) for o in outputs]), functions=functions)


def function(name: str, nodes, inputs=("a",), outputs=("b",), domain: str = FN_DOMAIN) -> onnx.FunctionProto:
    return oh.make_function(
        domain,
        name,
        list(inputs),
        list(outputs),
        list(nodes),
        opset_imports=[oh.make_opsetid("", OPSET), oh.make_opsetid(FN_DOMAIN, 1)],
    )


def call(name: str, inputs=("x",), outputs=("y",), node: str | None = None) -> onnx.NodeProto:
    return oh.make_node(name, list(inputs), list(outputs), domain=FN_DOMAIN, name=node or f"call_{name}")


def nested_ifs(depth: int) -> onnx.ModelProto:
    """``depth`` Ifs nested in their then-branches, built in place (no copies: protobuf's
    serializer refuses messages nested this deep, but an in-memory proto holds them)."""
    m = model(graph([]))
    g = m.graph
    for level in range(depth):
        out = "y" if level == 0 else f"o{level}"
        c = g.node.add()
        c.CopyFrom(const(f"c{level}", np.array(True), node=f"cond_{level}"))
        node = g.node.add()
        node.op_type, node.name = "If", f"if_{level}"
        node.input.append(f"c{level}")
        node.output.append(out)
        attr = node.attribute.add()
        attr.name, attr.type = "then_branch", onnx.AttributeProto.GRAPH
        other = node.attribute.add()
        other.CopyFrom(oh.make_attribute("else_branch", branch([oh.make_node("Identity", ["x"], ["e"])], "e", "e")))
        g = attr.g
        g.name = f"then_{level}"
        g.output.add().CopyFrom(vi(f"o{level + 1}"))
    g.node.add().CopyFrom(oh.make_node("Neg", ["x"], [f"o{depth}"]))
    return m


def doubling_functions(levels: int) -> list[onnx.FunctionProto]:
    """F0 calls F1 twice, F1 calls F2 twice, ...: 2**levels nodes once inlined."""
    fs = []
    for i in range(levels):
        body = [call(f"F{i + 1}", ["a"], ["t"], node="first"), call(f"F{i + 1}", ["t"], ["b"], node="second")]
        fs.append(function(f"F{i}", body))
    fs.append(function(f"F{levels}", [oh.make_node("Neg", ["a"], ["b"])]))
    return fs


def chain_functions(depth: int) -> list[onnx.FunctionProto]:
    """F0 calls F1 calls ... F{depth}, which negates."""
    fs = [function(f"F{i}", [call(f"F{i + 1}", ["a"], ["b"])]) for i in range(depth)]
    fs.append(function(f"F{depth}", [oh.make_node("Neg", ["a"], ["b"])]))
    return fs

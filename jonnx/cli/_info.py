"""``jonnx info``: what is inside a model file, read from the protobuf alone.

Nothing is bound or traced and external data is not read, so ``info`` describes models that
jonnx cannot run too (``jonnx check`` says whether it can).
"""

from __future__ import annotations

import argparse
import collections
import math
from typing import Any, TextIO

import onnx

from jonnx._attributes import attribute_graphs
from jonnx.cli._common import human_bytes, show_shape, table

_FLOAT_TYPES = {
    onnx.TensorProto.FLOAT,
    onnx.TensorProto.FLOAT16,
    onnx.TensorProto.DOUBLE,
    onnx.TensorProto.BFLOAT16,
}


def run(args: argparse.Namespace) -> tuple[dict, int]:
    from jonnx._build import value_info
    from jonnx._model import parse_model

    with open(args.model, "rb") as f:
        proto = parse_model(f.read(), repr(args.model))

    ops: collections.Counter = collections.Counter()
    subgraphs: list[dict] = []
    _walk(proto.graph, ops, subgraphs, path="")
    functions = []
    for f in proto.functions:
        fops: collections.Counter = collections.Counter()
        _walk_nodes(f.node, fops, subgraphs, path=f"function {f.domain}:{f.name}/")
        # Not added to the histogram: a function's nodes run where it is called.
        functions.append(
            {
                "domain": f.domain,
                "name": f.name,
                "nodes": len(f.node),
                "ops": sorted({op for _, op in fops}),
            }
        )

    tensors = _initializers(proto.graph)
    external = [t for t in tensors if t["external"]]
    params = [t for t in tensors if t["float"]]
    declared = {t.name for t in proto.graph.initializer}
    report = {
        "model": args.model,
        "producer": f"{proto.producer_name} {proto.producer_version}".strip(),
        "ir_version": proto.ir_version,
        "opsets": {o.domain or "ai.onnx": o.version for o in proto.opset_import},
        "graph": proto.graph.name,
        "doc": proto.doc_string.strip().splitlines()[0] if proto.doc_string.strip() else "",
        "inputs": [_describe(value_info(v)) for v in proto.graph.input if v.name not in declared],
        "outputs": [_describe(value_info(v)) for v in proto.graph.output],
        "nodes": len(proto.graph.node),
        "initializers": {
            "count": len(tensors),
            "values": sum(t["values"] for t in tensors),
            "bytes": sum(t["bytes"] for t in tensors),
        },
        "parameters": {
            "count": len(params),
            "values": sum(t["values"] for t in params),
            "bytes": sum(t["bytes"] for t in params),
        },
        "ops": [
            {"domain": d or "ai.onnx", "op": op, "count": n}
            for (d, op), n in sorted(ops.items(), key=lambda kv: (-kv[1], kv[0]))
        ],
        "subgraphs": subgraphs,
        "functions": functions,
        "external_data": {
            "tensors": len(external),
            "bytes": sum(t["bytes"] for t in external),
            "files": sorted({t["external"] for t in external}),
        },
    }
    if args.top:
        report["ops"] = report["ops"][: args.top]
    return report, 0


def _describe(info: Any) -> dict:
    dtype = str(info.dtype) if info.dtype is not None else info.kind
    return {
        "name": info.name,
        "dtype": dtype,
        "shape": None if info.shape is None else list(info.shape),
    }


def _walk(graph: onnx.GraphProto, ops: collections.Counter, subgraphs: list, path: str) -> None:
    _walk_nodes(graph.node, ops, subgraphs, path)


def _walk_nodes(nodes: Any, ops: collections.Counter, subgraphs: list, path: str) -> None:
    for index, node in enumerate(nodes):
        ops[(node.domain if node.domain != "ai.onnx" else "", node.op_type)] += 1
        for attr in node.attribute:
            for g in attribute_graphs(attr):
                name = node.name or f"{node.op_type}_{index}"
                subgraphs.append(
                    {
                        "node": f"{path}{name}",
                        "op": node.op_type,
                        "attribute": attr.name,
                        "nodes": len(g.node),
                    }
                )
                _walk(g, ops, subgraphs, f"{path}{name}/{attr.name}/")


def _initializers(graph: onnx.GraphProto) -> list[dict]:
    found = []
    for t in list(graph.initializer) + [s.values for s in graph.sparse_initializer]:
        values = math.prod(t.dims)
        try:
            itemsize = onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
        except (KeyError, TypeError, ValueError):
            itemsize = 0
        location = None
        if t.data_location == onnx.TensorProto.EXTERNAL:
            location = next((e.value for e in t.external_data if e.key == "location"), "?")
        found.append(
            {
                "name": t.name,
                "values": values,
                "bytes": values * itemsize,
                "float": t.data_type in _FLOAT_TYPES,
                "external": location,
            }
        )
    return found


def render(report: dict, out: TextIO) -> None:
    out.write(f"{report['model']}\n")
    out.write(f"  producer      {report['producer'] or '(not set)'}\n")
    opsets = ", ".join(f"{d} {v}" for d, v in report["opsets"].items())
    out.write(f"  IR version    {report['ir_version']}    opsets: {opsets}\n")
    if report["doc"]:
        out.write(f"  doc           {report['doc']}\n")
    p, i = report["parameters"], report["initializers"]
    out.write(
        f"  parameters    {p['values']:,} values in {p['count']} float tensors ({human_bytes(p['bytes'])}); "
        f"{i['count']} initializers, {human_bytes(i['bytes'])} in all\n"
    )
    out.write(f"  nodes         {report['nodes']} in the main graph\n")
    for what in ("inputs", "outputs"):
        out.write(f"{what}:\n")
        table(
            [(v["name"], v["dtype"], show_shape(v["shape"])) for v in report[what]],
            ["name", "dtype", "shape"],
            out,
        )
    out.write("ops (main graph and subgraphs):\n")
    table(
        [(o["op"], o["domain"], o["count"]) for o in report["ops"]],
        ["op", "domain", "count"],
        out,
    )
    if report["subgraphs"]:
        out.write("subgraphs:\n")
        table(
            [(s["node"], s["op"], s["attribute"], s["nodes"]) for s in report["subgraphs"]],
            ["node", "op", "attribute", "nodes"],
            out,
        )
    if report["functions"]:
        out.write("model-local functions (inlined by jonnx at load):\n")
        table(
            [(f["domain"], f["name"], f["nodes"], " ".join(f["ops"])) for f in report["functions"]],
            ["domain", "name", "nodes", "ops"],
            out,
        )
    ext = report["external_data"]
    if ext["tensors"]:
        out.write(
            f"external data: {ext['tensors']} tensors, {human_bytes(ext['bytes'])} in {', '.join(ext['files'])}\n"
        )
    else:
        out.write("external data: none\n")

"""``jonnx check``: can jonnx run this model?

Loads it (every unsupported node is reported at once), lists the inputs that must be known at
trace time and the nodes whose trace-time inputs depend on runtime data, and traces the model
abstractly (``jax.eval_shape``: nothing is computed or allocated) at its declared shapes.
"""

from __future__ import annotations

import argparse
import warnings
from typing import Any, TextIO

from jonnx.cli._common import concrete_shape, load_inputs, parse_dims, show_shape, table


def run(args: argparse.Namespace) -> tuple[dict, int]:
    import jax

    import jonnx
    from jonnx import errors

    report: dict[str, Any] = {
        "model": args.model,
        "ok": False,
        "unsupported": [],
        "static_inputs": [],
        "data_dependent": [],
        "trace": None,
        "warnings": [],
    }
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = jonnx.load(args.model)
    except errors.UnsupportedOpError as e:
        report["unsupported"] = [
            {"node": node, "op": op, "domain": domain or "ai.onnx", "opset": opset}
            for node, op, domain, opset in e.nodes
        ]
        report["error"] = str(e).splitlines()[0]
        return report, 1
    report["warnings"] += [str(w.message) for w in caught]

    dims = parse_dims(args.dim)
    report["static_inputs"] = _static_requirements(model)
    report["data_dependent"] = _data_dependent(model)
    given = load_inputs(args.input, model.input_names)
    missing_static = [n for n in model.static_input_names if n not in given]
    if missing_static:
        report["trace"] = {
            "status": "skipped",
            "reason": f"input(s) {missing_static} must be known at trace time: give them with --input to trace",
        }
        report["ok"] = True
        return report, 0

    # Static inputs are concrete (as Model.__call__ passes them); the rest are abstract.
    abstract = {}
    for info in model.graph.inputs:
        if info.name in given:
            continue
        if info.kind != "tensor" or info.dtype is None or info.shape is None:
            report["trace"] = {
                "status": "skipped",
                "reason": f"input {info.name!r} has no declared tensor shape: give it with --input to trace",
            }
            report["ok"] = True
            return report, 0
        abstract[info.name] = jax.ShapeDtypeStruct(concrete_shape(info, dims), info.dtype)
    static = {n: v for n, v in given.items() if n in model.static_input_names}
    dynamic_given = {n: v for n, v in given.items() if n not in static}

    def trace(params: Any, inputs: dict) -> Any:
        outputs, _ = model.apply_with_state(params, **inputs, **static)
        return outputs

    shapes = {n: concrete_shape(v, dims) for v in model.graph.inputs for n in [v.name] if v.shape is not None}
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = jax.eval_shape(trace, model.params, {**abstract, **dynamic_given})
    except errors.JonnxError as e:
        report["trace"] = {"status": "failed", "error": str(e), "input_shapes": shapes}
        report["error"] = str(e)
        return report, 1
    report["warnings"] += [str(w.message) for w in caught]
    report["trace"] = {
        "status": "ok",
        "input_shapes": shapes,
        "outputs": [
            {
                "name": name,
                "dtype": str(getattr(o, "dtype", type(o).__name__)),
                "shape": list(getattr(o, "shape", ())),
            }
            for name, o in zip(model.output_names, out)
        ],
    }
    report["ok"] = True
    return report, 0


def _static_requirements(model: Any) -> list[dict]:
    """Each static graph input and the nodes that need it at trace time."""
    found = []
    for name in model.static_input_names:
        users = sorted({f"{n.op_type} {n.name!r}" for n in _static_users(model.graph, name)})
        found.append({"input": name, "needed_by": users})
    return found


def _static_users(graph: Any, source: str) -> list[Any]:
    """Nodes with a trace-time input that ``source`` reaches (through non-shape-only nodes)."""
    reached, frontier = {source}, [source]
    readers: dict[str, list] = {}
    for node in graph.nodes:
        for i in node.inputs:
            readers.setdefault(i, []).append(node)
    while frontier:
        value = frontier.pop()
        for node in readers.get(value, []):
            if node.op.shape_only:
                continue
            for out in node.outputs:
                if out and out not in reached:
                    reached.add(out)
                    frontier.append(out)
    users = []
    for node in graph.nodes:
        if any(i < len(node.inputs) and node.inputs[i] in reached for i in node.static_inputs):
            users.append(node)
    return users


def _data_dependent(model: Any) -> list[dict]:
    """Nodes that need values computed from a graph input at trace time (not only its shape).

    ``Model.__call__`` makes those inputs static arguments of ``jax.jit``: one compilation per
    distinct value. Under your own ``jax.jit`` they raise ``StaticValueError``.
    """
    found: dict[str, dict] = {}
    for name in model.static_input_names:
        for node in _static_users(model.graph, name):
            entry = found.setdefault(node.name, {"node": node.name, "op": node.op_type, "inputs": []})
            entry["inputs"].append(name)
    return list(found.values())


def render(report: dict, out: TextIO) -> None:
    out.write(f"{report['model']}: {'OK, jonnx can run it' if report['ok'] else 'PROBLEMS'}\n")
    if report["unsupported"]:
        out.write(f"unsupported operators ({len(report['unsupported'])} nodes):\n")
        table(
            [(u["node"], u["op"], u["domain"], u["opset"]) for u in report["unsupported"]],
            ["node", "op", "domain", "opset"],
            out,
        )
        out.write("  Register your own with @jonnx.register(op_type, since=..., domain=...).\n")
        return
    if report["static_inputs"]:
        out.write("inputs that must be known at trace time (Model.__call__ passes them to jax.jit as static):\n")
        out.writelines(
            f"  {s['input']}: needed by {', '.join(s['needed_by']) or 'control flow'}\n"
            for s in report["static_inputs"]
        )
    else:
        out.write("static inputs: none (every input may be traced)\n")
    if report["data_dependent"]:
        out.write(
            "data-dependent nodes (need values of these inputs at trace time: jonnx compiles once per "
            "distinct value;\n  under your own jax.jit, pass them as static arguments):\n"
        )
        table(
            [(d["node"], d["op"], ", ".join(d["inputs"])) for d in report["data_dependent"]],
            ["node", "op", "inputs"],
            out,
        )
    trace = report["trace"] or {}
    if trace.get("status") == "ok":
        shapes = ", ".join(f"{n} {show_shape(s)}" for n, s in trace["input_shapes"].items())
        out.write(f"traced at {shapes}:\n")
        table(
            [(o["name"], o["dtype"], show_shape(o["shape"])) for o in trace["outputs"]],
            ["output", "dtype", "shape"],
            out,
        )
    elif trace.get("status") == "skipped":
        out.write(f"trace skipped: {trace['reason']}\n")
    elif trace.get("status") == "failed":
        out.write(f"trace failed: {trace['error']}\n")
    out.writelines(f"warning: {w}\n" for w in report["warnings"])

"""Run giant-allocation models under a small memory_limit and report peak RSS (a subprocess of
test_memory_bound.py, so that ru_maxrss measures these loads alone).

Prints one JSON object: per case, the error's class and message and the peak RSS growth.
"""

from __future__ import annotations

import json
import resource
import sys

import numpy as np
import onnx
import onnx.helper as oh

import jonnx
from tests.security._models import const, graph, model, vi

LIMIT = 16 << 20  # 16 MiB


def _rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def build(op: str, n: int, folded: bool) -> tuple[onnx.ModelProto, list[np.ndarray]]:
    """A model whose ``op`` node (named "giant") makes about ``n`` float32 values.

    ``folded``: its data input is a Constant, so the node runs at trace time (numpy);
    otherwise it is the graph input ``x``, traced under jit.
    """
    side = int(np.sqrt(n))
    F = onnx.TensorProto.FLOAT
    if op == "ConstantOfShape":
        nodes = [
            const("shape", np.array([side, side], np.int64)),
            oh.make_node(
                "ConstantOfShape",
                ["shape"],
                ["big"],
                name="giant",
                value=onnx.numpy_helper.from_array(np.array([1.0], np.float32)),
            ),
        ]
        data_shape = [1]
    elif op == "Expand":
        nodes = [
            const("shape", np.array([side, side], np.int64)),
            oh.make_node("Expand", ["data", "shape"], ["big"], name="giant"),
        ]
        data_shape = [1]
    elif op == "Tile":
        nodes = [
            const("reps", np.array([n // 4], np.int64)),
            oh.make_node("Tile", ["data", "reps"], ["big"], name="giant"),
        ]
        data_shape = [4]
    elif op == "Range":
        nodes = [
            const("start", np.array(0, np.float32)),
            const("limit", np.array(n, np.float32)),
            const("delta", np.array(1, np.float32)),
            oh.make_node("Range", ["start", "limit", "delta"], ["r"], name="giant"),
            oh.make_node("ReduceMax", ["r"], ["m"], keepdims=1),
            oh.make_node("Mul", ["m", "data"], ["big"]),
        ]
        data_shape = [1]
    elif op == "Resize":
        scale = float(np.sqrt(n) / 2)
        nodes = [
            const("scales", np.array([1, 1, scale, scale], np.float32)),
            oh.make_node("Resize", ["data", "", "scales"], ["big"], name="giant", mode="nearest"),
        ]
        data_shape = [1, 1, 2, 2]
    elif op == "Pad":
        nodes = [
            const("pads", np.array([0, n], np.int64)),
            oh.make_node("Pad", ["data", "pads"], ["big"], name="giant"),
        ]
        data_shape = [1]
    else:
        raise ValueError(op)
    nodes.append(oh.make_node("ReduceSum", ["big"], ["y"], keepdims=0))
    if folded:
        nodes.insert(0, const("data", np.ones(data_shape, np.float32)))
        inputs = [vi("x", [1])]
        nodes.append(oh.make_node("Identity", ["x"], ["unused"]))
    else:
        nodes = [oh.make_node("Identity", ["x"], ["data"])] + nodes
        inputs = [vi("x", data_shape)]
    g = graph(nodes, inputs=inputs, outputs=[vi("y", [] if op != "Range" else [1], F)])
    return model(g), [np.ones([1] if folded else data_shape, np.float32)]


# Range last: its inputs are all static, so it always runs at trace time (no traced mode),
# and it allocates before the check (ru_maxrss, a high-water mark, would hide later cases).
OPS = ["ConstantOfShape", "Expand", "Tile", "Resize", "Pad", "Range"]


def modes(op: str) -> tuple[bool, ...]:
    """folded=True/False runs of ``op``."""
    return (True,) if op == "Range" else (True, False)


def main(requested: int, small: dict[str, int]) -> None:
    results = {}
    # Warm up: every model once at a legal size, so compilation is in the baseline.
    for op in OPS:
        for folded in modes(op):
            m, args = build(op, 1 << 10, folded)
            jonnx.load(m, memory_limit=LIMIT)(*args)
    for op in OPS:
        for folded in modes(op):
            m, args = build(op, small.get(op, requested) // 4, folded)
            before = _rss()
            try:
                jonnx.load(m, memory_limit=LIMIT)(*args)
                outcome = ("ok", "")
            except Exception as e:  # noqa: BLE001 -- reported to the test, which judges
                outcome = (type(e).__name__, str(e))
            results[f"{op}-{'folded' if folded else 'traced'}"] = {
                "error": outcome[0],
                "message": outcome[1],
                "rss_before": before,
                "rss_growth": _rss() - before,
            }
    print(json.dumps({"limit": LIMIT, "cases": results}))


if __name__ == "__main__":
    # argv: the bytes each giant node asks for, then OP=BYTES overrides (for ops known to
    # allocate before the check, so that a run stays affordable).
    main(int(sys.argv[1]), {k: int(v) for k, v in (a.split("=") for a in sys.argv[2:])})

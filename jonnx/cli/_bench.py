"""``jonnx bench``: load, compile and steady-state times, jonnx and onnxruntime side by side.

What is timed is the default call (``jonnx.load`` then ``Model(*inputs)``), as the project's
benchmarks do. Steady-state calls of the two runtimes alternate in one process, so a change in
machine load hits both; the figures are medians.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any, TextIO

import numpy as np

from jonnx.cli._common import (
    UsageError,
    onnxruntime_feed,
    onnxruntime_session,
    parse_dims,
    random_inputs,
    table,
)

#: Steady-state calls stop after about this long per batch size (within the bounds below).
BUDGET_SECONDS = 2.0
MIN_CALLS, MAX_CALLS = 5, 200


def run(args: argparse.Namespace) -> tuple[dict, int]:
    import jax

    import jonnx

    batches = _batches(args.batch)
    dims = parse_dims(args.dim)
    jax.devices()  # starting JAX's backend is not part of loading a model
    start = time.perf_counter()
    model = jonnx.load(args.model)
    load_jonnx = time.perf_counter() - start
    if model.static_input_names:
        raise UsageError(
            f"inputs {list(model.static_input_names)} must be known at trace time; bench makes random "
            "inputs only: time this model from Python (see benchmarks/)"
        )
    report: dict[str, Any] = {
        "model": args.model,
        "load": {"jonnx": load_jonnx},
        "batches": [],
    }
    session = None
    if args.compare:
        start = time.perf_counter()
        session = onnxruntime_session(args.model)
        report["load"]["onnxruntime"] = time.perf_counter() - start

    rng = np.random.default_rng(args.seed)
    for batch in batches:
        inputs = random_inputs(model.graph, dims, rng, model.input_names, batch=batch)
        runners: dict[str, Callable[[], Any]] = {"jonnx": _jonnx_runner(model, inputs)}
        if session is not None:
            feed = onnxruntime_feed(model, inputs)
            runners["onnxruntime"] = lambda feed=feed: session.run(None, feed)
        entry: dict[str, Any] = {
            "batch": batch,
            "shapes": {n: list(v.shape) for n, v in inputs.items()},
        }
        entry["first_call"] = {name: _time(fn) for name, fn in runners.items()}
        entry["steady"] = _steady(runners, args.repeat)
        report["batches"].append(entry)
    return report, 0


def _batches(text: str) -> list[int]:
    try:
        batches = [int(b) for b in text.split(",") if b.strip()]
    except ValueError:
        batches = []
    if not batches or any(b < 1 for b in batches):
        raise UsageError(f"--batch {text!r}: expected positive integers separated by commas, e.g. 1,32")
    return batches


def _jonnx_runner(model: Any, inputs: dict) -> Callable[[], Any]:
    import jax

    def call() -> Any:
        return jax.block_until_ready(model(**inputs))

    return call


def _time(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _steady(runners: dict[str, Callable[[], Any]], repeat: int) -> dict[str, dict]:
    times: dict[str, list[float]] = {name: [] for name in runners}
    deadline = time.perf_counter() + BUDGET_SECONDS
    calls = 0
    while True:
        for (
            name,
            fn,
        ) in runners.items():  # alternating: a change in load hits every runtime
            times[name].append(_time(fn))
        calls += 1
        if repeat and calls >= repeat:
            break
        if not repeat and (calls >= MAX_CALLS or (calls >= MIN_CALLS and time.perf_counter() > deadline)):
            break
    return {name: {"median": statistics.median(t), "min": min(t), "calls": len(t)} for name, t in times.items()}


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms" if seconds < 1 else f"{seconds:.2f} s"


def render(report: dict, out: TextIO) -> None:
    runtimes = list(report["load"])
    out.write(f"{report['model']}\n")
    timed = [("load", report["load"])]
    for b in report["batches"]:
        shapes = ", ".join(f"{n} {s}" for n, s in b["shapes"].items())
        out.write(f"  batch {b['batch']}: {shapes}\n")
        timed.append((f"batch {b['batch']}: first call", b["first_call"]))
        timed.append(
            (
                f"batch {b['batch']}: steady (median)",
                {r: t["median"] for r, t in b["steady"].items()},
            )
        )
    headers = ["", *runtimes]
    rows = [[label, *(_ms(t[r]) for r in runtimes)] for label, t in timed]
    if len(runtimes) == 2:
        headers.append("jonnx / onnxruntime")
        for row, (_, t) in zip(rows, timed):
            row.append(f"{t['jonnx'] / t['onnxruntime']:.2f}x")
    table(rows, headers, out)
    out.write(
        "  load: jonnx.load; onnxruntime's InferenceSession.\n"
        "  first call: jonnx traces and compiles (once per input shape); onnxruntime's first run.\n"
    )

"""``jonnx bench``: load, compile and steady-state times, jonnx and onnxruntime side by side.

What is timed is the default call (``jonnx.load`` then ``Model(*inputs)``), as the project's
benchmarks do. Steady-state calls of the two runtimes alternate in one process, so a change in
machine load hits both; the figures are medians. On Unix it also counts each call's minor page
faults: XLA's CPU runtime maps a call's temporaries afresh when they are large, and first
touching that memory can cost more than the computation it holds (see :data:`FAULT_HINT_MIN`).
"""

from __future__ import annotations

import argparse
import os
import platform
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

try:
    import resource  # Unix only
except ImportError:  # pragma: no cover - Windows
    resource = None

#: Steady-state calls stop after about this long per batch size (within the bounds below).
BUDGET_SECONDS = 2.0
MIN_CALLS, MAX_CALLS = 5, 200
#: A jonnx call taking at least this many minor page faults (8 MiB of fresh 4 KiB pages) gets the
#: hint on glibc's tunable: XLA maps temporaries above glibc's mmap threshold (32 MiB at most)
#: anew on every call, and in a VM each first touch of a page costs 1-2 us (MobileNetV2 at batch
#: 32 on a Zen 5: 49,000 faults and 70 ms of system time a call, 150 -> 98 ms with the tunable;
#: docs/performance.md, "Large batches").
FAULT_HINT_MIN = 2048
HUGE_PAGES_TUNABLE = "glibc.malloc.hugetlb=1"


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
        # By position: an input may be named like one of the call's keywords (key, params, state, train).
        return jax.block_until_ready(model(*inputs.values()))

    return call


def _time(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _minor_faults() -> int | None:
    """The process's minor page faults so far (every thread's), or None where unknown."""
    return None if resource is None else resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _steady(runners: dict[str, Callable[[], Any]], repeat: int) -> dict[str, dict]:
    times: dict[str, list[float]] = {name: [] for name in runners}
    faults: dict[str, list[int]] = {name: [] for name in runners}
    deadline = time.perf_counter() + BUDGET_SECONDS
    calls = 0
    while True:
        for name, fn in runners.items():  # alternating: a change in load hits every runtime
            before = _minor_faults()
            times[name].append(_time(fn))
            if before is not None:
                faults[name].append(_minor_faults() - before)
        calls += 1
        if repeat and calls >= repeat:
            break
        if not repeat and (calls >= MAX_CALLS or (calls >= MIN_CALLS and time.perf_counter() > deadline)):
            break
    return {
        name: {
            "median": statistics.median(t),
            "min": min(t),
            "calls": len(t),
            "page_faults": round(statistics.median(faults[name])) if faults[name] else None,
        }
        for name, t in times.items()
    }


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
    for b in report["batches"]:
        counted = {r: s.get("page_faults") for r, s in b["steady"].items()}
        if all(n is not None for n in counted.values()):
            row = [f"batch {b['batch']}: page faults a call", *(f"{counted[r]:,}" for r in runtimes)]
            rows.append(row + [""] * (len(headers) - len(row)))
    table(rows, headers, out)
    out.write(
        "  load: jonnx.load; onnxruntime's InferenceSession.\n"
        "  first call: jonnx traces and compiles (once per input shape); onnxruntime's first run.\n"
    )
    hint = _fault_hint(report)
    if hint:
        out.write(hint)


def _fault_hint(report: dict) -> str:
    """Advice on glibc's huge-page tunable where jonnx's calls fault on fresh memory, or ''."""
    worst = max((b["steady"]["jonnx"].get("page_faults") or 0 for b in report["batches"]), default=0)
    if worst < FAULT_HINT_MIN or not _tunable_applies():
        return ""
    return (
        f"  page faults: up to {worst:,} a jonnx call, the first touches of memory that XLA's CPU runtime\n"
        "  maps anew on every call for large temporaries. Starting Python with\n"
        f'  GLIBC_TUNABLES={HUGE_PAGES_TUNABLE} avoids most of them (docs/performance.md, "Large batches").\n'
    )


def _tunable_applies() -> bool:
    """Linux with glibc, and the huge-page tunable not set already."""
    return (
        platform.system() == "Linux"
        and platform.libc_ver()[0] == "glibc"
        and HUGE_PAGES_TUNABLE not in os.environ.get("GLIBC_TUNABLES", "")
    )

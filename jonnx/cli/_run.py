"""``jonnx run``: run a model jit-compiled, summarize (and save) its outputs, compare them."""

from __future__ import annotations

import argparse
import os
import re
import time
from typing import Any, TextIO

import numpy as np

from jonnx.cli._common import (
    ModelProblem,
    UsageError,
    load_model,
    model_inputs,
    onnxruntime_feed,
    onnxruntime_session,
    show_shape,
    table,
)


def run(args: argparse.Namespace) -> tuple[dict, int]:
    model = load_model(args)
    inputs = model_inputs(args, model)
    session = onnxruntime_session(args.model) if args.compare else None

    start = time.perf_counter()
    outputs = model(*inputs.values())  # by position: an input may be named like a keyword (state)
    outputs = [np.asarray(o) if not isinstance(o, list) else o for o in outputs]  # waits for the device
    seconds = time.perf_counter() - start

    report: dict[str, Any] = {
        "model": args.model,
        "inputs": [_summary(n, v) for n, v in inputs.items()],
        "outputs": [_summary(n, v) for n, v in zip(model.output_names, outputs)],
        "first_call_seconds": seconds,
    }
    if args.output:
        report["saved"] = _save(args.output, model.output_names, outputs)
    if session is not None:
        try:
            expected = session.run(None, onnxruntime_feed(model, inputs))
        except Exception as e:  # noqa: BLE001 - onnxruntime raises its own exception types
            raise ModelProblem(f"onnxruntime failed to run the model: {str(e).strip().splitlines()[0]}") from None
        names = [o.name for o in session.get_outputs()]
        report["compare"] = {
            "runtime": "onnxruntime",
            "outputs": [_difference(n, got, want) for n, got, want in zip(names, outputs, expected)],
        }
    return report, 0


def _summary(name: str, value: Any) -> dict:
    if isinstance(value, list):
        return {"name": name, "kind": "sequence", "length": len(value)}
    value = np.asarray(value)
    entry: dict[str, Any] = {
        "name": name,
        "dtype": str(value.dtype),
        "shape": list(value.shape),
    }
    if value.size and (np.issubdtype(value.dtype, np.number) or value.dtype == np.bool_):
        numeric = value.astype(np.float64) if not np.iscomplexobj(value) else np.abs(value)
        finite = np.isfinite(numeric)
        entry["nonfinite"] = int(numeric.size - finite.sum())
        if finite.any():
            shown = numeric[finite]
            entry.update(min=float(shown.min()), max=float(shown.max()), mean=float(shown.mean()))
    return entry


def _difference(name: str, got: Any, want: Any) -> dict:
    got, want = np.asarray(got), np.asarray(want)
    entry: dict[str, Any] = {"name": name}
    if got.shape != want.shape:
        entry["error"] = f"shape {list(got.shape)} != onnxruntime's {list(want.shape)}"
        return entry
    if got.dtype == object or want.dtype == object:
        entry["equal"] = bool(np.array_equal(got, want))
        return entry
    a, b = got.astype(np.float64), want.astype(np.float64)
    diff = np.abs(a - b)
    entry["max_abs"] = float(diff.max()) if diff.size else 0.0
    # Relative to the expected magnitude, with a floor so that near-zero outputs do not blow it up.
    scale = np.maximum(np.abs(b), np.finfo(np.float32).tiny)
    entry["max_rel"] = float((diff / scale).max()) if diff.size else 0.0
    entry["nan_mismatch"] = int(np.sum(np.isnan(a) != np.isnan(b)))
    return entry


def _save(folder: str, names: Any, outputs: list) -> list[str]:
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--output {folder!r}: cannot create the folder ({e.strerror})") from None
    saved = []
    for name, value in zip(names, outputs):
        if isinstance(value, list):
            continue  # sequences have no single array to save
        # Output names may hold '/', ':' and the like (`/layer1/Relu_output_0`).
        path = os.path.join(folder, re.sub(r"[^A-Za-z0-9_.-]", "_", name).lstrip(".") + ".npy")
        np.save(path, np.asarray(value), allow_pickle=False)
        saved.append(path)
    return saved


def render(report: dict, out: TextIO) -> None:
    out.write(f"{report['model']}: ran in {report['first_call_seconds'] * 1e3:.0f} ms (trace, compile and run)\n")
    out.write("inputs:\n")
    _table(report["inputs"], out)
    out.write("outputs:\n")
    _table(report["outputs"], out)
    out.writelines(f"saved {path}\n" for path in report.get("saved", []))
    compare = report.get("compare")
    if compare:
        out.write(f"difference against {compare['runtime']}:\n")
        rows = []
        for d in compare["outputs"]:
            if "error" in d:
                rows.append((d["name"], d["error"], "", ""))
            elif "equal" in d:
                rows.append((d["name"], "equal" if d["equal"] else "DIFFERENT", "", ""))
            else:
                rows.append(
                    (
                        d["name"],
                        f"{d['max_abs']:.3g}",
                        f"{d['max_rel']:.3g}",
                        d["nan_mismatch"] or "",
                    )
                )
        table(rows, ["output", "max abs", "max rel", "NaN mismatches"], out)


def _table(entries: list[dict], out: TextIO) -> None:
    rows = []
    for e in entries:
        if e.get("kind") == "sequence":
            rows.append((e["name"], "sequence", f"length {e['length']}", "", "", "", ""))
            continue
        stats = [f"{e[k]:.4g}" if k in e else "" for k in ("min", "max", "mean")]
        rows.append(
            (
                e["name"],
                e["dtype"],
                show_shape(e["shape"]),
                *stats,
                e.get("nonfinite") or "",
            )
        )
    table(rows, ["name", "dtype", "shape", "min", "max", "mean", "non-finite"], out)

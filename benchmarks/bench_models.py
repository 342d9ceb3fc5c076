"""Latency of jitted jonnx against onnxruntime on the bundled models.

For each model and batch size: trace+compile time of jonnx's first call, then the median of
repeated calls for jonnx (jit, params as arguments) and onnxruntime (CPU provider, default
session options), and their ratio (jonnx / onnxruntime: below 1 means jonnx is faster).

Usage: ``python benchmarks/bench_models.py [--repeats N] [--batches 1 32]``
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import time

import numpy as np
import onnxruntime as ort

import jonnx

MODELS = pathlib.Path(__file__).resolve().parents[1] / "examples" / "models"


def _inputs(name: str, batch: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    if name == "small_cnn":
        return {"image": rng.standard_normal((batch, 3, 16, 16)).astype(np.float32)}
    return {
        "input_ids": rng.integers(0, 50, (batch, 32)),
        "attention_mask": np.ones((batch, 32), np.int64),
    }


def _median_seconds(fn, repeats: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    args = parser.parse_args()

    rows = []
    for name in ("small_cnn", "tiny_transformer"):
        path = MODELS / f"{name}.onnx"
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        for batch in args.batches:
            model = jonnx.load(path)  # a fresh model, so the first call traces and compiles
            feeds = _inputs(name, batch)
            start = time.perf_counter()
            for out in model(**feeds):
                out.block_until_ready()
            compile_s = time.perf_counter() - start

            def run_jonnx():
                for out in model(**feeds):
                    out.block_until_ready()

            jonnx_s = _median_seconds(run_jonnx, args.repeats)
            ort_s = _median_seconds(lambda: session.run(None, feeds), args.repeats)
            rows.append((name, batch, compile_s, jonnx_s, ort_s))

    header = f"{'model':<18}{'batch':>6}{'compile ms':>12}{'jonnx ms':>11}{'ort ms':>10}{'ratio':>8}"
    print(header)
    print("-" * len(header))
    for name, batch, compile_s, jonnx_s, ort_s in rows:
        print(f"{name:<18}{batch:>6}{compile_s * 1e3:>12.0f}{jonnx_s * 1e3:>11.3f}"
              f"{ort_s * 1e3:>10.3f}{jonnx_s / ort_s:>8.2f}")
    print("ratio = jonnx / onnxruntime median latency (lower is better for jonnx)")


if __name__ == "__main__":
    main()

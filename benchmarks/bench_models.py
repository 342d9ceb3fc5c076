"""Latency of jitted jonnx against onnxruntime, and against the same network in plain JAX.

For each model and batch size: trace+compile time of jonnx's first call, then the median of
repeated calls for jonnx (jit, params as arguments), onnxruntime (CPU provider, default
session options) and, for the CNN, the same network written by hand in JAX (jit, same
weights, same NCHW layout). Ratios: jonnx / onnxruntime (below 1: jonnx is faster) and
jonnx / hand-written JAX (about 1: no interpreter overhead is left after jit).

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


def _hand_written_cnn(model: jonnx.Model):
    """small_cnn written directly in JAX with the model's weights (what jonnx should match)."""
    import jax.numpy as jnp
    from jax import lax

    weights = {**model.params, **model.state}

    def block(p, x, tag):
        x = lax.conv_general_dilated(
            x, p[f"{tag}.weight"], (1, 1), ((1, 1), (1, 1)), dimension_numbers=("NCHW", "OIHW", "NCHW")
        )
        x = x + p[f"{tag}.bias"][:, None, None]
        inv = p[f"{tag}.bn.scale"] / jnp.sqrt(p[f"{tag}.bn.running_var"] + 1e-5)
        x = (x - p[f"{tag}.bn.running_mean"][:, None, None]) * inv[:, None, None] + p[f"{tag}.bn.bias"][:, None, None]
        x = jnp.maximum(x, 0)
        return lax.reduce_window(x, -jnp.inf, lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")

    # Same compiler options as jonnx's own jit (jonnx.compiler_options()), so that the ratio
    # measures what the interpreter adds, not XLA's fusion settings.
    @jonnx.jit
    def forward(p, image):  # weights as arguments, as jonnx passes its params
        h = block(p, block(p, image, "block1"), "block2")
        h = jnp.mean(h, axis=(2, 3))
        return h @ p["fc.weight"].T + p["fc.bias"]

    return lambda image: forward(weights, image)


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

            # The closures below run within this iteration, so late binding of loop variables is fine.
            def run_jonnx():
                for out in model(**feeds):  # noqa: B023
                    out.block_until_ready()

            jonnx_s = _median_seconds(run_jonnx, args.repeats)
            ort_s = _median_seconds(lambda: session.run(None, feeds), args.repeats)  # noqa: B023
            jax_s = None
            if name == "small_cnn":
                forward = _hand_written_cnn(model)
                np.testing.assert_allclose(
                    np.asarray(forward(feeds["image"])), np.asarray(model(**feeds)[0]), rtol=1e-4, atol=1e-5
                )
                jax_s = _median_seconds(lambda: forward(feeds["image"]).block_until_ready(), args.repeats)  # noqa: B023
            rows.append((name, batch, compile_s, jonnx_s, ort_s, jax_s))

    header = (
        f"{'model':<18}{'batch':>6}{'compile ms':>12}{'jonnx ms':>11}{'ort ms':>10}"
        f"{'jax ms':>9}{'vs ort':>8}{'vs jax':>8}"
    )
    print(header)
    print("-" * len(header))
    for name, batch, compile_s, jonnx_s, ort_s, jax_s in rows:
        jax_ms = f"{jax_s * 1e3:>9.3f}" if jax_s else f"{'-':>9}"
        vs_jax = f"{jonnx_s / jax_s:>8.2f}" if jax_s else f"{'-':>8}"
        print(
            f"{name:<18}{batch:>6}{compile_s * 1e3:>12.0f}{jonnx_s * 1e3:>11.3f}"
            f"{ort_s * 1e3:>10.3f}{jax_ms}{jonnx_s / ort_s:>8.2f}{vs_jax}"
        )
    print("vs ort = jonnx / onnxruntime, vs jax = jonnx / hand-written JAX (median latency; lower is better for jonnx)")


if __name__ == "__main__":
    main()

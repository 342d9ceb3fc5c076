"""What ``Model(*inputs)`` adds per call to the compiled function it runs.

Models that are nothing but a chain of tiny MatMuls (8 x 8 weights, batch 1), so that the
call's fixed cost is what is timed: jonnx's default call against the same chain written in
JAX and compiled as one ``jax.jit`` function with jonnx's compiler options
(``jonnx._jit.plain_jit``: ``jonnx.jit`` itself adds a per-call signature of its own), weights
as arguments as jonnx passes them. Calls alternate in blocks of 100; medians of the blocks' mean times.
Scikit-learn exports and small MLPs live at this scale, where a few tens of microseconds of
Python are the whole call.

Usage: ``python benchmarks/bench_call_overhead.py [--sizes 1 200] [--rounds 20]``
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import onnx.helper as oh
from onnx import numpy_helper

import jonnx
from jonnx._jit import plain_jit


def _chain(n: int) -> tuple[onnx.ModelProto, list[np.ndarray]]:
    rng = np.random.default_rng(0)
    weights = [(0.3 * rng.standard_normal((8, 8))).astype(np.float32) for _ in range(n)]
    nodes = [oh.make_node("MatMul", ["x" if i == 0 else f"h{i - 1}", f"w{i}"], [f"h{i}"]) for i in range(n)]
    graph = oh.make_graph(
        nodes,
        "chain",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 8])],
        [oh.make_tensor_value_info(f"h{n - 1}", onnx.TensorProto.FLOAT, [1, 8])],
        [numpy_helper.from_array(w, f"w{i}") for i, w in enumerate(weights)],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)]), weights


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 200], help="MatMuls (and weights) per model")
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    print(f"jax {jax.__version__}, jonnx {jonnx.__version__}")
    print(f"{'weights':>8} {'jonnx us':>9} {'jax.jit us':>13} {'added us':>9} {'ratio':>6}")
    for n in args.sizes:
        j, h = _time(n, args.rounds)
        print(f"{n:>8} {j:>9.1f} {h:>13.1f} {j - h:>9.1f} {j / h:>6.2f}", flush=True)


def _time(n: int, rounds: int) -> tuple[float, float]:
    """Median microseconds per call: jonnx's default call, and the chain under jax.jit."""
    proto, weights = _chain(n)
    model = jonnx.load(proto)
    params = {f"w{i}": jnp.asarray(w) for i, w in enumerate(weights)}

    @plain_jit
    def chain(params, x):
        for i in range(n):
            x = x @ params[f"w{i}"]
        return x

    x = np.random.default_rng(1).standard_normal((1, 8)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(model(x)[0]), np.asarray(chain(params, x)), rtol=1e-4, atol=1e-6)
    engines = {"jonnx": lambda: jax.block_until_ready(model(x)), "jit": lambda: jax.block_until_ready(chain(params, x))}
    times: dict[str, list[float]] = {k: [] for k in engines}
    for r in range(rounds):
        for name in sorted(engines, reverse=bool(r % 2)):
            start = time.perf_counter()
            for _ in range(100):
                engines[name]()
            times[name].append((time.perf_counter() - start) / 100 * 1e6)
    return statistics.median(times["jonnx"]), statistics.median(times["jit"])


if __name__ == "__main__":
    main()

"""The speed acceptance benchmarks: jonnx's default call against onnxruntime, in one process.

Models (benchmarks/nets.py, seeded weights, NCHW as exporters write): ResNet-50, MobileNetV2,
a BERT-base-width 4-layer encoder, and that encoder through onnxruntime's quantize_dynamic.
For each model and batch: load + first call time of ``jonnx.load(proto)`` then ``model(x)``
(the default call, all optimizations on), then jonnx, jonnx without optimizations
(``optimize=False``) and onnxruntime called in turn, ``--repeats`` rounds, medians. Ratios are
jonnx / onnxruntime (below 1: jonnx is faster). The peak RSS of the process is printed at the end.

``--train`` adds a ResNet-18 training step (batch 32, 64x64, 10 classes, SGD with momentum,
``train=True``): jonnx's step jitted, against PyTorch eager CPU (benchmarks/torch_resnet18_step.py,
run by ``--torch-python``'s interpreter in its own process).

Usage: ``python benchmarks/bench_acceptance.py [--models resnet50 bert] [--batches 1 32] [--repeats 10] [--train]``
The machine this runs on may be shared: ratios taken in one process, alternating, are what
to compare, not absolute times.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import time

import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import nets

import jonnx

MODELS = {
    "resnet50": (nets.resnet50, (3, 224, 224)),
    "mobilenet_v2": (nets.mobilenet_v2, (3, 224, 224)),
    "bert": (nets.bert_encoder, (128, 768)),
    "bert_int8": (lambda: nets.quantized(nets.bert_encoder()), (128, 768)),
}


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_inference(name: str, batches: list[int], repeats: int) -> list[tuple]:
    build, shape = MODELS[name]
    proto = build()
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    rows = []
    for batch in batches:
        x = np.random.default_rng(0).standard_normal((batch, *shape)).astype(np.float32)
        load_s, med, err = _bench_batch(proto, session, x, repeats)
        rows.append((name, batch, load_s, med["jonnx"], med["plain"], med["ort"], err))
        print(
            f"{name:<13}{batch:>4}{load_s:>9.2f}{med['jonnx'] * 1e3:>10.1f}{med['plain'] * 1e3:>10.1f}"
            f"{med['ort'] * 1e3:>10.1f}{med['jonnx'] / med['ort']:>8.2f}{med['plain'] / med['ort']:>8.2f}"
            f"{err:>9.1e}",
            flush=True,
        )
    return rows


def _bench_batch(proto, session, x, repeats: int) -> tuple[float, dict[str, float], float]:
    """Load + first call time, median call times by runtime, and jonnx's relative error."""
    input_name = session.get_inputs()[0].name
    start = time.perf_counter()
    model = jonnx.load(proto)
    model(x)[0].block_until_ready()
    load_s = time.perf_counter() - start
    plain = jonnx.load(proto, optimize=False)
    want = session.run(None, {input_name: x})[0]
    got = np.asarray(model(x)[0])
    err = float(np.max(np.abs(got - want)) / (np.max(np.abs(want)) + 1e-12))
    plain(x)[0].block_until_ready()
    calls = {
        "jonnx": lambda: model(x)[0].block_until_ready(),
        "plain": lambda: plain(x)[0].block_until_ready(),
        "ort": lambda: session.run(None, {input_name: x}),
    }
    # The order rotates every round: a call right after onnxruntime's runs while its worker
    # threads still spin (two identical jonnx models measured 254 against 180 ms at batch 1,
    # the one following onnxruntime slower), so a fixed order would bias one column.
    times = {k: [] for k in calls}
    names = list(calls)
    for r in range(repeats):
        for k in names[r % len(names) :] + names[: r % len(names)]:
            times[k].append(_timed(calls[k]))
    return load_s, {k: statistics.median(v) for k, v in times.items()}, err


def bench_train(repeats: int, torch_python: str | None = None) -> None:
    import jax
    import jax.numpy as jnp

    proto = nets.resnet18(size=64, classes=10)
    model = jonnx.load(proto)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 3, 64, 64)).astype(np.float32)
    labels = rng.integers(0, 10, 32)

    def loss(params, state, x, labels):
        (logits,), new_state = model.apply(params, x, state=state, train=True)
        logp = jax.nn.log_softmax(logits)
        return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=1)), new_state

    @jonnx.jit
    def step(params, velocity, state, x, labels):
        (value, new_state), grads = jax.value_and_grad(loss, has_aux=True)(params, state, x, labels)
        velocity = jax.tree_util.tree_map(lambda v, g: 0.9 * v + g, velocity, grads)
        params = jax.tree_util.tree_map(lambda p, v: p - 0.01 * v, params, velocity)
        return params, velocity, new_state, value

    carry = [
        model.params,
        jax.tree_util.tree_map(jnp.zeros_like, model.params),
        model.state,
    ]
    compile_s = _timed(lambda: jax.block_until_ready(step(*carry, x, labels)))

    def run_jonnx():
        carry[:] = step(*carry, x, labels)[:3]
        jax.block_until_ready(carry)

    times = [_timed(run_jonnx) for _ in range(repeats)]
    line = f"resnet18 train step b32 64x64: compile {compile_s:.1f} s, jonnx {statistics.median(times) * 1e3:.0f} ms"
    if torch_python:
        # torch runs in its own process (it is never imported next to jonnx), once with its
        # default threads and once with one (on a shared machine its thread pool suffers).
        script = pathlib.Path(__file__).resolve().parent / "torch_resnet18_step.py"
        for threads in (None, "1"):
            env = dict(os.environ, **({"OMP_NUM_THREADS": threads} if threads else {}))
            out = subprocess.run(
                [torch_python, str(script), "--repeats", str(repeats)],
                capture_output=True,
                text=True,
                check=True,
                env=env,
            ).stdout
            ms = float(out.split()[-1])
            label = "torch eager" + (" 1 thread" if threads else "")
            line += f", {label} {ms:.0f} ms (jonnx/torch {statistics.median(times) * 1e3 / ms:.2f})"
    print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--train", action="store_true")
    parser.add_argument(
        "--torch-python",
        help="a Python with torch, to time the same step in PyTorch eager (separate process)",
    )
    args = parser.parse_args()
    print(
        f"{'model':<13}{'b':>4}{'load+1st':>9}{'jonnx ms':>10}{'plain ms':>10}{'ort ms':>10}"
        f"{'vs ort':>8}{'plain':>8}{'rel err':>9}"
    )
    for name in args.models:
        bench_inference(name, args.batches, args.repeats)
    if args.train:
        bench_train(args.repeats, args.torch_python)
    print(
        f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB; "
        "jonnx = default call (all optimizations), plain = optimize=False; vs ort = jonnx / onnxruntime"
    )


if __name__ == "__main__":
    main()

"""The ``channels_last`` pass on and off: ResNet-50 / MobileNetV2 inference and a ResNet-18 step.

    python benchmarks/bench_layout.py [--models resnet50 mobilenet_v2] [--batches 1 32]
                                      [--repeats 7] [--train]

For each model and batch, four configurations (layout on/off x ``constant_weights`` on/off)
are compiled, then called in turn, round after round, in one process; medians and the
on/off ratios are printed with the machine's load. ``--train`` times the ResNet-18 training
step (batch 32, 64x64, SGD momentum, as bench_acceptance.py) with the pass on and off,
alternating.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import nets  # noqa: E402

import jonnx  # noqa: E402

MODELS = {"resnet50": nets.resnet50, "mobilenet_v2": nets.mobilenet_v2}


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _load() -> str:
    return "load {:.1f} {:.1f} {:.1f}".format(*os.getloadavg())


def bench_inference(name: str, batch: int, repeats: int) -> None:
    proto = MODELS[name]()
    x = np.random.default_rng(0).standard_normal((batch, 3, 224, 224)).astype(np.float32)
    configs = {}
    first = {}
    reference = None
    for const in (False, True):
        for layout in (False, True):
            key = f"{'NHWC' if layout else 'NCHW'}{' const' if const else ''}"
            model = jonnx.load(proto, optimize={"channels_last": layout, "constant_weights": const})
            first[key] = _timed(lambda m=model: m(x)[0].block_until_ready())
            out = np.asarray(model(x)[0])
            if reference is None:
                reference = out
            err = float(np.max(np.abs(out - reference)) / np.max(np.abs(reference)))
            assert err < 1e-4, (key, err)
            configs[key] = model
    times = {k: [] for k in configs}
    for _ in range(repeats):
        for key, model in configs.items():
            times[key].append(_timed(lambda m=model: m(x)[0].block_until_ready()))
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    print(
        f"{name} b{batch} ({_load()}): "
        + ", ".join(f"{k} {v:.1f} ms (1st {first[k]:.1f} s)" for k, v in med.items())
        + f"; NHWC/NCHW {med['NHWC'] / med['NCHW']:.2f}, const {med['NHWC const'] / med['NCHW const']:.2f}",
        flush=True,
    )


def bench_train(repeats: int) -> None:
    import jax
    import jax.numpy as jnp

    proto = nets.resnet18(size=64, classes=10)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 3, 64, 64)).astype(np.float32)
    labels = rng.integers(0, 10, 32)
    steps = {}
    for layout in (False, True):
        model = jonnx.load(proto, optimize={"channels_last": layout})

        def loss(params, state, x, labels, model=model):
            (logits,), new_state = model.apply(params, x, state=state, train=True)
            logp = jax.nn.log_softmax(logits)
            return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=1)), new_state

        @jonnx.jit
        def step(params, velocity, state, x, labels, loss=loss):
            (value, new_state), grads = jax.value_and_grad(loss, has_aux=True)(params, state, x, labels)
            velocity = jax.tree_util.tree_map(lambda v, g: 0.9 * v + g, velocity, grads)
            params = jax.tree_util.tree_map(lambda p, v: p - 0.01 * v, params, velocity)
            return params, velocity, new_state, value

        carry = [model.params, jax.tree_util.tree_map(jnp.zeros_like, model.params), model.state]
        compile_s = _timed(lambda step=step, carry=carry: jax.block_until_ready(step(*carry, x, labels)))
        steps["NHWC" if layout else "NCHW"] = (step, carry, compile_s)
    times = {k: [] for k in steps}
    for _ in range(repeats):
        for key, (step, carry, _) in steps.items():

            def run(step=step, carry=carry):
                carry[:] = step(*carry, x, labels)[:3]
                jax.block_until_ready(carry)

            times[key].append(_timed(run))
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    print(
        f"resnet18 train step b32 64x64 ({_load()}): "
        + ", ".join(f"{k} {v:.0f} ms (compile {steps[k][2]:.1f} s)" for k, v in med.items())
        + f"; NHWC/NCHW {med['NHWC'] / med['NCHW']:.2f}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--batches", nargs="*", type=int, default=[1, 32])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--train", action="store_true")
    args = parser.parse_args()
    for name in args.models:
        for batch in args.batches:
            bench_inference(name, batch, args.repeats)
    if args.train:
        bench_train(args.repeats)


if __name__ == "__main__":
    main()

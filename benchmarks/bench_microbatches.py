"""Training steps with gradients accumulated over microbatches, against the whole batch.

Usage: ``python benchmarks/bench_microbatches.py [--batch 32] [--microbatches 1 4 8] [--rounds 3]``

Builds ``make_train_step(model, l2 loss, adamw, microbatches=k)`` for the BERT-base-width
4-layer encoder of benchmarks/nets.py and each ``k``, checks that every ``k`` gives the whole
batch's loss and gradient norm, then times the steps alternating in one process (balanced
orders) and prints the medians, the ratio to the first ``k`` and the minor page faults a step
(what XLA's freshly mapped temporaries cost: docs/performance.md, "Large batches").
"""

from __future__ import annotations

import argparse
import pathlib
import resource
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import nets
from _order import balanced_orders

import jonnx
from jonnx import training


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--microbatches", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--rounds", type=int, default=3, help="passes over the balanced orders")
    args = parser.parse_args()

    import jax
    import optax

    model = jonnx.load(nets.bert_encoder())
    rng = np.random.default_rng(0)
    shape = (args.batch, 128, 768)
    batch = {
        model.input_names[0]: rng.standard_normal(shape).astype(np.float32),
        "t": rng.standard_normal(shape).astype(np.float32),
    }
    loss = training.supervised_loss(model, optax.l2_loss, target="t")
    runs, first = {}, {}
    for k in args.microbatches:
        step = training.make_train_step(model, loss, optax.adamw(1e-4), microbatches=k)
        ts = step.init()
        start = time.perf_counter()
        _, metrics = jax.block_until_ready(step(ts, batch))
        print(
            f"microbatches={k}: first step {time.perf_counter() - start:.1f} s, "
            f"loss {float(metrics['loss']):.6f}, grad norm {float(metrics['grad_norm']):.6f}",
            flush=True,
        )
        first[k] = (float(metrics["loss"]), float(metrics["grad_norm"]))
        runs[k] = (step, ts)
    base = args.microbatches[0]
    for k, (value, norm) in first.items():
        assert abs(value - first[base][0]) <= 1e-5 * abs(first[base][0]), (k, value)
        assert abs(norm - first[base][1]) <= 1e-4 * abs(first[base][1]), (k, norm)

    times = {k: [] for k in runs}
    faults = {k: [] for k in runs}
    for order in balanced_orders(len(runs)) * args.rounds:
        for i in order:
            k = args.microbatches[i]
            step, ts = runs[k]
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            start = time.perf_counter()
            jax.block_until_ready(step(ts, batch))
            times[k].append(time.perf_counter() - start)
            faults[k].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    reference = np.median(times[base])
    print(f"\nBERT encoder, 4 layers, batch {args.batch} x 128 tokens, AdamW step:")
    print(f"{'microbatches':>12}{'ms':>9}{'ratio':>8}{'faults':>9}")
    for k in runs:
        median = np.median(times[k])
        print(f"{k:>12}{median * 1e3:>9.0f}{median / reference:>8.2f}{int(np.median(faults[k])):>9}")


if __name__ == "__main__":
    main()

"""The dot floor: what XLA's products alone take for a computation, against the reference's whole call.

Every float32 product (``dot_general``) of a model's call, or of the BERT fine-tuning step with
``--train bert``, is read from its jaxpr and timed alone: compiled with YNNPACK's dots and with
XLA's own (``jonnx.compiler_options(library_dots=...)``), on arrays passed in. The faster of the
two, times how often the product occurs, summed, is the *floor*: what XLA's dot kernels need at
the least for that work (alone, a product's operands stay warm in cache across repeats, and its
result goes into the buffer of the previous one, as a model's products write into its
temporaries; in the model they do no better). It is timed in one process with the reference's whole call
(onnxruntime's session; for the training step PyTorch eager in its own process, when
``--torch-python`` names a Python with torch) and jonnx's own call, all in turn
(bench_acceptance.py's balanced rounds). When ``floor / reference`` is above a target ratio, no
lowering jonnx chooses can meet that target on this machine with XLA's dot kernels; below it,
the rest of the ratio is what is left for everything else (the product's efficiency inside the
model, the other operations).

The floor counts products only: a model's convolutions left to XLA's convolution (ResNet-50's
stem and some 3x3s) are not in it, so for a CNN it is a weaker bound.

Usage: ``python benchmarks/bench_dot_floor.py [--models bert resnet50 ...] [--batches 1 32]
[--repeats 6] [--train bert --torch-python PY]``
"""

from __future__ import annotations

import argparse
import collections
import math
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import bench_acceptance
import hand_jax

import jonnx
from jonnx import _jit

# The targets of the speed issue (jonnx / reference), for the verdict line.
TARGETS = {("bert", 1): 1.1, ("bert", 32): 0.95, ("resnet50", 1): 1.6, ("resnet50", 32): 1.9, ("mobilenet_v2", 1): 2.0}
TRAIN_TARGET = 1.2  # the BERT fine-tuning step against PyTorch eager


def _products(jaxpr) -> collections.Counter:
    """How often each float32 product ``(lhs shape, rhs shape, dimension numbers)`` runs per
    call (a scan's body as many times as its length)."""
    found = collections.Counter()
    for lhs, rhs, dims, float32, runs in _jit._dots(jaxpr):
        if float32:
            (lc, rc), (lb, rb) = dims
            found[(tuple(lhs), tuple(rhs), ((tuple(lc), tuple(rc)), (tuple(lb), tuple(rb))))] += runs
    return found


def _flops(product) -> int:
    lhs, rhs, ((lc, rc), (lb, rb)) = product
    free_rhs = math.prod(n for d, n in enumerate(rhs) if d not in (*rc, *rb))
    return 2 * math.prod(lhs) * free_rhs


def _describe(product) -> str:
    lhs, rhs, ((lc, rc), (lb, rb)) = product
    batch = math.prod(lhs[d] for d in lb)
    k = math.prod(lhs[d] for d in lc)
    m = math.prod(lhs) // (batch * k)
    n = math.prod(rhs) // (batch * k)
    return f"{batch} x " * (batch > 1) + f"{m} x {k} x {n}"


def _product_calls(products) -> dict:
    """``{(product, library): call}`` for each product compiled with each dot library."""
    import jax
    from jax import lax

    rng = np.random.default_rng(0)
    calls = {}
    for product in products:
        lhs_shape, rhs_shape, dims = product
        lhs = jax.device_put(rng.standard_normal(lhs_shape).astype(np.float32))
        rhs = jax.device_put(rng.standard_normal(rhs_shape).astype(np.float32))
        out = jax.eval_shape(lambda a, b, dims=dims: lax.dot_general(a, b, dims), lhs, rhs)
        for library in ("YNNPACK", "XLA"):
            # The product writes into the buffer of its previous result, donated: a fresh
            # output of 50 MB (4096 x 3072) costs its page faults on every call, about a fifth
            # of that product's time (52 against 42 ms), which inside a model it does not.
            fn = jax.jit(
                lambda a, b, _, dims=dims: lax.dot_general(a, b, dims),
                compiler_options=jonnx.compiler_options(library_dots=library == "YNNPACK"),
                donate_argnums=2,
                keep_unused=True,  # else the unused buffer is pruned and nothing is reused
            )
            result = [fn(lhs, rhs, jax.numpy.zeros(out.shape, out.dtype))]

            def call(fn=fn, lhs=lhs, rhs=rhs, result=result):
                result[0] = fn(lhs, rhs, result[0])
                result[0].block_until_ready()

            call()
            calls[product, library] = call
    return calls


def _report(label: str, products: collections.Counter, med: dict, reference: str, target: float | None) -> None:
    print(
        f"\n{label}: {sum(products.values())} float32 products of {len(products)} shapes, "
        f"{sum(_flops(p) * c for p, c in products.items()) / 1e9:.2f} GFLOP"
    )
    print(
        f"  {'product (batch x M x K x N)':<30}{'count':>6}{'YNNPACK ms':>12}{'XLA ms':>9}{'GFLOP/s':>9}{'x count ms':>12}"
    )
    floor = 0.0
    for product, count in sorted(products.items(), key=lambda pc: -_flops(pc[0]) * pc[1]):
        ynn, xla = med[product, "YNNPACK"], med[product, "XLA"]
        best = min(ynn, xla)
        floor += best * count
        print(
            f"  {_describe(product):<30}{count:>6}{ynn * 1e3:>12.3f}{xla * 1e3:>9.3f}"
            f"{_flops(product) / best / 1e9:>9.0f}{best * count * 1e3:>12.1f}"
        )
    ref, own = med[reference], med["jonnx"]
    print(f"  floor (the products alone, each at its faster library): {floor * 1e3:.1f} ms")
    print(f"  {reference}: {ref * 1e3:.1f} ms; jonnx: {own * 1e3:.1f} ms ({own / ref:.2f}x)")
    verdict = ""
    if target is not None:
        verdict = (
            f"; target {target}: out of reach with XLA's dot kernels here"
            if floor / ref > target
            else f"; target {target}: the products alone leave {target - floor / ref:.2f} of it for the rest"
        )
    print(f"  floor / {reference}: {floor / ref:.2f}{verdict}", flush=True)


def bench_inference(name: str, batch: int, repeats: int) -> None:
    import jax
    import onnxruntime as ort

    build, shape = bench_acceptance.MODELS[name]
    proto = build()
    model = jonnx.load(proto)
    x = np.random.default_rng(0).standard_normal((batch, *shape)).astype(np.float32)
    # The default call's products: traced as a caller's jit traces it (the call graph, with
    # its layout pass and prepared weights, as Model(*inputs) compiles it).
    products = _products(jax.make_jaxpr(lambda x: model(x))(x))
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    feed = {session.get_inputs()[0].name: x}
    model(x)[0].block_until_ready()
    fns = {
        "onnxruntime": lambda: session.run(None, feed),
        "jonnx": lambda: model(x)[0].block_until_ready(),
        **_product_calls(products),
    }
    med = bench_acceptance._alternate(fns, repeats)
    _report(f"{name} batch {batch}", products, med, "onnxruntime", TARGETS.get((name, batch)))


def bench_train_bert(repeats: int, torch_python: str) -> None:
    steps, x, labels, head, proto = bench_acceptance.bert_steps()
    step, carry = steps["jonnx"]
    products = _products(step.trace(*carry, x, labels).jaxpr)
    runs = {"jonnx": bench_acceptance._first_step(step, carry, x, labels)}
    runs.update({key: (call,) for key, call in _product_calls(products).items()})
    arrays = dict(x=x, labels=labels, **hand_jax.torch_bert_weights(proto), **head)
    med, _ = bench_acceptance._time_steps(runs, repeats, torch_python, "torch_bert_step.py", arrays)
    _report(f"bert fine-tuning step, batch {bench_acceptance.BERT_BATCH}", products, med, "torch eager", TRAIN_TARGET)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=["bert"], choices=list(bench_acceptance.MODELS))
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--repeats", type=int, default=6, help="rounds of balanced blocks")
    parser.add_argument("--train", nargs="*", choices=["bert"], help="the BERT fine-tuning step (needs --torch-python)")
    parser.add_argument("--torch-python", help="a Python with torch, for the training step's reference")
    args = parser.parse_args()
    if args.train is not None and not args.torch_python:
        parser.error("--train needs --torch-python (PyTorch eager is the training step's reference)")
    for name in args.models:
        for batch in args.batches:
            bench_inference(name, batch, args.repeats)
    if args.train is not None:
        bench_train_bert(args.repeats, args.torch_python)


if __name__ == "__main__":
    main()

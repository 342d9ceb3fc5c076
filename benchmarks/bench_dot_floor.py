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

A quantized model's products of 8-bit values (ops/quantize.py's integer products, run as
bfloat16, int8 or float32 dots by ``integer_matmul_mode()``) are counted too, each timed in every
kind JAX offers for 8-bit values (int8 x int8 and uint8 x int8 with int32 sums, bfloat16 and
float32 with float32 sums; YNNPACK's dots), the fastest counting: for the int8 BERT the floor is
then what any choice of integer product kernels needs.

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
TARGETS = {
    ("bert_int8", 1): 1.5,
    ("bert", 1): 1.1,
    ("bert", 32): 0.95,
    ("resnet50", 1): 1.6,
    ("resnet50", 32): 1.9,
    ("mobilenet_v2", 1): 2.0,
}
TRAIN_TARGET = 1.2  # the BERT fine-tuning step against PyTorch eager


# How each kind of product is timed: {variant: (lhs dtype, rhs dtype, sum dtype, YNNPACK's dots)}.
# A float32 product with either dot library; a product of 8-bit values (ops/quantize.py's
# integer products, whose operands are of a type in EIGHT_BIT_OPERANDS) in every kind JAX offers
# for them, with YNNPACK's dots (XLA's own are slower for each: docs/performance.md).
FLOAT32_VARIANTS = {"YNNPACK": ("float32", "float32", "float32", True), "XLA": ("float32", "float32", "float32", False)}
EIGHT_BIT_OPERANDS = ("bfloat16", "int8", "uint8")
EIGHT_BIT_VARIANTS = {
    "int8": ("int8", "int8", "int32", True),
    "uint8 x int8": ("uint8", "int8", "int32", True),
    "bfloat16": ("bfloat16", "bfloat16", "float32", True),
    "float32": ("float32", "float32", "float32", True),
}


def _products(jaxpr, operands: tuple[str, ...] = ("float32",)) -> collections.Counter:
    """How often each product ``(lhs shape, rhs shape, dimension numbers)`` whose operands are
    of the types ``operands`` runs per call (a scan's body as many times as its length)."""
    found = collections.Counter()
    for lhs, rhs, dims, dtypes, runs in _jit._dots(jaxpr):
        if all(str(t) in operands for t in dtypes):
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


def _operand(rng: np.random.Generator, shape, dtype: str) -> np.ndarray:
    if dtype in ("int8", "uint8"):
        low = 0 if dtype == "uint8" else -128
        return rng.integers(low, low + 256, shape).astype(dtype)
    return rng.standard_normal(shape).astype(np.float32).astype(_dtype(dtype))


def _dtype(name: str):
    import jax.numpy as jnp

    return jnp.dtype(name)


def _product_calls(products, variants: dict) -> dict:
    """``{(product, variant): call}`` for each product compiled as each of ``variants``."""
    import jax
    from jax import lax

    rng = np.random.default_rng(0)
    calls = {}
    for product in products:
        lhs_shape, rhs_shape, dims = product
        for variant, (lhs_type, rhs_type, sum_type, library_dots) in variants.items():
            lhs = jax.device_put(_operand(rng, lhs_shape, lhs_type))
            rhs = jax.device_put(_operand(rng, rhs_shape, rhs_type))

            def product_fn(a, b, _, dims=dims, sum_type=sum_type):
                return lax.dot_general(a, b, dims, preferred_element_type=_dtype(sum_type))

            out = jax.eval_shape(product_fn, lhs, rhs, None)
            # The product writes into the buffer of its previous result, donated: a fresh
            # output of 50 MB (4096 x 3072) costs its page faults on every call, about a fifth
            # of that product's time (52 against 42 ms), which inside a model it does not.
            fn = jax.jit(
                product_fn,
                compiler_options=jonnx.compiler_options(library_dots=library_dots),
                donate_argnums=2,
                keep_unused=True,  # else the unused buffer is pruned and nothing is reused
            )
            result = [fn(lhs, rhs, jax.numpy.zeros(out.shape, out.dtype))]

            def call(fn=fn, lhs=lhs, rhs=rhs, result=result):
                result[0] = fn(lhs, rhs, result[0])
                result[0].block_until_ready()

            call()
            calls[product, variant] = call
    return calls


def _floor(label: str, products: collections.Counter, med: dict, variants: dict) -> float:
    """Prints each product's time in each variant and returns the floor: the fastest
    variant's time of each, times its count, summed (seconds)."""
    print(
        f"\n{label}: {sum(products.values())} products of {len(products)} shapes, "
        f"{sum(_flops(p) * c for p, c in products.items()) / 1e9:.2f} GFLOP"
    )
    columns = "".join(f"{v + ' ms':>{max(10, len(v) + 4)}}" for v in variants)
    print(f"  {'product (batch x M x K x N)':<30}{'count':>6}{columns}{'GOP/s':>8}{'x count ms':>12}")
    floor = 0.0
    for product, count in sorted(products.items(), key=lambda pc: -_flops(pc[0]) * pc[1]):
        times = [med[product, v] for v in variants]
        best = min(times)
        floor += best * count
        cells = "".join(f"{t * 1e3:>{max(10, len(v) + 4)}.3f}" for v, t in zip(variants, times))
        print(
            f"  {_describe(product):<30}{count:>6}{cells}{_flops(product) / best / 1e9:>8.0f}{best * count * 1e3:>12.1f}"
        )
    return floor


def _report(label: str, sections: list, med: dict, reference: str, target: float | None) -> None:
    """``sections``: (label, products, variants) whose floors add up."""
    floor = sum(
        _floor(f"{label}, {what}", products, med, variants) for what, products, variants in sections if products
    )
    ref, own = med[reference], med["jonnx"]
    print(f"  floor (the products alone, each in its fastest variant): {floor * 1e3:.1f} ms")
    print(f"  {reference}: {ref * 1e3:.1f} ms; jonnx: {own * 1e3:.1f} ms ({own / ref:.2f}x)")
    verdict = ""
    if target is not None:
        verdict = (
            f"; target {target}: out of reach with XLA's dot kernels here"
            if floor / ref > target
            else f"; target {target}: the products alone leave {target - floor / ref:.2f} of it for the rest"
        )
    print(f"  floor / {reference}: {floor / ref:.2f}{verdict}", flush=True)


def _sections(jaxpr) -> list:
    return [
        ("float32 products", _products(jaxpr), FLOAT32_VARIANTS),
        ("products of 8-bit values", _products(jaxpr, EIGHT_BIT_OPERANDS), EIGHT_BIT_VARIANTS),
    ]


def _calls(sections) -> dict:
    calls = {}
    for _, products, variants in sections:
        calls.update(_product_calls(products, variants))
    return calls


def bench_inference(name: str, batch: int, repeats: int) -> None:
    import jax
    import onnxruntime as ort

    build, shape = bench_acceptance.MODELS[name]
    proto = build()
    model = jonnx.load(proto)
    x = np.random.default_rng(0).standard_normal((batch, *shape)).astype(np.float32)
    # The default call's products: traced as a caller's jit traces it (the call graph, with
    # its layout pass and prepared weights, as Model(*inputs) compiles it).
    sections = _sections(jax.make_jaxpr(lambda x: model(x))(x))
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    feed = {session.get_inputs()[0].name: x}
    model(x)[0].block_until_ready()
    fns = {
        "onnxruntime": lambda: session.run(None, feed),
        "jonnx": lambda: model(x)[0].block_until_ready(),
        **_calls(sections),
    }
    med = bench_acceptance._alternate(fns, repeats)
    _report(f"{name} batch {batch}", sections, med, "onnxruntime", TARGETS.get((name, batch)))


def bench_train_bert(repeats: int, torch_python: str) -> None:
    steps, x, labels, head, proto = bench_acceptance.bert_steps()
    step, carry = steps["jonnx"]
    sections = _sections(step.trace(*carry, x, labels).jaxpr)
    runs = {"jonnx": bench_acceptance._first_step(step, carry, x, labels)}
    runs.update({key: (call,) for key, call in _calls(sections).items()})
    arrays = dict(x=x, labels=labels, **hand_jax.torch_bert_weights(proto), **head)
    med, _ = bench_acceptance._time_steps(runs, repeats, torch_python, "torch_bert_step.py", arrays)
    _report(f"bert fine-tuning step, batch {bench_acceptance.BERT_BATCH}", sections, med, "torch eager", TRAIN_TARGET)


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

"""The speed acceptance benchmarks: jonnx's default call against onnxruntime and hand-written JAX.

Models (benchmarks/nets.py, seeded weights, NCHW as exporters write): ResNet-50, MobileNetV2,
a BERT-base-width 4-layer encoder, and that encoder through onnxruntime's quantize_dynamic.
For each model and batch: ``jonnx.load(proto)`` time and the first call's (trace + compile),
then jonnx's default call (all optimizations on), jonnx with ``optimize=False``, the same
network written by hand in JAX (benchmarks/hand_jax.py: NHWC, ``lax.conv_general_dilated``,
weights as compile-time constants; the int8 encoder's with bfloat16 products and Q, K and V
as one; none for the EfficientNet) and onnxruntime, called in turn in one
process, ``--repeats`` rounds, medians. Ratios are jonnx / onnxruntime and jonnx / hand (below 1:
jonnx is faster); relative errors are against onnxruntime. Peak RSS: the process's high-water
mark after each model, or each model's own with ``--isolate`` (a fresh subprocess per model).

``--train [resnet18] [bert] [mobilenet_v2]`` adds training steps, each jitted, jonnx against the
hand-written JAX step and against PyTorch eager CPU when ``--torch-python`` names a Python with
torch (benchmarks/torch_resnet18_step.py, torch_bert_step.py, torch_mobilenet_v2_step.py, in their own processes, one with
torch's default threads and one with a single thread, from the same weights and batch: the
first-step losses printed must agree), all called in turn, one step each per round:
- ResNet-18 (batch 32, 64x64, 10 classes, BatchNormalization in training mode, SGD momentum
  0.9, lr 0.01, cross-entropy); the hand-written step uses ``lax.conv_general_dilated`` NHWC.
- BERT fine-tuning: the encoder above plus a linear head on the first token (2 classes),
  batch 8, seq 128, AdamW (lr 1e-4, weight decay 0.01), every linear and LayerNorm trained.
- MobileNetV2 (batch 16, 224x224, 1000 classes), as ResNet-18 otherwise; not an acceptance
  target of the speed issue, the depthwise network's training step (its hand-written step's
  depthwise convolutions are ``feature_group_count`` ones, slow on XLA CPU).

Usage: ``python benchmarks/bench_acceptance.py [--models resnet50 bert] [--batches 1 32] [--repeats 10]
[--train [resnet18 bert mobilenet_v2]] [--torch-python PY] [--isolate]``
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
import tempfile
import time

import numpy as np
import onnx

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import hand_jax
import nets
from _order import balanced_orders

import jonnx
from jonnx.cli._bench import FAULT_HINT_MIN

MODELS = {
    "resnet50": (nets.resnet50, (3, 224, 224)),
    "mobilenet_v2": (nets.mobilenet_v2, (3, 224, 224)),
    "efficientnet_b0": (nets.efficientnet_b0, (3, 224, 224)),
    "bert": (nets.bert_encoder, (128, 768)),
    "bert_int8": (lambda: nets.quantized(nets.bert_encoder()), (128, 768)),
    "mnist": (nets.mnist, (1, 28, 28)),
}


NO_HAND = ("efficientnet_b0", "mnist")


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_inference(name: str, batches: list[int], repeats: int) -> list[tuple]:
    import onnxruntime as ort  # here, so that the training steps run without it (gpu_check.py)

    build, shape = MODELS[name]
    proto = build()
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    # There is no hand-written EfficientNet or MNIST network (not targets).
    hand = None if name in NO_HAND else hand_jax.inference(proto)
    rows = []
    for batch in batches:
        x = np.random.default_rng(0).standard_normal((batch, *shape)).astype(np.float32)
        r = _bench_batch(proto, session, hand, x, repeats)
        rows.append((name, batch, r))
        med = r["median"]
        hand_ms = f"{med['hand'] * 1e3:>9.1f}" if hand else f"{'-':>9}"
        vs_hand = f"{med['jonnx'] / med['hand']:>8.2f}" if hand else f"{'-':>8}"
        hand_err = f"{r['hand_err']:>9.1e}" if hand else f"{'-':>9}"
        hand_1st = f"{r['hand_first_s']:>8.2f}" if hand else f"{'-':>8}"
        print(
            f"{name:<16}{batch:>4}{r['load_s']:>6.2f}{r['first_s']:>7.2f}{hand_1st}"
            f"{med['jonnx'] * 1e3:>9.1f}{med['plain'] * 1e3:>9.1f}{hand_ms}{med['ort'] * 1e3:>9.1f}"
            f"{med['jonnx'] / med['ort']:>8.2f}{med['plain'] / med['ort']:>8.2f}{vs_hand}"
            f"{r['err']:>9.1e}{hand_err}",
            flush=True,
        )
        if r["faults"] >= FAULT_HINT_MIN:  # as many as make `jonnx bench` advise the tunable
            print(f"  jonnx's call at batch {batch}: {r['faults']:,.0f} minor page faults", flush=True)
    return rows


def _rel_err(got, want) -> float:
    return float(np.max(np.abs(np.asarray(got) - want)) / (np.max(np.abs(want)) + 1e-12))


def _bench_batch(proto, session, hand, x, repeats: int) -> dict:
    """Load and first-call times, median call times by runtime, relative errors against onnxruntime."""
    input_name = session.get_inputs()[0].name
    start = time.perf_counter()
    model = jonnx.load(proto)
    load_s = time.perf_counter() - start
    model(x)[0].block_until_ready()
    first_s = time.perf_counter() - start - load_s
    want = session.run(None, {input_name: x})[0]
    out = {"load_s": load_s, "first_s": first_s, "err": _rel_err(model(x)[0], want)}
    plain = jonnx.load(proto, optimize=False)
    plain(x)[0].block_until_ready()
    calls = {
        "jonnx": lambda: model(x)[0].block_until_ready(),
        "plain": lambda: plain(x)[0].block_until_ready(),
        "ort": lambda: session.run(None, {input_name: x}),
    }
    if hand is not None:
        out["hand_first_s"] = _timed(lambda: hand(x).block_until_ready())
        out["hand_err"] = _rel_err(hand(x), want)
        calls["hand"] = lambda: hand(x).block_until_ready()
    out["median"] = _alternate(calls, repeats)
    out["faults"] = _page_faults(calls["jonnx"])
    return out


def _page_faults(call, n: int = 3) -> float:
    """Minor page faults per call: the first touches of the memory XLA maps afresh for each
    call's temporaries when they are large (docs/performance.md, "Large batches")."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(n):
        call()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / n


_BLOCK = 3  # timed calls per engine per round, after one untimed call


def _alternate(fns: dict, repeats: int) -> dict[str, float]:
    """Median seconds per call of each function, over ``repeats`` rounds of blocks.

    Each round calls every function in turn, in a block: one untimed call, then ``_BLOCK``
    timed ones, back to back, as a user calling a model in a loop would. A call right after
    another engine's is not representative: onnxruntime's worker threads keep spinning after
    it returns, and an engine called after a pause runs colder (MobileNetV2 batch 1:
    onnxruntime 11.4 against 4.5 ms, jonnx 15.8 against 9.9). The order of the blocks changes
    every round so that each engine follows each other equally often (``_order``): use a
    multiple of ``len(fns)`` rounds (``2 * len(fns)`` for an odd count) for a full design.
    """
    times = {k: [] for k in fns}
    names = list(fns)
    orders = balanced_orders(len(names))
    for r in range(repeats):
        for k in (names[i] for i in orders[r % len(orders)]):
            fns[k]()
            times[k].extend(_timed(fns[k]) for _ in range(_BLOCK))
    return {k: statistics.median(v) for k, v in times.items()}


class _TorchSteps:
    """A torch baseline script in ``--serve`` mode: one process per thread setting, each timing
    one step per call, so torch's steps alternate with jonnx's under the same machine load.

    torch runs in its own processes (it is never imported next to jonnx), once with its default
    threads and once with one (on a shared machine its thread pool suffers).
    """

    def __init__(self, script: str, torch_python: str, weights: str):
        path = pathlib.Path(__file__).resolve().parent / script
        self.procs, self.losses = {}, {}
        for threads in (None, "1"):
            label = "torch eager" + (" 1 thread" if threads else "")
            env = dict(os.environ, **({"OMP_NUM_THREADS": threads} if threads else {}))
            proc = subprocess.Popen(
                [torch_python, str(path), "--weights", weights, "--serve"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=env,
            )
            first = proc.stdout.readline().split()
            if len(first) != 2 or first[0] != "torch_loss":
                proc.kill()
                raise RuntimeError(f"{script} ({label}) did not start: it printed {first}")
            self.procs[label], self.losses[label] = proc, float(first[1])

    def step_fns(self) -> dict:
        def step(proc):
            proc.stdin.write("step\n")
            proc.stdin.flush()
            float(proc.stdout.readline())

        return {label: (lambda proc=proc: step(proc)) for label, proc in self.procs.items()}

    def close(self) -> None:
        for proc in self.procs.values():
            proc.stdin.close()
            proc.wait()


def _report_torch(torch: _TorchSteps, med: dict[str, float], j: float, h: float) -> None:
    for label, value in torch.losses.items():
        ms = med[label] * 1e3
        print(
            f"  {label} {ms:.0f} ms, 1st loss {value:.6f}: jonnx/torch {j / ms:.2f}, hand/torch {h / ms:.2f}",
            flush=True,
        )


def _sgd_momentum(params, velocity, grads, lr=0.01, momentum=0.9):
    """SGD with momentum as torch.optim.SGD does it (no dampening, no weight decay)."""
    import jax

    velocity = jax.tree_util.tree_map(lambda v, g: momentum * v + g, velocity, grads)
    return jax.tree_util.tree_map(lambda p, v: p - lr * v, params, velocity), velocity


def _cross_entropy(logits, labels):
    import jax
    import jax.numpy as jnp

    logp = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=1))


# The CNN training steps: (the proto's builder, batch, image size, classes, PyTorch baseline script).
CNN_STEPS = {
    "resnet18": (lambda: nets.resnet18(size=64, classes=10), 32, 64, 10, "torch_resnet18_step.py"),
    "mobilenet_v2": (nets.mobilenet_v2, 16, 224, 1000, "torch_mobilenet_v2_step.py"),
}


def cnn_steps(name: str = "resnet18") -> tuple[dict, np.ndarray, np.ndarray, onnx.ModelProto]:
    """A CNN's SGD-momentum steps (BN in training mode; ``CNN_STEPS`` gives the batch), jonnx's
    and the hand-written ``lax.conv`` one: ``({name: (jitted step, carry)}, x, labels, proto)``,
    where ``step(*carry, x, labels)`` returns the new carry followed by the loss."""
    import jax
    import jax.numpy as jnp

    build, batch, size, classes, _ = CNN_STEPS[name]
    proto = build()
    model = jonnx.load(proto)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, 3, size, size)).astype(np.float32)
    labels = rng.integers(0, classes, batch)

    def jonnx_loss(params, state, x, labels):
        (logits,), new_state = model.apply(params, x, state=state, train=True)
        return _cross_entropy(logits, labels), new_state

    hand_params, hand_state, hand_forward = hand_jax.resnet_train_fns(proto)

    def hand_loss(params, state, x, labels):
        logits, new_state = hand_forward(params, state, x)
        return _cross_entropy(logits, labels), new_state

    def make_step(loss, jit):
        @jit
        def step(params, velocity, state, x, labels):
            (value, new_state), grads = jax.value_and_grad(loss, has_aux=True)(params, state, x, labels)
            params, velocity = _sgd_momentum(params, velocity, grads)
            return params, velocity, new_state, value

        return step

    steps = {}
    for label, loss, params, state, jit in [
        ("jonnx", jonnx_loss, model.params, model.state, jonnx.jit),
        ("hand", hand_loss, hand_params, hand_state, jax.jit),
    ]:
        steps[label] = (make_step(loss, jit), [params, jax.tree_util.tree_map(jnp.zeros_like, params), state])
    return steps, x, labels, proto


def _bench_train_cnn(name: str, repeats: int, torch_python: str | None) -> None:
    """A CNN's SGD-momentum step (``CNN_STEPS``): jonnx, hand-written lax.conv, torch."""
    _, batch, size, _, script = CNN_STEPS[name]
    steps, x, labels, proto = cnn_steps(name)
    runs = {label: _first_step(step, carry, x, labels) for label, (step, carry) in steps.items()}
    arrays = dict(x=x, labels=labels, **hand_jax.torch_resnet_weights(proto)) if torch_python else {}
    med, torch = _time_steps(runs, repeats, torch_python, script, arrays)
    j, h = med["jonnx"] * 1e3, med["hand"] * 1e3
    print(
        f"{name} train step b{batch} {size}x{size} SGD momentum: jonnx {j:.0f} ms (compile {runs['jonnx'][1]:.1f} s, "
        f"1st loss {runs['jonnx'][2]:.6f}), hand lax.conv NHWC {h:.0f} ms (compile {runs['hand'][1]:.1f} s, "
        f"1st loss {runs['hand'][2]:.6f}): jonnx/hand {j / h:.2f}",
        flush=True,
    )
    if torch:
        _report_torch(torch, med, j, h)


def bench_train_resnet18(repeats: int, torch_python: str | None = None) -> None:
    """ResNet-18 SGD-momentum step (batch 32, 64x64, BN in training mode): jonnx, hand-written lax.conv, torch."""
    _bench_train_cnn("resnet18", repeats, torch_python)


def bench_train_mobilenet_v2(repeats: int, torch_python: str | None = None) -> None:
    """MobileNetV2 SGD-momentum step (batch 16, 224x224, BN in training mode): jonnx, hand-written, torch."""
    _bench_train_cnn("mobilenet_v2", repeats, torch_python)


# The BERT fine-tuning step: the nets.py encoder (4 layers, hidden 768, seq 128) plus a
# classification head on the first token, batch 8, 2 classes, AdamW (lr 1e-4, weight decay
# 0.01, torch's and optax's other defaults agree), every encoder weight trained.
BERT_BATCH, BERT_CLASSES = 8, 2


def bert_steps() -> tuple[dict, np.ndarray, np.ndarray, dict, onnx.ModelProto]:
    """The BERT fine-tuning steps, jonnx's and the hand-written one, as :func:`cnn_steps`
    gives them, plus the classification head's weights: ``(steps, x, labels, head, proto)``."""
    import jax
    import optax

    proto = nets.bert_encoder()
    model = jonnx.load(proto)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BERT_BATCH, 128, 768)).astype(np.float32)
    labels = rng.integers(0, BERT_CLASSES, BERT_BATCH)
    head = {
        "head.weight": (rng.standard_normal((768, BERT_CLASSES)) / np.sqrt(768)).astype(np.float32),
        "head.bias": np.zeros(BERT_CLASSES, np.float32),
    }
    # The trained encoder weights: the linears and LayerNorms (the graph's scalar constants,
    # e.g. the attention scale, stay constants, as they are buffers in torch).
    hand_params, hand_forward = hand_jax.bert_train_fns(proto)
    trained = {**hand_params, **head}

    def classify(hidden, params):
        return hidden[:, 0] @ params["head.weight"] + params["head.bias"]

    def jonnx_loss(params, x, labels):
        (hidden,) = model.apply({k: v for k, v in params.items() if not k.startswith("head.")}, x)
        return _cross_entropy(classify(hidden, params), labels)

    def hand_loss(params, x, labels):
        return _cross_entropy(classify(hand_forward(params, x), params), labels)

    optimizer = optax.adamw(1e-4, weight_decay=0.01)
    steps = {}
    for name, loss, jit in [("jonnx", jonnx_loss, jonnx.jit), ("hand", hand_loss, jax.jit)]:

        @jit
        def step(params, opt_state, x, labels, loss=loss):
            value, grads = jax.value_and_grad(loss)(params, x, labels)
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, value

        steps[name] = (step, [jax.tree_util.tree_map(jax.numpy.asarray, trained), optimizer.init(trained)])
    return steps, x, labels, head, proto


def bench_train_bert(repeats: int, torch_python: str | None = None) -> None:
    steps, x, labels, head, proto = bert_steps()
    runs = {name: _first_step(step, carry, x, labels) for name, (step, carry) in steps.items()}
    arrays = dict(x=x, labels=labels, **hand_jax.torch_bert_weights(proto), **head) if torch_python else {}
    med, torch = _time_steps(runs, repeats, torch_python, "torch_bert_step.py", arrays)
    j, h = med["jonnx"] * 1e3, med["hand"] * 1e3
    print(
        f"bert fine-tune step b{BERT_BATCH} seq128 AdamW: jonnx {j:.0f} ms (compile {runs['jonnx'][1]:.1f} s, "
        f"1st loss {runs['jonnx'][2]:.6f}), hand JAX {h:.0f} ms (compile {runs['hand'][1]:.1f} s, "
        f"1st loss {runs['hand'][2]:.6f}): jonnx/hand {j / h:.2f}",
        flush=True,
    )
    if torch:
        _report_torch(torch, med, j, h)


def _first_step(step, carry: list, x, labels) -> tuple:
    """Run a training step's first (compiling) call: ``(run, compile seconds, first loss)``.

    ``step(*carry, x, labels)`` returns the new carry followed by the loss; ``run`` takes one
    more step from where the last left off.
    """
    import jax

    start = time.perf_counter()
    first = step(*carry, x, labels)
    jax.block_until_ready(first)
    compile_s = time.perf_counter() - start

    def run():
        carry[:] = step(*carry, x, labels)[: len(carry)]
        jax.block_until_ready(carry)

    return run, compile_s, float(first[len(carry)])


def _time_steps(runs: dict, repeats: int, torch_python: str | None, script: str, arrays: dict):
    """Median seconds of each run's step, alternating, with PyTorch's steps (``script`` fed
    ``arrays``: the same weights and batch, through a temporary .npz) when ``torch_python`` is
    given. Returns the medians and the torch runner (None without torch)."""
    with tempfile.TemporaryDirectory() as tmp:
        torch = None
        if torch_python:
            weights = os.path.join(tmp, "weights.npz")
            np.savez(weights, **arrays)
            torch = _TorchSteps(script, torch_python, weights)
        try:
            fns = {k: v[0] for k, v in runs.items()} | (torch.step_fns() if torch else {})
            return _alternate(fns, repeats), torch
        finally:
            if torch:
                torch.close()


TRAIN = {"resnet18": bench_train_resnet18, "bert": bench_train_bert, "mobilenet_v2": bench_train_mobilenet_v2}


HEADER = (
    f"{'model':<16}{'b':>4}{'load':>6}{'1st':>7}{'hand1st':>8}{'jonnx ms':>9}{'plain ms':>9}{'hand ms':>9}"
    f"{'ort ms':>9}{'vs ort':>8}{'plain':>8}{'vs hand':>8}{'rel err':>9}{'hand err':>9}"
)
LEGEND = (
    "load = jonnx.load(proto) s, 1st = jonnx's first call (trace + compile) s, hand1st = the hand-written "
    "network's first call s; jonnx = default call (all optimizations), plain = optimize=False, hand = "
    "hand-written NHWC JAX with constant weights (benchmarks/hand_jax.py); vs ort = jonnx / onnxruntime, "
    "plain = plain / onnxruntime, vs hand = jonnx / hand; rel err = max |y - ort| / max |ort|; page faults: "
    "what XLA's freshly mapped temporaries cost each call (GLIBC_TUNABLES=glibc.malloc.hugetlb=1 avoids "
    "most: docs/performance.md, 'Large batches')"
)


def _peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--repeats", type=int, default=12)
    parser.add_argument(
        "--train",
        nargs="*",
        choices=list(TRAIN),
        help="training steps to time (all when named alone): ResNet-18, the BERT fine-tuning step, MobileNetV2",
    )
    parser.add_argument(
        "--isolate",
        action="store_true",
        help="run each model (and the training steps) in a fresh subprocess, so each peak RSS is that model's own",
    )
    parser.add_argument("--no-header", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--torch-python",
        help="a Python with torch, to time the same steps in PyTorch eager (separate process)",
    )
    args = parser.parse_args()
    if args.models and not args.no_header:
        print(HEADER, flush=True)
    if args.isolate:
        common = [
            sys.executable,
            __file__,
            "--no-header",
            "--batches",
            *map(str, args.batches),
            "--repeats",
            str(args.repeats),
        ]
        for name in args.models:
            subprocess.run([*common, "--models", name], check=False)
        torch = ["--torch-python", args.torch_python] if args.torch_python else []
        for name in [] if args.train is None else args.train or list(TRAIN):
            subprocess.run([*common, "--models", "--train", name, *torch], check=False)
        if args.models:
            print(LEGEND)
        return
    for name in args.models:
        bench_inference(name, args.batches, args.repeats)
        # ru_maxrss is the process's high-water mark: per model only with --isolate.
        print(f"  peak RSS after {name}: {_peak_rss_gib():.2f} GiB (process high-water mark)", flush=True)
    for name in [] if args.train is None else args.train or list(TRAIN):
        TRAIN[name](args.repeats, args.torch_python)
        print(f"  peak RSS after the {name} step: {_peak_rss_gib():.2f} GiB (process high-water mark)", flush=True)
    if args.models and not args.no_header:
        print(LEGEND)


if __name__ == "__main__":
    main()

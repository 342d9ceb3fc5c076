"""Recurrent layers (ONNX LSTM, GRU, RNN) against onnxruntime and the same layers written in JAX.

The networks are ``nets.recurrent``: two stacked layers over a time-major sequence, as
``torch.onnx.export`` writes ``nn.LSTM``/``nn.GRU``/``nn.RNN`` (seeded weights). For each network
and batch size it times, alternating in one process (``bench_acceptance._alternate``):

- inference: jonnx's default call (``jonnx.load(proto)`` then ``model(x)``), onnxruntime, and
  the hand-written JAX network (``hand_jax.recurrent_forward``, a plain ``lax.scan`` per
  direction, weights as compile-time constants);
- with ``--train``: a gradient step, ``value_and_grad`` of the mean square of the outputs with
  respect to every weight, through ``Model.apply`` and through the hand-written network (params
  as arguments), both compiled with ``jonnx.jit``; with ``--torch-python`` also PyTorch eager's
  ``nn.LSTM``/``nn.GRU``/``nn.RNN`` with the same weights and batch (torch_recurrent_step.py, in
  its own processes, its default threads and one), steps interleaved.

Prints medians (ms), ratios, first-call times and the largest difference from onnxruntime
(relative to its largest output). Speed is never asserted; docs/performance.md ("Recurrent
layers") records runs.

Usage: ``python benchmarks/bench_recurrent.py [--nets lstm gru rnn bilstm] [--batches 1 32]
[--repeats 12] [--train [--torch-python PATH]]``
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import bench_acceptance
import hand_jax
import nets

import jonnx

# name -> nets.recurrent arguments: PyTorch-sized sequence models.
NETS = {
    "lstm": {"kind": "LSTM", "inputs": 128, "hidden": 256, "seq": 100},
    "gru": {"kind": "GRU", "inputs": 128, "hidden": 256, "seq": 100},
    "rnn": {"kind": "RNN", "inputs": 64, "hidden": 128, "seq": 200},
    "bilstm": {"kind": "LSTM", "inputs": 64, "hidden": 128, "seq": 50, "bidirectional": True},
}


def _first(fn) -> float:
    """Seconds of the first call of ``fn`` (trace and compile included), waited for."""
    return bench_acceptance._timed(lambda: jax.block_until_ready(fn()))


def bench_inference(name: str, batch: int, repeats: int) -> None:
    import onnxruntime as ort

    proto = nets.recurrent(**NETS[name])
    seq, inputs = NETS[name]["seq"], NETS[name]["inputs"]
    x = np.random.default_rng(0).standard_normal((seq, batch, inputs)).astype(np.float32)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, {"x": x})[0]
    model, hand = jonnx.load(proto), hand_jax.inference(proto)
    first = _first(lambda: model(x)[0])
    hand_first = _first(lambda: hand(x))
    med = bench_acceptance._alternate(
        {
            "jonnx": lambda: model(x)[0].block_until_ready(),
            "ort": lambda: session.run(None, {"x": x}),
            "hand": lambda: hand(x).block_until_ready(),
        },
        repeats,
    )
    errors = [bench_acceptance._rel_err(got, want) for got in (model(x)[0], hand(x))]
    print(
        f"{name:<8}{batch:>4}{first:>7.2f}{hand_first:>9.2f}{med['jonnx'] * 1e3:>9.2f}{med['ort'] * 1e3:>9.2f}"
        f"{med['hand'] * 1e3:>9.2f}{med['jonnx'] / med['ort']:>8.2f}{med['hand'] / med['ort']:>9.2f}"
        f"{med['jonnx'] / med['hand']:>8.2f}{errors[0]:>9.1e}{errors[1]:>9.1e}",
        flush=True,
    )


def bench_train(name: str, batch: int, repeats: int, torch_python: str | None = None) -> None:
    proto = nets.recurrent(**NETS[name])
    seq, inputs = NETS[name]["seq"], NETS[name]["inputs"]
    x = jnp.asarray(np.random.default_rng(0).standard_normal((seq, batch, inputs)).astype(np.float32))
    model = jonnx.load(proto)
    layers = hand_jax.recurrent_params(proto)
    hand_params = [{k: jnp.asarray(v) for k, v in layer.items() if k != "kind"} for layer in layers]
    kinds = [layer["kind"] for layer in layers]

    def jonnx_loss(params):
        return jnp.mean(model.apply(params, x)[0] ** 2)

    def hand_loss(params):
        return jnp.mean(hand_jax.recurrent_forward([{"kind": k, **p} for k, p in zip(kinds, params)], x) ** 2)

    steps = {
        "jonnx": (jonnx.jit(jax.value_and_grad(jonnx_loss)), model.params),
        "hand": (jonnx.jit(jax.value_and_grad(hand_loss)), hand_params),
    }
    first = {k: _first(lambda k=k: steps[k][0](steps[k][1])) for k in steps}
    loss = {k: float(steps[k][0](steps[k][1])[0]) for k in steps}
    runs = {k: (lambda k=k: jax.block_until_ready(steps[k][0](steps[k][1])),) for k in steps}
    arrays = dict(x=np.asarray(x), **hand_jax.torch_recurrent_weights(proto)) if torch_python else {}
    med, torch = bench_acceptance._time_steps(runs, repeats, torch_python, "torch_recurrent_step.py", arrays)
    print(
        f"{name:<8}{batch:>4}{first['jonnx']:>7.2f}{first['hand']:>9.2f}{med['jonnx'] * 1e3:>9.2f}"
        f"{med['hand'] * 1e3:>9.2f}{med['jonnx'] / med['hand']:>8.2f}   loss {loss['jonnx']:.7f} / {loss['hand']:.7f}",
        flush=True,
    )
    for label, value in (torch.losses if torch else {}).items():
        ms = med[label] * 1e3
        print(f"  {label} {ms:.2f} ms, loss {value:.7f}: jonnx/torch {med['jonnx'] * 1e3 / ms:.2f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nets", nargs="*", default=list(NETS), choices=list(NETS))
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--repeats", type=int, default=12)
    parser.add_argument("--train", action="store_true", help="also time a gradient step against hand-written JAX")
    parser.add_argument(
        "--torch-python", help="with --train: a Python with torch, to time the same step in PyTorch eager too"
    )
    args = parser.parse_args()
    print(f"jax {jax.__version__}, {jax.default_backend()}; medians of {args.repeats} rounds")
    print(
        f"{'net':<8}{'b':>4}{'1st s':>7}{'hand 1st':>9}{'jonnx ms':>9}{'ort ms':>9}{'hand ms':>9}"
        f"{'vs ort':>8}{'hand/ort':>9}{'vs hand':>8}{'rel err':>9}{'hand err':>9}"
    )
    for name in args.nets:
        for batch in args.batches:
            bench_inference(name, batch, args.repeats)
    if args.train:
        print(
            f"\ngradient steps\n{'net':<8}{'b':>4}{'1st s':>7}{'hand 1st':>9}{'jonnx ms':>9}{'hand ms':>9}{'vs hand':>8}"
        )
        for name in args.nets:
            for batch in args.batches:
                bench_train(name, batch, args.repeats, args.torch_python)


if __name__ == "__main__":
    main()

"""Where jonnx's default call loses time on a GPU: host dispatch against device kernels.

``python benchmarks/gpu_calls.py [--out DIR] [--repeats 30]`` on a machine with a GPU and jax's
CUDA plugin (jonnx need not be installed: it is imported from this checkout, as in
gpu_check.py). For ResNet-50 and the BERT encoder (benchmarks/nets.py) at batch 1, and ResNet-50
at batch 32, each way of calling is timed alternating with the others, then traced with
``jax.profiler`` alone:

- ``default np`` / ``default dev``: ``Model(x)`` with a numpy input, and with the input already
  on the device;
- ``no layout``: ``jonnx.load(..., optimize={"channels_last": False})``;
- ``const weights``: ``jonnx.load(..., optimize={"constant_weights": True})``;
- ``apply args``: ``jax.jit(model.apply)(model.params, x)``;
- ``hand dev`` / ``hand np``: the same network written by hand in JAX (benchmarks/hand_jax.py,
  NHWC, weights as constants).

Columns: the median wall time of a call to its result (``block_until_ready``), the median host
time a call takes to return before its result is ready (dispatch: Python, argument handling,
the launch), and from the trace, per call, the GPU kernels' summed time and count. A call whose
wall time is near its kernel time is bound by the device; one near its host time, by dispatch.
With ``--out`` a text summary is written there.

XLA's GPU flags change the launch side: ``XLA_FLAGS=--xla_gpu_graph_min_graph_size=1`` puts
the short runs of kernels between cuDNN convolutions into CUDA graphs too, and
``XLA_FLAGS=--xla_gpu_enable_command_buffer=`` turns the graphs off (docs/performance.md,
"On a GPU").
"""

from __future__ import annotations

import argparse
import glob
import pathlib
import statistics
import sys
import tempfile
import time

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def _kernel_summary(trace_dir: str, calls: int) -> tuple[float, float, list[tuple[str, float, int]]]:
    """Per call: summed GPU kernel time (ms), kernel count, and the top kernels by time."""
    import jax

    files = sorted(glob.glob(f"{trace_dir}/**/*.xplane.pb", recursive=True))
    if not files:
        return float("nan"), float("nan"), []
    data = jax.profiler.ProfileData.from_file(files[-1])
    total_ns, count, by_name, gpu = 0.0, 0, {}, False
    for plane in data.planes:
        if not plane.name.startswith("/device:GPU"):
            continue
        gpu = True
        for line in plane.lines:
            # Kernels sit on the stream lines; "XLA Ops"/"XLA Modules" lines repeat them by name.
            if not line.name.lower().startswith("stream"):
                continue
            for event in line.events:
                total_ns += event.duration_ns
                count += 1
                t, n = by_name.get(event.name, (0.0, 0))
                by_name[event.name] = (t + event.duration_ns, n + 1)
    if not gpu:  # run on a CPU: no kernels to count
        return float("nan"), float("nan"), []
    top = sorted(((k, t / calls / 1e6, n // calls) for k, (t, n) in by_name.items()), key=lambda r: -r[1])
    return total_ns / calls / 1e6, count / calls, top[:12]


def _python_profile(model, x, say) -> None:
    """The default call's host time by Python function (cProfile, 30 calls)."""
    import cProfile
    import io
    import pstats

    profile = cProfile.Profile()
    for _ in range(30):
        profile.enable()
        y = model(x)[0]
        profile.disable()
        y.block_until_ready()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(8)
    say("   cProfile of 30 default calls (device input):")
    for line in text.getvalue().splitlines():
        if line.strip() and not line.startswith(("   Ordered", "   List")):
            say("   " + line.strip()[:120])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--traced", type=int, default=10, help="calls traced per variant")
    parser.add_argument("--out", default=None, help="folder for the summary")
    args = parser.parse_args()

    import jax
    from gpu_check import _import_jonnx

    jonnx = _import_jonnx()
    import hand_jax
    import nets

    out = pathlib.Path(args.out) if args.out else None
    lines: list[str] = []

    def say(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    say(f"jax {jax.__version__}, backend {jax.default_backend()}, devices {jax.devices()}")
    for name, build, shape, batch in [
        ("resnet50", nets.resnet50, (3, 224, 224), 1),
        ("bert", nets.bert_encoder, (128, 768), 1),
        ("resnet50", nets.resnet50, (3, 224, 224), 32),
    ]:
        proto = build()
        x = np.random.default_rng(0).standard_normal((batch, *shape)).astype(np.float32)
        xd = jax.device_put(x)
        start = time.perf_counter()
        model = jonnx.load(proto)
        model(xd)[0].block_until_ready()
        say(f"\n== {name} batch {batch}: load + first call {time.perf_counter() - start:.2f} s")
        no_layout = jonnx.load(proto, optimize={"channels_last": False})
        constant = jonnx.load(proto, optimize={"constant_weights": True})
        applied = jax.jit(model.apply)
        hand = hand_jax.inference(proto)
        variants = {
            "default np": lambda model=model, x=x: model(x)[0],
            "default dev": lambda model=model, xd=xd: model(xd)[0],
            "no layout": lambda no_layout=no_layout, xd=xd: no_layout(xd)[0],
            "const weights": lambda constant=constant, xd=xd: constant(xd)[0],
            "apply args": lambda applied=applied, model=model, xd=xd: applied(model.params, xd)[0],
            "hand dev": lambda hand=hand, xd=xd: hand(xd),
            "hand np": lambda hand=hand, x=x: hand(x),
        }
        reference = np.asarray(variants["hand dev"]())
        walls = {k: [] for k in variants}
        hosts = {k: [] for k in variants}
        for k, fn in variants.items():
            got = np.asarray(fn())  # compiles
            err = float(np.max(np.abs(got - reference)) / np.max(np.abs(reference)))
            if err > 1e-2:
                say(f"   {k}: differs from the hand-written network by {err:.1e}")
        for _ in range(args.repeats):
            for k, fn in variants.items():
                t0 = time.perf_counter()
                y = fn()
                t1 = time.perf_counter()
                y.block_until_ready()
                t2 = time.perf_counter()
                hosts[k].append(t1 - t0)
                walls[k].append(t2 - t0)
        say(f"{'call':<14} {'wall ms':>8} {'host ms':>8} {'kernels ms':>10} {'kernels':>8}")
        for k, fn in variants.items():
            with tempfile.TemporaryDirectory() as trace_dir:  # a CPU's traces take gigabytes
                with jax.profiler.trace(trace_dir):
                    for _ in range(args.traced):
                        fn().block_until_ready()
                kernel_ms, kernels, top = _kernel_summary(trace_dir, args.traced)
            say(
                f"{k:<14} {statistics.median(walls[k]) * 1e3:8.3f} {statistics.median(hosts[k]) * 1e3:8.3f} "
                f"{kernel_ms:10.3f} {kernels:8.0f}"
            )
            for kernel, ms, n in top[:6]:
                say(f"      {ms:7.3f} ms x{n:<3} {kernel[:90]}")
        if batch == 1:
            _python_profile(model, xd, say)
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

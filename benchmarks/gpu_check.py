"""A short GPU check of jonnx (a few minutes on one H100/H200, no network).

Run from the repository root on a machine with a GPU and jax's CUDA plugin:
``python benchmarks/gpu_check.py [--repeats 10] [--batches 1 32]``. Needs jax, jaxlib, numpy,
onnx and optax (onnxruntime optional: without it the CPU reference is the hand-written JAX
network run on the CPU). jonnx need not be installed: without it, it is imported from this
checkout (``ops/`` and ``training/`` mapped into the ``jonnx`` package as the install does).

What it checks, each step on its own (a failure prints its error and the rest go on):
1. the backend and devices;
2. that every Conv of ResNet-50 is lowered to ``lax.conv_general_dilated`` on the GPU (XLA's
   convolution is cuDNN's there; the CPU lowerings to dots must not be used): the picks of
   ``conv_lowering`` recorded during the default call's first trace, and the convolutions in
   ``apply``'s jaxpr; and what ``conv_lowering`` answers for a few shapes;
3. for ResNet-50 and the BERT encoder at each batch: jonnx's default call against the same
   network written by hand in JAX (benchmarks/hand_jax.py, NHWC, constant weights), alternating,
   medians, first-call times, and both outputs against a CPU reference (onnxruntime, else the
   hand-written network on the CPU): max |y - ref| / max |ref|. GPUs run float32 matmuls and
   convolutions in TF32 by default, so errors near 1e-3 are expected there; the last columns
   rerun jonnx with ``precision=HIGHEST`` to show they come from that;
4. a ResNet-18 training step (batch 32, 64x64, SGD momentum) in jonnx against the hand-written
   ``lax.conv`` step, and their first losses.
Ends with a table of everything that ran.
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import statistics
import sys
import time
import traceback

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))


def _import_jonnx():
    """jonnx, installed or else from this checkout (its ``ops``/``training`` folders as subpackages)."""
    try:
        import jonnx

        return jonnx
    except ImportError:
        # A half-done import (``jonnx`` found but not ``jonnx.ops``) leaves modules behind.
        for name in [n for n in sys.modules if n == "jonnx" or n.startswith("jonnx.")]:
            del sys.modules[name]
    spec = importlib.util.spec_from_file_location(
        "jonnx", ROOT / "jonnx" / "__init__.py", submodule_search_locations=[str(ROOT / "jonnx"), str(ROOT)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["jonnx"] = module
    spec.loader.exec_module(module)
    return module


RESULTS: list[tuple[str, str]] = []
START = time.perf_counter()
BUDGET_S = [210.0]  # steps that would start after this many seconds are skipped (--budget)


def step(title: str):
    """Run the decorated function now; print and record its failure instead of stopping."""

    def run(fn):
        print(f"\n== {title}", flush=True)
        start = time.perf_counter()
        if start - START > BUDGET_S[0]:
            print(f"   skipped: {start - START:.0f} s spent, over --budget {BUDGET_S[0]:.0f} s")
            RESULTS.append((title, "skipped (time budget)"))
            return fn
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 (one failure must not stop the other checks)
            traceback.print_exc()
            RESULTS.append((title, f"FAILED: {type(exc).__name__}: {exc}"[:200]))
        print(f"   ({time.perf_counter() - start:.1f} s)", flush=True)
        return fn

    return run


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _rel_err(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want)) / (np.max(np.abs(want)) + 1e-12))


def _count_primitive(jaxpr, name: str) -> int:
    """How many equations named ``name`` a jaxpr holds, inner jaxprs (pjit, custom_vjp) included."""
    count = 0
    for eqn in jaxpr.eqns:
        count += eqn.primitive.name == name
        for value in eqn.params.values():
            for sub in value if isinstance(value, (list, tuple)) else [value]:
                # Jaxpr and ClosedJaxpr by their fields (their module moved across jax versions).
                if hasattr(sub, "eqns"):
                    count += _count_primitive(sub, name)
                elif hasattr(getattr(sub, "jaxpr", None), "eqns"):
                    count += _count_primitive(sub.jaxpr, name)
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--skip-train", action="store_true")
    parser.add_argument("--no-ort", action="store_true", help="act as if onnxruntime were absent")
    parser.add_argument("--budget", type=float, default=210.0, help="start no step after this many seconds")
    args = parser.parse_args()
    BUDGET_S[0] = args.budget
    wall = time.perf_counter()

    import jax
    import jax.numpy as jnp

    jonnx = _import_jonnx()
    import hand_jax
    import nets

    try:
        import onnxruntime as ort
    except ImportError:
        ort = None
    if args.no_ort:
        ort = None
    cpu = jax.devices("cpu")[0]
    protos = {}

    @step("backend")
    def _():
        print(f"jax {jax.__version__}, backend {jax.default_backend()}, devices {jax.devices()}")
        print(f"jonnx from {pathlib.Path(jonnx.__file__).parent}, onnxruntime {ort.__version__ if ort else 'absent'}")
        RESULTS.append(("backend", f"{jax.default_backend()} {jax.devices()[0].device_kind}"))
        if jax.default_backend() == "cpu":
            print("WARNING: no GPU visible to jax: the checks below run on the CPU")

    @step("conv lowering on this backend")
    def _():
        from jonnx.ops import conv as conv_ops

        protos["resnet50"] = nets.resnet50()
        model = jonnx.load(protos["resnet50"])
        x = np.zeros((1, 3, 224, 224), np.float32)
        n_conv = sum(n.op_type == "Conv" for n in protos["resnet50"].graph.node)
        # The default call (Model(*inputs)) cannot be traced from outside (its own jit takes
        # compiler options), so its lowering choices are recorded while its first call traces;
        # apply's jaxpr is counted as well.
        picks = []
        original = conv_ops.conv_lowering

        def spy(*args, **kwargs):
            picks.append(original(*args, **kwargs))
            return picks[-1]

        conv_ops.conv_lowering = spy
        try:
            model(x)[0].block_until_ready()
        finally:
            conv_ops.conv_lowering = original
        jaxpr = jax.make_jaxpr(lambda x: model.apply(model.params, x))(x)
        n_xla = _count_primitive(jaxpr.jaxpr, "conv_general_dilated")
        on_gpu = jax.default_backend() != "cpu"
        # (A call may trace a Conv more than once: every pick must be XLA's, at least one per Conv.)
        ok = n_xla == n_conv and len(picks) >= n_conv and set(picks) == {"xla"}
        verdict = "ok" if ok or not on_gpu else "WRONG: expected every Conv on XLA's convolution"
        summary = {k: picks.count(k) for k in sorted(set(picks))}
        print(
            f"ResNet-50: {n_conv} Conv nodes; default call's conv_lowering picks {summary}; "
            f"{n_xla} lax.conv_general_dilated in apply's jaxpr: {verdict}"
        )
        RESULTS.append(("ResNet-50 Convs on lax.conv", f"call picks {summary}, apply {n_xla}/{n_conv}: {verdict}"))
        # What the lowering rule answers for a few shapes (its signature may grow a layout argument).
        for x_shape, w_shape, strides, group in [
            ((1, 64, 56, 56), (64, 64, 3, 3), (1, 1), 1),
            ((32, 256, 56, 56), (64, 256, 1, 1), (1, 1), 1),
            ((1, 96, 56, 56), (96, 1, 3, 3), (1, 1), 96),
        ]:
            try:
                picked = conv_ops.conv_lowering(x_shape, w_shape, strides, group, jnp.float32)
            except TypeError as exc:
                picked = f"(could not call conv_lowering: {exc})"
            print(f"  conv_lowering{x_shape, w_shape, strides, group} -> {picked}")

    def bench_model(name, shape):
        proto = protos.get(name) or {"resnet50": nets.resnet50, "bert": nets.bert_encoder}[name]()
        protos[name] = proto
        session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]) if ort else None
        hand = hand_jax.inference(proto)
        for batch in args.batches:

            @step(f"{name} batch {batch}")
            def _(batch=batch):
                x = np.random.default_rng(0).standard_normal((batch, *shape)).astype(np.float32)
                if session is not None:
                    ref = session.run(None, {session.get_inputs()[0].name: x})[0]
                else:
                    with jax.default_device(cpu):
                        ref = np.asarray(hand_jax.inference(proto)(x))
                start = time.perf_counter()
                model = jonnx.load(proto)
                y = model(x)[0].block_until_ready()
                first = time.perf_counter() - start
                hand_first = _timed(lambda: hand(x).block_until_ready())
                precise = model.apply(model.params, x, precision=jax.lax.Precision.HIGHEST)[0]
                calls = {"jonnx": lambda: model(x)[0].block_until_ready(), "hand": lambda: hand(x).block_until_ready()}
                times = {k: [] for k in calls}
                for _ in range(args.repeats):
                    for k, fn in calls.items():
                        times[k].append(_timed(fn))
                med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
                line = (
                    f"jonnx {med['jonnx']:.2f} ms (load+1st {first:.1f} s), hand {med['hand']:.2f} ms "
                    f"(1st {hand_first:.1f} s), jonnx/hand {med['jonnx'] / med['hand']:.2f}; rel err vs CPU "
                    f"{'ort' if session else 'hand'}: jonnx {_rel_err(y, ref):.1e}, hand {_rel_err(hand(x), ref):.1e}, "
                    f"jonnx HIGHEST {_rel_err(precise, ref):.1e}"
                )
                print(line)
                RESULTS.append((f"{name} b{batch}", line))

    @step("ResNet-50 / BERT inference")
    def _():
        for name, shape in [("resnet50", (3, 224, 224)), ("bert", (128, 768))]:
            try:
                bench_model(name, shape)
            except Exception as exc:  # noqa: BLE001 (building or loading failed: go on with the next model)
                traceback.print_exc()
                RESULTS.append((name, f"FAILED: {type(exc).__name__}: {exc}"[:200]))

    if not args.skip_train:

        @step("ResNet-18 training step b32 64x64")
        def _():
            import bench_acceptance

            # bench_acceptance prints its own line: jonnx and hand-written step times and first losses.
            bench_acceptance.bench_train_resnet18(args.repeats)
            RESULTS.append(("ResNet-18 train step", "see the line above"))

    print(f"\n== summary ({time.perf_counter() - wall:.0f} s in all)")
    for title, result in RESULTS:
        print(f"{title:<28} {result}")


if __name__ == "__main__":
    main()

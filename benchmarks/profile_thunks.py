"""Where a compiled call spends its time: XLA CPU thunks by kind, the dots by shape, the top thunks.

Profiles one of the acceptance benchmark's computations (bench_acceptance.py builds them):
jonnx's default call of a model at a batch size (``jonnx.load(proto)`` then ``model(x)``), or a
training step (``--train resnet18|mobilenet_v2|bert``: jonnx's, or ``--hand`` the hand-written one). It runs a
few warm calls, records ``--calls`` more with ``jax.profiler``, and reads the trace back
(``jax.profiler.ProfileData``) against the compiled HLO (XLA dumps it to a temporary folder), to
print per call:

- wall time; the thunks' trace events summed; the time within the calls when no thunk was
  running, credited to the last of XLA's own dots and convolutions started before it (they
  hand their work to the thread pool and return, so their events cover only the hand-off),
  or where none started, to the thunk that ended last before it;
- thunk time by kind (the HLO name without its number: ``ynn_fusion`` are YNNPACK's dots,
  ``dot``/``dot_general`` XLA's own, ``*_fusion`` elementwise and layout work,
  ``wrapped_reduce*`` reductions), each with its share;
- the dots grouped by output and left operand shape, with GFLOP/s;
- the slowest thunks with their shape and the JAX operation they came from.

Thunks of independent work run concurrently on XLA's threads, so on more than one core the
per-thunk times overlap and add up to more than the wall time. ``--one-core`` pins the process
to one CPU before JAX starts (XLA's pool follows the affinity): the thunks then run one at a
time and their times add up to the call.

Usage: ``python benchmarks/profile_thunks.py (--model bert --batch 1 | --train bert [--hand])
[--one-core] [--calls 3] [--top 25]``
"""

from __future__ import annotations

import argparse
import collections
import math
import os
import re
import shutil
import sys
import tempfile
import time


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    what = parser.add_mutually_exclusive_group(required=True)
    # bench_acceptance.MODELS's names: that module imports JAX, which must wait for the
    # affinity and XLA_FLAGS set in main().
    what.add_argument("--model", choices=["resnet50", "mobilenet_v2", "efficientnet_b0", "bert", "bert_int8", "mnist"])
    what.add_argument("--train", choices=["resnet18", "mobilenet_v2", "bert"])
    what.add_argument("--onnx", metavar="PATH", help="any ONNX file, on random inputs (symbolic dimensions 1)")
    parser.add_argument("--batch", type=int, default=1, help="inference batch size (with --model or --onnx)")
    parser.add_argument("--hand", action="store_true", help="profile the hand-written JAX step (with --train)")
    parser.add_argument("--one-core", action="store_true", help="pin to one CPU: thunks run one at a time")
    parser.add_argument("--calls", type=int, default=3, help="calls recorded (after 3 warm ones)")
    parser.add_argument("--top", type=int, default=25, help="slowest thunks listed")
    return parser.parse_args()


def _computation(args: argparse.Namespace):
    """``(run, label)``: ``run()`` makes one call of what is profiled and waits for it."""
    import bench_acceptance
    import jax
    import numpy as np

    import jonnx

    if args.model:
        build, shape = bench_acceptance.MODELS[args.model]
        model = jonnx.load(build())
        x = np.random.default_rng(0).standard_normal((args.batch, *shape)).astype(np.float32)

        def run():
            jax.block_until_ready(model(x))

        return run, f"{args.model} batch {args.batch}, the default call"
    if args.onnx:
        from jonnx.cli._common import random_inputs

        model = jonnx.load(args.onnx)
        inputs = random_inputs(model.graph, {}, np.random.default_rng(0), model.input_names, batch=args.batch)

        def run():
            jax.block_until_ready(model(**inputs))

        return run, f"{args.onnx} batch {args.batch}, the default call"
    if args.train == "bert":
        steps, x, labels = bench_acceptance.bert_steps()[:3]
    else:
        steps, x, labels = bench_acceptance.cnn_steps(args.train)[:3]
    step, carry = steps["hand" if args.hand else "jonnx"]

    def run():
        carry[:] = step(*carry, x, labels)[: len(carry)]
        jax.block_until_ready(carry)

    return run, f"{args.train} training step ({'hand-written' if args.hand else 'jonnx'})"


def _profiled_hlo(dump_dir: str, thunk_names: set[str]) -> str:
    """The compiled HLO, among those XLA dumped, whose instructions the traced thunks are (the
    one naming the most of them: names repeat across modules, not within one)."""
    import glob

    best, hits = "", -1
    for path in glob.glob(f"{dump_dir}/*after_optimizations.txt"):
        with open(path) as f:
            text = f.read()
        found = len(thunk_names & set(re.findall(r"^\s*(?:ROOT )?%([\w.\-]+) = ", text, re.M)))
        if found > hits:
            best, hits = text, found
    return best


# Trace events that are the executor's or the thread pool's bookkeeping, not a thunk's work.
_BOOKKEEPING = ("ThunkExecutor", "ThreadpoolListener", "SlinkyThreadPool", "end: ", "H2D", "D2H")


_CALL = "profile_thunks.call"  # the annotation around each profiled call


def _thunk_events(trace_dir: str) -> tuple[list[tuple[int, int, str]], list[tuple[int, int]]]:
    """``(start ns, end ns, thunk name)`` of every thunk run on XLA's threads in the trace,
    and ``(start ns, end ns)`` of each profiled call."""
    import glob

    import jax

    (path,) = glob.glob(f"{trace_dir}/**/*.xplane.pb", recursive=True)
    events, calls = [], []
    for plane in jax.profiler.ProfileData.from_file(path).planes:
        for line in plane.lines:
            for ev in line.events:
                if ev.name == _CALL:
                    calls.append((ev.start_ns, ev.start_ns + ev.duration_ns))
                elif line.name.startswith("tf_XLA") and not ev.name.startswith(_BOOKKEEPING):
                    events.append((ev.start_ns, ev.start_ns + ev.duration_ns, ev.name))
    return events, calls


# Thunks that hand their work to XLA's thread pool and return (XLA's own dots and
# convolutions): their events cover only the hand-off.
_HANDS_OFF = ("dot", "dot_general", "convolution")


def _kind(name: str) -> str:
    """A thunk's kind: its HLO name without the number."""
    return re.sub(r"[.\d]+$", "", name)


def _idle_after(events: list[tuple[int, int, str]], calls: list[tuple[int, int]]) -> dict[str, int]:
    """Nanoseconds within the calls when no thunk was running, credited to the thunk whose
    work it most likely was: the last hand-off (``_HANDS_OFF``) that started before the gap
    in the same call, whose work runs on the thread pool until the next thunk that needs it;
    without one, the thunk that ended last before the gap (then it is the executor's own time).
    Crediting every gap to the thunk that ended last put a weight-gradient dot's time on the
    small elementwise update that happened to run beside it (2,500 GFLOP/s for the dot)."""
    idle = collections.defaultdict(int)
    for call_start, call_end in calls:
        inside = sorted(e for e in events if call_start <= e[0] < call_end)
        latest = None  # the running event that ends last
        hand_off = None  # the last hand-off started
        for start, end, name in inside:
            if latest is not None and start > latest[1]:
                idle[(hand_off or latest)[2]] += start - latest[1]
            if latest is None or end > latest[1]:
                latest = (start, end, name)
            if _kind(name) in _HANDS_OFF:
                hand_off = (start, end, name)
    return idle


def _hlo_index(hlo: str) -> tuple[dict, dict]:
    """From the compiled HLO: each instruction's ``(shape, op, JAX op name, rest of its line)``,
    and each dot thunk's (a dot, or a fusion around one) ``(flops, output dims, left operand
    dims)``."""
    shapes, info = {}, {}
    for m in re.finditer(r"^\s*(?:ROOT )?%([\w.\-]+) = (\w+\[[\d,]*\])\S* (\w[\w-]*)\((.*)$", hlo, re.M):
        name, shape, op, rest = m.groups()
        shapes[name] = [int(d) for d in shape[shape.index("[") + 1 : -1].split(",") if d]
        meta = re.search(r'op_name="([^"]*)"', rest)
        info[name] = (shape, op, meta.group(1) if meta else "", rest)
    bodies = {m.group(1): m.group(2) for m in re.finditer(r"^%([\w.\-]+) \(.*?\{\n(.*?)\n\}", hlo, re.M | re.S)}

    def flops(line_name: str, rest: str):
        operands = re.match(r"%([\w.\-]+), %([\w.\-]+)\)", rest)
        contract = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", rest)
        if not operands or not contract or operands.group(1) not in shapes:
            return None
        lhs, out = shapes[operands.group(1)], shapes[line_name]
        k = math.prod(lhs[int(i)] for i in contract.group(1).split(",") if i)
        return 2 * math.prod(out) * k, out, lhs

    # Instructions inside fused computations are not thunks: their fusion is.
    fused = {
        called
        for _, op, _, rest in info.values()
        if op == "fusion"
        for called in re.findall(r"calls=%([\w.\-]+)", rest)
    }
    inside = {n for c in fused for n in re.findall(r"%([\w.\-]+) = ", bodies.get(c, ""))}
    dots = {}
    for name, (_, op, _, rest) in info.items():
        if name in inside:
            continue
        if op == "dot":
            dots[name] = flops(name, rest)
        elif op == "fusion" and (called := re.search(r"calls=%([\w.\-]+)", rest)):
            inner = re.findall(r"%([\w.\-]+) = \S+ dot\(", bodies.get(called.group(1), ""))
            if inner:
                dots[name] = flops(inner[0], info[inner[0]][3])
    return info, {k: v for k, v in dots.items() if v}


def main() -> None:
    args = _parse_args()
    if args.one_core:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    # XLA writes each compiled module's HLO here, where the thunks' names are looked up (the
    # default call compiles inside the model, out of reach of .lower()).
    dump_dir = tempfile.mkdtemp(prefix="jonnx-hlo-")
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_dump_to={dump_dir} --xla_dump_hlo_as_text"
    import jax

    try:
        run, label = _computation(args)
        for _ in range(3):
            run()
        with tempfile.TemporaryDirectory() as trace_dir:
            jax.profiler.start_trace(trace_dir)
            start = time.perf_counter()
            for _ in range(args.calls):
                with jax.profiler.TraceAnnotation(_CALL):
                    run()
            wall = (time.perf_counter() - start) / args.calls
            jax.profiler.stop_trace()
            events, calls = _thunk_events(trace_dir)
        if not events:
            sys.exit("no XLA thunk events in the trace (not the CPU backend?)")
        hlo = _profiled_hlo(dump_dir, {name for _, _, name in events})
    finally:
        shutil.rmtree(dump_dir, ignore_errors=True)
    dot_library = "YNNPACK's dots" if "__ynn_fusion" in hlo else "XLA's own dots"
    info, dots = _hlo_index(hlo)
    per_call = 1e6 * args.calls  # ns summed over the calls -> ms per call
    own = collections.defaultdict(int)
    for s, e, name in events:
        own[name] += e - s
    idle = _idle_after(events, calls)
    by_name = {name: own[name] + idle.get(name, 0) for name in own}
    cores = len(os.sched_getaffinity(0))
    print(f"{label} ({dot_library}): {wall * 1e3:.1f} ms per call with the profiler on, {cores} core(s)")
    print(f"  thunk events, summed over threads: {sum(own.values()) / per_call:.1f} ms per call")
    print(
        f"  no thunk running, credited to the hand-off or thunk before: {sum(idle.values()) / per_call:.1f} ms per call"
    )
    print("  (the times below are events plus that credit)")

    kinds = collections.defaultdict(int)
    for name, ns in by_name.items():
        kinds[_kind(name)] += ns
    total = sum(kinds.values())
    print("\nby kind                          ms/call  share")
    for kind, ns in sorted(kinds.items(), key=lambda kv: -kv[1])[:15]:
        print(f"  {kind:<30}{ns / per_call:>9.1f}{ns / total:>7.0%}")

    groups = collections.defaultdict(lambda: [0, 0, 0])
    for name, (fl, out, lhs) in dots.items():
        group = groups[(tuple(out), tuple(lhs))]
        group[0] += by_name.get(name, 0)
        group[1] += fl * args.calls
        group[2] += 1
    print("\ndots: output <- left operand      count  ms/call  GFLOP/call  GFLOP/s")
    for (out, lhs), (ns, fl, count) in sorted(groups.items(), key=lambda kv: -kv[1][0])[:15]:
        rate = f"{fl / ns:>9.0f}" if ns else f"{'-':>9}"
        print(
            f"  {str(list(out)):<16} <- {str(list(lhs)):<16}{count:>4}{ns / per_call:>9.1f}"
            f"{fl / args.calls / 1e9:>12.2f}{rate}"
        )

    print(f"\nslowest {args.top} thunks                   ms/call  shape                       from")
    for name, ns in sorted(by_name.items(), key=lambda kv: -kv[1])[: args.top]:
        shape, _, op_name, _ = info.get(name, ("?", "", "", ""))
        print(f"  {name:<36}{ns / per_call:>7.2f}  {shape:<28}{op_name[:60]}")


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()

"""Where a compiled call spends its time: XLA CPU thunks by kind, the dots by shape, the top thunks.

Profiles one of the acceptance benchmark's computations (bench_acceptance.py builds them):
jonnx's inference call of a model at a batch size (compiled as ``Model(*inputs)`` compiles it:
``Model.apply`` under ``jonnx.jit``, with the dot library ``library_dots_for`` picks), or a
training step (``--train resnet18|bert``: jonnx's, or ``--hand`` the hand-written one). It runs a
few warm calls, records ``--calls`` more with ``jax.profiler``, and reads the trace back
(``jax.profiler.ProfileData``) against the compiled HLO, to print per call:

- wall time, and the time some thunk was running (the rest is dispatch and gaps);
- thunk time by kind (the HLO name without its number: ``ynn_fusion`` are YNNPACK's dots,
  ``dot``/``dot_general`` XLA's own, ``*_fusion`` elementwise and layout work,
  ``wrapped_reduce*`` reductions), each with its share;
- the dots grouped by output and left operand shape, with GFLOP/s;
- the slowest thunks with their shape and the JAX operation they came from.

Thunks of independent work run concurrently on XLA's threads, so on more than one core the
per-thunk times overlap and add up to more than the wall time, and XLA's own dots, which hand
their work to the thread pool, can show only part of theirs (GFLOP/s above the machine's peak
are that). ``--one-core`` pins the process to one CPU before JAX starts (XLA's pool follows the
affinity): the thunks then run one at a time and their times add up to the call.

Usage: ``python benchmarks/profile_thunks.py (--model bert --batch 1 | --train bert [--hand])
[--one-core] [--calls 3] [--top 25]``
"""

from __future__ import annotations

import argparse
import collections
import math
import os
import re
import sys
import tempfile
import time


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--model", choices=["resnet50", "mobilenet_v2", "bert", "bert_int8"])
    what.add_argument("--train", choices=["resnet18", "bert"])
    parser.add_argument("--batch", type=int, default=1, help="inference batch size (with --model)")
    parser.add_argument("--hand", action="store_true", help="profile the hand-written JAX step (with --train)")
    parser.add_argument("--one-core", action="store_true", help="pin to one CPU: thunks run one at a time")
    parser.add_argument("--calls", type=int, default=3, help="calls recorded (after 3 warm ones)")
    parser.add_argument("--top", type=int, default=25, help="slowest thunks listed")
    return parser.parse_args()


def _computation(args: argparse.Namespace):
    """``(run, compiled HLO text, label)``: ``run()`` makes one call and waits for it."""
    import bench_acceptance
    import jax
    import numpy as np

    import jonnx
    from jonnx import _jit

    if args.model:
        build, shape = bench_acceptance.MODELS[args.model]
        model = jonnx.load(build())
        x = np.random.default_rng(0).standard_normal((args.batch, *shape)).astype(np.float32)
        library = _jit.library_dots_for(jax.make_jaxpr(model.apply)(model.params, x).jaxpr)
        fn = jonnx.jit(model.apply, compiler_options=_jit.compiler_options(library_dots=library))

        def run():
            jax.block_until_ready(fn(model.params, x))

        hlo = fn.lower(model.params, x).compile().as_text()
        dots = "YNNPACK's" if library else "XLA's own"
        return run, hlo, f"{args.model} batch {args.batch} inference ({dots} dots)"
    build = {"resnet18": bench_acceptance.resnet18_steps, "bert": bench_acceptance.bert_steps}[args.train]
    steps, x, labels = build()[:3]
    step, carry = steps["hand" if args.hand else "jonnx"]

    def run():
        carry[:] = step(*carry, x, labels)[: len(carry)]
        jax.block_until_ready(carry)

    hlo = step.lower(*carry, x, labels).compile().as_text()
    return run, hlo, f"{args.train} training step ({'hand-written' if args.hand else 'jonnx'})"


# Trace events that are the executor's or the thread pool's bookkeeping, not a thunk's work.
_BOOKKEEPING = ("ThunkExecutor", "ThreadpoolListener", "SlinkyThreadPool", "end: ", "H2D", "D2H")


def _thunk_events(trace_dir: str) -> list[tuple[int, int, str]]:
    """``(start ns, end ns, thunk name)`` of every thunk run on XLA's threads in the trace."""
    import glob

    import jax

    (path,) = glob.glob(f"{trace_dir}/**/*.xplane.pb", recursive=True)
    events = []
    for plane in jax.profiler.ProfileData.from_file(path).planes:
        for line in plane.lines:
            if not line.name.startswith("tf_XLA"):
                continue
            for ev in line.events:
                if not ev.name.startswith(_BOOKKEEPING):
                    events.append((ev.start_ns, ev.start_ns + ev.duration_ns, ev.name))
    return events


def _covered(intervals: list[tuple[int, int]]) -> int:
    """Nanoseconds covered by the union of the intervals."""
    total, end = 0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


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
            inner = [n for n in re.findall(r"%([\w.\-]+) = \S+ dot\(", bodies.get(called.group(1), ""))]
            if inner:
                dots[name] = flops(inner[0], info[inner[0]][3])
    return info, {k: v for k, v in dots.items() if v}


def main() -> None:
    args = _parse_args()
    if args.one_core:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    import jax

    run, hlo, label = _computation(args)
    for _ in range(3):
        run()
    with tempfile.TemporaryDirectory() as trace_dir:
        jax.profiler.start_trace(trace_dir)
        start = time.perf_counter()
        for _ in range(args.calls):
            run()
        wall = (time.perf_counter() - start) / args.calls
        jax.profiler.stop_trace()
        events = _thunk_events(trace_dir)
    if not events:
        sys.exit("no XLA thunk events in the trace (not the CPU backend?)")
    info, dots = _hlo_index(hlo)
    per_call = 1e6 * args.calls  # ns summed over the calls -> ms per call
    by_name = collections.defaultdict(int)
    for s, e, name in events:
        by_name[name] += e - s
    cores = len(os.sched_getaffinity(0))
    print(f"{label}: {wall * 1e3:.1f} ms per call with the profiler on, {cores} core(s)")
    print(f"  some thunk running: {_covered([(s, e) for s, e, _ in events]) / per_call:.1f} ms per call")
    print(f"  thunk time summed over threads: {sum(by_name.values()) / per_call:.1f} ms per call")

    kinds = collections.defaultdict(int)
    for name, ns in by_name.items():
        kinds[re.sub(r"[.\d]+$", "", name)] += ns
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

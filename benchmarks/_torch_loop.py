"""The command line and timing loop the torch baseline scripts share (no torch import here).

``arguments(description, weights_required)``: ``--weights`` (the .npz bench_acceptance.py or
bench_recurrent.py writes), ``--repeats`` and ``--serve``.

``run(step, repeats, serve)``: the first ``step()`` is the warm-up and its loss is printed as
``torch_loss <loss>``. Then either ``repeats`` timed steps and ``torch_step_ms <median>``, or,
with ``serve``, one timed step per ``step`` line read from stdin, answered with its ms, until
stdin closes: bench_acceptance.py drives that to alternate torch's steps with jonnx's, so both
see the same machine load (on a shared machine, separate runs differ by 2x and more).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time


def arguments(description: str, weights_required: bool = True) -> argparse.Namespace:
    """The baseline scripts' command line, parsed."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--weights", required=weights_required, help="an .npz of the network's weights and the batch")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--serve", action="store_true", help="time one step per 'step' line on stdin")
    return parser.parse_args()


def _timed(step) -> float:
    start = time.perf_counter()
    step()
    return (time.perf_counter() - start) * 1e3


def run(step, repeats: int, serve: bool) -> None:
    print(f"torch_loss {step():.6f}", flush=True)  # also the warm-up: allocator, oneDNN primitives
    if not serve:
        print(f"torch_step_ms {statistics.median(_timed(step) for _ in range(repeats)):.1f}")
        return
    for line in sys.stdin:
        if line.strip() != "step":
            raise SystemExit(f"expected 'step', got {line!r}")
        print(f"{_timed(step):.3f}", flush=True)

"""The ``jonnx`` command line: look at, check, run and time an ONNX model without writing Python.

``jonnx info``, ``jonnx check``, ``jonnx run`` and ``jonnx bench`` (also ``python -m jonnx``).
The parser is built without importing JAX, so ``jonnx --help`` answers at once; each
subcommand imports what it needs when it runs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

__all__ = ["main"]

_DESCRIPTION = """\
Look at, check, run and time ONNX models with jonnx (ONNX models as JAX functions).

  jonnx info MODEL                        what is inside: producer, opsets, inputs and outputs,
                                          parameters, op histogram, subgraphs, external data
  jonnx check MODEL                       can jonnx run it? unsupported ops (exit code 1),
                                          inputs that must be static, data-dependent ops
  jonnx run MODEL --random                run it jitted on random inputs (or --input name=x.npy)
  jonnx run MODEL --random --compare onnxruntime
                                          ... and compare every output with onnxruntime
  jonnx bench MODEL --batch 1,32 --compare onnxruntime
                                          load, compile and steady-state times side by side

Every subcommand takes --json for machine-readable output. Symbolic dimensions (a dynamic
batch axis 'N', a sequence length 'T') are 1 unless set with --dim N=8.
Exit codes: 0 success, 1 the model has a problem (unsupported op, load or run error),
2 bad command line (missing file, malformed --input)."""


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("model", metavar="MODEL", help="path to an .onnx file")
    common.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    common.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="log what jonnx does (-v: progress lines, -vv: debug)",
    )
    shapes = argparse.ArgumentParser(add_help=False)
    shapes.add_argument(
        "--dim",
        action="append",
        default=[],
        metavar="NAME=SIZE",
        help="size of a symbolic dimension (repeatable; default 1), e.g. --dim T=128",
    )
    shapes.add_argument(
        "--x64",
        action="store_true",
        help="run with jax_enable_x64 (int64/float64 computed in 64 bits; JAX's default is 32)",
    )
    inputs = argparse.ArgumentParser(add_help=False)
    inputs.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="NAME=FILE.npy",
        help="an input from a .npy file (repeatable)",
    )
    inputs.add_argument(
        "--random",
        action="store_true",
        help="fill inputs not given with --input with random values (floats: standard normal; "
        "integers feeding a Gather: valid indices, else 0 or 1; bools: random)",
    )
    inputs.add_argument("--seed", type=int, default=0, help="seed for --random (default 0)")

    parser = argparse.ArgumentParser(
        prog="jonnx",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"jonnx {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    info = sub.add_parser(
        "info",
        parents=[common],
        help="describe a model (no JAX needed)",
        description="Describe a model: producer, IR version and opsets, inputs and outputs with "
        "shapes, parameter count and bytes, op histogram, subgraphs and functions, external data. "
        "Reads the file only; external data is not read.",
    )
    info.add_argument("--top", type=int, default=0, metavar="N", help="show only the N most used ops")

    sub.add_parser(
        "check",
        parents=[common, shapes, inputs],
        help="can jonnx run it? (exit code 1 when not)",
        description="Load the model and trace it at its declared shapes (nothing is computed). "
        "Lists every unsupported op, the inputs that must be known at trace time (give them with "
        "--input to trace), and the ops whose static inputs depend on runtime data. Exits 1 when "
        "jonnx cannot run the model.",
    )

    run = sub.add_parser(
        "run",
        parents=[common, shapes, inputs],
        help="run it jitted and summarize the outputs",
        description="Run the model jit-compiled and summarize each output (shape, dtype, range, "
        "mean, non-finite count). With --compare onnxruntime, run the same inputs through "
        "onnxruntime and report the max absolute and relative difference per output.",
    )
    run.add_argument(
        "--compare",
        choices=["onnxruntime"],
        help="compare every output with this runtime",
    )
    run.add_argument("--output", metavar="DIR", help="save every output as DIR/<name>.npy")

    bench = sub.add_parser(
        "bench",
        parents=[common, shapes],
        help="time load, compile and steady-state runs",
        description="Time loading, the first call (trace + compile) and the steady-state call "
        "(median) per batch size; with --compare onnxruntime, onnxruntime's session creation, "
        "first run and steady state, calls alternating in one process. Inputs are random.",
    )
    bench.add_argument(
        "--batch",
        default="1",
        metavar="B[,B...]",
        help="batch sizes: the size of every symbolic leading dimension (default 1), e.g. 1,32",
    )
    bench.add_argument("--compare", choices=["onnxruntime"], help="time this runtime alongside")
    bench.add_argument(
        "--repeat",
        type=int,
        default=0,
        metavar="N",
        help="steady-state calls per runtime and batch (default: as many as fit in about 2 s, 5-200)",
    )
    bench.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("jonnx")
    except PackageNotFoundError:
        return "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``jonnx`` command line and return its exit code.

    Args:
        argv: the arguments after the program name (default ``sys.argv[1:]``).

    Returns:
        0 on success, 1 when the model has a problem, 2 for a bad command line.
    """
    parser = _parser()
    args = parser.parse_args(argv)
    from jonnx.cli import _common

    return _common.dispatch(parser, args)


if __name__ == "__main__":
    sys.exit(main())

"""What the subcommands share: dispatch and exit codes, inputs, shapes, output, onnxruntime."""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np


class UsageError(Exception):
    """A bad command line (a missing file, a malformed --input): exit code 2."""


class ModelProblem(Exception):
    """The model cannot be handled (it fails to load or to run): exit code 1."""


def dispatch(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Run the subcommand of ``args`` and print its report; no traceback for expected errors."""
    _configure_logging(args.verbose)
    if not os.path.isfile(args.model):
        what = "is a folder, not a file" if os.path.isdir(args.model) else "does not exist"
        parser.error(f"model {args.model!r} {what}")  # exits 2
    module = importlib.import_module(f"jonnx.cli._{args.command}")
    from jonnx import errors

    try:
        if getattr(args, "x64", False):
            import jax

            jax.config.update("jax_enable_x64", True)
        report, code = module.run(args)
    except (UsageError, errors.InputError) as e:
        parser.error(str(e))
    except (ModelProblem, errors.JonnxError) as e:
        print(f"jonnx {args.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    try:
        if args.json:
            json.dump(report, sys.stdout, indent=2, default=_json_default)
            sys.stdout.write("\n")
        else:
            module.render(report, sys.stdout)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (`jonnx info m.onnx | head`): stop quietly, as Unix tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return code


def _configure_logging(verbose: int) -> None:
    """Progress on a terminal (jonnx's logger at INFO), -v forces it, -vv adds DEBUG.

    Library use stays quiet (JAX's convention: the ``jonnx`` logger has no handler of its
    own); the command line is an application, so it shows what takes long.
    """
    from jonnx import _progress

    if verbose >= 2:
        level = logging.DEBUG
    elif verbose == 1 or sys.stderr.isatty():
        level = logging.INFO
    else:
        level = logging.WARNING
    _progress.enable_progress(level)


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)


# -- shapes and inputs -----------------------------------------------------------------------


def parse_dims(items: Sequence[str]) -> dict[str, int]:
    dims = {}
    for item in items:
        name, sep, size = item.partition("=")
        if not sep or not name or not re.fullmatch(r"[0-9]+", size.strip()):
            raise UsageError(f"--dim {item!r}: expected NAME=SIZE with a non-negative integer SIZE")
        dims[name] = int(size)
    return dims


def concrete_shape(info: Any, dims: Mapping[str, int], batch: int | None = None) -> tuple[int, ...]:
    """The declared shape of input ``info`` with symbolic or unknown dims filled in.

    A symbolic leading dim takes ``batch`` when given, then ``dims[name]``, then 1.
    """
    if info.shape is None:
        raise UsageError(f"input {info.name!r} has no declared shape (unknown rank): give it with --input")
    shape = []
    for axis, d in enumerate(info.shape):
        if isinstance(d, int):
            shape.append(d)
        elif axis == 0 and batch is not None:
            shape.append(batch)
        else:
            shape.append(dims.get(d, 1) if isinstance(d, str) else 1)
    return tuple(shape)


def load_inputs(items: Sequence[str], names: Sequence[str]) -> dict[str, np.ndarray]:
    """``--input name=file.npy`` values, by input name."""
    given: dict[str, np.ndarray] = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise UsageError(f"--input {item!r}: expected NAME=FILE.npy")
        if name not in names:
            raise UsageError(f"--input {item!r}: the model has no input {name!r}; its inputs: {list(names)}")
        if name in given:
            raise UsageError(f"--input {name!r} given twice")
        try:
            value = np.load(path, allow_pickle=False)
        except FileNotFoundError:
            raise UsageError(f"--input {item!r}: file {path!r} does not exist") from None
        except (OSError, ValueError) as e:
            raise UsageError(f"--input {item!r}: {path!r} is not a readable .npy file ({e})") from None
        if not isinstance(value, np.ndarray):
            raise UsageError(f"--input {item!r}: {path!r} holds several arrays (.npz); give one .npy per input")
        given[name] = value
    return given


def random_inputs(
    graph: Any,
    dims: Mapping[str, int],
    rng: np.random.Generator,
    names: Sequence[str],
    batch: int | None = None,
) -> dict[str, np.ndarray]:
    """Random values for the graph inputs ``names`` at their declared dtypes and shapes."""
    values = {}
    for info in graph.inputs:
        if info.name not in names:
            continue
        if info.kind != "tensor" or info.dtype is None:
            raise UsageError(f"input {info.name!r} is a {info.kind}, not a tensor: give it with --input")
        shape, dtype = concrete_shape(info, dims, batch), info.dtype
        if dtype == np.bool_:
            value = rng.random(shape) < 0.5
        elif np.issubdtype(dtype, np.integer):
            value = rng.integers(0, _index_bound(graph, info.name), shape).astype(dtype)
        elif np.issubdtype(dtype, np.floating) or np.issubdtype(dtype, np.complexfloating):
            value = rng.standard_normal(shape).astype(dtype)
        else:
            raise UsageError(f"input {info.name!r} is {dtype}: --random cannot make it; give it with --input")
        values[info.name] = value
    return values


def _index_bound(graph: Any, name: str) -> int:
    """The exclusive upper bound for random integers: the table size where ``name`` indexes one
    (a token id into an embedding), else 2 (masks, flags)."""
    for node in graph.nodes:
        if node.op_type == "Gather" and len(node.inputs) > 1 and node.inputs[1] == name:
            table = graph.initializers.get(node.inputs[0])
            if table is not None and table.ndim:
                axis = node.attrs.get("axis") or 0
                return max(int(table.shape[axis]), 1)
    return 2


def model_inputs(args: argparse.Namespace, model: Any, batch: int | None = None) -> dict[str, np.ndarray]:
    """The inputs of a run: ``--input`` files, the rest random with ``--random``."""
    given = load_inputs(getattr(args, "input", []), model.input_names)
    missing = [n for n in model.input_names if n not in given]
    if missing and not getattr(args, "random", True):
        raise UsageError(f"no value for input(s) {missing}: give them with --input NAME=FILE.npy or use --random")
    rng = np.random.default_rng(args.seed)
    given.update(random_inputs(model.graph, parse_dims(getattr(args, "dim", [])), rng, missing, batch))
    return {n: given[n] for n in model.input_names}


# -- onnxruntime ----------------------------------------------------------------------------


def onnxruntime_session(path: str) -> Any:
    try:
        import onnxruntime as ort
    except ImportError:
        raise UsageError("--compare onnxruntime needs onnxruntime: pip install onnxruntime") from None
    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - onnxruntime raises its own exception types
        raise ModelProblem(f"onnxruntime cannot load the model: {_first_line(e)}") from None


def onnxruntime_feed(model: Any, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The inputs at the dtypes the graph declares (onnxruntime does not convert)."""
    declared = {v.name: v.dtype for v in model.graph.inputs}
    return {n: np.asarray(v).astype(declared[n]) if declared.get(n) is not None else v for n, v in inputs.items()}


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


# -- text output ----------------------------------------------------------------------------


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str], out: Any, indent: str = "  ") -> None:
    cells = [[str(c) for c in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for r in cells:
        out.write(indent + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() + "\n")


def show_shape(shape: Any) -> str:
    if shape is None:
        return "?"
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def load_model(args: argparse.Namespace) -> Any:
    import jonnx

    return jonnx.load(args.model)


Render = Callable[[dict, Any], None]

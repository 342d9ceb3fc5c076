"""The training loop: :func:`fit`, its :class:`History`, and the progress display."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterable
from typing import Any

import jax
import numpy as np

from jonnx import _progress
from jonnx._progress import ProgressLine
from jonnx.training._step import TrainState

__all__ = ["History", "fit"]


@dataclasses.dataclass
class History:
    """What :func:`fit` recorded.

    Attributes:
        steps: every step metric (``"loss"``, ``"grad_norm"``, the loss's aux metrics) as a
            list with one float per step, in order.
        epochs: one dict per epoch: the epoch's mean of every step metric, ``"epoch"``
            (counting from 1), ``"steps"``, ``"time"`` (seconds) and whatever ``eval_fn``
            returned.
    """

    steps: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    epochs: list[dict[str, float]] = dataclasses.field(default_factory=list)

    @property
    def loss(self) -> list[float]:
        """The loss of every step, in order."""
        return self.steps.get("loss", [])


class _Bar:
    """The epoch's progress on stderr: redrawn in place on a terminal, plain lines in a pipe.

    Into a pipe or a log file (CI, ``nohup``, a notebook's captured stderr) it writes no
    carriage returns or escape codes: a heartbeat line every few seconds and the epoch's
    summary (:class:`jonnx._progress.ProgressLine`).
    """

    def __init__(self, line: ProgressLine, total: int | None, desc: str):
        self.line, self.total, self.desc, self.n = line, total, desc, 0
        self.postfix = ""
        self.start = self.last = time.perf_counter()
        # Drawn at once: the first step traces and compiles, which can take seconds.
        line.progress(self, self._text(self.start), done=False)

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.perf_counter()
        # Read at each call, not bound at import: one throttle for every progress display.
        if now - self.last >= _progress.REDRAW_SECONDS:
            self.last = now
            self.line.progress(self, self._text(now), done=False)

    def set_postfix_str(self, text: str) -> None:
        self.postfix = text

    def _text(self, now: float) -> str:
        rate = self.n / max(now - self.start, 1e-9)
        if self.total:
            done = int(20 * min(self.n / self.total, 1))
            count = f"[{'=' * done}{' ' * (20 - done)}] {self.n}/{self.total}"
        else:
            count = f"{self.n}"
        return f"{self.desc} {count} {rate:.1f} it/s {self.postfix}".rstrip()

    def close(self) -> None:
        """End the bar's line on a terminal; in a pipe the epoch summary follows instead."""
        if self.line.terminal:
            self.line.progress(self, self._text(time.perf_counter()), done=True)
        else:
            self.line.forget(self)


def _epoch_batches(batches: Any, epoch: int) -> Iterable[Any]:
    return batches(epoch) if callable(batches) else batches


def fit(
    step: Callable[[TrainState, Any, Any], tuple[TrainState, dict[str, Any]]],
    train_state: TrainState,
    batches: Iterable[Any] | Callable[[int], Iterable[Any]],
    *,
    epochs: int = 1,
    key: jax.Array | None,
    eval_fn: Callable[[TrainState], dict[str, float] | float] | None = None,
    progress: bool = True,
) -> tuple[TrainState, History]:
    """Train for ``epochs`` passes over ``batches``.

    The loop never blocks on a step's result except to refresh the progress display (at most
    ten times a second) and at the end of each epoch, so steps are dispatched back to back.

    Args:
        step: a training step, ``step(train_state, batch, key) -> (train_state, metrics)``,
            as :func:`make_train_step` makes.
        train_state: the starting :class:`TrainState` (``step.init()``).
        batches: the batches of one epoch: a re-iterable collection (a list, or an object
            whose ``__iter__`` starts a fresh pass), or a callable ``epoch -> iterable``
            (epochs counted from 0) for per-epoch shuffling. A one-shot iterator serves a
            single epoch only.
        epochs: the number of passes.
        key: the base PRNG key handed to every step (the step folds in its step count, so
            each step draws fresh randomness); ``None`` for models without random ops.
        eval_fn: called as ``eval_fn(train_state)`` after each epoch; a dict of metrics (or
            a float, reported as ``"eval"``) merged into that epoch's record, e.g.
            ``lambda ts: evaluate(model, ts, test_batches, loss_fn)``.
        progress: show the epoch's progress on stderr (a bar redrawn in place on a terminal;
            in a pipe or log file, a plain line every few seconds, no carriage returns) and a
            summary line per epoch.

    Returns:
        ``(train_state, history)``: the final train state and a :class:`History` with the
        per-step loss (``history.loss``) and per-epoch metrics (``history.epochs``).

    Raises:
        ValueError: ``epochs < 1``, a one-shot iterator given for several epochs, or an epoch
            with no batches.

    Example:
        >>> import numpy as np, onnx, onnx.helper as oh, optax, jonnx
        >>> from jonnx.training import fit, make_train_step, supervised_loss
        >>> w = onnx.numpy_helper.from_array(np.zeros((2, 1), np.float32), "w")
        >>> graph = oh.make_graph([oh.make_node("MatMul", ["x", "w"], ["y"])], "g",
        ...     [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 2])],
        ...     [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 1])], [w])
        >>> model = jonnx.load(oh.make_model(graph))
        >>> step = make_train_step(model, supervised_loss(model, optax.l2_loss, target="t"), optax.sgd(0.5))
        >>> batches = [{"x": np.eye(2, dtype=np.float32), "t": np.array([[1.0], [2.0]], np.float32)}] * 10
        >>> ts, history = fit(step, step.init(), batches, epochs=3, key=None, progress=False)
        >>> len(history.loss), history.epochs[-1]["loss"] < history.epochs[0]["loss"]
        (30, True)
    """
    if epochs < 1:
        raise ValueError(f"epochs must be at least 1, not {epochs}")
    if epochs > 1 and not callable(batches) and iter(batches) is batches:
        raise ValueError(
            "batches is a one-shot iterator, which cannot serve several epochs: pass a list, a "
            "re-iterable object, or a callable epoch -> iterable"
        )
    history = History()
    line = ProgressLine()  # sys.stderr as it is at each write
    for epoch in range(epochs):
        epoch_batches = _epoch_batches(batches, epoch)
        total = len(epoch_batches) if hasattr(epoch_batches, "__len__") else None
        bar = _Bar(line, total, f"epoch {epoch + 1}/{epochs}") if progress else None
        start = time.perf_counter()
        last_shown = 0.0
        recorded: list[dict[str, Any]] = []
        try:
            for batch in epoch_batches:
                train_state, metrics = step(train_state, batch, key)
                recorded.append(metrics)
                if bar is not None:
                    now = time.perf_counter()
                    if now - last_shown >= 0.1:
                        last_shown = now
                        bar.set_postfix_str(f"loss {float(metrics['loss']):.4f}")
                    bar.update(1)
        finally:
            if bar is not None:
                bar.close()
        if not recorded:
            raise ValueError(f"epoch {epoch + 1} got no batches")
        host = jax.device_get(recorded)
        record: dict[str, float] = {"epoch": epoch + 1, "steps": len(host)}
        for name in host[0]:
            values = [float(m[name]) for m in host]
            history.steps.setdefault(name, []).extend(values)
            record[name] = float(np.mean(values))
        record["time"] = time.perf_counter() - start
        if eval_fn is not None:
            evaluated = eval_fn(train_state)
            record.update(evaluated if isinstance(evaluated, dict) else {"eval": float(evaluated)})
        history.epochs.append(record)
        if progress:
            shown = "  ".join(f"{k} {v:.4g}" for k, v in record.items() if k not in ("epoch", "steps"))
            line.line(f"epoch {epoch + 1}/{epochs}: {shown}")
        if not all(math.isfinite(v) for v in history.steps["loss"][-len(host) :]):
            line.line(f"warning: non-finite loss in epoch {epoch + 1}")
    return train_state, history

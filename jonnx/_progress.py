"""Progress of long work (loading, tracing, compiling, training) through the ``jonnx`` logger.

Library use is quiet, as in JAX: jonnx logs to ``logging.getLogger("jonnx")`` and adds no
handler, so nothing shows unless the application configures logging (records are at INFO,
below Python's default WARNING). :func:`enable_progress` (what the ``jonnx`` command line
calls) attaches a console handler that draws progress as one redrawn line on a terminal and
writes plain lines, without carriage returns or escape codes, into pipes and log files.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Any, TextIO

__all__ = ["Progress", "ProgressLine", "enable_progress", "logger"]

logger = logging.getLogger("jonnx")

#: A task shorter than this shows nothing but its DEBUG record.
QUIET_SECONDS = 0.5
#: On a terminal a line is redrawn at most this often.
REDRAW_SECONDS = 0.1
#: Into a pipe an unfinished task writes a line at most this often (a heartbeat, not a bar).
PIPE_SECONDS = 10.0


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class ProgressLine:
    """Draws a progress line on ``stream``: redrawn in place on a terminal, plain lines elsewhere.

    Into a pipe or file only finished tasks and a heartbeat every :data:`PIPE_SECONDS` are
    written, each as a line of its own: no ``\\r``, no ANSI codes.
    """

    def __init__(self, stream: TextIO | None = None):
        self._stream = stream
        self._open = False  # a terminal line is drawn and not yet ended
        self._last_plain: dict[Any, float] = {}
        self._lock = threading.Lock()

    @property
    def stream(self) -> TextIO:
        return self._stream if self._stream is not None else sys.stderr

    @property
    def terminal(self) -> bool:
        return _is_terminal(self.stream)

    def progress(self, task: Any, text: str, done: bool) -> None:
        """Show ``text`` as the current state of ``task``; ``done`` ends it."""
        with self._lock:
            stream = self.stream
            if self.terminal:
                stream.write("\r" + text + "\033[K" + ("\n" if done else ""))
                self._open = not done
            else:
                now = time.monotonic()
                last = self._last_plain.get(task)
                if done:
                    self._last_plain.pop(task, None)
                elif last is None:
                    # The first report of a task: its start time, no line yet.
                    self._last_plain[task] = now
                    return
                elif now - last < PIPE_SECONDS:
                    return
                else:
                    self._last_plain[task] = now
                stream.write(text + "\n")
            stream.flush()

    def forget(self, task: Any) -> None:
        """End ``task`` without a final line (its summary is written by the caller)."""
        with self._lock:
            self._last_plain.pop(task, None)
            if self._open and self.terminal:
                self.stream.write("\n")
                self.stream.flush()
                self._open = False

    def line(self, text: str) -> None:
        """Write ``text`` as a line of its own (ending a terminal progress line first)."""
        with self._lock:
            stream = self.stream
            if self._open:
                stream.write("\r\033[K")
                self._open = False
            stream.write(text + "\n")
            stream.flush()


class Progress:
    """Progress of one long task, reported to the ``jonnx`` logger at INFO.

    Nothing is formatted unless the logger shows INFO; nothing shows for a task that ends
    within :data:`QUIET_SECONDS`. Updates are throttled to :data:`REDRAW_SECONDS`.

    Args:
        desc: what is being done ("loading model.onnx").
        total: the number of steps, or None when unknown.
        unit: the steps' unit for display ("nodes").
        log: the logger (default ``jonnx``).
    """

    def __init__(
        self,
        desc: str,
        total: int | None = None,
        *,
        unit: str = "",
        log: logging.Logger = logger,
    ):
        self.desc, self.total, self.unit, self.n = desc, total, unit, 0
        self.log = log
        self.extra = ""
        self.start = self._last = time.perf_counter()
        self._shown = False
        self._enabled = log.isEnabledFor(logging.INFO)

    def update(self, n: int = 1, extra: str | None = None) -> None:
        self.n += n
        if extra is not None:
            self.extra = extra
        if not self._enabled:
            return
        now = time.perf_counter()
        if now - self.start >= QUIET_SECONDS and now - self._last >= REDRAW_SECONDS:
            self._last = now
            self._shown = True
            self._emit(self._text(now), done=False, level=logging.INFO)

    def close(self, failed: bool = False, summary: str | None = None) -> float:
        """End the task; returns its duration in seconds."""
        now = time.perf_counter()
        elapsed = now - self.start
        if failed:
            if self._shown:
                self._emit(
                    f"{self.desc}: failed after {elapsed:.1f} s",
                    done=True,
                    level=logging.INFO,
                )
            return elapsed
        text = f"{self.desc}: {summary or self._count()} in {_seconds(elapsed)}"
        level = logging.INFO if self._shown or elapsed >= QUIET_SECONDS else logging.DEBUG
        self._emit(text, done=True, level=level)
        return elapsed

    def _count(self) -> str:
        if self.total is not None:
            return f"{self.n}/{self.total} {self.unit}".rstrip()
        return f"{self.n} {self.unit}".rstrip()

    def _text(self, now: float) -> str:
        text = f"{self.desc}: {self._count()}"
        if self.total:
            done = int(20 * min(self.n / self.total, 1))
            text = f"{self.desc}: [{'=' * done}{' ' * (20 - done)}] {self._count()}"
        text += f" ({_seconds(now - self.start)})"
        return f"{text} {self.extra}".rstrip()

    def _emit(self, text: str, *, done: bool, level: int) -> None:
        self.log.log(level, "%s", text, extra={"jonnx_progress": (id(self), done)})


def _seconds(s: float) -> str:
    return f"{s * 1e3:.0f} ms" if s < 1 else f"{s:.1f} s"


class _ConsoleHandler(logging.Handler):
    """Progress records through a :class:`ProgressLine`; other records as lines."""

    def __init__(self, line: ProgressLine):
        super().__init__()
        self.line = line

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
            progress = getattr(record, "jonnx_progress", None)
            if progress is not None:
                self.line.progress(progress[0], text, done=progress[1])
            else:
                self.line.line(text)
        except Exception:  # noqa: BLE001 - logging's contract: never raise from a handler
            self.handleError(record)


_handler: _ConsoleHandler | None = None
_compile_listener_added = False


def enable_progress(level: int = logging.INFO, stream: TextIO | None = None) -> None:
    """Show jonnx's progress (loading, tracing, XLA compiles) on ``stream`` (default stderr).

    A bar redrawn in place on a terminal; plain lines in a pipe or a log file. Library use
    is quiet without this (or without configuring the ``jonnx`` logger yourself).
    Calling it again replaces the previous handler.

    Args:
        level: the lowest level shown (``logging.DEBUG`` shows every step).
        stream: where to write (default ``sys.stderr``, looked up at each write).

    Example:
        >>> import io, jonnx, numpy as np, onnx.helper as oh
        >>> log = io.StringIO()  # not a terminal: plain lines
        >>> jonnx.enable_progress(logging.DEBUG, stream=log)
        >>> graph = oh.make_graph([oh.make_node("Relu", ["x"], ["y"])], "relu",
        ...                       [oh.make_tensor_value_info("x", 1, [2])],
        ...                       [oh.make_tensor_value_info("y", 1, [2])])
        >>> _ = jonnx.load(oh.make_model(graph))(np.ones(2, np.float32))
        >>> print(log.getvalue(), end="")  # doctest: +ELLIPSIS
        reading initializers: 0/0 tensors in ...
        loading model: 1 nodes, 0 parameter values in ...
        tracing graph 'relu': 1/1 nodes in ...
        XLA compiled in ...
        >>> _restore_quiet()
    """
    global _handler, _compile_listener_added
    if _handler is not None:
        logger.removeHandler(_handler)
    _handler = _ConsoleHandler(ProgressLine(stream))
    _handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(_handler)
    logger.setLevel(level)
    # The application asked for progress: do not print jonnx's records twice through root.
    logger.propagate = False
    if not _compile_listener_added:
        import jax.monitoring

        jax.monitoring.register_event_duration_secs_listener(_on_duration)
        _compile_listener_added = True


def _restore_quiet() -> None:
    """Undo :func:`enable_progress` (for tests and doctests)."""
    global _handler
    if _handler is not None:
        logger.removeHandler(_handler)
        _handler = None
    logger.setLevel(logging.NOTSET)
    logger.propagate = True


def _on_duration(event: str, duration: float, **kwargs: Any) -> None:
    if event == "/jax/core/compile/backend_compile_duration" and logger.isEnabledFor(logging.INFO):
        logger.info("XLA compiled in %s", _seconds(duration))

"""Progress of long work: quiet in library use, a bar on a terminal, clean lines in pipes."""

from __future__ import annotations

import io
import logging
import os
import pathlib
import pty
import subprocess
import sys

import numpy as np
import onnx
import onnx.helper as oh
import optax
import pytest

import jonnx
from jonnx import _progress, training

CNN = pathlib.Path(__file__).parent.parent / "examples" / "models" / "small_cnn.onnx"
SCRIPT = pathlib.Path(sys.executable).with_name("jonnx")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def restore_logger():
    logger = _progress.logger
    saved = logger.handlers[:], logger.level, logger.propagate
    yield
    logger.handlers[:], logger.propagate = saved[0], saved[2]
    logger.setLevel(saved[1])


@pytest.fixture
def always_shown(monkeypatch):
    """Every task shows and every pipe heartbeat is due: small models finish in milliseconds."""
    monkeypatch.setattr(_progress, "QUIET_SECONDS", 0.0)
    monkeypatch.setattr(_progress, "REDRAW_SECONDS", 0.0)
    monkeypatch.setattr(_progress, "PIPE_SECONDS", 0.0)


def _linear_model() -> jonnx.Model:
    w = onnx.numpy_helper.from_array(np.zeros((2, 1), np.float32), "w")
    graph = oh.make_graph(
        [oh.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 2])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 1])],
        [w],
    )
    return jonnx.load(oh.make_model(graph))


def _fit(n_batches: int = 5) -> None:
    model = _linear_model()
    loss = training.supervised_loss(model, optax.l2_loss, target="t")
    step = training.make_train_step(model, loss, optax.sgd(0.1))
    batch = {"x": np.eye(2, dtype=np.float32), "t": np.ones((2, 1), np.float32)}
    training.fit(step, step.init(), [batch] * n_batches, epochs=2, key=None)


def test_library_use_is_quiet(capfd, restore_logger, always_shown):
    model = jonnx.load(CNN)
    model(np.zeros((1, 3, 16, 16), np.float32))
    captured = capfd.readouterr()
    assert captured.err == "" and captured.out == ""


def test_progress_into_a_pipe_is_plain_lines(restore_logger, always_shown):
    stream = io.StringIO()  # not a terminal, like a pipe or a log file
    _progress.enable_progress(stream=stream)
    model = jonnx.load(CNN)
    model(np.zeros((2, 3, 16, 16), np.float32))
    text = stream.getvalue()
    assert "\r" not in text and "\x1b" not in text
    lines = text.splitlines()
    assert any(line.startswith("reading initializers:") for line in lines)
    assert any(line.startswith("tracing graph 'small_cnn':") and "nodes" in line for line in lines)
    assert any(line.startswith("XLA compiled in") for line in lines)


def test_progress_on_a_terminal_redraws_one_line(restore_logger, always_shown):
    stream = _Terminal()
    _progress.enable_progress(stream=stream)
    jonnx.load(CNN)(np.zeros((3, 3, 16, 16), np.float32))
    text = stream.getvalue()
    assert "\r" in text and "\x1b[K" in text
    # A line that is not progress (XLA's compile time) first clears an unfinished bar.
    at = text.index("XLA compiled in")
    assert at == 0 or text[at - 1] == "\n" or text[at - 4 : at] == "\r\x1b[K"


def test_fit_into_a_pipe_has_no_carriage_returns(capfd, always_shown):
    _fit()
    err = capfd.readouterr().err
    assert "\r" not in err and "\x1b" not in err
    assert "epoch 1/2: " in err and "epoch 2/2: " in err and "loss" in err
    assert "it/s" in err  # heartbeat lines of the bar, one per line


def test_fit_on_a_terminal_draws_a_bar(monkeypatch, always_shown):
    stream = _Terminal()
    monkeypatch.setattr(sys, "stderr", stream)
    _fit()
    text = stream.getvalue()
    assert "\r" in text and "[" in text and "5/5" in text
    assert "epoch 2/2: " in text


def test_quiet_tasks_leave_only_a_debug_record(caplog):
    with caplog.at_level(logging.DEBUG, logger="jonnx"):
        jonnx.load(CNN)
    levels = {r.levelno for r in caplog.records if r.name == "jonnx"}
    assert levels == {logging.DEBUG}  # loading small_cnn takes far less than QUIET_SECONDS


def _cli_stderr(use_terminal: bool) -> str:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    args = [str(SCRIPT), "run", str(CNN), "--random", "-vv"]
    if not use_terminal:
        result = subprocess.run(args, check=False, capture_output=True, text=True, timeout=300, env=env)
        assert result.returncode == 0, result.stderr
        return result.stderr
    leader, follower = pty.openpty()
    try:
        process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=follower, env=env)
        os.close(follower)
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the pty's other end closed
                break
            if not chunk:
                break
            chunks.append(chunk)
        code = process.wait(timeout=300)
        assert code == 0, b"".join(chunks).decode(errors="replace")
    finally:
        os.close(leader)
    return b"".join(chunks).decode(errors="replace")


def test_command_line_progress_in_a_pipe_and_on_a_terminal():
    piped = _cli_stderr(use_terminal=False)
    assert "\r" not in piped and "\x1b" not in piped
    assert "tracing graph 'small_cnn'" in piped and "XLA compiled in" in piped
    terminal = _cli_stderr(use_terminal=True)
    assert "\x1b[K" in terminal and "tracing graph 'small_cnn'" in terminal

"""Multi-process data parallelism: two processes joined by ``jax.distributed`` on localhost.

Each process runs tests/_sharded_steps.py as a worker: it joins the other through a
coordinator on a loopback port, loads the model on a mesh of both processes' CPU devices
(CPU collectives through gloo), feeds its half of the batch, and takes one training step. The
step must equal the single-process step over the whole batch.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import numpy as np
import onnx
import pytest

import jonnx
from tests import _sharded_steps

TIMEOUT = 240


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_process_data_parallel_step_equals_the_single_process_step(tmp_path):
    proto, batch = _sharded_steps.encoder(layers=1)
    model_path, batch_path = tmp_path / "encoder.onnx", tmp_path / "batch.npz"
    onnx.save_model(proto, model_path)
    np.savez(batch_path, **batch)

    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAX_PLATFORMS"] = "cpu"
    address = f"127.0.0.1:{_free_port()}"
    outs = [tmp_path / f"worker{i}.json" for i in range(2)]
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                _sharded_steps.__file__,
                "worker",
                address,
                str(i),
                str(model_path),
                str(batch_path),
                str(outs[i]),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    logs = []
    try:
        for w in workers:
            logs.append(w.communicate(timeout=TIMEOUT)[0])
    except subprocess.TimeoutExpired:
        for w in workers:
            w.kill()
        pytest.fail("the two jax.distributed workers did not finish in time:\n" + "\n".join(logs)[-4000:])
    for w, log in zip(workers, logs):
        assert w.returncode == 0, log[-4000:]

    loss, ts = _sharded_steps.step(jonnx.load(model_path), batch)
    for out in outs:
        result = json.loads(out.read_text())
        assert result["processes"] == 2 and result["devices"] == 2
        assert abs(result["loss"] - loss) <= 1e-5 * max(1.0, abs(loss))
        assert sorted(result["params"]) == sorted(ts.params)
        for name, value in result["params"].items():
            np.testing.assert_allclose(
                np.asarray(value, np.float32), np.asarray(ts.params[name]), rtol=1e-5, atol=1e-6, err_msg=name
            )

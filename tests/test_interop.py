"""docs/interop.md runs: every code block, each skipped when its optional library is missing."""

from __future__ import annotations

import functools
import pathlib
import re
import runpy

import jax
import numpy as np
import pytest

import jonnx

ROOT = pathlib.Path(__file__).parent.parent
BLOCKS = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "interop.md").read_text(), re.DOTALL)
# The library each block needs beyond jonnx's own dependencies, in the page's order.
NEEDS = {
    "flax.nnx": "flax",
    "equinox": "equinox",
    "orbax": "orbax.checkpoint",
    "export": None,
    "remat": None,
}


def test_every_block_is_listed():
    assert len(BLOCKS) == len(NEEDS)


@pytest.mark.parametrize("index", range(len(NEEDS)), ids=list(NEEDS))
def test_interop_block_runs(index, monkeypatch, tmp_path, capsys):
    needed = list(NEEDS.values())[index]
    if needed is not None:
        pytest.importorskip(needed)
    monkeypatch.chdir(ROOT)  # the blocks load examples/models/small_cnn.onnx
    # Each block asserts its own result: the wrapper's outputs equal the model's, training
    # lowers the loss, the restored state equals the saved one, the exported function and the
    # rematerialized gradient agree with the plain ones.
    script = tmp_path / f"interop_block_{index}.py"
    script.write_text(BLOCKS[index])
    # Run as a module that is in sys.modules meanwhile (Equinox's dataclasses look it up).
    runpy.run_path(str(script), run_name="interop_doc")


def test_remat_really_rematerializes():
    model = jonnx.load(ROOT / "examples" / "models" / "small_cnn.onnx")
    x = np.zeros((2, 3, 16, 16), np.float32)
    forward = jax.checkpoint(functools.partial(model.apply, train=False))
    jaxpr = jax.make_jaxpr(jax.grad(lambda p: forward(p, x)[0].sum()))(model.params)
    assert "checkpoint" in str(jaxpr) or "remat" in str(jaxpr)

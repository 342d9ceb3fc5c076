"""examples/finetune_digits.py in its --fast mode: the whole path runs and its checks pass
(saved model reloaded by jonnx and run by onnxruntime, running statistics updated, loss curve
drawn). The accuracy of the full run is not asserted here."""

from __future__ import annotations

import importlib.util
import pathlib

import numpy as np
import pytest

from tests._scripts import load_script

pytest.importorskip("sklearn")

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "finetune_digits.py"


def _load_example():
    return load_script(EXAMPLE, "_jonnx_example_finetune_digits")


def test_fast_run_completes_and_its_checks_pass(tmp_path, capsys):
    ex = _load_example()
    result = ex.main(["--fast", "--out", str(tmp_path), "--no-progress"])
    out = capsys.readouterr().out
    assert "all checks passed" in out
    assert (tmp_path / "digits_finetuned.onnx").stat().st_size > 0
    png = tmp_path / "loss_curve.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if importlib.util.find_spec("onnxruntime") is not None:
        assert result["ort_diff"] < 1e-4
    assert result["step_time"] > 0
    assert 0.0 <= result["before"] <= 1.0 and result["after"] > result["before"]


def test_the_built_model_is_valid_onnx_in_eval_mode():
    import onnx

    ex = _load_example()
    proto = ex.build_cnn()
    onnx.checker.check_model(proto, full_check=True)
    ops = [n.op_type for n in proto.graph.node]
    assert ops.count("BatchNormalization") == 2 and "Dropout" in ops
    bn = [n for n in proto.graph.node if n.op_type == "BatchNormalization"]
    assert all(a.name != "training_mode" or a.i == 0 for n in bn for a in n.attribute)
    dropout = next(n for n in proto.graph.node if n.op_type == "Dropout")
    assert len(dropout.input) == 2  # data and ratio, no training_mode input: eval mode
    images = np.zeros((2, 1, 8, 8), np.float32)
    import jonnx

    assert jonnx.load(proto)(images)[0].shape == (2, 10)

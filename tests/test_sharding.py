"""Sharding: rule sets, and sharded training steps on 8 simulated CPU devices.

The multi-device checks run in one subprocess (``--xla_force_host_platform_device_count=8``
must be set before JAX starts): tests/_sharded_steps.py takes one SGD-with-momentum step of a
BERT-style encoder and of a CNN on one device, then data-parallel, FSDP-style and
tensor-parallel on the mesh, and reports losses, parameter differences and shardings.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec

import jonnx
from jonnx import sharding
from tests import _sharded_steps

SCRIPT = pathlib.Path(_sharded_steps.__file__)
KINDS = ("data_parallel", "fsdp", "tensor_parallel")


def _mesh_report(tmp_path) -> dict:
    out = tmp_path / "report.json"
    env = {
        **os.environ,
        "XLA_FLAGS": (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip(),
    }
    env["JAX_PLATFORMS"] = "cpu"
    child = subprocess.run(
        [sys.executable, str(SCRIPT), "mesh", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert child.returncode == 0, child.stderr[-4000:]
    return json.loads(out.read_text())


def test_sharded_steps_on_eight_devices(tmp_path):
    """Every check of the 8-device run, in one test: the subprocess takes ~45 s on the 2-core
    CI machine, and as a module fixture of several tests it ran once per xdist worker."""
    report = _mesh_report(tmp_path)
    for model in ("encoder", "cnn"):
        for kind in KINDS:
            _check_step_equals_the_single_device_step(report[f"{model}/{kind}"], f"{model}/{kind}")
    # The encoder's step with gradients accumulated over two parts of the batch, data-parallel.
    _check_step_equals_the_single_device_step(report["encoder/data_parallel_microbatches"], "microbatches")
    _check_fsdp_splits_every_weight_the_axis_divides(report["encoder/fsdp"]["specs"])
    _check_tensor_parallel_splits_attention_and_ffn_pairs_megatron_style(report["encoder/tensor_parallel"]["specs"])
    _check_tensor_parallel_splits_conv_pairs_with_their_batchnorm(report["cnn/tensor_parallel"]["specs"])


def _check_step_equals_the_single_device_step(r, where):
    single, sharded = r["loss"]
    assert abs(single - sharded) <= 1e-5 * max(1.0, abs(single)), (where, r["loss"])
    assert r["max_param_diff"] <= 1e-5, where
    assert r["max_state_diff"] <= 1e-5, where
    assert r["params_keep_shardings"], where
    assert r["opt_state_sharded_like_params"], where
    assert r["devices_used"] == 8, where


def _check_fsdp_splits_every_weight_the_axis_divides(specs):
    assert specs["emb"] == ["data"]  # (32, 16): the larger dimension
    assert specs["l0.q.w"] == [None, "data"]  # (16, 16): equal sizes, the last one
    assert specs["l0.ffn2.w"] == ["data"]  # (32, 16)
    assert specs["scale"] == []  # a scalar stays whole


def _check_tensor_parallel_splits_attention_and_ffn_pairs_megatron_style(specs):
    for layer in ("l0", "l1"):
        for name in ("q", "k", "v", "ffn1"):  # column: output features (heads for Q, K, V)
            assert specs[f"{layer}.{name}.w"] == [None, "model"], name
            assert specs[f"{layer}.{name}.b"] == ["model"], name
        for name in ("o", "ffn2"):  # row: input features; the bias is added after the reduction
            assert specs[f"{layer}.{name}.w"] == ["model"], name
            assert specs[f"{layer}.{name}.b"] == [], name
        for norm in ("ln1", "ln2"):
            assert specs[f"{layer}.{norm}.g"] == []
    assert specs["emb"] == []


def _check_tensor_parallel_splits_conv_pairs_with_their_batchnorm(specs):
    assert specs["c0.w"] == ["model"]  # output channels
    for name in ("c0.b", "bn0.scale", "bn0.bias", "bn0.mean", "bn0.var"):
        assert specs[name] == ["model"], name
    assert specs["c1.w"] == [None, "model"]  # input channels
    for name in ("c1.b", "bn1.scale", "bn1.mean", "fc.w", "fc.b"):
        assert specs[name] == [], name


# -- in-process checks of the rules (one device) -----------------------------------------------


def _encoder_model(**kwargs):
    proto, _ = _sharded_steps.encoder(layers=1)
    return jonnx.load(proto, **kwargs)


def test_rules_by_pattern_and_by_name():
    mesh = Mesh(np.array(jax.devices()[:1]), ("data",))
    model = _encoder_model(mesh=mesh, rules=[("*.q.w", PartitionSpec(None, "data")), ("emb", PartitionSpec("data"))])
    assert model.shardings["l0.q.w"].spec == PartitionSpec(None, "data")
    assert model.shardings["emb"].spec == PartitionSpec("data")
    assert model.shardings["l0.k.w"].spec == PartitionSpec()
    assert model.params["l0.q.w"].sharding == model.shardings["l0.q.w"]
    ids = np.zeros((2, 4), np.int32)
    np.testing.assert_allclose(np.asarray(model(ids)[0]), np.asarray(_encoder_model()(ids)[0]), rtol=1e-6, atol=1e-6)


def test_bad_rules_are_refused_with_the_weight_named():
    mesh = Mesh(np.array(jax.devices()[:1]), ("data",))
    with pytest.raises(ValueError, match="unknown rule set 'megatron'"):
        _encoder_model(mesh=mesh, rules="megatron")
    with pytest.raises(ValueError, match="'l0.q.w'.*axis 'model'"):
        _encoder_model(mesh=mesh, rules=[("l0.q.w", PartitionSpec("model"))])
    with pytest.raises(ValueError, match=r"'l0.q.w' has shape \(16, 16\) but its PartitionSpec"):
        _encoder_model(mesh=mesh, rules=[("l0.q.w", PartitionSpec(None, None, "data"))])
    with pytest.raises(TypeError, match="not a jax.sharding.PartitionSpec"):
        sharding.from_patterns([("x", ("data",))])


def test_tensor_parallel_skips_pairs_the_axis_does_not_divide():
    model = _encoder_model()
    fake = Mesh(np.array(jax.devices()[:1]), ("model",))
    plan = sharding.tensor_parallel_plan(model, fake)
    assert plan["l0.q.w"] == PartitionSpec(None, "model")
    # A 3-way split divides neither the 16 hidden nor the 32 FFN features: nothing is split.
    assert sharding._megatron(model, 3, "model") == {}

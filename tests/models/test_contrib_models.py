"""Files written by onnxruntime's own tools (tests/models/contrib/make_contrib_models.py):
its transformers optimizer (BERT and GPT-2 at levels 0, 1 and 2, a Llama-style decoder and
a ViT at 1 and 2), quantize_dynamic (on an MLP and on the optimized BERT) plus an
extended-level session, an extended-level session on a CNN, and the MatMulNBits quantizer.
jonnx runs each under jit and must match onnxruntime on the same file."""

from __future__ import annotations

import pathlib

import numpy as np
import onnx
import pytest

import jonnx

ort = pytest.importorskip("onnxruntime")

HERE = pathlib.Path(__file__).resolve().parent / "contrib"
RNG = np.random.default_rng(0)


def _inputs(name):
    if name.startswith("bert"):
        mask = np.ones((2, 8), np.int64)
        mask[1, 5:] = 0
        return {
            "input_ids": RNG.integers(0, 50, (2, 8)),
            "attention_mask": mask,
            "token_type_ids": RNG.integers(0, 2, (2, 8)),
        }
    if name.startswith(("gpt2", "llama")):
        return {"input_ids": RNG.integers(0, 50, (2, 8))}
    if name.startswith("vit"):
        return {"pixel_values": RNG.standard_normal((2, 3, 8, 16)).astype(np.float32)}
    if name.startswith("cnn"):
        return {"x": RNG.standard_normal((2, 3, 12, 12)).astype(np.float32)}
    return {"x": RNG.standard_normal((3, 32)).astype(np.float32)}


CASES = {
    "bert_opt0.onnx": {
        "EmbedLayerNormalization",
        "Attention",
        "SkipLayerNormalization",
        "BiasGelu",
    },
    "bert_opt1.onnx": {"Attention", "SkipLayerNormalization", "BiasGelu"},
    "bert_opt2.onnx": {"SkipLayerNormalization", "BiasGelu"},
    "gpt2_opt0.onnx": {"SkipLayerNormalization", "FastGelu"},
    "gpt2_opt1.onnx": {"SkipLayerNormalization", "FastGelu"},
    "gpt2_opt2.onnx": {"SkipLayerNormalization", "FastGelu"},
    "vit_opt1.onnx": {"Attention", "SkipLayerNormalization", "BiasGelu"},
    "vit_opt2.onnx": {"Attention", "SkipLayerNormalization", "BiasGelu"},
    "llama_opt1.onnx": {"SkipSimplifiedLayerNormalization"},
    "llama_opt2.onnx": {"SkipSimplifiedLayerNormalization", "QuickGelu"},
    "bert_opt1_dynamic_int8.onnx": {
        "QAttention",
        "DynamicQuantizeMatMul",
        "SkipLayerNormalization",
    },
    "mlp_dynamic_int8.onnx": {"DynamicQuantizeMatMul"},
    "cnn_extended.onnx": {"FusedConv", "FusedGemm"},
    "mlp_nbits4.onnx": {"MatMulNBits"},
    "mlp_nbits8.onnx": {"MatMulNBits"},
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_onnxruntime_tool_output_runs_and_matches(name):
    path = HERE / name
    proto = onnx.load(path)
    contrib = {n.op_type for n in proto.graph.node if n.domain == "com.microsoft"}
    assert CASES[name] <= contrib, (
        f"{name} was expected to hold {CASES[name]}, has {contrib}"
    )
    assert path.stat().st_size < 300_000
    feeds = _inputs(name)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )
    model = jonnx.load(path)
    got = model(*[feeds[n] for n in model.input_names])
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-4, atol=1e-4, err_msg=name)


def test_contrib_nodes_without_an_opset_import_load_as_version_1():
    # The optimizer's Python fusions write com.microsoft nodes without importing the domain;
    # onnxruntime runs such files, and so does jonnx (every contrib op is version 1).
    proto = onnx.load(HERE / "bert_opt0.onnx")
    assert "com.microsoft" not in {o.domain for o in proto.opset_import}
    assert jonnx.load(proto).graph.nodes

"""Files written by onnxruntime's own tools (tests/models/contrib/make_contrib_models.py):
its transformers optimizer (BERT and GPT-2 at levels 0, 1 and 2, a Llama-style decoder and
a ViT at 1 and 2), quantize_dynamic (on an MLP and on the optimized BERT) plus an
extended-level session, an extended-level session on a CNN, quantize_static on a residual CNN
(QOperator and QDQ formats), and the MatMulNBits quantizer.
jonnx runs each under jit and must match onnxruntime on the same file (its int8 weights stored
as uint8 for onnxruntime, which multiplies exactly that way on every CPU:
tests/_exact_onnxruntime.py)."""

from __future__ import annotations

import pathlib

import jax
import numpy as np
import onnx
import onnx.reference
import pytest

import jonnx
from tests._compiles import count_compiles
from tests._exact_onnxruntime import exact_int8_weights
from tests.ops._harness import node_model

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
    "cnn_static_qoperator.onnx": {"QLinearAdd", "QLinearGlobalAveragePool", "QGemm"},
    "cnn_static_qdq.onnx": set(),  # QuantizeLinear and DequantizeLinear around float ops
    "mlp_nbits4.onnx": {"MatMulNBits"},
    "mlp_nbits8.onnx": {"MatMulNBits"},
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_onnxruntime_tool_output_runs_and_matches(name):
    path = HERE / name
    proto = onnx.load(path)
    contrib = {n.op_type for n in proto.graph.node if n.domain == "com.microsoft"}
    assert CASES[name] <= contrib, f"{name} was expected to hold {CASES[name]}, has {contrib}"
    assert path.stat().st_size < 300_000
    feeds = _inputs(name)
    reference = exact_int8_weights(proto).SerializeToString()
    want = ort.InferenceSession(reference, providers=["CPUExecutionProvider"]).run(None, feeds)
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


# ---------------------------------------------------------------------------------------------
# Real exports (tests/models/contrib/make_contrib_exports.py): transformers models exported by
# torch.onnx.export, then onnxruntime's optimizer, quantizers and the onnxruntime-genai builder.

EXPORTS = HERE / "exports"
EXPORT_CASES = {
    "hf_bert_opt1.onnx": {
        "EmbedLayerNormalization",
        "Attention",
        "SkipLayerNormalization",
        "BiasGelu",
    },
    "hf_bert_opt2.onnx": {
        "EmbedLayerNormalization",
        "Attention",
        "SkipLayerNormalization",
        "BiasGelu",
    },
    # torch's default (dynamo, opset 20) exporter: a different graph for the same fusions.
    "hf_bert_dynamo_opt2.onnx": {"SkipLayerNormalization", "BiasGelu"},
    "hf_llama_dynamo_opt2.onnx": {"SkipSimplifiedLayerNormalization", "QuickGelu"},
    "hf_gpt2_opt1.onnx": {"SkipLayerNormalization", "FastGelu"},
    "hf_gpt2_opt2.onnx": {"SkipLayerNormalization", "FastGelu"},
    "hf_vit_opt1.onnx": {"SkipLayerNormalization", "BiasGelu"},
    "hf_vit_opt2.onnx": {"SkipLayerNormalization", "BiasGelu"},
    "hf_llama_opt1.onnx": {"SkipSimplifiedLayerNormalization"},
    "hf_llama_opt2.onnx": {"QuickGelu"},
    "hf_bert_opt1_dynamic_int8.onnx": {
        "QEmbedLayerNormalization",
        "QAttention",
        "SkipLayerNormalization",
    },
    "hf_gpt2_opt1_dynamic_int8.onnx": {"SkipLayerNormalization", "FastGelu"},
    "hf_llama_opt1_nbits4.onnx": {"MatMulNBits", "SkipSimplifiedLayerNormalization"},
    "hf_llama_opt1_nbits8.onnx": {"MatMulNBits", "SkipSimplifiedLayerNormalization"},
}


def _export_feeds(session):
    mask = np.ones((2, 8), np.int64)
    mask[1, 5:] = 0  # a padded row: the attention mask paths matter
    every = {
        "input_ids": RNG.integers(0, 64, (2, 8)),
        "attention_mask": mask,
        "token_type_ids": RNG.integers(0, 2, (2, 8)),
        "pixel_values": RNG.standard_normal((2, 3, 16, 16)).astype(np.float32),
    }
    return {i.name: every[i.name] for i in session.get_inputs()}


def _contrib_ops(proto):
    return {n.op_type for n in proto.graph.node if n.domain == "com.microsoft"}


@pytest.mark.parametrize("name", sorted(EXPORT_CASES))
def test_optimized_and_quantized_exports_match_onnxruntime(name):
    # The int8 files (quantize_dynamic) and the MatMulNBits ones are held to the float
    # tolerance too: jonnx reproduces onnxruntime's integer arithmetic and dequantization
    # exactly (DynamicQuantizeLinear, MatMulInteger, QAttention's int32 products; MatMulNBits
    # at accuracy_level 0, which MatMulNBitsQuantizer writes), so only float rounding differs.
    # onnxruntime runs the int8 weights as uint8 (tests/_exact_onnxruntime.py): its uint8 x int8
    # kernel saturates on CPUs without VNNI.
    path = EXPORTS / name
    proto = onnx.load(path)
    assert EXPORT_CASES[name] <= _contrib_ops(proto), (
        f"{name} was expected to hold {EXPORT_CASES[name]}, has {_contrib_ops(proto)}"
    )
    assert path.stat().st_size < 300_000
    session = ort.InferenceSession(exact_int8_weights(proto).SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = _export_feeds(session)
    want = session.run(None, feeds)
    model = jonnx.load(path)
    got = model(*[feeds[n] for n in model.input_names])
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-4, atol=1e-4, err_msg=name)


def _genai_feeds(session, ids, mask, past):
    feeds = {"input_ids": ids, "attention_mask": mask}
    for i in session.get_inputs():
        if i.name.startswith("past_key_values."):
            feeds[i.name] = past[i.name.replace("past_key_values", "present")]
        elif i.name == "position_ids":  # as genai computes them: padding does not count
            positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
            feeds[i.name] = positions[:, -ids.shape[1] :]
    return feeds


GENAI_OPS = {"GroupQueryAttention", "MatMulNBits", "SkipSimplifiedLayerNormalization"}


@pytest.mark.parametrize(
    "name,accuracy_level,padding,ops",
    [
        ("genai_llama_int4.onnx", 4, None, GENAI_OPS),
        ("genai_llama_int4.onnx", 0, None, GENAI_OPS),
        ("genai_llama_int4.onnx", 0, "right", GENAI_OPS),
        ("genai_llama_int4.onnx", 0, "left", GENAI_OPS),
        ("genai_llama_tied_int4.onnx", 0, "left", GENAI_OPS | {"GatherBlockQuantized"}),
        (
            "genai_llama_dml_int4.onnx",
            0,
            "left",
            GENAI_OPS | {"GatherBlockQuantized", "RotaryEmbedding"},
        ),
    ],
)
def test_genai_builder_llama_decodes_like_onnxruntime(name, accuracy_level, padding, ops):
    """onnxruntime-genai's int4 Llamas (GroupQueryAttention, MatMulNBits,
    SkipSimplifiedLayerNormalization, default-domain SimplifiedLayerNormalization; tied
    embeddings through GatherBlockQuantized; the DirectML build in float16 with a separate
    RotaryEmbedding): a prompt, then two tokens with the past key/values onnxruntime returned,
    jonnx under jit each time. With ``padding`` the second prompt is two tokens shorter
    (GroupQueryAttention's seqlens_k differs per row; its present cache holds zeros past each
    row's length, in both).

    As shipped the builder sets MatMulNBits accuracy_level=4, where onnxruntime quantizes A to
    int8 per block before multiplying; jonnx multiplies in float, so the outputs differ by
    that rounding (measured 3e-3 on logits of size ~1): tolerance 1e-2 there. With
    accuracy_level=0 onnxruntime multiplies in float too and the tolerance is 1e-4 (float16
    files: 2e-3, measured 5e-4)."""
    proto = onnx.load(EXPORTS / name)
    assert ops <= _contrib_ops(proto), f"{name} holds {_contrib_ops(proto)}"
    assert "SimplifiedLayerNormalization" in {n.op_type for n in proto.graph.node if n.domain == ""}
    for node in proto.graph.node:
        for attr in node.attribute:
            if attr.name == "accuracy_level":
                attr.i = accuracy_level
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    half = "float16" in session.get_inputs()[-1].type
    tol = 1e-2 if accuracy_level == 4 else 2e-3 if half else 1e-4
    model = jonnx.load(proto)
    names = [o.name for o in session.get_outputs()]
    batch, prompt = 2, 6
    past = {
        out: np.zeros((batch, 1, 0, 16), np.float16 if half else np.float32)
        for out in names
        if out.startswith("present.")
    }
    ids = RNG.integers(0, 64, (batch, prompt))
    mask = np.ones((batch, prompt), np.int64)
    if padding == "right":
        mask[1, -2:] = 0
    elif padding == "left":
        mask[1, :2] = 0
    for step in range(3):
        feeds = _genai_feeds(session, ids, mask, past)
        want = session.run(None, feeds)
        got = model(*[feeds[n] for n in model.input_names])
        assert len(got) == len(names)
        for out, g, w in zip(names, got, want):
            assert np.shape(g) == w.shape and np.asarray(g).dtype == w.dtype, out
            np.testing.assert_allclose(
                np.asarray(g, np.float32),
                w.astype(np.float32),
                rtol=tol,
                atol=tol,
                err_msg=f"{out}, step {step}",
            )
        past = dict(zip(names, want))  # both continue from onnxruntime's cache
        ids = want[0][:, -1].argmax(-1)[:, None]
        mask = np.concatenate([mask, np.ones((batch, 1), np.int64)], axis=1)


def test_the_int8_weight_rewrite_keeps_the_function_and_makes_onnxruntime_exact():
    # tests/_exact_onnxruntime.py: the rewritten model is the same function (the ONNX reference
    # evaluator gives the same integers for both), and onnxruntime computes it exactly, full-range
    # operands included (int64 numpy), on CPUs where its uint8 x int8 kernel saturates too.
    a = RNG.integers(0, 256, (64, 64)).astype(np.uint8)
    b = RNG.integers(-128, 128, (64, 32)).astype(np.int8)
    b[:, 0] = 127
    a[0] = 255
    inputs = {"a": a, "b": b, "za": None, "zb": np.array(-3, np.int8)}
    model = node_model("MatMulInteger", inputs, opset=10, initializers=("b", "zb"))
    rewritten = exact_int8_weights(model)
    assert {t.data_type for t in rewritten.graph.initializer if t.name.startswith("b__uint8")} == {
        onnx.TensorProto.UINT8
    }
    want = a.astype(np.int64) @ (b.astype(np.int64) + 3)
    reference = onnx.reference.ReferenceEvaluator
    np.testing.assert_array_equal(reference(rewritten).run(None, {"a": a})[0], want)
    np.testing.assert_array_equal(reference(model).run(None, {"a": a})[0], want)
    session = ort.InferenceSession(rewritten.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(session.run(None, {"a": a})[0], want)


def test_a_qdq_models_first_call_compiles_the_network_once():
    # Its weights' DequantizeLinear nodes run once, in the prepared weights' trace; the int8
    # weights' conversions ran eagerly in JAX there, compiling per weight shape (30
    # computations for this model's first call), and run in numpy now.
    jax.clear_caches()  # what an earlier test compiled for the same shapes would hide them
    model = jonnx.load(HERE / "cnn_static_qdq.onnx")
    with count_compiles() as compiled:
        model(_inputs("cnn_static_qdq.onnx")["x"])
    assert len(compiled) <= 3, compiled  # the prepared weights, the network, slack for one more

"""examples/llm_decoding.py: greedy decoding of a genai-style decoder under one jax.jit.

The expected tokens come from onnxruntime running the same file step by step.
"""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

import jonnx
from tests._compiles import count_compiles
from tests._scripts import load_script

ort = pytest.importorskip("onnxruntime")

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "llm_decoding.py"
ex = load_script(EXAMPLE, "_jonnx_example_llm_decoding")


@pytest.fixture(scope="module")
def decoder():
    proto = ex.build_decoder()
    return proto, jonnx.load(proto)


def test_the_decoder_uses_the_genai_contrib_ops(decoder):
    proto, _ = decoder
    ops = {n.op_type for n in proto.graph.node}
    assert {
        "GroupQueryAttention",
        "MatMulNBits",
        "SkipSimplifiedLayerNormalization",
        "SimplifiedLayerNormalization",
    } <= ops


def test_greedy_decoding_matches_onnxruntime_for_32_steps_with_one_compilation(decoder):
    proto, model = decoder
    prompt = np.random.default_rng(1).integers(0, ex.VOCAB, (2, 5)).astype(np.int64)
    decode = ex.generate(model, prompt, 32)
    with count_compiles() as compiles:
        tokens = np.asarray(decode(model.params, prompt))
    assert len(compiles) == 1, f"{len(compiles)} compilations for the whole loop"
    np.testing.assert_array_equal(tokens, ex.onnxruntime_generate(proto, prompt, 32))
    # A second prompt of the same shape reuses the compiled loop.
    other = np.random.default_rng(2).integers(0, ex.VOCAB, (2, 5)).astype(np.int64)
    with count_compiles() as compiles:
        again = np.asarray(decode(model.params, other))
    assert not compiles
    np.testing.assert_array_equal(again, ex.onnxruntime_generate(proto, other, 32))


def test_finetuning_the_float_weights_lowers_the_loss(decoder):
    _, model = decoder
    sequence = np.random.default_rng(3).integers(0, ex.VOCAB, (2, 10)).astype(np.int64)
    losses, params = ex.finetune(model, sequence, steps=4)
    assert losses[-1] < 0.7 * losses[0], losses
    # The 4-bit weights' scales are float parameters too, and training moved them.
    name = "layers.0.q_proj.scales"
    assert name in params and not np.allclose(np.asarray(params[name]), np.asarray(model.params[name]))

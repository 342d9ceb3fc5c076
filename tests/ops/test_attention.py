"""Attention, RotaryEmbedding, SwiGLU, CausalConvWithState, LinearAttention and FlexAttention
against onnx's ReferenceEvaluator (onnx 1.23 carries the errata: bottom-right causal
alignment, zero rows for fully-masked queries), plus gradients and error cases."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.test_util
import numpy as np
import onnx
import onnx.helper as oh
import pytest

import jonnx
from jonnx import errors
from tests.ops._harness import (
    assert_half_rounds_once,
    assert_matches_reference,
    check_op_grads,
    node_model,
    run_jonnx,
    run_reference,
)

RNG = np.random.default_rng(0)


def _rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def _qkv(rank, b=2, hq=4, hkv=2, sq=3, skv=5, d=8, dv=6, dtype=np.float32):
    if rank == 4:
        shapes = (b, hq, sq, d), (b, hkv, skv, d), (b, hkv, skv, dv)
    else:
        shapes = (b, sq, hq * d), (b, skv, hkv * d), (b, skv, hkv * dv)
    return tuple(_rand(*shape, dtype=dtype) for shape in shapes)


def _heads(rank, hq=4, hkv=2):
    return {"q_num_heads": hq, "kv_num_heads": hkv} if rank == 3 else {}


# ---------------------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "opset,rank,hkv",  # hkv: MHA, GQA, MQA
    [(23, 4, 4), (23, 3, 2), (24, 4, 2), (24, 3, 1), (25, 4, 1), (25, 3, 4)],
)
def test_attention_heads(opset, rank, hkv):
    q, k, v = _qkv(rank, hkv=hkv)
    assert_matches_reference("Attention", {"q": q, "k": k, "v": v}, opset=opset, **_heads(rank, hkv=hkv))


@pytest.mark.parametrize(
    "mask_kind,causal",
    [("bool", 0), ("bool", 1), ("float", 0), ("float", 1), ("bool_short", 0), ("float_short", 1), (None, 1)],
)
def test_attention_masks_and_cache(mask_kind, causal):
    q, k, v = _qkv(4)
    past_k, past_v = _rand(2, 2, 2, 8), _rand(2, 2, 2, 6)
    total = 5 + 2
    width = total - 2 if mask_kind and mask_kind.endswith("short") else total
    mask = None
    if mask_kind and mask_kind.startswith("bool"):
        mask = RNG.random((4, 3, width)) > 0.3  # (heads, q, kv): right-aligned broadcast
        mask[..., 0] = True
    elif mask_kind:
        mask = _rand(3, width)
    inputs = {"q": q, "k": k, "v": v, "mask": mask, "past_k": past_k, "past_v": past_v}
    assert_matches_reference("Attention", inputs, 4, opset=24, is_causal=causal, qk_matmul_output_mode=2)


@pytest.mark.parametrize("mode", [0, 1, 2, 3])
@pytest.mark.parametrize("softcap", [0.0, 2.0])
def test_attention_qk_output_modes(mode, softcap):
    q, k, v = _qkv(4, hkv=4)
    inputs = {"q": q * 3, "k": k, "v": v, "mask": _rand(3, 5)}
    attrs = {"qk_matmul_output_mode": mode, "softcap": softcap, "scale": 0.3}
    expected = None
    if mode == 0 and softcap:
        # Mode 0 is the raw Q.K^T product (spec text and the schema's function body, which
        # takes it before the Tanh); onnx's Python reference returns the softcapped value.
        want = run_reference(node_model("Attention", inputs, 4, opset=23, **attrs), inputs)
        root = np.float32(np.sqrt(0.3))
        want[3] = ((inputs["q"] * root) @ np.swapaxes(k * root, -1, -2)).astype(np.float32)
        expected = want
    assert_matches_reference("Attention", inputs, 4, opset=23, expected=expected, **attrs)


@pytest.mark.parametrize("opset", [23, 24])
def test_attention_fully_masked_rows_are_zero_not_nan(opset):
    q, k, v = _qkv(4)
    mask = np.ones((3, 5), bool)
    mask[1] = False  # query 1 sees no key
    got = assert_matches_reference(
        "Attention",
        {"q": q, "k": k, "v": v, "mask": mask},
        4,
        opset=opset,
        qk_matmul_output_mode=3,
    )
    assert np.all(got[0][:, :, 1] == 0) and np.all(got[3][:, :, 1] == 0)
    # The gradient stays finite through the masked row (double-where), and matches finite
    # differences elsewhere.
    if opset == 24:
        check_op_grads("Attention", {"q": q, "k": k, "v": v, "mask": mask}, opset=opset, wrt=["q", "k", "v"])


def test_attention_softmax_precision_fp16():
    q, k, v = _qkv(4, dtype=np.float16)
    assert_matches_reference(
        "Attention",
        {"q": q, "k": k, "v": v},
        4,
        opset=24,
        is_causal=1,
        softmax_precision=onnx.TensorProto.FLOAT,
        qk_matmul_output_mode=3,
        rtol=2e-3,
        atol=2e-3,
    )


@pytest.mark.parametrize("causal", [0, 1])
def test_attention_nonpad_kv_seqlen(causal):
    # External cache (opset 24): keys past nonpad_kv_seqlen[b] are padding; the causal frontier
    # sits at nonpad - q_len, so batch 1 (nonpad 2 < q_len 3) has a fully masked first row.
    q, k, v = _qkv(4, skv=6)
    nonpad = np.array([6, 2], np.int64)
    assert_matches_reference(
        "Attention",
        {"q": q, "k": k, "v": v, "mask": None, "pk": None, "pv": None, "nonpad": nonpad},
        opset=24,
        is_causal=causal,
    )


@pytest.mark.parametrize("left,right,causal", [(2, 0, 0), (1, 1, 0), (2, -1, 1), (-1, 1, 0)])
def test_attention_sliding_window(left, right, causal):
    q, k, v = _qkv(3, sq=4, skv=6)
    mask = RNG.random((4, 6)) > 0.2
    assert_matches_reference(
        "Attention",
        {"q": q, "k": k, "v": v, "mask": mask},
        opset=25,
        is_causal=causal,
        left_window_size=left,
        right_window_size=right,
        **_heads(3),
    )


@pytest.mark.parametrize("rank,causal", [(4, 1), (3, 0)])
def test_attention_grads(rank, causal):
    q, k, v = _qkv(rank, b=1, sq=2, skv=3, d=4, dv=3)
    check_op_grads("Attention", {"q": q, "k": k, "v": v}, opset=24, is_causal=causal, softcap=3.0, **_heads(rank))


def test_attention_jit_with_traced_nonpad():
    q, k, v = _qkv(4, skv=6)
    nonpad = np.array([4, 6], np.int64)
    model = node_model(
        "Attention", {"q": q, "k": k, "v": v, "m": None, "pk": None, "pv": None, "n": nonpad}, opset=24, is_causal=1
    )
    want = run_jonnx(model, {"q": q, "k": k, "v": v, "n": nonpad})[0]
    m = jonnx.load(model)
    got = jax.jit(lambda *a: m.apply(m.params, *a)[0])(q, k, v, jnp.asarray(nonpad, jnp.int32))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)


def _ones(*shape):
    return np.ones(shape, np.float32)


@pytest.mark.parametrize(
    "inputs,attrs,opset,match",
    [
        (
            {"q": _ones(1, 2, 3, 4), "k": _ones(1, 2, 3, 4), "v": _ones(1, 2, 3, 4)},
            {"q_num_heads": 2, "kv_num_heads": 2},
            25,
            "must not be set for 4-D",
        ),
        (
            {"q": _ones(1, 3, 8), "k": _ones(1, 3, 8), "v": _ones(1, 3, 8)},
            {"q_num_heads": 3, "kv_num_heads": 2},
            23,
            "q_num_heads",
        ),
        (
            {
                "q": _ones(1, 2, 3, 4),
                "k": _ones(1, 2, 3, 4),
                "v": _ones(1, 2, 3, 4),
                "m": None,
                "pk": _ones(1, 2, 1, 4),
            },
            {},
            23,
            "together",
        ),
        ({"q": _ones(1, 3, 3, 4), "k": _ones(1, 2, 3, 4), "v": _ones(1, 2, 3, 4)}, {}, 23, "grouped"),
    ],
)
def test_attention_errors(inputs, attrs, opset, match):
    model = node_model("Attention", inputs, opset=opset, **attrs)
    with pytest.raises(errors.NodeError, match=match):
        run_jonnx(model, inputs)


@pytest.mark.parametrize("opset", [23, 24])
def test_attention_for_the_xla_emitter_alone(opset):
    # Compiled for XLA's emitter alone, the softmax takes its row maximum by halves: the same
    # results bit for bit, a row with every key masked (zero) included.
    mask = np.ones((4, 5), bool)
    mask[1] = False
    inputs = {"q": _rand(2, 3, 4, 8), "k": _rand(2, 3, 5, 8), "v": _rand(2, 3, 5, 8), "m": mask}
    m = jonnx.load(node_model("Attention", inputs, opset=opset))
    args = list(inputs.values())
    default = jax.jit(lambda *a: m.apply(m.params, *a)[0])
    for_xla = jax.jit(jonnx._jit._tracing_for(jonnx._jit.XLA_DOTS, lambda *a: m.apply(m.params, *a)[0]))
    want = np.asarray(default(*args))
    assert np.all(want[:, :, 1] == 0) and np.all(np.isfinite(want))
    np.testing.assert_array_equal(np.asarray(for_xla(*args)), want)


# ---------------------------------------------------------------------------------------
# RotaryEmbedding
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "rank,interleaved,rot_dim,with_pos",
    [(4, 0, 0, True), (4, 1, 4, True), (3, 1, 0, True), (3, 0, 4, False), (4, 1, 0, False), (3, 0, 0, False)],
)
def test_rotary_embedding(rank, interleaved, rot_dim, with_pos):
    b, s, h, d = 2, 3, 2, 8
    x = _rand(b, h, s, d) if rank == 4 else _rand(b, s, h * d)
    half = (rot_dim or d) // 2
    if with_pos:
        cos, sin = _rand(10, half), _rand(10, half)
        pos = RNG.integers(0, 10, (b, s)).astype(np.int64)
    else:
        cos, sin, pos = _rand(b, s, half), _rand(b, s, half), None
    attrs = {"num_heads": h} if rank == 3 else {}
    inputs = {"x": x, "cos": cos, "sin": sin, "pos": pos}
    assert_matches_reference(
        "RotaryEmbedding", inputs, opset=23, interleaved=interleaved, rotary_embedding_dim=rot_dim, **attrs
    )
    if rank == 4 and with_pos and interleaved:
        check_op_grads(
            "RotaryEmbedding",
            inputs,
            opset=23,
            wrt=["x", "cos", "sin"],
            interleaved=interleaved,
            rotary_embedding_dim=rot_dim,
        )


def test_rotary_embedding_float16():
    x, cos, sin = (
        _rand(1, 2, 3, 4, dtype=np.float16),
        _rand(1, 3, 2, dtype=np.float16),
        _rand(1, 3, 2, dtype=np.float16),
    )
    assert_matches_reference("RotaryEmbedding", {"x": x, "cos": cos, "sin": sin}, opset=23, rtol=1e-3, atol=1e-3)


def test_rotary_embedding_rejects_bad_cache():
    inputs = {"x": _rand(1, 2, 3, 8), "cos": _rand(1, 3, 3), "sin": _rand(1, 3, 3)}
    with pytest.raises(errors.NodeError, match="cos_cache"):
        run_jonnx(node_model("RotaryEmbedding", inputs, opset=23), inputs)


# ---------------------------------------------------------------------------------------
# SwiGLU
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype,tol", [(np.float32, 1e-6), (np.float64, 1e-12), (np.float16, 1e-3)])
@pytest.mark.parametrize("alpha", [1.0, 1.702])
def test_swiglu(dtype, tol, alpha):
    a, b = _rand(3, 4, dtype=dtype), _rand(3, 4, dtype=dtype)
    assert_matches_reference("SwiGLU", {"a": a, "b": b}, opset=28, alpha=alpha, rtol=tol, atol=tol)
    if dtype == np.float64:
        check_op_grads("SwiGLU", {"a": a, "b": b}, opset=28, alpha=alpha)


def test_swiglu_rejects_broadcasting():
    inputs = {"a": _rand(3, 4), "b": _rand(4)}
    with pytest.raises(errors.NodeError, match="identical shapes"):
        run_jonnx(node_model("SwiGLU", inputs, opset=28), inputs)


# ---------------------------------------------------------------------------------------
# CausalConvWithState
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "k,length,activation,with_bias,with_past",
    [
        (4, 6, "none", False, False),
        (4, 6, "silu", True, True),
        (1, 3, "silu", False, False),
        (1, 3, "none", True, True),
        (4, 2, "none", False, False),
        (4, 2, "silu", True, True),
    ],
)
def test_causal_conv_with_state(k, length, activation, with_bias, with_past):
    b, c = 2, 3
    inputs = {
        "x": _rand(b, c, length),
        "w": _rand(c, 1, k),
        "bias": _rand(c) if with_bias else None,
        "past": _rand(b, c, k - 1) if with_past else None,
    }
    assert_matches_reference("CausalConvWithState", inputs, 2, opset=27, activation=activation)
    if k == 4 and length == 6 and with_past:
        check_op_grads("CausalConvWithState", inputs, opset=27, n_outputs=2, activation=activation)


def test_causal_conv_with_state_float16():
    inputs = {"x": _rand(1, 2, 5, dtype=np.float16), "w": _rand(2, 1, 3, dtype=np.float16)}
    assert_matches_reference("CausalConvWithState", inputs, 2, opset=27, activation="swish", rtol=2e-3, atol=2e-3)


def test_causal_conv_with_state_rejects_activation():
    inputs = {"x": _rand(1, 2, 5), "w": _rand(2, 1, 3)}
    with pytest.raises(errors.NodeError, match="activation"):
        run_jonnx(node_model("CausalConvWithState", inputs, 2, opset=27, activation="gelu"), inputs)


# ---------------------------------------------------------------------------------------
# LinearAttention
# ---------------------------------------------------------------------------------------


def _linear_inputs(rule, b=2, t=4, hq=4, hkv=2, dk=3, dv=5, per_head_decay=False, past=True, dtype=np.float32):
    k = _rand(b, t, hkv, dk)
    k = (k / np.linalg.norm(k, axis=-1, keepdims=True)).reshape(b, t, hkv * dk)
    inputs = {
        "q": _rand(b, t, hq * dk, dtype=dtype),
        "k": k.astype(dtype),
        "v": _rand(b, t, hkv * dv, dtype=dtype),
        "past": (_rand(b, hkv, dk, dv, dtype=dtype) * 0.1) if past else None,
        "decay": None,
        "beta": None,
    }
    if rule in ("gated", "gated_delta"):
        width = hkv if per_head_decay else hkv * dk
        inputs["decay"] = -RNG.uniform(0.05, 0.5, (b, t, width)).astype(dtype)
    if rule in ("delta", "gated_delta"):
        inputs["beta"] = RNG.uniform(0.1, 0.9, (b, t, hkv)).astype(dtype)
    return inputs


@pytest.mark.parametrize("rule", ["linear", "gated", "delta", "gated_delta"])
@pytest.mark.parametrize("hkv", [2, 1])
def test_linear_attention(rule, hkv):
    inputs = _linear_inputs(rule, hkv=hkv, per_head_decay=hkv == 1)
    assert_matches_reference(
        "LinearAttention",
        inputs,
        2,
        opset=27,
        update_rule=rule,
        q_num_heads=4,
        kv_num_heads=hkv,
        rtol=1e-5,
        atol=1e-5,
    )


def test_linear_attention_fp16_no_past_explicit_scale():
    inputs = _linear_inputs("gated_delta", past=False, dtype=np.float16)
    assert_matches_reference(
        "LinearAttention",
        inputs,
        2,
        opset=27,
        q_num_heads=4,
        kv_num_heads=2,
        scale=0.7,
        rtol=2e-3,
        atol=2e-3,
    )


def test_linear_attention_grads():
    inputs = _linear_inputs("gated_delta", b=1, t=3, hq=2, hkv=1, dk=2, dv=2)
    check_op_grads(
        "LinearAttention", inputs, opset=27, n_outputs=2, q_num_heads=2, kv_num_heads=1, wrt=["q", "k", "v", "past"]
    )


def test_linear_attention_requires_decay():
    inputs = _linear_inputs("linear")
    with pytest.raises(errors.NodeError, match="requires the decay"):
        run_jonnx(node_model("LinearAttention", inputs, 2, opset=27, q_num_heads=4, kv_num_heads=2), inputs)


# ---------------------------------------------------------------------------------------
# FlexAttention (ai.onnx.preview)
# ---------------------------------------------------------------------------------------


def _causal_score_mod(s_len):
    """A score_mod graph adding -inf above the diagonal (a triangular constant)."""
    tri = np.triu(np.full((s_len, s_len), -np.inf, np.float32), 1)
    node_c = oh.make_node("Constant", [], ["tri"], value=onnx.numpy_helper.from_array(tri))
    node_a = oh.make_node("Add", ["s", "tri"], ["out"])
    return oh.make_graph(
        [node_c, node_a],
        "score_mod",
        [oh.make_tensor_value_info("s", onnx.TensorProto.FLOAT, None)],
        [oh.make_tensor_value_info("out", onnx.TensorProto.FLOAT, None)],
    )


def _square_prob_mod():
    node = oh.make_node("Mul", ["p", "p"], ["out"])
    return oh.make_graph(
        [node],
        "prob_mod",
        [oh.make_tensor_value_info("p", onnx.TensorProto.FLOAT, None)],
        [oh.make_tensor_value_info("out", onnx.TensorProto.FLOAT, None)],
    )


def _flex_check(inputs, rtol=1e-5, atol=1e-6, **attrs):
    model = node_model("FlexAttention", inputs, opset=1, domain="ai.onnx.preview", **attrs)
    want = run_reference(model, inputs)[0]
    for jit in (True, False):
        got = run_jonnx(model, inputs, jit=jit)[0]
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol)


@pytest.mark.parametrize("hkv", [4, 2])
@pytest.mark.parametrize("mods", ["none", "score", "prob", "both"])
def test_flex_attention(hkv, mods):
    q, k, v = _qkv(4, hkv=hkv, sq=5, skv=5)
    attrs = {"scale": 0.5}
    if mods in ("score", "both"):
        attrs["score_mod"] = _causal_score_mod(5)
    if mods in ("prob", "both"):
        attrs["prob_mod"] = _square_prob_mod()
    _flex_check({"q": q, "k": k, "v": v}, **attrs)


def test_flex_attention_fp16_softmax_in_float32():
    q, k, v = _qkv(4, dtype=np.float16)
    _flex_check({"q": q, "k": k, "v": v}, rtol=2e-3, atol=2e-3)


def test_flex_attention_grads():
    arrays = _qkv(4, b=1, hq=2, hkv=1, sq=2, skv=3, d=3, dv=2)
    with jax.enable_x64(True):
        q, k, v = (jnp.asarray(a, jnp.float64) for a in arrays)
        jax.test_util.check_grads(
            lambda *a: jonnx.ops.call("FlexAttention", *a, domain="ai.onnx.preview"),
            (q, k, v),
            order=1,
            modes=("fwd", "rev"),
            eps=1e-4,
            rtol=1e-3,
            atol=1e-3,
        )


@pytest.mark.parametrize("interleaved", [0, 1])
def test_half_precision_rotary_embedding_rounds_once(interleaved):
    # Rotated in float32 and rounded once, as onnxruntime does: the two products and the sum
    # rounded one by one in float16 left a third of the outputs a unit off.
    b, h, s, d = 1, 4, 16, 32
    inputs = {
        "x": RNG.standard_normal((b, h, s, d)),
        "cos": RNG.standard_normal((s, d // 2)),
        "sin": RNG.standard_normal((s, d // 2)),
        "pos": np.arange(s, dtype=np.int64)[None],
    }
    assert_half_rounds_once("RotaryEmbedding", inputs, opset=23, interleaved=interleaved)

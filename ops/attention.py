"""Attention and the newest transformer ops: Attention, RotaryEmbedding, SwiGLU,
LinearAttention, CausalConvWithState and ``ai.onnx.preview`` FlexAttention.

Attention never materialises the repeated K/V heads of grouped-query attention: Q is viewed
as ``(batch, kv_heads, group, q_len, head)`` and contracted against each K/V head once.
Every mask (``attn_mask``, ``is_causal``, the opset-25 window, ``nonpad_kv_seqlen``) is folded
into one additive bias of 0/-inf (plus a float mask's values); a query row whose bias is -inf
everywhere has no key to attend to and yields zeros, as the spec's errata require. Such rows
are replaced by zeros *before* the softmax too, so no NaN reaches the forward pass or the
gradient (the double-where trick).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jonnx._registry import Attrs, Inputs, OpContext, Outputs, register
from jonnx.ops._util import compute_type, half_in_float32, onnx_dtype, widen_halves
from jonnx.ops.activation import softmax

# ---------------------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------------------


def split_heads(x, num_heads, what, attr, ctx):
    """(batch, seq, heads * size) -> (batch, heads, seq, size)."""
    b, s, hidden = jnp.shape(x)
    if num_heads is None or num_heads <= 0 or hidden % num_heads:
        raise ctx.error(
            f"3-D {what} of hidden size {hidden} needs a positive {attr} attribute that divides it (got {num_heads})"
        )
    return jnp.transpose(jnp.reshape(x, (b, s, num_heads, hidden // num_heads)), (0, 2, 1, 3))


def _attention_bias(mask, dtype, *, q_len, kv_len, causal_offset, causal, window, nonpad):
    """The additive bias (0 / -inf / float mask values), broadcastable to (B, H, q, kv)."""
    neg_inf = jnp.asarray(-jnp.inf, dtype)
    zero = jnp.asarray(0, dtype)
    bias = jnp.zeros((q_len, kv_len), dtype)
    if mask is not None:
        pad = kv_len - jnp.shape(mask)[-1]
        is_bool = jnp.result_type(mask) == jnp.bool_
        if pad > 0:  # a short mask's missing keys are masked out
            widths = [(0, 0)] * (jnp.ndim(mask) - 1) + [(0, pad)]
            mask = jnp.pad(mask, widths, constant_values=False if is_bool else -jnp.inf)
        bias = bias + (jnp.where(mask, zero, neg_inf) if is_bool else jnp.asarray(mask).astype(dtype))
    # Absolute query position i + offset against key j; offset is per batch for an external
    # cache (nonpad_kv_seqlen), so these are (B, 1, q, kv) or (q, kv).
    i = jnp.arange(q_len)[:, None]
    j = jnp.arange(kv_len)[None, :]
    offset = causal_offset if jnp.ndim(causal_offset) == 0 else jnp.reshape(causal_offset, (-1, 1, 1, 1))
    diff = i + offset - j
    allowed = None
    left, right = window
    for cond, on in ((diff >= 0, causal), (diff <= left, left >= 0), (-diff <= right, right >= 0)):
        if on:
            allowed = cond if allowed is None else allowed & cond
    if nonpad is not None:
        valid = j < jnp.reshape(nonpad, (-1, 1, 1, 1))
        allowed = valid if allowed is None else allowed & valid
    if allowed is not None:
        bias = bias + jnp.where(allowed, zero, neg_inf)
    return bias


def _attention(q, k, v, mask, past_k, past_v, nonpad, attrs, ctx, window=None):
    """Attention with an optional (left, right) sliding window (opset 25; None before)."""
    rank = jnp.ndim(q)
    if not (rank == jnp.ndim(k) == jnp.ndim(v)) or rank not in (3, 4):
        raise ctx.error(
            f"Q, K and V must all be 3-D or all 4-D; got shapes {jnp.shape(q)}, {jnp.shape(k)}, {jnp.shape(v)}"
        )
    if (past_k is None) != (past_v is None):
        raise ctx.error("past_key and past_value must be given together")
    if nonpad is not None and past_k is not None:
        raise ctx.error("nonpad_kv_seqlen cannot be combined with past_key/past_value")
    q_heads, kv_heads = attrs["q_num_heads"], attrs["kv_num_heads"]
    if rank == 3:
        q = split_heads(q, q_heads, "Q", "q_num_heads", ctx)
        k = split_heads(k, kv_heads, "K", "kv_num_heads", ctx)
        v = split_heads(v, kv_heads, "V", "kv_num_heads", ctx)
    elif window is not None and (q_heads is not None or kv_heads is not None):
        raise ctx.error("q_num_heads and kv_num_heads must not be set for 4-D inputs (opset 25)")
    dtype = jnp.result_type(q)
    batch, hq, q_len, head = jnp.shape(q)
    hkv = jnp.shape(k)[1]
    if hq % hkv or jnp.shape(v)[1] != hkv:
        raise ctx.error(f"{hq} query heads cannot be grouped over {hkv} key / {jnp.shape(v)[1]} value heads")

    if past_k is not None:
        k = jnp.concatenate([jnp.asarray(past_k, dtype), k], axis=2)
        v = jnp.concatenate([jnp.asarray(past_v, jnp.result_type(v)), v], axis=2)
    present_k, present_v = k, v
    kv_len = jnp.shape(k)[2]

    scale = attrs["scale"]
    if scale is None:
        scale = 1.0 / math.sqrt(head)
    # Q and K are each scaled by sqrt(scale) (in Q's dtype) against overflow, as the spec says.
    root = jnp.asarray(math.sqrt(scale), dtype)
    group = hq // hkv
    qg = jnp.reshape(q * root, (batch, hkv, group, q_len, head))
    scores = jnp.einsum("bhgqd,bhkd->bhgqk", qg, k * root, precision=ctx.precision)
    scores = jnp.reshape(scores, (batch, hq, q_len, kv_len))
    raw = scores
    softcap = attrs["softcap"]
    if softcap > 0:
        scores = softcap * jnp.tanh(scores / softcap)
    capped = scores

    # Causal and window masks align bottom-right: offset = how many valid keys precede the
    # query block (the past length, or per batch nonpad_kv_seqlen - q_len for an external cache).
    if past_k is not None:
        offset = jnp.shape(past_k)[2]
    elif nonpad is not None:
        offset = jnp.asarray(nonpad) - q_len
    else:
        offset = 0
    window = window or (-1, -1)
    if min(window) < -1:
        raise ctx.error(f"window sizes must be -1 or nonnegative, got {window}")
    bias = _attention_bias(
        mask,
        dtype,
        q_len=q_len,
        kv_len=kv_len,
        causal_offset=offset,
        causal=bool(attrs["is_causal"]),
        window=window,
        nonpad=nonpad,
    )
    scores = scores + bias

    precision = attrs["softmax_precision"]
    soft_dtype = dtype if precision is None else onnx_dtype(precision)
    # A row with no attendable key (decided on the bias, never on the logits) is zero; it is
    # zeroed before the softmax as well so that neither value nor gradient sees a NaN.
    dead = jnp.isneginf(jnp.max(bias, axis=-1, keepdims=True))
    logits = jnp.where(dead, jnp.zeros((), soft_dtype), scores.astype(soft_dtype))
    probs = jnp.where(dead, jnp.zeros((), soft_dtype), softmax(logits, -1)).astype(dtype)

    mode = attrs["qk_matmul_output_mode"]
    if mode not in (0, 1, 2, 3):
        raise ctx.error(f"qk_matmul_output_mode must be 0, 1, 2 or 3, got {mode}")

    pg = jnp.reshape(probs, (batch, hkv, group, q_len, kv_len)).astype(jnp.result_type(v))
    y = jnp.einsum("bhgqk,bhkd->bhgqd", pg, v, precision=ctx.precision)
    y = jnp.reshape(y, (batch, hq, q_len, -1)).astype(dtype)
    if rank == 3:
        y = jnp.reshape(jnp.transpose(y, (0, 2, 1, 3)), (batch, q_len, -1))
    if ctx.n_outputs is not None and ctx.n_outputs < 4:
        return y, present_k, present_v
    qk_out = (raw, capped, scores, probs)[mode]
    return y, present_k, present_v, jnp.broadcast_to(qk_out, (batch, hq, q_len, kv_len)).astype(dtype)


@register("Attention", since=23)
def attention_23(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Attention``-23."""
    q, k, v, mask, past_k, past_v = inputs
    return _attention(q, k, v, mask, past_k, past_v, None, attrs, ctx)


@register("Attention", since=24)
def attention(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Attention``-24: adds the ``nonpad_kv_seqlen`` input."""
    return _attention(*inputs, attrs, ctx)


@register("Attention", since=25)
def attention_windowed(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Attention``, opsets 25+: adds ``left_window_size``/``right_window_size``."""
    window = (attrs["left_window_size"], attrs["right_window_size"])
    return _attention(*inputs, attrs, ctx, window=window)


# ---------------------------------------------------------------------------------------
# RotaryEmbedding
# ---------------------------------------------------------------------------------------


@register("RotaryEmbedding", since=23)
def rotary_embedding(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``RotaryEmbedding``, opsets 23+."""
    x, cos, sin, position_ids = (tuple(inputs) + (None,))[:4]
    shape = jnp.shape(x)
    if jnp.ndim(x) == 4:
        xs = jnp.transpose(x, (0, 2, 1, 3))  # (batch, seq, heads, head)
    elif jnp.ndim(x) == 3:
        heads = attrs["num_heads"]
        if not heads or shape[2] % heads:
            raise ctx.error(f"3-D input of hidden size {shape[2]} needs num_heads dividing it (got {heads})")
        xs = jnp.reshape(x, (shape[0], shape[1], heads, shape[2] // heads))
    else:
        raise ctx.error(f"input must be 3-D or 4-D, got shape {shape}")
    head = jnp.shape(xs)[3]
    dim = attrs["rotary_embedding_dim"] or head  # the schema: 0 (its default) rotates the whole head
    if dim > head or dim % 2:
        raise ctx.error(f"rotary_embedding_dim {dim} must be even and at most head_size {head}")
    if position_ids is not None:
        cos = jnp.take(cos, position_ids, axis=0)
        sin = jnp.take(sin, position_ids, axis=0)
    for name, c in (("cos_cache", cos), ("sin_cache", sin)):
        if jnp.shape(c)[-1] != dim // 2:
            raise ctx.error(f"{name} last dim {jnp.shape(c)[-1]} != rotary_embedding_dim / 2 = {dim // 2}")
    # Half types: rotated in float32 and rounded once, as onnxruntime does (two products and
    # a sum rounded one by one in float16 left a third of the outputs a unit off).
    rot, keep = xs[..., :dim], xs[..., dim:]
    rot, cos, sin = widen_halves(rot, cos, sin)
    cos = jnp.expand_dims(cos, 2)
    sin = jnp.expand_dims(sin, 2)
    if attrs["interleaved"]:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
    else:
        x1, x2 = rot[..., : dim // 2], rot[..., dim // 2 :]
    real = cos * x1 - sin * x2
    imag = sin * x1 + cos * x2
    if attrs["interleaved"]:
        rot = jnp.reshape(jnp.stack([real, imag], axis=-1), jnp.shape(rot))
    else:
        rot = jnp.concatenate([real, imag], axis=-1)
    out = jnp.concatenate([rot.astype(jnp.result_type(x)), keep], axis=-1)
    if jnp.ndim(x) == 3:
        return (jnp.reshape(out, shape),)
    return (jnp.transpose(out, (0, 2, 1, 3)),)


# ---------------------------------------------------------------------------------------
# SwiGLU
# ---------------------------------------------------------------------------------------


@register("SwiGLU", since=28)
def swiglu(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``SwiGLU``, opsets 28+: ``A * sigmoid(alpha * A) * B``, no broadcasting."""
    a, b = inputs
    if jnp.shape(a) != jnp.shape(b):
        raise ctx.error(f"A and B must have identical shapes, got {jnp.shape(a)} and {jnp.shape(b)}")
    return (_swiglu(a, b, attrs["alpha"]),)


@half_in_float32
def _swiglu(a, b, alpha):
    dtype = jnp.result_type(a)
    b = jnp.asarray(b, dtype)  # float32 with A (half_in_float32)
    return (a * jax.nn.sigmoid(jnp.asarray(alpha, dtype) * a) * b).astype(dtype)


# ---------------------------------------------------------------------------------------
# CausalConvWithState
# ---------------------------------------------------------------------------------------


@register("CausalConvWithState", since=27)
def causal_conv_with_state(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``CausalConvWithState``, opsets 27+ (depthwise causal 1-D conv with carry state)."""
    x, w, bias, past = (tuple(inputs) + (None, None))[:4]
    if jnp.ndim(x) != 3 or jnp.ndim(w) != 3 or jnp.shape(w)[1] != 1:
        raise ctx.error(f"input must be (B, C, L) and weight (C, 1, k); got {jnp.shape(x)} and {jnp.shape(w)}")
    activation = attrs["activation"]
    if activation not in ("none", "silu", "swish"):
        raise ctx.error(f"activation must be 'none', 'silu' or 'swish', got {activation!r}")
    batch, channels, length = jnp.shape(x)
    k = jnp.shape(w)[2]
    if jnp.shape(w)[0] != channels:
        raise ctx.error(f"weight has {jnp.shape(w)[0]} channels, input has {channels}")
    dtype = jnp.result_type(x)
    if past is None:
        past = jnp.zeros((batch, channels, k - 1), dtype)
    elif jnp.shape(past) != (batch, channels, k - 1):
        raise ctx.error(f"past_state must have shape {(batch, channels, k - 1)}, got {jnp.shape(past)}")
    padded = jnp.concatenate([jnp.asarray(past, dtype), x], axis=2)
    out = lax.conv_general_dilated(
        padded,
        jnp.asarray(w, dtype),
        window_strides=(1,),
        padding="VALID",
        feature_group_count=channels,
        precision=ctx.precision,
    )
    if bias is not None:
        out = out + jnp.reshape(jnp.asarray(bias, dtype), (channels, 1))
    if activation != "none":
        wide = out.astype(compute_type(dtype))
        out = wide * jax.nn.sigmoid(wide)
    return out.astype(dtype), padded[:, :, length:]


# ---------------------------------------------------------------------------------------
# LinearAttention
# ---------------------------------------------------------------------------------------


@register("LinearAttention", since=27)
def linear_attention(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``LinearAttention``, opsets 27+: the recurrence runs as a ``lax.scan`` over time.

    Computed in float32 (float16/bfloat16 inputs are widened, like the reference);
    ``chunk_size`` is a tuning hint without effect here.
    """
    q, k, v, past, decay, beta = inputs
    rule = attrs["update_rule"]
    if rule not in ("linear", "gated", "delta", "gated_delta"):
        raise ctx.error(f"update_rule must be linear, gated, delta or gated_delta, got {rule!r}")
    hq, hkv = attrs["q_num_heads"], attrs["kv_num_heads"]
    if not hq or not hkv or hq <= 0 or hkv <= 0 or hq % hkv:
        raise ctx.error(f"q_num_heads ({hq}) must be a positive multiple of kv_num_heads ({hkv})")
    gated, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    for name, value, needed in (("decay", decay, gated), ("beta", beta, delta)):
        if needed and value is None:
            raise ctx.error(f"update_rule {rule!r} requires the {name} input")
        if not needed and value is not None:
            raise ctx.error(f"update_rule {rule!r} forbids the {name} input")
    for name, value in (("query", q), ("key", k), ("value", v)):
        if jnp.ndim(value) != 3:
            raise ctx.error(f"{name} must be rank 3 (B, T, H*D), got shape {jnp.shape(value)}")
    out_dtype = jnp.result_type(q)
    wide = compute_type(out_dtype)
    b, t, q_hidden = jnp.shape(q)
    if q_hidden % hq or jnp.shape(k)[2] % hkv or jnp.shape(v)[2] % hkv:
        raise ctx.error("query/key/value hidden sizes must divide by their head counts")
    dk, dv = q_hidden // hq, jnp.shape(v)[2] // hkv
    if jnp.shape(k)[2] != hkv * dk:
        raise ctx.error(f"key hidden size {jnp.shape(k)[2]} != kv_num_heads * d_k = {hkv * dk}")
    group = hq // hkv

    # Time-major, per-head: (T, B, H, D).
    def heads(x, n):
        return jnp.transpose(jnp.reshape(jnp.asarray(x).astype(wide), (b, t, n, -1)), (1, 0, 2, 3))

    qs = jnp.reshape(heads(q, hq), (t, b, hkv, group, dk))
    ks, vs = heads(k, hkv), heads(v, hkv)
    xs = [qs, ks, vs]
    if gated:
        last = jnp.shape(decay)[-1]
        if jnp.ndim(decay) != 3 or last not in (hkv, hkv * dk):
            raise ctx.error(f"decay must be (B, T, {hkv}) or (B, T, {hkv * dk}), got {jnp.shape(decay)}")
        xs.append(heads(decay, hkv))  # (T, B, H, 1 or dk)
    if delta:
        if jnp.ndim(beta) != 3 or jnp.shape(beta)[-1] not in (hkv, 1):
            raise ctx.error(f"beta must be (B, T, {hkv}) or (B, T, 1), got {jnp.shape(beta)}")
        xs.append(heads(beta, jnp.shape(beta)[-1]))  # (T, B, H or 1, 1)

    if past is None:
        state_dtype = out_dtype
        state = jnp.zeros((b, hkv, dk, dv), wide)
    else:
        if jnp.shape(past) != (b, hkv, dk, dv):
            raise ctx.error(f"past_state must have shape {(b, hkv, dk, dv)}, got {jnp.shape(past)}")
        state_dtype = jnp.result_type(past)
        state = jnp.asarray(past).astype(wide)
    scale = attrs["scale"] or 1.0 / math.sqrt(dk)  # the schema: 0.0 (its default) means 1/sqrt(d_k)
    prec = ctx.precision

    def step(s, x):
        q_t, k_t, v_t = x[:3]
        rest = list(x[3:])
        if gated:
            s = s * jnp.exp(rest.pop(0))[..., None]
        if delta:
            retrieved = jnp.einsum("bhdm,bhd->bhm", s, k_t, precision=prec)
            v_t = rest.pop(0) * (v_t - retrieved)
        s = s + k_t[..., :, None] * v_t[..., None, :]
        o_t = scale * jnp.einsum("bhgd,bhdm->bhgm", q_t, s, precision=prec)
        return s, o_t

    state, outs = lax.scan(step, state, tuple(xs))  # outs: (T, B, Hkv, G, dv)
    output = jnp.reshape(jnp.transpose(outs, (1, 0, 2, 3, 4)), (b, t, hq * dv))
    return output.astype(out_dtype), state.astype(state_dtype)


# ---------------------------------------------------------------------------------------
# FlexAttention (ai.onnx.preview)
# ---------------------------------------------------------------------------------------


def _run_modifier(graph, value, ctx, dtype):
    if len(graph.inputs) != 1 or len(graph.outputs) != 1:
        raise ctx.error(f"modifier graph {graph.name!r} must have exactly one input and one output")
    (out,) = ctx.run_graph(graph, {graph.input_names[0]: value})
    if jnp.shape(out) != jnp.shape(value):
        raise ctx.error(f"modifier graph {graph.name!r} changed the shape {jnp.shape(value)} to {jnp.shape(out)}")
    return jnp.asarray(out).astype(dtype)


@register("FlexAttention", since=1, domain="ai.onnx.preview")
def flex_attention(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """``ai.onnx.preview`` ``FlexAttention``, version 1 (``score_mod``/``prob_mod`` subgraphs)."""
    q, k, v = inputs
    if not jnp.ndim(q) == jnp.ndim(k) == jnp.ndim(v) == 4:
        raise ctx.error(f"Q, K and V must be rank 4, got {jnp.shape(q)}, {jnp.shape(k)}, {jnp.shape(v)}")
    batch, hq, q_len, head = jnp.shape(q)
    _, hkv, kv_len, k_head = jnp.shape(k)
    if jnp.shape(v)[1] != hkv or jnp.shape(v)[2] != kv_len or k_head != head:
        raise ctx.error(f"inconsistent shapes Q {jnp.shape(q)}, K {jnp.shape(k)}, V {jnp.shape(v)}")
    if hq % hkv:
        raise ctx.error(f"{hq} query heads are not a multiple of {hkv} key/value heads")
    dtype = jnp.result_type(q)
    precision = attrs["softmax_precision"]
    if precision is not None:
        wide = onnx_dtype(precision)
    else:
        wide = compute_type(dtype)
    scale = attrs["scale"]
    if scale is None:
        scale = 1.0 / math.sqrt(head)
    root = jnp.asarray(np.sqrt(np.float32(scale)), dtype)
    group = hq // hkv
    qg = jnp.reshape(q * root, (batch, hkv, group, q_len, head))
    scores = jnp.einsum("bhgqd,bhkd->bhgqk", qg, k * root, precision=ctx.precision)
    scores = jnp.reshape(scores, (batch, hq, q_len, kv_len)).astype(wide)
    if attrs["score_mod"] is not None:
        scores = _run_modifier(attrs["score_mod"], scores, ctx, wide)
    probs = softmax(scores, -1)
    if attrs["prob_mod"] is not None:
        probs = _run_modifier(attrs["prob_mod"], probs, ctx, wide)
    pg = jnp.reshape(probs, (batch, hkv, group, q_len, kv_len))
    y = jnp.einsum("bhgqk,bhkd->bhgqd", pg, jnp.asarray(v).astype(wide), precision=ctx.precision)
    return (jnp.reshape(y, (batch, hq, q_len, -1)).astype(jnp.result_type(v)),)

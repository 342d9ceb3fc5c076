"""Attention, QAttention, MultiHeadAttention, GroupQueryAttention and RotaryEmbedding
(com.microsoft).

* ``Attention`` (BERT/GPT-2 from the transformers optimizer) projects the input with merged
  Q/K/V weights; ``MultiHeadAttention`` takes projected (or packed) Q, K and V. Both mask keys
  with onnxruntime's finite ``mask_filter_value`` (default -10000) added to the scores, so a
  fully masked row gives uniform weights, as onnxruntime's does; ``unidirectional`` drops later
  keys outright, whatever ``mask_filter_value`` (see ``_causal_keys`` for cross-attention).
* ``GroupQueryAttention`` (the genai builder's decoder attention) keeps its K/V cache in
  ``past_key``/``past_value``. ``seqlens_k[b] + 1`` is batch b's valid length after this step;
  the new tokens are written at ``seqlens_k[b] + 1 - sequence_length`` (0 for a right-padded
  first prompt), so a fixed-size buffer can be passed back in as the next step's past (the
  "shared buffer" decoding genai does): the present buffer is as long as the past buffer, or
  ``total_sequence_length`` when that is longer and known at trace time. Queries attend
  causally to their batch's valid keys, within ``local_window_size`` when set, with optional
  ``softcap``, rotary embedding (``do_rotary``, positions from the past lengths), a per-head
  ``head_sink`` logit or ``smooth_softmax``. Rows of padding tokens hold unspecified values;
  cache slots past a row's length are zero in the present, as in onnxruntime's.
* ``RotaryEmbedding`` reuses the default domain's implementation; its ``position_ids`` is
  either (batch, sequence) or a one-element start offset.

Scores and softmax run in float32 at least (float16 inputs included), as onnxruntime's CPU
kernels do, and Q's heads are grouped over K/V heads without repeating K and V.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from jonnx._registry import Attrs, Inputs, OpContext, Outputs, register
from jonnx._values import is_concrete
from jonnx.ops._util import compute_type, dtype_of
from jonnx.ops.activation import softmax
from jonnx.ops.attention import rotary_embedding, split_heads
from jonnx.ops.microsoft._common import DOMAIN, reject_inputs, reject_unsupported
from jonnx.ops.quantize import integer_matmul


def _grouped_attention(q, k, v, bias, scale, ctx, *, softcap=0.0, valid=None, sink=None):
    """softmax(scale * q k^T (+ softcap) + bias, masked by ``valid``) v, grouped over K/V heads.

    q: (B, N, S, h); k, v: (B, Nkv, T, h); bias: additive, broadcastable to (B, N, S, T);
    valid: boolean, broadcastable to (B, N, S, T), False where a key is excluded (-inf);
    sink: (N,) extra logits that take softmax mass but no value (None: none).
    """
    dtype = dtype_of(q)
    wide = compute_type(dtype)
    batch, heads, q_len, _ = jnp.shape(q)
    kv_heads, kv_len = jnp.shape(k)[1], jnp.shape(k)[2]
    if heads % kv_heads:
        raise ctx.error(f"{heads} query heads cannot be grouped over {kv_heads} key/value heads")
    group = heads // kv_heads
    qg = jnp.reshape(q.astype(wide), (batch, kv_heads, group, q_len, -1))
    scores = jnp.einsum("bhgqd,bhkd->bhgqk", qg, k.astype(wide), precision=ctx.precision)
    scores = jnp.reshape(scores, (batch, heads, q_len, kv_len)) * jnp.asarray(scale, wide)
    if softcap and softcap > 0:
        scores = softcap * jnp.tanh(scores / softcap)
    if bias is not None:
        scores = scores + jnp.asarray(bias).astype(wide)
    if valid is not None:
        # A row with no valid key (a padding query of GroupQueryAttention, its output
        # unspecified) keeps its scores: all -inf would make it NaN, and a NaN row written to
        # the next layer's K/V cache turns valid rows NaN too (0 * NaN in probs @ V).
        keep = valid | ~jnp.any(valid, axis=-1, keepdims=True)
        scores = jnp.where(keep, scores, -jnp.inf)
    if sink is None:
        probs = softmax(scores, -1)
    else:
        sink = jnp.broadcast_to(
            jnp.reshape(jnp.asarray(sink).astype(wide), (1, -1, 1, 1)),
            (batch, heads, q_len, 1),
        )
        probs = softmax(jnp.concatenate([scores, sink], axis=-1), -1)[..., :kv_len]
    pg = jnp.reshape(probs, (batch, kv_heads, group, q_len, kv_len))
    y = jnp.einsum("bhgqk,bhkd->bhgqd", pg, v.astype(wide), precision=ctx.precision)
    return jnp.reshape(y, (batch, heads, q_len, -1)).astype(dtype)


def _merge_heads(y):
    """(B, N, S, h) -> (B, S, N * h)."""
    b, n, s, h = jnp.shape(y)
    return jnp.reshape(jnp.transpose(y, (0, 2, 1, 3)), (b, s, n * h))


def _scale(attrs, head_size: int) -> float:
    return attrs["scale"] if attrs["scale"] else 1.0 / math.sqrt(head_size)


def _key_mask_bias(mask, *, batch, q_len, kv_len, filter_value, dtype, ctx):
    """onnxruntime's key masks as an additive bias of 0 / ``mask_filter_value``, (B, 1, S|1, T)."""
    if mask is None:
        return None
    mask = jnp.asarray(mask)
    j = jnp.arange(kv_len)
    shape = jnp.shape(mask)
    if jnp.ndim(mask) == 1 and shape[0] in (batch, 3 * batch + 2):
        # Right padding: valid lengths. The (3 * batch + 2) form appends cumulative query and key
        # offsets, which only packed (varlen) layouts read; onnxruntime's CPU kernels take its
        # first batch entries as the key lengths too.
        keep = j[None, :] < mask[:batch, None]
        keep = keep[:, None, None, :]
    elif jnp.ndim(mask) == 1 and shape[0] == 2 * batch:  # left padding: end, then start
        end, start = mask[:batch, None], mask[batch:, None]
        keep = ((j[None, :] < end) & (j[None, :] >= start))[:, None, None, :]
    # Raw masks keep a key where the value is positive: onnxruntime masks negative values as
    # well as the documented 0.
    elif jnp.ndim(mask) == 2 and shape == (batch, kv_len):
        keep = (mask > 0)[:, None, None, :]
    elif jnp.ndim(mask) == 3 and shape == (batch, q_len, kv_len):
        keep = (mask > 0)[:, None, :, :]
    else:
        raise ctx.error(
            f"mask of shape {shape} is not supported: expected (batch,), (2 * batch,), (3 * batch + 2,), "
            f"(batch, total_sequence_length) or (batch, sequence_length, total_sequence_length)"
        )
    return jnp.where(keep, jnp.zeros((), dtype), jnp.asarray(filter_value, dtype))


def _causal_keys(q_len, kv_len, past_len):
    """Where query i may see key j under ``unidirectional``, (S, T).

    onnxruntime drops later keys outright (its lowest float), not through ``mask_filter_value``.
    Its kernel excludes keys ``j > past_len + i`` for every query row but the last, which sees
    every key: the usual causal mask for self-attention (``past_len + S == T``). For causal
    cross-attention (K/V longer or shorter than the query) the documentation defines no
    alignment, so jonnx follows the kernel, and no row is left without a key.
    """
    i = jnp.arange(q_len)[:, None]
    j = jnp.arange(kv_len)[None, :]
    return (j <= past_len + i) | (i == q_len - 1)


def _add(a, b):
    return b if a is None else (a if b is None else a + b)


# ---------------------------------------------------------------------------------------------
# Attention


_ATTENTION_ATTRS = {
    "num_heads": None,
    "qkv_hidden_sizes": None,
    "unidirectional": 0,
    "scale": None,
    "mask_filter_value": -10000.0,
    "do_rotary": 0,
    "past_present_share_buffer": 0,
    "rotary_embedding_dim": 0,
}


def _masked_attention(q, k, v, mask, attention_bias, past_len, attrs, ctx):
    """Attention and MultiHeadAttention after the heads are split (B, N, S, H), with ``past_len``
    of the T keys from the past: the key mask (``mask_index``/``key_padding_mask``) and
    ``attention_bias`` as one additive bias, ``unidirectional`` as excluded keys, then softmax
    attention, computed at least in float32."""
    batch, _, q_len, head = jnp.shape(q)
    kv_len = jnp.shape(k)[2]
    wide = compute_type(dtype_of(q))
    filter_value = attrs["mask_filter_value"]
    bias = _key_mask_bias(mask, batch=batch, q_len=q_len, kv_len=kv_len, filter_value=filter_value, dtype=wide, ctx=ctx)
    bias = _add(bias, attention_bias)
    valid = _causal_keys(q_len, kv_len, past_len) if attrs["unidirectional"] else None
    return _grouped_attention(q, k, v, bias, _scale(attrs, head), ctx, valid=valid)


def _projected_attention(proj, total, mask, past, attention_bias, attrs, ctx):
    """Attention and QAttention after the input projection ``proj`` (B, S, D + D + Dv)."""
    heads = attrs["num_heads"]
    sizes = tuple(attrs["qkv_hidden_sizes"] or (total // 3,) * 3)
    if len(sizes) != 3 or sum(sizes) != total or sizes[0] != sizes[1]:
        raise ctx.error(f"qkv_hidden_sizes {sizes} does not split the weights' {total} columns as (D, D, Dv)")
    q = split_heads(proj[..., : sizes[0]], heads, "Q", "num_heads", ctx)
    k = split_heads(proj[..., sizes[0] : 2 * sizes[0]], heads, "K", "num_heads", ctx)
    v = split_heads(proj[..., 2 * sizes[0] :], heads, "V", "num_heads", ctx)
    past_len = 0
    if past is not None:
        past_len = jnp.shape(past)[3]
        k = jnp.concatenate([past[0].astype(dtype_of(k)), k], axis=2)
        v = jnp.concatenate([past[1].astype(dtype_of(v)), v], axis=2)
    y = _masked_attention(q, k, v, mask, attention_bias, past_len, attrs, ctx)
    present = None
    if past is not None or (ctx.n_outputs or 1) > 1:
        # present stacks K and V in one tensor: onnxruntime, too, needs one head size there (with
        # V's wider it writes K's rows unaligned, with zeros after them).
        if sizes[0] != sizes[2]:
            raise ctx.error(
                f"the present output needs equal Q/K and V hidden sizes, got qkv_hidden_sizes {list(sizes)}"
            )
        present = jnp.stack([k, v])
    return _merge_heads(y), present


@register("Attention", since=1, domain=DOMAIN, attributes=_ATTENTION_ATTRS, n_inputs=7)
def attention(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """com.microsoft ``Attention``: self-attention with merged Q/K/V projection weights.

    ``do_rotary`` and ``past_present_share_buffer`` are not supported.
    """
    x, weights, bias, mask, past, attention_bias = inputs[:6]
    reject_unsupported(attrs, {"do_rotary": 0, "past_present_share_buffer": 0}, ctx)
    reject_inputs(inputs, {6: "past_sequence_length"}, ctx)
    proj = jnp.matmul(x, weights, precision=ctx.precision)
    if bias is not None:
        proj = proj + bias
    return _projected_attention(proj, jnp.shape(weights)[1], mask, past, attention_bias, attrs, ctx)


_QATTENTION_ATTRS = {
    "num_heads": None,
    "unidirectional": 0,
    "scale": None,
    "mask_filter_value": -10000.0,
    "do_rotary": 0,
    "past_present_share_buffer": 0,
}


@register("QAttention", since=1, domain=DOMAIN, attributes=_QATTENTION_ATTRS, n_inputs=9)
def qattention(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """com.microsoft ``QAttention`` (quantize_dynamic on an optimized BERT): Attention whose
    projection multiplies the 8-bit input and weights in int32, scaled back to float."""
    x, weights, bias, x_scale, w_scale, mask, x_zero, w_zero, past = inputs
    reject_unsupported(attrs, {"do_rotary": 0, "past_present_share_buffer": 0}, ctx)
    acc = integer_matmul(x, weights, x_zero, w_zero)
    scale = jnp.asarray(x_scale).astype(jnp.float32) * jnp.asarray(w_scale).astype(jnp.float32)
    proj = acc.astype(jnp.float32) * scale + jnp.asarray(bias).astype(jnp.float32)
    return _projected_attention(
        proj.astype(dtype_of(bias)),
        jnp.shape(weights)[1],
        mask,
        past,
        None,
        {**attrs, "qkv_hidden_sizes": None},
        ctx,
    )


# ---------------------------------------------------------------------------------------------
# MultiHeadAttention


_MHA_ATTRS = {
    "num_heads": None,
    "unidirectional": 0,
    "scale": None,
    "mask_filter_value": -10000.0,
}


@register("MultiHeadAttention", since=1, domain=DOMAIN, attributes=_MHA_ATTRS, n_inputs=10)
def multi_head_attention(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """com.microsoft ``MultiHeadAttention``: projected Q/K/V (separate, packed KV or packed QKV),
    optional bias, key padding mask, attention bias and past K/V.

    ``past_sequence_length`` and ``cache_indirection`` (beam search) and the ``qk`` output are
    not supported.
    """
    query, key, value, bias, key_mask, attention_bias, past_key, past_value = inputs[:8]
    reject_inputs(inputs, {8: "past_sequence_length", 9: "cache_indirection"}, ctx)
    heads = attrs["num_heads"]
    if heads is None or heads <= 0:
        raise ctx.error("the num_heads attribute is required")
    if (ctx.n_outputs or 1) > 3:
        raise ctx.error("the qk output is not supported")
    if jnp.ndim(query) == 5:  # packed QKV: (B, S, N, 3, h)
        if key is not None or value is not None:
            raise ctx.error("packed QKV (5-D query) takes no key or value")
        q, k, v = (jnp.transpose(query[:, :, :, i], (0, 2, 1, 3)) for i in range(3))
        if bias is not None:
            raise ctx.error("bias with packed QKV is not supported")
    else:
        d = jnp.shape(query)[-1]
        q_bias = k_bias = v_bias = None
        if bias is not None:
            q_bias, k_bias, v_bias = bias[:d], bias[d : 2 * d], bias[2 * d :]
        q = split_heads(
            query if q_bias is None else query + q_bias,
            heads,
            "query",
            "num_heads",
            ctx,
        )
        if key is None:
            raise ctx.error("key is required unless query is packed QKV")
        if jnp.ndim(key) == 5:  # packed KV: (B, L, N, 2, h)
            k, v = (jnp.transpose(key[:, :, :, i], (0, 2, 1, 3)) for i in range(2))
            if k_bias is not None:
                k = k + jnp.reshape(k_bias, (1, heads, 1, -1))
                v = v + jnp.reshape(v_bias, (1, heads, 1, -1))
        elif jnp.ndim(key) == 4:  # already (B, N, L, h): cross-attention cache, no bias
            k, v = key, value
        else:
            k = split_heads(key if k_bias is None else key + k_bias, heads, "key", "num_heads", ctx)
            v = split_heads(
                value if v_bias is None else value + v_bias,
                heads,
                "value",
                "num_heads",
                ctx,
            )
    if (past_key is None) != (past_value is None):
        raise ctx.error("past_key and past_value must be given together")
    past_len = 0
    if past_key is not None:
        past_len = jnp.shape(past_key)[2]
        k = jnp.concatenate([past_key.astype(dtype_of(k)), k], axis=2)
        v = jnp.concatenate([past_value.astype(dtype_of(v)), v], axis=2)
    y = _masked_attention(q, k, v, key_mask, attention_bias, past_len, attrs, ctx)
    return _merge_heads(y), k, v


# ---------------------------------------------------------------------------------------------
# RotaryEmbedding


def _rotate(x_bnsh, cos, sin, positions, interleaved: bool, ctx):
    """The default domain's RotaryEmbedding on (B, N, S, h), rotating ``2 * cos.shape[1]`` dims."""
    attrs = {
        "interleaved": int(interleaved),
        "rotary_embedding_dim": 2 * jnp.shape(cos)[-1],
        "num_heads": None,
    }
    return rotary_embedding((x_bnsh, cos, sin, positions), attrs, ctx)[0]


_ROTARY_ATTRS = {
    "interleaved": 0,
    "is_packed_batching": 0,
    "num_heads": 0,
    "rotary_embedding_dim": 0,
    "scale": 1.0,
}


@register("RotaryEmbedding", since=1, domain=DOMAIN, attributes=_ROTARY_ATTRS, n_inputs=4)
def rotary_embedding_ms(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """com.microsoft ``RotaryEmbedding``: inputs ``(input, position_ids, cos_cache, sin_cache)``;
    ``position_ids`` is (batch, sequence) or a one-element start position."""
    x, position_ids, cos, sin = inputs
    reject_unsupported(attrs, {"is_packed_batching": 0}, ctx)
    seq = jnp.shape(x)[-2] if jnp.ndim(x) == 4 else jnp.shape(x)[1]
    position_ids = jnp.asarray(position_ids)
    if jnp.size(position_ids) == 1 and jnp.ndim(position_ids) <= 1:
        position_ids = jnp.reshape(position_ids, ()) + jnp.arange(seq)[None, :]
    heads = attrs["num_heads"]
    if jnp.ndim(x) == 3 and not heads:
        rot = attrs["rotary_embedding_dim"] or 2 * jnp.shape(cos)[-1]
        heads = jnp.shape(x)[-1] // rot
    onnx_attrs = {
        "interleaved": attrs["interleaved"],
        "rotary_embedding_dim": attrs["rotary_embedding_dim"] or 2 * jnp.shape(cos)[-1],
        "num_heads": heads,
    }
    return rotary_embedding((x, cos, sin, position_ids), onnx_attrs, ctx)


# ---------------------------------------------------------------------------------------------
# GroupQueryAttention


_GQA_ATTRS = {
    "num_heads": None,
    "kv_num_heads": None,
    "scale": None,
    "softcap": 0.0,
    "local_window_size": -1,
    "do_rotary": 0,
    "rotary_interleaved": 0,
    "smooth_softmax": -1,
    "qk_output": 0,
    "causal": 1,
    "sliding_window_cache": 0,
    "kv_cache_bit_width": 0,
    "k_quant_type": "NONE",
    "v_quant_type": "NONE",
    "qk_norm_epsilon": 1e-6,
    "q_norm_epsilon": None,
    "k_norm_epsilon": None,
}
_GQA_UNSUPPORTED = {
    "qk_output": 0,
    "causal": 1,
    "sliding_window_cache": 0,
    "kv_cache_bit_width": 0,
    "k_quant_type": "NONE",
    "v_quant_type": "NONE",
}


def _write_cache(buffer, new, starts):
    """``buffer[b, :, starts[b] : starts[b] + S] = new[b]`` for every batch row (writes past the
    buffer's end are dropped)."""
    batch, _, length, _ = jnp.shape(new)
    rows = starts[:, None] + jnp.arange(length, dtype=starts.dtype)[None, :]
    # Advanced indices around a slice put their (B, S) dims first: the update is (B, S, Nkv, h).
    update = jnp.transpose(new, (0, 2, 1, 3)).astype(buffer.dtype)
    return buffer.at[jnp.arange(batch)[:, None], :, rows].set(update, mode="drop")


@register(
    "GroupQueryAttention",
    since=1,
    domain=DOMAIN,
    attributes=_GQA_ATTRS,
    n_inputs=17,
    prefer_static=(6,),
)
def group_query_attention(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """com.microsoft ``GroupQueryAttention`` (see the module docstring for the cache layout).

    Quantized caches, ``output_qk``, Q/K norms and ``query_seqlens`` are not supported.
    """
    (
        query,
        key,
        value,
        past_key,
        past_value,
        seqlens_k,
        total_seq,
        cos,
        sin,
        position_ids,
        attention_bias,
        head_sink,
    ) = inputs[:12]
    reject_unsupported(attrs, _GQA_UNSUPPORTED, ctx)
    reject_inputs(
        inputs,
        {
            12: "k_scale",
            13: "v_scale",
            14: "q_norm_weight",
            15: "k_norm_weight",
            16: "query_seqlens",
        },
        ctx,
    )
    heads, kv_heads = attrs["num_heads"], attrs["kv_num_heads"]
    if not heads or not kv_heads or heads % kv_heads:
        raise ctx.error(f"num_heads ({heads}) must be a positive multiple of kv_num_heads ({kv_heads})")
    batch, q_len, width = jnp.shape(query)
    if key is None:  # packed QKV: (B, S, (N + 2 Nkv) h)
        if value is not None:
            raise ctx.error("packed QKV (no key) takes no value either")
        head = width // (heads + 2 * kv_heads)
        d, dk = heads * head, kv_heads * head
        query, key, value = query[..., :d], query[..., d : d + dk], query[..., d + dk :]
    else:
        head = width // heads
    q = split_heads(query, heads, "query", "num_heads", ctx)
    k = split_heads(key, kv_heads, "key", "kv_num_heads", ctx)
    v = split_heads(value, kv_heads, "value", "kv_num_heads", ctx)

    lengths = jnp.reshape(jnp.asarray(seqlens_k), (batch,)).astype(jnp.int32) + 1
    past_lens = jnp.maximum(lengths - q_len, 0)  # a right-padded first prompt starts at 0
    positions = past_lens[:, None] + jnp.arange(q_len, dtype=jnp.int32)[None, :]
    if attrs["do_rotary"]:
        if cos is None or sin is None:
            raise ctx.error("do_rotary=1 needs cos_cache and sin_cache")
        rot_pos = positions if position_ids is None else jnp.asarray(position_ids)
        q = _rotate(q, cos, sin, rot_pos, attrs["rotary_interleaved"], ctx)
        k = _rotate(k, cos, sin, rot_pos, attrs["rotary_interleaved"], ctx)

    total = int(np.asarray(total_seq).reshape(-1)[0]) if is_concrete(total_seq) else 0
    if (past_key is None) != (past_value is None):
        raise ctx.error("past_key and past_value must be given together")
    if past_key is None:
        length = max(total, q_len)
        past_key = jnp.zeros((batch, kv_heads, length, head), dtype_of(k))
        past_value = jnp.zeros((batch, kv_heads, length, head), dtype_of(v))
    elif total > jnp.shape(past_key)[2]:  # separate (growing) past and present
        pad = [(0, 0), (0, 0), (0, total - jnp.shape(past_key)[2]), (0, 0)]
        past_key, past_value = jnp.pad(past_key, pad), jnp.pad(past_value, pad)
    if not is_concrete(total_seq):
        ctx.check(
            jnp.asarray(total_seq).reshape(-1)[0] <= jnp.shape(past_key)[2],
            "total_sequence_length exceeds the past_key buffer",
        )
    # onnxruntime (past and present in separate buffers, as session.run passes them) copies the
    # past's first past_lens entries, appends the new ones and zeroes the rest: stale entries
    # past a row's length are cleared, so the present matches onnxruntime's in every slot.
    kept = jnp.arange(jnp.shape(past_key)[2])[None, None, :, None] < (past_lens + q_len)[:, None, None, None]
    present_k = _write_cache(jnp.where(kept, past_key, 0), k, past_lens)
    present_v = _write_cache(jnp.where(kept, past_value, 0), v, past_lens)

    kv_len = jnp.shape(present_k)[2]
    i = positions[:, None, :, None]  # (B, 1, S, 1): each query's absolute position
    j = jnp.arange(kv_len)[None, None, None, :]
    valid = (j <= i) & (j < lengths[:, None, None, None])
    window = attrs["local_window_size"]
    if window is not None and window >= 0:
        valid = valid & (j > i - window)  # the last local_window_size keys, this one included
    bias = None
    if attention_bias is not None:  # (B|1, N|1, S, total): keys past it are masked anyway
        pad = kv_len - jnp.shape(attention_bias)[-1]
        bias = jnp.pad(attention_bias, [(0, 0)] * 3 + [(0, pad)]) if pad > 0 else attention_bias
    sink = head_sink
    if sink is None and attrs["smooth_softmax"] == 1:
        sink = jnp.zeros((heads,), compute_type(dtype_of(q)))
    y = _grouped_attention(
        q,
        present_k,
        present_v,
        bias,
        _scale(attrs, head),
        ctx,
        softcap=attrs["softcap"],
        valid=valid,
        sink=sink,
    )
    return _merge_heads(y), present_k, present_v

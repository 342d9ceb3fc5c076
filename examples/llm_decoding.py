"""Greedy LLM decoding of a genai-style ONNX decoder under one ``jax.jit``, and fine-tuning it.

The decoder is the kind of file onnxruntime-genai's model builder writes: token embedding,
then per layer SimplifiedLayerNormalization, Q/K/V and output projections as 4-bit
``MatMulNBits``, ``GroupQueryAttention`` with rotary embedding and a fixed-size K/V cache
buffer that each step's ``present`` hands back as the next step's ``past``, a SiLU MLP and
``SkipSimplifiedLayerNormalization`` residuals; a float lm_head gives the logits. Here it is
built with onnx.helper from random weights (the same ops, attributes and cache layout).

``generate`` runs the prompt step and then every decoding step inside one ``jax.jit``: the
cache is the carry of a ``lax.fori_loop``, so XLA compiles the whole loop once, whatever the
number of new tokens. ``onnxruntime_generate`` runs the same file step by step in onnxruntime
for comparison, and ``finetune`` takes a few optax steps on the decoder's float weights
(embedding, norms, lm_head and the 4-bit weights' scales) to fit a token sequence.

Run: ``python examples/llm_decoding.py``
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import onnx.helper as oh
import optax
from onnx import numpy_helper

import jonnx

VOCAB, HIDDEN, HEADS, KV_HEADS, HEAD, LAYERS, MLP = 64, 64, 4, 2, 16, 2, 128
MAX_LEN = 48  # the K/V buffer's length: prompt plus generated tokens must fit
BLOCK = 32  # MatMulNBits block size along K


def _quantize_4bit(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(K, N) float weights -> MatMulNBits' packed (N, K/BLOCK, BLOCK/2) uint8, scales, zero points."""
    k, n = w.shape
    blocks = w.T.reshape(n, k // BLOCK, BLOCK)
    lo, hi = blocks.min(-1), blocks.max(-1)
    scale = np.maximum(hi - lo, 1e-6) / 15
    zero = np.clip(np.round(-lo / scale), 0, 15).astype(np.uint8)
    q = np.clip(np.round(blocks / scale[..., None]) + zero[..., None], 0, 15).astype(np.uint8)
    packed = q[..., 0::2] | (q[..., 1::2] << 4)  # low nibble first
    zero_packed = zero[:, 0::2] | (zero[:, 1::2] << 4) if zero.shape[1] > 1 else zero
    return packed, scale.astype(np.float32), zero_packed.reshape(n, -1)


def build_decoder(seed: int = 0) -> onnx.ModelProto:
    """A genai-style decoder: inputs ``input_ids``, ``seqlens_k``, ``total_sequence_length``
    and each layer's ``past_key_values.{i}.key/value`` of shape (batch, kv_heads, MAX_LEN, head)."""
    rng = np.random.default_rng(seed)
    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def const(name, value):
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def linear(x, k, n, name):
        packed, scale, zero = _quantize_4bit((rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32))
        nodes.append(
            oh.make_node(
                "MatMulNBits",
                [
                    x,
                    const(f"{name}.q", packed),
                    const(f"{name}.scales", scale),
                    const(f"{name}.zp", zero),
                ],
                [f"{name}.out"],
                domain="com.microsoft",
                K=k,
                N=n,
                bits=4,
                block_size=BLOCK,
                name=name,
            )
        )
        return f"{name}.out"

    inv = 1.0 / (10000 ** (np.arange(0, HEAD, 2) / HEAD))
    angles = np.arange(MAX_LEN)[:, None] * inv[None, :]
    const("cos_cache", np.cos(angles).astype(np.float32))
    const("sin_cache", np.sin(angles).astype(np.float32))
    const("embed", (rng.standard_normal((VOCAB, HIDDEN)) * 0.5).astype(np.float32))
    nodes.append(oh.make_node("Gather", ["embed", "input_ids"], ["h0"], name="embed_tokens"))

    inputs = [
        oh.make_tensor_value_info("input_ids", onnx.TensorProto.INT64, ["batch", "seq"]),
        oh.make_tensor_value_info("seqlens_k", onnx.TensorProto.INT32, ["batch"]),
        oh.make_tensor_value_info("total_sequence_length", onnx.TensorProto.INT32, []),
    ]
    outputs = [oh.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, ["batch", "seq", VOCAB])]
    cache_shape = ["batch", KV_HEADS, MAX_LEN, HEAD]
    residual, hidden = "h0", None
    for i in range(LAYERS):
        p = f"layers.{i}"
        past = [f"past_key_values.{i}.key", f"past_key_values.{i}.value"]
        present = [f"present.{i}.key", f"present.{i}.value"]
        inputs += [oh.make_tensor_value_info(n, onnx.TensorProto.FLOAT, cache_shape) for n in past]
        outputs += [oh.make_tensor_value_info(n, onnx.TensorProto.FLOAT, cache_shape) for n in present]
        gamma = const(
            f"{p}.input_norm",
            (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32),
        )
        if hidden is None:  # the first layer normalises the embeddings
            nodes.append(
                oh.make_node(
                    "SimplifiedLayerNormalization",
                    [residual, gamma],
                    [f"{p}.normed"],
                    epsilon=1e-5,
                    name=f"{p}.input_norm",
                )
            )
        else:  # later ones add the previous block's output to the residual first
            nodes.append(
                oh.make_node(
                    "SkipSimplifiedLayerNormalization",
                    [residual, hidden, gamma],
                    [f"{p}.normed", "", "", f"{p}.residual"],
                    domain="com.microsoft",
                    epsilon=1e-5,
                    name=f"{p}.input_norm",
                )
            )
            residual = f"{p}.residual"
        q = linear(f"{p}.normed", HIDDEN, HEADS * HEAD, f"{p}.q_proj")
        k = linear(f"{p}.normed", HIDDEN, KV_HEADS * HEAD, f"{p}.k_proj")
        v = linear(f"{p}.normed", HIDDEN, KV_HEADS * HEAD, f"{p}.v_proj")
        nodes.append(
            oh.make_node(
                "GroupQueryAttention",
                [
                    q,
                    k,
                    v,
                    *past,
                    "seqlens_k",
                    "total_sequence_length",
                    "cos_cache",
                    "sin_cache",
                ],
                [f"{p}.attn", *present],
                domain="com.microsoft",
                num_heads=HEADS,
                kv_num_heads=KV_HEADS,
                do_rotary=1,
                name=f"{p}.attn",
            )
        )
        attn = linear(f"{p}.attn", HEADS * HEAD, HIDDEN, f"{p}.o_proj")
        gamma = const(f"{p}.post_norm", (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32))
        nodes.append(
            oh.make_node(
                "SkipSimplifiedLayerNormalization",
                [residual, attn, gamma],
                [f"{p}.mlp_in", "", "", f"{p}.res2"],
                domain="com.microsoft",
                epsilon=1e-5,
                name=f"{p}.post_norm",
            )
        )
        residual = f"{p}.res2"
        gate = linear(f"{p}.mlp_in", HIDDEN, MLP, f"{p}.gate_proj")
        up = linear(f"{p}.mlp_in", HIDDEN, MLP, f"{p}.up_proj")
        nodes += [
            oh.make_node("Sigmoid", [gate], [f"{p}.gate_sig"]),
            oh.make_node("Mul", [gate, f"{p}.gate_sig"], [f"{p}.silu"]),
            oh.make_node("Mul", [f"{p}.silu", up], [f"{p}.mlp_mid"]),
        ]
        hidden = linear(f"{p}.mlp_mid", MLP, HIDDEN, f"{p}.down_proj")
    gamma = const("final_norm", np.ones(HIDDEN, np.float32))
    nodes.append(
        oh.make_node(
            "SkipSimplifiedLayerNormalization",
            [residual, hidden, gamma],
            ["final"],
            domain="com.microsoft",
            epsilon=1e-5,
            name="final_norm",
        )
    )
    const(
        "lm_head",
        (rng.standard_normal((HIDDEN, VOCAB)) / np.sqrt(HIDDEN)).astype(np.float32),
    )
    nodes.append(oh.make_node("MatMul", ["final", "lm_head"], ["logits"], name="lm_head"))
    graph = oh.make_graph(nodes, "decoder", inputs, outputs, initializer=inits)
    model = oh.make_model(
        graph,
        opset_imports=[oh.make_opsetid("", 17), oh.make_opsetid("com.microsoft", 1)],
    )
    model.ir_version = 8
    return model


def _empty_cache(batch: int) -> list[np.ndarray]:
    return [np.zeros((batch, KV_HEADS, MAX_LEN, HEAD), np.float32) for _ in range(2 * LAYERS)]


def generate(model: jonnx.Model, prompt: np.ndarray, steps: int):
    """Greedy decoding: returns a jitted function ``(params, prompt) -> (batch, steps)`` tokens.

    One compilation covers the prompt step and the ``lax.fori_loop`` over the other steps; the
    K/V buffers are the loop's carry, updated in place of the ``past`` inputs.
    """
    batch, prompt_len = prompt.shape
    if prompt_len + steps > MAX_LEN:
        raise ValueError(f"prompt ({prompt_len}) plus {steps} steps exceed the cache length {MAX_LEN}")

    def run(params, tokens, seqlens_k, total, cache):
        logits, *present = model.apply(params, tokens, seqlens_k, total, *cache)
        return jnp.argmax(logits[:, -1], axis=-1), present

    @jax.jit
    def decode(params, prompt):
        seqlens = jnp.full((batch,), prompt_len - 1, jnp.int32)
        first, cache = run(params, prompt, seqlens, jnp.int32(prompt_len), _empty_cache(batch))
        out = jnp.zeros((batch, steps), first.dtype).at[:, 0].set(first)

        def step(i, carry):
            out, cache = carry
            length = prompt_len + i + 1  # valid tokens once this step's token is in the cache
            seqlens = jnp.full((batch,), length - 1, jnp.int32)
            token, cache = run(
                params,
                out[:, i, None].astype(prompt.dtype),
                seqlens,
                length.astype(jnp.int32),
                cache,
            )
            return out.at[:, i + 1].set(token), cache

        out, _ = jax.lax.fori_loop(0, steps - 1, step, (out, cache))
        return out

    return decode


def onnxruntime_generate(proto: onnx.ModelProto, prompt: np.ndarray, steps: int) -> np.ndarray:
    """The same greedy loop in onnxruntime, one session run per step."""
    import onnxruntime as ort

    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    batch, length = prompt.shape
    cache = _empty_cache(batch)
    names = [i.name for i in proto.graph.input][3:]
    tokens, out = prompt, []
    for _ in range(steps):
        feeds = {
            "input_ids": tokens,
            "seqlens_k": np.full((batch,), length - 1, np.int32),
            "total_sequence_length": np.array(length, np.int32),
            **dict(zip(names, cache)),
        }
        logits, *cache = session.run(None, feeds)
        token = logits[:, -1].argmax(-1)
        out.append(token)
        tokens, length = token[:, None].astype(np.int64), length + 1
    return np.stack(out, axis=1)


def finetune(
    model: jonnx.Model,
    sequence: np.ndarray,
    steps: int = 5,
    learning_rate: float = 1e-2,
):
    """A few optax Adam steps on next-token cross-entropy over ``sequence`` (batch, length);
    returns the losses before each step and the tuned float weights."""
    batch, length = sequence.shape
    cache = _empty_cache(batch)
    seqlens = np.full((batch,), length - 2, np.int32)

    def loss_fn(params):
        logits = model.apply(params, sequence[:, :-1], seqlens, np.int32(length - 1), *cache)[0]
        return optax.softmax_cross_entropy_with_integer_labels(logits, sequence[:, 1:]).mean()

    optimizer = optax.adam(learning_rate)
    params = model.params
    opt_state = optimizer.init(params)

    @jax.jit
    def update(params, opt_state):
        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    losses = []
    for _ in range(steps):
        params, opt_state, loss = update(params, opt_state)
        losses.append(float(loss))
    return losses, params


def main() -> None:
    proto = build_decoder()
    model = jonnx.load(proto)
    prompt = np.random.default_rng(1).integers(0, VOCAB, (2, 6)).astype(np.int64)
    decode = generate(model, prompt, 32)
    tokens = np.asarray(decode(model.params, prompt))
    print("jonnx tokens:      ", tokens[0].tolist())
    try:
        reference = onnxruntime_generate(proto, prompt, 32)
        print(
            "onnxruntime tokens:",
            reference[0].tolist(),
            "| same:",
            bool((reference == tokens).all()),
        )
    except ImportError:
        print("(onnxruntime not installed: no comparison)")
    losses, _ = finetune(model, np.random.default_rng(2).integers(0, VOCAB, (2, 12)).astype(np.int64))
    print("fine-tuning loss:", " -> ".join(f"{x:.3f}" for x in losses))


if __name__ == "__main__":
    main()

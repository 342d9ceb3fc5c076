"""Quickstart: an ONNX model as a jit-compiled, differentiable, vmappable JAX function.

Loads the bundled small CNN (examples/models/small_cnn.onnx), runs it under jit, compares
with onnxruntime when it is installed, takes a gradient with respect to the weights, runs a
few optax fine-tuning steps, and vmaps over examples and over an ensemble of weights.

Run: ``python examples/quickstart.py``
"""

from __future__ import annotations

import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import jonnx

MODEL = pathlib.Path(__file__).with_name("models") / "small_cnn.onnx"


def main() -> None:
    model = jonnx.load(MODEL)
    print(f"loaded {MODEL.name}: {model}")

    rng = np.random.default_rng(0)
    images = rng.standard_normal((8, 3, 16, 16)).astype(np.float32)
    labels = rng.integers(0, 10, 8)

    # 1. jit inference: the whole graph is one XLA computation, compiled once per shape.
    start = time.perf_counter()
    (logits,) = model(images)
    logits.block_until_ready()
    first = time.perf_counter() - start
    start = time.perf_counter()
    model(images)[0].block_until_ready()
    print(
        f"jit inference: logits {logits.shape}, first call {first * 1e3:.0f} ms "
        f"(trace + compile), next call {(time.perf_counter() - start) * 1e3:.2f} ms"
    )

    # 2. The same model in onnxruntime, when it is installed.
    try:
        import onnxruntime as ort
    except ImportError:
        print("onnxruntime not installed: skipping the comparison")
    else:
        session = ort.InferenceSession(str(MODEL), providers=["CPUExecutionProvider"])
        (expected,) = session.run(None, {"image": images})
        diff = float(np.max(np.abs(np.asarray(logits) - expected)))
        print(f"onnxruntime agrees: max |difference| = {diff:.2e}")
        assert diff < 1e-4, "jonnx and onnxruntime disagree"

    # 3. A gradient with respect to the weights (model.params is a dict of jax arrays).
    def loss_fn(params, x, y):
        (out,) = model.apply(params, x)
        return optax.softmax_cross_entropy_with_integer_labels(out, y).mean()

    grads = jax.grad(loss_fn)(model.params, images, labels)
    norms = {name: float(jnp.linalg.norm(g)) for name, g in grads.items()}
    print(f"gradient w.r.t. {len(grads)} parameters; |d loss / d fc.weight| = {norms['fc.weight']:.4f}")

    # 4. A few fine-tuning steps with optax, the whole step jit-compiled.
    optimizer = optax.adam(1e-2)
    params, opt_state = model.params, optimizer.init(model.params)

    @jax.jit
    def step(params, opt_state, x, y):
        loss, g = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = optimizer.update(g, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    losses = []
    for _ in range(20):
        params, opt_state, loss = step(params, opt_state, images, labels)
        losses.append(float(loss))
    print(f"fine-tuning: loss {losses[0]:.3f} -> {losses[-1]:.3f} over {len(losses)} steps")
    assert losses[-1] < losses[0], "fine-tuning did not reduce the loss"

    # 5. vmap: per-example calls batched by JAX, and an ensemble of weight sets at once.
    per_example = jax.vmap(lambda x: model.apply(params, x[None])[0][0])(images)
    print(
        f"vmap over examples: {per_example.shape}, matches the batched call: "
        f"{bool(jnp.allclose(per_example, model.apply(params, images)[0], atol=1e-5))}"
    )
    ensemble = jax.tree_util.tree_map(lambda a, b: jnp.stack([a, b]), model.params, params)
    both = jax.vmap(lambda p: model.apply(p, images)[0])(ensemble)
    accuracy = (np.asarray(both).argmax(-1) == labels).mean(axis=1)
    print(
        f"vmap over an ensemble of 2 weight sets: accuracy before {accuracy[0]:.2f}, "
        f"after fine-tuning {accuracy[1]:.2f} (on the 8 training images)"
    )


if __name__ == "__main__":
    main()

"""The bundled example models against onnxruntime, with gradients checked by finite differences.

The models (examples/models/, built by examples/build_models.py with onnx.helper) have the
shape of real PyTorch exports: a CNN with BatchNormalization and a dynamic batch axis, and a
transformer encoder layer whose head reshapes are computed from Shape.
"""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import onnxruntime as ort
import pytest

import jonnx

MODELS = pathlib.Path(__file__).resolve().parents[2] / "examples" / "models"


def _ort(name: str) -> ort.InferenceSession:
    return ort.InferenceSession(str(MODELS / name), providers=["CPUExecutionProvider"])


def _cnn_inputs(batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    return {"image": np.random.default_rng(seed).standard_normal((batch, 3, 16, 16)).astype(np.float32)}


def _transformer_inputs(batch: int, length: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, length), np.int64)
    for b in range(batch):  # padded sequences of different lengths
        mask[b, max(1, length - b) :] = 0
    return {"input_ids": rng.integers(0, 50, (batch, length)), "attention_mask": mask}


CASES = [
    ("small_cnn.onnx", _cnn_inputs(1)),
    ("small_cnn.onnx", _cnn_inputs(5, seed=1)),
    ("tiny_transformer.onnx", _transformer_inputs(1, 6)),
    ("tiny_transformer.onnx", _transformer_inputs(3, 11, seed=2)),
]


@pytest.mark.parametrize(
    "name,inputs",
    CASES,
    ids=lambda c: c if isinstance(c, str) else "x".join(map(str, next(iter(c.values())).shape)),
)
def test_matches_onnxruntime(name, inputs):
    model = jonnx.load(MODELS / name)
    want = _ort(name).run(None, inputs)
    for got in (model(**inputs), jax.jit(model.apply)(model.params, **inputs)):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == w.shape
            np.testing.assert_allclose(np.asarray(g), w, rtol=1e-4, atol=1e-5)


def test_transformer_vmap_over_examples_matches_batch():
    model = jonnx.load(MODELS / "tiny_transformer.onnx")
    inputs = _transformer_inputs(3, 8, seed=4)
    batched = model(**inputs)[1]
    per_example = jax.vmap(lambda ids, mask: model.apply(model.params, ids[None], mask[None])[1][0])(
        inputs["input_ids"], inputs["attention_mask"]
    )
    np.testing.assert_allclose(np.asarray(per_example), np.asarray(batched), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "name,inputs,output",
    [
        ("small_cnn.onnx", _cnn_inputs(2, seed=3), 0),
        ("tiny_transformer.onnx", _transformer_inputs(2, 5, seed=5), 1),
    ],
)
def test_grad_wrt_params_matches_finite_differences(name, inputs, output):
    """Directional derivatives of a scalar loss, in float64, along random directions."""
    model = jonnx.load(MODELS / name)
    with jax.enable_x64(True):
        params = {k: jnp.asarray(v, jnp.float64) for k, v in model.params.items()}
        feeds = {k: (v.astype(np.float64) if v.dtype.kind == "f" else v) for k, v in inputs.items()}

        def loss(p):
            y = model.apply(p, **feeds)[output]
            return jnp.sum(jnp.sin(y))

        grads = jax.jit(jax.grad(loss))(params)
        assert set(grads) == set(params)
        rng = np.random.default_rng(0)
        for _ in range(3):
            direction = {k: jnp.asarray(rng.standard_normal(v.shape)) for k, v in params.items()}
            analytic = sum(jnp.vdot(grads[k], direction[k]) for k in params)
            # The CNN is piecewise linear (ReLU, MaxPool): a larger step can cross a kink;
            # in float64 a step of 1e-7 still leaves ~1e-9 of rounding error.
            eps = 1e-7
            plus = loss({k: params[k] + eps * direction[k] for k in params})
            minus = loss({k: params[k] - eps * direction[k] for k in params})
            numeric = (plus - minus) / (2 * eps)
            np.testing.assert_allclose(float(analytic), float(numeric), rtol=1e-5, atol=1e-7)

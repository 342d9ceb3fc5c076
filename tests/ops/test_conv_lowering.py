"""Conv's CPU lowerings (1x1 as a matmul, depthwise as shifted multiply-adds, k x k as im2col;
channels-last stems as broadcast multiply-adds in tests/test_layout.py)
against the ReferenceEvaluator and finite differences, and the choice between them."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.test_util import check_grads

import jonnx
from jonnx.ops import nn
from jonnx.ops._util import spread, spread_product
from tests.ops._harness import assert_matches_reference, check_op_grads, node_model

RNG = np.random.default_rng(1)

CASES = [
    # (lowering, x shape, w shape, attrs)
    ("matmul", (2, 5, 6, 7), (3, 5, 1, 1), {}),
    ("matmul", (1, 4, 7, 6), (6, 4, 1, 1), {"strides": [2, 3], "pads": [1, 0, 0, 1]}),
    ("matmul", (1, 3, 9), (2, 3, 1), {"strides": [2]}),
    ("matmul", (1, 20, 5, 4), (6, 20, 1, 1), {"strides": [2, 1], "pads": [0, 1, 1, 0]}),  # channels-last too
    ("depthwise", (2, 6, 7, 8), (6, 1, 3, 3), {"group": 6, "pads": [1, 1, 1, 1]}),
    # An odd batch: the weight gradient's tree of halves (ops/_util.py spread) and its tail.
    ("depthwise", (5, 3, 4, 5), (3, 1, 3, 3), {"group": 3, "pads": [1, 1, 1, 1]}),
    (
        "depthwise",
        (1, 4, 9, 8),
        (4, 1, 3, 2),
        {"group": 4, "strides": [2, 2], "dilations": [2, 1], "auto_pad": "SAME_UPPER"},
    ),
    (
        "depthwise",
        (1, 3, 5, 6, 4),
        (3, 1, 2, 3, 2),
        {"group": 3, "pads": [0, 1, 1, 1, 0, 0]},
    ),
    ("im2col", (2, 3, 4, 4), (5, 3, 3, 3), {"pads": [1, 1, 1, 1]}),  # a tiny (4x4) output
    ("xla", (2, 3, 8, 7), (5, 3, 3, 3), {"pads": [1, 1, 1, 1]}),  # k x k, batched, not tiny
    (
        "im2col",
        (2, 4, 7, 7),
        (3, 4, 3, 2),
        {"strides": [2, 2], "dilations": [1, 2], "pads": [0, 1, 2, 0]},
    ),
    ("im2col", (3, 2, 11), (4, 2, 5), {"auto_pad": "SAME_LOWER", "strides": [3]}),
    ("im2col", (1, 3, 8, 7), (5, 3, 3, 3), {"pads": [1, 1, 1, 1]}),  # a stem: few channels
    # A strided, dilated 5x5 stem (channels-last: the channel_taps lowering, tests/test_layout.py).
    ("im2col", (1, 3, 11, 12), (4, 3, 5, 5), {"strides": [2, 2], "dilations": [1, 2], "pads": [2, 3, 1, 4]}),
    ("xla", (1, 32, 6, 5), (4, 32, 3, 3), {"pads": [1, 1, 1, 1]}),  # wide k x k at batch 1
    (
        "xla",
        (1, 4, 6, 6),
        (6, 2, 3, 3),
        {"group": 2, "pads": [1, 1, 1, 1]},
    ),  # grouped, not depthwise
]


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{'x'.join(map(str, c[2]))}")
def test_lowering_matches_reference(case):
    lowering, xs, ws, attrs = case
    strides = tuple(attrs.get("strides", [1] * (len(xs) - 2)))
    assert nn.conv_lowering(xs, ws, strides, attrs.get("group", 1), np.dtype(np.float32)) == (
        lowering if jax.default_backend() == "cpu" else "xla"
    )
    inputs = {"x": rand(*xs), "w": rand(*ws), "b": rand(ws[0])}
    assert_matches_reference("Conv", inputs, opset=22, rtol=1e-4, atol=1e-5, **attrs)


@pytest.mark.parametrize("case", CASES[::2] + CASES[1:2], ids=lambda c: f"{c[0]}-{'x'.join(map(str, c[2]))}")
def test_lowering_grads(case):
    _, xs, ws, attrs = case
    check_op_grads("Conv", {"x": rand(*xs), "w": rand(*ws), "b": rand(ws[0])}, opset=22, **attrs)


@pytest.mark.parametrize("strides", [[1, 1], [1, 2]])
def test_depthwise_second_derivatives(strides):
    # The depthwise lowering's custom JVP is written in plain JAX, so derivatives of every
    # order follow; checked to second order, forward and reverse, over a batch whose tree of
    # halves has a tail (7 = 4 + 2 + 1). Unstrided, the input's tangent is the one placed at
    # opaque offsets (nn._input_tangent), here with a dilation.
    inputs = {"x": rand(7, 2, 5, 4), "w": rand(2, 1, 3, 2)}
    check_op_grads("Conv", inputs, opset=22, order=2, group=2, pads=[1, 0, 2, 1], strides=strides, dilations=[2, 1])


def test_forcing_xla_gives_the_same_values(monkeypatch):
    inputs = {"x": rand(2, 8, 10, 10), "w": rand(8, 8, 3, 3)}
    model = node_model("Conv", inputs, opset=22, pads=[1, 1, 1, 1])
    lowered = np.asarray(jonnx.load(model)(inputs["x"], inputs["w"])[0])
    monkeypatch.setattr(nn, "CONV_LOWERING", "xla")
    direct = np.asarray(jonnx.load(model)(inputs["x"], inputs["w"])[0])
    np.testing.assert_allclose(lowered, direct, rtol=1e-4, atol=1e-4)


def test_half_precision_stays_with_xla():
    assert nn.conv_lowering((1, 4, 8, 8), (4, 4, 3, 3), (1, 1), 1, np.dtype(np.float16)) == "xla"


def test_opaque_window_is_a_slice_with_the_slices_derivatives():
    # The depthwise lowering cuts its unstrided windows at offsets XLA cannot see (so that it
    # does not recompute a padded input's producer for the centre tap); values and every
    # derivative must be the plain slice's.
    x = RNG.standard_normal((2, 6, 7, 3)).astype(np.float32)
    start, limit = (0, 1, 2, 0), (2, 5, 7, 3)

    def opaque(v):
        return nn._opaque_window(v, start, limit)

    def plain(v):
        return jax.lax.slice(v, start, limit)

    np.testing.assert_array_equal(jax.jit(opaque)(x), plain(x))
    cotangent = RNG.standard_normal((2, 4, 5, 3)).astype(np.float32)
    (pullback,) = jax.vjp(opaque, x)[1](cotangent)
    np.testing.assert_array_equal(pullback, jax.vjp(plain, x)[1](cotangent)[0])
    np.testing.assert_array_equal(jax.jvp(opaque, (x,), (2 * x,))[1], plain(2 * x))
    np.testing.assert_array_equal(jax.vmap(opaque)(np.stack([x, -x])), np.stack([plain(x), plain(-x)]))


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 13])
def test_spread_product_is_a_broadcast_product(n):
    # spread / spread_product build a broadcast from doubling concatenations so that their
    # transpose is a tree of halves: values and derivatives must be the plain broadcast's.
    with jax.enable_x64(True):
        a = RNG.standard_normal((n, 3, 4))
        v = RNG.standard_normal((1, 3, 1))
        ct = RNG.standard_normal((n, 3, 4))
        np.testing.assert_array_equal(spread(v, (n, 3, 4)), np.broadcast_to(v, (n, 3, 4)))
        np.testing.assert_array_equal(spread_product(a, v), a * v)
        got = jax.vjp(spread_product, a, v)[1](ct)
        want = jax.vjp(lambda a, v: a * v, a, v)[1](ct)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-12)
        np.testing.assert_allclose(jax.jvp(spread_product, (a, v), (ct, v))[1], ct * v + a * v, rtol=1e-12)
        batched = jax.vmap(spread_product)(np.stack([a, -a]), np.stack([v, 2 * v]))
        np.testing.assert_allclose(batched, np.stack([a * v, -2 * a * v]), rtol=1e-12)
        check_grads(spread_product, (a, v), order=2, modes=("fwd", "rev"))

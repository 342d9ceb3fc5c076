"""SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss against the ReferenceEvaluator / numpy."""

from __future__ import annotations

import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jonnx.ops
from jonnx import errors
from tests.ops._harness import assert_matches_reference, assert_rounded_once, check_op_grads, node_model, run_jonnx

SHAPES = [(4, 3), (2, 3, 5), (2, 4, 3, 2)]


def _case(shape, dtype, ignore_index=None, weighted=False):
    """Inputs that do not depend on which tests ran before (pytest-xdist reorders them).

    Only every third sample is ignored: a target drawn equal to ``ignore_index`` is moved to
    another class, so the mean reduction never divides by a zero total weight.
    """
    rng = np.random.default_rng(zlib.crc32(repr((shape, np.dtype(dtype).str, ignore_index, weighted)).encode()))
    x = rng.standard_normal(shape).astype(dtype)
    target = rng.integers(0, shape[1], (shape[0],) + shape[2:]).astype(np.int64)
    if ignore_index is not None:
        target[target == ignore_index] = (ignore_index + 1) % shape[1]
        target.reshape(-1)[::3] = ignore_index  # every third sample ignored, the first included
    weight = rng.uniform(0.2, 1.5, shape[1]).astype(dtype) if weighted else None
    return x, target, weight


def _numpy_nll(logp, target, weight, reduction, ignore_index):
    """The spec's (and PyTorch's) definition, in float64: ignored samples weigh 0 everywhere."""
    logp = logp.astype(np.float64)
    n_classes = logp.shape[1]
    keep = np.ones(target.shape, bool) if ignore_index is None else target != ignore_index
    safe = np.clip(target, 0, n_classes - 1)
    picked = np.take_along_axis(logp, safe[:, None], axis=1)[:, 0]
    w = np.ones(target.shape) if weight is None else weight.astype(np.float64)[safe]
    w = np.where(keep, w, 0.0)
    loss = -picked * w
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / w.sum()


def _log_softmax(x):
    x = x.astype(np.float64)
    z = x - x.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


# 13 and 22 only widen the types: 12 and 22 stand for all three.
@pytest.mark.parametrize("opset", [12, 22])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("ignore_index", [None, 1])
def test_nll_matches_reference(opset, shape, reduction, weighted, ignore_index):
    x, target, weight = _case(shape, np.float32, ignore_index, weighted)
    attrs = {} if ignore_index is None else {"ignore_index": ignore_index}
    assert_matches_reference(
        "NegativeLogLikelihoodLoss",
        {"x": x, "target": target, "weight": weight},
        opset=opset,
        reduction=reduction,
        **attrs,
    )


@pytest.mark.parametrize("opset", [12, 13])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("ignore_index", [None, -1])
def test_sce_matches_reference(opset, shape, reduction, weighted, ignore_index):
    x, target, weight = _case(shape, np.float32, ignore_index, weighted)
    attrs = {} if ignore_index is None else {"ignore_index": ignore_index}
    assert_matches_reference(
        "SoftmaxCrossEntropyLoss",
        {"scores": x, "labels": target, "weights": weight},
        opset=opset,
        reduction=reduction,
        **attrs,
    )


@pytest.mark.parametrize("ignore_index", [-1, 7])
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_nll_ignore_index_outside_classes(ignore_index, reduction):
    # Numpy expectation: for ignore_index=-1 without weights, the ReferenceEvaluator averages
    # over all samples (its `elif ignore_index != -1` skips the mask), against the spec's "sum
    # of applied weights" and PyTorch, which leave ignored samples out of the mean.
    x, target, _ = _case((3, 4, 5), np.float32, ignore_index)
    assert_matches_reference(
        "NegativeLogLikelihoodLoss",
        {"x": x, "target": target},
        opset=22,
        reduction=reduction,
        ignore_index=ignore_index,
        rtol=1e-5,
        expected=lambda x, t: [_numpy_nll(x, t, None, reduction, ignore_index).astype(np.float32)],
    )


@pytest.mark.parametrize("target_dtype", [np.int32, np.int64])
def test_sce_log_prob_output_and_int32_labels(target_dtype):
    x, target, weight = _case((3, 4, 2, 2), np.float32, ignore_index=0, weighted=True)
    assert_matches_reference(
        "SoftmaxCrossEntropyLoss",
        {"scores": x, "labels": target.astype(target_dtype), "weights": weight},
        2,
        opset=13,
        reduction="mean",
        ignore_index=0,
    )


@pytest.mark.parametrize("op", ["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"])
@pytest.mark.parametrize("dtype,rtol", [(np.float64, 1e-12), (np.float16, 2e-2)])
@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_dtypes_are_kept(op, dtype, rtol, reduction):
    x, target, weight = _case((4, 5, 3), dtype, ignore_index=3, weighted=True)

    def expected(x, t, w):
        logp = _log_softmax(x) if op == "SoftmaxCrossEntropyLoss" else x
        return [np.asarray(_numpy_nll(logp, t, w, reduction, 3)).astype(dtype)]

    assert_matches_reference(
        op,
        {"x": x, "t": target, "w": weight},
        opset=13,
        reduction=reduction,
        ignore_index=3,
        expected=expected,
        rtol=rtol,
        atol=rtol,
    )


@pytest.mark.parametrize("op", ["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"])
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("ignore_index", [None, 1])
def test_gradients(op, reduction, ignore_index):
    x, target, weight = _case((3, 4, 2), np.float64, ignore_index, weighted=True)
    attrs = {} if ignore_index is None else {"ignore_index": ignore_index}
    check_op_grads(op, {"x": x, "t": target, "w": weight}, opset=13, reduction=reduction, **attrs)


@pytest.mark.parametrize("op", ["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"])
def test_ignored_samples_get_zero_finite_gradient(op):
    x, target, _ = _case((4, 3), np.float32)
    target[1] = -100
    if op == "NegativeLogLikelihoodLoss":
        x[1] = -np.inf  # a log-prob of 0 on an ignored row must not poison the loss or grad

    weight = np.ones(3, np.float32)

    def loss(x, w):
        return jonnx.ops.call(op, x, target, w, reduction="mean", ignore_index=-100, opset=13, n_outputs=1)

    value, (grad, w_grad) = jax.value_and_grad(loss, (0, 1))(jnp.asarray(x), jnp.asarray(weight))
    assert np.all(np.isfinite(w_grad))
    keep = np.arange(4) != 1
    logp = _log_softmax(x) if op == "SoftmaxCrossEntropyLoss" else x
    want = -np.take_along_axis(logp[keep], target[keep, None], axis=1).mean()
    np.testing.assert_allclose(value, want, rtol=1e-6)
    assert np.all(np.isfinite(grad))
    np.testing.assert_array_equal(np.asarray(grad)[1], 0)


@pytest.mark.parametrize(
    "attrs,target_shape,match",
    [
        ({"reduction": "avg"}, (2, 3), "reduction must be one of"),
        ({}, (2, 4), "target shape"),
    ],
)
def test_errors(attrs, target_shape, match):
    inputs = {"x": np.zeros((2, 5, 3), np.float32), "t": np.zeros(target_shape, np.int64)}
    model = node_model("SoftmaxCrossEntropyLoss", inputs, opset=13, **attrs)
    with pytest.raises(errors.NodeError, match=match):
        run_jonnx(model, inputs)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_half_precision_loss_rounds_once(reduction, dtype):
    # In float32, rounded once: onnxruntime rounds each log-probability to float16 first (its
    # weighted losses were one unit in the last place off for a quarter of the samples).
    dtype = jnp.dtype(dtype)
    rng = np.random.default_rng(1)
    scores = rng.standard_normal((64, 5, 3)).astype(dtype)
    labels = rng.integers(0, 5, (64, 3)).astype(np.int64)
    weights = (rng.random(5) + 0.5).astype(dtype)
    inputs = {"scores": scores, "labels": labels, "weights": weights}
    got = run_jonnx(node_model("SoftmaxCrossEntropyLoss", inputs, opset=13, reduction=reduction), inputs)[0]
    s, w = scores.astype(np.float64), weights.astype(np.float64)
    log_prob = s - np.log(np.exp(s).sum(axis=1, keepdims=True))
    per_sample = -np.take_along_axis(log_prob, labels[:, None], axis=1)[:, 0] * w[labels]
    exact = {"none": per_sample, "sum": per_sample.sum(), "mean": per_sample.sum() / w[labels].sum()}[reduction]
    assert_rounded_once(np.atleast_1d(got), np.atleast_1d(exact), dtype, most_off=0.02)

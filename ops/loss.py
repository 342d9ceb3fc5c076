"""Classification losses: SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss.

Both pick one class per sample out of a ``[N, C, d1, ..., dk]`` tensor of log-probabilities,
weight it, skip ``ignore_index`` and reduce; SoftmaxCrossEntropyLoss first takes a
log-softmax over axis 1. Gradients flow to the scores/input (and to ``weight``); ignored
samples contribute exactly zero gradient.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jonnx._registry import Attrs, Inputs, OpContext, Outputs, register
from jonnx.ops._util import rounded, widen_halves

_REDUCTIONS = ("none", "sum", "mean")


def _check(x, target, weight, what: str, ctx) -> None:
    shape, t_shape = jnp.shape(x), jnp.shape(target)
    if len(shape) < 2:
        raise ctx.error(f"{what} must have shape (N, C, d1, ..., dk); got {shape}")
    if t_shape != shape[:1] + shape[2:]:
        raise ctx.error(
            f"target shape {t_shape} does not match {what} shape {shape} (expected {shape[:1] + shape[2:]})"
        )
    if not jnp.issubdtype(jnp.result_type(target), jnp.integer):
        raise ctx.error(f"target must be an integer tensor, got {jnp.result_type(target)}")
    if weight is not None and jnp.shape(weight) != (shape[1],):
        raise ctx.error(f"weight must have shape ({shape[1]},), got {jnp.shape(weight)}")


def _nll(logp, target, weight, attrs, ctx):
    """Weighted, reduced ``-logp[n, target[n, ...], ...]`` with ``ignore_index`` skipped.

    ``mean`` divides by the sum of the weights applied (one per non-ignored sample when there
    is no ``weight``), as the spec and PyTorch do.
    """
    reduction, ignore = attrs["reduction"], attrs["ignore_index"]
    if reduction not in _REDUCTIONS:
        raise ctx.error(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    dtype = jnp.result_type(logp)
    logp, weight = widen_halves(jnp.asarray(logp), weight)  # rounded once, at the end
    compute = jnp.result_type(logp)
    n_classes = jnp.shape(logp)[1]
    target = jnp.asarray(target)
    # ignore_index may lie outside [0, C): gather from a clamped index and mask afterwards.
    safe = jnp.clip(target, 0, n_classes - 1)
    picked = jnp.take_along_axis(logp, jnp.expand_dims(safe, 1), axis=1)[:, 0]
    applied = None  # the per-sample weight, None where every sample weighs 1
    if weight is not None:
        applied = jnp.take(jnp.asarray(weight, compute), safe, axis=0)
    if ignore is not None:
        keep = target != ignore
        ones = jnp.ones((), compute)
        applied = jnp.where(keep, ones if applied is None else applied, 0).astype(compute)
        # Double where: a non-finite log-prob of an ignored sample must reach neither the
        # loss nor any gradient (0 * inf would be NaN).
        zero = jnp.zeros((), compute)
        loss = jnp.where(keep, -jnp.where(keep, picked, zero) * applied, zero)
    else:
        loss = -picked if applied is None else -picked * applied
    if reduction == "none":
        return loss.astype(dtype)
    if reduction == "sum":
        return jnp.sum(loss).astype(dtype)
    if applied is None:
        return jnp.mean(loss).astype(dtype)
    return (jnp.sum(loss) / jnp.sum(applied)).astype(dtype)


@register("NegativeLogLikelihoodLoss", since=(12, 13, 22))
def negative_log_likelihood_loss(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``NegativeLogLikelihoodLoss``, opsets 12+ (13 and 22 only widen types)."""
    x, target, weight = (tuple(inputs) + (None,))[:3]
    _check(x, target, weight, "input", ctx)
    return (_nll(jnp.asarray(x), target, weight, attrs, ctx),)


@register("SoftmaxCrossEntropyLoss", since=(12, 13))
def softmax_cross_entropy_loss(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``SoftmaxCrossEntropyLoss``, opsets 12+ (13 only widens types).

    The optional second output ``log_prob`` is produced when the node declares it.
    """
    scores, labels, weights = (tuple(inputs) + (None,))[:3]
    _check(scores, labels, weights, "scores", ctx)
    dtype = jnp.result_type(scores)
    (wide,) = widen_halves(jnp.asarray(scores))  # half scores: in float32, rounded once
    log_prob = jax.nn.log_softmax(rounded(wide), axis=1)
    loss = _nll(log_prob, labels, weights, attrs, ctx).astype(dtype)
    if ctx.n_outputs == 1:
        return (loss,)
    return (loss, log_prob.astype(dtype))

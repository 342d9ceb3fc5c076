"""ai.onnx.ml linear models and support vector machines."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jonnx._registry import Attrs, Inputs, OpContext, Outputs, register
from jonnx.ops._util import as_strings, index_dtype
from jonnx.ops.ml._common import (
    ML,
    as_2d,
    class_labels,
    float_features,
    need_concrete,
    post_transform,
    probit,
    string_labels_static,
)

# -- linear models --------------------------------------------------------------------------------


@register("LinearRegressor", since=1, domain=ML)
def linear_regressor(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX-ML ``LinearRegressor``-1: ``X @ coefficients.T + intercepts``, then post_transform."""
    x = as_2d(float_features(inputs[0]), ctx)
    targets = attrs["targets"]
    coef = np.asarray(attrs["coefficients"] or (), np.float32)
    if coef.size != targets * x.shape[1]:
        raise ctx.error(f"{coef.size} coefficients for {targets} targets x {x.shape[1]} features")
    scores = x @ jnp.asarray(coef.reshape(targets, -1).T, x.dtype)
    if attrs["intercepts"]:
        scores = scores + jnp.asarray(np.asarray(attrs["intercepts"], np.float32), x.dtype)
    return (post_transform(scores, attrs["post_transform"], ctx).astype(np.float32),)


@register("LinearClassifier", since=1, domain=ML, static_inputs=string_labels_static, host=string_labels_static)
def linear_classifier(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX-ML ``LinearClassifier``-1: linear scores, post_transform, top class (as onnxruntime).

    One row of coefficients with two labels gives scores ``[-s, s]``; one score column gives the
    first label where the score passes 0 (0.5 after a transform), else 0 (or "").
    """
    x = as_2d(float_features(inputs[0]), ctx)
    ints, strings = attrs["classlabels_ints"], attrs["classlabels_strings"]
    n_classes = len(ints or strings or ())
    coef = np.asarray(attrs["coefficients"], np.float32)
    if coef.size % x.shape[1]:
        raise ctx.error(f"{coef.size} coefficients do not divide into rows of {x.shape[1]} features")
    coef = coef.reshape(-1, x.shape[1])
    scores = x @ jnp.asarray(coef.T, x.dtype)
    if attrs["intercepts"]:
        scores = scores + jnp.asarray(np.asarray(attrs["intercepts"], np.float32), x.dtype)
    scores = scores.astype(np.float32)
    if coef.shape[0] == 1 and n_classes == 2:
        scores = jnp.concatenate([-scores, scores], axis=1)
    scores = post_transform(scores, attrs["post_transform"], ctx)
    if scores.shape[1] > 1:
        index = jnp.argmax(scores, axis=1)
        if n_classes:
            return class_labels(index, ints, strings, ctx, inputs[0]), scores
        return index.astype(index_dtype()), scores
    threshold = 0.0 if attrs["post_transform"] == "NONE" else 0.5
    hit = scores[:, 0] >= threshold
    if strings:
        need_concrete(inputs[0], ctx, "LinearClassifier with string labels")
        return as_strings(np.where(np.asarray(hit), strings[0], "")), scores
    positive = ints[0] if ints else 1
    return jnp.where(hit, positive, 0).astype(index_dtype()), scores


# -- SVMs -----------------------------------------------------------------------------------------


def _kernel(x, sv, kernel: str, params, ctx):
    """``kernel(x_n, sv_j)`` for all pairs: ``[N, F] x [V, F] -> [N, V]``."""
    gamma, coef0, degree = (tuple(params) + (0.0, 0.0, 0.0))[:3] if params else (0.0, 0.0, 0.0)
    kernel = kernel.upper()
    if kernel == "LINEAR":
        return x @ sv.T
    if kernel == "POLY":
        return (x @ sv.T * gamma + coef0) ** int(degree)
    if kernel == "SIGMOID":
        return jnp.tanh(x @ sv.T * gamma + coef0)
    if kernel == "RBF":
        d2 = jnp.sum((x[:, None, :] - sv[None, :, :]) ** 2, axis=-1)
        return jnp.exp(-gamma * d2)
    raise ctx.error(f"kernel_type must be LINEAR, POLY, RBF or SIGMOID, got {kernel!r}")


@register("SVMRegressor", since=1, domain=ML)
def svm_regressor(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX-ML ``SVMRegressor``-1: kernel expansion (or linear), plus ``rho``; one_class gives +-1."""
    x = as_2d(float_features(inputs[0]), ctx)
    coef = jnp.asarray(np.asarray(attrs["coefficients"], np.float32), x.dtype)
    rho = float(attrs["rho"][0]) if attrs["rho"] else 0.0
    n_supports = attrs["n_supports"]
    if n_supports > 0:
        sv = np.asarray(attrs["support_vectors"], np.float32).reshape(n_supports, -1)
        k = _kernel(x, jnp.asarray(sv, x.dtype), attrs["kernel_type"], attrs["kernel_params"], ctx)
        s = k @ coef[:n_supports] + rho
    else:
        s = x @ coef + rho
    s = s[:, None]
    if attrs["one_class"]:
        s = jnp.where(s > 0, 1.0, -1.0).astype(s.dtype)
    return (post_transform(s, attrs["post_transform"], ctx).astype(np.float32),)


# Compiled once per shape: run eagerly (string labels with optimize=False put the classifier on
# the host), a while_loop traced afresh compiled on every call (267 ms for a 3-class SVM).
@jax.jit
def _multiclass_probability(r):
    """libsvm's pairwise-coupling solver, vectorised over rows: ``r`` is ``[N, k, k]``."""
    n, k = r.shape[:2]
    eye = jnp.eye(k, dtype=bool)
    # libsvm's (and onnxruntime's) Q: Q[t, t] = sum_{j != t} r[j, t]^2, Q[t, j] = -r[j, t] r[t, j].
    # The onnx reference sums a dot product into every off-diagonal entry instead (wrong for
    # more than two classes).
    diag = jnp.sum(jnp.where(eye, 0.0, r * r), axis=1)
    q = jnp.where(eye, diag[:, None, :] * eye, -jnp.swapaxes(r, 1, 2) * r)
    p = jnp.full((n, k), 1.0 / k, r.dtype)
    eps = 0.005 / k

    def cond(state):
        it, _, done = state
        return (it < max(100, k)) & ~jnp.all(done)

    def body(state):
        it, p, done = state
        qp = jnp.einsum("ntj,nj->nt", q, p)
        pqp = jnp.sum(p * qp, axis=1)
        done = done | (jnp.max(jnp.abs(qp - pqp[:, None]), axis=1) < eps)
        new_p, new_qp, new_pqp = p, qp, pqp
        for t in range(k):
            qtt = q[:, t, t]
            diff = (-new_qp[:, t] + new_pqp) / qtt
            new_p = new_p.at[:, t].add(diff)
            new_pqp = (new_pqp + diff * (diff * qtt + 2 * new_qp[:, t])) / (1 + diff) ** 2
            new_p = new_p / (1 + diff)[:, None]
            new_qp = (new_qp + diff[:, None] * q[:, t, :]) / (1 + diff)[:, None]
        p = jnp.where(done[:, None], p, new_p)
        return it + 1, p, done

    _, p, _ = lax.while_loop(cond, body, (0, p, jnp.zeros(n, bool)))
    return p


@register("SVMClassifier", since=1, domain=ML, static_inputs=string_labels_static, host=string_labels_static)
def svm_classifier(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX-ML ``SVMClassifier``-1: one-vs-one votes (or linear scores), libsvm probabilities when
    ``prob_a``/``prob_b`` are set, and onnxruntime's label and score rules for two classes.
    """
    x = as_2d(float_features(inputs[0]), ctx)
    ints, strings = attrs["classlabels_ints"], attrs["classlabels_strings"]
    n_classes = max(len(ints or strings or ()), 1)
    per_class = list(attrs["vectors_per_class"] or ())
    n_vectors = sum(per_class)
    coefficients = np.asarray(attrs["coefficients"] or (), np.float32)
    rho = np.asarray(attrs["rho"] or (0.0,), np.float32)
    dtype = x.dtype
    votes = None
    if n_vectors > 0:
        sv = np.asarray(attrs["support_vectors"], np.float32).reshape(n_vectors, -1)
        kern = _kernel(x, jnp.asarray(sv, dtype), attrs["kernel_type"], attrs["kernel_params"], ctx)
        coefs = coefficients.reshape(-1, n_vectors)
        starts = np.concatenate([[0], np.cumsum(per_class)[:-1]]).astype(int)
        pairs = [(i, j) for i in range(n_classes) for j in range(i + 1, n_classes)]
        mix = np.zeros((n_vectors, len(pairs)), np.float64)
        win = np.zeros((len(pairs), n_classes), np.float32)
        lose = np.zeros((len(pairs), n_classes), np.float32)
        for p, (i, j) in enumerate(pairs):
            si, sj = starts[i], starts[j]
            mix[si : si + per_class[i], p] = coefs[j - 1, si : si + per_class[i]]
            mix[sj : sj + per_class[j], p] = coefs[i, sj : sj + per_class[j]]
            win[p, i] = lose[p, j] = 1
        res = kern @ jnp.asarray(mix, dtype) + jnp.asarray(rho[: len(pairs)], dtype)
        positive = (res > 0).astype(dtype)
        votes = positive @ jnp.asarray(win, dtype) + (1 - positive) @ jnp.asarray(lose, dtype)
    else:
        coefs = coefficients.reshape(n_classes, -1)
        res = x @ jnp.asarray(coefs.T, dtype) + rho[0]

    has_proba = bool(attrs["prob_a"]) and n_vectors > 0
    if has_proba:
        prob_a = jnp.asarray(np.asarray(attrs["prob_a"], np.float32), dtype)
        prob_b = jnp.asarray(np.asarray(attrs["prob_b"], np.float32), dtype)
        val = jnp.clip(1 - jax.nn.sigmoid(res * prob_a + prob_b), 1e-7, 1 - 1e-7)
        r = jnp.zeros((x.shape[0], n_classes, n_classes), dtype)
        for p, (i, j) in enumerate(pairs):
            r = r.at[:, i, j].set(val[:, p]).at[:, j, i].set(1 - val[:, p])
        scores = _multiclass_probability(r)
    else:
        scores = res

    decide = votes if votes is not None else scores
    max_class = jnp.argmax(decide, axis=1)
    max_weight = jnp.max(decide, axis=1)
    two_class = False  # one decision value for two classes: scores become (-s, s)
    label_table = list(ints) if ints else list(range(len(strings or ())))
    if rho.size == 1:
        if len(label_table) == 2:
            two_class = True
            if not has_proba and coefficients.min(initial=0) >= 0:
                index = jnp.where(max_weight >= 0.5, 1, max_class)
            else:
                index = max_class
            label = class_labels(index, ints, strings, ctx, inputs[0])
        else:
            label = jnp.where(max_weight > 0, 1, 0).astype(index_dtype())
    elif n_classes and (ints or strings):
        label = class_labels(max_class, ints, strings, ctx, inputs[0])
    else:
        label = max_class.astype(index_dtype())

    post = attrs["post_transform"]
    if scores.shape[1] >= 2:
        final = post_transform(scores, post, ctx)
    elif post == "PROBIT":
        final = probit(scores)
    elif two_class:
        pair = jnp.concatenate([-scores, scores], axis=1)
        final = pair if post == "NONE" else post_transform(pair, post, ctx)
    else:
        final = scores
    return label, final.astype(np.float32)

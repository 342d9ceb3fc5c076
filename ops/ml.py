"""The ``ai.onnx.ml`` domain: classic machine-learning ops (scikit-learn via skl2onnx).

Numeric ops (linear models, SVMs, tree ensembles, scalers, ...) are written with jnp/lax and run
on traced inputs under ``jit``: a tree ensemble walks every tree of the forest at once, one
level per step, for a static number of steps (the forest's depth), so no Python runs per sample.

Strings and maps have no JAX type. String tensors are numpy object arrays of ``str`` and maps
are Python dicts, both known at trace time: ops that read them (LabelEncoder with string keys,
CategoryMapper, DictVectorizer, CastMap) need concrete inputs. Classifiers with string labels
compute the class index with jnp and turn it into strings only when the input is concrete;
integer labels work traced. ZipMap returns a list of dicts of scalars (a pytree, so it also
works traced).

Post transforms follow onnxruntime and the onnx reference: ``PROBIT`` uses their closed-form
approximation of ``erfinv`` (Winitzki, a = 0.147), ``SOFTMAX_ZERO`` leaves exact zeros at zero.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jonnx._registry import register
from jonnx._values import is_concrete
from jonnx.ops._util import canonical, index_dtype

_ML = "ai.onnx.ml"


# -- shared helpers ------------------------------------------------------------------------------


def _is_string(x) -> bool:
    return isinstance(x, (np.ndarray, np.generic)) and np.asarray(x).dtype.kind in "OUS"


def _strings(values) -> np.ndarray:
    """Any array-like of str/bytes as an object array of ``str``."""
    arr = np.asarray(values, dtype=object)
    out = np.empty(arr.shape, object)
    for i, v in np.ndenumerate(arr):
        out[i] = v.decode("utf-8", errors="surrogateescape") if isinstance(v, bytes) else str(v)
    return out


def _float_input(x) -> jax.Array:
    """Features as float32 (float64 stays float64), as the ML ops compute."""
    dtype = jnp.result_type(x)
    return jnp.asarray(x, dtype if dtype in (np.float32, np.float64) else np.float32)


def _as_2d(x, ctx) -> jax.Array:
    """``[C]`` -> ``[1, C]``; ``[N, C]`` stays; other ranks are an error."""
    if jnp.ndim(x) == 1:
        return jnp.reshape(x, (1, -1))
    if jnp.ndim(x) != 2:
        raise ctx.error(f"input must have shape [N, C] or [C], got {jnp.shape(x)}")
    return x


def _tensor_attr(attrs, name, fallback=None, dtype=None):
    """``name_as_tensor`` when set (opset 3+), else the list attribute ``name``, as numpy."""
    t = attrs.get(name + "_as_tensor")
    value = t if t is not None else attrs.get(name)
    if value is None:
        value = fallback
    if value is None:
        return None
    return np.asarray(value, dtype) if dtype is not None else np.asarray(value)


def _erfinv_approx(x):
    # The closed form onnxruntime and the onnx reference use (Winitzki, a = 0.147); PROBIT
    # must reproduce it rather than the exact inverse to match their outputs.
    sgn = jnp.where(x < 0, -1.0, 1.0).astype(x.dtype)
    y = (1.0 - x) * (1.0 + x)
    zero = y == 0
    log = jnp.log(jnp.where(zero, 1.0, y))
    v = 2.0 / (math.pi * 0.147) + 0.5 * log
    v2 = log / 0.147
    v3 = -v + jnp.sqrt(v * v - v2)
    return jnp.where(zero, 0.0, sgn * jnp.sqrt(jnp.maximum(v3, 0.0))).astype(x.dtype)


def _probit(x):
    return (1.41421356 * _erfinv_approx(x * 2 - 1)).astype(x.dtype)


def _softmax_zero(s):
    vmax = jnp.max(s, axis=-1, keepdims=True)
    nonzero = jnp.abs(s) > 1e-7
    e = jnp.where(nonzero, jnp.exp(jnp.where(nonzero, s - vmax, 0.0)), s * jnp.exp(-vmax))
    total = jnp.sum(e, axis=-1, keepdims=True)
    empty = total == 0
    return jnp.where(empty, 0.5, e / jnp.where(empty, 1.0, total)).astype(s.dtype)


def _post_transform(scores, name: str, ctx):
    """The ``post_transform`` attribute's function applied to ``scores`` ``[N, C]``."""
    if name == "NONE":
        return scores
    if name == "LOGISTIC":
        return jax.nn.sigmoid(scores)
    if name == "SOFTMAX":
        return jax.nn.softmax(scores, axis=-1)
    if name == "SOFTMAX_ZERO":
        return _softmax_zero(scores)
    if name == "PROBIT":
        return _probit(scores)
    raise ctx.error(
        f"post_transform must be NONE, LOGISTIC, SOFTMAX, SOFTMAX_ZERO or PROBIT, got {name!r}"
    )


def _labels(index, int_labels, string_labels, ctx, x):
    """Class indices -> the label attribute's values (strings only for a concrete input)."""
    if string_labels:
        if not is_concrete(x):
            raise ctx.error(
                "string class labels are host values and need a concrete input; run the model "
                "outside jax.jit (or on numpy inputs), or export it with classlabels_int64s"
            )
        return _strings(np.asarray(string_labels, object)[np.asarray(index)])
    table = jnp.asarray(np.asarray(int_labels, np.int64), index_dtype())
    return table[index]


def _string_labels_static(attrs):
    # String labels are host values: the input must be known at trace time to produce them.
    # Declaring it static lets Model.__call__ pass it as a static argument (one compilation per
    # distinct value); a caller's own jax.jit gets a StaticValueError naming the chain.
    return (0,) if attrs.get("classlabels_strings") else ()


def _need_concrete(x, ctx, what: str):
    if not is_concrete(x):
        raise ctx.error(f"{what} needs a concrete input (it reads or writes host values)")


# -- simple numeric ops ---------------------------------------------------------------------------


@register("ArrayFeatureExtractor", since=1, domain=_ML)
def array_feature_extractor(inputs, attrs, ctx):
    """ONNX-ML ``ArrayFeatureExtractor``-1: select entries of the last axis.

    As onnxruntime does, a 1-D ``X`` gives a ``[1, len(Y)]`` output. Out-of-range indices are
    an error when ``Y`` is concrete; traced, they are clamped (JAX gather semantics).
    """
    x, y = inputs
    count = int(np.prod(np.shape(y), dtype=np.int64))
    last = np.shape(x)[-1] if np.ndim(x) else 1
    if is_concrete(y):
        idx = np.asarray(y).reshape(-1)
        if np.any((idx < 0) | (idx >= last)):
            raise ctx.error(f"indices {idx.tolist()} out of range for a last axis of size {last}")
    shape = (1, count) if np.ndim(x) <= 1 else tuple(np.shape(x)[:-1]) + (count,)
    if _is_string(x):
        _need_concrete(y, ctx, "ArrayFeatureExtractor on strings")
        return (np.take(np.asarray(x), np.asarray(y).reshape(-1), axis=-1).reshape(shape),)
    idx = jnp.reshape(jnp.asarray(y), (-1,))
    return (jnp.reshape(jnp.take(x, idx, axis=-1, mode="clip"), shape),)


@register("Binarizer", since=1, domain=_ML)
def binarizer(inputs, attrs, ctx):
    """ONNX-ML ``Binarizer``-1: 1 where ``X > threshold``, else 0, in X's dtype."""
    (x,) = inputs
    x = jnp.asarray(x)
    return (jnp.where(x > jnp.asarray(attrs["threshold"], x.dtype), 1, 0).astype(x.dtype),)


@register("Scaler", since=1, domain=_ML)
def scaler(inputs, attrs, ctx):
    """ONNX-ML ``Scaler``-1: ``(X - offset) * scale`` per feature, as float."""
    (x,) = inputs
    x = _float_input(x)
    offset = jnp.asarray(np.asarray(attrs["offset"] or (0.0,), np.float32), x.dtype)
    scale = jnp.asarray(np.asarray(attrs["scale"] or (1.0,), np.float32), x.dtype)
    for name, v in (("offset", offset), ("scale", scale)):
        if v.size not in (1, jnp.shape(x)[-1] if jnp.ndim(x) else 1):
            raise ctx.error(f"{name} has {v.size} values for {jnp.shape(x)[-1]} features")
    return (((x - offset) * scale).astype(np.float32),)


@register("Normalizer", since=1, domain=_ML)
def normalizer(inputs, attrs, ctx):
    """ONNX-ML ``Normalizer``-1: rows divided by their MAX, L1 or L2 norm (at least 1e-30)."""
    x = _as_2d(_float_input(inputs[0]), ctx)
    norm = attrs["norm"]
    if norm == "MAX":
        div = jnp.max(jnp.abs(x), axis=1, keepdims=True)
    elif norm == "L1":
        div = jnp.sum(jnp.abs(x), axis=1, keepdims=True)
    elif norm == "L2":
        sq = jnp.sum(x * x, axis=1, keepdims=True)
        # Double where: sqrt's gradient at an all-zero row would be inf * 0 = nan.
        div = jnp.where(sq > 0, jnp.sqrt(jnp.where(sq > 0, sq, 1.0)), 0.0)
    else:
        raise ctx.error(f"norm must be MAX, L1 or L2, got {norm!r}")
    out = x / jnp.maximum(div, 1e-30)
    return (jnp.reshape(out, jnp.shape(inputs[0])).astype(np.float32),)


@register("Imputer", since=1, domain=_ML)
def imputer(inputs, attrs, ctx):
    """ONNX-ML ``Imputer``-1: replace ``replaced_value_*`` (NaN included) by the imputed values."""
    (x,) = inputs
    x = jnp.asarray(x)
    floats, ints = attrs["imputed_value_floats"], attrs["imputed_value_int64s"]
    if floats:
        values, replaced = floats, attrs["replaced_value_float"]
    elif ints:
        values, replaced = ints, attrs["replaced_value_int64"]
    else:
        raise ctx.error("one of imputed_value_floats or imputed_value_int64s must be set")
    features = jnp.shape(x)[-1] if jnp.ndim(x) else 1
    if len(values) not in (1, features):
        raise ctx.error(f"{len(values)} imputed values for {features} features (need 1 or {features})")
    values = jnp.asarray(np.asarray(values), x.dtype)
    if jnp.issubdtype(x.dtype, jnp.floating) and math.isnan(replaced):
        hit = jnp.isnan(x)
    else:
        hit = x == jnp.asarray(replaced, x.dtype)
    return (jnp.where(hit, values, x),)


@register("FeatureVectorizer", since=1, domain=_ML)
def feature_vectorizer(inputs, attrs, ctx):
    """ONNX-ML ``FeatureVectorizer``-1: concatenate inputs' features, cut or zero-padded to
    ``inputdimensions``, as float. A 1-D input is one feature per row, as in the onnx reference.
    """
    dims = attrs["inputdimensions"]
    if dims is None or len(dims) != len(inputs):
        raise ctx.error(f"inputdimensions {dims} must give one size per input ({len(inputs)})")
    parts = []
    for x, d in zip(inputs, dims):
        x = jnp.asarray(x).astype(np.float32)
        if x.ndim == 1:
            x = x[:, None]
        if x.ndim != 2:
            raise ctx.error(f"every input must have rank 1 or 2, got shape {x.shape}")
        x = x[:, :d] if d <= x.shape[1] else jnp.pad(x, ((0, 0), (0, d - x.shape[1])))
        parts.append(x)
    return (jnp.concatenate(parts, axis=1),)


@register("OneHotEncoder", since=1, domain=_ML,
          static_inputs=lambda attrs: (0,) if attrs["cats_strings"] and not attrs["cats_int64s"] else (),
          host=lambda attrs: bool(attrs["cats_strings"] and not attrs["cats_int64s"]))
def one_hot_encoder(inputs, attrs, ctx):
    """ONNX-ML ``OneHotEncoder``-1: ``X.shape + [categories]`` of 0/1 floats.

    With ``zeros=0`` a value outside the categories is an error; that check needs a concrete
    input (traced, such rows are all zeros).
    """
    (x,) = inputs
    ints, strings = attrs["cats_int64s"], attrs["cats_strings"]
    if ints:
        if _is_string(x):
            raise ctx.error("the node has cats_int64s, so X must be numeric, not strings")
        codes = jnp.asarray(x)
        if not jnp.issubdtype(codes.dtype, jnp.integer):
            codes = codes.astype(canonical(np.int64))
        cats = jnp.asarray(np.asarray(ints, np.int64), codes.dtype)
        out = (codes[..., None] == cats).astype(np.float32)
    elif strings:
        if not _is_string(x):
            raise ctx.error("the node has cats_strings, so X must be a string tensor")
        table = {s: i for i, s in reversed(list(enumerate(strings)))}
        idx = np.vectorize(lambda s: table.get(s, -1), otypes=[np.int64])(_strings(x))
        out = (idx[..., None] == np.arange(len(strings))).astype(np.float32)
    else:
        raise ctx.error("one of cats_int64s or cats_strings must be set")
    if not attrs["zeros"] and is_concrete(x) and np.any(np.asarray(out).sum(-1) == 0):
        raise ctx.error("zeros=0 and an input value is not among the categories")
    return (out,)


# -- linear models --------------------------------------------------------------------------------


@register("LinearRegressor", since=1, domain=_ML)
def linear_regressor(inputs, attrs, ctx):
    """ONNX-ML ``LinearRegressor``-1: ``X @ coefficients.T + intercepts``, then post_transform."""
    x = _as_2d(_float_input(inputs[0]), ctx)
    targets = attrs["targets"]
    coef = np.asarray(attrs["coefficients"] or (), np.float32)
    if coef.size != targets * x.shape[1]:
        raise ctx.error(f"{coef.size} coefficients for {targets} targets x {x.shape[1]} features")
    scores = x @ jnp.asarray(coef.reshape(targets, -1).T, x.dtype)
    if attrs["intercepts"]:
        scores = scores + jnp.asarray(np.asarray(attrs["intercepts"], np.float32), x.dtype)
    return (_post_transform(scores, attrs["post_transform"], ctx).astype(np.float32),)


@register("LinearClassifier", since=1, domain=_ML, static_inputs=_string_labels_static, host=_string_labels_static)
def linear_classifier(inputs, attrs, ctx):
    """ONNX-ML ``LinearClassifier``-1: linear scores, post_transform, top class (as onnxruntime).

    One row of coefficients with two labels gives scores ``[-s, s]``; one score column gives the
    first label where the score passes 0 (0.5 after a transform), else 0 (or "").
    """
    x = _as_2d(_float_input(inputs[0]), ctx)
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
    scores = _post_transform(scores, attrs["post_transform"], ctx)
    if scores.shape[1] > 1:
        index = jnp.argmax(scores, axis=1)
        if n_classes:
            return _labels(index, ints, strings, ctx, inputs[0]), scores
        return index.astype(index_dtype()), scores
    threshold = 0.0 if attrs["post_transform"] == "NONE" else 0.5
    hit = scores[:, 0] >= threshold
    if strings:
        _need_concrete(inputs[0], ctx, "LinearClassifier with string labels")
        return _strings(np.where(np.asarray(hit), strings[0], "")), scores
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


@register("SVMRegressor", since=1, domain=_ML)
def svm_regressor(inputs, attrs, ctx):
    """ONNX-ML ``SVMRegressor``-1: kernel expansion (or linear), plus ``rho``; one_class gives +-1."""
    x = _as_2d(_float_input(inputs[0]), ctx)
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
    return (_post_transform(s, attrs["post_transform"], ctx).astype(np.float32),)


def _multiclass_probability(r, k: int):
    """libsvm's pairwise-coupling solver, vectorised over rows: ``r`` is ``[N, k, k]``."""
    n = r.shape[0]
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


@register("SVMClassifier", since=1, domain=_ML, static_inputs=_string_labels_static, host=_string_labels_static)
def svm_classifier(inputs, attrs, ctx):
    """ONNX-ML ``SVMClassifier``-1: one-vs-one votes (or linear scores), libsvm probabilities when
    ``prob_a``/``prob_b`` are set, and onnxruntime's label and score rules for two classes.
    """
    x = _as_2d(_float_input(inputs[0]), ctx)
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
            mix[si:si + per_class[i], p] = coefs[j - 1, si:si + per_class[i]]
            mix[sj:sj + per_class[j], p] = coefs[i, sj:sj + per_class[j]]
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
        scores = _multiclass_probability(r, n_classes)
    else:
        scores = res

    decide = votes if votes is not None else scores
    max_class = jnp.argmax(decide, axis=1)
    max_weight = jnp.max(decide, axis=1)
    add_second = -1
    label_table = list(ints) if ints else list(range(len(strings or ())))
    if rho.size == 1:
        if len(label_table) == 2:
            add_second = 2
            if not has_proba and coefficients.min(initial=0) >= 0:
                index = jnp.where(max_weight >= 0.5, 1, max_class)
            else:
                index = max_class
            label = _labels(index, ints, strings, ctx, inputs[0])
        else:
            label = jnp.where(max_weight > 0, 1, 0).astype(index_dtype())
    elif n_classes and (ints or strings):
        label = _labels(max_class, ints, strings, ctx, inputs[0])
    else:
        label = max_class.astype(index_dtype())

    post = attrs["post_transform"]
    if scores.shape[1] >= 2:
        final = _post_transform(scores, post, ctx)
    elif post == "PROBIT":
        final = _probit(scores)
    elif add_second in (0, 1):
        final = jnp.concatenate([1 - scores, scores], axis=1)
    elif add_second in (2, 3):
        pair = jnp.concatenate([-scores, scores], axis=1)
        final = pair if post == "NONE" else _post_transform(pair, post, ctx)
    else:
        final = scores
    return label, final.astype(np.float32)


# -- tree ensembles -------------------------------------------------------------------------------

_MODES = {"BRANCH_LEQ": 0, "BRANCH_LT": 1, "BRANCH_GTE": 2, "BRANCH_GT": 3, "BRANCH_EQ": 4,
          "BRANCH_NEQ": 5, "BRANCH_MEMBER": 6, "LEAF": 7}
_LEAF = 7


@dataclasses.dataclass(frozen=True)
class _Forest:
    """A forest as flat arrays over all its nodes, leaves included (a leaf points to itself).

    ``weights[m, t]`` sums the leaf ``m``'s votes for target ``t``; ``low``/``high`` hold the
    smallest/largest vote (+-inf where the leaf has none), for MIN/MAX aggregation.
    """

    feature: np.ndarray
    threshold: np.ndarray
    mode: np.ndarray
    missing_true: np.ndarray
    true_next: np.ndarray
    false_next: np.ndarray
    members: np.ndarray | None
    roots: np.ndarray
    depth: int
    weights: np.ndarray
    low: np.ndarray
    high: np.ndarray


def _depth(true_next, false_next, mode, roots) -> int:
    depth, frontier, seen = 0, set(int(r) for r in roots), set()
    while True:
        frontier = {n for n in frontier if mode[n] != _LEAF}
        if not frontier:
            return depth
        if frontier & seen:
            raise ValueError("the trees have a cycle")
        seen |= frontier
        frontier = {int(true_next[n]) for n in frontier} | {int(false_next[n]) for n in frontier}
        depth += 1


def _votes(n_nodes, n_targets, node_of_vote, target_of_vote, weight_of_vote, ctx):
    weights = np.zeros((n_nodes, n_targets), np.float64)
    low = np.full((n_nodes, n_targets), np.inf)
    high = np.full((n_nodes, n_targets), -np.inf)
    for m, t, w in zip(node_of_vote, target_of_vote, weight_of_vote):
        if not 0 <= t < n_targets:
            raise ctx.error(f"a leaf votes for target/class {t}, outside [0, {n_targets})")
        weights[m, t] += w
        low[m, t] = min(low[m, t], w)
        high[m, t] = max(high[m, t], w)
    return weights, low, high


def _legacy_forest(attrs, prefix: str, n_targets: int, ctx) -> _Forest:
    """TreeEnsembleRegressor/Classifier attributes (nodes by (tree id, node id)) as a _Forest."""
    tree_ids = list(attrs["nodes_treeids"] or ())
    node_ids = list(attrs["nodes_nodeids"] or ())
    n = len(tree_ids)
    if not n:
        raise ctx.error("the ensemble has no nodes")
    modes = attrs["nodes_modes"] or ()
    try:
        mode = np.array([_MODES[m] for m in modes], np.int32)
    except KeyError as e:
        raise ctx.error(f"unknown node mode {e.args[0]!r}") from None
    if mode.size != n or (mode == 6).any():
        raise ctx.error("nodes_modes must give one BRANCH_*/LEAF mode per node")
    where = {(t, i): k for k, (t, i) in enumerate(zip(tree_ids, node_ids))}
    true_next, false_next = np.arange(n), np.arange(n)
    for k in range(n):
        if mode[k] == _LEAF:
            continue
        for arr, ids in ((true_next, attrs["nodes_truenodeids"]), (false_next, attrs["nodes_falsenodeids"])):
            key = (tree_ids[k], ids[k])
            if key not in where:
                raise ctx.error(f"node {node_ids[k]} of tree {tree_ids[k]} points to missing node {ids[k]}")
            arr[k] = where[key]
    roots = {}
    for k, t in enumerate(tree_ids):
        roots.setdefault(t, k)
    roots = np.array([roots[t] for t in sorted(roots)], np.int64)
    threshold = _tensor_attr(attrs, "nodes_values", (0.0,) * n)
    missing = np.zeros(n, bool)
    if attrs["nodes_missing_value_tracks_true"]:
        missing[:] = np.asarray(attrs["nodes_missing_value_tracks_true"]) != 0
    vote_trees, vote_nodes = attrs[f"{prefix}_treeids"] or (), attrs[f"{prefix}_nodeids"] or ()
    vote_targets = attrs[f"{prefix}_ids"] or ()
    vote_weights = _tensor_attr(attrs, f"{prefix}_weights", (), np.float64)
    try:
        vote_nodes = [where[t, i] for t, i in zip(vote_trees, vote_nodes)]
    except KeyError as e:
        raise ctx.error(f"a vote names node {e.args[0][1]} of tree {e.args[0][0]}, which does not exist") from None
    weights, low, high = _votes(n, n_targets, vote_nodes, vote_targets, vote_weights, ctx)
    return _Forest(
        feature=np.asarray(attrs["nodes_featureids"], np.int64), threshold=threshold, mode=mode,
        missing_true=missing, true_next=true_next, false_next=false_next, members=None,
        roots=roots, depth=_depth(true_next, false_next, mode, roots), weights=weights,
        low=low, high=high,
    )


def _forest_v5(attrs, ctx) -> _Forest:
    """TreeEnsemble-5 attributes (interior nodes, then leaves) as a _Forest."""
    mode_in = np.asarray(attrs["nodes_modes"]).astype(np.int32).reshape(-1)
    n = mode_in.size
    leaf_w = np.asarray(attrs["leaf_weights"]).reshape(-1)
    n_leaves = leaf_w.size
    size = n + n_leaves
    mode = np.concatenate([mode_in, np.full(n_leaves, _LEAF, np.int32)])
    if (mode_in < 0).any() or (mode_in > 6).any():
        raise ctx.error("nodes_modes entries must be in 0..6")
    def child(ids, leafs):
        ids, leafs = np.asarray(ids, np.int64), np.asarray(leafs, bool)
        return np.where(leafs, ids + n, ids)
    true_next = np.concatenate([child(attrs["nodes_truenodeids"], attrs["nodes_trueleafs"]), np.arange(n, size)])
    false_next = np.concatenate([child(attrs["nodes_falsenodeids"], attrs["nodes_falseleafs"]), np.arange(n, size)])
    if (true_next < 0).any() or (true_next >= size).any() or (false_next < 0).any() or (false_next >= size).any():
        raise ctx.error("a node's child index is out of range")
    roots = []
    for r in attrs["tree_roots"]:
        degenerate = (attrs["nodes_trueleafs"][r] and attrs["nodes_falseleafs"][r]
                      and attrs["nodes_truenodeids"][r] == attrs["nodes_falsenodeids"][r])
        roots.append(true_next[r] if degenerate else r)
    roots = np.asarray(roots, np.int64)
    splits = np.asarray(attrs["nodes_splits"]).reshape(-1)
    threshold = np.concatenate([splits, np.zeros(n_leaves, splits.dtype)])
    missing = np.zeros(size, bool)
    if attrs["nodes_missing_value_tracks_true"]:
        missing[:n] = np.asarray(attrs["nodes_missing_value_tracks_true"]) != 0
    members = None
    if (mode_in == 6).any():
        values = attrs["membership_values"]
        if values is None:
            raise ctx.error("BRANCH_MEMBER nodes need membership_values")
        values = np.asarray(values).reshape(-1)
        sets = [[]]
        for v in values:
            if np.isnan(v):
                sets.append([])
            else:
                sets[-1].append(v)
        sets = sets[:-1] if not sets[-1] else sets
        if len(sets) != int((mode_in == 6).sum()):
            raise ctx.error("membership_values must give one NaN-terminated set per BRANCH_MEMBER node")
        width = max(1, max(len(s) for s in sets))
        members = np.full((size, width), np.nan, values.dtype)
        for k, s in zip(np.flatnonzero(mode_in == 6), sets):
            members[k, : len(s)] = s
    n_targets = attrs["n_targets"]
    if n_targets is None:
        raise ctx.error("n_targets must be set")
    targets = np.asarray(attrs["leaf_targetids"], np.int64)
    weights, low, high = _votes(size, n_targets, np.arange(n, size), targets, leaf_w.astype(np.float64), ctx)
    return _Forest(
        feature=np.concatenate([np.asarray(attrs["nodes_featureids"], np.int64), np.zeros(n_leaves, np.int64)]),
        threshold=threshold, mode=mode, missing_true=missing, true_next=true_next,
        false_next=false_next, members=members, roots=roots,
        depth=_depth(true_next, false_next, mode, roots), weights=weights, low=low, high=high,
    )


def _compare(code: int, v, th, members):
    if code == 0:
        return v <= th
    if code == 1:
        return v < th
    if code == 2:
        return v >= th
    if code == 3:
        return v > th
    if code == 4:
        return v == th
    if code == 5:
        return v != th
    return jnp.any(v[..., None] == members, axis=-1)


def _walk(forest: _Forest, x) -> jax.Array:
    """The leaf each row reaches in each tree: ``[N, F] -> [N, trees]`` node indices.

    Every tree advances one level per step for ``depth`` steps; a leaf points to itself.
    A NaN feature takes the branch ``nodes_missing_value_tracks_true`` names (the spec's rule).
    """
    n = x.shape[0]
    if forest.feature.size and (forest.feature.max() >= max(x.shape[1], 1) or forest.feature.min() < 0):
        raise ValueError(f"a node reads feature {forest.feature.max()} of an input with {x.shape[1]} features")
    idx_t = np.int32 if forest.mode.size < 2**31 else index_dtype()
    feature = jnp.asarray(forest.feature, idx_t)
    dtype = canonical(jnp.promote_types(x.dtype, forest.threshold.dtype))
    x = x.astype(dtype)
    threshold = jnp.asarray(forest.threshold, dtype)
    mode = jnp.asarray(forest.mode)
    missing = jnp.asarray(forest.missing_true)
    true_next = jnp.asarray(forest.true_next, idx_t)
    false_next = jnp.asarray(forest.false_next, idx_t)
    members = None if forest.members is None else jnp.asarray(forest.members, dtype)
    codes = sorted(set(forest.mode.tolist()) - {_LEAF})
    idx = jnp.broadcast_to(jnp.asarray(forest.roots, idx_t), (n, forest.roots.size))
    if x.shape[1] == 0 or not codes:
        return idx

    def step(_, idx):
        v = jnp.take_along_axis(x, feature[idx], axis=1)
        th = threshold[idx]
        mem = None if members is None else members[idx]
        if len(codes) == 1:
            go = _compare(codes[0], v, th, mem)
        else:
            m = mode[idx]
            go = jnp.zeros(v.shape, bool)
            for code in codes:
                go = jnp.where(m == code, _compare(code, v, th, mem), go)
        go = jnp.where(jnp.isnan(v), missing[idx], go)
        return jnp.where(go, true_next[idx], false_next[idx])

    return lax.fori_loop(0, forest.depth, step, idx)


def _aggregate(forest: _Forest, leaves, how: str, dtype, ctx):
    """Sum/average/min/max the leaves' votes over trees: ``[N, trees] -> [N, targets]``."""
    n_trees = forest.roots.size
    if how in ("SUM", "AVERAGE"):
        w = jnp.asarray(forest.weights, dtype)[leaves]
        out = jnp.sum(w, axis=1)
        return out / n_trees if how == "AVERAGE" else out
    if how == "MIN":
        picked = jnp.min(jnp.asarray(forest.low, dtype)[leaves], axis=1)
        return jnp.minimum(picked, jnp.finfo(dtype).max)
    if how == "MAX":
        picked = jnp.max(jnp.asarray(forest.high, dtype)[leaves], axis=1)
        return jnp.maximum(picked, jnp.finfo(dtype).min)
    raise ctx.error(f"aggregate_function must be SUM, AVERAGE, MIN or MAX, got {how!r}")


@register("TreeEnsembleRegressor", since=(1, 3, 5), domain=_ML)
def tree_ensemble_regressor(inputs, attrs, ctx):
    """ONNX-ML ``TreeEnsembleRegressor``-1/3/5 (3 adds the ``*_as_tensor`` attributes).

    Aggregates in the threshold's precision, adds ``base_values``, applies post_transform, and
    returns float as the spec says. MIN/MAX leave targets without votes at float's max/min.
    """
    x = _as_2d(_float_input(inputs[0]), ctx)
    n_targets = attrs["n_targets"]
    if n_targets is None:
        raise ctx.error("n_targets must be set")
    try:
        forest = _legacy_forest(attrs, "target", n_targets, ctx)
        leaves = _walk(forest, x)
    except ValueError as e:
        raise ctx.error(str(e)) from None
    dtype = canonical(jnp.promote_types(x.dtype, forest.threshold.dtype))
    out = _aggregate(forest, leaves, attrs["aggregate_function"], dtype, ctx)
    base = _tensor_attr(attrs, "base_values")
    if base is not None and base.size:
        out = out + jnp.asarray(base, dtype)
    return (_post_transform(out, attrs["post_transform"], ctx).astype(np.float32),)


@register("TreeEnsembleClassifier", since=(1, 3, 5), domain=_ML, static_inputs=_string_labels_static,
          host=_string_labels_static)
def tree_ensemble_classifier(inputs, attrs, ctx):
    """ONNX-ML ``TreeEnsembleClassifier``-1/3/5 (3 adds the ``*_as_tensor`` attributes).

    Scores are ``base_values`` plus the summed votes. When every vote goes to one class (the
    binary case), the second column is that score and the first ``1 - score`` (``-score``
    before LOGISTIC/SOFTMAX/SOFTMAX_ZERO), as the onnx reference computes.
    """
    x = _as_2d(_float_input(inputs[0]), ctx)
    ints, strings = attrs["classlabels_int64s"], attrs["classlabels_strings"]
    n_classes = len(ints or strings or ())
    if not n_classes:
        raise ctx.error("one of classlabels_int64s or classlabels_strings must be set")
    class_ids = attrs["class_ids"] or ()
    try:
        forest = _legacy_forest(attrs, "class", max(n_classes, 1), ctx)
        leaves = _walk(forest, x)
    except ValueError as e:
        raise ctx.error(str(e)) from None
    scores = _aggregate(forest, leaves, "SUM", np.float32, ctx)
    base = _tensor_attr(attrs, "base_values")
    if base is not None and base.size:
        scores = scores + jnp.asarray(base.reshape(1, -1), np.float32)
    post = attrs["post_transform"]
    if len(set(class_ids)) == 1:
        # As the onnx reference does: the first column is the positive score, whichever class
        # the votes name.
        positive = scores[:, :1]
        negative = 1 - positive if post in ("NONE", "PROBIT") else -positive
        scores = jnp.concatenate([negative, positive, scores[:, 2:]], axis=1)
    scores = _post_transform(scores, post, ctx).astype(np.float32)
    index = jnp.argmax(scores, axis=1)
    if ints and len(ints) == 1:
        if ints[0] != 1:
            raise ctx.error("a single int64 class label must be 1 (binary classifier)")
        return jnp.where(index == 1, 1, 0).astype(index_dtype()), scores
    if strings and len(strings) == 1:
        _need_concrete(inputs[0], ctx, "TreeEnsembleClassifier with one string label")
        return _strings(np.where(np.asarray(index) == 1, strings[0], "")), scores
    return _labels(index, ints, strings, ctx, inputs[0]), scores


@register("TreeEnsemble", since=5, domain=_ML)
def tree_ensemble(inputs, attrs, ctx):
    """ONNX-ML ``TreeEnsemble``-5: the unified tree ensemble (set membership nodes included).

    ``post_transform`` is applied as the spec says (the onnx reference ignores it). A NaN
    feature follows ``nodes_missing_value_tracks_true`` for every mode, BRANCH_NEQ included.
    """
    (x,) = inputs
    x = _as_2d(jnp.asarray(x), ctx)
    try:
        forest = _forest_v5(attrs, ctx)
        leaves = _walk(forest, x)
    except ValueError as e:
        raise ctx.error(str(e)) from None
    how = {0: "AVERAGE", 1: "SUM", 2: "MIN", 3: "MAX"}.get(attrs["aggregate_function"])
    if how is None:
        raise ctx.error(f"aggregate_function must be 0..3, got {attrs['aggregate_function']}")
    out = _aggregate(forest, leaves, how, x.dtype, ctx)
    post = {0: "NONE", 1: "SOFTMAX", 2: "LOGISTIC", 3: "SOFTMAX_ZERO", 4: "PROBIT"}.get(attrs["post_transform"])
    if post is None:
        raise ctx.error(f"post_transform must be 0..4, got {attrs['post_transform']}")
    return (_post_transform(out, post, ctx).astype(x.dtype),)


# -- ZipMap ---------------------------------------------------------------------------------------


@register("ZipMap", since=1, domain=_ML, host=True)
def zip_map(inputs, attrs, ctx):
    """ONNX-ML ``ZipMap``-1: a list with one dict ``{label: score}`` per row of ``X``.

    Keys are ``str`` or ``int``. A concrete ``X`` (``Model.__call__`` runs ZipMap on the host)
    gives Python floats, as onnxruntime does, in time linear in the rows; a traced one gives
    0-d jax arrays (the list of dicts is a pytree that ``jit`` can return, unrolled per row).
    """
    x = _as_2d(inputs[0], ctx)
    keys = list(attrs["classlabels_strings"] or ()) or [int(k) for k in attrs["classlabels_int64s"] or ()]
    if not keys or (attrs["classlabels_strings"] and attrs["classlabels_int64s"]):
        raise ctx.error("exactly one of classlabels_strings or classlabels_int64s must be set")
    if x.shape[1] != len(keys):
        raise ctx.error(f"X has {x.shape[1]} columns for {len(keys)} labels")
    if is_concrete(x):
        return ([dict(zip(keys, row)) for row in np.asarray(x, np.float32).tolist()],)
    return ([{k: x[i, j] for j, k in enumerate(keys)} for i in range(x.shape[0])],)


# -- label and category maps ----------------------------------------------------------------------

_DEFAULTS = {"int": -1, "float": -0.0, "string": "_Unused"}


def _kind(dtype) -> str:
    dtype = np.dtype(dtype)
    return "string" if dtype.kind in "OUS" else "float" if dtype.kind == "f" else "int"


def _map_values(x, keys, values, default, out_dtype, ctx):
    """Look every element of ``x`` up in ``keys`` (the last repeat wins; NaN matches NaN).

    Numeric keys and values run in jnp (sorted keys, ``searchsorted``), so a traced input works;
    strings on either side need a concrete input and run on the host.
    """
    keys = np.asarray(keys).reshape(-1)
    values = np.asarray(values).reshape(-1)
    if keys.size != values.size:
        raise ctx.error(f"{keys.size} keys but {values.size} values")
    in_string = _is_string(x) or _kind(keys.dtype) == "string"
    if in_string != (_kind(keys.dtype) == "string") or in_string and not _is_string(x):
        raise ctx.error(f"input of dtype {np.asarray(x).dtype if is_concrete(x) else x.dtype} "
                        f"does not match keys of type {_kind(keys.dtype)}")
    if in_string or out_dtype == object:
        _need_concrete(x, ctx, "a lookup with string keys or values")
        xs = _strings(x) if in_string else np.asarray(x)
        if in_string:
            table = dict(zip(_strings(keys).tolist(), values.tolist()))
            found = [table.get(v, default) for v in xs.reshape(-1).tolist()]
        else:
            keys = keys.astype(xs.dtype)
            table = dict(zip(keys.tolist(), values.tolist()))
            nan_value = next((v for k, v in reversed(list(zip(keys.tolist(), values.tolist())))
                              if isinstance(k, float) and math.isnan(k)), default)
            found = [nan_value if isinstance(v, float) and math.isnan(v) else table.get(v, default)
                     for v in xs.reshape(-1).tolist()]
        out = np.empty(len(found), object) if out_dtype == object else np.asarray(found, out_dtype)
        if out_dtype == object:
            out[:] = [str(v) for v in found]
        return out.reshape(np.shape(x))
    x = jnp.asarray(x)
    keys = keys.astype(np.dtype(x.dtype))
    nan_keys = np.isnan(keys) if keys.dtype.kind == "f" else np.zeros(keys.size, bool)
    table = dict(zip(keys[~nan_keys].tolist(), values[~nan_keys].tolist()))
    out_values = jnp.asarray(np.asarray(list(table.values()) + [default], dtype=out_dtype), out_dtype)
    sorted_keys = np.asarray(list(table), keys.dtype)
    order = np.argsort(sorted_keys, kind="stable")
    sorted_keys = sorted_keys[order]
    slot = order if sorted_keys.size else np.zeros(0, np.int64)
    if sorted_keys.size:
        pos = jnp.clip(jnp.searchsorted(jnp.asarray(sorted_keys), x), 0, sorted_keys.size - 1)
        hit = jnp.asarray(sorted_keys)[pos] == x
        picked = jnp.where(hit, jnp.asarray(slot)[pos], len(table))
    else:
        picked = jnp.full(x.shape, len(table))
    out = out_values[picked]
    if nan_keys.any():
        out = jnp.where(jnp.isnan(x), jnp.asarray(values[nan_keys][-1], out_dtype), out)
    return out


def _out_dtype(kind: str):
    return object if kind == "string" else canonical(np.int64) if kind == "int" else np.dtype(np.float32)


def _label_encoder_static(attrs):
    strings = attrs.get("classes_strings") is not None  # opset 1 always maps strings
    for name in ("keys_strings", "values_strings"):
        strings |= bool(attrs.get(name))
    for name in ("keys_tensor", "values_tensor"):
        t = attrs.get(name)
        strings |= t is not None and np.asarray(t).dtype.kind in "OUS"
    return (0,) if strings else ()


@register("LabelEncoder", since=1, domain=_ML, static_inputs=_label_encoder_static, host=_label_encoder_static)
def label_encoder_1(inputs, attrs, ctx):
    """ONNX-ML ``LabelEncoder``-1: strings -> their index in ``classes_strings`` (else
    ``default_int64``), or integers -> ``classes_strings[i]`` (else ``default_string``).
    """
    (x,) = inputs
    classes = list(attrs["classes_strings"] or ())
    if _is_string(x):
        return (_map_values(x, np.asarray(classes, object), np.arange(len(classes)),
                            attrs["default_int64"], canonical(np.int64), ctx),)
    return (_map_values(x, np.arange(len(classes)), np.asarray(classes, object),
                        attrs["default_string"], object, ctx),)


def _pick(attrs, side: str):
    """The one set ``keys_*``/``values_*`` attribute: ``(array, kind)``."""
    found = []
    for kind, name in (("float", f"{side}_floats"), ("int", f"{side}_int64s"), ("string", f"{side}_strings")):
        if attrs.get(name):
            arr = np.asarray(attrs[name], {"float": np.float32, "int": np.int64, "string": object}[kind])
            found.append((arr, kind))
    tensor = attrs.get(f"{side}_tensor")
    if tensor is not None:
        tensor = np.asarray(tensor)
        found.append((_strings(tensor) if tensor.dtype.kind in "OUS" else tensor, _kind(tensor.dtype)))
    return found


@register("LabelEncoder", since=(2, 4), domain=_ML, static_inputs=_label_encoder_static, host=_label_encoder_static)
def label_encoder(inputs, attrs, ctx):
    """ONNX-ML ``LabelEncoder``-2/4: map keys to values (4 adds ``keys_tensor``/``values_tensor``
    and ``default_tensor``, and more types). The last of repeated keys wins; NaN matches NaN.
    """
    (x,) = inputs
    keys, values = _pick(attrs, "keys"), _pick(attrs, "values")
    if len(keys) != 1 or len(values) != 1:
        raise ctx.error("exactly one keys_* and one values_* attribute must be set")
    (keys, _), (values, kind) = keys[0], values[0]
    default_tensor = attrs.get("default_tensor")
    if attrs.get("values_tensor") is not None:
        out_dtype = object if kind == "string" else canonical(values.dtype)
        if default_tensor is not None:
            default = np.asarray(default_tensor).reshape(-1)[0]
            default = _strings([default])[0] if kind == "string" else default.item()
        else:
            default = _DEFAULTS[kind]
    else:
        out_dtype = _out_dtype(kind)
        default = attrs[f"default_{ {'int': 'int64', 'float': 'float', 'string': 'string'}[kind]}"]
    return (_map_values(x, keys, values, default, out_dtype, ctx),)


@register("CategoryMapper", since=1, domain=_ML, static_inputs=(0,), host=True)
def category_mapper(inputs, attrs, ctx):
    """ONNX-ML ``CategoryMapper``-1: strings <-> int64 through ``cats_strings``/``cats_int64s``."""
    (x,) = inputs
    strings = np.asarray(attrs["cats_strings"] or (), object)
    ints = np.asarray(attrs["cats_int64s"] or (), np.int64)
    if strings.size != ints.size:
        raise ctx.error(f"cats_strings has {strings.size} entries and cats_int64s {ints.size}")
    if _is_string(x):
        return (_map_values(x, strings, ints, attrs["default_int64"], canonical(np.int64), ctx),)
    return (_map_values(x, ints, strings, attrs["default_string"], object, ctx),)


# -- maps -----------------------------------------------------------------------------------------


def _stack(values, ctx):
    """Map values (Python scalars, numpy or jax 0-d arrays) as one 1-D array."""
    if any(isinstance(v, (str, bytes)) or (is_concrete(v) and np.asarray(v).dtype.kind in "OUS")
           for v in values):
        return _strings(np.asarray([np.asarray(v).item() if is_concrete(v) else v for v in values], object))
    if all(is_concrete(v) or isinstance(v, (int, float)) for v in values):
        return np.asarray(values)
    return jnp.stack([jnp.asarray(v) for v in values])


def _dict_row(d, vocabulary, ctx):
    if not isinstance(d, dict):
        raise ctx.error(f"X must be a map (dict) or a sequence of maps, got {type(d).__name__}")
    index = {k: i for i, k in enumerate(vocabulary)}
    unknown = [k for k in d if index.get(_key(k)) is None]
    if unknown:
        raise ctx.error(f"map keys {unknown[:5]} are not in the vocabulary")
    return {index[_key(k)]: v for k, v in d.items()}


def _key(k):
    if isinstance(k, bytes):
        return k.decode("utf-8", errors="surrogateescape")
    if isinstance(k, (np.generic, np.ndarray)):
        return np.asarray(k).item()
    return k


@register("DictVectorizer", since=1, domain=_ML)
def dict_vectorizer(inputs, attrs, ctx):
    """ONNX-ML ``DictVectorizer``-1: a map -> a ``[1, V]`` tensor over the vocabulary (keys not in
    the map are 0, or "" for string values), as onnxruntime shapes it; a list of maps gives
    ``[len, V]``. Map values may be traced scalars.
    """
    (x,) = inputs
    vocabulary = list(attrs["string_vocabulary"] or ()) or list(attrs["int64_vocabulary"] or ())
    if not vocabulary:
        raise ctx.error("one of string_vocabulary or int64_vocabulary must be set")
    rows = x if isinstance(x, (list, tuple)) else [x]
    cells = [_dict_row(r, vocabulary, ctx) for r in rows]
    values = [v for row in cells for v in row.values()]
    if not values:
        return (np.zeros((len(rows), len(vocabulary)), np.float32),)
    flat = _stack(values, ctx)
    if isinstance(flat, np.ndarray) and flat.dtype == object:
        out = np.full((len(rows), len(vocabulary)), "", object)
        k = 0
        for i, row in enumerate(cells):
            for j in row:
                out[i, j] = flat[k]
                k += 1
        return (out,)
    flat = jnp.asarray(flat)
    if flat.dtype == np.float64 and all(not isinstance(v, jax.Array) for v in values):
        flat = flat if jax.config.jax_enable_x64 else flat.astype(np.float32)
    r = np.array([i for i, row in enumerate(cells) for _ in row])
    c = np.array([j for row in cells for j in row])
    out = jnp.zeros((len(rows), len(vocabulary)), flat.dtype).at[r, c].set(flat)
    return (out,)


@register("CastMap", since=1, domain=_ML)
def cast_map(inputs, attrs, ctx):
    """ONNX-ML ``CastMap``-1: an int64-keyed map -> a ``[1, n]`` tensor ordered by key.

    DENSE keeps every value in key order; SPARSE writes value ``k`` at column ``k`` of
    ``max_map`` columns (missing keys 0, or "" for strings). Strings cast to float/int64 with
    Python's ``float``; numbers to strings with ``str``.
    """
    (x,) = inputs
    if not isinstance(x, dict):
        raise ctx.error(f"X must be a map (dict), got {type(x).__name__}")
    items = sorted((int(_key(k)), v) for k, v in x.items())
    cast_to, form = attrs["cast_to"], attrs["map_form"]
    if cast_to not in ("TO_FLOAT", "TO_STRING", "TO_INT64"):
        raise ctx.error(f"cast_to must be TO_FLOAT, TO_STRING or TO_INT64, got {cast_to!r}")
    if form == "DENSE":
        width, columns = len(items), list(range(len(items)))
    elif form == "SPARSE":
        width, columns = attrs["max_map"], [k for k, _ in items]
        if any(not 0 <= k < width for k in columns):
            raise ctx.error(f"SPARSE map keys must lie in [0, max_map={width})")
    else:
        raise ctx.error(f"map_form must be DENSE or SPARSE, got {form!r}")
    values = [v for _, v in items]
    if cast_to == "TO_STRING":
        out = np.full((1, width), "", object)
        for j, v in zip(columns, values):
            out[0, j] = _strings([_key(v)])[0] if is_concrete(v) or isinstance(v, (str, bytes)) else str(v)
        return (out,)
    dtype = np.float32 if cast_to == "TO_FLOAT" else canonical(np.int64)
    converted = []
    for v in values:
        v = _key(v) if is_concrete(v) or isinstance(v, (str, bytes)) else v
        if isinstance(v, str):
            v = float(v)
        converted.append(jnp.asarray(v).astype(dtype) if isinstance(v, jax.Array) else dtype(v) if cast_to == "TO_FLOAT" else int(v))
    if not converted:
        return (np.zeros((1, width), dtype),)
    stacked = jnp.stack([jnp.asarray(v, dtype) for v in converted])
    return (jnp.zeros((1, width), dtype).at[0, np.asarray(columns)].set(stacked),)

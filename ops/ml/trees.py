"""ai.onnx.ml tree ensembles, and ZipMap, which turns their scores into dicts."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jonnx._registry import Attrs, Inputs, OpContext, Outputs, register
from jonnx._values import is_concrete
from jonnx.ops._util import as_strings, canonical, index_dtype
from jonnx.ops.ml._common import (
    ML,
    as_2d,
    class_labels,
    float_features,
    need_concrete,
    post_transform,
    post_transform_fn,
    string_labels_static,
    tensor_attr,
)

# -- tree ensembles -------------------------------------------------------------------------------

_MODES = {
    "BRANCH_LEQ": 0,
    "BRANCH_LT": 1,
    "BRANCH_GTE": 2,
    "BRANCH_GT": 3,
    "BRANCH_EQ": 4,
    "BRANCH_NEQ": 5,
    "BRANCH_MEMBER": 6,
    "LEAF": 7,
}
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
    threshold = tensor_attr(attrs, "nodes_values", (0.0,) * n)
    missing = np.zeros(n, bool)
    if attrs["nodes_missing_value_tracks_true"]:
        missing[:] = np.asarray(attrs["nodes_missing_value_tracks_true"]) != 0
    vote_trees, vote_nodes = attrs[f"{prefix}_treeids"] or (), attrs[f"{prefix}_nodeids"] or ()
    vote_targets = attrs[f"{prefix}_ids"] or ()
    vote_weights = tensor_attr(attrs, f"{prefix}_weights", (), np.float64)
    try:
        vote_nodes = [where[t, i] for t, i in zip(vote_trees, vote_nodes)]
    except KeyError as e:
        raise ctx.error(f"a vote names node {e.args[0][1]} of tree {e.args[0][0]}, which does not exist") from None
    weights, low, high = _votes(n, n_targets, vote_nodes, vote_targets, vote_weights, ctx)
    return _Forest(
        feature=np.asarray(attrs["nodes_featureids"], np.int64),
        threshold=threshold,
        mode=mode,
        missing_true=missing,
        true_next=true_next,
        false_next=false_next,
        members=None,
        roots=roots,
        depth=_depth(true_next, false_next, mode, roots),
        weights=weights,
        low=low,
        high=high,
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
        degenerate = (
            attrs["nodes_trueleafs"][r]
            and attrs["nodes_falseleafs"][r]
            and attrs["nodes_truenodeids"][r] == attrs["nodes_falsenodeids"][r]
        )
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
        threshold=threshold,
        mode=mode,
        missing_true=missing,
        true_next=true_next,
        false_next=false_next,
        members=members,
        roots=roots,
        depth=_depth(true_next, false_next, mode, roots),
        weights=weights,
        low=low,
        high=high,
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
    dtype = canonical(jnp.promote_types(x.dtype, forest.threshold.dtype))
    codes = tuple(sorted(set(forest.mode.tolist()) - {_LEAF}))
    roots = forest.roots.astype(idx_t)
    if x.shape[1] == 0 or not codes:
        return jnp.broadcast_to(jnp.asarray(roots), (n, roots.size))
    tables = (
        forest.feature.astype(idx_t),
        forest.threshold.astype(dtype),
        forest.mode,
        forest.missing_true,
        forest.true_next.astype(idx_t),
        forest.false_next.astype(idx_t),
        None if forest.members is None else forest.members.astype(dtype),
    )
    return _descend(x.astype(dtype), roots, tables, depth=forest.depth, codes=codes)


# Compiled once per shape: a classifier with string labels runs on the host, op by op, and
# there a loop traced afresh on each call compiled on each call too (skl2onnx's gradient-boosting
# classifier took 73 ms a call; 1.2 with this, 0.46 with _class_scores too).
@functools.partial(jax.jit, static_argnames=("depth", "codes"))
def _descend(x, roots, tables, *, depth: int, codes: tuple[int, ...]) -> jax.Array:
    feature, threshold, mode, missing, true_next, false_next, members = tables
    idx = jnp.broadcast_to(roots, (x.shape[0], roots.size))

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

    return lax.fori_loop(0, depth, step, idx)


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


@register("TreeEnsembleRegressor", since=(1, 3, 5), domain=ML)
def tree_ensemble_regressor(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX-ML ``TreeEnsembleRegressor``-1/3/5 (3 adds the ``*_as_tensor`` attributes).

    Aggregates in the threshold's precision, adds ``base_values``, applies post_transform, and
    returns float as the spec says. MIN/MAX leave targets without votes at float's max/min.
    """
    x = as_2d(float_features(inputs[0]), ctx)
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
    base = tensor_attr(attrs, "base_values")
    if base is not None and base.size:
        out = out + jnp.asarray(base, dtype)
    return (post_transform(out, attrs["post_transform"], ctx).astype(np.float32),)


@register(
    "TreeEnsembleClassifier", since=(1, 3, 5), domain=ML, static_inputs=string_labels_static, host=string_labels_static
)
def tree_ensemble_classifier(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX-ML ``TreeEnsembleClassifier``-1/3/5 (3 adds the ``*_as_tensor`` attributes).

    Scores are ``base_values`` plus the summed votes. When every vote goes to one class (the
    binary case), the second column is that score and the first ``1 - score`` (``-score``
    before LOGISTIC/SOFTMAX/SOFTMAX_ZERO), as the onnx reference computes.
    """
    x = as_2d(float_features(inputs[0]), ctx)
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
    base = tensor_attr(attrs, "base_values")
    base = None if base is None or not base.size else base.reshape(1, -1).astype(np.float32)
    post = attrs["post_transform"]
    # One class named by every vote: the binary form (its first column below).
    binary = None if len(set(class_ids)) != 1 else "complement" if post in ("NONE", "PROBIT") else "negate"
    weights = forest.weights.astype(np.float32)
    scores, index = _class_scores(leaves, weights, base, post=post_transform_fn(post, ctx), binary=binary)
    if ints and len(ints) == 1:
        if ints[0] != 1:
            raise ctx.error("a single int64 class label must be 1 (binary classifier)")
        return jnp.where(index == 1, 1, 0).astype(index_dtype()), scores
    if strings and len(strings) == 1:
        need_concrete(inputs[0], ctx, "TreeEnsembleClassifier with one string label")
        return as_strings(np.where(np.asarray(index) == 1, strings[0], "")), scores
    return class_labels(index, ints, strings, ctx, inputs[0]), scores


# One compiled function, as _descend: on the host (string labels) op by op these steps took 1 ms.
@functools.partial(jax.jit, static_argnames=("post", "binary"))
def _class_scores(leaves, weights, base, *, post, binary: str | None) -> tuple[jax.Array, jax.Array]:
    """The classifier's scores (summed votes plus ``base``, post-transformed) and top class."""
    scores = jnp.sum(weights[leaves], axis=1)
    if base is not None:
        scores = scores + base
    if binary is not None:
        # As the onnx reference does: the first column is the positive score, whichever class
        # the votes name.
        positive = scores[:, :1]
        negative = 1 - positive if binary == "complement" else -positive
        scores = jnp.concatenate([negative, positive, scores[:, 2:]], axis=1)
    scores = post(scores).astype(np.float32)
    return scores, jnp.argmax(scores, axis=1)


@register("TreeEnsemble", since=5, domain=ML)
def tree_ensemble(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX-ML ``TreeEnsemble``-5: the unified tree ensemble (set membership nodes included).

    ``post_transform`` is applied as the spec says (the onnx reference ignores it). A NaN
    feature follows ``nodes_missing_value_tracks_true`` for every mode, BRANCH_NEQ included.
    """
    (x,) = inputs
    x = as_2d(jnp.asarray(x), ctx)
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
    return (post_transform(out, post, ctx).astype(x.dtype),)


# -- ZipMap ---------------------------------------------------------------------------------------


@register("ZipMap", since=1, domain=ML, host=True)
def zip_map(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX-ML ``ZipMap``-1: a list with one dict ``{label: score}`` per row of ``X``.

    Keys are ``str`` or ``int``. A concrete ``X`` (``Model.__call__`` runs ZipMap on the host)
    gives Python floats, as onnxruntime does, in time linear in the rows; a traced one gives
    0-d jax arrays (the list of dicts is a pytree that ``jit`` can return, unrolled per row).
    """
    x = as_2d(inputs[0], ctx)
    keys = list(attrs["classlabels_strings"] or ()) or [int(k) for k in attrs["classlabels_int64s"] or ()]
    if not keys or (attrs["classlabels_strings"] and attrs["classlabels_int64s"]):
        raise ctx.error("exactly one of classlabels_strings or classlabels_int64s must be set")
    if x.shape[1] != len(keys):
        raise ctx.error(f"X has {x.shape[1]} columns for {len(keys)} labels")
    if is_concrete(x):
        return ([dict(zip(keys, row)) for row in np.asarray(x, np.float32).tolist()],)
    return ([{k: x[i, j] for j, k in enumerate(keys)} for i in range(x.shape[0])],)

"""The ai.onnx.ml domain against the ReferenceEvaluator, onnxruntime, or numpy."""

from __future__ import annotations

import types

import jax
import numpy as np
import onnx
import onnx.helper as oh
import onnxruntime as ort
import pytest
from jax.test_util import check_grads

import jonnx
from jonnx import errors
from tests.ops._harness import (
    node_model,
    run_jonnx,
    run_reference,
)

ML = "ai.onnx.ml"
RNG = np.random.default_rng(0)


def _strs(*values):
    out = np.empty(len(values), object)
    out[:] = values
    return out


def run_ort(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


# The harness's assert_matches_reference does not take a domain: wrap node_model for it.
def assert_ml(op, inputs, n_outputs=1, *, opset=1, expected=None, rtol=1e-5, atol=1e-6, initializers=(), **attrs):
    model = node_model(op, inputs, n_outputs, opset=opset, domain=ML, initializers=initializers, **attrs)
    want = run_reference(model, inputs) if expected is None else expected
    for jit in (True, False):
        got = run_jonnx(model, inputs, jit=jit)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            w = np.asarray(w)
            if w.dtype.kind in "OUS":
                assert g.dtype == object
                np.testing.assert_array_equal(g.astype(str), w.astype(str))
            else:
                assert g.shape == w.shape, (g.shape, w.shape)
                np.testing.assert_allclose(g, w.astype(g.dtype) if w.dtype != g.dtype else w, rtol=rtol, atol=atol)
    return got


def ml_grads(op, x, **attrs):
    """check_grads (forward and reverse, float64) of output 0 with respect to ``x``."""
    with jax.enable_x64(True):
        x64 = np.asarray(x, np.float64)
        m = jonnx.load(node_model(op, {"x": x64}, opset=1, domain=ML, **attrs))
        check_grads(
            jax.jit(lambda v: m.apply(m.params, v)[0]),  # eagerly, every primitive compiles alone
            (jax.numpy.asarray(x64),),
            order=1,
            modes=("fwd", "rev"),
            eps=1e-4,
            rtol=1e-3,
            atol=1e-3,
        )


# -- simple numeric ops -------------------------------------------------------------------------


@pytest.mark.parametrize("shape,indices", [((3, 5), [0, 3, 3]), ((2, 3, 4), [[1, 2]]), ((6,), [5, 0])])
def test_array_feature_extractor(shape, indices):
    x = RNG.standard_normal(shape).astype(np.float32)
    assert_ml("ArrayFeatureExtractor", {"x": x, "y": np.asarray(indices, np.int64)})


def test_array_feature_extractor_strings_and_range():
    x = np.array([["a", "b", "c"], ["d", "e", "f"]], object)
    # Indices into strings must be concrete (here an initializer).
    assert_ml(
        "ArrayFeatureExtractor",
        {"x": x, "y": np.array([2, 0], np.int64)},
        initializers=["y"],
        expected=[np.array([["c", "a"], ["f", "d"]], object)],
    )
    model = node_model(
        "ArrayFeatureExtractor",
        {"x": np.ones((2, 3), np.float32), "y": np.array([3], np.int64)},
        opset=1,
        domain=ML,
        initializers=["y"],
    )
    with pytest.raises(errors.NodeError, match="out of range"):
        run_jonnx(model, {"x": np.ones((2, 3), np.float32), "y": np.array([3], np.int64)})


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_binarizer(dtype):
    x = (RNG.standard_normal((4, 3)) * 3).astype(dtype)
    assert_ml("Binarizer", {"x": x}, threshold=0.5)


@pytest.mark.parametrize("offset,scale", [([0.5], [2.0]), ([1.0, -1.0, 0.0], [0.5, 2.0, 3.0])])
def test_scaler(offset, scale):
    x = RNG.standard_normal((5, 3)).astype(np.float32)
    assert_ml("Scaler", {"x": x}, offset=offset, scale=scale)
    ml_grads("Scaler", x, offset=offset, scale=scale)


@pytest.mark.parametrize("norm", ["MAX", "L1", "L2"])
def test_normalizer(norm):
    x = RNG.standard_normal((4, 3)).astype(np.float32)
    assert_ml("Normalizer", {"x": x}, norm=norm)
    if norm != "MAX":
        ml_grads("Normalizer", x, norm=norm)


def test_imputer_float_nan_and_int():
    x = np.array([[1.0, np.nan, 3.0], [np.nan, 5.0, np.nan]], np.float32)
    assert_ml("Imputer", {"x": x}, imputed_value_floats=[9.0, 8.0, 7.0], replaced_value_float=float("nan"))
    xi = np.array([[1, -1, 3], [-1, 5, 6]], np.int64)
    assert_ml("Imputer", {"x": xi}, imputed_value_int64s=[0], replaced_value_int64=-1)


def test_feature_vectorizer():
    a = RNG.standard_normal((3, 2)).astype(np.float32)
    b = RNG.standard_normal((3, 4)).astype(np.float32)
    assert_ml(
        "FeatureVectorizer",
        {"a": a, "b": b},
        inputdimensions=[3, 2],
        expected=[np.concatenate([a, np.zeros((3, 1), np.float32), b[:, :2]], axis=1)],
    )


def test_feature_vectorizer_reads_a_vector_as_one_row():
    # The specification: "1-D tensors are treated as [1,C]" (onnxruntime agrees; the onnx
    # reference reads a column). Integers become float32.
    a = np.array([4, -1, 2], np.int64)
    b = np.array([[7, 8]], np.int64)
    model = node_model("FeatureVectorizer", {"a": a, "b": b}, opset=1, domain=ML, inputdimensions=[4, 1])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (want,) = session.run(None, {"a": a, "b": b})
    np.testing.assert_array_equal(want, [[4.0, -1.0, 2.0, 0.0, 7.0]])
    (got,) = run_jonnx(model, {"a": a, "b": b})
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)
    tall = np.ones((3, 2), np.int64)
    mixed = node_model("FeatureVectorizer", {"a": a, "t": tall}, opset=1, domain=ML, inputdimensions=[3, 2])
    with pytest.raises(errors.NodeError, match=r"different numbers of rows \[1, 3\]"):
        run_jonnx(mixed, {"a": a, "t": tall})


@pytest.mark.parametrize(
    "x,attrs",
    [
        (np.array([[1, 3], [2, 7]], np.int64), {"cats_int64s": [1, 2, 3]}),
        (np.array([1.0, 2.0, 5.0], np.float32), {"cats_int64s": [5, 1]}),
        (_strs("a", "c", "b"), {"cats_strings": ["a", "b", "x"]}),
    ],
)
def test_one_hot_encoder(x, attrs):
    assert_ml("OneHotEncoder", {"x": x}, **attrs)


def test_one_hot_encoder_zeros_0_rejects_unknown():
    x = np.array([1, 9], np.int64)
    model = node_model("OneHotEncoder", {"x": x}, opset=1, domain=ML, cats_int64s=[1, 2], zeros=0, initializers=["x"])
    with pytest.raises(errors.NodeError, match="not among the categories"):
        run_jonnx(model, {"x": x})


# -- linear models ----------------------------------------------------------------------------


@pytest.mark.parametrize("targets", [1, 2])
def test_linear_regressor_and_grads(targets):
    x = RNG.standard_normal((4, 3)).astype(np.float32)
    coef = RNG.standard_normal(3 * targets).tolist()
    icpt = RNG.standard_normal(targets).tolist()
    assert_ml("LinearRegressor", {"x": x}, coefficients=coef, intercepts=icpt, targets=targets)
    ml_grads("LinearRegressor", x, coefficients=coef, intercepts=icpt, targets=targets)
    with jax.enable_x64(True):
        m = jonnx.load(
            node_model(
                "LinearRegressor",
                {"x": x.astype(np.float64)},
                opset=1,
                domain=ML,
                coefficients=coef,
                intercepts=icpt,
                targets=targets,
            )
        )
        g = jax.grad(lambda v: m.apply(m.params, v)[0].sum())(jax.numpy.asarray(x))
    np.testing.assert_allclose(g, np.tile(np.asarray(coef).reshape(targets, 3).sum(0), (4, 1)), rtol=1e-5)


@pytest.mark.parametrize("post", ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO", "PROBIT"])
@pytest.mark.parametrize("labels", [{"classlabels_ints": [3, 5, 7]}, {"classlabels_strings": ["a", "b", "c"]}])
def test_linear_classifier_multiclass(post, labels):
    x = RNG.standard_normal((5, 2)).astype(np.float32)
    if post == "PROBIT":
        x = x * 0.1  # PROBIT wants scores in (0, 1)
    coef = (RNG.standard_normal(6) * (0.2 if post == "PROBIT" else 1)).tolist()
    icpt = [0.3, 0.5, 0.4] if post == "PROBIT" else RNG.standard_normal(3).tolist()
    # PROBIT: the reference evaluates its erfinv approximation in float64, jonnx in float32.
    assert_ml(
        "LinearClassifier",
        {"x": x},
        2,
        coefficients=coef,
        intercepts=icpt,
        post_transform=post,
        rtol=1e-4,
        atol=1e-4 if post == "PROBIT" else 1e-5,
        **labels,
    )


def test_probit_is_infinite_at_scores_zero_and_one_like_onnxruntime():
    # erfinv(-1) and erfinv(1) are -inf and +inf; onnxruntime returns them (the onnx reference
    # returns 0 there, so onnxruntime is the reference here).
    x = np.array([[0.0], [1.0], [0.5], [0.25], [0.9]], np.float32)
    model = node_model(
        "LinearRegressor", {"x": x}, opset=1, domain=ML, coefficients=[1.0], intercepts=[0.0], post_transform="PROBIT"
    )
    (want,) = run_ort(model, {"x": x})
    assert np.isneginf(want[0, 0]) and np.isposinf(want[1, 0])
    for jit in (True, False):
        (got,) = run_jonnx(model, {"x": x}, jit=jit)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_ml_ops_by_name_resolve_their_domain():
    x = RNG.standard_normal((3, 2)).astype(np.float32)
    got = jonnx.ops.LinearRegressor(x, coefficients=[2.0, -1.0], intercepts=[0.5])
    np.testing.assert_allclose(got, x @ np.array([[2.0], [-1.0]], np.float32) + 0.5, rtol=1e-6)


def test_linear_classifier_binary_one_row():
    x = RNG.standard_normal((6, 3)).astype(np.float32)
    assert_ml(
        "LinearClassifier",
        {"x": x},
        2,
        coefficients=[0.5, -1.0, 2.0],
        intercepts=[0.1],
        classlabels_ints=[0, 1],
        post_transform="LOGISTIC",
    )


# Split (jonnx.optimize.string_labels), the classifier compiles and only the LabelEncoder from
# its integer codes to the names runs on the host; unsplit, the whole classifier runs there.
@pytest.mark.parametrize("optimize,on_host", [(True, "LabelEncoder"), (False, "LinearClassifier")])
def test_string_labels_need_concrete_input(optimize, on_host):
    x = RNG.standard_normal((2, 2)).astype(np.float32)
    model = node_model(
        "LinearClassifier",
        {"x": x},
        2,
        opset=1,
        domain=ML,
        coefficients=[1.0, 0, 0, 1.0],
        classlabels_strings=["a", "b"],
    )
    with jax.enable_x64(True):
        m = jonnx.load(model, optimize=optimize)
        # Model.__call__ runs the strings on the host: x is data, not a static argument.
        assert m.static_input_names == ("x",)
        assert not any(s.static for s in m.segment_plan.stages)
        assert [m._call_graph.nodes[p].op_type for p in m.segment_plan.host_nodes] == [on_host]
        with pytest.raises(errors.StaticValueError, match=on_host):
            jax.jit(lambda v: m.apply(m.params, v))(x)
        labels, _ = m(x)
    assert labels.tolist() == ["a" if a >= b else "b" for a, b in x]


# -- SVMs ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kernel,params", [("LINEAR", None), ("RBF", [0.5, 0, 0]), ("POLY", [0.3, 1.0, 3]), ("SIGMOID", [0.2, 0.1, 0])]
)
def test_svm_regressor(kernel, params):
    x = RNG.standard_normal((4, 3)).astype(np.float32)
    sv = RNG.standard_normal((5, 3)).astype(np.float32)
    attrs = dict(
        coefficients=RNG.standard_normal(5).tolist(),
        rho=[0.25],
        n_supports=5,
        support_vectors=sv.ravel().tolist(),
        kernel_type=kernel,
    )
    if params:
        attrs["kernel_params"] = params
    assert_ml("SVMRegressor", {"x": x}, rtol=1e-4, atol=1e-5, **attrs)
    ml_grads("SVMRegressor", x, **attrs)


def test_svm_regressor_linear_and_one_class():
    x = RNG.standard_normal((4, 3)).astype(np.float32)
    assert_ml("SVMRegressor", {"x": x}, coefficients=[1.0, -2.0, 0.5], rho=[0.1])
    assert_ml("SVMRegressor", {"x": x}, coefficients=[1.0, -2.0, 0.5], rho=[0.1], one_class=1)


def _svc(n_classes, n_features, per_class, rng):
    n_vec = sum(per_class)
    return dict(
        coefficients=rng.standard_normal((n_classes - 1) * n_vec).tolist(),
        support_vectors=rng.standard_normal(n_vec * n_features).tolist(),
        vectors_per_class=per_class,
        rho=rng.standard_normal(n_classes * (n_classes - 1) // 2).tolist(),
        kernel_type="RBF",
        kernel_params=[0.4, 0.0, 0.0],
    )


@pytest.mark.parametrize("labels", [{"classlabels_ints": [0, 1, 2]}, {"classlabels_strings": ["x", "y", "z"]}])
def test_svm_classifier_ovo_votes(labels):
    x = RNG.standard_normal((6, 4)).astype(np.float32)
    attrs = _svc(3, 4, [2, 3, 2], np.random.default_rng(1))
    assert_ml("SVMClassifier", {"x": x}, 2, rtol=1e-4, atol=1e-5, **attrs, **labels)


def test_svm_classifier_binary_and_linear():
    x = RNG.standard_normal((6, 4)).astype(np.float32)
    attrs = _svc(2, 4, [3, 2], np.random.default_rng(2))
    assert_ml("SVMClassifier", {"x": x}, 2, classlabels_ints=[4, 9], rtol=1e-4, atol=1e-5, **attrs)
    assert_ml(
        "SVMClassifier",
        {"x": x},
        2,
        classlabels_ints=[0, 1, 2],
        coefficients=RNG.standard_normal(12).tolist(),
        rho=[0.5],
        post_transform="SOFTMAX",
        rtol=1e-4,
        atol=1e-5,
    )


@pytest.mark.parametrize("n_classes", [2, 3])
def test_svm_classifier_probabilities(n_classes):
    # For more than two classes the onnx reference builds libsvm's Q matrix wrongly (a dot
    # product in every off-diagonal entry): onnxruntime is the reference there.
    x = RNG.standard_normal((5, 3)).astype(np.float32)
    rng = np.random.default_rng(3)
    attrs = _svc(n_classes, 3, [2] * n_classes, rng)
    pairs = n_classes * (n_classes - 1) // 2
    attrs.update(
        prob_a=(-rng.uniform(0.5, 2, pairs)).tolist(),
        prob_b=rng.uniform(-0.2, 0.2, pairs).tolist(),
        classlabels_ints=list(range(n_classes)),
    )
    model = node_model("SVMClassifier", {"x": x}, 2, opset=1, domain=ML, **attrs)
    want = run_reference(model, {"x": x}) if n_classes == 2 else run_ort(model, {"x": x})
    got = run_jonnx(model, {"x": x})
    np.testing.assert_allclose(got[1], want[1], rtol=1e-3, atol=1e-4)
    np.testing.assert_array_equal(got[0], want[0])


# -- tree ensembles ------------------------------------------------------------------------------


def _random_tree(rng, n_features, depth, first_id=0):
    """Nodes of one random tree (ids from 0, in preorder): a list of dicts."""
    nodes = []

    def grow(d):
        k = len(nodes)
        nodes.append(None)
        if d == depth or (d > 0 and rng.random() < 0.25):
            nodes[k] = {"mode": "LEAF", "f": 0, "v": 0.0, "t": 0, "e": 0}
            return k
        f, v = int(rng.integers(n_features)), float(rng.standard_normal())
        t = grow(d + 1)
        e = grow(d + 1)
        nodes[k] = {
            "mode": str(rng.choice(["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GT", "BRANCH_GTE"])),
            "f": f,
            "v": v,
            "t": t,
            "e": e,
        }
        return k

    grow(0)
    return nodes


def _legacy_forest(rng, n_trees, n_features, n_targets, prefix, depth=4, missing=False):
    attrs = {
        k: []
        for k in (
            "nodes_treeids",
            "nodes_nodeids",
            "nodes_modes",
            "nodes_featureids",
            "nodes_values",
            "nodes_truenodeids",
            "nodes_falsenodeids",
            f"{prefix}_treeids",
            f"{prefix}_nodeids",
            f"{prefix}_ids",
            f"{prefix}_weights",
        )
    }
    if missing:
        attrs["nodes_missing_value_tracks_true"] = []
    for t in range(n_trees):
        for i, node in enumerate(_random_tree(rng, n_features, depth)):
            attrs["nodes_treeids"].append(t)
            attrs["nodes_nodeids"].append(i)
            attrs["nodes_modes"].append(node["mode"])
            attrs["nodes_featureids"].append(node["f"])
            attrs["nodes_values"].append(node["v"])
            attrs["nodes_truenodeids"].append(node["t"])
            attrs["nodes_falsenodeids"].append(node["e"])
            if missing:
                attrs["nodes_missing_value_tracks_true"].append(int(rng.integers(2)))
            if node["mode"] == "LEAF":
                for target in rng.choice(n_targets, size=min(n_targets, 2), replace=False):
                    attrs[f"{prefix}_treeids"].append(t)
                    attrs[f"{prefix}_nodeids"].append(i)
                    attrs[f"{prefix}_ids"].append(int(target))
                    attrs[f"{prefix}_weights"].append(float(rng.standard_normal()))
    return attrs


@pytest.mark.parametrize("aggregate", ["SUM", "AVERAGE", "MIN", "MAX"])
@pytest.mark.parametrize("opset", [1, 3])
def test_tree_ensemble_regressor(aggregate, opset):
    rng = np.random.default_rng(4)
    attrs = _legacy_forest(rng, 5, 4, 2, "target", missing=True)
    x = rng.standard_normal((20, 4)).astype(np.float32)
    x[::3, 1] = np.nan
    assert_ml(
        "TreeEnsembleRegressor",
        {"x": x},
        opset=opset,
        n_targets=2,
        aggregate_function=aggregate,
        base_values=[0.5, -0.5],
        rtol=1e-5,
        atol=1e-5,
        **attrs,
    )


def test_tree_ensemble_regressor_as_tensor_double():
    rng = np.random.default_rng(5)
    attrs = _legacy_forest(rng, 3, 3, 1, "target")
    attrs["nodes_values_as_tensor"] = oh.make_tensor(
        "v", onnx.TensorProto.DOUBLE, [len(attrs["nodes_values"])], attrs.pop("nodes_values")
    )
    attrs["target_weights_as_tensor"] = oh.make_tensor(
        "w", onnx.TensorProto.DOUBLE, [len(attrs["target_weights"])], attrs.pop("target_weights")
    )
    x = rng.standard_normal((10, 3))
    model = node_model("TreeEnsembleRegressor", {"x": x}, opset=3, domain=ML, n_targets=1, **attrs)
    # The spec's output is float; the onnx reference keeps double, onnxruntime gives float.
    want = run_ort(model, {"x": x})[0]
    got = run_jonnx(model, {"x": x})[0]
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("post", ["NONE", "SOFTMAX", "LOGISTIC"])
@pytest.mark.parametrize("labels", [{"classlabels_int64s": [10, 20, 30]}, {"classlabels_strings": ["a", "b", "c"]}])
def test_tree_ensemble_classifier(post, labels):
    rng = np.random.default_rng(6)
    attrs = _legacy_forest(rng, 4, 3, 3, "class")
    x = rng.standard_normal((15, 3)).astype(np.float32)
    assert_ml(
        "TreeEnsembleClassifier",
        {"x": x},
        2,
        post_transform=post,
        base_values=[0.1, 0.0, -0.1],
        rtol=1e-5,
        atol=1e-5,
        **attrs,
        **labels,
    )


@pytest.mark.parametrize("post", ["NONE", "LOGISTIC"])
def test_tree_ensemble_classifier_binary(post):
    rng = np.random.default_rng(7)
    attrs = _legacy_forest(rng, 3, 3, 1, "class")
    x = rng.standard_normal((12, 3)).astype(np.float32)
    for opset in (1, 3, 5):
        assert_ml(
            "TreeEnsembleClassifier",
            {"x": x},
            2,
            opset=opset,
            classlabels_int64s=[0, 1],
            post_transform=post,
            rtol=1e-5,
            atol=1e-5,
            **attrs,
        )


def _v5_from_legacy(attrs, n_targets, dtype=np.float32):
    """Rewrite a legacy regressor forest in TreeEnsemble-5's encoding."""
    modes = {"BRANCH_LEQ": 0, "BRANCH_LT": 1, "BRANCH_GTE": 2, "BRANCH_GT": 3}
    interior, leaves, roots = {}, {}, []
    for k, (t, i, m) in enumerate(zip(attrs["nodes_treeids"], attrs["nodes_nodeids"], attrs["nodes_modes"])):
        (leaves if m == "LEAF" else interior)[t, i] = k
    order_i, order_l = {key: n for n, key in enumerate(interior)}, {key: n for n, key in enumerate(leaves)}
    leaf_w, leaf_t = [], []
    for key in leaves:
        w = [
            (tid, wt)
            for tr, nd, tid, wt in zip(
                attrs["target_treeids"], attrs["target_nodeids"], attrs["target_ids"], attrs["target_weights"]
            )
            if (tr, nd) == key
        ]
        assert len(w) == 1
        leaf_t.append(w[0][0])
        leaf_w.append(w[0][1])
    out = {
        k: []
        for k in ("nodes_featureids", "nodes_truenodeids", "nodes_falsenodeids", "nodes_trueleafs", "nodes_falseleafs")
    }
    splits, mode = [], []
    for (t, i), k in interior.items():
        out["nodes_featureids"].append(attrs["nodes_featureids"][k])
        splits.append(attrs["nodes_values"][k])
        mode.append(modes[attrs["nodes_modes"][k]])
        for side, ids in (("true", attrs["nodes_truenodeids"]), ("false", attrs["nodes_falsenodeids"])):
            child = (t, ids[k])
            out[f"nodes_{side}leafs"].append(int(child in leaves))
            out[f"nodes_{side}nodeids"].append(order_l[child] if child in leaves else order_i[child])
        if i == 0:
            roots.append(order_i[t, i])
    elem = oh.np_dtype_to_tensor_dtype(np.dtype(dtype))
    out.update(
        tree_roots=roots,
        n_targets=n_targets,
        leaf_targetids=leaf_t,
        nodes_splits=oh.make_tensor("s", elem, [len(splits)], np.asarray(splits, dtype)),
        leaf_weights=oh.make_tensor("w", elem, [len(leaf_w)], np.asarray(leaf_w, dtype)),
        nodes_modes=oh.make_tensor("m", onnx.TensorProto.UINT8, [len(mode)], np.asarray(mode, np.uint8)),
    )
    return out


@pytest.mark.parametrize("aggregate", [0, 1, 2, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_tree_ensemble_v5(aggregate, dtype):
    rng = np.random.default_rng(8)
    legacy = {}
    while True:  # a forest whose trees all split at the root, each leaf voting once
        legacy = _legacy_forest(rng, 4, 3, 1, "target", depth=3)
        if all(
            m != "LEAF"
            for t, i, m in zip(legacy["nodes_treeids"], legacy["nodes_nodeids"], legacy["nodes_modes"])
            if i == 0
        ):
            break
    legacy["target_ids"] = [int(rng.integers(2)) for _ in legacy["target_ids"]]
    attrs = _v5_from_legacy(legacy, 2, dtype)
    x = rng.standard_normal((10, 3)).astype(dtype)
    assert_ml("TreeEnsemble", {"x": x}, opset=5, aggregate_function=aggregate, rtol=1e-5, atol=1e-6, **attrs)


def test_tree_ensemble_v5_membership_and_post_transform():
    # One tree: node 0 tests x0 in {1, 3, 5}; node 1 (false branch) tests x1 <= 0.5.
    attrs = dict(
        n_targets=2,
        tree_roots=[0],
        nodes_featureids=[0, 1],
        nodes_truenodeids=[0, 1],
        nodes_trueleafs=[1, 1],
        nodes_falsenodeids=[1, 2],
        nodes_falseleafs=[0, 1],
        nodes_modes=oh.make_tensor("m", onnx.TensorProto.UINT8, [2], np.array([6, 0], np.uint8)),
        nodes_splits=oh.make_tensor("s", onnx.TensorProto.FLOAT, [2], np.array([0.0, 0.5], np.float32)),
        membership_values=oh.make_tensor("v", onnx.TensorProto.FLOAT, [4], np.array([1, 3, 5, np.nan], np.float32)),
        leaf_targetids=[0, 1, 0],
        leaf_weights=oh.make_tensor("w", onnx.TensorProto.FLOAT, [3], np.array([1.0, 2.0, 3.0], np.float32)),
    )
    x = np.array([[1, 0], [3, 1], [2, 0], [2, 1], [5, 9]], np.float32)
    got = assert_ml("TreeEnsemble", {"x": x}, opset=5, **attrs)
    np.testing.assert_array_equal(got[0], [[1, 0], [1, 0], [0, 2], [3, 0], [1, 0]])
    # post_transform (the onnx reference ignores it): LOGISTIC per the spec.
    assert_ml("TreeEnsemble", {"x": x}, opset=5, post_transform=2, **attrs, expected=[1 / (1 + np.exp(-got[0]))])


# -- label and category maps ----------------------------------------------------------------------


def test_label_encoder_v1_both_directions():
    classes = ["a", "b", "c"]
    assert_ml(
        "LabelEncoder",
        {"x": _strs("b", "z", "c")},
        classes_strings=classes,
        default_int64=-7,
        expected=[np.array([1, -7, 2])],
    )
    assert_ml(
        "LabelEncoder",
        {"x": np.array([2, 0, 5], np.int64)},
        classes_strings=classes,
        expected=[_strs("c", "a", "_Unused")],
    )


@pytest.mark.parametrize("opset", [2, 4])
def test_label_encoder_v2_lists(opset):
    assert_ml(
        "LabelEncoder",
        {"x": _strs("Amy", "Dori", "Sally")},
        opset=opset,
        keys_strings=["Amy", "Sally"],
        values_int64s=[5, 6],
        default_int64=-1,
    )
    assert_ml(
        "LabelEncoder",
        {"x": np.array([1, 7, 2], np.int64)},
        opset=opset,
        keys_int64s=[1, 2],
        values_strings=["one", "two"],
        default_string="?",
    )
    x = np.array([[0.5, np.nan], [2.5, 1.0]], np.float32)
    assert_ml(
        "LabelEncoder",
        {"x": x},
        opset=opset,
        keys_floats=[0.5, np.nan, 2.5],
        values_floats=[10.0, 20.0, 30.0],
        default_float=-1.0,
        expected=[np.array([[10.0, 20.0], [30.0, -1.0]], np.float32)],
    )


def test_label_encoder_numbers_to_strings():
    # Searched sorted on the host: a repeated key (the last wins), NaN matching NaN, a miss.
    x = np.array([[0.5, np.nan], [2.5, 1.0]], np.float32)
    assert_ml(
        "LabelEncoder",
        {"x": x},
        opset=2,
        keys_floats=[0.5, np.nan, 2.5, 0.5],
        values_strings=["first", "nan", "c", "last"],
        default_string="?",
        expected=[np.array([["last", "nan"], ["c", "?"]], object)],
    )


def test_label_encoder_v4_tensors_traced():
    keys = oh.make_tensor("k", onnx.TensorProto.INT64, [3], [3, 1, 3])
    values = oh.make_tensor("v", onnx.TensorProto.DOUBLE, [3], [0.5, 1.5, 2.5])
    x = np.array([[1, 3], [4, 1]], np.int64)
    # Repeated key 3: the last one wins (v4 spec).
    got = assert_ml(
        "LabelEncoder",
        {"x": x},
        opset=4,
        keys_tensor=keys,
        values_tensor=values,
        default_tensor=oh.make_tensor("d", onnx.TensorProto.DOUBLE, [1], [-9.0]),
        expected=[np.array([[1.5, 2.5], [-9.0, 1.5]])],
    )
    assert got[0].dtype == np.float64


def test_label_encoder_builds_its_table_once_per_node(monkeypatch):
    # A host op runs on every call: the sorted keys come from the node's attributes once.
    from jonnx.ops.ml import encoders

    builds = []
    build = encoders._Lookup.__init__
    monkeypatch.setattr(encoders._Lookup, "__init__", lambda self, *a: builds.append(a) or build(self, *a))
    x = np.array([3, 1, 7], np.int64)
    models = [
        jonnx.load(node_model("LabelEncoder", {"x": x}, opset=2, domain=ML, keys_int64s=[1, 3], values_strings=v))
        for v in (["one", "three"], ["uno", "tres"])
    ]
    for _ in range(3):
        for model, names in zip(models, (["three", "one", "_Unused"], ["tres", "uno", "_Unused"])):
            assert model(x)[0].tolist() == names
    assert len(builds) == 2


def test_tables_are_kept_only_for_a_loaded_nodes_attributes():
    from jonnx.ops._util import from_attributes

    calls = []

    def build():
        calls.append(1)
        return len(calls)

    node_attrs = types.MappingProxyType({"keys": (1, 2)})
    assert [from_attributes(node_attrs, "t", build) for _ in range(3)] == [1, 1, 1]
    assert from_attributes(node_attrs, "t", build, np.dtype(np.int32)) == 2  # another key
    assert from_attributes(node_attrs, "other", build) == 3  # another table
    # A plain dict (a direct jonnx.ops call) may change between calls: built each time.
    plain = {"keys": (1, 2)}
    assert [from_attributes(plain, "t", build) for _ in range(2)] == [4, 5]


def test_category_mapper_against_onnxruntime():
    attrs = dict(cats_strings=["cat", "dog", "cow"], cats_int64s=[1, 2, 3])
    for x in (_strs("dog", "fox", "cow"), np.array([3, 1, 9], np.int64)):
        model = node_model("CategoryMapper", {"x": x}, opset=1, domain=ML, **attrs)
        want = run_ort(model, {"x": x.astype(str) if x.dtype == object else x})[0]
        got = run_jonnx(model, {"x": x})[0]
        np.testing.assert_array_equal(
            got.astype(str) if got.dtype == object else got,
            want.astype(got.dtype) if got.dtype != object else np.asarray(want).astype(str),
        )


# -- maps ----------------------------------------------------------------------------------------


def _map_model(op, key_type, value_type, out_type, n_outputs=1, **attrs):
    node = oh.make_node(op, ["x"], ["y"], domain=ML, **attrs)
    x = oh.make_value_info("x", oh.make_map_type_proto(key_type, oh.make_tensor_type_proto(value_type, [])))
    graph = oh.make_graph([node], op, [x], [oh.make_empty_tensor_value_info("y")])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18), oh.make_opsetid(ML, 1)], ir_version=8)


def _call(op, *inputs, **attrs):
    with jax.enable_x64(True):
        return jonnx.ops.call(op, *inputs, domain=ML, opset=1, **attrs)


def test_dict_vectorizer_against_onnxruntime():
    x = {"a": 4.0, "c": 8.0}
    model = _map_model(
        "DictVectorizer", onnx.TensorProto.STRING, onnx.TensorProto.FLOAT, None, string_vocabulary=["a", "b", "c", "z"]
    )
    want = run_ort(model, {"x": x})[0]
    got = np.asarray(_call("DictVectorizer", x, string_vocabulary=["a", "b", "c", "z"]))
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want)
    # Traced map values work too.
    f = jax.jit(lambda v: _call("DictVectorizer", {1: v, 3: 2 * v}, int64_vocabulary=[3, 2, 1]))
    np.testing.assert_allclose(f(np.float32(1.5)), [[3.0, 0.0, 1.5]])
    # A key outside the vocabulary is ignored, as onnxruntime does (the spec: "must be present").
    unseen = {"a": 4.0, "q": 1.0}
    np.testing.assert_allclose(
        _call("DictVectorizer", unseen, string_vocabulary=["a", "b"]),
        run_ort(
            _map_model(
                "DictVectorizer", onnx.TensorProto.STRING, onnx.TensorProto.FLOAT, None, string_vocabulary=["a", "b"]
            ),
            {"x": unseen},
        )[0],
    )


@pytest.mark.parametrize("form,cast_to", [("DENSE", "TO_FLOAT"), ("SPARSE", "TO_FLOAT"), ("DENSE", "TO_INT64")])
def test_cast_map_against_onnxruntime(form, cast_to):
    x = {4: 1.5, 0: 2.0, 2: -3.0}
    attrs = dict(map_form=form, cast_to=cast_to, max_map=6)
    model = _map_model("CastMap", onnx.TensorProto.INT64, onnx.TensorProto.FLOAT, None, **attrs)
    want = run_ort(model, {"x": x})[0]
    got = np.asarray(_call("CastMap", x, **attrs))
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want)


@pytest.mark.parametrize("labels", [{"classlabels_strings": ["a", "b"]}, {"classlabels_int64s": [7, 9]}])
def test_zip_map_against_onnxruntime(labels):
    x = RNG.standard_normal((3, 2)).astype(np.float32)
    node = oh.make_node("ZipMap", ["x"], ["z"], domain=ML, **labels)
    key = onnx.TensorProto.STRING if "classlabels_strings" in labels else onnx.TensorProto.INT64
    out = oh.make_value_info(
        "z",
        oh.make_sequence_type_proto(oh.make_map_type_proto(key, oh.make_tensor_type_proto(onnx.TensorProto.FLOAT, []))),
    )
    graph = oh.make_graph([node], "zm", [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3, 2])], [out])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18), oh.make_opsetid(ML, 1)], ir_version=8)
    want = run_ort(model, {"x": x})[0]
    for got in (_call("ZipMap", x, **labels), jax.jit(lambda v: _call("ZipMap", v, **labels))(x)):
        assert [sorted(d) for d in got] == [sorted(d) for d in want]
        for g, w in zip(got, want):
            for k in w:
                np.testing.assert_allclose(float(g[k]), w[k], rtol=1e-6)


def test_map_inputs_take_their_declared_value_type():
    # Python floats in a map declared float: float32 out, as onnxruntime, also with x64 on
    # (where the floats alone would make float64); a string there is refused by name.
    model = _map_model("DictVectorizer", onnx.TensorProto.INT64, onnx.TensorProto.FLOAT, None, int64_vocabulary=[3, 4])
    x = {3: 0.1, 4: 2.5}
    with jax.enable_x64(True):
        (got,) = jonnx.load(model)(x)
    (want,) = run_ort(model, {"x": x})
    assert got.dtype == want.dtype == np.float32
    np.testing.assert_array_equal(got, want)
    with pytest.raises(errors.InputError, match=r"map input 'x' is declared with float32 values, but 'a' was given"):
        jonnx.load(model)({3: "a"})


def test_cast_map_to_strings_as_onnxruntime_writes_them():
    # Numbers as C++'s std::to_string writes them (onnxruntime); the map's values reach the
    # node traced inside a compiled segment, so the node moves to the host.
    model = _map_model("CastMap", onnx.TensorProto.INT64, onnx.TensorProto.FLOAT, None, cast_to="TO_STRING")
    x = {4: 1.5, 0: -2.0, 2: 1e-7, 3: 123456.78}
    (want,) = run_ort(model, {"x": x})
    (got,) = jonnx.load(model)(x)
    assert got.tolist() == want.tolist() == [["-2.000000", "0.000000", "123456.781250", "1.500000"]]


def test_maps_of_strings_run_on_the_host():
    # onnxruntime's Python binding cannot feed a map of strings, so the values are the
    # specification's: the vocabulary's order, "" where the map has no key, keys outside ignored.
    model = _map_model(
        "DictVectorizer", onnx.TensorProto.INT64, onnx.TensorProto.STRING, None, int64_vocabulary=[7, 2, 5]
    )
    m = jonnx.load(model)
    assert m(x={2: "b", 7: "a", 9: "z"})[0].tolist() == [["a", "b", ""]]
    assert m(x={5: "c"})[0].tolist() == [["", "", "c"]]
    cast = jonnx.load(_map_model("CastMap", onnx.TensorProto.INT64, onnx.TensorProto.STRING, None, cast_to="TO_FLOAT"))
    np.testing.assert_array_equal(cast({1: "2.5", 0: "-1"})[0], np.array([[-1.0, 2.5]], np.float32))

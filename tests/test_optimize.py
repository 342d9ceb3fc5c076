"""jonnx.optimize: every pass on and off gives the same outputs, state and gradients.

Each pass runs alone and all together on the bundled models and on small graphs built to
trigger it; each test also checks that the pass rewrote the graph, so it cannot pass vacuously.
Expected values for the built graphs come from onnxruntime.
"""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import onnxruntime as ort
import pytest

import jonnx
from jonnx import optimize
from jonnx.ops import conv as conv_ops
from tests._compiles import count_compiles
from tests._on_off import assert_gradients_close, compare_on_off, value_and_grad

MODELS = pathlib.Path(__file__).resolve().parents[1] / "examples" / "models"
RNG = np.random.default_rng(0)
F = onnx.TensorProto.FLOAT


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _model(nodes, inputs, outputs, inits, opset=17):
    graph = oh.make_graph(nodes, "g", inputs, outputs, [onh.from_array(v, k) for k, v in inits.items()])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)])


def conv_bn(opset=17):
    inits = {
        "w": rand(4, 3, 3, 3),
        "b": rand(4),
        "s": rand(4),
        "beta": rand(4),
        "m": rand(4),
        "v": np.abs(rand(4)) + 0.5,
        "w2": rand(5, 4, 1, 1),
        "s2": rand(5),
        "beta2": rand(5),
        "m2": rand(5),
        "v2": np.abs(rand(5)) + 0.5,
    }
    nodes = [
        oh.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        oh.make_node("BatchNormalization", ["c", "s", "beta", "m", "v"], ["y"], epsilon=1e-3),
        oh.make_node("Relu", ["y"], ["r"]),
        oh.make_node("Conv", ["r", "w2"], ["c2"]),  # no bias
        oh.make_node("BatchNormalization", ["c2", "s2", "beta2", "m2", "v2"], ["out"]),
    ]
    io = (
        [oh.make_tensor_value_info("x", F, ["N", 3, 6, 6])],
        [oh.make_tensor_value_info("out", F, None)],
    )
    return _model(nodes, *io, inits, opset), {"x": rand(2, 3, 6, 6)}


def gemm_bn(trans_b):
    w = rand(6, 5) if trans_b else rand(5, 6)
    inits = {
        "w": w,
        "c": rand(6),
        "s": rand(6),
        "beta": rand(6),
        "m": rand(6),
        "v": np.abs(rand(6)) + 0.5,
    }
    nodes = [
        oh.make_node("Gemm", ["x", "w", "c"], ["g"], transB=trans_b),
        oh.make_node("BatchNormalization", ["g", "s", "beta", "m", "v"], ["out"]),
    ]
    io = (
        [oh.make_tensor_value_info("x", F, ["N", 5])],
        [oh.make_tensor_value_info("out", F, None)],
    )
    return _model(nodes, *io, inits), {"x": rand(3, 5)}


def qkv():
    inits = {f"w{i}": rand(8, n) for i, n in enumerate((8, 8, 4))} | {"bq": rand(8)}
    nodes = [
        oh.make_node("MatMul", ["x", "w0"], ["q0"]),
        oh.make_node("Add", ["q0", "bq"], ["q"]),
        oh.make_node("MatMul", ["x", "w1"], ["k"]),
        oh.make_node("MatMul", ["x", "w2"], ["v"]),
        oh.make_node("MatMul", ["q", "k"], ["qk"], name="not_parallel"),  # reads x only indirectly
        oh.make_node("Concat", ["qk", "v"], ["out"], axis=-1),
    ]
    io = (
        [oh.make_tensor_value_info("x", F, ["N", 8, 8])],
        [oh.make_tensor_value_info("out", F, None)],
    )
    return _model(nodes, *io, inits), {"x": rand(2, 8, 8)}


def dead_and_random():
    inits = {"w": rand(4, 4)}
    nodes = [
        oh.make_node("MatMul", ["x", "w"], ["unused"], name="dead"),
        oh.make_node("Sin", ["unused"], ["unused2"], name="dead2"),
        oh.make_node("Dropout", ["x"], ["d"]),
        oh.make_node("MatMul", ["d", "w"], ["out"]),
    ]
    outs = [
        oh.make_tensor_value_info("out", F, None),
        oh.make_tensor_value_info("d", F, None),
    ]
    io = ([oh.make_tensor_value_info("x", F, ["N", 4])], outs)
    return _model(nodes, *io, inits), {"x": rand(3, 4)}


def _bundled(name, feeds):
    return lambda: (onnx.load(MODELS / name), feeds)


BUILT = {
    "conv_bn": conv_bn,
    "conv_bn_opset9": lambda: conv_bn(9),
    "gemm_bn": lambda: gemm_bn(0),
    "gemm_bn_transB": lambda: gemm_bn(1),
    "qkv": qkv,
    "dead_and_random": dead_and_random,
}
BUNDLED = {
    "small_cnn": _bundled("small_cnn.onnx", {"image": rand(2, 3, 16, 16)}),
    "tiny_transformer": _bundled(
        "tiny_transformer.onnx",
        {
            "input_ids": RNG.integers(0, 50, (2, 7)),
            "attention_mask": np.array([[1] * 7, [1] * 4 + [0] * 3]),
        },
    ),
}
# The graphs each pass must rewrite.
REWRITES = {
    "fold_batchnorm": [
        "conv_bn",
        "conv_bn_opset9",
        "gemm_bn",
        "gemm_bn_transB",
        "small_cnn",
    ],
    "fuse_matmuls": ["qkv", "tiny_transformer"],
    "dead_nodes": ["dead_and_random"],
}


# Each pass alone on the graphs it rewrites and one it does not; all passes on every graph.
COMBOS = [(p, g) for p in (*optimize.PASSES, "constant_weights") for g in REWRITES.get(p, ["small_cnn"]) + ["qkv"]]
COMBOS += [("all", g) for g in (*BUILT, *BUNDLED)]


@pytest.mark.parametrize("pass_name,name", COMBOS)
def test_pass_on_equals_off(pass_name, name):
    proto, feeds = {**BUILT, **BUNDLED}[name]()
    switches = (
        {"constant_weights": True}
        if pass_name == "all"
        else {p: p == pass_name for p in (*optimize.PASSES, "constant_weights")}
    )
    model = compare_on_off(proto, feeds, switches, trains=(False, True), grad_tol=1e-4)
    if name in REWRITES.get(pass_name, ()):
        assert len(model._graph_for(False).nodes) != len(model.graph.nodes) or {
            n.op_type for n in model._graph_for(False).nodes
        } != {n.op_type for n in model.graph.nodes}


@pytest.mark.parametrize("name", list(BUILT))
def test_optimized_matches_onnxruntime(name):
    proto, feeds = BUILT[name]()
    if name == "dead_and_random":
        pytest.skip("Dropout in inference is the identity; covered by the comparison above")
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, feeds)
    got = jonnx.load(proto)(**feeds)
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), b, rtol=1e-4, atol=1e-4)


def test_batchnorm_folds_only_in_inference():
    proto, _ = conv_bn()
    model = jonnx.load(proto, optimize={"fold_batchnorm": True})
    ops = lambda train: [n.op_type for n in model._graph_for(train).nodes]
    assert "BatchNormalization" not in ops(False) and "BatchNormalization" not in ops(None)
    assert ops(True).count("BatchNormalization") == 2


def test_fused_matmul_reads_the_shared_input_once():
    proto, _ = qkv()
    nodes = jonnx.load(proto, optimize={"fuse_matmuls": True})._graph_for(None).nodes
    assert sum(n.op_type == "MatMul" and n.inputs[0] == "x" for n in nodes) == 1
    assert [n.op_type for n in nodes].count("Split") == 1


def test_random_ops_draw_the_same_after_nodes_are_removed():
    proto, feeds = dead_and_random()
    on, off = jonnx.load(proto), jonnx.load(proto, optimize=False)
    assert len(on._graph_for(True).nodes) < len(off._graph_for(True).nodes)
    key = jax.random.key(0)
    a = on.apply(on.params, **feeds, train=True, key=key)[0][1]
    b = off.apply(off.params, **feeds, train=True, key=key)[0][1]
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert np.any(np.asarray(a) == 0)  # Dropout did drop: the comparison is not vacuous


@pytest.mark.parametrize(
    "option,match",
    [
        ({"fold_batchnrom": True}, "unknown optimization pass"),
        ({"dead_nodes": 1}, "must be a bool"),
        ("yes", "optimize must be"),
    ],
)
def test_bad_option(option, match):
    with pytest.raises((ValueError, TypeError), match=match):
        optimize.resolve(option)


def test_options_survive_pickling():
    import pickle

    proto, _feeds = conv_bn()
    model = pickle.loads(pickle.dumps(jonnx.load(proto, optimize={"fold_batchnorm": False})))
    assert model.optimize["fold_batchnorm"] is False and model.optimize["dead_nodes"] is True


def test_constant_weights_is_off_unless_named():
    assert optimize.resolve(True)["constant_weights"] is False
    assert optimize.resolve({"dead_nodes": False})["constant_weights"] is False
    assert optimize.resolve({"constant_weights": True})["fold_batchnorm"] is True


@pytest.mark.parametrize("name", ["fold_batchnorm", "fuse_matmuls"])
def test_weight_copying_passes_follow_constant_weights_unless_named(name):
    # With weights as arguments the folded or concatenated weights would be a second copy.
    assert optimize.resolve(True)[name] is False
    assert optimize.resolve({"constant_weights": True})[name] is True
    assert optimize.resolve({name: True})[name] is True
    assert optimize.resolve({"constant_weights": True, name: False})[name] is False
    assert optimize.resolve(False)[name] is False


def test_training_gradients_equal_the_plain_graph(monkeypatch):
    # The whole default path of a training step (graph passes and the CPU Conv lowerings,
    # batch 2 so k x k convolutions take im2col) against the graph as written with XLA's
    # convolution: the gradients a fine-tuning loop sees must not move.
    proto, feeds = BUNDLED["small_cnn"]()
    key = jax.random.key(3)
    fast = jonnx.load(proto)
    _, g_fast = value_and_grad(fast, feeds, True, key)
    monkeypatch.setattr(conv_ops, "CONV_LOWERING", "xla")
    plain = jonnx.load(proto, optimize=False)
    _, g_plain = value_and_grad(plain, feeds, True, key)
    assert_gradients_close(g_fast, g_plain, 1e-5)


def test_weight_only_nodes_run_once_in_the_default_call():
    # Folded BatchNorm weights depend on the weights alone: Model(*inputs) computes them once
    # and its compiled call takes them as weights, instead of refolding on every call.
    proto, feeds = conv_bn()
    model = jonnx.load(proto, optimize={"fold_batchnorm": True})
    folded = [model._call_graph.nodes[p].op_type for p in model._prepared_nodes]
    assert folded and "Conv" not in folded and "BatchNormalization" not in folded
    calls = []
    prepare = model._prepare
    model._prepare = lambda params: calls.append(1) or prepare(params)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    (want,) = session.run(None, feeds)
    for _ in range(3):
        np.testing.assert_allclose(np.asarray(model(**feeds)[0]), want, rtol=1e-4, atol=1e-4)
    assert len(calls) == 1
    # Other params are prepared for their own call, not taken from the cache.
    params = {"w": model.params["w"] * 2}
    plain = jonnx.load(proto, optimize=False)
    np.testing.assert_allclose(
        np.asarray(model(**feeds, params=params)[0]), np.asarray(plain(**feeds, params=params)[0]), rtol=1e-5, atol=1e-5
    )


def test_gradients_flow_through_weight_only_nodes():
    proto, feeds = conv_bn()
    model = jonnx.load(proto, optimize={"fold_batchnorm": True})
    plain = jonnx.load(proto, optimize=False)
    assert model._prepared_nodes and not plain._prepared_nodes

    def loss(m):
        return lambda p: jnp.sum(m(**feeds, params=p)[0] ** 2)

    got, want = jax.grad(loss(model))(model.params), jax.grad(loss(plain))(plain.params)
    assert set(got) == set(want) == set(model.params)
    for name in want:
        np.testing.assert_allclose(np.asarray(got[name]), np.asarray(want[name]), rtol=1e-4, atol=1e-4, err_msg=name)


# -- string_labels: a classifier with string labels as integer codes and a lookup -------------

ML = "ai.onnx.ml"


def _tree_attrs(n_labels: int) -> dict:
    # Two stumps on features 0 and 1; each leaf votes for one class (for every class with 3).
    classes = range(max(n_labels, 1)) if n_labels > 2 else [0]
    leaves = [(t, leaf) for t in (0, 1) for leaf in (1, 2)]
    return dict(
        nodes_treeids=[0, 0, 0, 1, 1, 1],
        nodes_nodeids=[0, 1, 2, 0, 1, 2],
        nodes_featureids=[0, 0, 0, 1, 0, 0],
        nodes_values=[0.1, 0, 0, -0.2, 0, 0],
        nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF", "BRANCH_LEQ", "LEAF", "LEAF"],
        nodes_truenodeids=[1, 0, 0, 1, 0, 0],
        nodes_falsenodeids=[2, 0, 0, 2, 0, 0],
        class_treeids=[t for t, _ in leaves for _ in classes],
        class_nodeids=[leaf for _, leaf in leaves for _ in classes],
        class_ids=[c for _ in leaves for c in classes],
        class_weights=RNG.uniform(-1, 1, len(leaves) * len(classes)).round(2).tolist(),
    )


def _svm_attrs(n_labels: int, proba: bool, seed: int) -> dict:
    # Seeded apart from RNG: with random weights most draws name one class for nearly every
    # row; these seeds give every form several labels on the test's rows.
    rng = np.random.default_rng(seed)
    per = [2, 3, 2][:n_labels]
    vectors, pairs = sum(per), n_labels * (n_labels - 1) // 2
    attrs = dict(
        coefficients=(3 * rng.normal(size=(n_labels - 1) * vectors)).round(2).tolist(),
        support_vectors=rng.normal(size=vectors * 4).round(2).tolist(),
        vectors_per_class=per,
        rho=rng.normal(size=pairs).round(2).tolist(),
        kernel_type="RBF",
        kernel_params=[0.3, 0.0, 3.0],
    )
    if proba:
        attrs.update(prob_a=rng.normal(size=pairs).round(2).tolist(), prob_b=rng.normal(size=pairs).round(2).tolist())
    return attrs


def _linear_attrs(rows: int, post: str) -> dict:
    return dict(coefficients=RNG.normal(size=rows * 4).round(2).tolist(), intercepts=[0.1] * rows, post_transform=post)


# (op, number of labels, attributes): each label rule the ops have.
CLASSIFIERS = {
    "linear_multiclass": ("LinearClassifier", 3, _linear_attrs(3, "SOFTMAX")),
    "linear_binary": ("LinearClassifier", 2, _linear_attrs(1, "LOGISTIC")),
    "linear_one_column": ("LinearClassifier", 1, _linear_attrs(1, "NONE")),
    "svm_probabilities": ("SVMClassifier", 3, _svm_attrs(3, True, 4)),
    "svm_votes": ("SVMClassifier", 3, _svm_attrs(3, False, 4)),
    "svm_binary": ("SVMClassifier", 2, _svm_attrs(2, False, 0)),
    "trees_multiclass": ("TreeEnsembleClassifier", 3, _tree_attrs(3)),
    "trees_one_label": ("TreeEnsembleClassifier", 1, _tree_attrs(1)),
}


def _classifier(op: str, n_labels: int, attrs: dict) -> onnx.ModelProto:
    node = oh.make_node(
        op, ["x"], ["label", "scores"], domain=ML, classlabels_strings=[f"class {k}" for k in range(n_labels)], **attrs
    )
    graph = oh.make_graph(
        [node],
        "g",
        [oh.make_tensor_value_info("x", F, ["N", 4])],
        [
            oh.make_tensor_value_info("label", onnx.TensorProto.STRING, ["N"]),
            oh.make_tensor_value_info("scores", F, None),
        ],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17), oh.make_opsetid(ML, 1)])


# The one-label forms: onnxruntime refuses a LinearClassifier with one string label and aborts
# on such a TreeEnsembleClassifier (the onnx reference refuses both), so their label is checked
# against the op's rule: the name where the score passes 0 (the second column wins), else "".
ONE_LABEL_RULES = {
    "linear_one_column": lambda scores: scores[:, 0] >= 0,
    "trees_one_label": lambda scores: scores.argmax(axis=1) == 1,
}


@pytest.mark.parametrize("name", list(CLASSIFIERS))
def test_string_labels_split_matches_the_whole_classifier_and_onnxruntime(name):
    proto = _classifier(*CLASSIFIERS[name])
    on, off = jonnx.load(proto), jonnx.load(proto, optimize=False)
    x = np.random.default_rng(1).normal(size=(40, 4)).astype(np.float32)
    halves = (x[:20], x[20:])
    whole = [off(rows) for rows in halves]
    on(RNG.normal(size=(20, 4)).astype(np.float32))
    with count_compiles() as compiles:  # the classifier compiles once per shape, not per value
        split = [on(rows) for rows in halves]
    assert not compiles
    assert [on._call_graph.nodes[p].op_type for p in on.segment_plan.host_nodes] == ["LabelEncoder"]
    if name not in ONE_LABEL_RULES:
        session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    for rows, (label, scores), (label_off, scores_off) in zip(halves, split, whole):
        assert label.tolist() == label_off.tolist()
        assert len(set(label.tolist())) > 1  # more than one label in each half: not vacuous
        np.testing.assert_allclose(np.asarray(scores), np.asarray(scores_off), rtol=1e-6, atol=1e-7)
        if name in ONE_LABEL_RULES:
            want = np.where(ONE_LABEL_RULES[name](np.asarray(scores)), "class 0", "")
            assert label.tolist() == want.tolist()
            continue
        want_label, want_scores = session.run(None, {"x": rows})
        assert label.tolist() == want_label.tolist()
        np.testing.assert_allclose(np.asarray(scores), want_scores, rtol=1e-5, atol=1e-6)


def test_string_labels_leave_an_svm_whose_label_is_not_a_lookup():
    # One rho and three labels: the label output is 0 or 1 whatever the labels (as onnxruntime).
    attrs = dict(coefficients=RNG.normal(size=12).round(2).tolist(), rho=[0.2], kernel_type="LINEAR")
    proto = _classifier("SVMClassifier", 3, attrs)
    on, off = jonnx.load(proto), jonnx.load(proto, optimize=False)
    assert [n.op_type for n in on._call_graph.nodes] == ["SVMClassifier"]
    x = RNG.normal(size=(8, 4)).astype(np.float32)
    for a, b in zip(on(x), off(x)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_an_unsplit_svm_with_probabilities_compiles_once_per_shape():
    # optimize=False runs the classifier on the host, op by op: its libsvm solver loop (a
    # while_loop) compiled on every call there, 267 ms a call for this 3-class SVM.
    model = jonnx.load(_classifier(*CLASSIFIERS["svm_probabilities"]), optimize=False)
    x = np.random.default_rng(2).normal(size=(2, 8, 4)).astype(np.float32)
    model(x[0])
    with count_compiles() as compiles:
        model(x[1])
    assert not compiles

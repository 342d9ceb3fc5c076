"""Files written by real exporters (tests/models/exports/, made by tests/models/make_exports.py).

Each recipe of docs/exporting.md is checked here on the file it produces: inference against
onnxruntime (and against what PyTorch or scikit-learn computed when the file was made), and
what fine-tuning finds in the file: running statistics to train, or none left.
"""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import onnx.helper as oh
import onnxruntime as ort
import optax
import pytest

import jonnx
from jonnx import _host_fold as host_fold
from jonnx.training import (
    classification_loss,
    evaluate,
    make_train_step,
    predict,
    supervised_loss,
)
from tests._compiles import count_compiles

EXPORTS = pathlib.Path(__file__).with_name("exports")
TORCH = dict(np.load(EXPORTS / "torch_reference.npz"))
SKLEARN = dict(np.load(EXPORTS / "sklearn_reference.npz"))
STATS = {f"{bn}.{s}" for bn in ("bn", "block.bn1", "block.bn2") for s in ("running_mean", "running_var")}
MOMENTUM = 0.9  # what torch.onnx.export writes for nn.BatchNorm2d's momentum=0.1


def _ort(model: str | bytes | pathlib.Path, **feeds: np.ndarray) -> list[np.ndarray]:
    data = model if isinstance(model, bytes) else str(model)
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)


def _op_types(name: str) -> set[str]:
    return {n.op_type for n in onnx.load(EXPORTS / name).graph.node}


def _task(n: int = 48, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Three classes told apart by which input channel is bright, on a shifted mean."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    x = rng.normal(1.0, 1.0, (n, 3, 8, 8)).astype(np.float32)
    x[np.arange(n), y] += 1.5
    return x, y


def _fine_tune(model: jonnx.Model, x: np.ndarray, y: np.ndarray, steps: int = 20):
    step = make_train_step(model, classification_loss(model, target="y"), optax.adam(0.03))
    ts, losses = step.init(), []
    for i in range(steps):
        ts, metrics = step(ts, {"x": x, "y": y}, jax.random.key(i))
        losses.append(float(metrics["loss"]))
    return ts, losses


# name, whether BatchNormalization (and so running statistics) survived the export
EVAL_EXPORTS = [
    ("resnet_eval_nofold.onnx", True),  # TorchScript, do_constant_folding=False
    ("resnet_eval.onnx", False),  # TorchScript defaults: BN folded into Conv
    ("resnet_dynamo_noopt.onnx", True),  # dynamo=True, optimize=False
    (
        "resnet_dynamo.onnx",
        False,
    ),  # dynamo=True, optimize=True (default): BN folded into Conv
]


@pytest.mark.parametrize("name,has_bn", EVAL_EXPORTS)
def test_eval_exports_infer_like_onnxruntime_and_pytorch(name, has_bn):
    model = jonnx.load(EXPORTS / name)
    x = TORCH["x"]
    (want,) = _ort(EXPORTS / name, x=x)
    (got,) = model(x)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(got), TORCH["eval_logits"], rtol=1e-5, atol=1e-5)
    (got_eval,) = model.apply(model.params, x, train=False)
    np.testing.assert_allclose(np.asarray(got_eval), want, rtol=1e-5, atol=1e-5)

    assert ("BatchNormalization" in _op_types(name)) == has_bn
    assert set(model.state) == (STATS if has_bn else set())
    assert not model.trains_by_default and model.untracked_state == {}


def test_preserve_export_has_training_mode_nodes():
    """What the recipe promises: BN-15 in training mode with three outputs, Dropout-13 with its
    training_mode input, and running statistics as state."""
    proto = onnx.load(EXPORTS / "resnet_preserve.onnx")
    assert {o.domain: o.version for o in proto.opset_import}[""] >= 15
    bns = [n for n in proto.graph.node if n.op_type == "BatchNormalization"]
    assert len(bns) == 3
    for node in bns:
        attrs = {a.name: oh.get_attribute_value(a) for a in node.attribute}
        assert attrs["training_mode"] == 1 and len(node.output) == 3
        assert attrs["momentum"] == pytest.approx(MOMENTUM)
    (dropout,) = [n for n in proto.graph.node if n.op_type == "Dropout"]
    assert len(dropout.input) == 3
    model = jonnx.load(EXPORTS / "resnet_preserve.onnx")
    assert set(model.state) == STATS and model.trains_by_default


def _ort_inference_form(name: str) -> bytes:
    """The training-mode export as onnxruntime runs it for inference: BatchNormalization with
    training_mode=0 and its (unread) statistics outputs removed, Dropout without training_mode."""
    proto = onnx.load(EXPORTS / name)
    for node in proto.graph.node:
        if node.op_type == "BatchNormalization":
            for attr in node.attribute:
                if attr.name == "training_mode":
                    attr.i = 0
            del node.output[1:]
        elif node.op_type == "Dropout":
            del node.input[2:]
    return proto.SerializeToString()


def test_preserve_export_infers_like_onnxruntime_and_pytorch():
    model = jonnx.load(EXPORTS / "resnet_preserve.onnx")
    x = TORCH["x"]
    (want,) = _ort(_ort_inference_form("resnet_preserve.onnx"), x=x)
    (got,) = model.apply(model.params, x, train=False)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(got), TORCH["preserve_eval_logits"], rtol=1e-5, atol=1e-5)
    (predicted,) = predict(model, None, x)
    np.testing.assert_allclose(np.asarray(predicted), want, rtol=1e-5, atol=1e-5)


def test_preserve_export_running_statistics_follow_onnx_not_pytorch():
    """One training-mode pass: the new running statistics equal onnxruntime's (the spec: the
    batch variance is the biased one); PyTorch updates the variance with the unbiased one."""
    model = jonnx.load(EXPORTS / "resnet_preserve.onnx")
    x = TORCH["x"]
    _, new_state = model.apply(model.params, x, train=True, key=jax.random.key(0))

    proto = onnx.load(EXPORTS / "resnet_preserve.onnx")
    order = []
    for node in proto.graph.node:
        if node.op_type == "BatchNormalization":  # expose the new running mean and variance
            proto.graph.output.extend(
                oh.make_tensor_value_info(o, onnx.TensorProto.FLOAT, None) for o in node.output[1:]
            )
            order += [node.input[3], node.input[4]]
    theirs = dict(zip(order, _ort(proto.SerializeToString(), x=x)[1:]))
    assert set(theirs) == STATS
    n = x.shape[0] * x.shape[2] * x.shape[3]  # values per channel in the batch
    for k in STATS:
        np.testing.assert_allclose(np.asarray(new_state[k]), theirs[k], rtol=1e-5, atol=1e-6)
        old, torch_new = np.asarray(model.state[k]), TORCH[f"preserve_after_step/{k}"]
        if k.endswith("mean"):
            np.testing.assert_allclose(np.asarray(new_state[k]), torch_new, rtol=1e-5, atol=1e-6)
        else:  # PyTorch's batch term is n / (n - 1) times the spec's
            np.testing.assert_allclose(
                (torch_new - MOMENTUM * old) * (n - 1) / n,
                np.asarray(new_state[k]) - MOMENTUM * old,
                rtol=1e-4,
                atol=1e-6,
            )
            assert np.abs(torch_new - np.asarray(new_state[k])).max() > 1e-5


def test_preserve_export_fine_tunes_infers_and_saves_for_inference(tmp_path):
    """Issue 9's acceptance on the real PRESERVE export."""
    model = jonnx.load(EXPORTS / "resnet_preserve.onnx")
    x, y = _task()
    ts, losses = _fine_tune(model, x, y)
    assert np.mean(losses[-5:]) < 0.7 * np.mean(losses[:5]), losses
    moved = {k: float(np.abs(np.asarray(ts.state[k]) - np.asarray(model.state[k])).max()) for k in STATS}
    assert min(moved.values()) > 0.05, moved  # every running statistic followed the batches

    (logits,) = model.apply(ts.params, x, state=ts.state, train=False)
    (predicted,) = predict(model, ts, x)
    np.testing.assert_allclose(np.asarray(predicted), np.asarray(logits), rtol=1e-5, atol=1e-5)
    x_test, y_test = _task(24, seed=1)
    metrics = evaluate(model, ts, [{"x": x_test, "y": y_test}], classification_loss(model, target="y"))
    assert metrics["accuracy"] > 0.6, metrics

    path = tmp_path / "tuned.onnx"
    jonnx.save(model, path, params=ts.params, state=ts.state, train=False)
    onnx.checker.check_model(str(path), full_check=True)
    saved = onnx.load(path)
    stored = {t.name: onnx.numpy_helper.to_array(t) for t in saved.graph.initializer}
    for k in STATS:
        np.testing.assert_array_equal(stored[k], np.asarray(ts.state[k]))  # the trained statistics
    reloaded = jonnx.load(path)
    assert not reloaded.trains_by_default and set(reloaded.state) == STATS
    (ours,) = reloaded(x_test)
    (theirs,) = _ort(path, x=x_test)
    (before_save,) = model.apply(ts.params, x_test, state=ts.state, train=False)
    np.testing.assert_allclose(np.asarray(ours), theirs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(theirs, np.asarray(before_save), rtol=1e-5, atol=1e-5)


def test_eval_export_without_constant_folding_trains_its_running_statistics(tmp_path):
    """do_constant_folding=False keeps BatchNormalization; the exporter's deduplication routes
    the three layers' equal scales and shifts through Identity nodes from one initializer each,
    so fine-tuning trains them tied (as the file says), while each layer's statistics are its own."""
    proto = onnx.load(EXPORTS / "resnet_eval_nofold.onnx")
    identities = {n.output[0]: n.input[0] for n in proto.graph.node if n.op_type == "Identity"}
    assert identities == {f"block.bn{i}.{p}": f"bn.{p}" for i in (1, 2) for p in ("weight", "bias")}
    model = jonnx.load(proto)
    assert set(model.state) == STATS and model.untracked_state == {}
    assert {"bn.weight", "bn.bias"} <= set(model.params) and not set(identities) & set(model.params)

    x, y = _task()
    ts, losses = _fine_tune(model, x, y)
    assert np.mean(losses[-5:]) < 0.7 * np.mean(losses[:5]), losses
    for k in STATS:
        assert np.abs(np.asarray(ts.state[k]) - np.asarray(model.state[k])).max() > 0.05, k
    (logits,) = model.apply(ts.params, x, state=ts.state, train=False)
    (theirs,) = _ort(_with_initializers(proto, ts.params | ts.state), x=x)
    np.testing.assert_allclose(np.asarray(logits), theirs, rtol=1e-5, atol=1e-5)
    path = tmp_path / "tuned.onnx"
    jonnx.save(model, path, params=ts.params, state=ts.state)
    (saved,) = _ort(path, x=x)
    np.testing.assert_allclose(saved, theirs, rtol=1e-5, atol=1e-5)


def _with_initializers(proto: onnx.ModelProto, values) -> bytes:
    """``proto`` with the initializers in ``values`` replaced (written with onnx, not jonnx.save)."""
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    for t in out.graph.initializer:
        if t.name in values:
            t.CopyFrom(onnx.numpy_helper.from_array(np.asarray(values[t.name], np.float32), t.name))
    return out.SerializeToString()


@pytest.mark.parametrize("name", ["resnet_eval.onnx", "resnet_dynamo.onnx"])
def test_folded_exports_fine_tune_without_running_statistics(name):
    """BatchNormalization folded into Conv: nothing to switch to training mode, the merged
    weights train like any others, and train=True changes nothing."""
    model = jonnx.load(EXPORTS / name)
    x, y = _task(16)
    (eval_out,) = model.apply(model.params, x, train=False)
    (train_out,), new_state = model.apply(model.params, x, train=True, key=jax.random.key(0))
    assert new_state == {}
    if "Dropout" not in _op_types(name):
        # Equal up to float rounding: inference runs channels-last, training runs NCHW
        # (jonnx/optimize/layout.py), so the sums are taken in another order.
        np.testing.assert_allclose(np.asarray(train_out), np.asarray(eval_out), rtol=1e-6, atol=1e-6)
    _, losses = _fine_tune(model, x, y, steps=10)
    assert losses[-1] < losses[0], losses


@pytest.mark.parametrize("name", ["logreg", "mlp"])
def test_sklearn_exports_match_onnxruntime_and_scikit_learn(name):
    path = EXPORTS / f"sklearn_{name}.onnx"
    model = jonnx.load(path)
    x = SKLEARN["x"]
    assert model.output_names == (
        "label",
        "probabilities",
    )  # zipmap=False: plain tensors
    label, proba = model(x)
    want_label, want_proba = _ort(path, X=x)
    np.testing.assert_array_equal(np.asarray(label), want_label)
    np.testing.assert_allclose(np.asarray(proba), want_proba, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(label), SKLEARN[f"{name}/predict"])
    np.testing.assert_allclose(np.asarray(proba), SKLEARN[f"{name}/predict_proba"], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["forest_binary", "boosting_binary", "boosting"])
def test_sklearn_tree_classifiers_match_onnxruntime_and_scikit_learn(name):
    # TreeEnsembleClassifier as skl2onnx writes it: in the binary forms onnxruntime's rules for
    # the second column and the onnx reference's (which jonnx follows) could differ; here they
    # must not (tests/conformance/fuzz.py, the ml family, lists where they do).
    path = EXPORTS / f"sklearn_{name}.onnx"
    x = SKLEARN["x"]
    model = jonnx.load(path)
    label, proba = model(x)
    # With string labels (boosting_binary) the classifier runs on the host, op by op: its tree
    # walk must still compile once per shape, not on every call.
    with count_compiles() as compiles:
        model(x[::-1].copy())
    assert not compiles
    want_label, want_proba = _ort(path, X=x)
    np.testing.assert_array_equal(np.asarray(label).astype(str), want_label.astype(str))
    np.testing.assert_allclose(np.asarray(proba), want_proba, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(label).astype(str), SKLEARN[f"{name}/predict"].astype(str))
    np.testing.assert_allclose(np.asarray(proba), SKLEARN[f"{name}/predict_proba"], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["mlp_names", "knn_names"])
def test_sklearn_string_labels_match_onnxruntime_and_scikit_learn(name, monkeypatch):
    # skl2onnx looks string labels up by ArgMax then ArrayFeatureExtractor over the class
    # names; the neighbours' labels are strings gathered by TopK's indices and compared with
    # Equal. Those nodes run on the host; the rest compiles once per shape, not per label.
    path = EXPORTS / f"sklearn_{name}.onnx"
    x = SKLEARN["x"]
    model = jonnx.load(path)
    label, proba = model(x)
    want_label, want_proba = _ort(path, X=x)
    assert label.tolist() == want_label.tolist() == SKLEARN[f"{name}/predict"].tolist()
    np.testing.assert_allclose(np.asarray(proba), want_proba, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(proba), SKLEARN[f"{name}/predict_proba"], rtol=1e-4, atol=1e-5)
    assert "ArrayFeatureExtractor" in [model._call_graph.nodes[p].op_type for p in model.segment_plan.host_nodes]
    model(x[:5])
    with count_compiles() as compiles:
        for rows in (x[5:10], x[10:15], x[15:]):  # other labels, the same shape
            label, _ = model(rows)
            assert label.tolist() == _ort(path, X=rows)[0].tolist()
    assert not compiles
    # The host nodes read strings: they run directly, never traced first (a trace of a node
    # that makes strings fails, and failing through JAX cost milliseconds on every call).
    traced = []
    trace = host_fold.trace
    monkeypatch.setattr(host_fold, "trace", lambda fn: traced.append(fn) or trace(fn))
    model(x[5:10])
    assert not traced


@pytest.mark.parametrize("name", ["count_text", "tfidf_text"])
def test_sklearn_text_vectorizers_match_onnxruntime_and_scikit_learn(name):
    # StringNormalizer, com.microsoft Tokenizer and TfIdfVectorizer on strings, as skl2onnx
    # writes CountVectorizer and TfidfVectorizer.
    path = EXPORTS / f"sklearn_{name}.onnx"
    text = SKLEARN["text/test"].astype(object).reshape(-1, 1)
    (got,) = jonnx.load(path)(text)
    np.testing.assert_allclose(np.asarray(got), SKLEARN[f"{name}/transform"], rtol=1e-5, atol=1e-6)
    # onnxruntime's StringNormalizer needs its locale (en_US.UTF-8 by default) installed,
    # which machines without language packs lack: it runs the same model with C.UTF-8.
    proto = onnx.load(path)
    for node in proto.graph.node:
        if node.op_type == "StringNormalizer":
            node.attribute.append(oh.make_attribute("locale", "C.UTF-8"))
    (want,) = _ort(proto.SerializeToString(), text=text)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)


def test_sklearn_forest_regressor_matches_onnxruntime_and_scikit_learn():
    path = EXPORTS / "sklearn_forest_regressor.onnx"
    x = SKLEARN["x"][:, :3]
    (got,) = jonnx.load(path)(x)
    (want,) = _ort(path, X=x)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(got).ravel(), SKLEARN["forest_regressor/predict"], rtol=1e-5, atol=1e-5)


def test_sklearn_mlp_fine_tunes():
    """skl2onnx writes an MLPClassifier's weights as initializers: they are params that train
    (LinearClassifier's coefficients, in the logistic regression, are attributes: constants)."""
    mlp = jonnx.load(EXPORTS / "sklearn_mlp.onnx")
    assert len(mlp.params) == 4
    assert jonnx.load(EXPORTS / "sklearn_logreg.onnx").params == {}

    x = SKLEARN["x"]
    flipped = 2 - SKLEARN["mlp/predict"]  # a new task: relabel the classes

    def nll(p, label):
        return -jnp.log(jnp.maximum(p[label], 1e-7))

    step = make_train_step(
        mlp,
        supervised_loss(mlp, jax.vmap(nll), output="probabilities", target="y"),
        optax.adam(0.05),
    )
    ts = step.init()
    for i in range(60):
        ts, _ = step(ts, {"X": x, "y": flipped}, jax.random.key(i))
    label, _ = mlp.apply(ts.params, x)
    assert np.mean(np.asarray(label) == flipped) > 0.9


KERAS = dict(np.load(EXPORTS / "keras_reference.npz"))


@pytest.mark.parametrize("name,n_state", [("keras_cnn", 0), ("keras2_cnn_bn", 2)])
def test_keras_exports_match_onnxruntime_and_keras(name, n_state):
    path = EXPORTS / f"{name}.onnx"
    model = jonnx.load(path)
    x = KERAS["x"]
    (got,) = model(x)
    (want,) = _ort(path, x=x)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(got), KERAS[name], rtol=1e-5, atol=1e-5)
    assert len(model.state) == n_state and model.untracked_state == {}
    assert "Dropout" not in _op_types(f"{name}.onnx")  # tf2onnx converts the inference graph


def test_keras_batch_norm_kept_trains_with_onnx_default_momentum():
    """tf2onnx writes no momentum: training uses ONNX's default 0.9, not Keras's 0.99."""
    model = jonnx.load(EXPORTS / "keras2_cnn_bn.onnx")
    (bn,) = [n for n in onnx.load(EXPORTS / "keras2_cnn_bn.onnx").graph.node if n.op_type == "BatchNormalization"]
    assert "momentum" not in {a.name for a in bn.attribute}
    x = KERAS["x"]
    _, new_state = model.apply(model.params, x, train=True)
    mean_key = bn.input[3]
    batch_mean = np.mean(np.asarray(_conv_output(x)), axis=(0, 2, 3))
    want = 0.9 * np.asarray(model.state[mean_key]) + 0.1 * batch_mean
    np.testing.assert_allclose(np.asarray(new_state[mean_key]), want, rtol=1e-5, atol=1e-6)


def _conv_output(x: np.ndarray) -> np.ndarray:
    """The BatchNormalization's input, computed by onnxruntime from the file with it as an output."""
    proto = onnx.load(EXPORTS / "keras2_cnn_bn.onnx")
    (bn,) = [n for n in proto.graph.node if n.op_type == "BatchNormalization"]
    proto.graph.output.append(oh.make_tensor_value_info(bn.input[0], onnx.TensorProto.FLOAT, None))
    return _ort(proto.SerializeToString(), x=x)[1]


def test_transformers_export_matches_onnxruntime_and_pytorch_and_fine_tunes():
    """A BERT classifier exported by the TorchScript exporter in eval mode: no Dropout, no
    running statistics; every weight a param; runs at another sequence length than exported."""
    path = EXPORTS / "bert_tiny.onnx"
    ref = dict(np.load(EXPORTS / "bert_reference.npz"))
    model = jonnx.load(path)
    feeds = {"input_ids": ref["input_ids"], "attention_mask": ref["attention_mask"]}
    (got,) = model(**feeds)
    (want,) = _ort(path, **feeds)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(got), ref["logits"], rtol=1e-5, atol=1e-5)
    assert model.state == {} and "Dropout" not in _op_types("bert_tiny.onnx")
    assert any("word_embeddings" in k for k in model.params)

    step = make_train_step(model, classification_loss(model, target="y"), optax.adam(0.05))
    ts, losses = step.init(), []
    for i in range(8):
        ts, metrics = step(ts, {**feeds, "y": np.array([0, 1, 2])}, jax.random.key(i))
        losses.append(float(metrics["loss"]))
    assert losses[-1] < 0.5 * losses[0], losses

"""Make the small real exports in tests/models/exports/ (run offline; the tests never import it).

The files are what real exporters write, so tests/models/test_exports.py checks jonnx against
them rather than against graphs built to resemble them. Each recipe in docs/exporting.md is
one of these calls. Made with (CPU, Python 3.11):

    torch 2.13.0+cpu, onnxscript 0.7.2, onnx 1.23.2, onnxruntime 1.32.0,
    scikit-learn 1.9.1, skl2onnx 1.20.0, transformers 5.24.0;
    in another venv: tensorflow 2.21.0, keras 3.15.1, tf-keras 2.21.0, tf2onnx 1.17.0

The network is a small ResNet-style CNN (a stem conv-bn-relu, one residual block of two
conv-bn, global average pooling, dropout, a linear head; 4 channels, 3 classes, input
``x`` [N, 3, 8, 8] with a dynamic batch axis). Its BatchNormalization layers keep the
freshly initialized scale and shift (ones and zeros, as in a model built to be fine-tuned)
and running statistics set to other values than the initial ones, so that inference
visibly depends on them:

* ``resnet_preserve.onnx``: TorchScript exporter, model in train mode,
  ``training=TrainingMode.PRESERVE``: BatchNormalization-15 with ``training_mode=1`` and
  three outputs, Dropout-13 with ``ratio`` and ``training_mode`` inputs.
* ``resnet_eval_nofold.onnx``: TorchScript exporter, eval mode, ``do_constant_folding=False``:
  BatchNormalization in inference mode with its running statistics as initializers; equal
  initializers are deduplicated, so the three layers' (equal) scales and shifts reach them
  through ``Identity`` nodes from one initializer each.
* ``resnet_eval.onnx``: TorchScript exporter, eval mode, defaults: constant folding merges
  each BatchNormalization into the Conv before it, so no running statistics are left.
* ``resnet_dynamo.onnx``: the ``torch.export``-based exporter (``dynamo=True``), eval mode,
  ``optimize=True`` (its default): its optimizer also merges BatchNormalization into Conv.
* ``resnet_dynamo_noopt.onnx``: the same with ``optimize=False``: BatchNormalization (in
  inference mode) and its running statistics stay.
* ``sklearn_logreg.onnx``: skl2onnx, ``StandardScaler`` + ``LogisticRegression`` on 4
  features, 3 classes, ``zipmap=False`` (outputs ``label`` int64 [N] and
  ``probabilities`` float [N, 3]); ai.onnx.ml ``Scaler`` and ``LinearClassifier``.
* ``sklearn_mlp.onnx``: skl2onnx, ``MLPClassifier`` (one hidden layer of 8) on the same data,
  ``zipmap=False``: MatMul/Add/Relu/Softmax with the weights as initializers.
* ``sklearn_forest_binary.onnx``, ``sklearn_boosting_binary.onnx`` (string labels),
  ``sklearn_boosting.onnx`` (3 classes), ``sklearn_forest_regressor.onnx``: skl2onnx, small
  ``RandomForestClassifier``/``GradientBoostingClassifier``/``RandomForestRegressor`` (5 trees)
  on the same data (the binary ones on ``y % 2``, the regressor predicting feature 3 from the
  others), ``zipmap=False``: ai.onnx.ml TreeEnsembleClassifier/Regressor in the forms skl2onnx
  writes, where onnxruntime's binary-classifier rules and the onnx reference's could differ.
* ``sklearn_mlp_names.onnx``, ``sklearn_knn_names.onnx``: skl2onnx, ``MLPClassifier`` and
  ``KNeighborsClassifier`` (3 neighbours) trained on class *names* (strings), ``zipmap=False``:
  skl2onnx looks the label up with ``ArgMax`` then ``ArrayFeatureExtractor`` over a string
  initializer, then ``Reshape``; the neighbours' labels are gathered as strings by ``TopK``'s
  indices and compared with ``Equal`` against each class name (strings meeting runtime data,
  which jonnx runs on the host).
* ``sklearn_count_text.onnx``, ``sklearn_tfidf_text.onnx``: skl2onnx, ``CountVectorizer`` and
  ``TfidfVectorizer`` (unigrams) fitted on :data:`TEXTS`, input ``text`` string [N, 1]:
  ``StringNormalizer`` (lower case), com.microsoft ``Tokenizer``, ``TfIdfVectorizer`` and,
  for tf-idf, the idf weights and ``Normalizer``. (With bigrams skl2onnx's tokens keep the
  one-letter words scikit-learn drops, so its bigrams differ from scikit-learn's.)

* ``bert_tiny.onnx``: transformers' ``BertForSequenceClassification`` (one layer, width 16,
  vocabulary 50, 3 labels, random weights), TorchScript exporter in eval mode, with dynamic
  batch and sequence axes: ``input_ids``, ``attention_mask`` int64 [B, T] -> ``logits`` [B, 3].
* ``keras_cnn.onnx``: tf2onnx ``from_keras`` (defaults) of a Keras 3 CNN (conv, batch norm,
  relu, global pooling, dropout, dense; input ``x`` [N, 8, 8, 3] channels-last): Keras 3
  writes batch normalization as multiplies and adds, which tf2onnx folds into the Conv;
  Dropout is gone, and so is the Dense layer's all-zero bias.
* ``keras2_cnn_bn.onnx``: the same network in tf-keras (Keras 2), converted without tf2onnx's
  ``remove_back_to_back`` optimizer: BatchNormalization (inference mode, no ``momentum``
  attribute, so ONNX's default 0.9 where Keras used 0.99) stays. Its statistics are set to
  distinct values: equal initializers would be merged (see docs/exporting.md).

The training data of the scikit-learn models is :func:`iris_like` (synthetic, seeded).
``*_reference.npz`` hold what PyTorch, scikit-learn and Keras computed on test inputs.

Usage: ``python tests/models/make_exports.py [OUTPUT_DIR] [GROUPS]`` with GROUPS a comma-separated
subset of ``torch,sklearn,transformers,keras`` (default all; the Keras group runs in its own venv). None of
these packages is a dependency of jonnx or its tests.
"""

from __future__ import annotations

import copy
import pathlib
import sys

import numpy as np

OUT = pathlib.Path(__file__).with_name("exports")
CLASSES = 3
# A small corpus for the text vectorizers: upper and lower case, repeats, one-letter words.
TEXTS = [
    "The cat sat on the mat",
    "the DOG sat down",
    "A cat and a dog",
    "dog eat dog world",
    "sat sat sat",
    "Mat, cat; DOG!",
]


def iris_like(n: int = 150, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Three Gaussian classes in 4 features of different scales (what StandardScaler is for)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, CLASSES, n)
    centers = np.array([[5.0, 3.4, 1.5, 0.2], [5.9, 2.8, 4.3, 1.3], [6.6, 3.0, 5.5, 2.0]])
    x = centers[y] + rng.normal(0, [0.4, 0.3, 0.5, 0.2], (n, 4))
    return x.astype(np.float32), y.astype(np.int64)


def _torch_exports(out: pathlib.Path) -> None:
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, c: int):
            super().__init__()
            self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(c)
            self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(c)

        def forward(self, x):
            y = torch.relu(self.bn1(self.conv1(x)))
            return torch.relu(self.bn2(self.conv2(y)) + x)

    class Net(nn.Module):
        def __init__(self, c: int = 4):
            super().__init__()
            self.conv = nn.Conv2d(3, c, 3, padding=1, bias=False)
            self.bn = nn.BatchNorm2d(c)
            self.block = Block(c)
            self.drop = nn.Dropout(0.25)
            self.fc = nn.Linear(c, CLASSES)

        def forward(self, x):
            x = torch.relu(self.bn(self.conv(x)))
            x = self.block(x)
            x = torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1)
            return self.fc(self.drop(x))

    torch.manual_seed(0)
    net = Net()
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
    x = torch.randn(2, 3, 8, 8)
    names = {"input_names": ["x"], "output_names": ["logits"]}
    axes = {"dynamic_axes": {"x": {0: "N"}, "logits": {0: "N"}}}

    # Tracing runs the forward pass, which in train mode updates the running statistics (the
    # file holds the updated ones): export a copy, so the eval exports see the original ones.
    torch.onnx.export(
        copy.deepcopy(net).train(),
        (x,),
        out / "resnet_preserve.onnx",
        dynamo=False,
        **names,
        **axes,
        training=torch.onnx.TrainingMode.PRESERVE,
        do_constant_folding=False,
    )
    net.eval()
    torch.onnx.export(
        net,
        (x,),
        out / "resnet_eval_nofold.onnx",
        dynamo=False,
        **names,
        **axes,
        do_constant_folding=False,
    )
    torch.onnx.export(net, (x,), out / "resnet_eval.onnx", dynamo=False, **names, **axes)
    shapes = {"dynamic_shapes": {"x": {0: torch.export.Dim("N")}}}
    for optimize, name in (
        (True, "resnet_dynamo.onnx"),
        (False, "resnet_dynamo_noopt.onnx"),
    ):
        program = torch.onnx.export(net, (x,), dynamo=True, optimize=optimize, **names, **shapes)
        program.save(str(out / name))

    # What PyTorch itself computes, for the tests: eval-mode logits of the eval exports, and of
    # the training-mode export with the statistics it holds; one training-mode forward pass of
    # the latter (its new running statistics, by PyTorch's momentum rule and unbiased variance).
    test_x = torch.from_numpy(np.random.default_rng(1).standard_normal((5, 3, 8, 8)).astype(np.float32))
    preserve = Net()
    preserve.load_state_dict(
        {k: torch.from_numpy(v.copy()) for k, v in _initializers(out / "resnet_preserve.onnx").items()}
        | {k: v for k, v in net.state_dict().items() if "num_batches" in k}
    )
    with torch.no_grad():
        refs = {
            "x": test_x,
            "eval_logits": net(test_x),
            "preserve_eval_logits": preserve.eval()(test_x),
        }
        preserve.train()(test_x)
    refs.update({f"preserve_after_step/{k}": v for k, v in preserve.state_dict().items() if "running" in k})
    np.savez(out / "torch_reference.npz", **{k: v.numpy() for k, v in refs.items()})


def _initializers(path: pathlib.Path) -> dict[str, np.ndarray]:
    import onnx
    import onnx.numpy_helper

    return {t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(path).graph.initializer}


def _sklearn_exports(out: pathlib.Path) -> None:
    from skl2onnx import to_onnx
    from skl2onnx.common.data_types import StringTensorType
    from sklearn.ensemble import GradientBoostingClassifier, RandomForestClassifier, RandomForestRegressor
    from sklearn.feature_extraction.text import CountVectorizer, TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.neighbors import KNeighborsClassifier
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x, y = iris_like()
    options = {"zipmap": False}
    logreg = make_pipeline(StandardScaler(), LogisticRegression(max_iter=500)).fit(x, y)
    onx = to_onnx(
        logreg,
        x[:1],
        options={id(logreg.steps[-1][1]): options},
        target_opset={"": 17, "ai.onnx.ml": 3},
    )
    (out / "sklearn_logreg.onnx").write_bytes(onx.SerializeToString())
    mlp = MLPClassifier(hidden_layer_sizes=(8,), max_iter=300, random_state=0).fit(x, y)
    onx = to_onnx(mlp, x[:1], options={id(mlp): options}, target_opset={"": 17, "ai.onnx.ml": 3})
    (out / "sklearn_mlp.onnx").write_bytes(onx.SerializeToString())
    # Tree ensembles in the forms skl2onnx writes them (ai.onnx.ml TreeEnsembleClassifier and
    # Regressor): a binary forest (one column of probabilities, post_transform NONE), binary
    # boosting with string labels (one column of scores, LOGISTIC, one base value), 3-class
    # boosting (SOFTMAX, a base value per class), a regression forest.
    binary = y % 2
    trees = {
        "forest_binary": RandomForestClassifier(5, max_depth=4, random_state=0).fit(x, binary),
        "boosting_binary": GradientBoostingClassifier(n_estimators=5, max_depth=3, random_state=0).fit(
            x, np.array(["no", "yes"])[binary]
        ),
        "boosting": GradientBoostingClassifier(n_estimators=5, max_depth=3, random_state=0).fit(x, y),
        "forest_regressor": RandomForestRegressor(5, max_depth=4, random_state=0).fit(x[:, :3], x[:, 3]),
    }
    for name, est in trees.items():
        columns = x[:1, :3] if name == "forest_regressor" else x[:1]
        onx = to_onnx(est, columns, options={id(est): options} if name != "forest_regressor" else None,
                      target_opset={"": 17, "ai.onnx.ml": 3})  # fmt: skip
        (out / f"sklearn_{name}.onnx").write_bytes(onx.SerializeToString())
    # Trained on class names: skl2onnx's label lookup over strings.
    names = np.array(["setosa", "versicolor", "virginica"])[y]
    by_name = {
        "mlp_names": MLPClassifier(hidden_layer_sizes=(8,), max_iter=300, random_state=0).fit(x, names),
        "knn_names": KNeighborsClassifier(3).fit(x, names),
    }
    for name, est in by_name.items():
        onx = to_onnx(est, x[:1], options={id(est): options}, target_opset={"": 17, "ai.onnx.ml": 3})
        (out / f"sklearn_{name}.onnx").write_bytes(onx.SerializeToString())
    test_x, _ = iris_like(20, seed=1)
    classifiers = {
        "logreg": logreg,
        "mlp": mlp,
        **{k: v for k, v in trees.items() if k != "forest_regressor"},
        **by_name,
    }
    np.savez(
        out / "sklearn_reference.npz",
        x=test_x,
        **{
            f"{name}/{what}": getattr(est, what)(test_x)
            for name, est in classifiers.items()
            for what in ("predict", "predict_proba")
        },
        **{"forest_regressor/predict": trees["forest_regressor"].predict(test_x[:, :3])},
        **_text_exports(out, CountVectorizer, TfidfVectorizer, StringTensorType, to_onnx),
    )


def _text_exports(out: pathlib.Path, *classes) -> dict[str, np.ndarray]:
    """The text vectorizers' files; returns their references (the corpus and a new text)."""
    count_vectorizer, tfidf_vectorizer, string_tensor_type, to_onnx = classes
    texts = np.array(TEXTS)
    test = np.array(["the cat and THE dog", "zebra", "", "sat on a mat"])
    found = {"text/fit": texts, "text/test": test}
    for name, vec in {"count_text": count_vectorizer(), "tfidf_text": tfidf_vectorizer()}.items():
        vec.fit(texts)
        onx = to_onnx(
            vec, initial_types=[("text", string_tensor_type([None, 1]))], target_opset={"": 17, "ai.onnx.ml": 3}
        )
        (out / f"sklearn_{name}.onnx").write_bytes(onx.SerializeToString())
        found[f"{name}/transform"] = vec.transform(test).toarray().astype(np.float32)
    return found


def _keras_exports(out: pathlib.Path) -> None:
    import tensorflow as tf
    import tf2onnx
    import tf_keras

    def build(keras):
        keras.utils.set_random_seed(0)
        inp = keras.Input((8, 8, 3), name="x")
        h = keras.layers.Conv2D(4, 3, padding="same", use_bias=False)(inp)
        h = keras.layers.BatchNormalization()(h)
        h = keras.layers.ReLU()(h)
        h = keras.layers.GlobalAveragePooling2D()(h)
        h = keras.layers.Dropout(0.25)(h)
        model = keras.Model(inp, keras.layers.Dense(CLASSES)(h))
        bn = model.layers[2]  # trained-looking values, all different (see _tf2onnx_keep_bn)
        rng = np.random.default_rng(0)
        bn.set_weights(
            [
                rng.uniform(0.5, 1.5, 4),
                rng.normal(0, 0.2, 4),
                rng.normal(0, 0.5, 4),
                rng.uniform(0.5, 2, 4),
            ]
        )
        return model

    spec = (tf.TensorSpec((None, 8, 8, 3), tf.float32, name="x"),)
    test_x = np.random.default_rng(1).standard_normal((5, 8, 8, 3)).astype(np.float32)
    refs = {"x": test_x}
    keras3 = build(tf.keras)
    onx, _ = tf2onnx.convert.from_keras(keras3, input_signature=spec, opset=17)
    (out / "keras_cnn.onnx").write_bytes(onx.SerializeToString())
    refs["keras_cnn"] = keras3(test_x, training=False).numpy()
    keras2 = build(tf_keras)
    # tf2onnx's remove_back_to_back optimizer folds BatchNormalization into the Conv before it.
    keep_bn = {k: v for k, v in tf2onnx.optimizer._get_optimizers().items() if k != "remove_back_to_back"}
    onx, _ = tf2onnx.convert.from_keras(keras2, input_signature=spec, opset=17, optimizers=keep_bn)
    (out / "keras2_cnn_bn.onnx").write_bytes(onx.SerializeToString())
    refs["keras2_cnn_bn"] = keras2(test_x, training=False).numpy()
    np.savez(out / "keras_reference.npz", **refs)


def _transformers_exports(out: pathlib.Path) -> None:
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        num_labels=3,
    )
    model = BertForSequenceClassification(config).eval()  # from_pretrained returns eval mode too
    ids = torch.ones(1, 8, dtype=torch.long)
    mask = torch.ones(1, 8, dtype=torch.long)
    torch.onnx.export(
        model,
        (ids, mask),
        out / "bert_tiny.onnx",
        dynamo=False,
        input_names=["input_ids", "attention_mask"],
        output_names=["logits"],
        dynamic_axes={
            "input_ids": {0: "B", 1: "T"},
            "attention_mask": {0: "B", 1: "T"},
            "logits": {0: "B"},
        },
    )
    rng = np.random.default_rng(1)
    test_ids = rng.integers(0, 50, (3, 11))
    test_mask = np.ones((3, 11), np.int64)
    test_mask[1, 7:] = 0  # a padded sequence
    with torch.no_grad():
        logits = model(torch.from_numpy(test_ids), torch.from_numpy(test_mask)).logits.numpy()
    np.savez(
        out / "bert_reference.npz",
        input_ids=test_ids,
        attention_mask=test_mask,
        logits=logits,
    )


GROUPS = {
    "torch": _torch_exports,
    "sklearn": _sklearn_exports,
    "transformers": _transformers_exports,
    "keras": _keras_exports,
}


def main(out: pathlib.Path = OUT, groups: list[str] | None = None) -> None:
    import warnings

    out.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        for group in groups or list(GROUPS):
            GROUPS[group](out)
    for path in sorted(out.glob("*.onnx")):
        print(f"{path.name}: {path.stat().st_size} bytes")


if __name__ == "__main__":
    main(
        pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else OUT,
        sys.argv[2].split(",") if len(sys.argv) > 2 else None,
    )

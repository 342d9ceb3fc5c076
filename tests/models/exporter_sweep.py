"""Exporter sweep: many small models from skl2onnx and PyTorch's two exporters, each run
through jonnx, onnxruntime and the framework that made it.

A developer's tool, not a test: the frameworks are not dependencies of jonnx or its tests,
so it runs in two steps, in two environments::

    python tests/models/exporter_sweep.py make sklearn OUT   # scikit-learn, skl2onnx, numpy, pandas
    python tests/models/exporter_sweep.py make torch OUT     # torch (onnxscript for dynamo)
    python tests/models/exporter_sweep.py check OUT [--time] # jonnx's environment

``make`` writes ``OUT/<group>_<name>.onnx`` and ``OUT/<group>.pkl`` (the inputs and what the
framework computed; a local pickle, read back only by ``check``). ``check`` prints one line
per model: whether jonnx's outputs equal onnxruntime's and the framework's, and the
error when jonnx refuses a model. The last results are in docs/exporting.md ("Exporter
sweep"). With ``--time`` each line also gives jonnx's default call against onnxruntime's, in
ms, at the sweep's inputs and (scikit-learn's models) at 2,000 rows.
"""

from __future__ import annotations

import pathlib
import pickle
import statistics
import sys
import time
import warnings

import numpy as np


def _sklearn(out: pathlib.Path) -> None:
    from skl2onnx import to_onnx
    from sklearn import (
        cluster,
        decomposition,
        ensemble as E,
        impute,
        linear_model as L,
        mixture,
        naive_bayes,
        neighbors,
        preprocessing as P,
        svm,
        tree,
    )
    from sklearn.base import clone
    from sklearn.calibration import CalibratedClassifierCV
    from sklearn.cross_decomposition import PLSRegression
    from sklearn.feature_selection import SelectKBest
    from sklearn.neural_network import MLPClassifier

    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    from make_exports import iris_like

    x, y = iris_like(120)
    test, _ = iris_like(15, seed=3)
    value = x[:, 3] * 2 + x[:, 0]  # a regression target
    # (estimator, fit inputs, fit targets): classifiers on 3 classes, "_bin" on 2.
    cases = {
        "StandardScaler": (P.StandardScaler(), x, None),
        "MinMaxScaler": (P.MinMaxScaler(), x, None),
        "MaxAbsScaler": (P.MaxAbsScaler(), x, None),
        "RobustScaler": (P.RobustScaler(), x, None),
        "Normalizer_max": (P.Normalizer(norm="max"), x - 5, None),
        "Normalizer_l1": (P.Normalizer(norm="l1"), x - 5, None),
        "Binarizer": (P.Binarizer(threshold=3.0), x, None),
        "PolynomialFeatures": (P.PolynomialFeatures(2), x, None),
        "KBinsDiscretizer_onehot": (P.KBinsDiscretizer(3, encode="onehot-dense"), x, None),
        "KBinsDiscretizer_ordinal": (P.KBinsDiscretizer(3, encode="ordinal"), x, None),
        "PowerTransformer": (P.PowerTransformer(), x, None),
        "SimpleImputer": (impute.SimpleImputer(), np.where(x > 6, np.nan, x).astype(np.float32), None),
        "PCA": (decomposition.PCA(2), x, None),
        "TruncatedSVD": (decomposition.TruncatedSVD(2), x, None),
        "KernelPCA": (decomposition.KernelPCA(2, kernel="rbf"), x, None),
        "LinearRegression": (L.LinearRegression(), x, value),
        "Ridge": (L.Ridge(), x, value),
        "Lasso": (L.Lasso(0.01), x, value),
        "LogisticRegression_bin": (L.LogisticRegression(), x, y % 2),
        "LogisticRegression": (L.LogisticRegression(max_iter=300), x, y),
        "SGDClassifier": (L.SGDClassifier(random_state=0), x, y),
        "Perceptron": (L.Perceptron(), x, y),
        "LinearSVC": (svm.LinearSVC(), x, y),
        "LinearSVR": (svm.LinearSVR(), x, value),
        "SVC_bin": (svm.SVC(), x, y % 2),
        "SVC": (svm.SVC(), x, y),
        "SVC_prob": (svm.SVC(probability=True, random_state=0), x, y),
        "SVC_bin_prob": (svm.SVC(probability=True, random_state=0), x, y % 2),
        "SVR": (svm.SVR(), x, value),
        "NuSVC": (svm.NuSVC(), x, y),
        "OneClassSVM": (svm.OneClassSVM(), x, None),
        "DecisionTreeRegressor": (tree.DecisionTreeRegressor(max_depth=4), x, value),
        "DecisionTreeClassifier": (tree.DecisionTreeClassifier(max_depth=4), x, y),
        "ExtraTreesClassifier": (E.ExtraTreesClassifier(5, max_depth=4, random_state=0), x, y),
        "AdaBoostClassifier": (E.AdaBoostClassifier(n_estimators=5, random_state=0), x, y),
        "AdaBoostRegressor": (E.AdaBoostRegressor(n_estimators=5, random_state=0), x, value),
        "IsolationForest": (E.IsolationForest(n_estimators=5, random_state=0), x, None),
        "BaggingClassifier": (E.BaggingClassifier(n_estimators=3, random_state=0), x, y),
        "GaussianNB": (naive_bayes.GaussianNB(), x, y),
        "MultinomialNB": (naive_bayes.MultinomialNB(), np.abs(x), y),  # counts: not negative
        "BernoulliNB": (naive_bayes.BernoulliNB(binarize=5.0), x, y),
        "KNeighborsRegressor": (neighbors.KNeighborsRegressor(3), x, value),
        "KMeans": (cluster.KMeans(3, n_init=2, random_state=0), x, None),
        "GaussianMixture": (mixture.GaussianMixture(2, random_state=0), x, None),
        "CalibratedClassifierCV": (CalibratedClassifierCV(L.LogisticRegression(max_iter=300), cv=2), x, y),
        "PLSRegression": (PLSRegression(2), x, value),
        "SelectKBest": (SelectKBest(k=2), x, y),
        "VotingRegressor": (
            E.VotingRegressor([("a", L.Ridge()), ("b", tree.DecisionTreeRegressor(max_depth=3))]),
            x,
            value,
        ),
        "StackingClassifier": (
            E.StackingClassifier(
                [("a", L.LogisticRegression(max_iter=300)), ("b", tree.DecisionTreeClassifier(max_depth=3))]
            ),
            x,
            y,
        ),
    }
    # Classifiers again with classes named by strings: other converter paths (labels through
    # ArrayFeatureExtractor, or the ML classifiers' classlabels_strings) and, with --time,
    # the host lookups that strings need.
    names = np.array(["setosa", "versicolor", "virginica"])
    for name in (
        "LogisticRegression",
        "LogisticRegression_bin",
        "LinearSVC",
        "SVC",
        "SVC_prob",
        "SVC_bin_prob",
        "DecisionTreeClassifier",
        "ExtraTreesClassifier",
        "GaussianNB",
        "CalibratedClassifierCV",
    ):
        est, fit_x, fit_y = cases[name]
        cases[f"{name}_names"] = (clone(est), fit_x, names[fit_y])
    cases["MLPClassifier_names"] = (MLPClassifier((8,), max_iter=500, random_state=0), x, names[y])
    cases["KNeighborsClassifier_names"] = (neighbors.KNeighborsClassifier(3), x, names[y])
    cases["GradientBoostingClassifier_names"] = (E.GradientBoostingClassifier(n_estimators=5), x, names[y])
    found = {}
    for name, (est, fit_x, fit_y) in cases.items():
        est.fit(fit_x, fit_y) if fit_y is not None else est.fit(fit_x)
        inputs = test - 5 if name.startswith("Normalizer") else np.abs(test) if name == "MultinomialNB" else test
        # Classifiers without ZipMap (plain probabilities); some estimators refuse the option.
        tries = [{id(est): {"zipmap": False}}, None] if hasattr(est, "predict_proba") else [None]
        for options in tries:
            try:
                onx = to_onnx(est, inputs[:1], options=options, target_opset={"": 17, "ai.onnx.ml": 3})
                break
            except Exception as e:  # noqa: BLE001 -- a converter's limit, reported and skipped
                failure = f"{type(e).__name__}: {str(e).splitlines()[0][:100]}"
        else:
            print(f"{name}: skl2onnx fails: {failure}")
            continue
        (out / f"sklearn_{name}.onnx").write_bytes(onx.SerializeToString())
        computed = {}
        for method in ("predict", "predict_proba", "transform", "decision_function"):
            if hasattr(est, method):
                computed[method] = np.asarray(getattr(est, method)(inputs))
        found[name] = ([inputs.astype(np.float32)], computed)
    found.update(_sklearn_pipelines(out))
    (out / "sklearn.pkl").write_bytes(pickle.dumps(found))


def _sklearn_pipelines(out: pathlib.Path) -> dict:
    """Pipelines over a table of string and number columns, as deployed models often are: a
    ColumnTransformer (one-hot or ordinal codes for the strings, scaling for the numbers) before
    a classifier of string classes; one graph input per column."""
    import pandas as pd
    from skl2onnx import to_onnx
    from skl2onnx.common.data_types import FloatTensorType, StringTensorType
    from sklearn.compose import ColumnTransformer
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder, OrdinalEncoder, StandardScaler

    rng = np.random.default_rng(0)
    n = 200
    table = pd.DataFrame(
        {
            "color": rng.choice(["red", "green", "blue"], n),
            "size": rng.choice(["S", "M", "L", "XL"], n),
            "w": rng.normal(size=n).astype(np.float32),
            "h": rng.normal(size=n).astype(np.float32),
        }
    )
    target = np.where((table.color == "red") ^ (table.w > 0), "yes", "no")
    types = [("color", StringTensorType([None, 1])), ("size", StringTensorType([None, 1]))]
    types += [("w", FloatTensorType([None, 1])), ("h", FloatTensorType([None, 1]))]
    found = {}
    for name, encoder, classifier in (
        ("Pipeline_onehot_logistic", OneHotEncoder(handle_unknown="ignore"), LogisticRegression(max_iter=300)),
        ("Pipeline_ordinal_forest", OrdinalEncoder(), RandomForestClassifier(5, max_depth=4, random_state=0)),
    ):
        columns = ColumnTransformer([("codes", encoder, ["color", "size"]), ("scaled", StandardScaler(), ["w", "h"])])
        pipeline = make_pipeline(columns, classifier).fit(table, target)
        options = {id(classifier): {"zipmap": False}}
        onx = to_onnx(pipeline, initial_types=types, options=options, target_opset={"": 17, "ai.onnx.ml": 3})
        (out / f"sklearn_{name}.onnx").write_bytes(onx.SerializeToString())
        test = table.iloc[:15]
        inputs = [
            test[c].to_numpy().reshape(-1, 1).astype(object if c in ("color", "size") else np.float32) for c in table
        ]
        computed = {"predict": pipeline.predict(test), "predict_proba": pipeline.predict_proba(test)}
        found[name] = (inputs, computed)
    return found


def _torch(out: pathlib.Path) -> None:
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Fn(nn.Module):
        def __init__(self, fn, *modules):
            super().__init__()
            self.fn, self.parts = fn, nn.ModuleList(modules)

        def forward(self, *xs):
            return self.fn(*self.parts, *xs)

    torch.manual_seed(0)
    r = torch.randn
    mha = nn.MultiheadAttention(16, 4, batch_first=True)
    mask = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    layer = nn.TransformerEncoderLayer(16, 4, 32, batch_first=True, dropout=0.0)
    cases = {
        "lstm": (nn.LSTM(6, 8, num_layers=2, batch_first=True, bidirectional=True), (r(2, 5, 6),)),
        "gru": (nn.GRU(6, 8, batch_first=True), (r(2, 5, 6),)),
        "rnn_relu": (nn.RNN(4, 5, nonlinearity="relu", batch_first=True), (r(2, 3, 4),)),
        "transformer_encoder": (nn.TransformerEncoder(layer, 2), (r(2, 7, 16),)),
        "attention_padding_mask": (Fn(lambda a, q, m: a(q, q, q, key_padding_mask=m)[0], mha), (r(2, 5, 16), mask)),
        "conv1d_dilated": (nn.Conv1d(3, 4, 3, dilation=2, padding=2), (r(2, 3, 11),)),
        "conv3d": (nn.Conv3d(2, 3, 3, stride=2, padding=1), (r(1, 2, 5, 6, 7),)),
        "conv_transpose2d": (nn.ConvTranspose2d(3, 2, 4, stride=2, padding=1), (r(1, 3, 5, 5),)),
        "upsample_bilinear": (nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True), (r(1, 2, 4, 5),)),
        "interpolate_bicubic": (Fn(lambda x: F.interpolate(x, size=(7, 3), mode="bicubic")), (r(1, 2, 4, 5),)),
        "interpolate_nearest": (Fn(lambda x: F.interpolate(x, scale_factor=1.5, mode="nearest")), (r(1, 2, 4, 5),)),
        "group_norm": (nn.GroupNorm(2, 4), (r(2, 4, 3, 3),)),
        "instance_norm": (nn.InstanceNorm2d(3, affine=True), (r(2, 3, 4, 4),)),
        "layer_norm": (nn.LayerNorm([4, 5]), (r(2, 3, 4, 5),)),
        "embedding_bag": (nn.EmbeddingBag(10, 4, mode="mean"), (torch.tensor([[1, 2, 4], [4, 3, 9]]),)),
        "pixel_shuffle": (nn.PixelShuffle(2), (r(1, 8, 3, 3),)),
        "grid_sample": (
            Fn(lambda x, g: F.grid_sample(x, g, align_corners=False)),
            (r(1, 2, 5, 5), torch.rand(1, 3, 4, 2) * 2 - 1),
        ),
        "einsum": (
            Fn(lambda a, b: torch.einsum("bij,bjk->bik", a, b) + torch.einsum("bii->b", a)[:, None, None]),
            (r(2, 3, 3), r(2, 3, 4)),
        ),
        "topk_gather": (Fn(lambda x: torch.gather(x, 1, torch.topk(x, 3, dim=1).indices)), (r(4, 7),)),
        "scatter_add": (
            Fn(lambda x, i: torch.zeros(3, 5).scatter_add(1, i, x)),
            (r(3, 4), torch.tensor([[0, 1, 1, 4], [2, 2, 2, 0], [3, 1, 0, 4]])),
        ),
        "index_put": (Fn(lambda x: x.index_put((torch.tensor([0, 2]),), torch.ones(2, 4))), (r(3, 4),)),
        "masked_fill": (Fn(lambda x: x.masked_fill(x > 0.5, -1.0)), (r(3, 4),)),
        "reverse_cumsum": (Fn(lambda x: torch.flip(torch.cumsum(torch.flip(x, [1]), 1), [1])), (r(3, 6),)),
        "argsort": (Fn(lambda x: torch.argsort(x, dim=-1, descending=True)), (r(3, 6),)),
        "where_broadcast": (Fn(lambda x, y: torch.where(x > 0, x, y)), (r(3, 1, 4), r(2, 1))),
        "max_pool_ceil": (nn.MaxPool2d(3, stride=2, ceil_mode=True), (r(1, 2, 8, 8),)),
        "avg_pool_padded": (nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False), (r(1, 2, 7, 7),)),
        "adaptive_avg_pool": (nn.AdaptiveAvgPool2d((2, 3)), (r(1, 2, 8, 9),)),
        "lp_pool": (nn.LPPool2d(2, 2), (r(1, 2, 6, 6),)),
        "gelu_tanh": (nn.GELU(approximate="tanh"), (r(3, 4),)),
        "silu_hardswish_mish": (Fn(lambda x: F.silu(x) + F.hardswish(x) + F.mish(x)), (r(3, 4),)),
        "log_softmax": (nn.LogSoftmax(dim=1), (r(3, 4),)),
        "std_var": (Fn(lambda x: torch.std(x, dim=1) + torch.var(x, dim=0, unbiased=False).sum()), (r(4, 5),)),
        "norms": (
            Fn(lambda x: torch.norm(x, p=3, dim=1) + torch.linalg.vector_norm(x, ord=float("inf"), dim=0).sum()),
            (r(4, 5),),
        ),
        "triu_tril": (Fn(lambda x: torch.triu(x, 1) + torch.tril(x, -1) * 2), (r(4, 5),)),
        "unfold": (nn.Unfold(kernel_size=2), (r(1, 2, 4, 4),)),
        "fold": (nn.Fold(output_size=(4, 4), kernel_size=2), (r(1, 8, 9),)),
        "roll": (Fn(lambda x: torch.roll(x, shifts=(1, -2), dims=(0, 1))), (r(3, 5),)),
        "repeat_interleave": (Fn(lambda x: torch.repeat_interleave(x, 2, dim=1)), (r(2, 3),)),
        "split_cat": (Fn(lambda x: torch.cat(list(torch.split(x, [1, 2, 3], dim=1))[::-1], dim=1)), (r(2, 6),)),
        "chunk_stack": (Fn(lambda x: torch.stack(torch.chunk(x, 3, dim=0), dim=2)), (r(6, 4),)),
        "baddbmm": (
            Fn(lambda a, b, c: torch.baddbmm(c, a, b, beta=0.5, alpha=2.0)),
            (r(2, 3, 4), r(2, 4, 5), r(2, 3, 5)),
        ),
        "remainder_floor_divide": (
            Fn(lambda x, y: torch.remainder(x, y) + torch.div(x, y, rounding_mode="floor")),
            (r(3, 4) * 5, r(3, 4) + 3),
        ),
        "integer_ops": (
            Fn(lambda x: (x // 3) * 2 + x % 3 - torch.bitwise_and(x, 5)),
            (torch.randint(-20, 20, (3, 4)),),
        ),
        "clamp": (Fn(lambda x: torch.clamp(x, min=-0.5) + torch.clamp(x, max=0.2)), (r(3, 4),)),
        "cosine_similarity": (nn.CosineSimilarity(dim=1), (r(3, 4), r(3, 4))),
        "cross_entropy_smoothed": (
            Fn(lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1)),
            (r(5, 4), torch.tensor([0, 3, 1, 2, 3])),
        ),
        "nonzero": (Fn(lambda x: torch.nonzero(x > 0)), (r(3, 4),)),
        "unique": (Fn(lambda x: torch.unique(x, sorted=True)), (torch.randint(0, 5, (10,)),)),
        "prelu": (nn.PReLU(3), (r(2, 3, 4),)),
        "glu": (nn.GLU(dim=1), (r(2, 6),)),
        "expand_as": (Fn(lambda x, y: x.expand_as(y) * y), (r(3, 1), r(3, 4))),
        "matrix_power": (Fn(lambda x: torch.linalg.matrix_power(x, 3)), (r(2, 3, 3),)),
        "det": (Fn(torch.det), (r(2, 3, 3),)),
        "logsumexp": (Fn(lambda x: torch.logsumexp(x, dim=1)), (r(3, 4),)),
        "meshgrid": (Fn(lambda a, b: torch.stack(torch.meshgrid(a, b, indexing="ij"), 0)), (r(3), r(4))),
        "bucketize": (Fn(lambda x: torch.bucketize(x, torch.tensor([-1.0, 0.0, 0.5, 2.0]))), (r(3, 4),)),
        "one_hot": (Fn(lambda x: F.one_hot(x, 6)), (torch.tensor([0, 5, 2, 2]),)),
        # Added 2026-12-04: attention, spectra, more pooling and indexing forms.
        "sdpa_causal": (
            Fn(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
            (r(2, 3, 5, 8), r(2, 3, 5, 8), r(2, 3, 5, 8)),
        ),
        "sdpa_float_mask": (
            Fn(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m)),
            (r(2, 3, 5, 8), r(2, 3, 6, 8), r(2, 3, 6, 8), r(5, 6)),
        ),
        "rfft_abs": (Fn(lambda x: torch.fft.rfft(x, dim=-1).abs()), (r(3, 16),)),
        "depthwise_conv": (nn.Conv2d(4, 4, 3, groups=4, padding=1, bias=False), (r(1, 4, 6, 6),)),
        "batch_norm1d": (nn.BatchNorm1d(5), (r(4, 5, 3),)),
        "embedding_padding": (nn.Embedding(10, 4, padding_idx=0), (torch.tensor([[0, 3, 9], [2, 0, 1]]),)),
        "adaptive_max_pool1d": (nn.AdaptiveMaxPool1d(3), (r(2, 4, 10),)),
        "avg_pool1d_ceil": (nn.AvgPool1d(3, stride=2, ceil_mode=True), (r(2, 3, 8),)),
        "nearest_3d": (nn.Upsample(scale_factor=2, mode="nearest"), (r(1, 2, 2, 3, 2),)),
        "cumprod_flip": (Fn(lambda x: torch.cumprod(torch.flip(x, [0]), dim=0)), (r(4, 3),)),
        "sort_ascending": (Fn(lambda x: torch.sort(x, dim=0).values), (r(5, 3),)),
        "topk_smallest": (Fn(lambda x: torch.topk(x, 2, dim=-1, largest=False)), (r(3, 6),)),
        "masked_select": (Fn(lambda x: torch.masked_select(x, x > 0)), (r(3, 4),)),
        "cdist": (Fn(lambda a, b: torch.cdist(a, b)), (r(2, 4, 3), r(2, 5, 3))),
        "atan2_hypot": (Fn(lambda a, b: torch.atan2(a, b) + torch.hypot(a, b)), (r(3, 4), r(3, 4))),
        "softplus_logit": (Fn(lambda x: F.softplus(x, beta=2.0) + torch.logit(torch.sigmoid(x), eps=1e-6)), (r(3, 4),)),
        "narrow_select": (Fn(lambda x: x.narrow(1, 1, 2) + x.select(1, 0)[:, None]), (r(3, 4),)),
        "diagonal_trace": (Fn(lambda x: torch.diagonal(x, offset=1, dim1=-2, dim2=-1).sum(-1)), (r(2, 4, 4),)),
        "instance_norm1d": (nn.InstanceNorm1d(3), (r(2, 3, 7),)),
        "rms_norm": (nn.RMSNorm([6]), (r(2, 3, 6),)),
    }
    found = {}
    for name, (module, args) in cases.items():
        module.eval()
        with torch.no_grad():
            result = module(*args)
        results = result if isinstance(result, (tuple, list)) else (result,)
        computed = [t.numpy() for t in results if isinstance(t, torch.Tensor)]
        for exporter in ("torchscript", "dynamo"):
            path = out / f"torch_{name}_{exporter}.onnx"
            try:
                if exporter == "torchscript":
                    torch.onnx.export(module, args, str(path), dynamo=False, opset_version=17)
                else:
                    torch.onnx.export(module, args, str(path), dynamo=True, opset_version=18)
            except Exception as e:  # noqa: BLE001 -- an exporter's limit, reported and skipped
                print(f"{name} ({exporter}): the exporter fails: {type(e).__name__}")
                continue
            found[f"{name}_{exporter}"] = ([a.numpy() for a in args], {"forward": computed})
    (out / "torch.pkl").write_bytes(pickle.dumps(found))


def _close(a, b, tol: float) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind in "OUS" or b.dtype.kind in "OUS":
        return a.astype(str).ravel().tolist() == b.astype(str).ravel().tolist()
    if a.size != b.size:
        return False
    if a.dtype.kind in "biu" and b.dtype.kind in "biu":
        return np.array_equal(a.ravel(), b.ravel())
    return np.allclose(a.astype(float).ravel(), b.astype(float).ravel(), rtol=tol, atol=tol)


def _median_ms(fn, repeats: int = 7, block_s: float = 0.02) -> float:
    """The median over ``repeats`` blocks of the time of one call, in ms (after two calls)."""
    fn()
    fn()
    times = []
    for _ in range(repeats):
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < block_s:
            fn()
            n += 1
        times.append((time.perf_counter() - start) / n * 1e3)
    return statistics.median(times)


def _timings(model, session, names, inputs, rows: bool) -> str:
    """jonnx's default call and onnxruntime's, at the sweep's inputs and, with ``rows`` (the
    row-wise scikit-learn models), at 2,000 rows: ``jonnx ms / onnxruntime ms (ratio)``."""
    import jax

    def jonnx_call(xs):
        return lambda: jax.block_until_ready([y for y in model(*xs) if not isinstance(y, (list, np.ndarray))])

    sizes = [inputs]
    if rows:
        sizes.append([np.resize(x, (2000, x.shape[1])) for x in inputs])
    found = []
    for xs in sizes:
        mine = _median_ms(jonnx_call(xs))
        theirs = _median_ms(lambda xs=xs: session.run(None, dict(zip(names, xs))))
        found.append(f"{len(xs[0])} rows {mine:.3f}/{theirs:.3f} ms ({mine / theirs:.1f}x)")
    return ", ".join(found)


def check(out: pathlib.Path, time_calls: bool = False) -> None:
    import onnx
    import onnxruntime as ort

    import jonnx

    ort.set_default_logger_severity(4)
    for group in ("sklearn", "torch"):
        path = out / f"{group}.pkl"
        if not path.exists():
            continue
        for name, (inputs, computed) in pickle.loads(path.read_bytes()).items():
            model_path = out / f"{group}_{name}.onnx"
            proto = onnx.load(model_path)
            names = [v.name for v in proto.graph.input if v.name not in {t.name for t in proto.graph.initializer}]
            try:
                session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
                want = session.run(None, dict(zip(names, inputs)))
            except Exception:  # noqa: BLE001 -- then the framework's outputs are the reference
                want = None
            try:
                model = jonnx.load(model_path)
                got = model(*inputs)
            except Exception as e:  # noqa: BLE001 -- every refusal is a finding
                print(f"{group:8s} {name:40s} jonnx refuses: {type(e).__name__}: {str(e).splitlines()[0][:150]}")
                continue
            got = [g for g in got if not isinstance(g, list)]  # ZipMap's maps: not compared
            if want is None:
                versus_ort = "no onnxruntime"
            else:
                pairs = [(g, w) for g, w in zip(got, want) if not isinstance(w, list)]
                versus_ort = "=" if all(_close(g, w, 1e-4) for g, w in pairs) else "DIFFERS"
            matched = sorted(
                m
                for m, v in computed.items()
                if any(_close(g, c, 1e-3) for g in got for c in (v if isinstance(v, list) else [v]))
            )
            timed = (
                f"  {_timings(model, session, names, inputs, group == 'sklearn')}"
                if time_calls and want is not None
                else ""
            )
            print(
                f"{group:8s} {name:40s} onnxruntime {versus_ort:8s} {group} {'=' if matched else 'DIFFERS'} "
                f"{matched}{timed}"
            )


def main() -> None:
    warnings.filterwarnings("ignore")
    if len(sys.argv) == 4 and sys.argv[1] == "make" and sys.argv[2] in ("sklearn", "torch"):
        out = pathlib.Path(sys.argv[3])
        out.mkdir(parents=True, exist_ok=True)
        (_sklearn if sys.argv[2] == "sklearn" else _torch)(out)
    elif len(sys.argv) in (3, 4) and sys.argv[1] == "check" and sys.argv[3:] in ([], ["--time"]):
        check(pathlib.Path(sys.argv[2]), time_calls=sys.argv[3:] == ["--time"])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()

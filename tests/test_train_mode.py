"""Training mode on a model exported in eval mode: batch statistics, running statistics by
ONNX's momentum rule, Dropout masks from the caller's key; inference equals onnxruntime."""

from __future__ import annotations

import jax
import numpy as np
import onnx
import onnx.helper as oh
import onnxruntime as ort
import pytest

import jonnx

EPS, MOMENTUM, RATIO = 1e-5, 0.9, 0.25
RNG = np.random.default_rng(0)
C = 3
STATS = {
    "scale": RNG.uniform(0.5, 1.5, C).astype(np.float32),
    "bias": RNG.normal(0, 0.3, C).astype(np.float32),
    "mean": RNG.normal(0, 0.3, C).astype(np.float32),
    "var": RNG.uniform(0.5, 1.5, C).astype(np.float32),
}


def _eval_mode_model(bn_opset: int) -> onnx.ModelProto:
    """x -> BatchNormalization (inference form) -> two Dropouts in a row, and one on x itself."""
    bn_inputs = ["x", "scale", "bias", "mean", "var"]
    bn_attrs = {"epsilon": EPS, "momentum": MOMENTUM}
    if bn_opset < 7:
        bn_attrs["is_test"] = 1
    ratio = onnx.numpy_helper.from_array(np.array(RATIO, np.float32), "ratio")
    nodes = [
        oh.make_node("BatchNormalization", bn_inputs, ["bn"], name="bn", **bn_attrs),
        oh.make_node(
            "Dropout",
            ["bn", "ratio"] if bn_opset >= 12 else ["bn"],
            ["d1"],
            name="drop1",
            **({} if bn_opset >= 12 else {"ratio": RATIO, **({"is_test": 1} if bn_opset < 7 else {})}),
        ),
        oh.make_node(
            "Dropout",
            ["x", "ratio"] if bn_opset >= 12 else ["x"],
            ["d2"],
            name="drop2",
            **({} if bn_opset >= 12 else {"ratio": RATIO, **({"is_test": 1} if bn_opset < 7 else {})}),
        ),
    ]
    inits = [onnx.numpy_helper.from_array(v, k) for k, v in STATS.items()]
    if bn_opset >= 12:
        inits.append(ratio)
    graph = oh.make_graph(
        nodes,
        "eval_mode",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", C, 4, 4])],
        [oh.make_tensor_value_info(n, onnx.TensorProto.FLOAT, ["N", C, 4, 4]) for n in ("bn", "d1", "d2")],
        initializer=inits,
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", bn_opset)])
    model.ir_version = 8 if bn_opset >= 9 else 3
    return model


X = RNG.normal(1.0, 2.0, (64, C, 4, 4)).astype(np.float32)


@pytest.mark.parametrize("opset", [6, 7, 9, 13, 15])
def test_train_uses_batch_statistics_and_the_onnx_momentum_rule(opset):
    model = jonnx.load(_eval_mode_model(opset))
    assert set(model.state) == {"mean", "var"} and set(model.params) >= {"scale", "bias"}
    (bn, _, _), new_state = model.apply(model.params, X, train=True, key=jax.random.key(0))
    batch_mean = X.mean(axis=(0, 2, 3))
    batch_var = X.var(axis=(0, 2, 3))  # population variance, as ONNX's reference computes it
    shape = (1, C, 1, 1)
    want = (X - batch_mean.reshape(shape)) / np.sqrt(batch_var.reshape(shape) + EPS)
    want = want * STATS["scale"].reshape(shape) + STATS["bias"].reshape(shape)
    np.testing.assert_allclose(np.asarray(bn), want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(
        np.asarray(new_state["mean"]), STATS["mean"] * MOMENTUM + batch_mean * (1 - MOMENTUM), rtol=1e-5
    )
    np.testing.assert_allclose(
        np.asarray(new_state["var"]), STATS["var"] * MOMENTUM + batch_var * (1 - MOMENTUM), rtol=1e-5
    )


@pytest.mark.parametrize("opset", [7, 13, 15])
def test_dropout_masks_change_with_the_key_and_differ_between_nodes(opset):
    model = jonnx.load(_eval_mode_model(opset))
    run = jax.jit(lambda key: model.apply(model.params, X, train=True, key=key)[0])
    _, d1_a, d2_a = (np.asarray(v) for v in run(jax.random.key(1)))
    _, d1_again, _ = (np.asarray(v) for v in run(jax.random.key(1)))
    _, d1_b, _ = (np.asarray(v) for v in run(jax.random.key(2)))
    keep = lambda d: d != 0  # noqa: E731 -- the inputs are nonzero almost surely
    np.testing.assert_array_equal(keep(d1_a), keep(d1_again))  # same key, same mask
    assert (keep(d1_a) != keep(d1_b)).mean() > 0.2  # another key, another mask
    assert (keep(d1_a) != keep(d2_a)).mean() > 0.2  # two nodes, two masks
    for d in (d1_a, d2_a):
        assert abs(keep(d).mean() - (1 - RATIO)) < 0.03
    np.testing.assert_allclose(d2_a[keep(d2_a)], X[keep(d2_a)] / (1 - RATIO), rtol=1e-6)


@pytest.mark.parametrize("opset", [7, 9, 13, 15])  # onnxruntime has no BatchNormalization-6
def test_inference_is_deterministic_and_equals_onnxruntime(opset):
    proto = _eval_mode_model(opset)
    model = jonnx.load(proto)
    first = [np.asarray(v) for v in model(X)]
    again = [np.asarray(v) for v in model(X)]
    eager = [np.asarray(v) for v in model.apply(model.params, X, train=False)]
    want = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": X})
    for a, b, e, w in zip(first, again, eager, want):
        np.testing.assert_array_equal(a, b)  # the same call twice: bit for bit
        np.testing.assert_allclose(e, a, rtol=1e-6, atol=1e-6)  # eager vs jit: XLA fuses differently
        np.testing.assert_allclose(a, w, rtol=1e-5, atol=1e-5)


def test_train_without_a_key_names_the_dropout_node():
    model = jonnx.load(_eval_mode_model(15))
    with pytest.raises(jonnx.errors.NodeError, match="'drop1'.*no PRNG key"):
        model.apply(model.params, X, train=True)

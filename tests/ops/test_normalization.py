"""Normalization ops and Dropout against the ReferenceEvaluator / numpy, over opsets and dtypes.

Training-mode behaviour that a one-node model cannot switch on (the run's train flag, a PRNG
key) is tested through ``jonnx.ops.call``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import onnxruntime
import pytest

import jonnx.ops
from jonnx import errors
from tests.ops._harness import (
    assert_matches_reference,
    assert_rounded_once,
    check_op_grads,
    node_model,
    run_jonnx,
)

RNG = np.random.default_rng(0)


def _f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


# -- BatchNormalization ------------------------------------------------------------------------


def _bn_numpy(x, s, b, mean, var, eps=1e-5, spatial=True):
    shape = (-1,) + (1,) * (x.ndim - 2) if spatial or s.ndim == 1 else s.shape
    r = lambda p: p.reshape(shape)
    return (r(s) * (x - r(mean)) / np.sqrt(r(var) + eps) + r(b)).astype(x.dtype)


def _bn_train_numpy(x, s, b, mean, var, momentum=0.9, eps=1e-5, spatial=True):
    axes = (0,) + tuple(range(2, x.ndim)) if spatial else (0,)
    bm, bv = x.mean(axis=axes), x.var(axis=axes)  # population variance
    y = _bn_numpy(x, s, b, bm, bv, eps, spatial)
    return y, mean * momentum + bm * (1 - momentum), var * momentum + bv * (1 - momentum), bm, bv


def _bn_inputs(c=3, shape=(2, 3, 4, 5)):
    return {
        "x": _f32(*shape),
        "s": _f32(c),
        "b": _f32(c),
        "mean": _f32(c),
        "var": RNG.uniform(0.5, 1.5, c).astype(np.float32),
    }


@pytest.mark.parametrize(
    "opset,attrs",
    [
        (6, {"is_test": 1}),
        (7, {}),
        (9, {}),
        (14, {}),
        (15, {"training_mode": 0}),
    ],
)
def test_batchnorm_inference(opset, attrs):
    # numpy: the ReferenceEvaluator's BatchNormalization_9 runs training statistics whenever
    # `momentum` is set (it always is, by default), which opset 9 does not say.
    inputs = _bn_inputs()
    assert_matches_reference(
        "BatchNormalization", inputs, opset=opset, epsilon=1e-3, **attrs, expected=lambda *a: [_bn_numpy(*a, eps=1e-3)]
    )


@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 5), (2, 3, 2, 2, 2)])
def test_batchnorm_training_mode_attribute(shape):
    inputs = _bn_inputs(shape=shape)
    out = assert_matches_reference(
        "BatchNormalization", inputs, 3, opset=15, training_mode=1, momentum=0.8, rtol=1e-4, atol=1e-5
    )
    want = _bn_train_numpy(*inputs.values(), momentum=0.8)
    np.testing.assert_allclose(out[2], want[2], rtol=1e-5)


def test_batchnorm_batch_statistics_are_accurate_in_float32():
    # 200,704 values per channel: the batch mean and variance as float32 reductions stay within
    # about 1e-7 of float64 (XLA's own reductions about 1e-6); as products with ones (until
    # 2026-11-29) the variance was 2.9e-5 off. With momentum 0 the new running statistics are
    # the batch's.
    x64 = RNG.uniform(0, 6, (16, 2, 112, 112))
    channels = np.ones(2, np.float32), np.zeros(2, np.float32)
    _, mean, var = jonnx.ops.call(
        "BatchNormalization", x64.astype(np.float32), *channels, *channels, training_mode=1, momentum=0.0
    )
    x = x64.astype(np.float32).astype(np.float64)
    np.testing.assert_allclose(mean, x.mean(axis=(0, 2, 3)), rtol=2e-6)
    np.testing.assert_allclose(var, x.var(axis=(0, 2, 3)), rtol=2e-6)


@pytest.mark.parametrize("offset", [45865.05, 1e4, 3e6])
@pytest.mark.parametrize("opset", [6, 15])
def test_batchnorm_training_channels_far_from_zero_normalize_as_in_float64(offset, opset):
    # Channels whose mean dwarfs their spread: all equal (output the bias), a quarter apart
    # (float32's spacing near 3e6), of unit spread. With the plain mean alone the equal channel
    # at 45865.05 came out 1.17 off its bias and the unit-spread one near 1e4 5e-4 off float64
    # (ops/normalization.py ``corrected_moments``). Opset 6 (is_test=0) also returns the saved
    # batch statistics; momentum 0 makes the new running statistics the batch's.
    rng = np.random.default_rng(5)
    x = np.empty((4, 3, 8, 8), np.float32)
    x[:, 0] = offset
    x[:, 1] = offset + 0.25 * rng.integers(-8, 9, (4, 8, 8))
    x[:, 2] = offset + rng.standard_normal((4, 8, 8))
    scale, bias = np.full(3, 1.5, np.float32), np.full(3, 0.25, np.float32)
    attrs = {"training_mode": 1} if opset >= 14 else {"is_test": 0}
    running = np.zeros(3, np.float32), np.ones(3, np.float32)
    outs = jonnx.ops.call("BatchNormalization", x, scale, bias, *running, opset=opset, momentum=0.0, **attrs)
    wide = x.astype(np.float64)
    mean, var = wide.mean(axis=(0, 2, 3), keepdims=True), wide.var(axis=(0, 2, 3), keepdims=True)
    want = (wide - mean) / np.sqrt(var + 1e-5) * 1.5 + 0.25
    np.testing.assert_allclose(outs[0], want, rtol=0, atol=2e-6)
    np.testing.assert_array_equal(outs[0][:, 0], np.float32(0.25))
    statistics = [outs[1:3]] + ([outs[3:5]] if opset < 14 else [])
    for got_mean, got_var in statistics:
        np.testing.assert_allclose(got_mean, mean.ravel(), rtol=6e-8, atol=0)  # within half a unit
        np.testing.assert_allclose(got_var, var.ravel(), rtol=1e-5, atol=1e-9)


def test_batchnorm_opset6_is_test_0_trains_with_five_outputs():
    inputs = _bn_inputs()
    assert_matches_reference(
        "BatchNormalization",
        inputs,
        5,
        opset=6,
        is_test=0,
        expected=lambda *a: _bn_train_numpy(*a),
        rtol=1e-4,
        atol=1e-5,
    )


@pytest.mark.parametrize("opset", [7, 9])
def test_batchnorm_five_outputs_train_as_onnxruntime_does(opset):
    # BatchNormalization-7/9 have no mode attribute: the spec ties training mode to the five
    # outputs (Y alone is test mode), and onnxruntime runs a five-output node on batch
    # statistics. numpy, not the ReferenceEvaluator: its BatchNormalization_9 returns Y alone.
    inputs = _bn_inputs()
    got = assert_matches_reference(
        "BatchNormalization", inputs, 5, opset=opset, expected=lambda *a: _bn_train_numpy(*a), rtol=1e-4, atol=1e-5
    )
    model = node_model("BatchNormalization", inputs, 5, opset=opset)
    ort = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = ort.run(None, inputs)
    # saved_var is left open by ONNX: onnxruntime's is 1 / sqrt(var + epsilon), jonnx's the variance.
    for i in range(4):
        np.testing.assert_allclose(got[i], want[i], rtol=1e-4, atol=1e-5, err_msg=f"output {i}")
    np.testing.assert_allclose(1 / np.sqrt(got[4] + 1e-5), want[4], rtol=1e-4)


@pytest.mark.parametrize("opset", [1, 6, 7])
def test_batchnorm_spatial0_per_activation(opset):
    # spatial=0: statistics over the batch axis only, parameters of shape (C, D1, ...).
    x = _f32(4, 3, 5)
    p = lambda: RNG.uniform(0.5, 1.5, (3, 5)).astype(np.float32)
    inputs = {"x": x, "s": p(), "b": p(), "mean": p(), "var": p()}
    legacy = {"is_test": 1} if opset < 7 else {}
    if opset == 1:
        legacy["consumed_inputs"] = [0, 0, 0, 1, 1]
    assert_matches_reference(
        "BatchNormalization",
        inputs,
        opset=opset,
        spatial=0,
        **legacy,
        expected=lambda *a: [_bn_numpy(*a, spatial=False)],
    )
    got = jonnx.ops.call("BatchNormalization", *inputs.values(), opset=opset, spatial=0, train=True, **legacy)
    want = _bn_train_numpy(*inputs.values(), spatial=False)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("opset", [7, 9, 15])
def test_batchnorm_train_flag_switches_eval_export_to_training(opset):
    inputs = _bn_inputs()
    got = jonnx.ops.call("BatchNormalization", *inputs.values(), opset=opset, train=True)
    want = _bn_train_numpy(*inputs.values())
    assert len(got) == (3 if opset >= 14 else 5)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-4, atol=1e-5)
    # Without the flag it normalises with the given statistics.
    y = jonnx.ops.call("BatchNormalization", *inputs.values(), opset=opset)
    y = y[0] if isinstance(y, tuple) else y
    np.testing.assert_allclose(np.asarray(y), _bn_numpy(*inputs.values()), rtol=1e-5, atol=1e-5)


def test_batchnorm_running_statistics_carry_no_gradient():
    inputs = _bn_inputs()

    def stats(x, mean):
        _, new_mean, new_var = jonnx.ops.call(
            "BatchNormalization", x, inputs["s"], inputs["b"], mean, inputs["var"], opset=15, training_mode=1
        )
        return new_mean.sum() + new_var.sum()

    gx, gm = jax.grad(stats, argnums=(0, 1))(inputs["x"], inputs["mean"])
    np.testing.assert_array_equal(np.asarray(gx), 0.0)
    np.testing.assert_array_equal(np.asarray(gm), 0.0)


# (5, 3, 7, 6): odd and even axes longer than two.
@pytest.mark.parametrize("shape", [(3, 3, 2), (5, 3, 7, 6)])
def test_batchnorm_training_gradients(shape):
    inputs = _bn_inputs(shape=shape)
    check_op_grads("BatchNormalization", inputs, opset=15, training_mode=1, n_outputs=3, wrt=["x", "s", "b"])


def test_batchnorm_float16_input_with_float32_parameters():
    inputs = _bn_inputs()
    inputs["x"] = inputs["x"].astype(np.float16)
    assert_matches_reference(
        "BatchNormalization",
        inputs,
        opset=15,
        rtol=2e-3,
        atol=2e-3,
        expected=lambda x, *p: [_bn_numpy(x.astype(np.float32), *p).astype(np.float16)],
    )


def test_batchnorm_half_precision_running_statistics_round_once():
    # running * momentum + batch * (1 - momentum) in float32 from the float32 batch statistics,
    # rounded once, as onnxruntime does; in float16 step by step (the batch statistic rounded,
    # then each product) a third of these running statistics were a unit or two off.
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 64, 3, 5)).astype(np.float16)
    params = {k: rng.standard_normal(64).astype(np.float16) for k in ("s", "b", "mean")}
    inputs = {"x": x, **params, "var": np.abs(rng.standard_normal(64)).astype(np.float16)}
    model = node_model("BatchNormalization", inputs, 3, opset=15, training_mode=1, momentum=0.9)
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, inputs)
    got = run_jonnx(model, inputs)
    for i in (1, 2):
        np.testing.assert_array_equal(np.asarray(got[i]), want[i], err_msg=f"output {i}")
    wide = x.astype(np.float64)
    exact_var = inputs["var"].astype(np.float64) * 0.9 + wide.var(axis=(0, 2, 3)) * (1 - 0.9)
    assert_rounded_once(got[2], exact_var, np.float16, most_off=0.05)


# -- Instance, layer, group, RMS normalization ------------------------------------------------


@pytest.mark.parametrize("opset", [6, 22])
@pytest.mark.parametrize("shape", [(2, 3, 4), (2, 3, 4, 5)])
def test_instance_normalization(opset, shape):
    inputs = {"x": _f32(*shape), "s": _f32(3), "b": _f32(3)}
    assert_matches_reference("InstanceNormalization", inputs, opset=opset, epsilon=1e-2, rtol=1e-5, atol=1e-5)


def test_instance_normalization_opset1_and_gradients():
    # numpy: the ReferenceEvaluator rejects opset 1's `consumed_inputs` attribute.
    def expected(x, s, b):
        mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        return [(s[:, None] * (x - mean) / np.sqrt(var + 1e-5) + b[:, None]).astype(x.dtype)]

    inputs = {"x": _f32(2, 3, 4), "s": _f32(3), "b": _f32(3)}
    assert_matches_reference(
        "InstanceNormalization", inputs, opset=1, consumed_inputs=[0, 0, 0], rtol=1e-5, atol=1e-5, expected=expected
    )
    check_op_grads("InstanceNormalization", inputs, opset=22)


@pytest.mark.parametrize("axis", [-1, 1, 0, -2])
@pytest.mark.parametrize("with_bias", [True, False])
def test_layer_normalization(axis, with_bias):
    x = _f32(2, 3, 4)
    norm_shape = x.shape[axis % 3 :]
    inputs = {"x": x, "w": _f32(*norm_shape), "b": _f32(*norm_shape) if with_bias else None}
    assert_matches_reference("LayerNormalization", inputs, 3, opset=17, axis=axis, epsilon=1e-3, rtol=1e-5, atol=1e-5)


def test_layer_normalization_float16_uses_float32_statistics():
    x = (_f32(3, 8) * 100 + 1000).astype(np.float16)  # float16 statistics would lose digits
    w, b = np.ones(8, np.float16), np.zeros(8, np.float16)

    def expected(x, w, b):
        x32 = x.astype(np.float32)
        mean = x32.mean(-1, keepdims=True)
        inv = 1 / np.sqrt(((x32 - mean) ** 2).mean(-1, keepdims=True) + 1e-5)
        return [((x32 - mean) * inv).astype(np.float16) * w + b, mean, inv]

    assert_matches_reference(
        "LayerNormalization", {"x": x, "w": w, "b": b}, 3, opset=17, expected=expected, rtol=2e-3, atol=2e-3
    )


def test_layer_normalization_gradients():
    check_op_grads("LayerNormalization", {"x": _f32(2, 5), "w": _f32(5), "b": _f32(5)}, opset=17)


def _group_norm_numpy(x, scale, bias, groups, eps=1e-5, per_channel=True):
    n, c = x.shape[:2]
    g = x.reshape(n, groups, -1)
    normed = (g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + eps)
    trailing = (1,) * (x.ndim - 2)
    if per_channel:
        normed = normed.reshape(x.shape)
        return (normed * scale.reshape(-1, *trailing) + bias.reshape(-1, *trailing)).astype(x.dtype)
    return (normed * scale.reshape(-1, 1) + bias.reshape(-1, 1)).reshape(x.shape).astype(x.dtype)


@pytest.mark.parametrize("groups", [1, 2, 4])
def test_group_normalization_21_per_channel(groups):
    x = _f32(2, 4, 3, 2)
    inputs = {"x": x, "s": _f32(4), "b": _f32(4)}
    assert_matches_reference(
        "GroupNormalization",
        inputs,
        opset=21,
        num_groups=groups,
        rtol=1e-5,
        atol=1e-5,
        expected=lambda x, s, b: [_group_norm_numpy(x, s, b, groups)],
    )


@pytest.mark.parametrize("groups", [1, 2])
def test_group_normalization_18_per_group(groups):
    # Opset 18's scale and bias have one entry per group (changed to per channel in 21).
    x = _f32(2, 4, 3)
    inputs = {"x": x, "s": _f32(groups), "b": _f32(groups)}
    assert_matches_reference(
        "GroupNormalization",
        inputs,
        opset=18,
        num_groups=groups,
        rtol=1e-5,
        atol=1e-5,
        expected=lambda x, s, b: [_group_norm_numpy(x, s, b, groups, per_channel=False)],
    )
    if groups == 2:
        check_op_grads("GroupNormalization", inputs, opset=18, num_groups=groups)


@pytest.mark.parametrize("opset,jit", [(18, True), (21, True), (21, False)])
def test_group_normalization_of_an_empty_batch(opset, jit):
    # Found by the fuzz's --grad run: the eager and compiled paths both failed on N = 0.
    inputs = {"x": _f32(0, 4, 3), "s": _f32(2 if opset == 18 else 4), "b": _f32(2 if opset == 18 else 4)}
    (y,) = run_jonnx(node_model("GroupNormalization", inputs, opset=opset, num_groups=2), inputs, jit=jit)
    assert y.shape == (0, 4, 3) and y.dtype == np.float32


def test_group_normalization_groups_must_divide_channels():
    inputs = {"x": _f32(2, 4, 3), "s": _f32(4), "b": _f32(4)}
    model = node_model("GroupNormalization", inputs, opset=21, num_groups=3)
    with pytest.raises(errors.NodeError, match="does not divide"):
        run_jonnx(model, inputs)


@pytest.mark.parametrize("axis", [-1, 1])
def test_rms_normalization(axis):
    x = _f32(2, 3, 4)
    inputs = {"x": x, "s": _f32(*x.shape[axis % 3 :])}
    assert_matches_reference("RMSNormalization", inputs, opset=23, axis=axis, rtol=1e-5, atol=1e-5)
    check_op_grads("RMSNormalization", inputs, opset=23, axis=axis)


# -- Lp, mean-variance, LRN ----------------------------------------------------------------------


@pytest.mark.parametrize("opset", [1, 22])
@pytest.mark.parametrize("p,axis", [(1, -1), (2, 0), (2, 1)])
def test_lp_normalization(opset, p, axis):
    # numpy: the ReferenceEvaluator sums x**p without abs, wrong for p=1 with negative entries.
    x = _f32(3, 4)
    x[1] = 0.0  # an all-zero row gives zeros

    def expected(x):
        norm = np.sum(np.abs(x) ** p, axis=axis, keepdims=True) ** (1 / p)
        return [np.where(norm == 0, 0, x / np.where(norm == 0, 1, norm)).astype(x.dtype)]

    assert_matches_reference("LpNormalization", {"x": x}, opset=opset, p=p, axis=axis, expected=expected)


def test_lp_normalization_gradient_finite_at_zero():
    x = _f32(3, 4)
    check_op_grads("LpNormalization", {"x": x}, opset=22, p=2)
    with jax.enable_x64(True):
        g = jax.grad(lambda x: jonnx.ops.LpNormalization(x, p=2).sum())(jnp.zeros((2, 3)))
    assert np.all(np.isfinite(np.asarray(g)))


def test_lp_normalization_rejects_p3():
    model = node_model("LpNormalization", {"x": _f32(2, 3)}, opset=22, p=3)
    with pytest.raises(errors.NodeError, match="p=3"):
        run_jonnx(model, {"x": _f32(2, 3)})


@pytest.mark.parametrize("opset", [9, 13])
@pytest.mark.parametrize("axes", [None, [1], [0, 1, 2, 3]])
def test_mean_variance_normalization(opset, axes):
    attrs = {} if axes is None else {"axes": axes}
    assert_matches_reference(
        "MeanVarianceNormalization", {"x": _f32(2, 3, 2, 4)}, opset=opset, rtol=1e-4, atol=1e-5, **attrs
    )


def test_mean_variance_normalization_gradients():
    check_op_grads("MeanVarianceNormalization", {"x": _f32(2, 3, 2, 2)}, opset=13)


def _lrn_numpy(x, size, alpha=1e-4, beta=0.75, bias=1.0):
    # The spec's window; the ReferenceEvaluator loops over x.shape[0] instead of the channels.
    c = x.shape[1]
    sq = np.zeros_like(x)
    for i in range(c):
        lo, hi = max(0, i - (size - 1) // 2), min(c - 1, i + math.ceil((size - 1) / 2))
        sq[:, i] = (x[:, lo : hi + 1] ** 2).sum(axis=1)
    return (x / (bias + alpha / size * sq) ** beta).astype(x.dtype)


@pytest.mark.parametrize("opset", [1, 13])
@pytest.mark.parametrize("size,shape", [(3, (2, 5, 3, 3)), (4, (1, 6, 2)), (1, (2, 3, 2, 2))])
def test_lrn(opset, size, shape):
    x = _f32(*shape)
    assert_matches_reference(
        "LRN",
        {"x": x},
        opset=opset,
        size=size,
        alpha=0.5,
        beta=0.6,
        bias=2.0,
        expected=lambda x: [_lrn_numpy(x, size, 0.5, 0.6, 2.0)],
        rtol=1e-5,
        atol=1e-6,
    )


def test_lrn_gradients():
    check_op_grads("LRN", {"x": _f32(1, 4, 2, 2)}, opset=13, size=3, alpha=0.5)


# -- Dropout -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "opset,attrs,mask_dtype",
    [
        (1, {"is_test": 1}, np.float32),
        (6, {"is_test": 1}, np.float32),
        (7, {}, np.float32),
        (10, {}, np.bool_),
        (12, {}, np.bool_),
        (13, {}, np.bool_),
        (22, {}, np.bool_),
    ],
)
def test_dropout_inference_is_identity_with_all_true_mask(opset, attrs, mask_dtype):
    x = _f32(3, 4)
    out = assert_matches_reference(
        "Dropout", {"x": x}, 2, opset=opset, **attrs, expected=[x, np.ones(x.shape, mask_dtype)]
    )
    assert out[1].dtype == mask_dtype


def test_dropout_training_mode_false_input_is_identity():
    x = _f32(3, 4)
    inputs = {"x": x, "r": np.array(0.7, np.float32), "t": np.array(False)}
    assert_matches_reference(
        "Dropout", inputs, 2, opset=13, initializers=["r", "t"], expected=[x, np.ones(x.shape, bool)]
    )


@pytest.mark.parametrize("opset,how", [(13, "input"), (22, "train"), (10, "train"), (6, "is_test")])
def test_dropout_training_masks_and_scales(opset, how):
    x = np.abs(_f32(200, 50)) + 0.1
    ratio = 0.3
    key = jax.random.key(7)
    if how == "input":
        y, mask = jonnx.ops.call("Dropout", x, np.float32(ratio), np.array(True), opset=opset, key=key)
    elif how == "train":
        args = (x, np.float32(ratio)) if opset >= 12 else (x,)
        extra = {} if opset >= 12 else {"ratio": ratio}
        y, mask = jonnx.ops.call("Dropout", *args, opset=opset, key=key, train=True, **extra)
    else:
        y, mask = jonnx.ops.call("Dropout", x, opset=opset, key=key, is_test=0, ratio=ratio)
    y, mask = np.asarray(y), np.asarray(mask).astype(bool)
    np.testing.assert_allclose(y, np.where(mask, x / (1 - ratio), 0), rtol=1e-6)
    assert abs(mask.mean() - (1 - ratio)) < 0.02
    # Same key, same mask; another key, another mask (no fixed seed anywhere).
    again = jonnx.ops.call("Dropout", x, np.float32(ratio), np.array(True), opset=13, key=key)[1]
    other = jonnx.ops.call("Dropout", x, np.float32(ratio), np.array(True), opset=13, key=jax.random.key(8))[1]
    assert not np.array_equal(np.asarray(again), np.asarray(other))


def test_dropout_training_without_key_is_an_error():
    with pytest.raises(errors.NodeError, match="PRNG key"):
        jonnx.ops.call("Dropout", _f32(2, 2), np.float32(0.5), np.array(True), opset=13)


def test_dropout_zero_ratio_needs_no_key():
    x = _f32(2, 3)
    y, mask = jonnx.ops.call("Dropout", x, np.float32(0.0), np.array(True), opset=13)
    np.testing.assert_array_equal(np.asarray(y), x)
    assert np.asarray(mask).all()


@pytest.mark.parametrize("n_outputs", [1, 2])
def test_dropout_zero_ratio_graph_inputs_need_no_key_through_the_backend(n_outputs):
    # As the node suite's test_training_dropout_zero_ratio(_mask): ratio=0 and training_mode=1
    # arrive as graph inputs. A backend caller cannot pass a key, and none is needed since
    # nothing is drawn.
    from onnx.reference import ReferenceEvaluator

    import jonnx.backend

    inputs = {"x": _f32(3, 4, 5), "r": np.array(0.0, np.float32), "t": np.array(True)}
    model = node_model("Dropout", inputs, n_outputs, opset=22)
    want = ReferenceEvaluator(model).run(None, inputs)
    with jax.enable_x64(True):
        got = jonnx.backend.prepare(model).run(inputs)
    assert len(got) == len(want) == n_outputs
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), w)


def test_dropout_traced_training_mode_under_jit():
    x = _f32(20, 20)
    key = jax.random.key(0)
    f = jax.jit(lambda x, t: jonnx.ops.call("Dropout", x, np.float32(0.5), t, opset=13, key=key))
    y_on, m_on = f(x, jnp.array(True))
    y_off, m_off = f(x, jnp.array(False))
    np.testing.assert_array_equal(np.asarray(y_off), x)
    assert np.asarray(m_off).all() and not np.asarray(m_on).all()
    np.testing.assert_allclose(np.asarray(y_on), np.where(np.asarray(m_on), 2 * x, 0), rtol=1e-6)


def test_dropout_gradient_is_mask_over_keep_probability():
    x = _f32(6, 5)
    key = jax.random.key(3)
    f = lambda x: jonnx.ops.call("Dropout", x, np.float32(0.25), np.array(True), opset=13, key=key)
    g = jax.grad(lambda x: f(x)[0].sum())(x)
    mask = np.asarray(f(x)[1])
    np.testing.assert_allclose(np.asarray(g), mask / 0.75, rtol=1e-6)


# -- half precision ---------------------------------------------------------------------------------


def _normalized(x, axes, eps):
    mean = x.mean(axis=axes, keepdims=True)
    return (x - mean) / np.sqrt(((x - mean) ** 2).mean(axis=axes, keepdims=True) + eps)


def _channel_window_sums(x, size):
    """Each channel's sum over the ``size`` channels around it (LRN's window)."""
    before, after = (size - 1) // 2, size // 2
    padded = np.pad(x, ((0, 0), (before, after)) + ((0, 0),) * (x.ndim - 2))
    return sum(padded[:, k : k + x.shape[1]] for k in range(size))


def _half_cases():
    """(op, opset, inputs in float64, attributes, the op's formula over its inputs)."""
    x, c = RNG.standard_normal((2, 4, 5, 6)) * 3 + 1, RNG.standard_normal(4)
    v, w = RNG.standard_normal(6), RNG.standard_normal(6)

    def channel(p):
        return p.reshape(-1, 1, 1)

    return [
        ("LayerNormalization", 17, {"x": x, "scale": v, "bias": w}, {},
         lambda i: _normalized(i["x"], (3,), 1e-5) * i["scale"] + i["bias"]),
        ("BatchNormalization", 15, {"x": x, "scale": c, "bias": c[::-1], "mean": c / 4, "var": c * c + 0.5}, {},
         lambda i: (i["x"] - channel(i["mean"])) / np.sqrt(channel(i["var"]) + 1e-5) * channel(i["scale"])
         + channel(i["bias"])),
        ("BatchNormalization", 15, {"x": x, "scale": c, "bias": c[::-1], "mean": c / 4, "var": c * c + 0.5},
         {"training_mode": 1},
         lambda i: _normalized(i["x"], (0, 2, 3), 1e-5) * channel(i["scale"]) + channel(i["bias"])),
        ("InstanceNormalization", 22, {"x": x, "scale": c, "bias": c[::-1]}, {},
         lambda i: _normalized(i["x"], (2, 3), 1e-5) * channel(i["scale"]) + channel(i["bias"])),
        ("GroupNormalization", 21, {"x": x, "scale": c, "bias": c[::-1]}, {"num_groups": 2},
         lambda i: _normalized(i["x"].reshape(2, 2, -1), (2,), 1e-5).reshape(x.shape) * channel(i["scale"])
         + channel(i["bias"])),
        ("RMSNormalization", 23, {"x": x, "scale": v}, {},
         lambda i: i["x"] / np.sqrt((i["x"] ** 2).mean(axis=3, keepdims=True) + 1e-5) * i["scale"]),
        ("LpNormalization", 22, {"x": x}, {"axis": 1},
         lambda i: i["x"] / np.sqrt((i["x"] ** 2).sum(axis=1, keepdims=True))),
        ("LRN", 13, {"x": x}, {"size": 3, "alpha": 0.5, "beta": 0.75},
         lambda i: i["x"] / (1 + 0.5 / 3 * _channel_window_sums(i["x"] ** 2, 3)) ** 0.75),
        ("MeanVarianceNormalization", 13, {"x": x}, {},
         lambda i: (i["x"] - i["x"].mean(axis=(0, 2, 3), keepdims=True))
         / (i["x"].std(axis=(0, 2, 3), keepdims=True) + 1e-9)),
    ]  # fmt: skip


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("case", _half_cases(), ids=lambda c: c[0])
def test_half_precision_normalization_rounds_once(case, dtype):
    # Computed in float32 and rounded once, as onnxruntime does: step by step in the half type
    # (or cast back before the scale, as the function bodies do) the outputs were 1-4 units in
    # the last place off.
    op, opset, inputs, attrs, formula = case
    dtype = jnp.dtype(dtype)
    half = {k: v.astype(dtype) for k, v in inputs.items()}
    got = run_jonnx(node_model(op, half, opset=opset, **attrs), half)[0]
    assert_rounded_once(got, formula({k: v.astype(np.float64) for k, v in half.items()}), dtype, most_off=0.02)


@pytest.mark.parametrize(
    ("op", "shape", "attrs"),
    [
        ("LayerNormalization", (4, 16), {}),
        ("InstanceNormalization", (2, 3, 16), {}),
        ("GroupNormalization", (2, 4, 8), {"num_groups": 2}),
        ("MeanVarianceNormalization", (2, 3, 4, 4), {}),
        ("BatchNormalization", (4, 3, 8, 8), {}),
    ],
)
@pytest.mark.parametrize("value", [1234.567, 45865.05, 3.3e7])
def test_rows_of_equal_values_normalize_to_the_bias(op, shape, attrs, value):
    # Every centred value is 0, so the output is the bias (MeanVarianceNormalization: 0), as
    # onnxruntime gives. XLA sums a row in order in float32: the mean of 16 values of 45865.05
    # was 0.0078 off, and with eps 1e-5 the rows normalized to about +-1 (ops/normalization.py
    # ``centre`` sums around a pivot from the row). BatchNormalization: a channel of equal
    # values, its running mean their value (a tiny variance): folded into x * a + (b - m * a)
    # the output was 0.04 for a bias of 0.25 (onnxruntime's 0).
    x = np.full(shape, value, np.float32)
    channels = shape[-1] if op == "LayerNormalization" else shape[1]
    inputs = {"x": x}
    if op != "MeanVarianceNormalization":
        inputs.update(scale=np.full(channels, 1.5, np.float32), bias=np.full(channels, 0.25, np.float32))
    if op == "BatchNormalization":
        inputs.update(mean=np.full(channels, value, np.float32), var=np.full(channels, 1e-9, np.float32))
    got = run_jonnx(node_model(op, inputs, opset=21, **attrs), inputs)[0]
    want = np.zeros(shape, np.float32) if op == "MeanVarianceNormalization" else np.full(shape, 0.25, np.float32)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    ("op", "shape", "attrs", "axes"),
    [
        ("LayerNormalization", (4, 16), {}, (1,)),
        ("InstanceNormalization", (2, 3, 16), {}, (2,)),
        ("GroupNormalization", (2, 4, 8), {"num_groups": 2}, None),
        ("MeanVarianceNormalization", (2, 3, 4, 4), {}, (0, 2, 3)),
    ],
)
def test_rows_far_from_zero_normalize_as_in_float64(op, shape, attrs, axes):
    # Values near 3e6 a quarter apart (float32's spacing there): their mean rounded to float32
    # is off by up to an eighth, and rows centred on it came out up to 0.17 off
    # (ops/normalization.py ``centre`` centres on a pivot from the row instead; onnxruntime is
    # up to 2.9 off on such rows).
    x = (3e6 + 0.25 * np.random.default_rng(3).integers(-8, 9, shape)).astype(np.float32)
    wide = x.astype(np.float64)
    rows = wide.reshape(shape[0], 2, -1) if op == "GroupNormalization" else wide
    reduced = (2,) if op == "GroupNormalization" else axes
    centred = rows - rows.mean(axis=reduced, keepdims=True)
    spread = np.sqrt((centred**2).mean(axis=reduced, keepdims=True))
    inputs = {"x": x}
    if op == "MeanVarianceNormalization":
        want = centred / (spread + 1e-9)
    else:
        want = (centred / np.sqrt(spread**2 + 1e-5)).reshape(shape) * 1.5 + 0.25
        channels = shape[-1] if op == "LayerNormalization" else shape[1]
        inputs.update(scale=np.full(channels, 1.5, np.float32), bias=np.full(channels, 0.25, np.float32))
    got = run_jonnx(node_model(op, inputs, opset=21, **attrs), inputs)[0]
    np.testing.assert_allclose(got, want.reshape(shape), rtol=0, atol=2e-6)

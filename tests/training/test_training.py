"""jonnx.training: the train step, frozen parameters, mixed precision, fit, the ONNX-loss path,
inference helpers, and JAX transformations (per-example gradients, ensembles, remat) of
``Model.apply``.

Expected values come from numpy or from hand-written JAX functions of the same network
(independent of jonnx's interpreter), never from jonnx itself.
"""

from __future__ import annotations

import doctest
import importlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import optax
import pytest

import jonnx
from jonnx import errors, training

RNG = np.random.default_rng(0)
F = onnx.TensorProto.FLOAT


def f32(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def make_model(nodes, inputs, outputs, inits, opset=17):
    graph = oh.make_graph(nodes, "g", inputs, outputs, [onh.from_array(v, k) for k, v in inits.items()])
    return jonnx.load(oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)]))


# -- models ---------------------------------------------------------------------------------------

MOMENTUM, EPS = 0.8, 1e-5


def bn_model(training_mode=0):
    """x [N, 3, 4, 4] -> BatchNormalization (by default in eval mode in the graph) -> y."""
    inits = {
        "scale": np.array([1.0, 0.5, 2.0], np.float32),
        "bias": np.array([0.1, -0.2, 0.3], np.float32),
        "mean": np.array([0.5, -1.0, 0.0], np.float32),
        "var": np.array([1.0, 2.0, 0.5], np.float32),
    }
    node = oh.make_node(
        "BatchNormalization",
        ["x", "scale", "bias", "mean", "var"],
        ["y"],
        epsilon=EPS,
        momentum=MOMENTUM,
        training_mode=training_mode,
    )
    return make_model(
        [node],
        [oh.make_tensor_value_info("x", F, ["N", 3, 4, 4])],
        [oh.make_tensor_value_info("y", F, ["N", 3, 4, 4])],
        inits,
    ), inits


def _bn_reference(x, scale, bias, mean, var):
    shape = (1, -1, 1, 1)
    normalized = (x - np.reshape(mean, shape)) / np.sqrt(np.reshape(var, shape) + EPS)
    return normalized * np.reshape(scale, shape) + np.reshape(bias, shape)


def mlp_model(d_in=4, hidden=8, classes=3, seed=0, loss_node=False, dropout=False):
    """x -> Gemm -> Relu [-> Dropout] -> Gemm -> logits [-> SoftmaxCrossEntropyLoss(labels)]."""
    rng = np.random.default_rng(seed)
    inits = {
        "fc1.weight": (rng.standard_normal((hidden, d_in)) / np.sqrt(d_in)).astype(np.float32),
        "fc1.bias": (rng.standard_normal(hidden) * 0.1).astype(np.float32),
        "fc2.weight": (rng.standard_normal((classes, hidden)) / np.sqrt(hidden)).astype(np.float32),
        "fc2.bias": np.zeros(classes, np.float32),
    }
    nodes = [
        oh.make_node("Gemm", ["x", "fc1.weight", "fc1.bias"], ["h"], transB=1),
        oh.make_node("Relu", ["h"], ["r"]),
    ]
    if dropout:
        nodes.append(oh.make_node("Dropout", ["r"], ["d"]))
    nodes.append(oh.make_node("Gemm", ["d" if dropout else "r", "fc2.weight", "fc2.bias"], ["logits"], transB=1))
    inputs = [oh.make_tensor_value_info("x", F, ["N", d_in])]
    outputs = [oh.make_tensor_value_info("logits", F, ["N", classes])]
    if loss_node:
        nodes.append(oh.make_node("SoftmaxCrossEntropyLoss", ["logits", "labels"], ["loss"], reduction="mean"))
        inputs.append(oh.make_tensor_value_info("labels", onnx.TensorProto.INT64, ["N"]))
        outputs.append(oh.make_tensor_value_info("loss", F, []))
    return make_model(nodes, inputs, outputs, inits), inits


def mlp_reference(params, x):
    """The MLP written by hand in JAX (independent of jonnx)."""
    h = jax.nn.relu(x @ params["fc1.weight"].T + params["fc1.bias"])
    return h @ params["fc2.weight"].T + params["fc2.bias"]


def blobs(n=96, d_in=4, classes=3, seed=1):
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((classes, d_in)) * 3
    labels = rng.integers(0, classes, n)
    x = (centers[labels] + rng.standard_normal((n, d_in))).astype(np.float32)
    return x, labels.astype(np.int32)


# -- the step -------------------------------------------------------------------------------------


def test_step_updates_params_and_running_stats_by_the_onnx_momentum_rule():
    model, inits = bn_model()
    x, target = f32(5, 3, 4, 4, scale=2.0) + 1.0, f32(5, 3, 4, 4)
    lr = 0.1
    step = training.make_train_step(model, training.supervised_loss(model, optax.l2_loss, target="t"), optax.sgd(lr))
    ts = step.init()
    assert set(ts.params) == {"scale", "bias"} and set(ts.state) == {"mean", "var"}
    new, metrics = step(ts, {"x": x, "t": target}, None)

    # Running statistics: ONNX's rule with the batch mean and population variance (numpy).
    xd = x.astype(np.float64)
    batch_mean, batch_var = xd.mean(axis=(0, 2, 3)), xd.var(axis=(0, 2, 3))
    np.testing.assert_allclose(
        new.state["mean"], inits["mean"] * MOMENTUM + batch_mean * (1 - MOMENTUM), rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(
        new.state["var"], inits["var"] * MOMENTUM + batch_var * (1 - MOMENTUM), rtol=1e-5, atol=1e-6
    )

    # Parameters: one SGD step on a hand-written training-mode BatchNormalization.
    def reference_loss(p):
        y = (x - batch_mean.reshape(1, 3, 1, 1).astype(np.float32)) / np.sqrt(batch_var + EPS).reshape(
            1, 3, 1, 1
        ).astype(np.float32)
        y = y * p["scale"].reshape(1, 3, 1, 1) + p["bias"].reshape(1, 3, 1, 1)
        return jnp.mean(optax.l2_loss(y, target))

    params = {k: jnp.asarray(inits[k]) for k in ("scale", "bias")}
    loss, grads = jax.jit(jax.value_and_grad(reference_loss))(params)
    np.testing.assert_allclose(metrics["loss"], loss, rtol=1e-5)
    for k in params:
        np.testing.assert_allclose(new.params[k], params[k] - lr * grads[k], rtol=1e-5, atol=1e-6)
    assert int(new.step) == 1 and int(ts.step) == 0
    # The model's own arrays are untouched: training is functional.
    np.testing.assert_array_equal(model.state["mean"], inits["mean"])


def test_step_reports_aux_metrics_and_grad_norm():
    model, inits = mlp_model()
    x, y = blobs(16)
    step = training.make_train_step(model, training.classification_loss(model), optax.sgd(0.0))
    _, metrics = step(step.init(), {"x": x, "label": y}, None)
    logits = mlp_reference({k: jnp.asarray(v) for k, v in inits.items()}, x)
    np.testing.assert_allclose(metrics["accuracy"], np.mean(np.argmax(logits, -1) == y), rtol=1e-6)
    grads = jax.jit(jax.grad(lambda p: optax.softmax_cross_entropy_with_integer_labels(mlp_reference(p, x), y).mean()))(
        {k: jnp.asarray(v) for k, v in inits.items()}
    )
    expected_norm = np.sqrt(sum(float(jnp.sum(g * g)) for g in grads.values()))
    np.testing.assert_allclose(metrics["grad_norm"], expected_norm, rtol=1e-4)


def test_microbatches_give_the_whole_batch_gradient_for_a_mean_loss():
    """Four parts of 4 rows: the loss, accuracy, gradient norm and SGD step of the whole 16
    rows, by the MLP written by hand in JAX."""
    model, inits = mlp_model()
    x, y = blobs(16)
    lr = 0.5
    step = training.make_train_step(model, training.classification_loss(model), optax.sgd(lr), microbatches=4)
    assert "microbatches=4" in repr(step)
    new, metrics = step(step.init(), {"x": x, "label": y}, None)
    params = {k: jnp.asarray(v) for k, v in inits.items()}

    def reference_loss(p):
        return optax.softmax_cross_entropy_with_integer_labels(mlp_reference(p, x), y).mean()

    loss, grads = jax.jit(jax.value_and_grad(reference_loss))(params)
    np.testing.assert_allclose(metrics["loss"], loss, rtol=1e-5)
    np.testing.assert_allclose(metrics["accuracy"], np.mean(np.argmax(mlp_reference(params, x), -1) == y), rtol=1e-6)
    np.testing.assert_allclose(
        metrics["grad_norm"], np.sqrt(sum(float(jnp.sum(g * g)) for g in grads.values())), rtol=1e-4
    )
    for k in params:
        np.testing.assert_allclose(new.params[k], params[k] - lr * grads[k], rtol=1e-5, atol=1e-6)


def test_microbatches_update_running_statistics_part_by_part():
    """BatchNormalization in training mode: each part (rows j, j + 2, ...) normalized by its
    own statistics, the running statistics updated by ONNX's rule once per part (numpy)."""
    model, inits = bn_model()
    x, target = f32(6, 3, 4, 4, scale=2.0) + 1.0, f32(6, 3, 4, 4)
    lr = 0.1
    loss = training.supervised_loss(model, optax.l2_loss, target="t")
    step = training.make_train_step(model, loss, optax.sgd(lr), microbatches=2)
    new, metrics = step(step.init(), {"x": x, "t": target}, None)

    mean, var = inits["mean"].astype(np.float64), inits["var"].astype(np.float64)
    for part in (x[0::2], x[1::2]):
        xd = part.astype(np.float64)
        mean = mean * MOMENTUM + xd.mean(axis=(0, 2, 3)) * (1 - MOMENTUM)
        var = var * MOMENTUM + xd.var(axis=(0, 2, 3)) * (1 - MOMENTUM)
    np.testing.assert_allclose(new.state["mean"], mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(new.state["var"], var, rtol=1e-5, atol=1e-6)

    def part_loss(p, part, t):
        m, v = part.mean(axis=(0, 2, 3)), part.var(axis=(0, 2, 3))
        y = (part - m.reshape(1, 3, 1, 1)) / jnp.sqrt(v + EPS).reshape(1, 3, 1, 1)
        return jnp.mean(optax.l2_loss(y * p["scale"].reshape(1, 3, 1, 1) + p["bias"].reshape(1, 3, 1, 1), t))

    params = {k: jnp.asarray(inits[k]) for k in ("scale", "bias")}
    parts = [(x[0::2], target[0::2]), (x[1::2], target[1::2])]
    reference = jax.jit(jax.value_and_grad(lambda p: sum(part_loss(p, *pt) for pt in parts) / 2))
    want, grads = reference(params)
    np.testing.assert_allclose(metrics["loss"], want, rtol=1e-5)
    for k in params:
        np.testing.assert_allclose(new.params[k], params[k] - lr * grads[k], rtol=1e-5, atol=1e-6)


def test_microbatches_draw_their_own_dropout_masks():
    """With p = 0.5 and equal rows, equal masks in the parts would give equal halves of the
    gradient: the step's gradient differs from one part's doubled."""
    model, _ = mlp_model(dropout=True)
    x = np.repeat(blobs(1)[0], 8, axis=0)
    y = np.zeros(8, np.int32)
    loss = training.classification_loss(model)
    whole = training.make_train_step(model, loss, optax.sgd(1.0), microbatches=2)
    ts = whole.init()
    new, _ = whole(ts, {"x": x, "label": y}, jax.random.key(0))
    half = training.make_train_step(model, loss, optax.sgd(1.0))
    one, _ = half(ts, {"x": x[:4], "label": y[:4]}, jax.random.key(0))
    assert any(not np.allclose(new.params[k], one.params[k]) for k in new.params)


def test_microbatches_errors():
    model, _ = mlp_model()
    x, y = blobs(10)
    loss = training.classification_loss(model)
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="microbatches must be a positive int"):
            training.make_train_step(model, loss, optax.sgd(0.1), microbatches=bad)
    step = training.make_train_step(model, loss, optax.sgd(0.1), microbatches=4)
    with pytest.raises(ValueError, match="must divide the batch's 10 rows"):
        step(step.init(), {"x": x, "label": y}, None)
    with pytest.raises(ValueError, match="same number of rows"):
        step(step.init(), {"x": x[:8], "label": y}, None)


def test_dropout_needs_a_key_and_the_step_folds_in_its_count():
    model, _ = mlp_model(dropout=True)
    x, y = blobs(32)
    batch = {"x": x, "label": y}
    step = training.make_train_step(model, training.classification_loss(model), optax.sgd(0.1))
    ts = step.init()
    with pytest.raises(errors.NodeError, match="no PRNG key"):
        step(ts, batch, None)
    key = jax.random.key(3)
    a, ma = step(ts, batch, key)
    b, mb = step(ts, batch, key)
    np.testing.assert_array_equal(ma["loss"], mb["loss"])  # same key, same step: same masks
    _, mc = step(ts._replace(step=ts.step + 1), batch, key)
    assert float(mc["loss"]) != float(ma["loss"])  # another step count: other masks


def test_input_fn_and_batch_errors():
    model, _ = mlp_model()
    x, y = blobs(8)
    loss_fn = lambda outputs, batch: optax.softmax_cross_entropy_with_integer_labels(outputs[0], batch[1]).mean()  # noqa: E731
    step = training.make_train_step(model, loss_fn, optax.sgd(0.1), input_fn=lambda batch: (batch[0],))
    _, metrics = step(step.init(), (x, y), None)
    assert np.isfinite(float(metrics["loss"]))
    plain = training.make_train_step(model, loss_fn, optax.sgd(0.1))
    with pytest.raises(TypeError, match="input_fn"):
        plain(plain.init(), (x, y), None)
    cls = training.make_train_step(model, training.classification_loss(model), optax.sgd(0.1))
    with pytest.raises(errors.InputError, match=r"lacks model input\(s\) \['x'\]"):
        cls(cls.init(), {"label": y}, None)
    with pytest.raises(KeyError, match="'label'"):
        cls(cls.init(), {"x": x}, None)
    with pytest.raises(TypeError, match="optax.GradientTransformation"):
        training.make_train_step(model, loss_fn, "adam")
    with pytest.raises(errors.InputError, match="not trainable initializers"):
        cls.init(params={"nope": jnp.zeros(2)})
    with pytest.raises(ValueError, match="no output named 'nope'"):
        training.classification_loss(model, output="nope")


# -- frozen parameters ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, frozen_names",
    [
        ({"frozen": "fc1.*"}, {"fc1.weight", "fc1.bias"}),
        ({"frozen": re.compile(r"\.bias$")}, {"fc1.bias", "fc2.bias"}),
        ({"trainable": ["fc2.weight", "fc2.bias"]}, {"fc1.weight", "fc1.bias"}),
        ({"trainable": "fc*", "frozen": lambda n: n.endswith("weight")}, {"fc1.weight", "fc2.weight"}),
    ],
)
def test_frozen_params_are_unchanged_and_cost_no_optimizer_state(kwargs, frozen_names):
    model, inits = mlp_model()
    x, y = blobs(32)
    step = training.make_train_step(model, training.classification_loss(model), optax.adam(0.05), **kwargs)
    assert {n for n, m in step.mask.items() if not m} == frozen_names
    ts = step.init()
    trainable_size = sum(v.size for n, v in inits.items() if n not in frozen_names)
    # adam keeps mu and nu per trainable value plus a step count; nothing for frozen ones.
    assert sum(leaf.size for leaf in jax.tree.leaves(ts.opt_state)) == 2 * trainable_size + 1
    for _ in range(3):
        ts, _ = step(ts, {"x": x, "label": y}, None)
    for name, value in inits.items():
        if name in frozen_names:
            np.testing.assert_array_equal(ts.params[name], value)
        else:
            assert not np.allclose(ts.params[name], value)


def test_selector_errors():
    params = {"a.w": 0, "a.b": 0}
    with pytest.raises(ValueError, match="frozen selector 'b.*' matches no parameter"):
        training.trainable_mask(params, frozen="b.*")
    with pytest.raises(ValueError, match="trainable selector"):
        training.trainable_mask(params, trainable=re.compile("^x"))
    with pytest.raises(ValueError, match="no parameter is left to train"):
        training.trainable_mask(params, frozen="a.*")
    with pytest.raises(TypeError, match="cannot be a int"):
        training.trainable_mask(params, frozen=["a.w", 3])


# -- mixed precision ------------------------------------------------------------------------------


def test_mixed_precision_runs_and_stays_close_to_float32():
    model, _ = mlp_model(hidden=16)
    x, y = blobs(64)
    batch = {"x": x, "label": y}
    loss_fn = training.classification_loss(model)
    full = training.make_train_step(model, loss_fn, optax.adam(1e-2))
    mixed = training.make_train_step(model, loss_fn, optax.adam(1e-2), mixed_precision=True)
    ts_f, ts_m = full.init(), mixed.init()
    for _ in range(5):
        ts_f, m_f = full(ts_f, batch, None)
        ts_m, m_m = mixed(ts_m, batch, None)
    # Master weights, optimizer state and metrics stay float32.
    for leaf in jax.tree.leaves((ts_m.params, ts_m.opt_state)):
        assert leaf.dtype in (jnp.float32, jnp.int32)
    assert m_m["loss"].dtype == jnp.float32
    np.testing.assert_allclose(m_m["loss"], m_f["loss"], rtol=3e-2)
    for name in ts_f.params:
        np.testing.assert_allclose(ts_m.params[name], ts_f.params[name], atol=3e-2)


def test_mixed_precision_keeps_running_stats_float32():
    model, _ = bn_model()
    step = training.make_train_step(
        model, training.supervised_loss(model, optax.l2_loss, target="t"), optax.sgd(0.1), mixed_precision=True
    )
    x = f32(4, 3, 4, 4)
    ts, _ = step(step.init(), {"x": x, "t": x}, None)
    assert all(v.dtype == jnp.float32 for v in ts.state.values())
    expected = model.state["mean"] * MOMENTUM + x.astype(np.float64).mean(axis=(0, 2, 3)) * (1 - MOMENTUM)
    np.testing.assert_allclose(ts.state["mean"], expected, atol=2e-2)


# -- fit ------------------------------------------------------------------------------------------


def test_fit_reduces_the_loss_and_records_history(capsys):
    model, _ = mlp_model(hidden=16)
    x, y = blobs(128)
    batches = [{"x": x[i : i + 32], "label": y[i : i + 32]} for i in range(0, 128, 32)]
    loss_fn = training.classification_loss(model)
    step = training.make_train_step(model, loss_fn, optax.adam(0.03))
    seen = []

    def eval_fn(ts):
        seen.append(int(ts.step))
        return {"val_accuracy": training.evaluate(model, ts, batches, loss_fn)["accuracy"]}

    ts, history = training.fit(step, step.init(), batches, epochs=6, key=jax.random.key(0), eval_fn=eval_fn)
    assert int(ts.step) == 24 and seen == [4, 8, 12, 16, 20, 24]
    assert len(history.loss) == 24 and len(history.steps["accuracy"]) == 24
    assert [e["epoch"] for e in history.epochs] == [1, 2, 3, 4, 5, 6]
    np.testing.assert_allclose(history.epochs[0]["loss"], np.mean(history.loss[:4]), rtol=1e-6)
    assert history.epochs[-1]["loss"] < 0.5 * history.epochs[0]["loss"]
    assert history.epochs[-1]["val_accuracy"] > 0.8
    assert history.epochs[-1]["val_accuracy"] >= history.epochs[0]["val_accuracy"]
    err = capsys.readouterr().err
    assert "epoch 6/6" in err and "loss" in err  # the progress display (tqdm or text)


def test_fit_takes_a_callable_per_epoch_and_refuses_one_shot_iterators():
    model, _ = mlp_model()
    x, y = blobs(32)
    step = training.make_train_step(model, training.classification_loss(model), optax.sgd(0.1))
    epochs_seen = []

    def batches(epoch):
        epochs_seen.append(epoch)
        return [{"x": x, "label": y}]

    ts, history = training.fit(step, step.init(), batches, epochs=3, key=None, progress=False)
    assert epochs_seen == [0, 1, 2] and len(history.loss) == 3
    with pytest.raises(ValueError, match="one-shot iterator"):
        training.fit(step, ts, iter([{"x": x, "label": y}]), epochs=2, key=None, progress=False)
    with pytest.raises(ValueError, match="got no batches"):
        training.fit(step, ts, [], key=None, progress=False)


# -- a loss computed by the graph -----------------------------------------------------------------


def test_onnx_loss_op_path():
    model, inits = mlp_model(loss_node=True)
    x, y = blobs(64)
    batch = {"x": x, "labels": y}
    step = training.make_train_step(model, training.loss_from_output(model, "loss"), optax.sgd(0.2))
    ts = step.init()
    new, metrics = step(ts, batch, None)

    def reference_loss(p):
        return optax.softmax_cross_entropy_with_integer_labels(mlp_reference(p, x), y).mean()

    params = {k: jnp.asarray(v) for k, v in inits.items()}
    loss, grads = jax.jit(jax.value_and_grad(reference_loss))(params)
    np.testing.assert_allclose(metrics["loss"], loss, rtol=1e-5)
    for k in params:
        np.testing.assert_allclose(new.params[k], params[k] - 0.2 * grads[k], rtol=1e-4, atol=1e-6)
    ts, history = training.fit(step, ts, [batch] * 20, key=None, progress=False)
    assert history.loss[-1] < 0.5 * history.loss[0]
    with pytest.raises(ValueError, match="no output named"):
        training.loss_from_output(model, "logit")


# -- inference helpers ----------------------------------------------------------------------------


def test_predict_runs_in_inference_mode_and_batches():
    model, inits = bn_model()
    x = f32(7, 3, 4, 4)
    state = {"mean": jnp.array([0.1, 0.2, 0.3]), "var": jnp.array([2.0, 3.0, 4.0])}
    ts = training.TrainState(jnp.zeros((), jnp.int32), model.params, state, None)
    (y,) = training.predict(model, ts, x)
    expected = _bn_reference(x, inits["scale"], inits["bias"], state["mean"], state["var"])
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)
    (y_batched,) = training.predict(model, ts, x=x, batch_size=3)
    np.testing.assert_allclose(y_batched, y, rtol=1e-6, atol=1e-6)

    dropout, _ = mlp_model(dropout=True)
    xs, _ = blobs(5)
    (a,) = training.predict(dropout, None, xs)  # Dropout is the identity: no key needed
    np.testing.assert_allclose(
        a, mlp_reference({k: jnp.asarray(v) for k, v in dropout.params.items()}, xs), rtol=1e-5, atol=1e-6
    )


def test_evaluate_weights_batches_by_size():
    model, inits = mlp_model()
    x, y = blobs(10)
    batches = [{"x": x[:3], "label": y[:3]}, {"x": x[3:], "label": y[3:]}]
    metrics = training.evaluate(model, None, batches, training.classification_loss(model))
    logits = mlp_reference({k: jnp.asarray(v) for k, v in inits.items()}, x)
    np.testing.assert_allclose(metrics["accuracy"], np.mean(np.argmax(logits, -1) == y), rtol=1e-6)
    np.testing.assert_allclose(
        metrics["loss"], optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), rtol=1e-5
    )


@pytest.mark.parametrize("training_mode", [0, 1])
def test_predict_and_evaluate_run_the_models_own_call_in_inference_mode(training_mode):
    """predict and evaluate run the model's own call (its segments: layout pass, chunks, host
    nodes) with the given variables, in inference mode also for a graph exported in training
    mode; with a precision, apply(train=False) under their own jit."""
    model, inits = bn_model(training_mode)
    assert model.trains_by_default == bool(training_mode)
    state = {"mean": jnp.array([0.1, 0.2, 0.3]), "var": jnp.array([2.0, 3.0, 4.0])}
    ts = training.TrainState(jnp.zeros((), jnp.int32), model.params, state, None)
    x = f32(6, 3, 4, 4)
    want = _bn_reference(x, inits["scale"], inits["bias"], state["mean"], state["var"])
    (y,) = training.predict(model, ts, x)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    assert model._run_stages and model not in training._inference._COMPILED
    (y,) = training.predict(model, ts, x, precision=jax.lax.Precision.HIGHEST)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    assert model in training._inference._COMPILED
    # The model's own statistics when no train state is given.
    (y,) = training.predict(model, None, x)
    np.testing.assert_allclose(y, _bn_reference(x, *inits.values()), rtol=1e-5, atol=1e-5)


def test_predict_and_evaluate_run_host_nodes():
    """A model with a node on the host (NonZero's count decides a shape), which apply under
    one jit cannot run: predict and evaluate can, through the model's call."""
    nodes = [
        oh.make_node("NonZero", ["x"], ["where"]),
        oh.make_node("Shape", ["where"], ["shape"]),
        oh.make_node("Cast", ["shape"], ["count"], to=F),
    ]
    graph = oh.make_graph(
        nodes, "g", [oh.make_tensor_value_info("x", F, ["N", 3])], [oh.make_tensor_value_info("count", F, [2])]
    )
    counting = jonnx.load(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)]))
    xs = np.array([[0.0, 1.0, 2.0], [3.0, 0.0, 0.0]], np.float32)
    (count,) = training.predict(counting, None, xs)
    np.testing.assert_array_equal(count, [2.0, 3.0])  # two axes, three non-zeros
    metrics = training.evaluate(counting, None, [{"x": xs}], lambda outputs, batch: {"nonzero": outputs[0][1]})
    assert metrics == {"nonzero": 3.0}


@pytest.mark.parametrize("training_mode", [True, False])
def test_predict_runs_a_dropout_with_a_training_mode_input_as_the_identity(training_mode):
    """Dropout-12's training_mode input says whether the graph's own mode drops: predict runs
    the call in inference mode, where Dropout is the identity (no key needed) either way."""
    inits = {"ratio": np.array(0.5, np.float32), "mode": np.array(training_mode)}
    node = oh.make_node("Dropout", ["x", "ratio", "mode"], ["y"])
    model = make_model(
        [node], [oh.make_tensor_value_info("x", F, ["N", 4])], [oh.make_tensor_value_info("y", F, ["N", 4])], inits
    )
    x = f32(8, 4) + 3.0
    (y,) = training.predict(model, None, x)
    np.testing.assert_array_equal(y, x)
    if training_mode:  # the graph's own mode drops, with a key
        (dropped,) = model(x, key=jax.random.key(0))
        assert np.sum(np.asarray(dropped) == 0) > 0


# -- JAX transformations of Model.apply -----------------------------------------------------------


def _loss(model):
    def loss(params, x, y):
        (logits,) = model.apply(params, x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    return loss


def test_per_example_gradients_match_a_loop():
    model, _ = mlp_model()
    x, y = blobs(6)
    loss = _loss(model)
    per_example = jax.vmap(jax.grad(lambda p, xi, yi: loss(p, xi[None], yi[None])), in_axes=(None, 0, 0))
    grads = jax.jit(per_example)(model.params, x, y)
    single_grad = jax.jit(jax.grad(loss))
    for i in range(len(x)):
        single = single_grad(model.params, x[i : i + 1], y[i : i + 1])
        for k in single:
            np.testing.assert_allclose(grads[k][i], single[k], rtol=1e-5, atol=1e-6)


def test_ensembles_by_vmap_over_stacked_params():
    members = [mlp_model(seed=s)[0] for s in range(4)]
    model = members[0]
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *[m.params for m in members])
    x, _ = blobs(5)
    (logits,) = jax.jit(jax.vmap(lambda p: model.apply(p, x)))(stacked)
    assert logits.shape == (4, 5, 3)
    for i, member in enumerate(members):
        np.testing.assert_allclose(logits[i], member(x)[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(logits[i], mlp_reference(member.params, x), rtol=1e-5, atol=1e-6)


def test_checkpointed_apply_gives_the_same_gradients():
    model, _ = mlp_model(dropout=True)
    x, y = blobs(8)
    key = jax.random.key(7)

    def loss(params, apply):
        (logits,), _ = apply(params, x, key)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    def train_apply(params, x, key):
        return model.apply(params, x, train=True, key=key)

    plain = jax.jit(jax.grad(lambda p: loss(p, train_apply)))(model.params)
    # train is a Python flag: it stays outside the checkpointed function's arguments.
    remat = jax.checkpoint(train_apply)
    rematted = jax.jit(jax.grad(lambda p: loss(p, remat)))(model.params)
    for k in plain:
        np.testing.assert_allclose(rematted[k], plain[k], rtol=1e-6, atol=1e-7)
    assert any(float(jnp.abs(g).max()) > 0 for g in plain.values())


# -- docstring examples ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "jonnx.training",
        "jonnx.training._params",
        "jonnx.training._losses",
        "jonnx.training._step",
        "jonnx.training._loop",
        "jonnx.training._inference",
    ],
)
def test_doctests(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0

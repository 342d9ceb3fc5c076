"""Graphs exported in training mode, and running statistics that are not plain initializers.

The models reproduce what ``torch.onnx.export`` writes: with ``training=TrainingMode.PRESERVE``,
BatchNormalization-15 with ``training_mode=1`` and three outputs (the running-statistics
outputs dangling, or read downstream) and Dropout-13 with ``ratio`` and ``training_mode``
inputs; in eval mode with ``do_constant_folding=False``, running statistics routed through
``Identity`` nodes from deduplicated initializers. Fine-tuned, they must run in inference
mode, save to an inference graph that onnxruntime agrees with, and never train without their
running statistics.
"""

from __future__ import annotations

import copy
import pickle

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import onnx.helper as oh
import onnxruntime as ort
import optax
import pytest

import jonnx
from jonnx.training import classification_loss, evaluate, make_train_step, predict

FLOAT = onnx.TensorProto.FLOAT
C_IN, C, CLASSES, HW = 3, 4, 3, 6
MOMENTUM = 0.9  # what torch.onnx.export writes for nn.BatchNorm2d's default momentum=0.1


def _init(name: str, value) -> onnx.TensorProto:
    return onnx.numpy_helper.from_array(np.asarray(value), name)


def _resnet_block(rng: np.random.Generator, *, read_stats: bool = False) -> onnx.ModelProto:
    """conv-bn-relu, conv-bn, residual add, relu, pool, flatten, dropout, gemm: PRESERVE style.

    With ``read_stats`` the first BatchNormalization's new running mean is also a graph
    output (some exports expose it); otherwise the statistics outputs dangle, as PyTorch's do.
    """

    def bn(i: int, x: str, y: str) -> list[onnx.NodeProto]:
        return [
            oh.make_node(
                "BatchNormalization",
                [x, f"bn{i}.weight", f"bn{i}.bias", f"bn{i}.running_mean", f"bn{i}.running_var"],
                [y, f"bn{i}.mean_out", f"bn{i}.var_out"],
                name=f"/bn{i}/BatchNormalization",
                epsilon=1e-5,
                momentum=MOMENTUM,
                training_mode=1,
            )
        ]

    nodes = [
        oh.make_node("Conv", ["x", "conv0.weight"], ["c0"], name="/conv0/Conv", pads=[1, 1, 1, 1]),
        *bn(0, "c0", "b0"),
        oh.make_node("Relu", ["b0"], ["r0"], name="/relu0/Relu"),
        oh.make_node("Conv", ["r0", "conv1.weight"], ["c1"], name="/conv1/Conv", pads=[1, 1, 1, 1]),
        *bn(1, "c1", "b1"),
        oh.make_node("Add", ["b1", "r0"], ["s"], name="/Add"),
        oh.make_node("Relu", ["s"], ["r1"], name="/relu1/Relu"),
        oh.make_node("GlobalAveragePool", ["r1"], ["p"], name="/pool/GlobalAveragePool"),
        oh.make_node("Flatten", ["p"], ["f"], name="/Flatten"),
        oh.make_node("Dropout", ["f", "ratio", "training_mode"], ["d", ""], name="/dropout/Dropout"),
        oh.make_node("Gemm", ["d", "fc.weight", "fc.bias"], ["logits"], name="/fc/Gemm", transB=1),
    ]
    inits = [
        _init("conv0.weight", rng.normal(0, 0.4, (C, C_IN, 3, 3)).astype(np.float32)),
        _init("conv1.weight", rng.normal(0, 0.3, (C, C, 3, 3)).astype(np.float32)),
        _init("fc.weight", rng.normal(0, 0.5, (CLASSES, C)).astype(np.float32)),
        _init("fc.bias", np.zeros(CLASSES, np.float32)),
        _init("ratio", np.array(0.25, np.float32)),
        _init("training_mode", np.array(True)),
    ]
    for i in range(2):
        inits += [
            _init(f"bn{i}.weight", rng.uniform(0.5, 1.5, C).astype(np.float32)),
            _init(f"bn{i}.bias", rng.normal(0, 0.1, C).astype(np.float32)),
            _init(f"bn{i}.running_mean", np.zeros(C, np.float32)),
            _init(f"bn{i}.running_var", np.ones(C, np.float32)),
        ]
    outputs = [oh.make_tensor_value_info("logits", FLOAT, ["N", CLASSES])]
    if read_stats:
        outputs.append(oh.make_tensor_value_info("bn0.mean_out", FLOAT, [C]))
    graph = oh.make_graph(
        nodes, "main_graph", [oh.make_tensor_value_info("x", FLOAT, ["N", C_IN, HW, HW])], outputs, inits
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 15)])
    model.ir_version = 8
    return model


def _task(rng: np.random.Generator, n: int = 48) -> tuple[np.ndarray, np.ndarray]:
    """Three classes told apart by which input channel is bright, with a shifted mean."""
    y = rng.integers(0, CLASSES, n)
    x = rng.normal(2.0, 1.0, (n, C_IN, HW, HW)).astype(np.float32)
    x[np.arange(n), y] += 2.0
    return x, y


def _ort(path_or_proto, x: np.ndarray) -> list[np.ndarray]:
    data = path_or_proto if isinstance(path_or_proto, str) else path_or_proto.SerializeToString()
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})


def _fine_tune(model: jonnx.Model, x: np.ndarray, y: np.ndarray, steps: int = 20):
    step = make_train_step(model, classification_loss(model, target="y"), optax.adam(0.02))
    ts = step.init()
    losses = []
    for i in range(steps):
        ts, metrics = step(ts, {"x": x, "y": y}, jax.random.key(i))
        losses.append(float(metrics["loss"]))
    return ts, losses


def test_preserve_export_trains_infers_and_saves_for_inference(tmp_path):
    rng = np.random.default_rng(0)
    proto = _resnet_block(rng)
    model = jonnx.load(proto)
    assert set(model.state) == {f"bn{i}.{s}" for i in range(2) for s in ("running_mean", "running_var")}
    assert model.trains_by_default
    x, y = _task(rng)

    ts, losses = _fine_tune(model, x, y)
    assert np.mean(losses[-5:]) < 0.7 * np.mean(losses[:5]), losses
    moved = max(float(np.abs(ts.state[k] - model.state[k]).max()) for k in model.state)
    assert moved > 0.1  # the running statistics followed the batches

    # Inference: the running statistics, no Dropout, whatever the graph says.
    (logits,) = model.apply(ts.params, x, state=ts.state, train=False)
    (predicted,) = predict(model, ts, x)
    np.testing.assert_allclose(np.asarray(predicted), np.asarray(logits), rtol=1e-5, atol=1e-5)
    batches = [{"x": x[:24], "y": y[:24]}, {"x": x[24:], "y": y[24:]}]
    metrics = evaluate(model, ts, batches, classification_loss(model, target="y"))
    assert metrics["accuracy"] > 0.6

    path = str(tmp_path / "inference.onnx")
    jonnx.save(model, path, params=ts.params, state=ts.state, train=False)
    onnx.checker.check_model(path, full_check=True)
    saved = onnx.load(path)
    bns = [n for n in saved.graph.node if n.op_type == "BatchNormalization"]
    assert [list(n.output) for n in bns] == [["b0"], ["b1"]]
    assert all(oh.get_attribute_value(a) == 0 for n in bns for a in n.attribute if a.name == "training_mode")
    assert [list(n.input) for n in saved.graph.node if n.op_type == "Dropout"] == [["f", "ratio"]]
    stored = {t.name: onnx.numpy_helper.to_array(t) for t in saved.graph.initializer}
    for k, v in ts.state.items():
        np.testing.assert_array_equal(stored[k], np.asarray(v))  # the trained statistics

    reloaded = jonnx.load(path)
    assert not reloaded.trains_by_default
    (ours,) = reloaded(x)  # no key needed: nothing draws
    (theirs,) = _ort(path, x)
    np.testing.assert_allclose(np.asarray(ours), theirs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(theirs, np.asarray(logits), rtol=1e-5, atol=1e-5)


def test_default_save_keeps_the_training_graph(tmp_path):
    model = jonnx.load(_resnet_block(np.random.default_rng(1)))
    path = str(tmp_path / "same.onnx")
    jonnx.save(model, path)
    saved = onnx.load(path)
    assert [len(n.output) for n in saved.graph.node if n.op_type == "BatchNormalization"] == [3, 3]
    with pytest.raises(ValueError, match="train=True"):
        jonnx.save(model, path, train=True)


def test_statistics_read_downstream_pass_through_in_inference(tmp_path):
    rng = np.random.default_rng(2)
    proto = _resnet_block(rng, read_stats=True)
    model = jonnx.load(proto)
    x, _ = _task(rng, 8)
    state = {k: v + 0.5 for k, v in model.state.items()}

    logits, mean_out = model.apply(model.params, x, state=state, train=False)
    np.testing.assert_array_equal(np.asarray(mean_out), np.asarray(state["bn0.running_mean"]))

    (logits_t, mean_t), new_state = model.apply(model.params, x, state=state, key=jax.random.key(0))
    batch_mean = np.asarray(
        jax.jit(lambda p, x: model.apply(p, x, state=state, train=True, key=jax.random.key(0)))(model.params, x)[1][
            "bn0.running_mean"
        ]
    )
    np.testing.assert_allclose(np.asarray(mean_t), batch_mean, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(new_state["bn0.running_mean"]), batch_mean, rtol=1e-6)

    path = str(tmp_path / "stats.onnx")
    jonnx.save(model, path, state=state, train=False)
    onnx.checker.check_model(path, full_check=True)
    theirs = _ort(path, x)
    np.testing.assert_allclose(theirs[0], np.asarray(logits), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(theirs[1], np.asarray(state["bn0.running_mean"]), rtol=0, atol=0)


def test_what_each_train_value_returns():
    rng = np.random.default_rng(3)
    model = jonnx.load(_resnet_block(rng))
    x, _ = _task(rng, 8)
    key = jax.random.key(0)

    outputs = model.apply(model.params, x, train=False)
    assert isinstance(outputs, tuple) and len(outputs) == 1
    for train in (True, None):  # None: the graph itself trains, so its statistics come back
        outputs, new_state = model.apply(model.params, x, train=train, key=key)
        assert set(new_state) == set(model.state)
        assert not np.allclose(np.asarray(new_state["bn0.running_mean"]), 0)
    outputs, same = model.apply_with_state(model.params, x, train=False)
    for k, v in model.state.items():
        np.testing.assert_array_equal(np.asarray(same[k]), np.asarray(v))

    eval_model = jonnx.load(_eval_export_with_identities(rng)[0])
    assert not eval_model.trains_by_default
    assert len(eval_model.apply(eval_model.params, x)) == 1  # train=None: outputs only
    _, new_state = eval_model.apply(eval_model.params, x, train=True, key=key)
    assert set(new_state) == set(eval_model.state)


def _eval_export_with_identities(rng: np.random.Generator) -> tuple[onnx.ModelProto, list[str]]:
    """Eval export with constant folding off: BatchNormalization reads its statistics through
    Identity nodes from initializers deduplicated across the two nodes (zeros and ones), and
    the same zeros also serve as a Conv bias, as PyTorch's exporter writes it."""
    model = _resnet_block(rng)
    graph = model.graph
    for node in graph.node:
        if node.op_type == "BatchNormalization":
            del node.attribute[:]
            node.attribute.extend([oh.make_attribute("epsilon", 1e-5), oh.make_attribute("momentum", MOMENTUM)])
            del node.output[1:]
        if node.op_type == "Dropout":
            del node.input[2:]
        if node.name == "/conv0/Conv":
            node.input.append("zeros")
    stats = [f"bn{i}.{s}" for i in range(2) for s in ("running_mean", "running_var")]
    kept = [t for t in graph.initializer if t.name not in stats and t.name != "training_mode"]
    del graph.initializer[:]
    graph.initializer.extend(kept + [_init("zeros", np.zeros(C, np.float32)), _init("ones", np.ones(C, np.float32))])
    identities = [
        oh.make_node("Identity", ["zeros" if s.endswith("mean") else "ones"], [s], name=f"/Identity_{i}")
        for i, s in enumerate(stats)
    ]
    nodes = identities + list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)
    return model, stats


def test_identity_routed_statistics_are_state_and_save_as_their_own_initializers(tmp_path):
    rng = np.random.default_rng(4)
    proto, stats = _eval_export_with_identities(rng)
    model = jonnx.load(proto)
    assert set(model.state) == set(stats)
    assert "zeros" in model.params and "ones" not in model.params  # zeros is still a Conv bias
    assert model.untracked_state == {}
    x, y = _task(rng)
    ts, losses = _fine_tune(model, x, y)
    assert np.mean(losses[-5:]) < 0.7 * np.mean(losses[:5]), losses
    assert not np.allclose(np.asarray(ts.state["bn0.running_mean"]), 0)
    assert not np.allclose(np.asarray(ts.state["bn0.running_mean"]), np.asarray(ts.state["bn1.running_mean"]))

    (logits,) = model.apply(ts.params, x, state=ts.state, train=False)
    path = str(tmp_path / "tuned.onnx")
    jonnx.save(model, path, params=ts.params, state=ts.state)
    onnx.checker.check_model(path, full_check=True)
    saved = onnx.load(path)
    assert not [n for n in saved.graph.node if n.op_type == "Identity"]
    assert {t.name for t in saved.graph.initializer} >= set(stats) | {"zeros"}
    assert "ones" not in {t.name for t in saved.graph.initializer}  # nothing reads it any more
    reloaded = jonnx.load(path)
    for k in stats:
        np.testing.assert_array_equal(np.asarray(reloaded.state[k]), np.asarray(ts.state[k]))
    (theirs,) = _ort(path, x)
    np.testing.assert_allclose(theirs, np.asarray(logits), rtol=1e-5, atol=1e-5)


def _shared_statistic() -> onnx.ModelProto:
    """Two BatchNormalization nodes reading one initializer directly, and one reading a graph input."""
    nodes = [
        oh.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y1"], name="bn_a"),
        oh.make_node("BatchNormalization", ["y1", "s", "b", "m", "v"], ["y2"], name="bn_b"),
        oh.make_node("BatchNormalization", ["y2", "s", "b", "m_in", "v"], ["y3"], name="bn_c"),
    ]
    inits = [
        _init("s", np.ones(2, np.float32)),
        _init("b", np.zeros(2, np.float32)),
        _init("m", np.zeros(2, np.float32)),
        _init("v", np.ones(2, np.float32)),
    ]
    graph = oh.make_graph(
        nodes,
        "g",
        [oh.make_tensor_value_info("x", FLOAT, [4, 2]), oh.make_tensor_value_info("m_in", FLOAT, [2])],
        [oh.make_tensor_value_info("y3", FLOAT, [4, 2])],
        inits,
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 15)])


def test_statistics_that_cannot_be_state_refuse_training_by_name():
    model = jonnx.load(_shared_statistic())
    assert set(model.untracked_state) == {"bn_a", "bn_b", "bn_c"}
    assert "'m_in'" in model.untracked_state["bn_c"] and "graph input" in model.untracked_state["bn_c"]
    assert "bn_b" in model.untracked_state["bn_a"]
    x = np.arange(8, dtype=np.float32).reshape(4, 2)
    m_in = np.zeros(2, np.float32)
    with pytest.raises(jonnx.errors.NodeError, match=r"(?s)without running statistics.*'bn_a'.*'bn_c'"):
        model.apply(model.params, x, m_in, train=True)
    (y,) = model.apply(model.params, x, m_in, train=False)  # inference needs no state
    (theirs,) = ort.InferenceSession(_shared_statistic().SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x, "m_in": m_in}
    )
    np.testing.assert_allclose(np.asarray(y), theirs, rtol=1e-5, atol=1e-5)


def test_statistics_updated_inside_a_subgraph_are_refused():
    bn = oh.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], name="inner_bn")
    body = oh.make_graph([bn], "then", [], [oh.make_tensor_value_info("y", FLOAT, [4, 2])])
    other = oh.make_graph(
        [oh.make_node("Identity", ["x"], ["z"])], "else", [], [oh.make_tensor_value_info("z", FLOAT, [4, 2])]
    )
    node = oh.make_node("If", ["c"], ["out"], name="branch", then_branch=body, else_branch=other)
    inits = [
        _init("s", np.ones(2, np.float32)),
        _init("b", np.zeros(2, np.float32)),
        _init("m", np.zeros(2, np.float32)),
        _init("v", np.ones(2, np.float32)),
        _init("c", np.array(True)),
    ]
    graph = oh.make_graph(
        [node],
        "g",
        [oh.make_tensor_value_info("x", FLOAT, [4, 2])],
        [oh.make_tensor_value_info("out", FLOAT, [4, 2])],
        inits,
    )
    model = jonnx.load(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 15)]))
    x = np.arange(8, dtype=np.float32).reshape(4, 2)
    model.apply(model.params, x, train=False)
    assert "'inner_bn'" in model.untracked_state["branch"]
    with pytest.raises(jonnx.errors.NodeError, match="(?s)without running statistics.*'branch'.*subgraph"):
        model.apply(model.params, x, train=True)


def test_statistics_that_are_also_parameters_are_refused_not_tied():
    """tf2onnx's merge_duplication shares equal initializers: a fresh Keras BatchNormalization
    reads one tensor of ones as scale and running variance, one of zeros as shift and running
    mean (and the zeros are here a Gemm bias too). Kept as state, the scale and shift would
    stop being trained and would follow the running statistics' updates."""
    rng = np.random.default_rng(6)
    nodes = [
        oh.make_node("BatchNormalization", ["x", "ones", "zeros", "zeros", "ones"], ["y"], name="bn", epsilon=1e-3),
        oh.make_node("Gemm", ["y", "w", "zeros"], ["out"], name="fc"),
    ]
    inits = [
        _init("ones", np.ones(2, np.float32)),
        _init("zeros", np.zeros(2, np.float32)),
        _init("w", rng.normal(0, 1, (2, 2)).astype(np.float32)),
    ]
    graph = oh.make_graph(
        nodes,
        "g",
        [oh.make_tensor_value_info("x", FLOAT, ["N", 2])],
        [oh.make_tensor_value_info("out", FLOAT, ["N", 2])],
        inits,
    )
    proto = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 15)])
    model = jonnx.load(proto)
    assert model.state == {} and set(model.params) == {"ones", "zeros", "w"}
    why = model.untracked_state["bn"]
    assert "'ones' is also read as input 1 of node 'bn'" in why
    assert "'zeros' is also read as input 2 of node 'bn', input 2 of node 'fc'" in why
    x = rng.normal(0, 2, (4, 2)).astype(np.float32)
    with pytest.raises(jonnx.errors.NodeError, match="(?s)without running statistics.*'bn'.*initializer of its own"):
        model.apply(model.params, x, train=True)
    (y,) = model.apply(model.params, x, train=False)
    (theirs,) = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(np.asarray(y), theirs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("opset", [7, 9])
def test_legacy_batchnorm_with_five_outputs_saves_for_inference(tmp_path, opset):
    names = ["y", "mean_out", "var_out", "saved_mean", "saved_var"]
    bn = oh.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], names, name="bn", momentum=0.8)
    rng = np.random.default_rng(opset)
    inits = [
        _init("s", rng.uniform(0.5, 1.5, 2).astype(np.float32)),
        _init("b", np.zeros(2, np.float32)),
        _init("m", rng.normal(0, 1, 2).astype(np.float32)),
        _init("v", rng.uniform(0.5, 2, 2).astype(np.float32)),
    ]
    graph = oh.make_graph(
        [bn, oh.make_node("Add", ["y", "saved_mean"], ["out"])],
        "g",
        [oh.make_tensor_value_info("x", FLOAT, [5, 2])],
        [oh.make_tensor_value_info("out", FLOAT, [5, 2])],
        inits,
    )
    model = jonnx.load(oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)]))
    x = rng.normal(0, 2, (5, 2)).astype(np.float32)
    (_,), new_state = model.apply(model.params, x, train=True)
    (want,) = model.apply(model.params, x, state=new_state, train=False)
    path = str(tmp_path / "bn.onnx")
    jonnx.save(model, path, state=new_state, train=False)
    onnx.checker.check_model(path, full_check=True)
    (theirs,) = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(theirs, np.asarray(want), rtol=1e-5, atol=1e-5)


def test_models_pickle_and_deep_copy():
    rng = np.random.default_rng(5)
    proto, _ = _eval_export_with_identities(rng)
    model = jonnx.load(proto)
    x, _ = _task(rng, 4)
    (want,) = model(x)
    for other in (pickle.loads(pickle.dumps(model)), copy.deepcopy(model)):
        assert other is not model and set(other.state) == set(model.state)
        assert set(other.params) == set(model.params)
        (got,) = other(x)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
        (_, s1), (_, s2) = (m.apply(m.params, x, train=True, key=jax.random.key(0)) for m in (model, other))
        for k in s1:
            np.testing.assert_array_equal(np.asarray(s1[k]), np.asarray(s2[k]))


def test_pickled_model_with_external_data_is_self_contained(tmp_path):
    rng = np.random.default_rng(6)
    proto = _resnet_block(rng)
    path = str(tmp_path / "ext.onnx")
    onnx.save_model(
        proto,
        path,
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="ext.onnx.data",
        size_threshold=0,
    )
    model = jonnx.load(path)
    x, _ = _task(rng, 4)
    blob = pickle.dumps(model)
    (tmp_path / "ext.onnx.data").unlink()
    other = pickle.loads(blob)
    (a,) = model.apply(model.params, x, train=False)
    (b,) = other.apply(other.params, x, train=False)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert jnp.asarray(b).shape == (4, CLASSES)

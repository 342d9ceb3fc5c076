"""jonnx.save: fine-tuned params and running statistics written back to valid ONNX files."""

from __future__ import annotations

import os
import pathlib

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import onnxruntime as ort
import pytest

import jonnx
import jonnx._export
from jonnx import errors

SMALL_CNN = pathlib.Path(__file__).resolve().parents[1] / "examples" / "models" / "small_cnn.onnx"
F = onnx.TensorProto.FLOAT


def _ort(path, feeds: dict) -> list[np.ndarray]:
    session = ort.InferenceSession(os.fspath(path), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _tree_equal(a: dict, b: dict) -> None:
    assert set(a) == set(b)
    for name in a:
        x, y = np.asarray(a[name]), np.asarray(b[name])
        assert x.dtype == y.dtype and x.shape == y.shape, name
        np.testing.assert_array_equal(x, y, err_msg=name)


@pytest.fixture(scope="module")
def trained():
    """small_cnn after three SGD steps in training mode: (model, params, state, x)."""
    model = jonnx.load(SMALL_CNN)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 3, 16, 16)).astype(np.float32)
    labels = jnp.asarray(rng.integers(0, 10, size=8))

    def loss(params, state, key):
        (logits,), new_state = model.apply(params, x, state=state, train=True, key=key)
        picked = jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=1)
        return -jnp.mean(picked), new_state

    step = jax.jit(jax.value_and_grad(loss, has_aux=True))
    params, state = model.params, model.state
    key = jax.random.key(0)
    for _ in range(3):
        key, sub = jax.random.split(key)
        (_, state), grads = step(params, state, sub)
        params = jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads)
    return model, params, state, x


@pytest.fixture(scope="module")
def saved(trained, tmp_path_factory):
    model, params, state, _ = trained
    path = tmp_path_factory.mktemp("saved") / "tuned.onnx"
    jonnx.save(model, path, params=params, state=state)
    return path


def test_training_changed_params_and_state(trained):
    model, params, state, _ = trained
    for name in params:
        assert not np.array_equal(params[name], model.params[name]), name
    for name in state:
        assert not np.array_equal(state[name], model.state[name]), name


def test_onnxruntime_matches_jonnx_eval_on_saved_model(trained, saved):
    model, params, state, x = trained
    (expected,) = model.apply(params, x, state=state, train=False)
    (got,) = _ort(saved, {"image": x})
    np.testing.assert_allclose(got, np.asarray(expected), rtol=1e-4, atol=1e-5)
    # The new values matter: the source model gives different outputs.
    (before,) = _ort(SMALL_CNN, {"image": x})
    assert not np.allclose(before, got, atol=1e-3)


def test_saved_model_passes_full_check(saved):
    onnx.checker.check_model(os.fspath(saved), full_check=True)


def test_round_trip_gives_saved_params_and_state(trained, saved):
    _, params, state, _ = trained
    loaded = jonnx.load(saved)
    _tree_equal(loaded.params, params)
    _tree_equal(loaded.state, state)


def test_graph_is_unchanged_but_for_initializer_values(saved):
    source, out = onnx.load(SMALL_CNN), onnx.load(saved)
    assert len(out.graph.node) == len(source.graph.node)
    for a, b in zip(source.graph.node, out.graph.node):
        assert a == b, a.name  # same op, inputs, outputs, name and every attribute
    assert list(out.graph.input) == list(source.graph.input)
    assert list(out.graph.output) == list(source.graph.output)
    assert list(out.graph.value_info) == list(source.graph.value_info)
    assert list(out.opset_import) == list(source.opset_import)
    for field in ("ir_version", "producer_name", "producer_version", "domain", "model_version", "doc_string"):
        assert getattr(out, field) == getattr(source, field)
    assert list(out.metadata_props) == list(source.metadata_props)
    assert [t.name for t in out.graph.initializer] == [t.name for t in source.graph.initializer]
    for a, b in zip(source.graph.initializer, out.graph.initializer):
        assert (a.data_type, list(a.dims)) == (b.data_type, list(b.dims))


def test_partial_params_keep_the_others_byte_for_byte(tmp_path):
    model = jonnx.load(SMALL_CNN)
    new_bias = np.full(10, 0.5, np.float32)
    path = tmp_path / "m.onnx"
    jonnx.save(model, path, params={"fc.bias": new_bias})
    source = {t.name: t for t in onnx.load(SMALL_CNN).graph.initializer}
    for t in onnx.load(path).graph.initializer:
        if t.name == "fc.bias":
            np.testing.assert_array_equal(onh.to_array(t), new_bias)
        else:
            assert t == source[t.name], t.name


def test_saving_the_model_own_values_reproduces_the_file(tmp_path):
    path = tmp_path / "same.onnx"
    model = jonnx.load(SMALL_CNN)
    jonnx.save(model, path)
    assert onnx.load(path) == onnx.load(SMALL_CNN)
    jonnx.save(model, tmp_path / "same2.onnx", params=model.params, state=model.state)
    assert onnx.load(tmp_path / "same2.onnx") == onnx.load(SMALL_CNN)


# -- dtypes --------------------------------------------------------------------------------------


def _elementwise_model(inits: list[onnx.TensorProto], opset: int = 17) -> onnx.ModelProto:
    """y_i = x_i + w_i for each initializer w_i, x_i of the same type and shape."""
    nodes, inputs, outputs = [], [], []
    for i, w in enumerate(inits):
        nodes.append(oh.make_node("Add", [f"x{i}", w.name], [f"y{i}"], name=f"add{i}"))
        inputs.append(oh.make_tensor_value_info(f"x{i}", w.data_type, list(w.dims)))
        outputs.append(oh.make_tensor_value_info(f"y{i}", w.data_type, list(w.dims)))
    graph = oh.make_graph(nodes, "g", inputs, outputs, initializer=inits)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)], ir_version=8)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32])
def test_low_precision_params_keep_their_onnx_dtype(tmp_path, dtype):
    w = onh.from_array(np.linspace(-1, 1, 6).astype(dtype).reshape(2, 3), "w")
    model = jonnx.load(_elementwise_model([w]))
    new = model.params["w"] * 2 + 1
    assert new.dtype == np.dtype(dtype)
    path = tmp_path / "m.onnx"
    jonnx.save(model, path, params={"w": new})
    (tensor,) = onnx.load(path).graph.initializer
    assert tensor.data_type == w.data_type
    expected = (np.linspace(-1, 1, 6).astype(dtype).reshape(2, 3).astype(np.float32) * 2 + 1).astype(dtype)
    np.testing.assert_array_equal(onh.to_array(tensor), expected)
    onnx.checker.check_model(os.fspath(path), full_check=True)
    if dtype != ml_dtypes.bfloat16:  # onnxruntime's CPU Add has no bfloat16 kernel
        x = np.ones((2, 3), dtype)
        (y,) = _ort(path, {"x0": x})
        np.testing.assert_array_equal(y, (x.astype(np.float32) + expected.astype(np.float32)).astype(dtype))


def test_float64_initializer_stays_double_with_x64_off(tmp_path):
    w = onh.from_array(np.array([0.1, 0.2], np.float64), "w")
    model = jonnx.load(_elementwise_model([w]))
    assert model.params["w"].dtype == np.float32  # JAX's 32-bit default
    path = tmp_path / "m.onnx"
    jonnx.save(model, path, params={"w": jnp.array([1.5, 2.5], jnp.float32)})
    (tensor,) = onnx.load(path).graph.initializer
    assert tensor.data_type == onnx.TensorProto.DOUBLE
    np.testing.assert_array_equal(onh.to_array(tensor), np.array([1.5, 2.5], np.float64))


# -- external data -------------------------------------------------------------------------------


def _mlp() -> onnx.ModelProto:
    """x [N, 512] -> MatMul w1 (1 MiB) -> Add b1 -> Relu -> MatMul w2 (6 KiB) -> Add b2 (inline)."""
    rng = np.random.default_rng(1)
    inits = [
        onh.from_array(rng.normal(0, 0.05, (512, 3)).astype(np.float32), "w2"),
        onh.from_array(rng.normal(0, 0.05, (512, 512)).astype(np.float32), "w1"),
        onh.from_array(rng.normal(0, 0.1, 512).astype(np.float32), "b1"),
        onh.from_array(np.arange(3, dtype=np.float32), "b2"),
        onh.from_array(rng.normal(0, 1, 700).astype(np.float16), "unused_f16"),
    ]
    n = oh.make_node
    nodes = [
        n("MatMul", ["x", "w1"], ["h"], name="mm1"),
        n("Add", ["h", "b1"], ["hb"], name="add1"),
        n("Relu", ["hb"], ["r"], name="relu"),
        n("MatMul", ["r", "w2"], ["o"], name="mm2"),
        n("Add", ["o", "b2"], ["y"], name="add2"),
    ]
    graph = oh.make_graph(
        nodes,
        "mlp",
        [oh.make_tensor_value_info("x", F, ["N", 512])],
        [oh.make_tensor_value_info("y", F, ["N", 3])],
        initializer=inits,
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)
    model.metadata_props.add(key="author", value="tests")
    return model


def _external_layout(path) -> dict[str, tuple[int, int]]:
    """name -> (offset, length) of each externally stored initializer, checked for sanity."""
    proto = onnx.load(path, load_external_data=False)
    layout = {}
    for t in proto.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            info = {e.key: e.value for e in t.external_data}
            assert info["location"] == os.path.basename(path) + ".data"
            layout[t.name] = (int(info["offset"]), int(info["length"]))
        else:
            assert len(t.raw_data) < 1024, t.name
    spans = sorted(layout.values())
    for (o1, l1), (o2, _) in zip(spans, spans[1:]):
        assert o1 + l1 <= o2
    for offset, length in spans:
        assert offset % (4096 if length >= 1 << 20 else 64) == 0
    return layout


@pytest.fixture
def mlp_new_params():
    model = jonnx.load(_mlp())
    params = {k: v * 0.5 + 0.01 for k, v in model.params.items() if k != "unused_f16"}
    return model, params


@pytest.mark.parametrize("how", ["threshold", "forced"])
def test_external_data_file_layout_and_consumers(tmp_path, mlp_new_params, how):
    model, params = mlp_new_params
    path = tmp_path / "model.onnx"
    options = {"size_threshold": 100_000} if how == "threshold" else {"external_data": True}
    jonnx.save(model, path, params=params, **options)
    assert sorted(os.listdir(tmp_path)) == ["model.onnx", "model.onnx.data"]  # no temporary left
    layout = _external_layout(path)
    assert set(layout) == {"w1", "w2", "b1", "unused_f16"}  # b2 (12 bytes) stays inline
    assert layout["w1"][0] == 8192  # after w2 (6144 bytes), on the next page
    assert os.path.getsize(tmp_path / "model.onnx") < 2000
    data = (tmp_path / "model.onnx.data").read_bytes()
    assert len(data) == max(o + n for o, n in layout.values())
    o, n = layout["w1"]
    np.testing.assert_array_equal(np.frombuffer(data[o : o + n], "<f4").reshape(512, 512), np.asarray(params["w1"]))

    onnx.checker.check_model(os.fspath(path), full_check=True)
    loaded = jonnx.load(path)
    _tree_equal(loaded.params, {**model.params, **params})
    x = np.random.default_rng(2).normal(size=(4, 512)).astype(np.float32)
    (expected,) = model.apply(params, x)
    (got,) = _ort(path, {"x": x})
    np.testing.assert_allclose(got, np.asarray(expected), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(loaded(x)[0]), np.asarray(expected))
    # Only where the data lives changed.
    inline = onnx.load(path)
    source = _mlp()
    assert list(inline.graph.node) == list(source.graph.node)
    assert list(inline.metadata_props) == list(source.metadata_props)


def test_small_model_stays_inline_by_default(tmp_path, mlp_new_params):
    model, params = mlp_new_params
    jonnx.save(model, tmp_path / "model.onnx", params=params)
    assert os.listdir(tmp_path) == ["model.onnx"]
    proto = onnx.load(tmp_path / "model.onnx", load_external_data=False)
    assert all(t.data_location == onnx.TensorProto.DEFAULT for t in proto.graph.initializer)


def test_external_data_false_refuses_a_model_over_the_threshold(tmp_path, mlp_new_params):
    model, params = mlp_new_params
    with pytest.raises(ValueError, match="external_data=True"):
        jonnx.save(model, tmp_path / "model.onnx", params=params, external_data=False, size_threshold=100_000)
    assert os.listdir(tmp_path) == []


def _source_with_external_data(folder: pathlib.Path) -> tuple[pathlib.Path, dict[str, bytes]]:
    """The MLP plus odd-typed initializers, saved by onnx with external data; raw bytes by name."""
    proto = _mlp()
    nan = np.frombuffer(np.array([0x7FC00001, 0xFFC12345] * 300, np.uint32).tobytes(), np.float32)
    proto.graph.initializer.extend(
        [
            onh.from_array(nan, "nan_payloads"),
            onh.from_array(np.arange(300, dtype=np.int64), "int_table"),
            onh.from_array(np.linspace(-3, 3, 600).astype(ml_dtypes.bfloat16), "bf16"),
        ]
    )
    raw = {t.name: t.raw_data for t in proto.graph.initializer}
    path = folder / "src.onnx"
    onnx.save_model(proto, path, save_as_external_data=True, location="src.onnx.data", size_threshold=1024)
    return path, raw


@pytest.mark.parametrize("external", [False, True])
def test_source_external_data_is_kept_byte_for_byte(tmp_path, external):
    src_dir, out_dir = tmp_path / "src", tmp_path / "out"
    src_dir.mkdir()
    out_dir.mkdir()
    src, raw = _source_with_external_data(src_dir)
    stored = {t.name: t for t in onnx.load(src, load_external_data=False).graph.initializer}
    assert stored["w1"].data_location == stored["bf16"].data_location == onnx.TensorProto.EXTERNAL
    model = jonnx.load(src)
    new_w2 = np.asarray(model.params["w2"]) + 1
    path = out_dir / "src.onnx"  # same names as the source, another folder
    jonnx.save(model, path, params={"w2": new_w2}, external_data=external)
    onnx.checker.check_model(os.fspath(path), full_check=True)
    out = {t.name: t for t in onnx.load(path).graph.initializer}
    for name, data in raw.items():
        if name == "w2":
            np.testing.assert_array_equal(onh.to_array(out[name]), new_w2)
        else:
            assert out[name].raw_data == data, name
    # Nothing points back into the source folder.
    if external:
        _external_layout(path)
    else:
        assert os.listdir(out_dir) == ["src.onnx"]
    x = np.ones((2, 512), np.float32)
    np.testing.assert_allclose(_ort(path, {"x": x})[0], np.asarray(jonnx.load(path)(x)[0]), rtol=1e-5, atol=1e-5)


def _branchy_model() -> onnx.ModelProto:
    """If whose branches hold a Constant (attribute tensor) and an initializer, plus a Constant."""
    rng = np.random.default_rng(3)
    big_const = onh.from_array(rng.normal(size=400).astype(np.float32), "c")
    then_init = onh.from_array(rng.normal(size=400).astype(np.float32), "t_init")
    then_graph = oh.make_graph(
        [oh.make_node("Add", ["t_init", "k"], ["t_out"], name="then_add")],
        "then",
        [],
        [oh.make_tensor_value_info("t_out", F, [400])],
        initializer=[then_init],
    )
    else_graph = oh.make_graph(
        [
            oh.make_node(
                "Constant",
                [],
                ["e_out"],
                name="else_const",
                value=onh.from_array(rng.normal(size=400).astype(np.float32), "e_value"),
            )
        ],
        "else",
        [],
        [oh.make_tensor_value_info("e_out", F, [400])],
    )
    nodes = [
        oh.make_node("Constant", [], ["k"], name="const", value=big_const),
        oh.make_node("If", ["cond"], ["branch"], name="if", then_branch=then_graph, else_branch=else_graph),
        oh.make_node("Mul", ["branch", "w"], ["y"], name="mul"),
    ]
    w = onh.from_array(np.linspace(0, 1, 400).astype(np.float32), "w")
    graph = oh.make_graph(
        nodes,
        "branchy",
        [oh.make_tensor_value_info("cond", onnx.TensorProto.BOOL, [])],
        [oh.make_tensor_value_info("y", F, [400])],
        initializer=[w],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)


def test_external_subgraph_and_attribute_tensors_are_resolved(tmp_path):
    src_dir, out_dir = tmp_path / "src", tmp_path / "out"
    src_dir.mkdir()
    out_dir.mkdir()
    proto = _branchy_model()
    # (save_model moves the data out of the proto it is given: save a copy)
    onnx.save_model(
        _branchy_model(),
        src_dir / "b.onnx",
        save_as_external_data=True,
        location="b.data",
        size_threshold=1024,
        convert_attribute=True,
    )
    stored = onnx.load(src_dir / "b.onnx", load_external_data=False)
    assert stored.graph.node[0].attribute[0].t.data_location == onnx.TensorProto.EXTERNAL
    assert stored.graph.node[1].attribute[1].g.initializer[0].data_location == onnx.TensorProto.EXTERNAL
    model = jonnx.load(src_dir / "b.onnx")
    new_w = np.full(400, 2.0, np.float32)
    path = out_dir / "b.onnx"
    jonnx.save(model, path, params={"w": new_w})
    assert os.listdir(out_dir) == ["b.onnx"]
    onnx.checker.check_model(os.fspath(path), full_check=True)
    out = onnx.load(path)
    out.graph.initializer[0].CopyFrom(proto.graph.initializer[0])
    assert out == proto  # byte for byte, but for the new w
    for cond in (True, False):
        feeds = {"cond": np.array(cond)}
        (expected,) = model.apply({"w": new_w}, feeds["cond"])
        np.testing.assert_allclose(_ort(path, feeds)[0], np.asarray(expected), rtol=1e-6)


def test_trained_sparse_initializer_is_saved_dense(tmp_path):
    values = onh.from_array(np.array([1.0, 2.0], np.float32), "w")
    indices = onh.from_array(np.array([1, 3], np.int64), "w_indices")
    proto = _elementwise_model([onh.from_array(np.zeros(4, np.float32), "w")])
    del proto.graph.initializer[:]
    proto.graph.sparse_initializer.append(oh.make_sparse_tensor(values, indices, [4]))
    model = jonnx.load(proto)
    np.testing.assert_array_equal(model.params["w"], [0, 1, 0, 2])
    path = tmp_path / "m.onnx"
    jonnx.save(model, path, params={"w": model.params["w"] + 1})
    out = onnx.load(path)
    assert len(out.graph.sparse_initializer) == 0
    assert out.graph.initializer[0].name == "w"
    onnx.checker.check_model(os.fspath(path), full_check=True)
    np.testing.assert_array_equal(_ort(path, {"x0": np.zeros(4, np.float32)})[0], [1, 2, 1, 3])


def test_refuses_to_overwrite_the_source_models_own_data(tmp_path):
    src, _ = _source_with_external_data(tmp_path)
    before = (tmp_path / "src.onnx.data").read_bytes()
    model = jonnx.load(src)
    with pytest.raises(errors.ExternalDataError, match="source model's own external data"):
        jonnx.save(model, src, params={"b2": np.zeros(3, np.float32)}, external_data=True)
    assert (tmp_path / "src.onnx.data").read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["src.onnx", "src.onnx.data"]
    # Under another name, beside it, is fine; the source still loads.
    jonnx.save(model, tmp_path / "tuned.onnx", params={"b2": np.zeros(3, np.float32)}, external_data=True)
    _tree_equal(jonnx.load(src).params, model.params)
    np.testing.assert_array_equal(jonnx.load(tmp_path / "tuned.onnx").params["b2"], np.zeros(3, np.float32))


def test_refuses_a_data_file_that_is_a_link(tmp_path, mlp_new_params):
    model, params = mlp_new_params
    outside = tmp_path / "outside"
    outside.mkdir()
    target = outside / "victim.bin"
    target.write_bytes(b"keep")
    folder = tmp_path / "models"
    folder.mkdir()
    os.symlink(target, folder / "model.onnx.data")
    with pytest.raises(errors.ExternalDataError, match="symbolic link"):
        jonnx.save(model, folder / "model.onnx", params=params, external_data=True)
    assert target.read_bytes() == b"keep"
    assert not (folder / "model.onnx").exists()


def test_refuses_a_file_name_unfit_for_a_data_location(tmp_path, mlp_new_params):
    model, params = mlp_new_params
    with pytest.raises(errors.ExternalDataError, match="not a safe relative location"):
        jonnx.save(model, tmp_path / "a:b.onnx", params=params, external_data=True)
    assert os.listdir(tmp_path) == []


# -- errors --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"params": {"nope": np.zeros(3, np.float32)}}, r"\['nope'\] are not params"),
        ({"state": {"fc.weight": np.zeros((10, 16), np.float32)}}, r"belong in params="),
        ({"params": {"block1.bn.running_mean": np.zeros(8, np.float32)}}, r"belong in state="),
        ({"params": {"fc.bias": np.zeros(11, np.float32)}}, r"'fc.bias' has shape \[11\].*\[10\]"),
        ({"params": {"fc.weight": np.zeros((16, 10), np.float32)}}, r"shape \[16, 10\].*\[10, 16\]"),
        ({"params": {"fc.bias": np.zeros(10, np.int32)}}, r"'fc.bias' has dtype int32.*float32"),
        ({"state": {"block1.bn.running_var": np.ones(8, np.float16)}}, r"dtype float16.*float32"),
    ],
)
def test_bad_values_raise_input_error_and_write_nothing(tmp_path, kwargs, match):
    model = jonnx.load(SMALL_CNN)
    with pytest.raises(errors.InputError, match=match):
        jonnx.save(model, tmp_path / "m.onnx", **kwargs)
    assert os.listdir(tmp_path) == []


def test_traced_values_are_refused(tmp_path):
    model = jonnx.load(SMALL_CNN)

    @jax.jit
    def inside(params):
        jonnx.save(model, tmp_path / "m.onnx", params=params)
        return 0

    with pytest.raises(errors.InputError, match="traced value"):
        inside(model.params)


def test_bad_options(tmp_path):
    model = jonnx.load(SMALL_CNN)
    with pytest.raises(TypeError, match="external_data"):
        jonnx.save(model, tmp_path / "m.onnx", external_data="yes")
    with pytest.raises(ValueError, match="size_threshold"):
        jonnx.save(model, tmp_path / "m.onnx", size_threshold=-1)

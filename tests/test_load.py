"""Loading: paths, bytes and protos; external data kept inside the model folder; clear errors."""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnx.helper as oh
import pytest

import jonnx
from jonnx import errors


def _add_model(weight: onnx.TensorProto | None = None) -> onnx.ModelProto:
    w = weight if weight is not None else onnx.numpy_helper.from_array(np.arange(4, dtype=np.float32), "w")
    graph = oh.make_graph(
        [oh.make_node("Add", ["x", "w"], ["y"], name="add")],
        "g",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4])],
        initializer=[w],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])


def _external(location: str, *, offset: int = 0, length: int | None = 16, dims=(4,)) -> onnx.TensorProto:
    t = onnx.TensorProto(name="w", data_type=onnx.TensorProto.FLOAT, dims=list(dims))
    t.data_location = onnx.TensorProto.EXTERNAL
    entries = {"location": location, "offset": str(offset)}
    if length is not None:
        entries["length"] = str(length)
    for k, v in entries.items():
        t.external_data.add(key=k, value=v)
    return t


def _save(tmp_path, model: onnx.ModelProto, name: str = "model.onnx") -> str:
    path = tmp_path / name
    path.write_bytes(model.SerializeToString())
    return str(path)


X = np.ones(4, np.float32)


@pytest.mark.parametrize("kind", ["path", "pathlike", "bytes", "proto"])
def test_load_from_every_source(tmp_path, kind):
    model = _add_model()
    source = {
        "path": lambda: _save(tmp_path, model),
        "pathlike": lambda: tmp_path / os.path.basename(_save(tmp_path, model)),
        "bytes": model.SerializeToString,
        "proto": lambda: model,
    }[kind]()
    (y,) = jonnx.load(source)(X)
    np.testing.assert_array_equal(np.asarray(y), X + np.arange(4))


def test_external_data_inside_folder_is_read(tmp_path):
    data = np.arange(4, dtype=np.float32) * 10
    (tmp_path / "weights.bin").write_bytes(b"\0" * 8 + data.tobytes())
    path = _save(tmp_path, _add_model(_external("weights.bin", offset=8)))
    (y,) = jonnx.load(path)(X)
    np.testing.assert_array_equal(np.asarray(y), X + data)


def test_external_data_in_subfolder_is_read(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "w.bin").write_bytes(np.full(4, 2, np.float32).tobytes())
    (y,) = jonnx.load(_save(tmp_path, _add_model(_external("data/w.bin"))))(X)
    np.testing.assert_array_equal(np.asarray(y), X + 2)


@pytest.mark.parametrize("location", ["../secret.bin", "data/../../secret.bin", "/etc/passwd", "C:\\x.bin", ""])
def test_external_data_outside_folder_is_refused(tmp_path, location):
    inner = tmp_path / "model"
    (inner / "data").mkdir(parents=True)
    (tmp_path / "secret.bin").write_bytes(b"\0" * 16)
    with pytest.raises(errors.ExternalDataError, match="'w'"):
        jonnx.load(_save(inner, _add_model(_external(location))))


def test_external_data_symlink_is_refused(tmp_path):
    (tmp_path / "outside.bin").write_bytes(b"\0" * 16)
    folder = tmp_path / "model"
    folder.mkdir()
    os.symlink(tmp_path / "outside.bin", folder / "w.bin")
    with pytest.raises(errors.ExternalDataError, match="symbolic link"):
        jonnx.load(_save(folder, _add_model(_external("w.bin"))))


def test_external_data_symlinked_folder_is_refused(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "w.bin").write_bytes(b"\0" * 16)
    folder = tmp_path / "model"
    folder.mkdir()
    os.symlink(tmp_path / "elsewhere", folder / "data")
    with pytest.raises(errors.ExternalDataError, match="symbolic link"):
        jonnx.load(_save(folder, _add_model(_external("data/w.bin"))))


def test_external_data_hard_link_is_refused(tmp_path):
    (tmp_path / "outside.bin").write_bytes(b"\0" * 16)
    folder = tmp_path / "model"
    folder.mkdir()
    os.link(tmp_path / "outside.bin", folder / "w.bin")
    with pytest.raises(errors.ExternalDataError, match="hard links"):
        jonnx.load(_save(folder, _add_model(_external("w.bin"))))


@pytest.mark.parametrize(
    "offset,length,match",
    [(0, 12, "does not match"), (8, 16, "has only"), (-4, 16, "negative"), (0, None, None)],
)
def test_external_data_byte_counts_are_checked(tmp_path, offset, length, match):
    (tmp_path / "w.bin").write_bytes(b"\0" * 16)
    path = _save(tmp_path, _add_model(_external("w.bin", offset=offset, length=length)))
    if match is None:  # no length given: the dims decide, and 16 bytes are there
        np.testing.assert_array_equal(np.asarray(jonnx.load(path)(X)[0]), X)
    else:
        with pytest.raises(errors.ExternalDataError, match=match):
            jonnx.load(path)


def test_external_data_missing_file_names_tensor(tmp_path):
    with pytest.raises(errors.ExternalDataError, match="tensor 'w'.*cannot open"):
        jonnx.load(_save(tmp_path, _add_model(_external("nope.bin"))))


def test_external_data_from_bytes_needs_a_folder():
    with pytest.raises(errors.ExternalDataError, match="not loaded from a path"):
        jonnx.load(_add_model(_external("w.bin")).SerializeToString())


def test_external_data_unknown_key_is_refused(tmp_path):
    t = _external("w.bin")
    t.external_data.add(key="surprise", value="1")
    (tmp_path / "w.bin").write_bytes(b"\0" * 16)
    with pytest.raises(errors.ExternalDataError, match="unknown external data key"):
        jonnx.load(_save(tmp_path, _add_model(t)))


def test_raw_data_size_mismatch_names_tensor():
    t = onnx.TensorProto(name="w", data_type=onnx.TensorProto.FLOAT, dims=[4], raw_data=b"\0" * 12)
    with pytest.raises(errors.LoadError, match="'w'.*12 bytes"):
        jonnx.load(_add_model(t))


@pytest.mark.parametrize("data", [b"", b"\xff\xff\xff\xff garbage", b"\x08"])
def test_garbage_bytes_raise_load_error(data):
    with pytest.raises(errors.LoadError):
        jonnx.load(data)


def test_missing_file_raises_load_error(tmp_path):
    with pytest.raises(errors.LoadError, match="cannot read"):
        jonnx.load(tmp_path / "absent.onnx")


def test_three_unsupported_nodes_in_one_error():
    nodes = [
        oh.make_node("Neg", ["x"], ["a"], name="fine"),
        oh.make_node("NoSuchOp", ["a"], ["b"], name="first"),
        oh.make_node("AlsoMissing", ["b"], ["c"], name="second", domain="my.domain"),
        oh.make_node("NoSuchOp", ["c"], ["y"], name="third"),
    ]
    graph = oh.make_graph(
        nodes, "g", [oh.make_tensor_value_info("x", 1, [2])], [oh.make_tensor_value_info("y", 1, [2])]
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17), oh.make_opsetid("my.domain", 3)])
    with pytest.raises(errors.UnsupportedOpError) as info:
        jonnx.load(model)
    message = str(info.value)
    for name in ("first", "second", "third"):
        assert f"node {name!r}" in message
    assert "'my.domain', opset 3" in message and "'ai.onnx', opset 17" in message
    assert [n[0] for n in info.value.nodes] == ["first", "second", "third"]
    assert "fine" not in message


def test_unsorted_nodes_are_ordered():
    nodes = [oh.make_node("Abs", ["a"], ["y"], name="second"), oh.make_node("Neg", ["x"], ["a"], name="first")]
    graph = oh.make_graph(
        nodes, "g", [oh.make_tensor_value_info("x", 1, [2])], [oh.make_tensor_value_info("y", 1, [2])]
    )
    model = jonnx.load(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)]))
    assert [n.name for n in model.graph.nodes] == ["first", "second"]
    np.testing.assert_array_equal(np.asarray(model(np.array([1.0, -2.0], np.float32))[0]), [1.0, 2.0])


@pytest.mark.parametrize(
    "nodes,match",
    [
        ([oh.make_node("Relu", ["ghost"], ["y"], name="n")], "reads 'ghost'"),
        ([oh.make_node("Relu", ["x"], ["y"], name="a"), oh.make_node("Neg", ["x"], ["y"], name="b")], "produced twice"),
        ([oh.make_node("Relu", ["z"], ["y"], name="a"), oh.make_node("Neg", ["y"], ["z"], name="b")], "cycle"),
    ],
)
def test_malformed_graphs(nodes, match):
    graph = oh.make_graph(
        nodes, "g", [oh.make_tensor_value_info("x", 1, [2])], [oh.make_tensor_value_info("y", 1, [2])]
    )
    with pytest.raises(errors.ModelStructureError, match=match):
        jonnx.load(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)]))


def test_missing_required_attribute_names_node():
    node = oh.make_node("Cast", ["x"], ["y"], name="needs_to")
    graph = oh.make_graph(
        [node], "g", [oh.make_tensor_value_info("x", 1, [2])], [oh.make_tensor_value_info("y", 1, [2])]
    )
    with pytest.raises(errors.ModelStructureError, match="'needs_to'.*'to'"):
        jonnx.load(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)]))


def test_opset_newer_than_onnx_is_refused_unless_allowed():
    graph = oh.make_graph(
        [oh.make_node("Relu", ["x"], ["y"])],
        "g",
        [oh.make_tensor_value_info("x", 1, [2])],
        [oh.make_tensor_value_info("y", 1, [2])],
    )
    newer = onnx.defs.onnx_opset_version() + 5
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", newer)])
    with pytest.raises(errors.UnsupportedOpError, match=f"opset {newer}.*allow_newer_opset=True"):
        jonnx.load(model)
    with pytest.warns(UserWarning, match="newer than"):
        m = jonnx.load(model, allow_newer_opset=True)
    np.testing.assert_array_equal(np.asarray(m(np.array([-1.0, 1.0], np.float32))[0]), [0.0, 1.0])


def _two_adds(opset: int, first=None, relu=None, second=None) -> onnx.ModelProto:
    nodes = [
        oh.make_node("Add", ["x", "b"], ["t"], name="first", **(first or {})),
        oh.make_node("Relu", ["t"], ["r"], name="relu", **(relu or {})),
        oh.make_node("Add", ["r", "b"], ["y"], name="second", **(second or {})),
    ]
    graph = oh.make_graph(
        nodes,
        "g",
        [oh.make_tensor_value_info("x", 1, [2, 3]), oh.make_tensor_value_info("b", 1, [3])],
        [oh.make_tensor_value_info("y", 1, [2, 3])],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def test_unknown_attributes_are_a_load_error_naming_node_and_attribute():
    import onnxruntime as ort

    model = _two_adds(13, first={"broadcast": 1}, relu={"leak": 0.1})
    # onnxruntime refuses the model too.
    with pytest.raises(Exception, match="Unrecognized attribute"):
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with pytest.raises(errors.ModelStructureError) as info:
        jonnx.load(model)
    message = str(info.value)
    assert "node 'first': Add-13" in message and "'broadcast'" in message
    assert "node 'relu': Relu-" in message and "'leak'" in message
    assert "allow_unknown_attributes=True" in message

    x = np.array([[-1.0, 2.0, -3.0], [4.0, -5.0, 6.0]], np.float32)
    b = np.array([0.5, -0.5, 1.0], np.float32)
    with pytest.warns(UserWarning, match=r"(?s)'broadcast'.*'leak'.*ignored"):
        m = jonnx.load(model, allow_unknown_attributes=True)
    # Ignored, the model is the one onnxruntime runs without the leftovers.
    clean = _two_adds(13)
    (want,) = ort.InferenceSession(clean.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x, "b": b}
    )
    np.testing.assert_allclose(np.asarray(m(x, b)[0]), want, rtol=1e-6)


@pytest.mark.parametrize(
    "op, inputs, opset, message",
    [
        # A later version's input at an older opset: ReduceSum-13's axes, Clip-11's bounds,
        # Split-13's sizes were attributes before; run, they were ignored (silently wrong).
        ("ReduceSum", ["x", "axes"], 11, "has 2 inputs; ReduceSum-11 takes 1"),
        ("Clip", ["x", "lo"], 6, "has 2 inputs; Clip-6 takes 1"),
        ("Split", ["x", "sizes"], 11, "has 2 inputs; Split-11 takes 1"),
        ("Add", ["x"], 14, "has 1 input; Add-14 takes 2"),
        ("Sum", [], 13, "has 0 inputs; Sum-13 takes at least 1"),
    ],
)
def test_input_counts_outside_the_schema_are_a_load_error(op, inputs, opset, message):
    import onnxruntime as ort

    graph = oh.make_graph(
        [oh.make_node(op, inputs, ["y"], name="n")],
        "g",
        [oh.make_tensor_value_info("x", 1, [2, 3])],
        [oh.make_tensor_value_info("y", 1, None)],
        [oh.make_tensor(n, onnx.TensorProto.INT64 if n != "lo" else 1, [1], [1]) for n in inputs if n != "x"],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)])
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(model)
    with pytest.raises(Exception, match="INVALID_GRAPH|FAIL"):  # onnxruntime refuses it too
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with pytest.raises(errors.ModelStructureError, match=f"node 'n' \\({op}, opset \\d+\\) {message}"):
        jonnx.load(model)


def test_output_counts_outside_the_schema_are_a_load_error():
    graph = oh.make_graph(
        [oh.make_node("Relu", ["x"], ["y", "extra"], name="n")],
        "g",
        [oh.make_tensor_value_info("x", 1, [2])],
        [oh.make_tensor_value_info("y", 1, [2])],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 14)])
    with pytest.raises(errors.ModelStructureError, match="has 2 outputs; Relu-14 takes 1"):
        jonnx.load(model)


def test_legacy_attributes_valid_at_their_opset_load():
    # broadcast/axis belong to Add up to opset 6: not unknown there.
    model = _two_adds(6, first={"broadcast": 1, "axis": 1}, second={"broadcast": 1})
    x = np.ones((2, 3), np.float32)
    b = np.arange(3, dtype=np.float32)
    np.testing.assert_allclose(np.asarray(jonnx.load(model)(x, b)[0]), np.maximum(x + b, 0) + b)

"""Valid models that look odd still load and run correctly: the hostile-model checks must not
refuse them. Expected values come from numpy (or onnxruntime where noted), never from jonnx."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import onnxruntime as ort
import pytest

import jonnx
from jonnx._build import MAX_FUNCTION_DEPTH, MAX_GRAPH_DEPTH
from tests.security._models import (
    FN_DOMAIN,
    branch,
    call,
    chain_functions,
    const,
    const_tensor_node,
    external,
    function,
    graph,
    model,
    nested_ifs,
    vi,
)

X = np.array([-2.0, -0.5, 1.0, 3.0], np.float32)
INT64_MAX, INT64_MIN = np.iinfo(np.int64).max, np.iinfo(np.int64).min


def _run(m, *args, **kw):
    return [np.asarray(v) for v in jonnx.load(m, **kw)(*args)]


def test_function_defined_after_its_caller_through_three_levels():
    # The main graph calls Top, defined last; Top calls Mid, Mid calls Leaf, each defined
    # before the one that needs it is: order in ModelProto.functions means nothing.
    fs = [
        function("Leaf", [oh.make_node("Mul", ["a", "a"], ["b"])]),
        function("Mid", [call("Leaf", ["a"], ["t"]), oh.make_node("Add", ["t", "a"], ["b"])]),
        function("Top", [call("Mid", ["a"], ["t"]), oh.make_node("Neg", ["t"], ["b"])]),
    ]
    m = model(graph([call("Top")]), functions=list(reversed(fs)))
    np.testing.assert_allclose(_run(m, X)[0], -(X * X + X), rtol=1e-6)


def test_function_nesting_up_to_the_limit():
    m = model(graph([call("F0")]), functions=chain_functions(MAX_FUNCTION_DEPTH - 1))
    np.testing.assert_array_equal(_run(m, X)[0], -X)


def test_external_data_at_offsets_in_a_shared_file(tmp_path):
    # One file in a subfolder holds an initializer, a Constant's value and a sparse tensor's
    # values and indices, each at its own offset; padding bytes between them.
    a = np.array([10, 20, 30, 40], np.float32)
    c = np.array([1, 2, 3, 4], np.float32)
    sv, si = np.array([5, 7], np.float32), np.array([1, 3], np.int64)
    blob = b"HDR!" + a.tobytes() + b"\0" * 4 + c.tobytes() + sv.tobytes() + si.tobytes()
    (tmp_path / "weights").mkdir()
    (tmp_path / "weights" / "all.bin").write_bytes(blob)
    w = external("w", "weights/all.bin", offset=4, length=16)
    cv = external("cval", "./weights/all.bin", offset=24, length=None)
    sparse = oh.make_sparse_tensor(
        external("sp", "weights/all.bin", offset=40, length=8, dims=(2,)),
        external("sp_idx", "weights/all.bin", offset=48, length=16, dims=(2,), elem=onnx.TensorProto.INT64),
        [4],
    )
    nodes = [
        const_tensor_node(cv, "c", "const_node"),
        oh.make_node("Add", ["x", "w"], ["t"]),
        oh.make_node("Add", ["t", "c"], ["u"]),
        oh.make_node("Add", ["u", "sp"], ["y"]),
    ]
    path = tmp_path / "model.onnx"
    path.write_bytes(model(graph(nodes, inits=[w], sparse=[sparse])).SerializeToString())
    np.testing.assert_array_equal(_run(str(path), X)[0], X + a + c + np.array([0, 5, 0, 7], np.float32))


def test_empty_external_tensor(tmp_path):
    (tmp_path / "empty.bin").write_bytes(b"")
    e = external("e", "empty.bin", length=0, dims=(0,))
    nodes = [oh.make_node("Concat", ["x", "e"], ["y"], axis=0)]
    path = tmp_path / "model.onnx"
    path.write_bytes(model(graph(nodes, inits=[e])).SerializeToString())
    np.testing.assert_array_equal(_run(str(path), X)[0], X)


@pytest.mark.parametrize("depth,source", [(30, "bytes"), (MAX_GRAPH_DEPTH - 1, "proto")])
def test_deep_but_legal_nesting(depth, source):
    # From bytes, protobuf itself stops a little past 30 nested subgraphs (its recursion
    # limit); an in-memory proto may nest up to jonnx's own limit.
    m = nested_ifs(depth)
    (y,) = _run(m.SerializeToString() if source == "bytes" else m, X)
    np.testing.assert_array_equal(y, -X)


def test_long_chain_listed_backwards():
    # 2000 nodes in reverse order: a deep graph (not nested) sorted without recursion.
    n = 2000
    nodes = [oh.make_node("Neg", [f"v{i}"], [f"v{i + 1}" if i + 1 < n else "y"], name=f"n{i}") for i in range(n)]
    nodes[0].input[0] = "x"
    m = jonnx.load(model(graph(list(reversed(nodes)))))
    assert [node.name for node in m.graph.nodes] == [f"n{i}" for i in range(n)]


@pytest.mark.parametrize(
    "starts,ends,steps",
    [
        ([1], [INT64_MAX], [1]),
        ([-1], [INT64_MIN], [-1]),
        ([INT64_MIN], [INT64_MAX], [2]),
        ([0, INT64_MAX], [INT64_MAX, INT64_MIN], [1, -2]),
    ],
)
def test_slice_with_int64_extremes(starts, ends, steps):
    data = np.arange(24, dtype=np.float32).reshape(4, 6)
    axes = list(range(len(starts)))
    nodes = [const(n, np.array(v, np.int64)) for n, v in (("s", starts), ("e", ends), ("a", axes), ("p", steps))]
    nodes.append(oh.make_node("Slice", ["x", "s", "e", "a", "p"], ["y"]))
    m = model(graph(nodes, inputs=[vi("x", [4, 6])], outputs=[vi("y", None)]))
    index = tuple(slice(s, e, p) for s, e, p in zip(starts, ends, steps))
    np.testing.assert_array_equal(_run(m, data)[0], data[index])


def test_gather_with_negative_indices():
    data = np.arange(12, dtype=np.float32).reshape(4, 3)
    indices = np.array([[-1, 0], [-4, 2]], np.int64)
    for axis in (0, 1):
        idx = indices if axis == 0 else np.array([-1, -3, 0], np.int64)
        nodes = [const("i", idx), oh.make_node("Gather", ["x", "i"], ["y"], axis=axis)]
        m = model(graph(nodes, inputs=[vi("x", [4, 3])], outputs=[vi("y", None)]))
        np.testing.assert_array_equal(_run(m, data)[0], np.take(data, idx, axis=axis))


def test_gather_with_negative_runtime_indices_matches_onnxruntime():
    data = np.arange(12, dtype=np.float32).reshape(4, 3)
    idx = np.array([-1, -2, 3], np.int64)
    m = model(
        graph(
            [oh.make_node("Gather", ["x", "i"], ["y"], axis=0)],
            inputs=[vi("x", [4, 3]), vi("i", [3], onnx.TensorProto.INT64)],
            outputs=[vi("y", [3, 3])],
        ),
        opsets=[oh.make_opsetid("", 18)],
    )
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": data, "i": idx}
    )[0]
    np.testing.assert_array_equal(_run(m, data, idx)[0], want)


def test_unnamed_and_duplicate_node_names():
    # Node names are optional and need not be unique.
    nodes = [
        oh.make_node("Neg", ["x"], ["a"], name="same"),
        oh.make_node("Abs", ["a"], ["b"], name="same"),
        oh.make_node("Neg", ["b"], ["y"]),
    ]
    np.testing.assert_array_equal(_run(model(graph(nodes)), X)[0], -np.abs(X))


def test_input_with_an_initializer_default():
    # IR < 4 style: an initializer that is also listed as a graph input is a default value.
    w = onh.from_array(np.ones(4, np.float32), "w")
    g = graph([oh.make_node("Add", ["x", "w"], ["y"])], inits=[w], inputs=[vi("x"), vi("w")])
    m = jonnx.load(model(g))
    assert m.input_names == ("x",)
    np.testing.assert_array_equal(np.asarray(m(X)[0]), X + 1)


def test_sparse_initializer_with_coordinate_indices():
    values = onh.from_array(np.array([1.0, 2.0], np.float32), "sp")
    indices = onh.from_array(np.array([[0, 1], [1, 0]], np.int64), "sp_idx")
    sp = oh.make_sparse_tensor(values, indices, [2, 2])
    g = graph(
        [oh.make_node("Add", ["x", "sp"], ["y"])], sparse=[sp], inputs=[vi("x", [2, 2])], outputs=[vi("y", [2, 2])]
    )
    np.testing.assert_array_equal(_run(model(g), np.zeros((2, 2), np.float32))[0], [[0, 1], [2, 0]])


def test_unused_odd_initializers_and_empty_tensors():
    # A string initializer nobody reads, an empty tensor without data, an unused opset import.
    s = onh.from_array(np.array(["ünïcode", ""], dtype=object), "labels")
    empty = onnx.TensorProto(name="none", data_type=onnx.TensorProto.FLOAT, dims=[0, 3])
    g = graph([oh.make_node("Neg", ["x"], ["y"], name="név ☃")], inits=[s, empty])
    m = model(g, opsets=[oh.make_opsetid("", 18), oh.make_opsetid("com.unused", 42), oh.make_opsetid(FN_DOMAIN, 1)])
    np.testing.assert_array_equal(_run(m, X)[0], -X)


def test_subgraph_reads_outer_values_at_several_levels():
    # Branches read names from two scopes up, and shadowing-free reuse of names across branches.
    inner = branch([oh.make_node("Add", ["x", "w"], ["t2"])], "t2", "inner")
    then = branch(
        [
            const("c2", np.array(True), node="c2_node"),
            oh.make_node(
                "If",
                ["c2"],
                ["t"],
                then_branch=inner,
                else_branch=branch([oh.make_node("Identity", ["x"], ["z"])], "z", "z"),
            ),
        ],
        "t",
        "then",
    )
    nodes = [
        const("w", np.full(4, 2, np.float32)),
        const("c", np.array(True)),
        oh.make_node(
            "If",
            ["c"],
            ["y"],
            then_branch=then,
            else_branch=branch([oh.make_node("Identity", ["x"], ["e"])], "e", "else"),
        ),
    ]
    np.testing.assert_array_equal(_run(model(graph(nodes)), X)[0], X + 2)

"""Segmented execution: data-dependent shapes compile once per shape, never per value.

Compilations are counted with ``jax.monitoring``'s backend-compile event; expected outputs
come from onnxruntime.
"""

from __future__ import annotations

import gc
import time
import tracemalloc
import weakref

import jax
import numpy as np
import onnx
import onnx.helper as oh
import pytest
from onnx import TensorProto, numpy_helper

import jonnx
from jonnx import _interpreter, errors
from tests._compiles import count_compiles

ort = pytest.importorskip("onnxruntime")


def _ort(model: onnx.ModelProto, feeds: dict) -> list:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _init(name, value):
    return numpy_helper.from_array(np.asarray(value), name)


def _detector() -> onnx.ModelProto:
    """Conv backbone -> per-pixel box deltas and a score -> decoded boxes -> NMS -> Gather."""
    rng = np.random.default_rng(0)
    ys, xs = np.meshgrid(np.arange(8.0), np.arange(8.0), indexing="ij")
    anchors = np.stack([ys, xs, ys + 2.0, xs + 2.0], -1).reshape(1, 64, 4).astype(np.float32)
    inits = [
        _init("w1", rng.normal(0, 0.5, (8, 3, 3, 3)).astype(np.float32)),
        _init("b1", np.zeros(8, np.float32)),
        _init("w2", rng.normal(0, 0.5, (5, 8, 1, 1)).astype(np.float32)),
        _init("b2", np.zeros(5, np.float32)),
        _init("flat", np.array([1, 5, 64], np.int64)),
        _init("split", np.array([4, 1], np.int64)),
        _init("anchors", anchors),
        _init("max_out", np.array([20], np.int64)),
        _init("iou", np.array([0.3], np.float32)),
        _init("score_thr", np.array([0.9], np.float32)),
        _init("col", np.array(2, np.int64)),
        _init("zero", np.array([0], np.int64)),
    ]
    nodes = [
        oh.make_node("Conv", ["image", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        oh.make_node("Relu", ["c1"], ["r1"]),
        oh.make_node("Conv", ["r1", "w2", "b2"], ["head"]),
        oh.make_node("Reshape", ["head", "flat"], ["head_flat"]),
        oh.make_node("Split", ["head_flat", "split"], ["deltas", "logits"], axis=1),
        oh.make_node("Transpose", ["deltas"], ["deltas_t"], perm=[0, 2, 1]),
        oh.make_node("Add", ["anchors", "deltas_t"], ["boxes"]),
        oh.make_node("Sigmoid", ["logits"], ["scores"]),
        oh.make_node(
            "NonMaxSuppression",
            ["boxes", "scores", "max_out", "iou", "score_thr"],
            ["selected"],
        ),
        oh.make_node("Gather", ["selected", "col"], ["box_index"], axis=1),
        oh.make_node("Squeeze", ["boxes", "zero"], ["boxes_2d"]),
        oh.make_node("Gather", ["boxes_2d", "box_index"], ["detections"], axis=0),
    ]
    graph = oh.make_graph(
        nodes,
        "detector",
        [oh.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 8, 8])],
        [
            oh.make_tensor_value_info("detections", TensorProto.FLOAT, ["n", 4]),
            oh.make_tensor_value_info("selected", TensorProto.INT64, ["n", 3]),
        ],
        inits,
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])


def test_detector_compiles_backbone_once_and_tail_once_per_count():
    proto = _detector()
    model = jonnx.load(proto)
    assert len(model.segment_plan.stages) == 2
    rng = np.random.default_rng(1)
    counts = set()
    with count_compiles() as compiles:
        for _ in range(30):
            image = rng.normal(0, 1, (1, 3, 8, 8)).astype(np.float32)
            detections, selected = model(image)
            want_detections, want_selected = _ort(proto, {"image": image})
            np.testing.assert_array_equal(np.asarray(selected), want_selected)
            np.testing.assert_allclose(np.asarray(detections), want_detections, rtol=1e-5, atol=1e-5)
            counts.add(len(want_selected))
    assert len(counts) > 2, "the images should give several numbers of detections"
    # The backbone segment once and the tail once per number of detections; the weight-only
    # nodes (the channels_last pass's weight relayouts) run once, by numpy, compiling nothing.
    assert model._prepared_exports
    assert len(compiles) == 1 + len(counts), (len(compiles), counts)


def _one_node_model(node, inputs, outputs, inits=(), opset=17, domains=()):
    graph = oh.make_graph([node], "g", inputs, outputs, list(inits))
    opsets = [oh.make_opsetid("", opset)] + [oh.make_opsetid(d, 1) for d in domains]
    return oh.make_model(graph, opset_imports=opsets)


def _pre(op_inputs, node, outputs, inits=()):
    """``x -> Relu -> node``: the node's input is computed inside the compiled segment."""
    relu = oh.make_node("Relu", ["x"], ["xr"])
    graph = oh.make_graph(
        [relu, node],
        "g",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, [4, 5])],
        outputs,
        list(inits),
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])


def _value_models():
    f = TensorProto.FLOAT
    out = oh.make_tensor_value_info
    yield (
        "NonZero",
        _pre(
            None,
            oh.make_node("NonZero", ["xr"], ["y"]),
            [out("y", TensorProto.INT64, None)],
        ),
    )
    cond = [
        oh.make_node("ReduceSum", ["xr", "ax"], ["s"], keepdims=0),
        oh.make_node("Greater", ["s", "zf"], ["c"]),
        oh.make_node("Compress", ["x", "c"], ["y"], axis=0),
    ]
    graph = oh.make_graph(
        [oh.make_node("Relu", ["x"], ["xr"]), *cond],
        "g",
        [out("x", f, [4, 5])],
        [out("y", f, None)],
        [_init("ax", np.array([1], np.int64)), _init("zf", np.array(1.0, np.float32))],
    )
    yield "Compress", oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    graph = oh.make_graph(
        [
            oh.make_node("Floor", ["x"], ["xf"]),
            oh.make_node("Unique", ["xf"], ["y", "i", "inv", "n"], sorted=1),
        ],
        "g",
        [out("x", f, [4, 5])],
        [
            out("y", f, None),
            out("i", TensorProto.INT64, None),
            out("inv", TensorProto.INT64, None),
            out("n", TensorProto.INT64, None),
        ],
    )
    yield "Unique", oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    # TopK whose k is computed from the data: one compilation per k, not per value.
    nodes = [
        oh.make_node("Relu", ["x"], ["xr"]),
        oh.make_node("Greater", ["x", "zf"], ["pos"]),
        oh.make_node("Cast", ["pos"], ["posi"], to=TensorProto.INT64),
        oh.make_node("ReduceSum", ["posi"], ["k"], keepdims=0),
        oh.make_node("Min", ["k", "five"], ["kk"]),
        oh.make_node("TopK", ["xr", "kk"], ["v", "i"], axis=1),
    ]
    graph = oh.make_graph(
        nodes,
        "g",
        [out("x", f, [4, 5])],
        [out("v", f, None), out("i", TensorProto.INT64, None)],
        [
            _init("zf", np.array(1.5, np.float32)),
            _init("five", np.array([5], np.int64)),
        ],
    )
    yield "TopK", oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    classifier = oh.make_node(
        "LinearClassifier",
        ["x"],
        ["label", "proba"],
        domain="ai.onnx.ml",
        coefficients=np.linspace(-1, 1, 15).tolist(),
        intercepts=[0.1, 0.0, -0.1],
        classlabels_strings=["cat", "dog", "eel"],
        post_transform="SOFTMAX",
    )
    graph = oh.make_graph(
        [classifier],
        "g",
        [out("x", f, [4, 5])],
        [out("label", TensorProto.STRING, [4]), out("proba", f, [4, 3])],
    )
    yield (
        "LinearClassifier",
        oh.make_model(
            graph,
            opset_imports=[oh.make_opsetid("", 17), oh.make_opsetid("ai.onnx.ml", 1)],
        ),
    )


def _sample(rng, name):
    x = rng.normal(0, 2, (4, 5)).astype(np.float32)
    if name == "TopK":  # keep k within 1..3: a handful of shapes
        x = np.clip(x, -1, 1)
        x[0, :3] = 2.0
    return x


@pytest.mark.parametrize("name, proto", list(_value_models()), ids=lambda v: v if isinstance(v, str) else "")
def test_new_values_of_one_shape_do_not_recompile(name, proto):
    model = jonnx.load(proto)
    # No graph input is a static argument of a segment: each call's data is traced.
    assert not set(model.input_names) & {n for s in model.segment_plan.stages for n in s.static}
    rng = np.random.default_rng(2)
    shapes = set()
    for _ in range(12):
        x = _sample(rng, name)
        with count_compiles() as compiles:
            got = model(x)
        want = _ort(proto, {"x": x})
        for g, w in zip(got, want):
            if w.dtype == object:
                assert np.asarray(g).tolist() == w.tolist()
            else:
                np.testing.assert_allclose(np.asarray(g), w, rtol=1e-5, atol=1e-6)
        shape = tuple(np.shape(g) for g in got)
        # A segment compiles once per shape it receives, never for new values of one shape.
        assert shape not in shapes or not compiles, (shape, len(compiles))
        shapes.add(shape)
    assert len(shapes) < 12, "the values should repeat some output shapes"


def test_host_memory_is_stable_over_many_values():
    proto = _detector()
    model = jonnx.load(proto)
    rng = np.random.default_rng(3)
    images = rng.normal(0, 1, (40, 1, 3, 8, 8)).astype(np.float32)
    # Warm up: every number of detections is compiled.
    for i in range(60):
        model(images[i % 40] - np.float32(i * 1e-4))
    # JAX notes each traced function in a WeakKeyDictionary (pjit's _seen_qdds), which a host
    # fold's per-call trace (of a node folded on the host between segments) enters and
    # leaves. Where the dictionary holds thousands of live
    # functions from earlier tests in the process, one resize of its table in the window below
    # counted 144 KB (CI) to 300 KB (5,000 functions, a reproduction) though nothing is kept:
    # the old table predates tracemalloc. A cache keyed by data keeps arrays, counted elsewhere.
    ignore = [tracemalloc.Filter(False, f) for f in (tracemalloc.__file__, weakref.__file__)]
    tracemalloc.start()
    try:
        # The first traced calls fill JAX's own bounded caches (and tracemalloc's); what
        # grows after them is what grows per call.
        for i in range(100):
            model(images[i % 40] + np.float32(i * 1e-4))
        gc.collect()  # garbage in reference cycles is not memory kept
        before = tracemalloc.take_snapshot().filter_traces(ignore)
        for i in range(100, 1000):
            model(images[i % 40] + np.float32(i * 1e-4))
        gc.collect()
        after = tracemalloc.take_snapshot().filter_traces(ignore)
    finally:
        tracemalloc.stop()
    # A cache keyed by data would keep at least an image (768 bytes) per call: 690 KB over
    # these 900 calls (the issue asks for memory stable over 1,000 calls in all). Measured:
    # about 28 KB, JAX's own bounded caches filling.
    grown = sum(s.size_diff for s in after.compare_to(before, "filename"))
    assert grown < 150_000, f"{grown} bytes kept over 900 calls"
    assert len(model._segment_host_values) <= 1


def _host_node_model(name: str) -> tuple[onnx.ModelProto, np.ndarray]:
    rng = np.random.default_rng(4)
    if name == "NonMaxSuppression":
        return _detector(), rng.normal(0, 1, (1, 3, 8, 8)).astype(np.float32)
    if name == "Compress":
        return dict(_value_models())["Compress"], rng.normal(size=(4, 5)).astype(np.float32)
    return _zipmap_model(["a", "b", "c"]), rng.normal(size=(6, 3)).astype(np.float32)


@pytest.mark.parametrize("name", ["NonMaxSuppression", "Compress", "ZipMap"])
def test_a_host_node_runs_untraced(name, monkeypatch):
    # A host op computes in numpy on concrete inputs: tracing it on every segmented call
    # (jax.make_jaxpr, about 0.3 ms for NonMaxSuppression) would only wrap its result, and
    # ZipMap's trace failed on its dicts, through JAX's error handling: 1.7 ms a call.
    proto, x = _host_node_model(name)
    model = jonnx.load(proto)
    assert [model._call_graph.nodes[p].op_type for p in model.segment_plan.host_nodes] == [name]
    want = _ort(proto, {proto.graph.input[0].name: x})[0]
    traced = []
    monkeypatch.setattr(_interpreter.host_fold, "trace", lambda fn: traced.append(fn))
    got = model(x)[0]
    assert not traced
    if name == "ZipMap":
        assert [list(r.items()) for r in got] == [list(r.items()) for r in want]
    else:
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)


def test_vmap_over_a_segmented_model_names_the_host_node():
    model = jonnx.load(_detector())
    images = np.zeros((2, 1, 3, 8, 8), np.float32)
    with pytest.raises(errors.StaticValueError, match="NonMaxSuppression"):
        jax.vmap(model)(images)


def test_a_segmented_model_inside_jit_names_the_host_node():
    # Concrete images closed over by the caller's jit: the host node still cannot run there.
    model = jonnx.load(_detector())
    image = np.zeros((1, 3, 8, 8), np.float32)
    with pytest.raises(errors.StaticValueError, match="inside jax.jit.*NonMaxSuppression"):
        jax.jit(lambda: model(image))()


def _zipmap_model(labels) -> onnx.ModelProto:
    n = len(labels)
    key = "classlabels_strings" if isinstance(labels[0], str) else "classlabels_int64s"
    nodes = [
        oh.make_node("Softmax", ["x"], ["p"], axis=1),
        oh.make_node("ZipMap", ["p"], ["z"], domain="ai.onnx.ml", **{key: labels}),
    ]
    kind = TensorProto.STRING if key == "classlabels_strings" else TensorProto.INT64
    z = oh.make_value_info(
        "z",
        oh.make_sequence_type_proto(oh.make_map_type_proto(kind, oh.make_tensor_type_proto(TensorProto.FLOAT, []))),
    )
    graph = oh.make_graph(nodes, "g", [oh.make_tensor_value_info("x", TensorProto.FLOAT, ["N", n])], [z])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17), oh.make_opsetid("ai.onnx.ml", 1)])


@pytest.mark.parametrize("labels", [[3, 7, 11], ["a", "b", "c"]], ids=["int", "str"])
def test_zipmap_over_1000_rows_is_fast_and_plain(labels):
    proto = _zipmap_model(labels)
    x = np.random.default_rng(4).normal(size=(1000, 3)).astype(np.float32)
    model = jonnx.load(proto)
    start = time.perf_counter()
    (got,) = model(x)
    elapsed = time.perf_counter() - start
    (want,) = _ort(proto, {"x": x})
    assert elapsed < 2.0, elapsed
    assert isinstance(got, list) and len(got) == 1000
    assert all(type(k) is type(labels[0]) and type(v) is float for row in got for k, v in row.items())
    assert [list(r) for r in got] == [list(r) for r in want]
    np.testing.assert_allclose([list(r.values()) for r in got], [list(r.values()) for r in want], rtol=1e-6)


def test_string_output_under_users_jit_names_the_output():
    labels = np.array(["low", "high"], dtype=object)
    nodes = [
        oh.make_node("Relu", ["x"], ["y"]),
        oh.make_node("Identity", ["names"], ["label_names"]),
    ]
    graph = oh.make_graph(
        nodes,
        "g",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [
            oh.make_tensor_value_info("y", TensorProto.FLOAT, [2]),
            oh.make_tensor_value_info("label_names", TensorProto.STRING, [2]),
        ],
        [oh.make_tensor("names", TensorProto.STRING, [2], [b"low", b"high"])],
    )
    model = jonnx.load(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)]))
    x = np.array([-1.0, 2.0], np.float32)
    with pytest.raises(errors.StaticValueError, match=r"'label_names'.*Model\(\*inputs\)"):
        jax.jit(model.apply)(model.params, x)
    y, names = model(x)
    np.testing.assert_array_equal(np.asarray(y), [0.0, 2.0])
    assert names.tolist() == labels.tolist()


def _string_labels_network(op: str) -> onnx.ModelProto:
    """A classifier head that names its class with strings chosen by runtime data: Gather or
    ai.onnx.ml ArrayFeatureExtractor of a label table by the ArgMax of the scores (how
    skl2onnx writes string labels), or a Where on the sign of the best score."""
    names = oh.make_tensor("names", TensorProto.STRING, [3], [b"cat", b"dog", b"\xc3\xa9el"])
    inits = [names, _init("w", np.random.default_rng(5).normal(size=(4, 3)).astype(np.float32))]
    nodes = [oh.make_node("MatMul", ["x", "w"], ["scores"])]
    if op == "Where":
        inits += [oh.make_tensor(k, TensorProto.STRING, [], [k.encode()]) for k in ("yes", "no")]
        nodes += [
            oh.make_node("ReduceMax", ["scores"], ["best"], axes=[1], keepdims=0),
            oh.make_node("Greater", ["best", "zero"], ["positive"]),
            oh.make_node("Where", ["positive", "yes", "no"], ["label"]),
        ]
        inits.append(_init("zero", np.float32(0)))
    else:
        nodes.append(oh.make_node("ArgMax", ["scores"], ["best"], axis=1, keepdims=op != "Gather"))
        if op == "Gather":
            nodes.append(oh.make_node("Gather", ["names", "best"], ["label"], axis=0))
        else:  # [N, 1] labels, then flattened, as skl2onnx does
            nodes += [
                oh.make_node("ArrayFeatureExtractor", ["names", "best"], ["picked"], domain="ai.onnx.ml"),
                oh.make_node("Reshape", ["picked", "flat"], ["label"]),
            ]
            inits.append(_init("flat", np.array([-1], np.int64)))
    graph = oh.make_graph(
        nodes,
        "g",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [oh.make_tensor_value_info("label", TensorProto.STRING, ["N"])],
        inits,
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17), oh.make_opsetid("ai.onnx.ml", 1)])


@pytest.mark.parametrize("op", ["Gather", "ArrayFeatureExtractor", "Where"])
def test_strings_chosen_by_runtime_data_run_on_the_host(op):
    # Found while compiling the first segment: the node reading strings with computed indices
    # (or a computed condition) moves to the host once; the scores compile once per shape,
    # never per label.
    proto = _string_labels_network(op)
    model = jonnx.load(proto)
    rng = np.random.default_rng(6)
    for _ in range(3):
        x = rng.normal(size=(5, 4)).astype(np.float32)
        (got,) = model(x)
        (want,) = _ort(proto, {"x": x})
        assert got.tolist() == want.tolist()
    # The Reshape of the strings found follows them to the host.
    on_host = [model._call_graph.nodes[p].op_type for p in model.segment_plan.host_nodes]
    assert on_host == ([op, "Reshape"] if op == "ArrayFeatureExtractor" else [op])
    with count_compiles() as compiles:
        model(rng.normal(size=(5, 4)).astype(np.float32))
    assert not compiles
    fresh = jonnx.load(proto)
    with pytest.raises(errors.HostValueError, match=rf"\({op},.*string.*Model\(\*inputs\) runs such a node"):
        jax.jit(fresh.apply)(fresh.params, x)


def test_strings_a_host_node_returns_are_not_compiled_per_value():
    # String labels from a classifier (a host node) reshaped beside its scores, and a string
    # graph input passed through: the nodes reading strings run on the host, so the segment
    # compiles once per shape, not once per distinct label or input string.
    nodes = [
        oh.make_node(
            "LinearClassifier",
            ["x"],
            ["label", "scores"],
            domain="ai.onnx.ml",
            coefficients=[1.0, 0.0, 0.0, 1.0, -1.0, -1.0],
            intercepts=[0.0, 0.5, -0.5],
            classlabels_strings=["a", "b", "c"],
        ),
        oh.make_node("Reshape", ["label", "column"], ["labels"]),
        oh.make_node("Identity", ["scores"], ["probabilities"]),
        oh.make_node("Identity", ["tag"], ["tags"]),
    ]
    graph = oh.make_graph(
        nodes,
        "g",
        [
            oh.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2]),
            oh.make_tensor_value_info("tag", TensorProto.STRING, ["N"]),
        ],
        [
            oh.make_tensor_value_info("labels", TensorProto.STRING, ["N", 1]),
            oh.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["N", 3]),
            oh.make_tensor_value_info("tags", TensorProto.STRING, ["N"]),
        ],
        [_init("column", np.array([-1, 1], np.int64))],
    )
    proto = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17), oh.make_opsetid("ai.onnx.ml", 1)])
    model = jonnx.load(proto)
    rng = np.random.default_rng(7)

    def call():
        feeds = {"x": rng.normal(size=(6, 2)).astype(np.float32), "tag": rng.choice(["p", "q", "r"], 6).astype(object)}
        for got, want in zip(model(**feeds), _ort(proto, feeds)):
            if want.dtype == object:
                assert got.tolist() == want.tolist()
            else:
                np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)

    call()
    with count_compiles() as compiles:
        for _ in range(3):
            call()
    assert not compiles
    on_host = [model._call_graph.nodes[p].op_type for p in model.segment_plan.host_nodes]
    # The classifier compiles, its codes' lookup runs on the host (jonnx.optimize.string_labels);
    # the scores' Identity is compiled.
    assert on_host == ["Identity", "LabelEncoder", "Reshape"]


def test_host_nodes_do_not_scan_string_tensors_for_symbolic_dims(monkeypatch):
    # Symbolic dims (jax.export) come only from Shape, never among strings: scanning every
    # label of a 10,000-row string tensor for them took most of the call.
    proto = _string_labels_network("ArrayFeatureExtractor")
    model = jonnx.load(proto)
    x = np.random.default_rng(8).normal(size=(10_000, 4)).astype(np.float32)
    model(x)
    asked = []
    is_symbolic_dim = jax.export.is_symbolic_dim
    monkeypatch.setattr(jax.export, "is_symbolic_dim", lambda d: asked.append(d) or is_symbolic_dim(d))
    (label,) = model(x)
    assert label.tolist() == _ort(proto, {"x": x})[0].tolist()
    assert len(asked) < 100


def test_bounded_detector_runs_inside_users_jit_and_matches_up_to_padding():
    proto = _detector()
    model = jonnx.load(proto, size_bounds={"NonMaxSuppression": None})
    assert not model.segment_plan.segmented
    run = jax.jit(model.apply)
    rng = np.random.default_rng(5)
    with count_compiles() as compiles:
        for _ in range(6):
            image = rng.normal(0, 1, (1, 3, 8, 8)).astype(np.float32)
            detections, selected = (np.asarray(o) for o in run(model.params, image))
            want_detections, want_selected = _ort(proto, {"image": image})
            assert selected.shape == (20, 3) and detections.shape == (
                20,
                4,
            )  # 1 x 1 x 20
            count = int((selected[:, 0] >= 0).sum())
            assert count == len(want_selected)
            np.testing.assert_array_equal(selected[:count], want_selected)
            assert (selected[count:] == -1).all()
            np.testing.assert_allclose(detections[:count], want_detections, rtol=1e-5, atol=1e-5)
    assert len(compiles) == 1


def test_bounded_nonzero_pads_with_minus_one():
    graph = oh.make_graph(
        [oh.make_node("Relu", ["x"], ["r"]), oh.make_node("NonZero", ["r"], ["idx"])],
        "g",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
        [oh.make_tensor_value_info("idx", TensorProto.INT64, None)],
    )
    proto = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    model = jonnx.load(proto, size_bounds={"NonZero": 10})
    x = np.random.default_rng(6).normal(size=(3, 4)).astype(np.float32)
    (got,) = jax.jit(model.apply)(model.params, x)
    (want,) = _ort(proto, {"x": x})
    n = want.shape[1]
    assert got.shape == (2, 10) and n < 10
    np.testing.assert_array_equal(np.asarray(got)[:, :n], want)
    assert (np.asarray(got)[:, n:] == -1).all()
    with pytest.raises(errors.ModelStructureError, match="no bounded mode"):
        jonnx.load(proto, size_bounds={"Relu": 4})
    with pytest.raises(errors.ModelStructureError, match="match no node"):
        jonnx.load(proto, size_bounds={"Compress": 4})


@pytest.mark.parametrize("axis", [0, None])
def test_bounded_compress_pads_with_zeros_and_counts(axis):
    graph = oh.make_graph(
        [
            # Keep the rows (the elements, with axis None) with an entry above 0.5.
            oh.make_node("Greater", ["x", "zero"], ["positive"]),
            oh.make_node("Cast", ["positive"], ["positive_f"], to=TensorProto.FLOAT),
            oh.make_node("ReduceMax", ["positive_f"], ["any"], axes=[1], keepdims=0),
            oh.make_node("Greater", ["any", "zero"], ["keep"]),
            oh.make_node("Compress", ["x", "keep"], ["kept"], axis=axis),
        ],
        "g",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, [6, 2])],
        [oh.make_tensor_value_info("kept", TensorProto.FLOAT, None)],
        [_init("zero", np.array(0.5, np.float32))],
    )
    proto = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    model = jonnx.load(proto, size_bounds={"Compress": 5})
    assert model.output_names == ("kept", "kept_count")
    run = jax.jit(model.apply)
    rng = np.random.default_rng(7)
    with count_compiles() as compiles:
        for _ in range(4):
            x = rng.normal(size=(6, 2)).astype(np.float32)
            got, count = run(model.params, x)
            (want,) = _ort(proto, {"x": x})
            n = min(want.shape[0], 5)
            assert int(count) == n
            np.testing.assert_array_equal(np.asarray(got)[:n], want[:n])
            assert (np.asarray(got)[n:] == 0).all()
            assert got.shape[0] == 5
    assert len(compiles) == 1


@pytest.mark.parametrize("sorted_", [1, 0])
@pytest.mark.parametrize("axis", [None, 0])
def test_bounded_unique_pads_and_matches_onnxruntime(sorted_, axis):
    node = oh.make_node(
        "Unique",
        ["r"],
        ["y", "indices", "inverse", "counts"],
        sorted=sorted_,
        **({} if axis is None else {"axis": axis}),
    )
    graph = oh.make_graph(
        [oh.make_node("Floor", ["x"], ["r"]), node],
        "g",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, [8, 2])],
        [
            oh.make_tensor_value_info(n, t, None)
            for n, t in [
                ("y", TensorProto.FLOAT),
                ("indices", TensorProto.INT64),
                ("inverse", TensorProto.INT64),
                ("counts", TensorProto.INT64),
            ]
        ],
    )
    proto = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    bound = 16 if axis is None else 8
    model = jonnx.load(proto, size_bounds={"Unique": bound})
    run = jax.jit(model.apply)
    rng = np.random.default_rng(8)
    with count_compiles() as compiles:
        for _ in range(3):
            x = rng.integers(-2, 2, size=(8, 2)).astype(np.float32)
            y, indices, inverse, counts = (np.asarray(v) for v in run(model.params, x))
            want = _ort(proto, {"x": x})
            n = int((counts > 0).sum())
            assert n == len(want[3]) < bound
            np.testing.assert_array_equal(y[:n], want[0])
            np.testing.assert_array_equal(indices[:n], want[1])
            np.testing.assert_array_equal(inverse, want[2])
            np.testing.assert_array_equal(counts[:n], want[3])
            assert (indices[n:] == -1).all() and (counts[n:] == 0).all() and (y[n:] == 0).all()
    assert len(compiles) == 1


@pytest.mark.parametrize("kept", [False, True], ids=["no_nodes", "only_prepared"])
def test_a_graph_with_no_node_left_to_run(kept):
    # Every node dead (removed by dead_nodes) or prepared (weight-only): the plan still has
    # its one stage, and the outputs are the input and the prepared value.
    w = np.arange(3, dtype=np.float32)
    nodes = [oh.make_node("Neg", ["w"], ["unused"])]
    outputs = [oh.make_tensor_value_info("x", TensorProto.FLOAT, [3])]
    if kept:
        nodes.append(oh.make_node("Mul", ["w", "w"], ["w2"]))
        outputs.append(oh.make_tensor_value_info("w2", TensorProto.FLOAT, [3]))
    graph = oh.make_graph(
        nodes, "g", [oh.make_tensor_value_info("x", TensorProto.FLOAT, [3])], outputs, [numpy_helper.from_array(w, "w")]
    )
    model = jonnx.load(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)]))
    assert len(model._call_graph.nodes) == int(kept)
    x = np.ones(3, np.float32)
    got = model(x)
    np.testing.assert_array_equal(np.asarray(got[0]), x)
    if kept:
        np.testing.assert_array_equal(np.asarray(got[1]), w * w)


def _loop_body(nodes: list, scan: str, scan_shape: list) -> onnx.GraphProto:
    """A Loop body carrying a float ``h`` of 3 values (inputs ``i``, ``c_in``, ``h_in``; outputs
    ``c_out``, ``h_out``) with one float scan output."""
    f = TensorProto.FLOAT
    return oh.make_graph(
        nodes,
        "body",
        [
            oh.make_tensor_value_info("i", TensorProto.INT64, []),
            oh.make_tensor_value_info("c_in", TensorProto.BOOL, []),
            oh.make_tensor_value_info("h_in", f, [3]),
        ],
        [
            oh.make_tensor_value_info("c_out", TensorProto.BOOL, []),
            oh.make_tensor_value_info("h_out", f, [3]),
            oh.make_tensor_value_info(scan, f, scan_shape),
        ],
    )


def _early_exit_network(*, inside_if: bool = False) -> onnx.ModelProto:
    """x * w0 -> Loop (h = h * w + v while sum(h^2) < limit, at most 20 times, stacking h^2)
    -> sum of the stacked rows: the Loop's scan outputs have a data-dependent length.
    With ``inside_if`` the Loop sits in the then-branch of an If on ``sum(x) > 0``."""
    f = TensorProto.FLOAT
    body = _loop_body(
        [
            oh.make_node("Mul", ["h_in", "w"], ["hw"]),
            oh.make_node("Add", ["hw", "v"], ["h_out"]),
            oh.make_node("Mul", ["h_out", "h_out"], ["sq"]),
            oh.make_node("ReduceSum", ["sq"], ["energy"], keepdims=0),
            oh.make_node("Less", ["energy", "limit"], ["c_out"]),
        ],
        "sq",
        [3],
    )
    loop = oh.make_node("Loop", ["M", "go", "h0"], ["h_last", "stacked"], body=body, name="growth")
    nodes = [oh.make_node("Mul", ["x", "w0"], ["h0"])]
    if inside_if:
        other = oh.make_graph(
            [oh.make_node("Identity", ["h0"], ["h_last_e"]), oh.make_node("Unsqueeze", ["h0", "axis0"], ["stacked_e"])],
            "else",
            [],
            [oh.make_tensor_value_info("h_last_e", f, [3]), oh.make_tensor_value_info("stacked_e", f, [None, 3])],
        )
        then = oh.make_graph(
            [loop],
            "then",
            [],
            [oh.make_tensor_value_info("h_last", f, [3]), oh.make_tensor_value_info("stacked", f, [None, 3])],
        )
        nodes += [
            oh.make_node("ReduceSum", ["x"], ["sx"], keepdims=0),
            oh.make_node("Greater", ["sx", "zero"], ["positive"]),
            oh.make_node("If", ["positive"], ["h_last", "stacked"], then_branch=then, else_branch=other),
        ]
    else:
        nodes.append(loop)
    nodes.append(oh.make_node("ReduceSum", ["stacked", "axis0"], ["total"], keepdims=0))
    graph = oh.make_graph(
        nodes,
        "g",
        [oh.make_tensor_value_info("x", f, [3]), oh.make_tensor_value_info("limit", f, [])],
        [oh.make_tensor_value_info("h_last", f, [3]), oh.make_tensor_value_info("total", f, [3])],
        [
            _init("w0", np.float32([0.5, 1.0, -0.5])),
            _init("w", np.float32([1.5, 1.2, 1.3])),
            _init("v", np.float32([0.1, -0.2, 0.3])),
            _init("M", np.int64(20)),
            _init("go", np.bool_(True)),
            _init("axis0", np.array([0], np.int64)),
            _init("zero", np.float32(0)),
        ],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])


@pytest.mark.parametrize("inside_if", [False, True], ids=["loop", "loop-in-if"])
def test_loop_with_a_data_dependent_exit_and_scan_outputs_runs_on_the_host(inside_if):
    # Found while compiling the first segment: the Loop (or the If holding it) moves to the
    # host once, and the segments around it compile once per shape, not per limit.
    proto = _early_exit_network(inside_if=inside_if)
    model = jonnx.load(proto)
    assert not model.segment_plan.host_nodes
    x = np.float32([1.0, 2.0, 3.0])
    for limit in (5.0, 50.0, 500.0, 5000.0, 50000.0):  # 1 to 15 iterations
        feeds = {"x": x, "limit": np.array(limit, np.float32)}
        want = _ort(proto, feeds)
        got = model(**feeds)
        for g, w in zip(got, want):
            np.testing.assert_allclose(np.asarray(g), w, rtol=1e-5)
    [position] = model.segment_plan.host_nodes
    assert model._call_graph.nodes[position].op_type == ("If" if inside_if else "Loop")
    assert len(model._loop_bodies) == 1  # its body runs compiled, once per shape
    with count_compiles() as compiles:
        for limit in (7.0, 70.0, 700.0):
            model(x, np.array(limit, np.float32))
    assert not compiles
    # The else branch (no Loop) runs the same host plan.
    feeds = {"x": -x, "limit": np.array(50.0, np.float32)}
    for g, w in zip(model(**feeds), _ort(proto, feeds)):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-5)


def test_loop_with_a_data_dependent_exit_under_jit_names_the_loop():
    model = jonnx.load(_early_exit_network())
    x, limit = np.float32([1.0, 2.0, 3.0]), np.array(50.0, np.float32)
    with pytest.raises(errors.RuntimeShapeError, match="'growth'.*runtime data.*Model\\(\\*inputs\\) runs such a loop"):
        jax.jit(model.apply)(model.params, x, limit)
    # Once moved to the host by a plain call, the call under jit names it as a host node.
    model(x, limit)
    with pytest.raises(errors.StaticValueError, match="host nodes \\(Loop node 'growth'\\)"):
        jax.jit(model)(x, limit)


def test_nonzero_in_an_if_branch_on_runtime_data_runs_on_the_host():
    # The branch's NonZero gets its input as a static argument (computed by the first
    # segment); the If's condition is runtime data and its branches differ in shape, so the If
    # moves to the host, where the condition is known.
    f = TensorProto.FLOAT
    then = oh.make_graph(
        [oh.make_node("NonZero", ["r"], ["nz"]), oh.make_node("Cast", ["nz"], ["o"], to=f)],
        "then",
        [],
        [oh.make_tensor_value_info("o", f, None)],
    )
    other = oh.make_graph(
        [oh.make_node("Unsqueeze", ["r", "axis0"], ["o2"])], "else", [], [oh.make_tensor_value_info("o2", f, None)]
    )
    graph = oh.make_graph(
        [
            oh.make_node("Mul", ["x", "w"], ["r"]),
            oh.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
            oh.make_node("Greater", ["s", "zero"], ["c"]),
            oh.make_node("If", ["c"], ["out"], then_branch=then, else_branch=other, name="choose"),
        ],
        "g",
        [oh.make_tensor_value_info("x", f, [4])],
        [oh.make_tensor_value_info("out", f, None)],
        [
            _init("w", np.float32([1, -1, 0, 2])),
            _init("zero", np.float32(0)),
            _init("axis0", np.array([0], np.int64)),
        ],
    )
    proto = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    model = jonnx.load(proto)
    for x in (np.float32([1, 2, 0, 3]), np.float32([-1, -2, 0, 3]), np.float32([1, 0, 5, 3])):
        (want,) = _ort(proto, {"x": x})
        (got,) = model(x)
        np.testing.assert_array_equal(np.asarray(got), want)
    assert [model._call_graph.nodes[p].name for p in model.segment_plan.host_nodes] == ["choose"]


def test_loop_carrying_a_sequence_with_a_data_dependent_exit_runs_on_the_host():
    # A sequence is Python structure: on the host this loop runs node by node (LoopBodies
    # compiles only bodies over arrays), and each iteration appends one tensor.
    f = TensorProto.FLOAT
    body = oh.make_graph(
        [
            oh.make_node("Mul", ["h_in", "two"], ["h_out"]),
            oh.make_node("SequenceInsert", ["seq_in", "h_out"], ["seq_out"]),
            oh.make_node("ReduceSum", ["h_out"], ["total"], keepdims=0),
            oh.make_node("Less", ["total", "limit"], ["c_out"]),
        ],
        "body",
        [
            oh.make_tensor_value_info("i", TensorProto.INT64, []),
            oh.make_tensor_value_info("c_in", TensorProto.BOOL, []),
            oh.make_tensor_value_info("h_in", f, [2]),
            oh.make_value_info("seq_in", oh.make_sequence_type_proto(oh.make_tensor_type_proto(f, [2]))),
        ],
        [
            oh.make_tensor_value_info("c_out", TensorProto.BOOL, []),
            oh.make_tensor_value_info("h_out", f, [2]),
            oh.make_value_info("seq_out", oh.make_sequence_type_proto(oh.make_tensor_type_proto(f, [2]))),
        ],
        [_init("two", np.float32(2))],
    )
    graph = oh.make_graph(
        [
            oh.make_node("SequenceEmpty", [], ["seq0"], dtype=f),
            oh.make_node("Loop", ["M", "go", "x", "seq0"], ["h_last", "seq"], body=body),
            oh.make_node("ConcatFromSequence", ["seq"], ["rows"], axis=0, new_axis=1),
        ],
        "g",
        [oh.make_tensor_value_info("x", f, [2]), oh.make_tensor_value_info("limit", f, [])],
        [oh.make_tensor_value_info("h_last", f, [2]), oh.make_tensor_value_info("rows", f, [None, 2])],
        [_init("M", np.int64(50)), _init("go", np.bool_(True))],
    )
    proto = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    model = jonnx.load(proto)
    for limit in (3.0, 100.0, 1e5):
        feeds = {"x": np.float32([0.5, 1.0]), "limit": np.array(limit, np.float32)}
        for got, want in zip(model(**feeds), _ort(proto, feeds)):
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)
    assert model.segment_plan.host_nodes and not len(model._loop_bodies)


def _with_stacked_output(proto: onnx.ModelProto) -> onnx.ModelProto:
    """The early-exit network with the Loop's scan output as a graph output too."""
    proto = onnx.ModelProto.FromString(proto.SerializeToString())
    proto.graph.output.append(oh.make_tensor_value_info("stacked", TensorProto.FLOAT, [None, 3]))
    return proto


@pytest.mark.parametrize("bound", [None, 4])
def test_bounded_loop_runs_inside_users_jit_and_matches_up_to_padding(bound):
    # One scan of `bound` steps (default: the trip count, 20): rows past the exit are zeros, the
    # count is the number of valid rows, and a loop running past a smaller bound keeps going
    # for its carried values. One compilation for every limit.
    proto = _with_stacked_output(_early_exit_network())
    model = jonnx.load(proto, size_bounds={"Loop": bound})
    assert not model.segment_plan.segmented
    assert model.output_names == ("h_last", "total", "stacked", "h_last_count")
    run = jax.jit(model.apply)
    rows = 20 if bound is None else bound
    with count_compiles() as compiles:
        for limit in (5.0, 50.0, 500.0, 5000.0, 1e30):
            feeds = {"x": np.float32([1.0, 2.0, 3.0]), "limit": np.array(limit, np.float32)}
            h_last, total, stacked, count = (np.asarray(o) for o in run(model.params, *feeds.values()))
            want_h_last, want_total, want_stacked = _ort(proto, feeds)
            np.testing.assert_allclose(h_last, want_h_last, rtol=1e-5)
            assert stacked.shape == (rows, 3)
            assert count == min(len(want_stacked), rows)
            np.testing.assert_allclose(stacked[:count], want_stacked[:count], rtol=1e-5)
            assert not stacked[count:].any()
            if len(want_stacked) <= rows:
                np.testing.assert_allclose(total, want_total, rtol=1e-5)
    assert len(compiles) == 1


def test_bounded_loop_refuses_what_one_scan_cannot_run():
    proto = _early_exit_network()
    # A trip count given at run time leaves the default bound unknown.
    proto.graph.input.append(oh.make_tensor_value_info("M", TensorProto.INT64, []))
    del proto.graph.initializer[[t.name for t in proto.graph.initializer].index("M")]
    model = jonnx.load(proto, size_bounds={"Loop": None})
    x, limit = np.float32([1.0, 2.0, 3.0]), np.array(50.0, np.float32)
    with pytest.raises(errors.NodeError, match="'growth'.*needs the trip count M known at trace time"):
        jax.jit(model.apply)(model.params, x, limit, np.int64(20))
    # With a bound it runs, the trip count traced.
    model = jonnx.load(proto, size_bounds={"growth": 8})
    want = _ort(proto, {"x": x, "limit": limit, "M": np.array(20, np.int64)})
    h_last, total, count = jax.jit(model.apply)(model.params, x, limit, np.int64(20))
    np.testing.assert_allclose(np.asarray(h_last), want[0], rtol=1e-5)
    np.testing.assert_allclose(np.asarray(total), want[1], rtol=1e-5)
    assert int(count) == 6


def test_loop_whose_body_holds_an_if_of_varying_shape_runs_node_by_node_on_the_host():
    # The body's If, on a carried value, gives 3 or 6 values: no compiled body can hold it,
    # which is found while compiling the body on the host; it then runs node by node.
    f = TensorProto.FLOAT
    then = oh.make_graph(
        [oh.make_node("Identity", ["h_in"], ["y_t"])], "t", [], [oh.make_tensor_value_info("y_t", f, None)]
    )
    other = oh.make_graph(
        [oh.make_node("Concat", ["h_in", "h_in"], ["y_e"], axis=0)],
        "e",
        [],
        [oh.make_tensor_value_info("y_e", f, None)],
    )
    body = _loop_body(
        [
            oh.make_node("ReduceSum", ["h_in"], ["s_in"], keepdims=0),
            oh.make_node("Greater", ["s_in", "zero"], ["positive"]),
            oh.make_node("If", ["positive"], ["y"], then_branch=then, else_branch=other),
            oh.make_node("ReduceSum", ["y"], ["total"], keepdims=0),
            oh.make_node("Mul", ["h_in", "w"], ["h_out"]),
            oh.make_node("Less", ["total", "limit"], ["c_out"]),
        ],
        "total",
        [],
    )
    graph = oh.make_graph(
        [oh.make_node("Loop", ["M", "go", "x"], ["h_last", "totals"], body=body)],
        "g",
        [oh.make_tensor_value_info("x", f, [3]), oh.make_tensor_value_info("limit", f, [])],
        [oh.make_tensor_value_info("h_last", f, [3]), oh.make_tensor_value_info("totals", f, [None])],
        [
            _init("M", np.int64(30)),
            _init("go", np.bool_(True)),
            _init("w", np.float32([-1.5, -1.5, -1.5])),
            _init("zero", np.float32(0)),
        ],
    )
    proto = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    model = jonnx.load(proto)
    for limit in (3.0, 30.0, 300.0):
        feeds = {"x": np.float32([0.5, 1.0, 1.5]), "limit": np.array(limit, np.float32)}
        for got, want in zip(model(**feeds), _ort(proto, feeds)):
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)
    assert model.segment_plan.host_nodes and not len(model._loop_bodies)


def test_bounded_loop_under_vmap_runs_each_row_its_own_number_of_iterations():
    proto = _early_exit_network()
    model = jonnx.load(proto, size_bounds={"Loop": None})
    xs = np.float32([[1.0, 2.0, 3.0], [0.1, 0.2, 0.3], [-2.0, 0.5, 1.0]])
    limit = np.array(50.0, np.float32)
    h_last, total, count = jax.vmap(lambda x: model.apply(model.params, x, limit))(xs)
    counts = set()
    for i, x in enumerate(xs):
        want_h_last, want_total = _ort(proto, {"x": x, "limit": limit})
        np.testing.assert_allclose(np.asarray(h_last[i]), want_h_last, rtol=1e-5)
        np.testing.assert_allclose(np.asarray(total[i]), want_total, rtol=1e-5)
        counts.add(int(count[i]))
    assert len(counts) > 1, "the rows should run different numbers of iterations"


@pytest.mark.parametrize(
    "value",
    [
        np.arange(6, dtype=np.int64).reshape(2, 3),
        np.float64(2.5),
        np.array([True, False]),
        np.zeros((0, 4), np.float32),
    ],
)
def test_host_outputs_are_placed_as_device_put_places_them(value):
    # A host node's numeric output leaves as a JAX array, by a cheaper route than device_put.
    from jonnx._model import _to_device

    got, want = _to_device(value), jax.device_put(value)
    assert isinstance(got, jax.Array)
    assert (got.dtype, got.shape, got.weak_type) == (want.dtype, want.shape, want.weak_type)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert list(got.devices()) == list(want.devices())

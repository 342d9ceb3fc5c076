"""Sequence and optional ops against the ReferenceEvaluator and numpy.

Sequences are Python lists of arrays and optionals are a value or None: their structure is
static, so positions must be known at trace time and errors name the node.
"""

from __future__ import annotations

import numpy as np
import onnx.helper as oh
import pytest
from onnx import TensorProto

from jonnx import errors
from tests.ops.test_control import assert_same, check, const, graph, model, onnxruntime_outputs, run, vi

F, I64, I32, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT32, TensorProto.BOOL
RNG = np.random.default_rng(1)
seq_vi = oh.make_tensor_sequence_value_info


def _three():
    """Inputs a, b, c (shapes (2,), (3,), (1,)) and a sequence node ``seq`` of them."""
    inputs = [vi("a", F, [2]), vi("b", F, [3]), vi("c", F, [1])]
    feeds = [np.float32([1, 2]), np.float32([3, 4, 5]), np.float32([6])]
    return inputs, feeds, oh.make_node("SequenceConstruct", ["a", "b", "c"], ["seq"])


@pytest.mark.parametrize("position", [0, 1, 2, -1, -3])
@pytest.mark.parametrize("pos_type", [np.int64, np.int32])
def test_sequence_at(position, pos_type):
    inputs, feeds, construct = _three()
    nodes = [construct, const("p", pos_type(position)), oh.make_node("SequenceAt", ["seq", "p"], ["y"])]
    proto = model(nodes, inputs, [vi("y", F, None)])
    check(proto, feeds)
    np.testing.assert_array_equal(run(proto, feeds)[0], feeds[position])


def test_sequence_at_position_as_graph_input_is_static():
    inputs, feeds, construct = _three()
    nodes = [construct, oh.make_node("SequenceAt", ["seq", "p"], ["y"])]
    proto = model(nodes, [*inputs, vi("p", I64, [])], [vi("y", F, None)])
    for p in (1, -1):
        check(proto, [*feeds, np.int64(p)], modes=("call", "apply"))
    with pytest.raises(errors.StaticValueError, match="'p'"):
        run(proto, [*feeds, np.int64(0)], "jit")


@pytest.mark.parametrize(
    "op, position",
    [
        ("SequenceAt", 3),
        ("SequenceAt", -4),
        ("SequenceErase", 3),
        ("SequenceErase", -4),
        ("SequenceInsert", 4),
        ("SequenceInsert", -4),
    ],
)
def test_positions_out_of_range_name_the_node(op, position):
    inputs, feeds, construct = _three()
    args = ["seq", "a", "p"] if op == "SequenceInsert" else ["seq", "p"]
    nodes = [construct, const("p", np.int64(position)), oh.make_node(op, args, ["y"], name="the_node")]
    proto = model(nodes, inputs, [vi("y", F, None)])
    with pytest.raises(errors.NodeError, match=rf"'the_node' \({op}.*position {position} is out of range.*length 3"):
        run(proto, feeds)


@pytest.mark.parametrize("position", [None, 0, 1, 3, -1, -3])
def test_sequence_insert(position):
    inputs, feeds, construct = _three()
    nodes = [construct]
    args = ["seq", "x"]
    if position is not None:
        nodes.append(const("p", np.int64(position)))
        args.append("p")
    nodes += [oh.make_node("SequenceInsert", args, ["s2"]), oh.make_node("SequenceLength", ["s2"], ["n"])]
    proto = model(nodes, [*inputs, vi("x", F, [4])], [seq_vi("s2", F, None), vi("n", I64, [])])
    feeds = [*feeds, np.float32([7, 8, 9, 10])]
    if position != 3:  # the ReferenceEvaluator wraps position == length around to 0
        check(proto, feeds)
    want = list(feeds[:3])
    want.insert(3 if position is None else position if position >= 0 else position + 3, feeds[3])
    assert_same(run(proto, feeds)[0], want)


@pytest.mark.parametrize("position", [None, 0, 2, -1, -3])
def test_sequence_erase(position):
    inputs, feeds, construct = _three()
    nodes = [construct]
    args = ["seq"]
    if position is not None:
        nodes.append(const("p", np.int64(position)))
        args.append("p")
    nodes += [oh.make_node("SequenceErase", args, ["s2"]), oh.make_node("SequenceLength", ["s2"], ["n"])]
    proto = model(nodes, inputs, [seq_vi("s2", F, None), vi("n", I64, [])])
    check(proto, feeds)
    want = list(feeds)
    del want[-1 if position is None else position]
    assert_same(run(proto, feeds), [want, np.int64(2)])


def test_sequence_empty_and_length():
    nodes = [
        oh.make_node("SequenceEmpty", [], ["e"], dtype=I32),
        oh.make_node("SequenceLength", ["e"], ["n0"]),
        oh.make_node("SequenceInsert", ["e", "x"], ["s1"]),
        oh.make_node("SequenceInsert", ["s1", "x"], ["s2"]),
        oh.make_node("SequenceLength", ["s2"], ["n2"]),
    ]
    proto = model(nodes, [vi("x", I32, [2])], [vi("n0", I64, []), vi("n2", I64, []), seq_vi("e", I32, None)])
    feeds = [np.int32([1, 2])]
    got = run(proto, feeds)
    assert_same(got[:2], [np.int64(0), np.int64(2)])
    assert got[2] == []
    check(proto, feeds)


def test_sequence_length_of_traced_sequence_is_static():
    # The length is structure: it folds to a constant even when the elements are traced.
    inputs, feeds, construct = _three()
    nodes = [
        construct,
        oh.make_node("SequenceLength", ["seq"], ["n"]),
        oh.make_node("Range", ["zero", "n", "one"], ["r"]),
    ]
    proto = model(nodes, inputs, [vi("r", I64, [None])], inits={"zero": np.int64(0), "one": np.int64(1)})
    check(proto, feeds)


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_split_to_sequence_without_split(axis, keepdims):
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    node = oh.make_node("SplitToSequence", ["x"], ["s"], axis=axis, keepdims=keepdims)
    proto = model([node], [vi("x", F, [3, 4])], [seq_vi("s", F, None)])
    check(proto, [x])
    parts = np.split(x, x.shape[axis], axis=axis)
    assert_same(run(proto, [x])[0], [p if keepdims else np.squeeze(p, axis) for p in parts])


@pytest.mark.parametrize(
    "split, sizes",
    [
        (np.int64(2), [2, 2, 1]),  # a scalar: chunks of 2, the last one shorter
        (np.int64(5), [5]),
        (np.int32(1), [1] * 5),
        (np.int64([1, 4]), [1, 4]),
        (np.int64([0, 2, 3]), [0, 2, 3]),
    ],
)
@pytest.mark.parametrize("opset", [11, 24])
def test_split_to_sequence_with_split(split, sizes, opset):
    # keepdims is ignored when split is given.
    x = RNG.standard_normal((2, 5)).astype(np.float32)
    nodes = [const("split", split), oh.make_node("SplitToSequence", ["x", "split"], ["s"], axis=-1, keepdims=0)]
    proto = model(nodes, [vi("x", F, [2, 5])], [seq_vi("s", F, None)], opset=opset)
    got = run(proto, [x])[0]
    assert [p.shape[1] for p in got] == sizes
    assert_same(got, np.split(x, np.cumsum(sizes)[:-1], axis=1))
    check(proto, [x])


def test_split_to_sequence_sizes_must_add_up():
    nodes = [
        const("split", np.int64([2, 2])),
        oh.make_node("SplitToSequence", ["x", "split"], ["s"], name="split_node"),
    ]
    proto = model(nodes, [vi("x", F, [5])], [seq_vi("s", F, None)])
    with pytest.raises(errors.NodeError, match=r"'split_node'.*\[2, 2\] do not add up to dimension 5"):
        run(proto, [np.zeros(5, np.float32)])


@pytest.mark.parametrize("split", [np.int64(2), np.int64([]), np.int64([0, 0])])
def test_split_to_sequence_of_an_empty_axis(split):
    # ceil(0 / 2) chunks of a scalar split, and no sizes at all, give an empty sequence;
    # two zero sizes give two empty parts.
    x = np.zeros((0, 3), np.float32)
    nodes = [const("split", split), oh.make_node("SplitToSequence", ["x", "split"], ["s"], axis=0)]
    proto = model(nodes, [vi("x", F, [None, 3])], [seq_vi("s", F, None)])
    check(proto, [x])


@pytest.mark.parametrize(
    "split, message",
    [
        (np.int64(0), "a scalar split must be positive, got 0"),
        (np.int64(-1), "a scalar split must be positive, got -1"),
        (np.int64([6, -1]), r"split sizes \[6, -1\] must not be negative"),
    ],
)
def test_split_to_sequence_invalid_split_names_the_node(split, message):
    nodes = [const("split", split), oh.make_node("SplitToSequence", ["x", "split"], ["s"], name="split_node")]
    proto = model(nodes, [vi("x", F, [5])], [seq_vi("s", F, None)])
    with pytest.raises(errors.NodeError, match=rf"'split_node'.*{message}"):
        run(proto, [np.zeros(5, np.float32)])


@pytest.mark.parametrize("axis, new_axis", [(0, 0), (1, 0), (-1, 0), (0, 1), (1, 1), (2, 1), (-1, 1), (-3, 1)])
def test_concat_from_sequence(axis, new_axis):
    xs = [RNG.standard_normal((2, 3)).astype(np.float32) for _ in range(3)]
    nodes = [
        oh.make_node("SequenceConstruct", ["a", "b", "c"], ["s"]),
        oh.make_node("ConcatFromSequence", ["s"], ["y"], axis=axis, new_axis=new_axis),
    ]
    proto = model(nodes, [vi(n, F, [2, 3]) for n in "abc"], [vi("y", F, None)])
    want = np.stack(xs, axis=axis) if new_axis else np.concatenate(xs, axis=axis)
    check(proto, xs, expected=[want])
    check(proto, xs)


def test_concat_from_sequence_errors():
    nodes = [
        oh.make_node("SequenceEmpty", [], ["s"]),
        oh.make_node("ConcatFromSequence", ["s"], ["y"], axis=0, name="cat"),
    ]
    proto = model(nodes, [vi("x", F, [1])], [vi("y", F, None)])
    with pytest.raises(errors.NodeError, match="'cat'.*empty sequence"):
        run(proto, [np.zeros(1, np.float32)])
    nodes = [
        oh.make_node("SequenceConstruct", ["x"], ["s"]),
        oh.make_node("ConcatFromSequence", ["s"], ["y"], axis=2, new_axis=1, name="cat"),
    ]
    proto = model(nodes, [vi("x", F, [1])], [vi("y", F, None)])
    with pytest.raises(errors.NodeError, match="'cat'"):
        run(proto, [np.zeros(1, np.float32)])


def _sequence_map_model():
    """y_i = x_i * w_i + k and z_i = shape(x_i) over sequences x, w and a tensor k."""
    body = graph(
        [
            oh.make_node("Mul", ["xi", "wi"], ["m"]),
            oh.make_node("Add", ["m", "kk"], ["yi"]),
            oh.make_node("Shape", ["xi"], ["zi"]),
        ],
        [vi("xi", F, [None]), vi("wi", F, [None]), vi("kk", F, [])],
        [vi("yi", F, [None]), vi("zi", I64, [1])],
    )
    nodes = [
        oh.make_node("SplitToSequence", ["x", "split"], ["xs"]),
        oh.make_node("SplitToSequence", ["w", "split"], ["ws"]),
        oh.make_node("SequenceMap", ["xs", "ws", "k"], ["ys", "zs"], body=body, name="map"),
    ]
    return model(
        nodes,
        [vi("x", F, [6]), vi("w", F, [6]), vi("k", F, [])],
        [seq_vi("ys", F, None), seq_vi("zs", I64, None)],
        inits={"split": np.int64([1, 2, 3])},
    )


def test_sequence_map_two_sequences_and_a_tensor():
    proto = _sequence_map_model()
    x, w = RNG.standard_normal(6).astype(np.float32), RNG.standard_normal(6).astype(np.float32)
    feeds = [x, w, np.float32(0.5)]
    # numpy: the ReferenceEvaluator's SequenceMap rejects a tensor among its inputs.
    bounds = [0, 1, 3, 6]
    want = [[x[a:b] * w[a:b] + np.float32(0.5) for a, b in zip(bounds, bounds[1:])], [np.int64([n]) for n in (1, 2, 3)]]
    check(proto, feeds, expected=want)


def test_sequence_map_body_reads_outer_value():
    body = graph([oh.make_node("Add", ["xi", "outer"], ["yi"])], [vi("xi", F, [2])], [vi("yi", F, [2])])
    nodes = [
        oh.make_node("Exp", ["x"], ["outer"]),
        oh.make_node("SequenceConstruct", ["x", "x"], ["s"]),
        oh.make_node("SequenceMap", ["s"], ["ys"], body=body),
    ]
    proto = model(nodes, [vi("x", F, [2])], [seq_vi("ys", F, None)])
    # numpy: the ReferenceEvaluator's SequenceMap body cannot read outer values.
    x = np.float32([0.1, -1])
    check(proto, [x], expected=[[x + np.exp(x)] * 2])


def test_sequence_map_lengths_must_agree():
    body = graph([oh.make_node("Add", ["p", "q"], ["r"])], [vi("p", F, [1]), vi("q", F, [1])], [vi("r", F, [1])])
    nodes = [
        oh.make_node("SequenceConstruct", ["x", "x"], ["s2"]),
        oh.make_node("SequenceConstruct", ["x"], ["s1"]),
        oh.make_node("SequenceMap", ["s2", "s1"], ["ys"], body=body, name="map"),
    ]
    proto = model(nodes, [vi("x", F, [1])], [seq_vi("ys", F, None)])
    with pytest.raises(errors.NodeError, match=r"'map'.*differ in length: \[1, 2\]"):
        run(proto, [np.float32([1])])


# -- optionals ---------------------------------------------------------------------------


def _optional_tensor(name, elem=F):
    return oh.make_value_info(name, oh.make_optional_type_proto(oh.make_tensor_type_proto(elem, None)))


def _optional_sequence(name, elem=F):
    return oh.make_value_info(
        name, oh.make_optional_type_proto(oh.make_sequence_type_proto(oh.make_tensor_type_proto(elem, None)))
    )


@pytest.mark.parametrize("opset", [15, 18])
def test_optional_of_tensor(opset):
    nodes = [
        oh.make_node("Optional", ["x"], ["o"]),
        oh.make_node("OptionalHasElement", ["o"], ["has"]),
        oh.make_node("OptionalGetElement", ["o"], ["y"]),
    ]
    proto = model(nodes, [vi("x", F, [3])], [vi("has", B, []), vi("y", F, [3])], opset=opset)
    feeds = [RNG.standard_normal(3).astype(np.float32)]
    # Expected values by hand: the ReferenceEvaluator holds an optional as a one-item list.
    check(proto, feeds, expected=[np.array(True), feeds[0]])


def test_optional_of_sequence():
    inputs, feeds, construct = _three()
    nodes = [
        construct,
        oh.make_node("Optional", ["seq"], ["o"]),
        oh.make_node("OptionalHasElement", ["o"], ["has"]),
        oh.make_node("OptionalGetElement", ["o"], ["s"]),
        oh.make_node("SequenceAt", ["s", "one"], ["y"]),
    ]
    proto = model(nodes, inputs, [vi("has", B, []), seq_vi("s", F, None), vi("y", F, None)], inits={"one": np.int64(1)})
    check(proto, feeds, expected=[np.array(True), list(feeds), feeds[1]])


@pytest.mark.parametrize(
    "type_proto",
    [
        oh.make_tensor_type_proto(F, None),
        oh.make_sequence_type_proto(oh.make_tensor_type_proto(F, None)),
    ],
)
def test_empty_optional(type_proto):
    nodes = [
        oh.make_node("Optional", [], ["o"], type=type_proto),
        oh.make_node("OptionalHasElement", ["o"], ["has"]),
        oh.make_node("Not", ["has"], ["y"]),
    ]
    proto = model(nodes, [vi("x", F, [1])], [vi("has", B, []), vi("y", B, [])])
    # By hand: the ReferenceEvaluator's empty optional is [None], which "has an element".
    check(proto, [np.float32([1])], expected=[np.array(False), np.array(True)])


def test_optional_get_element_of_empty_is_an_error():
    nodes = [
        oh.make_node("Optional", [], ["o"], type=oh.make_tensor_type_proto(F, None)),
        oh.make_node("OptionalGetElement", ["o"], ["y"], name="get"),
    ]
    proto = model(nodes, [vi("x", F, [1])], [vi("y", F, None)])
    with pytest.raises(errors.NodeError, match="'get'.*optional is empty"):
        run(proto, [np.float32([1])])


@pytest.mark.parametrize("value", [None, np.float32([1.5, 2.5])])
def test_optional_model_input(value):
    # An optional graph input: None for empty. OptionalHasElement gates an If statically.
    has_then = graph([oh.make_node("OptionalGetElement", ["o"], ["t"])], [], [vi("t", F, [2])], "then")
    has_else = graph([oh.make_node("Identity", ["x"], ["e"])], [], [vi("e", F, [2])], "else")
    nodes = [
        oh.make_node("OptionalHasElement", ["o"], ["has"]),
        oh.make_node("If", ["has"], ["y"], then_branch=has_then, else_branch=has_else),
    ]
    proto = model(nodes, [_optional_tensor("o"), vi("x", F, [2])], [vi("has", B, []), vi("y", F, [2])], opset=18)
    x = np.float32([-1, -2])
    want = [np.array(value is not None), x if value is None else value]
    check(proto, [value, x], modes=("call", "apply", "jit"), expected=want)


def test_optional_has_element_without_input():
    # Opset 18 allows the input to be omitted: no element.
    nodes = [oh.make_node("OptionalHasElement", [""], ["has"])]
    proto = model(nodes, [vi("x", F, [1])], [vi("has", B, [])], opset=18)
    check(proto, [np.float32([1])], expected=[np.array(False)])


def test_optional_get_element_of_plain_tensor():
    # Opset 18: OptionalGetElement passes a plain tensor (or sequence) through.
    inputs, feeds, construct = _three()
    nodes = [
        construct,
        oh.make_node("OptionalGetElement", ["a"], ["y"]),
        oh.make_node("OptionalGetElement", ["seq"], ["s"]),
        oh.make_node("OptionalHasElement", ["a"], ["has"]),
    ]
    proto = model(nodes, inputs, [vi("y", F, [2]), seq_vi("s", F, None), vi("has", B, [])], opset=18)
    check(proto, feeds)


# -- sequence model inputs ---------------------------------------------------------------


def test_sequence_model_input():
    nodes = [
        oh.make_node("ConcatFromSequence", ["xs"], ["cat"], axis=0),
        oh.make_node("SequenceLength", ["xs"], ["n"]),
        oh.make_node("SequenceAt", ["xs", "last"], ["y"]),
        oh.make_node("SequenceInsert", ["xs", "cat"], ["more"]),
    ]
    proto = model(
        nodes,
        [seq_vi("xs", F, [None])],
        [vi("cat", F, [None]), vi("n", I64, []), vi("y", F, None), seq_vi("more", F, None)],
        inits={"last": np.int64(-1)},
    )
    for xs in ([np.float32([1, 2]), np.float32([3])], [np.float32([4, 5, 6])]):
        check(proto, [xs])
        assert run(proto, [xs])[1] == len(xs)


def test_sequence_input_through_sequence_map_and_optional():
    # A sequence input feeds SequenceMap and an Optional holding a sequence.
    body = graph([oh.make_node("ReduceSum", ["xi"], ["yi"], keepdims=1)], [vi("xi", F, [None])], [vi("yi", F, [1])])
    nodes = [
        oh.make_node("SequenceMap", ["xs"], ["sums"], body=body),
        oh.make_node("ConcatFromSequence", ["sums"], ["y"], axis=0),
        oh.make_node("Optional", ["sums"], ["o"]),
        oh.make_node("OptionalGetElement", ["o"], ["back"]),
    ]
    proto = model(nodes, [seq_vi("xs", F, [None])], [vi("y", F, [None]), seq_vi("back", F, None)])
    xs = [np.float32([1, 2]), np.float32([3]), np.float32([4, 5, 6])]
    check(proto, [xs], expected=[np.float32([3, 3, 15]), [np.float32([3]), np.float32([3]), np.float32([15])]])


def _loop_over_sequence(declared_shape):
    """A Loop over the elements of ``seq`` by SequenceAt(seq, i), trip count SequenceLength:
    each element is a scan output, declared with ``declared_shape``."""
    body = graph(
        [oh.make_node("SequenceAt", ["seq", "i"], ["e"]), oh.make_node("Identity", ["c"], ["c_out"])],
        [vi("i", I64, []), vi("c", B, [])],
        [vi("c_out", B, []), vi("e", F, declared_shape)],
    )
    nodes = [
        oh.make_node("SplitToSequence", ["x"], ["seq"], axis=0, keepdims=0),
        oh.make_node("SequenceLength", ["seq"], ["n"]),
        oh.make_node("Loop", ["n", ""], ["ys"], body=body),
    ]
    return model(nodes, [vi("x", F, [None, 2])], [vi("ys", F, None)])


@pytest.mark.parametrize("declared_shape", [[2], None])
@pytest.mark.parametrize("rows", [3, 0])
def test_loop_over_a_sequence_by_position(declared_shape, rows):
    # With no elements the body cannot run even once to find the scan output's shape (its
    # SequenceAt has nothing to read): the body's declared type gives it, as in onnxruntime
    # ((0, 2), or (0,) where the shape is not declared). The ReferenceEvaluator concatenates
    # Loop scan outputs instead of stacking them, so onnxruntime is the reference.
    proto = _loop_over_sequence(declared_shape)
    x = RNG.standard_normal((rows, 2)).astype(np.float32)
    check(proto, [x], modes=("call", "apply", "jit"), expected=onnxruntime_outputs(proto, [x]))


def _loop_carrying_an_optional(trip_as_input: bool):
    """A Loop-16 carrying an optional that starts empty (then x, then x + x, ...) and a tensor
    (acc + x): the optional's presence changes between iterations."""
    opt = oh.make_optional_type_proto(oh.make_tensor_type_proto(F, [2]))
    then_branch = graph(
        [
            oh.make_node("OptionalGetElement", ["v"], ["g"]),
            oh.make_node("Add", ["g", "x"], ["a"]),
            oh.make_node("Optional", ["a"], ["o1"]),
        ],
        [],
        [oh.make_value_info("o1", opt)],
    )
    else_branch = graph([oh.make_node("Optional", ["x"], ["o2"])], [], [oh.make_value_info("o2", opt)])
    body = graph(
        [
            oh.make_node("Identity", ["c"], ["c_out"]),
            oh.make_node("OptionalHasElement", ["v"], ["h"]),
            oh.make_node("If", ["h"], ["v_out"], then_branch=then_branch, else_branch=else_branch),
            oh.make_node("Add", ["acc", "x"], ["acc_out"]),
        ],
        [vi("i", I64, []), vi("c", B, []), oh.make_value_info("v", opt), vi("acc", F, [2])],
        [vi("c_out", B, []), oh.make_value_info("v_out", opt), vi("acc_out", F, [2])],
    )
    nodes = [
        oh.make_node("Optional", [], ["v0"], type=oh.make_tensor_type_proto(F, [2])),
        oh.make_node("Loop", ["M", "", "v0", "x"], ["v", "acc"], body=body, name="the_loop"),
        oh.make_node("OptionalGetElement", ["v"], ["y"]),
    ]
    inputs = [vi("x", F, [2])] + ([vi("M", I64, [])] if trip_as_input else [])
    inits = {} if trip_as_input else {"M": np.int64(3)}
    return model(nodes, inputs, [vi("y", F, [2]), vi("acc", F, [2])], opset=18, inits=inits)


def test_loop_carrying_an_optional_that_starts_empty():
    # The optional is structure (None, then an array): the loop runs at trace time, also when
    # another carried value is traced. The ReferenceEvaluator returns the empty optional.
    proto = _loop_carrying_an_optional(trip_as_input=False)
    x = np.float32([1, 2])
    check(proto, [x], expected=onnxruntime_outputs(proto, [x]))


def test_loop_carrying_structure_needs_a_static_trip_count():
    proto = _loop_carrying_an_optional(trip_as_input=True)
    feeds = [np.float32([1, 2]), np.int64(3)]
    check(proto, feeds, modes=("call", "apply"), expected=onnxruntime_outputs(proto, feeds))
    with pytest.raises(errors.NodeError, match="'the_loop'.*carries a sequence or an empty optional.*M depends"):
        run(proto, feeds, "jit")

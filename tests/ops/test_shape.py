"""Tensor structure ops (Flatten ... CenterCropPad) against the ReferenceEvaluator / numpy.

Static inputs (shapes, axes, pads, repeats, split sizes, k) are given as initializers, as an
exporter writes them. Where an old opset's semantics come from the changelog and the
ReferenceEvaluator lacks or misreads them, numpy gives the expected value.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import pytest

import jonnx
import jonnx.ops
from jonnx import errors
from tests.ops._harness import assert_matches_reference, check_op_grads, node_model, run_jonnx

RNG = np.random.default_rng(0)
I64 = np.int64
INT64_MAX = np.iinfo(np.int64).max
INT64_MIN = np.iinfo(np.int64).min


def rand(*shape, dtype=np.float32):
    x = RNG.standard_normal(shape) * 5
    return x.astype(dtype)


def ints(*values):
    return np.array(values, I64)


def raises_node_error(op, inputs, match, n_outputs=1, initializers=(), **kw):
    model = node_model(op, inputs, n_outputs, initializers=initializers, **kw)
    with pytest.raises(errors.NodeError, match=match):
        run_jonnx(model, inputs)


# -- Identity, Constant, Shape, Size, Reshape -----------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_, np.float16])
def test_identity(dtype):
    assert_matches_reference("Identity", {"x": rand(2, 3).astype(dtype)}, opset=21)


@pytest.mark.parametrize(
    "attr,value,want",
    [
        ("value_float", 1.5, np.array(1.5, np.float32)),
        ("value_floats", [1.0, 2.5], np.array([1.0, 2.5], np.float32)),
        ("value_int", 7, np.array(7, I64)),
        ("value_ints", [1, -2, 3], ints(1, -2, 3)),
        (
            "value",
            onnx.numpy_helper.from_array(np.arange(6, dtype=np.float16).reshape(2, 3)),
            np.arange(6, dtype=np.float16).reshape(2, 3),
        ),
    ],
)
def test_constant_forms(attr, value, want):
    assert_matches_reference("Constant", {}, opset=13, **{attr: value}, expected=[want])


def test_constant_strings_and_sparse():
    # String tensors cannot leave a jitted function, so they are checked through jonnx.ops.
    assert jonnx.ops.Constant(value_strings=("a", "bc"), opset=13).tolist() == ["a", "bc"]
    assert jonnx.ops.Constant(value_string="xy", opset=13).tolist() == "xy"
    values = onnx.numpy_helper.from_array(np.array([5.0, 6.0], np.float32), "v")
    indices = onnx.numpy_helper.from_array(ints(1, 4), "i")
    sparse = oh.make_sparse_tensor(values, indices, [2, 3])
    want = np.zeros((2, 3), np.float32)
    want.reshape(-1)[[1, 4]] = [5.0, 6.0]
    assert_matches_reference("Constant", {}, opset=13, sparse_value=sparse, expected=[want])


@pytest.mark.parametrize(
    "opset,kw",
    [
        (1, {}),
        (13, {}),
        (15, {"start": 1}),
        (15, {"end": -1}),
        (21, {"start": -2, "end": 10}),
        (21, {"start": 3, "end": 1}),
    ],
)
def test_shape(opset, kw):
    assert_matches_reference("Shape", {"x": rand(2, 3, 4)}, opset=opset, **kw)


@pytest.mark.parametrize("opset", [1, 13, 21])
def test_size(opset):
    assert_matches_reference("Size", {"x": rand(2, 3, 4)}, opset=opset)
    assert_matches_reference("Size", {"x": rand(0, 3)}, opset=opset)


@pytest.mark.parametrize(
    "opset,shape,allowzero",
    [
        (5, (4, -1), 0),
        (5, (0, 12), 0),
        (5, (2, 0, -1), 0),
        (14, (-1,), 0),
        (14, (24,), 1),
        (21, (2, 0, -1), 0),
        (21, (3, 2, 4), 1),
    ],
)
def test_reshape(opset, shape, allowzero):
    kw = {"allowzero": allowzero} if opset >= 14 else {}
    assert_matches_reference("Reshape", {"x": rand(2, 3, 4), "s": ints(*shape)}, opset=opset, initializers=["s"], **kw)


def test_reshape_1_attribute():
    # Reshape-1 reads the shape attribute; the ReferenceEvaluator has no Reshape_1.
    x = rand(2, 3, 4)
    assert_matches_reference("Reshape", {"x": x}, opset=1, shape=[0, -1], expected=[x.reshape(2, 12)])


def test_reshape_errors():
    inputs = {"x": rand(2, 3), "s": ints(-1, -1)}
    raises_node_error("Reshape", inputs, "more than one -1", opset=14, initializers=["s"])
    inputs = {"x": rand(2, 3), "s": ints(4, 2)}
    raises_node_error("Reshape", inputs, "cannot reshape", opset=14, initializers=["s"])


# -- Flatten, Squeeze, Unsqueeze, Transpose ----------------------------------------------


@pytest.mark.parametrize("opset,axis", [(1, 0), (1, 3), (9, 2), (11, -1), (11, 0), (13, -3), (21, 1), (25, -2)])
def test_flatten(opset, axis):
    assert_matches_reference("Flatten", {"x": rand(2, 3, 4)}, opset=opset, axis=axis)


def test_flatten_errors():
    # Negative axes arrived with opset 11.
    raises_node_error("Flatten", {"x": rand(2, 3)}, "is negative: Flatten before opset 11", opset=9, axis=-1)
    raises_node_error("Flatten", {"x": rand(2, 3)}, "out of range", opset=13, axis=3)


@pytest.mark.parametrize("dtype", [np.int64, np.bool_, np.float16])
def test_flatten_dtypes_and_grads(dtype):
    assert_matches_reference("Flatten", {"x": rand(2, 3, 4).astype(dtype)}, opset=13)
    check_op_grads("Flatten", {"x": rand(2, 3, 4)}, opset=13, axis=2)


@pytest.mark.parametrize(
    "opset,axes", [(1, None), (1, (0, 3)), (11, (-1,)), (11, None), (13, None), (13, (-1, 0)), (21, (3,))]
)
def test_squeeze(opset, axes):
    x = rand(1, 3, 4, 1)
    if opset < 13:
        kw = {} if axes is None else {"axes": list(axes)}
        assert_matches_reference("Squeeze", {"x": x}, opset=opset, **kw)
    else:
        inputs = {"x": x, "axes": None if axes is None else ints(*axes)}
        assert_matches_reference("Squeeze", inputs, opset=opset, initializers=["axes"])


def test_squeeze_rejects_non_unit_axis():
    raises_node_error("Squeeze", {"x": rand(2, 3), "axes": ints(0)}, "not 1", opset=13, initializers=["axes"])


@pytest.mark.parametrize(
    "opset,axes", [(1, (0,)), (1, (3, 1)), (11, (-1,)), (11, (-1, 0, 2)), (13, (1,)), (13, (3, 0)), (21, (-4, 2))]
)
def test_unsqueeze(opset, axes):
    x = rand(3, 4)
    # numpy's expand_dims reads a tuple of axes as ONNX does (the ReferenceEvaluator's
    # Unsqueeze_1 inserts them one by one and fails on unsorted axes).
    want = [np.expand_dims(x, axes)]
    if opset < 13:
        assert_matches_reference("Unsqueeze", {"x": x}, opset=opset, axes=list(axes), expected=want)
    else:
        assert_matches_reference(
            "Unsqueeze", {"x": x, "axes": ints(*axes)}, opset=opset, initializers=["axes"], expected=want
        )


@pytest.mark.parametrize("opset,perm", [(1, None), (1, (2, 0, 1)), (13, (0, 2, 1)), (21, None)])
def test_transpose(opset, perm):
    x = rand(2, 3, 4)
    kw = {} if perm is None else {"perm": list(perm)}
    assert_matches_reference("Transpose", {"x": x}, opset=opset, **kw)


def test_transpose_grads_and_errors():
    check_op_grads("Transpose", {"x": rand(2, 3, 4)}, opset=13, perm=[1, 2, 0])
    # perm holds axes in [0, rank): negative entries and repeats are rejected.
    raises_node_error("Transpose", {"x": rand(2, 3)}, "permutation", opset=13, perm=[-1, 0])
    raises_node_error("Transpose", {"x": rand(2, 3)}, "permutation", opset=13, perm=[0, 0])


# -- Concat, Split ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "opset,axis,dtype",
    [
        (4, 0, np.float32),
        (4, 2, np.int64),
        (11, -1, np.float32),
        (11, 1, np.bool_),
        (13, -3, np.int64),
        (13, 2, np.float16),
    ],
)
def test_concat(opset, axis, dtype):
    inputs = {"a": rand(2, 3, 4).astype(dtype), "b": rand(2, 3, 4).astype(dtype), "c": rand(2, 3, 4).astype(dtype)}
    assert_matches_reference("Concat", inputs, opset=opset, axis=axis)


def test_concat_1_default_axis():
    # Concat-1 documents "Default value is 1" (the schema holds no default).
    a, b = rand(2, 3), rand(2, 5)
    assert_matches_reference("Concat", {"a": a, "b": b}, opset=1, expected=[np.concatenate([a, b], axis=1)])


def test_concat_grads_and_errors():
    check_op_grads("Concat", {"a": rand(2, 3), "b": rand(2, 1)}, opset=13, axis=1)
    raises_node_error("Concat", {"a": rand(2, 3), "b": rand(3)}, "different ranks", opset=13, axis=0)


@pytest.mark.parametrize("opset", [2, 11])
@pytest.mark.parametrize("split", [None, [1, 5], [2, 2, 2]])
def test_split_attribute(opset, split):
    x = rand(6, 4)
    n = 3 if split is None else len(split)
    kw = {} if split is None else {"split": split}
    assert_matches_reference("Split", {"x": x}, n, opset=opset, axis=0, **kw)


@pytest.mark.parametrize("source", ["attribute", "input", "equal"])
def test_split_1(source):
    # Split-1: sizes from the attribute or the optional second input (changelog); the
    # ReferenceEvaluator has no Split_1, so numpy gives the expected value.
    x = rand(3, 6)
    if source == "equal":
        inputs, kw, sizes = {"x": x}, {}, [2, 2, 2]
    elif source == "attribute":
        inputs, kw, sizes = {"x": x}, {"split": [1, 5]}, [1, 5]
    else:
        inputs, kw, sizes = {"x": x, "split": ints(4, 2)}, {}, [4, 2]
    expected = np.split(x, np.cumsum(sizes)[:-1], axis=1)
    assert_matches_reference(
        "Split", inputs, len(sizes), opset=1, axis=1, initializers=["split"], expected=expected, **kw
    )


@pytest.mark.parametrize(
    "opset,split,axis", [(13, None, 1), (13, (1, 0, 3), -1), (18, (4,), 1), (18, (1, 0, 3), 1), (18, None, -1)]
)
def test_split_input(opset, split, axis):
    x = rand(2, 4)
    n = 2 if split is None else len(split)
    inputs = {"x": x, "split": None if split is None else ints(*split)}
    assert_matches_reference("Split", inputs, n, opset=opset, axis=axis, initializers=["split"])


@pytest.mark.parametrize("dim,num", [(7, 3), (5, 2), (6, 3), (4, 4)])
def test_split_num_outputs_uneven(dim, num):
    assert_matches_reference("Split", {"x": rand(dim, 2)}, num, opset=18, num_outputs=num)


def test_split_errors_and_call():
    raises_node_error("Split", {"x": rand(7)}, "equal parts", 2, opset=13)
    raises_node_error("Split", {"x": rand(7), "split": ints(3, 3)}, "add up", 2, opset=13, initializers=["split"])
    # Outside a model the output count is unknown: num_outputs or sizes are needed.
    parts = jonnx.ops.Split(np.arange(7.0), num_outputs=3, opset=18)
    assert [p.tolist() for p in parts] == [[0, 1, 2], [3, 4, 5], [6]]
    with pytest.raises(errors.NodeError, match="split sizes"):
        jonnx.ops.Split(np.arange(6.0), opset=13)


def test_split_grads():
    check_op_grads("Split", {"x": rand(6, 2)}, opset=18, num_outputs=3, n_outputs=3, output=1)


# -- Slice -----------------------------------------------------------------------------------


SLICES = [
    # starts, ends, axes, steps
    ((1, 0), (3, 2), (0, 1), None),
    ((0,), (-1,), None, None),
    ((-3, 1), (INT64_MAX, 1000), (1, 2), (1, 2)),
    ((INT64_MAX,), (INT64_MIN,), (1,), (-1,)),  # PyTorch's flip
    ((-1, 4), (-1000, 0), (0, 2), (-2, -1)),
    ((2,), (1,), (0,), (1,)),  # empty
    ((10,), (20,), (2,), (1,)),  # start past the end
    ((0, 0), (2, 2), (-1, -2), (1, 1)),
]


@pytest.mark.parametrize("starts,ends,axes,steps", SLICES)
def test_slice(starts, ends, axes, steps):
    x = rand(3, 4, 5)
    inputs = {
        "x": x,
        "starts": ints(*starts),
        "ends": ints(*ends),
        "axes": None if axes is None else ints(*axes),
        "steps": None if steps is None else ints(*steps),
    }
    opset = 10 if axes is None or min(axes) >= 0 else 13
    assert_matches_reference("Slice", inputs, opset=opset, initializers=["starts", "ends", "axes", "steps"])


def test_slice_1_attributes():
    x = rand(3, 4, 5)
    assert_matches_reference("Slice", {"x": x}, opset=1, starts=[1, -3], ends=[1000, -1], axes=[0, 2])
    assert_matches_reference("Slice", {"x": x}, opset=1, starts=[0, 1], ends=[-1, 1000])


def test_slice_grads_and_errors():
    inputs = {"x": rand(4, 5), "s": ints(3, 1), "e": ints(0, 5), "a": ints(0, 1), "st": ints(-1, 2)}
    check_op_grads("Slice", inputs, opset=13, initializers=["s", "e", "a", "st"])
    bad = {"x": rand(4), "s": ints(0), "e": ints(2), "a": ints(0), "st": ints(0)}
    raises_node_error("Slice", bad, "step 0", opset=13, initializers=["s", "e", "a", "st"])


# -- Expand, Tile ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "opset,xshape,shape",
    [
        (8, (3, 1), (2, 1, 6)),
        (8, (3, 1), (3, 4)),
        (13, (1, 4), (1,)),
        (13, (2, 1, 3), (4, 1)),
        (13, (), (2, 2)),
    ],
)
def test_expand(opset, xshape, shape):
    inputs = {"x": rand(*xshape), "shape": ints(*shape)}
    assert_matches_reference("Expand", inputs, opset=opset, initializers=["shape"])


def test_expand_grads_and_errors():
    check_op_grads("Expand", {"x": rand(3, 1), "s": ints(2, 3, 4)}, opset=13, initializers=["s"])
    raises_node_error("Expand", {"x": rand(3, 2), "s": ints(4)}, "cannot broadcast", opset=13, initializers=["s"])


@pytest.mark.parametrize(
    "opset,repeats,dtype",
    [
        (6, (1, 1), np.float32),
        (6, (2, 3), np.int32),
        (13, (0, 2), np.float32),
        (13, (3, 1), np.bool_),
        (13, (2, 2), np.int64),
    ],
)
def test_tile(opset, repeats, dtype):
    inputs = {"x": rand(2, 3).astype(dtype), "r": ints(*repeats)}
    assert_matches_reference("Tile", inputs, opset=opset, initializers=["r"])


def test_tile_1_tiles_and_axis():
    # Tile-1: `tiles` copies along `axis` (two inputs, changelog); numpy gives the value.
    x = rand(2, 3)
    inputs = {"x": x, "tiles": np.array(3, I64), "axis": np.array(1, I64)}
    assert_matches_reference("Tile", inputs, opset=1, initializers=["tiles", "axis"], expected=[np.tile(x, (1, 3))])


def test_tile_grads():
    check_op_grads("Tile", {"x": rand(2, 3), "r": ints(2, 2)}, opset=13, initializers=["r"])


# -- Pad, CenterCropPad ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "opset,mode",
    [
        (11, "constant"),
        (11, "reflect"),
        (13, "edge"),
        (18, "reflect"),
        (19, "wrap"),
        (21, "constant"),
        (21, "edge"),
        (25, "wrap"),
    ],
)
def test_pad_modes(opset, mode):
    x = rand(3, 4)
    inputs = {"x": x, "pads": ints(0, 2, 1, 1)}
    if mode == "constant":
        inputs["value"] = np.array(1.5, np.float32)
    assert_matches_reference("Pad", inputs, opset=opset, mode=mode, initializers=["pads"])


@pytest.mark.parametrize("opset,axes", [(18, (1,)), (19, (-1, 0)), (21, (0, 2))])
def test_pad_axes(opset, axes):
    inputs = {"x": rand(2, 3, 4), "pads": ints(*range(1, 2 * len(axes) + 1)), "value": None, "axes": ints(*axes)}
    assert_matches_reference("Pad", inputs, opset=opset, initializers=["pads", "axes"])


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect"])
def test_pad_negative_crops(mode):
    # Negative pads remove elements (spec); np.pad rejects them, so crop-then-pad in numpy.
    x = rand(4, 5)
    pads = ints(-1, 2, 1, -2)
    want = np.pad(x[1:, :3], [(0, 1), (2, 0)], mode=mode)
    assert_matches_reference("Pad", {"x": x, "pads": pads}, opset=13, mode=mode, initializers=["pads"], expected=[want])


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect", "wrap"])
def test_pad_of_a_scalar_is_the_scalar(mode):
    # A scalar takes empty pads, which jnp.pad refuses (found by the fuzz).
    x = np.array(2.5, np.float32)
    pads = np.zeros(0, np.int64)
    assert_matches_reference("Pad", {"x": x, "pads": pads}, opset=19, mode=mode, initializers=["pads"], expected=[x])


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float16])
def test_pad_dtypes(dtype):
    inputs = {"x": rand(2, 3).astype(dtype), "pads": ints(1, 0, 0, 2), "value": np.array(3, dtype)}
    assert_matches_reference("Pad", inputs, opset=13, initializers=["pads"])


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
def test_pad_2_attribute(mode):
    assert_matches_reference("Pad", {"x": rand(3, 4)}, opset=2, mode=mode, pads=[1, 2, 2, 1], value=0.5)


def test_pad_1_paddings():
    # Pad-1's `paddings` uses the layout its text documents ([x1_begin, x2_begin, x1_end, ...]).
    x = rand(3, 2)
    assert_matches_reference(
        "Pad",
        {"x": x},
        opset=1,
        paddings=[0, 2, 1, 0],
        value=-1.0,
        expected=[np.pad(x, [(0, 1), (2, 0)], constant_values=-1.0)],
    )


def test_pad_grads_and_errors():
    check_op_grads("Pad", {"x": rand(3, 4), "p": ints(1, 2, 2, 1)}, opset=13, mode="reflect", initializers=["p"])
    check_op_grads(
        "Pad",
        {"x": rand(3, 4), "p": ints(1, -1, 0, 1), "v": np.array(2.0)},
        opset=13,
        initializers=["p"],
        wrt=["x", "v"],
    )
    # The fill alone, the input held constant, empty or not: JAX's transpose of lax.pad fails
    # there (found by the op fuzz), so a traced fill is lowered as a select.
    for x in (rand(3, 4), np.zeros((0, 2))):
        p = ints(1, 0, 2, 1)
        check_op_grads("Pad", {"x": x, "p": p, "v": np.array(2.0)}, opset=13, initializers=["p"], wrt=["v"])
    raises_node_error("Pad", {"x": rand(3, 4), "p": ints(1, 2)}, "2 entries", opset=13, initializers=["p"])
    raises_node_error(
        "Pad",
        {"x": rand(3, 4), "p": ints(0, 1, 0, 1)},
        "arrived with Pad-19",
        opset=13,
        mode="wrap",
        initializers=["p"],
    )
    raises_node_error(
        "Pad", {"x": rand(3, 4), "p": ints(0, 1, 0, 1)}, "unknown mode", opset=19, mode="mirror", initializers=["p"]
    )
    raises_node_error(
        "Pad", {"x": rand(3, 1), "p": ints(0, 1, 0, 1)}, "size 1", opset=13, mode="reflect", initializers=["p"]
    )


@pytest.mark.parametrize(
    "xshape,shape,axes",
    [
        ((20, 10, 3), (10, 7, 3), None),
        ((10, 7, 3), (20, 10, 3), None),
        ((20, 8, 3), (10, 10, 3), None),
        ((3, 20, 8), (10, 9), (1, 2)),
        ((20, 8, 3), (10, 9), (-3, -2)),
        ((5, 5), (3,), (1,)),
    ],
)
def test_center_crop_pad(xshape, shape, axes):
    kw = {} if axes is None else {"axes": list(axes)}
    inputs = {"x": rand(*xshape), "shape": ints(*shape)}
    assert_matches_reference("CenterCropPad", inputs, opset=18, initializers=["shape"], **kw)


# -- tensors from shapes ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "opset,shape,value",
    [
        (9, (2, 3), None),
        (9, (0,), np.array([7], I64)),
        (20, (4, 0, 2), np.array([1.5], np.float16)),
        (21, (), np.array([True])),
        (25, (2, 1, 3), np.array([-2], np.int32)),
    ],
)
def test_constant_of_shape(opset, shape, value):
    kw = {} if value is None else {"value": onnx.numpy_helper.from_array(value)}
    assert_matches_reference("ConstantOfShape", {"s": np.array(shape, I64)}, opset=opset, initializers=["s"], **kw)


@pytest.mark.parametrize(
    "start,limit,delta,dtype",
    [
        (3, 9, 3, np.int32),
        (10, 4, -2, np.int64),
        (1, 1, 1, np.int64),
        (5, 1, 1, np.int16),
        (0.5, 3.0, 0.7, np.float32),
        (10.0, 4.0, -1.5, np.float64),
        (0.0, 2.0, 0.25, np.float16),
    ],
)
def test_range(start, limit, delta, dtype):
    opset = 27 if dtype == np.float16 else 11
    n = max(int(np.ceil((limit - start) / delta)), 0)
    want = (start + np.arange(n) * delta).astype(dtype)
    inputs = {"a": np.array(start, dtype), "b": np.array(limit, dtype), "c": np.array(delta, dtype)}
    assert_matches_reference("Range", inputs, opset=opset, initializers=["a", "b", "c"], expected=[want])


@pytest.mark.parametrize(
    "shape,k,dtype",
    [((3, 3), 0, None), ((3, 5), 1, None), ((4, 2), -1, onnx.TensorProto.INT32), ((3, 3), 5, onnx.TensorProto.DOUBLE)],
)
def test_eye_like(shape, k, dtype):
    opset = 9 if dtype is None else 22
    kw = {"k": k} if dtype is None else {"k": k, "dtype": dtype}
    assert_matches_reference("EyeLike", {"x": rand(*shape)}, opset=opset, **kw)


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k,xshape", [(None, (4, 5)), (2, (2, 3, 3)), (-1, (4, 5)), (-7, (1, 5)), (9, (3, 4))])
def test_trilu(upper, k, xshape):
    inputs = {"x": rand(*xshape), "k": None if k is None else np.array(k, I64)}
    assert_matches_reference("Trilu", inputs, opset=14, upper=upper, initializers=["k"])


def test_trilu_grads():
    check_op_grads("Trilu", {"x": rand(3, 4), "k": np.array(1, I64)}, opset=14, upper=0, initializers=["k"])


# -- DepthToSpace, SpaceToDepth --------------------------------------------------------------


@pytest.mark.parametrize("opset,mode", [(1, None), (11, "CRD"), (13, "DCR"), (13, None), (28, "CRD")])
def test_depth_to_space(opset, mode):
    kw = {} if mode is None else {"mode": mode}
    assert_matches_reference("DepthToSpace", {"x": rand(2, 8, 3, 2)}, opset=opset, blocksize=2, **kw)


@pytest.mark.parametrize("opset,mode", [(1, None), (13, None), (28, "DCR"), (28, "CRD")])
def test_space_to_depth(opset, mode):
    kw = {} if mode is None else {"mode": mode}
    x = rand(2, 3, 4, 6)
    out = assert_matches_reference("SpaceToDepth", {"x": x}, opset=opset, blocksize=2, **kw)
    # SpaceToDepth inverts DepthToSpace in the same mode.
    back = run_jonnx(
        node_model("DepthToSpace", {"y": out[0]}, opset=28, blocksize=2, mode=mode or "DCR"), {"y": out[0]}
    )
    np.testing.assert_array_equal(back[0], x)


def test_depth_space_errors_and_grads():
    raises_node_error("DepthToSpace", {"x": rand(1, 6, 2, 2)}, "not divisible", opset=13, blocksize=2)
    raises_node_error("SpaceToDepth", {"x": rand(1, 1, 3, 2)}, "not divisible", opset=13, blocksize=2)
    check_op_grads("DepthToSpace", {"x": rand(1, 4, 2, 2)}, opset=13, blocksize=2, mode="CRD")


# -- static shapes under jit -------------------------------------------------------------------


def test_shape_arithmetic_folds_under_jit():
    # Shape -> Slice -> Concat -> Reshape, as PyTorch exports a flatten: the shape is folded
    # at trace time, so the jitted model runs with a traced input.
    nodes = [
        oh.make_node("Shape", ["x"], ["s"]),
        oh.make_node("Slice", ["s", "zero", "one"], ["batch"]),
        oh.make_node("Concat", ["batch", "minus1"], ["target"], axis=0),
        oh.make_node("Reshape", ["x", "target"], ["y"]),
    ]
    inits = [
        onnx.numpy_helper.from_array(ints(0), "zero"),
        onnx.numpy_helper.from_array(ints(1), "one"),
        onnx.numpy_helper.from_array(ints(-1), "minus1"),
    ]
    graph = oh.make_graph(
        nodes,
        "g",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3, 4])],
        [oh.make_empty_tensor_value_info("y")],
        initializer=inits,
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    model.ir_version = 8
    x = rand(2, 3, 4)
    got = run_jonnx(model, {"x": x})
    np.testing.assert_array_equal(got[0], x.reshape(2, 12))

"""Indexing ops (gathers, scatters, TopK, NonZero, cumulative ops, Compress, Unique, OneHot,
ReverseSequence, TensorScatter) against the ReferenceEvaluator / numpy, over opsets and dtypes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import onnx.helper as oh
import pytest
from jax.test_util import check_grads
from onnx.reference import ReferenceEvaluator

import jonnx
from jonnx import errors
from tests.ops._harness import (
    assert_half_rounds_once,
    assert_matches_reference,
    check_op_grads,
    node_model,
    ort_expected,
    run_jonnx,
    run_reference,
)

RNG = np.random.default_rng(0)


def _data(shape, dtype=np.float32):
    if np.dtype(dtype).kind == "f":
        return RNG.standard_normal(shape).astype(dtype)
    return RNG.integers(0, 100, shape).astype(dtype)


# --------------------------------------------------------------------------------------
# Gather family


@pytest.mark.parametrize(
    "opset,axis,dtype,idx_dtype",
    [
        (1, 0, np.float32, np.int64),
        (1, 1, np.int64, np.int32),
        (11, -1, np.float16, np.int64),
        (11, 0, np.int64, np.int64),
        (13, 1, np.float32, np.int32),
        (13, -1, np.float16, np.int64),
    ],
)
def test_gather(opset, axis, dtype, idx_dtype):
    data = _data((3, 4, 5), dtype)
    n = data.shape[axis]
    low = -n if opset >= 11 else 0  # negative indices are defined from opset 11
    indices = RNG.integers(low, n, (2, 3)).astype(idx_dtype)
    assert_matches_reference("Gather", {"data": data, "indices": indices}, opset=opset, axis=axis)


def test_gather_scalar_index_and_constant_indices():
    data = _data((4, 3))
    assert_matches_reference("Gather", {"data": data, "i": np.array(-1, np.int64)}, opset=13)
    assert_matches_reference(
        "Gather", {"data": data, "i": np.array([3, 0], np.int64)}, opset=13, initializers=("i",), axis=0
    )


def test_gather_strings():
    # Eager only: jax.jit cannot return string arrays.
    data = np.array(["a", "bc", "d"], dtype=object)
    indices = np.array([2, -3], np.int64)
    inputs = {"data": data, "i": indices}
    got = run_jonnx(node_model("Gather", inputs, opset=13, initializers=("data", "i")), inputs, jit=False)
    np.testing.assert_array_equal(got[0], np.array(["d", "a"], dtype=object))
    model = node_model("Gather", inputs, opset=13, initializers=("data",))
    with pytest.raises(errors.NodeError, match="string tensors can only be indexed by values known"):
        run_jonnx(model, inputs, jit=False)


@pytest.mark.parametrize("const", [False, True])
@pytest.mark.parametrize("axis", [0, 2])
def test_gather_no_indices_from_an_empty_axis(axis, const):
    # The output keeps the indices' dims, (0, 0) here, in place of the empty axis. (onnx 1.21's
    # ReferenceEvaluator gives (0,); onnxruntime is the reference.)
    data = np.zeros((0, 1, 0), np.float32)
    inputs = {"data": data, "i": np.zeros((0, 0), np.int64)}
    want = ort_expected("Gather", inputs, opset=13, axis=axis)
    out = assert_matches_reference(
        "Gather", inputs, opset=13, axis=axis, initializers=("i",) if const else (), expected=want
    )
    assert out[0].shape == ((0, 0, 1, 0) if axis == 0 else (0, 1, 0, 0))


@pytest.mark.parametrize("op", ["Gather", "GatherElements"])
def test_gather_out_of_range_constant_index_raises(op):
    data = _data((3, 3))
    indices = np.array([[0, 3, 1]], np.int64) if op == "GatherElements" else np.array([0, 3], np.int64)
    inputs = {"data": data, "indices": indices}
    model = node_model(op, inputs, opset=13, initializers=("indices",))
    with pytest.raises(errors.NodeError, match=r"index 3 at position .* out of range \[-3, 2\]"):
        run_jonnx(model, inputs)


def test_gather_from_an_empty_axis_says_the_axis_is_empty():
    # Found by the fuzz (tests/conformance/fuzz.py): the message read "out of range [-0, -1]".
    inputs = {"data": _data((0, 3, 0)), "indices": np.array(0, np.int64)}
    model = node_model("Gather", inputs, opset=13, axis=2, initializers=("indices",))
    with pytest.raises(errors.NodeError, match=r"index 0 at position \(\) is out of range: the axis is empty"):
        run_jonnx(model, inputs)


@pytest.mark.parametrize("opset", [1, 13])
def test_gather_grads(opset):
    data = _data((4, 3))
    indices = np.array([[0, 2], [3, 2]], np.int64)  # a repeated index accumulates gradient
    check_op_grads("Gather", {"data": data, "indices": indices}, opset=opset, axis=0)


@pytest.mark.parametrize("opset,axis", [(11, 0), (13, 1), (13, -1)])
def test_gather_elements(opset, axis):
    data = _data((3, 4))
    shape = (2, 4) if axis == 0 else (3, 2)  # indices may be smaller off the axis
    n = data.shape[axis]
    indices = RNG.integers(-n, n, shape).astype(np.int64)

    def expected(data, indices):
        # numpy loop: the ReferenceEvaluator rejects indices smaller than data off the axis,
        # which ONNX (and onnxruntime, torch.gather) allow.
        out = np.empty(indices.shape, data.dtype)
        for pos in np.ndindex(indices.shape):
            src = list(pos)
            src[axis] = indices[pos] % n
            out[pos] = data[tuple(src)]
        return [out]

    assert_matches_reference(
        "GatherElements", {"data": data, "indices": indices}, opset=opset, axis=axis, expected=expected
    )
    assert_matches_reference(
        "GatherElements",
        {"data": data, "indices": np.broadcast_to(indices[:1] if axis == 0 else indices[:, :1], data.shape).copy()},
        opset=opset,
        axis=axis,
    )
    check_op_grads("GatherElements", {"data": data, "indices": indices}, opset=opset, axis=axis)


@pytest.mark.parametrize("opset,batch_dims,k", [(11, None, 2), (12, 0, 1), (12, 1, 2), (13, 1, 1), (13, 2, 2)])
def test_gather_nd(opset, batch_dims, k):
    data = _data((2, 3, 4, 5))
    b = batch_dims or 0
    sizes = data.shape[b : b + k]
    idx_shape = data.shape[:b] + (3, k)
    indices = np.stack([RNG.integers(-s, s, idx_shape[:-1]) for s in sizes], axis=-1).astype(np.int64)
    attrs = {} if batch_dims is None else {"batch_dims": batch_dims}
    assert_matches_reference("GatherND", {"data": data, "indices": indices}, opset=opset, **attrs)
    check_op_grads("GatherND", {"data": data, "indices": indices}, opset=opset, **attrs)


def test_gather_nd_out_of_range_constant_index_raises():
    inputs = {"data": _data((2, 3)), "indices": np.array([[1, 3]], np.int64)}
    model = node_model("GatherND", inputs, opset=13, initializers=("indices",))
    with pytest.raises(errors.NodeError, match=r"coordinate 1\) 3 .* out of range"):
        run_jonnx(model, inputs)


def _constant_data_model(op_type, data, dynamic, opset, **attrs):
    """``out = op(Constant data, *dynamic) * w``: data known at trace time (as a GPT-2 dynamo
    export's position table is), the other inputs traced, and a float param ``w`` to
    differentiate."""
    const = oh.make_node("Constant", [], ["data"], value=onnx.numpy_helper.from_array(data))
    node = oh.make_node(op_type, ["data", *dynamic], ["g"], **attrs)
    scale = oh.make_node("Mul", ["g", "w"], ["out"])
    inputs = [
        oh.make_tensor_value_info(name, oh.np_dtype_to_tensor_dtype(value.dtype), value.shape)
        for name, value in dynamic.items()
    ]
    w = onnx.numpy_helper.from_array(np.array(1.5, data.dtype), "w")
    graph = oh.make_graph(
        [const, node, scale],
        "g",
        inputs,
        [oh.make_tensor_value_info("out", oh.np_dtype_to_tensor_dtype(data.dtype), None)],
        initializer=[w],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)])
    model.ir_version = 8
    return model


_IDX = np.array([[1, 0], [0, 2]], np.int64)


@pytest.mark.parametrize(
    "op_type,dynamic,attrs",
    [
        ("Gather", {"i": np.array([2, -1], np.int64)}, {"axis": 1}),
        ("GatherElements", {"i": np.array([[2, 0, 1], [1, 1, -1]], np.int64)}, {"axis": 1}),
        ("GatherND", {"i": _IDX}, {}),
        ("GatherND", {"i": _IDX[:, :1]}, {"batch_dims": 1}),
        ("ScatterND", {"i": _IDX, "u": np.array([5.0, 6.0], np.float32)}, {}),
        ("ScatterND", {"i": _IDX, "u": np.array([5.0, 6.0], np.float32)}, {"reduction": "mul"}),
        ("ScatterElements", {"i": np.array([[2, 0]], np.int64), "u": np.array([[5.0, 6.0]], np.float32)}, {"axis": 1}),
        (
            "ScatterElements",
            {"i": np.array([[2, 2]], np.int64), "u": np.array([[5.0, 6.0]], np.float32)},
            {"axis": 1, "reduction": "add"},
        ),
    ],
)
def test_constant_data_with_traced_indices_under_jit_and_grad(op_type, dynamic, attrs):
    # Regression: a numpy `data` reached GatherND's JAX-only `.at` path (jnp.reshape hands
    # numpy back as numpy); the siblings take the same mix of constant data and traced indices.
    data = np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5
    model = _constant_data_model(op_type, data, dynamic, 18, **attrs)
    want = ReferenceEvaluator(model).run(None, dict(dynamic))[0]
    m = jonnx.load(model)
    feeds = list(dynamic.values())
    np.testing.assert_allclose(np.asarray(m(*feeds)[0]), want, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(jax.jit(m.apply)(m.params, *feeds)[0]), want, rtol=1e-6)
    # d sum(op(data) * w) / dw = sum(op(data)) = sum(out) / w.
    grad = jax.jit(jax.grad(lambda p: jnp.sum(m.apply(p, *feeds)[0])))(m.params)
    np.testing.assert_allclose(float(grad["w"]), want.sum() / 1.5, rtol=1e-5)


# --------------------------------------------------------------------------------------
# Scatter family


def _unique_nd_indices(shape, count, k):
    flat = RNG.choice(int(np.prod(shape[:k])), count, replace=False)
    idx = np.stack(np.unravel_index(flat, shape[:k]), axis=-1)
    return (idx - np.array(shape[:k]) * RNG.integers(0, 2, idx.shape)).astype(np.int64)  # some negative


@pytest.mark.parametrize(
    "opset,reduction,k",
    [
        (11, None, 1),
        (13, None, 2),
        (16, "none", 1),
        (16, "add", 2),
        (16, "mul", 1),
        (18, "mul", 2),
        (18, "max", 1),
        (18, "min", 2),
    ],
)
def test_scatter_nd(opset, reduction, k):
    data = _data((4, 3, 2))
    indices = (
        _unique_nd_indices(data.shape, 3, k)
        if reduction in (None, "none")
        else RNG.integers(0, 3, (5, k)).astype(np.int64)
    )  # reductions accumulate repeated indices
    updates = _data(indices.shape[:-1] + data.shape[k:])
    attrs = {} if reduction is None else {"reduction": reduction}
    inputs = {"data": data, "indices": indices, "updates": updates}
    assert_matches_reference("ScatterND", inputs, opset=opset, **attrs)
    if reduction in (None, "none", "add", "mul"):
        for initializers in ((), ("indices",)):  # traced indices, and indices known at trace time
            check_op_grads("ScatterND", inputs, opset=opset, **attrs, initializers=initializers)


@pytest.mark.parametrize(
    "op,opset,reduction,axis,dtype",
    [
        ("Scatter", 9, None, 0, np.float32),
        ("Scatter", 10, None, -1, np.int32),
        ("ScatterElements", 11, None, -1, np.float32),
        ("ScatterElements", 13, None, 0, np.int32),
        ("ScatterElements", 16, "add", 0, np.float32),
        ("ScatterElements", 16, "mul", -1, np.float32),
        ("ScatterElements", 18, "mul", 0, np.int32),
        ("ScatterElements", 18, "max", -1, np.float32),
        ("ScatterElements", 18, "min", 0, np.int32),
        ("ScatterElements", 18, "none", -1, np.float32),
    ],
)
def test_scatter_elements(op, opset, reduction, axis, dtype):
    data = _data((4, 5), dtype)
    n = data.shape[axis]
    if reduction in (None, "none"):  # no repeated targets
        indices = np.stack([RNG.permutation(n)[:2] for _ in range(3)], axis=1 if axis == 0 else 0)
        indices = indices - n * (RNG.random(indices.shape) < 0.3)  # some negative
    else:
        indices = RNG.integers(-n, n, (3, 4))  # repeats accumulate
    indices = indices.astype(np.int64)
    updates = _data(indices.shape, dtype)
    attrs = {"axis": axis} if reduction is None else {"axis": axis, "reduction": reduction}
    inputs = {"data": data, "indices": indices, "updates": updates}
    expected = None
    if reduction in (None, "none"):
        # numpy loop over the schema's definition: the ReferenceEvaluator may lack Scatter-9.
        def expected(data, indices, updates):
            out = data.copy()
            for pos in np.ndindex(indices.shape):
                dst = list(pos)
                dst[axis] = indices[pos] % n
                out[tuple(dst)] = updates[pos]
            return [out]

    assert_matches_reference(op, inputs, opset=opset, expected=expected, **attrs)
    if dtype == np.float32 and reduction in (None, "none", "add", "mul"):
        for initializers in ((), ("indices",)):  # traced indices, and indices known at trace time
            check_op_grads(op, inputs, opset=opset, **attrs, initializers=initializers)


def test_scatter_mul_repeated_traced_targets_under_jit():
    # Indices traced under jit, targets repeated up to 4 times, zeros among the updates: the
    # segmented product must match a numpy loop, and its gradient finite differences.
    data = _data((4, 3))
    indices = np.array([[0, 2, 1], [0, 2, 1], [3, 2, 1], [0, 0, 1]], np.int64)
    updates = _data((4, 3))
    updates[1, 1] = 0.0
    model = jonnx.load(
        node_model(
            "ScatterElements", {"data": data, "indices": indices, "updates": updates}, opset=18, axis=0, reduction="mul"
        )
    )
    want = data.copy()
    for pos in np.ndindex(indices.shape):
        want[indices[pos], pos[1]] *= updates[pos]
    (got,) = jax.jit(model.apply)(model.params, data, indices, updates)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)

    with jax.enable_x64(True):

        def f(d, u):
            return model.apply(model.params, d, jnp.asarray(indices), u)[0]

        check_grads(
            jax.jit(f),
            (data.astype(np.float64), updates.astype(np.float64)),
            order=1,
            modes=("fwd", "rev"),
            eps=1e-4,
            rtol=1e-3,
            atol=1e-3,
        )


def test_scatter_out_of_range_constant_index_raises():
    inputs = {"data": _data((3,)), "indices": np.array([-4], np.int64), "updates": _data((1,))}
    model = node_model("ScatterElements", inputs, opset=18, initializers=("indices",))
    with pytest.raises(errors.NodeError, match=r"index -4 .* out of range"):
        run_jonnx(model, inputs)


def _tensor_scatter_expected(axis, mode):
    # The pseudocode of the TensorScatter-24 schema, written out in numpy.
    def expected(cache, update, write_indices=None):
        out = cache.copy()
        ax = axis % cache.ndim
        c, u = np.moveaxis(out, ax, 1), np.moveaxis(update, ax, 1)
        w = np.zeros(cache.shape[0], np.int64) if write_indices is None else write_indices
        for b in range(cache.shape[0]):
            for s in range(update.shape[ax]):
                pos = w[b] + s
                if mode == "circular":
                    pos %= cache.shape[ax]
                c[b, pos] = u[b, s]
        return [out]

    return expected


@pytest.mark.parametrize(
    "mode,axis,with_indices",
    [
        ("linear", -2, False),
        ("linear", 1, True),
        ("circular", 2, True),
        ("circular", -2, True),
    ],
)
def test_tensor_scatter(mode, axis, with_indices):
    cache_shape = [2, 3, 6, 4]
    update_shape = list(cache_shape)
    update_shape[axis] = 2
    cache, update = _data(tuple(cache_shape)), _data(tuple(update_shape))
    length = cache_shape[axis]
    write = None
    if with_indices:
        write = np.array([1, length - 1 if mode == "circular" else length - 2], np.int64)
    inputs = {"cache": cache, "update": update, "write": write}
    assert_matches_reference(
        "TensorScatter", inputs, opset=24, mode=mode, axis=axis, expected=_tensor_scatter_expected(axis, mode)
    )
    check_op_grads("TensorScatter", inputs, opset=24, mode=mode, axis=axis)


def test_tensor_scatter_linear_overflow_raises():
    inputs = {"cache": _data((1, 4, 2)), "update": _data((1, 2, 2)), "write": np.array([3], np.int64)}
    model = node_model("TensorScatter", inputs, opset=24, axis=1, initializers=("write",))
    with pytest.raises(errors.NodeError, match="do not fit a cache of length 4"):
        run_jonnx(model, inputs)


# --------------------------------------------------------------------------------------
# TopK


def _np_top_k(x, k, axis, largest=True):
    # Stable argsort on the (order-reversing) key gives ONNX's lower-index-first tie rule.
    key = x if not largest else (~x if x.dtype.kind in "iu" else -x)
    idx = np.take(np.argsort(key, axis=axis, kind="stable"), np.arange(k), axis=axis)
    return [np.take_along_axis(x, idx, axis=axis), idx.astype(np.int64)]


@pytest.mark.parametrize("opset,largest,axis", [(1, 1, -1), (10, 1, 0), (11, 0, -1), (11, 1, 0), (24, 0, 0)])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.uint8])
def test_top_k(opset, largest, axis, dtype):
    x = RNG.integers(0, 5, (6, 7)).astype(dtype)  # many ties
    k = 3
    inputs = {"x": x} if opset == 1 else {"x": x, "k": np.array([k], np.int64)}
    attrs = {"axis": axis}
    if opset == 1:
        attrs["k"] = k
    if opset >= 11:
        attrs["largest"] = largest
    # numpy reference: the ReferenceEvaluator does not apply the tie rule for every dtype.
    assert_matches_reference(
        "TopK",
        inputs,
        2,
        opset=opset,
        expected=lambda x, *_: _np_top_k(x, k, axis, bool(largest)),
        initializers=("k",),
        **attrs,
    )


@pytest.mark.parametrize("largest", [0, 1])
def test_top_k_signed_zeros_are_equal(largest):
    # -0 == +0, so the tie goes to the lower index (lax.top_k alone puts -0 below +0).
    x = np.array([[-1.0, 1.0, 0.0, -0.0, 2.0, -0.0]], np.float32)
    inputs = {"x": x, "k": np.array([3], np.int64)}
    out = assert_matches_reference("TopK", inputs, 2, opset=11, initializers=("k",), axis=1, largest=largest)
    np.testing.assert_array_equal(out[1], [[0, 2, 3]] if not largest else [[4, 1, 2]])


def test_top_k_grads():
    x = RNG.permutation(20).astype(np.float32).reshape(4, 5)  # distinct values: smooth
    check_op_grads("TopK", {"x": x, "k": np.array([2], np.int64)}, opset=11, n_outputs=2, initializers=("k",))


def test_top_k_too_large_k_raises():
    inputs = {"x": _data((2, 3)), "k": np.array([4], np.int64)}
    model = node_model("TopK", inputs, 2, opset=11, initializers=("k",))
    with pytest.raises(errors.NodeError, match="k=4 is out of range"):
        run_jonnx(model, inputs)


# --------------------------------------------------------------------------------------
# Value-dependent shapes: NonZero, Compress, Unique


@pytest.mark.parametrize("opset,shape", [(9, (5,)), (13, (3, 4)), (13, (2, 3, 2))])
def test_non_zero(opset, shape):
    x = RNG.integers(-1, 2, shape).astype(np.float32)
    assert_matches_reference("NonZero", {"x": x}, opset=opset)


def test_non_zero_traced_input_raises_static_value_error():
    x = np.array([0.0, 1.0, 2.0], np.float32)
    m = jonnx.load(node_model("NonZero", {"x": x}, opset=13))
    with pytest.raises(errors.StaticValueError):
        jax.jit(lambda v: m.apply(m.params, v))(x)


@pytest.mark.parametrize("opset,axis", [(9, None), (9, 1), (11, 0), (11, -1), (28, None), (28, -1)])
def test_compress(opset, axis):
    x = _data((3, 4))
    length = x.size if axis is None else x.shape[axis]
    cond = RNG.random(length - 1) < 0.5  # shorter than the axis: the rest is dropped
    attrs = {} if axis is None else {"axis": axis}
    inputs = {"x": x, "cond": cond}
    assert_matches_reference(
        "Compress",
        inputs,
        opset=opset,
        initializers=("cond",),
        expected=lambda x, c: [np.compress(c, x, axis=axis)],
        **attrs,
    )
    check_op_grads("Compress", inputs, opset=opset, initializers=("cond",), **attrs)


def test_compress_condition_too_long_raises():
    inputs = {"x": _data((2,)), "cond": np.array([False, True, True])}
    model = node_model("Compress", inputs, opset=11, axis=0, initializers=("cond",))
    with pytest.raises(errors.NodeError, match="beyond the axis size 2"):
        run_jonnx(model, inputs)


def _np_unique(x, axis, is_sorted):
    # Independent of jonnx: numpy's unique, reordered by first occurrence when unsorted.
    y, first, inverse, counts = np.unique(
        x if axis is not None else x.reshape(-1), axis=axis, return_index=True, return_inverse=True, return_counts=True
    )
    inverse = inverse.reshape(-1)
    if not is_sorted:
        order = np.argsort(first, kind="stable")
        y = np.take(y, order, axis=axis or 0)
        inverse = np.argsort(order)[inverse]
        first, counts = first[order], counts[order]
    return [y, first.astype(np.int64), inverse.astype(np.int64), counts.astype(np.int64)]


@pytest.mark.parametrize("opset", [11, 28])
@pytest.mark.parametrize("axis", [None, 0, 1, -1])
@pytest.mark.parametrize("is_sorted", [1, 0])
def test_unique(opset, axis, is_sorted):
    x = RNG.integers(0, 3, (4, 3)).astype(np.float32)
    x[2] = x[0]  # a repeated row for the axis=0 case
    attrs = {"sorted": is_sorted} if axis is None else {"sorted": is_sorted, "axis": axis}
    assert_matches_reference(
        "Unique",
        {"x": x},
        4,
        opset=opset,
        initializers=("x",),
        expected=lambda x: _np_unique(x, axis, is_sorted),
        **attrs,
    )


# --------------------------------------------------------------------------------------
# Cumulative ops


@pytest.mark.parametrize("op,opset", [("CumSum", 11), ("CumSum", 14), ("CumProd", 26)])
@pytest.mark.parametrize(
    "axis,exclusive,reverse,dtype",
    [
        (0, 0, 0, np.float32),
        (-1, 1, 0, np.int32),
        (0, 0, 1, np.int32),
        (-1, 1, 1, np.float32),
    ],
)
def test_cumulative(op, opset, axis, exclusive, reverse, dtype):
    x = RNG.integers(-3, 4, (3, 4)).astype(dtype)
    fn = np.cumsum if op == "CumSum" else np.cumprod
    identity = 0 if op == "CumSum" else 1

    def expected(x, _):
        y = np.flip(x, axis) if reverse else x
        if exclusive:
            pad = np.full_like(np.take(y, [0], axis=axis), identity)
            y = np.concatenate([pad, np.take(y, np.arange(y.shape[axis] - 1), axis=axis)], axis=axis)
        y = fn(y, axis=axis, dtype=dtype)
        return [np.flip(y, axis) if reverse else y]

    inputs = {"x": x, "axis": np.array(axis, np.int32)}
    attrs = {"exclusive": exclusive, "reverse": reverse}
    assert_matches_reference(op, inputs, opset=opset, expected=expected, initializers=("axis",), **attrs)
    if dtype == np.float32:
        check_op_grads(
            op,
            {"x": RNG.uniform(0.5, 1.5, (3, 4)).astype(np.float32), "axis": inputs["axis"]},
            opset=opset,
            initializers=("axis",),
            **attrs,
        )


# --------------------------------------------------------------------------------------
# OneHot and ReverseSequence


def _np_one_hot(indices, depth, values, axis, wrap_negative):
    idx = indices.astype(np.int64)
    if wrap_negative:
        idx = np.where(idx < 0, idx + depth, idx)
    hot = np.expand_dims(idx, axis) == np.arange(depth).reshape(
        [-1 if d == axis % (idx.ndim + 1) else 1 for d in range(idx.ndim + 1)]
    )
    return [np.where(hot, values[1], values[0]).astype(values.dtype)]


@pytest.mark.parametrize(
    "opset,axis,idx_dtype",
    [
        (9, -1, np.int64),
        (9, 0, np.float32),
        (11, 1, np.int64),
        (11, -1, np.float32),
        (28, 0, np.int64),
    ],
)
def test_one_hot(opset, axis, idx_dtype):
    depth = 5
    indices = RNG.integers(-7, 7, (2, 3)).astype(idx_dtype)  # negative and out-of-range too
    values = np.array([-1.5, 2.0], np.float32)
    inputs = {"indices": indices, "depth": np.array(depth, np.int64), "values": values}
    # numpy reference: OneHot-9 does not wrap negative indices (changelog), the
    # ReferenceEvaluator does.
    assert_matches_reference(
        "OneHot",
        inputs,
        opset=opset,
        axis=axis,
        initializers=("depth",),
        expected=lambda i, d, v: _np_one_hot(i, depth, v, axis, opset >= 11),
    )
    check_op_grads("OneHot", inputs, opset=opset, axis=axis, initializers=("depth",), wrt=["values"])


@pytest.mark.parametrize(
    "opset,batch_axis,time_axis,dtype",
    [
        (10, 1, 0, np.float32),
        (10, 0, 1, np.int64),
        (28, 0, 1, np.float32),
    ],
)
def test_reverse_sequence(opset, batch_axis, time_axis, dtype):
    shape = [0, 0, 2]
    shape[batch_axis], shape[time_axis] = 3, 4
    x = _data(tuple(shape), dtype)
    lens = np.array([4, 1, 2], np.int64)
    inputs = {"x": x, "lens": lens}
    attrs = {"batch_axis": batch_axis, "time_axis": time_axis}
    assert_matches_reference("ReverseSequence", inputs, opset=opset, **attrs)
    if dtype == np.float32:
        check_op_grads("ReverseSequence", inputs, opset=opset, **attrs)


@pytest.mark.parametrize(
    "op,inputs,attrs",
    [
        ("GatherElements", {"data": _data((3, 4)), "indices": np.array([[0, -1, 2, 1]], np.int64)}, {}),
        (
            "ScatterND",
            {"data": _data((3, 4)), "indices": np.array([[2], [-3]], np.int64), "updates": _data((2, 4))},
            {"reduction": "add"},
        ),
        ("ReverseSequence", {"data": _data((4, 2)), "lens": np.array([3, 1], np.int64)}, {}),
    ],
)
def test_vmap_matches_per_example(op, inputs, attrs):
    # vmap over a batch of every input (indices too) must match the ReferenceEvaluator per example.
    model = node_model(op, inputs, opset=18 if op != "ReverseSequence" else 10, **attrs)
    batch = [np.stack([v, v[::-1].copy() if v.dtype.kind == "f" else v]) for v in inputs.values()]
    with jax.enable_x64(True):
        m = jonnx.load(model)
        got = np.asarray(jax.vmap(lambda *xs: m.apply(m.params, *xs)[0])(*batch))
    for b in range(2):
        want = run_reference(model, {k: x[b] for k, x in zip(inputs, batch)})[0]
        np.testing.assert_allclose(got[b], want, rtol=1e-6)


@pytest.mark.parametrize("op", ["ScatterElements", "ScatterND"])
def test_half_precision_scatter_adds_round_once(op):
    # 200 float16 updates added into 64 targets accumulate in float32 and round once: added one
    # by one in float16, 30% of the targets were off the exact sum.
    if op == "ScatterElements":
        inputs = {
            "x": RNG.standard_normal((4, 64)),
            "i": RNG.integers(0, 64, (4, 200)),
            "u": RNG.standard_normal((4, 200)),
        }
        attrs = {"axis": 1}
    else:
        inputs = {"x": RNG.standard_normal(64), "i": RNG.integers(0, 64, (200, 1)), "u": RNG.standard_normal(200)}
        attrs = {}
    assert_half_rounds_once(op, inputs, opset=18, reduction="add", **attrs)

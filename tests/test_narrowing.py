"""64-bit honesty: with x64 off, a trace-time 64-bit value JAX would narrow wrongly is reported."""

from __future__ import annotations

import json
import warnings

import jax
import numpy as np
import onnx
import onnx.helper as oh
import pytest

import jonnx
from jonnx import errors

TP = onnx.TensorProto


def scaled_argmax(scale: float, dtype: int = TP.INT64) -> onnx.ModelProto:
    """``argmax(scale * x)``: a model whose constant does not fit 32 bits when scale is 3e9."""
    np_dtype = onnx.helper.tensor_dtype_to_np_dtype(dtype)
    c = onnx.numpy_helper.from_array(np.array(scale, np_dtype), "c")
    graph = oh.make_graph(
        [
            oh.make_node("Mul", ["x", "c"], ["y"], name="scale"),
            oh.make_node("ArgMax", ["y"], ["i"], name="argmax", keepdims=0),
        ],
        "g",
        [oh.make_tensor_value_info("x", dtype, [2])],
        [oh.make_tensor_value_info("i", TP.INT64, [])],
        [c],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])


X = np.array([1, 0], np.int64)


def test_int64_constant_beyond_int32_warns_naming_the_node():
    model = jonnx.load(scaled_argmax(3_000_000_000))
    assert not jax.config.jax_enable_x64
    with pytest.warns(errors.NarrowingWarning) as record:
        model(X)
    (warning,) = record  # one warning for the model's trace
    message = str(warning.message)
    assert "node 'scale' (Mul)" in message and "'c'" in message and "3000000000" in message
    assert "jax_enable_x64" in message
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model(X)  # compiled already: no second warning


def test_with_x64_the_same_model_is_exact():
    # numpy's int64 arithmetic is the expected value: 3e9 * [1, 0] has its maximum at 0.
    want = int(np.argmax(np.int64(3_000_000_000) * X))
    with jax.enable_x64(True), warnings.catch_warnings():
        warnings.simplefilter("error")
        (got,) = jonnx.load(scaled_argmax(3_000_000_000))(X)
    assert int(got) == want == 0


def test_checked_mode_raises_instead():
    model = jonnx.load(scaled_argmax(3_000_000_000), checked=True)
    with pytest.raises(errors.NumericCheckError, match=r"node 'scale' \(Mul\).*3000000000.*int32"):
        model(X)


def test_values_that_fit_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (got,) = jonnx.load(scaled_argmax(2_000_000_000))(X)
    assert int(got) == 0


def test_float64_initializer_beyond_float32_range_warns_at_load():
    # A float initializer is a parameter, made a JAX array when the model loads.
    with pytest.warns(
        errors.NarrowingWarning,
        match=r"initializer 'c' .*node 'scale' \(Mul\).*float32",
    ):
        jonnx.load(scaled_argmax(1e300, TP.DOUBLE))
    with pytest.raises(errors.NumericCheckError, match="initializer 'c'"):
        jonnx.load(scaled_argmax(1e300, TP.DOUBLE), checked=True)


def test_folded_float64_beyond_float32_range_warns():
    # 1e30 * 1e30 is folded exactly in float64 at trace time, then enters the traced Mul.
    consts = [onnx.numpy_helper.from_array(np.array(1e30), n) for n in ("a",)]
    graph = oh.make_graph(
        [
            oh.make_node("Constant", [], ["a"], value=consts[0], name="a_const"),
            oh.make_node("Mul", ["a", "a"], ["big"], name="square"),
            oh.make_node("Mul", ["x", "big"], ["y"], name="scale"),
        ],
        "g",
        [oh.make_tensor_value_info("x", TP.DOUBLE, [2])],
        [oh.make_tensor_value_info("y", TP.DOUBLE, [2])],
    )
    model = jonnx.load(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)]))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        model(np.array([1.0, 0.0]))
    # numpy also warns ("overflow encountered in cast") when JAX casts the folded value; only
    # jonnx's warning names the node.
    ours = [str(w.message) for w in record if issubclass(w.category, errors.NarrowingWarning)]
    assert len(ours) == 1 and "node 'scale' (Mul) value 'big'" in ours[0] and "float32" in ours[0]


def test_slice_ends_at_int64_max_are_not_narrowed():
    # PyTorch exports slice to the end as ends=INT64_MAX: a static input, used on the host.
    inits = [
        onnx.numpy_helper.from_array(np.array([v], np.int64), n)
        for n, v in [("starts", 1), ("ends", np.iinfo(np.int64).max), ("axes", 0)]
    ]
    graph = oh.make_graph(
        [oh.make_node("Slice", ["x", "starts", "ends", "axes"], ["y"])],
        "g",
        [oh.make_tensor_value_info("x", TP.FLOAT, [4])],
        [oh.make_tensor_value_info("y", TP.FLOAT, [3])],
        inits,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (got,) = jonnx.load(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)]))(
            np.arange(4, dtype=np.float32)
        )
    np.testing.assert_array_equal(got, [1, 2, 3])


def test_check_command_reports_the_warning(tmp_path, capsys):
    from jonnx import _progress
    from jonnx.cli import main

    path = tmp_path / "scaled.onnx"
    onnx.save(scaled_argmax(3_000_000_000), path)
    logger = _progress.logger
    saved = logger.handlers[:], logger.level, logger.propagate
    try:
        assert main(["check", str(path), "--json"]) == 0
    finally:
        logger.handlers[:], logger.propagate = saved[0], saved[2]
        logger.setLevel(saved[1])
    report = json.loads(capsys.readouterr().out)
    assert any("node 'scale' (Mul)" in w for w in report["warnings"])

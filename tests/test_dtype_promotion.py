"""The dtype rule, for every op that mixes float inputs: another float width is accepted.

README: "another width of the same kind is accepted (float64 into a float32 model computes in
float64)". Where a schema binds several inputs to one type variable (Conv's X, W and B; Add's
A and B; Concat's inputs), a float16, bfloat16 or float64 value meeting float32 weights computes
in their common type (``jnp.result_type``), with x64 on and off. The interpreter applies it in
one place (``jonnx._registry.promote_floats``), so no op can miss it.

The test enumerates the registry: every ai.onnx op whose newest schema shares a float type
variable between inputs must have a case below (or a reason in ``NOT_TESTED``). Each case feeds
its first such input in the other width, the rest as float32 initializers (weights), and
compares with the ReferenceEvaluator on the same values in float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import onnx.helper as oh
import pytest
from onnx.reference import ReferenceEvaluator

import jonnx
from jonnx._registry import float_groups, registered, schema_for

RNG = np.random.default_rng(0)


def f(*shape, low=-1.0, high=1.0):
    return RNG.uniform(low, high, shape).astype(np.float32)


def i64(*values):
    return np.array(values, np.int64)


# op -> (inputs in schema order (None: omitted), attributes). The mixed-width input is the
# first input of the op's first float group.
CASES = {
    "Add": ({"a": f(2, 3), "b": f(2, 3)}, {}),
    "Sub": ({"a": f(2, 3), "b": f(3)}, {}),
    "Mul": ({"a": f(2, 3), "b": f(2, 3)}, {}),
    "Div": ({"a": f(2, 3), "b": f(2, 3, low=0.5, high=2.0)}, {}),
    "Mod": ({"a": f(2, 3), "b": f(2, 3, low=0.5, high=2.0)}, {"fmod": 1}),
    "PRelu": ({"x": f(2, 3), "slope": f(3)}, {}),
    "Equal": ({"a": f(2, 3), "b": f(2, 3)}, {}),
    "Greater": ({"a": f(2, 3), "b": f(2, 3)}, {}),
    "GreaterOrEqual": ({"a": f(2, 3), "b": f(2, 3)}, {}),
    "Less": ({"a": f(2, 3), "b": f(2, 3)}, {}),
    "LessOrEqual": ({"a": f(2, 3), "b": f(2, 3)}, {}),
    "Max": ({"a": f(2, 3), "b": f(2, 3)}, {}),
    "Min": ({"a": f(2, 3), "b": f(2, 3)}, {}),
    "Mean": ({"a": f(2, 3), "b": f(2, 3)}, {}),
    "Sum": ({"a": f(2, 3), "b": f(2, 3), "c": f(3)}, {}),
    "Concat": ({"a": f(2, 3), "b": f(1, 3)}, {"axis": 0}),
    "Where": (
        {"c": RNG.integers(0, 2, (2, 3)).astype(bool), "x": f(2, 3), "y": f(2, 3)},
        {},
    ),
    "Clip": ({"x": f(2, 3), "lo": np.float32(-0.5), "hi": np.float32(0.5)}, {}),
    "Pad": ({"x": f(2, 3), "pads": i64(1, 0, 0, 2), "v": np.float32(0.25)}, {}),
    "Range": (
        {"start": np.float32(0.5), "limit": np.float32(3.0), "delta": np.float32(0.75)},
        {},
    ),
    "MatMul": ({"a": f(2, 3), "b": f(3, 4)}, {}),
    "Gemm": ({"a": f(2, 3), "b": f(3, 4), "c": f(4)}, {"alpha": 0.5}),
    "Einsum": ({"a": f(2, 3), "b": f(3, 4)}, {"equation": "ij,jk->ik"}),
    "Conv": (
        {"x": f(1, 2, 5, 5), "w": f(3, 2, 3, 3), "b": f(3)},
        {"pads": [1, 0, 1, 0]},
    ),
    "ConvTranspose": (
        {"x": f(1, 2, 3, 3), "w": f(2, 3, 3, 3), "b": f(3)},
        {"strides": [2, 2]},
    ),
    "DeformConv": (
        {
            "x": f(1, 2, 4, 4),
            "w": f(3, 2, 3, 3),
            "offset": f(1, 18, 2, 2),
            "b": f(3),
            "mask": f(1, 9, 2, 2, low=0),
        },
        {},
    ),
    "BatchNormalization": (
        {
            "x": f(2, 3, 4),
            "scale": f(3),
            "bias": f(3),
            "mean": f(3),
            "var": f(3, low=0.5, high=2.0),
        },
        {},
    ),
    "InstanceNormalization": ({"x": f(2, 3, 4), "scale": f(3), "bias": f(3)}, {}),
    "LayerNormalization": ({"x": f(2, 3, 4), "scale": f(4), "bias": f(4)}, {}),
    "GroupNormalization": (
        {"x": f(2, 4, 3), "scale": f(4), "bias": f(4)},
        {"num_groups": 2},
    ),
    "RNN": (
        {"x": f(2, 1, 3), "w": f(1, 4, 3), "r": f(1, 4, 4), "b": f(1, 8)},
        {"hidden_size": 4},
    ),
    "GRU": (
        {"x": f(2, 1, 3), "w": f(1, 12, 3), "r": f(1, 12, 4), "b": f(1, 24)},
        {"hidden_size": 4},
    ),
    "LSTM": (
        {"x": f(2, 1, 3), "w": f(1, 16, 3), "r": f(1, 16, 4), "b": f(1, 32)},
        {"hidden_size": 4},
    ),
    "MaxRoiPool": (
        {"x": f(1, 2, 6, 6), "rois": np.array([[0, 0.5, 1.0, 4.0, 5.0]], np.float32)},
        {"pooled_shape": [2, 2]},
    ),
    "RoiAlign": (
        {
            "x": f(1, 2, 6, 6),
            "rois": np.array([[0.5, 1.0, 4.0, 5.0]], np.float32),
            "i": i64(0),
        },
        {"output_height": 2, "output_width": 2, "sampling_ratio": 2},
    ),
    "NegativeLogLikelihoodLoss": (
        {"x": f(2, 3), "t": i64(2, 0), "w": f(3, low=0.5)},
        {},
    ),
    "SoftmaxCrossEntropyLoss": ({"x": f(2, 3), "t": i64(2, 0), "w": f(3, low=0.5)}, {}),
    "ScatterElements": (
        {"x": f(2, 3), "i": i64(1, 0, 1).reshape(1, 3), "u": f(1, 3)},
        {},
    ),
    "ScatterND": ({"x": f(2, 3), "i": i64(1).reshape(1, 1), "u": f(1, 3)}, {}),
    "TensorScatter": ({"cache": f(1, 4, 2), "u": f(1, 1, 2), "wi": i64(2)}, {}),
    "STFT": (
        {"signal": f(1, 16, 1), "step": np.array(4, np.int64), "window": f(8, low=0)},
        {},
    ),
    "MelWeightMatrix": (
        {
            "bins": np.array(4, np.int64),
            "dft": np.array(16, np.int64),
            "rate": np.array(8000, np.int64),
            "lo": np.float32(100.0),
            "hi": np.float32(3000.0),
        },
        {},
    ),
    "RotaryEmbedding": (
        {
            "x": f(1, 2, 3, 4),
            "cos": f(4, 2),
            "sin": f(4, 2),
            "pos": i64(0, 2, 3).reshape(1, 3),
        },
        {},
    ),
    "Attention": ({"q": f(1, 2, 3, 4), "k": f(1, 2, 3, 4), "v": f(1, 2, 3, 4)}, {}),
    "SwiGLU": ({"a": f(2, 4), "b": f(2, 4)}, {}),
    "CausalConvWithState": ({"x": f(1, 2, 5), "w": f(2, 1, 3), "b": f(2)}, {}),
    "LinearAttention": (
        {"q": f(1, 3, 4), "k": f(1, 3, 4), "v": f(1, 3, 4)},
        {"q_num_heads": 2, "kv_num_heads": 2, "update_rule": "linear"},
    ),
    "QLinearMatMul": (
        {
            "a": RNG.integers(0, 255, (2, 3)).astype(np.uint8),
            "sa": np.float32(0.05),
            "za": np.array(128, np.uint8),
            "b": RNG.integers(0, 255, (3, 2)).astype(np.uint8),
            "sb": np.float32(0.02),
            "zb": np.array(120, np.uint8),
            "sy": np.float32(0.5),
            "zy": np.array(100, np.uint8),
        },
        {},
    ),
}

# Ops whose float type variable is shared by inputs, not covered by a case here, and why.
NOT_TESTED = {
    "Scatter": "removed at opset 11; ScatterElements-11+ is the same op, covered",
    "SequenceConstruct": "its inputs become a sequence, not a computation; no mixing happens",
    "Loop": "carried values are heterogeneous (the variadic V is not homogeneous)",
    "Scan": "carried values are heterogeneous (the variadic V is not homogeneous)",
    "SequenceMap": "carried values are heterogeneous (the variadic V is not homogeneous)",
}


def _newest(op: str) -> int:
    return max(v for (d, o, v) in registered() if d == "" and o == op)


def _mixing_ops() -> set[str]:
    """Registered ai.onnx ops whose newest schema binds several inputs to one float type var."""
    found = set()
    for op in {o for (d, o, _) in registered() if d == ""}:
        schema = schema_for("", op, _newest(op))
        if schema is not None and float_groups(schema, len(schema.inputs) + 2):
            found.add(op)
    return found


def test_every_mixing_op_is_covered():
    missing = sorted(_mixing_ops() - set(CASES) - set(NOT_TESTED))
    assert not missing, f"ops sharing a float type variable without a dtype-promotion case: {missing}"


def _model(op, inputs, attrs, feed):
    """One node; ``feed`` is a graph input (declared float32), the others initializers."""
    opset = _newest(op)
    names = [name if value is not None else "" for name, value in inputs.items()]
    graph = oh.make_graph(
        [oh.make_node(op, names, [f"y{i}" for i in range(_n_outputs(op))], **attrs)],
        op,
        [oh.make_tensor_value_info(feed, onnx.TensorProto.FLOAT, np.shape(inputs[feed]))],
        [oh.make_empty_tensor_value_info(f"y{i}") for i in range(_n_outputs(op))],
        initializer=[
            onnx.numpy_helper.from_array(np.asarray(v), k) for k, v in inputs.items() if v is not None and k != feed
        ],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)])
    model.ir_version = 10
    return model


def _n_outputs(op):
    return {"LSTM": 3, "GRU": 2, "RNN": 2, "LinearAttention": 2, "CausalConvWithState": 2}.get(op, 1)


def _expected_dtypes(op, inputs, feed, width, x64):
    """Per output: the common dtype of the inputs its schema type variable binds."""
    schema = schema_for("", op, _newest(op))
    out = []
    for i in range(_n_outputs(op)):
        var = schema.outputs[min(i, len(schema.outputs) - 1)].type_str
        bound = [
            (width if name == feed else np.asarray(v).dtype)
            for j, (name, v) in enumerate(inputs.items())
            if v is not None and schema.inputs[min(j, len(schema.inputs) - 1)].type_str == var
        ]
        if not bound:
            out.append(None)
            continue
        with jax.enable_x64(True):
            common = np.dtype(jnp.result_type(*bound))
        out.append(common if x64 else np.dtype(jax.dtypes.canonicalize_dtype(common)))
    return out


def _reference(op, model, feeds):
    if op == "MaxRoiPool":
        # The ReferenceEvaluator has no MaxRoiPool; onnxruntime has version 1 (22 only widened
        # the types).
        import onnxruntime as ort

        old = onnx.ModelProto()
        old.CopyFrom(model)
        old.opset_import[0].version = 21
        session = ort.InferenceSession(old.SerializeToString(), providers=["CPUExecutionProvider"])
        return session.run(None, feeds)
    return ReferenceEvaluator(model).run(None, feeds)


WIDTHS = {"float16": np.float16, "bfloat16": jnp.bfloat16, "float64": np.float64}
# With x64 on, float16 and bfloat16 promote as with it off: only float64 changes meaning.
WIDTHS_X64 = {False: WIDTHS, True: {"float64": np.float64}}


@pytest.mark.parametrize("x64", [False, True], ids=["x64_off", "x64_on"])
@pytest.mark.parametrize("op", sorted(CASES))
def test_other_float_width_into_float32_weights(op, x64):
    inputs, attrs = CASES[op]
    schema = schema_for("", op, _newest(op))
    feed = list(inputs)[float_groups(schema, len(inputs))[0][0]]
    model = _model(op, inputs, attrs, feed)
    with jax.enable_x64(x64):
        m = jonnx.load(model)
    for width_name, width in WIDTHS_X64[x64].items():
        value = np.asarray(inputs[feed]).astype(width)
        # The reference sees the same values (rounded to the narrow width) in float32.
        feeds32 = {feed: value.astype(np.float32)}
        want = _reference(op, model, feeds32)
        with jax.enable_x64(x64):
            got = m(value)
        got = got if isinstance(got, (tuple, list)) else (got,)
        dtypes = _expected_dtypes(op, inputs, feed, np.dtype(width), x64)
        narrow = width_name != "float64" and any(d is not None and d.itemsize == 2 for d in dtypes)
        tol = 2e-2 if narrow else 1e-4
        for k, (g, w, d) in enumerate(zip(got, want, dtypes)):
            g = np.asarray(g)
            where = f"{op} output {k}, {width_name} input, x64={'on' if x64 else 'off'}"
            if d is not None and jnp.issubdtype(d, jnp.floating):
                assert g.dtype == d, f"{where}: dtype {g.dtype}, expected {d}"
            np.testing.assert_allclose(
                g.astype(np.float64) if g.dtype != bool else g,
                np.asarray(w).astype(g.dtype).astype(np.float64) if g.dtype != bool else w,
                rtol=tol,
                atol=tol,
                err_msg=where,
            )

"""com.microsoft (onnxruntime contrib) operators against onnxruntime, under jit.

Each case is a one-node model built with onnx.helper; onnxruntime (CPU, graph optimizations
off) gives the expected outputs. Ops onnxruntime runs only on GPU (BiasAdd, BiasSplitGelu)
are checked against numpy formulas from onnxruntime's ContribOperators.md.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest

from tests.ops._harness import node_model, run_jonnx

ort = pytest.importorskip("onnxruntime")

MS = "com.microsoft"
RNG = np.random.default_rng(0)


def _session(model: onnx.ModelProto):
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    return ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def check(
    op,
    inputs,
    n_outputs=1,
    *,
    domain=MS,
    opset=1,
    initializers=(),
    outputs=None,
    rtol=1e-5,
    atol=1e-5,
    expected=None,
    **attrs,
):
    """jonnx under jit matches onnxruntime (or ``expected``) on the listed outputs (default all)."""
    model = node_model(
        op,
        inputs,
        n_outputs,
        opset=opset,
        domain=domain,
        initializers=initializers,
        **attrs,
    )
    if expected is None:
        feeds = {
            k: np.asarray(v)
            for k, v in inputs.items()
            if v is not None and k not in initializers
        }
        expected = _session(model).run(None, feeds)
    got = run_jonnx(model, inputs, jit=True)
    outputs = range(n_outputs) if outputs is None else outputs
    for i in outputs:
        g, w = np.asarray(got[i]), np.asarray(expected[i])
        assert g.shape == w.shape, f"{op} output {i}: shape {g.shape} != {w.shape}"
        assert g.dtype == w.dtype, f"{op} output {i}: dtype {g.dtype} != {w.dtype}"
        np.testing.assert_allclose(
            g.astype(np.float64),
            w.astype(np.float64),
            rtol=rtol,
            atol=atol,
            err_msg=f"{op} output {i}",
        )
    return got


def rand(*shape, dtype=np.float32, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(dtype)


FLOATS = [pytest.param(np.float32, id="fp32"), pytest.param(np.float16, id="fp16")]


def _tol(dtype):
    return (
        {"rtol": 2e-3, "atol": 2e-3}
        if dtype == np.float16
        else {"rtol": 1e-4, "atol": 1e-5}
    )


# ------------------------------------------------------------------------------ normalization


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize(
    "with_bias,with_beta", [(False, False), (True, True), (True, False)]
)
def test_skip_layer_normalization(dtype, with_bias, with_beta):
    h = 16
    inputs = {
        "x": rand(2, 3, h, dtype=dtype),
        "skip": rand(2, 3, h, dtype=dtype),
        "gamma": rand(h, dtype=dtype),
        "beta": rand(h, dtype=dtype) if with_beta else None,
        "bias": rand(h, dtype=dtype) if with_bias else None,
    }
    check(
        "SkipLayerNormalization", inputs, 4, outputs=(0, 3), epsilon=1e-5, **_tol(dtype)
    )


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("with_bias", [False, True])
def test_skip_simplified_layer_normalization(dtype, with_bias):
    h = 8
    inputs = {
        "x": rand(2, 5, h, dtype=dtype),
        "skip": rand(2, 5, h, dtype=dtype),
        "gamma": rand(h, dtype=dtype),
        "bias": rand(h, dtype=dtype) if with_bias else None,
    }
    check("SkipSimplifiedLayerNormalization", inputs, 4, outputs=(0, 3), **_tol(dtype))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("axis", [-1, 1])
def test_simplified_layer_normalization_default_domain(dtype, axis):
    inputs = {
        "x": rand(2, 3, 8, dtype=dtype),
        "scale": rand(*((3, 8) if axis == 1 else (8,)), dtype=dtype),
    }
    check(
        "SimplifiedLayerNormalization",
        inputs,
        domain="",
        opset=17,
        axis=axis,
        epsilon=1e-6,
        **_tol(dtype),
    )


def test_layer_normalization_before_opset_17():
    inputs = {"x": rand(2, 3, 8), "scale": rand(8), "bias": rand(8)}
    check("LayerNormalization", inputs, domain="", opset=13, epsilon=1e-3)


@pytest.mark.parametrize(
    "segments,mask,position_ids",
    [(True, True, False), (False, False, False), (True, True, True)],
)
def test_embed_layer_normalization(segments, mask, position_ids):
    b, s, h, vocab = 2, 5, 8, 11
    inputs = {
        "ids": RNG.integers(0, vocab, (b, s)).astype(np.int32),
        "seg": RNG.integers(0, 2, (b, s)).astype(np.int32) if segments else None,
        "word": rand(vocab, h),
        "pos": rand(16, h),
        "segemb": rand(2, h) if segments else None,
        "gamma": rand(h),
        "beta": rand(h),
        "mask": np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], np.int32)
        if mask
        else None,
        "position_ids": RNG.integers(0, 16, (b, s)).astype(np.int32)
        if position_ids
        else None,
    }
    check(
        "EmbedLayerNormalization",
        inputs,
        3,
        outputs=(0, 1, 2) if mask else (0, 2),
        epsilon=1e-5,
    )


# ------------------------------------------------------------------------------ activations


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize(
    "op,with_bias",
    [
        ("Gelu", False),
        ("BiasGelu", True),
        ("FastGelu", False),
        ("FastGelu", True),
        ("QuickGelu", False),
    ],
)
def test_gelus(op, with_bias, dtype):
    inputs = {"x": rand(2, 3, 8, dtype=dtype, scale=2)}
    if with_bias:
        inputs["bias"] = rand(8, dtype=dtype)
    attrs = {"alpha": 1.5} if op == "QuickGelu" else {}
    check(op, inputs, **_tol(dtype), **attrs)


def _gelu(x):
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def test_bias_add_and_bias_split_gelu_follow_the_documented_formulas():
    # onnxruntime implements these two for CUDA only: the expected values are the documented
    # formulas in numpy.
    x, bias, skip = rand(2, 4, 8), rand(8), rand(2, 4, 8)
    check("BiasAdd", {"x": x, "bias": bias, "skip": skip}, expected=[x + bias + skip])
    s = (x + bias).astype(np.float64)
    check(
        "BiasSplitGelu",
        {"x": x, "bias": bias},
        expected=[(s[..., :4] * _gelu(s[..., 4:])).astype(np.float32)],
    )


# ------------------------------------------------------------------------------ fused


@pytest.mark.parametrize(
    "activation,params",
    [
        ("Relu", None),
        ("Tanh", None),
        ("Sigmoid", None),
        ("LeakyRelu", [0.2]),
        ("Clip", [-0.5, 0.5]),
        ("HardSigmoid", [0.3, 0.4]),
    ],
)
@pytest.mark.parametrize("with_z", [False, True])
def test_fused_conv(activation, params, with_z):
    inputs = {
        "x": rand(1, 4, 7, 7),
        "w": rand(6, 2, 3, 3),
        "b": rand(6),
        "z": rand(1, 6, 4, 4) if with_z else None,
    }
    attrs = {
        "activation": activation,
        "group": 2,
        "strides": [2, 2],
        "pads": [1, 1, 1, 1],
    }
    if params:
        attrs["activation_params"] = params
    check("FusedConv", inputs, initializers=("w", "b"), rtol=1e-4, atol=1e-4, **attrs)


@pytest.mark.parametrize(
    "activation,alpha",
    [("Relu", None), ("LeakyRelu", 0.1), ("Tanh", None), ("Sigmoid", None)],
)
@pytest.mark.parametrize("trans", [(0, 0), (1, 1)])
def test_fused_gemm(activation, alpha, trans):
    a = rand(3, 5) if not trans[0] else rand(5, 3)
    b = rand(5, 4) if not trans[1] else rand(4, 5)
    attrs = {
        "activation": activation,
        "transA": trans[0],
        "transB": trans[1],
        "alpha": 0.7,
        "beta": 0.5,
    }
    if alpha is not None:
        attrs["activation_alpha"] = alpha
    check("FusedGemm", {"a": a, "b": b, "c": rand(4)}, rtol=1e-4, **attrs)


@pytest.mark.parametrize(
    "trans_a,trans_b,batch_a,batch_b",
    [
        (0, 0, 0, 0),
        (1, 0, 0, 0),
        (0, 1, 0, 0),
        (1, 1, 0, 0),
        (0, 0, 1, 0),
        (0, 1, 0, 1),
        (1, 1, 1, 1),
    ],
)
def test_fused_matmul(trans_a, trans_b, batch_a, batch_b):
    def operand(rows, cols, trans, trans_batch):
        shape = [2, 3, cols, rows] if trans else [2, 3, rows, cols]
        if trans_batch:  # stored with the matrix's first dim in front of the batch dims
            shape = [shape[2], shape[0], shape[1], shape[3]]
        return rand(*shape)

    a = operand(4, 5, trans_a, batch_a)
    b = operand(5, 6, trans_b, batch_b)
    check(
        "FusedMatMul",
        {"a": a, "b": b},
        alpha=1.5,
        transA=trans_a,
        transB=trans_b,
        transBatchA=batch_a,
        transBatchB=batch_b,
        rtol=1e-4,
    )


@pytest.mark.parametrize("upper,k", [(1, 0), (0, 1), (1, -2)])
def test_trilu(upper, k):
    check(
        "Trilu",
        {"x": rand(2, 4, 5), "k": np.array(k, np.int64)},
        initializers=("k",),
        upper=upper,
    )

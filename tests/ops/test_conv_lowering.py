"""Conv's CPU lowerings (1x1 as a matmul, depthwise as shifted multiply-adds, k x k as im2col;
channels-last stems as broadcast multiply-adds in tests/test_layout.py) and ConvTranspose's
(phases) against the ReferenceEvaluator, onnxruntime and finite differences, and the choice
between them."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import onnxruntime as ort
import pytest
from jax.test_util import check_grads

import jonnx
from jonnx.ops import _tap_weights, _window, conv as conv_ops
from jonnx.ops._util import spread, spread_product
from jonnx.ops.channels_last import DOMAIN
from tests.ops._harness import assert_matches_reference, check_op_grads, node_model, ort_expected, run_reference

RNG = np.random.default_rng(1)

CASES = [
    # (lowering, x shape, w shape, attrs)
    ("matmul", (2, 5, 6, 7), (3, 5, 1, 1), {}),
    ("matmul", (1, 4, 7, 6), (6, 4, 1, 1), {"strides": [2, 3], "pads": [1, 0, 0, 1]}),
    ("matmul", (1, 3, 9), (2, 3, 1), {"strides": [2]}),
    ("matmul", (1, 20, 5, 4), (6, 20, 1, 1), {"strides": [2, 1], "pads": [0, 1, 1, 0]}),  # channels-last too
    ("depthwise", (2, 6, 7, 8), (6, 1, 3, 3), {"group": 6, "pads": [1, 1, 1, 1]}),
    # An odd batch: the tail of the weight gradient's tree of halves (ops/_util.py spread), which
    # the channels-last runs of these cases take (tests/test_layout.py).
    ("depthwise", (5, 3, 4, 5), (3, 1, 3, 3), {"group": 3, "pads": [1, 1, 1, 1]}),
    (
        "depthwise",
        (1, 4, 9, 8),
        (4, 1, 3, 2),
        {"group": 4, "strides": [2, 2], "dilations": [2, 1], "auto_pad": "SAME_UPPER"},
    ),
    (
        "depthwise",
        (1, 3, 5, 6, 4),
        (3, 1, 2, 3, 2),
        {"group": 3, "pads": [0, 1, 1, 1, 0, 0]},
    ),
    ("im2col", (2, 3, 4, 4), (5, 3, 3, 3), {"pads": [1, 1, 1, 1]}),  # a tiny (4x4) output
    ("xla", (2, 3, 8, 7), (5, 3, 3, 3), {"pads": [1, 1, 1, 1]}),  # k x k, batched, not tiny
    (
        "im2col",
        (2, 4, 7, 7),
        (3, 4, 3, 2),
        {"strides": [2, 2], "dilations": [1, 2], "pads": [0, 1, 2, 0]},
    ),
    ("im2col", (3, 2, 11), (4, 2, 5), {"auto_pad": "SAME_LOWER", "strides": [3]}),
    ("im2col", (1, 3, 8, 7), (5, 3, 3, 3), {"pads": [1, 1, 1, 1]}),  # a stem: few channels
    # A strided, dilated 5x5 stem (channels-last: the channel_taps lowering, tests/test_layout.py).
    ("im2col", (1, 3, 11, 12), (4, 3, 5, 5), {"strides": [2, 2], "dilations": [1, 2], "pads": [2, 3, 1, 4]}),
    # Patch stems (stride equal to the kernel; channels-last: the patches lowering,
    # tests/test_layout.py), one padded.
    ("im2col", (2, 3, 16, 16), (8, 3, 4, 4), {"strides": [4, 4]}),
    ("im2col", (1, 3, 7, 7), (4, 3, 2, 2), {"strides": [2, 2], "pads": [1, 0, 0, 1]}),
    ("xla", (1, 32, 6, 5), (4, 32, 3, 3), {"pads": [1, 1, 1, 1]}),  # wide k x k at batch 1
    (
        "xla",
        (1, 4, 6, 6),
        (6, 2, 3, 3),
        {"group": 2, "pads": [1, 1, 1, 1]},
    ),  # grouped, not depthwise
]


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{'x'.join(map(str, c[2]))}")
def test_lowering_matches_reference(case):
    lowering, xs, ws, attrs = case
    strides = tuple(attrs.get("strides", [1] * (len(xs) - 2)))
    assert conv_ops.conv_lowering(xs, ws, strides, attrs.get("group", 1), np.dtype(np.float32)) == (
        lowering if jax.default_backend() == "cpu" else "xla"
    )
    inputs = {"x": rand(*xs), "w": rand(*ws), "b": rand(ws[0])}
    expected = conv_reference(inputs, **attrs)
    assert_matches_reference("Conv", inputs, opset=22, expected=expected, rtol=1e-4, atol=1e-5, **attrs)


def conv_reference(inputs, **attrs) -> list[np.ndarray]:
    """An opset-22 Conv's output by onnxruntime, or by the ReferenceEvaluator where onnxruntime
    refuses (dilations with SAME padding). onnxruntime first: onnx 1.21's ReferenceEvaluator
    (the lowest version jonnx supports) gives a SAME_LOWER stride-3 convolution over 11 cells
    3 outputs where the spec gives ceil(11 / 3) = 4."""
    if str(attrs.get("auto_pad", "")).startswith("SAME") and any(d != 1 for d in attrs.get("dilations", ())):
        return run_reference(node_model("Conv", inputs, opset=22, **attrs), inputs)
    return ort_expected("Conv", inputs, opset=22, **attrs)


@pytest.mark.parametrize("case", CASES[::2] + CASES[1:2], ids=lambda c: f"{c[0]}-{'x'.join(map(str, c[2]))}")
def test_lowering_grads(case):
    _, xs, ws, attrs = case
    check_op_grads("Conv", {"x": rand(*xs), "w": rand(*ws), "b": rand(ws[0])}, opset=22, **attrs)


# NCHW 1x1 convolutions over maps of at least conv_ops.PER_IMAGE_MIN_CELLS (784) output cells: a
# product batched over the images (conv_ops._per_image_product) instead of one einsum.
PER_IMAGE_CASES = [
    ((2, 3, 28, 29), (4, 3, 1, 1), {}),
    ((3, 2, 1700), (3, 2, 1), {"strides": [2], "pads": [1, 0]}),  # strided, padded, 1-D
]


@pytest.mark.parametrize("case", PER_IMAGE_CASES, ids=lambda c: "x".join(map(str, c[0])))
def test_per_image_products(case, monkeypatch):
    xs, ws, attrs = case
    calls = []
    real = conv_ops._per_image_product
    monkeypatch.setattr(conv_ops, "_per_image_product", lambda *args: calls.append(1) or real(*args))
    inputs = {"x": rand(*xs), "w": rand(*ws), "b": rand(ws[0])}
    assert_matches_reference("Conv", inputs, opset=22, rtol=1e-4, atol=1e-5, **attrs)
    check_op_grads("Conv", inputs, opset=22, **attrs)
    assert calls, "the per-image product was not used"


@pytest.mark.parametrize(
    "case",
    [
        ((2, 3, 9, 8), (3, 1, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),  # MobileNetV2's 3x3/2
        ((1, 2, 5, 6, 7), (2, 1, 2, 3, 2), {"strides": [2, 1, 3], "dilations": [1, 2, 1]}),
        ((2, 2, 11), (2, 1, 4), {"strides": [3], "pads": [2, 1]}),
    ],
    ids=lambda c: "x".join(map(str, c[0])),
)
def test_strided_depthwise_gradients(case):
    # The strided input tangent goes by phases (conv_ops._strided_input_tangent): every phase and
    # block offset, with unstrided axes among strided ones, against finite differences.
    xs, ws, attrs = case
    check_op_grads("Conv", {"x": rand(*xs), "w": rand(*ws)}, opset=22, group=xs[1], **attrs)


@pytest.mark.parametrize("strides", [[1, 1], [1, 2]])
def test_depthwise_second_derivatives(strides):
    # The depthwise lowering's custom JVP is plain JAX but for the weights' term, a bilinear
    # primitive whose derivatives are plain sums (ops/_tap_weights.py), so derivatives of every
    # order follow; checked to second order, forward and reverse. Unstrided, the input's
    # tangent is the one placed at opaque offsets (conv_ops._input_tangent), here with a dilation.
    inputs = {"x": rand(7, 2, 5, 4), "w": rand(2, 1, 3, 2)}
    check_op_grads("Conv", inputs, opset=22, order=2, group=2, pads=[1, 0, 2, 1], strides=strides, dilations=[2, 1])


def _depthwise(x, w, strides, dilations=(1, 1)):
    """The depthwise lowering (NCHW, pads 1), as the Conv op calls it."""
    return conv_ops._conv_depthwise(x, w, strides, dilations, (1, 1), (1, 1), None, False, "OIHW")


def _xla_depthwise(x, w, strides, dilations=(1, 1)):
    return jax.lax.conv_general_dilated(
        x, w, strides, [(1, 1), (1, 1)], rhs_dilation=dilations, feature_group_count=x.shape[1]
    )


@pytest.mark.parametrize("strides", [(1, 1), (2, 2)])
def test_depthwise_weight_gradient_primitive(strides, monkeypatch):
    # NCHW, the weights' term of the depthwise JVP is a primitive whose transpose sums every
    # tap in one variadic reduction (ops/_tap_weights.py): gradients, vmapped gradients (over
    # the inputs, the weights, both) and forward mode against XLA's convolution in float64.
    calls = []
    real = _tap_weights.tap_sums
    monkeypatch.setattr(_tap_weights, "tap_sums", lambda *a: calls.append(1) or real(*a))
    with jax.enable_x64(True):
        x, w = RNG.standard_normal((3, 4, 9, 8)), RNG.standard_normal((4, 1, 3, 3))
        ct = RNG.standard_normal(_xla_depthwise(x, w, strides).shape)

        def loss(f):
            return lambda x, w: jnp.sum(jnp.tanh(f(jnp.sin(x), w, strides)) * ct)

        # Compiled: eagerly, each piece of the lowering and its derivatives compiles on its own.
        got, want = (jax.jit(jax.grad(loss(f), (0, 1))) for f in (_depthwise, _xla_depthwise))
        for a, b in zip(got(x, w), want(x, w)):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
        assert calls, "the weight gradient did not go through tap_sums"
        xs, ws = np.stack([x, 2 * x]), np.stack([w, -w])
        for axes, args in [((0, None), (xs, w)), ((None, 0), (x, ws)), ((0, 0), (xs, ws))]:
            for a, b in zip(jax.vmap(got, axes)(*args), jax.vmap(want, axes)(*args)):
                np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
        tangents = (RNG.standard_normal(x.shape), RNG.standard_normal(w.shape))
        np.testing.assert_allclose(
            jax.jit(lambda *p: jax.jvp(loss(_depthwise), p, tangents)[1])(x, w),
            jax.jit(lambda *p: jax.jvp(loss(_xla_depthwise), p, tangents)[1])(x, w),
            rtol=1e-10,
        )


@pytest.mark.parametrize("strides", [(1, 1), (2, 2)])
def test_depthwise_forward_mode_under_vmap(strides):
    # Forward mode under vmap is the one way the weights' term is batched (reverse mode
    # transposes it unevaluated): per-example JVPs (a vmap over the input and both tangents,
    # whose axis joins the batch axis, or over the weights' tangent alone, as jax.jacfwd does)
    # against XLA's convolution in float64.
    batched, batchers, real = [], jax.interpreters.batching.primitive_batchers, _tap_weights._batch
    # (JAX's table of batching rules can be written, not read: monkeypatch cannot restore it.)
    batchers[_tap_weights._tap_weight_p] = lambda args, dims, **p: batched.append(dims) or real(args, dims, **p)
    try:
        _check_forward_mode_under_vmap(strides)
    finally:
        batchers[_tap_weights._tap_weight_p] = real
    # Both branches of the batching rule ran: input batched with the taps not, and the reverse.
    assert any(dx is not None and dt is None for dx, dt in batched), batched
    assert any(dx is None and dt is not None for dx, dt in batched), batched


def _check_forward_mode_under_vmap(strides):
    def model(f):
        return lambda x, w: jnp.tanh(f(jnp.sin(x), w, strides))

    def tangent(f):
        return lambda x, w, tx, tw: jax.jvp(model(f), (x, w), (tx, tw))[1]

    def jacobian(f):
        return jax.jacfwd(lambda w, x: jnp.sum(model(f)(x, w), (0, 1)))

    with jax.enable_x64(True):
        x, w = RNG.standard_normal((2, 3, 7, 6)), RNG.standard_normal((3, 1, 3, 3))
        xs, tx, tw = (RNG.standard_normal((4, *s)) for s in (x.shape, x.shape, w.shape))
        for axes, args in [((0, None, 0, None), (xs, w, tx, tw[0])), ((None, None, None, 0), (x, w, tx[0], tw))]:
            got, want = (jax.jit(jax.vmap(tangent(f), axes))(*args) for f in (_depthwise, _xla_depthwise))
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
        got, want = (jax.jit(jacobian(f))(w, x) for f in (_depthwise, _xla_depthwise))
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def test_depthwise_weight_gradient_is_accurate_in_float32():
    # Over maps of more than 56 x 56 cells the taps' sums run one axis at a time: one reduction
    # over the batch and the map together (8 x 128 x 128 terms here) was 1.3e-5 off in float32,
    # these are about 2e-7. (The small maps of the test above take the one-reduction path.)
    shape = (8, 8, 128, 128)
    x, w = RNG.uniform(0, 6, shape), RNG.standard_normal((8, 1, 3, 3))
    ct = RNG.standard_normal(shape) + 0.3

    def weight_gradient(x, w, ct):
        return jax.vjp(lambda v: _depthwise(x, v, (1, 1)), w)[1](ct)[0]

    with jax.enable_x64(True):
        want = np.asarray(jax.jit(weight_gradient)(x, w, ct))
    got = np.asarray(jax.jit(weight_gradient)(*(np.asarray(a, np.float32) for a in (x, w, ct))))
    assert np.max(np.abs(got - want)) / np.max(np.abs(want)) < 1e-6


def test_forcing_xla_gives_the_same_values(monkeypatch):
    inputs = {"x": rand(2, 8, 10, 10), "w": rand(8, 8, 3, 3)}
    model = node_model("Conv", inputs, opset=22, pads=[1, 1, 1, 1])
    lowered = np.asarray(jonnx.load(model)(inputs["x"], inputs["w"])[0])
    monkeypatch.setattr(conv_ops, "CONV_LOWERING", "xla")
    direct = np.asarray(jonnx.load(model)(inputs["x"], inputs["w"])[0])
    np.testing.assert_allclose(lowered, direct, rtol=1e-4, atol=1e-4)


# ConvTranspose by phases: (x shape, w shape, attrs), all strided (unstrided ones stay with XLA).
TRANSPOSE_CASES = [
    ((2, 4, 5, 6), (4, 3, 2, 2), {"strides": [2, 2]}),  # a U-Net's 2x2 stride 2: taps never overlap
    ((1, 4, 4, 5), (4, 2, 4, 4), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),  # a DCGAN's 4x4 stride 2
    ((1, 6, 4, 4), (6, 1, 3, 3), {"group": 3, "strides": [2, 2], "dilations": [1, 2], "output_padding": [1, 0]}),
    ((1, 3, 5), (3, 2, 1), {"strides": [3]}),  # phases no tap reaches: only the bias
    ((1, 2, 3, 4), (2, 3, 3, 3), {"strides": [3, 2], "pads": [2, 0, 3, 1]}),
    ((1, 2, 4, 3), (2, 3, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_LOWER"}),
    ((1, 2, 2, 3, 3), (2, 2, 2, 2, 2), {"strides": [2, 1, 2]}),  # 3-D, one axis unstrided
]


def _transpose_id(case):
    return f"{'x'.join(map(str, case[1]))}-s{'x'.join(map(str, case[2]['strides']))}"


@pytest.mark.parametrize("case", TRANSPOSE_CASES, ids=_transpose_id)
def test_conv_transpose_phases_match_onnxruntime(case, monkeypatch):
    xs, ws, attrs = case
    cpu = jax.default_backend() == "cpu"
    assert conv_ops.conv_transpose_lowering(xs, ws, attrs["strides"], np.dtype(np.float32)) == (
        "phases" if cpu else "xla"
    )
    x, w, b = rand(*xs), rand(*ws), rand(ws[1] * attrs.get("group", 1))
    model = node_model("ConvTranspose", {"x": x, "w": w, "b": b}, opset=22, **attrs)
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x, "w": w, "b": b}
    )
    np.testing.assert_allclose(np.asarray(jonnx.load(model)(x, w, b)[0]), want, rtol=1e-4, atol=1e-4)
    last = jonnx.ops.call("ConvTranspose", np.moveaxis(x, 1, -1), w, b, domain=DOMAIN, **attrs)
    np.testing.assert_allclose(np.moveaxis(np.asarray(last), -1, 1), want, rtol=1e-4, atol=1e-4)
    monkeypatch.setattr(conv_ops, "CONV_LOWERING", "xla")  # XLA's transposed convolution agrees
    np.testing.assert_allclose(np.asarray(jonnx.load(model)(x, w, b)[0]), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", TRANSPOSE_CASES, ids=_transpose_id)
def test_conv_transpose_phases_grads(case):
    xs, ws, attrs = case
    inputs = {"x": rand(*xs), "w": rand(*ws), "b": rand(ws[1] * attrs.get("group", 1))}
    check_op_grads("ConvTranspose", inputs, opset=22, **attrs)


@pytest.mark.parametrize("case", TRANSPOSE_CASES[:3], ids=_transpose_id)
def test_channels_last_conv_transpose_derivatives(case):
    # Channels-last, XLA computes the values and the phases lowering the derivatives (a custom
    # JVP): checked to second order, forward and reverse, and with one argument differentiated
    # (the other's tangent a symbolic zero).
    xs, ws, attrs = case
    with jax.enable_x64(True):
        x, w = np.moveaxis(rand(*xs), 1, -1).astype(np.float64), rand(*ws).astype(np.float64)
        expected = "xla+phases" if jax.default_backend() == "cpu" else "xla"
        assert (
            conv_ops.conv_transpose_lowering(x.shape, w.shape, attrs["strides"], x.dtype, channels_last=True)
            == expected
        )

        @jax.jit  # eagerly, each piece of the lowering and its derivatives compiles on its own
        def f(x, w):
            return jonnx.ops.call("ConvTranspose", x, w, domain=DOMAIN, **attrs)

        check_grads(f, (x, w), order=2, modes=("fwd", "rev"), atol=1e-4, rtol=1e-4)
        check_grads(lambda v: f(v, w), (x,), order=1, modes=("fwd", "rev"), atol=1e-4, rtol=1e-4)
        check_grads(lambda v: f(x, v), (w,), order=1, modes=("fwd", "rev"), atol=1e-4, rtol=1e-4)


def test_conv_transpose_lowering_choice():
    cpu = jax.default_backend() == "cpu"
    f32 = np.dtype(np.float32)
    assert conv_ops.conv_transpose_lowering((1, 8, 9, 9), (8, 4, 3, 3), (2, 2), f32) == ("phases" if cpu else "xla")
    assert conv_ops.conv_transpose_lowering((1, 9, 9, 8), (8, 4, 3, 3), (2, 2), f32, channels_last=True) == (
        "xla+phases" if cpu else "xla"
    )
    assert conv_ops.conv_transpose_lowering((1, 8, 9, 9), (8, 4, 3, 3), (1, 1), f32) == "xla"  # an ordinary convolution
    assert conv_ops.conv_transpose_lowering((1, 8, 9, 9), (8, 4, 7, 7), (2, 2), f32) == "xla"  # 49 taps: 12x the output
    assert conv_ops.conv_transpose_lowering((1, 8, 9, 9), (8, 4, 3, 3), (2, 2), np.dtype(np.float16)) == "xla"


def test_half_precision_stays_with_xla():
    assert conv_ops.conv_lowering((1, 4, 8, 8), (4, 4, 3, 3), (1, 1), 1, np.dtype(np.float16)) == "xla"


def test_opaque_window_is_a_slice_with_the_slices_derivatives():
    # The depthwise lowering cuts its unstrided windows at offsets XLA cannot see (so that it
    # does not recompute a padded input's producer for the centre tap); values and every
    # derivative must be the plain slice's.
    x = RNG.standard_normal((2, 6, 7, 3)).astype(np.float32)
    start, limit = (0, 1, 2, 0), (2, 5, 7, 3)

    def opaque(v):
        return _window.opaque_window(v, start, limit)

    def plain(v):
        return jax.lax.slice(v, start, limit)

    np.testing.assert_array_equal(jax.jit(opaque)(x), plain(x))
    cotangent = RNG.standard_normal((2, 4, 5, 3)).astype(np.float32)
    (pullback,) = jax.vjp(opaque, x)[1](cotangent)
    np.testing.assert_array_equal(pullback, jax.vjp(plain, x)[1](cotangent)[0])
    np.testing.assert_array_equal(jax.jvp(opaque, (x,), (2 * x,))[1], plain(2 * x))
    np.testing.assert_array_equal(jax.vmap(opaque)(np.stack([x, -x])), np.stack([plain(x), plain(-x)]))


@pytest.mark.parametrize(
    "spatial,kernel,strides,dilations",
    [((9,), (3,), (2,), (2,)), ((7, 8), (3, 2), (1, 2), (2, 1)), ((5, 6, 7), (2, 3, 2), (2, 1, 3), (1, 2, 1))],
    ids=["1d", "2d", "3d"],
)
@pytest.mark.parametrize("channels_last", [False, True])
def test_stacked_windows_are_every_kernel_positions_window(spatial, kernel, strides, dilations, channels_last):
    # geo.stacked_windows (the 8-bit products' columns) against numpy's sliding windows: every
    # kernel position's strided window, positions row-major, where the layout puts them.
    rank = len(spatial)
    x = RNG.standard_normal((2, *spatial, 3) if channels_last else (2, 3, *spatial)).astype(np.float32)
    first = 1 if channels_last else 2
    reach = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    out = tuple((n - r) // s + 1 for n, r, s in zip(spatial, reach, strides))
    axes = tuple(range(first, first + rank))
    view = np.lib.stride_tricks.sliding_window_view(x, reach, axis=axes)  # (..., *spatial', *reach)
    view = view[(slice(None),) * first + tuple(slice(None, None, s) for s in strides)]
    view = view[(Ellipsis, *(slice(None, None, d) for d in dilations))]  # (..., *out, *kernel)
    if channels_last:  # (N, *out, C, *kernel) -> (N, *out, *kernel, C)
        want = np.moveaxis(view, 1 + rank, -1)
        at = 1 + rank
    else:  # (N, C, *out, *kernel) -> (N, C, *kernel, *out)
        want = np.moveaxis(view, tuple(range(2 + rank, 2 + 2 * rank)), tuple(range(2, 2 + rank)))
        at = 2
    got = _window.stacked_windows(x, kernel, strides, dilations, out, channels_last, at=at)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 13])
def test_spread_product_is_a_broadcast_product(n):
    # spread / spread_product build a broadcast from doubling concatenations so that their
    # transpose is a tree of halves: values and derivatives must be the plain broadcast's.
    with jax.enable_x64(True):
        a = RNG.standard_normal((n, 3, 4))
        v = RNG.standard_normal((1, 3, 1))
        ct = RNG.standard_normal((n, 3, 4))
        np.testing.assert_array_equal(spread(v, (n, 3, 4)), np.broadcast_to(v, (n, 3, 4)))
        np.testing.assert_array_equal(spread_product(a, v), a * v)
        got = jax.vjp(spread_product, a, v)[1](ct)
        want = jax.vjp(lambda a, v: a * v, a, v)[1](ct)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-12)
        np.testing.assert_allclose(jax.jvp(spread_product, (a, v), (ct, v))[1], ct * v + a * v, rtol=1e-12)
        batched = jax.vmap(spread_product)(np.stack([a, -a]), np.stack([v, 2 * v]))
        np.testing.assert_allclose(batched, np.stack([a * v, -2 * a * v]), rtol=1e-12)
        check_grads(spread_product, (a, v), order=2, modes=("fwd", "rev"))


@pytest.mark.parametrize("n", range(1, 10))
def test_tree_sum_adds_every_term_once(n):
    """The taps' balanced sum, odd counts included: powers of two, so any term dropped or
    added twice shows in the exact float total."""
    terms = [jnp.float32(2.0**i) for i in range(n)]
    assert float(_window.tree_sum(terms)) == 2.0**n - 1

"""Resize, Upsample, GridSample, AffineGrid, RoiAlign and MaxRoiPool against the
ReferenceEvaluator, onnxruntime (where the reference lacks or misreads an opset) and numpy."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import onnxruntime as ort
import pytest
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
# The ReferenceEvaluator interpolates in float64 and rounds once; jonnx works in float32.
TOL = {"rtol": 1e-4, "atol": 1e-5}


def _x(shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


# ------------------------------------------------------------------------------- Resize 11+

SCALES = {"up": [1.0, 1.0, 2.0, 1.5], "down": [1.0, 1.0, 0.6, 0.8], "mixed": [1.0, 1.0, 1.7, 0.45]}


_CASES = [
    (opset, mode, ctm, which)
    for i, (mode, ctm) in enumerate(
        (m, c)
        for m in ("nearest", "linear", "cubic")
        for c in ("half_pixel", "align_corners", "asymmetric", "pytorch_half_pixel")
    )
    for opset, which in [((11, 13, 18, 19)[i % 4], ("up", "down", "mixed")[i % 3])]
]


@pytest.mark.parametrize("opset,mode,ctm,which", _CASES)
def test_resize_scales(opset, mode, ctm, which):
    x = _x((1, 2, 5, 7))
    scales = np.array(SCALES[which], np.float32)
    assert_matches_reference(
        "Resize",
        {"x": x, "roi": np.array([], np.float32), "scales": scales},
        opset=opset,
        initializers=("roi", "scales"),
        mode=mode,
        coordinate_transformation_mode=ctm,
        **TOL,
    )


@pytest.mark.parametrize(
    "nearest_mode,sizes",
    [
        ("round_prefer_floor", [1, 1, 9, 4]),
        ("round_prefer_ceil", [2, 3, 3, 11]),
        ("floor", [1, 1, 9, 4]),
        ("ceil", [2, 3, 3, 11]),
    ],
)
def test_resize_sizes_nearest_modes(nearest_mode, sizes):
    x = _x((2, 3, 5, 6))
    assert_matches_reference(
        "Resize",
        {"x": x, "roi": None, "scales": None, "sizes": np.array(sizes, np.int64)},
        opset=13,
        initializers=("sizes",),
        mode="nearest",
        nearest_mode=nearest_mode,
        coordinate_transformation_mode="half_pixel",
    )


@pytest.mark.parametrize(
    "mode,sizes,ctm",
    [
        ("linear", [1, 1, 3, 2], "half_pixel"),
        ("cubic", [1, 1, 3, 2], "half_pixel_symmetric"),
        ("linear", [1, 1, 8, 4], "half_pixel_symmetric"),
        ("cubic", [1, 1, 4, 9], "align_corners"),
    ],
)
def test_resize_antialias_sizes(mode, sizes, ctm):
    x = _x((1, 1, 9, 7))
    assert_matches_reference(
        "Resize",
        {"x": x, "roi": None, "scales": None, "sizes": np.array(sizes, np.int64)},
        opset=19,
        initializers=("sizes",),
        mode=mode,
        antialias=1,
        coordinate_transformation_mode=ctm,
        **TOL,
    )


# a=0.0 is a valid kernel (it was replaced by the default -0.75: `x or default`).
@pytest.mark.parametrize("a,exclude", [(-0.5, 1), (-0.6, 0), (0.0, 0), (0.0, 1)])
def test_resize_cubic_coeff_and_exclude_outside(a, exclude):
    x = _x((1, 1, 6, 6))
    assert_matches_reference(
        "Resize",
        {"x": x, "roi": None, "scales": np.array([1, 1, 0.7, 1.6], np.float32)},
        opset=18,
        initializers=("scales",),
        mode="cubic",
        cubic_coeff_a=a,
        exclude_outside=exclude,
        **TOL,
    )


@pytest.mark.parametrize(
    "policy,axes",
    [
        ("stretch", [2, 3]),
        ("not_larger", [3, 2]),
        ("not_smaller", [3, 1]),
    ],
)
def test_resize_axes_keep_aspect_ratio(policy, axes):
    x = _x((1, 3, 4, 6))
    assert_matches_reference(
        "Resize",
        {"x": x, "roi": None, "scales": None, "sizes": np.array([7, 5], np.int64)},
        opset=19,
        initializers=("sizes",),
        mode="linear",
        axes=axes,
        keep_aspect_ratio_policy=policy,
        **TOL,
    )


@pytest.mark.parametrize("policy", ["not_larger", "not_smaller"])
@pytest.mark.parametrize("ctm", ["half_pixel_symmetric", "align_corners"])
def test_resize_keep_aspect_ratio_reads_the_unrounded_lengths(policy, ctm):
    # sizes (5, 6) of a 3 x 4 map: not_smaller scales by 5/3, a width of 6.67 rounded to 7;
    # not_larger by 3/2, a height of 4.5 rounded to 5. These modes read 6.67 and 4.5, as when
    # scales are given (onnxruntime agrees for half_pixel_symmetric; for align_corners it
    # reads the rounded length, against the ReferenceEvaluator and the node suite's cases).
    inputs = {"x": _x((1, 2, 3, 4)), "roi": None, "scales": None, "sizes": np.array([5, 6], np.int64)}
    attrs = dict(mode="linear", axes=[2, 3], keep_aspect_ratio_policy=policy, coordinate_transformation_mode=ctm)
    assert_matches_reference("Resize", inputs, opset=19, initializers=("sizes",), **attrs, **TOL)
    if ctm == "half_pixel_symmetric":
        want = ort_expected("Resize", inputs, opset=19, initializers=("sizes",), **attrs)
        assert_matches_reference("Resize", inputs, opset=19, initializers=("sizes",), expected=want, **attrs, **TOL)


@pytest.mark.parametrize("rule", ["ceil", "floor", "round_prefer_floor", "round_prefer_ceil"])
def test_nearest_reads_exact_coordinates_exactly(rule):
    # sizes (6, 2) of a 5 x 4 map, not_larger: a scale of 1/2 and a height of 2.5 rounded to 3,
    # so half_pixel_symmetric's rows sit at 0, 2 and 4 exactly, the columns at 0.5 and 2.5. In
    # float64 the first row came out 1.1e-16, and ceil took row 1 (found by the fuzzer, seed
    # 161006 with --long; onnxruntime reads 0 there, but its float32 puts the second row below
    # 2, and floor takes row 1).
    x = _x((1, 1, 5, 4))
    inputs = {"x": x, "roi": None, "scales": None, "sizes": np.array([6, 2], np.int64)}
    attrs = dict(
        mode="nearest",
        axes=[2, 3],
        keep_aspect_ratio_policy="not_larger",
        nearest_mode=rule,
        coordinate_transformation_mode="half_pixel_symmetric",
    )
    cols = {"ceil": [1, 3], "floor": [0, 2], "round_prefer_floor": [0, 2], "round_prefer_ceil": [1, 3]}[rule]
    want = x[:, :, [0, 2, 4]][:, :, :, cols]
    model = node_model("Resize", inputs, opset=19, initializers=("sizes",), **attrs)
    np.testing.assert_array_equal(run_reference(model, inputs)[0], want)
    np.testing.assert_array_equal(run_jonnx(model, inputs)[0], want)


@pytest.mark.parametrize("ctm", ["half_pixel_symmetric", "align_corners", "half_pixel"])
@pytest.mark.parametrize("policy,sizes", [("stretch", [0, 3]), ("not_larger", [1, 1])])
def test_resize_to_an_empty_axis(ctm, policy, sizes):
    # not_larger: 1/5 of 2 rows is 0.4, which rounds to no rows at all. onnx 1.21's
    # ReferenceEvaluator divides by zero here, so onnxruntime is the reference, and where it
    # refuses a size of 0 (stretch), the empty array of the given sizes.
    inputs = {"x": _x((1, 1, 2, 5)), "roi": None, "scales": None, "sizes": np.array(sizes, np.int64)}
    attrs = dict(mode="linear", axes=[2, 3], keep_aspect_ratio_policy=policy, coordinate_transformation_mode=ctm)
    if policy == "stretch":
        want = [np.zeros((1, 1, *sizes), np.float32)]
    else:
        want = ort_expected("Resize", inputs, opset=19, initializers=("sizes",), **attrs)
    out = assert_matches_reference("Resize", inputs, opset=19, initializers=("sizes",), expected=want, **attrs)
    assert out[0].shape[2] == 0


@pytest.mark.parametrize("mode,extrapolation", [("nearest", 10.0), ("linear", 0.0)])
def test_resize_tf_crop_and_resize(mode, extrapolation):
    x = _x((1, 1, 5, 6))
    roi = np.array([0.1, -0.2, 0.9, 1.3], np.float32)
    assert_matches_reference(
        "Resize",
        {"x": x, "roi": roi, "scales": None, "sizes": np.array([4, 5], np.int64)},
        opset=19,
        initializers=("roi", "sizes"),
        mode=mode,
        axes=[2, 3],
        coordinate_transformation_mode="tf_crop_and_resize",
        extrapolation_value=extrapolation,
    )


def test_resize_negative_axes():
    x = _x((1, 3, 4, 6))
    inputs = {"x": x, "roi": None, "scales": None, "sizes": np.array([7, 5], np.int64)}
    # The ReferenceEvaluator cannot take negative axes: expect what it gives for axes [3, 1].
    want = run_reference(
        node_model("Resize", inputs, opset=19, initializers=("sizes",), mode="linear", axes=[3, 1]), inputs
    )
    assert_matches_reference(
        "Resize", inputs, opset=19, initializers=("sizes",), mode="linear", axes=[-1, -3], expected=want, **TOL
    )


def test_resize_tf_crop_and_resize_scales_output_size_uses_roi():
    # The changelog: output_dimension = floor(input_dimension * (roi_end - roi_start) * scale).
    # (The ReferenceEvaluator ignores the roi here.) roi [0, 0.5] of 8 at scale 1 keeps 4
    # samples at x = y * 0.5 * 7 / 3.
    x = np.arange(8, dtype=np.float32).reshape(1, 8)
    roi = np.array([0, 0, 1, 0.5], np.float32)
    pos = np.arange(4) * 0.5 * 7 / 3
    assert_matches_reference(
        "Resize",
        {"x": x, "roi": roi, "scales": np.array([1, 1], np.float32)},
        opset=13,
        initializers=("roi", "scales"),
        mode="linear",
        coordinate_transformation_mode="tf_crop_and_resize",
        expected=[pos.astype(np.float32)[None]],
    )


@pytest.mark.parametrize("dtype", [np.uint8, np.int32, np.float16, np.float64])
def test_resize_dtypes(dtype):
    x = (RNG.uniform(0, 200, (1, 1, 4, 5))).astype(dtype)
    rtol = 1e-3 if dtype == np.float16 else 1e-5
    for mode in ("nearest", "cubic") if dtype == np.uint8 else ("linear",):
        assert_matches_reference(
            "Resize",
            {"x": x, "roi": None, "scales": np.array([1, 1, 1.5, 0.8], np.float32)},
            opset=18,
            initializers=("scales",),
            mode=mode,
            rtol=rtol,
            atol=1 if dtype in (np.uint8, np.int32) else 1e-3,
        )


def test_resize_11_tf_half_pixel_for_nn():
    x = _x((1, 1, 4, 4))
    inputs = {"x": x, "roi": np.array([], np.float32), "scales": np.array([1, 1, 1.5, 0.5], np.float32)}
    attrs = dict(mode="nearest", coordinate_transformation_mode="tf_half_pixel_for_nn")
    init = ("roi", "scales")
    assert_matches_reference(
        "Resize",
        inputs,
        opset=11,
        initializers=init,
        expected=ort_expected("Resize", inputs, opset=11, initializers=init, **attrs),
        **attrs,
    )
    with pytest.raises(errors.NodeError, match="tf_half_pixel_for_nn"):
        run_jonnx(node_model("Resize", inputs, opset=13, initializers=init, **attrs), inputs)


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_resize_grads(mode):
    x = _x((1, 2, 4, 5))
    check_op_grads(
        "Resize",
        {"x": x, "roi": None, "scales": np.array([1, 1, 1.5, 0.6], np.float32)},
        opset=19,
        initializers=("scales",),
        mode=mode,
        antialias=1,
    )


def test_resize_errors():
    x = _x((1, 1, 4, 4))
    both = {
        "x": x,
        "roi": None,
        "scales": np.array([1, 1, 2, 2], np.float32),
        "sizes": np.array([1, 1, 8, 8], np.int64),
    }
    with pytest.raises(errors.NodeError, match="only one of"):
        run_jonnx(node_model("Resize", both, opset=13, initializers=("scales", "sizes")), both)
    bad = {"x": x, "roi": None, "scales": np.array([1, 1, 2, 2], np.float32)}
    with pytest.raises(errors.NodeError, match="mode"):
        run_jonnx(node_model("Resize", bad, opset=13, initializers=("scales",), mode="area"), bad)
    short = {"x": x, "roi": None, "scales": np.array([2, 2], np.float32)}
    with pytest.raises(errors.NodeError, match="scales has 2 values"):
        run_jonnx(node_model("Resize", short, opset=13, initializers=("scales",)), short)


# ------------------------------------------------------------------- Resize-10 and Upsample
# The ReferenceEvaluator treats these like Resize-11 (half_pixel) or only handles integer
# nearest scales; onnxruntime implements the legacy asymmetric mapping they use.


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("scales", [[1, 1, 2.0, 3.0], [1, 1, 1.5, 2.5], [1, 1, 0.6, 0.5]])
def test_resize_10(mode, scales):
    inputs = {"x": _x((1, 2, 4, 6)), "scales": np.array(scales, np.float32)}
    assert_matches_reference(
        "Resize",
        inputs,
        opset=10,
        initializers=("scales",),
        mode=mode,
        expected=ort_expected("Resize", inputs, opset=10, initializers=("scales",), mode=mode),
    )


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("scales", [[1, 1, 2.0, 3.0], [1, 1, 1.5, 2.5]])
def test_upsample_9(mode, scales):
    inputs = {"x": _x((1, 2, 3, 4)), "scales": np.array(scales, np.float32)}
    assert_matches_reference(
        "Upsample",
        inputs,
        opset=9,
        initializers=("scales",),
        mode=mode,
        expected=ort_expected("Upsample", inputs, opset=9, initializers=("scales",), mode=mode),
    )


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_upsample_7(mode):
    inputs = {"x": _x((1, 2, 3, 4))}
    attrs = dict(mode=mode, scales=[1.0, 1.0, 2.0, 1.5])
    assert_matches_reference(
        "Upsample", inputs, opset=7, expected=ort_expected("Upsample", inputs, opset=7, **attrs), **attrs
    )


def test_upsample_1_nearest_changelog_example():
    data = np.array([[[[1, 2], [3, 4]]]], np.float32)
    expected = np.array([[[[1, 1, 2, 2], [1, 1, 2, 2], [3, 3, 4, 4], [3, 3, 4, 4]]]], np.float32)
    assert_matches_reference("Upsample", {"x": data}, opset=1, height_scale=2.0, width_scale=2.0, expected=[expected])


def test_upsample_rejects_downscale():
    inputs = {"x": _x((1, 1, 2, 2))}
    with pytest.raises(errors.NodeError, match=">= 1"):
        run_jonnx(node_model("Upsample", inputs, opset=7, scales=[1.0, 1.0, 0.5, 1.0]), inputs)


# -------------------------------------------------------------------------------- GridSample


def _grid(shape):
    return RNG.uniform(-1.3, 1.3, shape).astype(np.float32)


@pytest.mark.parametrize(
    "mode,padding,align",
    [
        ("linear", "zeros", 0),
        ("linear", "border", 1),
        ("linear", "reflection", 0),
        ("nearest", "zeros", 1),
        ("nearest", "border", 0),
        ("nearest", "reflection", 1),
        ("cubic", "zeros", 0),
        ("cubic", "border", 1),
        ("cubic", "reflection", 0),
        ("cubic", "reflection", 1),
    ],
)
def test_grid_sample_2d(mode, padding, align):
    x, grid = _x((2, 1, 4, 5)), _grid((2, 2, 3, 2))
    grid[0, 0] = [[-1, -1], [1, 1], [0.25, -0.75]]  # corners and half-way points
    expected = None
    if mode == "cubic" and padding != "zeros":
        # Cubic pads each of its taps and leaves the sample point where it is, as PyTorch's
        # grid_sample (checked against torch 2.13) and onnxruntime do; the onnx reference moves
        # a point past the border onto it first, which weighs the border taps differently.
        model = node_model("GridSample", {"x": x, "grid": grid}, opset=20, mode=mode, padding_mode=padding,
                           align_corners=align)  # fmt: skip
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        expected = session.run(None, {"x": x, "grid": grid})
    assert_matches_reference(
        "GridSample",
        {"x": x, "grid": grid},
        opset=20,
        expected=expected,
        mode=mode,
        padding_mode=padding,
        align_corners=align,
        rtol=1e-4,
        atol=1e-5,
    )
    old = {"linear": "bilinear", "nearest": "nearest", "cubic": "bicubic"}[mode]
    got16 = run_jonnx(
        node_model("GridSample", {"x": x, "grid": grid}, opset=16, mode=old, padding_mode=padding, align_corners=align),
        {"x": x, "grid": grid},
    )
    got20 = run_jonnx(
        node_model(
            "GridSample", {"x": x, "grid": grid}, opset=20, mode=mode, padding_mode=padding, align_corners=align
        ),
        {"x": x, "grid": grid},
    )
    np.testing.assert_array_equal(got16[0], got20[0])


@pytest.mark.parametrize("mode,padding", [("linear", "zeros"), ("nearest", "reflection"), ("linear", "border")])
def test_grid_sample_3d(mode, padding):
    x, grid = _x((1, 2, 3, 4, 5)), _grid((1, 2, 3, 2, 3))
    assert_matches_reference(
        "GridSample", {"x": x, "grid": grid}, opset=22, mode=mode, padding_mode=padding, rtol=1e-4, atol=1e-5
    )


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_grid_sample_grads(mode):
    x, grid = _x((1, 2, 4, 4)), RNG.uniform(-0.9, 0.9, (1, 3, 3, 2)).astype(np.float32)
    check_op_grads("GridSample", {"x": x, "grid": grid}, opset=20, mode=mode, wrt=["x"])


def test_grid_sample_16_rejects_5d():
    inputs = {"x": _x((1, 1, 2, 2, 2)), "grid": _grid((1, 1, 1, 1, 3))}
    with pytest.raises(errors.NodeError, match="4-D"):
        run_jonnx(node_model("GridSample", inputs, opset=16), inputs)


# -------------------------------------------------------------------------------- AffineGrid


@pytest.mark.parametrize(
    "size,align", [([2, 1, 3, 4], 0), ([2, 1, 3, 4], 1), ([1, 2, 2, 3, 4], 1), ([1, 2, 2, 3, 4], 0), ([1, 1, 1, 5], 0)]
)
def test_affine_grid(size, align):
    r = len(size) - 2
    theta = _x((size[0], r, r + 1))
    assert_matches_reference(
        "AffineGrid",
        {"theta": theta, "size": np.array(size, np.int64)},
        opset=20,
        initializers=("size",),
        align_corners=align,
    )
    check_op_grads(
        "AffineGrid",
        {"theta": theta, "size": np.array(size, np.int64)},
        opset=20,
        initializers=("size",),
        align_corners=align,
    )


# ------------------------------------------------------------------------ RoiAlign, MaxRoiPool

ROIS = np.array(
    [[0, 0, 9, 9], [0, 5, 4, 9], [5.5, 5.3, 9.9, 9.1], [-1, 1, 3, 9.5]], np.float32
)  # within the cap for traced rois


@pytest.mark.parametrize(
    "mode,ctm,ratio,static_rois",
    [
        ("avg", "half_pixel", 0, False),
        ("avg", "output_half_pixel", 2, False),
        ("avg", "half_pixel", 0, True),
        ("max", "half_pixel", 2, False),
        ("max", "output_half_pixel", 0, False),
        ("max", "half_pixel", 0, True),
    ],
)
def test_roi_align(mode, ctm, ratio, static_rois):
    x = _x((2, 1, 10, 10))
    inputs = {"x": x, "rois": ROIS, "batch_indices": np.array([0, 1, 0, 1], np.int64)}
    init = ("rois",) if static_rois else ()
    assert_matches_reference(
        "RoiAlign",
        inputs,
        opset=16,
        initializers=init,
        mode=mode,
        coordinate_transformation_mode=ctm,
        sampling_ratio=ratio,
        output_height=2,
        output_width=3,
        spatial_scale=0.9,
        rtol=1e-4,
        atol=1e-5,
    )


# Rois reaching past the feature map, and one spanning many times its size: their bins need
# more samples than a roi inside the map (the old cap for traced rois).
WIDE_ROIS = np.array([[-6, -4, 14, 16], [-30, -25, 40, 38], [2, 3, 25, 9], [0, 0, 9, 9]], np.float32)


@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("ctm", ["half_pixel", "output_half_pixel"])
def test_roi_align_adaptive_sampling_with_traced_rois(mode, ctm):
    # sampling_ratio=0 with rois traced: graph inputs here, params when float initializers.
    x = _x((2, 2, 10, 10))
    inputs = {"x": x, "rois": WIDE_ROIS, "batch_indices": np.array([0, 1, 0, 1], np.int64)}
    attrs = dict(
        mode=mode,
        coordinate_transformation_mode=ctm,
        sampling_ratio=0,
        output_height=3,
        output_width=2,
        spatial_scale=0.9,
    )
    want = run_reference(node_model("RoiAlign", inputs, opset=16, **attrs), inputs)
    assert_matches_reference("RoiAlign", inputs, opset=16, expected=want, rtol=1e-4, atol=1e-5, **attrs)
    # The same with rois as initializers of a model: params, traced under jit.
    model = node_model("RoiAlign", inputs, opset=16, initializers=("rois",), **attrs)
    m = jonnx.load(model)
    assert "rois" in m.params
    np.testing.assert_allclose(np.asarray(m(x, inputs["batch_indices"])[0]), want[0], rtol=1e-4, atol=1e-5)


def test_roi_align_adaptive_sampling_with_traced_rois_grads():
    # avg RoiAlign is linear in x: d sum(c * out) / dx[i] is sum(c * RoiAlign(e_i)), from the
    # ReferenceEvaluator on each basis image (cheaper than finite differences, and exact).
    x, rois, idx = _x((1, 1, 4, 4)), WIDE_ROIS[:2] * 0.5, np.zeros(2, np.int64)
    attrs = dict(sampling_ratio=0, output_height=2, output_width=1)
    model = node_model(
        "RoiAlign", {"x": x, "rois": rois, "batch_indices": idx}, opset=16, initializers=("rois",), **attrs
    )
    c = np.arange(1, 5, dtype=np.float32).reshape(2, 1, 2, 1)
    reference = ReferenceEvaluator(model)
    want = np.array(
        [
            (c * reference.run(None, {"x": e.reshape(x.shape), "batch_indices": idx})[0]).sum()
            for e in np.eye(x.size, dtype=np.float32)
        ]
    ).reshape(x.shape)
    m = jonnx.load(model)
    got = jax.jit(jax.grad(lambda x: jnp.sum(c * m.apply(m.params, x, idx)[0])))(x)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-5)


def test_roi_align_10_has_no_half_pixel_shift():
    # The ReferenceEvaluator needs the opset-16 attribute; onnxruntime implements opset 10.
    inputs = {"x": _x((1, 2, 8, 8)), "rois": ROIS[:3] * 0.8, "batch_indices": np.zeros(3, np.int64)}
    attrs = dict(output_height=2, output_width=3, sampling_ratio=2)
    assert_matches_reference(
        "RoiAlign",
        inputs,
        opset=10,
        expected=ort_expected("RoiAlign", inputs, opset=10, **attrs),
        rtol=1e-4,
        atol=1e-5,
        **attrs,
    )


def test_roi_align_grads():
    inputs = {"x": _x((1, 1, 6, 6)), "rois": ROIS[:2] * 0.6, "batch_indices": np.zeros(2, np.int64)}
    check_op_grads("RoiAlign", inputs, opset=22, wrt=["x"], output_height=2, output_width=2, sampling_ratio=2)


@pytest.mark.parametrize("seed", range(4))
def test_roi_align_max_grads_compiled(seed):
    # Max mode's derivative in x and in the region, compiled: a region reaching past the map's
    # right and bottom edges, where clamped samples repeat pixels (the fuzz's case; with the
    # max taken by value, XLA's differently rounded copies of the products gave NaN there).
    inputs = {
        "x": np.random.default_rng(seed).standard_normal((2, 2, 4, 6)),
        "rois": np.array([[1.856, 0.077, 11.217, 6.795]]),
        "batch_indices": np.array([1], np.int64),
    }
    attrs = dict(mode="max", output_height=3, output_width=3, sampling_ratio=3, spatial_scale=0.5)
    check_op_grads("RoiAlign", inputs, opset=21, wrt=["x", "rois"], eps=1e-6, **attrs)


@pytest.mark.parametrize("opset", [1, 22])
def test_max_roi_pool(opset):
    # No ReferenceEvaluator kernel; onnxruntime implements MaxRoiPool-1 (same semantics at 22).
    x = _x((2, 2, 8, 9))
    rois = np.array([[0, 0, 0, 7, 7], [1, 2.4, 1.6, 6, 5], [1, 3, 3, 3, 3], [0, -3, 2, 20, 30]], np.float32)
    attrs = dict(pooled_shape=[3, 2], spatial_scale=0.8)
    expected = ort_expected("MaxRoiPool", {"x": x, "rois": rois}, opset=1, **attrs)
    assert_matches_reference("MaxRoiPool", {"x": x, "rois": rois}, opset=opset, expected=expected, **attrs)
    check_op_grads("MaxRoiPool", {"x": x, "rois": rois}, opset=opset, wrt=["x"], **attrs)


@pytest.mark.parametrize("mode", ["avg", "max"])
def test_half_precision_roi_align_rounds_once(mode):
    # Sampled and averaged in float32, rounded once, as onnxruntime does: in float16 a fifth of
    # the fuzzed RoiAlign cases were a unit in the last place off it.
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 3, 12, 10)).astype(np.float16)
    rois = np.array([[0.5, 1.0, 6.5, 9.0], [2.0, 0.0, 9.0, 5.5], [1.0, 1.0, 3.0, 3.0]], np.float16)
    inputs = {"x": x, "rois": rois, "batch_indices": np.array([0, 1, 1], np.int64)}
    attrs = {"mode": mode, "output_height": 4, "output_width": 3, "sampling_ratio": 2, "spatial_scale": 0.75}
    (want,) = ort_expected("RoiAlign", inputs, opset=16, **attrs)
    (got,) = run_jonnx(node_model("RoiAlign", inputs, opset=16, **attrs), inputs)
    got = np.asarray(got)
    assert got.dtype == np.float16
    assert (got != want).mean() <= 0.02
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2e-3, atol=1e-4)


@pytest.mark.parametrize("align_corners", [0, 1])
def test_half_precision_affine_grid_rounds_once(align_corners):
    # Base positions, products and sums in float32, rounded once (as onnxruntime): with float16
    # base positions and products a third of the grid was a unit off.
    inputs = {"theta": RNG.standard_normal((2, 2, 3)), "size": np.array([2, 3, 16, 16], np.int64)}
    assert_half_rounds_once("AffineGrid", inputs, opset=20, align_corners=align_corners)

"""NonMaxSuppression and Det against the ReferenceEvaluator / numpy."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import jonnx
from jonnx import errors
from tests.ops._harness import assert_matches_reference, check_op_grads, node_model, run_jonnx

RNG = np.random.default_rng(0)


def _boxes(batches, n, center_point_box):
    """Random, heavily overlapping boxes; corner boxes come with corners in either order."""
    centers = RNG.uniform(0, 4, (batches, n, 2))
    sizes = RNG.uniform(0.5, 3, (batches, n, 2))
    if center_point_box:
        return np.concatenate([centers, sizes], -1).astype(np.float32)
    a, b = centers - sizes / 2, centers + sizes / 2
    flip = RNG.random((batches, n, 1)) < 0.3
    a, b = np.where(flip, b, a), np.where(flip, a, b)
    return np.stack([a[..., 1], a[..., 0], b[..., 1], b[..., 0]], -1).astype(np.float32)


@pytest.mark.parametrize("opset", [10, 11])
@pytest.mark.parametrize("center_point_box", [0, 1])
@pytest.mark.parametrize(
    "max_out,iou,score",
    [(3, 0.5, None), (100, 0.3, 0.4), (2, 0.0, 0.5), (10, 1.0, None), (0, 0.5, None)],
)
def test_nms_matches_reference(opset, center_point_box, max_out, iou, score):
    boxes = _boxes(2, 12, center_point_box)
    scores = RNG.random((2, 3, 12)).astype(np.float32)
    scores[0, 0, 5] = scores[0, 0, 7]  # a tie: the lower box index wins
    inputs = {
        "boxes": boxes,
        "scores": scores,
        "max_out": np.array([max_out], np.int64),
        "iou": np.array([iou], np.float32),
        "score": None if score is None else np.array([score], np.float32),
    }
    got = assert_matches_reference("NonMaxSuppression", inputs, opset=opset, center_point_box=center_point_box)
    assert got[0].shape[1] == 3


def test_nms_optional_inputs_absent_selects_nothing():
    inputs = {"boxes": _boxes(1, 4, 0), "scores": RNG.random((1, 1, 4)).astype(np.float32)}
    assert_matches_reference("NonMaxSuppression", inputs, opset=11, expected=[np.zeros((0, 3), np.int64)])


def test_nms_score_threshold_compares_in_float32():
    # float32(0.4) > 0.4 in float64: the threshold must be compared in the scores' precision.
    boxes = np.array([[[0, 0, 1, 1], [0, 5, 1, 6]]], np.float32)
    scores = np.array([[[0.4, 0.9]]], np.float32)
    inputs = {
        "boxes": boxes,
        "scores": scores,
        "max_out": np.array([5], np.int64),
        "iou": np.array([0.5], np.float32),
        "score": np.array([0.4], np.float32),
    }
    assert_matches_reference("NonMaxSuppression", inputs, opset=11, expected=[np.array([[0, 0, 1]], np.int64)])


def test_nms_traced_boxes_raise_static_value_error():
    boxes, scores = _boxes(1, 4, 0), RNG.random((1, 1, 4)).astype(np.float32)
    model = node_model("NonMaxSuppression", {"boxes": boxes, "scores": scores}, opset=11)
    m = jonnx.load(model)
    with pytest.raises(errors.StaticValueError, match="NonMaxSuppression"):
        jax.jit(lambda b: m.apply(m.params, b, scores))(boxes)


def test_nms_bad_shapes():
    inputs = {"boxes": np.zeros((1, 4, 4), np.float32), "scores": np.zeros((1, 2, 5), np.float32)}
    with pytest.raises(errors.NodeError, match="scores must have shape"):
        run_jonnx(node_model("NonMaxSuppression", inputs, opset=11), inputs)


@pytest.mark.parametrize("opset", [11, 22])
@pytest.mark.parametrize("shape", [(3, 3), (2, 4, 4), (2, 1, 2, 2), (1, 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_det_matches_reference(opset, shape, dtype):
    x = RNG.standard_normal(shape).astype(dtype)
    assert_matches_reference("Det", {"x": x}, opset=opset, rtol=1e-5, atol=1e-6)


def test_det_float16_keeps_dtype():
    x = RNG.standard_normal((2, 3, 3)).astype(np.float16)
    assert_matches_reference(
        "Det",
        {"x": x},
        opset=22,
        rtol=1e-2,
        atol=1e-2,
        expected=lambda x: [np.linalg.det(x.astype(np.float64)).astype(np.float16)],
    )


def test_det_gradients():
    check_op_grads("Det", {"x": RNG.standard_normal((2, 3, 3))}, opset=22)


def test_det_rejects_non_square():
    inputs = {"x": np.zeros((2, 3), np.float32)}
    with pytest.raises(errors.NodeError, match=r"\[\*, M, M\]"):
        run_jonnx(node_model("Det", inputs, opset=22), inputs)

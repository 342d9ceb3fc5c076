"""Detection and linear-algebra helpers: NonMaxSuppression and Det."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jonnx._registry import Attrs, Inputs, OpContext, Outputs, register
from jonnx.ops._util import index_dtype


def _scalar(value, default, cast):
    """An optional scalar input (absent or empty: ``default``) as a Python number."""
    if value is None or np.size(value) == 0:
        return default
    return cast(np.asarray(value).reshape(-1)[0])


def _corners(boxes: np.ndarray, center_point_box: int) -> np.ndarray:
    """``[..., 4]`` boxes as ``(y_min, x_min, y_max, x_max)``, in the boxes' dtype."""
    if center_point_box == 0:
        y = np.sort(boxes[..., 0::2], axis=-1)  # corners may come in either order
        x = np.sort(boxes[..., 1::2], axis=-1)
        return np.stack([y[..., 0], x[..., 0], y[..., 1], x[..., 1]], axis=-1)
    two = boxes.dtype.type(2)
    xc, yc, w, h = boxes[..., 0], boxes[..., 1], boxes[..., 2], boxes[..., 3]
    return np.stack([yc - h / two, xc - w / two, yc + h / two, xc + w / two], axis=-1)


def _suppressed(box: np.ndarray, kept: np.ndarray, iou_threshold) -> np.ndarray:
    """Whether ``box`` overlaps each of ``kept`` by an IoU above the threshold.

    Boxes that do not intersect, or have no area, never suppress (as onnxruntime does).
    """
    iy0 = np.maximum(box[0], kept[:, 0])
    ix0 = np.maximum(box[1], kept[:, 1])
    iy1 = np.minimum(box[2], kept[:, 2])
    ix1 = np.minimum(box[3], kept[:, 3])
    overlaps = (iy1 > iy0) & (ix1 > ix0)
    inter = np.where(overlaps, (iy1 - iy0) * (ix1 - ix0), 0)
    area = (box[2] - box[0]) * (box[3] - box[1])
    areas = (kept[:, 2] - kept[:, 0]) * (kept[:, 3] - kept[:, 1])
    union = area + areas - inter
    valid = overlaps & (inter > 0) & (area > 0) & (areas > 0) & (union > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        iou = inter / np.where(valid, union, 1)
    return valid & (iou > iou_threshold)


@register("NonMaxSuppression", since=(10, 11), static_inputs=(0, 1, 2, 3, 4), host=True)
def non_max_suppression(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``NonMaxSuppression``, opsets 10+.

    The output's length depends on the box values, so every input is static: the op runs in
    numpy at trace time. Boxes or scores computed from traced data (under ``jax.jit`` or
    ``jax.grad``) raise :class:`jonnx.errors.StaticValueError`; feed them as concrete arrays
    (``Model.__call__`` treats them as static arguments) or run the model eagerly.
    """
    boxes, scores, max_out, iou_threshold, score_threshold = inputs
    boxes, scores = np.asarray(boxes), np.asarray(scores)
    if boxes.ndim != 3 or boxes.shape[2] != 4:
        raise ctx.error(f"boxes must have shape [num_batches, num_boxes, 4], got {boxes.shape}")
    if scores.ndim != 3 or scores.shape[0] != boxes.shape[0] or scores.shape[2] != boxes.shape[1]:
        raise ctx.error(
            f"scores must have shape [num_batches, num_classes, num_boxes] = "
            f"[{boxes.shape[0]}, C, {boxes.shape[1]}], got {scores.shape}"
        )
    center_point_box = attrs["center_point_box"]
    if center_point_box not in (0, 1):
        raise ctx.error(f"center_point_box must be 0 or 1, got {center_point_box}")
    max_out = min(max(_scalar(max_out, 0, int), 0), boxes.shape[1])
    iou_threshold = _scalar(iou_threshold, 0.0, float)
    if not 0.0 <= iou_threshold <= 1.0:
        raise ctx.error(f"iou_threshold must lie in [0, 1], got {iou_threshold}")
    # Compare in the inputs' own precision: float32(0.4) > 0.4 in float64.
    score_threshold = _scalar(score_threshold, None, scores.dtype.type)
    corners = _corners(boxes, center_point_box)
    iou_threshold = boxes.dtype.type(iou_threshold)

    selected = []
    for b in range(scores.shape[0] if max_out else 0):
        for c in range(scores.shape[1]):
            class_scores = scores[b, c]
            # Highest score first; ties keep the lower box index first (stable sort).
            order = np.argsort(-class_scores, kind="stable")
            if score_threshold is not None:
                order = order[class_scores[order] > score_threshold]
            kept: list[int] = []
            for i in order:
                if len(kept) == max_out:
                    break
                box = corners[b, i]
                if not kept or not _suppressed(box, corners[b, kept], iou_threshold).any():
                    kept.append(int(i))
            selected.extend((b, c, i) for i in kept)
    return (np.asarray(selected, dtype=index_dtype()).reshape(-1, 3),)


@register("Det", since=(11, 22))
def det(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Det``, opsets 11+: determinants of ``[*, M, M]`` matrices.

    float16/bfloat16 inputs are factorized in float32 (XLA's LU has no half-precision
    kernel) and the result is cast back.
    """
    (x,) = inputs
    shape = jnp.shape(x)
    if len(shape) < 2 or shape[-1] != shape[-2]:
        raise ctx.error(f"input must have shape [*, M, M], got {shape}")
    dtype = jnp.result_type(x)
    if jnp.finfo(dtype).bits < 32:
        return (jnp.linalg.det(jnp.asarray(x, jnp.float32)).astype(dtype),)
    return (jnp.linalg.det(x),)


def non_max_suppression_bounded(inputs, attrs, ctx, max_rows: int | None = None):
    """``NonMaxSuppression`` with a static output size, for one XLA computation (TPU, export).

    Runs on traced boxes and scores (``jonnx.load(..., size_bounds=...)``). The output has
    ``max_rows`` rows (default: batches x classes x ``max_output_boxes_per_class``): the
    selected ``[batch, class, box]`` triples first, in ONNX's order, then rows of -1. The
    number of valid rows is ``(selected[:, 0] >= 0).sum()``. ``max_output_boxes_per_class``
    must be known at trace time; the thresholds may be traced.
    """
    boxes, scores, max_out, iou_threshold, score_threshold = inputs
    boxes, scores = jnp.asarray(boxes), jnp.asarray(scores)
    if boxes.ndim != 3 or boxes.shape[2] != 4 or scores.ndim != 3 or scores.shape[2] != boxes.shape[1]:
        raise ctx.error(f"boxes {boxes.shape} and scores {scores.shape} do not match ONNX's layout")
    n_batches, n_classes, n_boxes = scores.shape
    per_class = min(max(_scalar(max_out, 0, int), 0), n_boxes)
    dtype = scores.dtype
    iou = jnp.asarray(
        0.0 if iou_threshold is None or np.size(iou_threshold) == 0 else jnp.reshape(iou_threshold, (-1,))[0], dtype
    )
    if attrs["center_point_box"] == 0:
        y = jnp.sort(boxes[..., 0::2], axis=-1)
        x = jnp.sort(boxes[..., 1::2], axis=-1)
        corners = jnp.stack([y[..., 0], x[..., 0], y[..., 1], x[..., 1]], axis=-1)
    else:
        xc, yc, w, h = (boxes[..., i] for i in range(4))
        corners = jnp.stack([yc - h / 2, xc - w / 2, yc + h / 2, xc + w / 2], axis=-1)
    areas = (corners[..., 2] - corners[..., 0]) * (corners[..., 3] - corners[..., 1])

    def select(box_set, area_set, class_scores):  # [N, 4], [N], [N] -> [per_class] box indices
        alive = jnp.ones(n_boxes, bool)
        if score_threshold is not None and np.size(score_threshold):
            alive = class_scores > jnp.reshape(score_threshold, (-1,))[0].astype(dtype)

        def step(i, state):
            alive, picked = state
            j = jnp.argmax(jnp.where(alive, class_scores, -jnp.inf))  # ties: the lowest index
            ok = alive[j]
            box = box_set[j]
            iy0 = jnp.maximum(box[0], box_set[:, 0])
            ix0 = jnp.maximum(box[1], box_set[:, 1])
            iy1 = jnp.minimum(box[2], box_set[:, 2])
            ix1 = jnp.minimum(box[3], box_set[:, 3])
            overlaps = (iy1 > iy0) & (ix1 > ix0)
            inter = jnp.where(overlaps, (iy1 - iy0) * (ix1 - ix0), 0)
            union = area_set[j] + area_set - inter
            valid = overlaps & (inter > 0) & (area_set[j] > 0) & (area_set > 0) & (union > 0)
            suppressed = valid & (inter / jnp.where(valid, union, 1) > iou)
            keep_alive = alive & ~suppressed & (jnp.arange(n_boxes) != j)
            return jnp.where(ok, keep_alive, alive), picked.at[i].set(jnp.where(ok, j, -1))

        picked = jnp.full(per_class, -1, jnp.int32)
        return jax.lax.fori_loop(0, per_class, step, (alive, picked))[1]

    per_batch = jax.vmap(select, in_axes=(None, None, 0))  # over classes
    picked = jax.vmap(per_batch)(corners, areas, scores)  # [B, C, per_class]
    b = jnp.broadcast_to(jnp.arange(n_batches)[:, None, None], picked.shape)
    c = jnp.broadcast_to(jnp.arange(n_classes)[None, :, None], picked.shape)
    rows = jnp.stack([b, c, picked], axis=-1).reshape(-1, 3)
    valid = rows[:, 2] >= 0
    rows = jnp.where(valid[:, None], rows, -1)
    # Valid rows first, in ONNX's (batch, class, selection) order: a stable sort on validity.
    rows = rows[jnp.argsort(~valid, stable=True)]
    if max_rows is not None:
        rows = (
            rows[:max_rows]
            if max_rows <= rows.shape[0]
            else jnp.pad(rows, ((0, max_rows - rows.shape[0]), (0, 0)), constant_values=-1)
        )
    return (rows.astype(index_dtype()),)

"""Resizing and spatial sampling: Resize, Upsample, GridSample, AffineGrid, RoiAlign, MaxRoiPool.

Resize and Upsample are separable: for every resized axis the source taps and their weights
are computed statically in numpy (output sizes, scales, roi and the mode are all known at
trace time) and applied with one gather and a weighted sum per axis. That is exact in the
input's precision (no TF32 matmul), cheap for large images, and differentiable w.r.t. X.
Tap placement follows the ONNX reference implementation, which generated the conformance
data: for ``align_corners``/``tf_crop_and_resize`` given ``scales``, ``length_resized`` is
the fractional ``scale * length_original``.

GridSample, RoiAlign and MaxRoiPool take their sampling positions from runtime tensors, so
their taps are computed with jnp and gathered per sample.
"""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jonnx._registry import Attrs, Inputs, OpContext, Outputs, register
from jonnx.ops._util import compute_type, normalize_axes, static_ints, widen_halves
from jonnx.ops.reduce import reduce_max

_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
_CTM_13 = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_crop_and_resize")


def _str(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _given(value, absent):
    """An attribute's value, or ``absent`` for versions whose schema does not have it."""
    return absent if value is None else value


# --------------------------------------------------------------------------------------------
# Resize / Upsample: static per-axis taps
# --------------------------------------------------------------------------------------------


def _source_coords(y, ctm, scale, in_len, out_len, out_float, roi):
    """x_original for output positions ``y`` (float64), per coordinate_transformation_mode."""
    if ctm == "half_pixel":
        return (y + 0.5) / scale - 0.5
    if ctm == "half_pixel_symmetric":
        adjustment = out_len / out_float
        offset = in_len / 2 * (1 - adjustment)
        return offset + (y + 0.5) / scale - 0.5
    if ctm == "pytorch_half_pixel":
        return (y + 0.5) / scale - 0.5 if out_len > 1 else np.zeros_like(y)
    if ctm == "align_corners":
        return np.zeros_like(y) if out_float == 1 else y * (in_len - 1) / (out_float - 1)
    if ctm == "asymmetric":
        return y / scale
    if ctm == "tf_half_pixel_for_nn":
        return (y + 0.5) / scale
    if ctm == "tf_crop_and_resize":
        start, end = roi
        if out_float == 1:
            x = np.full_like(y, (end - start) * (in_len - 1) / 2)
        else:
            x = y * (end - start) * (in_len - 1) / (out_float - 1)
        return x + start * (in_len - 1)
    raise AssertionError(ctm)


def _cubic_kernel(t, a):
    t = np.abs(t)
    near = ((a + 2) * t - (a + 3)) * t * t + 1
    far = ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
    return np.where(t <= 1, near, np.where(t < 2, far, 0.0))


def _snapped(x):
    """``x`` with the values within float64 rounding of a multiple of 1/2 set to it: nearest's
    floor, ceil and ties read those points, where the coordinate formulas' own roundings (about
    1e-16) must not carry a value across (half_pixel_symmetric to a fractional target length put
    an exact 0 at 1.1e-16, and ceil took the next row; onnxruntime and the reference the first).
    Coordinates from float32 scales and integer lengths that are not such points lie much
    further from them than the 1e-9 (relative) allowed here."""
    halves = np.round(x * 2) / 2
    return np.where(np.abs(x - halves) <= 1e-9 * np.maximum(1.0, np.abs(x)), halves, x)


def _axis_taps(in_len, out_len, scale, out_float, roi, opt):
    """Static ``(indices (out, K), weights (out, K) or None, extrapolated (out,) or None)``."""
    y = np.arange(out_len, dtype=np.float64)
    x = _source_coords(y, opt["ctm"], scale, in_len, out_len, out_float, roi)
    outside = None
    if opt["ctm"] == "tf_crop_and_resize":
        outside = (x < 0) | (x > in_len - 1)
        outside = outside if outside.any() else None
    mode = opt["mode"]
    if mode == "nearest":
        x = _snapped(x)
        rule = opt["nearest_mode"]
        if rule == "legacy":
            # Resize-10 / Upsample (what onnxruntime does for them): truncate when upsampling,
            # ceil when downsampling.
            idx = np.ceil(x) if scale < 1 else np.trunc(x)
        elif rule == "round_prefer_floor":
            idx = np.ceil(x - 0.5)
        elif rule == "round_prefer_ceil":
            idx = np.floor(x + 0.5)
        elif rule == "floor":
            idx = np.floor(x)
        else:
            idx = np.ceil(x)
        return np.clip(idx, 0, in_len - 1).astype(np.int32)[:, None], None, outside
    support = 1.0 if mode == "linear" else 2.0
    s = min(scale, 1.0) if opt["antialias"] else 1.0
    radius = support / s
    offsets = np.arange(math.floor(-radius), math.ceil(radius) + 2)
    base = np.floor(x)
    taps = base[:, None] + offsets[None, :]
    t = (taps - x[:, None]) * s
    w = np.maximum(1 - np.abs(t), 0.0) if mode == "linear" else _cubic_kernel(t, opt["cubic_coeff_a"])
    if opt["antialias"]:
        w = w / w.sum(axis=1, keepdims=True)
    if opt["exclude_outside"]:
        w = np.where((taps < 0) | (taps >= in_len), 0.0, w)
        total = w.sum(axis=1, keepdims=True)
        w = w / np.where(total == 0, 1.0, total)
    keep = np.abs(w).sum(axis=0) > 0  # drop tap columns that are zero everywhere
    taps, w = taps[:, keep], w[:, keep]
    return np.clip(taps, 0, in_len - 1).astype(np.int32), w, outside


def _cast_back(y, dtype):
    """Float result to the input dtype: integers round half to even and saturate."""
    if jnp.issubdtype(dtype, jnp.floating):
        return y.astype(dtype)
    if dtype == np.bool_:
        return jnp.round(y) != 0
    info = jnp.iinfo(dtype)
    return jnp.clip(jnp.round(y), info.min, info.max).astype(dtype)


def _apply_axis(x, axis, idx, w, outside, extrapolation):
    out_len, k = idx.shape
    shape = x.shape
    g = jnp.take(x, jnp.asarray(idx.reshape(-1)), axis=axis, mode="clip")
    if w is None:
        y = g
    else:
        g = g.reshape(shape[:axis] + (out_len, k) + shape[axis + 1 :])
        wb = jnp.asarray(w.reshape((out_len, k) + (1,) * (x.ndim - axis - 1)), g.dtype)
        y = jnp.sum(g * wb, axis=axis + 1)
    if outside is not None:
        mask = jnp.asarray(outside.reshape((out_len,) + (1,) * (x.ndim - axis - 1)))
        y = jnp.where(mask, jnp.asarray(extrapolation, y.dtype), y)
    return y


def _resize(x, scales, sizes, roi, axes, opt, ctx):
    """Shared Resize/Upsample body. ``scales``/``sizes``/``roi`` refer to ``axes`` (or None)."""
    rank = jnp.ndim(x)
    axes = tuple(range(rank)) if axes is None else normalize_axes(axes, rank, ctx)
    n = len(axes)
    in_shape = jnp.shape(x)
    if opt["mode"] not in ("nearest", "linear", "cubic"):
        raise ctx.error(f"unsupported mode {opt['mode']!r} (nearest, linear or cubic)")
    if opt["mode"] == "nearest" and opt["nearest_mode"] not in (*_NEAREST_MODES, "legacy"):
        raise ctx.error(f"unsupported nearest_mode {opt['nearest_mode']!r}")
    if roi is not None and roi.size:
        roi = np.asarray(roi, np.float64).reshape(-1)
        if roi.size != 2 * n:
            raise ctx.error(f"roi has {roi.size} values; expected 2 * {n} (starts then ends)")
        rois = [(float(roi[i]), float(roi[n + i])) for i in range(n)]
    else:
        rois = [(0.0, 1.0)] * n
    crop = opt["ctm"] == "tf_crop_and_resize"
    if scales is not None and scales.size and sizes is not None and sizes.size:
        raise ctx.error("only one of 'scales' and 'sizes' may be given")
    if scales is not None and scales.size:
        scale_list = [float(s) for s in np.asarray(scales, np.float32).reshape(-1)]
        if len(scale_list) != n:
            raise ctx.error(f"scales has {len(scale_list)} values for {n} resized axes")
        if any(not s > 0 for s in scale_list):
            raise ctx.error(f"scales must be positive, got {scale_list}")
        # output_dimension = floor(input_dimension * (roi_end - roi_start) * scale); roi only
        # counts for tf_crop_and_resize, the one mode that reads it.
        out_float = [in_shape[a] * ((r[1] - r[0]) if crop else 1.0) * s for a, r, s in zip(axes, rois, scale_list)]
        out_len = [int(math.floor(f)) for f in out_float]
    elif sizes is not None and sizes.size:
        size_list = static_ints(sizes)
        if len(size_list) != n:
            raise ctx.error(f"sizes has {len(size_list)} values for {n} resized axes")
        if any(s < 0 for s in size_list):
            raise ctx.error(f"sizes must be non-negative, got {size_list}")
        ratios = [s / in_shape[a] if in_shape[a] else 1.0 for a, s in zip(axes, size_list)]
        policy = opt["keep_aspect_ratio_policy"]
        if policy == "stretch":
            scale_list, out_len = ratios, list(size_list)
            out_float = [float(o) for o in out_len]
        elif policy in ("not_larger", "not_smaller"):
            common = min(ratios) if policy == "not_larger" else max(ratios)
            scale_list = [common] * n
            # The target lengths are fractional here, as when scales are given: the modes that
            # read them (half_pixel_symmetric, align_corners) take them unrounded.
            out_float = [common * in_shape[a] for a in axes]
            out_len = [int(f + 0.5) for f in out_float]  # round half up
        else:
            raise ctx.error(f"unsupported keep_aspect_ratio_policy {policy!r}")
    else:
        raise ctx.error("needs non-empty 'scales' or 'sizes'")

    float_mode = opt["mode"] != "nearest"
    dtype = np.dtype(jnp.result_type(x))
    y = jnp.asarray(x)
    if float_mode:
        y = y.astype(compute_type(dtype))
    for a, s, o, f, r in zip(axes, scale_list, out_len, out_float, rois):
        if s == 1.0 and o == in_shape[a] and (not crop or r == (0.0, 1.0)):
            continue
        if o == 0:  # no positions to sample
            y = jnp.zeros(jnp.shape(y)[:a] + (0,) + jnp.shape(y)[a + 1 :], y.dtype)
            continue
        if in_shape[a] == 0:
            raise ctx.error(f"cannot resize axis {a} of length 0 to {o}")
        idx, w, outside = _axis_taps(in_shape[a], o, s, f, r, opt)
        extrapolation = opt["extrapolation_value"]
        if not float_mode and outside is not None and not np.issubdtype(dtype, np.floating):
            extrapolation = np.round(extrapolation)
            if dtype != np.bool_:
                info = np.iinfo(dtype)
                extrapolation = np.clip(extrapolation, info.min, info.max)
        y = _apply_axis(y, a, idx, w, outside, extrapolation)
    return (_cast_back(y, dtype) if float_mode else y,)


def _options(attrs, ctx, ctms, *, ctm=None, nearest_mode=None):
    opt = {
        "mode": _str(attrs["mode"]),
        "ctm": ctm or _str(attrs["coordinate_transformation_mode"]),
        "nearest_mode": nearest_mode or _str(attrs["nearest_mode"]),
        # Upsample and Resize-10 lack the later attributes (and cubic mode): None there. An
        # explicit 0.0 is a value (cubic_coeff_a=0 is a valid kernel), so no `x or default`.
        "cubic_coeff_a": _given(attrs.get("cubic_coeff_a"), -0.75),
        "exclude_outside": bool(attrs.get("exclude_outside")),
        "extrapolation_value": _given(attrs.get("extrapolation_value"), 0.0),
        "antialias": bool(attrs.get("antialias")),
        "keep_aspect_ratio_policy": _str(_given(attrs.get("keep_aspect_ratio_policy"), "stretch")),
    }
    if opt["ctm"] not in ctms:
        raise ctx.error(f"unsupported coordinate_transformation_mode {opt['ctm']!r} (one of {ctms})")
    return opt


def _legacy_options(mode, ctx):
    mode = _str(mode)
    if mode == "bilinear":  # Upsample-1's name, also written by some old opset-7 exporters
        mode = "linear"
    if mode not in ("nearest", "linear"):
        raise ctx.error(f"unsupported mode {mode!r} (nearest or linear)")
    opt = {
        "mode": mode,
        "ctm": "asymmetric",
        "nearest_mode": "legacy",
        "cubic_coeff_a": -0.75,
        "exclude_outside": False,
        "extrapolation_value": 0.0,
        "antialias": False,
        "keep_aspect_ratio_policy": "stretch",
    }
    return opt


@register("Resize", since=10, static_inputs=(1,))
def resize_10(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Resize``, opset 10: ``scales`` only, asymmetric coordinates.

    The changelog leaves opset 10's coordinate mapping unstated; like onnxruntime, jonnx uses
    ``x_original = x_resized / scale`` and, for nearest, truncation when upsampling and ceil
    when downsampling.
    """
    x, scales = inputs
    return _resize(x, scales, None, None, None, _legacy_options(attrs["mode"], ctx), ctx)


def _resize_with_modes(ctms):
    def resize(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
        x, roi, scales, sizes = inputs
        opt = _options(attrs, ctx, ctms)
        axes = attrs.get("axes")
        return _resize(x, scales, sizes, roi, None if axes is None else list(axes), opt, ctx)

    resize.__doc__ = (
        "ONNX ``Resize``, opsets 11+: static roi/scales/sizes; antialias, axes and "
        f"keep_aspect_ratio_policy from 18; coordinate modes {ctms}."
    )
    return resize


register("Resize", since=11, static_inputs=(1, 2, 3))(_resize_with_modes((*_CTM_13, "tf_half_pixel_for_nn")))
register("Resize", since=(13, 18), static_inputs=(1, 2, 3))(_resize_with_modes(_CTM_13))
register("Resize", since=19, static_inputs=(1, 2, 3))(_resize_with_modes((*_CTM_13, "half_pixel_symmetric")))


def _upsample_scales(scales, ctx):
    scales = np.asarray(scales, np.float32).reshape(-1)
    if (scales < 1).any():
        raise ctx.error(f"Upsample scales must be >= 1, got {scales.tolist()}")
    return scales


@register("Upsample", since=1)
def upsample_1(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Upsample``, opset 1 (experimental): 4-D, ``height_scale``/``width_scale``."""
    (x,) = inputs
    if jnp.ndim(x) != 4:
        raise ctx.error(f"Upsample-1 takes a 4-D input, got rank {jnp.ndim(x)}")
    scales = _upsample_scales([1.0, 1.0, attrs["height_scale"], attrs["width_scale"]], ctx)
    return _resize(x, scales, None, None, None, _legacy_options(attrs["mode"], ctx), ctx)


@register("Upsample", since=7)
def upsample_7(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Upsample``, opset 7: ``scales`` attribute; asymmetric coordinates as in Resize-10."""
    (x,) = inputs
    scales = _upsample_scales(attrs["scales"], ctx)
    return _resize(x, scales, None, None, None, _legacy_options(attrs["mode"], ctx), ctx)


@register("Upsample", since=(9, 10), static_inputs=(1,))
def upsample_9(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Upsample``, opsets 9-10 (deprecated at 10): static ``scales`` input."""
    x, scales = inputs
    scales = _upsample_scales(scales, ctx)
    return _resize(x, scales, None, None, None, _legacy_options(attrs["mode"], ctx), ctx)


# --------------------------------------------------------------------------------------------
# GridSample / AffineGrid
# --------------------------------------------------------------------------------------------


def _reflect(x, lo, hi):
    """Reflect ``x`` by the borders ``lo``/``hi`` until it lies within them."""
    span = hi - lo
    if span <= 0:
        return jnp.full_like(x, lo)
    below = x < lo
    dx = jnp.where(below, lo - x, x - hi)
    flips = jnp.floor(dx / span)
    r = dx - flips * span
    even = jnp.mod(flips, 2) == 0
    inside_lo, inside_hi = lo + r, hi - r
    reflected = jnp.where(below, jnp.where(even, inside_lo, inside_hi), jnp.where(even, inside_hi, inside_lo))
    return jnp.where((x < lo) | (x > hi), reflected, x)


def _grid_sample(x, grid, mode, padding_mode, align_corners, ctx):
    if padding_mode not in ("zeros", "border", "reflection"):
        raise ctx.error(f"unsupported padding_mode {padding_mode!r}")
    n, c, *dims = jnp.shape(x)
    r = len(dims)
    if jnp.ndim(grid) != r + 2 or jnp.shape(grid)[0] != n or jnp.shape(grid)[-1] != r:
        raise ctx.error(f"grid has shape {jnp.shape(grid)}; expected (N={n}, *out, {r}) for X {jnp.shape(x)}")
    out_dims = jnp.shape(grid)[1:-1]
    dtype = np.dtype(jnp.result_type(x))
    cdtype = compute_type(jnp.result_type(grid))
    grid = jnp.asarray(grid, cdtype).reshape(n, -1, r)  # (N, M, r)
    per_dim = []
    for i, d in enumerate(dims):
        g = grid[..., r - 1 - i]  # the grid lists coordinates innermost dimension first
        pos = (g + 1) / 2 * (d - 1) if align_corners else ((g + 1) * d - 1) / 2
        if mode == "nearest":
            pos = jnp.round(pos)  # half to even, as PyTorch
        lo, hi = (0.0, d - 1.0) if align_corners else (-0.5, d - 0.5)
        # Padding moves the sample point into the image; for cubic it applies to each of the
        # four taps instead (below), the point left where it is: what PyTorch's grid_sample
        # does, which exporters map GridSample to, and onnxruntime too. Moving a point past
        # the border onto it first (the onnx reference) weighs the border taps differently.
        if mode != "cubic" and padding_mode == "border":
            pos = jnp.where((pos < lo) | (pos > hi), jnp.clip(pos, 0, d - 1), pos)
        elif mode != "cubic" and padding_mode == "reflection":
            pos = _reflect(pos, lo, hi)
        if mode == "nearest":
            taps, weights = [jnp.trunc(pos)], [None]
        else:
            base = jnp.floor(pos)
            t = pos - base
            if mode == "linear":
                taps, weights = [base, base + 1], [1 - t, t]
            else:
                a = -0.75
                taps = [base - 1, base, base + 1, base + 2]
                weights = [
                    ((a * (t + 1) - 5 * a) * (t + 1) + 8 * a) * (t + 1) - 4 * a,
                    ((a + 2) * t - (a + 3)) * t * t + 1,
                    ((a + 2) * (1 - t) - (a + 3)) * (1 - t) * (1 - t) + 1,
                    ((a * (2 - t) - 5 * a) * (2 - t) + 8 * a) * (2 - t) - 4 * a,
                ]
        resolved = []
        for tap, w in zip(taps, weights):
            if padding_mode == "zeros":
                valid = (tap >= 0) & (tap < d)
                w = valid.astype(cdtype) if w is None else jnp.where(valid, w, 0)
            elif padding_mode == "border":
                tap = jnp.clip(tap, 0, d - 1)
            else:
                tap = jnp.trunc(_reflect(tap, lo, hi))
            resolved.append((jnp.clip(tap, 0, d - 1).astype(jnp.int32), w))
        per_dim.append(resolved)
    strides = [int(np.prod(dims[i + 1 :])) for i in range(r)]
    flat_idx, flat_w = [], []
    for combo in itertools.product(*per_dim):
        idx = sum(t * s for (t, _), s in zip(combo, strides))
        ws = [w for _, w in combo if w is not None]
        flat_idx.append(idx)
        flat_w.append(jnp.prod(jnp.stack(ws), axis=0) if ws else None)
    idx = jnp.stack(flat_idx, axis=-1)  # (N, M, K)
    xf = jnp.reshape(x, (n, c, -1))
    if mode == "nearest" and flat_w[0] is None:
        y = jax.vmap(lambda xi, ii: xi[:, ii])(xf, idx[..., 0])
        return (y.reshape((n, c) + tuple(out_dims)),)
    xf = xf.astype(cdtype) if not jnp.issubdtype(dtype, jnp.floating) else xf.astype(np.promote_types(dtype, cdtype))
    w = jnp.stack(flat_w, axis=-1)  # (N, M, K)
    gathered = jax.vmap(lambda xi, ii: xi[:, ii])(xf, idx)  # (N, C, M, K)
    y = jnp.sum(gathered * w[:, None].astype(gathered.dtype), axis=-1)
    y = y.reshape((n, c) + tuple(out_dims))
    y = y.astype(dtype) if jnp.issubdtype(dtype, jnp.floating) else jnp.trunc(y).astype(dtype)
    return (y,)


@register("GridSample", since=16)
def grid_sample_16(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``GridSample``, opset 16: 4-D input, modes bilinear/nearest/bicubic."""
    x, grid = inputs
    if jnp.ndim(x) != 4:
        raise ctx.error(f"GridSample-16 takes a 4-D input, got rank {jnp.ndim(x)}")
    modes = {"bilinear": "linear", "nearest": "nearest", "bicubic": "cubic"}
    mode = _str(attrs["mode"])
    if mode not in modes:
        raise ctx.error(f"unsupported mode {mode!r} (one of {tuple(modes)})")
    return _grid_sample(x, grid, modes[mode], _str(attrs["padding_mode"]), attrs["align_corners"], ctx)


@register("GridSample", since=(20, 22))
def grid_sample_20(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``GridSample``, opsets 20+: N-D input, modes linear/nearest/cubic."""
    x, grid = inputs
    mode = _str(attrs["mode"])
    if mode not in ("linear", "nearest", "cubic"):
        raise ctx.error(f"unsupported mode {mode!r} (linear, nearest or cubic)")
    if jnp.ndim(x) < 3:
        raise ctx.error(f"GridSample needs an input of rank >= 3, got {jnp.ndim(x)}")
    return _grid_sample(x, grid, mode, _str(attrs["padding_mode"]), attrs["align_corners"], ctx)


@register("AffineGrid", since=20, static_inputs=(1,))
def affine_grid(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``AffineGrid``, opset 20: 2-D (theta (N, 2, 3)) and 3-D (theta (N, 3, 4)) grids."""
    theta, size = inputs
    size = static_ints(size)
    if len(size) not in (4, 5):
        raise ctx.error(f"size must be (N, C, H, W) or (N, C, D, H, W), got {size}")
    spatial = size[2:]
    r = len(spatial)
    if jnp.shape(theta) != (size[0], r, r + 1):
        raise ctx.error(f"theta has shape {jnp.shape(theta)}; expected {(size[0], r, r + 1)}")
    axes_coords = []
    for d in spatial:
        if attrs["align_corners"]:
            v = np.linspace(-1.0, 1.0, d) if d > 1 else np.full(d, -1.0)
        else:
            v = (2 * np.arange(d) + 1) / d - 1
        axes_coords.append(v)
    mesh = np.meshgrid(*axes_coords, indexing="ij")  # outermost first (D, H, W)
    # Homogeneous base positions, innermost coordinate first: (x, y[, z], 1).
    base = np.stack([*mesh[::-1], np.ones(tuple(spatial))], axis=-1)  # (*spatial, r + 1)
    dtype = jnp.result_type(theta)
    # Half types: the base positions, products and sums in float32, rounded once (as
    # onnxruntime; with float16 base positions and products, a third of the grid was off).
    (theta,) = widen_halves(jnp.asarray(theta))
    base = jnp.asarray(base, jnp.result_type(theta))
    t = theta.reshape((size[0],) + (1,) * r + (r, r + 1))
    # An explicit sum, not a matmul: exact on accelerators whose f32 matmul uses TF32.
    grid = jnp.sum(t * base[None, ..., None, :], axis=-1)
    return (grid.astype(dtype),)


# --------------------------------------------------------------------------------------------
# RoiAlign / MaxRoiPool
# --------------------------------------------------------------------------------------------


def _roi_axis_samples(start, size, pooled, grid_count, max_count, extent, base=None):
    """Per roi: sample weights on one axis, ``(R, pooled, max_count, extent)`` and validity.

    Returns ``(low, high, w_low, w_high, used, valid)``, each ``(R, pooled, max_count)``,
    following the reference's bilinear rules (samples beyond [-1, extent] contribute zero).
    ``base`` (R, pooled): the index of each bin's first sample taken (default 0).
    """
    bin_size = size / pooled  # (R,)
    p = jnp.arange(pooled, dtype=start.dtype)
    k = jnp.arange(max_count, dtype=start.dtype)[None, None, :]
    if base is not None:
        k = k + base[:, :, None].astype(start.dtype)
    count = grid_count.astype(start.dtype)
    pos = (
        start[:, None, None]
        + p[None, :, None] * bin_size[:, None, None]
        + (k + 0.5) * bin_size[:, None, None] / jnp.maximum(count, 1)[:, None, None]
    )
    valid = (pos >= -1.0) & (pos <= extent)
    used = (k < count[:, None, None]) & jnp.ones_like(pos, bool)
    pos = jnp.maximum(pos, 0)
    low = jnp.floor(pos)
    at_edge = low >= extent - 1
    low = jnp.where(at_edge, extent - 1, low)
    high = jnp.where(at_edge, extent - 1, low + 1)
    pos = jnp.where(at_edge, low, pos)
    frac = pos - low
    w_high = jnp.where(valid, frac, 0)
    w_low = jnp.where(valid, 1 - frac, 0)
    return low.astype(jnp.int32), high.astype(jnp.int32), w_low, w_high, used, valid


def _first_inside(start, size, pooled, grid_count, extent):
    """Per roi and bin, ``(R, pooled)``: the index of the first sample at or past -1 (one less,
    against rounding), clipped to the bin's samples: where a window of samples must start to
    take every sample that lands on the feature map."""
    bin_size = size / pooled
    count = jnp.maximum(grid_count.astype(start.dtype), 1)
    spacing = (bin_size / count)[:, None]
    first = start[:, None] + jnp.arange(pooled, dtype=start.dtype)[None, :] * bin_size[:, None]
    k = jnp.ceil((-1.0 - first) / jnp.where(spacing > 0, spacing, 1) - 0.5) - 1
    k = jnp.where(spacing > 0, k, 0)
    return lax.stop_gradient(jnp.clip(k, 0, count[:, None] - 1)).astype(jnp.int32)


def _roi_block(images, ys, xs, mode):
    """Sum (avg) or max of the weighted samples of one block of sample indices per bin:
    ``(R, C, ph, pw)``; ``ys``/``xs`` come from :func:`_roi_axis_samples`."""
    ylo, yhi, wylo, wyhi, uy, _ = ys
    xlo, xhi, wxlo, wxhi, ux, _ = xs

    def corner(yi, xi):
        # images (R, C, H, W); yi (R, ph, mh), xi (R, pw, mw) -> (R, C, ph, mh, pw, mw)
        rows = jax.vmap(lambda im, y: im[:, y])(images, yi)  # (R, C, ph, mh, W)
        return jax.vmap(lambda ro, xx: ro[..., xx])(rows, xi)  # (R, C, ph, mh, pw, mw)

    def wgt(wy, wx):
        return wy[:, None, :, :, None, None] * wx[:, None, None, None, :, :]

    terms = [
        corner(ylo, xlo) * wgt(wylo, wxlo),
        corner(ylo, xhi) * wgt(wylo, wxhi),
        corner(yhi, xlo) * wgt(wyhi, wxlo),
        corner(yhi, xhi) * wgt(wyhi, wxhi),
    ]
    used = uy[:, None, :, :, None, None] & ux[:, None, None, None, :, :]
    if mode == "avg":
        return jnp.sum(jnp.where(used, sum(terms), 0), axis=(3, 5)), None
    # As the reference and onnxruntime: the max over samples of the largest weighted corner
    # value (not of the interpolated value). Taken by index, not with max: JAX differentiates
    # max by comparing its operand with the result, and under jit XLA computes these products
    # in more than one fusion, rounded differently, so no term may equal the result (the
    # derivative 0 / 0, NaN) or the wrong one does, while the values are right.
    candidates = jnp.stack([jnp.where(used, t, -jnp.inf) for t in terms], axis=-1)  # (R,C,ph,mh,pw,mw,4)
    candidates = jnp.moveaxis(candidates, 3, 4)  # (R, C, ph, pw, mh, mw, 4)
    per_bin = math.prod(jnp.shape(candidates)[4:])  # named, not -1: R may be 0
    candidates = candidates.reshape(*jnp.shape(candidates)[:4], per_bin)
    picked = jnp.argmax(candidates, axis=-1)[..., None]
    return None, jnp.take_along_axis(candidates, picked, axis=-1)[..., 0]


def _roi_traced_adaptive(images, start_h, roi_h, start_w, roi_w, gh, gw, ph, pw, mode):
    """sampling_ratio=0 with rois traced (float initializers are params): the per-bin sample
    counts ceil(bin size) are runtime values without a bound, but only samples on the map
    ([-1, extent]) contribute, and a bin holds at most extent + 3 of them (the spacing
    bin/ceil(bin) is at least extent/(extent+1) once a bin spans the map). So each bin
    takes a window of extent + 4 samples from its first one on the map, in blocks of a
    roi-inside-the-map's count, scanned and skipped at run time where no bin needs them.

    Returns ``(total, best, outside)``: the avg sum or the max (R, C, ph, pw), and whether
    a bin has a sample off the map (which counts as 0 in the max).
    """
    _, c, h, w = jnp.shape(images)
    mh, mw = max(math.ceil(h / ph), 1), max(math.ceil(w / pw), 1)
    nby, nbx = math.ceil((h + 4) / mh), math.ceil((w + 4) / mw)
    base_y = _first_inside(start_h, roi_h, ph, gh, h)
    base_x = _first_inside(start_w, roi_w, pw, gw, w)
    ys = _roi_axis_samples(start_h, roi_h, ph, gh, nby * mh, h, base_y)
    xs = _roi_axis_samples(start_w, roi_w, pw, gw, nbx * mw, w, base_x)
    taken_y = jnp.sum(ys[4] & ys[5], axis=-1)  # (R, ph): samples on the map in the window
    taken_x = jnp.sum(xs[4] & xs[5], axis=-1)
    outside = gh[:, None, None] * gw[:, None, None] > taken_y[:, :, None] * taken_x[:, None, :]
    need_y = jnp.any(ys[4] & ys[5], axis=(0, 1)).reshape(nby, mh).any(axis=1)
    need_x = jnp.any(xs[4] & xs[5], axis=(0, 1)).reshape(nbx, mw).any(axis=1)
    dtype = images.dtype
    r = jnp.shape(start_h)[0]

    def block(samples, j, m):
        return tuple(lax.dynamic_slice_in_dim(t, j * m, m, axis=2) for t in samples)

    def step(acc, index):
        by, bx = index // nbx, index % nbx

        def run(acc):
            total, best = _roi_block(images, block(ys, by, mh), block(xs, bx, mw), mode)
            if mode == "avg":
                return acc + total
            # A select (see _roi_block on max) that keeps a NaN, as maximum did and argmax does.
            return jnp.where((best > acc) | jnp.isnan(best), best, acc)

        return lax.cond(need_y[by] & need_x[bx], run, lambda acc: acc, acc), None

    init = jnp.zeros((r, c, ph, pw), dtype) if mode == "avg" else jnp.full((r, c, ph, pw), -jnp.inf, dtype)
    acc, _ = lax.scan(step, init, jnp.arange(nby * nbx))
    return (acc, None, outside) if mode == "avg" else (None, acc, outside)


def _roi_align(x, rois, batch_indices, attrs, half_pixel, ctx):
    mode = _str(attrs["mode"])
    if mode not in ("avg", "max"):
        raise ctx.error(f"unsupported mode {mode!r} (avg or max)")
    if jnp.ndim(x) != 4 or jnp.ndim(rois) != 2 or jnp.shape(rois)[1] != 4:
        raise ctx.error(f"expects X (N, C, H, W) and rois (R, 4); got {jnp.shape(x)} and {jnp.shape(rois)}")
    ph, pw = int(attrs["output_height"]), int(attrs["output_width"])
    ratio = int(attrs["sampling_ratio"])
    scale = float(attrs["spatial_scale"])
    _, _, h, w = jnp.shape(x)
    dtype = jnp.result_type(x)
    concrete = isinstance(rois, np.ndarray)
    (x,) = widen_halves(x)  # half types: sampled and averaged in float32, rounded once
    rois_c = jnp.asarray(rois).astype(jnp.result_type(x))
    offset = 0.5 if half_pixel else 0.0
    start_w = rois_c[:, 0] * scale - offset
    start_h = rois_c[:, 1] * scale - offset
    roi_w = rois_c[:, 2] * scale - offset - start_w
    roi_h = rois_c[:, 3] * scale - offset - start_h
    if not half_pixel:
        roi_w, roi_h = jnp.maximum(roi_w, 1.0), jnp.maximum(roi_h, 1.0)
    if ratio > 0:
        gh = jnp.full(roi_h.shape, ratio)
        gw = jnp.full(roi_w.shape, ratio)
    else:
        gh = jnp.ceil(roi_h / ph)
        gw = jnp.ceil(roi_w / pw)
    images = jnp.take(jnp.asarray(x), jnp.asarray(batch_indices).astype(jnp.int32), axis=0, mode="clip")
    if ratio > 0 or concrete:
        # The sample counts are known: one pass over all of them.
        mh = ratio if ratio > 0 else max(int(np.max(np.asarray(gh), initial=1)), 1)
        mw = ratio if ratio > 0 else max(int(np.max(np.asarray(gw), initial=1)), 1)
        ys = _roi_axis_samples(start_h, roi_h, ph, gh, mh, h)
        xs = _roi_axis_samples(start_w, roi_w, pw, gw, mw, w)
        total, best = _roi_block(images, ys, xs, mode)
        outside = None
    else:
        total, best, outside = _roi_traced_adaptive(images, start_h, roi_h, start_w, roi_w, gh, gw, ph, pw, mode)
    if mode == "avg":
        count = jnp.maximum(gh * gw, 1).astype(total.dtype)
        y = total / count[:, None, None, None]
    else:
        if outside is not None:  # a sample off the map counts as 0 in the max
            y = jnp.where(outside[:, None], jnp.maximum(best, 0), best)
        else:
            y = best
        y = jnp.where(jnp.isneginf(y), 0, y)
    return (y.astype(dtype),)


@register("RoiAlign", since=10)
def roi_align_10(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``RoiAlign``, opset 10: no half-pixel shift (rois at least 1x1)."""
    x, rois, batch_indices = inputs
    return _roi_align(x, rois, batch_indices, attrs, False, ctx)


@register("RoiAlign", since=(16, 22))
def roi_align_16(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``RoiAlign``, opsets 16+: ``coordinate_transformation_mode`` half_pixel/output_half_pixel.

    With traced ``rois`` and ``sampling_ratio=0`` the adaptive sample count per bin is capped
    at ``ceil(H / output_height)`` (and likewise for width) to keep shapes static.
    """
    x, rois, batch_indices = inputs
    ctm = _str(attrs["coordinate_transformation_mode"])
    if ctm not in ("half_pixel", "output_half_pixel"):
        raise ctx.error(f"unsupported coordinate_transformation_mode {ctm!r}")
    return _roi_align(x, rois, batch_indices, attrs, ctm == "half_pixel", ctx)


@register("MaxRoiPool", since=(1, 22))
def max_roi_pool(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``MaxRoiPool``, opsets 1+: Caffe-style RoI max pooling (empty bins give 0)."""
    x, rois = inputs
    pooled = attrs["pooled_shape"]
    if pooled is None or len(pooled) != 2:
        raise ctx.error(f"pooled_shape must hold (height, width), got {pooled}")
    ph, pw = int(pooled[0]), int(pooled[1])
    scale = float(attrs["spatial_scale"])
    if jnp.ndim(x) != 4 or jnp.ndim(rois) != 2 or jnp.shape(rois)[1] != 5:
        raise ctx.error(f"expects X (N, C, H, W) and rois (R, 5); got {jnp.shape(x)} and {jnp.shape(rois)}")
    _, c, h, w = jnp.shape(x)
    rois = jnp.asarray(rois)
    dtype = jnp.result_type(x)

    def rnd(v):  # std::round: half away from zero
        return jnp.sign(v) * jnp.floor(jnp.abs(v) + 0.5)

    batch = rois[:, 0].astype(jnp.int32)
    sw, sh, ew, eh = (rnd(rois[:, i].astype(jnp.float32) * scale) for i in (1, 2, 3, 4))

    def bins(start, end, pooled_n, extent):
        # floor(p * L / P) and ceil((p + 1) * L / P) in integers: a float division here may be
        # rewritten as a multiplication by 1/P and land one past an exact integer.
        length = jnp.maximum(end - start + 1, 1).astype(jnp.int32)[:, None]
        p = jnp.arange(pooled_n, dtype=jnp.int32)[None]
        start = start.astype(jnp.int32)[:, None]
        lo = jnp.clip(p * length // pooled_n + start, 0, extent)
        hi = jnp.clip(-((-(p + 1) * length) // pooled_n) + start, 0, extent)
        pos = jnp.arange(extent, dtype=jnp.int32)
        return (pos[None, None] >= lo[..., None]) & (pos[None, None] < hi[..., None])  # (R, P, extent)

    mask_h = bins(sh, eh, ph, h)
    mask_w = bins(sw, ew, pw, w)
    images = jnp.take(jnp.asarray(x), batch, axis=0, mode="clip")  # (R, C, H, W)
    neg = jnp.asarray(-jnp.inf, dtype)
    # Maxima differentiated by index (reduce_max: JAX's own rule can go wrong compiled on CPU).
    cols = reduce_max(jnp.where(mask_w[:, None, None, :, :], images[:, :, :, None, :], neg), (4,), False)  # (R,C,H,pw)
    y = reduce_max(jnp.where(mask_h[:, None, :, :, None], cols[:, :, None, :, :], neg), (3,), False)  # (R,C,ph,pw)
    return (jnp.where(jnp.isneginf(y), jnp.zeros((), dtype), y),)

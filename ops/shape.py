"""Tensor structure: Shape, Reshape, Constant, Identity, and the other ops that move, cut,
join or create tensors without arithmetic.

Shapes, axes and counts arrive as static (numpy) inputs, so these ops produce static shapes
under ``jit``; ``Shape`` and ``Size`` read only the input's shape and are always static.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from jonnx._registry import Attrs, Inputs, OpContext, Outputs, register
from jonnx.ops._util import canonical, normalize_axes, normalize_axis, onnx_dtype, static_ints


@register("Identity", since=(1, 13, 14, 16, 19, 21, 23, 24, 25))
def identity(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Identity``, all opsets (tensors, sequences and optionals alike)."""
    return (inputs[0],)


@register("Constant", since=(1, 9, 11, 12, 13, 19, 21, 23, 24, 25))
def constant(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Constant``, all opsets: ``value`` or (opset 12+) one of the ``value_*`` forms."""
    given = {k: v for k, v in attrs.items() if v is not None}
    if len(given) != 1:
        raise ctx.error(f"needs exactly one value attribute, got {sorted(given) or 'none'}")
    ((name, value),) = given.items()
    if name in ("value", "sparse_value"):
        return (np.asarray(value),)
    dtypes = {
        "value_float": np.float32,
        "value_floats": np.float32,
        "value_int": np.int64,
        "value_ints": np.int64,
        "value_string": object,
        "value_strings": object,
    }
    return (np.asarray(value, dtype=dtypes[name]),)


def _shape(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Shape``, all opsets (``start``/``end`` from opset 15)."""
    shape = jnp.shape(inputs[0])
    # Symbolic dims (jax.export) stay symbolic in an object array: the interpreter folds the
    # shape arithmetic after Shape on them (jonnx._symbolic).
    symbolic = any(jax.export.is_symbolic_dim(d) for d in shape)
    dims = np.asarray(list(shape), dtype=object if symbolic else np.int64).reshape(-1)
    rank = dims.size
    start, end = attrs.get("start") or 0, attrs.get("end")
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = rank if end is None else min(max(end + rank if end < 0 else end, 0), rank)
    return (dims[start:end],)


register("Shape", since=(1, 13, 15, 19, 21, 23, 24, 25), shape_only=True)(_shape)


def _reshape_target(shape, data_shape, allowzero: bool, ctx):
    target = list(shape)
    if not allowzero:
        target = [data_shape[i] if d == 0 and i < len(data_shape) else d for i, d in enumerate(target)]
    if target.count(-1) > 1:
        raise ctx.error(f"shape {tuple(shape)} has more than one -1")
    # math.prod: symbolic dims (jax.export) multiply as themselves.
    if -1 in target:
        known = math.prod(d for d in target if not (isinstance(d, int) and d == -1))
        total = math.prod(data_shape)
        if known == 0 or total % known:
            raise ctx.error(f"cannot reshape {tuple(data_shape)} into {tuple(shape)}")
        target[target.index(-1)] = total // known
    if math.prod(target) != math.prod(data_shape):
        raise ctx.error(f"cannot reshape {tuple(data_shape)} into {tuple(shape)}")
    return tuple(target)


@register("Reshape", since=1)
def reshape_1(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Reshape``-1: the target shape is the ``shape`` attribute."""
    (x,) = inputs[:1]
    return (jnp.reshape(x, _reshape_target(attrs["shape"] or (), jnp.shape(x), False, ctx)),)


@register("Reshape", since=(5, 13, 14, 19, 21, 23, 24, 25), static_inputs=(1,))
def reshape(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Reshape``, opsets 5+: the target shape is a static input (``allowzero`` from 14)."""
    x, shape = inputs
    target = _reshape_target(static_ints(shape), jnp.shape(x), bool(attrs.get("allowzero")), ctx)
    return (jnp.reshape(x, target),)


# -- helpers ---------------------------------------------------------------------------------


def _output_count(ctx, required: bool = True) -> int | None:
    """How many outputs the node declares (Split without sizes divides by it).

    Outside a model (``jonnx.ops.call`` without ``n_outputs=``) it is unknown: an error, or
    None if not ``required``.
    """
    if ctx.n_outputs is not None:
        return ctx.n_outputs
    if not required:
        return None
    raise ctx.error("cannot tell how many outputs to split into; give the split sizes")


def _dims(x) -> tuple[int, ...]:
    # Symbolic dims (jax.export) stay as they are: jnp's reshape/broadcast take them.
    return tuple(d if jax.export.is_symbolic_dim(d) else int(d) for d in jnp.shape(x))


# -- Flatten, Squeeze, Unsqueeze, Transpose ----------------------------------------------


@register("Flatten", since=(1, 9, 11, 13, 21, 23, 24, 25))
def flatten(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Flatten``, all opsets (negative ``axis`` from opset 11)."""
    (x,) = inputs
    dims = jnp.shape(x)
    axis = attrs["axis"]
    if axis < 0 and ctx.opset < 11:
        raise ctx.error(f"axis {axis} is negative: Flatten before opset 11 takes 0 to the rank ({len(dims)})")
    if not -len(dims) <= axis <= len(dims):
        raise ctx.error(f"axis {axis} is out of range for a tensor of rank {len(dims)}")
    axis = axis + len(dims) if axis < 0 else axis
    # math.prod, not np.prod: a symbolic dim (jax.export) multiplies as itself.
    return (jnp.reshape(x, (math.prod(dims[:axis]), math.prod(dims[axis:]))),)


def _squeeze(x, axes, ctx):
    dims = _dims(x)
    if axes is None:
        axes = tuple(i for i, d in enumerate(dims) if d == 1)
    axes = normalize_axes(axes, len(dims), ctx)
    bad = [a for a in axes if dims[a] != 1]
    if bad:
        raise ctx.error(f"cannot squeeze axes {bad} of shape {dims}: their size is not 1")
    return (jnp.reshape(x, tuple(d for i, d in enumerate(dims) if i not in axes)),)


@register("Squeeze", since=(1, 11))
def squeeze_1(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Squeeze``-1/11: ``axes`` attribute (all size-1 dims when absent)."""
    return _squeeze(inputs[0], attrs["axes"], ctx)


@register("Squeeze", since=(13, 21, 23, 24, 25), static_inputs=(1,))
def squeeze(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Squeeze``, opsets 13+: ``axes`` is an optional static input."""
    x, axes = inputs
    return _squeeze(x, None if axes is None else static_ints(axes), ctx)


def _unsqueeze(x, axes, ctx):
    if axes is None:
        raise ctx.error("needs axes")
    dims = list(_dims(x))
    rank = len(dims) + len(axes)
    for a in sorted(normalize_axes(axes, rank, ctx)):
        dims.insert(a, 1)
    return (jnp.reshape(x, tuple(dims)),)


@register("Unsqueeze", since=(1, 11))
def unsqueeze_1(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Unsqueeze``-1/11: ``axes`` attribute, positions in the output."""
    return _unsqueeze(inputs[0], attrs["axes"], ctx)


@register("Unsqueeze", since=(13, 21, 23, 24, 25), static_inputs=(1,))
def unsqueeze(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Unsqueeze``, opsets 13+: ``axes`` is a static input."""
    return _unsqueeze(inputs[0], static_ints(inputs[1]), ctx)


@register("Transpose", since=(1, 13, 21, 23, 24, 25))
def transpose(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Transpose``, all opsets (no ``perm``: reverse the axes)."""
    (x,) = inputs
    rank = jnp.ndim(x)
    perm = attrs["perm"]
    if perm is None:
        perm = tuple(range(rank))[::-1]
    if sorted(perm) != list(range(rank)):
        raise ctx.error(f"perm {tuple(perm)} is not a permutation of {rank} axes")
    return (jnp.transpose(x, tuple(perm)),)


# -- Concat, Split ---------------------------------------------------------------------------


@register("Concat", since=(1, 4, 11, 13))
def concat(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Concat``, all opsets (opset 1: ``axis`` defaults to 1; negative from 11)."""
    values = [x for x in inputs if x is not None]
    if not values:
        raise ctx.error("needs at least one input")
    axis = attrs["axis"]
    if axis is None:
        if ctx.opset >= 4:
            raise ctx.error("needs the axis attribute")
        axis = 1  # Concat-1's documented default
    rank = jnp.ndim(values[0])
    if any(jnp.ndim(v) != rank for v in values):
        raise ctx.error(f"inputs have different ranks: {[jnp.shape(v) for v in values]}")
    axis = normalize_axis(axis, rank, ctx)
    if all(isinstance(v, np.ndarray) for v in values):  # numpy also joins string tensors
        return (np.concatenate(values, axis=axis),)
    return (jnp.concatenate(values, axis=axis),)


def _split(x, axis, sizes, count, ctx):
    dims = _dims(x)
    axis = normalize_axis(axis, len(dims), ctx)
    dim = dims[axis]
    if sizes is None:
        if count is None:
            count = _output_count(ctx)
        if count < 1:
            raise ctx.error(f"cannot split into {count} outputs")
        chunk = -(-dim // count)
        sizes = [chunk] * (count - 1) + [dim - chunk * (count - 1)]
        if sizes[-1] < 0:
            raise ctx.error(f"cannot split a dimension of {dim} into {count} parts")
    sizes = [int(s) for s in sizes]
    if any(s < 0 for s in sizes) or sum(sizes) != dim:
        raise ctx.error(f"split sizes {sizes} do not add up to the dimension {dim} of axis {axis}")
    bounds = np.cumsum([0] + sizes)
    index = [slice(None)] * len(dims)
    out = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        index[axis] = slice(int(lo), int(hi))
        out.append(x[tuple(index)])
    return tuple(out)


def _even_split(x, axis, ctx):
    """Pre-18 Split without sizes: the parts must be equal."""
    count = _output_count(ctx)
    dim = _dims(x)[normalize_axis(axis, jnp.ndim(x), ctx)]
    if count < 1 or dim % count:
        raise ctx.error(f"cannot split a dimension of {dim} into {count} equal parts")
    return _split(x, axis, None, count, ctx)


@register("Split", since=1, static_inputs=(1,))
def split_1(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Split``-1: sizes from the ``split`` attribute or the optional second input.

    Split-1 documents no default ``axis``; jonnx uses 0, the default Split-2 wrote down.
    """
    x, split = inputs
    axis = 0 if attrs["axis"] is None else attrs["axis"]
    sizes = attrs["split"]
    if split is not None:
        sizes = static_ints(split)
    return _split(x, axis, sizes, None, ctx) if sizes else _even_split(x, axis, ctx)


@register("Split", since=(2, 11))
def split_2(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Split``-2/11: sizes from the ``split`` attribute, else equal parts."""
    sizes = attrs["split"]
    if sizes:
        return _split(inputs[0], attrs["axis"], sizes, None, ctx)
    return _even_split(inputs[0], attrs["axis"], ctx)


@register("Split", since=13, static_inputs=(1,))
def split_13(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Split``-13: sizes from the optional static ``split`` input, else equal parts."""
    x, sizes = inputs
    if sizes is not None:
        return _split(x, attrs["axis"], static_ints(sizes), None, ctx)
    return _even_split(x, attrs["axis"], ctx)


@register("Split", since=18, static_inputs=(1,))
def split_18(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Split``, opsets 18+: ``split`` input or ``num_outputs`` (last part may be smaller)."""
    x, sizes = inputs
    num = attrs["num_outputs"]
    if sizes is not None and num is not None:
        raise ctx.error("give either the split input or num_outputs, not both")
    if sizes is not None:
        return _split(x, attrs["axis"], static_ints(sizes), None, ctx)
    declared = _output_count(ctx, required=num is None)
    if num is not None and declared is not None and num != declared:
        raise ctx.error(f"num_outputs={num} but the node has {declared} outputs")
    return _split(x, attrs["axis"], None, num, ctx)


# -- Slice -----------------------------------------------------------------------------------


def _slice(x, starts, ends, axes, steps, ctx):
    dims = _dims(x)
    if axes is None:
        axes = tuple(range(len(starts)))
    if steps is None:
        steps = (1,) * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ctx.error(
            f"starts {tuple(starts)}, ends {tuple(ends)}, axes {tuple(axes)} and steps {tuple(steps)} differ in length"
        )
    axes = normalize_axes(axes, len(dims), ctx)
    index = [slice(None)] * len(dims)
    for start, end, axis, step in zip(starts, ends, axes, steps):
        dim = dims[axis]
        if step == 0:
            raise ctx.error(f"step 0 on axis {axis}")
        # ONNX clamps after adding dim to negatives; int64 max/min (PyTorch's "to the end")
        # simply clamp. Negative steps clamp to [-1, dim - 1], where -1 means "past index 0".
        start = start + dim if start < 0 else start
        end = end + dim if end < 0 else end
        if step > 0:
            start, end = min(max(start, 0), dim), min(max(end, 0), dim)
        else:
            start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
        index[axis] = slice(start, None if end < 0 else end, step)
    return (x[tuple(index)],)


@register("Slice", since=1)
def slice_1(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Slice``-1: ``starts``/``ends``/``axes`` attributes, step 1."""
    return _slice(inputs[0], attrs["starts"], attrs["ends"], attrs["axes"], None, ctx)


@register("Slice", since=(10, 11, 13), static_inputs=(1, 2, 3, 4))
def slice_(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Slice``, opsets 10+: static ``starts``/``ends``/``axes``/``steps`` inputs."""
    x, starts, ends, axes, steps = inputs
    return _slice(
        x,
        static_ints(starts),
        static_ints(ends),
        None if axes is None else static_ints(axes),
        None if steps is None else static_ints(steps),
        ctx,
    )


# -- Expand, Tile, Pad, CenterCropPad --------------------------------------------------------


@register("Expand", since=(8, 13), static_inputs=(1,))
def expand(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Expand``, all opsets: bidirectional broadcast to the static ``shape``."""
    x, shape = inputs
    try:
        target = jnp.broadcast_shapes(_dims(x), static_ints(shape))
    except ValueError:
        raise ctx.error(f"cannot broadcast {_dims(x)} with shape {static_ints(shape)}") from None
    return (jnp.broadcast_to(x, target),)


@register("Tile", since=1, static_inputs=(1, 2))
def tile_1(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Tile``-1: ``tiles`` copies along the one ``axis`` (both static inputs)."""
    x, tiles, axis = inputs
    (tiles,), (axis,) = static_ints(tiles), static_ints(axis)
    reps = [1] * jnp.ndim(x)
    reps[normalize_axis(axis, jnp.ndim(x), ctx)] = tiles
    return _tile(x, reps, ctx)


@register("Tile", since=(6, 13), static_inputs=(1,))
def tile(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Tile``, opsets 6+: static ``repeats``, one per axis."""
    x, repeats = inputs
    return _tile(x, static_ints(repeats), ctx)


def _tile(x, reps, ctx):
    if len(reps) != jnp.ndim(x) or any(r < 0 for r in reps):
        raise ctx.error(f"repeats {tuple(reps)} do not fit a tensor of shape {_dims(x)}")
    return (jnp.tile(x, tuple(reps)),)


def _pad(x, pads, mode, value, axes, ctx):
    dims = _dims(x)
    rank = len(dims)
    axes = tuple(range(rank)) if axes is None else normalize_axes(axes, rank, ctx)
    if len(pads) != 2 * len(axes):
        raise ctx.error(f"pads {tuple(pads)} need 2 entries per padded axis ({len(axes)} axes)")
    width = [(0, 0)] * rank
    for i, axis in enumerate(axes):
        width[axis] = (int(pads[i]), int(pads[len(axes) + i]))
    # Negative pads remove elements: crop first, then pad what is left.
    crop = tuple(slice(max(-b, 0), d - max(-e, 0)) for (b, e), d in zip(width, dims))
    if any(d - max(-b, 0) - max(-e, 0) < 0 for (b, e), d in zip(width, dims)):
        raise ctx.error(f"pads {tuple(pads)} remove more than shape {dims} holds")
    x = x[crop]
    width = [(max(b, 0), max(e, 0)) for b, e in width]
    if mode == "wrap" and ctx.opset < 19:
        raise ctx.error("mode 'wrap' arrived with Pad-19; before it Pad takes constant, reflect or edge")
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise ctx.error(f"unknown mode {mode!r}")
    if not any(b or e for b, e in width):
        return (x,)  # nothing to pad (a scalar's empty pads, which jnp.pad refuses)
    if mode == "constant":
        dtype = jnp.result_type(x)
        if isinstance(value, jax.core.Tracer):
            # A traced fill (a graph input, under jax.grad or jit) as a select: JAX's transpose of
            # lax.pad fails for the fill's cotangent wherever the padded input is not
            # differentiated as well (jax 0.10.2 sums None there).
            inside = jnp.pad(jnp.ones(jnp.shape(x), bool), width)
            return (jnp.where(inside, jnp.pad(x, width), jnp.reshape(value, ()).astype(dtype)),)
        fill = jnp.zeros((), dtype) if value is None else jnp.reshape(value, ()).astype(dtype)
        return (jnp.pad(x, width, mode="constant", constant_values=fill),)
    for axis, (b, e) in enumerate(width):
        if (b or e) and jnp.shape(x)[axis] == 0:
            raise ctx.error(f"cannot {mode}-pad axis {axis} of size 0")
        if mode == "reflect" and (b or e) and jnp.shape(x)[axis] == 1:
            raise ctx.error(f"cannot reflect-pad axis {axis} of size 1")
    return (jnp.pad(x, width, mode=mode),)


@register("Pad", since=1)
def pad_1(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Pad``-1: ``paddings`` attribute laid out ``[x1_begin, x2_begin, ..., x1_end, ...]``.

    The changelog's text gives this layout (the same as Pad-2's ``pads``); its example
    contradicts it, so jonnx follows the text.
    """
    value = np.asarray(attrs["value"], jnp.result_type(inputs[0]))
    return _pad(inputs[0], attrs["paddings"], attrs["mode"], value, None, ctx)


@register("Pad", since=2)
def pad_2(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Pad``-2: ``pads`` and ``value`` attributes."""
    value = np.asarray(attrs["value"], jnp.result_type(inputs[0]))
    return _pad(inputs[0], attrs["pads"], attrs["mode"], value, None, ctx)


@register("Pad", since=(11, 13), static_inputs=(1,))
def pad_11(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Pad``-11/13: a static ``pads`` input; ``constant_value`` may be a runtime value."""
    x, pads, value = inputs
    return _pad(x, static_ints(pads), attrs["mode"], value, None, ctx)


@register("Pad", since=(18, 19, 21, 23, 24, 25), static_inputs=(1, 3))
def pad(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Pad``, opsets 18+: static ``pads`` and ``axes`` inputs; ``wrap`` from 19.

    ``constant_value`` may be a runtime value.
    """
    x, pads, value, axes = inputs
    axes = None if axes is None else static_ints(axes)
    return _pad(x, static_ints(pads), attrs["mode"], value, axes, ctx)


@register("CenterCropPad", since=18, static_inputs=(1,))
def center_crop_pad(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``CenterCropPad``-18: crop or zero-pad ``axes`` to ``shape``, centred."""
    x, shape = inputs
    dims = _dims(x)
    shape = static_ints(shape)
    axes = tuple(range(len(dims))) if attrs["axes"] is None else attrs["axes"]
    axes = normalize_axes(axes, len(dims), ctx)
    if len(shape) != len(axes):
        raise ctx.error(f"shape {shape} has {len(shape)} entries for {len(axes)} axes")
    crop = [slice(None)] * len(dims)
    width = [(0, 0)] * len(dims)
    for axis, size in zip(axes, shape):
        if size < 0:
            raise ctx.error(f"shape {shape} has a negative entry")
        dim = dims[axis]
        if size < dim:
            start = (dim - size) // 2
            crop[axis] = slice(start, start + size)
        elif size > dim:
            before = (size - dim) // 2
            width[axis] = (before, size - dim - before)
    return (jnp.pad(x[tuple(crop)], width),)


# -- tensors from shapes ---------------------------------------------------------------------


@register("ConstantOfShape", since=(9, 20, 21, 23, 24, 25), static_inputs=(0,))
def constant_of_shape(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``ConstantOfShape``, all opsets (default value: float32 0)."""
    shape = static_ints(inputs[0])
    if any(d < 0 for d in shape):
        raise ctx.error(f"shape {shape} has a negative entry")
    value = attrs["value"]
    value = np.zeros(1, np.float32) if value is None else np.asarray(value)
    if value.size != 1:
        raise ctx.error(f"value must hold one element, not {value.size}")
    return (jnp.full(shape, value.reshape(()), dtype=canonical(value.dtype)),)


def _range_value(x, what, ctx):
    x = np.asarray(x)
    if x.size != 1:
        raise ctx.error(f"{what} must be a scalar, got shape {x.shape}")
    return x.reshape(())


@register("Range", since=(11, 27), static_inputs=(0, 1, 2))
def range_(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Range``, all opsets: ``start + i * delta`` for ``max(ceil((limit-start)/delta), 0)`` steps.

    Float16/bfloat16 compute in float64 and round once (at least as exact as ``stash_type``).
    """
    start, limit, delta = (_range_value(v, n, ctx) for v, n in zip(inputs, ("start", "limit", "delta")))
    dtype = start.dtype
    if object in (start.dtype, limit.dtype, delta.dtype):
        # A symbolic start or limit (jax.export): integer steps only.
        s, l, d = (v.item() for v in (start, limit, delta))
        if not isinstance(d, int) or d == 0:
            raise ctx.error(f"a range over symbolic bounds needs a nonzero integer delta, got {d}")
        span = (l - s + d - 1) // d if d > 0 else (s - l - d - 1) // (-d)
        n = jax.core.max_dim(span, 0)
        out_dtype = canonical(np.int64) if dtype == object else canonical(dtype)
        return ((s + jnp.arange(n, dtype=out_dtype) * d).astype(out_dtype),)
    if dtype.kind in "iu":
        s, l, d = int(start), int(limit), int(delta)
        if d == 0:
            raise ctx.error("delta must not be 0")
        n = max(-(-(l - s) // d), 0)
        wide = canonical(np.int64)
    else:
        s, l, d = float(start), float(limit), float(delta)
        if d == 0 or not np.isfinite([s, l, d]).all():
            raise ctx.error(f"cannot make a range from {s} to {l} by {d}")
        n = max(int(np.ceil((l - s) / d)), 0)
        wide = canonical(np.float64)
    # jnp, not np: the length comes from the data, and the interpreter sizes the output with
    # jax.eval_shape (checking the memory limit) before anything is allocated.
    out = s + jnp.arange(n, dtype=wide) * d
    return (out.astype(canonical(dtype)),)


@register("Size", since=(1, 13, 19, 21, 23, 24, 25), shape_only=True)
def size(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Size``, all opsets."""
    return (np.asarray(int(np.prod(_dims(inputs[0]), dtype=np.int64)), np.int64),)


@register("EyeLike", since=(9, 22), shape_only=True)
def eye_like(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``EyeLike``, all opsets: ones on diagonal ``k``, dtype ``dtype`` or the input's."""
    (x,) = inputs
    if jnp.ndim(x) != 2:
        raise ctx.error(f"needs a 2-D input, got shape {_dims(x)}")
    dtype = jnp.result_type(x) if attrs["dtype"] is None else onnx_dtype(attrs["dtype"])
    rows, cols = _dims(x)
    return (np.eye(rows, cols, k=attrs["k"], dtype=dtype),)


@register("Trilu", since=14, static_inputs=(1,))
def trilu(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Trilu``-14: keep the upper (``upper=1``) or lower triangle from diagonal ``k``."""
    x, k = inputs
    k = 0 if k is None else static_ints(k)[0]
    if jnp.ndim(x) < 2:
        raise ctx.error(f"needs rank >= 2, got shape {jnp.shape(x)}")
    return ((jnp.triu if attrs["upper"] else jnp.tril)(x, k),)


# -- DepthToSpace, SpaceToDepth --------------------------------------------------------------


def _blocks(x, blocksize, ctx):
    if jnp.ndim(x) != 4:
        raise ctx.error(f"needs a 4-D NCHW input, got shape {_dims(x)}")
    if blocksize is None or blocksize < 1:
        raise ctx.error(f"blocksize {blocksize} must be positive")
    return _dims(x)


def _depth_to_space(x, blocksize, mode, ctx):
    b, c, h, w = _blocks(x, blocksize, ctx)
    bs = blocksize
    if c % (bs * bs):
        raise ctx.error(f"channels {c} are not divisible by blocksize^2 = {bs * bs}")
    if mode == "DCR":
        tmp = jnp.reshape(x, (b, bs, bs, c // (bs * bs), h, w))
        tmp = jnp.transpose(tmp, (0, 3, 4, 1, 5, 2))
    elif mode == "CRD":
        tmp = jnp.reshape(x, (b, c // (bs * bs), bs, bs, h, w))
        tmp = jnp.transpose(tmp, (0, 1, 4, 2, 5, 3))
    else:
        raise ctx.error(f"unknown mode {mode!r}")
    return (jnp.reshape(tmp, (b, c // (bs * bs), h * bs, w * bs)),)


@register("DepthToSpace", since=1)
def depth_to_space_1(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``DepthToSpace``-1: DCR order."""
    return _depth_to_space(inputs[0], attrs["blocksize"], "DCR", ctx)


@register("DepthToSpace", since=(11, 13, 28))
def depth_to_space(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``DepthToSpace``, opsets 11+: ``mode`` DCR or CRD."""
    return _depth_to_space(inputs[0], attrs["blocksize"], attrs["mode"], ctx)


def _space_to_depth(x, blocksize, mode, ctx):
    b, c, h, w = _blocks(x, blocksize, ctx)
    bs = blocksize
    if h % bs or w % bs:
        raise ctx.error(f"spatial dims {(h, w)} are not divisible by blocksize {bs}")
    tmp = jnp.reshape(x, (b, c, h // bs, bs, w // bs, bs))
    if mode == "DCR":
        tmp = jnp.transpose(tmp, (0, 3, 5, 1, 2, 4))
    elif mode == "CRD":
        tmp = jnp.transpose(tmp, (0, 1, 3, 5, 2, 4))
    else:
        raise ctx.error(f"unknown mode {mode!r}")
    return (jnp.reshape(tmp, (b, c * bs * bs, h // bs, w // bs)),)


@register("SpaceToDepth", since=(1, 13))
def space_to_depth_1(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``SpaceToDepth``-1/13: DCR order."""
    return _space_to_depth(inputs[0], attrs["blocksize"], "DCR", ctx)


@register("SpaceToDepth", since=28)
def space_to_depth(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``SpaceToDepth``-28: ``mode`` DCR or CRD."""
    return _space_to_depth(inputs[0], attrs["blocksize"], attrs["mode"], ctx)

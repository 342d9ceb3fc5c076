"""Indexing: gathers, scatters, TopK, NonZero, cumulative ops, Compress, Unique, OneHot,
ReverseSequence and TensorScatter.

ONNX calls an out-of-range index an error; JAX clamps out-of-range gather indices and drops
out-of-range scatter updates. These ops take the fast path: negative indices are wrapped
with a ``where``, gathers clamp (``mode="clip"``) and scatters drop (``mode="drop"``), which
agree with ONNX on every valid input. Where the indices are known at trace time (numpy
values: initializers, constants, folded shape arithmetic) they are checked here and a bad
index raises :class:`jonnx.errors.NodeError` naming it. Traced indices are not checked yet.

Ops whose output *shape* depends on values (NonZero, Compress, Unique) declare those inputs
static, so they work on values known at trace time and raise
:class:`jonnx.errors.StaticValueError` on traced ones.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from jonnx._registry import Attrs, Inputs, OpContext, Outputs, register
from jonnx._values import is_concrete
from jonnx.ops._util import array_module, index_dtype, normalize_axis, static_ints, take, widen_halves

# --------------------------------------------------------------------------------------
# Shared helpers


def _is_strings(x) -> bool:
    """A concrete string tensor: JAX cannot hold it, so such ops run in numpy."""
    return isinstance(x, np.ndarray) and x.dtype == object


def _strings_need_concrete(ctx, *arrays) -> None:
    """JAX cannot hold strings: an op on a string tensor needs all its inputs concrete."""
    if any(a is not None and not isinstance(a, np.ndarray) for a in arrays):
        raise ctx.host_error("string tensors can only be indexed by values known at trace time")


def _check_range(indices, size: int, ctx, what: str = "index") -> None:
    """Raise naming the first index outside ``[-size, size)`` when ``indices`` is concrete.

    Runtime indices are checked in checked mode (``ctx.check``, through checkify); in the
    fast default they pass, and the fast path clamps gathers and drops scatters.
    """
    out_of_range = f"out of range [-{size}, {size - 1}]" if size else "out of range: the axis is empty"
    if not isinstance(indices, np.ndarray):
        ctx.check((indices >= -size) & (indices < size), f"{what} {out_of_range}")
        return
    if indices.size == 0:
        return
    bad = (indices < -size) | (indices >= size)
    if bad.any():
        pos = tuple(int(p) for p in np.argwhere(bad)[0])
        raise ctx.error(f"{what} {int(indices[pos])} at position {pos} is {out_of_range}")


def _wrap(indices, size):
    """Negative indices count from the end, as ONNX (opset 11+) defines."""
    xp = array_module(indices)
    return xp.where(indices < 0, indices + size, indices)


def _as_int_indices(indices):
    if isinstance(indices, np.ndarray):
        # Concrete int64 indices: keep them numpy so jnp sees no int64 under x64-off.
        return indices.astype(index_dtype(), copy=False)
    return indices


# --------------------------------------------------------------------------------------
# Gather family


@register("Gather", since=(1, 11, 13))
def gather(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Gather``, all opsets (negative indices wrap, as opset 11+ defines)."""
    data, indices = inputs
    axis = normalize_axis(attrs["axis"], np.ndim(data), ctx)
    size = np.shape(data)[axis]
    _check_range(indices, size, ctx)
    idx = _as_int_indices(_wrap(indices, size))
    if _is_strings(data):
        _strings_need_concrete(ctx, idx)
        return (np.take(data, idx, axis=axis),)
    return (take(data, idx, axis=axis, mode="clip"),)


def _elements_index(data_shape, indices, axis):
    """Full index tuple for an elementwise gather/scatter along ``axis`` of ``indices``' shape."""
    shape = np.shape(indices)
    index = []
    for d in range(len(shape)):
        if d == axis:
            index.append(indices)
        else:
            iota = np.arange(shape[d], dtype=index_dtype())
            index.append(iota.reshape([-1 if i == d else 1 for i in range(len(shape))]))
    return tuple(index)


@register("GatherElements", since=(11, 13))
def gather_elements(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``GatherElements``, opsets 11+."""
    data, indices = inputs
    rank = np.ndim(data)
    axis = normalize_axis(attrs["axis"], rank, ctx)
    if np.ndim(indices) != rank:
        raise ctx.error(f"indices have rank {np.ndim(indices)}, data rank {rank}; they must match")
    for d, (n, m) in enumerate(zip(np.shape(indices), np.shape(data))):
        if d != axis and n > m:
            raise ctx.error(f"indices shape {np.shape(indices)} exceeds data shape {np.shape(data)} on axis {d}")
    size = np.shape(data)[axis]
    _check_range(indices, size, ctx)
    idx = _as_int_indices(_wrap(indices, size))
    index = _elements_index(np.shape(data), idx, axis)
    if _is_strings(data):
        _strings_need_concrete(ctx, idx)
        return (data[index],)
    return (jnp.asarray(data).at[index].get(mode="clip"),)


def _nd_index(data, indices, batch_dims, ctx):
    """Index tuple for GatherND/ScatterND over ``data`` reshaped to one leading batch dim."""
    dshape, ishape = np.shape(data), np.shape(indices)
    if not ishape:
        raise ctx.error("indices must have rank >= 1")
    k = ishape[-1]
    if batch_dims < 0 or batch_dims >= min(len(dshape), len(ishape)):
        raise ctx.error(f"batch_dims {batch_dims} must be in [0, min(rank(data), rank(indices)))")
    if dshape[:batch_dims] != ishape[:batch_dims]:
        raise ctx.error(f"batch dims of data {dshape} and indices {ishape} differ")
    if k > len(dshape) - batch_dims:
        raise ctx.error(f"indices' last dim {k} exceeds rank(data) - batch_dims = {len(dshape) - batch_dims}")
    sizes = dshape[batch_dims : batch_dims + k]
    for j, n in enumerate(sizes):
        _check_range(indices[..., j], n, ctx, f"index (coordinate {j})")
    sizes_arr = np.asarray(sizes, dtype=index_dtype()).reshape((1,) * (len(ishape) - 1) + (k,))
    idx = _as_int_indices(_wrap(indices, sizes_arr))
    nbatch = math.prod(dshape[:batch_dims])
    xp = array_module(idx)
    idx = xp.reshape(idx, (nbatch,) + ishape[batch_dims:])
    batch = np.arange(nbatch, dtype=index_dtype()).reshape((nbatch,) + (1,) * (idx.ndim - 2))
    index = (batch,) + tuple(idx[..., j] for j in range(k))
    return index, (nbatch,) + dshape[batch_dims:]


def _gather_nd(inputs, batch_dims, ctx):
    data, indices = inputs
    index, flat_shape = _nd_index(data, indices, batch_dims, ctx)
    dshape, ishape = np.shape(data), np.shape(indices)
    out_shape = dshape[:batch_dims] + ishape[batch_dims:-1] + dshape[batch_dims + ishape[-1] :]
    if _is_strings(data):
        _strings_need_concrete(ctx, indices)
        return (data.reshape(flat_shape)[index].reshape(out_shape),)
    # jnp.asarray first: jnp.reshape hands a numpy array (constant data) back as numpy.
    flat = jnp.asarray(data).reshape(flat_shape)
    return (jnp.reshape(flat.at[index].get(mode="clip"), out_shape),)


@register("GatherND", since=11)
def gather_nd_11(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``GatherND``-11 (no ``batch_dims``)."""
    return _gather_nd(inputs, 0, ctx)


@register("GatherND", since=(12, 13))
def gather_nd(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``GatherND``, opsets 12+."""
    return _gather_nd(inputs, attrs["batch_dims"], ctx)


# --------------------------------------------------------------------------------------
# Scatter family

_REDUCTIONS = ("none", "add", "mul", "max", "min")


def _scatter(data, index, updates, reduction, ctx):
    if reduction not in _REDUCTIONS:
        raise ctx.error(f"unknown reduction {reduction!r}; expected one of {_REDUCTIONS}")
    if _is_strings(data):
        if reduction != "none":
            raise ctx.error(f"reduction {reduction!r} is not defined for strings")
        _strings_need_concrete(ctx, *index, updates)
        out = data.copy()
        out[index] = updates
        return out
    data = jnp.asarray(data)
    updates = jnp.asarray(updates, dtype=data.dtype)
    unique = _targets_unique(index, np.shape(data))
    dtype = data.dtype
    if reduction in ("add", "mul"):
        # Half types: every update meeting a target accumulates in float32, rounded once
        # (in float16, 30% of the targets of 200 adds into 64 were off the exact sum).
        data, updates = widen_halves(data, updates)
    if reduction == "mul" and not unique:
        return _scatter_mul_repeated(data, index, updates).astype(dtype)
    return _scatter_once(data, index, updates, reduction, unique=bool(unique)).astype(dtype)


def _scatter_once(data, index, updates, reduction, unique: bool):
    at = data.at[index]
    # mode="drop" matches ONNX on valid indices; a checked mode will hook in here.
    kw = {"mode": "drop", "unique_indices": unique}
    if reduction == "none":
        return at.set(updates, **kw)
    if reduction == "add":
        return at.add(updates, **kw)
    if reduction == "mul":
        return at.multiply(updates, **kw)
    if reduction == "max":
        return at.max(updates, **kw)
    return at.min(updates, **kw)


def _targets_unique(index, shape) -> bool | None:
    """Whether concrete scatter targets are all distinct; None when an index array is traced."""
    if not all(isinstance(i, np.ndarray) for i in index):
        return None
    arrays = np.broadcast_arrays(*index)
    flat = np.ravel_multi_index(tuple(a.reshape(-1) for a in arrays), shape[: len(index)], mode="clip")
    return np.unique(flat).size == flat.size


def _scatter_mul_repeated(data, index, updates):
    """``data.at[index].multiply(updates)`` where targets may repeat, in a form JAX can
    differentiate: its scatter-multiply has a gradient only for distinct targets.

    The updates are sorted by target and multiplied together per target with a segmented
    scan; each position of ``data`` then gathers its target's product (1 where nothing lands).
    Out-of-range targets are dropped, as by the other scatters.
    """
    lead, rest = np.shape(data)[: len(index)], np.shape(data)[len(index) :]
    arrays = jnp.broadcast_arrays(*(jnp.asarray(i) for i in index))
    count, size = arrays[0].size, math.prod(lead)
    if count == 0 or size == 0:
        return data
    # Row-major position of each target among data's leading dims; `size` marks "dropped".
    linear = jnp.zeros(arrays[0].shape, index_dtype())
    valid = jnp.ones(arrays[0].shape, bool)
    for i, dim in zip(arrays, lead):
        i = i.astype(index_dtype())
        valid &= (i >= 0) & (i < dim)
        linear = linear * dim + i
    linear = jnp.where(valid, linear, size).reshape(-1)
    order = jnp.argsort(linear, stable=True)
    targets = linear[order]
    values = jnp.reshape(updates, (count, *rest))[order]
    starts = jnp.concatenate([jnp.ones(1, bool), targets[1:] != targets[:-1]])
    trailing = (None,) * len(rest)

    def combine(a, b):  # (segment starts here, running product): associative
        (start_a, prod_a), (start_b, prod_b) = a, b
        return start_a | start_b, jnp.where(start_b[(..., *trailing)], prod_b, prod_a * prod_b)

    _, products = jax.lax.associative_scan(combine, (starts, values))
    positions = jnp.arange(size, dtype=index_dtype())
    last = jnp.maximum(jnp.searchsorted(targets, positions, side="right") - 1, 0)
    hit = targets[last] == positions
    factor = jnp.where(hit[(..., *trailing)], products[last], jnp.ones((), data.dtype))
    return jnp.reshape(jnp.reshape(data, (size, *rest)) * factor, np.shape(data))


def _scatter_nd(inputs, reduction, ctx):
    data, indices, updates = inputs
    dshape, ishape = np.shape(data), np.shape(indices)
    index, _ = _nd_index(data, indices, 0, ctx)
    want = ishape[:-1] + dshape[ishape[-1] :]
    if np.shape(updates) != want:
        raise ctx.error(f"updates have shape {np.shape(updates)}; expected {want}")
    # _nd_index adds a leading batch dim of size 1: scatter into data[None].
    if _is_strings(data):
        out = _scatter(data[None], index, np.asarray(updates)[None], reduction, ctx)
        return (out[0],)
    out = _scatter(jnp.expand_dims(data, 0), index, jnp.expand_dims(updates, 0), reduction, ctx)
    return (out[0],)


@register("ScatterND", since=(11, 13))
def scatter_nd_11(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``ScatterND``, opsets 11-15 (no ``reduction``)."""
    return _scatter_nd(inputs, "none", ctx)


@register("ScatterND", since=(16, 18))
def scatter_nd(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``ScatterND``, opsets 16+ (``reduction`` none/add/mul; max/min from 18)."""
    return _scatter_nd(inputs, attrs["reduction"], ctx)


def _scatter_elements(inputs, axis, reduction, ctx):
    data, indices, updates = inputs
    rank = np.ndim(data)
    axis = normalize_axis(axis, rank, ctx)
    if np.shape(indices) != np.shape(updates):
        raise ctx.error(f"indices {np.shape(indices)} and updates {np.shape(updates)} differ in shape")
    if np.ndim(indices) != rank:
        raise ctx.error(f"indices have rank {np.ndim(indices)}, data rank {rank}; they must match")
    size = np.shape(data)[axis]
    _check_range(indices, size, ctx)
    idx = _as_int_indices(_wrap(indices, size))
    index = _elements_index(np.shape(data), idx, axis)
    return (_scatter(data, index, updates, reduction, ctx),)


@register("ScatterElements", since=(11, 13))
def scatter_elements_11(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``ScatterElements``, opsets 11-15 (no ``reduction``)."""
    return _scatter_elements(inputs, attrs["axis"], "none", ctx)


@register("ScatterElements", since=(16, 18))
def scatter_elements(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``ScatterElements``, opsets 16+ (``reduction`` none/add/mul; max/min from 18)."""
    return _scatter_elements(inputs, attrs["axis"], attrs["reduction"], ctx)


@register("Scatter", since=(9, 11))
def scatter(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Scatter``, opsets 9-10 (deprecated at 11): ``ScatterElements`` without reduction."""
    return _scatter_elements(inputs, attrs["axis"], "none", ctx)


@register("TensorScatter", since=24)
def tensor_scatter(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``TensorScatter``, opsets 24+: writes ``update`` into a KV cache along ``axis``."""
    cache, update, write_indices = inputs
    rank = np.ndim(cache)
    axis = normalize_axis(attrs["axis"], rank, ctx)
    if axis == 0:
        raise ctx.error("axis must not be the batch axis 0")
    mode = attrs["mode"]
    if mode not in ("linear", "circular"):
        raise ctx.error(f"mode must be 'linear' or 'circular', got {mode!r}")
    cshape, ushape = np.shape(cache), np.shape(update)
    if len(ushape) != rank or any(c != u for d, (c, u) in enumerate(zip(cshape, ushape)) if d != axis):
        raise ctx.error(f"update shape {ushape} must match cache shape {cshape} except on axis {axis}")
    batch, max_len, seq_len = cshape[0], cshape[axis], ushape[axis]
    if seq_len > max_len:
        raise ctx.error(f"update length {seq_len} exceeds the cache length {max_len}")
    if write_indices is None:
        write_indices = np.zeros(batch, index_dtype())
    if isinstance(write_indices, np.ndarray) and write_indices.size:
        if (write_indices < 0).any() or (mode == "linear" and (write_indices + seq_len > max_len).any()):
            raise ctx.error(
                f"write_indices {write_indices.tolist()} with an update of length {seq_len} "
                f"do not fit a cache of length {max_len} in {mode} mode"
            )
    xp = array_module(write_indices)
    pos = xp.reshape(write_indices, (batch, 1)) + np.arange(seq_len, dtype=index_dtype())
    if mode == "circular":
        pos = pos % max_len
    pos = _as_int_indices(pos)
    rows = np.arange(batch, dtype=index_dtype())[:, None]
    moved = jnp.moveaxis(cache, axis, 1)
    out = moved.at[rows, pos].set(jnp.moveaxis(jnp.asarray(update, moved.dtype), axis, 1), mode="drop")
    return (jnp.moveaxis(out, 1, axis),)


# --------------------------------------------------------------------------------------
# TopK


def _top_k(x, k: int, axis: int, largest: bool, ctx):
    rank = np.ndim(x)
    axis = normalize_axis(axis, rank, ctx)
    n = np.shape(x)[axis]
    if not 0 <= k <= n:
        raise ctx.error(f"k={k} is out of range for axis {axis} of size {n}")
    x = jnp.asarray(x)
    key = x
    if jnp.issubdtype(x.dtype, jnp.floating):
        # lax.top_k orders -0 before +0; ONNX compares values, which are equal.
        key = jnp.where(x == 0, jnp.zeros((), x.dtype), x)
    if not largest:
        # ~ reverses the order of signed and unsigned ints without overflow.
        key = ~key if jnp.issubdtype(x.dtype, jnp.integer) else -key
    # lax.top_k puts equal values in index order, which is ONNX's tie rule. (Its axis argument
    # is from jax 0.8.1, the declared minimum.)
    _, indices = jax.lax.top_k(key, k, axis=axis)
    values = jnp.take_along_axis(x, indices, axis=axis, mode="clip")
    return values, indices.astype(index_dtype())


@register("TopK", since=1)
def top_k_1(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``TopK``-1: ``k`` is an attribute; always the largest, sorted."""
    return _top_k(inputs[0], attrs["k"], attrs["axis"], True, ctx)


@register("TopK", since=10, static_inputs=(1,))
def top_k_10(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``TopK``-10: ``k`` is a static input; always the largest, sorted."""
    (k,) = static_ints(inputs[1])
    return _top_k(inputs[0], k, attrs["axis"], True, ctx)


@register("TopK", since=(11, 24), static_inputs=(1,))
def top_k(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``TopK``, opsets 11+. ``sorted=0`` returns sorted results too (ONNX leaves the
    order unspecified)."""
    (k,) = static_ints(inputs[1])
    return _top_k(inputs[0], k, attrs["axis"], bool(attrs["largest"]), ctx)


# --------------------------------------------------------------------------------------
# Ops whose output shape depends on values: the data is static


@register("NonZero", since=(9, 13), static_inputs=(0,), host=True)
def non_zero(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``NonZero``, opsets 9+. The input must be known at trace time (the output shape
    depends on its values)."""
    x = np.asarray(inputs[0])
    if x.ndim == 0:
        return (np.zeros((0, int(bool(x))), index_dtype()),)
    return (np.stack(np.nonzero(x)).astype(index_dtype()).reshape(x.ndim, -1),)


def non_zero_bounded(inputs, attrs, ctx, max_rows: int | None = None):
    """``NonZero`` with a static output size ``[rank, max_rows]`` (``jonnx.load(...,
    size_bounds=...)``): the indices of the first ``max_rows`` nonzero elements, then -1.
    The count is ``(out[0] >= 0).sum()``. Runs on traced input.
    """
    x = jnp.asarray(inputs[0])
    if max_rows is None:
        max_rows = math.prod(x.shape)
    if x.ndim == 0:
        x = x.reshape(1)
        return (jnp.zeros((0, max_rows), index_dtype()),)
    found = jnp.nonzero(x, size=max_rows, fill_value=-1)
    return (jnp.stack(found).astype(index_dtype()),)


@register("Compress", since=(9, 11, 28), static_inputs=(1,), host=True)
def compress(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Compress``, all opsets. ``condition`` must be known at trace time."""
    x, condition = inputs
    condition = np.asarray(condition).reshape(-1).astype(bool)
    axis = attrs["axis"]
    on_host = _is_strings(x) or is_concrete(x)
    if axis is None:
        x = np.reshape(x, (-1,)) if on_host else jnp.reshape(x, (-1,))
        axis = 0
    axis = normalize_axis(axis, np.ndim(x), ctx)
    keep = np.nonzero(condition)[0]
    size = np.shape(x)[axis]
    if keep.size and keep[-1] >= size:
        raise ctx.error(f"condition selects index {int(keep[-1])} beyond the axis size {size}")
    keep = keep.astype(index_dtype())
    if on_host:  # numpy, as a host op computes: no compilation per count of kept slices
        return (np.take(np.asarray(x), keep, axis=axis),)
    return (jnp.take(x, keep, axis=axis, mode="clip"),)


def compress_bounded(inputs, attrs, ctx, max_rows: int | None = None):
    """``Compress`` with a static output size (``jonnx.load(..., size_bounds=...)``): the
    first ``max_rows`` kept slices along the axis, then slices of zeros, and as a second
    output the number of valid slices (``min(sum(condition), max_rows)``). Runs on traced
    input. Condition entries beyond the axis are ignored (onnxruntime refuses them).
    """
    x, condition = inputs
    x = jnp.asarray(x)
    condition = jnp.asarray(condition).reshape(-1).astype(bool)
    axis = attrs["axis"]
    if axis is None:
        x = jnp.reshape(x, (-1,))
        axis = 0
    axis = normalize_axis(axis, x.ndim, ctx)
    size = x.shape[axis]
    condition = jnp.pad(condition[:size], (0, max(size - condition.shape[0], 0)))
    if max_rows is None:
        max_rows = size
    # Padding positions point past the axis, which mode="fill" turns into zeros.
    (keep,) = jnp.nonzero(condition, size=max_rows, fill_value=size)
    count = jnp.minimum(jnp.sum(condition), max_rows).astype(index_dtype())
    return jnp.take(x, keep, axis=axis, mode="fill", fill_value=0), count


@register("Unique", since=(11, 28), static_inputs=(0,), host=True)
def unique(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Unique``, opsets 11+. The input must be known at trace time."""
    x = np.asarray(inputs[0])
    axis = attrs["axis"]
    if axis is not None:
        axis = normalize_axis(axis, x.ndim, ctx)
    flat = x.reshape(-1) if axis is None else x
    y, first, inverse, counts = np.unique(
        flat,
        return_index=True,
        return_inverse=True,
        return_counts=True,
        axis=None if axis is None else axis,
    )
    inverse = inverse.reshape(-1)
    if not attrs["sorted"]:
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        y = np.take(y, order, axis=0 if axis is None else axis)
        first, counts, inverse = first[order], counts[order], rank[inverse]
    dt = index_dtype()
    return y, first.astype(dt), inverse.astype(dt), counts.astype(dt)


def unique_bounded(inputs, attrs, ctx, max_rows: int | None = None):
    """``Unique`` with a static number of unique values (``jonnx.load(...,
    size_bounds=...)``): ``Y`` holds the first ``max_rows`` unique values (slices along
    ``axis``), then zeros; ``indices`` is -1 and ``counts`` 0 in the padding, so the number of
    unique values is ``(counts > 0).sum()``. ``inverse_indices`` is complete as long as the
    bound covers every unique value. Runs on traced input.
    """
    x = jnp.asarray(inputs[0])
    axis = attrs["axis"]
    if axis is not None:
        axis = normalize_axis(axis, x.ndim, ctx)
    flat = x.reshape(-1) if axis is None else x
    if max_rows is None:
        max_rows = flat.shape[0 if axis is None else axis]
    y, first, inverse, counts = jnp.unique(
        flat,
        return_index=True,
        return_inverse=True,
        return_counts=True,
        axis=axis,
        size=max_rows,
        fill_value=0,
    )
    inverse = inverse.reshape(-1)
    valid = counts > 0
    if not attrs["sorted"]:
        # Order of first occurrence; the padding (no occurrence) stays last.
        order = jnp.argsort(jnp.where(valid, first, flat.size), stable=True)
        rank = jnp.zeros_like(order).at[order].set(jnp.arange(order.size, dtype=order.dtype))
        y = jnp.take(y, order, axis=0 if axis is None else axis)
        first, counts, valid, inverse = first[order], counts[order], valid[order], rank[inverse]
    dt = index_dtype()
    first = jnp.where(valid, first, -1)
    return y, first.astype(dt), inverse.astype(dt), counts.astype(dt)


# --------------------------------------------------------------------------------------
# Cumulative ops


def _cumulative(x, axis_input, attrs, ctx, op, identity):
    (axis,) = static_ints(axis_input)
    axis = normalize_axis(axis, np.ndim(x), ctx)
    x = jnp.asarray(x)
    dtype = x.dtype
    # Half types accumulate in float32 and round each prefix once, as onnxruntime does: a
    # float16 running sum of 40 values was a unit or more off in over half of its prefixes.
    (x,) = widen_halves(x)
    reverse = bool(attrs["reverse"])
    if attrs["exclusive"]:
        # Shift by one along the axis (exact, unlike subtracting x afterwards).
        n = x.shape[axis]
        pad = [(0, 0)] * x.ndim
        pad[axis] = (0, 1) if reverse else (1, 0)
        start = 1 if reverse else 0
        x = jax.lax.slice_in_dim(jnp.pad(x, pad, constant_values=identity), start, start + n, axis=axis)
    return (op(x, axis=axis, reverse=reverse).astype(dtype),)


@register("CumSum", since=(11, 14), static_inputs=(1,))
def cum_sum(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``CumSum``, opsets 11+ (``exclusive``, ``reverse``). ``axis`` is static."""
    return _cumulative(inputs[0], inputs[1], attrs, ctx, jax.lax.cumsum, 0)


@register("CumProd", since=26, static_inputs=(1,))
def cum_prod(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``CumProd``, opsets 26+ (``exclusive``, ``reverse``). ``axis`` is static."""
    return _cumulative(inputs[0], inputs[1], attrs, ctx, jax.lax.cumprod, 1)


# --------------------------------------------------------------------------------------
# OneHot and ReverseSequence


def _one_hot(inputs, attrs, ctx, wrap_negative: bool):
    indices, depth, values = inputs
    depth_values = np.asarray(depth).reshape(-1)
    if depth_values.size != 1:
        raise ctx.error(f"depth must hold one value, got shape {np.shape(depth)}")
    depth = int(depth_values[0])
    if depth < 1:
        raise ctx.error(f"depth must be positive, got {depth}")
    if math.prod(np.shape(values)) != 2:
        raise ctx.error(f"values must be [off_value, on_value], got shape {np.shape(values)}")
    rank = np.ndim(indices) + 1
    axis = normalize_axis(attrs["axis"], rank, ctx)
    indices = jnp.asarray(indices)
    if not jnp.issubdtype(indices.dtype, jnp.integer):
        indices = indices.astype(index_dtype())  # ONNX casts non-integer indices (truncation)
    if wrap_negative:
        indices = jnp.where(indices < 0, indices + depth, indices)
    classes = np.arange(depth, dtype=index_dtype()).reshape([-1 if d == axis else 1 for d in range(rank)])
    # Out-of-range indices match no class, so their row is all off_value, as ONNX says.
    hot = jnp.expand_dims(indices, axis) == classes
    values = jnp.reshape(values, (2,))
    return (jnp.where(hot, values[1], values[0]),)


@register("OneHot", since=9, static_inputs=(1,))
def one_hot_9(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``OneHot``-9: indices outside ``[0, depth)`` (negative ones too) give all off."""
    return _one_hot(inputs, attrs, ctx, wrap_negative=False)


@register("OneHot", since=(11, 28), static_inputs=(1,))
def one_hot(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``OneHot``, opsets 11+: indices in ``[-depth, -1]`` count from the end."""
    return _one_hot(inputs, attrs, ctx, wrap_negative=True)


@register("ReverseSequence", since=(10, 28))
def reverse_sequence(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``ReverseSequence``, opsets 10+."""
    x, lens = inputs
    rank = np.ndim(x)
    if rank < 2:
        raise ctx.error(f"input must have rank >= 2, got {rank}")
    batch_axis, time_axis = attrs["batch_axis"], attrs["time_axis"]
    if {batch_axis, time_axis} != {0, 1}:
        raise ctx.error(f"batch_axis {batch_axis} and time_axis {time_axis} must be 0 and 1")
    steps, batch = np.shape(x)[time_axis], np.shape(x)[batch_axis]
    if np.shape(lens) != (batch,):
        raise ctx.error(f"sequence_lens has shape {np.shape(lens)}; expected ({batch},)")
    if isinstance(lens, np.ndarray) and ((lens < 0) | (lens > steps)).any():
        raise ctx.error(f"sequence_lens {lens.tolist()} must lie in [0, {steps}]")
    xp = array_module(lens)
    t = np.arange(steps, dtype=index_dtype())[:, None]  # (time, batch)
    lens = _as_int_indices(xp.reshape(lens, (1, batch)))
    src = xp.where(t < lens, lens - 1 - t, t)
    if batch_axis == 0:
        src = src.T
    src = xp.reshape(src, src.shape + (1,) * (rank - 2))
    if _is_strings(x):
        _strings_need_concrete(ctx, src)
        return (np.take_along_axis(x, np.broadcast_to(src, x.shape), axis=time_axis),)
    src = jnp.broadcast_to(src, np.shape(x))
    return (jnp.take_along_axis(x, src, axis=time_axis, mode="clip"),)

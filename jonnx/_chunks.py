"""Running a large batch through a compiled segment in chunks of rows.

XLA's CPU runtime allocates a call's temporaries as one block, with the C library's
allocator, on every call. Above glibc's largest ``mmap`` threshold (32 MiB) that block is
mapped afresh each time and every first touch of its pages is a page fault: 28,000-87,000 a
call for BERT, MobileNetV2 and ResNet-50 at batch 32, a tenth to a fifth of the call
(docs/performance.md, "Large batches"). Running the same computation over chunks of the
batch (``lax.map``) makes the block one chunk's size, which the allocator keeps and reuses,
and keeps each chunk's intermediates in cache. A batch whose dividing chunks would hold one
row each (a prime one) is padded to whole chunks with copies of its last row, whose results
are dropped: one row a chunk would run the products on a row at a time (MobileNetV2, 17 rows:
141 ms in 17 chunks, 114 ms in 6 chunks of 3, :func:`chunk_count`).

That is only right where each row of every output depends on the same row of the inputs, by
the same computation: :func:`row_local` proves it on the segment's jaxpr, one primitive at a
time (a reduction or a cumulative sum over the rows, a Reshape that folds rows together, a
product contracting them, a gather across them, the row's index (``iota``) or random bits
meeting the rows, a loop or an unknown primitive on batched values: not chunked). The chunk
body evaluates that same jaxpr, traced at the whole batch, on a chunk's rows
(:func:`run_in_chunks`), so a value the graph computes from the batch size (a ``Shape``) keeps
its whole-batch value. Ops that choose a lowering by the batch size (ops/conv.py) ask
:func:`lowering_batch` while it is traced, and choose for the rows they will run on.

``Model.__call__`` decides per compiled signature (:func:`chunk_count`) from the compiled
segment's temporaries, on the CPU only: on a GPU the allocator keeps its memory.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.extend.core as jax_core
import jax.numpy as jnp
import numpy as np
from jax import lax

__all__ = ["batch_of", "chunk_count", "chunk_rows", "lowering_batch", "row_local", "run_in_chunks"]

#: Temporaries above this many bytes are mapped afresh on every call (glibc's largest
#: dynamic ``mmap`` threshold); a segment with more is run in chunks where it can be.
FRESH_BLOCK_BYTES = 32 << 20
#: The temporaries one chunk aims at: under the threshold with room for the loop's own.
CHUNK_BYTES = 24 << 20
#: What a chunk costs beyond its rows, in rows: smaller chunks run their products on fewer
#: rows at a time (MobileNetV2, batch 1 of 224 x 224: 7.8 ms a row one row a chunk, 6.1 ms
#: four rows a chunk, so about 0.4 of a row a chunk).
CHUNK_COST_ROWS = 0.4

# Primitives that compute each element from the elements at the same index of their operands
# (operands of size 1 along an axis broadcast along it).
_ELEMENTWISE = frozenset(
    """abs acos acosh add and asin asinh atan atan2 atanh cbrt ceil clamp complex conj convert_element_type copy
    copy_p cos cosh digamma div eq erf erf_inv erfc exp exp2 expm1 floor ge gt imag integer_pow is_finite le
    lgamma log log1p logistic lt max min mul ne neg nextafter not or population_count pow real
    reduce_precision rem round rsqrt select_n shift_left shift_right_arithmetic shift_right_logical sign sin
    sinh sqrt square stop_gradient sub tan tanh xor""".split()
)
_REDUCTIONS = frozenset(
    "reduce_sum reduce_max reduce_min reduce_prod reduce_and reduce_or reduce_xor argmax argmin".split()
)
_CUMULATIVE = frozenset("cumsum cumprod cummax cummin cumlogsumexp".split())
_WINDOWS = frozenset("reduce_window_sum reduce_window_max reduce_window_min".split())
# Primitives holding a jaxpr that runs once, on the operands as given, by the parameter that
# holds it: analysed inside (``pjit`` is ``jit``'s name in older jax).
_CALLS = {
    "jit": "jaxpr",
    "pjit": "jaxpr",
    "closed_call": "call_jaxpr",
    "custom_jvp_call": "call_jaxpr",
    "custom_vjp_call": "call_jaxpr",
    "checkpoint": "jaxpr",
}


class _Tracing(threading.local):
    rows: int | None = None  # a chunk's rows, while the segment to run in chunks is traced


_TRACING = _Tracing()


def lowering_batch(batch: int) -> int:
    """The batch an op should choose its lowering for, given its input's: a chunk's rows while
    a segment run in chunks is traced (the jaxpr traced at the whole batch runs on that many
    rows). ops/conv.py asks: XLA's 3x3 convolution that suits 512 channels on 7x7 at batch 32
    takes seconds at batch 2."""
    return batch if _TRACING.rows is None else min(batch, _TRACING.rows)


@contextlib.contextmanager
def _tracing(rows: int) -> Iterator[None]:
    before, _TRACING.rows = _TRACING.rows, rows
    try:
        yield
    finally:
        _TRACING.rows = before


class _NotRowLocal(Exception):
    """A primitive mixes rows, or is not known to keep them apart."""


# A value's state: an int is the axis along which it holds the batch's rows (computed from
# the inputs, row i from input row i); a frozenset marks a value computed from no input, and
# holds the axes along which it is known to be constant (broadcast), so that it may meet
# batched values there.
State = int | frozenset


def chunk_count(batch: int, temp_bytes: int) -> int:
    """How many chunks a segment of ``batch`` rows whose temporaries take ``temp_bytes`` should
    run in: 1 where they stay under the fresh-mapping threshold, else the fewest that divide
    the batch and bring each chunk's share under ``CHUNK_BYTES``. Where those would hold one
    row each though more fit (a prime batch), the batch is padded to whole chunks
    (:func:`chunk_rows`), as many as make the least work: the rows run plus
    ``CHUNK_COST_ROWS`` for each chunk. Only there: larger padded chunks in place of dividing
    ones of several rows were slower (BERT at 64 rows 13 chunks of 5 against 16 of 4: 1.14x;
    at 27 rows 4 of 7 against 9 of 3: 1.10x).
    """
    if batch < 2 or temp_bytes <= FRESH_BLOCK_BYTES:
        return 1
    fitting = max(1, int(CHUNK_BYTES * batch // temp_bytes))  # rows a chunk can hold
    dividing = next(k for k in range(2, batch + 1) if batch % k == 0 and batch // k <= fitting)
    if batch // dividing > 1 or fitting == 1:
        return dividing
    counts = {-(-batch // rows) for rows in range(1, min(fitting, batch) + 1)}
    return min(sorted(counts), key=lambda k: k * chunk_rows(batch, k) + CHUNK_COST_ROWS * k)


def chunk_rows(batch: int, chunks: int) -> int:
    """The rows of each of ``chunks`` chunks of ``batch`` rows: the batch padded to
    ``chunks`` times that many."""
    return -(-batch // chunks)


def row_local(fn: Callable[[Any], Any], args: Any, chunks: int) -> bool:
    """Whether ``fn(args)`` computes each row (index along axis 0) of every output from the
    same row of every array in ``args`` alone, the same way for every row (all of them with
    the same leading size, at least 2), traced as :func:`run_in_chunks` traces it."""
    return _traced(fn, args, chunks) is not None


def run_in_chunks(fn: Callable[[Any], Any], args: Any, chunks: int) -> Any:
    """``fn(args)`` computed over ``chunks`` equal chunks of rows, one after another
    (``lax.map``), where :func:`row_local` holds; else ``fn(args)`` itself."""
    traced = _traced(fn, args, chunks)
    if traced is None:
        return fn(args)
    closed, shapes, batch = traced
    rows = chunk_rows(batch, chunks)
    padding = chunks * rows - batch

    def chunk(xs: Sequence[jax.Array]) -> list[jax.Array]:
        return _evaluate(closed.jaxpr, closed.consts, xs, [0] * len(xs), batch, rows)

    def split(x: jax.Array) -> jax.Array:
        if padding:  # copies of the last row: values the computation meets in the batch itself
            x = jnp.concatenate([x, jnp.repeat(x[-1:], padding, axis=0)])
        return x.reshape(chunks, rows, *x.shape[1:])

    outs = lax.map(chunk, [split(x) for x in jax.tree.leaves(args)])
    return jax.tree.unflatten(
        jax.tree.structure(shapes), [y.reshape(chunks * rows, *y.shape[2:])[:batch] for y in outs]
    )


def _traced(fn: Callable[[Any], Any], args: Any, chunks: int) -> tuple | None:
    """``fn``'s jaxpr at the whole batch, traced with lowerings chosen for a chunk's rows, its
    output shapes and the batch; None where it cannot run in ``chunks`` chunks."""
    leaves, tree = jax.tree.flatten(args)
    batch = batch_of(leaves)
    if chunks < 2 or batch is None or chunks > batch:
        return None
    with _tracing(chunk_rows(batch, chunks)):
        closed, shapes = jax.make_jaxpr(lambda *xs: fn(jax.tree.unflatten(tree, xs)), return_shape=True)(*leaves)
    return (closed, shapes, batch) if _outputs_by_row(closed.jaxpr, batch) else None


def batch_of(args: Any) -> int | None:
    """The batch ``args`` hold: the leading size every array in them shares, where it is at
    least 2; else None (a scalar among them, sizes that differ, a batch of one)."""
    sizes = {np.shape(x)[0] if np.ndim(x) else None for x in jax.tree.leaves(args)}
    return sizes.pop() if len(sizes) == 1 and None not in sizes and min(sizes) >= 2 else None


def _outputs_by_row(jaxpr: jax_core.Jaxpr, batch: int) -> bool:
    if jaxpr.effects:
        return False
    try:
        states = _analyse(jaxpr, [0] * len(jaxpr.invars), batch)
    except _NotRowLocal:
        return False
    return all(s == 0 for s in states)


def _constant_state(shape: Sequence[int]) -> frozenset:
    """A value computed from no input: constant along its axes of size 1."""
    return frozenset(i for i, n in enumerate(shape) if n == 1)


def _shape(v: Any) -> tuple:
    return getattr(v.aval, "shape", ())


def _analyse(jaxpr: jax_core.Jaxpr, in_states: Sequence[State], batch: int) -> list[State]:
    env: dict[Any, State] = dict(zip(jaxpr.invars, in_states))
    env.update((v, _constant_state(_shape(v))) for v in jaxpr.constvars)

    def state(v: Any) -> State:
        return _constant_state(_shape(v)) if isinstance(v, jax_core.Literal) else env[v]

    for eqn in jaxpr.eqns:
        states = [state(v) for v in eqn.invars]
        sub = _called(eqn)
        outs = _analyse(sub.jaxpr, states, batch) if sub is not None else _rule(eqn, states, batch)[0]
        for v, s in zip(eqn.outvars, outs):
            if isinstance(s, int) and (s >= len(_shape(v)) or _shape(v)[s] != batch):
                # Every rule keeps the rows on an axis of the batch's size; a guard behind them.
                raise _NotRowLocal(f"{eqn.primitive.name}: rows on an axis of another size")
        env.update(zip(eqn.outvars, outs))
    return [state(v) for v in jaxpr.outvars]


def _evaluate(
    jaxpr: jax_core.Jaxpr, consts: Sequence[Any], args: Sequence[Any], in_states: Sequence[State], batch: int, rows: int
) -> list[Any]:
    """The jaxpr on ``rows`` rows: batched values hold ``rows`` along their batch axis, and
    shapes in the parameters are cut to match; values from no input keep their full shape,
    cut where they meet batched ones."""
    values: dict[Any, Any] = {**dict(zip(jaxpr.constvars, consts)), **dict(zip(jaxpr.invars, args))}
    env: dict[Any, State] = dict(zip(jaxpr.invars, in_states))
    env.update((v, _constant_state(_shape(v))) for v in jaxpr.constvars)

    def read(v: Any) -> tuple[Any, State]:
        if isinstance(v, jax_core.Literal):
            return v.val, _constant_state(_shape(v))
        return values[v], env[v]

    for eqn in jaxpr.eqns:
        ins, states = zip(*map(read, eqn.invars)) if eqn.invars else ((), ())
        sub = _called(eqn)
        batched = any(isinstance(s, int) for s in states)
        if sub is not None:
            out_states, resized, cut = _analyse(sub.jaxpr, states, batch), {}, {}
        else:
            out_states, resized, cut = _rule(eqn, states, batch)
        if sub is not None and batched:
            outs = _evaluate(sub.jaxpr, sub.consts, ins, states, batch, rows)
        else:
            # XLA folds the slice of a broadcast: a broadcast bias is not made whole first.
            ins = [lax.slice_in_dim(x, 0, rows, axis=cut[i]) if i in cut else x for i, x in enumerate(ins)]
            params = {**eqn.params, **{k: fix(rows) for k, fix in resized.items()}}
            with eqn.ctx.manager:
                outs = eqn.primitive.bind(*ins, **eqn.primitive.get_bind_params(params))
            outs = outs if eqn.primitive.multiple_results else [outs]
        values.update(zip(eqn.outvars, outs))
        env.update(zip(eqn.outvars, out_states))
    return [read(v)[0] for v in jaxpr.outvars]


def _called(eqn: Any) -> Any:
    """The closed jaxpr a call-like primitive runs (None for others)."""
    sub = eqn.params.get(_CALLS.get(eqn.primitive.name, ""))
    if sub is None:
        return None  # not a call, or one this jax spells otherwise: refused where it meets rows
    return sub if isinstance(sub, jax_core.ClosedJaxpr) else jax_core.ClosedJaxpr(sub, ())


def _with(seq: Sequence[int], index: int, value: int) -> tuple:
    return (*seq[:index], value, *seq[index + 1 :])


def _rule(eqn: Any, states: Sequence[State], batch: int) -> tuple[list[State], dict, dict]:
    """What ``eqn`` gives: its outputs' states, the parameters to cut to a chunk's rows
    (name -> function of the rows), and the operands to cut (operand -> axis).

    Raises _NotRowLocal where the primitive would mix rows or is not known."""
    prim, p = eqn.primitive.name, eqn.params
    shapes = [_shape(v) for v in eqn.invars]
    out_shapes = [_shape(v) for v in eqn.outvars]
    batched = {s for s in states if isinstance(s, int)}
    if not batched:
        return (
            [_constant_rule(prim, p, states, shapes, out_shapes)]
            if len(out_shapes) == 1
            else [_constant_state(_shape(v)) for v in eqn.outvars],
            {},
            {},
        )
    if len(batched) > 1 and prim != "dot_general":
        raise _NotRowLocal(f"{prim}: rows along different axes")
    axis = next(iter(batched))

    def unless(condition: bool) -> None:
        if condition:
            raise _NotRowLocal(prim)

    if prim in _ELEMENTWISE or prim == "concatenate":
        unless(prim == "concatenate" and p["dimension"] == axis)
        # XLA CPU converts a float rounding to -0 into float8 *fnuz (no negative zero) as NaN
        # where the conversion is fused into the loop's update of its output (docs/known_issues.md).
        unless(prim == "convert_element_type" and np.dtype(p["new_dtype"]).name.endswith("fnuz"))
        cut = {}
        for i, (s, shape) in enumerate(zip(states, shapes)):
            if isinstance(s, frozenset) and shape and shape[axis] != 1:
                unless(axis not in s or shape[axis] != batch)  # a constant must not vary along the rows
                cut[i] = axis
        return [axis] * len(eqn.outvars), {}, cut
    if prim == "optimization_barrier":
        return list(states), {}, {}
    if prim == "broadcast_in_dim":
        unless(len(states) > 1)
        out = p["broadcast_dimensions"][axis]
        return [out], {"shape": lambda rows: _with(p["shape"], out, rows)}, {}
    if prim == "reshape":
        unless(p.get("dimensions") is not None)
        before = math.prod(shapes[0][:axis])
        out = next(
            (
                i
                for i in range(len(out_shapes[0]))
                if math.prod(out_shapes[0][:i]) == before and out_shapes[0][i] == batch
            ),
            None,
        )
        unless(out is None)
        return [out], {"new_sizes": lambda rows: _with(p["new_sizes"], out, rows)}, {}
    if prim == "transpose":
        return [p["permutation"].index(axis)], {}, {}
    if prim == "squeeze":
        unless(axis in p["dimensions"])
        return [axis - sum(d < axis for d in p["dimensions"])], {}, {}
    if prim in _REDUCTIONS:
        unless(axis in p["axes"])
        return [axis - sum(d < axis for d in p["axes"])] * len(eqn.outvars), {}, {}
    if prim in _CUMULATIVE or prim == "split":
        unless(p["axis"] == axis)
        return [axis] * len(eqn.outvars), {}, {}
    if prim in ("sort", "top_k"):
        unless(any(not isinstance(s, int) for s in states))
        unless(p.get("dimension", p.get("axis", len(shapes[0]) - 1)) % len(shapes[0]) == axis)
        return [axis] * len(eqn.outvars), {}, {}
    if prim == "slice":
        unless(p["start_indices"][axis] != 0 or p["limit_indices"][axis] != batch)
        unless(p["strides"] is not None and p["strides"][axis] != 1)
        return [axis], {"limit_indices": lambda rows: _with(p["limit_indices"], axis, rows)}, {}
    if prim == "dynamic_slice":
        unless(states[0] != axis or any(isinstance(s, int) for s in states[1:]))
        unless(p["slice_sizes"][axis] != batch)  # the whole batch: the start along it is clamped to 0
        return [axis], {"slice_sizes": lambda rows: _with(p["slice_sizes"], axis, rows)}, {}
    if prim == "pad":
        unless(states[0] != axis or isinstance(states[1], int) or tuple(p["padding_config"][axis]) != (0, 0, 0))
        return [axis], {}, {}
    if prim in _WINDOWS:
        unless(p["window_dimensions"][axis] != 1 or p["window_strides"][axis] != 1)
        unless(tuple(p["padding"][axis]) != (0, 0) or p["base_dilation"][axis] != 1 or p["window_dilation"][axis] != 1)
        return [axis], {}, {}
    if prim == "conv_general_dilated":
        lhs, _, out = p["dimension_numbers"]
        unless(states[0] != lhs[0] or isinstance(states[1], int) or p["batch_group_count"] != 1)
        return [out[0]], {}, {}
    if prim == "dot_general":
        return [_dot_axis(states, shapes, p["dimension_numbers"])], {}, {}
    if prim == "gather":
        return [_gather_axis(states, shapes, out_shapes[0], p["dimension_numbers"])], {}, {}
    raise _NotRowLocal(prim)


def _constant_rule(prim: str, p: dict, states: Sequence[State], shapes: Sequence[tuple], out_shapes: list) -> frozenset:
    """The axes along which a value computed from no input is constant (beyond its axes of
    size 1): those a broadcast adds, kept through elementwise primitives and transposes."""
    rank = len(out_shapes[0])
    if prim == "broadcast_in_dim":
        dims, shape, state = p["broadcast_dimensions"], shapes[0], states[0]
        return frozenset(set(range(rank)) - set(dims) | {dims[i] for i, n in enumerate(shape) if i in state or n == 1})
    if prim in _ELEMENTWISE:
        # Along an axis where every operand is constant (or of size 1, broadcast); scalars are.
        return frozenset(
            i for i in range(rank) if all(i in s or shape[i] == 1 for s, shape in zip(states, shapes) if shape)
        )
    if prim == "transpose":
        return frozenset(p["permutation"].index(i) for i in states[0])
    return _constant_state(out_shapes[0])


def _dot_axis(states: Sequence[State], shapes: Sequence[tuple], dimension_numbers: Any) -> int:
    (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
    lhs_free = [d for d in range(len(shapes[0])) if d not in (*lhs_contract, *lhs_batch)]
    rhs_free = [d for d in range(len(shapes[1])) if d not in (*rhs_contract, *rhs_batch)]
    lhs, rhs = states
    if isinstance(lhs, int) and isinstance(rhs, int):
        if lhs in lhs_batch and rhs in rhs_batch and lhs_batch.index(lhs) == rhs_batch.index(rhs):
            return lhs_batch.index(lhs)
    elif isinstance(lhs, int) and lhs in lhs_free:
        return len(lhs_batch) + lhs_free.index(lhs)
    elif isinstance(rhs, int) and rhs in rhs_free:
        return len(lhs_batch) + len(lhs_free) + rhs_free.index(rhs)
    raise _NotRowLocal("dot_general: a contraction over the rows")


def _gather_axis(states: Sequence[State], shapes: Sequence[tuple], out_shape: tuple, numbers: Any) -> int:
    """Rows of the indices pick rows of the output from a table computed from no input."""
    operand, indices = states
    if isinstance(operand, int) or numbers.operand_batching_dims or indices == len(shapes[1]) - 1:
        raise _NotRowLocal("gather: a gather across rows")
    return [d for d in range(len(out_shape)) if d not in numbers.offset_dims][indices]

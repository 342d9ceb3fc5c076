"""Control flow: If, Loop and Scan over subgraphs, on ``jax.lax``.

Subgraph bodies run through ``ctx.run_graph``, which gives them the enclosing scopes' values,
so bodies may read outer values at any nesting depth.

* ``If`` with a condition known at trace time picks its branch statically (the branches may
  then differ in shape); otherwise it is ``lax.cond``.
* ``Loop`` with a static trip count is ``lax.scan`` (differentiable); a data-dependent exit
  freezes the carried values once the condition turns false. Without a trip count (or with
  a huge one, INT64_MAX from exporters) it is ``lax.while_loop``. Loops that carry sequences
  or empty optionals, whose inputs are all known at trace time, or whose scan outputs end by
  a condition known only per iteration, are unrolled at trace time. Where such a loop's exit
  depends on runtime data it raises ``RuntimeShapeError``, and ``Model.__call__`` runs it on
  the host instead (so too an If on runtime data whose branches differ in shape).
* ``Scan`` is ``lax.scan`` with the scan axes moved to the front.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jonnx import errors
from jonnx._registry import Attrs, Inputs, OpContext, Outputs, register
from jonnx._static import static_values
from jonnx._values import is_concrete, known_value
from jonnx.ops._util import canonical, index_dtype, normalize_axis

# Loops unrolled at trace time (sequence-carrying or fully static ones) stop with an error
# past this many iterations instead of running without end.
MAX_UNROLLED_ITERATIONS = 100_000

# Exporters write "loop while cond" as a trip count of INT64_MAX; past this many iterations a
# static trip count is only a bound, and the loop is a ``lax.while_loop`` instead of a scan.
MAX_SCAN_LENGTH = 2**31 - 1

_SUBGRAPH_VERSIONS = (1, 11, 13, 16, 19, 21, 23, 24, 25)


def _is_true(value: Any) -> bool:
    return bool(np.asarray(value).reshape(-1)[0])


def _check_if(attrs, n_inputs: int, n_outputs: int) -> str | None:
    then_n, else_n = len(attrs["then_branch"].outputs), len(attrs["else_branch"].outputs)
    if then_n != else_n:
        return f"then_branch gives {then_n} outputs but else_branch gives {else_n}"
    if n_outputs > then_n:
        return f"the node lists {n_outputs} outputs but its branches give {then_n}"
    return None


@register("If", since=_SUBGRAPH_VERSIONS, prefer_static=(0,), validate=_check_if)
def if_(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``If``, all opsets: a static choice when the condition is known, else ``lax.cond``."""
    (cond,) = inputs
    then_branch, else_branch = attrs["then_branch"], attrs["else_branch"]
    if is_concrete(cond):
        return ctx.run_graph(then_branch if _is_true(cond) else else_branch, {})
    if len(then_branch.outputs) != len(else_branch.outputs):
        raise ctx.error(f"the branches have {len(then_branch.outputs)} and {len(else_branch.outputs)} outputs")

    def run(branch):
        return lambda: tuple(jnp.asarray(v) if isinstance(v, np.ndarray) else v for v in ctx.run_graph(branch, {}))

    then_shapes = jax.eval_shape(run(then_branch))
    else_shapes = jax.eval_shape(run(else_branch))
    if jax.tree_util.tree_structure(then_shapes) != jax.tree_util.tree_structure(else_shapes) or any(
        (a.shape, a.dtype) != (b.shape, b.dtype)
        for a, b in zip(jax.tree_util.tree_leaves(then_shapes), jax.tree_util.tree_leaves(else_shapes))
    ):
        raise errors.RuntimeShapeError(
            f"{ctx.where()}: the condition depends on runtime data, and the branches' outputs differ "
            f"in shape or type ({_describe(then_shapes)} vs {_describe(else_shapes)}), which one "
            "compiled computation cannot hold. Model(*inputs) runs such an If on the host, on "
            "concrete values; under jax.jit, jax.vmap or Model.apply make the condition known at "
            "trace time"
        )
    return lax.cond(jnp.reshape(cond, ()).astype(bool), run(then_branch), run(else_branch))


def _describe(shapes) -> str:
    return str([f"{a.dtype}{list(a.shape)}" for a in jax.tree_util.tree_leaves(shapes)])


class _DynamicExit(Exception):
    """Raised inside a scan trace when the loop condition turns out to depend on runtime data."""


def _loop_static(attrs) -> tuple[int, ...]:
    """A Loop with scan outputs needs its trip count at trace time: they stack per iteration."""
    body = attrs["body"]
    n_state = len(body.inputs) - 2
    return (0,) if len(body.outputs) - 1 - n_state > 0 else ()


@register("Loop", since=_SUBGRAPH_VERSIONS, static_inputs=_loop_static, prefer_static=(0, 1))
def loop(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Loop``, all opsets: ``lax.scan`` for a static trip count, else ``lax.while_loop``."""
    trip, cond, *state = inputs
    body = attrs["body"]
    n_scan = _scan_count(body, len(state), ctx)
    scan_infos = body.outputs[1 + len(state) :]
    step = _body_step(body, ctx)

    static_trip = trip is None or is_concrete(trip)
    carries_structure = _carries_structure(state)
    everything_static = static_trip and is_concrete(cond) and is_concrete(state)
    if static_trip and (carries_structure or everything_static or _needs_static_step(body)):
        return _unrolled(trip, cond, state, step, scan_infos, ctx)
    if carries_structure:
        raise _runtime_length(
            ctx,
            "the loop carries a sequence or an empty optional, so it runs at trace time and needs "
            "its trip count then, but M depends on runtime data",
        )
    if trip is not None and static_trip:
        length = _trip_count(trip)
        scannable = length <= MAX_SCAN_LENGTH
        if scannable and (cond is None or (is_concrete(cond) and _is_true(cond))):
            try:
                return _scanned(length, step, state, ctx)
            except _DynamicExit:
                pass
        if n_scan:
            # The exit may depend only on values known at trace time (the iteration number):
            # unrolled, each iteration finds out, and the scan outputs get a static length.
            return _unrolled(trip, cond, state, step, scan_infos, ctx)
        if scannable:
            return tuple(_freezing_scan(length, step, cond, state, ctx)[1])
    if n_scan and trip is None:
        # Without a trip count the exit may still be known at trace time (a constant false
        # condition, or one computed from the iteration number): unrolled, each iteration
        # finds out, and _unrolled names a condition that turns out to be runtime data.
        return _unrolled(trip, cond, state, step, scan_infos, ctx)
    if n_scan:
        raise ctx.error(
            "a Loop without a trip count known at trace time cannot have scan outputs: their "
            "length would depend on runtime data"
        )
    return _while(trip, cond, state, step, ctx)


def _carries_structure(state) -> bool:
    """Sequences and empty optionals are Python structure (a list, None), which one compiled
    loop cannot carry: such loops run at trace time."""
    return any(isinstance(s, list) or s is None for s in state)


def _needs_static_step(body) -> bool:
    """A body that needs its iteration number or a carried value at trace time (to slice by
    it, say) cannot be one scan step; unrolled, each iteration sees them as constants."""
    names = body.input_names
    return bool(static_values(body) & set(names[:1] + names[2:]))


def _scan_count(body, n_state: int, ctx) -> int:
    """How many scan outputs a Loop body gives beside ``n_state`` carried values."""
    n_scan = len(body.outputs) - 1 - n_state
    if n_scan < 0 or len(body.inputs) != 2 + n_state:
        raise ctx.error(
            f"the body takes {len(body.inputs)} inputs and gives {len(body.outputs)} outputs, "
            f"which does not fit {n_state} loop-carried values"
        )
    return n_scan


def _body_step(body, ctx):
    """A Loop body as ``step(i, flag, carried) -> (flag, new carried values, scan rows)``."""
    names = body.input_names
    n_state = len(names) - 2

    def step(i, flag, carried):
        out = ctx.run_graph(body, {names[0]: i, names[1]: flag, **dict(zip(names[2:], carried))}, iteration=i)
        return out[0], list(out[1 : 1 + n_state]), list(out[1 + n_state :])

    return step


def loop_bounded(inputs, attrs, ctx, max_rows: int | None = None):
    """``Loop`` with scan outputs of a static length (``jonnx.load(..., size_bounds=...)``), for
    a loop whose exit depends on runtime data: one ``lax.scan`` of ``max_rows`` steps (default:
    the trip count, which must then be known at trace time), the rows of the iterations that
    ran first and zeros after them; the carried values as the loop left them (past the bound
    it runs on as a ``lax.while_loop``, keeping no more rows); and, appended, the number of
    valid rows, ``min(iterations, max_rows)``. Runs under ``jax.jit``; reverse-mode
    differentiable where the bound covers the trip count (the default), not past a smaller
    bound, whose ``while_loop`` reverse mode cannot pass.
    """
    trip, cond, *state = inputs
    body = attrs["body"]
    _scan_count(body, len(state), ctx)
    step = _body_step(body, ctx)
    if _carries_structure(state) or _needs_static_step(body):
        raise ctx.error(
            "bounded mode runs the loop as one compiled scan, but it carries a sequence or an "
            "optional, or its body needs the iteration number or a carried value at trace time"
        )
    static_trip = trip is not None and is_concrete(trip)
    if max_rows is None:
        if not static_trip or _trip_count(trip) > MAX_SCAN_LENGTH:
            raise ctx.error(
                "bounded mode without a bound needs the trip count M known at trace time; give "
                "size_bounds a row count for this loop"
            )
        max_rows = _trip_count(trip)
    length = min(max_rows, _trip_count(trip)) if static_trip else max_rows
    limit = None if trip is None or static_trip else jnp.reshape(jnp.asarray(trip), ()).astype(index_dtype())

    runs, final, count, scans = _freezing_scan(length, step, cond, state, ctx, limit)
    if not static_trip or _trip_count(trip) > length:
        # Past the bound the loop runs on for its carried values; no more rows are kept.
        final = _while(trip, runs, final, step, ctx, start=length)
    return (*final, *scans, count)


def _trip_count(trip) -> int:
    return int(np.asarray(trip).reshape(-1)[0])


def _iteration(i) -> jax.Array:
    return jnp.asarray(i, index_dtype())


def _unrolled(trip, cond, state, step, scan_infos, ctx):
    """Run the loop at trace time, one body evaluation per iteration."""
    n_scan = len(scan_infos)
    limit = None if trip is None else _trip_count(trip)
    flag = np.asarray(True) if cond is None else cond
    scans: list[list] = [[] for _ in range(n_scan)]
    first = state
    i = 0
    while limit is None or i < limit:
        # Known also under jax.grad on the host, where the flag is a tracer over its value.
        known = known_value(flag)
        if known is None:
            raise _runtime_length(
                ctx,
                "the loop condition depends on runtime data while the loop carries a sequence "
                "or has scan outputs, whose length would then depend on runtime data",
            )
        if not _is_true(known):
            break
        if i >= MAX_UNROLLED_ITERATIONS:
            raise ctx.error(f"the loop ran {i} iterations at trace time, the most jonnx unrolls, without ending")
        flag, state, outs = step(np.asarray(i, np.int64), flag, state)
        for acc, value in zip(scans, outs):
            acc.append(value)
        i += 1
    if n_scan and not i:
        return (*state, *_empty_scan_outputs(step, first, scan_infos, ctx))
    return (*state, *(jnp.stack([jnp.asarray(v) for v in acc]) for acc in scans))


def _runtime_length(ctx: OpContext, why: str) -> errors.RuntimeShapeError:
    return errors.RuntimeShapeError(
        f"{ctx.where()}: {why}. Model(*inputs) runs such a loop on the host, on concrete "
        "values; under jax.jit, jax.vmap or Model.apply one compiled computation cannot hold it, "
        f"unless jonnx.load(..., size_bounds={{{ctx.node!r}: rows}}) pads its scan outputs"
    )


def _empty_scan_outputs(step, state, scan_infos, ctx) -> list:
    """The scan outputs of a loop that ran zero times: empty, shaped as one iteration's."""
    try:
        shapes = jax.eval_shape(lambda: step(np.asarray(0, np.int64), np.asarray(True), state)[2])
    except errors.JonnxError as e:
        # The body cannot run even once (it reads element i of an empty sequence, say): the
        # types the body declares give the shapes, unknown dims and rank as 0 and (0,), as
        # onnxruntime does; the specification leaves them open.
        return [_declared_empty(info, e, ctx) for info in scan_infos]
    return [jnp.zeros((0, *s.shape), s.dtype) for s in shapes]


def _declared_empty(info, cause, ctx) -> jax.Array:
    if info.kind != "tensor" or info.dtype is None:
        raise ctx.error(
            f"the loop ran zero times, and the body neither runs once to give scan output "
            f"{info.name!r} its type ({str(cause).splitlines()[0]}) nor declares it"
        ) from cause
    dims = () if info.shape is None else tuple(d if isinstance(d, int) else 0 for d in info.shape)
    return jnp.zeros((0, *dims), canonical(info.dtype))


def _scanned(length, step, state, ctx):
    """``lax.scan`` over a static trip count whose condition stays true at trace time; raises
    ``_DynamicExit`` where it turns out to be runtime data."""

    def body(carried, i):
        new_flag, new_state, outs = step(_iteration(i), np.asarray(True), carried)
        if not (is_concrete(new_flag) and _is_true(new_flag)):
            raise _DynamicExit
        return _match(new_state, carried, ctx), [jnp.asarray(o) for o in outs]

    final, scans = lax.scan(body, [jnp.asarray(s) for s in state], jnp.arange(length))
    return (*final, *scans)


def _freezing_scan(length, step, cond, state, ctx, limit=None):
    """``lax.scan`` of ``length`` steps for a loop whose exit is runtime data: once the
    condition (or ``i < limit``) turns false, the carried values freeze and the scan rows are
    zeros. Returns ``(still running, carried values, iterations run, scan outputs)``."""

    def body(carry, i):
        runs, carried, count = carry  # whether iteration i runs: the condition so far
        if limit is not None:
            runs = jnp.logical_and(runs, i < limit)
        flag, new_state, outs = step(i, runs, carried)
        kept = [jnp.where(runs, n, c) for n, c in zip(_match(new_state, carried, ctx), carried)]
        rows = [jnp.where(runs, jnp.asarray(o), jnp.zeros_like(jnp.asarray(o))) for o in outs]
        next_runs = jnp.logical_and(runs, jnp.reshape(jnp.asarray(flag), ()).astype(bool))
        return (next_runs, kept, count + runs.astype(index_dtype())), rows

    runs0 = jnp.asarray(True) if cond is None else jnp.reshape(jnp.asarray(cond), ()).astype(bool)
    init = (runs0, [jnp.asarray(s) for s in state], jnp.asarray(0, index_dtype()))
    (runs, final, count), scans = lax.scan(body, init, jnp.arange(length, dtype=index_dtype()))
    return runs, final, count, scans


def _match(new_state, carried, ctx):
    """Loop-carried values must keep their shape and dtype to live in one compiled loop."""
    out = []
    for new, old in zip(new_state, carried):
        new = jnp.asarray(new)
        if jnp.shape(new) != jnp.shape(old):
            raise ctx.error(
                f"a loop-carried value changes shape from {jnp.shape(old)} to {jnp.shape(new)} "
                "between iterations; only loops known at trace time may do that"
            )
        out.append(new.astype(jnp.result_type(old)))
    return out


def _while(trip, cond, state, step, ctx, start: int = 0):
    """``lax.while_loop`` for loops bounded by a runtime trip count or condition only, from
    iteration ``start`` on."""
    if trip is None:
        limit = None
    elif is_concrete(trip):  # INT64_MAX, say, when the index type is int32
        limit = jnp.asarray(min(_trip_count(trip), np.iinfo(index_dtype()).max), index_dtype())
    else:
        limit = jnp.reshape(jnp.asarray(trip), ()).astype(index_dtype())
    flag0 = jnp.asarray(True) if cond is None else jnp.reshape(jnp.asarray(cond), ()).astype(bool)

    def keep_going(carry):
        i, flag, _ = carry
        return flag if limit is None else jnp.logical_and(flag, i < limit)

    def body(carry):
        i, flag, carried = carry
        new_flag, new_state, _ = step(i, flag, carried)
        return i + 1, jnp.reshape(jnp.asarray(new_flag), ()).astype(bool), _match(new_state, carried, ctx)

    init = (jnp.asarray(start, index_dtype()), flag0, [jnp.asarray(s) for s in state])
    _, _, final = lax.while_loop(keep_going, body, init)
    return tuple(final)


def _scan_core(state, scan_inputs, attrs, ctx):
    """Scan-9+ semantics on unbatched inputs; returns final states and scan outputs."""
    body = attrs["body"]
    n_state, n_in = len(state), len(scan_inputs)
    n_out = len(body.outputs) - n_state
    in_axes = attrs.get("scan_input_axes") or (0,) * n_in
    in_dirs = attrs.get("scan_input_directions") or (0,) * n_in
    out_axes = attrs.get("scan_output_axes") or (0,) * n_out
    out_dirs = attrs.get("scan_output_directions") or (0,) * n_out
    xs = []
    for x, axis, direction in zip(scan_inputs, in_axes, in_dirs):
        x = jnp.moveaxis(jnp.asarray(x), normalize_axis(axis, jnp.ndim(x), ctx), 0)
        xs.append(jnp.flip(x, 0) if direction else x)
    lengths = {jnp.shape(x)[0] for x in xs}
    if not lengths:
        raise ctx.error("Scan needs at least one scan input (num_scan_inputs >= 1)")
    if len(lengths) > 1:
        raise ctx.error(f"scan inputs have different lengths along their scan axes: {sorted(lengths)}")
    names = body.input_names

    def step(carried, inputs):
        i, slices = inputs
        out = ctx.run_graph(body, dict(zip(names, [*carried, *slices])), iteration=i)
        return _match(list(out[:n_state]), carried, ctx), [jnp.asarray(o) for o in out[n_state:]]

    (length,) = lengths
    final, ys = lax.scan(step, [jnp.asarray(s) for s in state], (jnp.arange(length), xs))
    outputs = []
    for y, axis, direction in zip(ys, out_axes, out_dirs):
        y = jnp.flip(y, 0) if direction else y
        outputs.append(jnp.moveaxis(y, 0, normalize_axis(axis, jnp.ndim(y), ctx)))
    return (*final, *outputs)


@register("Scan", since=(9, 11, 16, 19, 21, 23, 24, 25))
def scan(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Scan``, opsets 9+: ``lax.scan`` over the scan axes."""
    n_in = attrs["num_scan_inputs"]
    n_state = len(inputs) - n_in
    return _scan_core(list(inputs[:n_state]), list(inputs[n_state:]), attrs, ctx)


@register("Scan", since=8)
def scan_8(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX ``Scan``-8: a leading batch axis and optional per-batch ``sequence_lens``.

    A sequence shorter than the scan axis stops updating its states after its length; its
    scan outputs are zero past it, and a reversed input is read from its last valid element.
    """
    lens, *rest = inputs
    n_in = attrs["num_scan_inputs"]
    n_state = len(rest) - n_in
    state = [jnp.asarray(s) for s in rest[:n_state]]
    scan_inputs = [jnp.asarray(x) for x in rest[n_state:]]
    full = jnp.shape(scan_inputs[0])[1]
    directions = attrs.get("directions") or (0,) * n_in
    if lens is None or (is_concrete(lens) and np.all(np.asarray(lens) == full)):
        # Scan-8's `directions` is Scan-9's `scan_input_directions`; axes are 0 past the batch.
        attrs9 = {"body": attrs["body"], "scan_input_directions": directions}
        batched = jax.vmap(lambda s, x: _scan_core(list(s), list(x), attrs9, ctx))
        return batched(state, scan_inputs)
    if jnp.shape(lens) != (jnp.shape(scan_inputs[0])[0],):
        raise ctx.error(f"sequence_lens has shape {jnp.shape(lens)}; it needs one length per batch entry")
    # Known lengths are checked now; runtime ones in checked mode (ctx.check decides).
    ctx.check((lens >= 0) & (lens <= full), f"sequence_lens must lie in [0, {full}]")
    run = functools.partial(_scan_8_ragged, body=attrs["body"], directions=directions, full=full, ctx=ctx)
    return jax.vmap(run)(jnp.asarray(lens), state, scan_inputs)


def _scan_8_ragged(length, state, xs, *, body, directions, full, ctx):
    """One batch entry of Scan-8 whose sequence may be shorter than the scan axis."""
    n_state = len(state)

    def step(carried, t):
        valid = t < length
        # A reversed input runs from its last valid element down to its first.
        index = [jnp.clip(jnp.where(d, length - 1 - t, t), 0, full - 1) for d in directions]
        slices = [x[i] for x, i in zip(xs, index)]
        out = ctx.run_graph(body, dict(zip(body.input_names, [*carried, *slices])), iteration=t)
        new = _match(list(out[:n_state]), carried, ctx)
        kept = [jnp.where(valid, n, c) for n, c in zip(new, carried)]
        return kept, [jnp.where(valid, o, jnp.zeros_like(o)) for o in map(jnp.asarray, out[n_state:])]

    final, ys = lax.scan(step, state, jnp.arange(full))
    return (*final, *ys)

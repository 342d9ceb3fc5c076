"""The interpreter: walks a graph's nodes over an environment of values.

A value is *concrete* (numpy, known at trace time) or *dynamic* (a ``jax.Array``, usually a
tracer). A node whose inputs are all concrete runs at trace time, so shape arithmetic
(Shape -> Gather -> Concat -> Reshape) folds to constants under ``jit`` and ``vmap``. Folding
runs with 64-bit types enabled locally, so int64 shape arithmetic is exact even when the
caller runs with ``jax_enable_x64`` off; the folded values are numpy and enter the traced
computation only where a dynamic op reads them.

After tracing nothing of this module is left: the compiled computation is XLA's alone.
"""

from __future__ import annotations

import contextvars
import dataclasses
import operator
import warnings
from collections import ChainMap
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jonnx import _host_fold as host_fold, errors
from jonnx._ir import Graph, Node
from jonnx._progress import Progress
from jonnx._registry import OpContext, promote_floats
from jonnx._static import static_values
from jonnx._values import carries_value, is_concrete

__all__ = ["RunOptions", "run_graph", "run_nodes"]

#: The nodes of the current top-level run that read a 64-bit constant too large for the 32-bit
#: type JAX holds it in (x64 off); warned about once, together, when the run ends.
_NARROWED: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("jonnx_narrowed", default=None)

# Raised by shape arithmetic on symbolic dimensions. jax.errors names it in newer jax; jax 0.8
# (the declared minimum) has it in jax.core only, and there a bare jax.errors lookup in the
# except clause below turned every op body's failure into an AttributeError.
_INCONCLUSIVE_DIMENSION = (
    getattr(jax.errors, "InconclusiveDimensionOperation", None) or jax.core.InconclusiveDimensionOperation
)


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """Per-call settings shared by every node of a run.

    Attributes:
        train: True (training everywhere), False (inference everywhere) or None (each node
            as the graph says); see ``OpContext.train``.
        key: the run's PRNG key; random ops get ``fold_in(key, node position)``.
        precision: ``jax.lax.Precision`` for matmul/conv, or None for JAX's default.
        state: names of the main graph's state values (running statistics): a node that
            runs in training mode returns their new values, which ``run_graph`` returns.
        memory_limit: the largest tensor, in bytes, a node may create (None: no limit).
        checked: emit ``checkify`` checks for out-of-range indices and division by zero.
        bodies: on the host (``Model``'s host nodes, concrete values, no trace): where loop
            bodies run compiled, once per shape, instead of node by node (:class:`LoopBodies`).
    """

    train: bool | None = None
    key: jax.Array | None = None
    precision: Any = None
    state: frozenset[str] = frozenset()
    memory_limit: int | None = None
    checked: bool = False
    bodies: LoopBodies | None = None


class LoopBodies:
    """Loop bodies compiled for the host, where a Loop runs unrolled on concrete values (a
    Loop whose scan outputs stack a data-dependent number of rows, moved there by ``Model``).

    Node by node, each iteration folds every body node on the host (an 8-node body: about 6 ms
    an iteration); compiled, an iteration is one call of the body's computation. A body runs
    compiled only where that is the same computation: its inputs and the outer values it
    reads are arrays (no sequences, optionals or strings) whose values are known (under
    ``jax.grad`` outside jit, the compiled body and its compiled pullback, as a custom_vjp;
    forward mode and higher derivatives run node by node), none needed at trace time (a
    shape, also one found only while tracing), not in checked mode; and at most
    ``MAX_SIGNATURES`` shapes per body (a state that grows every iteration would compile
    every iteration). Under ``jax.grad`` a 9-node body with an (8, 64) x (64, 64) MatMul took
    1.5 ms an iteration so, 2.5 ms node by node.
    """

    MAX_SIGNATURES = 16

    @dataclasses.dataclass
    class _Body:
        fn: Any  # the compiled body, or None once it is known to run node by node
        needed: frozenset[str]  # names the body needs at trace time
        signatures: set = dataclasses.field(default_factory=set)

    def __init__(self) -> None:
        self._bodies: dict[tuple, LoopBodies._Body] = {}

    def __len__(self) -> int:
        """How many (body, settings) pairs run compiled."""
        return sum(b.fn is not None for b in self._bodies.values())

    def run(
        self, sub: Graph, inputs: Mapping[str, Any], scope: Mapping[str, Any], options: RunOptions, key
    ) -> tuple | None:
        """``sub``'s outputs, computed by its compilation; None where it does not apply."""
        if options.checked:
            return None
        outer = {n: scope[n] for n in sub.outer_names if n in scope}
        if not all(_is_array(v) for v in (*inputs.values(), *outer.values())):
            return None
        entry_key = (id(sub), options.train, options.precision, options.state, options.memory_limit)
        body = self._bodies.get(entry_key)
        if body is None:
            body = self._bodies[entry_key] = self._Body(_compiled_body(sub, options), static_values(sub))
        if body.fn is None or body.needed & (set(inputs) | set(outer)):
            return None
        signature = tuple((n, np.shape(v), v.dtype) for n, v in (*inputs.items(), *sorted(outer.items())))
        if signature not in body.signatures:
            if len(body.signatures) >= self.MAX_SIGNATURES:
                return None
            body.signatures.add(signature)
        try:
            return body.fn(dict(inputs), outer, key)
        except errors.StaticValueError:
            # Found while tracing it: the body needs a value at trace time after all (an If
            # inside it on a carried value, whose branches differ in shape). Node by node,
            # each iteration sees its values.
            body.fn = None
            return None


def _compiled_body(sub: Graph, options: RunOptions) -> Any:
    """``sub`` as one compiled function of its inputs, the outer values it reads and a key;
    on ``jax.grad``'s tracers the compiled body and its compiled pullback as a custom_vjp
    (:func:`jonnx._jit.differentiable`)."""
    from jonnx._jit import differentiable, plain_jit  # the interpreter otherwise knows nothing of jit

    def body(values, outer_values, key):
        run_options = dataclasses.replace(options, key=key, bodies=None)
        return run_graph(sub, values, run_options, outer=outer_values)[0]

    def pullback(values, outer_values, key, cotangents):
        return (*jax.vjp(lambda v, o: body(v, o, key), values, outer_values)[1](cotangents), None)

    compiled = plain_jit(body)
    on_tracers = differentiable(compiled, plain_jit(pullback))

    def run(values, outer_values, key):
        tracers = [x for x in jax.tree_util.tree_leaves((values, outer_values)) if isinstance(x, jax.core.Tracer)]
        if not tracers:
            return compiled(values, outer_values, key)
        # One reverse-mode level only: the pullback is a top-level jit too, so a derivative of
        # it (grad of grad) runs node by node, as does forward mode, which a custom_vjp refuses.
        if any(isinstance(getattr(x, "primal", None), jax.core.Tracer) for x in tracers):
            return None
        try:
            return on_tracers(values, outer_values, key)
        except TypeError as e:
            if "forward-mode" not in str(e):
                raise
            return None

    return run


def _is_array(value: Any) -> bool:
    """A numeric numpy array or scalar, or a JAX array whose value is known: computed, or a
    tracer of ``jax.grad`` over it (outside any jit or vmap), not the abstract tracer of a
    trace (a Loop's scan, the caller's jit)."""
    if isinstance(value, (np.ndarray, np.generic)):
        return value.dtype != object
    return isinstance(value, jax.Array) and carries_value(value)


def _to_numpy(value: Any) -> Any:
    if value is None or isinstance(value, dict):  # a map (ZipMap's rows) holds Python values
        return value
    if isinstance(value, (list, tuple)):
        return type(value)(_to_numpy(v) for v in value)
    return np.asarray(value)


def run_graph(
    graph: Graph,
    values: Mapping[str, Any],
    options: RunOptions,
    outer: Mapping[str, Any] | None = None,
) -> tuple[tuple, dict[str, Any]]:
    """Evaluate ``graph``: its outputs in order, and the new values of state it updated.

    Args:
        graph: the graph to run.
        values: graph inputs and initializers by name (concrete or dynamic).
        options: the run's settings.
        outer: values of enclosing scopes that a subgraph may read.

    Returns:
        ``(outputs, updates)``: one value per graph output, and ``{state name: new value}``
        for the state values (``options.state``) that nodes running in training mode updated.
    """
    # A subgraph's own initializers are constants of that scope; the values given override
    # them (Model passes the main graph's params and constants explicitly).
    env: dict[str, Any] = {**(outer or {}), **graph.initializers, **values}
    if outer is not None:
        updates = run_nodes(graph, env, options, range(len(graph.nodes)))
    else:
        updates = run_main_nodes(graph, env, options, range(len(graph.nodes)), graph.output_names)
    outputs = tuple(env[o.name] for o in graph.outputs)
    return outputs, updates


def run_main_nodes(
    graph: Graph,
    env: dict[str, Any],
    options: RunOptions,
    positions: Sequence[int],
    leaving: Sequence[str],
) -> dict[str, Any]:
    """:func:`run_nodes` over the main graph (whole, or one compiled segment of it), with what
    a top-level run adds: progress (tracing a large model walks thousands of nodes in Python;
    short runs end within Progress's quiet time and show nothing), and one NarrowingWarning
    for the 64-bit values known at trace time that JAX would narrow wrongly with x64 off,
    checked where they enter traced nodes and in ``leaving`` (the values handed back, which
    become JAX arrays too).
    """
    tracing = any(isinstance(v, jax.core.Tracer) for v in env.values())
    progress = Progress(
        f"tracing graph {graph.name!r}" if tracing else f"running graph {graph.name!r}", len(positions), unit="nodes"
    )
    token = _NARROWED.set([])
    try:
        updates = run_nodes(graph, env, options, positions, progress=progress)
        if not jax.config.jax_enable_x64:
            producers = graph.producers()
            for name in leaving:
                _check_narrowing(producers.get(name), name, env[name], options)
            narrowed = _NARROWED.get()
            if narrowed:
                warnings.warn(_narrowing_summary(narrowed), errors.NarrowingWarning, stacklevel=3)
    except BaseException:
        progress.close(failed=True)
        raise
    finally:
        _NARROWED.reset(token)
    progress.close()
    return updates


def run_nodes(
    graph: Graph,
    env: dict[str, Any],
    options: RunOptions,
    positions: Sequence[int],
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Run the nodes of ``graph`` at ``positions`` (in order) over ``env``, which receives their
    outputs; returns the state updates, as :func:`run_graph` does.

    A node's random key folds in its position in the whole graph, so running a graph in
    segments (``jonnx._segments``) draws the same numbers as running it at once.
    """
    updates: dict[str, Any] = {}
    for index in positions:
        try:
            _step(graph, index, graph.nodes[index], env, options, updates)
        except errors.StaticValueError as e:
            # Each enclosing run overwrites it, so it ends naming the outermost graph's node:
            # the one Model.__call__ can move to the host.
            e.where = (graph, index)
            raise
        if progress is not None:
            progress.update()
    return updates


def _step(
    graph: Graph, index: int, node: Node, env: dict[str, Any], options: RunOptions, updates: dict[str, Any]
) -> None:
    """Run ``node`` (position ``index``) and store its outputs and state updates."""
    args = node.padded(tuple(env[name] if name else None for name in node.inputs))
    key = None
    if options.key is not None and (node.op.random or node.subgraphs):
        key = jax.random.fold_in(options.key, index if node.seed_index is None else node.seed_index)
    outputs = _run_node(graph, node, args, env, options, key)
    if len(outputs) < sum(1 for o in node.outputs if o):
        raise errors.NodeError(
            f"node {node.name!r} ({node.op_type}) returned {len(outputs)} outputs but the "
            f"model reads {len(node.outputs)}"
        )
    for name, value in zip(node.outputs, outputs):
        if name:
            env[name] = value
    if node.op.state_updates and node.trains(options.train):
        updates.update(_state_updates(node, outputs, options.state))


def _state_updates(node: Node, outputs: Sequence[Any], state: frozenset[str]) -> dict[str, Any]:
    """The new values a node in training mode gives for its state inputs (running statistics)."""
    found = {}
    for out, inp in node.op.state_updates.items():
        name = node.inputs[inp] if inp < len(node.inputs) else ""
        if name in state and out < len(outputs) and outputs[out] is not None:
            found[name] = outputs[out]
    return found


def _run_node(
    graph: Graph,
    node: Node,
    args: tuple,
    env: Mapping[str, Any],
    options: RunOptions,
    key: jax.Array | None,
) -> Sequence[Any]:
    op = node.op
    if any(isinstance(a, jax.Array) and not isinstance(a, jax.core.Tracer) for a in args):
        # Concrete jax arrays (an eager run's params, a segment's results) are known values.
        args = tuple(
            np.asarray(a)
            if i in node.static_inputs and isinstance(a, jax.Array) and not isinstance(a, jax.core.Tracer)
            else a
            for i, a in enumerate(args)
        )
    for i in node.static_inputs:
        if i < len(args) and not is_concrete(args[i]):
            raise errors.StaticValueError(_static_message(graph, node, i, env))
    fold = not op.random and not op.reads_graph and is_concrete(args) and not _reads_dynamic_outer(node, env)
    # Checked before promote_floats, which would narrow a float64 constant itself.
    if not fold and not jax.config.jax_enable_x64:
        # Static inputs stay on the host (Slice's INT64_MAX ends are fine), and so do
        # concrete prefer-static ones (Loop's INT64_MAX "no limit" trip count); the others
        # become JAX arrays of the 32-bit type.
        host = node.static_inputs | node.prefer_static
        for i, arg in enumerate(args):
            if i < len(node.inputs) and node.inputs[i] and i not in host:
                _check_narrowing(node, node.inputs[i], arg, options)
    # The one place the dtype rule applies: another float width where the schema wants one
    # type (a float16 or float64 input meeting float32 weights) computes in the common type.
    args = promote_floats(args, node.float_groups)

    def run_subgraph(sub: Graph, inputs: Mapping[str, Any], *, outer_env=None, iteration=None) -> tuple:
        sub_key = key
        if key is not None and iteration is not None:  # a fresh Dropout mask per iteration
            sub_key = jax.random.fold_in(key, jnp.asarray(iteration).astype(jnp.uint32))
        if options.bodies is not None and iteration is not None:
            # A view, not a merged copy: this runs once per iteration.
            outputs = options.bodies.run(sub, inputs, ChainMap(outer_env or {}, env), options, sub_key)
            if outputs is not None:
                return outputs
        # Statistics updated inside a body have no single new value; Model refuses to train
        # such a model (jonnx._state), so what a body's nodes return here is not state.
        outputs, _ = run_graph(
            sub, inputs, dataclasses.replace(options, key=sub_key), outer={**env, **(outer_env or {})}
        )
        return outputs

    ctx = OpContext(
        node=node.name,
        op_type=node.op_type,
        domain=node.domain,
        opset=node.opset,
        train=options.train,
        key=key if op.random else None,
        precision=options.precision,
        n_outputs=len(node.outputs),
        run_graph=run_subgraph,
        graph=graph,
        checked=options.checked,
    )
    if fold and _holds_symbolic(args):
        # Shape arithmetic on symbolic dims (jax.export) folds in numpy object arrays; an op
        # that makes a tensor of a symbolic shape (ConstantOfShape, Range) must be traced.
        try:
            with jax.enable_x64(True), jax.ensure_compile_time_eval():
                return _to_numpy(op.fn(args, node.attrs, ctx))
        except Exception:  # noqa: BLE001 -- run it traced below, which reports its own errors
            fold = False
    try:
        if fold and (node.on_host or node.subgraphs or _reads_strings(args)):
            # Run directly, not traced first as below. A host op given concrete inputs computes
            # in numpy (NonMaxSuppression, NonZero, Unique, Compress, the string ops): a trace
            # would only wrap its result, and a segmented model runs it on every call (the
            # trace was a sixth of a small detector's call; ZipMap's, which fails on its dicts,
            # 1.7 ms of a 15-row scikit-learn classifier's 1.8). Control flow's bodies fold node
            # by node (on the host a loop's body runs compiled, LoopBodies); traced whole, a
            # loop would be traced through every iteration only to be run again. A node that
            # reads strings computes them in numpy too, and one that makes strings cannot be
            # traced at all: its trace and the size prediction each failed through JAX's
            # error handling (1-3 ms apiece), which made a scikit-learn classifier's string
            # labels cost 5-7 ms of every call against 0.1 ms for the rest.
            with jax.enable_x64(True), jax.ensure_compile_time_eval():
                return _to_numpy(op.fn(args, node.attrs, ctx))
        if fold:
            with jax.enable_x64(True):
                # In numpy where the node's primitives allow (jonnx/_host_fold.py: nothing
                # compiles), else eagerly in JAX. The trace gives the output sizes first.
                traced = host_fold.trace(lambda: op.fn(args, node.attrs, ctx))
                if options.memory_limit is not None and args and not node.on_host:
                    # Folding allocates now: learn the output sizes first, abstractly. A node
                    # without inputs (Constant) only hands over what its attributes already
                    # hold; random ops, which size from attributes, are never folded. Host
                    # ops (NonZero, NMS, ...) run in numpy on every segmented call, make
                    # outputs no larger than their inputs, and cannot run abstractly.
                    predicted = traced.shapes if traced is not None else _predict(node, args, ctx)
                    _check_memory(node, predicted, options.memory_limit)
                folded = None if traced is None else host_fold.evaluate(traced)
                if folded is not None:
                    return folded
                with jax.ensure_compile_time_eval():
                    return _to_numpy(op.fn(args, node.attrs, ctx))
        outputs = op.fn(args, node.attrs, ctx)
        if options.memory_limit is not None:
            # Under jit these are tracers: nothing is allocated until the whole graph runs.
            _check_memory(node, outputs, options.memory_limit)
        return outputs
    except errors.JonnxError:
        raise
    except _INCONCLUSIVE_DIMENSION as e:
        # jax.export with symbolic dims: this node needs a concrete number where the value
        # is a symbolic dimension (a shape read as data, a size compared with a constant).
        raise errors.StaticValueError(
            f"{ctx.where()} needs a concrete value where the input shapes hold symbolic "
            f"dimensions ({str(e).splitlines()[0]}); its inputs are "
            f"{[n for n in node.inputs if n]}. Bound the dimensions it compares "
            "(jax.export.symbolic_shape(..., constraints=['t <= 64'])), export with concrete "
            "sizes for the dimensions it reads, or run it with jax.jit on concrete shapes."
        ) from e
    except Exception as e:  # an op body's own failure: name the node and keep the cause
        raise errors.NodeError(f"{ctx.where()}: {type(e).__name__}: {e}") from e


def _predict(node: Node, args: tuple, ctx: OpContext) -> Any:
    """Output shapes and dtypes of a node about to be folded, without running it.

    Static inputs and host values stay concrete; the rest become abstract. An op that cannot
    run abstractly (it needs a value at trace time that it does not declare) gives None.
    """
    abstract = [
        i for i, a in enumerate(args) if isinstance(a, np.ndarray) and a.dtype != object and i not in node.static_inputs
    ]

    def run(*values):
        full = list(args)
        for i, v in zip(abstract, values):
            full[i] = v
        return node.op.fn(tuple(full), node.attrs, ctx)

    try:
        return jax.eval_shape(run, *[args[i] for i in abstract])
    except Exception:  # noqa: BLE001 -- no prediction; the op itself reports its own errors
        return None


_INT32, _UINT32, _FLOAT32 = np.iinfo(np.int32), np.iinfo(np.uint32), np.finfo(np.float32)


def narrowing(value: Any) -> tuple[Any, str] | None:
    """``(offending value, 32-bit type)`` when JAX would narrow the 64-bit numpy ``value``
    wrongly with x64 off (an integer outside the 32-bit range wraps, a float64 beyond float32's
    range becomes infinite), else None. Values that fit lose nothing that matters: float64
    rounds to float32 as everywhere in JAX without x64."""
    if not isinstance(value, (np.ndarray, np.generic)) or value.size == 0:
        return None
    if value.dtype == np.int64:
        lo, hi = value.min(), value.max()
        bad = hi if hi > _INT32.max else lo if lo < _INT32.min else None
        return None if bad is None else (bad, "int32")
    if value.dtype == np.uint64:
        hi = value.max()
        return None if hi <= _UINT32.max else (hi, "uint32")
    if value.dtype == np.float64:
        finite = np.abs(value[np.isfinite(value)])
        big = finite.max() if finite.size else 0.0
        return None if big <= _FLOAT32.max else (big, "float32")
    return None


def narrowing_advice(what: str) -> str:
    return (
        f"{what}: with jax_enable_x64 off JAX would narrow it silently. Enable x64 "
        "(jax.config.update('jax_enable_x64', True), or `with jax.enable_x64(True):`)."
    )


def _check_narrowing(node: Node | None, name: str, value: Any, options: RunOptions) -> None:
    """Record (or, in checked mode, raise on) a trace-time value JAX would narrow wrongly."""
    if isinstance(value, list):
        for v in value:
            _check_narrowing(node, name, v, options)
        return
    found = narrowing(value)
    if found is None:
        return
    where = f"node {node.name!r} ({node.op_type})" if node is not None else "the graph"
    what = (
        f"{where} value {name!r} ({value.dtype}, shape {list(value.shape)}) holds {found[0]}, which "
        f"{found[1]} cannot hold"
    )
    if options.checked:
        raise errors.NumericCheckError(narrowing_advice(what))
    narrowed = _NARROWED.get()
    if narrowed is not None and what not in narrowed:
        narrowed.append(what)


def _narrowing_summary(narrowed: list[str]) -> str:
    shown = "\n".join(f"  {w}" for w in narrowed[:10])
    more = f"\n  ... and {len(narrowed) - 10} more" if len(narrowed) > 10 else ""
    return (
        f"with jax_enable_x64 off, {len(narrowed)} 64-bit value(s) known at trace time do not fit "
        f"the 32-bit types JAX holds them in; integers wrap and floats become infinite:\n{shown}{more}\n"
        "Enable x64 (jax.config.update('jax_enable_x64', True), or `with jax.enable_x64(True):`), "
        "or load with checked=True to make this an error."
    )


def _check_memory(node: Node, outputs: Any, limit: int) -> None:
    for leaf in jax.tree_util.tree_leaves(outputs):
        shape, dtype = getattr(leaf, "shape", None), getattr(leaf, "dtype", None)
        if shape is None or dtype is None or dtype == np.dtype(object):
            continue
        size = _constant_size(shape)
        if size is None:
            # A symbolic size (jax.export with symbolic dims) is known only when the exported
            # function runs; it grows with the caller's own inputs, which they allocated.
            continue
        size *= np.dtype(dtype).itemsize
        if size > limit:
            raise errors.MemoryLimitError(
                f"node {node.name!r} ({node.op_type}) would create a tensor of shape "
                f"{tuple(shape)} ({dtype}, {size:,} bytes), over the model's memory limit of "
                f"{limit:,} bytes; pass a larger memory_limit to jonnx.load if this is intended"
            )


def _reads_strings(args: Sequence[Any]) -> bool:
    """Whether an argument is a string tensor: an object array (``_run_node`` has taken those of
    symbolic dims aside before asking)."""
    return any(isinstance(a, np.ndarray) and a.dtype == object for a in args)


def _holds_symbolic(args: Sequence[Any]) -> bool:
    """Whether a concrete argument holds symbolic dims (an object array from Shape)."""
    for a in args:
        if isinstance(a, list) and _holds_symbolic(a):
            return True
        if not isinstance(a, np.ndarray) or a.dtype != object or not a.size:
            continue
        # A string tensor (Shape never makes strings): not scanned, since scanning 10,000 labels
        # took most of a string-label classifier's call.
        if isinstance(a.flat[0], (str, bytes)):
            continue
        if any(jax.export.is_symbolic_dim(v) for v in a.reshape(-1)):
            return True
    return False


def _constant_size(shape: Sequence[Any]) -> int | None:
    """The element count of ``shape``, or None when a dim is symbolic (``jax.export``)."""
    size = 1
    for d in shape:
        if not isinstance(d, (int, np.integer)):
            try:
                d = operator.index(d)
            except Exception:  # noqa: BLE001 -- a symbolic dim refuses to become an int
                return None
        size *= int(d)
    return size


def _reads_dynamic_outer(node: Node, env: Mapping[str, Any]) -> bool:
    return any(not is_concrete(env.get(n)) for g in node.subgraphs for n in g.outer_names)


def _static_message(graph: Graph, node: Node, index: int, env: Mapping[str, Any]) -> str:
    """Explain which chain of values made a static input dynamic."""
    producers = graph.producers()
    name = node.inputs[index]
    chain = [f"{name!r}"]
    seen = set()
    while name in producers and name not in seen:
        seen.add(name)
        producer = producers[name]
        chain.append(f"{producer.op_type} node {producer.name!r}")
        dynamic = [i for i in producer.inputs if i and not is_concrete(env.get(i))]
        if not dynamic:
            break
        name = dynamic[0]
        chain.append(f"{name!r}")
    if name in graph.input_names:
        chain.append(f"an input of graph {graph.name!r}, which is traced")
        hint = (
            f"pass {name!r} as a concrete numpy array outside jax.jit, or use Model.__call__, "
            "which treats it as a static argument"
        )
    elif name in graph.initializers:
        chain.append("a trainable initializer")
        hint = "this initializer should have been kept static; please report this model"
    else:
        hint = "the value depends on runtime data, which jonnx cannot turn into a static shape"
    if node.on_host:
        # Model.apply does not segment; Model.__call__ does, and differentiates with params=.
        hint = (
            f"{node.op_type}'s output shape depends on these values, so Model.apply cannot run "
            "it on traced data: call the model itself, `model(*inputs)`, which runs it on the "
            "host between compiled segments (under jax.grad, outside jax.jit: "
            "`model(*inputs, params=p)`), or load it with size_bounds= where the op has a "
            "bounded mode (docs/dynamic_shapes.md)"
        )
    return (
        f"node {node.name!r} ({node.op_type}, domain {node.domain or 'ai.onnx'!r}, opset "
        f"{node.opset}) needs input {index} ({node.inputs[index]!r}) at trace time, but it is "
        f"dynamic: {' <- '.join(chain)}. {hint[0].upper() + hint[1:]}."
    )

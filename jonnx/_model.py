"""``jonnx.load`` and the :class:`Model` it returns."""

from __future__ import annotations

import dataclasses
import functools
import os
import types
import warnings
import weakref
from collections.abc import Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import onnx.defs
from google.protobuf.message import DecodeError
from jax.experimental import checkify
from jax.sharding import Mesh, NamedSharding

from jonnx import _chunks, errors, optimize as optimization
from jonnx._bounded import bound_sizes
from jonnx._build import GraphBuilder, default_memory_limit
from jonnx._export import copy_except, detach_initializers, inline_external, serialize_with
from jonnx._interpreter import LoopBodies, RunOptions, narrowing, narrowing_advice, run_graph, run_main_nodes, run_nodes
from jonnx._ir import Graph, ValueInfo
from jonnx._jit import (
    DotChoosingJit,
    differentiable,
    plain_jit,
    release_freed_memory,
    signature,
    tracing_into_jaxpr,
)
from jonnx._progress import Progress
from jonnx._registry import normalize_domain
from jonnx._segments import SegmentPlan, Stage, plan_segments, weight_only_nodes
from jonnx._state import StatePlan, plan_state
from jonnx._static import preferred_static_inputs, setting_values, static_values
from jonnx._values import carries_value, concrete_or_error
from jonnx._wire import InlineData, WireError, read_model
from jonnx.sharding import Rules, param_specs

__all__ = ["Model", "load"]

_TRAINABLE = (np.float16, np.float32, np.float64, jnp.bfloat16)


DEFAULT_MEMORY_LIMIT = default_memory_limit()


def load(
    f: str | os.PathLike | bytes | onnx.ModelProto,
    *,
    base_dir: str | None = None,
    memory_limit: int | None = DEFAULT_MEMORY_LIMIT,
    checked: bool = False,
    allow_newer_opset: bool = False,
    allow_unknown_attributes: bool = False,
    mesh: Mesh | None = None,
    rules: Rules = None,
    size_bounds: Mapping[str, int | None] | None = None,
    optimize: bool | Mapping[str, bool] = True,
) -> Model:
    """Load an ONNX model as a :class:`Model`.

    Args:
        f: a path to an ``.onnx`` file, its bytes, or an ``onnx.ModelProto``.
        base_dir: the folder external data is read from; defaults to the model file's folder
            (and to none for bytes and protos, whose external data is then refused).
        memory_limit: the largest tensor, in bytes, any node may create (default: half the
            machine's memory; None for no limit). Checked when the model is traced, before
            anything that large is allocated: a node over it raises
            :class:`~jonnx.errors.MemoryLimitError`.
        checked: check runtime data that ONNX calls an error and JAX would pass silently:
            out-of-range Gather/GatherElements/GatherND/Scatter* indices and integer Div/Mod
            by zero raise :class:`~jonnx.errors.NumericCheckError`, under ``jit`` too (via
            ``jax.experimental.checkify``; it costs a little speed). The fast default clamps
            gather indices, drops out-of-range scatter updates and gives XLA's integer
            division by zero (-1), as JAX does; values known at trace time are checked
            either way.
        allow_newer_opset: run a model whose ai.onnx opset is newer than the installed onnx
            package knows with the newest known semantics (and a warning) instead of refusing.
        allow_unknown_attributes: load a model whose nodes set attributes their operator's
            schema (at the model's opset) does not declare, such as ``broadcast=1`` left on an
            opset-13 ``Add``, ignoring them with a warning. By default they are a
            :class:`~jonnx.errors.ModelStructureError` listing every such node and attribute,
            as onnxruntime refuses them too.
        mesh: a ``jax.sharding.Mesh`` to place the parameters and running statistics on
            (default: none, the default device). See :mod:`jonnx.sharding` and docs/scaling.md.
        rules: how each weight is split over ``mesh``: a rule set from :mod:`jonnx.sharding`
            (``replicated()``, ``fsdp(axis)``, ``tensor_parallel(axis)``), the name of one, or
            ``(name pattern, PartitionSpec)`` pairs; default: replicated.
        size_bounds: bounded mode for ops whose output shape depends on values: node name or
            op type -> the output's row count (None: the op's natural bound). Those nodes then
            run traced with a static output size, valid rows first and then rows of -1, so the
            whole model is one XLA computation under your own ``jax.jit`` (TPU, ``jax.export``).
            Supported: NonMaxSuppression (``max_output_boxes_per_class`` x classes x batches by
            default), NonZero (the input's size), Compress (zero-padded, plus a graph output
            ``<output>_count``) and Unique (the input's size). See docs/dynamic_shapes.md.
        optimize: graph passes and compilation choices (``jonnx.optimize``): True (the
            default), False (none), or ``{name: bool}`` with names from
            ``jonnx.optimize.PASSES`` (``fold_batchnorm``, ``fuse_matmuls``,
            ``quantized_convs``, ``channels_last``, ``dead_nodes``, ``string_labels``),
            ``constant_weights`` (``Model(*inputs)``
            compiles the model's own weights in as constants; ``apply`` always takes them as
            arguments) and ``batch_chunks`` (``Model(*inputs)`` runs a large batch in chunks
            of rows where XLA would map its temporaries afresh on every call and the rows
            stay apart, ``jonnx._chunks``). Switches left out are on, except
            ``constant_weights`` (on only when named), ``fold_batchnorm`` and ``fuse_matmuls`` (on when ``constant_weights`` is,
            unless named: with weights as arguments they would keep a second copy of the
            weights they rewrite, for no speed) and, in ``apply``, ``channels_last`` (on only
            when named). Nodes that only transform weights (channels-last kernels, folded
            BatchNorm, fused Q/K/V) run once per model in ``Model(*inputs)``. Results are the
            same either way, up to float rounding. See docs/performance.md.

    Returns:
        The loaded model, with every node bound to its implementation.

    Raises:
        jonnx.errors.LoadError: the file cannot be read or parsed, a tensor is malformed,
            or external data is unsafe (:class:`~jonnx.errors.ExternalDataError`).
        jonnx.errors.UnsupportedOpError: one error listing every unsupported node.
        jonnx.errors.ModelStructureError: the graph is malformed.

    Example:
        >>> import numpy as np, onnx.helper as oh, jonnx
        >>> node = oh.make_node("Relu", ["x"], ["y"])
        >>> graph = oh.make_graph([node], "g", [oh.make_tensor_value_info("x", 1, [2])],
        ...                       [oh.make_tensor_value_info("y", 1, [2])])
        >>> model = jonnx.load(oh.make_model(graph))
        >>> model(np.array([-1.0, 2.0], np.float32))[0].tolist()
        [0.0, 2.0]
    """
    options = {
        "memory_limit": memory_limit,
        "checked": checked,
        "allow_newer_opset": allow_newer_opset,
        "allow_unknown_attributes": allow_unknown_attributes,
        "mesh": mesh,
        "rules": rules,
        "size_bounds": size_bounds,
        "optimize": optimize,
    }
    if isinstance(f, onnx.ModelProto):
        return Model(f, base_dir=base_dir, **options)
    if isinstance(f, (bytes, bytearray, memoryview)):
        return Model(parse_model(bytes(f), "<bytes>"), base_dir=base_dir, _owned=True, **options)
    if not isinstance(f, (str, os.PathLike)):
        raise TypeError(f"jonnx.load takes a path, bytes or onnx.ModelProto, not {type(f).__name__}")
    path = os.fspath(f)
    if base_dir is None:
        base_dir = os.path.dirname(os.path.abspath(path))
    try:
        # The initializers' bytes go from the file into their arrays one at a time, never
        # through a parsed protobuf (jonnx._wire).
        proto, inline = read_model(path)
    except WireError:
        inline = None
    except OSError as e:
        raise errors.LoadError(f"cannot read model file {path!r}: {e.strerror}") from e
    if inline is not None and not proto.HasField("graph"):
        inline.close()  # not a model: the ordinary parse says why
        inline = None
    if inline is None:
        try:
            with open(path, "rb") as fh:
                data = fh.read()
        except OSError as e:
            raise errors.LoadError(f"cannot read model file {path!r}: {e.strerror}") from e
        proto = parse_model(data, repr(path))
        del data
    try:
        return Model(proto, base_dir=base_dir, _owned=True, _inline=inline, **options)
    finally:
        if inline is not None:
            inline.close()


def parse_model(data: bytes, what: str) -> onnx.ModelProto:
    if not data:
        raise errors.LoadError(f"{what} is empty, not an ONNX model")
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except (DecodeError, ValueError, RuntimeError) as e:
        raise errors.LoadError(f"{what} is not a valid ONNX protobuf: {e}") from e
    if not proto.HasField("graph"):
        raise errors.LoadError(f"{what} holds no graph: not an ONNX model")
    return proto


def _opsets(proto: onnx.ModelProto, allow_newer_opset: bool) -> dict[str, int]:
    opsets = {normalize_domain(o.domain): int(o.version) for o in proto.opset_import}
    # Models from before opset_import existed (IR version < 3) mean opset 1.
    opsets.setdefault("", 1)
    newest = onnx.defs.onnx_opset_version()
    if opsets[""] > newest:
        message = (
            f"the model imports ai.onnx opset {opsets['']}, newer than the {newest} the installed onnx package knows"
        )
        if not allow_newer_opset:
            # Ops may have changed meaning in the newer opset: running it with older semantics
            # could be silently wrong, so it takes an explicit choice.
            raise errors.UnsupportedOpError(
                f"{message}; upgrade onnx, or pass allow_newer_opset=True to run it with opset {newest} semantics",
                nodes=(("<model>", "<opset>", "", opsets[""]),),
            )
        warnings.warn(f"{message}; running it with opset {newest} semantics", stacklevel=4)
        opsets[""] = newest
    return opsets


def _is_trainable(value: np.ndarray) -> bool:
    return value.dtype in {np.dtype(t) for t in _TRAINABLE}


class _Static:
    """A numpy array (or a list of them) as a hashable static argument of ``jax.jit``.

    Hashed by content: only values a segment needs at trace time (shapes, counts, strings)
    are passed this way, never tensor data.
    """

    __slots__ = ("value", "_key")

    def __init__(self, value: Any):
        self.value = value
        self._key = _content_key(value)

    def __hash__(self) -> int:
        return hash(self._key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Static) and self._key == other._key


class Model:
    """An ONNX model as a pure JAX function.

    Use :func:`jonnx.load` to make one. ``Model.apply`` is the pure function (for ``jax.jit``,
    ``jax.grad``, ``jax.vmap``); calling the model runs it jit-compiled.

    Attributes:
        proto: the model's ``onnx.ModelProto`` *without its main graph's initializer data*
            (names, types and dims stay): the values live in the graph IR, :attr:`params` and
            :attr:`state`, so the model never holds its weights twice. ``jonnx.save`` writes
            them back.
        graph: the model's graph IR.
        mesh: the ``jax.sharding.Mesh`` the weights were placed on, or None.
        shardings: for a model placed on a mesh, the ``NamedSharding`` of each parameter and
            running statistic by name (empty otherwise).
        opsets: the model's opset per domain.
        base_dir: the folder the model's external data was read from (None for bytes/protos).
        memory_limit: the largest tensor, in bytes, a node may create (None: no limit).
        checked: checked mode (see :func:`load`). ``apply`` then emits ``checkify`` checks:
            under your own ``jax.jit`` wrap it in ``jax.experimental.checkify.checkify``;
            calling the model does that itself and raises NumericCheckError.
        input_names: the graph inputs, in order (initializer-backed inputs excluded).
        output_names: the graph outputs, in order.
        state_plan: where each running statistic (:attr:`state` entry) starts from, and the
            stateful nodes whose statistics cannot be kept as state (``jonnx._state``).
        static_input_names: inputs that :meth:`apply` needs known at trace time (they feed a
            shape, axes, a count, strings, or a host op such as NonZero), or that directly drive
            control flow (If's condition, Loop's trip count). ``__call__`` passes those its
            segments need at trace time as static arguments (one compilation per distinct
            value) and hands the inputs of host ops to the host instead (see
            :attr:`segment_plan`).
        segment_plan: how ``__call__`` splits the graph into compiled segments with host nodes
            between them (``jonnx._segments``; docs/dynamic_shapes.md).
    """

    def __init__(
        self,
        proto: onnx.ModelProto,
        *,
        base_dir: str | None = None,
        memory_limit: int | None = DEFAULT_MEMORY_LIMIT,
        checked: bool = False,
        allow_newer_opset: bool = False,
        allow_unknown_attributes: bool = False,
        mesh: Mesh | None = None,
        rules: Rules = None,
        _owned: bool = False,
        _inline: InlineData | None = None,
        size_bounds: Mapping[str, int | None] | None = None,
        optimize: bool | Mapping[str, bool] = True,
    ):
        # The switches of Model(*inputs) with the model's own weights; apply's leave the passes
        # that pay only there off unless named (jonnx.optimize.CALL_ONLY).
        self.optimize = optimization.resolve(optimize)
        self._apply_optimize = optimization.resolve(optimize, call=False)
        self.checked = checked
        self.base_dir = base_dir
        self.memory_limit = memory_limit
        # Every keyword option, so that a pickled model loads again the same way.
        self._load_options = dict(
            base_dir=base_dir,
            memory_limit=memory_limit,
            checked=checked,
            allow_newer_opset=allow_newer_opset,
            allow_unknown_attributes=allow_unknown_attributes,
            size_bounds=None if size_bounds is None else dict(size_bounds),
            optimize=optimize if isinstance(optimize, bool) else dict(optimize),
        )
        self.opsets = _opsets(proto, allow_newer_opset)
        progress = Progress("loading model")
        builder = GraphBuilder(
            self.opsets,
            base_dir,
            functions=proto.functions,
            memory_limit=memory_limit,
            allow_unknown_attributes=allow_unknown_attributes,
            inline=_inline,
        )
        graph = builder.graph(proto.graph)
        builder.raise_if_unsupported()
        # The weights live in the graph IR (and params) now: keep the proto without them, so
        # that the model never holds two copies (jonnx.save and pickling put them back).
        self.proto = _strip_initializers(proto, in_place=_owned)
        del proto

        # Running statistics become state entries named after the value each node reads; the
        # Identity nodes an exporter routes them through are dropped (see jonnx._state).
        self.state_plan: StatePlan = plan_state(graph)
        self.graph: Graph = self.state_plan.graph
        if size_bounds:
            self.graph = bound_sizes(self.graph, size_bounds)
        static = static_values(self.graph, segmented=True)
        inits = dict(self.graph.initializers)
        # Constants: what must be static, non-float weights, and the ops' settings (a Clip's
        # bounds, Dropout's ratio: jonnx._static.setting_values); the rest trains.
        constant = static | setting_values(self.graph)
        self._constants = {n: v for n, v in inits.items() if n in constant or not _is_trainable(v)}
        # jax.device_put, not jnp.asarray (which copies twice): on CPU it adopts a 64-byte
        # aligned numpy buffer (what loading reads weights into) without any copy. Weights
        # keep their stored dtype (bfloat16 and float16 stay half size).
        self._state = {s.key: _narrowed(s.source, inits[s.source], graph, checked) for s in self.state_plan.slots}
        # An initializer that only fed a dropped Identity is read by nothing now: not a param.
        unread = {s.source for s in self.state_plan.slots if s.via} - _read_names(self.graph)
        self._params = {
            n: _narrowed(n, v, graph, checked)
            for n, v in inits.items()
            if n not in self._constants and n not in self._state and n not in unread
        }
        # Placement rules see the weights' shapes (and the graph) before anything is placed.
        self.mesh = mesh
        specs = param_specs(self, mesh, rules) if mesh is not None else {}
        self.shardings: dict[str, NamedSharding] = {n: NamedSharding(mesh, s) for n, s in specs.items()}
        for table in (self._state, self._params):
            for n in table:
                # One at a time, and the IR then holds the device array: where device_put has
                # to copy (a split, an unaligned buffer), the numpy value is released before the
                # next one is placed.
                table[n] = jax.device_put(table[n], self.shardings.get(n))
                if table is self._params:
                    inits[n] = table[n]
        self.graph = dataclasses.replace(self.graph, initializers=types.MappingProxyType(inits))
        self.state_plan = dataclasses.replace(self.state_plan, graph=self.graph)
        del graph, inits
        self.input_names = self.graph.input_names
        self.output_names = self.graph.output_names
        # How __call__ runs the graph: compiled segments, with the nodes whose output shapes
        # depend on values (NonZero, NonMaxSuppression, string labels) on the host between them.
        # Integer and bool graph inputs, and scalars, that feed a static chain are shape-like
        # (sizes, axes, flags, Range's bounds): static arguments, so what the graph computes
        # from them stays concrete. A float tensor reaching a static slot (a TopK k computed
        # from scores) is data: the graph is cut there instead, and only the computed value
        # is static.
        shape_like = {
            v.name
            for v in self.graph.inputs
            if v.name in static
            and (
                (v.dtype is not None and v.dtype.kind in "biu")
                or (v.shape is not None and all(d == 1 for d in v.shape))
            )
        }
        # __call__ runs the graph through the passes (jonnx.optimize), in the graph's own mode;
        # the values passes add (epsilons, shapes, split sizes) are constants. Its weight-only
        # nodes run once (below), except with sharded weights or in checked mode, where it
        # takes apply's passes.
        self._run_graphs: dict[bool | None, Graph] = {}
        once = mesh is None and not checked
        self._call_graph = optimization.optimize(self.graph, self.optimize if once else self._apply_optimize, None)
        self._constants.update(
            (n, v) for n, v in self._call_graph.initializers.items() if n not in self.graph.initializers
        )
        # Nodes that only transform the weights (BatchNorm folded into a Conv, fused Q/K/V,
        # relayouts) give the same values on every call with the model's own weights: they run
        # once, before the segments, which take their results as weights. Not with the weights
        # as constants (they fold while tracing anyway), sharded weights (a prepared copy could
        # be gathered whole) or checked mode (its checks cover every node).
        weights = set(self._params) | set(self._state)
        prepare = once and not self.optimize["constant_weights"]
        self._prepared_nodes = weight_only_nodes(self._call_graph, weights, self._constants) if prepare else ()
        prepared_names = {o for p in self._prepared_nodes for o in self._call_graph.nodes[p].outputs if o}
        self._plan = functools.partial(
            plan_segments, self._call_graph, self._constants, weights | prepared_names, shape_like, self._prepared_nodes
        )
        self._forced_host: frozenset[int] = frozenset()  # nodes found to need the host (__call__)
        # Values found to be strings (host values): string graph inputs, and what host nodes
        # turn out to return as strings (__call__). The nodes reading them run on the host.
        self._host_values = frozenset(v.name for v in self.graph.inputs if v.dtype == np.dtype(object))
        # Map inputs (ai.onnx.ml) come as dicts of Python values: bind gives them their
        # declared value type, as it cannot be told from the values (a float is float32 or 64).
        self._map_inputs = {v.name: v.dtype for v in self.graph.inputs if v.kind == "map" and v.dtype is not None}
        self._loop_bodies = LoopBodies()  # the bodies of loops run on the host, compiled
        self.segment_plan: SegmentPlan = self._plan(host_values=self._host_values)
        # What the segments and the graph outputs read of them.
        read_later = set(self.output_names) | {
            r for p, n in enumerate(self._call_graph.nodes) if p not in set(self._prepared_nodes) for r in n.reads
        }
        self._prepared_exports = tuple(sorted(prepared_names & read_later))
        self._prepared: dict[str, jax.Array] | None = None  # computed at the first call
        # Given params' prepared weights, kept while those arrays live (_prepared_weights).
        self._prepared_given: dict[str, list] = {}
        self._prepare = plain_jit(self._prepare_impl)
        # What apply needs concrete: every static chain's graph inputs, host ops' included,
        # and the string inputs (here still exactly the known host values).
        traced_apply = static_values(self.graph) | preferred_static_inputs(self.graph)
        self.static_input_names = tuple(n for n in self.input_names if n in traced_apply or n in self._host_values)
        # Strings live on the host as numpy object arrays and cannot leave a jitted function.
        # A segment's strings are known at trace time, so they depend only on what its cache
        # key holds (static arguments, shapes): the trace records them here, under that key.
        self._segment_host_values: dict[Any, dict[str, Any]] = {}
        run = self._segment_impl
        if checked:
            run = checkify.checkify(run, errors=checkify.user_checks)
        # With params given (Model(x, params=p), jax.grad over it) segments take them as arguments.
        # Each segment runs its dots in YNNPACK or in XLA's own emitter, chosen per input
        # signature (DotChoosingJit: XLA's where nearly all the dot work is on many rows).
        self._segments_params = DotChoosingJit(
            run,
            lambda stage, params, dynamic, static, key: _segment_signature(stage, static, dynamic),
            static_argnums=(0, 3),
        )
        if self.optimize["constant_weights"] and mesh is None:
            # The model's own weights as trace-time constants (numpy views of the CPU arrays):
            # nodes that only transform weights (BatchNorm folding, fused Q/K/V weights) fold
            # while tracing, and XLA specializes on the rest. Sharded weights stay arguments.
            weights = {n: np.asarray(v) if jax.default_backend() == "cpu" else v for n, v in self._params.items()}
            self._segments = _WithoutParams(
                DotChoosingJit(
                    lambda stage, dynamic, static, key: run(stage, weights, dynamic, static, key),
                    lambda stage, dynamic, static, key: _segment_signature(stage, static, dynamic),
                    static_argnums=(0, 2),
                )
            )
        else:
            self._segments = self._segments_params
        self._compiled_segment = self._segments.compiled
        # Per segment signature, the stage as it runs: in chunks of rows where its
        # temporaries would be mapped afresh on every call (_chunked). Decided on the CPU, for
        # weights not placed on a mesh, outside checked mode.
        self._run_stages: dict[Any, Stage] = {}
        self._chunks_apply = (
            self.optimize["batch_chunks"] and not checked and mesh is None and jax.default_backend() == "cpu"
        )
        # Per segment signature less the batch: a batch and its compiled temporaries' size,
        # from which another batch's is estimated (_temporaries).
        self._temporaries_seen: dict[Any, tuple[int, int]] = {}
        self._inference_stages: dict[Stage, Stage] = {}  # per plan stage, its train=False copy
        # Under jax.grad (outside jit) a segment is a custom_vjp whose forward is the compiled
        # segment above, run on the tracers' concrete values, and whose backward is this
        # (compiled per shape too; it recomputes the forward rather than keep its residuals).
        self._segment_vjp = plain_jit(self._segment_vjp_impl, static_argnums=(0, 3))
        n_values = sum(int(np.prod(p.shape)) for p in self._params.values())
        progress.close(summary=f"{len(self.graph.nodes)} nodes, {n_values:,} parameter values")

    def __reduce__(self) -> tuple:
        # Pickled as the graph without its weights plus the weights as numpy arrays (the
        # model's own values, external data included), rebuilt by loading: the graph IR holds
        # read-only mappings and the compiled functions, neither of which pickles.
        return _unpickle, _pickle_parts(self)

    def __repr__(self) -> str:
        n_values = sum(int(np.prod(p.shape)) for p in self._params.values())
        return (
            f"Model(inputs={list(self.input_names)}, outputs={list(self.output_names)}, "
            f"nodes={len(self.graph.nodes)}, params={len(self._params)} ({n_values} values))"
        )

    @property
    def params(self) -> dict[str, jax.Array]:
        """The trainable (floating-point) initializers, by name: a fresh dict each time.

        Running statistics (see :attr:`state`), initializers that must stay static, and the
        ops' one-value settings (a Clip's bounds, Pad's fill value, Dropout's ratio: inputs
        ONNX defines no derivative for, ``jonnx._static.setting_values``) are not parameters.
        """
        return dict(self._params)

    @property
    def state(self) -> dict[str, jax.Array]:
        """The running statistics (BatchNormalization mean and variance), by name.

        Kept apart from :attr:`params` so that ``jax.grad`` sees only parameters; training-mode
        runs return their new values (``apply(..., train=True)``). Each is named after the
        value its node reads: the initializer itself, or the output of the ``Identity`` an
        exporter routed it through (``bn1.running_mean``), which jonnx then drops so the node
        reads the state entry.
        """
        return dict(self._state)

    @property
    def trains_by_default(self) -> bool:
        """Whether the graph itself runs a stateful node in training mode.

        True for a model exported in training mode (BatchNormalization-15 with
        ``training_mode=1``): ``apply(..., train=None)`` then computes new running
        statistics, and returns them with the outputs.
        """
        slot_nodes = {s.node for s in self.state_plan.slots}
        return any(n.trains(None) for n in self.graph.nodes if n.name in slot_nodes)

    @property
    def untracked_state(self) -> dict[str, str]:
        """Stateful nodes whose running statistics cannot be kept as state: node -> why.

        ``apply(..., train=True)`` refuses to run such a model rather than train those nodes
        without running statistics.
        """
        return dict(self.state_plan.untracked)

    def apply(
        self,
        params: Mapping[str, jax.Array],
        *inputs: Any,
        state: Mapping[str, jax.Array] | None = None,
        train: bool | None = None,
        key: jax.Array | None = None,
        precision: Any = None,
        **named_inputs: Any,
    ) -> Any:
        """Run the model: a pure function of ``params``, ``state`` and the inputs.

        What it returns depends on whether the run computes new running statistics, which
        ``train`` and the graph decide before anything runs:

        * ``train=False``: inference everywhere (BatchNormalization on its running statistics,
          which a node exported in training mode passes through as its extra outputs; Dropout
          off whatever its ``training_mode`` input says). Returns the outputs.
        * ``train=True``: training everywhere, also for a model exported in eval mode
          (BatchNormalization on batch statistics, Dropout active with masks from ``key``).
          Returns ``(outputs, new_state)``.
        * ``train=None`` (default): each node as the graph says. Returns ``(outputs,
          new_state)`` when the graph trains a stateful node itself
          (:attr:`trains_by_default`, e.g. a ``TrainingMode.PRESERVE`` export), else the
          outputs, so statistics a node computed are never dropped.

        :meth:`apply_with_state` always returns ``(outputs, new_state)``.

        Args:
            params: trainable initializers by name (see :attr:`params`). Names left out keep
                the model's own values, as constants.
            *inputs: graph inputs in order (:attr:`input_names`).
            state: running statistics by name (default :attr:`state`); names left out keep
                the model's own values.
            train: the mode, as above.
            key: a PRNG key for random ops (Dropout in training, RandomNormal, ...); each
                node folds in its own. Never a fixed seed: without a key they raise.
            precision: ``jax.lax.Precision`` for MatMul/Gemm/Conv (TF32 on GPUs by default).
            **named_inputs: graph inputs by name, instead of or after the positional ones.

        Returns:
            The graph outputs, in order, or ``(outputs, new_state)`` as above. ``new_state``
            holds every running statistic: those that nodes updated by ONNX's momentum rule
            (``running * momentum + batch * (1 - momentum)``, under ``stop_gradient``), the
            others as given.

        Raises:
            jonnx.errors.InputError: inputs missing, duplicated or unknown, or unknown
                params or state names.
            jonnx.errors.StaticValueError: an input that must be static was traced.
            jonnx.errors.NodeError: ``train=True`` on a model with a stateful node whose
                running statistics cannot be kept as state (:attr:`untracked_state`).
        """
        outputs, new_state = self.apply_with_state(
            params, *inputs, state=state, train=train, key=key, precision=precision, **named_inputs
        )
        if train or (train is None and self.trains_by_default):
            return outputs, new_state
        return outputs

    def apply_with_state(
        self,
        params: Mapping[str, jax.Array],
        *inputs: Any,
        state: Mapping[str, jax.Array] | None = None,
        train: bool | None = None,
        key: jax.Array | None = None,
        precision: Any = None,
        **named_inputs: Any,
    ) -> tuple[tuple, dict[str, jax.Array]]:
        """:meth:`apply`, always returning ``(outputs, new_state)`` (Equinox's convention).

        ``new_state`` holds every running statistic: updated where a node ran in training
        mode, else as given (or the model's own). Arguments and errors are :meth:`apply`'s.

        Example:
            >>> import numpy as np, onnx, onnx.helper as oh, jonnx
            >>> inits = [onnx.numpy_helper.from_array(np.array([v], np.float32), n)
            ...          for n, v in [("s", 1.0), ("b", 0.0), ("m", 0.0), ("v", 1.0)]]
            >>> bn = oh.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], momentum=0.5)
            >>> graph = oh.make_graph([bn], "g", [oh.make_tensor_value_info("x", 1, [2, 1])],
            ...                       [oh.make_tensor_value_info("y", 1, [2, 1])], inits)
            >>> model = jonnx.load(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 15)]))
            >>> x = np.array([[1.0], [3.0]], np.float32)
            >>> _, state = model.apply_with_state(model.params, x, train=True)
            >>> float(state["m"][0])  # 0.0 * 0.5 + mean(x) * (1 - 0.5)
            1.0
            >>> _, state = model.apply_with_state(model.params, x, train=False)
            >>> float(state["m"][0])
            0.0
        """
        for given, known, what in (
            (params, self._params, "trainable initializers"),
            (state or {}, self._state, "state values"),
        ):
            unknown = set(given) - set(known)
            if unknown:
                raise errors.InputError(f"{sorted(unknown)[:10]} are not {what} of the model")
        if train:
            self._refuse_untracked()
        values = list(self.bind(*inputs, **named_inputs).values())
        _check_inputs(self.graph.inputs, values)
        current = {**self._state, **(state or {})}
        env: dict[str, Any] = {**self._constants, **current, **self._params, **params}
        for name, value in zip(self.input_names, values):
            env[name] = self._prepare_input(name, value)
        options = RunOptions(
            train=train,
            key=key,
            precision=precision,
            state=frozenset(self._state),
            memory_limit=self.memory_limit,
            checked=self.checked,
        )
        outputs, updates = run_graph(self._graph_for(train), env, options)
        self._refuse_host_outputs_under_trace(outputs, env)
        return tuple(_as_output(o) for o in outputs), {**current, **updates}

    def _refuse_host_outputs_under_trace(self, outputs: tuple, env: Mapping[str, Any]) -> None:
        """Under a trace (the user's own ``jax.jit``), a string output cannot leave: say so.

        JAX's own message (``... is not a valid JAX type``) names neither the output nor the fix.
        """
        host = [n for n, o in zip(self.output_names, outputs) if _is_host_value(o)]
        if not host:
            return
        if any(isinstance(v, jax.core.Tracer) for v in jax.tree_util.tree_leaves(list(env.values()))):
            raise errors.StaticValueError(
                f"output(s) {host} of the model are strings (numpy object arrays), which a "
                "function traced by jax.jit/vmap/grad cannot return. Call the model itself, "
                "`Model(*inputs)`, which returns them from the host, or leave those outputs out "
                "of your traced function."
            )

    def _graph_for(self, train: bool | None) -> Graph:
        """The graph ``apply`` runs with this ``train`` flag: :attr:`graph` through its passes."""
        graph = self._run_graphs.get(train)
        if graph is None:
            graph = self._run_graphs[train] = optimization.optimize(self.graph, self._apply_optimize, train)
        return graph

    def _refuse_untracked(self) -> None:
        untracked = self.state_plan.untracked
        if untracked:
            lines = "\n".join(f"  node {node!r}: {why}" for node, why in untracked.items())
            raise errors.NodeError(
                f"train=True would train {len(untracked)} node(s) without running statistics:\n"
                f"{lines}\nRun with train=None (each node as the graph says) or train=False "
                "(inference), or give each such node its own float initializer for its statistics."
            )

    def __call__(
        self,
        *inputs: Any,
        key: jax.Array | None = None,
        params: Mapping[str, jax.Array] | None = None,
        state: Mapping[str, jax.Array] | None = None,
        train: bool | None = None,
        **named_inputs: Any,
    ) -> tuple[Any, ...]:
        """Run the model jit-compiled with its own params: compiled once per input *shape*.

        A graph whose output shapes depend on values (NonZero, Compress, Unique,
        NonMaxSuppression, string labels, ZipMap) runs in compiled segments with those nodes
        on the host between them (:attr:`segment_plan`): each segment compiles once per shape
        of what it receives, never per input value. Inputs that must be known at trace time
        (:attr:`static_input_names`) are static arguments (one compilation per value).

        ``key`` feeds random ops, as in :meth:`apply`. String outputs (numpy object arrays)
        and ZipMap's lists of dicts are returned as host values.

        On the CPU a large batch whose compiled temporaries would be mapped afresh on every
        call (over 32 MiB) runs in chunks of rows where every row of the results depends on
        the same row of the inputs alone (``optimize`` switch ``batch_chunks``,
        ``jonnx._chunks``): its first call compiles the segment twice, whole to read its
        temporaries and in chunks (only in chunks where a batch of other rows has been seen
        whose temporaries, scaled to these rows, call for chunks).

        ``params`` (names left out keep the model's own values) makes the call differentiable:
        ``jax.grad(lambda p: loss(model(x, params=p)))`` works, outside ``jax.jit`` also for a
        segmented model. Each segment is differentiated as a compiled function; a host node
        reads the concrete values under the gradient's tracers to decide its indices, and what
        it gathers by them (Compress's data) stays differentiable, so gradients reach the
        params through the Gather/Compress that follow NonMaxSuppression, NonZero, Unique or a
        computed TopK ``k`` (docs/dynamic_shapes.md).

        ``state`` (names left out keep the model's own values) gives the running statistics the
        call reads (a :class:`jonnx.training.TrainState`'s), as :meth:`apply` takes them; the
        call never returns new ones (:meth:`apply_with_state` does).

        ``train=None`` runs each node as the graph says; ``train=False`` runs inference
        everywhere, as ``apply(..., train=False)`` does (BatchNormalization on its running
        statistics and Dropout the identity in a model exported in training mode), compiled
        apart. Training runs are :meth:`apply`'s, which returns the new statistics. An input
        named like one of these keywords (``key``, ``params``, ``state``, ``train``) is passed
        by position.

        A Loop found, while compiling, to stack a data-dependent number of iterations (scan
        outputs with an exit condition computed from runtime data), or an If, Loop or Scan
        whose body needs values known at trace time (a NonZero in a branch), is moved to the
        host the same way, once per model: it then runs on concrete values (a Loop unrolled).

        Under the caller's ``jax.jit`` (or ``lax.scan``, ``jax.checkpoint``) the call is traced
        into that jit as :meth:`apply` would be (``jonnx.jit`` adds jonnx's compiler options);
        a model with host nodes is refused there (below).

        Raises:
            jonnx.errors.StaticValueError: called on traced inputs (under ``jax.vmap`` or
                ``jax.jit``) when the model runs nodes on the host or needs static inputs:
                use ``Model.apply`` there (see docs/dynamic_shapes.md).
            ValueError: ``train=True``.
        """
        if train is not None and train is not False:
            raise ValueError(
                f"Model(...) takes train=None (each node as the graph says) or False (inference), not {train!r}: "
                "train with Model.apply or apply_with_state, which return the new running statistics"
            )
        while True:
            try:
                return self._call(inputs, named_inputs, key, params, state, train)
            except errors.StaticValueError as e:
                if not self._move_to_host(e):
                    raise
            except _NewHostValues as e:
                self._host_values |= e.names
                self._replan()

    def _move_to_host(self, error: errors.StaticValueError) -> bool:
        """Re-plan with the node that raised ``error`` while compiling on the host, where it
        holds subgraphs (an If, Loop or Scan: :class:`jonnx.errors.RuntimeShapeError`, or a body
        needing values known at trace time) or met strings with runtime data
        (:class:`jonnx.errors.HostValueError`); False where that cannot help (another node, or
        one already on the host)."""
        graph, position = error.where or (None, None)
        if graph is not self._call_graph or position in self._forced_host:
            return False
        if not (graph.nodes[position].subgraphs or isinstance(error, errors.HostValueError)):
            return False
        self._forced_host |= {position}
        self._replan()
        return True

    def _replan(self) -> None:
        """A new segment plan with what calls have found: nodes that must run on the host,
        and values that hold strings."""
        self.segment_plan = self._plan(forced_host=self._forced_host, host_values=self._host_values)
        self._inference_stages.clear()

    def _inference_stage(self, stage: Stage) -> Stage:
        """``stage`` run in inference mode (``train=False``): one copy per plan stage, since
        stages are compared by identity and key the compiled segments.

        The call graph's passes ran for the graph's own mode (train=None) and stay right in
        inference mode: BatchNormalization folding takes only nodes whose attributes already
        say inference, and every other mode-dependent op reads the run's flag."""
        copy = self._inference_stages.get(stage)
        if copy is None:
            copy = self._inference_stages[stage] = dataclasses.replace(stage, train=False)
        return copy

    def _call(
        self,
        inputs: tuple,
        named_inputs: Mapping[str, Any],
        key: jax.Array | None,
        params: Mapping[str, Any] | None,
        state: Mapping[str, Any] | None,
        train: bool | None,
    ) -> tuple[Any, ...]:
        values = self.bind(*inputs, **named_inputs)
        _check_inputs(self.graph.inputs, list(values.values()))
        segments = self._segments
        if params is None and not state:
            given = None
            params = self._params
        else:
            segments = self._segments_params  # not the one with the model's weights as constants
            unknown = set(params or {}) - set(self._params)
            if unknown:
                raise errors.InputError(
                    f"{sorted(unknown)[:10]} are not trainable initializers of the model (Model.params names "
                    "those; constants, such as an op's one-value settings like a Clip's bounds, cannot be given)"
                )
            unknown = set(state or {}) - set(self._state)
            if unknown:
                raise errors.InputError(f"{sorted(unknown)[:10]} are not state values of the model (Model.state)")
            # Given statistics travel with the weights: the segments look both up in one table,
            # where they take the place of the model's own.
            given = {**(params or {}), **(state or {})}
            params = {**self._params, **given}
        # The model's own params are concrete arrays: only given ones need looking into for
        # tracers, once per call (a hundred weights looked into per check cost 0.15 ms).
        traced_params = given is not None and any(
            isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(given)
        )
        self._refuse_traced({**values, **given} if traced_params else values)
        prepared = self._prepared_weights(params, traced_params)
        params = {**params, **prepared}
        # Inputs go to the compiled segments as given: jit takes numpy arrays without the
        # per-shape compilation jnp.asarray costs.
        env: dict[str, Any] = {**values, **prepared}
        options = (
            RunOptions(
                train=train,
                key=key,
                state=frozenset(self._state),
                memory_limit=self.memory_limit,
                checked=self.checked,
                bodies=self._loop_bodies,
            )
            if self.segment_plan.host_nodes
            else None
        )
        staged: bool | None = None  # whether the call is traced into the caller's jit, once known
        for stage in self.segment_plan.stages:
            stage = stage if train is None else self._inference_stage(stage)
            if stage.host_nodes:
                self._run_host(stage.host_nodes, env, params, options)
            if not stage.nodes:
                continue
            dynamic, static = {}, []
            for name in stage.reads:
                value = env[name]
                if name in stage.static or _is_host_value(value):
                    static.append((name, _Static(_host_copy(value))))
                else:
                    dynamic[name] = value
            static = tuple(static)
            new = [n for n, s in static if _is_host_value(s.value) and n not in self._host_values]
            if new:
                raise _NewHostValues(new)
            if traced_params or any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(dynamic)):
                # Under the caller's jit (or scan, checkpoint) the segment is traced into it: a
                # jit with compiler options cannot be nested. The caller's jit then decides the
                # options (jonnx.jit gives jonnx's) and, in checked mode, the checks are the
                # caller's to functionalize, as with apply. Asked once per call.
                staged = tracing_into_jaxpr() if staged is None else staged
                segment = self._segment_impl if staged else self._differentiable_segment
                results = segment(stage, params, dynamic, static, key)
            elif staged:
                results = self._segment_impl(stage, params, dynamic, static, key)
            else:
                try:
                    results = self._run_segment(segments, stage, given is None, params, dynamic, static, key)
                except ValueError:
                    # Concrete values inside the caller's jit (a closure over numpy arrays):
                    # JAX refuses the compiled segment's options there. Asked only on this
                    # error, so plain calls pay nothing; then traced inline, as above.
                    if not tracing_into_jaxpr():
                        raise
                    if self.segment_plan.host_nodes:
                        raise self._host_nodes_error("inside jax.jit") from None
                    staged = True
                    results = self._segment_impl(stage, params, dynamic, static, key)
            if self.checked and not staged:
                error, results = results
                message = error.get()
                if message is not None:
                    raise errors.NumericCheckError(message.split(" (`check` failed)")[0])
            env.update(results)
            if self._segment_host_values:  # strings a segment made while tracing
                env.update(self._segment_host_values.get(_segment_signature(stage, static, dynamic), {}))
        constants = self._constants
        return tuple(_as_output(env[n] if n in env else constants[n]) for n in self.output_names)

    def _run_segment(
        self, segments: DotChoosingJit | _WithoutParams, stage: Stage, own: bool, params, dynamic: dict, static, key
    ):
        """One compiled segment's call, whole or in chunks of rows (:meth:`_chunked`). The
        segment's signature is worked out once, for that decision, and handed to the compiled
        segments as their cache key: worked out twice it cost 2 us of a 22 us call (a
        scikit-learn forest at batch 2)."""
        if not self._chunks_apply:
            return segments(stage, params, dynamic, static, key)
        signature = _segment_signature(stage, static, dynamic)
        run = self._chunked(signature, own, params, dynamic, key)
        if run is not stage:
            signature = (run, *signature[1:])
        return segments.keyed(signature, run, params, dynamic, static, key)

    def _chunked(self, segment: tuple, own: bool, params, dynamic: dict, key) -> Stage:
        """The stage as this signature runs it: in chunks of rows (``jonnx._chunks``) where the
        compiled segment's temporaries exceed what the allocator reuses and every row of its
        results depends on the same row of its inputs alone; else ``stage``. Decided on the
        signature's first call, on the CPU, for weights not placed on a mesh: the segment is
        compiled to read its temporaries' size (the call then finds that compilation in JAX's
        cache) and, where it chunks, traced and compiled again as chunks (BERT at batch 32
        0.3 s more on its first call, MobileNetV2 1.5 s). A batch whose size is estimated over
        the threshold from another batch's (:meth:`_temporaries`) skips the whole compilation:
        an evaluation loop's smaller last batch."""
        stage, static, _ = segment  # _segment_signature's
        signature = (own, segment)
        run = self._run_stages.get(signature)
        if run is None:
            run = stage
            batch = _chunks.batch_of(dynamic)
            if batch is not None:
                chunks = _chunks.chunk_count(
                    batch, self._temporaries(signature, batch, stage, params, dynamic, static, key)
                )
                if (
                    chunks > 1
                    and _chunks.row_local(lambda d: self._segment_impl(stage, params, d, static, key), dynamic, chunks)
                    # Strings the segment makes at trace time (that trace recorded them) are
                    # outside its jaxpr: run it whole.
                    and segment not in self._segment_host_values
                ):
                    run = dataclasses.replace(stage, chunks=chunks)
            self._run_stages[signature] = run
        return run

    def _temporaries(
        self, signature: tuple, batch: int, stage: Stage, params, dynamic: dict, static: tuple, key
    ) -> int:
        """The bytes of temporaries the segment's compilation for ``batch`` rows takes.

        Where a batch of other rows has been measured for the same signature otherwise and its
        temporaries scaled to ``batch`` rows pass the fresh-mapping threshold, that estimate:
        temporaries grow with the rows (MobileNetV2 5.91 MiB a row at batch 3, 8, 17 and 32;
        BERT 3.38 at 17 and 32, 4.13 at 5, so scaling down from a larger batch errs low).
        Else read from the compilation, which the call then runs anyway."""
        own, (_, _, shapes) = signature
        rowless = (own, stage, static, tuple((shape[1:], dtype) for shape, dtype in shapes))
        seen = self._temporaries_seen.get(rowless)
        if seen is not None:
            estimate = seen[1] * batch // seen[0]
            if estimate > _chunks.FRESH_BLOCK_BYTES:
                return estimate
        analysis = self._compiled_segment(stage, params, dynamic, static, key).memory_analysis()
        temporaries = getattr(analysis, "temp_size_in_bytes", 0)
        self._temporaries_seen[rowless] = (batch, temporaries)
        return temporaries

    def _refuse_traced(self, values: Mapping[str, Any]) -> None:
        # Tracers that carry their concrete value (jax.grad outside jax.jit) are fine: host
        # nodes and static arguments read that value; only abstract ones (jit, vmap) are not.
        traced = [n for n, v in values.items() if not all(carries_value(x) for x in jax.tree_util.tree_leaves(v))]
        if not traced:
            return
        if self.segment_plan.host_nodes:
            raise self._host_nodes_error(f"on traced values {traced} (under jax.vmap or jax.jit)")
        segment_static = {n for s in self.segment_plan.stages for n in s.static}
        static = [n for n in traced if n in segment_static]
        if static:
            raise errors.StaticValueError(
                f"inputs {static} must be known at trace time (they feed a shape, a count or "
                "strings), but they are traced here: pass them as concrete numpy arrays"
            )

    def _host_nodes_error(self, where: str) -> errors.StaticValueError:
        host = [self._call_graph.nodes[p] for p in self.segment_plan.host_nodes]
        what = ", ".join(f"{n.op_type} node {n.name!r}" for n in host[:5])
        return errors.StaticValueError(
            f"calling the model {where} cannot run its host nodes ({what}): their output shapes "
            "depend on input values. Call the model on concrete arrays outside jax.jit (it "
            "compiles its segments itself; jax.grad outside jax.jit works, with params=), loop "
            "in Python, or use Model.apply with jonnx.load(..., size_bounds=...) where the op "
            "supports it"
        )

    def _run_host(
        self, positions: tuple[int, ...], env: dict[str, Any], params: Mapping[str, Any], options: RunOptions
    ) -> None:
        """Run host nodes in numpy on concrete values; their outputs join ``env``.

        Under ``jax.grad`` a value arrives as a tracer over a concrete value. The inputs that
        decide the output's shape (the node's static inputs: a condition, boxes and scores)
        and those that drive control flow (an If's condition, a Loop's trip count) are read
        as numpy; the others (Compress's data, a Loop's carried values) stay tracers, so what
        the node computes from them keeps its gradient.
        """
        for position in positions:
            node = self._call_graph.nodes[position]
            static = {n for i, n in enumerate(node.inputs) if i in node.static_inputs | node.prefer_static}
            local = {}
            for n in (*node.inputs, *_outer_reads(node)):
                if n:
                    value = env[n] if n in env else self._lookup(n, params)
                    traced = isinstance(value, jax.core.Tracer) and n not in static
                    try:
                        local[n] = value if traced else _host_copy(value)
                    except jax.errors.ConcretizationTypeError:
                        # A segment traced into the caller's jit (jax 0.8 nests the compiled
                        # segment there without refusing it, see __call__).
                        raise self._host_nodes_error("inside jax.jit") from None
            run_nodes(self._call_graph, local, options, (position,))
            env.update({o: local[o] for o in node.outputs if o})

    def _prepared_weights(self, params: Mapping[str, Any], traced: bool) -> dict[str, Any]:
        """The outputs of the weight-only nodes for these params (see ``_prepared_nodes``).

        With the model's own weights they are computed once and kept; other params (a
        ``params=`` call, tracers under ``jax.grad``) get them computed for this call, compiled
        when concrete and op by op when traced, so gradients flow through them. Concrete
        given params' are kept for the next call with the same arrays, until one of those is
        freed: ``jonnx.training.predict`` and ``evaluate`` call the model once per batch with
        trained weights, and ResNet-50's relayouts take 9 ms of a 31 ms call at batch 1. Only
        for JAX arrays, which cannot change in place (a numpy array can).
        """
        if not self._prepared_exports:
            return {}
        # Concrete weights are prepared by the compiled function even when the call is traced
        # into the caller's jit (compile-time evaluation: that jit cannot nest jonnx's).
        if params is self._params:
            if self._prepared is None:
                with jax.ensure_compile_time_eval():
                    self._prepared = self._relayouts_on_host(params) or self._prepare(params)
            return self._prepared
        if traced:  # some of params are tracers
            return self._prepare_impl(params)
        # One entry (names, weak references to the arrays, prepared), read and replaced whole,
        # so that concurrent calls never mix two entries.
        kept = self._prepared_given
        entry = kept.get("entry")
        if entry is not None and entry[0] == tuple(params) and all(r() is v for r, v in zip(entry[1], params.values())):
            return entry[2]
        with jax.ensure_compile_time_eval():
            prepared = self._prepare(params)
        if all(isinstance(v, jax.Array) for v in params.values()):
            entry = []

            def forget(_: Any) -> None:  # one of the arrays was freed: its entry goes with it
                if kept.get("entry") is entry:
                    kept.pop("entry", None)

            # Weak references: the kept copy never holds the arrays alive.
            entry.extend((tuple(params), tuple(weakref.ref(v, forget) for v in params.values()), prepared))
            kept["entry"] = entry
        else:
            kept.pop("entry", None)
        return prepared

    def _relayouts_on_host(self, params: Mapping[str, Any]) -> dict[str, jax.Array] | None:
        """The prepared weights by numpy, where every weight-only node is a Transpose (the
        layout pass's kernel relayouts) and the arrays are on the CPU; else None.

        They are computed once per model, and compiling them cost more than doing them: for
        ResNet-50's 34 kernels XLA took 0.33 s to compile what numpy does in 0.05 s, out of a
        first call of 2.2 s. One array at a time, so at most one host copy exists at once, and
        the freed copies go back to the system. A Transpose that leaves the bytes in place (a
        1x1 kernel's unit axes moved) gives a view of the weights, no copy.
        """
        nodes = [self._call_graph.nodes[p] for p in self._prepared_nodes]
        if jax.default_backend() != "cpu" or any((n.domain, n.op_type) != ("", "Transpose") for n in nodes):
            return None
        env: dict[str, Any] = {}
        for node in nodes:
            x = np.asarray(env[node.inputs[0]] if node.inputs[0] in env else self._lookup(node.inputs[0], params))
            perm = node.attrs["perm"] or tuple(reversed(range(x.ndim)))
            if sorted(perm) != list(range(x.ndim)):
                return None  # the compiled path raises the op's own error, naming the node
            env[node.outputs[0]] = jax.device_put(np.ascontiguousarray(np.transpose(x, perm)))
        release_freed_memory()  # the host copies, before the first compilation needs the room
        return {n: env[n] for n in self._prepared_exports}

    def _prepare_impl(self, params: Mapping[str, Any]) -> dict[str, Any]:
        env: dict[str, Any] = {**self._constants, **self._state, **params}
        options = RunOptions(key=None, state=frozenset(self._state), memory_limit=self.memory_limit)
        run_main_nodes(self._call_graph, env, options, self._prepared_nodes, self._prepared_exports)
        return {n: env[n] for n in self._prepared_exports}

    def _lookup(self, name: str, params: Mapping[str, Any]) -> Any:
        for table in (self._constants, params, self._state):
            if name in table:
                return table[name]
        raise KeyError(name)

    def _segment_impl(self, stage: Stage, params, dynamic: dict, static: tuple, key) -> dict:
        if stage.chunks > 1:
            whole = dataclasses.replace(stage, chunks=1)
            return _chunks.run_in_chunks(
                lambda d: self._segment_impl(whole, params, d, static, key), dynamic, stage.chunks
            )
        env: dict[str, Any] = {**self._constants, **self._state, **self._params, **params, **dynamic}
        env.update((name, s.value) for name, s in static)
        # The stage's mode: the graph's own (train=None) or inference (train=False). Statistics
        # a training-mode graph computes are not kept: the model's own values never change
        # (use apply_with_state for them).
        options = RunOptions(
            train=stage.train,
            key=key,
            state=frozenset(self._state),
            memory_limit=self.memory_limit,
            checked=self.checked,
        )
        run_main_nodes(self._call_graph, env, options, stage.nodes, stage.exports)
        results = {n: env[n] for n in stage.exports}
        host = {n: v for n, v in results.items() if _is_host_value(v)}
        if host:
            self._segment_host_values[_segment_signature(stage, static, dynamic)] = host
        return {n: v for n, v in results.items() if n not in host}

    def _differentiable_segment(self, stage: Stage, params, dynamic: dict, static: tuple, key) -> Any:
        """The compiled segment for tracers over concrete values (``jax.grad`` outside jit).

        Forward and backward stay top-level compiled functions (:func:`jonnx._jit.differentiable`),
        cached by shape like the segment itself.
        """

        def backward(params, dynamic, cotangents):
            if self.checked:  # the forward's error part has no cotangent
                cotangents = cotangents[1]
            return self._segment_vjp(stage, params, dynamic, static, key, cotangents)

        def forward(params, dynamic):
            return self._segments_params.default(stage, params, dynamic, static, key)

        return differentiable(forward, backward)(params, dynamic)

    def _segment_vjp_impl(self, stage: Stage, params, dynamic: dict, static: tuple, key, cotangents: dict) -> tuple:
        def run(params, dynamic):
            results = self._segment_impl(stage, params, dynamic, static, key)
            return {n: v for n, v in results.items() if n in cotangents}

        _, pullback = jax.vjp(run, params, dynamic)
        return pullback(cotangents)

    def bind(self, *inputs: Any, **named: Any) -> dict[str, Any]:
        """The graph inputs by name, from positional and keyword inputs as ``apply`` takes them;
        a map input's values as its declared type (numpy scalars, traced ones cast; strings as
        given).

        Raises:
            jonnx.errors.InputError: too many inputs, an unknown name, an input given twice,
                a missing input, or a map value that is not of the map's declared type.
        """
        names = self.input_names
        if len(inputs) > len(names):
            raise errors.InputError(
                f"the model takes {len(names)} input(s) {list(names)}, but {len(inputs)} were given"
            )
        values: dict[str, Any] = dict(zip(names, inputs))
        for name, value in named.items():
            if name not in names:
                raise errors.InputError(f"the model has no input named {name!r}; inputs: {list(names)}")
            if name in values:
                raise errors.InputError(f"input {name!r} given both by position and by name")
            values[name] = value
        missing = [n for n in names if n not in values]
        if missing:
            raise errors.InputError(f"missing model input(s) {missing}; inputs: {list(names)}")
        for name, dtype in self._map_inputs.items():
            if isinstance(values[name], dict):
                values[name] = _typed_map(name, values[name], dtype)
        return {n: values[n] for n in names}

    def _prepare_input(self, name: str, value: Any) -> Any:
        if isinstance(value, (list, tuple)):  # a sequence input
            return [self._prepare_input(name, v) for v in value]
        if value is None or isinstance(value, dict):  # absent optional; a map (ai.onnx.ml)
            return value
        if name in self.static_input_names:
            return value if isinstance(value, jax.core.Tracer) else np.asarray(value)
        if isinstance(value, np.ndarray) and value.dtype == object:
            return value
        return jnp.asarray(value)


def _narrowed(name: str, value: np.ndarray, graph: Graph, checked: bool) -> np.ndarray:
    """A float initializer as JAX will hold it; with x64 off, one beyond float32's range is named
    (a warning, or an error in checked mode) rather than turned into infinities silently.

    Returns numpy (placement is ``jax.device_put``'s job, which adopts aligned buffers uncopied).
    """
    found = None if jax.config.jax_enable_x64 else narrowing(value)
    if found is None:
        return value
    readers = ", ".join(f"node {n.name!r} ({n.op_type})" for n in graph.nodes if name in n.inputs) or "no node"
    what = (
        f"initializer {name!r} ({value.dtype}, shape {list(value.shape)}, read by {readers}) holds "
        f"{found[0]}, which {found[1]} cannot hold"
    )
    if checked:
        raise errors.NumericCheckError(narrowing_advice(what))
    warnings.warn(narrowing_advice(what), errors.NarrowingWarning, stacklevel=4)
    with np.errstate(over="ignore"):
        return value.astype(np.float32)


def _check_inputs(declared: tuple[ValueInfo, ...], values: list[Any]) -> None:
    """Inputs must match the graph's declared dtypes and shapes; symbolic dims bind consistently.

    Dtypes must be of the declared kind (float, signed or unsigned integer, bool, complex,
    string); another width of that kind is accepted: an int32 array for an int64 input (JAX
    holds no int64 with ``jax_enable_x64`` off), or float64 inputs to a float32 model, which
    then computes in float64 (as gradient checks by finite differences want).
    """
    bound: dict[str, tuple[int, str]] = {}
    for info, value in zip(declared, values):
        if info.kind != "tensor" or value is None or isinstance(value, (list, dict)):
            continue
        shape, dtype = np.shape(value), getattr(value, "dtype", None)
        if info.dtype is not None and dtype is not None and dtype != info.dtype and info.dtype != np.dtype(object):
            if _kind(np.dtype(dtype)) != _kind(info.dtype):
                raise errors.InputError(
                    f"input {info.name!r} is declared {info.dtype} but a {np.dtype(dtype)} array was given"
                )
        if info.shape is None:
            continue
        if len(shape) != len(info.shape):
            raise errors.InputError(
                f"input {info.name!r} is declared with shape {_show(info.shape)} (rank "
                f"{len(info.shape)}) but an array of shape {shape} was given"
            )
        for axis, (want, got) in enumerate(zip(info.shape, shape)):
            if isinstance(want, int) and want != got:
                raise errors.InputError(
                    f"input {info.name!r} is declared with shape {_show(info.shape)} but an array "
                    f"of shape {shape} was given (axis {axis}: {got} != {want})"
                )
            if isinstance(want, str):
                first = bound.setdefault(want, (got, info.name))
                if first[0] != got:
                    raise errors.InputError(
                        f"dimension {want!r} is {first[0]} in input {first[1]!r} but {got} in input "
                        f"{info.name!r} (axis {axis})"
                    )


@functools.cache
def _kind(dtype: np.dtype) -> str:
    for kind in ("bool", "floating", "signedinteger", "unsignedinteger", "complexfloating"):
        if jnp.issubdtype(dtype, getattr(jnp, "bool_" if kind == "bool" else kind)):
            return kind
    return "string" if dtype == np.dtype(object) else str(dtype)


def _show(shape: tuple) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def _read_names(graph: Graph) -> set[str]:
    """Every value a node of ``graph`` reads (subgraphs' outer reads included), and its outputs."""
    names = set(graph.output_names)
    for node in graph.nodes:
        names |= node.reads
    return names


def _pickle_parts(model: Model) -> tuple:
    """The model as bytes of a self-contained proto (external data inlined) and load options."""
    proto = onnx.ModelProto()
    proto.CopyFrom(model.proto)  # cheap: model.proto holds no initializer data
    pending = detach_initializers(proto.graph, model.graph, {}, set())
    inline_external(proto, model.graph)
    return b"".join(serialize_with(proto, pending)), model._load_options


def _unpickle(proto_bytes: bytes, options: Mapping[str, Any]) -> Model:
    proto = onnx.ModelProto()
    proto.ParseFromString(proto_bytes)
    del proto_bytes
    return Model(proto, _owned=True, **options)


_DATA_FIELDS = ("raw_data", "float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data")


def _strip_initializers(proto: onnx.ModelProto, *, in_place: bool) -> onnx.ModelProto:
    """``proto`` with the data of its main graph's inline initializers removed.

    Their names, types, dims and metadata stay; tensors in external files keep their
    references. A proto the caller gave (``in_place=False``) is copied, never changed; the
    copy never holds more than one tensor's data beyond the original's.
    """
    if not in_place:
        stripped = onnx.ModelProto()
        copy_except(proto, stripped, "graph")
        copy_except(proto.graph, stripped.graph, "initializer")
        for tensor in proto.graph.initializer:
            copy_except(tensor, stripped.graph.initializer.add(), *_DATA_FIELDS)
        return stripped
    for tensor in proto.graph.initializer:
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            for field in _DATA_FIELDS:
                tensor.ClearField(field)
    return proto


class _NewHostValues(Exception):
    """A stage about to be compiled reads strings that its plan did not know of: ``__call__``
    re-plans with the nodes reading them on the host, rather than compiling the stage once
    per distinct string."""

    def __init__(self, names: Iterable[str]):
        super().__init__(", ".join(names))
        self.names = frozenset(names)


def _is_host_value(value: Any) -> bool:
    """A value JAX cannot hold: a string tensor, a map of strings, or a sequence holding one."""
    if isinstance(value, list):
        return any(_is_host_value(v) for v in value)
    if isinstance(value, dict):
        return any(isinstance(v, (str, bytes)) or _is_host_value(v) for v in value.values())
    return isinstance(value, np.ndarray) and value.dtype == object


def _typed_map(name: str, value: dict, dtype: np.dtype) -> dict:
    """A map input's values as ``dtype`` (see :meth:`Model.bind`)."""
    if dtype == np.dtype(object):
        bad = [v for v in value.values() if not isinstance(v, (str, bytes))]
        if bad:
            raise errors.InputError(f"map input {name!r} is declared with string values, but {bad[0]!r} was given")
        return value
    dtype = jax.dtypes.canonicalize_dtype(dtype)  # float64 is float32 with x64 off
    typed = {}
    for k, v in value.items():
        try:
            typed[k] = v.astype(dtype) if isinstance(v, jax.Array) else np.asarray(v, dtype)
        except (TypeError, ValueError):
            raise errors.InputError(
                f"map input {name!r} is declared with {np.dtype(dtype).name} values, but {v!r} was given (key {k!r})"
            ) from None
    return typed


def _content_key(value: Any) -> Any:
    if isinstance(value, list):
        return ("list", tuple(_content_key(v) for v in value))
    if value is None or isinstance(value, dict):
        return repr(value)
    return (value.dtype.str, value.shape, value.tobytes() if value.dtype != object else repr(value.tolist()))


def _host_copy(value: Any) -> Any:
    """``value`` as numpy (a list of them for a sequence; maps and None as they are); a
    tracer over a concrete value (``jax.grad`` outside ``jax.jit``) gives that value."""
    if isinstance(value, list):
        return [_host_copy(v) for v in value]
    if value is None or isinstance(value, dict):
        return value
    if isinstance(value, jax.core.Tracer):
        return concrete_or_error(np.asarray, value, "a host node of a segmented model")
    return np.asarray(value)


def _outer_reads(node: Any) -> tuple[str, ...]:
    return tuple(sorted({n for g in node.subgraphs for n in g.outer_names}))


class _WithoutParams:
    """Segments compiled with the model's weights as constants (a :class:`DotChoosingJit` of
    ``(stage, dynamic, static, key)``), called as the ones that take ``params`` are."""

    def __init__(self, chooser: DotChoosingJit):
        self._chooser = chooser

    def __call__(self, stage: Stage, params, dynamic, static, key):
        return self._chooser(stage, dynamic, static, key)

    def keyed(self, signature: tuple, stage: Stage, params, dynamic, static, key):
        return self._chooser.keyed(signature, stage, dynamic, static, key)

    def compiled(self, stage: Stage, params, dynamic, static, key):
        return self._chooser.compiled(stage, dynamic, static, key)


def _segment_signature(stage: Stage, static: tuple, dynamic: Any) -> tuple:
    """What a segment's compilation (and its trace's host values) depends on."""
    return stage, static, signature(dynamic)


def _as_output(value: Any) -> Any:
    if isinstance(value, list):
        return [_as_output(v) for v in value]
    if isinstance(value, np.ndarray) and value.dtype == object:
        return value  # strings stay on the host
    if isinstance(value, (np.ndarray, np.generic)):
        return _to_device(value)
    return value


def _to_device(value: np.ndarray | np.generic) -> jax.Array:
    """``jax.device_put(value)`` at a third of its cost.

    A host node's numeric output is returned as a JAX array, as compiled outputs are. Where
    JAX has one device, a CPU, ``jax.make_array_from_callback`` places it as ``device_put``
    does (the same dtype narrowing without x64, the same adoption of aligned buffers) in 13 us
    against 29-36 (jax 0.10): most of a one-LabelEncoder model's call. Its array is committed
    to that device, which matters only where there are others to mix it with; there
    ``device_put`` it is. ``jnp.asarray`` would compile a copy per shape.
    """
    sharding = _default_sharding()
    if sharding is None or jax.config.jax_default_device is not None:
        return jax.device_put(value)
    return jax.make_array_from_callback(np.shape(value), sharding, lambda index: np.asarray(value)[index])


@functools.cache
def _default_sharding() -> jax.sharding.Sharding | None:
    devices = jax.devices()
    if len(devices) != 1 or devices[0].platform != "cpu":
        return None
    return jax.sharding.SingleDeviceSharding(devices[0])

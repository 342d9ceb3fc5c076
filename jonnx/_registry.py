"""The operator registry: ``(domain, op_type, since_version)`` -> implementation.

Every operator, jonnx's own and a user's custom ones, is registered with :func:`register`.
An implementation is a pure function ``fn(inputs, attrs, ctx) -> tuple of outputs``:

* ``inputs``: a tuple with one entry per formal input of the op's schema (more for a variadic
  last input), ``None`` for an omitted optional input, so bodies unpack inputs by name.
  An entry is a ``numpy.ndarray`` when the value is known at trace time (a constant, a shape)
  and a ``jax.Array`` (possibly a tracer) otherwise. Inputs listed in ``static_inputs`` are
  always numpy.
* ``attrs``: a read-only mapping of every attribute the op's schema declares, holding the
  node's value, else the schema default, else ``None``. Op bodies never supply defaults.
* ``ctx``: an :class:`OpContext` (node name, opset, train flag, PRNG key, precision).

Lookup follows ONNX's versioning: the model's opset for the node's domain selects the
schema's ``since_version`` (``onnx.defs.get_schema(op, max_inclusive_version=opset)``), and
the implementation registered at that key runs (else the newest registered between it and
the opset, such as a user's override; never one older than the schema). Domains onnx does not
know (custom ops) use the newest registered version not above the model's opset.
"""

from __future__ import annotations

import dataclasses
import functools
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import onnx.defs
from jax.experimental import checkify

from jonnx import errors

__all__ = [
    "ONNX_DOMAINS",
    "Attrs",
    "Inputs",
    "OpContext",
    "OpDef",
    "OpFn",
    "Outputs",
    "arity",
    "float_groups",
    "lookup",
    "promote_floats",
    "register",
    "register_pass_domain",
    "registered",
    "schema_for",
]

#: Domains whose schemas the installed onnx package defines.
ONNX_DOMAINS = frozenset(s.domain for s in onnx.defs.get_all_schemas_with_history())

#: An op body's inputs: one per formal input of the schema (None for an omitted optional
#: one), each a numpy array (known at trace time) or a ``jax.Array`` (possibly a tracer).
Inputs = tuple[Any, ...]
#: An op body's attributes: every attribute of the schema, decoded, defaults filled in.
Attrs = Mapping[str, Any]
#: What an op body returns: one value per output, in order.
Outputs = tuple[Any, ...]
#: The signature of every op body.
OpFn = Callable[[Inputs, Attrs, "OpContext"], Outputs]


def normalize_domain(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


@dataclasses.dataclass(frozen=True)
class OpDef:
    """One registered implementation.

    Attributes:
        domain, op_type, since_version: the key it is registered under.
        fn: the implementation, ``fn(inputs, attrs, ctx) -> tuple``.
        static_inputs: input positions whose values must be known at trace time (a shape,
            axes, a count), or a function of the node's attributes giving them (when it
            depends on them: Cast to string). The interpreter hands them over as numpy arrays,
            or raises :class:`jonnx.errors.StaticValueError` naming the chain that made them
            dynamic.
        prefer_static: input positions the op handles better when known (If's condition,
            Loop's trip count), or a function of the attributes giving them. A scalar graph
            input that feeds one directly is passed to ``jax.jit`` as a static argument by
            ``Model.__call__``; traced, the op still runs (``lax.cond``, ``lax.while_loop``).
        shape_only: the outputs depend only on input shapes and dtypes (Shape, Size), so
            they are known at trace time even when the inputs are not.
        random: the op draws from ``ctx.key``; it is never evaluated at trace time.
        reads_graph: the op reads values of the enclosing graph beyond its inputs (through
            ``ctx.graph``: Gradient), so it is never evaluated at trace time either.
        state_updates: ``{output position: input position}`` for outputs that are the new
            value of a state input (BatchNormalization's running mean and variance). An op
            returns them in training mode even when the node does not list those outputs, and
            ``Model.apply`` collects them as the new state when the node runs in training mode.
        trains: for ops with ``state_updates``, ``trains(attrs, n_outputs)``: whether a node
            with these attributes and this many declared outputs runs in training mode when
            the run leaves the choice to the graph (``train=None``): BatchNormalization-15 with
            ``training_mode=1``, BatchNormalization-9 with five outputs. Default: it does not.
        validate: checks a node at load time, ``validate(attrs, n_inputs, n_outputs)``,
            returning a message when the node is malformed (If branches giving different
            numbers of outputs), or None; the loader raises it as a ModelStructureError.
        attributes: for an op onnx has no schema for (a custom domain), the attributes it
            takes with their defaults (None: no default), playing the schema's part: a node
            setting any other attribute is refused at load. None: the op gets exactly the
            attributes a node sets.
        n_inputs: for an op onnx has no schema for, its formal input count: a node's omitted
            trailing optional inputs arrive as None up to it. Ops with a schema take the
            schema's count (:func:`arity`).
        host: the op reads its inputs' *values* to decide its output's shape or makes host
            values (NonZero, NonMaxSuppression, Unique, string labels, ZipMap), or a function
            of the node's attributes saying so. ``Model.__call__`` runs such a node on the host
            between compiled segments when its inputs come from runtime data, so that the
            segments compile once per shape, never per input value (``jonnx._segments``).
            There its inputs are concrete, and the op computes in numpy: it is called
            directly, never traced first.
    """

    domain: str
    op_type: str
    since_version: int
    fn: OpFn
    static_inputs: frozenset[int] | Callable[[Mapping[str, Any]], Iterable[int]] = frozenset()
    prefer_static: frozenset[int] | Callable[[Mapping[str, Any]], Iterable[int]] = frozenset()
    shape_only: bool = False
    random: bool = False
    reads_graph: bool = False
    state_updates: Mapping[int, int] = dataclasses.field(default_factory=dict)
    trains: Callable[[Mapping[str, Any], int], bool] | None = None
    validate: Callable[[Mapping[str, Any], int, int], str | None] | None = None
    attributes: Mapping[str, Any] | None = None
    n_inputs: int = 0
    host: bool | Callable[[Mapping[str, Any]], bool] = False

    def runs_on_host(self, attrs: Mapping[str, Any]) -> bool:
        """Whether a node with these attributes runs on the host when its inputs are data."""
        return bool(self.host(attrs)) if callable(self.host) else self.host

    def with_declared_defaults(self, given: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """``given`` over the declared attribute defaults, and the given names not declared."""
        if self.attributes is None:
            return dict(given), []
        return {**self.attributes, **given}, sorted(set(given) - set(self.attributes))

    def static_positions(self, attrs: Mapping[str, Any]) -> frozenset[int]:
        """The input positions that must be static for a node with these attributes."""
        spec = self.static_inputs
        return frozenset(spec(attrs)) if callable(spec) else spec

    def preferred_static_positions(self, attrs: Mapping[str, Any]) -> frozenset[int]:
        """The input positions better passed as static for a node with these attributes."""
        spec = self.prefer_static
        return frozenset(spec(attrs)) if callable(spec) else spec


# The private domains of jonnx's graph passes, each with what its pass made of a node (an
# error in such a node names the ONNX node it came from, by name and op type, and this).
_REWRITTEN_BY: dict[str, str] = {}


def register_pass_domain(domain: str, rewritten_as: str) -> None:
    """Declare ``domain`` the private domain of a graph pass, whose nodes stand for ONNX nodes
    of the same name and op type: errors describe them as ``rewritten_as`` says."""
    _REWRITTEN_BY[domain] = rewritten_as


@dataclasses.dataclass(frozen=True)
class OpContext:
    """What an op body may know beyond its inputs and attributes.

    Attributes:
        node: the node's name (for error messages).
        op_type, domain, opset: the op and the model's opset for its domain.
        train: the run's mode: True (training everywhere: batch statistics, active
            Dropout), False (inference everywhere), or None (each node as the graph says:
            BatchNormalization's ``training_mode``, Dropout's ``training_mode`` input).
        key: a PRNG key for this node (already folded with the node's position), or None.
        precision: ``jax.lax.Precision`` (or None for JAX's default) for matmul/conv.
        n_outputs: how many outputs the node declares (Split divides by it), or None.
        run_graph: runs a subgraph attribute: ``run_graph(graph, inputs, iteration=None)
            -> tuple``; set by the interpreter so control-flow ops can evaluate their bodies.
            Ops that run a body repeatedly pass the iteration number (an int or a traced
            scalar), which is folded into the body's key so that each iteration draws
            fresh randomness.
        graph: the graph holding the node (Gradient differentiates through it).
        checked: the model runs in checked mode: :meth:`check` raises on bad data.
    """

    node: str = "<call>"
    op_type: str = ""
    domain: str = ""
    opset: int = 0
    train: bool | None = None
    key: jax.Array | None = None
    precision: Any = None
    n_outputs: int | None = None
    run_graph: Callable[..., tuple] | None = None
    graph: Any = None
    checked: bool = False

    def where(self) -> str:
        """``node 'name' (Op, domain 'd', opset N)`` for error messages; a node the graph passes
        rewrote into an internal domain is named by what the pass did instead."""
        if self.domain in _REWRITTEN_BY:
            return f"node {self.node!r} ({self.op_type}, {_REWRITTEN_BY[self.domain]})"
        dom = self.domain or "ai.onnx"
        return f"node {self.node!r} ({self.op_type}, domain {dom!r}, opset {self.opset})"

    def error(self, message: str) -> errors.NodeError:
        """A :class:`jonnx.errors.NodeError` that names this node."""
        return errors.NodeError(f"{self.where()}: {message}")

    def host_error(self, message: str) -> errors.HostValueError:
        """A :class:`jonnx.errors.HostValueError` that names this node: ``message`` says which
        value had to be concrete because the node reads or writes strings."""
        return errors.HostValueError(
            f"{self.where()}: {message}. Model(*inputs) runs such a node on the host, on concrete "
            "values; under jax.jit, jax.vmap or Model.apply they must be known at trace time"
        )

    def check(self, ok: Any, message: str) -> None:
        """In checked mode, fail the run (also under ``jit``) where ``ok`` is false.

        ``ok`` is a boolean array (all of it must hold); ``message`` says what went wrong and
        is prefixed with the node. Values known at trace time (numpy: constants, folded
        shapes) are always checked. Runtime data is checked only in checked mode, through
        ``jax.experimental.checkify`` under ``jit``; in the fast default the op's result for
        bad data is its documented fast path (JAX clamps gathers and drops scatters).
        """
        trace_time = isinstance(ok, (bool, np.bool_, np.ndarray))
        if not (trace_time or self.checked):
            return
        if trace_time or not isinstance(ok, jax.core.Tracer):  # a known value: check it now
            if not np.all(np.asarray(ok)):
                raise errors.NumericCheckError(f"{self.where()}: {message}")
            return
        checkify.check(jnp.all(ok), f"{self.where()}: {message}")

    def training(self, node_says: Any) -> Any:
        """Whether to run in training mode: the run's flag when set, else the node's own."""
        return node_says if self.train is None else self.train

    def rng(self) -> jax.Array:
        """This node's PRNG key; raises a clear error when the caller gave none."""
        if self.key is None:
            raise errors.NodeError(
                f"{self.where()} draws random numbers but no PRNG key was given: pass "
                "`key=jax.random.key(...)` to `Model.apply` (jonnx never uses a fixed seed)."
            )
        return self.key


_REGISTRY: dict[tuple[str, str, int], OpDef] = {}


def register(
    op_type: str,
    *,
    since: int | Iterable[int],
    domain: str = "",
    static_inputs: Iterable[int] | Callable[[Mapping[str, Any]], Iterable[int]] = (),
    prefer_static: Iterable[int] | Callable[[Mapping[str, Any]], Iterable[int]] = (),
    shape_only: bool = False,
    random: bool = False,
    reads_graph: bool = False,
    state_updates: Mapping[int, int] | None = None,
    trains: Callable[[Mapping[str, Any], int], bool] | None = None,
    validate: Callable[[Mapping[str, Any], int, int], str | None] | None = None,
    attributes: Mapping[str, Any] | None = None,
    n_inputs: int = 0,
    host: bool | Callable[[Mapping[str, Any]], bool] = False,
) -> Callable[[OpFn], OpFn]:
    """Register ``fn`` as the implementation of ``op_type`` for the given since_versions.

    Args:
        op_type: the ONNX op type, e.g. ``"Relu"``.
        since: one since_version or several whose semantics ``fn`` covers.
        domain: the op's domain; ``""`` (or ``"ai.onnx"``) is the default domain.
        static_inputs: input positions that must be known at trace time, or a function of
            the node's attributes returning them.
        prefer_static: input positions the op handles better when known at trace time.
        shape_only: outputs depend only on input shapes and dtypes.
        random: the op draws from ``ctx.key`` and must never be folded.
        reads_graph: the op reads the enclosing graph (``ctx.graph``) and must never be folded.
        state_updates: ``{output position: input position}`` of outputs that update a state
            input (running statistics), see :class:`OpDef`.
        trains: whether a node with given attributes trains by default, see :class:`OpDef`.
        validate: a load-time check of a node, see :class:`OpDef`.
        attributes: a custom op's attributes and their defaults, see :class:`OpDef`.
        n_inputs: a custom op's formal input count, see :class:`OpDef`.
        host: the op's output shape depends on input values (or it makes strings): run it on
            the host between compiled segments, see :class:`OpDef`.

    Returns:
        A decorator that registers the function and returns it unchanged.

    Raises:
        ValueError: a ``(domain, op_type, since_version)`` key is registered twice.

    Example:
        >>> import jax.numpy as jnp
        >>> from jonnx import register
        >>> @register("Relu6", since=1, domain="example.doctest", attributes={"cap": 6.0})
        ... def relu6(inputs, attrs, ctx):
        ...     (x,) = inputs
        ...     return (jnp.clip(x, 0, attrs["cap"]),)
    """
    versions = (since,) if isinstance(since, int) else tuple(since)
    if not versions:
        raise ValueError(f"register({op_type!r}): `since` names no version")
    domain = normalize_domain(domain)

    def decorator(fn: OpFn) -> OpFn:
        for version in versions:
            key = (domain, op_type, int(version))
            if key in _REGISTRY:
                raise ValueError(f"operator {key} is already registered ({_REGISTRY[key].fn})")
            _REGISTRY[key] = OpDef(
                domain=domain,
                op_type=op_type,
                since_version=int(version),
                fn=fn,
                static_inputs=static_inputs if callable(static_inputs) else frozenset(static_inputs),
                prefer_static=prefer_static if callable(prefer_static) else frozenset(prefer_static),
                shape_only=shape_only,
                random=random,
                reads_graph=reads_graph,
                state_updates=types.MappingProxyType(dict(state_updates or {})),
                trains=trains,
                validate=validate,
                attributes=None if attributes is None else types.MappingProxyType(dict(attributes)),
                n_inputs=n_inputs,
                host=host,
            )
        return fn

    return decorator


def schema_for(domain: str, op_type: str, opset: int) -> onnx.defs.OpSchema | None:
    """The onnx schema in force for ``op_type`` at ``opset``, or None if onnx has none."""
    domain = normalize_domain(domain)
    if domain not in ONNX_DOMAINS:
        return None
    try:
        return onnx.defs.get_schema(op_type, max_inclusive_version=opset, domain=domain)
    except onnx.defs.SchemaError:
        return None


def arity(schema: onnx.defs.OpSchema | None, op: OpDef) -> int:
    """How many inputs ``op``'s body receives at least: the formal inputs before a variadic one."""
    if schema is None:
        return op.n_inputs
    formal = schema.inputs
    variadic = bool(formal) and formal[-1].option == onnx.defs.OpSchema.FormalParameterOption.Variadic
    return len(formal) - variadic


_FLOAT_TYPES = frozenset({"tensor(float16)", "tensor(bfloat16)", "tensor(float)", "tensor(double)"})


def float_groups(schema: onnx.defs.OpSchema | None, n_inputs: int) -> tuple[tuple[int, ...], ...]:
    """Input positions (of a node with ``n_inputs`` inputs) that ``schema`` binds to one type
    variable admitting float types: ``(X, W, B)`` of Conv, ``(A, B)`` of Add, all of Concat.

    ONNX requires such inputs to have one dtype; jonnx accepts another float width for any of
    them (a float16 or float64 input into a float32 model) and computes in their common type,
    promoted as ``jnp.result_type`` does (:func:`promote_floats`).
    """
    if schema is None:
        return ()
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    formal = schema.inputs
    groups: dict[str, list[int]] = {}
    for i in range(n_inputs):
        if not formal:
            break
        param = formal[min(i, len(formal) - 1)]
        if i >= len(formal) and not (
            param.option == onnx.defs.OpSchema.FormalParameterOption.Variadic and param.is_homogeneous
        ):
            break
        if allowed.get(param.type_str, set()) & _FLOAT_TYPES:
            groups.setdefault(param.type_str, []).append(i)
    return tuple(tuple(p) for p in groups.values() if len(p) > 1)


def _is_float(dtype: np.dtype) -> bool:
    return dtype.kind == "f" or dtype == jnp.bfloat16 or "float8" in dtype.name


def promote_floats(args: tuple, groups: tuple[tuple[int, ...], ...]) -> tuple:
    """``args`` with the floating inputs of each group cast to their common dtype.

    Values known at trace time stay numpy; a group holding a non-float or non-array value
    (an integer tensor where the type variable also admits ints, a sequence) is left alone.
    """
    if not groups:
        return args
    out = list(args)
    for group in groups:
        values = [(i, args[i]) for i in group if i < len(args) and args[i] is not None]
        if not all(isinstance(getattr(v, "dtype", None), np.dtype) and _is_float(v.dtype) for _, v in values):
            continue
        dtypes = {np.dtype(v.dtype) for _, v in values}
        if len(dtypes) < 2:
            continue
        target = functools.reduce(jnp.promote_types, dtypes)  # the lattice, without x64 warnings
        target = np.dtype(jax.dtypes.canonicalize_dtype(target))  # float64 -> float32 with x64 off
        for i, v in values:
            if v.dtype != target:
                out[i] = v.astype(target) if isinstance(v, (np.ndarray, np.generic)) else jnp.asarray(v, target)
    return tuple(out)


def lookup(domain: str, op_type: str, opset: int) -> OpDef | None:
    """The implementation for ``op_type`` at the model's ``opset`` for ``domain``, or None."""
    domain = normalize_domain(domain)
    schema = schema_for(domain, op_type, opset)
    if schema is not None:
        found = _REGISTRY.get((domain, op_type, schema.since_version))
        if found is not None:
            return found
    # Custom domains (and ops a user added to an onnx domain): newest version <= opset.
    candidates = [d for (dom, op, v), d in _REGISTRY.items() if dom == domain and op == op_type and v <= opset]
    if schema is not None:
        # onnx knows this op but jonnx registered no implementation at the schema's own
        # since_version: one registered between it and the opset (a user's override) still
        # has the semantics in force; one older than the schema would run superseded ones.
        candidates = [d for d in candidates if d.since_version >= schema.since_version]
    return max(candidates, key=lambda d: d.since_version, default=None)


def registered() -> Mapping[tuple[str, str, int], OpDef]:
    """A read-only view of every registered ``(domain, op_type, since_version)``."""
    return types.MappingProxyType(_REGISTRY)

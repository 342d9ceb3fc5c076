"""Placing a model on a ``jax.sharding.Mesh``: parameter shardings from rules.

A *rule set* maps each parameter and running statistic of a model to a
``jax.sharding.PartitionSpec`` over the mesh's axes; ``jonnx.load(path, mesh=mesh,
rules=...)`` places every weight with it (one weight at a time), and from then on XLA's SPMD
partitioner does all communication: ``Model.__call__``, :func:`jonnx.jit` over
``Model.apply`` and :func:`jonnx.training.make_train_step` compile one program for the whole
mesh, and the step keeps every parameter (and its optimizer state) sharded as it was placed.
No collective is written by hand.

Built-in rule sets (see docs/scaling.md for recipes):

* :func:`replicated`: every weight whole on every device (data parallelism: shard the batch
  with :func:`shard_batch`).
* :func:`fsdp`: each weight split along its largest dimension that the mesh axis divides
  (ZeRO-3 / FSDP style: XLA gathers a weight where it is used).
* :func:`tensor_parallel`: Megatron-style splits found from the graph's structure, not from
  names: a MatMul/Gemm (or Conv) whose output reaches another one through only per-feature
  work (bias, activation, head reshapes and transposes, softmax, attention products) is split
  by columns (output features: attention heads for Q, K and V), its partner by rows (input
  features), so that the pair needs one reduction; biases and BatchNormalization parameters
  of a column-split weight are split with it.
* :func:`from_patterns`: your own ``(name pattern, PartitionSpec)`` rules.

>>> import jax, jonnx
>>> from jax.sharding import Mesh
>>> mesh = Mesh(jax.devices(), ("data",))                              # doctest: +SKIP
>>> model = jonnx.load("model.onnx", mesh=mesh, rules=jonnx.sharding.fsdp("data"))  # doctest: +SKIP
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Union

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

__all__ = [
    "RuleSet",
    "Rules",
    "from_patterns",
    "fsdp",
    "param_specs",
    "replicated",
    "shard_batch",
    "tensor_parallel",
    "tensor_parallel_plan",
]

#: A rule set: ``rules(model, mesh) -> {name: PartitionSpec}`` for the model's parameters and
#: running statistics (names left out are replicated).
RuleSet = Callable[[Any, Mesh], Mapping[str, PartitionSpec]]

#: What ``jonnx.load(..., rules=)`` accepts: a rule set, the name of a built-in one
#: (``"replicated"``; ``"fsdp"`` over the mesh's first axis; ``"tensor_parallel"`` over its last
#: axis), ``(pattern, PartitionSpec)`` pairs (:func:`from_patterns`), or None (replicated).
Rules = Union[RuleSet, str, Sequence[tuple[Any, PartitionSpec]], None]  # noqa: UP007 -- a runtime alias


def replicated() -> RuleSet:
    """Every weight whole on every device.

    Example:
        >>> import jonnx
        >>> jonnx.sharding.replicated()(None, None)
        {}
    """

    def rules(model: Any, mesh: Mesh) -> dict[str, PartitionSpec]:
        return {}

    return rules


def fsdp(axis: str = "data", *, min_bytes: int = 1 << 14) -> RuleSet:
    """Split each weight along its largest dimension that ``mesh.shape[axis]`` divides.

    Args:
        axis: the mesh axis the weights are split over (also the one the batch is split
            over, in FSDP proper).
        min_bytes: weights smaller than this stay replicated (splitting a bias gains nothing
            and costs a gather).

    Returns:
        The rule set. A weight no dimension of which the axis divides stays replicated.
    """

    def rules(model: Any, mesh: Mesh) -> dict[str, PartitionSpec]:
        size = _axis_size(mesh, axis)
        specs = {}
        for name, value in _weights(model).items():
            if value.nbytes < min_bytes:
                continue
            dims = [d for d in np.argsort(value.shape, kind="stable")[::-1] if value.shape[d] % size == 0]
            if dims:
                specs[name] = _spec_on(value.ndim, int(dims[0]), axis)
        return specs

    return rules


def from_patterns(patterns: Iterable[tuple[Any, PartitionSpec]]) -> RuleSet:
    """Rules by name: the first ``(pattern, spec)`` whose pattern matches a weight's name.

    A pattern is a glob (``"encoder.*.weight"``), a compiled regular expression (matched with
    ``search``) or a callable ``name -> bool``; names no pattern matches stay replicated.

    Raises:
        TypeError: a pattern of another kind, or a spec that is not a ``PartitionSpec``.
    """
    patterns = list(patterns)
    for pattern, spec in patterns:
        if not isinstance(pattern, (str, re.Pattern)) and not callable(pattern):
            raise TypeError(f"a sharding rule's pattern is a glob, a regex or a callable, not {pattern!r}")
        if not isinstance(spec, PartitionSpec):
            raise TypeError(f"the rule for {pattern!r} gives {spec!r}, not a jax.sharding.PartitionSpec")

    def rules(model: Any, mesh: Mesh) -> dict[str, PartitionSpec]:
        specs = {}
        for name in _weights(model):
            for pattern, spec in patterns:
                if _matches(pattern, name):
                    specs[name] = spec
                    break
        return specs

    return rules


def tensor_parallel(axis: str = "model", *, rest: RuleSet | None = None) -> RuleSet:
    """Megatron-style column/row splits of weight pairs, found from the graph's structure.

    A *weight op* is a MatMul or Gemm with a 2-D parameter as its weight, or an ungrouped Conv
    with a parameter kernel. Walking back from each weight op's activation input, through
    ops that work per feature or per head (elementwise ops, bias adds, Reshape, Transpose,
    Softmax, BatchNormalization, pooling, products of two activations as in attention), the
    weight ops reached are its column-split partners: Q, K and V for an attention output
    projection, the first FFN layer for the second. A walk that crosses an op mixing features
    (LayerNormalization, a reduction, Concat...) finds no pair. Pairs are taken in graph order;
    a weight already split one way is not split the other, and a pair whose split dimensions
    ``mesh.shape[axis]`` does not divide is left whole.

    Splits: a column weight over its output features (MatMul ``W[K, N]`` as ``P(None, axis)``,
    Conv ``W[M, C, ...]`` as ``P(axis)``), with its bias and the BatchNormalization parameters
    and statistics after it as ``P(axis)``; a row weight over its input features
    (``P(axis, None)``, Conv ``P(None, axis)``). Gemm with ``transB=1`` is the transpose.

    Args:
        axis: the mesh axis the pairs are split over.
        rest: the rule set for weights outside any pair (default: replicated), e.g.
            ``fsdp("data")`` on a 2-D ``("data", "model")`` mesh.

    Returns:
        The rule set; :func:`tensor_parallel_plan` shows what it finds.
    """

    def rules(model: Any, mesh: Mesh) -> dict[str, PartitionSpec]:
        size = _axis_size(mesh, axis)
        specs = dict(rest(model, mesh)) if rest is not None else {}
        specs.update(_megatron(model, size, axis))
        return specs

    return rules


def param_specs(model: Any, mesh: Mesh, rules: Rules = None) -> dict[str, PartitionSpec]:
    """The ``PartitionSpec`` of every parameter and running statistic of ``model`` under ``rules``.

    Raises:
        ValueError: an unknown rule-set name, a spec naming an axis the mesh lacks, or one
            splitting a dimension the mesh axis does not divide.
    """
    chosen = resolve_rules(rules, mesh)(model, mesh)
    weights = _weights(model)
    unknown = sorted(set(chosen) - set(weights))
    if unknown:
        raise ValueError(f"sharding rules name {unknown[:10]}, which are not parameters or state of the model")
    specs = {}
    for name, value in weights.items():
        spec = chosen.get(name, PartitionSpec())
        _check_spec(name, value.shape, spec, mesh)
        specs[name] = spec
    return specs


def resolve_rules(rules: Rules, mesh: Mesh) -> RuleSet:
    """``rules`` as a rule set (names and pattern lists turned into one)."""
    if rules is None:
        return replicated()
    if isinstance(rules, str):
        names = mesh.axis_names
        if rules == "replicated":
            return replicated()
        if rules == "fsdp":
            return fsdp(names[0])
        if rules == "tensor_parallel":
            return tensor_parallel(names[-1])
        raise ValueError(
            f"unknown rule set {rules!r}: use 'replicated', 'fsdp', 'tensor_parallel', a rule set "
            "from jonnx.sharding, or (pattern, PartitionSpec) pairs"
        )
    if callable(rules):
        return rules
    return from_patterns(rules)


def shard_batch(batch: Any, mesh: Mesh, axis: str | Sequence[str] = "data") -> Any:
    """Every array of ``batch`` (a pytree) split along its first dimension over ``axis``.

    Scalars and arrays whose first dimension the axis does not divide are replicated. In a
    multi-process run, each process passes its own part of the global batch.

    Example:
        >>> import jax, numpy as np, jonnx
        >>> mesh = jax.sharding.Mesh(jax.devices()[:1], ("data",))
        >>> x = jonnx.sharding.shard_batch({"x": np.ones((4, 2))}, mesh)["x"]
        >>> x.sharding.spec == jax.sharding.PartitionSpec("data")
        True
    """
    size = math.prod(mesh.shape[a] for a in ((axis,) if isinstance(axis, str) else axis))
    multi = jax.process_count() > 1

    def place(x: Any) -> Any:
        x = x if isinstance(x, jax.Array) else np.asarray(x)
        batched = np.ndim(x) > 0 and (np.shape(x)[0] * (jax.process_count() if multi else 1)) % size == 0
        sharding = NamedSharding(mesh, PartitionSpec(axis) if batched else PartitionSpec())
        if multi:
            return jax.make_array_from_process_local_data(sharding, np.asarray(x))
        return jax.device_put(x, sharding)

    return jax.tree.map(place, batch)


# -- helpers ---------------------------------------------------------------------------------


def _weights(model: Any) -> dict[str, Any]:
    return {**model.state, **model.params}


def _matches(pattern: Any, name: str) -> bool:
    if isinstance(pattern, str):
        return fnmatch.fnmatchcase(name, pattern)
    if isinstance(pattern, re.Pattern):
        return pattern.search(name) is not None
    return bool(pattern(name))


def _axis_size(mesh: Mesh, axis: str) -> int:
    if axis not in mesh.shape:
        raise ValueError(f"the mesh has axes {tuple(mesh.axis_names)}, not {axis!r}")
    return int(mesh.shape[axis])


def _spec_on(ndim: int, dim: int, axis: str) -> PartitionSpec:
    parts: list[Any] = [None] * ndim
    parts[dim] = axis
    while parts and parts[-1] is None:
        parts.pop()
    return PartitionSpec(*parts)


def _check_spec(name: str, shape: tuple[int, ...], spec: PartitionSpec, mesh: Mesh) -> None:
    if len(spec) > len(shape):
        raise ValueError(f"{name!r} has shape {shape} but its PartitionSpec {spec} has {len(spec)} entries")
    for dim, entry in enumerate(spec):
        if entry is None:
            continue
        axes = (entry,) if isinstance(entry, str) else tuple(entry)
        for a in axes:
            if a not in mesh.shape:
                raise ValueError(
                    f"{name!r}: PartitionSpec {spec} names axis {a!r}, which the mesh {tuple(mesh.axis_names)} lacks"
                )
        size = math.prod(mesh.shape[a] for a in axes)
        if shape[dim] % size:
            raise ValueError(
                f"{name!r} has shape {shape}: dimension {dim} ({shape[dim]}) cannot be split over "
                f"{size} devices ({spec}); replicate it or pick another dimension"
            )


# Ops that work per feature (or per head): a column split before them stays a split of the
# same features after them, so a row-split weight further on completes the pair.
_PER_FEATURE = frozenset(
    {
        "Abs",
        "Add",
        "AveragePool",
        "BatchNormalization",
        "Cast",
        "Celu",
        "Clip",
        "Div",
        "Dropout",
        "Elu",
        "Erf",
        "Exp",
        "Expand",
        "FastGelu",
        "Flatten",
        "Gelu",
        "GlobalAveragePool",
        "GlobalMaxPool",
        "HardSigmoid",
        "HardSwish",
        "Identity",
        "LeakyRelu",
        "Log",
        "LogSoftmax",
        "MatMul",
        "MaxPool",
        "Mish",
        "Mul",
        "Neg",
        "Pow",
        "PRelu",
        "Reciprocal",
        "Relu",
        "Reshape",
        "Selu",
        "Sigmoid",
        "Softmax",
        "Softplus",
        "Softsign",
        "Sqrt",
        "Squeeze",
        "Sub",
        "Tanh",
        "ThresholdedRelu",
        "Transpose",
        "Unsqueeze",
        "Where",
    }
)

_EMPTY: frozenset = frozenset()


def _weight_position(node: Any, params: Mapping[str, Any]) -> int | None:
    """The input index of ``node``'s weight if it is a weight op, else None."""
    if node.domain not in ("", "ai.onnx"):
        return None
    if node.op_type in ("MatMul", "Gemm") and len(node.inputs) > 1:
        w = params.get(node.inputs[1])
        if w is not None and w.ndim == 2 and node.inputs[0] not in params:
            return 1
    if node.op_type == "Conv" and len(node.inputs) > 1 and int(node.attrs.get("group", 1)) == 1:
        w = params.get(node.inputs[1])
        if w is not None and w.ndim >= 3 and node.inputs[0] not in params:
            return 1
    return None


def _megatron(model: Any, size: int, axis: str) -> dict[str, PartitionSpec]:
    graph, params = model.graph, model.params
    weight_ops = {n.name: n for n in graph.nodes if _weight_position(n, params) is not None}
    # reach[value]: the weight ops whose output features reach ``value`` through per-feature
    # ops only; None where an op mixing them lies between. Computed in one pass over the
    # topologically ordered nodes (graph inputs and initializers reach nothing).
    reach: dict[str, Any] = {}
    for node in graph.nodes:
        if node.name in weight_ops:
            result: Any = frozenset({node.name})
        else:
            found: set = set()
            result = None
            for name in node.inputs:
                sub = reach.get(name, _EMPTY) if name and name not in params else _EMPTY
                if sub is None:
                    break
                found |= sub
            else:
                result = frozenset(found)
            if result and node.op_type not in _PER_FEATURE:
                result = None  # features mixed after a split: no pair through here
        for out in node.outputs:
            reach[out] = result

    role: dict[str, str] = {}
    for node in graph.nodes:
        if node.name not in weight_ops:
            continue
        sources = reach.get(node.inputs[0], _EMPTY)
        if not sources or role.get(node.name) == "column":
            continue
        partners = [weight_ops[s] for s in sorted(sources)]
        if any(role.get(p.name) == "row" for p in partners):
            continue
        if any((p.op_type == "Conv") != (node.op_type == "Conv") for p in partners):
            continue
        if not all(_divides(p, params, size, "column") for p in partners) or not _divides(node, params, size, "row"):
            continue
        role[node.name] = "row"
        for p in partners:
            role[p.name] = "column"

    consumers: dict[str, list[Any]] = {}
    for node in graph.nodes:
        for name in node.inputs:
            consumers.setdefault(name, []).append(node)
    weights = _weights(model)
    specs: dict[str, PartitionSpec] = {}
    for name, r in role.items():
        node = weight_ops[name]
        w = params[node.inputs[1]]
        specs[node.inputs[1]] = _spec_on(w.ndim, _split_dim(node, r), axis)
        if r != "column":
            continue
        biases = []
        if node.op_type in ("Gemm", "Conv") and len(node.inputs) > 2:
            biases.append(node.inputs[2])
        for out in node.outputs:
            for c in consumers.get(out, ()):
                if c.op_type == "Add":
                    biases.extend(i for i in c.inputs if i != out)
                elif c.op_type == "BatchNormalization":
                    biases.extend(c.inputs[1:5])
        features = w.shape[_split_dim(node, "column")]
        for b in biases:
            value = weights.get(b)
            if value is not None and value.ndim == 1 and value.shape[0] == features:
                specs[b] = PartitionSpec(axis)
    return specs


def _split_dim(node: Any, role: str) -> int:
    """The weight dimension a column (output features) or row (input features) split takes."""
    if node.op_type == "Conv":
        return 0 if role == "column" else 1
    output_dim = 0 if node.op_type == "Gemm" and node.attrs.get("transB") else 1
    return output_dim if role == "column" else 1 - output_dim


def _divides(node: Any, params: Mapping[str, Any], size: int, role: str) -> bool:
    return params[node.inputs[1]].shape[_split_dim(node, role)] % size == 0


def tensor_parallel_plan(model: Any, mesh: Mesh, axis: str = "model") -> dict[str, PartitionSpec]:
    """The splits :func:`tensor_parallel` finds in ``model`` (only the weights it splits)."""
    return _megatron(model, _axis_size(mesh, axis), axis)

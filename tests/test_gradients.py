"""Gradients of every op the ONNX schemas mark differentiable, against finite differences.

ONNX marks each input and output of a schema ``Differentiable``, ``NonDifferentiable`` or
``Unknown`` (``OpSchema.FormalParameter.differentiation_category``). An op counts as
differentiable here when the schema version in force has at least one Differentiable input
and one Differentiable output. For those ops this file checks:

1. every single-node case of the ONNX backend node suite that jonnx passes (the cases in
   ``tests/conformance/expected_failures.txt`` are left out): ``jax.test_util.check_grads``,
   order 1, forward and reverse mode, in float64 (``jax.enable_x64``), with respect to the
   Differentiable floating-point inputs, through ``jonnx.load(model).apply``;
2. one case per op at its newest version with fresh random float64 inputs (the node case's
   shapes, attributes and non-differentiable inputs, new values away from kinks);
3. explicit safety cases: points where a naive gradient is NaN but the function has a
   defined (or one-sided, conventional) derivative;
4. integer and shape paths, which carry no gradient and raise nothing.

Tolerances are check_grads' own defaults for the output dtype (1e-5 for float64); nothing is
loosened. Where node data sit exactly on a point of non-differentiability (a tie in Max, ReLU
at 0, Clip at a bound) finite differences disagree with any one-sided derivative, so those
cases are either nudged deterministically off the kink (``_NUDGES``) or excluded with a reason
(``_EXCLUDED``). ``pytest -s`` prints the counts; ``test_coverage`` fails if they drop.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import re
import warnings
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import onnx.defs
import onnx.helper as oh
import pytest
from jax.test_util import check_grads
from onnx.backend.test.loader import load_node_model_tests

import jonnx
from tests.conformance.expectations import expected_failures

_DIFF = onnx.defs.OpSchema.DifferentiationCategory.Differentiable
_FLOATS = (np.float16, np.float32, np.float64)


def _schema(node: onnx.NodeProto, model: onnx.ModelProto) -> onnx.defs.OpSchema:
    domain = "" if node.domain in ("", "ai.onnx") else node.domain
    opsets = {("" if o.domain in ("", "ai.onnx") else o.domain): o.version for o in model.opset_import}
    return onnx.defs.get_schema(node.op_type, opsets[domain], domain)


def _is_differentiable(schema: onnx.defs.OpSchema) -> bool:
    return any(p.differentiation_category == _DIFF for p in schema.inputs) and any(
        p.differentiation_category == _DIFF for p in schema.outputs
    )


def _formal(params, i: int):
    """The formal parameter the ``i``-th actual input/output binds to (variadic: the last)."""
    return params[min(i, len(params) - 1)]


def _allowed(schema: onnx.defs.OpSchema, type_str: str) -> set[str]:
    for c in schema.type_constraints:
        if c.type_param_str == type_str:
            return set(c.allowed_type_strs)
    return {type_str}


# --------------------------------------------------------------------------------------------
# Node-suite cases
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class GradCase:
    """One gradient check: a one-node model, its float64 feeds, what to differentiate."""

    name: str
    op: str
    since: int
    model: onnx.ModelProto
    feeds: list[np.ndarray]
    wrt: list[int]  # positions in ``feeds`` (graph inputs) to differentiate
    diff_outputs: list[int]  # node outputs the schema marks Differentiable


def _to_float64(case_name: str, model: onnx.ModelProto, feeds: list[np.ndarray]):
    """The case in float64: ``(model, feeds, wrt, diff_outputs)`` or a skip reason (str)."""
    node = model.graph.node[0]
    schema = _schema(node, model)
    names = [v.name for v in model.graph.input]
    by_name = dict(zip(names, feeds))
    wrt_names, type_vars = [], set()
    for i, name in enumerate(node.input):
        param = _formal(schema.inputs, i)
        if not name or param.differentiation_category != _DIFF or name not in by_name:
            continue
        if by_name[name].dtype.kind != "f" or by_name[name].dtype == object:
            continue
        if "tensor(double)" not in _allowed(schema, param.type_str):
            return "schema does not allow float64 for a differentiable input"
        wrt_names.append(name)
        type_vars.add(param.type_str)
    if not wrt_names:
        return "no floating-point differentiable input"
    # Every float input bound to the same type variable becomes float64 with them.
    cast = {
        name
        for i, name in enumerate(node.input)
        if name in by_name and _formal(schema.inputs, i).type_str in type_vars and by_name[name].dtype.kind == "f"
    }
    model = onnx.ModelProto.FromString(model.SerializeToString())
    for v in model.graph.input:
        if v.name in cast:
            v.type.tensor_type.elem_type = onnx.TensorProto.DOUBLE
    outs = {v.name: v for v in model.graph.output}
    diff_outputs = []
    for i, name in enumerate(node.output):
        param = _formal(schema.outputs, i)
        if param.type_str in type_vars and name in outs:
            outs[name].type.tensor_type.elem_type = onnx.TensorProto.DOUBLE
        if name and param.differentiation_category == _DIFF:
            diff_outputs.append(i)
    new_feeds = [f.astype(np.float64) if n in cast else f for n, f in zip(names, feeds)]
    return model, new_feeds, [names.index(n) for n in wrt_names], diff_outputs


def _node_cases():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # onnx's own cast cases overflow in numpy
        cases = load_node_model_tests()
    failing = expected_failures()
    kept, skipped = [], collections.defaultdict(list)
    for case in sorted(cases, key=lambda c: c.name):
        graph = case.model.graph
        if len(graph.node) != 1:
            continue
        node = graph.node[0]
        try:
            schema = _schema(node, case.model)
        except onnx.defs.SchemaError:
            continue
        if not _is_differentiable(schema):
            continue
        if case.name in failing:
            skipped["jonnx fails the node case (expected_failures.txt)"].append(case.name)
            continue
        for k, (inputs, _) in enumerate(case.data_sets):
            feeds = [np.asarray(x) for x in inputs]
            result = _to_float64(case.name, case.model, feeds)
            if isinstance(result, str):
                skipped[result].append(case.name)
                continue
            model, feeds, wrt, diff_outputs = result
            name = case.name if len(case.data_sets) == 1 else f"{case.name}[{k}]"
            kept.append(GradCase(name, node.op_type, schema.since_version, model, feeds, wrt, diff_outputs))
    return kept, dict(skipped)


def _check(case: GradCase, *, jit: bool = True):
    with jax.enable_x64(True):
        m = jonnx.load(case.model)
        static = set(m.static_input_names)
        wrt = [i for i in case.wrt if m.input_names[i] not in static]
        if not wrt:
            return "differentiable inputs are static in jonnx"
        outputs = m.apply(m.params, *case.feeds)
        chosen = [i for i in case.diff_outputs if i < len(outputs) and _float_out(outputs[i])]
        if not chosen:
            return "no floating-point differentiable output"
        low = [i for i in chosen if outputs[i].dtype not in (np.float32, np.float64)]
        if low:
            return "differentiable output below float32 precision"

        def f(*diff):
            feeds = list(case.feeds)
            for i, d in zip(wrt, diff):
                feeds[i] = d
            out = m.apply(m.params, *feeds)
            return tuple(out[i] for i in chosen)

        if jit:
            f = jax.jit(f)
        check_grads(f, tuple(jnp.asarray(case.feeds[i]) for i in wrt), order=1, modes=("fwd", "rev"))
    return None


def _float_out(x) -> bool:
    return hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating)

"""Gradients of every op the ONNX schemas mark differentiable, against finite differences.

ONNX marks each input and output of a schema ``Differentiable``, ``NonDifferentiable`` or
``Unknown`` (``OpSchema.FormalParameter.differentiation_category``). An op counts as
differentiable here when the schema version in force has at least one Differentiable input
and one Differentiable output. For those ops this file checks:

1. every single-node case of the ONNX backend node suite that jonnx passes (the cases in
   ``tests/conformance/expected_failures.txt`` are left out): the checks of
   ``jax.test_util.check_grads`` (order 1, forward and reverse mode) in float64
   (``jax.enable_x64``), with respect to the Differentiable floating-point inputs, through
   ``jonnx.load(model).apply``. They are re-implemented here (``_grad_check``) only to compile
   all the cases of an op as one XLA program, which cuts this file's runtime by half;
   ``test_grad_check_agrees_with_check_grads`` holds the two together;
2. one case per op at its newest version with fresh random float64 inputs (the node case's
   shapes, attributes and non-differentiable inputs, new values away from kinks);
3. explicit safety cases: points where a naive gradient is NaN but the function has a
   defined (or one-sided, conventional) derivative;
4. integer and shape paths, which carry no gradient and raise nothing.

Tolerances are check_grads' own defaults for the output dtype (1e-5 for float64); nothing is
loosened (the float64 finite-difference step is smaller than check_grads' 1e-4, which only
makes the reference more accurate). Where node data sit exactly on a point of non-differentiability (a tie in Max, ReLU
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


def _is_float_dtype(dtype) -> bool:
    return dtype != object and jnp.issubdtype(dtype, jnp.floating)


_CHECKED_OUTPUT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE}


# --------------------------------------------------------------------------------------------
# Finite differences in float64, one compilation per op
# --------------------------------------------------------------------------------------------

# jax.test_util's default gradient tolerances for the output dtype. The step is smaller than
# its 1e-4 for float64 outputs: central differences then err by ~1e-12 * f''' instead of
# ~1e-9 * f''', which matters for steep functions (acos near 1, tan near pi/2) at a 1e-5
# tolerance; float32 outputs (Cast to FLOAT) keep 1e-4, where rounding dominates.
_TOL = {np.dtype(np.float32): 2e-3, np.dtype(np.float64): 1e-5}
_EPS = {np.dtype(np.float32): 1e-4, np.dtype(np.float64): 1e-6}
_FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def _grad_check(f: Callable, args: tuple, what: str) -> None:
    """``jax.test_util.check_grads(f, args, order=1, modes=("fwd", "rev"))``, compiled once.

    The same two checks as check_grads: the JVP along a random tangent against central
    differences (forward mode), and the VJP of a random cotangent projected on that tangent
    against the projected central differences (reverse mode). All the evaluations happen in
    one jitted function. Unlike ``numpy.testing``'s default, a non-finite finite difference
    is an error: the case sits on a singular point and needs a nudge or an exclusion.
    """
    _grad_check_many([(f, args, what)])


def _grad_check_many(checks: list[tuple[Callable, tuple, str]]) -> None:
    """:func:`_grad_check` for several functions, compiled together as one XLA program: the
    fixed cost of a compilation, a good part of this file's runtime, is paid once."""
    with jax.enable_x64(True):
        prepared = [_prepare(f, args) for f, args, _ in checks]

        def run(inputs):
            results = []
            for (f, *_), (args, tangents, cotangents, eps) in zip(checks, inputs):
                _, ty = jax.jvp(f, args, tangents)
                _, vjp = jax.vjp(f, *args)
                plus = f(*(a + eps * t for a, t in zip(args, tangents)))
                minus = f(*(a - eps * t for a, t in zip(args, tangents)))
                results.append((ty, vjp(cotangents), plus, minus))
            return results

        inputs = [p[:4] for p in prepared]
        compiled = jax.jit(run).lower(inputs).compile(_FAST_COMPILE)
        results = jax.tree.map(np.asarray, compiled(inputs))
    for (_, _, what), (_, tangents, cotangents, eps, tol), result in zip(checks, prepared, results):
        _compare(*result, tangents, cotangents, eps, tol, what)


def _prepare(f: Callable, args: tuple):
    """Random tangents and cotangents (as check_grads draws them), step and tolerance."""
    args = tuple(jnp.asarray(a) for a in args)
    out_shapes = jax.eval_shape(f, *args)
    dtypes = {np.dtype(o.dtype) for o in out_shapes}
    low = np.dtype(np.float32) if np.dtype(np.float32) in dtypes else np.dtype(np.float64)
    rng = np.random.RandomState(0)
    tangents = tuple(rng.standard_normal(a.shape).astype(a.dtype) for a in args)
    cotangents = tuple(rng.standard_normal(o.shape).astype(o.dtype) for o in out_shapes)
    return args, tangents, cotangents, _EPS[low], _TOL[low]


def _compare(ty, ct, plus, minus, tangents, cotangents, eps, tol, what):
    numeric = [(np.float64(p) - np.float64(m)) / (2 * eps) for p, m in zip(plus, minus)]
    for i, n in enumerate(numeric):
        assert np.all(np.isfinite(n)), f"{what}: finite differences of output {i} are not finite"
        np.testing.assert_allclose(ty[i], n, rtol=tol, atol=tol, err_msg=f"{what}: JVP of output {i}")
    ip = sum(np.vdot(t, c) for t, c in zip(tangents, ct))
    ip_expected = sum(np.vdot(n, c) for n, c in zip(numeric, cotangents))
    np.testing.assert_allclose(ip, ip_expected, rtol=tol, atol=tol, err_msg=f"{what}: VJP projection")


# --------------------------------------------------------------------------------------------
# Node-suite cases
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class GradCase:
    """One gradient check: a one-node model in float64, its feeds, what to differentiate."""

    name: str
    op: str
    since: int
    model: onnx.ModelProto
    feeds: list[np.ndarray]
    wrt: list[int]  # graph-input positions to differentiate (Differentiable, floating point)
    outputs: list[int]  # graph-output positions to check (Differentiable, float32/float64)


def _to_float64(model: onnx.ModelProto, feeds: list[np.ndarray], *, beyond_schema: bool = False):
    """The case in float64: ``(model, feeds, wrt, outputs)``, or why it is skipped (a str).

    ``beyond_schema``: cast to float64 even where the schema allows only narrower floats.
    """
    node = model.graph.node[0]
    schema = _schema(node, model)
    names = [v.name for v in model.graph.input]
    by_name = dict(zip(names, feeds))
    wrt_names, type_vars = [], set()
    for i, name in enumerate(node.input):
        param = _formal(schema.inputs, i)
        if not name or param.differentiation_category != _DIFF or name not in by_name:
            continue
        if not _is_float_dtype(by_name[name].dtype):
            continue
        if "tensor(double)" not in _allowed(schema, param.type_str) and not beyond_schema:
            return _NO_FLOAT64
        wrt_names.append(name)
        type_vars.add(param.type_str)
    if not wrt_names:
        return "no floating-point differentiable input"
    # Every float input bound to the same type variable becomes float64 with them (Clip's
    # bounds, Where's other branch); inputs of other type variables keep their type.
    cast = {
        name
        for i, name in enumerate(node.input)
        if name in by_name and _formal(schema.inputs, i).type_str in type_vars and _is_float_dtype(by_name[name].dtype)
    }
    model = onnx.ModelProto.FromString(model.SerializeToString())
    for v in model.graph.input:
        if v.name in cast:
            v.type.tensor_type.elem_type = onnx.TensorProto.DOUBLE
    position = {name: i for i, name in enumerate(node.output) if name}
    outputs, declared = [], set()
    for k, v in enumerate(model.graph.output):
        param = _formal(schema.outputs, position[v.name])
        if param.type_str in type_vars:
            v.type.tensor_type.elem_type = onnx.TensorProto.DOUBLE
        if param.differentiation_category != _DIFF:
            continue
        declared.add(v.type.tensor_type.elem_type)
        if v.type.tensor_type.elem_type in _CHECKED_OUTPUT_TYPES:
            outputs.append(k)
    if not outputs:
        if declared & {onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16} or any(
            "FLOAT8" in onnx.TensorProto.DataType.Name(t) or "FLOAT4" in onnx.TensorProto.DataType.Name(t)
            for t in declared
        ):
            return "differentiable output narrower than float32 (Cast's `to` / CastLike's target)"
        return "differentiable output is not floating point (Cast to an integer, bool or string)"
    new_feeds = [f.astype(np.float64) if n in cast else f for n, f in zip(names, feeds)]
    return model, new_feeds, [names.index(n) for n in wrt_names], outputs


def _as_array(x) -> np.ndarray:
    return onnx.numpy_helper.to_array(x) if isinstance(x, onnx.TensorProto) else np.asarray(x)


_NO_FLOAT64 = "the schema allows no float64 for a differentiable input"


@functools.cache
def _suite() -> dict:
    """The node suite's cases by name."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numpy overflows generating onnx's own cast cases
        return {c.name: c for c in load_node_model_tests()}


@functools.cache
def _node_cases() -> tuple[list[GradCase], dict[str, list[str]], list[GradCase]]:
    """The checked node cases, the skipped ones by reason, and the cases skipped because the
    schema allows no float64, converted to float64 all the same (for the random-input check)."""
    cases = _suite().values()
    failing = expected_failures()
    kept, skipped, beyond = [], collections.defaultdict(list), []
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
        if case.name in _EXCLUDED:
            skipped[f"excluded: {_EXCLUDED[case.name]}"].append(case.name)
            continue
        ((inputs, _),) = case.data_sets  # every node case has one data set
        result = _to_float64(case.model, [_as_array(x) for x in inputs])
        if isinstance(result, str):
            skipped[result].append(case.name)
            if result == _NO_FLOAT64:
                forced = _to_float64(case.model, [_as_array(x) for x in inputs], beyond_schema=True)
                beyond.append(GradCase(case.name, node.op_type, schema.since_version, *forced))
            continue
        model, feeds, wrt, outputs = result
        nudge = _NUDGES.get(case.name, (None, None))[1]
        if re.match(r"test_cast(like)?_", case.name):
            nudge = _finite
        if nudge is not None:
            feeds = list(feeds)
            for k, i in enumerate(wrt):
                feeds[i] = nudge(feeds[i], k)
        kept.append(GradCase(case.name, node.op_type, schema.since_version, model, feeds, wrt, outputs))
    return kept, dict(skipped), beyond


def _grad_fn(case: GradCase) -> tuple[Callable, tuple, str]:
    """``(f, args, name)``: the case's differentiable outputs as a function of its inputs."""
    with jax.enable_x64(True):
        m = jonnx.load(case.model)
        static = set(m.static_input_names)
        wrt = [i for i in case.wrt if m.input_names[i] not in static]
        assert wrt, f"{case.name}: jonnx treats every differentiable input as static"
        key = jax.random.key(0)  # random ops (training Dropout) draw a fixed mask per case

    def f(*diff):
        feeds = list(case.feeds)
        for i, d in zip(wrt, diff):
            feeds[i] = d
        out = m.apply(m.params, *feeds, key=key)
        return tuple(out[k] for k in case.outputs)

    return f, tuple(case.feeds[i] for i in wrt), case.name


def _check_case(case: GradCase) -> None:
    _grad_check(*_grad_fn(case))


def _failures(cases: list[GradCase]) -> list[str]:
    """Checks ``cases`` in one compilation; if that fails, one by one to name each failure."""
    try:
        _grad_check_many([_grad_fn(c) for c in cases])
        return []
    except Exception:  # noqa: BLE001 -- find and report every failing case of the op
        pass
    failed = []
    for case in cases:
        try:
            _check_case(case)
        except Exception as e:  # noqa: BLE001
            failed.append(f"{case.name}: {type(e).__name__}: {str(e).strip()[:1500]}")
    return failed


# --------------------------------------------------------------------------------------------
# Points of non-differentiability in the node data
# --------------------------------------------------------------------------------------------


def _move(point: float, to: float):
    """A nudge moving elements equal to ``point`` (a kink) to ``to``."""
    return lambda x, k: np.where(x == point, to, x)


def _break_ties(x: np.ndarray, k: int) -> np.ndarray:
    """Adds ``1e-3 * (k + i / size)``: equal elements (and equal elements of different inputs,
    ``k`` being the input's position among the differentiated ones) become distinct while
    the order of distinct elements (spaced >= 1e-2 in these cases) is kept."""
    return x + 1e-3 * (k + np.arange(x.size).reshape(x.shape) / max(x.size, 1))


def _finite(x: np.ndarray, k: int) -> np.ndarray:
    """The Cast/CastLike cases mix +-inf, NaN and the float8 extremes (57344, 448) into the
    data to test the conversion. A derivative exists only at finite points, and where the
    output is float32 its rounding resolves a 1e-4 finite-difference step to within the
    2e-3 tolerance only at small magnitudes (float32's spacing is 2.4e-7 at 2, 0.004 at
    57344), so elements that are not finite or exceed 2 in magnitude become 1.5."""
    return np.where(np.isfinite(x) & (np.abs(x) <= 2), x, 1.5)


# Node data sitting on a kink, and how they are moved off it (deterministically; the
# derivative is then checked where it exists).
_NUDGES: dict[str, tuple[str, Callable[[np.ndarray, int], np.ndarray]]] = {
    "test_acosh_example": ("x = 1 is the edge of acosh's domain (infinite slope)", _move(1.0, 1.25)),
    "test_celu_bfloat16": ("CELU(alpha=2) changes formula at 0", _move(0.0, 0.25)),
    "test_celu_float16": ("CELU(alpha=2) changes formula at 0", _move(0.0, 0.25)),
    "test_elu_example": ("ELU's slope jumps at 0", _move(0.0, 0.25)),
    "test_hardmax_one_hot": ("three-way tie for the maximum", _break_ties),
    "test_l1normalization_axis_last": ("|x| has a kink at the zeros in the data", _move(0.0, 0.25)),
    "test_l2normalization_axis_0": ("x / ||x|| is discontinuous at the all-zero columns", _move(0.0, 0.25)),
    "test_leakyrelu_example": ("LeakyRelu's slope jumps at 0", _move(0.0, 0.25)),
    "test_maxpool_3d_dilations": ("the data repeat 1..16, so pooling windows tie", _break_ties),
    "test_maxpool_3d_dilations_use_ref_impl": ("the data repeat 1..16, so pooling windows tie", _break_ties),
    "test_pow": ("base 0 is the edge of x**y's domain for non-integer y", _move(0.0, 0.5)),
    "test_reduce_min_default_axes_keepdims_example": ("the minimum 1 occurs three times", _break_ties),
    "test_selu_example": ("SELU's slope jumps at 0", _move(0.0, 0.25)),
    "test_thresholdedrelu_example": ("x = alpha = 2 is ThresholdedRelu's jump", _move(2.0, 2.25)),
}

# Node cases where no derivative exists to check.
_EXCLUDED: dict[str, str] = {
    **{
        f"test_reduce_{kind}_empty_set": "empty input: nothing to differentiate; the output is "
        "the identity (+-inf), whose finite differences are NaN (test_empty_reduction_has_zero_tangent)"
        for kind in ("log_sum", "log_sum_exp", "max", "min")
    },
    **{
        f"test_mod_float_edge_cases_fmod_0_{t}": "inputs hold +-inf, NaN and zero divisors, where fmod "
        "has no derivative"
        for t in ("float16", "float32", "float64")
    },
}


# --------------------------------------------------------------------------------------------
# Random inputs: one case per op at its newest version
# --------------------------------------------------------------------------------------------

# How differentiated inputs are drawn: ("sym", lo, hi) magnitudes in [lo, hi] with random
# signs, ("pos", lo, hi) values in [lo, hi]. The default keeps |x| >= 0.1, away from the kinks
# at 0 (Relu, Abs, Elu, ...); the others stay inside the op's domain, away from its edges.
_DEFAULT_RANGE = ("sym", 0.1, 2.0)
_RANGES: dict[tuple[str, int], tuple[str, float, float]] = {
    ("Acos", 0): ("sym", 0.05, 0.8),
    ("Asin", 0): ("sym", 0.05, 0.8),
    ("Atanh", 0): ("sym", 0.05, 0.8),
    ("Acosh", 0): ("pos", 1.2, 3.0),
    ("Log", 0): ("pos", 0.5, 2.0),
    ("Sqrt", 0): ("pos", 0.5, 2.0),
    ("ReduceLogSum", 0): ("pos", 0.5, 2.0),
    ("Pow", 0): ("pos", 0.5, 2.0),
    ("Tan", 0): ("sym", 0.1, 1.2),
    ("BatchNormalization", 4): ("pos", 0.5, 2.0),  # the variance
}


def _random_feeds(case: GradCase, rng: np.random.Generator) -> list[np.ndarray]:
    """Fresh float64 values for the differentiated inputs, the rest as in the node case.

    Values come from a shuffled grid with jitter: all distinct, at least 0.4 grid steps
    apart (>= 4e-4 for these sizes, 400 finite-difference steps), so no max/min/sort/pool
    ties; the defaults keep clear of 0.
    """
    feeds = list(case.feeds)
    groups = collections.defaultdict(list)  # one grid per range: distinct across inputs too
    for k, i in enumerate(case.wrt):
        groups[_RANGES.get((case.op, k), _DEFAULT_RANGE)].append(i)
    for (kind, lo, hi), positions in groups.items():
        sizes = [feeds[i].size for i in positions]
        n = sum(sizes)
        grid = lo + (rng.permutation(n) + 0.5 + rng.uniform(-0.3, 0.3, n)) * (hi - lo) / max(n, 1)
        if kind == "sym":
            grid *= rng.choice([-1.0, 1.0], n)
        for i, part in zip(positions, np.split(grid, np.cumsum(sizes)[:-1])):
            feeds[i] = part.reshape(feeds[i].shape)
    return feeds


def _handmade_cases() -> list[GradCase]:
    """Differentiable ops with no single-node float case in the node suite (Trilu's are all
    int64)."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 2, 5, 6))
    rois = np.array([[0, 0, 0, 3, 4], [0, 1, 1, 5, 4]], np.float64)
    models = {
        "MaxRoiPool": (
            oh.make_node("MaxRoiPool", ["x", "rois"], ["y"], pooled_shape=[2, 2], spatial_scale=1.0),
            {"x": x, "rois": rois},
        ),
        "GlobalLpPool": (oh.make_node("GlobalLpPool", ["x"], ["y"], p=3), {"x": x}),
        "Trilu": (oh.make_node("Trilu", ["x", "k"], ["y"], upper=0), {"x": x, "k": np.array(1, np.int64)}),
    }
    cases = []
    for op, (node, feeds) in models.items():
        inputs = [oh.make_tensor_value_info(k, oh.np_dtype_to_tensor_dtype(v.dtype), v.shape) for k, v in feeds.items()]
        graph = oh.make_graph([node], op, inputs, [oh.make_tensor_value_info("y", onnx.TensorProto.DOUBLE, None)])
        model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 22)])
        since = onnx.defs.get_schema(op, 22).since_version
        cases.append(GradCase(f"handmade_{op}", op, since, model, list(feeds.values()), [0], [0]))
    return cases


@functools.cache
def _random_cases() -> tuple[list[GradCase], list[str]]:
    """One random case per differentiable op (and the ops at an older version than the newest)."""
    kept, _, beyond = _node_cases()
    # Ops whose schema allows only narrower floats (LinearAttention, CausalConvWithState) have
    # no node case checked; their implementations are dtype-generic, so the random case runs
    # them in float64 all the same.
    covered = {c.op for c in kept}
    by_op = collections.defaultdict(list)
    for case in kept + [c for c in beyond if c.op not in covered]:
        by_op[case.op].append(case)
    cases, older = [], []
    for op, group in sorted(by_op.items()):
        top = max(c.since for c in group)
        # The plainest case at the newest version: non-empty, no nudged data, the shortest name.
        base = min(
            (c for c in group if c.since == top),
            key=lambda c: (any(c.feeds[i].size == 0 for i in c.wrt), c.name in _NUDGES, len(c.name), c.name),
        )
        rng = np.random.default_rng(list(op.encode()))
        feeds = _random_feeds(base, rng)
        name = f"random_{op} (from {base.name})"
        newest = onnx.defs.get_schema(op)
        if top != newest.since_version:
            # No node case at the newest version (ReduceMax/Min 20 only added bool): run the
            # same node under the newest opset when its attributes still exist there.
            node = base.model.graph.node[0]
            if all(a.name in newest.attributes for a in node.attribute):
                model = onnx.ModelProto.FromString(base.model.SerializeToString())
                for o in model.opset_import:
                    if o.domain in ("", "ai.onnx"):
                        o.version = max(o.version, newest.since_version)
                base = dataclasses.replace(base, model=model, since=newest.since_version)
                name = f"random_{op} (from {base.name} at opset {newest.since_version})"
            else:
                older.append(op)
        cases.append(dataclasses.replace(base, name=name, feeds=feeds))
    for case in _handmade_cases():
        feeds = _random_feeds(case, np.random.default_rng(list(case.op.encode())))
        cases.append(dataclasses.replace(case, name=f"random_{case.op} (hand-made)", feeds=feeds))
    return cases, older


# --------------------------------------------------------------------------------------------
# The tests
# --------------------------------------------------------------------------------------------


def _node_ops() -> list[str]:
    return sorted({c.op for c in _node_cases()[0]})


@pytest.mark.parametrize("op", _node_ops())
def test_node_suite_gradients(op):
    """check_grads-style forward and reverse checks on every kept node case of ``op``."""
    cases = [c for c in _node_cases()[0] if c.op == op]
    failed = _failures(cases)
    assert not failed, f"{len(failed)} of {len(cases)} {op} cases:\n" + "\n".join(failed)


def test_random_input_gradients():
    """The same checks on fresh random float64 inputs, one case per op at its newest version
    (one test, so that one compilation serves all the ops)."""
    cases = _random_cases()[0]
    failed = _failures(cases)
    assert not failed, f"{len(failed)} of {len(cases)} ops:\n" + "\n".join(failed)


# The coverage found when this file was written; a drop means cases stopped being checked.
_MIN_NODE_OPS = 115
_MIN_NODE_CASES = 657
_MIN_RANDOM_OPS = 120


def test_coverage():
    """How many ops and cases the gradient checks cover, and what was skipped and why."""
    kept, skipped, _ = _node_cases()
    random_cases, older = _random_cases()
    node_ops = {c.op for c in kept}
    random_ops = {c.op for c in random_cases}
    all_ops = node_ops | random_ops
    lines = [
        f"node suite: {len(kept)} cases of {len(node_ops)} ops checked "
        f"({sum(len(v) for v in skipped.values())} differentiable-op cases skipped)",
        f"random inputs: {len(random_cases)} cases of {len(random_ops)} ops checked"
        + (f" ({len(older)} not at the newest version: {older})" if older else " (all at the newest version)"),
        f"ops with a gradient check: {len(all_ops)}",
        f"node data nudged off a kink: {len(_NUDGES)} cases (+ Cast/CastLike non-finite data)",
        "skipped by reason:",
        *(f"  {len(v):4d}  {reason}" for reason, v in sorted(skipped.items(), key=lambda kv: -len(kv[1]))),
    ]
    print("\n" + "\n".join(lines))
    differentiable = {s.name for s in onnx.defs.get_all_schemas() if not s.deprecated and _is_differentiable(s)}
    assert differentiable <= all_ops, f"differentiable ops never checked: {sorted(differentiable - all_ops)}"
    assert len(node_ops) >= _MIN_NODE_OPS and len(kept) >= _MIN_NODE_CASES, "\n".join(lines)
    assert len(random_ops) >= _MIN_RANDOM_OPS, "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Safety: points where a naive gradient is NaN
# --------------------------------------------------------------------------------------------
#
# "Safe" here means: where the function has a derivative (or a one-sided one that JAX also
# reports), the gradient is that value, never NaN; where it has none (a tie, a bound), the
# gradient is finite and a documented convention. NaN appears only where the function itself
# is NaN or where the graph multiplies an infinite derivative by a zero (see the Where test).


def _model(nodes, inputs: dict, outputs, *, opset: int = 22, initializers: dict | None = None):
    """A float64 model of ``nodes``; ``inputs`` and ``initializers`` map names to arrays."""

    def info(name, value):
        value = np.asarray(value)
        return oh.make_tensor_value_info(name, oh.np_dtype_to_tensor_dtype(value.dtype), value.shape)

    graph = oh.make_graph(
        nodes,
        "g",
        [info(k, v) for k, v in inputs.items()],
        [oh.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in outputs],
        initializer=[onnx.numpy_helper.from_array(np.asarray(v), k) for k, v in (initializers or {}).items()],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)])


def _grad(model, inputs: dict, wrt: str, *, output: int = 0, cotangent=None):
    """The gradient of ``sum(cotangent * output)`` w.r.t. input ``wrt``, eager and jitted."""
    with jax.enable_x64(True):
        m = jonnx.load(model)
        feeds = {k: jnp.asarray(v) for k, v in inputs.items()}

        def loss(x):
            y = m.apply(m.params, **{**feeds, wrt: x})[output]
            return jnp.sum(y if cotangent is None else y * cotangent)

        eager = np.asarray(jax.grad(loss)(feeds[wrt]))
        jitted = np.asarray(jax.jit(jax.grad(loss))(feeds[wrt]))
    np.testing.assert_allclose(eager, jitted, rtol=1e-13, atol=0)  # the same convention under jit
    return eager


def _one(op, x, *, opset: int = 22, wrt: str = "x", extra: dict | None = None, inits=None, **attrs):
    names = ["x", *(extra or {})]
    node = oh.make_node(op, [n if n != "-" else "" for n in names], ["y"], **attrs)
    model = _model([node], {"x": x, **(extra or {})}, ["y"], opset=opset, initializers=inits)
    return _grad(model, {"x": x, **(extra or {})}, wrt)


def test_sqrt_at_zero_is_infinite_not_nan():
    # d sqrt(x) / dx -> +inf as x -> 0+: the one-sided derivative, as jnp.sqrt reports it.
    x = np.array([0.0, 4.0])
    g = _one("Sqrt", x)
    np.testing.assert_array_equal(g, [np.inf, 0.25])
    with jax.enable_x64(True):
        np.testing.assert_array_equal(g, jax.grad(lambda v: jnp.sum(jnp.sqrt(v)))(x))


@pytest.mark.parametrize("exponent", ["initializer", "input"])
def test_pow_at_zero_base(exponent):
    x = np.array([0.0, 0.0, 3.0])
    y = np.array([2.0, 3.0, 2.0])
    node = oh.make_node("Pow", ["x", "y"], ["z"])
    if exponent == "initializer":
        model = _model([node], {"x": x}, ["z"], initializers={"y": y})
        feeds = {"x": x}
    else:
        model = _model([node], {"x": x, "y": y}, ["z"])
        feeds = {"x": x, "y": y}
    np.testing.assert_array_equal(_grad(model, feeds, "x"), [0.0, 0.0, 6.0])  # y * x**(y-1)
    if exponent == "input":
        # d(x**y)/dy = x**y * log(x): 0 * -inf naively; 0**y is 0 for every y > 0, so 0.
        np.testing.assert_allclose(_grad(model, feeds, "y"), [0.0, 0.0, 9 * np.log(3.0)])


def test_div_at_zero_numerator():
    a = np.array([0.0, 0.0, 2.0])
    b = np.array([2.0, -4.0, 0.5])
    model = _model([oh.make_node("Div", ["a", "b"], ["y"])], {"a": a, "b": b}, ["y"])
    np.testing.assert_array_equal(_grad(model, {"a": a, "b": b}, "a"), 1 / b)
    np.testing.assert_array_equal(_grad(model, {"a": a, "b": b}, "b"), -a / b**2)  # 0 at a = 0


@pytest.mark.parametrize(
    "op,attrs",
    [
        ("ReduceL2", {"keepdims": 0}),
        ("LpNormalization", {"p": 2, "axis": 1}),
        ("LpNormalization", {"p": 1, "axis": 1}),
        ("ReduceL1", {"keepdims": 0}),
    ],
)
def test_norms_of_a_zero_vector_have_finite_gradients(op, attrs):
    # Row 0 is all zeros: ||x|| has no derivative there (a cone's tip; x / ||x|| is
    # discontinuous). jonnx gives 0 rather than NaN, so one zero row cannot poison a batch.
    x = np.array([[0.0, 0.0, 0.0], [3.0, 0.0, 4.0]])
    opset = 13 if op == "LpNormalization" else 18
    g = _one(op, x, opset=opset, **attrs)
    assert np.all(np.isfinite(g)), g
    # |x| at 0 follows JAX's convention (derivative 1, as jax.grad(jnp.abs)(0.0) gives);
    # the Euclidean norms give 0 at the zero vector.
    np.testing.assert_array_equal(g[0], 1.0 if op == "ReduceL1" else 0.0)
    if op == "ReduceL2":
        np.testing.assert_allclose(g[1], [0.6, 0.0, 0.8])


def test_where_with_nan_in_the_unselected_branch():
    # y = Where(x > 0, Log(x), 0) * 3: Log is NaN for x < 0 and -inf at 0, but only where the
    # mask drops it. The selected elements get their true gradient, the dropped ones 0 where
    # Log's derivative is finite. At x = 0 Log's derivative is infinite and the graph itself
    # computes 0 * inf = NaN for that dropped element, as JAX and PyTorch do; a model avoids it
    # with the double-where pattern (Where(x > 0, x, 1) before the Log), tested here too.
    x = np.array([-1.0, 0.0, 2.0, 0.5])
    nodes = [
        oh.make_node("Greater", ["x", "zero"], ["mask"]),
        oh.make_node("Log", ["x"], ["log"]),
        oh.make_node("Where", ["mask", "log", "zero"], ["w"]),
        oh.make_node("Mul", ["w", "three"], ["y"]),
    ]
    inits = {"zero": np.array(0.0), "three": np.array(3.0)}
    g = _grad(_model(nodes, {"x": x}, ["y"], initializers=inits), {"x": x}, "x")
    np.testing.assert_array_equal(g[[0, 2, 3]], [0.0, 1.5, 6.0])
    assert np.isnan(g[1])
    safe = [
        oh.make_node("Greater", ["x", "zero"], ["mask"]),
        oh.make_node("Where", ["mask", "x", "one"], ["x_safe"]),
        oh.make_node("Log", ["x_safe"], ["log"]),
        oh.make_node("Where", ["mask", "log", "zero"], ["w"]),
        oh.make_node("Mul", ["w", "three"], ["y"]),
    ]
    g = _grad(_model(safe, {"x": x}, ["y"], initializers={**inits, "one": np.array(1.0)}), {"x": x}, "x")
    np.testing.assert_array_equal(g, [0.0, 0.0, 1.5, 6.0])


def test_elementwise_max_min_ties_split_the_gradient():
    # At a tie Max(a, b) has no derivative; jonnx (jnp.maximum) gives each tied input half,
    # so the total is still 1.
    a = np.array([1.0, 2.0, 3.0])
    b = np.array([1.0, 5.0, 0.0])
    for op in ("Max", "Min"):
        model = _model([oh.make_node(op, ["a", "b"], ["y"])], {"a": a, "b": b}, ["y"], opset=13)
        ga, gb = (_grad(model, {"a": a, "b": b}, k) for k in "ab")
        np.testing.assert_array_equal(ga + gb, [1.0, 1.0, 1.0])
        np.testing.assert_array_equal(ga[0], 0.5)


def test_reduce_max_ties_go_to_the_first():
    # Like MaxPool's: the first extreme element in row-major order over the reduced axes takes
    # the whole gradient (an index, not a comparison with the result: see the test below).
    x = np.array([[3.0, 1.0, 3.0], [0.0, 2.0, 1.0]])
    for op in ("ReduceMax", "ReduceMin"):
        g = _one(op, x, opset=13, axes=[1], keepdims=0)
        want = [[1, 0, 0], [0, 1, 0]] if op == "ReduceMax" else [[0, 1, 0], [1, 0, 0]]
        np.testing.assert_array_equal(g, want)
    x = np.array([[[1.0, 5.0], [5.0, 0.0]], [[2.0, 2.0], [1.0, 2.0]]])
    g = _one("ReduceMax", x, opset=13, axes=[-1, 1], keepdims=1)  # axes in any order: row-major
    np.testing.assert_array_equal(g, [[[0, 1], [0, 0]], [[1, 0], [0, 0]]])


@pytest.mark.parametrize(
    "op,attrs,x_shape,w_shape,conv",
    [
        ("GlobalMaxPool", {}, (2, 3, 3), (4, 3, 3), {"kernel_shape": [3], "pads": [0, 2]}),
        ("ReduceMax", {"axes": [-4, -2]}, (1, 1, 4, 5), (1, 1, 3, 1), {"kernel_shape": [3, 1], "pads": [2, 0, 1, 0]}),
    ],
)
def test_max_reductions_after_fused_products_compiled(op, attrs, x_shape, w_shape, conv):
    # A convolution of few channels, channels-last, is lowered as shifted products that XLA
    # fuses into what follows. Differentiated by JAX's own rule for max (which compares the
    # input with the result), the compiled derivatives of GlobalMaxPool and ReduceMax after it
    # were wrong in some elements on CPU (5 and 2 of these 6 seeds), the eager ones right. Found
    # by tests/conformance/fuzz_graphs.py.
    failures = []
    for seed in range(6):
        rng = np.random.default_rng(seed)
        nodes = [oh.make_node("Conv", ["x", "w", "b"], ["c"], **conv), oh.make_node(op, ["c"], ["y"], **attrs)]
        inits = {"w": rng.standard_normal(w_shape), "b": rng.standard_normal(w_shape[:1])}
        model = _model(nodes, {"x": np.zeros(x_shape)}, ["y"], opset=13, initializers=inits)
        x = rng.standard_normal(x_shape)
        with jax.enable_x64(True):
            m = jonnx.load(model, optimize={"channels_last": True})
            cotangent = rng.standard_normal(np.shape(m.apply(m.params, x)[0]))
            grad = jax.grad(lambda params, x, m=m, cotangent=cotangent: jnp.vdot(m.apply(params, x)[0], cotangent))
            eager, compiled = grad(m.params, x), jonnx.jit(grad)(m.params, x)
        if not all(np.allclose(eager[k], compiled[k], rtol=1e-12, atol=1e-12) for k in eager):
            failures.append(seed)
    assert not failures


def test_max_pool_ties_and_padding():
    # A MaxPool window with a tie sends its whole gradient to the first maximal input in
    # row-major order (XLA's select-and-scatter; PyTorch's max_pool and MaxPool's own Indices
    # output pick the same one); GlobalMaxPool, a reduction, does the same, as ReduceMax.
    x = np.full((1, 1, 2, 2), 3.0)
    np.testing.assert_array_equal(_one("MaxPool", x, opset=12, kernel_shape=[2, 2])[0, 0], [[1, 0], [0, 0]])
    np.testing.assert_array_equal(_one("GlobalMaxPool", x, opset=12)[0, 0], [[1, 0], [0, 0]])
    # Padded positions never win a window, even one of negative values, and take no gradient.
    x = np.array([[[[-1.0, -1.0, -5.0], [-5.0, -5.0, -2.0], [-2.0, -5.0, -5.0]]]])
    g = _one("MaxPool", x, opset=12, kernel_shape=[2, 2], pads=[1, 1, 1, 1], strides=[2, 2])
    np.testing.assert_array_equal(g[0, 0], [[1, 1, 0], [0, 0, 1], [1, 0, 0]])


@pytest.mark.parametrize(
    "shape, attrs",
    [
        ((2, 3, 9, 8), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),  # ResNet's stem pool
        ((1, 2, 7, 6), dict(kernel_shape=[2, 3], strides=[1, 2], pads=[0, 1, 1, 0], ceil_mode=1)),
        ((2, 2, 11), dict(kernel_shape=[4], strides=[3], pads=[2, 1])),
        ((1, 2, 5, 4, 6), dict(kernel_shape=[2, 3, 2], strides=[2, 1, 2], auto_pad="SAME_UPPER")),
    ],
)
def test_max_pool_gradient_in_both_modes_goes_to_the_first_maximum(shape, attrs):
    # The gradient (reverse mode) and the JVP (forward mode) of MaxPool route each window's
    # cotangent / tangent through the first maximal input in row-major order, which is the
    # position onnxruntime's Indices output names. Small integers make ties frequent and
    # overlapping windows share inputs.
    rng = np.random.default_rng(0)
    x = rng.integers(0, 4, shape).astype(np.float64)
    first = _max_pool_first_positions(x, oh.make_node("MaxPool", ["x"], ["y"], **attrs))
    cotangent = rng.standard_normal(first.shape)
    want = np.zeros(x.size)
    np.add.at(want, first.ravel(), cotangent.ravel())
    model = _model([oh.make_node("MaxPool", ["x"], ["y"], **attrs)], {"x": x}, ["y"], opset=12)
    np.testing.assert_array_equal(_grad(model, {"x": x}, "x", cotangent=cotangent), want.reshape(shape))
    tangent = rng.standard_normal(shape)
    with jax.enable_x64(True):
        m = jonnx.load(model)
        _, jvp = jax.jvp(lambda v: m.apply(m.params, v)[0], (jnp.asarray(x),), (jnp.asarray(tangent),))
    np.testing.assert_array_equal(jvp, tangent.ravel()[first])


def test_max_pool_gradient_with_a_symbolic_batch():
    # Exported with a symbolic batch, MaxPool keeps XLA's select-and-scatter derivative (the
    # gather-based one needs a static shape): the same gradient (the first maximum's position).
    x = np.random.default_rng(1).integers(0, 3, (3, 2, 7, 6)).astype(np.float32)
    node = oh.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    graph = oh.make_graph(
        [node],
        "g",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 2, 7, 6])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
    )
    m = jonnx.load(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 12)]))
    cotangent = np.random.default_rng(2).standard_normal((3, 2, 4, 3)).astype(np.float32)

    def grad(v, ct):
        return jax.vjp(lambda u: m.apply(m.params, u)[0], v)[1](ct)[0]

    n = jax.export.symbolic_shape("N")[0]
    exported = jax.export.export(jax.jit(grad))(
        jax.ShapeDtypeStruct((n, 2, 7, 6), jnp.float32), jax.ShapeDtypeStruct((n, 2, 4, 3), jnp.float32)
    )
    want = np.zeros(x.size, np.float32)
    first = _max_pool_first_positions(x, node)
    np.add.at(want, first.ravel(), cotangent.ravel())
    # Up to float summation order: on CPU the window maxima are taken one axis at a time, and
    # a cell that wins several windows sums their cotangents in another order.
    np.testing.assert_allclose(exported.call(x, cotangent), want.reshape(x.shape), rtol=0, atol=1e-6)


def _max_pool_first_positions(x: np.ndarray, node: onnx.NodeProto) -> np.ndarray:
    """onnxruntime's MaxPool Indices (each window's first maximal position) for ``node``."""
    ort = pytest.importorskip("onnxruntime")
    indexed = oh.make_node("MaxPool", ["x"], ["y", "i"], **{a.name: oh.get_attribute_value(a) for a in node.attribute})
    graph = oh.make_graph(
        [indexed],
        "g",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x.shape)],
        [
            oh.make_tensor_value_info(n, t, None)
            for n, t in (("y", onnx.TensorProto.FLOAT), ("i", onnx.TensorProto.INT64))
        ],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 12)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x.astype(np.float32)})[1]


@pytest.mark.parametrize("count_include_pad", [0, 1])
def test_average_pool_with_padding(count_include_pad):
    x = np.arange(9.0).reshape(1, 1, 3, 3)
    node = oh.make_node(
        "AveragePool", ["x"], ["y"], kernel_shape=[2, 2], pads=[1, 1, 1, 1], count_include_pad=count_include_pad
    )
    model = _model([node], {"x": x}, ["y"], opset=19)
    # Each of the 16 windows divides by 4 (padding counted) or by its number of real inputs.
    counts = np.array([[1, 2, 2, 1], [2, 4, 4, 2], [2, 4, 4, 2], [1, 2, 2, 1]])
    divisor = np.full((4, 4), 4.0) if count_include_pad else counts
    want = np.zeros((3, 3))
    for i in range(4):
        for j in range(4):
            want[max(i - 1, 0) : i + 1, max(j - 1, 0) : j + 1] += 1 / divisor[i, j]
    np.testing.assert_allclose(_grad(model, {"x": x}, "x")[0, 0], want, rtol=1e-12)
    with jax.enable_x64(True):
        m = jonnx.load(model)
    _grad_check(lambda v: (m.apply(m.params, v)[0],), (x,), f"AveragePool count_include_pad={count_include_pad}")


def test_clip_at_the_bounds():
    # Clip = Min(max, Max(x, min)) as ONNX words it; at a bound it is a tie of that Max/Min,
    # so the gradient there is 1/2 (jnp.clip's convention), 1 inside, 0 outside.
    x = np.array([-2.0, -1.0, 0.0, 1.0, 2.0])
    extra = {"lo": np.array(-1.0), "hi": np.array(1.0)}
    g = _one("Clip", x, opset=13, extra=extra)
    np.testing.assert_array_equal(g, [0.0, 0.5, 1.0, 0.5, 0.0])


@pytest.mark.parametrize("op", ["LogSoftmax", "Softmax"])
def test_softmax_with_large_and_masked_inputs(op):
    x = np.array([[1000.0, 0.0, -1000.0], [-np.inf, 1.0, 2.0], [1e300, 1e300, -1e300]])
    w = np.array([[1.0, 2.0, 3.0], [1.0, -1.0, 0.5], [0.5, 2.0, 1.0]])
    node = oh.make_node(op, ["x"], ["y"], axis=1)
    model = _model([node], {"x": x}, ["y"], opset=13)
    g = _grad(model, {"x": x}, "x", cotangent=w)
    assert np.all(np.isfinite(g)), g
    if op == "LogSoftmax":  # d/dx sum(w * log_softmax(x)) = w - softmax(x) * sum(w)
        p = np.array([[1.0, 0.0, 0.0], [0.0, 1 / (1 + np.e), np.e / (1 + np.e)], [0.5, 0.5, 0.0]])
        np.testing.assert_allclose(g, w - p * w.sum(1, keepdims=True), rtol=1e-12, atol=1e-12)


def test_empty_reduction_has_zero_tangent():
    # A reduction over nothing is a constant (0, -inf, +inf): its derivative is 0, not the
    # NaN that the chain rule through log(0) or max() of nothing gives.
    x = np.zeros((2, 0, 4))
    for op in ("ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMin", "ReduceL2", "ReduceProd"):
        node = oh.make_node(op, ["x", "axes"], ["y"], keepdims=1)
        model = _model([node], {"x": x}, ["y"], opset=18, initializers={"axes": np.array([1])})
        with jax.enable_x64(True):
            m = jonnx.load(model)
            _, tangent = jax.jvp(lambda v: m.apply(m.params, v)[0], (jnp.asarray(x),), (jnp.ones_like(x),))  # noqa: B023
        np.testing.assert_array_equal(tangent, np.zeros((2, 1, 4)), err_msg=op)


def _with_constant_indices(name: str) -> GradCase:
    case = _suite()[name]
    ((inputs, _),) = case.data_sets
    data, indices, updates = (_as_array(v) for v in inputs)
    node = case.model.graph.node[0]
    model = _model(
        [node],
        {"data": data.astype(np.float64), "updates": updates.astype(np.float64)},
        list(node.output),
        opset=18,
        initializers={node.input[1]: indices},
    )
    # The graph inputs are the node's names for data and updates.
    model.graph.input[0].name, model.graph.input[1].name = node.input[0], node.input[2]
    return GradCase(name, node.op_type, 18, model, [data.astype(np.float64), updates.astype(np.float64)], [0, 1], [0])


@pytest.mark.parametrize("name", ["test_scatternd_multiply", "test_scatter_elements_with_reduction_mul"])
def test_scatter_mul_with_constant_indices(name):
    # The node cases repeat targets with traced indices; exported models hold them as
    # constants, which take the same segmented-product path with indices known at trace time.
    _check_case(_with_constant_indices(name))


# --------------------------------------------------------------------------------------------
# Integer and shape paths
# --------------------------------------------------------------------------------------------


def test_integer_and_shape_paths_carry_no_gradient():
    # y = Reshape(x * 2, Gather(Shape(x), [1, 0]) -> flattened) + Cast(Cast(Floor(x), INT64), DOUBLE)
    #     + Gather(x, ArgMax(x)) summed.
    # The shape path is static, the integer path has no derivative (0), ArgMax picks a
    # position (no derivative of the index), and nothing raises under grad or jit.
    x = np.array([[0.3, 2.7, -1.2], [1.5, -0.4, 0.9]])
    nodes = [
        oh.make_node("Shape", ["x"], ["shape"]),
        oh.make_node("ReduceProd", ["shape"], ["size"], keepdims=1),
        oh.make_node("Mul", ["x", "two"], ["x2"]),
        oh.make_node("Reshape", ["x2", "size"], ["flat"]),
        oh.make_node("Gather", ["shape", "zero"], ["rows"]),
        oh.make_node("Cast", ["rows"], ["rows_f"], to=onnx.TensorProto.DOUBLE),
        oh.make_node("Floor", ["x"], ["fl"]),
        oh.make_node("Cast", ["fl"], ["xi"], to=onnx.TensorProto.INT64),
        oh.make_node("Cast", ["xi"], ["xi_f"], to=onnx.TensorProto.DOUBLE),
        oh.make_node("Reshape", ["xi_f", "size"], ["xi_flat"]),
        oh.make_node("ArgMax", ["flat"], ["am"], axis=0, keepdims=1),
        oh.make_node("Gather", ["flat", "am"], ["top"]),
        oh.make_node("Add", ["flat", "xi_flat"], ["s"]),
        oh.make_node("Mul", ["s", "rows_f"], ["s2"]),
        oh.make_node("Add", ["s2", "top"], ["y"]),
    ]
    inits = {"two": np.array(2.0), "zero": np.array(0, np.int64)}
    model = _model(nodes, {"x": x}, ["y", "am", "shape"], opset=13, initializers=inits)
    g = _grad(model, {"x": x}, "x")
    # d/dx of sum(2x * rows) = 2 * 2 rows; the max element (2.7 -> 5.4) adds 2 * 6 (broadcast
    # over the 6 outputs); the Floor/Cast path and the shapes add nothing.
    want = np.full(x.shape, 4.0)
    want[0, 1] += 12.0
    np.testing.assert_array_equal(g, want)
    with jax.enable_x64(True):
        m = jonnx.load(model)
        # Integer outputs differentiate to float0 zeros, without an error.
        jac = jax.jacrev(lambda v: m.apply(m.params, v)[1].astype(jnp.float64))(jnp.asarray(x))
        np.testing.assert_array_equal(jac, 0.0)


# --------------------------------------------------------------------------------------------
# The checker itself
# --------------------------------------------------------------------------------------------


def test_grad_check_agrees_with_check_grads():
    """``_grad_check`` accepts what jax.test_util.check_grads accepts, and rejects a wrong
    derivative that check_grads rejects too."""
    kept = {c.name: c for c in _node_cases()[0]}
    for name in ("test_softmax_axis_1", "test_gemm_all_attributes", "test_maxpool_2d_pads"):
        f, args, _ = _grad_fn(kept[name])
        with jax.enable_x64(True):
            # Compiled (eagerly every primitive compiles on its own): the same derivatives.
            check_grads(jax.jit(f), tuple(jnp.asarray(a) for a in args), order=1, modes=("fwd", "rev"))
        _grad_check(f, args, name)

    @jax.custom_jvp
    def wrong_sin(x):
        return jnp.sin(x)

    wrong_sin.defjvp(lambda primals, tangents: (jnp.sin(primals[0]), 1.001 * jnp.cos(primals[0]) * tangents[0]))
    x = (np.linspace(-1.0, 1.0, 5),)
    with jax.enable_x64(True):
        with pytest.raises(AssertionError):
            check_grads(wrong_sin, tuple(jnp.asarray(a) for a in x), order=1, modes=("fwd",))
    with pytest.raises(AssertionError, match="JVP"):
        _grad_check(lambda v: (wrong_sin(v),), x, "wrong_sin")

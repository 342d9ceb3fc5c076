"""Shared checks for the per-family op tests.

Each check builds a one-node model with ``onnx.helper``, runs it through jonnx (eagerly and
under ``jax.jit``) and compares with ``onnx.reference.ReferenceEvaluator`` (or onnxruntime,
or a numpy function given by the test). Gradients are checked against finite differences in
float64 with ``jax.test_util.check_grads``. All of it runs with x64 enabled locally, so int64
and float64 are exact, as ONNX defines them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import onnx.helper as oh
import onnxruntime as ort
import pytest
from jax.test_util import check_grads
from onnx.reference import ReferenceEvaluator

import jonnx

__all__ = [
    "node_model",
    "run_jonnx",
    "run_reference",
    "ort_expected",
    "assert_matches_reference",
    "assert_rounded_once",
    "assert_half_rounds_once",
    "check_op_grads",
]


def node_model(
    op_type: str,
    inputs: Mapping[str, np.ndarray | None],
    n_outputs: int = 1,
    *,
    opset: int,
    domain: str = "",
    initializers: Sequence[str] = (),
    **attrs: Any,
) -> onnx.ModelProto:
    """A model of one node. ``inputs`` maps input names to values (None: omitted optional).

    Names in ``initializers`` become initializers holding their value instead of graph inputs.
    """
    if not domain and opset > onnx.defs.onnx_opset_version():
        # jonnx refuses opsets its onnx package does not know (the declared minimum's 1.21 knows 26).
        pytest.skip(f"onnx {onnx.__version__} knows opsets up to {onnx.defs.onnx_opset_version()}, not {opset}")
    names = [name if value is not None else "" for name, value in inputs.items()]
    while names and not names[-1]:  # omitted trailing inputs are left out, as exporters write them
        names.pop()  # (onnxruntime 1.32 crashes on LayerNormalization with a trailing "")
    outputs = [f"out{i}" for i in range(n_outputs)]
    node = oh.make_node(op_type, names, outputs, domain=domain, **attrs)
    graph_inputs, inits = [], []
    for name, value in inputs.items():
        if value is None:
            continue
        value = np.asarray(value)
        if name in initializers:
            inits.append(onnx.numpy_helper.from_array(value, name))
        else:
            elem = oh.np_dtype_to_tensor_dtype(value.dtype)
            graph_inputs.append(oh.make_tensor_value_info(name, elem, value.shape))
    graph = oh.make_graph(
        [node],
        op_type.lower(),
        graph_inputs,
        [oh.make_empty_tensor_value_info(o) for o in outputs],
        initializer=inits,
    )
    opsets = [oh.make_opsetid("", opset if not domain else 18)]
    if domain:
        opsets.append(oh.make_opsetid(domain, opset))
    model = oh.make_model(graph, opset_imports=opsets)
    model.ir_version = 8 if opset < 21 else 10
    return model


def _feeds_by_name(model: onnx.ModelProto, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The given inputs that ``model`` takes as graph inputs (not omitted, not initializers)."""
    init_names = {t.name for t in model.graph.initializer}
    return {k: np.asarray(v) for k, v in inputs.items() if v is not None and k not in init_names}


def _feeds(model: onnx.ModelProto, inputs: Mapping[str, Any]) -> list[np.ndarray]:
    return list(_feeds_by_name(model, inputs).values())


def run_jonnx(model: onnx.ModelProto, inputs: Mapping[str, Any], *, jit: bool = True) -> list[np.ndarray]:
    """Run ``model`` through jonnx with x64 enabled: jit-compiled, or eagerly via ``apply``."""
    with jax.enable_x64(True):
        m = jonnx.load(model)
        feeds = _feeds(model, inputs)
        outputs = m(*feeds) if jit else m.apply(m.params, *feeds)
        return [np.asarray(o) for o in outputs]


def run_reference(model: onnx.ModelProto, inputs: Mapping[str, Any]) -> list[np.ndarray]:
    """Run ``model`` through onnx's ReferenceEvaluator."""
    return [np.asarray(o) for o in ReferenceEvaluator(model).run(None, _feeds_by_name(model, inputs))]


def ort_expected(
    op_type: str,
    inputs: Mapping[str, Any],
    n_outputs: int = 1,
    *,
    opset: int,
    initializers: Sequence[str] = (),
    **attrs: Any,
) -> list:
    """onnxruntime's outputs for a one-node model (used where the ReferenceEvaluator errs).

    Names in ``initializers`` become initializers, as in :func:`node_model` (some onnxruntime
    kernels read scales or sizes only when they are constants)."""
    model = node_model(op_type, inputs, n_outputs, opset=opset, initializers=initializers, **attrs)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, _feeds_by_name(model, inputs))


# Eager runs already done in this process, by what decides an op's eager code path: see
# _runs_eagerly.
_EAGER_PATHS: set[tuple] = set()


def _runs_eagerly(model: onnx.ModelProto, inputs: Mapping[str, Any]) -> bool:
    """Whether :func:`assert_matches_reference` runs this case eagerly as well as compiled.

    The eager run (``Model.apply`` outside ``jit``) checks that concrete inputs take the same
    paths as traced ones. Every primitive compiles on its own there (25-60 ms each on the
    2-core CI machine), so it was the larger part of most op tests' time (test_resize,
    test_indexing and test_pool: 165 of 342 s, 86 s since). Whether an op takes another path
    on concrete inputs depends on its version, its inputs' dtypes, which of them are
    initializers and how many outputs it declares, not on shapes or attribute values: the first
    case of each such kind runs eagerly in each test process (a case run alone always does),
    the others compiled only.
    """
    node = model.graph.node[0]
    inits = {t.name for t in model.graph.initializer}
    path = (
        node.domain,
        node.op_type,
        tuple((o.domain, o.version) for o in model.opset_import),
        len(node.output),
        tuple((name, None if v is None else np.asarray(v).dtype.str, name in inits) for name, v in inputs.items()),
    )
    if path in _EAGER_PATHS:
        return False
    _EAGER_PATHS.add(path)
    return True


def assert_matches_reference(
    op_type: str,
    inputs: Mapping[str, Any],
    n_outputs: int = 1,
    *,
    opset: int,
    expected: Callable[..., Sequence[np.ndarray]] | Sequence[np.ndarray] | None = None,
    rtol: float = 1e-5,
    atol: float = 1e-6,
    initializers: Sequence[str] = (),
    **attrs: Any,
) -> list[np.ndarray]:
    """jonnx (compiled, and eagerly where :func:`_runs_eagerly` says) must match the reference:
    ``expected`` or the ReferenceEvaluator.

    ``expected`` may be a list of arrays or a function of the input arrays returning one;
    use it where the ReferenceEvaluator is wrong for an old opset (say why in the test).
    Returns jonnx's jit outputs.
    """
    model = node_model(op_type, inputs, n_outputs, opset=opset, initializers=initializers, **attrs)
    if expected is None:
        want = run_reference(model, inputs)
    elif callable(expected):
        want = list(expected(*[None if v is None else np.asarray(v) for v in inputs.values()]))
    else:
        want = [np.asarray(w) for w in expected]
    outputs = {}
    for jit in (True, False) if _runs_eagerly(model, inputs) else (True,):
        got = outputs[jit] = run_jonnx(model, inputs, jit=jit)
        assert len(got) == len(want), f"{op_type}: {len(got)} outputs, expected {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            assert g.shape == w.shape, f"{op_type} output {i} (jit={jit}): shape {g.shape} != {w.shape}"
            assert g.dtype == w.dtype, f"{op_type} output {i} (jit={jit}): dtype {g.dtype} != {w.dtype}"
            if w.dtype == object:
                np.testing.assert_array_equal(g, w)
            else:
                np.testing.assert_allclose(
                    g.astype(np.float64) if g.dtype.kind == "V" or "float8" in g.dtype.name else g,
                    w.astype(np.float64) if w.dtype.kind == "V" or "float8" in w.dtype.name else w,
                    rtol=rtol,
                    atol=atol,
                    err_msg=f"{op_type} output {i} (jit={jit})",
                )
    return outputs[True]


def assert_rounded_once(got: np.ndarray, exact: np.ndarray, dtype: Any, most_off: float) -> None:
    """``got`` (of the half type ``dtype``) is ``exact`` (float64) rounded once to ``dtype``,
    but for at most a ``most_off`` share of the elements, each one unit in the last place off."""
    want = exact.astype(dtype)
    got = np.asarray(got)
    assert got.dtype == dtype
    off = got != want
    assert off.mean() <= most_off, f"{off.sum()} of {off.size} not the correctly rounded value"
    info = jnp.finfo(dtype)
    error = np.abs(got.astype(np.float64) - want.astype(np.float64))
    assert np.all(error <= float(info.eps) * np.abs(want.astype(np.float64)) + float(info.smallest_subnormal))


def assert_half_rounds_once(
    op_type: str, inputs: Mapping[str, Any], *, opset: int, domain: str = "", most_off: float = 0.01, **attrs: Any
) -> None:
    """``op_type`` on ``inputs`` (float64 arrays; the float ones are cast to float16) gives the
    ReferenceEvaluator's float64 result on the same values rounded once to float16, but for at
    most a ``most_off`` share one unit in the last place off: an op that rounds each step in
    float16 fails this for far more."""
    half = {
        k: v.astype(np.float16) if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v for k, v in inputs.items()
    }
    wide = {
        k: v.astype(np.float64) if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v for k, v in half.items()
    }
    got = run_jonnx(node_model(op_type, half, opset=opset, domain=domain, **attrs), half)[0]
    exact = run_reference(node_model(op_type, wide, opset=opset, domain=domain, **attrs), wide)[0]
    assert_rounded_once(got, exact, np.float16, most_off)


def check_op_grads(
    op_type: str,
    inputs: Mapping[str, Any],
    *,
    opset: int,
    wrt: Sequence[str] | None = None,
    output: int = 0,
    order: int = 1,
    eps: float = 1e-4,
    rtol: float = 1e-3,
    atol: float = 1e-3,
    n_outputs: int = 1,
    initializers: Sequence[str] = (),
    **attrs: Any,
) -> None:
    """``jax.test_util.check_grads`` (forward and reverse) of one output w.r.t. float inputs.

    Runs in float64 with x64 enabled; ``wrt`` names the inputs to differentiate (default: all
    floating inputs that are graph inputs).
    """
    with jax.enable_x64(True):
        inputs64 = {
            k: (np.asarray(v, np.float64) if v is not None and np.asarray(v).dtype.kind == "f" else v)
            for k, v in inputs.items()
        }
        model = node_model(op_type, inputs64, n_outputs, opset=opset, initializers=initializers, **attrs)
        m = jonnx.load(model)
        feeds = dict(zip(m.input_names, _feeds(model, inputs64)))
        wrt = (
            list(wrt)
            if wrt is not None
            else [k for k, v in feeds.items() if v.dtype.kind == "f" and k not in m.static_input_names]
        )

        # Compiled: run eagerly, every primitive of the op and of its derivatives compiles on
        # its own (a ScatterElements mul test with repeated targets: 253 small compilations,
        # 137 with the checks compiled). assert_matches_reference covers the eager path.
        @jax.jit
        def f(*diff):
            merged = {**feeds, **dict(zip(wrt, diff))}
            return m.apply(m.params, **merged)[output]

        check_grads(
            f,
            tuple(jnp.asarray(feeds[k]) for k in wrt),
            order=order,
            modes=("fwd", "rev"),
            eps=eps,
            rtol=rtol,
            atol=atol,
        )

"""RNN, GRU and LSTM against the ReferenceEvaluator and onnxruntime, over opsets and options.

The ReferenceEvaluator ignores ``sequence_lens``, ``clip``, custom activations and
``input_forget``, so those are checked against onnxruntime (opsets 7+, which it implements).
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

import jonnx
from jonnx import errors
from tests.ops._harness import (
    assert_matches_reference,
    check_op_grads,
    node_model,
    ort_expected,
    run_jonnx,
    run_reference,
)

RNG = np.random.default_rng(0)
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
N_OUT = {"RNN": 2, "GRU": 2, "LSTM": 3}


def _inputs(
    kind,
    *,
    seq=4,
    batch=3,
    size=5,
    hidden=2,
    num_dir=1,
    bias=True,
    h0=True,
    lens=None,
    peep=False,
    layout=0,
    dtype=np.float32,
):
    g = GATES[kind]
    x_shape = (batch, seq, size) if layout else (seq, batch, size)
    h_shape = (batch, num_dir, hidden) if layout else (num_dir, batch, hidden)
    ins = {
        "X": RNG.standard_normal(x_shape),
        "W": RNG.standard_normal((num_dir, g * hidden, size)) * 0.5,
        "R": RNG.standard_normal((num_dir, g * hidden, hidden)) * 0.5,
        "B": RNG.standard_normal((num_dir, 2 * g * hidden)) * 0.5 if bias else None,
        "sequence_lens": None if lens is None else np.asarray(lens, np.int32),
        "initial_h": RNG.standard_normal(h_shape) if h0 else None,
    }
    if kind == "LSTM":
        ins["initial_c"] = RNG.standard_normal(h_shape) if h0 else None
        ins["P"] = RNG.standard_normal((num_dir, 3 * hidden)) * 0.5 if peep else None
    ins = {k: (v.astype(dtype) if v is not None and v.dtype.kind == "f" else v) for k, v in ins.items()}
    # Trailing omitted inputs are dropped; inner ones stay as "" names.
    while list(ins.values())[-1] is None:
        ins.popitem()
    return ins


def _onnxruntime(kind, ins, *, opset, **attrs):
    model = node_model(kind, ins, N_OUT[kind], opset=opset, **attrs)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {k: v for k, v in ins.items() if v is not None}
    return sess.run(None, feeds)


@pytest.mark.parametrize(
    "kind,opset,direction",
    [
        *[("RNN", v, "bidirectional") for v in (1, 7, 14, 22)],
        *[("GRU", v, "bidirectional") for v in (1, 3, 7, 14, 22)],
        *[("LSTM", v, "bidirectional") for v in (1, 7, 14, 22)],
        *[(k, 22, d) for k in ("RNN", "GRU", "LSTM") for d in ("forward", "reverse")],
    ],
)
def test_matches_reference_every_opset(kind, opset, direction):
    num_dir = 2 if direction == "bidirectional" else 1
    ins = _inputs(kind, num_dir=num_dir, peep=True)
    # The ReferenceEvaluator has no opset 1/3 versions; the changelog gives them opset 7's
    # equations (GRU-1 with linear_before_reset=0), so opset 7's reference is the expectation.
    want = run_reference(
        node_model(kind, ins, N_OUT[kind], opset=max(opset, 7), hidden_size=2, direction=direction), ins
    )
    assert_matches_reference(
        kind, ins, N_OUT[kind], opset=opset, hidden_size=2, direction=direction, expected=want, rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("kind", ["RNN", "GRU", "LSTM"])
def test_opset1_default_direction_is_forward(kind):
    # Opset 1's schema default direction is the typo "foward": it means forward.
    ins = _inputs(kind)
    want = run_jonnx(node_model(kind, ins, N_OUT[kind], opset=7, hidden_size=2), ins)
    got = run_jonnx(node_model(kind, ins, N_OUT[kind], opset=1, hidden_size=2), ins)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6)


@pytest.mark.parametrize(
    "kind,direction",
    [
        ("RNN", "bidirectional"),
        ("GRU", "bidirectional"),
        ("LSTM", "bidirectional"),
        ("LSTM", "reverse"),
    ],
)
def test_sequence_lens_against_onnxruntime(kind, direction):
    num_dir = 2 if direction == "bidirectional" else 1
    ins = _inputs(kind, seq=5, batch=4, num_dir=num_dir, lens=[5, 3, 1, 4], peep=True)
    want = _onnxruntime(kind, ins, opset=14, hidden_size=2, direction=direction)
    assert_matches_reference(
        kind, ins, N_OUT[kind], opset=14, hidden_size=2, direction=direction, expected=want, rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("kind", ["RNN", "GRU", "LSTM"])
def test_layout_batch_first(kind):
    ins = _inputs(kind, num_dir=2, layout=1, lens=[4, 2, 3])
    # onnxruntime rejects layout=1: run it on the time-major transposes instead.
    time_major = {k: (np.swapaxes(v, 0, 1) if k in ("X", "initial_h", "initial_c") else v) for k, v in ins.items()}
    y, *finals = _onnxruntime(kind, time_major, opset=22, hidden_size=2, direction="bidirectional")
    want = [np.transpose(y, (2, 0, 1, 3))] + [np.swapaxes(f, 0, 1) for f in finals]
    assert_matches_reference(
        kind,
        ins,
        N_OUT[kind],
        opset=22,
        hidden_size=2,
        direction="bidirectional",
        layout=1,
        expected=want,
        rtol=1e-5,
        atol=1e-5,
    )


@pytest.mark.parametrize(
    "kind,acts,alpha,beta",
    [
        ("RNN", ["Relu"], None, None),
        ("RNN", ["LeakyRelu"], [0.3], None),
        ("RNN", ["ThresholdedRelu"], [0.2], None),
        ("RNN", ["Affine"], [0.7], [0.1]),
        ("RNN", ["ScaledTanh"], [1.5], [0.8]),
        ("RNN", ["HardSigmoid"], [0.3], [0.4]),
        ("RNN", ["Elu"], [0.9], None),
        ("RNN", ["Softsign"], None, None),
        ("RNN", ["Softplus"], None, None),
        ("GRU", ["HardSigmoid", "Softsign"], [0.25], [0.45]),
        ("LSTM", ["HardSigmoid", "ScaledTanh", "Elu"], [0.25, 1.2, 0.6], [0.45, 0.7]),
    ],
)
def test_activations_against_onnxruntime(kind, acts, alpha, beta):
    ins = _inputs(kind)
    attrs = {"activations": acts}
    if alpha:
        attrs["activation_alpha"] = alpha
    if beta:
        attrs["activation_beta"] = beta
    want = _onnxruntime(kind, ins, opset=14, hidden_size=2, **attrs)
    assert_matches_reference(
        kind, ins, N_OUT[kind], opset=14, hidden_size=2, expected=want, rtol=1e-5, atol=1e-5, **attrs
    )


@pytest.mark.parametrize("kind", ["RNN", "GRU", "LSTM"])
def test_clip_against_onnxruntime(kind):
    ins = _inputs(kind, size=6)
    ins["X"] = ins["X"] * 4
    want = _onnxruntime(kind, ins, opset=14, hidden_size=2, clip=0.5)
    assert_matches_reference(
        kind, ins, N_OUT[kind], opset=14, hidden_size=2, clip=0.5, expected=want, rtol=1e-5, atol=1e-5
    )


def test_lstm_input_forget_against_onnxruntime():
    ins = _inputs("LSTM", peep=True)
    want = _onnxruntime("LSTM", ins, opset=14, hidden_size=2, input_forget=1)
    assert_matches_reference(
        "LSTM", ins, 3, opset=14, hidden_size=2, input_forget=1, expected=want, rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("lbr", [0, 1])
def test_gru_linear_before_reset(lbr):
    ins = _inputs("GRU", num_dir=2)
    assert_matches_reference(
        "GRU", ins, 2, opset=7, hidden_size=2, direction="bidirectional", linear_before_reset=lbr, rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("kind", ["RNN", "GRU", "LSTM"])
def test_no_bias_no_initial_state_float64_and_float16(kind):
    ins = _inputs(kind, bias=False, h0=False, dtype=np.float64)
    assert_matches_reference(kind, ins, N_OUT[kind], opset=14, rtol=1e-10, atol=1e-10)
    ins16 = {k: v.astype(np.float16) for k, v in ins.items() if v is not None}
    got = run_jonnx(node_model(kind, ins16, N_OUT[kind], opset=14), ins16)
    want = _onnxruntime(kind, {k: v.astype(np.float32) for k, v in ins16.items()}, opset=14, hidden_size=2)
    for g, w in zip(got, want):
        assert g.dtype == np.float16
        np.testing.assert_allclose(g.astype(np.float32), w, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize(
    "kind,direction,output,attrs,batch",
    [
        ("RNN", "bidirectional", 0, {}, 2),
        ("GRU", "forward", 1, {}, 2),
        ("GRU", "reverse", 0, {"linear_before_reset": 1}, 2),
        ("LSTM", "reverse", 2, {}, 2),
        ("LSTM", "forward", 0, {"input_forget": 1, "clip": 1.5}, 2),
        ("LSTM", "forward", 0, {}, 1),
        ("GRU", "reverse", 0, {"clip": 0.8}, 1),
    ],
)
def test_gradients_through_scan(kind, direction, output, attrs, batch):
    # The recurrences take R's derivative out of the scan (ops/rnn.py, _recurrence; a GRU
    # without linear_before_reset in two stages, _gru_scan), their step products reading R
    # transposed from two rows (_step_weights) and as stored at one.
    num_dir = 2 if direction == "bidirectional" else 1
    lens = [3, 2][:batch]
    ins = _inputs(kind, seq=3, batch=batch, size=2, num_dir=num_dir, lens=lens, peep=True)
    check_op_grads(
        kind, ins, opset=14, n_outputs=N_OUT[kind], output=output, hidden_size=2, direction=direction, **attrs
    )


_LBR = {"linear_before_reset": 1}


@pytest.mark.parametrize(
    ("kind", "wrt", "attrs"),
    [
        ("LSTM", ["X"], {}),
        ("LSTM", ["R"], {}),
        ("LSTM", ["B", "initial_c"], {}),
        ("LSTM", ["P"], {}),
        ("GRU", ["B"], _LBR),
        ("GRU", ["R"], _LBR),
        ("GRU", ["B"], {}),
        ("GRU", ["R"], {}),
        ("GRU", ["X", "initial_h"], {}),
    ],
)
def test_gradients_with_respect_to_some_inputs(kind, wrt, attrs):
    # The recurrence's derivative skips the terms of inputs not differentiated (symbolic zeros);
    # a GRU's third product (the candidate's) is not folded into its gate input, so with only B
    # differentiated its tangent is the bias's alone (found by the fuzz: it was not broadcast).
    ins = _inputs(kind, seq=4, batch=2, size=3, lens=[4, 3], peep=True)
    check_op_grads(kind, ins, opset=14, n_outputs=N_OUT[kind], output=0, wrt=wrt, hidden_size=2, **attrs)


@pytest.mark.parametrize(("kind", "attrs"), [("LSTM", {}), ("GRU", _LBR), ("GRU", {}), ("RNN", {})])
def test_gradients_without_sequence_lens(kind, attrs):
    # Unmasked, the derivative takes the state before each step from the previous output
    # (ops/rnn.py _states_before) instead of stacking it.
    ins = _inputs(kind, seq=3, batch=2, size=2, peep=True)
    check_op_grads(kind, ins, opset=14, n_outputs=N_OUT[kind], output=0, hidden_size=2, **attrs)


@pytest.mark.parametrize(("kind", "attrs"), [("LSTM", {}), ("GRU", {})])
def test_gradients_of_an_empty_sequence(kind, attrs):
    # No steps: Y_h is initial_h (the recurrence's derivative builds the states before each step
    # from the outputs, which must give none here).
    ins = _inputs(kind, seq=0, batch=2, size=3, peep=True)
    check_op_grads(kind, ins, opset=14, n_outputs=N_OUT[kind], output=1, wrt=["R", "initial_h"], hidden_size=2, **attrs)


@pytest.mark.parametrize(("kind", "attrs"), [("LSTM", {}), ("GRU", _LBR), ("GRU", {})])
def test_second_derivatives_through_scan(kind, attrs):
    ins = _inputs(kind, seq=3, batch=2, size=2, lens=[3, 2], peep=True)
    check_op_grads(kind, ins, opset=14, n_outputs=N_OUT[kind], output=1, order=2, hidden_size=2, **attrs)


def test_traced_sequence_lens_under_jit():
    # sequence_lens as a traced (non-static) input: masks, not shapes, depend on it.
    import jax

    ins = _inputs("GRU", seq=5, batch=3, lens=[5, 2, 4])
    model = node_model("GRU", ins, 2, opset=14, hidden_size=2, direction="reverse")
    m = jonnx.load(model)
    assert "sequence_lens" not in m.static_input_names
    feeds = [v for v in ins.values() if v is not None]
    f = jax.jit(lambda *a: m.apply(m.params, *a))
    want = _onnxruntime("GRU", ins, opset=14, hidden_size=2, direction="reverse")
    for g, w in zip(f(*feeds), want):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-5, atol=1e-5)


def test_errors():
    ins = _inputs("RNN")
    with pytest.raises(errors.NodeError, match="unknown activation"):
        run_jonnx(node_model("RNN", ins, 2, opset=14, activations=["Swish"]), ins)
    with pytest.raises(errors.NodeError, match="direction"):
        run_jonnx(node_model("RNN", ins, 2, opset=14, direction="sideways"), ins)
    with pytest.raises(errors.NodeError, match="hidden_size"):
        run_jonnx(node_model("RNN", ins, 2, opset=14, hidden_size=7), ins)
    with pytest.raises(errors.NodeError, match="do not fit"):
        run_jonnx(node_model("RNN", ins, 2, opset=14, direction="bidirectional"), ins)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_half_precision_carries_float32_states(op):
    # In float16 the cell computes in float32, its states carried in float32, and the outputs
    # round once, as onnxruntime's do: step by step in float16, a quarter of 200 fuzzed GRU and
    # LSTM cases were a unit in the last place off it.
    gates = GATES[op]
    rng = np.random.default_rng(4)
    hidden, size = 8, 6
    inputs = {
        "x": rng.standard_normal((12, 3, size)),
        "w": rng.standard_normal((2, gates * hidden, size)) * 0.5,
        "r": rng.standard_normal((2, gates * hidden, hidden)) * 0.5,
        "b": rng.standard_normal((2, 2 * gates * hidden)) * 0.1,
    }
    inputs = {k: v.astype(np.float16) for k, v in inputs.items()}
    attrs = {"hidden_size": hidden, "direction": "bidirectional"}
    want = ort_expected(op, inputs, 2, opset=14, **attrs)
    got = run_jonnx(node_model(op, inputs, 2, opset=14, **attrs), inputs)
    for g, w in zip(got, want):
        g = np.asarray(g)
        assert g.dtype == np.float16
        off = g != w
        assert off.mean() <= 0.02, f"{off.sum()} of {off.size} differ from onnxruntime"
        np.testing.assert_allclose(g.astype(np.float32), w.astype(np.float32), rtol=2e-3, atol=2e-4)


@pytest.mark.parametrize(
    ("kind", "attrs"),
    [("LSTM", {}), ("GRU", {"linear_before_reset": 1}), ("GRU", {}), ("RNN", {"direction": "bidirectional"})],
)
def test_ensemble_gradients_and_forward_mode(kind, attrs):
    # vmap over stacked weights (an ensemble) of the recurrence's custom derivative equals each
    # member's own gradient, and forward mode agrees with it along a direction.
    import jax
    import jax.numpy as jnp

    num_dir = 2 if attrs.get("direction") == "bidirectional" else 1
    with jax.enable_x64(True):
        ins = _inputs(kind, seq=4, batch=2, size=3, lens=[4, 2], peep=True, num_dir=num_dir, dtype=np.float64)
        model = node_model(kind, ins, N_OUT[kind], opset=14, hidden_size=2, initializers=["W", "R", "B"], **attrs)
        m = jonnx.load(model)
        feeds = {k: v for k, v in ins.items() if v is not None and k in m.input_names}

        def loss(params):
            return jnp.sum(m.apply(params, **feeds)[0] ** 2)

        members = [jax.tree.map(lambda a, s=s: a * s, m.params) for s in (1.0, 0.9, 1.1)]
        stacked = jax.tree.map(lambda *a: jnp.stack(a), *members)
        got = jax.vmap(jax.grad(loss))(stacked)
        want = [jax.grad(loss)(member) for member in members]
        for i, w in enumerate(want):
            for name in w:
                np.testing.assert_allclose(got[name][i], w[name], rtol=1e-12, atol=1e-12)
        ones = jax.tree.map(jnp.ones_like, stacked)
        tangents = jax.vmap(lambda p, t: jax.jvp(loss, (p,), (t,))[1])(stacked, ones)
        directional = [sum(float(jnp.sum(g)) for g in w.values()) for w in want]
        np.testing.assert_allclose(tangents, directional, rtol=1e-10)


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_exports_with_a_symbolic_batch(kind):
    # The step products' layout is chosen by the batch size (ops/rnn.py _step_weights); a
    # symbolic batch must not need a concrete one.
    import jax
    from jax import export

    ins = _inputs(kind, seq=4, batch=3, size=5, peep=True)
    weights = ["W", "R", "B", "P"] if kind == "LSTM" else ["W", "R", "B"]
    model = node_model(kind, ins, N_OUT[kind], opset=14, hidden_size=2, initializers=weights)
    for value in model.graph.input:  # X, initial_h, initial_c: the batch is axis 1
        value.type.tensor_type.shape.dim[1].dim_param = "N"
    m = jonnx.load(model)
    feeds = {k: v for k, v in ins.items() if v is not None and k in m.input_names}
    (b,) = export.symbolic_shape("b")
    specs = {k: jax.ShapeDtypeStruct((v.shape[0], b, v.shape[-1]), v.dtype) for k, v in feeds.items()}
    exported = export.export(jax.jit(lambda p, kw: m.apply(p, **kw)))(m.params, specs)
    for batch in (1, 3):
        part = {k: v[:, :batch] for k, v in feeds.items()}
        want = m.apply(m.params, **part)
        for g, w in zip(exported.call(m.params, part), want):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6, atol=1e-6)

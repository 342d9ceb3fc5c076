"""A short, fixed run of the graph fuzz (``tests/conformance/fuzz_graphs.py``): what its longer
runs found stays fixed, and the tool keeps running as onnx, onnxruntime and jonnx move."""

from __future__ import annotations

import jax
import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator

import jonnx
from tests.conformance import fuzz, fuzz_graphs


def test_optimized_graphs_agree_with_onnxruntime_and_their_derivatives_with_the_plain_ones():
    with jax.enable_x64(True):
        verdicts, findings = fuzz_graphs.run(seed=2027, cases=6)
    assert not findings
    assert verdicts["ok"] >= 4  # most graphs reached onnxruntime and both gradient checks
    # CNNs and encoders, some run in training mode too (BatchNormalization or Dropout in them)
    ops = [{n.op_type for n in fuzz_graphs.draw(2027 * 100_000 + k)[0].graph.node} for k in range(6)]
    assert sum("Conv" in o for o in ops) >= 2 and sum("Conv" not in o for o in ops) >= 1
    assert sum(bool(o & {"BatchNormalization", "Dropout"}) for o in ops) >= 2
    assert any(o & {"RNN", "GRU", "LSTM"} for o in ops)  # a recurrent encoder: scans under vmap and jvp


def test_wide_graphs_reach_the_lowerings_chosen_by_size(monkeypatch):
    # --wide draws the channel counts and maps that the size-gated lowerings need: this graph's
    # 1x2 convolution over 512 channels on a tiny map runs as tap products and its 1x1 ones as
    # products, in the default call, with constant weights and in the derivatives' NCHW.
    from jonnx.ops import conv

    monkeypatch.setattr(fuzz_graphs, "WIDE", True)
    chosen, lowering = [], conv.conv_lowering
    monkeypatch.setattr(conv, "conv_lowering", lambda *a, **k: chosen.append(lowering(*a, **k)) or chosen[-1])
    with jax.enable_x64(True):
        assert fuzz_graphs.check(2031 * 100_000 + 104) == ("ok", None)
    assert {"tap_products", "matmul"} <= set(chosen)


def test_float16_graphs_agree_with_onnxruntime(monkeypatch):
    # --half: the same graphs in float16 through every configuration, values only.
    monkeypatch.setattr(fuzz_graphs, "HALF", True)
    drawn, draw = [], fuzz_graphs.draw
    monkeypatch.setattr(fuzz_graphs, "draw", lambda seed, dtype=np.float32: drawn.append(dtype) or draw(seed, dtype))
    verdicts, findings = fuzz_graphs.run(seed=2027, cases=6)
    assert not findings
    assert verdicts["ok"] >= 4
    assert drawn and set(drawn) == {np.float16}


def test_one_seed_draws_one_graph_in_either_float_type():
    # The gradient check redraws the value check's graph in float64: the same nodes, and
    # weights and input equal up to float32 rounding.
    for seed in range(5):
        (m32, x32), (m64, x64) = fuzz_graphs.draw(seed), fuzz_graphs.draw(seed, np.float64)
        assert [(n.op_type, list(n.input), list(n.attribute)) for n in m64.graph.node] == [
            (n.op_type, list(n.input), list(n.attribute)) for n in m32.graph.node
        ]
        np.testing.assert_array_equal(x64["x"].astype(np.float32), x32["x"])
        for a, b in zip(m32.graph.initializer, m64.graph.initializer):
            np.testing.assert_array_equal(
                onnx.numpy_helper.to_array(b).astype(onnx.numpy_helper.to_array(a).dtype), onnx.numpy_helper.to_array(a)
            )


def _batch_major(op: str, lengths: bool) -> tuple[onnx.ModelProto, dict]:
    """A bidirectional ``op`` in layout 1 (batch first) with bias, initial states and, with
    ``lengths``, sequence lengths: X (B=3, T=4, D=2), H=5."""
    rng = np.random.default_rng(3)
    gates = {"RNN": 1, "GRU": 3, "LSTM": 4}[op]
    w = {
        "W": rng.normal(0, 0.5, (2, gates * 5, 2)),
        "R": rng.normal(0, 0.5, (2, gates * 5, 5)),
        "B": rng.normal(0, 0.1, (2, 10 * gates)),
        "L": np.array([4, 1, 3], np.int32),
        "H0": rng.normal(0, 0.5, (3, 2, 5)),
        "C0": rng.normal(0, 0.5, (3, 2, 5)),
    }
    inputs = ["x", "W", "R", "B", "L" if lengths else "", "H0"] + (["C0"] if op == "LSTM" else [])
    outputs = ["Y", "Y_h"] + (["Y_c"] if op == "LSTM" else [])
    node = onnx.helper.make_node(op, inputs, outputs, hidden_size=5, direction="bidirectional", layout=1)
    graph = onnx.helper.make_graph(
        [node],
        "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3, 4, 2])],
        [onnx.helper.make_empty_tensor_value_info(o) for o in outputs],
        [onnx.numpy_helper.from_array(v.astype(np.int32 if k == "L" else np.float32), k) for k, v in w.items()],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 14)])
    return model, {"x": rng.normal(size=(3, 4, 2)).astype(np.float32)}


def test_onnxruntime_runs_batch_major_recurrent_nodes_as_their_time_major_twins():
    # The twin equals the node in layout 1 as the ReferenceEvaluator runs it (without lengths,
    # which it ignores); with lengths onnxruntime's twin is the reference, and equals jonnx.
    for op in ("RNN", "GRU", "LSTM"):
        for lengths in (False, True):
            model, feeds = _batch_major(op, lengths)
            twin = fuzz.onnxruntime_outputs(model, feeds)
            assert twin is not None and fuzz.time_major_twin(model) is not None
            want = ReferenceEvaluator(model).run(None, feeds) if not lengths else twin
            got = jonnx.load(model)(**feeds)
            for a, b, c in zip(twin, want, got):
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=op)
                np.testing.assert_allclose(np.asarray(c), a, rtol=1e-5, atol=1e-6, err_msg=op)
    # The graph that found it: a GRU in layout 1 with lengths, where the ReferenceEvaluator,
    # the only reference then, differed from jonnx by 0.62.
    model, feeds = fuzz_graphs.draw(12000017)
    want = fuzz.onnxruntime_outputs(model, feeds)
    assert want is not None
    assert fuzz_graphs._mismatches({"default": jonnx.load(model)(**feeds)}, want) is None

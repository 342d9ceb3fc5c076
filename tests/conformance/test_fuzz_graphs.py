"""A short, fixed run of the graph fuzz (``tests/conformance/fuzz_graphs.py``): what its longer
runs found stays fixed, and the tool keeps running as onnx, onnxruntime and jonnx move."""

from __future__ import annotations

import jax
import numpy as np
import onnx

from tests.conformance import fuzz_graphs


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

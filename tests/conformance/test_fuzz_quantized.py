"""A short, fixed run of the quantized-graph fuzz (``tests/conformance/fuzz_quantized.py``):
what its longer runs found stays fixed, and the tool keeps running as onnx, onnxruntime and
jonnx move."""

from __future__ import annotations

from tests.conformance import fuzz_quantized


def test_quantized_graphs_are_the_same_with_passes_on_and_off_and_as_onnxruntime_computes_them():
    verdicts, findings = fuzz_quantized.run(seed=2027, cases=9)
    assert not findings or all(f.startswith("near") for f in findings), findings
    assert verdicts["ok"] >= 7  # most graphs equal onnxruntime's to the bit
    # all three forms, each with the ops the passes rewrite
    models = [fuzz_quantized.draw(2027 * 100_000 + k)[0] for k in range(9)]
    ops = {form: set() for form in fuzz_quantized.FORMS}
    for model in models:
        ops[model.doc_string] |= {n.op_type for n in model.graph.node}
    assert {"Conv", "DequantizeLinear", "QuantizeLinear"} <= ops["qdq"]
    assert "QLinearConv" in ops["qoperator"] and any(
        op.startswith("QLinear") and op != "QLinearConv" for op in ops["qoperator"]
    )
    assert {"DynamicQuantizeLinear", "ConvInteger"} <= ops["dynamic"]


def test_a_tie_rounded_after_the_zero_point_is_found():
    # Seed 300106 (QLinearAveragePool of pairs over power-of-two scales, an odd output zero
    # point) found jonnx rounding before adding the zero point, a unit off onnxruntime for 12%
    # of the values; it is exact now.
    assert fuzz_quantized.check(300106) == ("ok", None)


def test_quantized_encoders_are_the_same_with_passes_on_and_off(monkeypatch):
    # --encoders: (B, T, D) values through MatMul of dequantized weights, QLinearMatMul,
    # MatMulInteger and com.microsoft QGemm, DynamicQuantizeMatMul, MatMulIntegerToFloat and
    # QAttention, in the three forms.
    monkeypatch.setattr(fuzz_quantized, "ENCODERS", True)
    verdicts, findings = fuzz_quantized.run(seed=2027, cases=6)
    assert not findings or all(f.startswith("near") for f in findings), findings
    assert verdicts["ok"] >= 4
    ops = set().union(*({n.op_type for n in fuzz_quantized.draw(2027 * 100_000 + k)[0].graph.node} for k in range(6)))
    products = {"MatMul", "QLinearMatMul", "QGemm", "MatMulInteger", "DynamicQuantizeMatMul", "MatMulIntegerToFloat"}
    assert products | {"QAttention"} <= ops


def test_fused_dynamic_products_with_per_column_weights(monkeypatch):
    # Seed 520000005 (--encoders, the dynamic form): DynamicQuantizeMatMul and
    # MatMulIntegerToFloat with per-column weight scales and zero points, as onnxruntime's
    # optimizer fuses quantize_dynamic's projections; equal to onnxruntime's to the bit.
    monkeypatch.setattr(fuzz_quantized, "ENCODERS", True)
    model = fuzz_quantized.draw(520000005)[0]
    columns = {i.name for i in model.graph.initializer if len(i.dims) == 1}
    fused = {n.op_type for n in model.graph.node if n.op_type == "DynamicQuantizeMatMul" and n.input[2] in columns}
    fused |= {n.op_type for n in model.graph.node if n.op_type == "MatMulIntegerToFloat" and n.input[3] in columns}
    assert fused == {"DynamicQuantizeMatMul", "MatMulIntegerToFloat"}
    assert fuzz_quantized.check(520000005) == ("ok", None)


def test_qattention_scores_past_3e9_are_not_nan(monkeypatch):
    # Seed 15000300024 (--encoders, the dynamic form): a QAttention with one value per head
    # after unnormalized products, scores near 3e10. XLA contracted the scores' product into
    # the softmax's subtraction, so no row kept its maximum at exp(0) and the output was NaN
    # (docs/known_issues.md, "a scale fused into Softmax's exp"); now onnxruntime's to the bit.
    monkeypatch.setattr(fuzz_quantized, "ENCODERS", True)
    assert "QAttention" in {n.op_type for n in fuzz_quantized.draw(15000300024)[0].graph.node}
    assert fuzz_quantized.check(15000300024) == ("ok", None)


def test_channels_last_qlinear_conv_between_transposes():
    # Seeds 15000200013 and 15000200019 (the QOperator form): com.microsoft QLinearConv with
    # channels_last=1 over three spatial axes, as onnxruntime's NHWC transformer writes it.
    for seed in (15000200013, 15000200019):
        nodes = fuzz_quantized.draw(seed)[0].graph.node
        assert any(n.op_type == "QLinearConv" and n.domain == fuzz_quantized.MS for n in nodes), seed
        assert fuzz_quantized.check(seed) == ("ok", None), seed


def test_qgemm_with_alpha_bias_stored_transposed_and_float_outputs(monkeypatch):
    # Seeds 560000010 and 560000027 (--encoders, the QOperator form): com.microsoft QGemm with
    # alpha 1/2 and an int32 bias, to float and with its weights stored transposed.
    monkeypatch.setattr(fuzz_quantized, "ENCODERS", True)
    for seed in (560000010, 560000027):
        assert "QGemm" in {n.op_type for n in fuzz_quantized.draw(seed)[0].graph.node}
        assert fuzz_quantized.check(seed) == ("ok", None), seed


def test_qlinear_softmax_of_both_forms_and_qlinear_where(monkeypatch):
    # Seed 570000025 (--encoders, the QOperator form): com.microsoft QLinearSoftmax over the
    # last axis (``opset`` 13) and over the last two (``opset`` 1, axis 1, Softmax-1's
    # coercion), and two QLinearWheres by constant conditions.
    monkeypatch.setattr(fuzz_quantized, "ENCODERS", True)
    nodes = fuzz_quantized.draw(570000025)[0].graph.node
    forms = {a.i for n in nodes if n.op_type == "QLinearSoftmax" for a in n.attribute if a.name == "opset"}
    assert forms == {1, 13}
    assert sum(n.op_type == "QLinearWhere" for n in nodes) == 2
    assert fuzz_quantized.check(570000025) == ("ok", None)

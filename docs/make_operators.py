"""Generate docs/operators.md: which ONNX operator versions jonnx implements.

Run from the repository root after adding or changing an operator:

    python docs/make_operators.py

The tables come from jonnx's registry (``jonnx._registry.registered()``) and from the schemas
of the installed onnx package (``onnx.defs.get_all_schemas_with_history()``). Only onnx's own
domains are listed, and only jonnx's own implementations (functions defined in the ``jonnx``
package): custom ops a user or a test registers never change the page. The output is sorted
and carries no timestamp, so ``tests/test_operator_docs.py`` can compare it with the file.
"""

from __future__ import annotations

import collections
import pathlib
import sys

import onnx
import onnx.defs

import jonnx
from jonnx._registry import registered

OUTPUT = pathlib.Path(__file__).with_name("operators.md")

#: onnx's domains, in the order the page lists them ("" is written "ai.onnx").
DOMAINS = ("", "ai.onnx.ml", "ai.onnx.preview", "ai.onnx.preview.training")

#: onnxruntime's contrib domain, listed after onnx's own with what jonnx implements of it.
MICROSOFT = "com.microsoft"

#: Every com.microsoft operator onnxruntime 1.32 defines (its ``get_all_operator_schema()``).
MICROSOFT_OPS = (  # noqa: SIM905 -- one block of names, easy to refresh
    "Attention AttnLSTM BeamSearch BiasAdd BiasDropout BiasGelu BiasSoftmax BiasSplitGelu "
    "BifurcationDetector BitmaskBiasDropout BitmaskDropout BranchwiseRMSNorm CDist CausalConvWithState "
    "ComplexMul ComplexMulConj ConvStateReplay ConvTransposeWithDynamicPads CropAndResize DecoderAttention "
    "DecoderMaskedMultiHeadAttention DecoderMaskedSelfAttention DequantizeBFP DequantizeLinear "
    "DequantizeWithOrder DynamicQuantizeLSTM DynamicQuantizeMatMul DynamicSparseAttention DynamicTimeWarping "
    "EPContext EmbedLayerNormalization EngramGate ExpandDims FastGelu FusedConv FusedGemm FusedMatMul "
    "FusedMatMulActivation GatedAdd GatedDeltaNet GatedDeltaNetStateReplay GatedRMSNorm "
    "GatedRelativePositionBias GatherBlockQuantized GatherND GatherPacked Gelu GemmFastGelu GemmFloat8 "
    "GemmaRotaryEmbedding GreedySearch GridSample GroupNorm GroupQueryAttention HyperConnectionLowRankMix "
    "HyperConnectionPostMix HyperConnectionPreMix Inverse Irfft IsAllFinite LinearAttention "
    "LinearAttentionGate LongformerAttention MRotaryEmbedding Mamba2Verify MatMulBlockQuantizedFp4Weight "
    "MatMulBlockQuantizedFp8Weight MatMulBnb4 MatMulFpQ4 MatMulInteger16 MatMulIntegerToFloat MatMulNBits "
    "MatMulNBitsMlp MatMulNBitsQLoRA MatMulNBitsQkv MatMulPacked MaxpoolWithMask MoE MoEGroupRouter "
    "MoEPacked MulInteger MultiHeadAttention MurmurHash3 NGramHashMapping NGramRepeatBlock NhwcConv "
    "NhwcFusedConv NhwcMaxPool PackedAttention PackedMultiHeadAttention PackedSparseAttentionIndexer "
    "PackedSparseAttentionIndexerMerge Pad PagedAttention QAttention QEmbedLayerNormalization QGemm "
    "QLinearAdd QLinearAveragePool QLinearConcat QLinearConv QLinearGlobalAveragePool QLinearLeakyRelu "
    "QLinearMul QLinearReduceMean QLinearSigmoid QLinearSoftmax QLinearWhere QMoE QOrderedAttention "
    "QOrderedGelu QOrderedLayerNormalization QOrderedLongformerAttention QOrderedMatMul QuantizeBFP "
    "QuantizeLinear QuantizeWithOrder QuickGelu RMSNormRotary Range ReduceSumInteger RelativePositionBias "
    "RemovePadding RestorePadding Rfft RotaryEmbedding RouterGateUpProj SampleOp Sampling ScaledSiLU "
    "SkipGroupNorm SkipLayerNormalization SkipSimplifiedLayerNormalization Snpe SparseAttention "
    "SparseAttentionIndexer SparsePagedAttention SparseToDenseMatMul SpeculativePrefixCommit SwiGLU "
    "Tokenizer TorchEmbedding TransposeMatMul Trilu UnfoldTensor Unique VarlenCausalConvWithState "
    "VarlenNGramHashMapping WhisperBeamSearch WordConvEmbedding"
).split()

#: Why an unimplemented com.microsoft op is not there (ops not named: not implemented yet).
_SEARCH = "a whole generation loop with subgraphs: write the loop in JAX with lax.while_loop"
_GPU = "a GPU serving kernel (paged/packed/decoder-masked layouts); files for CPU use the ops above"
_ORDERED = "CUDA int8 ordered (COL32) layouts"
_SESSION = "an internal layout onnxruntime creates inside a session, not found in saved files"
MICROSOFT_REASONS = {
    **dict.fromkeys(("BeamSearch", "GreedySearch", "Sampling", "WhisperBeamSearch"), _SEARCH),
    **dict.fromkeys(
        (
            "DecoderMaskedMultiHeadAttention",
            "DecoderMaskedSelfAttention",
            "PackedAttention",
            "PackedMultiHeadAttention",
            "PagedAttention",
            "SparsePagedAttention",
            "LongformerAttention",
            "GemmFloat8",
            "MatMulBnb4",
            "MatMulFpQ4",
            "DecoderAttention",
        ),
        _GPU,
    ),
    **dict.fromkeys(
        (
            "QOrderedAttention",
            "QOrderedGelu",
            "QOrderedLayerNormalization",
            "QOrderedLongformerAttention",
            "QOrderedMatMul",
            "QuantizeWithOrder",
            "DequantizeWithOrder",
        ),
        _ORDERED,
    ),
    **dict.fromkeys(("NhwcConv", "NhwcFusedConv", "NhwcMaxPool", "FusedMatMulActivation"), _SESSION),
    "EPContext": "an execution provider's precompiled binary",
    "Snpe": "a Qualcomm SNPE binary",
    "SampleOp": "onnxruntime's example op",
}


def _domain_name(domain: str) -> str:
    return domain or "ai.onnx"


def _is_jonnx_own(fn) -> bool:
    module = getattr(fn, "__module__", None) or ""
    return module == "jonnx" or module.startswith("jonnx.")


def _versions(items) -> str:
    return ", ".join(str(v) for v in sorted(items)) or "-"


def _collect():
    """``{domain: {op: (defined versions, implemented versions, deprecated)}}``."""
    defined: dict[tuple[str, str], set[int]] = collections.defaultdict(set)
    newest: dict[tuple[str, str], onnx.defs.OpSchema] = {}
    for schema in onnx.defs.get_all_schemas_with_history():
        key = (schema.domain, schema.name)
        defined[key].add(schema.since_version)
        if key not in newest or schema.since_version > newest[key].since_version:
            newest[key] = schema
    deprecated = {key for key, schema in newest.items() if schema.deprecated}

    implemented: dict[tuple[str, str], set[int]] = collections.defaultdict(set)
    for (domain, op_type, version), opdef in registered().items():
        if domain in DOMAINS and _is_jonnx_own(opdef.fn):
            implemented[(domain, op_type)].add(version)

    table: dict[str, dict[str, tuple[set[int], set[int], bool]]] = {d: {} for d in DOMAINS}
    for domain, op_type in set(defined) | set(implemented):
        if domain not in table:
            continue
        key = (domain, op_type)
        table[domain][op_type] = (defined.get(key, set()), implemented.get(key, set()), key in deprecated)
    return table


def _coverage(defined: set[int], implemented: set[int]) -> str:
    missing = defined - implemented
    if not defined:
        return "not an onnx op"
    if missing:
        return f"**no** (missing {_versions(missing)})"
    return "yes"


def render() -> str:
    """The text of docs/operators.md for the installed jonnx and onnx."""
    table = _collect()
    lines = [
        "# Operators",
        "",
        "<!-- Generated by `python docs/make_operators.py`; do not edit by hand. -->",
        "",
        "Every ONNX operator version jonnx implements, next to the versions the installed onnx",
        f"package ({onnx.__version__}) defines. A model's opset for a domain selects, for each op, the",
        "newest version not above it (its *since_version*); jonnx binds each node to the",
        "implementation registered for that exact version when the model is loaded, and reports",
        "every unsupported node at once. One implementation often serves several versions (those",
        "that only widened type constraints).",
        "",
        "Custom domains are not listed: register your own ops with `jonnx.register(op_type,",
        "since=..., domain=...)` (see `examples/custom_ops.py`).",
        "",
    ]
    totals = collections.Counter()
    summary = []
    for domain in DOMAINS:
        ops = table[domain]
        if not ops:
            continue
        n_defined = sum(len(d) for d, _, _ in ops.values())
        n_covered = sum(len(d & i) for d, i, _ in ops.values())
        n_complete = sum(1 for d, i, _ in ops.values() if d and d <= i)
        n_onnx_ops = sum(1 for d, _, _ in ops.values() if d)
        totals.update(ops=n_onnx_ops, complete=n_complete, defined=n_defined, covered=n_covered)
        summary.append(f"| {_domain_name(domain)} | {n_onnx_ops} | {n_complete} | {n_defined} | {n_covered} |")
        lines += [
            f"## {_domain_name(domain)}",
            "",
            f"{n_complete} of {n_onnx_ops} operators fully covered; {n_covered} of {n_defined} versions implemented.",
            "",
            "| Operator | jonnx implements | onnx defines | All versions covered |",
            "| --- | --- | --- | --- |",
        ]
        for op_type in sorted(ops):
            defined, implemented, is_deprecated = ops[op_type]
            name = f"{op_type} (deprecated in onnx)" if is_deprecated else op_type
            lines.append(
                f"| {name} | {_versions(implemented)} | {_versions(defined)} | {_coverage(defined, implemented)} |"
            )
        lines.append("")

    lines += _microsoft_section()
    lines += [
        "## Totals",
        "",
        f"{totals['complete']} of {totals['ops']} operators fully covered; "
        f"{totals['covered']} of {totals['defined']} operator versions implemented.",
        "",
        "| Domain | Operators | Fully covered | Versions defined | Versions implemented |",
        "| --- | --- | --- | --- | --- |",
        *summary,
        f"| **all** | {totals['ops']} | {totals['complete']} | {totals['defined']} | {totals['covered']} |",
        "",
    ]
    return "\n".join(lines)


def _microsoft_section() -> list[str]:
    """The com.microsoft table: onnxruntime's contrib ops, implemented or why not."""
    implemented: dict[str, set[int]] = collections.defaultdict(set)
    for (domain, op_type, version), opdef in registered().items():
        if domain == MICROSOFT and _is_jonnx_own(opdef.fn):
            implemented[op_type].add(version)
    names = sorted(set(MICROSOFT_OPS) | set(implemented))
    done = sum(1 for n in names if n in implemented)
    lines = [
        f"## {MICROSOFT}",
        "",
        "onnxruntime's contrib operators, as its transformers optimizer, quantizers and the genai",
        "model builder write them (semantics: onnxruntime's `docs/ContribOperators.md`, each",
        "implemented op checked against onnxruntime in `tests/ops/test_microsoft.py`, Tokenizer",
        "in `tests/ops/test_text.py`). onnxruntime also registers `LayerNormalization`-1 and",
        "`SimplifiedLayerNormalization` in the default domain; jonnx implements both there (see",
        "the ai.onnx table).",
        "",
        f"{done} of {len(names)} operators implemented.",
        "",
        "| Operator | jonnx implements | Why not |",
        "| --- | --- | --- |",
    ]
    for name in names:
        if name in implemented:
            lines.append(f"| {name} | {_versions(implemented[name])} | |")
        else:
            lines.append(f"| {name} | - | {MICROSOFT_REASONS.get(name, 'not implemented yet')} |")
    lines.append("")
    return lines


def main() -> None:
    text = render()
    OUTPUT.write_text(text, encoding="utf-8", newline="\n")
    print(f"wrote {OUTPUT} ({len(text.splitlines())} lines, jonnx {jonnx.__version__}, onnx {onnx.__version__})")


if __name__ == "__main__":
    sys.exit(main())

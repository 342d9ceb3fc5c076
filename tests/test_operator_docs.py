"""docs/operators.md matches what docs/make_operators.py generates from the registry."""

from __future__ import annotations

import difflib
import pathlib

import jonnx
from jonnx._registry import registered
from tests._scripts import load_script

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "docs" / "make_operators.py"
PAGE = ROOT / "docs" / "operators.md"


# A custom-domain op registered in this process: it must not reach the page.
@jonnx.register("DocsProbe", since=1, domain="jonnx.tests.docs")
def _docs_probe(inputs, attrs, ctx):
    return inputs


def _load_generator():
    """docs/make_operators.py as a module (docs/ is not a package)."""
    return load_script(SCRIPT, "_jonnx_docs_make_operators")


def test_operators_page_is_up_to_date():
    expected = _load_generator().render()
    actual = PAGE.read_text(encoding="utf-8") if PAGE.exists() else ""
    if actual != expected:
        diff = "".join(
            list(
                difflib.unified_diff(
                    actual.splitlines(keepends=True),
                    expected.splitlines(keepends=True),
                    "docs/operators.md (committed)",
                    "docs/operators.md (generated)",
                )
            )[:40]
        )
        raise AssertionError(
            "docs/operators.md is out of date with the operator registry: run "
            f"`python docs/make_operators.py` from the repository root.\n{diff}"
        )


def test_operators_page_lists_onnx_domains_only():
    text = _load_generator().render()
    headings = [line[3:] for line in text.splitlines() if line.startswith("## ")]
    assert headings == [
        "ai.onnx",
        "ai.onnx.ml",
        "ai.onnx.preview",
        "ai.onnx.preview.training",
        "com.microsoft",
        "Totals",
    ]
    # Custom ops registered by tests and examples never reach the page.
    assert "DocsProbe" not in text and "jonnx.tests.docs" not in text
    assert "| Add | 1, 6, 7, 13, 14 | 1, 6, 7, 13, 14 | yes |" in text


def test_microsoft_table_lists_every_registered_contrib_op():
    generator = _load_generator()
    text = generator.render()
    ours = sorted(
        {
            op
            for (domain, op, _), d in registered().items()
            if domain == "com.microsoft" and generator._is_jonnx_own(d.fn)
        }
    )
    assert "GroupQueryAttention" in ours and "MatMulNBits" in ours
    for op in ours:
        assert f"| {op} | 1 | |" in text
    # An op jonnx lacks says why.
    assert "| BeamSearch | - | a whole generation loop" in text


def test_microsoft_op_list_matches_installed_onnxruntime():
    """The page's list of contrib ops is onnxruntime's (refresh MICROSOFT_OPS when it changes)."""
    ort = __import__("pytest").importorskip("onnxruntime")
    state = ort.capi.onnxruntime_pybind11_state
    if not hasattr(state, "get_all_operator_schema"):
        __import__("pytest").skip("this onnxruntime build does not expose its schemas")
    names = {s.name for s in state.get_all_operator_schema() if s.domain == "com.microsoft"}
    listed = set(_load_generator().MICROSOFT_OPS)
    assert names <= listed, f"contrib ops missing from docs/make_operators.py: {sorted(names - listed)}"

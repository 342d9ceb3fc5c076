"""A short, fixed run of each family of the differential fuzz (``tests/conformance/fuzz.py``):
what its longer runs found fixed stays fixed, and the tool itself keeps running as onnx,
onnxruntime and jonnx move. Longer runs with other seeds are for a developer's machine."""

from __future__ import annotations

import jax
import pytest

from tests.conformance import fuzz

CASES = 16
# conv_pool, normalization and quantize draw, at this seed, cases where onnxruntime departs
# from the specification as fuzz.py's docstring lists (ConvTranspose and MaxPool with SAME
# padding and dilations, DynamicQuantizeLinear of an empty tensor): not run here until the
# tool tells those apart from findings.
FAMILIES = sorted(set(fuzz.FAMILIES) - {"conv_pool", "normalization", "quantize"})


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_agrees_with_the_references(family):
    with jax.enable_x64(True):
        verdicts, findings = fuzz.run(seed=2026, cases=CASES, families=[family])
    assert not findings
    assert verdicts["ok"] >= CASES // 2  # most draws reached a reference and were compared


@pytest.mark.parametrize("family", ["elementwise", "products", "normalization", "microsoft"])
def test_derivatives_agree_with_finite_differences(family):
    with jax.enable_x64(True):
        verdicts, findings = fuzz.run(seed=2026, cases=CASES, families=[family], grad=True)
    assert not findings
    assert verdicts["ok"] >= 4

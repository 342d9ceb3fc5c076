"""Every versioned schema the installed onnx defines has an implementation, or is a known gap.

``schema_gaps.txt`` lists the ``(domain, op, since_version)`` keys jonnx does not implement
yet, each with a reason. A schema missing from both the registry and the list fails the test,
naming it; a listed gap that now has an implementation fails too, so the list only shrinks.
"""

from __future__ import annotations

import pathlib

import onnx.defs

import jonnx  # noqa: F401  (registers every op)
from jonnx._registry import registered

GAPS_FILE = pathlib.Path(__file__).with_name("schema_gaps.txt")


def _gaps() -> dict[tuple[str, str, int], str]:
    gaps = {}
    for line in GAPS_FILE.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        domain, op, version, reason = line.split(maxsplit=3)
        gaps[("" if domain == "ai.onnx" else domain, op, int(version))] = reason
    return gaps


def _schemas() -> set[tuple[str, str, int]]:
    return {(s.domain, s.name, s.since_version) for s in onnx.defs.get_all_schemas_with_history()}


def test_every_schema_is_implemented_or_a_listed_gap():
    implemented = set(registered())
    gaps = _gaps()
    missing = sorted(k for k in _schemas() if k not in implemented and k not in gaps)
    assert not missing, "schemas without an implementation: " + ", ".join(
        f"{d or 'ai.onnx'}:{op}-{v}" for d, op, v in missing
    )


def test_listed_gaps_are_still_gaps():
    implemented = set(registered())
    closed = sorted(k for k in _gaps() if k in implemented)
    assert not closed, "implemented now, remove from schema_gaps.txt: " + ", ".join(
        f"{d or 'ai.onnx'}:{op}-{v}" for d, op, v in closed
    )


def test_every_gap_is_a_real_schema():
    unknown = sorted(k for k in _gaps() if k not in _schemas())
    assert not unknown, f"schema_gaps.txt names schemas onnx does not define: {unknown}"

"""Every versioned schema the installed onnx package defines has an implementation.

The test enumerates ``onnx.defs.get_all_schemas_with_history()`` (every domain: ai.onnx,
ai.onnx.ml, ai.onnx.preview, ai.onnx.preview.training) and names each
``(domain, op, since_version)`` that has no registered implementation.
"""

from __future__ import annotations

import onnx.defs

import jonnx  # noqa: F401  (registers every op)
from jonnx._registry import registered


def test_every_schema_has_an_implementation():
    schemas = {(s.domain, s.name, s.since_version) for s in onnx.defs.get_all_schemas_with_history()}
    missing = sorted(schemas - set(registered()))
    assert not missing, f"{len(missing)} schemas without an implementation: " + ", ".join(
        f"{d or 'ai.onnx'}:{op}-{v}" for d, op, v in missing
    )
    assert len(schemas) > 600  # the enumeration itself worked


def test_registered_versions_are_real_schemas():
    """Registrations in onnx's domains name versions onnx defines (no typos in `since`)."""
    schemas = {(s.domain, s.name, s.since_version) for s in onnx.defs.get_all_schemas_with_history()}
    domains = {d for d, _, _ in schemas}
    # onnxruntime registers two of its contrib ops in the default domain, and files from its
    # optimizer and the genai builder carry them there (ops/microsoft/normalization.py).
    onnxruntime_contrib = {("", "LayerNormalization", 1), ("", "SimplifiedLayerNormalization", 1)}
    extra = sorted(k for k in registered() if k[0] in domains and k not in schemas and k not in onnxruntime_contrib)
    assert not extra, f"registered versions onnx does not define: {extra}"

"""onnxruntime's contrib operators (domain ``com.microsoft``), as files from onnxruntime's
transformers optimizer, its quantizers and the onnxruntime-genai model builder contain them.

Semantics follow onnxruntime's ``docs/ContribOperators.md`` and are checked against
onnxruntime's own outputs (``tests/ops/test_microsoft.py``). onnx has no schemas for this
domain, so each op declares its attributes (with onnxruntime's defaults) and its formal input
count at registration; a node setting an attribute the op does not declare is refused at load.
A few contrib ops onnxruntime registers in the default domain (``LayerNormalization`` before
opset 17, ``SimplifiedLayerNormalization``) are registered there too.
"""

from __future__ import annotations

# Each module registers one family on import.
from jonnx.ops.microsoft import (  # noqa: F401
    activation,
    attention,
    fused,
    misc,
    normalization,
    quantize,
    text,
)
from jonnx.ops.microsoft._common import DOMAIN as DOMAIN

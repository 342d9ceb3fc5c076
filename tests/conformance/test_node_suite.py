"""The ONNX backend node suite (every node case the installed onnx package generates),
run through ``jonnx.backend`` under ``jax.jit`` with x64 enabled.

Cases listed in ``expected_failures.txt`` are marked as expected failures; one that passes
is reported as an unexpected success, which fails the run, so the list stays honest.
"""

from __future__ import annotations

import re
import warnings

import onnx.backend.test

from tests.conformance._backend import X64Backend
from tests.conformance.expectations import expected_failures

with warnings.catch_warnings():
    # Generating the cases makes numpy warn about float overflow in onnx's own cast tests.
    warnings.simplefilter("ignore")
    backend_test = onnx.backend.test.BackendTest(X64Backend, __name__)

for _name in expected_failures():
    backend_test.xfail(f"^{re.escape(_name)}_cpu$")

OnnxBackendNodeModelTest = backend_test.test_cases["OnnxBackendNodeModelTest"]
# The runner adds a CUDA twin of every case; the suite runs on the CPU (CI has no GPU), so
# the twins are dropped rather than reported as 1,884 skips.
for _attr in [a for a in vars(OnnxBackendNodeModelTest) if a.endswith("_cuda")]:
    delattr(OnnxBackendNodeModelTest, _attr)

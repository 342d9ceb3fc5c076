"""The ONNX backend suites shipped with the installed onnx package, run through
``jonnx.backend`` under ``jax.jit`` with x64 enabled:

* the node suite: every node case onnx generates (1,884 in onnx 1.23);
* the model suites in ``onnx/backend/test/data``: simple, pytorch-converted,
  pytorch-operator (opset 6 models among them), and the light real models (AlexNet, ResNet-50,
  DenseNet-121, ... with their shipped outputs).

Cases listed in ``expected_failures.txt`` are marked as expected failures; one that passes is
reported as an unexpected success, which fails the run, so the list stays honest.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import tempfile
import warnings

import onnx.backend.test

from tests.conformance._backend import X64Backend
from tests.conformance.expectations import expected_failures

# The runner writes the light models' generated inputs under $ONNX_HOME; a private folder keeps
# runs from reading each other's (or an older onnx's) files, and goes when the process ends.
os.environ["ONNX_HOME"] = tempfile.mkdtemp(prefix="jonnx-onnx-home-")
atexit.register(shutil.rmtree, os.environ["ONNX_HOME"], ignore_errors=True)

with warnings.catch_warnings():
    # Generating the cases makes numpy warn about float overflow in onnx's own cast tests.
    warnings.simplefilter("ignore")
    backend_test = onnx.backend.test.BackendTest(X64Backend, __name__)

for _name in expected_failures():
    backend_test.xfail(f"^{re.escape(_name)}_cpu$")


_cases = backend_test.test_cases
OnnxBackendNodeModelTest = _cases["OnnxBackendNodeModelTest"]
OnnxBackendSimpleModelTest = _cases["OnnxBackendSimpleModelTest"]
OnnxBackendPyTorchConvertedModelTest = _cases["OnnxBackendPyTorchConvertedModelTest"]
OnnxBackendPyTorchOperatorModelTest = _cases["OnnxBackendPyTorchOperatorModelTest"]
OnnxBackendRealModelTest = _cases["OnnxBackendRealModelTest"]  # the light models, shipped locally

# The runner adds a CUDA twin of every case; the suites run on the CPU (CI has no GPU), so
# the twins are dropped rather than reported as skips.
for _case in (
    OnnxBackendNodeModelTest,
    OnnxBackendSimpleModelTest,
    OnnxBackendPyTorchConvertedModelTest,
    OnnxBackendPyTorchOperatorModelTest,
    OnnxBackendRealModelTest,
):
    for _attr in [a for a in vars(_case) if a.endswith("_cuda")]:
        delattr(_case, _attr)
del _case  # a module-level TestCase name would be collected (and run) a second time

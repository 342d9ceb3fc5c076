"""jonnx: run, differentiate and fine-tune ONNX models as pure JAX functions.

>>> import jonnx
>>> model = jonnx.load("model.onnx")              # doctest: +SKIP
>>> outputs = model(x)                             # jit-compiled  # doctest: +SKIP
>>> grads = jax.grad(loss)(model.params, x)        # differentiable  # doctest: +SKIP
"""

from jonnx import errors as errors, sharding as sharding
from jonnx._export import save as save
from jonnx._ir import Graph as Graph, Node as Node, ValueInfo as ValueInfo
from jonnx._jit import compiler_options as compiler_options, jit as jit
from jonnx._model import Model as Model, load as load
from jonnx._progress import enable_progress as enable_progress
from jonnx._registry import OpContext as OpContext, register as register

# isort: split
# The operator library registers itself on import; `jonnx.ops` is also the public way to call
# ONNX ops as plain JAX functions.
from jonnx import backend as backend, ops as ops

# The one place the version is written; pyproject.toml reads it from here.
__version__ = "0.1.0"

__all__ = [
    "Graph",
    "Model",
    "Node",
    "OpContext",
    "ValueInfo",
    "backend",
    "compiler_options",
    "enable_progress",
    "errors",
    "jit",
    "load",
    "ops",
    "register",
    "save",
    "sharding",
]

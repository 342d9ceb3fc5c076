"""jonnx as an ONNX backend (``onnx.backend.base.Backend``), running through ``jax.jit``.

>>> import jonnx.backend
>>> rep = jonnx.backend.prepare(model_proto)           # doctest: +SKIP
>>> outputs = rep.run([x])                              # doctest: +SKIP
>>> jonnx.backend.run_node(node_proto, [x])             # doctest: +SKIP

Outputs come back as numpy arrays, as the backend API expects.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
import onnx
import onnx.helper
from onnx.backend.base import Backend, BackendRep, Device, DeviceType

from jonnx._model import Model, load

__all__ = ["JonnxBackend", "JonnxRep", "prepare", "run_model", "run_node", "supports_device"]


def _to_numpy(value: Any) -> Any:
    if isinstance(value, list):
        return [_to_numpy(v) for v in value]
    if value is None:
        return None
    return np.asarray(value)


class JonnxRep(BackendRep):
    """A prepared model: ``run(inputs)`` calls the jit-compiled :class:`jonnx.Model`.

    ``key``, if given, feeds the model's random ops (Dropout in training mode, RandomNormal...).
    """

    def __init__(self, model: Model, key: jax.Array | None = None):
        self.model = model
        self.key = key

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Run on ``inputs`` (a list in graph-input order, a dict by name, or one array)."""
        if isinstance(inputs, dict):
            # By position: an input may be named like one of the call's keywords (key, state...).
            outputs = self.model(*self.model.bind(**inputs).values(), key=self.key)
        elif isinstance(inputs, (list, tuple)):
            outputs = self.model(*inputs, key=self.key)
        else:
            outputs = self.model(inputs, key=self.key)
        return tuple(_to_numpy(o) for o in outputs)


class JonnxBackend(Backend):
    """The ONNX backend API over jonnx."""

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> JonnxRep:
        """Load ``model`` (an ``onnx.ModelProto``, bytes or a path) for running.

        Keyword options: ``base_dir`` (folder for external data), ``key`` (PRNG key for random
        ops), ``optimize`` (as :func:`jonnx.load`'s; default True).
        """
        model = load(model, base_dir=kwargs.get("base_dir"), optimize=kwargs.get("optimize", True))
        return JonnxRep(model, key=kwargs.get("key"))

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple[Any, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(
        cls,
        node: onnx.NodeProto,
        inputs: Sequence[Any],
        device: str = "CPU",
        outputs_info: Sequence[tuple[Any, Any]] | None = None,
        **kwargs: Any,
    ) -> tuple[Any, ...]:
        """Run one node on numpy ``inputs`` (opset: ``kwargs['opset_version']`` or newest)."""
        arrays = [np.asarray(x) if x is not None else None for x in inputs]
        graph_inputs = [
            onnx.helper.make_tensor_value_info(name, onnx.helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
            for name, a in zip(node.input, arrays)
            if name and a is not None
        ]
        graph_outputs = [onnx.helper.make_empty_tensor_value_info(name) for name in node.output if name]
        graph = onnx.helper.make_graph([node], "run_node", graph_inputs, graph_outputs)
        opset = kwargs.get("opset_version", onnx.defs.onnx_opset_version())
        opsets = [onnx.helper.make_opsetid(node.domain or "", opset)]
        if node.domain:
            opsets.append(onnx.helper.make_opsetid("", onnx.defs.onnx_opset_version()))
        model = onnx.helper.make_model(graph, opset_imports=opsets)
        feed = [a for name, a in zip(node.input, arrays) if name and a is not None]
        return cls.prepare(model, device).run(feed)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        """True for devices JAX has: ``CPU`` always, ``CUDA`` when a GPU backend is present."""
        kind = Device(device).type
        if kind == DeviceType.CPU:
            return True
        if kind == DeviceType.CUDA:
            try:
                return bool(jax.devices("gpu"))
            except RuntimeError:
                return False
        return False


prepare = JonnxBackend.prepare
run_model = JonnxBackend.run_model
run_node = JonnxBackend.run_node
supports_device = JonnxBackend.supports_device

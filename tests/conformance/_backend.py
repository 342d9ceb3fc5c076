"""The backend the conformance suite runs: jonnx.backend, under jit, with x64 enabled.

The node suite checks int64/float64 outputs exactly, so each prepare and run enables 64-bit
types locally (``jax.enable_x64`` is a context manager: nothing global is flipped, and the
other tests in the same process keep JAX's defaults).

``JONNX_CONFORMANCE_OPTIMIZE=0`` runs every case with ``optimize=False`` (the graph as written)
instead of the default passes, to check that both pass.
"""

from __future__ import annotations

import os

import jax

from jonnx.backend import JonnxBackend, JonnxRep


class X64Rep(JonnxRep):
    def run(self, inputs, **kwargs):
        with jax.enable_x64(True):
            return super().run(inputs, **kwargs)


class X64Backend(JonnxBackend):
    @classmethod
    def prepare(cls, model, device="CPU", **kwargs):
        # Random ops get a key, as a user would pass one; cases whose expected values come
        # from numpy's random bitstream still cannot match and are listed as such.
        kwargs.setdefault("optimize", os.environ.get("JONNX_CONFORMANCE_OPTIMIZE", "1") != "0")
        with jax.enable_x64(True):
            rep = super().prepare(model, device, **kwargs)
            return X64Rep(rep.model, key=jax.random.key(0))
